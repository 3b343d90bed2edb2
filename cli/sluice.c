/* sluice.c — the command-line tool: runs built-in jobs with a live status
 * line and a verified summary.
 *
 *   sluice run pipeline [options]   source -> map -> filter -> sink (P1)
 *   sluice run keyed [options]      source -> key_by -> count -> sink
 *   sluice run count [options]      the same with keyed state, checkpoints
 *                                   and an exactly-once file sink
 *   sluice run window [options]     keyed count windows (sums) with
 *                                   checkpoints, faults, failover and a
 *                                   verdict on the committed output
 *   sluice nexmark gen|run [options]  Nexmark (cli/nexmark.c)
 *   sluice checkpoints DIR [options]  inspect a state directory
 *                                   (cli/checkpoints.c)
 *   sluice jobs | --help | --version
 *
 * Exit status: 0 success, 1 the job failed or its result did not verify,
 * 2 a usage error, 130 stopped by SIGINT, 143 stopped by SIGTERM.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli_util.h"
#include "output.h"
#include "sluice.h"
#include "sluice_testing.h" /* unstable test helpers */

/* jemalloc reads this at start-up: back the heap with transparent huge
 * pages (on this VM, a page fault costs about 10 us, and a 1M-key state is
 * a million small allocations; restoring one runs about 1.5x faster).  The
 * library leaves allocator settings to the program that embeds it; without
 * jemalloc this is an unused variable. */
const char *malloc_conf = "thp:always,metadata_thp:auto";

typedef struct options {
  const char *job_name;
  uint64_t records;
  uint64_t keys;
  int parallelism;
  sl_job_config config;
  int cpus[MAX_CPUS];
  bool quiet;
  bool json;
  uint32_t status_interval_ms; /* 0: cli/status.c's default */
  const char *output_dir; /* count, window: file sink directory */
  uint64_t window;        /* window: records per count window */
  char faults[4096];      /* --fault specs joined by ';' */
  const char *savepoint_dir; /* SIGUSR1 savepoints go below it */
  const char *http;       /* --http [ADDR:]PORT, or NULL */
  const char *http_token_file; /* --http-token-file FILE, or NULL */
} options;

static void usage(FILE *out) {
  fprintf(out,
          "usage: sluice run JOB [options]\n"
          "       sluice nexmark gen|run [options]   (sluice nexmark --help)\n"
          "       sluice checkpoints DIR [options]   (sluice checkpoints --help)\n"
          "       sluice jobs\n"
          "       sluice --help | --version\n"
          "\n"
          "Jobs:\n"
          "  pipeline   source -> map (v*3+1) -> filter (v%%4 != 0) -> sink; the\n"
          "             sink's count and sum are checked against the closed form\n"
          "  keyed      source -> key_by(key) -> running count per key -> sink;\n"
          "             checks that every key was counted at one instance\n"
          "  count      the keyed job with the counts in checkpointed keyed state and\n"
          "             an exactly-once file sink (--output); checks the committed\n"
          "             files, also after a stop or kill and --resume\n"
          "  window     keyed source (each key's records in order) -> key_by -> a\n"
          "             count window of --window records per key (sum of values) ->\n"
          "             exactly-once file sink (--output), plus a verifying sink on\n"
          "             the source; prints a verdict on the committed output, the\n"
          "             restarts and recovery times\n"
          "\n"
          "Options:\n"
          "  --records N          records the source emits (default 50000000)\n"
          "  --keys K             distinct keys, key = i %% K (default 10000)\n"
          "  --parallelism P      instances of each operator (default 1)\n"
          "  --ring-bytes B       bytes per ring, power of two (default: automatic,\n"
          "                       4 MiB while all rings fit in 256 MiB)\n"
          "  --batch N            records per output batch (default 1024)\n"
          "  --buffer-timeout-us U  publish partial batches after U us (default 1000)\n"
          "  --spin N             spin iterations before parking (default: 20 when\n"
          "                       threads outnumber CPUs, else 2000)\n"
          "  --cpus LIST          CPUs to pin to, e.g. 0,1 (default: all allowed)\n"
          "  --pin-round-robin    pin instances round-robin in creation order\n"
          "  --no-pin             do not pin threads\n"
          "  --state-dir DIR      take checkpoints into the LMDB store in DIR\n"
          "  --resume             resume from DIR's newest checkpoint (or refuse)\n"
          "  --fresh              delete DIR's checkpoints (and --output's parts)\n"
          "  --from-savepoint SP  start from savepoint SP (copied into --state-dir,\n"
          "                       which must hold no checkpoints, or --fresh)\n"
          "  --savepoint-dir DIR  SIGUSR1 writes a savepoint to DIR/savepoint-<id>;\n"
          "                       the only place POST /savepoints may write\n"
          "  --checkpoint-interval-ms N  between checkpoints (default 1000)\n"
          "  --checkpoint-timeout-ms N   abort a checkpoint after N ms (default 60000)\n"
          "  --min-pause-ms N     least pause between checkpoints (default 0)\n"
          "  --max-concurrent N   checkpoints in flight (default 1)\n"
          "  --tolerable-failures N  consecutive failed checkpoints tolerated (0)\n"
          "  --at-least-once      no barrier alignment: no blocking, duplicates on resume\n"
          "  --no-sync            commit checkpoints without fsync (benchmarks)\n"
          "  --output DIR         count: key,count lines; window: key,window,sum\n"
          "                       lines; part files in DIR\n"
          "  --window N           window: records per count window (default 100)\n"
          "  --fault SPEC         inject faults (repeatable; grammar in docs/failover-\n"
          "                       and-faults.md); SLUICE_FAULTS adds more\n"
          "  --restart STRATEGY   after a failure: none (default),\n"
          "                       fixed-delay[:ATTEMPTS[:DELAY_MS]],\n"
          "                       exponential-delay[:INITIAL_MS[:MAX_MS[:MULT[:JITTER]]]],\n"
          "                       failure-rate[:MAX[:INTERVAL_MS[:DELAY_MS]]]\n"
          "                       (omitted fields: Flink's defaults)\n");
  /* Two calls: C11 promises string literals of 4095 bytes only. */
  fprintf(out,
          "  --http [ADDR:]PORT   serve /metrics, /jobs, /checkpoints and POST\n"
          "                       /savepoints on ADDR (default 127.0.0.1);\n"
          "                       port 0 picks a free one (printed); POST\n"
          "                       /savepoints writes below --savepoint-dir only\n"
          "  --http-token-file FILE  requests need Authorization: Bearer TOKEN,\n"
          "                       TOKEN the file's first line (else the\n"
          "                       SLUICE_HTTP_TOKEN variable); needed for an\n"
          "                       ADDR other than loopback\n"
          "  --quiet              no live status line\n"
          "  --status-interval-ms N  status every N ms (default: 500 in place on\n"
          "                       a terminal, else a line every 5000)\n"
          "  --log-level LEVEL    error, warn, info (default) or debug; the\n"
          "                       default comes from SLUICE_LOG_LEVEL if set\n"
          "  --json               print the summary as one JSON object\n"
          "  -h, --help           this text\n"
          "\n"
          "Exit status: 0 success, 1 the job failed or did not verify, 2 a usage\n"
          "error, 130 stopped by SIGINT, 143 stopped by SIGTERM.\n");
}

