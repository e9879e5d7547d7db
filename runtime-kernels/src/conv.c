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

/* The GEMM of one (image, group): rows are output channels (the prepacked weights are A),
 * columns output pixels, the reduction (input channel, kernel row, kernel column). Output rows
 * are then NCHW's own rows, and B's panels of 16 pixels are gathered from the image block by
 * block, so no im2col matrix is ever built. */
typedef struct conv_b {
  const float *image; /* the group's first input channel, padded */
  const conv_params *p;
  int64_t hp, wp, ow, pixels;
} conv_b;

static void pack_conv_b(const void *source, int64_t p0, int64_t panels, int64_t k0, int64_t kc, float *dst) {
  const conv_b *b = source;
  const conv_params *p = b->p;
  int64_t taps = p->kh * p->kw, plane = b->hp * b->wp;
  for (int64_t q = 0; q < panels; q++) {
    int64_t base[RK_NR], valid = 0;
    for (int64_t j = 0; j < RK_NR; j++) {
      int64_t pixel = (p0 + q) * RK_NR + j;
      if (pixel >= b->pixels) break;
      base[j] = pixel / b->ow * p->sh * b->wp + pixel % b->ow * p->sw;
      valid++;
    }
    /* Sixteen pixels side by side in the input (stride 1 within a row, or a 1x1 convolution
     * whose rows follow one another) are one copy per reduction step. */
    bool consecutive = valid == RK_NR && base[RK_NR - 1] - base[0] == RK_NR - 1;
    float *out = dst + q * kc * RK_NR;
    int64_t ic = k0 / taps, tap = k0 % taps, kr = tap / p->kw, ks = tap % p->kw;
    for (int64_t k = 0; k < kc; k++) {
      const float *src = b->image + ic * plane + kr * p->dh * b->wp + ks * p->dw;
      float *row = out + k * RK_NR;
      if (consecutive) {
        memcpy(row, src + base[0], sizeof(float) * RK_NR);
      } else {
        for (int64_t j = 0; j < valid; j++) row[j] = src[base[j]];
        for (int64_t j = valid; j < RK_NR; j++) row[j] = 0.0f;
      }
      if (++ks == p->kw) {
        ks = 0;
        if (++kr == p->kh) {
          kr = 0;
          ic++;
        }
      }
    }
  }
}

