/*
 * quant.c: dense layers and embeddings over weights in GGUF's formats, used in place
 * (relaxc.dense_q, relaxc.take_q), with the portable dot products.
 *
 * For the integer formats the activations are quantized first, once per call, as llama.cpp does:
 * int8 with one scale per 32 values for q8_0 and q4_0, per 256 for the K formats (whose
 * sub-block scales are integers, so a super-block's products add up exactly in integers before
 * one float multiply). Each output is one row dot product summed in an order fixed by k alone,
 * and work is split over weight rows only, so every thread count gives the same bits.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

static const rk_qinfo formats[RK_Q_COUNT] = {
    [RK_Q_F32] = {"f32", 1, 4, 0},        [RK_Q_F16] = {"f16", 1, 2, 0},
    [RK_Q_Q8_0] = {"q8_0", 32, 34, 32},   [RK_Q_Q4_0] = {"q4_0", 32, 18, 32},
    [RK_Q_Q4_K] = {"q4_K", 256, 144, 256}, [RK_Q_Q6_K] = {"q6_K", 256, 210, 256},
    [RK_Q_Q4_0X8] = {"q4_0x8", 32, 18, 32},     [RK_Q_Q4_KX8] = {"q4_Kx8", 256, 148, 256},
    [RK_Q_Q8_0X8] = {"q8_0x8", 32, 34, 32},   [RK_Q_Q4_1] = {"q4_1", 32, 20, 32},
    [RK_Q_Q5_0] = {"q5_0", 32, 22, 32},       [RK_Q_Q5_1] = {"q5_1", 32, 24, 32},
};

const rk_qinfo *rk_qformat_info(rk_qformat f) { return (unsigned)f < RK_Q_COUNT ? &formats[f] : NULL; }

/* The integer nearest x (ties to even) for |x| < 2^22, as llama.cpp rounds: adding 1.5 * 2^23
 * leaves the integer in the low mantissa bits (lrintf is a libm call here, and this is inlined). */
static inline int nearest_int(float x) {
  float shifted = x + 12582912.0f;
  int32_t bits;
  memcpy(&bits, &shifted, sizeof bits);
  return (bits & 0x007fffff) - 0x00400000;
}

/* x rounded to IEEE half precision (nearest, ties to even) and back. */
static inline __attribute__((always_inline)) float round_to_f16(float x) {
  uint32_t bits;
  memcpy(&bits, &x, sizeof bits);
  uint32_t sign = bits & 0x80000000u, abs = bits & 0x7fffffffu;
  if (abs >= 0x47800000u) return x; /* beyond half's range (or NaN): the scales never get there */
  if (abs < 0x38800000u) {          /* half's subnormals: multiples of 2^-24 */
    float f = fabsf(x) * 16777216.0f;
    f = (float)lrintf(f) / 16777216.0f;
    return sign ? -f : f;
  }
  uint32_t rounded = (abs + 0x0fffu + ((abs >> 13) & 1u)) & ~0x1fffu;
  rounded |= sign;
  float out;
  memcpy(&out, &rounded, sizeof out);
  return out;
}

/* Activations as llama.cpp quantizes them, so that the products are its products: per 32 (q8_0's
 * blocks) the scale is amax / 127 rounded to half precision, the values x * 127 / amax rounded to
 * even; per 256 (q8_K's) the scale is the float 1 / (127 / amax), the values x * 127 / amax (up
 * to a sign that changes no product, below). */
static inline __attribute__((always_inline)) void quantize_row(const float *x, int64_t k, int64_t block, int8_t *q,
                                                             float *d, int16_t *sum16) {
  for (int64_t b = 0; b < k / block; b++) {
    const float *xb = x + b * block;
    /* The largest magnitude, 8 lanes at a time (max is exact, so the order is free; NaN never
     * compares larger). */
    typedef int32_t lanes_i8 __attribute__((vector_size(32)));
    lanes_i8 magnitude = {0}, sign_off = {0x7fffffff, 0x7fffffff, 0x7fffffff, 0x7fffffff,
                                          0x7fffffff, 0x7fffffff, 0x7fffffff, 0x7fffffff};
    for (int64_t i = 0; i < block; i += 8) {
      lanes_i8 a = (lanes_i8)rk_f8_load(xb + i) & sign_off;
      lanes_i8 larger = (rk_f8)a > (rk_f8)magnitude;
      magnitude = (a & larger) | (magnitude & ~larger);
    }
    rk_f8 lanes = (rk_f8)magnitude;
    float amax = 0.0f;
    for (int i = 0; i < 8; i++) amax = lanes[i] > amax ? lanes[i] : amax;
    /* Per 256, llama.cpp takes the scale's sign from the first value of largest magnitude (its
     * quantize_mat from +amax where there is one): -127 / max. Either sign gives the same
     * products and sums (the values and the scale negate together, and rounding to even is
     * symmetric), so relaxc takes +127 / amax and skips finding that value. */
    float scale, inverse;
    if (block == 32) {
      scale = round_to_f16(amax / 127.0f);
      inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
    } else {
      inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
      scale = amax > 0.0f ? 1.0f / inverse : 0.0f;
    }
    d[b] = scale;
    for (int64_t i = 0; i < block; i++) {
      int v = nearest_int(xb[i] * inverse);
      q[b * block + i] = (int8_t)(v > 127 ? 127 : v);
    }
  }
  for (int64_t s = 0; s < k / 16; s++) {
    int sum = 0;
    for (int i = 0; i < 16; i++) sum += q[s * 16 + i];
    sum16[s] = (int16_t)sum;
  }
}

/* The same code for AVX2 where the CPU has it (every step is exact or rounded as written, so the
 * bits are the portable build's). */
#if defined(__x86_64__)
RK_AVX2_TARGET static void quantize_row_avx2(const float *x, int64_t k, int64_t block, int8_t *q, float *d,
                                             int16_t *sum16) {
  quantize_row(x, k, block, q, d, sum16);
}
#endif

void rk_quantize_row(const float *x, int64_t k, int64_t block, int8_t *q, float *d, int16_t *sum16) {
#if defined(__x86_64__)
  if (rk_cpu_isa() == RK_ISA_AVX2) {
    quantize_row_avx2(x, k, block, q, d, sum16);
    return;
  }
#endif
  quantize_row(x, k, block, q, d, sum16);
}

