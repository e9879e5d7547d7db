/*
 * floor.c: the floor under every runtime on the chain_N models: the chain's N kernel calls
 * (`add1` from the fixture's lib0.o, TVM's LLVM build) and nothing else, through the same
 * safe-call ABI the VM uses, on tensors and argument lists built once: no VM, no dispatch, no
 * allocation. Whatever a runtime spends above it is its overhead.
 *
 * benches/chain.rs builds this file into a shared library (with lib0.o, the generated straight
 * line and the runtime shim, for the backend symbols TVM's kernels import). lib0.o comes first,
 * after padding that puts `add1` at the page offset it has in the compiled model: where the
 * kernel lies moved chain_1000 by up to 15%, for either side. It loads the library into its
 * own process, where it times a block of chains here, then a block of chains of each runtime, in
 * turn. Timed in separate processes, seconds apart, the floor was no floor: on a 2-core VM the
 * same binary ran chain_1000 in 8 us in one process and 14 us in the next, as the host's other
 * work came and went, so compiled mode measured 0.76-1.20x of it. Side by side in blocks of a few
 * chains, every runtime sees the same machine, and the ratios stop moving with it.
 *
 * The floor calls the kernel from a loop of two call sites (the chain alternates between two
 * argument lists): the least code any runtime can run the calls from. Compiled mode matched or
 * beat the loop of one call site, which selects the list on each turn, on chain_1000 (Zen 3,
 * timed side by side), so that loop was no floor. `floor_straight` runs the same calls written
 * out in a straight line, one call site per operator (`floor_chain`, which benches/chain.rs
 * generates for each N; each call is `xor; mov; mov; mov; call; test; jne`), which is what an
 * ahead-of-time translation of the program fetches at the least. At 10000 call sites that is
 * 1.2-1.5x the loop on Zen 3, probably more calls than its branch target buffers hold (the VM
 * has no performance counters to show it).
 *
 * The arguments have the kinds the VM passes: x, the function's parameter, as a Tensor object
 * (the kernel takes another path through its argument checks for a DLTensor pointer), and the
 * chain's intermediate tensors as DLTensor pointers, as compiled mode builds them on its stack.
 */
#include <stdint.h>
#include <string.h>

#include "rvm_kernel.h"

#define FLOOR_EXPORT __attribute__((visibility("default")))

/* Hidden: the library calls the kernel directly, as a model does, not through a PLT entry. */
__attribute__((visibility("hidden"))) int __tvm_ffi_add1(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result);

/* The generated straight line: the first call adds x to x into a, then each call adds x to
 * the previous result into the other buffer (into_b, into_a, into_b, ...), N calls in all.
 * Returns nonzero when a call failed. */
int floor_chain(const TVMFFIAny *first, const TVMFFIAny *into_b, const TVMFFIAny *into_a, TVMFFIAny *result);

/* The chain's number of operators, as generated into floor_chain. */
extern const long floor_chain_length;

/* Everything the calls touch, in one place (64-byte aligned data, as TVM's kernels assume). */
static struct {
  _Alignas(64) float x[16];
  _Alignas(64) float a[16];
  _Alignas(64) float b[16];
  _Alignas(64) int64_t shape[1];
  struct {
    TVMFFIObject header;
    DLTensor tensor;
  } x_object; /* x as the VM holds a parameter: a Tensor object, its DLTensor after the header */
  DLTensor ta, tb;
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

/* Lays out the tensors and argument lists; returns the length of the generated straight line. */
FLOOR_EXPORT long floor_setup(void) {
  chain.shape[0] = 1;
  chain.x[0] = 0.5f;
  chain.x_object.header.combined_ref_count = 1;
  chain.x_object.header.type_index = kTVMFFITensor;
  chain.x_object.tensor = tensor(chain.x);
  chain.ta = tensor(chain.a);
  chain.tb = tensor(chain.b);
  TVMFFIAny x;
  memset(&x, 0, sizeof x);
  x.type_index = kTVMFFITensor;
  x.v_obj = &chain.x_object.header;
  TVMFFIAny a = tensor_arg(&chain.ta), b = tensor_arg(&chain.tb);
  chain.first[0] = x, chain.first[1] = x, chain.first[2] = a;
  chain.into_b[0] = a, chain.into_b[1] = x, chain.into_b[2] = b;
  chain.into_a[0] = b, chain.into_a[1] = x, chain.into_a[2] = a;
  return floor_chain_length;
}

/* The loop starts a 64-byte line, as compiled mode's rolled loops do (codegen/native/align.rs),
 * so that its two calls never straddle a line where compiled mode's do not: benches/chain.rs
 * builds this file with -falign-loops=64, and GCC, which takes the head of this rotated loop for
 * a jump target, also needs its jump alignment raised for this function. */
#if defined(__GNUC__) && !defined(__clang__)
#define FLOOR_LOOP_ALIGNED __attribute__((optimize("align-jumps=64")))
#else
#define FLOOR_LOOP_ALIGNED
#endif

/* The floor: the N calls from a loop of two call sites, one per argument list, so that each call
 * is set up as a straight line sets it up, with no select of its list. Returns nonzero when a
 * call failed. */
FLOOR_LOOP_ALIGNED FLOOR_EXPORT int floor_loop(long n) {
  if (__tvm_ffi_add1(NULL, chain.first, 3, &chain.result)) return 1;
  long i = 1;
  for (; i + 1 < n; i += 2) {
    if (__tvm_ffi_add1(NULL, chain.into_b, 3, &chain.result)) return 1;
    if (__tvm_ffi_add1(NULL, chain.into_a, 3, &chain.result)) return 1;
  }
  if (i < n && __tvm_ffi_add1(NULL, chain.into_b, 3, &chain.result)) return 1;
  return 0;
}

/* The same calls in a straight line (floor_setup's length of them). */
FLOOR_EXPORT int floor_straight(void) { return floor_chain(chain.first, chain.into_b, chain.into_a, &chain.result); }

/* The value the last chain of n calls left: 0.5 * (n + 1) when the calls did their work. */
FLOOR_EXPORT float floor_last(long n) { return (n & 1) ? chain.a[0] : chain.b[0]; }
