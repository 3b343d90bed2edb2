/* recovery_bench.c — how long a keyed job takes to recover from an operator
 * failure with the in-process restart (engine/failover.c), by state size.
 *
 *   recovery_bench [--quick] [--repeat R] [--keys N] [--json PATH]
 *                  [--dir DIR] [--verbose]
 *
 * The job: a paced source -> key_by -> count -> sink, one instance each.
 * The source emits sl_tuple {key = i % keys, value = i}, i = 0, 1, ...; it
 * is replayable (its position i is checkpointed).  count keeps a running
 * count per key in keyed state and emits nothing; the sink only closes the
 * graph.  Checkpoints every 100 ms, exactly-once, no fsync (what is
 * measured is the restart, not the disk).  Restart strategy: fixed delay,
 * 1 attempt, delay 0.
 *
 * Each repeat is a fresh job and state directory, in phases:
 *   1. fill: the first F = max(2 * keys, 4M) records unpaced, so every key
 *      is in the state (twice over) before anything is timed.  The
 *      source's emit rate over the second half of the fill, when the full
 *      ring holds it to what count can process (checkpoints running), is
 *      the "max" rate M.
 *   2. paced: from then on record i is due at origin + (i - F) / R, with
 *      R = M / 2 and origin the moment the fill was out.  The source emits
 *      every due record and no more, like a reader of a log that a
 *      producer appends to at R records/s; after a restore it reads its
 *      backlog as fast as it can.
 *   3. failure: once a checkpoint triggered after the fill has completed
 *      and the paced phase has run 1 s, the bench waits for the next
 *      checkpoint to complete, then 50 ms; if count is on schedule then
 *      (its newest lag sample under 10 ms, see catch-up) it sets a flag
 *      that count reads on its next record, else it tries again after the
 *      next checkpoint (for at most 30 s, then it sets the flag anyway).
 *      Seeing the flag, count returns SL_ECALLBACK with a message (a real
 *      operator failure, not the engine's fault layer).  What is replayed
 *      is what came after the restored checkpoint's barrier: those 50 ms
 *      plus the checkpoint's own duration ("replayed" below).
 *
 * Reported per key count, median / min / max over the repeats, in ms after
 * the failure was detected (stopped, restored and first record are the
 * engine's sl_recovery_stats):
 *   stopped       every thread of the failed attempt joined (the
 *                 checkpoint writer gives up the write it is in at its
 *                 next look, checkpoint_writer.c note 2a);
 *   restored      every instance has loaded its state from the store (each
 *                 on its own thread); restored - stopped is the restore,
 *                 including freeing the failed attempt's state;
 *   first record  the first record processed after that;
 *   catch-up      the first time after the failure that count processes a
 *                 record due less than 10 ms ago: count's position is back
 *                 within 10 ms of the schedule, i.e. of where it would be
 *                 had there been no failure.  Lag is sampled on every
 *                 1024th record (value % 1024 == 0), so catch-up is seen
 *                 within 1024 records of it.  It is timed from the return
 *                 of the failing callback, microseconds before the
 *                 engine's detection.  Given up 60 s after the failure
 *                 (reported as not reached: with 10M keys the restore
 *                 alone takes tens of seconds here).
 * Also: the steady lag before the failure (p99 and max of the newest 4096
 * lag samples, ~4M records, from 300 ms after the origin on: the ring still
 * holds fill records at the origin; if these are not well under 10 ms the
 * job does not keep up with R even without failures, and catch-up is only
 * the first dip under 10 ms), the peak lag while recovering, the records
 * replayed (failing record - restored source position), M and R.
 *
 * Targets: failure to first record after the restore under 100 ms with 1M
 * keys (the issue that asked for failover); and issue 21's target 2, that
 * recovery does not grow with state: the median failure to first record at
 * 1M keys at most 3x the median at 10K keys, both from this run
 * ("growth_target" in the JSON; not measured when --keys picks one size).
 *
 * 10K and 1M keys run R repeats (default 5), 10M keys one (~2 minutes:
 * fill, restore, catch-up wait) unless --keys picks it alone.  --quick:
 * 10K and 1M keys, 3 repeats.  --verbose: one line per repeat on stderr.
 */
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "fixtures.h"
#include "sluice.h"

/* Read by jemalloc at start-up: back the heap with transparent huge pages.
 * A restore fills hundreds of MiB of fresh heap, and a 4 KiB page fault
 * costs about 10 us on this VM.  checkpoint_bench sets the same, so the
 * restore times of the two benchmarks compare.  The library leaves
 * allocator settings to the program; without jemalloc nobody reads it. */
const char *malloc_conf = "thp:always,metadata_thp:auto";

