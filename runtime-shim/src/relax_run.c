/*
 * relax_run.c: the relax.run.* functions, which TVM implements in Python (tvm/relax/op/base.py
 * and set.py) and models call for data-dependent results (ONNX Unique, NonZero, Compress),
 * shapes as tensors, printing and assertions. Here they are C, so such models run with no
 * Python at all; results, printed text and error texts are TVM's (numpy's, through TVM).
 *
 * Tensors they return own fresh 64-byte aligned storage: their sizes depend on the data, so no
 * plan could have reserved them.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Python's name for the type of a value, as its error messages print it. */
static const char *python_type(const TVMFFIAny *v) {
  switch (v->type_index) {
    case kTVMFFINone: return "NoneType";
    case kTVMFFIInt: return "int";
    case kTVMFFIBool: return "bool";
    case kTVMFFIFloat: return "float";
    case kTVMFFIRawStr:
    case kTVMFFISmallStr:
    case kTVMFFIStr: return "str";
    case kTVMFFIShape: return "Shape";
    case kTVMFFIArray: return "Array";
    case kTVMFFIFunction: return "Function";
    case kTVMFFITensor:
    case kTVMFFIDLTensorPtr: return "Tensor";
    default: return rvm_type_name(v);
  }
}

/* Python's TypeError for a call with the wrong number of positional arguments. */
static int arity(const char *fn, int32_t got, int32_t min, int32_t max, const char *const *names) {
  if (got >= min && (max < 0 || got <= max)) return 0;
  if (got < min) {
    char list[256] = "";
    size_t at = 0;
    int missing = min - got;
    for (int i = got; i < min; i++) {
      const char *sep = i == got ? "" : (i + 1 == min ? (missing > 2 ? ", and " : " and ") : ", ");
      at += (size_t)snprintf(list + at, sizeof list - at, "%s'%s'", sep, names[i]);
      if (at >= sizeof list) break;
    }
    return rvm_raise("TypeError", "%s() missing %d required positional argument%s: %s", fn, missing, missing > 1 ? "s" : "", list);
  }
  if (min == max)
    return rvm_raise("TypeError", "%s() takes %d positional argument%s but %d were given", fn, max, max == 1 ? "" : "s", got);
  return rvm_raise("TypeError", "%s() takes from %d to %d positional arguments but %d were given", fn, min, max, got);
}

static int new_tensor(DLDataType dtype, int32_t ndim, const int64_t *shape, rvm_tensor **out) {
  uint64_t count = 1;
  for (int32_t i = 0; i < ndim; i++) count *= (uint64_t)shape[i];
  uint64_t nbytes = (count * dtype.bits * dtype.lanes + 7) / 8;
  rvm_storage *s = rvm_storage_new_unpooled(nbytes);
  if (!s) return -1;
  rvm_tensor *t = rvm_tensor_new(s->data, s->device, ndim, dtype, shape, 0, &s->header);
  rvm_object_decref(&s->header);
  if (!t) return -1;
  *out = t;
  return 0;
}

static const DLDataType INT64 = {kDLInt, 64, 1};
static const DLDataType FLOAT64 = {kDLFloat, 64, 1};

static char *data_of(const DLTensor *t) { return (char *)t->data + t->byte_offset; }

