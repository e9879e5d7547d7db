/*
 * served.c: what a client can call (tvm-rpc.md §6): the built-in functions (upload, load_module,
 * ModuleGetFunction, the time evaluator, GetCRTMaxPacketSize, ffi.ArraySize/ArrayGetItem), and
 * the functions, closures and timers of the models it loaded. Models are relaxc .so files run
 * through their own C API (rvm.h), so a model's error reaches the client as its message.
 *
 * Uploads are files in the session's private directory: a name with '/' or ".." is refused, and
 * a file is written under a hidden temporary name and renamed, so a failed upload leaves nothing
 * behind under the name asked for.
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rpc.h"

static const struct {
  const char *name;
  rpc_builtin builtin;
} BUILTINS[] = {
    {"tvm.rpc.server.upload", RPC_FN_UPLOAD},
    {"tvm.rpc.server.load_module", RPC_FN_LOAD_MODULE},
    {"tvm.rpc.server.ModuleGetFunction", RPC_FN_MODULE_GET_FUNCTION},
    {"runtime.RPCTimeEvaluator", RPC_FN_TIME_EVALUATOR},
    {"tvm.rpc.server.GetCRTMaxPacketSize", RPC_FN_MAX_PACKET_SIZE},
    {"ffi.ArraySize", RPC_FN_ARRAY_SIZE},
    {"ffi.ArrayGetItem", RPC_FN_ARRAY_GET_ITEM},
};

int rpc_builtin_find(const uint8_t *name, uint64_t len) {
  for (size_t i = 0; i < sizeof BUILTINS / sizeof BUILTINS[0]; i++)
    if (strlen(BUILTINS[i].name) == len && memcmp(BUILTINS[i].name, name, (size_t)len) == 0) return (int)BUILTINS[i].builtin;
  return -1;
}

__attribute__((format(printf, 3, 4))) static int error(char *err, size_t err_size, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, err_size, fmt, ap);
  va_end(ap);
  return -1;
}

/* The model's last error as "Kind: message", as relaxc prints it. */
static int model_error(const rvm_api *api, char *err, size_t err_size) {
  const char *kind = api->last_error_kind();
  snprintf(err, err_size, "%s: %s", kind && *kind ? kind : "RuntimeError", api->last_error());
  return -1;
}

static int is_string(const rpc_value *v) { return v->type == kTVMFFIRawStr || v->type == kTVMFFIStr; }

/* `name` as a path in the session directory, refused if it could point anywhere else. */
static int session_path(rpc_session *s, const uint8_t *name, uint64_t len, const char *prefix, char *path,
                        size_t path_size, char *err, size_t err_size) {
  if (len == 0 || len > RPC_MAX_NAME) return error(err, err_size, "file names must be 1 to 255 bytes");
  char shown[RPC_MAX_NAME + 1];
  snprintf(shown, sizeof shown, "%.*s", (int)len, (const char *)name);
  for (uint64_t i = 0; i < len; i++) {
    if (name[i] == '/' || name[i] == 0)
      return error(err, err_size,
                   "refused the file name \"%s\": names may not contain '/' (files live in the session's own directory)",
                   shown);
    if (i + 1 < len && name[i] == '.' && name[i + 1] == '.')
      return error(err, err_size, "refused the file name \"%s\": names may not contain \"..\"", shown);
  }
  snprintf(path, path_size, "%s/%s%s", s->workdir, prefix, shown);
  return 0;
}

static int write_all_fd(int fd, const uint8_t *data, size_t n) {
  while (n) {
    ssize_t w = write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    data += w;
    n -= (size_t)w;
  }
  return 0;
}

static int too_big(rpc_session *s, uint64_t len, char *err, size_t err_size) {
  snprintf(err, err_size, "upload of %llu bytes refused: over the server's limit of %llu bytes (--max-upload)",
           (unsigned long long)len, (unsigned long long)s->limits.max_upload);
  return -1;
}

/* Writes an upload: `data` (len bytes) when it is in memory, else len bytes read from fd.
 * Returns 0, -1 (refused, err set, the bytes consumed) or -2 (the connection failed). */
