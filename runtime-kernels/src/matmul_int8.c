/*
 * matmul_int8.c: relaxc.matmul_int8, ONNX's MatMulInteger (and the integer core of QLinearMatMul
 * and of QDQ matmuls) against constant weights: out[r][n] = sum over k of (a[r][k] - a_zp) *
 * c[k][n], exactly in int32, where c = B - b_zero_point is what relaxc.tvm read from the model.
 *
 * The products run as unsigned-by-signed bytes, the form of x86's VPDPBUSD: relaxc.tvm stores
 * each column of c as signed bytes b[k][n] = c[k][n] - d[n] (d[n] chosen per column so that they
 * fit) and the kernel adds the rest back: sum (a - a_zp) c = sum a b + d[n] sum a - a_zp sum c.
 * Signed activations are read as unsigned by flipping their top bit (a + 128, and a_zp + 128).
 * Every sum is exact, so every instruction set gives the same integers (ONNX Runtime's), at any
 * thread count.
 *
 * Weights come packed as [ceil(n/16)][ceil(k/4)][16][4]: for each panel of 16 columns, four
 * consecutive reduction steps of every column side by side, zero past k and n. One 64-byte
 * group is one 512-bit VPDPBUSD operand (AVX-512 VNNI: 4 rows by 4 panels of accumulators); AVX2
 * widens it to 16-bit pairs for VPMADDWD (no 8-bit pair sum that could saturate); aarch64's SDOT
 * reads a group as four 4-column operands; the portable loop reads the same layout.
 */
#define _GNU_SOURCE /* syscall(), for AMX's permission */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "rk.h"

enum {
  PANEL = 16,         /* columns per packed panel */
  GROUP = 4,          /* reduction steps per packed group */
  ROWS_PER_UNIT = 32, /* rows of one unit of parallel work */
  PANELS_PER_UNIT = 4 /* panels of one unit of parallel work */
};

/* One call's operands, seen as a [rows][k] by [k][n] product. */
typedef struct int8_job {
  const uint8_t *a;        /* rows of `stride` bytes: a's (flipped if signed), zero past k */
  int64_t stride;          /* ceil(k/4) * 4 */
  int64_t rows, k, n;      /* the product's sizes */
  const int8_t *b;         /* packed weights */
  int64_t panel_bytes;     /* bytes of one packed panel: ceil(k/4) * 64 */
  const int32_t *d, *csum; /* per column: the offset taken out of c, and the sum of c over k */
  int32_t a_zp;            /* the activations' zero point, as unsigned (flipped) bytes */
  const int32_t *row_sums; /* per row: the sum of its (flipped) bytes */
  int32_t *out;            /* [rows][n] int32, or NULL when out_f32 takes the results */
  float *out_f32;          /* [rows][n]: float(sum) * scale + bias, as ONNX Runtime's quantizer follows it */
  const float *scale;      /* 1 or n values (scale_step 0 or 1) */
  int64_t scale_step;
  const float *bias;       /* n values, or NULL */
  const int8_t *amx_last_panel; /* AMX: the last panel padded to whole tiles of groups */
} int8_job;

/* Bytes 4g..4g+3 of a row as one word. */
static inline uint32_t group_word(const uint8_t *row, int64_t g) {
  uint32_t w;
  memcpy(&w, row + g * GROUP, sizeof w);
  return w;
}

/* The sums of a tile written out: acc + d * row_sum - a_zp * csum, columns n0..n0+count. */
static inline void finish(const int8_job *j, int64_t r, int64_t n0, int64_t count, const int32_t *acc) {
  int32_t rs = j->row_sums[r];
  for (int64_t c = 0; c < count; c++) {
    int32_t v = acc[c] + j->d[n0 + c] * rs - j->a_zp * j->csum[n0 + c];
    if (!j->out_f32) {
      j->out[r * j->n + n0 + c] = v;
      continue;
    }
    float f = (float)v * j->scale[(n0 + c) * j->scale_step];
    j->out_f32[r * j->n + n0 + c] = j->bias ? f + j->bias[n0 + c] : f;
  }
}

/* ---- portable ------------------------------------------------------------------------------ */

static void tile_portable(const int8_job *j, int64_t r0, int64_t mr, int64_t p0, int64_t np) {
  int64_t groups = (j->k + GROUP - 1) / GROUP;
  for (int64_t r = r0; r < r0 + mr; r++) {
    const uint8_t *row = j->a + r * j->stride;
    for (int64_t p = p0; p < p0 + np; p++) {
      int32_t acc[PANEL] = {0};
      const int8_t *panel = j->b + p * j->panel_bytes;
      for (int64_t g = 0; g < groups; g++) {
        uint32_t w = group_word(row, g);
        const int8_t *bg = panel + g * PANEL * GROUP;
        for (int c = 0; c < PANEL; c++)
          for (int i = 0; i < GROUP; i++) acc[c] += (int32_t)((w >> (8 * i)) & 0xff) * bg[c * GROUP + i];
      }
      int64_t n0 = p * PANEL, count = j->n - n0 < PANEL ? j->n - n0 : PANEL;
      finish(j, r, n0, count, acc);
    }
  }
}

