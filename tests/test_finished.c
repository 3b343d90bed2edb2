/* test_finished.c — finished instances (engine/coordinator.c note 10).
 *
 * An operator that emits a total in finish(), and processing-time timers
 * that on_timer re-arms while the end of input fires them, commit their
 * output exactly once however the final checkpoint is restored: after a
 * SIGKILL between its LMDB commit and the sinks' renames, by a resume of
 * the finished job, by a start from a savepoint of it, and by a failover
 * restart after it.  And checkpoints go on after a source finished: a
 * finite side source beside a gated one does not stop exactly-once sinks
 * from committing, and a kill after such a checkpoint replays only from
 * it.
 *
 * The jobs: real threads, LMDB stores, exactly-once file sinks, and child
 * processes killed by the crash-point machinery.  Checkpoints are driven
 * by sl_job_trigger_checkpoint and conditions, never by the clock. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h" /* sl_instance_fail: a failure after the final
                         checkpoint, as the file sink's failed commit */
#include "sluice_testing.h" /* unstable test helpers */
#include "test_dirs.h"
#include "test_util.h"

/* Interval that never elapses in a test: only triggers and the final
 * checkpoint commit. */
#define NEVER_MS 600000u

/* What the operators emit, and the sink writes as one line. */
enum { OUT_RECORD = 0, OUT_TOTAL = 1, OUT_FIRED = 2, OUT_SIDE = 3 };
typedef struct out_rec {
  uint64_t kind, value;
} out_rec;

static int format_out(void *user, const sl_record *in, char *buffer,
                      uint32_t buffer_bytes) {
  (void)user;
  static const char *names[] = {"record", "total", "fired", "side"};
  out_rec r;
  memcpy(&r, in->data, sizeof r);
  cr_assert(r.kind <= OUT_SIDE);
  char line[64]; /* snprintf needs room for its NUL, the sink does not */
  int n = snprintf(line, sizeof line, "%s %" PRIu64, names[r.kind], r.value);
  if (n > 0 && (uint32_t)n <= buffer_bytes)
    memcpy(buffer, line, (size_t)n);
  return n;
}

/* ------------------------------------------------------------ checking */

/* The committed lines of an output directory, counted. */
typedef struct committed {
  uint32_t *records; /* per value, OUT_RECORD lines */
  uint32_t *side;    /* per value, OUT_SIDE lines */
  uint32_t *fired;   /* per key, OUT_FIRED lines */
  uint64_t count, side_count, keys;
  uint64_t totals, total_value;
  uint64_t stray;   /* lines naming a value out of range */
  uint64_t parts;   /* committed part files */
  uint64_t pending; /* uncommitted (.part-*) files */
} committed;

static void count_line(committed *c, const char *line) {
  char kind[16];
  unsigned long long v;
  if (sscanf(line, "%15s %llu", kind, &v) != 2) {
    c->stray++;
    return;
  }
  if (!strcmp(kind, "record") && v < c->count)
    c->records[v]++;
  else if (!strcmp(kind, "side") && v < c->side_count)
    c->side[v]++;
  else if (!strcmp(kind, "fired") && v < c->keys)
    c->fired[v]++;
  else if (!strcmp(kind, "total")) {
    c->totals++;
    c->total_value = v;
  } else
    c->stray++;
}

static committed read_committed(const char *dir, uint64_t count,
                                uint64_t side_count, uint64_t keys) {
  committed c = {.count = count, .side_count = side_count, .keys = keys};
  c.records = calloc(count + 1, sizeof *c.records);
  c.side = calloc(side_count + 1, sizeof *c.side);
  c.fired = calloc(keys + 1, sizeof *c.fired);
  cr_assert(c.records && c.side && c.fired);
  DIR *d = opendir(dir);
  cr_assert(d, "%s: %s", dir, strerror(errno));
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strncmp(e->d_name, ".part-", 6)) {
      c.pending++;
      continue;
    }
    if (strncmp(e->d_name, "part-", 5))
      continue;
    c.parts++;
    char *path = sl_test_path_in(dir, e->d_name);
    char *text = sl_test_slurp(path);
    for (char *line = strtok(text, "\n"); line; line = strtok(0, "\n"))
      count_line(&c, line);
    free(text);
    free(path);
  }
  closedir(d);
  return c;
}

