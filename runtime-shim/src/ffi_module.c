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
#include <string.h>

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

/* ---- weights outside the model, for Python ------------------------------------------------ */

/* Weights loaded through relaxc_weights, by path, kept until the library is unloaded: the tensors
 * handed to Python view them, and loading a path again reuses its mappings. */
typedef struct loaded_weights {
  struct loaded_weights *next;
  rvm_weights *weights;
  char path[];
} loaded_weights;

static loaded_weights *ffi_weights;
static pthread_mutex_t ffi_weights_lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((destructor(102))) static void close_ffi_weights(void) {
  for (loaded_weights *l = ffi_weights; l;) {
    loaded_weights *next = l->next;
    rvm_weights_close(l->weights);
    free(l);
    l = next;
  }
  ffi_weights = NULL;
}

static rvm_weights *weights_at(const char *path) {
  pthread_mutex_lock(&ffi_weights_lock);
  loaded_weights *l = ffi_weights;
  while (l && strcmp(l->path, path) != 0) l = l->next;
  if (!l) {
    size_t len = strlen(path);
    rvm_weights *w = NULL;
    l = malloc(sizeof *l + len + 1);
    if (!l) {
      rvm_raise("MemoryError", "out of memory loading weights");
    } else if (rvm_weights_open(ffi_module, path, &w)) {
      free(l);
      l = NULL;
    } else {
      l->weights = w;
      memcpy(l->path, path, len + 1);
      l->next = ffi_weights;
      ffi_weights = l;
    }
  }
  pthread_mutex_unlock(&ffi_weights_lock);
  return l ? l->weights : NULL;
}

/* relaxc_weights(path, function, num_inputs) -> Array of Tensors: the weight arguments of
 * `function` (its parameters after the first num_inputs), from a tensor cache or safetensors
 * at `path`, memory-mapped once per path. From Python:
 *   m = tvm_ffi.load_module("m.so"); w = m["relaxc_weights"](path, "prefill", 2)
 *   m["prefill"](x, kv, *w) */
__attribute__((visibility("default"))) int __tvm_ffi_relaxc_weights(void *self, const TVMFFIAny *args, int32_t n,
                                                                    TVMFFIAny *result) {
  (void)self;
  rvm_error_clear();
  if (!thread_vm()) return fail();
  const char *path, *name;
  uint64_t path_len, name_len;
  if (n != 3 || !rvm_as_string(&args[0], &path, &path_len) || !rvm_as_string(&args[1], &name, &name_len) ||
      args[2].type_index != kTVMFFIInt) {
    rvm_raise("TypeError", "relaxc_weights(path: str, function: str, num_inputs: int)");
    return fail();
  }
  char path_z[4096], name_z[512];
  if (path_len >= sizeof path_z || name_len >= sizeof name_z) {
    rvm_raise("ValueError", "relaxc_weights: the path or the function name is too long");
    return fail();
  }
  memcpy(path_z, path, path_len);
  path_z[path_len] = 0;
  memcpy(name_z, name, name_len);
  name_z[name_len] = 0;
  int32_t function = -1;
  for (int32_t i = 0; i < ffi_module->num_relax_funcs; i++)
    if (strcmp(ffi_module->program->funcs[ffi_module->relax_funcs[i]].name, name_z) == 0) function = i;
  if (function < 0) {
    rvm_raise("ValueError", "the model has no function %s", name_z);
    return fail();
  }
  rvm_weights *w = weights_at(path_z);
  if (!w) return fail();
  int32_t count = 0;
  rvm_weights_arguments(w, function, (int32_t)args[2].v_int64, NULL, 0, &count);
  rvm_value *values = rvm_mem_calloc((size_t)count + 1, sizeof(rvm_value), "weight arguments");
  rvm_array *out = values ? rvm_array_new(count) : NULL;
  int rc = out ? rvm_weights_arguments(w, function, (int32_t)args[2].v_int64, values, count, &count) : -1;
  for (int32_t i = 0; rc == 0 && i < count; i++) {
    /* Borrowed DLTensors become tensor objects over the same bytes; objects (GGUF's matrices,
     * the packed tuple) are shared as they are. */
    if (values[i].type_index != kTVMFFIDLTensorPtr) {
      rc = rvm_any_copy(&values[i], &out->items[i]);
      continue;
    }
    const DLTensor *t = values[i].v_ptr;
    rvm_tensor *view = rvm_tensor_new(t->data, t->device, t->ndim, t->dtype, t->shape, 0, NULL);
    if (!view) rc = -1;
    else out->items[i] = rvm_obj_any(view);
  }
  rvm_mem_free(values);
  if (rc) {
    if (out) rvm_object_decref(&out->header);
    return fail();
  }
  *result = rvm_obj_any(out);
  return 0;
}

/* relaxc_call(name, args...) -> the result of the library's runtime function `name` (the KV
 * cache's vm.builtin.kv_state_*, vm.builtin.reshape, ...; what rvm.h's function_get finds), so
 * that Python drives an LLM's cache as a C host does:
 *   call = m["relaxc_call"]; call("vm.builtin.kv_state_add_sequence", kv, 0) */
__attribute__((visibility("default"))) int __tvm_ffi_relaxc_call(void *self, const TVMFFIAny *args, int32_t n,
                                                                 TVMFFIAny *result) {
  (void)self;
  rvm_error_clear();
  if (!thread_vm()) return fail();
  const char *name;
  uint64_t len;
  char name_z[256];
  if (n < 1 || !rvm_as_string(&args[0], &name, &len) || len >= sizeof name_z) {
    rvm_raise("TypeError", "relaxc_call(name: str, *args): the first argument names a runtime function");
    return fail();
  }
  memcpy(name_z, name, len);
  name_z[len] = 0;
  TVMFFIObject *f = rvm_registry_find(name_z);
  if (!f) {
    rvm_raise("ValueError", "Function %s is not registered in this library", name_z);
    return fail();
  }
  TVMFFIAny callee = rvm_obj_any(f), out = {0};
  if (rvm_invoke_value(NULL, &callee, args + 1, n - 1, &out)) return fail();
  *result = out;
  return 0;
}
