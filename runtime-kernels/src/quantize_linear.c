/*
 * quantize_linear.c: relaxc.dynamic_quantize_linear, ONNX's DynamicQuantizeLinear: float32 to
 * uint8 with the scale and zero point that cover the tensor's range and zero, as ONNX defines
 * them and ONNX Runtime computes them (scale = (max - min) / 255, 1 when max = min; zero point
 * and values rounded half to even, saturated to 0..255; values as x / scale, a division, not a
 * multiplication by its inverse), so that the bytes, and the integer products after them, are
 * ONNX Runtime's.
 *
 * Two passes over x: its range, then the bytes. Minimum and maximum are exact in any order, so
 * the result is the same at any thread count.
 *
 * Also here: relaxc.fake_quantize (a QuantizeLinear -> DequantizeLinear pair in one pass) and
 * relaxc.quantized_softmax (ORT's QLinearSoftmax arithmetic).
 */
#include <float.h>
#include <math.h>

#include "rk.h"

/* v rounded half to even: adding and removing 1.5 * 2^23 leaves an integer in the current
 * (round-to-nearest-even) mode, for |v| < 2^22 (callers clamp v to [-255, 255] first); without
 * -ffast-math the compiler keeps both roundings, and the loop vectorizes where rintf would not. */
static inline float round_even(float v) { return (v + 12582912.0f) - 12582912.0f; }

typedef struct dql_job {
  const float *x;
  uint8_t *y;
  int64_t n;
  float scale, lo, hi, zp; /* values are clamped to [lo, hi] = [-zp, 255 - zp] */
  float lows[64], highs[64]; /* each task's range */
} dql_job;

/* Values per task at least: enough to pay for handing a task to another thread (a classifier's
 * 36,864-value activations split in two took 2.8x as long as on one thread). */
enum { UNIT = 1 << 15 };

/* How many tasks n values make: one per UNIT, at least one. */
static int64_t tasks_for(int64_t n) { return n / UNIT > 1 ? n / UNIT : 1; }

/* The range of x[0..n) with zero, and the bytes of x[0..n); written once, compiled for the
 * baseline and for AVX2 (the same operations per value, so the same bytes). */
static inline __attribute__((always_inline)) void range_of(const float *restrict x, int64_t n, float *lo_out,
                                                           float *hi_out) {
  float lo = 0.0f, hi = 0.0f;
  for (int64_t i = 0; i < n; i++) {
    lo = x[i] < lo ? x[i] : lo;
    hi = x[i] > hi ? x[i] : hi;
  }
  *lo_out = lo;
  *hi_out = hi;
}

static inline __attribute__((always_inline)) void bytes_of(const float *restrict x, uint8_t *restrict y, int64_t n,
                                                           float scale, float lo, float hi, float zp) {
  for (int64_t i = 0; i < n; i++) {
    float v = x[i] / scale;
    v = v < lo ? lo : v;
    v = v > hi ? hi : v;
    y[i] = (uint8_t)(int32_t)(round_even(v) + zp);
  }
}

static void range_portable(const float *x, int64_t n, float *lo, float *hi) { range_of(x, n, lo, hi); }
static void bytes_portable(const float *x, uint8_t *y, int64_t n, float scale, float lo, float hi, float zp) {
  bytes_of(x, y, n, scale, lo, hi, zp);
}
#if defined(__x86_64__)
#include <immintrin.h>

/* Eight running minima and maxima (the compiler will not split the scalar loop's chain, as it
 * cannot know that no NaN comes); _mm256_min_ps(v, m) is the scalar loop's v < m ? v : m. */
