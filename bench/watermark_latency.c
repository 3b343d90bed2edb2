/* watermark_latency.c — how long after the watermark passes a window's end
 * its result reaches the sink, for a trickle of pushes (issue 20, part 1:
 * "a window result leaves within 1 ms of the watermark passing the
 * window's end").
 *
 *   watermark_latency [--quick] [--repeat R] [--pushes N] [--gap-us G]
 *                     [--interval-ms I] [--json PATH]
 *
 * THE JOB
 *
 *   push source --key_by--> tumbling event-time window --> callback sink
 *   (one instance each; watermarks with out_of_orderness 0 and the given
 *   interval_ms, 0: the engine's default; the window counts its records)
 *
 * METHOD
 *
 * The main thread pushes record i (i = 0 .. N) with timestamp
 * i * WINDOW + WINDOW / 2, one every G microseconds (default 2000: a
 * trickle, each push emitted long before the next).  Record i's watermark
 * (its timestamp - 1) passes the end of window i - 1, so that window's
 * result is due as soon as record i has left the source.  Just before
 * the push of record i the pusher notes the time; the sink notes when the
 * result of window i - 1 arrives.  The delay is the difference: it
 * includes the push, the source's hop, the watermark's hop and the
 * window's output, so it is an upper bound of "after the watermark
 * passed".  Results that come only with the end of input (after the last
 * push) are not counted as arrived in time: the job ends after a pause
 * of END_PAUSE_MS once every push was made.
 *
 * Reported per run: results that arrived before the end (of N), and the
 * delay's p50, p99 and max in microseconds (nearest rank).  R runs
 * (default 3; --quick: 1 run of N = 200 instead of 1000), each a new job,
 * one after the other; the medians (and min, max) over the runs.  The
 * target (issue 20): the median p99 <= 1 ms, and in every run every
 * result arrived before the end.  ./run bench runs it (bench/README.md).
 *
 * JSON (--json PATH, default bench/results/watermark_latency.json):
 *   {"benchmark": "watermark_latency", "pushes": N, "gap_us": G,
 *    "interval_ms": I, "repeat": R,
 *    "results_before_end": {"median", "min", "max"},
 *    "delay_us": {"p50": {"median", "min", "max"}, "p99": {..},
 *                 "max": {..}},
 *    "runs": [{"results_before_end": n, "p50": .., "p99": .., "max": ..}],
 *    "target_p99_us": 1000, "target_met": bool}
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "sluice.h"
#include "sluice_embed.h"
#include "sluice_window.h"

#define PROGRAM "watermark_latency"
#define WINDOW 100          /* event-time units per window */
#define DEFAULT_PUSHES 1000u
#define QUICK_PUSHES 200u
#define MAX_PUSHES 1000000u
#define DEFAULT_GAP_US 2000u
#define END_PAUSE_MS 300u   /* after the last push, before closing */
#define TARGET_P99_US 1000.0
#define DEFAULT_REPEAT 3

typedef struct push_event {
  uint64_t key;
  int64_t ts;
} push_event;

/* pushed_ns[i]: just before record i was pushed (main thread);
 * arrived_ns[i]: when window i - 1's result reached the sink (sink thread,
 * read by the main thread after sl_job_wait has joined it), unless
 * input_ending was set first (the main thread, before it closes). */
typedef struct run_times {
  uint32_t pushes;
  _Atomic uint64_t *pushed_ns;
  uint64_t *arrived_ns;
  _Atomic int input_ending;
} run_times;

static uint64_t one_key(void *user, const sl_record *in) {
  (void)user;
  (void)in;
  return 1;
}

static void count_init(void *user, void *acc) {
  (void)user;
  memset(acc, 0, sizeof(uint64_t));
}

static void count_add(void *user, void *acc, const sl_record *in) {
  (void)user;
  (void)in;
  uint64_t n;
  memcpy(&n, acc, sizeof n);
  n++;
  memcpy(acc, &n, sizeof n);
}

static int emit_end(void *user, sl_ctx *ctx, uint64_t key,
                    const sl_window *window, const void *acc) {
  (void)user;
  (void)key;
  (void)acc;
  return sl_emit(ctx, &window->end, sizeof window->end);
}

static int note_arrival(void *user, int instance, const sl_record *rec) {
  (void)instance;
  run_times *t = user;
  uint64_t now = bench_now_ns();
  int64_t end;
  if (rec->size_bytes != sizeof end)
    return EINVAL;
  memcpy(&end, rec->data, sizeof end);
  /* Window i - 1 ends at i * WINDOW: record i closed it. */
  int64_t i = end / WINDOW;
  if (!atomic_load(&t->input_ending) && i >= 1 && i <= (int64_t)t->pushes &&
      atomic_load_explicit(&t->pushed_ns[i], memory_order_acquire) != 0)
    t->arrived_ns[i] = now;
  return 0;
}

static void sleep_us(uint64_t us) {
  struct timespec d = {.tv_sec = (time_t)(us / 1000000u),
                       .tv_nsec = (long)(us % 1000000u) * 1000L};
  while (nanosleep(&d, &d) != 0 && errno == EINTR) {
  }
}

