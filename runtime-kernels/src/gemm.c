/*
 * gemm.c: the GEMM driver behind matmul, linear layers and convolution: packing, cache
 * blocking, the epilogue and the split over the thread pool.
 *
 * The loop nest is BLIS's: B in panels of RK_NR columns ([panel][k][NR]), A packed per block of
 * MC rows into strips of RK_MR, the reduction cut into blocks of rk_kc(k) steps so that a strip of A and a
 * panel of B stay in L1/L2 while the micro-kernel runs. Weights that relaxc.tvm prepacked are
 * used in place; other B operands are packed once per call.
 *
 * Bits: every element sums its first rk_kc(k) products in the micro-kernel, adds that to C,
 * then the next block, and so on: the order depends on k alone. The pool splits whole blocks of
 * output (rows, columns, batch) between tasks, so any thread count gives the same bits.
 */
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "rk.h"
#include "rk_math.h"

/* Rows of A per packed block (a multiple of RK_MR; MC x KC floats stay in L2). */
enum { RK_MC = 96 };
/* Column panels per block when there is work enough; fewer when the pool needs more blocks. */
enum { RK_NC_PANELS = 16 };
/* Below this many multiply-adds a product runs on the calling thread alone. */
#define RK_PARALLEL_MIN_MACS (64.0 * 1024.0)

rk_epilogue rk_epilogue_none(void) {
  rk_epilogue ep = {0};
  ep.alpha = 1.0f;
  return ep;
}

int64_t rk_kc(int64_t k) {
  int64_t blocks = (k + RK_KC - 1) / RK_KC;
  return blocks <= 1 ? k : (k + blocks - 1) / blocks;
}

/* ---- packing --------------------------------------------------------------------------------- */

void rk_pack_a_strided(const void *operand, int64_t m0, int64_t mr, int64_t k0, int64_t kc, float *dst) {
  const rk_matrix *a = operand;
  if (mr < RK_MR) memset(dst, 0, sizeof(float) * RK_MR * (size_t)kc);
  if (a->cs == 1 && mr == RK_MR) {
    /* Six rows read side by side, dst written in order (row by row, each store was RK_MR floats
     * from the last: 8.6% of a MiniLM encoder's time). */
    const float *src = a->data + m0 * a->rs + k0;
    int64_t rs = a->rs;
    for (int64_t k = 0; k < kc; k++, dst += RK_MR) {
      dst[0] = src[k], dst[1] = src[rs + k], dst[2] = src[2 * rs + k];
      dst[3] = src[3 * rs + k], dst[4] = src[4 * rs + k], dst[5] = src[5 * rs + k];
    }
  } else if (a->cs == 1) {
    for (int64_t r = 0; r < mr; r++) {
      const float *src = a->data + (m0 + r) * a->rs + k0;
      for (int64_t k = 0; k < kc; k++) dst[k * RK_MR + r] = src[k];
    }
  } else {
    for (int64_t k = 0; k < kc; k++) {
      const float *src = a->data + m0 * a->rs + (k0 + k) * a->cs;
      for (int64_t r = 0; r < mr; r++) dst[k * RK_MR + r] = src[r * a->rs];
    }
  }
}

void rk_pack_b(const rk_matrix *b, int64_t k, int64_t n, int64_t n0, int64_t panels, float *dst) {
  for (int64_t p = 0; p < panels; p++) {
    int64_t j0 = n0 + p * RK_NR, nr = n - j0 < RK_NR ? n - j0 : RK_NR;
    float *out = dst + p * k * RK_NR;
    if (nr <= 0) {
      memset(out, 0, sizeof(float) * RK_NR * (size_t)k);
      continue;
    }
    for (int64_t kk = 0; kk < k; kk++) {
      const float *src = b->data + kk * b->rs + j0 * b->cs;
      float *row = out + kk * RK_NR;
      if (b->cs == 1) {
        memcpy(row, src, sizeof(float) * (size_t)nr);
      } else {
        for (int64_t j = 0; j < nr; j++) row[j] = src[j * b->cs];
      }
      for (int64_t j = nr; j < RK_NR; j++) row[j] = 0.0f;
    }
  }
}

/* ---- the epilogue ---------------------------------------------------------------------------- */

float rk_activate(float x, rk_act act, float lo, float hi) {
  switch (act) {
    case RK_ACT_RELU: return x > 0.0f ? x : 0.0f;
    case RK_ACT_CLIP: return x < lo ? lo : (x > hi ? hi : x);
    case RK_ACT_GELU: return rk_gelu(x);
    case RK_ACT_GELU_TANH: return rk_gelu_tanh(x);
    case RK_ACT_SILU: return rk_silu(x);
    case RK_ACT_SIGMOID: return rk_sigmoid(x);
    case RK_ACT_HARD_SIGMOID: return rk_hard_sigmoid(x, lo, hi);
    case RK_ACT_HARD_SWISH: return x * rk_hard_sigmoid(x, lo, hi);
    default: return x;
  }
}

