/* pipeline_p2.c — benchmark P2: 16-byte tuples {key = i % K, value = i},
 * i = 0 .. N-1 (default N = 50M, K = 10000), through
 *
 *     source -> key_by(key) -> running sum per key -> sink
 *
 * The running-sum operator keeps the key's sum in keyed state and emits
 * {key, sum} for every input.  The sink counts what it receives and keeps,
 * per key, the number of records and the last sum; at the end every run is
 * checked against closed forms computed here, independently of the engine:
 * the record count N, per key k the count n_k and the final sum
 * S_k = n_k k + K n_k (n_k - 1) / 2, and the total of every emitted sum,
 * sum over k of k n_k (n_k + 1) / 2 + K (n_k + 1) n_k (n_k - 1) / 6 (all
 * modulo 2^64).  A mismatch fails the benchmark (exit 1).
 *
 *   pipeline_p2 [--records N] [--keys K] [--repeat R] [--quick]
 *               [--json PATH] [--parallelism P] [--series LIST]
 *               [--checkpoint-ms MS] [--ring-bytes B] [--batch N]
 *
 * Several configurations ("series") are measured in one process, one run
 * of each in turn, R times, so drift on a shared machine hits them alike;
 * each is reported as median, min and max M tuples/s.  The series differ in
 * how the operator reaches its state, and in pinning and checkpointing:
 *
 *   update        sl_state_update(): one lookup, the sum updated in place
 *   get-put       sl_state_get() then sl_state_put(): two lookups
 *   fold          sl_state_fold() with an adding fold function
 *   update-rr     update, with round-robin pinning instead of chains
 *   update-cp     update, checkpointing every --checkpoint-ms (default
 *                 1000) without fsync into a temporary directory (removed
 *                 after)
 *   update-p2     update with parallelism 2
 *   update-p2-rr  update-p2 with round-robin pinning
 *
 * P (--parallelism, default 1) is the parallelism of the running sum and
 * of the sink in the series without -p2; the source has one instance.  The
 * time of a run is sl_job_run(), from the start of the threads to the last
 * record at the sink (and, for update-cp, the final checkpoint). *
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
#define STATE_SUM 0 /* state id of the running sum */

__extension__ typedef unsigned __int128 u128;

/* How the running sum reaches its keyed state. */
enum state_mode { MODE_UPDATE, MODE_GET_PUT, MODE_FOLD };

typedef struct series {
  const char *name;
  enum state_mode mode;
  int pin_policy;
  bool checkpoint;
  int parallelism; /* of the keyed operator and the sink; 0: --parallelism */
  double rates[MAX_REPEAT]; /* tuples/s of each run */
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
  uint64_t records;
  uint64_t sum_total;  /* of every emitted sum, modulo 2^64 */
  uint64_t *count;     /* per key: records received */
  uint64_t *last_sum;  /* per key: the last sum received */
  bool bad_key;        /* a record with key >= keys arrived */
} sink_result;

/* One sink instance's tallies (merged into sink_result at close). */
typedef struct sink_instance {
  sink_result *result;
  uint64_t records;
  uint64_t sum_total;
  uint64_t *count;
  uint64_t *last_sum;
} sink_instance;

/* ------------------------------------------------------------ operators */

static uint64_t tuple_key(void *user, const sl_record *in) {
  (void)user;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  return t.key;
}

static int sum_open(sl_ctx *ctx, void *user, void **instance_state) {
  (void)ctx;
  *instance_state = user; /* the series' mode: read-only, shared */
  return 0;
}

static void fold_add(void *user, void *acc, const void *value,
                     uint32_t value_bytes) {
  (void)user;
  (void)value_bytes;
  uint64_t sum, add;
  memcpy(&sum, acc, sizeof sum);
  memcpy(&add, value, sizeof add);
  sum += add;
  memcpy(acc, &sum, sizeof sum);
}

