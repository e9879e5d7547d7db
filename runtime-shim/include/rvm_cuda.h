/*
 * rvm_cuda.h: how relaxc launches CUDA kernels called from Relax (R.call_dps_packed), for the
 * authors of `.cu` kernels. Include nothing from here in device code; this header documents the
 * convention and declares the descriptor the runtime reads.
 *
 * Each kernel in a .cu file is declared `extern "C" __global__` and announced by one metadata
 * line just above it:
 *
 *   // relaxc-kernel: NAME launch=KIND inputs=I outputs=O
 *
 * The call's tensors (I inputs then O outputs, all float32, on the CUDA device) become device
 * pointers, in order, followed by the scalars the launch kind adds. Launch kinds:
 *
 *   elementwise  params (ptr x I+O, int64 n); n = element count of the first output;
 *                grid.x = ceil(n / 256), block.x = 256, no shared memory.
 *   matmul       params (a, b, out, int64 M, int64 N, int64 K); a is M x K, b is K x N;
 *                TILE = 16: grid = (ceil(N / TILE), ceil(M / TILE)), block = (TILE, TILE),
 *                dynamic shared memory = 2 * TILE * TILE * 4 bytes. inputs=2 outputs=1.
 *   rows         params (in, out, int64 rows, int64 cols); in is rows x cols, one block per row:
 *                grid.x = rows, block.x = 256, dynamic shared memory = 256 * 4 bytes.
 *                inputs=1 outputs=1.
 *
 * A kernel without metadata, with an unknown kind, or with counts the kind does not allow is a
 * build-time error naming it.
 */
#ifndef RVM_CUDA_H
#define RVM_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { RVM_CUDA_ELEMENTWISE = 0, RVM_CUDA_MATMUL = 1, RVM_CUDA_ROWS = 2 };
enum { RVM_CUDA_TILE = 16, RVM_CUDA_BLOCK = 256 };

/* One compiled image of a CUDA module: a CUBIN for one architecture, or PTX. */
typedef struct rvm_cuda_image {
  const uint8_t *data;
  uint64_t size;
  int32_t sm;      /* e.g. 80 for sm_80; for PTX the virtual architecture it targets */
  int32_t is_ptx;  /* 1: PTX text, JIT-compiled by the driver */
} rvm_cuda_image;

/* A kernel as emitted by relaxc: its module's images and its launch convention. */
typedef struct rvm_cuda_kernel {
  const char *name;
  const rvm_cuda_image *images;
  int64_t num_images;
  int32_t launch; /* RVM_CUDA_* */
  int32_t num_inputs;
  int32_t num_outputs;
  int32_t module_index; /* kernels of one .cu file share a module */
} rvm_cuda_kernel;

#ifndef __cplusplus
/* relaxc writes these tables byte by byte (src/abi/cuda.rs mirrors them; tests/artifact.rs
 * compares every field), so their layout is fixed. */
_Static_assert(sizeof(rvm_cuda_image) == 24, "rvm_cuda_image layout");
_Static_assert(offsetof(rvm_cuda_image, size) == 8, "rvm_cuda_image layout");
_Static_assert(offsetof(rvm_cuda_image, sm) == 16, "rvm_cuda_image layout");
_Static_assert(offsetof(rvm_cuda_image, is_ptx) == 20, "rvm_cuda_image layout");
_Static_assert(sizeof(rvm_cuda_kernel) == 40, "rvm_cuda_kernel layout");
_Static_assert(offsetof(rvm_cuda_kernel, images) == 8, "rvm_cuda_kernel layout");
_Static_assert(offsetof(rvm_cuda_kernel, num_images) == 16, "rvm_cuda_kernel layout");
_Static_assert(offsetof(rvm_cuda_kernel, launch) == 24, "rvm_cuda_kernel layout");
_Static_assert(offsetof(rvm_cuda_kernel, num_inputs) == 28, "rvm_cuda_kernel layout");
_Static_assert(offsetof(rvm_cuda_kernel, num_outputs) == 32, "rvm_cuda_kernel layout");
_Static_assert(offsetof(rvm_cuda_kernel, module_index) == 36, "rvm_cuda_kernel layout");
#endif

#ifdef __cplusplus
}
#endif
#endif /* RVM_CUDA_H */