/* The loops behind rk_activate_all, compiled once per instruction set. */
static inline __attribute__((always_inline)) void activate_span(float *x, int64_t n, rk_act act, float lo, float hi) {
  switch (act) {
    case RK_ACT_RELU:
      for (int64_t i = 0; i < n; i++) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
      break;
    case RK_ACT_CLIP:
      for (int64_t i = 0; i < n; i++) x[i] = x[i] < lo ? lo : (x[i] > hi ? hi : x[i]);
      break;
    case RK_ACT_GELU:
      for (int64_t i = 0; i < n; i++) x[i] = rk_gelu(x[i]);
      break;
    case RK_ACT_GELU_TANH:
      for (int64_t i = 0; i < n; i++) x[i] = rk_gelu_tanh(x[i]);
      break;
    case RK_ACT_SILU:
      for (int64_t i = 0; i < n; i++) x[i] = rk_silu(x[i]);
      break;
    case RK_ACT_SIGMOID:
      for (int64_t i = 0; i < n; i++) x[i] = rk_sigmoid(x[i]);
      break;
    case RK_ACT_HARD_SIGMOID:
      for (int64_t i = 0; i < n; i++) x[i] = rk_hard_sigmoid(x[i], lo, hi);
      break;
    case RK_ACT_HARD_SWISH:
      for (int64_t i = 0; i < n; i++) x[i] = x[i] * rk_hard_sigmoid(x[i], lo, hi);
      break;
    default: break;
  }
}

static void activate_generic(float *x, int64_t rs, int64_t rows, int64_t cols, rk_act act, float lo, float hi) {
  for (int64_t r = 0; r < rows; r++) activate_span(x + r * rs, cols, act, lo, hi);
}

#if defined(__x86_64__)
/* The exp-based activations a register at a time (rk_vmath.h), for AVX2 and then AVX-512. */
#define VM_TARGET RK_AVX2_TARGET
#define VM_NAME(fn) avx2_##fn
#define VM_F __m256
#define VM_LANES 8
#define VM_SET _mm256_set1_ps
#define VM_LOAD _mm256_loadu_ps
#define VM_STORE _mm256_storeu_ps
#define VM_ADD _mm256_add_ps
#define VM_SUB _mm256_sub_ps
#define VM_MUL _mm256_mul_ps
#define VM_DIV _mm256_div_ps
#define VM_MIN _mm256_min_ps
#define VM_MAX _mm256_max_ps
#define VM_NEG(v) _mm256_xor_ps(v, _mm256_set1_ps(-0.0f))
#define VM_POW2(n) \
  _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23))
#define VM_SELECT_LT(a, b, t, f) _mm256_blendv_ps(f, t, _mm256_cmp_ps(a, b, _CMP_LT_OQ))
#define VM_SELECT_NAN(v, t, f) _mm256_blendv_ps(f, t, _mm256_cmp_ps(v, v, _CMP_UNORD_Q))
#include "rk_vmath.h"

#define VM_TARGET RK_AVX512_TARGET
#define VM_NAME(fn) avx512_##fn
#define VM_F __m512
#define VM_LANES 16
#define VM_SET _mm512_set1_ps
#define VM_LOAD _mm512_loadu_ps
#define VM_STORE _mm512_storeu_ps
#define VM_ADD _mm512_add_ps
#define VM_SUB _mm512_sub_ps
#define VM_MUL _mm512_mul_ps
#define VM_DIV _mm512_div_ps
#define VM_MIN _mm512_min_ps
#define VM_MAX _mm512_max_ps
#define VM_NEG(v) _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), _mm512_set1_epi32(INT32_MIN)))
#define VM_POW2(n) \
  _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23))
#define VM_SELECT_LT(a, b, t, f) _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), f, t)
#define VM_SELECT_NAN(v, t, f) _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), f, t)
#include "rk_vmath.h"

/* Eight lanes instead of four: GELU's erf costs ~25 operations a value (BERT's FFN: 7x3072). */
RK_AVX2_TARGET static void activate_avx2(float *x, int64_t rs, int64_t rows, int64_t cols, rk_act act, float lo,
                                         float hi) {
  for (int64_t r = 0; r < rows; r++)
    if (!avx2_activate(x + r * rs, cols, act)) activate_span(x + r * rs, cols, act, lo, hi);
}
/* Sixteen where the CPU has AVX-512: the same operations on each value (the kernels are built
 * without contraction of multiply-adds), so the same bits. */
RK_AVX512_TARGET static void activate_avx512(float *x, int64_t rs, int64_t rows, int64_t cols, rk_act act, float lo,
                                             float hi) {
  for (int64_t r = 0; r < rows; r++)
    if (!avx512_activate(x + r * rs, cols, act)) activate_span(x + r * rs, cols, act, lo, hi);
}
#endif

void rk_activate_rows(float *x, int64_t rs, int64_t rows, int64_t cols, rk_act act, float lo, float hi) {
#if defined(__x86_64__)
  if (rk_cpu_isa() == RK_ISA_AVX2) {
    if (rk_use_avx512())
      activate_avx512(x, rs, rows, cols, act, lo, hi);
    else
      activate_avx2(x, rs, rows, cols, act, lo, hi);
    return;
  }
#endif
  activate_generic(x, rs, rows, cols, act, lo, hi);
}

void rk_activate_all(float *x, int64_t n, rk_act act, float lo, float hi) { rk_activate_rows(x, n, 1, n, act, lo, hi); }

/* The epilogue on one row of RK_NR results in place: scale, bias, residual, activation. */
static inline __attribute__((always_inline)) void finish_row(const rk_epilogue *ep, float *row, int64_t i, int64_t j0,
                                                            const float *res, int64_t res_cs, int64_t nr) {
  if (ep->alpha != 1.0f)
    for (int j = 0; j < RK_NR; j++) row[j] *= ep->alpha;
  if (ep->bias) {
    if (ep->bias_per_row) {
      float b = ep->bias[i];
      for (int j = 0; j < RK_NR; j++) row[j] += b;
    } else {
      for (int64_t j = 0; j < nr; j++) row[j] += ep->bias[j0 + j];
    }
  }
  if (res)
    for (int64_t j = 0; j < nr; j++) row[j] += res[j * res_cs];
  switch (ep->act) {
    case RK_ACT_NONE: break;
    case RK_ACT_RELU:
      for (int j = 0; j < RK_NR; j++) row[j] = row[j] > 0.0f ? row[j] : 0.0f;
      break;
    case RK_ACT_CLIP:
      for (int j = 0; j < RK_NR; j++) row[j] = row[j] < ep->lo ? ep->lo : (row[j] > ep->hi ? ep->hi : row[j]);
      break;
    /* Out of line: the elementary functions inlined into every copy of the driver cost ~37 KB
     * of code, a call per 16 values nothing measurable. */
    default: rk_activate_all(row, RK_NR, ep->act, ep->lo, ep->hi); break;
  }
}

