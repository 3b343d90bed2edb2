/* pipeline_p3.c — benchmark P3: 16-byte tuples {key = i % K, value = i},
 * i = 0 .. N-1 (default N = 50M, K = 10000), through
 *
 *     source -> key_by(key) -> count window of W tuples per key, summing
 *     the values -> sink
 *
 * The window is the built-in sl_op_window (SL_WINDOW_COUNT, size W,
 * default 1000) with an incremental 8-byte accumulator; each full window
 * emits {key, sum}.  A last, partial window never fires (sluice.h).  The
 * sink checks every window it receives against a closed form computed
 * here, independently of the engine: the m-th window (m = 0, 1, ..) of key
 * k holds that key's records j = mW .. mW + W - 1, whose values are
 * k + K j, so its sum is W k + K (W^2 m + W (W - 1) / 2) (modulo 2^64).
 * At the end each key must have had floor(n_k / W) windows, n_k being its
 * record count, and the number of windows must add up.  A mismatch fails
 * the benchmark (exit 1).
 *
 *   pipeline_p3 [--records N] [--keys K] [--window W] [--repeat R]
 *               [--quick] [--json PATH] [--parallelism P] [--series LIST]
 *               [--checkpoint-ms MS] [--ring-bytes B] [--batch N]
 *
 * Series (measured one run each in turn, R times, so drift on a shared
 * machine hits them alike; median, min and max M input tuples/s):
 *
 *   window        chain pinning (the default)
 *   window-rr     round-robin pinning
 *   window-cp     chains, checkpointing every --checkpoint-ms (default
 *                 1000) without fsync into a temporary directory (removed
 *                 after)
 *   window-p2     window with parallelism 2
 *   window-p2-rr  window-p2 with round-robin pinning
 *
 * P (--parallelism, default 1) is the parallelism of the window and of the
 * sink in the series without -p2; the source has one instance.  The time
 * of a run is sl_job_run(). *
 * CPU use of each run: the process's user + system time over sl_job_run()
 * (getrusage RUSAGE_SELF: every engine thread, the checkpoint writer
 * included, plus the main thread, which only waits) over the run's wall
 * time, i.e. the cores the run kept busy on average; and CPU seconds per
 * million tuples, which other load on a shared machine disturbs less than
 * the rate.  Both as median, min and max ("cpu_cores" and
 * "cpu_seconds_per_million_tuples" in each series of the JSON).
 */
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench_util.h"
#include "sluice.h"
#include "sluice_testing.h" /* unstable test helpers */

#define MAX_REPEAT 50

__extension__ typedef unsigned __int128 u128;

typedef struct series {
  const char *name;
  int pin_policy;
  bool checkpoint;
  int parallelism; /* of the keyed operator and the sink; 0: --parallelism */
  double rates[MAX_REPEAT];         /* input tuples/s of each run */
  uint64_t checkpoints[MAX_REPEAT]; /* completed checkpoints of each run */
  double cores[MAX_REPEAT]; /* CPU seconds / wall seconds of each run */
  double cpu_s_per_million[MAX_REPEAT]; /* CPU seconds per 1M tuples */
  int runs;
  bench_stats stats;
  bench_stats cpu_cores;
  bench_stats cpu_per_million;
} series;

/* What the sink instances found, merged in their close callbacks. */
typedef struct sink_result {
  pthread_mutex_t lock;
  uint64_t keys;
  uint64_t window;     /* W */
  uint64_t windows;    /* received */
  uint64_t wrong;      /* windows whose sum was not the closed form */
  uint64_t first_wrong_key;
  uint64_t *count;     /* per key: windows received */
} sink_result;

/* One sink instance's tallies (merged into sink_result at close). */
typedef struct sink_instance {
  sink_result *result;
  uint64_t windows;
  uint64_t wrong;
  uint64_t first_wrong_key;
  uint64_t *count;
} sink_instance;

/* ------------------------------------------------------------ operators */

static uint64_t tuple_key(void *user, const sl_record *in) {
  (void)user;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  return t.key;
}

static void acc_init(void *user, void *acc) {
  (void)user;
  memset(acc, 0, sizeof(uint64_t));
}

static void acc_add(void *user, void *acc, const sl_record *in) {
  (void)user;
  sl_tuple t;
  uint64_t sum;
  memcpy(&t, in->data, sizeof t);
  memcpy(&sum, acc, sizeof sum);
  sum += t.value;
  memcpy(acc, &sum, sizeof sum);
}