static void parse_options(int argc, char **argv, int first, options *o) {
  for (int i = first; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : 0;
    if (strcmp(a, "--records") == 0)
      o->records = parse_u64(a, v, 1, UINT64_MAX / 4), i++;
    else if (strcmp(a, "--keys") == 0)
      o->keys = parse_u64(a, v, 1, UINT32_MAX), i++;
    else if (strcmp(a, "--parallelism") == 0)
      o->parallelism = (int)parse_u64(a, v, 1, SL_MAX_PARALLELISM), i++;
    else if (strcmp(a, "--ring-bytes") == 0)
      o->config.ring_bytes = parse_u64(a, v, 4096, 1ull << 30), i++;
    else if (strcmp(a, "--batch") == 0)
      o->config.output_batch_records = (uint32_t)parse_u64(a, v, 1, 65535), i++;
    else if (strcmp(a, "--buffer-timeout-us") == 0)
      o->config.buffer_timeout_us = (uint32_t)parse_u64(a, v, 1, 60000000), i++;
    else if (strcmp(a, "--spin") == 0)
      o->config.spin_iterations = (uint32_t)parse_u64(a, v, 1, 100000000), i++;
    else if (strcmp(a, "--cpus") == 0)
      o->config.cpu_count = parse_cpus(v, o->cpus), o->config.cpus = o->cpus, i++;
    else if (strcmp(a, "--pin-round-robin") == 0)
      o->config.pin_policy = SL_PIN_ROUND_ROBIN;
    else if (strcmp(a, "--no-pin") == 0)
      o->config.no_pinning = 1;
    else if (strcmp(a, "--state-dir") == 0) {
      if (!v)
        die_usage("%s needs a value", a);
      o->config.checkpoint.state_dir = v, i++;
    } else if (strcmp(a, "--resume") == 0)
      o->config.checkpoint.store_policy = SL_STORE_RESUME;
    else if (strcmp(a, "--fresh") == 0)
      o->config.checkpoint.store_policy = SL_STORE_FRESH;
    else if (strcmp(a, "--from-savepoint") == 0) {
      if (!v)
        die_usage("%s needs a value", a);
      o->config.checkpoint.from_savepoint = v, i++;
    } else if (strcmp(a, "--savepoint-dir") == 0) {
      if (!v)
        die_usage("%s needs a value", a);
      o->savepoint_dir = v, i++;
    }
    else if (strcmp(a, "--checkpoint-interval-ms") == 0)
      o->config.checkpoint.interval_ms = (uint32_t)parse_u64(a, v, 1, 86400000), i++;
    else if (strcmp(a, "--checkpoint-timeout-ms") == 0)
      o->config.checkpoint.timeout_ms = (uint32_t)parse_u64(a, v, 1, 86400000), i++;
    else if (strcmp(a, "--min-pause-ms") == 0)
      o->config.checkpoint.min_pause_ms = (uint32_t)parse_u64(a, v, 0, 86400000), i++;
    else if (strcmp(a, "--max-concurrent") == 0)
      o->config.checkpoint.max_concurrent = (uint32_t)parse_u64(a, v, 1, 16), i++;
    else if (strcmp(a, "--tolerable-failures") == 0)
      o->config.checkpoint.tolerable_failures = (uint32_t)parse_u64(a, v, 0, 1000000), i++;
    else if (strcmp(a, "--at-least-once") == 0)
      o->config.checkpoint.mode = SL_AT_LEAST_ONCE;
    else if (strcmp(a, "--no-sync") == 0)
      o->config.checkpoint.no_sync = 1;
    else if (strcmp(a, "--output") == 0) {
      if (!v)
        die_usage("%s needs a value", a);
      o->output_dir = v, i++;
    } else if (strcmp(a, "--window") == 0)
      o->window = parse_u64(a, v, 1, UINT32_MAX), i++;
    else if (strcmp(a, "--fault") == 0) {
      if (!v)
        die_usage("%s needs a value", a);
      size_t used = strlen(o->faults);
      if (used + strlen(v) + 2 > sizeof o->faults)
        die_usage("--fault: the specs are longer than %zu bytes in all",
                  sizeof o->faults - 1);
      snprintf(o->faults + used, sizeof o->faults - used, "%s%s",
               used ? ";" : "", v);
      o->config.faults = o->faults, i++;
    } else if (strcmp(a, "--restart") == 0)
      parse_restart(v, &o->config.restart), i++;
    else if (strcmp(a, "--http") == 0) {
      if (!v)
        die_usage("%s needs a value", a);
      o->http = v, i++;
    } else if (strcmp(a, "--http-token-file") == 0) {
      if (!v)
        die_usage("%s needs a value", a);
      o->http_token_file = v, i++;
    } else if (strcmp(a, "--quiet") == 0)
      o->quiet = true;
    else if (strcmp(a, "--status-interval-ms") == 0)
      o->status_interval_ms = (uint32_t)parse_u64(a, v, 10, 3600000), i++;
    else if (strcmp(a, "--log-level") == 0)
      parse_log_level(a, v), i++;
    else if (strcmp(a, "--json") == 0)
      o->json = true;
    else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)
      usage(stdout), exit(0);
    else
      die_usage("unknown option '%s'", a);
  }
}

