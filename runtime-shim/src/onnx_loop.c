/*
 * onnx_loop.c: ONNX's Loop as a runtime builtin, relaxc.onnx_loop, which calls the loop's body
 * (a Relax function relaxc.onnx imports from the body graph) once per iteration.
 *
 * The iteration happens here, in C, rather than as a Relax function calling itself: a recursive
 * loop nests one Relax call per iteration, and the VM (like TVM's) refuses more than a few
 * thousand nested calls, where exported loops (beam search, a model's own decoding loop) run
 * for tens of thousands. Scan outputs are stacked here too, in one growing buffer, rather than
 * concatenated by the body on every iteration (quadratic in the trip count).
 *
 * Arguments, as relaxc.onnx's import emits them (python/relaxc/onnx/loop.py):
 *   (%vm, body, trip_count, condition, layout, scan templates..., carried..., captured...)
 * trip_count and condition are one-element tensors (int64, bool); layout is a Shape
 * [carried, scans, iteration rank, condition rank, reversed...] (the ranks the body's graph
 * declares for its first two inputs, 0 or 1; then for each scan output whether it is stacked last
 * iteration first, as a reversed ONNX Scan output is); each scan template is an empty tensor [0, element dims...] of the
 * scan output's dtype. The body takes (iteration, condition, carried..., captured...) and returns
 * (condition, carried..., scan elements...). The result is a tuple (carried..., scans...), each
 * scan [iterations, element dims...].
 */
#include <stdint.h>
#include <string.h>

#include "internal.h"

#define BUILTIN "relaxc.onnx_loop"

/* One scan output being stacked: its element type and shape, and the bytes so far. */
typedef struct scan_stack {
  const DLTensor *template; /* [0, element dims...], the caller's */
  int64_t element_bytes;
  char *bytes;
  int64_t used, capacity;
} scan_stack;

/* A one-element tensor's value as an integer (bool, int or uint of any width up to 64). */
static int scalar_value(const TVMFFIAny *v, const char *what, int64_t *out) {
  const DLTensor *t = rvm_as_dltensor(v);
  if (!t || t->device.device_type != kDLCPU || rvm_tensor_nbytes(t) == 0 || t->dtype.lanes != 1 ||
      !(t->dtype.code == kDLInt || t->dtype.code == kDLUInt || t->dtype.code == kDLBool) || t->dtype.bits > 64 ||
      t->dtype.bits % 8 != 0)
    return rvm_raise("TypeError", "%s: %s must be a one-element integer or bool tensor on the CPU, but got %s", BUILTIN,
                     what, rvm_type_name(v));
  int64_t elements = 1;
  for (int32_t i = 0; i < t->ndim; i++) elements *= t->shape[i];
  if (elements != 1) return rvm_raise("ValueError", "%s: %s has %lld elements, not 1", BUILTIN, what, (long long)elements);
  const unsigned char *p = (const unsigned char *)t->data + t->byte_offset;
  int64_t value = 0;
  switch (t->dtype.bits) {
  case 8: value = t->dtype.code == kDLInt ? *(const int8_t *)p : *(const uint8_t *)p; break;
  case 16: value = t->dtype.code == kDLInt ? *(const int16_t *)p : *(const uint16_t *)p; break;
  case 32: value = t->dtype.code == kDLInt ? (int64_t) * (const int32_t *)p : (int64_t) * (const uint32_t *)p; break;
  default: memcpy(&value, p, sizeof value); break;
  }
  *out = value;
  return 0;
}

/* A new CPU tensor of shape [] (rank 0) or [1] holding `value` as `dtype` (int64 or bool). */
static int scalar_tensor(rvm_vm *vm, int64_t rank, DLDataType dtype, int64_t value, TVMFFIAny *out) {
  rvm_storage *s = rvm_storage_new(vm->allocator, 8);
  if (!s) return -1;
  if (dtype.bits == 64)
    memcpy(s->data, &value, sizeof value);
  else
    *(uint8_t *)s->data = value != 0;
  int64_t one = 1;
  rvm_tensor *t = rvm_tensor_new(s->data, s->device, (int32_t)rank, dtype, &one, 0, &s->header);
  rvm_object_decref(&s->header);
  if (!t) return -1;
  *out = rvm_obj_any(t);
  return 0;
}

/* Whether a tensor's elements are contiguous in row-major order (strides NULL or compact). */
static bool compact(const DLTensor *t) {
  if (!t->strides) return true;
  int64_t expected = 1;
  for (int32_t d = t->ndim - 1; d >= 0; d--) {
    if (t->shape[d] != 1 && t->strides[d] != expected) return false;
    expected *= t->shape[d];
  }
  return true;
}

