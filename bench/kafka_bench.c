/* kafka_bench.c — what the Kafka connector costs (operators/kafka_*.c,
 * docs/kafka.md): Nexmark q0 over the same events read from a file and
 * from a Kafka topic, written to a checksum sink and to a Kafka topic.
 *
 *   kafka_bench [--events N] [--partitions K] [--repeat R] [--quick]
 *               [--json PATH]
 *
 * NOTES ON THE DESIGN OF THE KAFKA BENCHMARK
 *
 * 1. The cluster is librdkafka's mock (rdkafka_mock.h) in this process, one
 *    broker, with topic "events" of K partitions (default 8) and "out" of
 *    K.  It is what `sluice kafka mock` runs, without the process: the
 *    benchmark needs nothing started beside it.  The mock keeps about
 *    5 MB per partition (docs/kafka.md), so the default 150,000 events
 *    (about 233 bytes each as JSON) stay below it with 8 partitions.
 * 2. The same events (generator seed 7) go once into a JSON-lines file
 *    and once into "events" (event n into partition n % K, its date_time
 *    as the Kafka timestamp), through the CLI's own code: cli/kafka.c's
 *    kafka_nexmark_gen and kafka_nexmark_source are compiled into this
 *    program, so the Kafka input measured is `sluice nexmark run
 *    --kafka-input` (the Kafka source, its time function and the map that
 *    encodes each line) and the file input is `--input` (nx_source_file).
 * 3. Four series, each one job of parallelism 1 without checkpoints:
 *    file -> checksum (the reference), Kafka -> checksum, file -> Kafka
 *    ("out", the at-least-once sink with q0's CSV rows) and Kafka ->
 *    Kafka.  Each repeat runs every series once, the order rotated by one
 *    per repeat, so drift on a shared machine hits them alike.  A series'
 *    ratio is its median over the reference's median, from this run.
 * 4. CPU.  A run's CPU time is the process's (getrusage) over sl_job_run,
 *    less that of the mock's threads (the threads that appeared when the
 *    mock, its host handle and the probe were made, read from
 *    /proc/self/task in clock ticks: 10 ms each here).  What is left is sluice's, librdkafka's
 *    consumer and producer threads included: the connector's own cost.
 *    Events per CPU-second is the events over that.
 * 5. Checks: every run gives as many rows as the first file -> checksum
 *    run (q0 passes the bids through: 92% of the events); a run into
 *    "out" counts the messages it added (the partitions' end offsets);
 *    a Kafka -> checksum run also gives the file's checksum (the checksum
 *    sink's sums do not depend on order).  A failed check is printed and
 *    makes the exit status 1.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "bench_util.h"
#include "kafka.h" /* cli/: kafka_nexmark_gen, kafka_nexmark_source */
#include "nexmark.h"
#include "sluice.h"
#include "sluice_embed.h"
#include "sluice_testing.h" /* sl_sink_checksum */

#define DEFAULT_EVENTS 150000u /* note 1 */
#define QUICK_EVENTS 50000u
#define DEFAULT_PARTITIONS 8
#define MAX_REPEAT 50
#define MAX_HARNESS_THREADS 64
#define PROBE_WAIT_MS 10000

enum { FILE_SUM, KAFKA_SUM, FILE_KAFKA, KAFKA_KAFKA, SERIES };
static const char *const series_name[SERIES] = {
    "file -> checksum", "kafka -> checksum", "file -> kafka", "kafka -> kafka"};
static const char *const series_key[SERIES] = {
    "file_checksum", "kafka_checksum", "file_kafka", "kafka_kafka"};

typedef struct bench {
  uint64_t events;
  int partitions;
  int repeat;
  bool quick;
  const char *json_path;
  char dir[64];      /* temporary: the events file */
  char path[128];    /* the events file */
  char bootstrap[512];
  rd_kafka_t *probe; /* a consumer handle for end offsets */
  pid_t harness_tids[MAX_HARNESS_THREADS]; /* note 4 */
  int harness_count;
  bool failed; /* a check failed (note 5) */
} bench;

typedef struct run_result {
  double events_per_second, events_per_cpu_second, cpu_seconds;
  double harness_cpu_seconds;
  uint64_t rows;
  sl_checksum sum;
} run_result;

