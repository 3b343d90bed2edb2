/* test_savepoint.c — savepoints end to end: a keyed job paused halfway,
 * savepointed and stopped, then started from the savepoint with another
 * parallelism of its keyed operator (1 -> 4, 4 -> 2) commits exactly the
 * output of an uninterrupted run; savepoints taken while a job runs do
 * not stall it; every refusal (another graph, another max_parallelism, a
 * rescaled operator with operator state, a missing or corrupt manifest, a
 * non-empty target, a state directory with checkpoints) says why and
 * changes nothing.
 *
 * Real threads, real LMDB stores and files in temporary directories. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store.h"
#include "test_dirs.h"
#include "test_util.h"

/* ------------------------------------------------------------ the job */

/* The source: instance s of P emits i = s, s + P, s + 2P, ... < count as
 * {key = i % keys, value = i}; with P dividing keys, each key has one
 * producer, so its records reach the count operator in order and the
 * running sums are deterministic.  Each instance stops after half of its
 * records until `release` is set (counting itself in `paused`), so a test
 * can checkpoint and savepoint a job that is exactly halfway.
 * Replayable: the position is the number of records emitted. */
typedef struct control {
  uint64_t count;
  uint64_t keys;
  int parallelism;
  atomic_int release;
  atomic_int paused;
  bool timestamps;      /* records carry timestamp i */
  atomic_int fail_open; /* the source's open fails */
} control;

typedef struct source_state {
  control *ctl;
  int instance;
  uint64_t emitted; /* by this instance */
  uint64_t total;   /* this instance's records */
  bool counted;     /* counted in ctl->paused */
} source_state;

static int source_open(sl_ctx *ctx, void *user, void **state) {
  control *ctl = user;
  if (atomic_load(&ctl->fail_open)) {
    sl_ctx_fail(ctx, "told to fail");
    return -EIO;
  }
  source_state *s = calloc(1, sizeof *s);
  if (!s)
    return -ENOMEM;
  s->ctl = ctl;
  s->instance = sl_ctx_instance(ctx);
  uint64_t p = (uint64_t)ctl->parallelism, k = (uint64_t)s->instance;
  s->total = ctl->count > k ? (ctl->count - k + p - 1) / p : 0;
  *state = s;
  return 0;
}

static int source_next(sl_ctx *ctx, void *state) {
  source_state *s = state;
  uint64_t half = s->total / 2;
  if (s->emitted == half && !atomic_load(&s->ctl->release)) {
    if (!s->counted)
      atomic_fetch_add(&s->ctl->paused, 1);
    s->counted = true;
    sl_test_sleep_us(200); /* checkpoint triggers are taken between calls */
    return 0;
  }
  if (s->emitted == s->total)
    return SL_SOURCE_END;
  uint64_t stop = s->emitted < half ? half : s->total;
  for (int n = 0; n < 256 && s->emitted < stop; n++) {
    uint64_t i = (uint64_t)s->instance + s->emitted * (uint64_t)s->ctl->parallelism;
    sl_tuple t = {.key = i % s->ctl->keys, .value = i};
    int rc = s->ctl->timestamps ? sl_emit_ts(ctx, &t, sizeof t, (int64_t)i)
                                : sl_emit(ctx, &t, sizeof t);
    if (rc)
      return rc;
    s->emitted++;
  }
  return 0;
}

static void source_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  free(state);
}

static int source_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  return sl_fixture_save_position(ctx, &((source_state *)state)->emitted);
}

static int source_restore(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  source_state *s = state;
  const void *data;
  uint32_t bytes;
  int rc = sl_operator_state_get(ctx, &data, &bytes);
  if (rc || bytes != sizeof s->emitted)
    return rc ? rc : -EINVAL;
  memcpy(&s->emitted, data, sizeof s->emitted);
  return 0;
}

/* The running count and sum of each key, in keyed value state. */
typedef struct running {
  uint64_t key;
  uint64_t count;
  uint64_t sum;
} running;

static int count_process(sl_ctx *ctx, void *state, int input,
                         const sl_record *in) {
  (void)state;
  (void)input;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  uint64_t *acc;
  int rc = sl_state_update(ctx, 0, 2 * sizeof(uint64_t), 0, (void **)&acc);
  if (rc)
    return rc;
  acc[0]++;
  acc[1] += t.value;
  running out = {.key = t.key, .count = acc[0], .sum = acc[1]};
  return sl_emit(ctx, &out, sizeof out);
}

static int format_running(void *user, const sl_record *in, char *buffer,
                          uint32_t buffer_bytes) {
  (void)user;
  running r;
  memcpy(&r, in->data, sizeof r);
  int n = snprintf(buffer, buffer_bytes, "%" PRIu64 ",%" PRIu64 ",%" PRIu64,
                   r.key, r.count, r.sum);
  return (uint32_t)n < buffer_bytes ? n : n + 1;
}

