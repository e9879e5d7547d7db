/*
 * conv_transpose.c: relaxc.conv2d_transpose, NCHW transposed convolution (the upsampling layers
 * of detection and segmentation heads, e.g. DBNet's 2x2 stride-2 layers): any stride, padding,
 * output padding, dilation and groups, weights as ONNX and TVM hold them ([c_in, c_out/g, kh,
 * kw], read in place), with the epilogue (per-channel bias, a residual, an activation).
 *
 * It is a GEMM, then a scatter. Per image and group, the GEMM multiplies the weights, read as a
 * [c_out/g * kh * kw, c_in/g] matrix, by the input's pixels [c_in/g, h * w]: column (iy, ix) of
 * the result holds what input pixel (iy, ix) sends through every tap. Each output plane then
 * adds what reaches it, tap by tap in a fixed order (ky, then kx), so no result depends on how
 * the work is split: the same bits at any thread count.
 */
#include <string.h>

#include "rk.h"

enum { NUM_PARAMS = 11 };

typedef struct transpose_args {
  DLTensor *x, *w, *bias, *residual, *out;
  int64_t kh, kw, sh, sw, pad_top, pad_left, dh, dw, groups;
  int64_t n, cin, h, wd, cout, oh, ow;
  rk_epilogue ep;
} transpose_args;

/* Output extent without output padding: (in - 1) * stride - pads + dilation * (k - 1) + 1. */
static int64_t base_extent(int64_t in, int64_t stride, int64_t pads, int64_t dilation, int64_t k) {
  return (in - 1) * stride - pads + dilation * (k - 1) + 1;
}

static int decode(const char *kernel, const TVMFFIAny *args, int32_t num_args, transpose_args *a) {
  *a = (transpose_args){0};
  const int64_t *v;
  int64_t count;
  int rc = rk_check_count(kernel, num_args, 8);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 0, "x", &a->x);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 1, "w", &a->w);
  if (!rc) rc = rk_arg_f32_or_none(kernel, args, num_args, 2, "bias", &a->bias);
  if (!rc) rc = rk_arg_f32_or_none(kernel, args, num_args, 3, "residual", &a->residual);
  if (!rc) rc = rk_arg_shape(kernel, args, num_args, 4, "params", NUM_PARAMS, &v, &count);
  if (!rc) rc = rk_arg_epilogue(kernel, args, num_args, 5, &a->ep);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 7, "out", &a->out);
  if (rc) return rc;
  a->kh = v[0], a->kw = v[1], a->sh = v[2], a->sw = v[3], a->pad_top = v[4], a->pad_left = v[5];
  a->dh = v[8], a->dw = v[9], a->groups = v[10];
  int64_t pad_bottom = v[6], pad_right = v[7];
  if (a->kh < 1 || a->kw < 1 || a->sh < 1 || a->sw < 1 || a->dh < 1 || a->dw < 1 || a->groups < 1 || a->pad_top < 0 ||
      a->pad_left < 0 || pad_bottom < 0 || pad_right < 0)
    return rvm_raise("ValueError", "%s: invalid params [kh %lld, kw %lld, strides %lld %lld, padding %lld %lld %lld %lld, "
                     "dilation %lld %lld, groups %lld]", kernel, (long long)v[0], (long long)v[1], (long long)v[2],
                     (long long)v[3], (long long)v[4], (long long)v[5], (long long)v[6], (long long)v[7], (long long)v[8],
                     (long long)v[9], (long long)v[10]);
  const DLTensor *x = a->x, *w = a->w, *out = a->out;
  if (x->ndim != 4) return rk_shape_error(kernel, "x must be NCHW", x);
  if (out->ndim != 4) return rk_shape_error(kernel, "out must be NCHW", out);
  if (w->ndim != 4) return rk_shape_error(kernel, "w must be [c_in, c_out / groups, kh, kw]", w);
  a->n = x->shape[0], a->cin = x->shape[1], a->h = x->shape[2], a->wd = x->shape[3];
  a->cout = out->shape[1], a->oh = out->shape[2], a->ow = out->shape[3];
  if (a->cin % a->groups || a->cout % a->groups) return rk_shape_error(kernel, "channels must divide into the groups", x);
  if (w->shape[0] != a->cin || w->shape[1] != a->cout / a->groups || w->shape[2] != a->kh || w->shape[3] != a->kw)
    return rk_shape_error(kernel, "w must be [c_in, c_out / groups, kh, kw] as the params say", w);
  int64_t bh = base_extent(a->h, a->sh, a->pad_top + pad_bottom, a->dh, a->kh),
          bw = base_extent(a->wd, a->sw, a->pad_left + pad_right, a->dw, a->kw);
  /* Output padding (ONNX's output_padding) adds rows and columns at the end, fewer than a stride. */
  if (out->shape[0] != a->n || a->oh < bh || a->ow < bw || a->oh - bh >= (a->sh > a->dh ? a->sh : a->dh) ||
      a->ow - bw >= (a->sw > a->dw ? a->sw : a->dw) || bh < 1 || bw < 1)
    return rk_shape_error(kernel, "out does not match x transposed-convolved with these params", out);
  if (a->bias && (a->bias->ndim != 1 || a->bias->shape[0] != a->cout))
    return rk_shape_error(kernel, "bias must have one value per output channel", a->bias);
  if (a->residual) {
    bool same = a->residual->ndim == 4;
    for (int d = 0; same && d < 4; d++) same = a->residual->shape[d] == out->shape[d];
    if (!same) return rk_shape_error(kernel, "residual must have the output's shape", a->residual);
  }
  return 0;
}