RK_AVX2_TARGET static void range_avx2(const float *x, int64_t n, float *lo_out, float *hi_out) {
  __m256 lo = _mm256_setzero_ps(), hi = lo;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    lo = _mm256_min_ps(v, lo);
    hi = _mm256_max_ps(v, hi);
  }
  float los[8], his[8];
  _mm256_storeu_ps(los, lo);
  _mm256_storeu_ps(his, hi);
  range_of(x + i, n - i, lo_out, hi_out);
  for (int l = 0; l < 8; l++) {
    *lo_out = los[l] < *lo_out ? los[l] : *lo_out;
    *hi_out = his[l] > *hi_out ? his[l] : *hi_out;
  }
}
RK_AVX2_TARGET static void bytes_avx2(const float *x, uint8_t *y, int64_t n, float scale, float lo, float hi,
                                      float zp) {
  bytes_of(x, y, n, scale, lo, hi, zp);
}
#endif

static int range_task(int task, int num_tasks, void *ctx) {
  dql_job *j = ctx;
  int64_t begin, end;
  rk_split(j->n, task, num_tasks, &begin, &end);
#if defined(__x86_64__)
  if (rk_cpu_isa() == RK_ISA_AVX2) {
    range_avx2(j->x + begin, end - begin, &j->lows[task], &j->highs[task]);
    return 0;
  }
#endif
  range_portable(j->x + begin, end - begin, &j->lows[task], &j->highs[task]);
  return 0;
}

static int bytes_task(int task, int num_tasks, void *ctx) {
  const dql_job *j = ctx;
  int64_t begin, end;
  rk_split(j->n, task, num_tasks, &begin, &end);
#if defined(__x86_64__)
  if (rk_cpu_isa() == RK_ISA_AVX2) {
    bytes_avx2(j->x + begin, j->y + begin, end - begin, j->scale, j->lo, j->hi, j->zp);
    return 0;
  }
#endif
  bytes_portable(j->x + begin, j->y + begin, end - begin, j->scale, j->lo, j->hi, j->zp);
  return 0;
}

static int arg_u8(const char *kernel, const TVMFFIAny *args, int32_t num_args, int32_t i, const char *name,
                  DLTensor **out) {
  return rk_arg_typed(kernel, args, num_args, i, name, kDLUInt, 8, "uint8", out);
}

/* (x, y, y_scale, y_zero_point): x float32 of any shape, y uint8 of x's shape, y_scale float32
 * and y_zero_point uint8 of one value each. */
int rvm_builtin_kl_dynamic_quantize_linear(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  (void)self, (void)result;
  static const char kernel[] = "relaxc.dynamic_quantize_linear";
  DLTensor *x = NULL, *y = NULL, *scale = NULL, *zp = NULL;
  int rc = rk_check_count(kernel, num_args, 4);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 0, "x", &x);
  if (!rc) rc = arg_u8(kernel, args, num_args, 1, "y", &y);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 2, "y_scale", &scale);
  if (!rc) rc = arg_u8(kernel, args, num_args, 3, "y_zero_point", &zp);
  if (rc) return rc;
  if (!rk_same_shape(y, x)) return rk_shape_error(kernel, "y must have x's shape", y);
  if (rk_numel(scale) != 1) return rk_shape_error(kernel, "y_scale must hold one value", scale);
  if (rk_numel(zp) != 1) return rk_shape_error(kernel, "y_zero_point must hold one value", zp);
  dql_job j = {.x = rk_data(x), .y = (uint8_t *)y->data + y->byte_offset, .n = rk_numel(x)};
  int64_t tasks = tasks_for(j.n);
  tasks = tasks < 64 ? tasks : 64;
  int threads = rk_max_threads();
  tasks = tasks < threads ? tasks : threads;
  /* rk_parallel may run fewer tasks than asked: each writes its own slot, unwritten ones stay 0
   * (inside every range). */
  for (int t = 0; t < 64; t++) j.lows[t] = j.highs[t] = 0.0f;
  rc = rk_parallel(tasks, range_task, &j);
  if (rc) return rc;
  float lo = 0.0f, hi = 0.0f;
  for (int t = 0; t < 64; t++) {
    lo = j.lows[t] < lo ? j.lows[t] : lo;
    hi = j.highs[t] > hi ? j.highs[t] : hi;
  }
  j.scale = hi == lo ? 1.0f : (hi - lo) / 255.0f;
  float initial = 0.0f - lo / j.scale;
  initial = initial < 0.0f ? 0.0f : initial > 255.0f ? 255.0f : initial;
  j.zp = round_even(initial);
  j.lo = -j.zp;
  j.hi = 255.0f - j.zp;
  *rk_data(scale) = j.scale;
  *((uint8_t *)zp->data + zp->byte_offset) = (uint8_t)j.zp;
  return rk_parallel(tasks, bytes_task, &j);
}

