/*
 * kv_cache.c: TVM's paged KV cache (relax.vm.PagedAttentionKVCache) for CPU models built with
 * the TIR attention backend — the state an LLM exported by TVM's nn front end or MLC keeps
 * between its prefill and decode calls. TVM's own implementation is apache/tvm src/runtime/vm/paged_kv_cache.cc.
 *
 * The attention math lives in the model's own kernels (TVM's, from lib0.o), handed over at
 * creation. This file keeps the pages, blocks and sequences, builds the auxiliary int32 arrays
 * the kernels read (laid out in one staging buffer as TVM lays them out), and calls the kernels
 * in TVM's order with TVM's arguments, so logits come out bit-identical.
 *
 * Blocks form trees: a sequence is a chain of blocks from a root, forks share the full pages
 * before the fork point and copy the partial one. At most two depths are attended separately
 * (the shared prefix, then the sequence's own part) and merged.
 *
 * Pages and temporaries are allocated once, at creation, from the allocator of the VM that
 * creates the cache (found through the `init` tensor's storage); a forward pass allocates
 * nothing but host arrays that grow to the largest batch seen. Kernels get DLTensor pointers to
 * views kept inside the cache, so an attention call allocates nothing at all.
 *
 * Differences from TVM, on purpose: begin_forward checks everything before it changes anything
 * (TVM adds the lengths first and then may fail to find pages), refuses an empty batch (TVM
 * crashes) and a step longer than prefill_chunk_size (TVM fails later, in a view); features
 * outside the CPU/TIR subset (sliding windows, attention sinks, token trees, MLA, KV transfer,
 * FlashInfer) are refused with an error naming them.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

enum { MAX_DEPTH = 2, ATTN_MHA = 0, ATTN_MLA = 1, ATTN_LINEAR = 2, ATTN_MHA_SLIDING = 3 };
enum { ROPE_NONE = 0, ROPE_NORMAL = 1, ROPE_INLINE = 2 };

/* ---- small growable arrays ------------------------------------------------------------------- */

typedef struct {
  int32_t *data;
  int64_t len, cap;
} ivec;

static int ivec_reserve(ivec *v, int64_t n) {
  if (n <= v->cap) return 0;
  int64_t cap = v->cap ? v->cap : 16;
  while (cap < n) cap *= 2;
  int32_t *p = rvm_mem_realloc(v->data, sizeof(int32_t) * (size_t)cap, "KV cache tables");
  if (!p) return rvm_raise("MemoryError", "KV cache: out of memory for %lld host entries", (long long)n);
  v->data = p;
  v->cap = cap;
  return 0;
}

static int ivec_push(ivec *v, int32_t x) {
  if (v->len == v->cap && ivec_reserve(v, v->len + 1)) return -1;
  v->data[v->len++] = x;
  return 0;
}

static int32_t ivec_back(const ivec *v) { return v->data[v->len - 1]; }

/* ---- the object ------------------------------------------------------------------------------ */

typedef struct {
  ivec pages;
  int32_t seq_length, start_pos, parent, refs; /* refs: sequences ending here + child blocks */
} block;

typedef struct {
  int64_t id;
  int32_t last_block, seq_length;
} sequence;

/* A tensor the cache hands to kernels: a DLTensor with room for its shape. */
typedef struct {
  DLTensor t;
  int64_t shape[5];
} view;

typedef struct kv_cache {
  TVMFFIObject header;
  /* configuration */
  int64_t num_layers, layer_begin, num_qo_heads, num_kv_heads, head_dim, page_size, num_pages, chunk;
  int64_t num_kinds;
  int64_t *kinds; /* attention kind per global layer */
  int32_t rope_mode;
  double rotary_scale, rotary_theta;
  DLDataType dtype;
  TVMFFIAny ext_factors; /* a Tensor (longrope), or None */
  /* the model's kernels (retained Function objects) */
  TVMFFIObject *f_append, *f_ragged, *f_prefill, *f_decode, *f_merge, *f_rotary, *f_copy_page;
  /* storage */
  rvm_storage *page_storage, *temp_storage;
  view *pages; /* per layer */
  char *q_base, *k_base, *v_base, *out_base, *lse_base, *merged_base;
  /* state */
  ivec free_pages, free_blocks;
  block *blocks;
  int64_t num_blocks, cap_blocks;
  sequence *seqs;
  int64_t num_seqs, cap_seqs;
  bool dirty;
  /* the forward pass begun */
  int64_t batch, total;
  int64_t *cur_lengths;
  int64_t cap_batch;
  int num_depths;
  bool use_decode[MAX_DEPTH], append_before_attn;
  ivec qo_indptr[MAX_DEPTH], page_indptr[MAX_DEPTH], page_indices[MAX_DEPTH], last_page_len[MAX_DEPTH],
      k_rope_offset[MAX_DEPTH];
  ivec q_rope_position, append_position, k_ragged_offset, cur_indptr, minus_ones;
  /* the staging buffer the kernels read, and the views into it */
  int32_t *staging;
  int64_t staging_cap;
  view v_qpos, v_qo_indptr[MAX_DEPTH], v_page_indptr[MAX_DEPTH], v_page_indices[MAX_DEPTH], v_length_info[MAX_DEPTH],
      v_k_rope[MAX_DEPTH], v_cur_indptr, v_k_ragged, v_append;
  view v_q, v_k, v_v, v_out, v_lse, v_merged;
  const rvm_allocator *heap; /* the creating VM's: everything the cache allocates comes from it */
} kv_cache;

static void release_function(TVMFFIObject *f) {
  if (f) rvm_object_decref(f);
}

/* The cache's functions run on the allocator of the VM that created the cache, whoever calls
 * them (the model, or a host through function_call): each exported method enters it around a
 * body of the same name. */
static const rvm_allocator *heap_of(const TVMFFIAny *args, int32_t n) {
  if (n < 1 || args[0].type_index != rvm_type_kv_cache) return rvm_mem_current();
  return ((const kv_cache *)args[0].v_obj)->heap;
}

#define KV_METHOD(name)                                                                          \
  static int kv_##name(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result);         \
  int rvm_builtin_kv_##name(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {   \
    const rvm_allocator *previous = rvm_mem_enter(heap_of(args, n));                             \
    int rc = kv_##name(self, args, n, result);                                                   \
    rvm_mem_leave(previous);                                                                     \
    return rc;                                                                                   \
  }                                                                                              \
  static int kv_##name(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result)

static void kv_cache_deleter(void *self, int flags) {
  kv_cache *c = self;
  if (flags & 1) {
    TVMFFIObject *fns[] = {c->f_append, c->f_ragged, c->f_prefill, c->f_decode, c->f_merge, c->f_rotary, c->f_copy_page};
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) release_function(fns[i]);
    rvm_any_release(&c->ext_factors);
    if (c->page_storage) rvm_object_decref(&c->page_storage->header);
    if (c->temp_storage) rvm_object_decref(&c->temp_storage->header);
    for (int64_t i = 0; i < c->num_blocks; i++) rvm_mem_free(c->blocks[i].pages.data);
    ivec *vecs[] = {&c->free_pages, &c->free_blocks, &c->q_rope_position, &c->append_position, &c->k_ragged_offset,
                    &c->cur_indptr, &c->minus_ones};
    for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++) rvm_mem_free(vecs[i]->data);
    for (int d = 0; d < MAX_DEPTH; d++) {
      rvm_mem_free(c->qo_indptr[d].data);
      rvm_mem_free(c->page_indptr[d].data);
      rvm_mem_free(c->page_indices[d].data);
      rvm_mem_free(c->last_page_len[d].data);
      rvm_mem_free(c->k_rope_offset[d].data);
    }
    rvm_mem_free(c->blocks);
    rvm_mem_free(c->seqs);
    rvm_mem_free(c->cur_lengths);
    rvm_mem_free(c->kinds);
    rvm_mem_free(c->pages);
    rvm_mem_free(c->staging);
  }
  if (flags & 2) rvm_mem_free(c);
}

/* ---- argument decoding ----------------------------------------------------------------------- */

static int arity(const char *fn, int32_t got, int32_t want) {
  if (got == want) return 0;
  return rvm_raise("TypeError", "Mismatched number of arguments when calling: `%s`. Expected %d but got %d arguments", fn, want, got);
}

static int cache_arg(const char *fn, const TVMFFIAny *args, int32_t n, kv_cache **out) {
  if (n < 1 || args[0].type_index != rvm_type_kv_cache)
    return rvm_raise("TypeError", "%s expects a PagedAttentionKVCache as its first argument, but got %s", fn,
                     n < 1 ? "nothing" : rvm_type_name(&args[0]));
  *out = (kv_cache *)args[0].v_obj;
  return 0;
}

static int int_arg(const char *fn, const TVMFFIAny *args, int32_t i, int64_t *out) {
  if (args[i].type_index == kTVMFFIInt || args[i].type_index == kTVMFFIBool) {
    *out = args[i].v_int64;
    return 0;
  }
  return rvm_raise("TypeError", "%s: argument %d must be an int, but got %s", fn, i, rvm_type_name(&args[i]));
}

static int float_arg(const char *fn, const TVMFFIAny *args, int32_t i, double *out) {
  if (args[i].type_index == kTVMFFIFloat) {
    *out = args[i].v_float64;
    return 0;
  }
  if (args[i].type_index == kTVMFFIInt || args[i].type_index == kTVMFFIBool) {
    *out = (double)args[i].v_int64;
    return 0;
  }
  return rvm_raise("TypeError", "%s: argument %d must be a float, but got %s", fn, i, rvm_type_name(&args[i]));
}

