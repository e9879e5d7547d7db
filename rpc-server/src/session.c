/*
 * session.c: one client's session. Reads packets (a length checked against --max-packet before
 * anything is allocated for it), answers each request in order (tvm-rpc.md §5), and keeps the
 * handle table: every handle the client holds names a slot and its serial number, and a module
 * stays loaded while any function, timer or value from it lives, whatever order the client's
 * garbage collector frees them in (§8). At the end everything the session held is freed.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rpc.h"

/* At most this many live handles: a client that never frees cannot grow the table forever. */
#define MAX_ENTRIES (1u << 20)

/* Handle layout: serial << 32 | (slot + 1) << 4; a data token sets bit 3 of its handle. */
#define DATA_BIT 0x8u

uint64_t rpc_data_token(uint64_t handle) { return handle | DATA_BIT; }

static uint64_t handle_of(uint32_t serial, uint32_t slot) { return ((uint64_t)serial << 32) | ((uint64_t)(slot + 1) << 4); }

int32_t rpc_entry_index(const rpc_session *s, const rpc_entry *e) { return (int32_t)(e - s->entries); }

uint64_t rpc_entry_new(rpc_session *s, rpc_entry_kind kind, int32_t module, rpc_entry **out) {
  uint32_t slot = 0;
  while (slot < s->capacity && s->entries[slot].serial != 0) slot++;
  if (slot == s->capacity) {
    if (s->capacity >= MAX_ENTRIES) return 0;
    uint32_t grown = s->capacity ? s->capacity * 2 : 64;
    rpc_entry *bigger = realloc(s->entries, grown * sizeof *bigger);
    if (!bigger) return 0;
    memset(bigger + s->capacity, 0, (grown - s->capacity) * sizeof *bigger);
    s->entries = bigger;
    s->capacity = grown;
  }
  if (++s->next_serial == 0) s->next_serial = 1;
  rpc_entry *e = &s->entries[slot];
  memset(e, 0, sizeof *e);
  e->serial = s->next_serial;
  e->kind = kind;
  e->held = 1;
  e->module = module;
  if (module >= 0) s->entries[module].dependents++;
  *out = e;
  return handle_of(e->serial, slot);
}

static rpc_entry *lookup(rpc_session *s, uint64_t handle, int data) {
  if ((handle & 0xF) != (data ? DATA_BIT : 0)) return NULL;
  uint64_t slot_plus_one = (handle >> 4) & 0xFFFFFFFu;
  uint32_t serial = (uint32_t)(handle >> 32);
  if (slot_plus_one == 0 || slot_plus_one > s->capacity || serial == 0) return NULL;
  rpc_entry *e = &s->entries[slot_plus_one - 1];
  return e->serial == serial ? e : NULL;
}

rpc_entry *rpc_entry_get(rpc_session *s, uint64_t handle) { return lookup(s, handle, 0); }

static void destroy(rpc_session *s, rpc_entry *e) {
  switch (e->kind) {
    case RPC_ENTRY_MODULE:
      rpc_module_close(e);
      break;
    case RPC_ENTRY_VALUE:
      s->entries[e->module].u.module.api->value_release(&e->u.value);
      break;
    case RPC_ENTRY_BUFFER:
      free(e->u.buffer.ptr);
      s->allocated -= e->u.buffer.size;
      break;
    default:
      break;
  }
  int32_t module = e->module;
  memset(e, 0, sizeof *e);
  if (module >= 0) {
    rpc_entry *m = &s->entries[module];
    if (--m->dependents == 0 && !m->held) destroy(s, m);
  }
}

void rpc_entry_release(rpc_session *s, rpc_entry *e) {
  e->held = 0;
  if (e->kind != RPC_ENTRY_MODULE || e->dependents == 0) destroy(s, e);
}

