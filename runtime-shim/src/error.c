/*
 * error.c: the thread-local "last error" every failing call leaves behind.
 *
 * Kernels report through TVMFFIErrorSetRaisedFromCStrParts (TVM-FFI's convention) and return
 * -1; the shim's own code uses rvm_raise. The interpreter and compiled code then add where the
 * error happened, once, so the message names the innermost function and instruction.
 * The state lives behind a pthread key rather than in _Thread_local storage: a 4 KiB
 * thread-local block in a dlopen'ed library would need __tls_get_addr, which adds the dynamic
 * loader to the model's NEEDED libraries. The key's destructor frees it when a thread exits.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

enum { RVM_ERROR_CAPACITY = 4096 };

typedef struct error_state {
  char kind[48];
  char message[RVM_ERROR_CAPACITY];
  bool located;
} error_state;

static pthread_key_t error_key;
static pthread_once_t error_key_once = PTHREAD_ONCE_INIT;
static bool error_key_made;
/* Used when a thread cannot get its own state (out of memory): messages may then mix. */
static error_state fallback_error;

static void make_key(void) { error_key_made = pthread_key_create(&error_key, free) == 0; }

static error_state *existing_state(void) {
  pthread_once(&error_key_once, make_key);
  return error_key_made ? pthread_getspecific(error_key) : &fallback_error;
}

static error_state *state(void) {
  error_state *s = existing_state();
  if (s) return s;
  s = calloc(1, sizeof(*s));
  if (!s || pthread_setspecific(error_key, s) != 0) {
    free(s);
    return &fallback_error;
  }
  return s;
}

/* On dlclose: free the unloading thread's state (other threads free theirs when they exit,
 * through the key's destructor, as long as the library is still loaded), then the key. */
/* Priority 101: after every other destructor, which may still report errors (the thread pool's
 * workers exit in one). */
__attribute__((destructor(101))) static void delete_key(void) {
  if (!error_key_made) return;
  free(pthread_getspecific(error_key));
  pthread_setspecific(error_key, NULL);
  pthread_key_delete(error_key);
}

static error_state *set_kind(const char *kind) {
  error_state *e = state();
  snprintf(e->kind, sizeof(e->kind), "%s", kind ? kind : "RuntimeError");
  e->located = false;
  return e;
}

void TVMFFIErrorSetRaisedFromCStrParts(const char *kind, const char **parts, int32_t num_parts) {
  error_state *e = set_kind(kind);
  size_t at = 0;
  for (int32_t i = 0; i < num_parts; i++) {
    if (!parts[i]) continue;
    size_t n = strlen(parts[i]);
    if (at + n >= RVM_ERROR_CAPACITY) n = RVM_ERROR_CAPACITY - 1 - at;
    memcpy(e->message + at, parts[i], n);
    at += n;
  }
  e->message[at] = 0;
}

void TVMFFIErrorSetRaisedFromCStr(const char *kind, const char *message) {
  const char *parts[1] = {message};
  TVMFFIErrorSetRaisedFromCStrParts(kind, parts, 1);
}

int rvm_raise(const char *kind, const char *fmt, ...) {
  error_state *e = set_kind(kind);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->message, RVM_ERROR_CAPACITY, fmt, ap);
  va_end(ap);
  return -1;
}

void rvm_error_locate(const char *function, int64_t pc, const char *callee) {
  error_state *e = state();
  if (e->located) return;
  e->located = true;
  char prefix[512];
  int n = snprintf(prefix, sizeof(prefix), "in %s at pc %lld (%s): ", function, (long long)pc, callee);
  if (n < 0) return;
  if ((size_t)n >= sizeof(prefix)) n = sizeof(prefix) - 1;
  size_t old_len = strlen(e->message);
  if ((size_t)n + old_len >= RVM_ERROR_CAPACITY) old_len = RVM_ERROR_CAPACITY - 1 - (size_t)n;
  memmove(e->message + n, e->message, old_len);
  memcpy(e->message, prefix, (size_t)n);
  e->message[(size_t)n + old_len] = 0;
}

void rvm_error_clear(void) {
  /* A thread without its own state leaves the shared fallback alone: other threads may be using it. */
  error_state *e = existing_state();
  if (!e) return;
  e->kind[0] = 0;
  e->message[0] = 0;
  e->located = false;
}

/* A thread without its own state has never recorded an error but in the fallback (its state could
 * not be allocated: memory ran out): that is where its last error is. */
const char *rvm_error_message(void) {
  error_state *e = existing_state();
  return e ? e->message : fallback_error.message;
}

const char *rvm_error_kind(void) {
  error_state *e = existing_state();
  return e ? e->kind : fallback_error.kind;
}
