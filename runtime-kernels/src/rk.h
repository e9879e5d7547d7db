/*
 * rk.h: what the kernel library's files share. The library sits beside the runtime shim: it uses
 * the shim (errors, the thread pool) and the shim never calls it; a model links one of its files
 * only when the model's program names one of the file's kernels (rvm_kernels.def).
 *
 * Every kernel gives the same bits at any thread count: work is split only between outputs,
 * never inside one output's reduction, and every reduction runs in an order fixed by the shapes
 * alone (never by the thread count, the pool's state or the alignment of a pointer).
 */
#ifndef RK_H
#define RK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal.h"

/* The kernels' entry points, one per row of rvm_kernels.def. */
#define RVM_BUILTIN(suffix, name, properties, doc) \
  RVM_HIDDEN int rvm_builtin_##suffix(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result);
#include "rvm_kernels.def"
#undef RVM_BUILTIN

/* ---- CPU features ------------------------------------------------------------------------- */

/* Which micro-kernels this CPU runs: x86-64 with AVX2 and FMA takes the AVX2 kernels; other
 * x86-64 CPUs, riscv64 and anything else the portable C ones; aarch64 always NEON. Decided once
 * per process, so one process gives the same bits for the same shapes every time. */
typedef enum { RK_ISA_GENERIC = 0, RK_ISA_AVX2 = 1, RK_ISA_NEON = 2 } rk_isa;
RVM_HIDDEN rk_isa rk_cpu_isa(void);

/* Whether the AVX2 path may use AVX-512F (the CPU has it and the OS saves its registers), for
 * kernels with the AVX2 kernels' bits on wider registers; RELAXC_GEMM_AVX512=0 says no, to
 * compare the two. Always false off x86-64. */
RVM_HIDDEN bool rk_use_avx512(void);

/* Functions compiled for AVX2 + FMA beside their portable twins; rk_cpu_isa() picks one. */
#if defined(__x86_64__)
#define RK_AVX2_TARGET __attribute__((target("avx2,fma")))
#define RK_AVX512_TARGET __attribute__((target("avx512f,avx2,fma")))
#endif

/* Whether the portable code's multiply-adds are fused: where the CPU has the instruction. */
#if defined(__FP_FAST_FMAF)
#define RK_PORTABLE_FUSED true
#else
#define RK_PORTABLE_FUSED false
#endif

/* A multiply-add for loops written once and compiled per instruction set: `fused` is a
 * constant in every instance, so this is one instruction or a multiply and an add, never a
 * call. The library is built with -ffp-contract=off, so nothing else is fused. */
static inline __attribute__((always_inline)) float rk_madd(bool fused, float a, float b, float c) {
  return fused ? __builtin_fmaf(a, b, c) : a * b + c;
}

/* Eight floats as one value: GCC's and clang's vector extension, lowered to whatever the target
 * has (one AVX2 register, two NEON registers, scalars). Loops written with it vectorize for
 * sure, where the auto-vectorizer may not. */
typedef float rk_f8 __attribute__((vector_size(32)));

/* The helpers below are always inlined, so how a 32-byte vector would be passed between functions
 * built without AVX (GCC's -Wpsabi note) never arises. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

static inline __attribute__((always_inline)) rk_f8 rk_f8_load(const float *p) {
  rk_f8 v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

/* A store, as a macro: a vector parameter would draw GCC's note on 32-byte argument passing. */
#define RK_F8_STORE(p, v)                         \
  do {                                            \
    rk_f8 rk_stored_ = (v);                       \
    __builtin_memcpy((p), &rk_stored_, sizeof rk_stored_); \
  } while (0)

/* ---- scratch memory ----------------------------------------------------------------------- */

/* A 64-byte aligned buffer of at least `nbytes` for the calling thread's kernel call (packing,
 * padded inputs), kept by the thread and reused by its next call; NULL when out of memory.
 * `slot` tells apart the buffers one call needs at once; a larger request for the same slot
 * replaces the buffer, so a slot's user must not hold an older pointer to it. */
