/*
 * quant_x86_body.h: the body of quant_x86.c's dot products, included once per instruction set
 * with QX_TARGET (the target attribute), QX(name) (the instance's names), QX_DOT (adds the
 * products of 32 unsigned bytes and 32 signed bytes, four at a time, into 8 int32 lanes),
 * QX_TILE16 (the instance's table of 16-row tiles), QX_NIBBLE_SUMS16 and QX_NIBBLE_DOT16 (whether,
 * and how, the 4-bit regrouped formats add byte products in 16 bits before widening them), and
 * QX_X8_AHEAD and QX_ONE_AHEAD (decoding's prefetch distances, QX_PREFETCH_BLOCK).
 *
 * Each format has a tile: up to 4 weight rows against up to 4 activation rows, every weight
 * block unpacked once for all the activation rows and every activation block loaded once for all
 * the weight rows. Each output has its own accumulator, summed in an order fixed by k alone: for
 * the integer formats a tile's shape never changes a bit; f32 and f16 decode (one activation row)
 * through a row function of their own, whose sums are grouped differently.
 */
#define QX_FN static __attribute__((target(QX_TARGET)))

QX_FN inline float QX(hsum)(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  a = _mm_add_ss(a, _mm_movehdup_ps(a));
  return _mm_cvtss_f32(a);
}

