/*
 * sdpa.c: relaxc.attention, softmax(alpha * q k + mask) v over the keys in one kernel: the
 * attention of encoders and of any model run without a KV cache (an ONNX file's MatMul -> Div ->
 * Add -> Softmax -> MatMul), which as separate kernels writes the whole score matrix out, reads
 * it back for the softmax, writes it again and reads it for the second product.
 *
 * Operands are views (permute_dims folded in, as relaxc.matmul reads them): q [..., sq, d], k
 * [..., d, sk] (the keys transposed: the first product's second operand), v [..., sk, dv] and the
 * result [..., sq, dv]; their batch dims broadcast, and so does the mask's (added to the scaled
 * scores, [..., sq, sk] or any shape that broadcasts to it).
 *
 * A unit of work is one batch entry's block of SDPA_QB query rows. Its thread packs the entry's
 * keys ([d][sk], zero past sk) and values ([sk][dv], zero past dv), keeps them for its next unit
 * of the same entry, and takes SDPA_MR rows at a time over the keys in chunks of SDPA_KC with the
 * softmax kept online (the running maximum and sum rescaled chunk by chunk), so no more than
 * SDPA_MR x SDPA_KC scores are ever in memory. Every score is one chain of multiply-adds over d
 * in order, every output value one chain over the keys in order, and each row's sum runs in
 * SDPA_LANES lanes added in a fixed order: the bits depend neither on the thread count nor on the
 * vector width (AVX2 and AVX-512 agree; the portable build, its multiplies and adds unfused,
 * rounds differently).
 */
#include <stdatomic.h>
#include <stdio.h>

#include "rk.h"
#include "rk_math.h"

enum {
  SDPA_MR = 12,       /* query rows in registers at once, at most (AVX-512's; 6 elsewhere) */
  SDPA_QB = 48,       /* query rows of one unit of work */
  SDPA_KC = 256,      /* keys of one chunk of the online softmax */
  SDPA_KEY_STEP = 32, /* keys are padded to this: two vectors of the widest instance */
  SDPA_DV_STEP = 16,  /* value columns are padded to this: one vector of the widest instance */
  SDPA_LANES = 16     /* partial sums of a row's exponentials */
};

/* One call's operands, batch dims flattened into entries. */
typedef struct sdpa_job {
  int32_t batch_rank;
  int64_t batch[RK_MAX_RANK];
  int64_t q_b[RK_MAX_RANK], k_b[RK_MAX_RANK], v_b[RK_MAX_RANK], m_b[RK_MAX_RANK], o_b[RK_MAX_RANK];
  int64_t sq, sk, d, dv, sk_padded, dv_padded;
  int64_t q_rs, q_cs, k_rs, k_cs, v_rs, v_cs, mask_rs, mask_cs, o_rs, o_cs;
  const float *q, *k, *v, *mask;
  float *out;
  float alpha;
  int64_t blocks, units; /* query blocks per entry; entries times blocks */
} sdpa_job;

/* One batch entry's operands. */
typedef struct sdpa_entry {
  const float *q, *k, *v, *mask;
  float *out;
} sdpa_entry;

/* What the softmax step needs of a block's rows. */
typedef struct sdpa_rows {
  const float *mask[SDPA_MR]; /* each row's mask (NULL: none), at the chunk's first key */
  int64_t mask_cs;
  float alpha;
} sdpa_rows;

/* A thread's working memory: the packed keys and values, a block's rows and their state. */
typedef struct sdpa_buffers {
  float *kt, *v, *q, *s, *o;
  float m[SDPA_MR], l[SDPA_MR], corr[SDPA_MR];
} sdpa_buffers;

static inline __attribute__((always_inline)) float sdpa_combine(const float *lanes) {
  float half[8];
  for (int i = 0; i < 8; i++) half[i] = lanes[i] + lanes[i + 8];
  return ((half[0] + half[4]) + (half[1] + half[5])) + ((half[2] + half[6]) + (half[3] + half[7]));
}

/* The larger of each lane pair, as a vector select (GCC's and clang's vector comparisons give
 * lanes of all ones or zeros). */
typedef int32_t sdpa_i8 __attribute__((vector_size(32)));
#define sdpa_max8(a, b) \
  ((rk_f8)((((sdpa_i8)(a)) & ((a) > (b))) | (((sdpa_i8)(b)) & ~((a) > (b)))))

