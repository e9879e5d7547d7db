/*
 * gguf.c: the GGUF reader (gguf.h). Versions 2 and 3, little-endian. The metadata is skipped but
 * for general.alignment, which places the tensor data; values are walked with their types, arrays
 * nested at most 4 deep, so that a hostile count never makes the reader loop or read past the
 * buffer. Tensor types are llama.cpp's ggml_type numbers.
 */
#include "gguf.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

typedef struct reader {
  const uint8_t *bytes;
  size_t size, at;
  char *err;
  size_t err_size;
} reader;

static int fail(reader *r, const char *format, ...) __attribute__((format(printf, 2, 3)));
static int fail(reader *r, const char *format, ...) {
  va_list args;
  va_start(args, format);
  if (r->err_size) vsnprintf(r->err, r->err_size, format, args);
  va_end(args);
  return -1;
}

static bool take(reader *r, size_t n, const uint8_t **out) {
  if (n > r->size - r->at) return false;
  *out = r->bytes + r->at;
  r->at += n;
  return true;
}

static bool u32(reader *r, uint32_t *v) {
  const uint8_t *p;
  if (!take(r, 4, &p)) return false;
  memcpy(v, p, 4);
  return true;
}

static bool u64(reader *r, uint64_t *v) {
  const uint8_t *p;
  if (!take(r, 8, &p)) return false;
  memcpy(v, p, 8);
  return true;
}

static bool string(reader *r, const char **s, size_t *len) {
  uint64_t n;
  const uint8_t *p;
  if (!u64(r, &n) || n > r->size - r->at || !take(r, (size_t)n, &p)) return false;
  *s = (const char *)p;
  *len = (size_t)n;
  return true;
}

enum { T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STRING, T_ARRAY, T_U64, T_I64, T_F64, T_COUNT };

