/* test_stop_savepoint.c — sl_job_stop_with_savepoint end to end: an
 * event-time tumbling-window job with an exactly-once file sink, stopped
 * without drain in the middle and resumed from the savepoint (or from its
 * state directory), commits exactly the output of an uninterrupted run,
 * with no late record in either run; stopped with drain, its open windows
 * fire and the savepoint holds the maximum watermark; the refusals
 * (checkpointing off, a non-empty directory) change nothing.
 *
 * Real threads, real LMDB stores and files in temporary directories; the
 * tests wait for conditions, never for time. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
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

#define WINDOW_MS 50 /* event time is the record number, in ms */

/* The source: instance s of P emits i = s, s + P, ... < count as
 * {key = i % keys, value = i} at event time i.  With pause_at_half, each
 * instance stops at half of its records until `release` is set (counted
 * in `paused`), so a stop can come at a known point; without it, the
 * stop comes while records flow.  Replayable: the position is the number
 * of records emitted.  Until `release` is set, an instance that emitted
 * all its records waits instead of ending, so a stop always finds the job
 * running, in the middle of its input or at its end. */
typedef struct control {
  uint64_t count;
  uint64_t keys;
  int parallelism;
  bool pause_at_half;
  atomic_int release;
  atomic_int paused;
  /* Per instance: the position of its newest snapshot, and the records it
   * had emitted when it closed.  After a stop without drain the two are
   * equal: the stop checkpoint's barrier was its last output. */
  _Atomic uint64_t snapshot_position[2];
  _Atomic uint64_t close_position[2];
} control;

typedef struct source_state {
  control *ctl;
  int instance;
  uint64_t emitted;
  uint64_t total;
  bool counted;
} source_state;

static int source_open(sl_ctx *ctx, void *user, void **state) {
  control *ctl = user;
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
  bool hold = s->ctl->pause_at_half && !atomic_load(&s->ctl->release);
  if (s->emitted == half && hold) {
    if (!s->counted)
      atomic_fetch_add(&s->ctl->paused, 1);
    s->counted = true;
    sl_test_sleep_us(100); /* not to spin: triggers come between calls */
    return 0;
  }
  if (s->emitted == s->total && !atomic_load(&s->ctl->release)) {
    sl_test_sleep_us(100); /* the end waits for release: a stop before */
    return 0;              /* it always finds the job running */
  }
  if (s->emitted == s->total)
    return SL_SOURCE_END;
  uint64_t stop = s->emitted < half && hold ? half : s->total;
  for (int n = 0; n < 64 && s->emitted < stop; n++) {
    uint64_t i =
        (uint64_t)s->instance + s->emitted * (uint64_t)s->ctl->parallelism;
    sl_tuple t = {.key = i % s->ctl->keys, .value = i};
    int rc = sl_emit_ts(ctx, &t, sizeof t, (int64_t)i);
    if (rc)
      return rc;
    s->emitted++;
  }
  return 0;
}

static void source_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  source_state *s = state;
  atomic_store(&s->ctl->close_position[s->instance], s->emitted);
  free(state);
}

static int source_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  source_state *s = state;
  atomic_store(&s->ctl->snapshot_position[s->instance], s->emitted);
  return sl_fixture_save_position(ctx, &s->emitted);
}

static int source_restore(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  return sl_fixture_load_position(ctx, &((source_state *)state)->emitted);
}

/* The window's count per key, emitted as {key, window start, count}. */
typedef struct window_count {
  uint64_t key;
  int64_t start;
  uint64_t count;
} window_count;

static void count_init(void *user, void *acc) {
  (void)user;
  memset(acc, 0, sizeof(uint64_t));
}

static void count_add(void *user, void *acc, const sl_record *in) {
  (void)user;
  (void)in;
  (*(uint64_t *)acc)++;
}

static int count_emit(void *user, sl_ctx *ctx, uint64_t key,
                      const sl_window *window, const void *acc) {
  (void)user;
  window_count out = {.key = key, .start = window->start};
  memcpy(&out.count, acc, sizeof out.count);
  return sl_emit(ctx, &out, sizeof out);
}

static int format_count(void *user, const sl_record *in, char *buffer,
                        uint32_t buffer_bytes) {
  (void)user;
  window_count w;
  memcpy(&w, in->data, sizeof w);
  int n = snprintf(buffer, buffer_bytes, "%" PRIu64 ",%" PRId64 ",%" PRIu64,
                   w.key, w.start, w.count);
  return (uint32_t)n < buffer_bytes ? n : n + 1;
}

