/*
 * llm_test.c: a C host drives an LLM through rvm.h alone, the way an engine does: the model's
 * create_paged_kv_cache makes the cache, runtime functions found by name add the sequence and
 * begin and end each step, embed/prefill/decode run the model, and greedy decoding picks the
 * tokens. The tokens are compared with the expected ones; everything is freed (tests/llm.rs
 * runs it under valgrind).
 *
 * With THREADS, that many threads do it at once, each with its own VM and KV cache (tests/threads.rs
 * runs that under ThreadSanitizer).
 *
 * With --weights PATH the model takes its weights as parameters (tiny_llama_params): they are
 * loaded once with weights_open and appended to every embed, prefill and decode call.
 *
 * usage: llm_test [--weights PATH] TINY_LLAMA.so PROMPT_IDS EXPECTED_IDS [THREADS]   (ids comma-separated)
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rvm.h"

static const rvm_api *api;

static int fail(const char *what) {
  fprintf(stderr, "llm_test: %s: %s\n", what, api ? api->last_error() : "");
  return 1;
}

static int parse_ids(const char *text, int32_t *ids, int cap) {
  int n = 0;
  for (const char *p = text; *p && n < cap;) {
    ids[n++] = (int32_t)strtol(p, (char **)&p, 10);
    if (*p == ',') p++;
  }
  return n;
}

/* A Shape value of n dims (owned by the caller). */
static rvm_value shape(const int64_t *dims, int64_t n) {
  rvm_value v = {0};
  api->shape_new(dims, n, &v);
  return v;
}

enum { MAX_WEIGHTS = 256 };

/* The model's weight arguments per function, when it takes them as parameters. */
static rvm_weights *weights;
static rvm_value embed_weights[MAX_WEIGHTS], prefill_weights[MAX_WEIGHTS], decode_weights[MAX_WEIGHTS];
static int32_t num_embed_weights, num_prefill_weights, num_decode_weights;

typedef struct {
  rvm_vm *vm;
  int32_t embed, prefill, decode;
  rvm_value reshape, begin, end, kv;
} llm;

/* args[0..n) followed by the function's weights, into out (capacity MAX_WEIGHTS + 2). */
static int32_t with_weights(const rvm_value *args, int32_t n, const rvm_value *w, int32_t nw, rvm_value *out) {
  memcpy(out, args, sizeof(rvm_value) * (size_t)n);
  memcpy(out + n, w, sizeof(rvm_value) * (size_t)nw);
  return n + nw;
}

/* One step: embed `tokens`, view them as [rows, cols, hidden], run `fn` between begin and end
 * forward for sequence 0; returns the argmax of the last row of logits (or -1). */
static int32_t step(llm *m, int32_t fn, const int32_t *tokens, int64_t n, int64_t rows, int64_t cols) {
  int32_t ids[64] __attribute__((aligned(64)));
  memcpy(ids, tokens, sizeof(int32_t) * (size_t)n);
  int64_t ids_shape[1] = {n};
  DLTensor t = {ids, {kDLCPU, 0}, 1, {kDLInt, 32, 1}, ids_shape, NULL, 0};
  rvm_value arg = {.type_index = kTVMFFIDLTensorPtr, .v_ptr = &t}, embeds = {0}, view = {0}, none = {0}, out = {0};
  int32_t best = -1;
  int64_t dims[3] = {rows, cols, 0}, seq = 0;
  rvm_value new_shape = {0}, seq_ids = shape(&seq, 1), lengths = shape(&n, 1);
  rvm_value all[MAX_WEIGHTS + 2];
  int32_t n_all = with_weights(&arg, 1, embed_weights, num_embed_weights, all);
  if (api->vm_call(m->vm, m->embed, all, n_all, &embeds) != 0) goto done;
  dims[2] = api->tensor_view(&embeds)->shape[1]; /* the hidden size: embed gives [n, hidden] */
  new_shape = shape(dims, 3);
  rvm_value reshape_args[2] = {embeds, new_shape};
  if (api->function_call(&m->reshape, reshape_args, 2, &view) != 0) goto done;
  rvm_value begin_args[3] = {m->kv, seq_ids, lengths};
  if (api->function_call(&m->begin, begin_args, 3, &none) != 0) goto done;
  rvm_value call_args[2] = {view, m->kv};
  n_all = fn == m->prefill ? with_weights(call_args, 2, prefill_weights, num_prefill_weights, all)
                          : with_weights(call_args, 2, decode_weights, num_decode_weights, all);
  if (api->vm_call(m->vm, fn, all, n_all, &out) != 0) goto done;
  if (api->function_call(&m->end, &m->kv, 1, &none) != 0) goto done;
  rvm_value logits = {0};
  if (api->tuple_get(&out, 0, &logits) != 0) goto done;
  const DLTensor *l = api->tensor_view(&logits);
  int64_t vocab = l->shape[l->ndim - 1];
  const float *v = (const float *)((const char *)l->data + l->byte_offset) + (rows * cols > 1 && fn == m->decode ? (rows - 1) * vocab : 0);
  best = 0;
  for (int64_t k = 1; k < vocab; k++)
    if (v[k] > v[best]) best = (int32_t)k;
done:
  api->value_release(&embeds);
  api->value_release(&view);
  api->value_release(&out);
  api->value_release(&new_shape);
  api->value_release(&seq_ids);
  api->value_release(&lengths);
  return best;
}