static void committed_free(committed *c) {
  free(c->records);
  free(c->side);
  free(c->fired);
}

/* Every record, side record and (with timers) fired key exactly once, one
 * total of the value *total (NULL: none), nothing else, nothing
 * pending. */
static void expect_exactly_once(const char *dir, uint64_t count,
                                uint64_t side_count, uint64_t keys,
                                bool timers, const uint64_t *total,
                                const char *what) {
  committed c = read_committed(dir, count, side_count, keys);
  uint64_t wrong = 0, first = UINT64_MAX;
  for (uint64_t v = 0; v < count; v++)
    if (c.records[v] != 1 && wrong++ == 0)
      first = v;
  cr_expect_eq(wrong, 0, "%s: %" PRIu64 " records not committed exactly "
               "once (first: %" PRIu64 ", %u times)", what, wrong, first,
               first < count ? c.records[first] : 0);
  wrong = 0;
  for (uint64_t v = 0; v < side_count; v++)
    wrong += c.side[v] != 1;
  cr_expect_eq(wrong, 0, "%s: %" PRIu64 " side records not committed "
               "exactly once", what, wrong);
  wrong = 0;
  for (uint64_t k = 0; timers && k < keys; k++)
    wrong += c.fired[k] != 1;
  cr_expect_eq(wrong, 0, "%s: %" PRIu64 " of %" PRIu64 " keys' timers did "
               "not fire exactly once (key 0: %u times)", what, wrong, keys,
               c.fired[0]);
  cr_expect_eq(c.totals, total ? 1u : 0u, "%s: the total of finish() is "
               "committed %" PRIu64 " times", what, c.totals);
  if (total)
    cr_expect_eq(c.total_value, *total, "%s: total %" PRIu64 ", expected %"
                 PRIu64, what, c.total_value, *total);
  cr_expect_eq(c.stray, 0, "%s: %" PRIu64 " stray lines", what, c.stray);
  cr_expect_eq(c.pending, 0, "%s: %" PRIu64 " parts left pending", what,
               c.pending);
  committed_free(&c);
}

/* ------------------------------------------------------------ the job */

/* "agg", after key_by: forwards each record, keeps the sum as operator
 * state and emits it in finish(); with timers, each key arms a
 * processing-time timer an hour ahead (so only the end of input fires
 * it: timer.c note 5), whose on_timer emits the key and re-arms it. */
typedef struct agg_config {
  bool timers;
  bool fail_after_final; /* once, in checkpoint_complete of the final */
} agg_config;

static atomic_int agg_failed; /* fail_after_final fired (per process) */

typedef struct agg_state {
  const agg_config *config;
  uint64_t sum;
} agg_state;

#define HOUR_MS 3600000

static int agg_open(sl_ctx *ctx, void *user, void **state) {
  (void)ctx;
  agg_state *a = calloc(1, sizeof *a);
  cr_assert(a);
  a->config = user;
  *state = a;
  return 0;
}

static int agg_process(sl_ctx *ctx, void *state, int input,
                       const sl_record *in) {
  (void)input;
  agg_state *a = state;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  a->sum += t.value;
  out_rec r = {OUT_RECORD, t.value};
  int rc = sl_emit(ctx, &r, sizeof r);
  if (rc || !a->config->timers)
    return rc;
  const void *armed;
  uint32_t bytes;
  if (sl_state_get(ctx, 0, &armed, &bytes) == 0)
    return 0;
  uint8_t one = 1;
  rc = sl_state_put(ctx, 0, &one, 1, 0);
  return rc ? rc
            : sl_timer_register(ctx, SL_PROCESSING_TIME,
                                sl_ctx_processing_time(ctx) + HOUR_MS);
}