typedef struct spec {
  control *ctl;
  const char *state_dir; /* NULL: checkpointing off */
  const char *out_dir;
  const char *from_savepoint;
  int policy;
} spec;

/* Operator ids: source 0, by-key 1, window 2, sink 3. */
#define WINDOW_OP 2

static sl_job *build(const spec *s) {
  sl_job_config config = sl_fixture_config(s->state_dir, 20);
  config.checkpoint.store_policy = s->policy;
  config.checkpoint.from_savepoint = s->from_savepoint;
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  static const sl_source_ops source_ops = {.open = source_open,
                                           .next = source_next,
                                           .close = source_close,
                                           .snapshot = source_snapshot,
                                           .restore = source_restore};
  sl_op *src, *by, *window, *sink;
  cr_assert_eq(sl_op_source(job, "source", s->ctl->parallelism, &source_ops,
                            s->ctl, &src), 0);
  sl_watermark_config wc = {.every_call = 1};
  cr_assert_eq(sl_op_watermarks(src, &wc), 0);
  cr_assert_eq(sl_op_key_by(job, "by-key", src, sl_fixture_tuple_key, 0, &by),
               0);
  sl_window_config w = {.type = SL_WINDOW_TUMBLING, .size = WINDOW_MS,
                        .acc_bytes = sizeof(uint64_t), .init = count_init,
                        .add = count_add, .emit = count_emit};
  cr_assert_eq(sl_op_window(job, "window", by, 2, &w, &window), 0, "%s",
               sl_job_error(job));
  sl_file_sink_config fc = {.dir = s->out_dir,
                            .exactly_once = s->state_dir != 0,
                            .format = format_count, .suffix = ".csv"};
  cr_assert_eq(sl_sink_file(job, "sink", window, 2, &fc, &sink), 0);
  return job;
}

static int wait_job(sl_job *job) {
  sl_test_watchdog w;
  sl_test_watchdog_arm(&w, job, 120, "stop-savepoint job");
  int rc = sl_job_wait(job);
  cr_assert_not(sl_test_watchdog_disarm(&w), "the job hung");
  if (rc)
    cr_log_error("job failed: %s", sl_job_error(job));
  return rc;
}

/* Late records of the window operator, and the job's status. */
static void job_facts(sl_job *job, uint64_t *late, int *status) {
  sl_metrics m;
  cr_assert_eq(sl_job_metrics(job, 0, &m), 0);
  *late = 0;
  for (int o = 0; o < m.operator_count; o++)
    *late += m.operators[o].late_records;
  *status = m.state;
  sl_metrics_free(&m);
}

/* Poll (bounded: about 60 s) until every source instance is paused. */
static void wait_paused(control *ctl) {
  for (int i = 0; i < 60000 && atomic_load(&ctl->paused) < ctl->parallelism;
       i++)
    sl_test_sleep_us(1000);
  cr_assert_eq(atomic_load(&ctl->paused), ctl->parallelism,
               "the sources did not reach their pause");
}

/* Poll (bounded) until the sources emitted at least n records. */
static void wait_progress(sl_job *job, uint64_t n) {
  for (int i = 0; i < 60000 && sl_job_progress(job) < n; i++)
    sl_test_sleep_us(1000);
  cr_assert_geq(sl_job_progress(job), n, "the sources did not get going");
}

/* ------------------------------------------------------------ output */

typedef struct lines {
  char **text;
  size_t count;
} lines;

static int compare_text(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void lines_add(lines *r, const char *text, size_t *capacity) {
  if (r->count == *capacity) {
    *capacity = *capacity ? 2 * *capacity : 1024;
    r->text = realloc(r->text, *capacity * sizeof *r->text);
    cr_assert(r->text);
  }
  r->text[r->count++] = strdup(text);
}

/* Every committed line of out_dir, sorted. */
static lines read_lines(const char *out_dir) {
  lines r = {0};
  size_t capacity = 0;
  DIR *d = opendir(out_dir);
  cr_assert(d, "opendir %s", out_dir);
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, "part-", 5) != 0)
      continue;
    char *path = sl_test_path_in(out_dir, e->d_name);
    FILE *f = fopen(path, "r");
    cr_assert(f, "open %s", path);
    char buffer[128];
    while (fgets(buffer, sizeof buffer, f))
      lines_add(&r, buffer, &capacity);
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