static int64_t element_count(const DLTensor *t) {
  int64_t n = 1;
  for (int32_t i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

static int need_tensor(const TVMFFIAny *v, DLTensor **out) {
  *out = rvm_as_dltensor(v);
  if (!*out) return rvm_raise("AttributeError", "'%s' object has no attribute 'numpy'", python_type(v));
  if ((*out)->device.device_type != kDLCPU) return rvm_raise("ValueError", "expected a CPU tensor, got device type %d", (*out)->device.device_type);
  return 0;
}

/* ---- shape_to_tensor, nonzero ----------------------------------------------------------------- */

int rvm_builtin_run_shape_to_tensor(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self;
  static const char *const names[] = {"shape_tuple"};
  if (arity("relax_shape_to_tensor", n, 1, 1, names)) return -1;
  const TVMFFIShapeCell *s = rvm_as_shape(&args[0]);
  if (!s) return rvm_raise("TypeError", "'%s' object is not iterable", python_type(&args[0]));
  int64_t len = (int64_t)s->size;
  rvm_tensor *t;
  /* numpy makes an empty list a float64 array */
  if (new_tensor(len ? INT64 : FLOAT64, 1, &len, &t)) return -1;
  if (len) memcpy(t->dl.data, s->data, sizeof(int64_t) * (size_t)len);
  *result = rvm_obj_any(t);
  return 0;
}

static bool element_nonzero(DLDataType t, const char *base, int64_t i) {
  int size = t.bits < 8 ? 1 : t.bits / 8;
  const char *p = base + (size_t)i * (size_t)size;
  if (t.code == kDLFloat && t.bits == 32) {
    float f;
    memcpy(&f, p, 4);
    return f != 0;
  }
  if (t.code == kDLFloat && t.bits == 64) {
    double f;
    memcpy(&f, p, 8);
    return f != 0;
  }
  if (t.code == kDLFloat && t.bits == 16) {
    uint16_t h;
    memcpy(&h, p, 2);
    return (h & 0x7fff) != 0;
  }
  for (int b = 0; b < size * t.lanes; b++)
    if (p[b]) return true;
  return false;
}

int rvm_builtin_run_nonzero(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self;
  static const char *const names[] = {"x"};
  if (arity("numpy_nonzero", n, 1, 1, names)) return -1;
  DLTensor *x;
  if (need_tensor(&args[0], &x)) return -1;
  int64_t count = element_count(x), found = 0;
  const char *data = data_of(x);
  for (int64_t i = 0; i < count; i++) found += element_nonzero(x->dtype, data, i);
  int32_t rank = x->ndim ? x->ndim : 1; /* numpy.atleast_1d */
  int64_t shape[2] = {rank, found};
  rvm_tensor *t;
  if (new_tensor(INT64, 2, shape, &t)) return -1;
  int64_t *out = t->dl.data, k = 0;
  for (int64_t i = 0; i < count; i++) {
    if (!element_nonzero(x->dtype, data, i)) continue;
    int64_t rest = i;
    for (int32_t d = rank - 1; d >= 0; d--) {
      int64_t dim = x->ndim ? x->shape[d] : 1;
      out[d * found + k] = rest % dim;
      rest /= dim;
    }
    k++;
  }
  *result = rvm_obj_any(t);
  return 0;
}

/* ---- unique ----------------------------------------------------------------------------------- */

/* Unique works on "rows": the slices along the axis (or single elements without one), compared
 * lexicographically element by element, as numpy compares them. */
typedef struct {
  const DLTensor *x;
  const char *data;
  int64_t rows, row_len;   /* rows along the axis, elements in each */
  int64_t outer, inner;    /* the elements of row r: outer blocks of inner contiguous ones */
  bool is_float, is_signed;
  int elem;
} unique_input;

static double load_f(const unique_input *u, int64_t i) {
  const char *p = u->data + (size_t)i * (size_t)u->elem;
  if (u->elem == 2) {
    uint16_t h;
    memcpy(&h, p, 2);
    return rvm_half_to_float(h);
  }
  if (u->elem == 4) {
    float f;
    memcpy(&f, p, 4);
    return f;
  }
  double d;
  memcpy(&d, p, 8);
  return d;
}

static int64_t load_i(const unique_input *u, int64_t i) {
  const char *p = u->data + (size_t)i * (size_t)u->elem;
  switch (u->elem) {
    case 1: return u->is_signed ? (int64_t)(int8_t)p[0] : (int64_t)(uint8_t)p[0];
    case 2: { int16_t s; uint16_t v; memcpy(&s, p, 2); memcpy(&v, p, 2); return u->is_signed ? (int64_t)s : (int64_t)v; }
    case 4: { int32_t s; uint32_t v; memcpy(&s, p, 4); memcpy(&v, p, 4); return u->is_signed ? (int64_t)s : (int64_t)v; }
    default: { int64_t v; memcpy(&v, p, 8); return v; }
  }
}

/* Flat index of element e of row r. */
static int64_t row_element(const unique_input *u, int64_t r, int64_t e) {
  int64_t o = e / u->inner, i = e % u->inner;
  return (o * u->rows + r) * u->inner + i;
}

/* -1, 0, 1: numpy's order (NaN after everything, NaNs equal to each other). */
static int compare_rows(const unique_input *u, int64_t a, int64_t b) {
  for (int64_t e = 0; e < u->row_len; e++) {
    int64_t ia = row_element(u, a, e), ib = row_element(u, b, e);
    if (u->is_float) {
      double x = load_f(u, ia), y = load_f(u, ib);
      bool nx = isnan(x), ny = isnan(y);
      if (nx || ny) {
        if (nx != ny) return nx ? 1 : -1;
        continue;
      }
      if (x != y) return x < y ? -1 : 1;
    } else if (u->is_signed || u->elem < 8) {
      int64_t x = load_i(u, ia), y = load_i(u, ib);
      if (x != y) return x < y ? -1 : 1;
    } else {
      uint64_t x = (uint64_t)load_i(u, ia), y = (uint64_t)load_i(u, ib);
      if (x != y) return x < y ? -1 : 1;
    }
  }
  return 0;
}

/* Stable merge sort of row numbers. */
static void sort_rows(const unique_input *u, int64_t *rows, int64_t *scratch, int64_t n) {
  for (int64_t width = 1; width < n; width *= 2) {
    for (int64_t lo = 0; lo < n; lo += 2 * width) {
      int64_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
      int64_t a = lo, b = mid, out = lo;
      while (a < mid && b < hi) scratch[out++] = compare_rows(u, rows[b], rows[a]) < 0 ? rows[b++] : rows[a++];
      while (a < mid) scratch[out++] = rows[a++];
      while (b < hi) scratch[out++] = rows[b++];
    }
    memcpy(rows, scratch, sizeof(int64_t) * (size_t)n);
  }
}

static int flag(const TVMFFIAny *v, const char *name, bool *out) {
  if (v->type_index == kTVMFFIInt || v->type_index == kTVMFFIBool) {
    *out = v->v_int64 != 0;
    return 0;
  }
  DLTensor *t = rvm_as_dltensor(v);
  if (t && t->ndim == 0 && t->device.device_type == kDLCPU) {
    *out = element_nonzero(t->dtype, data_of(t), 0);
    return 0;
  }
  return rvm_raise("TypeError", "relax.run.unique: %s must be a bool or int, but got %s", name, python_type(v));
}

/* (x, sorted, return_index, return_inverse, return_counts[, axis]) -> unique values, or a tuple
 * of them and the requested index, inverse and counts tensors (numpy.unique's). */
int rvm_builtin_run_unique(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self;
  static const char *const names[] = {"x", "sorted", "return_index", "return_inverse", "return_counts", "axis"};
  if (arity("numpy_unique", n, 5, 6, names)) return -1;
  DLTensor *x;
  if (need_tensor(&args[0], &x)) return -1;
  bool sorted, want_index, want_inverse, want_counts;
  if (flag(&args[1], "sorted", &sorted) || flag(&args[2], "return_index", &want_index) ||
      flag(&args[3], "return_inverse", &want_inverse) || flag(&args[4], "return_counts", &want_counts))
    return -1;
  bool has_axis = n == 6 && args[5].type_index != kTVMFFINone;
  int64_t axis = 0;
  if (has_axis) {
    if (args[5].type_index != kTVMFFIInt) return rvm_raise("TypeError", "relax.run.unique: axis must be an int, but got %s", python_type(&args[5]));
    axis = args[5].v_int64;
    if (axis < -x->ndim || axis >= x->ndim)
      return rvm_raise("AxisError", "axis %lld is out of bounds for array of dimension %d", (long long)axis, x->ndim);
    if (axis < 0) axis += x->ndim;
  }
  if (x->ndim > 64) {
    return rvm_raise("ValueError", "relax.run.unique: %d dimensions are more than the 64 supported", x->ndim);
  }
  DLDataType dt = x->dtype;
  if (dt.lanes != 1 || !(dt.code == kDLFloat || dt.code == kDLInt || dt.code == kDLUInt || dt.code == kDLBool)) {
    char name[32];
    rvm_format_dtype(dt, name, sizeof name);
    return rvm_raise("TypeError", "relax.run.unique: unsupported dtype %s", name);
  }
  unique_input u = {x, data_of(x), 0, 1, 1, 1, dt.code == kDLFloat, dt.code == kDLInt, dt.bits < 8 ? 1 : dt.bits / 8};
  int64_t total = element_count(x);
  if (has_axis) {
    u.rows = x->shape[axis];
    for (int32_t d = 0; d < x->ndim; d++) {
      if (d < axis) u.outer *= x->shape[d];
      if (d > axis) u.inner *= x->shape[d];
    }
    u.row_len = u.outer * u.inner;
  } else {
    u.rows = total;
  }
  int64_t m = u.rows;
  int64_t *order = rvm_mem_alloc(sizeof(int64_t) * (size_t)(3 * m + 1), "relax.run scratch");
  if (!order) return rvm_raise("MemoryError", "relax.run.unique: out of memory");
  int64_t *scratch = order + m, *group = order + 2 * m; /* group: row -> unique number */
  for (int64_t i = 0; i < m; i++) order[i] = i;
  sort_rows(&u, order, scratch, m);
  /* Runs of equal rows: the first of each (lowest position, by stability) represents it. */
  int64_t groups = 0;
  for (int64_t k = 0; k < m; k++) {
    if (k == 0 || compare_rows(&u, order[k - 1], order[k]) != 0) scratch[groups++] = order[k];
    group[order[k]] = groups - 1;
  }
  /* scratch[g] = first position of sorted group g. Unsorted output orders groups by it. */
  int64_t *rank = rvm_mem_alloc(sizeof(int64_t) * (size_t)(2 * groups + 1), "relax.run scratch");
  if (!rank) {
    rvm_mem_free(order);
    return rvm_raise("MemoryError", "relax.run.unique: out of memory");
  }
  int64_t *slot_of = rank + groups; /* sorted group -> output slot */
  if (sorted) {
    for (int64_t g = 0; g < groups; g++) rank[g] = slot_of[g] = g;
  } else {
    /* numpy's unsorted order: groups by first occurrence */
    for (int64_t g = 0; g < groups; g++) slot_of[g] = -1;
    int64_t next = 0;
    for (int64_t r = 0; r < m; r++) {
      int64_t g = group[r];
      if (slot_of[g] < 0) {
        slot_of[g] = next;
        rank[next++] = g;
      }
    }
  }

  /* values: the input with its axis (or the flattened elements) cut to the groups */
  int64_t vshape[64];
  int32_t vndim = has_axis ? x->ndim : 1;
  if (has_axis) {
    for (int32_t d = 0; d < vndim; d++) vshape[d] = x->shape[d];
    vshape[axis] = groups;
  } else {
    vshape[0] = groups;
  }
  TVMFFIAny outs[4];
  int32_t num_outs = 0;
  rvm_tensor *values;
  int rc = new_tensor(dt, vndim, vshape, &values);
  if (rc == 0) {
    char *dst = values->dl.data;
    size_t es = (size_t)u.elem;
    for (int64_t s = 0; s < groups; s++) {
      int64_t row = scratch[rank[s]];
      for (int64_t e = 0; e < u.row_len; e++) {
        int64_t o = e / u.inner, i = e % u.inner;
        memcpy(dst + (size_t)((o * groups + s) * u.inner + i) * es, u.data + (size_t)row_element(&u, row, e) * es, es);
      }
    }
    outs[num_outs++] = rvm_obj_any(values);
  }
  if (rc == 0 && want_index) {
    rvm_tensor *t;
    rc = new_tensor(INT64, 1, &groups, &t);
    if (rc == 0) {
      for (int64_t s = 0; s < groups; s++) ((int64_t *)t->dl.data)[s] = scratch[rank[s]];
      outs[num_outs++] = rvm_obj_any(t);
    }
  }
  if (rc == 0 && want_inverse) {
    rvm_tensor *t;
    /* numpy 2 keeps the input's shape for the inverse of a flattened unique */
    rc = has_axis ? new_tensor(INT64, 1, &m, &t) : new_tensor(INT64, x->ndim, x->shape, &t);
    if (rc == 0) {
      for (int64_t r = 0; r < m; r++) ((int64_t *)t->dl.data)[r] = slot_of[group[r]];
      outs[num_outs++] = rvm_obj_any(t);
    }
  }
  if (rc == 0 && want_counts) {
    rvm_tensor *t;
    rc = new_tensor(INT64, 1, &groups, &t);
    if (rc == 0) {
      int64_t *c = t->dl.data;
      memset(c, 0, sizeof(int64_t) * (size_t)groups);
      for (int64_t r = 0; r < m; r++) c[slot_of[group[r]]]++;
      outs[num_outs++] = rvm_obj_any(t);
    }
  }
  rvm_mem_free(rank);
  rvm_mem_free(order);
  if (rc == 0 && num_outs == 1) {
    *result = outs[0];
    return 0;
  }
  rvm_array *tuple = rc == 0 ? rvm_array_new(num_outs) : NULL;
  if (!tuple) {
    for (int32_t i = 0; i < num_outs; i++) rvm_any_release(&outs[i]);
    return -1;
  }
  for (int32_t i = 0; i < num_outs; i++) tuple->items[i] = outs[i]; /* moved in */
  *result = rvm_obj_any(tuple);
  return 0;
}

/* ---- print and assert_op ---------------------------------------------------------------------- */

/* Python's str.format over the rendered values: {} and {N} fields with an optional
 * [[fill]align][width] spec (the values are strings), {{ and }} escapes; errors as Python's. */
static int python_format(rvm_text *out, const char *fmt, size_t len, const TVMFFIAny *values, int32_t n) {
  int32_t next_auto = 0;
  int numbering = 0; /* 0 unknown, 1 automatic, 2 manual */
  for (size_t i = 0; i < len; i++) {
    char c = fmt[i];
    if (c == '}') {
      if (i + 1 < len && fmt[i + 1] == '}') {
        rvm_text_append(out, "}", 1);
        i++;
        continue;
      }
      return rvm_raise("ValueError", "Single '}' encountered in format string");
    }
    if (c != '{') {
      rvm_text_append(out, &c, 1);
      continue;
    }
    if (i + 1 < len && fmt[i + 1] == '{') {
      rvm_text_append(out, "{", 1);
      i++;
      continue;
    }
    size_t end = i + 1;
    while (end < len && fmt[end] != '}') end++;
    if (end >= len) return rvm_raise("ValueError", "expected '}' before end of string");
    const char *field = fmt + i + 1;
    size_t flen = end - i - 1;
    const char *colon = memchr(field, ':', flen);
    size_t name_len = colon ? (size_t)(colon - field) : flen;
    int32_t index;
    if (name_len == 0) {
      if (numbering == 2) return rvm_raise("ValueError", "cannot switch from manual field specification to automatic field numbering");
      numbering = 1;
      index = next_auto++;
    } else {
      long long v = 0;
      for (size_t k = 0; k < name_len; k++) {
        if (field[k] < '0' || field[k] > '9') return rvm_raise("KeyError", "'%.*s'", (int)name_len, field);
        v = v * 10 + (field[k] - '0');
        if (v > 1000000) break;
      }
      if (numbering == 1) return rvm_raise("ValueError", "cannot switch from automatic field numbering to manual field specification");
      numbering = 2;
      index = (int32_t)v;
    }
    if (index >= n) return rvm_raise("IndexError", "Replacement index %d out of range for positional args tuple", index);
    rvm_text value = {0};
    rvm_render_value(&value, &values[index]);
    if (value.failed) {
      rvm_text_free(&value);
      out->failed = true; /* the caller reports the MemoryError */
      return 0;
    }
    /* spec: [[fill]align][width] */
    char fill = ' ', align = '<';
    long width = 0;
    if (colon) {
      const char *spec = colon + 1;
      size_t slen = flen - name_len - 1, k = 0;
      if (slen >= 2 && (spec[1] == '<' || spec[1] == '>' || spec[1] == '^')) {
        fill = spec[0];
        align = spec[1];
        k = 2;
      } else if (slen >= 1 && (spec[0] == '<' || spec[0] == '>' || spec[0] == '^')) {
        align = spec[0];
        k = 1;
      }
      for (; k < slen && spec[k] >= '0' && spec[k] <= '9'; k++) width = width * 10 + (spec[k] - '0');
      if (k < slen) {
        rvm_text_free(&value);
        return rvm_raise("ValueError", "Unknown format code '%c' for object of type 'str'", spec[slen - 1]);
      }
    }
    long pad = width > (long)value.len ? width - (long)value.len : 0;
    long before = align == '>' ? pad : align == '^' ? pad / 2 : 0;
    for (long k = 0; k < before; k++) rvm_text_append(out, &fill, 1);
    rvm_text_append(out, value.data ? value.data : "", value.len);
    for (long k = before; k < pad; k++) rvm_text_append(out, &fill, 1);
    rvm_text_free(&value);
    i = end;
  }
  return 0;
}

/* The message of print and assert: the formatted text, or the values joined by `joiner` when
 * the format is empty. */
static int render_message(rvm_text *out, const char *fmt, size_t len, const TVMFFIAny *values, int32_t n, const char *joiner) {
  if (len > 0) return python_format(out, fmt, len, values, n);
  for (int32_t i = 0; i < n; i++) {
    if (i) rvm_text_puts(out, joiner);
    rvm_render_value(out, &values[i]);
  }
  return 0;
}

static int out_of_memory(rvm_text *t) {
  rvm_text_free(t);
  return rvm_raise("MemoryError", "out of memory formatting a message");
}

/* (format, values...): prints one line to stderr. */
int rvm_builtin_run_print(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self, (void)result;
  static const char *const names[] = {"format_str"};
  if (arity("relax_print", n, 1, -1, names)) return -1;
  const char *fmt;
  uint64_t len;
  if (!rvm_as_string(&args[0], &fmt, &len))
    return rvm_raise("AttributeError", "'%s' object has no attribute 'format'", python_type(&args[0]));
  rvm_text text = {0};
  if (render_message(&text, fmt, len, args + 1, n - 1, " ")) {
    rvm_text_free(&text);
    return -1;
  }
  rvm_text_puts(&text, "\n");
  if (text.failed) return out_of_memory(&text);
  fwrite(text.data, 1, text.len, stderr);
  fflush(stderr);
  rvm_text_free(&text);
  return 0;
}

/* (condition, format, values...): raises AssertionError when the condition is false. */
int rvm_builtin_run_assert_op(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self, (void)result;
  static const char *const names[] = {"condition", "format_str"};
  if (arity("relax_assert_op", n, 2, -1, names)) return -1;
  const char *fmt;
  uint64_t len;
  if (!rvm_as_string(&args[1], &fmt, &len))
    return rvm_raise("ValueError", "The format string argument to assert must be a string, given <class '%s'>)",
                     python_type(&args[1]));
  bool holds;
  const TVMFFIAny *c = &args[0];
  if (c->type_index == kTVMFFIInt || c->type_index == kTVMFFIBool) {
    holds = c->v_int64 != 0;
  } else if (c->type_index == kTVMFFITensor || c->type_index == kTVMFFIDLTensorPtr) {
    DLTensor *t = rvm_as_dltensor(c);
    bool is_bool = t->dtype.code == kDLBool && t->dtype.bits == 8 && t->dtype.lanes == 1;
    if (!is_bool) {
      char name[32];
      rvm_format_dtype(t->dtype, name, sizeof name);
      return rvm_raise("ValueError", "The condition must be a bool scalar, but given a %s tensor", name);
    }
    if (t->ndim != 0) {
      rvm_text shape = {0};
      rvm_text_puts(&shape, "(");
      for (int32_t i = 0; i < t->ndim; i++) {
        char buf[32];
        snprintf(buf, sizeof buf, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        rvm_text_puts(&shape, buf);
      }
      rvm_text_puts(&shape, t->ndim == 1 ? ",)" : ")");
      int rc = rvm_raise("ValueError", "The condition must be a scalar, but it has a shape of %s", shape.data ? shape.data : "()");
      rvm_text_free(&shape);
      return rc;
    }
    if (t->device.device_type != kDLCPU) return rvm_raise("ValueError", "relax.run.assert_op: the condition must be on the CPU");
    holds = element_nonzero(t->dtype, data_of(t), 0);
  } else {
    return rvm_raise("ValueError", "The condition for relax assert must be a bool, int, or Tensor, but received a <class '%s'>.",
                     python_type(c));
  }
  if (holds) return 0;
  rvm_text text = {0};
  if (n == 2 && len == 0) {
    rvm_text_puts(&text, "Assertion Failed");
  } else if (render_message(&text, fmt, len, args + 2, n - 2, ", ")) {
    rvm_text_free(&text);
    return -1;
  }
  if (text.failed) return out_of_memory(&text);
  rvm_raise("AssertionError", "%s", text.data ? text.data : "");
  rvm_text_free(&text);
  return -1;
}
