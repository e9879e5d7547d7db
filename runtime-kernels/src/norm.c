/*
 * norm.c: relaxc.softmax, relaxc.layer_norm and relaxc.rms_norm along the last axis, split over
 * the pool by rows.
 *
 * Sums over a row run in SUM_LANES partial sums combined in a fixed order, so a row's result
 * depends only on the row: the loops vectorize (compiled once portably and once for AVX2), and
 * the split into tasks never changes a bit.
 */
#include <stdio.h>

#include "rk.h"
#include "rk_math.h"

enum { SUM_LANES = 8 };

/* The lanes of a partial sum, combined in one fixed order. */
RK_INLINE float combine(const float *lanes) {
  return ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
}

RK_INLINE float row_sum(const float *x, int64_t n) {
  float lanes[SUM_LANES] = {0};
  int64_t i = 0;
  for (; i + SUM_LANES <= n; i += SUM_LANES)
    for (int l = 0; l < SUM_LANES; l++) lanes[l] += x[i + l];
  for (int l = 0; i < n; i++, l++) lanes[l] += x[i];
  return combine(lanes);
}

/* sum of (x - mean)^2, or of x^2 when mean is 0. */
RK_INLINE float row_squares(const float *x, int64_t n, float mean, const bool fused) {
  float lanes[SUM_LANES] = {0};
  int64_t i = 0;
  for (; i + SUM_LANES <= n; i += SUM_LANES)
    for (int l = 0; l < SUM_LANES; l++) {
      float d = x[i + l] - mean;
      lanes[l] = rk_madd(fused, d, d, lanes[l]);
    }
  for (int l = 0; i < n; i++, l++) {
    float d = x[i] - mean;
    lanes[l] = rk_madd(fused, d, d, lanes[l]);
  }
  return combine(lanes);
}

/* The sum of the float squares x^2 in double precision, as llama.cpp's RMS norm takes it (it
 * adds them one by one; in double the order moves the sum by about 1e-13 of itself, which the
 * float mean rounded from it almost never shows). With the float mean llama.cpp rounds, a
 * quantized model's activations round to int8 as its do: a float sum's last-bit differences
 * flipped some of them, each moving a random-weight model's logits by about 1e-2. */
RK_INLINE double row_squares_double(const float *x, int64_t n) {
  double lanes[SUM_LANES] = {0};
  int64_t i = 0;
  for (; i + SUM_LANES <= n; i += SUM_LANES)
    for (int l = 0; l < SUM_LANES; l++) lanes[l] += (double)(x[i + l] * x[i + l]);
  for (int l = 0; i < n; i++, l++) lanes[l] += (double)(x[i] * x[i]);
  return ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
}

/* The largest of x[0..n), NaN when x[0] is NaN, other NaNs passed over (a compare and select
 * per value, as `x > max ? x : max` from x[0] would). In SUM_LANES running maxima, so that it
 * vectorizes: one chain of dependent selects was most of a softmax over 128 values. Where
 * several equal maxima differ in sign (+0 and -0) the lane order may pick either, which
 * changes no output: x - max is the same for both, and exp(+0) = exp(-0). */
RK_INLINE float row_max(const float *x, int64_t n) {
  float lanes[SUM_LANES];
  for (int l = 0; l < SUM_LANES; l++) lanes[l] = x[0];
  int64_t i = 0;
  for (; i + SUM_LANES <= n; i += SUM_LANES)
    for (int l = 0; l < SUM_LANES; l++) lanes[l] = x[i + l] > lanes[l] ? x[i + l] : lanes[l];
  for (int l = 0; i < n; i++, l++) lanes[l] = x[i] > lanes[l] ? x[i] : lanes[l];
  float max = lanes[0];
  for (int l = 1; l < SUM_LANES; l++) max = lanes[l] > max ? lanes[l] : max;
  return max;
}

typedef enum { NORM_SOFTMAX, NORM_LAYER, NORM_RMS } norm_kind;

typedef struct norm_job {
  norm_kind kind;
  const float *x, *gamma, *beta;
  float *out;
  int64_t rows, n;
  float eps;
} norm_job;

RK_INLINE void norm_rows(const norm_job *j, int64_t begin, int64_t end, const bool fused) {
  int64_t n = j->n;
  for (int64_t row = begin; row < end; row++) {
    const float *x = j->x + row * n;
    float *y = j->out + row * n;
    if (j->kind == NORM_SOFTMAX) {
      float max = row_max(x, n);
      for (int64_t i = 0; i < n; i++) y[i] = rk_exp(x[i] - max);
      float inv = 1.0f / row_sum(y, n);
      for (int64_t i = 0; i < n; i++) y[i] = y[i] * inv;
    } else if (j->kind == NORM_LAYER) {
      float mean = row_sum(x, n) / (float)n;
      float var = row_squares(x, n, mean, fused) / (float)n;
      float inv = 1.0f / __builtin_sqrtf(var + j->eps);
      for (int64_t i = 0; i < n; i++) y[i] = rk_madd(fused, (x[i] - mean) * inv, j->gamma[i], j->beta ? j->beta[i] : 0.0f);
    } else {
      float mean = (float)(row_squares_double(x, n) / (double)n);
      float inv = 1.0f / __builtin_sqrtf(mean + j->eps);
      for (int64_t i = 0; i < n; i++) y[i] = x[i] * inv * j->gamma[i];
    }
  }
}