static int agg_on_timer(sl_ctx *ctx, void *state, int domain, int64_t time) {
  (void)state;
  cr_assert_eq(domain, SL_PROCESSING_TIME);
  uint64_t key;
  int rc = sl_ctx_key(ctx, &key);
  out_rec r = {OUT_FIRED, key};
  if (rc == 0)
    rc = sl_emit(ctx, &r, sizeof r);
  /* Re-armed while the end of input fires: stays pending for ever. */
  return rc ? rc : sl_timer_register(ctx, SL_PROCESSING_TIME, time + HOUR_MS);
}

static int agg_finish(sl_ctx *ctx, void *state) {
  agg_state *a = state;
  out_rec r = {OUT_TOTAL, a->sum};
  return sl_emit(ctx, &r, sizeof r);
}

static int agg_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  return sl_fixture_save_position(ctx, &((agg_state *)state)->sum);
}

static int agg_restore(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  /* absent: nothing to restore; present: readable and 8 bytes */
  cr_assert_eq(sl_fixture_load_position(ctx, &((agg_state *)state)->sum), 0,
               "%s: operator state unreadable or not 8 bytes",
               sl_ctx_name(ctx));
  return 0;
}

static void agg_complete(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  agg_state *a = state;
  if (!a->config->fail_after_final || !atomic_load(&ctx->job->cp_final_done))
    return;
  int expected = 0;
  if (atomic_compare_exchange_strong(&agg_failed, &expected, 1)) {
    sl_ctx_fail(ctx, "failing once after the final checkpoint");
    sl_instance_fail(ctx, SL_EINJECTED);
  }
}

static void agg_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  free(state);
}

static const sl_process_ops agg_ops = {.open = agg_open,
                                       .process = agg_process,
                                       .finish = agg_finish,
                                       .close = agg_close,
                                       .snapshot = agg_snapshot,
                                       .checkpoint_complete = agg_complete,
                                       .restore = agg_restore,
                                       .on_timer = agg_on_timer};

typedef struct run_spec {
  const char *state_dir, *out_dir, *from_savepoint, *faults;
  uint64_t count, keys;
  int policy;
  bool restart;
  agg_config agg;
} run_spec;

/* keyed source -> key_by -> agg -> exactly-once file sink. */
static sl_job *build(const run_spec *s) {
  sl_job_config c = SL_JOB_CONFIG_INIT;
  c.checkpoint.state_dir = s->state_dir;
  c.checkpoint.interval_ms = NEVER_MS;
  c.checkpoint.store_policy = s->policy;
  c.checkpoint.from_savepoint = s->from_savepoint;
  c.faults = s->faults;
  if (s->restart) {
    c.restart = sl_restart_defaults(SL_RESTART_FIXED_DELAY);
    c.restart.delay_ms = 0;
  }
  sl_job *job;
  cr_assert_eq(sl_job_create(&c, &job), 0);
  sl_op *src, *keyed, *agg, *sink;
  cr_assert_eq(sl_source_keyed(job, "src", 1, s->count, s->keys, &src), 0);
  cr_assert_eq(
      sl_op_key_by(job, "by_key", src, sl_fixture_tuple_key, 0, &keyed), 0);
  cr_assert_eq(sl_op_process(job, "agg", &keyed, 1, 1, &agg_ops,
                             (void *)&s->agg, &agg), 0);
  sl_file_sink_config fc = {.dir = s->out_dir, .exactly_once = 1,
                            .format = format_out};
  cr_assert_eq(sl_sink_file(job, "sink", agg, 1, &fc, &sink), 0);
  return job;
}

/* Run s to its end in this process; returns the job's status and, in
 * *restored_from, the checkpoint it started from. */
static int run(const run_spec *s, uint64_t *restored_from) {
  sl_job *job = build(s);
  int rc = sl_job_run(job);
  cr_expect_eq(rc, 0, "the job failed: %s", sl_job_error(job));
  sl_job_last_checkpoint(job, restored_from);
  sl_job_destroy(job);
  return rc;
}

