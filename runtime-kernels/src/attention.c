/*
 * attention.c: the paged KV cache's three attention kernels for float32 caches, in place of the
 * TIR kernels TVM's KV cache factory makes (relaxc.tvm's rewrite swaps them in): the ragged
 * prefill (the new tokens against themselves, causal), the paged prefill (new tokens against the
 * cached pages) and the paged decode (one token per sequence against its pages). Each takes the
 * TIR kernel's parameter list as the KV cache runtime passes it (docs/src/architecture/
 * paged-kv-cache.md 2.5 and 5.3) and gives what it gives: the output rows and each row's log-sum-exp in base 2, which the
 * cache's merge kernel combines across parts (an empty part: zeros and -5e4).
 *
 * TVM's kernels are scalar and single-threaded: at a 500-token prompt they took 45% of the
 * mid-size Q4_K_M Llama's prefill at 2 threads, and 8% of its decode's samples with the second
 * thread waiting meanwhile. Here each (token, KV head) pair is a unit of
 * work: its query heads run over the key rows in runs of up to CHUNK (never across a page), with
 * the softmax kept online from run to run. The units are dealt to the threads in turn (causal
 * rows grow in cost) and each unit's arithmetic depends only on the unit, so the bits are the
 * same at any thread count. The loops (attention_body.h) are built three times: portable 8-lane
 * vectors with multiplies and adds unfused, and AVX2 and AVX-512 with fused ones (picked at run
 * time; RELAXC_QUANT_ISA=portable|avx2 picks a lesser one): AVX2 and AVX-512 give the same bits,
 * the portable build rounds differently.
 * RoPE inside attention (rotary_mode 1, the cache's sliding-window route) is refused by name.
 */
#include <math.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "rk.h"
#include "rk_math.h"

#include "attention.h"

/* ---- the instances ------------------------------------------------------------------------------ */

/* Portable: GCC's and clang's 8-lane vectors, multiplies and adds unfused. */
#define AT(name) name##_generic
#define AT_FN
#define AT_W 8
#define AT_V rk_f8
#define AT_ZERO ((rk_f8){0})
#define AT_LOAD(p) rk_f8_load(p)
#define AT_STORE(p, v) RK_F8_STORE((p), (v))
#define AT_SPLAT(x) ((rk_f8){(x), (x), (x), (x), (x), (x), (x), (x)})
#define AT_MADD(acc, a, b) ((acc) + (a) * (b))
#define AT_SSUM(a) ((((a)[0] + (a)[4]) + ((a)[1] + (a)[5])) + (((a)[2] + (a)[6]) + ((a)[3] + (a)[7])))
#include "attention_body.h"

#if defined(__x86_64__)
#include <immintrin.h>

/* AVX2 with fused multiply-adds. */
static inline __attribute__((always_inline, target("avx2,fma"))) float sum8_avx2(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_add_ss(a, _mm_movehdup_ps(a)));
}
/* The sums of eight rows' 8 lanes, each in sum8_avx2's order ((0 + 4) + (2 + 6)) + ((1 + 5) +
 * (3 + 7)), side by side: halves, then pairs, then the last two, for all eight at once. */
static inline __attribute__((always_inline, target("avx2,fma"))) void sum8x8_avx2(const __m256 *a, float *out) {
  __m256 t[4];
  for (int i = 0; i < 4; i++)
    t[i] = _mm256_add_ps(_mm256_permute2f128_ps(a[i], a[i + 4], 0x20), _mm256_permute2f128_ps(a[i], a[i + 4], 0x31));
  __m256 u01 = _mm256_add_ps(_mm256_shuffle_ps(t[0], t[1], 0x44), _mm256_shuffle_ps(t[0], t[1], 0xee));
  __m256 u23 = _mm256_add_ps(_mm256_shuffle_ps(t[2], t[3], 0x44), _mm256_shuffle_ps(t[2], t[3], 0xee));
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_shuffle_ps(u01, u23, 0x88), _mm256_shuffle_ps(u01, u23, 0xdd)));
}
#define AT(name) name##_avx2
#define AT_FN __attribute__((target("avx2,fma")))
#define AT_W 8
#define AT_V __m256
#define AT_ZERO _mm256_setzero_ps()
#define AT_LOAD(p) _mm256_loadu_ps(p)
#define AT_STORE(p, v) _mm256_storeu_ps((p), (v))
#define AT_SPLAT(x) _mm256_set1_ps(x)
#define AT_MADD(acc, a, b) _mm256_fmadd_ps((a), (b), (acc))
#define AT_SSUM(a) sum8_avx2(a)
#define AT_SSUM8(a, out) sum8x8_avx2((a), (out))
#include "attention_body.h"

