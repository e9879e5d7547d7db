/*
 * weights.c: weights outside the model (rvm.h's weights_open): TVM's tensor cache (a directory
 * with tensor-cache.json or ndarray-cache.json and its shards), safetensors (a file, or a
 * directory of them) or GGUF (llama.cpp's files, read by gguf.c), for models exported with their
 * weights as parameters (TVM nn's export_tvm without binding; MLC; relaxc.llm).
 *
 * Files are memory-mapped once, read-only; each weight is a DLTensor over its bytes, passed to
 * the model in place. A weight not 64-byte aligned in its file is copied once, here: the runtime
 * would otherwise copy it on every call, since TVM's kernels assume that alignment. GGUF places
 * tensors 32 bytes apart, so half of a file would be copied; its matrices (in GGUF's block
 * formats, read by relaxc's quantized kernels, which assume nothing of alignment) are passed in
 * place as tensor objects instead, which the runtime never copies. Every offset, size and name read from the files is
 * checked before use; an error names the weight and the file. The same rules as relaxc's Rust
 * host (src/host/external.rs), so `relaxc generate --weights` and a C host agree.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf.h"
#include "internal.h"

typedef struct mapping {
  void *base;
  size_t size;
} mapping;

typedef struct weight {
  char *name;
  int64_t *shape;
  DLTensor tensor;
  void *copy; /* an aligned copy, when the file's bytes were not aligned */
  rvm_tensor *view; /* a GGUF matrix: passed as this object, in place whatever its alignment */
  int32_t gguf_type; /* the tensor's ggml type in a GGUF file, else -1 */
} weight;

struct rvm_weights {
  rvm_module *module;
  rvm_module *module_for_repack; /* while loading: the module whose parameters ask for regrouped copies */
  char *path;
  /* Every weight in the files' order as one tuple: the argument of a function exported in TVM nn's
   * "packed" parameter mode (MLC's), whose one weight parameter is named packed_params. */
  TVMFFIAny packed;
  mapping *maps;
  int32_t num_maps, cap_maps;
  weight *weights;
  int32_t num_weights, cap_weights;
};

static char *copy_string(const char *s) {
  size_t n = strlen(s);
  char *c = rvm_mem_alloc(n + 1, "a weight's name");
  if (c) memcpy(c, s, n + 1);
  return c;
}

static int io_error(const char *path, const char *doing) {
  return rvm_raise("OSError", "cannot %s %s: %s", doing, path, strerror(errno));
}

/* Maps `path` read-only and keeps the mapping; *data and *size describe it. */
static int map_file(rvm_weights *w, const char *path, const unsigned char **data, size_t *size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error(path, "open");
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int rc = io_error(path, "stat");
    close(fd);
    return rc;
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return rvm_raise("ValueError", "%s is not a regular file", path);
  }
  void *base = st.st_size > 0 ? mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
  close(fd);
  if (st.st_size > 0 && base == MAP_FAILED) return io_error(path, "map");
#ifdef MADV_HUGEPAGE
  /* Pages of the file that are not cached yet are then read in 2 MiB folios, which the kernel maps
   * with huge pages (ext4 and xfs on Linux 6.x): decoding streams every weight once per token, and
   * the mid-size f32 Llama decoded 10% faster on Zen 3 with the whole file mapped so. A kernel or
   * file system without them ignores the advice. */
  if (base) (void)madvise(base, (size_t)st.st_size, MADV_HUGEPAGE);
#endif
  if (w->num_maps == w->cap_maps) {
    int32_t cap = w->cap_maps ? 2 * w->cap_maps : 8;
    mapping *m = rvm_mem_realloc(w->maps, sizeof(mapping) * (size_t)cap, "the weights' file list");
    if (!m) {
      if (base) munmap(base, (size_t)st.st_size);
      return -1;
    }
    w->maps = m;
    w->cap_maps = cap;
  }
  w->maps[w->num_maps++] = (mapping){base, (size_t)st.st_size};
  *data = base;
  *size = (size_t)st.st_size;
  return 0;
}

