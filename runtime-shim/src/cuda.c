/*
 * cuda.c: CUDA through the driver API, loaded with dlopen("libcuda.so.1") the first time a VM is
 * created on a CUDA device ($RELAXC_LIBCUDA overrides the library, which is how the tests use a
 * fake driver). A model without CUDA kernels never touches any of this, and no model links
 * against CUDA. Kernels are launched by the convention of rvm_cuda.h; device storage comes from
 * a small pool per VM; every driver error becomes a message naming the kernel or the operation.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "rvm_cuda.h"

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef uint64_t CUdeviceptr;

enum { CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76 };

static struct {
  pthread_once_t once;
  void *lib;
  char error[512];
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDeviceGetCount)(int *);
  CUresult (*cuDeviceGet)(CUdevice *, int);
  CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxSynchronize)(void);
  CUresult (*cuModuleLoadData)(CUmodule *, const void *);
  CUresult (*cuModuleUnload)(CUmodule);
  CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
  CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
  CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                             void **, void **);
  CUresult (*cuGetErrorName)(CUresult, const char **);
  CUresult (*cuGetErrorString)(CUresult, const char **);
} drv = {.once = PTHREAD_ONCE_INIT};

static void load_driver(void) {
  const char *path = getenv("RELAXC_LIBCUDA");
  if (!path || !*path) path = "libcuda.so.1";
  drv.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!drv.lib) {
    snprintf(drv.error, sizeof drv.error, "cannot load the CUDA driver %s (%s): no GPU driver on this machine?", path,
             dlerror());
    return;
  }
#define LOAD(field, name)                                                                          \
  do {                                                                                             \
    *(void **)&drv.field = dlsym(drv.lib, name);                                                   \
    if (!drv.field) {                                                                              \
      snprintf(drv.error, sizeof drv.error, "the CUDA driver %s has no %s", path, name);           \
      return;                                                                                      \
    }                                                                                              \
  } while (0)
  LOAD(cuInit, "cuInit");
  LOAD(cuDeviceGetCount, "cuDeviceGetCount");
  LOAD(cuDeviceGet, "cuDeviceGet");
  LOAD(cuDeviceGetAttribute, "cuDeviceGetAttribute");
  LOAD(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  LOAD(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
  LOAD(cuCtxSetCurrent, "cuCtxSetCurrent");
  LOAD(cuCtxSynchronize, "cuCtxSynchronize");
  LOAD(cuModuleLoadData, "cuModuleLoadData");
  LOAD(cuModuleUnload, "cuModuleUnload");
  LOAD(cuModuleGetFunction, "cuModuleGetFunction");
  LOAD(cuMemAlloc, "cuMemAlloc_v2");
  LOAD(cuMemFree, "cuMemFree_v2");
  LOAD(cuMemcpyHtoD, "cuMemcpyHtoD_v2");
  LOAD(cuMemcpyDtoH, "cuMemcpyDtoH_v2");
  LOAD(cuLaunchKernel, "cuLaunchKernel");
  LOAD(cuGetErrorName, "cuGetErrorName");
  LOAD(cuGetErrorString, "cuGetErrorString");
#undef LOAD
  CUresult rc = drv.cuInit(0);
  if (rc != 0) snprintf(drv.error, sizeof drv.error, "cuInit failed with CUDA error %d", rc);
}

/* Raises "<what>: <CUDA_ERROR_NAME> (<description>)" for a failed driver call; returns -1. */
static int driver_error(CUresult rc, const char *what) {
  const char *name = "CUDA_ERROR_UNKNOWN", *text = "unknown error";
  if (drv.cuGetErrorName) drv.cuGetErrorName(rc, &name);
  if (drv.cuGetErrorString) drv.cuGetErrorString(rc, &text);
  return rvm_raise("RuntimeError", "%s: %s (%s)", what, name ? name : "?", text ? text : "?");
}

