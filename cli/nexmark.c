/* nexmark.c — `sluice nexmark`: generate Nexmark events to a file, or run
 * one Nexmark query over generated events or event files.
 *
 *   sluice nexmark gen --events N [--output FILE] [generator options]
 *   sluice nexmark run --query qN [--events N | --input FILE...] [options]
 *
 * The run's exactly-once output (--output FILE) goes through the
 * transactional file sink into FILE.parts/ (committed part files, one
 * series per sink instance); when the job has finished, the committed rows
 * are sorted and written to FILE with the query's CSV header (cli/merge.h:
 * RFC 4180 rows in byte order, an external merge sort in bounded memory,
 * through FILE.tmp and a rename).  Sorting makes the file independent of
 * the parallelism and of how the rows interleaved, so a run killed and
 * resumed (--resume) can be compared byte for byte with an uninterrupted
 * one.
 *
 * Earlier runs' results:
 * - FILE exists only after a run that finished: every run with --output
 *   removes FILE (and FILE.tmp) before it starts, so a failed, refused or
 *   killed run leaves none (cli_retire_output).
 * - FILE.parts belongs to one job lineage (include/sluice.h, the file
 *   sink).  A run that can never be resumed (no --state-dir) or that asked
 *   for --fresh deletes another lineage's committed parts there; a run
 *   with a state directory and neither flag is refused if FILE.parts holds
 *   them (they stay for a later --resume of their run).
 * - An explicit --resume with no complete checkpoint in the state
 *   directory is refused ("nothing to resume in DIR", exit 1): it never
 *   starts fresh nor merges another run's parts.
 *
 * Without --output the rows go to a checksum sink (count and an
 * order-independent hash, printed at the end).
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fixtures.h"
#include "cli_util.h"
#include "kafka.h"
#include "merge.h"
#include "nexmark.h"
#include "output.h"
#include "sluice.h"
#include "sluice_testing.h" /* unstable test helpers */

#define NEXMARK_MAX_INPUTS 64

typedef struct nexmark_options {
  int query;
  nx_generator_config gen;
  nx_source_config source;
  const char *inputs[NEXMARK_MAX_INPUTS];
  int input_count;
  bool events_given;
  const char *output;
  int parallelism;
  sl_job_config config;
  int cpus[MAX_CPUS];
  bool quiet;
  bool json;
  char faults[4096];
  const char *stop_savepoint; /* --stop-savepoint: signals stop with a
                                 savepoint into it (cli_stopper_start) */
  bool drain;                 /* --drain: that stop drains first */
  const char *kafka;          /* gen --kafka BOOTSTRAP (with --topic) */
  const char *kafka_topic;
  int kafka_partitions;
  const char *kafka_input;    /* run --kafka-input BOOTSTRAP/TOPIC */
  const char *kafka_output;   /* run --kafka-output BOOTSTRAP/TOPIC */
  const char *kafka_partitions_list; /* run --kafka-partitions LIST */
} nexmark_options;