/* ------------------------------------------------------------ jobs */

static int triple_plus_one(void *user, const sl_record *in, void *out,
                           uint32_t *out_size) {
  (void)user;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  t.value = t.value * 3 + 1;
  memcpy(out, &t, sizeof t);
  *out_size = sizeof t;
  return 0;
}

static int not_multiple_of_four(void *user, const sl_record *in) {
  (void)user;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  return t.value % 4 != 0;
}

static uint64_t tuple_key(void *user, const sl_record *in) {
  (void)user;
  uint64_t key;
  memcpy(&key, in->data, sizeof key);
  return key;
}

/* Running count per key: one counter array per instance, indexed by key
 * (keys are < K by construction; a key outside fails the job). */
typedef struct counter {
  uint64_t keys;
  uint64_t *counts;
} counter;

static int count_open(sl_ctx *ctx, void *user, void **state) {
  const options *o = user;
  counter *c = calloc(1, sizeof *c);
  if (!c || !(c->counts = calloc(o->keys, sizeof(uint64_t)))) {
    free(c);
    sl_ctx_fail(ctx, "no memory for %" PRIu64 " counters", o->keys);
    return ENOMEM;
  }
  c->keys = o->keys;
  *state = c;
  return 0;
}

static int count_process(sl_ctx *ctx, void *state, int input,
                         const sl_record *in) {
  (void)input;
  counter *c = state;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  if (t.key >= c->keys) {
    sl_ctx_fail(ctx, "key %" PRIu64 " outside 0..%" PRIu64, t.key, c->keys - 1);
    return EINVAL;
  }
  sl_tuple out = {.key = t.key, .value = ++c->counts[t.key]};
  return sl_emit(ctx, &out, sizeof out);
}

static void count_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  counter *c = state;
  free(c->counts);
  free(c);
}

/* The count job: the running count of each key in keyed value state. */
static int state_count_process(sl_ctx *ctx, void *state, int input,
                               const sl_record *in) {
  (void)state;
  (void)input;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  const void *value;
  uint32_t bytes;
  uint64_t count = 0;
  int rc = sl_state_get(ctx, 0, &value, &bytes);
  if (rc == 0 && bytes == sizeof count)
    memcpy(&count, value, sizeof count);
  else if (rc != SL_ENOTFOUND) {
    sl_ctx_fail(ctx, "keyed state of key %" PRIu64 ": %s", t.key,
                rc ? sl_strerror(rc) : "wrong size");
    return rc ? rc : -EINVAL;
  }
  count++;
  rc = sl_state_put(ctx, 0, &count, sizeof count, 0);
  if (rc)
    return rc;
  sl_tuple out = {.key = t.key, .value = count};
  return sl_emit(ctx, &out, sizeof out);
}

static int compare_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int format_tuple(void *user, const sl_record *in, char *buffer,
                        uint32_t buffer_bytes) {
  (void)user;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  int n = snprintf(buffer, buffer_bytes, "%" PRIu64 ",%" PRIu64, t.key,
                   t.value);
  /* snprintf needs room for its NUL: ask for one byte more if it lacked. */
  return (uint32_t)n < buffer_bytes ? n : n + 1;
}

/* Check the committed output of the count job: every key k has exactly the
 * lines k,1 .. k,c_k (in order within its instance's files) — no loss, no
 * duplicate — and no pending part is left. */
