/*
 * api.c: the C API of rvm.h — modules, VMs, calls and values — and its one exported symbol.
 *
 * Opening a module turns the constant table in .rodata into values (tensors view their data in
 * place) and makes the function pool. A call wraps borrowed DLTensor inputs into Tensor objects,
 * as TVM's kernels and builtins expect, and runs the function.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static const char *api_last_error(void) { return rvm_error_message(); }
static const char *api_last_error_kind(void) { return rvm_error_kind(); }

static void module_free(rvm_module *m) {
  const rvm_program *p = m->program;
  if (m->consts)
    for (int64_t i = 0; i < p->num_consts; i++) rvm_any_release(&m->consts[i]);
  if (m->func_pool)
    for (int64_t i = 0; i < p->num_funcs; i++) rvm_any_release(&m->func_pool[i]);
  free(m->consts);
  free(m->func_pool);
  free(m->relax_funcs);
  free(m);
}

static void module_release(rvm_module *m) {
  if (atomic_fetch_sub_explicit(&m->refcount, 1, memory_order_acq_rel) == 1) module_free(m);
}

static int make_constant(const rvm_const_info *c, TVMFFIAny *out) {
  *out = rvm_none();
  switch (c->kind) {
    case kTVMFFITensor: {
      DLDevice cpu = {kDLCPU, 0};
      /* The data is used in place, in the library's writable (copy-on-write) .data: an in-place
       * kernel may write a constant, and the change persists for later calls, as in TVM. */
      rvm_tensor *t = rvm_tensor_new((void *)c->data, cpu, c->ndim, c->dtype, c->shape, 0, NULL);
      if (!t) return -1;
      *out = rvm_obj_any(t);
      return 0;
    }
    case kTVMFFIShape: {
      rvm_shape *s = rvm_shape_new(c->data, c->size);
      if (!s) return -1;
      *out = rvm_obj_any(s);
      return 0;
    }
    case kTVMFFIStr: {
      rvm_string *s = rvm_string_new(c->data, (uint64_t)c->size);
      if (!s) return -1;
      *out = rvm_obj_any(s);
      return 0;
    }
    case kTVMFFIInt:
      *out = rvm_int(c->size);
      return 0;
    case kTVMFFIFloat:
      out->type_index = kTVMFFIFloat;
      memcpy(&out->v_float64, &c->size, sizeof(double));
      return 0;
    case kTVMFFIDataType:
      out->type_index = kTVMFFIDataType;
      out->v_dtype = c->dtype;
      return 0;
    default:
      return rvm_raise("InternalError", "constant of unknown kind %d", c->kind);
  }
}

int rvm_module_open(rvm_module **out) {
  rvm_error_clear();
  if (!out) return rvm_raise("ValueError", "module_open: out is NULL");
  const rvm_program *p = &rvm_model_program;
  if (p->magic != RVM_PROGRAM_MAGIC)
    return rvm_raise("ValueError", "this library's program tables have the wrong magic number (not built by relaxc?)");
  if (p->abi_version != RVM_PROGRAM_VERSION)
    return rvm_raise("ValueError", "program tables have version %u, the runtime expects %u", p->abi_version, RVM_PROGRAM_VERSION);
  rvm_module *m = calloc(1, sizeof(*m));
  if (!m) return rvm_raise("MemoryError", "out of memory opening the module");
  /* The module outlives any one VM, so even when opened from a call its objects are libc's. */
  const rvm_allocator *previous = rvm_mem_enter(NULL);
  atomic_init(&m->refcount, 1);
  m->program = p;
  m->consts = calloc((size_t)p->num_consts + 1, sizeof(TVMFFIAny));
  m->func_pool = calloc((size_t)p->num_funcs + 1, sizeof(TVMFFIAny));
  m->relax_funcs = calloc((size_t)p->num_funcs + 1, sizeof(int32_t));
  if (!m->consts || !m->func_pool || !m->relax_funcs) {
    module_free(m);
    rvm_mem_leave(previous);
    return rvm_raise("MemoryError", "out of memory opening the module");
  }
  for (int64_t i = 0; i < p->num_consts; i++) {
    if (make_constant(&p->consts[i], &m->consts[i])) {
      module_free(m);
      rvm_mem_leave(previous);
      return -1;
    }
  }
  for (int64_t i = 0; i < p->num_funcs; i++) {
    const rvm_func_info *f = &p->funcs[i];
    void *obj;
    if (f->kind == RVM_FUNC_PACKED) {
      obj = rvm_function_new(f->packed);
    } else {
      obj = rvm_closure_new(p, i, 0);
      m->relax_funcs[m->num_relax_funcs++] = (int32_t)i;
    }
    if (!obj) {
      module_free(m);
      rvm_mem_leave(previous);
      return -1;
    }
    m->func_pool[i] = rvm_obj_any(obj);
  }
  rvm_mem_leave(previous);
  *out = m;
  return 0;
}