/* AVX-512: the value sums 16 lanes wide, the dot products AVX2's (so the bits are AVX2's). */
#define AT(name) name##_avx512
#define AT_FN __attribute__((target("avx512f,avx512vl,avx2,fma")))
#define AT_W 16
#define AT_V __m512
#define AT_ZERO _mm512_setzero_ps()
#define AT_LOAD(p) _mm512_loadu_ps(p)
#define AT_STORE(p, v) _mm512_storeu_ps((p), (v))
#define AT_SPLAT(x) _mm512_set1_ps(x)
#define AT_MADD(acc, a, b) _mm512_fmadd_ps((a), (b), (acc))
#define AT_SW 8
#define AT_SV __m256
#define AT_SZERO _mm256_setzero_ps()
#define AT_SLOAD(p) _mm256_loadu_ps(p)
#define AT_SMADD(acc, a, b) _mm256_fmadd_ps((a), (b), (acc))
#define AT_SSUM(a) sum8_avx2(a)
#define AT_SSUM8(a, out) sum8x8_avx2((a), (out))
/* Four query heads side by side: 16 zmm accumulators for a head dim of 64. */
#define AT_HEADS 4
#include "attention_body.h"
#endif

static int attend_task(int task, int num_tasks, void *ctx) {
  const attn_job *j = ctx;
  if (j->ggml) return rk_attend_ggml(j, task, num_tasks);
#if defined(__x86_64__)
  if (j->isa == ATTEND_AVX512) {
    attend_units_avx512(j, task, num_tasks);
    return 0;
  }
  if (j->isa == ATTEND_AVX2) {
    attend_units_avx2(j, task, num_tasks);
    return 0;
  }
#endif
  attend_units_generic(j, task, num_tasks);
  return 0;
}

/* ---- arguments ------------------------------------------------------------------------------- */

/* An int32 CPU tensor of at least `count` values (any offset; index arrays are views). */
static int arg_indices(const char *kernel, const TVMFFIAny *args, int32_t num_args, int32_t i, const char *name,
                       int64_t count, const int32_t **out) {
  DLTensor *t = i < num_args ? rvm_as_dltensor(&args[i]) : NULL;
  if (!t)
    return rvm_raise("TypeError", "%s: argument %d (%s) must be a tensor, got %s", kernel, i, name,
                     i < num_args ? rvm_type_name(&args[i]) : "nothing");
  if (t->device.device_type != kDLCPU || t->dtype.code != kDLInt || t->dtype.bits != 32 || t->dtype.lanes != 1 ||
      !rk_compact(t))
    return rvm_raise("TypeError", "%s: argument %d (%s) must be a compact int32 CPU tensor", kernel, i, name);
  if (rk_numel(t) < count)
    return rk_shape_error(kernel, "an index array holds fewer values than the batch needs", t);
  *out = (const int32_t *)((const char *)t->data + t->byte_offset);
  return 0;
}

/* A float argument (a Float, or an Int). */
static int arg_float(const char *kernel, const TVMFFIAny *args, int32_t num_args, int32_t i, const char *name,
                     float *out) {
  if (i < num_args && args[i].type_index == kTVMFFIFloat) {
    *out = (float)args[i].v_float64;
    return 0;
  }
  if (i < num_args && args[i].type_index == kTVMFFIInt) {
    *out = (float)args[i].v_int64;
    return 0;
  }
  return rvm_raise("TypeError", "%s: argument %d (%s) must be a number, got %s", kernel, i, name,
                   i < num_args ? rvm_type_name(&args[i]) : "nothing");
}

/* q [rows, hq, d], out the same, lse [rows, hq]: the shapes every kernel shares. */
static int check_queries(attn_job *j, const DLTensor *q, const DLTensor *out, const DLTensor *lse) {
  if (q->ndim != 3) return rk_shape_error(j->kernel, "q must be [tokens, query heads, head dim]", q);
  j->rows = q->shape[0], j->hq = q->shape[1];
  if (q->shape[2] != j->d) return rk_shape_error(j->kernel, "q's head dim must be the keys' and values'", q);
  if (j->d > MAX_HEAD_DIM)
    return rvm_raise("ValueError", "%s: head dim %lld is over the %d this kernel supports", j->kernel,
                     (long long)j->d, MAX_HEAD_DIM);
  if (j->hkv <= 0 || j->hq % j->hkv != 0)
    return rvm_raise("ValueError", "%s: %lld query heads are not a multiple of %lld KV heads", j->kernel,
                     (long long)j->hq, (long long)j->hkv);
  if (out->ndim != 3 || out->shape[0] < j->rows || out->shape[1] != j->hq || out->shape[2] != j->d)
    return rk_shape_error(j->kernel, "output must be q's shape", out);
  if (lse->ndim != 2 || lse->shape[0] < j->rows || lse->shape[1] != j->hq)
    return rk_shape_error(j->kernel, "lse must be [tokens, query heads]", lse);
  return 0;
}