static int shape_arg(const char *fn, const TVMFFIAny *args, int32_t i, const TVMFFIShapeCell **out) {
  *out = rvm_as_shape(&args[i]);
  if (!*out) return rvm_raise("TypeError", "%s: argument %d must be a Shape, but got %s", fn, i, rvm_type_name(&args[i]));
  return 0;
}

static int tensor_arg(const char *fn, const TVMFFIAny *args, int32_t i, DLTensor **out) {
  *out = rvm_as_dltensor(&args[i]);
  if (!*out) return rvm_raise("TypeError", "%s: argument %d must be a Tensor, but got %s", fn, i, rvm_type_name(&args[i]));
  if ((*out)->device.device_type != kDLCPU)
    return rvm_raise("ValueError", "%s: argument %d is on device type %d; relaxc's KV cache runs on the CPU", fn, i,
                     (*out)->device.device_type);
  return 0;
}

static bool dtype_eq(DLDataType a, DLDataType b) { return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes; }

/* ---- kernels --------------------------------------------------------------------------------- */

static TVMFFIAny tensor_value(view *v) {
  TVMFFIAny a = {0};
  a.type_index = kTVMFFIDLTensorPtr;
  a.v_ptr = &v->t;
  return a;
}

static TVMFFIAny dl_value(DLTensor *t) {
  TVMFFIAny a = {0};
  a.type_index = kTVMFFIDLTensorPtr;
  a.v_ptr = t;
  return a;
}

static TVMFFIAny float_value(double x) {
  TVMFFIAny a = {0};
  a.type_index = kTVMFFIFloat;
  a.v_float64 = x;
  return a;
}

static int call(TVMFFIObject *f, const char *what, TVMFFIAny *args, int32_t n) {
  if (!f) return rvm_raise("InternalError", "KV cache: the model handed over no %s kernel", what);
  TVMFFIAny ret = {0};
  rvm_function *fn = (rvm_function *)f;
  int rc = fn->cell.safe_call(fn, args, n, &ret);
  rvm_any_release(&ret);
  return rc;
}

/* A kernel handed over as a Function value, or NULL for a non-function. */
static TVMFFIObject *optional_function(const TVMFFIAny *a) {
  if (a->type_index != kTVMFFIFunction) return NULL;
  rvm_object_incref(a->v_obj);
  return a->v_obj;
}

/* A backend tuple: () is "none", ("tirx", f) a TIR kernel; anything else is outside the subset. */
static int backend_function(const TVMFFIAny *a, int32_t index, TVMFFIObject **out) {
  *out = NULL;
  if (a->type_index != kTVMFFIArray)
    return rvm_raise("TypeError", "paged_attention_kv_cache_create: argument %d must be a backend tuple, but got %s", index,
                     rvm_type_name(a));
  const rvm_array *t = (const rvm_array *)a->v_obj;
  if (t->cell.size == 0) return 0;
  const char *name;
  uint64_t len;
  if (!rvm_as_string(&t->items[0], &name, &len))
    return rvm_raise("InternalError", "paged_attention_kv_cache_create: argument %d: the backend name is not a string", index);
  if (len == 10 && memcmp(name, "flashinfer", 10) == 0)
    return rvm_raise("ValueError",
                     "paged_attention_kv_cache_create: the FlashInfer attention backend is not supported by relaxc's KV cache "
                     "(CPU models use the TIR backend)");
  if (!(len == 4 && memcmp(name, "tirx", 4) == 0) && !(len == 3 && memcmp(name, "tir", 3) == 0))
    return rvm_raise("InternalError", "Cannot reach here");
  if (t->cell.size != 2 || t->items[1].type_index != kTVMFFIFunction)
    return rvm_raise("InternalError", "paged_attention_kv_cache_create: argument %d: a TIR backend tuple is (\"tirx\", function)", index);
  rvm_object_incref(t->items[1].v_obj);
  *out = t->items[1].v_obj;
  return 0;
}

/* ---- views ----------------------------------------------------------------------------------- */

static void set_view(view *v, void *data, uint64_t byte_offset, DLDataType dtype, int32_t ndim, const int64_t *shape) {
  memset(&v->t, 0, sizeof v->t);
  v->t.data = data;
  v->t.device.device_type = kDLCPU;
  v->t.ndim = ndim;
  v->t.dtype = dtype;
  for (int32_t i = 0; i < ndim; i++) v->shape[i] = shape[i];
  v->t.shape = v->shape;
  v->t.byte_offset = byte_offset;
}

static const DLDataType INT32 = {kDLInt, 32, 1};
static const DLDataType FLOAT32 = {kDLFloat, 32, 1};

/* ---- blocks and pages ------------------------------------------------------------------------ */

static int new_block(kv_cache *c, int32_t *out) {
  int32_t idx;
  if (c->free_blocks.len > 0) {
    idx = c->free_blocks.data[--c->free_blocks.len];
  } else {
    if (c->num_blocks == c->cap_blocks) {
      int64_t cap = c->cap_blocks ? 2 * c->cap_blocks : 16;
      block *b = rvm_mem_realloc(c->blocks, sizeof(block) * (size_t)cap, "KV cache blocks");
      if (!b) return rvm_raise("MemoryError", "KV cache: out of memory for blocks");
      c->blocks = b;
      c->cap_blocks = cap;
    }
    idx = (int32_t)c->num_blocks++;
    memset(&c->blocks[idx], 0, sizeof(block));
  }
  block *b = &c->blocks[idx];
  b->pages.len = 0;
  b->seq_length = b->start_pos = 0;
  b->parent = -1;
  b->refs = 0;
  *out = idx;
  return 0;
}

static int32_t take_page(kv_cache *c) { return c->free_pages.data[--c->free_pages.len]; }

static int cache_full(void) {
  return rvm_raise("InternalError", "Check failed: (!free_page_ids_.empty()) is false: The KV cache is full. No page can be allocated.");
}

static sequence *find_seq(kv_cache *c, int64_t id) {
  for (int64_t i = 0; i < c->num_seqs; i++)
    if (c->seqs[i].id == id) return &c->seqs[i];
  return NULL;
}

static int not_found(int64_t id) {
  return rvm_raise("InternalError", "Check failed: (it != seq_map_.end()) is false: The sequence \"%lld\" cannot be found in KV cache.",
                   (long long)id);
}

/* A new sequence ending at block `last`: it references the block, and its length is the sum
 * along the chain. */
static int insert_seq(kv_cache *c, int64_t id, int32_t last) {
  if (c->num_seqs == c->cap_seqs) {
    int64_t cap = c->cap_seqs ? 2 * c->cap_seqs : 8;
    sequence *s = rvm_mem_realloc(c->seqs, sizeof(sequence) * (size_t)cap, "KV cache sequences");
    if (!s) return rvm_raise("MemoryError", "KV cache: out of memory for sequences");
    c->seqs = s;
    c->cap_seqs = cap;
  }
  sequence *s = &c->seqs[c->num_seqs++];
  s->id = id;
  s->last_block = last;
  s->seq_length = 0;
  c->blocks[last].refs++;
  for (int32_t b = last; b != -1; b = c->blocks[b].parent) s->seq_length += c->blocks[b].seq_length;
  return 0;
}

static void erase_seq(kv_cache *c, sequence *s) { *s = c->seqs[--c->num_seqs]; }

/* Pages a block needs to hold `length` tokens. */
static int64_t pages_for(const kv_cache *c, int64_t length) { return (length + c->page_size - 1) / c->page_size; }

/* The block chain of a sequence, root first (at most `cap` entries are written; the length is
 * returned). */
static int64_t trace_of(const kv_cache *c, int32_t last, int32_t *out, int64_t cap) {
  int64_t n = 0;
  for (int32_t b = last; b != -1; b = c->blocks[b].parent) n++;
  int64_t k = n;
  for (int32_t b = last; b != -1; b = c->blocks[b].parent) {
    k--;
    if (k < cap) out[k] = b;
  }
  return n;
}

/* ---- creation -------------------------------------------------------------------------------- */

static int unsupported(const char *feature) {
  return rvm_raise("ValueError", "relaxc's KV cache does not support %s (supported: CPU, TIR attention kernels, MHA/GQA, RoPE none/normal/inline)",
                   feature);
}

/* The allocator of the VM whose program creates the cache: the one behind the `init` tensor's
 * storage. A tensor from elsewhere gets the cache an unpooled storage. */
static rvm_storage *storage_like(const TVMFFIAny *init, uint64_t nbytes) {
  TVMFFIObject *o = init->type_index == kTVMFFITensor ? ((rvm_tensor *)init->v_obj)->owner : NULL;
  while (o && o->type_index == kTVMFFITensor) o = ((rvm_tensor *)o)->owner;
  if (o && o->type_index == RVM_TYPE_STORAGE && ((rvm_storage *)o)->allocator)
    return rvm_storage_new(((rvm_storage *)o)->allocator, nbytes);
  return rvm_storage_new_unpooled(nbytes);
}

static int checked_mul(int64_t a, int64_t b, int64_t *out) {
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, out))
    return rvm_raise("ValueError", "paged_attention_kv_cache_create: the cache's size overflows (%lld x %lld)", (long long)a, (long long)b);
  return 0;
}