/* Writes a tile's mr x nr results into C at (i0, j0): added to what C holds unless this is the
 * first block of k; on the last block, passed through the epilogue. Rows are handled whole
 * (RK_NR values, the loops vectorize); only the first nr are stored. */
static inline __attribute__((always_inline)) void store_tile(const rk_gemm *g, const float *tile, int64_t i0, int64_t mr,
                                                            int64_t j0, int64_t nr, bool first, bool last) {
  const rk_epilogue *ep = &g->ep;
  bool contiguous = g->c_cs == 1 && nr == RK_NR;
  for (int64_t r = 0; r < mr; r++) {
    float *c = g->c + (i0 + r) * g->c_rs + j0 * g->c_cs;
    float row[RK_NR];
    rk_f8 lo = rk_f8_load(tile + r * RK_NR), hi = rk_f8_load(tile + r * RK_NR + 8);
    if (!first) {
      if (contiguous) {
        lo += rk_f8_load(c);
        hi += rk_f8_load(c + 8);
      } else {
        float old[RK_NR] = {0};
        for (int64_t j = 0; j < nr; j++) old[j] = c[j * g->c_cs];
        lo += rk_f8_load(old);
        hi += rk_f8_load(old + 8);
      }
    }
    RK_F8_STORE(row, lo);
    RK_F8_STORE(row + 8, hi);
    if (last) {
      const float *res = ep->residual ? ep->residual + (i0 + r) * ep->res_rs + j0 * ep->res_cs : NULL;
      finish_row(ep, row, i0 + r, j0, res, ep->res_cs, nr);
    }
    if (contiguous) {
      RK_F8_STORE(c, rk_f8_load(row));
      RK_F8_STORE(c + 8, rk_f8_load(row + 8));
    } else {
      for (int64_t j = 0; j < nr; j++) c[j * g->c_cs] = row[j];
    }
  }
}

/* ---- blocks and tasks ------------------------------------------------------------------------ */

typedef struct gemm_job {
  const rk_gemm *problems;
  int64_t count;
  int64_t m_blocks, n_blocks;                    /* per problem (all share the shapes) */
  int64_t panels_per_block;                      /* the largest block's */
  int pair_cut;                                  /* blocks are cut every 1 or 2 panels */
  int64_t mc;                                    /* rows per block */
  const float *const *b_packed;                  /* per problem */
  rk_ukernel_fn ukernel;
  rk_ukernel_c_fn ukernel_c;                     /* NULL where the instruction set has none */
  rk_ukernel2_fn ukernel2;                       /* two panels at once; NULL where none */
  rk_ukernel2_c_fn ukernel2_c;
  rk_ukernel2_wide_c_fn ukernel2_wide;           /* two strips by two panels; NULL where none */
  rk_gemv4_fn gemv4;
  rk_ukernel_rows_c_fn ukernel_rows;             /* for B read in place; NULL where none */
  rk_ukernel_rows_wide_c_fn ukernel_rows_wide;
} gemm_job;

/* Whether a C-writing micro-kernel may write this product's tiles: C's rows contiguous, and so
 * the residual's where the epilogue adds it. */
static inline bool c_written_by_kernel(const rk_gemm *g, bool last) {
  return g->c_cs == 1 && (!last || !g->ep.residual || g->ep.res_cs == 1);
}

/* What a C-writing micro-kernel applies to the tile at (i0, j0): the epilogue with its activation
 * where rk_kernel_activates; the others its caller applies to the tile after (the same values in
 * the same order as store_tile's, so the same bits). */
static inline rk_tile_epilogue tile_epilogue(const rk_epilogue *ep, bool first, bool last, int64_t i0, int64_t j0) {
  rk_act act = rk_kernel_activates(ep->act) ? ep->act : RK_ACT_NONE;
  rk_tile_epilogue t = {first, last, ep->alpha, ep->lo, ep->hi, act, NULL, ep->bias_per_row, NULL, ep->res_rs};
  if (ep->bias) t.bias = ep->bias + (ep->bias_per_row ? i0 : j0);
  if (ep->residual) t.residual = ep->residual + i0 * ep->res_rs + j0;
  return t;
}

/* One tile: rows [i0, i0 + mr) by columns [j0, j0 + nr) from a strip of A and a panel of B. A
 * full tile whose epilogue the C-writing micro-kernel has goes straight from registers to C;
 * any other through a tile and store_tile (the same bits either way). */
