/* test_wal_sink.c — the write-ahead exactly-once sink (sl_sink_exactly_once,
 * operators/wal_sink.c) against real LMDB stores, real threads and real
 * processes killed with SIGKILL.
 *
 * The job: a replayable "stepped" source of parallelism 2 whose instance k
 * emits the values of its range in chunks, each chunk only after the
 * instance took a snapshot since the previous one (so every run has many
 * checkpoints, whatever the timing), into the sink.  The application
 * (app_deliver) keeps, per sink instance, the last checkpoint id it made
 * durable and a hash of every batch; it skips a batch whose id is not
 * above that id (the contract in sluice_embed.h), checks that such a
 * batch has the records it had the first time, and counts each value it
 * accepted.  Exactly-once: every value counted once.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sluice.h"
#include "test_dirs.h"
#include "test_util.h"

#define PARALLELISM 2
#define CHUNK 250u
/* Batches one test job may deliver per instance (ids are below this). */
#define MAX_IDS 100000u

/* ------------------------------------------------------------ source */

typedef struct stepped_spec {
  uint64_t count; /* values 0 .. count-1 over every instance */
} stepped_spec;

typedef struct stepped {
  uint64_t next, end; /* the instance's range [begin, end) */
  bool snapped;       /* a snapshot since the last chunk */
} stepped;

static int stepped_open(sl_ctx *ctx, void *user, void **state) {
  const stepped_spec *spec = user;
  stepped *s = calloc(1, sizeof *s);
  if (!s)
    return ENOMEM;
  uint64_t k = (uint64_t)sl_ctx_instance(ctx);
  uint64_t p = (uint64_t)sl_ctx_parallelism(ctx);
  s->next = spec->count * k / p;
  s->end = spec->count * (k + 1) / p;
  s->snapped = true;
  *state = s;
  return 0;
}

static int stepped_next(sl_ctx *ctx, void *state) {
  stepped *s = state;
  if (s->next == s->end)
    return SL_SOURCE_END;
  if (!s->snapped) { /* wait for a checkpoint between two chunks */
    sl_test_sleep_us(200);
    return 0;
  }
  sl_tuple chunk[CHUNK];
  uint32_t n = 0;
  for (; n < CHUNK && s->next < s->end; n++, s->next++)
    chunk[n] = (sl_tuple){.key = s->next, .value = s->next};
  s->snapped = false;
  int rc = sl_emit_batch(ctx, chunk, sizeof chunk[0], n);
  /* The last chunk and the end in one call: no barrier comes between
   * them, so the sink's final batch is never empty. */
  return rc == 0 && s->next == s->end ? SL_SOURCE_END : rc;
}

static int stepped_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  stepped *s = state;
  s->snapped = true;
  return sl_fixture_save_position(ctx, &s->next);
}

static int stepped_restore(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  stepped *s = state;
  s->snapped = true;
  return sl_fixture_load_position(ctx, &s->next);
}

static void stepped_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  free(state);
}

static const sl_source_ops stepped_ops = {.open = stepped_open,
                                          .next = stepped_next,
                                          .close = stepped_close,
                                          .snapshot = stepped_snapshot,
                                          .restore = stepped_restore};

/* ------------------------------------------------------------ application */

typedef struct app {
  uint64_t count;
  uint8_t *seen;                 /* per value: times accepted */
  uint64_t last_id[PARALLELISM]; /* the last id made durable */
  uint64_t *hashes[PARALLELISM]; /* per id: hash of its batch, 0: none */
  uint64_t first_id[PARALLELISM];   /* the first id delivered, 0: none */
  uint64_t latest_id[PARALLELISM];  /* the id delivered last */
  uint64_t redelivered[PARALLELISM]; /* batches skipped as seen */
  uint64_t mismatches[PARALLELISM];  /* a batch again, with other records */
  uint64_t bad_records[PARALLELISM]; /* not a tuple of 0 .. count-1 */
  sl_job *stop;       /* set: the first call of instance 0 stops it */
  int fail_with;      /* nonzero: the first call of instance 0 returns it */
  uint64_t failed_id; /* the id that call had */
  uint64_t failed_hash;
} app;

static void app_init(app *a, uint64_t count) {
  memset(a, 0, sizeof *a);
  a->count = count;
  a->seen = calloc(count, 1);
  cr_assert(a->seen);
  for (int k = 0; k < PARALLELISM; k++) {
    a->hashes[k] = calloc(MAX_IDS, sizeof *a->hashes[k]);
    cr_assert(a->hashes[k]);
  }
}

