/*
 * activation.c: relaxc.activation, an activation on its own (the script front end's R.nn.relu,
 * R.nn.gelu, R.clip and friends where no matmul or convolution precedes them to take it into its
 * epilogue): out = act(alpha * x), elementwise, split over the pool in chunks.
 */
#include "rk.h"

enum { CHUNK = 16384 };

typedef struct activation_job {
  const float *x;
  float *out;
  int64_t n;
  rk_epilogue ep;
} activation_job;

static int activation_task(int task, int num_tasks, void *ctx) {
  const activation_job *j = ctx;
  int64_t chunks = (j->n + CHUNK - 1) / CHUNK, begin, end;
  rk_split(chunks, task, num_tasks, &begin, &end);
  for (int64_t c = begin; c < end; c++) {
    int64_t lo = c * CHUNK, hi = lo + CHUNK < j->n ? lo + CHUNK : j->n;
    for (int64_t i = lo; i < hi; i++) j->out[i] = j->x[i] * j->ep.alpha;
    rk_activate_all(j->out + lo, hi - lo, j->ep.act, j->ep.lo, j->ep.hi);
  }
  return 0;
}

/* (x, act, [alpha, lo, hi], out). */
int rvm_builtin_kl_activation(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  (void)self, (void)result;
  static const char kernel[] = "relaxc.activation";
  DLTensor *x, *out;
  rk_epilogue ep = {0};
  int rc = rk_check_count(kernel, num_args, 4);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 0, "x", &x);
  if (!rc) rc = rk_arg_epilogue(kernel, args, num_args, 1, &ep);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 3, "out", &out);
  if (rc) return rc;
  if (!rk_same_shape(out, x)) return rk_shape_error(kernel, "out must have x's shape", out);
  activation_job j = {rk_data(x), rk_data(out), rk_numel(x), ep};
  if (j.n == 0) return 0;
  return rk_parallel((j.n + CHUNK - 1) / CHUNK, activation_task, &j);
}