#if defined(__x86_64__)
#include <immintrin.h>

/* ---- AVX2: 16-bit pairs -------------------------------------------------------------------- */

/* Four rows by half a panel (8 columns): each group's 32 bytes widened to two registers of
 * 16-bit values (columns 0-3 and 4-7, four steps each), a row's four bytes broadcast as 16-bit
 * values, VPMADDWD summing pairs of steps; the pairs are added at the end. */
static inline __attribute__((always_inline, target("avx2"))) void tile_avx2_body(const int8_job *j, int64_t r0,
                                                                                   int mr, int64_t p, int half) {
  __m256i acc[4][2];
  for (int r = 0; r < 4; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
  const uint8_t *rows[4];
  for (int r = 0; r < 4; r++) rows[r] = j->a + (r0 + (r < mr ? r : 0)) * j->stride;
  const int8_t *panel = j->b + p * j->panel_bytes + half * 32;
  int64_t groups = j->stride / GROUP;
  for (int64_t g = 0; g < groups; g++) {
    __m256i bytes = _mm256_loadu_si256((const __m256i *)(panel + g * PANEL * GROUP));
    __m256i b0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(bytes));
    __m256i b1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(bytes, 1));
    for (int r = 0; r < mr; r++) {
      uint32_t w = group_word(rows[r], g);
      __m256i av = _mm256_broadcastq_epi64(_mm_cvtepu8_epi16(_mm_cvtsi32_si128((int)w)));
      acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(av, b0));
      acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(av, b1));
    }
  }
  int64_t n0 = p * PANEL + half * 8, count = j->n - n0 < 8 ? j->n - n0 : 8;
  for (int r = 0; r < mr; r++) {
    /* lane sums: [c0 c1 c4 c5 | c2 c3 c6 c7], reordered to c0..c7 */
    __m256i sums = _mm256_permute4x64_epi64(_mm256_hadd_epi32(acc[r][0], acc[r][1]), 0xd8);
    int32_t tile[8];
    _mm256_storeu_si256((__m256i *)tile, sums);
    finish(j, r0 + r, n0, count, tile);
  }
}

__attribute__((target("avx2"))) static void tile_avx2(const int8_job *j, int64_t r0, int64_t mr, int64_t p0,
                                                     int64_t np) {
  for (int64_t p = p0; p < p0 + np; p++)
    for (int half = 0; half < 2 && p * PANEL + half * 8 < j->n; half++)
      for (int64_t r = r0; r < r0 + mr; r += 4) {
        int64_t left = r0 + mr - r;
        switch (left >= 4 ? 4 : left) {
          case 4: tile_avx2_body(j, r, 4, p, half); break;
          case 3: tile_avx2_body(j, r, 3, p, half); break;
          case 2: tile_avx2_body(j, r, 2, p, half); break;
          default: tile_avx2_body(j, r, 1, p, half); break;
        }
      }
}

/* ---- AVX-512 VNNI: VPDPBUSD ---------------------------------------------------------------- */

#define VNNI_TARGET "avx2,avx512f,avx512bw,avx512vl,avx512vnni"

/* acc + the 4-byte dot products of a (unsigned) and b (signed), lane by lane. Written as the
 * instruction: GCC 12 keeps _mm512_dpbusd_epi32's accumulators in other registers than its
 * result and copies them around every step (half the kernel's speed). */
static inline __attribute__((always_inline, target(VNNI_TARGET))) __m512i dpbusd(__m512i acc, __m512i a, __m512i b) {
  __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

/* finish() on one row's sums against one panel, 16 lanes at once (the same integer and float
 * operations, so the same results). */
static inline __attribute__((always_inline, target(VNNI_TARGET))) void finish16(const int8_job *j, int64_t r, int64_t p,
                                                                                __m512i acc) {
  int64_t n0 = p * PANEL, count = j->n - n0 < PANEL ? j->n - n0 : PANEL;
  __mmask16 m = (__mmask16)((1u << count) - 1);
  __m512i rs = _mm512_set1_epi32(j->row_sums[r]), zp = _mm512_set1_epi32(j->a_zp);
  __m512i d = _mm512_maskz_loadu_epi32(m, j->d + n0), cs = _mm512_maskz_loadu_epi32(m, j->csum + n0);
  __m512i v = _mm512_sub_epi32(_mm512_add_epi32(acc, _mm512_mullo_epi32(d, rs)), _mm512_mullo_epi32(zp, cs));
  if (!j->out_f32) {
    _mm512_mask_storeu_epi32(j->out + r * j->n + n0, m, v);
    return;
  }
  __m512 scale = j->scale_step ? _mm512_maskz_loadu_ps(m, j->scale + n0) : _mm512_set1_ps(j->scale[0]);
  __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(v), scale);
  if (j->bias) f = _mm512_add_ps(f, _mm512_maskz_loadu_ps(m, j->bias + n0));
  _mm512_mask_storeu_ps(j->out_f32 + r * j->n + n0, m, f);
}

/* Up to four rows by up to four panels: sixteen 512-bit accumulators, each group one load per
 * panel and one broadcast per row. */
