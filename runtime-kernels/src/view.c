/*
 * view.c: tensors seen through a permutation of their dims (shape and strides in elements), the
 * form in which relaxc.matmul and relaxc.attention read operands whose permute_dims relaxc.tvm
 * folded into the call instead of copying.
 */
#include <stdio.h>

#include "rk.h"

/* A compact tensor's strides in elements. */
static void compact_strides(const DLTensor *t, int64_t *strides) {
  int64_t s = 1;
  for (int32_t i = t->ndim - 1; i >= 0; i--) {
    strides[i] = s;
    s *= t->shape[i];
  }
}

void rk_view_compact(const DLTensor *t, rk_view *out) {
  out->ndim = t->ndim;
  compact_strides(t, out->strides);
  for (int32_t d = 0; d < t->ndim; d++) out->shape[d] = t->shape[d];
}

/* perm[i] must name every dim of an ndim-dim tensor once. */
static int check_permutation(const char *kernel, const char *name, const int64_t *perm, int64_t count, int32_t ndim) {
  bool seen[RK_MAX_RANK] = {false};
  if (count != ndim)
    return rvm_raise("ValueError", "%s: %s has %lld axes for a tensor of rank %d", kernel, name, (long long)count, ndim);
  for (int64_t i = 0; i < count; i++) {
    if (perm[i] < 0 || perm[i] >= ndim || seen[perm[i]])
      return rvm_raise("ValueError", "%s: %s is not a permutation of the axes 0..%d", kernel, name, ndim - 1);
    seen[perm[i]] = true;
  }
  return 0;
}

int rk_view_permuted(const char *kernel, const DLTensor *t, const TVMFFIAny *args, int32_t num_args, int32_t i,
                    const char *name, rk_view *out) {
  if (t->ndim > RK_MAX_RANK) return rvm_raise("ValueError", "%s: %s has rank %d (at most %d)", kernel, name, t->ndim, RK_MAX_RANK);
  if (args[i].type_index == kTVMFFINone) {
    rk_view_compact(t, out);
    return 0;
  }
  int64_t strides[RK_MAX_RANK];
  compact_strides(t, strides);
  out->ndim = t->ndim;
  const int64_t *perm;
  int64_t count;
  int rc = rk_arg_shape(kernel, args, num_args, i, name, -1, &perm, &count);
  if (!rc) rc = check_permutation(kernel, name, perm, count, t->ndim);
  if (rc) return rc;
  for (int32_t d = 0; d < t->ndim; d++) {
    out->shape[d] = t->shape[perm[d]];
    out->strides[d] = strides[perm[d]];
  }
  return 0;
}

void rk_view_format(const rk_view *v, char *buf, size_t cap) { rvm_format_shape(v->shape, v->ndim, buf, cap); }

int rk_view_result(const char *kernel, const DLTensor *out, const TVMFFIAny *args, int32_t num_args, int32_t i,
                       rk_view *c) {
  rk_view seen;
  int rc = rk_view_permuted(kernel, out, args, num_args, i, "out_perm", &seen);
  if (rc) return rc;
  c->ndim = out->ndim;
  int64_t strides[RK_MAX_RANK];
  compact_strides(out, strides);
  if (args[i].type_index == kTVMFFINone) {
    *c = seen;
    return 0;
  }
  const int64_t *perm = rvm_as_shape(&args[i])->data;
  for (int32_t d = 0; d < out->ndim; d++) {
    c->shape[perm[d]] = out->shape[d];
    c->strides[perm[d]] = strides[d];
  }
  return 0;
}

