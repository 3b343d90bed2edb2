/* bench_util.h — small helpers shared by the benchmarks in bench/: a
 * monotonic clock, pinning the calling thread to one CPU, this process's
 * threads and their names, median/min/max of repeated runs, percentiles,
 * number and option parsing, and a tiny JSON writer.  The jobs the
 * benchmarks build are in fixtures.h.
 *
 * Everything is static inline so each benchmark is one translation unit
 * with no extra objects to link (and no -Wmissing-prototypes noise).
 * Every call that can fail returns 0 or an errno value and leaves its
 * out-parameters untouched on failure.
 */
#ifndef SL_BENCH_UTIL_H
#define SL_BENCH_UTIL_H

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/utsname.h>

#include "sluice.h" /* enum sl_chaining */
#include <time.h>
#include <unistd.h>

/* Upper bound on --repeat: the statistics below sort a copy on the stack. */
#define BENCH_MAX_REPEAT 1000u
/* Nesting the JSON writer supports (results are a few levels deep). */
#define BENCH_JSON_MAX_DEPTH 16u

/* ------------------------------------------------------------------ time */

/* CLOCK_MONOTONIC in nanoseconds; comparable across CPUs, so a start taken
 * on one thread and an end taken on another give a valid interval. */
static inline uint64_t bench_now_ns(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
}

/* The calling thread's CPU time in nanoseconds: what another process
 * taking the CPU does not stretch. */
static inline uint64_t bench_thread_cpu_ns(void) {
  struct timespec now;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
}

/* Smallest difference between two back-to-back bench_now_ns() calls over
 * `samples` tries: what one timestamp adds to a measured interval. */
static inline uint64_t bench_clock_overhead_ns(unsigned samples) {
  uint64_t best_ns = UINT64_MAX;
  for (unsigned i = 0; i < samples; i++) {
    uint64_t first_ns = bench_now_ns();
    uint64_t second_ns = bench_now_ns();
    if (second_ns - first_ns < best_ns)
      best_ns = second_ns - first_ns;
  }
  return best_ns;
}

/* --------------------------------------------------------------- pinning */

/* Pin the calling thread to `cpu`.  Returns 0, EINVAL (cpu out of range or
 * not in this process's allowed set) or the error of
 * pthread_setaffinity_np; the affinity is unchanged on error. */
static inline int bench_pin_to_cpu(int cpu) {
  if (cpu < 0 || cpu >= CPU_SETSIZE)
    return EINVAL;
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0)
    return errno;
  if (!CPU_ISSET(cpu, &allowed))
    return EINVAL;
  cpu_set_t only;
  CPU_ZERO(&only);
  CPU_SET(cpu, &only);
  return pthread_setaffinity_np(pthread_self(), sizeof only, &only);
}

/* CPUs this process may run on (at least 1). */
static inline int bench_allowed_cpu_count(void) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0)
    return 1;
  int count = CPU_COUNT(&allowed);
  return count > 0 ? count : 1;
}

/* --------------------------------------------------------------- threads */

/* A thread's name with its NUL fits in the kernel's 16 bytes. */
#define BENCH_THREAD_NAME_BYTES 16

/* This process's threads, from /proc/self/task: the ids of up to max of
 * them into tids and, unless names is NULL, each one's name (its comm:
 * the engine's are "sl:NAME[i]", "sl:writer", "sl:coordinator"; "" for a
 * thread that exited during the walk) into names, and how many were
 * written into *count.  Returns 0, or the errno of listing the directory
 * (*count then untouched). */
static inline int bench_threads(pid_t *tids,
                                char (*names)[BENCH_THREAD_NAME_BYTES],
                                int max, int *count_out) {
  DIR *d = opendir("/proc/self/task");
  if (!d)
    return errno ? errno : EIO;
  int count = 0;
  for (struct dirent *e; count < max && (e = readdir(d));) {
    if (e->d_name[0] == '.')
      continue;
    tids[count] = (pid_t)atoi(e->d_name);
    if (names) {
      char path[300];
      names[count][0] = '\0';
      snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
      FILE *f = fopen(path, "r");
      if (f) {
        if (!fgets(names[count], BENCH_THREAD_NAME_BYTES, f))
          names[count][0] = '\0';
        names[count][strcspn(names[count], "\n")] = '\0';
        fclose(f);
      }
    }
    count++;
  }
  closedir(d);
  *count_out = count;
  return 0;
}