static inline __attribute__((always_inline, target(VNNI_TARGET))) void tile_vnni_body(const int8_job *j, int64_t r0,
                                                                                      int mr, int64_t p0, int np) {
  __m512i acc[4][4];
  for (int r = 0; r < 4; r++)
    for (int q = 0; q < 4; q++) acc[r][q] = _mm512_setzero_si512();
  const uint8_t *rows[4];
  for (int r = 0; r < 4; r++) rows[r] = j->a + (r0 + (r < mr ? r : 0)) * j->stride;
  const int8_t *panel = j->b + p0 * j->panel_bytes;
  int64_t groups = j->stride / GROUP;
  for (int64_t g = 0; g < groups; g++) {
    __m512i bv[4];
    for (int q = 0; q < np; q++) bv[q] = _mm512_loadu_si512(panel + q * j->panel_bytes + g * PANEL * GROUP);
    for (int r = 0; r < mr; r++) {
      __m512i av = _mm512_set1_epi32((int)group_word(rows[r], g));
      for (int q = 0; q < np; q++) acc[r][q] = dpbusd(acc[r][q], av, bv[q]);
    }
  }
  for (int r = 0; r < mr; r++)
    for (int q = 0; q < np; q++) finish16(j, r0 + r, p0 + q, acc[r][q]);
}

#define VNNI_ROWS(R)                                    \
  case R:                                               \
    switch (cols) {                                     \
      case 4: tile_vnni_body(j, r, R, p, 4); break;     \
      case 3: tile_vnni_body(j, r, R, p, 3); break;     \
      case 2: tile_vnni_body(j, r, R, p, 2); break;     \
      default: tile_vnni_body(j, r, R, p, 1); break;    \
    }                                                   \
    break;

__attribute__((target(VNNI_TARGET))) static void tile_vnni(const int8_job *j, int64_t r0, int64_t mr, int64_t p0,
                                                           int64_t np) {
  for (int64_t p = p0; p < p0 + np; p += 4) {
    int cols = (int)(p0 + np - p < 4 ? p0 + np - p : 4);
    for (int64_t r = r0; r < r0 + mr; r += 4) {
      switch (r0 + mr - r < 4 ? r0 + mr - r : 4) {
        VNNI_ROWS(4)
        VNNI_ROWS(3)
        VNNI_ROWS(2)
        VNNI_ROWS(1)
      }
    }
  }
}
#undef VNNI_ROWS

/* ---- AMX-INT8: TDPBUSD on tiles ---------------------------------------------------------------- */

/* A tile holds 16 rows of 64 bytes. TDPBUSD's second operand is 16 rows of one group each (four
 * reduction steps of 16 columns, 64 bytes): exactly a packed panel's layout, so a panel's groups
 * g..g+15 are one tile read in place. Its first operand is 16 activation rows of 64 steps; the
 * activations' copy is padded to whole 64-step blocks (zeros) and to whole 16-row tiles for this
 * path, so every tile read stays inside it, and a block of weights that runs past a panel's
 * groups (into the next panel, or into the last panel's padded copy) meets zeros. */
enum { AMX_ROWS = 16, AMX_BLOCK = 64 /* reduction steps (bytes) of one tile row */ };

#define AMX_TARGET "amx-tile,amx-int8,avx2,avx512f,avx512bw,avx512vl,avx512vnni"

/* LDTILECFG's 64 bytes: palette 1, then per tile its bytes per row and its rows. */
typedef struct amx_config {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} amx_config;

/* Tiles 0-3 the sums (rows 0-15 and 16-31 by panels 0 and 1), 4-5 the activations, 6-7 the
 * weights: all 16 rows of 64 bytes. */
__attribute__((target(AMX_TARGET))) static void amx_configure(void) {
  amx_config c;
  memset(&c, 0, sizeof c);
  c.palette = 1;
  for (int t = 0; t < 8; t++) c.colsb[t] = 64, c.rows[t] = AMX_ROWS;
  _tile_loadconfig(&c);
}

/* The sums of rows [r0, r0 + mr) (mr <= 32) by panels p and p + 1 (or p alone) of `b`, written out
 * through finish(), the last panel read from its padded copy. Written once over four tile
 * operations (ZERO(t), LOAD(t, p, stride), DPBUSD(c, a, b), STORE(t, p, stride)) and FINISH(j,
 * row, panel, sums): the instructions, and an emulation in C that runs the same indexing on any CPU
 * (tests). */
