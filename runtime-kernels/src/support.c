/*
 * support.c: what every kernel of the library needs from around it: per-thread scratch buffers,
 * parallel loops on the runtime's pool, and argument decoding with errors that name the kernel
 * and the argument.
 *
 * Scratch buffers belong to the thread that asks (the caller, or a pool worker running a task),
 * grow to the largest size asked and are reused, so a model's steady state allocates nothing.
 * A thread's buffers are freed when it exits; the calling thread's and the key itself when the
 * library is unloaded, after the pool's workers have been joined.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rk.h"

/* ---- scratch --------------------------------------------------------------------------------- */

typedef struct scratch_set {
  void *data[RK_SCRATCH_SLOTS];
  size_t size[RK_SCRATCH_SLOTS];
} scratch_set;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static bool scratch_key_made;

static void free_scratch(void *p) {
  scratch_set *s = p;
  for (int i = 0; i < RK_SCRATCH_SLOTS; i++) free(s->data[i]);
  free(s);
}

static void make_scratch_key(void) { scratch_key_made = pthread_key_create(&scratch_key, free_scratch) == 0; }

/* Runs after the thread pool stops (destructor 102): no worker can still use the key. */
__attribute__((destructor(101))) static void drop_scratch_key(void) {
  if (!scratch_key_made) return;
  scratch_set *s = pthread_getspecific(scratch_key);
  if (s) {
    pthread_setspecific(scratch_key, NULL);
    free_scratch(s);
  }
  pthread_key_delete(scratch_key);
  scratch_key_made = false;
}

void *rk_scratch(rk_slot slot, size_t nbytes) {
  pthread_once(&scratch_once, make_scratch_key);
  if (!scratch_key_made || (int)slot < 0 || slot >= RK_SCRATCH_SLOTS) return NULL;
  scratch_set *s = pthread_getspecific(scratch_key);
  if (!s) {
    s = calloc(1, sizeof *s);
    if (!s) return NULL;
    if (pthread_setspecific(scratch_key, s) != 0) {
      free(s);
      return NULL;
    }
  }
  if (nbytes == 0) nbytes = 64;
  if (s->size[slot] < nbytes) {
    /* Grow by a quarter more than asked, so a slowly growing size does not reallocate often. */
    size_t want = nbytes + nbytes / 4;
    if (want < nbytes) want = nbytes;
    want = (want + 63) & ~(size_t)63;
    if (want < nbytes) return NULL;
    void *fresh = aligned_alloc(64, want);
    if (!fresh) return NULL;
    free(s->data[slot]);
    s->data[slot] = fresh;
    s->size[slot] = want;
  }
  return s->data[slot];
}

/* ---- parallel loops -------------------------------------------------------------------------- */

typedef struct launch {
  rk_task_fn body;
  void *ctx;
} launch;

static int run_task(int task_id, TVMParallelGroupEnv *env, void *cdata) {
  const launch *l = cdata;
  return l->body(task_id, env->num_task, l->ctx);
}

int rk_max_threads(void) { return rvm_parallel_threads(); }

int rk_parallel(int64_t max_tasks, rk_task_fn body, void *ctx) {
  int threads = rvm_parallel_threads();
  int64_t n = max_tasks < threads ? max_tasks : threads;
  if (n <= 1) return body(0, 1, ctx);
  launch l = {body, ctx};
  return TVMBackendParallelLaunch(run_task, &l, (int)n);
}

/* ---- arguments ------------------------------------------------------------------------------- */

int rk_check_count(const char *kernel, int32_t num_args, int32_t expected) {
  if (num_args != expected)
    return rvm_raise("TypeError", "%s expects %d arguments, got %d", kernel, expected, num_args);
  return 0;
}