/* Per-VM CUDA state; device storages hold references, so it outlives the VM if they do. */
struct rvm_cuda {
  atomic_long refs;
  CUdevice device;
  int device_id;
  int sm;
  CUcontext ctx;
  int64_t num_modules;
  CUmodule *modules;
  CUfunction *functions; /* per kernel of the program */
  /* Freed device buffers kept for reuse: exact sizes, a small list. */
  struct {
    CUdeviceptr ptr;
    uint64_t size;
  } pool[64];
  int pooled;
  uint64_t live_bytes;
};

int rvm_cuda_open(int device_id, const rvm_cuda_kernel *kernels, int64_t num_kernels, rvm_cuda **out) {
  pthread_once(&drv.once, load_driver);
  if (drv.error[0]) return rvm_raise("RuntimeError", "%s", drv.error);
  int count = 0;
  CUresult rc = drv.cuDeviceGetCount(&count);
  if (rc != 0) return driver_error(rc, "cuDeviceGetCount");
  if (device_id < 0 || device_id >= count)
    return rvm_raise("ValueError", "CUDA device %d requested, but the machine has %d", device_id, count);
  rvm_cuda *c = calloc(1, sizeof *c);
  if (!c) return rvm_raise("MemoryError", "out of memory");
  atomic_init(&c->refs, 1);
  c->device_id = device_id;
  int major = 0, minor = 0;
  if ((rc = drv.cuDeviceGet(&c->device, device_id)) != 0 ||
      (rc = drv.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, c->device)) != 0 ||
      (rc = drv.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, c->device)) != 0 ||
      (rc = drv.cuDevicePrimaryCtxRetain(&c->ctx, c->device)) != 0) {
    free(c);
    return driver_error(rc, "opening the CUDA device");
  }
  c->sm = major * 10 + minor;
  for (int64_t i = 0; i < num_kernels; i++)
    if (kernels[i].module_index + 1 > c->num_modules) c->num_modules = kernels[i].module_index + 1;
  c->modules = calloc((size_t)c->num_modules + 1, sizeof(CUmodule));
  c->functions = calloc((size_t)num_kernels + 1, sizeof(CUfunction));
  if (!c->modules || !c->functions) {
    rvm_cuda_close(c);
    return rvm_raise("MemoryError", "out of memory");
  }
  *out = c;
  return 0;
}

void rvm_cuda_retain(rvm_cuda *c) { atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed); }

void rvm_cuda_close(rvm_cuda *c) {
  if (!c || atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) != 1) return;
  drv.cuCtxSetCurrent(c->ctx);
  for (int i = 0; i < c->pooled; i++) drv.cuMemFree(c->pool[i].ptr);
  for (int64_t i = 0; i < c->num_modules; i++)
    if (c->modules && c->modules[i]) drv.cuModuleUnload(c->modules[i]);
  drv.cuDevicePrimaryCtxRelease(c->device);
  free(c->modules);
  free(c->functions);
  free(c);
}

int rvm_cuda_device_id(const rvm_cuda *c) { return c->device_id; }

void *rvm_cuda_alloc(rvm_cuda *c, uint64_t nbytes) {
  uint64_t size = nbytes ? (nbytes + 255) & ~(uint64_t)255 : 256;
  for (int i = 0; i < c->pooled; i++) {
    if (c->pool[i].size == size) {
      CUdeviceptr p = c->pool[i].ptr;
      c->pool[i] = c->pool[--c->pooled];
      c->live_bytes += size;
      return (void *)(uintptr_t)p;
    }
  }
  drv.cuCtxSetCurrent(c->ctx);
  CUdeviceptr p = 0;
  CUresult rc = drv.cuMemAlloc(&p, size);
  if (rc != 0) {
    driver_error(rc, "cuMemAlloc of device storage");
    return NULL;
  }
  c->live_bytes += size;
  return (void *)(uintptr_t)p;
}

