/*
 * internal.h: what the shim's files share, and the tables relaxc emits into every model.
 *
 * The program tables are the contract between the compiler (src/codegen/tables.rs writes them
 * byte by byte, at the offsets its mirrors in src/abi/ give) and the shim (which reads them in
 * place). Their offsets are fixed here with _Static_assert, and tests/artifact.rs compares every
 * field of every struct relaxc mirrors with what the C compiler says.
 */
#ifndef RVM_INTERNAL_H
#define RVM_INTERNAL_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rvm.h"
#include "rvm_cuda.h"

#define RVM_HIDDEN __attribute__((visibility("hidden")))

/* ---- Program tables (emitted by relaxc) ------------------------------------------------- */

#define RVM_PROGRAM_MAGIC 0x31474f52504d5652ull /* "RVMPROG1" little-endian */
/* Version of the program tables below (independent of the C API's RVM_ABI_VERSION). */
#define RVM_PROGRAM_VERSION 1u

enum { RVM_FUNC_PACKED = 0, RVM_FUNC_BYTECODE = 1, RVM_FUNC_COMPILED = 2 };

/* rvm_program.exec_mode: 0 bytecode, 1 compiled, plus this flag for a model built with
 * --instrument, whose every Call goes through rvm_instrumented_call. */
#define RVM_PROGRAM_INSTRUMENTED 0x100u

/* A compiled Relax function: works on the register file of the frame its caller set up (the
 * arguments in regs[0..num_args)) and moves its result into *result. */
typedef int (*rvm_compiled_fn)(rvm_vm *vm, TVMFFIAny *regs, TVMFFIAny *result, const TVMFFIAny *consts,
                               const TVMFFIAny *funcs);

typedef struct rvm_func_info {
  const char *name;                /* NUL-terminated */
  TVMFFISafeCallType packed;       /* PACKED: the kernel or builtin */
  const char *const *param_names;  /* num_args entries */
  int64_t start_instr;             /* BYTECODE: [start_instr, end_instr) */
  int64_t end_instr;
  int64_t register_file_size;
  int32_t kind;
  int32_t num_args;
  rvm_compiled_fn compiled;        /* COMPILED: native body */
} rvm_func_info;

/* One constant-pool entry; `kind` is its TVM-FFI type index. */
typedef struct rvm_const_info {
  const void *data;     /* Tensor: element bytes (64-aligned, writable); Shape: int64 dims; Str: bytes */
  const int64_t *shape; /* Tensor: ndim dims */
  int64_t size;         /* Tensor: byte size; Shape: ndim; Str: length; Int: value; Float: bits */
  int32_t kind;
  int32_t ndim;         /* Tensor */
  DLDataType dtype;     /* Tensor and DataType */
  int32_t reserved;
} rvm_const_info;

typedef struct rvm_program {
  uint64_t magic;
  uint32_t abi_version;
  uint32_t exec_mode;
  const char *compiler_version;
  const char *target_triple;
  uint64_t executable_hash;
  int64_t num_funcs;
  const rvm_func_info *funcs;
  int64_t num_consts;
  const rvm_const_info *consts;
  int64_t num_instrs;
  const int64_t *instr_offset;
  const int64_t *instr_data;
} rvm_program;

