/*
 * ukernel.c: the GEMM micro-kernels, one per instruction set, and the choice among them.
 *
 * Each computes an RK_MR x RK_NR tile from a packed strip of A ([kc][MR]) and a packed panel of
 * B ([kc][NR]) in registers, summing over k in order with one fused multiply-add per step, so
 * the bits of an element depend only on its inputs and kc, never on which rows share its tile.
 * A variant exists for every row count 1..MR, so a GEMV or a 7-row GEMM does no wasted work.
 *
 * x86-64: AVX2 + FMA (12 accumulators, 2 loads of B and 6 broadcasts of A per step), chosen at
 * run time by cpuid so one model runs on any x86-64 CPU, and where the CPU has AVX-512 the same
 * kernel with a 16-lane register per row, and one over two panels at once (12 accumulators of 16
 * lanes), both with the same bits; others take the portable kernel. With AVX2 and AVX-512,
 * kernels that read B in place (a row offset per step: a stride-1 convolution's padded image)
 * spare a convolution its packing (AVX-512 over 6 or 12 rows), with the packed kernels' bits.
 * aarch64: NEON (24 accumulators, lane-indexed FMA). Elsewhere (riscv64): portable C.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rk.h"

/* A fused multiply-add where the hardware has one, else a multiply and an add (a libm fmaf
 * would be a slow software emulation). The portable kernel's bits follow from this choice. */
#if defined(__FP_FAST_FMAF)
#define RK_FMA(a, b, c) fmaf((a), (b), (c))
#else
#define RK_FMA(a, b, c) ((a) * (b) + (c))
#endif

/* ---- portable ------------------------------------------------------------------------------ */

static void generic_ukernel(int64_t kc, const float *a, const float *b, float *tile, int mr) {
  float acc[RK_MR][RK_NR];
  memset(acc, 0, sizeof acc);
  for (int64_t k = 0; k < kc; k++) {
    for (int r = 0; r < mr; r++) {
      float ar = a[r];
      for (int j = 0; j < RK_NR; j++) acc[r][j] = RK_FMA(ar, b[j], acc[r][j]);
    }
    a += RK_MR;
    b += RK_NR;
  }
  memcpy(tile, acc, sizeof(float) * RK_NR * (size_t)mr);
}

/* tile[q][j] = sum over k < kc of a[k * RK_MR] * panel q's b[k][j], for the 4 panels starting at
 * b, `stride` floats apart: one row of A against four panels at once, so that four streams of
 * weights are in flight (a single stream does not reach the memory's bandwidth: on the 2-core
 * Zen 1 VM one stream read 11-15 GB/s, four 20 GB/s), each prefetched GEMV_PREFETCH floats ahead
 * (18.4 GB/s for a 64 MB GEMV on one core, against 16.4 without). */
enum { GEMV_PREFETCH = 64 };
static void generic_gemv4(int64_t kc, const float *a, const float *b, int64_t stride, float *tile) {
  float acc[4][RK_NR];
  memset(acc, 0, sizeof acc);
  for (int64_t k = 0; k < kc; k++) {
    float ak = a[k * RK_MR];
    for (int q = 0; q < 4; q++) __builtin_prefetch(b + q * stride + k * RK_NR + GEMV_PREFETCH);
    for (int q = 0; q < 4; q++)
      for (int j = 0; j < RK_NR; j++) acc[q][j] = RK_FMA(ak, b[q * stride + k * RK_NR + j], acc[q][j]);
  }
  memcpy(tile, acc, sizeof acc);
}

/* ---- x86-64: AVX2 + FMA -------------------------------------------------------------------- */

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>

#define RK_AVX2 __attribute__((target("avx2,fma")))

/* B is prefetched this many floats (32 steps) ahead: a product of few rows streams its weights
 * faster than the hardware prefetcher fetches them (7x3072x768 on the Zen 1 VM: 1.43 ms with,
 * 1.75 ms without; no change where B stays in cache). Weights streamed from memory (the
 * streaming path) are prefetched 8 KB ahead, enough to cover the memory's latency at its
 * bandwidth (7x3072x768 from memory on a Zen 4 VM: 626 -> 560 us); where B is in cache that
 * distance costs 8% (7x768x768), so blocked products keep the short one. */
enum { UKERNEL_PREFETCH = 512, UKERNEL_PREFETCH_STREAM = 2048 };

/* The sums of a tile in c00..c51: one step of k per iteration, two loads of B and a broadcast of
 * A per row (rows at or past mr fold away once inlined). */
#define AVX2_ACCUMULATE(prefetch)                                                    \
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00; \
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;             \
  for (int64_t k = 0; k < kc; k++) {                                                  \
    _mm_prefetch((const char *)(b + (prefetch)), _MM_HINT_T0);                        \
    __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);                      \
    AVX2_ROW(0) AVX2_ROW(1) AVX2_ROW(2) AVX2_ROW(3) AVX2_ROW(4) AVX2_ROW(5)           \
    a += RK_MR;                                                                       \
    b += RK_NR;                                                                       \
  }

/* The body for a constant row count: rows at or past mr fold away once inlined. */
#define AVX2_ROW(r)                                    \
  if (mr > r) {                                        \
    __m256 ar = _mm256_broadcast_ss(a + r);            \
    c##r##0 = _mm256_fmadd_ps(ar, b0, c##r##0);         \
    c##r##1 = _mm256_fmadd_ps(ar, b1, c##r##1);         \
  }
