/* test_unaligned.c — unaligned checkpoints (docs/checkpoints.md,
 * "Unaligned checkpoints"; snapshot.c notes 12 and 13): under
 * backpressure they complete holding channel state, a failover restores
 * it and the output is exactly that of an uninterrupted run; the aligned
 * checkpoint timeout switches a checkpoint; joins, max_concurrent 2,
 * aborts while capturing, end of input while capturing; damaged channel
 * state is SL_ECORRUPT; the settings are checked.
 *
 * The job (one fixture, build_job): a keyed source (each key's records in
 * sequence, as in test_failover.c; it can hold back until a checkpoint
 * completed, so a failover has one to restore) -> key_by -> "count"
 * (running count per key in keyed state) -> a verifying sink, which a
 * slow fault makes the bottleneck (the rings fill: backpressure), and an
 * exactly-once file sink.  Real threads, LMDB and files.  Savepoints of
 * such a job stay aligned and rescale; one holding channel state (made
 * by hand, as older builds took them) cannot be rescaled. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sluice_testing.h" /* unstable test helpers */
#include "inspect.h"         /* reading a state directory (internal) */
#include "store.h"           /* damaging a store (internal) */
#include "test_dirs.h"
#include "test_util.h"

/* ------------------------------------------------------------ the job */

typedef struct spec {
  uint64_t records, keys, gate;
  int parallelism;
  bool two_inputs; /* two source operators, "count" reads both */
  int count_parallelism; /* 0: parallelism */
  bool unaligned;
  uint32_t aligned_timeout_ms;
  uint32_t interval_ms; /* 0: 10 ms */
  uint32_t max_concurrent;
  uint32_t tolerable;
  uint32_t timeout_ms; /* checkpoint timeout; 0: the default */
  uint64_t ring_bytes; /* 0: the fixture's 64 KiB */
  const char *faults;
  struct sl_restart_config restart;
  const char *state_dir;
  const char *out_dir;
  const char *from_savepoint;
  int policy;
  /* Source instance 1 waits in its open() until a capture of channel
   * state was aborted (held_open): one operator, not two_inputs. */
  bool hold_until_capture_aborted;
} spec;

typedef struct result {
  int rc;
  char error[512];
  uint32_t restarts;
  sl_verify_counts sink, files;
  uint64_t completed, unaligned_completed, channel_bytes_max;
  uint64_t restored_from;
  uint64_t restored_channel_bytes; /* of the restored checkpoint, if known */
  /* Completed unaligned checkpoints in which no instance aligned for at
   * least the aligned-checkpoint timeout (should be none with one). */
  uint64_t unaligned_before_timeout;
  uint64_t captures_aborted; /* sl_job_captures_aborted() at the end */
  /* The same count as GET /metrics shows it (sl_metrics_prometheus);
   * -1 if the family is missing. */
  double captures_aborted_metric;
} result;

static sl_fixture_gated_source g_source, g_left, g_right;

/* The value of the sample whose line starts with prefix in the job's
 * Prometheus text (sl_metrics_prometheus); -1 if there is none. */
static double prometheus_sample(sl_job *job, const char *prefix) {
  size_t needed = 0;
  cr_assert_eq(sl_metrics_prometheus(job, NULL, 0, &needed), ENOSPC);
  char *text = malloc(needed);
  cr_assert(text);
  cr_assert_eq(sl_metrics_prometheus(job, text, needed, &needed), 0);
  double value = -1;
  size_t n = strlen(prefix);
  for (const char *line = text; line && *line;) {
    if (strncmp(line, prefix, n) == 0) {
      value = strtod(line + n, 0);
      break;
    }
    line = strchr(line, '\n');
    line = line ? line + 1 : 0;
  }
  free(text);
  return value;
}

/* spec.hold_until_capture_aborted: while set, source instance 1 has not
 * opened, so it takes part in no checkpoint and sends nothing: every
 * capture downstream keeps its channel from it open, and no checkpoint
 * can complete. */
static atomic_bool g_hold;

static int held_open(sl_ctx *ctx, void *user, void **state) {
  /* Bounded: run_job clears g_hold once a capture was aborted, or fails
   * the test (which ends the process) after its own bound. */
  while (sl_ctx_instance(ctx) == 1 && atomic_load(&g_hold))
    sl_test_sleep_us(200);
  return sl_fixture_gated_ops.open(ctx, user, state);
}

/* The gated source, with held_open. */
static const sl_source_ops *held_ops(void) {
  static sl_source_ops ops;
  ops = sl_fixture_gated_ops;
  ops.open = held_open;
  return &ops;
}