static bool verify_output(const options *o, char *why, size_t why_size) {
  DIR *d = opendir(o->output_dir);
  if (!d) {
    snprintf(why, why_size, "cannot read %s: %s", o->output_dir,
             strerror(errno));
    return false;
  }
  uint64_t *seen = calloc(o->keys, sizeof *seen);
  uint64_t lines = 0, bad = 0, pending = 0;
  char **names = 0;
  size_t count = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, ".part-", 6) == 0)
      pending++;
    if (strncmp(e->d_name, "part-", 5) != 0)
      continue;
    char **more = realloc(names, sizeof *names * (count + 1));
    if (!more)
      break;
    names = more;
    names[count++] = strdup(e->d_name);
  }
  closedir(d);
  if (count > 0) /* names is NULL when empty */
    qsort(names, count, sizeof *names, compare_names);
  for (size_t i = 0; i < count && seen; i++) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", o->output_dir, names[i]);
    FILE *f = fopen(path, "r");
    unsigned long long k, c;
    while (f && fscanf(f, "%llu,%llu\n", &k, &c) == 2) {
      lines++;
      if (k >= o->keys || c != seen[k] + 1)
        bad++; /* lost, duplicated or out of order */
      else
        seen[k] = c;
    }
    if (f)
      fclose(f);
    free(names[i]);
  }
  free(names);
  uint64_t full = o->records / o->keys, rest = o->records % o->keys;
  uint64_t short_keys = 0;
  for (uint64_t k = 0; k < o->keys && seen; k++)
    short_keys += seen[k] != full + (k < rest);
  free(seen);
  bool ok = lines == o->records && bad == 0 && short_keys == 0 && pending == 0;
  snprintf(why, why_size,
           "%" PRIu64 " committed lines in %zu files, expected %" PRIu64
           "; %" PRIu64 " out of sequence, %" PRIu64 " keys short, %" PRIu64
           " pending parts",
           lines, count, o->records, bad, short_keys, pending);
  return ok;
}

/* ------------------------------------------------------------ output */

/* --output DIR belongs to one job lineage (the file sink, include/
 * sluice.h): another lineage's parts there are deleted only by a run that
 * can never be resumed (no --state-dir) or that asked for --fresh; any
 * other start is refused naming DIR. */
static int output_clears(const options *o) {
  return !o->config.checkpoint.state_dir ||
         o->config.checkpoint.store_policy == SL_STORE_FRESH;
}

/* ------------------------------------------------------------ window */

/* What the window job emits when a window is full. */
typedef struct window_result {
  uint64_t key, window, sum;
} window_result;

/* The job's count window (sl_op_window, SL_WINDOW_COUNT: Flink's
 * countWindow): every --window records of a key emit their sum; a last,
 * partial window is not emitted.  The accumulator is the sum. */
static void sum_init(void *user, void *acc) {
  (void)user;
  memset(acc, 0, sizeof(uint64_t));
}

static void sum_add(void *user, void *acc, const sl_record *in) {
  (void)user;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  uint64_t sum;
  memcpy(&sum, acc, sizeof sum);
  sum += t.value;
  memcpy(acc, &sum, sizeof sum);
}

static int sum_emit(void *user, sl_ctx *ctx, uint64_t key,
                    const sl_window *w, const void *acc) {
  const options *o = user;
  window_result r = {.key = key, .window = (uint64_t)w->start / o->window};
  memcpy(&r.sum, acc, sizeof r.sum);
  return sl_emit(ctx, &r, sizeof r);
}

static int format_window(void *user, const sl_record *in, char *buffer,
                         uint32_t buffer_bytes) {
  (void)user;
  window_result r;
  memcpy(&r, in->data, sizeof r);
  int n = snprintf(buffer, buffer_bytes, "%" PRIu64 ",%" PRIu64 ",%" PRIu64,
                   r.key, r.window, r.sum);
  return (uint32_t)n < buffer_bytes ? n : n + 1;
}

typedef struct window_check {
  uint64_t expected, lines, lost, duplicated, out_of_order, wrong_sums,
      pending, malformed;
} window_check;

/* Check the window job's committed files against the closed form: key k
 * has c_k = records / keys (+1 for k < records % keys) records, whose j-th
 * has value j * keys + k; window w holds j = wW .. wW+W-1, so its sum is
 * keys * W * (2wW + W - 1) / 2 + W * k.  Every full window must appear
 * once, in order within its instance's files, with that sum. */
static window_check check_windows(const options *o) {
  window_check c = {0};
  uint64_t W = o->window, K = o->keys;
  uint64_t full = o->records / K, rest = o->records % K;
  uint64_t *next = calloc(K, sizeof *next);
  DIR *d = opendir(o->output_dir);
  char **names = 0;
  size_t count = 0;
  struct dirent *e;
  while (d && next && (e = readdir(d))) {
    if (strncmp(e->d_name, ".part-", 6) == 0)
      c.pending++;
    if (strncmp(e->d_name, "part-", 5) != 0)
      continue;
    char **more = realloc(names, sizeof *names * (count + 1));
    if (!more)
      break;
    names = more;
    names[count++] = strdup(e->d_name);
  }
  if (d)
    closedir(d);
  if (count > 0) /* names is NULL when empty */
    qsort(names, count, sizeof *names, compare_names);
  for (size_t i = 0; i < count; i++) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", o->output_dir, names[i]);
    FILE *f = fopen(path, "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
      unsigned long long k, w, s;
      c.lines++;
      if (sscanf(line, "%llu,%llu,%llu", &k, &w, &s) != 3 || k >= K) {
        c.malformed++;
        continue;
      }
      if (w < next[k]) {
        c.duplicated++;
        continue;
      }
      if (w > next[k])
        c.out_of_order++;
      uint64_t sum = K * (W * (2 * w * W + W - 1) / 2) + W * k;
      c.wrong_sums += s != sum;
      next[k] = w + 1;
    }
    if (f)
      fclose(f);
    free(names[i]);
  }
  free(names);
  for (uint64_t k = 0; k < K && next; k++) {
    uint64_t windows = (full + (k < rest)) / W;
    c.expected += windows;
    c.lost += windows > next[k] ? windows - next[k] : 0;
  }
  if (!next)
    c.malformed = UINT64_MAX;
  free(next);
  return c;
}