void rvm_module_close(rvm_module *m) {
  if (m) module_release(m);
}

static int api_module_info(const rvm_module *m, rvm_module_info *out) {
  rvm_error_clear();
  if (!m || !out) return rvm_raise("ValueError", "module_info: the module and out must not be NULL");
  const rvm_program *p = m->program;
  out->abi_version = RVM_ABI_VERSION;
  out->exec_mode = p->exec_mode & 0xffu;
  out->instrumented = (p->exec_mode & RVM_PROGRAM_INSTRUMENTED) != 0;
  out->compiler_version = p->compiler_version;
  out->target_triple = p->target_triple;
  out->executable_hash = p->executable_hash;
  out->num_functions = m->num_relax_funcs;
  return 0;
}

static const char *api_function_name(const rvm_module *m, int32_t index) {
  if (!m || index < 0 || index >= m->num_relax_funcs) return NULL;
  return m->program->funcs[m->relax_funcs[index]].name;
}

static int api_function_find(const rvm_module *m, const char *name, int32_t *out) {
  rvm_error_clear();
  if (!m || !name || !out) return rvm_raise("ValueError", "function_find: the module, name and out must not be NULL");
  for (int32_t i = 0; i < m->num_relax_funcs; i++) {
    if (strcmp(m->program->funcs[m->relax_funcs[i]].name, name) == 0) {
      *out = i;
      return 0;
    }
  }
  return rvm_raise("ValueError", "Unknown function: %s", name);
}

static int32_t api_function_arity(const rvm_module *m, int32_t index) {
  if (!m || index < 0 || index >= m->num_relax_funcs) return -1;
  return m->program->funcs[m->relax_funcs[index]].num_args;
}

static bool has_cuda_kernels(void) { return &rvm_model_cuda != NULL && rvm_model_cuda.num_kernels > 0; }


static int api_vm_create(rvm_module *m, rvm_vm **out) {
  if (!m || !out) return rvm_raise("ValueError", "vm_create: the module and out must not be NULL");
  DLDevice dev = {has_cuda_kernels() ? kDLCUDA : kDLCPU, 0};
  return rvm_vm_create_on(m, dev, out);
}

static int create_vm(rvm_module *m, DLDevice device, const rvm_allocator *heap, rvm_vm **out);

int rvm_vm_create_on(rvm_module *m, DLDevice device, rvm_vm **out) {
  rvm_error_clear();
  return create_vm(m, device, &rvm_libc_allocator, out);
}

static int api_vm_create_with_allocator(rvm_module *m, const rvm_allocator *allocator, rvm_vm **out) {
  rvm_error_clear();
  if (!allocator) return rvm_raise("ValueError", "vm_create_with_allocator: the allocator is NULL");
  if (!allocator->alloc || !allocator->free)
    return rvm_raise("ValueError", "vm_create_with_allocator: the allocator's alloc and free must not be NULL");
  if (!rvm_mem_ready()) return rvm_raise("RuntimeError", "vm_create_with_allocator: no thread-specific key is left for the allocator");
  DLDevice cpu = {kDLCPU, 0};
  return create_vm(m, cpu, allocator, out);
}

