/*
 * builtins.c: the vm.builtin.* functions bytecode and compiled code call, with TVM 0.27's
 * semantics (apache/tvm src/runtime/vm/builtin.cc) and, where TVM checks them, its error
 * texts, so a model fails here with the message it fails with in TVM.
 *
 * Every builtin has the TVM-FFI safe-call signature: borrowed arguments, an owned result, 0 or -1.
 * Argument counts and kinds come from relaxc's own lowering or from TVM's, so they are checked
 * cheaply; values that come from the user (tensors, shapes, conditions) are checked fully.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- argument helpers ------------------------------------------------------------------- */

static int need_args(const char *builtin, int32_t got, int32_t min, int32_t max) {
  if (got >= min && got <= max) return 0;
  if (min == max) return rvm_raise("TypeError", "%s expects %d arguments, but got %d", builtin, min, got);
  return rvm_raise("TypeError", "%s expects %d to %d arguments, but got %d", builtin, min, max, got);
}

static int arg_int(const char *builtin, const TVMFFIAny *args, int32_t i, int64_t *out) {
  if (args[i].type_index == kTVMFFIInt || args[i].type_index == kTVMFFIBool) {
    *out = args[i].v_int64;
    return 0;
  }
  return rvm_raise("TypeError", "%s: argument %d must be an int, but got %s", builtin, i, rvm_type_name(&args[i]));
}

/* The error-context string argument, as a NUL-terminated string (TVM's ends with a space). */
static const char *arg_ctx(const TVMFFIAny *args, int32_t i, char *buf, size_t cap) {
  const char *data;
  uint64_t size;
  if (!rvm_as_string(&args[i], &data, &size)) return "";
  /* TVM-FFI strings keep a NUL after their bytes (raw, small and object strings alike), so the
   * common case costs nothing on the success path; the copy is for anything that does not. */
  if (data[size] == '\0' && size < cap) return data;
  if (size >= cap) size = cap - 1;
  memcpy(buf, data, size);
  buf[size] = 0;
  return buf;
}

static rvm_vm *arg_vm(const TVMFFIAny *args, int32_t i) {
  return args[i].type_index == kTVMFFIOpaquePtr ? (rvm_vm *)args[i].v_ptr : NULL;
}

/* The shape heap: an int64 tensor. Slots come from the executable, so they are bounds-checked
 * here (one compare) rather than trusted. */
typedef struct {
  int64_t *data;
  int64_t size;
} shape_heap;

static shape_heap heap_of(const TVMFFIAny *heap) {
  shape_heap h = {NULL, 0};
  DLTensor *t = rvm_as_dltensor(heap);
  if (t && t->ndim == 1 && t->dtype.code == kDLInt && t->dtype.bits == 64) {
    h.data = (int64_t *)((char *)t->data + t->byte_offset);
    h.size = t->shape[0];
  }
  return h;
}

static int heap_slot(const char *builtin, shape_heap h, int64_t slot) {
  if (!h.data) return rvm_raise("InternalError", "%s: no shape heap", builtin);
  if (slot < 0 || slot >= h.size)
    return rvm_raise("InternalError", "%s: shape heap slot %lld is out of range (heap has %lld)", builtin, (long long)slot,
                     (long long)h.size);
  return 0;
}