static rvm_module *module;
static int32_t prompt[64], expected[64];
static int n_prompt, n_expected;

/* One generation on a VM and cache of its own: 0 when the tokens are the expected ones. */
static int generate(void) {
  llm m = {0};
  int rc = 1;
  if (api->vm_create(module, &m.vm) != 0) return fail("vm_create");
  int32_t create;
  if (api->function_find(module, "create_paged_kv_cache", &create) || api->function_find(module, "embed", &m.embed) ||
      api->function_find(module, "prefill", &m.prefill) || api->function_find(module, "decode", &m.decode))
    return fail("the LLM functions");
  if (api->function_get("vm.builtin.reshape", &m.reshape) || api->function_get("vm.builtin.kv_state_begin_forward", &m.begin) ||
      api->function_get("vm.builtin.kv_state_end_forward", &m.end))
    return fail("runtime functions");
  int64_t sizes[5] = {1, 128, 32, 16, 0};
  rvm_value config[5];
  for (int i = 0; i < 5; i++) config[i] = shape(&sizes[i], 1);
  if (api->vm_call(m.vm, create, config, 5, &m.kv) != 0) {
    fail("create_paged_kv_cache");
    goto out;
  }
  rvm_value add = {0}, none = {0}, add_args[2] = {m.kv, {.type_index = kTVMFFIInt, .v_int64 = 0}};
  if (api->function_get("vm.builtin.kv_state_add_sequence", &add) || api->function_call(&add, add_args, 2, &none)) {
    fail("add_sequence");
    api->value_release(&add);
    goto out;
  }
  api->value_release(&add);
  int32_t tokens[64];
  int n = 0;
  tokens[n++] = step(&m, m.prefill, prompt, n_prompt, 1, n_prompt);
  while (n < n_expected && tokens[n - 1] >= 0) {
    tokens[n] = step(&m, m.decode, &tokens[n - 1], 1, 1, 1);
    n++;
  }
  rc = 0;
  for (int i = 0; i < n_expected; i++) {
    if (i >= n || tokens[i] != expected[i]) {
      fprintf(stderr, "llm_test: token %d is %d, expected %d (%s)\n", i, i < n ? tokens[i] : -1, expected[i], api->last_error());
      rc = 1;
      break;
    }
  }
out:
  for (int i = 0; i < 5; i++) api->value_release(&config[i]);
  api->value_release(&m.kv);
  api->value_release(&m.reshape);
  api->value_release(&m.begin);
  api->value_release(&m.end);
  api->vm_destroy(m.vm);
  return rc;
}

static void *generate_thread(void *status) {
  *(int *)status = generate();
  return NULL;
}

int main(int argc, char **argv) {
  const char *weights_path = NULL;
  if (argc > 2 && strcmp(argv[1], "--weights") == 0) {
    weights_path = argv[2];
    argv += 2;
    argc -= 2;
  }
  if (argc != 4 && argc != 5) {
    fprintf(stderr, "usage: llm_test [--weights PATH] TINY_LLAMA.so PROMPT_IDS EXPECTED_IDS [THREADS]\n");
    return 2;
  }
  n_prompt = parse_ids(argv[2], prompt, 64);
  n_expected = parse_ids(argv[3], expected, 64);
  int threads = argc == 5 ? atoi(argv[4]) : 0;
  if (threads < 0 || threads > 64) {
    fprintf(stderr, "llm_test: THREADS must be 0 to 64\n");
    return 2;
  }
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  api = ((rvm_get_api_fn)dlsym(lib, "rvm_get_api"))(RVM_ABI_VERSION);
  if (api->module_open(&module) != 0) return fail("module_open");
  if (weights_path) {
    int32_t f;
    if (api->weights_open(module, weights_path, &weights) != 0) return fail("weights_open");
    if (api->function_find(module, "embed", &f) ||
        api->weights_arguments(weights, f, 1, embed_weights, MAX_WEIGHTS, &num_embed_weights) ||
        api->function_find(module, "prefill", &f) ||
        api->weights_arguments(weights, f, 2, prefill_weights, MAX_WEIGHTS, &num_prefill_weights) ||
        api->function_find(module, "decode", &f) ||
        api->weights_arguments(weights, f, 2, decode_weights, MAX_WEIGHTS, &num_decode_weights)) {
      fail("weights_arguments");
      api->weights_close(weights);
      api->module_close(module);
      return 1;
    }
  }
  int rc = 0;
  if (threads == 0) {
    rc = generate();
  } else {
    pthread_t ids[64];
    int status[64];
    for (int i = 0; i < threads; i++) pthread_create(&ids[i], NULL, generate_thread, &status[i]);
    for (int i = 0; i < threads; i++) {
      pthread_join(ids[i], NULL);
      rc |= status[i];
    }
  }
  api->weights_close(weights);
  api->module_close(module);
  dlclose(lib);
  if (rc == 0) printf("llm_test: %d tokens as expected%s\n", n_expected, threads ? " on every thread" : "");
  return rc;
}