/* ---- the instances --------------------------------------------------------------------------- */

/* Portable: GCC's and clang's 8-lane vectors, multiplies and adds unfused. */
#define SD(name) name##_generic
#define SD_FN
#define SD_W 8
#define SD_V rk_f8
#define SD_ZERO ((rk_f8){0})
#define SD_LOAD(p) rk_f8_load(p)
#define SD_STORE(p, v) RK_F8_STORE((p), (v))
#define SD_SPLAT(x) ((rk_f8){(x), (x), (x), (x), (x), (x), (x), (x)})
#define SD_MUL(a, b) ((a) * (b))
#define SD_MADD(acc, a, b) ((acc) + (a) * (b))
#define SD_MAX(a, b) sdpa_max8((a), (b))
#define SD_MR 6
#define SD_ADD(a, b) ((a) + (b))
#define SD_SUB(a, b) ((a) - (b))
#include "sdpa_body.h"

#if defined(__x86_64__)
#include <immintrin.h>

/* e^x by rk_exp's steps (x = n ln2 + r, a degree-6 polynomial in r, 2^n built in the exponent)
 * with the polynomial's multiply-adds fused: half the operations. The AVX2 and AVX-512 forms
 * are the same operations, so they give the same bits. Below -87.3: 0; NaN stays NaN. */
RK_AVX2_TARGET static inline __m256 sdpa_exp_avx2(__m256 x) {
  __m256 c = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(c, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), c);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(1.0f / 720.0f), r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  __m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
  e = _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ), e);
  return _mm256_blendv_ps(e, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

RK_AVX512_TARGET static inline __m512 sdpa_exp_avx512(__m512 x) {
  __m512 c = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(c, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), c);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.0f / 720.0f), r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  __m512 e = _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
  e = _mm512_maskz_mov_ps(~_mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ), e);
  return _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

#define SD(name) name##_avx2
#define SD_FN RK_AVX2_TARGET
#define SD_W 8
#define SD_V __m256
#define SD_ZERO _mm256_setzero_ps()
#define SD_LOAD(p) _mm256_loadu_ps(p)
#define SD_STORE(p, v) _mm256_storeu_ps((p), (v))
#define SD_SPLAT(x) _mm256_set1_ps(x)
#define SD_MUL(a, b) _mm256_mul_ps((a), (b))
#define SD_MADD(acc, a, b) _mm256_fmadd_ps((a), (b), (acc))
#define SD_MAX(a, b) _mm256_max_ps((a), (b))
#define SD_MR 6
#define SD_ADD(a, b) _mm256_add_ps((a), (b))
#define SD_SUB(a, b) _mm256_sub_ps((a), (b))
#define SD_EXP(v) sdpa_exp_avx2(v)
#include "sdpa_body.h"

#define SD(name) name##_avx512
#define SD_FN RK_AVX512_TARGET
#define SD_W 16
#define SD_V __m512
#define SD_ZERO _mm512_setzero_ps()
#define SD_LOAD(p) _mm512_loadu_ps(p)
#define SD_STORE(p, v) _mm512_storeu_ps((p), (v))
#define SD_SPLAT(x) _mm512_set1_ps(x)
#define SD_MUL(a, b) _mm512_mul_ps((a), (b))
#define SD_MADD(acc, a, b) _mm512_fmadd_ps((a), (b), (acc))
#define SD_MAX(a, b) _mm512_max_ps((a), (b))
#define SD_MR 12
#define SD_ADD(a, b) _mm512_add_ps((a), (b))
#define SD_SUB(a, b) _mm512_sub_ps((a), (b))
#define SD_EXP(v) sdpa_exp_avx512(v)
#include "sdpa_body.h"
#endif

typedef void (*sdpa_block_fn)(const sdpa_job *job, const sdpa_entry *e, int64_t r0, int count, sdpa_buffers *buf);

/* The instance this CPU runs, and its rows per block. */
static sdpa_block_fn pick_block(int *rows, const char **name) {
  *rows = 6;
  *name = "portable vectors";
#if defined(__x86_64__)
  if (rk_cpu_isa() == RK_ISA_AVX2 && rk_use_avx512()) {
    *rows = 12;
    *name = "AVX-512";
    return block_avx512;
  }
  if (rk_cpu_isa() == RK_ISA_AVX2) {
    *name = "AVX2";
    return block_avx2;
  }
#endif
  return block_generic;
}

