/*
 * tracker.c: registration with TVM's RPC tracker (tvm-rpc.md §11), as TVM's own server does it.
 * After a magic exchange every message is a u32 length and JSON; the server says who it is
 * (UPDATE_INFO), puts a match key ("KEY:random") in the queue for its key (PUT), and while idle
 * asks every 2 s which keys are still waiting (GET_PENDING_MATCHKEYS). A client that got the key
 * from the tracker connects directly with it. A tracker that goes away is retried; the server
 * keeps serving direct clients with the plain key meanwhile.
 */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rpc.h"

enum { TRACKER_PUT = 3, TRACKER_UPDATE_INFO = 5, TRACKER_GET_PENDING_MATCHKEYS = 7 };

struct rpc_tracker {
  char host[256];
  int port;
  char key[256];
  int server_port;
  int fd;
  char matchkey[320];
  int misses;
  time_t retry_at;
};

/* Sends one JSON message and reads the reply into buf (NUL-terminated). Returns 0 or -1. */
static int exchange(rpc_tracker *t, const char *json, char *buf, size_t buf_size) {
  uint32_t len = (uint32_t)strlen(json);
  uint8_t head[4] = {(uint8_t)len, (uint8_t)(len >> 8), (uint8_t)(len >> 16), (uint8_t)(len >> 24)};
  if (rpc_write_all(t->fd, head, 4) != 0 || rpc_write_all(t->fd, json, len) != 0) return -1;
  if (rpc_read_exact(t->fd, head, 4) != 0) return -1;
  uint32_t reply = (uint32_t)head[0] | (uint32_t)head[1] << 8 | (uint32_t)head[2] << 16 | (uint32_t)head[3] << 24;
  if (reply >= buf_size) return -1;
  if (rpc_read_exact(t->fd, buf, reply) != 0) return -1;
  buf[reply] = 0;
  return 0;
}

static void disconnect(rpc_tracker *t, const char *why) {
  if (t->fd >= 0) {
    fprintf(stderr, "relaxc rpc-server: lost the tracker at %s:%d (%s); retrying every 5 s\n", t->host, t->port, why);
    close(t->fd);
  }
  t->fd = -1;
  t->matchkey[0] = 0;
  t->retry_at = time(NULL) + 5;
}

static unsigned long long random_digits(void) {
  unsigned long long r = 0;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0 || read(fd, &r, sizeof r) != (ssize_t)sizeof r) r = (unsigned long long)time(NULL) ^ ((unsigned long long)getpid() << 20);
  if (fd >= 0) close(fd);
  return r % 10000000000000000ull;
}

/* PUTs a fresh match key. Returns 0 or -1 (disconnected). */
static int put_matchkey(rpc_tracker *t) {
  char json[1024], reply[256];
  snprintf(t->matchkey, sizeof t->matchkey, "%s:0.%016llu", t->key, random_digits());
  snprintf(json, sizeof json, "[%d, \"%s\", [%d, \"%s\"], null]", TRACKER_PUT, t->key, t->server_port, t->matchkey);
  if (exchange(t, json, reply, sizeof reply) != 0 || strcmp(reply, "0") != 0) {
    disconnect(t, "it refused the registration");
    return -1;
  }
  t->misses = 0;
  return 0;
}

static void connect_and_register(rpc_tracker *t) {
  char err[512], json[1024], reply[256];
  t->fd = rpc_connect(t->host, t->port, err, sizeof err);
  if (t->fd < 0) {
    fprintf(stderr, "relaxc rpc-server: warning: %s (the tracker); retrying every 5 s\n", err);
    t->retry_at = time(NULL) + 5;
    return;
  }
  rpc_set_read_timeout(t->fd, 10);
  uint8_t magic[4] = {0x71, 0xf2, 0x02, 0x00}, theirs[4];
  if (rpc_write_all(t->fd, magic, 4) != 0 || rpc_read_exact(t->fd, theirs, 4) != 0 || memcmp(magic, theirs, 4) != 0) {
    disconnect(t, "it is not a TVM RPC tracker");
    return;
  }
  snprintf(json, sizeof json, "[%d, {\"key\": \"server:%s\", \"addr\": [null, %d]}]", TRACKER_UPDATE_INFO, t->key,
           t->server_port);
  if (exchange(t, json, reply, sizeof reply) != 0 || strcmp(reply, "0") != 0) {
    disconnect(t, "it refused the server's information");
    return;
  }
  if (put_matchkey(t) == 0)
    fprintf(stderr, "relaxc rpc-server: registered with the tracker at %s:%d as \"%s\"\n", t->host, t->port, t->key);
}

rpc_tracker *rpc_tracker_open(const char *host, int port, const char *key, int server_port) {
  rpc_tracker *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  snprintf(t->host, sizeof t->host, "%s", host);
  snprintf(t->key, sizeof t->key, "%s", key);
  t->port = port;
  t->server_port = server_port;
  t->fd = -1;
  connect_and_register(t);
  return t;
}

const char *rpc_tracker_matchkey(const rpc_tracker *t) { return t && t->fd >= 0 && t->matchkey[0] ? t->matchkey : NULL; }

void rpc_tracker_idle(rpc_tracker *t) {
  if (!t) return;
  if (t->fd < 0) {
    if (time(NULL) >= t->retry_at) connect_and_register(t);
    return;
  }
  char json[16], reply[65536];
  snprintf(json, sizeof json, "[%d]", TRACKER_GET_PENDING_MATCHKEYS);
  if (exchange(t, json, reply, sizeof reply) != 0) {
    disconnect(t, "no answer");
    return;
  }
  char quoted[340];
  snprintf(quoted, sizeof quoted, "\"%s\"", t->matchkey);
  if (strstr(reply, quoted)) {
    t->misses = 0;
    return;
  }
  /* The key was handed to a client that never came (or the tracker restarted): after about 8 s
   * without it, queue a new one, as TVM's server does. */
  if (++t->misses * 2 > 6) put_matchkey(t);
}

void rpc_tracker_renew(rpc_tracker *t) {
  if (t && t->fd >= 0) put_matchkey(t);
}

void rpc_tracker_close(rpc_tracker *t) {
  if (!t) return;
  if (t->fd >= 0) close(t->fd);
  free(t);
}