static void usage(FILE *out) {
  fprintf(out, "usage: " PROGRAM " [--quick] [--repeat R] [--pushes N] "
               "[--gap-us G] [--interval-ms I] [--json PATH]\n");
}

/* Build and run the job, pushing as METHOD says.  Returns 0 or the
 * failing call's status (with a message on stderr). */
static int run(run_times *t, uint32_t gap_us, uint32_t interval_ms) {
  sl_job *job;
  int rc = sl_job_create(NULL, &job);
  if (rc)
    return rc;
  sl_op *src, *keyed, *win, *sink;
  sl_push *push;
  sl_watermark_config wc = {.out_of_orderness = 0,
                            .interval_ms = interval_ms};
  sl_window_config w = {.type = SL_WINDOW_TUMBLING,
                        .domain = SL_EVENT_TIME,
                        .size = WINDOW,
                        .acc_bytes = sizeof(uint64_t),
                        .init = count_init,
                        .add = count_add,
                        .emit = emit_end};
  if ((rc = sl_source_push(job, "push", 0, &src, &push)) ||
      (rc = sl_op_watermarks(src, &wc)) ||
      (rc = sl_op_key_by(job, "by-key", src, one_key, 0, &keyed)) ||
      (rc = sl_op_window(job, "win", keyed, 1, &w, &win)) ||
      (rc = sl_sink_callback(job, "sink", win, 1, note_arrival, t, &sink)) ||
      (rc = sl_job_start(job))) {
    fprintf(stderr, PROGRAM ": job: %s (%s)\n", sl_strerror(rc),
            sl_job_error(job));
    sl_job_destroy(job);
    return rc;
  }
  for (uint32_t i = 0; i <= t->pushes && rc == 0; i++) {
    push_event e = {.key = 1, .ts = (int64_t)i * WINDOW + WINDOW / 2};
    atomic_store_explicit(&t->pushed_ns[i], bench_now_ns(),
                          memory_order_release);
    rc = sl_push_record(push, &e, sizeof e, e.ts);
    sleep_us(gap_us);
  }
  sleep_us((uint64_t)END_PAUSE_MS * 1000u);
  /* What arrives from here on came with the end of input: not counted. */
  atomic_store(&t->input_ending, 1);
  sl_push_close(push);
  int wait_rc = sl_job_wait(job);
  if (rc == 0)
    rc = wait_rc;
  if (rc)
    fprintf(stderr, PROGRAM ": run: %s (%s)\n", sl_strerror(rc),
            sl_job_error(job));
  sl_job_destroy(job);
  return rc;
}

/* One run's figures (delays in microseconds, -1 when none arrived). */
typedef struct run_figures {
  double before_end, p50, p99, max;
} run_figures;

/* One run: a new job, pushes, delays.  Returns 0 or 1 (after a message). */
static int measure(uint32_t pushes, uint32_t gap_us, uint32_t interval_ms,
                   run_figures *f) {
  run_times t = {.pushes = pushes,
                 .pushed_ns = calloc(pushes + 1u, sizeof(_Atomic uint64_t)),
                 .arrived_ns = calloc(pushes + 1u, sizeof(uint64_t))};
  uint64_t *delay_ns = malloc(sizeof *delay_ns * pushes);
  if (!t.pushed_ns || !t.arrived_ns || !delay_ns)
    bench_fail(PROGRAM, "out of memory");
  int rc = run(&t, gap_us, interval_ms);
  size_t n = 0;
  for (uint32_t i = 1; rc == 0 && i <= t.pushes; i++)
    if (t.arrived_ns[i])
      delay_ns[n++] = t.arrived_ns[i] - atomic_load(&t.pushed_ns[i]);
  bench_sort_u64(delay_ns, n);
  *f = (run_figures){
      .before_end = (double)n,
      .p50 = n ? bench_percentile_sorted_u64(delay_ns, n, 0.50) / 1e3 : -1,
      .p99 = n ? bench_percentile_sorted_u64(delay_ns, n, 0.99) / 1e3 : -1,
      .max = n ? delay_ns[n - 1] / 1e3 : -1};
  free(delay_ns);
  free(t.pushed_ns);
  free(t.arrived_ns);
  return rc ? 1 : 0;
}

static void json_stats_of(bench_json *json, const char *key,
                          const run_figures *runs, int repeat, size_t offset) {
  double values[BENCH_MAX_REPEAT];
  for (int r = 0; r < repeat; r++)
    memcpy(&values[r], (const char *)&runs[r] + offset, sizeof values[r]);
  bench_json_stats(json, key, bench_stats_of(values, (size_t)repeat));
}

