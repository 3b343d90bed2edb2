/* pipeline_series.h — the harness P2 and P3 share (pipeline_p2.c,
 * pipeline_p3.c): their options and command line, the "series" (named
 * configurations measured one run each in turn, R times), the job config of
 * a series with its temporary checkpoint directory, the timed run, and the
 * table rows and JSON of the results.  Each benchmark keeps what is its
 * own: its operators, its closed-form checks and its table heading.
 *
 * Notes on the design:
 *  1. Header only, static inline, like bench_util.h and fixtures.h: nothing
 *     here runs per record; the timed part of a run is sl_job_run() alone.
 *  2. Series run interleaved (one run of each in turn) so drift on a shared
 *     machine hits them alike; pipeline_measure() is that loop.
 */
#ifndef SL_BENCH_PIPELINE_SERIES_H
#define SL_BENCH_PIPELINE_SERIES_H

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "fixtures.h"
#include "sluice.h"
#include "sluice_testing.h" /* the sequence source */

/* Upper bound on --repeat: the per-series arrays below are this long. */
#define PIPELINE_MAX_REPEAT 50

/* One configuration of a pipeline benchmark and its measured runs. */
typedef struct pipeline_series {
  const char *name;
  int variant;     /* the benchmark's own choice (P2: how state is reached) */
  int pin_policy;
  bool checkpoint; /* checkpoint every --checkpoint-ms into a temporary dir */
  int parallelism; /* of the keyed operator and the sink; 0: --parallelism */
  double rates[PIPELINE_MAX_REPEAT];         /* input tuples/s of each run */
  uint64_t checkpoints[PIPELINE_MAX_REPEAT]; /* completed, of each run */
  double cores[PIPELINE_MAX_REPEAT]; /* CPU seconds / wall seconds */
  double cpu_s_per_million[PIPELINE_MAX_REPEAT]; /* CPU s per 1M tuples */
  int runs;
  bench_stats stats;
  bench_stats cpu_cores;
  bench_stats cpu_per_million;
} pipeline_series;

typedef struct pipeline_options {
  const char *program; /* "pipeline_p2": prefixes every message */
  uint64_t records;
  uint64_t keys;
  uint64_t window; /* P3 only (--window); 0: the option is refused */
  int repeat;
  int parallelism;
  uint32_t checkpoint_ms;
  const char *json;
  sl_job_config config; /* ring and batch settings from the command line */
} pipeline_options;

/* Parallelism of the keyed operator and the sink in series s. */
static inline int pipeline_parallelism(const pipeline_options *o,
                                       const pipeline_series *s) {
  return s->parallelism ? s->parallelism : o->parallelism;
}

/* ------------------------------------------------------- command line */

/* Fill chosen[] from a comma-separated list of names of known[0..known_count).
 * Returns the count, or -1 (after printing why) for an unknown or repeated
 * name. */
static inline int pipeline_parse_series(const char *program, const char *list,
                                        const pipeline_series *known,
                                        int known_count,
                                        pipeline_series *chosen) {
  int count = 0;
  const char *at = list;
  while (*at) {
    size_t length = strcspn(at, ",");
    int found = -1;
    for (int i = 0; i < known_count; i++)
      if (strlen(known[i].name) == length &&
          strncmp(known[i].name, at, length) == 0)
        found = i;
    for (int i = 0; found >= 0 && i < count; i++)
      if (strcmp(chosen[i].name, known[found].name) == 0)
        found = -1;
    if (found < 0) {
      fprintf(stderr, "%s: unknown or repeated series '%.*s'\n", program,
              (int)length, at);
      return -1;
    }
    chosen[count++] = known[found];
    at += length;
    if (*at == ',')
      at++;
  }
  return count;
}

/* Apply one option with its value n (parsed) to o.  Returns whether the
 * option is known and n is in its range. */
