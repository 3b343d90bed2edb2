/* fuzz_http.c — libFuzzer target: the HTTP endpoint (engine/http.c on
 * libmicrohttpd) from outside, as a client on the network sees it.
 *
 * LLVMFuzzerInitialize starts a small real job (a slow endless source ->
 * key_by -> a keyed counting sink, with a state directory) and its
 * endpoint on 127.0.0.1, port 0.  Each input is written as raw bytes to a
 * new loopback connection, the write side is then closed, and the answer
 * is read until the server closes, for at most ANSWER_WAIT_MS: a server
 * that neither answers nor closes by then is a finding (abort).  Whatever
 * comes back must start as an HTTP/1.x status line.
 *
 * No checkpoint ever completes (the interval is 49 days), so a POST
 * /savepoints the fuzzer writes is refused before anything is written to
 * the file system, whatever directory it names.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "fuzz_lines.h"
#include "sluice.h"

#define ANSWER_WAIT_MS 10000 /* far above any answer's time */
#define ANSWER_KEEP_BYTES 16 /* of the answer: enough for the status line */
#define RECORDS_PER_NEXT 16

static char state_dir[] = "/tmp/sluice-fuzz-http-XXXXXX";
static sl_job *job;
static sl_http *http;
static int port;
static uint64_t position;

static int slow_next(sl_ctx *ctx, void *state) {
  uint64_t *i = state;
  for (int k = 0; k < RECORDS_PER_NEXT; k++, (*i)++) {
    sl_tuple t = {.key = *i % 50, .value = *i};
    int rc = sl_emit(ctx, &t, sizeof t);
    if (rc)
      return rc;
  }
  struct timespec pause = {.tv_sec = 0, .tv_nsec = 10 * 1000 * 1000};
  nanosleep(&pause, 0); /* the machine is shared: a trickle is enough */
  return 0;
}

static uint64_t tuple_key(void *user, const sl_record *in) {
  (void)user;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  return t.key;
}

static int count_per_key(sl_ctx *ctx, void *state, int input,
                         const sl_record *in) {
  (void)state, (void)input, (void)in;
  uint64_t *n = 0;
  int rc = sl_state_update(ctx, 1, sizeof *n, 0, (void **)&n);
  if (rc)
    return rc > 0 ? -rc : rc;
  ++*n;
  return 0;
}

static void stop_all(void) {
  sl_http_stop(http);
  sl_job_stop(job);
  sl_job_wait(job);
  sl_job_destroy(job);
  char cmd[sizeof state_dir + 16];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", state_dir);
  if (system(cmd) != 0)
    fprintf(stderr, "fuzz_http: could not remove %s\n", state_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  signal(SIGPIPE, SIG_IGN); /* a server that closes first is no crash */
  if (!mkdtemp(state_dir))
    abort();
  sl_job_config config = SL_JOB_CONFIG_INIT;
  config.checkpoint.state_dir = state_dir;
  config.checkpoint.interval_ms = UINT32_MAX; /* 49 days: never */
  config.checkpoint.no_sync = 1;
  config.no_pinning = 1;
  static const sl_source_ops source_ops = {.next = slow_next};
  static const sl_process_ops sink_ops = {.process = count_per_key};
  sl_op *source, *by, *sink;
  if (sl_job_create(&config, &job) != 0 ||
      sl_op_source(job, "source", 1, &source_ops, &position, &source) != 0 ||
      sl_op_key_by(job, "by_key", source, tuple_key, 0, &by) != 0 ||
      sl_op_sink(job, "counts", by, 2, &sink_ops, 0, &sink) != 0 ||
      sl_http_start(job, "127.0.0.1", 0, &http) != 0 ||
      sl_job_start(job) != 0) {
    fprintf(stderr, "fuzz_http: setup failed: %s\n",
            job ? sl_job_error(job) : "no job");
    abort();
  }
  port = sl_http_port(http);
  atexit(stop_all);
  return 0;
}

static int64_t now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static int connect_endpoint(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    abort();
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  int rc = connect(fd, (struct sockaddr *)&a, sizeof a) == 0 ? 0 : errno;
  if (rc == EINTR) {
    /* A signal (libFuzzer's timer) cut the call short; the connection
     * goes on by itself: wait for it and take its outcome. */
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    while (poll(&p, 1, ANSWER_WAIT_MS) < 0 && errno == EINTR)
      ;
    socklen_t len = sizeof rc;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &rc, &len) != 0)
      rc = errno;
  }
  if (rc != 0) {
    fprintf(stderr, "fuzz_http: connect: %s\n", strerror(rc));
    abort(); /* the endpoint stopped listening: a finding */
  }
  return fd;
}

/* Send what it takes; the server may close early (EPIPE, ECONNRESET). */
static void send_all(int fd, const uint8_t *data, size_t size) {
  for (size_t at = 0; at < size;) {
    ssize_t n = send(fd, data + at, size - at, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return;
    at += (size_t)n;
  }
}

/* Read until the server closes; returns the bytes read (the first
 * ANSWER_KEEP_BYTES kept in head), aborts after ANSWER_WAIT_MS. */
static size_t read_answer(int fd, char *head) {
  int64_t deadline = now_ms() + ANSWER_WAIT_MS;
  size_t total = 0;
  for (;;) {
    int64_t left = deadline - now_ms();
    if (left <= 0) {
      fprintf(stderr, "fuzz_http: no answer and no close within %d ms\n",
              ANSWER_WAIT_MS);
      abort();
    }
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int ready = poll(&p, 1, (int)left);
    if (ready < 0 && errno == EINTR)
      continue;
    if (ready <= 0)
      continue; /* the deadline check above ends it */
    char buffer[4096];
    ssize_t n = recv(fd, buffer, sizeof buffer, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return total; /* closed (or reset) */
    for (ssize_t i = 0; i < n && total + (size_t)i < ANSWER_KEEP_BYTES; i++)
      head[total + (size_t)i] = buffer[i];
    total += (size_t)n;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int fd = connect_endpoint();
  send_all(fd, data, size);
  shutdown(fd, SHUT_WR); /* the request is all there is */
  char head[ANSWER_KEEP_BYTES] = {0};
  size_t got = read_answer(fd, head);
  close(fd);
  if (got >= 8)
    FUZZ_CHECK(memcmp(head, "HTTP/1.", 7) == 0);
  return 0;
}