static int create_vm(rvm_module *m, DLDevice device, const rvm_allocator *heap, rvm_vm **out) {
  if (!m || !out) return rvm_raise("ValueError", "vm_create: the module and out must not be NULL");
  if (device.device_type == kDLCPU && has_cuda_kernels())
    return rvm_raise("ValueError", "this model's kernels run on CUDA: create its VM on a CUDA device");
  if (device.device_type == kDLCUDA && !has_cuda_kernels())
    return rvm_raise("ValueError", "this model has no CUDA kernels: run it on the CPU");
  if (device.device_type != kDLCPU && device.device_type != kDLCUDA)
    return rvm_raise("ValueError", "device type %d is not supported (cpu or cuda)", device.device_type);
  rvm_vm *vm = rvm_mem_alloc_in(heap, sizeof(*vm), 16, "a VM");
  if (!vm) return -1;
  memset(vm, 0, sizeof(*vm));
  vm->heap = heap;
  vm->allocator = rvm_pool_new(heap);
  if (!vm->allocator) {
    rvm_mem_free(vm);
    return -1;
  }
  atomic_fetch_add_explicit(&m->refcount, 1, memory_order_relaxed);
  vm->module = m;
  vm->program = m->program;
  vm->consts = m->consts;
  vm->func_pool = m->func_pool;
  if (device.device_type == kDLCUDA &&
      rvm_cuda_open(device.device_id, rvm_model_cuda.kernels, rvm_model_cuda.num_kernels, &vm->cuda)) {
    /* CUDA state is the C library's (rvm.h): only CPU VMs take a host allocator. */
    rvm_vm_destroy(vm);
    return -1;
  }
  *out = vm;
  return 0;
}

void rvm_vm_destroy(rvm_vm *vm) {
  if (!vm) return;
  rvm_frames_free(vm);
  rvm_cuda_close(vm->cuda);
  rvm_pool_release(vm->allocator);
  module_release(vm->module);
  rvm_mem_free(vm);
}

/* Wraps a borrowed DLTensor as a Tensor object; copies it when kernels could not use it as is.
 * For a VM on a CUDA device, host tensors are copied to the device. */
/* A tensor shaped like `t` over all of `s`; takes over the caller's reference to `s`. */
static int tensor_over_storage(rvm_storage *s, const DLTensor *t, TVMFFIAny *out) {
  rvm_tensor *w = rvm_tensor_new(s->data, s->device, t->ndim, t->dtype, t->shape, 0, &s->header);
  rvm_object_decref(&s->header);
  if (!w) return -1;
  *out = rvm_obj_any(w);
  return 0;
}