static int acc_emit(void *user, sl_ctx *ctx, uint64_t key,
                    const sl_window *window, const void *acc) {
  (void)user;
  (void)window;
  sl_tuple out = {.key = key};
  memcpy(&out.value, acc, sizeof out.value);
  return sl_emit(ctx, &out, sizeof out);
}

/* Sum of the m-th window of key k (see the top of the file). */
static uint64_t window_sum(uint64_t keys, uint64_t size, uint64_t k,
                           uint64_t m) {
  u128 indices = (u128)size * size * m + (u128)size * (size - 1) / 2;
  return (uint64_t)((u128)size * k + (u128)keys * indices);
}

static int sink_open(sl_ctx *ctx, void *user, void **instance_state) {
  sink_result *result = user;
  sink_instance *s = calloc(1, sizeof *s);
  if (s)
    s->count = calloc(result->keys, sizeof *s->count);
  if (!s || !s->count) {
    free(s);
    sl_ctx_fail(ctx, "sink: no memory for %" PRIu64 " keys", result->keys);
    return -ENOMEM;
  }
  s->result = result;
  *instance_state = s;
  return 0;
}

/* Check each window against the closed form as it arrives: a key's
 * windows reach its one sink instance in order. */
static int sink_process(sl_ctx *ctx, void *instance_state, int input,
                        const sl_record *in) {
  (void)input;
  sink_instance *s = instance_state;
  const sink_result *r = s->result;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  if (t.key >= r->keys) {
    sl_ctx_fail(ctx, "sink: key %" PRIu64 " out of range (keys %" PRIu64 ")",
                t.key, r->keys);
    return -EINVAL;
  }
  uint64_t m = s->count[t.key]++;
  if (t.value != window_sum(r->keys, r->window, t.key, m) &&
      s->wrong++ == 0)
    s->first_wrong_key = t.key;
  s->windows++;
  return 0;
}

static void sink_close(sl_ctx *ctx, void *instance_state) {
  (void)ctx;
  sink_instance *s = instance_state;
  sink_result *r = s->result;
  pthread_mutex_lock(&r->lock);
  r->windows += s->windows;
  if (s->wrong && r->wrong == 0)
    r->first_wrong_key = s->first_wrong_key;
  r->wrong += s->wrong;
  for (uint64_t k = 0; k < r->keys; k++)
    r->count[k] += s->count[k];
  pthread_mutex_unlock(&r->lock);
  free(s->count);
  free(s);
}

/* ------------------------------------------------------------ checks */

/* Check a run's sink result; prints the first mismatch. */
static bool check_result(const sink_result *r, uint64_t records) {
  if (r->wrong) {
    fprintf(stderr,
            "pipeline_p3: WRONG RESULT: %" PRIu64 " window sums differ from "
            "the closed form (the first for key %" PRIu64 ")\n",
            r->wrong, r->first_wrong_key);
    return false;
  }
  uint64_t expected_windows = 0;
  for (uint64_t k = 0; k < r->keys; k++) {
    uint64_t n = records / r->keys + (k < records % r->keys);
    expected_windows += n / r->window;
    if (r->count[k] != n / r->window) {
      fprintf(stderr,
              "pipeline_p3: WRONG RESULT: key %" PRIu64 ": %" PRIu64
              " windows, expected %" PRIu64 "\n", k, r->count[k],
              n / r->window);
      return false;
    }
  }
  if (r->windows != expected_windows) {
    fprintf(stderr,
            "pipeline_p3: WRONG RESULT: %" PRIu64 " windows, expected %" PRIu64
            "\n", r->windows, expected_windows);
    return false;
  }
  return true;
}

/* ------------------------------------------------------------ runs */

/* User + system CPU time of the whole process so far, in seconds: every
 * engine thread, plus the main thread, which only waits in sl_job_run(). */
static double cpu_now_s(void) {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return (double)usage.ru_utime.tv_sec + (double)usage.ru_utime.tv_usec / 1e6 +
         (double)usage.ru_stime.tv_sec + (double)usage.ru_stime.tv_usec / 1e6;
}

typedef struct options {
  uint64_t records;
  uint64_t keys;
  uint64_t window;
  int repeat;
  int parallelism;
  uint32_t checkpoint_ms;
  const char *json;
  sl_job_config config; /* ring and batch settings from the command line */
} options;

