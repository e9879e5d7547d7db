/*
 * attention.h: what the paged KV cache's attention kernels share between their two kinds of
 * arithmetic: attention.c's (online softmax, relaxc's own order) and attention_ggml.c's (llama.cpp's
 * order, for the models relaxc.llm builds from GGUF files). One call is one attn_job; its units
 * are (query row, KV head) pairs.
 */
#ifndef ATTENTION_H
#define ATTENTION_H

#include "rk.h"

enum { CHUNK = 64, MAX_HEAD_DIM = 512 };

/* The masked/empty log-sum-exp TVM's kernels write, so that its merge gives such a part no weight. */
#define EMPTY_LSE (-5e4f)
#define LOG2E 1.4426950408889634f

enum { ATTEND_GENERIC, ATTEND_AVX2, ATTEND_AVX512 };

/* One call: its queries and outputs, and where each sequence's key and value rows are: ragged (rows at a fixed stride from k and v) or
 * paged (row r at slot r % page_size of page page_ids[r / page_size]). */
typedef struct attn_job {
  const char *kernel;
  const float *q;
  float *out, *lse;
  int64_t hq, hkv, d, rows, batch;
  float sm_scale;
  bool causal;
  const int32_t *q_indptr;
  /* ragged */
  const float *k, *v;
  const int32_t *kv_indptr;
  /* paged */
  const float *pages;
  const int32_t *page_indptr, *page_ids, *last_page_len;
  int64_t page_size;
  int isa; /* ATTEND_* */
  bool ggml; /* llama.cpp's arithmetic (attention_ggml.c) */
  int64_t longest; /* the most key rows of a sequence, for attention_ggml.c's scratch */
} attn_job;

/* The sequence b whose query rows hold row t: q_indptr[b] <= t < q_indptr[b + 1] (decode, with
 * no q_indptr: one row each). */
static inline int64_t sequence_of(const attn_job *j, int64_t t) {
  if (!j->q_indptr) return t;
  int64_t lo = 0, hi = j->batch - 1;
  while (lo < hi) {
    int64_t mid = (lo + hi + 1) / 2;
    if (j->q_indptr[mid] <= t) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/* The number of key rows of sequence b. */
static inline int64_t kv_length(const attn_job *j, int64_t b) {
  if (!j->pages) return j->kv_indptr[b + 1] - j->kv_indptr[b];
  int64_t pages = j->page_indptr[b + 1] - j->page_indptr[b];
  return pages <= 0 ? 0 : (pages - 1) * j->page_size + j->last_page_len[b];
}

/* The first key row a unit of query row t of sequence b may not see: all kv_len rows, or fewer
 * when causal (the query rows are the sequence's last). */
static inline int64_t visible_rows(const attn_job *j, int64_t t, int64_t b) {
  int64_t kv_len = kv_length(j, b);
  if (!j->causal) return kv_len;
  int64_t qo_len = j->q_indptr[b + 1] - j->q_indptr[b], visible = kv_len - qo_len + (t - j->q_indptr[b]) + 1;
  return visible < kv_len ? visible : kv_len;
}

/* Units task, task + num_tasks, ... of a job in llama.cpp's arithmetic (attention_ggml.c). */
RVM_HIDDEN int rk_attend_ggml(const attn_job *j, int task, int num_tasks);

#endif /* ATTENTION_H */
