/* checkpoint_bench.c — what checkpoints cost: throughput overhead, the
 * synchronous part of snapshots, checkpoint duration and restore time.
 *
 *   checkpoint_bench [--quick] [--repeat R] [--json PATH] [--dir DIR]
 *                    [--only 1|2|3]   (3: duration and restore)
 *
 * The job everywhere: source -> key_by -> count (running count per key in
 * keyed state) -> sink (discards), one instance each, 16-byte tuples.
 *
 * 1. overhead: 1M keys, checkpoints off / every 100 ms / every 10 ms (fsync
 *    on commit, the default), runs interleaved, R of each; tuples/s medians
 *    and their ratios to "off".  Targets: >= 0.95 and >= 0.90.
 * 2. sync: the synchronous part of every snapshot (every instance, from the
 *    checkpoint statistics) with 10K, 1M and 10M keys of state (quick: 10K,
 *    100K, 1M), checkpoints every 10 ms; p50, p99, max.  Target: p99 <= 50 us
 *    whatever the size.
 * 3. duration: a 1M-key state, then rounds that each change 100K distinct
 *    keys and trigger a checkpoint; trigger-to-durable-commit p50 and p99.
 *    Target: p50 <= 50 ms.
 * 4. restore: resuming the 1M-key state (sl_job_start, which restores before
 *    any thread runs); median of R.  Target: <= 200 ms.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "sluice.h"

#define MAX_REPEAT 50

/* jemalloc reads this at start-up: back the heap with transparent huge
 * pages (on this VM, a page fault costs about 10 us, and a 1M-key state is
 * a million small allocations; restoring one runs about 1.5x faster).  The
 * library leaves allocator settings to the program that embeds it; without
 * jemalloc this is an unused variable. */
const char *malloc_conf = "thp:always,metadata_thp:auto";
#define UPDATE_STRIDE 7919u /* prime, coprime with the key counts used */

static uint64_t tuple_key(void *user, const sl_record *in) {
  (void)user;
  uint64_t key;
  memcpy(&key, in->data, sizeof key);
  return key;
}

static int count_process(sl_ctx *ctx, void *state, int input,
                         const sl_record *in) {
  (void)state;
  (void)input;
  (void)in;
  const void *value;
  uint32_t bytes;
  uint64_t count = 0;
  if (sl_state_get(ctx, 0, &value, &bytes) == 0)
    memcpy(&count, value, sizeof count);
  count++;
  int rc = sl_state_put(ctx, 0, &count, sizeof count, 0);
  return rc ? rc : sl_emit(ctx, &count, sizeof count);
}

static int discard(sl_ctx *ctx, void *state, int input, const sl_record *in) {
  (void)ctx;
  (void)state;
  (void)input;
  (void)in;
  return 0;
}

/* A source that emits only as many records as main allows: first the keys
 * 0..keys-1, then windows of distinct keys spread by UPDATE_STRIDE. */
typedef struct phased {
  uint64_t keys;
  _Atomic uint64_t allowed;
  uint64_t emitted;
} phased;

static int phased_open(sl_ctx *ctx, void *user, void **state) {
  (void)ctx;
  *state = user;
  return 0;
}

static int phased_next(sl_ctx *ctx, void *state) {
  phased *p = state;
  uint64_t allowed = atomic_load(&p->allowed);
  if (allowed == UINT64_MAX)
    return SL_SOURCE_END;
  if (p->emitted >= allowed) {
    usleep(50);
    return 0;
  }
  sl_tuple run[256];
  uint32_t n = 0;
  for (; n < 256 && p->emitted < allowed; n++, p->emitted++) {
    uint64_t i = p->emitted;
    run[n].key = i < p->keys ? i : (i - p->keys) * UPDATE_STRIDE % p->keys;
    run[n].value = i;
  }
  return sl_emit_batch(ctx, run, sizeof run[0], n);
}

static int phased_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  phased *p = state;
  return sl_operator_state_set(ctx, &p->emitted, sizeof p->emitted);
}

static int phased_restore(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  phased *p = state;
  const void *data;
  uint32_t bytes;
  if (sl_operator_state_get(ctx, &data, &bytes) == 0 && bytes == 8)
    memcpy(&p->emitted, data, 8);
  return 0;
}

/* Build source -> key_by -> count -> discard.  phase NULL: a sequence
 * source of records tuples over keys keys. */
