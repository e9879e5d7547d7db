/*
 * resize.c: relaxc.resize2d, NCHW resizing (nearest and bilinear) with TVM's coordinate
 * transformations and roundings, the upsampling of detectors' and segmenters' necks.
 *
 * Where each output column and row reads the input (indices, and the weights of bilinear
 * interpolation) is worked out once per call, in float32 exactly as TVM's resize2d computes it,
 * so nearest picks TVM's pixels and bilinear gives TVM's results to rounding; then every
 * (image, channel) plane is a loop over rows of table lookups, split over the pool by planes.
 */
#include <math.h>
#include <string.h>

#include "rk.h"

typedef enum { METHOD_NEAREST, METHOD_LINEAR } resize_method;
typedef enum { MODE_HALF_PIXEL, MODE_ALIGN_CORNERS, MODE_ASYMMETRIC, MODE_PYTORCH_HALF_PIXEL, MODE_TF_HALF_PIXEL } coord_mode;
typedef enum { ROUND_DEFAULT, ROUND_EVEN, ROUND_PREFER_FLOOR, ROUND_PREFER_CEIL, ROUND_FLOOR, ROUND_CEIL } rounding;

static const char *const method_names[] = {"nearest_neighbor", "linear"};
static const char *const mode_names[] = {"half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel",
                                         "tf_half_pixel_for_nn"};
