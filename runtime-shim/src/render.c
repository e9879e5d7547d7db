/*
 * render.c: values as text, the way relax.run.print and relax.run.assert_op show them in TVM.
 *
 * TVM renders those values in Python: a tensor as numpy prints it (`str(array)`), a tuple as
 * "(a, b)", a shape as "(1, 2)", a scalar as Python's str. So that a model prints the same lines
 * under relaxc as under TVM, this file follows numpy 2.x's array2string defaults: shortest
 * round-tripping digits cut at 8 fractional digits, positional or scientific for the whole
 * array, columns padded to one width, lines wrapped at 75 characters, arrays of more than 1000
 * elements summarised with "..." around 3 edge items per axis.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

enum { LINE_WIDTH = 75, THRESHOLD = 1000, EDGE_ITEMS = 3, MAX_PRECISION = 8 };

/* ---- growing strings ------------------------------------------------------------------------ */

bool rvm_text_append(rvm_text *t, const char *s, size_t n) {
  if (t->failed) return false;
  if (t->len + n + 1 > t->cap) {
    size_t cap = t->cap ? t->cap : 64;
    while (cap < t->len + n + 1) cap *= 2;
    char *p = rvm_mem_realloc(t->data, cap, "printed text");
    if (!p) {
      t->failed = true;
      return false;
    }
    t->data = p;
    t->cap = cap;
  }
  memcpy(t->data + t->len, s, n);
  t->len += n;
  t->data[t->len] = 0;
  return true;
}

bool rvm_text_puts(rvm_text *t, const char *s) { return rvm_text_append(t, s, strlen(s)); }

static void spaces(rvm_text *t, int n) {
  for (int i = 0; i < n; i++) rvm_text_append(t, " ", 1);
}

void rvm_text_free(rvm_text *t) {
  rvm_mem_free(t->data);
  t->data = NULL;
  t->len = t->cap = 0;
}

/* ---- numbers --------------------------------------------------------------------------------- */

static uint16_t float_to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000, exp = (x >> 23) & 0xff, mant = x & 0x7fffff;
  if (exp == 0xff) return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 : 0));
  int e = (int)exp - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7c00);
  if (e <= 0) {
    if (e < -10) return (uint16_t)sign;
    mant |= 0x800000;
    int shift = 14 - e;
    uint32_t half = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t half = sign | (uint32_t)e << 10 | mant >> 13, rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++;
  return (uint16_t)half;
}