int rpc_resolve_tensor(rpc_session *s, const rpc_tensor *t, int64_t nbytes, DLTensor *out, int64_t *shape, char *err,
                       size_t err_size) {
  if (t->device_type != kDLCPU) {
    snprintf(err, err_size, "tensor on device type %d: this server has only the CPU (remote.cpu())", t->device_type);
    return -1;
  }
  int64_t size = rpc_tensor_nbytes(t, err, err_size);
  if (size < 0) return -1;
  if (nbytes < 0) nbytes = size;
  uint8_t *base;
  uint64_t capacity;
  rpc_entry *e = lookup(s, t->data, 1);
  if (e && e->kind == RPC_ENTRY_BUFFER) {
    base = e->u.buffer.ptr;
    capacity = e->u.buffer.size;
  } else if (e && e->kind == RPC_ENTRY_VALUE && e->u.value.type_index == kTVMFFITensor) {
    const DLTensor *held = s->entries[e->module].u.module.api->tensor_view(&e->u.value);
    base = (uint8_t *)held->data + held->byte_offset;
    int64_t held_size = rpc_nbytes(held->dtype, held->ndim, held->shape, err, err_size);
    if (held_size < 0) return -1;
    capacity = (uint64_t)held_size;
  } else {
    snprintf(err, err_size, "tensor data 0x%llx is not memory of this session (freed, or never allocated here)",
             (unsigned long long)t->data);
    return -1;
  }
  if (t->byte_offset > capacity || (uint64_t)nbytes > capacity - t->byte_offset) {
    snprintf(err, err_size, "%lld bytes at offset %llu overrun the %llu bytes of tensor data 0x%llx", (long long)nbytes,
             (unsigned long long)t->byte_offset, (unsigned long long)capacity, (unsigned long long)t->data);
    return -1;
  }
  for (int32_t i = 0; i < t->ndim; i++) shape[i] = rpc_tensor_dim(t, i);
  memset(out, 0, sizeof *out);
  out->data = base + t->byte_offset;
  out->device.device_type = kDLCPU;
  out->ndim = t->ndim;
  out->dtype = t->dtype;
  out->shape = shape;
  return 0;
}

/* ---- Requests --------------------------------------------------------------------------------- */

static void reply_void(rpc_writer *w) {
  rpc_begin(w, RPC_RETURN);
  rpc_put_i32(w, 1);
  rpc_put_none(w);
  rpc_finish(w);
}

static void reply_handle(rpc_writer *w, uint64_t handle) {
  rpc_begin(w, RPC_RETURN);
  rpc_put_i32(w, 1);
  rpc_put_handle(w, handle);
  rpc_finish(w);
}

static int arg_is(const rpc_request *r, int32_t i, int32_t type) { return i < r->num_args && r->args[i].type == type; }

/* Allocates tensor data (64-byte aligned, as TVM's kernels assume) and answers its token. */
static int allocate(rpc_session *s, uint64_t size, rpc_writer *w, char *err, size_t err_size) {
  void *ptr = NULL;
  if (s->limits.max_memory && size > s->limits.max_memory - s->allocated) {
    snprintf(err, err_size, "MemoryError: %llu more bytes of tensor data would pass the server's limit of %llu (--max-memory)",
             (unsigned long long)size, (unsigned long long)s->limits.max_memory);
    return -1;
  }
  if (size > (1ull << 48) || posix_memalign(&ptr, 64, size ? (size_t)size : 1) != 0) {
    snprintf(err, err_size, "out of memory allocating %llu bytes of tensor data", (unsigned long long)size);
    return -1;
  }
  rpc_entry *e;
  uint64_t handle = rpc_entry_new(s, RPC_ENTRY_BUFFER, -1, &e);
  if (!handle) {
    free(ptr);
    snprintf(err, err_size, "too many live handles in this session");
    return -1;
  }
  e->u.buffer.ptr = ptr;
  e->u.buffer.size = size;
  s->allocated += size;
  reply_handle(w, rpc_data_token(handle));
  return 0;
}

static int check_cpu(const rpc_request *r, char *err, size_t err_size) {
  if (arg_is(r, 0, kTVMFFIDevice) && r->args[0].v.device.device_type != kDLCPU) {
    snprintf(err, err_size, "device type %d: this server has only the CPU", r->args[0].v.device.device_type);
    return -1;
  }
  return 0;
}