static int store(rpc_session *s, const uint8_t *name, uint64_t name_len, const uint8_t *data, int fd, uint64_t len,
                 char *err, size_t err_size) {
  char path[4096], partial[4096];
  int refused = session_path(s, name, name_len, "", path, sizeof path, err, err_size) != 0 ||
                session_path(s, name, name_len, ".partial-", partial, sizeof partial, err, err_size) != 0 ||
                (len > s->limits.max_upload && too_big(s, len, err, err_size));
  int out = refused ? -1 : open(partial, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0700);
  if (!refused && out < 0) {
    snprintf(err, err_size, "cannot write %s: %s", partial, strerror(errno));
    refused = 1;
  }
  int write_errno = 0;
  if (data) {
    if (!refused && write_all_fd(out, data, (size_t)len) != 0) write_errno = errno ? errno : EIO;
  } else {
    /* Stream from the socket; after a refusal or a failed write the rest is still read, so the
     * connection stays in step and the client gets the error as the call's answer. */
    size_t chunk_size = 1 << 20;
    uint8_t *chunk = malloc(chunk_size);
    uint8_t small[4096];
    if (!chunk) {
      chunk = small;
      chunk_size = sizeof small;
    }
    uint64_t left = len;
    while (left) {
      size_t step = left < chunk_size ? (size_t)left : chunk_size;
      if (rpc_read_exact(fd, chunk, step) != 0) {
        if (chunk != small) free(chunk);
        if (out >= 0) {
          close(out);
          unlink(partial);
        }
        return -2;
      }
      if (out >= 0 && !write_errno && write_all_fd(out, chunk, step) != 0) write_errno = errno ? errno : EIO;
      left -= step;
    }
    if (chunk != small) free(chunk);
  }
  if (out >= 0 && close(out) != 0 && !write_errno) write_errno = errno;
  if (refused) return -1;
  if (write_errno) {
    unlink(partial);
    snprintf(err, err_size, "cannot write the upload %s: %s", path, strerror(write_errno));
    return -1;
  }
  if (rename(partial, path) != 0) {
    snprintf(err, err_size, "cannot store the upload %s: %s", path, strerror(errno));
    unlink(partial);
    return -1;
  }
  return 0;
}

int rpc_upload_stream(rpc_session *s, const uint8_t *name, uint64_t name_len, int fd, uint64_t len, char *err,
                      size_t err_size) {
  return store(s, name, name_len, NULL, fd, len, err, err_size);
}

/* ---- Models ----------------------------------------------------------------------------------- */

void rpc_module_close(rpc_entry *module) {
  const rvm_api *api = module->u.module.api;
  if (api) {
    api->vm_destroy(module->u.module.vm);
    api->module_close(module->u.module.module);
  }
  if (module->u.module.library) dlclose(module->u.module.library);
}

static void put_return_head(rpc_writer *w, int32_t count, int32_t type_index) {
  rpc_begin(w, RPC_RETURN);
  rpc_put_i32(w, count);
  rpc_put_int(w, kTVMFFIInt, type_index);
}

/* The kReturn of a handle the client now holds: a module, a function, a timer or an object. */
static int reply_with_handle(rpc_writer *w, int32_t type_index, uint64_t handle) {
  put_return_head(w, 2, type_index);
  rpc_put_handle(w, handle);
  rpc_finish(w);
  return 0;
}

