/*
 * oom_test.c: a C host that gives a model's VM its own allocator, then makes that allocator fail.
 *
 * First a reference run on an ordinary VM. Then, for N = 1, 2, ... up to the number of
 * allocations a first call makes: a fresh VM on an allocator that fails its Nth allocation after
 * the VM's creation; the call must fail with a MemoryError saying "out of memory"; with the
 * allocator healthy again the same VM's call must give the reference result bit for bit; and
 * when the VM and its results are gone the allocator must have got back every block it gave
 * out. Run under valgrind by tests/oom.rs, which also sees that no block leaks past exit.
 *
 * usage: oom_test MODEL.so SHAPE...  main's float32 arguments, one shape each ("2x3", "" for a
 * scalar), filled with a fixed pattern.
 */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rvm.h"

enum { MAX_ARGS = 8, MAX_DIMS = 6 };

/* The allocator under test: counts every block and fails on request. Workers of the runtime's
 * thread pool allocate too, so the counters are atomic. */
typedef struct counting {
  atomic_long live;      /* blocks given out and not yet returned */
  atomic_long calls;     /* alloc calls so far */
  atomic_long fail_at;   /* the alloc call to fail (1-based), or 0 */
  atomic_long failures;  /* allocations refused */
} counting;

static void *counting_alloc(void *ctx, size_t size, size_t alignment) {
  counting *c = ctx;
  long n = atomic_fetch_add(&c->calls, 1) + 1;
  if (n == atomic_load(&c->fail_at)) {
    atomic_fetch_add(&c->failures, 1);
    return NULL;
  }
  size_t rounded = (size + alignment - 1) / alignment * alignment;
  void *p = aligned_alloc(alignment, rounded ? rounded : alignment);
  if (p) atomic_fetch_add(&c->live, 1);
  return p;
}

static void counting_free(void *ctx, void *ptr) {
  counting *c = ctx;
  atomic_fetch_sub(&c->live, 1);
  free(ptr);
}

static const rvm_api *api;

typedef struct inputs {
  int n;
  DLTensor tensors[MAX_ARGS];
  int64_t shapes[MAX_ARGS][MAX_DIMS];
  float *data[MAX_ARGS];
  rvm_value values[MAX_ARGS];
} inputs;

static int parse_inputs(int argc, char **argv, inputs *in) {
  in->n = argc;
  if (argc > MAX_ARGS) return -1;
  for (int i = 0; i < argc; i++) {
    DLTensor *t = &in->tensors[i];
    memset(t, 0, sizeof *t);
    int64_t count = 1;
    for (const char *s = argv[i]; *s;) {
      char *end;
      long long d = strtoll(s, &end, 10);
      if (end == s || d < 0 || t->ndim == MAX_DIMS) return -1;
      in->shapes[i][t->ndim++] = d;
      count *= d;
      s = *end == 'x' ? end + 1 : end;
      if (*end && *end != 'x') return -1;
    }
    in->data[i] = aligned_alloc(64, (size_t)(count * 4 + 63) / 64 * 64 + 64);
    for (int64_t k = 0; k < count; k++) in->data[i][k] = (float)((k * 7 + i * 3) % 11) * 0.25f - 1.0f;
    t->data = in->data[i];
    t->device = (DLDevice){kDLCPU, 0};
    t->dtype = (DLDataType){kDLFloat, 32, 1};
    t->shape = in->shapes[i];
    in->values[i] = (rvm_value){.type_index = kTVMFFIDLTensorPtr, .v_ptr = t};
  }
  return 0;
}