void nexmark_usage(FILE *out) {
  fprintf(out,
          "usage: sluice nexmark gen --events N [--output FILE] [generator options]\n"
          "       sluice nexmark run --query qN [--events N | --input FILE...] [options]\n"
          "\n"
          "Queries: q0 pass-through, q1 currency conversion, q2 selection, q3 local\n"
          "item suggestion, q4 average price per category, q5 hot items, q7 highest\n"
          "bid, q8 monitor new users, q11 user sessions (docs/nexmark.md).\n"
          "\n"
          "Generator options (gen, and run without --input):\n"
          "  --events N             events in all (default 10000000)\n"
          "  --seed S               equal seeds give equal events (default 1)\n"
          "  --rate R               event-time rate, events per second of event\n"
          "                         time (default 10000000, nexmark/nexmark's)\n"
          "  --base-time-ms T       date_time of the first event (default\n"
          "                         1700000000000)\n"
          "  --out-of-order-ms D    move each event back by up to D ms (default 0)\n"
          "gen:\n"
          "  --output FILE          JSON lines to FILE (default: standard output)\n"
          "  --kafka BOOTSTRAP --topic T [--partitions K]  instead, one JSON line\n"
          "                         per message into topic T (made with K\n"
          "                         partitions, default 1, if missing); event n\n"
          "                         goes to partition n %% K (docs/kafka.md)\n");
  /* Two calls: one literal would pass the 4095 bytes C99 promises. */
  fprintf(out,
          "run:\n"
          "  --query qN             the query (required)\n"
          "  --input FILE...        read events from JSON-lines files instead\n"
          "  --kafka-input BOOTSTRAP/TOPIC  read events from a topic instead (as\n"
          "                         `gen --kafka` writes them; the topic as it was\n"
          "                         at the first start)\n"
          "  --kafka-partitions LIST  read only these partitions (\"0-3,7\"): so\n"
          "                         that several processes split a topic\n"
          "  --kafka-output BOOTSTRAP/TOPIC  each row as one message (the CSV line\n"
          "                         of --output, no header), at-least-once\n"
          "  --output FILE          exactly-once output: sorted CSV rows with a\n"
          "                         header in FILE, part files in FILE.parts/\n"
          "                         (default: count and checksum the rows); an\n"
          "                         earlier FILE is removed first, so FILE\n"
          "                         exists only after a run that finished.  The\n"
          "                         sort spills runs of SLUICE_MERGE_RUN_BYTES\n"
          "                         (default 64 MiB) beside FILE\n"
          "  --parallelism P        instances of every operator (default 1; the\n"
          "                         event-file source always runs one)\n"
          "  --watermark-lag-ms L   watermarks trail the largest date_time by L\n"
          "                         (default 4000, Nexmark's)\n"
          "  --rate-limit R         at most R events/s per source instance\n"
          "  --checkpoint-interval MS  take checkpoints every MS ms (needs\n"
          "                         --state-dir; default 1000)\n");
  /* Two calls: C11 promises string literals of 4095 bytes only. */
  fprintf(out,
          "  --state-dir DIR        checkpoint into the LMDB store in DIR\n"
          "  --resume               continue from DIR's newest checkpoint (none:\n"
          "                         refused, \"nothing to resume in DIR\")\n"
          "  --fresh                delete DIR's checkpoints, and another run's\n"
          "                         parts in FILE.parts, first\n"
          "  --no-sync              commit checkpoints without fsync\n"
          "  --at-least-once        barriers not aligned: every input is read until\n"
          "                         the last barrier arrives, so records after a\n"
          "                         barrier may be in the snapshot and are replayed\n"
          "                         after a failure (duplicates, never loss)\n"
          "  --unaligned            unaligned checkpoints: barriers overtake the\n"
          "                         records in flight, saved with the checkpoint\n"
          "                         and replayed on restore (exactly-once)\n"
          "  --aligned-timeout-ms MS  with --unaligned: checkpoints start aligned\n"
          "                         and switch to unaligned at an instance whose\n"
          "                         alignment lasted MS ms (default 0: unaligned\n"
          "                         from the start)\n"
          "  --stop-savepoint DIR   the first SIGTERM or SIGINT stops the run with\n"
          "                         a savepoint into DIR (no end of input: resume\n"
          "                         with --state-dir and --resume, or from DIR),\n"
          "                         prints `stopped with savepoint DIR (checkpoint\n"
          "                         N)` and exits 0 (without --output's FILE); a\n"
          "                         second signal stops at once\n"
          "  --drain                with --stop-savepoint: end the input first\n"
          "                         (final watermark, windows fire, FILE written)\n"
          "  --fault SPEC           inject faults (repeatable; the grammar is in\n"
          "                         docs/failover-and-faults.md)\n"
          "  --restart STRATEGY     as for sluice run\n"
          "  --cpus LIST, --no-pin  pinning, as for sluice run\n"
          "  --chaining MODE        auto, always or never, as for sluice run\n"
          "  --copy-pass-mib N|off  as for sluice run\n"
          "  --quiet                no live status line\n"
          "  --log-level LEVEL      error, warn, info (default; SLUICE_LOG_LEVEL\n"
          "                         sets it too) or debug\n"
          "  --json                 print the summary as one JSON object\n"
          "\n"
          "An --input FIFO or /dev/stdin is read without blocking the job: SIGINT\n"
          "or SIGTERM stops it even while no writer has come.  A --resume refuses\n"
          "an event file replaced, truncated or changed before the checkpointed\n"
          "position; one appended to resumes.  Exit status: 0 success, 1 failure,\n"
          "2 usage error, 130 stopped by SIGINT, 143 stopped by SIGTERM.\n");
}

