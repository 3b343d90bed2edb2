/* nexmark_bench.c — throughput of every Nexmark query (bench/nexmark),
 * with exactly-once checkpoints every --checkpoint-ms (default 1000, with
 * fsync, into a temporary directory removed after) and with checkpointing
 * off, side by side.
 *
 *   nexmark_bench [--events N] [--repeat R] [--parallelism P] [--quick]
 *                 [--queries q0,q5,...] [--checkpoint-ms MS] [--json PATH]
 *
 * Events per run: --events, or by default as many as keep a run at about
 * five seconds here (50M for the stateless queries, q3, q7 and q8; 20M for
 * q4, q5 and q11), so that the 1 s series takes several checkpoints;
 * --quick: 2M and one run of each.  The event-time rate is
 * nexmark/nexmark's 10M events/s, so 50M events span 5 s of event time.
 *
 * Each run is one job: the generator source (full events, all strings)
 * -> the query -> a checksum sink, P instances of each operator (the
 * default 1: on 2 cores the query's threads already share them).  The
 * time of a run is sl_job_run(); its CPU time is the process's user +
 * system time over the run (getrusage).  Runs go query by query, and
 * within a query "off" and "1 s" alternate R times, so drift on a shared
 * machine hits both alike; the ratio is of the two medians.
 *
 * Per core = events/s / the CPUs the process may use (this machine: 2).
 * The targets are 20x Flink's per-core figures (nexmark/nexmark V1
 * results, as the issue states them); the Flink column is target / 20.
 */
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench_util.h"
#include "nexmark.h"
#include "sluice.h"

#define MAX_REPEAT 50
#define MAX_QUERIES 16

/* Target events/s per core, 20x Flink's published per-core figure. */
static double target_per_core(int query) {
  switch (query) {
  case NX_Q0: return 3.1e6;
  case NX_Q1: return 3.2e6;
  case NX_Q2: return 3.5e6;
  case NX_Q3: return 3.0e6;
  case NX_Q4: return 0.7e6;
  case NX_Q5: return 0.45e6;
  case NX_Q7: return 0.25e6;
  case NX_Q8: return 2.9e6;
  case NX_Q11: return 0.8e6;
  default: return 0;
  }
}

/* Default events per run (see the head comment). */
static uint64_t default_events(int query) {
  return query == NX_Q4 || query == NX_Q5 || query == NX_Q11 ? 20000000
                                                             : 50000000;
}

typedef struct run_result {
  double events_per_second;
  double cpu_seconds;
  uint64_t rows;
  uint64_t checkpoints;
} run_result;

typedef struct query_series {
  int query;
  uint64_t events;
  run_result off[MAX_REPEAT];
  run_result on[MAX_REPEAT];
} query_series;

typedef struct bench_options {
  uint64_t events;
  int repeat;
  int parallelism;
  uint32_t checkpoint_ms;
  int queries[MAX_QUERIES];
  int query_count;
  const char *json_path;
} bench_options;