static int wrap_tensor(rvm_vm *vm, const DLTensor *t, int32_t index, TVMFFIAny *out) {
  if (!t) return rvm_raise("ValueError", "argument %d: NULL DLTensor pointer", index);
  if (vm && vm->cuda && t->device.device_type == kDLCUDA && t->device.device_id == rvm_cuda_device_id(vm->cuda)) {
    rvm_tensor *w = rvm_tensor_new((char *)t->data + t->byte_offset, t->device, t->ndim, t->dtype, t->shape, 0, NULL);
    if (!w) return -1;
    *out = rvm_obj_any(w);
    return 0;
  }
  if (t->device.device_type != kDLCPU)
    return rvm_raise("ValueError", "argument %d: tensor on device type %d, but this model runs on the CPU", index,
                     t->device.device_type);
  if (t->ndim < 0) return rvm_raise("ValueError", "argument %d: negative ndim %d", index, t->ndim);
  if (t->ndim > 0 && !t->shape) return rvm_raise("ValueError", "argument %d: DLTensor of ndim %d with a NULL shape", index, t->ndim);
  if (t->dtype.lanes == 0 || t->dtype.bits == 0)
    return rvm_raise("ValueError", "argument %d: invalid dtype (code %u, bits %u, lanes %u)", index, t->dtype.code, t->dtype.bits,
                     t->dtype.lanes);
  /* The label is formatted only for an error: snprintf on every call cost 9% of a short one. */
  int64_t nbytes = rvm_checked_nbytes(NULL, t->shape, t->ndim, t->dtype);
  if (nbytes < 0) {
    char what[32];
    snprintf(what, sizeof what, "argument %d", index);
    return (int)rvm_checked_nbytes(what, t->shape, t->ndim, t->dtype);
  }
  if (t->strides && nbytes > 0) { /* an empty tensor's strides are arbitrary (numpy's (0, 3) has 0s) */
    int64_t expect = 1;
    for (int32_t i = t->ndim - 1; i >= 0; i--) {
      if (t->shape[i] != 1 && t->strides[i] != expect)
        return rvm_raise("ValueError", "argument %d: tensor is not compact (strides[%d] = %lld, expected %lld)", index, i,
                         (long long)t->strides[i], (long long)expect);
      expect *= t->shape[i];
    }
  }
  char *data = (char *)t->data + t->byte_offset;
  if (!data && nbytes > 0) return rvm_raise("ValueError", "argument %d: tensor data pointer is NULL", index);
  if (vm && vm->cuda) {
    rvm_storage *s = rvm_storage_new_cuda(vm->cuda, (uint64_t)nbytes);
    if (!s) return -1;
    if (rvm_cuda_copy(vm->cuda, s->data, 1, data, 0, (uint64_t)nbytes)) {
      rvm_object_decref(&s->header);
      return -1;
    }
    return tensor_over_storage(s, t, out);
  }
  rvm_tensor *w;
  if (((uintptr_t)data % 64) == 0) {
    /* From the VM's object cache (the call has entered its pool), but with no home: nothing keeps
     * the pool alive for a wrapper that outlives the call, so only release_wrapper gives it back. */
    w = rvm_tensor_new_in(vm ? vm->allocator : NULL, data, t->device, t->ndim, t->dtype, t->shape, 0, NULL);
    if (w) w->home = NULL;
  } else {
    w = rvm_tensor_copy_aligned(t);
  }
  if (!w) return -1;
  *out = rvm_obj_any(w);
  return 0;
}

/* Releases the call's wrapper of a DLTensor argument (a tensor of wrap_tensor's): back to the VM's
 * object cache when the call holds the only reference and it views the caller's buffer (not a copy). */
static void release_wrapper(rvm_vm *vm, TVMFFIAny *v) {
  TVMFFIObject *obj = v->v_obj;
  if (rvm_object_sole_owner(obj) && !((rvm_tensor *)obj)->owner && rvm_pool_give_tensor(vm->allocator, (rvm_tensor *)obj)) {
    *v = rvm_none();
    return;
  }
  rvm_any_release(v);
}

/* The calling thread's identity, never 0 (pthread_self, not _Thread_local: TLS in a shared object
 * would make every model depend on the dynamic loader's __tls_get_addr). */
static uintptr_t thread_identity(void) { return (uintptr_t)pthread_self(); }

/* Claims vm for this thread; 0 on success, -1 (raised) if another thread is running a call. */
static int vm_enter(rvm_vm *vm) {
  uintptr_t self = thread_identity(), expected = 0;
  if (atomic_compare_exchange_strong_explicit(&vm->owner, &expected, self, memory_order_acquire, memory_order_relaxed))
    return 0;
  if (expected == self) {
    vm->owner_depth++;
    return 0;
  }
  return rvm_raise("RuntimeError", "this VM is running a call on another thread: a VM serves one thread at a time "
                                   "(create one VM per thread)");
}

static void vm_leave(rvm_vm *vm) {
  if (vm->owner_depth > 0)
    vm->owner_depth--;
  else
    atomic_store_explicit(&vm->owner, 0, memory_order_release);
}

/* Whether tensor object `obj` is, or views, one of the call's wrappers of the caller's buffers. */
static bool views_borrowed(const TVMFFIObject *obj, const TVMFFIAny *conv, const rvm_value *args, int32_t num_args) {
  for (; obj && obj->type_index == kTVMFFITensor; obj = ((const rvm_tensor *)obj)->owner)
    for (int32_t i = 0; i < num_args; i++)
      if (args[i].type_index == kTVMFFIDLTensorPtr && conv[i].v_obj == obj && !((const rvm_tensor *)obj)->owner) return true;
  return false;
}