/* A dtype by the names the tensor cache (numpy's) and safetensors use; false if unknown. */
static bool dtype_of(const char *name, DLDataType *out) {
  static const struct { const char *a, *b; uint8_t code, bits; } table[] = {
      {"float32", "F32", kDLFloat, 32}, {"float16", "F16", kDLFloat, 16}, {"float64", "F64", kDLFloat, 64},
      {"bfloat16", "BF16", kDLBfloat, 16}, {"int8", "I8", kDLInt, 8}, {"int16", "I16", kDLInt, 16},
      {"int32", "I32", kDLInt, 32}, {"int64", "I64", kDLInt, 64}, {"uint8", "U8", kDLUInt, 8},
      {"uint16", "U16", kDLUInt, 16}, {"uint32", "U32", kDLUInt, 32}, {"uint64", "U64", kDLUInt, 64},
      {"bool", "BOOL", kDLBool, 8}};
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    if (strcmp(name, table[i].a) == 0 || strcmp(name, table[i].b) == 0) {
      *out = (DLDataType){table[i].code, table[i].bits, 1};
      return true;
    }
  return false;
}

/* Adds one weight over `bytes` (which must hold exactly its elements); `in_place`: never copied,
 * passed as a tensor object. */
static int add_weight(rvm_weights *w, const char *name, DLDataType dtype, const int64_t *shape, int32_t ndim,
                      const unsigned char *bytes, int64_t nbytes, const char *file, bool in_place) {
  for (int32_t i = 0; i < w->num_weights; i++)
    if (strcmp(w->weights[i].name, name) == 0) return rvm_raise("ValueError", "weight %s in %s: appears twice", name, file);
  if (w->num_weights == w->cap_weights) {
    int32_t cap = w->cap_weights ? 2 * w->cap_weights : 64;
    weight *grown = rvm_mem_realloc(w->weights, sizeof(weight) * (size_t)cap, "the weights' table");
    if (!grown) return -1;
    w->weights = grown;
    w->cap_weights = cap;
  }
  weight *e = &w->weights[w->num_weights];
  memset(e, 0, sizeof *e);
  e->name = copy_string(name);
  e->shape = rvm_mem_calloc((size_t)ndim + 1, sizeof(int64_t), "a weight's shape");
  if (!e->name || !e->shape) {
    rvm_mem_free(e->name);
    rvm_mem_free(e->shape);
    return -1;
  }
  if (ndim > 0) memcpy(e->shape, shape, sizeof(int64_t) * (size_t)ndim);
  void *data = (void *)bytes;
  if (in_place) {
    e->view = rvm_tensor_new(data, (DLDevice){kDLCPU, 0}, ndim, dtype, e->shape, 0, NULL);
    if (!e->view) {
      rvm_mem_free(e->name);
      rvm_mem_free(e->shape);
      return -1;
    }
  } else if (((uintptr_t)bytes % 64) != 0) {
    e->copy = rvm_mem_aligned((size_t)nbytes + 1, 64, "an aligned copy of a weight");
    if (!e->copy) {
      rvm_mem_free(e->name);
      rvm_mem_free(e->shape);
      return -1;
    }
    if (nbytes) memcpy(e->copy, bytes, (size_t)nbytes);
    data = e->copy;
  }
  e->tensor = (DLTensor){data, {kDLCPU, 0}, ndim, dtype, e->shape, NULL, 0};
  e->gguf_type = -1;
  w->num_weights++;
  return 0;
}

/* A shape from a JSON array of non-negative integers, at most 16 dims. */
static int shape_of(const rvm_json *a, int64_t *shape, int32_t *ndim) {
  if (!a || a->kind != RVM_JSON_ARRAY || a->count > 16) return -1;
  *ndim = 0;
  for (const rvm_json *d = a->first; d; d = d->next)
    if (!rvm_json_int(d, &shape[(*ndim)++]) || shape[*ndim - 1] < 0) return -1;
  return 0;
}

static int64_t checked_bytes(const int64_t *shape, int32_t ndim, DLDataType dtype) {
  int64_t n = (dtype.bits + 7) / 8;
  for (int32_t i = 0; i < ndim; i++) {
    if (shape[i] != 0 && n > INT64_MAX / shape[i]) return -1;
    n *= shape[i];
  }
  return n;
}

