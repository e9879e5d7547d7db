/*
 * conv.c: relaxc.conv2d (NCHW, any stride, padding, dilation and groups, weights prepacked by
 * relaxc.tvm) and relaxc.conv2d_depthwise, both with the GEMM epilogue (per-channel bias, a
 * residual, an activation).
 *
 * A convolution is a GEMM whose reduction is (input channel, kernel row, kernel column) and
 * whose other two sides are output channels and output pixels, either way round, as relaxc.tvm
 * packed the weights: channels as rows (weights in strips of 6, pixels gathered in panels of 16:
 * the usual case, NCHW's rows come out whole) or, where a layer has fewer pixels than channels
 * (a late stage: 7 x 7 pixels, 256 channels), channels as columns (weights in panels of 16, the
 * pixels gathered in strips of 6), so that neither wastes most of a 16-wide panel on 49 pixels.
 * The packers read the (padded) image directly, so no im2col matrix is ever built; at strides 1
 * and 2 with AVX2 or AVX-512 nothing is packed at all (the micro-kernel reads the image in
 * place, see "stride 1 and 2: B read in place"). Either way every output sums the same products
 * in the same order: the same bits. (Depthwise convolution, whose reduction is only kh * kw, is
 * depthwise.c.)
 */
#include <string.h>

#include "rk.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

typedef struct pad_job {
  const conv_params *p;
  const float *src;
  float *dst;
  int64_t planes, h, w, hp, wp;
} pad_job;

/* Planes [begin, end) of the task's share, padded: a layer's input is copied at the speed of two
 * threads, not one (ResNet's first stage pads 430 KB before each convolution). */
static int pad_task(int task, int num_tasks, void *ctx) {
  const pad_job *j = ctx;
  const conv_params *p = j->p;
  int64_t begin, end;
  rk_split(j->planes, task, num_tasks, &begin, &end);
  for (int64_t plane = begin; plane < end; plane++) {
    float *d = j->dst + plane * j->hp * j->wp;
    const float *s = j->src + plane * j->h * j->w;
    memset(d, 0, sizeof(float) * (size_t)(p->pad_top * j->wp));
    for (int64_t y = 0; y < j->h; y++) {
      float *row = d + (p->pad_top + y) * j->wp;
      memset(row, 0, sizeof(float) * (size_t)p->pad_left);
      memcpy(row + p->pad_left, s + y * j->w, sizeof(float) * (size_t)j->w);
      memset(row + p->pad_left + j->w, 0, sizeof(float) * (size_t)p->pad_right);
    }
    memset(d + (p->pad_top + j->h) * j->wp, 0, sizeof(float) * (size_t)(p->pad_bottom * j->wp));
  }
  return 0;
}

/* x with the padding written out: [n][c][hp][wp], or x itself when there is none and no
 * `tail`; with a tail, always a copy followed by `tail` zeros (reads a little past the image). */
static const float *padded_input(const conv_params *p, const DLTensor *x, int64_t tail, int64_t *hp, int64_t *wp) {
  int64_t n = x->shape[0], c = x->shape[1], h = x->shape[2], w = x->shape[3];
  *hp = h + p->pad_top + p->pad_bottom;
  *wp = w + p->pad_left + p->pad_right;
  if (*hp == h && *wp == w && !tail) return rk_data(x);
  float *dst = rk_scratch(RK_SLOT_INPUT, sizeof(float) * (size_t)(n * c * *hp * *wp + tail));
  if (!dst) return NULL;
  memset(dst + n * c * *hp * *wp, 0, sizeof(float) * (size_t)tail);
  pad_job job = {p, rk_data(x), dst, n * c, h, w, *hp, *wp};
  /* Below ~64 KB a second thread costs more to wake than it saves. */
  int64_t tasks = job.planes * *hp * *wp < 16384 ? 1 : job.planes;
  rk_parallel(tasks, pad_task, &job);
  return dst;
}

/* ---- relaxc.conv2d ------------------------------------------------------------------------------ */

/* What the packers of one (image, group) read: its pixels, gathered straight from the (padded)
 * image block by block, as B's panels (channels as rows) or A's strips (channels as columns). */
