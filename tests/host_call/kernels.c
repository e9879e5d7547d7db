/*
 * Kernels that call global functions by name, as TVM's sort and topk kernels do: look the
 * function up once with TVMFFIEnvModLookupFromImports, cache the handle, call it with
 * TVMFFIFunctionCall. tests/c/registry_test.c registers the function they call.
 */
#include <stddef.h>

#include "rvm_kernel.h"

#define EXPORT __attribute__((visibility("default")))

/* (x, out): calls host.scale_add(x, out, 1.0). */
EXPORT int __tvm_ffi_call_host(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self, (void)result;
  static void *handle; /* cached per kernel, as TVM's kernels cache theirs */
  if (!handle && TVMFFIEnvModLookupFromImports(NULL, "host.scale_add", &handle) != 0) return -1;
  if (n != 2) {
    TVMFFIErrorSetRaisedFromCStr("TypeError", "call_host expects (x, out)");
    return -1;
  }
  TVMFFIAny call[3] = {args[0], args[1], {0}};
  call[2].type_index = kTVMFFIFloat;
  call[2].v_float64 = 1.0;
  TVMFFIAny ret = {0};
  return TVMFFIFunctionCall(handle, call, 3, &ret);
}

/* Looks up a name nobody registers: fails with TVM's message. */
EXPORT int __tvm_ffi_call_missing(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self, (void)args, (void)n, (void)result;
  void *handle = NULL;
  return TVMFFIEnvModLookupFromImports(NULL, "host.missing", &handle);
}
