/*
 * quant_x86.c: the quantized dot products for x86-64 with AVX2, FMA and F16C, twice: once with
 * AVX2's maddubs for the 8-bit products and once with AVX-512 VNNI's dpbusd (on 256-bit
 * registers) where the CPU has it. Both give exactly the integer sums of quant.c's portable
 * versions (no pair of products can saturate: one side is at most 63 in magnitude, or the sign
 * trick keeps it within 128 x 127), then scale them in the order written here. The VNNI table
 * also has 16-row tiles of q4_Kx8 and q4_0x8 in 512-bit registers, defined first.
 */
#if defined(__x86_64__)
#include <immintrin.h>

#include "quant.h"

/* ---- q4_Kx8 and q4_0x8, two groups at once in 512-bit registers (AVX-512 VNNI) ---------------------------- */

/* The VNNI q4_Kx8 kernel above with its 8 lanes doubled: lanes 0-7 are the first group's rows and
 * lanes 8-15 the second's, every lane computing exactly what it computes there (same integer
 * sums, same float steps), so a tile of 16 rows gives the bits of two tiles of 8, in half the
 * instructions (Zen 5's 512-bit units are full width): a 500-token prefill of the mid-size Q4_K_M
 * Llama went from 401-431 to 338-342 ms at 2 threads, every bit the same. */
#define KX16_TARGET "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni"
#define KX16_KERNEL(X)                                                                                      \
  {                                                                                                         \
    const int64_t k = a->k;                                                                                 \
    const __m512i low = _mm512_set1_epi8(0xf);                                                              \
    __m512 acc[4], mins[4];                                                                                 \
    _Pragma("GCC unroll 4") for (int r = 0; r < (X); r++) acc[r] = _mm512_setzero_ps(), mins[r] = acc[r];   \
    for (int64_t b = 0; b < k / 256; b++) {                                                                 \
      const uint8_t *b0 = g0 + 1184 * b, *b1 = g1 + 1184 * b;                                               \
      const __m512 d = _mm512_cvtph_ps(pair_halves(b0, b1));                                                \
      const __m512 dmin = _mm512_cvtph_ps(pair_halves(b0 + 16, b1 + 16));                                   \
      __m512 scale[4], scale_min[4];                                                                        \
      _Pragma("GCC unroll 4") for (int r = 0; r < (X); r++) {                                               \
        __m512 dx = _mm512_set1_ps(a->d[xr[r] * (k / 256) + b]);                                            \
        scale[r] = _mm512_mul_ps(d, dx), scale_min[r] = _mm512_mul_ps(dmin, dx);                            \
      }                                                                                                     \
      __m512i sum[4], msum[4];                                                                              \
      _Pragma("GCC unroll 4") for (int r = 0; r < (X); r++) sum[r] = _mm512_setzero_si512(), msum[r] = sum[r]; \
      for (int ch = 0; ch < 4; ch++) {                                                                      \
        __m512i lo[8], hi[8];                                                                               \
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {                                               \
          int64_t at = 160 + 256 * ch + 32 * j;                                                             \
          __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0 + at))), \
                                         _mm256_loadu_si256((const __m256i *)(b1 + at)), 1);                \
          lo[j] = _mm512_and_si512(v, low);                                                                 \
          hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);                                           \
        }                                                                                                   \
        __m512i slo = pair_u8(b0 + 32 + 16 * ch, b1 + 32 + 16 * ch), shi = pair_u8(b0 + 40 + 16 * ch, b1 + 40 + 16 * ch); \
        __m512i mlo = pair_u8(b0 + 96 + 16 * ch, b1 + 96 + 16 * ch), mhi = pair_u8(b0 + 104 + 16 * ch, b1 + 104 + 16 * ch); \
        _Pragma("GCC unroll 4") for (int r = 0; r < (X); r++) {                                             \
          const int8_t *qx = a->q + xr[r] * k + 256 * b + 64 * ch;                                          \
          const int16_t *sx = a->sum16 + xr[r] * (k / 16) + 16 * b + 4 * ch;                                \
          __m512i tlo = _mm512_setzero_si512(), thi = tlo;                                                  \
          _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {                                             \
            int32_t x0, x1;                                                                                 \
            __builtin_memcpy(&x0, qx + 4 * j, 4);                                                           \
            __builtin_memcpy(&x1, qx + 32 + 4 * j, 4);                                                      \
            tlo = _mm512_dpbusd_epi32(tlo, lo[j], _mm512_set1_epi32(x0));                                   \
            thi = _mm512_dpbusd_epi32(thi, hi[j], _mm512_set1_epi32(x1));                                   \
          }                                                                                                 \
          sum[r] = _mm512_add_epi32(sum[r], _mm512_add_epi32(_mm512_mullo_epi32(tlo, slo), _mm512_mullo_epi32(thi, shi))); \
          __m512i m = _mm512_add_epi32(_mm512_mullo_epi32(mlo, _mm512_set1_epi32(sx[0] + sx[1])),           \
                                       _mm512_mullo_epi32(mhi, _mm512_set1_epi32(sx[2] + sx[3])));          \
          msum[r] = _mm512_add_epi32(msum[r], m);                                                           \
          if (xr[r] < a->paired_rows || ch == 3) {                                                          \
            acc[r] = _mm512_fmadd_ps(scale[r], _mm512_cvtepi32_ps(sum[r]), acc[r]);                         \
            mins[r] = _mm512_fmadd_ps(scale_min[r], _mm512_cvtepi32_ps(msum[r]), mins[r]);                  \
            sum[r] = _mm512_setzero_si512(), msum[r] = sum[r];                                              \
          }                                                                                                 \
        }                                                                                                   \
      }                                                                                                     \
    }                                                                                                       \
    _Pragma("GCC unroll 4") for (int r = 0; r < (X); r++) _mm512_storeu_ps(res + 16 * r, _mm512_sub_ps(acc[r], mins[r])); \
  }