/* The running sum: add the value to the key's sum, emit {key, sum}. */
static int sum_process(sl_ctx *ctx, void *instance_state, int input,
                       const sl_record *in) {
  (void)input;
  const enum state_mode *mode = instance_state;
  static const uint64_t zero = 0;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  uint64_t sum = 0;
  int rc;
  if (*mode == MODE_UPDATE) {
    void *value;
    rc = sl_state_update(ctx, STATE_SUM, sizeof sum, &zero, &value);
    if (rc == 0) {
      memcpy(&sum, value, sizeof sum);
      sum += t.value;
      memcpy(value, &sum, sizeof sum);
    }
  } else if (*mode == MODE_GET_PUT) {
    const void *value;
    uint32_t bytes = 0;
    rc = sl_state_get(ctx, STATE_SUM, &value, &bytes);
    if (rc == 0 && bytes == sizeof sum)
      memcpy(&sum, value, sizeof sum);
    else if (rc == 0)
      rc = EINVAL;
    if (rc == 0 || rc == SL_ENOTFOUND) {
      sum += t.value;
      rc = sl_state_put(ctx, STATE_SUM, &sum, sizeof sum, 0);
    }
  } else {
    const void *acc;
    rc = sl_state_fold(ctx, STATE_SUM, &zero, sizeof sum, fold_add, 0,
                       &t.value, sizeof t.value, &acc);
    if (rc == 0)
      memcpy(&sum, acc, sizeof sum);
  }
  if (rc) {
    sl_ctx_fail(ctx, "running sum of key %" PRIu64 ": keyed state: %s", t.key,
                sl_strerror(rc));
    return rc < 0 ? rc : -rc;
  }
  sl_tuple out = {.key = t.key, .value = sum};
  return sl_emit(ctx, &out, sizeof out);
}

static int sink_open(sl_ctx *ctx, void *user, void **instance_state) {
  sink_result *result = user;
  sink_instance *s = calloc(1, sizeof *s);
  if (s) {
    s->count = calloc(result->keys, sizeof *s->count);
    s->last_sum = calloc(result->keys, sizeof *s->last_sum);
  }
  if (!s || !s->count || !s->last_sum) {
    if (s) {
      free(s->count);
      free(s->last_sum);
    }
    free(s);
    sl_ctx_fail(ctx, "sink: no memory for %" PRIu64 " keys", result->keys);
    return -ENOMEM;
  }
  s->result = result;
  *instance_state = s;
  return 0;
}

static int sink_process(sl_ctx *ctx, void *instance_state, int input,
                        const sl_record *in) {
  (void)input;
  sink_instance *s = instance_state;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  if (t.key >= s->result->keys) {
    sl_ctx_fail(ctx, "sink: key %" PRIu64 " out of range (keys %" PRIu64 ")",
                t.key, s->result->keys);
    return -EINVAL;
  }
  s->records++;
  s->sum_total += t.value;
  s->count[t.key]++;
  s->last_sum[t.key] = t.value;
  return 0;
}

/* Merge this instance's tallies.  Keys are partitioned, so each key's
 * last sum comes from one instance; a key seen by two would show up as a
 * wrong final sum or count. */
static void sink_close(sl_ctx *ctx, void *instance_state) {
  (void)ctx;
  sink_instance *s = instance_state;
  sink_result *r = s->result;
  pthread_mutex_lock(&r->lock);
  r->records += s->records;
  r->sum_total += s->sum_total;
  for (uint64_t k = 0; k < r->keys; k++) {
    if (s->count[k] == 0)
      continue;
    r->count[k] += s->count[k];
    r->last_sum[k] = s->last_sum[k];
  }
  pthread_mutex_unlock(&r->lock);
  free(s->count);
  free(s->last_sum);
  free(s);
}

/* ------------------------------------------------------------ checks */

/* Records with key k among i = 0 .. records-1, key = i % keys. */
static uint64_t key_records(uint64_t records, uint64_t keys, uint64_t k) {
  return records / keys + (k < records % keys);
}

/* Final running sum of key k: sum_{j < n} (k + keys j), modulo 2^64. */
static uint64_t final_sum(uint64_t n, uint64_t keys, uint64_t k) {
  return (uint64_t)((u128)n * k + (u128)keys * ((u128)n * (n - 1) / 2));
}

/* Sum of the running sums of key k after each of its n records:
 * sum_{m=1..n} (m k + keys m (m-1) / 2), modulo 2^64. */
static uint64_t emitted_sums(uint64_t n, uint64_t keys, uint64_t k) {
  u128 first = (u128)n * (n + 1) / 2 * k;
  u128 second = (u128)(n + 1) * n * (n - 1) / 6; /* n <= 2^40 here */
  return (uint64_t)(first + (u128)keys * second);
}

/* Check a run's sink result against the closed forms.  Prints the first
 * mismatch; returns true if everything matches. */
