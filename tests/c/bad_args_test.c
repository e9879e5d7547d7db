/*
 * bad_args_test.c: every function of rvm.h called with bad arguments (NULL pointers, values of
 * the wrong kind, impossible sizes) must fail with an error code and a message, or do nothing
 * where it cannot fail, and never crash. Also: one VM used from a second thread while a call runs
 * is refused, and results never share memory with DLTensor arguments. tests/c_api.rs runs it,
 * also under valgrind.
 *
 * usage: bad_args_test CALLS.so CALLS_INSTRUMENTED.so IDENTITY.so
 *   CALLS.so:     main(x: (2, 3) f32, y: (2, 3) f32), the `calls` fixture
 *   IDENTITY.so:  main(x) = x
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rvm.h"

static const rvm_api *api;

/* The API table of the model at path; the library stays loaded until exit (never closed). */
static const rvm_api *load(const char *path) {
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
    exit(2);
  }
  rvm_get_api_fn get_api = (rvm_get_api_fn)dlsym(lib, "rvm_get_api");
  CHECK(get_api(0) == NULL && get_api(RVM_ABI_VERSION + 1) == NULL, "rvm_get_api accepts an unsupported version");
  return get_api(RVM_ABI_VERSION);
}

/* Loads the model at path into `api` and opens its module, a VM and `main`; the caller owns *m and
 * *vm (vm_destroy, module_close). Non-zero, with the reason printed, on failure. */
static int open_main(const char *path, rvm_module **m, rvm_vm **vm, int32_t *main_fn) {
  api = load(path);
  if (api->module_open(m) || api->vm_create(*m, vm) || api->function_find(*m, "main", main_fn)) {
    fprintf(stderr, "%s: %s\n", path, api->last_error());
    return -1;
  }
  return 0;
}

#define FAILS(call, what)                                                                       \
  do {                                                                                          \
    int rc_ = (call);                                                                           \
    CHECK(rc_ != 0, "%s: succeeded", what);                                                     \
    CHECK(api->last_error()[0] != '\0', "%s: no message", what);                                \
    CHECK(api->last_error_kind()[0] != '\0', "%s: no error kind", what);                         \
  } while (0)

