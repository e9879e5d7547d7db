/*
 * ggml_math.h: llama.cpp's element-wise arithmetic, for the kernels that reproduce its bits on the
 * models relaxc.llm builds from GGUF files (swiglu.c, attention_ggml.c): ggml's vector exp in its
 * forms, and the orders in which its x86 code adds a register's lanes.
 *
 * ggml's exp is adapted from Arm's optimized routines: 2^n times a degree-5 polynomial, with its
 * multiply-adds fused. Its 512-bit form (x86 with AVX-512F and DQ) adds the 1 inside the
 * polynomial and scales with vscalefps; its other forms (AVX2 + FMA, NEON) add the 1 in the last
 * multiply-add, which rounds differently now and then. The portable form here is the AVX2 one
 * written in C with fmaf, a lane at a time.
 */
#ifndef GGML_MATH_H
#define GGML_MATH_H

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "rk.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* Which of ggml's forms llama.cpp runs on this CPU (built for it, as its native build is). */
typedef enum { GGML_FORM_PORTABLE, GGML_FORM_AVX2, GGML_FORM_AVX512 } ggml_form;

/* Decided once per file that asks: AVX-512 (F and DQ), else AVX2 with FMA, else portable;
 * RELAXC_QUANT_ISA=portable|avx2 picks a lesser one, so that tests compare the forms on one CPU. */
static inline ggml_form ggml_cpu_form(void) {
  static _Atomic int chosen = -1;
  int f = atomic_load_explicit(&chosen, memory_order_relaxed);
  if (f >= 0) return (ggml_form)f;
  f = GGML_FORM_PORTABLE;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (rk_cpu_isa() == RK_ISA_AVX2 && !rk_quant_isa_forced("portable")) {
    bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
    f = avx512 && !rk_quant_isa_forced("avx2") ? GGML_FORM_AVX512 : GGML_FORM_AVX2;
  }
#endif
  atomic_store_explicit(&chosen, f, memory_order_relaxed);
  return (ggml_form)f;
}

/* The coefficients and constants of ggml's vector exp (Arm's expf). */
#define EXP_SHIFT 0x1.8p23f /* adding it rounds x / ln 2 to an integer in the low bits */
#define EXP_LOG2E 0x1.715476p+0f
#define EXP_LN2_HI 0x1.62e4p-1f
#define EXP_LN2_LO 0x1.7f7d1cp-20f
#define EXP_C1 0x1.ffffecp-1f
#define EXP_C2 0x1.fffdb6p-2f
#define EXP_C3 0x1.555e66p-3f
#define EXP_C4 0x1.573e2ep-5f
#define EXP_C5 0x1.0e4020p-7f

static inline float ggml_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static inline uint32_t ggml_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* ggml's exp in its AVX2/NEON form, one lane: e^x = 2^n (1 + p(b)), b = x - n ln 2. */
static inline float ggml_exp_fma_form(float x) {
  float z = fmaf(x, EXP_LOG2E, EXP_SHIFT);
  float n = z - EXP_SHIFT;
  float b = fmaf(-n, EXP_LN2_LO, fmaf(-n, EXP_LN2_HI, x));
  uint32_t e = ggml_to_bits(z) << 23;
  float k = ggml_from_bits(e + ggml_to_bits(1.0f));
  float u = b * b;
  float j = fmaf(fmaf(fmaf(EXP_C5, b, EXP_C4), u, fmaf(EXP_C3, b, EXP_C2)), u, EXP_C1 * b);
  if (!(fabsf(n) > 126.0f)) return fmaf(j, k, k);
  /* 2^n out of float's exponent range: scale twice (or saturate past 2^192). */
  uint32_t g = n <= 0.0f ? 0x82000000u : 0u;
  float s1 = ggml_from_bits(g + 0x7f000000u), s2 = ggml_from_bits(e - g);
  return fabsf(n) > 192.0f ? s1 * s1 : fmaf(s2, j, s2) * s1;
}

