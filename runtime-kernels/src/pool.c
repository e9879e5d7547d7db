/*
 * pool.c: relaxc.max_pool2d, relaxc.avg_pool2d and relaxc.global_avg_pool2d over NCHW tensors,
 * split over the pool by (image, channel) planes.
 *
 * Windows follow TVM's pooling: padding counts as the lowest float for max (so a window wholly
 * in the padding gives -FLT_MAX, as TVM's does), and avg divides by the taps inside the input,
 * or by those inside the padded input when count_include_pad is set. The output's extent is
 * taken from the output tensor, so TVM's ceil_mode needs nothing more.
 */
#include <float.h>
#include <string.h>

#include "rk.h"

typedef struct pool_params {
  int64_t kh, kw, sh, sw, pad_top, pad_left, pad_bottom, pad_right, dh, dw;
} pool_params;

typedef struct pool_job {
  pool_params p;
  bool max, count_include_pad;
  const float *x;
  float *out;
  int64_t planes, h, w, oh, ow;
} pool_job;

/* The taps [*lo, *hi) of a window starting at `start` (with dilation d, k taps) that land inside
 * [0, extent), and how many land inside the padded extent [-pad_before, extent + pad_after). */
static void tap_range(int64_t start, int64_t k, int64_t d, int64_t extent, int64_t pad_before, int64_t pad_after,
                      int64_t *lo, int64_t *hi, int64_t *padded) {
  *lo = 0, *hi = k, *padded = 0;
  while (*lo < k && start + *lo * d < 0) (*lo)++;
  while (*hi > *lo && start + (*hi - 1) * d >= extent) (*hi)--;
  for (int64_t t = 0; t < k; t++) {
    int64_t at = start + t * d;
    *padded += at >= -pad_before && at < extent + pad_after;
  }
}

/* One plane of average pooling whose windows may cross the padding: the taps inside the input
 * summed, divided by those inside the input or, with count_include_pad, the padded input. (Max
 * pooling of such planes is max_plane_separable's.) */
static void avg_plane(const pool_job *j, int64_t plane, int64_t *ranges) {
  const pool_params *p = &j->p;
  const float *in = j->x + plane * j->h * j->w;
  float *out = j->out + plane * j->oh * j->ow;
  int64_t w = j->w, ow = j->ow, sw = p->sw, dw = p->dw, dh = p->dh;
  bool include_pad = j->count_include_pad;
  /* Each output column's taps inside the input, and inside the padded input. */
  int64_t *s_lo = ranges, *s_hi = ranges + ow, *s_pad = ranges + 2 * ow;
  for (int64_t ox = 0; ox < ow; ox++)
    tap_range(ox * sw - p->pad_left, p->kw, dw, w, p->pad_left, p->pad_right, &s_lo[ox], &s_hi[ox], &s_pad[ox]);
  for (int64_t oy = 0; oy < j->oh; oy++) {
    int64_t y0 = oy * p->sh - p->pad_top, r_lo, r_hi, r_pad;
    tap_range(y0, p->kh, dh, j->h, p->pad_top, p->pad_bottom, &r_lo, &r_hi, &r_pad);
    for (int64_t ox = 0; ox < ow; ox++) {
      const float *corner = in + y0 * w + ox * sw - p->pad_left;
      int64_t lo = s_lo[ox], hi = s_hi[ox];
      float acc = 0.0f;
      for (int64_t r = r_lo; r < r_hi; r++) {
        const float *row = corner + r * dh * w;
        for (int64_t t = lo; t < hi; t++) acc = acc + row[t * dw];
      }
      int64_t count = include_pad ? r_pad * s_pad[ox] : (r_hi - r_lo) * (hi - lo);
      out[oy * ow + ox] = count > 0 ? acc / (float)count : 0.0f;
    }
  }
}

/* One plane whose every window lies inside the input (no padding, none past the edge): tap by
 * tap over a whole output row, so the loop over the row vectorizes; each output still sums its
 * taps in avg_plane's order (row by row), so the bits are the same. `sw` is a constant once
 * inlined. */