/* The aliasing rule of rvm.h: a result never shares memory with a DLTensor argument. Results
 * that are (views of) an argument's buffer, which relaxc uses in place when it is 64-byte
 * aligned, are replaced by copies, as a misaligned argument (copied on entry) already is. */
static int detach_results(TVMFFIAny *v, const TVMFFIAny *conv, const rvm_value *args, int32_t num_args) {
  if (v->type_index == kTVMFFITensor && views_borrowed(v->v_obj, conv, args, num_args)) {
    rvm_tensor *copy = rvm_tensor_copy_aligned(rvm_tensor_of_object(v->v_obj));
    if (!copy) return -1;
    rvm_any_release(v);
    *v = rvm_obj_any(copy);
  } else if (v->type_index == kTVMFFIArray) {
    rvm_array *a = (rvm_array *)v->v_obj;
    for (int64_t i = 0; i < a->cell.size; i++)
      if (detach_results(&a->items[i], conv, args, num_args)) return -1;
  }
  return 0;
}

static int call_with(rvm_vm *vm, const TVMFFIAny *callee, int64_t func, const rvm_value *args, int32_t num_args,
                     rvm_value *result) {
  rvm_error_clear();
  if (!vm || !result) return rvm_raise("ValueError", "vm_call: the VM and the result slot must not be NULL");
  if (rvm_is_object(result)) return rvm_raise("ValueError", "the result slot must not hold an object on entry");
  if (num_args < 0 || (num_args > 0 && !args)) return rvm_raise("ValueError", "bad argument list");
  if (vm_enter(vm)) return -1;
  /* Everything the call allocates, from wrapping the arguments on, is the VM's allocator's. */
  const rvm_allocator *previous_heap = rvm_mem_enter(vm->heap);
  void *workspaces = rvm_workspace_mark();
  TVMFFIAny inline_args[16];
  TVMFFIAny *conv = num_args <= 16 ? inline_args : rvm_mem_alloc(sizeof(TVMFFIAny) * (size_t)num_args, "the argument list");
  if (!conv) {
    rvm_mem_leave(previous_heap);
    vm_leave(vm);
    return -1;
  }
  int rc = 0;
  int32_t wrapped = 0;
  uintptr_t previous = rvm_pool_enter(vm->allocator);
  for (; wrapped < num_args; wrapped++) {
    if (args[wrapped].type_index == kTVMFFIDLTensorPtr) {
      rc = wrap_tensor(vm, args[wrapped].v_ptr, wrapped, &conv[wrapped]);
      if (rc) break;
    } else {
      conv[wrapped] = args[wrapped];
    }
  }
  *result = rvm_none();
  rvm_vm *previous_vm = vm->cuda ? rvm_set_current_vm(vm) : NULL;
  /* Only a VM's outermost calls of its functions are timed and may run alone: a nested call
   * belongs to its caller's choice, and a closure has no function index to keep a choice by. */
  rvm_thread_call thread_call = {0};
  if (rc == 0 && !callee && vm->owner_depth == 0 && !vm->cuda)
    rvm_thread_choice_begin(&vm->thread_choices, func, vm->program->funcs[func].name, conv, num_args, &thread_call);
  if (rc == 0) rc = callee ? rvm_invoke_value(vm, callee, conv, num_args, result) : rvm_invoke(vm, func, conv, num_args, result);
  rvm_thread_choice_end(&thread_call, rc);
  if (vm->cuda) {
    if (rc == 0) rc = rvm_cuda_synchronize(vm->cuda);
    rvm_set_current_vm(previous_vm);
  }
  if (rc == 0 && wrapped > 0 && detach_results(result, conv, args, num_args)) {
    rvm_any_release(result);
    *result = rvm_none();
    rc = -1;
  }
  for (int32_t i = 0; i < wrapped; i++)
    if (args[i].type_index == kTVMFFIDLTensorPtr) release_wrapper(vm, &conv[i]);
  rvm_pool_leave(vm->allocator, previous);
  if (rc != 0) rvm_workspace_release_to(workspaces);
  if (conv != inline_args) rvm_mem_free(conv);
  rvm_mem_leave(previous_heap);
  vm_leave(vm);
  return rc;
}

