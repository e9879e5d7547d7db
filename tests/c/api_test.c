/*
 * api_test.c: a C host using a relaxc model through rvm.h only, as a user would: dlopen, the
 * API table, DLTensor inputs, results checked against values computed here, errors, DLPack
 * export, and everything freed. tests/c_api.rs builds it and runs it, also under valgrind.
 *
 * usage: api_test DYN_TUPLE.so CALLS.so
 *   DYN_TUPLE.so: main(x: (n, 4) f32, y: (n, 4) f32) -> ((x + y, x * y), (x + y) - x * y)
 *   CALLS.so:     main(x: (2, 3) f32, y: (2, 3) f32) -> (x * 4y, 4y), through Relax calls and a closure
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rvm.h"


typedef struct {
  void *lib;
  const rvm_api *api;
  rvm_module *module;
  rvm_vm *vm;
  int32_t main_fn;
} model;

/* Opens a model; the caller owns everything in *m and frees it with close_model. */
static int open_model(const char *path, model *m) {
  memset(m, 0, sizeof(*m));
  m->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!m->lib) {
    fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
    return -1;
  }
  rvm_get_api_fn get = (rvm_get_api_fn)dlsym(m->lib, "rvm_get_api");
  CHECK(get != NULL, "rvm_get_api not exported");
  if (!get) return -1;
  CHECK(get(RVM_ABI_VERSION + 1) == NULL, "an unknown ABI version must be refused");
  m->api = get(RVM_ABI_VERSION);
  CHECK(m->api && m->api->struct_size == sizeof(rvm_api), "API table");
  if (!m->api) return -1;
  if (m->api->module_open(&m->module) != 0) {
    fprintf(stderr, "module_open: %s\n", m->api->last_error());
    return -1;
  }
  rvm_module_info info;
  CHECK(m->api->module_info(m->module, &info) == 0 && info.abi_version == RVM_ABI_VERSION, "module_info");
  CHECK(info.compiler_version && info.compiler_version[0], "compiler version recorded");
  CHECK(m->api->function_find(m->module, "main", &m->main_fn) == 0, "main found");
  int32_t missing;
  CHECK(m->api->function_find(m->module, "no_such_function", &missing) != 0, "unknown function rejected");
  CHECK(strstr(m->api->last_error(), "no_such_function") != NULL, "error names the function: %s", m->api->last_error());
  CHECK(m->api->vm_create(m->module, &m->vm) == 0, "vm_create");
  return 0;
}

static void close_model(model *m) {
  if (m->api) {
    m->api->vm_destroy(m->vm);
    m->api->module_close(m->module);
  }
  if (m->lib) dlclose(m->lib);
}