static int build_window(const options *o, sl_job *job, sl_op **verify) {
  sl_op *src, *by, *win, *sink;
  int p = o->parallelism;
  int rc = sl_source_keyed(job, "source", p, o->records, o->keys, &src);
  if (!rc)
    rc = sl_op_key_by(job, "by-key", src, tuple_key, 0, &by);
  sl_window_config wc = {.type = SL_WINDOW_COUNT,
                         .size = (int64_t)o->window,
                         .acc_bytes = sizeof(uint64_t),
                         .init = sum_init,
                         .add = sum_add,
                         .emit = sum_emit,
                         .user = (void *)o};
  if (!rc)
    rc = sl_op_window(job, "window", by, p, &wc, &win);
  sl_file_sink_config fc = {.dir = o->output_dir,
                            .exactly_once = o->config.checkpoint.mode ==
                                            SL_EXACTLY_ONCE,
                            .format = format_window,
                            .suffix = ".csv",
                            .clear_other_lineage = output_clears(o)};
  if (!rc)
    rc = sl_sink_file(job, "sink", win, p, &fc, &sink);
  if (!rc)
    rc = sl_sink_verify(job, "verify", src, p, o->records, o->keys, verify);
  return rc;
}

static int build_job(const options *o, sl_job *job, sl_checksum *sum,
                     sl_op **verify) {
  sl_op *src, *mid, *mid2, *sink;
  int p = o->parallelism;
  if (strcmp(o->job_name, "window") == 0)
    return build_window(o, job, verify);
  int rc = sl_source_sequence(job, "source", p, o->records, o->keys, &src);
  if (rc)
    return rc;
  if (strcmp(o->job_name, "pipeline") == 0) {
    rc = sl_op_map(job, "map", src, p, sizeof(sl_tuple), triple_plus_one, 0,
                   &mid);
    if (!rc)
      rc = sl_op_filter(job, "filter", mid, p, not_multiple_of_four, 0, &mid2);
    if (!rc)
      rc = sl_sink_checksum(job, "sink", mid2, p, sum, &sink);
    return rc;
  }
  if (strcmp(o->job_name, "count") == 0) {
    static const sl_process_ops state_ops = {.process = state_count_process};
    rc = sl_op_key_by(job, "by-key", src, tuple_key, 0, &mid);
    if (!rc)
      rc = sl_op_process(job, "count", &mid, 1, p, &state_ops, 0, &mid2);
    if (!rc && o->output_dir) {
      sl_file_sink_config fc = {.dir = o->output_dir,
                                .exactly_once = 1,
                                .format = format_tuple,
                                .suffix = ".csv",
                                .clear_other_lineage = output_clears(o)};
      rc = sl_sink_file(job, "sink", mid2, p, &fc, &sink);
    } else if (!rc) {
      rc = sl_sink_checksum(job, "sink", mid2, p, sum, &sink);
    }
    return rc;
  }
  static const sl_process_ops count_ops = {
      .open = count_open, .process = count_process, .close = count_close};
  rc = sl_op_key_by(job, "by-key", src, tuple_key, 0, &mid);
  if (!rc)
    rc = sl_op_process(job, "count", &mid, 1, p, &count_ops, (void *)o, &mid2);
  if (!rc)
    rc = sl_sink_checksum(job, "sink", mid2, p, sum, &sink);
  return rc;
}

/* The expected checksum, computed without the engine. */
static bool verify(const options *o, const sl_checksum *got, char *why,
                   size_t why_size) {
  uint64_t records = 0, value_sum = 0;
  if (strcmp(o->job_name, "pipeline") == 0) {
    /* v = 3i+1 is a multiple of 4 exactly when i % 4 == 1. */
    for (uint64_t i = 0; i < o->records; i++) {
      uint64_t v = 3 * i + 1;
      if (v % 4 != 0) {
        records++;
        value_sum += v;
      }
    }
  } else {
    /* Key k occurs c_k times; its running counts sum to c_k (c_k + 1) / 2. */
    records = o->records;
    uint64_t full = o->records / o->keys, rest = o->records % o->keys;
    for (uint64_t k = 0; k < o->keys && k < o->records; k++) {
      uint64_t c = full + (k < rest);
      value_sum += c * (c + 1) / 2;
    }
  }
  if (got->records != records || got->value_sum != value_sum) {
    snprintf(why, why_size,
             "sink saw %" PRIu64 " records with value sum %" PRIu64
             ", expected %" PRIu64 " and %" PRIu64,
             got->records, got->value_sum, records, value_sum);
    return false;
  }
  snprintf(why, why_size, "%" PRIu64 " records, value sum %" PRIu64, records,
           value_sum);
  return true;
}

/* ------------------------------------------------------------ running */

/* SIGUSR1 -> a savepoint into DIR/savepoint-<id>, on this thread (the
 * handler only wrote a byte to fd: cli_watch_savepoint_signal).  The id
 * in the name is the newest complete checkpoint when the signal is read;
 * the message gives the one copied. */
typedef struct savepointer {
  sl_job *job;
  const char *dir;
  int fd;
} savepointer;

static void savepoint_once(const savepointer *sp) {
  uint64_t restored = 0, last = sl_job_last_checkpoint(sp->job, &restored);
  char path[4096], err[1024];
  snprintf(path, sizeof path, "%s/savepoint-%" PRIu64, sp->dir,
           last ? last : restored);
  uint64_t id = 0;
  int rc = sl_job_savepoint(sp->job, path, &id, err, sizeof err);
  if (rc)
    fprintf(stderr, "\nsluice: SIGUSR1: savepoint failed: %s\n", err);
  else
    fprintf(stderr, "\nsluice: SIGUSR1: savepoint of checkpoint %" PRIu64
            " written to %s\n", id, path);
}