typedef struct conv_b {
  const float *image; /* the group's first input channel, padded */
  const float *end;   /* the end of the whole (padded) input: no read goes past it */
  const conv_params *p;
  int64_t hp, wp, ow, pixels;
} conv_b;

/* Where output pixels [first, first + count) read the input, relative to a tap's first pixel
 * (one division for the lot: a panel is packed for every block of the reduction). */
static inline void pixel_offsets(const conv_b *b, int64_t first, int64_t count, int64_t *offset) {
  int64_t y = first / b->ow, x = first % b->ow;
  for (int64_t j = 0; j < count; j++) {
    offset[j] = y * b->p->sh * b->wp + x * b->p->sw;
    if (++x == b->ow) x = 0, y++;
  }
}

/* A step of the reduction (input channel, kernel row, kernel column), walked in order: where the
 * step's tap starts reading the group's image. */
typedef struct conv_tap {
  int64_t ic, kr, ks;
} conv_tap;

static inline conv_tap first_tap(const conv_b *b, int64_t k0) {
  int64_t taps = b->p->kh * b->p->kw, tap = k0 % taps;
  return (conv_tap){k0 / taps, tap / b->p->kw, tap % b->p->kw};
}

static inline const float *tap_source(const conv_b *b, const conv_tap *t) {
  return b->image + t->ic * b->hp * b->wp + t->kr * b->p->dh * b->wp + t->ks * b->p->dw;
}

static inline void next_tap(const conv_b *b, conv_tap *t) {
  if (++t->ks == b->p->kw) {
    t->ks = 0;
    if (++t->kr == b->p->kh) {
      t->kr = 0;
      t->ic++;
    }
  }
}

/* Copies a run of n (1..RK_NR) neighbouring floats by at most two pairs of overlapping vector
 * copies, which stay inside both the run and its place in the panel. */
static inline __attribute__((always_inline)) void copy_run(float *dst, const float *src, int64_t n) {
  if (n >= 8) {
    RK_F8_STORE(dst, rk_f8_load(src));
    RK_F8_STORE(dst + n - 8, rk_f8_load(src + n - 8));
  } else if (n >= 4) {
    memcpy(dst, src, 4 * sizeof(float));
    memcpy(dst + n - 4, src + n - 4, 4 * sizeof(float));
  } else {
    for (int64_t i = 0; i < n; i++) dst[i] = src[i];
  }
}

/* Where a full panel's second run of neighbouring pixels begins: RK_NR when the panel is one
 * run, 0 when it is more than two (rows it crosses at other strides, several rows). */
static inline int64_t second_run(const int64_t *offset) {
  int64_t split = 1;
  while (split < RK_NR && offset[split] == offset[split - 1] + 1) split++;
  for (int64_t j = split + 1; j < RK_NR; j++)
    if (offset[j] != offset[j - 1] + 1) return 0;
  return split;
}