static inline __attribute__((always_inline)) void compute_tile(const gemm_job *job, const rk_gemm *g, int64_t kc,
                                                              const float *strip, const float *panel, int64_t i0,
                                                              int64_t mr, int64_t j0, int64_t nr, bool first,
                                                              bool last) {
  const rk_epilogue *ep = &g->ep;
  if (job->ukernel_c && nr == RK_NR && c_written_by_kernel(g, last)) {
    rk_tile_epilogue t = tile_epilogue(ep, first, last, i0, j0);
    float *c = g->c + i0 * g->c_rs + j0;
    job->ukernel_c(kc, strip, panel, c, g->c_rs, (int)mr, &t);
    if (last && !rk_kernel_activates(ep->act)) rk_activate_rows(c, g->c_rs, mr, RK_NR, ep->act, ep->lo, ep->hi);
    return;
  }
  float tile[RK_MR * RK_NR] __attribute__((aligned(64)));
  job->ukernel(kc, strip, panel, tile, (int)mr);
  store_tile(g, tile, i0, mr, j0, nr, first, last);
}

/* Two neighbouring tiles, columns [j0, j0 + RK_NR) from `panel` and [j0 + RK_NR, j0 + RK_NR +
 * nr1) from panel + b_stride: the same bits as compute_tile on each. */
static inline __attribute__((always_inline)) void compute_tile2(const gemm_job *job, const rk_gemm *g, int64_t kc,
                                                               const float *strip, const float *panel,
                                                               int64_t b_stride, int64_t i0, int64_t mr, int64_t j0,
                                                               int64_t nr1, bool first, bool last) {
  const rk_epilogue *ep = &g->ep;
  if (job->ukernel2_c && nr1 == RK_NR && c_written_by_kernel(g, last)) {
    rk_tile_epilogue t = tile_epilogue(ep, first, last, i0, j0);
    float *c = g->c + i0 * g->c_rs + j0;
    job->ukernel2_c(kc, strip, panel, b_stride, c, g->c_rs, (int)mr, &t);
    if (last && !rk_kernel_activates(ep->act)) rk_activate_rows(c, g->c_rs, mr, 2 * RK_NR, ep->act, ep->lo, ep->hi);
    return;
  }
  float tiles[2 * RK_MR * RK_NR] __attribute__((aligned(64)));
  job->ukernel2(kc, strip, panel, b_stride, tiles, (int)mr);
  store_tile(g, tiles, i0, mr, j0, RK_NR, first, last);
  store_tile(g, tiles + RK_MR * RK_NR, i0, mr, j0 + RK_NR, nr1, first, last);
}

/* Panels [p_begin, p_end) of a B read in place against the strips of rows [m_begin, m_end), for
 * reduction steps [k0, k0 + kc): two panels a call where both are full. */
static inline __attribute__((always_inline)) void run_in_place(const gemm_job *job, const rk_gemm *g, int64_t m_begin,
                                                              int64_t m_end, int64_t p_begin, int64_t p_end,
                                                              int64_t k0, int64_t kc, bool first, bool last) {
  const rk_epilogue *ep = &g->ep;
  for (int64_t p = p_begin; p < p_end;) {
    /* Two panels where both are full; a last panel short of RK_NR columns alone, masked. */
    int64_t j0 = p * RK_NR, nr = g->n - j0 < RK_NR ? g->n - j0 : RK_NR;
    int panels = p + 1 < p_end && g->n - j0 >= 2 * RK_NR ? 2 : 1;
    for (int64_t i0 = m_begin; i0 < m_end;) {
      int64_t mr = m_end - i0 < RK_MR ? m_end - i0 : RK_MR;
      bool wide = panels == 2 && job->ukernel_rows_wide && m_end - i0 > RK_MR;
      rk_tile_epilogue t = tile_epilogue(ep, first, last, i0, j0);
      float *c = g->c + i0 * g->c_rs + j0;
      const float *strip = g->a_packed + ((i0 / RK_MR) * g->k + k0) * RK_MR;
      if (wide) {
        int64_t mr1 = m_end - i0 - RK_MR < RK_MR ? m_end - i0 - RK_MR : RK_MR;
        mr = RK_MR + mr1;
        job->ukernel_rows_wide(kc, strip, strip + g->k * RK_MR, (int)mr1, g->b_in_place + j0, g->b_rows + k0, c,
                               g->c_rs, &t);
      } else {
        job->ukernel_rows(kc, strip, g->b_in_place + j0, g->b_rows + k0, panels, (int)nr, c, g->c_rs, (int)mr, &t);
      }
      if (last && !rk_kernel_activates(ep->act))
        rk_activate_rows(c, g->c_rs, mr, panels == 2 ? 2 * RK_NR : nr, ep->act, ep->lo, ep->hi);
      i0 += mr;
    }
    p += panels;
  }
}

/* Computes rows [m_begin, m_end) and column panels [p_begin, p_end) of one product, one block of
 * rk_kc(k) reduction steps at a time: A's strips (packed here unless prepacked) and B's panels
 * (gathered here when B has a packer) for the block, then every strip against every panel. */
