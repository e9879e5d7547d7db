/*
 * rpc_packet.c: the fuzz harness for relaxc's RPC server (fuzz_targets/rpc_packet.rs). The input
 * is what a client sends after the handshake: packets of u64 length and body. Each one goes
 * through the server's own decoder and request handling (rpc_session_packet) on a session whose
 * uploads may be at most 0 bytes, so no model is ever loaded from the input, and whose tensors
 * may hold 64 MiB (--max-memory; the fuzzer's memory limit is 2 GiB); then the session
 * frees everything, so LeakSanitizer sees what it forgot.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "rpc.h"

/* Runs one input; returns 0. The session's directory is made once per process. */
int rpc_fuzz_one(const uint8_t *data, size_t len) {
  static char workdir[64] = "";
  if (!workdir[0]) {
    strcpy(workdir, "/tmp/relaxc-rpc-fuzz-XXXXXX");
    if (!mkdtemp(workdir)) abort();
  }
  rpc_limits limits = {1u << 20, 0, 64u << 20};
  rpc_session s;
  rpc_session_init(&s, -1, workdir, &limits);
  rpc_writer w = {0};
  size_t at = 0;
  while (len - at >= 8) {
    uint64_t body_len = 0;
    for (int i = 7; i >= 0; i--) body_len = (body_len << 8) | data[at + i];
    at += 8;
    if (body_len > len - at) break;
    /* A copy of exactly the body, so ASan sees any read past its end. */
    uint8_t *body = malloc(body_len ? (size_t)body_len : 1);
    if (!body) abort();
    memcpy(body, data + at, (size_t)body_len);
    at += (size_t)body_len;
    int shutdown = rpc_session_packet(&s, body, body_len, &w);
    free(body);
    if (shutdown) break;
    /* Every reply is a whole packet whose length field counts the rest. */
    uint64_t reply_len = 0;
    for (int i = 7; i >= 0; i--) reply_len = (reply_len << 8) | w.buf[i];
    if (w.failed || w.len < 12 || reply_len != w.len - 8) abort();
  }
  rpc_session_end(&s);
  rpc_writer_free(&w);
  return 0;
}