QX_FN inline float QX(half)(const uint8_t *p) {
  uint16_t h;
  __builtin_memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

/* A tile's inner kernel works on 4 weight rows (w[0..3], repeated where fewer are real) and X
 * activation rows (xr[0..X-1], likewise), with X a constant of each instance, so that every
 * accumulator stays in a register; res[c][r] gets the sums. QX_TILES makes the tile function
 * that pads and dispatches to the instances for X = 1, 2 and the format's widest (QX_KERNEL_PAIR's
 * WIDE, at most QX_WIDE). */
#define QX_TILES(format)                                                                                            \
  QX_FN void QX(tile_##format)(const uint8_t *w, int64_t row_bytes, int rows, const rk_qrows *a, int64_t r0, int xrows, \
                               float *out, int64_t out_stride) {                                                     \
    const uint8_t *wr[4];                                                                                            \
    for (int c = 0; c < 4; c++) wr[c] = w + (c < rows ? c : rows - 1) * row_bytes;                                   \
    for (int r = 0; r < xrows;) {                                                                                    \
      /* Activation rows the widest at a time, then two, then one: few passes over the weights. */ \
      const int wide = QX(format##_wide_rows);                                                                       \
      int left = xrows - r, take = left >= wide ? wide : left >= 2 ? 2 : 1;                                          \
      int64_t xr[QX_WIDE];                                                                                           \
      float res[4][QX_WIDE];                                                                                         \
      for (int i = 0; i < QX_WIDE; i++) xr[i] = r0 + r + (i < take ? i : take - 1);                                  \
      if (take == wide) QX(format##_wide)(wr, a, xr, 4 * row_bytes, res);                                           \
      else if (take == 2) QX(format##_pair)(wr, a, xr, 4 * row_bytes, res);                                         \
      else QX(format##_one)(wr, a, xr, res);                                                         \
      for (int c = 0; c < rows; c++)                                                                                 \
        for (int i = 0; i < take; i++) out[(r + i) * out_stride + c] = res[c][i];                                    \
      r += take;                                                                                                     \
    }                                                                                                                \
  }

/* Software prefetch `ahead` bytes past a weight block (none when 0): one line when several
 * activation rows share the block (a tile's next rows), every line of the block's bytes when one
 * row streams alone (decoding), where the hardware's prefetch alone leaves the core short of loads
 * in flight (QX_ONE_AHEAD says by how much). */
#define QX_PREFETCH_BLOCK(blk, ahead, X, bytes)                                                             \
  do {                                                                                                      \
    if ((ahead) && (X) == 1)                                                                                \
      for (int line = 0; line < (bytes); line += 64) _mm_prefetch((const char *)(blk) + (ahead) + line, _MM_HINT_T0); \
    else if (ahead)                                                                                         \
      _mm_prefetch((const char *)(blk) + (ahead), _MM_HINT_T0);                                             \
  } while (0)

/* One activation row (decoding): with SIDE_BY_SIDE, the kernel reads the 4 weight rows side by
 * side; otherwise each row is read alone, one sequential stream the hardware prefetches, through
 * ROW, a row function with four sums in flight (memory-bound float rows), or through the kernel
 * where ROW is NULL (the integer formats). WIDE: the most activation rows one pass takes. */
#define QX_KERNEL_PAIR(format, ROW, SIDE_BY_SIDE, WIDE, ...)                                               \
  enum { QX(format##_wide_rows) = (WIDE) };                                                                 \
  QX_FN inline __attribute__((always_inline)) void QX(format##_kernel)(                                    \
      const uint8_t *const *wr, const rk_qrows *a, const int64_t *xr, int C, int X, int64_t ahead,         \
      float res[4][QX_WIDE]) __VA_ARGS__                                                                    \
  QX_FN void QX(format##_one)(const uint8_t *const *wr, const rk_qrows *a, const int64_t *xr,             \
                              float res[4][QX_WIDE]) {                                                      \
    if (SIDE_BY_SIDE) {                                                                                     \
      QX(format##_kernel)(wr, a, xr, 4, 1, 0, res);                                                         \
      return;                                                                                               \
    }                                                                                                       \
    float (*const row)(const uint8_t *, const float *, int64_t) = ROW;                                      \
    for (int c = 0; c < 4; c++) {                                                                           \
      float one[4][QX_WIDE];                                                                                \
      if (row) one[0][0] = row(wr[c], a->x + xr[0] * a->k, a->k);                                           \
      else QX(format##_kernel)(wr + c, a, xr, 1, 1, QX_ONE_AHEAD, one);                                     \
      res[c][0] = one[0][0];                                                                                \
    }                                                                                                       \
  }                                                                                                         \
  QX_FN void QX(format##_wide)(const uint8_t *const *wr, const rk_qrows *a, const int64_t *xr,            \
                               int64_t ahead, float res[4][QX_WIDE]) {                                      \
    QX(format##_kernel)(wr, a, xr, 4, (WIDE), ahead, res);                                                  \
  }                                                                                                         \
  QX_FN void QX(format##_pair)(const uint8_t *const *wr, const rk_qrows *a, const int64_t *xr,            \
                               int64_t ahead, float res[4][QX_WIDE]) {                                      \
    QX(format##_kernel)(wr, a, xr, 4, 2, ahead, res);                                                       \
  }

/* ---- f32 and f16: float products, 8 lanes per output ----------------------------------------------- */

#define QX_FLOAT_KERNEL(LOAD8, TAIL, VALUE_BYTES)                                                                \
  {                                                                                                              \
    const int64_t k = a->k;                                                                                      \
    __m256 acc[4][QX_WIDE];                                                                                      \
    _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) _Pragma("GCC unroll 4") for (int r = 0; r < X; r++)     \
        acc[c][r] = _mm256_setzero_ps();                                                                         \
    int64_t i = 0;                                                                                               \
    for (; i + 8 <= k; i += 8) {                                                                                 \
      __m256 xv[QX_WIDE];                                                                                        \
      _Pragma("GCC unroll 4") for (int r = 0; r < X; r++) xv[r] = _mm256_loadu_ps(a->x + xr[r] * k + i);        \
      _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) {                                                      \
        if (ahead) _mm_prefetch((const char *)wr[c] + (VALUE_BYTES) * i + ahead, _MM_HINT_T0);                   \
        __m256 wv = LOAD8(wr[c], i);                                                                             \
        _Pragma("GCC unroll 4") for (int r = 0; r < X; r++) acc[c][r] = _mm256_fmadd_ps(wv, xv[r], acc[c][r]);  \
      }                                                                                                          \
    }                                                                                                            \
    for (int c = 0; c < C; c++)                                                                                  \
      for (int r = 0; r < X; r++) {                                                                              \
        float sum = QX(hsum)(acc[c][r]);                                                                         \
        for (int64_t j = i; j < k; j++) sum = __builtin_fmaf(TAIL(wr[c], j), a->x[xr[r] * k + j], sum);         \
        res[c][r] = sum;                                                                                         \
      }                                                                                                          \
  }

#define QX_LOAD_F32(row, i) _mm256_loadu_ps((const float *)(row) + (i))
#define QX_TAIL_F32(row, j) (((const float *)(row))[j])
#define QX_LOAD_F16(row, i) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((row) + 2 * (i))))
#define QX_TAIL_F16(row, j) QX(half)((row) + 2 * (j))
/* 32 values of a float row from `row` at value i, as four vectors of 8. f16 reads its line as two
 * 32-byte halves and converts each 16 bytes from a register (GCC still loads the low 16 bytes on
 * their own), where a conversion from memory per 16 bytes streamed slower: over the mid-size
 * Llama's f16 matrices in decode order on Zen 3, 2-16% more bytes/s in 5 of 5 runs (median 11%),
 * and its decode faster in 16 of 20 interleaved runs at 1 thread (median of ratios 1.04x) and 7 of
 * 10 at 2 (1.02x). The sums are the same: the same conversions added in the same order. */
#define QX_LOAD32_F32(row, i, v)                                                                          \
  do {                                                                                                   \
    (v)[0] = QX_LOAD_F32(row, (i));                                                                      \
    (v)[1] = QX_LOAD_F32(row, (i) + 8);                                                                  \
    (v)[2] = QX_LOAD_F32(row, (i) + 16);                                                                 \
    (v)[3] = QX_LOAD_F32(row, (i) + 24);                                                                 \
  } while (0)
#define QX_LOAD32_F16(row, i, v)                                                                          \
  do {                                                                                                   \
    __m256i lo = _mm256_loadu_si256((const __m256i *)((row) + 2 * (i)));                                  \
    __m256i hi = _mm256_loadu_si256((const __m256i *)((row) + 2 * (i) + 32));                             \
    (v)[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(lo));                                                 \
    (v)[1] = _mm256_cvtph_ps(_mm256_extracti128_si256(lo, 1));                                            \
    (v)[2] = _mm256_cvtph_ps(_mm256_castsi256_si128(hi));                                                 \
    (v)[3] = _mm256_cvtph_ps(_mm256_extracti128_si256(hi, 1));                                            \
  } while (0)
/* One float row against one activation row, four partial sums in flight (decoding: the row
 * streams from memory, and one chain of multiply-adds could not keep up with it). AHEAD: bytes
 * of software prefetch ahead of each run of 32 values, 0 for none (QX_F16_AHEAD says where); FAR:
 * the same into the second-level cache, further ahead. */
#define QX_FLOAT_ROW(name, LOAD8, LOAD32, TAIL, VALUE_BYTES, AHEAD, FAR)                                 \
  QX_FN float QX(name)(const uint8_t *row, const float *x, int64_t k) {                                  \
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;                            \
    int64_t i = 0;                                                                                       \
    for (; i + 32 <= k; i += 32) {                                                                       \
      if (FAR) _mm_prefetch((const char *)(row) + (VALUE_BYTES) * i + (FAR), _MM_HINT_T1);              \
      if (AHEAD) _mm_prefetch((const char *)(row) + (VALUE_BYTES) * i + (AHEAD), _MM_HINT_T0);          \
      __m256 w[4];                                                                                       \
      LOAD32(row, i, w);                                                                                 \
      acc0 = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(x + i), acc0);                                        \
      acc1 = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x + i + 8), acc1);                                    \
      acc2 = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(x + i + 16), acc2);                                   \
      acc3 = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x + i + 24), acc3);                                   \
    }                                                                                                    \
    for (; i + 8 <= k; i += 8) acc0 = _mm256_fmadd_ps(LOAD8(row, i), _mm256_loadu_ps(x + i), acc0);      \
    float sum = QX(hsum)(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));           \
    for (; i < k; i++) sum = __builtin_fmaf(TAIL(row, i), x[i], sum);                                    \
    return sum;                                                                                          \
  }
QX_FLOAT_ROW(f32_row, QX_LOAD_F32, QX_LOAD32_F32, QX_TAIL_F32, 4, 0, 0)
QX_FLOAT_ROW(f16_row, QX_LOAD_F16, QX_LOAD32_F16, QX_TAIL_F16, 2, QX_F16_AHEAD, 0)
#if QX_F16_STREAM
/* Two f16 rows against one activation row, each summed as f16_row sums it (the same bits), read
 * side by side, each prefetched QX_F16_AHEAD ahead. */
QX_FN void QX(f16_row_pair)(const uint8_t *row0, const uint8_t *row1, const float *x, int64_t k, float *out0,
                            float *out1) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    _mm_prefetch((const char *)row0 + 2 * i + QX_F16_AHEAD, _MM_HINT_T0);
    _mm_prefetch((const char *)row1 + 2 * i + QX_F16_AHEAD, _MM_HINT_T0);
    __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8), x2 = _mm256_loadu_ps(x + i + 16),
           x3 = _mm256_loadu_ps(x + i + 24), w[4];
    QX_LOAD32_F16(row0, i, w);
    a0 = _mm256_fmadd_ps(w[0], x0, a0);
    a1 = _mm256_fmadd_ps(w[1], x1, a1);
    a2 = _mm256_fmadd_ps(w[2], x2, a2);
    a3 = _mm256_fmadd_ps(w[3], x3, a3);
    QX_LOAD32_F16(row1, i, w);
    b0 = _mm256_fmadd_ps(w[0], x0, b0);
    b1 = _mm256_fmadd_ps(w[1], x1, b1);
    b2 = _mm256_fmadd_ps(w[2], x2, b2);
    b3 = _mm256_fmadd_ps(w[3], x3, b3);
  }
  for (; i + 8 <= k; i += 8) {
    __m256 xv = _mm256_loadu_ps(x + i);
    a0 = _mm256_fmadd_ps(QX_LOAD_F16(row0, i), xv, a0);
    b0 = _mm256_fmadd_ps(QX_LOAD_F16(row1, i), xv, b0);
  }
  float sum0 = QX(hsum)(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  float sum1 = QX(hsum)(_mm256_add_ps(_mm256_add_ps(b0, b1), _mm256_add_ps(b2, b3)));
  for (; i < k; i++) {
    sum0 = __builtin_fmaf(QX_TAIL_F16(row0, i), x[i], sum0);
    sum1 = __builtin_fmaf(QX_TAIL_F16(row1, i), x[i], sum1);
  }
  *out0 = sum0;
  *out1 = sum1;
}
/* f16 decoding's rows in one pass: row c of the first half beside row c of the second, two long
 * sequential streams (QX_F16_STREAM says why); the last of an odd number alone. */