static inline __attribute__((always_inline)) void run_block(const gemm_job *job, const rk_gemm *g,
                                                           const float *b_packed, int64_t m_begin, int64_t m_end,
                     int64_t p_begin, int64_t p_end, float *a_pack, float *b_block) {
  int64_t strips = (m_end - m_begin + RK_MR - 1) / RK_MR;
  int64_t step = rk_kc(g->k);
  for (int64_t k0 = 0; k0 < g->k; k0 += step) {
    int64_t kc = g->k - k0 < step ? g->k - k0 : step;
    bool first = k0 == 0, last = k0 + kc == g->k;
    if (g->b_in_place) {
      run_in_place(job, g, m_begin, m_end, p_begin, p_end, k0, kc, first, last);
      continue;
    }
    if (!g->a_packed)
      for (int64_t s = 0; s < strips; s++) {
        int64_t i0 = m_begin + s * RK_MR, mr = m_end - i0 < RK_MR ? m_end - i0 : RK_MR;
        g->pack_a(g->a, i0, mr, k0, kc, a_pack + s * kc * RK_MR);
      }
    if (g->pack_b) g->pack_b(g->b_source, p_begin, p_end - p_begin, k0, kc, b_block);
    /* A panel of B (two, with a two-panel kernel) stays in L1 while the strips of A stream past
     * it from L2. */
    int64_t b_stride = g->pack_b ? kc * RK_NR : g->k * RK_NR;
    for (int64_t p = p_begin; p < p_end; p++) {
      const float *panel = g->pack_b ? b_block + (p - p_begin) * kc * RK_NR : b_packed + (p * g->k + k0) * RK_NR;
      int64_t j0 = p * RK_NR, nr = g->n - j0 < RK_NR ? g->n - j0 : RK_NR;
      /* With the next panel too where the two-panel kernel can take it. */
      bool pair = job->ukernel2 && p + 1 < p_end && nr == RK_NR;
      int64_t nr1 = g->n - j0 - RK_NR < RK_NR ? g->n - j0 - RK_NR : RK_NR;
      /* Two strips a call where the 12-row kernel can write C itself. */
      bool wide = pair && job->ukernel2_wide && nr1 == RK_NR && c_written_by_kernel(g, last);
      int64_t strip_stride = g->a_packed ? g->k * RK_MR : kc * RK_MR;
      for (int64_t s = 0; s < strips; s++) {
        int64_t i0 = m_begin + s * RK_MR, mr = m_end - i0 < RK_MR ? m_end - i0 : RK_MR;
        const float *strip =
            g->a_packed ? g->a_packed + ((i0 / RK_MR) * g->k + k0) * RK_MR : a_pack + s * kc * RK_MR;
        if (wide && s + 1 < strips) {
          int64_t mr1 = m_end - i0 - RK_MR < RK_MR ? m_end - i0 - RK_MR : RK_MR;
          rk_tile_epilogue t = tile_epilogue(&g->ep, first, last, i0, j0);
          float *c = g->c + i0 * g->c_rs + j0;
          job->ukernel2_wide(kc, strip, strip + strip_stride, (int)mr1, panel, b_stride, c, g->c_rs, &t);
          if (last && !rk_kernel_activates(g->ep.act))
            rk_activate_rows(c, g->c_rs, RK_MR + mr1, 2 * RK_NR, g->ep.act, g->ep.lo, g->ep.hi);
          s++;
        } else if (pair) {
          compute_tile2(job, g, kc, strip, panel, b_stride, i0, mr, j0, nr1, first, last);
        } else {
          compute_tile(job, g, kc, strip, panel, i0, mr, j0, nr, first, last);
        }
      }
      if (pair) p++;
    }
  }
}

/* A product of at most RK_STREAM_ROWS rows (a GEMV, a short prefill) reads each weight once:
 * all of A is packed up front, and every panel of B is walked from its first k to its last, so
 * the weights stream from memory in the order they are laid out. */
enum { RK_STREAM_ROWS = 3 * RK_MR };

static inline bool takes_streaming_path(const rk_gemm *g) {
  return g->m <= RK_STREAM_ROWS && !g->pack_b && !g->a_packed;
}

/* Rows [*begin, *end) of strip s when m rows are cut into `strips` strips of nearly equal size:
 * 7 rows as 4 + 3, not 6 + 1, whose 1-row strip would wait on its two chains of adds. The sums of
 * an element do not depend on which rows share its strip. */
static void balanced_strip(int64_t m, int64_t strips, int64_t s, int64_t *begin, int64_t *end) {
  int64_t base = m / strips, extra = m % strips;
  *begin = s * base + (s < extra ? s : extra);
  *end = *begin + base + (s < extra ? 1 : 0);
}

static inline __attribute__((always_inline)) void run_streaming(const gemm_job *job, const rk_gemm *g,
                                                               const float *b_packed, int64_t p_begin, int64_t p_end,
                                                               float *a_pack) {
  int64_t strips = (g->m + RK_MR - 1) / RK_MR, step = rk_kc(g->k);
  for (int64_t s = 0; s < strips; s++) {
    int64_t i0, i1;
    balanced_strip(g->m, strips, s, &i0, &i1);
    for (int64_t k0 = 0; k0 < g->k; k0 += step) {
      int64_t kc = g->k - k0 < step ? g->k - k0 : step;
      g->pack_a(g->a, i0, i1 - i0, k0, kc, a_pack + (s * g->k + k0) * RK_MR);
    }
  }
  int64_t p = p_begin;
  if (g->m == 1) {
    float tiles[4 * RK_NR] __attribute__((aligned(64)));
    for (; p + 4 <= p_end; p += 4)
      for (int64_t k0 = 0; k0 < g->k; k0 += step) {
        int64_t kc = g->k - k0 < step ? g->k - k0 : step;
        job->gemv4(kc, a_pack + k0 * RK_MR, b_packed + (p * g->k + k0) * RK_NR, g->k * RK_NR, tiles);
        for (int q = 0; q < 4; q++) {
          int64_t j0 = (p + q) * RK_NR, nr = g->n - j0 < RK_NR ? g->n - j0 : RK_NR;
          store_tile(g, tiles + q * RK_NR, 0, 1, j0, nr, k0 == 0, k0 + kc == g->k);
        }
      }
  }
  for (; p < p_end; p++) {
    int64_t j0 = p * RK_NR, nr = g->n - j0 < RK_NR ? g->n - j0 : RK_NR;
    for (int64_t k0 = 0; k0 < g->k; k0 += step) {
      int64_t kc = g->k - k0 < step ? g->k - k0 : step;
      const float *panel = b_packed + (p * g->k + k0) * RK_NR;
      for (int64_t s = 0; s < strips; s++) {
        int64_t i0, i1;
        balanced_strip(g->m, strips, s, &i0, &i1);
        compute_tile(job, g, kc, a_pack + (s * g->k + k0) * RK_MR, panel, i0, i1 - i0, j0, nr, k0 == 0,
                     k0 + kc == g->k);
      }
    }
  }
}

