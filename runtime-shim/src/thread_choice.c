/*
 * thread_choice.c: whether a call runs its kernels on the thread pool or on the calling thread
 * alone, decided by timing both.
 *
 * A model of tens of microseconds gains nothing from a second thread and pays for every wake-up
 * and hand-over (on a 2-core VM a 20 us model took twice as long at 2 threads). Which model is
 * that small depends on the machine, its load and the model, so no size rule decides it: the first
 * calls of each function, for each set of argument shapes, alternate between the pool and the
 * calling thread alone (in blocks of each, of which only the later calls are timed, so that they
 * find the workers and caches as a steady stream of calls would), and the faster way is kept for that function and those shapes. The
 * pool is kept unless running alone is at least as fast within 3%, and the trials are made again
 * every few thousand calls, since the machine's load changes. A function whose second call (the
 * first is a warm-up: page faults, first allocations) takes longer than 20 milliseconds on the
 * pool is not tried alone at all: the pool's overhead cannot matter to it, and a lone trial
 * would cost its user time.
 *
 * Running alone changes no result: every kernel gives the same bits at any number of tasks (a
 * busy pool already runs launches serially). RELAXC_THREAD_TRIALS=0 turns the trials off (every
 * call uses the pool, as before); RELAXC_THREAD_TRIALS=report prints each choice and its times.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

enum {
  /* Trial calls after the first come in blocks of one way (alone, pool, alone, pool); only the
   * block's later calls are timed, as the pool's workers and caches take a few calls to settle
   * after the other way's calls. */
  TRIAL_BLOCK = 4,
  TIMED_PER_BLOCK = 2,
  /* Call 0 warms up (its time includes first-touch costs), call 1 is timed on the pool to tell
   * whether the function is short enough for trials; the blocks follow. */
  FIRST_BLOCK_CALL = 2,
  TRIAL_CALLS = FIRST_BLOCK_CALL + 4 * TRIAL_BLOCK,
  /* Calls after a choice before it is tried again. */
  RETRIAL_AFTER = 4096,
};
/* A second call slower than this on the pool keeps the pool without trials. Not lower: when the
 * other core is busy the pool can take three times as long as one thread (a 1.4 ms classifier
 * took 4 ms), and a few lone calls of a 20 ms model cost once what one busy call does. */
#define TRIAL_LIMIT_NS 20000000
/* Alone wins unless the pool is faster by more than this share. */
#define POOL_MARGIN 0.03

enum trial_mode { TRIALS_UNREAD = -1, TRIALS_OFF, TRIALS_ON, TRIALS_REPORTED };

static enum trial_mode trial_mode(void) {
  static atomic_int mode = TRIALS_UNREAD; /* read once; racing threads store the same value */
  int m = atomic_load_explicit(&mode, memory_order_relaxed);
  if (m == TRIALS_UNREAD) {
    const char *v = getenv("RELAXC_THREAD_TRIALS");
    if (!v || strcmp(v, "1") == 0 || v[0] == '\0') {
      m = TRIALS_ON;
    } else if (strcmp(v, "0") == 0) {
      m = TRIALS_OFF;
    } else if (strcmp(v, "report") == 0) {
      m = TRIALS_REPORTED;
    } else {
      fprintf(stderr, "relaxc runtime: warning: RELAXC_THREAD_TRIALS=\"%s\" is not 0, 1 or report; using 1\n", v);
      m = TRIALS_ON;
    }
    atomic_store_explicit(&mode, m, memory_order_relaxed);
  }
  return (enum trial_mode)m;
}

static uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h;
}

/* What the calls compared share: the function and every argument's kind, dtype and shape (and
 * integers' values, which may size the work). */
static uint64_t call_key(int64_t func, const TVMFFIAny *args, int32_t num_args) {
  uint64_t h = mix(0x243f6a8885a308d3ull, (uint64_t)func);
  for (int32_t i = 0; i < num_args; i++) {
    const TVMFFIAny *a = &args[i];
    h = mix(h, (uint64_t)a->type_index);
    const DLTensor *t = rvm_as_dltensor(a);
    const TVMFFIShapeCell *s = t ? NULL : rvm_as_shape(a);
    if (t) {
      h = mix(h, (uint64_t)t->dtype.code << 16 | (uint64_t)t->dtype.bits << 8 | t->dtype.lanes);
      for (int32_t d = 0; d < t->ndim; d++) h = mix(h, (uint64_t)t->shape[d]);
    } else if (s) {
      for (uint64_t d = 0; d < s->size; d++) h = mix(h, (uint64_t)s->data[d]);
    } else if (a->type_index == kTVMFFIInt || a->type_index == kTVMFFIBool) {
      h = mix(h, (uint64_t)a->v_int64);
    }
  }
  return h ? h : 1; /* 0 marks a free slot */
}

