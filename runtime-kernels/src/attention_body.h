/*
 * attention_body.h: the inner loops of attention.c, included once per instruction set with
 * AT(name) (the instance's names), AT_FN (its function attributes), AT_W (lanes per vector),
 * AT_V (the vector type), AT_ZERO, AT_LOAD(p), AT_STORE(p, v), AT_SPLAT(x), AT_MADD(acc, a, b)
 * (acc + a * b: fused where the instruction set has it) for the weighted sums of values, and
 * AT_SW, AT_SV, AT_SZERO, AT_SLOAD, AT_SMADD and AT_SSUM (the lanes added in a fixed order) for
 * the dot products of the scores. Each unit's sums are taken in an order fixed by the head dim
 * and the instance, so a unit's bits never depend on the thread count; and since the value sums
 * run lane by lane, AVX-512 (16 lanes there, AVX2's 8-lane dot products) gives AVX2's bits.
 * The AT_S* default to the value sums' vectors. Every AT_* is undefined at the end.
 */
#ifndef AT_SW
#define AT_SW AT_W
#define AT_SV AT_V
#define AT_SZERO AT_ZERO
#define AT_SLOAD AT_LOAD
#define AT_SMADD AT_MADD
#endif

/* s[r] = q . k[r] for n rows of d values a stride apart. Eight rows at a time where the instance
 * adds eight rows' lanes together (AT_SSUM8: each row's lanes in AT_SSUM's order, so the same
 * bits), then four, then one; each row's sum is taken in the same order either way. */
AT_FN static inline __attribute__((always_inline)) void AT(scores)(const float *q, const float *k, int64_t n,
                                                                  int64_t stride, int64_t d, float *s) {
  int64_t r = 0, whole = d / AT_SW * AT_SW;
#ifdef AT_SSUM8
  for (; r + 8 <= n; r += 8) {
    AT_SV a[8];
    for (int i = 0; i < 8; i++) a[i] = AT_SZERO;
    const float *rows = k + r * stride;
    for (int64_t c = 0; c < whole; c += AT_SW) {
      AT_SV x = AT_SLOAD(q + c);
      for (int i = 0; i < 8; i++) a[i] = AT_SMADD(a[i], x, AT_SLOAD(rows + i * stride + c));
    }
    AT_SSUM8(a, s + r);
    for (int64_t c = whole; c < d; c++)
      for (int i = 0; i < 8; i++) s[r + i] += q[c] * rows[i * stride + c];
  }
#endif
  for (; r + 4 <= n; r += 4) {
    AT_SV a0 = AT_SZERO, a1 = AT_SZERO, a2 = AT_SZERO, a3 = AT_SZERO;
    const float *k0 = k + r * stride, *k1 = k0 + stride, *k2 = k1 + stride, *k3 = k2 + stride;
    for (int64_t c = 0; c < whole; c += AT_SW) {
      AT_SV x = AT_SLOAD(q + c);
      a0 = AT_SMADD(a0, x, AT_SLOAD(k0 + c));
      a1 = AT_SMADD(a1, x, AT_SLOAD(k1 + c));
      a2 = AT_SMADD(a2, x, AT_SLOAD(k2 + c));
      a3 = AT_SMADD(a3, x, AT_SLOAD(k3 + c));
    }
    s[r] = AT_SSUM(a0), s[r + 1] = AT_SSUM(a1), s[r + 2] = AT_SSUM(a2), s[r + 3] = AT_SSUM(a3);
    for (int64_t c = whole; c < d; c++) {
      s[r] += q[c] * k0[c], s[r + 1] += q[c] * k1[c], s[r + 2] += q[c] * k2[c], s[r + 3] += q[c] * k3[c];
    }
  }
  for (; r < n; r++) {
    const float *row = k + r * stride;
    AT_SV a = AT_SZERO;
    for (int64_t c = 0; c < whole; c += AT_SW) a = AT_SMADD(a, AT_SLOAD(q + c), AT_SLOAD(row + c));
    s[r] = AT_SSUM(a);
    for (int64_t c = whole; c < d; c++) s[r] += q[c] * row[c];
  }
}

