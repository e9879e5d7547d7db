/*
 * codec.c: TVM RPC packets as bytes <-> requests and replies (tvm-rpc.md §2-§5), with no I/O, so
 * that the fuzz target drives exactly what the server runs. Decoding reads through a cursor that
 * refuses to step past the body; a count is checked against the bytes left before anything is
 * allocated for it, so a length of 2^63 costs nothing.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rpc.h"

typedef struct cursor {
  const uint8_t *p;
  uint64_t left;
  char *err;
  size_t err_size;
  int failed;
} cursor;

static int fail(cursor *c, const char *fmt, ...) {
  if (!c->failed) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, c->err_size, fmt, ap);
    va_end(ap);
  }
  c->failed = 1;
  return -1;
}

static const uint8_t *take(cursor *c, uint64_t n, const char *what) {
  if (c->failed) return NULL;
  if (n > c->left) {
    fail(c, "truncated message: %s needs %llu bytes, %llu left", what, (unsigned long long)n,
         (unsigned long long)c->left);
    return NULL;
  }
  const uint8_t *at = c->p;
  c->p += n;
  c->left -= n;
  return at;
}

static uint64_t le(const uint8_t *p, int width) {
  uint64_t v = 0;
  for (int i = width - 1; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static int32_t get_i32(cursor *c, const char *what) {
  const uint8_t *p = take(c, 4, what);
  return p ? (int32_t)(uint32_t)le(p, 4) : 0;
}

static uint64_t get_u64(cursor *c, const char *what) {
  const uint8_t *p = take(c, 8, what);
  return p ? le(p, 8) : 0;
}

int64_t rpc_tensor_dim(const rpc_tensor *tensor, int32_t i) { return (int64_t)le(tensor->shape_bytes + 8 * i, 8); }

static int get_tensor(cursor *c, rpc_tensor *t) {
  t->data = get_u64(c, "a tensor's data");
  t->device_type = get_i32(c, "a tensor's device");
  t->device_id = get_i32(c, "a tensor's device");
  t->ndim = get_i32(c, "a tensor's ndim");
  const uint8_t *dtype = take(c, 4, "a tensor's dtype");
  if (c->failed) return -1;
  if (t->ndim < 0 || t->ndim > RPC_MAX_NDIM) return fail(c, "tensor with %d dimensions", t->ndim);
  t->dtype.code = dtype[0];
  t->dtype.bits = dtype[1];
  t->dtype.lanes = (uint16_t)le(dtype + 2, 2);
  t->shape_bytes = take(c, 8 * (uint64_t)t->ndim, "a tensor's shape");
  t->byte_offset = get_u64(c, "a tensor's byte offset");
  return c->failed ? -1 : 0;
}

static int get_bytes(cursor *c, rpc_value *v, const char *what) {
  v->v.bytes.len = get_u64(c, what);
  v->v.bytes.data = take(c, v->v.bytes.len, what);
  return c->failed ? -1 : 0;
}

static int get_value(cursor *c, rpc_value *v) {
  v->type = get_i32(c, "a type index");
  if (c->failed) return -1;
  switch (v->type) {
    case kTVMFFINone:
      return 0;
    case kTVMFFIInt:
    case kTVMFFIBool:
    case kTVMFFIOpaquePtr:
    case kTVMFFIFunction:
    case kTVMFFIModule:
      v->v.i = (int64_t)get_u64(c, "a value");
      return c->failed ? -1 : 0;
    case kTVMFFIFloat: {
      uint64_t bits = get_u64(c, "a float");
      memcpy(&v->v.f, &bits, 8);
      return c->failed ? -1 : 0;
    }
    case kTVMFFIDataType: {
      const uint8_t *p = take(c, 8, "a dtype");
      if (!p) return -1;
      v->v.dtype.code = p[0];
      v->v.dtype.bits = p[1];
      v->v.dtype.lanes = (uint16_t)le(p + 2, 2);
      return 0;
    }
    case kTVMFFIDevice:
      v->v.device.device_type = get_i32(c, "a device");
      v->v.device.device_id = get_i32(c, "a device");
      return c->failed ? -1 : 0;
    case kTVMFFIDLTensorPtr:
      return get_tensor(c, &v->v.tensor);
    case kTVMFFIRawStr:
    case kTVMFFIByteArrayPtr:
      return get_bytes(c, v, "a string");
    default:
      break;
  }
  if (v->type == kTVMFFISmallStr || v->type == kTVMFFISmallBytes || v->type >= kTVMFFIStaticObjectBegin) {
    /* Boxed: the type index again as u32, then the inner payload (tvm-rpc.md §3.1). */
    int32_t inner = get_i32(c, "a boxed value's type");
    if (c->failed) return -1;
    v->type = inner;
    if (inner == kTVMFFIStr || inner == kTVMFFIBytes) return get_bytes(c, v, "a boxed string");
    if (inner == RPC_TYPE_OBJECT_REF) {
      v->v.handle = get_u64(c, "an object reference");
      return c->failed ? -1 : 0;
    }
    return fail(c, "unsupported boxed value of type index %d", inner);
  }
  return fail(c, "unsupported value of type index %d", v->type);
}

