/* test_http.c — the HTTP endpoint (libmicrohttpd) against a running job,
 * driven with the real curl program and raw sockets on 127.0.0.1:
 * /metrics parses as Prometheus text 0.0.4 (HELP and TYPE before every
 * sample, numeric values, escaped labels), /jobs and /checkpoints parse as
 * JSON with the expected fields, 404 / 405 / 400 answers, the start
 * errors, and `sluice run --http 0` serving /metrics.  Then the security
 * rules (sluice.h, "HTTP endpoint"): savepoints only below the root, each
 * refused name leaving no file anywhere; form types, foreign Origins and
 * Hosts refused; the bearer token; slow clients; 413 before the body.
 *
 * The CLI binary comes from the environment (SLUICE_BIN, set by meson). */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sluice.h"
#include "test_dirs.h"
#include "test_util.h"

/* An operator name that needs escaping in every format. */
#define ODD_NAME "we\"ird\\op\nx"
#define ODD_LABEL "we\\\"ird\\\\op\\nx"

/* ------------------------------------------------------------ curl */

typedef struct reply {
  int status;         /* HTTP status, 0 if curl failed */
  char *body;         /* malloc'd, NUL-terminated */
  char *headers;      /* malloc'd */
} reply;

/* Run curl with extra arguments (already shell-quoted) on port/path. */
static reply curl(int port, const char *path, const char *args) {
  char body_path[] = "/tmp/sluice-http-body-XXXXXX";
  char head_path[] = "/tmp/sluice-http-head-XXXXXX";
  int fd1 = mkstemp(body_path), fd2 = mkstemp(head_path);
  cr_assert(fd1 >= 0 && fd2 >= 0);
  close(fd1);
  close(fd2);
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "curl -s -S --max-time 20 -o '%s' -D '%s' -w '%%{http_code}' %s "
           "'http://127.0.0.1:%d%s'",
           body_path, head_path, args ? args : "", port, path);
  FILE *p = popen(cmd, "r");
  cr_assert(p, "popen: %s", strerror(errno));
  reply r = {0};
  if (fscanf(p, "%d", &r.status) != 1)
    r.status = 0;
  int rc = pclose(p);
  cr_assert_eq(rc, 0, "curl failed (%d): %s", rc, cmd);
  r.body = sl_test_slurp(body_path);
  r.headers = sl_test_slurp(head_path);
  unlink(body_path);
  unlink(head_path);
  return r;
}

static void reply_free(reply *r) {
  free(r->body);
  free(r->headers);
}

/* The body as JSON (asserted to parse). */
static json_t *reply_json(const reply *r) {
  json_error_t e;
  json_t *v = json_loads(r->body, 0, &e);
  cr_assert(v, "not JSON (%s, line %d): %s", e.text, e.line, r->body);
  return v;
}

/* A 4xx/5xx answer with a JSON {"error": "..."} body. */
static void assert_error(const reply *r, int status) {
  cr_assert_eq(r->status, status, "got %d: %s", r->status, r->body);
  json_t *v = reply_json(r);
  const char *e = json_string_value(json_object_get(v, "error"));
  cr_assert(e && *e, "no error message: %s", r->body);
  json_decref(v);
}

/* A request that must fail with status and a JSON error message. */
static void expect_error(int port, const char *path, const char *args,
                         int status) {
  reply r = curl(port, path, args);
  assert_error(&r, status);
  reply_free(&r);
}

/* ------------------------------------------------------------ the job */