int rvm_vm_call_function(rvm_vm *vm, int64_t func, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  return call_with(vm, NULL, func, args, num_args, result);
}

static int api_vm_call(rvm_vm *vm, int32_t function, const rvm_value *args, int32_t num_args, rvm_value *result) {
  rvm_error_clear();
  if (!vm) return rvm_raise("ValueError", "vm_call: the VM is NULL");
  if (function < 0 || function >= vm->module->num_relax_funcs)
    return rvm_raise("ValueError", "function index %d out of range (the model has %d functions)", function,
                     vm->module->num_relax_funcs);
  return call_with(vm, NULL, vm->module->relax_funcs[function], args, num_args, result);
}

static int api_vm_call_closure(rvm_vm *vm, const rvm_value *closure, const rvm_value *args, int32_t num_args,
                               rvm_value *result) {
  rvm_error_clear();
  if (!closure) return rvm_raise("ValueError", "vm_call_closure: the closure is NULL");
  return call_with(vm, closure, 0, args, num_args, result);
}

static void api_vm_stats(const rvm_vm *vm, rvm_vm_stats *out) {
  if (!out) return;
  if (!vm) {
    memset(out, 0, sizeof(*out));
    return;
  }
  rvm_pool_stats(vm->allocator, out);
}

static void api_vm_reset_stats(rvm_vm *vm) {
  if (vm) rvm_pool_reset_stats(vm->allocator);
}

static void api_value_release(rvm_value *v) {
  if (v) rvm_any_release(v);
}

static void api_value_retain(const rvm_value *v, rvm_value *out) {
  if (!out) return;
  if (!v) {
    *out = rvm_none();
    return;
  }
  *out = *v;
  if (rvm_is_object(v)) rvm_object_incref(v->v_obj);
}

static const char *api_value_type_name(const rvm_value *v) { return v ? rvm_type_name(v) : "NULL"; }

static int api_shape_new(const int64_t *dims, int64_t n, rvm_value *out) {
  rvm_error_clear();
  if (!out) return rvm_raise("ValueError", "shape_new: out is NULL");
  if (n < 0 || (n > 0 && !dims)) return rvm_raise("ValueError", "shape_new: %lld dims at %p", (long long)n, (const void *)dims);
  rvm_shape *s = rvm_shape_new(dims, n);
  if (!s) return -1;
  *out = rvm_obj_any(s);
  return 0;
}

static int api_shape_view(const rvm_value *v, const int64_t **dims, int64_t *n) {
  rvm_error_clear();
  if (!v || !dims || !n) return rvm_raise("ValueError", "shape_view: the value, dims and n must not be NULL");
  const TVMFFIShapeCell *s = rvm_as_shape(v);
  if (!s) return rvm_raise("TypeError", "expected a Shape, but got %s", rvm_type_name(v));
  *dims = s->data;
  *n = (int64_t)s->size;
  return 0;
}

static int api_tuple_new(const rvm_value *items, int64_t n, rvm_value *out) {
  rvm_error_clear();
  if (!out) return rvm_raise("ValueError", "tuple_new: out is NULL");
  if (n < 0 || (n > 0 && !items)) return rvm_raise("ValueError", "tuple_new: %lld items at %p", (long long)n, (const void *)items);
  rvm_array *a = rvm_array_new(n);
  if (!a) return -1;
  for (int64_t i = 0; i < n; i++) {
    if (items[i].type_index == kTVMFFIDLTensorPtr) {
      if (wrap_tensor(NULL, items[i].v_ptr, (int32_t)i, &a->items[i])) {
        rvm_object_decref(&a->header);
        return -1;
      }
    } else if (rvm_any_copy(&items[i], &a->items[i])) {
      rvm_object_decref(&a->header);
      return -1;
    }
  }
  *out = rvm_obj_any(a);
  return 0;
}