/* ------------------------------------------------------------ statistics */

typedef struct bench_stats {
  double median;
  double min;
  double max;
} bench_stats;

static inline int bench_compare_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static inline int bench_compare_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* Median (mean of the middle two for an even count), min and max of
 * values[0..count); values is not modified.  count must be in
 * [1, BENCH_MAX_REPEAT]. */
static inline bench_stats bench_stats_of(const double *values, size_t count) {
  bench_stats stats = {0, 0, 0};
  if (count == 0 || count > BENCH_MAX_REPEAT)
    return stats;
  double sorted[BENCH_MAX_REPEAT];
  memcpy(sorted, values, count * sizeof *values);
  qsort(sorted, count, sizeof *sorted, bench_compare_double);
  stats.min = sorted[0];
  stats.max = sorted[count - 1];
  stats.median = count % 2 ? sorted[count / 2]
                           : (sorted[count / 2 - 1] + sorted[count / 2]) / 2;
  return stats;
}

static inline void bench_sort_u64(uint64_t *values, size_t count) {
  qsort(values, count, sizeof *values, bench_compare_u64);
}

/* Nearest-rank percentile of an ascending array: the smallest value with at
 * least `fraction` of the samples at or below it.  count must be >= 1. */
static inline uint64_t bench_percentile_sorted_u64(const uint64_t *sorted,
                                                   size_t count,
                                                   double fraction) {
  if (fraction <= 0)
    return sorted[0];
  double rank = fraction * (double)count; /* 1-based rank, rounded up */
  size_t index = (size_t)rank;
  if ((double)index < rank)
    index++;
  if (index < 1)
    index = 1;
  if (index > count)
    index = count;
  return sorted[index - 1];
}

/* --------------------------------------------------------------- parsing */

/* Parse a non-negative integer with an optional suffix k, M or G, each
 * meaning `unit` (1000 for counts, 1024 for bytes) to the power 1, 2, 3;
 * "KiB"/"MiB"/"GiB" and "K"/"KB" forms are accepted too.  Returns 0 or
 * EINVAL (malformed) / ERANGE (overflow). */
static inline int bench_parse_count(const char *text, uint64_t unit,
                                    uint64_t *out) {
  if (!text || !*text || *text == '-')
    return EINVAL;
  char *end = 0;
  errno = 0;
  unsigned long long value = strtoull(text, &end, 10);
  if (errno != 0)
    return errno;
  if (end == text)
    return EINVAL;
  uint64_t scale = 1;
  switch (*end) {
  case '\0':
    break;
  case 'k':
  case 'K':
    scale = unit;
    end++;
    break;
  case 'M':
    scale = unit * unit;
    end++;
    break;
  case 'G':
    scale = unit * unit * unit;
    end++;
    break;
  default:
    return EINVAL;
  }
  if (*end == 'i')
    end++;
  if (*end == 'B')
    end++;
  if (*end != '\0')
    return EINVAL;
  if (value > UINT64_MAX / scale)
    return ERANGE;
  *out = (uint64_t)value * scale;
  return 0;
}

/* Print "program: what" and exit with status 2 (a usage error). */
static inline _Noreturn void bench_fail(const char *program, const char *what) {
  fprintf(stderr, "%s: %s\n", program, what);
  exit(2);
}

/* The value of option `flag` (bench_parse_count with `unit`), or exit with
 * status 1 after naming the flag and the text. */
static inline uint64_t bench_parse_or_die(const char *program,
                                          const char *flag, const char *text,
                                          uint64_t unit) {
  uint64_t value = 0;
  if (!text || bench_parse_count(text, unit, &value) != 0) {
    fprintf(stderr, "%s: bad value for %s: %s\n", program, flag,
            text ? text : "(missing)");
    exit(1);
  }
  return value;
}

