/*
 * recurrent.c: relaxc.lstm_sequence and relaxc.gru_sequence, the recurrence of ONNX's LSTM and
 * GRU over a whole sequence in one call, one direction at a time.
 *
 * The input projection (x W^T plus the biases that can go with it) is one matmul over every step
 * before the call (relaxc.onnx writes it so); what is left per step is the recurrent product
 * h R^T, the gates and the state update, which depend on the previous step and so run in order.
 * One call for the whole sequence keeps the build and the model the same size whatever the
 * sequence's length (a symbolic one included), where writing each step out grew both with it.
 *
 * A step's hidden units (panels of 16) are split between threads (when the step is large enough to pay for
 * it), which meet at a barrier before the next step; each unit's recurrent product is summed in
 * order of k on whichever thread, so the bits are the same at any thread count. The
 * activations are ONNX's defaults (sigmoid, tanh), as rk_math.h computes them.
 */
#include <stdatomic.h>

#include "rk.h"
#include "rk_math.h"

typedef struct rnn_job {
  const float *xw;              /* [steps][batch][gates * hidden]: the input projection */
  const float *rt;              /* [gates][panels][hidden][16]: R transposed, packed (see below) */
  const float *peephole;        /* LSTM: [3][hidden] (i, o, f) or NULL */
  const float *rb_h;            /* GRU: the recurrent bias of the candidate gate, [hidden] */
  const float *h0, *c0;         /* [batch][hidden] or NULL (zeros) */
  float *y, *h_last, *c_last;   /* [steps][batch][hidden], [batch][hidden], [batch][hidden] */
  int64_t steps, batch, hidden; /* c_last: LSTM only */
  int gates;                    /* 4 (LSTM: i, o, f, c) or 3 (GRU: z, r, h) */
  bool reverse, linear_before_reset;
} rnn_job;

/* The recurrent weights come packed per gate as panels of 16 hidden units: rt[q][p][k][j] =
 * R[q * hidden + 16 p + j][k] (zero past hidden), so that one unit panel's sums for several gates
 * stream their weights contiguously. */
enum { UNITS = 16 };

/* For unit panel p and the `nq` gates from q0: dst[q][j] = init[q][j] + sum over k of v[k]
 * rt[q][p][k][j] (init NULL: 0), k in order; 16 values per gate, kept in registers over all of k.
 * Written once and compiled for the baseline and for AVX2 (the same operations, no fused
 * multiply-add: the same bits). */
static inline __attribute__((always_inline)) void panel_body(float *const *dst, const float *const *init,
                                                             const float *restrict v, const float *restrict rt,
                                                             int64_t panels, int64_t k, int64_t p, int q0, int nq) {
  rk_f8 acc[4][2];
  const float *w[4];
  for (int q = 0; q < nq; q++) {
    for (int h = 0; h < 2; h++) acc[q][h] = init[q] ? rk_f8_load(init[q] + 8 * h) : (rk_f8){0};
    w[q] = rt + ((int64_t)(q0 + q) * panels + p) * k * UNITS;
  }
  for (int64_t i = 0; i < k; i++) {
    rk_f8 vi = (rk_f8){0} + v[i];
    for (int q = 0; q < nq; q++)
      for (int h = 0; h < 2; h++) acc[q][h] += vi * rk_f8_load(w[q] + i * UNITS + 8 * h);
  }
  for (int q = 0; q < nq; q++)
    for (int h = 0; h < 2; h++) RK_F8_STORE(dst[q] + 8 * h, acc[q][h]);
}

typedef void (*panel_fn)(float *const *dst, const float *const *init, const float *v, const float *rt, int64_t panels,
                         int64_t k, int64_t p, int q0, int nq);