typedef enum {
  RK_SLOT_A_PACK = 0,   /* the GEMM's packed block of A (every task's own thread) */
  RK_SLOT_B_PACK = 1,   /* B operands packed per call */
  RK_SLOT_B_INDEX = 2,  /* where each problem's packed B is */
  RK_SLOT_PROBLEMS = 3, /* a batch's list of GEMM problems */
  RK_SLOT_INPUT = 4,    /* a padded or rearranged copy of an input */
  RK_SLOT_B_BLOCK = 5,  /* the GEMM's block of B gathered by its packer (every task's own thread) */
  RK_SLOT_A_WHOLE = 6,  /* all of a GEMM's A packed once per call, shared by its tasks */
  RK_SLOT_OUTPUT = 7,   /* results in another layout before they are written out */
  RK_SCRATCH_SLOTS = 8
} rk_slot;
RVM_HIDDEN void *rk_scratch(rk_slot slot, size_t nbytes);

/* ---- parallel loops ----------------------------------------------------------------------- */

/* Runs body(task, num_tasks, ctx) for task = 0..num_tasks-1 on the runtime's pool, where
 * num_tasks <= max_tasks is what the pool can run now (1 when it is busy or the work is small).
 * Work is split by the body from (task, num_tasks), so the result must not depend on them. */
typedef int (*rk_task_fn)(int task, int num_tasks, void *ctx);
RVM_HIDDEN int rk_parallel(int64_t max_tasks, rk_task_fn body, void *ctx);
/* How many threads rk_parallel can use at most (the pool's size). */
RVM_HIDDEN int rk_max_threads(void);
/* The half-open range [begin, end) of `n` items that `task` of `num_tasks` takes. */
static inline void rk_split(int64_t n, int task, int num_tasks, int64_t *begin, int64_t *end) {
  *begin = n * task / num_tasks;
  *end = n * (task + 1) / num_tasks;
}

/* ---- GEMM --------------------------------------------------------------------------------- */

/* The register tile of every micro-kernel: MR rows of A by NR columns of B. Packed B (weights
 * prepacked by relaxc.tvm, or packed per call) is [ceil(N/NR)][K][NR], zero past N. */
enum { RK_MR = 6, RK_NR = 16, RK_KC = 256 };
/* The reduction is cut into blocks of this many steps (the last may be shorter): as few blocks
 * of at most RK_KC as k allows, of equal length, so no short block pays for a pass over C. It
 * depends on k alone, and with it every result's summation order. */
RVM_HIDDEN int64_t rk_kc(int64_t k);

/* Activations an epilogue applies last. */
typedef enum {
  RK_ACT_NONE = 0,
  RK_ACT_RELU = 1,
  RK_ACT_CLIP = 2, /* min(max(x, lo), hi): ReLU6 and friends */
  RK_ACT_GELU = 3, /* x * (1 + erf(x / sqrt 2)) / 2 */
  RK_ACT_GELU_TANH = 4,
  RK_ACT_SILU = 5,
  RK_ACT_SIGMOID = 6,
  RK_ACT_HARD_SIGMOID = 7, /* min(max(lo * x + hi, 0), 1): lo the slope, hi the offset (ONNX's alpha, beta) */
  RK_ACT_HARD_SWISH = 8,   /* x * hard_sigmoid(x), the same lo and hi */
  RK_ACT_COUNT
} rk_act;

/* What happens to each result c of the product: c = act(c * alpha + bias + residual). */
typedef struct rk_epilogue {
  float alpha;
  const float *bias;   /* NULL, or one per column (bias_per_row false) or per row */
  bool bias_per_row;
  const float *residual; /* NULL, or a matrix laid out like C (res_rs, res_cs) */
  int64_t res_rs, res_cs;
  rk_act act;
  float lo, hi; /* RK_ACT_CLIP */
} rk_epilogue;