static int parse_config(kv_cache *c, const TVMFFIAny *args) {
  const char *fn = "paged_attention_kv_cache_create";
  const TVMFFIShapeCell *config, *indptr, *kinds;
  int64_t v_head_dim, transfer, mode;
  if (shape_arg(fn, args, 0, &config) || shape_arg(fn, args, 1, &indptr) || int_arg(fn, args, 2, &c->num_qo_heads) ||
      int_arg(fn, args, 3, &c->num_kv_heads) || int_arg(fn, args, 4, &c->head_dim) || int_arg(fn, args, 5, &v_head_dim) ||
      shape_arg(fn, args, 6, &kinds) || int_arg(fn, args, 7, &transfer) || int_arg(fn, args, 8, &mode) ||
      float_arg(fn, args, 9, &c->rotary_scale) || float_arg(fn, args, 10, &c->rotary_theta))
    return -1;
  if (config->size != 5 && config->size != 6)
    return rvm_raise("InternalError",
                     "Check failed: (cache_config.size() == 5 || cache_config.size() == 6) is false: KV cache config must contain five "
                     "legacy fields and an optional per-layer sliding window size.");
  if (indptr->size != 2)
    return rvm_raise("InternalError", "Check failed: layer_indptr_tuple.size() == num_groups + 1 (%llu vs. 2) : ",
                     (unsigned long long)indptr->size);
  int64_t capacity = config->data[1];
  c->chunk = config->data[2];
  c->page_size = config->data[3];
  if (config->data[4] != 0) return unsupported("sliding windows (support_sliding_window = 1)");
  if (transfer) return unsupported("KV transfer between machines (enable_kv_transfer)");
  if (mode < ROPE_NONE || mode > ROPE_INLINE) return rvm_raise("ValueError", "%s: unknown RoPE mode %lld", fn, (long long)mode);
  c->rope_mode = (int32_t)mode;
  c->layer_begin = indptr->data[0];
  c->num_layers = indptr->data[1] - indptr->data[0];
  if (c->num_layers <= 0 || c->layer_begin < 0)
    return rvm_raise("ValueError", "%s: the layer partition (%lld, %lld) holds no layer", fn, (long long)indptr->data[0],
                     (long long)indptr->data[1]);
  if (c->num_qo_heads <= 0 || c->num_kv_heads <= 0 || c->head_dim <= 0 || c->num_qo_heads % c->num_kv_heads)
    return rvm_raise("ValueError", "%s: %lld query heads, %lld KV heads and head dim %lld do not make an attention layer", fn,
                     (long long)c->num_qo_heads, (long long)c->num_kv_heads, (long long)c->head_dim);
  if (v_head_dim != c->head_dim) return unsupported("a value head dim different from the key head dim (MLA)");
  if (c->page_size <= 0 || capacity <= 0 || c->chunk <= 0)
    return rvm_raise("ValueError", "%s: page_size (%lld), max_total_seq_len (%lld) and prefill_chunk_size (%lld) must be positive", fn,
                     (long long)c->page_size, (long long)capacity, (long long)c->chunk);
  if (capacity > INT32_MAX / 2 || c->chunk > INT32_MAX / 2 || c->page_size > 65536)
    return rvm_raise("ValueError", "%s: max_total_seq_len (%lld) or prefill_chunk_size (%lld) is too large", fn, (long long)capacity,
                     (long long)c->chunk);
  c->num_pages = (capacity + c->page_size - 1) / c->page_size + 1;
  if (kinds->size < (uint64_t)(c->layer_begin + c->num_layers))
    return rvm_raise("ValueError", "%s: %llu attention kinds for layers up to %lld", fn, (unsigned long long)kinds->size,
                     (long long)(c->layer_begin + c->num_layers));
  c->num_kinds = (int64_t)kinds->size;
  c->kinds = rvm_mem_alloc(sizeof(int64_t) * (size_t)c->num_kinds, "KV cache layer kinds");
  if (!c->kinds) return rvm_raise("MemoryError", "KV cache: out of memory");
  for (int64_t i = 0; i < c->num_kinds; i++) {
    c->kinds[i] = kinds->data[i];
    if (c->kinds[i] == ATTN_MLA) return unsupported("multi-head latent attention (MLA) layers");
    if (c->kinds[i] == ATTN_MHA_SLIDING) return unsupported("sliding-window attention layers");
    if (c->kinds[i] != ATTN_MHA) return unsupported("attention kinds other than MHA (linear attention)");
  }
  if (args[11].type_index == kTVMFFITensor || args[11].type_index == kTVMFFIDLTensorPtr) {
    if (c->rope_mode != ROPE_NORMAL)
      return rvm_raise("InternalError",
                       "Check failed: (rope_mode_ == RoPEMode::kNormal) is false: The RoPE mode must be normal to support RoPE extension "
                       "factors.");
    if (rvm_any_copy(&args[11], &c->ext_factors)) return -1;
  }
  DLTensor *init = rvm_as_dltensor(&args[12]);
  if (!init) return rvm_raise("TypeError", "%s: argument 12 (init) must be a Tensor, but got %s", fn, rvm_type_name(&args[12]));
  if (init->device.device_type != kDLCPU) return unsupported("devices other than the CPU");
  c->dtype = init->dtype;
  return 0;
}

static int parse_kernels(kv_cache *c, const TVMFFIAny *args) {
  c->f_append = optional_function(&args[13]);
  if (!c->f_append) return rvm_raise("InternalError", "Check failed: (f_transpose_append_mha_.has_value()) is false: ");
  TVMFFIObject *ignored = NULL;
  if (backend_function(&args[15], 15, &c->f_ragged) || backend_function(&args[16], 16, &c->f_prefill) ||
      backend_function(&args[17], 17, &c->f_decode))
    return -1;
  for (int32_t i = 18; i <= 22; i++) { /* sliding window, tree mask, MLA: parsed, never used */
    if (backend_function(&args[i], i, &ignored)) return -1;
    release_function(ignored);
  }
  if (args[23].type_index != kTVMFFIArray || ((const rvm_array *)args[23].v_obj)->cell.size == 0)
    return rvm_raise("InternalError", "Check failed: (!f_merge_inplace.empty()) is false: Merge inplace function is not defined.");
  const rvm_array *merge = (const rvm_array *)args[23].v_obj;
  if (merge->items[0].type_index != kTVMFFIFunction)
    return rvm_raise("TypeError", "paged_attention_kv_cache_create: argument 23 must hold Functions");
  c->f_merge = merge->items[0].v_obj;
  rvm_object_incref(c->f_merge);
  for (int32_t i = 24; i <= 27; i++)
    if (args[i].type_index != kTVMFFIFunction)
      return rvm_raise("TypeError", "Cannot convert from type `%s` to `ffi.Function`", rvm_type_name(&args[i]));
  c->f_rotary = args[24].v_obj;
  c->f_copy_page = args[25].v_obj;
  rvm_object_incref(c->f_rotary);
  rvm_object_incref(c->f_copy_page);
  return 0;
}

static int allocate(kv_cache *c, const TVMFFIAny *init) {
  int64_t elem = (c->dtype.bits * c->dtype.lanes + 7) / 8, page_elems, layer_bytes, all_pages;
  if (checked_mul(2 * c->num_kv_heads, c->page_size * c->head_dim, &page_elems) || checked_mul(page_elems, c->num_pages, &layer_bytes) ||
      checked_mul(layer_bytes, elem, &layer_bytes) || checked_mul(layer_bytes, c->num_layers, &all_pages))
    return -1;
  layer_bytes = (layer_bytes + 63) & ~(int64_t)63;
  all_pages = layer_bytes * c->num_layers;
  c->page_storage = storage_like(init, (uint64_t)all_pages);
  if (!c->page_storage) return -1;
  c->pages = rvm_mem_calloc((size_t)c->num_layers, sizeof(view), "KV cache page views");
  if (!c->pages) return rvm_raise("MemoryError", "KV cache: out of memory");
  int64_t page_shape[5] = {c->num_pages, 2, c->num_kv_heads, c->page_size, c->head_dim};
  /* The paged kernels want each layer's pages at offset 0 of their own tensor. */
  for (int64_t l = 0; l < c->num_layers; l++)
    set_view(&c->pages[l], (char *)c->page_storage->data + l * layer_bytes, 0, c->dtype, 5, page_shape);
  /* temporaries: q, k, v, attention output [chunk, heads, dim]; two LSEs [chunk, qo heads] */
  int64_t q_bytes, kv_bytes, lse_bytes;
  if (checked_mul(c->chunk * c->num_qo_heads, c->head_dim * elem, &q_bytes) ||
      checked_mul(c->chunk * c->num_kv_heads, c->head_dim * elem, &kv_bytes) || checked_mul(c->chunk, c->num_qo_heads * 4, &lse_bytes))
    return -1;
  int64_t sizes[6] = {q_bytes, kv_bytes, kv_bytes, q_bytes, lse_bytes, lse_bytes}, total = 0, at[6];
  for (int i = 0; i < 6; i++) {
    at[i] = total;
    total += (sizes[i] + 63) & ~(int64_t)63;
  }
  c->temp_storage = storage_like(init, (uint64_t)total);
  if (!c->temp_storage) return -1;
  char *base = c->temp_storage->data;
  c->q_base = base + at[0];
  c->k_base = base + at[1];
  c->v_base = base + at[2];
  c->out_base = base + at[3];
  c->lse_base = base + at[4];
  c->merged_base = base + at[5];
  if (ivec_reserve(&c->free_pages, c->num_pages)) return -1;
  return 0;
}

static void reset_state(kv_cache *c) {
  c->num_seqs = 0;
  c->free_pages.len = 0;
  for (int64_t p = c->num_pages - 1; p >= 0; p--) c->free_pages.data[c->free_pages.len++] = (int32_t)p;
  for (int64_t i = 0; i < c->num_blocks; i++) rvm_mem_free(c->blocks[i].pages.data);
  c->num_blocks = 0;
  c->free_blocks.len = 0;
}

/* (config, layer_indptr, qo_heads, kv_heads, qk_dim, v_dim, kinds, kv_transfer, rope_mode,
 *  rope_scale, rope_theta, ext_factors, init, kernels...) -> the cache; TVM 0.27's 28 or 29
 * arguments. */
