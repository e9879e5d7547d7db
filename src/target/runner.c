/*
 * runner.c: what `relaxc run` starts under qemu user mode for a model built for another CPU.
 * relaxc builds it for that CPU (src/target/shim.rs) and talks to it through two files in a
 * small binary format ("RVMVALS1"): the arguments in, the results (tuples flattened) out.
 * Reading .npz, comparing and printing stay in relaxc, on the host.
 *
 * usage: rvm-runner MODEL.so FUNCTION ARGS.bin RESULTS.bin BENCH_CALLS STATS(0/1)
 * FUNCTION "*" calls every function of the model with the same arguments and writes, for each,
 * a record of kind 7 (its name, as kind 6) followed by its results or a record of kind 8 (the
 * error: kind then message, each as a u32 length and bytes).
 * Exit status 0, or 3 after printing "relaxc-runner-error<TAB>kind<TAB>message" for a failed
 * call, or 2 for a runner problem (with its message).
 *
 * Value records: u32 kind (0 None, 1 Int, 2 Bool, 3 Float, 4 Tensor, 5 Shape, 6 other by
 * type name); Int/Bool i64; Float f64; Tensor u8 code, u8 bits, u16 lanes, u32 ndim, i64
 * dims[ndim], u64 nbytes, bytes; Shape u32 n, i64 dims[n]; other u32 length, name bytes.
 * All little-endian, as every target relaxc builds for is.
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rvm.h"

static const rvm_api *api;

static int die(const char *what, const char *detail) {
  fprintf(stderr, "rvm-runner: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  exit(2);
}

static void *take(FILE *f, size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p || (n && fread(p, 1, n, f) != n)) die("truncated argument file", NULL);
  return p;
}

static uint64_t take_u(FILE *f, size_t width) {
  uint64_t v = 0;
  if (fread(&v, 1, width, f) != width) die("truncated argument file", NULL);
  return v;
}

typedef struct {
  DLTensor t;
  int64_t *dims;
  void *data;
} host_tensor;

static void put(FILE *f, const void *p, size_t n) {
  if (n && fwrite(p, 1, n, f) != n) die("cannot write the results", NULL);
}

static void put_u(FILE *f, uint64_t v, size_t width) { put(f, &v, width); }

static void write_value(FILE *f, const rvm_value *v, uint32_t *count) {
  if (v->type_index == kTVMFFIArray) {
    for (int64_t i = 0, n = api->tuple_size(v); i < n; i++) {
      rvm_value item;
      api->tuple_get(v, i, &item);
      write_value(f, &item, count);
    }
    return;
  }
  (*count)++;
  const DLTensor *t = api->tensor_view(v);
  const int64_t *dims;
  int64_t n;
  if (t) {
    put_u(f, 4, 4);
    put(f, &t->dtype, 4);
    put_u(f, (uint32_t)t->ndim, 4);
    uint64_t elems = 1;
    for (int32_t i = 0; i < t->ndim; i++) {
      put(f, &t->shape[i], 8);
      elems *= (uint64_t)t->shape[i];
    }
    uint64_t nbytes = (elems * t->dtype.bits * t->dtype.lanes + 7) / 8;
    put_u(f, nbytes, 8);
    put(f, (const char *)t->data + t->byte_offset, nbytes);
  } else if (api->shape_view(v, &dims, &n) == 0) {
    put_u(f, 5, 4);
    put_u(f, (uint32_t)n, 4);
    put(f, dims, 8 * (size_t)n);
  } else if (v->type_index == kTVMFFIInt || v->type_index == kTVMFFIBool) {
    put_u(f, v->type_index == kTVMFFIInt ? 1 : 2, 4);
    put(f, &v->v_int64, 8);
  } else if (v->type_index == kTVMFFIFloat) {
    put_u(f, 3, 4);
    put(f, &v->v_float64, 8);
  } else if (v->type_index == kTVMFFINone) {
    put_u(f, 0, 4);
  } else {
    const char *name = api->value_type_name(v);
    put_u(f, 6, 4);
    put_u(f, (uint32_t)strlen(name), 4);
    put(f, name, strlen(name));
  }
}

static int compare_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static void put_text(FILE *f, const char *s) {
  put_u(f, (uint32_t)strlen(s), 4);
  put(f, s, strlen(s));
}

/* Every function with the same arguments: (name, results or error) each. */
static int call_all(rvm_module *m, rvm_vm *vm, const rvm_value *args, uint32_t n, const char *path) {
  FILE *out = fopen(path, "wb");
  if (!out) return die("cannot write the results", path);
  put(out, "RVMVALS1", 8);
  long count_at = ftell(out);
  uint32_t count = 0;
  put_u(out, 0, 4);
  for (int32_t f = 0; api->function_name(m, f); f++) {
    put_u(out, 7, 4);
    put_text(out, api->function_name(m, f));
    count++;
    rvm_value r = {0};
    if (api->vm_call(vm, f, args, (int32_t)n, &r)) {
      put_u(out, 8, 4);
      put_text(out, api->last_error_kind());
      put_text(out, api->last_error());
      count++;
      continue;
    }
    write_value(out, &r, &count);
    api->value_release(&r);
  }
  fseek(out, count_at, SEEK_SET);
  put_u(out, count, 4);
  fclose(out);
  return 0;
}