/* ---- portable dot products ------------------------------------------------------------------- */

static float dot_f32(const void *w, const float *x, const rk_qact *a, int64_t k) {
  (void)a;
  const float *r = w;
  float acc[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= k; i += 8)
    for (int l = 0; l < 8; l++) acc[l] = rk_madd(RK_PORTABLE_FUSED, r[i + l], x[i + l], acc[l]);
  float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < k; i++) sum = rk_madd(RK_PORTABLE_FUSED, r[i], x[i], sum);
  return sum;
}

static float dot_f16(const void *w, const float *x, const rk_qact *a, int64_t k) {
  (void)a;
  const uint8_t *r = w;
  float acc[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= k; i += 8)
    for (int l = 0; l < 8; l++) acc[l] = rk_madd(RK_PORTABLE_FUSED, rk_load_f16(r + 2 * (i + l)), x[i + l], acc[l]);
  float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < k; i++) sum = rk_madd(RK_PORTABLE_FUSED, rk_load_f16(r + 2 * i), x[i], sum);
  return sum;
}

/* Eight float sums added as llama.cpp's x86 code adds its 8 lanes: halves, then pairs, then the
 * last two. */
static inline float sum_lanes(const float acc[8]) {
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

/* q8_0: a block is the scale (f16), then 32 int8 values. Summed as llama.cpp sums it on x86, so
 * that the two agree to the bit: lane l adds, block after block, the block's scale times the
 * exact sum of values 4l..4l+3, and the 8 lanes are added at the end. */
static float dot_q8_0(const void *w, const float *x, const rk_qact *a, int64_t k) {
  (void)x;
  const uint8_t *blk = w;
  float acc[8] = {0};
  for (int64_t b = 0; b < k / 32; b++, blk += 34) {
    const int8_t *qw = (const int8_t *)(blk + 2), *qx = a->q + b * 32;
    float d = rk_load_f16(blk) * a->d[b];
    for (int l = 0; l < 8; l++) {
      int32_t s = 0;
      for (int i = 4 * l; i < 4 * l + 4; i++) s += qw[i] * qx[i];
      acc[l] = rk_madd(RK_PORTABLE_FUSED, d, (float)s, acc[l]);
    }
  }
  return sum_lanes(acc);
}

/* q4_0: the scale (f16), then 16 bytes: value i is (low nibble of byte i) - 8, value i + 16 the
 * high nibble - 8. */
static float dot_q4_0(const void *w, const float *x, const rk_qact *a, int64_t k) {
  (void)x;
  const uint8_t *blk = w;
  float sum = 0.0f;
  for (int64_t b = 0; b < k / 32; b++, blk += 18) {
    const uint8_t *qs = blk + 2;
    const int8_t *qx = a->q + b * 32;
    int32_t s = 0;
    for (int i = 0; i < 16; i++) s += ((qs[i] & 0xf) - 8) * qx[i] + ((qs[i] >> 4) - 8) * qx[i + 16];
    sum = rk_madd(RK_PORTABLE_FUSED, rk_load_f16(blk) * a->d[b], (float)s, sum);
  }
  return sum;
}

/* The 32 values of a q4_1/q5_0/q5_1 block: low nibbles (values 0-15), then high ones, with a
 * fifth bit from the 32-bit word qh for the q5 formats. */
static inline void block_values(const uint8_t *qs, const uint8_t *qh, int *q) {
  uint32_t high = 0;
  if (qh) memcpy(&high, qh, 4);
  for (int i = 0; i < 16; i++) {
    q[i] = (qs[i] & 0xf) | (qh ? (int)((high >> i) & 1) << 4 : 0);
    q[i + 16] = (qs[i] >> 4) | (qh ? (int)((high >> (i + 16)) & 1) << 4 : 0);
  }
}

/* q4_1 (d, m, 16 bytes), q5_0 (d, qh, 16 bytes) and q5_1 (d, m, qh, 16 bytes): value = d * q + m,
 * or d * (q - 16) for q5_0. The offset multiplies the activations' sum of the block. */
static float dot_offset_blocks(const uint8_t *blk, const rk_qact *a, int64_t k, int bytes, bool has_min, bool five) {
  float sum = 0.0f;
  for (int64_t b = 0; b < k / 32; b++, blk += bytes) {
    int q[32];
    block_values(blk + (has_min ? 4 : 2) + (five ? 4 : 0), five ? blk + (has_min ? 4 : 2) : NULL, q);
    const int8_t *qx = a->q + b * 32;
    int32_t s = 0, sx = a->sum16[2 * b] + a->sum16[2 * b + 1];
    for (int i = 0; i < 32; i++) s += q[i] * qx[i];
    if (!has_min) s -= 16 * sx;
    float dx = a->d[b];
    sum = rk_madd(RK_PORTABLE_FUSED, rk_load_f16(blk) * dx, (float)s, sum);
    if (has_min) sum = rk_madd(RK_PORTABLE_FUSED, rk_load_f16(blk + 2) * dx, (float)sx, sum);
  }
  return sum;
}

static float dot_q4_1(const void *w, const float *x, const rk_qact *a, int64_t k) {
  (void)x;
  return dot_offset_blocks(w, a, k, 20, true, false);
}

static float dot_q5_0(const void *w, const float *x, const rk_qact *a, int64_t k) {
  (void)x;
  return dot_offset_blocks(w, a, k, 22, false, true);
}

static float dot_q5_1(const void *w, const float *x, const rk_qact *a, int64_t k) {
  (void)x;
  return dot_offset_blocks(w, a, k, 24, true, true);
}

/* q4_K: a super-block of 256 is d and dmin (f16), 12 bytes of eight 6-bit scales and minimums,
 * and 128 bytes of 4-bit values: 64 values per 32 bytes, the low nibbles first (sub-block 2c),
 * then the high ones (2c + 1). Value = d * scale * q - dmin * min. */
static float dot_q4_K(const void *w, const float *x, const rk_qact *a, int64_t k) {
  (void)x;
  const uint8_t *blk = w;
  float sum = 0.0f, mins = 0.0f;
  for (int64_t b = 0; b < k / 256; b++, blk += 144) {
    const uint8_t *qs = blk + 16;
    const int8_t *qx = a->q + b * 256;
    const int16_t *sx = a->sum16 + b * 16;
    int32_t s = 0, m = 0;
    for (int j = 0; j < 8; j++) {
      int scale, min;
      rk_q4k_scale_min(j, blk + 4, &scale, &min);
      const uint8_t *q = qs + 32 * (j / 2);
      int shift = 4 * (j & 1);
      int32_t part = 0;
      for (int i = 0; i < 32; i++) part += ((q[i] >> shift) & 0xf) * qx[32 * j + i];
      s += scale * part;
      m += min * (sx[2 * j] + sx[2 * j + 1]);
    }
    float dx = a->d[b];
    sum = rk_madd(RK_PORTABLE_FUSED, rk_load_f16(blk) * dx, (float)s, sum);
    mins = rk_madd(RK_PORTABLE_FUSED, rk_load_f16(blk + 2) * dx, (float)m, mins);
  }
  return sum - mins;
}

/* q6_K: a super-block of 256 is 128 bytes of low 4 bits, 64 bytes of high 2 bits, 16 int8
 * scales (one per 16 values) and d (f16). In each half of 128 values, for l < 32: value l takes
 * the low nibble of ql[l] and bits 0-1 of qh[l]; l + 32 the low nibble of ql[l + 32] and bits
 * 2-3; l + 64 the high nibble of ql[l] and bits 4-5; l + 96 the high nibble of ql[l + 32] and
 * bits 6-7. Value = d * scale * (q - 32).
 * Summed in llama.cpp's x86 lanes, to agree with it to the bit: lane l holds, per super-block,
 * the exact sum over its 8 parts of 32 values of scale times values 4l..4l+3 of the part (q
 * unsigned), less 32 times the activation sums of sub-blocks 2l and 2l + 1 times their scales. */
static float dot_q6_K(const void *w, const float *x, const rk_qact *a, int64_t k) {
  (void)x;
  const uint8_t *blk = w;
  float acc[8] = {0};
  for (int64_t b = 0; b < k / 256; b++, blk += 210) {
    const int8_t *scales = (const int8_t *)(blk + 192);
    const int8_t *qx = a->q + b * 256;
    const int16_t *sx = a->sum16 + b * 16;
    int32_t lane[8];
    for (int l = 0; l < 8; l++) lane[l] = -32 * (sx[2 * l] * scales[2 * l] + sx[2 * l + 1] * scales[2 * l + 1]);
    for (int half = 0; half < 2; half++) {
      const uint8_t *ql = blk + 64 * half, *qh = blk + 128 + 32 * half;
      for (int part = 0; part < 4; part++)
        for (int i = 0; i < 32; i++) {
          int low = part & 1 ? ql[i + 32] : ql[i];
          low = part & 2 ? low >> 4 : low & 0xf;
          int q = low | (((qh[i] >> (2 * part)) & 3) << 4);
          lane[i / 4] += scales[8 * half + 2 * part + i / 16] * q * qx[128 * half + 32 * part + i];
        }
    }
    float d = rk_load_f16(blk + 208) * a->d[b];
    for (int l = 0; l < 8; l++) acc[l] = rk_madd(RK_PORTABLE_FUSED, d, (float)lane[l], acc[l]);
  }
  return sum_lanes(acc);
}

/* q4_0x8: per block, the 8 rows' scales, then for j = 0..3 the 8 rows' bytes 4j..4j+3. Each
 * output sums its blocks in order, as the SIMD versions do lane by lane. */
static void tile8_q4_0x8(const uint8_t *group, const rk_qrows *a, int64_t r0, int xrows, float *out, int64_t out_stride) {
  int64_t k = a->k;
  for (int r = 0; r < xrows; r++) {
    const int8_t *qx = a->q + (r0 + r) * k;
    const float *dx = a->d + (r0 + r) * (k / 32);
    for (int c = 0; c < 8; c++) {
      float sum = 0.0f;
      for (int64_t b = 0; b < k / 32; b++) {
        const uint8_t *blk = group + 144 * b;
        int32_t s = 0;
        for (int j = 0; j < 4; j++)
          for (int i = 0; i < 4; i++) {
            uint8_t byte = blk[16 + 32 * j + 4 * c + i];
            s += ((byte & 0xf) - 8) * qx[32 * b + 4 * j + i] + ((byte >> 4) - 8) * qx[32 * b + 16 + 4 * j + i];
          }
        sum = rk_madd(RK_PORTABLE_FUSED, rk_load_f16(blk + 2 * c) * dx[b], (float)s, sum);
      }
      out[r * out_stride + c] = sum;
    }
  }
}

/* q8_0x8: per block, the 8 rows' scales, then for j = 0..7 the 8 rows' values 4j..4j+3. */
static void tile8_q8_0x8(const uint8_t *group, const rk_qrows *a, int64_t r0, int xrows, float *out, int64_t out_stride) {
  int64_t k = a->k;
  for (int r = 0; r < xrows; r++) {
    const int8_t *qx = a->q + (r0 + r) * k;
    const float *dx = a->d + (r0 + r) * (k / 32);
    for (int c = 0; c < 8; c++) {
      float sum = 0.0f;
      for (int64_t b = 0; b < k / 32; b++) {
        const uint8_t *blk = group + 272 * b;
        int32_t s = 0;
        for (int j = 0; j < 8; j++)
          for (int i = 0; i < 4; i++) s += (int8_t)blk[16 + 32 * j + 4 * c + i] * qx[32 * b + 4 * j + i];
        sum = rk_madd(RK_PORTABLE_FUSED, rk_load_f16(blk + 2 * c) * dx[b], (float)s, sum);
      }
      out[r * out_stride + c] = sum;
    }
  }
}

/* q4_Kx8: per super-block, the 8 rows' d and dmin, then per sub-block the 8 rows' scales, then
 * their minimums, then for chunk c and j = 0..7 the 8 rows' bytes 32c + 4j..32c + 4j + 3. */
static void tile8_q4_Kx8(const uint8_t *group, const rk_qrows *a, int64_t r0, int xrows, float *out, int64_t out_stride) {
  int64_t k = a->k;
  for (int r = 0; r < xrows; r++) {
    const int8_t *qx = a->q + (r0 + r) * k;
    const int16_t *sx = a->sum16 + (r0 + r) * (k / 16);
    /* Sums added to the floats per 64 values (paired rows) or per 256. */
    int per = r0 + r < a->paired_rows ? 2 : 8;
    for (int c = 0; c < 8; c++) {
      float sum = 0.0f, mins = 0.0f;
      for (int64_t b = 0; b < k / 256; b++) {
        const uint8_t *blk = group + 1184 * b;
        float dx = a->d[(r0 + r) * (k / 256) + b];
        int32_t s = 0, m = 0;
        for (int sub = 0; sub < 8; sub++) {
          int32_t part = 0;
          for (int j = 0; j < 8; j++)
            for (int i = 0; i < 4; i++) {
              uint8_t byte = blk[160 + 256 * (sub / 2) + 32 * j + 4 * c + i];
              part += ((byte >> (4 * (sub & 1))) & 0xf) * qx[256 * b + 32 * sub + 4 * j + i];
            }
          s += blk[32 + 8 * sub + c] * part;
          m += blk[96 + 8 * sub + c] * (sx[16 * b + 2 * sub] + sx[16 * b + 2 * sub + 1]);
          if (sub % per == per - 1) {
            sum = rk_madd(RK_PORTABLE_FUSED, rk_load_f16(blk + 2 * c) * dx, (float)s, sum);
            mins = rk_madd(RK_PORTABLE_FUSED, rk_load_f16(blk + 16 + 2 * c) * dx, (float)m, mins);
            s = m = 0;
          }
        }
      }
      out[r * out_stride + c] = sum - mins;
    }
  }
}

static float dot_unused(const void *w, const float *x, const rk_qact *a, int64_t k) {
  (void)w, (void)x, (void)a, (void)k;
  return 0.0f;
}

static const rk_qdots portable = {
    {dot_f32, dot_f16, dot_q8_0, dot_q4_0, dot_q4_K, dot_q6_K, dot_unused, dot_unused, dot_unused, dot_q4_1, dot_q5_0,
     dot_q5_1},
    {NULL},
    {[RK_Q_Q4_0X8] = tile8_q4_0x8, [RK_Q_Q4_KX8] = tile8_q4_Kx8, [RK_Q_Q8_0X8] = tile8_q8_0x8},
    {NULL},
    {NULL},
    {0},
};

#if defined(__aarch64__)
/* aarch64: the portable dot products but q6_K's, and the regrouped tiles, in NEON (quant_neon.c). */
static const rk_qdots neon = {
    {dot_f32, dot_f16, dot_q8_0, dot_q4_0, dot_q4_K, rk_neon_dot_q6_K, dot_unused, dot_unused, dot_unused, dot_q4_1, dot_q5_0,
     dot_q5_1},
    {NULL},
    {[RK_Q_Q4_0X8] = rk_neon_tile8_q4_0x8, [RK_Q_Q4_KX8] = rk_neon_tile8_q4_Kx8, [RK_Q_Q8_0X8] = rk_neon_tile8_q8_0x8},
    {NULL},
    {NULL},
    {0},
};
#endif

const rk_qdots *rk_qdots_portable(void) { return &portable; }

/* The dot products this CPU runs, decided once: VNNI, else AVX2 (with F16C), else portable; on
 * aarch64, NEON's. RELAXC_QUANT_ISA=portable|avx2 picks a lesser set, so that tests run every set
 * on one CPU. */
static const rk_qdots *qdots(void) {
  static const rk_qdots *_Atomic chosen;
  const rk_qdots *c = atomic_load_explicit(&chosen, memory_order_relaxed);
  if (c) return c;
  c = &portable;
#if defined(__aarch64__)
  if (!rk_quant_isa_forced("portable")) c = &neon;
#endif
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (rk_cpu_isa() == RK_ISA_AVX2 && __builtin_cpu_supports("f16c") && !rk_quant_isa_forced("portable")) {
    bool vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
    c = vnni && !rk_quant_isa_forced("avx2") ? rk_qdots_vnni() : rk_qdots_avx2();
  }
#endif
  const char *name = "portable C";
#if defined(__aarch64__)
  if (c == &neon) name = "NEON";
#endif
#if defined(__x86_64__)
  if (c != &portable) name = c == rk_qdots_avx2() ? "AVX2" : "AVX-512 VNNI";
#endif
  rk_report_path("quantized dense layers and attention's dot products (GGUF formats)", name);
  atomic_store_explicit(&chosen, c, memory_order_relaxed);
  return c;
}

/* ---- arguments ------------------------------------------------------------------------------- */

/* The format named by args[i] (a string). */
static int arg_format(const char *kernel, const TVMFFIAny *args, int32_t num_args, int32_t i, rk_qformat *out) {
  const char *name = NULL;
  uint64_t size = 0;
  if (i >= num_args || !rvm_as_string(&args[i], &name, &size))
    return rvm_raise("TypeError", "%s: argument %d (format) must be a string, got %s", kernel, i,
                     i < num_args ? rvm_type_name(&args[i]) : "nothing");
  for (int f = 0; f < RK_Q_COUNT; f++)
    if (strlen(formats[f].name) == size && memcmp(formats[f].name, name, size) == 0) {
      *out = (rk_qformat)f;
      return 0;
    }
  return rvm_raise("ValueError", "%s: unknown weight format \"%.*s\" (known: f32, f16, q8_0, q4_0, q4_K, q6_K, q4_1, q5_0, q5_1, q4_0x8, q4_Kx8, q8_0x8)", kernel,
                   (int)(size > 64 ? 64 : size), name);
}

/* The weights: a CPU tensor [n, k] of float32 or float16, or [n, k / block * bytes] of uint8 for
 * the block formats, compact. Sets *n and checks k against the format. */
static int arg_weights(const char *kernel, const TVMFFIAny *args, int32_t num_args, int32_t i, rk_qformat f, int64_t k,
                       const uint8_t **data, int64_t *n) {
  DLTensor *t = i < num_args ? rvm_as_dltensor(&args[i]) : NULL;
  if (!t)
    return rvm_raise("TypeError", "%s: argument %d (weights) must be a tensor, got %s", kernel, i,
                     i < num_args ? rvm_type_name(&args[i]) : "nothing");
  const rk_qinfo *q = &formats[f];
  DLDataType want = f == RK_Q_F32 ? (DLDataType){kDLFloat, 32, 1}
                    : f == RK_Q_F16 ? (DLDataType){kDLFloat, 16, 1}
                                    : (DLDataType){kDLUInt, 8, 1};
  if (t->device.device_type != kDLCPU || t->dtype.code != want.code || t->dtype.bits != want.bits || t->dtype.lanes != 1) {
    char got[32];
    rvm_format_dtype(t->dtype, got, sizeof got);
    return rvm_raise("TypeError", "%s: %s weights must be a CPU tensor of %s, got %s", kernel, q->name,
                     f == RK_Q_F32 ? "float32" : f == RK_Q_F16 ? "float16" : "uint8 blocks", got);
  }
  if (k % q->block != 0) {
    char what[96];
    snprintf(what, sizeof what, "%s rows hold a multiple of %lld values, but x's last axis is %lld", q->name,
             (long long)q->block, (long long)k);
    return rvm_raise("ValueError", "%s: %s", kernel, what);
  }
  int64_t row = k / q->block * (f <= RK_Q_F16 ? 1 : q->bytes) * (rk_qformat_x8(f) ? 8 : 1);
  if (t->ndim != 2 || t->shape[1] != row || !rk_compact(t)) {
    char what[128];
    snprintf(what, sizeof what, "%s weights for rows of %lld values must be a compact [n, %lld]", q->name, (long long)k,
             (long long)row);
    return rk_shape_error(kernel, what, t);
  }
  *data = (const uint8_t *)t->data + t->byte_offset;
  *n = t->shape[0] * (rk_qformat_x8(f) ? 8 : 1);
  return 0;
}

/* ---- relaxc.dense_q -------------------------------------------------------------------------- */

typedef struct dense_job {
  rk_qdot_fn dot;
  rk_qtile_fn tile;
  rk_qtile8_fn tile8; /* for the regrouped formats */
  rk_qtile16_fn tile16; /* two of their groups at once */
  rk_qstream_fn stream; /* decoding's rows in one pass, where the instruction set has it */
  const uint8_t *w;
  int64_t row_bytes, n, m;
  rk_qrows rows;
  const float *bias;
  float *out;
  int64_t xtile; /* activation rows per tile call */
  bool one_stream; /* decode reads the rows as one stream (dense_task) */
  int decode_parts; /* rk_qdots.decode_parts */
  /* Decoding on several threads: the next turn of rows to take. On a line of its own, so that
   * taking a turn does not take the other fields' line from the cores reading them. */
  _Alignas(64) _Atomic int64_t next_turn;
} dense_job;

enum { ROWS_PER_TASK_UNIT = 16, TILE = 4, STREAMS = 2 };

/* Adds the bias to outputs [c, c + rows) of every activation row. */
static void add_bias(const dense_job *j, int64_t c, int64_t rows) {
  if (j->bias)
    for (int64_t r = 0; r < j->m; r++)
      for (int64_t col = 0; col < rows; col++) j->out[r * j->n + c + col] += j->bias[c + col];
}

/* The weight rows [c, c + rows) against every activation row: one tile of the task. */
static void dense_tile(const dense_job *j, int64_t c, int rows) {
  const rk_qrows *a = &j->rows;
  int64_t k = a->k;
  for (int64_t r = 0; r < j->m; r += j->xtile) {
    int xrows = (int)(j->m - r < j->xtile ? j->m - r : j->xtile);
    float *out = j->out + r * j->n + c;
    if (j->tile16 && rows == 16) {
      j->tile16(j->w + c * j->row_bytes, 8 * j->row_bytes, a, r, xrows, out, j->n);
    } else if (j->tile8) {
      j->tile8(j->w + c * j->row_bytes, a, r, xrows, out, j->n);
    } else if (j->tile) {
      j->tile(j->w + c * j->row_bytes, j->row_bytes, rows, a, r, xrows, out, j->n);
    } else {
      for (int xr = 0; xr < xrows; xr++) {
        rk_qact act = {0};
        if (a->q) act = (rk_qact){a->q + (r + xr) * k, a->d + (r + xr) * (k / a->act_block), a->sum16 + (r + xr) * (k / 16)};
        for (int col = 0; col < rows; col++)
          out[xr * j->n + col] = j->dot(j->w + (c + col) * j->row_bytes, a->x + (r + xr) * k, &act, k);
      }
    }
  }
  add_bias(j, c, rows);
}

static void dense_units(const dense_job *j, int64_t begin, int64_t end, bool two_streams);

/* Units of rows a decoding task takes in turn with the others when several share a matrix. */
enum { DECODE_TURN_UNITS = 4 };

static int dense_task(int task, int num_tasks, void *ctx) {
  dense_job *j = ctx;
  int64_t units = (j->n + ROWS_PER_TASK_UNIT - 1) / ROWS_PER_TASK_UNIT, begin, end;
  /* Decoding on several threads: the tasks take 64 rows at a time, one stream apiece, so that
   * the threads read neighbouring memory, as llama.cpp's chunks do, instead of each its own half
   * of the matrix in two streams. Mid-size Llama at 2 threads on Zen 3, ABBA against halves: f16
   * decode +4.5%, +3.2% and +1% in three runs, -6% in a fourth whose prefill (which this does not
   * touch) was 8% slower too; Q4_K_M +4.7%, q8_0 -1.3%. 256 rows a turn gained nothing. A task
   * takes the next turn free rather than every num_tasks-th: a VM's cores run at different speeds
   * from moment to moment, and the faster one then does more instead of waiting at the end
   * (mid-size f16 Llama on Zen 3, ABBA against every num_tasks-th: even at 2 threads, +10% at 3
   * threads on 2 cores). Every row is computed whole by one task, so who takes it changes no bit. */
  if (j->m <= TILE && num_tasks > 1) {
    for (;;) {
      int64_t c = atomic_fetch_add_explicit(&j->next_turn, 1, memory_order_relaxed) * DECODE_TURN_UNITS;
      if (c >= units) break;
      dense_units(j, c, c + DECODE_TURN_UNITS < units ? c + DECODE_TURN_UNITS : units, false);
    }
    return 0;
  }
  rk_split(units, task, num_tasks, &begin, &end);
  dense_units(j, begin, end, j->m <= TILE && !j->one_stream);
  return 0;
}

/* Decoding's rows [lo, hi) cut into j->decode_parts equal parts, a tile taking row r of every
 * part, so the tile's rows are as many sequential streams the length of a part, not neighbours
 * whose streams stop at each row's end; the rows left over go in ordinary tiles. On Zen 3, over
 * the mid-size Llama's f32 matrices in decode order at 1 thread, four parts streamed 16.3-16.9
 * GB/s against 10.9-12.3 for four neighbouring rows side by side, and faster than one plain
 * sequential pass of loads (12.3-12.6). */
static void decode_in_parts(const dense_job *j, int64_t lo, int64_t hi) {
  int parts = j->decode_parts;
  int64_t per = (hi - lo) / parts;
  for (int64_t r = 0; r < per; r++) {
    float sums[TILE];
    j->tile(j->w + (lo + r) * j->row_bytes, per * j->row_bytes, parts, &j->rows, 0, 1, sums, 0);
    for (int p = 0; p < parts; p++) j->out[lo + p * per + r] = sums[p];
  }
  if (per) add_bias(j, lo, parts * per);
  for (int64_t c = lo + parts * per; c < hi; c += TILE) dense_tile(j, c, (int)(hi - c < TILE ? hi - c : TILE));
}

/* The units [begin, end) of a task's rows, in tiles (or one pass, below). */
static void dense_units(const dense_job *j, int64_t begin, int64_t end, bool two_streams) {
  int64_t lo = begin * ROWS_PER_TASK_UNIT, hi = end * ROWS_PER_TASK_UNIT < j->n ? end * ROWS_PER_TASK_UNIT : j->n;
  if (j->stream && j->m == 1) {
    j->stream(j->w + lo * j->row_bytes, j->row_bytes, hi - lo, j->rows.x, j->rows.k, j->out + lo);
    add_bias(j, lo, hi - lo);
    return;
  }
  /* Tiles start at multiples of their rows (TILE, or 8 for the regrouped formats: units of 16
   * start on groups, and n is a multiple of 8) whatever the split, and a tile's shape never
   * changes its sums, so the order the tiles are taken in changes no bit. When the weights pass
   * once (a few activation rows: decoding) on one thread, its rows are read as two sequential streams
   * far apart, a tile from each in turn: one core keeps more of memory's bandwidth busy with two
   * streams in flight than with one. Mid-size Llama decode at 1 thread, Zen 5: f16 +12%, q8_0
   * +10%, q4_0 and Q4_K_M +5%, f32 even; three or four streams were slower than one. f32 takes
   * one: on AVX2 its tiles instead take their four rows from four parts (decode_in_parts, above),
   * and where it reads a row at a time (AVX-512) two streams were no faster on Zen 5. An
   * instruction set with a one-pass decode for a format (rk_qdots.stream: f16 on AVX2, two halves
   * side by side) takes the units' rows in it, without tiles. */
  if (j->decode_parts > 1 && j->m == 1 && j->tile) {
    decode_in_parts(j, lo, hi);
    return;
  }
  int64_t step = j->tile16 && j->m > TILE ? 16 : j->tile8 ? 8 : TILE, tiles = (hi - lo + step - 1) / step;
  int64_t streams = two_streams && tiles >= STREAMS ? STREAMS : 1;
  int64_t per = (tiles + streams - 1) / streams;
  for (int64_t t = 0; t < per; t++)
    for (int64_t s = 0; s < streams; s++) {
      int64_t index = s * per + t;
      if (index >= tiles) continue;
      int64_t c = lo + index * step;
      dense_tile(j, c, (int)(hi - c < step ? hi - c : step));
    }
}

static int quantize_task(int task, int num_tasks, void *ctx) {
  const dense_job *j = ctx;
  const rk_qrows *a = &j->rows;
  int64_t begin, end;
  rk_split(j->m, task, num_tasks, &begin, &end);
  for (int64_t r = begin; r < end; r++)
    rk_quantize_row(a->x + r * a->k, a->k, a->act_block, (int8_t *)a->q + r * a->k, (float *)a->d + r * (a->k / a->act_block),
                    (int16_t *)a->sum16 + r * (a->k / 16));
  return 0;
}

/* ---- many rows of float weights: the GEMM ------------------------------------------------------ */

/* Where a prefill's rows are many, float32 and float16 weights go through the library's GEMM
 * (gemm.c: AVX-512 where the CPU has it), which reads each weight once per block of rows instead
 * of once per four: B's panels are gathered from the [n, k] rows, float16 converted on the way. A
 * row's bits then depend on whether its call had GEMM_ROWS rows or more (not on the thread
 * count). A 500-token prefill of the mid-size f32 Llama went from 658 to 442 ms at 2 threads. */
enum { GEMM_ROWS = 32 };

typedef struct float_rows {
  const uint8_t *w;
  int64_t n, k;
  bool half;
} float_rows;

/* dst[p][kk][jj] = w[(p0 + p) * 16 + jj][k0 + kk], zero past the last row. */
static inline __attribute__((always_inline)) void gather_panels(const float_rows *b, int64_t p0, int64_t panels,
                                                                int64_t k0, int64_t kc, float *dst) {
  for (int64_t p = 0; p < panels; p++) {
    float *panel = dst + p * kc * RK_NR;
    for (int jj = 0; jj < RK_NR; jj++) {
      int64_t row = (p0 + p) * RK_NR + jj;
      if (row >= b->n) {
        for (int64_t kk = 0; kk < kc; kk++) panel[kk * RK_NR + jj] = 0.0f;
      } else if (b->half) {
        const uint8_t *src = b->w + (row * b->k + k0) * 2;
        for (int64_t kk = 0; kk < kc; kk++) panel[kk * RK_NR + jj] = rk_load_f16(src + 2 * kk);
      } else {
        const float *src = (const float *)b->w + row * b->k + k0;
        for (int64_t kk = 0; kk < kc; kk++) panel[kk * RK_NR + jj] = src[kk];
      }
    }
  }
}

static void gather_panels_generic(const void *b, int64_t p0, int64_t panels, int64_t k0, int64_t kc, float *dst) {
  gather_panels(b, p0, panels, k0, kc, dst);
}

#if defined(__x86_64__)
/* Eight rows of eight values (converted from half precision with F16C) transposed in registers,
 * so that the panel is written a 32-byte vector at a time. */
__attribute__((target("avx2,fma,f16c"))) static inline __m256 load8(const float_rows *b, int64_t row, int64_t col) {
  if (b->half) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b->w + (row * b->k + col) * 2)));
  return _mm256_loadu_ps((const float *)b->w + row * b->k + col);
}

