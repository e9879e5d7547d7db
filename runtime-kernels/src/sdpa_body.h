/*
 * sdpa_body.h: the inner loops of sdpa.c, included once per instruction set with SD(name) (the
 * instance's names), SD_FN (its function attributes), SD_W (lanes per vector), SD_V (the vector
 * type), SD_ZERO, SD_LOAD(p), SD_STORE(p, v), SD_SPLAT(x), SD_MUL(a, b), SD_MAX(a, b) (a where
 * a > b, else b), SD_ADD, SD_SUB, SD_MADD(acc, a, b) (acc + a * b: fused where the instruction set
 * has it), SD_MR (query rows in registers at once) and, optionally, SD_EXP(v) (e^v lane by lane;
 * without it rk_exp one value at a time). Every result is a chain of operations
 * in a fixed order that does not depend on SD_W. Every SD_* is undefined at the end.
 */

/* The scores of SD_MR query rows (q: [SD_MR][d]) against keys [0, keys) of kt ([d][kstride],
 * keys a multiple of 2 * SD_W): s[r][j] = q[r][0] kt[0][j] + q[r][1] kt[1][j] + ..., in that
 * order. */
SD_FN static void SD(scores)(const float *q, int64_t d, const float *kt, int64_t kstride, int64_t keys, float *s) {
  for (int64_t j = 0; j < keys; j += 2 * SD_W) {
    SD_V acc[SD_MR][2];
    for (int r = 0; r < SD_MR; r++) acc[r][0] = acc[r][1] = SD_ZERO;
    const float *col = kt + j;
    for (int64_t i = 0; i < d; i++, col += kstride) {
      SD_V b0 = SD_LOAD(col), b1 = SD_LOAD(col + SD_W);
      for (int r = 0; r < SD_MR; r++) {
        SD_V a = SD_SPLAT(q[r * d + i]);
        acc[r][0] = SD_MADD(acc[r][0], a, b0);
        acc[r][1] = SD_MADD(acc[r][1], a, b1);
      }
    }
    for (int r = 0; r < SD_MR; r++) {
      SD_STORE(s + r * SDPA_KC + j, acc[r][0]);
      SD_STORE(s + r * SDPA_KC + j + SD_W, acc[r][1]);
    }
  }
}

/* One chunk's softmax step for each row: the scores scaled and masked, the running maximum m
 * moved to cover them, exp(score - m) in place of each (zeros past n up to padded), the running
 * sum l rescaled and added to, and corr[r] = exp(old m - new m) for the values' sums. */
SD_FN static void SD(softmax_chunk)(const sdpa_rows *rows, float *s, int64_t n, int64_t padded, float *m, float *l,
                                    float *corr) {
  for (int r = 0; r < SD_MR; r++) {
    float *row = s + r * SDPA_KC;
    const float *mask = rows->mask[r];
    float alpha = rows->alpha;
    if (mask && rows->mask_cs == 1)
      for (int64_t j = 0; j < n; j++) row[j] = row[j] * alpha + mask[j];
    else if (mask)
      for (int64_t j = 0; j < n; j++) row[j] = row[j] * alpha + mask[j * rows->mask_cs];
    else
      for (int64_t j = 0; j < n; j++) row[j] = row[j] * alpha;
    /* Keys past n (to the padded end) are -inf: they take no weight, and every loop below runs
     * in whole vectors. The maximum is exact in any order. */
    for (int64_t j = n; j < padded; j++) row[j] = -__builtin_inff();
    SD_V most = SD_SPLAT(row[0]);
    for (int64_t j = 0; j < padded; j += SD_W) most = SD_MAX(SD_LOAD(row + j), most);
    float lanes[SDPA_LANES], top = m[r];
    SD_STORE(lanes, most);
    for (int i = 0; i < SD_W; i++) top = lanes[i] > top ? lanes[i] : top;
    corr[r] = rk_exp(m[r] - top);
    m[r] = top;
#ifdef SD_EXP
    /* SDPA_LANES sums as SDPA_LANES / SD_W vectors, so every width adds the same values. */
    SD_V sums[SDPA_LANES / SD_W], shift = SD_SPLAT(top);
    for (int h = 0; h < SDPA_LANES / SD_W; h++) sums[h] = SD_ZERO;
    for (int64_t j = 0; j < padded; j += SDPA_LANES)
      for (int h = 0; h < SDPA_LANES / SD_W; h++) {
        SD_V e = SD_EXP(SD_SUB(SD_LOAD(row + j + h * SD_W), shift));
        SD_STORE(row + j + h * SD_W, e);
        sums[h] = SD_ADD(sums[h], e);
      }
    for (int h = 0; h < SDPA_LANES / SD_W; h++) SD_STORE(lanes + h * SD_W, sums[h]);
#else
    for (int i = 0; i < SDPA_LANES; i++) lanes[i] = 0.0f;
    for (int64_t j = 0; j < padded; j += SDPA_LANES)
      for (int i = 0; i < SDPA_LANES; i++) {
        row[j + i] = rk_exp(row[j + i] - top);
        lanes[i] += row[j + i];
      }
#endif
    l[r] = l[r] * corr[r] + sdpa_combine(lanes);
  }
}

