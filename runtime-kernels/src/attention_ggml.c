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
#include <stdlib.h>

#include "attention.h"
#include "ggml_math.h"

/* The key (part 0) or value (part 1) row r of sequence b, KV head g. */
static const float *kv_row(const attn_job *j, int64_t b, int64_t g, int64_t r, int part) {
  if (!j->pages) return (part ? j->v : j->k) + ((j->kv_indptr[b] + r) * j->hkv + g) * j->d;
  int64_t page = j->page_ids[j->page_indptr[b] + r / j->page_size], slot = r % j->page_size;
  return j->pages + (((page * 2 + part) * j->hkv + g) * j->page_size + slot) * j->d;
}

/* ---- ggml_vec_dot_f32 --------------------------------------------------------------------------- */

/* The AVX2 form in C: acc[a][l] over runs of 32, then (a0 + a2) + (a1 + a3) lane by lane, then
 * the halves, then two horizontal adds; the rest one product at a time. */
static float dot_portable(const float *x, const float *y, int64_t n) {
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
RK_AVX2_TARGET static float dot_avx2(const float *x, const float *y, int64_t n) {
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

RK_AVX512DQ_TARGET static float dot_avx512(const float *x, const float *y, int64_t n) {
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
RK_AVX2_TARGET static double softmax_avx2(float *s, int64_t n, float top) {
  double sum = 0;
  for (int64_t c = 0; c < n; c += 8) {
    float lanes[8] = {0};
    int64_t m = n - c < 8 ? n - c : 8;
    for (int64_t l = 0; l < m; l++) lanes[l] = s[c + l];
    __m256 e = ggml_exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(lanes), _mm256_set1_ps(top)));
    _mm256_storeu_ps(lanes, e);
    for (int64_t l = m; l < 8; l++) lanes[l] = 0.0f; /* masked cells */
    for (int64_t l = 0; l < m; l++) s[c + l] = lanes[l];
    sum += (double)ggml_hsum8(_mm256_loadu_ps(lanes));
  }
  return sum;
}

RK_AVX512DQ_TARGET static double softmax_avx512(float *s, int64_t n, float top) {
  double sum = 0;
  for (int64_t c = 0; c < n; c += 16) {
    float lanes[16] = {0};
    int64_t m = n - c < 16 ? n - c : 16;
    for (int64_t l = 0; l < m; l++) lanes[l] = s[c + l];
    __m512 e = ggml_exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(lanes), _mm512_set1_ps(top)));
    _mm512_storeu_ps(lanes, e);
    for (int64_t l = m; l < 16; l++) lanes[l] = 0.0f;
    for (int64_t l = 0; l < m; l++) s[c + l] = lanes[l];
    sum += (double)ggml_reduce16(_mm512_loadu_ps(lanes));
  }
  return sum;
}
#endif

/* ---- values: one partial sum per lane, then the lanes' tree ------------------------------------ */

/* acc[r % lanes] += p[r] * v[r], every value of the head dim (the same fused multiply-add per
 * value whatever the vector width: built per instruction set only for speed). */
#define ACCUMULATE_BODY                                                               \
  for (int64_t r = 0; r < n; r++) {                                                   \
    const float *v = kv_row(j, b, g, r, 1);                                           \
    float *a = acc + (r % lanes) * d, weight = p[r];                                  \
    for (int64_t c = 0; c < d; c++) a[c] = fmaf(v[c], weight, a[c]);                  \
  }
static void accumulate_portable(const attn_job *j, int64_t b, int64_t g, const float *p, int64_t n, int lanes,
                                float *acc) {
  int64_t d = j->d;
  ACCUMULATE_BODY
}
#if defined(__x86_64__)
RK_AVX2_TARGET static void accumulate_avx2(const attn_job *j, int64_t b, int64_t g, const float *p, int64_t n,
                                           int lanes, float *acc) {
  int64_t d = j->d;
  ACCUMULATE_BODY
}
#endif
#undef ACCUMULATE_BODY

/* out[c] = the lanes' partial sums added in the form's tree: hsum8's, or GCC's
 * _mm512_reduce_add_ps (halves, quarters, then (0 + 2) + (1 + 3)). */
static void add_lanes(const float *acc, int lanes, int64_t d, float *out) {
  for (int64_t c = 0; c < d; c++) {
    float l[16];
    for (int i = 0; i < lanes; i++) l[i] = acc[i * d + c];
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

/* ---- units --------------------------------------------------------------------------------------- */

/* One query row t's heads of KV head g against its `limit` visible key rows; s holds a score per
 * key row and acc 16 rows of the head dim. */
static void attend(const attn_job *j, ggml_form form, int64_t t, int64_t g, int64_t b, int64_t limit, float *s,
                   float *acc) {
  int64_t group = j->hq / j->hkv, d = j->d;
  int lanes = form == GGML_FORM_AVX512 ? 16 : 8;
  for (int64_t h = g * group; h < (g + 1) * group; h++) {
    const float *q = j->q + (t * j->hq + h) * d;
    float *out = j->out + (t * j->hq + h) * d;
    if (limit <= 0) {
      for (int64_t c = 0; c < d; c++) out[c] = 0.0f;
      j->lse[t * j->hq + h] = EMPTY_LSE;
      continue;
    }
    float top = -INFINITY;
    for (int64_t r = 0; r < limit; r++) {
      const float *k = kv_row(j, b, g, r, 0);
      float score;
#if defined(__x86_64__)
      if (form == GGML_FORM_AVX512) score = dot_avx512(k, q, d);
      else if (form == GGML_FORM_AVX2) score = dot_avx2(k, q, d);
      else
#endif
        score = dot_portable(k, q, d);
      s[r] = score * j->sm_scale;
      top = s[r] > top ? s[r] : top;
    }
    double sum;
#if defined(__x86_64__)
    if (form == GGML_FORM_AVX512) sum = softmax_avx512(s, limit, top);
    else if (form == GGML_FORM_AVX2) sum = softmax_avx2(s, limit, top);
    else
#endif
      sum = softmax_portable(s, limit, top);
    float inverse = (float)(1.0 / sum);
    for (int64_t r = 0; r < limit; r++) s[r] *= inverse;
    for (int64_t i = 0; i < lanes * d; i++) acc[i] = 0.0f;
#if defined(__x86_64__)
    if (form != GGML_FORM_PORTABLE) accumulate_avx2(j, b, g, s, limit, lanes, acc);
    else
#endif
      accumulate_portable(j, b, g, s, limit, lanes, acc);
    add_lanes(acc, lanes, d, out);
    j->lse[t * j->hq + h] = top * LOG2E + log2f((float)sum);
  }
}

int rk_attend_ggml(const attn_job *j, int task, int num_tasks) {
  int64_t longest = 0;
  for (int64_t b = 0; b < j->batch; b++) longest = kv_length(j, b) > longest ? kv_length(j, b) : longest;
  ggml_form form = ggml_cpu_form();
  float *scratch = malloc(((size_t)longest + 16 * (size_t)j->d) * sizeof(float));
  if (!scratch) return rk_out_of_memory(j->kernel);
  for (int64_t u = task; u < j->rows * j->hkv; u += num_tasks) {
    int64_t t = u / j->hkv, g = u % j->hkv, b = sequence_of(j, t);
    attend(j, form, t, g, b, visible_rows(j, t, b), scratch + 16 * j->d, scratch);
  }
  free(scratch);
  return 0;
}