/* Appends iteration `iteration`'s element of scan `k` to its stack, checking its type and shape. */
static int push_scan(scan_stack *stack, int64_t k, int64_t iteration, const TVMFFIAny *v) {
  const DLTensor *t = rvm_as_dltensor(v), *want = stack->template;
  bool same = t && t->device.device_type == kDLCPU && compact(t) && t->ndim == want->ndim - 1 && t->dtype.code == want->dtype.code &&
              t->dtype.bits == want->dtype.bits && t->dtype.lanes == want->dtype.lanes;
  for (int32_t d = 0; same && d < t->ndim; d++) same = t->shape[d] == want->shape[d + 1];
  if (!same) {
    char got[96] = "not a compact CPU tensor", got_type[32] = "", expected[96], expected_type[32];
    if (t) rvm_format_shape(t->shape, t->ndim, got, sizeof got);
    if (t) rvm_format_dtype(t->dtype, got_type, sizeof got_type);
    rvm_format_shape(want->shape + 1, want->ndim - 1, expected, sizeof expected);
    rvm_format_dtype(want->dtype, expected_type, sizeof expected_type);
    return rvm_raise("ValueError", "%s: iteration %lld's scan output %lld is %s %s, but the loop's scan elements are %s %s",
                     BUILTIN, (long long)iteration, (long long)k, got, got_type, expected, expected_type);
  }
  if (stack->used + stack->element_bytes > stack->capacity) {
    int64_t capacity = stack->capacity ? stack->capacity * 2 : stack->element_bytes * 16;
    if (capacity < stack->used + stack->element_bytes) capacity = stack->used + stack->element_bytes;
    char *bytes = rvm_mem_realloc(stack->bytes, (size_t)capacity, "a loop's scan output");
    if (!bytes) return -1;
    stack->bytes = bytes;
    stack->capacity = capacity;
  }
  /* Relax tensors are compact (no strides, checked above): one copy of the element's bytes. */
  if (stack->element_bytes) memcpy(stack->bytes + stack->used, (const char *)t->data + t->byte_offset, (size_t)stack->element_bytes);
  stack->used += stack->element_bytes;
  return 0;
}

/* The stacked scan as a tensor [iterations, element dims...], last iteration first if `reversed`. */
static int finish_scan(rvm_vm *vm, const scan_stack *stack, int64_t iterations, bool reversed, TVMFFIAny *out) {
  const DLTensor *want = stack->template;
  int64_t dims[16];
  if (want->ndim > 16) return rvm_raise("ValueError", "%s: a scan output of rank %d is over 16", BUILTIN, want->ndim - 1);
  dims[0] = iterations;
  for (int32_t d = 1; d < want->ndim; d++) dims[d] = want->shape[d];
  rvm_storage *s = rvm_storage_new(vm->allocator, (uint64_t)(stack->used ? stack->used : 1));
  if (!s) return -1;
  if (reversed) {
    for (int64_t i = 0; i < iterations; i++)
      memcpy((char *)s->data + i * stack->element_bytes, stack->bytes + (iterations - 1 - i) * stack->element_bytes,
             (size_t)stack->element_bytes);
  } else if (stack->used) {
    memcpy(s->data, stack->bytes, (size_t)stack->used);
  }
  rvm_tensor *t = rvm_tensor_new(s->data, s->device, want->ndim, want->dtype, dims, 0, &s->header);
  rvm_object_decref(&s->header);
  if (!t) return -1;
  *out = rvm_obj_any(t);
  return 0;
}

