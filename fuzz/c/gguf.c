/*
 * gguf.c (fuzz harness): runtime-shim/src/gguf.c's reader on arbitrary bytes. Every tensor it
 * reports has its name and the first and last byte of its data read, so that AddressSanitizer
 * sees any range the reader let past the buffer.
 */
#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

static int touch(void *ctx, const rvm_gguf_tensor *t) {
  volatile uint8_t *sink = ctx;
  if (t->name_len) *sink ^= (uint8_t)(t->name[0] ^ t->name[t->name_len - 1]);
  if (t->nbytes) *sink ^= (uint8_t)(t->data[0] ^ t->data[t->nbytes - 1]);
  return 0;
}

/* Reads data[0..len) as a GGUF file; the status is the reader's. */
int gguf_fuzz_one(const uint8_t *data, size_t len) {
  uint8_t sink = 0;
  char err[256];
  return rvm_gguf_read(data, len, touch, &sink, err, sizeof err);
}