static int remove_entry(const char *path, const struct stat *st, int flag,
                        struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path) == 0 ? 0 : errno;
}

static uint64_t completed_checkpoints(const sl_job *job) {
  uint64_t completed = 0;
  sl_checkpoint_stats stats;
  for (int k = 0; sl_job_checkpoint_stats(job, k, &stats) == 0; k++)
    completed += stats.status == SL_CHECKPOINT_COMPLETED;
  return completed;
}

/* Build and run the job once; check its result.  Returns input tuples/s,
 * or a negative value (after printing why) on failure. */
static double run_once(const options *o, const series *s,
                       sink_result *result, uint64_t *checkpoints,
                       double *cpu_s) {
  sl_job_config config = o->config;
  config.pin_policy = s->pin_policy;
  int parallelism = s->parallelism ? s->parallelism : o->parallelism;
  char dir[] = "/tmp/sluice-p3-XXXXXX";
  if (s->checkpoint) {
    if (!mkdtemp(dir)) {
      perror("pipeline_p3: mkdtemp");
      return -1;
    }
    config.checkpoint.state_dir = dir;
    config.checkpoint.interval_ms = o->checkpoint_ms;
    config.checkpoint.no_sync = 1;
    config.checkpoint.store_policy = SL_STORE_FRESH;
  }
  result->windows = result->wrong = result->first_wrong_key = 0;
  memset(result->count, 0, result->keys * sizeof *result->count);
  const sl_window_config window = {.type = SL_WINDOW_COUNT,
                                   .size = (int64_t)o->window,
                                   .acc_bytes = sizeof(uint64_t),
                                   .init = acc_init,
                                   .add = acc_add,
                                   .emit = acc_emit};
  static const sl_process_ops sink_ops = {
      .open = sink_open, .process = sink_process, .close = sink_close};
  sl_job *job = 0;
  sl_op *src, *keyed, *windows, *sink;
  config.struct_bytes = sizeof config; /* sluice.h ABI */
  int rc = sl_job_create(&config, &job);
  if (!rc)
    rc = sl_source_sequence(job, "source", 1, o->records, o->keys, &src);
  if (!rc)
    rc = sl_op_key_by(job, "by-key", src, tuple_key, 0, &keyed);
  if (!rc)
    rc = sl_op_window(job, "count-window", keyed, parallelism, &window,
                      &windows);
  if (!rc)
    rc = sl_op_sink(job, "sink", windows, parallelism, &sink_ops, result,
                    &sink);
  double cpu0_s = cpu_now_s();
  uint64_t start_ns = bench_now_ns();
  if (!rc)
    rc = sl_job_run(job);
  uint64_t elapsed_ns = bench_now_ns() - start_ns;
  *cpu_s = cpu_now_s() - cpu0_s;
  if (rc)
    fprintf(stderr, "pipeline_p3: %s: %s: %s\n", s->name, sl_strerror(rc),
            job ? sl_job_error(job) : "");
  *checkpoints = job && s->checkpoint ? completed_checkpoints(job) : 0;
  sl_job_destroy(job);
  if (s->checkpoint)
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  if (rc || !check_result(result, o->records))
    return -1;
  return (double)o->records / ((double)elapsed_ns / 1e9);
}

/* ------------------------------------------------------------ output */

static void print_table(const options *o, series *all, int count) {
  printf("P3 source -> key_by -> count window (%" PRIu64 ", sum) -> sink, %"
         PRIu64 " tuples, %" PRIu64 " keys, parallelism %d (-p2: 2), %d runs "
         "each\n", o->window, o->records, o->keys, o->parallelism, o->repeat);
  printf("  %-13s %10s %10s %10s %18s %8s  (M input tuples/s); CPU: median "
         "cores busy [min-max], CPU s per 1M tuples\n", "series", "median", "min",
         "max", "cores", "CPU s/M");
  const series *plain = 0, *checkpointed = 0;
  for (int i = 0; i < count; i++) {
    printf("  %-13s %10.1f %10.1f %10.1f %6.2f [%4.2f-%4.2f] %8.4f",
           all[i].name, all[i].stats.median / 1e6, all[i].stats.min / 1e6,
           all[i].stats.max / 1e6, all[i].cpu_cores.median,
           all[i].cpu_cores.min, all[i].cpu_cores.max,
           all[i].cpu_per_million.median);
    if (all[i].checkpoint)
      printf("   (checkpoints completed in the last run: %" PRIu64
             ", every %" PRIu32 " ms, no fsync)",
             all[i].checkpoints[all[i].runs - 1], o->checkpoint_ms);
    printf("\n");
    if (strcmp(all[i].name, "window") == 0)
      plain = &all[i];
    if (strcmp(all[i].name, "window-cp") == 0)
      checkpointed = &all[i];
  }
  if (plain && checkpointed)
    printf("  ratio window-cp / window (medians): %.2f\n",
           checkpointed->stats.median / plain->stats.median);
  printf("  target: >= 65 M tuples/s; WindFlow best config here: median 32\n");
}