float rvm_half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {
      int e = -1;
      do {
        e++;
        mant <<= 1;
      } while (!(mant & 0x400));
      bits = sign | (uint32_t)(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* The float of `bits` bits next to x (finite, non-negative) upwards or downwards, as a double. */
static double neighbour(double x, int bits, bool up) {
  if (bits == 32) return nextafterf((float)x, up ? INFINITY : -INFINITY);
  if (bits == 64) return nextafter(x, up ? INFINITY : -INFINITY);
  uint16_t h = float_to_half((float)x);
  if (h == 0) return up ? rvm_half_to_float(1) : -(double)rvm_half_to_float(1);
  return rvm_half_to_float((uint16_t)(up ? h + 1 : h - 1));
}

/* Whether decimal text s identifies x among floats of `bits` bits: it reads back strictly
 * inside x's rounding interval. numpy's Dragon4 treats the interval's ends as outside, so a
 * decimal exactly halfway between two floats never counts, whichever way it would round. */
static bool round_trips(const char *s, double x, int bits) {
  double d = strtod(s, NULL);
  if (bits == 64) return d == x;
  double lo = (x + neighbour(x, bits, false)) / 2, hi = (x + neighbour(x, bits, true)) / 2;
  return d > lo && d < hi;
}

/* The shortest significant digits that read back as x (finite, non-negative): digits d[0..n)
 * meaning d[0].d[1]... x 10^exp10. */
typedef struct {
  char d[24];
  int n;
  int exp10;
} digits;

static void shortest_digits(double x, int bits, digits *out) {
  char buf[40];
  for (int prec = 0; prec <= 16; prec++) {
    snprintf(buf, sizeof buf, "%.*e", prec, x);
    if (prec == 16 || round_trips(buf, x, bits)) break;
  }
  /* buf is "D.DDDDe[+-]XX" */
  out->n = 0;
  const char *p = buf;
  for (; *p && *p != 'e'; p++)
    if (*p >= '0' && *p <= '9') out->d[out->n++] = *p;
  out->exp10 = atoi(p + 1);
  while (out->n > 1 && out->d[out->n - 1] == '0') out->n--;
}

/* Positional text of |x| with its shortest digits, cut at `max_frac` fractional digits:
 * integer part and fractional part (trailing zeros trimmed). */
static void positional(double ax, int bits, int max_frac, char *int_part, char *frac_part) {
  digits d;
  shortest_digits(ax, bits, &d);
  int frac = d.n - 1 - d.exp10;
  if (ax != 0 && frac > max_frac) {
    char buf[400];
    snprintf(buf, sizeof buf, "%.*f", max_frac, ax);
    char *dot = strchr(buf, '.');
    *dot = 0;
    strcpy(int_part, buf);
    strcpy(frac_part, dot + 1);
    size_t len = strlen(frac_part);
    while (len > 0 && frac_part[len - 1] == '0') frac_part[--len] = 0;
    return;
  }
  int ip = 0, fp = 0;
  if (d.exp10 < 0) {
    int_part[ip++] = '0';
    for (int i = 0; i < -d.exp10 - 1; i++) frac_part[fp++] = '0';
    for (int i = 0; i < d.n; i++) frac_part[fp++] = d.d[i];
  } else {
    for (int i = 0; i <= d.exp10; i++) int_part[ip++] = i < d.n ? d.d[i] : '0';
    for (int i = d.exp10 + 1; i < d.n; i++) frac_part[fp++] = d.d[i];
  }
  if (ax == 0) {
    ip = 0;
    int_part[ip++] = '0';
    fp = 0;
  }
  int_part[ip] = 0;
  frac_part[fp] = 0;
}

/* Scientific text of |x|: mantissa digits (first, then fractional, cut at max_frac) and the
 * exponent. */
static void scientific(double ax, int bits, int max_frac, char *lead, char *frac_part, int *exp10) {
  digits d;
  shortest_digits(ax, bits, &d);
  if (d.n - 1 > max_frac) {
    char buf[40];
    snprintf(buf, sizeof buf, "%.*e", max_frac, ax);
    d.n = 0;
    const char *p = buf;
    for (; *p != 'e'; p++)
      if (*p >= '0' && *p <= '9') d.d[d.n++] = *p;
    d.exp10 = atoi(p + 1);
    while (d.n > 1 && d.d[d.n - 1] == '0') d.n--;
  }
  lead[0] = d.d[0];
  lead[1] = 0;
  memcpy(frac_part, d.d + 1, (size_t)(d.n - 1));
  frac_part[d.n - 1] = 0;
  *exp10 = d.exp10;
}

/* ---- tensors ---------------------------------------------------------------------------------- */

typedef enum { ELEM_INT, ELEM_UINT, ELEM_BOOL, ELEM_FLOAT, ELEM_OTHER } elem_kind;

typedef struct {
  elem_kind kind;
  int bits;
  /* floats: the layout numpy chose for the whole array */
  bool exp_format;
  int pad_left, pad_right, precision, exp_size;
  /* ints and bools */
  int width;
} elem_format;

static elem_kind kind_of(DLDataType t) {
  if (t.lanes != 1) return ELEM_OTHER;
  if (t.code == kDLBool || (t.code == kDLUInt && t.bits == 1)) return ELEM_BOOL;
  if (t.code == kDLInt && (t.bits == 8 || t.bits == 16 || t.bits == 32 || t.bits == 64)) return ELEM_INT;
  if (t.code == kDLUInt && (t.bits == 8 || t.bits == 16 || t.bits == 32 || t.bits == 64)) return ELEM_UINT;
  if (t.code == kDLFloat && (t.bits == 16 || t.bits == 32 || t.bits == 64)) return ELEM_FLOAT;
  return ELEM_OTHER;
}

typedef union {
  int64_t i;
  uint64_t u;
  double f;
} number;

static number load(DLDataType t, const char *base, int64_t i) {
  number v;
  int size = t.bits < 8 ? 1 : t.bits / 8;
  const char *p = base + i * size;
  elem_kind k = kind_of(t);
  if (k == ELEM_FLOAT) {
    if (t.bits == 16) {
      uint16_t h;
      memcpy(&h, p, 2);
      v.f = rvm_half_to_float(h);
    } else if (t.bits == 32) {
      float f;
      memcpy(&f, p, 4);
      v.f = f;
    } else {
      memcpy(&v.f, p, 8);
    }
  } else if (k == ELEM_INT) {
    switch (size) {
      case 1: { int8_t x; memcpy(&x, p, 1); v.i = x; break; }
      case 2: { int16_t x; memcpy(&x, p, 2); v.i = x; break; }
      case 4: { int32_t x; memcpy(&x, p, 4); v.i = x; break; }
      default: memcpy(&v.i, p, 8);
    }
  } else {
    v.u = 0;
    memcpy(&v.u, p, (size_t)size); /* little-endian */
  }
  return v;
}

/* The elements numpy looks at to choose a format: all, or the edges of a summarised array. */
typedef struct {
  const DLTensor *t;
  const char *data;
  bool summarise;
} array_view;

static bool in_view(const array_view *a, int64_t flat) {
  if (!a->summarise) return true;
  for (int32_t d = a->t->ndim - 1; d >= 0; d--) {
    int64_t n = a->t->shape[d], i = flat % n;
    flat /= n;
    if (n > 2 * EDGE_ITEMS && i >= EDGE_ITEMS && i < n - EDGE_ITEMS) return false;
  }
  return true;
}

static int int_width_signed(int64_t v) {
  char buf[32];
  return snprintf(buf, sizeof buf, "%lld", (long long)v);
}

static int int_width_unsigned(uint64_t v) {
  char buf[32];
  return snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
}

static double exp_cutoff(int bits) { return bits == 16 ? 1e3 : bits == 32 ? 1e6 : 1e8; }

static void choose_format(const array_view *a, int64_t count, elem_format *f) {
  memset(f, 0, sizeof *f);
  DLDataType t = a->t->dtype;
  f->kind = kind_of(t);
  f->bits = t.bits;
  if (f->kind == ELEM_BOOL) {
    f->width = a->t->ndim == 0 ? 0 : 5;
    return;
  }
  if (f->kind == ELEM_INT || f->kind == ELEM_UINT) {
    for (int64_t i = 0; i < count; i++) {
      if (!in_view(a, i)) continue;
      number v = load(t, a->data, i);
      int w = f->kind == ELEM_INT ? int_width_signed(v.i) : int_width_unsigned(v.u);
      if (w > f->width) f->width = w;
    }
    return;
  }
  if (f->kind != ELEM_FLOAT) return;
  double max_abs = 0, min_abs = INFINITY;
  bool any_finite = false, any_nonfinite = false, neg_inf = false;
  for (int64_t i = 0; i < count; i++) {
    if (!in_view(a, i)) continue;
    double x = load(t, a->data, i).f;
    if (!isfinite(x)) {
      any_nonfinite = true;
      neg_inf |= isinf(x) && x < 0;
      continue;
    }
    any_finite = true;
    double ax = fabs(x);
    if (ax != 0) {
      if (ax > max_abs) max_abs = ax;
      if (ax < min_abs) min_abs = ax;
    }
  }
  if (max_abs > 0 && (max_abs >= exp_cutoff(t.bits) || min_abs < 0.0001 || max_abs / min_abs > 1000.))
    f->exp_format = true;
  f->exp_size = -1;
  if (any_finite) {
    for (int64_t i = 0; i < count; i++) {
      if (!in_view(a, i)) continue;
      double x = load(t, a->data, i).f;
      if (!isfinite(x)) continue;
      char ip[400], fp[400];
      int sign = signbit(x) ? 1 : 0, e = 0;
      if (f->exp_format) {
        scientific(fabs(x), t.bits, MAX_PRECISION, ip, fp, &e);
        char eb[16];
        int es = snprintf(eb, sizeof eb, "%02d", abs(e));
        if (es > f->exp_size) f->exp_size = es;
      } else {
        positional(fabs(x), t.bits, MAX_PRECISION, ip, fp);
      }
      int il = (int)strlen(ip) + sign, fl = (int)strlen(fp);
      if (il > f->pad_left) f->pad_left = il;
      if (fl > f->pad_right) f->pad_right = fl;
    }
    if (f->exp_format) {
      f->precision = f->pad_right;
      f->pad_right = f->exp_size + 2 + f->precision;
    }
  }
  if (any_nonfinite) {
    int offset = f->pad_right + 1;
    if (3 - offset > f->pad_left) f->pad_left = 3 - offset;
    if (3 + (neg_inf ? 1 : 0) - offset > f->pad_left) f->pad_left = 3 + (neg_inf ? 1 : 0) - offset;
  }
}

static void format_float(rvm_text *out, const elem_format *f, double x) {
  if (!isfinite(x)) {
    const char *s = isnan(x) ? "nan" : x < 0 ? "-inf" : "inf";
    spaces(out, f->pad_left + f->pad_right + 1 - (int)strlen(s));
    rvm_text_puts(out, s);
    return;
  }
  char ip[400], fp[400];
  const char *sign = signbit(x) ? "-" : "";
  if (f->exp_format) {
    /* Every element gets the array's number of fractional digits, continued past its shortest
     * digits with the exact value's own (numpy's min_digits): plain correct rounding. */
    char buf[64];
    snprintf(buf, sizeof buf, "%.*e", f->precision, fabs(x));
    char *e = strchr(buf, 'e');
    *e = 0;
    int exp10 = atoi(e + 1);
    spaces(out, f->pad_left - (int)strlen(buf) + f->precision + (f->precision > 0 ? 1 : 0) - (int)strlen(sign));
    rvm_text_puts(out, sign);
    rvm_text_puts(out, buf);
    if (f->precision == 0) rvm_text_puts(out, ".");
    char eb[16];
    snprintf(eb, sizeof eb, "e%c%0*d", exp10 < 0 ? '-' : '+', f->exp_size, abs(exp10));
    rvm_text_puts(out, eb);
    return;
  }
  positional(fabs(x), f->bits, MAX_PRECISION, ip, fp);
  spaces(out, f->pad_left - (int)strlen(ip) - (int)strlen(sign));
  rvm_text_puts(out, sign);
  rvm_text_puts(out, ip);
  rvm_text_puts(out, ".");
  rvm_text_puts(out, fp);
  spaces(out, f->pad_right - (int)strlen(fp));
}

static void format_element(rvm_text *out, const elem_format *f, DLDataType t, const char *data, int64_t i) {
  number v = load(t, data, i);
  char buf[32];
  switch (f->kind) {
    case ELEM_BOOL: {
      const char *s = v.u ? "True" : "False";
      spaces(out, f->width - (int)strlen(s));
      rvm_text_puts(out, s);
      return;
    }
    case ELEM_INT:
      spaces(out, f->width - snprintf(buf, sizeof buf, "%lld", (long long)v.i));
      rvm_text_puts(out, buf);
      return;
    case ELEM_UINT:
      spaces(out, f->width - snprintf(buf, sizeof buf, "%llu", (unsigned long long)v.u));
      rvm_text_puts(out, buf);
      return;
    case ELEM_FLOAT:
      format_float(out, f, v.f);
      return;
    default:
      rvm_text_puts(out, "?");
  }
}

/* numpy's _formatArray: nested brackets, wrapping each innermost row at the line width. */
typedef struct {
  const array_view *a;
  const elem_format *f;
  rvm_text *out;
} array_printer;

static void extend_line(rvm_text *s, rvm_text *line, const char *word, size_t word_len, size_t width, const char *indent) {
  bool wrap = line->len + word_len > width && line->len > strlen(indent);
  if (wrap) {
    size_t n = line->len;
    while (n > 0 && line->data[n - 1] == ' ') n--;
    rvm_text_append(s, line->data, n);
    rvm_text_puts(s, "\n");
    line->len = 0;
    rvm_text_puts(line, indent);
  }
  rvm_text_append(line, word, word_len);
}

static void print_axis(const array_printer *p, int32_t axis, int64_t offset, const char *indent, size_t width, rvm_text *s) {
  const DLTensor *t = p->a->t;
  int64_t n = t->shape[axis], stride = 1;
  for (int32_t d = axis + 1; d < t->ndim; d++) stride *= t->shape[d];
  bool summary = p->a->summarise && n > 2 * EDGE_ITEMS;
  int64_t leading = summary ? EDGE_ITEMS : 0, trailing = summary ? EDGE_ITEMS : n;
  size_t indent_len = strlen(indent);
  char *next_indent = rvm_mem_alloc(indent_len + 2, "printed text");
  if (!next_indent) {
    s->failed = true;
    return;
  }
  memcpy(next_indent, indent, indent_len);
  next_indent[indent_len] = ' ';
  next_indent[indent_len + 1] = 0;
  size_t next_width = width - 1;
  rvm_text body = {0};
  bool lost = false; /* a part ran out of memory: so does the whole */
  int32_t axes_left = t->ndim - axis;
  /* the items in print order: leading ones, the summary mark, trailing ones */
  int64_t items = leading + trailing + (summary ? 1 : 0);
  if (axes_left == 1) {
    size_t elem_width = width - 1;
    rvm_text line = {0};
    rvm_text_puts(&line, indent);
    for (int64_t k = 0; k < items; k++) {
      rvm_text word = {0};
      if (summary && k == leading) {
        rvm_text_puts(&word, "...");
      } else {
        int64_t i = k < leading ? k : n - (items - k);
        format_element(&word, p->f, t->dtype, p->a->data, offset + i * stride);
      }
      extend_line(&body, &line, word.data ? word.data : "", word.len, elem_width, indent);
      lost |= word.failed;
      rvm_text_free(&word);
      if (k + 1 < items) rvm_text_puts(&line, " ");
    }
    rvm_text_append(&body, line.data ? line.data : "", line.len);
    lost |= line.failed;
    rvm_text_free(&line);
  } else {
    for (int64_t k = 0; k < items; k++) {
      rvm_text_puts(&body, indent);
      if (summary && k == leading) {
        rvm_text_puts(&body, "...");
      } else {
        int64_t i = k < leading ? k : n - (items - k);
        print_axis(p, axis + 1, offset + i * stride, next_indent, next_width, &body);
      }
      if (k + 1 < items)
        for (int32_t nl = 0; nl < axes_left - 1; nl++) rvm_text_puts(&body, "\n");
    }
  }
  rvm_text_puts(s, "[");
  if (body.len > indent_len) rvm_text_append(s, body.data + indent_len, body.len - indent_len);
  rvm_text_puts(s, "]");
  if (lost || body.failed) s->failed = true;
  rvm_text_free(&body);
  rvm_mem_free(next_indent);
}

static void render_scalar_float(rvm_text *out, double x, int bits) {
  if (isnan(x)) {
    rvm_text_puts(out, "nan");
    return;
  }
  if (isinf(x)) {
    rvm_text_puts(out, x < 0 ? "-inf" : "inf");
    return;
  }
  double ax = fabs(x), cutoff = bits == 16 ? 1e3 : bits == 32 ? 1e6 : 1e16;
  if (signbit(x)) rvm_text_puts(out, "-");
  char ip[400], fp[400];
  if (ax == 0 || (ax >= 1e-4 && ax < cutoff)) {
    positional(ax, bits, 400, ip, fp);
    rvm_text_puts(out, ip);
    rvm_text_puts(out, ".");
    rvm_text_puts(out, fp[0] ? fp : "0");
    return;
  }
  int e;
  scientific(ax, bits, 17, ip, fp, &e);
  rvm_text_puts(out, ip);
  if (fp[0]) {
    rvm_text_puts(out, ".");
    rvm_text_puts(out, fp);
  }
  char eb[16];
  snprintf(eb, sizeof eb, "e%c%02d", e < 0 ? '-' : '+', abs(e));
  rvm_text_puts(out, eb);
}

static void render_tensor(rvm_text *out, const DLTensor *t) {
  if (t->device.device_type != kDLCPU) {
    rvm_text_puts(out, "<tensor on a device>");
    return;
  }
  int64_t count = 1;
  for (int32_t i = 0; i < t->ndim; i++) count *= t->shape[i];
  const char *data = (const char *)t->data + t->byte_offset;
  if (kind_of(t->dtype) == ELEM_OTHER) {
    char name[32];
    rvm_format_dtype(t->dtype, name, sizeof name);
    rvm_text_puts(out, "<");
    rvm_text_puts(out, name);
    rvm_text_puts(out, " tensor>");
    return;
  }
  if (t->ndim == 0) {
    number v = load(t->dtype, data, 0);
    char buf[32];
    switch (kind_of(t->dtype)) {
      case ELEM_BOOL: rvm_text_puts(out, v.u ? "True" : "False"); break;
      case ELEM_INT: snprintf(buf, sizeof buf, "%lld", (long long)v.i); rvm_text_puts(out, buf); break;
      case ELEM_UINT: snprintf(buf, sizeof buf, "%llu", (unsigned long long)v.u); rvm_text_puts(out, buf); break;
      default: render_scalar_float(out, v.f, t->dtype.bits); break;
    }
    return;
  }
  if (count == 0) {
    rvm_text_puts(out, "[]");
    return;
  }
  array_view a = {t, data, count > THRESHOLD};
  elem_format f;
  choose_format(&a, count, &f);
  array_printer p = {&a, &f, out};
  print_axis(&p, 0, 0, " ", LINE_WIDTH, out);
}

/* Python's str of a float: repr's shortest digits, positional between 1e-4 and 1e16. */
static void render_python_float(rvm_text *out, double x) { render_scalar_float(out, x, 64); }

void rvm_render_value(rvm_text *out, const TVMFFIAny *v) {
  char buf[64];
  const char *s;
  uint64_t n;
  switch (v->type_index) {
    case kTVMFFINone: rvm_text_puts(out, "None"); return;
    case kTVMFFIBool: rvm_text_puts(out, v->v_int64 ? "True" : "False"); return;
    case kTVMFFIInt: snprintf(buf, sizeof buf, "%lld", (long long)v->v_int64); rvm_text_puts(out, buf); return;
    case kTVMFFIFloat: render_python_float(out, v->v_float64); return;
    case kTVMFFIDataType: rvm_format_dtype(v->v_dtype, buf, sizeof buf); rvm_text_puts(out, buf); return;
    case kTVMFFIShape: {
      const TVMFFIShapeCell *c = rvm_as_shape(v);
      rvm_text_puts(out, "(");
      for (uint64_t i = 0; i < c->size; i++) {
        snprintf(buf, sizeof buf, "%s%lld", i ? ", " : "", (long long)c->data[i]);
        rvm_text_puts(out, buf);
      }
      rvm_text_puts(out, c->size == 1 ? ",)" : ")");
      return;
    }
    case kTVMFFIArray: {
      const rvm_array *a = (const rvm_array *)v->v_obj;
      rvm_text_puts(out, "(");
      for (int64_t i = 0; i < a->cell.size; i++) {
        if (i) rvm_text_puts(out, ", ");
        rvm_render_value(out, &a->items[i]);
      }
      rvm_text_puts(out, ")");
      return;
    }
    case kTVMFFITensor:
    case kTVMFFIDLTensorPtr: render_tensor(out, rvm_as_dltensor(v)); return;
    default:
      if (rvm_as_string(v, &s, &n)) {
        rvm_text_append(out, s, n);
        return;
      }
      rvm_text_puts(out, "<");
      rvm_text_puts(out, rvm_type_name(v));
      rvm_text_puts(out, ">");
  }
}
