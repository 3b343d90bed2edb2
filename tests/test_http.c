/* test_http.c — the HTTP endpoint (libmicrohttpd) against a running job,
 * driven with the real curl program: /metrics parses as Prometheus text
 * 0.0.4 (HELP and TYPE before every sample, numeric values, escaped
 * labels), /jobs and /checkpoints parse as JSON with the expected fields,
 * 404 / 405 / 400 / 413 answers, POST /savepoints reaches the savepoint
 * call, the start errors, and `sluice run --http 0` serving /metrics.
 *
 * The CLI binary comes from the environment (SLUICE_BIN, set by meson). */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

typedef struct fixture {
  char *dir;
  uint64_t position;
  sl_job *job;
  sl_http *http;
  int port;
} fixture;

/* source -> key_by -> ODD_NAME (keyed counts, sink) with checkpoints every
 * 20 ms; the endpoint on an ephemeral port; the job started. */
static void fixture_start(fixture *f, bool start_job) {
  memset(f, 0, sizeof *f);
  f->dir = sl_test_temp_dir("http");
  sl_job_config config = {0};
  config.checkpoint.state_dir = f->dir;
  config.checkpoint.interval_ms = 20;
  config.checkpoint.no_sync = 1;
  config.no_pinning = 1;
  cr_assert_eq(sl_job_create(&config, &f->job), 0);
  static const sl_source_ops src_ops = {.next = forever_next};
  static const sl_process_ops ops = {.process = count_per_key};
  sl_op *src, *by, *snk;
  cr_assert_eq(sl_op_source(f->job, "source", 1, &src_ops, &f->position,
                            &src), 0);
  cr_assert_eq(sl_op_key_by(f->job, "by_key", src, tuple_key, 0, &by), 0);
  cr_assert_eq(sl_op_sink(f->job, ODD_NAME, by, 2, &ops, 0, &snk), 0);
  cr_assert_eq(sl_http_start(f->job, 0, 0, &f->http), 0);
  f->port = sl_http_port(f->http);
  cr_assert(f->port > 0 && f->port < 65536);
  if (start_job)
    cr_assert_eq(sl_job_start(f->job), 0, "%s", sl_job_error(f->job));
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
  cr_assert(sample_value(r.body, "sluice_job_source_records_total ") > 0);
  cr_assert(sample_value(r.body, "sluice_job_info{state=\"RUNNING\"} ") == 1);
  cr_assert(sample_value(r.body, "sluice_job_checkpoints_total{status="
                                 "\"completed\"} ") >= 1);
  cr_assert(strstr(r.body, "sluice_instance_records_in_total{operator=\""
                           ODD_LABEL "\",instance=\"1\"} "),
            "odd label not escaped: %s", r.body);
  cr_assert(strstr(r.body, "sluice_instance_busy_seconds_total{operator="
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
  r = curl(f.port, "/checkpoints?limit=abc", "");
  assert_error(&r, 400);
  reply_free(&r);
  r = curl(f.port, "/checkpoints?limit=65", "");
  assert_error(&r, 400);
  reply_free(&r);
  fixture_stop(&f);
}

/* ------------------------------------------------------------ errors */

Test(http, bad_requests) {
  fixture f;
  fixture_start(&f, true);
  reply r = curl(f.port, "/nope", "");
  assert_error(&r, 404);
  reply_free(&r);
  r = curl(f.port, "/metrics/", "");
  assert_error(&r, 404);
  reply_free(&r);
  r = curl(f.port, "/metrics", "-X POST -d x=1");
  assert_error(&r, 405);
  cr_assert(strstr(r.headers, "Allow: GET, HEAD"), "%s", r.headers);
  reply_free(&r);
  r = curl(f.port, "/jobs", "-X DELETE");
  assert_error(&r, 405);
  reply_free(&r);
  r = curl(f.port, "/savepoints", "");
  assert_error(&r, 405);
  cr_assert(strstr(r.headers, "Allow: POST"), "%s", r.headers);
  reply_free(&r);
  r = curl(f.port, "/savepoints", "-X POST");
  assert_error(&r, 400); /* no directory */
  reply_free(&r);
  r = curl(f.port, "/savepoints", "-H 'Content-Type: application/json' "
                                  "-d '{\"dir\": 7}'");
  assert_error(&r, 400);
  reply_free(&r);
  r = curl(f.port, "/savepoints", "-d 'dir=%00x'");
  assert_error(&r, 400); /* a NUL inside the name */
  reply_free(&r);
  /* A body over 64 KiB. */
  char big[] = "/tmp/sluice-http-big-XXXXXX";
  int fd = mkstemp(big);
  cr_assert(fd >= 0);
  char block[4096];
  memset(block, 'a', sizeof block);
  for (int i = 0; i < 20; i++)
    cr_assert_eq(write(fd, block, sizeof block), (ssize_t)sizeof block);
  close(fd);
  char args[128];
  snprintf(args, sizeof args, "--data-binary '@%s'", big);
  r = curl(f.port, "/savepoints", args);
  assert_error(&r, 413);
  reply_free(&r);
  unlink(big);
  fixture_stop(&f);
}

/* POST /savepoints reaches sl_job_savepoint: the answer echoes the
 * directory, whether the savepoint was written (200 and its id) or refused
 * (a 4xx/5xx JSON error; the placeholder says 501). */
static void assert_savepoint_reply(const reply *r, const char *dir) {
  json_t *v = reply_json(r);
  cr_assert_str_eq(json_string_value(json_object_get(v, "dir")), dir, "%s",
                   r->body);
  if (r->status == 200) {
    cr_assert(json_integer_value(json_object_get(v, "checkpoint_id")) > 0);
  } else {
    cr_assert(r->status >= 400 && r->status < 600, "%d", r->status);
    const char *e = json_string_value(json_object_get(v, "error"));
    cr_assert(e && *e);
  }
  json_decref(v);
}

Test(http, savepoint_request_reaches_the_call) {
  fixture f;
  fixture_start(&f, true);
  fixture_warm(&f);
  char *query_dir = sl_test_path_in(f.dir, "sp-query");
  char path[512];
  snprintf(path, sizeof path, "/savepoints?dir=%s", query_dir);
  reply r = curl(f.port, path, "-X POST");
  assert_savepoint_reply(&r, query_dir);
  reply_free(&r);
  r = curl(f.port, "/savepoints", "-d 'dir=/tmp/sluice-http-sp%20form+x'");
  assert_savepoint_reply(&r, "/tmp/sluice-http-sp form x");
  reply_free(&r);
  r = curl(f.port, "/savepoints",
           "-H 'Content-Type: application/json' "
           "-d '{\"target-directory\": \"/tmp/sluice-http-sp-json\"}'");
  assert_savepoint_reply(&r, "/tmp/sluice-http-sp-json");
  reply_free(&r);
  free(query_dir);
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
  sl_job_destroy(job);
}

/* ------------------------------------------------------------ the CLI */

Test(http, cli_run_http_serves_metrics) {
  const char *bin = getenv("SLUICE_BIN");
  cr_assert(bin && *bin, "SLUICE_BIN is not set (meson sets it)");
  char log[] = "/tmp/sluice-http-cli-XXXXXX";
  int fd = mkstemp(log);
  cr_assert(fd >= 0);
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    dup2(fd, 1);
    dup2(fd, 2);
    execl(bin, bin, "run", "keyed", "--records", "100000000000", "--quiet",
          "--http", "0", (char *)0);
    _exit(127);
  }
  close(fd);
  int port = 0;
  for (int i = 0; i < 10000 && !port; i++) { /* <= 10 s */
    char *text = sl_test_slurp(log);
    const char *at = strstr(text, "http endpoint on http://127.0.0.1:");
    if (at)
      port = atoi(at + strlen("http endpoint on http://127.0.0.1:"));
    free(text);
    if (!port)
      sl_test_sleep_us(1000);
  }
  cr_assert(port > 0, "no endpoint line in the CLI's output");
  reply r = curl(port, "/metrics", "");
  cr_assert_eq(r.status, 200);
  cr_assert(sample_value(r.body, "sluice_job_info{state=\"RUNNING\"} ") == 1,
            "%s", r.body);
  cr_assert(strstr(r.body, "sluice_instance_records_out_total{operator="
                           "\"source\",instance=\"0\"} "));
  char *copy = strdup(r.body);
  check_exposition(copy);
  free(copy);
  reply_free(&r);
  kill(pid, SIGINT);
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 130,
            "exit status %d", status);
  unlink(log);
}