/* The trailing (rotary_mode, rope_scale, rope_theta, sm_scale) from args[i]. */
static int check_scalars(attn_job *j, const TVMFFIAny *args, int32_t num_args, int32_t i) {
  int64_t rotary;
  float unused;
  int rc = rk_arg_int(j->kernel, args, num_args, i, "rotary_mode", &rotary);
  if (!rc) rc = arg_float(j->kernel, args, num_args, i + 1, "rope_scale", &unused);
  if (!rc) rc = arg_float(j->kernel, args, num_args, i + 2, "rope_theta", &unused);
  if (!rc) rc = arg_float(j->kernel, args, num_args, i + 3, "sm_scale", &j->sm_scale);
  if (!rc && rotary != 0)
    rc = rvm_raise("ValueError",
                   "%s: rotary_mode %lld (RoPE inside attention, the KV cache's sliding-window route) is not "
                   "supported; create the cache with support_sliding_window 0, or build without relaxc's attention",
                   j->kernel, (long long)rotary);
  return rc;
}

/* Every page id of the table within the pages, and every last page's length within a page. */
static int check_pages(attn_job *j, const DLTensor *pages) {
  if (j->page_indptr[0] < 0)
    return rvm_raise("ValueError", "%s: page_indptr starts below 0", j->kernel);
  for (int64_t b = 0; b < j->batch; b++) {
    if (j->page_indptr[b + 1] < j->page_indptr[b])
      return rvm_raise("ValueError", "%s: page_indptr decreases at sequence %lld", j->kernel, (long long)b);
    for (int64_t p = j->page_indptr[b]; p < j->page_indptr[b + 1]; p++)
      if (j->page_ids[p] < 0 || j->page_ids[p] >= pages->shape[0])
        return rvm_raise("ValueError", "%s: page id %d of sequence %lld is outside the %lld pages", j->kernel,
                         j->page_ids[p], (long long)b, (long long)pages->shape[0]);
    if (j->page_indptr[b + 1] > j->page_indptr[b] &&
        (j->last_page_len[b] < 1 || j->last_page_len[b] > j->page_size))
      return rvm_raise("ValueError", "%s: sequence %lld's last page holds %d rows of %lld", j->kernel,
                       (long long)b, j->last_page_len[b], (long long)j->page_size);
  }
  return 0;
}

static int check_q_indptr(const attn_job *j) {
  if (j->q_indptr[0] != 0 || j->q_indptr[j->batch] != j->rows)
    return rvm_raise("ValueError", "%s: q_indptr must run from 0 to the %lld query rows", j->kernel,
                     (long long)j->rows);
  for (int64_t b = 0; b < j->batch; b++)
    if (j->q_indptr[b + 1] < j->q_indptr[b])
      return rvm_raise("ValueError", "%s: q_indptr decreases at sequence %lld", j->kernel, (long long)b);
  return 0;
}

/* Whether the CPU has AVX-512's 256-bit forms (every AVX-512 CPU but the Xeon Phi): the AVX-512
 * build takes its dot products in ymm16-31 too. */
static bool has_avx512vl(void) {
#if defined(__x86_64__)
  unsigned eax, ebx, ecx, edx;
  return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (ebx & (1u << 31));
#else
  return false;
#endif
}

/* The build this CPU runs, decided once. RELAXC_QUANT_ISA=portable|avx2 (the LLM kernels' switch,
 * quant.c) picks a lesser one, so that tests compare them on one CPU. */
static int attend_isa(void) {
  static _Atomic int chosen = -1;
  int isa = atomic_load_explicit(&chosen, memory_order_relaxed);
  if (isa >= 0) return isa;
  bool portable = rk_quant_isa_forced("portable"), avx2 = rk_quant_isa_forced("avx2");
  isa = ATTEND_GENERIC;
  if (rk_cpu_isa() == RK_ISA_AVX2 && !portable) isa = rk_use_avx512() && has_avx512vl() && !avx2 ? ATTEND_AVX512 : ATTEND_AVX2;
  rk_report_path("paged KV cache attention",
                 isa == ATTEND_AVX512 ? "AVX-512" : (isa == ATTEND_AVX2 ? "AVX2" : "portable vectors"));
  atomic_store_explicit(&chosen, isa, memory_order_relaxed);
  return isa;
}