_Static_assert(sizeof(rvm_func_info) == 64, "rvm_func_info layout");
_Static_assert(offsetof(rvm_func_info, packed) == 8, "rvm_func_info layout");
_Static_assert(offsetof(rvm_func_info, param_names) == 16, "rvm_func_info layout");
_Static_assert(offsetof(rvm_func_info, start_instr) == 24, "rvm_func_info layout");
_Static_assert(offsetof(rvm_func_info, end_instr) == 32, "rvm_func_info layout");
_Static_assert(offsetof(rvm_func_info, register_file_size) == 40, "rvm_func_info layout");
_Static_assert(offsetof(rvm_func_info, kind) == 48, "rvm_func_info layout");
_Static_assert(offsetof(rvm_func_info, num_args) == 52, "rvm_func_info layout");
_Static_assert(offsetof(rvm_func_info, compiled) == 56, "rvm_func_info layout");
_Static_assert(sizeof(rvm_const_info) == 40, "rvm_const_info layout");
_Static_assert(offsetof(rvm_const_info, shape) == 8, "rvm_const_info layout");
_Static_assert(offsetof(rvm_const_info, size) == 16, "rvm_const_info layout");
_Static_assert(offsetof(rvm_const_info, kind) == 24, "rvm_const_info layout");
_Static_assert(offsetof(rvm_const_info, ndim) == 28, "rvm_const_info layout");
_Static_assert(offsetof(rvm_const_info, dtype) == 32, "rvm_const_info layout");
_Static_assert(sizeof(rvm_program) == 96, "rvm_program layout");
_Static_assert(offsetof(rvm_program, abi_version) == 8, "rvm_program layout");
_Static_assert(offsetof(rvm_program, exec_mode) == 12, "rvm_program layout");
_Static_assert(offsetof(rvm_program, compiler_version) == 16, "rvm_program layout");
_Static_assert(offsetof(rvm_program, target_triple) == 24, "rvm_program layout");
_Static_assert(offsetof(rvm_program, executable_hash) == 32, "rvm_program layout");
_Static_assert(offsetof(rvm_program, num_funcs) == 40, "rvm_program layout");
_Static_assert(offsetof(rvm_program, funcs) == 48, "rvm_program layout");
_Static_assert(offsetof(rvm_program, num_consts) == 56, "rvm_program layout");
_Static_assert(offsetof(rvm_program, consts) == 64, "rvm_program layout");
_Static_assert(offsetof(rvm_program, num_instrs) == 72, "rvm_program layout");
_Static_assert(offsetof(rvm_program, instr_offset) == 80, "rvm_program layout");
_Static_assert(offsetof(rvm_program, instr_data) == 88, "rvm_program layout");

/* The tables of this model, defined by the object relaxc generates. */
extern const rvm_program rvm_model_program RVM_HIDDEN;

/* ---- Bytecode encoding (TVM's) ----------------------------------------------------------- */

enum { RVM_OP_CALL = 1, RVM_OP_RET = 2, RVM_OP_GOTO = 3, RVM_OP_IF = 4 };
enum { RVM_ARG_REG = 0, RVM_ARG_IMM = 1, RVM_ARG_CONST = 2, RVM_ARG_FUNC = 3 };
#define RVM_REG_VOID ((int64_t)1 << 54)
#define RVM_REG_VM (((int64_t)1 << 54) + 1)

/* ---- Objects ------------------------------------------------------------------------------ */

/* Tensor objects are allocated with room for at least this many dims, so that one cache of
 * equal-sized objects serves every tensor of up to this rank. */
enum { RVM_CACHED_NDIM = 4 };

/* Type indices of relaxc's own object kinds. Storage never leaves a VM: its index is fixed, far
 * above any tvm-ffi allocates. Closures and KV caches can reach a tvm-ffi host (Python), which
 * reads the index to pick a class: when libtvm_ffi is in the process their indices are
 * registered with it (as relaxc.Closure and relaxc.PagedAttentionKVCache, object.c), else they
 * are 128 and 130. */
enum { RVM_TYPE_STORAGE = 0x7fff0000 };
RVM_HIDDEN extern int32_t rvm_type_closure, rvm_type_kv_cache;

typedef struct rvm_pool rvm_pool;
typedef struct rvm_cuda rvm_cuda;

/* Storage: a 64-byte aligned buffer from an allocator, shared by the tensors viewing it. */
typedef struct rvm_storage {
  TVMFFIObject header;
  void *data;
  uint64_t nbytes;
  DLDevice device;
  rvm_pool *allocator; /* retained; NULL when data is plain malloc memory or device memory */
  rvm_cuda *cuda;           /* retained for device memory, else NULL */
} rvm_storage;