static sl_job *build_job(const spec *s, sl_op **verify) {
  sl_job_config config =
      sl_fixture_config(s->state_dir, s->interval_ms ? s->interval_ms : 10);
  config.checkpoint_unaligned = s->unaligned;
  config.checkpoint_aligned_timeout_ms = s->aligned_timeout_ms;
  config.checkpoint.max_concurrent = s->max_concurrent;
  config.checkpoint.tolerable_failures = s->tolerable;
  config.checkpoint.timeout_ms = s->timeout_ms;
  config.checkpoint.store_policy = s->policy;
  config.checkpoint.from_savepoint = s->from_savepoint;
  if (s->ring_bytes)
    config.ring_bytes = s->ring_bytes;
  config.restart = s->restart;
  config.faults = s->faults;
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  g_source.count = s->records;
  g_source.keys = s->keys;
  g_source.gate = s->gate;
  sl_op *src, *by[2], *count, *file;
  static const sl_process_ops count_ops = {.process = sl_fixture_count_with_record};
  if (s->two_inputs) {
    /* A two-input operator (as a join): even keys on input 0, odd on 1. */
    g_left = (sl_fixture_gated_source){.count = s->records, .keys = s->keys,
                            .gate = s->gate, .part = 0, .parts = 2};
    g_right = g_left;
    g_right.part = 1;
    cr_assert_eq(sl_op_source(job, "left", 1, &sl_fixture_gated_ops, &g_left, &src), 0);
    cr_assert_eq(sl_op_key_by(job, "by-left", src, sl_fixture_tuple_key, 0,
                              &by[0]), 0);
    cr_assert_eq(sl_op_source(job, "right", 1, &sl_fixture_gated_ops, &g_right, &src),
                 0);
    cr_assert_eq(sl_op_key_by(job, "by-right", src, sl_fixture_tuple_key, 0,
                              &by[1]), 0);
  } else {
    const sl_source_ops *ops =
        s->hold_until_capture_aborted ? held_ops() : &sl_fixture_gated_ops;
    cr_assert_eq(sl_op_source(job, "source", s->parallelism, ops, &g_source,
                              &src), 0);
    cr_assert_eq(sl_op_key_by(job, "by-key", src, sl_fixture_tuple_key, 0,
                              &by[0]), 0);
  }
  cr_assert_eq(sl_op_process(job, "count", by, s->two_inputs ? 2 : 1,
                             s->count_parallelism ? s->count_parallelism
                                                  : s->parallelism,
                             &count_ops, 0, &count), 0);
  cr_assert_eq(sl_sink_verify(job, "verify", count, s->parallelism,
                              s->records, s->keys, verify), 0);
  sl_file_sink_config fc = {.dir = s->out_dir, .exactly_once = 1,
                            .format = sl_fixture_format_counted, .suffix = ".csv"};
  cr_assert_eq(sl_sink_file(job, "files", count, s->parallelism, &fc, &file),
               0);
  return job;
}

/* The statistics of the job's checkpoints into r. */
static void read_stats(sl_job *job, const spec *s, result *r) {
  for (int k = 0;; k++) {
    sl_checkpoint_stats cs;
    if (sl_job_checkpoint_stats(job, k, &cs))
      break;
    if (cs.status != SL_CHECKPOINT_COMPLETED)
      continue;
    if (cs.unaligned && s->aligned_timeout_ms) {
      uint64_t longest_us = 0;
      for (int i = 0; i < cs.instance_count; i++) {
        sl_checkpoint_instance_stats is;
        cr_assert_eq(sl_job_checkpoint_instance_stats(job, k, i, &is), 0);
        if (is.alignment_us > longest_us)
          longest_us = is.alignment_us;
      }
      r->unaligned_before_timeout +=
          longest_us < (uint64_t)s->aligned_timeout_ms * 1000u;
    }
    r->completed++;
    r->unaligned_completed += cs.unaligned != 0;
    if (cs.channel_bytes > r->channel_bytes_max)
      r->channel_bytes_max = cs.channel_bytes;
    if (cs.id == r->restored_from)
      r->restored_channel_bytes = cs.channel_bytes;
  }
}

static result run_job(const spec *s) {
  result r = {0};
  sl_op *verify;
  sl_job *job = build_job(s, &verify);
  sl_test_watchdog w;
  atomic_store(&g_hold, s->hold_until_capture_aborted);
  r.rc = sl_job_start(job);
  if (r.rc == 0) {
    sl_test_watchdog_arm(&w, job, 120, "unaligned job");
    /* Bounded by the watchdog's 120 s (the abort comes in milliseconds). */
    for (int ms = 0; atomic_load(&g_hold) && ms < 120000; ms++) {
      if (sl_job_captures_aborted(job) > 0) {
        /* The premise: nothing could complete while source 1 was held. */
        cr_assert_eq(sl_job_last_checkpoint(job, 0), 0);
        atomic_store(&g_hold, false);
      } else {
        sl_test_sleep_us(1000);
      }
    }
    cr_assert_not(atomic_load(&g_hold), "no capture was aborted in 120 s");
    r.rc = sl_job_wait(job);
    cr_assert_not(sl_test_watchdog_disarm(&w), "the job hung");
  }
  snprintf(r.error, sizeof r.error, "%s", sl_job_error(job));
  r.restarts = sl_job_restarts(job);
  r.captures_aborted = sl_job_captures_aborted(job);
  r.captures_aborted_metric = prometheus_sample(
      job, "sluice_job_unaligned_captures_aborted_total{job=\"sluice\"} ");
  if (r.restarts) {
    sl_recovery_stats rs;
    cr_assert_eq(sl_job_recovery_stats(job, 0, &rs), 0);
    r.restored_from = rs.restored_from;
  }
  cr_assert_eq(sl_verify_result(verify, &r.sink), 0);
  read_stats(job, s, &r);
  sl_job_destroy(job);
  char err[256];
  cr_assert_eq(sl_verify_output_dir(s->out_dir, s->records, s->keys, &r.files,
                                    err, sizeof err), 0, "%s", err);
  return r;
}