/* Column block nb's panels [*begin, *end): n_blocks blocks of nearly equal size, cut between
 * pairs of panels when cut is 2. */
static inline void block_panels(int64_t panels, int64_t n_blocks, int64_t cut, int64_t nb, int64_t *begin,
                                int64_t *end) {
  int64_t whole = (panels + cut - 1) / cut;
  *begin = nb * whole / n_blocks * cut;
  *end = (nb + 1) * whole / n_blocks * cut;
  if (*begin > panels) *begin = panels;
  if (*end > panels) *end = panels;
}

/* The busiest task's work, in pairs of panels, when blocks are cut every `cut` panels: a panel
 * the two-panel kernel cannot pair runs alone at about 0.75 of a pair's time. */
static double slowest_task(const gemm_job *job, int64_t panels, int64_t cut, int tasks) {
  int64_t units = job->count * job->m_blocks * job->n_blocks;
  double slowest = 0.0;
  for (int t = 0; t < tasks; t++) {
    int64_t begin, end;
    rk_split(units, t, tasks, &begin, &end);
    double work = 0.0;
    for (int64_t u = begin; u < end; u++) {
      int64_t nb = (u % (job->m_blocks * job->n_blocks)) / job->m_blocks, p_begin, p_end;
      block_panels(panels, job->n_blocks, cut, nb, &p_begin, &p_end);
      work += (double)((p_end - p_begin) / 2) + 0.75 * (double)((p_end - p_begin) % 2);
    }
    if (work > slowest) slowest = work;
  }
  return slowest;
}

/* Units [begin, end) of the job: blocks of a product's rows and column panels. */
static inline __attribute__((always_inline)) void run_units(const gemm_job *job, int64_t begin, int64_t end,
                                                           float *a_pack, float *b_block) {
  const rk_gemm *g0 = &job->problems[0];
  bool streaming = takes_streaming_path(g0);
  int64_t per_problem = job->m_blocks * job->n_blocks, panels = (g0->n + RK_NR - 1) / RK_NR;
  for (int64_t u = begin; u < end; u++) {
    /* Consecutive units of a task share their column block, so its panels stay in cache. */
    int64_t p = u / per_problem, rest = u % per_problem;
    int64_t nb = rest / job->m_blocks, mb = rest % job->m_blocks;
    const rk_gemm *g = &job->problems[p];
    int64_t p_begin, p_end;
    block_panels(panels, job->n_blocks, job->pair_cut, nb, &p_begin, &p_end);
    if (p_begin >= p_end) continue;
    if (streaming) {
      run_streaming(job, g, job->b_packed[p], p_begin, p_end, a_pack);
    } else {
      int64_t m_begin = mb * job->mc, m_end = m_begin + job->mc < g->m ? m_begin + job->mc : g->m;
      run_block(job, g, job->b_packed[p], m_begin, m_end, p_begin, p_end, a_pack, b_block);
      if (g->finish) g->finish(g, m_begin, m_end, p_begin * RK_NR, p_end * RK_NR < g->n ? p_end * RK_NR : g->n);
    }
  }
}

/* The driver compiled twice, so that its packing and epilogue use AVX2 where the CPU has it. */
static void run_units_generic(const gemm_job *job, int64_t begin, int64_t end, float *a_pack, float *b_block) {
  run_units(job, begin, end, a_pack, b_block);
}

#if defined(__x86_64__)
RK_AVX2_TARGET static void run_units_avx2(const gemm_job *job, int64_t begin, int64_t end, float *a_pack,
                                          float *b_block) {
  run_units(job, begin, end, a_pack, b_block);
}
#endif

static int gemm_task(int task, int num_tasks, void *ctx) {
  const gemm_job *job = ctx;
  int64_t begin, end;
  rk_split(job->count * job->m_blocks * job->n_blocks, task, num_tasks, &begin, &end);
  if (begin == end) return 0;
  const rk_gemm *g0 = &job->problems[0];
  bool streaming = takes_streaming_path(g0);
  int64_t kc_max = rk_kc(g0->k);
  size_t pack_floats = streaming ? (size_t)((g0->m + RK_MR - 1) / RK_MR * RK_MR * g0->k) : (size_t)(RK_MC * kc_max);
  float *a_pack = g0->a_packed ? NULL : rk_scratch(RK_SLOT_A_PACK, sizeof(float) * pack_floats);
  float *b_block =
      g0->pack_b ? rk_scratch(RK_SLOT_B_BLOCK, sizeof(float) * (size_t)(job->panels_per_block * kc_max * RK_NR)) : NULL;
  if ((!g0->a_packed && !a_pack) || (g0->pack_b && !b_block)) return rk_out_of_memory("gemm");
#if defined(__x86_64__)
  if (rk_cpu_isa() == RK_ISA_AVX2) {
    run_units_avx2(job, begin, end, a_pack, b_block);
    return 0;
  }
#endif
  run_units_generic(job, begin, end, a_pack, b_block);
  return 0;
}

/* Whether rk_gemm_run packs this product's B itself, once (a strided matrix). */
static inline bool b_packed_once(const rk_gemm *g) { return !g->b_packed && !g->pack_b && !g->b_in_place; }