static void *savepointer_main(void *arg) {
  const savepointer *sp = arg;
  /* One turn per byte; 'q' (cli_unwatch_savepoint_signal) or the pipe's
   * end ends it, so the loop lasts as long as the job. */
  for (;;) {
    char c;
    ssize_t n = read(sp->fd, &c, 1);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0 || c == 'q')
      return 0;
    savepoint_once(sp);
  }
}

/* The bearer token of the endpoint into token: the first line of
 * --http-token-file, else $SLUICE_HTTP_TOKEN; false if neither is set.
 * A file that cannot be read, or holds no token, is a usage error. */
static bool http_token(const options *o, char *token, size_t token_bytes) {
  if (!o->http_token_file) {
    const char *env = getenv("SLUICE_HTTP_TOKEN");
    if (!env || !*env)
      return false;
    if (strlen(env) >= token_bytes)
      die_usage("SLUICE_HTTP_TOKEN is over %zu bytes", token_bytes - 1);
    strcpy(token, env);
    return true;
  }
  FILE *f = fopen(o->http_token_file, "r");
  if (!f)
    die_usage("--http-token-file %s: %s", o->http_token_file,
              strerror(errno));
  bool read = fgets(token, (int)token_bytes, f) != 0;
  fclose(f);
  size_t n = read ? strcspn(token, "\r\n") : 0;
  if (n == 0)
    die_usage("--http-token-file %s: no token on its first line",
              o->http_token_file);
  token[n] = 0;
  return true;
}

/* --http [ADDR:]PORT: start the endpoint (before the job, so a port in use
 * fails at once) and say where it listens.  NULL on failure (said). */
static sl_http *start_http(const options *o, sl_job *job) {
  char addr[64] = "127.0.0.1";
  const char *port_text = o->http;
  const char *colon = strrchr(o->http, ':');
  if (colon) {
    const char *host = o->http;
    size_t n = (size_t)(colon - host);
    if (n >= 2 && host[0] == '[' && host[n - 1] == ']')
      host++, n -= 2; /* [::1]:8080 */
    if (n == 0 || n >= sizeof addr)
      die_usage("--http: bad address in '%s'", o->http);
    memcpy(addr, host, n);
    addr[n] = 0;
    port_text = colon + 1;
  }
  char token[1100];
  const char *protected[] = {o->output_dir, 0};
  sl_http_options opts = SL_HTTP_OPTIONS_INIT;
  opts.address = addr;
  opts.port = (int)parse_u64("--http", port_text, 0, 65535);
  opts.savepoint_root = o->savepoint_dir;
  opts.protected_dirs = protected;
  opts.bearer_token = http_token(o, token, sizeof token) ? token : 0;
  sl_http *http = 0;
  int rc = sl_http_start_with(job, &opts, &http);
  if (rc == SL_EUSAGE)
    die_usage("--http %s: %s is not a loopback address, so the endpoint "
              "needs a bearer token: --http-token-file FILE or "
              "SLUICE_HTTP_TOKEN", o->http, addr);
  explicit_bzero(token, sizeof token); /* the library keeps its copy */
  if (rc == EINVAL)
    fprintf(stderr, "sluice: --http: a token must be 16 to 1024 visible "
            "ASCII characters, and --savepoint-dir must lie outside "
            "--state-dir and --output\n");
  if (rc) {
    fprintf(stderr, "sluice: cannot serve http on %s port %d: %s\n", addr,
            opts.port, sl_strerror(rc));
    return 0;
  }
  fprintf(stderr, "sluice: http endpoint on http://%s%s%s:%d%s\n",
          strchr(addr, ':') ? "[" : "", addr, strchr(addr, ':') ? "]" : "",
          sl_http_port(http), opts.bearer_token ? " (bearer token)" : "");
  return http;
}



static void print_summary(const options *o, sl_job *job, int rc, double secs,
                          bool verified, const char *why) {
  uint64_t records = sl_job_progress(job);
  double rate = secs > 0 ? (double)records / secs : 0;
  int n = sl_job_operator_count(job);
  if (o->json) {
    printf("{\"job\":\"%s\",\"status\":%d,\"verified\":%s,\"records\":%" PRIu64
           ",\"seconds\":%.6f,\"records_per_second\":%.0f,\"operators\":[",
           o->job_name, rc, verified ? "true" : "false", records, secs, rate);
    for (int i = 0; i < n; i++) {
      sl_op_stats st;
      sl_job_stats(job, i, &st);
      printf("%s{\"name\":\"%s\",\"parallelism\":%d,\"records_in\":%" PRIu64
             ",\"records_out\":%" PRIu64 "}",
             i ? "," : "", st.name, st.parallelism, st.records_in,
             st.records_out);
    }
    printf("]}\n");
    return;
  }
  printf("job %s: %s in %.3f s, %.1fM records/s (%" PRIu64 " source records)\n",
         o->job_name, rc == 0 ? "finished" : sl_strerror(rc), secs, rate / 1e6,
         records);
  for (int i = 0; i < n; i++) {
    sl_op_stats st;
    sl_job_stats(job, i, &st);
    printf("  %-10s x%-3d in %12" PRIu64 "  out %12" PRIu64 "\n", st.name,
           st.parallelism, st.records_in, st.records_out);
  }
  if (rc == 0 && strcmp(o->job_name, "window") == 0)
    printf("verdict: %s\n", why);
  else if (rc == 0)
    printf("verification: %s (%s)\n", verified ? "PASSED" : "FAILED", why);
}

/* The window job's verdict: the committed files against the closed form,
 * and the verifying sink's counts (restored with the state, so they are
 * about the committed run). */