/* 256 records per call, then a pause, until stopped. */
static int forever_next(sl_ctx *ctx, void *state) {
  uint64_t *i = state;
  for (int k = 0; k < 256; k++, (*i)++) {
    sl_tuple t = {.key = *i % 50, .value = *i};
    int rc = sl_emit(ctx, &t, sizeof t);
    if (rc)
      return rc;
  }
  sl_test_sleep_us(500);
  return 0;
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

/* The test's directory T holds T/state (the job's), T/root (the
 * savepoint root) and T/out (a protected directory, as a file sink's
 * output would be). */
typedef struct fixture {
  char *dir;
  char *state;
  char *root;
  char *out;
  uint64_t position;
  sl_job *job;
  sl_http *http;
  int port;
} fixture;

/* The endpoint's options for f: its root and protected directory. */
static sl_http_options fixture_options(const fixture *f) {
  static const char *protected[2];
  protected[0] = f->out;
  sl_http_options o = SL_HTTP_OPTIONS_INIT;
  o.savepoint_root = f->root;
  o.protected_dirs = protected;
  return o;
}

/* The job with checkpoints every 20 ms, not started: source -> key_by
 * -> ODD_NAME (keyed counts, sink). */
static void fixture_job(fixture *f) {
  memset(f, 0, sizeof *f);
  f->dir = sl_test_temp_dir("http");
  f->state = sl_test_path_in(f->dir, "state");
  f->root = sl_test_path_in(f->dir, "root");
  f->out = sl_test_path_in(f->dir, "out");
  cr_assert_eq(mkdir(f->out, 0700), 0);
  sl_job_config config = SL_JOB_CONFIG_INIT;
  config.checkpoint.state_dir = f->state;
  config.checkpoint.interval_ms = 20;
  config.checkpoint.no_sync = 1;
  config.no_pinning = 1;
  cr_assert_eq(sl_job_create(&config, &f->job), 0);
  static const sl_source_ops src_ops = {.next = forever_next};
  static const sl_process_ops ops = {.process = count_per_key};
  sl_op *src, *by, *snk;
  cr_assert_eq(sl_op_source(f->job, "source", 1, &src_ops, &f->position,
                            &src), 0);
  cr_assert_eq(
      sl_op_key_by(f->job, "by_key", src, sl_fixture_tuple_key, 0, &by), 0);
  cr_assert_eq(sl_op_sink(f->job, ODD_NAME, by, 2, &ops, 0, &snk), 0);
}

/* After fixture_job: the endpoint started with o (NULL: fixture_options)
 * on 127.0.0.1 and an ephemeral port, then the job started if asked. */
static void fixture_serve(fixture *f, bool start_job,
                          const sl_http_options *o) {
  sl_http_options mine = fixture_options(f);
  cr_assert_eq(sl_http_start_with(f->job, o ? o : &mine, &f->http), 0);
  f->port = sl_http_port(f->http);
  cr_assert(f->port > 0 && f->port < 65536);
  if (start_job)
    cr_assert_eq(sl_job_start(f->job), 0, "%s", sl_job_error(f->job));
}

static void fixture_start(fixture *f, bool start_job) {
  fixture_job(f);
  fixture_serve(f, start_job, 0);
}

/* Wait (bounded) for records and a completed checkpoint. */
static void fixture_warm(fixture *f) {
  for (int i = 0; i < 10000; i++) { /* <= 10 s */
    if (sl_job_progress(f->job) > 0 && sl_job_last_checkpoint(f->job, 0) > 0)
      return;
    sl_test_sleep_us(1000);
  }
  cr_assert_fail("no records or no checkpoint after 10 s");
}

static void fixture_stop(fixture *f) {
  sl_job_stop(f->job);
  int rc = sl_job_wait(f->job);
  cr_assert(rc == SL_ESTOPPED || rc == SL_ENOTSTARTED, "%s",
            sl_job_error(f->job));
  sl_http_stop(f->http); /* also after the job ended */
  sl_job_destroy(f->job);
  free(f->state);
  free(f->root);
  free(f->out);
  sl_test_remove_tree(f->dir);
}

/* ------------------------------------------------------------ /metrics */

#define MAX_FAMILIES 64

typedef struct families {
  char names[MAX_FAMILIES][96];
  char types[MAX_FAMILIES][16];
  bool helped[MAX_FAMILIES];
  int count;
} families;

static int family_index(families *fs, const char *name) {
  for (int i = 0; i < fs->count; i++)
    if (strcmp(fs->names[i], name) == 0)
      return i;
  return -1;
}

/* One sample line: NAME[{LABELS}] VALUE; NAME must have a TYPE already. */
static void check_sample(families *fs, const char *line) {
  size_t n = strcspn(line, "{ ");
  char name[96];
  cr_assert(n > 0 && n < sizeof name, "bad sample: %s", line);
  memcpy(name, line, n);
  name[n] = 0;
  cr_assert(family_index(fs, name) >= 0, "no TYPE before: %s", line);
  const char *p = line + n;
  if (*p == '{') { /* label="value",... with \\ \" \n escapes */
    for (p++; *p && *p != '}';) {
      size_t k = strspn(p, "abcdefghijklmnopqrstuvwxyz_");
      cr_assert(k > 0 && p[k] == '=' && p[k + 1] == '"', "label: %s", line);
      for (p += k + 2; *p && *p != '"'; p++)
        if (*p == '\\') {
          p++;
          cr_assert(*p == '\\' || *p == '"' || *p == 'n', "escape: %s", line);
        }
      cr_assert_eq(*p, '"', "unterminated label: %s", line);
      p++;
      if (*p == ',')
        p++;
    }
    cr_assert_eq(*p, '}', "labels: %s", line);
    p++;
  }
  cr_assert_eq(*p, ' ', "no value: %s", line);
  char *end = 0;
  double v = strtod(p + 1, &end);
  cr_assert(end != p + 1 && *end == 0 && !isnan(v), "value: %s", line);
}

/* The whole exposition; returns the number of samples. */
static int check_exposition(char *body) {
  families fs = {.count = 0};
  int samples = 0;
  for (char *save = 0, *line = strtok_r(body, "\n", &save); line;
       line = strtok_r(0, "\n", &save)) {
    char name[96], type[16];
    if (strncmp(line, "# HELP ", 7) == 0) {
      cr_assert_eq(sscanf(line + 7, "%95s", name), 1);
      cr_assert(family_index(&fs, name) < 0, "HELP twice: %s", name);
      cr_assert(fs.count < MAX_FAMILIES);
      snprintf(fs.names[fs.count], sizeof fs.names[0], "%s", name);
      fs.helped[fs.count++] = true;
    } else if (strncmp(line, "# TYPE ", 7) == 0) {
      cr_assert_eq(sscanf(line + 7, "%95s %15s", name, type), 2, "%s", line);
      int i = family_index(&fs, name);
      cr_assert(i >= 0 && !fs.types[i][0], "TYPE without HELP: %s", line);
      cr_assert(strcmp(type, "counter") == 0 || strcmp(type, "gauge") == 0);
      snprintf(fs.types[i], sizeof fs.types[0], "%s", type);
      size_t len = strlen(name);
      if (strcmp(type, "counter") == 0)
        cr_assert(len > 6 && strcmp(name + len - 6, "_total") == 0, "%s", name);
    } else {
      cr_assert_neq(line[0], '#', "unknown comment: %s", line);
      check_sample(&fs, line);
      samples++;
    }
  }
  return samples;
}

/* The value of the sample line that starts with prefix (-1 if none). */
static double sample_value(const char *body, const char *prefix) {
  size_t n = strlen(prefix);
  for (const char *line = body; line && *line;) {
    if (strncmp(line, prefix, n) == 0)
      return strtod(line + n, 0);
    line = strchr(line, '\n');
    line = line ? line + 1 : 0;
  }
  return -1;
}

Test(http, metrics_is_prometheus_text) {
  fixture f;
  fixture_start(&f, true);
  fixture_warm(&f);
  reply r = curl(f.port, "/metrics", "");
  cr_assert_eq(r.status, 200, "%s", r.body);
  cr_assert(strstr(r.headers, "text/plain; version=0.0.4"), "%s", r.headers);
  cr_assert(sample_value(r.body, "sluice_job_source_records_total{job=\"sluice\"} ") > 0);
  cr_assert(sample_value(r.body, "sluice_job_info{job=\"sluice\",state=\"RUNNING\"} ") == 1);
  cr_assert(sample_value(r.body, "sluice_job_checkpoints_total{job=\"sluice\","
                                 "status=\"completed\"} ") >= 1);
  cr_assert(strstr(r.body, "sluice_instance_records_in_total{job=\"sluice\",operator=\""
                           ODD_LABEL "\",instance=\"1\"} "),
            "odd label not escaped: %s", r.body);
  cr_assert(strstr(r.body, "sluice_instance_busy_seconds_total{job=\"sluice\",operator="
                           "\"source\",instance=\"0\"} "));
  char *copy = strdup(r.body);
  int samples = check_exposition(copy);
  free(copy);
  cr_assert(samples >= 3 * 15, "only %d samples", samples);
  reply head = curl(f.port, "/metrics", "-I");
  cr_assert_eq(head.status, 200);
  cr_assert_null(strstr(head.body, "# TYPE"), "HEAD sent a body"); /* curl
    -I writes the headers where the body would go */
  reply_free(&head);
  reply_free(&r);
  fixture_stop(&f);
}

/* ------------------------------------------------------------ JSON */

static void assert_has(json_t *obj, const char *const *keys) {
  for (int i = 0; keys[i]; i++)
    cr_assert(json_object_get(obj, keys[i]), "no \"%s\" in %s", keys[i],
              json_dumps(obj, 0));
}

Test(http, jobs_json) {
  fixture f;
  fixture_start(&f, true);
  fixture_warm(&f);
  reply r = curl(f.port, "/jobs", "");
  cr_assert_eq(r.status, 200, "%s", r.body);
  cr_assert(strstr(r.headers, "application/json"));
  json_t *v = reply_json(&r);
  cr_assert_str_eq(json_string_value(json_object_get(v, "state")), "RUNNING");
  cr_assert_eq(json_integer_value(json_object_get(v, "restarts")), 0);
  cr_assert(json_is_null(json_object_get(v, "last_failure")));
  cr_assert(json_number_value(json_object_get(v, "uptime_ms")) > 0);
  json_t *totals = json_object_get(v, "totals");
  cr_assert(json_integer_value(json_object_get(totals, "source_records")) > 0);
  json_t *ops = json_object_get(v, "operators");
  cr_assert_eq(json_array_size(ops), 2, "source and the sink");
  json_t *sink = json_array_get(ops, 1);
  cr_assert_str_eq(json_string_value(json_object_get(sink, "name")), ODD_NAME);
  cr_assert_eq(json_integer_value(json_object_get(sink, "parallelism")), 2);
  json_t *inst = json_array_get(json_object_get(sink, "instances"), 1);
  static const char *const fields[] = {
      "instance", "running", "records_in", "records_out", "bytes_in",
      "bytes_out", "busy_ms", "idle_ms", "backpressured_ms",
      "input_fill_ratio", "output_fill_max_ratio", "watermark",
      "state_entries", "state_bytes", "late_records", "dead_letters", 0};
  assert_has(inst, fields);
  cr_assert(json_is_true(json_object_get(inst, "running")));
  json_decref(v);
  reply_free(&r);
  fixture_stop(&f);
}

static void assert_checkpoint(json_t *c) {
  static const char *const fields[] = {
      "id", "status", "final", "trigger_time_ms", "duration_us", "write_us",
      "bytes_persisted", "entries_persisted", "instance_count", "cause", 0};
  assert_has(c, fields);
}

Test(http, checkpoints_json) {
  fixture f;
  fixture_start(&f, true);
  fixture_warm(&f);
  reply r = curl(f.port, "/checkpoints", "");
  cr_assert_eq(r.status, 200, "%s", r.body);
  json_t *v = reply_json(&r);
  json_t *counts = json_object_get(v, "counts");
  json_int_t completed = json_integer_value(json_object_get(counts, "completed"));
  cr_assert(completed >= 1);
  cr_assert_eq(json_integer_value(json_object_get(counts, "total")),
               completed +
                   json_integer_value(json_object_get(counts, "failed")) +
                   json_integer_value(json_object_get(counts, "in_progress")));
  json_t *latest = json_object_get(json_object_get(v, "latest"), "completed");
  assert_checkpoint(latest);
  cr_assert_str_eq(json_string_value(json_object_get(latest, "status")),
                   "COMPLETED");
  json_t *history = json_object_get(v, "history");
  cr_assert(json_array_size(history) >= 1);
  json_t *h = json_array_get(history, 0);
  assert_checkpoint(h);
  json_t *instances = json_object_get(h, "instances");
  cr_assert_eq(json_array_size(instances), 3, "source and two sinks");
  static const char *const fields[] = {
      "operator", "instance", "start_delay_us", "alignment_us", "sync_us",
      "async_us", "bytes_persisted", "entries_persisted", 0};
  assert_has(json_array_get(instances, 2), fields);
  json_decref(v);
  reply_free(&r);

  r = curl(f.port, "/checkpoints?limit=1", "");
  v = reply_json(&r);
  cr_assert_eq(json_array_size(json_object_get(v, "history")), 1);
  json_decref(v);
  reply_free(&r);
  expect_error(f.port, "/checkpoints?limit=abc", "", 400);
  expect_error(f.port, "/checkpoints?limit=65", "", 400);
  fixture_stop(&f);
}

/* ------------------------------------------------------------ errors */

Test(http, bad_requests) {
  fixture f;
  fixture_start(&f, true);
  expect_error(f.port, "/nope", "", 404);
  expect_error(f.port, "/metrics/", "", 404);
  reply r = curl(f.port, "/metrics", "-X POST");
  assert_error(&r, 405);
  cr_assert(strstr(r.headers, "Allow: GET, HEAD"), "%s", r.headers);
  reply_free(&r);
  expect_error(f.port, "/jobs", "-X DELETE", 405);
  r = curl(f.port, "/savepoints", "");
  assert_error(&r, 405);
  cr_assert(strstr(r.headers, "Allow: POST"), "%s", r.headers);
  reply_free(&r);
  expect_error(f.port, "/savepoints",
               "-H 'Content-Type: application/json' -d '{\"dir\": 7}'", 400);
  expect_error(f.port, "/savepoints",
               "-H 'Content-Type: application/json' -d '[\"dir\"]'", 400);
  /* A body over 64 KiB, sent (curl sends it with the headers). */
  char big[] = "/tmp/sluice-http-big-XXXXXX";
  int fd = mkstemp(big);
  cr_assert(fd >= 0);
  char block[4096];
  memset(block, 'a', sizeof block);
  for (int i = 0; i < 20; i++)
    cr_assert_eq(write(fd, block, sizeof block), (ssize_t)sizeof block);
  close(fd);
  char args[160];
  snprintf(args, sizeof args,
           "-H 'Content-Type: application/json' --data-binary '@%s'", big);
  expect_error(f.port, "/savepoints", args, 413);
  unlink(big);
  fixture_stop(&f);
}

/* ------------------------------------------------------------ lifecycle */

Test(http, before_the_job_starts) {
  fixture f;
  fixture_start(&f, false);
  reply r = curl(f.port, "/metrics", "");
  assert_error(&r, 503);
  reply_free(&r);
  cr_assert_eq(sl_job_start(f.job), 0);
  r = curl(f.port, "/jobs", "");
  cr_assert_eq(r.status, 200, "%s", r.body);
  reply_free(&r);
  fixture_stop(&f);
}

Test(http, start_errors) {
  sl_job *job = 0;
  cr_assert_eq(sl_job_create(0, &job), 0);
  sl_http *h = (sl_http *)1;
  cr_assert_eq(sl_http_start(job, "localhost", 0, &h), EINVAL);
  cr_assert_null(h);
  cr_assert_eq(sl_http_start(job, 0, 70000, &h), EINVAL);
  cr_assert_eq(sl_http_start(0, 0, 0, &h), EINVAL);
  cr_assert_eq(sl_http_start(job, "::1", 0, &h), 0, "IPv6 loopback");
  sl_http_stop(h);
  sl_http *first = 0, *second = 0;
  cr_assert_eq(sl_http_start(job, "127.0.0.1", 0, &first), 0);
  int rc = sl_http_start(job, "127.0.0.1", sl_http_port(first), &second);
  cr_assert_eq(rc, EADDRINUSE, "%s", sl_strerror(rc));
  cr_assert_null(second);
  sl_http_stop(first);
  sl_http_stop(0);
  /* The options' size says which fields the caller knows. */
  sl_http_options o = SL_HTTP_OPTIONS_INIT;
  cr_assert_eq(sl_http_start_with(job, 0, &h), EINVAL);
  o.struct_bytes = sizeof(size_t);
  cr_assert_eq(sl_http_start_with(job, &o, &h), EINVAL, "too small");
  struct {
    sl_http_options o;
    uint64_t later_field; /* a newer caller's field */
  } newer = {.o = SL_HTTP_OPTIONS_INIT};
  newer.o.struct_bytes = sizeof newer;
  cr_assert_eq(sl_http_start_with(job, &newer.o, &h), 0, "unset: default");
  sl_http_stop(h);
  newer.later_field = 1;
  cr_assert_eq(sl_http_start_with(job, &newer.o, &h), EINVAL,
               "a field this library does not know, set");
  cr_assert_null(h);
  o = (sl_http_options)SL_HTTP_OPTIONS_INIT;
  o.connections_per_client_max = 9;
  o.connections_max = 8;
  cr_assert_eq(sl_http_start_with(job, &o, &h), EINVAL);
  o = (sl_http_options)SL_HTTP_OPTIONS_INIT;
  o.bearer_token = "short";
  cr_assert_eq(sl_http_start_with(job, &o, &h), EINVAL, "a guessable token");
  o.bearer_token = "a token with spaces in it";
  cr_assert_eq(sl_http_start_with(job, &o, &h), EINVAL);
  sl_job_destroy(job);
}

/* ------------------------------------------------------------ raw sockets */

/* A TCP connection to 127.0.0.1:port, from the loopback address source
 * (NULL: the kernel's choice, 127.0.0.1). */
static int raw_connect(int port, const char *source) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  cr_assert(fd >= 0, "socket: %s", strerror(errno));
  struct sockaddr_in a = {.sin_family = AF_INET};
  if (source) {
    cr_assert_eq(inet_pton(AF_INET, source, &a.sin_addr), 1);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0, "bind %s: %s",
                 source, strerror(errno));
  }
  a.sin_port = htons((uint16_t)port);
  cr_assert_eq(inet_pton(AF_INET, "127.0.0.1", &a.sin_addr), 1);
  cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "connect: %s",
               strerror(errno));
  return fd;
}

