/*
 * attention_ggml.c: the paged KV cache's attention in llama.cpp's arithmetic (the _ggml twins
 * of attention.c's kernels, which relaxc.llm's GGUF models call), so that their attention rows
 * are llama.cpp's bits on the same CPU (llama.cpp's KV cache in f32, without flash attention).
 * The next layer quantizes those rows to int8, where a last-bit difference flips a rounding now
 * and then and moves the logits by about 1e-2 on the mid-size Llama.
 *
 * llama.cpp's graph, reproduced per (query row, query head):
 * - scores: ggml_vec_dot_f32 of the query and each key row (four accumulators of a register's
 *   lanes over runs of four registers, added in a fixed tree; the rest of the head dim after
 *   the runs added one product at a time), each times the scale;
 * - softmax: the largest score, ggml's vector exp of each score minus it, the exps of each
 *   register's worth of key rows (rows 0-7, 8-15, ...: llama.cpp's rows are its cache cells,
 *   the sequence's positions) added in a tree and the register sums added in double, and each
 *   exp times 1 / sum;
 * - values: tinyBLAS's f32 matrix product (llamafile's sgemm): per output value, one register of
 *   lanes accumulates weight times value over the key rows (row r in lane r mod the lanes, rows in
 *   order), then its lanes are added in a tree. Kept here as one array of partial sums per lane.
 * Rows past the visible ones count as llama.cpp's masked cells do: an exp of 0, nothing added.
 *
 * Its x86 build has two forms: AVX-512's (16 lanes, runs of 64 values, GCC's
 * _mm512_reduce_add_ps tree, ggml's 512-bit exp) and AVX2's (8 lanes, runs of 32, hadd trees, the
 * 256-bit exp); each CPU runs the one llama.cpp runs there (ggml_math.h). The portable build
 * computes AVX2's in C (fmaf); llama.cpp's NEON build (4 lanes) has an order of its own, not
 * reproduced. The log-sum-exp the cache merges parts with is base 2, as attention.c's.
 */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "attention.h"
#include "ggml_math.h"

/* Key rows a block in the scores pass (a multiple of 4: scores_avx2's runs). */
enum { SCORE_BLOCK = 64 };

/* Asks for the lines of a key or value row that hold values c0 .. c1 - 1, without waiting for
 * them. */
static inline void prefetch_row(const float *row, int64_t c0, int64_t c1) {
  for (int64_t c = c0; c < c1; c += 16) __builtin_prefetch(row + c);
}

/* ---- ggml_vec_dot_f32 --------------------------------------------------------------------------- */

/* The AVX2 form in C: acc[a][l] over runs of 32, then (a0 + a2) + (a1 + a3) lane by lane, then
 * the halves, then two horizontal adds; the rest one product at a time. */
static inline float dot_portable(const float *x, const float *y, int64_t n) {
  float acc[4][8] = {{0}};
  int64_t whole = n & ~(int64_t)31;
  for (int64_t i = 0; i < whole; i += 32)
    for (int a = 0; a < 4; a++)
      for (int l = 0; l < 8; l++) acc[a][l] = fmaf(x[i + a * 8 + l], y[i + a * 8 + l], acc[a][l]);
  float lanes[8], half[4];
  for (int l = 0; l < 8; l++) lanes[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
  for (int l = 0; l < 4; l++) half[l] = lanes[l] + lanes[l + 4];
  float sum = (half[0] + half[1]) + (half[2] + half[3]);
  for (int64_t i = whole; i < n; i++) sum = fmaf(x[i], y[i], sum);
  return sum;
}

#if defined(__x86_64__)
RK_AVX2_TARGET static inline __attribute__((always_inline)) float dot_avx2(const float *x, const float *y, int64_t n) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t whole = n & ~(int64_t)31;
  for (int64_t i = 0; i < whole; i += 32)
    for (int a = 0; a < 4; a++)
      acc[a] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + a * 8), _mm256_loadu_ps(y + i + a * 8), acc[a]);
  __m256 all = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
  __m128 half = _mm_add_ps(_mm256_castps256_ps128(all), _mm256_extractf128_ps(all, 1));
  half = _mm_hadd_ps(half, half);
  float sum = _mm_cvtss_f32(_mm_hadd_ps(half, half));
  for (int64_t i = whole; i < n; i++) sum = fmaf(x[i], y[i], sum);
  return sum;
}