/* Answers one well-formed request in w. Returns 0, or -1 with a message for a kException. */
static int answer(rpc_session *s, const rpc_request *r, rpc_writer *w, char *err, size_t err_size) {
  if (!s->initialized && r->code != RPC_INIT_SERVER) {
    snprintf(err, err_size, "the session must begin with kInitServer (got code %d)", r->code);
    return -1;
  }
  switch (r->code) {
    case RPC_INIT_SERVER: {
      size_t want = strlen(RPC_PROTOCOL_VERSION);
      if (r->version_len != want || memcmp(r->version, RPC_PROTOCOL_VERSION, want) != 0) {
        snprintf(err, err_size, "client protocol version %.*s, this server speaks %s",
                 (int)(r->version_len > 32 ? 32 : r->version_len), (const char *)r->version, RPC_PROTOCOL_VERSION);
        return -1;
      }
      if (r->num_args > 0) {
        snprintf(err, err_size, "session constructors (proxy hops) are not supported by relaxc's server");
        return -1;
      }
      s->initialized = 1;
      reply_void(w);
      return 0;
    }
    case RPC_CALL_FUNC:
      return rpc_call(s, r->handle, r->args, r->num_args, w, err, err_size);
    case RPC_GET_GLOBAL_FUNC: {
      if (!arg_is(r, 0, kTVMFFIRawStr) && !arg_is(r, 0, kTVMFFIStr)) {
        snprintf(err, err_size, "kGetGlobalFunc needs a name");
        return -1;
      }
      int builtin = rpc_builtin_find(r->args[0].v.bytes.data, r->args[0].v.bytes.len);
      uint64_t handle = 0;
      if (builtin >= 0) {
        rpc_entry *e;
        handle = rpc_entry_new(s, RPC_ENTRY_BUILTIN, -1, &e);
        if (!handle) {
          snprintf(err, err_size, "too many live handles in this session");
          return -1;
        }
        e->u.builtin = (rpc_builtin)builtin;
      }
      /* An unknown name is a null handle, not an error: the client asks for optional ones. */
      reply_handle(w, handle);
      return 0;
    }
    case RPC_FREE_HANDLE: {
      rpc_entry *e = arg_is(r, 0, kTVMFFIOpaquePtr) ? rpc_entry_get(s, r->args[0].v.handle) : NULL;
      if (!e || !e->held || e->kind == RPC_ENTRY_BUFFER) {
        snprintf(err, err_size, "kFreeHandle of an unknown handle");
        return -1;
      }
      rpc_entry_release(s, e);
      reply_void(w);
      return 0;
    }
    case RPC_DEV_ALLOC_DATA_WITH_SCOPE: {
      if (!arg_is(r, 0, kTVMFFIDLTensorPtr)) {
        snprintf(err, err_size, "kDevAllocDataWithScope needs a tensor");
        return -1;
      }
      if (r->num_args > 1 && !arg_is(r, 1, kTVMFFINone)) {
        const rpc_value *scope = &r->args[1];
        int global = (scope->type == kTVMFFIRawStr || scope->type == kTVMFFIStr) &&
                     ((scope->v.bytes.len == 6 && memcmp(scope->v.bytes.data, "global", 6) == 0) || scope->v.bytes.len == 0);
        if (!global) {
          snprintf(err, err_size, "memory scopes other than \"global\" are not supported");
          return -1;
        }
      }
      const rpc_tensor *t = &r->args[0].v.tensor;
      if (t->device_type != kDLCPU) {
        snprintf(err, err_size, "device type %d: this server has only the CPU", t->device_type);
        return -1;
      }
      int64_t size = rpc_tensor_nbytes(t, err, err_size);
      if (size < 0) return -1;
      return allocate(s, (uint64_t)size, w, err, err_size);
    }
    case RPC_DEV_ALLOC_DATA: {
      if (check_cpu(r, err, err_size) != 0) return -1;
      if (!arg_is(r, 1, kTVMFFIInt) || r->args[1].v.i < 0) {
        snprintf(err, err_size, "kDevAllocData needs a size");
        return -1;
      }
      return allocate(s, (uint64_t)r->args[1].v.i, w, err, err_size);
    }
    case RPC_DEV_FREE_DATA: {
      if (check_cpu(r, err, err_size) != 0) return -1;
      rpc_entry *e = arg_is(r, 1, kTVMFFIOpaquePtr) ? lookup(s, r->args[1].v.handle, 1) : NULL;
      if (!e || e->kind != RPC_ENTRY_BUFFER) {
        snprintf(err, err_size, "kDevFreeData of memory this session did not allocate");
        return -1;
      }
      rpc_entry_release(s, e);
      reply_void(w);
      return 0;
    }
    case RPC_DEV_SET_DEVICE:
    case RPC_DEV_STREAM_SYNC:
      if (check_cpu(r, err, err_size) != 0) return -1;
      reply_void(w); /* the CPU has no streams: every copy is done when it is answered */
      return 0;
    case RPC_DEV_GET_ATTR: {
      if (check_cpu(r, err, err_size) != 0) return -1;
      if (!arg_is(r, 1, kTVMFFIInt) || r->args[1].v.i != 0) {
        snprintf(err, err_size, "device attributes other than kExist are not supported");
        return -1;
      }
      rpc_begin(w, RPC_RETURN);
      rpc_put_i32(w, 1);
      rpc_put_int(w, kTVMFFIInt, 1);
      rpc_finish(w);
      return 0;
    }
    case RPC_COPY_TO_REMOTE:
    case RPC_COPY_FROM_REMOTE: {
      DLTensor t;
      int64_t shape[RPC_MAX_NDIM];
      if (r->nbytes > (1ull << 62)) {
        snprintf(err, err_size, "copy of %llu bytes", (unsigned long long)r->nbytes);
        return -1;
      }
      if (rpc_resolve_tensor(s, &r->tensor, (int64_t)r->nbytes, &t, shape, err, err_size) != 0) return -1;
      if (r->code == RPC_COPY_TO_REMOTE) {
        if (r->nbytes) memcpy(t.data, r->data, (size_t)r->nbytes);
        reply_void(w);
        return 0;
      }
      /* kCopyAck is raw bytes after the code, not a packed sequence (§5.4). */
      rpc_begin(w, RPC_COPY_ACK);
      rpc_put_bytes(w, t.data, (size_t)r->nbytes);
      rpc_finish(w);
      return 0;
    }
    case RPC_COPY_AMONG_REMOTE: {
      DLTensor from, to;
      int64_t from_shape[RPC_MAX_NDIM], to_shape[RPC_MAX_NDIM];
      if (!arg_is(r, 0, kTVMFFIDLTensorPtr) || !arg_is(r, 1, kTVMFFIDLTensorPtr)) {
        snprintf(err, err_size, "kCopyAmongRemote needs two tensors");
        return -1;
      }
      if (rpc_resolve_tensor(s, &r->args[0].v.tensor, -1, &from, from_shape, err, err_size) != 0 ||
          rpc_resolve_tensor(s, &r->args[1].v.tensor, -1, &to, to_shape, err, err_size) != 0)
        return -1;
      int64_t a = rpc_tensor_nbytes(&r->args[0].v.tensor, err, err_size);
      int64_t b = rpc_tensor_nbytes(&r->args[1].v.tensor, err, err_size);
      if (a != b) {
        snprintf(err, err_size, "copy between tensors of %lld and %lld bytes", (long long)a, (long long)b);
        return -1;
      }
      memmove(to.data, from.data, (size_t)a);
      reply_void(w);
      return 0;
    }
    default:
      snprintf(err, err_size, "unsupported RPC code %d", r->code);
      return -1;
  }
}