void rvm_cuda_free(rvm_cuda *c, void *ptr, uint64_t nbytes) {
  uint64_t size = nbytes ? (nbytes + 255) & ~(uint64_t)255 : 256;
  c->live_bytes -= size;
  if (c->pooled < (int)(sizeof c->pool / sizeof c->pool[0])) {
    c->pool[c->pooled].ptr = (CUdeviceptr)(uintptr_t)ptr;
    c->pool[c->pooled++].size = size;
    return;
  }
  drv.cuMemFree((CUdeviceptr)(uintptr_t)ptr);
}

int rvm_cuda_copy(rvm_cuda *c, void *dst, int dst_on_device, const void *src, int src_on_device, uint64_t nbytes) {
  if (nbytes == 0) return 0;
  drv.cuCtxSetCurrent(c->ctx);
  CUresult rc;
  if (dst_on_device && !src_on_device) {
    rc = drv.cuMemcpyHtoD((CUdeviceptr)(uintptr_t)dst, src, nbytes);
    if (rc != 0) return driver_error(rc, "copying to the CUDA device (cuMemcpyHtoD)");
  } else if (!dst_on_device && src_on_device) {
    rc = drv.cuMemcpyDtoH(dst, (CUdeviceptr)(uintptr_t)src, nbytes);
    if (rc != 0) return driver_error(rc, "copying from the CUDA device (cuMemcpyDtoH)");
  } else {
    return rvm_raise("ValueError", "unsupported CUDA copy direction");
  }
  return 0;
}

int rvm_cuda_synchronize(rvm_cuda *c) {
  drv.cuCtxSetCurrent(c->ctx);
  CUresult rc = drv.cuCtxSynchronize();
  return rc ? driver_error(rc, "cuCtxSynchronize") : 0;
}

/* The CUfunction of kernel k: its module is loaded on first use, from the CUBIN built for this
 * device's architecture if there is one, else from PTX (JIT-compiled by the driver). */
static int function_of(rvm_cuda *c, const rvm_cuda_kernel *kernels, int64_t k, CUfunction *out) {
  if (c->functions[k]) {
    *out = c->functions[k];
    return 0;
  }
  const rvm_cuda_kernel *kernel = &kernels[k];
  CUmodule *module = &c->modules[kernel->module_index];
  if (!*module) {
    const rvm_cuda_image *pick = NULL;
    for (int64_t i = 0; i < kernel->num_images; i++)
      if (!kernel->images[i].is_ptx && kernel->images[i].sm == c->sm) pick = &kernel->images[i];
    for (int64_t i = 0; !pick && i < kernel->num_images; i++)
      if (kernel->images[i].is_ptx && kernel->images[i].sm <= c->sm) pick = &kernel->images[i];
    if (!pick)
      return rvm_raise("RuntimeError", "kernel %s: no CUBIN for sm_%d and no PTX this device can run", kernel->name,
                       c->sm);
    drv.cuCtxSetCurrent(c->ctx);
    CUresult rc = drv.cuModuleLoadData(module, pick->data);
    if (rc != 0) {
      char what[256];
      snprintf(what, sizeof what, "kernel %s: cuModuleLoadData of its %s image", kernel->name, pick->is_ptx ? "PTX" : "CUBIN");
      return driver_error(rc, what);
    }
  }
  CUresult rc = drv.cuModuleGetFunction(&c->functions[k], *module, kernel->name);
  if (rc != 0) {
    char what[256];
    snprintf(what, sizeof what, "kernel %s: cuModuleGetFunction", kernel->name);
    return driver_error(rc, what);
  }
  *out = c->functions[k];
  return 0;
}