static inline __attribute__((always_inline)) void pack_conv_b(const void *source, int64_t p0, int64_t panels, int64_t k0,
                                                                 int64_t kc, float *dst) {
  const conv_b *b = source;
  const conv_params *p = b->p;
  for (int64_t q = 0; q < panels; q++) {
    /* Where each of the panel's pixels reads the input, relative to a tap's first pixel: the
     * same for every step of the reduction. A panel within one output row at stride 1 is one
     * run, copied as two vectors; any other (rows it crosses, strides) a fixed 16-element
     * gather, which unrolls without a branch per run. */
    int64_t offset[RK_NR], first = (p0 + q) * RK_NR;
    int64_t valid = b->pixels - first < RK_NR ? b->pixels - first : RK_NR;
    pixel_offsets(b, first, valid, offset);
    int64_t split = valid == RK_NR ? second_run(offset) : 0;
    bool one_run = split == RK_NR;
    /* Every other pixel of one input row (stride 2 within one output row: MobileNet's first
     * layer): 32 neighbours loaded as vectors and their even lanes kept, where all 32 are inside
     * the input. */
    bool every_other = valid == RK_NR && p->sw == 2;
    for (int64_t j = 1; j < RK_NR && every_other; j++) every_other = offset[j] == offset[0] + 2 * j;
    float *out = dst + q * kc * RK_NR;
    conv_tap t = first_tap(b, k0);
    for (int64_t k = 0; k < kc; k++, next_tap(b, &t)) {
      const float *src = tap_source(b, &t);
      float *row = out + k * RK_NR;
      if (every_other && src + offset[0] + 2 * RK_NR <= b->end) {
        const float *at = src + offset[0];
        rk_f8 v0 = rk_f8_load(at), v1 = rk_f8_load(at + 8), v2 = rk_f8_load(at + 16), v3 = rk_f8_load(at + 24);
        RK_F8_STORE(row, __builtin_shufflevector(v0, v1, 0, 2, 4, 6, 8, 10, 12, 14));
        RK_F8_STORE(row + 8, __builtin_shufflevector(v2, v3, 0, 2, 4, 6, 8, 10, 12, 14));
      } else if (one_run) {
        RK_F8_STORE(row, rk_f8_load(src + offset[0]));
        RK_F8_STORE(row + 8, rk_f8_load(src + offset[0] + 8));
      } else if (split) { /* two runs: the panel crosses one output row at stride 1 */
        copy_run(row, src + offset[0], split);
        copy_run(row + split, src + offset[split], RK_NR - split);
      } else if (valid == RK_NR) {
        for (int j = 0; j < RK_NR; j++) row[j] = src[offset[j]];
      } else {
        for (int64_t j = 0; j < valid; j++) row[j] = src[offset[j]];
        for (int64_t j = valid; j < RK_NR; j++) row[j] = 0.0f;
      }
    }
  }
}

/* The packer compiled for both instruction sets: its vector copies and shuffles are single
 * AVX2 instructions there (generic 8-lane shuffles in the portable build are slow). */
static void pack_conv_b_generic(const void *source, int64_t p0, int64_t panels, int64_t k0, int64_t kc, float *dst) {
  pack_conv_b(source, p0, panels, k0, kc, dst);
}

#if defined(__x86_64__)
RK_AVX2_TARGET static void pack_conv_b_avx2(const void *source, int64_t p0, int64_t panels, int64_t k0, int64_t kc,
                                            float *dst) {
  pack_conv_b(source, p0, panels, k0, kc, dst);
}

/* Stride-1 panels under AVX-512, where small layers spend a quarter of their time packing (32
 * -> 32 3x3 at 56 x 56: 26%): a panel's row is one 16-lane load and store, and a row crossing
 * an output row two masked loads into one register (masked-off lanes read nothing, so no read
 * strays past the runs, as with the AVX2 copies). The same values as pack_conv_b, which takes
 * every other panel. */
RK_AVX512_TARGET static void pack_conv_b_avx512(const void *source, int64_t p0, int64_t panels, int64_t k0,
                                                int64_t kc, float *dst) {
  const conv_b *b = source;
  for (int64_t q = 0; q < panels; q++) {
    int64_t offset[RK_NR], first = (p0 + q) * RK_NR;
    float *out = dst + q * kc * RK_NR;
    if (b->p->sw != 1 || b->pixels - first < RK_NR) {
      pack_conv_b(source, p0 + q, 1, k0, kc, out);
      continue;
    }
    pixel_offsets(b, first, RK_NR, offset);
    int64_t split = second_run(offset);
    if (!split) {
      pack_conv_b(source, p0 + q, 1, k0, kc, out);
      continue;
    }
    __mmask16 head = split == RK_NR ? (__mmask16)0xffff : (__mmask16)((1u << split) - 1);
    /* Lane j >= split reads offset[split] + (j - split). */
    int64_t tail = split == RK_NR ? 0 : offset[split] - split;
    conv_tap t = first_tap(b, k0);
    for (int64_t k = 0; k < kc; k++, next_tap(b, &t)) {
      const float *src = tap_source(b, &t);
      __m512 v = _mm512_maskz_loadu_ps(head, src + offset[0]);
      if (split < RK_NR) v = _mm512_mask_loadu_ps(v, (__mmask16)~head, src + tail);
      _mm512_storeu_ps(out + k * RK_NR, v);
    }
  }
}
#endif

/* Rows [m0, m0 + mr) (pixels) and reduction steps [k0, k0 + kc) of the image as the GEMM's A
 * strip dst[kc][RK_MR], rows past mr zero: channels-as-columns layers. */
