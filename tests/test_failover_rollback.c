/* test_failover_rollback.c — in-process failover that rolls keyed state
 * back in memory (engine/failover.c note 7) instead of reloading it from
 * the store, and the fallback to the reload.
 *
 * The job: a gated, replayable source of records {key = i % KEYS, value =
 * i} with event time i -> key_by -> "mix", which keeps for each key a
 * count (value state), four slots of recent values (map state), a list of
 * values cleared every 8 records (list state) and up to three event-time
 * timers that fire at the end of input, and emits what it read for each
 * record -> a collector; the same keyed stream -> a tumbling event-time
 * window summing values -> the same collector.  A fault fails one "mix"
 * instance at a chosen record after a checkpoint completed; the restarted
 * job's committed output must equal, record for record, what an
 * uninterrupted run emits, computed here in closed form (reference()).
 * The recovery statistics say which instances were rolled back and which
 * reloaded.  Real threads, LMDB and timers; checkpoints every 10 ms, but
 * no assertion depends on timing: the source holds back until a
 * checkpoint completed, so every fault has one to restore. */
#include <criterion/criterion.h>

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "sluice_testing.h"
#include "test_dirs.h"
#include "test_util.h"

#define KEYS 61u
#define WINDOW_SIZE 500
#define TIMER_BASE (SL_TIME_MAX_VALID - 16) /* fires at the end of input */

enum { OUT_RECORD = 1, OUT_TIMER = 2, OUT_WINDOW = 3 };

typedef struct output {
  uint64_t kind, key, a, b, c, d;
} output;

/* ------------------------------------------------------------ source */

typedef struct source_spec {
  uint64_t count, gate;
} source_spec;

typedef struct source_state {
  const source_spec *spec;
  uint64_t instance, parallelism, position; /* position: next i to try */
  uint64_t emitted;
  bool completed; /* a checkpoint completed in this attempt */
} source_state;

static int source_open(sl_ctx *ctx, void *user, void **state) {
  source_state *s = calloc(1, sizeof *s);
  if (!s)
    return ENOMEM;
  s->spec = user;
  s->instance = (uint64_t)sl_ctx_instance(ctx);
  s->parallelism = (uint64_t)sl_ctx_parallelism(ctx);
  *state = s;
  return 0;
}

/* Instance k emits the records whose key % parallelism == k, in order, so
 * each key has one producer; until a checkpoint completed in this attempt
 * it stops after `gate` records. */
static int source_next(sl_ctx *ctx, void *state) {
  source_state *s = state;
  for (int n = 0; n < 64; n++) {
    if (!s->completed && s->emitted >= s->spec->gate) {
      sl_test_sleep_us(200);
      return 0;
    }
    while (s->position < s->spec->count &&
           s->position % KEYS % s->parallelism != s->instance)
      s->position++;
    if (s->position >= s->spec->count)
      return SL_SOURCE_END;
    sl_tuple t = {.key = s->position % KEYS, .value = s->position};
    int rc = sl_emit_ts(ctx, &t, sizeof t, (int64_t)s->position);
    if (rc)
      return rc;
    s->position++;
    s->emitted++;
  }
  return 0;
}

static int source_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  return sl_fixture_save_position(ctx, &((source_state *)state)->position);
}

static int source_restore(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  return sl_fixture_load_position(ctx, &((source_state *)state)->position);
}

static void source_complete(sl_ctx *ctx, void *state, uint64_t id) {
  (void)ctx;
  (void)id;
  ((source_state *)state)->completed = true;
}

static void source_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  free(state);
}

/* ------------------------------------------------------------ mix */

static int emit_output(sl_ctx *ctx, output o) {
  return sl_emit(ctx, &o, sizeof o);
}

/* The list's sum, then the list cleared (every 8th record of a key). */
static int list_sum_and_clear(sl_ctx *ctx, uint64_t *sum) {
  const void *list;
  uint32_t bytes, offset = 0, item_bytes;
  const void *item;
  int rc = sl_liststate_get(ctx, 3, &list, &bytes);
  if (rc)
    return rc;
  *sum = 0;
  while (sl_list_next(list, bytes, &offset, &item, &item_bytes) == 1) {
    uint64_t v;
    memcpy(&v, item, 8);
    *sum += v;
  }
  return sl_state_delete(ctx, 3);
}