/* The job finished and its verifying sink saw every record once, in
 * order. */
static void expect_sink_exactly_once(const result *r, const char *what) {
  cr_expect_eq(r->rc, 0, "%s: job failed: %s", what, r->error);
  cr_expect(r->sink.complete, "%s: the verifying sink did not finish", what);
  cr_expect_eq(r->sink.lost, 0, "%s: sink lost %" PRIu64, what, r->sink.lost);
  cr_expect_eq(r->sink.duplicates, 0, "%s: sink duplicates %" PRIu64, what,
               r->sink.duplicates);
  cr_expect_eq(r->sink.out_of_order, 0, "%s: sink out of order %" PRIu64,
               what, r->sink.out_of_order);
}

static void expect_exactly_once(const result *r, uint64_t records,
                                const char *what) {
  expect_sink_exactly_once(r, what);
  cr_expect_eq(r->files.lost, 0, "%s: files lost %" PRIu64, what,
               r->files.lost);
  cr_expect_eq(r->files.duplicates, 0, "%s: files duplicates %" PRIu64, what,
               r->files.duplicates);
  cr_expect_eq(r->files.out_of_order, 0, "%s: files out of order", what);
  cr_expect_eq(r->files.records, records, "%s: file lines", what);
  cr_expect_eq(r->files.pending_files, 0, "%s: uncommitted parts left", what);
}

/* The committed files in out hold every value below records exactly once,
 * each with its key's running count (value / keys + 1), and no part is
 * left uncommitted: the output of an uninterrupted run, in whatever order
 * the files of a rescaled job hold it (sl_verify_output_dir reads them
 * instance by instance, which a key that moved between instances
 * breaks). */
static void expect_files_exactly(const char *out, uint64_t records,
                                 uint64_t keys) {
  uint8_t *seen = calloc(records, 1);
  cr_assert(seen);
  uint64_t foreign = 0, wrong_count = 0, pending = 0;
  DIR *d = opendir(out);
  cr_assert(d, "%s: %s", out, strerror(errno));
  for (struct dirent *e; (e = readdir(d)) != 0;) {
    pending += strncmp(e->d_name, ".part-", 6) == 0;
    if (strncmp(e->d_name, "part-", 5) != 0)
      continue;
    char *path = sl_test_path_in(out, e->d_name);
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s: %s", path, strerror(errno));
    uint64_t key, value, count;
    while (fscanf(f, "%" SCNu64 ",%" SCNu64 ",%" SCNu64 "\n", &key, &value,
                  &count) == 3) {
      if (value >= records || value % keys != key) {
        foreign++;
        continue;
      }
      seen[value] += seen[value] < UINT8_MAX;
      wrong_count += count != value / keys + 1;
    }
    cr_assert(feof(f), "%s: a line is not KEY,VALUE,COUNT", path);
    fclose(f);
    free(path);
  }
  closedir(d);
  uint64_t lost = 0, duplicates = 0;
  for (uint64_t v = 0; v < records; v++) {
    lost += seen[v] == 0;
    duplicates += seen[v] > 1 ? seen[v] - 1u : 0;
  }
  free(seen);
  cr_expect_eq(lost, 0, "%" PRIu64 " values lost", lost);
  cr_expect_eq(duplicates, 0, "%" PRIu64 " duplicates", duplicates);
  cr_expect_eq(foreign, 0, "%" PRIu64 " values not of the source", foreign);
  cr_expect_eq(wrong_count, 0, "%" PRIu64 " lines with a wrong count",
               wrong_count);
  cr_expect_eq(pending, 0, "%" PRIu64 " uncommitted parts", pending);
}

static struct sl_restart_config fixed(uint32_t attempts) {
  struct sl_restart_config c = sl_restart_defaults(SL_RESTART_FIXED_DELAY);
  c.attempts = attempts;
  c.delay_ms = 0;
  return c;
}

/* ------------------------------------------------------------ tests */

#define SLOW "slow:op=verify,delay_us=500,from=100,records=4000"

/* Records of the tests behind SLOW, not scaled down under sanitizers:
 * 1.6 MB of 16-byte records, far more than the rings hold (8 rings of
 * 64 KiB), so the sources still run, and checkpoints are triggered, while
 * the rings are full (the coordinator triggers only while a source runs;
 * scaled down, everything fit in the rings and the sources ended first). */
#define RECORDS 100000u

/* The verifying sink takes 500 us a record for its records 100 .. 4099
 * (SLOW below): the rings between it and the sources fill and stay full
 * for seconds, so the first checkpoints overtake full rings whatever the
 * machine's speed (a checkpoint takes milliseconds). */
Test(unaligned, backpressured_checkpoints_hold_channel_state,
     .timeout = 300) {
  char *state = sl_test_temp_dir("ua"), *out = sl_test_temp_dir("ua");
  uint64_t records = RECORDS;
  spec s = {.records = records, .keys = 31, .parallelism = 2,
            .unaligned = true, .interval_ms = 20,
            .faults = SLOW, .state_dir = state, .out_dir = out};
  result r = run_job(&s);
  expect_exactly_once(&r, records, "backpressured");
  cr_expect_geq(r.unaligned_completed, 1, "%" PRIu64 " of %" PRIu64
                " completed checkpoints unaligned", r.unaligned_completed,
                r.completed);
  cr_expect_gt(r.channel_bytes_max, 0, "no checkpoint held channel state");
  sl_test_remove_tree(state);
  sl_test_remove_tree(out);
}