#define PANEL_FN(name, attr)                                                                                      \
  attr static void name(float *const *dst, const float *const *init, const float *v, const float *rt, int64_t panels, \
                        int64_t k, int64_t p, int q0, int nq) {                                                   \
    switch (nq) {                                                                                                 \
      case 4: panel_body(dst, init, v, rt, panels, k, p, q0, 4); break;                                           \
      case 3: panel_body(dst, init, v, rt, panels, k, p, q0, 3); break;                                           \
      case 2: panel_body(dst, init, v, rt, panels, k, p, q0, 2); break;                                           \
      default: panel_body(dst, init, v, rt, panels, k, p, q0, 1); break;                                          \
    }                                                                                                             \
  }
PANEL_FN(panel_portable, )
#if defined(__x86_64__)
PANEL_FN(panel_avx2, RK_AVX2_TARGET)
#endif
#undef PANEL_FN

static panel_fn chosen_panel(void) {
#if defined(__x86_64__)
  if (rk_cpu_isa() == RK_ISA_AVX2) return panel_avx2;
#endif
  return panel_portable;
}

/* Gates [q0, q0 + nq) of unit panel p for one row into g (a row's [gates][hidden] sums), from
 * init rows (NULL: 0) laid out as g is; the panel's units past hidden go to a scratch tile. */
static void gate_sums(const rnn_job *j, panel_fn panel, float *g, const float *init_row, const float *v, int64_t p,
                      int q0, int nq) {
  const int64_t H = j->hidden, panels = (H + UNITS - 1) / UNITS, u = p * UNITS;
  float tiles[4][UNITS], init_tiles[4][UNITS];
  float *dst[4];
  const float *init[4];
  bool whole = u + UNITS <= H;
  for (int q = 0; q < nq; q++) {
    const float *from = init_row ? init_row + (int64_t)(q0 + q) * H + u : NULL;
    if (whole) {
      dst[q] = g + (int64_t)(q0 + q) * H + u;
      init[q] = from;
    } else {
      for (int64_t x = 0; x < UNITS; x++) init_tiles[q][x] = from && u + x < H ? from[x] : 0.0f;
      dst[q] = tiles[q];
      init[q] = from ? init_tiles[q] : NULL;
    }
  }
  panel(dst, init, v, j->rt, panels, H, p, q0, nq);
  if (!whole)
    for (int q = 0; q < nq; q++)
      for (int64_t x = 0; u + x < H; x++) g[(int64_t)(q0 + q) * H + u + x] = tiles[q][x];
}

/* What the tasks of one call share: the state double-buffered (every task reads all of h while
 * it writes its own units of the next h), the gate sums, and the barrier between steps. */
typedef struct rnn_shared {
  float *h[2];   /* [batch][hidden] each */
  float *c;      /* [batch][hidden]: LSTM's cell state */
  float *g;      /* [batch][gates * hidden]: the gate sums of a step */
  float *rh;     /* [batch][hidden]: GRU's r * h */
  atomic_int arrived, generation;
} rnn_shared;

typedef struct rnn_work {
  const rnn_job *job;
  rnn_shared *shared;
} rnn_work;

static inline void relax_cpu(void) {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}

/* Every task waits here until all have arrived. The pool runs each of a launch's tasks on a
 * thread of its own (never more tasks than threads), so none waits for a task not started. */
static void barrier(rnn_shared *sh, int num_tasks) {
  if (num_tasks <= 1) return;
  int generation = atomic_load_explicit(&sh->generation, memory_order_acquire);
  if (atomic_fetch_add_explicit(&sh->arrived, 1, memory_order_acq_rel) == num_tasks - 1) {
    atomic_store_explicit(&sh->arrived, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&sh->generation, 1, memory_order_release);
  } else {
    while (atomic_load_explicit(&sh->generation, memory_order_acquire) == generation) relax_cpu();
  }
}