/* Run s in a child process; returns its wait status. */
static int run_in_child(const run_spec *s) {
  fflush(0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    sl_job *job = build(s);
    int rc = sl_job_run(job);
    _exit(rc == 0 ? 0 : 3);
  }
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  return status;
}

/* ------------------------------------------------------------ part 1 */

/* (a) SIGKILL between the final checkpoint's LMDB commit and the sinks'
 * renames (the only checkpoint: nth=1), then a resume: the sink's restore
 * commits the final parts, and nothing runs finish() again. */
Test(finished, crash_after_final_commit_then_resume, .timeout = 120) {
  char *state = sl_test_temp_dir("fin"), *out = sl_test_temp_dir("fin");
  run_spec s = {.state_dir = state, .out_dir = out,
                .count = sl_test_scaled(20000, 2000), .keys = 37,
                .policy = SL_STORE_RESUME, .agg = {.timers = true},
                .faults = "crash:point=after-commit,nth=1"};
  uint64_t sum = s.count * (s.count - 1) / 2;
  int status = run_in_child(&s);
  cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
            "the child was not killed at after-commit (status %d)", status);
  committed before = read_committed(out, s.count, 0, s.keys);
  cr_expect_eq(before.totals, 0, "the kill came after the renames");
  committed_free(&before);
  s.faults = 0;
  uint64_t from = 0;
  run(&s, &from);
  cr_expect_eq(from, 1, "resumed from checkpoint %" PRIu64, from);
  expect_exactly_once(out, s.count, 0, s.keys, true, &sum,
                      "resume after a kill at after-commit of the final");
  sl_test_remove_tree(state);
  sl_test_remove_tree(out);
}

/* (b) A finished job resumed (twice) adds nothing: not a line, not a
 * part file. */
Test(finished, resumed_finished_job_adds_nothing, .timeout = 120) {
  char *state = sl_test_temp_dir("fin"), *out = sl_test_temp_dir("fin");
  run_spec s = {.state_dir = state, .out_dir = out,
                .count = sl_test_scaled(20000, 2000), .keys = 37,
                .policy = SL_STORE_RESUME};
  uint64_t sum = s.count * (s.count - 1) / 2;
  uint64_t from = 0;
  run(&s, &from);
  cr_expect_eq(from, 0);
  expect_exactly_once(out, s.count, 0, s.keys, false, &sum, "first run");
  committed first = read_committed(out, s.count, 0, s.keys);
  for (int resume = 1; resume <= 2; resume++) {
    run(&s, &from);
    cr_expect_gt(from, 0, "resume %d restored nothing", resume);
    char what[64];
    snprintf(what, sizeof what, "resume %d of the finished job", resume);
    expect_exactly_once(out, s.count, 0, s.keys, false, &sum, what);
    committed again = read_committed(out, s.count, 0, s.keys);
    cr_expect_eq(again.parts, first.parts, "%s wrote %" PRIu64 " parts more",
                 what, again.parts - first.parts);
    committed_free(&again);
  }
  committed_free(&first);
  sl_test_remove_tree(state);
  sl_test_remove_tree(out);
}