static int pass_through(void *user, const sl_record *in, void *out,
                        uint32_t *out_bytes) {
  (void)user;
  memcpy(out, in->data, in->size_bytes);
  *out_bytes = in->size_bytes;
  return 0;
}

typedef struct spec {
  control *ctl;
  const char *state_dir;
  const char *out_dir;
  const char *from_savepoint;
  int count_parallelism;
  int source_parallelism; /* 0: ctl->parallelism */
  int policy;
  uint32_t max_parallelism;
  uint32_t interval_ms;
  bool extra_map; /* another graph: a map between count and sink */
  const char *faults;       /* injected (docs/failover-and-faults.md) */
  uint32_t restarts;        /* fixed-delay restarts allowed */
} spec;

static sl_job *build(const spec *s) {
  sl_job_config config =
      sl_fixture_config(s->state_dir, s->interval_ms ? s->interval_ms : 20);
  config.checkpoint.store_policy = s->policy;
  config.checkpoint.from_savepoint = s->from_savepoint;
  config.max_parallelism = s->max_parallelism;
  config.faults = s->faults;
  if (s->restarts) {
    config.restart = sl_restart_defaults(SL_RESTART_FIXED_DELAY);
    config.restart.attempts = s->restarts;
    config.restart.delay_ms = 0;
  }
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  static const sl_source_ops source_ops = {.open = source_open,
                                           .next = source_next,
                                           .close = source_close,
                                           .snapshot = source_snapshot,
                                           .restore = source_restore};
  static const sl_process_ops count_ops = {.process = count_process};
  sl_op *src, *by, *count, *sink;
  int sp = s->source_parallelism ? s->source_parallelism : s->ctl->parallelism;
  cr_assert_eq(sl_op_source(job, "source", sp, &source_ops, s->ctl, &src), 0);
  sl_watermark_config wc = {.every_call = 1};
  if (s->ctl->timestamps)
    cr_assert_eq(sl_op_watermarks(src, &wc), 0);
  cr_assert_eq(sl_op_key_by(job, "by-key", src, sl_fixture_tuple_key, 0, &by),
               0);
  cr_assert_eq(sl_op_process(job, "count", &by, 1, s->count_parallelism,
                             &count_ops, 0, &count), 0);
  if (s->extra_map)
    cr_assert_eq(sl_op_map(job, "extra", count, s->count_parallelism,
                           sizeof(running), pass_through, 0, &count), 0);
  sl_file_sink_config fc = {.dir = s->out_dir, .exactly_once = 1,
                            .format = format_running, .suffix = ".csv"};
  cr_assert_eq(sl_sink_file(job, "sink", count, 2, &fc, &sink), 0);
  return job;
}

static int run_to_end(sl_job *job) {
  sl_test_watchdog w;
  sl_test_watchdog_arm(&w, job, 120, "savepoint job");
  int rc = sl_job_wait(job);
  cr_assert_not(sl_test_watchdog_disarm(&w), "the job hung");
  if (rc)
    cr_log_error("job failed: %s", sl_job_error(job));
  return rc;
}

/* Poll (bounded: about 60 s) until every source instance is paused. */
static void wait_paused(control *ctl) {
  for (int i = 0; i < 60000 && atomic_load(&ctl->paused) < ctl->parallelism;
       i++)
    sl_test_sleep_us(1000);
  cr_assert_eq(atomic_load(&ctl->paused), ctl->parallelism,
               "the sources did not reach their pause");
}

/* Trigger a checkpoint and wait (bounded) until it is complete. */
static uint64_t checkpoint_now(sl_job *job) {
  uint64_t id = 0;
  int rc = EBUSY;
  for (int i = 0; i < 1000 && rc == EBUSY; i++) /* one may be in flight */
    rc = sl_job_trigger_checkpoint(job, &id);
  cr_assert_eq(rc, 0, "trigger: %s", sl_strerror(rc));
  for (int i = 0; i < 60000 && sl_job_last_checkpoint(job, 0) < id; i++)
    sl_test_sleep_us(1000);
  cr_assert_geq(sl_job_last_checkpoint(job, 0), id);
  return id;
}

/* Job A with the keyed operator at count_parallelism: run to its pause,
 * checkpoint, savepoint into sp, stop.  Returns the savepoint's id. */