static inline bool pipeline_apply_count(pipeline_options *o, const char *a,
                                        uint64_t n) {
  if (strcmp(a, "--records") == 0 && n > 0)
    o->records = n;
  else if (strcmp(a, "--keys") == 0 && n > 0 && n <= 1u << 26)
    o->keys = n;
  else if (strcmp(a, "--window") == 0 && o->window && n > 0 && n <= 1u << 30)
    o->window = n;
  else if (strcmp(a, "--repeat") == 0 && n >= 1 && n <= PIPELINE_MAX_REPEAT)
    o->repeat = (int)n;
  else if (strcmp(a, "--parallelism") == 0 && n >= 1 &&
           n <= SL_MAX_PARALLELISM)
    o->parallelism = (int)n;
  else if (strcmp(a, "--checkpoint-ms") == 0 && n >= 1 && n <= UINT32_MAX)
    o->checkpoint_ms = (uint32_t)n;
  else if (strcmp(a, "--ring-bytes") == 0)
    o->config.ring_bytes = n;
  else if (strcmp(a, "--batch") == 0 && n <= UINT32_MAX)
    o->config.output_batch_records = (uint32_t)n;
  else
    return false;
  return true;
}

/* Parse the command line into o and chosen[] (the series named by --series,
 * default `all_names`, out of known[]).  Returns the series count, or -1
 * after printing `usage`. */
static inline int pipeline_parse_args(int argc, char **argv,
                                      pipeline_options *o,
                                      const char *all_names,
                                      const pipeline_series *known,
                                      int known_count, const char *usage,
                                      pipeline_series *chosen) {
  const char *list = all_names;
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
    else if (strcmp(a, "--chaining") == 0 && bench_parse_chaining(v) >= 0)
      o->config.chaining = bench_parse_chaining(v);
    else if (!has_value || !pipeline_apply_count(o, a, n))
      return fputs(usage, stderr), -1;
    i++;
  }
  int count =
      pipeline_parse_series(o->program, list, known, known_count, chosen);
  if (count == 0)
    fprintf(stderr, "%s: no series chosen\n", o->program);
  return count > 0 ? count : (fputs(usage, stderr), -1);
}

/* ---------------------------------------------------------------- runs */

/* What a benchmark adds to the harness: its keyed operator and sink, and
 * its check of a run's result (kept in `result`, the benchmark's own). */
typedef struct pipeline_bench {
  /* Clear result before a run. */
  void (*reset)(void *result);
  /* Add series s's keyed operator and sink behind keyed (the source's
   * sl_op_key_by stream) at parallelism; returns 0 or the sl_* error. */
  int (*build)(sl_job *job, sl_op *keyed, const pipeline_series *s,
               int parallelism, void *result);
  /* Whether the run's result matches the closed forms (printing the first
   * mismatch if not). */
  bool (*check)(const void *result, uint64_t records);
  void *result;
  /* Print the table's heading (what ran; the column names). */
  void (*heading)(const pipeline_options *o);
  const char *plain_name, *checkpointed_name; /* their ratio is printed */
  const char *unit; /* of the rates in the JSON */
} pipeline_bench;

/* The job config of series s in *config; for a checkpointed series, a
 * temporary state directory is made in dir (dir_bytes long, outliving the
 * run).  Returns 0, or -1 after printing why. */
static inline int pipeline_job_config(const pipeline_options *o,
                                      const pipeline_series *s, char *dir,
                                      size_t dir_bytes,
                                      sl_job_config *config) {
  *config = o->config;
  config->struct_bytes = sizeof *config; /* sluice.h ABI */
  config->pin_policy = s->pin_policy;
  if (!s->checkpoint)
    return 0;
  snprintf(dir, dir_bytes, "/tmp/sluice-%s-XXXXXX", o->program);
  if (!mkdtemp(dir)) {
    fprintf(stderr, "%s: mkdtemp %s: %s\n", o->program, dir, strerror(errno));
    return -1;
  }
  config->checkpoint.state_dir = dir;
  config->checkpoint.interval_ms = o->checkpoint_ms;
  config->checkpoint.no_sync = 1;
  config->checkpoint.store_policy = SL_STORE_FRESH;
  return 0;
}