QX_FN void QX(f16_stream)(const uint8_t *w, int64_t row_bytes, int64_t rows, const float *x, int64_t k, float *out) {
  int64_t half = rows / 2;
  for (int64_t c = 0; c < half; c++)
    QX(f16_row_pair)(w + c * row_bytes, w + (c + half) * row_bytes, x, k, out + c, out + c + half);
  if (rows % 2) out[rows - 1] = QX(f16_row)(w + (rows - 1) * row_bytes, x, k);
}
#define QX_F16_STREAM_FN QX(f16_stream)
#else
#define QX_F16_STREAM_FN NULL
#endif
QX_KERNEL_PAIR(f32, QX(f32_row), QX_F32_SIDE_BY_SIDE, QX_FLOAT_WIDE, QX_FLOAT_KERNEL(QX_LOAD_F32, QX_TAIL_F32, 4))
QX_KERNEL_PAIR(f16, QX(f16_row), 0, QX_FLOAT_WIDE, QX_FLOAT_KERNEL(QX_LOAD_F16, QX_TAIL_F16, 2))

/* ---- q8_0 and q4_0: blocks of 32 with one f16 scale ----------------------------------------------- */

/* q4_0's 16 bytes as 32 unsigned values 0-15: low nibbles (values 0-15), then high ones. */
QX_FN inline __m256i QX(q4_0_unsigned)(const uint8_t *qs) {
  __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
  return _mm256_and_si256(_mm256_srlv_epi64(both, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0xf));
}