/* The flags the ring benchmarks share: --json PATH, --quick, and -h or
 * --help (usage(stdout), then exit 0).  Returns how many arguments the flag
 * used (1 or 2), or 0 when it is none of these; a --json without a path
 * exits with status 1. */
static inline int bench_common_flag(const char *program, const char *flag,
                                    const char *value, const char **json_path,
                                    bool *quick, void (*usage)(FILE *out)) {
  if (strcmp(flag, "--json") == 0) {
    if (!value)
      bench_parse_or_die(program, flag, value, 1);
    *json_path = value;
    return 2;
  }
  if (strcmp(flag, "--quick") == 0) {
    *quick = true;
    return 1;
  }
  if (strcmp(flag, "--help") == 0 || strcmp(flag, "-h") == 0) {
    usage(stdout);
    exit(0);
  }
  return 0;
}

/* The run options the state benchmarks share: --quick (sets *quick, and
 * *repeat = quick_repeat unless that is 0), --repeat R (atoi: the caller
 * checks the range), --json PATH and, when dir is not NULL, --dir DIR.
 * Returns how many arguments the option used (1 or 2), or 0 when it is
 * none of these or its value is missing. */
static inline int bench_run_option(const char *a, const char *v, bool *quick,
                                   int *repeat, int quick_repeat,
                                   const char **json_path, const char **dir) {
  if (strcmp(a, "--quick") == 0) {
    *quick = true;
    if (quick_repeat)
      *repeat = quick_repeat;
    return 1;
  }
  if (!v)
    return 0;
  if (strcmp(a, "--repeat") == 0)
    *repeat = atoi(v);
  else if (strcmp(a, "--json") == 0)
    *json_path = v;
  else if (dir && strcmp(a, "--dir") == 0)
    *dir = v;
  else
    return 0;
  return 2;
}

/* Index of the name at[0..length) among names[0..count), or -1: for
 * comma-separated lists of modes or implementations. */
static inline int bench_find_name(const char *const *names, size_t count,
                                  const char *at, size_t length) {
  for (size_t i = 0; i < count; i++)
    if (strlen(names[i]) == length && strncmp(names[i], at, length) == 0)
      return (int)i;
  return -1;
}

/* This program's file, from /proc/self/exe, for the benchmarks that start
 * fresh copies of themselves through a shell: refused (EINVAL) if it holds
 * a single quote, which the quoted command line could not carry.  Returns
 * 0 or an errno value; out is unspecified on error. */
static inline int bench_self_path(char *out, size_t out_bytes) {
  ssize_t length = readlink("/proc/self/exe", out, out_bytes - 1);
  if (length <= 0)
    return length < 0 ? errno : ENOENT;
  if (memchr(out, '\'', (size_t)length))
    return EINVAL;
  out[length] = '\0';
  return 0;
}

/* ------------------------------------------------------------------ JSON */

/* Create every missing parent directory of the file `path` (like mkdir -p
 * of its dirname).  Returns 0 or the errno of the failing mkdir. */
static inline int bench_make_parent_dirs(const char *path) {
  char buffer[4096];
  size_t length = strlen(path);
  if (length >= sizeof buffer)
    return ENAMETOOLONG;
  memcpy(buffer, path, length + 1);
  for (size_t i = 1; i < length; i++) {
    if (buffer[i] != '/')
      continue;
    buffer[i] = '\0';
    if (mkdir(buffer, 0777) != 0 && errno != EEXIST)
      return errno;
    buffer[i] = '/';
  }
  return 0;
}

/* A minimal streaming JSON writer: objects, arrays, strings, numbers,
 * booleans.  Keys are given with each value (NULL inside arrays).  Output
 * is indented two spaces per level. */
typedef struct bench_json {
  FILE *file;
  unsigned depth;
  bool has_items[BENCH_JSON_MAX_DEPTH]; /* a comma is due at that level */
} bench_json;

/* Open `path` for writing, creating its parent directories.  Returns 0 or
 * an errno value; json is unusable on error. */