static void raw_send(int fd, const char *text) {
  size_t n = strlen(text);
  cr_assert_eq(send(fd, text, n, MSG_NOSIGNAL), (ssize_t)n, "send: %s",
               strerror(errno));
}

/* Whether the server closed fd, waiting up to bound_ms (anything it sends
 * meanwhile is read and dropped). */
static bool raw_closed(int fd, int bound_ms) {
  double end = sl_test_now_s() + bound_ms / 1e3;
  for (int i = 0; i < 100000; i++) {
    double left_ms = (end - sl_test_now_s()) * 1e3;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, left_ms > 0 ? (int)left_ms : 0) <= 0)
      return false; /* bound reached: still open */
    char buf[512];
    ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
      return true;
  }
  return false;
}

/* Everything the server sends on fd until it closes it, within bound_ms
 * (malloc'd text; what came so far if the bound is reached). */
static char *raw_read_all(int fd, int bound_ms) {
  size_t cap = 1 << 16, used = 0;
  char *text = calloc(1, cap + 1);
  cr_assert(text);
  double end = sl_test_now_s() + bound_ms / 1e3;
  while (used < cap) {
    double left_ms = (end - sl_test_now_s()) * 1e3;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (left_ms <= 0 || poll(&p, 1, (int)left_ms) <= 0)
      break;
    ssize_t n = recv(fd, text + used, cap - used, 0);
    if (n <= 0)
      break;
    used += (size_t)n;
  }
  text[used] = 0;
  return text;
}