/* pick_block's answer, decided once per process. */
static sdpa_block_fn chosen_block(int *rows) {
  static sdpa_block_fn _Atomic chosen;
  static _Atomic int chosen_rows;
  sdpa_block_fn fn = atomic_load_explicit(&chosen, memory_order_acquire);
  if (!fn) {
    const char *name;
    int r;
    fn = pick_block(&r, &name);
    rk_report_path("encoder attention (relaxc.attention)", name);
    atomic_store_explicit(&chosen_rows, r, memory_order_relaxed);
    atomic_store_explicit(&chosen, fn, memory_order_release);
  }
  *rows = atomic_load_explicit(&chosen_rows, memory_order_relaxed);
  return fn;
}

/* ---- the work ---------------------------------------------------------------------------------- */

static sdpa_entry entry_at(const sdpa_job *j, int64_t index) {
  sdpa_entry e = {j->q, j->k, j->v, j->mask, j->out};
  for (int32_t d = j->batch_rank - 1; d >= 0; d--) {
    int64_t i = index % j->batch[d];
    index /= j->batch[d];
    e.q += i * j->q_b[d], e.k += i * j->k_b[d], e.v += i * j->v_b[d], e.out += i * j->o_b[d];
    if (e.mask) e.mask += i * j->m_b[d];
  }
  return e;
}

/* The entry's keys as [d][sk_padded] and values as [sk_padded][dv_padded], zeros around them.
 * The loops read the source in its own order (keys and values are rows of q/k/v projections,
 * their features contiguous), so each key is read once from memory. */
static void pack_entry(const sdpa_job *j, const sdpa_entry *e, sdpa_buffers *buf) {
  if (j->k_rs == 1) {
    for (int64_t c = 0; c < j->sk; c++) {
      const float *src = e->k + c * j->k_cs;
      for (int64_t i = 0; i < j->d; i++) buf->kt[i * j->sk_padded + c] = src[i];
    }
  } else {
    for (int64_t i = 0; i < j->d; i++)
      for (int64_t c = 0; c < j->sk; c++) buf->kt[i * j->sk_padded + c] = e->k[i * j->k_rs + c * j->k_cs];
  }
  for (int64_t i = 0; i < j->d; i++)
    for (int64_t c = j->sk; c < j->sk_padded; c++) buf->kt[i * j->sk_padded + c] = 0.0f;
  for (int64_t r = 0; r < j->sk_padded; r++) {
    float *dst = buf->v + r * j->dv_padded;
    const float *src = e->v + r * j->v_rs;
    int64_t c = 0;
    if (r < j->sk && j->v_cs == 1) {
      __builtin_memcpy(dst, src, (size_t)j->dv * sizeof(float));
      c = j->dv;
    } else if (r < j->sk) {
      for (; c < j->dv; c++) dst[c] = src[c * j->v_cs];
    }
    for (; c < j->dv_padded; c++) dst[c] = 0.0f;
  }
}

typedef struct sdpa_work {
  const sdpa_job *job;
  sdpa_block_fn block;
  int rows; /* the block's rows */
} sdpa_work;

static int sdpa_task(int task, int num_tasks, void *ctx) {
  const sdpa_work *w = ctx;
  const sdpa_job *j = w->job;
  int64_t begin, end;
  rk_split(j->units, task, num_tasks, &begin, &end);
  size_t kt = (size_t)(j->d * j->sk_padded), v = (size_t)(j->sk_padded * j->dv_padded);
  size_t q = (size_t)(SDPA_MR * j->d), s = SDPA_MR * SDPA_KC, o = (size_t)(SDPA_MR * j->dv_padded);
  float *mem = rk_scratch(RK_SLOT_INPUT, (kt + v + q + s + o) * sizeof(float));
  if (!mem) return rk_out_of_memory("relaxc.attention");
  sdpa_buffers buf = {.kt = mem, .v = mem + kt, .q = mem + kt + v, .s = mem + kt + v + q, .o = mem + kt + v + q + s};
  int64_t packed = -1;
  for (int64_t u = begin; u < end; u++) {
    int64_t index = u / j->blocks, r0 = u % j->blocks * SDPA_QB;
    sdpa_entry e = entry_at(j, index);
    if (index != packed) {
      pack_entry(j, &e, &buf);
      packed = index;
    }
    int64_t r1 = r0 + SDPA_QB < j->sq ? r0 + SDPA_QB : j->sq;
    for (int64_t r = r0; r < r1; r += w->rows) w->block(j, &e, r, (int)(r1 - r < w->rows ? r1 - r : w->rows), &buf);
  }
  return 0;
}