static inline int bench_json_open(bench_json *json, const char *path) {
  memset(json, 0, sizeof *json);
  int rc = bench_make_parent_dirs(path);
  if (rc != 0)
    return rc;
  json->file = fopen(path, "w");
  return json->file ? 0 : errno;
}

/* Flush and close.  Returns 0 or the errno of a failed write. */
static inline int bench_json_close(bench_json *json) {
  if (!json->file)
    return EBADF;
  fputc('\n', json->file);
  int failed = ferror(json->file);
  int rc = fclose(json->file);
  json->file = 0;
  return (failed || rc != 0) ? EIO : 0;
}

static inline void bench_json_write_string(FILE *file, const char *text) {
  fputc('"', file);
  for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
    if (*c == '"' || *c == '\\')
      fprintf(file, "\\%c", *c);
    else if (*c < 0x20)
      fprintf(file, "\\u%04x", *c);
    else
      fputc(*c, file);
  }
  fputc('"', file);
}

/* Comma, newline, indentation and "key": before a value. */
static inline void bench_json_prefix(bench_json *json, const char *key) {
  if (json->depth > 0) {
    if (json->has_items[json->depth - 1])
      fputc(',', json->file);
    json->has_items[json->depth - 1] = true;
    fprintf(json->file, "\n%*s", (int)(2 * json->depth), "");
  }
  if (key) {
    bench_json_write_string(json->file, key);
    fputs(": ", json->file);
  }
}

static inline void bench_json_open_container(bench_json *json,
                                             const char *key, char bracket) {
  bench_json_prefix(json, key);
  fputc(bracket, json->file);
  if (json->depth < BENCH_JSON_MAX_DEPTH)
    json->has_items[json->depth] = false;
  json->depth++;
}

static inline void bench_json_close_container(bench_json *json,
                                              char bracket) {
  if (json->depth == 0)
    return;
  json->depth--;
  if (json->depth < BENCH_JSON_MAX_DEPTH && json->has_items[json->depth])
    fprintf(json->file, "\n%*s", (int)(2 * json->depth), "");
  fputc(bracket, json->file);
}

static inline void bench_json_begin_object(bench_json *json, const char *key) {
  bench_json_open_container(json, key, '{');
}
static inline void bench_json_end_object(bench_json *json) {
  bench_json_close_container(json, '}');
}
static inline void bench_json_begin_array(bench_json *json, const char *key) {
  bench_json_open_container(json, key, '[');
}
static inline void bench_json_end_array(bench_json *json) {
  bench_json_close_container(json, ']');
}

static inline void bench_json_string(bench_json *json, const char *key,
                                     const char *value) {
  bench_json_prefix(json, key);
  bench_json_write_string(json->file, value);
}

/* JSON has no NaN or infinity: those become null. */
static inline void bench_json_double(bench_json *json, const char *key,
                                     double value) {
  bench_json_prefix(json, key);
  if (value != value || value > 1e308 || value < -1e308)
    fputs("null", json->file);
  else
    fprintf(json->file, "%.6g", value);
}

static inline void bench_json_u64(bench_json *json, const char *key,
                                  uint64_t value) {
  bench_json_prefix(json, key);
  fprintf(json->file, "%llu", (unsigned long long)value);
}

static inline void bench_json_bool(bench_json *json, const char *key,
                                   bool value) {
  bench_json_prefix(json, key);
  fputs(value ? "true" : "false", json->file);
}

/* bench_json_open, then begin the top-level object; on error say why
 * (naming program and path).  Returns 0 or the errno of the open. */
static inline int bench_json_create(bench_json *json, const char *program,
                                    const char *path) {
  int rc = bench_json_open(json, path);
  if (rc) {
    fprintf(stderr, "%s: cannot write %s: %s\n", program, path, strerror(rc));
    return rc;
  }
  bench_json_begin_object(json, 0);
  return 0;
}

/* End the top-level object, close the file and say where it went (or why
 * it could not be written).  Returns 0 or the errno of bench_json_close. */
static inline int bench_json_finish(bench_json *json, const char *program,
                                    const char *path) {
  bench_json_end_object(json);
  int rc = bench_json_close(json);
  if (rc)
    fprintf(stderr, "%s: cannot write %s: %s\n", program, path, strerror(rc));
  else
    printf("written: %s\n", path);
  return rc;
}