_Static_assert(offsetof(rvm_storage, data) == 24, "compiled code reads Storage.data at +24");
_Static_assert(offsetof(rvm_storage, nbytes) == 32, "compiled code reads Storage.nbytes at +32");
_Static_assert(offsetof(rvm_storage, device) == 40, "compiled code reads Storage.device at +40");

/* Tensor: header, the DLTensor at +24 (TVM-FFI layout), then what keeps the data alive, then the
 * shape and strides arrays inline. */
typedef struct rvm_tensor {
  TVMFFIObject header;
  DLTensor dl;
  TVMFFIObject *owner; /* storage or tensor whose data this views; NULL for borrowed data */
  rvm_pool *home; /* the allocator whose object cache may take this object back, or NULL */
  int64_t dims[];      /* shape[ndim] then strides[ndim] */
} rvm_tensor;
_Static_assert(offsetof(rvm_tensor, dl) == 24, "DLTensor must follow the object header");

/* Shape: TVM-FFI layout with the dims inline. */
typedef struct rvm_shape {
  TVMFFIObject header;
  TVMFFIShapeCell cell;
  int64_t dims[];
} rvm_shape;

/* Str: TVM-FFI layout with the bytes inline and NUL-terminated. */
typedef struct rvm_string {
  TVMFFIObject header;
  TVMFFIByteArray cell;
  char bytes[];
} rvm_string;

/* Array (tuple): TVM-FFI layout with owned elements inline. */
typedef struct rvm_array {
  TVMFFIObject header;
  TVMFFISeqCell cell;
  TVMFFIAny items[];
} rvm_array;

/* Function: TVM-FFI layout. */
typedef struct rvm_function {
  TVMFFIObject header;
  TVMFFIFunctionCell cell;
} rvm_function;

/* Closure over a Relax function: captured values are appended to the call's arguments. */
typedef struct rvm_closure {
  TVMFFIObject header;
  const rvm_program *program; /* the module it belongs to */
  int64_t func_index;
  int64_t num_captured;
  TVMFFIAny captured[];
} rvm_closure;

RVM_HIDDEN void rvm_any_release(TVMFFIAny *v);
/* Returns an owned copy of a borrowed view (objects get a new reference; RawStr becomes Str). */
RVM_HIDDEN int rvm_any_copy(const TVMFFIAny *view, TVMFFIAny *out);
RVM_HIDDEN const char *rvm_type_name(const TVMFFIAny *v);
RVM_HIDDEN void rvm_object_init(TVMFFIObject *obj, int32_t type_index, void (*deleter)(void *, int));

static inline bool rvm_is_object(const TVMFFIAny *v) { return v->type_index >= kTVMFFIStaticObjectBegin; }
static inline TVMFFIAny rvm_none(void) { TVMFFIAny v = {0}; return v; }
static inline TVMFFIAny rvm_int(int64_t x) { TVMFFIAny v = {0}; v.type_index = kTVMFFIInt; v.v_int64 = x; return v; }
static inline TVMFFIAny rvm_obj_any(void *obj) {
  TVMFFIAny v = {0};
  v.type_index = ((TVMFFIObject *)obj)->type_index;
  v.v_obj = (TVMFFIObject *)obj;
  return v;
}

/* Constructors return NULL (with the error set) when memory runs out. */
RVM_HIDDEN rvm_shape *rvm_shape_new(const int64_t *dims, int64_t n);
RVM_HIDDEN rvm_string *rvm_string_new(const char *bytes, uint64_t size);
RVM_HIDDEN rvm_array *rvm_array_new(int64_t n); /* elements start as None */
RVM_HIDDEN rvm_function *rvm_function_new(TVMFFISafeCallType fn);
/* A tensor viewing `data` (not owned: `owner`, if any, is retained to keep it alive). With a
 * `home` allocator the object comes from (and returns to) its cache when possible. */