static int mix_process(sl_ctx *ctx, void *state, int input,
                       const sl_record *in) {
  (void)state;
  (void)input;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  void *stored;
  int rc = sl_state_update(ctx, 1, 8, 0, &stored);
  if (rc)
    return rc;
  uint64_t count;
  memcpy(&count, stored, 8);
  count++;
  memcpy(stored, &count, 8);
  uint64_t slot = count % 4, previous = 0, list_sum = 0;
  const void *v;
  uint32_t bytes;
  rc = sl_mapstate_get(ctx, 2, &slot, 8, &v, &bytes);
  if (rc == 0)
    memcpy(&previous, v, 8);
  else if (rc != SL_ENOTFOUND)
    return rc;
  rc = sl_mapstate_put(ctx, 2, &slot, 8, &t.value, 8);
  if (rc == 0)
    rc = sl_liststate_add(ctx, 3, &t.value, 8);
  if (rc == 0 && count % 8 == 0)
    rc = list_sum_and_clear(ctx, &list_sum);
  if (rc == 0)
    rc = sl_timer_register(ctx, SL_EVENT_TIME, TIMER_BASE - (int64_t)(count % 3));
  if (rc == 0 && count % 5 == 0) {
    rc = sl_timer_delete(ctx, SL_EVENT_TIME,
                         TIMER_BASE - (int64_t)((count + 1) % 3));
    rc = rc == SL_ENOTFOUND ? 0 : rc;
  }
  if (rc)
    return rc;
  return emit_output(ctx, (output){OUT_RECORD, t.key, t.value, count,
                                   previous, list_sum});
}

static int mix_timer(sl_ctx *ctx, void *state, int domain, int64_t time) {
  (void)state;
  (void)domain;
  uint64_t key, count = 0;
  const void *v;
  uint32_t bytes;
  int rc = sl_ctx_key(ctx, &key);
  if (rc == 0)
    rc = sl_state_get(ctx, 1, &v, &bytes);
  if (rc)
    return rc;
  memcpy(&count, v, 8);
  return emit_output(ctx, (output){OUT_TIMER, key, (uint64_t)time, count, 0, 0});
}

/* ------------------------------------------------------------ window */

static void window_init(void *user, void *acc) {
  (void)user;
  memset(acc, 0, 16);
}

static void window_add(void *user, void *acc, const sl_record *in) {
  (void)user;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  uint64_t a[2];
  memcpy(a, acc, 16);
  a[0] += t.value;
  a[1]++;
  memcpy(acc, a, 16);
}

static int window_emit(void *user, sl_ctx *ctx, uint64_t key,
                       const sl_window *window, const void *acc) {
  (void)user;
  uint64_t a[2];
  memcpy(a, acc, 16);
  return emit_output(ctx, (output){OUT_WINDOW, key, (uint64_t)window->start,
                                   a[0], a[1], 0});
}

/* ------------------------------------------------------------ the job */

typedef struct run_spec {
  uint64_t records, gate;
  int parallelism;
  const char *faults;
  uint32_t interval_ms; /* between checkpoints; 0: 10 ms */
  const char *state_dir;
  sl_fixture_collector *out;     /* mix's records and timers */
  sl_fixture_collector *windows; /* the window's results */
} run_spec;

static source_spec g_source;