RK_AVX512DQ_TARGET static inline __attribute__((always_inline)) float dot_avx512(const float *x, const float *y, int64_t n) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t whole = n & ~(int64_t)63;
  for (int64_t i = 0; i < whole; i += 64)
    for (int a = 0; a < 4; a++)
      acc[a] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + a * 16), _mm512_loadu_ps(y + i + a * 16), acc[a]);
  float sum = ggml_reduce16(_mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3])));
  for (int64_t i = whole; i < n; i++) sum = fmaf(x[i], y[i], sum);
  return sum;
}
#endif

/* s[r] = the dot product of the query and key row r, times the scale (the largest is found after,
 * by top_of, in the order this pass once kept it). */
#define SCORES_BODY(dot)                                                \
  for (int64_t r = 0; r < n; r++)                                       \
    /* The common head dim as a constant: the query stays in registers. */ \
    s[r] = (d == 64 ? dot(keys[r], q, 64) : dot(keys[r], q, d)) * scale;
static void scores_portable(const float *q, const float *const *keys, int64_t n, int64_t d, float scale, float *s) {
  SCORES_BODY(dot_portable)
}
#if defined(__x86_64__)
/* dot_avx2's sums of four key rows of 64 values: each row's registers added as dot_avx2 adds them,
 * then the last two horizontal adds shared by the four (hadd of rows 0 and 1, of 2 and 3, then of
 * those: the same pairs in the same order). */
RK_AVX2_TARGET static inline __attribute__((always_inline)) __m128 dot4_avx2_64(const __m256 *q,
                                                                                const float *const *keys) {
  __m128 half[4];
  for (int k = 0; k < 4; k++) {
    __m256 acc[4];
    for (int a = 0; a < 4; a++) acc[a] = _mm256_fmadd_ps(_mm256_loadu_ps(keys[k] + a * 8), q[a], _mm256_setzero_ps());
    for (int a = 0; a < 4; a++) acc[a] = _mm256_fmadd_ps(_mm256_loadu_ps(keys[k] + 32 + a * 8), q[4 + a], acc[a]);
    __m256 all = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
    half[k] = _mm_add_ps(_mm256_castps256_ps128(all), _mm256_extractf128_ps(all, 1));
  }
  return _mm_hadd_ps(_mm_hadd_ps(half[0], half[1]), _mm_hadd_ps(half[2], half[3]));
}

RK_AVX2_TARGET static void scores_avx2(const float *q, const float *const *keys, int64_t n, int64_t d, float scale,
                                       float *s) {
  if (d != 64) {
    SCORES_BODY(dot_avx2)
    return;
  }
  __m256 qv[8];
  for (int a = 0; a < 8; a++) qv[a] = _mm256_loadu_ps(q + a * 8);
  __m128 scale4 = _mm_set1_ps(scale);
  int64_t r = 0;
  for (; r + 4 <= n; r += 4) /* the scale on the four at once: each lane rounds as mulss would */
    _mm_storeu_ps(s + r, _mm_mul_ps(dot4_avx2_64(qv, keys + r), scale4));
  for (; r < n; r++) s[r] = dot_avx2(keys[r], q, 64) * scale;
}

/* The largest of n scores as scores_avx2 at head dim 64 kept it: four lanes' maxima over runs of
 * four, then the rest one by one. */
RK_AVX2_TARGET static float top_avx2(const float *s, int64_t n) {
  __m128 top4 = _mm_set1_ps(-INFINITY);
  int64_t r = 0;
  for (; r + 4 <= n; r += 4) top4 = _mm_max_ps(_mm_loadu_ps(s + r), top4); /* v > top ? v : top, lane by lane */
  float lanes[4], top;
  _mm_storeu_ps(lanes, top4);
  top = lanes[0] > lanes[1] ? lanes[0] : lanes[1];
  top = lanes[2] > top ? lanes[2] : top;
  top = lanes[3] > top ? lanes[3] : top;
  for (; r < n; r++) top = s[r] > top ? s[r] : top;
  return top;
}

