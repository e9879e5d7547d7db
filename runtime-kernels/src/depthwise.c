/*
 * depthwise.c: relaxc.conv2d_depthwise, NCHW depthwise convolution (one filter per channel, any
 * stride, padding and dilation) with the epilogue of the other kernels.
 *
 * Each output sums only kh * kw products, so the work is in moving data, and planes are often
 * small (6 x 6 late in a MobileNet), where vectorizing along a row would waste most lanes and
 * any work per plane would dominate. So eight channels go at a time (sixteen where the CPU has
 * AVX-512): copied channel-interleaved
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

/* Taps of one depthwise kernel at most (a 7x7 has 49); larger kernels are refused. Channels go
 * eight at a time (a vector of 8 floats), or sixteen where the CPU has AVX-512: each lane does the
 * same operations either way, so the bits do not change. */
enum { MAX_TAPS = 64, HALF_BLOCK = 8 };

typedef float rk_f16v __attribute__((vector_size(64)));

typedef struct depthwise_job {
  const conv_params *p;
  const float *x, *w, *bias, *residual;
  float *out;
  int64_t planes, channels, h, w_in, oh, ow;
  int64_t hp, wp; /* the padded input's extents */
  int64_t taps;
  int64_t lanes;     /* channels a block (or pixels a vector along rows): 8, or 16 with AVX-512 */
  bool along_rows;   /* wide planes: work along rows, no interleaving (takes_row_path) */
  int64_t band_rows; /* output rows a work item computes */
  rk_epilogue ep;
} depthwise_job;

/* Padded input rows a band of `rows` output rows reads. */
static int64_t band_input_rows(const depthwise_job *j, int64_t rows) {
  return (rows - 1) * j->p->sh + (j->p->kh - 1) * j->p->dh + 1;
}

/* Floats of one task's buffer: a band's padded input rows along rows; else a band's interleaved
 * padded input, the taps and the band's results. */
static int64_t buffer_floats(const depthwise_job *j) {
  if (j->along_rows) return band_input_rows(j, j->band_rows) * j->wp;
  return (band_input_rows(j, j->band_rows) * j->wp + j->taps + j->band_rows * j->ow) * j->lanes;
}

/* Output rows per band: as many as keep a band's buffer within about 192 KB (in L2 beside the
 * planes it writes; whole 320 x 320 planes of 16 channels were 6.6 MB a block, which left two
 * threads no faster than one on PP-OCR's detector), at least one. */
static int64_t choose_band_rows(const depthwise_job *j) {
  int64_t budget = 192 * 1024 / (int64_t)sizeof(float) / j->lanes, rows = j->oh;
  while (rows > 1 && band_input_rows(j, rows) * j->wp + rows * j->ow > budget) rows = (rows + 1) / 2;
  return rows;
}

/* Transposes the 8 x 8 block v (v[i][j] becomes v[j][i]) in three rounds of shuffles: eight
 * pixels of eight channels to eight channel-interleaved pixels, and back, a vector at a time
 * instead of an element at a time. */
