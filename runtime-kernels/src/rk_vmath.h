/*
 * rk_vmath.h: rk_math.h's exp-based activations (SiLU, sigmoid, GELU, GELU's tanh form) over a
 * whole SIMD register, written once for AVX2 and AVX-512: the including file defines the VM_*
 * operations and VM_NAME, then includes this header once per instruction set (it undefines them
 * at its end).
 *
 * Each function performs rk_math.h's float operations in the same order, so the bits are the
 * scalar functions' for every input, NaN, infinities and signed zeros included. What the
 * compiler made of the scalar loops spent most of exp on mask-register juggling for its clamps
 * (18 cycles a 16-lane register on Zen 5, 13 here): the clamps are min and max here, which give
 * other values than the scalar compares only for NaN, whose result the last select replaces.
 */
#if !defined(VM_NAME) || !defined(VM_F)
#error "define VM_NAME, VM_F and the VM_* operations before including rk_vmath.h"
#endif

/* rk_exp, lane by lane. */
VM_TARGET static inline __attribute__((always_inline)) VM_F VM_NAME(exp)(VM_F x) {
  VM_F clamped = VM_MIN(VM_MAX(x, VM_SET(-87.3f)), VM_SET(88.3f));
  VM_F n = VM_SUB(VM_ADD(VM_MUL(clamped, VM_SET(1.44269504088896341f)), VM_SET(12582912.0f)), VM_SET(12582912.0f));
  VM_F r = VM_SUB(clamped, VM_MUL(n, VM_SET(0.693359375f)));
  r = VM_SUB(r, VM_MUL(n, VM_SET(-2.12194440e-4f)));
  VM_F p = VM_SET(1.0f / 720.0f);
  p = VM_ADD(VM_MUL(p, r), VM_SET(1.0f / 120.0f));
  p = VM_ADD(VM_MUL(p, r), VM_SET(1.0f / 24.0f));
  p = VM_ADD(VM_MUL(p, r), VM_SET(1.0f / 6.0f));
  p = VM_ADD(VM_MUL(p, r), VM_SET(0.5f));
  p = VM_ADD(VM_MUL(p, r), VM_SET(1.0f));
  p = VM_ADD(VM_MUL(p, r), VM_SET(1.0f));
  VM_F e = VM_MUL(p, VM_POW2(n));
  e = VM_SELECT_NAN(x, x, e);
  return VM_SELECT_LT(x, VM_SET(-87.3f), VM_SET(0.0f), e);
}

/* rk_silu and rk_sigmoid. */
VM_TARGET static inline __attribute__((always_inline)) VM_F VM_NAME(silu)(VM_F x) {
  return VM_DIV(x, VM_ADD(VM_SET(1.0f), VM_NAME(exp)(VM_NEG(x))));
}
VM_TARGET static inline __attribute__((always_inline)) VM_F VM_NAME(sigmoid)(VM_F x) {
  return VM_DIV(VM_SET(1.0f), VM_ADD(VM_SET(1.0f), VM_NAME(exp)(VM_NEG(x))));
}

/* rk_erf and rk_gelu. */
VM_TARGET static inline __attribute__((always_inline)) VM_F VM_NAME(erf)(VM_F x) {
  VM_F ax = VM_SELECT_LT(x, VM_SET(0.0f), VM_NEG(x), x);
  VM_F t = VM_DIV(VM_SET(1.0f), VM_ADD(VM_SET(1.0f), VM_MUL(VM_SET(0.3275911f), ax)));
  VM_F poly = VM_SET(1.061405429f);
  poly = VM_SUB(VM_MUL(poly, t), VM_SET(1.453152027f));
  poly = VM_ADD(VM_MUL(poly, t), VM_SET(1.421413741f));
  poly = VM_SUB(VM_MUL(poly, t), VM_SET(0.284496736f));
  poly = VM_ADD(VM_MUL(poly, t), VM_SET(0.254829592f));
  poly = VM_MUL(poly, t);
  VM_F y = VM_SUB(VM_SET(1.0f), VM_MUL(poly, VM_NAME(exp)(VM_MUL(VM_NEG(ax), ax))));
  return VM_SELECT_LT(x, VM_SET(0.0f), VM_NEG(y), y);
}
VM_TARGET static inline __attribute__((always_inline)) VM_F VM_NAME(gelu)(VM_F x) {
  VM_F e = VM_NAME(erf)(VM_MUL(x, VM_SET(0.70710678118654752f)));
  return VM_MUL(VM_MUL(VM_SET(0.5f), x), VM_ADD(VM_SET(1.0f), e));
}

/* rk_tanh and rk_gelu_tanh. */
VM_TARGET static inline __attribute__((always_inline)) VM_F VM_NAME(tanh)(VM_F x) {
  VM_F e = VM_NAME(exp)(VM_MUL(VM_SET(2.0f), x));
  return VM_SUB(VM_SET(1.0f), VM_DIV(VM_SET(2.0f), VM_ADD(e, VM_SET(1.0f))));
}
VM_TARGET static inline __attribute__((always_inline)) VM_F VM_NAME(gelu_tanh)(VM_F x) {
  VM_F cube = VM_MUL(VM_MUL(VM_MUL(VM_SET(0.044715f), x), x), x);
  VM_F inner = VM_MUL(VM_SET(0.79788456080286536f), VM_ADD(x, cube));
  return VM_MUL(VM_MUL(VM_SET(0.5f), x), VM_ADD(VM_SET(1.0f), VM_NAME(tanh)(inner)));
}

/* The activation on n values in place: whole registers here, the rest by rk_math.h. Returns
 * false (nothing done) for activations this header does not cover. */
VM_TARGET static bool VM_NAME(activate)(float *x, int64_t n, rk_act act) {
  int64_t i = 0;
  switch (act) {
#define VM_LOOP(fn, scalar)                                                        \
  for (; i + VM_LANES <= n; i += VM_LANES) VM_STORE(x + i, VM_NAME(fn)(VM_LOAD(x + i))); \
  for (; i < n; i++) x[i] = scalar(x[i]);                                          \
  return true;
    case RK_ACT_SILU: VM_LOOP(silu, rk_silu)
    case RK_ACT_SIGMOID: VM_LOOP(sigmoid, rk_sigmoid)
    case RK_ACT_GELU: VM_LOOP(gelu, rk_gelu)
    case RK_ACT_GELU_TANH: VM_LOOP(gelu_tanh, rk_gelu_tanh)
#undef VM_LOOP
    default: return false;
  }
}

/* The parameters are undefined again, so that the next instruction set can define its own. */
#undef VM_TARGET
#undef VM_NAME
#undef VM_F
#undef VM_LANES
#undef VM_SET
#undef VM_LOAD
#undef VM_STORE
#undef VM_ADD
#undef VM_SUB
#undef VM_MUL
#undef VM_DIV
#undef VM_MIN
#undef VM_MAX
#undef VM_NEG
#undef VM_POW2
#undef VM_SELECT_LT
#undef VM_SELECT_NAN