typedef struct gather_job {
  const transpose_args *a;
  const float *cols; /* per (image, group): [c_out/g][kh][kw][h * w] */
} gather_job;

/* Output planes (image, channel) [begin, end) of the task's share. Each tap's plane of the GEMM's
 * result is added into the output at its stride, tap after tap (ky, then kx): every output adds
 * what reaches it in that order, whatever the split. */
static int gather_task(int task, int num_tasks, void *ctx) {
  const gather_job *j = ctx;
  const transpose_args *a = j->a;
  int64_t cg = a->cout / a->groups, pixels = a->h * a->wd, begin, end;
  rk_split(a->n * a->cout, task, num_tasks, &begin, &end);
  const float *bias = a->bias ? rk_data(a->bias) : NULL, *residual = a->residual ? rk_data(a->residual) : NULL;
  float *out = rk_data(a->out);
  for (int64_t plane = begin; plane < end; plane++) {
    int64_t image = plane / a->cout, co = plane % a->cout, g = co / cg;
    const float *taps = j->cols + ((image * a->groups + g) * cg + co % cg) * a->kh * a->kw * pixels;
    float *dst = out + plane * a->oh * a->ow;
    memset(dst, 0, sizeof(float) * (size_t)(a->oh * a->ow));
    for (int64_t ky = 0; ky < a->kh; ky++)
      for (int64_t kx = 0; kx < a->kw; kx++) {
        const float *tap = taps + (ky * a->kw + kx) * pixels;
        /* Input columns whose output column ox = ix * sw - pad_left + kx * dw lies in [0, ow). */
        int64_t x0 = a->pad_left - kx * a->dw, ix_lo = x0 > 0 ? (x0 + a->sw - 1) / a->sw : 0;
        int64_t ix_hi = (a->ow - 1 + x0) < 0 ? -1 : (a->ow - 1 + x0) / a->sw;
        if (ix_hi >= a->wd) ix_hi = a->wd - 1;
        for (int64_t iy = 0; iy < a->h; iy++) {
          int64_t oy = iy * a->sh - a->pad_top + ky * a->dh;
          if (oy < 0 || oy >= a->oh) continue;
          float *row = dst + oy * a->ow;
          const float *src = tap + iy * a->wd;
          for (int64_t ix = ix_lo; ix <= ix_hi; ix++) row[ix * a->sw - x0] += src[ix];
        }
      }
    float b = bias ? bias[co] : 0.0f;
    const float *res = residual ? residual + plane * a->oh * a->ow : NULL;
    for (int64_t i = 0; i < a->oh * a->ow; i++) dst[i] = dst[i] * a->ep.alpha + b + (res ? res[i] : 0.0f);
    rk_activate_all(dst, a->oh * a->ow, a->ep.act, a->ep.lo, a->ep.hi);
  }
  return 0;
}

/* (x, w, bias?, residual?, params, act, [alpha, lo, hi], out): NCHW transposed convolution. */
int rvm_builtin_kl_conv2d_transpose(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  (void)self, (void)result;
  static const char kernel[] = "relaxc.conv2d_transpose";
  transpose_args a;
  int rc = decode(kernel, args, num_args, &a);
  if (rc) return rc;
  if (a.n == 0 || a.cout == 0 || a.oh == 0 || a.ow == 0) return 0;
  int64_t cg_in = a.cin / a.groups, cg_out = a.cout / a.groups, taps = cg_out * a.kh * a.kw, pixels = a.h * a.wd;
  int64_t count = a.n * a.groups;
  float *cols = rk_scratch(RK_SLOT_INPUT, sizeof(float) * (size_t)(count * taps * pixels));
  /* The problems, then each group's weights as a matrix (what a problem's pack_a reads). */
  rk_gemm *problems = rk_scratch(RK_SLOT_PROBLEMS, sizeof(rk_gemm) * (size_t)count + sizeof(rk_matrix) * (size_t)a.groups);
  if (!cols || !problems) return rk_out_of_memory(kernel);
  rk_matrix *weights = (rk_matrix *)(problems + count);
  const float *w = rk_data(a.w), *x = rk_data(a.x);
  for (int64_t g = 0; g < a.groups; g++) weights[g] = (rk_matrix){w + g * cg_in * taps, 1, taps};
  for (int64_t image = 0; image < a.n; image++)
    for (int64_t g = 0; g < a.groups; g++) {
      int64_t p = image * a.groups + g;
      problems[p] = (rk_gemm){.m = taps, .n = pixels, .k = cg_in, .pack_a = rk_pack_a_strided, .a = &weights[g],
                              .b = {x + (image * a.cin + g * cg_in) * pixels, pixels, 1}, .c = cols + p * taps * pixels,
                              .c_rs = pixels, .c_cs = 1, .ep = rk_epilogue_none()};
    }
  if ((rc = rk_gemm_run(problems, count))) return rc;
  gather_job job = {&a, cols};
  int64_t planes = a.n * a.cout, work = planes * a.oh * a.ow * a.kh * a.kw;
  return rk_parallel(work < 65536 ? 1 : planes, gather_task, &job);
}
