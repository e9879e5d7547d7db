/*
 * fake_libcuda.c: a test double of the CUDA driver API, so CUDA models run their launch
 * plumbing on machines without a GPU. "Device memory" is host memory; kernels are not run. Every
 * call is appended to $FAKE_CUDA_LOG, one line each, with buffers named by allocation order
 * (buf1, buf2, ...) so tests can check which tensor went where.
 *   FAKE_CUDA_SM=NN      compute capability of the device (default 80)
 *   FAKE_CUDA_DEVICES=N  number of devices (default 1)
 *   FAKE_CUDA_FAIL=name  that entry point fails (cuLaunchKernel: CUDA_ERROR_LAUNCH_FAILED,
 *                        cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY, else CUDA_ERROR_UNKNOWN)
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
enum { OK = 0, OUT_OF_MEMORY = 2, INVALID_VALUE = 1, NO_DEVICE = 100, LAUNCH_FAILED = 719, UNKNOWN = 999 };

static void logf_(const char *fmt, ...) {
  const char *path = getenv("FAKE_CUDA_LOG");
  if (!path) return;
  FILE *f = fopen(path, "a");
  if (!f) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(f, fmt, ap);
  va_end(ap);
  fputc('\n', f);
  fclose(f);
}

static int fails(const char *name) {
  const char *f = getenv("FAKE_CUDA_FAIL");
  return f && strcmp(f, name) == 0;
}

typedef struct {
  void *ptr;
  size_t size;
  int id;
  int live;
} buffer;
static buffer buffers[4096];
static int num_buffers;

static const char *name_of(uint64_t p, char *out, size_t cap) {
  for (int i = 0; i < num_buffers; i++) {
    char *base = buffers[i].ptr;
    if (buffers[i].live && (char *)(uintptr_t)p >= base && (char *)(uintptr_t)p < base + (buffers[i].size ? buffers[i].size : 1)) {
      snprintf(out, cap, "buf%d+%td", buffers[i].id, (char *)(uintptr_t)p - base);
      return out;
    }
  }
  snprintf(out, cap, "%llu", (unsigned long long)p);
  return out;
}

typedef struct {
  char name[128];
  int num_params;
} function;
typedef struct {
  int is_ptx;
  const char *ptx;
} module;

EXPORT CUresult cuInit(unsigned flags) {
  logf_("cuInit %u", flags);
  return fails("cuInit") ? UNKNOWN : OK;
}

EXPORT CUresult cuDeviceGetCount(int *n) {
  const char *d = getenv("FAKE_CUDA_DEVICES");
  *n = d ? atoi(d) : 1;
  logf_("cuDeviceGetCount -> %d", *n);
  return OK;
}

EXPORT CUresult cuDeviceGet(int *dev, int ordinal) {
  *dev = ordinal;
  logf_("cuDeviceGet %d", ordinal);
  return OK;
}

EXPORT CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
  const char *sm = getenv("FAKE_CUDA_SM");
  int cc = sm ? atoi(sm) : 80;
  (void)dev;
  *v = attr == 75 ? cc / 10 : attr == 76 ? cc % 10 : 0;
  return OK;
}

static int ctx_marker;
EXPORT CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) {
  *ctx = &ctx_marker;
  logf_("cuDevicePrimaryCtxRetain %d", dev);
  return OK;
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(int dev) {
  logf_("cuDevicePrimaryCtxRelease %d", dev);
  return OK;
}
EXPORT CUresult cuCtxSetCurrent(void *ctx) {
  (void)ctx;
  return OK;
}
EXPORT CUresult cuCtxSynchronize(void) {
  logf_("cuCtxSynchronize");
  return fails("cuCtxSynchronize") ? UNKNOWN : OK;
}

EXPORT CUresult cuModuleLoadData(void **out, const void *image) {
  if (fails("cuModuleLoadData")) return UNKNOWN;
  module *m = calloc(1, sizeof *m);
  m->is_ptx = memcmp(image, "\x7f" "ELF", 4) != 0;
  m->ptx = m->is_ptx ? image : NULL;
  logf_("cuModuleLoadData %s", m->is_ptx ? "ptx" : "cubin");
  *out = m;
  return OK;
}

EXPORT CUresult cuModuleUnload(void *m) {
  logf_("cuModuleUnload");
  free(m);
  return OK;
}

EXPORT CUresult cuModuleGetFunction(void **out, void *mod, const char *name) {
  module *m = mod;
  function *f = calloc(1, sizeof *f);
  snprintf(f->name, sizeof f->name, "%s", name);
  f->num_params = -1;
  if (m->is_ptx) {
    /* Count the .param declarations of `.entry name(`. */
    char entry[160];
    snprintf(entry, sizeof entry, ".entry %s(", name);
    const char *at = strstr(m->ptx, entry);
    if (!at) {
      free(f);
      return 500; /* CUDA_ERROR_NOT_FOUND */
    }
    const char *end = strchr(at, ')');
    f->num_params = 0;
    for (const char *p = at; p && p < end && (p = strstr(p, ".param")) && p < end; p += 6) f->num_params++;
  }
  logf_("cuModuleGetFunction %s params=%d", name, f->num_params);
  *out = f;
  return OK;
}