static int load_tensor_cache(rvm_weights *w, const char *dir, const char *index) {
  const unsigned char *text;
  size_t len;
  if (map_file(w, index, &text, &len)) return -1;
  rvm_json_doc doc;
  if (rvm_json_parse((const char *)text, len, index, &doc)) return -1;
  int rc = 0;
  const rvm_json *shards = rvm_json_get(doc.root, "records");
  if (!shards || shards->kind != RVM_JSON_ARRAY) rc = rvm_raise("ValueError", "%s: no \"records\" list", index);
  int s = 0;
  for (const rvm_json *shard = shards ? shards->first : NULL; rc == 0 && shard; shard = shard->next, s++) {
    const rvm_json *data_path = rvm_json_get(shard, "dataPath"), *records = rvm_json_get(shard, "records");
    if (!data_path || data_path->kind != RVM_JSON_STRING) {
      rc = rvm_raise("ValueError", "%s: shard %d has no \"dataPath\"", index, s);
      break;
    }
    if (strchr(data_path->string, '/') || strstr(data_path->string, "..")) {
      rc = rvm_raise("ValueError", "%s: shard %d's dataPath \"%s\" leaves the cache's directory", index, s, data_path->string);
      break;
    }
    if (!records || records->kind != RVM_JSON_ARRAY) {
      rc = rvm_raise("ValueError", "%s: shard %d (%s) has no \"records\" list", index, s, data_path->string);
      break;
    }
    char file[4096];
    if ((size_t)snprintf(file, sizeof file, "%s/%s", dir, data_path->string) >= sizeof file) {
      rc = rvm_raise("ValueError", "%s: shard path too long", index);
      break;
    }
    const unsigned char *bytes;
    size_t size;
    if ((rc = map_file(w, file, &bytes, &size)) != 0) break;
    int k = 0;
    for (const rvm_json *r = records->first; rc == 0 && r; r = r->next, k++) {
      const rvm_json *name = rvm_json_get(r, "name"), *dtype_name = rvm_json_get(r, "dtype"), *format = rvm_json_get(r, "format");
      if (!name || name->kind != RVM_JSON_STRING) {
        rc = rvm_raise("ValueError", "%s: record %d of shard %d has no name", index, k, s);
        break;
      }
      const char *n = name->string;
      if (format && (format->kind != RVM_JSON_STRING || strcmp(format->string, "raw") != 0)) {
        rc = rvm_raise("ValueError", "weight %s in %s: is not stored \"raw\"", n, file);
        break;
      }
      DLDataType dtype;
      if (!dtype_name || dtype_name->kind != RVM_JSON_STRING || !dtype_of(dtype_name->string, &dtype)) {
        rc = rvm_raise("ValueError", "weight %s in %s: unknown dtype", n, file);
        break;
      }
      int64_t shape[16], nbytes, offset;
      int32_t ndim;
      if (shape_of(rvm_json_get(r, "shape"), shape, &ndim)) {
        rc = rvm_raise("ValueError", "weight %s in %s: has no list of integer dims as its shape", n, file);
        break;
      }
      if (!rvm_json_int(rvm_json_get(r, "nbytes"), &nbytes) || !rvm_json_int(rvm_json_get(r, "byteOffset"), &offset) ||
          nbytes < 0 || offset < 0) {
        rc = rvm_raise("ValueError", "weight %s in %s: has no nbytes or byteOffset", n, file);
        break;
      }
      int64_t need = checked_bytes(shape, ndim, dtype);
      if (need != nbytes) {
        rc = rvm_raise("ValueError", "weight %s in %s: %lld bytes for its shape and dtype, which need %lld", n, file,
                       (long long)nbytes, (long long)need);
        break;
      }
      if ((uint64_t)offset > size || (uint64_t)nbytes > size - (uint64_t)offset) {
        rc = rvm_raise("ValueError",
                       "weight %s in %s: its bytes %lld..%lld lie past the end of the shard (%zu bytes): the shard is "
                       "truncated or the index is wrong",
                       n, file, (long long)offset, (long long)offset + (long long)nbytes, size);
        break;
      }
      rc = add_weight(w, n, dtype, shape, ndim, bytes + offset, nbytes, file, false);
    }
  }
  rvm_json_free(&doc);
  return rc;
}

