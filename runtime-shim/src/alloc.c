/*
 * alloc.c: the pooled CPU allocator behind vm.builtin.alloc_storage, and Storage objects.
 *
 * Models allocate the same sizes on every call, so freed buffers are kept on free lists keyed by
 * size and handed out again: after the first call, a call allocates nothing from the VM's allocator.
 * Sizes up to 64 KiB are kept exactly (rounded to 64 bytes); larger ones in power-of-two
 * classes. Buffers may come back from any thread (a result released by the user), so the
 * lists are guarded by a spin lock, which costs one uncontended atomic exchange.
 *

 * Tensor objects (the views that alloc_tensor makes for every operator) and Storage objects (one
 * per alloc_storage, a few on every call of most models) are recycled too, without any lock: only
 * the thread currently running a call on the VM takes objects from the caches or gives them back.
 * An object released by any other thread, or outside a call (a call's result, which the caller
 * releases after it returns), goes onto a second list that takes pushes from any thread and is
 * emptied whole into the cache when the cache runs dry: a result's two objects were a malloc and a
 * free each on every call. Both operations on it (a push, and a swap of the whole list) are
 * immune to ABA, so the list needs no lock.
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

struct rvm_pool {
  atomic_long refcount;
  const rvm_allocator *heap; /* where the pool's blocks and objects come from */
  atomic_flag lock;
  free_block *exact[RVM_EXACT_BUCKETS];
  free_block *classes[RVM_CLASS_BUCKETS];
  rvm_vm_stats stats;
  _Atomic uintptr_t active_thread; /* pthread_self() of the thread inside a call, else 0 */
  free_block *tensors;             /* cached tensor objects (RVM_CACHED_NDIM dims) */
  free_block *storages;            /* cached Storage objects */
  _Atomic(free_block *) returned_tensors;  /* released outside a call, for `tensors` */
  _Atomic(free_block *) returned_storages; /* released outside a call, for `storages` */
};

static uintptr_t this_thread(void) { return (uintptr_t)pthread_self(); }

uintptr_t rvm_pool_enter(rvm_pool *a) {
  uintptr_t previous = atomic_load_explicit(&a->active_thread, memory_order_relaxed);
  atomic_store_explicit(&a->active_thread, this_thread(), memory_order_relaxed);
  return previous;
}

void rvm_pool_leave(rvm_pool *a, uintptr_t previous) {
  atomic_store_explicit(&a->active_thread, previous, memory_order_relaxed);
}

static bool on_active_thread(rvm_pool *a) {
  return atomic_load_explicit(&a->active_thread, memory_order_relaxed) == this_thread();
}

/* Onto a list of objects released outside a call; from any thread. */
static void push_returned(_Atomic(free_block *) *list, free_block *b) {
  free_block *head = atomic_load_explicit(list, memory_order_relaxed);
  do b->next = head;
  while (!atomic_compare_exchange_weak_explicit(list, &head, b, memory_order_release, memory_order_relaxed));
}

/* The first object of a cache (on the thread running a call), refilled from `returned` when it is
 * empty; NULL when both are. */
static free_block *take_cached(free_block **cache, _Atomic(free_block *) *returned) {
  if (!*cache) {
    if (!atomic_load_explicit(returned, memory_order_relaxed)) return NULL;
    *cache = atomic_exchange_explicit(returned, NULL, memory_order_acquire);
    if (!*cache) return NULL;
  }
  free_block *b = *cache;
  *cache = b->next;
  return b;
}

rvm_tensor *rvm_pool_take_tensor(rvm_pool *a, int32_t ndim) {
  if (ndim > RVM_CACHED_NDIM || !on_active_thread(a)) return NULL;
  return (rvm_tensor *)take_cached(&a->tensors, &a->returned_tensors);
}

bool rvm_pool_give_tensor(rvm_pool *a, rvm_tensor *t) {
  if (t->dl.ndim > RVM_CACHED_NDIM) return false;
  free_block *b = (free_block *)t;
  if (!on_active_thread(a)) {
    push_returned(&a->returned_tensors, b);
    return true;
  }
  b->next = a->tensors;
  a->tensors = b;
  return true;
}

static void lock(rvm_pool *a) {
  while (atomic_flag_test_and_set_explicit(&a->lock, memory_order_acquire)) {
  }
}

static void unlock(rvm_pool *a) { atomic_flag_clear_explicit(&a->lock, memory_order_release); }

