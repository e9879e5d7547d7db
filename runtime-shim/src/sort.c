/*
 * sort.c: tvm.contrib.sort.{sort, argsort, topk, argsort_nms}, the runtime functions TVM's sort
 * and topk kernels call by name (ONNX TopK, PyTorch sort/topk/argsort).
 *
 * Results must equal TVM's bit for bit, ties included. TVM sorts each slice along the axis with
 * std::stable_sort (equal keys keep their input order) and picks top-k by (key, index): the k
 * first elements in that total order, in that order. A stable merge sort of element indices
 * gives exactly those orders. The dtypes accepted, and the error texts, are TVM 0.27's.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- keys ----------------------------------------------------------------------------------- */

/* Elements are compared through one of three key kinds, so that 64-bit integers keep their
 * precision and floats (float16 widened exactly) compare as floats. */
typedef enum { KEY_SIGNED, KEY_UNSIGNED, KEY_FLOAT } key_kind;

typedef union {
  int64_t i;
  uint64_t u;
  double f;
} key;

static bool key_kind_of(DLDataType t, key_kind *kind) {
  if (t.lanes != 1) return false;
  if (t.code == kDLInt && (t.bits == 8 || t.bits == 16 || t.bits == 32 || t.bits == 64)) *kind = KEY_SIGNED;
  else if (t.code == kDLUInt && (t.bits == 8 || t.bits == 16 || t.bits == 32 || t.bits == 64)) *kind = KEY_UNSIGNED;
  else if (t.code == kDLFloat && (t.bits == 16 || t.bits == 32 || t.bits == 64)) *kind = KEY_FLOAT;
  else return false;
  return true;
}

static key load_key(DLDataType t, const char *base, int64_t i) {
  key k;
  const char *p = base + i * (t.bits / 8);
  switch (t.code * 256 + t.bits) {
    case kDLInt * 256 + 8: { int8_t v; memcpy(&v, p, 1); k.i = v; break; }
    case kDLInt * 256 + 16: { int16_t v; memcpy(&v, p, 2); k.i = v; break; }
    case kDLInt * 256 + 32: { int32_t v; memcpy(&v, p, 4); k.i = v; break; }
    case kDLInt * 256 + 64: { memcpy(&k.i, p, 8); break; }
    case kDLUInt * 256 + 8: { uint8_t v; memcpy(&v, p, 1); k.u = v; break; }
    case kDLUInt * 256 + 16: { uint16_t v; memcpy(&v, p, 2); k.u = v; break; }
    case kDLUInt * 256 + 32: { uint32_t v; memcpy(&v, p, 4); k.u = v; break; }
    case kDLUInt * 256 + 64: { memcpy(&k.u, p, 8); break; }
    case kDLFloat * 256 + 16: { uint16_t v; memcpy(&v, p, 2); k.f = rvm_half_to_float(v); break; }
    case kDLFloat * 256 + 32: { float v; memcpy(&v, p, 4); k.f = v; break; }
    default: { memcpy(&k.f, p, 8); break; }
  }
  return k;
}

/* a strictly before b in the requested direction (never true for equal keys). */
static bool key_before(key_kind kind, bool ascend, key a, key b) {
  switch (kind) {
    case KEY_SIGNED: return ascend ? a.i < b.i : a.i > b.i;
    case KEY_UNSIGNED: return ascend ? a.u < b.u : a.u > b.u;
    default: return ascend ? a.f < b.f : a.f > b.f;
  }
}

/* A slice's elements with their positions along the axis. */
typedef struct {
  key k;
  int64_t index;
} entry;