__attribute__((target("avx2,fma,f16c"))) static void gather_panels_f16c(const void *source, int64_t p0, int64_t panels,
                                                                       int64_t k0, int64_t kc, float *dst) {
  const float_rows *b = source;
  for (int64_t p = 0; p < panels; p++) {
    float *panel = dst + p * kc * RK_NR;
    int64_t first = (p0 + p) * RK_NR;
    if (first + RK_NR > b->n) { /* the last, partial panel */
      gather_panels(b, p0 + p, 1, k0, kc, panel);
      continue;
    }
    int64_t whole = kc / 8 * 8;
    for (int jj = 0; jj < RK_NR; jj++)
      for (int64_t kk = whole; kk < kc; kk++)
        panel[kk * RK_NR + jj] = b->half ? rk_load_f16(b->w + ((first + jj) * b->k + k0 + kk) * 2)
                                         : ((const float *)b->w)[(first + jj) * b->k + k0 + kk];
    for (int half = 0; half < 2; half++)
      for (int64_t kk = 0; kk < whole; kk += 8) {
        __m256 r[8], t[8];
        for (int i = 0; i < 8; i++) r[i] = load8(b, first + 8 * half + i, k0 + kk);
        for (int i = 0; i < 8; i += 2) {
          t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
          t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
        }
        for (int i = 0; i < 8; i += 4) {
          r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
          r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
          r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
          r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
        }
        /* r[i] (i < 4) holds value i of rows 0-3 in its low half and value i + 4 in its high half;
         * r[i + 4] the same for rows 4-7: joining halves gives each value's eight rows. */
        __m256 col[8];
        col[0] = _mm256_permute2f128_ps(r[0], r[4], 0x20);
        col[1] = _mm256_permute2f128_ps(r[1], r[5], 0x20);
        col[2] = _mm256_permute2f128_ps(r[2], r[6], 0x20);
        col[3] = _mm256_permute2f128_ps(r[3], r[7], 0x20);
        col[4] = _mm256_permute2f128_ps(r[0], r[4], 0x31);
        col[5] = _mm256_permute2f128_ps(r[1], r[5], 0x31);
        col[6] = _mm256_permute2f128_ps(r[2], r[6], 0x31);
        col[7] = _mm256_permute2f128_ps(r[3], r[7], 0x31);
        for (int i = 0; i < 8; i++) _mm256_storeu_ps(panel + (kk + i) * RK_NR + 8 * half, col[i]);
      }
  }
}
#endif

