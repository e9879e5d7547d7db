/*
 * quant_neon.c: the regrouped formats' tiles (q4_0x8, q8_0x8, q4_Kx8) and q6_K's dot product (never
 * regrouped; Q4_K_M files keep their output projection, the largest matrix, in it) for aarch64
 * with NEON.
 * Each row of a group is one int32 lane, as on x86; four products at a time are widened to int16
 * (vmull_s8) and summed pairwise into the lanes, which every aarch64 core has (the dot-product
 * extension's sdot would do it in one instruction, on the cores that have it). The sums are
 * exact and the floats are combined with the same multiply-adds (fused where the portable code
 * fuses), in the same order, as quant.c's portable tiles, so the results are theirs bit for bit.
 */
#if defined(__aarch64__)
#include <arm_neon.h>
#include <string.h>

#include "quant.h"

/* Rows 0-3 of w (4 bytes each) times the same 4 activation bytes: one sum per row. */
static inline int32x4_t dot4(int8x16_t w, int8x16_t x) {
  int32x4_t pairs_low = vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(x)));
  int32x4_t pairs_high = vpaddlq_s16(vmull_high_s8(w, x));
  return vpaddq_s32(pairs_low, pairs_high);
}

/* 4 activation bytes in every lane. */
static inline int8x16_t broadcast4(const int8_t *x) {
  uint32_t v;
  memcpy(&v, x, 4);
  return vreinterpretq_s8_u32(vdupq_n_u32(v));
}

/* The 8 rows' half-precision values at p as two float vectors. */
static inline void halves8(const uint8_t *p, float32x4_t *low, float32x4_t *high) {
  float16x8_t h = vreinterpretq_f16_u8(vld1q_u8(p));
  *low = vcvt_f32_f16(vget_low_f16(h));
  *high = vcvt_high_f32_f16(h);
}

/* The 8 rows' bytes at p (one per row) as two int32 vectors. */
static inline void bytes8(const uint8_t *p, int32x4_t *low, int32x4_t *high) {
  uint16x8_t wide = vmovl_u8(vld1_u8(p));
  *low = vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(wide)));
  *high = vreinterpretq_s32_u32(vmovl_high_u16(wide));
}

/* acc + a * b, fused exactly where quant.c's portable code fuses (rk_madd), so both give the same
 * bits whichever compiler built them. */
static inline float32x4_t madd4(float32x4_t acc, float32x4_t a, float32x4_t b) {
  return RK_PORTABLE_FUSED ? vfmaq_f32(acc, a, b) : vaddq_f32(acc, vmulq_f32(a, b));
}

static void store8(float *out, float32x4_t low, float32x4_t high) {
  vst1q_f32(out, low);
  vst1q_f32(out + 4, high);
}

void rk_neon_tile8_q4_0x8(const uint8_t *group, const rk_qrows *a, int64_t r0, int xrows, float *out, int64_t out_stride) {
  int64_t k = a->k;
  const uint8x16_t low = vdupq_n_u8(0xf);
  const int8x16_t eight = vdupq_n_s8(8);
  for (int r = 0; r < xrows; r++) {
    const int8_t *qx = a->q + (r0 + r) * k;
    const float *dx = a->d + (r0 + r) * (k / 32);
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = acc0;
    for (int64_t b = 0; b < k / 32; b++) {
      const uint8_t *blk = group + 144 * b;
      int32x4_t s0 = vdupq_n_s32(0), s1 = s0;
      for (int j = 0; j < 4; j++) {
        uint8x16_t v0 = vld1q_u8(blk + 16 + 32 * j), v1 = vld1q_u8(blk + 32 + 32 * j);
        int8x16_t x_low = broadcast4(qx + 32 * b + 4 * j), x_high = broadcast4(qx + 32 * b + 16 + 4 * j);
        s0 = vaddq_s32(s0, dot4(vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v0, low)), eight), x_low));
        s1 = vaddq_s32(s1, dot4(vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v1, low)), eight), x_low));
        s0 = vaddq_s32(s0, dot4(vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v0, 4)), eight), x_high));
        s1 = vaddq_s32(s1, dot4(vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v1, 4)), eight), x_high));
      }
      float32x4_t d0, d1;
      halves8(blk, &d0, &d1);
      acc0 = madd4(acc0, vmulq_n_f32(d0, dx[b]), vcvtq_f32_s32(s0));
      acc1 = madd4(acc1, vmulq_n_f32(d1, dx[b]), vcvtq_f32_s32(s1));
    }
    store8(out + r * out_stride, acc0, acc1);
  }
}