static int call_failed(void) {
  fprintf(stderr, "relaxc-runner-error\t%s\t%s\n", api->last_error_kind(), api->last_error());
  return 3;
}

int main(int argc, char **argv) {
  if (argc != 7) return die("usage: rvm-runner MODEL.so FUNCTION ARGS.bin RESULTS.bin BENCH_CALLS STATS", NULL);
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) return die("cannot load the model", dlerror());
  rvm_get_api_fn get = (rvm_get_api_fn)dlsym(lib, "rvm_get_api");
  if (!get || !(api = get(RVM_ABI_VERSION))) return die("not a relaxc model of this version", argv[1]);
  rvm_module *m;
  rvm_vm *vm;
  int32_t f;
  if (api->module_open(&m) || api->vm_create(m, &vm)) return call_failed();
  bool all = strcmp(argv[2], "*") == 0;
  if (!all && api->function_find(m, argv[2], &f)) return call_failed();
  FILE *in = fopen(argv[3], "rb");
  if (!in) return die("cannot open the arguments", argv[3]);
  char magic[8];
  if (fread(magic, 1, 8, in) != 8 || memcmp(magic, "RVMVALS1", 8)) return die("not an argument file", argv[3]);
  uint32_t n = (uint32_t)take_u(in, 4);
  rvm_value *args = calloc(n ? n : 1, sizeof(rvm_value));
  host_tensor *tensors = calloc(n ? n : 1, sizeof(host_tensor));
  for (uint32_t i = 0; i < n; i++) {
    uint32_t kind = (uint32_t)take_u(in, 4);
    if (kind == 1 || kind == 2) {
      args[i].type_index = kind == 1 ? kTVMFFIInt : kTVMFFIBool;
      args[i].v_int64 = (int64_t)take_u(in, 8);
    } else if (kind == 3) {
      args[i].type_index = kTVMFFIFloat;
      uint64_t bits = take_u(in, 8);
      memcpy(&args[i].v_float64, &bits, 8);
    } else if (kind == 4) {
      host_tensor *h = &tensors[i];
      uint32_t dtype = (uint32_t)take_u(in, 4);
      memcpy(&h->t.dtype, &dtype, 4);
      h->t.ndim = (int32_t)take_u(in, 4);
      h->dims = take(in, 8 * (size_t)h->t.ndim);
      uint64_t nbytes = take_u(in, 8);
      h->data = aligned_alloc(64, (nbytes + 63) / 64 * 64 + 64);
      if (!h->data || (nbytes && fread(h->data, 1, nbytes, in) != nbytes)) return die("truncated argument file", NULL);
      h->t.data = h->data;
      h->t.device.device_type = kDLCPU;
      h->t.shape = h->dims;
      args[i].type_index = kTVMFFIDLTensorPtr;
      args[i].v_ptr = &h->t;
    } else if (kind == 5) {
      uint32_t k = (uint32_t)take_u(in, 4);
      int64_t *dims = take(in, 8 * (size_t)k);
      if (api->shape_new(dims, k, &args[i])) return call_failed();
      free(dims);
    } else {
      return die("unknown value kind in the arguments", NULL);
    }
  }
  fclose(in);
  if (all) return call_all(m, vm, args, n, argv[4]);
  rvm_value result = {0};
  if (api->vm_call(vm, f, args, (int32_t)n, &result)) return call_failed();
  if (argv[6][0] == '1') {
    rvm_vm_stats s;
    api->vm_stats(vm, &s);
    printf("storage: peak %llu bytes held at once, %llu allocations (%llu from the pool)\n", (unsigned long long)s.peak_storage_bytes,
           (unsigned long long)s.storage_allocations, (unsigned long long)s.pool_hits);
  }
  FILE *out = fopen(argv[4], "wb");
  if (!out) return die("cannot write the results", argv[4]);
  put(out, "RVMVALS1", 8);
  long count_at = ftell(out);
  uint32_t count = 0;
  put_u(out, 0, 4);
  write_value(out, &result, &count);
  fseek(out, count_at, SEEK_SET);
  put_u(out, count, 4);
  fclose(out);
  api->value_release(&result);
  long calls = strtol(argv[5], NULL, 10);
  if (calls > 0) {
    double *times = malloc(sizeof(double) * (size_t)calls);
    rvm_value r = {0};
    if (api->vm_call(vm, f, args, (int32_t)n, &r)) return call_failed(); /* warm-up */
    api->value_release(&r);
    for (long k = 0; k < calls; k++) {
      double t = now_us();
      if (api->vm_call(vm, f, args, (int32_t)n, &r)) return call_failed();
      times[k] = now_us() - t;
      api->value_release(&r);
    }
    qsort(times, (size_t)calls, sizeof(double), compare_double);
    printf("%s: median %.3f us per call over %ld calls (under qemu)\n", argv[2], times[calls / 2], calls);
    free(times);
  }
  for (uint32_t i = 0; i < n; i++) {
    if (args[i].type_index == kTVMFFIShape) api->value_release(&args[i]);
    free(tensors[i].dims);
    free(tensors[i].data);
  }
  free(args);
  free(tensors);
  api->vm_destroy(vm);
  api->module_close(m);
  return 0;
}