/* (c) A savepoint of the finished job, and a new job started from it. */
Test(finished, start_from_savepoint_of_finished_job, .timeout = 120) {
  char *state = sl_test_temp_dir("fin"), *out = sl_test_temp_dir("fin");
  char *state2 = sl_test_temp_dir("fin"), *points = sl_test_temp_dir("fin");
  char *savepoint = sl_test_path_in(points, "sp");
  run_spec s = {.state_dir = state, .out_dir = out,
                .count = sl_test_scaled(20000, 2000), .keys = 37,
                .agg = {.timers = true}};
  uint64_t sum = s.count * (s.count - 1) / 2;
  sl_job *job = build(&s);
  cr_assert_eq(sl_job_run(job), 0, "%s", sl_job_error(job));
  uint64_t id = 0;
  char err[512];
  cr_assert_eq(sl_job_savepoint(job, savepoint, &id, err, sizeof err), 0,
               "%s", err);
  cr_expect_gt(id, 0);
  sl_job_destroy(job);
  expect_exactly_once(out, s.count, 0, s.keys, true, &sum, "first run");
  s.state_dir = state2;
  s.from_savepoint = savepoint;
  uint64_t from = 0;
  run(&s, &from);
  cr_expect_eq(from, id, "started from checkpoint %" PRIu64 ", the savepoint "
               "holds %" PRIu64, from, id);
  expect_exactly_once(out, s.count, 0, s.keys, true, &sum,
                      "start from a savepoint of the finished job");
  free(savepoint);
  sl_test_remove_tree(points);
  sl_test_remove_tree(state2);
  sl_test_remove_tree(state);
  sl_test_remove_tree(out);
}

/* (d) A failure after the final checkpoint is durable (agg fails in its
 * complete hook, as a sink whose commit fails): the restart restores the
 * final checkpoint and finishes nothing again. */
Test(finished, failover_after_final_checkpoint, .timeout = 120) {
  char *state = sl_test_temp_dir("fin"), *out = sl_test_temp_dir("fin");
  atomic_store(&agg_failed, 0);
  run_spec s = {.state_dir = state, .out_dir = out,
                .count = sl_test_scaled(20000, 2000), .keys = 37,
                .restart = true,
                .agg = {.timers = true, .fail_after_final = true}};
  uint64_t sum = s.count * (s.count - 1) / 2;
  sl_job *job = build(&s);
  cr_expect_eq(sl_job_run(job), 0, "%s", sl_job_error(job));
  cr_expect_eq(atomic_load(&agg_failed), 1, "the failure was not injected");
  cr_expect_eq(sl_job_restarts(job), 1);
  uint64_t from = 0;
  sl_job_last_checkpoint(job, &from);
  cr_expect_eq(from, 1, "the restart restored checkpoint %" PRIu64, from);
  sl_job_destroy(job);
  expect_exactly_once(out, s.count, 0, s.keys, true, &sum,
                      "failover after the final checkpoint");
  sl_test_remove_tree(state);
  sl_test_remove_tree(out);
}

/* Timers re-armed by on_timer while the end of input fires them stay in
 * the final checkpoint; no restore of it fires them. */
Test(finished, rearmed_end_of_input_timers_fire_once, .timeout = 120) {
  char *state = sl_test_temp_dir("fin"), *out = sl_test_temp_dir("fin");
  run_spec s = {.state_dir = state, .out_dir = out,
                .count = sl_test_scaled(5000, 1000), .keys = 101,
                .policy = SL_STORE_RESUME, .agg = {.timers = true}};
  uint64_t sum = s.count * (s.count - 1) / 2;
  uint64_t from = 0;
  run(&s, &from);
  expect_exactly_once(out, s.count, 0, s.keys, true, &sum, "first run");
  run(&s, &from);
  cr_expect_gt(from, 0);
  committed c = read_committed(out, s.count, 0, s.keys);
  uint64_t twice = 0;
  for (uint64_t k = 0; k < s.keys; k++)
    twice += c.fired[k] > 1;
  cr_expect_eq(twice, 0, "%" PRIu64 " of %" PRIu64 " keys' re-armed timers "
               "fired again after the resume", twice, s.keys);
  committed_free(&c);
  expect_exactly_once(out, s.count, 0, s.keys, true, &sum, "resume");
  sl_test_remove_tree(state);
  sl_test_remove_tree(out);
}

/* ------------------------------------------------------------ part 2 */

/* A finite side source beside a gated main source, the side branch with a
 * finish() total of its own:
 *
 *   main (gated) ----------------------------> mix -> exactly-once sink
 *   side (finite) -> side_agg (total in finish) -^
 *
 * The side branch finishes early; checkpoints must go on. */