/* ------------------------------------------------------------ directories */

static int name_order(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The names in dir, sorted, joined by ',' (malloc'd). */
static char *listing(const char *dir) {
  DIR *d = opendir(dir);
  cr_assert(d, "%s: %s", dir, strerror(errno));
  char *names[64];
  size_t n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
      cr_assert(n < 64, "%s holds too many files", dir);
      names[n++] = strdup(e->d_name);
    }
  closedir(d);
  qsort(names, n, sizeof names[0], name_order);
  char *text = calloc(1, 64 * 260);
  cr_assert(text);
  for (size_t i = 0; i < n; i++) {
    strcat(text, i ? "," : "");
    strcat(text, names[i]);
    free(names[i]);
  }
  return text;
}

static void assert_listing(const char *dir, const char *want) {
  char *got = listing(dir);
  cr_assert_str_eq(got, want, "%s holds %s, not %s", dir, got, want);
  free(got);
}

static bool exists(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0;
}

/* POST /savepoints?QUERY (no body) answered with status and an error. */
static void post_refused(int port, const char *query, const char *args,
                         int status) {
  char path[2048];
  snprintf(path, sizeof path, "/savepoints?%s", query);
  reply r = curl(port, path, args ? args : "-X POST");
  cr_assert_eq(r.status, status, "%s: got %d: %s", query, r.status, r.body);
  assert_error(&r, status);
  reply_free(&r);
}

/* ------------------------------------------------------------ savepoints */

Test(http, savepoint_below_the_root_is_written_and_readable) {
  fixture f;
  fixture_start(&f, true);
  fixture_warm(&f);
  char root[PATH_MAX];
  cr_assert(realpath(f.root, root), "the root was created at start");
  reply r = curl(f.port, "/savepoints?dir=nightly/first", "-X POST");
  cr_assert_eq(r.status, 200, "%s", r.body);
  json_t *v = reply_json(&r);
  json_int_t id = json_integer_value(json_object_get(v, "checkpoint_id"));
  cr_assert(id > 0);
  char want[PATH_MAX + 32];
  snprintf(want, sizeof want, "%s/nightly/first", root);
  cr_assert_str_eq(json_string_value(json_object_get(v, "path")), want);
  cr_assert_str_eq(json_string_value(json_object_get(v, "dir")),
                   "nightly/first");
  json_decref(v);
  reply_free(&r);

  /* `sluice checkpoints SAVEPOINT` reads it back, naming the checkpoint. */
  const char *bin = getenv("SLUICE_BIN");
  cr_assert(bin && *bin, "SLUICE_BIN is not set (meson sets it)");
  char *out_path = sl_test_path_in(f.dir, "listing.txt");
  char cmd[3 * PATH_MAX];
  snprintf(cmd, sizeof cmd, "'%s' checkpoints '%s' > '%s' 2>&1", bin, want,
           out_path);
  int rc = system(cmd);
  char *text = sl_test_slurp(out_path);
  cr_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "exit %d:\n%s", rc, text);
  char id_text[32];
  snprintf(id_text, sizeof id_text, "%lld", (long long)id);
  cr_assert(strstr(text, id_text), "no checkpoint %s in:\n%s", id_text, text);
  free(text);
  unlink(out_path);
  free(out_path);

  /* A JSON body, an absolute path below the root, and no name at all. */
  r = curl(f.port, "/savepoints", "-H 'Content-Type: application/json' "
                                  "-d '{\"dir\": \"second\"}'");
  cr_assert_eq(r.status, 200, "%s", r.body);
  reply_free(&r);
  char query[PATH_MAX + 64];
  snprintf(query, sizeof query, "/savepoints?dir=%s/third", root);
  r = curl(f.port, query, "-X POST");
  cr_assert_eq(r.status, 200, "%s", r.body);
  reply_free(&r);
  r = curl(f.port, "/savepoints", "-X POST");
  cr_assert_eq(r.status, 200, "%s", r.body);
  v = reply_json(&r);
  const char *generated = json_string_value(json_object_get(v, "dir"));
  cr_assert(generated && strncmp(generated, "savepoint-", 10) == 0, "%s",
            r.body);
  char expect[512];
  snprintf(expect, sizeof expect, "nightly,%s,second,third", generated);
  assert_listing(f.root, expect);
  json_decref(v);
  reply_free(&r);
  /* A name that holds a savepoint already. */
  post_refused(f.port, "dir=second", 0, 409);
  assert_listing(f.dir, "out,root,state");
  fixture_stop(&f);
}