static uint64_t take_savepoint(control *ctl, const char *state,
                               const char *out, const char *sp,
                               int count_parallelism) {
  atomic_store(&ctl->release, 0);
  atomic_store(&ctl->paused, 0);
  spec a = {.ctl = ctl, .state_dir = state, .out_dir = out,
            .count_parallelism = count_parallelism};
  sl_job *job = build(&a);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  wait_paused(ctl);
  uint64_t id = checkpoint_now(job);
  uint64_t sp_id = 0;
  char err[512];
  int rc = sl_job_savepoint(job, sp, &sp_id, err, sizeof err);
  cr_assert_eq(rc, 0, "savepoint: %s (%s)", sl_strerror(rc), err);
  cr_assert_geq(sp_id, id);
  sl_job_stop(job);
  cr_assert_eq(sl_job_wait(job), SL_ESTOPPED);
  sl_job_destroy(job);
  return sp_id;
}

/* ------------------------------------------------------------ output */

typedef struct lines {
  char **text;
  size_t count;
  size_t pending; /* uncommitted parts */
} lines;

static int compare_text(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every committed line of out_dir, sorted. */
static lines read_lines(const char *out_dir) {
  lines r = {0};
  size_t capacity = 0;
  DIR *d = opendir(out_dir);
  cr_assert(d, "opendir %s", out_dir);
  struct dirent *e;
  while ((e = readdir(d))) {
    r.pending += strncmp(e->d_name, ".part-", 6) == 0;
    if (strncmp(e->d_name, "part-", 5) != 0)
      continue;
    char *path = sl_test_path_in(out_dir, e->d_name);
    FILE *f = fopen(path, "r");
    cr_assert(f, "open %s", path);
    char buffer[128];
    while (fgets(buffer, sizeof buffer, f)) {
      if (r.count == capacity) {
        capacity = capacity ? 2 * capacity : 4096;
        r.text = realloc(r.text, capacity * sizeof *r.text);
        cr_assert(r.text);
      }
      r.text[r.count++] = strdup(buffer);
    }
    fclose(f);
    free(path);
  }
  closedir(d);
  if (r.count)
    qsort(r.text, r.count, sizeof *r.text, compare_text);
  return r;
}

static void lines_free(lines *r) {
  for (size_t i = 0; i < r->count; i++)
    free(r->text[i]);
  free(r->text);
}

/* The output of an uninterrupted run of the same job. */
static lines reference_output(control *ctl) {
  char *state = sl_test_temp_dir("sp"), *out = sl_test_temp_dir("sp");
  atomic_store(&ctl->release, 1);
  spec s = {.ctl = ctl, .state_dir = state, .out_dir = out,
            .count_parallelism = 3};
  sl_job *job = build(&s);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  cr_assert_eq(run_to_end(job), 0);
  sl_job_destroy(job);
  lines r = read_lines(out);
  cr_assert_eq(r.count, ctl->count);
  sl_test_remove_tree(state);
  sl_test_remove_tree(out);
  return r;
}

static bool exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

TestSuite(savepoint, .timeout = 240);

/* ------------------------------------------------------------ rescaling */

/* Savepoint halfway with the keyed operator at `from` instances, start
 * from it at `to`, and compare with an uninterrupted run.  replace: the
 * new job uses the first one's state directory (it holds checkpoints)
 * with SL_STORE_FRESH; leftover: a staging directory of an interrupted
 * install waits in the new state directory. */
static void rescale_with(int from, int to, bool replace, bool leftover,
                         const char *faults) {
  control ctl = {.count = sl_test_scaled(200000, 20000), .keys = 1000,
                 .parallelism = 2};
  lines expected = reference_output(&ctl);
  char *root = sl_test_temp_dir("sp"), *out = sl_test_temp_dir("sp");
  char *state_a = sl_test_path_in(root, "state-a");
  char *state_b = sl_test_path_in(root, "state-b"); /* does not exist */
  char *sp = sl_test_path_in(root, "savepoint");
  uint64_t sp_id = take_savepoint(&ctl, state_a, out, sp, from);

  if (leftover) { /* what a crash in the middle of an install leaves */
    cr_assert_eq(mkdir(state_b, 0755), 0);
    char *staging = sl_test_path_in(state_b, ".savepoint-install");
    cr_assert_eq(mkdir(staging, 0755), 0);
    char *junk = sl_test_path_in(staging, "data.mdb");
    FILE *f = fopen(junk, "w");
    cr_assert(f);
    fputs("half a copy", f);
    fclose(f);
    free(junk);
    free(staging);
  }
  atomic_store(&ctl.release, 1);
  spec b = {.ctl = &ctl, .state_dir = replace ? state_a : state_b,
            .out_dir = out, .from_savepoint = sp, .count_parallelism = to,
            .policy = replace ? SL_STORE_FRESH : SL_STORE_REFUSE,
            .faults = faults, .restarts = faults ? 3 : 0};
  sl_job *job = build(&b);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  cr_assert_eq(run_to_end(job), 0);
  uint64_t restored = 0;
  sl_job_last_checkpoint(job, &restored);
  if (!faults)
    cr_expect_eq(restored, sp_id, "resumed from %" PRIu64 ", not %" PRIu64,
                 restored, sp_id);
  else /* the restart restored the installed store's newest checkpoint */
    cr_expect_eq(sl_job_restarts(job), 1, "%" PRIu32 " restarts",
                 sl_job_restarts(job));
  sl_job_destroy(job);
  char *staging = sl_test_path_in(replace ? state_a : state_b,
                                  ".savepoint-install");
  cr_expect_not(exists(staging), "the staging directory is left");
  free(staging);

  lines got = read_lines(out);
  cr_expect_eq(got.pending, 0, "uncommitted parts left");
  cr_assert_eq(got.count, expected.count, "%zu lines, expected %zu",
               got.count, expected.count);
  size_t differ = 0;
  for (size_t i = 0; i < got.count; i++)
    differ += strcmp(got.text[i], expected.text[i]) != 0;
  cr_expect_eq(differ, 0, "%zu lines differ from the uninterrupted run",
               differ);
  lines_free(&got);
  lines_free(&expected);
  free(state_a);
  free(state_b);
  free(sp);
  sl_test_remove_tree(out);
  sl_test_remove_tree(root);
}

Test(savepoint, rescale_keyed_operator_1_to_4_equals_uninterrupted_run) {
  rescale_with(1, 4, false, false, 0);
}

Test(savepoint, rescale_keyed_operator_4_to_2_equals_uninterrupted_run) {
  rescale_with(4, 2, false, false, 0);
}

Test(savepoint, same_parallelism_equals_uninterrupted_run) {
  rescale_with(2, 2, false, false, 0);
}

Test(savepoint, fresh_policy_replaces_checkpoints_with_the_savepoint) {
  rescale_with(2, 3, true, false, 0);
}

Test(savepoint, an_interrupted_install_is_cleaned_up_by_the_next) {
  rescale_with(3, 1, false, true, 0);
}

Test(savepoint, a_failover_after_a_rescaled_start_equals_uninterrupted_run) {
  /* Instance 3 exists only in the rescaled job; it fails once, and the
   * restart restores from the installed store. */
  rescale_with(2, 4, false, false, "fail:op=count,instance=3,record=500");
}

/* ------------------------------------------------------------ the files */

Test(savepoint, manifest_and_journal_describe_the_savepoint) {
  control ctl = {.count = 20000, .keys = 100, .parallelism = 2};
  char *root = sl_test_temp_dir("sp"), *out = sl_test_temp_dir("sp");
  char *state = sl_test_path_in(root, "state");
  char *sp = sl_test_path_in(root, "deeper/savepoint"); /* parents made */
  uint64_t id = take_savepoint(&ctl, state, out, sp, 3);

  char *manifest_path = sl_test_path_in(sp, "manifest.json");
  json_error_t error;
  json_t *m = json_load_file(manifest_path, 0, &error);
  cr_assert(m, "manifest: %s", error.text);
  const char *format, *graph;
  json_int_t version, store_format, checkpoint_id, created_ms, max_p, bytes;
  json_t *ops;
  cr_assert_eq(json_unpack(m, "{s:s, s:I, s:I, s:I, s:I, s:s, s:I, s:o, s:I}",
                           "format", &format, "version", &version,
                           "store_format", &store_format, "checkpoint_id",
                           &checkpoint_id, "created_ms", &created_ms, "graph",
                           &graph, "max_parallelism", &max_p, "operators",
                           &ops, "bytes", &bytes), 0);
  cr_expect_str_eq(format, "sluice-savepoint");
  cr_expect_eq(version, 1);
  cr_expect_eq(store_format, 3); /* store.h: format 3 */
  cr_expect_eq((uint64_t)checkpoint_id, id);
  cr_expect_gt(created_ms, 1600000000000LL);
  cr_expect_eq(max_p, 128);
  cr_expect_str_eq(graph, "0:source:source;1:key_by:by-key<0>;"
                          "2:process:count<1>;3:sink:sink<2>");
  cr_assert_eq(json_array_size(ops), 3); /* source, count, sink */
  json_int_t p = 0;
  const char *name = "";
  cr_assert_eq(json_unpack(json_array_get(ops, 1), "{s:s, s:I}", "name",
                           &name, "parallelism", &p), 0);
  cr_expect_str_eq(name, "count");
  cr_expect_eq(p, 3);
  char *data = sl_test_path_in(sp, "data.mdb");
  struct stat st;
  cr_assert_eq(stat(data, &st), 0);
  cr_expect_eq(bytes, (json_int_t)st.st_size);
  char *lock = sl_test_path_in(sp, "lock.mdb");
  cr_expect_not(exists(lock), "no lock file in the savepoint");
  free(lock);

  /* One line in savepoints.jsonl, with the absolute path. */
  char *journal = sl_test_path_in(state, "savepoints.jsonl");
  FILE *f = fopen(journal, "r");
  cr_assert(f, "%s", journal);
  char line[4096];
  cr_assert(fgets(line, sizeof line, f));
  cr_expect_null(fgets(line + 2048, 2048, f), "one line only");
  fclose(f);
  cr_expect_eq(strncmp(line, "{\"checkpoint_id\":", 17), 0, "%s", line);
  json_t *j = json_loads(line, 0, &error);
  cr_assert(j, "%s: %s", line, error.text);
  json_int_t j_id, j_ms, j_bytes;
  const char *path;
  cr_assert_eq(json_unpack(j, "{s:I, s:I, s:s, s:I}", "checkpoint_id", &j_id,
                           "created_ms", &j_ms, "path", &path, "bytes",
                           &j_bytes), 0);
  char absolute[PATH_MAX];
  cr_assert(realpath(sp, absolute));
  cr_expect_eq((uint64_t)j_id, id);
  cr_expect_eq(j_ms, created_ms);
  cr_expect_str_eq(path, absolute);
  cr_expect_eq(j_bytes, bytes);
  json_decref(j);
  json_decref(m);
  free(journal);
  free(data);
  free(manifest_path);
  free(state);
  free(sp);
  sl_test_remove_tree(out);
  sl_test_remove_tree(root);
}

/* ------------------------------------------------------------ refusals */

/* A savepoint of the standard job (count at 2) in root/savepoint. */
typedef struct fixture {
  control ctl;
  char *root, *out, *state, *sp, *target;
} fixture;

static void fixture_make(fixture *f) {
  memset(f, 0, sizeof *f);
  f->ctl.count = 20000;
  f->ctl.keys = 100;
  f->ctl.parallelism = 2;
  f->root = sl_test_temp_dir("sp");
  f->out = sl_test_temp_dir("sp");
  f->state = sl_test_path_in(f->root, "state");
  f->sp = sl_test_path_in(f->root, "savepoint");
  f->target = sl_test_path_in(f->root, "target"); /* not made */
  take_savepoint(&f->ctl, f->state, f->out, f->sp, 2);
}

static void fixture_free(fixture *f) {
  free(f->state);
  free(f->sp);
  free(f->target);
  sl_test_remove_tree(f->out);
  sl_test_remove_tree(f->root);
}

/* Starting s must fail with rc and a message holding `words`, leaving
 * the target state directory uncreated. */
static void expect_refused(const spec *s, int rc, const char *words) {
  sl_job *job = build(s);
  int got = sl_job_start(job);
  cr_expect_eq(got, rc, "got %s (%s)", sl_strerror(got), sl_job_error(job));
  cr_expect(strstr(sl_job_error(job), words) != 0,
            "message \"%s\" lacks \"%s\"", sl_job_error(job), words);
  sl_job_destroy(job);
  cr_expect_not(exists(s->state_dir), "%s was created", s->state_dir);
}

Test(savepoint, another_job_graph_is_refused) {
  fixture f;
  fixture_make(&f);
  spec s = {.ctl = &f.ctl, .state_dir = f.target, .out_dir = f.out,
            .from_savepoint = f.sp, .count_parallelism = 2,
            .extra_map = true};
  expect_refused(&s, SL_ESTORE, "written by job graph");
  fixture_free(&f);
}

Test(savepoint, another_max_parallelism_is_refused) {
  fixture f;
  fixture_make(&f);
  spec s = {.ctl = &f.ctl, .state_dir = f.target, .out_dir = f.out,
            .from_savepoint = f.sp, .count_parallelism = 2,
            .max_parallelism = 64};
  expect_refused(&s, SL_ESTORE, "max_parallelism 128, this job has 64");
  fixture_free(&f);
}

Test(savepoint, rescaling_an_operator_with_operator_state_is_refused) {
  fixture f;
  fixture_make(&f);
  /* The source keeps its position per instance: 2 -> 1 cannot merge them
   * (the keyed count may change, and does here, 2 -> 3). */
  spec s = {.ctl = &f.ctl, .state_dir = f.target, .out_dir = f.out,
            .from_savepoint = f.sp, .count_parallelism = 3,
            .source_parallelism = 1};
  expect_refused(&s, SL_ESTORE, "operator 'source' has parallelism 2");
  fixture_free(&f);
}

Test(savepoint, a_missing_manifest_is_refused) {
  fixture f;
  fixture_make(&f);
  char *manifest = sl_test_path_in(f.sp, "manifest.json");
  cr_assert_eq(unlink(manifest), 0);
  spec s = {.ctl = &f.ctl, .state_dir = f.target, .out_dir = f.out,
            .from_savepoint = f.sp, .count_parallelism = 2};
  expect_refused(&s, SL_ESTORE, "no manifest.json");
  free(manifest);
  fixture_free(&f);
}

Test(savepoint, a_corrupt_manifest_is_refused) {
  fixture f;
  fixture_make(&f);
  char *manifest = sl_test_path_in(f.sp, "manifest.json");
  FILE *file = fopen(manifest, "w");
  cr_assert(file);
  fputs("{\"format\": \"sluice-savepoint\", \"version\": ", file);
  fclose(file);
  spec s = {.ctl = &f.ctl, .state_dir = f.target, .out_dir = f.out,
            .from_savepoint = f.sp, .count_parallelism = 2};
  expect_refused(&s, SL_ESTORE, "is not valid JSON");
  /* Valid JSON without the fields of a manifest. */
  file = fopen(manifest, "w");
  cr_assert(file);
  fputs("{\"format\": \"sluice-savepoint\"}\n", file);
  fclose(file);
  expect_refused(&s, SL_ESTORE, "is malformed");
  fixture_free(&f);
  free(manifest);
}

Test(savepoint, a_manifest_not_matching_its_store_is_refused) {
  fixture f;
  fixture_make(&f);
  char *manifest = sl_test_path_in(f.sp, "manifest.json");
  json_t *m = json_load_file(manifest, 0, 0);
  cr_assert(m);
  json_int_t id = json_integer_value(json_object_get(m, "checkpoint_id"));
  json_object_set_new(m, "checkpoint_id", json_integer(id + 1000));
  cr_assert_eq(json_dump_file(m, manifest, 0), 0);
  json_decref(m);
  spec s = {.ctl = &f.ctl, .state_dir = f.target, .out_dir = f.out,
            .from_savepoint = f.sp, .count_parallelism = 2};
  expect_refused(&s, SL_ESTORE, "its manifest says");
  free(manifest);
  fixture_free(&f);
}

Test(savepoint, a_state_directory_with_checkpoints_is_refused) {
  fixture f;
  fixture_make(&f);
  /* f.state holds the checkpoints of the job that took the savepoint. */
  spec s = {.ctl = &f.ctl, .state_dir = f.state, .out_dir = f.out,
            .from_savepoint = f.sp, .count_parallelism = 2};
  sl_job *job = build(&s);
  int rc = sl_job_start(job);
  cr_expect_eq(rc, SL_EHASSTATE, "got %s (%s)", sl_strerror(rc),
               sl_job_error(job));
  cr_expect(strstr(sl_job_error(job), "holds checkpoints") != 0, "%s",
            sl_job_error(job));
  sl_job_destroy(job);
  char *staging = sl_test_path_in(f.state, ".savepoint-install");
  cr_expect_not(exists(staging));
  free(staging);
  fixture_free(&f);
}

Test(savepoint, a_non_empty_target_directory_is_refused) {
  control ctl = {.count = 20000, .keys = 100, .parallelism = 2};
  char *root = sl_test_temp_dir("sp"), *out = sl_test_temp_dir("sp");
  char *state = sl_test_path_in(root, "state");
  char *target = sl_test_path_in(root, "target");
  cr_assert_eq(mkdir(target, 0755), 0);
  char *other = sl_test_path_in(target, "notes.txt");
  FILE *file = fopen(other, "w");
  cr_assert(file);
  fputs("mine\n", file);
  fclose(file);

  spec a = {.ctl = &ctl, .state_dir = state, .out_dir = out,
            .count_parallelism = 2};
  sl_job *job = build(&a);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  wait_paused(&ctl);
  checkpoint_now(job);
  char err[512];
  uint64_t id = 7;
  int rc = sl_job_savepoint(job, target, &id, err, sizeof err);
  cr_expect_eq(rc, EEXIST, "%s: %s", sl_strerror(rc), err);
  cr_expect_eq(id, 0);
  cr_expect(strstr(err, "not empty") != 0 && strstr(err, target) != 0, "%s",
            err);
  char *manifest = sl_test_path_in(target, "manifest.json");
  char *data = sl_test_path_in(target, "data.mdb");
  cr_expect_not(exists(manifest));
  cr_expect_not(exists(data));
  cr_expect(exists(other));
  atomic_store(&ctl.release, 1);
  cr_assert_eq(run_to_end(job), 0);
  sl_job_destroy(job);
  free(manifest);
  free(data);
  free(other);
  free(target);
  free(state);
  sl_test_remove_tree(out);
  sl_test_remove_tree(root);
}

Test(savepoint, no_complete_checkpoint_yet_is_its_own_error) {
  control ctl = {.count = 20000, .keys = 100, .parallelism = 2};
  char *root = sl_test_temp_dir("sp"), *out = sl_test_temp_dir("sp");
  char *state = sl_test_path_in(root, "state");
  char *target = sl_test_path_in(root, "target");
  /* No periodic checkpoint within the test's life; none triggered. */
  spec a = {.ctl = &ctl, .state_dir = state, .out_dir = out,
            .count_parallelism = 2, .interval_ms = 3600000};
  sl_job *job = build(&a);
  char err[512];
  cr_expect_eq(sl_job_savepoint(job, target, 0, err, sizeof err),
               SL_ENOTSTARTED, "%s", err);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  wait_paused(&ctl);
  int rc = sl_job_savepoint(job, target, 0, err, sizeof err);
  cr_expect_eq(rc, SL_ENOTFOUND, "%s: %s", sl_strerror(rc), err);
  cr_expect(strstr(err, "no checkpoint is complete yet") != 0, "%s", err);
  cr_expect_not(exists(target), "the target was created");
  atomic_store(&ctl.release, 1);
  cr_assert_eq(run_to_end(job), 0);
  /* After the end the store is still open: the final checkpoint. */
  uint64_t id = 0;
  rc = sl_job_savepoint(job, target, &id, err, sizeof err);
  cr_expect_eq(rc, 0, "%s", err);
  cr_expect_gt(id, 0);
  sl_job_destroy(job);

  sl_job_config off = SL_JOB_CONFIG_INIT;
  cr_assert_eq(sl_job_create(&off, &job), 0);
  cr_expect_eq(sl_job_savepoint(job, target, 0, err, sizeof err), SL_EUSAGE);
  cr_expect_eq(sl_job_savepoint(job, "", 0, err, sizeof err), EINVAL);
  sl_job_destroy(job);
  free(target);
  free(state);
  sl_test_remove_tree(out);
  sl_test_remove_tree(root);
}

/* ------------------------------------------------------------ while running */

/* Takes savepoints one after another into root/sp-N until told to stop;
 * releases the paused sources after its first success, so at least one
 * is taken while the job runs and the rest while its second half flows. */
typedef struct taker {
  sl_job *job;
  control *ctl;
  const char *root;
  atomic_int stop;
  int taken;
  uint64_t last_id;
  int failures;
  char error[512];
} taker;

static void *taker_main(void *arg) {
  taker *t = arg;
  for (int n = 0; n < 1000 && !atomic_load(&t->stop); n++) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/sp-%d", t->root, n);
    uint64_t id = 0;
    int rc = sl_job_savepoint(t->job, dir, &id, t->error, sizeof t->error);
    if (rc == 0) {
      t->failures += id < t->last_id; /* ids never go back */
      t->last_id = id;
      t->taken++;
      atomic_store(&t->ctl->release, 1);
    } else if (rc != SL_ENOTFOUND) {
      t->failures++;
    }
    sl_test_sleep_us(2000);
  }
  return 0;
}