static atomic_uint_fast64_t main_release; /* records main may emit */
static atomic_uint_fast64_t main_emitted; /* by main in this process */
static atomic_int side_ended;            /* side returned SL_SOURCE_END */

typedef struct seq_source {
  uint64_t count;
  bool gated;
} seq_source;

typedef struct seq_state {
  const seq_source *src;
  uint64_t position;
} seq_state;

static int seq_open(sl_ctx *ctx, void *user, void **state) {
  (void)ctx;
  seq_state *s = calloc(1, sizeof *s);
  cr_assert(s);
  s->src = user;
  *state = s;
  return 0;
}

static int seq_next(sl_ctx *ctx, void *state) {
  seq_state *s = state;
  for (int n = 0; n < 256; n++) {
    if (s->position >= s->src->count) {
      if (!s->src->gated)
        atomic_store(&side_ended, 1);
      return SL_SOURCE_END;
    }
    if (s->src->gated && s->position >= atomic_load(&main_release)) {
      sl_test_sleep_us(200); /* held back until the test releases more */
      return 0;
    }
    sl_tuple t = {.key = s->position, .value = s->position};
    int rc = sl_emit(ctx, &t, sizeof t);
    if (rc)
      return rc;
    s->position++;
    if (s->src->gated)
      atomic_fetch_add(&main_emitted, 1);
  }
  return 0;
}

static int seq_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  return sl_fixture_save_position(ctx, &((seq_state *)state)->position);
}

static int seq_restore(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  /* absent: nothing to restore; present: readable and 8 bytes */
  cr_assert_eq(sl_fixture_load_position(ctx, &((seq_state *)state)->position),
               0, "%s: operator state unreadable or not 8 bytes",
               sl_ctx_name(ctx));
  return 0;
}

static void seq_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  free(state);
}

static const sl_source_ops seq_ops = {.open = seq_open,
                                      .next = seq_next,
                                      .close = seq_close,
                                      .snapshot = seq_snapshot,
                                      .restore = seq_restore};

/* side_agg: forwards side records as OUT_SIDE, emits their sum in
 * finish(); the sum is operator state. */
static int side_agg_process(sl_ctx *ctx, void *state, int input,
                            const sl_record *in) {
  (void)input;
  agg_state *a = state;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  a->sum += t.value;
  out_rec r = {OUT_SIDE, t.value};
  return sl_emit(ctx, &r, sizeof r);
}

static const sl_process_ops side_agg_ops = {.open = agg_open,
                                            .process = side_agg_process,
                                            .finish = agg_finish,
                                            .close = agg_close,
                                            .snapshot = agg_snapshot,
                                            .restore = agg_restore};

/* mix: main records become OUT_RECORD, the side branch's pass as they
 * are. */
static int mix_process(sl_ctx *ctx, void *state, int input,
                       const sl_record *in) {
  (void)state;
  if (input == 1)
    return sl_emit(ctx, in->data, in->size_bytes);
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  out_rec r = {OUT_RECORD, t.value};
  return sl_emit(ctx, &r, sizeof r);
}

static const sl_process_ops mix_ops = {.process = mix_process};

typedef struct side_spec {
  const char *state_dir, *out_dir, *faults;
  uint64_t main_count, side_count;
  int mode;
  uint32_t max_concurrent;
} side_spec;

