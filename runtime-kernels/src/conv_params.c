/*
 * conv_params.c: what relaxc.conv2d and relaxc.conv2d_depthwise share: their params shape
 * ([kh, kw, stride_h, stride_w, pad_top, pad_left, pad_bottom, pad_right, dilation_h,
 * dilation_w, groups]) and the checks of their tensors against it; NCW tensors (a 1-D
 * convolution) are seen as NCHW with H = 1.
 */
#include "rk.h"

enum { NUM_PARAMS = 11 };

static int conv_params_arg(const char *kernel, const TVMFFIAny *args, int32_t num_args, int32_t i, conv_params *p) {
  const int64_t *v;
  int64_t n;
  int rc = rk_arg_shape(kernel, args, num_args, i, "params", NUM_PARAMS, &v, &n);
  if (rc) return rc;
  *p = (conv_params){v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10]};
  if (p->kh < 1 || p->kw < 1 || p->sh < 1 || p->sw < 1 || p->dh < 1 || p->dw < 1 || p->groups < 1 || p->pad_top < 0 ||
      p->pad_left < 0 || p->pad_bottom < 0 || p->pad_right < 0)
    return rvm_raise("ValueError", "%s: invalid params [kh %lld, kw %lld, strides %lld %lld, padding %lld %lld %lld %lld, "
                     "dilation %lld %lld, groups %lld]", kernel, (long long)p->kh, (long long)p->kw, (long long)p->sh,
                     (long long)p->sw, (long long)p->pad_top, (long long)p->pad_left, (long long)p->pad_bottom,
                     (long long)p->pad_right, (long long)p->dh, (long long)p->dw, (long long)p->groups);
  return 0;
}

/* Output extent of one spatial axis. */
static int64_t out_extent(int64_t in, int64_t pad, int64_t k, int64_t stride, int64_t dilation) {
  int64_t span = dilation * (k - 1) + 1;
  return in + pad < span ? 0 : (in + pad - span) / stride + 1;
}

/* Checks x, out, bias and residual against the params; fills the output extents. */
static int check_shapes(const char *kernel, const conv_params *p, const DLTensor *x, const DLTensor *out,
                        const DLTensor *bias, const DLTensor *residual, int64_t *oh, int64_t *ow) {
  if (x->ndim != 4) return rk_shape_error(kernel, "x must be NCHW", x);
  if (out->ndim != 4) return rk_shape_error(kernel, "out must be NCHW", out);
  if (x->shape[1] % p->groups || out->shape[1] % p->groups)
    return rk_shape_error(kernel, "channels must divide into the groups", x);
  *oh = out_extent(x->shape[2], p->pad_top + p->pad_bottom, p->kh, p->sh, p->dh);
  *ow = out_extent(x->shape[3], p->pad_left + p->pad_right, p->kw, p->sw, p->dw);
  if (out->shape[0] != x->shape[0] || out->shape[2] != *oh || out->shape[3] != *ow)
    return rk_shape_error(kernel, "out does not match x convolved with these params", out);
  if (bias && (bias->ndim != 1 || bias->shape[0] != out->shape[1]))
    return rk_shape_error(kernel, "bias must have one value per output channel", bias);
  if (residual) {
    bool same = residual->ndim == 4;
    for (int d = 0; same && d < 4; d++) same = residual->shape[d] == out->shape[d];
    if (!same) return rk_shape_error(kernel, "residual must have the output's shape", residual);
  }
  return 0;
}

/* t as NCHW with H = 1 when it is NCW (a 1-D convolution's tensor), in the view slot `slot`. */
static DLTensor *as_nchw(conv_args *a, int slot, DLTensor *t) {
  if (!t || t->ndim != 3) return t;
  a->views[slot] = *t;
  int64_t *shape = a->view_shapes[slot];
  shape[0] = t->shape[0], shape[1] = t->shape[1], shape[2] = 1, shape[3] = t->shape[2];
  a->views[slot].ndim = 4;
  a->views[slot].shape = shape;
  a->views[slot].strides = NULL; /* compact, as rk_arg_f32 checked */
  return &a->views[slot];
}

int rk_conv_args(const char *kernel, const char *w_name, const TVMFFIAny *args, int32_t num_args, conv_args *a) {
  *a = (conv_args){0};
  int rc = rk_check_count(kernel, num_args, 8);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 0, "x", &a->x);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 1, w_name, &a->w);
  if (!rc) rc = rk_arg_f32_or_none(kernel, args, num_args, 2, "bias", &a->bias);
  if (!rc) rc = rk_arg_f32_or_none(kernel, args, num_args, 3, "residual", &a->residual);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 7, "out", &a->out);
  if (!rc) rc = conv_params_arg(kernel, args, num_args, 4, &a->p);
  if (!rc) rc = rk_arg_epilogue(kernel, args, num_args, 5, &a->ep);
  if (!rc && a->x->ndim == 3) {
    if (a->out->ndim != 3) return rk_shape_error(kernel, "out must be NCW like x", a->out);
    if (a->p.kh != 1 || a->p.sh != 1 || a->p.dh != 1 || a->p.pad_top || a->p.pad_bottom)
      return rvm_raise("ValueError", "%s: an NCW (1-D) convolution takes kh = 1, stride_h = 1, dilation_h = 1 and "
                       "no vertical padding", kernel);
    a->x = as_nchw(a, 0, a->x);
    a->out = as_nchw(a, 1, a->out);
    a->residual = as_nchw(a, 2, a->residual);
  }
  if (!rc) rc = check_shapes(kernel, &a->p, a->x, a->out, a->bias, a->residual, &a->oh, &a->ow);
  return rc;
}