Test(http, savepoint_names_outside_the_root_are_refused) {
  fixture f;
  fixture_start(&f, true);
  fixture_warm(&f);
  char *link = sl_test_path_in(f.root, "link");
  cr_assert_eq(symlink(f.dir, link), 0, "a link out of the root");
  char *escape = sl_test_path_in(f.dir, "escape");
  char tmp_escape[128];
  snprintf(tmp_escape, sizeof tmp_escape, "/tmp/sluice-http-escape-%d",
           (int)getpid());
  static const struct {
    const char *query;
    int status;
  } cases[] = {
      {"dir=../escape", 403},      {"dir=a/../../escape", 403},
      {"dir=..", 403},             {"dir=./x", 403},
      {"dir=a%00b", 403},          {"dir=%00", 403},
      {"dir=x%00/../../escape", 403},
      {"dir=a//b", 403},           {"dir=a/", 403},
      {"dir=a%0Ab", 403},          {"dir=", 400},
      {"dir=link/escape", 403},    {"dir=link", 403},
      {"dir=link/../escape", 403},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    post_refused(f.port, cases[i].query, 0, cases[i].status);
  char query[PATH_MAX + 64];
  snprintf(query, sizeof query, "dir=%s", escape); /* absolute, outside */
  post_refused(f.port, query, 0, 403);
  snprintf(query, sizeof query, "dir=%s", tmp_escape);
  post_refused(f.port, query, 0, 403);
  snprintf(query, sizeof query, "dir=%s/root/../escape", f.dir);
  post_refused(f.port, query, 0, 403);
  reply r = curl(f.port, "/savepoints",
                 "-H 'Content-Type: application/json' "
                 "-d '{\"dir\": \"../escape\"}'");
  assert_error(&r, 403);
  reply_free(&r);

  /* Nothing was written outside the root, nor inside it. */
  assert_listing(f.dir, "out,root,state");
  assert_listing(f.root, "link");
  assert_listing(f.out, "");
  cr_assert(!exists(escape) && !exists(tmp_escape));

  /* The job's own directories, with a root that holds them. */
  sl_http_options o = fixture_options(&f);
  o.savepoint_root = f.dir;
  sl_http *wide = 0;
  cr_assert_eq(sl_http_start_with(f.job, &o, &wide), 0);
  int port = sl_http_port(wide);
  post_refused(port, "dir=state", 0, 403);
  post_refused(port, "dir=state/sp", 0, 403);
  post_refused(port, "dir=out", 0, 403);
  post_refused(port, "dir=out/sp", 0, 403);
  sl_http_stop(wide);
  assert_listing(f.dir, "out,root,state");
  assert_listing(f.out, "");
  char *state_sp = sl_test_path_in(f.state, "sp");
  cr_assert(!exists(state_sp));
  /* A root inside the state directory is refused at start, uncreated. */
  char *inside = sl_test_path_in(f.state, "savepoints");
  o.savepoint_root = inside;
  cr_assert_eq(sl_http_start_with(f.job, &o, &wide), EINVAL);
  cr_assert_null(wide);
  cr_assert(!exists(inside));
  free(inside);
  free(state_sp);
  free(escape);
  free(link);
  fixture_stop(&f);
}

Test(http, savepoints_are_refused_without_a_root) {
  fixture f;
  fixture_start(&f, true);
  fixture_warm(&f);
  sl_http *plain = 0;
  cr_assert_eq(sl_http_start(f.job, 0, 0, &plain), 0);
  int port = sl_http_port(plain);
  char query[PATH_MAX + 64];
  snprintf(query, sizeof query, "/savepoints?dir=%s/escape", f.dir);
  reply r = curl(port, query, "-X POST");
  assert_error(&r, 403);
  cr_assert(strstr(r.body, "savepoint root"), "%s", r.body);
  reply_free(&r);
  expect_error(port, "/savepoints", "-X POST", 403);
  sl_http_stop(plain);
  assert_listing(f.dir, "out,root,state");
  assert_listing(f.root, "");
  fixture_stop(&f);
}

/* ------------------------------------------------------------ POST /stop */

Test(http, stop_writes_a_savepoint_and_ends_the_job) {
  fixture f;
  fixture_start(&f, true);
  fixture_warm(&f);
  char root[PATH_MAX];
  cr_assert(realpath(f.root, root), "the root was created at start");
  /* A bad drain value is refused and changes nothing. */
  expect_error(f.port, "/stop?dir=x&drain=maybe", "-X POST", 400);
  expect_error(f.port, "/stop", "-H 'Content-Type: application/json' "
               "-d '{\"dir\": \"x\", \"drain\": 1}'", 400);
  assert_listing(f.root, "");
  reply r = curl(f.port, "/stop", "-H 'Content-Type: application/json' "
                 "-d '{\"dir\": \"stopped\", \"drain\": false}'");
  cr_assert_eq(r.status, 200, "%s", r.body);
  json_t *v = reply_json(&r);
  json_int_t id = json_integer_value(json_object_get(v, "checkpoint_id"));
  cr_assert(id > 0, "%s", r.body);
  char want[PATH_MAX + 32];
  snprintf(want, sizeof want, "%s/stopped", root);
  cr_assert_str_eq(json_string_value(json_object_get(v, "path")), want);
  cr_assert(json_is_false(json_object_get(v, "drain")), "%s", r.body);
  json_decref(v);
  reply_free(&r);
  char manifest[PATH_MAX + 64];
  snprintf(manifest, sizeof manifest, "%s/manifest.json", want);
  cr_assert(exists(manifest), "no savepoint at %s", want);
  /* The job ended with the stop: sl_job_wait returns 0, and a second
   * stop is refused (409) while the endpoint still answers. */
  cr_assert_eq(sl_job_wait(f.job), 0, "%s", sl_job_error(f.job));
  cr_assert_eq(sl_job_last_checkpoint(f.job, 0), (uint64_t)id);
  r = curl(f.port, "/stop?dir=again", "-X POST");
  assert_error(&r, 409);
  reply_free(&r);
  sl_http_stop(f.http);
  sl_job_destroy(f.job);
  free(f.state);
  free(f.root);
  free(f.out);
  sl_test_remove_tree(f.dir);
}

Test(http, stop_is_refused_without_a_root) {
  fixture f;
  fixture_start(&f, true);
  fixture_warm(&f);
  sl_http *plain = 0;
  cr_assert_eq(sl_http_start(f.job, 0, 0, &plain), 0);
  reply r = curl(sl_http_port(plain), "/stop?dir=x", "-X POST");
  assert_error(&r, 403);
  cr_assert(strstr(r.body, "savepoint root"), "%s", r.body);
  reply_free(&r);
  sl_http_stop(plain);
  assert_listing(f.root, "");
  /* The job runs on: it is stopped as usual. */
  cr_assert_eq(sl_job_progress(f.job) > 0, true);
  fixture_stop(&f);
}

/* ------------------------------------------------------------ cross-site */

Test(http, form_posts_are_refused) {
  fixture f;
  fixture_start(&f, true);
  fixture_warm(&f);
  static const char *const forms[] = {
      "-d dir=form1", /* application/x-www-form-urlencoded */
      "-F dir=form2", /* multipart/form-data */
      "-H 'Content-Type: text/plain' -d dir=form3",
      "-H 'Content-Type: Text/Plain; charset=utf-8' -d x",
      "-H 'Content-Type: application/x-www-form-urlencoded' -X POST"};
  for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
    reply r = curl(f.port, "/savepoints?dir=query", forms[i]);
    assert_error(&r, 403);
    cr_assert(strstr(r.body, "Content-Type"), "%s", r.body);
    reply_free(&r);
  }
  assert_listing(f.root, "");
  assert_listing(f.dir, "out,root,state");
  fixture_stop(&f);
}

