/*
 * floor.c: the floor under every runtime on the chain_N models. It calls the chain's kernel
 * (`add1` from the fixture's lib0.o, TVM's LLVM build) N times in sequence through the same
 * safe-call ABI the VM uses, on tensors allocated once, with argument arrays built once: no VM,
 * no dispatch, no allocation. Whatever a runtime spends above this per call is its overhead.
 *
 * usage: floor N CALLS ROUNDS
 * prints one line per round: "median_us <median microseconds per chain of N kernel calls>".
 * Built by benches/chain.rs against lib0.o and the runtime shim (for the backend symbols).
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rvm_kernel.h"

int __tvm_ffi_add1(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result);

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* A 1-element float32 tensor viewing `data` (64-byte aligned, as TVM's kernels assume). */
static DLTensor tensor(float *data, int64_t *shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

static TVMFFIAny tensor_arg(DLTensor *t) {
  TVMFFIAny a;
  memset(&a, 0, sizeof a);
  a.type_index = kTVMFFIDLTensorPtr;
  a.v_ptr = t;
  return a;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: floor N CALLS ROUNDS\n");
    return 2;
  }
  long n = atol(argv[1]), calls = atol(argv[2]), rounds = atol(argv[3]);
  if (n < 1 || calls < 1 || rounds < 1) {
    fprintf(stderr, "floor: N, CALLS and ROUNDS must be positive\n");
    return 2;
  }
  int64_t shape[1] = {1};
  float *buffers = aligned_alloc(64, 3 * 64);
  if (!buffers) return 1;
  float *x_data = buffers, *a_data = buffers + 16, *b_data = buffers + 32;
  *x_data = 0.5f;
  DLTensor x = tensor(x_data, shape), a = tensor(a_data, shape), b = tensor(b_data, shape);
  /* The chain's argument lists: op 0 adds x to x into a; then the previous result plus x goes
   * into the other buffer, as the chain alternates between its two storages. */
  TVMFFIAny first[3] = {tensor_arg(&x), tensor_arg(&x), tensor_arg(&a)};
  TVMFFIAny into_b[3] = {tensor_arg(&a), tensor_arg(&x), tensor_arg(&b)};
  TVMFFIAny into_a[3] = {tensor_arg(&b), tensor_arg(&x), tensor_arg(&a)};
  double *times = malloc(sizeof(double) * (size_t)calls);
  if (!times) return 1;
  for (long r = 0; r < rounds; r++) {
    for (long c = 0; c < calls; c++) {
      TVMFFIAny result;
      memset(&result, 0, sizeof result);
      double t0 = now_us();
      int rc = __tvm_ffi_add1(NULL, first, 3, &result);
      for (long i = 1; i < n && rc == 0; i++) rc = __tvm_ffi_add1(NULL, (i & 1) ? into_b : into_a, 3, &result);
      times[c] = now_us() - t0;
      if (rc != 0) {
        fprintf(stderr, "floor: the kernel failed\n");
        return 1;
      }
    }
    float last = (n & 1) ? *a_data : *b_data;
    if (last != 0.5f * (float)(n + 1)) {
      fprintf(stderr, "floor: chain of %ld gave %g, expected %g\n", n, last, 0.5 * (double)(n + 1));
      return 1;
    }
    qsort(times, (size_t)calls, sizeof(double), compare_doubles);
    printf("median_us %.4f\n", times[calls / 2]);
  }
  free(times);
  free(buffers);
  return 0;
}
