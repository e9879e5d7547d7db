/*
 * rpc.h: the pieces of relaxc's board server for TVM's RPC protocol (docs/src/architecture/tvm-rpc.md),
 * shared by its files: transport.c (sockets), codec.c (bytes on the wire <-> requests and
 * replies, no I/O), session.c (one client's handles and requests), served.c (the functions a
 * client calls: upload, load_module, model functions, the time evaluator), tracker.c (TVM's
 * tracker) and main.c (options, the listener, one forked process per session).
 *
 * Everything read from the wire is hostile: the codec checks every length and count against the
 * bytes that are there before it uses it, and nothing is allocated from a length it has not
 * checked. Integers on the wire are little-endian, as on every CPU relaxc builds for.
 */
#ifndef RPC_H
#define RPC_H

#include <stddef.h>
#include <stdint.h>

#include "rvm.h"

/* ---- Protocol constants (tvm-rpc.md §1, §4) ------------------------------------------------ */

#define RPC_MAGIC 0xFF271
#define RPC_MAGIC_KEY_MISMATCH 0xFF273
#define RPC_PROTOCOL_VERSION "0.8.0"
#define RPC_TRACKER_MAGIC 0x2F271

enum {
  RPC_SHUTDOWN = 1,
  RPC_INIT_SERVER = 2,
  RPC_CALL_FUNC = 3,
  RPC_RETURN = 4,
  RPC_EXCEPTION = 5,
  RPC_COPY_FROM_REMOTE = 6,
  RPC_COPY_TO_REMOTE = 7,
  RPC_COPY_ACK = 8,
  RPC_GET_GLOBAL_FUNC = 9,
  RPC_FREE_HANDLE = 10,
  RPC_DEV_SET_DEVICE = 11,
  RPC_DEV_GET_ATTR = 12,
  RPC_DEV_ALLOC_DATA = 13,
  RPC_DEV_FREE_DATA = 14,
  RPC_DEV_STREAM_SYNC = 15,
  RPC_COPY_AMONG_REMOTE = 16,
  RPC_DEV_ALLOC_DATA_WITH_SCOPE = 17,
};

/* Limits on what one request may ask for, whatever its length says. */
#define RPC_MAX_ARGS 65536
#define RPC_MAX_NDIM 64
#define RPC_MAX_NAME 255

/* The RPCObjectRef type index (kTVMFFIDynObjectBegin - 13), a boxed handle of a remote object. */
#define RPC_TYPE_OBJECT_REF 115

/* ---- Decoded values and requests (codec.c) -------------------------------------------------- */

/* A DLTensor as it travels (§3.2): `data` is the server's opaque token, the shape stays in the
 * request's bytes (unaligned; read it with rpc_tensor_dim). */
typedef struct rpc_tensor {
  uint64_t data;
  int32_t device_type;
  int32_t device_id;
  int32_t ndim;
  DLDataType dtype;
  const uint8_t *shape_bytes;
  uint64_t byte_offset;
} rpc_tensor;

/* One value of a packed sequence. `type` is the wire type index, except that boxed strings,
 * bytes and object references are unboxed to 65, 66 and RPC_TYPE_OBJECT_REF. Pointers point into
 * the request's bytes. */
typedef struct rpc_value {
  int32_t type;
  union {
    int64_t i;
    double f;
    uint64_t handle;
    DLDevice device;
    DLDataType dtype;
    rpc_tensor tensor;
    struct {
      const uint8_t *data;
      uint64_t len;
    } bytes;
  } v;
} rpc_value;

/* One request (a packet body). For kCallFunc: handle and args; kInitServer: version and args;
 * copies: tensor, nbytes and (kCopyToRemote) data; syscalls: args. */
typedef struct rpc_request {
  int32_t code;
  uint64_t handle;
  const uint8_t *version;
  uint64_t version_len;
  rpc_tensor tensor;
  uint64_t nbytes;
  const uint8_t *data;
  int32_t num_args;
  rpc_value *args; /* owned; freed by rpc_request_free */
} rpc_request;

/* Decodes a packet body of `len` bytes into *out (which then points into `body`). Returns 0, or
 * -1 with a message naming what was wrong in err (of err_size bytes). */
int rpc_parse_request(const uint8_t *body, uint64_t len, rpc_request *out, char *err, size_t err_size);

/* Frees what rpc_parse_request allocated; safe on a zeroed or failed request. */
void rpc_request_free(rpc_request *request);

/* Dimension i of a decoded tensor's shape. */
int64_t rpc_tensor_dim(const rpc_tensor *tensor, int32_t i);

/* The bytes a compact tensor of `ndim` dims and this dtype holds, or -1 (with err) when a
 * dimension is negative, the dtype is empty or the size passes 2^48 elements. */
int64_t rpc_nbytes(DLDataType dtype, int32_t ndim, const int64_t *dims, char *err, size_t err_size);

/* rpc_nbytes of a tensor from the wire. */
int64_t rpc_tensor_nbytes(const rpc_tensor *tensor, char *err, size_t err_size);

/* ---- Replies (codec.c) ---------------------------------------------------------------------- */

