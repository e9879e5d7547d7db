/*
 * gguf.h: reading GGUF files (llama.cpp's format: a header of typed key/value metadata, a table
 * of tensors, then their data) from bytes in memory, with no I/O and no allocation, so that the
 * weights loader (weights.c) and the fuzz target share one bounded reader.
 */
#ifndef RVM_GGUF_H
#define RVM_GGUF_H

#include <stddef.h>
#include <stdint.h>

/* One tensor of the file: its name (not NUL-terminated), its ggml type, its dims innermost first
 * (GGUF's ne[]: a matrix of n rows of k values is {k, n}) and its bytes inside the buffer. */
typedef struct rvm_gguf_tensor {
  const char *name;
  size_t name_len;
  uint32_t type;
  uint32_t ndim;
  uint64_t dims[4];
  const uint8_t *data;
  uint64_t nbytes;
} rvm_gguf_tensor;

/* Called for each tensor in the file's order; a non-zero return stops the reading and is returned. */
typedef int (*rvm_gguf_visit)(void *ctx, const rvm_gguf_tensor *tensor);

/* Reads the GGUF file in bytes[0..size). Every length, count, offset and size is checked against
 * the buffer before use. On a malformed file, writes what is wrong (naming the tensor or key)
 * to err and returns -1 without calling visit again. */
int rvm_gguf_read(const uint8_t *bytes, size_t size, rvm_gguf_visit visit, void *ctx, char *err, size_t err_size);

/* The name of ggml type `type` and its block: values per block and bytes per block; NULL for a
 * type this reader does not know. */
const char *rvm_gguf_type(uint32_t type, uint32_t *block, uint32_t *block_bytes);

/* q4_0 rows regrouped eight at a time (relaxc's "q4_0x8", what the quantized kernels read
 * fastest): for each group of 8 rows and each block of 32 values, the 8 rows' scales (f16), then
 * for j = 0..3 the 8 rows' bytes 4j..4j+3 of the block's 16 bytes of values, row after row.
 * `src` holds `rows` (a multiple of 8) rows of k / 32 blocks; dst the same number of bytes. */
void rvm_gguf_repack_q4_0x8(const uint8_t *src, int64_t rows, int64_t k, uint8_t *dst);

/* q8_0 rows regrouped eight at a time (relaxc's "q8_0x8"): for each group of 8 rows and each
 * block of 32 values, the 8 rows' scales (f16), then for j = 0..7 the 8 rows' values 4j..4j+3. */
void rvm_gguf_repack_q8_0x8(const uint8_t *src, int64_t rows, int64_t k, uint8_t *dst);

/* q4_K rows regrouped eight at a time (relaxc's "q4_Kx8"): for each group of 8 rows and each
 * super-block of 256 values, the 8 rows' d (f16), their dmin (f16), then for each of the 8
 * sub-blocks the 8 rows' 6-bit scales as bytes, likewise the 8 rows' minimums, then for chunk
 * c = 0..3 and j = 0..7 the 8 rows' bytes 32c + 4j .. 32c + 4j + 3 of the 128 bytes of values:
 * 1184 bytes where the 8 rows took 1152 (the scales unpacked). `dst` holds rows / 8 * k / 256 *
 * 1184 bytes. */
void rvm_gguf_repack_q4_Kx8(const uint8_t *src, int64_t rows, int64_t k, uint8_t *dst);

#endif /* RVM_GGUF_H */
