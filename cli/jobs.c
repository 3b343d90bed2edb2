/* jobs.c — `sluice run JOB`: the built-in jobs (pipeline, keyed, count,
 * window) built on the public API, and running one: signals, SIGUSR1
 * savepoints, the --http endpoint, the live status line, and the summary
 * with the verdict (verdict.c) and the failover and checkpoint figures. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fixtures.h" /* bench/: the jobs the benchmarks also run */
#include "output.h"
#include "run.h"
#include "store.h" /* sl_store_test_crash_after */

/* ------------------------------------------------------------ jobs */

/* Running count per key: one counter array per instance, indexed by key
 * (keys are < K by construction; a key outside fails the job). */
typedef struct counter {
  uint64_t keys;
  uint64_t *counts;
} counter;

static int count_open(sl_ctx *ctx, void *user, void **state) {
  const options *o = user;
  counter *c = calloc(1, sizeof *c);
  if (!c || !(c->counts = calloc(o->keys, sizeof(uint64_t)))) {
    free(c);
    sl_ctx_fail(ctx, "no memory for %" PRIu64 " counters", o->keys);
    return ENOMEM;
  }
  c->keys = o->keys;
  *state = c;
  return 0;
}

static int count_process(sl_ctx *ctx, void *state, int input,
                         const sl_record *in) {
  (void)input;
  counter *c = state;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  if (t.key >= c->keys) {
    sl_ctx_fail(ctx, "key %" PRIu64 " outside 0..%" PRIu64, t.key, c->keys - 1);
    return EINVAL;
  }
  sl_tuple out = {.key = t.key, .value = ++c->counts[t.key]};
  return sl_emit(ctx, &out, sizeof out);
}

static void count_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  counter *c = state;
  free(c->counts);
  free(c);
}

static int format_tuple(void *user, const sl_record *in, char *buffer,
                        uint32_t buffer_bytes) {
  (void)user;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  int n = snprintf(buffer, buffer_bytes, "%" PRIu64 ",%" PRIu64, t.key,
                   t.value);
  /* snprintf needs room for its NUL: ask for one byte more if it lacked. */
  return (uint32_t)n < buffer_bytes ? n : n + 1;
}

/* ------------------------------------------------------------ output */

/* --output DIR belongs to one job lineage (the file sink, include/
 * sluice.h): another lineage's parts there are deleted only by a run that
 * can never be resumed (no --state-dir) or that asked for --fresh; any
 * other start is refused naming DIR. */
static int output_clears(const options *o) {
  return !o->config.checkpoint.state_dir ||
         o->config.checkpoint.store_policy == SL_STORE_FRESH;
}

/* ------------------------------------------------------------ window */

/* What the window job emits when a window is full. */
typedef struct window_result {
  uint64_t key, window, sum;
} window_result;

/* The job's count window (sl_op_window, SL_WINDOW_COUNT: Flink's
 * countWindow): every --window records of a key emit their sum; a last,
 * partial window is not emitted.  The accumulator is the sum. */
static void sum_init(void *user, void *acc) {
  (void)user;
  memset(acc, 0, sizeof(uint64_t));
}

static void sum_add(void *user, void *acc, const sl_record *in) {
  (void)user;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  uint64_t sum;
  memcpy(&sum, acc, sizeof sum);
  sum += t.value;
  memcpy(acc, &sum, sizeof sum);
}

static int sum_emit(void *user, sl_ctx *ctx, uint64_t key,
                    const sl_window *w, const void *acc) {
  const options *o = user;
  window_result r = {.key = key, .window = (uint64_t)w->start / o->window};
  memcpy(&r.sum, acc, sizeof r.sum);
  return sl_emit(ctx, &r, sizeof r);
}

static int format_window(void *user, const sl_record *in, char *buffer,
                         uint32_t buffer_bytes) {
  (void)user;
  window_result r;
  memcpy(&r, in->data, sizeof r);
  int n = snprintf(buffer, buffer_bytes, "%" PRIu64 ",%" PRIu64 ",%" PRIu64,
                   r.key, r.window, r.sum);
  return (uint32_t)n < buffer_bytes ? n : n + 1;
}

