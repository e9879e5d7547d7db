/*
 * main.c: relaxc's RPC server for boards: options, the listener, the handshake and one session
 * at a time, each in a forked process with its own upload directory.
 *
 * A forked session is what TVM's server does too, and it is what makes the server safe to leave
 * running: a model that crashes or runs out of memory ends only its session, everything a session
 * loaded or allocated is gone with its process, and a session that outlives the client's
 * `session_timeout` is killed and the client told so. One session at a time because a board
 * serves timing runs: two sessions would share its cores and skew each other's measurements (and
 * TVM's tracker hands a board to one client at a time).
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rpc.h"

#define HANDSHAKE_SECONDS 10
#define MAX_KEY 4096

static const char USAGE[] =
    "usage: relaxc rpc-server [--host HOST] [--port PORT] [--key KEY] [--tracker HOST:PORT]\n"
    "                         [--max-upload SIZE] [--max-packet SIZE] [--max-memory SIZE]\n"
    "                         [--workdir DIR]\n"
    "\n"
    "Serves TVM's RPC protocol (TVM 0.27's Python client: tvm.rpc.connect, upload, load_module,\n"
    "time_evaluator) for relaxc models on this machine, one session at a time.\n"
    "\n"
    "  --host HOST        address to listen on (default 127.0.0.1; any other address lets every\n"
    "                     client that reaches it upload and run code here)\n"
    "  --port PORT        port to listen on (default 9090; 0 picks a free one)\n"
    "  --key KEY          the key clients must give (tvm.rpc.connect(..., key=KEY)); with a\n"
    "                     tracker, the name clients request (default: empty)\n"
    "  --tracker H:P      register with TVM's RPC tracker at H:P (needs --key)\n"
    "  --max-upload SIZE  largest file a client may upload (default 1G; K, M, G suffixes)\n"
    "  --max-packet SIZE  largest message held in memory; tensor copies are split to fit\n"
    "                     (default 16M)\n"
    "  --max-memory SIZE  most tensor memory a client may allocate at once (default: no limit;\n"
    "                     a session that runs the board out of memory ends alone)\n"
    "  --workdir DIR      where each session's private upload directory is made (default $TMPDIR\n"
    "                     or /tmp); it is removed when the session ends\n";

typedef struct options {
  const char *host;
  int port;
  const char *key;
  char tracker_host[256];
  int tracker_port;
  rpc_limits limits;
  const char *workdir;
} options;

static volatile sig_atomic_t stop_requested;
/* The signal handler writes here, so a signal that lands just before poll() still wakes it. */
static int wake_pipe[2] = {-1, -1};

static void on_stop(int sig) {
  (void)sig;
  stop_requested = 1;
  ssize_t ignored = write(wake_pipe[1], "", 1);
  (void)ignored;
}

__attribute__((format(printf, 1, 2), noreturn)) static void usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "relaxc rpc-server: ");
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n\n%s", USAGE);
  exit(2);
}

static uint64_t parse_size(const char *flag, const char *text) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(text, &end, 10);
  uint64_t scale = 1;
  if (*end == 'K' || *end == 'k') scale = 1ull << 10;
  if (*end == 'M' || *end == 'm') scale = 1ull << 20;
  if (*end == 'G' || *end == 'g') scale = 1ull << 30;
  if (scale != 1) end++;
  if (errno || end == text || *end || v == 0 || v > (1ull << 50) / scale || text[0] == '-')
    usage_error("%s takes a size such as 512M or 2G", flag);
  return v * scale;
}

static int parse_port(const char *flag, const char *text) {
  char *end;
  long v = strtol(text, &end, 10);
  if (end == text || *end || v < 0 || v > 65535) usage_error("%s takes a port number (0 to 65535)", flag);
  return (int)v;
}