static void app_free(app *a) {
  free(a->seen);
  for (int k = 0; k < PARALLELISM; k++)
    free(a->hashes[k]);
}

static uint64_t batch_hash(const sl_record *records, uint32_t count) {
  uint64_t h = count;
  for (uint32_t i = 0; i < count; i++)
    h = h * 1000003u ^ sl_hash_bytes(records[i].data, records[i].size_bytes);
  return h | 1; /* never 0: 0 marks "none" */
}

/* The application's delivery function (runs on the sink's threads; each
 * instance touches only its own fields and its own values). */
static int app_deliver(void *user, int instance, uint64_t id,
                       const sl_record *records, uint32_t count) {
  app *a = user;
  if (instance < 0 || instance >= PARALLELISM || id == 0 || id >= MAX_IDS ||
      count == 0)
    return EINVAL;
  uint64_t h = batch_hash(records, count);
  if (a->first_id[instance] == 0)
    a->first_id[instance] = id;
  a->latest_id[instance] = id;
  if (instance == 0 && a->stop) { /* only instance 0 reads it */
    sl_job_stop(a->stop);
    a->stop = 0;
  }
  if (instance == 0 && a->fail_with) {
    a->failed_id = id;
    a->failed_hash = h;
    int rc = a->fail_with;
    a->fail_with = 0;
    return rc;
  }
  if (id <= a->last_id[instance]) { /* durable before: skip it */
    a->redelivered[instance]++;
    if (a->hashes[instance][id] != h)
      a->mismatches[instance]++;
    return 0;
  }
  for (uint32_t i = 0; i < count; i++) {
    sl_tuple t;
    if (records[i].size_bytes != sizeof t) {
      a->bad_records[instance]++;
      continue;
    }
    memcpy(&t, records[i].data, sizeof t);
    if (t.value >= a->count || t.key != t.value)
      a->bad_records[instance]++;
    else
      a->seen[t.value]++;
  }
  a->hashes[instance][id] = h;
  a->last_id[instance] = id;
  return 0;
}

/* Every value accepted exactly once, nothing else wrong. */
static void app_expect_exactly_once(const app *a) {
  uint64_t lost = 0, duplicated = 0;
  for (uint64_t i = 0; i < a->count; i++) {
    lost += a->seen[i] == 0;
    duplicated += a->seen[i] > 1;
  }
  cr_expect_eq(lost, 0, "%" PRIu64 " of %" PRIu64 " values never delivered",
               lost, a->count);
  cr_expect_eq(duplicated, 0, "%" PRIu64 " values accepted twice",
               duplicated);
  for (int k = 0; k < PARALLELISM; k++) {
    cr_expect_eq(a->mismatches[k], 0, "instance %d: a batch came again with "
                 "other records", k);
    cr_expect_eq(a->bad_records[k], 0, "instance %d: foreign records", k);
  }
}

/* ------------------------------------------------------------ jobs */

typedef struct run_spec {
  const char *state_dir;
  uint64_t count;
  int policy;
  const char *faults;
  uint32_t restarts; /* restart attempts allowed (0: none) */
  int mode;
  const char *from_savepoint;
} run_spec;

static sl_job *build(const run_spec *r, stepped_spec *source, app *a) {
  sl_job_config c = sl_fixture_config(r->state_dir, 2);
  c.checkpoint.store_policy = r->policy;
  c.checkpoint.mode = r->mode;
  c.faults = r->faults;
  c.checkpoint.from_savepoint = r->from_savepoint;
  if (r->restarts) {
    c.restart = sl_restart_defaults(SL_RESTART_FIXED_DELAY);
    c.restart.attempts = r->restarts;
    c.restart.delay_ms = 1;
  }
  source->count = r->count;
  sl_job *job = 0;
  sl_op *src, *out;
  cr_assert_eq(sl_job_create(&c, &job), 0);
  cr_assert_eq(sl_op_source(job, "src", PARALLELISM, &stepped_ops, source,
                            &src), 0);
  int rc = sl_sink_exactly_once(job, "out", src, PARALLELISM, app_deliver, a,
                                &out);
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  return job;
}

/* Run r to its end under a watchdog; returns sl_job_run's value, with
 * the restarts and the faults fired if asked. */