/* Eight bytes of each group as 16 int32 lanes. */
__attribute__((target(KX16_TARGET))) static inline __m512i pair_u8(const uint8_t *p0, const uint8_t *p1) {
  __m128i both = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)p0), _mm_loadl_epi64((const __m128i *)p1));
  return _mm512_cvtepu8_epi32(both);
}

/* Eight half-precision scales of each group, side by side. */
__attribute__((target(KX16_TARGET))) static inline __m256i pair_halves(const uint8_t *p0, const uint8_t *p1) {
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p0)),
                                 _mm_loadu_si128((const __m128i *)p1), 1);
}

__attribute__((target(KX16_TARGET))) static void q4_Kx16_one(const uint8_t *g0, const uint8_t *g1, const rk_qrows *a,
                                                             const int64_t *xr, float *res) KX16_KERNEL(1)
__attribute__((target(KX16_TARGET))) static void q4_Kx16_pair(const uint8_t *g0, const uint8_t *g1, const rk_qrows *a,
                                                              const int64_t *xr, float *res) KX16_KERNEL(2)
__attribute__((target(KX16_TARGET))) static void q4_Kx16_wide(const uint8_t *g0, const uint8_t *g1, const rk_qrows *a,
                                                              const int64_t *xr, float *res) KX16_KERNEL(4)

/* q4_0x8's VNNI kernel with its lanes doubled the same way. */
#define X16_Q4_0_KERNEL(X)                                                                                  \
  {                                                                                                         \
    const int64_t k = a->k;                                                                                 \
    const __m512i low = _mm512_set1_epi8(0xf);                                                              \
    __m512 acc[4];                                                                                          \
    _Pragma("GCC unroll 4") for (int r = 0; r < (X); r++) acc[r] = _mm512_setzero_ps();                     \
    for (int64_t b = 0; b < k / 32; b++) {                                                                  \
      const uint8_t *b0 = g0 + 144 * b, *b1 = g1 + 144 * b;                                                 \
      __m512 scales = _mm512_cvtph_ps(pair_halves(b0, b1));                                                 \
      __m512i lo[4], hi[4];                                                                                 \
      _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {                                                 \
        __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0 + 16 + 32 * j))), \
                                       _mm256_loadu_si256((const __m256i *)(b1 + 16 + 32 * j)), 1);         \
        lo[j] = _mm512_and_si512(v, low);                                                                   \
        hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);                                             \
      }                                                                                                     \
      _Pragma("GCC unroll 4") for (int r = 0; r < (X); r++) {                                               \
        const int8_t *qx = a->q + xr[r] * k + 32 * b;                                                       \
        const int16_t *s16 = a->sum16 + xr[r] * (k / 16) + 2 * b;                                          \
        __m512i p = _mm512_set1_epi32(-8 * (s16[0] + s16[1]));                                              \
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {                                               \
          int32_t x0, x1;                                                                                   \
          __builtin_memcpy(&x0, qx + 4 * j, 4);                                                             \
          __builtin_memcpy(&x1, qx + 16 + 4 * j, 4);                                                        \
          p = _mm512_dpbusd_epi32(p, lo[j], _mm512_set1_epi32(x0));                                         \
          p = _mm512_dpbusd_epi32(p, hi[j], _mm512_set1_epi32(x1));                                         \
        }                                                                                                   \
        __m512 d = _mm512_mul_ps(scales, _mm512_set1_ps(a->d[xr[r] * (k / 32) + b]));                       \
        acc[r] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc[r]);                                         \
      }                                                                                                     \
    }                                                                                                       \
    _Pragma("GCC unroll 4") for (int r = 0; r < (X); r++) _mm512_storeu_ps(res + 16 * r, acc[r]);           \
  }