static void pack_conv_a(const void *source, int64_t m0, int64_t mr, int64_t k0, int64_t kc, float *dst) {
  const conv_b *b = source;
  int64_t offset[RK_MR] = {0};
  pixel_offsets(b, m0, mr, offset);
  conv_tap t = first_tap(b, k0);
  for (int64_t k = 0; k < kc; k++, next_tap(b, &t)) {
    const float *src = tap_source(b, &t);
    float *row = dst + k * RK_MR;
    for (int r = 0; r < RK_MR; r++) row[r] = r < mr ? src[offset[r]] : 0.0f;
  }
}

typedef struct transpose_job {
  const float *src; /* per problem: [pixels][c_out] */
  float *out;       /* NCHW: per problem [c_out][pixels] at out_offset */
  int64_t count, groups, c_out, pixels, channels_total;
} transpose_job;

/* Problems' results [pixels][c_out] into NCHW planes, 8 channels at a time. */
static int transpose_task(int task, int num_tasks, void *ctx) {
  const transpose_job *j = ctx;
  int64_t blocks = (j->c_out + 7) / 8, begin, end;
  rk_split(j->count * blocks, task, num_tasks, &begin, &end);
  for (int64_t u = begin; u < end; u++) {
    int64_t i = u / blocks, c0 = (u % blocks) * 8, c1 = c0 + 8 < j->c_out ? c0 + 8 : j->c_out;
    int64_t n = i / j->groups, g = i % j->groups;
    const float *src = j->src + i * j->pixels * j->c_out;
    float *dst = j->out + (n * j->channels_total + g * j->c_out) * j->pixels;
    for (int64_t p = 0; p < j->pixels; p++)
      for (int64_t c = c0; c < c1; c++) dst[c * j->pixels + p] = src[p * j->c_out + c];
  }
  return 0;
}

/* ---- stride 1 and 2: B read in place ----------------------------------------------------- */

/* At stride 1 the products are computed over the padded grid: output pixel (y, x) is column y *
 * wp + x, so step k of every column reads the padded image at one offset (the tap's) plus the
 * column, and the micro-kernel reads B where it lies; nothing is packed (packing was a quarter
 * of a 32-channel 3x3 layer's time, 13% of a YOLO's). At stride 2 the padded image is first
 * split into its four phases (even and odd rows by even and odd columns, each [hq][wq]): tap
 * (r, s) of pixel (y, x) is then pixel (y + r / 2, x + s / 2) of phase (r % 2, s % 2), again one
 * offset per tap plus the column y * wq + x, for one copy of the input instead of a gather per
 * block of the reduction. The last columns of each grid row (past ow) are computed and dropped
 * as each block of C is finished. */
typedef struct in_place_layout {
  int64_t hp, wp;         /* the padded image (stride 1: rows of `gap` zeros, then w values) */
  int64_t gap;            /* stride 1: max(pad_left, pad_right) */
  int64_t hq, wq;         /* stride 2: a phase's extents */
  int64_t grid_width;     /* columns per output row: wp, or wq */
  int64_t channel_floats; /* an input channel's floats: hp * wp, or its four phases */
} in_place_layout;

/* At stride 1 one run of zeros between rows pads both sides: a row's right padding is the next
 * row's left (a read past the row's end lands there), so the grid is w + max(pad_left,
 * pad_right) wide, not w + pad_left + pad_right: YOLO's 26 x 26 layers drop 1 column of 27, not
 * 2 of 28. */
static in_place_layout layout_in_place(const conv_params *p, int64_t h, int64_t w) {
  in_place_layout l = {h + p->pad_top + p->pad_bottom, w + p->pad_left + p->pad_right, 0, 0, 0, 0, 0};
  l.hq = (l.hp + 1) / 2, l.wq = (l.wp + 1) / 2;
  if (p->sw == 1) {
    l.gap = p->pad_left > p->pad_right ? p->pad_left : p->pad_right;
    l.wp = w + l.gap;
  }
  l.grid_width = p->sw == 1 ? l.wp : l.wq;
  l.channel_floats = p->sw == 1 ? l.hp * l.wp : 4 * l.hq * l.wq;
  return l;
}

