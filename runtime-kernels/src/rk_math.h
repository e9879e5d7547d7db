/*
 * rk_math.h: the elementary functions the kernels apply to every element (exp, erf, tanh and
 * the activations built on them), written as straight-line float arithmetic so that loops over
 * them vectorize (libm's are calls, one element at a time).
 *
 * Accuracy: exp within 2 ulp on [-87, 88] (0 below, clamped above), erf within 1.5e-7
 * absolute (Abramowitz and Stegun 7.1.26), enough for outputs within 1e-6 of TVM's.
 */
#ifndef RK_MATH_H
#define RK_MATH_H

#include <stdint.h>
#include <string.h>

#define RK_INLINE static inline __attribute__((always_inline))

RK_INLINE float rk_bits_to_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* e^x: x = n ln2 + r with |r| <= ln2 / 2, e^r by its Taylor polynomial of degree 6, 2^n by
 * building the exponent. NaN stays NaN. */
RK_INLINE float rk_exp(float x) {
  float clamped = x > 88.3f ? 88.3f : x;
  clamped = clamped < -87.3f ? -87.3f : clamped;
  /* Rounds to the nearest integer by adding and subtracting 1.5 * 2^23. */
  float n = (clamped * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = clamped - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  float scale = rk_bits_to_float((uint32_t)((int32_t)n + 127) << 23);
  float e = p * scale;
  return x < -87.3f ? 0.0f : (x != x ? x : e);
}

/* erf(x), odd: 1 - (a1 t + ... + a5 t^5) e^(-x^2) with t = 1 / (1 + p |x|). */
RK_INLINE float rk_erf(float x) {
  float ax = x < 0.0f ? -x : x;
  float t = 1.0f / (1.0f + 0.3275911f * ax);
  float poly = 1.061405429f;
  poly = poly * t - 1.453152027f;
  poly = poly * t + 1.421413741f;
  poly = poly * t - 0.284496736f;
  poly = poly * t + 0.254829592f;
  poly = poly * t;
  float y = 1.0f - poly * rk_exp(-ax * ax);
  return x < 0.0f ? -y : y;
}

/* tanh(x) = 1 - 2 / (e^(2x) + 1). */
RK_INLINE float rk_tanh(float x) { return 1.0f - 2.0f / (rk_exp(2.0f * x) + 1.0f); }

RK_INLINE float rk_gelu(float x) { return 0.5f * x * (1.0f + rk_erf(x * 0.70710678118654752f)); }

RK_INLINE float rk_gelu_tanh(float x) {
  return 0.5f * x * (1.0f + rk_tanh(0.79788456080286536f * (x + 0.044715f * x * x * x)));
}

RK_INLINE float rk_sigmoid(float x) { return 1.0f / (1.0f + rk_exp(-x)); }
/* ONNX's HardSigmoid: min(max(slope * x + offset, 0), 1). */
RK_INLINE float rk_hard_sigmoid(float x, float slope, float offset) {
  float y = slope * x + offset;
  return y < 0.0f ? 0.0f : (y > 1.0f ? 1.0f : y);
}

RK_INLINE float rk_silu(float x) { return x / (1.0f + rk_exp(-x)); }

#endif /* RK_MATH_H */