/* The closed form of an uninterrupted run: every window of every key
 * with its count (the last window of the input included, fired by the
 * end of input). */
static lines expected_output(const control *ctl) {
  lines r = {0};
  size_t capacity = 0;
  uint64_t windows = (ctl->count + WINDOW_MS - 1) / WINDOW_MS;
  for (uint64_t w = 0; w < windows; w++)
    for (uint64_t key = 0; key < ctl->keys; key++) {
      uint64_t n = 0, end = (w + 1) * WINDOW_MS;
      for (uint64_t i = w * WINDOW_MS; i < end && i < ctl->count; i++)
        n += i % ctl->keys == key;
      if (!n)
        continue;
      char text[96];
      snprintf(text, sizeof text, "%" PRIu64 ",%" PRIu64 ",%" PRIu64 "\n",
               key, w * WINDOW_MS, n);
      lines_add(&r, text, &capacity);
    }
  qsort(r.text, r.count, sizeof *r.text, compare_text);
  return r;
}

static void assert_same(const lines *got, const lines *want) {
  size_t i = 0;
  while (i < got->count && i < want->count &&
         strcmp(got->text[i], want->text[i]) == 0)
    i++;
  cr_assert_eq(got->count, want->count,
               "%zu lines committed, %zu expected (first difference at "
               "%zu: %s vs %s)",
               got->count, want->count, i,
               i < got->count ? got->text[i] : "(none)",
               i < want->count ? want->text[i] : "(none)");
  cr_assert_eq(i, want->count, "line %zu: %s, expected %s", i, got->text[i],
               want->text[i]);
}

typedef struct fixture {
  control ctl;
  char *root;
  char *state;
  char *out;
  char *sp;
} fixture;

static void fixture_make(fixture *f, bool pause_at_half) {
  memset(f, 0, sizeof *f);
  f->ctl.count = sl_test_scaled(40000, 4000);
  f->ctl.keys = 7;
  f->ctl.parallelism = 2;
  f->ctl.pause_at_half = pause_at_half;
  f->root = sl_test_temp_dir("stop");
  f->state = sl_test_path_in(f->root, "state");
  f->out = sl_test_path_in(f->root, "out");
  f->sp = sl_test_path_in(f->root, "savepoint");
  cr_assert_eq(mkdir(f->out, 0700), 0);
}

static void fixture_free(fixture *f) {
  free(f->state);
  free(f->out);
  free(f->sp);
  sl_test_remove_tree(f->root);
}

/* Run 1: start, reach the stop point, stop with flags into sp (NULL: no
 * copy).  Returns the stop checkpoint's id. */
static uint64_t run_and_stop(fixture *f, const char *sp, int flags) {
  spec s = {.ctl = &f->ctl, .state_dir = f->state, .out_dir = f->out};
  sl_job *job = build(&s);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  if (f->ctl.pause_at_half)
    wait_paused(&f->ctl);
  else
    wait_progress(job, f->ctl.count / 3);
  uint64_t id = 0;
  char err[512];
  int rc = sl_job_stop_with_savepoint(job, sp, flags, &id, err, sizeof err);
  cr_assert_eq(rc, 0, "stop: %s (%s)", sl_strerror(rc), err);
  cr_assert_gt(id, 0);
  cr_assert_eq(wait_job(job), 0, "a stop with a savepoint returns 0");
  uint64_t late;
  int status;
  job_facts(job, &late, &status);
  cr_assert_eq(status, SL_JOB_STATUS_FINISHED, "status %s",
               sl_job_status_name(status));
  cr_assert_eq(late, 0, "%" PRIu64 " late records before the stop", late);
  cr_assert_eq(sl_job_last_checkpoint(job, 0), id,
               "nothing completes after the stop checkpoint");
  uint64_t saved_total = 0;
  for (int k = 0; k < f->ctl.parallelism; k++) {
    uint64_t saved = atomic_load(&f->ctl.snapshot_position[k]);
    uint64_t closed = atomic_load(&f->ctl.close_position[k]);
    cr_assert_eq(closed, saved, "source %d emitted %" PRIu64 " records, its "
                 "stop snapshot holds %" PRIu64, k, closed, saved);
    saved_total += saved;
  }
  /* The stop came after what the test waited for (run_and_stop). */
  cr_assert_geq(saved_total, f->ctl.count / 3, "%" PRIu64, saved_total);
  sl_job_destroy(job);
  return id;
}