static void norm_generic(const norm_job *j, int64_t begin, int64_t end) { norm_rows(j, begin, end, RK_PORTABLE_FUSED); }

#if defined(__x86_64__)
RK_AVX2_TARGET static void norm_avx2(const norm_job *j, int64_t begin, int64_t end) { norm_rows(j, begin, end, true); }
#endif

static int norm_task(int task, int num_tasks, void *ctx) {
  const norm_job *j = ctx;
  int64_t begin, end;
  rk_split(j->rows, task, num_tasks, &begin, &end);
#if defined(__x86_64__)
  if (rk_cpu_isa() == RK_ISA_AVX2) {
    norm_avx2(j, begin, end);
    return 0;
  }
#endif
  norm_generic(j, begin, end);
  return 0;
}

static int run_norm(const char *kernel, norm_job *j, const DLTensor *x, const DLTensor *out) {
  if (x->ndim < 1) return rk_shape_error(kernel, "x must have rank 1 or more", x);
  if (!rk_same_shape(out, x)) return rk_shape_error(kernel, "out must have x's shape", out);
  j->n = x->shape[x->ndim - 1];
  j->rows = j->n ? rk_numel(x) / j->n : 0;
  j->x = rk_data(x), j->out = rk_data(out);
  if (j->rows == 0 || j->n == 0) return 0;
  double work = (double)j->rows * (double)j->n;
  return rk_parallel(work < 16384.0 ? 1 : j->rows, norm_task, j);
}

static int check_param(const char *kernel, const DLTensor *p, const char *name, int64_t n) {
  if (p && (p->ndim != 1 || p->shape[0] != n)) {
    char what[64];
    snprintf(what, sizeof what, "%s must have one value per element of the last axis (%lld)", name, (long long)n);
    return rk_shape_error(kernel, what, p);
  }
  return 0;
}

/* (x, out): softmax along the last axis. */
int rvm_builtin_kl_softmax(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  (void)self, (void)result;
  static const char kernel[] = "relaxc.softmax";
  DLTensor *x, *out;
  int rc = rk_check_count(kernel, num_args, 2);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 0, "x", &x);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 1, "out", &out);
  if (rc) return rc;
  norm_job j = {.kind = NORM_SOFTMAX};
  return run_norm(kernel, &j, x, out);
}

/* (x, gamma, beta, [eps], out): (x - mean) / sqrt(var + eps) * gamma + beta along the last axis. */
int rvm_builtin_kl_layer_norm(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  (void)self, (void)result;
  static const char kernel[] = "relaxc.layer_norm";
  DLTensor *x, *gamma, *beta, *out;
  float eps = 0;
  int rc = rk_check_count(kernel, num_args, 5);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 0, "x", &x);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 1, "gamma", &gamma);
  if (!rc) rc = rk_arg_f32_or_none(kernel, args, num_args, 2, "beta", &beta);
  if (!rc) rc = rk_arg_scalars(kernel, args, num_args, 3, "eps", 1, &eps);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 4, "out", &out);
  if (rc) return rc;
  int64_t n = x->ndim ? x->shape[x->ndim - 1] : 0;
  rc = check_param(kernel, gamma, "gamma", n);
  if (!rc) rc = check_param(kernel, beta, "beta", n);
  if (rc) return rc;
  norm_job j = {.kind = NORM_LAYER, .gamma = rk_data(gamma), .beta = beta ? rk_data(beta) : NULL, .eps = eps};
  return run_norm(kernel, &j, x, out);
}

/* (x, weight, [eps], out): x / sqrt(mean(x^2) + eps) * weight along the last axis. */
int rvm_builtin_kl_rms_norm(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  (void)self, (void)result;
  static const char kernel[] = "relaxc.rms_norm";
  DLTensor *x, *weight, *out;
  float eps = 0;
  int rc = rk_check_count(kernel, num_args, 4);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 0, "x", &x);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 1, "weight", &weight);
  if (!rc) rc = rk_arg_scalars(kernel, args, num_args, 2, "eps", 1, &eps);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 3, "out", &out);
  if (rc) return rc;
  rc = check_param(kernel, weight, "weight", x->ndim ? x->shape[x->ndim - 1] : 0);
  if (rc) return rc;
  norm_job j = {.kind = NORM_RMS, .gamma = rk_data(weight), .eps = eps};
  return run_norm(kernel, &j, x, out);
}