#define AVX2_STORE(r)                                  \
  if (mr > r) {                                        \
    _mm256_storeu_ps(tile + r * RK_NR, c##r##0);       \
    _mm256_storeu_ps(tile + r * RK_NR + 8, c##r##1);   \
  }

RK_AVX2 static inline __attribute__((always_inline)) void avx2_body(int64_t kc, const float *a, const float *b,
                                                                    float *tile, const int mr, const int prefetch) {
  AVX2_ACCUMULATE(prefetch)
  AVX2_STORE(0) AVX2_STORE(1) AVX2_STORE(2) AVX2_STORE(3) AVX2_STORE(4) AVX2_STORE(5)
}

#define AVX2_UKERNEL(name, prefetch)                                                  \
  RK_AVX2 static void name(int64_t kc, const float *a, const float *b, float *tile, int mr) { \
    switch (mr) {                                                                     \
      case 1: avx2_body(kc, a, b, tile, 1, prefetch); break;                          \
      case 2: avx2_body(kc, a, b, tile, 2, prefetch); break;                          \
      case 3: avx2_body(kc, a, b, tile, 3, prefetch); break;                          \
      case 4: avx2_body(kc, a, b, tile, 4, prefetch); break;                          \
      case 5: avx2_body(kc, a, b, tile, 5, prefetch); break;                          \
      default: avx2_body(kc, a, b, tile, 6, prefetch); break;                         \
    }                                                                                 \
  }
AVX2_UKERNEL(avx2_ukernel, UKERNEL_PREFETCH)
AVX2_UKERNEL(avx2_ukernel_stream, UKERNEL_PREFETCH_STREAM)

RK_AVX2 static void avx2_gemv4(int64_t kc, const float *a, const float *b, int64_t stride, float *tile) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00;
  const float *b1 = b + stride, *b2 = b + 2 * stride, *b3 = b + 3 * stride;
  for (int64_t k = 0; k < kc; k++) {
    __m256 ak = _mm256_broadcast_ss(a + k * RK_MR);
    int64_t o = k * RK_NR;
    _mm_prefetch((const char *)(b + o + GEMV_PREFETCH), _MM_HINT_T0);
    _mm_prefetch((const char *)(b1 + o + GEMV_PREFETCH), _MM_HINT_T0);
    _mm_prefetch((const char *)(b2 + o + GEMV_PREFETCH), _MM_HINT_T0);
    _mm_prefetch((const char *)(b3 + o + GEMV_PREFETCH), _MM_HINT_T0);
    c00 = _mm256_fmadd_ps(ak, _mm256_loadu_ps(b + o), c00);
    c01 = _mm256_fmadd_ps(ak, _mm256_loadu_ps(b + o + 8), c01);
    c10 = _mm256_fmadd_ps(ak, _mm256_loadu_ps(b1 + o), c10);
    c11 = _mm256_fmadd_ps(ak, _mm256_loadu_ps(b1 + o + 8), c11);
    c20 = _mm256_fmadd_ps(ak, _mm256_loadu_ps(b2 + o), c20);
    c21 = _mm256_fmadd_ps(ak, _mm256_loadu_ps(b2 + o + 8), c21);
    c30 = _mm256_fmadd_ps(ak, _mm256_loadu_ps(b3 + o), c30);
    c31 = _mm256_fmadd_ps(ak, _mm256_loadu_ps(b3 + o + 8), c31);
  }
  _mm256_storeu_ps(tile, c00);
  _mm256_storeu_ps(tile + 8, c01);
  _mm256_storeu_ps(tile + 16, c10);
  _mm256_storeu_ps(tile + 24, c11);
  _mm256_storeu_ps(tile + 32, c20);
  _mm256_storeu_ps(tile + 40, c21);
  _mm256_storeu_ps(tile + 48, c30);
  _mm256_storeu_ps(tile + 56, c31);
}

/* rk_hard_sigmoid(x, lo, hi) on 8 lanes (x times it for hard_swish), its operations in its order:
 * y = lo * x + hi, then y < 0 ? 0 : (y > 1 ? 1 : y) by compare and blend (NaN stays NaN). */
RK_AVX2 static inline __attribute__((always_inline)) __m256 avx2_hard(__m256 x, __m256 lo, __m256 hi, bool swish) {
  __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
  __m256 y = _mm256_add_ps(_mm256_mul_ps(lo, x), hi);
  y = _mm256_blendv_ps(y, zero, _mm256_cmp_ps(y, zero, _CMP_LT_OQ));
  y = _mm256_blendv_ps(y, one, _mm256_cmp_ps(y, one, _CMP_GT_OQ));
  return swish ? _mm256_mul_ps(x, y) : y;
}

/* Row r's sums, two 8-lane halves v0 and v1, into C's row cr: the epilogue of rk_tile_epilogue,
 * in store_tile's order. relu and clip by comparison and blend, as the scalar `x > 0 ? x : 0`
 * and `x < lo ? lo : (x > hi ? hi : x)`: NaN and -0.0 come out as they do there. */
#define AVX2_OUT(v0, v1, cr, r)                                                                     \
  {                                                                                                 \
    if (!ep->first) {                                                                               \
      v0 = _mm256_add_ps(_mm256_loadu_ps(cr), v0);                                                  \
      v1 = _mm256_add_ps(_mm256_loadu_ps(cr + 8), v1);                                              \
    }                                                                                               \
    if (ep->last) {                                                                                 \
      if (ep->alpha != 1.0f) {                                                                      \
        v0 = _mm256_mul_ps(v0, alpha);                                                              \
        v1 = _mm256_mul_ps(v1, alpha);                                                              \
      }                                                                                             \
      if (ep->bias) {                                                                               \
        if (ep->bias_per_row) {                                                                     \
          __m256 b = _mm256_broadcast_ss(ep->bias + r);                                             \
          v0 = _mm256_add_ps(v0, b);                                                                \
          v1 = _mm256_add_ps(v1, b);                                                                \
        } else {                                                                                    \
          v0 = _mm256_add_ps(v0, _mm256_loadu_ps(ep->bias));                                        \
          v1 = _mm256_add_ps(v1, _mm256_loadu_ps(ep->bias + 8));                                    \
        }                                                                                           \
      }                                                                                             \
      if (ep->residual) {                                                                           \
        v0 = _mm256_add_ps(v0, _mm256_loadu_ps(ep->residual + r * ep->res_rs));                     \
        v1 = _mm256_add_ps(v1, _mm256_loadu_ps(ep->residual + r * ep->res_rs + 8));                 \
      }                                                                                             \
      if (ep->act == RK_ACT_RELU) {                                                                 \
        v0 = _mm256_blendv_ps(zero, v0, _mm256_cmp_ps(v0, zero, _CMP_GT_OQ));                       \
        v1 = _mm256_blendv_ps(zero, v1, _mm256_cmp_ps(v1, zero, _CMP_GT_OQ));                       \
      } else if (ep->act == RK_ACT_CLIP) {                                                          \
        v0 = _mm256_blendv_ps(_mm256_blendv_ps(v0, hi, _mm256_cmp_ps(v0, hi, _CMP_GT_OQ)), lo,      \
                              _mm256_cmp_ps(v0, lo, _CMP_LT_OQ));                                   \
        v1 = _mm256_blendv_ps(_mm256_blendv_ps(v1, hi, _mm256_cmp_ps(v1, hi, _CMP_GT_OQ)), lo,      \
                              _mm256_cmp_ps(v1, lo, _CMP_LT_OQ));                                   \
      } else if (ep->act == RK_ACT_HARD_SIGMOID || ep->act == RK_ACT_HARD_SWISH) {                  \
        v0 = avx2_hard(v0, lo, hi, ep->act == RK_ACT_HARD_SWISH);                                   \
        v1 = avx2_hard(v1, lo, hi, ep->act == RK_ACT_HARD_SWISH);                                   \
      }                                                                                             \
    }                                                                                               \
    _mm256_storeu_ps(cr, v0);                                                                       \
    _mm256_storeu_ps(cr + 8, v1);                                                                   \
  }

/* Row r of the tile in registers (c<r>0, c<r>1) into C. */
#define AVX2_ROW_OUT(r)                                                                          \
  if (mr > r) {                                                                                  \
    float *cr = c + r * c_rs;                                                                    \
    __m256 v0 = c##r##0, v1 = c##r##1;                                                           \
    AVX2_OUT(v0, v1, cr, r)                                                                      \
  }

RK_AVX2 static inline __attribute__((always_inline)) void avx2_body_c(int64_t kc, const float *a, const float *b,
                                                                      float *c, int64_t c_rs, const int mr,
                                                                      const rk_tile_epilogue *ep, const int prefetch) {
  AVX2_ACCUMULATE(prefetch)
  __m256 zero = _mm256_setzero_ps(), alpha = _mm256_set1_ps(ep->alpha);
  __m256 lo = _mm256_set1_ps(ep->lo), hi = _mm256_set1_ps(ep->hi);
  AVX2_ROW_OUT(0) AVX2_ROW_OUT(1) AVX2_ROW_OUT(2) AVX2_ROW_OUT(3) AVX2_ROW_OUT(4) AVX2_ROW_OUT(5)
}

#define AVX2_UKERNEL_C(name, prefetch)                                                          \
  RK_AVX2 static void name(int64_t kc, const float *a, const float *b, float *c, int64_t c_rs, int mr, \
                           const rk_tile_epilogue *ep) {                                        \
    switch (mr) {                                                                               \
      case 1: avx2_body_c(kc, a, b, c, c_rs, 1, ep, prefetch); break;                           \
      case 2: avx2_body_c(kc, a, b, c, c_rs, 2, ep, prefetch); break;                           \
      case 3: avx2_body_c(kc, a, b, c, c_rs, 3, ep, prefetch); break;                           \
      case 4: avx2_body_c(kc, a, b, c, c_rs, 4, ep, prefetch); break;                           \
      case 5: avx2_body_c(kc, a, b, c, c_rs, 5, ep, prefetch); break;                           \
      default: avx2_body_c(kc, a, b, c, c_rs, 6, ep, prefetch); break;                          \
    }                                                                                           \
  }
AVX2_UKERNEL_C(avx2_ukernel_c, UKERNEL_PREFETCH)
AVX2_UKERNEL_C(avx2_ukernel_c_stream, UKERNEL_PREFETCH_STREAM)

/* Row r of a tile whose panel has only nr < RK_NR columns in C, as a full one-row tile: C's nr
 * values (and the residual's, and a per-column bias's) copied into 16-wide rows, zeros past nr,
 * so the full-width epilogue runs on them and nothing past nr of C is read or written; the
 * caller copies `row`'s first nr values back. cols[0] holds the bias, cols[1] the residual. */
static inline rk_tile_epilogue short_row(const rk_tile_epilogue *ep, int r, int nr, const float *c_row, float *row,
                                         float cols[2][RK_NR]) {
  rk_tile_epilogue t = *ep;
  size_t bytes = sizeof(float) * (size_t)nr;
  memset(row, 0, sizeof(float) * RK_NR);
  memcpy(row, c_row, bytes);
  if (ep->bias && ep->bias_per_row) t.bias = ep->bias + r;
  if (ep->bias && !ep->bias_per_row) {
    memset(cols[0], 0, sizeof cols[0]);
    t.bias = memcpy(cols[0], ep->bias, bytes);
  }
  if (ep->residual) {
    memset(cols[1], 0, sizeof cols[1]);
    t.residual = memcpy(cols[1], ep->residual + r * ep->res_rs, bytes);
  }
  return t;
}

/* B read in place (see the AVX-512 kernels below): step k's columns start at b + rows[k]. One
 * panel at a time, as 16 registers hold no more sums. */
#define AVX2_ACCUMULATE_ROWS                                                                     \
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00; \
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;             \
  for (int64_t k = 0; k < kc; k++) {                                                  \
    const float *row = b + rows[k];                                                   \
    __m256 b0 = masked ? _mm256_maskload_ps(row, mask0) : _mm256_loadu_ps(row);       \
    __m256 b1 = masked ? _mm256_maskload_ps(row + 8, mask1) : _mm256_loadu_ps(row + 8); \
    AVX2_ROW(0) AVX2_ROW(1) AVX2_ROW(2) AVX2_ROW(3) AVX2_ROW(4) AVX2_ROW(5)           \
    a += RK_MR;                                                                       \
  }

/* The rows of a tile of sums (row stride RK_NR) into C, the epilogue out of line and shared by
 * every variant of the in-place kernel: unrolled into each, it made them 12 KB; spilling the sums
 * costs two stores and loads a row against hundreds of steps of the reduction. */
RK_AVX2 static __attribute__((noinline)) void avx2_tile_out(const float *tile, int mr, int nr, float *c, int64_t c_rs,
                                                            const rk_tile_epilogue *ep) {
  __m256 zero = _mm256_setzero_ps(), alpha = _mm256_set1_ps(ep->alpha);
  __m256 lo = _mm256_set1_ps(ep->lo), hi = _mm256_set1_ps(ep->hi);
  if (nr < RK_NR) {
    /* A short panel: see short_row. */
    for (int r = 0; r < mr; r++) {
      float row[RK_NR] __attribute__((aligned(32))), cols[2][RK_NR];
      rk_tile_epilogue t = short_row(ep, r, nr, c + r * c_rs, row, cols);
      avx2_tile_out(tile + r * RK_NR, 1, RK_NR, row, 0, &t);
      memcpy(c + r * c_rs, row, sizeof(float) * (size_t)nr);
    }
    return;
  }
  for (int r = 0; r < mr; r++) {
    float *cr = c + r * c_rs;
    __m256 v0 = _mm256_load_ps(tile + r * RK_NR), v1 = _mm256_load_ps(tile + r * RK_NR + 8);
    AVX2_OUT(v0, v1, cr, r)
  }
}

#define AVX2_SPILL(r)                                    \
  if (mr > r) {                                          \
    _mm256_store_ps(tile + r * RK_NR, c##r##0);          \
    _mm256_store_ps(tile + r * RK_NR + 8, c##r##1);      \
  }

RK_AVX2 static inline __attribute__((always_inline)) void avx2_body_rows(int64_t kc, const float *a, const float *b,
                                                                         const int64_t *rows, float *tile,
                                                                         const int mr, const bool masked, __m256i mask0,
                                                                         __m256i mask1) {
  AVX2_ACCUMULATE_ROWS
  AVX2_SPILL(0) AVX2_SPILL(1) AVX2_SPILL(2) AVX2_SPILL(3) AVX2_SPILL(4) AVX2_SPILL(5)
}

#define AVX2_ROWS_CASES(masked)                                                               \
  switch (mr) {                                                                               \
    case 1: avx2_body_rows(kc, a, bq, rows, tile, 1, masked, mask0, mask1); break;            \
    case 2: avx2_body_rows(kc, a, bq, rows, tile, 2, masked, mask0, mask1); break;            \
    case 3: avx2_body_rows(kc, a, bq, rows, tile, 3, masked, mask0, mask1); break;            \
    case 4: avx2_body_rows(kc, a, bq, rows, tile, 4, masked, mask0, mask1); break;            \
    case 5: avx2_body_rows(kc, a, bq, rows, tile, 5, masked, mask0, mask1); break;            \
    default: avx2_body_rows(kc, a, bq, rows, tile, 6, masked, mask0, mask1); break;           \
  }

RK_AVX2 static void avx2_ukernel_rows_c(int64_t kc, const float *a, const float *b, const int64_t *rows, int panels,
                                        int nr, float *c, int64_t c_rs, int mr, const rk_tile_epilogue *ep) {
  float tile[RK_MR * RK_NR] __attribute__((aligned(32)));
  /* Lanes past nr of a short panel: masked loads read nothing there (and cannot fault). */
  __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256i mask0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr), lane);
  __m256i mask1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr - 8), lane);
  for (int q = 0; q < panels; q++) {
    /* The second panel's epilogue: its columns of the bias (per column) and of the residual. */
    rk_tile_epilogue t = *ep;
    if (t.bias && !t.bias_per_row) t.bias += q * RK_NR;
    if (t.residual) t.residual += q * RK_NR;
    const float *bq = b + q * RK_NR;
    if (panels == 1 && nr < RK_NR) {
      AVX2_ROWS_CASES(true)
    } else {
      AVX2_ROWS_CASES(false)
    }
    avx2_tile_out(tile, mr, panels == 1 ? nr : RK_NR, c + q * RK_NR, c_rs, &t);
  }
}

