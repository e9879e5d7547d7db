/*
 * quant.h: what the quantized kernels' files share: GGUF's block formats, the activations
 * quantized to int8 that the integer dot products read, and the per-instruction-set table of
 * row dot products (quant.c holds the portable ones, quant_x86.c the AVX2 and VNNI ones).
 *
 * A weight matrix [n, k] is n rows of k values in one of GGUF's formats, used in place as the
 * file holds it: f32 and f16 rows of k values; q8_0 and q4_0 rows of k/32 blocks; q4_K and q6_K
 * rows of k/256 super-blocks (llama.cpp's ggml-common.h defines the layouts; each dot product
 * below says what it reads).
 */
#ifndef RK_QUANT_H
#define RK_QUANT_H

#include "rk.h"

/* RK_Q_Q4_0X8, RK_Q_Q4_KX8 and RK_Q_Q8_0X8 are q4_0, q4_K and q8_0 regrouped eight rows at a
 * time (runtime-shim/src/gguf.h says how), the forms the weights loader makes for a parameter
 * named "X#q4_0x8", "X#q4_Kx8" or "X#q8_0x8". */
typedef enum {
  RK_Q_F32 = 0,
  RK_Q_F16,
  RK_Q_Q8_0,
  RK_Q_Q4_0,
  RK_Q_Q4_K,
  RK_Q_Q6_K,
  RK_Q_Q4_0X8,
  RK_Q_Q4_KX8,
  RK_Q_Q8_0X8,
  RK_Q_Q4_1, /* the blocks llama.cpp's quantizer falls back to where rows are not whole K blocks */
  RK_Q_Q5_0,
  RK_Q_Q5_1,
  RK_Q_COUNT
} rk_qformat;

/* Whether a format is regrouped eight rows at a time. */
static inline bool rk_qformat_x8(rk_qformat f) { return f == RK_Q_Q4_0X8 || f == RK_Q_Q4_KX8 || f == RK_Q_Q8_0X8; }

/* A format's name (as GGUF's tools spell it), values per block and bytes per block. */
typedef struct rk_qinfo {
  const char *name;
  int64_t block, bytes;
  /* Activations for this format: quantized with one scale per act_block values (0: float32). */
  int64_t act_block;
} rk_qinfo;
RVM_HIDDEN const rk_qinfo *rk_qformat_info(rk_qformat f);

/* A row of activations quantized for the integer dot products: q[k] int8 values, one float
 * scale per `block` values (x ~ d * q), and the sum of each 16 values of q (for the formats whose
 * values carry an offset: q4_K's minimums, q6_K's 32). */
typedef struct rk_qact {
  const int8_t *q;
  const float *d;
  const int16_t *sum16;
} rk_qact;

/* Quantizes k values of x (k a multiple of `block`, 32 or 256) into q, d and sum16. */
RVM_HIDDEN void rk_quantize_row(const float *x, int64_t k, int64_t block, int8_t *q, float *d, int16_t *sum16);

/* One weight row (`w`, k values in its format) times one row of activations: float32 x for f32
 * and f16, quantized for the others. Every function sums in an order fixed by k alone. */
typedef float (*rk_qdot_fn)(const void *w, const float *x, const rk_qact *a, int64_t k);

/* Several rows of activations: row r's floats at x + r * k, its quantized form (when the format
 * has one) at q + r * k, d + r * (k / act_block) and sum16 + r * (k / 16).
 * Rows below paired_rows are summed as llama.cpp sums the rows it takes four at a time (m - m % 4
 * of a call's m rows; the others one by one): for q4_Kx8 one float multiply-add per 64 values
 * instead of per 256, so that both give the same bits (their activations are quantized alike). Other
 * formats sum every row alike. */
typedef struct rk_qrows {
  const float *x;
  const int8_t *q;
  const float *d;
  const int16_t *sum16;
  int64_t k, act_block, paired_rows;
} rk_qrows;

/* A tile of outputs: out[r * out_stride + c] = row c of w (rows <= 4, row_bytes apart) times
 * activation row r0 + r (any number of rows), each summed exactly as the format's dot product sums it
 * alone, so that tiling never changes a bit. NULL where an instruction set has none (the rows
 * then go through `dot` one by one). */
typedef void (*rk_qtile_fn)(const uint8_t *w, int64_t row_bytes, int rows, const rk_qrows *a, int64_t r0, int xrows,
                            float *out, int64_t out_stride);

/* Eight weight rows regrouped (`group` holds rows 8g..8g+7) against up to 4 activation rows:
 * out[r * out_stride + c] for c < 8. */