#define MAX_REPEAT 50
#define LARGE_STATE_KEYS 10000000u
#define LARGE_STATE_REPEAT 1
#define CHECKPOINT_INTERVAL_MS 100u
#define FILL_MIN_RECORDS 4000000u
#define RATE_PERCENT 50u           /* R as a share of the measured max */
#define LAG_THRESHOLD_NS 10000000u /* "caught up": due less than 10 ms ago */
#define LAG_SAMPLE_MASK 1023u      /* sample lag on every 1024th record */
#define ON_SCHEDULE_LIMIT_S 30u    /* wait for count to be on schedule */
#define STEADY_SKIP_NS 300000000u  /* no steady-lag samples before this */
#define PACED_MIN_NS 1000000000u   /* paced this long before the failure */
_Static_assert(PACED_MIN_NS > STEADY_SKIP_NS,
               "some steady-lag samples come before the failure");
#define STEADY_SAMPLES 4096u       /* the newest lag samples kept */
#define FAIL_AFTER_CHECKPOINT_MS 50u
#define SOURCE_BATCH 256u
#define SOURCE_IDLE_US 50u /* sleep when nothing is due yet */
#define POLL_US 1000u
#define FILL_LIMIT_S 300u     /* 10M keys: ~30 s here; generous */
#define RECOVERY_LIMIT_S 300u /* failure to first record */
#define CATCH_UP_LIMIT_S 60u  /* failure to catch-up, or not reached */
_Static_assert((LAG_SAMPLE_MASK & (LAG_SAMPLE_MASK + 1)) == 0,
               "the sample mask selects every 2^k-th record");
_Static_assert(RATE_PERCENT > 0 && RATE_PERCENT < 100,
               "a paced rate at or above the max could never catch up");
_Static_assert((STEADY_SAMPLES & (STEADY_SAMPLES - 1)) == 0,
               "the steady-lag ring is indexed with a mask");
_Static_assert(CATCH_UP_LIMIT_S <= RECOVERY_LIMIT_S,
               "catch-up comes after the first record");

/* Shared by the bench thread, the source's thread and count's thread.
 * Fields without _Atomic belong to one thread (named next to them); the
 * bench reads count's after sl_job_wait(), which joined that thread. */
typedef struct bench_run {
  uint64_t keys;         /* read-only once the job starts */
  uint64_t fill_records; /* F, read-only */
  uint64_t emitted;      /* source: position, the next i to emit */
  uint64_t half_ns;      /* source: when the fill's second half began */
  _Atomic uint64_t max_per_s;  /* M and R: stored before origin_ns */
  _Atomic uint64_t rate_per_s;
  _Atomic uint64_t origin_ns;  /* 0 until the fill is out */
  _Atomic uint64_t restored_position; /* source, at its restore */
  _Atomic int fail_requested;         /* bench -> count */
  _Atomic uint64_t failed_position;   /* count: the failing record */
  _Atomic uint64_t failed_ns;         /* count: when it failed */
  _Atomic uint64_t caught_up_ns;      /* count: catch-up reached */
  _Atomic uint64_t peak_lag_ns;       /* count: after the failure */
  _Atomic uint64_t last_lag_ns;       /* count: newest sample */
  _Atomic int on_schedule;            /* count: newest lag < threshold */
  uint64_t steady_samples;            /* count: samples taken, and */
  uint32_t steady_lag_us[STEADY_SAMPLES]; /* the newest of them, a ring */
} bench_run;

/* ------------------------------------------------------------ the source */

/* When record `position` (>= fill) is due.  Double: (position - F) * 1e9
 * would overflow 64 bits after ~18e9 records; a run has far fewer, but the
 * rounding error of a double here is below a nanosecond anyway. */
static uint64_t due_ns(uint64_t origin_ns, uint64_t rate_per_s,
                       uint64_t fill, uint64_t position) {
  return origin_ns +
         (uint64_t)((double)(position - fill) * 1e9 / (double)rate_per_s);
}

/* How far the source may go at now_ns: the end of the fill until the fill
 * is out, then every record due so far. */
static uint64_t emit_limit(const bench_run *run, uint64_t now_ns) {
  /* Acquire: rate_per_s was stored before origin_ns was published. */
  uint64_t origin = atomic_load_explicit(&run->origin_ns,
                                         memory_order_acquire);
  if (origin == 0 || now_ns < origin) /* the second: never, the source
                                         reads the clock after setting it */
    return run->fill_records;
  uint64_t rate = atomic_load_explicit(&run->rate_per_s, memory_order_relaxed);
  return run->fill_records +
         (uint64_t)((double)(now_ns - origin) * (double)rate / 1e9);
}