static int run(const run_spec *r, app *a, uint32_t *restarts,
               uint64_t *fired) {
  stepped_spec source;
  sl_job *job = build(r, &source, a);
  sl_test_watchdog w;
  cr_assert_eq(sl_test_watchdog_arm(&w, job, 120, "the wal sink job"), 0);
  int rc = sl_job_run(job);
  cr_assert(!sl_test_watchdog_disarm(&w));
  if (rc)
    cr_log_info("job: %s", sl_job_error(job));
  if (restarts)
    *restarts = sl_job_restarts(job);
  if (fired)
    *fired = sl_job_faults_fired(job);
  sl_job_destroy(job);
  return rc;
}

/* ------------------------------------------------------------ tests */

TestSuite(wal_sink, .timeout = 300);

/* Without faults: every value once, before sl_job_wait returned (the final
 * checkpoint's batch included), ids of an instance increasing.  A resume
 * of the finished store delivers the final batches again, with the same
 * ids and records, and nothing else (wal_sink.c note 5). */
Test(wal_sink, delivers_everything_once_and_the_final_batch_again) {
  char *dir = sl_test_temp_dir("wal");
  app a;
  app_init(&a, sl_test_scaled(20000, 4000));
  run_spec r = {.state_dir = dir, .count = a.count};
  cr_assert_eq(run(&r, &a, 0, 0), 0);
  app_expect_exactly_once(&a);
  for (int k = 0; k < PARALLELISM; k++)
    cr_expect_eq(a.redelivered[k], 0, "instance %d", k);
  uint64_t last[PARALLELISM];
  memcpy(last, a.last_id, sizeof last);
  r.policy = SL_STORE_RESUME;
  memset(a.first_id, 0, sizeof a.first_id);
  memset(a.latest_id, 0, sizeof a.latest_id);
  cr_assert_eq(run(&r, &a, 0, 0), 0);
  app_expect_exactly_once(&a);
  for (int k = 0; k < PARALLELISM; k++) {
    /* The final batch, and any older one whose completion the instance
     * had not acted on before its final snapshot. */
    cr_expect_geq(a.redelivered[k], 1, "instance %d: no batch again", k);
    cr_expect_eq(a.latest_id[k], last[k], "instance %d: the final id", k);
    cr_expect_eq(a.last_id[k], last[k], "instance %d: no new batch", k);
  }
  app_free(&a);
  sl_test_remove_tree(dir);
}

/* In-process failover with a fault at several points, "complete" being
 * the one between a checkpoint's commit and the sink's delivery: every
 * value once after deduplication by (instance, id), none lost, and as
 * many restarts as faults fired. */
Test(wal_sink, failover_at_every_point_is_exactly_once) {
  static const char *const faults[] = {
      "complete:op=out,nth=2",
      "complete:op=out,instance=1,nth=3; complete:op=out,instance=0,nth=6",
      "snapshot:op=out,nth=3",
      "fail:op=out,record=1500",
      "write:nth=4",
      "restore:op=out,nth=1; complete:op=out,nth=2",
      "complete:op=src,nth=4",
  };
  for (size_t f = 0; f < sizeof faults / sizeof faults[0]; f++) {
    char *dir = sl_test_temp_dir("wal");
    app a;
    app_init(&a, sl_test_scaled(30000, 6000));
    run_spec r = {.state_dir = dir, .count = a.count, .faults = faults[f],
                  .restarts = 10};
    uint32_t restarts = 0;
    uint64_t fired = 0;
    int rc = run(&r, &a, &restarts, &fired);
    cr_expect_eq(rc, 0, "faults '%s': the job failed (%d)", faults[f], rc);
    uint64_t planned = 1; /* every fault fires once: one per ';' more */
    for (const char *c = faults[f]; *c; c++)
      planned += *c == ';';
    cr_expect_eq(fired, planned, "faults '%s': %" PRIu64 " fired",
                 faults[f], fired);
    cr_expect_eq(restarts, fired, "faults '%s': %" PRIu32 " restarts",
                 faults[f], restarts);
    app_expect_exactly_once(&a);
    app_free(&a);
    sl_test_remove_tree(dir);
  }
}

/* A delivery function returning 7 fails the job with 7, naming the sink
 * and the checkpoint; the job resumed (from its state directory, or from a
 * savepoint of the failed job in a new one) delivers that batch again
 * (same id, same records) first, and then everything once. */