/* A DLTensor over caller-owned data (borrowed by the call). */
static DLTensor tensor2d(float *data, int64_t *shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = 2;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

static const float *floats_of(const rvm_api *api, const rvm_value *v, int64_t rows, int64_t cols) {
  const DLTensor *t = api->tensor_view(v);
  if (!t || t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols || t->dtype.code != kDLFloat) return NULL;
  return (const float *)((const char *)t->data + t->byte_offset);
}

/* open_model, counting a failure to open as a failed check (the model is closed again). */
static int open_model_checked(const char *path, model *m) {
  int rc = open_model(path, m);
  CHECK(rc == 0, "cannot open %s", path);
  if (rc != 0) close_model(m);
  return rc;
}

static void test_dyn_tuple(const char *path, size_t misalign) {
  model m;
  if (open_model_checked(path, &m) != 0) return;
  const rvm_api *api = m.api;
  CHECK(api->function_arity(m.module, m.main_fn) == 2, "arity");
  enum { N = 3, C = 4 };
  /* 64-byte aligned buffers; `misalign` shifts the data to exercise the runtime's copy. */
  /* C11's aligned_alloc wants a size that is a multiple of the alignment (ASan insists). */
  size_t bytes = (128 + sizeof(float) * N * C + 63) / 64 * 64;
  float *xb = aligned_alloc(64, bytes), *yb = aligned_alloc(64, bytes);
  float *x = (float *)((char *)xb + misalign), *y = (float *)((char *)yb + misalign);
  for (int i = 0; i < N * C; i++) {
    x[i] = 0.25f * (float)i - 1.0f;
    y[i] = 1.5f - 0.125f * (float)i;
  }
  int64_t shape[2] = {N, C};
  DLTensor tx = tensor2d(x, shape), ty = tensor2d(y, shape);
  rvm_value args[2] = {{.type_index = kTVMFFIDLTensorPtr, .v_ptr = &tx}, {.type_index = kTVMFFIDLTensorPtr, .v_ptr = &ty}};

  for (int round = 0; round < 20; round++) {
    rvm_value out = {0};
    int rc = api->vm_call(m.vm, m.main_fn, args, 2, &out);
    CHECK(rc == 0, "call failed: %s", api->last_error());
    if (rc != 0) break;
    CHECK(api->tuple_size(&out) == 2, "outer tuple");
    rvm_value pair, s;
    CHECK(api->tuple_get(&out, 0, &pair) == 0 && api->tuple_size(&pair) == 2, "inner tuple");
    CHECK(api->tuple_get(&out, 1, &s) == 0, "third result");
    rvm_value a, p;
    api->tuple_get(&pair, 0, &a);
    api->tuple_get(&pair, 1, &p);
    const float *fa = floats_of(api, &a, N, C), *fp = floats_of(api, &p, N, C), *fs = floats_of(api, &s, N, C);
    CHECK(fa && fp && fs, "results are (3, 4) float32 tensors");
    if (fa && fp && fs) {
      for (int i = 0; i < N * C; i++) {
        volatile float sum = x[i] + y[i], prod = x[i] * y[i];
        volatile float diff = sum - prod;
        CHECK(fa[i] == sum && fp[i] == prod && fs[i] == diff, "element %d: %g %g %g", i, fa[i], fp[i], fs[i]);
      }
    }
    if (round == 0) {
      DLManagedTensorVersioned *dl = NULL;
      CHECK(api->tensor_export(&s, &dl) == 0 && dl, "DLPack export");
      if (dl) {
        CHECK(dl->dl_tensor.ndim == 2 && dl->dl_tensor.shape[1] == C, "DLPack shape");
        rvm_value copy;
        api->value_retain(&s, &copy);
        api->value_release(&out); /* the export and the copy keep the tensor alive */
        CHECK(((const float *)dl->dl_tensor.data)[1] == fs[1], "export outlives the tuple");
        api->value_release(&copy);
        dl->deleter(dl);
        continue;
      }
    }
    api->value_release(&out);
    CHECK(out.type_index == kTVMFFINone, "release leaves None");
  }
  rvm_vm_stats stats;
  api->vm_stats(m.vm, &stats);
  CHECK(stats.pool_hits > 0 && stats.live_storage_bytes == 0, "storage is pooled and all returned (hits %llu, live %llu)",
        (unsigned long long)stats.pool_hits, (unsigned long long)stats.live_storage_bytes);

  /* Errors name function, instruction and parameter, and leave the VM usable. */
  rvm_value out = {0};
  CHECK(api->vm_call(m.vm, m.main_fn, args, 1, &out) != 0, "wrong arity accepted");
  CHECK(strstr(api->last_error(), "expects 2 arguments (x, y), but 1 arguments were provided") != NULL, "arity message: %s",
        api->last_error());
  int64_t short_shape[2] = {N - 1, C};
  DLTensor ty2 = tensor2d(y, short_shape);
  rvm_value bad[2] = {args[0], {.type_index = kTVMFFIDLTensorPtr, .v_ptr = &ty2}};
  CHECK(api->vm_call(m.vm, m.main_fn, bad, 2, &out) != 0, "inconsistent n accepted");
  CHECK(strstr(api->last_error(), "in main at pc") && strstr(api->last_error(), "param=y") &&
            strcmp(api->last_error_kind(), "RuntimeError") == 0,
        "shape message: %s", api->last_error());
  DLTensor tf = tx;
  tf.dtype.bits = 64;
  rvm_value wrong_dtype[2] = {{.type_index = kTVMFFIDLTensorPtr, .v_ptr = &tf}, args[1]};
  CHECK(api->vm_call(m.vm, m.main_fn, wrong_dtype, 2, &out) != 0, "float64 accepted");
  CHECK(strstr(api->last_error(), "expect Tensor with dtype float32 but get float64"), "dtype message: %s", api->last_error());
  CHECK(api->vm_call(m.vm, m.main_fn, args, 2, &out) == 0, "VM unusable after errors: %s", api->last_error());
  api->value_release(&out);

  /* Shapes and tuples made by the host. */
  int64_t dims[3] = {7, 8, 9};
  rvm_value shp = {0}, tup = {0};
  CHECK(api->shape_new(dims, 3, &shp) == 0, "shape_new");
  const int64_t *got;
  int64_t n;
  CHECK(api->shape_view(&shp, &got, &n) == 0 && n == 3 && got[2] == 9, "shape_view");
  rvm_value items[2] = {shp, args[0]};
  CHECK(api->tuple_new(items, 2, &tup) == 0 && api->tuple_size(&tup) == 2, "tuple_new");
  api->value_release(&shp);
  api->value_release(&tup);

  free(xb);
  free(yb);
  close_model(&m);
}

static void test_calls(const char *path) {
  model m;
  if (open_model_checked(path, &m) != 0) return;
  const rvm_api *api = m.api;
  float *x = aligned_alloc(64, 64), *y = aligned_alloc(64, 64);
  for (int i = 0; i < 6; i++) {
    x[i] = (float)i * 0.5f + 0.25f;
    y[i] = 3.0f - (float)i;
  }
  int64_t shape[2] = {2, 3};
  DLTensor tx = tensor2d(x, shape), ty = tensor2d(y, shape);
  rvm_value args[2] = {{.type_index = kTVMFFIDLTensorPtr, .v_ptr = &tx}, {.type_index = kTVMFFIDLTensorPtr, .v_ptr = &ty}};
  rvm_value out = {0};
  int rc = api->vm_call(m.vm, m.main_fn, args, 2, &out);
  CHECK(rc == 0, "calls: %s", api->last_error());
  if (rc == 0) {
    rvm_value r, s;
    api->tuple_get(&out, 0, &r);
    api->tuple_get(&out, 1, &s);
    const float *fr = floats_of(api, &r, 2, 3), *fs = floats_of(api, &s, 2, 3);
    CHECK(fr && fs, "calls results");
    for (int i = 0; fr && fs && i < 6; i++) {
      volatile float h = y[i] + y[i];
      volatile float four = h + h;
      volatile float prod = x[i] * four;
      CHECK(fs[i] == four && fr[i] == prod, "calls element %d", i);
    }
    api->value_release(&out);
  }
  free(x);
  free(y);
  close_model(&m);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s DYN_TUPLE.so CALLS.so\n", argv[0]);
    return 2;
  }
  test_dyn_tuple(argv[1], 0);
  test_dyn_tuple(argv[1], 4); /* misaligned inputs */
  test_calls(argv[2]);
  return check_report("api_test");
}