Test(savepoint, savepoints_while_the_job_runs_do_not_stall_it) {
  control ctl = {.count = sl_test_scaled(400000, 40000), .keys = 1000,
                 .parallelism = 2};
  char *root = sl_test_temp_dir("sp"), *out = sl_test_temp_dir("sp");
  char *state = sl_test_path_in(root, "state");
  spec a = {.ctl = &ctl, .state_dir = state, .out_dir = out,
            .count_parallelism = 2, .interval_ms = 10};
  sl_job *job = build(&a);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  taker t = {.job = job, .ctl = &ctl, .root = root};
  pthread_t thread;
  cr_assert_eq(pthread_create(&thread, 0, taker_main, &t), 0);
  /* The job must finish (the watchdog fails a stall), with all output. */
  int rc = run_to_end(job);
  atomic_store(&t.stop, 1);
  pthread_join(thread, 0);
  cr_assert_eq(rc, 0);
  cr_expect_geq(t.taken, 1);
  cr_expect_eq(t.failures, 0, "last error: %s", t.error);
  lines got = read_lines(out);
  cr_expect_eq(got.count, ctl.count);
  cr_expect_eq(got.pending, 0);
  lines_free(&got);
  /* One journal line per savepoint. */
  char *journal = sl_test_path_in(state, "savepoints.jsonl");
  FILE *f = fopen(journal, "r");
  cr_assert(f);
  int journal_lines = 0;
  char line[4096];
  while (fgets(line, sizeof line, f))
    journal_lines++;
  fclose(f);
  cr_expect_eq(journal_lines, t.taken);
  sl_job_destroy(job);
  free(journal);
  free(state);
  sl_test_remove_tree(out);
  sl_test_remove_tree(root);
}