static sl_job *build_side(const side_spec *s, seq_source sources[2]) {
  sl_job_config c = SL_JOB_CONFIG_INIT;
  c.checkpoint.state_dir = s->state_dir;
  c.checkpoint.interval_ms = NEVER_MS;
  c.checkpoint.store_policy = SL_STORE_RESUME;
  c.checkpoint.mode = s->mode;
  c.checkpoint.max_concurrent = s->max_concurrent;
  c.faults = s->faults;
  sl_job *job;
  cr_assert_eq(sl_job_create(&c, &job), 0);
  sources[0] = (seq_source){.count = s->main_count, .gated = true};
  sources[1] = (seq_source){.count = s->side_count, .gated = false};
  static const agg_config plain = {0};
  sl_op *main_src, *side, *side_agg, *mix, *sink;
  cr_assert_eq(sl_op_source(job, "main", 1, &seq_ops, &sources[0],
                            &main_src), 0);
  cr_assert_eq(sl_op_source(job, "side", 1, &seq_ops, &sources[1], &side),
               0);
  cr_assert_eq(sl_op_process(job, "side_agg", &side, 1, 1, &side_agg_ops,
                             (void *)&plain, &side_agg), 0);
  sl_op *inputs[2] = {main_src, side_agg};
  cr_assert_eq(sl_op_process(job, "mix", inputs, 2, 1, &mix_ops, 0, &mix),
               0);
  sl_file_sink_config fc = {.dir = s->out_dir, .exactly_once = 1,
                            .format = format_out};
  cr_assert_eq(sl_sink_file(job, "sink", mix, 1, &fc, &sink), 0);
  return job;
}

/* Poll cond (no timing is asserted: the bound only turns a hang into a
 * failure). */
static bool eventually(bool (*cond)(void *), void *arg) {
  for (int i = 0; i < 60000; i++) { /* about a minute */
    if (cond(arg))
      return true;
    sl_test_sleep_us(1000);
  }
  return false;
}

static bool side_done_and_main_held(void *arg) {
  return atomic_load(&side_ended) &&
         atomic_load(&main_emitted) >= *(uint64_t *)arg;
}

typedef struct completion {
  sl_job *job;
  uint64_t id;
} completion;

static bool checkpoint_completed(void *arg) {
  completion *c = arg;
  return sl_job_last_checkpoint(c->job, 0) >= c->id;
}

typedef struct output_check {
  const char *dir;
  uint64_t main_count, side_count, main_upto;
} output_check;

/* Every side record and main records 0 .. main_upto-1 are committed. */
static bool output_committed(void *arg) {
  const output_check *o = arg;
  committed c = read_committed(o->dir, o->main_count, o->side_count, 1);
  bool all = true;
  for (uint64_t v = 0; v < o->side_count && all; v++)
    all = c.side[v] == 1;
  for (uint64_t v = 0; v < o->main_upto && all; v++)
    all = c.records[v] == 1;
  committed_free(&c);
  return all;
}

/* With the side branch finished: trigger checkpoints one after another
 * and wait for each to complete; returns the last id.  Before the fix the
 * third trigger (at the latest) is refused with EBUSY. */
static uint64_t checkpoints_after_side_finished(sl_job *job, int n) {
  uint64_t id = 0;
  for (int k = 0; k < n; k++) {
    int rc = sl_job_trigger_checkpoint(job, &id);
    cr_assert_eq(rc, 0, "checkpoint %d after the side source finished: %s",
                 k + 1, sl_strerror(rc));
    completion c = {job, id};
    cr_assert(eventually(checkpoint_completed, &c), "checkpoint %" PRIu64
              " never completed", id);
  }
  return id;
}

static void side_source_run(int mode, uint32_t max_concurrent) {
  char *state = sl_test_temp_dir("fin"), *out = sl_test_temp_dir("fin");
  side_spec s = {.state_dir = state, .out_dir = out,
                 .main_count = sl_test_scaled(30000, 3000),
                 .side_count = sl_test_scaled(5000, 500), .mode = mode,
                 .max_concurrent = max_concurrent};
  uint64_t side_sum = s.side_count * (s.side_count - 1) / 2;
  uint64_t held = s.main_count / 3;
  atomic_store(&main_release, held);
  atomic_store(&main_emitted, 0);
  atomic_store(&side_ended, 0);
  seq_source sources[2];
  sl_job *job = build_side(&s, sources);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  cr_assert(eventually(side_done_and_main_held, &held));
  checkpoints_after_side_finished(job, 3);
  /* The sink committed during the run: main is still held back, so the
   * job cannot have ended. */
  output_check o = {out, s.main_count, s.side_count, held};
  cr_expect(eventually(output_committed, &o), "the exactly-once sink "
            "committed nothing after the side source finished");
  cr_expect_lt(atomic_load(&main_emitted), s.main_count);
  atomic_store(&main_release, s.main_count);
  cr_expect_eq(sl_job_wait(job), 0, "%s", sl_job_error(job));
  sl_job_destroy(job);
  expect_exactly_once(out, s.main_count, s.side_count, 1, false, &side_sum,
                      "a job whose side source finished early");
  sl_test_remove_tree(state);
  sl_test_remove_tree(out);
}