static void nulls(rvm_module *m, rvm_vm *vm) {
  rvm_value none = {0}, out = {0}, tensor_arg = {.type_index = kTVMFFIDLTensorPtr, .v_ptr = NULL};
  int32_t index;
  rvm_module_info info;
  FAILS(api->module_open(NULL), "module_open(NULL)");
  api->module_close(NULL);
  FAILS(api->module_info(NULL, &info), "module_info(NULL module)");
  FAILS(api->module_info(m, NULL), "module_info(NULL out)");
  CHECK(api->function_name(NULL, 0) == NULL, "function_name(NULL)");
  CHECK(api->function_name(m, -1) == NULL && api->function_name(m, 1 << 30) == NULL, "function_name out of range");
  FAILS(api->function_find(NULL, "main", &index), "function_find(NULL module)");
  FAILS(api->function_find(m, NULL, &index), "function_find(NULL name)");
  FAILS(api->function_find(m, "main", NULL), "function_find(NULL out)");
  FAILS(api->function_find(m, "nope", &index), "function_find(unknown)");
  CHECK(api->function_arity(NULL, 0) == -1 && api->function_arity(m, -5) == -1, "function_arity bad");
  rvm_vm *v2;
  FAILS(api->vm_create(NULL, &v2), "vm_create(NULL module)");
  FAILS(api->vm_create(m, NULL), "vm_create(NULL out)");
  FAILS(api->vm_create_on(NULL, (DLDevice){kDLCPU, 0}, &v2), "vm_create_on(NULL module)");
  FAILS(api->vm_create_on(m, (DLDevice){kDLCPU, 0}, NULL), "vm_create_on(NULL out)");
  FAILS(api->vm_create_on(m, (DLDevice){99, 0}, &v2), "vm_create_on(bad device)");
  api->vm_destroy(NULL);
  FAILS(api->vm_call(NULL, 0, NULL, 0, &out), "vm_call(NULL vm)");
  FAILS(api->vm_call(vm, 0, NULL, 0, NULL), "vm_call(NULL result)");
  FAILS(api->vm_call(vm, 0, NULL, 2, &out), "vm_call(NULL args, 2)");
  FAILS(api->vm_call(vm, 0, NULL, -1, &out), "vm_call(-1 args)");
  FAILS(api->vm_call(vm, 77, NULL, 0, &out), "vm_call(bad function)");
  FAILS(api->vm_call(vm, 0, &tensor_arg, 1, &out), "vm_call(NULL DLTensor)");
  FAILS(api->vm_call_closure(vm, NULL, NULL, 0, &out), "vm_call_closure(NULL closure)");
  CHECK(strstr(api->last_error(), "closure is NULL") != NULL, "NULL closure named: %s", api->last_error());
  rvm_value seven = {.type_index = kTVMFFIInt, .v_int64 = 7};
  FAILS(api->vm_call_closure(vm, &seven, NULL, 0, &out), "vm_call_closure(int)");
  FAILS(api->vm_call_closure(NULL, &seven, NULL, 0, &out), "vm_call_closure(NULL vm)");
  api->vm_stats(NULL, NULL);
  rvm_vm_stats stats;
  api->vm_stats(NULL, &stats);
  CHECK(stats.live_storage_bytes == 0, "vm_stats(NULL vm) zeroes");
  api->vm_stats(vm, NULL);
  api->vm_reset_stats(NULL);
  api->value_release(NULL);
  api->value_release(&none);
  api->value_retain(NULL, &out);
  CHECK(out.type_index == kTVMFFINone, "value_retain(NULL) gives None");
  api->value_retain(&seven, NULL);
  CHECK(api->value_type_name(NULL) != NULL, "value_type_name(NULL)");
  FAILS(api->shape_new(NULL, 2, &out), "shape_new(NULL dims)");
  FAILS(api->shape_new(NULL, -1, &out), "shape_new(-1)");
  int64_t dims[2] = {2, 3};
  FAILS(api->shape_new(dims, 2, NULL), "shape_new(NULL out)");
  FAILS(api->shape_new(dims, INT64_C(1) << 61, &out), "shape_new(2^61)");
  const int64_t *view;
  int64_t n;
  FAILS(api->shape_view(NULL, &view, &n), "shape_view(NULL)");
  FAILS(api->shape_view(&seven, &view, &n), "shape_view(int)");
  FAILS(api->tuple_new(NULL, 3, &out), "tuple_new(NULL items)");
  FAILS(api->tuple_new(&seven, 1, NULL), "tuple_new(NULL out)");
  FAILS(api->tuple_new(&seven, INT64_C(1) << 60, &out), "tuple_new(2^60)");
  FAILS(api->tuple_new(&tensor_arg, 1, &out), "tuple_new(NULL DLTensor)");
  CHECK(api->tuple_size(NULL) == -1 && api->tuple_size(&seven) == -1, "tuple_size of non-tuples");
  FAILS(api->tuple_get(NULL, 0, &out), "tuple_get(NULL)");
  FAILS(api->tuple_get(&seven, 0, &out), "tuple_get(int)");
  CHECK(api->tensor_view(NULL) == NULL && api->tensor_view(&seven) == NULL, "tensor_view of non-tensors");
  DLManagedTensorVersioned *dl;
  FAILS(api->tensor_export(NULL, &dl), "tensor_export(NULL)");
  FAILS(api->tensor_export(&seven, &dl), "tensor_export(int)");
  FAILS(api->tensor_to_host(NULL, &out), "tensor_to_host(NULL)");
  FAILS(api->tensor_to_host(&seven, &out), "tensor_to_host(int)");
  FAILS(api->function_register(NULL, NULL, NULL, NULL, 0), "function_register(NULL)");
  FAILS(api->function_register("x", NULL, NULL, NULL, 0), "function_register(NULL fn)");
  FAILS(api->function_get(NULL, &out), "function_get(NULL)");
  FAILS(api->function_get("no.such.function", &out), "function_get(unknown)");
  FAILS(api->function_call(NULL, NULL, 0, &out), "function_call(NULL)");
  FAILS(api->function_call(&seven, NULL, 0, &out), "function_call(int)");
  api->error_set(NULL, NULL);
  CHECK(api->last_error() != NULL, "error_set(NULL, NULL)");
  FAILS(api->vm_set_instrument(NULL, NULL, NULL), "vm_set_instrument(NULL)");
  rvm_vm *v3 = NULL;
  rvm_allocator no_functions = {NULL, NULL, NULL};
  FAILS(api->vm_create_with_allocator(NULL, &no_functions, &v3), "vm_create_with_allocator(NULL module)");
  FAILS(api->vm_create_with_allocator(m, NULL, &v3), "vm_create_with_allocator(NULL allocator)");
  FAILS(api->vm_create_with_allocator(m, &no_functions, &v3), "vm_create_with_allocator(NULL alloc and free)");
  CHECK(v3 == NULL, "vm_create_with_allocator wrote a VM on failure");
  CHECK(api->value_allocator(NULL) == NULL && api->value_allocator(&seven) == NULL && api->value_allocator(&none) == NULL,
        "value_allocator of NULL, an int or None names an allocator");
  rvm_weights *weights = NULL;
  int32_t count = 0;
  FAILS(api->weights_open(NULL, "/nonexistent", &weights), "weights_open(NULL module)");
  FAILS(api->weights_open(m, NULL, &weights), "weights_open(NULL path)");
  FAILS(api->weights_open(m, "/nonexistent", NULL), "weights_open(NULL out)");
  FAILS(api->weights_open(m, "/nonexistent", &weights), "weights_open(a missing path)");
  FAILS(api->weights_open(m, "/dev/null", &weights), "weights_open(not weights)");
  CHECK(weights == NULL, "weights_open wrote weights on failure");
  FAILS(api->weights_arguments(NULL, 0, 0, NULL, 0, &count), "weights_arguments(NULL)");
  api->weights_close(NULL);
}