/* ---- arguments --------------------------------------------------------------------------------- */

/* Batch dim d of view x against the result's: its stride, 0 when x broadcasts along it (size 1
 * or absent), or -1 when the sizes differ. x's last `inner` dims are not batch dims. */
static int64_t batch_stride(const rk_view *x, int32_t inner, int32_t d, int32_t batch_rank, int64_t size) {
  int32_t dx = d - (batch_rank - (x->ndim - inner));
  if (dx < 0 || x->shape[dx] == 1) return 0;
  return x->shape[dx] == size ? x->strides[dx] : -1;
}

static int plan(const char *kernel, const rk_view *q, const rk_view *k, const rk_view *v, const rk_view *mask,
                const rk_view *o, sdpa_job *j) {
  char sq[96], sk[96], sv[96], so[96];
  rk_view_format(q, sq, sizeof sq);
  rk_view_format(k, sk, sizeof sk);
  rk_view_format(v, sv, sizeof sv);
  rk_view_format(o, so, sizeof so);
  if (q->ndim < 2 || k->ndim < 2 || v->ndim < 2 || o->ndim < 2)
    return rvm_raise("ValueError", "%s: q %s, k %s, v %s and out %s must have rank 2 or more", kernel, sq, sk, sv, so);
  j->sq = q->shape[q->ndim - 2], j->d = q->shape[q->ndim - 1];
  j->sk = k->shape[k->ndim - 1], j->dv = v->shape[v->ndim - 1];
  if (k->shape[k->ndim - 2] != j->d || v->shape[v->ndim - 2] != j->sk || o->shape[o->ndim - 2] != j->sq ||
      o->shape[o->ndim - 1] != j->dv)
    return rvm_raise("ValueError",
                     "%s: q %s, k %s (transposed keys) and v %s give no result of shape %s: want q [..., sq, d], "
                     "k [..., d, sk], v [..., sk, dv], out [..., sq, dv]",
                     kernel, sq, sk, sv, so);
  j->batch_rank = o->ndim - 2;
  const rk_view *ops[] = {q, k, v};
  for (int32_t d = 0; d < j->batch_rank; d++) {
    j->batch[d] = o->shape[d];
    j->o_b[d] = o->strides[d];
    int64_t *strides[] = {&j->q_b[d], &j->k_b[d], &j->v_b[d]};
    for (int i = 0; i < 3; i++) {
      if (ops[i]->ndim - 2 > j->batch_rank)
        return rvm_raise("ValueError", "%s: an operand has more batch dims than out %s", kernel, so);
      *strides[i] = batch_stride(ops[i], 2, d, j->batch_rank, j->batch[d]);
      if (*strides[i] < 0)
        return rvm_raise("ValueError", "%s: the batch dims of q %s, k %s and v %s do not broadcast to out %s", kernel,
                         sq, sk, sv, so);
    }
    j->m_b[d] = 0;
  }
  if (mask) {
    char sm[96];
    rk_view_format(mask, sm, sizeof sm);
    int32_t rank = j->batch_rank + 2;
    if (mask->ndim > rank)
      return rvm_raise("ValueError", "%s: the mask %s has more dims than the scores", kernel, sm);
    int64_t want[RK_MAX_RANK + 2];
    for (int32_t d = 0; d < j->batch_rank; d++) want[d] = j->batch[d];
    want[j->batch_rank] = j->sq, want[j->batch_rank + 1] = j->sk;
    int64_t strides[RK_MAX_RANK + 2];
    for (int32_t d = 0; d < rank; d++) {
      int32_t dm = d - (rank - mask->ndim);
      int64_t size = dm < 0 ? 1 : mask->shape[dm];
      if (size != 1 && size != want[d])
        return rvm_raise("ValueError", "%s: the mask %s does not broadcast to the scores [..., %lld, %lld]", kernel,
                         sm, (long long)j->sq, (long long)j->sk);
      strides[d] = size == 1 ? 0 : mask->strides[dm];
    }
    for (int32_t d = 0; d < j->batch_rank; d++) j->m_b[d] = strides[d];
    j->mask_rs = strides[j->batch_rank], j->mask_cs = strides[j->batch_rank + 1];
  }
  j->q_rs = q->strides[q->ndim - 2], j->q_cs = q->strides[q->ndim - 1];
  j->k_rs = k->strides[k->ndim - 2], j->k_cs = k->strides[k->ndim - 1];
  j->v_rs = v->strides[v->ndim - 2], j->v_cs = v->strides[v->ndim - 1];
  j->o_rs = o->strides[o->ndim - 2], j->o_cs = o->strides[o->ndim - 1];
  j->sk_padded = (j->sk + SDPA_KEY_STEP - 1) / SDPA_KEY_STEP * SDPA_KEY_STEP;
  j->dv_padded = (j->dv + SDPA_DV_STEP - 1) / SDPA_DV_STEP * SDPA_DV_STEP;
  return 0;
}