/* ------------------------------------------------------------ CPU time */

static double process_cpu_seconds(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
         (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* User + system time of thread tid of this process (0 if it is gone). */
static double thread_cpu_seconds(pid_t tid) {
  char path[64], line[1024];
  snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
  FILE *f = fopen(path, "r");
  if (!f)
    return 0;
  size_t got = fread(line, 1, sizeof line - 1, f);
  fclose(f);
  line[got] = '\0';
  const char *at = strrchr(line, ')'); /* the name may hold spaces */
  unsigned long long utime = 0, stime = 0;
  /* After ") ": state is field 3; utime and stime are fields 14, 15. */
  if (!at || sscanf(at + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u "
                    "%llu %llu", &utime, &stime) != 2)
    return 0;
  return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

/* The thread ids of this process into tids (at most max).  Returns the
 * count (0 if they cannot be listed: no harness threads are then told
 * apart, note 4). */
static int list_threads(pid_t *tids, int max) {
  int count = 0;
  return bench_threads(tids, NULL, max, &count) == 0 ? count : 0;
}

static double harness_cpu_seconds(const bench *b) {
  double sum = 0;
  for (int i = 0; i < b->harness_count; i++)
    sum += thread_cpu_seconds(b->harness_tids[i]);
  return sum;
}

/* ------------------------------------------------------------ setup */

/* Messages ever written to topic: the sum of its partitions' end offsets
 * (retention deletes old ones, never moves an end back).  UINT64_MAX if
 * the cluster did not answer. */
static uint64_t topic_end(const bench *b, const char *topic) {
  uint64_t sum = 0;
  for (int p = 0; p < b->partitions; p++) {
    int64_t low, high;
    if (rd_kafka_query_watermark_offsets(b->probe, topic, p, &low, &high,
                                         PROBE_WAIT_MS))
      return UINT64_MAX;
    sum += (uint64_t)high;
  }
  return sum;
}

/* Note 2: the events file. */
static int write_events_file(bench *b, const nx_generator_config *gen) {
  snprintf(b->dir, sizeof b->dir, "/tmp/sluice-kafka-bench-XXXXXX");
  if (!mkdtemp(b->dir))
    return errno;
  snprintf(b->path, sizeof b->path, "%s/events.jsonl", b->dir);
  FILE *f = fopen(b->path, "w");
  nx_generated *g = malloc(sizeof *g);
  char *line = malloc(NX_MAX_RECORD_BYTES * 7);
  int rc = f && g && line ? 0 : errno ? errno : ENOMEM;
  for (uint64_t n = 0; rc == 0 && n < gen->events; n++) {
    nx_generate(gen, n, g);
    size_t len = nx_json_write(&g->event, line, NX_MAX_RECORD_BYTES * 7);
    if (len == 0 || len > NX_MAX_RECORD_BYTES * 7 ||
        fwrite(line, 1, len, f) != len)
      rc = EIO;
  }
  if (f && fclose(f) && rc == 0)
    rc = errno;
  free(g);
  free(line);
  return rc;
}

/* Notes 1 and 4: the mock, its topics and the probe, with the ids of the
 * threads they added.  Returns the mock (NULL: failed, said why). */
static rd_kafka_mock_cluster_t *mock_start(bench *b, rd_kafka_t **host) {
  pid_t before[MAX_HARNESS_THREADS], after[MAX_HARNESS_THREADS];
  int before_count = list_threads(before, MAX_HARNESS_THREADS);
  char err[512];
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
  *host = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  if (!*host) {
    rd_kafka_conf_destroy(conf);
    fprintf(stderr, "kafka_bench: %s\n", err);
    return NULL;
  }
  rd_kafka_mock_cluster_t *mock = rd_kafka_mock_cluster_new(*host, 1);
  if (!mock || rd_kafka_mock_topic_create(mock, "events", b->partitions, 1) ||
      rd_kafka_mock_topic_create(mock, "out", b->partitions, 1)) {
    fprintf(stderr, "kafka_bench: no mock cluster with its topics\n");
    return mock;
  }
  snprintf(b->bootstrap, sizeof b->bootstrap, "%s",
           rd_kafka_mock_cluster_bootstraps(mock));
  conf = rd_kafka_conf_new();
  if (rd_kafka_conf_set(conf, "bootstrap.servers", b->bootstrap, err,
                        sizeof err) == RD_KAFKA_CONF_OK)
    rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
  b->probe = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
  if (!b->probe) {
    rd_kafka_conf_destroy(conf);
    fprintf(stderr, "kafka_bench: probe: %s\n", err);
    return mock;
  }
  int after_count = list_threads(after, MAX_HARNESS_THREADS);
  for (int i = 0; i < after_count; i++) {
    bool old = false;
    for (int j = 0; j < before_count && !old; j++)
      old = after[i] == before[j];
    if (!old)
      b->harness_tids[b->harness_count++] = after[i];
  }
  return mock;
}

/* ------------------------------------------------------------ runs */

/* One run of series s (note 3).  Returns 0 or the job's status (said). */
static int run_once(bench *b, int s, run_result *out) {
  bool kafka_in = s == KAFKA_SUM || s == KAFKA_KAFKA;
  bool kafka_out = s == FILE_KAFKA || s == KAFKA_KAFKA;
  sl_job_config config = SL_JOB_CONFIG_INIT;
  sl_job *job = NULL;
  sl_op *events, *result, *sink;
  sl_checksum sum = {0};
  nx_source_config source = {0};
  const char *paths[] = {b->path};
  char address[600];
  snprintf(address, sizeof address, "%s/events", b->bootstrap);
  int rc = sl_job_create(&config, &job);
  if (rc == 0)
    rc = kafka_in ? kafka_nexmark_source(job, address, NULL, 1, 4000, &events)
                  : nx_source_file(job, "events", paths, 1, &source, &events);
  if (rc == 0)
    rc = nx_query_build(job, NX_Q0, events, 1, &result);
  sl_kafka_sink_config kc = {.bootstrap = b->bootstrap, .topic = "out",
                             .format = nx_query_format,
                             .format_user = (void *)(intptr_t)NX_Q0};
  if (rc == 0)
    rc = kafka_out ? sl_sink_kafka(job, "output", result, 1, &kc, &sink)
                   : sl_sink_checksum(job, "output", result, 1, &sum, &sink);
  uint64_t end0 = kafka_out ? topic_end(b, "out") : 0;
  double harness0 = harness_cpu_seconds(b), cpu0 = process_cpu_seconds();
  uint64_t t0 = bench_now_ns();
  if (rc == 0)
    rc = sl_job_run(job);
  double seconds = (double)(bench_now_ns() - t0) / 1e9;
  out->harness_cpu_seconds = harness_cpu_seconds(b) - harness0;
  out->cpu_seconds = process_cpu_seconds() - cpu0 - out->harness_cpu_seconds;
  out->events_per_second = (double)b->events / seconds;
  out->events_per_cpu_second = (double)b->events / out->cpu_seconds;
  out->sum = sum;
  out->rows = sum.records;
  if (rc == 0 && kafka_out) {
    uint64_t end1 = topic_end(b, "out");
    out->rows = end0 == UINT64_MAX || end1 == UINT64_MAX ? 0 : end1 - end0;
  }
  if (rc)
    fprintf(stderr, "kafka_bench: %s: %s\n", series_name[s],
            job && sl_job_error(job)[0] ? sl_job_error(job) : sl_strerror(rc));
  sl_job_destroy(job);
  return rc;
}

/* Note 5. */
static void check_run(bench *b, int s, const run_result *r,
                      const run_result *reference) {
  bool same = r->rows == reference->rows;
  if (s == KAFKA_SUM)
    same = same && r->sum.hash_sum == reference->sum.hash_sum &&
           r->sum.bytes == reference->sum.bytes;
  if (same)
    return;
  fprintf(stderr, "kafka_bench: %s: %" PRIu64 " rows (the file's: %" PRIu64
          ")%s\n", series_name[s], r->rows, reference->rows,
          s == KAFKA_SUM ? " or a checksum other than the file's" : "");
  b->failed = true;
}

/* ------------------------------------------------------------ output */

static bench_stats field_stats(const run_result *runs, int count,
                               size_t offset) {
  double values[MAX_REPEAT];
  for (int i = 0; i < count; i++)
    memcpy(&values[i], (const char *)&runs[i] + offset, sizeof(double));
  return bench_stats_of(values, (size_t)count);
}

#define STATS_OF(runs, count, field)                                          \
  field_stats((runs), (count), offsetof(run_result, field))

static void report(const bench *b, run_result (*runs)[MAX_REPEAT]) {
  bench_stats ref_cpu = STATS_OF(runs[FILE_SUM], b->repeat,
                                 events_per_cpu_second);
  bench_stats ref_wall = STATS_OF(runs[FILE_SUM], b->repeat,
                                  events_per_second);
  printf("\nNexmark q0, %" PRIu64 " events, %d partitions, parallelism 1, "
         "%d repeat(s): median [min-max]\n", b->events, b->partitions,
         b->repeat);
  printf("%-18s %22s %24s %10s %10s %9s %9s\n", "input -> output",
         "k events/s (wall)", "k events per CPU-s", "CPU s", "mock CPU s",
         "CPU-s/file", "wall/file");
  bench_json json;
  bool have_json = b->json_path &&
                   bench_json_create(&json, "kafka_bench", b->json_path) == 0;
  if (have_json) {
    bench_json_string(&json, "benchmark", "kafka_bench");
    bench_json_machine(&json);
    bench_json_begin_object(&json, "config");
    bench_json_string(&json, "query", "q0");
    bench_json_u64(&json, "events", b->events);
    bench_json_u64(&json, "partitions", (uint64_t)b->partitions);
    bench_json_u64(&json, "repeat", (uint64_t)b->repeat);
    bench_json_u64(&json, "parallelism", 1);
    bench_json_bool(&json, "quick", b->quick);
    bench_json_string(&json, "cluster", "librdkafka mock, in process, 1 broker");
    bench_json_end_object(&json);
    bench_json_bool(&json, "checks_passed", !b->failed);
    bench_json_begin_array(&json, "series");
  }
  for (int s = 0; s < SERIES; s++) {
    bench_stats wall = STATS_OF(runs[s], b->repeat, events_per_second);
    bench_stats cpu = STATS_OF(runs[s], b->repeat, events_per_cpu_second);
    bench_stats secs = STATS_OF(runs[s], b->repeat, cpu_seconds);
    bench_stats mock = STATS_OF(runs[s], b->repeat, harness_cpu_seconds);
    double cpu_ratio = cpu.median / ref_cpu.median;
    double wall_ratio = wall.median / ref_wall.median;
    printf("%-18s %8.0f [%5.0f-%5.0f] %10.0f [%5.0f-%5.0f] %10.3f %10.3f "
           "%9.3f %9.3f\n", series_name[s], wall.median / 1e3, wall.min / 1e3,
           wall.max / 1e3, cpu.median / 1e3, cpu.min / 1e3, cpu.max / 1e3,
           secs.median, mock.median, cpu_ratio, wall_ratio);
    if (!have_json)
      continue;
    bench_json_begin_object(&json, 0);
    bench_json_string(&json, "name", series_key[s]);
    bench_json_string(&json, "label", series_name[s]);
    bench_json_string(&json, "input", s == KAFKA_SUM || s == KAFKA_KAFKA
                                           ? "kafka" : "file");
    bench_json_string(&json, "output", s == FILE_KAFKA || s == KAFKA_KAFKA
                                            ? "kafka" : "checksum");
    bench_json_stats(&json, "events_per_second", wall);
    bench_json_stats(&json, "events_per_cpu_second", cpu);
    bench_json_stats(&json, "cpu_seconds", secs);
    bench_json_stats(&json, "mock_cpu_seconds", mock);
    bench_json_double(&json, "per_cpu_second_vs_file", cpu_ratio);
    bench_json_double(&json, "wall_vs_file", wall_ratio);
    bench_json_begin_array(&json, "runs_events_per_cpu_second");
    for (int r = 0; r < b->repeat; r++)
      bench_json_double(&json, 0, runs[s][r].events_per_cpu_second);
    bench_json_end_array(&json);
    bench_json_end_object(&json);
  }
  if (have_json) {
    bench_json_end_array(&json);
    bench_json_finish(&json, "kafka_bench", b->json_path);
  }
  if (b->failed)
    printf("a check failed (see above): the figures are not valid\n");
}

/* ------------------------------------------------------------ main */

static void usage(FILE *out) {
  fprintf(out,
          "usage: kafka_bench [--events N] [--partitions K] [--repeat R] "
          "[--quick] [--json PATH]\n"
          "Nexmark q0 from a file and from Kafka (librdkafka's mock, in "
          "process), into a\nchecksum sink and into Kafka; events per "
          "CPU-second against file -> checksum.\n"
          "  --events N      events (default %u; --quick %u)\n"
          "  --partitions K  partitions of each topic (default %d)\n"
          "  --repeat R      runs of each series, interleaved (default 3; "
          "--quick 1)\n",
          DEFAULT_EVENTS, QUICK_EVENTS, DEFAULT_PARTITIONS);
}

static void parse_options(int argc, char **argv, bench *b) {
  uint64_t events = 0;
  int repeat = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int used = bench_common_flag("kafka_bench", a, v, &b->json_path,
                                 &b->quick, usage);
    if (used == 0 && v && strcmp(a, "--events") == 0)
      events = bench_parse_or_die("kafka_bench", a, v, 1000), used = 2;
    else if (used == 0 && v && strcmp(a, "--partitions") == 0)
      b->partitions = (int)bench_parse_or_die("kafka_bench", a, v, 1),
      used = 2;
    else if (used == 0 && v && strcmp(a, "--repeat") == 0)
      repeat = (int)bench_parse_or_die("kafka_bench", a, v, 1), used = 2;
    if (used == 0) {
      usage(stderr);
      exit(2);
    }
    i += used - 1;
  }
  b->events = events ? events : b->quick ? QUICK_EVENTS : DEFAULT_EVENTS;
  b->repeat = repeat ? repeat : b->quick ? 1 : 3;
  if (b->repeat < 1 || b->repeat > MAX_REPEAT)
    bench_fail("kafka_bench", "--repeat must be 1 to 50");
  if (b->partitions < 1 || b->partitions > 256)
    bench_fail("kafka_bench", "--partitions must be 1 to 256");
}

int main(int argc, char **argv) {
  static bench b = {.partitions = DEFAULT_PARTITIONS};
  static run_result runs[SERIES][MAX_REPEAT];
  parse_options(argc, argv, &b);
  nx_generator_config gen = {.events = b.events, .seed = 7,
                             .events_per_second = 10000000,
                             .base_time_ms = 1700000000000};
  rd_kafka_t *host = NULL;
  int rc = write_events_file(&b, &gen);
  if (rc)
    fprintf(stderr, "kafka_bench: the events file: %s\n", strerror(rc));
  rd_kafka_mock_cluster_t *mock = rc ? NULL : mock_start(&b, &host);
  if (!mock || !b.probe ||
      kafka_nexmark_gen(&gen, b.bootstrap, "events", b.partitions) != 0)
    rc = 1;
  for (int r = 0; rc == 0 && r < b.repeat; r++)
    for (int i = 0; rc == 0 && i < SERIES; i++) { /* rotated: note 3 */
      int s = (i + r) % SERIES;
      rc = run_once(&b, s, &runs[s][r]);
      if (rc == 0)
        printf("round %d: %-18s %8.0f events/s, %8.0f per CPU-s\n", r + 1,
               series_name[s], runs[s][r].events_per_second,
               runs[s][r].events_per_cpu_second);
    }
  for (int r = 0; rc == 0 && r < b.repeat; r++)
    for (int s = 0; s < SERIES; s++)
      check_run(&b, s, &runs[s][r], &runs[FILE_SUM][0]);
  if (rc == 0)
    report(&b, runs);
  if (b.probe)
    rd_kafka_destroy(b.probe);
  if (mock)
    rd_kafka_mock_cluster_destroy(mock);
  if (host)
    rd_kafka_destroy(host);
  if (b.path[0])
    remove(b.path);
  if (b.dir[0])
    rmdir(b.dir);
  return rc ? 1 : b.failed ? 1 : 0;
}