static int dense_gemm(rk_qformat f, const DLTensor *x, const uint8_t *w, int64_t n, const DLTensor *bias, DLTensor *out) {
  int64_t k = x->shape[x->ndim - 1];
  float_rows b = {w, n, k, f == RK_Q_F16};
  rk_matrix a = {rk_data(x), k, 1};
  rk_gemm g = {0};
  g.m = rk_numel(x) / k, g.n = n, g.k = k;
  g.pack_a = rk_pack_a_strided;
  g.a = &a;
  g.pack_b = gather_panels_generic;
#if defined(__x86_64__)
  if (rk_cpu_isa() == RK_ISA_AVX2 && __builtin_cpu_supports("f16c")) g.pack_b = gather_panels_f16c;
#endif
  g.b_source = &b;
  g.c = rk_data(out), g.c_rs = n, g.c_cs = 1;
  g.ep = rk_epilogue_none();
  g.ep.bias = bias ? rk_data(bias) : NULL;
  return rk_gemm_run(&g, 1);
}

/* (x, w, format, bias?, out): out[..., n] = x[..., k] . w[n, k] (+ bias[n]), w in its format. */
int rvm_builtin_kl_dense_q(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  (void)self, (void)result;
  static const char kernel[] = "relaxc.dense_q";
  DLTensor *x, *bias, *out;
  rk_qformat f;
  int rc = rk_check_count(kernel, num_args, 5);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 0, "x", &x);
  if (!rc) rc = arg_format(kernel, args, num_args, 2, &f);
  if (!rc) rc = rk_arg_f32_or_none(kernel, args, num_args, 3, "bias", &bias);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 4, "out", &out);
  if (rc) return rc;
  if (x->ndim < 1) return rk_shape_error(kernel, "x must have at least one axis", x);
  int64_t k = x->shape[x->ndim - 1], n;
  const uint8_t *w;
  if ((rc = arg_weights(kernel, args, num_args, 1, f, k, &w, &n))) return rc;
  int64_t m = k ? rk_numel(x) / k : 0;
  bool same = out->ndim == x->ndim && out->shape[out->ndim - 1] == n;
  for (int32_t i = 0; same && i + 1 < x->ndim; i++) same = out->shape[i] == x->shape[i];
  if (!same) return rk_shape_error(kernel, "out must be x's shape with the last axis the weights' rows", out);
  if (bias && (bias->ndim != 1 || bias->shape[0] != n)) return rk_shape_error(kernel, "bias must have one value per row of the weights", bias);
  if (m == 0 || n == 0) return 0;
  if ((f == RK_Q_F32 || f == RK_Q_F16) && m >= GEMM_ROWS) return dense_gemm(f, x, w, n, bias, out);
  const rk_qinfo *q = &formats[f];
  const rk_qdots *dots = qdots();
  /* A format an instruction set has no code for runs on the portable code. */
  dense_job j = {dots->dot[f] ? dots->dot[f] : portable.dot[f], dots->tile[f], dots->tile8[f], dots->tile16[f], dots->stream[f],
                 w, k / q->block * q->bytes, n, m,
                 {rk_data(x), NULL, NULL, NULL, k, q->act_block, f == RK_Q_Q4_KX8 ? m - m % 4 : 0},
                 bias ? rk_data(bias) : NULL, rk_data(out),
                 /* A float tile takes all of a call's few rows (fewer than GEMM_ROWS), its widest
                  * passes at a time: a 6-token prompt is two passes of three rows on AVX2, not
                  * three of two. The integer tiles take TILE rows a call. */
                 f == RK_Q_F32 || f == RK_Q_F16 ? m : TILE, f == RK_Q_F32, dots->decode_parts[f], 0};
  if (q->act_block) {
    size_t qbytes = (size_t)(m * k), dbytes = sizeof(float) * (size_t)(m * (k / q->act_block)),
           sbytes = sizeof(int16_t) * (size_t)(m * (k / 16));
    size_t dat = (qbytes + 63) & ~(size_t)63, sum = (dat + dbytes + 63) & ~(size_t)63;
    uint8_t *scratch = rk_scratch(RK_SLOT_INPUT, sum + sbytes);
    if (!scratch) return rk_out_of_memory(kernel);
    j.rows.q = (const int8_t *)scratch;
    j.rows.d = (const float *)(scratch + dat);
    j.rows.sum16 = (const int16_t *)(scratch + sum);
    /* Rows are quantized each on its own, so a prefill's many rows are spread over the pool. */
    rc = rk_parallel(m >= 16 ? m : 1, quantize_task, &j);
    if (rc) return rc;
  }
  /* Each task takes whole units of rows; few rows (a small layer) stay on one thread. */
  int64_t units = (n + ROWS_PER_TASK_UNIT - 1) / ROWS_PER_TASK_UNIT;
  int64_t work = m * n * k, max_tasks = work < (1 << 16) ? 1 : units;
  return rk_parallel(max_tasks, dense_task, &j);
}