/* A failure of "count" on the first checkpoint completion it sees (taken
 * over full rings, so holding channel state), restarted in-process from
 * it: exactly the output of an uninterrupted run. */
Test(unaligned, failover_restores_channel_state_exactly_once,
     .timeout = 300) {
  char *state = sl_test_temp_dir("ua"), *out = sl_test_temp_dir("ua");
  uint64_t records = RECORDS;
  char faults[200];
  snprintf(faults, sizeof faults, SLOW ";complete:op=count,instance=0,nth=1");
  spec s = {.records = records, .keys = 31, .parallelism = 2,
            .unaligned = true, .interval_ms = 20,
            .faults = faults, .restart = fixed(3), .state_dir = state,
            .out_dir = out};
  result r = run_job(&s);
  expect_exactly_once(&r, records, "failover");
  cr_expect_eq(r.restarts, 1, "%" PRIu32 " restarts", r.restarts);
  cr_expect_gt(r.restored_from, 0, "nothing was restored");
  cr_expect_gt(r.restored_channel_bytes, 0, "checkpoint %" PRIu64
               " restored held no channel state", r.restored_from);
  sl_test_remove_tree(state);
  sl_test_remove_tree(out);
}

/* Two inputs (a join's shape): "count" reads two source operators, each
 * key on one of them; failed over while backpressured. */
Test(unaligned, two_input_operator_failover, .timeout = 300) {
  char *state = sl_test_temp_dir("ua"), *out = sl_test_temp_dir("ua");
  uint64_t records = RECORDS;
  char faults[200];
  snprintf(faults, sizeof faults, SLOW ";complete:op=count,instance=1,nth=1");
  spec s = {.records = records, .keys = 31, .parallelism = 2,
            .two_inputs = true, .unaligned = true,
            .interval_ms = 20, .faults = faults, .restart = fixed(3),
            .state_dir = state, .out_dir = out};
  result r = run_job(&s);
  expect_exactly_once(&r, records, "two inputs");
  cr_expect_eq(r.restarts, 1, "%" PRIu32 " restarts", r.restarts);
  cr_expect_geq(r.unaligned_completed, 1, "no unaligned checkpoint");
  sl_test_remove_tree(state);
  sl_test_remove_tree(out);
}

/* Two checkpoints in flight at once, so an instance captures two ids at
 * a time (snapshot.c note 12: one capture per id, entries appended to
 * both); checkpoints every 2 ms. */
Test(unaligned, max_concurrent_2, .timeout = 300) {
  char *state = sl_test_temp_dir("ua"), *out = sl_test_temp_dir("ua");
  uint64_t records = RECORDS;
  char faults[200];
  snprintf(faults, sizeof faults, SLOW ";complete:op=count,instance=0,nth=2");
  spec s = {.records = records, .keys = 31, .parallelism = 2,
            .unaligned = true, .interval_ms = 2,
            .max_concurrent = 2, .tolerable = 1000, .faults = faults,
            .restart = fixed(3), .state_dir = state, .out_dir = out};
  result r = run_job(&s);
  expect_exactly_once(&r, records, "max_concurrent 2");
  cr_expect_geq(r.unaligned_completed, 1, "no unaligned checkpoint");
  sl_test_remove_tree(state);
  sl_test_remove_tree(out);
}

/* Checkpoints abort while the instances capture channel state: the
 * captures are dropped (snapshot.c note 12, counted by
 * sl_job_captures_aborted) and the output stays exact; checkpoints that
 * complete hold their state.  One such abort is certain, whatever the
 * timing: source instance 1 opens only once a capture was aborted, so
 * until then "count" captures every checkpoint with its channel from
 * that source still open, and none can complete; the first snapshot of
 * "files" fails (a snapshot fault), and it comes after "count" began the
 * capture of its checkpoint (count forwards the barrier once capturing),
 * so that abort drops a capture.  The gate keeps source 0 from ending
 * meanwhile.  Then checkpoints every 2 ms time out after 5 ms behind a
 * slow sink, aborting more captures as the timing has it. */
Test(unaligned, aborts_while_capturing, .timeout = 300) {
  char *state = sl_test_temp_dir("ua"), *out = sl_test_temp_dir("ua");
  uint64_t records = RECORDS;
  spec s = {.records = records, .keys = 31, .parallelism = 2,
            .gate = records / 8, .hold_until_capture_aborted = true,
            .unaligned = true, .interval_ms = 2, .timeout_ms = 5,
            .max_concurrent = 4, .tolerable = 1000000,
            .faults = "slow:op=verify,delay_us=50,from=500,records=100000000;"
                      "snapshot:op=files,nth=1",
            .state_dir = state, .out_dir = out};
  result r = run_job(&s);
  expect_exactly_once(&r, records, "aborts");
  cr_expect_geq(r.captures_aborted, 1, "no capture was aborted");
  cr_expect_eq(r.captures_aborted_metric, (double)r.captures_aborted,
               "GET /metrics shows %g captures aborted, the getter %" PRIu64,
               r.captures_aborted_metric, r.captures_aborted);
  cr_log_info("%" PRIu64 " captures aborted (GET /metrics: %g), %" PRIu64
              " checkpoints completed", r.captures_aborted,
              r.captures_aborted_metric, r.completed);
  sl_test_remove_tree(state);
  sl_test_remove_tree(out);
}