/* Reads and drops n bytes of the stream. Returns 0 or -1. */
static int discard(int fd, uint64_t n) {
  uint8_t chunk[65536];
  while (n) {
    size_t step = n < sizeof chunk ? (size_t)n : sizeof chunk;
    if (rpc_read_exact(fd, chunk, step) != 0) return -1;
    n -= step;
  }
  return 0;
}

static int send_reply(rpc_session *s, rpc_writer *w) { return rpc_write_all(s->fd, w->buf, w->len); }

static uint64_t le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static uint32_t le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* A packet over --max-packet: only an upload may be that large (the client chunks copies to the
 * size GetCRTMaxPacketSize reports). Its head is read and checked, then the file's bytes go
 * from the socket to disk without being held in memory. Returns 0 (answered), -1 (closed). */
static int large_packet(rpc_session *s, uint64_t len, rpc_writer *w) {
  uint8_t head[4 + 8 + 4 + 4 + 8], name[RPC_MAX_NAME], blob_head[4 + 4 + 8];
  const char *why = NULL;
  if (len < sizeof head || rpc_read_exact(s->fd, head, sizeof head) != 0) return -1;
  uint64_t name_len = le64(head + 20);
  rpc_entry *e = rpc_entry_get(s, le64(head + 4));
  if (le32(head) != RPC_CALL_FUNC || !e || e->kind != RPC_ENTRY_BUILTIN || e->u.builtin != RPC_FN_UPLOAD ||
      le32(head + 12) != 2 || le32(head + 16) != kTVMFFIRawStr)
    why = "is not an upload";
  else if (name_len > RPC_MAX_NAME)
    why = "names an upload of over 255 bytes";
  else if (rpc_read_exact(s->fd, name, (size_t)name_len) != 0 || rpc_read_exact(s->fd, blob_head, sizeof blob_head) != 0)
    return -1;
  else if ((le32(blob_head) != kTVMFFIBytes && le32(blob_head) != kTVMFFISmallBytes) || le32(blob_head + 4) != kTVMFFIBytes ||
           le64(blob_head + 8) != len - sizeof head - name_len - sizeof blob_head)
    why = "is a malformed upload";
  if (why) {
    fprintf(stderr, "relaxc rpc-server: closing the connection: a message of %llu bytes (over --max-packet %llu) %s\n",
            (unsigned long long)len, (unsigned long long)s->limits.max_packet, why);
    return -1;
  }
  char err[512];
  int rc = rpc_upload_stream(s, name, name_len, s->fd, le64(blob_head + 8), err, sizeof err);
  if (rc == -2) return -1;
  if (rc == 0) {
    rpc_begin(w, RPC_RETURN);
    rpc_put_i32(w, 2);
    rpc_put_int(w, kTVMFFIInt, kTVMFFINone);
    rpc_put_none(w);
    rpc_finish(w);
  } else {
    rpc_exception(w, err);
  }
  return send_reply(s, w) == 0 ? 0 : -1;
}