/* Run a built job (rc: the error of building it, if any), time it, count
 * its checkpoints into *checkpoints, its CPU seconds into *cpu_s, destroy
 * it and remove the checkpoint directory.  Returns the seconds of
 * sl_job_run(), or a negative value (after printing why) on failure. */
static inline double pipeline_run_job(const pipeline_options *o,
                                      const pipeline_series *s, sl_job *job,
                                      int rc, const char *dir,
                                      uint64_t *checkpoints, double *cpu_s) {
  double cpu0_s = fixture_cpu_now_s();
  uint64_t start_ns = bench_now_ns();
  if (!rc)
    rc = sl_job_run(job);
  uint64_t elapsed_ns = bench_now_ns() - start_ns;
  *cpu_s = fixture_cpu_now_s() - cpu0_s;
  if (rc)
    fprintf(stderr, "%s: %s: %s: %s\n", o->program, s->name, sl_strerror(rc),
            job ? sl_job_error(job) : "");
  *checkpoints = job && s->checkpoint ? fixture_completed_checkpoints(job) : 0;
  sl_job_destroy(job);
  if (s->checkpoint)
    fixture_remove_tree(dir);
  return rc ? -1 : (double)elapsed_ns / 1e9;
}

/* Build the job of series s (sequence source of o->records tuples over
 * o->keys keys -> key_by -> the benchmark's operators), run it once and
 * check its result.  Returns input tuples/s, or a negative value (after
 * printing why) on failure. */
static inline double pipeline_run_once(const pipeline_options *o,
                                       const pipeline_series *s,
                                       const pipeline_bench *bench,
                                       uint64_t *checkpoints, double *cpu_s) {
  sl_job_config config;
  char dir[64];
  if (pipeline_job_config(o, s, dir, sizeof dir, &config) != 0)
    return -1;
  bench->reset(bench->result);
  sl_job *job = 0;
  sl_op *source, *keyed;
  int rc = sl_job_create(&config, &job);
  if (!rc)
    rc = sl_source_sequence(job, "source", 1, o->records, o->keys, &source);
  if (!rc)
    rc = sl_op_key_by(job, "by-key", source, fixture_tuple_key, 0, &keyed);
  if (!rc)
    rc = bench->build(job, keyed, s, pipeline_parallelism(o, s),
                      bench->result);
  double seconds = pipeline_run_job(o, s, job, rc, dir, checkpoints, cpu_s);
  if (seconds < 0 || !bench->check(bench->result, o->records))
    return -1;
  return (double)o->records / seconds;
}

/* Measure: R rounds, one run of each series in turn (note 2), then each
 * series' statistics.  Returns 0, or 1 at the first failed run. */
static inline int pipeline_measure(const pipeline_options *o,
                                   pipeline_series *all, int count,
                                   const pipeline_bench *bench) {
  for (int r = 0; r < o->repeat; r++) {
    for (int i = 0; i < count; i++) {
      pipeline_series *s = &all[i];
      uint64_t checkpoints = 0;
      double cpu_s = 0;
      double rate = pipeline_run_once(o, s, bench, &checkpoints, &cpu_s);
      if (rate < 0)
        return 1;
      /* cpu_s / wall seconds, the wall time being records / rate */
      s->cores[s->runs] = cpu_s * rate / (double)o->records;
      s->cpu_s_per_million[s->runs] = cpu_s / ((double)o->records / 1e6);
      s->rates[s->runs] = rate;
      s->checkpoints[s->runs] = checkpoints;
      s->runs++;
    }
  }
  for (int i = 0; i < count; i++) {
    size_t runs = (size_t)all[i].runs;
    all[i].stats = bench_stats_of(all[i].rates, runs);
    all[i].cpu_cores = bench_stats_of(all[i].cores, runs);
    all[i].cpu_per_million = bench_stats_of(all[i].cpu_s_per_million, runs);
  }
  return 0;
}