RVM_HIDDEN rvm_tensor *rvm_tensor_new_in(rvm_pool *home, void *data, DLDevice dev, int32_t ndim, DLDataType dtype,
                                         const int64_t *shape, uint64_t byte_offset, TVMFFIObject *owner);
RVM_HIDDEN rvm_tensor *rvm_tensor_new(void *data, DLDevice dev, int32_t ndim, DLDataType dtype,
                                      const int64_t *shape, uint64_t byte_offset, TVMFFIObject *owner);
RVM_HIDDEN rvm_closure *rvm_closure_new(const rvm_program *program, int64_t func_index,
                                        int64_t num_captured);
/* The DLTensor of a Tensor object or DLTensorPtr value, or NULL. */
RVM_HIDDEN DLTensor *rvm_as_dltensor(const TVMFFIAny *v);
/* The allocator an object of this runtime came from (rvm_mem_owner), or NULL for a foreign one. */
RVM_HIDDEN const rvm_allocator *rvm_object_allocator(const TVMFFIObject *obj);
/* Whether an object is a CPU Storage of alloc.c. */
RVM_HIDDEN bool rvm_is_pooled_storage(const TVMFFIObject *obj);
/* Whether a Tensor object was made by this runtime (and so is compact and 64-byte aligned). */
RVM_HIDDEN bool rvm_is_own_tensor(const TVMFFIObject *obj);
/* Whether the caller's reference is the object's only one, strong or weak. */
RVM_HIDDEN bool rvm_object_sole_owner(const TVMFFIObject *obj);
/* The dims of a Shape value, or NULL. */
RVM_HIDDEN const TVMFFIShapeCell *rvm_as_shape(const TVMFFIAny *v);
/* The bytes of a string value (RawStr, SmallStr or Str); false if it is not a string. */
RVM_HIDDEN bool rvm_as_string(const TVMFFIAny *v, const char **data, uint64_t *size);
/* Bytes of a compact tensor whose size is known to fit (one the runtime made or checked). */
RVM_HIDDEN int64_t rvm_tensor_nbytes(const DLTensor *t);
/* Bytes of a compact tensor of these dims and dtype, or -1 with a ValueError naming `what` when a
 * dim is negative or the size does not fit in int64 (what NULL: -1 alone, for a caller that names
 * the culprit only when there is one). Every size that comes from outside goes through here
 * before anything is allocated or read. */
RVM_HIDDEN int64_t rvm_checked_nbytes(const char *what, const int64_t *dims, int64_t ndim, DLDataType dtype);
/* Writes "[d0, d1, ...]" into buf (truncated to cap). */
RVM_HIDDEN void rvm_format_shape(const int64_t *dims, int64_t n, char *buf, size_t cap);
RVM_HIDDEN void rvm_format_dtype(DLDataType t, char *buf, size_t cap);

/* ---- Errors ------------------------------------------------------------------------------- */