static sl_job *build(const sl_job_config *config, uint64_t records,
                     uint64_t keys, phased *phase) {
  sl_job *job;
  if (sl_job_create(config, &job))
    return 0;
  sl_op *src, *by, *count, *sink;
  static const sl_source_ops phased_ops = {.open = phased_open,
                                           .next = phased_next,
                                           .snapshot = phased_snapshot,
                                           .restore = phased_restore};
  static const sl_process_ops count_ops = {.process = count_process};
  static const sl_process_ops sink_ops = {.process = discard};
  int rc = phase ? sl_op_source(job, "source", 1, &phased_ops, phase, &src)
                 : sl_source_sequence(job, "source", 1, records, keys, &src);
  if (!rc)
    rc = sl_op_key_by(job, "by-key", src, tuple_key, 0, &by);
  if (!rc)
    rc = sl_op_process(job, "count", &by, 1, 1, &count_ops, 0, &count);
  if (!rc)
    rc = sl_op_sink(job, "sink", count, 1, &sink_ops, 0, &sink);
  if (rc) {
    fprintf(stderr, "checkpoint_bench: build: %s\n", sl_strerror(rc));
    sl_job_destroy(job);
    return 0;
  }
  return job;
}

static void fresh_dir(const char *dir) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
  if (system(cmd) != 0)
    fprintf(stderr, "checkpoint_bench: cannot reset %s\n", dir);
}

/* ------------------------------------------------------------ 1. overhead */

static double run_throughput(const char *dir, uint32_t interval_ms,
                             uint64_t records, uint64_t keys,
                             uint64_t *checkpoints) {
  sl_job_config config = {0};
  if (interval_ms) {
    fresh_dir(dir);
    config.checkpoint.state_dir = dir;
    config.checkpoint.interval_ms = interval_ms;
  }
  sl_job *job = build(&config, records, keys, 0);
  if (!job)
    return -1;
  uint64_t t0 = bench_now_ns();
  int rc = sl_job_run(job);
  double seconds = (double)(bench_now_ns() - t0) / 1e9;
  *checkpoints = sl_job_last_checkpoint(job, 0);
  if (rc)
    fprintf(stderr, "checkpoint_bench: %s\n", sl_job_error(job));
  sl_job_destroy(job);
  return rc ? -1 : (double)records / seconds;
}

static int overhead(bench_json *json, const char *dir, int repeat,
                    uint64_t records) {
  static const uint32_t intervals[3] = {0, 100, 10};
  double rates[3][MAX_REPEAT];
  uint64_t checkpoints[3][MAX_REPEAT];
  const uint64_t keys = 1000000;
  for (int r = 0; r < repeat; r++)
    for (int k = 0; k < 3; k++) { /* interleaved: drift hits all alike */
      rates[k][r] = run_throughput(dir, intervals[k], records, keys,
                                   &checkpoints[k][r]);
      if (rates[k][r] < 0)
        return 1;
    }
  printf("1. overhead: %" PRIu64 " tuples over 1M keys, %d runs each "
         "(M tuples/s)\n", records, repeat);
  printf("   %-22s %8s %8s %8s %8s %12s\n", "checkpoints", "median", "min",
         "max", "ratio", "checkpoints");
  bench_stats off = bench_stats_of(rates[0], (size_t)repeat);
  bench_json_begin_array(json, "overhead");
  for (int k = 0; k < 3; k++) {
    bench_stats s = bench_stats_of(rates[k], (size_t)repeat);
    double cps[MAX_REPEAT];
    for (int r = 0; r < repeat; r++)
      cps[r] = (double)checkpoints[k][r];
    char name[32];
    snprintf(name, sizeof name, k ? "every %u ms" : "off", intervals[k]);
    printf("   %-22s %8.2f %8.2f %8.2f %8.3f %12.0f\n", name, s.median / 1e6,
           s.min / 1e6, s.max / 1e6, s.median / off.median,
           bench_stats_of(cps, (size_t)repeat).median);
    bench_json_begin_object(json, 0);
    bench_json_u64(json, "interval_ms", intervals[k]);
    bench_json_stats(json, "tuples_per_second", s);
    bench_json_double(json, "ratio_to_off", s.median / off.median);
    bench_json_stats(json, "checkpoints_per_run",
                     bench_stats_of(cps, (size_t)repeat));
    bench_json_end_object(json);
  }
  bench_json_end_array(json);
  printf("   targets: every 100 ms >= 0.95 of off, every 10 ms >= 0.90\n");
  return 0;
}

/* ------------------------------------------------------------ 2. sync */