#define QX_BLOCK32_KERNEL(BYTES, PRODUCT, START)                                                                   \
  {                                                                                                                \
    const int64_t k = a->k;                                                                                        \
    __m256 acc[4][QX_WIDE];                                                                                        \
    _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) _Pragma("GCC unroll 4") for (int r = 0; r < X; r++)       \
        acc[c][r] = _mm256_setzero_ps();                                                                           \
    for (int64_t b = 0; b < k / 32; b++) {                                                                         \
      __m256i xb[QX_WIDE], start[QX_WIDE];                                                                         \
      float dx[QX_WIDE];                                                                                           \
      _Pragma("GCC unroll 4") for (int r = 0; r < X; r++) {                                                        \
        xb[r] = _mm256_loadu_si256((const __m256i *)(a->q + xr[r] * k + 32 * b));                                  \
        const int16_t *s16 = a->sum16 + xr[r] * (k / 16) + 2 * b;                                                  \
        start[r] = START(s16[0] + s16[1]);                                                                         \
        dx[r] = a->d[xr[r] * (k / 32) + b];                                                                        \
      }                                                                                                            \
      _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) {                                                        \
        const uint8_t *blk = wr[c] + (BYTES) * b;                                                                  \
        /* Rows read side by side are streams too short for the hardware: fetch the next tile's. A row     \
         * read alone (plain q8_0 and q4_0 decode, rare: they are regrouped) is left to the hardware. */          \
        if (ahead && (X) > 1) _mm_prefetch((const char *)blk + ahead, _MM_HINT_T0);                                \
        float dw = QX(half)(blk);                                                                                  \
        PRODUCT                                                                                                    \
      }                                                                                                            \
    }                                                                                                              \
    for (int c = 0; c < C; c++)                                                                                    \
      for (int r = 0; r < X; r++) res[c][r] = QX(hsum)(acc[c][r]);                                                 \
  }

/* q4_0: unsigned nibbles times x, less 8 times x's sum (started in lane 0). */
#define QX_Q4_0_START(sum) _mm256_setr_epi32(-8 * (sum), 0, 0, 0, 0, 0, 0, 0)
#define QX_Q4_0_PRODUCT                                                                                      \
  __m256i u = QX(q4_0_unsigned)(blk + 2);                                                                    \
  _Pragma("GCC unroll 4") for (int r = 0; r < X; r++) {                                                      \
    __m256i p = QX_DOT(start[r], u, xb[r]);                                                                  \
    acc[c][r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx[r]), _mm256_cvtepi32_ps(p), acc[c][r]);               \
  }
/* q8_0: |w| times x with w's sign (the pairs stay within 128 x 127). */
#define QX_Q8_0_START(sum) ((void)(sum), _mm256_setzero_si256())
#define QX_Q8_0_PRODUCT                                                                                      \
  __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 2)), magnitude = _mm256_sign_epi8(v, v);            \
  _Pragma("GCC unroll 4") for (int r = 0; r < X; r++) {                                                      \
    __m256i p = QX_DOT(start[r], magnitude, _mm256_sign_epi8(xb[r], v));                                     \
    acc[c][r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx[r]), _mm256_cvtepi32_ps(p), acc[c][r]);               \
  }
QX_KERNEL_PAIR(q4_0, NULL, 0, QX_INT_WIDE, QX_BLOCK32_KERNEL(18, QX_Q4_0_PRODUCT, QX_Q4_0_START))
QX_KERNEL_PAIR(q8_0, NULL, 0, QX_INT_WIDE, QX_BLOCK32_KERNEL(34, QX_Q8_0_PRODUCT, QX_Q8_0_START))

/* ---- q4_K and q6_K: super-blocks of 256, integer sub-block scales ---------------------------------- */

/* The sum over 16 values of a[i] * b[i] (int16 lanes), exactly. */
QX_FN inline int32_t QX(dot16)(__m256i a, __m256i b) {
  __m256i p = _mm256_madd_epi16(a, b);
  __m128i q = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
  q = _mm_add_epi32(q, _mm_shuffle_epi32(q, 0x4e));
  q = _mm_add_epi32(q, _mm_shuffle_epi32(q, 0xb1));
  return _mm_cvtsi128_si32(q);
}

QX_KERNEL_PAIR(q4_K, NULL, 0, QX_INT_WIDE, {
  const int64_t k = a->k;
  const __m256i low = _mm256_set1_epi8(0xf);
  /* Each minimum twice: it weighs both sums of 16 in its sub-block of 32. */
  const __m128i twice = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
  __m256 acc[4][QX_WIDE];
  float extra[4][QX_WIDE];
  _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) _Pragma("GCC unroll 4") for (int r = 0; r < X; r++)
      acc[c][r] = _mm256_setzero_ps(), extra[c][r] = 0.0f;
  for (int64_t b = 0; b < k / 256; b++) {
    _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) {
      const uint8_t *blk = wr[c] + 144 * b;
      QX_PREFETCH_BLOCK(blk, ahead, X, 144);
      uint8_t sm[16];
      rk_q4k_scales_mins(blk + 4, sm);
      __m128i packed = _mm_loadu_si128((const __m128i *)sm);
      __m256i mins16 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(packed, twice));
      __m256i sum[QX_WIDE];
      _Pragma("GCC unroll 4") for (int r = 0; r < X; r++) sum[r] = _mm256_setzero_si256();
      _Pragma("GCC unroll 4") for (int ch = 0; ch < 4; ch++) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * ch));
        __m256i lo = _mm256_and_si256(q, low), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
        __m256i slo = _mm256_set1_epi16(sm[2 * ch]), shi = _mm256_set1_epi16(sm[2 * ch + 1]);
        _Pragma("GCC unroll 4") for (int r = 0; r < X; r++) {
          const int8_t *qx = a->q + xr[r] * k + 256 * b + 64 * ch;
          __m256i plo = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)qx));
          __m256i phi = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(qx + 32)));
          sum[r] = _mm256_add_epi32(sum[r], _mm256_add_epi32(_mm256_madd_epi16(plo, slo), _mm256_madd_epi16(phi, shi)));
        }
      }
      float d = QX(half)(blk), dmin = QX(half)(blk + 2);
      _Pragma("GCC unroll 4") for (int r = 0; r < X; r++) {
        __m256i sx = _mm256_loadu_si256((const __m256i *)(a->sum16 + xr[r] * (k / 16) + 16 * b));
        int32_t m = QX(dot16)(mins16, sx);
        float dx = a->d[xr[r] * (k / 256) + b];
        acc[c][r] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(sum[r]), acc[c][r]);
        extra[c][r] = __builtin_fmaf(-(dmin * dx), (float)m, extra[c][r]);
      }
    }
  }
  for (int c = 0; c < C; c++)
    for (int r = 0; r < X; r++) res[c][r] = QX(hsum)(acc[c][r]) + extra[c][r];
})