/* ---- x86-64: AVX-512 (the AVX2 path's kernels, one 16-lane register per row) ----------------- */

/* A row of the tile is one 512-bit register: each lane does the very multiply-adds, in the same
 * order, as the AVX2 kernel's two halves, so the bits are the AVX2 path's. Where the CPU has two
 * 512-bit FMA units (Zen 5) a step takes 6 instructions instead of 12. */
#define RK_AVX512 __attribute__((target("avx512f,avx2,fma")))

#define AVX512_ACCUMULATE(prefetch)                                                               \
  __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;                 \
  for (int64_t k = 0; k < kc; k++) {                                                             \
    _mm_prefetch((const char *)(b + (prefetch)), _MM_HINT_T0);                                   \
    __m512 bv = _mm512_loadu_ps(b);                                                              \
    AVX512_ROW(0) AVX512_ROW(1) AVX512_ROW(2) AVX512_ROW(3) AVX512_ROW(4) AVX512_ROW(5)          \
    a += RK_MR;                                                                                  \
    b += RK_NR;                                                                                  \
  }
#define AVX512_ROW(r) \
  if (mr > r) c##r = _mm512_fmadd_ps(_mm512_set1_ps(a[r]), bv, c##r);
#define AVX512_STORE(r) \
  if (mr > r) _mm512_storeu_ps(tile + r * RK_NR, c##r);

RK_AVX512 static inline __attribute__((always_inline)) void avx512_body(int64_t kc, const float *a, const float *b,
                                                                        float *tile, const int mr, const int prefetch) {
  AVX512_ACCUMULATE(prefetch)
  AVX512_STORE(0) AVX512_STORE(1) AVX512_STORE(2) AVX512_STORE(3) AVX512_STORE(4) AVX512_STORE(5)
}

#define AVX512_UKERNEL(name, prefetch)                                                              \
  RK_AVX512 static void name(int64_t kc, const float *a, const float *b, float *tile, int mr) {      \
    switch (mr) {                                                                                   \
      case 1: avx512_body(kc, a, b, tile, 1, prefetch); break;                                      \
      case 2: avx512_body(kc, a, b, tile, 2, prefetch); break;                                      \
      case 3: avx512_body(kc, a, b, tile, 3, prefetch); break;                                      \
      case 4: avx512_body(kc, a, b, tile, 4, prefetch); break;                                      \
      case 5: avx512_body(kc, a, b, tile, 5, prefetch); break;                                      \
      default: avx512_body(kc, a, b, tile, 6, prefetch); break;                                     \
    }                                                                                               \
  }
AVX512_UKERNEL(avx512_ukernel, UKERNEL_PREFETCH)
AVX512_UKERNEL(avx512_ukernel_stream, UKERNEL_PREFETCH_STREAM)

/* avx2_hard on 16 lanes. */
RK_AVX512 static inline __attribute__((always_inline)) __m512 avx512_hard(__m512 x, __m512 lo, __m512 hi, bool swish) {
  __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f);
  __m512 y = _mm512_add_ps(_mm512_mul_ps(lo, x), hi);
  y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(y, zero, _CMP_LT_OQ), zero);
  y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(y, one, _CMP_GT_OQ), one);
  return swish ? _mm512_mul_ps(x, y) : y;
}

