/*
 * parallel.c: the thread pool behind TVMBackendParallelLaunch, which every T.parallel loop and
 * tuned TVM CPU kernel calls.
 *
 * TVM's kernels split their loops themselves: task t of n covers its share, so the runtime only
 * has to run tasks 0..n-1 and wait for all of them. The calling thread and persistent workers
 * claim the tasks as they come (one compare-and-swap each), so which thread runs a task changes
 * nothing but the time: when a worker's core is busy with another process, the caller runs the
 * task itself instead of waiting for the scheduler to give the worker a turn (a busy process on
 * the other core of a 2-core VM made 2-thread LLM decoding 10-30x slower when each worker had
 * its fixed task). Barriers still work: a task passes its first barrier only once every task has
 * been claimed, so no thread takes a second task of a launch that uses them.
 *
 * Between jobs a worker spins for the next one for RELAXC_POOL_SPIN_US microseconds (100 by
 * default) before it sleeps: a model's parallel kernels come between short serial ones, and a
 * sleeping worker costs the next launch a wake-up of tens of microseconds on a VM (TVM's workers
 * spin 300,000 sched_yields, OpenMP's 200 ms). It was 2000: no model measured faster with it than
 * with 50 or 100, and with another process busy on one of two cores, spinning that long kept the
 * scheduler from moving a preempted thread to the idle core (Q4_K_M decoding at 2 threads: 150
 * tokens/s with 2000, 200-290 with 100, 14 before tasks were claimed). The launcher takes the
 * lock to wake workers only when one sleeps, and the caller waits for the tasks the same way.
 * The pool is sized once, at the first parallel kernel, from TVM_NUM_THREADS (TVM's variable,
 * so deployment scripts keep working), then OMP_NUM_THREADS, else the number of online CPUs; no
 * thread exists before that.
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
#include <time.h>
#include <unistd.h>

#include "internal.h"

enum { MAX_THREADS = 1024, SYNC_STRIDE = 16 /* ints: one cache line each */ };
/* Spins between looks at the clock (a vDSO call): a few microseconds of pause instructions. */
enum { SPINS_PER_CLOCK = 256 };
#define DEFAULT_SPIN_US 100