static int get_seq(cursor *c, rpc_request *r) {
  int32_t n = get_i32(c, "an argument count");
  if (c->failed) return -1;
  /* Every value takes at least its 4-byte type index: a count the body cannot hold is a lie. */
  if (n < 0 || n > RPC_MAX_ARGS || (uint64_t)n * 4 > c->left) return fail(c, "bad argument count %d", n);
  r->num_args = n;
  if (n == 0) return 0;
  r->args = calloc((size_t)n, sizeof(rpc_value));
  if (!r->args) return fail(c, "out of memory decoding %d arguments", n);
  for (int32_t i = 0; i < n; i++) {
    if (get_value(c, &r->args[i]) != 0) {
      char inner[200];
      snprintf(inner, sizeof inner, "%s", c->err);
      c->failed = 0;
      return fail(c, "argument %d: %s", i, inner);
    }
  }
  return 0;
}

int rpc_parse_request(const uint8_t *body, uint64_t len, rpc_request *out, char *err, size_t err_size) {
  memset(out, 0, sizeof *out);
  cursor c = {body, len, err, err_size, 0};
  out->code = get_i32(&c, "the message code");
  if (c.failed) return -1;
  switch (out->code) {
    case RPC_SHUTDOWN:
      break;
    case RPC_INIT_SERVER:
      out->version_len = get_u64(&c, "the protocol version");
      out->version = take(&c, out->version_len, "the protocol version");
      if (!c.failed) get_seq(&c, out);
      break;
    case RPC_CALL_FUNC:
      out->handle = get_u64(&c, "the function handle");
      if (!c.failed) get_seq(&c, out);
      break;
    case RPC_COPY_FROM_REMOTE:
    case RPC_COPY_TO_REMOTE:
      if (get_tensor(&c, &out->tensor) != 0) break;
      out->nbytes = get_u64(&c, "the copy's size");
      if (out->code == RPC_COPY_TO_REMOTE) out->data = take(&c, out->nbytes, "the copied bytes");
      break;
    default:
      if (out->code >= RPC_GET_GLOBAL_FUNC && out->code <= 21) {
        get_seq(&c, out);
        break;
      }
      fail(&c, "unsupported RPC code %d", out->code);
  }
  if (!c.failed && c.left != 0) fail(&c, "%llu bytes after the end of the message", (unsigned long long)c.left);
  if (c.failed) {
    rpc_request_free(out);
    return -1;
  }
  return 0;
}

void rpc_request_free(rpc_request *request) {
  if (!request) return;
  free(request->args);
  request->args = NULL;
  request->num_args = 0;
}

int64_t rpc_nbytes(DLDataType dtype, int32_t ndim, const int64_t *dims, char *err, size_t err_size) {
  uint64_t element_bits = (uint64_t)dtype.bits * dtype.lanes;
  if (element_bits == 0) {
    snprintf(err, err_size, "tensor of an empty dtype (%u bits, %u lanes)", dtype.bits, dtype.lanes);
    return -1;
  }
  uint64_t count = 1;
  int zero = 0;
  for (int32_t i = 0; i < ndim; i++) {
    if (dims[i] < 0) {
      snprintf(err, err_size, "tensor dimension %d is negative (%lld)", i, (long long)dims[i]);
      return -1;
    }
    if (dims[i] == 0) zero = 1;
    /* 2^48 elements is past any memory; checking each step keeps the product from wrapping. */
    if (!zero && (uint64_t)dims[i] > (1ull << 48) / count) {
      snprintf(err, err_size, "tensor of more than 2^48 elements");
      return -1;
    }
    if (!zero) count *= (uint64_t)dims[i];
  }
  if (zero) return 0;
  return (int64_t)((count * element_bits + 7) / 8);
}