/* q6_K in llama.cpp's lanes (quant.c's dot_q6_K): per super-block, lane i of an 8-lane int32 sum
 * holds scale times values 4i..4i+3 of each part of 32, less 32 times the activation sums of
 * sub-blocks 2i and 2i + 1 times their scales; then one multiply-add per super-block. */
#if QX_Q6_K_ZMM
/* Two parts of 32 per 512-bit register (parts 0-1, then 2-3, of each half): the lanes of the low
 * 256 bits and of the high ones are the same lanes of two parts, added before the float step,
 * so the integers and the bits are the 256-bit version's, in half the instructions. */
QX_FN inline __m512i QX(q6_K_scales2)(const int8_t *sc) {
  /* int16 lanes 8j..8j+7 take scale sc[j], j = 0..3 (each part's two sub-blocks of 16). */
  int32_t four;
  __builtin_memcpy(&four, sc, 4);
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                          3, 3, 3, 3, 3, 3);
  return _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(_mm256_set1_epi32(four), spread));
}

/* The 8 lanes of super-block blk against activation rows xr[0..X), super-block b of each. */
QX_FN inline __attribute__((always_inline)) void QX(q6_K_lanes)(const uint8_t *blk, const rk_qrows *a,
                                                                const int64_t *xr, int X, int64_t b, __m256i *lanes) {
  const int64_t k = a->k;
  const __m512i low = _mm512_set1_epi8(0xf), high = _mm512_set1_epi8(0x30);
  /* 16-bit shift counts: the low 256 bits hold parts 0 and 2's high bits, the upper parts 1 and 3's. */
  const __m512i up01 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
  const __m512i down23 = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
  const int8_t *scales = (const int8_t *)(blk + 192);
  __m256i scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)scales));
  __m512i sum[QX_WIDE];
  _Pragma("GCC unroll 4") for (int r = 0; r < X; r++) sum[r] = _mm512_setzero_si512();
  for (int half = 0; half < 2; half++) {
    const uint8_t *ql = blk + 64 * half, *qh = blk + 128 + 32 * half;
    __m512i l = _mm512_loadu_si512((const void *)ql);
    __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qh));
    __m512i q01 = _mm512_or_si512(_mm512_and_si512(l, low), _mm512_and_si512(_mm512_sllv_epi16(h, up01), high));
    __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), low),
                                  _mm512_and_si512(_mm512_srlv_epi16(h, down23), high));
    __m512i s01 = QX(q6_K_scales2)(scales + 8 * half), s23 = QX(q6_K_scales2)(scales + 8 * half + 4);
    _Pragma("GCC unroll 4") for (int r = 0; r < X; r++) {
      const int8_t *qx = a->q + xr[r] * k + 256 * b + 128 * half;
      __m512i p01 = _mm512_maddubs_epi16(q01, _mm512_loadu_si512((const void *)qx));
      __m512i p23 = _mm512_maddubs_epi16(q23, _mm512_loadu_si512((const void *)(qx + 64)));
      sum[r] = _mm512_add_epi32(sum[r], _mm512_add_epi32(_mm512_madd_epi16(p01, s01), _mm512_madd_epi16(p23, s23)));
    }
  }
  _Pragma("GCC unroll 4") for (int r = 0; r < X; r++) {
    __m256i sx = _mm256_loadu_si256((const __m256i *)(a->sum16 + xr[r] * (k / 16) + 16 * b));
    lanes[r] = _mm256_add_epi32(_mm512_castsi512_si256(sum[r]), _mm512_extracti64x4_epi64(sum[r], 1));
    lanes[r] = _mm256_sub_epi32(lanes[r], _mm256_slli_epi32(_mm256_madd_epi16(scales16, sx), 5));
  }
}
#else
/* The 8 lanes of super-block blk against activation rows xr[0..X), super-block b of each: one
 * part of 32 per 256-bit register. */
QX_FN inline __attribute__((always_inline)) void QX(q6_K_lanes)(const uint8_t *blk, const rk_qrows *a,
                                                                const int64_t *xr, int X, int64_t b, __m256i *lanes) {
  const int64_t k = a->k;
  const __m256i low = _mm256_set1_epi8(0xf), high = _mm256_set1_epi8(0x30);
  const int8_t *scales = (const int8_t *)(blk + 192);
  __m256i scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)scales));
  _Pragma("GCC unroll 4") for (int r = 0; r < X; r++) {
    __m256i sx = _mm256_loadu_si256((const __m256i *)(a->sum16 + xr[r] * (k / 16) + 16 * b));
    lanes[r] = _mm256_slli_epi32(_mm256_sub_epi32(_mm256_setzero_si256(), _mm256_madd_epi16(scales16, sx)), 5);
  }
  for (int half = 0; half < 2; half++) {
    const uint8_t *ql = blk + 64 * half, *qh = blk + 128 + 32 * half;
    __m256i l0 = _mm256_loadu_si256((const __m256i *)ql), l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
    __m256i h = _mm256_loadu_si256((const __m256i *)qh);
    __m256i q[4] = {
        _mm256_or_si256(_mm256_and_si256(l0, low), _mm256_and_si256(_mm256_slli_epi16(h, 4), high)),
        _mm256_or_si256(_mm256_and_si256(l1, low), _mm256_and_si256(_mm256_slli_epi16(h, 2), high)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low), _mm256_and_si256(h, high)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low), _mm256_and_si256(_mm256_srli_epi16(h, 2), high)),
    };
    _Pragma("GCC unroll 4") for (int part = 0; part < 4; part++) {
      const int8_t *sc = scales + 8 * half + 2 * part;
      __m256i s = _mm256_set_m128i(_mm_set1_epi16(sc[1]), _mm_set1_epi16(sc[0]));
      _Pragma("GCC unroll 4") for (int r = 0; r < X; r++) {
        const int8_t *qx = a->q + xr[r] * k + 256 * b + 128 * half + 32 * part;
        __m256i p = _mm256_maddubs_epi16(q[part], _mm256_loadu_si256((const __m256i *)qx));
        lanes[r] = _mm256_add_epi32(lanes[r], _mm256_madd_epi16(p, s));
      }
    }
  }
}
#endif