static int load_module(rpc_session *s, const rpc_value *args, int32_t n, rpc_writer *w, char *err, size_t err_size) {
  char path[4096];
  if (n != 1 || !is_string(&args[0])) return error(err, err_size, "load_module takes a file name");
  if (session_path(s, args[0].v.bytes.data, args[0].v.bytes.len, "", path, sizeof path, err, err_size) != 0) return -1;
  const char *name = path + strlen(s->workdir) + 1;
  if (access(path, R_OK) != 0)
    return error(err, err_size, "no uploaded file named \"%s\" in this session (upload it first: files do not outlive a session)", name);
  /* dlopen by a name used once: the loader hands back an already loaded library of the same
   * path, so after a re-upload of `name` it would give the old model. Each load is its own. */
  static unsigned loads;
  char unique[4096];
  snprintf(unique, sizeof unique, "%s/.load-%u-%s", s->workdir, loads++, name);
  int linked = link(path, unique) == 0;
  void *library = dlopen(linked ? unique : path, RTLD_NOW | RTLD_LOCAL);
  if (linked) unlink(unique);
  if (!library) {
    snprintf(err, err_size, "cannot load %s: %s", name, dlerror());
    return -1;
  }
  rvm_get_api_fn get_api = (rvm_get_api_fn)(uintptr_t)dlsym(library, "rvm_get_api");
  /* Version 1 is all the server uses, and every relaxc model speaks it. */
  const rvm_api *api = get_api ? get_api(1) : NULL;
  if (!api) {
    dlclose(library);
    return error(err, err_size, "%s is not a relaxc model (it has no rvm_get_api): build it with relaxc compile", name);
  }
  rvm_module *module = NULL;
  rvm_vm *vm = NULL;
  if (api->module_open(&module) != 0 || api->vm_create(module, &vm) != 0) {
    model_error(api, err, err_size);
    if (module) api->module_close(module);
    dlclose(library);
    return -1;
  }
  rpc_entry *e;
  uint64_t handle = rpc_entry_new(s, RPC_ENTRY_MODULE, -1, &e);
  if (!handle) {
    api->vm_destroy(vm);
    api->module_close(module);
    dlclose(library);
    return error(err, err_size, "too many live handles in this session");
  }
  e->u.module.library = library;
  e->u.module.api = api;
  e->u.module.module = module;
  e->u.module.vm = vm;
  return reply_with_handle(w, kTVMFFIModule, handle);
}

static rpc_entry *module_arg(rpc_session *s, const rpc_value *v) {
  if (v->type != kTVMFFIModule && v->type != kTVMFFIOpaquePtr) return NULL;
  rpc_entry *e = rpc_entry_get(s, v->v.handle);
  return e && e->kind == RPC_ENTRY_MODULE ? e : NULL;
}

/* A function of a module by name: its index, or -1 with err (missing is not an error for
 * ModuleGetFunction, which answers None; the caller decides). */
static int32_t find_function(rpc_entry *m, const rpc_value *name) {
  char buf[RPC_MAX_NAME + 1];
  if (name->v.bytes.len > RPC_MAX_NAME) return -1;
  memcpy(buf, name->v.bytes.data, (size_t)name->v.bytes.len);
  buf[name->v.bytes.len] = 0;
  int32_t index = -1;
  if (m->u.module.api->function_find(m->u.module.module, buf, &index) != 0) return -1;
  return index;
}

static int module_get_function(rpc_session *s, const rpc_value *args, int32_t n, rpc_writer *w, char *err,
                               size_t err_size) {
  rpc_entry *m = n >= 2 ? module_arg(s, &args[0]) : NULL;
  if (!m || !is_string(&args[1])) return error(err, err_size, "ModuleGetFunction takes a module and a name");
  int32_t index = find_function(m, &args[1]);
  if (index < 0) {
    /* The client turns None into AttributeError "Module has no function" (§6). */
    put_return_head(w, 2, kTVMFFINone);
    rpc_put_none(w);
    rpc_finish(w);
    return 0;
  }
  rpc_entry *e;
  uint64_t handle = rpc_entry_new(s, RPC_ENTRY_FUNCTION, rpc_entry_index(s, m), &e);
  if (!handle) return error(err, err_size, "too many live handles in this session");
  e->u.function = index;
  return reply_with_handle(w, kTVMFFIFunction, handle);
}

/* Arguments of a model call as rvm values: tensors resolved to the session's memory (bounds
 * checked), scalars as they are, object handles borrowed from the values they name. */
typedef struct call_args {
  rvm_value *values;
  DLTensor *tensors;
  int64_t *dims;
} call_args;

static void free_args(call_args *a) {
  free(a->values);
  free(a->tensors);
  free(a->dims);
}

