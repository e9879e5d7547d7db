/*
 * ffi_exports.c: the kernels as tvm-ffi functions, for the library `relaxc kernel-library`
 * builds for TVM's own process: relaxc.tvm loads it with tvm_ffi.load_module and registers each
 * kernel under its global name, so that TVM's VM runs a rewritten module on the very code a
 * relaxc model links (same bits). A model never refers to these, so they are never in a model.
 *
 * Each export is __tvm_ffi_<suffix> for a row RVM_BUILTIN(suffix, ...) of rvm_kernels.def; an
 * error is handed to libtvm_ffi, where the caller reads it.
 */
#include "rk.h"

#define RVM_BUILTIN(suffix, name, properties, doc)                                                     \
  __attribute__((visibility("default"))) int __tvm_ffi_##suffix(void *self, const TVMFFIAny *args,    \
                                                                int32_t num_args, TVMFFIAny *result); \
  int __tvm_ffi_##suffix(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {    \
    rvm_error_clear();                                                                                 \
    int rc = rvm_builtin_##suffix(self, args, num_args, result);                                       \
    if (rc) rvm_ffi_forward_error();                                                                   \
    return rc;                                                                                         \
  }
#include "rvm_kernels.def"
#undef RVM_BUILTIN