int rvm_builtin_kv_create(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *result) {
  (void)self;
  if (n != 28 && n != 29)
    return rvm_raise("InternalError", "Check failed: (args.size() == 28 || args.size() == 29) is false: Invalid number of KV cache constructor args: %d", n);
  kv_cache *c = rvm_mem_calloc(1, sizeof(*c), "a KV cache");
  if (!c) return -1;
  c->heap = rvm_mem_owner(c);
  rvm_object_init(&c->header, rvm_type_kv_cache, kv_cache_deleter);
  if (parse_config(c, args) || parse_kernels(c, args) || allocate(c, &args[12])) {
    rvm_object_decref(&c->header);
    return -1;
  }
  reset_state(c);
  *result = rvm_obj_any(c);
  return 0;
}

/* ---- sequences -------------------------------------------------------------------------------- */

KV_METHOD(add) {
  (void)self, (void)result;
  kv_cache *c;
  int64_t id;
  if (cache_arg("vm.builtin.kv_state_add_sequence", args, n, &c) || arity("vm.builtin.kv_state_add_sequence", n, 2) ||
      int_arg("vm.builtin.kv_state_add_sequence", args, 1, &id))
    return -1;
  if (find_seq(c, id))
    return rvm_raise("InternalError",
                     "Check failed: (seq_map_.find(seq_id) == seq_map_.end()) is false: The sequence \"%lld\" is already in the KV cache.",
                     (long long)id);
  int32_t b;
  if (new_block(c, &b) || insert_seq(c, id, b)) return -1;
  c->dirty = true;
  return 0;
}

/* Frees the blocks only this sequence uses, from its last one up, and drops its reference to
 * the first shared one. */
static void release_chain(kv_cache *c, int32_t b) {
  while (b != -1 && c->blocks[b].refs == 1) {
    block *blk = &c->blocks[b];
    for (int64_t i = 0; i < blk->pages.len; i++) c->free_pages.data[c->free_pages.len++] = blk->pages.data[i];
    c->free_blocks.data[c->free_blocks.len++] = b; /* reserved: see reserve_free_blocks */
    b = blk->parent;
  }
  if (b != -1) c->blocks[b].refs--;
}

/* The free-block list can always take every block back. */
static int reserve_free_blocks(kv_cache *c) { return ivec_reserve(&c->free_blocks, c->num_blocks + 2); }

KV_METHOD(remove) {
  (void)self, (void)result;
  kv_cache *c;
  int64_t id;
  if (cache_arg("vm.builtin.kv_state_remove_sequence", args, n, &c) || arity("vm.builtin.kv_state_remove_sequence", n, 2) ||
      int_arg("vm.builtin.kv_state_remove_sequence", args, 1, &id))
    return -1;
  sequence *s = find_seq(c, id);
  if (!s) return not_found(id);
  if (reserve_free_blocks(c)) return -1;
  release_chain(c, s->last_block);
  erase_seq(c, s);
  c->dirty = true;
  return 0;
}

KV_METHOD(clear) {
  (void)self, (void)result;
  kv_cache *c;
  if (cache_arg("vm.builtin.kv_state_clear", args, n, &c) || arity("vm.builtin.kv_state_clear", n, 1)) return -1;
  reset_state(c);
  c->dirty = false;
  return 0;
}

/* Copies the first `length` slots of page `src` to page `dst` in every layer. */
static int copy_page(kv_cache *c, int32_t src, int32_t dst, int64_t length) {
  for (int64_t l = 0; l < c->num_layers; l++) {
    TVMFFIAny a[4] = {tensor_value(&c->pages[l]), rvm_int(src), rvm_int(dst), rvm_int(length)};
    if (call(c->f_copy_page, "copy_single_page", a, 4)) return -1;
  }
  return 0;
}

static int fork_seq(kv_cache *c, int64_t parent_id, int64_t child_id, int64_t pos) {
  sequence *parent = find_seq(c, parent_id);
  if (!parent)
    return rvm_raise("InternalError",
                     "Check failed: (parent_it != seq_map_.end()) is false: The parent sequence \"%lld\" cannot be found in KV cache.",
                     (long long)parent_id);
  if (find_seq(c, child_id))
    return rvm_raise("InternalError",
                     "Check failed: (seq_map_.find(child_seq_id) == seq_map_.end()) is false: The child sequence \"%lld\" is already in "
                     "the KV cache.",
                     (long long)child_id);
  if (pos < -1)
    return rvm_raise("InternalError",
                     "Check failed: fork_pos >= -1 (%lld vs. -1) : The forked position should be non-negative, or -1 for last position "
                     "as default.",
                     (long long)pos);
  if (pos > parent->seq_length)
    return rvm_raise("InternalError",
                     "Check failed: fork_pos <= parent_it->second.seq_length (%lld vs. %d) : The forked position should not exceed the "
                     "total length of parent sequence.",
                     (long long)pos, parent->seq_length);
  if (pos == -1) pos = parent->seq_length;
  /* Everything below needs at most three new blocks, one page and one sequence: make room
   * first, so that nothing fails halfway. */
  bool needs_page = pos % c->page_size != 0;
  if (needs_page && c->free_pages.len == 0) return cache_full();
  if (ivec_reserve(&c->free_blocks, c->num_blocks + 4)) return -1;
  if (c->num_blocks + 3 > c->cap_blocks) {
    int64_t cap = c->num_blocks + 16;
    block *b = rvm_mem_realloc(c->blocks, sizeof(block) * (size_t)cap, "KV cache blocks");
    if (!b) return rvm_raise("MemoryError", "KV cache: out of memory for blocks");
    c->blocks = b;
    c->cap_blocks = cap;
  }
  if (c->num_seqs == c->cap_seqs) {
    sequence *s = rvm_mem_realloc(c->seqs, sizeof(sequence) * (size_t)(c->cap_seqs * 2 + 8), "KV cache sequences");
    if (!s) return rvm_raise("MemoryError", "KV cache: out of memory for sequences");
    parent = s + (parent - c->seqs);
    c->seqs = s;
    c->cap_seqs = c->cap_seqs * 2 + 8;
  }
  int32_t nb;
  if (pos == parent->seq_length && pos % c->page_size == 0 && c->blocks[parent->last_block].seq_length > 0) {
    /* The parent continues in a new empty block, so that the full pages can be shared. */
    if (new_block(c, &nb)) return -1;
    c->blocks[nb].start_pos = parent->seq_length;
    c->blocks[nb].parent = parent->last_block;
    c->blocks[nb].refs = 1;
    parent->last_block = nb;
  }
  int32_t child;
  if (new_block(c, &child)) return -1;
  int32_t trace_buf[64];
  int64_t depth = trace_of(c, parent->last_block, trace_buf, 64);
  int32_t *trace = trace_buf;
  if (depth > 64) {
    trace = rvm_mem_alloc(sizeof(int32_t) * (size_t)depth, "a KV cache block trace");
    if (!trace) return rvm_raise("MemoryError", "KV cache: out of memory");
    trace_of(c, parent->last_block, trace, depth);
  }
  int64_t offset = pos;
  int rc = 0;
  for (int64_t k = 0; k < depth; k++) {
    int32_t fb = trace[k];
    if (k + 1 < depth && c->blocks[fb].seq_length <= offset) {
      offset -= c->blocks[fb].seq_length;
      continue;
    }
    int64_t in_page = offset % c->page_size, moved = offset - in_page, moved_pages = moved / c->page_size;
    if (moved_pages == 0) {
      int32_t pb = c->blocks[fb].parent;
      if (pb != -1) c->blocks[pb].refs++;
      c->blocks[child].parent = pb;
    } else {
      /* Split the forked block: its first pages become a shared block in front of it. */
      int32_t shared;
      if ((rc = new_block(c, &shared)) != 0) break;
      block *f = &c->blocks[fb], *s = &c->blocks[shared];
      if ((rc = ivec_reserve(&s->pages, moved_pages)) != 0) break;
      s->parent = f->parent;
      f->parent = shared;
      c->blocks[child].parent = shared;
      s->refs = 2;
      memcpy(s->pages.data, f->pages.data, sizeof(int32_t) * (size_t)moved_pages);
      s->pages.len = moved_pages;
      memmove(f->pages.data, f->pages.data + moved_pages, sizeof(int32_t) * (size_t)(f->pages.len - moved_pages));
      f->pages.len -= moved_pages;
      s->start_pos = f->start_pos;
      f->start_pos += (int32_t)moved;
      s->seq_length = (int32_t)moved;
      f->seq_length -= (int32_t)moved;
    }
    block *cb = &c->blocks[child];
    cb->start_pos = (int32_t)(pos - in_page);
    cb->seq_length = (int32_t)in_page;
    if (in_page > 0) {
      if ((rc = ivec_push(&cb->pages, take_page(c))) != 0) break;
      rc = copy_page(c, c->blocks[fb].pages.data[0], ivec_back(&c->blocks[child].pages), in_page);
    }
    break;
  }
  if (trace != trace_buf) rvm_mem_free(trace);
  if (rc) return rc;
  if (insert_seq(c, child_id, child)) return -1;
  c->dirty = true;
  return 0;
}

KV_METHOD(fork) {
  (void)self, (void)result;
  const char *fn = "vm.builtin.kv_state_fork_sequence";
  kv_cache *c;
  int64_t parent, child, pos;
  if (cache_arg(fn, args, n, &c) || arity(fn, n, 4) || int_arg(fn, args, 1, &parent) || int_arg(fn, args, 2, &child) ||
      int_arg(fn, args, 3, &pos))
    return -1;
  return fork_seq(c, parent, child, pos);
}