QX_KERNEL_PAIR(q6_K, NULL, 0, QX_INT_WIDE, {
  const int64_t k = a->k;
  __m256 acc[4][QX_WIDE];
  _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) _Pragma("GCC unroll 4") for (int r = 0; r < X; r++)
      acc[c][r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < k / 256; b++) {
    _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) {
      const uint8_t *blk = wr[c] + 210 * b;
      QX_PREFETCH_BLOCK(blk, ahead, X, 210);
      __m256i lanes[QX_WIDE];
      QX(q6_K_lanes)(blk, a, xr, X, b, lanes);
      float d = QX(half)(blk + 208);
      _Pragma("GCC unroll 4") for (int r = 0; r < X; r++)
          acc[c][r] = _mm256_fmadd_ps(_mm256_set1_ps(d * a->d[xr[r] * (k / 256) + b]), _mm256_cvtepi32_ps(lanes[r]), acc[c][r]);
    }
  }
  for (int c = 0; c < C; c++)
    for (int r = 0; r < X; r++) res[c][r] = QX(hsum)(acc[c][r]);
})

QX_TILES(f32)
QX_TILES(f16)
QX_TILES(q8_0)
QX_TILES(q4_0)
QX_TILES(q4_K)
QX_TILES(q6_K)

/* ---- q4_0x8: eight rows regrouped, one row per int32 lane ----------------------------------------- */

/* Per block: the 8 rows' values unpacked once (4 loads: for j, 8 rows x 4 bytes = values 4j..4j+3
 * in the low nibbles, 16 + 4j.. in the high ones), then for each activation row 8 products with
 * 4 activation values broadcast to every lane, started at minus 8 times the block's sum, scaled
 * by the 8 rows' scales at once. Lane c sums row c's blocks in order, as the portable code does. */
#define QX_X8_KERNEL(X)                                                                                      \
  {                                                                                                          \
    const int64_t k = a->k;                                                                                  \
    const __m256i low = _mm256_set1_epi8(0xf);                                                               \
    __m256 acc[QX_INT_WIDE];                                                                                     \
    _Pragma("GCC unroll 4") for (int r = 0; r < (X); r++) acc[r] = _mm256_setzero_ps();                      \
    for (int64_t b = 0; b < k / 32; b++) {                                                                   \
      const uint8_t *blk = group + 144 * b;                                                                  \
      if ((X) == 1) QX_PREFETCH_BLOCK(blk, QX_X8_AHEAD, 1, 144);                                               \
      __m256 scales = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));                                \
      __m256i lo[4], hi[4];                                                                                  \
      _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {                                                  \
        __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * j));                               \
        lo[j] = _mm256_and_si256(v, low);                                                                    \
        hi[j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);                                              \
      }                                                                                                      \
      _Pragma("GCC unroll 4") for (int r = 0; r < (X); r++) {                                                \
        const int8_t *qx = a->q + xr[r] * k + 32 * b;                                                     \
        const int16_t *s16 = a->sum16 + xr[r] * (k / 16) + 2 * b;                                         \
        __m256i p = _mm256_set1_epi32(-8 * (s16[0] + s16[1])), p16 = _mm256_setzero_si256();                 \
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {                                                \
          int32_t x0, x1;                                                                                    \
          __builtin_memcpy(&x0, qx + 4 * j, 4);                                                              \
          __builtin_memcpy(&x1, qx + 16 + 4 * j, 4);                                                         \
          if (QX_NIBBLE_SUMS16) {                                                                            \
            p16 = QX_NIBBLE_DOT16(p16, lo[j], _mm256_set1_epi32(x0));                                        \
            p16 = QX_NIBBLE_DOT16(p16, hi[j], _mm256_set1_epi32(x1));                                        \
          } else {                                                                                           \
            p = QX_DOT(p, lo[j], _mm256_set1_epi32(x0));                                                     \
            p = QX_DOT(p, hi[j], _mm256_set1_epi32(x1));                                                     \
          }                                                                                                  \
        }                                                                                                    \
        if (QX_NIBBLE_SUMS16) p = _mm256_add_epi32(p, _mm256_madd_epi16(p16, _mm256_set1_epi16(1)));        \
        __m256 d = _mm256_mul_ps(scales, _mm256_set1_ps(a->d[xr[r] * (k / 32) + b]));                     \
        acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[r]);                                          \
      }                                                                                                      \
    }                                                                                                        \
    _Pragma("GCC unroll 4") for (int r = 0; r < (X); r++) _mm256_storeu_ps(res + 8 * r, acc[r]);             \
  }

QX_FN void QX(q4_0x8_one)(const uint8_t *group, const rk_qrows *a, const int64_t *xr, float *res) QX_X8_KERNEL(1)
QX_FN void QX(q4_0x8_wide)(const uint8_t *group, const rk_qrows *a, const int64_t *xr, float *res) QX_X8_KERNEL(QX_INT_WIDE)
QX_FN void QX(q4_0x8_pair)(const uint8_t *group, const rk_qrows *a, const int64_t *xr, float *res) QX_X8_KERNEL(2)

/* ---- q8_0x8: eight rows regrouped, one row per int32 lane ----------------------------------------- */