/* Run 2: from the savepoint (sp) or the state directory (sp NULL), to the
 * end of input. */
static void resume_to_end(fixture *f, const char *sp, uint64_t stop_id) {
  atomic_store(&f->ctl.release, 1);
  char *fresh = sl_test_path_in(f->root, "state2");
  spec s = {.ctl = &f->ctl, .out_dir = f->out, .from_savepoint = sp,
            .state_dir = sp ? fresh : f->state,
            .policy = sp ? 0 : SL_STORE_RESUME};
  sl_job *job = build(&s);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  uint64_t restored = 0;
  (void)sl_job_last_checkpoint(job, &restored);
  cr_assert_eq(restored, stop_id, "resumed from %" PRIu64 ", not %" PRIu64,
               restored, stop_id);
  cr_assert_eq(wait_job(job), 0);
  uint64_t late;
  int status;
  job_facts(job, &late, &status);
  cr_assert_eq(late, 0, "%" PRIu64 " late records after the resume", late);
  sl_job_destroy(job);
  free(fresh);
}

/* The union of both runs' committed output is the closed form. */
static void assert_exactly_once(fixture *f) {
  lines got = read_lines(f->out), want = expected_output(&f->ctl);
  assert_same(&got, &want);
  lines_free(&got);
  lines_free(&want);
}

TestSuite(stop_savepoint, .timeout = 240);

/* The lowest watermark saved by the window operator's instances in the
 * store at dir (a read-only open of the blobs' event-time trailers, as
 * test_savepoint.c reads them). */
static int64_t saved_window_watermark(const char *dir) {
  sl_store_options options = {.read_only = 1};
  sl_store *store;
  char err[512];
  cr_assert_eq(sl_store_open(dir, &options, &store, err, sizeof err), 0,
               "%s", err);
  int64_t low = SL_WATERMARK_MAX;
  for (uint16_t k = 0; k < 2; k++) {
    uint8_t *blob;
    uint32_t bytes;
    cr_assert_eq(sl_store_get_blob(store, WINDOW_OP, k, (void **)&blob,
                                   &bytes), 0, "%s", sl_store_error(store));
    cr_assert((blob[0] & 2) && bytes >= 17, "no event time saved");
    int64_t event_time[2];
    memcpy(event_time, blob + bytes - 16, sizeof event_time);
    if (event_time[0] < low)
      low = event_time[0];
    free(blob);
  }
  sl_store_close(store);
  return low;
}

static bool exists(const char *dir, const char *name) {
  char *path = sl_test_path_in(dir, name);
  struct stat st;
  bool found = stat(path, &st) == 0;
  free(path);
  return found;
}

Test(stop_savepoint, no_drain_resumed_from_the_savepoint_is_exactly_once) {
  fixture f;
  fixture_make(&f, true);
  uint64_t id = run_and_stop(&f, f.sp, 0);
  cr_assert(exists(f.sp, "manifest.json"), "no savepoint in %s", f.sp);
  /* The stop fired nothing: the window saved the records' watermark (the
   * sources paused halfway), not the maximum. */
  int64_t watermark = saved_window_watermark(f.sp);
  cr_assert_lt(watermark, (int64_t)f.ctl.count / 2, "watermark %" PRId64,
               watermark);
  cr_assert_gt(watermark, SL_WATERMARK_MIN);
  resume_to_end(&f, f.sp, id);
  assert_exactly_once(&f);
  fixture_free(&f);
}

Test(stop_savepoint, no_drain_while_records_flow_resumed_from_state_dir) {
  fixture f;
  fixture_make(&f, false);
  uint64_t id = run_and_stop(&f, 0, 0);
  resume_to_end(&f, 0, id);
  assert_exactly_once(&f);
  fixture_free(&f);
}

Test(stop_savepoint, no_drain_while_records_flow_resumed_from_the_savepoint) {
  fixture f;
  fixture_make(&f, false);
  uint64_t id = run_and_stop(&f, f.sp, 0);
  resume_to_end(&f, f.sp, id);
  assert_exactly_once(&f);
  fixture_free(&f);
}