Test(finished, checkpoints_go_on_after_a_side_source_finished,
     .timeout = 120) {
  side_source_run(SL_EXACTLY_ONCE, 1);
}

Test(finished, checkpoints_go_on_after_a_side_source_finished_at_least_once,
     .timeout = 120) {
  side_source_run(SL_AT_LEAST_ONCE, 1);
}

Test(finished, checkpoints_go_on_after_a_side_source_finished_concurrent,
     .timeout = 120) {
  side_source_run(SL_EXACTLY_ONCE, 3);
}

/* A kill right after the third checkpoint past the side source's end is
 * durable (after-commit, before the sink's renames), then a resume: it
 * restores that checkpoint, main replays only from its position there,
 * the side branch is restored finished (side never runs, its total is not
 * emitted again), and the output is exactly-once. */
Test(finished, kill_after_a_checkpoint_past_a_finished_source,
     .timeout = 120) {
  char *state = sl_test_temp_dir("fin"), *out = sl_test_temp_dir("fin");
  side_spec s = {.state_dir = state, .out_dir = out,
                 .main_count = sl_test_scaled(30000, 3000),
                 .side_count = sl_test_scaled(5000, 500),
                 .mode = SL_EXACTLY_ONCE, .max_concurrent = 1,
                 .faults = "crash:point=after-commit,nth=3"};
  uint64_t side_sum = s.side_count * (s.side_count - 1) / 2;
  uint64_t held = s.main_count / 3;
  fflush(0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    atomic_store(&main_release, held);
    seq_source sources[2];
    sl_job *job = build_side(&s, sources);
    if (sl_job_start(job) != 0 || !eventually(side_done_and_main_held, &held))
      _exit(3);
    for (int k = 0; k < 3; k++) {
      uint64_t id;
      if (sl_job_trigger_checkpoint(job, &id) != 0)
        _exit(4); /* refused: no checkpoint after a source finished */
      completion c = {job, id};
      if (!eventually(checkpoint_completed, &c))
        _exit(5);
    }
    _exit(6); /* the third commit should have killed us */
  }
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
            "the child was not killed at the third commit (exit status %d: "
            "4 = a checkpoint was refused after the side source finished)",
            WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  atomic_store(&main_release, s.main_count);
  atomic_store(&main_emitted, 0);
  atomic_store(&side_ended, 0);
  s.faults = 0;
  seq_source sources[2];
  sl_job *job = build_side(&s, sources);
  cr_expect_eq(sl_job_run(job), 0, "%s", sl_job_error(job));
  uint64_t from = 0;
  sl_job_last_checkpoint(job, &from);
  sl_job_destroy(job);
  cr_expect_eq(from, 3, "resumed from checkpoint %" PRIu64, from);
  cr_expect_eq(atomic_load(&main_emitted), s.main_count - held,
               "main replayed %" PRIu64 " records, not only those after "
               "the restored checkpoint", atomic_load(&main_emitted));
  cr_expect_eq(atomic_load(&side_ended), 0, "the finished side source ran "
               "again");
  expect_exactly_once(out, s.main_count, s.side_count, 1, false, &side_sum,
                      "resume after a kill past a finished source");
  sl_test_remove_tree(state);
  sl_test_remove_tree(out);
}