static bool check_result(const sink_result *r, uint64_t records) {
  if (r->bad_key || r->records != records) {
    fprintf(stderr,
            "pipeline_p2: WRONG RESULT: %" PRIu64 " records, expected %" PRIu64
            "\n", r->records, records);
    return false;
  }
  uint64_t total = 0;
  for (uint64_t k = 0; k < r->keys; k++) {
    uint64_t n = key_records(records, r->keys, k);
    total += emitted_sums(n, r->keys, k);
    if (r->count[k] != n ||
        (n > 0 && r->last_sum[k] != final_sum(n, r->keys, k))) {
      fprintf(stderr,
              "pipeline_p2: WRONG RESULT: key %" PRIu64 ": %" PRIu64
              " records, final sum %" PRIu64 "; expected %" PRIu64
              " and %" PRIu64 "\n", k, r->count[k], r->last_sum[k], n,
              final_sum(n, r->keys, k));
      return false;
    }
  }
  if (r->sum_total != total) {
    fprintf(stderr,
            "pipeline_p2: WRONG RESULT: total of emitted sums %" PRIu64
            ", expected %" PRIu64 "\n", r->sum_total, total);
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

/* Completed checkpoints of a finished job (of the last 64 kept). */
static uint64_t completed_checkpoints(const sl_job *job) {
  uint64_t completed = 0;
  sl_checkpoint_stats stats;
  for (int k = 0; sl_job_checkpoint_stats(job, k, &stats) == 0; k++)
    completed += stats.status == SL_CHECKPOINT_COMPLETED;
  return completed;
}

/* Build and run the job once; check its result.  Returns tuples/s, or a
 * negative value (after printing why) on failure. */
static double run_once(const options *o, const series *s,
                       sink_result *result, uint64_t *checkpoints,
                       double *cpu_s) {
  sl_job_config config = o->config;
  config.pin_policy = s->pin_policy;
  int parallelism = s->parallelism ? s->parallelism : o->parallelism;
  char dir[] = "/tmp/sluice-p2-XXXXXX";
  if (s->checkpoint) {
    if (!mkdtemp(dir)) {
      perror("pipeline_p2: mkdtemp");
      return -1;
    }
    config.checkpoint.state_dir = dir;
    config.checkpoint.interval_ms = o->checkpoint_ms;
    config.checkpoint.no_sync = 1;
    config.checkpoint.store_policy = SL_STORE_FRESH;
  }
  result->records = result->sum_total = 0;
  result->bad_key = false;
  memset(result->count, 0, result->keys * sizeof *result->count);
  memset(result->last_sum, 0, result->keys * sizeof *result->last_sum);
  static const sl_process_ops sum_ops = {.open = sum_open,
                                         .process = sum_process};
  static const sl_process_ops sink_ops = {
      .open = sink_open, .process = sink_process, .close = sink_close};
  sl_job *job = 0;
  sl_op *src, *keyed, *sum, *sink;
  config.struct_bytes = sizeof config; /* sluice.h ABI */
  int rc = sl_job_create(&config, &job);
  if (!rc)
    rc = sl_source_sequence(job, "source", 1, o->records, o->keys, &src);
  if (!rc)
    rc = sl_op_key_by(job, "by-key", src, tuple_key, 0, &keyed);
  if (!rc)
    rc = sl_op_process(job, "running-sum", &keyed, 1, parallelism,
                       &sum_ops, (void *)&s->mode, &sum);
  if (!rc)
    rc = sl_op_sink(job, "sink", sum, parallelism, &sink_ops, result,
                    &sink);
  double cpu0_s = cpu_now_s();
  uint64_t start_ns = bench_now_ns();
  if (!rc)
    rc = sl_job_run(job);
  uint64_t elapsed_ns = bench_now_ns() - start_ns;
  *cpu_s = cpu_now_s() - cpu0_s;
  if (rc)
    fprintf(stderr, "pipeline_p2: %s: %s: %s\n", s->name, sl_strerror(rc),
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
  printf("P2 source -> key_by -> running sum -> sink, %" PRIu64
         " tuples, %" PRIu64 " keys, parallelism %d (-p2: 2), %d runs each\n",
         o->records, o->keys, o->parallelism, o->repeat);
  printf("  %-13s %10s %10s %10s %18s %8s  (M tuples/s); CPU: median cores "
         "busy [min-max], CPU s per 1M tuples\n", "series", "median", "min",
         "max", "cores", "CPU s/M");
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
  }
  const series *update = 0, *checkpointed = 0;
  for (int i = 0; i < count; i++) {
    if (strcmp(all[i].name, "update") == 0)
      update = &all[i];
    if (strcmp(all[i].name, "update-cp") == 0)
      checkpointed = &all[i];
  }
  if (update && checkpointed)
    printf("  ratio update-cp / update (medians): %.2f\n",
           checkpointed->stats.median / update->stats.median);
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
    fprintf(stderr, "pipeline_p2: %s: %s\n", o->json, strerror(rc));
    return rc;
  }
  bench_json_begin_object(&json, 0);
  bench_json_string(&json, "benchmark", "pipeline_p2");
  bench_json_u64(&json, "records", o->records);
  bench_json_u64(&json, "keys", o->keys);
  bench_json_u64(&json, "parallelism", (uint64_t)o->parallelism);
  bench_json_u64(&json, "repeat", (uint64_t)o->repeat);
  bench_json_string(&json, "unit", "tuples_per_second");
  bench_json_machine(&json);
  bench_json_begin_array(&json, "series");
  for (int i = 0; i < count; i++)
    json_series(&json, o, &all[i]);
  bench_json_end_array(&json);
  bench_json_end_object(&json);
  rc = bench_json_close(&json);
  if (rc)
    fprintf(stderr, "pipeline_p2: %s: %s\n", o->json, strerror(rc));
  else
    printf("  written: %s\n", o->json);
  return rc;
}

/* ------------------------------------------------------------ main */

static const series series_known[] = {
    {.name = "update", .mode = MODE_UPDATE, .pin_policy = SL_PIN_CHAINS},
    {.name = "get-put", .mode = MODE_GET_PUT, .pin_policy = SL_PIN_CHAINS},
    {.name = "fold", .mode = MODE_FOLD, .pin_policy = SL_PIN_CHAINS},
    {.name = "update-rr", .mode = MODE_UPDATE,
     .pin_policy = SL_PIN_ROUND_ROBIN},
    {.name = "update-cp", .mode = MODE_UPDATE, .pin_policy = SL_PIN_CHAINS,
     .checkpoint = true},
    {.name = "update-p2", .mode = MODE_UPDATE, .pin_policy = SL_PIN_CHAINS,
     .parallelism = 2},
    {.name = "update-p2-rr", .mode = MODE_UPDATE,
     .pin_policy = SL_PIN_ROUND_ROBIN, .parallelism = 2},
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
      fprintf(stderr, "pipeline_p2: unknown or repeated series '%.*s'\n",
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
          "usage: pipeline_p2 [--records N] [--keys K] [--repeat R] [--quick]\n"
          "                   [--json PATH] [--parallelism P] [--series LIST]\n"
          "                   [--checkpoint-ms MS] [--ring-bytes B] "
          "[--batch N]\n"
          "  series: comma-separated of update, get-put, fold, update-rr,\n"
          "          update-cp, update-p2, update-p2-rr (default: all)\n");
  return 2;
}

/* Parse the command line into o and chosen[]; returns the series count, or
 * -1 after printing the usage. */
static int parse_args(int argc, char **argv, options *o, series *chosen) {
  const char *list =
      "update,get-put,fold,update-rr,update-cp,update-p2,update-p2-rr";
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
    fprintf(stderr, "pipeline_p2: no series chosen\n");
  return count > 0 ? count : (usage(), -1);
}

int main(int argc, char **argv) {
  options o = {.records = 50000000,
               .keys = 10000,
               .repeat = 5,
               .parallelism = 1,
               .checkpoint_ms = 1000,
               .json = "bench/results/pipeline_p2.json"};
  series all[SERIES_KNOWN];
  int count = parse_args(argc, argv, &o, all);
  if (count < 0)
    return 2;
  sink_result result = {.lock = PTHREAD_MUTEX_INITIALIZER, .keys = o.keys};
  result.count = calloc(o.keys, sizeof *result.count);
  result.last_sum = calloc(o.keys, sizeof *result.last_sum);
  if (!result.count || !result.last_sum) {
    fprintf(stderr, "pipeline_p2: no memory for %" PRIu64 " keys\n", o.keys);
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
  free(result.last_sum);
  return status;
}
