/*
 * matmul.c: relaxc.matmul (numpy's matmul over any permutation of its operands and result, with
 * broadcast batch dims) and relaxc.dense (rows times weights that relaxc.tvm prepacked), both
 * with the epilogue act(alpha * product + bias + residual).
 *
 * The permutations are what TVM's permute_dims around a matmul would have copied: attention's
 * head splits and merges (q [b, s, h, d] read as [b, h, s, d], k read transposed) become
 * strides here, and no copy is made. A batch whose rows line up in memory (x [b, s, k] times a
 * shared weight) is one product of b * s rows.
 */
#include <stdio.h>
#include <string.h>

#include "rk.h"

/* ---- relaxc.matmul ---------------------------------------------------------------------------- */

/* Everything one call needs to set up its products. */
typedef struct matmul_plan {
  int32_t batch_rank;
  int64_t batch[RK_MAX_RANK];
  int64_t a_batch[RK_MAX_RANK], b_batch[RK_MAX_RANK], c_batch[RK_MAX_RANK]; /* strides, 0 when broadcast */
  int64_t m, n, k;
  int64_t a_rs, a_cs, b_rs, b_cs, c_rs, c_cs;
} matmul_plan;

/* Batch dims that walk rows evenly (dim d's stride is the size of everything after it) fold into
 * m, when B is shared by the whole batch: [b, s, k] x [k, n] is one product of b * s rows. */
static void fold_batch_into_rows(matmul_plan *p) {
  while (p->batch_rank > 0) {
    int32_t d = p->batch_rank - 1;
    if (p->batch[d] != 1) {
      if (p->b_batch[d] != 0) return;
      if (p->a_batch[d] != p->m * p->a_rs || p->c_batch[d] != p->m * p->c_rs) return;
      p->m *= p->batch[d];
    }
    p->batch_rank--;
  }
}

static int plan_matmul(const char *kernel, const rk_view *a, const rk_view *b, const rk_view *c, matmul_plan *p) {
  char sa[96], sb[96], sc[96];
  rk_view_format(a, sa, sizeof sa);
  rk_view_format(b, sb, sizeof sb);
  if (a->ndim < 2 || b->ndim < 2)
    return rvm_raise("ValueError", "%s: operands must have rank 2 or more, got %s and %s", kernel, sa, sb);
  p->m = a->shape[a->ndim - 2];
  p->k = a->shape[a->ndim - 1];
  p->n = b->shape[b->ndim - 1];
  if (b->shape[b->ndim - 2] != p->k)
    return rvm_raise("ValueError", "%s: the reduction lengths differ: %s times %s", kernel, sa, sb);
  p->batch_rank = (a->ndim > b->ndim ? a->ndim : b->ndim) - 2;
  if (c->ndim != p->batch_rank + 2) {
    rk_view_format(c, sc, sizeof sc);
    return rvm_raise("ValueError", "%s: the result %s has the wrong rank for %s times %s", kernel, sc, sa, sb);
  }
  for (int32_t d = 0; d < p->batch_rank; d++) {
    int32_t da = d - (p->batch_rank - (a->ndim - 2)), db = d - (p->batch_rank - (b->ndim - 2));
    int64_t ea = da >= 0 ? a->shape[da] : 1, eb = db >= 0 ? b->shape[db] : 1;
    if (ea != eb && ea != 1 && eb != 1)
      return rvm_raise("ValueError", "%s: batch dims of %s and %s do not broadcast", kernel, sa, sb);
    p->batch[d] = ea > eb ? ea : eb;
    p->a_batch[d] = da >= 0 && ea != 1 ? a->strides[da] : 0;
    p->b_batch[d] = db >= 0 && eb != 1 ? b->strides[db] : 0;
    p->c_batch[d] = c->strides[d];
  }
  for (int32_t d = 0; d < c->ndim; d++) {
    int64_t want = d < p->batch_rank ? p->batch[d] : (d == p->batch_rank ? p->m : p->n);
    if (c->shape[d] != want) {
      rk_view_format(c, sc, sizeof sc);
      return rvm_raise("ValueError", "%s: the result (seen through its permutation) is %s, not the product of %s and %s",
                       kernel, sc, sa, sb);
    }
  }
  p->a_rs = a->strides[a->ndim - 2];
  p->a_cs = a->strides[a->ndim - 1];
  p->b_rs = b->strides[b->ndim - 2];
  p->b_cs = b->strides[b->ndim - 1];
  p->c_rs = c->strides[c->ndim - 2];
  p->c_cs = c->strides[c->ndim - 1];
  fold_batch_into_rows(p);
  return 0;
}

static int check_bias(const char *kernel, const DLTensor *bias, int64_t n) {
  if (bias && (bias->ndim != 1 || bias->shape[0] != n)) {
    char want[64];
    snprintf(want, sizeof want, "bias must have shape [%lld]", (long long)n);
    return rk_shape_error(kernel, want, bias);
  }
  return 0;
}

static int check_residual(const char *kernel, const DLTensor *residual, const DLTensor *out) {
  if (!residual) return 0;
  bool same = residual->ndim == out->ndim;
  for (int32_t d = 0; same && d < out->ndim; d++) same = residual->shape[d] == out->shape[d];
  return same ? 0 : rk_shape_error(kernel, "residual must have the result's shape", residual);
}