/* Packs rows [m0, m0 + mr) and reduction steps [k0, k0 + kc) of A into dst[kc][RK_MR], rows past
 * mr zero. */
typedef void (*rk_pack_a_fn)(const void *a, int64_t m0, int64_t mr, int64_t k0, int64_t kc, float *dst);
/* Packs column panels [p0, p0 + panels) and reduction steps [k0, k0 + kc) of B into
 * dst[panels][kc][RK_NR], columns past n zero (a convolution's pixels, gathered per block). */
typedef void (*rk_pack_b_fn)(const void *b, int64_t p0, int64_t panels, int64_t k0, int64_t kc, float *dst);

/* A strided matrix (element (i, j) at data[i * rs + j * cs]). */
typedef struct rk_matrix {
  const float *data;
  int64_t rs, cs;
} rk_matrix;

/* One product C[m x n] = A[m x k] B[k x n] followed by the epilogue. A is prepacked
 * ([ceil(m/MR)][k][MR], weights relaxc.tvm packed) or read by its packer block by block. B is
 * prepacked ([ceil(n/NR)][k][NR]), gathered by its packer block by block, or a strided matrix
 * packed once per call. */
typedef struct rk_gemm {
  int64_t m, n, k;
  const float *a_packed;
  rk_pack_a_fn pack_a;
  const void *a; /* what pack_a reads: an rk_matrix for rk_pack_a_strided */
  bool a_gathered; /* pack_a gathers (a convolution's pixels): pack each row as few times as possible */
  const float *b_packed;
  rk_pack_b_fn pack_b;
  const void *b_source; /* what pack_b reads */
  rk_matrix b;
  /* Or B read in place, never packed: element (k, j) at b_in_place[b_rows[k] + j] (a
   * convolution's padded image, one offset per tap), read only for j < n (the last panel's loads
   * are masked); C's columns contiguous. */
  const float *b_in_place;
  const int64_t *b_rows;
  float *c;
  int64_t c_rs, c_cs;
  rk_epilogue ep;
  /* NULL, or called once rows [m0, m1) and columns [j0, j1) of C are final (epilogue applied),
   * on the thread that computed them, while they are still in its cache. */
  void (*finish)(const struct rk_gemm *g, int64_t m0, int64_t m1, int64_t j0, int64_t j1);
  const void *finish_ctx;
} rk_gemm;

RVM_HIDDEN void rk_pack_a_strided(const void *a, int64_t m0, int64_t mr, int64_t k0, int64_t kc, float *dst);
/* Packs columns [n0, n0 + NR * panels) of a strided B into [panels][k][NR] (zero past n). */
RVM_HIDDEN void rk_pack_b(const rk_matrix *b, int64_t k, int64_t n, int64_t n0, int64_t panels, float *dst);
/* Runs `count` products (a batch with the same shapes), splitting them over the pool. */
RVM_HIDDEN int rk_gemm_run(const rk_gemm *problems, int64_t count);
/* An epilogue that changes nothing. */
RVM_HIDDEN rk_epilogue rk_epilogue_none(void);

/* The micro-kernel: tile[r][j] = sum over k < kc of a[k][r] * b[k][j], in order of k, for
 * r < mr (a packed as [kc][RK_MR], b as [kc][RK_NR]). Rows past mr of the tile are undefined. */
typedef void (*rk_ukernel_fn)(int64_t kc, const float *a, const float *b, float *tile, int mr);
/* `streaming`: b comes from memory once (few rows), so it is prefetched further ahead. */
RVM_HIDDEN rk_ukernel_fn rk_ukernel(rk_isa isa, bool streaming);
/* One row against four panels (`stride` floats apart): tile[q][j] = sum over k < kc of
 * a[k * RK_MR] * b[q * stride + k * RK_NR + j], in order of k, as the 1-row micro-kernel sums. */
typedef void (*rk_gemv4_fn)(int64_t kc, const float *a, const float *b, int64_t stride, float *tile);
RVM_HIDDEN rk_gemv4_fn rk_gemv4(rk_isa isa);

