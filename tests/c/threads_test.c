/*
 * threads_test.c: rvm.h's threading contract under load, from a plain C host (pthreads, so that
 * ThreadSanitizer sees every synchronisation: tests/threads.rs builds it and the models with
 * -fsanitize=thread for the TSan run, and without for the normal one).
 *
 * One module, four threads, a VM each, all calling at once: every result must equal the
 * single-threaded reference bit for bit. The model's parallel kernels launch on the shared thread
 * pool from the four threads (a launch that finds it busy runs on its caller), nested launches
 * included when the model has them. With --instrument each thread's VM has its own hook, which
 * must see every Call begin and end; with --registry the threads register, look up and call
 * global functions at the same time. Each result is released on a thread of its own while its VM
 * runs the next call: the result's objects go back to that VM's caches from there.
 *
 * usage: threads_test [--instrument] [--registry] [--affine] MODEL.so SHAPE...
 *   SHAPE: main's float32 arguments ("64x64"), filled with a fixed pattern.
 *   --affine: the model computes 2x + 1 (tests/threads/m.py); the reference is checked too.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rvm.h"

enum { THREADS = 4, CALLS = 25, MAX_ARGS = 8, MAX_DIMS = 4 };

static const rvm_api *api;
static rvm_module *module;
static int32_t main_fn;
static int use_instrument, use_registry;
static pthread_mutex_t check_lock = PTHREAD_MUTEX_INITIALIZER; /* check.h's counters are plain ints */

#define TCHECK(cond, ...)                     \
  do {                                        \
    pthread_mutex_lock(&check_lock);          \
    CHECK(cond, __VA_ARGS__);                 \
    pthread_mutex_unlock(&check_lock);        \
  } while (0)

static int num_args;
static DLTensor tensors[MAX_ARGS];
static int64_t shapes[MAX_ARGS][MAX_DIMS];
static float *data[MAX_ARGS];
static rvm_value args[MAX_ARGS];
static void *reference;
static size_t reference_bytes;

static int parse_shapes(int argc, char **argv) {
  num_args = argc;
  if (argc > MAX_ARGS) return -1;
  for (int i = 0; i < argc; i++) {
    DLTensor *t = &tensors[i];
    int64_t count = 1;
    for (const char *s = argv[i]; *s;) {
      char *end;
      long long d = strtoll(s, &end, 10);
      if (end == s || d < 0 || t->ndim == MAX_DIMS || (*end && *end != 'x')) return -1;
      shapes[i][t->ndim++] = d;
      count *= d;
      s = *end ? end + 1 : end;
    }
    data[i] = aligned_alloc(64, (size_t)(count * 4 + 63) / 64 * 64 + 64);
    for (int64_t k = 0; k < count; k++) data[i][k] = (float)((k * 13 + i * 5) % 17) * 0.125f - 1.0f;
    t->data = data[i];
    t->device = (DLDevice){kDLCPU, 0};
    t->dtype = (DLDataType){kDLFloat, 32, 1};
    t->shape = shapes[i];
    args[i] = (rvm_value){.type_index = kTVMFFIDLTensorPtr, .v_ptr = t};
  }
  return 0;
}

/* The bytes of a tensor result (NULL for anything else). */
static const void *tensor_bytes(const rvm_value *v, size_t *bytes) {
  const DLTensor *t = api->tensor_view(v);
  if (!t) return NULL;
  size_t n = (size_t)(t->dtype.bits * t->dtype.lanes + 7) / 8;
  for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
  *bytes = n;
  return (const char *)t->data + t->byte_offset;
}

/* An instrument hook's tally: Calls begun and ended on one VM. */
typedef struct tally {
  long before, after;
} tally;

static int count_calls(void *self, const TVMFFIAny *hook_args, int32_t n, TVMFFIAny *result) {
  (void)result;
  tally *t = self;
  if (n >= 3 && hook_args[2].v_int64) t->before++;
  else t->after++;
  return 0;
}

/* A registered function: returns its self pointer as an int. */
static int identify(void *self, const TVMFFIAny *fn_args, int32_t n, TVMFFIAny *result) {
  (void)fn_args, (void)n;
  result->type_index = kTVMFFIInt;
  result->v_int64 = (int64_t)(intptr_t)self;
  return 0;
}