static int convert_args(rpc_session *s, int32_t module, const rpc_value *args, int32_t n, call_args *out, char *err,
                        size_t err_size) {
  memset(out, 0, sizeof *out);
  size_t total_dims = 0;
  for (int32_t i = 0; i < n; i++)
    if (args[i].type == kTVMFFIDLTensorPtr) total_dims += (size_t)args[i].v.tensor.ndim;
  out->values = calloc(n ? (size_t)n : 1, sizeof(rvm_value));
  out->tensors = calloc(n ? (size_t)n : 1, sizeof(DLTensor));
  out->dims = calloc(total_dims ? total_dims : 1, sizeof(int64_t));
  if (!out->values || !out->tensors || !out->dims) {
    free_args(out);
    return error(err, err_size, "out of memory for the call's arguments");
  }
  size_t dims_used = 0;
  for (int32_t i = 0; i < n; i++) {
    const rpc_value *a = &args[i];
    rvm_value *v = &out->values[i];
    char inner[512];
    switch (a->type) {
      case kTVMFFINone:
        break;
      case kTVMFFIInt:
      case kTVMFFIBool:
        v->type_index = a->type;
        v->v_int64 = a->v.i;
        break;
      case kTVMFFIFloat:
        v->type_index = kTVMFFIFloat;
        v->v_float64 = a->v.f;
        break;
      case kTVMFFIDLTensorPtr:
        if (rpc_resolve_tensor(s, &a->v.tensor, -1, &out->tensors[i], out->dims + dims_used, inner, sizeof inner) != 0) {
          snprintf(err, err_size, "argument %d: %s", i, inner);
          free_args(out);
          return -1;
        }
        dims_used += (size_t)a->v.tensor.ndim;
        v->type_index = kTVMFFIDLTensorPtr;
        v->v_ptr = &out->tensors[i];
        break;
      case RPC_TYPE_OBJECT_REF: {
        rpc_entry *e = rpc_entry_get(s, a->v.handle);
        if (!e || e->kind != RPC_ENTRY_VALUE) {
          snprintf(err, err_size, "argument %d: unknown object handle", i);
          free_args(out);
          return -1;
        }
        if (e->module != module) {
          snprintf(err, err_size, "argument %d: an object from another module", i);
          free_args(out);
          return -1;
        }
        *v = e->u.value;
        break;
      }
      default:
        snprintf(err, err_size, "argument %d: values of type index %d cannot be passed to a model function", i, a->type);
        free_args(out);
        return -1;
    }
  }
  return 0;
}

/* Writes the kReturn for an owned result (tvm-rpc.md §3.3), taking it: a tensor or object
 * becomes a handle the client frees, anything else is sent and released. */
static int encode_result(rpc_session *s, int32_t module, rvm_value *result, rpc_writer *w, char *err, size_t err_size) {
  const rvm_api *api = s->entries[module].u.module.api;
  int32_t type = result->type_index;
  switch (type) {
    case kTVMFFINone:
      put_return_head(w, 2, kTVMFFINone);
      rpc_put_none(w);
      rpc_finish(w);
      return 0;
    case kTVMFFIInt:
    case kTVMFFIBool:
      put_return_head(w, 2, type);
      rpc_put_int(w, type, result->v_int64);
      rpc_finish(w);
      return 0;
    case kTVMFFIFloat:
      put_return_head(w, 2, type);
      rpc_put_float(w, result->v_float64);
      rpc_finish(w);
      return 0;
    case kTVMFFISmallStr:
    case kTVMFFISmallBytes:
      put_return_head(w, 2, type);
      rpc_put_str(w, type == kTVMFFISmallStr ? kTVMFFIRawStr : kTVMFFIByteArrayPtr, result->v_bytes,
                  result->zero_padding < 8 ? result->zero_padding : 0);
      rpc_finish(w);
      return 0;
    case kTVMFFIStr:
    case kTVMFFIBytes: {
      const TVMFFIByteArray *bytes = (const TVMFFIByteArray *)((const char *)result->v_obj + sizeof(TVMFFIObject));
      put_return_head(w, 2, type);
      rpc_put_str(w, type == kTVMFFIStr ? kTVMFFIRawStr : kTVMFFIByteArrayPtr, bytes->data, bytes->size);
      rpc_finish(w);
      api->value_release(result);
      return 0;
    }
    default:
      break;
  }
  if (type < kTVMFFIStaticObjectBegin) {
    snprintf(err, err_size, "a result of type index %d cannot be sent to the client", type);
    return -1;
  }
  const DLTensor *t = type == kTVMFFITensor ? api->tensor_view(result) : NULL;
  if (t) {
    if (t->device.device_type != kDLCPU || t->ndim > RPC_MAX_NDIM) {
      api->value_release(result);
      return error(err, err_size, "a result tensor that is not a CPU tensor");
    }
    if (t->strides) {
      int64_t expected = 1;
      for (int32_t i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != expected) {
          api->value_release(result);
          return error(err, err_size, "a result tensor that is not compact");
        }
        expected *= t->shape[i];
      }
    }
  }
  rpc_entry *e;
  uint64_t handle = rpc_entry_new(s, RPC_ENTRY_VALUE, module, &e);
  if (!handle) {
    api->value_release(result);
    return error(err, err_size, "too many live handles in this session");
  }
  e->u.value = *result;
  memset(result, 0, sizeof *result);
  if (t) {
    put_return_head(w, 3, kTVMFFITensor);
    rpc_put_tensor(w, rpc_data_token(handle), t);
  } else {
    put_return_head(w, 2, type);
  }
  rpc_put_handle(w, handle);
  rpc_finish(w);
  return 0;
}