typedef struct phase_job {
  const conv_params *p;
  const float *src;
  float *dst;
  int64_t channels, h, w;
  in_place_layout l;
} phase_job;

/* src[0..n) of one input row, whose first float is padded column x0, into its two phase rows:
 * padded column X goes to position X / 2 of the even or the odd row. */
static inline __attribute__((always_inline)) void split_row(const float *src, int64_t n, int64_t x0, float *even,
                                                            float *odd) {
  float *first = (x0 & 1 ? odd : even) + (x0 >> 1), *second = (x0 & 1 ? even : odd) + ((x0 + 1) >> 1);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    rk_f8 v0 = rk_f8_load(src + i), v1 = rk_f8_load(src + i + 8);
    RK_F8_STORE(first + i / 2, __builtin_shufflevector(v0, v1, 0, 2, 4, 6, 8, 10, 12, 14));
    RK_F8_STORE(second + i / 2, __builtin_shufflevector(v0, v1, 1, 3, 5, 7, 9, 11, 13, 15));
  }
  for (; i < n; i++) (i & 1 ? second : first)[i >> 1] = src[i];
}

/* Channels [begin, end) split into their zero-padded phases. */
static inline __attribute__((always_inline)) void split_channels(const phase_job *j, int64_t begin, int64_t end) {
  const in_place_layout *l = &j->l;
  int64_t phase = l->hq * l->wq;
  for (int64_t c = begin; c < end; c++) {
    float *d = j->dst + c * l->channel_floats;
    const float *s = j->src + c * j->h * j->w;
    memset(d, 0, sizeof(float) * (size_t)l->channel_floats);
    for (int64_t y = 0; y < j->h; y++) {
      int64_t row = y + j->p->pad_top, at = (row & 1) * 2 * phase + (row >> 1) * l->wq;
      split_row(s + y * j->w, j->w, j->p->pad_left, d + at, d + at + phase);
    }
  }
}

static void split_channels_generic(const phase_job *j, int64_t begin, int64_t end) { split_channels(j, begin, end); }
#if defined(__x86_64__)
/* Its shuffles are single AVX2 instructions (the portable build's 8-lane shuffles are slow). */
RK_AVX2_TARGET static void split_channels_avx2(const phase_job *j, int64_t begin, int64_t end) {
  split_channels(j, begin, end);
}
#endif

static int phase_task(int task, int num_tasks, void *ctx) {
  const phase_job *j = ctx;
  int64_t begin, end;
  rk_split(j->channels, task, num_tasks, &begin, &end);
#if defined(__x86_64__)
  if (rk_cpu_isa() == RK_ISA_AVX2) {
    split_channels_avx2(j, begin, end);
    return 0;
  }
#endif
  split_channels_generic(j, begin, end);
  return 0;
}

/* x as the in-place path reads it: padded (stride 1, followed by the last row's right padding)
 * or split into padded phases (stride 2); x itself at stride 1 without padding (a 1x1 layer).
 * Nothing past the grid is read: the last panel's loads are masked. */
static const float *image_in_place(const conv_params *p, const DLTensor *x, const in_place_layout *l) {
  if (p->sw == 1) {
    /* Each row's zeros before it; the last row's right padding is in the tail. */
    conv_params shared = *p;
    shared.pad_left = l->gap, shared.pad_right = 0;
    int64_t hp, wp;
    return padded_input(&shared, x, l->gap, &hp, &wp);
  }
  int64_t channels = x->shape[0] * x->shape[1], floats = channels * l->channel_floats;
  float *dst = rk_scratch(RK_SLOT_INPUT, sizeof(float) * (size_t)floats);
  if (!dst) return NULL;
  phase_job job = {p, rk_data(x), dst, channels, x->shape[2], x->shape[3], *l};
  rk_parallel(floats < 16384 ? 1 : channels, phase_task, &job);
  return dst;
}

/* Where tap (r, s) of input channel c starts reading, relative to channel 0's image. */
static int64_t tap_offset(const conv_params *p, const in_place_layout *l, int64_t c, int64_t r, int64_t s) {
  if (p->sw == 1) return c * l->channel_floats + r * p->dh * l->wp + s * p->dw + l->gap - p->pad_left;
  return c * l->channel_floats + ((r & 1) * 2 + (s & 1)) * l->hq * l->wq + (r >> 1) * l->wq + (s >> 1);
}