static void fail_then_resume(bool through_savepoint) {
  char *dir = sl_test_temp_dir("wal");
  char *state = sl_test_path_in(dir, "state");
  char *savepoint = sl_test_path_in(dir, "savepoint");
  char *state2 = sl_test_path_in(dir, "state2");
  app a;
  app_init(&a, sl_test_scaled(20000, 4000));
  a.fail_with = 7;
  run_spec r = {.state_dir = state, .count = a.count};
  stepped_spec source;
  sl_job *job = build(&r, &source, &a);
  cr_assert_eq(sl_job_run(job), 7);
  const char *error = sl_job_error(job);
  cr_expect(strstr(error, "'out'") && strstr(error, "returned 7"),
            "the message names the sink and the value: %s", error);
  char id_text[64];
  snprintf(id_text, sizeof id_text, "checkpoint %" PRIu64, a.failed_id);
  cr_expect(strstr(error, id_text), "the message names %s: %s", id_text,
            error);
  if (through_savepoint) {
    char err[256];
    uint64_t id = 0;
    cr_assert_eq(sl_job_savepoint(job, savepoint, &id, err, sizeof err), 0,
                 "%s", err);
    cr_expect_geq(id, a.failed_id);
    r.state_dir = state2;
    r.from_savepoint = savepoint;
  } else {
    r.policy = SL_STORE_RESUME;
  }
  sl_job_destroy(job);
  cr_assert_neq(a.failed_id, 0);
  uint64_t failed_id = a.failed_id, failed_hash = a.failed_hash;
  memset(a.first_id, 0, sizeof a.first_id);
  cr_assert_eq(run(&r, &a, 0, 0), 0);
  cr_expect_eq(a.first_id[0], failed_id, "the resume delivers checkpoint %"
               PRIu64 " first, not %" PRIu64, failed_id, a.first_id[0]);
  cr_expect_eq(a.hashes[0][failed_id], failed_hash,
               "the batch came again with other records");
  app_expect_exactly_once(&a);
  app_free(&a);
  free(state);
  free(savepoint);
  free(state2);
  sl_test_remove_tree(dir);
}

Test(wal_sink, a_failed_delivery_fails_the_job_and_comes_again) {
  fail_then_resume(false);
}

Test(wal_sink, a_failed_delivery_comes_again_from_a_savepoint) {
  fail_then_resume(true);
}

/* sl_job_stop right after the first delivery (from inside it), then a
 * resume: what was delivered is not lost, what was stored and not yet
 * delivered comes, and nothing twice after deduplication. */
Test(wal_sink, stop_and_resume_is_exactly_once) {
  char *dir = sl_test_temp_dir("wal");
  app a;
  app_init(&a, sl_test_scaled(20000, 4000));
  run_spec r = {.state_dir = dir, .count = a.count};
  stepped_spec source;
  sl_job *job = build(&r, &source, &a);
  a.stop = job;
  cr_assert_eq(sl_job_run(job), SL_ESTOPPED, "%s", sl_job_error(job));
  sl_job_destroy(job);
  cr_assert_neq(a.last_id[0], 0, "nothing delivered before the stop");
  uint64_t before = 0;
  for (uint64_t i = 0; i < a.count; i++)
    before += a.seen[i];
  cr_assert_lt(before, a.count, "the stop came after the end");
  r.policy = SL_STORE_RESUME;
  cr_assert_eq(run(&r, &a, 0, 0), 0);
  app_expect_exactly_once(&a);
  app_free(&a);
  sl_test_remove_tree(dir);
}

/* SL_AT_LEAST_ONCE: the same mechanism; through failovers no value is
 * lost (duplicates would be allowed, but a forward edge of one channel
 * per instance needs no alignment, so there are none either). */
Test(wal_sink, at_least_once_loses_nothing) {
  char *dir = sl_test_temp_dir("wal");
  app a;
  app_init(&a, sl_test_scaled(20000, 4000));
  run_spec r = {.state_dir = dir, .count = a.count, .restarts = 5,
                .mode = SL_AT_LEAST_ONCE,
                .faults = "complete:op=out,nth=2; snapshot:op=out,nth=5"};
  uint32_t restarts = 0;
  cr_assert_eq(run(&r, &a, &restarts, 0), 0);
  cr_expect_eq(restarts, 2);
  app_expect_exactly_once(&a);
  app_free(&a);
  sl_test_remove_tree(dir);
}