static inline __attribute__((always_inline)) void pool_plane_inside(const pool_job *j, int64_t plane, const bool max,
                                                                   const int64_t sw) {
  const pool_params *p = &j->p;
  const float *in = j->x + plane * j->h * j->w;
  float *out = j->out + plane * j->oh * j->ow;
  int64_t ow = j->ow;
  for (int64_t oy = 0; oy < j->oh; oy++) {
    float *o = out + oy * ow;
    for (int64_t ox = 0; ox < ow; ox++) o[ox] = max ? -FLT_MAX : 0.0f;
    for (int64_t r = 0; r < p->kh; r++)
      for (int64_t t = 0; t < p->kw; t++) {
        const float *row = in + (oy * p->sh + r * p->dh) * j->w + t * p->dw;
        if (max) {
          for (int64_t ox = 0; ox < ow; ox++) o[ox] = row[ox * sw] > o[ox] ? row[ox * sw] : o[ox];
        } else {
          for (int64_t ox = 0; ox < ow; ox++) o[ox] = o[ox] + row[ox * sw];
        }
      }
    if (!max) {
      float count = (float)(p->kh * p->kw);
      for (int64_t ox = 0; ox < ow; ox++) o[ox] = o[ox] / count;
    }
  }
}

/* Max pooling of one plane in two passes: each input row's maxima over the windows' columns
 * (the row copied between -FLT_MAX borders first), then each output's maximum over its window's
 * rows of those. kh + kw comparisons an output instead of kh * kw, and both passes run along
 * rows, so they vectorize (YOLO's 13x13 pooling at 13x13: 670 us a layer before). A maximum
 * does not depend on the order its values are seen in, and padding and rows outside the input
 * count as -FLT_MAX (TVM's lowest value for max pooling), so the results are a direct search's.
 * `scratch` holds h * ow + w + pad_left + pad_right floats. */
static inline __attribute__((always_inline)) void max_plane_separable(const pool_job *j, int64_t plane, float *scratch,
                                                                     const int64_t sw) {
  const pool_params *p = &j->p;
  const float *in = j->x + plane * j->h * j->w;
  float *out = j->out + plane * j->oh * j->ow;
  int64_t ow = j->ow, wp = j->w + p->pad_left + p->pad_right;
  float *rows = scratch, *padded = scratch + j->h * ow;
  for (int64_t x = 0; x < p->pad_left; x++) padded[x] = -FLT_MAX;
  for (int64_t x = p->pad_left + j->w; x < wp; x++) padded[x] = -FLT_MAX;
  for (int64_t y = 0; y < j->h; y++) {
    memcpy(padded + p->pad_left, in + y * j->w, sizeof(float) * (size_t)j->w);
    float *r = rows + y * ow;
    for (int64_t ox = 0; ox < ow; ox++) r[ox] = -FLT_MAX;
    for (int64_t t = 0; t < p->kw; t++) {
      const float *src = padded + t * p->dw;
      /* Windows past the padded row's end (an output extent taken from a ceil-mode shape) read
       * nothing there. */
      int64_t end = ow;
      while (end > 0 && (end - 1) * sw + t * p->dw >= wp) end--;
      for (int64_t ox = 0; ox < end; ox++) r[ox] = src[ox * sw] > r[ox] ? src[ox * sw] : r[ox];
    }
  }
  for (int64_t oy = 0; oy < j->oh; oy++) {
    float *o = out + oy * ow;
    for (int64_t ox = 0; ox < ow; ox++) o[ox] = -FLT_MAX;
    for (int64_t t = 0; t < p->kh; t++) {
      int64_t y = oy * p->sh + t * p->dh - p->pad_top;
      if (y < 0 || y >= j->h) continue;
      const float *r = rows + y * ow;
      for (int64_t ox = 0; ox < ow; ox++) o[ox] = r[ox] > o[ox] ? r[ox] : o[ox];
    }
  }
}