/* -------------------------------------------------------------- output */

/* The table's rows under the benchmark's heading, then the ratio of the
 * medians of the series named checkpointed over plain, if both ran. */
static inline void pipeline_print_rows(const pipeline_options *o,
                                       const pipeline_series *all, int count,
                                       const char *plain_name,
                                       const char *checkpointed_name) {
  const pipeline_series *plain = 0, *checkpointed = 0;
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
    if (strcmp(all[i].name, plain_name) == 0)
      plain = &all[i];
    if (strcmp(all[i].name, checkpointed_name) == 0)
      checkpointed = &all[i];
  }
  if (plain && checkpointed)
    printf("  ratio %s / %s (medians): %.2f\n", checkpointed_name, plain_name,
           checkpointed->stats.median / plain->stats.median);
  printf("  target: >= 65 M tuples/s; WindFlow best config here: median 32\n");
}

/* Write the results to o->json: the benchmark's name, sizes and unit, the
 * machine, then one object per series (bench_json_series_begin's keys and
 * "cpu_cores" and "cpu_seconds_per_million_tuples", each {median, min,
 * max}).  Returns 0 or an errno value (after printing why). */
static inline int pipeline_write_json(const pipeline_options *o,
                                      const pipeline_series *all, int count,
                                      const char *unit) {
  bench_json json;
  int rc = bench_json_open(&json, o->json);
  if (rc) {
    fprintf(stderr, "%s: %s: %s\n", o->program, o->json, strerror(rc));
    return rc;
  }
  bench_json_begin_object(&json, 0);
  bench_json_string(&json, "benchmark", o->program);
  bench_json_u64(&json, "records", o->records);
  bench_json_u64(&json, "keys", o->keys);
  if (o->window)
    bench_json_u64(&json, "window", o->window);
  bench_json_u64(&json, "parallelism", (uint64_t)o->parallelism);
  bench_json_u64(&json, "repeat", (uint64_t)o->repeat);
  bench_json_string(&json, "unit", unit);
  bench_json_machine(&json);
  bench_json_begin_array(&json, "series");
  for (int i = 0; i < count; i++) {
    const pipeline_series *s = &all[i];
    bench_json_series_begin(&json, s->name,
                            (uint64_t)pipeline_parallelism(o, s), &s->stats,
                            s->rates, s->runs,
                            s->checkpoint ? o->checkpoint_ms : 0,
                            s->checkpoints);
    bench_json_stats(&json, "cpu_cores", s->cpu_cores);
    bench_json_stats(&json, "cpu_seconds_per_million_tuples",
                     s->cpu_per_million);
    bench_json_end_object(&json);
  }
  bench_json_end_array(&json);
  bench_json_end_object(&json);
  rc = bench_json_close(&json);
  if (rc)
    fprintf(stderr, "%s: %s: %s\n", o->program, o->json, strerror(rc));
  else
    printf("  written: %s\n", o->json);
  return rc;
}

/* The whole benchmark once the command line is parsed: measure, print the
 * table, write the JSON.  Returns the exit status (0, or 1 on a failed run
 * or an unwritten JSON). */
static inline int pipeline_main(const pipeline_options *o,
                                pipeline_series *all, int count,
                                const pipeline_bench *bench) {
  if (pipeline_measure(o, all, count, bench) != 0)
    return 1;
  bench->heading(o);
  pipeline_print_rows(o, all, count, bench->plain_name,
                      bench->checkpointed_name);
  return pipeline_write_json(o, all, count, bench->unit) == 0 ? 0 : 1;
}

#endif /* SL_BENCH_PIPELINE_SERIES_H */