/* ------------------------------------------------------------ options */

static bool generator_option(const char *a, const char *v,
                             nexmark_options *o) {
  if (strcmp(a, "--events") == 0)
    o->gen.events = parse_u64(a, v, 1, UINT64_MAX / 4), o->events_given = 1;
  else if (strcmp(a, "--seed") == 0)
    o->gen.seed = parse_u64(a, v, 0, UINT64_MAX);
  else if (strcmp(a, "--rate") == 0)
    o->gen.events_per_second = parse_u64(a, v, 1, 1000000000000ull);
  else if (strcmp(a, "--base-time-ms") == 0)
    o->gen.base_time_ms = (int64_t)parse_u64(a, v, 1, 1ull << 52);
  else if (strcmp(a, "--out-of-order-ms") == 0)
    o->gen.max_out_of_order_ms = (int64_t)parse_u64(a, v, 0, 86400000);
  else
    return false;
  return true;
}

static void add_fault(nexmark_options *o, const char *v) {
  if (!v)
    die_usage("--fault needs a value");
  size_t used = strlen(o->faults);
  if (used + strlen(v) + 2 > sizeof o->faults)
    die_usage("--fault: the specs are longer than %zu bytes in all",
              sizeof o->faults - 1);
  snprintf(o->faults + used, sizeof o->faults - used, "%s%s", used ? ";" : "",
           v);
  o->config.faults = o->faults;
}

/* The flags of run that take no value; the others take one. */
static bool run_flag(const char *a, nexmark_options *o) {
  if (strcmp(a, "--resume") == 0)
    o->config.checkpoint.store_policy = SL_STORE_RESUME;
  else if (strcmp(a, "--fresh") == 0)
    o->config.checkpoint.store_policy = SL_STORE_FRESH;
  else if (strcmp(a, "--no-sync") == 0)
    o->config.checkpoint.no_sync = 1;
  else if (strcmp(a, "--at-least-once") == 0)
    o->config.checkpoint.mode = SL_AT_LEAST_ONCE;
  else if (strcmp(a, "--unaligned") == 0)
    o->config.checkpoint_unaligned = 1;
  else if (strcmp(a, "--no-pin") == 0)
    o->config.no_pinning = 1;
  else if (strcmp(a, "--quiet") == 0)
    o->quiet = true;
  else if (strcmp(a, "--json") == 0)
    o->json = true;
  else if (strcmp(a, "--drain") == 0)
    o->drain = true;
  else
    return false;
  return true;
}

static bool run_option(const char *a, const char *v, nexmark_options *o) {
  if (strcmp(a, "--query") == 0) {
    if (!v)
      die_usage("--query needs a value");
    o->query = nx_query_parse(v);
    if (o->query < 0)
      die_usage("--query: '%s' is not one of q0 q1 q2 q3 q4 q5 q7 q8 q11", v);
  } else if (strcmp(a, "--output") == 0) {
    if (!v)
      die_usage("--output needs a value");
    o->output = v;
  } else if (strcmp(a, "--kafka-input") == 0 ||
             strcmp(a, "--kafka-output") == 0) {
    char bootstrap[4096], topic[256];
    if (!v || kafka_split_address(v, bootstrap, sizeof bootstrap, topic,
                                  sizeof topic))
      die_usage("%s needs BOOTSTRAP/TOPIC", a);
    *(a[8] == 'i' ? &o->kafka_input : &o->kafka_output) = v;
  } else if (strcmp(a, "--kafka-partitions") == 0) {
    if (!v || !*v)
      die_usage("--kafka-partitions needs a list such as 0-3,7");
    o->kafka_partitions_list = v;
  } else if (strcmp(a, "--parallelism") == 0)
    o->parallelism = (int)parse_u64(a, v, 1, SL_MAX_PARALLELISM);
  else if (strcmp(a, "--watermark-lag-ms") == 0)
    o->source.watermark_lag_ms = (int64_t)parse_u64(a, v, 1, 86400000);
  else if (strcmp(a, "--rate-limit") == 0)
    o->source.events_per_second_limit = parse_u64(a, v, 1, 1000000000000ull);
  else if (strcmp(a, "--aligned-timeout-ms") == 0)
    o->config.checkpoint_aligned_timeout_ms =
        (uint32_t)parse_u64(a, v, 1, 86400000);
  else if (strcmp(a, "--checkpoint-interval") == 0 ||
           strcmp(a, "--checkpoint-interval-ms") == 0)
    o->config.checkpoint.interval_ms = (uint32_t)parse_u64(a, v, 1, 86400000);
  else if (strcmp(a, "--state-dir") == 0) {
    if (!v)
      die_usage("--state-dir needs a value");
    o->config.checkpoint.state_dir = v;
  } else if (strcmp(a, "--stop-savepoint") == 0) {
    if (!v || !*v)
      die_usage("--stop-savepoint needs a directory");
    o->stop_savepoint = v;
  } else if (strcmp(a, "--fault") == 0)
    add_fault(o, v);
  else if (strcmp(a, "--restart") == 0)
    parse_restart(v, &o->config.restart);
  else if (strcmp(a, "--log-level") == 0)
    parse_log_level(a, v);
  else if (strcmp(a, "--cpus") == 0)
    o->config.cpu_count = parse_cpus(v, o->cpus), o->config.cpus = o->cpus;
  else if (strcmp(a, "--chaining") == 0)
    o->config.chaining = parse_chaining(a, v);
  else if (strcmp(a, "--copy-pass-mib") == 0)
    o->config.checkpoint_copy_pass_bytes = parse_copy_pass(a, v);
  else
    return false;
  return true;
}