/* ---- relaxc.take_q --------------------------------------------------------------------------- */

/* Row `r` of a table in format f, k values, as float32. */
static void dequantize_row(rk_qformat f, const uint8_t *r, int64_t k, float *y) {
  switch (f) {
  case RK_Q_F32:
    memcpy(y, r, sizeof(float) * (size_t)k);
    break;
  case RK_Q_F16:
    for (int64_t i = 0; i < k; i++) y[i] = rk_load_f16(r + 2 * i);
    break;
  case RK_Q_Q8_0:
    for (int64_t b = 0; b < k / 32; b++, r += 34)
      for (int i = 0; i < 32; i++) y[32 * b + i] = rk_load_f16(r) * (float)(int8_t)r[2 + i];
    break;
  case RK_Q_Q4_0:
    for (int64_t b = 0; b < k / 32; b++, r += 18)
      for (int i = 0; i < 16; i++) {
        y[32 * b + i] = rk_load_f16(r) * (float)((r[2 + i] & 0xf) - 8);
        y[32 * b + i + 16] = rk_load_f16(r) * (float)((r[2 + i] >> 4) - 8);
      }
    break;
  case RK_Q_Q4_1:
  case RK_Q_Q5_0:
  case RK_Q_Q5_1: {
    bool has_min = f != RK_Q_Q5_0, five = f != RK_Q_Q4_1;
    int bytes = f == RK_Q_Q4_1 ? 20 : f == RK_Q_Q5_0 ? 22 : 24;
    for (int64_t b = 0; b < k / 32; b++, r += bytes) {
      int q[32];
      block_values(r + (has_min ? 4 : 2) + (five ? 4 : 0), five ? r + (has_min ? 4 : 2) : NULL, q);
      for (int i = 0; i < 32; i++)
        y[32 * b + i] = has_min ? rk_load_f16(r) * (float)q[i] + rk_load_f16(r + 2) : rk_load_f16(r) * (float)(q[i] - 16);
    }
    break;
  }
  case RK_Q_Q4_K:
    for (int64_t b = 0; b < k / 256; b++, r += 144) {
      float d = rk_load_f16(r), dmin = rk_load_f16(r + 2);
      for (int j = 0; j < 8; j++) {
        int scale, min;
        rk_q4k_scale_min(j, r + 4, &scale, &min);
        const uint8_t *q = r + 16 + 32 * (j / 2);
        for (int i = 0; i < 32; i++)
          y[256 * b + 32 * j + i] = d * (float)scale * (float)((q[i] >> (4 * (j & 1))) & 0xf) - dmin * (float)min;
      }
    }
    break;
  case RK_Q_Q6_K:
    for (int64_t b = 0; b < k / 256; b++, r += 210) {
      float d = rk_load_f16(r + 208);
      const int8_t *scales = (const int8_t *)(r + 192);
      for (int half = 0; half < 2; half++) {
        const uint8_t *ql = r + 64 * half, *qh = r + 128 + 32 * half;
        for (int part = 0; part < 4; part++)
          for (int i = 0; i < 32; i++) {
            int low = part & 1 ? ql[i + 32] : ql[i];
            low = part & 2 ? low >> 4 : low & 0xf;
            int q = (low | (((qh[i] >> (2 * part)) & 3) << 4)) - 32;
            y[256 * b + 128 * half + 32 * part + i] = d * (float)scales[8 * half + 2 * part + i / 16] * (float)q;
          }
      }
    }
    break;
  default:
    break;
  }
}

