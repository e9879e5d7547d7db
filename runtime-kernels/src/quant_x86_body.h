/*
 * quant_x86_body.h: the body of quant_x86.c's dot products, included once per instruction set
 * with QX_TARGET (the target attribute), QX(name) (the instance's names) and QX_DOT (adds the
 * products of 32 unsigned bytes and 32 signed bytes, four at a time, into 8 int32 lanes).
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

QX_FN float QX(dot_f32)(const void *w, const float *x, const rk_qact *a, int64_t k) {
  (void)a;
  const float *r = w;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(r + i), _mm256_loadu_ps(x + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(r + i + 8), _mm256_loadu_ps(x + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(r + i + 16), _mm256_loadu_ps(x + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(r + i + 24), _mm256_loadu_ps(x + i + 24), acc3);
  }
  for (; i + 8 <= k; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(r + i), _mm256_loadu_ps(x + i), acc0);
  float sum = QX(hsum)(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
  for (; i < k; i++) sum = __builtin_fmaf(r[i], x[i], sum);
  return sum;
}

QX_FN float QX(dot_f16)(const void *w, const float *x, const rk_qact *a, int64_t k) {
  (void)a;
  const uint8_t *r = w;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  int64_t i = 0;
#define QX_H8(at) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + 2 * (at))))
  for (; i + 32 <= k; i += 32) {
    acc0 = _mm256_fmadd_ps(QX_H8(i), _mm256_loadu_ps(x + i), acc0);
    acc1 = _mm256_fmadd_ps(QX_H8(i + 8), _mm256_loadu_ps(x + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(QX_H8(i + 16), _mm256_loadu_ps(x + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(QX_H8(i + 24), _mm256_loadu_ps(x + i + 24), acc3);
  }
  for (; i + 8 <= k; i += 8) acc0 = _mm256_fmadd_ps(QX_H8(i), _mm256_loadu_ps(x + i), acc0);
#undef QX_H8
  float sum = QX(hsum)(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
  for (; i < k; i++) sum = __builtin_fmaf(QX(half)(r + 2 * i), x[i], sum);
  return sum;
}

/* A signed block times signed activations: |w| (unsigned) times x with w's sign. */
QX_FN inline __m256i QX(dot_signed)(__m256i w, __m256i x) {
  return QX_DOT(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

QX_FN float QX(dot_q8_0)(const void *w, const float *x, const rk_qact *a, int64_t k) {
  (void)x;
  const uint8_t *blk = w;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
  int64_t b = 0, blocks = k / 32;
  for (; b + 2 <= blocks; b += 2, blk += 68) {
    __m256i p0 = QX(dot_signed)(_mm256_loadu_si256((const __m256i *)(blk + 2)), _mm256_loadu_si256((const __m256i *)(a->q + 32 * b)));
    __m256i p1 =
        QX(dot_signed)(_mm256_loadu_si256((const __m256i *)(blk + 36)), _mm256_loadu_si256((const __m256i *)(a->q + 32 * b + 32)));
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(QX(half)(blk) * a->d[b]), _mm256_cvtepi32_ps(p0), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_set1_ps(QX(half)(blk + 34) * a->d[b + 1]), _mm256_cvtepi32_ps(p1), acc1);
  }
  for (; b < blocks; b++, blk += 34) {
    __m256i p = QX(dot_signed)(_mm256_loadu_si256((const __m256i *)(blk + 2)), _mm256_loadu_si256((const __m256i *)(a->q + 32 * b)));
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(QX(half)(blk) * a->d[b]), _mm256_cvtepi32_ps(p), acc0);
  }
  return QX(hsum)(_mm256_add_ps(acc0, acc1));
}

/* q4_0's 16 bytes as 32 signed values: low nibbles (values 0-15), then high ones, minus 8. */
QX_FN inline __m256i QX(q4_0_values)(const uint8_t *qs) {
  __m128i raw = _mm_loadu_si128((const __m128i *)qs), low = _mm_set1_epi8(0xf);
  __m256i v = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low), _mm_and_si128(raw, low));
  return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
}

