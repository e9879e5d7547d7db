/*
 * registry_test.c: a C host registers its own function through rvm.h, and the model's kernel
 * calls it by name (tests/host_call/). Also: the host calls runtime functions by name, a version-1
 * host still gets a working table, and an unknown name fails with TVM's message. Everything is
 * freed; tests/c_api.rs runs it under valgrind.
 *
 * usage: registry_test HOST_CALL.so
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rvm.h"


typedef struct {
  float scale;
  int calls;
} scale_state;

static int deleted = 0;
static const rvm_api *api;

static void free_state(void *self) {
  deleted++;
  free(self);
}

static DLTensor *tensor_of(const TVMFFIAny *a) {
  if (a->type_index == kTVMFFITensor) return rvm_tensor_of_object(a->v_obj);
  if (a->type_index == kTVMFFIDLTensorPtr) return (DLTensor *)a->v_ptr;
  return NULL;
}

/* host.scale_add(x, out, b): out = scale * x + b, scale from the registration's state. */
static int scale_add(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)result;
  scale_state *s = self;
  DLTensor *x = n == 3 ? tensor_of(&args[0]) : NULL, *out = n == 3 ? tensor_of(&args[1]) : NULL;
  if (!x || !out || args[2].type_index != kTVMFFIFloat) {
    api->error_set("TypeError", "host.scale_add expects (x, out, float)");
    return -1;
  }
  s->calls++;
  const float *xs = (const float *)((char *)x->data + x->byte_offset);
  float *os = (float *)((char *)out->data + out->byte_offset);
  for (int64_t i = 0; i < x->shape[0]; i++) os[i] = s->scale * xs[i] + (float)args[2].v_float64;
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: registry_test HOST_CALL.so\n");
    return 2;
  }
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  rvm_get_api_fn get = (rvm_get_api_fn)dlsym(lib, "rvm_get_api");
  api = get(RVM_ABI_VERSION);
  const rvm_api *v1 = get(1);
  CHECK(api && v1 && v1->module_open == api->module_open, "a version-1 host gets the same table");
  CHECK(get(0) == NULL && get(RVM_ABI_VERSION + 1) == NULL, "unknown versions are refused");

  /* The host's function, with state the library owns from here on. */
  scale_state *state = malloc(sizeof *state);
  state->scale = 2.0f;
  state->calls = 0;
  CHECK(api->function_register("host.scale_add", scale_add, state, free_state, 0) == 0, "register: %s", api->last_error());
  CHECK(api->function_register("host.scale_add", scale_add, NULL, NULL, 0) != 0 &&
            strstr(api->last_error(), "already registered") != NULL,
        "a second registration without override is refused: %s", api->last_error());
  CHECK(api->function_register(NULL, scale_add, NULL, NULL, 0) != 0, "a NULL name is refused");

  rvm_module *m = NULL;
  rvm_vm *vm = NULL;
  CHECK(api->module_open(&m) == 0, "module_open: %s", api->last_error());
  CHECK(api->vm_create(m, &vm) == 0, "vm_create: %s", api->last_error());
  int32_t main_fn = -1, missing_fn = -1;
  CHECK(api->function_find(m, "main", &main_fn) == 0, "main");
  CHECK(api->function_find(m, "missing", &missing_fn) == 0, "missing");

  float xs[16] __attribute__((aligned(64))) = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  DLTensor x = {xs, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, NULL, 0};
  rvm_value arg = {.type_index = kTVMFFIDLTensorPtr, .v_ptr = &x};
  for (int round = 0; round < 3; round++) {
    rvm_value out = {0};
    CHECK(api->vm_call(vm, main_fn, &arg, 1, &out) == 0, "main: %s", api->last_error());
    const DLTensor *y = api->tensor_view(&out);
    CHECK(y && y->shape[0] == 4, "result shape");
    for (int i = 0; y && i < 4; i++) CHECK(((float *)y->data)[i] == 2.0f * xs[i] + 1.0f, "y[%d] = %g", i, ((float *)y->data)[i]);
    api->value_release(&out);
  }
  CHECK(state->calls == 3, "the kernel called the host function 3 times (%d)", state->calls);

  rvm_value out = {0};
  CHECK(api->vm_call(vm, missing_fn, &arg, 1, &out) != 0, "a name nobody provides fails");
  CHECK(strcmp(api->last_error(),
               "in missing at pc 5 (call_missing): Cannot find function host.missing in the imported modules or global registry.") == 0,
        "TVM's message: %s", api->last_error());

  /* The host calls functions by name too: its own, and the runtime's. */
  rvm_value f = {0}, none = {0};
  CHECK(api->function_get("host.scale_add", &f) == 0, "function_get: %s", api->last_error());
  float ys[4] __attribute__((aligned(64)));
  DLTensor y = {ys, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, NULL, 0};
  rvm_value call_args[3] = {arg, {.type_index = kTVMFFIDLTensorPtr, .v_ptr = &y}, {.type_index = kTVMFFIFloat, .v_float64 = 0.5}};
  CHECK(api->function_call(&f, call_args, 3, &none) == 0 && ys[3] == 8.5f, "host.scale_add by name: %s", api->last_error());
  api->value_release(&f);
  rvm_value sort = {0};
  CHECK(api->function_get("tvm.contrib.sort.sort", &sort) == 0, "the runtime's sort");
  rvm_value sort_args[4] = {call_args[1], arg, {.type_index = kTVMFFIInt, .v_int64 = 0}, {.type_index = kTVMFFIBool, .v_int64 = 0}};
  CHECK(api->function_call(&sort, sort_args, 4, &none) == 0 && xs[0] == 8.5f && xs[3] == 2.5f, "sort by name: %s", api->last_error());
  api->value_release(&sort);
  CHECK(api->function_get("no.such.function", &f) != 0, "unknown names are an error");
  rvm_value bad[1] = {arg};
  CHECK(api->function_get("host.scale_add", &f) == 0 && api->function_call(&f, bad, 1, &none) != 0 &&
            strcmp(api->last_error(), "host.scale_add expects (x, out, float)") == 0 && strcmp(api->last_error_kind(), "TypeError") == 0,
        "a host function's error reaches the caller: %s", api->last_error());
  api->value_release(&f);
  CHECK(api->function_call(NULL, NULL, 0, &none) != 0, "a NULL function is an error");

  api->vm_destroy(vm);
  api->module_close(m);
  dlclose(lib);
  CHECK(deleted == 1, "the library released the host's state when it unloaded (%d)", deleted);
  return check_report("registry_test");
}