KV_METHOD(popn) {
  (void)self, (void)result;
  const char *fn = "vm.builtin.kv_state_popn";
  kv_cache *c;
  int64_t id, count;
  if (cache_arg(fn, args, n, &c) || arity(fn, n, 3) || int_arg(fn, args, 1, &id) || int_arg(fn, args, 2, &count)) return -1;
  sequence *s = find_seq(c, id);
  if (!s) return not_found(id);
  if (count < 0)
    return rvm_raise("InternalError", "Check failed: n >= 0 (%lld vs. 0) : The length of popping %lld cannot be negative.",
                     (long long)count, (long long)count);
  if (count > s->seq_length)
    return rvm_raise("InternalError",
                     "Check failed: n <= it->second.seq_length (%lld vs. %d) : The sequence only has length %d, while the length of pop "
                     "is %lld which exceeds the whole sequence length.",
                     (long long)count, s->seq_length, s->seq_length, (long long)count);
  if (count == 0) return 0;
  if (reserve_free_blocks(c)) return -1;
  int32_t b = s->last_block;
  while (b != -1 && c->blocks[b].refs == 1) {
    block *blk = &c->blocks[b];
    if (count > blk->seq_length) {
      count -= blk->seq_length;
      s->seq_length -= blk->seq_length;
      for (int64_t i = 0; i < blk->pages.len; i++) c->free_pages.data[c->free_pages.len++] = blk->pages.data[i];
      c->free_blocks.data[c->free_blocks.len++] = b;
      b = blk->parent;
      s->last_block = b;
      continue;
    }
    int64_t keep = pages_for(c, blk->seq_length - count);
    while (blk->pages.len > keep) c->free_pages.data[c->free_pages.len++] = blk->pages.data[--blk->pages.len];
    s->seq_length -= (int32_t)count;
    blk->seq_length -= (int32_t)count;
    count = 0;
    break;
  }
  if (count) {
    /* The rest lies in blocks shared with other sequences: continue from a fork at the new end,
     * as TVM does (under the temporary id -1 - id). */
    int64_t temp = -1 - id;
    if (find_seq(c, temp)) return rvm_raise("InternalError", "KV cache: popn needs sequence id %lld, which is taken", (long long)temp);
    if (fork_seq(c, id, temp, s->seq_length - count)) return -1;
    s = find_seq(c, id);
    release_chain(c, s->last_block);
    erase_seq(c, s);
    find_seq(c, temp)->id = id;
  }
  c->dirty = true;
  return 0;
}

/* ---- begin_forward --------------------------------------------------------------------------- */

/* The chunks of depth d: one entry per sequence, or adjacent sequences sharing a block merged
 * into one (TVM's GetChunkedBlockIds). Entries go to out_blocks/out_lengths. */
static int chunk_depth(kv_cache *c, const int32_t *ids, bool coalesce, ivec *out_blocks, ivec *out_lengths, bool *use_decode,
                       bool is_decode) {
  int64_t pages_each = 0, pages_merged = 0;
  out_blocks->len = out_lengths->len = 0;
  for (int64_t i = 0; i < c->batch; i++)
    if (ids[i] != -1) pages_each += c->blocks[ids[i]].pages.len;
  /* merged entries */
  int32_t cur = ids[0];
  int64_t run = c->cur_lengths[0];
  ivec mb = {0}, ml = {0};
  int rc = 0;
  for (int64_t i = 1; i < c->batch && rc == 0; i++) {
    if (ids[i] == cur) {
      run += c->cur_lengths[i];
      continue;
    }
    rc = ivec_push(&mb, cur) || ivec_push(&ml, (int32_t)run);
    if (cur != -1) pages_merged += c->blocks[cur].pages.len;
    cur = ids[i];
    run = c->cur_lengths[i];
  }
  if (rc == 0) rc = ivec_push(&mb, cur) || ivec_push(&ml, (int32_t)run);
  if (cur != -1) pages_merged += c->blocks[cur].pages.len;
  double ratio = pages_merged > 0 ? 1.0 * (double)pages_each / (double)pages_merged : 0.0;
  *use_decode = is_decode && ratio < 32;
  if (rc == 0) {
    if (*use_decode || !coalesce) {
      rc = ivec_reserve(out_blocks, c->batch) || ivec_reserve(out_lengths, c->batch);
      for (int64_t i = 0; rc == 0 && i < c->batch; i++) {
        out_blocks->data[out_blocks->len++] = ids[i];
        out_lengths->data[out_lengths->len++] = (int32_t)c->cur_lengths[i];
      }
    } else {
      rc = ivec_reserve(out_blocks, mb.len) || ivec_reserve(out_lengths, ml.len);
      for (int64_t i = 0; rc == 0 && i < mb.len; i++) {
        out_blocks->data[out_blocks->len++] = mb.data[i];
        out_lengths->data[out_lengths->len++] = ml.data[i];
      }
    }
  }
  rvm_mem_free(mb.data);
  rvm_mem_free(ml.data);
  return rc ? rvm_raise("MemoryError", "KV cache: out of memory") : 0;
}

/* Grows the last block of a sequence by `length` tokens, taking pages from the free list (the
 * caller checked there are enough). */
static int reserve_tokens(kv_cache *c, sequence *s, int64_t length) {
  block *b = &c->blocks[s->last_block];
  int64_t want = pages_for(c, b->seq_length + length);
  if (ivec_reserve(&b->pages, want)) return -1;
  while (b->pages.len < want) b->pages.data[b->pages.len++] = take_page(c);
  b->seq_length += (int32_t)length;
  c->dirty = true;
  return 0;
}

/* The page tables of depth d from its chunks (TVM's BeginForward, P:1205-1351). */
static int build_depth(kv_cache *c, int d, const ivec *blocks, const ivec *lengths, int32_t *const *trailing, const int64_t *num_trailing) {
  ivec *qo = &c->qo_indptr[d], *pi = &c->page_indptr[d], *pv = &c->page_indices[d], *lp = &c->last_page_len[d],
       *kr = &c->k_rope_offset[d];
  qo->len = pi->len = pv->len = lp->len = kr->len = 0;
  if (ivec_push(qo, 0) || ivec_push(pi, 0)) return -1;
  for (int64_t i = 0; i < blocks->len; i++) {
    int32_t id = blocks->data[i];
    if (ivec_push(qo, ivec_back(qo) + lengths->data[i])) return -1;
    if (id == -1) {
      if (ivec_push(pi, ivec_back(pi)) || ivec_push(lp, 0) || ivec_push(kr, 0)) return -1;
      continue;
    }
    const block *b = &c->blocks[id];
    int64_t pages = b->pages.len, total = b->seq_length;
    for (int64_t k = 0; k < b->pages.len; k++)
      if (ivec_push(pv, b->pages.data[k])) return -1;
    if (d == MAX_DEPTH - 1) {
      /* the deepest depth also carries the blocks below it */
      for (int64_t t = 0; t < num_trailing[i]; t++) {
        const block *tb = &c->blocks[trailing[i][t]];
        for (int64_t k = 0; k < tb->pages.len; k++)
          if (ivec_push(pv, tb->pages.data[k])) return -1;
        pages += tb->pages.len;
        total += tb->seq_length;
      }
    }
    if (ivec_push(pi, ivec_back(pi) + (int32_t)pages) || ivec_push(lp, total == 0 ? 0 : (int32_t)((total - 1) % c->page_size + 1)) ||
        ivec_push(kr, b->start_pos))
      return -1;
  }
  return 0;
}