#define AMX_BLOCK_BODY(ZERO, LOAD, DPBUSD, STORE, FINISH)                                                          \
  {                                                                                                         \
    int64_t panels = (j->n + PANEL - 1) / PANEL;                                                            \
    const int8_t *b0 = p == panels - 1 ? j->amx_last_panel : j->b + p * j->panel_bytes;                     \
    const int8_t *b1 = !two ? b0 : (p + 1 == panels - 1 ? j->amx_last_panel : j->b + (p + 1) * j->panel_bytes); \
    const uint8_t *a0 = j->a + r0 * j->stride, *a1 = a0 + AMX_ROWS * j->stride;                             \
    ZERO(0);                                                                                                \
    ZERO(1);                                                                                                \
    ZERO(2);                                                                                                \
    ZERO(3);                                                                                                \
    for (int64_t k0 = 0; k0 < j->stride; k0 += AMX_BLOCK) {                                                 \
      LOAD(4, a0 + k0, j->stride);                                                                          \
      LOAD(5, a1 + k0, j->stride);                                                                          \
      LOAD(6, b0 + k0 / GROUP * PANEL * GROUP, PANEL * GROUP);                                              \
      LOAD(7, b1 + k0 / GROUP * PANEL * GROUP, PANEL * GROUP);                                              \
      DPBUSD(0, 4, 6);                                                                                      \
      DPBUSD(1, 4, 7);                                                                                      \
      DPBUSD(2, 5, 6);                                                                                      \
      DPBUSD(3, 5, 7);                                                                                      \
    }                                                                                                       \
    int32_t sums[4][AMX_ROWS * PANEL] __attribute__((aligned(64)));                                         \
    STORE(0, sums[0], PANEL * 4);                                                                           \
    STORE(1, sums[1], PANEL * 4);                                                                           \
    STORE(2, sums[2], PANEL * 4);                                                                           \
    STORE(3, sums[3], PANEL * 4);                                                                           \
    for (int64_t r = 0; r < mr; r++)                                                                        \
      for (int q = 0; q < (two ? 2 : 1); q++)                                                               \
        FINISH(j, r0 + r, p + q, sums[(r >= AMX_ROWS ? 2 : 0) + q] + (r % AMX_ROWS) * PANEL);               \
  }

#define AMX_FINISH(j, r, p, sums) finish16(j, r, p, _mm512_load_si512(sums))
#define EMULATED_FINISH(j, r, p, sums) \
  finish(j, r, (p) * PANEL, (j)->n - (p) * PANEL < PANEL ? (j)->n - (p) * PANEL : PANEL, sums)

__attribute__((target(AMX_TARGET))) static void amx_block(const int8_job *j, int64_t r0, int64_t mr, int64_t p,
                                                         bool two)
    AMX_BLOCK_BODY(_tile_zero, _tile_loadd, _tile_dpbusd, _tile_stored, AMX_FINISH)

/* The eight tiles in memory, and the four operations on them as the instructions define them. */
typedef struct amx_tiles {
  uint8_t bytes[8][AMX_ROWS][64];
} amx_tiles;

static void emulated_load(amx_tiles *t, int tile, const void *from, int64_t stride) {
  for (int r = 0; r < AMX_ROWS; r++) memcpy(t->bytes[tile][r], (const uint8_t *)from + r * stride, 64);
}
static void emulated_store(const amx_tiles *t, int tile, void *to, int64_t stride) {
  for (int r = 0; r < AMX_ROWS; r++) memcpy((uint8_t *)to + r * stride, t->bytes[tile][r], 64);
}
/* c[m][n] += sum over groups g and i < 4 of unsigned a[m][4g + i] times signed b[g][4n + i]. */
static void emulated_dpbusd(amx_tiles *t, int c, int a, int b) {
  for (int m = 0; m < AMX_ROWS; m++)
    for (int n = 0; n < 16; n++) {
      int32_t acc;
      memcpy(&acc, t->bytes[c][m] + 4 * n, 4);
      for (int g = 0; g < 16; g++)
        for (int i = 0; i < 4; i++) acc += (int32_t)t->bytes[a][m][4 * g + i] * (int8_t)t->bytes[b][g][4 * n + i];
      memcpy(t->bytes[c][m] + 4 * n, &acc, 4);
    }
}
#define EMULATED_ZERO(tile) memset(tiles.bytes[tile], 0, sizeof tiles.bytes[tile])
#define EMULATED_LOAD(tile, from, stride) emulated_load(&tiles, tile, from, stride)
#define EMULATED_DPBUSD(c, a, b) emulated_dpbusd(&tiles, c, a, b)
#define EMULATED_STORE(tile, to, stride) emulated_store(&tiles, tile, to, stride)

static void amx_block_emulated(const int8_job *j, int64_t r0, int64_t mr, int64_t p, bool two) {
  amx_tiles tiles;
  AMX_BLOCK_BODY(EMULATED_ZERO, EMULATED_LOAD, EMULATED_DPBUSD, EMULATED_STORE, EMULATED_FINISH)
}

/* Blocks of 32 rows by two panels over a unit, the tiles configured for this thread first. */
__attribute__((target(AMX_TARGET))) static void tile_amx(const int8_job *j, int64_t r0, int64_t mr, int64_t p0,
                                                        int64_t np) {
  amx_configure();
  for (int64_t p = p0; p < p0 + np; p += 2)
    for (int64_t r = r0; r < r0 + mr; r += 2 * AMX_ROWS)
      amx_block(j, r, r0 + mr - r < 2 * AMX_ROWS ? r0 + mr - r : 2 * AMX_ROWS, p, p + 1 < p0 + np);
  _tile_release();
}

/* The same on emulated tiles: RELAXC_QUANT_ISA=amx-emulated, for tests of the layout on any CPU
 * (slow). */