/* The fill is out: fix M and R, and start the schedule. */
static void start_schedule(bench_run *run, uint64_t now_ns) {
  uint64_t half = run->fill_records - run->fill_records / 2;
  uint64_t elapsed_ns = now_ns > run->half_ns ? now_ns - run->half_ns : 1;
  uint64_t max = (uint64_t)((double)half * 1e9 / (double)elapsed_ns);
  uint64_t rate = max * RATE_PERCENT / 100;
  atomic_store_explicit(&run->max_per_s, max, memory_order_relaxed);
  /* due_ns() divides by it; at least 1 record/s whatever was measured. */
  atomic_store_explicit(&run->rate_per_s, rate ? rate : 1,
                        memory_order_relaxed);
  /* Release: whoever sees the origin also sees the rate above. */
  atomic_store_explicit(&run->origin_ns, now_ns, memory_order_release);
}

static int paced_open(sl_ctx *ctx, void *user, void **state) {
  (void)ctx;
  bench_run *run = user;
  run->emitted = 0; /* restore() moves it if there is a checkpoint */
  *state = run;
  return 0;
}

static int paced_next(sl_ctx *ctx, void *state) {
  bench_run *run = state;
  uint64_t limit = emit_limit(run, bench_now_ns());
  if (run->emitted >= limit) {
    usleep(SOURCE_IDLE_US);
    return 0;
  }
  sl_tuple batch[SOURCE_BATCH];
  uint32_t n = 0;
  for (; n < SOURCE_BATCH && run->emitted + n < limit; n++) {
    uint64_t i = run->emitted + n;
    batch[n].key = i % run->keys;
    batch[n].value = i;
  }
  int rc = sl_emit_batch(ctx, batch, sizeof batch[0], n);
  if (rc)
    return rc;
  run->emitted += n;
  bool scheduled = atomic_load_explicit(&run->origin_ns,
                                        memory_order_relaxed) != 0;
  if (!scheduled && run->half_ns == 0 &&
      run->emitted >= run->fill_records / 2)
    run->half_ns = bench_now_ns();
  if (!scheduled && run->emitted >= run->fill_records)
    start_schedule(run, bench_now_ns());
  return 0;
}

static int paced_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  bench_run *run = state;
  return fixture_position_snapshot(ctx, &run->emitted);
}

static int paced_restore(sl_ctx *ctx, void *state, uint64_t id) {
  bench_run *run = state;
  int rc = fixture_position_restore(ctx, id, &run->emitted);
  if (rc == SL_ENOTFOUND)
    return 0; /* the checkpoint came before the first snapshot: from 0 */
  if (rc == 0)
    atomic_store(&run->restored_position, run->emitted);
  return rc;
}

/* ------------------------------------------------------------ count */

static void note_max(_Atomic uint64_t *max, uint64_t value) {
  /* Only count's thread writes it: a load and a store suffice. */
  if (value > atomic_load_explicit(max, memory_order_relaxed))
    atomic_store_explicit(max, value, memory_order_relaxed);
}

/* Before the failure: keep the sample, and say whether count is on
 * schedule (the bench fails it only then). */
static void note_steady(bench_run *run, uint64_t lag, bool settled) {
  uint64_t lag_us = lag / 1000u;
  if (settled)
    run->steady_lag_us[run->steady_samples++ & (STEADY_SAMPLES - 1)] =
        lag_us > UINT32_MAX ? UINT32_MAX : (uint32_t)lag_us;
  atomic_store_explicit(&run->on_schedule, lag < LAG_THRESHOLD_NS,
                        memory_order_relaxed);
}

/* Lag of record `position` at count: now minus when it was due.  Before
 * the failure a sample of the steady lag; after it, the catch-up test. */
static void sample_lag(bench_run *run, uint64_t position) {
  uint64_t origin = atomic_load_explicit(&run->origin_ns,
                                         memory_order_acquire);
  if (origin == 0 || position < run->fill_records)
    return; /* a fill record: due at once, no schedule */
  uint64_t rate = atomic_load_explicit(&run->rate_per_s, memory_order_relaxed);
  uint64_t due = due_ns(origin, rate, run->fill_records, position);
  uint64_t now = bench_now_ns();
  uint64_t lag = now > due ? now - due : 0;
  if (atomic_load_explicit(&run->failed_ns, memory_order_relaxed) == 0) {
    note_steady(run, lag, due >= origin + STEADY_SKIP_NS);
    return;
  }
  if (atomic_load_explicit(&run->caught_up_ns, memory_order_relaxed))
    return;
  note_max(&run->peak_lag_ns, lag);
  atomic_store_explicit(&run->last_lag_ns, lag, memory_order_relaxed);
  if (lag < LAG_THRESHOLD_NS)
    atomic_store_explicit(&run->caught_up_ns, now, memory_order_relaxed);
}