/* The input ends while checkpoints capture: END finishes a capture (it is
 * not logged) and the final checkpoint follows every capture's ack.  Many
 * short runs with checkpoints every millisecond. */
Test(unaligned, end_of_input_while_capturing, .timeout = 300) {
  for (int round = 0; round < 8; round++) {
    char *state = sl_test_temp_dir("ua"), *out = sl_test_temp_dir("ua");
    uint64_t records = 3000 + 977 * (uint64_t)round;
    spec s = {.records = records, .keys = 7, .parallelism = 2,
              .unaligned = true, .interval_ms = 1, .max_concurrent = 2,
              .tolerable = 1000000,
              .faults = "slow:op=verify,delay_us=10,from=100,records=1000000",
              .state_dir = state, .out_dir = out};
    result r = run_job(&s);
    expect_exactly_once(&r, records, "end of input");
    sl_test_remove_tree(state);
    sl_test_remove_tree(out);
  }
}

/* The aligned-checkpoint timeout: with 1 ms, alignments behind the slow
 * sink outlast it and switch (a checkpoint is unaligned only where some
 * instance aligned for at least the timeout); with a timeout no alignment
 * reaches, every checkpoint stays aligned. */
Test(unaligned, aligned_timeout_switches, .timeout = 300) {
  uint64_t records = RECORDS;
  for (int round = 0; round < 2; round++) {
    char *state = sl_test_temp_dir("ua"), *out = sl_test_temp_dir("ua");
    spec s = {.records = records, .keys = 31, .parallelism = 2,
              .unaligned = true,
              .aligned_timeout_ms = round == 0 ? 1 : 3600000,
              .interval_ms = 20,
              .faults = SLOW,
              .state_dir = state, .out_dir = out};
    result r = run_job(&s);
    expect_exactly_once(&r, records, "aligned timeout");
    cr_expect_eq(r.unaligned_before_timeout, 0, "%" PRIu64 " checkpoints "
                 "unaligned before any alignment reached the timeout",
                 r.unaligned_before_timeout);
    if (round == 0)
      cr_expect_geq(r.unaligned_completed, 1, "no alignment switched: %"
                    PRIu64 " completed", r.completed);
    else
      cr_expect_eq(r.unaligned_completed, 0, "%" PRIu64 " unaligned with "
                   "an hour's timeout", r.unaligned_completed);
    sl_test_remove_tree(state);
    sl_test_remove_tree(out);
  }
}

/* ------------------------------------------------------------ stores */

/* The statistics of checkpoint id, polled until it settles (bounded by
 * the job's checkpoint timeout). */
static sl_checkpoint_stats settled_stats(sl_job *job, uint64_t id) {
  for (;;) {
    sl_checkpoint_stats cs = {0};
    bool found = false;
    for (int k = 0; !found && sl_job_checkpoint_stats(job, k, &cs) == 0; k++)
      found = cs.id == id;
    if (found && cs.status != SL_CHECKPOINT_IN_PROGRESS)
      return cs;
    sl_test_sleep_us(1000);
  }
}

/* What backpressured_store does once a checkpoint with channel state
 * completed (each NULL: not done). */
typedef struct store_then {
  const char *template_dir;  /* sl_job_savepoint at the start */
  const char *savepoint_dir; /* sl_job_savepoint while it runs */
  uint64_t savepoint_id;     /* out: its checkpoint */
  const char *refused_dir;   /* sl_job_savepoint once it stopped */
} store_then;

/* A state directory whose newest checkpoint is unaligned with channel
 * state: the job runs behind a slow sink with no periodic checkpoint;
 * checkpoints are triggered one at a time until one completes holding
 * channel state.  Then (then not NULL) a savepoint is taken while the
 * job still runs, behind the same full rings; the job is stopped; and a
 * savepoint of the stopped job is tried. */