void rk_neon_tile8_q8_0x8(const uint8_t *group, const rk_qrows *a, int64_t r0, int xrows, float *out, int64_t out_stride) {
  int64_t k = a->k;
  for (int r = 0; r < xrows; r++) {
    const int8_t *qx = a->q + (r0 + r) * k;
    const float *dx = a->d + (r0 + r) * (k / 32);
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = acc0;
    for (int64_t b = 0; b < k / 32; b++) {
      const uint8_t *blk = group + 272 * b;
      int32x4_t s0 = vdupq_n_s32(0), s1 = s0;
      for (int j = 0; j < 8; j++) {
        int8x16_t x4 = broadcast4(qx + 32 * b + 4 * j);
        s0 = vaddq_s32(s0, dot4(vld1q_s8((const int8_t *)blk + 16 + 32 * j), x4));
        s1 = vaddq_s32(s1, dot4(vld1q_s8((const int8_t *)blk + 32 + 32 * j), x4));
      }
      float32x4_t d0, d1;
      halves8(blk, &d0, &d1);
      acc0 = madd4(acc0, vmulq_n_f32(d0, dx[b]), vcvtq_f32_s32(s0));
      acc1 = madd4(acc1, vmulq_n_f32(d1, dx[b]), vcvtq_f32_s32(s1));
    }
    store8(out + r * out_stride, acc0, acc1);
  }
}

void rk_neon_tile8_q4_Kx8(const uint8_t *group, const rk_qrows *a, int64_t r0, int xrows, float *out, int64_t out_stride) {
  int64_t k = a->k;
  const uint8x16_t low = vdupq_n_u8(0xf);
  for (int r = 0; r < xrows; r++) {
    const int8_t *qx = a->q + (r0 + r) * k;
    const int16_t *sx = a->sum16 + (r0 + r) * (k / 16);
    float32x4_t sum0 = vdupq_n_f32(0.0f), sum1 = sum0, mins0 = sum0, mins1 = sum0;
    int per = r0 + r < a->paired_rows ? 2 : 8; /* sub-blocks per float multiply-add (quant.h) */
    for (int64_t b = 0; b < k / 256; b++) {
      const uint8_t *blk = group + 1184 * b;
      float dxb = a->d[(r0 + r) * (k / 256) + b];
      float32x4_t d0, d1, dm0, dm1;
      halves8(blk, &d0, &d1);
      halves8(blk + 16, &dm0, &dm1);
      d0 = vmulq_n_f32(d0, dxb), d1 = vmulq_n_f32(d1, dxb), dm0 = vmulq_n_f32(dm0, dxb), dm1 = vmulq_n_f32(dm1, dxb);
      int32x4_t s0 = vdupq_n_s32(0), s1 = s0, m0 = s0, m1 = s0;
      for (int sub = 0; sub < 8; sub++) {
        int shift = 4 * (sub & 1);
        int32x4_t t0 = vdupq_n_s32(0), t1 = t0;
        for (int j = 0; j < 8; j++) {
          const uint8_t *v = blk + 160 + 256 * (sub / 2) + 32 * j;
          uint8x16_t v0 = vld1q_u8(v), v1 = vld1q_u8(v + 16);
          if (shift) v0 = vshrq_n_u8(v0, 4), v1 = vshrq_n_u8(v1, 4);
          int8x16_t x4 = broadcast4(qx + 256 * b + 32 * sub + 4 * j);
          t0 = vaddq_s32(t0, dot4(vreinterpretq_s8_u8(vandq_u8(v0, low)), x4));
          t1 = vaddq_s32(t1, dot4(vreinterpretq_s8_u8(vandq_u8(v1, low)), x4));
        }
        int32x4_t sc0, sc1, mn0, mn1;
        bytes8(blk + 32 + 8 * sub, &sc0, &sc1);
        bytes8(blk + 96 + 8 * sub, &mn0, &mn1);
        int32_t sum32 = sx[16 * b + 2 * sub] + sx[16 * b + 2 * sub + 1];
        s0 = vmlaq_s32(s0, sc0, t0);
        s1 = vmlaq_s32(s1, sc1, t1);
        m0 = vmlaq_n_s32(m0, mn0, sum32);
        m1 = vmlaq_n_s32(m1, mn1, sum32);
        if (sub % per == per - 1) {
          sum0 = madd4(sum0, d0, vcvtq_f32_s32(s0));
          sum1 = madd4(sum1, d1, vcvtq_f32_s32(s1));
          mins0 = madd4(mins0, dm0, vcvtq_f32_s32(m0));
          mins1 = madd4(mins1, dm1, vcvtq_f32_s32(m1));
          s0 = s1 = m0 = m1 = vdupq_n_s32(0);
        }
      }
    }
    store8(out + r * out_stride, vsubq_f32(sum0, mins0), vsubq_f32(sum1, mins1));
  }
}
/* The sums of q * x over bytes 4l..4l+3, l = 0..3, of 16 values: 4 of llama.cpp's lanes. */
static inline int32x4_t groups4(uint8x16_t q, const int8_t *x) {
  int8x16_t xv = vld1q_s8(x), qv = vreinterpretq_s8_u8(q);
  int32x4_t low = vpaddlq_s16(vmull_s8(vget_low_s8(qv), vget_low_s8(xv)));
  return vpaddq_s32(low, vpaddlq_s16(vmull_high_s8(qv, xv)));
}