/* One LSTM step of unit panels [p0, p1) of every batch row: gate sums, then the states. */
static void lstm_step(const rnn_job *j, rnn_shared *sh, int64_t t, int cur, int64_t p0, int64_t p1, panel_fn panel) {
  const int64_t H = j->hidden, G = 4 * H;
  const int64_t u0 = p0 * UNITS, u1 = p1 * UNITS < H ? p1 * UNITS : H;
  const float *pi = j->peephole, *po = pi ? pi + H : NULL, *pf = pi ? pi + 2 * H : NULL;
  for (int64_t b = 0; b < j->batch; b++) {
    const float *h = sh->h[cur] + b * H, *xw = j->xw + (t * j->batch + b) * G;
    float *g = sh->g + b * G, *c = sh->c + b * H, *next = sh->h[1 - cur] + b * H;
    float *out = j->y + (t * j->batch + b) * H;
    for (int64_t p = p0; p < p1; p++) gate_sums(j, panel, g, xw, h, p, 0, 4);
    for (int64_t u = u0; u < u1; u++) {
      float gi = g[u], go = g[H + u], gf = g[2 * H + u], gc = g[3 * H + u];
      if (pi) {
        gi += pi[u] * c[u];
        gf += pf[u] * c[u];
      }
      float i = rk_sigmoid(gi), f = rk_sigmoid(gf), cand = rk_tanh(gc);
      c[u] = f * c[u] + i * cand;
      if (po) go += po[u] * c[u];
      next[u] = out[u] = rk_sigmoid(go) * rk_tanh(c[u]);
    }
  }
}

/* One GRU step of unit panels [p0, p1): z and r, then (after every task's r * h is there,
 * unless linear_before_reset) the candidate and the state. g holds a row's gate sums: z, r,
 * then the candidate's recurrent product with its bias. */
static void gru_step(const rnn_job *j, rnn_shared *sh, int64_t t, int cur, int64_t p0, int64_t p1, panel_fn panel,
                     int num_tasks) {
  const int64_t H = j->hidden, G = 3 * H;
  const int64_t u0 = p0 * UNITS, u1 = p1 * UNITS < H ? p1 * UNITS : H;
  const bool lbr = j->linear_before_reset;
  for (int64_t b = 0; b < j->batch; b++) {
    const float *h = sh->h[cur] + b * H, *xw = j->xw + (t * j->batch + b) * G;
    float *g = sh->g + b * G;
    /* linear_before_reset: the candidate's product is of h too, so all three gates at once */
    for (int64_t p = p0; p < p1; p++) {
      gate_sums(j, panel, g, xw, h, p, 0, 2);
      if (lbr) {
        float *cand = g + 2 * H;
        gate_sums(j, panel, g, NULL, h, p, 2, 1);
        for (int64_t u = p * UNITS; u < (p + 1) * UNITS && u < H; u++) cand[u] += j->rb_h[u];
      }
    }
    for (int64_t u = u0; u < u1; u++) {
      g[u] = rk_sigmoid(g[u]);         /* z */
      g[H + u] = rk_sigmoid(g[H + u]); /* r */
      if (!lbr) sh->rh[b * H + u] = g[H + u] * h[u];
    }
  }
  if (!lbr) barrier(sh, num_tasks);
  for (int64_t b = 0; b < j->batch; b++) {
    const float *h = sh->h[cur] + b * H, *xw = j->xw + (t * j->batch + b) * G;
    float *g = sh->g + b * G, *cand = g + 2 * H, *next = sh->h[1 - cur] + b * H;
    float *out = j->y + (t * j->batch + b) * H;
    if (!lbr) {
      for (int64_t p = p0; p < p1; p++) gate_sums(j, panel, g, NULL, sh->rh + b * H, p, 2, 1);
      for (int64_t u = u0; u < u1; u++) cand[u] += j->rb_h[u];
    }
    for (int64_t u = u0; u < u1; u++) {
      float inner = lbr ? g[H + u] * cand[u] : cand[u];
      float hh = rk_tanh(xw[2 * H + u] + inner);
      next[u] = out[u] = (1.0f - g[u]) * hh + g[u] * h[u];
    }
  }
}