Test(stop_savepoint, drain_fires_the_open_windows_and_saves_the_max_watermark) {
  fixture f;
  fixture_make(&f, true);
  spec s = {.ctl = &f.ctl, .state_dir = f.state, .out_dir = f.out};
  sl_job *job = build(&s);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  wait_paused(&f.ctl);
  uint64_t id = 0;
  char err[512];
  int rc = sl_job_stop_with_savepoint(job, f.sp, SL_STOP_DRAIN, &id, err,
                                      sizeof err);
  cr_assert_eq(rc, 0, "stop --drain: %s (%s)", sl_strerror(rc), err);
  cr_assert_eq(wait_job(job), 0);
  sl_checkpoint_stats cs;
  cr_assert_eq(sl_job_checkpoint_stats(job, 0, &cs), 0);
  cr_assert(cs.final && cs.id == id, "the savepoint is the final checkpoint");
  sl_job_destroy(job);
  cr_assert_eq(saved_window_watermark(f.sp), SL_WATERMARK_MAX);
  /* Every window of the first half fired, the last one (cut by the
   * drain) too: the output is the closed form of the records emitted,
   * instance 0's first h0 and instance 1's first h1 records. */
  uint64_t h0 = ((f.ctl.count + 1) / 2) / 2, h1 = (f.ctl.count / 2) / 2;
  lines got = read_lines(f.out);
  uint64_t total = 0;
  for (size_t i = 0; i < got.count; i++) {
    uint64_t key, n;
    int64_t start;
    cr_assert_eq(sscanf(got.text[i], "%" SCNu64 ",%" SCNd64 ",%" SCNu64,
                        &key, &start, &n), 3);
    total += n;
  }
  cr_assert_eq(total, h0 + h1, "%" PRIu64 " records counted, %" PRIu64
               " emitted", total, h0 + h1);
  lines_free(&got);
  fixture_free(&f);
}

Test(stop_savepoint, checkpointing_off_is_a_usage_error) {
  fixture f;
  fixture_make(&f, true);
  atomic_store(&f.ctl.release, 1);
  spec s = {.ctl = &f.ctl, .out_dir = f.out};
  sl_job *job = build(&s);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  char err[256];
  cr_assert_eq(sl_job_stop_with_savepoint(job, f.sp, 0, 0, err, sizeof err),
               SL_EUSAGE);
  cr_assert(strstr(err, "checkpointing is off"), "%s", err);
  cr_assert_eq(wait_job(job), 0, "the job ran to its end");
  sl_job_destroy(job);
  fixture_free(&f);
}

Test(stop_savepoint, a_non_empty_directory_is_refused_and_the_job_goes_on) {
  fixture f;
  fixture_make(&f, true);
  cr_assert_eq(mkdir(f.sp, 0700), 0);
  char *stray = sl_test_path_in(f.sp, "stray");
  FILE *file = fopen(stray, "w");
  cr_assert(file);
  fclose(file);
  spec s = {.ctl = &f.ctl, .state_dir = f.state, .out_dir = f.out};
  sl_job *job = build(&s);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  wait_paused(&f.ctl);
  char err[512];
  cr_assert_eq(sl_job_stop_with_savepoint(job, f.sp, 0, 0, err, sizeof err),
               EEXIST);
  cr_assert(strstr(err, f.sp) && strstr(err, "not empty"), "%s", err);
  /* The job goes on: released, it runs to its end with every window. */
  atomic_store(&f.ctl.release, 1);
  cr_assert_eq(wait_job(job), 0);
  sl_job_destroy(job);
  assert_exactly_once(&f);
  cr_assert_eq(sl_job_stop_with_savepoint(0, 0, 0, 0, 0, 0), EINVAL);
  free(stray);
  fixture_free(&f);
}

/* A push source: the stop holds it like any source, and pushers then get
 * SL_ESTOPPED (nothing will take their records). */
/* A push source (capacity records of queue, 0: default) into one sink
 * instance calling process, checkpointed into state every 20 ms. */
static sl_job *push_job(const char *state, uint32_t capacity,
                        int (*process)(sl_ctx *, void *, int,
                                       const sl_record *),
                        sl_push **push) {
  sl_job_config config = sl_fixture_config(state, 20);
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  sl_op *src, *sink;
  cr_assert_eq(sl_source_push(job, "push", capacity, &src, push), 0);
  sl_process_ops ops = {.process = process};
  cr_assert_eq(sl_op_sink(job, "sink", src, 1, &ops, 0, &sink), 0);
  return job;
}