static void tile_amx_emulated(const int8_job *j, int64_t r0, int64_t mr, int64_t p0, int64_t np) {
  for (int64_t p = p0; p < p0 + np; p += 2)
    for (int64_t r = r0; r < r0 + mr; r += 2 * AMX_ROWS)
      amx_block_emulated(j, r, r0 + mr - r < 2 * AMX_ROWS ? r0 + mr - r : 2 * AMX_ROWS, p, p + 1 < p0 + np);
}

/* Whether Linux lets this process use the tiles (AMX state is off until asked for, per process). */
static bool amx_permitted(void) {
  __builtin_cpu_init();
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  if (!(edx & (1u << 24)) || !(edx & (1u << 25))) return false; /* AMX-TILE, AMX-INT8 */
  enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
  if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return false;
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & (3u << 17)) == (3u << 17); /* XTILECFG and XTILEDATA enabled by the OS */
}
#endif

#if defined(__aarch64__)
#include <arm_neon.h>
#include <sys/auxv.h>

/* ---- aarch64: SDOT ----------------------------------------------------------------------------- */

/* SDOT multiplies signed bytes by signed bytes, so the (unsigned) activations are read as a - 128
 * (their top bit flipped) and 128 times each column's sum of weight bytes is added back: sum a b
 * = sum (a - 128) b + 128 sum b, with sum b = csum - k d (b = c - d over k steps, zero past k).
 * Four rows by one panel: sixteen 4-lane sums, each group one 64-byte load and a word per row. */
/* The dot products are an ARMv8.2 extension, enabled for this function only (the CPU is asked
 * first). Clang before 17 declares vdotq_s32 only when the whole file is built for it, so there
 * its builtin is called (34: the signed 32-bit form, as its arm_neon.h passes it). */
#if defined(__clang__)
#define DOTPROD_TARGET __attribute__((target("dotprod")))
#define SDOT(acc, b, a) ((int32x4_t)__builtin_neon_vdotq_v((int8x16_t)(acc), (b), (a), 34))
#else
#define DOTPROD_TARGET __attribute__((target("arch=armv8.2-a+dotprod")))
#define SDOT(acc, b, a) vdotq_s32((acc), (b), (a))
#endif

DOTPROD_TARGET static void tile_neon(const int8_job *j, int64_t r0, int64_t mr, int64_t p0,
                                                          int64_t np) {
  int64_t groups = j->stride / GROUP;
  uint8x16_t flip = vdupq_n_u8(0x80);
  for (int64_t p = p0; p < p0 + np; p++) {
    const int8_t *panel = j->b + p * j->panel_bytes;
    int64_t n0 = p * PANEL, count = j->n - n0 < PANEL ? j->n - n0 : PANEL;
    int32_t back[PANEL] = {0};
    for (int64_t c = 0; c < count; c++) back[c] = 128 * (j->csum[n0 + c] - (int32_t)j->k * j->d[n0 + c]);
    for (int64_t r = r0; r < r0 + mr; r += 4) {
      int rows = r0 + mr - r < 4 ? (int)(r0 + mr - r) : 4;
      int32x4_t acc[4][4];
      for (int i = 0; i < 4; i++)
        for (int q = 0; q < 4; q++) acc[i][q] = vdupq_n_s32(0);
      for (int64_t g = 0; g < groups; g++) {
        const int8_t *bg = panel + g * PANEL * GROUP;
        int8x16_t b[4] = {vld1q_s8(bg), vld1q_s8(bg + 16), vld1q_s8(bg + 32), vld1q_s8(bg + 48)};
        for (int i = 0; i < rows; i++) {
          uint32x4_t word = vdupq_n_u32(group_word(j->a + (r + i) * j->stride, g));
          int8x16_t a = vreinterpretq_s8_u8(veorq_u8(vreinterpretq_u8_u32(word), flip));
          for (int q = 0; q < 4; q++) acc[i][q] = SDOT(acc[i][q], b[q], a);
        }
      }
      for (int i = 0; i < rows; i++) {
        int32_t sums[PANEL];
        for (int q = 0; q < 4; q++) vst1q_s32(sums + 4 * q, acc[i][q]);
        for (int c = 0; c < PANEL; c++) sums[c] += back[c];
        finish(j, r + i, n0, count, sums);
      }
    }
  }
}

static bool cpu_has_dotprod(void) {
  enum { HWCAP_DOTPROD = 1 << 20 }; /* HWCAP_ASIMDDP */
  return (getauxval(AT_HWCAP) & HWCAP_DOTPROD) != 0;
}
#endif

/* ---- the choice and the call ----------------------------------------------------------------- */

typedef void (*tile_fn)(const int8_job *j, int64_t r0, int64_t mr, int64_t p0, int64_t np);

#if defined(__x86_64__)
/* Whether tile fn gives the portable loop's integers on a product with every tail (rows, k and n
 * off the tiles): run once before a path no test here could run (AMX) is trusted. */