/* Stable merge sort by key (ties keep their order, as std::stable_sort keeps them). */
static void merge_sort(entry *items, entry *scratch, int64_t n, key_kind kind, bool ascend) {
  for (int64_t width = 1; width < n; width *= 2) {
    for (int64_t lo = 0; lo < n; lo += 2 * width) {
      int64_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
      int64_t a = lo, b = mid, out = lo;
      while (a < mid && b < hi) scratch[out++] = key_before(kind, ascend, items[b].k, items[a].k) ? items[b++] : items[a++];
      while (a < mid) scratch[out++] = items[a++];
      while (b < hi) scratch[out++] = items[b++];
    }
    memcpy(items, scratch, sizeof(entry) * (size_t)n);
  }
}

/* Stores an index (or a key) as an element of type t. */
static void store_number(DLDataType t, char *base, int64_t i, int64_t index) {
  char *p = base + i * (t.bits / 8);
  switch (t.code * 256 + t.bits) {
    case kDLInt * 256 + 8: { int8_t v = (int8_t)index; memcpy(p, &v, 1); break; }
    case kDLUInt * 256 + 8: { uint8_t v = (uint8_t)index; memcpy(p, &v, 1); break; }
    case kDLInt * 256 + 32: { int32_t v = (int32_t)index; memcpy(p, &v, 4); break; }
    case kDLInt * 256 + 64: { memcpy(p, &index, 8); break; }
    case kDLFloat * 256 + 32: { float v = (float)index; memcpy(p, &v, 4); break; }
    default: { double v = (double)index; memcpy(p, &v, 8); break; }
  }
}

/* ---- argument decoding (TVM-FFI's cast rules and texts) -------------------------------------- */

static int arg_tensor(const TVMFFIAny *args, int32_t n, int32_t i, DLTensor **out) {
  if (i >= n) return rvm_raise("TypeError", "Cannot convert from type `None` to `DLTensor*`");
  *out = rvm_as_dltensor(&args[i]);
  if (!*out) return rvm_raise("TypeError", "Cannot convert from type `%s` to `DLTensor*`", rvm_type_name(&args[i]));
  if ((*out)->device.device_type != kDLCPU)
    return rvm_raise("ValueError", "tvm.contrib.sort: tensors must be on the CPU, got device type %d", (*out)->device.device_type);
  return 0;
}

static int arg_i32(const TVMFFIAny *args, int32_t n, int32_t i, int32_t *out) {
  if (i < n && (args[i].type_index == kTVMFFIInt || args[i].type_index == kTVMFFIBool)) {
    *out = (int32_t)args[i].v_int64;
    return 0;
  }
  return rvm_raise("TypeError", "Cannot convert from type `%s` to `int`", i < n ? rvm_type_name(&args[i]) : "None");
}

static int arg_bool(const TVMFFIAny *args, int32_t n, int32_t i, bool *out) {
  if (i < n && (args[i].type_index == kTVMFFIInt || args[i].type_index == kTVMFFIBool)) {
    *out = args[i].v_int64 != 0;
    return 0;
  }
  return rvm_raise("TypeError", "Cannot convert from type `%s` to `bool`", i < n ? rvm_type_name(&args[i]) : "None");
}

static bool dtype_is(DLDataType t, int code, int bits) { return t.code == code && t.bits == bits && t.lanes == 1; }

/* The layout of a sort along `axis`: slices of `len` elements, `stride` apart, `before * after`
 * of them. */
typedef struct {
  int64_t before, len, after;
} axis_layout;

static axis_layout layout_of(const DLTensor *t, int32_t axis) {
  axis_layout l = {1, t->shape[axis], 1};
  for (int32_t i = 0; i < t->ndim; i++) {
    if (i < axis) l.before *= t->shape[i];
    else if (i > axis) l.after *= t->shape[i];
  }
  return l;
}

static char *data_of(const DLTensor *t) { return (char *)t->data + t->byte_offset; }

static int out_of_memory(void) { return rvm_raise("MemoryError", "tvm.contrib.sort: out of memory"); }