/* ---- relaxc.fake_quantize -------------------------------------------------------------------- */

typedef struct fake_job {
  const float *x;
  float *y;
  int64_t n;
  float scale, zp, lo, hi; /* lo, hi: the 8-bit type's range less the zero point */
  float out_scale;         /* the DequantizeLinear's scale (the QuantizeLinear's, or 1 for integers) */
} fake_job;

/* QuantizeLinear then DequantizeLinear with one zero point, as one pass:
 * (saturate(round_even(x / scale) + zp) - zp) * out_scale, each step as ONNX writes it. An
 * out_scale of 1 gives the quantized integers less the zero point (relaxc.onnx's exact int8
 * convolutions take those). */
static inline __attribute__((always_inline)) void fake_of(const float *restrict x, float *restrict y, int64_t n,
                                                          float scale, float lo, float hi, float out_scale) {
  for (int64_t i = 0; i < n; i++) {
    float v = x[i] / scale;
    v = v < lo ? lo : v;
    v = v > hi ? hi : v;
    y[i] = round_even(v) * out_scale;
  }
}

static void fake_portable(const float *x, float *y, int64_t n, float scale, float lo, float hi, float out_scale) {
  fake_of(x, y, n, scale, lo, hi, out_scale);
}
#if defined(__x86_64__)
RK_AVX2_TARGET static void fake_avx2(const float *x, float *y, int64_t n, float scale, float lo, float hi,
                                     float out_scale) {
  fake_of(x, y, n, scale, lo, hi, out_scale);
}
#endif

static int fake_task(int task, int num_tasks, void *ctx) {
  const fake_job *j = ctx;
  int64_t begin, end;
  rk_split(j->n, task, num_tasks, &begin, &end);
#if defined(__x86_64__)
  if (rk_cpu_isa() == RK_ISA_AVX2) {
    fake_avx2(j->x + begin, j->y + begin, end - begin, j->scale, j->lo, j->hi, j->out_scale);
    return 0;
  }
#endif
  fake_portable(j->x + begin, j->y + begin, end - begin, j->scale, j->lo, j->hi, j->out_scale);
  return 0;
}

/* (x, [scale, zero_point, qmin, qmax, out_scale], y): x and y float32 of one shape. */
int rvm_builtin_kl_fake_quantize(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  (void)self, (void)result;
  static const char kernel[] = "relaxc.fake_quantize";
  DLTensor *x = NULL, *y = NULL;
  float p[5];
  int rc = rk_check_count(kernel, num_args, 3);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 0, "x", &x);
  if (!rc) rc = rk_arg_scalars(kernel, args, num_args, 1, "params", 5, p);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 2, "y", &y);
  if (rc) return rc;
  if (!rk_same_shape(y, x)) return rk_shape_error(kernel, "y must have x's shape", y);
  if (!(p[0] > 0.0f) || p[2] > p[3])
    return rvm_raise("ValueError", "%s: params must be [scale > 0, zero_point, qmin <= qmax, out_scale], got [%g, %g, %g, %g, %g]",
                     kernel, (double)p[0], (double)p[1], (double)p[2], (double)p[3], (double)p[4]);
  /* The zero point is added and taken away again: only the clamp depends on it. */
  fake_job j = {rk_data(x), rk_data(y), rk_numel(x), p[0], p[1], p[2] - p[1], p[3] - p[1], p[4]};
  return rk_parallel(tasks_for(j.n), fake_task, &j);
}