static int build_window(const options *o, sl_job *job, sl_op **verify) {
  sl_op *src, *by, *win, *sink;
  int p = o->parallelism;
  int rc = sl_source_keyed(job, "source", p, o->records, o->keys, &src);
  if (!rc)
    rc = sl_op_key_by(job, "by-key", src, fixture_tuple_key, 0, &by);
  sl_window_config wc = {.type = SL_WINDOW_COUNT,
                         .size = (int64_t)o->window,
                         .acc_bytes = sizeof(uint64_t),
                         .init = sum_init,
                         .add = sum_add,
                         .emit = sum_emit,
                         .user = (void *)o};
  if (!rc)
    rc = sl_op_window(job, "window", by, p, &wc, &win);
  sl_file_sink_config fc = {.dir = o->output_dir,
                            .exactly_once = o->config.checkpoint.mode ==
                                            SL_EXACTLY_ONCE,
                            .format = format_window,
                            .suffix = ".csv",
                            .clear_other_lineage = output_clears(o)};
  if (!rc)
    rc = sl_sink_file(job, "sink", win, p, &fc, &sink);
  if (!rc)
    rc = sl_sink_verify(job, "verify", src, p, o->records, o->keys, verify);
  return rc;
}

static int build_job(const options *o, sl_job *job, sl_checksum *sum,
                     sl_op **verify) {
  sl_op *src, *mid, *mid2, *sink;
  int p = o->parallelism;
  if (strcmp(o->job_name, "window") == 0)
    return build_window(o, job, verify);
  int rc = sl_source_sequence(job, "source", p, o->records, o->keys, &src);
  if (rc)
    return rc;
  if (strcmp(o->job_name, "pipeline") == 0) {
    rc = sl_op_map(job, "map", src, p, sizeof(sl_tuple), fixture_p1_map, 0,
                   &mid);
    if (!rc)
      rc = sl_op_filter(job, "filter", mid, p, fixture_p1_filter, 0, &mid2);
    if (!rc)
      rc = sl_sink_checksum(job, "sink", mid2, p, sum, &sink);
    return rc;
  }
  if (strcmp(o->job_name, "count") == 0) {
    const fixture_keyed_spec spec = {.parallelism = p};
    rc = fixture_keyed_count(job, src, &spec, &mid2);
    if (!rc && o->output_dir) {
      sl_file_sink_config fc = {.dir = o->output_dir,
                                .exactly_once = 1,
                                .format = format_tuple,
                                .suffix = ".csv",
                                .clear_other_lineage = output_clears(o)};
      rc = sl_sink_file(job, "sink", mid2, p, &fc, &sink);
    } else if (!rc) {
      rc = sl_sink_checksum(job, "sink", mid2, p, sum, &sink);
    }
    return rc;
  }
  static const sl_process_ops count_ops = {
      .open = count_open, .process = count_process, .close = count_close};
  const fixture_keyed_spec spec = {
      .count_ops = &count_ops, .count_user = (void *)o, .parallelism = p};
  rc = fixture_keyed_count(job, src, &spec, &mid2);
  if (!rc)
    rc = sl_sink_checksum(job, "sink", mid2, p, sum, &sink);
  return rc;
}

/* ------------------------------------------------------------ running */

/* SIGUSR1 -> a savepoint into DIR/savepoint-<id>, on this thread (the
 * handler only wrote a byte to fd: cli_watch_savepoint_signal).  The id
 * in the name is the newest complete checkpoint when the signal is read;
 * the message gives the one copied. */
typedef struct savepointer {
  sl_job *job;
  const char *dir;
  int fd;
} savepointer;

static void savepoint_once(const savepointer *sp) {
  uint64_t restored = 0, last = sl_job_last_checkpoint(sp->job, &restored);
  char path[4096], err[1024];
  snprintf(path, sizeof path, "%s/savepoint-%" PRIu64, sp->dir,
           last ? last : restored);
  uint64_t id = 0;
  int rc = sl_job_savepoint(sp->job, path, &id, err, sizeof err);
  if (rc)
    fprintf(stderr, "\nsluice: SIGUSR1: savepoint failed: %s\n", err);
  else
    fprintf(stderr, "\nsluice: SIGUSR1: savepoint of checkpoint %" PRIu64
            " written to %s\n", id, path);
}

static void *savepointer_main(void *arg) {
  const savepointer *sp = arg;
  /* One turn per byte; 'q' (cli_unwatch_savepoint_signal) or the pipe's
   * end ends it, so the loop lasts as long as the job. */
  for (;;) {
    char c;
    ssize_t n = read(sp->fd, &c, 1);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0 || c == 'q')
      return 0;
    savepoint_once(sp);
  }
}