static int check_axis_lt(int32_t axis, const DLTensor *t) {
  if (axis < t->ndim && axis >= 0) return 0;
  if (axis >= t->ndim)
    return rvm_raise("InternalError", "Check failed: axis < input->ndim (%d vs. %d) : Axis out of boundary for input ndim %d", axis,
                     t->ndim, t->ndim);
  /* TVM itself reads out of bounds here (it crashes); relaxc says what is wrong instead. */
  return rvm_raise("InternalError", "Check failed: axis >= 0 (%d vs. 0) : Axis out of boundary for input ndim %d", axis, t->ndim);
}

static void dtype_name(DLDataType t, char *buf) { rvm_format_dtype(t, buf, 32); }

/* Sorts every slice of `in` along the axis, then hands each sorted slice to `emit`. */
typedef void (*emit_fn)(const entry *sorted, int64_t len, int64_t base, int64_t step, void *ctx);

static int sort_slices(const DLTensor *in, int32_t axis, bool ascend, key_kind kind, emit_fn emit, void *ctx) {
  axis_layout l = layout_of(in, axis);
  if (l.len == 0 || l.before == 0 || l.after == 0) return 0;
  entry *items = rvm_mem_alloc(sizeof(entry) * (size_t)l.len * 2, "sort scratch");
  if (!items) return out_of_memory();
  const char *data = data_of(in);
  for (int64_t i = 0; i < l.before; i++) {
    for (int64_t j = 0; j < l.after; j++) {
      int64_t base = i * l.len * l.after + j;
      for (int64_t k = 0; k < l.len; k++) {
        items[k].k = load_key(in->dtype, data, base + k * l.after);
        items[k].index = k;
      }
      merge_sort(items, items + l.len, l.len, kind, ascend);
      emit(items, l.len, base, l.after, ctx);
    }
  }
  rvm_mem_free(items);
  return 0;
}

typedef struct {
  const DLTensor *in, *out;
} copy_ctx;

static void emit_values(const entry *sorted, int64_t len, int64_t base, int64_t step, void *ctx) {
  const copy_ctx *c = ctx;
  size_t size = c->in->dtype.bits / 8;
  const char *src = data_of(c->in);
  char *dst = data_of(c->out);
  for (int64_t k = 0; k < len; k++)
    memcpy(dst + (size_t)(base + k * step) * size, src + (size_t)(base + sorted[k].index * step) * size, size);
}

static void emit_indices(const entry *sorted, int64_t len, int64_t base, int64_t step, void *ctx) {
  const DLTensor *out = ctx;
  for (int64_t k = 0; k < len; k++) store_number(out->dtype, data_of(out), base + k * step, sorted[k].index);
}

/* Index outputs TVM's argsort and topk accept. */
static bool index_dtype_ok(DLDataType t) {
  return dtype_is(t, kDLInt, 32) || dtype_is(t, kDLInt, 64) || dtype_is(t, kDLFloat, 32) || dtype_is(t, kDLFloat, 64);
}

static bool sortable_input(DLDataType t) {
  return dtype_is(t, kDLFloat, 32) || dtype_is(t, kDLFloat, 64) || dtype_is(t, kDLInt, 32) || dtype_is(t, kDLInt, 64) ||
         dtype_is(t, kDLFloat, 16);
}

static int unsupported(const char *what, DLDataType t) {
  char name[32];
  dtype_name(t, name);
  return rvm_raise("InternalError", "Unsupported %s dtype: %s", what, name);
}

/* ---- the functions ---------------------------------------------------------------------------- */