static int run(attn_job *j) {
  if (j->rows == 0) return 0;
  j->isa = attend_isa();
  for (int64_t b = 0; j->ggml && b < j->batch; b++) {
    int64_t rows = kv_length(j, b);
    j->longest = rows > j->longest ? rows : j->longest;
  }
  return rk_parallel(j->rows * j->hkv, attend_task, j);
}

/* (q, q_indptr, k, v, kv_indptr, q_rope_position, k_rope_pos_offset, output, lse, causal,
 * rotary_mode, rope_scale, rope_theta, sm_scale) */
static int ragged(attn_job j, const TVMFFIAny *args, int32_t num_args) {
  DLTensor *q, *k, *v, *out, *lse;
  int64_t causal;
  int rc = rk_check_count(j.kernel, num_args, 14);
  if (!rc) rc = rk_arg_f32(j.kernel, args, num_args, 0, "q", &q);
  if (!rc) rc = rk_arg_f32(j.kernel, args, num_args, 2, "k", &k);
  if (!rc) rc = rk_arg_f32(j.kernel, args, num_args, 3, "v", &v);
  if (!rc) rc = rk_arg_f32(j.kernel, args, num_args, 7, "output", &out);
  if (!rc) rc = rk_arg_f32(j.kernel, args, num_args, 8, "lse", &lse);
  if (!rc) rc = rk_arg_int(j.kernel, args, num_args, 9, "causal", &causal);
  if (rc) return rc;
  if (k->ndim != 3 || v->ndim != 3 || v->shape[0] != k->shape[0] || v->shape[1] != k->shape[1])
    return rk_shape_error(j.kernel, "k and v must be [tokens, KV heads, head dim] alike", k);
  j.hkv = k->shape[1], j.d = k->shape[2];
  if (v->shape[2] != j.d) return rk_shape_error(j.kernel, "v must have k's head dim", v);
  if ((rc = check_queries(&j, q, out, lse))) return rc;
  if ((rc = check_scalars(&j, args, num_args, 10))) return rc;
  DLTensor *indptr = rvm_as_dltensor(&args[1]);
  j.batch = indptr && indptr->ndim == 1 ? indptr->shape[0] - 1 : -1;
  if (j.batch < 1) return rvm_raise("TypeError", "%s: q_indptr must be a 1-D tensor of batch + 1 values", j.kernel);
  if ((rc = arg_indices(j.kernel, args, num_args, 1, "q_indptr", j.batch + 1, &j.q_indptr))) return rc;
  if ((rc = arg_indices(j.kernel, args, num_args, 4, "kv_indptr", j.batch + 1, &j.kv_indptr))) return rc;
  if ((rc = check_q_indptr(&j))) return rc;
  for (int64_t b = 0; b < j.batch; b++)
    if (j.kv_indptr[b] < 0 || j.kv_indptr[b + 1] < j.kv_indptr[b] || j.kv_indptr[b + 1] > k->shape[0])
      return rvm_raise("ValueError", "%s: kv_indptr of sequence %lld is outside k's %lld rows", j.kernel,
                       (long long)b, (long long)k->shape[0]);
  j.q = rk_data(q), j.k = rk_data(k), j.v = rk_data(v), j.out = rk_data(out), j.lse = rk_data(lse);
  j.causal = causal != 0;
  return run(&j);
}

/* The page table arguments shared by the paged prefill and decode, from args[i]: pages,
 * page_indptr, page_values, length_info. */
static int paged_args(attn_job *j, const TVMFFIAny *args, int32_t num_args, int32_t i) {
  DLTensor *pages;
  int rc = rk_arg_f32(j->kernel, args, num_args, i, "pages", &pages);
  if (rc) return rc;
  if (pages->ndim != 5 || pages->shape[1] != 2 || pages->shape[3] <= 0)
    return rk_shape_error(j->kernel, "pages must be [pages, 2, KV heads, page size, head dim]", pages);
  j->hkv = pages->shape[2], j->page_size = pages->shape[3], j->d = pages->shape[4];
  DLTensor *indptr = rvm_as_dltensor(&args[i + 1]);
  j->batch = indptr && indptr->ndim == 1 ? indptr->shape[0] - 1 : -1;
  if (j->batch < 1)
    return rvm_raise("TypeError", "%s: page_indptr must be a 1-D tensor of batch + 1 values", j->kernel);
  if ((rc = arg_indices(j->kernel, args, num_args, i + 1, "page_indptr", j->batch + 1, &j->page_indptr))) return rc;
  DLTensor *values = rvm_as_dltensor(&args[i + 2]);
  int64_t nnz = j->page_indptr[j->batch];
  if (!values || nnz < 0 || rk_numel(values) < nnz)
    return rvm_raise("ValueError", "%s: page_values holds fewer page ids than page_indptr names", j->kernel);
  if ((rc = arg_indices(j->kernel, args, num_args, i + 2, "page_values", nnz, &j->page_ids))) return rc;
  if ((rc = arg_indices(j->kernel, args, num_args, i + 3, "length_info", j->batch, &j->last_page_len))) return rc;
  j->pages = rk_data(pages);
  return check_pages(j, pages);
}