/* Planes [begin, end), the stride a constant where it is 1 (the loops vectorize). */
static inline __attribute__((always_inline)) void max_planes_separable(const pool_job *j, int64_t begin, int64_t end,
                                                                      float *scratch) {
  for (int64_t plane = begin; plane < end; plane++) {
    if (j->p.sw == 1) max_plane_separable(j, plane, scratch, 1);
    else max_plane_separable(j, plane, scratch, j->p.sw);
  }
}

static void max_separable_generic(const pool_job *j, int64_t begin, int64_t end, float *scratch) {
  max_planes_separable(j, begin, end, scratch);
}

#if defined(__x86_64__)
RK_AVX2_TARGET static void max_separable_avx2(const pool_job *j, int64_t begin, int64_t end, float *scratch) {
  max_planes_separable(j, begin, end, scratch);
}
#endif

/* Whether every window of the job lies inside the input. */
static bool windows_inside(const pool_job *j) {
  const pool_params *p = &j->p;
  return p->pad_top == 0 && p->pad_left == 0 && (j->oh - 1) * p->sh + (p->kh - 1) * p->dh < j->h &&
         (j->ow - 1) * p->sw + (p->kw - 1) * p->dw < j->w;
}

static int pool_task(int task, int num_tasks, void *ctx) {
  const pool_job *j = ctx;
  int64_t begin, end;
  rk_split(j->planes, task, num_tasks, &begin, &end);
  if (begin == end) return 0;
  bool inside = windows_inside(j);
  if (j->max && !(inside && j->p.sw <= 2 && j->p.kh * j->p.kw <= 9)) {
    size_t floats = (size_t)(j->h * j->ow + j->w + j->p.pad_left + j->p.pad_right);
    float *scratch = rk_scratch(RK_SLOT_INPUT, sizeof(float) * floats);
    if (!scratch) return rk_out_of_memory("relaxc.max_pool2d");
#if defined(__x86_64__)
    if (rk_cpu_isa() == RK_ISA_AVX2) {
      max_separable_avx2(j, begin, end, scratch);
      return 0;
    }
#endif
    max_separable_generic(j, begin, end, scratch);
    return 0;
  }
  /* Here max pooling's windows are all inside and small; average pooling's any. */
  int64_t *ranges = rk_scratch(RK_SLOT_INPUT, sizeof(int64_t) * 3 * (size_t)j->ow);
  if (!ranges) return rk_out_of_memory(j->max ? "relaxc.max_pool2d" : "relaxc.avg_pool2d");
  for (int64_t plane = begin; plane < end; plane++) {
    if (inside && j->p.sw <= 2) {
      if (j->max) {
        if (j->p.sw == 1) pool_plane_inside(j, plane, true, 1);
        else pool_plane_inside(j, plane, true, 2);
      } else {
        if (j->p.sw == 1) pool_plane_inside(j, plane, false, 1);
        else pool_plane_inside(j, plane, false, 2);
      }
    } else {
      avg_plane(j, plane, ranges);
    }
  }
  return 0;
}

static int run_pool(const char *kernel, const TVMFFIAny *args, int32_t num_args, bool max) {
  DLTensor *x, *out;
  const int64_t *v = NULL;
  int64_t n = 0, include_pad = 0;
  int rc = rk_check_count(kernel, num_args, max ? 3 : 4);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 0, "x", &x);
  if (!rc) rc = rk_arg_shape(kernel, args, num_args, 1, "params", 10, &v, &n);
  if (!rc && !max) rc = rk_arg_int(kernel, args, num_args, 2, "count_include_pad", &include_pad);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, max ? 2 : 3, "out", &out);
  if (rc) return rc;
  pool_job j = {{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9]}, max, include_pad != 0, NULL, NULL, 0, 0, 0, 0, 0};
  const pool_params *p = &j.p;
  if (p->kh < 1 || p->kw < 1 || p->sh < 1 || p->sw < 1 || p->dh < 1 || p->dw < 1 || p->pad_top < 0 || p->pad_left < 0 ||
      p->pad_bottom < 0 || p->pad_right < 0)
    return rvm_raise("ValueError", "%s: invalid params", kernel);
  if (x->ndim != 4) return rk_shape_error(kernel, "x must be NCHW", x);
  if (out->ndim != 4 || out->shape[0] != x->shape[0] || out->shape[1] != x->shape[1])
    return rk_shape_error(kernel, "out must be NCHW with x's batch and channels", out);
  j.x = rk_data(x), j.out = rk_data(out);
  j.planes = x->shape[0] * x->shape[1], j.h = x->shape[2], j.w = x->shape[3], j.oh = out->shape[2], j.ow = out->shape[3];
  if (j.planes == 0 || j.oh == 0 || j.ow == 0) return 0;
  double work = (double)j.planes * (double)(j.oh * j.ow) * (double)(p->kh * p->kw);
  return rk_parallel(work < 65536.0 ? 1 : j.planes, pool_task, &j);
}