/* One call of a function or closure of module entry `m`. */
static int invoke(rpc_entry *m, const rvm_value *callee, int32_t function, const call_args *a, int32_t n,
                  rvm_value *result) {
  const rvm_api *api = m->u.module.api;
  memset(result, 0, sizeof *result);
  if (callee) return api->vm_call_closure(m->u.module.vm, callee, a->values, n, result);
  return api->vm_call(m->u.module.vm, function, a->values, n, result);
}

static int call_model(rpc_session *s, rpc_entry *e, const rpc_value *args, int32_t n, rpc_writer *w, char *err,
                      size_t err_size) {
  int32_t module = e->module;
  const rvm_value *callee = e->kind == RPC_ENTRY_VALUE ? &e->u.value : NULL;
  int32_t function = e->kind == RPC_ENTRY_FUNCTION ? e->u.function : -1;
  call_args a;
  if (convert_args(s, module, args, n, &a, err, err_size) != 0) return -1;
  rvm_value result;
  rpc_entry *m = &s->entries[module];
  int rc = invoke(m, callee, function, &a, n, &result);
  free_args(&a);
  if (rc != 0) return model_error(m->u.module.api, err, err_size);
  return encode_result(s, module, &result, w, err, err_size);
}

/* ---- The time evaluator ------------------------------------------------------------------------ */

