/*
 * floor.c: the floor under every runtime on the chain_N models: the chain's N kernel calls
 * (`add1` from the fixture's lib0.o, TVM's LLVM build) and nothing else, through the same
 * safe-call ABI the VM uses, on tensors and argument lists built once: no VM, no dispatch, no
 * allocation. Whatever a runtime spends above it is its overhead.
 *
 * The floor calls the kernel from one call site in a loop: the least code any runtime can run
 * the calls from. `straight` mode runs the same calls written out in a straight line, one call
 * site per operator (`floor_chain`, which benches/chain.rs generates for each N; each call is
 * `xor; mov; mov; mov; call; test; jne`), which is what an ahead-of-time translation of the
 * program must fetch and decode at the least: on chain_1000 it is about 10% above the loop
 * (Zen 5), and on chain_10000 its time moved by 10% from one process to the next.
 *
 * Every buffer, tensor and argument list sits in one static block laid out at build time, so
 * that no run depends on where the heap and the stack happened to land (the old floor kept them
 * on both, and its time moved between runs on Zen 4; that was never explained).
 *
 * usage: floor N CALLS ROUNDS [straight]
 * prints one line per round: "median_us <median microseconds per chain of N kernel calls>".
 * Built by benches/chain.rs against lib0.o, the generated calls and the runtime shim (for the
 * backend symbols TVM's kernels import).
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rvm_kernel.h"

int __tvm_ffi_add1(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result);

/* The generated straight line: the first call adds x to x into a, then each call adds x to
 * the previous result into the other buffer (into_b, into_a, into_b, ...), N calls in all.
 * Returns nonzero when a call failed. */
int floor_chain(const TVMFFIAny *first, const TVMFFIAny *into_b, const TVMFFIAny *into_a, TVMFFIAny *result);

/* The chain's number of operators, as generated into floor_chain. */
extern const long floor_chain_length;

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Everything the calls touch, in one place (64-byte aligned data, as TVM's kernels assume). */
static struct {
  _Alignas(64) float x[16];
  _Alignas(64) float a[16];
  _Alignas(64) float b[16];
  _Alignas(64) int64_t shape[1];
  DLTensor tx, ta, tb;
  _Alignas(64) TVMFFIAny first[3];
  TVMFFIAny into_b[3];
  TVMFFIAny into_a[3];
  TVMFFIAny result;
} chain;

/* A 1-element float32 tensor viewing `data`. */
static DLTensor tensor(float *data) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = chain.shape;
  return t;
}

static TVMFFIAny tensor_arg(DLTensor *t) {
  TVMFFIAny a;
  memset(&a, 0, sizeof a);
  a.type_index = kTVMFFIDLTensorPtr;
  a.v_ptr = t;
  return a;
}

/* The floor: the N calls from one call site in a loop. */
static int loop_chain(long n) {
  int rc = __tvm_ffi_add1(NULL, chain.first, 3, &chain.result);
  for (long i = 1; i < n && rc == 0; i++)
    rc = __tvm_ffi_add1(NULL, (i & 1) ? chain.into_b : chain.into_a, 3, &chain.result);
  return rc;
}

int main(int argc, char **argv) {
  if (argc != 4 && !(argc == 5 && strcmp(argv[4], "straight") == 0)) {
    fprintf(stderr, "usage: floor N CALLS ROUNDS [straight]\n");
    return 2;
  }
  long n = atol(argv[1]), calls = atol(argv[2]), rounds = atol(argv[3]);
  int straight = argc == 5;
  if (n < 1 || calls < 1 || rounds < 1) {
    fprintf(stderr, "floor: N, CALLS and ROUNDS must be positive\n");
    return 2;
  }
  if (straight && n != floor_chain_length) {
    fprintf(stderr, "floor: built for chain_%ld, asked for chain_%ld\n", floor_chain_length, n);
    return 2;
  }
  chain.shape[0] = 1;
  chain.x[0] = 0.5f;
  chain.tx = tensor(chain.x);
  chain.ta = tensor(chain.a);
  chain.tb = tensor(chain.b);
  TVMFFIAny x = tensor_arg(&chain.tx), a = tensor_arg(&chain.ta), b = tensor_arg(&chain.tb);
  chain.first[0] = x, chain.first[1] = x, chain.first[2] = a;
  chain.into_b[0] = a, chain.into_b[1] = x, chain.into_b[2] = b;
  chain.into_a[0] = b, chain.into_a[1] = x, chain.into_a[2] = a;
  double *times = malloc(sizeof(double) * (size_t)calls);
  if (!times) return 1;
  for (long r = 0; r < rounds; r++) {
    for (long c = 0; c < calls; c++) {
      double t0 = now_us();
      int rc = straight ? floor_chain(chain.first, chain.into_b, chain.into_a, &chain.result) : loop_chain(n);
      times[c] = now_us() - t0;
      if (rc != 0) {
        fprintf(stderr, "floor: the kernel failed\n");
        return 1;
      }
    }
    float last = (n & 1) ? chain.a[0] : chain.b[0];
    if (last != 0.5f * (float)(n + 1)) {
      fprintf(stderr, "floor: chain of %ld gave %g, expected %g\n", n, last, 0.5 * (double)(n + 1));
      return 1;
    }
    qsort(times, (size_t)calls, sizeof(double), compare_doubles);
    printf("median_us %.4f\n", times[calls / 2]);
  }
  free(times);
  return 0;
}