__attribute__((target(KX16_TARGET))) static void q4_0x16_one(const uint8_t *g0, const uint8_t *g1, const rk_qrows *a,
                                                             const int64_t *xr, float *res) X16_Q4_0_KERNEL(1)
__attribute__((target(KX16_TARGET))) static void q4_0x16_pair(const uint8_t *g0, const uint8_t *g1, const rk_qrows *a,
                                                              const int64_t *xr, float *res) X16_Q4_0_KERNEL(2)
__attribute__((target(KX16_TARGET))) static void q4_0x16_wide(const uint8_t *g0, const uint8_t *g1, const rk_qrows *a,
                                                              const int64_t *xr, float *res) X16_Q4_0_KERNEL(4)

/* Two groups (16 rows: `group` and the next, group_bytes apart) against activation rows
 * [r0, r0 + xrows), four at a time, then two, then one. */
#define X16_TILE(format)                                                                                    \
  __attribute__((target(KX16_TARGET))) static void tile16_##format(const uint8_t *group, int64_t group_bytes, \
                                                                   const rk_qrows *a, int64_t r0, int xrows, \
                                                                   float *out, int64_t out_stride) {         \
    for (int r = 0; r < xrows;) {                                                                           \
      float res[16 * 4];                                                                                    \
      int64_t xr[4];                                                                                        \
      int left = xrows - r, take = left >= 4 ? 4 : left >= 2 ? 2 : 1;                                      \
      for (int i = 0; i < 4; i++) xr[i] = r0 + r + (i < take ? i : take - 1);                               \
      if (take == 4) format##_wide(group, group + group_bytes, a, xr, res);                                 \
      else if (take == 2) format##_pair(group, group + group_bytes, a, xr, res);                            \
      else format##_one(group, group + group_bytes, a, xr, res);                                            \
      for (int i = 0; i < take; i++)                                                                        \
        for (int c = 0; c < 16; c++) out[(r + i) * out_stride + c] = res[16 * i + c];                       \
      r += take;                                                                                            \
    }                                                                                                       \
  }
X16_TILE(q4_Kx16)
X16_TILE(q4_0x16)
#undef X16_TILE
#undef X16_Q4_0_KERNEL
#undef KX16_KERNEL
#undef KX16_TARGET

#define QX_TARGET "avx2,fma,f16c"
#define QX(name) name##_avx2
#define QX_DOT(acc, u, s) _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((u), (s)), _mm256_set1_epi16(1)))
/* Activation rows per pass of a tile: AVX2's 16 registers hold 4 x 3 float accumulators with
 * three activation vectors and a weight vector (llamafile's f32 tile on AVX2 too), but only 4 x 2
 * of the integer formats' with their unpacked blocks; AVX-512's 32 hold 4 x 4 of either. The
 * float formats' sums do not depend on the width. QX_WIDE is the largest. */
#define QX_WIDE 3
#define QX_FLOAT_WIDE 3
#define QX_INT_WIDE 2
/* f32 decoding reads 4 weight rows side by side: on Zen 3 the mid-size Llama's f32 matrices, mapped
 * from its GGUF file, streamed at 11.7 GB/s so at 1 thread against 10.3 a row at a time (14.1
 * against 11.8 from anonymous memory). Each row then has one 8-lane sum, as llamafile's f32 tile
 * sums it on AVX2. */
#define QX_F32_SIDE_BY_SIDE 1
/* ... and those four rows come from four far-apart parts of the task's rows (dense_q's
 * decode_in_parts says what it gained). */
#define QX_F32_DECODE_PARTS 4
/* f16 decoding prefetches 1 KiB ahead in each row: its matrices, mapped from the mid-size Llama's
 * GGUF file, streamed at 9.2 GB/s at 1 thread on Zen 3 against 8.0 without (15.1 against 13.6 at
 * 2). A run of 32 half-precision values is a cache line; the conversions leave the core fewer
 * loads in flight than f32's plain rows, which the prefetch makes up for. */
#define QX_F16_AHEAD 1024
/* f16 decoding reads a task's rows in one pass (rk_qdots.stream), row c of the first half beside
 * row c of the second: two long sequential streams, each line prefetched 1 KiB ahead. Over the
 * mid-size Llama's f16 matrices in decode order, mapped from its GGUF file on Zen 3 at 1 thread,
 * the two halves read 10.1-11.1 GB/s (three runs, medians of 31 passes) against 7.7-8.2 for the
 * rows one after another in one stream (itself 3-8% faster than tiles of 4 neighbouring rows);
 * the model's decode 1.23-1.72x at 1 thread and 1.08-1.45x at 2 (8 of 8 interleaved runs each). */