static double cpu_seconds(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
         (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static int remove_entry(const char *path, const struct stat *st, int flag,
                        struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

/* One run of query q; 0 or the job's status (its message printed). */
static int run_once(const bench_options *o, int q, uint64_t events,
                    bool checkpoint, run_result *out) {
  char dir[] = "/tmp/sluice-nexmark-bench-XXXXXX";
  sl_job_config config = {0};
  if (checkpoint) {
    if (!mkdtemp(dir))
      return errno;
    config.checkpoint.state_dir = dir;
    config.checkpoint.interval_ms = o->checkpoint_ms;
  }
  nx_generator_config gen = {.events = events, .seed = 7,
                             .events_per_second = 10000000,
                             .base_time_ms = 1700000000000};
  nx_source_config source_cfg = {0};
  sl_checksum sum = {0};
  sl_job *job = NULL;
  sl_op *source, *result, *sink;
  int rc = sl_job_create(&config, &job);
  if (rc == 0)
    rc = nx_source_generator(job, "events", o->parallelism, &gen, &source_cfg,
                             &source);
  if (rc == 0)
    rc = nx_query_build(job, q, source, o->parallelism, &result);
  if (rc == 0)
    rc = sl_sink_checksum(job, "sink", result, o->parallelism, &sum, &sink);
  double cpu0 = cpu_seconds();
  uint64_t t0 = bench_now_ns();
  if (rc == 0)
    rc = sl_job_run(job);
  double secs = (double)(bench_now_ns() - t0) / 1e9;
  out->cpu_seconds = cpu_seconds() - cpu0;
  out->events_per_second = (double)events / secs;
  out->rows = sum.records;
  out->checkpoints = job ? sl_job_last_checkpoint(job, NULL) : 0;
  if (rc)
    fprintf(stderr, "nexmark_bench: q%d: %s\n", q,
            job && sl_job_error(job)[0] ? sl_job_error(job) : sl_strerror(rc));
  sl_job_destroy(job);
  if (checkpoint)
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  return rc;
}

static bench_stats stats_of(const run_result *runs, int n, bool cpu) {
  double v[MAX_REPEAT];
  for (int i = 0; i < n; i++)
    v[i] = cpu ? runs[i].cpu_seconds : runs[i].events_per_second;
  return bench_stats_of(v, (size_t)n);
}

static void print_row(const bench_options *o, const query_series *s,
                      int cpus) {
  bench_stats off = stats_of(s->off, o->repeat, false);
  bench_stats on = stats_of(s->on, o->repeat, false);
  bench_stats cpu_on = stats_of(s->on, o->repeat, true);
  double target = target_per_core(s->query);
  double per_core = on.median / cpus;
  printf("q%-3d %4" PRIu64 "M %7.2f [%5.2f-%5.2f] %7.2f [%5.2f-%5.2f] %5.2f "
         "%6.2f  %6.2f %6.2f  %5.3f  %s %5" PRIu64 " %9" PRIu64 "\n",
         s->query, s->events / 1000000, off.median / 1e6, off.min / 1e6,
         off.max / 1e6, on.median / 1e6, on.min / 1e6, on.max / 1e6,
         on.median / off.median, per_core / 1e6,
         (double)s->events / cpu_on.median / 1e6, target / 1e6,
         target / 20 / 1e6, per_core >= target ? "met " : "MISS",
         s->on[o->repeat - 1].checkpoints, s->on[0].rows);
}

static void write_json(const bench_options *o, const query_series *all,
                       int cpus) {
  bench_json json;
  if (bench_json_open(&json, o->json_path) != 0) {
    fprintf(stderr, "nexmark_bench: cannot write %s\n", o->json_path);
    return;
  }
  bench_json_begin_object(&json, NULL);
  bench_json_string(&json, "benchmark", "nexmark");
  bench_json_u64(&json, "repeat", (uint64_t)o->repeat);
  bench_json_u64(&json, "parallelism", (uint64_t)o->parallelism);
  bench_json_u64(&json, "checkpoint_ms", o->checkpoint_ms);
  bench_json_u64(&json, "cpus", (uint64_t)cpus);
  bench_json_begin_array(&json, "queries");
  for (int i = 0; i < o->query_count; i++) {
    const query_series *s = &all[i];
    bench_stats off = stats_of(s->off, o->repeat, false);
    bench_stats on = stats_of(s->on, o->repeat, false);
    bench_stats cpu_on = stats_of(s->on, o->repeat, true);
    char name[8];
    snprintf(name, sizeof name, "q%d", s->query);
    bench_json_begin_object(&json, NULL);
    bench_json_string(&json, "query", name);
    bench_json_u64(&json, "events", s->events);
    bench_json_double(&json, "off_events_per_second_median", off.median);
    bench_json_double(&json, "off_events_per_second_min", off.min);
    bench_json_double(&json, "off_events_per_second_max", off.max);
    bench_json_double(&json, "checkpoint_events_per_second_median", on.median);
    bench_json_double(&json, "checkpoint_events_per_second_min", on.min);
    bench_json_double(&json, "checkpoint_events_per_second_max", on.max);
    bench_json_double(&json, "checkpoint_over_off", on.median / off.median);
    bench_json_double(&json, "checkpoint_per_core", on.median / cpus);
    bench_json_double(&json, "checkpoint_per_cpu_second",
                      (double)s->events / cpu_on.median);
    bench_json_double(&json, "target_per_core", target_per_core(s->query));
    bench_json_double(&json, "flink_per_core", target_per_core(s->query) / 20);
    bench_json_bool(&json, "target_met",
                    on.median / cpus >= target_per_core(s->query));
    bench_json_u64(&json, "rows", s->on[0].rows);
    bench_json_u64(&json, "checkpoints_last_run", s->on[o->repeat - 1].checkpoints);
    bench_json_end_object(&json);
  }
  bench_json_end_array(&json);
  bench_json_end_object(&json);
  if (bench_json_close(&json) != 0)
    fprintf(stderr, "nexmark_bench: writing %s failed\n", o->json_path);
}

static void usage_exit(const char *why) {
  fprintf(stderr,
          "nexmark_bench: %s\nusage: nexmark_bench [--events N] [--repeat R] "
          "[--parallelism P] [--quick] [--queries q0,q5,...] "
          "[--checkpoint-ms MS] [--json PATH]\n",
          why);
  exit(2);
}

static void parse_queries(const char *text, bench_options *o) {
  char copy[256];
  if (!text || strlen(text) >= sizeof copy)
    usage_exit("--queries needs a list like q0,q5");
  strcpy(copy, text);
  o->query_count = 0;
  char *save = NULL;
  for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    int q = nx_query_parse(t);
    if (q < 0 || o->query_count == MAX_QUERIES)
      usage_exit("--queries: not a list of q0 q1 q2 q3 q4 q5 q7 q8 q11");
    o->queries[o->query_count++] = q;
  }
}

static void parse_args(int argc, char **argv, bench_options *o) {
  bool quick = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    uint64_t n = 0;
    if (strcmp(a, "--quick") == 0) {
      quick = true;
      continue;
    }
    if (strcmp(a, "--json") == 0 && v) {
      o->json_path = v, i++;
      continue;
    }
    if (strcmp(a, "--queries") == 0) {
      parse_queries(v, o), i++;
      continue;
    }
    if (!v || bench_parse_count(v, 1000, &n) != 0)
      usage_exit("a flag needs a number");
    if (strcmp(a, "--events") == 0 && n > 0)
      o->events = n;
    else if (strcmp(a, "--repeat") == 0 && n > 0 && n <= MAX_REPEAT)
      o->repeat = (int)n;
    else if (strcmp(a, "--parallelism") == 0 && n > 0 && n <= 64)
      o->parallelism = (int)n;
    else if (strcmp(a, "--checkpoint-ms") == 0 && n > 0 && n < 86400000)
      o->checkpoint_ms = (uint32_t)n;
    else
      usage_exit("unknown flag or value out of range");
    i++;
  }
  if (quick) {
    o->events = o->events && o->events < 2000000 ? o->events : 2000000;
    o->repeat = 1;
  }
}

int main(int argc, char **argv) {
  bench_options o = {.events = 0, .repeat = 3, .parallelism = 1,
                     .checkpoint_ms = 1000};
  for (int i = 0; i < nx_query_count(); i++)
    o.queries[o.query_count++] = nx_query_at(i);
  parse_args(argc, argv, &o);
  int cpus = bench_allowed_cpu_count();
  static query_series all[MAX_QUERIES];
  printf("Nexmark, parallelism %d, %d CPUs, median of %d [min-max]; M "
         "events/s; /core = with checkpoints / %d; ckpts = checkpoints "
         "completed in the last run\n",
         o.parallelism, cpus, o.repeat, cpus);
  printf("%-4s %-5s %-21s %-21s %-5s %-6s  %-6s %-6s  %-5s  %-4s %5s %9s\n",
         "", "events", "checkpoints off", "exactly-once 1 s", "ratio",
         "/core", "/CPU-s", "target", "Flink", "", "ckpts", "rows");
  for (int i = 0; i < o.query_count; i++) {
    query_series *s = &all[i];
    s->query = o.queries[i];
    s->events = o.events ? o.events : default_events(s->query);
    for (int r = 0; r < o.repeat; r++) {
      if (run_once(&o, s->query, s->events, false, &s->off[r]) != 0 ||
          run_once(&o, s->query, s->events, true, &s->on[r]) != 0)
        return 1;
      if (s->off[r].rows != s->on[r].rows) {
        fprintf(stderr, "nexmark_bench: q%d: %" PRIu64 " rows without "
                "checkpoints, %" PRIu64 " with them\n", s->query,
                s->off[r].rows, s->on[r].rows);
        return 1;
      }
    }
    print_row(&o, s, cpus);
    fflush(stdout);
  }
  if (o.json_path)
    write_json(&o, all, cpus);
  return 0;
}
