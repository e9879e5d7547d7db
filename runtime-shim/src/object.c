/*
 * object.c: reference counting and the object kinds of the runtime, in TVM-FFI layouts.
 *
 * Objects are single allocations (header, body, inline arrays) so that creating one is one
 * allocation (from the current VM's allocator, mem.c). Reference counts follow TVM-FFI: strong count in the low 32 bits of the combined
 * count, one weak reference held by all strong ones together; relaxc never hands out weak
 * references, so the last strong release frees the object.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int32_t rvm_type_closure = 128, rvm_type_kv_cache = 130;

typedef int32_t (*type_index_fn)(const TVMFFIByteArray *key, int32_t static_index, int32_t depth, int32_t child_slots,
                                 int32_t can_overflow, int32_t parent);

/* Under tvm-ffi (libtvm_ffi loaded globally, as Python loads it), take type indices from its
 * registry, so that the closures and caches a model returns do not pass for some other type. */
__attribute__((constructor)) static void register_types_with_tvm_ffi(void) {
  type_index_fn get_or_alloc = (type_index_fn)dlsym(RTLD_DEFAULT, "TVMFFITypeGetOrAllocIndex");
  if (!get_or_alloc) return;
  const TVMFFIByteArray closure = {"relaxc.Closure", 14}, cache = {"relaxc.PagedAttentionKVCache", 28};
  int32_t c = get_or_alloc(&closure, -1, 1, 0, 0, kTVMFFIObject), k = get_or_alloc(&cache, -1, 1, 0, 0, kTVMFFIObject);
  if (c >= 128 && k >= 128 && c != k) {
    rvm_type_closure = c;
    rvm_type_kv_cache = k;
  }
}

#define RVM_STRONG_ONE 1ull
#define RVM_FRESH_COUNT 0x0000000100000001ull

void rvm_object_init(TVMFFIObject *obj, int32_t type_index, void (*deleter)(void *, int)) {
  obj->combined_ref_count = RVM_FRESH_COUNT;
  obj->type_index = type_index;
  obj->padding = 0;
  obj->deleter = deleter;
}

void rvm_object_incref(TVMFFIObject *obj) {
  __atomic_fetch_add(&obj->combined_ref_count, RVM_STRONG_ONE, __ATOMIC_RELAXED);
}

void rvm_object_decref(TVMFFIObject *obj) {
  /* The sole owner (one strong reference, no weak one) needs no atomic read-modify-write: no
   * other thread holds a reference through which to change the count, so the locked subtraction
   * (most of a short program's per-tensor cost) is skipped. The acquire load still makes the
   * releases of earlier owners on other threads visible before the object is freed. */
  if (__atomic_load_n(&obj->combined_ref_count, __ATOMIC_ACQUIRE) == RVM_FRESH_COUNT) {
    obj->deleter(obj, 3);
    return;
  }
  uint64_t before = __atomic_fetch_sub(&obj->combined_ref_count, RVM_STRONG_ONE, __ATOMIC_RELEASE);
  /* An acquire load of the count, not a fence, makes the other threads' releases visible:
   * the same ordering, and ThreadSanitizer (which does not model fences) sees it. */
  if (before == RVM_FRESH_COUNT) {
    (void)__atomic_load_n(&obj->combined_ref_count, __ATOMIC_ACQUIRE);
    obj->deleter(obj, 3);
  } else if ((before & 0xffffffffu) == 1) {
    /* Someone holds a weak reference (only possible for objects made elsewhere). */
    (void)__atomic_load_n(&obj->combined_ref_count, __ATOMIC_ACQUIRE);
    obj->deleter(obj, 1);
    uint64_t weak_before = __atomic_fetch_sub(&obj->combined_ref_count, 1ull << 32, __ATOMIC_RELEASE);
    if ((weak_before >> 32) == 1) obj->deleter(obj, 2);
  }
}

bool rvm_object_sole_owner(const TVMFFIObject *obj) {
  return __atomic_load_n(&obj->combined_ref_count, __ATOMIC_ACQUIRE) == RVM_FRESH_COUNT;
}

void rvm_any_release(TVMFFIAny *v) {
  if (rvm_is_object(v)) rvm_object_decref(v->v_obj);
  memset(v, 0, sizeof(*v));
}

int rvm_any_copy(const TVMFFIAny *view, TVMFFIAny *out) {
  if (view->type_index == kTVMFFIRawStr) {
    const char *s = view->v_c_str;
    rvm_string *str = rvm_string_new(s, strlen(s));
    if (!str) return -1;
    *out = rvm_obj_any(str);
    return 0;
  }
  *out = *view;
  if (rvm_is_object(view)) rvm_object_incref(view->v_obj);
  return 0;
}