RK_AVX512DQ_TARGET static void scores_avx512(const float *q, const float *const *keys, int64_t n, int64_t d, float scale,
                                             float *s) {
  SCORES_BODY(dot_avx512)
}
#endif
#undef SCORES_BODY

/* The largest of n scores, in the order the form's scores pass kept it (which decides only the
 * sign of a zero maximum). */
static float top_of(ggml_form form, int64_t d, const float *s, int64_t n) {
#if defined(__x86_64__)
  if (form == GGML_FORM_AVX2 && d == 64) return top_avx2(s, n);
#endif
  (void)form, (void)d;
  float top = -INFINITY;
  for (int64_t r = 0; r < n; r++) top = s[r] > top ? s[r] : top;
  return top;
}

/* ---- softmax: exps in place, their sum in double ----------------------------------------------- */

/* hsum8's tree over eight floats. */
static float tree8(const float *e) { return ((e[0] + e[4]) + (e[2] + e[6])) + ((e[1] + e[5]) + (e[3] + e[7])); }

static double softmax_portable(float *s, int64_t n, float top) {
  double sum = 0;
  for (int64_t c = 0; c < n; c += 8) {
    float e[8] = {0};
    for (int64_t l = 0; l < 8 && c + l < n; l++) e[l] = s[c + l] = ggml_exp_fma_form(s[c + l] - top);
    sum += (double)tree8(e);
  }
  return sum;
}

#if defined(__x86_64__)
/* Runs of L scores through the vector exp EXP (intrinsics starting X), the cells past the last
 * score counting 0 (llama.cpp's masked cells), each run's sum by SUM added in double. */
