/*
 * backend.c: what TVM-built kernels need from their host, bound at link time.
 *
 * TVM's LLVM kernels reach the backend API through weak pointer variables ("context slots")
 * that TVM's loader fills with dlsym at load time. relaxc links the kernels statically, so the
 * shim simply defines those variables strongly, already pointing at its own functions: the
 * linker prefers them over the kernels' weak NULL definitions and nothing happens at load time.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Temporary buffers of kernels: 64-byte aligned, freed in LIFO order. */
RVM_HIDDEN void *TVMBackendAllocWorkspace(int device_type, int device_id, uint64_t nbytes, int dtype_code_hint,
                                          int dtype_bits_hint) {
  (void)device_id, (void)dtype_code_hint, (void)dtype_bits_hint;
  if (device_type != kDLCPU) {
    rvm_raise("RuntimeError", "workspace requested on device type %d; only the CPU is supported", device_type);
    return NULL;
  }
  void *p = aligned_alloc(64, (size_t)((nbytes + 63) & ~(uint64_t)63) + (nbytes == 0 ? 64 : 0));
  if (!p) rvm_raise("MemoryError", "out of memory allocating a %llu-byte kernel workspace", (unsigned long long)nbytes);
  return p;
}

RVM_HIDDEN int TVMBackendFreeWorkspace(int device_type, int device_id, void *ptr) {
  (void)device_type, (void)device_id;
  free(ptr);
  return 0;
}

/* Packed calls made by kernels: the handle is a Function object. */
RVM_HIDDEN int TVMFFIFunctionCall(void *func, TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  rvm_function *f = func;
  return f->cell.safe_call(f, args, num_args, result);
}

RVM_HIDDEN int TVMFFIHandleInitOnce(void **handle_addr, int (*init)(void **result)) {
  void *current = __atomic_load_n(handle_addr, __ATOMIC_ACQUIRE);
  if (current) return 0;
  void *made = NULL;
  int rc = init(&made);
  if (rc != 0) return rc;
  if (!made) return rvm_raise("RuntimeError", "handle initialisation produced NULL");
  __atomic_store_n(handle_addr, made, __ATOMIC_RELEASE);
  return 0;
}

/* The context slots (see the header comment). Names are fixed by TVM's code generator. */
RVM_HIDDEN void *__TVMBackendAllocWorkspace = (void *)TVMBackendAllocWorkspace;
RVM_HIDDEN void *__TVMBackendFreeWorkspace = (void *)TVMBackendFreeWorkspace;
RVM_HIDDEN void *__TVMBackendParallelLaunch = (void *)TVMBackendParallelLaunch;
RVM_HIDDEN void *__TVMBackendParallelBarrier = (void *)TVMBackendParallelBarrier;
RVM_HIDDEN void *__TVMFFIFunctionCall = (void *)TVMFFIFunctionCall;
RVM_HIDDEN void *__TVMFFIEnvModLookupFromImports = (void *)TVMFFIEnvModLookupFromImports;
RVM_HIDDEN void *__TVMFFIHandleInitOnce = (void *)TVMFFIHandleInitOnce;
RVM_HIDDEN void *__TVMFFIErrorSetRaisedFromCStr = (void *)TVMFFIErrorSetRaisedFromCStr;
static char library_ctx_marker;
RVM_HIDDEN void *__tvm_ffi__library_ctx = &library_ctx_marker;