#if defined(__x86_64__)
/* ggml's AVX2 exp, eight lanes: exp_fma_form's operations in the same order. */
RK_AVX2_TARGET static inline __attribute__((always_inline)) __m256 ggml_exp_avx2(__m256 x) {
  const __m256 shift = _mm256_set1_ps(EXP_SHIFT);
  __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(EXP_LOG2E), shift);
  __m256 n = _mm256_sub_ps(z, shift);
  __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_LO), _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_HI), x));
  __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
  __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1.0f))));
  __m256 abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
  __m256 big = _mm256_cmp_ps(abs_n, _mm256_set1_ps(126.0f), _CMP_GT_OQ);
  __m256 u = _mm256_mul_ps(b, b);
  __m256 j = _mm256_fmadd_ps(
      _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(EXP_C5), b, _mm256_set1_ps(EXP_C4)), u,
                      _mm256_fmadd_ps(_mm256_set1_ps(EXP_C3), b, _mm256_set1_ps(EXP_C2))),
      u, _mm256_mul_ps(_mm256_set1_ps(EXP_C1), b));
  __m256 inside = _mm256_fmadd_ps(j, k, k);
  if (!_mm256_movemask_ps(big)) return inside;
  __m256i g = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                               _mm256_set1_epi32((int32_t)0x82000000u));
  __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
  __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
  __m256 huge = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
  __m256 scaled = _mm256_blendv_ps(inside, _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1), big);
  return _mm256_blendv_ps(scaled, _mm256_mul_ps(s1, s1), huge);
}

#define RK_AVX512DQ_TARGET __attribute__((target("avx512f,avx512dq,avx2,fma")))

/* ggml's AVX-512 exp, sixteen lanes: the 1 added inside the polynomial, 2^n applied by vscalefps. */
RK_AVX512DQ_TARGET static inline __attribute__((always_inline)) __m512 ggml_exp_avx512(__m512 x) {
  const __m512 shift = _mm512_set1_ps(EXP_SHIFT);
  __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(EXP_LOG2E), shift);
  __m512 n = _mm512_sub_ps(z, shift);
  __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_LO), _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_HI), x));
  __mmask16 huge = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192.0f), _CMP_GT_OQ);
  __m512 u = _mm512_mul_ps(b, b);
  __m512 j = _mm512_fmadd_ps(
      _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(EXP_C5), b, _mm512_set1_ps(EXP_C4)), u,
                      _mm512_fmadd_ps(_mm512_set1_ps(EXP_C3), b, _mm512_set1_ps(EXP_C2))),
      u, _mm512_fmadd_ps(_mm512_set1_ps(EXP_C1), b, _mm512_set1_ps(1.0f)));
  __m512 result = _mm512_scalef_ps(j, n);
  if (!huge) return result;
  __m512 zero = _mm512_setzero_ps();
  __m512 saturated = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(n, zero, _CMP_LE_OQ), _mm512_set1_ps(INFINITY), zero);
  return _mm512_mask_blend_ps(huge, result, saturated);
}


/* The orders of ggml's lane sums. hsum8: tinyBLAS's hsum and the softmax's sum of an AVX2
 * register, ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)). */
RK_AVX2_TARGET static inline __attribute__((always_inline)) float ggml_hsum8(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_add_ss(a, _mm_movehdup_ps(a)));
}

/* GCC's _mm512_reduce_add_ps (llama.cpp's builds use GCC's): halves, quarters, then lanes
 * (0 + 2) + (1 + 3) of what is left; written out so that any compiler gives its order. */
RK_AVX512DQ_TARGET static inline __attribute__((always_inline)) float ggml_reduce16(__m512 v) {
  __m256 half = _mm256_add_ps(_mm512_extractf32x8_ps(v, 1), _mm512_castps512_ps256(v));
  __m128 quarter = _mm_add_ps(_mm256_extractf128_ps(half, 1), _mm256_castps256_ps128(half));
  __m128 pairs = _mm_add_ps(quarter, _mm_shuffle_ps(quarter, quarter, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs)));
}
#endif

#endif /* GGML_MATH_H */