static int count_process(sl_ctx *ctx, void *state, int input,
                         const sl_record *in) {
  (void)input;
  bench_run *run = state;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  /* The relaxed load keeps the common path to one plain read; only the
   * record that sees the flag pays for the exchange. */
  if (atomic_load_explicit(&run->fail_requested, memory_order_relaxed) &&
      atomic_exchange(&run->fail_requested, 0)) {
    atomic_store(&run->failed_position, t.value);
    atomic_store(&run->failed_ns, bench_now_ns());
    sl_ctx_fail(ctx, "recovery_bench: failure injected at record %" PRIu64,
                t.value);
    return SL_ECALLBACK;
  }
  uint64_t count;
  int rc = fixture_count_add(ctx, t.key, &count);
  if (rc)
    return rc;
  if ((t.value & LAG_SAMPLE_MASK) == 0)
    sample_lag(run, t.value);
  return 0;
}

static sl_job *build(const sl_job_config *config, bench_run *run) {
  static const sl_source_ops source_ops = {.open = paced_open,
                                           .next = paced_next,
                                           .snapshot = paced_snapshot,
                                           .restore = paced_restore};
  static const sl_process_ops count_ops = {.open = fixture_open_shared,
                                           .process = count_process};
  static const sl_process_ops sink_ops = {.process = fixture_discard};
  const fixture_keyed_spec keyed = {
      .count_ops = &count_ops, .count_user = run, .sink_ops = &sink_ops};
  sl_job *job;
  if (sl_job_create(config, &job))
    return 0;
  sl_op *src, *sink;
  int rc = sl_op_source(job, "source", 1, &source_ops, run, &src);
  if (!rc)
    rc = fixture_keyed_job(job, src, &keyed, &sink);
  if (rc) {
    fprintf(stderr, "recovery_bench: build: %s\n", sl_strerror(rc));
    sl_job_destroy(job);
    return 0;
  }
  return job;
}

/* ------------------------------------------------------------ one repeat */

/* One repeat's figures; NAN where there is none (catch-up not reached). */
typedef struct repeat_result {
  double stopped_ms, restored_ms, first_record_ms, catch_up_ms;
  double replayed_records, peak_lag_ms;
  double steady_lag_p99_ms, steady_lag_max_ms;
  double max_per_s, rate_per_s;
} repeat_result;

static void fresh_dir(const char *dir) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
  if (system(cmd) != 0)
    fprintf(stderr, "recovery_bench: cannot reset %s\n", dir);
}

static uint64_t seconds_after_ns(uint64_t start_ns, unsigned seconds) {
  return start_ns + (uint64_t)seconds * 1000000000u;
}

static bool timed_out(uint64_t deadline_ns, const char *waiting_for,
                      sl_job *job) {
  if (bench_now_ns() < deadline_ns)
    return false;
  fprintf(stderr, "recovery_bench: gave up waiting for %s (job: %s)\n",
          waiting_for, sl_job_error(job));
  return true;
}

/* Wait until the next checkpoint completes.  Returns 0, or 1 past the
 * deadline. */
static int next_checkpoint(sl_job *job, uint64_t deadline_ns) {
  uint64_t seen = sl_job_last_checkpoint(job, 0);
  while (sl_job_last_checkpoint(job, 0) == seen) {
    if (timed_out(deadline_ns, "the next checkpoint", job))
      return 1;
    usleep(POLL_US);
  }
  return 0;
}

/* The moment of the failure: FAIL_AFTER_CHECKPOINT_MS after a checkpoint
 * completed, with count on schedule then (its newest lag sample under the
 * threshold), so the backlog after the failure is the failure's.  If count
 * is not on schedule at that moment, the next checkpoint is tried; after
 * ON_SCHEDULE_LIMIT_S the failure comes anyway (said on stderr; the
 * steady lag in the table shows it too).  Returns 0, or 1 if checkpoints
 * stopped completing. */
static int await_failure_point(sl_job *job, bench_run *run) {
  uint64_t give_up_ns = seconds_after_ns(bench_now_ns(), ON_SCHEDULE_LIMIT_S);
  uint64_t deadline = seconds_after_ns(give_up_ns, 60);
  for (;;) {
    if (next_checkpoint(job, deadline))
      return 1;
    usleep(FAIL_AFTER_CHECKPOINT_MS * 1000u);
    if (atomic_load(&run->on_schedule))
      return 0;
    if (bench_now_ns() >= give_up_ns) {
      fprintf(stderr, "recovery_bench: %" PRIu64 " keys: count was not "
              "within %u ms of the schedule after a checkpoint in %u s; "
              "failing it anyway\n", run->keys,
              LAG_THRESHOLD_NS / 1000000u, ON_SCHEDULE_LIMIT_S);
      return 0;
    }
  }
}