/* Task `task` takes unit panels [p0, p1) of every row through every step. */
static int rnn_task(int task, int num_tasks, void *ctx) {
  const rnn_work *w = ctx;
  const rnn_job *j = w->job;
  rnn_shared *sh = w->shared;
  const int64_t H = j->hidden;
  int64_t p0, p1;
  rk_split((H + UNITS - 1) / UNITS, task, num_tasks, &p0, &p1);
  const int64_t u0 = p0 * UNITS, u1 = p1 * UNITS < H ? p1 * UNITS : H;
  for (int64_t b = 0; b < j->batch; b++)
    for (int64_t u = u0; u < u1; u++) {
      sh->h[0][b * H + u] = j->h0 ? j->h0[b * H + u] : 0.0f;
      if (sh->c) sh->c[b * H + u] = j->c0 ? j->c0[b * H + u] : 0.0f;
    }
  barrier(sh, num_tasks);
  panel_fn panel = chosen_panel();
  int cur = 0;
  for (int64_t s = 0; s < j->steps; s++) {
    int64_t t = j->reverse ? j->steps - 1 - s : s;
    if (j->gates == 4) lstm_step(j, sh, t, cur, p0, p1, panel);
    else gru_step(j, sh, t, cur, p0, p1, panel, num_tasks);
    barrier(sh, num_tasks);
    cur = 1 - cur;
  }
  for (int64_t b = 0; b < j->batch; b++)
    for (int64_t u = u0; u < u1; u++) {
      j->h_last[b * H + u] = sh->h[cur][b * H + u];
      if (j->c_last) j->c_last[b * H + u] = sh->c[b * H + u];
    }
  return 0;
}

/* Multiply-adds of one step worth another thread: below this the barrier between steps costs
 * more than the thread saves. */
enum { STEP_MACS_PER_TASK = 1 << 16 };

/* The arguments both kernels share, checked: xw [steps, batch, gates * hidden], rt [hidden,
 * gates * hidden], h0 [batch, hidden] or None, y [steps, batch, hidden], h_last [batch, hidden]. */
static int common_args(const char *kernel, const TVMFFIAny *args, int32_t num_args, int gates, int h0_at,
                       int y_at, rnn_job *j) {
  DLTensor *xw = NULL, *rt = NULL, *h0 = NULL, *y = NULL, *h_last = NULL;
  int rc = rk_arg_f32(kernel, args, num_args, 0, "xw", &xw);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 1, "rt", &rt);
  if (!rc) rc = rk_arg_f32_or_none(kernel, args, num_args, h0_at, "h0", &h0);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, y_at, "y", &y);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, y_at + 1, "h_last", &h_last);
  if (rc) return rc;
  if (xw->ndim != 3 || xw->shape[2] % gates != 0)
    return rk_shape_error(kernel, "xw must be [steps, batch, gates * hidden]", xw);
  int64_t H = xw->shape[2] / gates;
  if (rt->ndim != 4 || rt->shape[0] != gates || rt->shape[1] != (H + UNITS - 1) / UNITS || rt->shape[2] != H ||
      rt->shape[3] != UNITS)
    return rk_shape_error(kernel, "rt must be [gates, ceil(hidden / 16), hidden, 16] for xw's hidden", rt);
  int64_t T = xw->shape[0], B = xw->shape[1];
  if (y->ndim != 3 || y->shape[0] != T || y->shape[1] != B || y->shape[2] != H)
    return rk_shape_error(kernel, "y must be [steps, batch, hidden]", y);
  if (h_last->ndim != 2 || h_last->shape[0] != B || h_last->shape[1] != H)
    return rk_shape_error(kernel, "h_last must be [batch, hidden]", h_last);
  if (h0 && !rk_same_shape(h0, h_last)) return rk_shape_error(kernel, "h0 must be [batch, hidden]", h0);
  j->xw = rk_data(xw);
  j->rt = rk_data(rt);
  j->h0 = h0 ? rk_data(h0) : NULL;
  j->y = rk_data(y);
  j->h_last = rk_data(h_last);
  j->steps = T, j->batch = B, j->hidden = H, j->gates = gates;
  return 0;
}