/* acc += p[0] * v[0] + p[1] * v[1] + ... over n rows of d values (a stride apart), in that
 * order for each value. 64 values at a time stay in registers across the rows, as independent
 * sums, so the adds do not wait on each other from row to row. */
AT_FN static inline void AT(accumulate)(float *acc, const float *p, const float *v, int64_t n, int64_t stride,
                                        int64_t d) {
  enum { BLOCK = 64 / AT_W };
  int64_t c = 0;
  for (; c + 64 <= d; c += 64) {
    AT_V a[BLOCK];
    for (int i = 0; i < BLOCK; i++) a[i] = AT_LOAD(acc + c + AT_W * i);
    for (int64_t r = 0; r < n; r++) {
      AT_V weight = AT_SPLAT(p[r]);
      const float *row = v + r * stride + c;
      for (int i = 0; i < BLOCK; i++) a[i] = AT_MADD(a[i], weight, AT_LOAD(row + AT_W * i));
    }
    for (int i = 0; i < BLOCK; i++) AT_STORE(acc + c + AT_W * i, a[i]);
  }
  for (; c + AT_W <= d; c += AT_W) {
    AT_V sum = AT_LOAD(acc + c);
    for (int64_t r = 0; r < n; r++) sum = AT_MADD(sum, AT_SPLAT(p[r]), AT_LOAD(v + r * stride + c));
    AT_STORE(acc + c, sum);
  }
  for (; c < d; c++)
    for (int64_t r = 0; r < n; r++) acc[c] += p[r] * v[r * stride + c];
}

#ifndef AT_HEADS
#define AT_HEADS 1
#endif

/* accumulate for AT_HEADS query heads at once (acc[h] += p[h][r] * v[r] ...), each head's sums in
 * accumulate's order: the value rows are loaded once for all of them, and the heads' sums are
 * independent chains, so the multiply-adds no longer wait on each other (one head's 64 values
 * are only 64 / AT_W chains, fewer than the multiply-add's latency needs). */
AT_FN static inline void AT(accumulate_heads)(float (*acc)[MAX_HEAD_DIM], const float (*p)[CHUNK], const float *v,
                                              int64_t n, int64_t stride, int64_t d) {
  enum { BLOCK = 64 / AT_W };
  int64_t c = 0;
  for (; c + 64 <= d; c += 64) {
    AT_V a[AT_HEADS][BLOCK];
    for (int h = 0; h < AT_HEADS; h++)
      for (int i = 0; i < BLOCK; i++) a[h][i] = AT_LOAD(acc[h] + c + AT_W * i);
    for (int64_t r = 0; r < n; r++) {
      const float *row = v + r * stride + c;
      AT_V values[BLOCK];
      for (int i = 0; i < BLOCK; i++) values[i] = AT_LOAD(row + AT_W * i);
      for (int h = 0; h < AT_HEADS; h++) {
        AT_V weight = AT_SPLAT(p[h][r]);
        for (int i = 0; i < BLOCK; i++) a[h][i] = AT_MADD(a[h][i], weight, values[i]);
      }
    }
    for (int h = 0; h < AT_HEADS; h++)
      for (int i = 0; i < BLOCK; i++) AT_STORE(acc[h] + c + AT_W * i, a[h][i]);
  }
  if (c < d)
    for (int h = 0; h < AT_HEADS; h++) AT(accumulate)(acc[h] + c, p[h], v + c, n, stride, d - c);
}

/* One unit: query row t's heads of KV head g, over the first `limit` key rows of sequence b;
 * AT_HEADS heads side by side while that many remain, then one at a time (the same bits). */