static int time_evaluator(rpc_session *s, const rpc_value *args, int32_t n, rpc_writer *w, char *err, size_t err_size) {
  if (n != 12) return error(err, err_size, "runtime.RPCTimeEvaluator takes 12 arguments (TVM 0.27's client)");
  rpc_entry *m = module_arg(s, &args[0]);
  if (!m) return error(err, err_size, "time_evaluator of a global function is not supported: time a module's function");
  if (!is_string(&args[1]) || !is_string(&args[11])) return error(err, err_size, "time_evaluator: malformed arguments");
  for (int i = 2; i <= 10; i++)
    if (args[i].type != kTVMFFIInt) return error(err, err_size, "time_evaluator: malformed arguments");
  int32_t function = find_function(m, &args[1]);
  if (function < 0) {
    char name[RPC_MAX_NAME + 1];
    snprintf(name, sizeof name, "%.*s", (int)(args[1].v.bytes.len > RPC_MAX_NAME ? RPC_MAX_NAME : args[1].v.bytes.len),
             (const char *)args[1].v.bytes.data);
    return error(err, err_size, "time_evaluator: the module has no function '%s'", name);
  }
  if (args[2].v.i != kDLCPU) return error(err, err_size, "time_evaluator: this server has only the CPU");
  if (args[11].v.bytes.len != 0)
    return error(err, err_size, "time_evaluator: f_preproc is not supported by relaxc's server");
  rpc_timer t = {function, args[4].v.i, args[5].v.i, args[6].v.i, args[7].v.i, args[8].v.i, args[9].v.i, args[10].v.i};
  if (t.number < 1 || t.repeat < 1 || t.repeat > 1000000 || t.min_repeat_ms < 0 || t.limit_zero_time_iterations < 0 ||
      t.cooldown_interval_ms < 0 || (t.cooldown_interval_ms > 0 && t.repeats_to_cooldown < 1) ||
      t.cache_flush_bytes < 0 || t.cache_flush_bytes > (1ll << 32))
    return error(err, err_size,
                 "time_evaluator: number and repeat must be at least 1 (repeat at most 10^6), the others not negative, "
                 "repeats_to_cooldown at least 1 with a cooldown, and cache_flush_bytes at most 4 GiB");
  rpc_entry *e;
  uint64_t handle = rpc_entry_new(s, RPC_ENTRY_TIMER, rpc_entry_index(s, m), &e);
  if (!handle) return error(err, err_size, "too many live handles in this session");
  e->u.timer = t;
  return reply_with_handle(w, kTVMFFIFunction, handle);
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* TVM's timer (src/runtime/timer.cc), with one difference: each call's result is released
 * before the next call, so functions that return tensors can be timed (§12). */
static int run_timer(rpc_session *s, rpc_entry *e, const rpc_value *args, int32_t n, rpc_writer *w, char *err,
                     size_t err_size) {
  int32_t module = e->module;
  rpc_timer *t = &e->u.timer;
  rpc_entry *m = &s->entries[module];
  const rvm_api *api = m->u.module.api;
  call_args a;
  if (convert_args(s, module, args, n, &a, err, err_size) != 0) return -1;
  double *speeds = calloc((size_t)t->repeat, sizeof(double));
  uint8_t *flush = t->cache_flush_bytes > 0 ? malloc(2 * (size_t)t->cache_flush_bytes) : NULL;
  int rc = -1;
  rvm_value result;
  if (!speeds || (t->cache_flush_bytes > 0 && !flush)) {
    error(err, err_size, "out of memory for the time evaluator");
    goto done;
  }
  if (flush) memset(flush, 1, 2 * (size_t)t->cache_flush_bytes);
  if (invoke(m, NULL, t->function, &a, n, &result) != 0) goto failed; /* warm-up */
  api->value_release(&result);
  for (int64_t i = 0; i < t->repeat; i++) {
    double duration_ms = 0.0;
    int64_t zero_times = 0;
    do {
      if (duration_ms > 0.0) {
        double grown = (double)t->min_repeat_ms / (duration_ms / (double)t->number) + 1;
        if (grown < (double)t->number * 1.618) grown = (double)t->number * 1.618;
        t->number = grown > 1e12 ? (int64_t)1e12 : (int64_t)grown;
      }
      if (flush) memcpy(flush, flush + t->cache_flush_bytes, (size_t)t->cache_flush_bytes);
      int64_t start = now_ns();
      for (int64_t j = 0; j < t->number; j++) {
        if (invoke(m, NULL, t->function, &a, n, &result) != 0) goto failed;
        api->value_release(&result);
      }
      int64_t elapsed = now_ns() - start;
      if (elapsed == 0) zero_times++;
      duration_ms = (double)elapsed / 1e6;
    } while (duration_ms < (double)t->min_repeat_ms && zero_times < t->limit_zero_time_iterations);
    speeds[i] = duration_ms / 1e3 / (double)t->number;
    if (t->cooldown_interval_ms > 0 && i % t->repeats_to_cooldown == 0) {
      struct timespec pause = {t->cooldown_interval_ms / 1000, (t->cooldown_interval_ms % 1000) * 1000000};
      nanosleep(&pause, NULL);
    }
  }
  /* The blob is `repeat` native doubles: the client unpacks it with struct's "@d" (§6). */
  put_return_head(w, 2, kTVMFFIBytes);
  rpc_put_str(w, kTVMFFIByteArrayPtr, speeds, (uint64_t)t->repeat * sizeof(double));
  rpc_finish(w);
  rc = 0;
  goto done;
failed:
  model_error(api, err, err_size);
done:
  free(speeds);
  free(flush);
  free_args(&a);
  return rc;
}

/* ---- Tuples ------------------------------------------------------------------------------------ */

/* ffi.ArraySize and ffi.ArrayGetItem on a tuple result; on a Shape result they read its dims
 * (relaxc's addition: TVM's client has no other way to read a remote shape). */
static int array_access(rpc_session *s, rpc_builtin which, const rpc_value *args, int32_t n, rpc_writer *w, char *err,
                        size_t err_size) {
  rpc_entry *e = n >= 1 && args[0].type == RPC_TYPE_OBJECT_REF ? rpc_entry_get(s, args[0].v.handle) : NULL;
  if (!e || e->kind != RPC_ENTRY_VALUE) return error(err, err_size, "ffi.Array functions take a tuple result");
  int32_t module = e->module;
  const rvm_api *api = s->entries[module].u.module.api;
  const int64_t *dims = NULL;
  int64_t size = api->tuple_size(&e->u.value);
  if (size < 0 && api->shape_view(&e->u.value, &dims, &size) != 0)
    return error(err, err_size, "ffi.Array functions take a tuple or a shape, not a %s", api->value_type_name(&e->u.value));
  if (which == RPC_FN_ARRAY_SIZE) {
    if (n != 1) return error(err, err_size, "ffi.ArraySize takes one argument");
    put_return_head(w, 2, kTVMFFIInt);
    rpc_put_int(w, kTVMFFIInt, size);
    rpc_finish(w);
    return 0;
  }
  if (n != 2 || args[1].type != kTVMFFIInt) return error(err, err_size, "ffi.ArrayGetItem takes a tuple and an index");
  int64_t i = args[1].v.i;
  if (i < 0 || i >= size) {
    snprintf(err, err_size, "IndexError: index %lld out of range for a sequence of %lld", (long long)i, (long long)size);
    return -1;
  }
  if (dims) {
    put_return_head(w, 2, kTVMFFIInt);
    rpc_put_int(w, kTVMFFIInt, dims[i]);
    rpc_finish(w);
    return 0;
  }
  rvm_value item, owned = {0};
  if (api->tuple_get(&e->u.value, i, &item) != 0) return model_error(api, err, err_size);
  api->value_retain(&item, &owned);
  return encode_result(s, module, &owned, w, err, err_size);
}

/* ---- Dispatch ---------------------------------------------------------------------------------- */

static int upload(rpc_session *s, const rpc_value *args, int32_t n, rpc_writer *w, char *err, size_t err_size) {
  if (n != 2 || !is_string(&args[0]) || (args[1].type != kTVMFFIBytes && args[1].type != kTVMFFIByteArrayPtr))
    return error(err, err_size, "upload takes a file name and bytes");
  if (store(s, args[0].v.bytes.data, args[0].v.bytes.len, args[1].v.bytes.data, -1, args[1].v.bytes.len, err,
            err_size) != 0)
    return -1;
  put_return_head(w, 2, kTVMFFINone);
  rpc_put_none(w);
  rpc_finish(w);
  return 0;
}

int rpc_call(rpc_session *s, uint64_t handle, const rpc_value *args, int32_t num_args, rpc_writer *w, char *err,
             size_t err_size) {
  rpc_entry *e = rpc_entry_get(s, handle);
  if (!e) return error(err, err_size, "kCallFunc of an unknown function handle");
  switch (e->kind) {
    case RPC_ENTRY_BUILTIN:
      switch (e->u.builtin) {
        case RPC_FN_UPLOAD:
          return upload(s, args, num_args, w, err, err_size);
        case RPC_FN_LOAD_MODULE:
          return load_module(s, args, num_args, w, err, err_size);
        case RPC_FN_MODULE_GET_FUNCTION:
          return module_get_function(s, args, num_args, w, err, err_size);
        case RPC_FN_TIME_EVALUATOR:
          return time_evaluator(s, args, num_args, w, err, err_size);
        case RPC_FN_MAX_PACKET_SIZE:
          put_return_head(w, 2, kTVMFFIInt);
          rpc_put_int(w, kTVMFFIInt, (int64_t)s->limits.max_packet);
          rpc_finish(w);
          return 0;
        case RPC_FN_ARRAY_SIZE:
        case RPC_FN_ARRAY_GET_ITEM:
          return array_access(s, e->u.builtin, args, num_args, w, err, err_size);
        default:
          break;
      }
      break;
    case RPC_ENTRY_FUNCTION:
      return call_model(s, e, args, num_args, w, err, err_size);
    case RPC_ENTRY_VALUE:
      if (e->u.value.type_index == kTVMFFIFunction) return call_model(s, e, args, num_args, w, err, err_size);
      break;
    case RPC_ENTRY_TIMER:
      return run_timer(s, e, args, num_args, w, err, err_size);
    default:
      break;
  }
  return error(err, err_size, "kCallFunc of a handle that is not a function");
}