static int sync_part(bench_json *json, const char *dir, bool quick) {
  uint64_t sizes[3] = {10000, 1000000, 10000000};
  if (quick)
    sizes[1] = 100000, sizes[2] = 1000000;
  printf("2. synchronous part of snapshots, checkpoints every 10 ms (us)\n");
  printf("   %-12s %8s %8s %8s %8s %10s\n", "keys", "samples", "p50", "p99",
         "max", "checkpoints");
  bench_json_begin_array(json, "sync_part");
  for (int s = 0; s < 3; s++) {
    fresh_dir(dir);
    sl_job_config config = {0};
    config.checkpoint.state_dir = dir;
    config.checkpoint.interval_ms = 10;
    config.checkpoint.no_sync = 1; /* the sync part is what is measured */
    /* Each key written three times, and at least 3M records, so a small
     * state still sees dozens of checkpoints. */
    uint64_t records = sizes[s] * 3 > 3000000 ? sizes[s] * 3 : 3000000;
    sl_job *job = build(&config, records, sizes[s], 0);
    if (!job || sl_job_run(job) != 0) {
      fprintf(stderr, "checkpoint_bench: %s\n", job ? sl_job_error(job) : "");
      sl_job_destroy(job);
      return 1;
    }
    uint64_t samples[64 * 8];
    size_t n = 0;
    int completed = 0;
    sl_checkpoint_stats cs;
    for (int k = 0; sl_job_checkpoint_stats(job, k, &cs) == 0; k++) {
      completed += cs.status == SL_CHECKPOINT_COMPLETED;
      for (int i = 0; i < cs.instance_count && n < 64 * 8; i++) {
        sl_checkpoint_instance_stats is;
        if (sl_job_checkpoint_instance_stats(job, k, i, &is) == 0 &&
            cs.status == SL_CHECKPOINT_COMPLETED)
          samples[n++] = is.sync_us;
      }
    }
    sl_job_destroy(job);
    if (n == 0) {
      fprintf(stderr, "checkpoint_bench: no checkpoint completed\n");
      return 1;
    }
    bench_sort_u64(samples, n);
    uint64_t p50 = bench_percentile_sorted_u64(samples, n, 0.5);
    uint64_t p99 = bench_percentile_sorted_u64(samples, n, 0.99);
    printf("   %-12" PRIu64 " %8zu %8" PRIu64 " %8" PRIu64 " %8" PRIu64
           " %10d\n", sizes[s], n, p50, p99, samples[n - 1], completed);
    bench_json_begin_object(json, 0);
    bench_json_u64(json, "keys", sizes[s]);
    bench_json_u64(json, "samples", n);
    bench_json_u64(json, "p50_us", p50);
    bench_json_u64(json, "p99_us", p99);
    bench_json_u64(json, "max_us", samples[n - 1]);
    bench_json_end_object(json);
  }
  bench_json_end_array(json);
  printf("   target: p99 <= 50 us at every size\n");
  return 0;
}

/* ------------------------------------------------ 3. duration, 4. restore */

static uint64_t count_records_in(sl_job *job) {
  sl_op_stats st;
  return sl_job_stats(job, 1, &st) == 0 ? st.records_in : 0;
}

static bool wait_for(sl_job *job, uint64_t processed, uint64_t checkpoint) {
  for (int i = 0; i < 600000; i++) { /* at most 60 s */
    if (count_records_in(job) >= processed &&
        sl_job_last_checkpoint(job, 0) >= checkpoint)
      return true;
    usleep(100);
  }
  return false;
}

/* Trigger one checkpoint once everything allowed is processed; wait until it
 * is durable.  Returns its statistics' index-0 entry. */
static int checkpoint_now(sl_job *job, uint64_t processed,
                          sl_checkpoint_stats *cs) {
  if (!wait_for(job, processed, 0))
    return 1;
  uint64_t id = 0;
  if (sl_job_trigger_checkpoint(job, &id) != 0 || !wait_for(job, 0, id))
    return 1;
  return sl_job_checkpoint_stats(job, 0, cs);
}