AT_FN static inline void AT(attend)(const attn_job *j, int64_t t, int64_t g, int64_t b, int64_t limit) {
  int64_t group = j->hq / j->hkv, d = j->d;
  for (int64_t h0 = g * group; h0 < (g + 1) * group;) {
    int heads = (g + 1) * group - h0 >= AT_HEADS ? AT_HEADS : 1;
    if (limit <= 0) {
      for (int64_t h = h0; h < h0 + heads; h++) {
        memset(j->out + (t * j->hq + h) * d, 0, sizeof(float) * (size_t)d);
        j->lse[t * j->hq + h] = EMPTY_LSE;
      }
      h0 += heads;
      continue;
    }
    float acc[AT_HEADS][MAX_HEAD_DIM], s[AT_HEADS][CHUNK], m[AT_HEADS], sum[AT_HEADS];
    for (int h = 0; h < heads; h++) {
      memset(acc[h], 0, sizeof(float) * (size_t)d);
      m[h] = -INFINITY, sum[h] = 0.0f;
    }
    for (int64_t r0 = 0; r0 < limit;) {
      const float *k, *v;
      int64_t stride, n;
      if (j->pages) {
        int64_t page = j->page_ids[j->page_indptr[b] + r0 / j->page_size], slot = r0 % j->page_size;
        k = j->pages + ((page * 2 * j->hkv + g) * j->page_size + slot) * d;
        v = k + j->hkv * j->page_size * d;
        stride = d;
        n = j->page_size - slot;
      } else {
        int64_t row = j->kv_indptr[b] + r0;
        k = j->k + (row * j->hkv + g) * d;
        v = j->v + (row * j->hkv + g) * d;
        stride = j->hkv * d;
        n = limit - r0;
      }
      if (n > CHUNK) n = CHUNK;
      if (n > limit - r0) n = limit - r0;
      for (int h = 0; h < heads; h++) {
        float *sh = s[h];
        const float *q = j->q + (t * j->hq + h0 + h) * d;
        /* The common head dim as a constant: its loops unroll. */
        if (d == 64) AT(scores)(q, k, n, stride, 64, sh);
        else AT(scores)(q, k, n, stride, d, sh);
        float top = -INFINITY;
        for (int64_t r = 0; r < n; r++) {
          sh[r] *= j->sm_scale;
          top = sh[r] > top ? sh[r] : top;
        }
        if (top > m[h]) {
          /* A larger maximum: what was summed so far shrinks to its weight under the new one. */
          float keep = m[h] == -INFINITY ? 0.0f : rk_exp(m[h] - top);
          for (int64_t c = 0; c < d; c++) acc[h][c] *= keep;
          sum[h] *= keep;
          m[h] = top;
        }
        for (int64_t r = 0; r < n; r++) sh[r] = rk_exp(sh[r] - m[h]);
        for (int64_t r = 0; r < n; r++) sum[h] += sh[r];
      }
      if (heads == AT_HEADS) AT(accumulate_heads)(acc, (const float (*)[CHUNK])s, v, n, stride, d);
      else AT(accumulate)(acc[0], s[0], v, n, stride, d);
      r0 += n;
    }
    for (int h = 0; h < heads; h++) {
      float inverse = 1.0f / sum[h], *o = j->out + (t * j->hq + h0 + h) * d;
      for (int64_t c = 0; c < d; c++) o[c] = acc[h][c] * inverse;
      j->lse[t * j->hq + h0 + h] = m[h] * LOG2E + log2f(sum[h]);
    }
    h0 += heads;
  }
}

/* Units u = task, task + num_tasks, ...: (row u / hkv, KV head u % hkv). */
AT_FN static void AT(attend_units)(const attn_job *j, int task, int num_tasks) {
  for (int64_t u = task; u < j->rows * j->hkv; u += num_tasks) {
    int64_t t = u / j->hkv, g = u % j->hkv, b = sequence_of(j, t);
    AT(attend)(j, t, g, b, visible_rows(j, t, b));
  }
}

#undef AT
#undef AT_FN
#undef AT_W
#undef AT_V
#undef AT_ZERO
#undef AT_LOAD
#undef AT_STORE
#undef AT_SPLAT
#undef AT_MADD
#undef AT_SW
#undef AT_SV
#undef AT_SZERO
#undef AT_SLOAD
#undef AT_SMADD
#undef AT_SSUM
#undef AT_SSUM8
#undef AT_HEADS