static int begin_forward(kv_cache *c, const TVMFFIShapeCell *ids, const TVMFFIShapeCell *lengths) {
  if (ids->size != lengths->size)
    return rvm_raise("InternalError", "Check failed: seq_ids.size() == append_lengths.size() (%llu vs. %llu) : The seq_ids size (%llu) and append_lengths size (%llu) mismatch.",
                     (unsigned long long)ids->size, (unsigned long long)lengths->size, (unsigned long long)ids->size,
                     (unsigned long long)lengths->size);
  int64_t batch = (int64_t)ids->size;
  if (batch == 0) return rvm_raise("ValueError", "kv_state_begin_forward: the batch is empty (TVM crashes here)");
  /* Check everything before changing anything. */
  int64_t total = 0, pages_needed = 0;
  for (int64_t i = 0; i < batch; i++) {
    sequence *s = find_seq(c, ids->data[i]);
    if (!s) return not_found(ids->data[i]);
    for (int64_t j = 0; j < i; j++)
      if (ids->data[j] == ids->data[i])
        return rvm_raise("ValueError", "kv_state_begin_forward: sequence %lld appears twice in the batch", (long long)ids->data[i]);
    if (lengths->data[i] <= 0)
      return rvm_raise("InternalError", "Check failed: append_length > 0 (%lld vs. 0) : Append with length 0 is not allowed.",
                       (long long)lengths->data[i]);
    const block *b = &c->blocks[s->last_block];
    if (b->refs != 1)
      return rvm_raise("InternalError",
                       "Check failed: block.external_ref_cnt == 1 (%d vs. 1) : The block is %d-time referenced by other blocks, thus "
                       "cannot accept new KV values.",
                       b->refs, b->refs - 1);
    if (lengths->data[i] > INT32_MAX - total) return cache_full();
    total += lengths->data[i];
    pages_needed += pages_for(c, b->seq_length + lengths->data[i]) - b->pages.len;
  }
  if (pages_needed > c->free_pages.len) return cache_full();
  if (total > c->chunk)
    return rvm_raise("ValueError",
                     "kv_state_begin_forward: %lld tokens in one forward pass, more than the cache's prefill_chunk_size (%lld): send "
                     "long prompts in chunks",
                     (long long)total, (long long)c->chunk);
  if (batch > c->cap_batch) {
    int64_t *p = rvm_mem_realloc(c->cur_lengths, sizeof(int64_t) * (size_t)batch, "KV cache batch lengths");
    if (!p) return rvm_raise("MemoryError", "KV cache: out of memory");
    c->cur_lengths = p;
    c->cap_batch = batch;
  }
  c->batch = batch;
  c->total = total;
  memcpy(c->cur_lengths, lengths->data, sizeof(int64_t) * (size_t)batch);

  /* Per sequence: where its tokens start, and its blocks by depth (root first, at most two;
   * deeper blocks trail the second). */
  int rc = 0;
  bool is_decode = true;
  int32_t *depth_ids = rvm_mem_alloc(sizeof(int32_t) * (size_t)batch * MAX_DEPTH, "KV cache depth tables");
  int32_t **trailing = rvm_mem_calloc((size_t)batch, sizeof(int32_t *), "KV cache depth tables");
  int64_t *num_trailing = rvm_mem_calloc((size_t)batch, sizeof(int64_t), "KV cache depth tables");
  c->k_ragged_offset.len = 0;
  if (!depth_ids || !trailing || !num_trailing || ivec_reserve(&c->k_ragged_offset, batch)) rc = rvm_raise("MemoryError", "KV cache: out of memory");
  int num_depths = 0;
  int64_t advanced = 0, reserved = 0; /* sequences lengthened, and given their pages: undone on failure */
  for (int64_t i = 0; rc == 0 && i < batch; i++) {
    sequence *s = find_seq(c, ids->data[i]);
    c->k_ragged_offset.data[c->k_ragged_offset.len++] = s->seq_length;
    s->seq_length += (int32_t)lengths->data[i];
    advanced++;
    if (lengths->data[i] != 1) is_decode = false;
    int64_t n = trace_of(c, s->last_block, NULL, 0);
    int32_t *trace = rvm_mem_alloc(sizeof(int32_t) * (size_t)n, "a KV cache block trace");
    if (!trace) {
      rc = rvm_raise("MemoryError", "KV cache: out of memory");
      break;
    }
    trace_of(c, s->last_block, trace, n);
    for (int d = 0; d < MAX_DEPTH; d++) depth_ids[d * batch + i] = d < n ? trace[d] : -1;
    if (n > MAX_DEPTH) {
      num_trailing[i] = n - MAX_DEPTH;
      memmove(trace, trace + MAX_DEPTH, sizeof(int32_t) * (size_t)(n - MAX_DEPTH));
      trailing[i] = trace;
    } else {
      rvm_mem_free(trace);
    }
    int depth = n < MAX_DEPTH ? (int)n : MAX_DEPTH;
    if (depth > num_depths) num_depths = depth;
  }
  c->num_depths = num_depths;
  /* chunks per depth; the deepest one never coalesces (its trailing blocks differ) */
  ivec *chunks_b = rvm_mem_calloc(MAX_DEPTH, sizeof(ivec), "KV cache chunk tables"),
       *chunks_l = rvm_mem_calloc(MAX_DEPTH, sizeof(ivec), "KV cache chunk tables");
  if (!chunks_b || !chunks_l) rc = rc ? rc : rvm_raise("MemoryError", "KV cache: out of memory");
  for (int d = 0; rc == 0 && d < num_depths; d++)
    rc = chunk_depth(c, depth_ids + d * batch, d != MAX_DEPTH - 1, &chunks_b[d], &chunks_l[d], &c->use_decode[d], is_decode);
  c->append_before_attn = num_depths > 0 && c->use_decode[num_depths - 1];
  if (rc == 0 && c->append_before_attn)
    for (int64_t i = 0; rc == 0 && i < batch; i++)
      if ((rc = reserve_tokens(c, find_seq(c, ids->data[i]), lengths->data[i])) == 0) reserved++;
  for (int d = 0; rc == 0 && d < num_depths; d++) rc = build_depth(c, d, &chunks_b[d], &chunks_l[d], trailing, num_trailing);
  if (rc == 0 && !c->append_before_attn)
    for (int64_t i = 0; rc == 0 && i < batch; i++)
      if ((rc = reserve_tokens(c, find_seq(c, ids->data[i]), lengths->data[i])) == 0) reserved++;
  /* positions: RoPE position of each new token, and the page slot it is written to */
  c->q_rope_position.len = c->append_position.len = c->minus_ones.len = 0;
  if (rc == 0 && (ivec_reserve(&c->q_rope_position, total) || ivec_reserve(&c->append_position, total) ||
                  ivec_reserve(&c->minus_ones, total)))
    rc = -1;
  for (int64_t i = 0; rc == 0 && i < batch; i++) {
    const block *b = &c->blocks[find_seq(c, ids->data[i])->last_block];
    for (int64_t j = 0; j < lengths->data[i]; j++) {
      int64_t in_block = b->seq_length - lengths->data[i] + j;
      c->q_rope_position.data[c->q_rope_position.len++] = (int32_t)(c->k_ragged_offset.data[i] + j);
      c->append_position.data[c->append_position.len++] =
          (int32_t)(b->pages.data[in_block / c->page_size] * c->page_size + in_block % c->page_size);
      c->minus_ones.data[c->minus_ones.len++] = -1;
    }
  }
  for (int d = 0; d < MAX_DEPTH; d++) {
    if (chunks_b) rvm_mem_free(chunks_b[d].data);
    if (chunks_l) rvm_mem_free(chunks_l[d].data);
  }
  if (rc != 0) {
    /* Out of memory half way (every other failure is caught before anything changes): put the
     * sequences back as they were, so the cache stays usable. */
    for (int64_t i = 0; i < reserved; i++) {
      block *b = &c->blocks[find_seq(c, ids->data[i])->last_block];
      b->seq_length -= (int32_t)lengths->data[i];
      while (b->pages.len > pages_for(c, b->seq_length)) c->free_pages.data[c->free_pages.len++] = b->pages.data[--b->pages.len];
    }
    for (int64_t i = 0; i < advanced; i++) find_seq(c, ids->data[i])->seq_length -= (int32_t)lengths->data[i];
    c->batch = 0;
  }
  rvm_mem_free(chunks_b);
  rvm_mem_free(chunks_l);
  if (trailing)
    for (int64_t i = 0; i < batch; i++) rvm_mem_free(trailing[i]);
  rvm_mem_free(trailing);
  rvm_mem_free(num_trailing);
  rvm_mem_free(depth_ids);
  c->dirty = true;
  return rc;
}

KV_METHOD(begin) {
  (void)self, (void)result;
  const char *fn = "vm.builtin.kv_state_begin_forward";
  kv_cache *c;
  if (cache_arg(fn, args, n, &c)) return -1;
  if (n != 3 && n != 4)
    return rvm_raise("InternalError", "Check failed: (args.size() == 3 || args.size() == 4) is false: KVState BeginForward only accepts 3 or 4 arguments");
  if (n == 4 && args[3].type_index != kTVMFFINone) return unsupported("token trees (speculative decoding)");
  const TVMFFIShapeCell *ids, *lengths;
  if (shape_arg(fn, args, 1, &ids) || shape_arg(fn, args, 2, &lengths)) return -1;
  return begin_forward(c, ids, lengths);
}

KV_METHOD(end) {
  (void)self, (void)result;
  kv_cache *c;
  return cache_arg("vm.builtin.kv_state_end_forward", args, n, &c) || arity("vm.builtin.kv_state_end_forward", n, 1);
}

/* ---- the staging buffer ---------------------------------------------------------------------- */

typedef struct {
  const ivec *src;
  view *dst;
} staged;

/* Lays the host arrays out in one int32 buffer as TVM's cached aux manager does (each at a
 * 16-byte aligned element offset, in TVM's order) and points the views at them. */
static int sync_aux(kv_cache *c) {
  if (!c->dirty) return 0;
  if (c->batch == 0) return rvm_raise("ValueError", "KV cache: attention before any kv_state_begin_forward");
  c->cur_indptr.len = 0;
  if (ivec_push(&c->cur_indptr, 0)) return -1;
  for (int64_t i = 0; i < c->batch; i++)
    if (ivec_push(&c->cur_indptr, ivec_back(&c->cur_indptr) + (int32_t)c->cur_lengths[i])) return -1;
  staged order[4 + 5 * MAX_DEPTH + 1];
  int k = 0;
  order[k++] = (staged){&c->q_rope_position, &c->v_qpos};
  for (int d = 0; d < c->num_depths; d++) order[k++] = (staged){&c->qo_indptr[d], &c->v_qo_indptr[d]};
  for (int d = 0; d < c->num_depths; d++) order[k++] = (staged){&c->page_indptr[d], &c->v_page_indptr[d]};
  for (int d = 0; d < c->num_depths; d++) order[k++] = (staged){&c->page_indices[d], &c->v_page_indices[d]};
  for (int d = 0; d < c->num_depths; d++) order[k++] = (staged){&c->last_page_len[d], &c->v_length_info[d]};
  for (int d = 0; d < c->num_depths; d++) order[k++] = (staged){&c->k_rope_offset[d], &c->v_k_rope[d]};
  order[k++] = (staged){&c->cur_indptr, &c->v_cur_indptr};
  order[k++] = (staged){&c->k_ragged_offset, &c->v_k_ragged};
  order[k++] = (staged){&c->append_position, &c->v_append};
  /* the two KV-transfer maps (all -1) follow, as in TVM; nothing reads them on the CPU */
  int64_t need = 0;
  for (int i = 0; i < k; i++) need += (order[i].src->len + 3) & ~(int64_t)3;
  need += 2 * ((c->minus_ones.len + 3) & ~(int64_t)3);
  if (need > c->staging_cap) {
    int64_t cap = c->staging_cap ? c->staging_cap : 1024;
    while (cap < need) cap *= 2;
    int32_t *p = rvm_mem_aligned(sizeof(int32_t) * (size_t)cap, 64, "KV cache staging");
    if (!p) return rvm_raise("MemoryError", "KV cache: out of memory for the auxiliary arrays");
    rvm_mem_free(c->staging);
    c->staging = p;
    c->staging_cap = cap;
  }
  int64_t off = 0;
  for (int i = 0; i < k; i++) {
    const ivec *v = order[i].src;
    if (v->len) memcpy(c->staging + off, v->data, sizeof(int32_t) * (size_t)v->len);
    set_view(order[i].dst, c->staging, (uint64_t)off * 4, INT32, 1, &v->len);
    off += (v->len + 3) & ~(int64_t)3;
  }
  for (int copy = 0; copy < 2; copy++) {
    if (c->minus_ones.len) memcpy(c->staging + off, c->minus_ones.data, sizeof(int32_t) * (size_t)c->minus_ones.len);
    off += (c->minus_ones.len + 3) & ~(int64_t)3;
  }
  int64_t qshape[3] = {c->total, c->num_qo_heads, c->head_dim}, kvshape[3] = {c->total, c->num_kv_heads, c->head_dim},
          lseshape[2] = {c->total, c->num_qo_heads};
  set_view(&c->v_q, c->q_base, 0, c->dtype, 3, qshape);
  set_view(&c->v_k, c->k_base, 0, c->dtype, 3, kvshape);
  set_view(&c->v_v, c->v_base, 0, c->dtype, 3, kvshape);
  set_view(&c->v_out, c->out_base, 0, c->dtype, 3, qshape);
  set_view(&c->v_lse, c->lse_base, 0, FLOAT32, 2, lseshape);
  set_view(&c->v_merged, c->merged_base, 0, FLOAT32, 2, lseshape);
  c->dirty = false;
  return 0;
}