/* Bad DLTensor arguments: NULL shape, zero lanes, sizes that wrap, negative dims. */
static void bad_tensors(rvm_vm *vm, int32_t main_fn) {
  static float data[6] __attribute__((aligned(64)));
  int64_t shape[2] = {2, 3}, huge[2] = {INT64_C(1) << 62, 16}, negative[2] = {2, -3};
  DLTensor ok = {.data = data, .device = {kDLCPU, 0}, .ndim = 2, .dtype = {kDLFloat, 32, 1}, .shape = shape};
  DLTensor cases[4] = {ok, ok, ok, ok};
  cases[0].shape = NULL;
  cases[1].dtype.lanes = 0;
  cases[2].shape = huge;
  cases[3].shape = negative;
  const char *what[4] = {"NULL shape", "zero lanes", "wrapping size", "negative dim"};
  for (int i = 0; i < 4; i++) {
    rvm_value args[2] = {{.type_index = kTVMFFIDLTensorPtr, .v_ptr = &cases[i]}, {.type_index = kTVMFFIDLTensorPtr, .v_ptr = &ok}};
    rvm_value out = {0};
    FAILS(api->vm_call(vm, main_fn, args, 2, &out), what[i]);
  }
}

/* The second-thread check: while main runs on the VM, the instrument hook asks another thread to
 * call into the same VM; that call must be refused. */
typedef struct {
  rvm_vm *vm;
  int32_t fn;
  int rc;
  char message[256];
} intruder;

static intruder intrusion;
static int hook_calls;

