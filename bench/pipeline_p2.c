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
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "fixtures.h"
#include "pipeline_series.h"
#include "sluice.h"
#include "sluice_testing.h" /* unstable test helpers */

#define STATE_SUM 0 /* state id of the running sum */

__extension__ typedef unsigned __int128 u128;

/* How the running sum reaches its keyed state. */
enum state_mode { MODE_UPDATE, MODE_GET_PUT, MODE_FOLD };

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
  const int *mode = instance_state; /* the series' variant: a state_mode */
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
static bool check_result(const void *result, uint64_t records) {
  const sink_result *r = result;
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

static void reset_result(void *result_void) {
  sink_result *result = result_void;
  result->records = result->sum_total = 0;
  result->bad_key = false;
  memset(result->count, 0, result->keys * sizeof *result->count);
  memset(result->last_sum, 0, result->keys * sizeof *result->last_sum);
}

/* keyed -> running sum (reaching its state as the series' variant says)
 * -> sink. */
static int build(sl_job *job, sl_op *keyed, const pipeline_series *s,
                 int parallelism, void *result) {
  static const sl_process_ops sum_ops = {.open = fixture_open_shared,
                                         .process = sum_process};
  static const sl_process_ops sink_ops = {
      .open = sink_open, .process = sink_process, .close = sink_close};
  sl_op *sum, *sink;
  int rc = sl_op_process(job, "running-sum", &keyed, 1, parallelism,
                         &sum_ops, (void *)&s->variant, &sum);
  if (!rc)
    rc = sl_op_sink(job, "sink", sum, parallelism, &sink_ops, result, &sink);
  return rc;
}

/* ------------------------------------------------------------ output */

static void print_heading(const pipeline_options *o) {
  printf("P2 source -> key_by -> running sum -> sink, %" PRIu64
         " tuples, %" PRIu64 " keys, parallelism %d (-p2: 2), %d runs each\n",
         o->records, o->keys, o->parallelism, o->repeat);
  printf("  %-13s %10s %10s %10s %18s %8s  (M tuples/s); CPU: median cores "
         "busy [min-max], CPU s per 1M tuples\n", "series", "median", "min",
         "max", "cores", "CPU s/M");
}

/* ------------------------------------------------------------ main */

static const pipeline_series series_known[] = {
    {.name = "update", .variant = MODE_UPDATE, .pin_policy = SL_PIN_CHAINS},
    {.name = "get-put", .variant = MODE_GET_PUT, .pin_policy = SL_PIN_CHAINS},
    {.name = "fold", .variant = MODE_FOLD, .pin_policy = SL_PIN_CHAINS},
    {.name = "update-rr", .variant = MODE_UPDATE,
     .pin_policy = SL_PIN_ROUND_ROBIN},
    {.name = "update-cp", .variant = MODE_UPDATE, .pin_policy = SL_PIN_CHAINS,
     .checkpoint = true},
    {.name = "update-p2", .variant = MODE_UPDATE, .pin_policy = SL_PIN_CHAINS,
     .parallelism = 2},
    {.name = "update-p2-rr", .variant = MODE_UPDATE,
     .pin_policy = SL_PIN_ROUND_ROBIN, .parallelism = 2},
};
#define SERIES_KNOWN (int)(sizeof series_known / sizeof series_known[0])

static const char usage[] =
    "usage: pipeline_p2 [--records N] [--keys K] [--repeat R] [--quick]\n"
    "                   [--json PATH] [--parallelism P] [--series LIST]\n"
    "                   [--checkpoint-ms MS] [--ring-bytes B] [--batch N]\n"
    "  series: comma-separated of update, get-put, fold, update-rr,\n"
    "          update-cp, update-p2, update-p2-rr (default: all)\n";

int main(int argc, char **argv) {
  sl_log_set_handler(sl_log_stderr, NULL); /* the library is silent unless asked */
  pipeline_options o = {.program = "pipeline_p2",
                        .records = 50000000,
                        .keys = 10000,
                        .repeat = 5,
                        .parallelism = 1,
                        .checkpoint_ms = 1000,
                        .json = "bench/results/pipeline_p2.json"};
  pipeline_series all[SERIES_KNOWN];
  int count = pipeline_parse_args(
      argc, argv, &o,
      "update,get-put,fold,update-rr,update-cp,update-p2,update-p2-rr",
      series_known, SERIES_KNOWN, usage, all);
  if (count < 0)
    return 2;
  sink_result result = {.lock = PTHREAD_MUTEX_INITIALIZER, .keys = o.keys};
  result.count = calloc(o.keys, sizeof *result.count);
  result.last_sum = calloc(o.keys, sizeof *result.last_sum);
  if (!result.count || !result.last_sum) {
    fprintf(stderr, "pipeline_p2: no memory for %" PRIu64 " keys\n", o.keys);
    return 1;
  }
  const pipeline_bench bench = {.reset = reset_result,
                                .build = build,
                                .check = check_result,
                                .result = &result,
                                .heading = print_heading,
                                .plain_name = "update",
                                .checkpointed_name = "update-cp",
                                .unit = "tuples_per_second"};
  int status = pipeline_main(&o, all, count, &bench);
  free(result.count);
  free(result.last_sum);
  return status;
}