static void backpressured_store(const char *state, const char *out,
                                store_then *then) {
  uint64_t records = 400000; /* far more than the sink gets through */
  spec s = {.records = records, .keys = 31, .parallelism = 2,
            .unaligned = true, .interval_ms = 3600000,
            .faults = "slow:op=verify,delay_us=50,from=200,records=100000000",
            .state_dir = state, .out_dir = out};
  sl_op *verify;
  sl_job *job = build_job(&s, &verify);
  cr_assert_eq(sl_job_start(job), 0);
  char err[512];
  if (then && then->template_dir) {
    uint64_t id;
    cr_assert_eq(sl_job_savepoint(job, then->template_dir, &id, err,
                                  sizeof err), 0, "%s", err);
  }
  bool held = false;
  /* Bounded: each try waits for its checkpoint to settle. */
  for (int attempt = 0; attempt < 50 && !held; attempt++) {
    uint64_t id = 0;
    int rc = sl_job_trigger_checkpoint(job, &id);
    cr_assert(rc == 0 || rc == EBUSY, "trigger: %d", rc);
    if (rc)
      continue;
    sl_checkpoint_stats cs = settled_stats(job, id);
    held = cs.status == SL_CHECKPOINT_COMPLETED && cs.channel_bytes > 0;
  }
  cr_assert(held, "no checkpoint held channel state");
  if (then && then->savepoint_dir) {
    /* The savepoint takes an aligned checkpoint of its own (savepoint.c
     * note 6), behind the rings the slow sink keeps full. */
    cr_assert_eq(sl_job_savepoint(job, then->savepoint_dir,
                                  &then->savepoint_id, err, sizeof err),
                 0, "%s", err);
    sl_checkpoint_stats cs = settled_stats(job, then->savepoint_id);
    cr_expect_eq(cs.status, SL_CHECKPOINT_COMPLETED);
    cr_expect_eq(cs.unaligned, 0, "the savepoint's checkpoint %" PRIu64
                 " was unaligned", then->savepoint_id);
    cr_expect_eq(cs.channel_bytes, 0);
  }
  sl_job_stop(job);
  (void)sl_job_wait(job);
  if (then && then->refused_dir) {
    /* Stopped, its newest checkpoint unaligned: no aligned one can be
     * taken, so the savepoint is refused and leaves nothing. */
    uint64_t id = 7;
    int rc = sl_job_savepoint(job, then->refused_dir, &id, err, sizeof err);
    cr_expect_eq(rc, SL_ECHECKPOINT, "savepoint of the stopped job: %d (%s)",
                 rc, err);
    cr_expect(strstr(err, "unaligned") != 0, "'%s'", err);
    cr_expect_eq(id, 0);
    cr_expect_eq(access(then->refused_dir, F_OK), -1,
                 "the refused savepoint left %s", then->refused_dir);
  }
  sl_job_destroy(job);
}

/* The record of the newest checkpoint in dir (a state directory, or a
 * savepoint: no lock file made) and the channel bytes of its blobs. */
static sl_inspect_checkpoint newest_record(const char *dir, unsigned flags,
                                           uint64_t *blob_channel_bytes) {
  sl_state_dir *sd;
  char err[512];
  cr_assert_eq(sl_state_dir_open(dir, flags, &sd, err, sizeof err), 0, "%s",
               err);
  const sl_state_dir_info *info = sl_state_dir_info_get(sd);
  sl_inspect_checkpoint rec;
  cr_assert_eq(sl_state_dir_checkpoint(sd, info->latest, &rec, err,
                                       sizeof err), 0, "%s", err);
  *blob_channel_bytes = 0;
  for (int i = 0; i < info->blob_count; i++)
    *blob_channel_bytes += info->blobs[i].channel_bytes;
  sl_state_dir_close(sd);
  return rec;
}

/* Damage the channel section of the first blob that has one: set its
 * first channel index to `index`, or (index < 0) its first entry's kind
 * to END, which channel state never holds; the blob keeps a valid
 * checksum (rewritten through the store), so only the engine's checks
 * can catch it. */
static void damage_channel_state(const char *state, int64_t index) {
  sl_store_info info;
  char err[512];
  cr_assert_eq(sl_store_inspect(state, &info, err, sizeof err), 0, "%s", err);
  sl_store_options options = {.graph_fingerprint = info.graph, .no_sync = 1};
  sl_store *st;
  cr_assert_eq(sl_store_open(state, &options, &st, err, sizeof err), 0,
               "%s", err);
  bool damaged = false;
  for (uint16_t op = 0; op < 8 && !damaged; op++)
    for (uint16_t k = 0; k < 4 && !damaged; k++) {
      uint8_t *blob = 0;
      uint32_t bytes = 0;
      if (sl_store_get_blob(st, op, k, (void **)&blob, &bytes) != 0)
        continue;
      if (bytes > 9 + 16 + 8 && (blob[0] & 8u)) { /* SL_BLOB_CHANNELS */
        if (index >= 0) {
          uint32_t v = (uint32_t)index;
          memcpy(blob + 9, &v, 4);
        } else {
          blob[9 + 16] = 3; /* SL_ENTRY_END */
        }
        sl_store_txn *txn;
        cr_assert_eq(sl_store_begin(st, &txn), 0);
        cr_assert_eq(sl_store_put_blob(txn, op, k, blob, bytes), 0);
        cr_assert_eq(sl_store_commit_graph(txn, info.graph), 0);
        damaged = true;
      }
      free(blob);
    }
  sl_store_close(st);
  free(info.graph);
  cr_assert(damaged, "no blob with channel state");
}

/* Resuming from a checkpoint whose channel state is damaged (with a
 * valid checksum) fails with SL_ECORRUPT naming the channel state, never
 * a crash. */
Test(unaligned, damaged_channel_state_is_corrupt, .timeout = 300) {
  for (int variant = 0; variant < 2; variant++) {
    char *state = sl_test_temp_dir("ua"), *out = sl_test_temp_dir("ua");
    backpressured_store(state, out, 0);
    damage_channel_state(state, variant == 0 ? 200 : -1);
    spec s = {.records = 1000, .keys = 31, .parallelism = 2,
              .unaligned = true, .interval_ms = 10,
              .policy = SL_STORE_RESUME, .state_dir = state, .out_dir = out};
    sl_op *verify;
    sl_job *job = build_job(&s, &verify);
    int rc = sl_job_start(job);
    if (rc == 0)
      rc = sl_job_wait(job);
    cr_expect_eq(rc, SL_ECORRUPT, "variant %d: %d (%s)", variant, rc,
                 sl_job_error(job));
    cr_expect(strstr(sl_job_error(job), "channel state") != 0,
              "variant %d: '%s'", variant, sl_job_error(job));
    sl_job_destroy(job);
    sl_test_remove_tree(state);
    sl_test_remove_tree(out);
  }
}