typedef struct in_place_out {
  float *out;            /* the problem's output planes [c_out][pixels] */
  const float *residual; /* laid out as out, or NULL */
  int64_t grid_width, ow, pixels;
  rk_act act;
  float lo, hi;
} in_place_out;

/* Rows [m0, m1) x grid columns [j0, j1) of C into the output: each grid row's columns x < ow,
 * the residual added and the activation applied there (what the epilogue leaves to this pass,
 * in its order: the same bits as the packed path). */
static void finish_in_place(const rk_gemm *g, int64_t m0, int64_t m1, int64_t j0, int64_t j1) {
  const in_place_out *o = g->finish_ctx;
  int64_t gw = o->grid_width;
  for (int64_t r = m0; r < m1; r++) {
    const float *src = g->c + r * g->c_rs;
    float *dst = o->out + r * o->pixels;
    const float *res = o->residual ? o->residual + r * o->pixels : NULL;
    int64_t begin = -1, end = 0;
    for (int64_t y = j0 / gw, j = j0; j < j1; y++, j = y * gw) {
      int64_t x = j - y * gw, run = o->ow - x < j1 - j ? o->ow - x : j1 - j;
      if (run <= 0) continue;
      int64_t at = y * o->ow + x;
      if (res) {
        for (int64_t i = 0; i < run; i++) dst[at + i] = src[j + i] + res[at + i];
      } else {
        memcpy(dst + at, src + j, sizeof(float) * (size_t)run);
      }
      if (begin < 0) begin = at;
      end = at + run;
    }
    /* The pixels written are one contiguous span of the output row. */
    if (begin >= 0 && o->act != RK_ACT_NONE) rk_activate_all(dst + begin, end - begin, o->act, o->lo, o->hi);
  }
}

/* Whether a layer takes the in-place path: stride 1, or 2 without dilation; a CPU with the
 * kernel (AVX2: 32x56x56 -> 32 3x3 went from 579 to 519 us on Zen 5 with AVX-512 turned off);
 * and few dropped columns. A 1x1 layer without padding reads its input and writes its output as
 * they are. */
static bool takes_b_in_place(const conv_params *p, const DLTensor *x, int64_t oh, int64_t ow) {
  bool stride1 = p->sh == 1 && p->sw == 1, stride2 = p->sh == 2 && p->sw == 2 && p->dh == 1 && p->dw == 1;
  if (!(stride1 || stride2) || !rk_ukernel_rows_c(rk_cpu_isa())) return false;
  if (p->kh * p->kw == 1) {
    /* Only where nothing is copied (no padding: the input read and the output written as they
     * are): 128x28x28 -> 128 1x1 went 159 -> 112 us; 256x14x14 -> 256 1x1 through a copy of its
     * input and cut results, 121 -> 146 us. */
    bool padded = p->pad_top || p->pad_left || p->pad_bottom || p->pad_right;
    return stride1 && !padded;
  }
  in_place_layout l = layout_in_place(p, x->shape[2], x->shape[3]);
  /* Against the packed path's whole panels: 52 x 52 (YOLO) computes 6% more columns and is 10%
   * faster, 13 x 13 18% more and was 4% slower. */
  int64_t columns = ((oh - 1) * l.grid_width + ow + RK_NR - 1) / RK_NR * RK_NR;
  int64_t packed = (oh * ow + RK_NR - 1) / RK_NR * RK_NR;
  return 10 * columns <= 11 * packed;
}