/* Skips one value of `type`; *value gets a u32's value (for general.alignment). */
static bool skip_value(reader *r, uint32_t type, int depth, uint64_t *value) {
  static const uint8_t sizes[T_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
  const uint8_t *p;
  if (type >= T_COUNT) return false;
  if (type == T_STRING) {
    const char *s;
    size_t n;
    return string(r, &s, &n);
  }
  if (type == T_ARRAY) {
    uint32_t item;
    uint64_t count;
    if (depth >= 4 || !u32(r, &item) || !u64(r, &count) || item >= T_COUNT) return false;
    if (item != T_STRING && item != T_ARRAY) {
      if (count > (r->size - r->at) / sizes[item]) return false;
      return take(r, (size_t)count * sizes[item], &p);
    }
    /* Each string or array takes at least 8 bytes, so the count is bounded by what is left. */
    if (count > (r->size - r->at) / 8) return false;
    for (uint64_t i = 0; i < count; i++)
      if (!skip_value(r, item, depth + 1, NULL)) return false;
    return true;
  }
  if (!take(r, sizes[type], &p)) return false;
  if (value && type == T_U32) {
    uint32_t v;
    memcpy(&v, p, 4);
    *value = v;
  }
  return true;
}

static const struct {
  const char *name;
  uint32_t block, bytes;
} types[] = {
    [0] = {"f32", 1, 4},      [1] = {"f16", 1, 2},       [2] = {"q4_0", 32, 18},    [3] = {"q4_1", 32, 20},
    [6] = {"q5_0", 32, 22},   [7] = {"q5_1", 32, 24},    [8] = {"q8_0", 32, 34},    [9] = {"q8_1", 32, 36},
    [10] = {"q2_K", 256, 84}, [11] = {"q3_K", 256, 110}, [12] = {"q4_K", 256, 144}, [13] = {"q5_K", 256, 176},
    [14] = {"q6_K", 256, 210}, [15] = {"q8_K", 256, 292}, [24] = {"i8", 1, 1},      [25] = {"i16", 1, 2},
    [26] = {"i32", 1, 4},     [27] = {"i64", 1, 8},      [28] = {"f64", 1, 8},      [30] = {"bf16", 1, 2},
};

const char *rvm_gguf_type(uint32_t type, uint32_t *block, uint32_t *block_bytes) {
  if (type >= sizeof types / sizeof types[0] || !types[type].name) return NULL;
  if (block) *block = types[type].block;
  if (block_bytes) *block_bytes = types[type].bytes;
  return types[type].name;
}

enum { MAX_TENSORS = 1 << 20 };

int rvm_gguf_read(const uint8_t *bytes, size_t size, rvm_gguf_visit visit, void *ctx, char *err, size_t err_size) {
  reader r = {bytes, size, 0, err, err_size};
  const uint8_t *magic;
  uint32_t version;
  uint64_t n_tensors, n_kv;
  if (!take(&r, 4, &magic) || memcmp(magic, "GGUF", 4) != 0) return fail(&r, "not a GGUF file (no GGUF magic)");
  if (!u32(&r, &version) || !u64(&r, &n_tensors) || !u64(&r, &n_kv)) return fail(&r, "truncated GGUF header");
  if (version != 2 && version != 3) return fail(&r, "GGUF version %u (this reader knows 2 and 3)", version);
  if (n_tensors > MAX_TENSORS) return fail(&r, "%llu tensors (at most %d)", (unsigned long long)n_tensors, MAX_TENSORS);
  if (n_kv > (size - r.at) / 13) return fail(&r, "%llu metadata keys cannot fit in the file", (unsigned long long)n_kv);
  uint64_t alignment = 32;
  for (uint64_t i = 0; i < n_kv; i++) {
    const char *key;
    size_t key_len;
    uint32_t type;
    uint64_t value = 0;
    if (!string(&r, &key, &key_len) || !u32(&r, &type))
      return fail(&r, "metadata key %llu of %llu is truncated", (unsigned long long)i, (unsigned long long)n_kv);
    bool is_alignment = key_len == 17 && memcmp(key, "general.alignment", 17) == 0;
    if (!skip_value(&r, type, 0, &value))
      return fail(&r, "metadata %.*s: its value (type %u) is malformed or truncated", (int)(key_len > 80 ? 80 : key_len), key, type);
    if (is_alignment) {
      if (type != T_U32 || value == 0 || (value & (value - 1)) != 0 || value > 65536)
        return fail(&r, "general.alignment must be a power of two up to 65536");
      alignment = value;
    }
  }
  /* The table of tensors, read twice: first checked whole, which places the data section (at the
   * first multiple of the alignment after the table), then visited. */
  size_t table = r.at, data = 0;
  for (int pass = 0; pass < 2; pass++) {
    r.at = table;
    for (uint64_t i = 0; i < n_tensors; i++) {
      rvm_gguf_tensor t = {0};
      uint64_t offset;
      if (!string(&r, &t.name, &t.name_len) || !u32(&r, &t.ndim))
        return fail(&r, "tensor %llu of %llu: its entry is truncated", (unsigned long long)i, (unsigned long long)n_tensors);
      int shown = (int)(t.name_len > 120 ? 120 : t.name_len);
      if (t.ndim < 1 || t.ndim > 4) return fail(&r, "tensor %.*s: %u dims (GGUF allows 1 to 4)", shown, t.name, t.ndim);
      for (uint32_t d = 0; d < t.ndim; d++)
        if (!u64(&r, &t.dims[d])) return fail(&r, "tensor %.*s: its entry is truncated", shown, t.name);
      if (!u32(&r, &t.type) || !u64(&r, &offset)) return fail(&r, "tensor %.*s: its entry is truncated", shown, t.name);
      uint32_t block, block_bytes;
      if (!rvm_gguf_type(t.type, &block, &block_bytes)) return fail(&r, "tensor %.*s: unknown type %u", shown, t.name, t.type);
      if (t.dims[0] % block != 0)
        return fail(&r, "tensor %.*s: %llu values per row is not a multiple of %s's block of %u", shown, t.name,
                    (unsigned long long)t.dims[0], types[t.type].name, block);
      uint64_t nbytes = t.dims[0] / block * block_bytes;
      for (uint32_t d = 1; d < t.ndim; d++) {
        if (t.dims[d] != 0 && nbytes > UINT64_MAX / t.dims[d]) return fail(&r, "tensor %.*s: its size overflows", shown, t.name);
        nbytes *= t.dims[d];
      }
      t.nbytes = nbytes;
      if (pass == 0) continue;
      if (data > size || offset > size - data || nbytes > size - data - offset)
        return fail(&r,
                    "tensor %.*s: its %llu bytes at offset %llu lie past the end of the file (%zu bytes): truncated, or a "
                    "bad offset",
                    shown, t.name, (unsigned long long)nbytes, (unsigned long long)offset, size);
      if (offset % alignment != 0)
        return fail(&r, "tensor %.*s: offset %llu is not a multiple of the alignment %llu", shown, t.name,
                    (unsigned long long)offset, (unsigned long long)alignment);
      t.data = bytes + data + offset;
      int rc = visit(ctx, &t);
      if (rc) return rc;
    }
    if (pass == 0) data = (r.at + (size_t)alignment - 1) / (size_t)alignment * (size_t)alignment;
  }
  return 0;
}

/* Blocks of a 2-byte scale and values regrouped eight rows at a time: per block, the 8 rows'
 * scales, then for each 4 bytes of values the 8 rows' 4 bytes (q4_0x8 and q8_0x8). */
static void regroup_scaled_blocks(const uint8_t *src, int64_t rows, int64_t blocks, int block_bytes, uint8_t *dst) {
  int64_t row_bytes = blocks * block_bytes;
  for (int64_t g = 0; g < rows / 8; g++)
    for (int64_t b = 0; b < blocks; b++) {
      uint8_t *out = dst + (g * blocks + b) * 8 * block_bytes;
      for (int r = 0; r < 8; r++) {
        const uint8_t *block = src + (g * 8 + r) * row_bytes + b * block_bytes;
        memcpy(out + 2 * r, block, 2);
        for (int j = 0; j < (block_bytes - 2) / 4; j++) memcpy(out + 16 + 32 * j + 4 * r, block + 2 + 4 * j, 4);
      }
    }
}

void rvm_gguf_repack_q4_0x8(const uint8_t *src, int64_t rows, int64_t k, uint8_t *dst) {
  regroup_scaled_blocks(src, rows, k / 32, 18, dst);
}

/* q4_K's 6-bit scale and minimum of sub-block j (0..7) from its 12 packed bytes. */
static void q4k_scale_min(int j, const uint8_t *s, uint8_t *scale, uint8_t *min) {
  if (j < 4) {
    *scale = s[j] & 63;
    *min = s[j + 4] & 63;
  } else {
    *scale = (uint8_t)((s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4));
    *min = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

void rvm_gguf_repack_q4_Kx8(const uint8_t *src, int64_t rows, int64_t k, uint8_t *dst) {
  int64_t supers = k / 256, row_bytes = supers * 144;
  for (int64_t g = 0; g < rows / 8; g++)
    for (int64_t b = 0; b < supers; b++) {
      uint8_t *out = dst + (g * supers + b) * 1184;
      for (int r = 0; r < 8; r++) {
        const uint8_t *block = src + (g * 8 + r) * row_bytes + b * 144;
        memcpy(out + 2 * r, block, 2);
        memcpy(out + 16 + 2 * r, block + 2, 2);
        for (int j = 0; j < 8; j++) q4k_scale_min(j, block + 4, &out[32 + 8 * j + r], &out[96 + 8 * j + r]);
        for (int c = 0; c < 4; c++)
          for (int j = 0; j < 8; j++) memcpy(out + 160 + 256 * c + 32 * j + 4 * r, block + 16 + 32 * c + 4 * j, 4);
      }
    }
}

void rvm_gguf_repack_q8_0x8(const uint8_t *src, int64_t rows, int64_t k, uint8_t *dst) {
  regroup_scaled_blocks(src, rows, k / 32, 34, dst);
}