static bool window_verdict(const options *o, const sl_op *verify_op,
                           char *why, size_t why_size) {
  window_check c = check_windows(o);
  sl_verify_counts v = {0};
  sl_verify_result(verify_op, &v);
  bool exactly = o->config.checkpoint.mode == SL_EXACTLY_ONCE;
  bool files_ok = c.malformed == 0 && c.lost == 0 && c.wrong_sums == 0 &&
                  (exactly ? c.duplicated == 0 && c.out_of_order == 0 &&
                                 c.pending == 0 && c.lines == c.expected
                           : true);
  bool sink_ok = v.complete && v.lost == 0 &&
                 (exactly ? v.duplicates == 0 && v.out_of_order == 0 : true);
  snprintf(why, why_size,
           "%s: committed %" PRIu64 " windows of %" PRIu64 " expected, %"
           PRIu64 " lost, %" PRIu64 " duplicated, %" PRIu64 " out of order, %"
           PRIu64 " wrong sums, %" PRIu64 " malformed, %" PRIu64
           " uncommitted parts; verifying sink: %" PRIu64 " records, %" PRIu64
           " lost, %" PRIu64 " duplicates, %" PRIu64 " out of order",
           files_ok && sink_ok ? (exactly ? "EXACTLY-ONCE" : "AT-LEAST-ONCE")
                               : "VIOLATED",
           c.lines, c.expected, c.lost, c.duplicated, c.out_of_order,
           c.wrong_sums, c.malformed, c.pending, v.records, v.lost,
           v.duplicates, v.out_of_order);
  return files_ok && sink_ok;
}

static int compare_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Restarts with their recovery times, and the checkpoints of the run. */
static void print_failover(sl_job *job, const options *o) {
  uint32_t restarts = sl_job_restarts(job);
  if (restarts || o->config.faults)
    printf("failover: %" PRIu32 " restart%s, %" PRIu64 " injected fault%s "
           "fired\n", restarts, restarts == 1 ? "" : "s",
           sl_job_faults_fired(job), sl_job_faults_fired(job) == 1 ? "" : "s");
  for (int k = (int)(restarts < 16 ? restarts : 16) - 1; k >= 0; k--) {
    sl_recovery_stats r;
    if (sl_job_recovery_stats(job, k, &r))
      continue;
    char restored[32] = "none", first[32] = "none";
    if (r.restored_us)
      snprintf(restored, sizeof restored, "%.1f ms",
               (double)r.restored_us / 1e3);
    if (r.first_record_us)
      snprintf(first, sizeof first, "%.1f ms",
               (double)r.first_record_us / 1e3);
    printf("  restart %" PRIu32 ": %s\n"
           "    restored checkpoint %" PRIu64 "; after the failure: threads "
           "stopped %.1f ms, waited %.1f ms, state restored %s, first "
           "record %s\n",
           r.restart, r.cause, r.restored_from, (double)r.stopped_us / 1e3,
           (double)r.delay_us / 1e3, restored, first);
  }
  if (!o->config.checkpoint.state_dir)
    return;
  uint64_t durations[64];
  int completed = 0, aborted = 0;
  for (int k = 0; k < 64; k++) {
    sl_checkpoint_stats cs;
    if (sl_job_checkpoint_stats(job, k, &cs))
      break;
    if (cs.status == SL_CHECKPOINT_COMPLETED)
      durations[completed++] = cs.duration_us;
    aborted += cs.status == SL_CHECKPOINT_ABORTED;
  }
  if (completed) {
    qsort(durations, (size_t)completed, sizeof durations[0], compare_u64);
    printf("checkpoints (the last %d): %d complete, %d aborted; trigger to "
           "durable p50 %.1f ms, max %.1f ms\n",
           completed + aborted, completed, aborted,
           (double)durations[completed / 2] / 1e3,
           (double)durations[completed - 1] / 1e3);
  }
}