static bool same_as_portable(tile_fn fn) {
  enum { ROWS = 40, K = 200, N = 40, STRIDE = 256, GROUPS = K / GROUP, PANELS = (N + PANEL - 1) / PANEL };
  enum { PANEL_BYTES = GROUPS * PANEL * GROUP, PADDED_GROUPS = (GROUPS + 15) / 16 * 16 };
  /* On the heap, per call: two threads' first calls may both decide (and check) at once. */
  struct check {
    uint8_t a[64 * STRIDE];
    int8_t b[PANELS * PANEL_BYTES], last[PADDED_GROUPS * PANEL * GROUP];
    int32_t zeros[N], sums[64], want[ROWS * N], got[ROWS * N];
  } *m = calloc(1, sizeof *m);
  if (!m) return false;
  uint32_t state = 12345;
  for (int r = 0; r < ROWS; r++)
    for (int i = 0; i < K; i++) {
      state = state * 1103515245u + 12345u;
      m->a[r * STRIDE + i] = (uint8_t)(state >> 16);
    }
  for (int i = 0; i < PANELS * PANEL_BYTES; i++) {
    state = state * 1103515245u + 12345u;
    m->b[i] = (int8_t)(state >> 16);
  }
  memcpy(m->last, m->b + (PANELS - 1) * PANEL_BYTES, PANEL_BYTES);
  int8_job j = {.a = m->a, .stride = STRIDE, .rows = ROWS, .k = K, .n = N, .b = m->b, .panel_bytes = PANEL_BYTES,
                .d = m->zeros, .csum = m->zeros, .row_sums = m->sums, .out = m->want, .amx_last_panel = m->last};
  tile_portable(&j, 0, ROWS, 0, PANELS);
  j.out = m->got;
  fn(&j, 0, ROWS, 0, PANELS);
  bool same = memcmp(m->want, m->got, sizeof m->want) == 0;
  free(m);
  return same;
}

/* same_as_portable, saying on stderr when a path fails it (and is not taken). */
static bool checked(const char *name, tile_fn fn) {
  if (same_as_portable(fn)) return true;
  fprintf(stderr, "relaxc.matmul_int8: %s gave other integers than the portable loop on a check product; not used\n",
          name);
  return false;
}
#endif

/* AMX-INT8 where the CPU has it and Linux grants the tiles (checked against the portable loop
 * once), else VNNI where the CPU has it (and the OS keeps its registers: GCC's check includes
 * that), else AVX2; on aarch64 SDOT where the CPU has the dot products; else the portable loop, decided once per process. RELAXC_QUANT_ISA=
 * portable|avx2|vnni picks a lesser one (the same integers), so that tests run every path on one
 * CPU; amx-emulated runs AMX's blocking on tiles emulated in C. */
static tile_fn chosen_tile(void) {
  static tile_fn _Atomic chosen;
  tile_fn c = atomic_load_explicit(&chosen, memory_order_acquire);
  if (c) return c;
  c = tile_portable;
#if defined(__x86_64__)
  if (rk_cpu_isa() == RK_ISA_AVX2 && !rk_quant_isa_forced("portable")) {
    __builtin_cpu_init();
    bool vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl");
    c = vnni && !rk_quant_isa_forced("avx2") ? tile_vnni : tile_avx2;
    if (c == tile_vnni && !rk_quant_isa_forced("vnni") && amx_permitted() && checked("AMX-INT8", tile_amx))
      c = tile_amx;
  }
  if (rk_quant_isa_forced("amx-emulated") && checked("AMX-INT8 (emulated)", tile_amx_emulated)) c = tile_amx_emulated;
#endif
  const char *name = "portable C";
#if defined(__aarch64__)
  if (cpu_has_dotprod() && !rk_quant_isa_forced("portable")) c = tile_neon, name = "SDOT";
#endif
#if defined(__x86_64__)
  if (c == tile_amx) name = "AMX-INT8";
  if (c == tile_amx_emulated) name = "AMX-INT8 emulated in C";
  if (c == tile_vnni) name = "AVX-512 VNNI";
  if (c == tile_avx2) name = "AVX2";
#endif
  rk_report_path("int8 matmul (MatMulInteger)", name);
  atomic_store_explicit(&chosen, c, memory_order_release);
  return c;
}

typedef struct int8_work {
  const int8_job *job;
  tile_fn tile;
  int64_t row_units, units;
} int8_work;

/* Units are column blocks (outer) by row blocks (inner), so a task's consecutive units share the
 * weights they read. */
static int int8_task(int task, int num_tasks, void *ctx) {
  const int8_work *w = ctx;
  const int8_job *j = w->job;
  int64_t begin, end, panels = (j->n + PANEL - 1) / PANEL;
  rk_split(w->units, task, num_tasks, &begin, &end);
  for (int64_t u = begin; u < end; u++) {
    int64_t pb = u / w->row_units, rb = u % w->row_units;
    int64_t p0 = pb * PANELS_PER_UNIT, r0 = rb * ROWS_PER_UNIT;
    int64_t np = panels - p0 < PANELS_PER_UNIT ? panels - p0 : PANELS_PER_UNIT;
    int64_t mr = j->rows - r0 < ROWS_PER_UNIT ? j->rows - r0 : ROWS_PER_UNIT;
    w->tile(j, r0, mr, p0, np);
  }
  return 0;
}

/* rows x k bytes of a into dst (rows `stride` apart, zero past k), each XORed with flip, and
 * each row's sum of what was stored. */