/* What a micro-kernel that writes C itself does after its sums (the tile is full: RK_NR
 * contiguous columns): add C's values unless `first`; on `last`, scale, add the bias (per row
 * of the tile or per column) and the residual rows, and apply none, relu or clip, exactly as
 * store_tile would, so that which of the two writes a tile never changes a bit. */
typedef struct rk_tile_epilogue {
  bool first, last;
  float alpha, lo, hi;
  rk_act act;              /* one rk_kernel_activates: none, relu, clip, hard_sigmoid, hard_swish */
  const float *bias;       /* NULL, or the tile's first row's value (per row) or first column's */
  bool bias_per_row;
  const float *residual;   /* NULL, or the tile's first row of the residual */
  int64_t res_rs;
} rk_tile_epilogue;

/* Whether the C-writing micro-kernels apply this activation themselves (a few operations a value,
 * in registers); the others their callers apply to the tile after, out of line. */
static inline bool rk_kernel_activates(rk_act act) {
  return act <= RK_ACT_CLIP || act == RK_ACT_HARD_SIGMOID || act == RK_ACT_HARD_SWISH;
}

/* The micro-kernel writing rows of C (c, row stride c_rs) itself; NULL where the instruction set
 * has none (the portable and NEON builds write through a tile). */
typedef void (*rk_ukernel_c_fn)(int64_t kc, const float *a, const float *b, float *c, int64_t c_rs, int mr,
                                const rk_tile_epilogue *ep);
RVM_HIDDEN rk_ukernel_c_fn rk_ukernel_c(rk_isa isa, bool streaming);

/* Two neighbouring panels of B at once (b, and b + b_stride for the next RK_NR columns), as two
 * calls of the one-panel kernels would compute them, bit for bit: tile[q][r][j] for panel q (the
 * tile is [2][RK_MR][RK_NR]), or written to C's 2 * RK_NR contiguous columns (both panels full).
 * NULL where the instruction set has none (all but AVX-512: their one-panel kernels already keep
 * enough sums in flight). */
typedef void (*rk_ukernel2_fn)(int64_t kc, const float *a, const float *b, int64_t b_stride, float *tile, int mr);
typedef void (*rk_ukernel2_c_fn)(int64_t kc, const float *a, const float *b, int64_t b_stride, float *c, int64_t c_rs,
                                 int mr, const rk_tile_epilogue *ep);
RVM_HIDDEN rk_ukernel2_fn rk_ukernel2(rk_isa isa);
RVM_HIDDEN rk_ukernel2_c_fn rk_ukernel2_c(rk_isa isa);
/* The C-writing two-panel kernel over two strips of A (a0's full strip, then mr1 rows of a1's:
 * 7 to 12 rows), both panels full; NULL where none. */
typedef void (*rk_ukernel2_wide_c_fn)(int64_t kc, const float *a0, const float *a1, int mr1, const float *b,
                                      int64_t b_stride, float *c, int64_t c_rs, const rk_tile_epilogue *ep);
RVM_HIDDEN rk_ukernel2_wide_c_fn rk_ukernel2_wide_c(rk_isa isa);

/* The C-writing kernel over `panels` (1 or 2) panels of a B read in place: step k's columns are
 * the floats at b + rows[k]; of a single panel only the first nr are read and written (masked).
 * The same sums as the packed kernels, bit for bit. NULL where the instruction set has none
 * (then B is packed). */
typedef void (*rk_ukernel_rows_c_fn)(int64_t kc, const float *a, const float *b, const int64_t *rows, int panels,
                                     int nr, float *c, int64_t c_rs, int mr, const rk_tile_epilogue *ep);
RVM_HIDDEN rk_ukernel_rows_c_fn rk_ukernel_rows_c(rk_isa isa);
/* The same over two strips of A (a0's full strip, then mr1 rows of a1's: 7 to 12 rows) and two
 * full panels; NULL where none. */