/* (table, ids, format, out): out[i..., :] = row ids[i...] of the table, as float32 (an embedding
 * lookup with the table in its file's format). */
int rvm_builtin_kl_take_q(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  (void)self, (void)result;
  static const char kernel[] = "relaxc.take_q";
  DLTensor *out, *ids = NULL;
  rk_qformat f;
  int rc = rk_check_count(kernel, num_args, 4);
  if (!rc) rc = arg_format(kernel, args, num_args, 2, &f);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 3, "out", &out);
  if (rc) return rc;
  rc = rk_arg_i32(kernel, args, num_args, 1, "ids", &ids);
  if (rc) return rc;
  if (out->ndim != ids->ndim + 1) return rk_shape_error(kernel, "out must be ids' shape and one more axis", out);
  for (int32_t i = 0; i < ids->ndim; i++)
    if (out->shape[i] != ids->shape[i]) return rk_shape_error(kernel, "out must be ids' shape and one more axis", out);
  if (rk_qformat_x8(f))
    return rvm_raise("ValueError", "%s: regrouped tables are for dense_q; look rows up in the table as the file holds it", kernel);
  int64_t k = out->shape[out->ndim - 1], rows;
  const uint8_t *table;
  if ((rc = arg_weights(kernel, args, num_args, 0, f, k, &table, &rows))) return rc;
  const rk_qinfo *q = &formats[f];
  int64_t row_bytes = k / q->block * q->bytes, count = rk_numel(ids);
  const int32_t *id = (const int32_t *)((const char *)ids->data + ids->byte_offset);
  float *y = rk_data(out);
  for (int64_t i = 0; i < count; i++) {
    if (id[i] < 0 || id[i] >= rows)
      return rvm_raise("IndexError", "%s: id %d at position %lld is outside the table's %lld rows", kernel, id[i], (long long)i,
                       (long long)rows);
    dequantize_row(f, table + id[i] * row_bytes, k, y + i * k);
  }
  return 0;
}