/* The AVX2 kernel's epilogue on one 16-lane register of row r, C's columns [col, col + 16): relu
 * and clip by compare and mask, as the scalar `x > 0 ? x : 0` and `x < lo ? lo : (x > hi ? hi :
 * x)` (NaN and -0.0 as there); `res` is the row's residual or NULL. */
#define AVX512_HALF_OUT(v, cr, col, r, res)                                                              \
  {                                                                                                      \
    if (!ep->first) v = _mm512_add_ps(_mm512_loadu_ps((cr) + (col)), v);                                 \
    if (ep->last) {                                                                                      \
      if (ep->alpha != 1.0f) v = _mm512_mul_ps(v, alpha);                                                \
      if (ep->bias)                                                                                      \
        v = _mm512_add_ps(v, ep->bias_per_row ? _mm512_set1_ps(ep->bias[r])                             \
                                              : _mm512_loadu_ps(ep->bias + (col)));                      \
      if (res) v = _mm512_add_ps(v, _mm512_loadu_ps((res) + (col)));                                     \
      if (ep->act == RK_ACT_RELU) {                                                                      \
        v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, zero, _CMP_GT_OQ), v);                             \
      } else if (ep->act == RK_ACT_CLIP) {                                                               \
        v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, hi, _CMP_GT_OQ), hi);                            \
        v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, lo, _CMP_LT_OQ), lo);                            \
      } else if (ep->act == RK_ACT_HARD_SIGMOID || ep->act == RK_ACT_HARD_SWISH) {                       \
        v = avx512_hard(v, lo, hi, ep->act == RK_ACT_HARD_SWISH);                                        \
      }                                                                                                  \
    }                                                                                                    \
    _mm512_storeu_ps((cr) + (col), v);                                                                   \
  }
#define AVX512_ROW_OUT(r)                                                              \
  if (mr > r) {                                                                        \
    float *cr = c + r * c_rs;                                                          \
    const float *res = ep->residual ? ep->residual + r * ep->res_rs : NULL;            \
    __m512 v = c##r;                                                                   \
    AVX512_HALF_OUT(v, cr, 0, r, res)                                                  \
  }

RK_AVX512 static inline __attribute__((always_inline)) void avx512_body_c(int64_t kc, const float *a, const float *b,
                                                                          float *c, int64_t c_rs, const int mr,
                                                                          const rk_tile_epilogue *ep, const int prefetch) {
  AVX512_ACCUMULATE(prefetch)
  __m512 zero = _mm512_setzero_ps(), alpha = _mm512_set1_ps(ep->alpha);
  __m512 lo = _mm512_set1_ps(ep->lo), hi = _mm512_set1_ps(ep->hi);
  AVX512_ROW_OUT(0) AVX512_ROW_OUT(1) AVX512_ROW_OUT(2) AVX512_ROW_OUT(3) AVX512_ROW_OUT(4) AVX512_ROW_OUT(5)
}