/* ---- attention ------------------------------------------------------------------------------- */

static int layer_of(kv_cache *c, const char *fn, int64_t layer, int64_t *local) {
  *local = layer - c->layer_begin;
  if (*local < 0 || *local >= c->num_layers)
    return rvm_raise("InternalError", "%s: layer %lld is not one of this cache's layers [%lld, %lld)", fn, (long long)layer,
                     (long long)c->layer_begin, (long long)(c->layer_begin + c->num_layers));
  return 0;
}

static int64_t rot(const kv_cache *c) { return c->rope_mode == ROPE_INLINE; }

/* The ragged kernel: the new tokens attend to each other (causally). */
static int self_attend(kv_cache *c, DLTensor *q, DLTensor *k, DLTensor *v, DLTensor *o, DLTensor *lse, double sm) {
  TVMFFIAny a[14] = {dl_value(q),
                     tensor_value(&c->v_cur_indptr),
                     dl_value(k),
                     dl_value(v),
                     tensor_value(&c->v_cur_indptr),
                     tensor_value(&c->v_qpos),
                     tensor_value(&c->v_k_ragged),
                     dl_value(o),
                     dl_value(lse),
                     rvm_int(1),
                     rvm_int(rot(c)),
                     float_value(c->rotary_scale),
                     float_value(c->rotary_theta),
                     float_value(sm)};
  return call(c->f_ragged, "ragged prefill attention", a, 14);
}

/* TVM's paged decode kernel runs its sequences one after another on one thread. Each sequence's
 * output and lse depend on that sequence's rows alone, so the batch is cut into runs of sequences
 * and the kernel called on each run in parallel, with views of the per-sequence arrays: the same
 * bits as one call, at any thread count. A run starts where every view it shifts stays 64-byte
 * aligned (the kernel's q, output and lse take no element offset). */
typedef struct decode_split {
  kv_cache *c;
  int64_t local, depth, granule;
  DLTensor *q, *out, *lse;
  double sm;
  atomic_int failed;
  char kind[32], message[512];
} decode_split;

static DLTensor shifted(const DLTensor *t, int64_t first, int64_t rows, int64_t *shape) {
  DLTensor v = *t;
  int64_t row_bytes = (int64_t)(t->dtype.bits / 8) * t->dtype.lanes;
  for (int32_t i = 1; i < t->ndim; i++) row_bytes *= t->shape[i];
  for (int32_t i = 0; i < t->ndim; i++) shape[i] = i ? t->shape[i] : rows;
  v.shape = shape;
  v.strides = NULL;
  v.data = (char *)t->data + t->byte_offset + first * row_bytes;
  v.byte_offset = 0;
  return v;
}

static DLTensor sliced(const view *v, int64_t first, int64_t count, int64_t *shape) {
  DLTensor t = v->t;
  shape[0] = count;
  t.shape = shape;
  t.byte_offset += (uint64_t)first * 4;
  return t;
}

static int decode_run(int task, TVMParallelGroupEnv *env, void *cdata) {
  decode_split *s = cdata;
  kv_cache *c = s->c;
  int64_t units = (c->batch + s->granule - 1) / s->granule, per = units / env->num_task, extra = units % env->num_task;
  int64_t u0 = task * per + (task < extra ? task : extra), u1 = u0 + per + (task < extra ? 1 : 0);
  int64_t b0 = u0 * s->granule, b1 = u1 * s->granule < c->batch ? u1 * s->granule : c->batch;
  if (b0 >= b1) return 0;
  int64_t n = b1 - b0, qs[3], os[3], ls[2], ps[1], li[1], kr[1], qp[1];
  DLTensor q = shifted(s->q, b0, n, qs), out = shifted(s->out, b0, n, os), lse = shifted(s->lse, b0, n, ls);
  DLTensor indptr = sliced(&c->v_page_indptr[s->depth], b0, n + 1, ps), length = sliced(&c->v_length_info[s->depth], b0, n, li),
           k_rope = sliced(&c->v_k_rope[s->depth], b0, n, kr), q_pos = sliced(&c->v_qpos, b0, n, qp);
  TVMFFIAny a[13] = {dl_value(&q), tensor_value(&c->pages[s->local]), dl_value(&indptr), tensor_value(&c->v_page_indices[s->depth]),
                     dl_value(&length), dl_value(&k_rope), dl_value(&q_pos), dl_value(&out),
                     dl_value(&lse), rvm_int(rot(c)), float_value(c->rotary_scale), float_value(c->rotary_theta), float_value(s->sm)};
  if (call(c->f_decode, "paged decode attention", a, 13) && atomic_exchange(&s->failed, 1) == 0) {
    snprintf(s->kind, sizeof s->kind, "%s", rvm_error_kind());
    snprintf(s->message, sizeof s->message, "%s", rvm_error_message());
  }
  return 0;
}

static int decode_attention(kv_cache *c, int64_t local, int d, DLTensor *q, DLTensor *out, DLTensor *lse, double sm) {
  /* Sequences per unit such that a unit's rows of q/out (heads x dim values) and of lse (heads
   * floats) are whole multiples of 64 bytes. */
  int64_t esize = c->dtype.bits / 8, granule = 1;
  while (granule <= 64 && ((granule * c->num_qo_heads * 4) % 64 || (granule * c->num_qo_heads * c->head_dim * esize) % 64)) granule *= 2;
  int threads = rvm_parallel_threads();
  bool split = threads > 1 && granule <= 64 && c->batch >= 2 * granule && q->ndim == 3 && out->ndim == 3 && lse->ndim == 2 &&
               ((uintptr_t)q->data + q->byte_offset) % 64 == 0 && ((uintptr_t)out->data + out->byte_offset) % 64 == 0 &&
               ((uintptr_t)lse->data + lse->byte_offset) % 64 == 0;
  decode_split s = {.c = c, .local = local, .depth = d, .granule = split ? granule : c->batch, .q = q, .out = out, .lse = lse, .sm = sm};
  atomic_init(&s.failed, 0);
  if (split) {
    int64_t units = (c->batch + granule - 1) / granule;
    TVMBackendParallelLaunch(decode_run, &s, (int)(units < threads ? units : threads));
  } else { /* one run: the whole batch, on this thread */
    atomic_int counter = 0;
    TVMParallelGroupEnv one = {&counter, 1};
    decode_run(0, &one, &s);
  }
  if (atomic_load(&s.failed)) return rvm_raise(s.kind, "%s", s.message);
  return 0;
}

/* The paged kernels over each depth, merged into o (TVM's AttentionInternal). */
static int attend(kv_cache *c, int64_t local, DLTensor *q, DLTensor *k, DLTensor *v, DLTensor *o, double sm) {
  bool first = true;
  if (!c->append_before_attn) {
    if (self_attend(c, q, k, v, o, &c->v_merged.t, sm)) return -1;
    first = false;
  }
  bool computed = !first;
  for (int d = 0; d < c->num_depths; d++) {
    if (c->page_indices[d].len == 0) continue;
    DLTensor *out = first ? o : &c->v_out.t, *lse = first ? &c->v_merged.t : &c->v_lse.t;
    int rc;
    if (c->use_decode[d]) {
      rc = decode_attention(c, local, d, q, out, lse, sm);
    } else {
      TVMFFIAny a[15] = {dl_value(q), tensor_value(&c->v_qo_indptr[d]), tensor_value(&c->pages[local]), tensor_value(&c->v_page_indptr[d]),
                         tensor_value(&c->v_page_indices[d]), tensor_value(&c->v_length_info[d]), tensor_value(&c->v_k_rope[d]),
                         tensor_value(&c->v_qpos), dl_value(out), dl_value(lse), rvm_int(0), rvm_int(rot(c)),
                         float_value(c->rotary_scale), float_value(c->rotary_theta), float_value(sm)};
      rc = call(c->f_prefill, "paged prefill attention", a, 15);
    }
    if (rc) return -1;
    if (!first) {
      TVMFFIAny a[4] = {dl_value(o), tensor_value(&c->v_merged), tensor_value(&c->v_out), tensor_value(&c->v_lse)};
      if (call(c->f_merge, "merge", a, 4)) return -1;
    }
    first = false;
    computed = true;
  }
  if (!computed) return rvm_raise("InternalError", "Check failed: (self_attn_computed || cross_attn_computed) is false: Both self-attention and cross-attention are not computed.");
  return 0;
}