typedef void (*rk_ukernel_rows_wide_c_fn)(int64_t kc, const float *a0, const float *a1, int mr1, const float *b,
                                          const int64_t *rows, float *c, int64_t c_rs, const rk_tile_epilogue *ep);
RVM_HIDDEN rk_ukernel_rows_wide_c_fn rk_ukernel_rows_wide_c(rk_isa isa);

/* Applies an activation to one value, as every kernel's epilogue does (rk_math.h's functions). */
RVM_HIDDEN float rk_activate(float x, rk_act act, float lo, float hi);
/* The same to n values in place, a loop per activation so that each vectorizes. */
RVM_HIDDEN void rk_activate_all(float *x, int64_t n, rk_act act, float lo, float hi);
/* The same to `rows` rows of `cols` values, `rs` floats apart (a tile of C): one call a tile. */
RVM_HIDDEN void rk_activate_rows(float *x, int64_t rs, int64_t rows, int64_t cols, rk_act act, float lo, float hi);

/* ---- convolution parameters ------------------------------------------------------------------ */

/* A convolution's attributes, in the order of its params shape. */
typedef struct conv_params {
  int64_t kh, kw, sh, sw, pad_top, pad_left, pad_bottom, pad_right, dh, dw, groups;
} conv_params;

/* A convolution's arguments, (x, w, bias?, residual?, params, activation, [alpha, lo, hi], out),
 * decoded and checked against each other (w's layout is the caller's to check). A 1-D
 * convolution's NCW x, out and residual are seen as NCHW with H = 1 (views kept here, so the
 * pointers are valid while the struct is). */
typedef struct conv_args {
  DLTensor *x, *w, *bias, *residual, *out;
  conv_params p;
  rk_epilogue ep;
  int64_t oh, ow; /* the output's extents */
  DLTensor views[3];
  int64_t view_shapes[3][4];
} conv_args;

/* Decodes and checks a convolution's arguments; `w_name` names the weights in errors. */
RVM_HIDDEN int rk_conv_args(const char *kernel, const char *w_name, const TVMFFIAny *args, int32_t num_args,
                            conv_args *out);

/* ---- views ------------------------------------------------------------------------------- */

enum { RK_MAX_RANK = 8 };

/* A tensor seen through a permutation of its dims: shape and strides in elements. */
typedef struct rk_view {
  int32_t ndim;
  int64_t shape[RK_MAX_RANK];
  int64_t strides[RK_MAX_RANK];
} rk_view;

/* Compact tensor t (rank <= RK_MAX_RANK) seen as it is. */
RVM_HIDDEN void rk_view_compact(const DLTensor *t, rk_view *out);
/* Compact tensor t seen as permute_dims(t, perm), perm the Shape at args[i] (None: t itself);
 * a ValueError names `name` when perm is not a permutation of t's axes. */
RVM_HIDDEN int rk_view_permuted(const char *kernel, const DLTensor *t, const TVMFFIAny *args, int32_t num_args,
                                int32_t i, const char *name, rk_view *out);
/* The result `out` seen through the inverse of the permutation at args[i] ("out_perm"), so that
 * view dim d is the computed result's dim d. */
RVM_HIDDEN int rk_view_result(const char *kernel, const DLTensor *out, const TVMFFIAny *args, int32_t num_args,
                              int32_t i, rk_view *c);
/* A view's shape as "[a, b, c]" for messages. */
RVM_HIDDEN void rk_view_format(const rk_view *v, char *buf, size_t cap);

/* ---- arguments ---------------------------------------------------------------------------- */

/* A float32 CPU tensor argument, compact (row-major, strides NULL or matching), or a raised
 * TypeError/ValueError naming the kernel and the argument. */
RVM_HIDDEN int rk_arg_f32(const char *kernel, const TVMFFIAny *args, int32_t num_args, int32_t i, const char *name,
                          DLTensor **out);
/* The same, or NULL for a None argument. */
RVM_HIDDEN int rk_arg_f32_or_none(const char *kernel, const TVMFFIAny *args, int32_t num_args, int32_t i,
                                  const char *name, DLTensor **out);