int rvm_builtin_onnx_loop(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self;
  if (n < 5) return rvm_raise("TypeError", "%s expects at least 5 arguments, but got %d", BUILTIN, n);
  rvm_vm *vm = args[0].type_index == kTVMFFIOpaquePtr ? (rvm_vm *)args[0].v_ptr : NULL;
  if (!vm) return rvm_raise("TypeError", "%s: argument 0 must be the VM", BUILTIN);
  const TVMFFIAny *body = &args[1];
  const TVMFFIShapeCell *layout = rvm_as_shape(&args[4]);
  if (!layout || layout->size < 4)
    return rvm_raise("TypeError", "%s: argument 4 must be the Shape [carried, scans, iteration rank, condition rank, reversed...]",
                     BUILTIN);
  int64_t num_carried = layout->data[0], num_scans = layout->data[1];
  int64_t iteration_rank = layout->data[2], condition_rank = layout->data[3];
  const int64_t *reversed = layout->data + 4;
  if (num_carried < 0 || num_scans < 0 || (int64_t)layout->size != 4 + num_scans || 5 + num_scans + num_carried > n ||
      (iteration_rank | condition_rank) & ~1)
    return rvm_raise("ValueError", "%s: layout [%lld, %lld, %lld, %lld] does not fit %d arguments", BUILTIN,
                     (long long)num_carried, (long long)num_scans, (long long)iteration_rank, (long long)condition_rank, n);
  int64_t trip_count = 0, go_on = 0;
  if (scalar_value(&args[2], "the trip count", &trip_count) || scalar_value(&args[3], "the condition", &go_on)) return -1;
  const TVMFFIAny *templates = args + 5, *initial = templates + num_scans, *captured = initial + num_carried;
  int64_t num_captured = n - 5 - num_scans - num_carried;

  /* The body's arguments: iteration, condition, carried (this loop's references), captured
   * (borrowed from the caller). */
  int64_t num_body_args = 2 + num_carried + num_captured;
  TVMFFIAny *call = rvm_mem_calloc((size_t)num_body_args, sizeof(TVMFFIAny), "a loop's arguments");
  scan_stack *stacks = rvm_mem_calloc((size_t)(num_scans ? num_scans : 1), sizeof(scan_stack), "a loop's scan outputs");
  int rc = call && stacks ? 0 : -1;
  TVMFFIAny *carried = call ? call + 2 : NULL;
  for (int64_t k = 0; rc == 0 && k < num_scans; k++) {
    const DLTensor *t = rvm_as_dltensor(&templates[k]);
    if (!t || t->ndim < 1 || t->shape[0] != 0 || t->dtype.lanes != 1)
      rc = rvm_raise("TypeError", "%s: scan template %lld must be an empty tensor [0, element dims...]", BUILTIN, (long long)k);
    else {
      int64_t elements = 1;
      for (int32_t d = 1; d < t->ndim; d++) elements *= t->shape[d];
      stacks[k].template = t;
      stacks[k].element_bytes = elements * ((t->dtype.bits + 7) / 8);
    }
  }
  for (int64_t k = 0; rc == 0 && k < num_carried; k++) rc = rvm_any_copy(&initial[k], &carried[k]);
  for (int64_t k = 0; rc == 0 && k < num_captured; k++) call[2 + num_carried + k] = captured[k];

  DLDataType i64 = {kDLInt, 64, 1}, boolean = {kDLBool, 8, 1};
  int64_t iteration = 0;
  for (; rc == 0 && iteration < trip_count && go_on; iteration++) {
    rc = scalar_tensor(vm, iteration_rank, i64, iteration, &call[0]);
    if (rc == 0) rc = scalar_tensor(vm, condition_rank, boolean, go_on, &call[1]);
    TVMFFIAny out = rvm_none();
    if (rc == 0) rc = rvm_invoke_value(vm, body, call, (int32_t)num_body_args, &out);
    rvm_any_release(&call[0]);
    rvm_any_release(&call[1]);
    call[0] = call[1] = rvm_none();
    if (rc != 0) break;
    const rvm_array *items = out.type_index == kTVMFFIArray ? (const rvm_array *)out.v_obj : NULL;
    if (!items || items->cell.size != 1 + num_carried + num_scans) {
      rc = rvm_raise("TypeError", "%s: the body returned %s, not a tuple of %lld values", BUILTIN, rvm_type_name(&out),
                     (long long)(1 + num_carried + num_scans));
    } else {
      rc = scalar_value(&items->items[0], "the body's condition", &go_on);
      for (int64_t k = 0; rc == 0 && k < num_carried; k++) {
        rvm_any_release(&carried[k]);
        rc = rvm_any_copy(&items->items[1 + k], &carried[k]);
      }
      for (int64_t k = 0; rc == 0 && k < num_scans; k++) rc = push_scan(&stacks[k], k, iteration, &items->items[1 + num_carried + k]);
    }
    rvm_any_release(&out);
  }

  rvm_array *tuple = rc == 0 ? rvm_array_new(num_carried + num_scans) : NULL;
  if (rc == 0 && !tuple) rc = -1;
  for (int64_t k = 0; rc == 0 && k < num_carried; k++) {
    tuple->items[k] = carried[k]; /* the loop's reference moves into the result */
    carried[k] = rvm_none();
  }
  for (int64_t k = 0; rc == 0 && k < num_scans; k++) rc = finish_scan(vm, &stacks[k], iteration, reversed[k] != 0, &tuple->items[num_carried + k]);
  if (rc == 0) {
    *result = rvm_obj_any(tuple);
  } else if (tuple) {
    TVMFFIAny t = rvm_obj_any(tuple);
    rvm_any_release(&t);
  }
  for (int64_t k = 0; carried && k < num_carried; k++) rvm_any_release(&carried[k]);
  for (int64_t k = 0; stacks && k < num_scans; k++) rvm_mem_free(stacks[k].bytes);
  rvm_mem_free(stacks);
  rvm_mem_free(call);
  return rc;
}