#define SOFTMAX(L, X, EXP, SUM)                                               \
  double sum = 0;                                                             \
  int64_t c = 0;                                                              \
  /* Whole runs straight from the scores: no copy, whose scalar stores the    \
   * vector load could not take from the store buffer. */                    \
  for (; c + L <= n; c += L) {                                                \
    __typeof__(X##_setzero_ps()) e = EXP(X##_sub_ps(X##_loadu_ps(s + c), X##_set1_ps(top))); \
    X##_storeu_ps(s + c, e);                                                  \
    sum += (double)SUM(e);                                                    \
  }                                                                           \
  for (; c < n; c += L) {                                                     \
    float lanes[L] = {0};                                                     \
    int64_t m = n - c < L ? n - c : L;                                        \
    for (int64_t l = 0; l < m; l++) lanes[l] = s[c + l];                      \
    X##_storeu_ps(lanes, EXP(X##_sub_ps(X##_loadu_ps(lanes), X##_set1_ps(top)))); \
    for (int64_t l = m; l < L; l++) lanes[l] = 0.0f;                          \
    for (int64_t l = 0; l < m; l++) s[c + l] = lanes[l];                      \
    sum += (double)SUM(X##_loadu_ps(lanes));                                  \
  }                                                                           \
  return sum;

RK_AVX2_TARGET static double softmax_avx2(float *s, int64_t n, float top) { SOFTMAX(8, _mm256, ggml_exp_avx2, ggml_hsum8) }

RK_AVX512DQ_TARGET static double softmax_avx512(float *s, int64_t n, float top) {
  SOFTMAX(16, _mm512, ggml_exp_avx512, ggml_reduce16)
}
#undef SOFTMAX
#endif

/* ---- values: one accumulator per lane, then the lanes' tree ------------------------------------- */

/* out = sum over rows r of p[r] * values[r], value by value: row r multiply-added into lane
 * r % lanes's accumulator, rows in order, then the accumulators added in the form's tree:
 * hsum8's, or GCC's _mm512_reduce_add_ps (halves, quarters, then (0 + 2) + (1 + 3)). */
static void values_portable(const float *const *values, const float *p, int64_t n, int64_t from, int64_t d, int lanes,
                            float *out) {
  for (int64_t c = from; c < d; c++) {
    float l[16] = {0};
    for (int64_t r = 0; r < n; r++) l[r % lanes] = fmaf(values[r][c], p[r], l[r % lanes]);
    if (lanes == 8) {
      out[c] = tree8(l);
      continue;
    }
    float half[8], quarter[4];
    for (int i = 0; i < 8; i++) half[i] = l[i + 8] + l[i];
    for (int i = 0; i < 4; i++) quarter[i] = half[i + 4] + half[i];
    out[c] = (quarter[0] + quarter[2]) + (quarter[1] + quarter[3]);
  }
}

#if defined(__x86_64__)
/* Rows a block: their values stay in L1 while every part of the head dim passes over them (the
 * lane accumulators wait in acc between blocks; a block starts at a multiple of the lanes). */
enum { ROW_BLOCK = 64 };

/* The lane accumulators of every part of the head dim, row block by row block, for vectors V of
 * L lanes whose intrinsics start with X (_mm256, _mm512): acc[c / L][l] holds lane l's sum for
 * values c .. c + L - 1. Each run of L rows sits at one stride from its first (gather_rows): one
 * pointer a run. */
#define VALUES_ACCUMULATE(V, L, X)                                                                  \
  int64_t whole = d & ~(int64_t)(L - 1);                                                            \
  V acc[MAX_HEAD_DIM / L][L];                                                                       \
  for (int64_t c = 0; c < whole / L; c++)                                                           \
    for (int l = 0; l < L; l++) acc[c][l] = X##_setzero_ps();                                       \
  for (int64_t r0 = 0; r0 < n; r0 += ROW_BLOCK) {                                                   \
    int64_t end = r0 + ROW_BLOCK < n ? r0 + ROW_BLOCK : n;                                          \
    for (int64_t c = 0; c < whole; c += L) {                                                        \
      V a[L];                                                                                       \
      for (int l = 0; l < L; l++) a[l] = acc[c / L][l];                                             \
      int64_t r = r0;                                                                               \
      for (; r + L <= end; r += L) {                                                                \
        const float *run = values[r] + c;                                                           \
        for (int l = 0; l < L; l++) a[l] = X##_fmadd_ps(X##_loadu_ps(run + l * stride), X##_set1_ps(p[r + l]), a[l]); \
      }                                                                                             \
      for (int l = 0; r + l < end; l++)                                                             \
        a[l] = X##_fmadd_ps(X##_loadu_ps(values[r + l] + c), X##_set1_ps(p[r + l]), a[l]);          \
      for (int l = 0; l < L; l++) acc[c / L][l] = a[l];                                             \
    }                                                                                               \
  }

/* The paged cache's value rows for one KV head lie in runs of a page (16 rows of 256 bytes at
 * head dim 64), the runs a page apart (32 KiB for the mid-size Llama's four KV heads), a
 * multiple of the L1 and L2 caches' way size.
 * Every row's n-th line then falls into the same few sets of either cache, and a pass that takes
 * one line of every row (a lane's rows, one register of values) finds the lines it fetched
 * evicted before the next pass wants their neighbours. Taken in blocks of VALUE_BLOCK rows, whole
 * (every lane and column before the next block), a block's lines stay in L1 while they are used,
 * and are fetched once; the next block's are asked for during this one. A multiple of 8, so that
 * a row's lane is the same in every block. */
enum { VALUE_BLOCK = 64, VALUE_COLS = 128 };

/* One lane's accumulators (rows start, start + 8, ... before end) for `cols` (1 or 2) registers of
 * values from c on, of `heads` (1-4) query heads of one KV head (head h's weights at p + h * ps),
 * carried in acc[h][k] from block to block. Each value row is loaded once for every head. */
RK_AVX2_TARGET static inline __attribute__((always_inline)) void values_run_avx2(const float *const *values, const float *p,
                                                                                  int64_t ps, int heads, int cols,
                                                                                  int64_t start, int64_t end, int64_t c,
                                                                                  __m256 (*acc)[2]) {
  __m256 a[4][2];
  for (int h = 0; h < heads; h++)
    for (int k = 0; k < cols; k++) a[h][k] = acc[h][k];
  for (int64_t r = start; r < end; r += 8) {
    __m256 v[2];
    for (int k = 0; k < cols; k++) v[k] = _mm256_loadu_ps(values[r] + c + 8 * k);
    for (int h = 0; h < heads; h++) {
      __m256 weight = _mm256_set1_ps(p[h * ps + r]);
      for (int k = 0; k < cols; k++) a[h][k] = _mm256_fmadd_ps(v[k], weight, a[h][k]);
    }
  }
  for (int h = 0; h < heads; h++)
    for (int k = 0; k < cols; k++) acc[h][k] = a[h][k];
}

/* values_portable's sums (8 lanes) for the query heads of one KV head at once (head h's weights
 * at p + h * ps, its output at out + h * d): the same products added in the same order into the
 * same lane accumulators, but each value row loaded once for up to four heads. Row by row, a head
 * at a time, took each row once per head and a weight per register of values: nearly three times
 * as long in a 500-token f16 prefill on Zen 3 (perf). Rows that are `cold` (not in cache) are
 * taken a block at a time (VALUE_BLOCK says why): lane by lane over all of them, each line came
 * from memory when its pass wanted it, 7% of an f16 decode token after a 500-token prompt. */
RK_AVX2_TARGET static void values_heads_avx2(const float *const *values, const float *p, int64_t ps, int heads,
                                             int64_t n, int64_t d, bool cold, float *out) {
  int64_t whole = d & ~(int64_t)7, block = cold ? VALUE_BLOCK : n;
  for (int h0 = 0; h0 < heads; h0 += 4) {
    int hn = heads - h0 < 4 ? heads - h0 : 4;
    const float *ph = p + h0 * ps;
    for (int64_t c0 = 0; c0 < whole; c0 += VALUE_COLS) {
      int64_t c1 = whole - c0 < VALUE_COLS ? whole : c0 + VALUE_COLS;
      /* [pair of registers from c0][lane][head][register of the pair] */
      __m256 acc[VALUE_COLS / 16][8][4][2];
      for (int64_t c = c0; c < c1; c += 8)
        for (int lane = 0; lane < 8; lane++)
          for (int h = 0; h < hn; h++) acc[(c - c0) / 16][lane][h][(c - c0) / 8 % 2] = _mm256_setzero_ps();
      /* Cold rows: the next block's lines, asked for in memory order a few rows a turn, all of
       * them by the block's last turn (the first block's at once). */
      int64_t turns = (c1 - c0 + 15) / 16 * 8, rows_a_turn = (VALUE_BLOCK + turns - 1) / turns, asked = cold ? 0 : n;
      for (; asked < n && asked < VALUE_BLOCK; asked++) prefetch_row(values[asked], c0, c1);
      for (int64_t r0 = 0; r0 < n; r0 += block) {
        int64_t end = n - r0 < block ? n : r0 + block;
        for (int64_t c = c0; c < c1; c += 16) {
          int cols = c1 - c >= 16 ? 2 : 1;
          for (int lane = 0; lane < 8; lane++) {
            for (int64_t k = 0; k < rows_a_turn && asked < n; k++, asked++) prefetch_row(values[asked], c0, c1);
            __m256(*a)[2] = acc[(c - c0) / 16][lane];
            /* Constant arguments, so that each case keeps its accumulators in registers; fewer
             * than four heads go one at a time. */
            if (hn == 4 && cols == 2) values_run_avx2(values, ph, ps, 4, 2, r0 + lane, end, c, a);
            else if (hn == 4) values_run_avx2(values, ph, ps, 4, 1, r0 + lane, end, c, a);
            else
              for (int h = 0; h < hn; h++) {
                if (cols == 2) values_run_avx2(values, ph + h * ps, ps, 1, 2, r0 + lane, end, c, a + h);
                else values_run_avx2(values, ph + h * ps, ps, 1, 1, r0 + lane, end, c, a + h);
              }
          }
        }
      }
      for (int64_t c = c0; c < c1; c += 8)
        for (int h = 0; h < hn; h++) {
          __m256 a[8];
          for (int lane = 0; lane < 8; lane++) a[lane] = acc[(c - c0) / 16][lane][h][(c - c0) / 8 % 2];
          __m256 even = _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6]));
          __m256 odd = _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7]));
          _mm256_storeu_ps(out + (h0 + h) * d + c, _mm256_add_ps(even, odd));
        }
    }
  }
  for (int h = 0; h < heads; h++) values_portable(values, p + h * ps, n, whole, d, 8, out + h * d);
}

