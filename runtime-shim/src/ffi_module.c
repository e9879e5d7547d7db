/*
 * ffi_module.c: the model as a tvm-ffi module, so that `tvm_ffi.load_module("m.so")["main"](x)`
 * works from Python with numpy or torch and no libtvm (what tvm_ffi.load_module expects of a
 * library: apache/tvm-ffi src/ffi/extra/library_module.cc).
 *
 * relaxc exports `__tvm_ffi_<name>` for each Relax function: a stub in the model object that
 * calls rvm_ffi_call with the function's index. Here, the module is opened once, each calling
 * thread gets its own VM on first use (a VM belongs to one thread; Python releases the GIL
 * during calls), and arguments are taken as tvm-ffi passes them: tensors as Tensor objects
 * whose data may be misaligned (they go through the same checks and copies as DLTensor
 * arguments of vm_call). Results are this library's own objects, which tvm-ffi reads in place
 * (numpy.from_dlpack needs no copy).
 *
 * Errors must land in libtvm_ffi's thread-local slot, or Python crashes reading an empty one:
 * the runtime's own error is copied there through TVMFFIErrorSetRaisedFromCStr, looked up in the
 * global scope at the time of the error (the Python package loads libtvm_ffi RTLD_GLOBAL).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

static rvm_module *ffi_module;
static int ffi_open_rc;
static char ffi_open_error[512];
static pthread_once_t ffi_once = PTHREAD_ONCE_INIT;
static pthread_key_t ffi_vm_key;
static bool ffi_key_made;

static void destroy_thread_vm(void *vm) { rvm_vm_destroy(vm); }

static void open_ffi_module(void) {
  ffi_key_made = pthread_key_create(&ffi_vm_key, destroy_thread_vm) == 0;
  ffi_open_rc = rvm_module_open(&ffi_module);
  if (ffi_open_rc) snprintf(ffi_open_error, sizeof ffi_open_error, "%s", rvm_error_message());
}

/* On unload: the threads' VMs still hold the module; the calling thread's goes now. */
__attribute__((destructor(103))) static void close_ffi_module(void) {
  if (!ffi_key_made) return;
  rvm_vm *vm = pthread_getspecific(ffi_vm_key);
  if (vm) {
    pthread_setspecific(ffi_vm_key, NULL);
    rvm_vm_destroy(vm);
  }
  pthread_key_delete(ffi_vm_key);
  if (ffi_module) rvm_module_close(ffi_module);
}

typedef void (*set_raised_fn)(const char *kind, const char *message);

void rvm_ffi_forward_error(void) {
  set_raised_fn set = (set_raised_fn)dlsym(RTLD_DEFAULT, "TVMFFIErrorSetRaisedFromCStr");
  if (!set) {
    /* A host that loaded libtvm_ffi RTLD_LOCAL: find it by its soname. */
    void *lib = dlopen("libtvm_ffi.so", RTLD_NOLOAD | RTLD_LAZY);
    if (lib) {
      set = (set_raised_fn)dlsym(lib, "TVMFFIErrorSetRaisedFromCStr");
      dlclose(lib);
    }
  }
  if (set) set(rvm_error_kind()[0] ? rvm_error_kind() : "RuntimeError", rvm_error_message());
}

static int fail(void) {
  rvm_ffi_forward_error();
  return -1;
}

static rvm_vm *thread_vm(void) {
  pthread_once(&ffi_once, open_ffi_module);
  if (ffi_open_rc) {
    rvm_raise("RuntimeError", "%s", ffi_open_error);
    return NULL;
  }
  rvm_vm *vm = ffi_key_made ? pthread_getspecific(ffi_vm_key) : NULL;
  if (vm) return vm;
  DLDevice cpu = {kDLCPU, 0};
  if (rvm_vm_create_on(ffi_module, cpu, &vm)) return NULL;
  if (!ffi_key_made || pthread_setspecific(ffi_vm_key, vm) != 0) {
    rvm_vm_destroy(vm);
    rvm_raise("RuntimeError", "cannot keep a VM for this thread");
    return NULL;
  }
  return vm;
}

int rvm_ffi_call(int64_t function, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  rvm_error_clear();
  rvm_vm *vm = thread_vm();
  if (!vm) return fail();
  if (function < 0 || function >= ffi_module->num_relax_funcs) {
    rvm_raise("InternalError", "tvm-ffi entry for function %lld of %d", (long long)function, ffi_module->num_relax_funcs);
    return fail();
  }
  /* Tensors made elsewhere (numpy, torch) are passed as views, so that the call checks and,
   * where kernels could not use them as they are, copies them. */
  TVMFFIAny inline_args[16];
  TVMFFIAny *conv = num_args <= 16 ? inline_args : rvm_mem_alloc(sizeof(TVMFFIAny) * (size_t)num_args, "call arguments");
  if (!conv) {
    rvm_raise("MemoryError", "out of memory");
    return fail();
  }
  for (int32_t i = 0; i < num_args; i++) {
    conv[i] = args[i];
    if (args[i].type_index == kTVMFFITensor && !rvm_is_own_tensor(args[i].v_obj)) {
      conv[i].type_index = kTVMFFIDLTensorPtr;
      conv[i].v_ptr = rvm_tensor_of_object(args[i].v_obj);
    }
  }
  TVMFFIAny out = {0};
  int rc = rvm_vm_call_function(vm, ffi_module->relax_funcs[function], conv, num_args, &out);
  if (conv != inline_args) rvm_mem_free(conv);
  if (rc) return fail();
  if (out.type_index == RVM_TYPE_STORAGE) {
    rvm_any_release(&out);
    rvm_raise("TypeError", "a vm.Storage cannot be returned to a tvm-ffi caller");
    return fail();
  }
  *result = out;
  return 0;
}