QX_FN float QX(dot_q4_0)(const void *w, const float *x, const rk_qact *a, int64_t k) {
  (void)x;
  const uint8_t *blk = w;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
  int64_t b = 0, blocks = k / 32;
  for (; b + 2 <= blocks; b += 2, blk += 36) {
    __m256i p0 = QX(dot_signed)(QX(q4_0_values)(blk + 2), _mm256_loadu_si256((const __m256i *)(a->q + 32 * b)));
    __m256i p1 = QX(dot_signed)(QX(q4_0_values)(blk + 20), _mm256_loadu_si256((const __m256i *)(a->q + 32 * b + 32)));
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(QX(half)(blk) * a->d[b]), _mm256_cvtepi32_ps(p0), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_set1_ps(QX(half)(blk + 18) * a->d[b + 1]), _mm256_cvtepi32_ps(p1), acc1);
  }
  for (; b < blocks; b++, blk += 18) {
    __m256i p = QX(dot_signed)(QX(q4_0_values)(blk + 2), _mm256_loadu_si256((const __m256i *)(a->q + 32 * b)));
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(QX(half)(blk) * a->d[b]), _mm256_cvtepi32_ps(p), acc0);
  }
  return QX(hsum)(_mm256_add_ps(acc0, acc1));
}

QX_FN float QX(dot_q4_K)(const void *w, const float *x, const rk_qact *a, int64_t k) {
  (void)x;
  const uint8_t *blk = w;
  const __m256i low = _mm256_set1_epi8(0xf);
  __m256 acc = _mm256_setzero_ps();
  float mins = 0.0f;
  for (int64_t b = 0; b < k / 256; b++, blk += 144) {
    const int8_t *qx = a->q + 256 * b;
    const int16_t *sx = a->sum16 + 16 * b;
    int scale[8], min[8];
    int32_t m = 0;
    for (int j = 0; j < 8; j++) {
      rk_q4k_scale_min(j, blk + 4, &scale[j], &min[j]);
      m += min[j] * (sx[2 * j] + sx[2 * j + 1]);
    }
    __m256i sum = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
      __m256i q = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * c));
      __m256i lo = _mm256_and_si256(q, low), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
      __m256i plo = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(qx + 64 * c)));
      __m256i phi = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(qx + 64 * c + 32)));
      sum = _mm256_add_epi32(sum, _mm256_madd_epi16(plo, _mm256_set1_epi16((short)scale[2 * c])));
      sum = _mm256_add_epi32(sum, _mm256_madd_epi16(phi, _mm256_set1_epi16((short)scale[2 * c + 1])));
    }
    float dx = a->d[b];
    acc = _mm256_fmadd_ps(_mm256_set1_ps(QX(half)(blk) * dx), _mm256_cvtepi32_ps(sum), acc);
    mins = __builtin_fmaf(QX(half)(blk + 2) * dx, (float)m, mins);
  }
  return QX(hsum)(acc) - mins;
}

QX_FN float QX(dot_q6_K)(const void *w, const float *x, const rk_qact *a, int64_t k) {
  (void)x;
  const uint8_t *blk = w;
  const __m256i low = _mm256_set1_epi8(0xf), high = _mm256_set1_epi8(0x30);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < k / 256; b++, blk += 210) {
    const int8_t *scales = (const int8_t *)(blk + 192), *qx = a->q + 256 * b;
    const int16_t *sx = a->sum16 + 16 * b;
    int32_t offset = 0;
    for (int s = 0; s < 16; s++) offset += scales[s] * sx[s];
    __m256i sum = _mm256_setzero_si256();
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
      for (int part = 0; part < 4; part++) {
        const int8_t *sc = scales + 8 * half + 2 * part;
        __m256i p = _mm256_maddubs_epi16(q[part], _mm256_loadu_si256((const __m256i *)(qx + 128 * half + 32 * part)));
        __m256i s = _mm256_set_m128i(_mm_set1_epi16(sc[1]), _mm_set1_epi16(sc[0]));
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, s));
      }
    }
    sum = _mm256_sub_epi32(sum, _mm256_setr_epi32(32 * offset, 0, 0, 0, 0, 0, 0, 0));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(QX(half)(blk + 208) * a->d[b]), _mm256_cvtepi32_ps(sum), acc);
  }
  return QX(hsum)(acc);
}

static const rk_qdots QX(qdots) = {{QX(dot_f32), QX(dot_f16), QX(dot_q8_0), QX(dot_q4_0), QX(dot_q4_K), QX(dot_q6_K)}};

#undef QX_FN
