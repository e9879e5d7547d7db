/*
 * depthwise.c: relaxc.conv2d_depthwise, NCHW depthwise convolution (one filter per channel, any
 * stride, padding and dilation) with the epilogue of the other kernels.
 *
 * Each output sums only kh * kw products, so the work is in moving data, and planes are often
 * small (6 x 6 late in a MobileNet), where vectorizing along a row would waste most lanes and
 * any work per plane would dominate. So eight channels go at a time: copied channel-interleaved
 * into a padded buffer, one vector then holds the same output pixel of the eight channels, four
 * pixels at a time (four independent sums); the results are written out plane by plane. On the
 * 2-core Zen 1 VM this was 1.3-2.5x faster than vectorizing along rows over phase-split planes,
 * on every MobileNetV2 layer from 48 x 48 down to 3 x 3.
 *
 * Every output sums its taps in order, multiplying and adding without fusing (the library is
 * built with -ffp-contract=off), so each instruction set gives the portable C's bits.
 */
#include <string.h>

#include "rk.h"

/* Taps of one depthwise kernel at most (a 7x7 has 49); larger kernels are refused. */
enum { MAX_TAPS = 64, CHANNEL_BLOCK = 8 };

typedef struct depthwise_job {
  const conv_params *p;
  const float *x, *w, *bias, *residual;
  float *out;
  int64_t planes, channels, h, w_in, oh, ow;
  int64_t hp, wp; /* the padded input's extents */
  int64_t taps;
  rk_epilogue ep;
} depthwise_job;

/* Floats of one task's buffer: a block of channels' interleaved padded input, taps and results. */
static int64_t buffer_floats(const depthwise_job *j) {
  return (j->hp * j->wp + j->taps + j->oh * j->ow) * CHANNEL_BLOCK;
}

/* alpha * sums + bias for one pixel's eight channels, into v (a macro: vectors are not passed
 * as arguments); the residual and the activation come in finish_channels. */
#define SCALE_BIAS(j, sums, bias, v) RK_F8_STORE((v), (sums) * (j)->ep.alpha + (bias))

/* Transposes the 8 x 8 block v (v[i][j] becomes v[j][i]) in three rounds of shuffles: eight
 * pixels of eight channels to eight channel-interleaved pixels, and back, a vector at a time
 * instead of an element at a time. */