static int load_safetensors(rvm_weights *w, const char *file) {
  const unsigned char *bytes;
  size_t size;
  if (map_file(w, file, &bytes, &size)) return -1;
  uint64_t header = 0;
  if (size < 8) return rvm_raise("ValueError", "%s: not a safetensors file (%zu bytes)", file, size);
  memcpy(&header, bytes, 8);
  if (header > size - 8) return rvm_raise("ValueError", "%s: its header length %llu passes the end of the file", file, (unsigned long long)header);
  rvm_json_doc doc;
  if (rvm_json_parse((const char *)bytes + 8, (size_t)header, file, &doc)) return -1;
  int rc = 0;
  size_t data = 8 + (size_t)header;
  if (doc.root->kind != RVM_JSON_OBJECT) rc = rvm_raise("ValueError", "%s: its header is not an object", file);
  for (const rvm_json *t = doc.root->kind == RVM_JSON_OBJECT ? doc.root->first : NULL; rc == 0 && t; t = t->next) {
    if (strcmp(t->key, "__metadata__") == 0) continue;
    const rvm_json *dtype_name = rvm_json_get(t, "dtype"), *offsets = rvm_json_get(t, "data_offsets");
    DLDataType dtype;
    if (!dtype_name || dtype_name->kind != RVM_JSON_STRING || !dtype_of(dtype_name->string, &dtype)) {
      rc = rvm_raise("ValueError", "weight %s in %s: unknown dtype", t->key, file);
      break;
    }
    int64_t shape[16], begin, end;
    int32_t ndim;
    if (shape_of(rvm_json_get(t, "shape"), shape, &ndim)) {
      rc = rvm_raise("ValueError", "weight %s in %s: has no list of integer dims as its shape", t->key, file);
      break;
    }
    if (!offsets || offsets->kind != RVM_JSON_ARRAY || offsets->count != 2 || !rvm_json_int(offsets->first, &begin) ||
        !rvm_json_int(offsets->first->next, &end) || begin < 0 || end < begin) {
      rc = rvm_raise("ValueError", "weight %s in %s: bad data_offsets", t->key, file);
      break;
    }
    int64_t need = checked_bytes(shape, ndim, dtype);
    if (need != end - begin) {
      rc = rvm_raise("ValueError", "weight %s in %s: its data_offsets %lld..%lld do not hold the %lld bytes of its shape", t->key,
                     file, (long long)begin, (long long)end, (long long)need);
      break;
    }
    if ((uint64_t)end > size - data) {
      rc = rvm_raise("ValueError", "weight %s in %s: its bytes lie past the end of the file (%zu bytes): truncated?", t->key, file, size);
      break;
    }
    rc = add_weight(w, t->key, dtype, shape, ndim, bytes + data + begin, need, file, false);
  }
  rvm_json_free(&doc);
  return rc;
}

/* ---- GGUF ------------------------------------------------------------------------------------ */

typedef struct gguf_loading {
  rvm_weights *w;
  const char *file;
} gguf_loading;

/* A GGUF tensor as a weight: f32, f16, bf16 and the integer types as themselves; block formats
 * (q4_0, q8_0, q4_K, q6_K, ...) as uint8 rows of their blocks, [..., rows, blocks * block bytes].
 * Dims are reversed: GGUF lists the innermost first. */