Test(http, foreign_origins_and_hosts_are_refused) {
  fixture f;
  fixture_start(&f, true);
  fixture_warm(&f);
  char args[512];
  /* Foreign: another host, an opaque origin, another scheme, port or
   * address (the port goes between before and after). */
  static const struct {
    const char *before, *after;
  } foreign[] = {{"http://evil.example", 0}, {"null", 0},
                 {"https://127.0.0.1:", ""}, {"http://127.0.0.1:", "1"},
                 {"http://127.0.0.2:", ""}};
  for (size_t i = 0; i < sizeof foreign / sizeof foreign[0]; i++) {
    char origin[128];
    if (foreign[i].after)
      snprintf(origin, sizeof origin, "%s%d%s", foreign[i].before, f.port,
               foreign[i].after);
    else
      snprintf(origin, sizeof origin, "%s", foreign[i].before);
    snprintf(args, sizeof args, "-H 'Origin: %s'", origin);
    expect_error(f.port, "/jobs", args, 403);
    snprintf(args, sizeof args, "-X POST -H 'Origin: %s'", origin);
    expect_error(f.port, "/savepoints?dir=cross", args, 403);
  }
  assert_listing(f.root, "");
  /* DNS rebinding: a foreign name for 127.0.0.1, same-origin for it. */
  snprintf(args, sizeof args, "-H 'Host: evil.example:%d'", f.port);
  reply r = curl(f.port, "/jobs", args);
  assert_error(&r, 403);
  reply_free(&r);
  /* The endpoint itself, by address or as localhost. */
  snprintf(args, sizeof args, "-X POST -H 'Origin: http://127.0.0.1:%d'",
           f.port);
  r = curl(f.port, "/savepoints?dir=same", args);
  cr_assert_eq(r.status, 200, "%s", r.body);
  reply_free(&r);
  snprintf(args, sizeof args,
           "-H 'Origin: http://localhost:%d' -H 'Host: localhost:%d'", f.port,
           f.port);
  r = curl(f.port, "/jobs", args);
  cr_assert_eq(r.status, 200, "%s", r.body);
  reply_free(&r);
  assert_listing(f.root, "same");
  fixture_stop(&f);
}

