/*
 * conv.c: relaxc.conv2d (NCHW, any stride, padding, dilation and groups, weights prepacked by
 * relaxc.tvm) and relaxc.conv2d_depthwise, both with the GEMM epilogue (per-channel bias, a
 * residual, an activation).
 *
 * A convolution is a GEMM whose rows are output pixels, columns output channels and reduction
 * (input channel, kernel row, kernel column): the packer gathers each strip of pixels straight
 * from the (padded) image, so no im2col matrix is ever built, and the micro-kernel's tile is
 * written back transposed into the NCHW output. Depthwise convolution has a reduction of only
 * kh * kw per output, so it is its own loop, vectorized over output columns on a copy of each
 * channel padded and split into stride phases (every tap then reads consecutive floats).
 */
#include <string.h>

#include "rk.h"

/* Convolution attributes, in the order of the params shape. */
typedef struct conv_params {
  int64_t kh, kw, sh, sw, pad_top, pad_left, pad_bottom, pad_right, dh, dw, groups;
} conv_params;

enum { NUM_PARAMS = 11 };

static int parse_params(const char *kernel, const TVMFFIAny *args, int32_t num_args, int32_t i, conv_params *p) {
  const int64_t *v;
  int64_t n;
  int rc = rk_arg_shape(kernel, args, num_args, i, "params", NUM_PARAMS, &v, &n);
  if (rc) return rc;
  *p = (conv_params){v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10]};
  if (p->kh < 1 || p->kw < 1 || p->sh < 1 || p->sw < 1 || p->dh < 1 || p->dw < 1 || p->groups < 1 || p->pad_top < 0 ||
      p->pad_left < 0 || p->pad_bottom < 0 || p->pad_right < 0)
    return rvm_raise("ValueError", "%s: invalid params [kh %lld, kw %lld, strides %lld %lld, padding %lld %lld %lld %lld, "
                     "dilation %lld %lld, groups %lld]", kernel, (long long)p->kh, (long long)p->kw, (long long)p->sh,
                     (long long)p->sw, (long long)p->pad_top, (long long)p->pad_left, (long long)p->pad_bottom,
                     (long long)p->pad_right, (long long)p->dh, (long long)p->dw, (long long)p->groups);
  return 0;
}

/* Output extent of one spatial axis. */
static int64_t out_extent(int64_t in, int64_t pad, int64_t k, int64_t stride, int64_t dilation) {
  int64_t span = dilation * (k - 1) + 1;
  return in + pad < span ? 0 : (in + pad - span) / stride + 1;
}

/* Checks x, out, bias and residual against the params; fills the output extents. */
static int check_shapes(const char *kernel, const conv_params *p, const DLTensor *x, const DLTensor *out,
                        const DLTensor *bias, const DLTensor *residual, int64_t *oh, int64_t *ow) {
  if (x->ndim != 4) return rk_shape_error(kernel, "x must be NCHW", x);
  if (out->ndim != 4) return rk_shape_error(kernel, "out must be NCHW", out);
  if (x->shape[1] % p->groups || out->shape[1] % p->groups)
    return rk_shape_error(kernel, "channels must divide into the groups", x);
  *oh = out_extent(x->shape[2], p->pad_top + p->pad_bottom, p->kh, p->sh, p->dh);
  *ow = out_extent(x->shape[3], p->pad_left + p->pad_right, p->kw, p->sw, p->dw);
  if (out->shape[0] != x->shape[0] || out->shape[2] != *oh || out->shape[3] != *ow)
    return rk_shape_error(kernel, "out does not match x convolved with these params", out);
  if (bias && (bias->ndim != 1 || bias->shape[0] != out->shape[1]))
    return rk_shape_error(kernel, "bias must have one value per output channel", bias);
  if (residual) {
    bool same = residual->ndim == 4;
    for (int d = 0; same && d < 4; d++) same = residual->shape[d] == out->shape[d];
    if (!same) return rk_shape_error(kernel, "residual must have the output's shape", residual);
  }
  return 0;
}