static DLTensor *device_tensor(const rvm_cuda *c, const rvm_cuda_kernel *k, const TVMFFIAny *args, int i) {
  DLTensor *t = rvm_as_dltensor(&args[i]);
  if (!t) {
    rvm_raise("TypeError", "kernel %s: argument %d must be a tensor, but got %s", k->name, i, rvm_type_name(&args[i]));
    return NULL;
  }
  if (t->device.device_type != kDLCUDA || t->device.device_id != c->device_id) {
    rvm_raise("ValueError", "kernel %s: argument %d is on device type %d, not on cuda:%d", k->name, i,
              t->device.device_type, c->device_id);
    return NULL;
  }
  if (t->dtype.code != kDLFloat || t->dtype.bits != 32 || t->dtype.lanes != 1) {
    rvm_raise("TypeError", "kernel %s: argument %d must be float32", k->name, i);
    return NULL;
  }
  return t;
}

int rvm_cuda_launch(rvm_vm *vm, const rvm_cuda_kernel *kernels, int64_t k, const TVMFFIAny *args, int32_t num_args) {
  rvm_cuda *c = vm ? vm->cuda : NULL;
  const rvm_cuda_kernel *kernel = &kernels[k];
  if (!c) return rvm_raise("RuntimeError", "kernel %s runs on CUDA, but this VM was not created on a CUDA device", kernel->name);
  int32_t tensors = kernel->num_inputs + kernel->num_outputs;
  if (num_args != tensors)
    return rvm_raise("TypeError", "kernel %s takes %d tensors (%d inputs, %d outputs), but got %d arguments", kernel->name,
                     tensors, kernel->num_inputs, kernel->num_outputs, num_args);
  enum { MAX_PARAMS = 32 };
  if (tensors + 3 > MAX_PARAMS) return rvm_raise("ValueError", "kernel %s has too many arguments", kernel->name);
  uint64_t values[MAX_PARAMS];
  void *params[MAX_PARAMS];
  DLTensor *t[MAX_PARAMS];
  for (int32_t i = 0; i < tensors; i++) {
    if (!(t[i] = device_tensor(c, kernel, args, i))) return -1;
    values[i] = (uint64_t)(uintptr_t)((char *)t[i]->data + t[i]->byte_offset);
  }
  int n = tensors;
  unsigned grid[3] = {1, 1, 1}, block[3] = {1, 1, 1}, shared = 0;
  switch (kernel->launch) {
    case RVM_CUDA_ELEMENTWISE: {
      int64_t count = rvm_tensor_nbytes(t[kernel->num_inputs]) / 4;
      for (int32_t i = 0; i < kernel->num_inputs; i++)
        if (rvm_tensor_nbytes(t[i]) / 4 != count)
          return rvm_raise("ValueError", "kernel %s: input %d has %lld elements, the output %lld", kernel->name, i,
                           (long long)(rvm_tensor_nbytes(t[i]) / 4), (long long)count);
      values[n++] = (uint64_t)count;
      grid[0] = (unsigned)((count + RVM_CUDA_BLOCK - 1) / RVM_CUDA_BLOCK);
      if (grid[0] == 0) grid[0] = 1;
      block[0] = RVM_CUDA_BLOCK;
      break;
    }
    case RVM_CUDA_MATMUL: {
      DLTensor *a = t[0], *b = t[1], *o = t[2];
      if (a->ndim != 2 || b->ndim != 2 || o->ndim != 2 || a->shape[1] != b->shape[0] || o->shape[0] != a->shape[0] ||
          o->shape[1] != b->shape[1])
        return rvm_raise("ValueError", "kernel %s: shapes do not fit (M, K) @ (K, N) -> (M, N)", kernel->name);
      int64_t M = a->shape[0], K = a->shape[1], N = b->shape[1];
      values[n++] = (uint64_t)M;
      values[n++] = (uint64_t)N;
      values[n++] = (uint64_t)K;
      grid[0] = (unsigned)((N + RVM_CUDA_TILE - 1) / RVM_CUDA_TILE);
      grid[1] = (unsigned)((M + RVM_CUDA_TILE - 1) / RVM_CUDA_TILE);
      block[0] = block[1] = RVM_CUDA_TILE;
      shared = 2 * RVM_CUDA_TILE * RVM_CUDA_TILE * 4;
      break;
    }
    case RVM_CUDA_ROWS: {
      DLTensor *in = t[0], *o = t[1];
      if (in->ndim != 2 || o->ndim != 1 || o->shape[0] != in->shape[0])
        return rvm_raise("ValueError", "kernel %s: expects in (rows, cols) and out (rows,)", kernel->name);
      values[n++] = (uint64_t)in->shape[0];
      values[n++] = (uint64_t)in->shape[1];
      grid[0] = (unsigned)in->shape[0];
      block[0] = RVM_CUDA_BLOCK;
      shared = RVM_CUDA_BLOCK * 4;
      break;
    }
    default:
      return rvm_raise("InternalError", "kernel %s: unknown launch kind %d", kernel->name, kernel->launch);
  }
  if (grid[0] == 0 || grid[1] == 0) return 0; /* nothing to compute */
  for (int i = 0; i < n; i++) params[i] = &values[i];
  CUfunction f = NULL;
  if (function_of(c, kernels, k, &f)) return -1;
  drv.cuCtxSetCurrent(c->ctx);
  CUresult rc = drv.cuLaunchKernel(f, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared, NULL, params, NULL);
  if (rc != 0) {
    char what[256];
    snprintf(what, sizeof what, "kernel %s: cuLaunchKernel", kernel->name);
    return driver_error(rc, what);
  }
  return 0;
}