static void copy_rows_portable(const uint8_t *a, int64_t rows, int64_t k, int64_t stride, uint8_t flip, uint8_t *dst,
                               int32_t *sums) {
  for (int64_t r = 0; r < rows; r++) {
    int32_t s = 0;
    const uint8_t *row = a + r * k;
    uint8_t *to = dst + r * stride;
    for (int64_t i = 0; i < k; i++) {
      to[i] = row[i] ^ flip;
      s += to[i];
    }
    memset(to + k, 0, (size_t)(stride - k));
    sums[r] = s;
  }
}

#if defined(__x86_64__)
/* The same 32 bytes at a time (VPSADBW sums them): the byte loop above was an eighth of a
 * MiniLM layer's int8 matmul time. */
__attribute__((target("avx2"))) static void copy_rows_avx2(const uint8_t *a, int64_t rows, int64_t k, int64_t stride,
                                                          uint8_t flip, uint8_t *dst, int32_t *sums) {
  __m256i flips = _mm256_set1_epi8((char)flip), zero = _mm256_setzero_si256();
  for (int64_t r = 0; r < rows; r++) {
    const uint8_t *row = a + r * k;
    uint8_t *to = dst + r * stride;
    __m256i acc = zero;
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
      __m256i v = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(row + i)), flips);
      _mm256_storeu_si256((__m256i *)(to + i), v);
      acc = _mm256_add_epi64(acc, _mm256_sad_epu8(v, zero));
    }
    int64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, acc);
    int32_t s = (int32_t)(lanes[0] + lanes[1] + lanes[2] + lanes[3]);
    for (; i < k; i++) {
      to[i] = row[i] ^ flip;
      s += to[i];
    }
    memset(to + k, 0, (size_t)(stride - k));
    sums[r] = s;
  }
}
#endif

static void copy_rows(const uint8_t *a, int64_t rows, int64_t k, int64_t stride, uint8_t flip, uint8_t *dst,
                      int32_t *sums) {
#if defined(__x86_64__)
  if (rk_cpu_isa() == RK_ISA_AVX2) {
    copy_rows_avx2(a, rows, k, stride, flip, dst, sums);
    return;
  }
#endif
  copy_rows_portable(a, rows, k, stride, flip, dst, sums);
}

/* Multiply-adds worth a task of their own: below this a wake-up costs more than it saves. */
enum { MACS_PER_TASK = 1 << 20 };

static bool is_byte_tensor(const DLTensor *t) {
  return t->device.device_type == kDLCPU && (t->dtype.code == kDLInt || t->dtype.code == kDLUInt) &&
         t->dtype.bits == 8 && t->dtype.lanes == 1 && rk_compact(t);
}

/* The activations' zero point: None (0), or one integer of 8 or 32 bits. */
static int zero_point(const char *kernel, const TVMFFIAny *arg, int32_t *out) {
  if (arg->type_index == kTVMFFINone) {
    *out = 0;
    return 0;
  }
  DLTensor *t = rvm_as_dltensor(arg);
  if (!t || t->device.device_type != kDLCPU || rk_numel(t) != 1 || t->dtype.lanes != 1 ||
      (t->dtype.code != kDLInt && t->dtype.code != kDLUInt) || (t->dtype.bits != 8 && t->dtype.bits != 32))
    return rvm_raise("TypeError", "%s: argument 3 (a_zero_point) must be None or one 8- or 32-bit integer, got %s",
                     kernel, t ? "another tensor" : rvm_type_name(arg));
  const void *p = (const char *)t->data + t->byte_offset;
  if (t->dtype.bits == 32) *out = *(const int32_t *)p;
  else *out = t->dtype.code == kDLInt ? *(const int8_t *)p : *(const uint8_t *)p;
  return 0;
}

/* (a, b_packed, b_comp, a_zero_point?, scale?, bias?, out): a uint8/int8 [..., k], b_packed int8
 * [ceil(n/16), ceil(k/4), 16, 4], b_comp int32 [2, n] (d, then the sums of c); out int32 [..., n]
 * with a's leading dims, or float32 = float(sum) * scale + bias where scale (1 or n float32
 * values) is given. */