/* x with the padding written out: [n][c][hp][wp], or x itself when there is none. */
static const float *padded_input(const conv_params *p, const DLTensor *x, int64_t *hp, int64_t *wp) {
  int64_t n = x->shape[0], c = x->shape[1], h = x->shape[2], w = x->shape[3];
  *hp = h + p->pad_top + p->pad_bottom;
  *wp = w + p->pad_left + p->pad_right;
  if (*hp == h && *wp == w) return rk_data(x);
  float *dst = rk_scratch(RK_SLOT_INPUT, sizeof(float) * (size_t)(n * c * *hp * *wp));
  if (!dst) return NULL;
  const float *src = rk_data(x);
  for (int64_t plane = 0; plane < n * c; plane++) {
    float *d = dst + plane * *hp * *wp;
    const float *s = src + plane * h * w;
    memset(d, 0, sizeof(float) * (size_t)(p->pad_top * *wp));
    for (int64_t y = 0; y < h; y++) {
      float *row = d + (p->pad_top + y) * *wp;
      memset(row, 0, sizeof(float) * (size_t)p->pad_left);
      memcpy(row + p->pad_left, s + y * w, sizeof(float) * (size_t)w);
      memset(row + p->pad_left + w, 0, sizeof(float) * (size_t)p->pad_right);
    }
    memset(d + (p->pad_top + h) * *wp, 0, sizeof(float) * (size_t)(p->pad_bottom * *wp));
  }
  return dst;
}

/* ---- relaxc.conv2d ------------------------------------------------------------------------------ */

/* What the packer of one (image, group) reads. */
typedef struct conv_a {
  const float *image; /* the group's first input channel, padded */
  const conv_params *p;
  int64_t hp, wp, ow;
} conv_a;

/* Packs output pixels [m0, m0 + mr) by reduction steps [k0, k0 + kc) (k = (ic, r, s)). */
static void pack_conv_a(const void *operand, int64_t m0, int64_t mr, int64_t k0, int64_t kc, float *dst) {
  const conv_a *a = operand;
  const conv_params *p = a->p;
  int64_t base[RK_MR];
  for (int64_t r = 0; r < mr; r++) {
    int64_t pixel = m0 + r, y = pixel / a->ow, x = pixel % a->ow;
    base[r] = y * p->sh * a->wp + x * p->sw;
  }
  if (mr < RK_MR) memset(dst, 0, sizeof(float) * RK_MR * (size_t)kc);
  int64_t taps = p->kh * p->kw, plane = a->hp * a->wp;
  int64_t ic = k0 / taps, tap = k0 % taps, kr = tap / p->kw, ks = tap % p->kw;
  for (int64_t k = 0; k < kc; k++) {
    const float *src = a->image + ic * plane + kr * p->dh * a->wp + ks * p->dw;
    float *d = dst + k * RK_MR;
    for (int64_t r = 0; r < mr; r++) d[r] = src[base[r]];
    if (++ks == p->kw) {
      ks = 0;
      if (++kr == p->kh) {
        kr = 0;
        ic++;
      }
    }
  }
}

/* (x, w_packed, bias, residual, params, activation, [alpha, lo, hi], out); params = [kh, kw,
 * stride_h, stride_w, pad_top, pad_left, pad_bottom, pad_right, dilation_h, dilation_w, groups];
 * w_packed [groups, ceil(oc_per_group / 16), (c / groups) * kh * kw, 16]. */