typedef struct pack_b_job {
  const rk_gemm *problems;
  int64_t count;
  const float **b_packed; /* where each problem's B goes (those packed here: no b_packed, no pack_b) */
  int64_t panels;
} pack_b_job;

/* Panels [begin, end) of the (problem, panel) pairs whose B is packed here. */
static int pack_b_task(int task, int num_tasks, void *ctx) {
  const pack_b_job *j = ctx;
  int64_t begin, end;
  rk_split(j->count * j->panels, task, num_tasks, &begin, &end);
  for (int64_t u = begin; u < end; u++) {
    int64_t p = u / j->panels, panel = u % j->panels;
    const rk_gemm *g = &j->problems[p];
    if (!b_packed_once(g)) continue;
    rk_pack_b(&g->b, g->k, g->n, panel * RK_NR, 1, (float *)j->b_packed[p] + panel * g->k * RK_NR);
  }
  return 0;
}

/* An A packed whole (see rk_gemm_run) at most this big. */
#define RK_WHOLE_A_BYTES (4.0 * 1024.0 * 1024.0)
enum { RK_WHOLE_A_BLOCK_ROWS = 4 * RK_MC };

typedef struct pack_whole_job {
  const rk_gemm *g;
  float *dst;
  int64_t strips;
} pack_whole_job;

/* Strips [begin, end) of A packed, each all of k long. */
static int pack_whole_task(int task, int num_tasks, void *ctx) {
  const pack_whole_job *j = ctx;
  int64_t begin, end;
  rk_split(j->strips, task, num_tasks, &begin, &end);
  for (int64_t s = begin; s < end; s++) {
    int64_t mr = j->g->m - s * RK_MR < RK_MR ? j->g->m - s * RK_MR : RK_MR;
    j->g->pack_a(j->g->a, s * RK_MR, mr, 0, j->g->k, j->dst + s * j->g->k * RK_MR);
  }
  return 0;
}