/* ---- relaxc.quantized_softmax ---------------------------------------------------------------- */

/* ONNX Runtime's QLinearSoftmax (its CPU kernel, which the QDQ form's DequantizeLinear -> Softmax ->
 * QuantizeLinear also becomes), in its arithmetic, so that the bytes are ORT's: values are taken
 * in the unsigned domain (a signed tensor shifted by 128, as ORT's graph rewriting does), exp of
 * each of the 256 values comes from a table computed in double with a shift that keeps the sums
 * finite, each row's sum is a float sum in order, and y = nearbyint(table[x] * floor(1 / y_scale)
 * / sum) + y_zero_point, capped at 255. A float softmax rounds differently: one step of 1/256 on
 * a classifier's probabilities. */

typedef struct softmax_job {
  const void *x;
  bool x_float, x_signed, y_signed;
  float x_scale, x_zp, y_scale;
  int32_t y_zp; /* in the unsigned domain */
  void *y;
  int64_t rows, width;
  float table[256];
} softmax_job;

/* Element i of x in the unsigned domain (quantized first when x is float). */
static inline int32_t unsigned_value(const softmax_job *j, int64_t i) {
  if (j->x_float) {
    float v = ((const float *)j->x)[i] / j->x_scale;
    float lo = (j->x_signed ? -128.0f : 0.0f) - j->x_zp, hi = (j->x_signed ? 127.0f : 255.0f) - j->x_zp;
    v = v < lo ? lo : v > hi ? hi : v;
    return (int32_t)(round_even(v) + j->x_zp) + (j->x_signed ? 128 : 0);
  }
  return j->x_signed ? (int32_t)((const int8_t *)j->x)[i] + 128 : (int32_t)((const uint8_t *)j->x)[i];
}

static int softmax_task(int task, int num_tasks, void *ctx) {
  const softmax_job *j = ctx;
  int64_t begin, end;
  rk_split(j->rows, task, num_tasks, &begin, &end);
  float y_factor = floorf(1.0f / j->y_scale);
  for (int64_t r = begin; r < end; r++) {
    int64_t base = r * j->width;
    int32_t top = 0;
    for (int64_t c = 0; c < j->width; c += 256) {
      int64_t n = j->width - c < 256 ? j->width - c : 256;
      for (int64_t k = 0; k < n; k++) {
        int32_t v = unsigned_value(j, base + c + k);
        top = v > top ? v : top;
      }
    }
    const float *shifted = j->table + 255 - top;
    float sum = 0.0f;
    for (int64_t c = 0; c < j->width; c++) sum += shifted[unsigned_value(j, base + c)];
    for (int64_t c = 0; c < j->width; c++) {
      int32_t q = 0;
      if (sum != 0.0f) {
        q = (int32_t)nearbyintf((shifted[unsigned_value(j, base + c)] * y_factor) / sum) + j->y_zp;
        q = q > 255 ? 255 : q;
      }
      if (j->y_signed)
        ((int8_t *)j->y)[base + c] = (int8_t)(q - 128);
      else
        ((uint8_t *)j->y)[base + c] = (uint8_t)q;
    }
  }
  return 0;
}