int64_t rpc_tensor_nbytes(const rpc_tensor *tensor, char *err, size_t err_size) {
  int64_t dims[RPC_MAX_NDIM];
  for (int32_t i = 0; i < tensor->ndim; i++) dims[i] = rpc_tensor_dim(tensor, i);
  return rpc_nbytes(tensor->dtype, tensor->ndim, dims, err, err_size);
}

/* ---- Replies ----------------------------------------------------------------------------------- */

static void reserve(rpc_writer *w, size_t more) {
  if (w->failed) return;
  if (w->len + more <= w->cap) return;
  size_t cap = w->cap ? w->cap : 256;
  while (cap < w->len + more) cap *= 2;
  uint8_t *grown = realloc(w->buf, cap);
  if (!grown) {
    w->failed = 1;
    return;
  }
  w->buf = grown;
  w->cap = cap;
}

void rpc_put_bytes(rpc_writer *w, const void *data, size_t len) {
  reserve(w, len);
  if (w->failed || len == 0) return;
  memcpy(w->buf + w->len, data, len);
  w->len += len;
}

static void put_le(rpc_writer *w, uint64_t v, int width) {
  uint8_t b[8];
  for (int i = 0; i < width; i++) b[i] = (uint8_t)(v >> (8 * i));
  rpc_put_bytes(w, b, (size_t)width);
}

void rpc_put_i32(rpc_writer *w, int32_t v) { put_le(w, (uint32_t)v, 4); }
void rpc_put_u64(rpc_writer *w, uint64_t v) { put_le(w, v, 8); }

void rpc_begin(rpc_writer *w, int32_t code) {
  w->len = 0;
  w->failed = 0;
  rpc_put_u64(w, 0);
  rpc_put_i32(w, code);
}

int rpc_finish(rpc_writer *w) {
  if (w->failed || w->len < 8) return -1;
  uint64_t body = w->len - 8;
  for (int i = 0; i < 8; i++) w->buf[i] = (uint8_t)(body >> (8 * i));
  return 0;
}

void rpc_writer_free(rpc_writer *w) {
  free(w->buf);
  memset(w, 0, sizeof *w);
}

void rpc_put_none(rpc_writer *w) { rpc_put_i32(w, kTVMFFINone); }

void rpc_put_int(rpc_writer *w, int32_t type, int64_t v) {
  rpc_put_i32(w, type);
  rpc_put_u64(w, (uint64_t)v);
}

void rpc_put_float(rpc_writer *w, double v) {
  uint64_t bits;
  memcpy(&bits, &v, 8);
  rpc_put_i32(w, kTVMFFIFloat);
  rpc_put_u64(w, bits);
}

void rpc_put_handle(rpc_writer *w, uint64_t handle) {
  rpc_put_i32(w, kTVMFFIOpaquePtr);
  rpc_put_u64(w, handle);
}

void rpc_put_str(rpc_writer *w, int32_t type, const void *data, uint64_t len) {
  rpc_put_i32(w, type);
  rpc_put_u64(w, len);
  rpc_put_bytes(w, data, (size_t)len);
}

void rpc_put_tensor(rpc_writer *w, uint64_t token, const DLTensor *t) {
  rpc_put_i32(w, kTVMFFIDLTensorPtr);
  rpc_put_u64(w, token);
  rpc_put_i32(w, kDLCPU);
  rpc_put_i32(w, 0);
  rpc_put_i32(w, t->ndim);
  uint8_t dtype[4] = {t->dtype.code, t->dtype.bits, (uint8_t)t->dtype.lanes, (uint8_t)(t->dtype.lanes >> 8)};
  rpc_put_bytes(w, dtype, 4);
  for (int32_t i = 0; i < t->ndim; i++) rpc_put_u64(w, (uint64_t)t->shape[i]);
  rpc_put_u64(w, 0);
}

void rpc_exception(rpc_writer *w, const char *message) {
  rpc_begin(w, RPC_EXCEPTION);
  rpc_put_i32(w, 1);
  rpc_put_str(w, kTVMFFIRawStr, message, strlen(message));
  rpc_finish(w);
}