static atomic_uint_fast64_t pushed_seen;

static int count_seen(sl_ctx *ctx, void *state, int input,
                      const sl_record *in) {
  (void)ctx, (void)state, (void)input, (void)in;
  atomic_fetch_add(&pushed_seen, 1);
  return 0;
}

Test(stop_savepoint, a_push_source_stops_and_its_pushers_get_estopped) {
  char *root = sl_test_temp_dir("stop");
  char *state = sl_test_path_in(root, "state");
  char *sp = sl_test_path_in(root, "sp");
  sl_push *push;
  sl_job *job = push_job(state, 0, count_seen, &push);
  atomic_store(&pushed_seen, 0);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  for (uint64_t i = 0; i < 1000; i++)
    cr_assert_eq(sl_push_record(push, &i, sizeof i, SL_NO_TIMESTAMP), 0);
  for (int i = 0; i < 60000 && atomic_load(&pushed_seen) < 1000; i++)
    sl_test_sleep_us(1000);
  cr_assert_eq(atomic_load(&pushed_seen), 1000);
  uint64_t id = 0;
  char err[512];
  cr_assert_eq(sl_job_stop_with_savepoint(job, sp, 0, &id, err, sizeof err),
               0, "%s", err);
  uint64_t more = 7;
  cr_assert_eq(sl_push_record(push, &more, sizeof more, SL_NO_TIMESTAMP),
               SL_ESTOPPED);
  cr_assert_eq(wait_job(job), 0);
  cr_assert_eq(atomic_load(&pushed_seen), 1000, "nothing after the stop");
  cr_assert_eq(sl_job_stop_with_savepoint(job, 0, 0, 0, err, sizeof err),
               SL_ESTOPPED, "a job stopped once stays stopped");
  sl_job_destroy(job);
  free(sp);
  free(state);
  sl_test_remove_tree(root);
}

/* A stop with drain ends a push source without another next(): a pusher
 * blocked on the full queue gets SL_ESTOPPED, and sl_push_fd becomes
 * readable, at once: before sl_push_close and sl_job_wait (a host that
 * stops, joins its pushers, then waits must not deadlock).  The sink
 * holds every record until `gate` opens, so the queue stays full. */
static atomic_int gate;

static int gated_sink(sl_ctx *ctx, void *state, int input,
                      const sl_record *in) {
  (void)ctx, (void)state, (void)input, (void)in;
  /* Bounded: the test opens the gate (60 s at most). */
  for (int i = 0; i < 600000 && !atomic_load(&gate); i++)
    sl_test_sleep_us(100);
  return 0;
}

/* Pushes (blocking) until a push fails: the rings and the queue fill
 * behind the gated sink, so the loop ends only when the job refuses.
 * Blocking pushes never arm the fd: only the job's end makes it
 * readable. */
typedef struct blocked_pusher {
  sl_push *push;
  atomic_int rc;
  atomic_int done;
  atomic_uint_fast64_t pushed;
} blocked_pusher;

static void *blocked_pusher_main(void *arg) {
  blocked_pusher *b = arg;
  int rc = 0;
  for (uint64_t i = 0; i < (1u << 26) && rc == 0; i++) {
    rc = sl_push_record(b->push, &i, sizeof i, SL_NO_TIMESTAMP);
    if (rc == 0)
      atomic_fetch_add(&b->pushed, 1);
  }
  atomic_store(&b->rc, rc);
  atomic_store(&b->done, 1);
  return 0;
}

typedef struct drain_stopper {
  sl_job *job;
  const char *dir;
  int rc;
  char err[512];
} drain_stopper;

static void *drain_stopper_main(void *arg) {
  drain_stopper *d = arg;
  d->rc = sl_job_stop_with_savepoint(d->job, d->dir, SL_STOP_DRAIN, 0,
                                     d->err, sizeof d->err);
  return 0;
}