/* ------------------------------------------------------------ the token */

#define TOKEN "s3cr3t-t0ken-for-the-tests"

/* A GET of /jobs with args answered with status. */
static void get_jobs_status(int port, const char *args, int status) {
  reply r = curl(port, "/jobs", args);
  cr_assert_eq(r.status, status, "%s: %d %s", args, r.status, r.body);
  if (status == 401) {
    assert_error(&r, 401);
    cr_assert(strstr(r.headers, "WWW-Authenticate: Bearer"), "%s", r.headers);
  }
  reply_free(&r);
}

static void assert_token_enforced(int port) {
  get_jobs_status(port, "", 401);
  get_jobs_status(port, "-H 'Authorization: Bearer s3cr3t-t0ken-for-the-test!'",
                  401);
  get_jobs_status(port, "-H 'Authorization: Bearer s3cr3t'", 401);
  get_jobs_status(port, "-H 'Authorization: Bearer " TOKEN "x'", 401);
  get_jobs_status(port, "-H 'Authorization: Basic " TOKEN "'", 401);
  get_jobs_status(port, "-H 'Authorization: Bearer " TOKEN "'", 200);
  get_jobs_status(port, "-H 'Authorization: bearer " TOKEN "'", 200);
}

Test(http, a_non_loopback_address_needs_a_token) {
  /* Only the bind is on 0.0.0.0 (and ::): every request goes to
   * 127.0.0.1, so the test sends nothing off the machine. */
  fixture f;
  fixture_start(&f, true);
  sl_http *h = (sl_http *)1;
  cr_assert_eq(sl_http_start(f.job, "0.0.0.0", 0, &h), SL_EUSAGE);
  cr_assert_null(h);
  cr_assert_eq(sl_http_start(f.job, "::", 0, &h), SL_EUSAGE);
  sl_http_options o = fixture_options(&f);
  o.address = "0.0.0.0";
  cr_assert_eq(sl_http_start_with(f.job, &o, &h), SL_EUSAGE);
  o.bearer_token = TOKEN;
  cr_assert_eq(sl_http_start_with(f.job, &o, &h), 0);
  assert_token_enforced(sl_http_port(h));
  sl_http_stop(h);
  /* On loopback the token is optional, and enforced when given. */
  o.address = "127.0.0.1";
  cr_assert_eq(sl_http_start_with(f.job, &o, &h), 0);
  assert_token_enforced(sl_http_port(h));
  reply r = curl(sl_http_port(h), "/savepoints?dir=tokenless", "-X POST");
  assert_error(&r, 401);
  reply_free(&r);
  sl_http_stop(h);
  assert_listing(f.root, "");
  fixture_stop(&f);
}

/* ------------------------------------------------------------ slow clients */

/* A request's head without the blank line that ends it. */
static int slow_client(int port, const char *source) {
  int fd = raw_connect(port, source);
  char head[128];
  snprintf(head, sizeof head, "GET /jobs HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n",
           port);
  raw_send(fd, head);
  return fd;
}

#define SLOW_CLIENTS 20

Test(http, slow_clients_do_not_lock_out_others) {
  /* A long header timeout, so the slow clients stay for the whole test:
   * only the caps are at work here (default: 8 per address). */
  fixture f;
  fixture_job(&f);
  sl_http_options o = fixture_options(&f);
  o.header_timeout_ms = 600000;
  fixture_serve(&f, true, &o);
  int fds[SLOW_CLIENTS];
  for (int i = 0; i < SLOW_CLIENTS; i++)
    fds[i] = slow_client(f.port, 0);
  /* The per-address cap closes the ones past 8 at once; wait for that,
   * looking at every client in turn (at most 20 s in all). */
  bool closed[SLOW_CLIENTS] = {false};
  int closed_count = 0;
  for (int round = 0; round < 2000 && closed_count < SLOW_CLIENTS - 8;
       round++)
    for (int i = 0; i < SLOW_CLIENTS; i++)
      if (!closed[i] && raw_closed(fds[i], round ? 10 : 0))
        closed[i] = true, closed_count++;
  cr_assert_eq(closed_count, SLOW_CLIENTS - 8, "closed %d of %d slow clients",
               closed_count, SLOW_CLIENTS);
  /* With 8 still connected, another client is served at once. */
  reply r = curl(f.port, "/jobs", "--interface 127.0.0.2");
  cr_assert_eq(r.status, 200, "%s", r.body);
  reply_free(&r);
  int open = 0;
  for (int i = 0; i < SLOW_CLIENTS; i++)
    open += !raw_closed(fds[i], 0);
  cr_assert_eq(open, 8, "the slow clients were still connected");
  for (int i = 0; i < SLOW_CLIENTS; i++)
    close(fds[i]);
  fixture_stop(&f);
}

Test(http, the_header_timeout_closes_slow_and_trickling_clients) {
  fixture f;
  fixture_job(&f);
  sl_http_options o = fixture_options(&f);
  o.header_timeout_ms = 1000;
  fixture_serve(&f, true, &o);
  int fds[8];
  for (int i = 0; i < 8; i++)
    fds[i] = slow_client(f.port, 0);
  /* A client that sends a byte of its headers every 20 ms: the idle
   * timeout would never fire; the deadline does.  At most 60 s. */
  int trickler = raw_connect(f.port, "127.0.0.3");
  bool dropped = false;
  for (int i = 0; i < 3000 && !dropped; i++) {
    dropped = send(trickler, "X", 1, MSG_NOSIGNAL) != 1 ||
              raw_closed(trickler, 20);
  }
  cr_assert(dropped, "a trickling client kept its connection for 60 s");
  for (int i = 0; i < 8; i++)
    cr_assert(raw_closed(fds[i], 30000), "slow client %d was not closed", i);
  /* Its address's slots are free again. */
  reply r = curl(f.port, "/jobs", "");
  cr_assert_eq(r.status, 200, "%s", r.body);
  reply_free(&r);
  for (int i = 0; i < 8; i++)
    close(fds[i]);
  close(trickler);
  fixture_stop(&f);
}

