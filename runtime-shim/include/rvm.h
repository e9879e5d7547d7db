/*
 * rvm.h: the C API of every model .so built by relaxc.
 *
 * A model exports one symbol, rvm_get_api, found with dlsym. It returns a table of functions for
 * the ABI version asked for (NULL if the library does not speak it). Typical use:
 *
 *   const rvm_api *api = ((rvm_get_api_fn)dlsym(h, "rvm_get_api"))(RVM_ABI_VERSION);
 *   rvm_module *m;  api->module_open(&m);              // once; shareable across threads
 *   rvm_vm *vm;     api->vm_create(m, &vm);            // one per thread
 *   int32_t f;      api->function_find(m, "main", &f); // look names up once
 *   rvm_value in[1] = {{.type_index = kTVMFFIDLTensorPtr, .v_ptr = &my_dltensor}}, out = {0};
 *   if (api->vm_call(vm, f, in, 1, &out) != 0) fprintf(stderr, "%s\n", api->last_error());
 *   ... api->tensor_view(&out) ...; api->value_release(&out);
 *   api->vm_destroy(vm); api->module_close(m);
 *
 * Ownership: arguments are borrowed for the duration of a call; results are owned by the caller,
 * who releases them with value_release (on any thread). Every function that can fail returns 0 on
 * success and non-zero on failure, with a message for last_error() on the calling thread; NULL
 * where a pointer is required is such a failure (never a crash), and functions that cannot fail
 * ignore NULL.
 *
 * Aliasing: a result never shares memory with a DLTensor argument. A function that returns an
 * argument (or a view of it) returns a copy, whatever the argument's alignment, so a result stays
 * valid after the caller's buffer is freed or reused. Tensor objects passed as arguments (values
 * a call returned, type kTVMFFITensor) are shared, not copied, as in TVM.
 *
 * Constants: a model's tensor constants live in the library's writable data, as TVM keeps them in
 * its module. A result that is a constant is that memory: writing to it (or a kernel working in
 * place on it) changes the constant for every later call and every VM of the module, exactly as
 * in TVM. Copy a result before writing to it unless that is what you want.
 */
#ifndef RVM_H
#define RVM_H

#include "rvm_kernel.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The API version this header describes. Versions only grow the table at its end, so a .so
 * built for version 3 also answers rvm_get_api(1) and rvm_get_api(2) with the same table
 * (struct_size tells how much of it there is). */
#define RVM_ABI_VERSION 3u

/* A value: TVMFFIAny. Tensors, shapes, tuples (arrays), strings and closures are objects. */
typedef TVMFFIAny rvm_value;

/* The program of one .so: constants and functions. Thread-safe, reference counted by its VMs. */
typedef struct rvm_module rvm_module;

/* An execution context with its own allocator and register stack. One thread at a time: a call
 * made while another thread is inside a call on the same VM fails with a RuntimeError. */
typedef struct rvm_vm rvm_vm;

/* Identity of the .so: what built it and for what. Strings are owned by the library. */
typedef struct rvm_module_info {
  uint32_t abi_version; /* the newest C API version the library speaks (RVM_ABI_VERSION) */
  uint32_t exec_mode; /* 0 bytecode, 1 compiled (mixed modes count as compiled) */
  const char *compiler_version;
  const char *target_triple;
  uint64_t executable_hash;
  int32_t num_functions; /* Relax functions callable through the API */
  int32_t instrumented;  /* built with --instrument: vm_set_instrument works (ABI version 2) */
} rvm_module_info;

/* A host's allocator for a VM (ABI version 3, vm_create_with_allocator). alloc returns at least
 * `size` bytes aligned to `alignment` (a power of two, at least 16), or NULL when out of memory;
 * the call that needed the memory then fails with a MemoryError naming what it was for. free
 * gets back exactly the pointers alloc returned, possibly from another thread (a result released
 * elsewhere) and after vm_destroy: the struct and ctx must stay valid until the last block is
 * freed. Both functions may be called from several threads at once (the thread pool's workers
 * allocate kernel workspace for their tasks).
 *
 * Through it goes every byte a VM allocates: the VM itself, its storage pool (blocks the pool
 * keeps for reuse are freed at vm_destroy), tensor, tuple, shape, string and closure objects,
 * register frames, argument arrays, kernel workspace (TVMBackendAllocWorkspace), and KV caches the
 * model creates with all their pages and tables (for as long as the cache lives, whoever calls
 * its functions). What stays outside, on the C library's malloc: the module and its constants
 * (module_open: shared by all VMs, so no one VM's allocator can own it), the thread pool and the
 * function registry (process-wide), each thread's error message (it must be possible to report
 * that memory ran out), the kernel library's per-thread scratch buffers (shared by every VM that
 * runs on the thread, kept at their largest size), CUDA device memory (from the driver), weights
 * loaded with weights_open (shared by all VMs, like the module), and values the host makes itself
 * outside a call (shape_new, tuple_new, tensor_to_host). */
typedef struct rvm_allocator {
  void *(*alloc)(void *ctx, size_t size, size_t alignment);
  void (*free)(void *ctx, void *ptr);
  void *ctx;
} rvm_allocator;