/* (q, q_indptr, pages, page_indptr, page_values, length_info, k_rope_pos_offset, q_rope_position,
 * output, lse, causal, rotary_mode, rope_scale, rope_theta, sm_scale) */
static int paged_prefill(attn_job j, const TVMFFIAny *args, int32_t num_args) {
  DLTensor *q, *out, *lse;
  int64_t causal;
  int rc = rk_check_count(j.kernel, num_args, 15);
  if (!rc) rc = rk_arg_f32(j.kernel, args, num_args, 0, "q", &q);
  if (!rc) rc = rk_arg_f32(j.kernel, args, num_args, 8, "output", &out);
  if (!rc) rc = rk_arg_f32(j.kernel, args, num_args, 9, "lse", &lse);
  if (!rc) rc = rk_arg_int(j.kernel, args, num_args, 10, "causal", &causal);
  if (!rc) rc = paged_args(&j, args, num_args, 2);
  if (!rc) rc = check_queries(&j, q, out, lse);
  if (!rc) rc = check_scalars(&j, args, num_args, 11);
  if (!rc) rc = arg_indices(j.kernel, args, num_args, 1, "q_indptr", j.batch + 1, &j.q_indptr);
  if (!rc) rc = check_q_indptr(&j);
  if (rc) return rc;
  j.q = rk_data(q), j.out = rk_data(out), j.lse = rk_data(lse);
  j.causal = causal != 0;
  return run(&j);
}

/* (q, pages, page_indptr, page_values, length_info, k_rope_pos_offset, q_rope_position, output,
 * lse, rotary_mode, rope_scale, rope_theta, sm_scale): one query row per sequence. */
static int paged_decode(attn_job j, const TVMFFIAny *args, int32_t num_args) {
  DLTensor *q, *out, *lse;
  int rc = rk_check_count(j.kernel, num_args, 13);
  if (!rc) rc = rk_arg_f32(j.kernel, args, num_args, 0, "q", &q);
  if (!rc) rc = rk_arg_f32(j.kernel, args, num_args, 7, "output", &out);
  if (!rc) rc = rk_arg_f32(j.kernel, args, num_args, 8, "lse", &lse);
  if (!rc) rc = paged_args(&j, args, num_args, 1);
  if (!rc) rc = check_queries(&j, q, out, lse);
  if (rc) return rc;
  if (j.rows != j.batch)
    return rvm_raise("ValueError", "%s: %lld query rows for %lld sequences (decode takes one each)", j.kernel,
                     (long long)j.rows, (long long)j.batch);
  if ((rc = check_scalars(&j, args, num_args, 9))) return rc;
  j.q = rk_data(q), j.out = rk_data(out), j.lse = rk_data(lse);
  return run(&j);
}

/* Each kernel in relaxc's order and in llama.cpp's (the _ggml twins: attention_ggml.c). */
#define ATTENTION_KERNEL(suffix, parse, name, ggml_arithmetic)                                                  \
  int rvm_builtin_kl_##suffix(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {        \
    (void)self, (void)result;                                                                                   \
    return parse((attn_job){.kernel = name, .ggml = ggml_arithmetic}, args, num_args);                         \
  }
ATTENTION_KERNEL(attention_ragged, ragged, "relaxc.attention_ragged", false)
ATTENTION_KERNEL(attention_paged_prefill, paged_prefill, "relaxc.attention_paged_prefill", false)
ATTENTION_KERNEL(attention_paged_decode, paged_decode, "relaxc.attention_paged_decode", false)
ATTENTION_KERNEL(attention_ragged_ggml, ragged, "relaxc.attention_ragged_ggml", true)
ATTENTION_KERNEL(attention_paged_prefill_ggml, paged_prefill, "relaxc.attention_paged_prefill_ggml", true)
ATTENTION_KERNEL(attention_paged_decode_ggml, paged_decode, "relaxc.attention_paged_decode_ggml", true)
