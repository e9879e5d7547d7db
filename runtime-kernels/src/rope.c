/*
 * rope.c: relaxc.rope, rotary position embedding in llama.cpp's arithmetic, for the models
 * relaxc.llm builds from GGUF files (TVM's KV cache then runs without RoPE of its own).
 *
 * TVM's kernel takes each angle as position / theta^(2i/d) (powf per value). llama.cpp starts
 * from the position and multiplies by theta^(-2/d) once per pair, in float, so its angles drift
 * from TVM's by a few ulps, and its rotation is two fused multiply-adds (x0 cos - x1 sin with the
 * first product unrounded: what GCC makes of its C). The query and key rows feed the attention
 * and, through it, int8-quantized activations, where a last-bit difference now and then flips a
 * rounding; this kernel reproduces llama.cpp's bits (checked against its tensors on the mid-size
 * Llama, bench/llm_gguf.py), with libm's sinf, cosf and powf as it calls them.
 *
 * Modes: "normal" rotates adjacent pairs (2i, 2i + 1), llama.cpp's order for llama and mistral,
 * whose Q and K rows its converter permuted for it; "neox" rotates (i, i + head_dim / 2), as for
 * qwen2; every pair of the head is rotated. Optional frequency factors divide each pair's angle
 * (Llama 3's rope_freqs tensor). Split over positions: each thread computes a position's sines
 * and cosines once for all its heads; the same bits at any thread count.
 */
#include <math.h>

#include "rk.h"

typedef struct rope_job {
  const float *x;
  float *out;
  const int32_t *positions;
  const float *factors; /* [head_dim / 2] or NULL */
  int64_t tokens, heads, head_dim;
  bool neox;
  float theta_scale, freq_scale, attn_factor;
} rope_job;

enum { MAX_HEAD_DIM = 1024 };

/* llama.cpp's per-position table: the angle starts at the position and is multiplied by
 * theta_scale after each pair (ggml_rope_cache_init, without YaRN's ramp). */
static void angles(const rope_job *j, int32_t position, float *cosines, float *sines) {
  float theta = (float)position;
  for (int64_t i = 0; i < j->head_dim / 2; i++) {
    float extrapolated = j->factors ? theta / j->factors[i] : theta;
    float angle = j->freq_scale * extrapolated;
    cosines[i] = cosf(angle) * j->attn_factor;
    sines[i] = sinf(angle) * j->attn_factor;
    theta *= j->theta_scale;
  }
}

static int rope_task(int task, int num_tasks, void *ctx) {
  const rope_job *j = ctx;
  float cosines[MAX_HEAD_DIM / 2], sines[MAX_HEAD_DIM / 2];
  int64_t begin, end;
  rk_split(j->tokens, task, num_tasks, &begin, &end);
  int64_t half = j->head_dim / 2, stride = j->neox ? half : 1, step = j->neox ? 1 : 2;
  for (int64_t t = begin; t < end; t++) {
    angles(j, j->positions[t], cosines, sines);
    for (int64_t h = 0; h < j->heads; h++) {
      const float *x = j->x + (t * j->heads + h) * j->head_dim;
      float *out = j->out + (t * j->heads + h) * j->head_dim;
      for (int64_t i = 0; i < half; i++) {
        int64_t a = i * step, b = a + stride;
        float x0 = x[a], x1 = x[b], c = cosines[i], s = sines[i];
        out[a] = fmaf(x0, c, -(x1 * s));
        out[b] = fmaf(x0, s, x1 * c);
      }
    }
  }
  return 0;
}

/* (x, positions, freq_factors?, mode, [theta, freq_scale, attn_factor], out). */
int rvm_builtin_kl_rope(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  (void)self, (void)result;
  static const char kernel[] = "relaxc.rope";
  static const char *const modes[] = {"normal", "neox"};
  DLTensor *x, *positions, *factors, *out;
  int mode = 0;
  float params[3];
  int rc = rk_check_count(kernel, num_args, 6);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 0, "x", &x);
  if (!rc) rc = rk_arg_i32(kernel, args, num_args, 1, "positions", &positions);
  if (!rc) rc = rk_arg_f32_or_none(kernel, args, num_args, 2, "freq_factors", &factors);
  if (!rc) rc = rk_arg_name(kernel, args, num_args, 3, "mode", modes, 2, &mode);
  if (!rc) rc = rk_arg_scalars(kernel, args, num_args, 4, "[theta, freq_scale, attn_factor]", 3, params);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 5, "out", &out);
  if (rc) return rc;
  bool neox = mode == 1;
  if (x->ndim < 2) return rk_shape_error(kernel, "x must be [..., heads, head_dim]", x);
  if (!rk_same_shape(out, x)) return rk_shape_error(kernel, "out must have x's shape", out);
  rope_job j = {rk_data(x), rk_data(out), NULL, NULL, 0, x->shape[x->ndim - 2], x->shape[x->ndim - 1], neox, 0, params[1],
                params[2]};
  j.tokens = j.heads && j.head_dim ? rk_numel(x) / (j.heads * j.head_dim) : 0;
  if (j.head_dim % 2 || j.head_dim > MAX_HEAD_DIM)
    return rk_shape_error(kernel, "x's head_dim must be even and at most 1024", x);
  if (positions->ndim != 1 || positions->shape[0] != j.tokens)
    return rk_shape_error(kernel, "positions must hold one position per row of x (x's leading axes)", positions);
  if (factors) {
    if (factors->ndim != 1 || factors->shape[0] != j.head_dim / 2)
      return rk_shape_error(kernel, "freq_factors must hold head_dim / 2 values", factors);
    j.factors = rk_data(factors);
  }
  j.positions = (const int32_t *)((const char *)positions->data + positions->byte_offset);
  j.theta_scale = powf(params[0], -2.0f / (float)j.head_dim);
  if (j.tokens == 0) return 0;
  return rk_parallel(j.tokens, rope_task, &j);
}