static rvm_thread_trial *slot_for(rvm_thread_choices *c, uint64_t key) {
  size_t start = (size_t)(key % RVM_THREAD_CHOICE_SLOTS);
  for (size_t probe = 0; probe < RVM_THREAD_CHOICE_SLOTS; probe++) {
    rvm_thread_trial *e = &c->slots[(start + probe) % RVM_THREAD_CHOICE_SLOTS];
    if (e->key == key) return e;
    if (e->key == 0) {
      memset(e, 0, sizeof(*e));
      e->key = key;
      return e;
    }
  }
  return NULL; /* full: such calls use the pool untried */
}

bool rvm_thread_choice_begin(rvm_thread_choices *c, int64_t func, const char *name, const TVMFFIAny *args,
                             int32_t num_args, rvm_thread_call *call) {
  memset(call, 0, sizeof(*call));
  if (trial_mode() == TRIALS_OFF || rvm_parallel_threads() <= 1) return false;
  uint64_t key = call_key(func, args, num_args);
  rvm_thread_trial *e = slot_for(c, key);
  if (!e) return false;
  if (e->decided) {
    /* The machine's load changes (another process takes a core): now and then, try again. */
    if (++e->calls_since_choice < RETRIAL_AFTER) {
      call->alone = e->alone;
      if (call->alone) rvm_parallel_alone_begin();
      return call->alone;
    }
    memset(e, 0, sizeof(*e));
    e->key = key;
    e->calls = FIRST_BLOCK_CALL; /* warm, and known to be short */
  }
  call->trial = e;
  call->name = name;
  /* Calls 0 and 1 on the pool; then blocks alone, on the pool, alone, on the pool. */
  call->alone = e->calls >= FIRST_BLOCK_CALL && ((e->calls - FIRST_BLOCK_CALL) / TRIAL_BLOCK) % 2 == 0;
  call->start_ns = rvm_now_ns();
  if (call->alone) rvm_parallel_alone_begin();
  return call->alone;
}

void rvm_thread_choice_end(rvm_thread_call *call, int rc) {
  if (call->alone) rvm_parallel_alone_end();
  rvm_thread_trial *e = call->trial;
  if (!e) return;
  int64_t took = rvm_now_ns() - call->start_ns;
  if (rc != 0) return; /* a failed call times nothing worth comparing */
  if (e->calls == 0) { /* the warm-up */
    e->calls++;
    return;
  }
  if (!call->alone && took > TRIAL_LIMIT_NS) {
    e->decided = true; /* big enough that the pool's overhead cannot matter */
    e->alone = false;
    if (trial_mode() == TRIALS_REPORTED)
      fprintf(stderr, "relaxc runtime: %s: on the pool (a call took %.3f ms: no trials)\n", call->name, took / 1e6);
    return;
  }
  if (e->calls >= FIRST_BLOCK_CALL && (e->calls - FIRST_BLOCK_CALL) % TRIAL_BLOCK >= TRIAL_BLOCK - TIMED_PER_BLOCK) {
    int64_t *best = call->alone ? &e->best_alone_ns : &e->best_pool_ns;
    if (*best == 0 || took < *best) *best = took;
  }
  if (++e->calls > TRIAL_CALLS) {
    e->decided = true;
    e->alone = (double)e->best_pool_ns >= (double)e->best_alone_ns * (1.0 - POOL_MARGIN);
    if (trial_mode() == TRIALS_REPORTED)
      fprintf(stderr, "relaxc runtime: %s: %s (best of %d calls: %.1f us alone, %.1f us on the pool of %d threads)\n",
              call->name, e->alone ? "alone" : "on the pool", 2 * TIMED_PER_BLOCK, e->best_alone_ns / 1e3,
              e->best_pool_ns / 1e3, rvm_parallel_threads());
  }
}