int64_t rk_numel(const DLTensor *t) {
  int64_t n = 1;
  for (int32_t i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

bool rk_same_shape(const DLTensor *a, const DLTensor *b) {
  bool same = a->ndim == b->ndim;
  for (int32_t d = 0; same && d < a->ndim; d++) same = a->shape[d] == b->shape[d];
  return same;
}

void rk_report_path(const char *family, const char *path) {
  const char *report = getenv("RELAXC_KERNEL_PATHS");
  if (report && strcmp(report, "report") == 0) fprintf(stderr, "relaxc kernels: %s on %s\n", family, path);
}

bool rk_quant_isa_forced(const char *isa) {
  const char *forced = getenv("RELAXC_QUANT_ISA");
  return forced && strcmp(forced, isa) == 0;
}

bool rk_compact(const DLTensor *t) {
  if (!t->strides || rk_numel(t) == 0) return true; /* an empty tensor has no layout to get wrong */
  int64_t expected = 1;
  for (int32_t i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] != 1 && t->strides[i] != expected) return false;
    expected *= t->shape[i];
  }
  return true;
}

int rk_arg_f32_or_none(const char *kernel, const TVMFFIAny *args, int32_t num_args, int32_t i, const char *name,
                       DLTensor **out) {
  *out = NULL;
  if (i < num_args && args[i].type_index == kTVMFFINone) return 0;
  return rk_arg_f32(kernel, args, num_args, i, name, out);
}

int rk_arg_f32(const char *kernel, const TVMFFIAny *args, int32_t num_args, int32_t i, const char *name,
               DLTensor **out) {
  if (i >= num_args) return rvm_raise("TypeError", "%s: argument %d (%s) is missing", kernel, i, name);
  DLTensor *t = rvm_as_dltensor(&args[i]);
  if (!t)
    return rvm_raise("TypeError", "%s: argument %d (%s) must be a tensor, got %s", kernel, i, name,
                     rvm_type_name(&args[i]));
  if (t->device.device_type != kDLCPU)
    return rvm_raise("ValueError", "%s: argument %d (%s) must be on the CPU, got device type %d", kernel, i, name,
                     t->device.device_type);
  if (t->dtype.code != kDLFloat || t->dtype.bits != 32 || t->dtype.lanes != 1) {
    char dtype[32];
    rvm_format_dtype(t->dtype, dtype, sizeof dtype);
    return rvm_raise("TypeError", "%s: argument %d (%s) must be float32, got %s", kernel, i, name, dtype);
  }
  if (!rk_compact(t))
    return rvm_raise("ValueError", "%s: argument %d (%s) must be a compact row-major tensor", kernel, i, name);
  *out = t;
  return 0;
}

int rk_arg_typed(const char *kernel, const TVMFFIAny *args, int32_t num_args, int32_t i, const char *name, int code,
                 int bits, const char *dtype, DLTensor **out) {
  DLTensor *t = i < num_args ? rvm_as_dltensor(&args[i]) : NULL;
  if (!t || t->device.device_type != kDLCPU || t->dtype.code != code || t->dtype.bits != bits || t->dtype.lanes != 1 ||
      !rk_compact(t))
    return rvm_raise("TypeError", "%s: argument %d (%s) must be a compact %s CPU tensor, got %s", kernel, i, name, dtype,
                     t ? "another tensor" : (i < num_args ? rvm_type_name(&args[i]) : "nothing"));
  *out = t;
  return 0;
}

int rk_arg_i32(const char *kernel, const TVMFFIAny *args, int32_t num_args, int32_t i, const char *name,
               DLTensor **out) {
  return rk_arg_typed(kernel, args, num_args, i, name, kDLInt, 32, "int32", out);
}

int rk_arg_int(const char *kernel, const TVMFFIAny *args, int32_t num_args, int32_t i, const char *name,
               int64_t *out) {
  if (i < num_args && (args[i].type_index == kTVMFFIInt || args[i].type_index == kTVMFFIBool)) {
    *out = args[i].v_int64;
    return 0;
  }
  return rvm_raise("TypeError", "%s: argument %d (%s) must be an integer, got %s", kernel, i, name,
                   i < num_args ? rvm_type_name(&args[i]) : "nothing");
}