static int64_t api_tuple_size(const rvm_value *v) {
  if (!v || v->type_index != kTVMFFIArray) return -1;
  return ((const rvm_array *)v->v_obj)->cell.size;
}

static int api_tuple_get(const rvm_value *v, int64_t index, rvm_value *out) {
  rvm_error_clear();
  if (!v || !out) return rvm_raise("ValueError", "tuple_get: the value and out must not be NULL");
  if (v->type_index != kTVMFFIArray) return rvm_raise("TypeError", "expected a tuple, but got %s", rvm_type_name(v));
  const rvm_array *a = (const rvm_array *)v->v_obj;
  if (index < 0 || index >= a->cell.size)
    return rvm_raise("IndexError", "Index %lld out of bounds %lld", (long long)index, (long long)a->cell.size);
  *out = a->items[index];
  return 0;
}

static const DLTensor *api_tensor_view(const rvm_value *v) { return v ? rvm_as_dltensor(v) : NULL; }

static void dlpack_deleter(DLManagedTensorVersioned *self) {
  rvm_object_decref(self->manager_ctx);
  rvm_mem_free(self);
}

static int api_tensor_export(const rvm_value *v, DLManagedTensorVersioned **out) {
  rvm_error_clear();
  if (!v || !out) return rvm_raise("ValueError", "tensor_export: the value and out must not be NULL");
  if (v->type_index != kTVMFFITensor) return rvm_raise("TypeError", "expected a Tensor, but got %s", rvm_type_name(v));
  DLManagedTensorVersioned *m = rvm_mem_calloc(1, sizeof(*m), "a DLPack tensor");
  if (!m) return -1;
  m->version.major = DLPACK_MAJOR_VERSION;
  m->version.minor = DLPACK_MINOR_VERSION;
  m->manager_ctx = v->v_obj;
  m->deleter = dlpack_deleter;
  m->dl_tensor = *rvm_tensor_of_object(v->v_obj);
  rvm_object_incref(v->v_obj);
  *out = m;
  return 0;
}

/* The CUDA state behind a device tensor: its storage's. */
static rvm_cuda *cuda_of(TVMFFIObject *obj) {
  while (obj && obj->type_index == kTVMFFITensor) obj = ((rvm_tensor *)obj)->owner;
  return obj && obj->type_index == RVM_TYPE_STORAGE ? ((rvm_storage *)obj)->cuda : NULL;
}

static int api_tensor_to_host(const rvm_value *v, rvm_value *out) {
  rvm_error_clear();
  if (!v || !out) return rvm_raise("ValueError", "tensor_to_host: the value and out must not be NULL");
  DLTensor *t = rvm_as_dltensor(v);
  if (!t) return rvm_raise("TypeError", "expected a Tensor, but got %s", rvm_type_name(v));
  if (t->device.device_type == kDLCPU) {
    api_value_retain(v, out);
    return 0;
  }
  rvm_cuda *c = v->type_index == kTVMFFITensor ? cuda_of(v->v_obj) : NULL;
  if (!c) return rvm_raise("ValueError", "cannot copy a tensor from device type %d to the host", t->device.device_type);
  uint64_t nbytes = (uint64_t)rvm_tensor_nbytes(t);
  rvm_storage *s = rvm_storage_new_unpooled(nbytes);
  if (!s) return -1;
  if (rvm_tensor_read(t, c, s->data, nbytes)) {
    rvm_object_decref(&s->header);
    return -1;
  }
  return tensor_over_storage(s, t, out);
}

static int api_function_register(const char *name, TVMFFISafeCallType fn, void *self, void (*self_deleter)(void *),
                                 int override) {
  rvm_error_clear();
  return rvm_registry_register(name, fn, self, self_deleter, override);
}