/* ------------------------------------------------------------ the store */

Test(savepoint, a_leftover_staging_directory_is_not_foreign) {
  char *dir = sl_test_temp_dir("sp");
  char *staging = sl_test_path_in(dir, SL_STORE_STAGING_NAME);
  cr_assert_eq(mkdir(staging, 0755), 0);
  sl_store_options options = {.graph_fingerprint = "g", .no_sync = 1};
  sl_store *store;
  char err[512];
  cr_expect_eq(sl_store_open(dir, &options, &store, err, sizeof err), 0,
               "%s", err);
  sl_store_close(store);
  /* Any other name still marks a directory that is not ours. */
  char *other = sl_test_path_in(dir, "other");
  char *data = sl_test_path_in(dir, "data.mdb");
  cr_assert_eq(unlink(data), 0);
  cr_assert_eq(mkdir(other, 0755), 0);
  cr_expect_eq(sl_store_open(dir, &options, &store, err, sizeof err),
               SL_ESTORE);
  free(data);
  free(other);
  free(staging);
  sl_test_remove_tree(dir);
}

/* The event-time trailers of op's instances 0..n-1 in the store of dir
 * (a read-only open), as (watermark, largest timestamp) pairs; flags[k]
 * gets each blob's flag byte. */
static void read_trailers(const char *dir, uint16_t op, int n,
                          int64_t (*event_time)[2], uint8_t *flags) {
  sl_store_options options = {.read_only = 1};
  sl_store *store;
  char err[512];
  cr_assert_eq(sl_store_open(dir, &options, &store, err, sizeof err), 0,
               "%s", err);
  for (int k = 0; k < n; k++) {
    uint8_t *blob;
    uint32_t bytes;
    cr_assert_eq(sl_store_get_blob(store, op, (uint16_t)k, (void **)&blob,
                                   &bytes), 0, "%s", sl_store_error(store));
    cr_assert_geq(bytes, 1);
    flags[k] = blob[0];
    event_time[k][0] = SL_WATERMARK_MIN;
    event_time[k][1] = SL_NO_TIMESTAMP;
    if ((blob[0] & 2) && bytes >= 17)
      memcpy(event_time[k], blob + bytes - 16, 16);
    free(blob);
  }
  sl_store_close(store);
}

