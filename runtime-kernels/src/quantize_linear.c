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
 */
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
} fake_job;

/* QuantizeLinear then DequantizeLinear with the same scale and zero point, as one pass:
 * (saturate(round_even(x / scale) + zp) - zp) * scale, each step as ONNX writes it. */
static inline __attribute__((always_inline)) void fake_of(const float *restrict x, float *restrict y, int64_t n,
                                                          float scale, float lo, float hi) {
  for (int64_t i = 0; i < n; i++) {
    float v = x[i] / scale;
    v = v < lo ? lo : v;
    v = v > hi ? hi : v;
    y[i] = round_even(v) * scale;
  }
}

static void fake_portable(const float *x, float *y, int64_t n, float scale, float lo, float hi) {
  fake_of(x, y, n, scale, lo, hi);
}
#if defined(__x86_64__)
RK_AVX2_TARGET static void fake_avx2(const float *x, float *y, int64_t n, float scale, float lo, float hi) {
  fake_of(x, y, n, scale, lo, hi);
}
#endif

static int fake_task(int task, int num_tasks, void *ctx) {
  const fake_job *j = ctx;
  int64_t begin, end;
  rk_split(j->n, task, num_tasks, &begin, &end);
#if defined(__x86_64__)
  if (rk_cpu_isa() == RK_ISA_AVX2) {
    fake_avx2(j->x + begin, j->y + begin, end - begin, j->scale, j->lo, j->hi);
    return 0;
  }
#endif
  fake_portable(j->x + begin, j->y + begin, end - begin, j->scale, j->lo, j->hi);
  return 0;
}

/* (x, [scale, zero_point, qmin, qmax], y): x and y float32 of one shape. */
int rvm_builtin_kl_fake_quantize(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  (void)self, (void)result;
  static const char kernel[] = "relaxc.fake_quantize";
  DLTensor *x = NULL, *y = NULL;
  float p[4];
  int rc = rk_check_count(kernel, num_args, 3);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 0, "x", &x);
  if (!rc) rc = rk_arg_scalars(kernel, args, num_args, 1, "params", 4, p);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 2, "y", &y);
  if (rc) return rc;
  if (!rk_same_shape(y, x)) return rk_shape_error(kernel, "y must have x's shape", y);
  if (!(p[0] > 0.0f) || p[2] > p[3])
    return rvm_raise("ValueError", "%s: params must be [scale > 0, zero_point, qmin <= qmax], got [%g, %g, %g, %g]", kernel,
                     (double)p[0], (double)p[1], (double)p[2], (double)p[3]);
  /* The zero point is added and taken away again: only the clamp depends on it. */
  fake_job j = {rk_data(x), rk_data(y), rk_numel(x), p[0], p[1], p[2] - p[1], p[3] - p[1]};
  return rk_parallel(tasks_for(j.n), fake_task, &j);
}