static sl_job *build(const run_spec *s) {
  sl_job_config config =
      sl_fixture_config(s->state_dir, s->interval_ms ? s->interval_ms : 10);
  struct sl_restart_config restart = sl_restart_defaults(SL_RESTART_FIXED_DELAY);
  restart.attempts = 10;
  restart.delay_ms = 0;
  config.restart = restart;
  config.faults = s->faults;
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  g_source = (source_spec){.count = s->records, .gate = s->gate};
  static const sl_source_ops source_ops = {
      .open = source_open, .next = source_next, .close = source_close,
      .snapshot = source_snapshot, .restore = source_restore,
      .checkpoint_complete = source_complete};
  sl_op *src, *by, *mix, *window, *sink, *window_sink;
  int p = s->parallelism;
  cr_assert_eq(sl_op_source(job, "source", p, &source_ops, &g_source, &src), 0);
  sl_watermark_config wc = {.every_call = 1}; /* lateness not by timing */
  cr_assert_eq(sl_op_watermarks(src, &wc), 0);
  cr_assert_eq(sl_op_key_by(job, "by-key", src, sl_fixture_tuple_key, 0, &by),
               0);
  static const sl_process_ops mix_ops = {.process = mix_process,
                                         .on_timer = mix_timer};
  cr_assert_eq(sl_op_process(job, "mix", &by, 1, p, &mix_ops, 0, &mix), 0);
  sl_window_config w = {.type = SL_WINDOW_TUMBLING, .size = WINDOW_SIZE,
                        .acc_bytes = 16, .init = window_init,
                        .add = window_add, .emit = window_emit};
  cr_assert_eq(sl_op_window(job, "window", by, p, &w, &window), 0, "%s",
               sl_job_error(job));
  s->out->record_bytes = s->windows->record_bytes = sizeof(output);
  cr_assert_eq(sl_op_sink(job, "collect", mix, 1, &sl_fixture_collector_ops,
                          s->out, &sink), 0);
  cr_assert_eq(sl_op_sink(job, "collect-windows", window, 1,
                          &sl_fixture_collector_ops, s->windows,
                          &window_sink), 0);
  return job;
}

/* ------------------------------------------------------------ checking */

static int by_output(const void *x, const void *y) {
  const uint64_t *a = x, *b = y;
  for (int i = 0; i < 6; i++)
    if (a[i] != b[i])
      return a[i] < b[i] ? -1 : 1;
  return 0;
}

/* What an uninterrupted run emits, sorted like by_output: per record what
 * mix read (its count, the value four records of its key back, the list
 * sum every 8th), per key the timers left at the end with the final count,
 * per (key, window) the sum and number of values. */
static output *reference(uint64_t records, uint64_t *n) {
  uint64_t windows = records / WINDOW_SIZE + 1;
  uint64_t *count = calloc(KEYS, 8), *slots = calloc(KEYS * 4, 8);
  uint64_t *list = calloc(KEYS, 8), *timers = calloc(KEYS, 8);
  uint64_t *sums = calloc(KEYS * windows * 2, 8);
  output *out = calloc(records + KEYS * (3 + windows), sizeof *out);
  cr_assert(count && slots && list && timers && sums && out);
  uint64_t k = 0;
  for (uint64_t i = 0; i < records; i++) {
    uint64_t key = i % KEYS, c = ++count[key], sum = 0;
    uint64_t previous = slots[key * 4 + c % 4];
    slots[key * 4 + c % 4] = i;
    list[key] += i;
    if (c % 8 == 0) {
      sum = list[key];
      list[key] = 0;
    }
    timers[key] |= UINT64_C(1) << (c % 3);
    if (c % 5 == 0)
      timers[key] &= ~(UINT64_C(1) << ((c + 1) % 3));
    out[k++] = (output){OUT_RECORD, key, i, c, previous, sum};
    sums[(key * windows + i / WINDOW_SIZE) * 2] += i;
    sums[(key * windows + i / WINDOW_SIZE) * 2 + 1]++;
  }
  for (uint64_t key = 0; key < KEYS; key++) {
    for (uint64_t b = 0; b < 3; b++)
      if (timers[key] & (UINT64_C(1) << b))
        out[k++] = (output){OUT_TIMER, key, (uint64_t)(TIMER_BASE - (int64_t)b),
                            count[key], 0, 0};
    for (uint64_t w = 0; w < windows; w++)
      if (sums[(key * windows + w) * 2 + 1])
        out[k++] = (output){OUT_WINDOW, key, w * WINDOW_SIZE,
                            sums[(key * windows + w) * 2],
                            sums[(key * windows + w) * 2 + 1], 0};
  }
  free(count);
  free(slots);
  free(list);
  free(timers);
  free(sums);
  qsort(out, k, sizeof *out, by_output);
  *n = k;
  return out;
}