/* o[r][c] = o[r][c] * corr[r] + p[r][0] v[0][c] + p[r][1] v[1][c] + ..., in that order, over
 * keys [0, keys) of v ([keys][dv]) and the columns [0, dv) (dv a multiple of SD_W). */
SD_FN static void SD(values)(const float *p, int64_t keys, const float *v, int64_t dv, float *o, const float *corr) {
  int64_t c = 0;
  for (; c + 2 * SD_W <= dv; c += 2 * SD_W) {
    SD_V acc[SD_MR][2];
    for (int r = 0; r < SD_MR; r++) {
      SD_V f = SD_SPLAT(corr[r]);
      acc[r][0] = SD_MUL(SD_LOAD(o + r * dv + c), f);
      acc[r][1] = SD_MUL(SD_LOAD(o + r * dv + c + SD_W), f);
    }
    const float *row = v + c;
    for (int64_t j = 0; j < keys; j++, row += dv) {
      SD_V b0 = SD_LOAD(row), b1 = SD_LOAD(row + SD_W);
      for (int r = 0; r < SD_MR; r++) {
        SD_V a = SD_SPLAT(p[r * SDPA_KC + j]);
        acc[r][0] = SD_MADD(acc[r][0], a, b0);
        acc[r][1] = SD_MADD(acc[r][1], a, b1);
      }
    }
    for (int r = 0; r < SD_MR; r++) {
      SD_STORE(o + r * dv + c, acc[r][0]);
      SD_STORE(o + r * dv + c + SD_W, acc[r][1]);
    }
  }
  for (; c < dv; c += SD_W) {
    SD_V acc[SD_MR];
    for (int r = 0; r < SD_MR; r++) acc[r] = SD_MUL(SD_LOAD(o + r * dv + c), SD_SPLAT(corr[r]));
    const float *row = v + c;
    for (int64_t j = 0; j < keys; j++, row += dv) {
      SD_V b = SD_LOAD(row);
      for (int r = 0; r < SD_MR; r++) acc[r] = SD_MADD(acc[r], SD_SPLAT(p[r * SDPA_KC + j]), b);
    }
    for (int r = 0; r < SD_MR; r++) SD_STORE(o + r * dv + c, acc[r]);
  }
}

/* Rows [r0, r0 + count) of one batch entry, count <= SD_MR, with its keys and values packed. */
SD_FN static void SD(block)(const sdpa_job *job, const sdpa_entry *e, int64_t r0, int count, sdpa_buffers *buf) {
  int64_t d = job->d, dvp = job->dv_padded;
  sdpa_rows rows = {.alpha = job->alpha, .mask_cs = job->mask_cs};
  for (int r = 0; r < SD_MR; r++) {
    const float *src = e->q + (r0 + (r < count ? r : 0)) * job->q_rs;
    if (r >= count)
      for (int64_t i = 0; i < d; i++) buf->q[r * d + i] = 0.0f;
    else if (job->q_cs == 1)
      __builtin_memcpy(buf->q + r * d, src, (size_t)d * sizeof(float));
    else
      for (int64_t i = 0; i < d; i++) buf->q[r * d + i] = src[i * job->q_cs];
    rows.mask[r] = e->mask ? e->mask + (r0 + (r < count ? r : 0)) * job->mask_rs : NULL;
    buf->m[r] = -__builtin_inff();
    buf->l[r] = 0.0f;
  }
  for (int64_t i = 0; i < SD_MR * dvp; i++) buf->o[i] = 0.0f;
  for (int64_t k0 = 0; k0 < job->sk; k0 += SDPA_KC) {
    int64_t n = job->sk - k0 < SDPA_KC ? job->sk - k0 : SDPA_KC;
    int64_t padded = (n + SDPA_KEY_STEP - 1) / SDPA_KEY_STEP * SDPA_KEY_STEP;
    SD(scores)(buf->q, d, buf->kt + k0, job->sk_padded, padded, buf->s);
    sdpa_rows chunk = rows;
    for (int r = 0; r < SD_MR; r++) chunk.mask[r] = rows.mask[r] ? rows.mask[r] + k0 * job->mask_cs : NULL;
    SD(softmax_chunk)(&chunk, buf->s, n, padded, buf->m, buf->l, buf->corr);
    SD(values)(buf->s, padded, buf->v + k0 * dvp, dvp, buf->o, buf->corr);
  }
  for (int r = 0; r < count; r++) {
    float inv = 1.0f / buf->l[r];
    float *dst = e->out + (r0 + r) * job->o_rs;
    const float *o = buf->o + r * dvp;
    if (job->o_cs == 1)
      for (int64_t c = 0; c < job->dv; c++) dst[c] = o[c] * inv;
    else
      for (int64_t c = 0; c < job->dv; c++) dst[c * job->o_cs] = o[c] * inv;
  }
}

#undef SD
#undef SD_FN
#undef SD_W
#undef SD_V
#undef SD_ZERO
#undef SD_LOAD
#undef SD_STORE
#undef SD_SPLAT
#undef SD_MUL
#undef SD_MADD
#undef SD_MAX
#undef SD_MR
#undef SD_ADD
#undef SD_SUB
#undef SD_EXP