/* The bearer token of the endpoint into token: the first line of
 * --http-token-file, else $SLUICE_HTTP_TOKEN; false if neither is set.
 * A file that cannot be read, or holds no token, is a usage error. */
static bool http_token(const options *o, char *token, size_t token_bytes) {
  if (!o->http_token_file) {
    const char *env = getenv("SLUICE_HTTP_TOKEN");
    if (!env || !*env)
      return false;
    if (strlen(env) >= token_bytes)
      die_usage("SLUICE_HTTP_TOKEN is over %zu bytes", token_bytes - 1);
    strcpy(token, env);
    return true;
  }
  FILE *f = fopen(o->http_token_file, "r");
  if (!f)
    die_usage("--http-token-file %s: %s", o->http_token_file,
              strerror(errno));
  bool read = fgets(token, (int)token_bytes, f) != 0;
  fclose(f);
  size_t n = read ? strcspn(token, "\r\n") : 0;
  if (n == 0)
    die_usage("--http-token-file %s: no token on its first line",
              o->http_token_file);
  token[n] = 0;
  return true;
}

/* --http [ADDR:]PORT: start the endpoint (before the job, so a port in use
 * fails at once) and say where it listens.  NULL on failure (said). */
static sl_http *start_http(const options *o, sl_job *job) {
  char addr[64] = "127.0.0.1";
  const char *port_text = o->http;
  const char *colon = strrchr(o->http, ':');
  if (colon) {
    const char *host = o->http;
    size_t n = (size_t)(colon - host);
    if (n >= 2 && host[0] == '[' && host[n - 1] == ']')
      host++, n -= 2; /* [::1]:8080 */
    if (n == 0 || n >= sizeof addr)
      die_usage("--http: bad address in '%s'", o->http);
    memcpy(addr, host, n);
    addr[n] = 0;
    port_text = colon + 1;
  }
  char token[1100];
  const char *protected[] = {o->output_dir, 0};
  sl_http_options opts = SL_HTTP_OPTIONS_INIT;
  opts.address = addr;
  opts.port = (int)parse_u64("--http", port_text, 0, 65535);
  opts.savepoint_root = o->savepoint_dir;
  opts.protected_dirs = protected;
  opts.bearer_token = http_token(o, token, sizeof token) ? token : 0;
  sl_http *http = 0;
  int rc = sl_http_start_with(job, &opts, &http);
  if (rc == SL_EUSAGE)
    die_usage("--http %s: %s is not a loopback address, so the endpoint "
              "needs a bearer token: --http-token-file FILE or "
              "SLUICE_HTTP_TOKEN", o->http, addr);
  explicit_bzero(token, sizeof token); /* the library keeps its copy */
  if (rc == EINVAL)
    fprintf(stderr, "sluice: --http: a token must be 16 to 1024 visible "
            "ASCII characters, and --savepoint-dir must lie outside "
            "--state-dir and --output\n");
  if (rc) {
    fprintf(stderr, "sluice: cannot serve http on %s port %d: %s\n", addr,
            opts.port, sl_strerror(rc));
    return 0;
  }
  fprintf(stderr, "sluice: http endpoint on http://%s%s%s:%d%s\n",
          strchr(addr, ':') ? "[" : "", addr, strchr(addr, ':') ? "]" : "",
          sl_http_port(http), opts.bearer_token ? " (bearer token)" : "");
  return http;
}