/* A compact CPU tensor argument of one dtype (code kDLInt, kDLUInt or kDLFloat, and bits), or a
 * TypeError naming it and `dtype` (the dtype's name, for the message). */
RVM_HIDDEN int rk_arg_typed(const char *kernel, const TVMFFIAny *args, int32_t num_args, int32_t i, const char *name,
                            int code, int bits, const char *dtype, DLTensor **out);
/* A compact int32 CPU tensor argument (ids, positions), or a TypeError naming it. */
RVM_HIDDEN int rk_arg_i32(const char *kernel, const TVMFFIAny *args, int32_t num_args, int32_t i, const char *name,
                          DLTensor **out);
/* An integer argument (an Int or Bool). */
RVM_HIDDEN int rk_arg_int(const char *kernel, const TVMFFIAny *args, int32_t num_args, int32_t i, const char *name,
                          int64_t *out);
/* The epilogue's arguments at args[i], args[i + 1]: the activation's name (a string: none, relu,
 * clip, gelu, gelu_tanh, silu, sigmoid), then a float32 tensor [alpha, lo, hi] (a constant
 * costs the VM nothing, where each float PrimValue would be a call); bias and residual are left
 * for the caller. */
/* A string argument that must be one of `names`: its index in *out, or a TypeError, or a
 * ValueError naming `what` and listing the names. */
RVM_HIDDEN int rk_arg_name(const char *kernel, const TVMFFIAny *args, int32_t num_args, int32_t i, const char *what,
                           const char *const *names, int count, int *out);
RVM_HIDDEN int rk_arg_epilogue(const char *kernel, const TVMFFIAny *args, int32_t num_args, int32_t i,
                               rk_epilogue *out);
/* A float32 tensor argument of exactly `count` values, copied to out. */
RVM_HIDDEN int rk_arg_scalars(const char *kernel, const TVMFFIAny *args, int32_t num_args, int32_t i, const char *name,
                              int64_t count, float *out);
/* A Shape argument of exactly `count` dims (any count when count < 0), or a TypeError. */
RVM_HIDDEN int rk_arg_shape(const char *kernel, const TVMFFIAny *args, int32_t num_args, int32_t i, const char *name,
                            int64_t count, const int64_t **dims, int64_t *ndim);
/* The number of arguments must be `expected`. */
RVM_HIDDEN int rk_check_count(const char *kernel, int32_t num_args, int32_t expected);
/* The element data of a tensor (data + byte_offset). */
static inline float *rk_data(const DLTensor *t) { return (float *)((char *)t->data + t->byte_offset); }
/* Whether a tensor is compact and row-major (strides NULL or matching its shape). */
RVM_HIDDEN bool rk_compact(const DLTensor *t);
/* Whether two tensors have the same shape. */
RVM_HIDDEN bool rk_same_shape(const DLTensor *a, const DLTensor *b);
/* Whether RELAXC_QUANT_ISA names `isa` ("portable", "avx2"): the LLM kernels' switch to a lesser
 * instruction set than the CPU's, so that tests compare the sets on one CPU. */
RVM_HIDDEN bool rk_quant_isa_forced(const char *isa);
/* Says on stderr which path a family of kernels took ("<family> on <path>"), when
 * RELAXC_KERNEL_PATHS=report (relaxc run --profile sets it); called once per decision. */
RVM_HIDDEN void rk_report_path(const char *family, const char *path);
/* The number of elements of a tensor. */
RVM_HIDDEN int64_t rk_numel(const DLTensor *t);
/* A ValueError naming the kernel, with a shape in the message: "<kernel>: <what> (got [2, 3])". */
RVM_HIDDEN int rk_shape_error(const char *kernel, const char *what, const DLTensor *t);
/* An out-of-memory error naming the kernel. */
RVM_HIDDEN int rk_out_of_memory(const char *kernel);

#endif /* RK_H */