static int gguf_tensor(void *ctx, const rvm_gguf_tensor *t) {
  gguf_loading *l = ctx;
  char name[256];
  if (t->name_len >= sizeof name || memchr(t->name, 0, t->name_len))
    return rvm_raise("ValueError", "%s: a tensor name of %zu bytes (at most %zu, without NUL bytes)", l->file, t->name_len,
                     sizeof name - 1);
  memcpy(name, t->name, t->name_len);
  name[t->name_len] = 0;
  uint32_t block, block_bytes;
  const char *type = rvm_gguf_type(t->type, &block, &block_bytes);
  DLDataType dtype;
  if (block > 1) dtype = (DLDataType){kDLUInt, 8, 1};
  else if (strcmp(type, "bf16") == 0) dtype = (DLDataType){kDLBfloat, 16, 1};
  else if (type[0] == 'f') dtype = (DLDataType){kDLFloat, (uint8_t)(8 * block_bytes), 1};
  else dtype = (DLDataType){kDLInt, (uint8_t)(8 * block_bytes), 1};
  int64_t shape[4];
  for (uint32_t d = 0; d < t->ndim; d++) {
    uint64_t dim = d == 0 && block > 1 ? t->dims[0] / block * block_bytes : t->dims[d];
    if (dim > (uint64_t)INT64_MAX) return rvm_raise("ValueError", "weight %s in %s: a dim of %llu", name, l->file, (unsigned long long)dim);
    shape[t->ndim - 1 - d] = (int64_t)dim;
  }
  if (t->nbytes > (uint64_t)INT64_MAX) return rvm_raise("ValueError", "weight %s in %s: too large", name, l->file);
  int rc = add_weight(l->w, name, dtype, shape, (int32_t)t->ndim, t->data, (int64_t)t->nbytes, l->file, t->ndim >= 2);
  if (rc == 0) l->w->weights[l->w->num_weights - 1].gguf_type = (int32_t)t->type;
  return rc;
}

/* The regrouped copies a model asks for by name: a parameter named "X#q4_0x8" (or "#q8_0x8",
 * "#q4_Kx8") gets the file's q4_0 (q8_0, q4_K) matrix X regrouped eight rows at a time
 * (gguf.h), made once here;
 * it costs the matrix's size in memory (q4_Kx8 3% more) and lets decoding run at the file's
 * bandwidth rather than at the speed of unpacking one row at a time. */
static const struct regrouping {
  const char *suffix;
  uint32_t gguf_type;
  int64_t block, block_bytes, group_block_bytes;
  void (*repack)(const uint8_t *, int64_t, int64_t, uint8_t *);
} regroupings[] = {
    {"#q4_0x8", 2, 32, 18, 144, rvm_gguf_repack_q4_0x8},
    {"#q8_0x8", 8, 32, 34, 272, rvm_gguf_repack_q8_0x8},
    {"#q4_Kx8", 12, 256, 144, 1184, rvm_gguf_repack_q4_Kx8},
};

static const weight *find_weight(const rvm_weights *w, const char *name, size_t len) {
  for (int32_t k = 0; k < w->num_weights; k++)
    if (strlen(w->weights[k].name) == len && memcmp(w->weights[k].name, name, len) == 0) return &w->weights[k];
  return NULL;
}

/* The regrouped copy `name` asks for, made and added unless it is there already. */
static int regroup(rvm_weights *w, const char *name, const struct regrouping *how, const char *function, const char *file) {
  size_t len = strlen(name), base_len = len - strlen(how->suffix);
  const weight *base = find_weight(w, name, base_len);
  if (!base || find_weight(w, name, len)) return 0; /* weights_arguments names what is missing */
  if (base->gguf_type != (int32_t)how->gguf_type || base->tensor.ndim != 2 || base->shape[0] % 8 != 0)
    return rvm_raise("ValueError", "weight %.*s in %s: %s asks for it regrouped (%s), which needs a %s matrix of a multiple of 8 rows",
                     (int)base_len, name, file, function, how->suffix + 1,
                     how->gguf_type == 2 ? "q4_0" : how->gguf_type == 8 ? "q8_0" : "q4_K");
  int64_t rows = base->shape[0], blocks = base->shape[1] / how->block_bytes, k = blocks * how->block;
  int64_t shape[2] = {rows / 8, blocks * how->group_block_bytes}, nbytes = shape[0] * shape[1];
  uint8_t *copy = rvm_mem_aligned((size_t)nbytes + 1, 64, "a regrouped weight");
  if (!copy) return -1;
  how->repack(base->tensor.data, rows, k, copy);
  /* The file's pages of the matrix were read once, for the copy: give them back (the mapping is
   * private and read-only, so they come back from the file if the plain form is used too). */
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), from = ((uintptr_t)base->tensor.data + page - 1) / page * page,
            to = ((uintptr_t)base->tensor.data + (uintptr_t)(rows * base->shape[1])) / page * page;
  if (to > from) madvise((void *)from, to - from, MADV_DONTNEED);
  if (add_weight(w, name, (DLDataType){kDLUInt, 8, 1}, shape, 2, copy, nbytes, file, true)) {
    rvm_mem_free(copy);
    return -1;
  }
  w->weights[w->num_weights - 1].copy = copy;
  return 0;
}