/* Phases 1-3 of the header: returns 0 once count has failed. */
static int fill_pace_and_fail(sl_job *job, bench_run *run) {
  uint64_t deadline = seconds_after_ns(bench_now_ns(), FILL_LIMIT_S);
  while (atomic_load(&run->origin_ns) == 0) {
    if (timed_out(deadline, "the fill", job))
      return 1;
    usleep(POLL_US);
  }
  /* +2: the checkpoint in flight when the fill ended may have been
   * triggered before it; the one after it was not. */
  uint64_t first = sl_job_last_checkpoint(job, 0) + 2;
  while (sl_job_last_checkpoint(job, 0) < first) {
    if (timed_out(deadline, "a checkpoint after the fill", job))
      return 1;
    usleep(POLL_US);
  }
  uint64_t paced_ns = atomic_load(&run->origin_ns) + PACED_MIN_NS;
  while (bench_now_ns() < paced_ns) /* bounded: a fixed time */
    usleep(POLL_US);
  if (await_failure_point(job, run))
    return 1;
  atomic_store(&run->fail_requested, 1);
  /* Records keep coming at R, so count sees the flag within microseconds;
   * 10 s means something else is wrong. */
  deadline = seconds_after_ns(bench_now_ns(), 10);
  while (atomic_load(&run->failed_ns) == 0) {
    if (timed_out(deadline, "count to fail", job))
      return 1;
    usleep(100);
  }
  return 0;
}

/* Wait for the first record after the restore (an error if it does not
 * come), then for catch-up (not reached is a result, not an error). */
static int await_recovery(sl_job *job, bench_run *run,
                          sl_recovery_stats *rs) {
  uint64_t failed_ns = atomic_load(&run->failed_ns);
  uint64_t deadline = seconds_after_ns(failed_ns, RECOVERY_LIMIT_S);
  while (sl_job_restarts(job) < 1 || sl_job_recovery_stats(job, 0, rs) != 0 ||
         rs->first_record_us == 0) {
    if (timed_out(deadline, "the first record after the restart", job))
      return 1;
    usleep(POLL_US);
  }
  deadline = seconds_after_ns(failed_ns, CATCH_UP_LIMIT_S);
  while (atomic_load(&run->caught_up_ns) == 0 && bench_now_ns() < deadline)
    usleep(POLL_US);
  return 0;
}

/* --verbose: one line per repeat on stderr, with where its time went:
 * the whole repeat's phases in seconds, then the recovery's own in ms
 * (the medians below hide which repeat paid for what). */
static bool verbose;

static void print_phases(const bench_run *run, uint64_t start_ns,
                         uint64_t stop_ns, uint64_t end_ns,
                         const sl_recovery_stats *rs) {
  uint64_t origin = atomic_load(&run->origin_ns);
  uint64_t failed = atomic_load(&run->failed_ns);
  fprintf(stderr, "   %" PRIu64 " keys: fill %.1f s, paced %.1f s, failure "
          "to stop %.1f s (restored from checkpoint %" PRIu64 ": stopped "
          "%.2f, restored %.2f, first record %.2f ms; %" PRIu32 " rolled "
          "back, %" PRIu32 " reloaded; lag %s %.2f ms), stop and destroy "
          "%.1f s\n", run->keys,
          (double)(origin - start_ns) / 1e9, (double)(failed - origin) / 1e9,
          (double)(stop_ns - failed) / 1e9, rs->restored_from,
          (double)rs->stopped_us / 1e3, (double)rs->restored_us / 1e3,
          (double)rs->first_record_us / 1e3, rs->rolled_back, rs->reloaded,
          atomic_load(&run->caught_up_ns) ? "caught up, last" : "NOT caught "
          "up, still", (double)atomic_load(&run->last_lag_ns) / 1e6,
          (double)(end_ns - stop_ns) / 1e9);
}

/* p99 and max of the newest steady-lag samples, in ms (NAN if none). */
static void steady_lag(const bench_run *run, repeat_result *out) {
  size_t n = run->steady_samples < STEADY_SAMPLES ? run->steady_samples
                                                  : STEADY_SAMPLES;
  out->steady_lag_p99_ms = out->steady_lag_max_ms = NAN;
  if (n == 0)
    return;
  uint64_t sorted[STEADY_SAMPLES];
  for (size_t i = 0; i < n; i++)
    sorted[i] = run->steady_lag_us[i];
  bench_sort_u64(sorted, n);
  out->steady_lag_p99_ms =
      (double)bench_percentile_sorted_u64(sorted, n, 0.99) / 1e3;
  out->steady_lag_max_ms = (double)sorted[n - 1] / 1e3;
}