static int run(const char *kernel, rnn_job *j) {
  if (j->batch == 0 || j->hidden == 0) return 0;
  const int64_t H = j->hidden, B = j->batch;
  /* Every buffer the tasks share is taken here, so no task can fail and leave the others
   * waiting at a barrier. */
  size_t floats = (size_t)(3 * B * H + B * H * j->gates); /* h twice, c or r * h, the gate sums */
  float *buffer = rk_scratch(RK_SLOT_INPUT, floats * sizeof(float));
  if (!buffer) return rk_out_of_memory(kernel);
  rnn_shared sh = {.h = {buffer, buffer + B * H}, .g = buffer + 2 * B * H};
  float *more = sh.g + B * H * j->gates;
  if (j->gates == 4) sh.c = more;
  else sh.rh = more;
  atomic_init(&sh.arrived, 0);
  atomic_init(&sh.generation, 0);
  rnn_work w = {j, &sh};
  int64_t step_macs = B * H * H * j->gates, tasks = step_macs / STEP_MACS_PER_TASK, panels = (H + UNITS - 1) / UNITS;
  tasks = tasks < 1 ? 1 : tasks > panels ? panels : tasks;
  return rk_parallel(tasks, rnn_task, &w);
}

/* (xw, rt, peephole?, h0?, c0?, reverse, y, h_last, c_last) */
int rvm_builtin_kl_lstm_sequence(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  (void)self, (void)result;
  static const char kernel[] = "relaxc.lstm_sequence";
  rnn_job j = {0};
  DLTensor *peephole = NULL, *c0 = NULL, *c_last = NULL;
  int64_t reverse = 0;
  int rc = rk_check_count(kernel, num_args, 9);
  if (!rc) rc = common_args(kernel, args, num_args, 4, 3, 6, &j);
  if (!rc) rc = rk_arg_f32_or_none(kernel, args, num_args, 2, "peephole", &peephole);
  if (!rc) rc = rk_arg_f32_or_none(kernel, args, num_args, 4, "c0", &c0);
  if (!rc) rc = rk_arg_int(kernel, args, num_args, 5, "reverse", &reverse);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 8, "c_last", &c_last);
  if (rc) return rc;
  if (peephole && rk_numel(peephole) != 3 * j.hidden)
    return rk_shape_error(kernel, "peephole must hold 3 * hidden values (i, o, f)", peephole);
  if (c0 && (c0->ndim != 2 || c0->shape[0] != j.batch || c0->shape[1] != j.hidden))
    return rk_shape_error(kernel, "c0 must be [batch, hidden]", c0);
  if (c_last->ndim != 2 || c_last->shape[0] != j.batch || c_last->shape[1] != j.hidden)
    return rk_shape_error(kernel, "c_last must be [batch, hidden]", c_last);
  j.peephole = peephole ? rk_data(peephole) : NULL;
  j.c0 = c0 ? rk_data(c0) : NULL;
  j.c_last = rk_data(c_last);
  j.reverse = reverse != 0;
  return run(kernel, &j);
}

/* (xw, rt, rb_h, h0?, reverse, linear_before_reset, y, h_last) */
int rvm_builtin_kl_gru_sequence(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  (void)self, (void)result;
  static const char kernel[] = "relaxc.gru_sequence";
  rnn_job j = {0};
  DLTensor *rb_h = NULL;
  int64_t reverse = 0, lbr = 0;
  int rc = rk_check_count(kernel, num_args, 8);
  if (!rc) rc = common_args(kernel, args, num_args, 3, 3, 6, &j);
  if (!rc) rc = rk_arg_f32(kernel, args, num_args, 2, "rb_h", &rb_h);
  if (!rc) rc = rk_arg_int(kernel, args, num_args, 4, "reverse", &reverse);
  if (!rc) rc = rk_arg_int(kernel, args, num_args, 5, "linear_before_reset", &lbr);
  if (rc) return rc;
  if (rk_numel(rb_h) != j.hidden) return rk_shape_error(kernel, "rb_h must hold hidden values", rb_h);
  j.rb_h = rk_data(rb_h);
  j.reverse = reverse != 0;
  j.linear_before_reset = lbr != 0;
  return run(kernel, &j);
}