/* ------------------------------------------------------------ 413 */

Test(http, an_oversized_content_length_gets_413_before_the_body) {
  fixture f;
  fixture_start(&f, true);
  /* The last one overflows 64 bits: libmicrohttpd answers it itself. */
  static const char *const lengths[] = {"1000000000", "65537",
                                        "99999999999999999999999"};
  for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) {
    int fd = raw_connect(f.port, 0);
    char head[256];
    snprintf(head, sizeof head,
             "POST /savepoints HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
             "Content-Type: application/json\r\nContent-Length: %s\r\n\r\n",
             f.port, lengths[i]);
    raw_send(fd, head); /* and not one byte of the body */
    char *answer = raw_read_all(fd, 20000);
    bool json = strstr(answer, "\"error\"") != 0;
    answer[strcspn(answer, "\r\n")] = 0; /* the status line, for messages */
    cr_assert(strncmp(answer, "HTTP/1.1 413 ", 13) == 0,
              "Content-Length %s: %s", lengths[i], answer);
    cr_assert(json || i == 2, "no JSON error after %s", answer);
    free(answer);
    close(fd);
  }
  assert_listing(f.root, "");
  fixture_stop(&f);
}

/* ------------------------------------------------------------ the CLI */

/* Run the CLI with args (NULL-terminated, after "run"), its output into
 * log; with token set, SLUICE_HTTP_TOKEN=token, else none. */
static pid_t cli_spawn(const char *const *args, const char *log,
                       const char *token) {
  const char *bin = getenv("SLUICE_BIN");
  cr_assert(bin && *bin, "SLUICE_BIN is not set (meson sets it)");
  const char *argv[32] = {bin, "run"};
  int n = 2;
  for (int i = 0; args[i]; i++) {
    cr_assert(n < 31);
    argv[n++] = args[i];
  }
  argv[n] = 0;
  int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  cr_assert(fd >= 0);
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    dup2(fd, 1);
    dup2(fd, 2);
    if (token)
      setenv("SLUICE_HTTP_TOKEN", token, 1);
    else
      unsetenv("SLUICE_HTTP_TOKEN");
    execv(bin, (char *const *)argv);
    _exit(127);
  }
  close(fd);
  return pid;
}

/* The port of "http endpoint on http://HOST:PORT" in log, waiting for it
 * (at most 10 s). */
static int cli_port(const char *log, const char *host) {
  char prefix[96];
  snprintf(prefix, sizeof prefix, "http endpoint on http://%s:", host);
  for (int i = 0; i < 10000; i++) {
    char *text = sl_test_slurp(log);
    const char *at = strstr(text, prefix);
    int port = at ? atoi(at + strlen(prefix)) : 0;
    free(text);
    if (port)
      return port;
    sl_test_sleep_us(1000);
  }
  cr_assert_fail("no endpoint line in the CLI's output");
  return 0;
}

static void cli_interrupt(pid_t pid) {
  kill(pid, SIGINT);
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 130,
            "exit status %d", status);
}

Test(http, cli_refuses_a_non_loopback_address_without_a_token) {
  char *dir = sl_test_temp_dir("http-cli");
  char *log = sl_test_path_in(dir, "log");
  static const char *const args[] = {"keyed", "--records", "100000000000",
                                     "--quiet", "--http", "0.0.0.0:0", 0};
  pid_t pid = cli_spawn(args, log, 0);
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 20000 && !done; i++) { /* at most 20 s */
    done = waitpid(pid, &status, WNOHANG);
    if (!done)
      sl_test_sleep_us(1000);
  }
  if (!done) { /* it started: the refusal is missing */
    kill(pid, SIGKILL);
    cr_assert_eq(waitpid(pid, &status, 0), pid);
  }
  char *text = sl_test_slurp(log);
  cr_assert(done, "the CLI served 0.0.0.0 without a token:\n%s", text);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 2,
            "exit status %d:\n%s", status, text);
  cr_assert(strstr(text, "bearer token") && strstr(text, "--http-token-file"),
            "%s", text);
  free(text);

  /* With a token file: served (only ever asked on 127.0.0.1), and only
   * to requests that carry the token. */
  char *token_file = sl_test_path_in(dir, "token");
  FILE *t = fopen(token_file, "w");
  cr_assert(t);
  fputs(TOKEN "\n", t);
  fclose(t);
  static const char *const with[] = {"keyed", "--records", "100000000000",
                                     "--quiet", "--http", "0.0.0.0:0",
                                     "--http-token-file", 0, 0};
  const char *argv[9];
  memcpy(argv, with, sizeof with);
  argv[7] = token_file;
  pid = cli_spawn(argv, log, "another-token-from-the-environment");
  int port = cli_port(log, "0.0.0.0");
  assert_token_enforced(port);
  cli_interrupt(pid);
  free(token_file);
  free(log);
  sl_test_remove_tree(dir);
}

Test(http, cli_run_http_serves_metrics) {
  char *dir = sl_test_temp_dir("http-cli");
  char *log = sl_test_path_in(dir, "log");
  static const char *const args[] = {"keyed", "--records", "100000000000",
                                     "--quiet", "--http", "0", 0};
  pid_t pid = cli_spawn(args, log, 0);
  int port = cli_port(log, "127.0.0.1");
  reply r = curl(port, "/metrics", "");
  cr_assert_eq(r.status, 200);
  cr_assert(sample_value(r.body, "sluice_job_info{job=\"keyed\",state=\"RUNNING\"} ") == 1,
            "%s", r.body);
  cr_assert(strstr(r.body, "sluice_instance_records_out_total{job=\"keyed\",operator="
                           "\"source\",instance=\"0\"} "));
  char *copy = strdup(r.body);
  check_exposition(copy);
  free(copy);
  reply_free(&r);
  cli_interrupt(pid);
  free(log);
  sl_test_remove_tree(dir);
}