int rvm_builtin_kl_quantized_softmax(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  (void)self, (void)result;
  static const char kernel[] = "relaxc.quantized_softmax";
  DLTensor *x = NULL, *y = NULL;
  float p[5];
  int rc = rk_check_count(kernel, num_args, 3);
  if (rc) return rc;
  x = rvm_as_dltensor(&args[0]);
  if (!x || (x->dtype.code != kDLFloat && x->dtype.bits != 8)) { /* float32, int8 or uint8 */
    rc = rk_arg_typed(kernel, args, num_args, 0, "x", kDLFloat, 32, "float32 (or int8 or uint8)", &x);
  } else {
    rc = rk_arg_typed(kernel, args, num_args, 0, "x", x->dtype.code, x->dtype.code == kDLFloat ? 32 : 8,
                      "float32 (or int8 or uint8)", &x);
  }
  if (!rc) rc = rk_arg_scalars(kernel, args, num_args, 1, "params", 5, p);
  y = rc ? NULL : rvm_as_dltensor(&args[2]);
  if (!rc) rc = rk_arg_typed(kernel, args, num_args, 2, "y", y && y->dtype.code == kDLInt ? kDLInt : kDLUInt, 8, "int8 or uint8", &y);
  if (rc) return rc;
  bool x_float = x->dtype.code == kDLFloat;
  if (x_float ? x->dtype.bits != 32 : (x->dtype.code == kDLFloat || x->dtype.bits != 8))
    return rk_shape_error(kernel, "x must be float32, int8 or uint8", x);
  if (x->ndim < 1 || y->ndim != x->ndim) return rk_shape_error(kernel, "y must have x's shape (rank 1 or more)", y);
  for (int32_t d = 0; d < x->ndim; d++)
    if (x->shape[d] != y->shape[d]) return rk_shape_error(kernel, "y must have x's shape", y);
  if (!(p[0] > 0.0f) || !(p[3] > 0.0f))
    return rvm_raise("ValueError", "%s: the scales must be positive, got x_scale %g and y_scale %g", kernel, (double)p[0],
                     (double)p[3]);
  softmax_job job, *j = &job;
  j->x = (const char *)x->data + x->byte_offset;
  j->y = (char *)y->data + y->byte_offset;
  j->x_float = x_float;
  j->x_signed = x_float ? p[2] != 0.0f : x->dtype.code == kDLInt;
  j->y_signed = y->dtype.code == kDLInt;
  j->x_scale = p[0];
  j->x_zp = p[1];
  j->y_scale = p[3];
  j->y_zp = (int32_t)p[4] + (j->y_signed ? 128 : 0);
  j->width = x->shape[x->ndim - 1];
  j->rows = j->width ? rk_numel(x) / j->width : 0;
  if (j->rows == 0) return 0;
  /* The table: exp((i - 255 + shift) * x_scale), the shift keeping a row's sum below FLT_MAX. */
  double shift = log((double)(FLT_MAX / (float)j->width));
  shift = (shift - 5.0 > 0.0 ? shift - 5.0 : 0.0) / (double)j->x_scale;
  for (int i = 0; i < 256; i++) j->table[i] = (float)exp(((double)i - 255.0 + shift) * (double)j->x_scale);
  return rk_parallel(j->rows * j->width / UNIT > 1 ? j->rows * j->width / UNIT : 1, softmax_task, j);
}

/* ---- relaxc.quantized_binary ----------------------------------------------------------------- */

/* ONNX Runtime's QLinearAdd and QLinearMul (MLAS's x86 kernels), in their arithmetic, so that the
 * bytes are ORT's. Add: c = a * (sa / sc) + (b * (sb / sc) + (zc - (sa / sc * za + sb / sc * zb)))
 * with both steps fused multiply-adds (ORT's AVX2 kernel), and when b is one value for a span of
 * a, its product added separately first. Mul: c = float((a - za) * (b - zb)) * (sa * sb / sc) +
 * zc, a multiply then an add. Then rounded half to even and saturated. Where ORT broadcasts
 * (b constant over a's trailing dimensions: a per-channel scale), the same spans are used. */

typedef struct binary_job {
  const void *a, *b;
  bool a_float, b_float, is_signed, mul;
  float a_in, b_in; /* float operands' QuantizeLinear scales */
  int32_t za, zb, zc;
  float ratio_a, ratio_b, fixed, ratio; /* add's ratios and fixed part; mul's ratio */
  void *c;
  int64_t n, span; /* elements; how many of a share one b (n when b is a's shape: span 1 below) */
  bool b_scalar_spans;
} binary_job;