static int api_function_get(const char *name, rvm_value *out) {
  rvm_error_clear();
  if (!name || !out) return rvm_raise("ValueError", "function_get: name and out must not be NULL");
  TVMFFIObject *f = rvm_registry_find(name);
  if (!f) return rvm_raise("ValueError", "Function %s is not registered in this library", name);
  rvm_object_incref(f);
  *out = rvm_obj_any(f);
  return 0;
}

static int api_function_call(const rvm_value *function, const rvm_value *args, int32_t num_args, rvm_value *result) {
  rvm_error_clear();
  if (!function || !result) return rvm_raise("ValueError", "function_call: function and result must not be NULL");
  if (function->type_index != kTVMFFIFunction)
    return rvm_raise("TypeError", "function_call expects a Function, but got %s", rvm_type_name(function));
  if (rvm_is_object(result)) return rvm_raise("ValueError", "the result slot must not hold an object on entry");
  if (num_args < 0 || (num_args > 0 && !args)) return rvm_raise("ValueError", "bad argument list");
  *result = rvm_none();
  void *workspaces = rvm_workspace_mark();
  int rc = rvm_invoke_value(NULL, function, args, num_args, result);
  if (rc != 0) rvm_workspace_release_to(workspaces);
  return rc;
}

static void api_error_set(const char *kind, const char *message) {
  TVMFFIErrorSetRaisedFromCStr(kind ? kind : "RuntimeError", message ? message : "");
}

static int api_vm_set_instrument(rvm_vm *vm, TVMFFISafeCallType hook, void *self) {
  rvm_error_clear();
  if (!vm) return rvm_raise("ValueError", "vm_set_instrument: the VM is NULL");
  if (hook && !(vm->program->exec_mode & RVM_PROGRAM_INSTRUMENTED))
    return rvm_raise("ValueError", "this model was built without --instrument: rebuild it with `relaxc compile --instrument` to set a hook");
  vm->instrument = hook;
  vm->instrument_self = hook ? self : NULL;
  return 0;
}

static const rvm_allocator *api_value_allocator(const rvm_value *v) {
  if (!v || !rvm_is_object(v)) return NULL;
  const rvm_allocator *a = rvm_object_allocator(v->v_obj);
  return a == &rvm_libc_allocator ? NULL : a;
}

static const rvm_api api_table = {
    .abi_version = RVM_ABI_VERSION,
    .struct_size = sizeof(rvm_api),
    .last_error = api_last_error,
    .last_error_kind = api_last_error_kind,
    .module_open = rvm_module_open,
    .module_close = rvm_module_close,
    .module_info = api_module_info,
    .function_name = api_function_name,
    .function_find = api_function_find,
    .function_arity = api_function_arity,
    .vm_create = api_vm_create,
    .vm_destroy = rvm_vm_destroy,
    .vm_call = api_vm_call,
    .vm_call_closure = api_vm_call_closure,
    .vm_stats = api_vm_stats,
    .vm_reset_stats = api_vm_reset_stats,
    .value_release = api_value_release,
    .value_retain = api_value_retain,
    .value_type_name = api_value_type_name,
    .shape_new = api_shape_new,
    .shape_view = api_shape_view,
    .tuple_new = api_tuple_new,
    .tuple_size = api_tuple_size,
    .tuple_get = api_tuple_get,
    .tensor_view = api_tensor_view,
    .tensor_export = api_tensor_export,
    .vm_create_on = rvm_vm_create_on,
    .tensor_to_host = api_tensor_to_host,
    .function_register = api_function_register,
    .function_get = api_function_get,
    .function_call = api_function_call,
    .error_set = api_error_set,
    .vm_set_instrument = api_vm_set_instrument,
    .vm_create_with_allocator = api_vm_create_with_allocator,
    .value_allocator = api_value_allocator,
    .weights_open = rvm_weights_open,
    .weights_arguments = rvm_weights_arguments,
    .weights_close = rvm_weights_close,
};

__attribute__((visibility("default"))) const rvm_api *rvm_get_api(uint32_t abi_version) {
  /* Versions only add entries at the end: an older host reads the same table. */
  return abi_version >= 1 && abi_version <= RVM_ABI_VERSION ? &api_table : NULL;
}