static const char *const rounding_names[] = {"", "round", "round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};

/* The input coordinate output index i maps to, in float32 as TVM computes it. */
static float source_coordinate(coord_mode mode, int64_t i, int64_t in, int64_t out) {
  float scale = (float)in / (float)out, x = (float)i;
  switch (mode) {
    case MODE_HALF_PIXEL: return (x + 0.5f) * scale - 0.5f;
    case MODE_ALIGN_CORNERS: return out > 1 ? (float)(in - 1) / (float)(out - 1) * x : 0.0f;
    case MODE_ASYMMETRIC: return scale * x;
    case MODE_PYTORCH_HALF_PIXEL: return out > 1 ? (x + 0.5f) * scale - 0.5f : 0.0f;
    default: return (x + 0.5f) * scale;
  }
}

static int64_t clamp_index(int64_t i, int64_t extent) { return i < 0 ? 0 : (i >= extent ? extent - 1 : i); }

/* The input index nearest output index i reads (clamped to the input). TVM divides in integers
 * instead where an asymmetric floor upsamples by a whole factor, which float32 products could
 * miss by one (x * (1/3) just under an integer). */
static int64_t nearest_index(coord_mode mode, rounding r, int64_t i, int64_t in, int64_t out) {
  if (mode == MODE_ASYMMETRIC && (r == ROUND_DEFAULT || r == ROUND_FLOOR) && out % in == 0 &&
      (double)(out / in) <= 1.0 / (1e-5 * (double)in + 1e-5))
    return clamp_index(i / (out / in), in);
  float x = source_coordinate(mode, i, in, out);
  if (r == ROUND_DEFAULT) r = mode == MODE_ALIGN_CORNERS ? ROUND_EVEN : ROUND_FLOOR;
  float picked;
  switch (r) {
    case ROUND_EVEN: picked = nearbyintf(x); break;
    case ROUND_PREFER_FLOOR: picked = ceilf(x - 0.5f); break;
    case ROUND_PREFER_CEIL: picked = floorf(x + 0.5f); break;
    case ROUND_FLOOR: picked = floorf(x + 1e-5f); break;
    default: picked = ceilf(x - 1e-5f); break;
  }
  return clamp_index((int64_t)picked, in);
}

/* Bilinear taps of output index i: the two input indices (clamped) and the second's weight. */
static void linear_taps(coord_mode mode, int64_t i, int64_t in, int64_t out, int32_t *lo, int32_t *hi, float *t) {
  float x = source_coordinate(mode, i, in, out);
  float base = floorf(x);
  *t = x - base;
  *lo = (int32_t)clamp_index((int64_t)base, in);
  *hi = (int32_t)clamp_index((int64_t)base + 1, in);
}

typedef struct resize_job {
  resize_method method;
  const float *x;
  float *out;
  int64_t planes, h, w, oh, ow;
  const int32_t *x_lo, *x_hi, *y_lo, *y_hi; /* nearest: the _lo tables alone */
  const float *x_t, *y_t;
} resize_job;

static inline __attribute__((always_inline)) void resize_planes(const resize_job *j, int64_t begin, int64_t end) {
  for (int64_t plane = begin; plane < end; plane++) {
    const float *in = j->x + plane * j->h * j->w;
    float *out = j->out + plane * j->oh * j->ow;
    for (int64_t oy = 0; oy < j->oh; oy++) {
      float *o = out + oy * j->ow;
      const float *top = in + j->y_lo[oy] * j->w;
      if (j->method == METHOD_NEAREST) {
        /* Rows that read the same input row as the last are copies of it. */
        if (oy > 0 && j->y_lo[oy] == j->y_lo[oy - 1]) {
          memcpy(o, o - j->ow, sizeof(float) * (size_t)j->ow);
          continue;
        }
        for (int64_t ox = 0; ox < j->ow; ox++) o[ox] = top[j->x_lo[ox]];
        continue;
      }
      const float *bottom = in + j->y_hi[oy] * j->w;
      float ty = j->y_t[oy], uy = 1.0f - ty;
      for (int64_t ox = 0; ox < j->ow; ox++) {
        float tx = j->x_t[ox], ux = 1.0f - tx;
        int32_t a = j->x_lo[ox], b = j->x_hi[ox];
        float upper = top[a] * ux + top[b] * tx, lower = bottom[a] * ux + bottom[b] * tx;
        o[ox] = upper * uy + lower * ty;
      }
    }
  }
}

static int resize_task(int task, int num_tasks, void *ctx) {
  const resize_job *j = ctx;
  int64_t begin, end;
  rk_split(j->planes, task, num_tasks, &begin, &end);
  resize_planes(j, begin, end);
  return 0;
}

/* (x, method, coordinate_mode, rounding, out): NCHW x resized to out's height and width. */
int rvm_builtin_kl_resize2d(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  (void)self, (void)result;
  static const char kernel[] = "relaxc.resize2d";
  DLTensor *x, *out;
  int method = 0, mode = 0, round = 0;
  int rc = rk_check_count(kernel, num_args, 5);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 0, "x", &x);
  if (!rc) rc = rk_arg_name(kernel, args, num_args, 1, "method", method_names, 2, &method);
  if (!rc) rc = rk_arg_name(kernel, args, num_args, 2, "coordinate mode", mode_names, 5, &mode);
  if (!rc) rc = rk_arg_name(kernel, args, num_args, 3, "rounding", rounding_names, 6, &round);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 4, "out", &out);
  if (rc) return rc;
  if (x->ndim != 4) return rk_shape_error(kernel, "x must be NCHW", x);
  if (out->ndim != 4 || out->shape[0] != x->shape[0] || out->shape[1] != x->shape[1])
    return rk_shape_error(kernel, "out must be NCHW with x's batch and channels", out);
  resize_job j = {(resize_method)method, rk_data(x), rk_data(out), x->shape[0] * x->shape[1], x->shape[2], x->shape[3],
                  out->shape[2], out->shape[3], NULL, NULL, NULL, NULL, NULL, NULL};
  if (j.planes == 0 || j.oh == 0 || j.ow == 0) return 0;
  if (j.h == 0 || j.w == 0) return rk_shape_error(kernel, "x has no pixels to resize", x);
  if (j.h > INT32_MAX || j.w > INT32_MAX) return rk_shape_error(kernel, "x is too large", x);
  size_t tables = (size_t)(j.ow + j.oh);
  char *scratch = rk_scratch(RK_SLOT_PROBLEMS, tables * 2 * sizeof(int32_t) + tables * sizeof(float));
  if (!scratch) return rk_out_of_memory(kernel);
  int32_t *x_lo = (int32_t *)scratch, *x_hi = x_lo + j.ow, *y_lo = x_hi + j.ow, *y_hi = y_lo + j.oh;
  float *x_t = (float *)(y_hi + j.oh), *y_t = x_t + j.ow;
  for (int64_t i = 0; i < j.ow; i++) {
    if (method == METHOD_NEAREST)
      x_lo[i] = (int32_t)nearest_index((coord_mode)mode, (rounding)round, i, j.w, j.ow);
    else
      linear_taps((coord_mode)mode, i, j.w, j.ow, &x_lo[i], &x_hi[i], &x_t[i]);
  }
  for (int64_t i = 0; i < j.oh; i++) {
    if (method == METHOD_NEAREST)
      y_lo[i] = (int32_t)nearest_index((coord_mode)mode, (rounding)round, i, j.h, j.oh);
    else
      linear_taps((coord_mode)mode, i, j.h, j.oh, &y_lo[i], &y_hi[i], &y_t[i]);
  }
  j.x_lo = x_lo, j.x_hi = x_hi, j.y_lo = y_lo, j.y_hi = y_hi, j.x_t = x_t, j.y_t = y_t;
  double work = (double)j.planes * (double)(j.oh * j.ow);
  return rk_parallel(work < 65536.0 ? 1 : j.planes, resize_task, &j);
}