Test(stop_savepoint, drain_wakes_a_blocked_pusher_and_the_push_fd) {
  char *root = sl_test_temp_dir("stopdrain");
  char *state = sl_test_path_in(root, "state");
  char *sp = sl_test_path_in(root, "sp");
  sl_push *push;
  sl_job *job = push_job(state, 16, gated_sink, &push);
  atomic_store(&gate, 0);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  int fd = sl_push_fd(push);
  cr_assert_geq(fd, 0);
  blocked_pusher b = {.push = push};
  pthread_t pusher, stopper;
  cr_assert_eq(pthread_create(&pusher, 0, blocked_pusher_main, &b), 0);
  /* Two queues' worth pushed: the pusher is about to block, if not
   * already (either way only the drain can end its loop). */
  for (int i = 0; i < 600000 && atomic_load(&b.pushed) < 32; i++)
    sl_test_sleep_us(100);
  cr_assert_geq(atomic_load(&b.pushed), 32);
  drain_stopper d = {.job = job, .dir = sp};
  cr_assert_eq(pthread_create(&stopper, 0, drain_stopper_main, &d), 0);
  /* The gate is still closed: only the drain can end these waits. */
  struct pollfd pfd = {.fd = fd, .events = POLLIN};
  cr_assert_eq(poll(&pfd, 1, 60000), 1, "the drain makes the fd readable");
  for (int i = 0; i < 600000 && !atomic_load(&b.done); i++)
    sl_test_sleep_us(100);
  cr_assert(atomic_load(&b.done), "the blocked pusher returns on a drain");
  cr_assert_eq(atomic_load(&b.rc), SL_ESTOPPED);
  uint64_t more = 2;
  cr_assert_eq(sl_push_try_record(push, &more, sizeof more, SL_NO_TIMESTAMP),
               SL_ESTOPPED);
  atomic_store(&gate, 1);
  pthread_join(pusher, 0);
  pthread_join(stopper, 0);
  cr_assert_eq(d.rc, 0, "%s", d.err);
  cr_assert_eq(wait_job(job), 0);
  sl_job_destroy(job);
  free(sp);
  free(state);
  sl_test_remove_tree(root);
}

/* A stop while a failover's restart is pending is refused with EBUSY (try
 * again once the job runs), not SL_ESTOPPED: the job has not ended.  The
 * sink fails on its first record; the restart waits 60 s, far longer
 * than the test, which ends by sl_job_stop (that cuts the wait short). */
static int failing_sink(sl_ctx *ctx, void *state, int input,
                        const sl_record *in) {
  (void)ctx, (void)state, (void)input, (void)in;
  return SL_ECALLBACK;
}

Test(stop_savepoint, a_stop_during_a_pending_restart_is_busy) {
  char *root = sl_test_temp_dir("stoprestart");
  char *state = sl_test_path_in(root, "state");
  sl_job_config config = sl_fixture_config(state, 20);
  config.restart = sl_restart_defaults(SL_RESTART_FIXED_DELAY);
  config.restart.delay_ms = 60000;
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  sl_op *src, *sink;
  sl_push *push;
  cr_assert_eq(sl_source_push(job, "push", 0, &src, &push), 0);
  static const sl_process_ops ops = {.process = failing_sink};
  cr_assert_eq(sl_op_sink(job, "sink", src, 1, &ops, 0, &sink), 0);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  uint64_t one = 1;
  cr_assert_eq(sl_push_record(push, &one, sizeof one, SL_NO_TIMESTAMP), 0);
  /* The supervisor records the failover once the attempt's threads are
   * joined, before its delay: the restart is then pending. */
  sl_recovery_stats r;
  int rc = EINVAL;
  for (int i = 0; i < 600000 && rc; i++) {
    rc = sl_job_recovery_stats(job, 0, &r);
    if (rc)
      sl_test_sleep_us(100);
  }
  cr_assert_eq(rc, 0, "the failure is recorded");
  char err[512];
  cr_assert_eq(sl_job_stop_with_savepoint(job, 0, 0, 0, err, sizeof err),
               EBUSY, "a pending restart: EBUSY (got: %s)", err);
  cr_assert(strstr(err, "restart"), "%s", err);
  sl_job_stop(job); /* ends the restart's wait at once */
  cr_assert_eq(sl_job_wait(job), SL_ECALLBACK, "stopped while failing");
  cr_assert_eq(sl_job_stop_with_savepoint(job, 0, 0, 0, err, sizeof err),
               SL_ESTOPPED, "over: %s", err);
  sl_job_destroy(job);
  free(state);
  sl_test_remove_tree(root);
}