static void expect_reference(sl_fixture_collector *got,
                             sl_fixture_collector *windows, uint64_t records,
                             const char *what) {
  uint64_t n = 0, n_windows = 0, want_n = 0;
  output *all = sl_fixture_collector_gather(got, by_output, &n);
  output *more = sl_fixture_collector_gather(windows, by_output, &n_windows);
  cr_assert(all && more);
  all = realloc(all, (n + n_windows + 1) * sizeof *all);
  cr_assert(all);
  memcpy(all + n, more, n_windows * sizeof *more);
  free(more);
  n += n_windows;
  qsort(all, n, sizeof *all, by_output);
  output *want = reference(records, &want_n);
  cr_expect_eq(n, want_n, "%s: %" PRIu64 " outputs, expected %" PRIu64, what,
               n, want_n);
  uint64_t bad = 0;
  for (uint64_t i = 0; i < n && i < want_n; i++)
    if (by_output(&all[i], &want[i]) != 0 && bad++ < 5)
      cr_log_error("%s: output %" PRIu64 ": %" PRIu64 " %" PRIu64 " %" PRIu64
                   " %" PRIu64 " %" PRIu64 ", expected %" PRIu64 " %" PRIu64
                   " %" PRIu64 " %" PRIu64 " %" PRIu64, what, i, all[i].kind,
                   all[i].key, all[i].a, all[i].b, all[i].c, want[i].kind,
                   want[i].key, want[i].a, want[i].b, want[i].c);
  cr_expect_eq(bad, 0, "%s: %" PRIu64 " outputs differ from the reference",
               what, bad);
  free(all);
  free(want);
}

typedef struct run_result {
  uint32_t restarts;
  sl_recovery_stats newest, before; /* before: the one before newest */
} run_result;

static run_result run(const run_spec *s, const char *what) {
  run_result r = {0};
  sl_job *job = build(s);
  cr_assert_eq(sl_job_start(job), 0, "%s: %s", what, sl_job_error(job));
  sl_test_watchdog w;
  sl_test_watchdog_arm(&w, job, 120, "rollback job");
  int rc = sl_job_wait(job);
  cr_assert_not(sl_test_watchdog_disarm(&w), "%s: the job hung", what);
  cr_assert_eq(rc, 0, "%s: %s", what, sl_job_error(job));
  r.restarts = sl_job_restarts(job);
  if (r.restarts >= 1)
    cr_assert_eq(sl_job_recovery_stats(job, 0, &r.newest), 0);
  if (r.restarts >= 2)
    cr_assert_eq(sl_job_recovery_stats(job, 1, &r.before), 0);
  sl_job_destroy(job);
  expect_reference(s->out, s->windows, s->records, what);
  return r;
}

/* A failure of "mix" instance 0 at a record it can only reach after a
 * checkpoint completed (each source holds back after `gate` records until
 * then, so before it every instance sees at most parallelism * gate). */
static void fail_after_checkpoint_rolls_back(int parallelism) {
  uint64_t gate = 1000, records = sl_test_scaled(40000, 8000);
  char faults[128];
  snprintf(faults, sizeof faults, "fail:op=mix,instance=0,record=%" PRIu64,
           (uint64_t)parallelism * gate + 700);
  for (int round = 0; round < 2; round++) {
    char *state = sl_test_temp_dir("rb");
    sl_fixture_collector out = {0}, windows = {0};
    run_spec s = {.records = records, .gate = gate,
                  .parallelism = parallelism, .faults = faults,
                  .state_dir = state, .out = &out, .windows = &windows};
    char what[160];
    snprintf(what, sizeof what, "'%s' at parallelism %d", faults, parallelism);
    run_result r = run(&s, what);
    cr_expect_eq(r.restarts, 1, "%s: %" PRIu32 " restarts", what, r.restarts);
    cr_expect_gt(r.newest.restored_from, 0, "%s", what);
    /* Every keyed instance (mix and window) took the rollback. */
    cr_expect_eq(r.newest.rolled_back, (uint32_t)(2 * parallelism),
                 "%s: %" PRIu32 " rolled back", what, r.newest.rolled_back);
    cr_expect_eq(r.newest.reloaded, 0, "%s: %" PRIu32 " reloaded", what,
                 r.newest.reloaded);
    sl_test_remove_tree(state);
  }
}