/* Multiply-adds worth a task of their own. */
enum { MACS_PER_TASK = 1 << 19 };

/* (q, k, v, mask?, q_perm?, k_perm?, v_perm?, out_perm?, [alpha], out) */
int rvm_builtin_kl_attention(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  (void)self, (void)result;
  static const char kernel[] = "relaxc.attention";
  DLTensor *q, *k, *v, *mask, *out;
  int rc = rk_check_count(kernel, num_args, 10);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 0, "q", &q);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 1, "k", &k);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 2, "v", &v);
  if (!rc) rc = rk_arg_f32_or_none(kernel, args, num_args, 3, "mask", &mask);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 9, "out", &out);
  rk_view vq = {0}, vk = {0}, vv = {0}, vm = {0}, vo = {0};
  if (!rc) rc = rk_view_permuted(kernel, q, args, num_args, 4, "q_perm", &vq);
  if (!rc) rc = rk_view_permuted(kernel, k, args, num_args, 5, "k_perm", &vk);
  if (!rc) rc = rk_view_permuted(kernel, v, args, num_args, 6, "v_perm", &vv);
  if (!rc) rc = out->ndim > RK_MAX_RANK ? rk_shape_error(kernel, "the result's rank is too large", out) : 0;
  if (!rc) rc = rk_view_result(kernel, out, args, num_args, 7, &vo);
  if (!rc && mask) rc = mask->ndim > RK_MAX_RANK ? rk_shape_error(kernel, "the mask's rank is too large", mask) : 0;
  if (!rc && mask) rk_view_compact(mask, &vm);
  float alpha = 1.0f;
  if (!rc) rc = rk_arg_scalars(kernel, args, num_args, 8, "alpha", 1, &alpha);
  sdpa_job j = {0};
  if (!rc) rc = plan(kernel, &vq, &vk, &vv, mask ? &vm : NULL, &vo, &j);
  if (rc) return rc;
  int64_t entries = 1;
  for (int32_t d = 0; d < j.batch_rank; d++) entries *= j.batch[d];
  if (entries == 0 || j.sq == 0 || j.dv == 0) return 0;
  if (j.sk == 0) {
    /* softmax over no keys: 0 / 0, as the unfused operators give. */
    for (int64_t i = 0; i < rk_numel(out); i++) rk_data(out)[i] = __builtin_nanf("");
    return 0;
  }
  j.q = rk_data(q), j.k = rk_data(k), j.v = rk_data(v), j.mask = mask ? rk_data(mask) : NULL, j.out = rk_data(out);
  j.alpha = alpha;
  j.blocks = (j.sq + SDPA_QB - 1) / SDPA_QB;
  j.units = entries * j.blocks;
  sdpa_work w = {.job = &j};
  w.block = chosen_block(&w.rows);
  int64_t by_work = entries * j.sq * j.sk * (j.d + j.dv) / MACS_PER_TASK + 1;
  return rk_parallel(j.units < by_work ? j.units : by_work, sdpa_task, &w);
}