/* Sixteen values at a time, the sixteen lane accumulators in zmm registers. */
RK_AVX512DQ_TARGET static void values_avx512(const float *const *values, int64_t stride, const float *p, int64_t n,
                                             int64_t d, float *out) {
  VALUES_ACCUMULATE(__m512, 16, _mm512)
  for (int64_t c = 0; c < whole; c += 16) {
    __m512 *a = acc[c / 16], half[8], quarter[4];
    for (int i = 0; i < 8; i++) half[i] = _mm512_add_ps(a[i + 8], a[i]);
    for (int i = 0; i < 4; i++) quarter[i] = _mm512_add_ps(half[i + 4], half[i]);
    _mm512_storeu_ps(out + c, _mm512_add_ps(_mm512_add_ps(quarter[0], quarter[2]), _mm512_add_ps(quarter[1], quarter[3])));
  }
  values_portable(values, p, n, whole, d, 16, out);
}
#undef VALUES_ACCUMULATE
#endif

/* ---- units --------------------------------------------------------------------------------------- */

/* The visible key and value rows of sequence b, KV head g, as pointers (pages walked once).
 * Returns the stride between the rows of a run of 16 starting at a multiple of 16 (the lanes of
 * either form): the rows' own in a ragged batch, a row's in pages of a multiple of 16 rows; 0
 * where runs may cross pages. */