/* The bucket a request falls in, and the size actually allocated for it. */
static free_block **bucket_for(rvm_pool *a, uint64_t nbytes, uint64_t *rounded) {
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

rvm_pool *rvm_pool_new(const rvm_allocator *heap) {
  rvm_pool *a = rvm_mem_alloc_in(heap, sizeof(*a), 16, "a VM's storage pool");
  if (!a) return NULL;
  memset(a, 0, sizeof(*a));
  a->heap = heap;
  atomic_init(&a->refcount, 1);
  atomic_flag_clear(&a->lock);
  return a;
}

void rvm_pool_retain(rvm_pool *a) { atomic_fetch_add_explicit(&a->refcount, 1, memory_order_relaxed); }

static void free_list(free_block *b) {
  while (b) {
    free_block *next = b->next;
    rvm_mem_free(b);
    b = next;
  }
}

void rvm_pool_release(rvm_pool *a) {
  if (atomic_fetch_sub_explicit(&a->refcount, 1, memory_order_acq_rel) != 1) return;
  for (int i = 0; i < RVM_EXACT_BUCKETS; i++) free_list(a->exact[i]);
  for (int i = 0; i < RVM_CLASS_BUCKETS; i++) free_list(a->classes[i]);
  free_list(a->tensors);
  free_list(a->storages);
  free_list(atomic_load_explicit(&a->returned_tensors, memory_order_acquire));
  free_list(atomic_load_explicit(&a->returned_storages, memory_order_acquire));
  rvm_mem_free(a);
}

void *rvm_pool_alloc(rvm_pool *a, uint64_t nbytes) {
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
  void *p = rvm_mem_alloc_in(a->heap, rounded, RVM_ALIGN, "storage");
  if (!p) {
    lock(a);
    a->stats.live_storage_bytes -= rounded;
    unlock(a);
  }
  return p;
}

void rvm_pool_free(rvm_pool *a, void *ptr, uint64_t nbytes) {
  uint64_t rounded = 0;
  free_block **bucket = bucket_for(a, nbytes, &rounded);
  free_block *b = ptr;
  lock(a);
  b->next = *bucket;
  *bucket = b;
  a->stats.live_storage_bytes -= rounded;
  unlock(a);
}

void rvm_pool_stats(const rvm_pool *a, rvm_vm_stats *out) {
  rvm_pool *m = (rvm_pool *)a;
  lock(m);
  *out = a->stats;
  unlock(m);
}

void rvm_pool_reset_stats(rvm_pool *a) {
  lock(a);
  a->stats.peak_storage_bytes = a->stats.live_storage_bytes;
  a->stats.storage_allocations = 0;
  a->stats.pool_hits = 0;
  unlock(a);
}

/* Onto the pool's list of free Storage objects; only on the thread running its call. */
static void cache_storage_object(rvm_pool *a, rvm_storage *s) {
  free_block *b = (free_block *)s;
  b->next = a->storages;
  a->storages = b;
}

static void storage_deleter(void *self, int flags) {
  rvm_storage *s = self;
  rvm_pool *pool = s->allocator;
  if (flags == 3 && pool) {
    /* Into the cache before the pool's reference goes: the pool frees its caches when that
     * reference was the last. */
    rvm_pool_free(pool, s->data, s->nbytes);
    if (on_active_thread(pool)) cache_storage_object(pool, s);
    else push_returned(&pool->returned_storages, (free_block *)s);
    rvm_pool_release(pool);
    return;
  }
  if (flags & 1) {
    if (pool) {
      rvm_pool_free(pool, s->data, s->nbytes);
      rvm_pool_release(pool);
    } else {
      rvm_mem_free(s->data);
    }
  }
  if (flags & 2) rvm_mem_free(s);
}

bool rvm_is_pooled_storage(const TVMFFIObject *obj) { return obj->deleter == storage_deleter; }

/* A Storage object from the cache (on the thread running a call), else from the heap. */
static rvm_storage *storage_object(rvm_pool *a) {
  free_block *b = on_active_thread(a) ? take_cached(&a->storages, &a->returned_storages) : NULL;
  if (b) return (rvm_storage *)b;
  return rvm_mem_alloc_in(a->heap, sizeof(rvm_storage), 16, "a storage object");
}

/* Back to the cache when this thread may touch it, else to the heap. */
static void storage_object_discard(rvm_pool *a, rvm_storage *s) {
  if (on_active_thread(a)) cache_storage_object(a, s);
  else rvm_mem_free(s);
}

rvm_storage *rvm_storage_new(rvm_pool *a, uint64_t nbytes) {
  rvm_storage *s = storage_object(a);
  if (!s) return NULL;
  s->data = rvm_pool_alloc(a, nbytes);
  if (!s->data) {
    storage_object_discard(a, s);
    return NULL;
  }
  rvm_object_init(&s->header, RVM_TYPE_STORAGE, storage_deleter);
  s->nbytes = nbytes;
  s->device.device_type = kDLCPU;
  s->device.device_id = 0;
  s->allocator = a;
  s->cuda = NULL;
  rvm_pool_retain(a);
  return s;
}

rvm_storage *rvm_storage_new_unpooled(uint64_t nbytes) {
  if (nbytes > SIZE_MAX - RVM_ALIGN) {
    rvm_raise("MemoryError", "cannot allocate %llu bytes", (unsigned long long)nbytes);
    return NULL;
  }
  rvm_storage *s = rvm_mem_alloc(sizeof(*s), "a storage object");
  if (!s) return NULL;
  void *data = rvm_mem_aligned((nbytes + RVM_ALIGN - 1) & ~(uint64_t)(RVM_ALIGN - 1), RVM_ALIGN, "storage");
  if (!data) {
    rvm_mem_free(s);
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
