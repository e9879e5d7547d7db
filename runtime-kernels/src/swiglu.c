/*
 * swiglu.c: relaxc.swiglu, the gated feed-forward's activation of the Llama family:
 * out = silu(gate) * up, row by row, in llama.cpp's own arithmetic (ggml's vector exp, then
 * x / (1 + e) and the product), so that a GGUF model's activations round as llama.cpp's do on
 * the same CPU.
 *
 * Why not rk_math.h's exp: the next layer quantizes these values to int8, and one activation a
 * rounding away from llama.cpp's flips an int8 now and then, which on the mid-size Llama moves the
 * logits by about 1e-2 (half of what the quantized formats may differ by in all).
 *
 * ggml's exp has a 512-bit form and a 256-bit one that round differently (ggml_math.h). Each
 * CPU runs the form llama.cpp runs there, so relaxc.swiglu's bits are those of the CPU's
 * llama.cpp, the same at any thread count, but not the same on an AVX-512 machine as on an AVX2
 * one. The values past a row's last whole register (ggml's loop tail) take libm's expf, as
 * ggml's do.
 *
 * RELAXC_QUANT_ISA=portable|avx2 picks a lesser form, as for the quantized kernels (quant.c), so
 * that tests compare the forms on one CPU. The portable form is the 4-lane one written in C with
 * fmaf: NEON's bits, and AVX2's.
 */
#include <math.h>

#include "ggml_math.h"
#include "rk.h"

/* ggml's loop tail: libm's expf. */
static float swiglu_tail(float gate, float up) { return gate / (1.0f + expf(-gate)) * up; }

/* One row, four lanes at a time as ggml's NEON loop (its bits are the AVX2 form's). */
static void row_portable(const float *gate, const float *up, float *out, int64_t n) {
  int64_t whole = n - n % 4, i = 0;
  for (; i < whole; i++) out[i] = gate[i] / (1.0f + ggml_exp_fma_form(0.0f - gate[i])) * up[i];
  for (; i < n; i++) out[i] = swiglu_tail(gate[i], up[i]);
}

#if defined(__x86_64__)
/* One row, L lanes at a time with intrinsics starting X (_mm256, _mm512) and exp EXP, the rest
 * by the tail. */
#define ROW(L, X, EXP)                                                                        \
  int64_t i = 0;                                                                              \
  for (; i + L <= n; i += L) {                                                                \
    __typeof__(X##_loadu_ps(gate)) x = X##_loadu_ps(gate + i);                                \
    __typeof__(x) silu = X##_div_ps(x, X##_add_ps(X##_set1_ps(1.0f), EXP(X##_sub_ps(X##_setzero_ps(), x)))); \
    X##_storeu_ps(out + i, X##_mul_ps(silu, X##_loadu_ps(up + i)));                          \
  }                                                                                           \
  for (; i < n; i++) out[i] = swiglu_tail(gate[i], up[i]);

RK_AVX2_TARGET static void row_avx2(const float *gate, const float *up, float *out, int64_t n) {
  ROW(8, _mm256, ggml_exp_avx2)
}

RK_AVX512DQ_TARGET static void row_avx512(const float *gate, const float *up, float *out, int64_t n) {
  ROW(16, _mm512, ggml_exp_avx512)
}
#undef ROW
#endif

typedef struct swiglu_job {
  const float *gate, *up;
  float *out;
  int64_t rows, cols, rows_per_unit;
  ggml_form form;
} swiglu_job;

enum { UNIT_VALUES = 16384 }; /* values per unit of work: enough to pay for a task */

static int swiglu_task(int task, int num_tasks, void *ctx) {
  const swiglu_job *j = ctx;
  int64_t units = (j->rows + j->rows_per_unit - 1) / j->rows_per_unit, begin, end;
  rk_split(units, task, num_tasks, &begin, &end);
  int64_t last = end * j->rows_per_unit < j->rows ? end * j->rows_per_unit : j->rows;
  for (int64_t r = begin * j->rows_per_unit; r < last; r++) {
    const float *gate = j->gate + r * j->cols, *up = j->up + r * j->cols;
    float *out = j->out + r * j->cols;
    switch (j->form) {
#if defined(__x86_64__)
      case GGML_FORM_AVX512: row_avx512(gate, up, out, j->cols); break;
      case GGML_FORM_AVX2: row_avx2(gate, up, out, j->cols); break;
#endif
      default: row_portable(gate, up, out, j->cols); break;
    }
  }
  return 0;
}

/* (gate, up, out): float32 tensors of one shape, rows along the last axis. */
int rvm_builtin_kl_swiglu(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  (void)self, (void)result;
  static const char kernel[] = "relaxc.swiglu";
  DLTensor *gate, *up, *out;
  int rc = rk_check_count(kernel, num_args, 3);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 0, "gate", &gate);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 1, "up", &up);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 2, "out", &out);
  if (rc) return rc;
  if (gate->ndim < 1) return rk_shape_error(kernel, "gate must have at least one axis", gate);
  if (!rk_same_shape(up, gate)) return rk_shape_error(kernel, "up must have gate's shape", up);
  if (!rk_same_shape(out, gate)) return rk_shape_error(kernel, "out must have gate's shape", out);
  int64_t cols = gate->shape[gate->ndim - 1];
  if (cols == 0 || rk_numel(gate) == 0) return 0;
  swiglu_job j = {rk_data(gate), rk_data(up), rk_data(out), rk_numel(gate) / cols, cols, 1, ggml_cpu_form()};
  j.rows_per_unit = cols >= UNIT_VALUES ? 1 : UNIT_VALUES / cols;
  return rk_parallel((j.rows + j.rows_per_unit - 1) / j.rows_per_unit, swiglu_task, &j);
}