void rpc_session_init(rpc_session *s, int fd, const char *workdir, const rpc_limits *limits) {
  memset(s, 0, sizeof *s);
  s->fd = fd;
  s->workdir = workdir;
  s->limits = *limits;
}

int rpc_session_packet(rpc_session *s, const uint8_t *body, uint64_t len, rpc_writer *w) {
  rpc_request request;
  char err[1024];
  int shutdown = 0;
  if (rpc_parse_request(body, len, &request, err, sizeof err) != 0) {
    char message[1100];
    snprintf(message, sizeof message, "malformed message: %s", err);
    rpc_exception(w, message);
  } else if (request.code == RPC_SHUTDOWN) {
    shutdown = 1;
  } else if (answer(s, &request, w, err, sizeof err) != 0) {
    rpc_exception(w, err);
  }
  rpc_request_free(&request);
  if (!shutdown && w->failed) rpc_exception(w, "MemoryError: out of memory writing the reply");
  return shutdown;
}

void rpc_session_end(rpc_session *s) {
  /* Values first (each may hold its module), then whatever modules remain. */
  for (uint32_t i = 0; i < s->capacity; i++)
    if (s->entries[i].serial && s->entries[i].kind != RPC_ENTRY_MODULE) rpc_entry_release(s, &s->entries[i]);
  for (uint32_t i = 0; i < s->capacity; i++)
    if (s->entries[i].serial) rpc_entry_release(s, &s->entries[i]);
  free(s->entries);
  s->entries = NULL;
  s->capacity = 0;
}

int rpc_serve_session(int fd, const char *workdir, const rpc_limits *limits) {
  rpc_session s;
  rpc_session_init(&s, fd, workdir, limits);
  rpc_writer w = {0};
  int status = 0;
  for (;;) {
    uint8_t length[8];
    int got = rpc_read_exact(fd, length, sizeof length);
    if (got == 1) break; /* the client closed between messages: a clean end */
    if (got != 0) {
      fprintf(stderr, "relaxc rpc-server: the client went away in the middle of a message\n");
      status = 1;
      break;
    }
    uint64_t len = le64(length);
    if (len == 0) continue;
    if (len > limits->max_packet) {
      if (large_packet(&s, len, &w) != 0) {
        status = 1;
        break;
      }
      continue;
    }
    uint8_t *body = malloc((size_t)len);
    if (!body) {
      if (discard(fd, len) != 0) {
        status = 1;
        break;
      }
      rpc_exception(&w, "MemoryError: out of memory reading a message");
      if (send_reply(&s, &w) != 0) break;
      continue;
    }
    if (rpc_read_exact(fd, body, (size_t)len) != 0) {
      free(body);
      fprintf(stderr, "relaxc rpc-server: the client went away in the middle of a message\n");
      status = 1;
      break;
    }
    int shutdown = rpc_session_packet(&s, body, len, &w);
    free(body);
    if (shutdown) break;
    if (send_reply(&s, &w) != 0) {
      status = 1;
      break;
    }
  }
  rpc_session_end(&s);
  rpc_writer_free(&w);
  return status;
}