Test(failover_rollback, one_instance_rolls_back_and_matches, .timeout = 300) {
  fail_after_checkpoint_rolls_back(1);
}

Test(failover_rollback, two_instances_roll_back_and_match, .timeout = 300) {
  fail_after_checkpoint_rolls_back(2);
}

/* The fallback: a "mix" instance that fails while restoring (after the
 * first rollback) never took up its restored state, so the next restart
 * reloads it from the store; the output is still the reference. */
Test(failover_rollback, an_instance_failed_in_its_restore_is_reloaded,
     .timeout = 300) {
  uint64_t gate = 1000, records = sl_test_scaled(40000, 8000);
  const char *faults = "fail:op=mix,instance=0,record=2700;restore:op=mix";
  char *state = sl_test_temp_dir("rb");
  sl_fixture_collector out = {0}, windows = {0};
  run_spec s = {.records = records, .gate = gate, .parallelism = 2,
                .faults = faults, .state_dir = state, .out = &out,
                .windows = &windows};
  run_result r = run(&s, faults);
  cr_expect_eq(r.restarts, 2, "%" PRIu32 " restarts", r.restarts);
  cr_expect_eq(r.before.rolled_back, 4, "first restart: %" PRIu32
               " rolled back", r.before.rolled_back);
  cr_expect_geq(r.newest.reloaded, 1, "second restart: %" PRIu32 " reloaded",
                r.newest.reloaded);
  cr_expect_eq(r.newest.reloaded + r.newest.rolled_back, 4,
               "second restart: %" PRIu32 " reloaded, %" PRIu32
               " rolled back", r.newest.reloaded, r.newest.rolled_back);
  sl_test_remove_tree(state);
}

/* Failures while checkpoints are in the writer: with one every
 * millisecond, a stop often finds a write queued or under way, which the
 * stop of a failed attempt gives up (checkpoint_writer.c note 2a); the
 * restart then restores the checkpoint before it.  Which one each restart
 * got is up to the scheduler; what must hold whatever it was: four
 * restarts, each rolled back in memory (the checkpoint restored is one
 * the maps still have), and the reference output. */
Test(failover_rollback, failures_while_checkpoints_are_written_match,
     .timeout = 300) {
  uint64_t gate = 1000, records = sl_test_scaled(40000, 8000);
  /* The record count starts again at each restart (fault.h note 4), so
   * each of the four comes after a checkpoint of its attempt completed. */
  const char *faults = "fail:op=mix,instance=0,record=1700,times=4";
  char *state = sl_test_temp_dir("rb");
  sl_fixture_collector out = {0}, windows = {0};
  run_spec s = {.records = records, .gate = gate, .parallelism = 1,
                .faults = faults, .interval_ms = 1, .state_dir = state,
                .out = &out, .windows = &windows};
  run_result r = run(&s, faults);
  cr_expect_eq(r.restarts, 4, "%" PRIu32 " restarts", r.restarts);
  cr_expect_gt(r.newest.restored_from, r.before.restored_from,
               "the last restart restored %" PRIu64 ", the one before %"
               PRIu64, r.newest.restored_from, r.before.restored_from);
  cr_expect_eq(r.newest.rolled_back, 2, "%" PRIu32 " rolled back",
               r.newest.rolled_back);
  cr_expect_eq(r.before.rolled_back, 2, "%" PRIu32 " rolled back before",
               r.before.rolled_back);
  sl_test_remove_tree(state);
}