/* One series: the keys bench_json_series_begin() (bench_util.h) writes,
 * then its CPU use: "cpu_cores" (CPU seconds / wall seconds) and
 * "cpu_seconds_per_million_tuples", each {median, min, max}. */
static void json_series(bench_json *json, const options *o, const series *s) {
  bench_json_series_begin(
      json, s->name,
      (uint64_t)(s->parallelism ? s->parallelism : o->parallelism), &s->stats,
      s->rates, s->runs, s->checkpoint ? o->checkpoint_ms : 0, s->checkpoints);
  bench_json_stats(json, "cpu_cores", s->cpu_cores);
  bench_json_stats(json, "cpu_seconds_per_million_tuples", s->cpu_per_million);
  bench_json_end_object(json);
}

static int write_json(const options *o, series *all, int count) {
  bench_json json;
  int rc = bench_json_open(&json, o->json);
  if (rc) {
    fprintf(stderr, "pipeline_p3: %s: %s\n", o->json, strerror(rc));
    return rc;
  }
  bench_json_begin_object(&json, 0);
  bench_json_string(&json, "benchmark", "pipeline_p3");
  bench_json_u64(&json, "records", o->records);
  bench_json_u64(&json, "keys", o->keys);
  bench_json_u64(&json, "window", o->window);
  bench_json_u64(&json, "parallelism", (uint64_t)o->parallelism);
  bench_json_u64(&json, "repeat", (uint64_t)o->repeat);
  bench_json_string(&json, "unit", "input_tuples_per_second");
  bench_json_machine(&json);
  bench_json_begin_array(&json, "series");
  for (int i = 0; i < count; i++)
    json_series(&json, o, &all[i]);
  bench_json_end_array(&json);
  bench_json_end_object(&json);
  rc = bench_json_close(&json);
  if (rc)
    fprintf(stderr, "pipeline_p3: %s: %s\n", o->json, strerror(rc));
  else
    printf("  written: %s\n", o->json);
  return rc;
}

/* ------------------------------------------------------------ main */

static const series series_known[] = {
    {.name = "window", .pin_policy = SL_PIN_CHAINS},
    {.name = "window-rr", .pin_policy = SL_PIN_ROUND_ROBIN},
    {.name = "window-cp", .pin_policy = SL_PIN_CHAINS, .checkpoint = true},
    {.name = "window-p2", .pin_policy = SL_PIN_CHAINS, .parallelism = 2},
    {.name = "window-p2-rr", .pin_policy = SL_PIN_ROUND_ROBIN,
     .parallelism = 2},
};
#define SERIES_KNOWN (int)(sizeof series_known / sizeof series_known[0])

/* Fill chosen[] from a comma-separated list of series names.  Returns the
 * count, or -1 (after printing why) for an unknown or repeated name. */
static int parse_series(const char *list, series *chosen) {
  int count = 0;
  const char *at = list;
  while (*at) {
    size_t length = strcspn(at, ",");
    int found = -1;
    for (int i = 0; i < SERIES_KNOWN; i++)
      if (strlen(series_known[i].name) == length &&
          strncmp(series_known[i].name, at, length) == 0)
        found = i;
    for (int i = 0; found >= 0 && i < count; i++)
      if (strcmp(chosen[i].name, series_known[found].name) == 0)
        found = -1;
    if (found < 0) {
      fprintf(stderr, "pipeline_p3: unknown or repeated series '%.*s'\n",
              (int)length, at);
      return -1;
    }
    chosen[count++] = series_known[found];
    at += length;
    if (*at == ',')
      at++;
  }
  return count;
}