static int expect_dims(const char *fn, const char *what, const DLTensor *t, int32_t ndim, const int64_t *dims) {
  bool ok = t->ndim == ndim;
  for (int32_t i = 0; ok && i < ndim; i++) ok = dims[i] < 0 || t->shape[i] == dims[i];
  if (ok) return 0;
  char got[128] = "", want[128] = "";
  size_t g = 0, w = 0;
  for (int32_t i = 0; i < t->ndim && g < sizeof got; i++) g += (size_t)snprintf(got + g, sizeof got - g, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
  for (int32_t i = 0; i < ndim && w < sizeof want; i++)
    w += (size_t)(dims[i] < 0 ? snprintf(want + w, sizeof want - w, "%s_", i ? ", " : "") : snprintf(want + w, sizeof want - w, "%s%lld", i ? ", " : "", (long long)dims[i]));
  return rvm_raise("ValueError", "%s: %s has shape (%s), expected (%s)", fn, what, got, want);
}

/* (kv, layer, sm_scale, qkv[N, Hq+2Hkv, D], o[N, Hq, D]): attention of the step's tokens, their
 * K/V appended to the cache. */
KV_METHOD(fused_qkv) {
  (void)self, (void)result;
  const char *fn = "vm.builtin.attention_kv_cache_attention_with_fused_qkv";
  kv_cache *c;
  int64_t layer, local;
  double sm;
  DLTensor *qkv, *o;
  if (cache_arg(fn, args, n, &c) || arity(fn, n, 5) || int_arg(fn, args, 1, &layer) || float_arg(fn, args, 2, &sm) ||
      tensor_arg(fn, args, 3, &qkv) || tensor_arg(fn, args, 4, &o) || layer_of(c, fn, layer, &local))
    return -1;
  if (!dtype_eq(qkv->dtype, c->dtype) || !dtype_eq(o->dtype, c->dtype))
    return rvm_raise("InternalError", "%s: qkv and o must have the cache's dtype", fn);
  int64_t qkv_dims[3] = {-1, c->num_qo_heads + 2 * c->num_kv_heads, c->head_dim}, o_dims[3] = {qkv->ndim == 3 ? qkv->shape[0] : -1, c->num_qo_heads, c->head_dim};
  if (expect_dims(fn, "qkv", qkv, 3, qkv_dims) || expect_dims(fn, "o", o, 3, o_dims)) return -1;
  if (sync_aux(c)) return -1;
  if (c->total > qkv->shape[0])
    return rvm_raise("InternalError", "Check failed: total_seq_length <= qkv_data->shape[0] (%lld vs. %lld) : ", (long long)c->total,
                     (long long)qkv->shape[0]);
  /* The step's rows of qkv and o (all of them unless the caller padded). */
  DLTensor qkv_view = *qkv, o_view = *o;
  int64_t qkv_shape[3] = {c->total, qkv->shape[1], qkv->shape[2]}, o_shape[3] = {c->total, o->shape[1], o->shape[2]};
  qkv_view.shape = qkv_shape;
  qkv_view.strides = NULL;
  o_view.shape = o_shape;
  o_view.strides = NULL;
  TVMFFIAny rope = c->ext_factors.type_index != kTVMFFINone ? c->ext_factors : rvm_int(c->rope_mode == ROPE_NORMAL);
  TVMFFIAny split[6] = {dl_value(&qkv_view), tensor_value(&c->v_qpos), tensor_value(&c->v_q), tensor_value(&c->v_k), tensor_value(&c->v_v), rope};
  if (call(c->f_rotary, "split_rotary", split, 6)) return -1;
  TVMFFIAny append[4] = {tensor_value(&c->pages[local]), tensor_value(&c->v_k), tensor_value(&c->v_v), tensor_value(&c->v_append)};
  if (c->append_before_attn && call(c->f_append, "transpose_append", append, 4)) return -1;
  if (attend(c, local, &c->v_q.t, &c->v_k.t, &c->v_v.t, &o_view, sm)) return -1;
  if (!c->append_before_attn && call(c->f_append, "transpose_append", append, 4)) return -1;
  return 0;
}

/* (kv, layer, sm_scale, q, k, v, o, lse): ragged self-attention of the step's tokens only. */
KV_METHOD(self_attention) {
  (void)self, (void)result;
  const char *fn = "vm.builtin.attention_kv_cache_self_attention";
  kv_cache *c;
  int64_t layer, local;
  double sm;
  DLTensor *t[5];
  if (cache_arg(fn, args, n, &c) || arity(fn, n, 8) || int_arg(fn, args, 1, &layer) || float_arg(fn, args, 2, &sm) ||
      layer_of(c, fn, layer, &local))
    return -1;
  for (int i = 0; i < 5; i++)
    if (tensor_arg(fn, args, 3 + i, &t[i])) return -1;
  for (int i = 0; i < 4; i++)
    if (!dtype_eq(t[i]->dtype, c->dtype)) return rvm_raise("InternalError", "%s: q, k, v and o must have the cache's dtype", fn);
  if (sync_aux(c)) return -1;
  static const char *const names[5] = {"q", "k", "v", "o", "lse"};
  for (int i = 0; i < 5; i++) {
    int64_t dims[3] = {c->total, -1, -1};
    if (expect_dims(fn, names[i], t[i], i == 4 ? 2 : 3, dims)) return -1;
  }
  return self_attend(c, t[0], t[1], t[2], t[3], t[4], sm);
}

/* (kv) -> int32 [total]: the RoPE positions of the step's tokens. TVM returns a view of its
 * staging buffer, which the next step overwrites; this is a copy with the same values, so it
 * stays valid. */
KV_METHOD(query_positions) {
  (void)self;
  kv_cache *c;
  if (cache_arg("vm.builtin.attention_kv_cache_get_query_positions", args, n, &c) ||
      arity("vm.builtin.attention_kv_cache_get_query_positions", n, 1) || sync_aux(c))
    return -1;
  int64_t n_pos = c->q_rope_position.len;
  rvm_storage *s = rvm_storage_new_unpooled(sizeof(int32_t) * (uint64_t)n_pos);
  if (!s) return -1;
  if (n_pos) memcpy(s->data, c->q_rope_position.data, sizeof(int32_t) * (size_t)n_pos);
  rvm_tensor *t = rvm_tensor_new(s->data, s->device, 1, INT32, &n_pos, 0, &s->header);
  rvm_object_decref(&s->header);
  if (!t) return -1;
  *result = rvm_obj_any(t);
  return 0;
}

/* ---- queries --------------------------------------------------------------------------------- */

static int int_result(TVMFFIAny *result, int64_t v) {
  *result = rvm_int(v);
  return 0;
}

KV_METHOD(total_length) {
  (void)self;
  kv_cache *c;
  if (cache_arg("vm.builtin.attention_kv_cache_get_total_sequence_length", args, n, &c) ||
      arity("vm.builtin.attention_kv_cache_get_total_sequence_length", n, 1))
    return -1;
  int64_t total = 0;
  for (int64_t i = 0; i < c->num_seqs; i++) total += c->seqs[i].seq_length;
  return int_result(result, total);
}

KV_METHOD(available_pages) {
  (void)self;
  kv_cache *c;
  if (cache_arg("vm.builtin.attention_kv_cache_get_num_available_pages", args, n, &c) ||
      arity("vm.builtin.attention_kv_cache_get_num_available_pages", n, 1))
    return -1;
  return int_result(result, c->free_pages.len);
}

KV_METHOD(sequence_length) {
  (void)self;
  const char *fn = "vm.builtin.attention_kv_cache_get_sequence_length";
  kv_cache *c;
  int64_t id;
  if (cache_arg(fn, args, n, &c) || arity(fn, n, 2) || int_arg(fn, args, 1, &id)) return -1;
  sequence *s = find_seq(c, id);
  if (!s) return not_found(id);
  return int_result(result, s->seq_length);
}

KV_METHOD(empty) {
  (void)self;
  kv_cache *c;
  if (cache_arg("vm.builtin.attention_kv_cache_empty", args, n, &c) || arity("vm.builtin.attention_kv_cache_empty", n, 1)) return -1;
  result->type_index = kTVMFFIBool;
  result->zero_padding = 0;
  result->v_int64 = c->num_seqs == 0 && c->free_blocks.len == c->num_blocks && c->free_pages.len == c->num_pages;
  return 0;
}

/* ---- outside the subset ---------------------------------------------------------------------- */

KV_METHOD(sliding_window) {
  (void)self, (void)args, (void)n, (void)result;
  return unsupported("sliding windows and attention sinks (enable_sliding_window_for_seq)");
}

KV_METHOD(token_tree) {
  (void)self, (void)args, (void)n, (void)result;
  return unsupported("token trees (speculative decoding)");
}

KV_METHOD(mla) {
  (void)self, (void)args, (void)n, (void)result;
  return unsupported("multi-head latent attention (MLA)");
}

KV_METHOD(disaggregation) {
  (void)self, (void)args, (void)n, (void)result;
  return unsupported("KV disaggregation (kv_cache_disagg_*)");
}

KV_METHOD(merge_output) {
  (void)self, (void)args, (void)n, (void)result;
  /* TVM's CPU build hands over no general merge function either. */
  return rvm_raise("InternalError", "Check failed: (f_merge_inplace_.size() >= 2) is false: The general attention merge function is not defined.");
}

KV_METHOD(cross_attention) {
  (void)self, (void)args, (void)n, (void)result;
  return unsupported("separate cross-attention calls (MLA-style models)");
}
