/*
 * alloc.c: the pooled CPU allocator behind vm.builtin.alloc_storage, and Storage objects.
 *
 * Models allocate the same sizes on every call, so freed buffers are kept on free lists keyed by
 * size and handed out again: after the first call, a call allocates nothing from malloc.
 * Sizes up to 64 KiB are kept exactly (rounded to 64 bytes); larger ones in power-of-two
 * classes. Buffers may come back from any thread (a result released by the user), so the
 * lists are guarded by a spin lock, which costs one uncontended atomic exchange.
 *
 * Tensor objects (the views that alloc_tensor makes for every operator) are recycled too, without
 * any lock: only the thread currently running a call on the VM takes objects from the cache or
 * gives them back; a tensor released by any other thread, or outside a call, is simply freed.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

enum {
  RVM_ALIGN = 64,
  RVM_EXACT_LIMIT = 64 * 1024,
  RVM_EXACT_BUCKETS = RVM_EXACT_LIMIT / RVM_ALIGN + 1,
  RVM_CLASS_BUCKETS = 64,
};

typedef struct free_block {
  struct free_block *next;
} free_block;

struct rvm_allocator {
  atomic_long refcount;
  atomic_flag lock;
  free_block *exact[RVM_EXACT_BUCKETS];
  free_block *classes[RVM_CLASS_BUCKETS];
  rvm_vm_stats stats;
  _Atomic uintptr_t active_thread; /* pthread_self() of the thread inside a call, else 0 */
  free_block *tensors;             /* cached tensor objects (RVM_CACHED_NDIM dims) */
};

static uintptr_t this_thread(void) { return (uintptr_t)pthread_self(); }

uintptr_t rvm_allocator_enter(rvm_allocator *a) {
  uintptr_t previous = atomic_load_explicit(&a->active_thread, memory_order_relaxed);
  atomic_store_explicit(&a->active_thread, this_thread(), memory_order_relaxed);
  return previous;
}

void rvm_allocator_leave(rvm_allocator *a, uintptr_t previous) {
  atomic_store_explicit(&a->active_thread, previous, memory_order_relaxed);
}

static bool on_active_thread(rvm_allocator *a) {
  return atomic_load_explicit(&a->active_thread, memory_order_relaxed) == this_thread();
}

rvm_tensor *rvm_allocator_take_tensor(rvm_allocator *a, int32_t ndim) {
  if (ndim > RVM_CACHED_NDIM || !a->tensors || !on_active_thread(a)) return NULL;
  free_block *b = a->tensors;
  a->tensors = b->next;
  return (rvm_tensor *)b;
}

bool rvm_allocator_give_tensor(rvm_allocator *a, rvm_tensor *t) {
  if (t->dl.ndim > RVM_CACHED_NDIM || !on_active_thread(a)) return false;
  free_block *b = (free_block *)t;
  b->next = a->tensors;
  a->tensors = b;
  return true;
}

static void lock(rvm_allocator *a) {
  while (atomic_flag_test_and_set_explicit(&a->lock, memory_order_acquire)) {
  }
}

static void unlock(rvm_allocator *a) { atomic_flag_clear_explicit(&a->lock, memory_order_release); }

/* The bucket a request falls in, and the size actually allocated for it. */
static free_block **bucket_for(rvm_allocator *a, uint64_t nbytes, uint64_t *rounded) {
  if (nbytes < RVM_ALIGN) nbytes = RVM_ALIGN;
  if (nbytes <= RVM_EXACT_LIMIT) {
    *rounded = (nbytes + RVM_ALIGN - 1) & ~(uint64_t)(RVM_ALIGN - 1);
    return &a->exact[*rounded / RVM_ALIGN];
  }
  int cls = 64 - __builtin_clzll(nbytes - 1);
  if (cls >= RVM_CLASS_BUCKETS) return NULL;
  *rounded = 1ull << cls;
  return &a->classes[cls];
}

rvm_allocator *rvm_allocator_new(void) {
  rvm_allocator *a = calloc(1, sizeof(*a));
  if (!a) {
    rvm_raise("MemoryError", "out of memory creating an allocator");
    return NULL;
  }
  atomic_init(&a->refcount, 1);
  atomic_flag_clear(&a->lock);
  return a;
}

void rvm_allocator_retain(rvm_allocator *a) { atomic_fetch_add_explicit(&a->refcount, 1, memory_order_relaxed); }

