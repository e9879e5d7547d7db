/*
 * Kernels for the random programs of the differential harness: tiny, deterministic, and strict
 * about their arguments (every mismatch is a TypeError naming the argument), so that programs
 * that misuse them fail identically in every mode. Tensors are float32[4].
 */
#include "rvm_kernel.h"

#define EXPORT __attribute__((visibility("default")))

static int fail(const char *kernel, const char *what) {
  const char *parts[4] = {kernel, ": ", what, NULL};
  TVMFFIErrorSetRaisedFromCStrParts("TypeError", parts, 3);
  return -1;
}

/* The float32[4] data of argument i, or NULL. */
static float *vec4(const TVMFFIAny *args, int i) {
  DLTensor *t = NULL;
  if (args[i].type_index == kTVMFFIDLTensorPtr) t = (DLTensor *)args[i].v_ptr;
  if (args[i].type_index == kTVMFFITensor) t = rvm_tensor_of_object(args[i].v_obj);
  if (!t || t->ndim != 1 || t->shape[0] != 4 || t->dtype.code != kDLFloat || t->dtype.bits != 32) return NULL;
  return (float *)((char *)t->data + t->byte_offset);
}

static int is_int(const TVMFFIAny *a) { return a->type_index == kTVMFFIInt || a->type_index == kTVMFFIBool; }

static void set_int(TVMFFIAny *r, int64_t v) {
  r->type_index = kTVMFFIInt;
  r->zero_padding = 0;
  r->v_int64 = v;
}

EXPORT int __tvm_ffi_rk_add(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self, (void)result;
  if (n != 3) return fail("rk_add", "expects 3 arguments");
  float *a = vec4(args, 0), *b = vec4(args, 1), *o = vec4(args, 2);
  if (!a || !b || !o) return fail("rk_add", "arguments must be float32[4] tensors");
  for (int i = 0; i < 4; i++) o[i] = a[i] + b[i];
  return 0;
}

EXPORT int __tvm_ffi_rk_mul(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self, (void)result;
  if (n != 3) return fail("rk_mul", "expects 3 arguments");
  float *a = vec4(args, 0), *b = vec4(args, 1), *o = vec4(args, 2);
  if (!a || !b || !o) return fail("rk_mul", "arguments must be float32[4] tensors");
  for (int i = 0; i < 4; i++) o[i] = a[i] * b[i] - 0.5f;
  return 0;
}

EXPORT int __tvm_ffi_rk_scale(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self, (void)result;
  if (n != 3) return fail("rk_scale", "expects 3 arguments");
  float *a = vec4(args, 0), *o = vec4(args, 2);
  if (!a || !o || !is_int(&args[1])) return fail("rk_scale", "expects (float32[4], int, float32[4])");
  for (int i = 0; i < 4; i++) o[i] = a[i] * (float)args[1].v_int64;
  return 0;
}

EXPORT int __tvm_ffi_rk_fill(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self, (void)result;
  if (n != 2) return fail("rk_fill", "expects 2 arguments");
  float *o = vec4(args, 0);
  if (!o || !is_int(&args[1])) return fail("rk_fill", "expects (float32[4], int)");
  for (int i = 0; i < 4; i++) o[i] = (float)(args[1].v_int64 + i);
  return 0;
}

/* 1 if the elements sum to more than 0, else 0. */
EXPORT int __tvm_ffi_rk_positive(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self;
  if (n != 1) return fail("rk_positive", "expects 1 argument");
  float *a = vec4(args, 0);
  if (!a) return fail("rk_positive", "argument must be a float32[4] tensor");
  set_int(result, a[0] + a[1] + a[2] + a[3] > 0.0f);
  return 0;
}

EXPORT int __tvm_ffi_rk_dec(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self;
  if (n != 1 || !is_int(&args[0])) return fail("rk_dec", "expects one int");
  set_int(result, args[0].v_int64 - 1);
  return 0;
}

EXPORT int __tvm_ffi_rk_gt0(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self;
  if (n != 1 || !is_int(&args[0])) return fail("rk_gt0", "expects one int");
  set_int(result, args[0].v_int64 > 0);
  return 0;
}

/* Fails (ValueError) when an element's magnitude exceeds the int limit: stops a chain of
 * growing values partway, so that an error is raised from deep inside a rolled loop. */
EXPORT int __tvm_ffi_rk_below(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self, (void)result;
  if (n != 2) return fail("rk_below", "expects 2 arguments");
  float *a = vec4(args, 0);
  if (!a || !is_int(&args[1])) return fail("rk_below", "expects (float32[4], int)");
  for (int i = 0; i < 4; i++) {
    if (a[i] > (float)args[1].v_int64 || -a[i] > (float)args[1].v_int64) {
      const char *parts[2] = {"rk_below: a value exceeds the limit", NULL};
      TVMFFIErrorSetRaisedFromCStrParts("ValueError", parts, 1);
      return -1;
    }
  }
  return 0;
}