static inline __attribute__((always_inline)) void transpose8(rk_f8 v[HALF_BLOCK]) {
  rk_f8 t[HALF_BLOCK], u[HALF_BLOCK];
  for (int i = 0; i < HALF_BLOCK; i += 2) {
    t[i] = __builtin_shufflevector(v[i], v[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[i + 1] = __builtin_shufflevector(v[i], v[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int i = 0; i < HALF_BLOCK; i += 4) {
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

/* The band's interleaved results (output rows from oy0, `pixels` of them in all) out to their
 * planes, eight channels at a time: the residual added and the activation applied. */
static inline __attribute__((always_inline)) void finish_channels(const depthwise_job *j, int64_t image, int64_t c0,
                                                                  int64_t n, int64_t oy0, int64_t pixels,
                                                                  const float *results, const int64_t lanes) {
  int64_t plane = j->oh * j->ow, first = oy0 * j->ow;
  float *planes = j->out + (image * j->channels + c0) * plane + first;
  for (int64_t half = 0; half * HALF_BLOCK < n; half++) {
    int64_t h0 = half * HALF_BLOCK, hn = n - h0 < HALF_BLOCK ? n - h0 : HALF_BLOCK;
    int64_t q = 0;
    for (; q + HALF_BLOCK <= pixels; q += HALF_BLOCK) {
      rk_f8 v[HALF_BLOCK];
      for (int i = 0; i < HALF_BLOCK; i++) v[i] = rk_f8_load(results + (q + i) * lanes + h0);
      transpose8(v);
      for (int64_t l = 0; l < hn; l++) RK_F8_STORE(planes + (h0 + l) * plane + q, v[l]);
    }
    for (; q < pixels; q++)
      for (int64_t l = 0; l < hn; l++) planes[(h0 + l) * plane + q] = results[q * lanes + h0 + l];
  }
  for (int64_t l = 0; l < n; l++) {
    float *o = planes + l * plane;
    if (j->residual) {
      const float *res = j->residual + (image * j->channels + c0 + l) * plane + first;
      for (int64_t i = 0; i < pixels; i++) o[i] += res[i];
    }
    if (j->ep.act != RK_ACT_NONE) rk_activate_all(o, pixels, j->ep.act, j->ep.lo, j->ep.hi);
  }
}

/* Padded input rows [py0, py0 + rows) of channels [c0, c0 + n) of one image into the band's
 * zeroed, interleaved buffer (each pixel's `lanes` channels side by side), eight channels at a
 * time; rows in the padding stay zero. */
static inline __attribute__((always_inline)) void interleave_input(const depthwise_job *j, int64_t image, int64_t c0,
                                                                   int64_t n, int64_t py0, int64_t rows, float *padded,
                                                                   const int64_t lanes) {
  const conv_params *p = j->p;
  int64_t plane = j->h * j->w_in;
  int64_t y_begin = py0 - p->pad_top < 0 ? 0 : py0 - p->pad_top;
  int64_t y_end = py0 + rows - p->pad_top < j->h ? py0 + rows - p->pad_top : j->h;
  for (int64_t half = 0; half * HALF_BLOCK < n; half++) {
    int64_t h0 = half * HALF_BLOCK, hn = n - h0 < HALF_BLOCK ? n - h0 : HALF_BLOCK;
    const float *in = j->x + (image * j->channels + c0 + h0) * plane;
    for (int64_t y = y_begin; y < y_end; y++) {
      float *row = padded + ((y + p->pad_top - py0) * j->wp + p->pad_left) * lanes + h0;
      int64_t x = 0;
      for (; x + HALF_BLOCK <= j->w_in; x += HALF_BLOCK) {
        rk_f8 v[HALF_BLOCK];
        for (int64_t l = 0; l < HALF_BLOCK; l++) {
          rk_f8 zero = {0};
          v[l] = l < hn ? rk_f8_load(in + l * plane + y * j->w_in + x) : zero;
        }
        transpose8(v);
        for (int i = 0; i < HALF_BLOCK; i++) RK_F8_STORE(row + (x + i) * lanes, v[i]);
      }
      for (; x < j->w_in; x++)
        for (int64_t l = 0; l < hn; l++) row[x * lanes + l] = in[l * plane + y * j->w_in + x];
    }
  }
}

/* Channels [c0, c0 + n) (n <= lanes) of image `image`, one output pixel of all of them per vector
 * of type V, four pixels at a time. Every output sums its taps in order, multiplying and adding
 * without fusing, then alpha * sum + bias. A macro, so that the 8- and 16-lane bodies are the
 * same code. */
#define DEPTHWISE_CHANNELS(name, V, LANES)                                                                     \
  static inline __attribute__((always_inline)) void name(const depthwise_job *j, int64_t image, int64_t c0,    \
                                                         int64_t n, int64_t oy0, int64_t oy1, float *buffer) { \
    const conv_params *p = j->p;                                                                               \
    int64_t in_rows = band_input_rows(j, oy1 - oy0), py0 = oy0 * p->sh;                                       \
    float *padded = buffer, *taps = padded + in_rows * j->wp * LANES, *results = taps + j->taps * LANES;       \
    memset(padded, 0, sizeof(float) * (size_t)(in_rows * j->wp * LANES));                                     \
    interleave_input(j, image, c0, n, py0, in_rows, padded, LANES);                                            \
    for (int64_t t = 0; t < j->taps; t++)                                                                      \
      for (int64_t l = 0; l < LANES; l++) taps[t * LANES + l] = l < n ? j->w[(c0 + l) * j->taps + t] : 0.0f;   \
    float lanes_of[LANES];                                                                                     \
    for (int64_t l = 0; l < LANES; l++) lanes_of[l] = j->bias && l < n ? j->bias[c0 + l] : 0.0f;               \
    V bias, alpha;                                                                                             \
    __builtin_memcpy(&bias, lanes_of, sizeof bias);                                                            \
    for (int64_t l = 0; l < LANES; l++) lanes_of[l] = j->ep.alpha;                                             \
    __builtin_memcpy(&alpha, lanes_of, sizeof alpha);                                                          \
    int64_t offset[MAX_TAPS];                                                                                  \
    for (int64_t t = 0; t < j->taps; t++) offset[t] = ((t / p->kw) * p->dh * j->wp + (t % p->kw) * p->dw) * LANES; \
    int64_t step = p->sw * LANES;                                                                              \
    for (int64_t oy = oy0; oy < oy1; oy++) {                                                                   \
      const float *row = padded + (oy * p->sh - py0) * j->wp * LANES;                                          \
      float *out = results + (oy - oy0) * j->ow * LANES;                                                       \
      int64_t ox = 0;                                                                                          \
      for (; ox + 4 <= j->ow; ox += 4) {                                                                       \
        const float *at = row + ox * step;                                                                     \
        V a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, w, x0, x1, x2, x3;                                           \
        for (int64_t t = 0; t < j->taps; t++) {                                                                \
          const float *src = at + offset[t];                                                                   \
          __builtin_memcpy(&w, taps + t * LANES, sizeof w);                                                    \
          __builtin_memcpy(&x0, src, sizeof x0);                                                               \
          __builtin_memcpy(&x1, src + step, sizeof x1);                                                        \
          __builtin_memcpy(&x2, src + 2 * step, sizeof x2);                                                    \
          __builtin_memcpy(&x3, src + 3 * step, sizeof x3);                                                    \
          a0 += w * x0;                                                                                        \
          a1 += w * x1;                                                                                        \
          a2 += w * x2;                                                                                        \
          a3 += w * x3;                                                                                        \
        }                                                                                                      \
        a0 = a0 * alpha + bias, a1 = a1 * alpha + bias, a2 = a2 * alpha + bias, a3 = a3 * alpha + bias;       \
        __builtin_memcpy(out + ox * LANES, &a0, sizeof a0);                                                    \
        __builtin_memcpy(out + (ox + 1) * LANES, &a1, sizeof a1);                                              \
        __builtin_memcpy(out + (ox + 2) * LANES, &a2, sizeof a2);                                              \
        __builtin_memcpy(out + (ox + 3) * LANES, &a3, sizeof a3);                                              \
      }                                                                                                        \
      for (; ox < j->ow; ox++) {                                                                               \
        const float *at = row + ox * step;                                                                     \
        V a = {0}, w, x;                                                                                       \
        for (int64_t t = 0; t < j->taps; t++) {                                                                \
          __builtin_memcpy(&w, taps + t * LANES, sizeof w);                                                    \
          __builtin_memcpy(&x, at + offset[t], sizeof x);                                                      \
          a += w * x;                                                                                          \
        }                                                                                                      \
        a = a * alpha + bias;                                                                                  \
        __builtin_memcpy(out + ox * LANES, &a, sizeof a);                                                      \
      }                                                                                                        \
    }                                                                                                          \
    finish_channels(j, image, c0, n, oy0, (oy1 - oy0) * j->ow, results, LANES);                                \
  }
DEPTHWISE_CHANNELS(depthwise_channels8, rk_f8, 8)
DEPTHWISE_CHANNELS(depthwise_channels16, rk_f16v, 16)

/* ---- wide planes: along rows ------------------------------------------------------------- */

/* At stride 1 and at least ROW_PATH_MIN_WIDTH output columns a vector of one channel's
 * neighbouring pixels wastes nothing, and the planes need no interleaving: each band of rows is
 * copied into a zero-padded buffer and summed tap by tap along the rows (32 x 320 x 320, 3x3, one
 * Zen 5 core: 2054 us interleaved). Each output still sums its taps in order from zero, then
 * alpha * sum + bias: the interleaved path's bits. ROW_PATH_MIN_WIDTH is at least a vector. */
enum { ROW_PATH_MIN_WIDTH = 32 };

static bool takes_row_path(const depthwise_job *j) { return j->p->sw == 1 && j->ow >= ROW_PATH_MIN_WIDTH; }

/* Output rows [oy0, oy1) of one plane (image * channels + channel), `lanes` pixels a vector of
 * type V. A macro, so that the 8- and 16-lane bodies are the same code. */
#define DEPTHWISE_ROWS(name, V, LANES)                                                                           \
  static inline __attribute__((always_inline)) void name(const depthwise_job *j, int64_t plane, int64_t oy0,     \
                                                         int64_t oy1, float *padded) {                           \
    const conv_params *p = j->p;                                                                                 \
    int64_t channel = plane % j->channels, in_rows = band_input_rows(j, oy1 - oy0), py0 = oy0 * p->sh;           \
    const float *in = j->x + plane * j->h * j->w_in, *w = j->w + channel * j->taps;                              \
    memset(padded, 0, sizeof(float) * (size_t)(in_rows * j->wp));                                               \
    for (int64_t r = 0; r < in_rows; r++) {                                                                      \
      int64_t y = py0 + r - p->pad_top;                                                                          \
      if (y >= 0 && y < j->h)                                                                                    \
        memcpy(padded + r * j->wp + p->pad_left, in + y * j->w_in, sizeof(float) * (size_t)j->w_in);             \
    }                                                                                                            \
    int64_t offset[MAX_TAPS];                                                                                    \
    for (int64_t t = 0; t < j->taps; t++) offset[t] = (t / p->kw) * p->dh * j->wp + (t % p->kw) * p->dw;         \
    float bias = j->bias ? j->bias[channel] : 0.0f, alpha = j->ep.alpha;                                         \
    int64_t plane_size = j->oh * j->ow;                                                                          \
    /* Four rows at a time, so four sums are in flight (one chain of adds per vector waited on    \
     * each add); the last vector of a row starts at ow - LANES, overlapping the one before      \
     * (its outputs computed twice, the same way), instead of a scalar tail. */                 \
    int64_t step = p->sh * j->wp; /* input floats between output rows */                                         \
    for (int64_t oy = oy0; oy < oy1; oy += 4) {                                                                  \
      int64_t rows = oy1 - oy < 4 ? oy1 - oy : 4;                                                                \
      const float *row = padded + (oy * p->sh - py0) * j->wp;                                                    \
      float *o = j->out + plane * plane_size + oy * j->ow;                                                       \
      for (int64_t ox = 0;; ox += LANES) {                                                                       \
        if (ox + LANES > j->ow) ox = j->ow - LANES;                                                              \
        if (rows == 4) {                                                                                         \
          V a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, x0, x1, x2, x3;                                              \
          for (int64_t t = 0; t < j->taps; t++) {                                                                \
            const float *src = row + offset[t] + ox;                                                             \
            __builtin_memcpy(&x0, src, sizeof x0);                                                               \
            __builtin_memcpy(&x1, src + step, sizeof x1);                                                        \
            __builtin_memcpy(&x2, src + 2 * step, sizeof x2);                                                    \
            __builtin_memcpy(&x3, src + 3 * step, sizeof x3);                                                    \
            a0 += w[t] * x0, a1 += w[t] * x1, a2 += w[t] * x2, a3 += w[t] * x3;                                  \
          }                                                                                                      \
          a0 = a0 * alpha + bias, a1 = a1 * alpha + bias, a2 = a2 * alpha + bias, a3 = a3 * alpha + bias;        \
          __builtin_memcpy(o + ox, &a0, sizeof a0);                                                              \
          __builtin_memcpy(o + j->ow + ox, &a1, sizeof a1);                                                      \
          __builtin_memcpy(o + 2 * j->ow + ox, &a2, sizeof a2);                                                  \
          __builtin_memcpy(o + 3 * j->ow + ox, &a3, sizeof a3);                                                  \
        } else {                                                                                                 \
          for (int64_t r = 0; r < rows; r++) {                                                                   \
            V a = {0}, x;                                                                                        \
            for (int64_t t = 0; t < j->taps; t++) {                                                              \
              __builtin_memcpy(&x, row + r * step + offset[t] + ox, sizeof x);                                   \
              a += w[t] * x;                                                                                     \
            }                                                                                                    \
            a = a * alpha + bias;                                                                                \
            __builtin_memcpy(o + r * j->ow + ox, &a, sizeof a);                                                  \
          }                                                                                                      \
        }                                                                                                        \
        if (ox + LANES >= j->ow) break;                                                                          \
      }                                                                                                          \
    }                                                                                                            \
    float *band = j->out + plane * plane_size + oy0 * j->ow;                                                     \
    int64_t pixels = (oy1 - oy0) * j->ow;                                                                        \
    if (j->residual) {                                                                                           \
      const float *res = j->residual + plane * plane_size + oy0 * j->ow;                                         \
      for (int64_t i = 0; i < pixels; i++) band[i] += res[i];                                                    \
    }                                                                                                            \
    if (j->ep.act != RK_ACT_NONE) rk_activate_all(band, pixels, j->ep.act, j->ep.lo, j->ep.hi);                  \
  }
DEPTHWISE_ROWS(depthwise_rows8, rk_f8, 8)
DEPTHWISE_ROWS(depthwise_rows16, rk_f16v, 16)

/* Work items: (plane, band of output rows) along rows; else (image, block of `lanes` channels,
 * band of output rows). */
static int64_t work_items(const depthwise_job *j) {
  int64_t bands = (j->oh + j->band_rows - 1) / j->band_rows;
  if (j->along_rows) return j->planes * bands;
  return (j->planes / j->channels) * ((j->channels + j->lanes - 1) / j->lanes) * bands;
}

static inline __attribute__((always_inline)) void depthwise_items(const depthwise_job *j, int64_t begin, int64_t end,
                                                                  float *buffer, const int64_t lanes) {
  int64_t blocks = (j->channels + lanes - 1) / lanes, bands = (j->oh + j->band_rows - 1) / j->band_rows;
  for (int64_t item = begin; item < end; item++) {
    int64_t band = item % bands, block = item / bands;
    int64_t oy0 = band * j->band_rows, oy1 = oy0 + j->band_rows < j->oh ? oy0 + j->band_rows : j->oh;
    if (j->along_rows) {
      if (lanes == 16)
        depthwise_rows16(j, block, oy0, oy1, buffer);
      else
        depthwise_rows8(j, block, oy0, oy1, buffer);
      continue;
    }
    int64_t image = block / blocks, c0 = (block % blocks) * lanes;
    int64_t n = j->channels - c0 < lanes ? j->channels - c0 : lanes;
    if (lanes == 16)
      depthwise_channels16(j, image, c0, n, oy0, oy1, buffer);
    else
      depthwise_channels8(j, image, c0, n, oy0, oy1, buffer);
  }
}

static void depthwise_generic(const depthwise_job *j, int64_t begin, int64_t end, float *buffer) {
  depthwise_items(j, begin, end, buffer, 8);
}

#if defined(__x86_64__)
RK_AVX2_TARGET static void depthwise_avx2(const depthwise_job *j, int64_t begin, int64_t end, float *buffer) {
  depthwise_items(j, begin, end, buffer, 8);
}
RK_AVX512_TARGET static void depthwise_avx512(const depthwise_job *j, int64_t begin, int64_t end, float *buffer) {
  depthwise_items(j, begin, end, buffer, 16);
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
  if (j->lanes == 16) {
    depthwise_avx512(j, begin, end, buffer);
    return 0;
  }
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
                       /* At stride 2 the wider blocks measured slower (32x112x112: 79 -> 90 us). */
                       rk_cpu_isa() == RK_ISA_AVX2 && rk_use_avx512() && p.sw == 1 ? 16 : 8,
                       false,
                       oh,
                       a.ep};
  if (job.planes == 0 || oh == 0 || ow == 0) return 0;
  job.along_rows = takes_row_path(&job);
  /* Along rows, bands of about 16 rows: items enough to share between threads, buffers of a few
   * rows. */
  job.band_rows = job.along_rows ? (oh < 16 ? oh : 16) : choose_band_rows(&job);
  double work = (double)job.planes * (double)(oh * ow) * (double)job.taps;
  return rk_parallel(work < 32768.0 ? 1 : work_items(&job), depthwise_task, &job);
}