static int conv_b_in_place(const char *kernel, const conv_args *a, int64_t c_in, int64_t c_out, int64_t k,
                           int64_t strips) {
  const conv_params *p = &a->p;
  in_place_layout l = layout_in_place(p, a->x->shape[2], a->x->shape[3]);
  int64_t batch = a->x->shape[0], groups = p->groups, pixels = a->oh * a->ow;
  /* The GEMM's columns run up to the last pixel's (the last panel's loads and stores are masked
   * there, so nothing past it is read). */
  int64_t grid = (a->oh - 1) * l.grid_width + a->ow;
  const float *image = image_in_place(p, a->x, &l);
  if (!image) return rk_out_of_memory(kernel);
  /* The grid is the output itself (no dropped column: a 1x1 layer, or one output row): C is
   * written in place too, the whole epilogue in the micro-kernel. */
  bool direct = grid == pixels;
  int64_t count = batch * groups;
  rk_gemm *problems =
      rk_scratch(RK_SLOT_PROBLEMS, (size_t)count * (sizeof(rk_gemm) + sizeof(in_place_out)) + sizeof(int64_t) * (size_t)k);
  float *results = direct ? NULL : rk_scratch(RK_SLOT_OUTPUT, sizeof(float) * (size_t)(count * c_out * grid));
  if (!problems || (!direct && !results)) return rk_out_of_memory(kernel);
  in_place_out *outs = (in_place_out *)(problems + count);
  int64_t *rows = (int64_t *)(outs + count);
  /* The taps in the packed weights' order of k: (input channel, kernel row, kernel column). */
  for (int64_t ic = 0, kk = 0; ic < c_in; ic++)
    for (int64_t kr = 0; kr < p->kh; kr++)
      for (int64_t ks = 0; ks < p->kw; ks++) rows[kk++] = tap_offset(p, &l, ic, kr, ks);
  for (int64_t i = 0; i < count; i++) {
    int64_t n = i / groups, g = i % groups, out_offset = (n * a->out->shape[1] + g * c_out) * pixels;
    outs[i] = (in_place_out){rk_data(a->out) + out_offset, a->residual ? rk_data(a->residual) + out_offset : NULL,
                             l.grid_width, a->ow, pixels, a->ep.act, a->ep.lo, a->ep.hi};
    rk_gemm *gm = &problems[i];
    *gm = (rk_gemm){0};
    gm->m = c_out, gm->n = grid, gm->k = k;
    gm->a_packed = rk_data(a->w) + g * strips * k * RK_MR;
    gm->b_in_place = image + (n * a->x->shape[1] + g * c_in) * l.channel_floats;
    gm->b_rows = rows;
    gm->ep = a->ep;
    gm->ep.bias = a->bias ? rk_data(a->bias) + g * c_out : NULL;
    gm->ep.bias_per_row = true;
    if (direct) {
      gm->c = outs[i].out, gm->c_rs = pixels, gm->c_cs = 1;
      gm->ep.residual = outs[i].residual, gm->ep.res_rs = pixels, gm->ep.res_cs = 1;
      continue;
    }
    gm->c = results + i * c_out * grid, gm->c_rs = grid, gm->c_cs = 1;
    gm->ep.act = RK_ACT_NONE, gm->ep.residual = NULL;
    gm->finish = finish_in_place, gm->finish_ctx = &outs[i];
  }
  return rk_gemm_run(problems, count);
}

/* (x, w_packed, bias, residual, params, activation, [alpha, lo, hi], out); params = [kh, kw,
 * stride_h, stride_w, pad_top, pad_left, pad_bottom, pad_right, dilation_h, dilation_w, groups];
 * w_packed [groups, ceil(oc_per_group / 6), (c / groups) * kh * kw, 6]: each group's weights as
 * the GEMM's A, in strips of RK_MR output channels; or [groups, ceil(oc_per_group / 16), (c /
 * groups) * kh * kw, 16]: as its B, in panels of RK_NR output channels. */
