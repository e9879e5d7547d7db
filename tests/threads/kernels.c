/*
 * A kernel that nests parallel launches, as TVM's kernels may: each task of an outer
 * TVMBackendParallelLaunch launches an inner one over its rows (the runtime runs a launch that
 * finds the pool busy on its own thread), and each inner task works in a kernel workspace. Then
 * the outer tasks meet at TVMBackendParallelBarrier, and each adds the 1 to the next task's rows:
 * y = 2 * x + 1 only if no task got past the barrier before every other had written its rows.
 */
#include <stdint.h>
#include <string.h>

#include "rvm_kernel.h"

#define EXPORT __attribute__((visibility("default")))

/* The thread pool's interface, as TVM's generated code declares it. */
typedef struct {
  void *sync_handle;
  int32_t num_task;
} TVMParallelGroupEnv;
typedef int (*FTVMParallelLambda)(int task_id, TVMParallelGroupEnv *penv, void *cdata);
int TVMBackendParallelLaunch(FTVMParallelLambda flambda, void *cdata, int num_task);
int TVMBackendParallelBarrier(int task_id, TVMParallelGroupEnv *penv);
void *TVMBackendAllocWorkspace(int device_type, int device_id, uint64_t nbytes, int dtype_code_hint, int dtype_bits_hint);
int TVMBackendFreeWorkspace(int device_type, int device_id, void *ptr);

typedef struct {
  const float *x;
  float *y;
  int64_t rows, cols, first, count; /* the outer task's rows, for the inner launch */
} job;

static DLTensor *tensor(const TVMFFIAny *a) {
  if (a->type_index == kTVMFFITensor) return rvm_tensor_of_object(a->v_obj);
  if (a->type_index == kTVMFFIDLTensorPtr) return (DLTensor *)a->v_ptr;
  return NULL;
}

static void share(int task, int tasks, int64_t n, int64_t *begin, int64_t *end) {
  int64_t step = (n + tasks - 1) / tasks;
  *begin = task * step < n ? task * step : n;
  *end = *begin + step < n ? *begin + step : n;
}

static int inner(int task, TVMParallelGroupEnv *env, void *cdata) {
  const job *j = cdata;
  int64_t begin, end;
  share(task, env->num_task, j->count, &begin, &end);
  float *row = TVMBackendAllocWorkspace(1, 0, (uint64_t)j->cols * sizeof(float), 2, 32);
  if (!row) return -1;
  for (int64_t r = j->first + begin; r < j->first + end; r++) {
    for (int64_t c = 0; c < j->cols; c++) row[c] = 2.0f * j->x[r * j->cols + c];
    memcpy(j->y + r * j->cols, row, sizeof(float) * (size_t)j->cols);
  }
  return TVMBackendFreeWorkspace(1, 0, row);
}

static int outer(int task, TVMParallelGroupEnv *env, void *cdata) {
  job j = *(const job *)cdata;
  int64_t begin, end;
  share(task, env->num_task, j.rows, &begin, &end);
  j.first = begin;
  j.count = end - begin;
  int rc = j.count > 0 ? TVMBackendParallelLaunch(inner, &j, 0) : 0;
  TVMBackendParallelBarrier(task, env); /* every task arrives, even one that failed */
  if (rc != 0) return rc;
  share((task + 1) % env->num_task, env->num_task, j.rows, &begin, &end);
  for (int64_t i = begin * j.cols; i < end * j.cols; i++) j.y[i] += 1.0f;
  return 0;
}

/* (x, y): y = 2x + 1 over a 2-D float32 tensor. */
EXPORT int __tvm_ffi_nested_scale(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self, (void)result;
  if (n != 2) {
    TVMFFIErrorSetRaisedFromCStr("TypeError", "nested_scale expects (x, y)");
    return -1;
  }
  DLTensor *x = tensor(&args[0]), *y = tensor(&args[1]);
  if (!x || !y || x->ndim != 2) {
    TVMFFIErrorSetRaisedFromCStr("TypeError", "nested_scale expects two 2-D tensors");
    return -1;
  }
  job j = {(const float *)x->data, (float *)y->data, x->shape[0], x->shape[1], 0, 0};
  return TVMBackendParallelLaunch(outer, &j, 0);
}