/* (x, params, out): params = [kh, kw, stride_h, stride_w, pad_top, pad_left, pad_bottom,
 * pad_right, dilation_h, dilation_w]. */
int rvm_builtin_kl_max_pool2d(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  (void)self, (void)result;
  return run_pool("relaxc.max_pool2d", args, num_args, true);
}

/* (x, params, count_include_pad, out). */
int rvm_builtin_kl_avg_pool2d(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  (void)self, (void)result;
  return run_pool("relaxc.avg_pool2d", args, num_args, false);
}

/* ---- global average --------------------------------------------------------------------------- */

/* Each plane's sum in ONNX Runtime's order (MLAS's global pooling): four lanes over whole groups
 * of four, combined as (0 + 2) + (1 + 3), then the last values one by one, then divided by the
 * count. A dynamically quantized model quantizes each pooled tensor over its whole range, so an
 * ulp away from ORT's mean could move every value of the next layer. The lanes vectorize. */
enum { SUM_LANES = 4 };

typedef struct mean_job {
  const float *x;
  float *out;
  int64_t planes, size;
} mean_job;

static int mean_task(int task, int num_tasks, void *ctx) {
  const mean_job *j = ctx;
  int64_t begin, end;
  rk_split(j->planes, task, num_tasks, &begin, &end);
  for (int64_t plane = begin; plane < end; plane++) {
    const float *in = j->x + plane * j->size;
    float lanes[SUM_LANES] = {0};
    int64_t i = 0;
    for (; i + SUM_LANES <= j->size; i += SUM_LANES)
      for (int l = 0; l < SUM_LANES; l++) lanes[l] += in[i + l];
    float sum = (lanes[0] + lanes[2]) + (lanes[1] + lanes[3]);
    for (; i < j->size; i++) sum += in[i];
    j->out[plane] = sum / (float)j->size;
  }
  return 0;
}

/* (x, out): out[n, c, 0, 0] = the mean of x[n, c]. */
int rvm_builtin_kl_global_avg_pool2d(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  (void)self, (void)result;
  static const char kernel[] = "relaxc.global_avg_pool2d";
  DLTensor *x, *out;
  int rc = rk_check_count(kernel, num_args, 2);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 0, "x", &x);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 1, "out", &out);
  if (rc) return rc;
  if (x->ndim != 4) return rk_shape_error(kernel, "x must be NCHW", x);
  if (out->ndim != 4 || out->shape[0] != x->shape[0] || out->shape[1] != x->shape[1] || out->shape[2] != 1 ||
      out->shape[3] != 1)
    return rk_shape_error(kernel, "out must be [n, c, 1, 1]", out);
  mean_job j = {rk_data(x), rk_data(out), x->shape[0] * x->shape[1], x->shape[2] * x->shape[3]};
  if (j.planes == 0) return 0;
  if (j.size == 0) return rvm_raise("ValueError", "%s: x has no elements to average", kernel);
  return rk_parallel((double)j.planes * (double)j.size < 65536.0 ? 1 : j.planes, mean_task, &j);
}