typedef struct pool {
  int num_threads; /* the caller plus the workers */
  pthread_t *workers;
  pthread_mutex_t lock;
  pthread_cond_t wake, done;
  /* The job: its generation (high 32 bits, bumped for every job; workers wait for it to move),
   * its task count (16 bits) and the next task to claim (low 16 bits). One word, so that a late
   * thread can claim only the job it saw. */
  atomic_ullong claims;
  atomic_bool stop;
  atomic_flag busy;
  /* the current job, written before `claims` moves to its generation */
  FTVMParallelLambda f;
  void *cdata;
  TVMParallelGroupEnv env;
  const rvm_allocator *heap; /* the launcher's allocator, which the tasks allocate from too */
  atomic_int unfinished; /* tasks of the job not finished */
  atomic_int failed;  /* a task failed; its error is below */
  atomic_int sleepers; /* workers asleep on `wake` (or about to be) */
  atomic_bool caller_sleeps; /* the launcher asleep on `done` (or about to be) */
  int64_t spin_ns;     /* how long a waiting thread spins before it sleeps */
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

int64_t rvm_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* RELAXC_POOL_SPIN_US, else the default; a value that is not a number of microseconds is
 * reported once and ignored. */
static int64_t configured_spin_ns(void) {
  const char *v = getenv("RELAXC_POOL_SPIN_US");
  if (!v) return (int64_t)DEFAULT_SPIN_US * 1000;
  char *end = NULL;
  errno = 0;
  long us = strtol(v, &end, 10);
  if (errno == 0 && end != v && *end == '\0' && us >= 0 && us <= 10000000) return (int64_t)us * 1000;
  fprintf(stderr, "relaxc runtime: warning: RELAXC_POOL_SPIN_US=\"%s\" is not a number of microseconds; using %d\n", v,
          DEFAULT_SPIN_US);
  return (int64_t)DEFAULT_SPIN_US * 1000;
}

/* Spins until `done(p)` holds or the pool's spin time has passed; whether it holds. */
static bool spin_until(pool *p, bool (*done)(pool *, unsigned), unsigned arg) {
  int64_t deadline = 0;
  for (;;) {
    for (int i = 0; i < SPINS_PER_CLOCK; i++) {
      if (done(p, arg)) return true;
      cpu_relax();
    }
    int64_t t = rvm_now_ns();
    if (deadline == 0) deadline = t + p->spin_ns;
    if (t >= deadline) return done(p, arg);
  }
}

/* Both checks are sequentially consistent loads: each follows, on the sleeping side, a
 * sequentially consistent write of `sleepers` or `caller_sleeps` that the other side reads after
 * its own write, so one of the two always sees the other. */
static unsigned generation_of(unsigned long long claims) { return (unsigned)(claims >> 32); }

static bool job_posted(pool *p, unsigned seen) {
  return generation_of(atomic_load(&p->claims)) != seen || atomic_load(&p->stop);
}

static bool tasks_finished(pool *p, unsigned unused) {
  (void)unused;
  return atomic_load(&p->unfinished) == 0;
}

static void record_failure(pool *p) {
  int expected = 0;
  if (atomic_compare_exchange_strong(&p->failed, &expected, 1)) {
    snprintf(p->error_kind, sizeof p->error_kind, "%s", rvm_error_kind()[0] ? rvm_error_kind() : "RuntimeError");
    snprintf(p->error_message, sizeof p->error_message, "%s", rvm_error_message());
  }
}

/* A task of job `generation` not claimed yet, now this thread's, or -1 when none is left (or the
 * job is over and another one posted). */
static int claim_task(pool *p, unsigned generation) {
  unsigned long long c = atomic_load_explicit(&p->claims, memory_order_acquire);
  for (;;) {
    unsigned next = (unsigned)(c & 0xffff), count = (unsigned)((c >> 16) & 0xffff);
    if (generation_of(c) != generation || next >= count) return -1;
    if (atomic_compare_exchange_weak_explicit(&p->claims, &c, c + 1, memory_order_acquire, memory_order_acquire))
      return (int)next;
  }
}

/* Runs task `task` of the current job (which cannot change while it is unfinished) and counts it
 * done; the thread that finishes the last one wakes a sleeping launcher. */
static void run_task(pool *p, int task) {
  const rvm_allocator *previous = rvm_mem_enter(p->heap);
  void *mark = rvm_workspace_mark();
  if (p->f(task, &p->env, p->cdata) != 0) {
    rvm_workspace_release_to(mark);
    record_failure(p);
  }
  rvm_mem_leave(previous);
  if (atomic_fetch_sub(&p->unfinished, 1) == 1 && atomic_load(&p->caller_sleeps)) {
    pthread_mutex_lock(&p->lock);
    pthread_cond_signal(&p->done);
    pthread_mutex_unlock(&p->lock);
  }
}

static void *worker_main(void *unused) {
  (void)unused;
  pool *p = &the_pool;
  unsigned seen = 0;
  for (;;) {
    if (!spin_until(p, job_posted, seen)) {
      /* Sleep. Counting itself a sleeper before it looks at `claims` again (both sequentially
       * consistent) means a launcher that moves `claims` either is seen here or sees the
       * sleeper and takes the lock to wake it. */
      pthread_mutex_lock(&p->lock);
      atomic_fetch_add(&p->sleepers, 1);
      while (!job_posted(p, seen)) pthread_cond_wait(&p->wake, &p->lock);
      atomic_fetch_sub(&p->sleepers, 1);
      pthread_mutex_unlock(&p->lock);
    }
    if (atomic_load_explicit(&p->stop, memory_order_relaxed)) return NULL;
    seen = generation_of(atomic_load(&p->claims));
    for (int task; (task = claim_task(p, seen)) >= 0;) run_task(p, task);
  }
}

static void start_pool(void) {
  pool *p = &the_pool;
  p->num_threads = configured_threads();
  p->spin_ns = configured_spin_ns();
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
    if (pthread_create(&p->workers[i - 1], NULL, worker_main, NULL) != 0) break;
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

/* Threads running alone (thread_choice.c) are marked in a key, not in _Thread_local storage (see
 * api.c's thread_identity). While no thread is alone, which is the rule, no key is read. */
static pthread_key_t alone_key;
static pthread_once_t alone_once = PTHREAD_ONCE_INIT;
static bool alone_key_made;
static atomic_int threads_alone;

static void make_alone_key(void) { alone_key_made = pthread_key_create(&alone_key, NULL) == 0; }

static bool this_thread_alone(void) {
  if (atomic_load_explicit(&threads_alone, memory_order_acquire) == 0) return false;
  /* Another thread made the key: pthread_once orders its write of alone_key_made before this read. */
  pthread_once(&alone_once, make_alone_key);
  return alone_key_made && pthread_getspecific(alone_key) != NULL;
}

void rvm_parallel_alone_begin(void) {
  pthread_once(&alone_once, make_alone_key);
  if (!alone_key_made || pthread_setspecific(alone_key, &alone_key) != 0) return;
  atomic_fetch_add_explicit(&threads_alone, 1, memory_order_release);
}

void rvm_parallel_alone_end(void) {
  if (!alone_key_made || !pthread_getspecific(alone_key)) return;
  pthread_setspecific(alone_key, NULL);
  atomic_fetch_sub_explicit(&threads_alone, 1, memory_order_relaxed);
}

__attribute__((destructor(101))) static void delete_alone_key(void) {
  if (alone_key_made) pthread_key_delete(alone_key);
  alone_key_made = false;
}

int rvm_parallel_threads(void) {
  pthread_once(&pool_once, start_pool);
  return this_thread_alone() ? 1 : the_pool.num_threads;
}

static int run_serially(FTVMParallelLambda f, void *cdata) {
  atomic_int counter = 0;
  TVMParallelGroupEnv env = {&counter, 1};
  return f(0, &env, cdata);
}

RVM_HIDDEN int TVMBackendParallelLaunch(FTVMParallelLambda flambda, void *cdata, int num_task) {
  pool *p = &the_pool;
  pthread_once(&pool_once, start_pool);
  if (p->num_threads <= 1 || this_thread_alone() || atomic_flag_test_and_set_explicit(&p->busy, memory_order_acquire))
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
  p->heap = rvm_mem_current();
  p->env.sync_handle = p->sync;
  p->env.num_task = num_task;
  atomic_store_explicit(&p->failed, 0, memory_order_relaxed);
  atomic_store_explicit(&p->unfinished, num_task, memory_order_relaxed);
  unsigned generation = generation_of(atomic_load_explicit(&p->claims, memory_order_relaxed)) + 1;
  atomic_store(&p->claims, (unsigned long long)generation << 32 | (unsigned long long)num_task << 16);
  if (atomic_load(&p->sleepers) > 0) {
    pthread_mutex_lock(&p->lock);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
  }

  /* The caller claims tasks too, until none is left; then it waits for those still running. */
  for (int task; (task = claim_task(p, generation)) >= 0;) run_task(p, task);
  if (!spin_until(p, tasks_finished, 0)) {
    pthread_mutex_lock(&p->lock);
    atomic_store(&p->caller_sleeps, true);
    while (!tasks_finished(p, 0)) pthread_cond_wait(&p->done, &p->lock);
    atomic_store(&p->caller_sleeps, false);
    pthread_mutex_unlock(&p->lock);
  }
  int rc = 0;
  if (atomic_load_explicit(&p->failed, memory_order_acquire)) rc = rvm_raise(p->error_kind, "%s", p->error_message);
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
    /* Acquire loads rather than a fence after the loop: the same ordering, visible to
     * ThreadSanitizer. */
    while (atomic_load_explicit(&sync[i * SYNC_STRIDE], memory_order_acquire) <= old) cpu_relax();
  }
  return 0;
}