static void collect(const bench_run *run, const sl_recovery_stats *rs,
                    repeat_result *out) {
  uint64_t failed_ns = atomic_load(&run->failed_ns);
  uint64_t caught_up_ns = atomic_load(&run->caught_up_ns);
  out->stopped_ms = (double)rs->stopped_us / 1e3;
  out->restored_ms = (double)rs->restored_us / 1e3;
  out->first_record_ms = (double)rs->first_record_us / 1e3;
  out->catch_up_ms = caught_up_ns ? (double)(caught_up_ns - failed_ns) / 1e6
                                  : NAN;
  out->replayed_records = (double)(atomic_load(&run->failed_position) -
                                   atomic_load(&run->restored_position));
  out->peak_lag_ms = (double)atomic_load(&run->peak_lag_ns) / 1e6;
  steady_lag(run, out);
  out->max_per_s = (double)atomic_load(&run->max_per_s);
  out->rate_per_s = (double)atomic_load(&run->rate_per_s);
}

static sl_job_config job_config(const char *dir) {
  sl_job_config config = SL_JOB_CONFIG_INIT;
  config.checkpoint.state_dir = dir;
  config.checkpoint.interval_ms = CHECKPOINT_INTERVAL_MS;
  config.checkpoint.no_sync = 1;
  config.checkpoint.mode = SL_EXACTLY_ONCE;
  config.restart = sl_restart_defaults(SL_RESTART_FIXED_DELAY);
  config.restart.attempts = 1;
  config.restart.delay_ms = 0;
  return config;
}

static int run_once(uint64_t keys, const char *dir, repeat_result *out) {
  fresh_dir(dir);
  uint64_t start_ns = bench_now_ns();
  sl_job_config config = job_config(dir);
  bench_run run = {.keys = keys};
  run.fill_records = 2 * keys > FILL_MIN_RECORDS ? 2 * keys : FILL_MIN_RECORDS;
  sl_job *job = build(&config, &run);
  if (!job)
    return 1;
  int rc = sl_job_start(job);
  if (rc)
    fprintf(stderr, "recovery_bench: start: %s\n", sl_job_error(job));
  sl_recovery_stats rs = {0};
  if (rc == 0)
    rc = fill_pace_and_fail(job, &run);
  if (rc == 0)
    rc = await_recovery(job, &run, &rs);
  uint64_t stop_ns = bench_now_ns();
  sl_job_stop(job);
  sl_job_wait(job); /* joins count's thread: its fields are final */
  sl_job_destroy(job);
  if (rc == 0 && rs.restored_from == 0) {
    fprintf(stderr, "recovery_bench: restarted from the beginning, not "
                    "from a checkpoint\n");
    rc = 1;
  }
  if (rc == 0) {
    if (verbose)
      print_phases(&run, start_ns, stop_ns, bench_now_ns(), &rs);
    collect(&run, &rs, out);
  }
  return rc;
}

/* ------------------------------------------------------------ reporting */

typedef struct metric {
  const char *name; /* table row and JSON key */
  size_t offset;    /* of its double in repeat_result */
  double scale;     /* printed value = stored * scale */
} metric;

static const metric metrics[] = {
    {"stopped_ms", offsetof(repeat_result, stopped_ms), 1},
    {"restored_ms", offsetof(repeat_result, restored_ms), 1},
    {"first_record_ms", offsetof(repeat_result, first_record_ms), 1},
    {"catch_up_ms", offsetof(repeat_result, catch_up_ms), 1},
    {"replayed_krecords", offsetof(repeat_result, replayed_records), 1e-3},
    {"peak_lag_ms", offsetof(repeat_result, peak_lag_ms), 1},
    {"steady_lag_p99_ms", offsetof(repeat_result, steady_lag_p99_ms), 1},
    {"steady_lag_max_ms", offsetof(repeat_result, steady_lag_max_ms), 1},
    {"max_mrecords_per_s", offsetof(repeat_result, max_per_s), 1e-6},
    {"paced_mrecords_per_s", offsetof(repeat_result, rate_per_s), 1e-6},
};
#define METRIC_COUNT (sizeof metrics / sizeof metrics[0])

/* Median, min and max of one metric over the repeats that have it; *have
 * says how many do (the stats are meaningless when it is 0). */