/* Operand i as an integer: quantized first from float with its scale and zero point. */
static inline int32_t operand(const void *data, bool is_float, bool is_signed, float in_scale, int32_t zp, int64_t i) {
  if (is_float) {
    float lo = (is_signed ? -128.0f : 0.0f) - (float)zp, hi = (is_signed ? 127.0f : 255.0f) - (float)zp;
    float v = ((const float *)data)[i] / in_scale;
    v = v < lo ? lo : v > hi ? hi : v;
    return (int32_t)round_even(v) + zp;
  }
  return is_signed ? (int32_t)((const int8_t *)data)[i] : (int32_t)((const uint8_t *)data)[i];
}

/* v rounded half to even and saturated; clamping to the range's integers first gives the same
 * byte and keeps v where round_even is exact. */
static inline void store_byte(void *c, bool is_signed, int64_t i, float v) {
  float lo = is_signed ? -128.0f : 0.0f, hi = is_signed ? 127.0f : 255.0f;
  v = v < lo ? lo : v > hi ? hi : v;
  float r = round_even(v);
  if (is_signed)
    ((int8_t *)c)[i] = (int8_t)(int32_t)r;
  else
    ((uint8_t *)c)[i] = (uint8_t)(int32_t)r;
}

/* The elements [begin, end), a span (the elements that share one b) at a time. fmaf is an
 * instruction in the AVX2 build (a libm call elsewhere, with the same result). */
static inline __attribute__((always_inline)) void binary_range(const binary_job *j, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end;) {
    int64_t stop = end;
    float fixed = j->fixed, b_term = 0.0f;
    if (j->b_scalar_spans) {
      int64_t bi = i / j->span;
      stop = (bi + 1) * j->span < end ? (bi + 1) * j->span : end;
      int32_t b = operand(j->b, j->b_float, j->is_signed, j->b_in, j->zb, bi);
      fixed = j->fixed + (float)b * j->ratio_b; /* ORT adds a span's b to the fixed part first */
      b_term = (float)(b - j->zb);
    }
    for (; i < stop; i++) {
      int32_t a = operand(j->a, j->a_float, j->is_signed, j->a_in, j->za, i);
      float v;
      if (j->mul) {
        float b = j->b_scalar_spans ? b_term : (float)(operand(j->b, j->b_float, j->is_signed, j->b_in, j->zb, i) - j->zb);
        v = (float)((a - j->za) * (int32_t)b) * j->ratio + (float)j->zc;
      } else if (j->b_scalar_spans) {
        v = fmaf((float)a, j->ratio_a, fixed);
      } else {
        int32_t b = operand(j->b, j->b_float, j->is_signed, j->b_in, j->zb, i);
        v = fmaf((float)a, j->ratio_a, fmaf((float)b, j->ratio_b, fixed));
      }
      store_byte(j->c, j->is_signed, i, v);
    }
  }
}

static void binary_portable(const binary_job *j, int64_t begin, int64_t end) { binary_range(j, begin, end); }
#if defined(__x86_64__)
/* Eight of an operand's values as floats (the quantized integers, zero point included). */
RK_AVX2_TARGET static inline __m256 operand8(const void *data, bool is_float, bool is_signed, float in_scale, int32_t zp,
                                             int64_t i) {
  if (is_float) {
    float lo = (is_signed ? -128.0f : 0.0f) - (float)zp, hi = (is_signed ? 127.0f : 255.0f) - (float)zp;
    __m256 v = _mm256_div_ps(_mm256_loadu_ps((const float *)data + i), _mm256_set1_ps(in_scale));
    v = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(lo)), _mm256_set1_ps(hi));
    __m256 magic = _mm256_set1_ps(12582912.0f);
    v = _mm256_sub_ps(_mm256_add_ps(v, magic), magic);
    return _mm256_add_ps(v, _mm256_set1_ps((float)zp));
  }
  __m128i bytes = _mm_loadl_epi64((const __m128i *)((const uint8_t *)data + i));
  __m256i ints = is_signed ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes);
  return _mm256_cvtepi32_ps(ints);
}