/* (x, w_packed, bias, residual, params, activation, [alpha, lo, hi], out); params = [kh, kw,
 * stride_h, stride_w, pad_top, pad_left, pad_bottom, pad_right, dilation_h, dilation_w, groups];
 * w_packed [groups, ceil(oc_per_group / 6), (c / groups) * kh * kw, 6]: each group's weights as
 * the GEMM's A, in strips of RK_MR output channels. */
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
  int64_t k = c_in * p.kh * p.kw, strips = (c_out + RK_MR - 1) / RK_MR, pixels = oh * ow;
  if (w->ndim != 4 || w->shape[0] != groups || w->shape[1] != strips || w->shape[2] != k || w->shape[3] != RK_MR)
    return rk_shape_error(kernel, "w_packed must be [groups, ceil(oc / groups / 6), c / groups * kh * kw, 6]", w);
  if (batch == 0 || pixels == 0 || c_out == 0) return 0;
  int64_t hp, wp;
  const float *image = padded_input(&p, x, &hp, &wp);
  if (!image) return rk_out_of_memory(kernel);
  int64_t count = batch * groups;
  rk_gemm *problems = rk_scratch(RK_SLOT_PROBLEMS, (size_t)count * (sizeof(rk_gemm) + sizeof(conv_b)));
  if (!problems) return rk_out_of_memory(kernel);
  conv_b *sources = (conv_b *)(problems + count);
  for (int64_t i = 0; i < count; i++) {
    int64_t n = i / groups, g = i % groups;
    sources[i] = (conv_b){image + (n * x->shape[1] + g * c_in) * hp * wp, &p, hp, wp, ow, pixels};
    int64_t out_offset = (n * out->shape[1] + g * c_out) * pixels;
    rk_gemm *gm = &problems[i];
    *gm = (rk_gemm){0};
    gm->m = c_out, gm->n = pixels, gm->k = k;
    gm->a_packed = rk_data(w) + g * strips * k * RK_MR;
    gm->pack_b = pack_conv_b;
    gm->b_source = &sources[i];
    gm->c = rk_data(out) + out_offset, gm->c_rs = pixels, gm->c_cs = 1;
    gm->ep = ep;
    gm->ep.bias = bias ? rk_data(bias) + g * c_out : NULL;
    gm->ep.bias_per_row = true;
    if (residual) gm->ep.residual = rk_data(residual) + out_offset, gm->ep.res_rs = pixels, gm->ep.res_cs = 1;
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

/* Output columns are computed this many at a time, held in registers across every tap. */
enum { DW_LANES = 16 };

static int64_t dw_padded_height(const depthwise_job *j) { return j->h + j->p->pad_top + j->p->pad_bottom; }

/* Columns of a phase plane: enough for the last group of output columns to read whole. */
static int64_t dw_phase_width(const depthwise_job *j) {
  const conv_params *p = j->p;
  int64_t ow_round = (j->ow + DW_LANES - 1) / DW_LANES * DW_LANES;
  int64_t reach = ow_round + (p->dw * (p->kw - 1)) / p->sw + 1;
  int64_t wide = (j->w_in + p->pad_left + p->pad_right + p->sw - 1) / p->sw;
  return reach > wide ? reach : wide;
}

/* The channel's input, padded and split by column phase (padded column x goes to phase x % sw,
 * column x / sw), so that each tap of each output row reads consecutive floats. */
static void dw_phases(const depthwise_job *j, const float *in, float *phases, int64_t hp, int64_t pw) {
  const conv_params *p = j->p;
  for (int64_t phase = 0; phase < p->sw; phase++) {
    /* Phase column c holds input column c * sw + phase - pad_left, where that is inside: columns
     * [begin, end) (divisions once per phase, not per row: they are slow). */
    int64_t first = p->pad_left - phase + p->sw - 1;
    int64_t begin = first > 0 ? first / p->sw : 0;
    int64_t end = (j->w_in - 1 + p->pad_left - phase) / p->sw + 1;
    if (end > pw) end = pw;
    if (end < begin) end = begin;
    for (int64_t y = 0; y < hp; y++) {
      int64_t iy = y - p->pad_top;
      float *row = phases + (phase * hp + y) * pw;
      if (iy < 0 || iy >= j->h) {
        for (int64_t c = 0; c < pw; c++) row[c] = 0.0f;
        continue;
      }
      const float *from = in + iy * j->w_in + phase - p->pad_left;
      for (int64_t c = 0; c < begin; c++) row[c] = 0.0f;
      if (p->sw == 1) {
        for (int64_t c = begin; c < end; c++) row[c] = from[c];
      } else {
        for (int64_t c = begin; c < end; c++) row[c] = from[c * p->sw];
      }
      for (int64_t c = end; c < pw; c++) row[c] = 0.0f;
    }
  }
}

/* Taps of one depthwise kernel at most (a 7x7 has 49); larger kernels are refused. */
enum { DW_MAX_TAPS = 64 };

/* Applies the epilogue to 16 results of output row oy from column x0, and stores those inside
 * the row (a macro, so the vectors are not passed as arguments). */
#define DW_STORE(j, plane, oy, x0, bias, lo, hi)                                                  \
  do {                                                                                          \
    float block_[DW_LANES];                                                                     \
    RK_F8_STORE(block_, (lo) * (j)->ep.alpha + (bias));                                         \
    RK_F8_STORE(block_ + 8, (hi) * (j)->ep.alpha + (bias));                                     \
    dw_finish(j, (plane * (j)->oh + (oy)) * (j)->ow + (x0), (j)->ow - (x0), block_);            \
  } while (0)

/* Adds the residual, applies the activation and stores the first n (at most 16) of a block. */
static inline __attribute__((always_inline)) void dw_finish(const depthwise_job *j, int64_t at, int64_t n,
                                                            float *block) {
  if (n > DW_LANES) n = DW_LANES;
  if (j->residual)
    for (int64_t l = 0; l < n; l++) block[l] += j->residual[at + l];
  if (j->ep.act == RK_ACT_RELU) {
    for (int l = 0; l < DW_LANES; l++) block[l] = block[l] > 0.0f ? block[l] : 0.0f;
  } else if (j->ep.act == RK_ACT_CLIP) {
    float lo = j->ep.lo, hi = j->ep.hi;
    for (int l = 0; l < DW_LANES; l++) block[l] = block[l] < lo ? lo : (block[l] > hi ? hi : block[l]);
  } else if (j->ep.act != RK_ACT_NONE) {
    rk_activate_all(block, DW_LANES, j->ep.act, j->ep.lo, j->ep.hi);
  }
  float *out = j->out + at;
  for (int64_t l = 0; l < n; l++) out[l] = block[l];
}

/* Output rows [oy, oy + rows) (rows 1 or 2, a constant once inlined), 16 columns at a time: two
 * rows keep four independent sums in flight, where one row's two would wait on each add. */
static inline __attribute__((always_inline)) void dw_rows(const depthwise_job *j, int64_t plane, int64_t oy,
                                                          const int rows, const float *phases, int64_t pw,
                                                          const int64_t *offset, const float *weight, int64_t taps,
                                                          float bias) {
  const float *row0 = phases + oy * j->p->sh * pw, *row1 = row0 + j->p->sh * pw;
  for (int64_t x0 = 0; x0 < j->ow; x0 += DW_LANES) {
    rk_f8 a0 = {0}, a1 = {0}, b0 = {0}, b1 = {0};
    for (int64_t t = 0; t < taps; t++) {
      const float *s0 = row0 + offset[t] + x0, *s1 = row1 + offset[t] + x0;
      a0 += weight[t] * rk_f8_load(s0);
      a1 += weight[t] * rk_f8_load(s0 + 8);
      if (rows == 2) {
        b0 += weight[t] * rk_f8_load(s1);
        b1 += weight[t] * rk_f8_load(s1 + 8);
      }
    }
    DW_STORE(j, plane, oy, x0, bias, a0, a1);
    if (rows == 2) DW_STORE(j, plane, oy + 1, x0, bias, b0, b1);
  }
}

/* One channel. Every output sums its taps in order, multiplying and adding without fusing (the
 * library is built with -ffp-contract=off), so each instruction set gives the portable C's bits. */
static inline __attribute__((always_inline)) void depthwise_plane(const depthwise_job *j, int64_t plane,
                                                                  float *phases) {
  const conv_params *p = j->p;
  int64_t hp = dw_padded_height(j), pw = dw_phase_width(j), c = plane % j->channels, taps = p->kh * p->kw;
  int64_t offset[DW_MAX_TAPS];
  float weight[DW_MAX_TAPS];
  for (int64_t t = 0; t < taps; t++) {
    int64_t r = t / p->kw, col = (t % p->kw) * p->dw;
    offset[t] = ((col % p->sw) * hp + r * p->dh) * pw + col / p->sw;
    weight[t] = j->w[c * taps + t];
  }
  dw_phases(j, j->x + plane * j->h * j->w_in, phases, hp, pw);
  float bias = j->bias ? j->bias[c] : 0.0f;
  int64_t oy = 0;
  for (; oy + 2 <= j->oh; oy += 2) dw_rows(j, plane, oy, 2, phases, pw, offset, weight, taps, bias);
  if (oy < j->oh) dw_rows(j, plane, oy, 1, phases, pw, offset, weight, taps, bias);
}

static void depthwise_generic(const depthwise_job *j, int64_t begin, int64_t end, float *buffer) {
  for (int64_t plane = begin; plane < end; plane++) depthwise_plane(j, plane, buffer);
}

#if defined(__x86_64__)
RK_AVX2_TARGET static void depthwise_avx2(const depthwise_job *j, int64_t begin, int64_t end, float *buffer) {
  for (int64_t plane = begin; plane < end; plane++) depthwise_plane(j, plane, buffer);
}
#endif

static int depthwise_task(int task, int num_tasks, void *ctx) {
  const depthwise_job *j = ctx;
  int64_t begin, end;
  rk_split(j->planes, task, num_tasks, &begin, &end);
  if (begin == end) return 0;
  size_t floats = (size_t)(j->p->sw * dw_padded_height(j) * dw_phase_width(j));
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
  if (p.kh * p.kw > DW_MAX_TAPS)
    return rvm_raise("ValueError", "%s: a %lldx%lld kernel has more than %d taps", kernel, (long long)p.kh,
                     (long long)p.kw, DW_MAX_TAPS);
  depthwise_job job = {&p,    rk_data(x), rk_data(w), bias ? rk_data(bias) : NULL, residual ? rk_data(residual) : NULL,
                       rk_data(out), x->shape[0] * channels, channels, x->shape[2], x->shape[3], oh, ow, ep};
  if (job.planes == 0 || oh == 0 || ow == 0) return 0;
  double work = (double)job.planes * (double)(oh * ow) * (double)(p.kh * p.kw);
  return rk_parallel(work < 32768.0 ? 1 : job.planes, depthwise_task, &job);
}