/* Savepoints stay aligned (savepoint.c note 6).  In an unaligned job
 * under backpressure whose newest checkpoint holds channel state, a
 * savepoint takes an aligned checkpoint and holds no channel state; a
 * job started from it with "count" rescaled 2 -> 3 writes exactly the
 * output of an uninterrupted run. */
Test(unaligned, savepoint_under_backpressure_is_aligned_and_rescales,
     .timeout = 300) {
  char *state = sl_test_temp_dir("ua"), *out = sl_test_temp_dir("ua");
  char *sp = sl_test_temp_dir("ua");
  char *sp_dir = sl_test_path_in(sp, "savepoint"); /* missing */
  char *state2 = sl_test_temp_dir("ua");
  store_then then = {.savepoint_dir = sp_dir};
  backpressured_store(state, out, &then);
  uint64_t blob_bytes = 0;
  sl_inspect_checkpoint rec =
      newest_record(sp_dir, SL_STATE_DIR_NO_LOCK_FILE, &blob_bytes);
  cr_expect_eq(rec.id, then.savepoint_id);
  cr_expect(!rec.unaligned && rec.record_version == 2, "the savepoint's "
            "record: version %" PRIu32 ", unaligned %d", rec.record_version,
            rec.unaligned);
  cr_expect_eq(blob_bytes, 0, "the savepoint's blobs hold %" PRIu64
               " bytes of channel state", blob_bytes);
  spec s = {.records = 400000, .keys = 31, .parallelism = 2,
            .count_parallelism = 3, .unaligned = true, .interval_ms = 10,
            .from_savepoint = sp_dir, .state_dir = state2, .out_dir = out};
  result r = run_job(&s);
  expect_sink_exactly_once(&r, "rescaled from the savepoint");
  expect_files_exactly(out, s.records, s.keys);
  sl_test_remove_tree(state);
  sl_test_remove_tree(out);
  sl_test_remove_tree(sp);
  sl_test_remove_tree(state2);
  free(sp_dir);
}

/* A savepoint holding an unaligned checkpoint with channel state, as
 * builds before savepoints stayed aligned took them, made in root: the
 * store of a backpressured_store copied (sl_store_copy) under the
 * manifest of an aligned savepoint of the same job, its checkpoint_id
 * replaced.  Returns its path (malloc'd). */
static char *unaligned_savepoint(const char *root, const char *state,
                                 const char *out) {
  char *template = sl_test_path_in(root, "template");
  char *sp = sl_test_path_in(root, "unaligned");
  char *refused = sl_test_path_in(root, "refused"); /* missing */
  store_then then = {.template_dir = template, .refused_dir = refused};
  backpressured_store(state, out, &then);
  sl_store_info info;
  char err[512];
  cr_assert_eq(sl_store_inspect(state, &info, err, sizeof err), 0, "%s", err);
  sl_store_options options = {.graph_fingerprint = info.graph, .no_sync = 1};
  sl_store *st;
  cr_assert_eq(sl_store_open(state, &options, &st, err, sizeof err), 0,
               "%s", err);
  cr_assert_eq(mkdir(sp, 0755), 0, "%s: %s", sp, strerror(errno));
  uint64_t id = 0, bytes = 0;
  cr_assert_eq(sl_store_copy(st, sp, &id, &bytes, err, sizeof err), 0, "%s",
               err);
  sl_store_close(st);
  free(info.graph);
  char *path = sl_test_path_in(template, "manifest.json");
  char *manifest = sl_test_read_file(path, NULL);
  cr_assert(manifest, "no %s", path);
  const char *field = "\"checkpoint_id\": ";
  char *at = strstr(manifest, field);
  cr_assert(at, "no checkpoint_id in %s", path);
  at += strlen(field);
  char *rest = at + strspn(at, "0123456789");
  char *text = malloc(strlen(manifest) + 32);
  cr_assert(text);
  snprintf(text, strlen(manifest) + 32, "%.*s%" PRIu64 "%s",
           (int)(at - manifest), manifest, id, rest);
  free(path);
  path = sl_test_path_in(sp, "manifest.json");
  FILE *f = fopen(path, "w");
  cr_assert(f, "%s: %s", path, strerror(errno));
  cr_assert_eq(fputs(text, f) >= 0 && fclose(f) == 0, true);
  free(path), free(text), free(manifest), free(template), free(refused);
  /* It holds channel state (`sluice checkpoints` reads it so). */
  uint64_t blob_bytes = 0;
  sl_inspect_checkpoint rec =
      newest_record(sp, SL_STATE_DIR_NO_LOCK_FILE, &blob_bytes);
  cr_assert(rec.unaligned && rec.channel_bytes > 0 &&
            rec.record_version == 3, "record version %" PRIu32
            ", unaligned %d, %" PRIu64 " channel bytes", rec.record_version,
            rec.unaligned, rec.channel_bytes);
  cr_expect_eq(blob_bytes, rec.channel_bytes,
               "the blobs' channel state against the record's");
  return sp;
}