Test(savepoint, a_rescaled_operator_starts_from_the_lowest_watermark) {
  fixture f;
  memset(&f, 0, sizeof f);
  f.ctl.count = 20000;
  f.ctl.keys = 100;
  f.ctl.parallelism = 2;
  f.ctl.timestamps = true;
  f.root = sl_test_temp_dir("sp");
  f.out = sl_test_temp_dir("sp");
  f.state = sl_test_path_in(f.root, "state");
  f.sp = sl_test_path_in(f.root, "savepoint");
  f.target = sl_test_path_in(f.root, "target");
  take_savepoint(&f.ctl, f.state, f.out, f.sp, 2);
  /* The count operator (id 2) saved its watermark in both instances. */
  int64_t old[2][2];
  uint8_t old_flags[2];
  read_trailers(f.sp, 2, 2, old, old_flags);
  int64_t low = old[0][0] < old[1][0] ? old[0][0] : old[1][0];
  int64_t high = old[0][1] > old[1][1] ? old[0][1] : old[1][1];
  cr_assert_eq(old_flags[0], 2, "no event time saved");
  cr_assert_neq(low, SL_WATERMARK_MIN);

  /* Start at 3 instances; the job fails at once, before any checkpoint,
   * leaving the installed store as sl_store_install made it. */
  atomic_store(&f.ctl.fail_open, 1);
  spec s = {.ctl = &f.ctl, .state_dir = f.target, .out_dir = f.out,
            .from_savepoint = f.sp, .count_parallelism = 3};
  sl_job *job = build(&s);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  cr_assert_neq(sl_job_wait(job), 0);
  sl_job_destroy(job);
  int64_t now[3][2];
  uint8_t flags[3];
  read_trailers(f.target, 2, 3, now, flags);
  for (int k = 0; k < 3; k++) {
    cr_expect_eq(flags[k], 2, "instance %d: flags %u", k, flags[k]);
    cr_expect_eq(now[k][0], low, "instance %d: watermark %" PRId64, k,
                 now[k][0]);
    cr_expect_eq(now[k][1], high);
  }
  /* The sources were not rescaled: their positions are as saved. */
  uint8_t source_flags[2];
  int64_t source_time[2][2];
  read_trailers(f.target, 0, 2, source_time, source_flags);
  cr_expect(source_flags[0] & 1);
  cr_expect(source_flags[1] & 1);
  fixture_free(&f);
}