static options parse(int argc, char **argv) {
  options o = {"127.0.0.1", 9090, "", "", 0, {16u << 20, 1u << 30, 0}, NULL};
  const char *tmp = getenv("TMPDIR");
  o.workdir = tmp && *tmp ? tmp : "/tmp";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(USAGE, stdout);
      exit(0);
    }
    if (i + 1 >= argc) usage_error("unknown option or missing value: %s", a);
    const char *v = argv[++i];
    if (!strcmp(a, "--host")) {
      o.host = v;
    } else if (!strcmp(a, "--port")) {
      o.port = parse_port(a, v);
    } else if (!strcmp(a, "--key")) {
      o.key = v;
      for (const char *c = v; *c; c++)
        if (!(*c == '-' || *c == '_' || *c == '.' || (*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'z') ||
              (*c >= 'A' && *c <= 'Z')))
          usage_error("--key %s: a key is letters, digits, '-', '_' and '.'", v);
    } else if (!strcmp(a, "--tracker")) {
      const char *colon = strrchr(v, ':');
      if (!colon || colon == v || (size_t)(colon - v) >= sizeof o.tracker_host)
        usage_error("--tracker takes HOST:PORT, not %s", v);
      snprintf(o.tracker_host, sizeof o.tracker_host, "%.*s", (int)(colon - v), v);
      o.tracker_port = parse_port("--tracker", colon + 1);
    } else if (!strcmp(a, "--max-upload")) {
      o.limits.max_upload = parse_size(a, v);
    } else if (!strcmp(a, "--max-packet")) {
      o.limits.max_packet = parse_size(a, v);
      if (o.limits.max_packet < 4096) usage_error("--max-packet must be at least 4K");
    } else if (!strcmp(a, "--max-memory")) {
      o.limits.max_memory = parse_size(a, v);
    } else if (!strcmp(a, "--workdir")) {
      o.workdir = v;
    } else {
      usage_error("unknown option %s", a);
    }
  }
  if (o.tracker_host[0] && !o.key[0]) usage_error("--tracker needs --key: the name clients request");
  return o;
}

/* Removes a session directory and the uploads in it (sessions write no subdirectories). */
static void remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (d) {
    struct dirent *entry;
    char path[4096];
    while ((entry = readdir(d)) != NULL) {
      if (!strcmp(entry->d_name, ".") || !strcmp(entry->d_name, "..")) continue;
      snprintf(path, sizeof path, "%s/%s", dir, entry->d_name);
      unlink(path);
    }
    closedir(d);
  }
  if (rmdir(dir) != 0) fprintf(stderr, "relaxc rpc-server: warning: cannot remove %s: %s\n", dir, strerror(errno));
}

/* Reads the client's handshake and answers it (tvm-rpc.md §1). Returns the session timeout the
 * client asked for (0: none), or -1 when the client was refused. */
static double handshake(int fd, const options *o, const rpc_tracker *tracker) {
  uint8_t head[8];
  rpc_set_read_timeout(fd, HANDSHAKE_SECONDS);
  if (rpc_read_exact(fd, head, 8) != 0) return -1;
  int32_t magic = (int32_t)((uint32_t)head[0] | (uint32_t)head[1] << 8 | (uint32_t)head[2] << 16 | (uint32_t)head[3] << 24);
  int32_t key_len = (int32_t)((uint32_t)head[4] | (uint32_t)head[5] << 8 | (uint32_t)head[6] << 16 | (uint32_t)head[7] << 24);
  if (magic != RPC_MAGIC || key_len < 0 || key_len > MAX_KEY) {
    fprintf(stderr, "relaxc rpc-server: refused a connection that is not a TVM RPC client\n");
    return -1;
  }
  char key[MAX_KEY + 1];
  if (rpc_read_exact(fd, key, (size_t)key_len) != 0) return -1;
  key[key_len] = 0;
  char expected[400];
  const char *matchkey = rpc_tracker_matchkey(tracker);
  snprintf(expected, sizeof expected, "client:%s", matchkey ? matchkey : o->key);
  size_t first = strcspn(key, " \t");
  double timeout = 0;
  if (first != strlen(expected) || memcmp(key, expected, first) != 0) {
    uint8_t refuse[4] = {0x73, 0xf2, 0x0f, 0x00};
    rpc_write_all(fd, refuse, 4);
    fprintf(stderr, "relaxc rpc-server: refused a client with the wrong key\n");
    return -1;
  }
  for (char *word = strstr(key, "-timeout="); word; word = strstr(word + 1, "-timeout=")) {
    double t = strtod(word + 9, NULL);
    if (t > 0 && t < 1e9) timeout = t;
  }
  char reply[8 + 300];
  int server_len = snprintf(reply + 8, sizeof reply - 8, "server:%s", o->key);
  uint32_t code = RPC_MAGIC, len = (uint32_t)server_len;
  for (int i = 0; i < 4; i++) {
    reply[i] = (char)(code >> (8 * i));
    reply[4 + i] = (char)(len >> (8 * i));
  }
  if (rpc_write_all(fd, reply, 8 + (size_t)server_len) != 0) return -1;
  rpc_set_read_timeout(fd, 0);
  return timeout;
}

static double seconds_since(const struct timespec *start) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)(now.tv_sec - start->tv_sec) + (double)(now.tv_nsec - start->tv_nsec) / 1e9;
}

/* Runs one session in a child process and waits for it, killing it when the client's session
 * timeout passes or the server is asked to stop. */