/* Eight results rounded half to even, saturated and stored as bytes. */
RK_AVX2_TARGET static inline void store8(void *c, bool is_signed, int64_t i, __m256 v) {
  v = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(is_signed ? -128.0f : 0.0f)), _mm256_set1_ps(is_signed ? 127.0f : 255.0f));
  __m256i q = _mm256_cvtps_epi32(v); /* the current rounding mode: to nearest, ties to even */
  __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  __m128i words = _mm_packs_epi32(lo, hi);
  __m128i bytes = is_signed ? _mm_packs_epi16(words, words) : _mm_packus_epi16(words, words);
  _mm_storel_epi64((__m128i *)((uint8_t *)c + i), bytes);
}

RK_AVX2_TARGET static void binary_avx2(const binary_job *j, int64_t begin, int64_t end) {
  const __m256 ratio_a = _mm256_set1_ps(j->ratio_a), ratio_b = _mm256_set1_ps(j->ratio_b), ratio = _mm256_set1_ps(j->ratio);
  const __m256 za = _mm256_set1_ps((float)j->za), zb = _mm256_set1_ps((float)j->zb), zc = _mm256_set1_ps((float)j->zc);
  for (int64_t i = begin; i < end;) {
    int64_t stop = end;
    __m256 fixed = _mm256_set1_ps(j->fixed), b_span = _mm256_setzero_ps();
    if (j->b_scalar_spans) {
      int64_t bi = i / j->span;
      stop = (bi + 1) * j->span < end ? (bi + 1) * j->span : end;
      int32_t b = operand(j->b, j->b_float, j->is_signed, j->b_in, j->zb, bi);
      fixed = _mm256_set1_ps(j->fixed + (float)b * j->ratio_b);
      b_span = _mm256_set1_ps((float)(b - j->zb));
    }
    for (; i + 8 <= stop; i += 8) {
      __m256 a = operand8(j->a, j->a_float, j->is_signed, j->a_in, j->za, i), v;
      if (j->mul) {
        __m256 b = j->b_scalar_spans ? b_span : _mm256_sub_ps(operand8(j->b, j->b_float, j->is_signed, j->b_in, j->zb, i), zb);
        v = _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_sub_ps(a, za), b), ratio), zc);
      } else if (j->b_scalar_spans) {
        v = _mm256_fmadd_ps(a, ratio_a, fixed);
      } else {
        __m256 b = operand8(j->b, j->b_float, j->is_signed, j->b_in, j->zb, i);
        v = _mm256_fmadd_ps(a, ratio_a, _mm256_fmadd_ps(b, ratio_b, fixed));
      }
      store8(j->c, j->is_signed, i, v);
    }
    if (i < stop) { /* the span's last few, one at a time */
      binary_range(j, i, stop);
      i = stop;
    }
  }
}
#endif

static int binary_task(int task, int num_tasks, void *ctx) {
  const binary_job *j = ctx;
  int64_t begin, end;
  rk_split(j->n, task, num_tasks, &begin, &end);
#if defined(__x86_64__)
  if (rk_cpu_isa() == RK_ISA_AVX2) {
    binary_avx2(j, begin, end);
    return 0;
  }
#endif
  binary_portable(j, begin, end);
  return 0;
}

/* An 8-bit or float32 operand of the binary kernel. */
static int binary_operand(const char *kernel, const TVMFFIAny *args, int32_t num_args, int32_t i, const char *name,
                          DLTensor **out) {
  DLTensor *t = i < num_args ? rvm_as_dltensor(&args[i]) : NULL;
  if (t && t->dtype.code == kDLFloat) return rk_arg_f32(kernel, args, num_args, i, name, out);
  int code = t && t->dtype.code == kDLInt ? kDLInt : kDLUInt;
  return rk_arg_typed(kernel, args, num_args, i, name, code, 8, "float32, int8 or uint8", out);
}