int rvm_builtin_kl_conv2d(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  (void)self, (void)result;
  static const char kernel[] = "relaxc.conv2d";
  DLTensor *x, *w, *bias, *residual, *out;
  conv_params p = {0};
  rk_epilogue ep = {0};
  int64_t oh = 0, ow = 0;
  int rc = rk_check_count(kernel, num_args, 8);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 0, "x", &x);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 1, "w_packed", &w);
  if (!rc) rc = rk_arg_f32_or_none(kernel, args, num_args, 2, "bias", &bias);
  if (!rc) rc = rk_arg_f32_or_none(kernel, args, num_args, 3, "residual", &residual);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 7, "out", &out);
  if (!rc) rc = parse_params(kernel, args, num_args, 4, &p);
  if (!rc) rc = rk_arg_epilogue(kernel, args, num_args, 5, &ep);
  if (!rc) rc = check_shapes(kernel, &p, x, out, bias, residual, &oh, &ow);
  if (rc) return rc;
  int64_t batch = x->shape[0], groups = p.groups, c_in = x->shape[1] / groups, c_out = out->shape[1] / groups;
  int64_t k = c_in * p.kh * p.kw, panels = (c_out + RK_NR - 1) / RK_NR, pixels = oh * ow;
  if (w->ndim != 4 || w->shape[0] != groups || w->shape[1] != panels || w->shape[2] != k || w->shape[3] != RK_NR)
    return rk_shape_error(kernel, "w_packed must be [groups, ceil(oc / groups / 16), c / groups * kh * kw, 16]", w);
  if (batch == 0 || pixels == 0 || c_out == 0) return 0;
  int64_t hp, wp;
  const float *image = padded_input(&p, x, &hp, &wp);
  if (!image) return rk_out_of_memory(kernel);
  int64_t count = batch * groups;
  rk_gemm *problems = rk_scratch(RK_SLOT_PROBLEMS, (size_t)count * (sizeof(rk_gemm) + sizeof(conv_a)));
  if (!problems) return rk_out_of_memory(kernel);
  conv_a *operands = (conv_a *)(problems + count);
  for (int64_t i = 0; i < count; i++) {
    int64_t n = i / groups, g = i % groups;
    operands[i] = (conv_a){image + (n * x->shape[1] + g * c_in) * hp * wp, &p, hp, wp, ow};
    int64_t out_offset = (n * out->shape[1] + g * c_out) * pixels;
    rk_gemm *gm = &problems[i];
    *gm = (rk_gemm){0};
    gm->m = pixels, gm->n = c_out, gm->k = k;
    gm->pack_a = pack_conv_a;
    gm->a = &operands[i];
    gm->b_packed = rk_data(w) + g * panels * k * RK_NR;
    gm->c = rk_data(out) + out_offset, gm->c_rs = 1, gm->c_cs = pixels;
    gm->ep = ep;
    gm->ep.bias = bias ? rk_data(bias) + g * c_out : NULL;
    if (residual) gm->ep.residual = rk_data(residual) + out_offset, gm->ep.res_rs = 1, gm->ep.res_cs = pixels;
  }
  return rk_gemm_run(problems, count);
}

/* ---- relaxc.conv2d_depthwise ------------------------------------------------------------------ */

typedef struct depthwise_job {
  const conv_params *p;
  const float *x, *w, *bias, *residual;
  float *out;
  int64_t planes, channels, h, w_in, oh, ow;
  rk_epilogue ep;
} depthwise_job;

/* Output columns are computed in groups of this many, so the loops vectorize the same way
 * everywhere (each output's taps are summed in order whatever the group). */
enum { DW_LANES = 16 };

static int64_t dw_padded_height(const depthwise_job *j) { return j->h + j->p->pad_top + j->p->pad_bottom; }

/* Columns of a phase plane: the output columns rounded up to DW_LANES, plus the taps' reach. */
static int64_t dw_phase_width(const depthwise_job *j) {
  const conv_params *p = j->p;
  int64_t ow_round = (j->ow + DW_LANES - 1) / DW_LANES * DW_LANES;
  int64_t reach = ow_round + (p->dw * (p->kw - 1)) / p->sw + 1;
  int64_t wide = (j->w_in + p->pad_left + p->pad_right + p->sw - 1) / p->sw;
  return reach > wide ? reach : wide;
}

/* One channel: its padded input split by column phase (x % stride) into `phases` (sw planes of
 * hp x pw floats), then each output row as the in-order sum of its taps. */
static inline __attribute__((always_inline)) void depthwise_plane(const depthwise_job *j, int64_t plane,
                                                                  float *phases, const bool fused) {
  const conv_params *p = j->p;
  int64_t hp = dw_padded_height(j), pw = dw_phase_width(j), c = plane % j->channels;
  int64_t ow_round = (j->ow + DW_LANES - 1) / DW_LANES * DW_LANES;
  const float *in = j->x + plane * j->h * j->w_in, *taps = j->w + c * p->kh * p->kw;
  float *acc = phases + p->sw * hp * pw;
  memset(phases, 0, sizeof(float) * (size_t)(p->sw * hp * pw));
  for (int64_t y = 0; y < j->h; y++)
    for (int64_t x = 0; x < j->w_in; x++) {
      int64_t px = x + p->pad_left;
      phases[((px % p->sw) * hp + y + p->pad_top) * pw + px / p->sw] = in[y * j->w_in + x];
    }
  float bias = j->bias ? j->bias[c] : 0.0f;
  for (int64_t oy = 0; oy < j->oh; oy++) {
    for (int64_t x = 0; x < ow_round; x++) acc[x] = 0.0f;
    for (int64_t r = 0; r < p->kh; r++) {
      int64_t iy = oy * p->sh + r * p->dh;
      for (int64_t s = 0; s < p->kw; s++) {
        int64_t col = s * p->dw;
        const float *src = phases + ((col % p->sw) * hp + iy) * pw + col / p->sw;
        float t = taps[r * p->kw + s];
        for (int64_t x = 0; x < ow_round; x++) acc[x] = rk_madd(fused, t, src[x], acc[x]);
      }
    }
    float *o = j->out + (plane * j->oh + oy) * j->ow;
    const float *res = j->residual ? j->residual + (plane * j->oh + oy) * j->ow : NULL;
    for (int64_t x = 0; x < j->ow; x++) o[x] = acc[x] * j->ep.alpha + bias;
    if (res)
      for (int64_t x = 0; x < j->ow; x++) o[x] += res[x];
    rk_activate_all(o, j->ow, j->ep.act, j->ep.lo, j->ep.hi);
  }
}