/* Whether two results hold the same values: tensors byte for byte, tuples item by item. */
static int same(const rvm_value *a, const rvm_value *b) {
  if (a->type_index != b->type_index) return 0;
  int64_t n = api->tuple_size(a);
  if (n >= 0) {
    if (api->tuple_size(b) != n) return 0;
    for (int64_t i = 0; i < n; i++) {
      rvm_value x, y;
      if (api->tuple_get(a, i, &x) || api->tuple_get(b, i, &y) || !same(&x, &y)) return 0;
    }
    return 1;
  }
  const DLTensor *s = api->tensor_view(a), *t = api->tensor_view(b);
  if (!s || !t) return a->v_int64 == b->v_int64;
  if (s->ndim != t->ndim) return 0;
  size_t bytes = (size_t)(s->dtype.bits * s->dtype.lanes + 7) / 8;
  for (int i = 0; i < s->ndim; i++) {
    if (s->shape[i] != t->shape[i]) return 0;
    bytes *= (size_t)s->shape[i];
  }
  return memcmp((const char *)s->data + s->byte_offset, (const char *)t->data + t->byte_offset, bytes) == 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: oom_test MODEL.so SHAPE...\n");
    return 2;
  }
  inputs in;
  if (parse_inputs(argc - 2, argv + 2, &in)) {
    fprintf(stderr, "oom_test: bad shape list (at most %d shapes like 2x3)\n", MAX_ARGS);
    return 2;
  }
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
    return 2;
  }
  api = ((rvm_get_api_fn)dlsym(lib, "rvm_get_api"))(RVM_ABI_VERSION);
  rvm_module *m;
  rvm_vm *plain;
  int32_t main_fn;
  if (!api || api->module_open(&m) || api->vm_create(m, &plain) || api->function_find(m, "main", &main_fn)) {
    fprintf(stderr, "%s: %s\n", argv[1], api ? api->last_error() : "no C API version 3");
    return 2;
  }
  rvm_value expected = {0};
  if (api->vm_call(plain, main_fn, in.values, in.n, &expected)) {
    fprintf(stderr, "reference call: %s\n", api->last_error());
    return 2;
  }

  counting c = {0};
  rvm_allocator allocator = {counting_alloc, counting_free, &c};

  /* How many allocations a first call makes. */
  rvm_vm *vm;
  CHECK(api->vm_create_with_allocator(m, &allocator, &vm) == 0, "vm_create_with_allocator: %s", api->last_error());
  long before = atomic_load(&c.calls);
  rvm_value out = {0};
  CHECK(api->vm_call(vm, main_fn, in.values, in.n, &out) == 0, "call on the counting allocator: %s", api->last_error());
  long per_call = atomic_load(&c.calls) - before;
  CHECK(same(&out, &expected), "the counting allocator's result differs from the reference");
  CHECK(api->value_allocator(&out) == &allocator, "value_allocator does not name the VM's allocator");
  CHECK(api->value_allocator(&expected) == NULL, "value_allocator names an allocator for a plain VM's result");
  api->vm_destroy(vm);
  CHECK(atomic_load(&c.live) > 0, "the result lost its memory when its VM was destroyed");
  api->value_release(&out);
  CHECK(atomic_load(&c.live) == 0, "%ld blocks not returned after the VM and its result are gone", atomic_load(&c.live));
  CHECK(per_call > 0, "a first call allocated nothing through the host allocator");

  for (long n = 1; n <= per_call; n++) {
    atomic_store(&c.fail_at, 0);
    atomic_store(&c.failures, 0);
    if (api->vm_create_with_allocator(m, &allocator, &vm)) {
      CHECK(0, "vm_create_with_allocator: %s", api->last_error());
      break;
    }
    atomic_store(&c.fail_at, atomic_load(&c.calls) + n);
    rvm_value failed = {0};
    int rc = api->vm_call(vm, main_fn, in.values, in.n, &failed);
    CHECK(rc != 0, "N=%ld: the call succeeded although allocation %ld failed", n, n);
    if (rc != 0) {
      CHECK(strcmp(api->last_error_kind(), "MemoryError") == 0, "N=%ld: error kind %s (%s)", n, api->last_error_kind(),
            api->last_error());
      CHECK(strstr(api->last_error(), "out of memory") != NULL, "N=%ld: message does not say out of memory: %s", n,
            api->last_error());
    } else {
      api->value_release(&failed);
    }
    CHECK(atomic_load(&c.failures) == 1, "N=%ld: the Nth allocation was never asked for", n);
    atomic_store(&c.fail_at, 0);
    rvm_value again = {0};
    rc = api->vm_call(vm, main_fn, in.values, in.n, &again);
    CHECK(rc == 0, "N=%ld: the same VM fails once memory is back: %s", n, api->last_error());
    if (rc == 0) CHECK(same(&again, &expected), "N=%ld: wrong result once memory is back", n);
    api->value_release(&again);
    api->vm_destroy(vm);
    CHECK(atomic_load(&c.live) == 0, "N=%ld: %ld blocks leaked", n, atomic_load(&c.live));
  }
  printf("oom_test: %ld allocations in a first call, each failed in turn\n", per_call);
  api->value_release(&expected);
  api->vm_destroy(plain);
  api->module_close(m);
  for (int i = 0; i < in.n; i++) free(in.data[i]);
  return check_report("oom_test");
}