/* Weights loaded from files outside the model (ABI version 3, weights_open). */
typedef struct rvm_weights rvm_weights;

/* Counters of one VM, reset by vm_reset_stats. */
typedef struct rvm_vm_stats {
  uint64_t live_storage_bytes; /* storage currently held by tensors */
  uint64_t peak_storage_bytes; /* the most storage held at once since the last reset */
  uint64_t storage_allocations;
  uint64_t pool_hits; /* allocations served from the pool instead of malloc */
} rvm_vm_stats;

typedef struct rvm_api {
  uint32_t abi_version;
  uint32_t struct_size;

  /* The message of the last failed call on this thread ("" if none). Owned by the library. */
  const char *(*last_error)(void);
  /* The error kind of that failure (e.g. "ValueError"). Owned by the library. */
  const char *(*last_error_kind)(void);

  /* Loads the program of this .so. The caller owns *out and closes it with module_close. */
  int (*module_open)(rvm_module **out);
  /* Drops the caller's reference; the module lives on while VMs use it. */
  void (*module_close)(rvm_module *module);
  /* Fills *out with the identity block of the .so. */
  int (*module_info)(const rvm_module *module, rvm_module_info *out);
  /* Name of Relax function i (0 <= i < num_functions). Owned by the library. */
  const char *(*function_name)(const rvm_module *module, int32_t index);
  /* Finds a Relax function by name; *out_index is what vm_call takes. */
  int (*function_find)(const rvm_module *module, const char *name, int32_t *out_index);
  /* Number of parameters of function index, or -1 if out of range. */
  int32_t (*function_arity)(const rvm_module *module, int32_t index);

  /* Creates a VM on the module (which it retains). The caller owns *out. */
  int (*vm_create)(rvm_module *module, rvm_vm **out);
  /* Destroys a VM. Values it returned stay valid. */
  void (*vm_destroy)(rvm_vm *vm);
  /* Calls a function. args are borrowed: DLTensorPtr (type 7) tensors must be compact CPU tensors
   * and stay untouched during the call (misaligned data is copied to 64-byte aligned memory).
   * *result must hold no object on entry; on success the caller owns it. */
  int (*vm_call)(rvm_vm *vm, int32_t function, const rvm_value *args, int32_t num_args,
                 rvm_value *result);
  /* Calls a closure value returned by this module. Same rules as vm_call. */
  int (*vm_call_closure)(rvm_vm *vm, const rvm_value *closure, const rvm_value *args,
                         int32_t num_args, rvm_value *result);
  /* Reads the VM's counters. */
  void (*vm_stats)(const rvm_vm *vm, rvm_vm_stats *out);
  /* Resets the peak and the counting statistics. */
  void (*vm_reset_stats)(rvm_vm *vm);

  /* Releases an owned value and sets it to None. Safe on None and POD values. */
  void (*value_release)(rvm_value *value);
  /* Makes *out an owned copy (a new reference) of *value. */
  void (*value_retain)(const rvm_value *value, rvm_value *out);
  /* Name of the value's type ("Tensor", "Shape", "Array", "int", ...). */
  const char *(*value_type_name)(const rvm_value *value);
  /* A new owned Shape from n dims. */
  int (*shape_new)(const int64_t *dims, int64_t n, rvm_value *out);
  /* Borrowed view of a Shape's dims; fails if the value is not a Shape. */
  int (*shape_view)(const rvm_value *value, const int64_t **dims, int64_t *n);
  /* A new owned tuple holding new references to items[0..n). */
  int (*tuple_new)(const rvm_value *items, int64_t n, rvm_value *out);
  /* Number of elements of a tuple, or -1 if the value is not a tuple. */
  int64_t (*tuple_size)(const rvm_value *value);
  /* Borrowed view of element i of a tuple (valid while the tuple lives). */
  int (*tuple_get)(const rvm_value *value, int64_t index, rvm_value *out);
  /* Borrowed DLTensor of a Tensor value (or a DLTensorPtr), NULL for anything else. */
  const DLTensor *(*tensor_view)(const rvm_value *value);
  /* Exports a Tensor as DLPack: *out holds a new reference, freed by its deleter. */
  int (*tensor_export)(const rvm_value *value, DLManagedTensorVersioned **out);

  /* Creates a VM on a device: {kDLCPU, 0}, or {kDLCUDA, N} for a model with CUDA kernels (the
   * driver is loaded then; $RELAXC_LIBCUDA overrides libcuda.so.1). vm_create picks cuda:0 for
   * such a model. Host tensors passed to a CUDA VM are copied to the device for the call. */
  int (*vm_create_on)(rvm_module *module, DLDevice device, rvm_vm **out);
  /* *out: the tensor itself if it is on the host, else a new host copy of it. */
  int (*tensor_to_host)(const rvm_value *value, rvm_value *out);

  /* ---- ABI version 2: runtime functions by name ------------------------------------------ */

  /* Registers `fn` as the global function `name` of this library: kernels find it with
   * TVMFFIEnvModLookupFromImports, hosts with function_get. `name` is copied. `self` is passed
   * to every call of `fn`; the library owns it from now on and calls self_deleter(self) (if not
   * NULL) when it unloads. A name already taken (a runtime function or an earlier registration)
   * is an error unless `override` is non-zero; the older function stays callable by kernels
   * that looked it up before. Thread-safe. */
  int (*function_register)(const char *name, TVMFFISafeCallType fn, void *self, void (*self_deleter)(void *),
                           int override);
  /* Looks up a global function: one registered by the host, or a runtime function of the
   * library (vm.builtin.*, tvm.contrib.sort.*, relax.run.*, the KV cache's methods). *out
   * receives an owned Function value (release it with value_release). */
  int (*function_get)(const char *name, rvm_value *out);
  /* Calls a Function value (from function_get, or returned by a model). Arguments are borrowed
   * (DLTensorPtr tensors included); *result must hold no object on entry and is owned by the
   * caller on success. Example, driving a KV cache the way an LLM engine does:
   *
   *   rvm_value begin, dims, lens, none = {0};
   *   api->function_get("vm.builtin.kv_state_begin_forward", &begin);
   *   int64_t id = 0, n = 6;
   *   api->shape_new(&id, 1, &dims); api->shape_new(&n, 1, &lens);
   *   rvm_value args[3] = {kv_cache, dims, lens};
   *   if (api->function_call(&begin, args, 3, &none) != 0) fprintf(stderr, "%s\n", api->last_error());
   *   api->value_release(&dims); api->value_release(&lens); api->value_release(&begin);
   */
  int (*function_call)(const rvm_value *function, const rvm_value *args, int32_t num_args, rvm_value *result);
  /* For a registered function that fails: records the error (kind e.g. "ValueError"; both
   * strings copied) for the caller, then the function returns -1. */
  void (*error_set)(const char *kind, const char *message);

  /* Sets the instrument hook of a VM (NULL clears it); the model must be built with
   * `relaxc compile --instrument`. As TVM's VM set_instrument: the hook is called before and
   * after every Call instruction (kernel, builtin or Relax function), in bytecode and compiled
   * code alike, with arguments (callee, name, before, result, call arguments...): callee is the
   * Function or closure, name a string, before a bool, result None before the call and the
   * call's result after it, DataType arguments given as strings. All are borrowed. Returning
   * Int 1 from the "before" call skips the Call (its result is None, no "after" call); a
   * non-zero status fails the call with the hook's error. `self` is passed to every call and
   * stays the host's. */
  int (*vm_set_instrument)(rvm_vm *vm, TVMFFISafeCallType hook, void *self);

  /* ---- ABI version 3: host allocators ---------------------------------------------------- */

  /* vm_create (on the CPU) with every allocation of the VM made through `allocator` (see
   * rvm_allocator for what that covers). The struct is borrowed, not copied: it must outlive the
   * VM and every value the VM returned. */
  int (*vm_create_with_allocator)(rvm_module *module, const rvm_allocator *allocator, rvm_vm **out);
  /* The allocator that owns an object value's memory (the pointer given to
   * vm_create_with_allocator), or NULL when the library's own malloc does (or the value is not an
   * object relaxc made). A result is freed through its owner when its last reference goes. */
  const rvm_allocator *(*value_allocator)(const rvm_value *value);

  /* Weights outside the model, for a model exported with its weights as parameters (TVM nn's
   * export_tvm without binding; MLC; relaxc.llm): `path` is TVM's tensor cache (a directory with
   * tensor-cache.json or ndarray-cache.json and its shards), safetensors (a file, or a directory
   * of them) or GGUF (a .gguf file: f32/f16 tensors as themselves, block formats such as q4_0 as
   * uint8 rows of blocks). The files are memory-mapped read-only and used in place (a weight not
   * 64-byte aligned in its file is copied once, but for GGUF matrices, which relaxc's quantized
   * kernels read at any alignment and which are never copied). Every offset and size is checked;
   * an error names the weight and the file. Load once per module and share across VMs and
   * threads; *out retains the module until weights_close. */
  int (*weights_open)(rvm_module *module, const char *path, rvm_weights **out);
  /* The weight arguments of `function`: its parameters after the first `num_inputs`, found by
   * name, written to args[0..*count) as borrowed DLTensor values (GGUF matrices: borrowed tensor
   * objects; both valid until weights_close), to
   * put after the inputs in vm_call. A parameter named packed_params (TVM nn's "packed" mode,
   * MLC's) gets one tuple of every weight, in the files' order. Fails naming the first weight `path` lacks, or when capacity
   * is less than *count (which is set either way). */
  int (*weights_arguments)(const rvm_weights *weights, int32_t function, int32_t num_inputs, rvm_value *args,
                           int32_t capacity, int32_t *count);
  /* Unmaps the files. NULL is ignored. */
  void (*weights_close)(rvm_weights *weights);
} rvm_api;

typedef const rvm_api *(*rvm_get_api_fn)(uint32_t abi_version);

/* The one exported entry point: the API table for abi_version (1 to 3), or NULL if unsupported. */
const rvm_api *rvm_get_api(uint32_t abi_version);

#ifdef __cplusplus
}
#endif
#endif /* RVM_H */