const char *rvm_type_name(const TVMFFIAny *v) {
  switch (v->type_index) {
    case kTVMFFINone: return "None";
    case kTVMFFIInt: return "int";
    case kTVMFFIBool: return "bool";
    case kTVMFFIFloat: return "float";
    case kTVMFFIOpaquePtr: return "void*";
    case kTVMFFIDataType: return "DataType";
    case kTVMFFIDevice: return "Device";
    case kTVMFFIDLTensorPtr: return "DLTensor*";
    case kTVMFFIRawStr: return "const char*";
    case kTVMFFISmallStr: return "ffi.SmallStr";
    case kTVMFFIStr: return "ffi.String";
    case kTVMFFIBytes: return "ffi.Bytes";
    case kTVMFFIFunction: return "ffi.Function";
    case kTVMFFIShape: return "ffi.Shape";
    case kTVMFFITensor: return "ffi.Tensor";
    case kTVMFFIArray: return "ffi.Array";
    case kTVMFFIMap: return "ffi.Map";
    case RVM_TYPE_STORAGE: return "vm.Storage";
    default:
      if (v->type_index == rvm_type_closure) return "relax.vm.Closure";
      if (v->type_index == rvm_type_kv_cache) return "relax.vm.PagedAttentionKVCache";
      return "Object";
  }
}

static void closure_deleter(void *self, int flags);

static void free_deleter(void *self, int flags) {
  if (flags & 2) rvm_mem_free(self);
}

/* Size of an object header followed by n items, or 0 (with a MemoryError) when it cannot exist. */
static size_t object_size(const char *what, size_t header, int64_t n, size_t item) {
  if (n < 0 || (uint64_t)n > (SIZE_MAX - header) / item / 2) {
    rvm_raise("MemoryError", "cannot allocate a %s of %lld items", what, (long long)n);
    return 0;
  }
  return header + item * (size_t)n;
}

static void *object_alloc(size_t size, const char *what) {
  if (!size) return NULL;
  return rvm_mem_alloc(size, what);
}

rvm_shape *rvm_shape_new(const int64_t *dims, int64_t n) {
  rvm_shape *s = object_alloc(object_size("shape", sizeof(rvm_shape), n, sizeof(int64_t)), "a shape");
  if (!s) return NULL;
  rvm_object_init(&s->header, kTVMFFIShape, free_deleter);
  if (n > 0) memcpy(s->dims, dims, sizeof(int64_t) * (size_t)n);
  s->cell.data = s->dims;
  s->cell.size = (uint64_t)n;
  return s;
}

rvm_string *rvm_string_new(const char *bytes, uint64_t size) {
  rvm_string *s = object_alloc(size > INT64_MAX - 1 ? object_size("string", sizeof(rvm_string), -1, 1)
                                                    : object_size("string", sizeof(rvm_string), (int64_t)size + 1, 1),
                                 "a string");
  if (!s) return NULL;
  rvm_object_init(&s->header, kTVMFFIStr, free_deleter);
  if (size) memcpy(s->bytes, bytes, size);
  s->bytes[size] = 0;
  s->cell.data = s->bytes;
  s->cell.size = size;
  return s;
}

static void array_deleter(void *self, int flags) {
  rvm_array *a = self;
  if (flags & 1) {
    for (int64_t i = 0; i < a->cell.size; i++) rvm_any_release(&a->items[i]);
  }
  if (flags & 2) rvm_mem_free(a);
}

rvm_array *rvm_array_new(int64_t n) {
  rvm_array *a = object_alloc(object_size("tuple", sizeof(rvm_array), n, sizeof(TVMFFIAny)), "a tuple");
  if (!a) return NULL;
  rvm_object_init(&a->header, kTVMFFIArray, array_deleter);
  memset(a->items, 0, sizeof(TVMFFIAny) * (size_t)n);
  a->cell.data = a->items;
  a->cell.size = n;
  a->cell.capacity = n;
  a->cell.data_deleter = NULL;
  return a;
}

rvm_function *rvm_function_new(TVMFFISafeCallType fn) {
  rvm_function *f = object_alloc(sizeof(rvm_function), "a function object");
  if (!f) return NULL;
  rvm_object_init(&f->header, kTVMFFIFunction, free_deleter);
  f->cell.safe_call = fn;
  f->cell.cpp_call = NULL;
  return f;
}