/* Without checkpointing the builder refuses, saying why. */
Test(wal_sink, refused_without_checkpoints) {
  sl_job *job;
  cr_assert_eq(sl_job_create(NULL, &job), 0);
  stepped_spec source = {.count = 10};
  sl_op *src, *out;
  cr_assert_eq(sl_op_source(job, "src", 1, &stepped_ops, &source, &src), 0);
  cr_expect_eq(sl_sink_exactly_once(job, "out", src, 1, app_deliver, NULL,
                                    &out), SL_EUSAGE);
  cr_expect(strstr(sl_job_error(job), "exactly-once sink 'out'") &&
                strstr(sl_job_error(job), "checkpoint.state_dir"),
            "%s", sl_job_error(job));
  cr_expect_eq(sl_sink_exactly_once(job, "out", src, 1, NULL, NULL, &out),
               EINVAL);
  sl_job_destroy(job);
}

/* ------------------------------------------------------------ kill test */

/* The application of the kill test: a file of lines "R instance id value"
 * closed by "C instance id count", each batch written with one write()
 * under a lock.  On start it cuts a torn tail (a batch without its C line,
 * a line without its newline) and learns its last ids from the C lines:
 * idempotent per checkpoint id, as sluice_embed.h asks. */
typedef struct file_app {
  int fd;
  pthread_mutex_t lock;
  uint64_t last_id[PARALLELISM];
  char *buffer;
  size_t capacity;
} file_app;

/* What a file holds.  seen NULL: only the last ids and the length of its
 * committed part.  Returns false (with why) for a malformed line inside
 * the committed part. */
typedef struct file_scan {
  uint64_t last_id[PARALLELISM];
  size_t committed_bytes;
  uint64_t batches;
  char why[128];
} file_scan;

static bool scan_file(const char *text, size_t bytes, uint8_t *seen,
                      uint64_t count, file_scan *out) {
  memset(out, 0, sizeof *out);
  size_t at = 0, batch_start = 0;
  uint64_t batch_records = 0;
  while (at < bytes) { /* at grows by a line each pass */
    const char *nl = memchr(text + at, '\n', bytes - at);
    if (!nl)
      break; /* torn line */
    char kind;
    int instance;
    uint64_t id, value;
    if (sscanf(text + at, "%c %d %" SCNu64 " %" SCNu64, &kind, &instance, &id,
               &value) != 4 || instance < 0 || instance >= PARALLELISM) {
      snprintf(out->why, sizeof out->why, "bad line at byte %zu", at);
      return false;
    }
    if (kind == 'R' && batch_records == 0)
      batch_start = at;
    if (kind == 'R') {
      batch_records++;
    } else if (kind == 'C') {
      if (value != batch_records || id <= out->last_id[instance]) {
        snprintf(out->why, sizeof out->why, "batch %d/%" PRIu64 " at byte "
                 "%zu: %" PRIu64 " records, %" PRIu64 " counted, last id %"
                 PRIu64, instance, id, at, batch_records, value,
                 out->last_id[instance]);
        return false;
      }
      for (size_t r = batch_start; seen && r < at;) { /* its R lines */
        int k;
        uint64_t i, v;
        sscanf(text + r, "R %d %" SCNu64 " %" SCNu64, &k, &i, &v);
        if (v < count)
          seen[v]++;
        r = (size_t)((const char *)memchr(text + r, '\n', at - r) - text) + 1;
      }
      out->last_id[instance] = id;
      out->committed_bytes = (size_t)(nl - text) + 1;
      out->batches++;
      batch_records = 0;
    } else {
      snprintf(out->why, sizeof out->why, "bad kind at byte %zu", at);
      return false;
    }
    at = (size_t)(nl - text) + 1;
  }
  return true;
}

