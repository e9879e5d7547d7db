/*
 * mem.c: where the runtime's memory comes from: the host's allocator of the VM running on this
 * thread (vm_create_with_allocator), else the C library's.
 *
 * Memory is freed wherever its last reference dies: a result the host releases after the VM is
 * gone, a tensor freed on another thread. So every block carries, just before the pointer the
 * runtime sees, the allocator it came from and the base the allocator returned; rvm_mem_free
 * needs nothing else. Which allocator serves a new block is a per-thread setting, made by the
 * entry points of a VM (and handed to the thread pool's workers for their tasks), because
 * allocations happen deep in builtins that never see the VM.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The block header, a multiple of 16 bytes so that the pointer after it keeps malloc's
 * alignment. */
typedef struct block_header {
  const rvm_allocator *owner;
  void *base;
  size_t size; /* bytes the caller asked for (rvm_mem_realloc copies this many) */
  size_t pad;
} block_header;
_Static_assert(sizeof(block_header) == 32, "block header size");

static void *libc_alloc(void *ctx, size_t size, size_t alignment) {
  (void)ctx;
  /* malloc's alignment is all most blocks need, and aligned_alloc costs tens of nanoseconds more
   * per call, which objects made on every call would pay. */
  if (alignment <= _Alignof(max_align_t)) return malloc(size ? size : 1);
  /* C11's aligned_alloc wants a size that is a multiple of the alignment. */
  size_t rounded = (size + alignment - 1) & ~(alignment - 1);
  return rounded < size ? NULL : aligned_alloc(alignment, rounded ? rounded : alignment);
}

static void libc_free(void *ctx, void *ptr) {
  (void)ctx;
  free(ptr);
}

const rvm_allocator rvm_libc_allocator = {libc_alloc, libc_free, NULL};

/* The thread's allocator sits behind a pthread key, not in _Thread_local storage, for the reason
 * error.c gives (no __tls_get_addr, so no dynamic loader among a model's NEEDED). It holds no
 * memory, so the key needs no destructor.
 *
 * Most processes never create a VM with a host allocator, and every call and allocation would
 * still pay for the key (a pthread_once and a pthread_getspecific each). So the threads whose key
 * holds an allocator are counted, and while none does, no thread's key is read or written: a
 * thread that finds the count at zero knows its own key is empty, since only it writes its key
 * and it counts itself before it does. */
static pthread_key_t current_key;
static pthread_once_t current_once = PTHREAD_ONCE_INIT;
static bool current_key_made;
static _Atomic long threads_with_an_allocator;

static void make_current_key(void) { current_key_made = pthread_key_create(&current_key, NULL) == 0; }

static const rvm_allocator *current(void) {
  if (atomic_load_explicit(&threads_with_an_allocator, memory_order_relaxed) == 0) return NULL;
  pthread_once(&current_once, make_current_key);
  return current_key_made ? pthread_getspecific(current_key) : NULL;
}

/* Sets this thread's key from `was` to `now` (libc's allocator is NULL), keeping the count. */
static void set_current(const rvm_allocator *was, const rvm_allocator *now) {
  if (!current_key_made || was == now) return;
  if (!was) atomic_fetch_add_explicit(&threads_with_an_allocator, 1, memory_order_relaxed);
  pthread_setspecific(current_key, now);
  if (!now) atomic_fetch_sub_explicit(&threads_with_an_allocator, 1, memory_order_relaxed);
}

bool rvm_mem_ready(void) {
  pthread_once(&current_once, make_current_key);
  return current_key_made;
}

const rvm_allocator *rvm_mem_current(void) {
  const rvm_allocator *a = current();
  return a ? a : &rvm_libc_allocator;
}

const rvm_allocator *rvm_mem_enter(const rvm_allocator *a) {
  if (a == &rvm_libc_allocator) a = NULL; /* the key's default: no write for the common case */
  const rvm_allocator *previous = current();
  if (a || previous) {
    /* Setting a key this library created cannot fail; if it could not be created, every thread
     * uses the C library's allocator. */
    pthread_once(&current_once, make_current_key);
    set_current(previous, a);
  }
  return previous;
}

void rvm_mem_leave(const rvm_allocator *previous) {
  const rvm_allocator *now = current();
  if (now != previous) set_current(now, previous);
}

__attribute__((destructor(101))) static void delete_current_key(void) {
  if (current_key_made) pthread_key_delete(current_key);
  current_key_made = false;
}

void *rvm_mem_alloc_in(const rvm_allocator *a, size_t size, size_t alignment, const char *what) {
  if (alignment < 16) alignment = 16;
  size_t offset = alignment > sizeof(block_header) ? alignment : sizeof(block_header);
  if (size > SIZE_MAX - offset) {
    rvm_raise("MemoryError", "out of memory: %s of %zu bytes is larger than the address space", what, size);
    return NULL;
  }
  char *base = a->alloc(a->ctx, size + offset, alignment);
  if (!base) {
    rvm_raise("MemoryError", "out of memory allocating %s (%zu bytes)", what, size);
    return NULL;
  }
  block_header *h = (block_header *)(base + offset) - 1;
  h->owner = a;
  h->base = base;
  h->size = size;
  h->pad = 0;
  return base + offset;
}

void *rvm_mem_alloc(size_t size, const char *what) { return rvm_mem_alloc_in(rvm_mem_current(), size, 16, what); }

void *rvm_mem_aligned(size_t size, size_t alignment, const char *what) {
  return rvm_mem_alloc_in(rvm_mem_current(), size, alignment, what);
}

void *rvm_mem_calloc(size_t count, size_t size, const char *what) {
  if (size && count > SIZE_MAX / size) {
    rvm_raise("MemoryError", "out of memory: %zu %s of %zu bytes each do not fit in the address space", count, what, size);
    return NULL;
  }
  void *p = rvm_mem_alloc(count * size, what);
  if (p) memset(p, 0, count * size);
  return p;
}

void rvm_mem_free(void *ptr) {
  if (!ptr) return;
  block_header *h = (block_header *)ptr - 1;
  const rvm_allocator *a = h->owner;
  a->free(a->ctx, h->base);
}

void *rvm_mem_realloc(void *ptr, size_t size, const char *what) {
  if (!ptr) return rvm_mem_alloc(size, what);
  block_header *h = (block_header *)ptr - 1;
  void *fresh = rvm_mem_alloc_in(h->owner, size, 16, what);
  if (!fresh) return NULL;
  memcpy(fresh, ptr, h->size < size ? h->size : size);
  rvm_mem_free(ptr);
  return fresh;
}

const rvm_allocator *rvm_mem_owner(const void *ptr) { return ((const block_header *)ptr - 1)->owner; }