/* q6_K in quant.c's dot_q6_K lanes (llama.cpp's x86 ones): lanes 0-3 from the first 16 values of
 * each part of 32 (h = 0), lanes 4-7 from the last 16. */
float rk_neon_dot_q6_K(const void *w, const float *x, const rk_qact *a, int64_t k) {
  (void)x;
  const uint8_t *blk = w;
  const uint8x16_t nibble = vdupq_n_u8(0xf), two = vdupq_n_u8(3);
  float32x4_t acc[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
  for (int64_t b = 0; b < k / 256; b++, blk += 210) {
    const int8_t *scales = (const int8_t *)(blk + 192), *qx = a->q + b * 256;
    const int16_t *sx = a->sum16 + b * 16;
    int32_t start[8];
    for (int l = 0; l < 8; l++) start[l] = -32 * (sx[2 * l] * scales[2 * l] + sx[2 * l + 1] * scales[2 * l + 1]);
    int32x4_t lanes[2] = {vld1q_s32(start), vld1q_s32(start + 4)};
    for (int half = 0; half < 2; half++) {
      const uint8_t *ql = blk + 64 * half, *qh = blk + 128 + 32 * half;
      for (int h = 0; h < 2; h++) { /* values 16h..16h+15 of each part of 32 */
        uint8x16_t l0 = vld1q_u8(ql + 16 * h), l1 = vld1q_u8(ql + 32 + 16 * h), hi = vld1q_u8(qh + 16 * h);
        uint8x16_t q[4] = {
            vorrq_u8(vandq_u8(l0, nibble), vshlq_n_u8(vandq_u8(hi, two), 4)),
            vorrq_u8(vandq_u8(l1, nibble), vshlq_n_u8(vandq_u8(vshrq_n_u8(hi, 2), two), 4)),
            vorrq_u8(vshrq_n_u8(l0, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hi, 4), two), 4)),
            vorrq_u8(vshrq_n_u8(l1, 4), vshlq_n_u8(vshrq_n_u8(hi, 6), 4)),
        };
        for (int part = 0; part < 4; part++) {
          int sub = 8 * half + 2 * part + h;
          lanes[h] = vmlaq_n_s32(lanes[h], groups4(q[part], qx + 128 * half + 32 * part + 16 * h), scales[sub]);
        }
      }
    }
    float32x4_t d = vdupq_n_f32(rk_load_f16(blk + 208) * a->d[b]);
    for (int h = 0; h < 2; h++)
      acc[h] = RK_PORTABLE_FUSED ? vfmaq_f32(acc[h], d, vcvtq_f32_s32(lanes[h]))
                                 : vaddq_f32(acc[h], vmulq_f32(d, vcvtq_f32_s32(lanes[h])));
  }
  /* quant.c's sum_lanes: (l0 + l4, l1 + l5, l2 + l6, l3 + l7), then (0 + 2) + (1 + 3). */
  float32x4_t pairs = vaddq_f32(acc[0], acc[1]);
  return (vgetq_lane_f32(pairs, 0) + vgetq_lane_f32(pairs, 2)) + (vgetq_lane_f32(pairs, 1) + vgetq_lane_f32(pairs, 3));
}
#endif