#define QX_Q8X8_KERNEL(X)                                                                                    \
  {                                                                                                          \
    const int64_t k = a->k;                                                                                  \
    __m256 acc[QX_INT_WIDE];                                                                                     \
    _Pragma("GCC unroll 4") for (int r = 0; r < (X); r++) acc[r] = _mm256_setzero_ps();                      \
    for (int64_t b = 0; b < k / 32; b++) {                                                                   \
      const uint8_t *blk = group + 272 * b;                                                                  \
      if ((X) == 1) QX_PREFETCH_BLOCK(blk, QX_X8_AHEAD, 1, 272);                                             \
      __m256 scales = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));                                \
      __m256i v[8];                                                                                          \
      _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) v[j] = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * j)); \
      _Pragma("GCC unroll 4") for (int r = 0; r < (X); r++) {                                                \
        const int8_t *qx = a->q + xr[r] * k + 32 * b;                                                     \
        const int16_t *s16 = a->sum16 + xr[r] * (k / 16) + 2 * b;                                         \
        __m256i p = QX_SIGNED_START(s16[0] + s16[1]);                                                        \
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {                                                \
          int32_t x4;                                                                                        \
          __builtin_memcpy(&x4, qx + 4 * j, 4);                                                              \
          p = QX_SIGNED_DOT(p, v[j], _mm256_set1_epi32(x4));                                                 \
        }                                                                                                    \
        __m256 d = _mm256_mul_ps(scales, _mm256_set1_ps(a->d[xr[r] * (k / 32) + b]));                     \
        acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[r]);                                          \
      }                                                                                                      \
    }                                                                                                        \
    _Pragma("GCC unroll 4") for (int r = 0; r < (X); r++) _mm256_storeu_ps(res + 8 * r, acc[r]);             \
  }

QX_FN void QX(q8_0x8_one)(const uint8_t *group, const rk_qrows *a, const int64_t *xr, float *res) QX_Q8X8_KERNEL(1)
QX_FN void QX(q8_0x8_wide)(const uint8_t *group, const rk_qrows *a, const int64_t *xr, float *res) QX_Q8X8_KERNEL(QX_INT_WIDE)
QX_FN void QX(q8_0x8_pair)(const uint8_t *group, const rk_qrows *a, const int64_t *xr, float *res) QX_Q8X8_KERNEL(2)

/* ---- q4_Kx8: eight rows regrouped, one row per int32 lane ----------------------------------------- */

/* Per super-block: for each sub-block, 8 products per activation row accumulate the 8 rows' sums
 * of 32 values in their lanes, which are then multiplied by the 8 rows' scales (exact, in
 * integers); the minimums' products use the activation's sums of 32. The floats take the sums
 * per 64 values for paired rows (quant.h), per 256 for the others. */
#define QX_KX8_KERNEL(X)                                                                                       \
  {                                                                                                            \
    const int64_t k = a->k;                                                                                    \
    const __m256i low = _mm256_set1_epi8(0xf);                                                                 \
    __m256 acc[QX_INT_WIDE], mins[QX_INT_WIDE];                                                                        \
    _Pragma("GCC unroll 4") for (int r = 0; r < (X); r++) acc[r] = _mm256_setzero_ps(), mins[r] = acc[r];      \
    for (int64_t b = 0; b < k / 256; b++) {                                                                    \
      const uint8_t *blk = group + 1184 * b;                                                                   \
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));                                 \
      const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16)));                       \
      __m256 scale[QX_INT_WIDE], scale_min[QX_INT_WIDE];                                                               \
      _Pragma("GCC unroll 4") for (int r = 0; r < (X); r++) {                                                  \
        __m256 dx = _mm256_set1_ps(a->d[xr[r] * (k / 256) + b]);                                               \
        scale[r] = _mm256_mul_ps(d, dx), scale_min[r] = _mm256_mul_ps(dmin, dx);                               \
      }                                                                                                        \
      __m256i sum[QX_INT_WIDE], msum[QX_INT_WIDE];                                                                     \
      _Pragma("GCC unroll 4") for (int r = 0; r < (X); r++) sum[r] = _mm256_setzero_si256(), msum[r] = sum[r]; \
      for (int ch = 0; ch < 4; ch++) {                                                                         \
        __m256i lo[8], hi[8];                                                                                  \
        if ((X) == 1) QX_PREFETCH_BLOCK(blk + 296 * ch, QX_X8_AHEAD, 1, 296);                                  \
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {                                                  \
          __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 160 + 256 * ch + 32 * j));                    \
          lo[j] = _mm256_and_si256(v, low);                                                                    \
          hi[j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);                                              \
        }                                                                                                      \
        __m256i slo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 32 + 16 * ch)));            \
        __m256i shi = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 40 + 16 * ch)));            \
        __m256i mlo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 96 + 16 * ch)));            \
        __m256i mhi = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 104 + 16 * ch)));           \
        /* Each lane's scale in both its 16-bit halves: multiplying the pairs' sums by it adds them. */      \
        const __m256i slo16 = _mm256_or_si256(slo, _mm256_slli_epi32(slo, 16));                                \
        const __m256i shi16 = _mm256_or_si256(shi, _mm256_slli_epi32(shi, 16));                                \
        _Pragma("GCC unroll 4") for (int r = 0; r < (X); r++) {                                                \
          const int8_t *qx = a->q + xr[r] * k + 256 * b + 64 * ch;                                          \
          const int16_t *sx = a->sum16 + xr[r] * (k / 16) + 16 * b + 4 * ch;                                \
          __m256i tlo = _mm256_setzero_si256(), thi = tlo;                                                     \
          _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {                                                \
            int32_t x0, x1;                                                                                    \
            __builtin_memcpy(&x0, qx + 4 * j, 4);                                                              \
            __builtin_memcpy(&x1, qx + 32 + 4 * j, 4);                                                         \
            if (QX_NIBBLE_SUMS16) {                                                                            \
              tlo = QX_NIBBLE_DOT16(tlo, lo[j], _mm256_set1_epi32(x0));                                        \
              thi = QX_NIBBLE_DOT16(thi, hi[j], _mm256_set1_epi32(x1));                                        \
            } else {                                                                                           \
              tlo = QX_DOT(tlo, lo[j], _mm256_set1_epi32(x0));                                                 \
              thi = QX_DOT(thi, hi[j], _mm256_set1_epi32(x1));                                                 \
            }                                                                                                  \
          }                                                                                                    \
          if (QX_NIBBLE_SUMS16)                                                                                \
            sum[r] = _mm256_add_epi32(sum[r], _mm256_add_epi32(_mm256_madd_epi16(tlo, slo16), _mm256_madd_epi16(thi, shi16))); \
          else                                                                                                 \
            sum[r] = _mm256_add_epi32(sum[r], _mm256_add_epi32(_mm256_mullo_epi32(tlo, slo), _mm256_mullo_epi32(thi, shi))); \
          __m256i m = _mm256_add_epi32(_mm256_mullo_epi32(mlo, _mm256_set1_epi32(sx[0] + sx[1])),              \
                                       _mm256_mullo_epi32(mhi, _mm256_set1_epi32(sx[2] + sx[3])));             \
          msum[r] = _mm256_add_epi32(msum[r], m);                                                              \
          if (xr[r] < a->paired_rows || ch == 3) {                                                             \
            acc[r] = _mm256_fmadd_ps(scale[r], _mm256_cvtepi32_ps(sum[r]), acc[r]);                            \
            mins[r] = _mm256_fmadd_ps(scale_min[r], _mm256_cvtepi32_ps(msum[r]), mins[r]);                     \
            sum[r] = _mm256_setzero_si256(), msum[r] = sum[r];                                                 \
          }                                                                                                    \
        }                                                                                                      \
      }                                                                                                        \
    }                                                                                                          \
    _Pragma("GCC unroll 4") for (int r = 0; r < (X); r++) _mm256_storeu_ps(res + 8 * r, _mm256_sub_ps(acc[r], mins[r])); \
  }