/* (input, output, axis, is_ascend): output = input sorted along axis. */
int rvm_builtin_sort_sort(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self, (void)result;
  DLTensor *in, *out;
  int32_t axis = 0;
  bool ascend = true;
  if (arg_tensor(args, n, 0, &in) || arg_tensor(args, n, 1, &out) || arg_i32(args, n, 2, &axis) || arg_bool(args, n, 3, &ascend))
    return -1;
  if (axis < 0) axis += in->ndim;
  if (check_axis_lt(axis, in)) return -1;
  char a[32], b[32];
  dtype_name(in->dtype, a);
  dtype_name(out->dtype, b);
  if (strcmp(a, b) != 0) return rvm_raise("InternalError", "Check failed: data_dtype == out_dtype (%s vs. %s) : ", a, b);
  key_kind kind;
  if (!sortable_input(in->dtype) || !key_kind_of(in->dtype, &kind)) return unsupported("input", in->dtype);
  copy_ctx ctx = {in, out};
  return sort_slices(in, axis, ascend, kind, emit_values, &ctx);
}

/* (input, output, axis, is_ascend): output = the positions that sort input along axis. */
int rvm_builtin_sort_argsort(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self, (void)result;
  DLTensor *in, *out;
  int32_t axis = 0;
  bool ascend = true;
  if (arg_tensor(args, n, 0, &in) || arg_tensor(args, n, 1, &out) || arg_i32(args, n, 2, &axis) || arg_bool(args, n, 3, &ascend))
    return -1;
  if (axis < 0) axis += in->ndim;
  if (check_axis_lt(axis, in)) return -1;
  key_kind kind;
  if (!sortable_input(in->dtype) || !key_kind_of(in->dtype, &kind)) return unsupported("input", in->dtype);
  if (!index_dtype_ok(out->dtype)) return unsupported("output", out->dtype);
  return sort_slices(in, axis, ascend, kind, emit_indices, out);
}

/* (input, [values,] [indices,] k, axis, ret_type, is_ascend): the k first elements along axis in
 * (key, position) order; k < 1 means all. */
int rvm_builtin_sort_topk(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self, (void)result;
  DLTensor *in, *values = NULL, *indices = NULL;
  int32_t k = 0, axis = 0;
  bool ascend = true;
  if (n < 4) return rvm_raise("TypeError", "Cannot convert from type `None` to `DLTensor*`");
  if (arg_tensor(args, n, 0, &in) || arg_i32(args, n, n - 4, &k) || arg_i32(args, n, n - 3, &axis)) return -1;
  const char *ret_type;
  uint64_t ret_len;
  if (!rvm_as_string(&args[n - 2], &ret_type, &ret_len))
    return rvm_raise("TypeError", "Cannot convert from type `%s` to `ffi.String`", rvm_type_name(&args[n - 2]));
  if (arg_bool(args, n, n - 1, &ascend)) return -1;
  if (ret_len == 4 && memcmp(ret_type, "both", 4) == 0) {
    if (arg_tensor(args, n, 1, &values) || arg_tensor(args, n, 2, &indices)) return -1;
  } else if (ret_len == 6 && memcmp(ret_type, "values", 6) == 0) {
    if (arg_tensor(args, n, 1, &values)) return -1;
  } else if (ret_len == 7 && memcmp(ret_type, "indices", 7) == 0) {
    if (arg_tensor(args, n, 1, &indices)) return -1;
  } else {
    return rvm_raise("InternalError", "Unsupported ret type: %.*s", (int)ret_len, ret_type);
  }
  if (axis < 0) axis += in->ndim;
  if (!(axis >= 0 && axis < in->ndim))
    return rvm_raise("InternalError", "Check failed: (axis >= 0 && axis < input->ndim) is false: Axis out of boundary for input ndim %d",
                     in->ndim);
  key_kind kind;
  DLDataType t = in->dtype;
  bool input_ok = sortable_input(t) || dtype_is(t, kDLUInt, 8) || dtype_is(t, kDLInt, 8);
  if (!input_ok || !key_kind_of(t, &kind)) return unsupported("input", t);
  if (indices) {
    DLDataType o = indices->dtype;
    bool same_8bit = (dtype_is(t, kDLUInt, 8) || dtype_is(t, kDLInt, 8)) && dtype_is(o, t.code, 8);
    if (!index_dtype_ok(o) && !same_8bit) return unsupported("output", o);
  }
  axis_layout l = layout_of(in, axis);
  int64_t kk = k < 1 ? l.len : k;
  int64_t keep = kk < l.len ? kk : l.len;
  if (l.len == 0 || l.before == 0 || l.after == 0) return 0;
  entry *items = rvm_mem_alloc(sizeof(entry) * (size_t)l.len * 2, "sort scratch");
  if (!items) return out_of_memory();
  const char *data = data_of(in);
  size_t size = t.bits / 8;
  for (int64_t i = 0; i < l.before; i++) {
    for (int64_t j = 0; j < l.after; j++) {
      int64_t src = i * l.len * l.after + j, dst = i * kk * l.after + j;
      for (int64_t e = 0; e < l.len; e++) {
        items[e].k = load_key(t, data, src + e * l.after);
        items[e].index = e;
      }
      /* A stable sort orders equal keys by position: the (key, position) order TVM's heap uses. */
      merge_sort(items, items + l.len, l.len, kind, ascend);
      for (int64_t e = 0; e < keep; e++) {
        if (indices) store_number(indices->dtype, data_of(indices), dst + e * l.after, items[e].index);
        if (values)
          memcpy(data_of(values) + (size_t)(dst + e * l.after) * size, data + (size_t)(src + items[e].index * l.after) * size,
                 size);
      }
    }
  }
  rvm_mem_free(items);
  return 0;
}