static int repack_for_model(rvm_weights *w, const char *file) {
  rvm_module *m = w->module_for_repack;
  for (int32_t f = 0; f < m->num_relax_funcs; f++) {
    const rvm_func_info *fn = &m->program->funcs[m->relax_funcs[f]];
    for (int32_t p = 0; p < fn->num_args && fn->param_names; p++) {
      const char *name = fn->param_names[p];
      size_t len = name ? strlen(name) : 0;
      for (size_t r = 0; r < sizeof regroupings / sizeof regroupings[0]; r++) {
        size_t suffix = strlen(regroupings[r].suffix);
        if (len > suffix && strcmp(name + len - suffix, regroupings[r].suffix) == 0 &&
            regroup(w, name, &regroupings[r], fn->name, file))
          return -1;
      }
    }
  }
  return 0;
}

static int load_gguf(rvm_weights *w, const char *file) {
  const unsigned char *bytes;
  size_t size;
  if (map_file(w, file, &bytes, &size)) return -1;
  gguf_loading loading = {w, file};
  char err[512] = "";
  int rc = rvm_gguf_read(bytes, size, gguf_tensor, &loading, err, sizeof err);
  /* A failure the visitor raised already has its message; the reader's own is raised here. */
  if (rc && err[0]) return rvm_raise("ValueError", "%s: %s", file, err);
  return rc ? rc : repack_for_model(w, file);
}

static int compare_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int load_directory(rvm_weights *w, const char *dir) {
  char index[4096];
  for (const char *const *name = (const char *const[]){"tensor-cache.json", "ndarray-cache.json", NULL}; *name; name++) {
    if ((size_t)snprintf(index, sizeof index, "%s/%s", dir, *name) >= sizeof index) return rvm_raise("ValueError", "path too long");
    if (access(index, F_OK) == 0) return load_tensor_cache(w, dir, index);
  }
  DIR *d = opendir(dir);
  if (!d) return io_error(dir, "list");
  char **names = NULL;
  size_t n = 0, cap = 0;
  int rc = 0;
  for (struct dirent *e; rc == 0 && (e = readdir(d));) {
    size_t len = strlen(e->d_name);
    if (len <= 12 || strcmp(e->d_name + len - 12, ".safetensors") != 0) continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      char **grown = rvm_mem_realloc(names, sizeof(char *) * cap, "a file list");
      if (!grown) {
        rc = -1;
        break;
      }
      names = grown;
    }
    if (!(names[n] = copy_string(e->d_name))) rc = -1;
    else n++;
  }
  closedir(d);
  if (rc == 0 && n == 0)
    rc = rvm_raise("ValueError", "%s is neither a tensor cache (tensor-cache.json or ndarray-cache.json) nor a directory of .safetensors files", dir);
  if (rc == 0) qsort(names, n, sizeof(char *), compare_names);
  for (size_t i = 0; rc == 0 && i < n; i++) {
    char file[4096];
    if ((size_t)snprintf(file, sizeof file, "%s/%s", dir, names[i]) >= sizeof file) rc = rvm_raise("ValueError", "path too long");
    else rc = load_safetensors(w, file);
  }
  for (size_t i = 0; i < n; i++) rvm_mem_free(names[i]);
  rvm_mem_free(names);
  return rc;
}

void rvm_weights_close(rvm_weights *w) {
  if (!w) return;
  for (int32_t i = 0; i < w->num_weights; i++) {
    rvm_mem_free(w->weights[i].name);
    rvm_mem_free(w->weights[i].shape);
    rvm_mem_free(w->weights[i].copy);
    if (w->weights[i].view) rvm_object_decref(&w->weights[i].view->header);
  }
  for (int32_t i = 0; i < w->num_maps; i++)
    if (w->maps[i].base) munmap(w->maps[i].base, w->maps[i].size);
  rvm_any_release(&w->packed);
  rvm_mem_free(w->weights);
  rvm_mem_free(w->maps);
  rvm_mem_free(w->path);
  if (w->module) rvm_module_close(w->module);
  rvm_mem_free(w);
}

