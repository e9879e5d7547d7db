/*
 * parallel.c: the thread pool behind TVMBackendParallelLaunch, which every T.parallel loop and
 * tuned TVM CPU kernel calls.
 *
 * TVM's kernels split their loops themselves: task t of n covers its share, so the runtime only
 * has to run tasks 0..n-1 at once and wait for all of them. As in TVM, the calling thread runs
 * task 0 and persistent workers run the rest; workers spin briefly for the next job (kernels
 * come in quick succession) and then sleep. The pool is sized once, at the first parallel
 * kernel, from TVM_NUM_THREADS (TVM's variable, so deployment scripts keep working), then
 * OMP_NUM_THREADS, else the number of online CPUs; no thread exists before that.
 *
 * One pool serves the whole library. A launch that finds it busy (another VM's kernel on
 * another thread, or a parallel kernel nested in a task) runs serially on its own thread with
 * one task, which TVM's lambdas accept, so results are the same at any thread count.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

enum { MAX_THREADS = 1024, SPIN_ROUNDS = 1 << 14, SYNC_STRIDE = 16 /* ints: one cache line each */ };

typedef struct pool {
  int num_threads; /* the caller plus the workers */
  pthread_t *workers;
  pthread_mutex_t lock;
  pthread_cond_t wake, done;
  atomic_uint generation; /* bumped for every job; workers wait for it to move */
  atomic_bool stop;
  atomic_flag busy;
  /* the current job, written before `generation` moves */
  FTVMParallelLambda f;
  void *cdata;
  TVMParallelGroupEnv env;
  atomic_int pending; /* worker tasks not finished */
  atomic_int failed;  /* a task failed; its error is below */
  char error_kind[48];
  char error_message[2048];
  atomic_int *sync; /* barrier counters, SYNC_STRIDE apart */
} pool;

static pool the_pool;
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static bool pool_started;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* A thread count from the environment: TVM_NUM_THREADS, then OMP_NUM_THREADS. A value that is
 * not a positive number is reported once and ignored. */
static int configured_threads(void) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int fallback = cores > 0 ? (cores > MAX_THREADS ? MAX_THREADS : (int)cores) : 1;
  const char *names[] = {"TVM_NUM_THREADS", "OMP_NUM_THREADS"};
  for (int i = 0; i < 2; i++) {
    const char *v = getenv(names[i]);
    if (!v) continue;
    char *end = NULL;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno == 0 && end != v && *end == '\0' && n > 0) return n > MAX_THREADS ? MAX_THREADS : (int)n;
    fprintf(stderr, "relaxc runtime: warning: %s=\"%s\" is not a positive number of threads; using %d (the number of CPUs)\n",
            names[i], v, fallback);
    return fallback;
  }
  return fallback;
}

static void record_failure(pool *p) {
  int expected = 0;
  if (atomic_compare_exchange_strong(&p->failed, &expected, 1)) {
    snprintf(p->error_kind, sizeof p->error_kind, "%s", rvm_error_kind()[0] ? rvm_error_kind() : "RuntimeError");
    snprintf(p->error_message, sizeof p->error_message, "%s", rvm_error_message());
  }
}

static void *worker_main(void *arg) {
  pool *p = &the_pool;
  int id = (int)(intptr_t)arg;
  unsigned seen = 0;
  for (;;) {
    unsigned g = atomic_load_explicit(&p->generation, memory_order_acquire);
    for (int spin = 0; g == seen && spin < SPIN_ROUNDS && !atomic_load_explicit(&p->stop, memory_order_relaxed); spin++) {
      cpu_relax();
      g = atomic_load_explicit(&p->generation, memory_order_acquire);
    }
    if (g == seen) {
      pthread_mutex_lock(&p->lock);
      while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen &&
             !atomic_load_explicit(&p->stop, memory_order_relaxed))
        pthread_cond_wait(&p->wake, &p->lock);
      pthread_mutex_unlock(&p->lock);
    }
    if (atomic_load_explicit(&p->stop, memory_order_relaxed)) return NULL;
    seen = g;
    if (id < p->env.num_task && p->f(id, &p->env, p->cdata) != 0) record_failure(p);
    if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
      pthread_mutex_lock(&p->lock);
      pthread_cond_signal(&p->done);
      pthread_mutex_unlock(&p->lock);
    }
  }
}