/* A growing buffer for one reply packet. After a failed allocation `failed` is set and later
 * writes do nothing; the caller checks it once before sending. */
typedef struct rpc_writer {
  uint8_t *buf;
  size_t len;
  size_t cap;
  int failed;
} rpc_writer;

/* Starts a packet with this code (its length is filled in by rpc_finish). */
void rpc_begin(rpc_writer *w, int32_t code);
/* Fills in the packet's length; returns 0, or -1 if memory ran out while writing it. */
int rpc_finish(rpc_writer *w);
/* Frees the buffer. */
void rpc_writer_free(rpc_writer *w);

/* Appends raw bytes (copied). */
void rpc_put_bytes(rpc_writer *w, const void *data, size_t len);
/* Appends a little-endian i32. */
void rpc_put_i32(rpc_writer *w, int32_t v);
/* Appends a little-endian u64. */
void rpc_put_u64(rpc_writer *w, uint64_t v);
/* A None value of a packed sequence (each rpc_put_<value> writes its type index and payload). */
void rpc_put_none(rpc_writer *w);
/* An Int (1) or Bool (2) value. */
void rpc_put_int(rpc_writer *w, int32_t type, int64_t v);
/* A Float (3) value. */
void rpc_put_float(rpc_writer *w, double v);
/* An OpaquePtr (4) value: a handle or data token. */
void rpc_put_handle(rpc_writer *w, uint64_t handle);
/* A RawStr (8) or ByteArrayPtr (9) value: length, then the bytes (copied). */
void rpc_put_str(rpc_writer *w, int32_t type, const void *data, uint64_t len);
/* A DLTensor value (7) for a tensor the server holds: token, CPU device, shape and dtype. */
void rpc_put_tensor(rpc_writer *w, uint64_t token, const DLTensor *t);

/* A complete kException packet carrying `message`. */
void rpc_exception(rpc_writer *w, const char *message);

/* ---- Transport (transport.c) ---------------------------------------------------------------- */

/* Listens on host:port (port 0: any free port); *bound_port gets the port. Returns the socket,
 * or -1 with a message in err. */
int rpc_listen(const char *host, int port, int *bound_port, char *err, size_t err_size);
/* Connects to host:port, or returns -1 with a message in err. */
int rpc_connect(const char *host, int port, char *err, size_t err_size);
/* Reads exactly n bytes. Returns 0, 1 at end of stream before the first byte, -1 on an error or
 * an end of stream after it. */
int rpc_read_exact(int fd, void *buf, size_t n);
/* Writes all n bytes (no SIGPIPE). Returns 0 or -1. */
int rpc_write_all(int fd, const void *buf, size_t n);
/* Sets (seconds > 0) or clears (0) a receive timeout on a socket. */
void rpc_set_read_timeout(int fd, double seconds);
/* Whether host names a loopback address (127.0.0.0/8, ::1, "localhost"). */
int rpc_is_loopback(const char *host);

/* ---- Sessions (session.c, served.c) --------------------------------------------------------- */

/* What a session may do, from the command line. */
typedef struct rpc_limits {
  uint64_t max_packet; /* largest packet body read into memory; copies are chunked to it */
  uint64_t max_upload; /* largest uploaded file */
  uint64_t max_memory; /* most tensor memory a client may allocate at once (0: no limit) */
} rpc_limits;

/* Serves one client on `fd` (after the handshake) until it shuts down or disconnects, with
 * uploads in `workdir` (which the caller made and removes). Returns 0 for a clean end, 1 when
 * the connection was closed for a protocol error (reported on stderr). */
int rpc_serve_session(int fd, const char *workdir, const rpc_limits *limits);

typedef struct rpc_session rpc_session;

/* Starts a session's state on `fd` (the caller owns fd and workdir, which must outlive it). */
void rpc_session_init(rpc_session *s, int fd, const char *workdir, const rpc_limits *limits);
/* Answers one packet body into w (a reply, or a kException for anything wrong with it).
 * Returns 1 for kShutdown, which has no reply, else 0. No I/O: the fuzz target drives this. */
int rpc_session_packet(rpc_session *s, const uint8_t *body, uint64_t len, rpc_writer *w);
/* Frees everything the session holds: values, buffers, timers, functions, then modules. */
void rpc_session_end(rpc_session *s);

/* The built-in global functions a client can look up (tvm-rpc.md §6). */
typedef enum rpc_builtin {
  RPC_FN_UPLOAD,
  RPC_FN_LOAD_MODULE,
  RPC_FN_MODULE_GET_FUNCTION,
  RPC_FN_TIME_EVALUATOR,
  RPC_FN_MAX_PACKET_SIZE,
  RPC_FN_ARRAY_SIZE,
  RPC_FN_ARRAY_GET_ITEM,
  RPC_FN_COUNT,
} rpc_builtin;

/* The built-in named `name`, or -1 for a name the server does not have. */
int rpc_builtin_find(const uint8_t *name, uint64_t len);

/* Calls the function behind `handle` (a built-in, a model function, a closure or a timer) with
 * the request's arguments and writes the kReturn reply into w. Returns 0, or -1 with a message in
 * err (then nothing was written). */