static bool dtype_eq(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

/* ---- checks ------------------------------------------------------------------------------ */

int rvm_builtin_check_tensor_info(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self, (void)result;
  if (need_args("vm.builtin.check_tensor_info", n, 3, 4)) return -1;
  char buf[1024];
  const char *ctx = arg_ctx(args, n - 1, buf, sizeof buf);
  int64_t ndim = 0;
  if (arg_int("vm.builtin.check_tensor_info", args, 1, &ndim)) return -1;
  DLTensor *t = rvm_as_dltensor(&args[0]);
  if (!t) return rvm_raise("TypeError", "%s expect a Tensor but get %s", ctx, rvm_type_name(&args[0]));
  if (ndim != -1 && t->ndim != ndim)
    return rvm_raise("ValueError", "%s expect Tensor with ndim %lld but get %d", ctx, (long long)ndim, t->ndim);
  if (n == 4 && args[2].type_index == kTVMFFIDataType && !dtype_eq(t->dtype, args[2].v_dtype)) {
    char want[32], got[32];
    rvm_format_dtype(args[2].v_dtype, want, sizeof want);
    rvm_format_dtype(t->dtype, got, sizeof got);
    return rvm_raise("ValueError", "%s expect Tensor with dtype %s but get %s", ctx, want, got);
  }
  return 0;
}

int rvm_builtin_check_shape_info(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self, (void)result;
  if (need_args("vm.builtin.check_shape_info", n, 3, 3)) return -1;
  char buf[1024];
  const char *ctx = arg_ctx(args, 2, buf, sizeof buf);
  int64_t ndim = 0;
  if (arg_int("vm.builtin.check_shape_info", args, 1, &ndim)) return -1;
  const TVMFFIShapeCell *s = rvm_as_shape(&args[0]);
  if (!s) return rvm_raise("TypeError", "%s expect a Shape but get %s", ctx, rvm_type_name(&args[0]));
  if (ndim != -1 && (int64_t)s->size != ndim)
    return rvm_raise("ValueError", "%s expect Shape with ndim %lld but get %llu", ctx, (long long)ndim,
                     (unsigned long long)s->size);
  return 0;
}

int rvm_builtin_check_prim_value_info(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self, (void)result;
  if (need_args("vm.builtin.check_prim_value_info", n, 3, 3)) return -1;
  char buf[1024];
  const char *ctx = arg_ctx(args, 2, buf, sizeof buf);
  const TVMFFIAny *v = &args[0];
  if (args[1].type_index != kTVMFFIDataType) return 0; /* any scalar */
  DLDataType dt = args[1].v_dtype;
  char name[32];
  rvm_format_dtype(dt, name, sizeof name);
  if (rvm_is_object(v))
    return rvm_raise("TypeError", "%s, expected dtype %s, but received ObjectRef of type %s", ctx, name, rvm_type_name(v));
  bool ok;
  const char *want;
  switch (dt.code) {
    case kDLBool:
    case kDLInt:
    case kDLUInt:
      ok = v->type_index == kTVMFFIInt || v->type_index == kTVMFFIBool;
      want = dt.code == kDLBool ? "bool" : "int";
      break;
    case kDLFloat:
      ok = v->type_index == kTVMFFIInt || v->type_index == kTVMFFIBool || v->type_index == kTVMFFIFloat;
      want = "float";
      break;
    case kDLOpaqueHandle:
      ok = v->type_index == kTVMFFIOpaquePtr || v->type_index == kTVMFFINone;
      want = "void*";
      break;
    default:
      return rvm_raise("TypeError", "%s, unsupported dtype %s", ctx, name);
  }
  if (!ok) return rvm_raise("TypeError", "Cannot convert from type `%s` to `%s`", rvm_type_name(v), want);
  return 0;
}

int rvm_builtin_check_tuple_info(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self, (void)result;
  if (need_args("vm.builtin.check_tuple_info", n, 3, 3)) return -1;
  char buf[1024];
  const char *ctx = arg_ctx(args, 2, buf, sizeof buf);
  int64_t size = 0;
  if (arg_int("vm.builtin.check_tuple_info", args, 1, &size)) return -1;
  if (args[0].type_index != kTVMFFIArray)
    return rvm_raise("TypeError", "%s expect a Tuple but get %s", ctx, rvm_type_name(&args[0]));
  rvm_array *a = (rvm_array *)args[0].v_obj;
  if (a->cell.size != size)
    return rvm_raise("ValueError", "%s expect a Tuple with %lld elements,  but get a Tuple with %lld elements.", ctx,
                     (long long)size, (long long)a->cell.size);
  return 0;
}

int rvm_builtin_check_func_info(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self, (void)result;
  if (need_args("vm.builtin.check_func_info", n, 2, 2)) return -1;
  char buf[1024];
  const char *ctx = arg_ctx(args, 1, buf, sizeof buf);
  if (args[0].type_index != kTVMFFIFunction && args[0].type_index != rvm_type_closure)
    return rvm_raise("TypeError", "%s expect a Function but get %s", ctx, rvm_type_name(&args[0]));
  return 0;
}

int rvm_builtin_check_string_info(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self, (void)result;
  if (need_args("vm.builtin.check_string_info", n, 2, 2)) return -1;
  char buf[1024];
  const char *ctx = arg_ctx(args, 1, buf, sizeof buf);
  const char *data;
  uint64_t size;
  if (!rvm_as_string(&args[0], &data, &size)) return rvm_raise("TypeError", "%s expect a string", ctx);
  return 0;
}

/* ---- shapes -------------------------------------------------------------------------------- */

enum { MATCH_ASSERT_IMM = 0, MATCH_STORE = 1, MATCH_NOOP = 2, MATCH_ASSERT_LOAD = 3 };

int rvm_builtin_match_shape(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self, (void)result;
  if (n < 4) return need_args("vm.builtin.match_shape", n, 4, 4);
  int64_t ndim = 0;
  if (arg_int("vm.builtin.match_shape", args, 2, &ndim)) return -1;
  if (ndim < 0 || n != 4 + 2 * ndim)
    return rvm_raise("TypeError", "vm.builtin.match_shape: %d arguments do not fit %lld dims", n, (long long)ndim);
  char buf[1024];
  const char *ctx = arg_ctx(args, n - 1, buf, sizeof buf);
  const int64_t *dims;
  int64_t size = 0;
  DLTensor *t = rvm_as_dltensor(&args[0]);
  const TVMFFIShapeCell *s = rvm_as_shape(&args[0]);
  if (t) {
    dims = t->shape;
    size = t->ndim;
  } else if (s) {
    dims = s->data;
    size = (int64_t)s->size;
  } else {
    return rvm_raise("TypeError", "%s match_cast expects a Tensor or Shape, but get %s", ctx, rvm_type_name(&args[0]));
  }
  if (size != ndim)
    return rvm_raise("RuntimeError", "Check failed: input_shape.size() == size (%lld vs. %lld) : %s match_cast shape size mismatch.",
                     (long long)size, (long long)ndim, ctx);
  shape_heap heap = heap_of(&args[1]);
  for (int64_t i = 0; i < ndim; i++) {
    int64_t code = args[3 + 2 * i].v_int64, reg = args[4 + 2 * i].v_int64;
    switch (code) {
      case MATCH_ASSERT_IMM:
        if (dims[i] != reg)
          return rvm_raise("RuntimeError",
                           "Check failed: input_shape[i] == reg (%lld vs. %lld) : %s match_cast error,  shape[%lld] mismatch to specified constant.",
                           (long long)dims[i], (long long)reg, ctx, (long long)i);
        break;
      case MATCH_STORE:
        if (heap_slot("vm.builtin.match_shape", heap, reg)) return -1;
        heap.data[reg] = dims[i];
        break;
      case MATCH_NOOP:
        break;
      case MATCH_ASSERT_LOAD:
        if (heap_slot("vm.builtin.match_shape", heap, reg)) return -1;
        if (dims[i] != heap.data[reg])
          return rvm_raise("RuntimeError",
                           "Check failed: input_shape[i] == heap_data[reg] (%lld vs. %lld) : %s match_cast error,  shape[%lld] mismatch to a previous populated value.",
                           (long long)dims[i], (long long)heap.data[reg], ctx, (long long)i);
        break;
      default:
        return rvm_raise("InternalError", "Unknown match shape code: %lld", (long long)code);
    }
  }
  return 0;
}

int rvm_builtin_match_prim_value(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self, (void)result;
  if (need_args("vm.builtin.match_prim_value", n, 5, 5)) return -1;
  char buf[1024];
  const char *ctx = arg_ctx(args, 4, buf, sizeof buf);
  int64_t value = 0, code = 0, reg = 0;
  if (arg_int("vm.builtin.match_prim_value", args, 0, &value) || arg_int("vm.builtin.match_prim_value", args, 2, &code) ||
      arg_int("vm.builtin.match_prim_value", args, 3, &reg))
    return -1;
  shape_heap heap = heap_of(&args[1]);
  switch (code) {
    case MATCH_ASSERT_IMM:
      if (value != reg)
        return rvm_raise("RuntimeError", "Check failed: input_shape == reg (%lld vs. %lld) : %s match_cast error,  PrimExpr mismatch to specified constant.",
                         (long long)value, (long long)reg, ctx);
      return 0;
    case MATCH_STORE:
      if (heap_slot("vm.builtin.match_prim_value", heap, reg)) return -1;
      heap.data[reg] = value;
      return 0;
    case MATCH_NOOP:
      return 0;
    case MATCH_ASSERT_LOAD:
      if (heap_slot("vm.builtin.match_prim_value", heap, reg)) return -1;
      if (value != heap.data[reg])
        return rvm_raise("RuntimeError",
                         "Check failed: input_shape == heap_data[reg] (%lld vs. %lld) : %s match_cast error,  PrimExpr mismatch to a previous populated value.",
                         (long long)value, (long long)heap.data[reg], ctx);
      return 0;
    default:
      return rvm_raise("InternalError", "Unknown match shape code: %lld", (long long)code);
  }
}

static int shape_value(const char *builtin, shape_heap heap, int64_t code, int64_t reg, int64_t *out) {
  if (code == 0) {
    *out = reg;
    return 0;
  }
  if (code == 1) {
    if (heap_slot(builtin, heap, reg)) return -1;
    *out = heap.data[reg];
    return 0;
  }
  return rvm_raise("InternalError", "Invalid shape code: %lld", (long long)code);
}

int rvm_builtin_make_shape(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self;
  if (n < 2) return need_args("vm.builtin.make_shape", n, 2, 2);
  int64_t ndim = 0;
  if (arg_int("vm.builtin.make_shape", args, 1, &ndim)) return -1;
  if (ndim < 0 || n != 2 + 2 * ndim)
    return rvm_raise("TypeError", "vm.builtin.make_shape: %d arguments do not fit %lld dims", n, (long long)ndim);
  shape_heap heap = heap_of(&args[0]);
  int64_t stack_dims[16];
  int64_t *dims = ndim <= 16 ? stack_dims : rvm_mem_alloc(sizeof(int64_t) * (size_t)ndim, "builtin scratch");
  if (!dims) return rvm_raise("MemoryError", "out of memory");
  for (int64_t i = 0; i < ndim; i++) {
    if (shape_value("vm.builtin.make_shape", heap, args[2 + 2 * i].v_int64, args[3 + 2 * i].v_int64, &dims[i])) {
      if (dims != stack_dims) rvm_mem_free(dims);
      return -1;
    }
  }
  rvm_shape *s = rvm_shape_new(dims, ndim);
  if (dims != stack_dims) rvm_mem_free(dims);
  if (!s) return -1;
  *result = rvm_obj_any(s);
  return 0;
}

int rvm_builtin_make_prim_value(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self;
  if (need_args("vm.builtin.make_prim_value", n, 3, 3)) return -1;
  int64_t value = 0;
  if (shape_value("vm.builtin.make_prim_value", heap_of(&args[0]), args[1].v_int64, args[2].v_int64, &value)) return -1;
  *result = rvm_int(value);
  return 0;
}

int rvm_builtin_alloc_shape_heap(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self;
  if (need_args("vm.builtin.alloc_shape_heap", n, 2, 2)) return -1;
  rvm_vm *vm = arg_vm(args, 0);
  int64_t size = 0;
  if (!vm) return rvm_raise("TypeError", "vm.builtin.alloc_shape_heap: argument 0 must be the VM");
  if (arg_int("vm.builtin.alloc_shape_heap", args, 1, &size)) return -1;
  rvm_storage *s = rvm_storage_new(vm->allocator, (uint64_t)size * sizeof(int64_t));
  if (!s) return -1;
  memset(s->data, 0, (size_t)size * sizeof(int64_t));
  DLDataType i64 = {kDLInt, 64, 1};
  rvm_tensor *t = rvm_tensor_new(s->data, s->device, 1, i64, &size, 0, &s->header);
  rvm_object_decref(&s->header);
  if (!t) return -1;
  *result = rvm_obj_any(t);
  return 0;
}

int rvm_builtin_shape_of(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self;
  if (need_args("vm.builtin.shape_of", n, 1, 1)) return -1;
  DLTensor *t = rvm_as_dltensor(&args[0]);
  if (!t) return rvm_raise("TypeError", "vm.builtin.shape_of expects a Tensor or DLTensor*, but get %s", rvm_type_name(&args[0]));
  rvm_shape *s = rvm_shape_new(t->shape, t->ndim);
  if (!s) return -1;
  *result = rvm_obj_any(s);
  return 0;
}

int rvm_builtin_tensor_to_shape(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self;
  if (need_args("vm.builtin.tensor_to_shape", n, 1, 1)) return -1;
  DLTensor *t = rvm_as_dltensor(&args[0]);
  if (!t) return rvm_raise("TypeError", "vm.builtin.tensor_to_shape expects a Tensor, but get %s", rvm_type_name(&args[0]));
  if (t->ndim != 1) return rvm_raise("ValueError", "vm.builtin.tensor_to_shape expects a 1-D tensor, but got %d dims", t->ndim);
  if (t->dtype.code != kDLInt || (t->dtype.bits != 16 && t->dtype.bits != 32 && t->dtype.bits != 64) || t->dtype.lanes != 1) {
    char name[32];
    rvm_format_dtype(t->dtype, name, sizeof name);
    return rvm_raise("ValueError", "Unknown scalar int type: %s", name);
  }
  int64_t len = t->shape[0];
  int64_t *dims = rvm_mem_alloc(sizeof(int64_t) * (size_t)(len > 0 ? len : 1), "builtin scratch");
  if (!dims) return rvm_raise("MemoryError", "out of memory");
  const char *base = (const char *)t->data + t->byte_offset;
  int64_t stride = t->strides ? t->strides[0] : 1;
  for (int64_t i = 0; i < len; i++) {
    const char *p = base + i * stride * (t->dtype.bits / 8);
    switch (t->dtype.bits) {
      case 16: { int16_t v; memcpy(&v, p, 2); dims[i] = v; break; }
      case 32: { int32_t v; memcpy(&v, p, 4); dims[i] = v; break; }
      default: { int64_t v; memcpy(&v, p, 8); dims[i] = v; break; }
    }
  }
  rvm_shape *s = rvm_shape_new(dims, len);
  rvm_mem_free(dims);
  if (!s) return -1;
  *result = rvm_obj_any(s);
  return 0;
}

/* ---- memory -------------------------------------------------------------------------------- */

int rvm_builtin_alloc_storage(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self;
  if (need_args("vm.builtin.alloc_storage", n, 5, 5)) return -1;
  rvm_vm *vm = arg_vm(args, 0);
  if (!vm) return rvm_raise("TypeError", "vm.builtin.alloc_storage: argument 0 must be the VM");
  const TVMFFIShapeCell *size = rvm_as_shape(&args[1]);
  if (!size) return rvm_raise("TypeError", "vm.builtin.alloc_storage: the size must be a Shape, but got %s", rvm_type_name(&args[1]));
  int64_t device_index = 0;
  if (arg_int("vm.builtin.alloc_storage", args, 2, &device_index)) return -1;
  if (device_index != 0)
    return rvm_raise("ValueError", "vm.builtin.alloc_storage: device index %lld is out of the VM's device list (1 device: cpu)",
                     (long long)device_index);
  if (size->size == 1 && size->data[0] < 0)
    return rvm_raise("ValueError", "vm.builtin.alloc_storage: negative size %lld bytes (the shape arithmetic overflowed?)",
                     (long long)size->data[0]);
  int64_t nbytes = rvm_checked_nbytes("vm.builtin.alloc_storage", size->data, (int64_t)size->size, (DLDataType){kDLUInt, 8, 1});
  if (nbytes < 0) return -1;
  /* Device 0 is the VM's device: its CUDA device when it has one, else the CPU. */
  rvm_storage *s = vm->cuda ? rvm_storage_new_cuda(vm->cuda, (uint64_t)nbytes) : rvm_storage_new(vm->allocator, (uint64_t)nbytes);
  if (!s) return -1;
  *result = rvm_obj_any(s);
  return 0;
}

static int check_alloc_dtype(DLDataType dt) {
  bool pow2 = dt.bits && (dt.bits & (dt.bits - 1)) == 0;
  if (dt.lanes < 1 || !(dt.bits % 8 == 0 || (dt.code == kDLUInt && dt.bits == 1) || dt.code == kDLBool) || !pow2) {
    char name[32];
    rvm_format_dtype(dt, name, sizeof name);
    return rvm_raise("ValueError", "vm.builtin.alloc_tensor: unsupported dtype %s", name);
  }
  return 0;
}

int rvm_builtin_alloc_tensor(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self;
  if (need_args("vm.builtin.alloc_tensor", n, 4, 5)) return -1;
  if (args[0].type_index != RVM_TYPE_STORAGE)
    return rvm_raise("TypeError", "vm.builtin.alloc_tensor: argument 0 must be a Storage, but got %s", rvm_type_name(&args[0]));
  rvm_storage *s = (rvm_storage *)args[0].v_obj;
  int64_t offset = 0;
  if (arg_int("vm.builtin.alloc_tensor", args, 1, &offset)) return -1;
  const TVMFFIShapeCell *shape = rvm_as_shape(&args[2]);
  if (!shape) return rvm_raise("TypeError", "vm.builtin.alloc_tensor: the shape must be a Shape, but got %s", rvm_type_name(&args[2]));
  if (args[3].type_index != kTVMFFIDataType)
    return rvm_raise("TypeError", "vm.builtin.alloc_tensor: the dtype must be a DataType, but got %s", rvm_type_name(&args[3]));
  DLDataType dt = args[3].v_dtype;
  if (check_alloc_dtype(dt)) return -1;
  int64_t nbytes = rvm_checked_nbytes("vm.builtin.alloc_tensor", shape->data, (int64_t)shape->size, dt);
  if (nbytes < 0) return -1;
  if (offset < 0 || (uint64_t)offset > s->nbytes || (uint64_t)nbytes > s->nbytes - (uint64_t)offset)
    return rvm_raise("RuntimeError", "storage allocation failure, attempted to allocate %lld at offset %lld in region that is %llubytes",
                     (long long)nbytes, (long long)offset, (unsigned long long)s->nbytes);
  rvm_tensor *t = rvm_tensor_new_in(s->allocator, s->data, s->device, (int32_t)shape->size, dt, shape->data, (uint64_t)offset,
                                    &s->header);
  if (!t) return -1;
  *result = rvm_obj_any(t);
  return 0;
}

int rvm_alloc_tensor_into(TVMFFIAny *dst, const TVMFFIAny *storage, int64_t offset, const TVMFFIAny *shape,
                          const TVMFFIAny *dtype) {
  TVMFFIAny args[4] = {*storage, rvm_int(offset), *shape, *dtype}, ret = {0};
  if (rvm_builtin_alloc_tensor(NULL, args, 4, &ret) != 0) return -1;
  rvm_any_release(dst);
  *dst = ret;
  return 0;
}

int rvm_shape_division_by_zero(int64_t slot) {
  return rvm_raise("ValueError", "shape arithmetic divides by zero (computing shape heap slot %lld)", (long long)slot);
}

int rvm_builtin_null_value(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self, (void)args, (void)n;
  *result = rvm_none();
  return 0;
}

int rvm_builtin_copy(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self;
  if (need_args("vm.builtin.copy", n, 1, 1)) return -1;
  return rvm_any_copy(&args[0], result);
}

int rvm_builtin_ensure_zero_offset(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self;
  if (need_args("vm.builtin.ensure_zero_offset", n, 1, 1)) return -1;
  DLTensor *t = rvm_as_dltensor(&args[0]);
  if (!t) return rvm_raise("TypeError", "vm.builtin.ensure_zero_offset expects a Tensor, but get %s", rvm_type_name(&args[0]));
  if (t->byte_offset == 0) return rvm_any_copy(&args[0], result);
  TVMFFIObject *owner = args[0].type_index == kTVMFFITensor ? args[0].v_obj : NULL;
  char *data = (char *)t->data + t->byte_offset;
  if (((uintptr_t)data % 64) == 0) {
    rvm_tensor *v = rvm_tensor_new(data, t->device, t->ndim, t->dtype, t->shape, 0, owner);
    if (!v) return -1;
    *result = rvm_obj_any(v);
    return 0;
  }
  /* Misaligned: TVM kernels assume 64-byte alignment, so copy into fresh memory. */
  rvm_tensor *v = rvm_tensor_copy_aligned(t);
  if (!v) return -1;
  *result = rvm_obj_any(v);
  return 0;
}

int rvm_builtin_reshape(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self;
  if (need_args("vm.builtin.reshape", n, 2, 2)) return -1;
  DLTensor *t = rvm_as_dltensor(&args[0]);
  if (!t) return rvm_raise("TypeError", "vm.builtin.reshape expects a Tensor or DLTensor*, but get %s", rvm_type_name(&args[0]));
  const TVMFFIShapeCell *shape = rvm_as_shape(&args[1]);
  if (!shape) return rvm_raise("TypeError", "vm.builtin.reshape: the new shape must be a Shape, but got %s", rvm_type_name(&args[1]));
  int64_t view = rvm_checked_nbytes("vm.builtin.reshape", shape->data, (int64_t)shape->size, t->dtype);
  if (view < 0) return -1;
  int64_t have = rvm_tensor_nbytes(t);
  if (view > have) {
    char dt[32], shp[256], old[256];
    rvm_format_dtype(t->dtype, dt, sizeof dt);
    rvm_format_shape(shape->data, (int64_t)shape->size, shp, sizeof shp);
    rvm_format_shape(t->shape, t->ndim, old, sizeof old);
    return rvm_raise("ValueError",
                     "View with shape %s and datatype %s would have a size of %lld bytes.  This would occupy bytes 0 <= i_byte < %lld "
                     "within the backing array.  However, the Tensor being viewed only contains %lld bytes (shape = %s, dtype= %s).",
                     shp, dt, (long long)view, (long long)view, (long long)have, old, dt);
  }
  TVMFFIObject *owner = args[0].type_index == kTVMFFITensor ? args[0].v_obj : NULL;
  rvm_tensor *v = rvm_tensor_new(t->data, t->device, (int32_t)shape->size, t->dtype, shape->data, t->byte_offset, owner);
  if (!v) return -1;
  *result = rvm_obj_any(v);
  return 0;
}

/* ---- tuples -------------------------------------------------------------------------------- */

int rvm_builtin_make_tuple(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self;
  rvm_array *a = rvm_array_new(n);
  if (!a) return -1;
  for (int32_t i = 0; i < n; i++) {
    if (rvm_any_copy(&args[i], &a->items[i])) {
      rvm_object_decref(&a->header);
      return -1;
    }
  }
  *result = rvm_obj_any(a);
  return 0;
}

static int tuple_index(const char *builtin, const TVMFFIAny *args, int32_t n, rvm_array **arr, int64_t *index) {
  if (need_args(builtin, n, 2, 2)) return -1;
  if (args[0].type_index != kTVMFFIArray)
    return rvm_raise("TypeError", "%s expects a tuple, but got %s", builtin, rvm_type_name(&args[0]));
  if (arg_int(builtin, args, 1, index)) return -1;
  *arr = (rvm_array *)args[0].v_obj;
  if (*index < 0 || *index >= (*arr)->cell.size)
    return rvm_raise("IndexError", "Index %lld out of bounds %lld", (long long)*index, (long long)(*arr)->cell.size);
  return 0;
}

int rvm_builtin_tuple_getitem(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self;
  rvm_array *a;
  int64_t i = 0;
  if (tuple_index("vm.builtin.tuple_getitem", args, n, &a, &i)) return -1;
  return rvm_any_copy(&a->items[i], result);
}

int rvm_builtin_tuple_reset_item(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self, (void)result;
  rvm_array *a;
  int64_t i = 0;
  if (tuple_index("vm.builtin.tuple_reset_item", args, n, &a, &i)) return -1;
  rvm_any_release(&a->items[i]);
  return 0;
}

/* ---- control and calls ----------------------------------------------------------------------- */

int rvm_builtin_read_if_cond(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self;
  if (need_args("vm.builtin.read_if_cond", n, 1, 1)) return -1;
  const TVMFFIAny *c = &args[0];
  int64_t value = 0;
  if (c->type_index == kTVMFFIInt || c->type_index == kTVMFFIBool) {
    value = c->v_int64;
  } else if ((c->type_index == kTVMFFITensor || c->type_index == kTVMFFIDLTensorPtr)) {
    DLTensor *t = rvm_as_dltensor(c);
    char name[32];
    rvm_format_dtype(t->dtype, name, sizeof name);
    if (t->dtype.code != kDLInt && t->dtype.code != kDLUInt && t->dtype.code != kDLBool)
      return rvm_raise("TypeError", "vm.builtin.read_if_cond expects an int, uint or bool tensor, but got %s", name);
    if (rvm_tensor_nbytes(t) == 0) return rvm_raise("ValueError", "vm.builtin.read_if_cond: the condition tensor is empty");
    char element[8] = {0};
    rvm_vm *vm = t->device.device_type == kDLCPU ? NULL : rvm_current_vm(); /* only device reads need it */
    if (rvm_tensor_read(t, vm ? vm->cuda : NULL, element, (uint64_t)(t->dtype.bits + 7) / 8)) return -1;
    const char *p = element;
    switch (t->dtype.bits) {
      case 1:
      case 8: { int8_t v; memcpy(&v, p, 1); value = v; break; }
      case 16: { int16_t v; memcpy(&v, p, 2); value = v; break; }
      case 32: { int32_t v; memcpy(&v, p, 4); value = v; break; }
      case 64: { int64_t v; memcpy(&v, p, 8); value = v; break; }
      default: return rvm_raise("ValueError", "Unknown scalar int type: %s", name);
    }
  } else {
    return rvm_raise("TypeError", "Cannot convert from type `%s` to `bool`", rvm_type_name(c));
  }
  result->type_index = kTVMFFIBool;
  result->zero_padding = 0;
  result->v_int64 = value != 0;
  return 0;
}

int rvm_builtin_to_device(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self;
  if (need_args("vm.builtin.to_device", n, 3, 4)) return -1;
  DLTensor *t = rvm_as_dltensor(&args[0]);
  if (!t) return rvm_raise("TypeError", "vm.builtin.to_device expects a Tensor, but got %s", rvm_type_name(&args[0]));
  int64_t dev_type = 0, dev_id = 0;
  if (arg_int("vm.builtin.to_device", args, 1, &dev_type) || arg_int("vm.builtin.to_device", args, 2, &dev_id)) return -1;
  if (t->device.device_type == dev_type && t->device.device_id == dev_id) return rvm_any_copy(&args[0], result);
  rvm_vm *vm = rvm_current_vm();
  rvm_cuda *c = vm ? vm->cuda : NULL;
  if (!c) return rvm_raise("ValueError", "vm.builtin.to_device: no CUDA device in this VM for a copy to or from device type %lld", (long long)dev_type);
  uint64_t nbytes = (uint64_t)rvm_tensor_nbytes(t);
  rvm_storage *s;
  if (dev_type == kDLCUDA && t->device.device_type == kDLCPU) {
    s = rvm_storage_new_cuda(c, nbytes);
    if (!s) return -1;
    if (rvm_cuda_copy(c, s->data, 1, (char *)t->data + t->byte_offset, 0, nbytes)) {
      rvm_object_decref(&s->header);
      return -1;
    }
  } else if (dev_type == kDLCPU && t->device.device_type == kDLCUDA) {
    s = rvm_storage_new_unpooled(nbytes);
    if (!s) return -1;
    if (rvm_tensor_read(t, c, s->data, nbytes)) {
      rvm_object_decref(&s->header);
      return -1;
    }
  } else {
    return rvm_raise("ValueError", "vm.builtin.to_device: cannot copy from device type %d to %lld", t->device.device_type, (long long)dev_type);
  }
  rvm_tensor *copy = rvm_tensor_new(s->data, s->device, t->ndim, t->dtype, t->shape, 0, &s->header);
  rvm_object_decref(&s->header);
  if (!copy) return -1;
  *result = rvm_obj_any(copy);
  return 0;
}

int rvm_builtin_make_closure(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self;
  if (n < 1) return need_args("vm.builtin.make_closure", n, 1, 1);
  if (args[0].type_index != rvm_type_closure)
    return rvm_raise("TypeError", "vm.builtin.make_closure expects a Relax function, but got %s", rvm_type_name(&args[0]));
  const rvm_closure *base = (const rvm_closure *)args[0].v_obj;
  rvm_closure *c = rvm_closure_new(base->program, base->func_index, (n - 1) + base->num_captured);
  if (!c) return -1;
  for (int32_t i = 1; i < n; i++) rvm_any_copy(&args[i], &c->captured[i - 1]);
  for (int64_t i = 0; i < base->num_captured; i++) rvm_any_copy(&base->captured[i], &c->captured[n - 1 + i]);
  *result = rvm_obj_any(c);
  return 0;
}

int rvm_builtin_invoke_closure(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self;
  if (n < 2) return need_args("vm.builtin.invoke_closure", n, 2, 2);
  rvm_vm *vm = arg_vm(args, 0);
  if (!vm) return rvm_raise("TypeError", "vm.builtin.invoke_closure: argument 0 must be the VM");
  return rvm_invoke_value(vm, &args[1], args + 2, n - 2, result);
}

int rvm_builtin_call_tir_dyn(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self;
  if (n < 2) return need_args("vm.builtin.call_tir_dyn", n, 2, 2);
  const TVMFFIShapeCell *extra = rvm_as_shape(&args[n - 1]);
  if (!extra) return rvm_raise("TypeError", "vm.builtin.call_tir_dyn: the last argument must be a Shape, but got %s", rvm_type_name(&args[n - 1]));
  if (args[0].type_index != kTVMFFIFunction)
    return rvm_raise("TypeError", "vm.builtin.call_tir_dyn expects a kernel, but got %s", rvm_type_name(&args[0]));
  int32_t m = (n - 2) + (int32_t)extra->size;
  TVMFFIAny *call = rvm_mem_alloc(sizeof(TVMFFIAny) * (size_t)(m > 0 ? m : 1), "builtin scratch");
  if (!call) return rvm_raise("MemoryError", "out of memory");
  memcpy(call, args + 1, sizeof(TVMFFIAny) * (size_t)(n - 2));
  for (uint64_t i = 0; i < extra->size; i++) call[n - 2 + (int32_t)i] = rvm_int(extra->data[i]);
  int rc = rvm_invoke_value(NULL, &args[0], call, m, result);
  rvm_mem_free(call);
  return rc;
}