static void print_summary(const options *o, sl_job *job, int rc, double secs,
                          bool verified, const char *why) {
  uint64_t records = sl_job_progress(job);
  double rate = secs > 0 ? (double)records / secs : 0;
  int n = sl_job_operator_count(job);
  if (o->json) {
    printf("{\"job\":\"%s\",\"status\":%d,\"verified\":%s,\"records\":%" PRIu64
           ",\"seconds\":%.6f,\"records_per_second\":%.0f,\"operators\":[",
           o->job_name, rc, verified ? "true" : "false", records, secs, rate);
    for (int i = 0; i < n; i++) {
      sl_op_stats st;
      sl_job_stats(job, i, &st);
      printf("%s{\"name\":\"%s\",\"parallelism\":%d,\"records_in\":%" PRIu64
             ",\"records_out\":%" PRIu64 "}",
             i ? "," : "", st.name, st.parallelism, st.records_in,
             st.records_out);
    }
    printf("]}\n");
    return;
  }
  printf("job %s: %s in %.3f s, %.1fM records/s (%" PRIu64 " source records)\n",
         o->job_name, rc == 0 ? "finished" : sl_strerror(rc), secs, rate / 1e6,
         records);
  for (int i = 0; i < n; i++) {
    sl_op_stats st;
    sl_job_stats(job, i, &st);
    printf("  %-10s x%-3d in %12" PRIu64 "  out %12" PRIu64 "\n", st.name,
           st.parallelism, st.records_in, st.records_out);
  }
  if (rc == 0 && o->stopped_with_savepoint)
    printf("verification: SKIPPED (%s)\n", why);
  else if (rc == 0 && strcmp(o->job_name, "window") == 0)
    printf("verdict: %s\n", why);
  else if (rc == 0)
    printf("verification: %s (%s)\n", verified ? "PASSED" : "FAILED", why);
}

static int compare_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Restarts with their recovery times, and the checkpoints of the run. */
static void print_failover(sl_job *job, const options *o) {
  uint32_t restarts = sl_job_restarts(job);
  if (restarts || o->config.faults)
    printf("failover: %" PRIu32 " restart%s, %" PRIu64 " injected fault%s "
           "fired\n", restarts, restarts == 1 ? "" : "s",
           sl_job_faults_fired(job), sl_job_faults_fired(job) == 1 ? "" : "s");
  for (int k = (int)(restarts < 16 ? restarts : 16) - 1; k >= 0; k--) {
    sl_recovery_stats r;
    if (sl_job_recovery_stats(job, k, &r))
      continue;
    char restored[32] = "none", first[32] = "none";
    if (r.restored_us)
      snprintf(restored, sizeof restored, "%.1f ms",
               (double)r.restored_us / 1e3);
    if (r.first_record_us)
      snprintf(first, sizeof first, "%.1f ms",
               (double)r.first_record_us / 1e3);
    printf("  restart %" PRIu32 ": %s\n"
           "    restored checkpoint %" PRIu64 "; after the failure: threads "
           "stopped %.1f ms, waited %.1f ms, state restored %s, first "
           "record %s\n",
           r.restart, r.cause, r.restored_from, (double)r.stopped_us / 1e3,
           (double)r.delay_us / 1e3, restored, first);
  }
  if (!o->config.checkpoint.state_dir)
    return;
  uint64_t durations[64];
  int completed = 0, aborted = 0;
  for (int k = 0; k < 64; k++) {
    sl_checkpoint_stats cs;
    if (sl_job_checkpoint_stats(job, k, &cs))
      break;
    if (cs.status == SL_CHECKPOINT_COMPLETED)
      durations[completed++] = cs.duration_us;
    aborted += cs.status == SL_CHECKPOINT_ABORTED;
  }
  if (completed) {
    qsort(durations, (size_t)completed, sizeof durations[0], compare_u64);
    printf("checkpoints (the last %d): %d complete, %d aborted; trigger to "
           "durable p50 %.1f ms, max %.1f ms\n",
           completed + aborted, completed, aborted,
           (double)durations[completed / 2] / 1e3,
           (double)durations[completed - 1] / 1e3);
  }
}

/* A finished checkpointed job: the checkpoint it resumed from, if any, and
 * its newest checkpoints. */
static void print_checkpoints(sl_job *job) {
  sl_checkpoint_stats cs;
  uint64_t from = 0;
  uint64_t last = sl_job_last_checkpoint(job, &from);
  if (from && sl_job_restarts(job) == 0) /* else: a failover's restore */
    printf("resumed from checkpoint %" PRIu64 "\n", from);
  if (sl_job_checkpoint_stats(job, 0, &cs) == 0)
    printf("checkpoints: newest complete %" PRIu64 "; last one %" PRIu64
           " (%s) took %.1f ms, %" PRIu64 " entries, %" PRIu64 " bytes\n",
           last, cs.id, cs.final ? "final" : "periodic",
           (double)cs.duration_us / 1e3, cs.entries_persisted,
           cs.bytes_persisted);
}

