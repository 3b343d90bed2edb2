/* pipeline_p1.c — benchmark P1: 16-byte tuples {key = i % 10000, value = i}
 * through source -> map (value = value*3+1) -> filter (value % 4 != 0) ->
 * sink (count and sum, checked), one thread per operator.
 *
 *   pipeline_p1 [--records N] [--repeat R] [--quick] [--json PATH]
 *               [--ring-bytes B] [--batch N] [--spin N]
 *
 * Runs the default pinning (chains) and round-robin pinning alternately in
 * one process, R times each, and reports median, min and max tuples/s of
 * each, and their ratio.  Every run's count and sum are checked against the
 * closed form; a mismatch fails the benchmark (exit 1).
 *
 * CPU use of each run: the process's user + system time over sl_job_run()
 * (getrusage RUSAGE_SELF: every engine thread, plus the main thread, which
 * only waits) divided by the run's wall time, i.e. the cores the run kept
 * busy on average (at most the machine's CPUs); and CPU seconds per
 * million tuples.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "bench_util.h"
#include "fixtures.h"
#include "sluice.h"
#include "sluice_testing.h" /* unstable test helpers */

#define MAX_REPEAT 50

typedef struct totals {
  uint64_t count;
  uint64_t sum;
} totals;

static int sink_process(sl_ctx *ctx, void *state, int input,
                        const sl_record *in) {
  (void)ctx;
  (void)input;
  totals *t = state;
  sl_tuple v;
  memcpy(&v, in->data, sizeof v);
  t->count++;
  t->sum += v.value;
  return 0;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* One run; returns tuples/s and sets *cpu_s to its CPU seconds, or returns
 * a negative value on failure. */
static double run_once(uint64_t records, const sl_job_config *config,
                       const totals *expected, double *cpu_s) {
  sl_job *job;
  if (sl_job_create(config, &job) != 0)
    return -1;
  totals got = {0};
  sl_op *src, *map, *filter, *sink;
  static const sl_process_ops sink_ops = {.process = sink_process};
  int rc = sl_source_sequence(job, "source", 1, records, 10000, &src);
  if (!rc)
    rc = sl_op_map(job, "map", src, 1, sizeof(sl_tuple), fixture_p1_map, 0,
                   &map);
  if (!rc)
    rc = sl_op_filter(job, "filter", map, 1, fixture_p1_filter, 0, &filter);
  if (!rc)
    rc = sl_op_sink(job, "sink", filter, 1, &sink_ops, &got, &sink);
  double cpu0_s = fixture_cpu_now_s();
  double t0 = now_s();
  if (!rc)
    rc = sl_job_run(job);
  double seconds = now_s() - t0;
  *cpu_s = fixture_cpu_now_s() - cpu0_s;
  if (rc) {
    fprintf(stderr, "pipeline_p1: %s: %s\n", sl_strerror(rc), sl_job_error(job));
    sl_job_destroy(job);
    return -1;
  }
  sl_job_destroy(job);
  if (got.count != expected->count || got.sum != expected->sum) {
    fprintf(stderr,
            "pipeline_p1: WRONG RESULT: count %" PRIu64 " sum %" PRIu64
            ", expected %" PRIu64 " and %" PRIu64 "\n",
            got.count, got.sum, expected->count, expected->sum);
    return -1;
  }
  return (double)records / seconds;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Median, min and max of values[0..n). */
typedef struct summary {
  double median, min, max;
} summary;

static summary summarize_values(const double *values, int n) {
  double sorted[MAX_REPEAT];
  memcpy(sorted, values, sizeof(double) * (size_t)n);
  qsort(sorted, (size_t)n, sizeof(double), cmp_double);
  summary out = {.min = sorted[0], .max = sorted[n - 1]};
  out.median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  return out;
}

typedef struct series {
  const char *name;
  double rates[MAX_REPEAT];
  double cores[MAX_REPEAT];           /* CPU seconds / wall seconds */
  double cpu_s_per_million[MAX_REPEAT]; /* CPU seconds per 1M tuples */
  int n;
  double median, min, max;
  summary cpu_cores, cpu_per_million;
} series;

static void summarize(series *s) {
  summary rate = summarize_values(s->rates, s->n);
  s->median = rate.median;
  s->min = rate.min;
  s->max = rate.max;
  s->cpu_cores = summarize_values(s->cores, s->n);
  s->cpu_per_million = summarize_values(s->cpu_s_per_million, s->n);
}

/* Write the results to path (its folder bench/results is created if
 * missing).  Returns 0, or -1 after printing why. */
static int write_json(const char *path, uint64_t records, int repeat,
                      series *const all[2]) {
  mkdir("bench/results", 0755);
  FILE *f = fopen(path, "w");
  if (!f) {
    perror(path);
    return -1;
  }
  fprintf(f, "{\"benchmark\":\"pipeline_p1\",\"records\":%" PRIu64
             ",\"repeat\":%d,\"unit\":\"tuples_per_second\",\"series\":[",
          records, repeat);
  for (int k = 0; k < 2; k++) {
    fprintf(f, "%s{\"name\":\"%s\",\"median\":%.0f,\"min\":%.0f,\"max\":%.0f,"
               "\"runs\":[",
            k ? "," : "", all[k]->name, all[k]->median, all[k]->min,
            all[k]->max);
    for (int r = 0; r < all[k]->n; r++)
      fprintf(f, "%s%.0f", r ? "," : "", all[k]->rates[r]);
    const summary *c = &all[k]->cpu_cores, *m = &all[k]->cpu_per_million;
    fprintf(f, "],\"cpu_cores\":{\"median\":%.4f,\"min\":%.4f,\"max\":%.4f},"
               "\"cpu_seconds_per_million_tuples\":{\"median\":%.6f,"
               "\"min\":%.6f,\"max\":%.6f}}",
            c->median, c->min, c->max, m->median, m->min, m->max);
  }
  fprintf(f, "],\"ratio_chains_over_round_robin\":%.3f}\n",
          all[0]->median / all[1]->median);
  if (fclose(f) != 0) {
    perror(path);
    return -1;
  }
  printf("  written: %s\n", path);
  return 0;
}

int main(int argc, char **argv) {
  sl_log_set_handler(sl_log_stderr, NULL); /* the library is silent unless asked */
  uint64_t records = 50000000;
  int repeat = 5;
  const char *json = "bench/results/pipeline_p1.json";
  sl_job_config config = SL_JOB_CONFIG_INIT;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : 0;
    if (strcmp(a, "--quick") == 0) {
      records = 5000000;
      repeat = 3;
    } else if (strcmp(a, "--records") == 0 && v) {
      records = strtoull(v, 0, 10), i++;
    } else if (strcmp(a, "--repeat") == 0 && v) {
      repeat = atoi(v), i++;
    } else if (strcmp(a, "--json") == 0 && v) {
      json = v, i++;
    } else if (strcmp(a, "--ring-bytes") == 0 && v) {
      config.ring_bytes = strtoull(v, 0, 10), i++;
    } else if (strcmp(a, "--batch") == 0 && v) {
      config.output_batch_records = (uint32_t)strtoul(v, 0, 10), i++;
    } else if (strcmp(a, "--spin") == 0 && v) {
      config.spin_iterations = (uint32_t)strtoul(v, 0, 10), i++;
    } else if (strcmp(a, "--chaining") == 0 && bench_parse_chaining(v) >= 0) {
      config.chaining = bench_parse_chaining(v), i++;
    } else {
      fprintf(stderr,
              "usage: pipeline_p1 [--records N] [--repeat R] [--quick] "
              "[--json PATH] [--ring-bytes B] [--batch N] [--spin N] "
              "[--chaining auto|always|never]\n");
      return 2;
    }
  }
  if (repeat < 1 || repeat > MAX_REPEAT || records == 0) {
    fprintf(stderr, "pipeline_p1: --repeat must be 1..%d, --records > 0\n",
            MAX_REPEAT);
    return 2;
  }
  totals expected = {0};
  for (uint64_t i = 0; i < records; i++) {
    uint64_t v = 3 * i + 1;
    if (v % 4 != 0)
      expected.count++, expected.sum += v;
  }
  series chains = {.name = "chains (default)"};
  series round_robin = {.name = "round-robin"};
  for (int r = 0; r < repeat; r++) {
    /* Alternate the two so drift on a shared machine hits both alike. */
    for (int k = 0; k < 2; k++) {
      sl_job_config c = config;
      c.pin_policy = k == 0 ? SL_PIN_CHAINS : SL_PIN_ROUND_ROBIN;
      double cpu_s = 0;
      double rate = run_once(records, &c, &expected, &cpu_s);
      if (rate < 0)
        return 1;
      series *s = k == 0 ? &chains : &round_robin;
      s->cores[s->n] = cpu_s * rate / (double)records; /* cpu_s / wall */
      s->cpu_s_per_million[s->n] = cpu_s / ((double)records / 1e6);
      s->rates[s->n++] = rate;
    }
  }
  summarize(&chains);
  summarize(&round_robin);
  printf("P1 source -> map -> filter -> sink, %" PRIu64
         " tuples, 4 threads, %d runs each\n",
         records, repeat);
  printf("  %-18s %10s %10s %10s %18s %8s  (M tuples/s; CPU: median "
         "cores busy [min-max], CPU s per 1M tuples)\n", "pinning", "median",
         "min", "max", "cores", "CPU s/M");
  series *all[] = {&chains, &round_robin};
  for (int k = 0; k < 2; k++)
    printf("  %-18s %10.1f %10.1f %10.1f %6.2f [%4.2f-%4.2f] %8.4f\n",
           all[k]->name, all[k]->median / 1e6, all[k]->min / 1e6,
           all[k]->max / 1e6, all[k]->cpu_cores.median, all[k]->cpu_cores.min,
           all[k]->cpu_cores.max, all[k]->cpu_per_million.median);
  printf("  ratio chains / round-robin (medians): %.2f\n",
         chains.median / round_robin.median);
  printf("  target: >= 130 M tuples/s; WindFlow best config here: median 41, "
         "best 65\n");
  return write_json(json, records, repeat, all) == 0 ? 0 : 1;
}
