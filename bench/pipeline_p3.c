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

__extension__ typedef unsigned __int128 u128;

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
static bool check_result(const void *result, uint64_t records) {
  const sink_result *r = result;
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

static void reset_result(void *result_void) {
  sink_result *result = result_void;
  result->windows = result->wrong = result->first_wrong_key = 0;
  memset(result->count, 0, result->keys * sizeof *result->count);
}

/* keyed -> count window of W tuples, summing -> sink. */
static int build(sl_job *job, sl_op *keyed, const pipeline_series *s,
                 int parallelism, void *result_void) {
  (void)s;
  sink_result *result = result_void;
  const sl_window_config window = {.type = SL_WINDOW_COUNT,
                                   .size = (int64_t)result->window,
                                   .acc_bytes = sizeof(uint64_t),
                                   .init = acc_init,
                                   .add = acc_add,
                                   .emit = acc_emit};
  static const sl_process_ops sink_ops = {
      .open = sink_open, .process = sink_process, .close = sink_close};
  sl_op *windows, *sink;
  int rc = sl_op_window(job, "count-window", keyed, parallelism, &window,
                        &windows);
  if (!rc)
    rc = sl_op_sink(job, "sink", windows, parallelism, &sink_ops, result,
                    &sink);
  return rc;
}

/* ------------------------------------------------------------ output */

static void print_heading(const pipeline_options *o) {
  printf("P3 source -> key_by -> count window (%" PRIu64 ", sum) -> sink, %"
         PRIu64 " tuples, %" PRIu64 " keys, parallelism %d (-p2: 2), %d runs "
         "each\n", o->window, o->records, o->keys, o->parallelism, o->repeat);
  printf("  %-13s %10s %10s %10s %18s %8s  (M input tuples/s); CPU: median "
         "cores busy [min-max], CPU s per 1M tuples\n", "series", "median",
         "min", "max", "cores", "CPU s/M");
}

/* ------------------------------------------------------------ main */

static const pipeline_series series_known[] = {
    {.name = "window", .pin_policy = SL_PIN_CHAINS},
    {.name = "window-rr", .pin_policy = SL_PIN_ROUND_ROBIN},
    {.name = "window-cp", .pin_policy = SL_PIN_CHAINS, .checkpoint = true},
    {.name = "window-p2", .pin_policy = SL_PIN_CHAINS, .parallelism = 2},
    {.name = "window-p2-rr", .pin_policy = SL_PIN_ROUND_ROBIN,
     .parallelism = 2},
};
#define SERIES_KNOWN (int)(sizeof series_known / sizeof series_known[0])

static const char usage[] =
    "usage: pipeline_p3 [--records N] [--keys K] [--window W] [--repeat R] "
    "[--quick]\n"
    "                   [--json PATH] [--parallelism P] [--series LIST]\n"
    "                   [--checkpoint-ms MS] [--ring-bytes B] [--batch N]\n"
    "  series: comma-separated of window, window-rr, window-cp,\n"
    "          window-p2, window-p2-rr (default: all)\n";

int main(int argc, char **argv) {
  sl_log_set_handler(sl_log_stderr, NULL); /* the library is silent unless asked */
  pipeline_options o = {.program = "pipeline_p3",
                        .records = 50000000,
                        .keys = 10000,
                        .window = 1000,
                        .repeat = 5,
                        .parallelism = 1,
                        .checkpoint_ms = 1000,
                        .json = "bench/results/pipeline_p3.json"};
  pipeline_series all[SERIES_KNOWN];
  int count = pipeline_parse_args(
      argc, argv, &o, "window,window-rr,window-cp,window-p2,window-p2-rr",
      series_known, SERIES_KNOWN, usage, all);
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
  const pipeline_bench bench = {.reset = reset_result,
                                .build = build,
                                .check = check_result,
                                .result = &result,
                                .heading = print_heading,
                                .plain_name = "window",
                                .checkpointed_name = "window-cp",
                                .unit = "input_tuples_per_second"};
  int status = pipeline_main(&o, all, count, &bench);
  free(result.count);
  return status;
}