/* A savepoint of an unaligned checkpoint with channel state (as builds
 * before savepoints stayed aligned wrote them; made here by copying the
 * store under an aligned savepoint's manifest): rescaling from it is
 * refused, saying why; at the parallelism it was taken with, the job
 * resumes from it.  A savepoint of the stopped job, whose newest
 * checkpoint is that unaligned one, is refused (backpressured_store). */
Test(unaligned, rescaling_channel_state_is_refused, .timeout = 300) {
  char *state = sl_test_temp_dir("ua"), *out = sl_test_temp_dir("ua");
  char *state2 = sl_test_temp_dir("ua"), *state3 = sl_test_temp_dir("ua");
  char *root = sl_test_temp_dir("ua");
  char *sp = unaligned_savepoint(root, state, out);
  spec s = {.records = 400000, .keys = 31, .parallelism = 2,
            .count_parallelism = 3, .unaligned = true, .interval_ms = 10,
            .from_savepoint = sp, .state_dir = state2, .out_dir = out};
  sl_op *verify;
  sl_job *job = build_job(&s, &verify);
  int rc = sl_job_start(job);
  if (rc == 0)
    rc = sl_job_wait(job);
  cr_expect_neq(rc, 0, "rescaled from channel state");
  cr_expect(strstr(sl_job_error(job), "channel state") != 0, "'%s'",
            sl_job_error(job));
  sl_job_destroy(job);
  s.count_parallelism = 0;
  s.state_dir = state3;
  result r = run_job(&s);
  expect_exactly_once(&r, s.records, "from the savepoint");
  sl_test_remove_tree(state);
  sl_test_remove_tree(out);
  sl_test_remove_tree(root);
  sl_test_remove_tree(state2);
  sl_test_remove_tree(state3);
  free(sp);
}

/* The settings are checked where they enter (sl_job_create). */
Test(unaligned, settings_are_checked) {
  sl_job_config c = sl_fixture_config("/tmp/unused", 10);
  sl_job *job = 0;
  c.checkpoint_unaligned = 1;
  c.checkpoint.mode = SL_AT_LEAST_ONCE;
  cr_expect_eq(sl_job_create(&c, &job), EINVAL, "with at-least-once");
  c.checkpoint.mode = SL_EXACTLY_ONCE;
  c.checkpoint_unaligned = 2;
  cr_expect_eq(sl_job_create(&c, &job), EINVAL, "unaligned 2");
  c.checkpoint_unaligned = 0;
  c.checkpoint_aligned_timeout_ms = 5;
  cr_expect_eq(sl_job_create(&c, &job), EINVAL, "a timeout without it");
  c.checkpoint_unaligned = 1;
  cr_assert_eq(sl_job_create(&c, &job), 0, "unaligned with a timeout");
  sl_job_destroy(job);
}

/* A stop with a savepoint in unaligned mode: its checkpoint is aligned
 * (no channel state), taken behind a slow sink while earlier checkpoints
 * were unaligned. */
Test(unaligned, stop_with_savepoint_stays_aligned, .timeout = 300) {
  char *state = sl_test_temp_dir("ua"), *out = sl_test_temp_dir("ua");
  char *sp = sl_test_temp_dir("ua");
  spec s = {.records = 400000, .keys = 31, .parallelism = 2,
            .unaligned = true, .interval_ms = 5,
            .faults = "slow:op=verify,delay_us=20,from=200,records=100000000",
            .state_dir = state, .out_dir = out};
  sl_op *verify;
  sl_job *job = build_job(&s, &verify);
  cr_assert_eq(sl_job_start(job), 0);
  /* Polls until an unaligned checkpoint completed (bounded by the
   * watchdog of the test's timeout). */
  for (bool seen = false; !seen;) {
    sl_checkpoint_stats cs;
    for (int k = 0; !seen && sl_job_checkpoint_stats(job, k, &cs) == 0; k++)
      seen = cs.status == SL_CHECKPOINT_COMPLETED && cs.unaligned;
    if (!seen)
      sl_test_sleep_us(1000);
  }
  char err[512];
  uint64_t id = 0;
  int stop_rc = sl_job_stop_with_savepoint(job, sp, 0, &id, err, sizeof err);
  if (stop_rc) { /* what happened to the checkpoints, for the report */
    sl_checkpoint_stats h;
    for (int k = 0; sl_job_checkpoint_stats(job, k, &h) == 0 && k < 8; k++)
      fprintf(stderr, "checkpoint %" PRIu64 ": status %d unaligned %d "
              "cause '%s'\n", h.id, h.status, h.unaligned, h.cause);
  }
  cr_assert_eq(stop_rc, 0, "%s", err);
  cr_assert_eq(sl_job_wait(job), 0, "%s", sl_job_error(job));
  bool found = false;
  sl_checkpoint_stats cs;
  for (int k = 0; !found && sl_job_checkpoint_stats(job, k, &cs) == 0; k++)
    found = cs.id == id;
  cr_assert(found, "checkpoint %" PRIu64 " not in the history", id);
  cr_expect_eq(cs.status, SL_CHECKPOINT_COMPLETED);
  cr_expect_eq(cs.unaligned, 0, "the stop checkpoint %" PRIu64
               " was unaligned", id);
  cr_expect_eq(cs.channel_bytes, 0);
  sl_job_destroy(job);
  sl_test_remove_tree(state);
  sl_test_remove_tree(out);
  sl_test_remove_tree(sp);
}