static int run_job(options *o) {
  bool window = strcmp(o->job_name, "window") == 0;
  bool count = strcmp(o->job_name, "count") == 0;
  if (strcmp(o->job_name, "pipeline") != 0 && strcmp(o->job_name, "keyed") != 0 &&
      !count && !window)
    die_usage("unknown job '%s' (sluice jobs lists them)", o->job_name);
  if (o->output_dir && !count && !window)
    die_usage("--output is for the count and window jobs");
  if (window && !o->output_dir)
    die_usage("the window job needs --output: its committed files are what "
              "the verdict is about");
  if (window && !o->config.checkpoint.state_dir)
    die_usage("the window job needs --state-dir: it is the checkpointed job");
  if (o->window && !window)
    die_usage("--window is for the window job");
  if (!o->window)
    o->window = 100;
  if (o->config.checkpoint.store_policy && !o->config.checkpoint.state_dir)
    die_usage("--resume and --fresh need --state-dir");
  if ((o->config.checkpoint.from_savepoint || o->savepoint_dir) &&
      !o->config.checkpoint.state_dir)
    die_usage("--from-savepoint and --savepoint-dir need --state-dir");
  if (o->config.checkpoint.from_savepoint && !o->output_dir)
    die_usage("--from-savepoint is for the count and window jobs with "
              "--output: the committed files are what the run is checked by");
  /* pipeline and keyed keep their results outside checkpointed state (a
   * checksum, a plain counter array): they may take checkpoints, for
   * measurements, but a resumed run could not verify. */
  if (o->config.checkpoint.store_policy == SL_STORE_RESUME && !count &&
      !window)
    die_usage("--resume is for the count and window jobs (pipeline and keyed "
              "keep their results outside checkpointed state)");
  if (o->config.restart.strategy != SL_RESTART_NONE &&
      !(window || (count && o->output_dir)))
    die_usage("--restart is for the window job and the count job with "
              "--output (elsewhere the results are not checkpointed, so a "
              "restarted run could not verify)");
  if (o->config.checkpoint.store_policy == SL_STORE_RESUME && !o->output_dir)
    die_usage("--resume needs --output: the committed files are what a "
              "resumed run is checked by");
  if (o->parallelism > 128)
    o->config.max_parallelism = (uint32_t)o->parallelism; /* key groups */
  if (cli_refuse_empty_resume(&o->config) != 0)
    return 1;
  sl_job *job = 0;
  o->config.struct_bytes = sizeof o->config; /* sluice.h ABI */
  int rc = sl_job_create(&o->config, &job);
  if (rc) {
    fprintf(stderr, "sluice: invalid configuration: %s\n", sl_strerror(rc));
    return 2;
  }
  sl_checksum sum = {0};
  sl_op *verify_op = 0;
  rc = build_job(o, job, &sum, &verify_op);
  if (rc) {
    fprintf(stderr, "sluice: cannot build job %s: %s\n", o->job_name,
            rc == SL_EGRAPH ? sl_job_error(job) : sl_strerror(rc));
    sl_job_destroy(job);
    return 1;
  }
  cli_watch_signals(job);
  savepointer sp = {.job = job, .dir = o->savepoint_dir, .fd = -1};
  if (o->savepoint_dir && (sp.fd = cli_watch_savepoint_signal()) < 0)
    fprintf(stderr, "sluice: SIGUSR1 savepoints are off: %s\n",
            strerror(errno));
  sl_http *http = o->http ? start_http(o, job) : 0;
  if (o->http && !http) {
    cli_unwatch_signals();
    sl_job_destroy(job);
    return 1;
  }

  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  rc = sl_job_start(job);
  if (rc) {
    fprintf(stderr, "sluice: cannot start job %s: %s\n", o->job_name,
            sl_job_error(job)[0] ? sl_job_error(job) : sl_strerror(rc));
    cli_unwatch_signals();
    if (sp.fd >= 0)
      cli_unwatch_savepoint_signal();
    sl_http_stop(http);
    sl_job_destroy(job);
    return 1;
  }
  pthread_t savepoint_thread;
  bool savepointer_started =
      sp.fd >= 0 &&
      pthread_create(&savepoint_thread, 0, savepointer_main, &sp) == 0;
  cli_status *status =
      o->quiet ? 0 : cli_status_start(job, o->job_name, o->status_interval_ms);
  rc = sl_job_wait(job);
  double secs = seconds_since(&t0);
  sl_http_stop(http); /* before the job is destroyed */
  cli_status_stop(status); /* clears the line before the summary */
  cli_unwatch_signals();
  if (sp.fd >= 0)
    cli_unwatch_savepoint_signal();
  if (savepointer_started)
    pthread_join(savepoint_thread, 0);
  char why[512] = "";
  bool verified = false;
  if (rc == 0 && window)
    verified = window_verdict(o, verify_op, why, sizeof why);
  else if (rc == 0)
    verified = o->output_dir ? verify_output(o, why, sizeof why)
                             : verify(o, &sum, why, sizeof why);
  if (!o->json)
    print_failover(job, o);
  if (rc == 0 && o->config.checkpoint.state_dir && !o->json) {
    sl_checkpoint_stats cs;
    uint64_t from = 0;
    uint64_t last = sl_job_last_checkpoint(job, &from);
    if (from && sl_job_restarts(job) == 0) /* else: a failover's restore */
      printf("resumed from checkpoint %" PRIu64 "\n", from);
    if (sl_job_checkpoint_stats(job, 0, &cs) == 0)
      printf("checkpoints: newest complete %" PRIu64 "; last one %" PRIu64
             " (%s) took %.1f ms, %" PRIu64 " entries, %" PRIu64 " bytes\n",
             last, cs.id, cs.final ? "final" : "periodic",
             (double)cs.duration_us / 1e3, cs.entries_persisted,
             cs.bytes_persisted);
  }
  print_summary(o, job, rc, secs, verified, why);
  if (rc && rc != SL_ESTOPPED)
    fprintf(stderr, "sluice: job %s failed: %s\n", o->job_name, sl_job_error(job));
  sl_job_destroy(job);
  if (rc == SL_ESTOPPED)
    return cli_stop_status(); /* 130 SIGINT, 143 SIGTERM */
  return rc == 0 && verified ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0) {
    usage(stdout);
    return 0;
  }
  if (strcmp(cmd, "--version") == 0) {
    printf("sluice %d.%d.%d\n", SL_VERSION_MAJOR, SL_VERSION_MINOR,
           SL_VERSION_PATCH);
    return 0;
  }
  if (strcmp(cmd, "jobs") == 0) {
    printf("pipeline\nkeyed\ncount\nwindow\n");
    return 0;
  }
  if (strcmp(cmd, "nexmark") == 0)
    return nexmark_main(argc - 2, argv + 2);
  if (strcmp(cmd, "checkpoints") == 0)
    return checkpoints_main(argc - 2, argv + 2);
  if (strcmp(cmd, "run") != 0)
    die_usage("unknown command '%s'", cmd);
  if (argc < 3 || argv[2][0] == '-')
    die_usage("run needs a job name: pipeline, keyed, count or window");
  options o = {.job_name = argv[2], .records = 50000000, .keys = 10000,
               .parallelism = 1};
  parse_options(argc, argv, 3, &o);
  return run_job(&o);
}