int rvm_builtin_kl_conv2d(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  (void)self, (void)result;
  static const char kernel[] = "relaxc.conv2d";
  conv_args a;
  int rc = rk_conv_args(kernel, "w_packed", args, num_args, &a);
  if (rc) return rc;
  DLTensor *x = a.x, *w = a.w, *bias = a.bias, *residual = a.residual, *out = a.out;
  const conv_params p = a.p;
  rk_epilogue ep = a.ep;
  int64_t oh = a.oh, ow = a.ow;
  int64_t batch = x->shape[0], groups = p.groups, c_in = x->shape[1] / groups, c_out = out->shape[1] / groups;
  int64_t k = c_in * p.kh * p.kw, strips = (c_out + RK_MR - 1) / RK_MR, pixels = oh * ow;
  int64_t panels = (c_out + RK_NR - 1) / RK_NR;
  bool channels_as_rows = w->ndim == 4 && w->shape[3] == RK_MR && w->shape[1] == strips;
  bool channels_as_columns = w->ndim == 4 && w->shape[3] == RK_NR && w->shape[1] == panels;
  if ((!channels_as_rows && !channels_as_columns) || w->shape[0] != groups || w->shape[2] != k)
    return rk_shape_error(kernel,
                          "w_packed must be [groups, ceil(oc / groups / 6), c / groups * kh * kw, 6] or "
                          "[groups, ceil(oc / groups / 16), c / groups * kh * kw, 16]",
                          w);
  if (batch == 0 || pixels == 0 || c_out == 0) return 0;
  if (channels_as_rows && takes_b_in_place(&p, x, oh, ow)) return conv_b_in_place(kernel, &a, c_in, c_out, k, strips);
  int64_t hp, wp;
  const float *image = padded_input(&p, x, 0, &hp, &wp);
  if (!image) return rk_out_of_memory(kernel);
  int64_t count = batch * groups;
  rk_gemm *problems = rk_scratch(RK_SLOT_PROBLEMS, (size_t)count * (sizeof(rk_gemm) + sizeof(conv_b)));
  if (!problems) return rk_out_of_memory(kernel);
  conv_b *sources = (conv_b *)(problems + count);
  /* Channels as columns write their results to a [pixels][channels] buffer, contiguous as the
   * C-writing micro-kernels need, and into NCHW after: written straight across NCHW's planes
   * every block of the reduction read and wrote C a value at a time (256 x 7 x 7, 3x3: 9 blocks). */
  float *columns_out = NULL;
  if (channels_as_columns) {
    columns_out = rk_scratch(RK_SLOT_OUTPUT, sizeof(float) * (size_t)(count * pixels * c_out));
    if (!columns_out) return rk_out_of_memory(kernel);
  }
  rk_pack_b_fn pack_b = pack_conv_b_generic;
#if defined(__x86_64__)
  if (rk_cpu_isa() == RK_ISA_AVX2) pack_b = rk_use_avx512() ? pack_conv_b_avx512 : pack_conv_b_avx2;
#endif
  for (int64_t i = 0; i < count; i++) {
    int64_t n = i / groups, g = i % groups;
    sources[i] = (conv_b){image + (n * x->shape[1] + g * c_in) * hp * wp, image + batch * x->shape[1] * hp * wp, &p, hp, wp,
                          ow, pixels};
    int64_t out_offset = (n * out->shape[1] + g * c_out) * pixels;
    rk_gemm *gm = &problems[i];
    *gm = (rk_gemm){0};
    gm->ep = ep;
    gm->ep.bias = bias ? rk_data(bias) + g * c_out : NULL;
    if (channels_as_columns) {
      gm->m = pixels, gm->n = c_out, gm->k = k;
      gm->pack_a = pack_conv_a;
      gm->a = &sources[i];
      gm->a_gathered = true;
      gm->b_packed = rk_data(w) + g * panels * k * RK_NR;
      gm->c = columns_out + i * pixels * c_out, gm->c_rs = c_out, gm->c_cs = 1;
      if (residual) gm->ep.residual = rk_data(residual) + out_offset, gm->ep.res_rs = 1, gm->ep.res_cs = pixels;
      continue;
    }
    gm->m = c_out, gm->n = pixels, gm->k = k;
    gm->a_packed = rk_data(w) + g * strips * k * RK_MR;
    gm->pack_b = pack_b;
    gm->b_source = &sources[i];
    gm->c = rk_data(out) + out_offset, gm->c_rs = pixels, gm->c_cs = 1;
    gm->ep.bias_per_row = true;
    if (residual) gm->ep.residual = rk_data(residual) + out_offset, gm->ep.res_rs = pixels, gm->ep.res_cs = 1;
  }
  rc = rk_gemm_run(problems, count);
  if (rc || !channels_as_columns) return rc;
  transpose_job t = {columns_out, rk_data(out), count, groups, c_out, pixels, out->shape[1]};
  double values = (double)(count * pixels * c_out);
  return rk_parallel(values < 65536.0 ? 1 : count * ((c_out + 7) / 8), transpose_task, &t);
}