int run_job(options *o) {
  run_check_options(o);
  bool window = strcmp(o->job_name, "window") == 0;
  sl_job *job;
  o->config.name = o->job_name; /* the metrics' job label */
  int rc = cli_job_create(&o->config, &job);
  if (rc)
    return rc;
  sl_checksum sum = {0};
  sl_op *verify_op = 0;
  rc = build_job(o, job, &sum, &verify_op);
  if (rc) {
    fprintf(stderr, "sluice: cannot build job %s: %s\n", o->job_name,
            rc == SL_EGRAPH ? sl_job_error(job) : sl_strerror(rc));
    sl_job_destroy(job);
    return 1;
  }
  cli_watch_signals(job);
  savepointer sp = {.job = job, .dir = o->savepoint_dir, .fd = -1};
  if (o->savepoint_dir && (sp.fd = cli_watch_savepoint_signal()) < 0)
    fprintf(stderr, "sluice: SIGUSR1 savepoints are off: %s\n",
            strerror(errno));
  sl_http *http = o->http ? start_http(o, job) : 0;
  if (o->http && !http) {
    cli_unwatch_signals();
    sl_job_destroy(job);
    return 1;
  }

  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  /* Before the start, so a signal at any time is a stop with a savepoint
   * (served once armed). */
  cli_stopper *stopper = cli_stopper_start(job, o->stop_savepoint, o->drain);
  /* For tests only (tests/test_store_faults.c): SIGKILL inside the Nth
   * put of a compaction's write, which no --fault kind reaches. */
  const char *crash = getenv("SLUICE_TEST_COMPACTION_CRASH_AFTER");
  if (crash && *crash)
    sl_store_test_crash_after(strtoull(crash, NULL, 10));
  rc = sl_job_start(job);
  if (rc) {
    fprintf(stderr, "sluice: cannot start job %s: %s\n", o->job_name,
            sl_job_error(job)[0] ? sl_job_error(job) : sl_strerror(rc));
    cli_unwatch_signals();
    cli_stopper_finish(stopper);
    if (sp.fd >= 0)
      cli_unwatch_savepoint_signal();
    sl_http_stop(http);
    sl_job_destroy(job);
    return 1;
  }
  cli_stopper_arm(stopper);
  pthread_t savepoint_thread;
  bool savepointer_started =
      sp.fd >= 0 &&
      pthread_create(&savepoint_thread, 0, savepointer_main, &sp) == 0;
  cli_status *status =
      o->quiet ? 0 : cli_status_start(job, o->job_name, o->status_interval_ms);
  rc = sl_job_wait(job);
  o->stopped_with_savepoint = cli_stopper_finish(stopper);
  /* POST /stop ends the job with 0 too, at a checkpoint that is not the
   * final one (a job that ran to its end wrote that one last). */
  sl_checkpoint_stats newest;
  if (rc == 0 && o->config.checkpoint.state_dir &&
      sl_job_checkpoint_stats(job, 0, &newest) == 0 && !newest.final)
    o->stopped_with_savepoint = true;
  double secs = seconds_since(&t0);
  sl_http_stop(http); /* before the job is destroyed */
  cli_status_stop(status); /* clears the line before the summary */
  cli_unwatch_signals();
  if (sp.fd >= 0)
    cli_unwatch_savepoint_signal();
  if (savepointer_started)
    pthread_join(savepoint_thread, 0);
  char why[512] = "";
  bool verified = false;
  if (rc == 0 && o->stopped_with_savepoint) /* a part of the output */
    snprintf(why, sizeof why, "stopped with a savepoint: the run resumed "
             "from it checks the whole output");
  else if (rc == 0 && window)
    verified = window_verdict(o, verify_op, why, sizeof why);
  else if (rc == 0)
    verified = o->output_dir ? verify_output(o, why, sizeof why)
                             : verify_checksum(o, &sum, why, sizeof why);
  if (!o->json)
    print_failover(job, o);
  if (rc == 0 && o->config.checkpoint.state_dir && !o->json)
    print_checkpoints(job);
  print_summary(o, job, rc, secs, verified, why);
  if (rc && rc != SL_ESTOPPED)
    fprintf(stderr, "sluice: job %s failed: %s\n", o->job_name, sl_job_error(job));
  sl_job_destroy(job);
  if (rc == SL_ESTOPPED)
    return cli_stop_status(); /* 130 SIGINT, 143 SIGTERM */
  return rc == 0 && (verified || o->stopped_with_savepoint) ? 0 : 1;
}