static void free_list(free_block *b) {
  while (b) {
    free_block *next = b->next;
    free(b);
    b = next;
  }
}

void rvm_allocator_release(rvm_allocator *a) {
  if (atomic_fetch_sub_explicit(&a->refcount, 1, memory_order_acq_rel) != 1) return;
  for (int i = 0; i < RVM_EXACT_BUCKETS; i++) free_list(a->exact[i]);
  for (int i = 0; i < RVM_CLASS_BUCKETS; i++) free_list(a->classes[i]);
  free_list(a->tensors);
  free(a);
}

void *rvm_allocator_alloc(rvm_allocator *a, uint64_t nbytes) {
  uint64_t rounded = 0;
  free_block **bucket = bucket_for(a, nbytes, &rounded);
  if (!bucket) {
    rvm_raise("MemoryError", "cannot allocate %llu bytes", (unsigned long long)nbytes);
    return NULL;
  }
  lock(a);
  free_block *b = *bucket;
  if (b) {
    *bucket = b->next;
    a->stats.pool_hits++;
  }
  a->stats.storage_allocations++;
  a->stats.live_storage_bytes += rounded;
  if (a->stats.live_storage_bytes > a->stats.peak_storage_bytes)
    a->stats.peak_storage_bytes = a->stats.live_storage_bytes;
  unlock(a);
  if (b) return b;
  void *p = aligned_alloc(RVM_ALIGN, rounded);
  if (!p) {
    lock(a);
    a->stats.live_storage_bytes -= rounded;
    unlock(a);
    rvm_raise("MemoryError", "out of memory allocating %llu bytes of storage", (unsigned long long)nbytes);
  }
  return p;
}

void rvm_allocator_free(rvm_allocator *a, void *ptr, uint64_t nbytes) {
  uint64_t rounded = 0;
  free_block **bucket = bucket_for(a, nbytes, &rounded);
  free_block *b = ptr;
  lock(a);
  b->next = *bucket;
  *bucket = b;
  a->stats.live_storage_bytes -= rounded;
  unlock(a);
}

void rvm_allocator_stats(const rvm_allocator *a, rvm_vm_stats *out) {
  rvm_allocator *m = (rvm_allocator *)a;
  lock(m);
  *out = a->stats;
  unlock(m);
}

void rvm_allocator_reset_stats(rvm_allocator *a) {
  lock(a);
  a->stats.peak_storage_bytes = a->stats.live_storage_bytes;
  a->stats.storage_allocations = 0;
  a->stats.pool_hits = 0;
  unlock(a);
}

static void storage_deleter(void *self, int flags) {
  rvm_storage *s = self;
  if (flags & 1) {
    if (s->allocator) {
      rvm_allocator_free(s->allocator, s->data, s->nbytes);
      rvm_allocator_release(s->allocator);
    } else {
      free(s->data);
    }
  }
  if (flags & 2) free(s);
}

rvm_storage *rvm_storage_new(rvm_allocator *a, uint64_t nbytes) {
  rvm_storage *s = malloc(sizeof(*s));
  if (!s) {
    rvm_raise("MemoryError", "out of memory allocating a storage object");
    return NULL;
  }
  s->data = rvm_allocator_alloc(a, nbytes);
  if (!s->data) {
    free(s);
    return NULL;
  }
  rvm_object_init(&s->header, RVM_TYPE_STORAGE, storage_deleter);
  s->nbytes = nbytes;
  s->device.device_type = kDLCPU;
  s->device.device_id = 0;
  s->allocator = a;
  s->cuda = NULL;
  rvm_allocator_retain(a);
  return s;
}

rvm_storage *rvm_storage_new_unpooled(uint64_t nbytes) {
  rvm_storage *s = malloc(sizeof(*s));
  void *data = aligned_alloc(RVM_ALIGN, (nbytes + RVM_ALIGN - 1) & ~(uint64_t)(RVM_ALIGN - 1));
  if (!s || (!data && nbytes)) {
    free(s);
    free(data);
    rvm_raise("MemoryError", "out of memory allocating %llu bytes", (unsigned long long)nbytes);
    return NULL;
  }
  rvm_object_init(&s->header, RVM_TYPE_STORAGE, storage_deleter);
  s->data = data;
  s->nbytes = nbytes;
  s->device.device_type = kDLCPU;
  s->device.device_id = 0;
  s->allocator = NULL;
  s->cuda = NULL;
  return s;
}