static void registry_round(int thread, int round) {
  char name[64];
  snprintf(name, sizeof name, "threads_test.t%d.r%d", thread, round);
  intptr_t token = thread * 1000 + round + 1;
  TCHECK(api->function_register(name, identify, (void *)token, NULL, 0) == 0, "register %s: %s", name, api->last_error());
  /* Everybody overrides one shared name too. */
  TCHECK(api->function_register("threads_test.shared", identify, (void *)token, NULL, 1) == 0, "override: %s", api->last_error());
  rvm_value f = {0}, out = {0};
  TCHECK(api->function_get(name, &f) == 0, "get %s: %s", name, api->last_error());
  TCHECK(api->function_call(&f, NULL, 0, &out) == 0 && out.v_int64 == token, "call %s gave %lld", name, (long long)out.v_int64);
  api->value_release(&f);
  TCHECK(api->function_get("threads_test.shared", &f) == 0, "get the shared name: %s", api->last_error());
  api->value_release(&f);
}

/* Releases the value `arg` points to, and frees that copy (the caller's ownership passes here). */
static void *release_elsewhere(void *arg) {
  rvm_value *v = arg;
  api->value_release(v);
  free(v);
  return NULL;
}

static void *worker(void *arg) {
  int id = (int)(intptr_t)arg;
  rvm_vm *vm;
  if (api->vm_create(module, &vm) != 0) {
    TCHECK(0, "thread %d: vm_create: %s", id, api->last_error());
    return NULL;
  }
  tally t = {0, 0};
  if (use_instrument) TCHECK(api->vm_set_instrument(vm, count_calls, &t) == 0, "set_instrument: %s", api->last_error());
  pthread_t releaser;
  bool releasing = false;
  for (int k = 0; k < CALLS; k++) {
    rvm_value out = {0};
    int rc = api->vm_call(vm, main_fn, args, num_args, &out);
    if (releasing) pthread_join(releaser, NULL);
    releasing = false;
    if (rc != 0) {
      TCHECK(0, "thread %d call %d: %s", id, k, api->last_error());
      break;
    }
    size_t bytes = 0;
    const void *got = tensor_bytes(&out, &bytes);
    TCHECK(got && bytes == reference_bytes && memcmp(got, reference, bytes) == 0, "thread %d call %d differs from the reference", id, k);
    rvm_value *owned = malloc(sizeof *owned);
    if (owned) *owned = out;
    if (owned && pthread_create(&releaser, NULL, release_elsewhere, owned) == 0) {
      releasing = true;
    } else {
      free(owned);
      api->value_release(&out);
    }
    if (use_registry) registry_round(id, k);
  }
  if (releasing) pthread_join(releaser, NULL);
  if (use_instrument) TCHECK(t.before > 0 && t.before == t.after, "thread %d: hook saw %ld befores, %ld afters", id, t.before, t.after);
  api->vm_destroy(vm);
  return NULL;
}

int main(int argc, char **argv) {
  int a = 1, affine = 0;
  for (; a < argc && strncmp(argv[a], "--", 2) == 0; a++) {
    if (strcmp(argv[a], "--instrument") == 0) use_instrument = 1;
    else if (strcmp(argv[a], "--registry") == 0) use_registry = 1;
    else if (strcmp(argv[a], "--affine") == 0) affine = 1;
    else break;
  }
  if (a >= argc || parse_shapes(argc - a - 1, argv + a + 1)) {
    fprintf(stderr, "usage: threads_test [--instrument] [--registry] [--affine] MODEL.so SHAPE...\n");
    return 2;
  }
  void *lib = dlopen(argv[a], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen %s: %s\n", argv[a], dlerror());
    return 2;
  }
  api = ((rvm_get_api_fn)dlsym(lib, "rvm_get_api"))(RVM_ABI_VERSION);
  rvm_vm *vm;
  if (!api || api->module_open(&module) || api->vm_create(module, &vm) || api->function_find(module, "main", &main_fn)) {
    fprintf(stderr, "%s: %s\n", argv[a], api ? api->last_error() : "no C API version 3");
    return 2;
  }
  rvm_value out = {0};
  if (api->vm_call(vm, main_fn, args, num_args, &out) != 0) {
    fprintf(stderr, "reference call: %s\n", api->last_error());
    return 2;
  }
  const void *got = tensor_bytes(&out, &reference_bytes);
  CHECK(got != NULL, "main's result is not a tensor");
  reference = malloc(reference_bytes ? reference_bytes : 1);
  if (got) memcpy(reference, got, reference_bytes);
  if (affine && got)
    for (size_t k = 0; k < reference_bytes / 4; k++)
      CHECK(((const float *)got)[k] == 2.0f * data[0][k] + 1.0f, "element %zu is not 2x + 1", k);
  api->value_release(&out);
  api->vm_destroy(vm);

  pthread_t threads[THREADS];
  for (int i = 0; i < THREADS; i++) pthread_create(&threads[i], NULL, worker, (void *)(intptr_t)i);
  for (int i = 0; i < THREADS; i++) pthread_join(threads[i], NULL);

  free(reference);
  for (int i = 0; i < num_args; i++) free(data[i]);
  api->module_close(module);
  return check_report("threads_test");
}