static int64_t gather_rows(const attn_job *j, int64_t b, int64_t g, int64_t n, const float **keys,
                           const float **values) {
  if (!j->pages) {
    const float *k = j->k + (j->kv_indptr[b] * j->hkv + g) * j->d, *v = j->v + (j->kv_indptr[b] * j->hkv + g) * j->d;
    for (int64_t r = 0; r < n; r++) keys[r] = k + r * j->hkv * j->d, values[r] = v + r * j->hkv * j->d;
    return j->hkv * j->d;
  }
  for (int64_t r = 0, page = j->page_indptr[b]; r < n; page++) {
    const float *k = j->pages + ((int64_t)j->page_ids[page] * 2 * j->hkv + g) * j->page_size * j->d;
    const float *v = k + j->hkv * j->page_size * j->d;
    for (int64_t slot = 0; slot < j->page_size && r < n; slot++, r++) keys[r] = k + slot * j->d, values[r] = v + slot * j->d;
  }
  return j->page_size % 16 == 0 ? j->d : 0;
}

/* One query head's scores over n key rows into s. */
static void head_scores(ggml_form form, const float *q, const float *const *keys, int64_t n, int64_t d, float scale,
                        float *s) {
#if defined(__x86_64__)
  if (form == GGML_FORM_AVX512) scores_avx512(q, keys, n, d, scale, s);
  else if (form == GGML_FORM_AVX2) scores_avx2(q, keys, n, d, scale, s);
  else
#endif
    scores_portable(q, keys, n, d, scale, s);
}

/* One query head's n scores in s into its weights (their softmax); returns the base-2
 * log-sum-exp. */
static float head_weights(ggml_form form, int64_t d, float *s, int64_t n) {
  float top = top_of(form, d, s, n);
  double sum;
#if defined(__x86_64__)
  if (form == GGML_FORM_AVX512) sum = softmax_avx512(s, n, top);
  else if (form == GGML_FORM_AVX2) sum = softmax_avx2(s, n, top);
  else
#endif
    sum = softmax_portable(s, n, top);
  float inverse = (float)(1.0 / sum);
  for (int64_t r = 0; r < n; r++) s[r] *= inverse;
  return top * LOG2E + log2f((float)sum);
}