static bench_stats metric_stats(const repeat_result *results, int repeat,
                                const metric *m, int *have) {
  double values[MAX_REPEAT];
  size_t n = 0;
  for (int r = 0; r < repeat; r++) {
    double v = *(const double *)((const char *)&results[r] + m->offset);
    if (!isnan(v))
      values[n++] = v * m->scale;
  }
  *have = (int)n;
  bench_stats none = {NAN, NAN, NAN};
  return n ? bench_stats_of(values, n) : none;
}

/* One row of the table, and its JSON stats (null where no repeat has the
 * metric, and then "<name>_runs": how many have it). */
static void report_metric(bench_json *json, const char *label,
                          const metric *m, const repeat_result *results,
                          int repeat) {
  int have = 0;
  bench_stats s = metric_stats(results, repeat, m, &have);
  printf("   %-10s %-22s", label, m->name);
  if (have)
    printf(" %10.2f %10.2f %10.2f", s.median, s.min, s.max);
  bool catch_up = m->offset == offsetof(repeat_result, catch_up_ms);
  if (have < repeat && catch_up)
    printf("   not reached within %u s in %d of %d runs", CATCH_UP_LIMIT_S,
           repeat - have, repeat);
  else if (have < repeat)
    printf("   no samples in %d of %d runs", repeat - have, repeat);
  printf("\n");
  bench_json_stats(json, m->name, s);
  if (have < repeat) {
    char key[64];
    snprintf(key, sizeof key, "%s_runs", m->name);
    bench_json_u64(json, key, (uint64_t)have);
  }
}

/* Print and write one key count: its rows of the table (the key count on
 * the first, the number of repeats on the second) and its JSON object. */
static void report(bench_json *json, uint64_t keys,
                   const repeat_result *results, int repeat) {
  bench_json_begin_object(json, 0);
  bench_json_u64(json, "keys", keys);
  bench_json_u64(json, "repeats", (uint64_t)repeat);
  for (size_t k = 0; k < METRIC_COUNT; k++) {
    char label[32] = "";
    if (k == 0)
      snprintf(label, sizeof label, "%" PRIu64, keys);
    else if (k == 1)
      snprintf(label, sizeof label, "(%d run%s)", repeat,
               repeat == 1 ? "" : "s");
    report_metric(json, label, &metrics[k], results, repeat);
  }
  bench_json_end_object(json);
  fflush(stdout);
}

/* All repeats of one key count; returns 0, or 1 if a repeat failed.
 * *first_record_ms: the median failure-to-first-record time. */
static int measure(bench_json *json, uint64_t keys, int repeat,
                   const char *dir, double *first_record_ms) {
  repeat_result results[MAX_REPEAT];
  for (int r = 0; r < repeat; r++) {
    if (run_once(keys, dir, &results[r]) != 0) {
      fprintf(stderr, "recovery_bench: %" PRIu64 " keys, repeat %d failed\n",
              keys, r + 1);
      return 1;
    }
  }
  report(json, keys, results, repeat);
  const metric first_record = {"first_record_ms",
                               offsetof(repeat_result, first_record_ms), 1};
  int have = 0;
  *first_record_ms = metric_stats(results, repeat, &first_record, &have).median;
  return 0;
}

static void usage(void) {
  fprintf(stderr, "usage: recovery_bench [--quick] [--repeat R] [--keys N] "
                  "[--json PATH] [--dir DIR] [--verbose]\n");
}

static void json_settings(bench_json *json) {
  bench_json_string(json, "benchmark", "recovery_bench");
  bench_json_machine(json);
  bench_json_u64(json, "checkpoint_interval_ms", CHECKPOINT_INTERVAL_MS);
  bench_json_u64(json, "paced_rate_percent_of_max", RATE_PERCENT);
  bench_json_double(json, "catch_up_lag_threshold_ms",
                    (double)LAG_THRESHOLD_NS / 1e6);
  bench_json_u64(json, "catch_up_limit_s", CATCH_UP_LIMIT_S);
  bench_json_u64(json, "fail_after_checkpoint_ms", FAIL_AFTER_CHECKPOINT_MS);
}

/* The key counts and repeats of this run; returns how many sizes. */
static int plan(bool quick, int repeat, uint64_t only_keys, uint64_t *sizes,
                int *repeats) {
  if (only_keys) {
    sizes[0] = only_keys, repeats[0] = repeat;
    return 1;
  }
  static const uint64_t all[3] = {10000, 1000000, LARGE_STATE_KEYS};
  int count = quick ? 2 : 3;
  for (int s = 0; s < count; s++) {
    sizes[s] = all[s];
    repeats[s] = all[s] >= LARGE_STATE_KEYS && repeat > LARGE_STATE_REPEAT
                     ? LARGE_STATE_REPEAT : repeat;
  }
  return count;
}