/* Sets the thread's error (printf-style message) and returns -1. */
RVM_HIDDEN int rvm_raise(const char *kind, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Adds "in <fn> at pc <pc> (<callee>): " in front of the current error, once per error. */
RVM_HIDDEN void rvm_error_locate(const char *function, int64_t pc, const char *callee);
RVM_HIDDEN void rvm_error_clear(void);
RVM_HIDDEN const char *rvm_error_message(void);
RVM_HIDDEN const char *rvm_error_kind(void);

/* ---- Memory (mem.c) ------------------------------------------------------------------------ */

/* The C library's allocator: what serves a thread outside any VM with a host allocator. */
RVM_HIDDEN extern const rvm_allocator rvm_libc_allocator;
/* Whether a thread can be given an allocator other than the C library's. */
RVM_HIDDEN bool rvm_mem_ready(void);
/* The allocator new blocks come from on this thread. */
RVM_HIDDEN const rvm_allocator *rvm_mem_current(void);
/* Makes `a` (NULL: the C library's) serve this thread; returns the previous one for rvm_mem_leave. */
RVM_HIDDEN const rvm_allocator *rvm_mem_enter(const rvm_allocator *a);
RVM_HIDDEN void rvm_mem_leave(const rvm_allocator *previous);
/* size bytes aligned to `alignment` (a power of two) from `a`; NULL with a MemoryError naming
 * `what` when it has none. Every block is freed with rvm_mem_free, on any thread. */
RVM_HIDDEN void *rvm_mem_alloc_in(const rvm_allocator *a, size_t size, size_t alignment, const char *what);
/* rvm_mem_alloc_in from the current allocator, 16-byte aligned. */
RVM_HIDDEN void *rvm_mem_alloc(size_t size, const char *what);
RVM_HIDDEN void *rvm_mem_aligned(size_t size, size_t alignment, const char *what);
/* count * size zeroed bytes (the product checked). */
RVM_HIDDEN void *rvm_mem_calloc(size_t count, size_t size, const char *what);
/* Resizes a block within its own allocator (NULL ptr: a new block). On failure ptr is untouched. */
RVM_HIDDEN void *rvm_mem_realloc(void *ptr, size_t size, const char *what);
/* Frees a block of rvm_mem_* through the allocator it came from; NULL is ignored. */
RVM_HIDDEN void rvm_mem_free(void *ptr);
/* The allocator a block came from. */
RVM_HIDDEN const rvm_allocator *rvm_mem_owner(const void *ptr);

/* The calling thread's outstanding kernel workspaces (backend.c): a mark taken before running
 * code, and, when that code failed, the release of every workspace it left behind. */
RVM_HIDDEN void *rvm_workspace_mark(void);
RVM_HIDDEN void rvm_workspace_release_to(void *mark);

/* ---- Allocation --------------------------------------------------------------------------- */

/* A VM's storage pool over its allocator: freed buffers are kept by size for reuse. Reference counted; safe to
 * release buffers from any thread. */
RVM_HIDDEN rvm_pool *rvm_pool_new(const rvm_allocator *heap);
RVM_HIDDEN void rvm_pool_retain(rvm_pool *a);
RVM_HIDDEN void rvm_pool_release(rvm_pool *a);
/* 64-byte aligned, at least nbytes (0 allowed). NULL with the error set on failure. */
RVM_HIDDEN void *rvm_pool_alloc(rvm_pool *a, uint64_t nbytes);
RVM_HIDDEN void rvm_pool_free(rvm_pool *a, void *ptr, uint64_t nbytes);
RVM_HIDDEN void rvm_pool_stats(const rvm_pool *a, rvm_vm_stats *out);
RVM_HIDDEN void rvm_pool_reset_stats(rvm_pool *a);
/* A new Storage object of nbytes from the allocator (which it retains). */
RVM_HIDDEN rvm_storage *rvm_storage_new(rvm_pool *a, uint64_t nbytes);
/* Marks the calling thread as the one running a call on the allocator's VM (returns the previous
 * mark, for rvm_pool_leave). Only that thread recycles tensor objects through the cache. */
RVM_HIDDEN uintptr_t rvm_pool_enter(rvm_pool *a);
RVM_HIDDEN void rvm_pool_leave(rvm_pool *a, uintptr_t previous);
/* A tensor object with room for ndim dims from the allocator's cache, or NULL if it has none. */
RVM_HIDDEN rvm_tensor *rvm_pool_take_tensor(rvm_pool *a, int32_t ndim);
/* Gives a dead tensor object back to the cache (from any thread: one released outside a call waits on a
 * list of its own); false if the caller must free it itself. The caller still holds a reference to the pool. */
RVM_HIDDEN bool rvm_pool_give_tensor(rvm_pool *a, rvm_tensor *t);
/* A Storage of plain 64-byte aligned memory, freed with the object (for copies outside a VM). */
RVM_HIDDEN rvm_storage *rvm_storage_new_unpooled(uint64_t nbytes);
/* A compact, zero-offset, 64-byte aligned copy of t's elements as a new Tensor. */
RVM_HIDDEN rvm_tensor *rvm_tensor_copy_aligned(const DLTensor *t);

/* ---- JSON (json.c), for weight indexes ---------------------------------------------------- */

enum { RVM_JSON_NULL, RVM_JSON_BOOL, RVM_JSON_NUMBER, RVM_JSON_STRING, RVM_JSON_ARRAY, RVM_JSON_OBJECT };

/* A value; the items of an array or object are a list from `first` through `next`. */
typedef struct rvm_json {
  int kind;
  bool is_integer;          /* NUMBER: it is an integer that fits int64 */
  int64_t integer;          /* NUMBER (when is_integer) and BOOL */
  const char *string;       /* STRING: decoded, NUL-terminated */
  size_t length;            /* STRING */
  const char *key;          /* an object member's key, else NULL */
  size_t count;             /* ARRAY, OBJECT: items */
  const struct rvm_json *first, *next;
} rvm_json;

typedef struct rvm_json_doc {
  const rvm_json *root;
  rvm_json *nodes;
  char *strings;
} rvm_json_doc;

/* Parses untrusted JSON text; a ValueError naming `what` and the place when it is not JSON. */
RVM_HIDDEN int rvm_json_parse(const char *text, size_t len, const char *what, rvm_json_doc *out);
RVM_HIDDEN void rvm_json_free(rvm_json_doc *doc);
/* An object's member by key, or NULL (also when `object` is no object). */
RVM_HIDDEN const rvm_json *rvm_json_get(const rvm_json *object, const char *key);
/* An integer value; false for anything else. */
RVM_HIDDEN bool rvm_json_int(const rvm_json *n, int64_t *out);

/* ---- Weights outside the model (weights.c) -------------------------------------------------- */

RVM_HIDDEN int rvm_weights_open(rvm_module *module, const char *path, rvm_weights **out);
RVM_HIDDEN int rvm_weights_arguments(const rvm_weights *w, int32_t function, int32_t num_inputs, rvm_value *args,
                                     int32_t capacity, int32_t *count);
RVM_HIDDEN void rvm_weights_close(rvm_weights *w);

/* ---- Modules and VMs ---------------------------------------------------------------------- */

struct rvm_module {
  atomic_long refcount;
  const rvm_program *program;
  TVMFFIAny *consts;    /* owned constant pool */
  TVMFFIAny *func_pool; /* owned: Function objects for packed entries, closures for Relax ones */
  int32_t num_relax_funcs;
  int32_t *relax_funcs; /* API function index -> function-table index */
};

typedef struct rvm_frame_chunk rvm_frame_chunk;

/* ---- Pool or alone, by timing (thread_choice.c) ------------------------------------------- */

enum { RVM_THREAD_CHOICE_SLOTS = 64 };
/* One function's calls with one set of argument shapes: their trials and the choice. */
typedef struct rvm_thread_trial {
  uint64_t key; /* 0: a free slot */
  int calls, calls_since_choice;
  bool decided, alone;
  int64_t best_pool_ns, best_alone_ns;
} rvm_thread_trial;
typedef struct rvm_thread_choices {
  rvm_thread_trial slots[RVM_THREAD_CHOICE_SLOTS];
} rvm_thread_choices;
/* A call in progress: its trial (or NULL) and how it runs. */
typedef struct rvm_thread_call {
  rvm_thread_trial *trial;
  const char *name; /* the function's, for RELAXC_THREAD_TRIALS=report */
  bool alone;
  int64_t start_ns;
} rvm_thread_call;
/* Before a top-level call of function `func`: whether it runs alone (it then does, until the end). */
RVM_HIDDEN bool rvm_thread_choice_begin(rvm_thread_choices *c, int64_t func, const char *name, const TVMFFIAny *args,
                                        int32_t num_args, rvm_thread_call *call);
/* After the call begun with `call`, which returned rc: records its time. */
RVM_HIDDEN void rvm_thread_choice_end(rvm_thread_call *call, int rc);

struct rvm_vm {
  rvm_cuda *cuda; /* the VM's CUDA device when it runs CUDA kernels, else NULL */
  rvm_module *module;
  const rvm_program *program;
  const TVMFFIAny *consts;
  const TVMFFIAny *func_pool;
  rvm_pool *allocator;
  const rvm_allocator *heap; /* where everything of this VM is allocated (the host's, or libc's) */
  rvm_frame_chunk *frames; /* register stack: a list of chunks, never moved */
  int depth;
  TVMFFISafeCallType instrument; /* the hook of an instrumented model, or NULL */
  void *instrument_self;
  /* The thread running a call on this VM (pthread_self), or 0: a second thread is refused
   * instead of corrupting the register stack. Nested calls from the same thread (a host function
   * calling back into its VM) count in owner_depth. */
  _Atomic uintptr_t owner;
  int owner_depth;
  rvm_thread_choices thread_choices; /* per function and argument shapes: pool or alone */
};

/* The C API's module and VM functions (api.c), for the other entry points (ffi_module.c). */
RVM_HIDDEN int rvm_module_open(rvm_module **out);
RVM_HIDDEN void rvm_module_close(rvm_module *module);
RVM_HIDDEN int rvm_vm_create_on(rvm_module *module, DLDevice device, rvm_vm **out);
RVM_HIDDEN void rvm_vm_destroy(rvm_vm *vm);
/* vm_call for function-table entry `func`: DLTensorPtr arguments are checked and wrapped. */
RVM_HIDDEN int rvm_vm_call_function(rvm_vm *vm, int64_t func, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result);
/* Hands the runtime's current error to libtvm_ffi, where a tvm-ffi caller looks for it
 * (ffi_module.c; the kernel library's tvm-ffi exports use it too). */
RVM_HIDDEN void rvm_ffi_forward_error(void);

/* The calls generated code makes into the shim (rvm_invoke, rvm_object_incref, ...). */
#define RVM_CALL(ret, name, params, doc) RVM_HIDDEN ret name params;
#include "rvm_calls.def"
#undef RVM_CALL

/* Raises If's TypeError for a condition that is not an int, located at fn/pc; returns -1. */
RVM_HIDDEN int rvm_if_cond_error(const char *function, int64_t pc, const TVMFFIAny *cond);
/* Calls any callable value: a closure (through the VM) or a Function object. */
RVM_HIDDEN int rvm_invoke_value(rvm_vm *vm, const TVMFFIAny *callee, const TVMFFIAny *args,
                                int32_t num_args, TVMFFIAny *result);
RVM_HIDDEN void rvm_frames_free(rvm_vm *vm);

/* ---- CUDA (cuda.c) ------------------------------------------------------------------------ */

/* The CUDA kernels of this model, defined by relaxc's object only when it has some. */
typedef struct rvm_cuda_table {
  int64_t num_kernels;
  const rvm_cuda_kernel *kernels;
} rvm_cuda_table;
extern const rvm_cuda_table rvm_model_cuda __attribute__((weak, visibility("hidden")));

/* Opens a CUDA device for a VM (loading the driver on first use). */
RVM_HIDDEN int rvm_cuda_open(int device_id, const rvm_cuda_kernel *kernels, int64_t num_kernels, rvm_cuda **out);
RVM_HIDDEN void rvm_cuda_retain(rvm_cuda *c);
/* Drops a reference; the last one releases the device's memory, modules and context. */
RVM_HIDDEN void rvm_cuda_close(rvm_cuda *c);
RVM_HIDDEN int rvm_cuda_device_id(const rvm_cuda *c);
/* Device memory (NULL with the error set on failure), pooled per device. */
RVM_HIDDEN void *rvm_cuda_alloc(rvm_cuda *c, uint64_t nbytes);
RVM_HIDDEN void rvm_cuda_free(rvm_cuda *c, void *ptr, uint64_t nbytes);
/* Copies between host and device memory (one side each). */
RVM_HIDDEN int rvm_cuda_copy(rvm_cuda *c, void *dst, int dst_on_device, const void *src, int src_on_device, uint64_t nbytes);
RVM_HIDDEN int rvm_cuda_synchronize(rvm_cuda *c);
/* Launches kernel k of the table with the call's tensors, by the convention of rvm_cuda.h. */
RVM_HIDDEN int rvm_cuda_launch(rvm_vm *vm, const rvm_cuda_kernel *kernels, int64_t k, const TVMFFIAny *args, int32_t num_args);
/* The VM whose call is running on this thread (set only for VMs with a CUDA device). */
RVM_HIDDEN rvm_vm *rvm_current_vm(void);
RVM_HIDDEN rvm_vm *rvm_set_current_vm(rvm_vm *vm);
/* A new device Storage of nbytes on the VM's CUDA device. */
RVM_HIDDEN rvm_storage *rvm_storage_new_cuda(rvm_cuda *c, uint64_t nbytes);
/* A tensor's element bytes copied to host memory (from a device tensor or a host one). */
RVM_HIDDEN int rvm_tensor_read(const DLTensor *t, rvm_cuda *c, void *dst, uint64_t nbytes);

/* ---- Registry (registry.c) ----------------------------------------------------------------- */

/* The Function object registered under name (a host's first, then the built-in ones), or NULL.
 * Borrowed: entries live until the library is unloaded. */
RVM_HIDDEN TVMFFIObject *rvm_registry_find(const char *name);
/* Adds a host function; with override it shadows an existing name, else that is an error. */
RVM_HIDDEN int rvm_registry_register(const char *name, TVMFFISafeCallType fn, void *self, void (*self_deleter)(void *),
                                     int override);

/* ---- Text (render.c) ---------------------------------------------------------------------- */

/* A growing NUL-terminated string; `failed` records an allocation failure. Zero-initialise. */
typedef struct rvm_text {
  char *data;
  size_t len, cap;
  bool failed;
} rvm_text;
RVM_HIDDEN bool rvm_text_append(rvm_text *t, const char *s, size_t n);
RVM_HIDDEN bool rvm_text_puts(rvm_text *t, const char *s);
RVM_HIDDEN void rvm_text_free(rvm_text *t);
/* Appends a value as TVM's Python helpers render it (tensors as numpy prints them). */
RVM_HIDDEN void rvm_render_value(rvm_text *out, const TVMFFIAny *v);
RVM_HIDDEN float rvm_half_to_float(uint16_t h);

/* ---- The backend API TVM kernels import (backend.c, parallel.c, registry.c) --------------- */

typedef struct {
  void *sync_handle;
  int32_t num_task;
} TVMParallelGroupEnv;
typedef int (*FTVMParallelLambda)(int task_id, TVMParallelGroupEnv *penv, void *cdata);
RVM_HIDDEN int TVMBackendParallelLaunch(FTVMParallelLambda flambda, void *cdata, int num_task);
RVM_HIDDEN int TVMBackendParallelBarrier(int task_id, TVMParallelGroupEnv *penv);
/* The pool's size (the caller and its workers), starting the pool if it is not yet running; 1 on
 * a thread between rvm_parallel_alone_begin and _end. */
RVM_HIDDEN int rvm_parallel_threads(void);
/* CLOCK_MONOTONIC in nanoseconds (the pool's spin deadlines, the thread trials' timings). */
RVM_HIDDEN int64_t rvm_now_ns(void);
/* From here until rvm_parallel_alone_end, this thread's launches run their tasks themselves. */
RVM_HIDDEN void rvm_parallel_alone_begin(void);
RVM_HIDDEN void rvm_parallel_alone_end(void);

#define RVM_BUILTIN(suffix, name, properties, doc) \
  RVM_HIDDEN int rvm_builtin_##suffix(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result);
#include "rvm_builtins.def"
#include "rvm_runtime.def"
#undef RVM_BUILTIN

#endif /* RVM_INTERNAL_H */
