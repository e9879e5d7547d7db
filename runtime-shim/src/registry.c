/*
 * registry.c: the global function registry — every runtime function reachable by name.
 *
 * Names the compiler sees in bytecode are bound at link time (docs/src/architecture/decisions.md,
 * decision 4); this registry serves the names nobody can see until run time: kernels that look a
 * function up with TVMFFIEnvModLookupFromImports (TVM's sort/topk kernels call
 * tvm.contrib.sort.*), and hosts that call runtime functions (the KV cache's vm.builtin.kv_state_*) or register their own.
 *
 * The built-in entries are the rows of rvm_builtins.def, rvm_runtime.def and the kernel
 * library's rvm_kernels.def, as immortal
 * Function objects in static storage. The optional runtime functions and kernels are referenced weakly: a
 * model that links none of a file's functions has none of them, and they are absent here. A host's functions are heap objects kept until the library is unloaded: kernels cache
 * the handle a lookup returns for the life of the process (as TVM's do), so a replaced entry must
 * stay callable. One mutex guards the host list; built-in lookups take no lock.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Static objects are never freed: their count starts at one reference nobody releases. */
static void immortal_deleter(void *self, int flags) { (void)self, (void)flags; }

/* Weak references to the optional functions, so that this table does not link them in. */
#define RVM_BUILTIN(suffix, name, properties, doc) \
  extern int rvm_builtin_##suffix(void *, const TVMFFIAny *, int32_t, TVMFFIAny *) __attribute__((weak));
#include "rvm_runtime.def"
#include "rvm_kernels.def"
#undef RVM_BUILTIN

#define RVM_BUILTIN(suffix, name, properties, doc) \
  {{0x0000000100000001ull, kTVMFFIFunction, 0, immortal_deleter}, {rvm_builtin_##suffix, NULL}},
static rvm_function builtin_functions[] = {
#include "rvm_builtins.def"
#include "rvm_runtime.def"
#include "rvm_kernels.def"
};
#undef RVM_BUILTIN

#define RVM_BUILTIN(suffix, name, properties, doc) name,
static const char *const builtin_names[] = {
#include "rvm_builtins.def"
#include "rvm_runtime.def"
#include "rvm_kernels.def"
};
#undef RVM_BUILTIN

enum { NUM_BUILTINS = sizeof builtin_names / sizeof builtin_names[0] };

/* A host's function: the Function layout, then what the trampoline needs. */
typedef struct host_function {
  TVMFFIObject header;
  TVMFFIFunctionCell cell;
  TVMFFISafeCallType fn;
  void *self;
  void (*self_deleter)(void *);
  struct host_function *next; /* the registry's list, newest first */
  char name[];
} host_function;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static host_function *host_functions;

static int host_trampoline(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  host_function *h = self;
  return h->fn(h->self, args, num_args, result);
}

/* The registry owns its entries until unload; a reference taken by a host keeps one alive
 * beyond that only if the host outlives the library, which rvm.h forbids. */
static void host_function_deleter(void *self, int flags) {
  host_function *h = self;
  if ((flags & 1) && h->self_deleter) h->self_deleter(h->self);
  if (flags & 2) free(h);
}

/* A built-in function by name; NULL when its file is not linked into this model. */
static rvm_function *find_builtin(const char *name) {
  for (int i = 0; i < NUM_BUILTINS; i++)
    if (strcmp(builtin_names[i], name) == 0) return builtin_functions[i].cell.safe_call ? &builtin_functions[i] : NULL;
  return NULL;
}

static host_function *find_host_locked(const char *name) {
  for (host_function *h = host_functions; h; h = h->next)
    if (strcmp(h->name, name) == 0) return h;
  return NULL;
}

TVMFFIObject *rvm_registry_find(const char *name) {
  pthread_mutex_lock(&registry_lock);
  host_function *h = find_host_locked(name);
  pthread_mutex_unlock(&registry_lock);
  if (h) return &h->header;
  rvm_function *b = find_builtin(name);
  return b ? &b->header : NULL;
}

int rvm_registry_register(const char *name, TVMFFISafeCallType fn, void *self, void (*self_deleter)(void *),
                          int override) {
  if (!name || !*name) return rvm_raise("ValueError", "function_register: the name is NULL or empty");
  if (!fn) return rvm_raise("ValueError", "function_register: %s: the function pointer is NULL", name);
  size_t len = strlen(name);
  host_function *h = malloc(sizeof(*h) + len + 1);
  if (!h) return rvm_raise("MemoryError", "out of memory registering %s", name);
  rvm_object_init(&h->header, kTVMFFIFunction, host_function_deleter);
  h->cell.safe_call = host_trampoline;
  h->cell.cpp_call = NULL;
  h->fn = fn;
  h->self = self;
  h->self_deleter = self_deleter;
  memcpy(h->name, name, len + 1);
  pthread_mutex_lock(&registry_lock);
  bool taken = find_host_locked(name) || find_builtin(name);
  if (taken && !override) {
    pthread_mutex_unlock(&registry_lock);
    free(h);
    return rvm_raise("ValueError", "Global Function `%s` is already registered", name);
  }
  /* Newest first, so a lookup finds the override; the older entry stays alive for kernels
   * that cached it. */
  h->next = host_functions;
  host_functions = h;
  pthread_mutex_unlock(&registry_lock);
  return 0;
}

__attribute__((destructor)) static void free_host_functions(void) {
  pthread_mutex_lock(&registry_lock);
  host_function *h = host_functions;
  host_functions = NULL;
  pthread_mutex_unlock(&registry_lock);
  while (h) {
    host_function *next = h->next;
    rvm_object_decref(&h->header);
    h = next;
  }
}

/* Kernels look functions up here (through the __TVMFFIEnvModLookupFromImports slot). The
 * handle is borrowed: the registry keeps it alive while the library is loaded. */
RVM_HIDDEN int TVMFFIEnvModLookupFromImports(void *library_ctx, const char *name, void **out) {
  (void)library_ctx;
  *out = NULL;
  TVMFFIObject *f = name ? rvm_registry_find(name) : NULL;
  if (!f)
    return rvm_raise("RuntimeError", "Cannot find function %s in the imported modules or global registry.",
                     name ? name : "(null)");
  *out = f;
  return 0;
}