static void parse_nexmark(int argc, char **argv, bool run,
                          nexmark_options *o) {
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      nexmark_usage(stdout);
      exit(0);
    }
    if (generator_option(a, v, o)) {
      i++;
    } else if (!run && strcmp(a, "--output") == 0) {
      if (!v)
        die_usage("--output needs a value");
      o->output = v, i++;
    } else if (!run && (strcmp(a, "--kafka") == 0 ||
                        strcmp(a, "--topic") == 0)) {
      if (!v || !*v)
        die_usage("%s needs a value", a);
      *(a[2] == 'k' ? &o->kafka : &o->kafka_topic) = v, i++;
    } else if (!run && strcmp(a, "--partitions") == 0) {
      o->kafka_partitions = (int)parse_u64(a, v, 1, 100000), i++;
    } else if (run && strcmp(a, "--input") == 0) {
      /* Every argument up to the next flag is a file. */
      while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
        if (o->input_count == NEXMARK_MAX_INPUTS)
          die_usage("--input: more than %d files", NEXMARK_MAX_INPUTS);
        o->inputs[o->input_count++] = argv[++i];
      }
      if (o->input_count == 0)
        die_usage("--input needs at least one file");
    } else if (run && run_flag(a, o)) {
      continue;
    } else if (run && run_option(a, v, o)) {
      i++;
    } else {
      die_usage("nexmark %s: unknown option '%s'", run ? "run" : "gen", a);
    }
  }
}

/* ------------------------------------------------------------ gen */