static void *intrude(void *arg) {
  intruder *in = arg;
  rvm_value out = {0};
  in->rc = api->vm_call(in->vm, in->fn, NULL, 0, &out);
  snprintf(in->message, sizeof in->message, "%s", api->last_error());
  api->value_release(&out);
  return NULL;
}

static int hook(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self, (void)args, (void)n;
  result->type_index = kTVMFFIInt;
  result->v_int64 = 0;
  if (hook_calls++ == 0) {
    pthread_t t;
    pthread_create(&t, NULL, intrude, &intrusion);
    pthread_join(t, NULL);
  }
  return 0;
}

static float *call_identity(rvm_vm *vm, int32_t fn, float *buffer, rvm_value *out) {
  int64_t shape[1] = {4};
  DLTensor t = {.data = buffer, .device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLFloat, 32, 1}, .shape = shape};
  rvm_value arg = {.type_index = kTVMFFIDLTensorPtr, .v_ptr = &t};
  if (api->vm_call(vm, fn, &arg, 1, out) != 0) return NULL;
  const DLTensor *r = api->tensor_view(out);
  return r ? (float *)((char *)r->data + r->byte_offset) : NULL;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: bad_args_test CALLS.so CALLS_INSTRUMENTED.so IDENTITY.so\n");
    return 2;
  }
  rvm_module *m;
  rvm_vm *vm;
  int32_t main_fn;
  if (open_main(argv[1], &m, &vm, &main_fn)) return 2;
  nulls(m, vm);
  bad_tensors(vm, main_fn);
  api->vm_destroy(vm);
  api->module_close(m);

  /* One VM, two threads. */
  if (open_main(argv[2], &m, &vm, &main_fn)) return 2;
  static float x[6] __attribute__((aligned(64))) = {1, 2, 3, 4, 5, 6};
  int64_t shape[2] = {2, 3};
  DLTensor tx = {.data = x, .device = {kDLCPU, 0}, .ndim = 2, .dtype = {kDLFloat, 32, 1}, .shape = shape};
  rvm_value args[2] = {{.type_index = kTVMFFIDLTensorPtr, .v_ptr = &tx}, {.type_index = kTVMFFIDLTensorPtr, .v_ptr = &tx}};
  intrusion = (intruder){.vm = vm, .fn = main_fn};
  CHECK(api->vm_set_instrument(vm, hook, NULL) == 0, "set hook: %s", api->last_error());
  rvm_value out = {0};
  CHECK(api->vm_call(vm, main_fn, args, 2, &out) == 0, "the owning thread's call: %s", api->last_error());
  api->value_release(&out);
  CHECK(hook_calls > 0, "the hook ran");
  CHECK(intrusion.rc != 0 && strstr(intrusion.message, "another thread") != NULL, "second thread refused: rc %d, %s",
        intrusion.rc, intrusion.message);
  api->vm_set_instrument(vm, NULL, NULL);
  CHECK(api->vm_call(vm, main_fn, args, 2, &out) == 0, "the VM is free again: %s", api->last_error());
  api->value_release(&out);
  api->vm_destroy(vm);
  api->module_close(m);

  /* Results never alias DLTensor arguments, aligned or not. */
  if (open_main(argv[3], &m, &vm, &main_fn)) return 2;
  static float buffer[32] __attribute__((aligned(64))) = {1, 2, 3, 4, 5, 6, 7, 8};
  for (int offset = 0; offset < 2; offset++) {
    rvm_value result = {0};
    float *in = buffer + offset, *got = call_identity(vm, main_fn, in, &result);
    CHECK(got != NULL, "identity call (offset %d): %s", offset, api->last_error());
    if (got) {
      CHECK(got != in, "offset %d: the result is the caller's buffer", offset);
      CHECK(memcmp(got, in, 4 * sizeof(float)) == 0, "offset %d: the result's values", offset);
    }
    api->value_release(&result);
  }
  api->vm_destroy(vm);
  api->module_close(m);
  return check_report("bad_args_test");
}