static void run_session(int listener, int fd, const options *o, rpc_tracker *tracker, double timeout) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/relaxc-rpc-XXXXXX", o->workdir);
  if (!mkdtemp(dir)) {
    fprintf(stderr, "relaxc rpc-server: cannot make a session directory in %s: %s\n", o->workdir, strerror(errno));
    rpc_writer w = {0};
    rpc_exception(&w, "RuntimeError: the server cannot make a session directory (see its --workdir)");
    rpc_write_all(fd, w.buf, w.len);
    rpc_writer_free(&w);
    return;
  }
  int done[2];
  if (pipe(done) != 0) {
    remove_dir(dir);
    return;
  }
  struct timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  pid_t child = fork();
  if (child == 0) {
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    close(listener);
    close(done[0]);
    close(wake_pipe[0]);
    close(wake_pipe[1]);
    rpc_tracker_close(tracker);
    int status = rpc_serve_session(fd, dir, &o->limits);
    close(fd);
    exit(status);
  }
  close(done[1]);
  if (child < 0) {
    fprintf(stderr, "relaxc rpc-server: cannot start a session: %s\n", strerror(errno));
    close(done[0]);
    remove_dir(dir);
    return;
  }
  int timed_out = 0;
  for (;;) {
    int wait_ms = -1;
    if (timeout > 0) {
      double left = timeout - seconds_since(&start);
      if (left <= 0) {
        timed_out = 1;
        break;
      }
      wait_ms = (int)(left * 1000) + 1;
    }
    struct pollfd p[2] = {{done[0], POLLIN, 0}, {wake_pipe[0], POLLIN, 0}};
    poll(p, 2, wait_ms);
    if (stop_requested) break;
    if (p[0].revents) break; /* the child closed its end: it has exited */
  }
  if (timed_out || stop_requested) kill(child, SIGKILL);
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  close(done[0]);
  if (timed_out) {
    char message[200];
    snprintf(message, sizeof message,
             "RPCSessionTimeoutError: Your %gs session has expired, try to increase the \"session_timeout\" value.",
             timeout);
    rpc_writer w = {0};
    rpc_exception(&w, message);
    rpc_write_all(fd, w.buf, w.len);
    rpc_writer_free(&w);
    fprintf(stderr, "relaxc rpc-server: the session's %gs timeout passed; it was ended\n", timeout);
  } else if (WIFSIGNALED(status) && !stop_requested) {
    fprintf(stderr, "relaxc rpc-server: the session died of signal %d (a model crashed?); serving the next client\n",
            WTERMSIG(status));
  }
  remove_dir(dir);
}

int main(int argc, char **argv) {
  options o = parse(argc, argv);
  if (pipe(wake_pipe) != 0 || fcntl(wake_pipe[1], F_SETFL, O_NONBLOCK) != 0 || fcntl(wake_pipe[0], F_SETFD, FD_CLOEXEC) != 0 ||
      fcntl(wake_pipe[1], F_SETFD, FD_CLOEXEC) != 0) {
    fprintf(stderr, "relaxc rpc-server: cannot make a pipe: %s\n", strerror(errno));
    return 1;
  }
  struct sigaction stop;
  memset(&stop, 0, sizeof stop);
  stop.sa_handler = on_stop; /* no SA_RESTART: accept and poll return so the loop can end */
  sigaction(SIGINT, &stop, NULL);
  sigaction(SIGTERM, &stop, NULL);
  signal(SIGPIPE, SIG_IGN);

  char err[512];
  int port = 0;
  int listener = rpc_listen(o.host, o.port, &port, err, sizeof err);
  if (listener < 0) {
    fprintf(stderr, "relaxc rpc-server: %s\n", err);
    return 1;
  }
  if (!rpc_is_loopback(o.host))
    fprintf(stderr,
            "relaxc rpc-server: warning: listening on %s: any client that reaches this port%s can upload a library and "
            "run its code on this machine as this user\n",
            o.host, o.key[0] ? " and knows the key" : "");
  rpc_tracker *tracker = o.tracker_host[0] ? rpc_tracker_open(o.tracker_host, o.tracker_port, o.key, port) : NULL;
  printf("listening on %s:%d\n", o.host, port);
  fflush(stdout);

  while (!stop_requested) {
    struct pollfd p[2] = {{listener, POLLIN, 0}, {wake_pipe[0], POLLIN, 0}};
    int ready = poll(p, 2, tracker ? 2000 : -1);
    if (stop_requested) break;
    if (ready == 0) {
      rpc_tracker_idle(tracker);
      continue;
    }
    if (ready < 0) continue;
    int fd = accept(listener, NULL, NULL);
    if (fd < 0) continue;
    double timeout = handshake(fd, &o, tracker);
    if (timeout >= 0) {
      run_session(listener, fd, &o, tracker, timeout);
      rpc_tracker_renew(tracker);
    }
    close(fd);
  }
  close(listener);
  rpc_tracker_close(tracker);
  fprintf(stderr, "relaxc rpc-server: stopped\n");
  return 0;
}