static int nexmark_gen(nexmark_options *o) {
  char err[256];
  if (nx_generator_validate(&o->gen, err, sizeof err) != 0)
    die_usage("nexmark gen: %s", err);
  if (!o->kafka != !o->kafka_topic)
    die_usage("nexmark gen: --kafka and --topic go together");
  if (o->kafka_partitions && !o->kafka)
    die_usage("nexmark gen: --partitions is for --kafka");
  if (o->kafka && o->output)
    die_usage("nexmark gen: --kafka and --output exclude each other");
  if (o->kafka)
    return kafka_nexmark_gen(&o->gen, o->kafka, o->kafka_topic,
                             o->kafka_partitions ? o->kafka_partitions : 1);
  /* A file goes through FILE.tmp and a rename, and an earlier FILE goes
   * first: a failed or killed gen leaves no file that looks complete. */
  FILE *out = stdout;
  char tmp[8300] = "";
  if (o->output && strcmp(o->output, "-") != 0) {
    if (cli_retire_output(o->output) != 0)
      return 1;
    snprintf(tmp, sizeof tmp, "%s.tmp", o->output);
    out = fopen(tmp, "w");
    if (!out) {
      fprintf(stderr, "sluice: cannot create %s: %s\n", tmp,
              strerror(errno));
      return 1;
    }
  }
  static char buffer[1 << 20];
  setvbuf(out, NULL, _IOFBF, sizeof buffer);
  nx_generated *g = malloc(sizeof *g);
  char *line = malloc(NX_MAX_RECORD_BYTES * 7);
  int rc = g && line ? 0 : ENOMEM;
  for (uint64_t n = 0; rc == 0 && n < o->gen.events; n++) {
    nx_generate(&o->gen, n, g);
    size_t len = nx_json_write(&g->event, line, NX_MAX_RECORD_BYTES * 7);
    if (len > NX_MAX_RECORD_BYTES * 7 || fwrite(line, 1, len, out) != len)
      rc = errno ? errno : EIO;
  }
  if (fflush(out) != 0 && rc == 0)
    rc = errno ? errno : EIO;
  if (out != stdout && fclose(out) != 0 && rc == 0)
    rc = errno ? errno : EIO;
  if (rc == 0 && tmp[0] && rename(tmp, o->output) != 0)
    rc = errno;
  if (rc && tmp[0])
    unlink(tmp);
  free(g);
  free(line);
  if (rc) {
    fprintf(stderr, "sluice: nexmark gen: writing %s: %s\n",
            o->output ? o->output : "standard output", strerror(rc));
    return 1;
  }
  if (out != stdout)
    fprintf(stderr, "sluice: wrote %" PRIu64 " events to %s\n", o->gen.events,
            o->output);
  return 0;
}

/* ------------------------------------------------------------ output */

/* ------------------------------------------------------------ status */


typedef struct nexmark_status {
  sl_job *job;
  const nexmark_options *o;
  struct timespec t0;
  bool done;
  pthread_mutex_t lock;
  pthread_cond_t cond;
} nexmark_status;

/* The lowest watermark over the job's operators, as event-time seconds
 * past the first event (or -1 before any). */
static double watermark_seconds(sl_job *job, int64_t base_ms) {
  int64_t low = SL_WATERMARK_MAX;
  for (int i = 0, n = sl_job_operator_count(job); i < n; i++) {
    sl_op_stats st;
    if (sl_job_stats(job, i, &st) == 0 && st.watermark < low)
      low = st.watermark;
  }
  if (low == SL_WATERMARK_MIN || low == SL_WATERMARK_MAX || low < base_ms)
    return -1;
  return (double)(low - base_ms) / 1e3;
}

static void print_status(nexmark_status *s, bool tty, double t, double rate) {
  char checkpoint[96] = "", wm[48] = "", restarts[32] = "";
  sl_checkpoint_stats cs;
  if (s->o->config.checkpoint.state_dir &&
      sl_job_checkpoint_stats(s->job, 0, &cs) == 0)
    snprintf(checkpoint, sizeof checkpoint, ", checkpoint %" PRIu64 " %s %.1f ms",
             cs.id,
             cs.status == SL_CHECKPOINT_ABORTED     ? "aborted"
             : cs.status == SL_CHECKPOINT_COMPLETED ? "done"
                                                    : "running",
             (double)cs.duration_us / 1e3);
  double w = watermark_seconds(s->job, s->o->gen.base_time_ms);
  if (w >= 0)
    snprintf(wm, sizeof wm, ", watermark +%.1f s", w);
  uint32_t r = sl_job_restarts(s->job);
  if (r)
    snprintf(restarts, sizeof restarts, ", %" PRIu32 " restart%s", r,
             r == 1 ? "" : "s");
  fprintf(stderr, "%s[sluice] nexmark q%d: %.1fM events, %.2fM events/s, %.1f s%s%s%s%s",
          tty ? "\r" : "", s->o->query,
          (double)sl_job_progress(s->job) / 1e6, rate / 1e6, t, wm,
          checkpoint, restarts, tty ? "\033[K" : "\n");
  fflush(stderr);
}