int main(int argc, char **argv) {
  const char *json_path = "bench/results/watermark_latency.json";
  bool quick = false;
  int repeat = -1;
  uint64_t pushes = 0, gap_us = DEFAULT_GAP_US, interval_ms = 0;
  for (int a = 1; a < argc;) {
    const char *v = a + 1 < argc ? argv[a + 1] : 0;
    int used = bench_common_flag(PROGRAM, argv[a], v, &json_path, &quick,
                                 usage);
    if (!used && v && strcmp(argv[a], "--pushes") == 0) {
      pushes = bench_parse_or_die(PROGRAM, argv[a], v, 1);
      used = 2;
    } else if (!used && v && strcmp(argv[a], "--repeat") == 0) {
      repeat = (int)bench_parse_or_die(PROGRAM, argv[a], v, 1);
      used = 2;
    } else if (!used && v && strcmp(argv[a], "--gap-us") == 0) {
      gap_us = bench_parse_or_die(PROGRAM, argv[a], v, 1);
      used = 2;
    } else if (!used && v && strcmp(argv[a], "--interval-ms") == 0) {
      interval_ms = bench_parse_or_die(PROGRAM, argv[a], v, 1);
      used = 2;
    }
    if (!used) {
      usage(stderr);
      return 1;
    }
    a += used;
  }
  if (pushes == 0)
    pushes = quick ? QUICK_PUSHES : DEFAULT_PUSHES;
  if (repeat == -1)
    repeat = quick ? 1 : DEFAULT_REPEAT;
  if (pushes > MAX_PUSHES || gap_us > 1000000u || interval_ms > UINT32_MAX ||
      repeat > (int)BENCH_MAX_REPEAT) {
    fprintf(stderr, PROGRAM ": --pushes at most %u, --gap-us at most "
            "1000000, --interval-ms at most %u, --repeat at most %u\n",
            MAX_PUSHES, UINT32_MAX, BENCH_MAX_REPEAT);
    return 1;
  }
  run_figures *runs = calloc((size_t)repeat, sizeof *runs);
  if (!runs)
    bench_fail(PROGRAM, "out of memory");
  bool all_before_end = true;
  for (int r = 0; r < repeat; r++) {
    if (measure((uint32_t)pushes, (uint32_t)gap_us, (uint32_t)interval_ms,
                &runs[r]) != 0)
      return 1;
    all_before_end = all_before_end && runs[r].before_end == (double)pushes;
    fprintf(stderr, "  run %d: %.0f of %" PRIu64 " before the end; delay us "
            "p50 %.1f p99 %.1f max %.1f\n", r + 1, runs[r].before_end, pushes,
            runs[r].p50, runs[r].p99, runs[r].max);
  }
  double p99s[BENCH_MAX_REPEAT];
  for (int r = 0; r < repeat; r++)
    p99s[r] = runs[r].p99;
  bench_stats p99 = bench_stats_of(p99s, (size_t)repeat);
  bool met = all_before_end && p99.median <= TARGET_P99_US;
  if (interval_ms)
    printf("window result after the push that closed it (watermark "
           "interval %" PRIu64 " ms, a push every %" PRIu64 " us), %d runs:\n",
           interval_ms, gap_us, repeat);
  else
    printf("window result after the push that closed it (the default "
           "watermark interval, a push every %" PRIu64 " us), %d runs:\n",
           gap_us, repeat);
  printf("  delay us p99 median %.1f (min %.1f, max %.1f); every result "
         "before the end in every run: %s\n", p99.median, p99.min, p99.max,
         all_before_end ? "yes" : "no");
  printf("  target: median p99 <= %.0f us, every result before the end: "
         "%s\n", TARGET_P99_US, met ? "met" : "NOT met");
  bench_json json;
  if (bench_json_create(&json, PROGRAM, json_path) == 0) {
    bench_json_string(&json, "benchmark", PROGRAM);
    bench_json_u64(&json, "pushes", pushes);
    bench_json_u64(&json, "gap_us", gap_us);
    bench_json_u64(&json, "interval_ms", interval_ms);
    bench_json_u64(&json, "repeat", (uint64_t)repeat);
    json_stats_of(&json, "results_before_end", runs, repeat,
                  offsetof(run_figures, before_end));
    bench_json_begin_object(&json, "delay_us");
    json_stats_of(&json, "p50", runs, repeat, offsetof(run_figures, p50));
    json_stats_of(&json, "p99", runs, repeat, offsetof(run_figures, p99));
    json_stats_of(&json, "max", runs, repeat, offsetof(run_figures, max));
    bench_json_end_object(&json);
    bench_json_begin_array(&json, "runs");
    for (int r = 0; r < repeat; r++) {
      bench_json_begin_object(&json, 0);
      bench_json_double(&json, "results_before_end", runs[r].before_end);
      bench_json_double(&json, "p50", runs[r].p50);
      bench_json_double(&json, "p99", runs[r].p99);
      bench_json_double(&json, "max", runs[r].max);
      bench_json_end_object(&json);
    }
    bench_json_end_array(&json);
    bench_json_double(&json, "target_p99_us", TARGET_P99_US);
    bench_json_bool(&json, "target_met", met);
    bench_json_finish(&json, PROGRAM, json_path);
  }
  free(runs);
  return 0;
}