QX_FN void QX(q4_Kx8_one)(const uint8_t *group, const rk_qrows *a, const int64_t *xr, float *res) QX_KX8_KERNEL(1)
QX_FN void QX(q4_Kx8_wide)(const uint8_t *group, const rk_qrows *a, const int64_t *xr, float *res) QX_KX8_KERNEL(QX_INT_WIDE)
QX_FN void QX(q4_Kx8_pair)(const uint8_t *group, const rk_qrows *a, const int64_t *xr, float *res) QX_KX8_KERNEL(2)

/* The tile function of a regrouped format: activation rows QX_INT_WIDE at a time, then one by one. */
#define QX_TILE8(format)                                                                                       \
  QX_FN void QX(tile_##format)(const uint8_t *group, const rk_qrows *a, int64_t r0, int xrows, float *out,     \
                               int64_t out_stride) {                                                           \
    for (int r = 0; r < xrows;) {                                                                              \
      float res[8 * QX_INT_WIDE];                                                                                  \
      int64_t xr[QX_INT_WIDE];                                                                                     \
      int left = xrows - r, take = left >= QX_INT_WIDE ? QX_INT_WIDE : left >= 2 ? 2 : 1;                              \
      for (int i = 0; i < QX_INT_WIDE; i++) xr[i] = r0 + r + (i < take ? i : take - 1);                            \
      if (take == QX_INT_WIDE) QX(format##_wide)(group, a, xr, res);                                               \
      else if (take == 2) QX(format##_pair)(group, a, xr, res);                                                \
      else QX(format##_one)(group, a, xr, res);                                                                \
      for (int i = 0; i < take; i++)                                                                           \
        for (int c = 0; c < 8; c++) out[(r + i) * out_stride + c] = res[8 * i + c];                            \
      r += take;                                                                                               \
    }                                                                                                          \
  }
QX_TILE8(q4_0x8)
QX_TILE8(q4_Kx8)
QX_TILE8(q8_0x8)

static const rk_qdots QX(qdots) = {
    /* No one-row dot products: every format here has a tile, which dense_q always takes. */
    {NULL},
    {QX(tile_f32), QX(tile_f16), QX(tile_q8_0), QX(tile_q4_0), QX(tile_q4_K), QX(tile_q6_K), NULL, NULL, NULL},
    {[RK_Q_Q4_0X8] = QX(tile_q4_0x8), [RK_Q_Q4_KX8] = QX(tile_q4_Kx8), [RK_Q_Q8_0X8] = QX(tile_q8_0x8)},
    QX_TILE16,
    {[RK_Q_F16] = QX_F16_STREAM_FN},
    {[RK_Q_F32] = QX_F32_DECODE_PARTS},
};

#undef QX_FN
#undef QX_TILES
#undef QX_KERNEL_PAIR
#undef QX_PREFETCH_BLOCK
#undef QX_FLOAT_KERNEL
#undef QX_BLOCK32_KERNEL
#undef QX_Q4_0_START
#undef QX_Q4_0_PRODUCT
#undef QX_Q8_0_START
#undef QX_Q8_0_PRODUCT
#undef QX_LOAD_F32
#undef QX_TAIL_F32
#undef QX_LOAD_F16
#undef QX_TAIL_F16
#undef QX_X8_KERNEL
#undef QX_KX8_KERNEL
#undef QX_Q8X8_KERNEL
#undef QX_FLOAT_ROW
#undef QX_F16_STREAM_FN
#undef QX_TILE8
