/*
 * quant_x86.c: the quantized dot products for x86-64 with AVX2, FMA and F16C, twice: once with
 * AVX2's maddubs for the 8-bit products and once with AVX-512 VNNI's dpbusd (on 256-bit
 * registers) where the CPU has it. Both give exactly the integer sums of quant.c's portable
 * versions (no pair of products can saturate: one side is at most 63 in magnitude, or the sign
 * trick keeps it within 128 x 127), then scale them in the order written here.
 */
#if defined(__x86_64__)
#include <immintrin.h>

#include "quant.h"

#define QX_TARGET "avx2,fma,f16c"
#define QX(name) name##_avx2
#define QX_DOT(acc, u, s) _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((u), (s)), _mm256_set1_epi16(1)))
/* Activation rows per tile: AVX2's 16 registers hold 4 x 2 accumulators, AVX-512's 32 hold 4 x 4. */
#define QX_WIDE 2
/* Signed weights (q8_0x8) times signed activations: |w| times x with w's sign. */
#define QX_SIGNED_START(sum) ((void)(sum), _mm256_setzero_si256())
#define QX_SIGNED_DOT(acc, w, x) QX_DOT((acc), _mm256_sign_epi8((w), (w)), _mm256_sign_epi8((x), (w)))
#include "quant_x86_body.h"
#undef QX_TARGET
#undef QX
#undef QX_DOT
#undef QX_WIDE
#undef QX_SIGNED_START
#undef QX_SIGNED_DOT

#define QX_TARGET "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni"
#define QX(name) name##_vnni
#define QX_DOT(acc, u, s) _mm256_dpbusd_epi32((acc), (u), (s))
#define QX_WIDE 4
/* Signed weights times signed activations: w + 128 (unsigned) times x, less 128 times x's sum
 * (dpbusd has no pair to saturate, unlike maddubs). */
#define QX_SIGNED_START(sum) _mm256_set1_epi32(-128 * (sum))
#define QX_SIGNED_DOT(acc, w, x) QX_DOT((acc), _mm256_xor_si256((w), _mm256_set1_epi8((char)0x80)), (x))
#include "quant_x86_body.h"

const rk_qdots *rk_qdots_avx2(void) { return &qdots_avx2; }
const rk_qdots *rk_qdots_vnni(void) { return &qdots_vnni; }
#endif