static pthread_key_t current_vm_key;
static pthread_once_t current_vm_once = PTHREAD_ONCE_INIT;
static void make_current_vm_key(void) { pthread_key_create(&current_vm_key, NULL); }

rvm_vm *rvm_current_vm(void) {
  pthread_once(&current_vm_once, make_current_vm_key);
  return pthread_getspecific(current_vm_key);
}

rvm_vm *rvm_set_current_vm(rvm_vm *vm) {
  rvm_vm *previous = rvm_current_vm();
  pthread_setspecific(current_vm_key, vm);
  return previous;
}

int rvm_cuda_call(int64_t kernel, const TVMFFIAny *args, int32_t num_args) {
  if (&rvm_model_cuda == NULL) return rvm_raise("InternalError", "this model has no CUDA kernels");
  return rvm_cuda_launch(rvm_current_vm(), rvm_model_cuda.kernels, kernel, args, num_args);
}

static void cuda_storage_deleter(void *self, int flags) {
  rvm_storage *s = self;
  if (flags & 1) {
    rvm_cuda_free(s->cuda, s->data, s->nbytes);
    rvm_cuda_close(s->cuda);
  }
  if (flags & 2) free(s);
}

rvm_storage *rvm_storage_new_cuda(rvm_cuda *c, uint64_t nbytes) {
  rvm_storage *s = calloc(1, sizeof(*s));
  if (!s) {
    rvm_raise("MemoryError", "out of memory allocating a storage object");
    return NULL;
  }
  s->data = rvm_cuda_alloc(c, nbytes);
  if (!s->data) {
    free(s);
    return NULL;
  }
  rvm_object_init(&s->header, RVM_TYPE_STORAGE, cuda_storage_deleter);
  s->nbytes = nbytes;
  s->device.device_type = kDLCUDA;
  s->device.device_id = c->device_id;
  s->cuda = c;
  rvm_cuda_retain(c);
  return s;
}

int rvm_tensor_read(const DLTensor *t, rvm_cuda *c, void *dst, uint64_t nbytes) {
  const char *src = (const char *)t->data + t->byte_offset;
  if (t->device.device_type == kDLCPU) {
    memcpy(dst, src, nbytes);
    return 0;
  }
  if (t->device.device_type != kDLCUDA || !c) return rvm_raise("ValueError", "cannot read a tensor on device type %d here", t->device.device_type);
  return rvm_cuda_copy(c, dst, 0, src, 1, nbytes);
}