static void start_pool(void) {
  pool *p = &the_pool;
  p->num_threads = configured_threads();
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->wake, NULL);
  pthread_cond_init(&p->done, NULL);
  atomic_flag_clear(&p->busy);
  p->sync = calloc((size_t)p->num_threads * SYNC_STRIDE, sizeof(atomic_int));
  p->workers = p->num_threads > 1 ? calloc((size_t)p->num_threads - 1, sizeof(pthread_t)) : NULL;
  if (!p->sync || (p->num_threads > 1 && !p->workers)) {
    p->num_threads = 1; /* no memory for a pool: every launch runs serially */
    return;
  }
  int started = 1;
  for (int i = 1; i < p->num_threads; i++) {
    if (pthread_create(&p->workers[i - 1], NULL, worker_main, (void *)(intptr_t)i) != 0) break;
    started++;
  }
  p->num_threads = started;
  pool_started = true;
}

/* On dlclose (or exit): the workers run this library's code, so they must be gone first. */
__attribute__((destructor(102))) static void stop_pool(void) {
  pool *p = &the_pool;
  if (!pool_started) return;
  pthread_mutex_lock(&p->lock);
  atomic_store(&p->stop, true);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->lock);
  for (int i = 1; i < p->num_threads; i++) pthread_join(p->workers[i - 1], NULL);
  free(p->workers);
  free(p->sync);
  pool_started = false;
}

int rvm_parallel_threads(void) {
  pthread_once(&pool_once, start_pool);
  return the_pool.num_threads;
}

static int run_serially(FTVMParallelLambda f, void *cdata) {
  atomic_int counter = 0;
  TVMParallelGroupEnv env = {&counter, 1};
  return f(0, &env, cdata);
}

RVM_HIDDEN int TVMBackendParallelLaunch(FTVMParallelLambda flambda, void *cdata, int num_task) {
  pool *p = &the_pool;
  pthread_once(&pool_once, start_pool);
  if (p->num_threads <= 1 || atomic_flag_test_and_set_explicit(&p->busy, memory_order_acquire))
    return run_serially(flambda, cdata);
  if (num_task <= 0) num_task = p->num_threads;
  if (num_task > p->num_threads) {
    atomic_flag_clear_explicit(&p->busy, memory_order_release);
    return rvm_raise("InternalError",
                     "Check failed: num_task <= num_workers_used_ (%d vs. %d) : Request parallel sync task larger than number of "
                     "threads used  workers=%d request=%d",
                     num_task, p->num_threads, p->num_threads, num_task);
  }
  for (int i = 0; i < num_task; i++) atomic_store_explicit(&p->sync[i * SYNC_STRIDE], 0, memory_order_relaxed);
  p->f = flambda;
  p->cdata = cdata;
  p->env.sync_handle = p->sync;
  p->env.num_task = num_task;
  atomic_store_explicit(&p->failed, 0, memory_order_relaxed);
  atomic_store_explicit(&p->pending, p->num_threads - 1, memory_order_relaxed);
  pthread_mutex_lock(&p->lock);
  atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->lock);

  int rc = flambda(0, &p->env, cdata);
  for (int spin = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0 && spin < SPIN_ROUNDS; spin++) cpu_relax();
  if (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) {
    pthread_mutex_lock(&p->lock);
    while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) pthread_cond_wait(&p->done, &p->lock);
    pthread_mutex_unlock(&p->lock);
  }
  if (rc == 0 && atomic_load_explicit(&p->failed, memory_order_acquire)) rc = rvm_raise(p->error_kind, "%s", p->error_message);
  atomic_flag_clear_explicit(&p->busy, memory_order_release);
  return rc;
}

/* TVM's barrier among the tasks of one launch: each task counts its arrivals and waits until
 * every other task has arrived as often. */
RVM_HIDDEN int TVMBackendParallelBarrier(int task_id, TVMParallelGroupEnv *penv) {
  int n = penv->num_task;
  if (n <= 1) return 0;
  atomic_int *sync = penv->sync_handle;
  int old = atomic_fetch_add_explicit(&sync[task_id * SYNC_STRIDE], 1, memory_order_release);
  for (int i = 0; i < n; i++) {
    if (i == task_id) continue;
    while (atomic_load_explicit(&sync[i * SYNC_STRIDE], memory_order_relaxed) <= old) cpu_relax();
  }
  atomic_thread_fence(memory_order_acquire);
  return 0;
}