int rvm_builtin_kl_matmul_int8(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  (void)self, (void)result;
  static const char kernel[] = "relaxc.matmul_int8";
  int rc = rk_check_count(kernel, num_args, 7);
  if (rc) return rc;
  DLTensor *a = rvm_as_dltensor(&args[0]), *b = NULL, *comp = NULL, *out = NULL, *scale = NULL, *bias = NULL;
  if (!a || !is_byte_tensor(a))
    return rvm_raise("TypeError", "%s: argument 0 (a) must be a compact uint8 or int8 CPU tensor, got %s", kernel,
                     a ? "another tensor" : rvm_type_name(&args[0]));
  rc = rk_arg_typed(kernel, args, num_args, 1, "b_packed", kDLInt, 8, "int8", &b);
  if (!rc) rc = rk_arg_i32(kernel, args, num_args, 2, "b_comp", &comp);
  int32_t a_zp = 0;
  if (!rc) rc = zero_point(kernel, &args[3], &a_zp);
  if (!rc) rc = rk_arg_f32_or_none(kernel, args, num_args, 4, "scale", &scale);
  if (!rc) rc = rk_arg_f32_or_none(kernel, args, num_args, 5, "bias", &bias);
  if (!rc && scale) rc = rk_arg_f32(kernel, args, num_args, 6, "out", &out);
  if (!rc && !scale) rc = rk_arg_i32(kernel, args, num_args, 6, "out", &out);
  if (rc) return rc;
  if (bias && !scale) return rvm_raise("ValueError", "%s: a bias needs a scale (the float result)", kernel);
  if (a->ndim < 1) return rk_shape_error(kernel, "a must have at least one axis", a);
  int64_t k = a->shape[a->ndim - 1];
  if (out->ndim != a->ndim) return rk_shape_error(kernel, "out must have a's rank", out);
  for (int32_t d = 0; d + 1 < a->ndim; d++)
    if (out->shape[d] != a->shape[d]) return rk_shape_error(kernel, "out's leading dims must be a's", out);
  int64_t n = out->shape[out->ndim - 1];
  int64_t panels = (n + PANEL - 1) / PANEL, groups = (k + GROUP - 1) / GROUP;
  if (b->ndim != 4 || b->shape[0] != panels || b->shape[1] != groups || b->shape[2] != PANEL || b->shape[3] != GROUP)
    return rk_shape_error(kernel, "b_packed must be [ceil(n/16), ceil(k/4), 16, 4] for a's k and out's n", b);
  if (comp->ndim != 2 || comp->shape[0] != 2 || comp->shape[1] != n)
    return rk_shape_error(kernel, "b_comp must be [2, n] for out's n", comp);
  if (scale && rk_numel(scale) != 1 && rk_numel(scale) != n)
    return rk_shape_error(kernel, "scale must hold 1 or n values", scale);
  if (bias && rk_numel(bias) != n) return rk_shape_error(kernel, "bias must hold n values", bias);
  int64_t rows = k ? rk_numel(a) / k : rk_numel(out) / (n ? n : 1);
  if (rows == 0 || n == 0) return 0;
  /* A copy of a with rows padded to whole groups and signed bytes flipped, so that the inner
   * loops read every group as one word; each row's sum on the way. */
  bool is_signed = a->dtype.code == kDLInt;
  tile_fn tile = chosen_tile();
  int64_t stride = groups * GROUP, padded_rows = rows;
  const int8_t *last_panel = NULL;
#if defined(__x86_64__)
  if (tile == tile_amx || tile == tile_amx_emulated) {
    /* Whole tiles: 64-step rows, 32-row blocks, and the last panel's groups to a multiple of 16. */
    stride = (k + AMX_BLOCK - 1) / AMX_BLOCK * AMX_BLOCK;
    padded_rows = (rows + 2 * AMX_ROWS - 1) / (2 * AMX_ROWS) * (2 * AMX_ROWS);
    size_t panel_bytes = (size_t)(groups * PANEL * GROUP), padded = (size_t)(stride / GROUP * PANEL * GROUP);
    int8_t *last = rk_scratch(RK_SLOT_B_PACK, padded);
    if (!last) return rk_out_of_memory(kernel);
    memcpy(last, (const int8_t *)b->data + b->byte_offset + (panels - 1) * (int64_t)panel_bytes, panel_bytes);
    memset(last + panel_bytes, 0, padded - panel_bytes);
    last_panel = last;
  }
#endif
  uint8_t *copy = rk_scratch(RK_SLOT_A_WHOLE, (size_t)(padded_rows * stride));
  int32_t *row_sums = rk_scratch(RK_SLOT_INPUT, (size_t)rows * sizeof(int32_t));
  if (!copy || !row_sums) return rk_out_of_memory(kernel);
  memset(copy + rows * stride, 0, (size_t)((padded_rows - rows) * stride));
  const uint8_t *ad = (const uint8_t *)a->data + a->byte_offset;
  copy_rows(ad, rows, k, stride, is_signed ? 0x80 : 0, copy, row_sums);
  const int32_t *cd = (const int32_t *)((const char *)comp->data + comp->byte_offset);
  int8_job j = {
      .a = copy,
      .stride = stride,
      .rows = rows,
      .k = k,
      .n = n,
      .b = (const int8_t *)b->data + b->byte_offset,
      .panel_bytes = groups * PANEL * GROUP,
      .d = cd,
      .csum = cd + n,
      .a_zp = is_signed ? a_zp + 128 : a_zp,
      .row_sums = row_sums,
      .out = scale ? NULL : (int32_t *)((char *)out->data + out->byte_offset),
      .out_f32 = scale ? rk_data(out) : NULL,
      .scale = scale ? rk_data(scale) : NULL,
      .scale_step = scale && rk_numel(scale) == n ? 1 : 0,
      .bias = bias ? rk_data(bias) : NULL,
      .amx_last_panel = last_panel,
  };
  int64_t row_units = (rows + ROWS_PER_UNIT - 1) / ROWS_PER_UNIT;
  int8_work w = {&j, tile, row_units, row_units * ((panels + PANELS_PER_UNIT - 1) / PANELS_PER_UNIT)};
  int64_t by_work = rows * n * k / MACS_PER_TASK + 1;
  return rk_parallel(w.units < by_work ? w.units : by_work, int8_task, &w);
}