static void tensor_deleter(void *self, int flags) {
  rvm_tensor *t = self;
  TVMFFIObject *owner = t->owner;
  /* Back to the cache first: the owner may hold the last reference to the cache's allocator. */
  if (flags == 3 && t->home && rvm_pool_give_tensor(t->home, t)) {
    if (owner) rvm_object_decref(owner);
    return;
  }
  if ((flags & 1) && owner) rvm_object_decref(owner);
  if (flags & 2) rvm_mem_free(t);
}

bool rvm_is_own_tensor(const TVMFFIObject *obj) { return obj->deleter == tensor_deleter; }

const rvm_allocator *rvm_object_allocator(const TVMFFIObject *obj) {
  void (*d)(void *, int) = obj->deleter;
  bool ours = d == free_deleter || d == array_deleter || d == tensor_deleter || d == closure_deleter ||
              obj->type_index == rvm_type_kv_cache || rvm_is_pooled_storage(obj);
  return ours ? rvm_mem_owner(obj) : NULL;
}

rvm_tensor *rvm_tensor_new(void *data, DLDevice dev, int32_t ndim, DLDataType dtype,
                           const int64_t *shape, uint64_t byte_offset, TVMFFIObject *owner) {
  return rvm_tensor_new_in(NULL, data, dev, ndim, dtype, shape, byte_offset, owner);
}

rvm_tensor *rvm_tensor_new_in(rvm_pool *home, void *data, DLDevice dev, int32_t ndim, DLDataType dtype,
                              const int64_t *shape, uint64_t byte_offset, TVMFFIObject *owner) {
  rvm_tensor *t = home ? rvm_pool_take_tensor(home, ndim) : NULL;
  if (!t)
    t = object_alloc(sizeof(rvm_tensor) + 2 * sizeof(int64_t) * (size_t)(ndim < RVM_CACHED_NDIM ? RVM_CACHED_NDIM : ndim),
                     "a tensor object");
  if (!t) return NULL;
  rvm_object_init(&t->header, kTVMFFITensor, tensor_deleter);
  int64_t *dims = t->dims, *strides = t->dims + ndim;
  int64_t stride = 1;
  for (int32_t i = ndim - 1; i >= 0; i--) {
    dims[i] = shape[i];
    strides[i] = stride;
    stride *= shape[i];
  }
  t->dl.data = data;
  t->dl.device = dev;
  t->dl.ndim = ndim;
  t->dl.dtype = dtype;
  t->dl.shape = dims;
  /* TVM's tensors carry explicit compact strides; kernels accept them as well as NULL. */
  t->dl.strides = strides;
  t->dl.byte_offset = byte_offset;
  t->owner = owner;
  t->home = home;
  if (owner) rvm_object_incref(owner);
  return t;
}

static void closure_deleter(void *self, int flags) {
  rvm_closure *c = self;
  if (flags & 1) {
    for (int64_t i = 0; i < c->num_captured; i++) rvm_any_release(&c->captured[i]);
  }
  if (flags & 2) rvm_mem_free(c);
}

rvm_closure *rvm_closure_new(const rvm_program *program, int64_t func_index, int64_t num_captured) {
  rvm_closure *c = object_alloc(sizeof(rvm_closure) + sizeof(TVMFFIAny) * (size_t)num_captured, "a closure");
  if (!c) return NULL;
  rvm_object_init(&c->header, rvm_type_closure, closure_deleter);
  c->program = program;
  c->func_index = func_index;
  c->num_captured = num_captured;
  memset(c->captured, 0, sizeof(TVMFFIAny) * (size_t)num_captured);
  return c;
}

DLTensor *rvm_as_dltensor(const TVMFFIAny *v) {
  if (v->type_index == kTVMFFITensor) return rvm_tensor_of_object(v->v_obj);
  if (v->type_index == kTVMFFIDLTensorPtr) return (DLTensor *)v->v_ptr;
  return NULL;
}

const TVMFFIShapeCell *rvm_as_shape(const TVMFFIAny *v) {
  if (v->type_index != kTVMFFIShape) return NULL;
  return (const TVMFFIShapeCell *)((const char *)v->v_obj + sizeof(TVMFFIObject));
}

bool rvm_as_string(const TVMFFIAny *v, const char **data, uint64_t *size) {
  switch (v->type_index) {
    case kTVMFFIRawStr:
      *data = v->v_c_str;
      *size = strlen(v->v_c_str);
      return true;
    case kTVMFFISmallStr:
      /* At most 7 bytes inline, so a NUL always follows them; a longer length is malformed. */
      if (v->zero_padding >= sizeof v->v_bytes) return false;
      *data = v->v_bytes;
      *size = v->zero_padding;
      return true;
    case kTVMFFIStr: {
      const TVMFFIByteArray *b = (const TVMFFIByteArray *)((const char *)v->v_obj + sizeof(TVMFFIObject));
      *data = b->data;
      *size = b->size;
      return true;
    }
    default:
      return false;
  }
}