#define QX_F16_STREAM 1
/* Signed weights (q8_0x8) times signed activations: |w| times x with w's sign. */
#define QX_SIGNED_START(sum) ((void)(sum), _mm256_setzero_si256())
#define QX_SIGNED_DOT(acc, w, x) QX_DOT((acc), _mm256_sign_epi8((w), (w)), _mm256_sign_epi8((x), (w)))
#define QX_TILE16 {NULL}
#define QX_Q6_K_ZMM 0
/* The 4-bit regrouped formats (q4_0x8, q4_Kx8) add a row's 8 byte products of 4 in 16 bits,
 * then widen once: a product pair is at most 2 x 15 x 128 = 3840, so 8 of them stay below 2^15
 * (exact, as the 32-bit sums are), and each step costs 2 instructions instead of 3. Their decode
 * kernels on TinyLlama-sized matrices (1b GGUF, Zen 3): q4_0x8 +3.5% and +4% (1 and 2 threads),
 * q4_Kx8 +0.7% and +4%. */
#define QX_NIBBLE_SUMS16 1
#define QX_NIBBLE_DOT16(acc, u, s) _mm256_add_epi16((acc), _mm256_maddubs_epi16((u), (s)))
/* Decoding the integer formats prefetches every line of a block this far ahead in its stream:
 * the regrouped formats 1 KiB, rows read alone (q6_K, which stays in place) 2 KiB. On the 1b
 * GGUF's matrices on Zen 3 against none: q4_0x8 +18%, q4_Kx8 +17%, q6_K +25% (+8% more from 2
 * KiB over 1), q8_0x8 +14% at 1 thread; +13%, +12%, +12% and +5% at 2. 2 KiB was slower for
 * q8_0x8 (-4% and -10%), 4 KiB no better for q6_K; f32's rows read side by side lost 20% with a
 * prefetch. */
#define QX_X8_AHEAD 1024
#define QX_ONE_AHEAD 2048
#include "quant_x86_body.h"
#undef QX_TARGET
#undef QX
#undef QX_DOT
#undef QX_WIDE
#undef QX_FLOAT_WIDE
#undef QX_INT_WIDE
#undef QX_F32_SIDE_BY_SIDE
#undef QX_F32_DECODE_PARTS
#undef QX_F16_AHEAD
#undef QX_F16_STREAM
#undef QX_SIGNED_START
#undef QX_SIGNED_DOT
#undef QX_TILE16
#undef QX_Q6_K_ZMM
#undef QX_NIBBLE_SUMS16
#undef QX_X8_AHEAD
#undef QX_ONE_AHEAD
#undef QX_NIBBLE_DOT16

#define QX_TARGET "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni"
#define QX(name) name##_vnni
#define QX_DOT(acc, u, s) _mm256_dpbusd_epi32((acc), (u), (s))
#define QX_WIDE 4
#define QX_FLOAT_WIDE 4
#define QX_INT_WIDE 4
/* Decoding reads float rows one at a time here, without prefetch: on Zen 5 four rows side by side
 * measured slower, and f16 decoded faster without a prefetch 2 KiB ahead than with one. */
#define QX_F32_SIDE_BY_SIDE 0
#define QX_F32_DECODE_PARTS 0
#define QX_F16_AHEAD 0
#define QX_F16_STREAM 0
/* Signed weights times signed activations: w + 128 (unsigned) times x, less 128 times x's sum
 * (dpbusd has no pair to saturate, unlike maddubs). */
#define QX_SIGNED_START(sum) _mm256_set1_epi32(-128 * (sum))
#define QX_SIGNED_DOT(acc, w, x) QX_DOT((acc), _mm256_xor_si256((w), _mm256_set1_epi8((char)0x80)), (x))
#define QX_TILE16 {[RK_Q_Q4_0X8] = tile16_q4_0x16, [RK_Q_Q4_KX8] = tile16_q4_Kx16}
/* q6_K two parts per 512-bit register (the same bits). */
#define QX_Q6_K_ZMM 1
/* dpbusd adds 4 products into 32 bits in one instruction: nothing to gain from 16-bit sums. */
#define QX_NIBBLE_SUMS16 0
#define QX_NIBBLE_DOT16(acc, u, s) (acc)
/* No integer prefetch here until it is measured on an AVX-512 machine (on Zen 5, f16 decoded
 * faster without one). */
#define QX_X8_AHEAD 0
#define QX_ONE_AHEAD 0
#include "quant_x86_body.h"

const rk_qdots *rk_qdots_avx2(void) { return &qdots_avx2; }
const rk_qdots *rk_qdots_vnni(void) { return &qdots_vnni; }
#endif