/* (a, b, bias, residual, a_perm, b_perm, out_perm, activation, [alpha, lo, hi], out) */
int rvm_builtin_kl_matmul(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  (void)self, (void)result;
  static const char kernel[] = "relaxc.matmul";
  DLTensor *a, *b, *bias, *residual, *out;
  int rc = rk_check_count(kernel, num_args, 10);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 0, "a", &a);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 1, "b", &b);
  if (!rc) rc = rk_arg_f32_or_none(kernel, args, num_args, 2, "bias", &bias);
  if (!rc) rc = rk_arg_f32_or_none(kernel, args, num_args, 3, "residual", &residual);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 9, "out", &out);
  rk_view va = {0}, vb = {0}, vc = {0};
  if (!rc) rc = rk_view_permuted(kernel, a, args, num_args, 4, "a_perm", &va);
  if (!rc) rc = rk_view_permuted(kernel, b, args, num_args, 5, "b_perm", &vb);
  if (!rc) rc = out->ndim > RK_MAX_RANK ? rk_shape_error(kernel, "the result's rank is too large", out) : 0;
  if (!rc) rc = rk_view_result(kernel, out, args, num_args, 6, &vc);
  rk_epilogue ep = {0};
  if (!rc) rc = rk_arg_epilogue(kernel, args, num_args, 7, &ep);
  matmul_plan p = {0};
  if (!rc) rc = plan_matmul(kernel, &va, &vb, &vc, &p);
  if (!rc) rc = check_bias(kernel, bias, p.n);
  if (!rc) rc = check_residual(kernel, residual, out);
  if (rc) return rc;
  ep.bias = bias ? rk_data(bias) : NULL;

  int64_t count = 1;
  for (int32_t d = 0; d < p.batch_rank; d++) count *= p.batch[d];
  if (count == 0) return 0;
  size_t bytes = (size_t)count * (sizeof(rk_gemm) + sizeof(rk_matrix));
  rk_gemm *problems = rk_scratch(RK_SLOT_PROBLEMS, bytes);
  if (!problems) return rk_out_of_memory(kernel);
  rk_matrix *a_mats = (rk_matrix *)(problems + count);
  const float *a_data = rk_data(a), *b_data = rk_data(b), *res_data = residual ? rk_data(residual) : NULL;
  float *c_data = rk_data(out);
  for (int64_t i = 0; i < count; i++) {
    int64_t rest = i, ao = 0, bo = 0, co = 0;
    for (int32_t d = p.batch_rank - 1; d >= 0; d--) {
      int64_t idx = rest % p.batch[d];
      rest /= p.batch[d];
      ao += idx * p.a_batch[d];
      bo += idx * p.b_batch[d];
      co += idx * p.c_batch[d];
    }
    a_mats[i] = (rk_matrix){a_data + ao, p.a_rs, p.a_cs};
    rk_gemm *g = &problems[i];
    *g = (rk_gemm){0};
    g->m = p.m, g->n = p.n, g->k = p.k;
    g->pack_a = rk_pack_a_strided;
    g->a = &a_mats[i];
    g->b = (rk_matrix){b_data + bo, p.b_rs, p.b_cs};
    g->c = c_data + co, g->c_rs = p.c_rs, g->c_cs = p.c_cs;
    g->ep = ep;
    if (res_data) g->ep.residual = res_data + co, g->ep.res_rs = p.c_rs, g->ep.res_cs = p.c_cs;
  }
  return rk_gemm_run(problems, count);
}

/* ---- relaxc.dense ---------------------------------------------------------------------------- */

/* (x, w_packed, bias, residual, activation, [alpha, lo, hi], out): out[..., n] = x[..., k] w,
 * with w prepacked as [ceil(n / 16)][k][16] (relaxc.tvm packs constant weights at build time). */
int rvm_builtin_kl_dense(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  (void)self, (void)result;
  static const char kernel[] = "relaxc.dense";
  DLTensor *x, *w, *bias, *residual, *out;
  int rc = rk_check_count(kernel, num_args, 7);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 0, "x", &x);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 1, "w_packed", &w);
  if (!rc) rc = rk_arg_f32_or_none(kernel, args, num_args, 2, "bias", &bias);
  if (!rc) rc = rk_arg_f32_or_none(kernel, args, num_args, 3, "residual", &residual);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 6, "out", &out);
  rk_epilogue ep = {0};
  if (!rc) rc = rk_arg_epilogue(kernel, args, num_args, 4, &ep);
  if (rc) return rc;
  if (x->ndim < 1) return rk_shape_error(kernel, "x must have rank 1 or more", x);
  if (w->ndim != 3 || w->shape[2] != RK_NR)
    return rk_shape_error(kernel, "w_packed must be [ceil(n / 16), k, 16]", w);
  int64_t k = x->shape[x->ndim - 1];
  if (w->shape[1] != k) return rk_shape_error(kernel, "w_packed's k differs from x's last dim", w);
  bool same = out->ndim == x->ndim;
  for (int32_t d = 0; same && d + 1 < x->ndim; d++) same = out->shape[d] == x->shape[d];
  if (!same) return rk_shape_error(kernel, "out must have x's shape but for the last dim", out);
  int64_t n = out->shape[out->ndim - 1];
  if (w->shape[0] != (n + RK_NR - 1) / RK_NR) return rk_shape_error(kernel, "w_packed has the wrong number of panels for out", w);
  rc = check_bias(kernel, bias, n);
  if (!rc) rc = check_residual(kernel, residual, out);
  if (rc) return rc;
  int64_t m = k == 0 ? rk_numel(out) / (n ? n : 1) : rk_numel(x) / k;
  rk_matrix a = {rk_data(x), k, 1};
  rk_gemm g = {0};
  g.m = m, g.n = n, g.k = k;
  g.pack_a = rk_pack_a_strided;
  g.a = &a;
  g.b_packed = rk_data(w);
  g.c = rk_data(out), g.c_rs = n, g.c_cs = 1;
  g.ep = ep;
  g.ep.bias = bias ? rk_data(bias) : NULL;
  if (residual) g.ep.residual = rk_data(residual), g.ep.res_rs = n, g.ep.res_cs = 1;
  return rk_gemm_run(&g, 1);
}
