/*
 * backend.c: what TVM-built kernels need from their host, bound at link time.
 *
 * TVM's LLVM kernels reach the backend API through weak pointer variables ("context slots")
 * that TVM's loader fills with dlsym at load time. relaxc links the kernels statically, so the
 * shim simply defines those variables strongly, already pointing at its own functions: the
 * linker prefers them over the kernels' weak NULL definitions and nothing happens at load time.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Temporary buffers of kernels: 64-byte aligned, freed by the kernel that took them.
 *
 * Except when the kernel fails: TVM's generated code returns at the first failed allocation
 * without freeing the workspaces it already holds. So each thread keeps its outstanding
 * workspaces on a list, and whoever ran the failed code (a VM call, a pool task, a host's
 * function_call) frees what was taken since it started: no workspace outlives its kernel. */
typedef struct workspace {
  struct workspace *prev, *next;
} workspace;
enum { WORKSPACE_HEADER = 64 }; /* keeps the kernel's pointer 64-byte aligned */
_Static_assert(sizeof(workspace) <= WORKSPACE_HEADER, "workspace header");

static pthread_key_t workspace_key;
static pthread_once_t workspace_once = PTHREAD_ONCE_INIT;
static bool workspace_key_made;

static void make_workspace_key(void) { workspace_key_made = pthread_key_create(&workspace_key, NULL) == 0; }

static workspace *outstanding(void) {
  pthread_once(&workspace_once, make_workspace_key);
  return workspace_key_made ? pthread_getspecific(workspace_key) : NULL;
}

static void set_outstanding(workspace *top) {
  if (workspace_key_made) pthread_setspecific(workspace_key, top);
}

void *rvm_workspace_mark(void) { return outstanding(); }

void rvm_workspace_release_to(void *mark) {
  workspace *w = outstanding();
  while (w && w != mark) {
    workspace *prev = w->prev;
    rvm_mem_free(w);
    w = prev;
  }
  if (w) w->next = NULL;
  set_outstanding(w);
}

__attribute__((destructor(101))) static void delete_workspace_key(void) {
  if (workspace_key_made) pthread_key_delete(workspace_key);
  workspace_key_made = false;
}

RVM_HIDDEN void *TVMBackendAllocWorkspace(int device_type, int device_id, uint64_t nbytes, int dtype_code_hint,
                                          int dtype_bits_hint) {
  (void)device_id, (void)dtype_code_hint, (void)dtype_bits_hint;
  if (device_type != kDLCPU) {
    rvm_raise("RuntimeError", "workspace requested on device type %d; only the CPU is supported", device_type);
    return NULL;
  }
  if (nbytes > SIZE_MAX - 2 * WORKSPACE_HEADER) {
    rvm_raise("MemoryError", "cannot allocate a %llu-byte kernel workspace", (unsigned long long)nbytes);
    return NULL;
  }
  size_t rounded = (size_t)((nbytes + 63) & ~(uint64_t)63) + (nbytes == 0 ? 64 : 0);
  workspace *w = rvm_mem_aligned(rounded + WORKSPACE_HEADER, 64, "a kernel workspace");
  if (!w) return NULL;
  workspace *top = outstanding();
  w->prev = top;
  w->next = NULL;
  if (top) top->next = w;
  set_outstanding(w);
  return (char *)w + WORKSPACE_HEADER;
}

RVM_HIDDEN int TVMBackendFreeWorkspace(int device_type, int device_id, void *ptr) {
  (void)device_type, (void)device_id;
  if (!ptr) return 0;
  workspace *w = (workspace *)((char *)ptr - WORKSPACE_HEADER);
  if (w->next) w->next->prev = w->prev;
  else set_outstanding(w->prev);
  if (w->prev) w->prev->next = w->next;
  rvm_mem_free(w);
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