/* {"median": .., "min": .., "max": ..} under `key`. */
static inline void bench_json_stats(bench_json *json, const char *key,
                                    bench_stats stats) {
  bench_json_begin_object(json, key);
  bench_json_double(json, "median", stats.median);
  bench_json_double(json, "min", stats.min);
  bench_json_double(json, "max", stats.max);
  bench_json_end_object(json);
}

/* The CPU model from /proc/cpuinfo into out (or "unknown"). */
static inline void bench_cpu_model(char *out, size_t out_bytes) {
  snprintf(out, out_bytes, "unknown");
  FILE *file = fopen("/proc/cpuinfo", "r");
  if (!file)
    return;
  char line[512];
  while (fgets(line, sizeof line, file)) {
    if (strncmp(line, "model name", 10) != 0)
      continue;
    const char *colon = strchr(line, ':');
    if (!colon)
      break;
    colon++;
    while (*colon == ' ' || *colon == '\t')
      colon++;
    snprintf(out, out_bytes, "%s", colon);
    size_t length = strlen(out);
    if (length > 0 && out[length - 1] == '\n')
      out[length - 1] = '\0';
    break;
  }
  fclose(file);
}

/* A "machine" object: CPU model, allowed CPUs, kernel, UTC time. */
static inline void bench_json_machine(bench_json *json) {
  char model[256];
  bench_cpu_model(model, sizeof model);
  struct utsname system;
  char kernel[300] = "unknown";
  if (uname(&system) == 0)
    snprintf(kernel, sizeof kernel, "%s %s %s", system.sysname,
             system.release, system.machine);
  char when[64] = "unknown";
  time_t now = time(0);
  struct tm utc;
  if (gmtime_r(&now, &utc))
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &utc);
  bench_json_begin_object(json, "machine");
  bench_json_string(json, "cpu_model", model);
  bench_json_u64(json, "allowed_cpus", (uint64_t)bench_allowed_cpu_count());
  bench_json_string(json, "kernel", kernel);
  bench_json_string(json, "time_utc", when);
  bench_json_end_object(json);
}

/* Opens one series of a pipeline benchmark's JSON (pipeline_p2,
 * pipeline_p3) and writes its name and parallelism, median/min/max, every
 * run's rate and, for a checkpointed series (checkpoint_ms > 0), the
 * interval and the checkpoints each run completed. The caller adds its own
 * keys and closes the object with bench_json_end_object(). */
static inline void bench_json_series_begin(bench_json *json, const char *name,
                                     uint64_t parallelism,
                                     const bench_stats *stats,
                                     const double *rates, int runs,
                                     uint32_t checkpoint_ms,
                                     const uint64_t *checkpoints) {
  bench_json_begin_object(json, 0);
  bench_json_string(json, "name", name);
  bench_json_u64(json, "parallelism", parallelism);
  bench_json_double(json, "median", stats->median);
  bench_json_double(json, "min", stats->min);
  bench_json_double(json, "max", stats->max);
  bench_json_begin_array(json, "runs");
  for (int r = 0; r < runs; r++)
    bench_json_double(json, 0, rates[r]);
  bench_json_end_array(json);
  if (checkpoint_ms) {
    bench_json_u64(json, "checkpoint_interval_ms", checkpoint_ms);
    bench_json_begin_array(json, "checkpoints_completed");
    for (int r = 0; r < runs; r++)
      bench_json_u64(json, 0, checkpoints[r]);
    bench_json_end_array(json);
  }
}

/* --chaining's value: auto, always or never as enum sl_chaining, or -1. */
static inline int bench_parse_chaining(const char *v) {
  if (!v)
    return -1;
  if (strcmp(v, "auto") == 0)
    return SL_CHAINING_AUTO;
  if (strcmp(v, "always") == 0)
    return SL_CHAINING_ALWAYS;
  if (strcmp(v, "never") == 0)
    return SL_CHAINING_NEVER;
  return -1;
}

#endif /* SL_BENCH_UTIL_H */