int rpc_call(rpc_session *s, uint64_t handle, const rpc_value *args, int32_t num_args, rpc_writer *w, char *err,
             size_t err_size);

/* Stores an upload of `len` bytes read from `fd` (the rest of a packet too large for memory) as
 * `name` in the session's directory. Returns 0, -1 with a message in err when the upload was
 * refused but the bytes were consumed, -2 when the connection failed. */
int rpc_upload_stream(rpc_session *s, const uint8_t *name, uint64_t name_len, int fd, uint64_t len, char *err,
                      size_t err_size);

/* ---- Handles (session.c) -------------------------------------------------------------------- */

/* What a handle stands for. Handles are opaque to the client; each names a slot of the session's
 * table and the slot's serial number, so a stale or forged handle is refused, never followed. */
typedef enum rpc_entry_kind {
  RPC_ENTRY_FREE,
  RPC_ENTRY_BUILTIN,  /* a global function from kGetGlobalFunc */
  RPC_ENTRY_MODULE,   /* a loaded model: its library, API table, module and VM */
  RPC_ENTRY_FUNCTION, /* a Relax function of a module */
  RPC_ENTRY_TIMER,    /* a time evaluator of a module's function */
  RPC_ENTRY_VALUE,    /* a value a call returned (tensor, tuple, closure, ...), owned */
  RPC_ENTRY_BUFFER,   /* memory from kDevAllocDataWithScope */
} rpc_entry_kind;

typedef struct rpc_timer {
  int32_t function;
  int64_t number, repeat, min_repeat_ms, limit_zero_time_iterations, cooldown_interval_ms, repeats_to_cooldown,
      cache_flush_bytes;
} rpc_timer;

typedef struct rpc_entry {
  uint32_t serial;     /* 0 while the slot is free */
  rpc_entry_kind kind;
  int held;            /* the client holds the handle (it has not freed it yet) */
  uint32_t dependents; /* a module: the functions, timers and values that use it */
  int32_t module;      /* a function, timer or value: the slot of its module */
  union {
    rpc_builtin builtin;
    struct {
      void *library; /* from dlopen */
      const rvm_api *api;
      rvm_module *module;
      rvm_vm *vm;
    } module;
    int32_t function;
    rpc_timer timer;
    rvm_value value;
    struct {
      void *ptr; /* 64-byte aligned, owned */
      uint64_t size;
    } buffer;
  } u;
} rpc_entry;

struct rpc_session {
  int fd;
  const char *workdir;
  rpc_limits limits;
  int initialized;
  rpc_entry *entries;
  uint32_t capacity;
  uint32_t next_serial;
  uint64_t allocated; /* bytes of RPC_ENTRY_BUFFER memory held */
};

/* A new entry of `kind` (using module slot `module`, or -1); *out points at it until the table
 * next grows. Returns its handle, or 0 when the table is full or memory ran out. */
uint64_t rpc_entry_new(rpc_session *s, rpc_entry_kind kind, int32_t module, rpc_entry **out);
/* The live entry behind a handle, or NULL for anything else. */
rpc_entry *rpc_entry_get(rpc_session *s, uint64_t handle);
/* The slot index of an entry. */
int32_t rpc_entry_index(const rpc_session *s, const rpc_entry *e);
/* Drops the client's hold on an entry and frees it (and its module) once nothing uses it. */
void rpc_entry_release(rpc_session *s, rpc_entry *e);
/* The data token the client sees in DLTensor.data for the tensor or buffer behind `handle`. */
uint64_t rpc_data_token(uint64_t handle);
/* Resolves a tensor from the wire to memory the server holds: *out describes it (shape in
 * `shape`, RPC_MAX_NDIM entries) after checking the device is the CPU and that byte_offset plus
 * `nbytes` (the tensor's size when nbytes is -1) lies inside the memory. Returns 0 or -1 (err). */
int rpc_resolve_tensor(rpc_session *s, const rpc_tensor *t, int64_t nbytes, DLTensor *out, int64_t *shape, char *err,
                       size_t err_size);
/* Closes a module entry's VM, module and library (served.c). */
void rpc_module_close(rpc_entry *module);

/* ---- Tracker (tracker.c) -------------------------------------------------------------------- */

typedef struct rpc_tracker rpc_tracker;

/* Registers this server with TVM's tracker at host:port under `key`, serving on `server_port`.
 * A tracker that cannot be reached is warned about and retried. NULL only when out of memory. */
rpc_tracker *rpc_tracker_open(const char *host, int port, const char *key, int server_port);
/* The key a client must present ("KEY:random"), or NULL while not registered. */
const char *rpc_tracker_matchkey(const rpc_tracker *t);
/* Called every ~2 s while no client is connected: pings the tracker, re-registers when the
 * tracker has dropped or forgotten this server. */
void rpc_tracker_idle(rpc_tracker *t);
/* Registers a fresh match key after a session (TVM's server does the same). */
void rpc_tracker_renew(rpc_tracker *t);
/* Closes the tracker connection and frees t (NULL is fine). */
void rpc_tracker_close(rpc_tracker *t);

#endif