/* Issue 21, target 2: in-process recovery does not grow with state. */
#define TARGET_GROWTH_1M_OVER_10K 3.0

/* Target 2 from the medians of this run: first record at 1M keys over
 * the same at 10K keys (both NAN-safe: not measured is said so). */
static void growth_target(bench_json *json, double at_10k_ms,
                          double at_1m_ms) {
  if (isnan(at_10k_ms) || isnan(at_1m_ms) || at_10k_ms <= 0) {
    printf("   target 2 (issue 21): first record at 1M keys <= %.0fx at 10K "
           "keys: not measured (this run has not both sizes)\n",
           TARGET_GROWTH_1M_OVER_10K);
    return;
  }
  double ratio = at_1m_ms / at_10k_ms;
  bool met = ratio <= TARGET_GROWTH_1M_OVER_10K;
  printf("   target 2 (issue 21): failure to first record, 1M keys / 10K "
         "keys <= %.0f: %.1f ms / %.1f ms = %.2f, %s\n",
         TARGET_GROWTH_1M_OVER_10K, at_1m_ms, at_10k_ms, ratio,
         met ? "met" : "NOT met");
  bench_json_begin_object(json, "growth_target");
  bench_json_double(json, "first_record_10k_ms", at_10k_ms);
  bench_json_double(json, "first_record_1m_ms", at_1m_ms);
  bench_json_double(json, "ratio_1m_over_10k", ratio);
  bench_json_double(json, "ratio_max", TARGET_GROWTH_1M_OVER_10K);
  bench_json_bool(json, "met", met);
  bench_json_end_object(json);
}

static int run_all(bench_json *json, int count, const uint64_t *sizes,
                   const int *repeats, const char *dir) {
  printf("recovery after an injected failure of 'count' (in-process restart "
         "from the newest checkpoint);\n"
         "times in ms after the failure was detected, paced source at %u%% "
         "of the max rate\n", RATE_PERCENT);
  printf("   %-10s %-22s %10s %10s %10s\n", "keys", "metric", "median", "min",
         "max");
  bench_json_begin_array(json, "sizes");
  int rc = 0;
  double first_record_ms_10k = NAN, first_record_ms_1m = NAN;
  for (int s = 0; rc == 0 && s < count; s++) {
    double first_record_ms = NAN;
    rc = measure(json, sizes[s], repeats[s], dir, &first_record_ms);
    if (rc == 0 && sizes[s] == 10000)
      first_record_ms_10k = first_record_ms;
    if (rc == 0 && sizes[s] == 1000000)
      first_record_ms_1m = first_record_ms;
  }
  bench_json_end_array(json);
  if (!isnan(first_record_ms_1m)) {
    bool met = first_record_ms_1m < 100;
    printf("   target: failure to first record after the restore < 100 ms "
           "with 1M keys: median %.1f ms, %s\n", first_record_ms_1m,
           met ? "met" : "NOT met");
    bench_json_bool(json, "target_1m_first_record_under_100ms", met);
  }
  growth_target(json, first_record_ms_10k, first_record_ms_1m);
  return rc;
}

int main(int argc, char **argv) {
  sl_log_set_handler(sl_log_stderr, NULL); /* the library is silent unless asked */
  bool quick = false;
  int repeat = 5;
  uint64_t only_keys = 0;
  const char *json_path = "bench/results/recovery_bench.json";
  const char *dir = "/tmp/sluice-recovery-bench";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : 0;
    int used = bench_run_option(a, v, &quick, &repeat, 3, &json_path, &dir);
    if (used)
      i += used - 1;
    else if (strcmp(a, "--keys") == 0 && v &&
             bench_parse_count(v, 1000, &only_keys) == 0 && only_keys > 0)
      i++;
    else if (strcmp(a, "--verbose") == 0)
      verbose = true;
    else {
      usage();
      return 2;
    }
  }
  if (repeat < 1 || repeat > MAX_REPEAT) {
    fprintf(stderr, "recovery_bench: --repeat must be 1..%d\n", MAX_REPEAT);
    return 2;
  }
  uint64_t sizes[3];
  int repeats[3];
  int count = plan(quick, repeat, only_keys, sizes, repeats);
  bench_json json;
  if (bench_json_create(&json, "recovery_bench", json_path) != 0)
    return 1;
  json_settings(&json);
  int rc = run_all(&json, count, sizes, repeats, dir);
  int written = bench_json_finish(&json, "recovery_bench", json_path);
  fresh_dir(dir);
  rmdir(dir);
  return rc ? rc : written != 0;
}