static int file_deliver(void *user, int instance, uint64_t id,
                        const sl_record *records, uint32_t count) {
  file_app *f = user;
  pthread_mutex_lock(&f->lock);
  int rc = 0;
  if (id > f->last_id[instance]) {
    size_t need = ((size_t)count + 1) * 64;
    if (need > f->capacity) {
      free(f->buffer);
      f->buffer = malloc(need);
      f->capacity = f->buffer ? need : 0;
    }
    size_t used = 0;
    for (uint32_t i = 0; f->buffer && i < count; i++) {
      sl_tuple t;
      memcpy(&t, records[i].data, sizeof t);
      used += (size_t)snprintf(f->buffer + used, need - used,
                               "R %d %" PRIu64 " %" PRIu64 "\n", instance, id,
                               t.value);
    }
    if (f->buffer)
      used += (size_t)snprintf(f->buffer + used, need - used,
                               "C %d %" PRIu64 " %" PRIu32 "\n", instance, id,
                               count);
    if (!f->buffer)
      rc = ENOMEM;
    else if (write(f->fd, f->buffer, used) != (ssize_t)used)
      rc = EIO;
    else
      f->last_id[instance] = id;
  }
  pthread_mutex_unlock(&f->lock);
  return rc;
}

/* One life of the killed process: recover the file, resume the job, run
 * it to its end.  Exit 0 only when the job finished. */
static int child_main(const char *state_dir, const char *path, uint64_t count) {
  file_app f = {.fd = -1};
  pthread_mutex_init(&f.lock, 0);
  size_t bytes = 0;
  char *text = sl_test_read_file(path, &bytes);
  file_scan scan = {0}; /* no file yet: nothing committed */
  if (text && !scan_file(text, bytes, NULL, 0, &scan))
    return 10;
  free(text);
  f.fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (f.fd < 0 || ftruncate(f.fd, (off_t)scan.committed_bytes))
    return 11;
  memcpy(f.last_id, scan.last_id, sizeof f.last_id);
  sl_job_config c = sl_fixture_config(state_dir, 2);
  c.checkpoint.store_policy = SL_STORE_RESUME;
  stepped_spec source = {.count = count};
  sl_job *job;
  sl_op *src, *out;
  if (sl_job_create(&c, &job) ||
      sl_op_source(job, "src", PARALLELISM, &stepped_ops, &source, &src) ||
      sl_sink_exactly_once(job, "out", src, PARALLELISM, file_deliver, &f,
                           &out))
    return 12;
  int rc = sl_job_run(job);
  if (rc)
    fprintf(stderr, "child: %s\n", sl_job_error(job));
  sl_job_destroy(job);
  close(f.fd);
  free(f.buffer);
  return rc == 0 ? 0 : 13;
}

/* A process killed with SIGKILL at random moments and resumed until its
 * job finished: the application's file holds every value once. */
Test(wal_sink, killed_and_resumed_until_done_is_exactly_once) {
  char *dir = sl_test_temp_dir("wal");
  char *state = sl_test_path_in(dir, "state");
  char *path = sl_test_path_in(dir, "results.txt");
  uint64_t count = sl_test_scaled(60000, 12000);
  unsigned seed = 20261203;
  int kills = 0, rounds = 0;
  bool done = false;
  for (; !done && rounds < 60; rounds++) { /* bounded: kills end at 12 */
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0)
      _exit(child_main(state, path, count));
    if (kills < 12) {
      seed = seed * 1103515245u + 12345u;
      sl_test_sleep_us(5000 + (seed >> 8) % 120000);
      kill(pid, SIGKILL);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    if (WIFSIGNALED(status)) {
      cr_assert_eq(WTERMSIG(status), SIGKILL);
      kills++;
    } else {
      cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "the child failed (exit %d)", WEXITSTATUS(status));
      done = true;
    }
  }
  cr_assert(done, "not finished after %d rounds", rounds);
  cr_log_info("finished after %d kills", kills);
  size_t bytes = 0;
  char *text = sl_test_read_file(path, &bytes);
  cr_assert(text, "no results file");
  uint8_t *seen = calloc(count, 1);
  cr_assert(seen);
  file_scan scan;
  cr_assert(scan_file(text, bytes, seen, count, &scan), "%s", scan.why);
  cr_expect_eq(scan.committed_bytes, bytes, "a torn tail after the end");
  uint64_t lost = 0, duplicated = 0;
  for (uint64_t i = 0; i < count; i++) {
    lost += seen[i] == 0;
    duplicated += seen[i] > 1;
  }
  cr_expect_eq(lost, 0, "%" PRIu64 " values lost", lost);
  cr_expect_eq(duplicated, 0, "%" PRIu64 " values twice", duplicated);
  free(seen);
  free(text);
  free(state);
  free(path);
  sl_test_remove_tree(dir);
}