int rk_gemm_run(const rk_gemm *problems, int64_t count) {
  if (count <= 0) return 0;
  const rk_gemm *g0 = &problems[0];
  if (g0->m <= 0 || g0->n <= 0) return 0;
  if (g0->k <= 0) {
    /* An empty reduction: every element is the epilogue applied to zero. */
    float zeros[RK_MR * RK_NR] = {0};
    for (int64_t p = 0; p < count; p++)
      for (int64_t i = 0; i < g0->m; i += RK_MR)
        for (int64_t j = 0; j < g0->n; j += RK_NR) {
          int64_t mr = g0->m - i < RK_MR ? g0->m - i : RK_MR, nr = g0->n - j < RK_NR ? g0->n - j : RK_NR;
          store_tile(&problems[p], zeros, i, mr, j, nr, true, true);
        }
    return 0;
  }
  int64_t panels = (g0->n + RK_NR - 1) / RK_NR;
  /* B operands not prepacked are packed once, here, for every block that reads them. */
  const float *packed_inline[1];
  const float **b_packed = count == 1 ? packed_inline : rk_scratch(RK_SLOT_B_INDEX, sizeof(float *) * (size_t)count);
  if (!b_packed) return rk_out_of_memory("gemm");
  size_t pack_floats = (size_t)(panels * g0->k * RK_NR);
  int64_t to_pack = 0;
  for (int64_t p = 0; p < count; p++) to_pack += b_packed_once(&problems[p]) ? 1 : 0;
  float *packs = NULL;
  if (to_pack) {
    packs = rk_scratch(RK_SLOT_B_PACK, sizeof(float) * pack_floats * (size_t)to_pack);
    if (!packs) return rk_out_of_memory("gemm");
  }
  for (int64_t p = 0, i = 0; p < count; p++)
    b_packed[p] = b_packed_once(&problems[p]) ? packs + pack_floats * (size_t)i++ : problems[p].b_packed;
  if (to_pack) {
    /* In parallel over panels: a transposed convolution's B is its whole input (PP-OCR's
     * detector: 96 x 160 x 160 floats), which one thread packing alone held two to 1.27x. */
    pack_b_job pack = {problems, count, b_packed, panels};
    double floats = (double)to_pack * (double)pack_floats;
    rk_parallel(floats < 65536.0 ? 1 : count * panels, pack_b_task, &pack);
  }

  /* A product of at most RK_MC rows not on the streaming path (BERT's 48 rows, a late
   * convolution's 49 pixels) has all of A packed here, once, and shared by every task: packed
   * per block instead, it was packed again for each of the 3 to 8 column blocks. So does a
   * convolution's gathered A up to RK_WHOLE_A_BYTES, its strips gathered in parallel: pixels as
   * rows against many channels were gathered once per column block, a load and a store per
   * value (192x26x26 -> 384 3x3 s2, 169 pixels as rows: 1327 -> 1252 us on one Zen 5 core).
   * And so do rows of activations up to RK_WHOLE_A_BYTES (MiniLM's 128 tokens against 384 to
   * 1536 columns, packed once per column block: 8.6% of the encoder's time, now 3.5%). */
  rk_gemm whole;
  double a_bytes = 4.0 * (double)g0->m * (double)g0->k;
  int64_t block_rows = 0; /* a cap on rows per block, where A was packed here; 0: none */
  if (count == 1 && !g0->a_packed && !takes_streaming_path(g0) &&
      (g0->m <= RK_MC || a_bytes <= RK_WHOLE_A_BYTES)) {
    int64_t strips = (g0->m + RK_MR - 1) / RK_MR;
    float *a_whole = rk_scratch(RK_SLOT_A_WHOLE, sizeof(float) * (size_t)(strips * RK_MR * g0->k));
    if (!a_whole) return rk_out_of_memory("gemm");
    pack_whole_job pack = {g0, a_whole, strips};
    int64_t tasks = a_bytes < 65536.0 ? 1 : strips;
    rk_parallel(tasks, pack_whole_task, &pack);
    /* Rows of activations (a dense layer's tokens): blocks keep at most RK_WHOLE_A_BLOCK_ROWS of
     * them, so that a block's strips stay in L2 while the panels pass. */
    if (!g0->a_gathered && g0->m > RK_MC) block_rows = RK_WHOLE_A_BLOCK_ROWS;
    whole = *g0;
    whole.a_packed = a_whole;
    whole.a_gathered = false;
    problems = g0 = &whole;
  }

  /* Prepacked A needs no packing buffer, so a block may take every row: B's gathered panels are
   * then used by all of them. */
  int64_t mc = g0->a_packed ? (g0->m + RK_MR - 1) / RK_MR * RK_MR : RK_MC;
  if (block_rows && mc > block_rows) mc = block_rows;
  bool streaming = takes_streaming_path(g0);
  rk_isa isa = rk_cpu_isa();
  gemm_job job = {.problems = problems,
                  .count = count,
                  .m_blocks = (g0->m + mc - 1) / mc,
                  .n_blocks = 1,
                  .panels_per_block = panels,
                  .pair_cut = 1,
                  .mc = mc,
                  .b_packed = b_packed,
                  .ukernel = rk_ukernel(isa, streaming),
                  .ukernel_c = rk_ukernel_c(isa, streaming),
                  .ukernel2 = rk_ukernel2(isa),
                  .ukernel2_c = rk_ukernel2_c(isa),
                  .ukernel2_wide = rk_ukernel2_wide_c(isa),
                  .gemv4 = rk_gemv4(isa),
                  .ukernel_rows = rk_ukernel_rows_c(isa),
                  .ukernel_rows_wide = rk_ukernel_rows_wide_c(isa)};
  if (g0->b_in_place && (!job.ukernel_rows || !g0->a_packed))
    return rvm_raise("RuntimeError", "gemm: B read in place needs a prepacked A and a CPU with its kernel");
  double macs = (double)count * (double)g0->m * (double)g0->n * (double)g0->k;
  int64_t threads = macs < RK_PARALLEL_MIN_MACS ? 1 : rk_max_threads();
  /* Blocks of at most RK_NC_PANELS panels, sizes within one panel of each other. With several
   * threads, enough blocks for four each and a multiple of the thread count, so that the static
   * split gives every thread the same number of panels (13 panels on 2 threads: 6 and 7, not
   * 8 and 5); one thread takes every panel in one block, so that A is read once. */
  int64_t n_blocks = (panels + RK_NC_PANELS - 1) / RK_NC_PANELS;
  if (threads > 1 && count < threads && g0->a_packed && (g0->pack_b || g0->b_in_place) && g0->m > g0->n) {
    /* Fewer pixels than weight rows (ResNet's last stage: 49 pixels, 2.4 MB of weights): the
     * threads split the rows, so that each reads its share of the weights once, and each gathers
     * all the pixels (splitting the panels instead read the weights once per block from memory:
     * 0.65x of one thread's time, not 0.5x; 256x14x14 -> 256 1x1 cut its 13 panels into blocks
     * of one or two, each reading all the weights: 1.62x faster than one thread, not 1.9x). */
    int64_t strips = (g0->m + RK_MR - 1) / RK_MR, m_blocks = threads < strips ? threads : strips;
    job.mc = (strips + m_blocks - 1) / m_blocks * RK_MR;
    job.m_blocks = (g0->m + job.mc - 1) / job.mc;
  } else if (threads > 1 && g0->a_gathered && job.m_blocks == 1) {
    /* A gathered per block and not packed once above (a batch of images, or more than RK_MC
     * pixels): every block gathers all of it again, so one block per thread, no more (ResNet's
     * last stage with channels as columns, 2 threads, before A was packed once: 0.69x of one
     * thread's time with 8 blocks). */
    n_blocks = (threads + count - 1) / count;
    while ((count * n_blocks) % threads != 0 && n_blocks < panels) n_blocks++;
    if (n_blocks > panels) n_blocks = panels;
  } else if (threads > 1) {
    int64_t per_n_block = count * job.m_blocks;
    /* B read in place: as few blocks as the threads need, as each reads all of A again (YOLO at 2
     * threads: 2% faster than with four blocks a thread). */
    int64_t enough = g0->b_in_place ? threads : 4 * threads;
    if (per_n_block * n_blocks < enough) n_blocks = (enough + per_n_block - 1) / per_n_block;
    while ((per_n_block * n_blocks) % threads != 0 && n_blocks < panels) n_blocks++;
    if (n_blocks > panels) n_blocks = panels;
  }
  job.n_blocks = n_blocks;
  int64_t units = count * job.m_blocks * job.n_blocks;
  int tasks = (int)(threads < units ? threads : units);
  if (job.ukernel2 && n_blocks > 1 && n_blocks <= (panels + 1) / 2 &&
      slowest_task(&job, panels, 2, tasks) <= slowest_task(&job, panels, 1, tasks))
    job.pair_cut = 2;
  job.panels_per_block = 0;
  for (int64_t nb = 0; nb < n_blocks; nb++) {
    int64_t p_begin, p_end;
    block_panels(panels, n_blocks, job.pair_cut, nb, &p_begin, &p_end);
    if (p_end - p_begin > job.panels_per_block) job.panels_per_block = p_end - p_begin;
  }
  return rk_parallel(tasks, gemm_task, &job);
}