void rvm_format_shape(const int64_t *dims, int64_t n, char *buf, size_t cap) {
  size_t at = (size_t)snprintf(buf, cap, "[");
  for (int64_t i = 0; i < n && at < cap; i++) at += (size_t)snprintf(buf + at, cap - at, "%s%lld", i ? ", " : "", (long long)dims[i]);
  if (at < cap) snprintf(buf + at, cap - at, "]");
}

/* rvm_checked_nbytes past its first pass: a negative dimension or an overflow on the way, which
 * a zero dimension can still excuse. */
static __attribute__((noinline)) int64_t checked_nbytes_slow(const char *what, const int64_t *dims, int64_t ndim,
                                                             DLDataType dtype) {
  bool empty = false;
  for (int64_t i = 0; i < ndim; i++) {
    if (dims[i] < 0 && !what) return -1;
    if (dims[i] < 0) return rvm_raise("ValueError", "%s: negative dimension %lld (axis %lld)", what, (long long)dims[i], (long long)i);
    empty |= dims[i] == 0;
  }
  if (empty) return 0;
  /* Counted in bits: a count that fits in int64 can still overflow once multiplied by the dtype. */
  int64_t bits = (int64_t)dtype.bits * dtype.lanes;
  bool overflow = false;
  for (int64_t i = 0; i < ndim && !overflow; i++) overflow = __builtin_mul_overflow(bits, dims[i], &bits);
  if ((overflow || bits > INT64_MAX - 7) && !what) return -1;
  if (overflow || bits > INT64_MAX - 7) {
    char shape[256], dt[32];
    rvm_format_shape(dims, ndim, shape, sizeof shape);
    rvm_format_dtype(dtype, dt, sizeof dt);
    return rvm_raise("ValueError", "%s: a tensor of shape %s and dtype %s would have more than 2^63 bytes", what, shape, dt);
  }
  return (bits + 7) / 8;
}

int64_t rvm_checked_nbytes(const char *what, const int64_t *dims, int64_t ndim, DLDataType dtype) {
  /* Every allocation asks (five times a call of a small chain), so one short pass answers the
   * common case, no negative dimension and no overflow on the way (a zero then gives 0). */
  uint64_t bits = (uint64_t)dtype.bits * dtype.lanes;
  int64_t i = 0;
  while (i < ndim && dims[i] >= 0 && !__builtin_mul_overflow(bits, (uint64_t)dims[i], &bits)) i++;
  if (i == ndim && bits <= (uint64_t)INT64_MAX - 7) return (int64_t)((bits + 7) / 8);
  return checked_nbytes_slow(what, dims, ndim, dtype);
}

int64_t rvm_tensor_nbytes(const DLTensor *t) {
  int64_t n = 1;
  for (int32_t i = 0; i < t->ndim; i++) n *= t->shape[i];
  return (n * t->dtype.bits * t->dtype.lanes + 7) / 8;
}

void rvm_format_dtype(DLDataType t, char *buf, size_t cap) {
  const char *base;
  switch (t.code) {
    case kDLInt: base = "int"; break;
    case kDLUInt: base = "uint"; break;
    case kDLFloat: base = "float"; break;
    case kDLOpaqueHandle: base = "handle"; break;
    case kDLBfloat: base = "bfloat"; break;
    case kDLBool: snprintf(buf, cap, "bool"); return;
    default: base = "custom"; break;
  }
  if (t.lanes > 1)
    snprintf(buf, cap, "%s%ux%u", base, (unsigned)t.bits, (unsigned)t.lanes);
  else
    snprintf(buf, cap, "%s%u", base, (unsigned)t.bits);
}

rvm_tensor *rvm_tensor_copy_aligned(const DLTensor *t) {
  int64_t nbytes = rvm_tensor_nbytes(t);  /* checked by the caller (rvm_checked_nbytes) */
  rvm_storage *s = rvm_storage_new_unpooled((uint64_t)nbytes);
  if (!s) return NULL;
  const char *src = (const char *)t->data + t->byte_offset;
  if (nbytes) memcpy(s->data, src, (size_t)nbytes);
  rvm_tensor *copy = rvm_tensor_new(s->data, t->device, t->ndim, t->dtype, t->shape, 0, &s->header);
  rvm_object_decref(&s->header);
  return copy;
}