int rvm_weights_open(rvm_module *module, const char *path, rvm_weights **out) {
  rvm_error_clear();
  if (!module || !path || !out) return rvm_raise("ValueError", "weights_open: the module, the path and out must not be NULL");
  *out = NULL;
  rvm_weights *w = rvm_mem_calloc(1, sizeof *w, "weights");
  if (!w) return -1;
  if (!(w->path = copy_string(path))) {
    rvm_mem_free(w);
    return -1;
  }
  w->module_for_repack = module;
  struct stat st;
  int rc;
  if (stat(path, &st) != 0) {
    rc = io_error(path, "open");
  } else if (S_ISDIR(st.st_mode)) {
    rc = load_directory(w, path);
  } else {
    size_t len = strlen(path);
    if (len > 12 && strcmp(path + len - 12, ".safetensors") == 0) rc = load_safetensors(w, path);
    else if (len > 5 && strcmp(path + len - 5, ".gguf") == 0) rc = load_gguf(w, path);
    else
      rc = rvm_raise("ValueError",
                     "%s is neither a tensor cache directory, safetensors (a .safetensors file or a directory of them) nor "
                     "GGUF (a .gguf file)",
                     path);
  }
  if (rc) {
    rvm_weights_close(w);
    return -1;
  }
  rvm_array *packed = rvm_array_new(w->num_weights);
  for (int32_t i = 0; packed && i < w->num_weights; i++) {
    const DLTensor *t = &w->weights[i].tensor;
    rvm_tensor *view = rvm_tensor_new(t->data, t->device, t->ndim, t->dtype, t->shape, 0, NULL);
    if (!view) {
      rvm_object_decref(&packed->header);
      packed = NULL;
      break;
    }
    packed->items[i] = rvm_obj_any(view);
  }
  if (!packed) {
    rvm_weights_close(w);
    return -1;
  }
  w->packed = rvm_obj_any(packed);
  atomic_fetch_add_explicit(&module->refcount, 1, memory_order_relaxed);
  w->module = module;
  *out = w;
  return 0;
}

int rvm_weights_arguments(const rvm_weights *w, int32_t function, int32_t num_inputs, rvm_value *args, int32_t capacity,
                          int32_t *count) {
  rvm_error_clear();
  if (!w || !count || (capacity > 0 && !args)) return rvm_raise("ValueError", "weights_arguments: weights, args and count must not be NULL");
  rvm_module *m = w->module;
  if (function < 0 || function >= m->num_relax_funcs)
    return rvm_raise("ValueError", "function index %d out of range (the model has %d functions)", function, m->num_relax_funcs);
  const rvm_func_info *f = &m->program->funcs[m->relax_funcs[function]];
  if (num_inputs < 0 || num_inputs > f->num_args)
    return rvm_raise("ValueError", "%s takes %d parameters; %d inputs leave no room", f->name, f->num_args, num_inputs);
  int32_t needed = f->num_args - num_inputs;
  *count = needed;
  if (needed > capacity)
    return rvm_raise("ValueError", "%s takes %d weights; the argument array holds %d", f->name, needed, capacity);
  for (int32_t i = 0; i < needed; i++) {
    const char *name = f->param_names[num_inputs + i];
    const weight *found = NULL;
    for (int32_t k = 0; k < w->num_weights && !found; k++)
      if (strcmp(w->weights[k].name, name) == 0) found = &w->weights[k];
    if (!found && strcmp(name, "packed_params") == 0) {
      args[i] = w->packed; /* borrowed, like the tensors */
      continue;
    }
    if (!found) return rvm_raise("ValueError", "%s takes weight %s, which %s does not have", f->name, name, w->path);
    if (found->view) args[i] = (rvm_value){.type_index = kTVMFFITensor, .v_obj = &found->view->header};
    else args[i] = (rvm_value){.type_index = kTVMFFIDLTensorPtr, .v_ptr = (void *)&found->tensor};
  }
  return 0;
}