#define AVX512_UKERNEL_C(name, prefetch)                                                           \
  RK_AVX512 static void name(int64_t kc, const float *a, const float *b, float *c, int64_t c_rs, int mr, \
                             const rk_tile_epilogue *ep) {                                         \
    switch (mr) {                                                                                  \
      case 1: avx512_body_c(kc, a, b, c, c_rs, 1, ep, prefetch); break;                            \
      case 2: avx512_body_c(kc, a, b, c, c_rs, 2, ep, prefetch); break;                            \
      case 3: avx512_body_c(kc, a, b, c, c_rs, 3, ep, prefetch); break;                            \
      case 4: avx512_body_c(kc, a, b, c, c_rs, 4, ep, prefetch); break;                            \
      case 5: avx512_body_c(kc, a, b, c, c_rs, 5, ep, prefetch); break;                            \
      default: avx512_body_c(kc, a, b, c, c_rs, 6, ep, prefetch); break;                           \
    }                                                                                              \
  }
AVX512_UKERNEL_C(avx512_ukernel_c, UKERNEL_PREFETCH)
AVX512_UKERNEL_C(avx512_ukernel_c_stream, UKERNEL_PREFETCH_STREAM)

/* Two neighbouring panels at once (columns j0..j0+15 from b, j0+16..j0+31 from b + b_stride):
 * 12 sums in flight instead of 6. A multiply-add's latency is 4 cycles and Zen 5 issues two a
 * cycle, so 6 chains keep its units 75% busy at best (a 3x3 convolution reached 83 GMAC/s on one
 * Zen 5 core, ORT 126); each row's broadcast of A now feeds two of them too. Every element still
 * sums the same products in the same order: the same bits as one panel at a time. */
#define AVX512_ACCUMULATE2                                                                         \
  __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;         \
  __m512 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;                         \
  const float *b1 = b + b_stride;                                                                  \
  for (int64_t k = 0; k < kc; k++) {                                                               \
    _mm_prefetch((const char *)(b + UKERNEL_PREFETCH), _MM_HINT_T0);                               \
    _mm_prefetch((const char *)(b1 + UKERNEL_PREFETCH), _MM_HINT_T0);                              \
    __m512 bv0 = _mm512_loadu_ps(b), bv1 = _mm512_loadu_ps(b1);                                    \
    AVX512_ROW2(0) AVX512_ROW2(1) AVX512_ROW2(2) AVX512_ROW2(3) AVX512_ROW2(4) AVX512_ROW2(5)      \
    a += RK_MR;                                                                                    \
    b += RK_NR;                                                                                    \
    b1 += RK_NR;                                                                                   \
  }
#define AVX512_ROW2(r)                          \
  if (mr > r) {                                 \
    __m512 ar = _mm512_set1_ps(a[r]);           \
    c##r##0 = _mm512_fmadd_ps(ar, bv0, c##r##0); \
    c##r##1 = _mm512_fmadd_ps(ar, bv1, c##r##1); \
  }