int rk_shape_error(const char *kernel, const char *what, const DLTensor *t) {
  char shape[160];
  rvm_format_shape(t->shape, t->ndim, shape, sizeof shape);
  return rvm_raise("ValueError", "%s: %s (got %s)", kernel, what, shape);
}

int rk_out_of_memory(const char *kernel) { return rvm_raise("MemoryError", "%s: out of memory for scratch space", kernel); }

static const char *const act_names[RK_ACT_COUNT] = {"none", "relu", "clip", "gelu", "gelu_tanh", "silu", "sigmoid",
                                                              "hard_sigmoid", "hard_swish"};

int rk_arg_scalars(const char *kernel, const TVMFFIAny *args, int32_t num_args, int32_t i, const char *name,
                   int64_t count, float *out) {
  DLTensor *t = NULL;
  int rc = rk_arg_f32(kernel, args, num_args, i, name, &t);
  if (rc) return rc;
  if (t->ndim != 1 || t->shape[0] != count) {
    char what[96];
    snprintf(what, sizeof what, "argument %d (%s) must be a float32 tensor of %lld values", i, name, (long long)count);
    return rk_shape_error(kernel, what, t);
  }
  memcpy(out, rk_data(t), sizeof(float) * (size_t)count);
  return 0;
}

int rk_arg_name(const char *kernel, const TVMFFIAny *args, int32_t num_args, int32_t i, const char *what,
                const char *const *names, int count, int *out) {
  const char *name = NULL;
  uint64_t size = 0;
  if (i >= num_args || !rvm_as_string(&args[i], &name, &size))
    return rvm_raise("TypeError", "%s: argument %d (%s) must be a string, got %s", kernel, i, what,
                     i < num_args ? rvm_type_name(&args[i]) : "nothing");
  for (int n = 0; n < count; n++)
    if (strlen(names[n]) == size && memcmp(names[n], name, size) == 0) {
      *out = n;
      return 0;
    }
  char known[256] = "";
  for (int n = 0; n < count; n++) {
    size_t used = strlen(known);
    snprintf(known + used, sizeof known - used, "%s%s", n ? ", " : "", names[n][0] ? names[n] : "\"\"");
  }
  return rvm_raise("ValueError", "%s: unknown %s \"%.*s\" (known: %s)", kernel, what, (int)(size > 64 ? 64 : size),
                   name, known);
}

int rk_arg_epilogue(const char *kernel, const TVMFFIAny *args, int32_t num_args, int32_t i, rk_epilogue *out) {
  *out = rk_epilogue_none();
  int act = 0;
  int rc = rk_arg_name(kernel, args, num_args, i, "activation", act_names, RK_ACT_COUNT, &act);
  if (rc) return rc;
  float scalars[3];
  rc = rk_arg_scalars(kernel, args, num_args, i + 1, "alpha_lo_hi", 3, scalars);
  if (rc) return rc;
  out->act = (rk_act)act;
  out->alpha = scalars[0];
  out->lo = scalars[1];
  out->hi = scalars[2];
  return 0;
}

int rk_arg_shape(const char *kernel, const TVMFFIAny *args, int32_t num_args, int32_t i, const char *name,
                 int64_t count, const int64_t **dims, int64_t *ndim) {
  const TVMFFIShapeCell *shape = i < num_args ? rvm_as_shape(&args[i]) : NULL;
  if (!shape)
    return rvm_raise("TypeError", "%s: argument %d (%s) must be a shape, got %s", kernel, i, name,
                     i < num_args ? rvm_type_name(&args[i]) : "nothing");
  if (count >= 0 && (int64_t)shape->size != count)
    return rvm_raise("ValueError", "%s: argument %d (%s) must have %lld values, got %lld", kernel, i, name,
                     (long long)count, (long long)shape->size);
  *dims = shape->data;
  *ndim = (int64_t)shape->size;
  return 0;
}