/* (input float32, sort_num int32, output int32, axis, is_ascend): argsort of the first
 * sort_num[...] elements of each slice; positions past them are their own index. */
int rvm_builtin_sort_argsort_nms(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self, (void)result;
  DLTensor *in, *count, *out;
  int32_t axis = 0;
  bool ascend = true;
  if (arg_tensor(args, n, 0, &in) || arg_tensor(args, n, 1, &count) || arg_tensor(args, n, 2, &out) ||
      arg_i32(args, n, 3, &axis) || arg_bool(args, n, 4, &ascend))
    return -1;
  if (axis < 0) axis += in->ndim;
  if (in->dtype.code != kDLFloat)
    return rvm_raise("InternalError", "Check failed: dtype.code == 2 (%d vs. 2) : Currently only supports input dtype to be float.",
                     in->dtype.code);
  if (in->dtype.bits != 32)
    return rvm_raise("InternalError", "Check failed: dtype.bits == 32 (%d vs. 32) : Currently only supports input dtype to be float32.",
                     in->dtype.bits);
  if (check_axis_lt(axis, in)) return -1;
  if (!dtype_is(count->dtype, kDLInt, 32) || !dtype_is(out->dtype, kDLInt, 32))
    return rvm_raise("TypeError", "tvm.contrib.sort.argsort_nms: sort_num and the output must be int32 tensors");
  axis_layout l = layout_of(in, axis);
  if (l.len == 0 || l.before == 0 || l.after == 0) return 0;
  entry *items = rvm_mem_alloc(sizeof(entry) * (size_t)l.len * 2, "sort scratch");
  if (!items) return out_of_memory();
  const int32_t *num = (const int32_t *)data_of(count);
  int32_t *dst = (int32_t *)data_of(out);
  for (int64_t i = 0; i < l.before; i++) {
    for (int64_t j = 0; j < l.after; j++) {
      int64_t base = i * l.len * l.after + j, m = num[i * l.after + j];
      if (m < 0) m = 0;
      if (m > l.len) m = l.len;
      for (int64_t e = 0; e < m; e++) {
        items[e].k = load_key(in->dtype, data_of(in), base + e * l.after);
        items[e].index = e;
      }
      merge_sort(items, items + l.len, m, KEY_FLOAT, ascend);
      for (int64_t e = 0; e < l.len; e++) dst[base + e * l.after] = (int32_t)(e < m ? items[e].index : e);
    }
  }
  rvm_mem_free(items);
  return 0;
}