static void *nexmark_status_main(void *arg) {
  nexmark_status *s = arg;
  bool tty = isatty(STDERR_FILENO);
  sl_log_set_status_line(tty); /* log lines clear the status line first */
  uint64_t last_events = 0;
  double last_t = 0;
  pthread_mutex_lock(&s->lock);
  while (!s->done) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 500000000L;
    if (until.tv_nsec >= 1000000000L)
      until.tv_sec++, until.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&s->cond, &s->lock, &until);
    if (s->done)
      break;
    double t = seconds_since(&s->t0);
    uint64_t events = sl_job_progress(s->job);
    print_status(s, tty, t,
                 (double)(events - last_events) / (t - last_t + 1e-9));
    last_events = events, last_t = t;
  }
  pthread_mutex_unlock(&s->lock);
  if (tty)
    fputs("\r\033[K", stderr);
  sl_log_set_status_line(0);
  return NULL;
}

/* ------------------------------------------------------------ run */

static void check_run_options(nexmark_options *o, char *parts, size_t size) {
  if (o->query < 0)
    die_usage("nexmark run needs --query qN");
  if (o->input_count && o->events_given)
    die_usage("nexmark run: --events and --input exclude each other");
  if (o->kafka_input && (o->input_count || o->events_given))
    die_usage("nexmark run: --kafka-input excludes --input and --events");
  if (o->kafka_partitions_list && !o->kafka_input)
    die_usage("nexmark run: --kafka-partitions is for --kafka-input");
  if (o->kafka_output && o->output)
    die_usage("nexmark run: --kafka-output and --output exclude each other");
  if (o->config.checkpoint.store_policy && !o->config.checkpoint.state_dir)
    die_usage("--resume and --fresh need --state-dir");
  if (o->config.checkpoint.interval_ms && !o->config.checkpoint.state_dir)
    die_usage("--checkpoint-interval needs --state-dir");
  if (o->config.restart.strategy != SL_RESTART_NONE &&
      !o->config.checkpoint.state_dir)
    die_usage("--restart needs --state-dir (a restart resumes from the "
              "newest checkpoint)");
  /* The checksum sink counts replayed rows again: only the exactly-once
   * file output stays exact across restarts. */
  if (o->config.restart.strategy != SL_RESTART_NONE && !o->output &&
      !o->kafka_output)
    die_usage("--restart needs --output (without it the rows are counted, "
              "and a restarted run would count replays twice)");
  if (o->stop_savepoint && !o->config.checkpoint.state_dir)
    die_usage("--stop-savepoint needs --state-dir (the savepoint is a "
              "checkpoint's copy)");
  if (o->drain && !o->stop_savepoint)
    die_usage("--drain is for --stop-savepoint");
  check_unaligned_options(&o->config);
  if ((o->input_count || o->kafka_input) && o->source.events_per_second_limit)
    die_usage("--rate-limit is for generated events, not --input");
  if (o->output) {
    if (snprintf(parts, size, "%s.parts", o->output) >= (int)size)
      die_usage("--output: '%s' is too long", o->output);
  }
  char err[256];
  if (!o->input_count && !o->kafka_input &&
      nx_generator_validate(&o->gen, err, sizeof err))
    die_usage("nexmark run: %s", err);
  if (o->parallelism > 128)
    o->config.max_parallelism = (uint32_t)o->parallelism;
}

/* Source, query and sink. */
static int build_nexmark(const nexmark_options *o, sl_job *job,
                         const char *parts, bool clear_parts,
                         sl_checksum *sum) {
  sl_op *events, *result, *sink;
  int64_t lag_ms = o->source.watermark_lag_ms ? o->source.watermark_lag_ms
                                              : 4000; /* nx_source_config */
  int rc = o->kafka_input
               ? kafka_nexmark_source(job, o->kafka_input,
                                      o->kafka_partitions_list,
                                      o->parallelism, lag_ms, &events)
           : o->input_count
               ? nx_source_file(job, "events", o->inputs, o->input_count,
                                &o->source, &events)
               : nx_source_generator(job, "events", o->parallelism, &o->gen,
                                     &o->source, &events);
  if (rc == 0)
    rc = nx_query_build(job, o->query, events, o->parallelism, &result);
  char bootstrap[4096], topic[256];
  if (rc == 0 && o->kafka_output &&
      kafka_split_address(o->kafka_output, bootstrap, sizeof bootstrap, topic,
                          sizeof topic) == 0) { /* checked when parsed */
    sl_kafka_sink_config kc = {.bootstrap = bootstrap,
                               .topic = topic,
                               .format = nx_query_format,
                               .format_user = (void *)(intptr_t)o->query};
    rc = sl_sink_kafka(job, "output", result, o->parallelism, &kc, &sink);
  } else if (rc == 0 && o->output) {
    sl_file_sink_config fc = {
        .dir = parts,
        .exactly_once = 1,
        .format = nx_query_format,
        .format_user = (void *)(intptr_t)o->query,
        .suffix = ".csv",
        .header = nx_query_header(o->query),
        .clear_other_lineage = clear_parts,
    };
    rc = sl_sink_file(job, "output", result, o->parallelism, &fc, &sink);
  } else if (rc == 0) {
    rc = sl_sink_checksum(job, "output", result, o->parallelism, sum, &sink);
  }
  return rc;
}