typedef void (*rk_qtile8_fn)(const uint8_t *group, const rk_qrows *a, int64_t r0, int xrows, float *out, int64_t out_stride);

/* Sixteen rows of a regrouped format (two groups, group_bytes apart) against activation rows
 * [r0, r0 + xrows): the bits of two rk_qtile8_fn calls. */
typedef void (*rk_qtile16_fn)(const uint8_t *group, int64_t group_bytes, const rk_qrows *a, int64_t r0, int xrows,
                              float *out, int64_t out_stride);

/* Many weight rows (row_bytes apart, one after another in memory) against one activation row x:
 * out[c] = row c of w times x for c < rows, each summed exactly as the format's tile sums it. */
typedef void (*rk_qstream_fn)(const uint8_t *w, int64_t row_bytes, int64_t rows, const float *x, int64_t k, float *out);

/* The dot products of one instruction set, one per format, and its tiles. */
typedef struct rk_qdots {
  rk_qdot_fn dot[RK_Q_COUNT];
  rk_qtile_fn tile[RK_Q_COUNT];
  rk_qtile8_fn tile8[RK_Q_COUNT]; /* the regrouped formats' */
  rk_qtile16_fn tile16[RK_Q_COUNT]; /* and 16 of their rows at once, where an instruction set has it */
  /* Decoding's rows in one pass (a single stream, no tile between rows), where it measured faster
   * than tiles; NULL elsewhere. */
  rk_qstream_fn stream[RK_Q_COUNT];
  /* Decoding with a tile of this many rows taken from as many far-apart parts of a task's rows
   * (at most 4), so that each of them is one long sequential stream; 0 where a tile's rows are
   * neighbours. Rows are summed alone, so this changes no bit. */
  uint8_t decode_parts[RK_Q_COUNT];
} rk_qdots;

/* The portable dot products. */
RVM_HIDDEN const rk_qdots *rk_qdots_portable(void);
#if defined(__aarch64__)
/* The regrouped formats' tiles with NEON (quant_neon.c): the portable tiles' bits, faster. */
RVM_HIDDEN void rk_neon_tile8_q4_0x8(const uint8_t *group, const rk_qrows *a, int64_t r0, int xrows, float *out,
                                     int64_t out_stride);
RVM_HIDDEN void rk_neon_tile8_q8_0x8(const uint8_t *group, const rk_qrows *a, int64_t r0, int xrows, float *out,
                                     int64_t out_stride);
RVM_HIDDEN void rk_neon_tile8_q4_Kx8(const uint8_t *group, const rk_qrows *a, int64_t r0, int xrows, float *out,
                                     int64_t out_stride);
/* q6_K's dot product with NEON: the portable one's bits. */
RVM_HIDDEN float rk_neon_dot_q6_K(const void *w, const float *x, const rk_qact *a, int64_t k);
#endif
#if defined(__x86_64__)
/* AVX2 + FMA + F16C, and the same with AVX-512 VNNI's dpbusd where the CPU has it. */
RVM_HIDDEN const rk_qdots *rk_qdots_avx2(void);
RVM_HIDDEN const rk_qdots *rk_qdots_vnni(void);
#endif

/* IEEE half to float. */
static inline float rk_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else { /* subnormal: normalize */
    exp = 113;
    while (!(mant & 0x400)) {
      mant <<= 1;
      exp--;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
  }
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
}

static inline float rk_load_f16(const uint8_t *p) { return rk_f16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }

/* q4_K's 6-bit scale and minimum of sub-block j (0..7) from its 12 packed bytes. */
static inline void rk_q4k_scale_min(int j, const uint8_t *s, int *scale, int *min) {
  if (j < 4) {
    *scale = s[j] & 63;
    *min = s[j + 4] & 63;
  } else {
    *scale = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
    *min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

/* All of q4_K's scales and minimums at once: out[0..7] the scales, out[8..15] the minimums
 * (the same values rk_q4k_scale_min gives, unpacked with 32-bit masks as llama.cpp does). */
static inline void rk_q4k_scales_mins(const uint8_t *s, uint8_t out[16]) {
  uint32_t u[4];
  __builtin_memcpy(u, s, 12);
  const uint32_t six = 0x3f3f3f3fu, nibble = 0x0f0f0f0fu, two = 0x03030303u;
  u[3] = ((u[2] >> 4) & nibble) | (((u[1] >> 6) & two) << 4);
  uint32_t mins_low = u[1] & six;
  u[1] = (u[2] & nibble) | (((u[0] >> 6) & two) << 4);
  u[2] = mins_low;
  u[0] &= six;
  __builtin_memcpy(out, u, 16);
}

#endif /* RK_QUANT_H */