EXPORT CUresult cuMemAlloc_v2(uint64_t *out, size_t size) {
  if (fails("cuMemAlloc_v2")) return OUT_OF_MEMORY;
  void *p = malloc(size ? size : 1);
  buffers[num_buffers] = (buffer){p, size, num_buffers + 1, 1};
  logf_("cuMemAlloc %zu -> buf%d", size, num_buffers + 1);
  num_buffers++;
  *out = (uint64_t)(uintptr_t)p;
  return OK;
}

EXPORT CUresult cuMemFree_v2(uint64_t p) {
  for (int i = 0; i < num_buffers; i++) {
    if (buffers[i].live && (uintptr_t)buffers[i].ptr == p) {
      buffers[i].live = 0;
      free(buffers[i].ptr);
      logf_("cuMemFree buf%d", buffers[i].id);
      return OK;
    }
  }
  logf_("cuMemFree of an unknown pointer");
  return INVALID_VALUE;
}

EXPORT CUresult cuMemcpyHtoD_v2(uint64_t dst, const void *src, size_t n) {
  char name[64];
  logf_("cuMemcpyHtoD %s %zu", name_of(dst, name, sizeof name), n);
  memcpy((void *)(uintptr_t)dst, src, n);
  return OK;
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dst, uint64_t src, size_t n) {
  char name[64];
  logf_("cuMemcpyDtoH %s %zu", name_of(src, name, sizeof name), n);
  memcpy(dst, (void *)(uintptr_t)src, n);
  return OK;
}

EXPORT CUresult cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                               unsigned shared, void *stream, void **params, void **extra) {
  function *f = fn;
  (void)stream, (void)extra;
  char line[1024], name[64];
  int at = snprintf(line, sizeof line, "cuLaunchKernel %s grid=%u,%u,%u block=%u,%u,%u shared=%u params=", f->name, gx, gy,
                    gz, bx, by, bz, shared);
  for (int i = 0; i < f->num_params && at < (int)sizeof line - 64; i++)
    at += snprintf(line + at, sizeof line - at, "%s%s", i ? "," : "", name_of(*(uint64_t *)params[i], name, sizeof name));
  logf_("%s", line);
  return fails("cuLaunchKernel") ? LAUNCH_FAILED : OK;
}

EXPORT CUresult cuGetErrorName(CUresult rc, const char **out) {
  *out = rc == LAUNCH_FAILED   ? "CUDA_ERROR_LAUNCH_FAILED"
         : rc == OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY"
         : rc == NO_DEVICE     ? "CUDA_ERROR_NO_DEVICE"
                               : "CUDA_ERROR_UNKNOWN";
  return OK;
}

EXPORT CUresult cuGetErrorString(CUresult rc, const char **out) {
  *out = rc == LAUNCH_FAILED ? "unspecified launch failure" : rc == OUT_OF_MEMORY ? "out of memory" : "unknown error";
  return OK;
}