static void print_nexmark_summary(const nexmark_options *o, sl_job *job,
                                  int rc, double secs, double cpu,
                                  uint64_t rows, const sl_checksum *sum) {
  uint64_t events = sl_job_progress(job);
  double rate = secs > 0 ? (double)events / secs : 0;
  double per_cpu = cpu > 0 ? (double)events / cpu : 0;
  uint64_t last = sl_job_last_checkpoint(job, NULL);
  if (o->json) {
    printf("{\"query\":\"q%d\",\"status\":%d,\"events\":%" PRIu64
           ",\"seconds\":%.6f,\"events_per_second\":%.0f,\"cpu_seconds\":%.3f"
           ",\"events_per_cpu_second\":%.0f,\"rows\":%" PRIu64
           ",\"parallelism\":%d,\"restarts\":%" PRIu32
           ",\"last_checkpoint\":%" PRIu64 "}\n",
           o->query, rc, events, secs, rate, cpu, per_cpu, rows,
           o->parallelism, sl_job_restarts(job), last);
    return;
  }
  printf("nexmark q%d: %s in %.3f s: %" PRIu64 " events%s, %.2fM events/s, "
         "%.2fM events per CPU-second (%.2f CPU-s)\n",
         o->query, rc == 0 ? "finished" : sl_strerror(rc), secs, events,
         sl_job_restarts(job) ? " (replays after restarts included)" : "",
         rate / 1e6, per_cpu / 1e6, cpu);
  if (rc == 0 && o->kafka_output)
    printf("output: rows in %s\n", o->kafka_output);
  else if (rc == 0 && o->output)
    printf("output: %" PRIu64 " rows in %s (parts in %s.parts)\n", rows,
           o->output, o->output);
  else if (rc == 0)
    printf("output: %" PRIu64 " rows, checksum %016" PRIx64 "\n",
           sum->records, sum->hash_sum);
  for (int i = 0, n = sl_job_operator_count(job); i < n; i++) {
    sl_op_stats st;
    if (sl_job_stats(job, i, &st) != 0)
      continue;
    printf("  %-14s x%-3d in %12" PRIu64 "  out %12" PRIu64 "%s", st.name,
           st.parallelism, st.records_in, st.records_out,
           st.late_records ? "" : "\n");
    if (st.late_records)
      printf("  late %" PRIu64 "\n", st.late_records);
  }
  if (o->config.checkpoint.state_dir) {
    uint64_t from = 0;
    last = sl_job_last_checkpoint(job, &from);
    /* After a failover, from is the failover's restore, not a resume. */
    bool resumed = from && sl_job_restarts(job) == 0;
    printf("checkpoints: newest complete %" PRIu64 "%s", last,
           resumed ? "" : "\n");
    if (resumed)
      printf(", resumed from %" PRIu64 "\n", from);
  }
  if (sl_job_restarts(job))
    printf("restarts: %" PRIu32 ", injected faults fired: %" PRIu64 "\n",
           sl_job_restarts(job), sl_job_faults_fired(job));
}