static int usage(void) {
  fprintf(stderr,
          "usage: pipeline_p3 [--records N] [--keys K] [--window W] "
          "[--repeat R] [--quick]\n"
          "                   [--json PATH] [--parallelism P] [--series LIST]\n"
          "                   [--checkpoint-ms MS] [--ring-bytes B] "
          "[--batch N]\n"
          "  series: comma-separated of window, window-rr, window-cp,\n"
          "          window-p2, window-p2-rr (default: all)\n");
  return 2;
}

/* Parse the command line into o and chosen[]; returns the series count, or
 * -1 after printing the usage. */
static int parse_args(int argc, char **argv, options *o, series *chosen) {
  const char *list = "window,window-rr,window-cp,window-p2,window-p2-rr";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : 0;
    uint64_t n = 0;
    bool has_value = v != 0 && bench_parse_count(v, 1000, &n) == 0;
    if (strcmp(a, "--quick") == 0) {
      o->records = 5000000;
      o->repeat = 3;
      continue;
    }
    if (strcmp(a, "--json") == 0 && v)
      o->json = v;
    else if (strcmp(a, "--series") == 0 && v)
      list = v;
    else if (strcmp(a, "--records") == 0 && has_value && n > 0)
      o->records = n;
    else if (strcmp(a, "--keys") == 0 && has_value && n > 0 && n <= 1u << 26)
      o->keys = n;
    else if (strcmp(a, "--window") == 0 && has_value && n > 0 &&
             n <= 1u << 30)
      o->window = n;
    else if (strcmp(a, "--repeat") == 0 && has_value && n >= 1 &&
             n <= MAX_REPEAT)
      o->repeat = (int)n;
    else if (strcmp(a, "--parallelism") == 0 && has_value && n >= 1 &&
             n <= SL_MAX_PARALLELISM)
      o->parallelism = (int)n;
    else if (strcmp(a, "--checkpoint-ms") == 0 && has_value && n >= 1 &&
             n <= UINT32_MAX)
      o->checkpoint_ms = (uint32_t)n;
    else if (strcmp(a, "--ring-bytes") == 0 && has_value)
      o->config.ring_bytes = n;
    else if (strcmp(a, "--batch") == 0 && has_value && n <= UINT32_MAX)
      o->config.output_batch_records = (uint32_t)n;
    else
      return usage(), -1;
    i++;
  }
  int count = parse_series(list, chosen);
  if (count == 0)
    fprintf(stderr, "pipeline_p3: no series chosen\n");
  return count > 0 ? count : (usage(), -1);
}

int main(int argc, char **argv) {
  options o = {.records = 50000000,
               .keys = 10000,
               .window = 1000,
               .repeat = 5,
               .parallelism = 1,
               .checkpoint_ms = 1000,
               .json = "bench/results/pipeline_p3.json"};
  series all[SERIES_KNOWN];
  int count = parse_args(argc, argv, &o, all);
  if (count < 0)
    return 2;
  sink_result result = {.lock = PTHREAD_MUTEX_INITIALIZER,
                        .keys = o.keys,
                        .window = o.window};
  result.count = calloc(o.keys, sizeof *result.count);
  if (!result.count) {
    fprintf(stderr, "pipeline_p3: no memory for %" PRIu64 " keys\n", o.keys);
    return 1;
  }
  int status = 0;
  for (int r = 0; r < o.repeat && status == 0; r++) {
    /* One run of each series in turn (see the top of the file). */
    for (int i = 0; i < count && status == 0; i++) {
      uint64_t checkpoints = 0;
      double cpu_s = 0;
      double rate = run_once(&o, &all[i], &result, &checkpoints, &cpu_s);
      if (rate < 0) {
        status = 1;
        break;
      }
      /* cpu_s / wall seconds, the wall time being records / rate */
      all[i].cores[all[i].runs] = cpu_s * rate / (double)o.records;
      all[i].cpu_s_per_million[all[i].runs] =
          cpu_s / ((double)o.records / 1e6);
      all[i].rates[all[i].runs] = rate;
      all[i].checkpoints[all[i].runs] = checkpoints;
      all[i].runs++;
    }
  }
  if (status == 0) {
    for (int i = 0; i < count; i++) {
      size_t runs = (size_t)all[i].runs;
      all[i].stats = bench_stats_of(all[i].rates, runs);
      all[i].cpu_cores = bench_stats_of(all[i].cores, runs);
      all[i].cpu_per_million = bench_stats_of(all[i].cpu_s_per_million, runs);
    }
    print_table(&o, all, count);
    if (write_json(&o, all, count) != 0)
      status = 1;
  }
  free(result.count);
  return status;
}
