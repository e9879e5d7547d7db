/*
 * transport.c: TCP for the server and its tracker connection. Reads and writes are exact (TVM's
 * client sends one message in several writes) and retried on EINTR; writes never raise SIGPIPE,
 * so a client that goes away is an error return, not a dead server.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "rpc.h"

static struct addrinfo *resolve(const char *host, int port, int passive, char *err, size_t err_size) {
  struct addrinfo hints, *found = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  char service[16];
  snprintf(service, sizeof service, "%d", port);
  int rc = getaddrinfo(host, service, &hints, &found);
  if (rc != 0) {
    snprintf(err, err_size, "cannot resolve %s: %s", host, gai_strerror(rc));
    return NULL;
  }
  return found;
}

/* A TCP socket on host:port, bound and listening (passive) or connected. Returns -1 with a
 * message in err when no address of the host works. */
static int open_socket(const char *host, int port, int passive, char *err, size_t err_size) {
  struct addrinfo *found = resolve(host, port, passive, err, err_size);
  if (!found) return -1;
  int fd = -1, last_errno = 0;
  for (struct addrinfo *a = found; a; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_errno = errno;
      continue;
    }
    int one = 1;
    if (passive) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int ok = passive ? bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 16) == 0
                     : connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    if (ok) break;
    last_errno = errno;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(found);
  if (fd < 0) {
    snprintf(err, err_size, "cannot %s %s:%d: %s", passive ? "listen on" : "connect to", host, port, strerror(last_errno));
    return -1;
  }
  return fd;
}

int rpc_listen(const char *host, int port, int *bound_port, char *err, size_t err_size) {
  int fd = open_socket(host, port, 1, err, err_size);
  if (fd < 0) return -1;
  struct sockaddr_storage addr;
  socklen_t addr_len = sizeof addr;
  *bound_port = port;
  if (getsockname(fd, (struct sockaddr *)&addr, &addr_len) == 0) {
    if (addr.ss_family == AF_INET) *bound_port = ntohs(((struct sockaddr_in *)&addr)->sin_port);
    if (addr.ss_family == AF_INET6) *bound_port = ntohs(((struct sockaddr_in6 *)&addr)->sin6_port);
  }
  return fd;
}

int rpc_connect(const char *host, int port, char *err, size_t err_size) {
  int fd = open_socket(host, port, 0, err, err_size);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

int rpc_read_exact(int fd, void *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = recv(fd, (uint8_t *)buf + got, n - got, 0);
    if (r > 0) {
      got += (size_t)r;
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r == 0 && got == 0) return 1;
    return -1;
  }
  return 0;
}

int rpc_write_all(int fd, const void *buf, size_t n) {
  size_t sent = 0;
  while (sent < n) {
    ssize_t r = send(fd, (const uint8_t *)buf + sent, n - sent, MSG_NOSIGNAL);
    if (r > 0) {
      sent += (size_t)r;
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    return -1;
  }
  return 0;
}

void rpc_set_read_timeout(int fd, double seconds) {
  struct timeval tv = {0, 0};
  if (seconds > 0) {
    tv.tv_sec = (time_t)seconds;
    tv.tv_usec = (suseconds_t)((seconds - (double)tv.tv_sec) * 1e6);
  }
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

int rpc_is_loopback(const char *host) {
  if (strcmp(host, "localhost") == 0 || strcmp(host, "::1") == 0) return 1;
  return strncmp(host, "127.", 4) == 0;
}