static inline __attribute__((always_inline)) void transpose8(rk_f8 v[CHANNEL_BLOCK]) {
  rk_f8 t[CHANNEL_BLOCK], u[CHANNEL_BLOCK];
  for (int i = 0; i < CHANNEL_BLOCK; i += 2) {
    t[i] = __builtin_shufflevector(v[i], v[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[i + 1] = __builtin_shufflevector(v[i], v[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int i = 0; i < CHANNEL_BLOCK; i += 4) {
    u[i] = __builtin_shufflevector(t[i], t[i + 2], 0, 1, 8, 9, 4, 5, 12, 13);
    u[i + 1] = __builtin_shufflevector(t[i], t[i + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    u[i + 2] = __builtin_shufflevector(t[i + 1], t[i + 3], 0, 1, 8, 9, 4, 5, 12, 13);
    u[i + 3] = __builtin_shufflevector(t[i + 1], t[i + 3], 2, 3, 10, 11, 6, 7, 14, 15);
  }
  for (int i = 0; i < 4; i++) {
    v[i] = __builtin_shufflevector(u[i], u[i + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    v[i + 4] = __builtin_shufflevector(u[i], u[i + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
}

/* The block's interleaved results out to their planes: the residual added and the activation
 * applied, each plane's pixels written in order. */
static inline __attribute__((always_inline)) void finish_channels(const depthwise_job *j, int64_t image, int64_t c0,
                                                                  int64_t n, const float *results) {
  int64_t pixels = j->oh * j->ow;
  float *planes = j->out + (image * j->channels + c0) * pixels;
  int64_t q = 0;
  for (; q + CHANNEL_BLOCK <= pixels; q += CHANNEL_BLOCK) {
    rk_f8 v[CHANNEL_BLOCK];
    for (int i = 0; i < CHANNEL_BLOCK; i++) v[i] = rk_f8_load(results + (q + i) * CHANNEL_BLOCK);
    transpose8(v);
    for (int64_t l = 0; l < n; l++) RK_F8_STORE(planes + l * pixels + q, v[l]);
  }
  for (; q < pixels; q++)
    for (int64_t l = 0; l < n; l++) planes[l * pixels + q] = results[q * CHANNEL_BLOCK + l];
  for (int64_t l = 0; l < n; l++) {
    float *o = planes + l * pixels;
    if (j->residual) {
      const float *res = j->residual + (image * j->channels + c0 + l) * pixels;
      for (int64_t i = 0; i < pixels; i++) o[i] += res[i];
    }
    rk_activate_all(o, pixels, j->ep.act, j->ep.lo, j->ep.hi);
  }
}

/* Channels [c0, c0 + n) of one image into the block's zeroed, padded, interleaved buffer. */
static inline __attribute__((always_inline)) void interleave_input(const depthwise_job *j, int64_t image, int64_t c0,
                                                                   int64_t n, float *padded) {
  const conv_params *p = j->p;
  const float *in = j->x + (image * j->channels + c0) * j->h * j->w_in;
  int64_t plane = j->h * j->w_in;
  for (int64_t y = 0; y < j->h; y++) {
    float *row = padded + ((y + p->pad_top) * j->wp + p->pad_left) * CHANNEL_BLOCK;
    int64_t x = 0;
    for (; x + CHANNEL_BLOCK <= j->w_in; x += CHANNEL_BLOCK) {
      rk_f8 v[CHANNEL_BLOCK];
      for (int64_t l = 0; l < CHANNEL_BLOCK; l++) {
        rk_f8 zero = {0};
        v[l] = l < n ? rk_f8_load(in + l * plane + y * j->w_in + x) : zero;
      }
      transpose8(v);
      for (int i = 0; i < CHANNEL_BLOCK; i++) RK_F8_STORE(row + (x + i) * CHANNEL_BLOCK, v[i]);
    }
    for (; x < j->w_in; x++)
      for (int64_t l = 0; l < n; l++) row[x * CHANNEL_BLOCK + l] = in[l * plane + y * j->w_in + x];
  }
}

/* Channels [c0, c0 + n) (n <= 8) of image `image`, one output pixel of all of them per vector,
 * four pixels at a time. Every output sums its taps in order. */
static inline __attribute__((always_inline)) void depthwise_channels(const depthwise_job *j, int64_t image, int64_t c0,
                                                                     int64_t n, float *buffer) {
  const conv_params *p = j->p;
  float *padded = buffer, *taps = padded + j->hp * j->wp * CHANNEL_BLOCK, *results = taps + j->taps * CHANNEL_BLOCK;
  memset(padded, 0, sizeof(float) * (size_t)(j->hp * j->wp * CHANNEL_BLOCK));
  interleave_input(j, image, c0, n, padded);
  for (int64_t t = 0; t < j->taps; t++)
    for (int64_t l = 0; l < CHANNEL_BLOCK; l++) taps[t * CHANNEL_BLOCK + l] = l < n ? j->w[(c0 + l) * j->taps + t] : 0.0f;
  float bias_lanes[CHANNEL_BLOCK] = {0};
  for (int64_t l = 0; l < n; l++) bias_lanes[l] = j->bias ? j->bias[c0 + l] : 0.0f;
  rk_f8 bias = rk_f8_load(bias_lanes);
  int64_t offset[MAX_TAPS];
  for (int64_t t = 0; t < j->taps; t++)
    offset[t] = ((t / p->kw) * p->dh * j->wp + (t % p->kw) * p->dw) * CHANNEL_BLOCK;
  int64_t step = p->sw * CHANNEL_BLOCK;
  for (int64_t oy = 0; oy < j->oh; oy++) {
    const float *row = padded + oy * p->sh * j->wp * CHANNEL_BLOCK;
    float *out = results + oy * j->ow * CHANNEL_BLOCK;
    int64_t ox = 0;
    for (; ox + 4 <= j->ow; ox += 4) {
      const float *at = row + ox * step;
      rk_f8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
      for (int64_t t = 0; t < j->taps; t++) {
        rk_f8 w = rk_f8_load(taps + t * CHANNEL_BLOCK);
        const float *src = at + offset[t];
        a0 += w * rk_f8_load(src);
        a1 += w * rk_f8_load(src + step);
        a2 += w * rk_f8_load(src + 2 * step);
        a3 += w * rk_f8_load(src + 3 * step);
      }
      SCALE_BIAS(j, a0, bias, out + ox * CHANNEL_BLOCK);
      SCALE_BIAS(j, a1, bias, out + (ox + 1) * CHANNEL_BLOCK);
      SCALE_BIAS(j, a2, bias, out + (ox + 2) * CHANNEL_BLOCK);
      SCALE_BIAS(j, a3, bias, out + (ox + 3) * CHANNEL_BLOCK);
    }
    for (; ox < j->ow; ox++) {
      const float *at = row + ox * step;
      rk_f8 a = {0};
      for (int64_t t = 0; t < j->taps; t++) a += rk_f8_load(taps + t * CHANNEL_BLOCK) * rk_f8_load(at + offset[t]);
      SCALE_BIAS(j, a, bias, out + ox * CHANNEL_BLOCK);
    }
  }
  finish_channels(j, image, c0, n, results);
}

/* Work items: (image, block of eight channels). */
static int64_t work_items(const depthwise_job *j) {
  return (j->planes / j->channels) * ((j->channels + CHANNEL_BLOCK - 1) / CHANNEL_BLOCK);
}

static inline __attribute__((always_inline)) void depthwise_items(const depthwise_job *j, int64_t begin, int64_t end,
                                                                  float *buffer) {
  int64_t blocks = (j->channels + CHANNEL_BLOCK - 1) / CHANNEL_BLOCK;
  for (int64_t item = begin; item < end; item++) {
    int64_t image = item / blocks, c0 = (item % blocks) * CHANNEL_BLOCK;
    int64_t n = j->channels - c0 < CHANNEL_BLOCK ? j->channels - c0 : CHANNEL_BLOCK;
    depthwise_channels(j, image, c0, n, buffer);
  }
}

static void depthwise_generic(const depthwise_job *j, int64_t begin, int64_t end, float *buffer) {
  depthwise_items(j, begin, end, buffer);
}

#if defined(__x86_64__)
RK_AVX2_TARGET static void depthwise_avx2(const depthwise_job *j, int64_t begin, int64_t end, float *buffer) {
  depthwise_items(j, begin, end, buffer);
}
#endif

static int depthwise_task(int task, int num_tasks, void *ctx) {
  const depthwise_job *j = ctx;
  int64_t begin, end;
  rk_split(work_items(j), task, num_tasks, &begin, &end);
  if (begin == end) return 0;
  float *buffer = rk_scratch(RK_SLOT_INPUT, sizeof(float) * (size_t)buffer_floats(j));
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
  conv_args a;
  int rc = rk_conv_args(kernel, "w", args, num_args, &a);
  if (rc) return rc;
  DLTensor *x = a.x, *w = a.w, *out = a.out;
  const conv_params p = a.p;
  int64_t oh = a.oh, ow = a.ow;
  int64_t channels = x->shape[1];
  if (p.groups != channels || out->shape[1] != channels)
    return rk_shape_error(kernel, "a depthwise convolution has one group per channel and as many outputs", out);
  if (w->ndim != 4 || w->shape[0] != channels || w->shape[1] != 1 || w->shape[2] != p.kh || w->shape[3] != p.kw)
    return rk_shape_error(kernel, "w must be [c, 1, kh, kw]", w);
  if (p.kh * p.kw > MAX_TAPS)
    return rvm_raise("ValueError", "%s: a %lldx%lld kernel has more than %d taps", kernel, (long long)p.kh,
                     (long long)p.kw, MAX_TAPS);
  depthwise_job job = {&p,
                       rk_data(x),
                       rk_data(w),
                       a.bias ? rk_data(a.bias) : NULL,
                       a.residual ? rk_data(a.residual) : NULL,
                       rk_data(out),
                       x->shape[0] * channels,
                       channels,
                       x->shape[2],
                       x->shape[3],
                       oh,
                       ow,
                       x->shape[2] + p.pad_top + p.pad_bottom,
                       x->shape[3] + p.pad_left + p.pad_right,
                       p.kh * p.kw,
                       a.ep};
  if (job.planes == 0 || oh == 0 || ow == 0) return 0;
  double work = (double)job.planes * (double)(oh * ow) * (double)job.taps;
  return rk_parallel(work < 32768.0 ? 1 : work_items(&job), depthwise_task, &job);
}