int rvm_builtin_kl_quantized_binary(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  (void)self, (void)result;
  static const char kernel[] = "relaxc.quantized_binary";
  DLTensor *a = NULL, *b = NULL, *c = NULL;
  float p[9];
  int rc = rk_check_count(kernel, num_args, 4);
  if (!rc) rc = binary_operand(kernel, args, num_args, 0, "a", &a);
  if (!rc) rc = binary_operand(kernel, args, num_args, 1, "b", &b);
  if (!rc) rc = rk_arg_scalars(kernel, args, num_args, 2, "params", 9, p);
  if (!rc) {
    DLTensor *t = rvm_as_dltensor(&args[3]);
    rc = rk_arg_typed(kernel, args, num_args, 3, "c", t && t->dtype.code == kDLInt ? kDLInt : kDLUInt, 8, "int8 or uint8", &c);
  }
  if (rc) return rc;
  bool is_signed = c->dtype.code == kDLInt;
  if ((a->dtype.code != kDLFloat && a->dtype.code != c->dtype.code) || (b->dtype.code != kDLFloat && b->dtype.code != c->dtype.code))
    return rvm_raise("TypeError", "%s: a, b and c must be of one 8-bit type (or float32 operands)", kernel);
  if (!rk_same_shape(c, a)) return rk_shape_error(kernel, "c must have a's shape", c);
  if (!(p[1] > 0.0f) || !(p[4] > 0.0f) || !(p[7] > 0.0f) || !(p[3] > 0.0f) || !(p[6] > 0.0f) || (p[0] != 0.0f && p[0] != 1.0f))
    return rvm_raise("ValueError", "%s: params must be [op 0 or 1, positive scales and zero points], got op %g and scales %g, %g, %g",
                     kernel, (double)p[0], (double)p[1], (double)p[4], (double)p[7]);
  int64_t n = rk_numel(a), nb = rk_numel(b);
  binary_job j = {.b = (const char *)b->data + b->byte_offset, .c = (char *)c->data + c->byte_offset};
  j.a = (const char *)a->data + a->byte_offset;
  j.a_float = a->dtype.code == kDLFloat;
  j.b_float = b->dtype.code == kDLFloat;
  j.is_signed = is_signed;
  j.mul = p[0] == 1.0f;
  j.za = (int32_t)p[2];
  j.a_in = p[3];
  j.zb = (int32_t)p[5];
  j.b_in = p[6];
  j.zc = (int32_t)p[8];
  j.n = n;
  /* b is a's shape, or one value per span of a's trailing dimensions (its shape a's leading
   * dimensions, then ones). */
  if (nb == n && b->ndim == a->ndim && rk_same_shape(b, a)) {
    j.b_scalar_spans = false;
    j.span = 1;
  } else {
    int32_t lead = b->ndim < a->ndim ? b->ndim : a->ndim;
    bool fits = b->ndim <= a->ndim && nb > 0;
    int32_t offset = a->ndim - b->ndim, k = 0;
    for (; fits && k < lead && b->shape[k] == a->shape[offset + k]; k++) {
    }
    for (int32_t d = k; fits && d < b->ndim; d++) fits = b->shape[d] == 1;
    int64_t leading = 1;
    for (int32_t d = 0; d < offset; d++) leading *= a->shape[d];
    fits = fits && (offset == 0 || leading == 1 || nb == 1);
    if (!fits) return rk_shape_error(kernel, "b must be a's shape or constant over a's trailing dimensions", b);
    j.b_scalar_spans = true;
    j.span = n / (nb ? nb : 1);
  }
  if (j.mul) {
    j.ratio = p[1] * p[4] / p[7];
  } else {
    j.ratio_a = p[1] / p[7];
    j.ratio_b = p[4] / p[7];
    j.fixed = (float)j.zc - (j.ratio_a * (float)j.za + j.ratio_b * (float)j.zb);
  }
  if (n == 0) return 0;
  return rk_parallel(tasks_for(n), binary_task, &j);
}