static int run_and_report(nexmark_options *o, sl_job *job, const char *parts,
                          const sl_checksum *sum) {
  cli_watch_signals(job);
  nexmark_status st = {.job = job, .o = o, .lock = PTHREAD_MUTEX_INITIALIZER,
                       .cond = PTHREAD_COND_INITIALIZER};
  double cpu0 = fixture_cpu_now_s();
  clock_gettime(CLOCK_MONOTONIC, &st.t0);
  /* Before the start, so a signal at any time is a stop with a savepoint
   * (served once armed). */
  cli_stopper *stopper = cli_stopper_start(job, o->stop_savepoint, o->drain);
  int rc = sl_job_start(job);
  if (rc) {
    fprintf(stderr, "sluice: cannot start nexmark q%d: %s\n", o->query,
            sl_job_error(job)[0] ? sl_job_error(job) : sl_strerror(rc));
    cli_unwatch_signals();
    cli_stopper_finish(stopper);
    return 1;
  }
  cli_stopper_arm(stopper);
  pthread_t status_thread;
  bool status_started = !o->quiet && !o->json &&
      pthread_create(&status_thread, NULL, nexmark_status_main, &st) == 0;
  rc = sl_job_wait(job);
  /* Stopped without drain, the output goes on in the resumed run: FILE
   * is written only by a run that finished (drained: it did). */
  bool held = cli_stopper_finish(stopper) && !o->drain;
  double secs = seconds_since(&st.t0);
  double cpu = fixture_cpu_now_s() - cpu0;
  if (status_started) {
    pthread_mutex_lock(&st.lock);
    st.done = true;
    pthread_cond_signal(&st.cond);
    pthread_mutex_unlock(&st.lock);
    pthread_join(status_thread, NULL);
  }
  cli_unwatch_signals();
  uint64_t rows = 0;
  if (rc == 0 && o->output && !held) {
    char err[1024];
    int m = merge_parts(parts, o->output, nx_query_header(o->query),
                        merge_run_bytes(), &rows, err, sizeof err);
    if (m) {
      fprintf(stderr, "sluice: writing %s from %s: %s\n", o->output, parts,
              err[0] ? err : strerror(m));
      return 1;
    }
  }
  print_nexmark_summary(o, job, rc, secs, cpu, rows, sum);
  if (rc && rc != SL_ESTOPPED)
    fprintf(stderr, "sluice: nexmark q%d failed: %s\n", o->query,
            sl_job_error(job));
  if (rc == SL_ESTOPPED)
    return cli_stop_status(); /* 130 SIGINT, 143 SIGTERM */
  return rc == 0 ? 0 : 1;
}

static int nexmark_run(nexmark_options *o) {
  char parts[4096] = "";
  check_run_options(o, parts, sizeof parts);
  /* Another run's parts go only when nothing could resume this run's
   * (no state directory) or --fresh asked for it; else the sink refuses
   * them (note at the top). */
  bool clear_parts = !o->config.checkpoint.state_dir ||
                     o->config.checkpoint.store_policy == SL_STORE_FRESH;
  if (o->output && cli_retire_output(o->output) != 0)
    return 1;
  sl_job *job;
  char name[16]; /* the metrics' job label (sl_job_config.name) */
  snprintf(name, sizeof name, "nexmark-q%d", o->query);
  o->config.name = name;
  int rc = cli_job_create(&o->config, &job);
  o->config.name = NULL; /* name was copied; it goes out of scope */
  if (rc)
    return rc;
  sl_checksum sum = {0};
  rc = build_nexmark(o, job, parts, clear_parts, &sum);
  if (rc) {
    fprintf(stderr, "sluice: cannot build nexmark q%d: %s\n", o->query,
            sl_job_error(job)[0] ? sl_job_error(job) : sl_strerror(rc));
    sl_job_destroy(job);
    return rc == EINVAL ? 2 : 1;
  }
  int status = run_and_report(o, job, parts, &sum);
  sl_job_destroy(job);
  return status;
}

int nexmark_main(int argc, char **argv) {
  if (argc < 1 || strcmp(argv[0], "-h") == 0 || strcmp(argv[0], "--help") == 0) {
    nexmark_usage(argc < 1 ? stderr : stdout);
    return argc < 1 ? 2 : 0;
  }
  bool run = strcmp(argv[0], "run") == 0;
  if (!run && strcmp(argv[0], "gen") != 0)
    die_usage("nexmark: unknown command '%s' (gen or run)", argv[0]);
  nexmark_options o = {.query = -1, .parallelism = 1};
  o.gen.events = 10000000;
  o.gen.seed = 1;
  parse_nexmark(argc - 1, argv + 1, run, &o);
  if (!o.gen.events_per_second)
    o.gen.events_per_second = 10000000;
  if (!o.gen.base_time_ms)
    o.gen.base_time_ms = 1700000000000;
  return run ? nexmark_run(&o) : nexmark_gen(&o);
}