static void depthwise_generic(const depthwise_job *j, int64_t begin, int64_t end, float *buffer) {
  for (int64_t plane = begin; plane < end; plane++) depthwise_plane(j, plane, buffer, RK_PORTABLE_FUSED);
}

#if defined(__x86_64__)
RK_AVX2_TARGET static void depthwise_avx2(const depthwise_job *j, int64_t begin, int64_t end, float *buffer) {
  for (int64_t plane = begin; plane < end; plane++) depthwise_plane(j, plane, buffer, true);
}
#endif

static int depthwise_task(int task, int num_tasks, void *ctx) {
  const depthwise_job *j = ctx;
  int64_t begin, end;
  rk_split(j->planes, task, num_tasks, &begin, &end);
  if (begin == end) return 0;
  int64_t ow_round = (j->ow + DW_LANES - 1) / DW_LANES * DW_LANES;
  size_t floats = (size_t)(j->p->sw * dw_padded_height(j) * dw_phase_width(j) + ow_round);
  float *buffer = rk_scratch(RK_SLOT_INPUT, sizeof(float) * floats);
  if (!buffer) return rk_out_of_memory("relaxc.conv2d_depthwise");
#if defined(__x86_64__)
  if (rk_cpu_isa() == RK_ISA_AVX2) {
    depthwise_avx2(j, begin, end, buffer);
    return 0;
  }
#endif
  depthwise_generic(j, begin, end, buffer);
  return 0;
}

/* (x, w, bias, residual, params, activation, [alpha, lo, hi], out): w is [c, 1, kh, kw] as TVM
 * has it; params as relaxc.conv2d's, with groups = c. */
int rvm_builtin_kl_conv2d_depthwise(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  (void)self, (void)result;
  static const char kernel[] = "relaxc.conv2d_depthwise";
  DLTensor *x, *w, *bias, *residual, *out;
  conv_params p = {0};
  rk_epilogue ep = {0};
  int64_t oh = 0, ow = 0;
  int rc = rk_check_count(kernel, num_args, 8);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 0, "x", &x);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 1, "w", &w);
  if (!rc) rc = rk_arg_f32_or_none(kernel, args, num_args, 2, "bias", &bias);
  if (!rc) rc = rk_arg_f32_or_none(kernel, args, num_args, 3, "residual", &residual);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 7, "out", &out);
  if (!rc) rc = parse_params(kernel, args, num_args, 4, &p);
  if (!rc) rc = rk_arg_epilogue(kernel, args, num_args, 5, &ep);
  if (!rc) rc = check_shapes(kernel, &p, x, out, bias, residual, &oh, &ow);
  if (rc) return rc;
  int64_t channels = x->shape[1];
  if (p.groups != channels || out->shape[1] != channels)
    return rk_shape_error(kernel, "a depthwise convolution has one group per channel and as many outputs", out);
  if (w->ndim != 4 || w->shape[0] != channels || w->shape[1] != 1 || w->shape[2] != p.kh || w->shape[3] != p.kw)
    return rk_shape_error(kernel, "w must be [c, 1, kh, kw]", w);
  depthwise_job job = {&p,    rk_data(x), rk_data(w), bias ? rk_data(bias) : NULL, residual ? rk_data(residual) : NULL,
                       rk_data(out), x->shape[0] * channels, channels, x->shape[2], x->shape[3], oh, ow, ep};
  if (job.planes == 0 || oh == 0 || ow == 0) return 0;
  double work = (double)job.planes * (double)(oh * ow) * (double)(p.kh * p.kw);
  return rk_parallel(work < 32768.0 ? 1 : job.planes, depthwise_task, &job);
}