/* The value rows weighted by the query heads' weights (head h's at s + h * ps, its output at
 * out + h * d). */
static void head_values(ggml_form form, const float *const *values, int64_t stride, const float *s, int64_t ps, int heads,
                        int64_t n, int64_t d, bool cold, float *out) {
#if defined(__x86_64__)
  if (form == GGML_FORM_AVX2) {
    values_heads_avx2(values, s, ps, heads, n, d, cold, out);
    return;
  }
#endif
  for (int h = 0; h < heads; h++) {
    const float *p = s + h * ps;
    float *o = out + h * d;
#if defined(__x86_64__)
    if (form == GGML_FORM_AVX512 && stride) values_avx512(values, stride, p, n, d, o);
    else if (form == GGML_FORM_AVX512) values_portable(values, p, n, 0, d, 16, o);
    else
#endif
      values_portable(values, p, n, 0, d, 8, o);
  }
  (void)stride, (void)cold;
}

int rk_attend_ggml(const attn_job *j, int task, int num_tasks) {
  int64_t longest = j->longest, group = j->hq / j->hkv;
  ggml_form form = ggml_cpu_form();
  /* The weights of every query head of the group, a row of ps floats each (a multiple of 16). */
  int64_t ps = (longest + 16) & ~(int64_t)15;
  float *scores = malloc((size_t)(ps * group) * sizeof(float) + (size_t)(longest + 1) * 2 * sizeof(float *));
  if (!scores) return rk_out_of_memory(j->kernel);
  const float **keys = (const float **)(void *)(scores + ps * group), **values = keys + longest + 1;
  int64_t last_head = -1, last_sequence = -1;
  for (int64_t u = task; u < j->rows * j->hkv; u += num_tasks) {
    /* Head-major: a thread's consecutive units share one KV head's rows, which stay in L2. */
    int64_t t = u % j->rows, g = u / j->rows, b = sequence_of(j, t), n = visible_rows(j, t, b);
    int64_t first = t * j->hq + g * group;
    if (n <= 0) {
      for (int64_t h = 0; h < group; h++) {
        for (int64_t c = 0; c < j->d; c++) j->out[(first + h) * j->d + c] = 0.0f;
        j->lse[first + h] = EMPTY_LSE;
      }
      continue;
    }
    int64_t stride = gather_rows(j, b, g, n, keys, values);
    /* A sequence's rows of a KV head are cold the first time a thread takes them in a call (every
     * unit of a decode step): then they are taken in blocks, the next block asked for ahead. Later
     * units (the next query rows of a prefill) find them warm, and take them whole, a head at a
     * time: blocks and prefetch there made a 500-token f16 prefill's attention slower (perf, Zen 3). */
    bool cold = g != last_head || b != last_sequence;
    last_head = g, last_sequence = b;
    int64_t score_block = cold ? SCORE_BLOCK : n;
    /* Every head's scores a block of key rows at a time: the block stays in L1 for the group's
     * heads, where a whole head at a time found its rows evicted (VALUE_BLOCK says why) and read
     * them again for each head. The next block's rows are asked for first. */
    for (int64_t r0 = 0; r0 < n; r0 += score_block) {
      int64_t m = n - r0 < score_block ? n - r0 : score_block;
      if (cold)
        for (int64_t r = r0 ? r0 + SCORE_BLOCK : 0; r < n && r < r0 + 2 * SCORE_BLOCK; r++) prefetch_row(keys[r], 0, j->d);
      for (int64_t h = 0; h < group; h++)
        head_scores(form, j->q + (first + h) * j->d, keys + r0, m, j->d, j->sm_scale, scores + h * ps + r0);
    }
    for (int64_t h = 0; h < group; h++) j->lse[first + h] = head_weights(form, j->d, scores + h * ps, n);
    head_values(form, values, stride, scores, ps, (int)group, n, j->d, cold, j->out + first * j->d);
  }
  free(scores);
  return 0;
}