static int duration_and_restore(bench_json *json, const char *dir,
                                int repeat, bool quick) {
  const uint64_t keys = 1000000, changed = 100000;
  int rounds = quick ? 10 : 40;
  fresh_dir(dir);
  sl_job_config config = {0};
  config.checkpoint.state_dir = dir;
  config.checkpoint.interval_ms = 3600000; /* only the triggers below */
  phased phase = {.keys = keys};
  atomic_store(&phase.allowed, keys);
  sl_job *job = build(&config, 0, keys, &phase);
  if (!job || sl_job_start(job) != 0)
    return 1;
  sl_checkpoint_stats cs;
  double durations_ms[MAX_REPEAT], writes_ms[MAX_REPEAT];
  uint64_t entries = 0;
  int rc = checkpoint_now(job, keys, &cs); /* the initial 1M keys */
  double initial_ms = (double)cs.duration_us / 1e3;
  for (int r = 0; rc == 0 && r < rounds && r < MAX_REPEAT; r++) {
    atomic_fetch_add(&phase.allowed, changed);
    rc = checkpoint_now(job, keys + (uint64_t)(r + 1) * changed, &cs);
    durations_ms[r] = (double)cs.duration_us / 1e3;
    writes_ms[r] = (double)cs.write_us / 1e3;
    entries = cs.entries_persisted;
  }
  sl_job_stop(job);
  sl_job_wait(job);
  sl_job_destroy(job);
  if (rc) {
    fprintf(stderr, "checkpoint_bench: a checkpoint did not complete\n");
    return 1;
  }
  bench_stats d = bench_stats_of(durations_ms, (size_t)rounds);
  bench_stats w = bench_stats_of(writes_ms, (size_t)rounds);
  printf("3. checkpoint duration, 100K changed keys of 1M, fsync on commit, "
         "%d rounds (ms)\n", rounds);
  printf("   trigger to durable: median %.1f  min %.1f  max %.1f; of which "
         "the write: median %.1f\n", d.median, d.min, d.max, w.median);
  printf("   entries written per checkpoint: %" PRIu64 "; first checkpoint "
         "(all 1M keys): %.1f ms\n", entries, initial_ms);
  printf("   target: median <= 50 ms\n");
  bench_json_begin_object(json, "duration");
  bench_json_u64(json, "state_keys", keys);
  bench_json_u64(json, "changed_keys", changed);
  bench_json_u64(json, "entries_per_checkpoint", entries);
  bench_json_stats(json, "trigger_to_durable_ms", d);
  bench_json_stats(json, "write_ms", w);
  bench_json_double(json, "initial_full_checkpoint_ms", initial_ms);
  bench_json_end_object(json);

  double restore_ms[MAX_REPEAT];
  for (int r = 0; r < repeat; r++) {
    config.checkpoint.store_policy = SL_STORE_RESUME;
    phased again = {.keys = keys};
    atomic_store(&again.allowed, 0); /* hold: emit nothing new */
    job = build(&config, 0, keys, &again);
    uint64_t t0 = bench_now_ns();
    int started = job ? sl_job_start(job) : 1;
    restore_ms[r] = (double)(bench_now_ns() - t0) / 1e6;
    if (started) {
      fprintf(stderr, "checkpoint_bench: resume: %s\n",
              job ? sl_job_error(job) : "");
      sl_job_destroy(job);
      return 1;
    }
    sl_job_stop(job);
    sl_job_wait(job);
    sl_job_destroy(job);
  }
  bench_stats rs = bench_stats_of(restore_ms, (size_t)repeat);
  printf("4. restore of the 1M-key state (sl_job_start with resume), %d runs: "
         "median %.1f ms, min %.1f, max %.1f; target <= 200 ms\n",
         repeat, rs.median, rs.min, rs.max);
  bench_json_stats(json, "restore_1m_keys_ms", rs);
  return 0;
}

int main(int argc, char **argv) {
  bool quick = false;
  int repeat = 5;
  const char *json_path = "bench/results/checkpoint_bench.json";
  const char *dir = "/tmp/sluice-checkpoint-bench";
  int only = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : 0;
    if (strcmp(a, "--quick") == 0)
      quick = true, repeat = 3;
    else if (strcmp(a, "--repeat") == 0 && v)
      repeat = atoi(v), i++;
    else if (strcmp(a, "--json") == 0 && v)
      json_path = v, i++;
    else if (strcmp(a, "--dir") == 0 && v)
      dir = v, i++;
    else if (strcmp(a, "--only") == 0 && v)
      only = atoi(v), i++;
    else {
      fprintf(stderr, "usage: checkpoint_bench [--quick] [--repeat R] "
                      "[--json PATH] [--dir DIR] [--only 1|2|3]\n");
      return 2;
    }
  }
  if (repeat < 1 || repeat > MAX_REPEAT) {
    fprintf(stderr, "checkpoint_bench: --repeat must be 1..%d\n", MAX_REPEAT);
    return 2;
  }
  bench_json json;
  if (bench_json_open(&json, json_path) != 0) {
    perror(json_path);
    return 1;
  }
  bench_json_begin_object(&json, 0);
  bench_json_string(&json, "benchmark", "checkpoint_bench");
  bench_json_machine(&json);
  bench_json_u64(&json, "repeat", (uint64_t)repeat);
  int rc = 0;
  if (!only || only == 1)
    rc = overhead(&json, dir, repeat, quick ? 5000000 : 30000000);
  if (rc == 0 && (!only || only == 2))
    rc = sync_part(&json, dir, quick);
  if (rc == 0 && (!only || only == 3))
    rc = duration_and_restore(&json, dir, repeat, quick);
  bench_json_end_object(&json);
  bench_json_close(&json);
  fresh_dir(dir);
  rmdir(dir);
  printf("written: %s\n", json_path);
  return rc;
}