#define AVX512_STORE2(r)                                            \
  if (mr > r) {                                                     \
    _mm512_storeu_ps(tile + r * RK_NR, c##r##0);                    \
    _mm512_storeu_ps(tile + (RK_MR + r) * RK_NR, c##r##1);          \
  }

RK_AVX512 static inline __attribute__((always_inline)) void avx512_body2(int64_t kc, const float *a, const float *b,
                                                                         int64_t b_stride, float *tile, const int mr) {
  AVX512_ACCUMULATE2
  AVX512_STORE2(0) AVX512_STORE2(1) AVX512_STORE2(2) AVX512_STORE2(3) AVX512_STORE2(4) AVX512_STORE2(5)
}

RK_AVX512 static void avx512_ukernel2(int64_t kc, const float *a, const float *b, int64_t b_stride, float *tile,
                                      int mr) {
  switch (mr) {
    case 1: avx512_body2(kc, a, b, b_stride, tile, 1); break;
    case 2: avx512_body2(kc, a, b, b_stride, tile, 2); break;
    case 3: avx512_body2(kc, a, b, b_stride, tile, 3); break;
    case 4: avx512_body2(kc, a, b, b_stride, tile, 4); break;
    case 5: avx512_body2(kc, a, b, b_stride, tile, 5); break;
    default: avx512_body2(kc, a, b, b_stride, tile, 6); break;
  }
}

#define AVX512_ROW2_OUT(r)                                                             \
  if (mr > r) {                                                                        \
    float *cr = c + r * c_rs;                                                          \
    const float *res = ep->residual ? ep->residual + r * ep->res_rs : NULL;            \
    __m512 v0 = c##r##0, v1 = c##r##1;                                                 \
    AVX512_HALF_OUT(v0, cr, 0, r, res)                                                 \
    AVX512_HALF_OUT(v1, cr, RK_NR, r, res)                                             \
  }

RK_AVX512 static inline __attribute__((always_inline)) void avx512_body2_c(int64_t kc, const float *a, const float *b,
                                                                           int64_t b_stride, float *c, int64_t c_rs,
                                                                           const int mr, const rk_tile_epilogue *ep) {
  AVX512_ACCUMULATE2
  __m512 zero = _mm512_setzero_ps(), alpha = _mm512_set1_ps(ep->alpha);
  __m512 lo = _mm512_set1_ps(ep->lo), hi = _mm512_set1_ps(ep->hi);
  AVX512_ROW2_OUT(0) AVX512_ROW2_OUT(1) AVX512_ROW2_OUT(2) AVX512_ROW2_OUT(3) AVX512_ROW2_OUT(4) AVX512_ROW2_OUT(5)
}

RK_AVX512 static void avx512_ukernel2_c(int64_t kc, const float *a, const float *b, int64_t b_stride, float *c,
                                        int64_t c_rs, int mr, const rk_tile_epilogue *ep) {
  switch (mr) {
    case 1: avx512_body2_c(kc, a, b, b_stride, c, c_rs, 1, ep); break;
    case 2: avx512_body2_c(kc, a, b, b_stride, c, c_rs, 2, ep); break;
    case 3: avx512_body2_c(kc, a, b, b_stride, c, c_rs, 3, ep); break;
    case 4: avx512_body2_c(kc, a, b, b_stride, c, c_rs, 4, ep); break;
    case 5: avx512_body2_c(kc, a, b, b_stride, c, c_rs, 5, ep); break;
    default: avx512_body2_c(kc, a, b, b_stride, c, c_rs, 6, ep); break;
  }
}

/* B read in place (a stride-1 convolution's padded image): step k's columns start at b +
 * rows[k], so no panel is ever packed. The loads, products and stores of the packed kernels
 * above, in the same order, so the same bits. */
#define AVX512_ACCUMULATE_ROWS(panels)                                                             \
  __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;         \
  __m512 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;                         \
  for (int64_t k = 0; k < kc; k++) {                                                               \
    const float *row = b + rows[k];                                                                \
    __m512 bv0 = (panels) == 2 ? _mm512_loadu_ps(row) : _mm512_maskz_loadu_ps(mask, row);          \
    __m512 bv1 = (panels) == 2 ? _mm512_loadu_ps(row + RK_NR) : bv0;                               \
    AVX512_ROW_ROWS(0, panels) AVX512_ROW_ROWS(1, panels) AVX512_ROW_ROWS(2, panels)               \
    AVX512_ROW_ROWS(3, panels) AVX512_ROW_ROWS(4, panels) AVX512_ROW_ROWS(5, panels)               \
    a += RK_MR;                                                                                    \
  }
#define AVX512_ROW_ROWS(r, panels)                                  \
  if (mr > r) {                                                     \
    __m512 ar = _mm512_set1_ps(a[r]);                               \
    c##r##0 = _mm512_fmadd_ps(ar, bv0, c##r##0);                     \
    if ((panels) == 2) c##r##1 = _mm512_fmadd_ps(ar, bv1, c##r##1); \
  }
/* The in-place kernels' sums, spilled as a tile of up to 12 rows of 32 (row stride 2 * RK_NR),
 * into C: the epilogue out of line and shared by every variant. Unrolled into each (18 variants
 * of 6 to 24 registers), it made them 60 KB; spilling costs a store and a load a register
 * against hundreds of steps of the reduction. */
RK_AVX512 static __attribute__((noinline)) void avx512_tile_out(const float *tile, int rows_in_tile, int panels,
                                                                int nr, float *c, int64_t c_rs,
                                                                const rk_tile_epilogue *ep) {
  __m512 zero = _mm512_setzero_ps(), alpha = _mm512_set1_ps(ep->alpha);
  __m512 lo = _mm512_set1_ps(ep->lo), hi = _mm512_set1_ps(ep->hi);
  if (nr < RK_NR) {
    /* A short (single) panel: see short_row. */
    for (int r = 0; r < rows_in_tile; r++) {
      float row[RK_NR] __attribute__((aligned(64))), cols[2][RK_NR];
      rk_tile_epilogue t = short_row(ep, r, nr, c + r * c_rs, row, cols);
      avx512_tile_out(tile + r * 2 * RK_NR, 1, 1, RK_NR, row, 0, &t);
      memcpy(c + r * c_rs, row, sizeof(float) * (size_t)nr);
    }
    return;
  }
  for (int r = 0; r < rows_in_tile; r++) {
    float *cr = c + r * c_rs;
    const float *res = ep->residual ? ep->residual + r * ep->res_rs : NULL;
    for (int q = 0; q < panels; q++) {
      __m512 v = _mm512_load_ps(tile + r * 2 * RK_NR + q * RK_NR);
      AVX512_HALF_OUT(v, cr, q * RK_NR, r, res)
    }
  }
}

#define AVX512_ROWS_SPILL(r, panels)                                           \
  if (mr > r) {                                                                \
    _mm512_store_ps(tile + r * 2 * RK_NR, c##r##0);                            \
    if ((panels) == 2) _mm512_store_ps(tile + r * 2 * RK_NR + RK_NR, c##r##1); \
  }

RK_AVX512 static inline __attribute__((always_inline)) void avx512_body_rows(int64_t kc, const float *a,
                                                                             const float *b, const int64_t *rows,
                                                                             const int panels, __mmask16 mask,
                                                                             float *tile, const int mr) {
  AVX512_ACCUMULATE_ROWS(panels)
  AVX512_ROWS_SPILL(0, panels) AVX512_ROWS_SPILL(1, panels) AVX512_ROWS_SPILL(2, panels)
  AVX512_ROWS_SPILL(3, panels) AVX512_ROWS_SPILL(4, panels) AVX512_ROWS_SPILL(5, panels)
}

#define AVX512_ROWS_CASES(panels)                                                \
  switch (mr) {                                                                  \
    case 1: avx512_body_rows(kc, a, b, rows, panels, mask, tile, 1); break;      \
    case 2: avx512_body_rows(kc, a, b, rows, panels, mask, tile, 2); break;      \
    case 3: avx512_body_rows(kc, a, b, rows, panels, mask, tile, 3); break;      \
    case 4: avx512_body_rows(kc, a, b, rows, panels, mask, tile, 4); break;      \
    case 5: avx512_body_rows(kc, a, b, rows, panels, mask, tile, 5); break;      \
    default: avx512_body_rows(kc, a, b, rows, panels, mask, tile, 6); break;     \
  }

RK_AVX512 static void avx512_ukernel_rows_c(int64_t kc, const float *a, const float *b, const int64_t *rows,
                                            int panels, int nr, float *c, int64_t c_rs, int mr,
                                            const rk_tile_epilogue *ep) {
  float tile[RK_MR * 2 * RK_NR] __attribute__((aligned(64)));
  /* A single panel's loads are masked to its first nr columns (masked-off lanes cannot fault). */
  __mmask16 mask = (__mmask16)((1u << nr) - 1);
  if (panels == 2) {
    AVX512_ROWS_CASES(2)
  } else {
    AVX512_ROWS_CASES(1)
  }
  avx512_tile_out(tile, mr, panels, panels == 1 ? nr : RK_NR, c, c_rs, ep);
}

/* Two strips (a full one at a0, then mr1 rows at a1: 7 to 12 rows) by two full panels: 24 sums
 * in flight and half the loads of B per multiply-add. 6 x 32 spent 11 load slots a step (two
 * unaligned rows of B, 6 broadcasts, the offset) against 12 multiply-adds, and per row took
 * half as long again as this kernel (32x56x56 -> 32 3x3 on Zen 5). The same products in the
 * same order: the same bits. */
#define AVX512_WIDE_ROW(r, a, rows_of_a)                        \
  if ((rows_of_a) > r % RK_MR) {                                \
    __m512 ar = _mm512_set1_ps(a[r % RK_MR]);                   \
    c##r##_0 = _mm512_fmadd_ps(ar, bv0, c##r##_0);               \
    c##r##_1 = _mm512_fmadd_ps(ar, bv1, c##r##_1);               \
  }
#define AVX512_WIDE_SPILL(r, rows_of_a)                          \
  if ((rows_of_a) > r % RK_MR) {                                 \
    _mm512_store_ps(tile + r * 2 * RK_NR, c##r##_0);             \
    _mm512_store_ps(tile + r * 2 * RK_NR + RK_NR, c##r##_1);     \
  }
#define AVX512_WIDE_ZERO(r) __m512 c##r##_0 = _mm512_setzero_ps(), c##r##_1 = c##r##_0;

/* `packed`: B is two packed panels (b and b + b_stride, RK_NR floats a step) instead of a grid
 * read in place at b + rows[k]. */
RK_AVX512 static inline __attribute__((always_inline)) void avx512_body_rows_wide(int64_t kc, const float *a0,
                                                                                  const float *a1, const int mr1,
                                                                                  const float *b,
                                                                                  const int64_t *rows,
                                                                                  const bool packed,
                                                                                  int64_t b_stride, float *tile) {
  AVX512_WIDE_ZERO(0) AVX512_WIDE_ZERO(1) AVX512_WIDE_ZERO(2) AVX512_WIDE_ZERO(3) AVX512_WIDE_ZERO(4)
  AVX512_WIDE_ZERO(5) AVX512_WIDE_ZERO(6) AVX512_WIDE_ZERO(7) AVX512_WIDE_ZERO(8) AVX512_WIDE_ZERO(9)
  AVX512_WIDE_ZERO(10) AVX512_WIDE_ZERO(11)
  for (int64_t k = 0; k < kc; k++) {
    const float *row = packed ? b + k * RK_NR : b + rows[k];
    /* This row's columns two calls on: a block reads ~100 image rows at once, more streams than
     * the hardware prefetcher follows (32x56x56 -> 32 3x3: 281 -> 269 us on Zen 5). Packed
     * panels are prefetched as the 6 x 32 kernel does: weights come cold from memory. */
    if (packed) {
      _mm_prefetch((const char *)(row + UKERNEL_PREFETCH), _MM_HINT_T0);
      _mm_prefetch((const char *)(row + b_stride + UKERNEL_PREFETCH), _MM_HINT_T0);
    } else {
      _mm_prefetch((const char *)(row + 4 * RK_NR), _MM_HINT_T0);
    }
    __m512 bv0 = _mm512_loadu_ps(row), bv1 = _mm512_loadu_ps(packed ? row + b_stride : row + RK_NR);
    AVX512_WIDE_ROW(0, a0, RK_MR) AVX512_WIDE_ROW(1, a0, RK_MR) AVX512_WIDE_ROW(2, a0, RK_MR)
    AVX512_WIDE_ROW(3, a0, RK_MR) AVX512_WIDE_ROW(4, a0, RK_MR) AVX512_WIDE_ROW(5, a0, RK_MR)
    AVX512_WIDE_ROW(6, a1, mr1) AVX512_WIDE_ROW(7, a1, mr1) AVX512_WIDE_ROW(8, a1, mr1)
    AVX512_WIDE_ROW(9, a1, mr1) AVX512_WIDE_ROW(10, a1, mr1) AVX512_WIDE_ROW(11, a1, mr1)
    a0 += RK_MR;
    a1 += RK_MR;
  }
  AVX512_WIDE_SPILL(0, RK_MR) AVX512_WIDE_SPILL(1, RK_MR) AVX512_WIDE_SPILL(2, RK_MR) AVX512_WIDE_SPILL(3, RK_MR)
  AVX512_WIDE_SPILL(4, RK_MR) AVX512_WIDE_SPILL(5, RK_MR) AVX512_WIDE_SPILL(6, mr1) AVX512_WIDE_SPILL(7, mr1)
  AVX512_WIDE_SPILL(8, mr1) AVX512_WIDE_SPILL(9, mr1) AVX512_WIDE_SPILL(10, mr1) AVX512_WIDE_SPILL(11, mr1)
}

/* The 12 x 32 kernel's cases of mr1, then the shared epilogue. */
RK_AVX512 static inline __attribute__((always_inline)) void avx512_wide_c(int64_t kc, const float *a0,
                                                                          const float *a1, int mr1, const float *b,
                                                                          const int64_t *rows, const bool packed,
                                                                          int64_t b_stride, float *c, int64_t c_rs,
                                                                          const rk_tile_epilogue *ep) {
  float tile[2 * RK_MR * 2 * RK_NR] __attribute__((aligned(64)));
  switch (mr1) {
    case 1: avx512_body_rows_wide(kc, a0, a1, 1, b, rows, packed, b_stride, tile); break;
    case 2: avx512_body_rows_wide(kc, a0, a1, 2, b, rows, packed, b_stride, tile); break;
    case 3: avx512_body_rows_wide(kc, a0, a1, 3, b, rows, packed, b_stride, tile); break;
    case 4: avx512_body_rows_wide(kc, a0, a1, 4, b, rows, packed, b_stride, tile); break;
    case 5: avx512_body_rows_wide(kc, a0, a1, 5, b, rows, packed, b_stride, tile); break;
    default: avx512_body_rows_wide(kc, a0, a1, 6, b, rows, packed, b_stride, tile); break;
  }
  avx512_tile_out(tile, RK_MR + (mr1 < RK_MR ? mr1 : RK_MR), 2, RK_NR, c, c_rs, ep);
}

RK_AVX512 static void avx512_ukernel_rows_wide_c(int64_t kc, const float *a0, const float *a1, int mr1,
                                                 const float *b, const int64_t *rows, float *c, int64_t c_rs,
                                                 const rk_tile_epilogue *ep) {
  avx512_wide_c(kc, a0, a1, mr1, b, rows, false, 0, c, c_rs, ep);
}

/* The same 12 x 32 kernel over two packed panels: the 6 x 32 kernel's sums, in the same order,
 * with twice the chains in flight (a dense layer of 128 rows, 384 -> 1536, on Zen 5: 696 -> 683
 * us alone, and the MiniLM encoder 2.3% faster, its weights cold). */
RK_AVX512 static void avx512_ukernel2_wide_c(int64_t kc, const float *a0, const float *a1, int mr1, const float *b,
                                             int64_t b_stride, float *c, int64_t c_rs, const rk_tile_epilogue *ep) {
  avx512_wide_c(kc, a0, a1, mr1, b, NULL, true, b_stride, c, c_rs, ep);
}

bool rk_use_avx512(void) {
  static atomic_int decided = -1;
  int v = atomic_load_explicit(&decided, memory_order_relaxed);
  if (v >= 0) return v;
  unsigned eax, ebx, ecx, edx, xcr0_lo, xcr0_hi;
  bool ok = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (ebx & (1u << 16));
  if (ok) {
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    ok = (xcr0_lo & 0xe6) == 0xe6;
  }
  const char *env = getenv("RELAXC_GEMM_AVX512");
  bool refused = ok && env && env[0] == '0';
  if (refused) ok = false;
  rk_report_path("f32 GEMM, attention and activations' wider registers",
                 ok ? "AVX-512" : (refused ? "AVX2's (RELAXC_GEMM_AVX512=0)" : "AVX2's (no usable AVX-512)"));
  atomic_store_explicit(&decided, ok, memory_order_relaxed);
  return ok;
}

static bool cpu_has_avx2_fma(void) {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  bool fma = ecx & (1u << 12), osxsave = ecx & (1u << 27), avx = ecx & (1u << 28);
  if (!fma || !osxsave || !avx) return false;
  unsigned xcr0_lo, xcr0_hi;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 6) != 6) return false; /* the OS saves the YMM registers */
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  return ebx & (1u << 5);
}
#endif

#if !defined(__x86_64__)
bool rk_use_avx512(void) { return false; }
#endif

/* ---- aarch64: NEON ------------------------------------------------------------------------- */

#if defined(__aarch64__)
#include <arm_neon.h>

#define NEON_ROW(r, av, lane)                                  \
  if (mr > r) {                                                \
    c##r##0 = vfmaq_laneq_f32(c##r##0, b0, av, lane);          \
    c##r##1 = vfmaq_laneq_f32(c##r##1, b1, av, lane);          \
    c##r##2 = vfmaq_laneq_f32(c##r##2, b2, av, lane);          \
    c##r##3 = vfmaq_laneq_f32(c##r##3, b3, av, lane);          \
  }
#define NEON_STORE(r)                                          \
  if (mr > r) {                                                \
    vst1q_f32(tile + r * RK_NR, c##r##0);                      \
    vst1q_f32(tile + r * RK_NR + 4, c##r##1);                  \
    vst1q_f32(tile + r * RK_NR + 8, c##r##2);                  \
    vst1q_f32(tile + r * RK_NR + 12, c##r##3);                 \
  }

static inline __attribute__((always_inline)) void neon_body(int64_t kc, const float *a, const float *b, float *tile,
                                                            const int mr) {
  float32x4_t z = vdupq_n_f32(0.0f);
  float32x4_t c00 = z, c01 = z, c02 = z, c03 = z, c10 = z, c11 = z, c12 = z, c13 = z;
  float32x4_t c20 = z, c21 = z, c22 = z, c23 = z, c30 = z, c31 = z, c32 = z, c33 = z;
  float32x4_t c40 = z, c41 = z, c42 = z, c43 = z, c50 = z, c51 = z, c52 = z, c53 = z;
  for (int64_t k = 0; k < kc; k++) {
    float32x4_t b0 = vld1q_f32(b), b1 = vld1q_f32(b + 4), b2 = vld1q_f32(b + 8), b3 = vld1q_f32(b + 12);
    float32x4_t a03 = vld1q_f32(a);
    float32x4_t a45 = vcombine_f32(vld1_f32(a + 4), vdup_n_f32(0.0f));
    NEON_ROW(0, a03, 0) NEON_ROW(1, a03, 1) NEON_ROW(2, a03, 2) NEON_ROW(3, a03, 3)
    NEON_ROW(4, a45, 0) NEON_ROW(5, a45, 1)
    a += RK_MR;
    b += RK_NR;
  }
  NEON_STORE(0) NEON_STORE(1) NEON_STORE(2) NEON_STORE(3) NEON_STORE(4) NEON_STORE(5)
}

static void neon_ukernel(int64_t kc, const float *a, const float *b, float *tile, int mr) {
  switch (mr) {
    case 1: neon_body(kc, a, b, tile, 1); break;
    case 2: neon_body(kc, a, b, tile, 2); break;
    case 3: neon_body(kc, a, b, tile, 3); break;
    case 4: neon_body(kc, a, b, tile, 4); break;
    case 5: neon_body(kc, a, b, tile, 5); break;
    default: neon_body(kc, a, b, tile, 6); break;
  }
}
#endif

#if defined(__aarch64__)
static void neon_gemv4(int64_t kc, const float *a, const float *b, int64_t stride, float *tile) {
  float32x4_t acc[4][4];
  for (int q = 0; q < 4; q++)
    for (int j = 0; j < 4; j++) acc[q][j] = vdupq_n_f32(0.0f);
  for (int64_t k = 0; k < kc; k++) {
    float32x4_t ak = vdupq_n_f32(a[k * RK_MR]);
    for (int q = 0; q < 4; q++) {
      const float *bq = b + q * stride + k * RK_NR;
      __builtin_prefetch(bq + GEMV_PREFETCH);
      for (int j = 0; j < 4; j++) acc[q][j] = vfmaq_f32(acc[q][j], ak, vld1q_f32(bq + 4 * j));
    }
  }
  for (int q = 0; q < 4; q++)
    for (int j = 0; j < 4; j++) vst1q_f32(tile + q * RK_NR + 4 * j, acc[q][j]);
}
#endif

/* ---- the choice ------------------------------------------------------------------------------ */

static atomic_int detected_isa = -1;

rk_isa rk_cpu_isa(void) {
  int isa = atomic_load_explicit(&detected_isa, memory_order_relaxed);
  if (isa >= 0) return (rk_isa)isa;
#if defined(__x86_64__)
  isa = cpu_has_avx2_fma() ? RK_ISA_AVX2 : RK_ISA_GENERIC;
#elif defined(__aarch64__)
  isa = RK_ISA_NEON;
#else
  isa = RK_ISA_GENERIC;
#endif
  rk_report_path("f32 kernels (GEMM, convolutions, norms, activations)",
                 isa == RK_ISA_AVX2 ? "AVX2 and FMA" : (isa == RK_ISA_NEON ? "NEON" : "portable C"));
  atomic_store_explicit(&detected_isa, isa, memory_order_relaxed);
  return (rk_isa)isa;
}

rk_gemv4_fn rk_gemv4(rk_isa isa) {
  switch (isa) {
#if defined(__x86_64__)
    case RK_ISA_AVX2: return avx2_gemv4;
#endif
#if defined(__aarch64__)
    case RK_ISA_NEON: return neon_gemv4;
#endif
    default: return generic_gemv4;
  }
}

rk_ukernel_c_fn rk_ukernel_c(rk_isa isa, bool streaming) {
#if defined(__x86_64__)
  if (isa == RK_ISA_AVX2 && rk_use_avx512()) return streaming ? avx512_ukernel_c_stream : avx512_ukernel_c;
  if (isa == RK_ISA_AVX2) return streaming ? avx2_ukernel_c_stream : avx2_ukernel_c;
#endif
  (void)isa;
  (void)streaming;
  return NULL;
}

rk_ukernel2_fn rk_ukernel2(rk_isa isa) {
#if defined(__x86_64__)
  if (isa == RK_ISA_AVX2 && rk_use_avx512()) return avx512_ukernel2;
#endif
  (void)isa;
  return NULL;
}

rk_ukernel2_c_fn rk_ukernel2_c(rk_isa isa) {
#if defined(__x86_64__)
  if (isa == RK_ISA_AVX2 && rk_use_avx512()) return avx512_ukernel2_c;
#endif
  (void)isa;
  return NULL;
}

rk_ukernel_rows_c_fn rk_ukernel_rows_c(rk_isa isa) {
#if defined(__x86_64__)
  if (isa == RK_ISA_AVX2 && rk_use_avx512()) return avx512_ukernel_rows_c;
  if (isa == RK_ISA_AVX2) return avx2_ukernel_rows_c;
#endif
  (void)isa;
  return NULL;
}

rk_ukernel_rows_wide_c_fn rk_ukernel_rows_wide_c(rk_isa isa) {
#if defined(__x86_64__)
  if (isa == RK_ISA_AVX2 && rk_use_avx512()) return avx512_ukernel_rows_wide_c;
#endif
  (void)isa;
  return NULL;
}

rk_ukernel2_wide_c_fn rk_ukernel2_wide_c(rk_isa isa) {
#if defined(__x86_64__)
  if (isa == RK_ISA_AVX2 && rk_use_avx512()) return avx512_ukernel2_wide_c;
#endif
  (void)isa;
  return NULL;
}

rk_ukernel_fn rk_ukernel(rk_isa isa, bool streaming) {
  (void)streaming;
  switch (isa) {
#if defined(__x86_64__)
    case RK_ISA_AVX2:
      if (rk_use_avx512()) return streaming ? avx512_ukernel_stream : avx512_ukernel;
      return streaming ? avx2_ukernel_stream : avx2_ukernel;
#endif
#if defined(__aarch64__)
    case RK_ISA_NEON: return neon_ukernel;
#endif
    default: return generic_ukernel;
  }
}
