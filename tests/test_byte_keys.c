/* test_byte_keys.c — byte-string keys (sl_op_key_by_bytes) end to end:
 * string user ids counted in value and map state equal a reference; a
 * constant key hash (every key collides: sl_testing_set_key_hash) keeps
 * the users apart in value state, map state, timers and a tumbling
 * window, whose callbacks see the right key bytes; the state survives a
 * resume from the state directory (real LMDB) and a rescale through a
 * savepoint (1 -> 2); the empty key and a 10 KiB key are keys like any
 * other; a failing key function, a key over the maximum and mixed key
 * kinds fail with the operator named; a 64-bit key reads as 8 bytes.
 *
 * Real threads, real LMDB stores in temporary directories. */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sluice_testing.h"
#include "test_dirs.h"
#include "test_util.h"

/* ------------------------------------------------------------ the input */

/* Event i: user (i * 7 + i / 5) % users, named "user-U" except user 0,
 * whose name is empty (the empty key); timestamp i. */
#define NAME_BYTES 24u
#define BUCKET_MS 100 /* timers fire at the end of each bucket of event time */
#define LONG_KEY_BYTES 10240u

typedef struct event {
  char user[NAME_BYTES]; /* NUL-padded; "" for user 0 */
  uint64_t seq;
} event;

static uint32_t user_of(uint64_t i, uint32_t users) {
  return (uint32_t)((i * 7 + i / 5) % users);
}

static void name_user(uint32_t u, char out[NAME_BYTES]) {
  memset(out, 0, NAME_BYTES);
  if (u != 0)
    snprintf(out, NAME_BYTES, "user-%" PRIu32, u);
}

/* ------------------------------------------------------------ keys */

typedef struct key_mode {
  uint32_t long_bytes; /* 0: the key is the name; else the name padded to
                          this many bytes */
  uint32_t fail_user; /* 0: none; else the key function fails for it */
  uint32_t huge_user; /* 0: none; else its key is SL_KEY_MAX_BYTES + 1 */
} key_mode;

static _Thread_local uint8_t key_scratch[SL_KEY_MAX_BYTES + 1];

/* A long key of `bytes` bytes: the name, a 0xFF byte, then filler that
 * depends on the name's length (so a truncated or mixed-up key shows). */
static uint32_t build_long_key(const char *name, uint8_t *out,
                               uint32_t bytes) {
  size_t n = strnlen(name, NAME_BYTES);
  memcpy(out, name, n);
  out[n] = 0xFF;
  for (uint32_t i = (uint32_t)n + 1; i < bytes; i++)
    out[i] = (uint8_t)('a' + (i + n) % 26);
  return bytes;
}

static int event_key(void *user, const sl_record *in, const void **key,
                     uint32_t *key_bytes) {
  const key_mode *mode = user;
  const event *e = in->data;
  char bad[NAME_BYTES];
  if (mode && mode->fail_user) {
    name_user(mode->fail_user, bad);
    if (memcmp(bad, e->user, NAME_BYTES) == 0)
      return -EIO;
  }
  if (mode && mode->huge_user) {
    name_user(mode->huge_user, bad);
    if (memcmp(bad, e->user, NAME_BYTES) == 0) {
      *key = key_scratch;
      *key_bytes = SL_KEY_MAX_BYTES + 1;
      return 0;
    }
  }
  if (mode && mode->long_bytes) {
    *key_bytes = build_long_key(e->user, key_scratch, mode->long_bytes);
    *key = key_scratch;
    return 0;
  }
  *key = e->user;
  *key_bytes = (uint32_t)strnlen(e->user, NAME_BYTES);
  return 0;
}

static uint64_t constant_hash(const void *key, uint32_t key_bytes) {
  (void)key;
  (void)key_bytes;
  return 42;
}

/* The name a key's bytes stand for (checking a long key's filler): 0 and
 * the name in out, or -EBADMSG for bytes no event key can have. */
static int key_name(const void *key, uint32_t key_bytes, uint32_t long_bytes,
                    char out[NAME_BYTES]) {
  memset(out, 0, NAME_BYTES);
  if (!long_bytes) {
    if (key_bytes >= NAME_BYTES)
      return -EBADMSG;
    memcpy(out, key, key_bytes);
    return 0;
  }
  const uint8_t *k = key;
  const uint8_t *mark = memchr(k, 0xFF, key_bytes < NAME_BYTES ? key_bytes
                                                               : NAME_BYTES);
  if (key_bytes != long_bytes || !mark)
    return -EBADMSG;
  memcpy(out, k, (size_t)(mark - k));
  static _Thread_local uint8_t expect[LONG_KEY_BYTES];
  if (long_bytes > LONG_KEY_BYTES)
    return -EBADMSG;
  build_long_key(out, expect, long_bytes);
  return memcmp(expect, k, long_bytes) == 0 ? 0 : -EBADMSG;
}

/* ------------------------------------------------------------ outputs */

enum { OUT_COUNT = 1, OUT_TIMER = 2, OUT_WINDOW = 3 };

/* What the keyed operators emit: for OUT_COUNT the user's value-state and
 * map-state counts after a record, for OUT_TIMER a bucket's count when its
 * timer fires, for OUT_WINDOW a window's start and count. */
typedef struct output {
  uint32_t kind;
  uint32_t pad;
  char user[NAME_BYTES];
  uint64_t a, b;
} output;

typedef struct control {
  uint64_t count;     /* events */
  uint32_t users;
  uint64_t pause_at;  /* the source waits here until release (0: never) */
  atomic_int release;
  atomic_int paused;
  key_mode mode;
  uint64_t (*hash)(const void *, uint32_t); /* NULL: XXH3 */
} control;

/* ------------------------------------------------------------ the source */

typedef struct source_state {
  control *ctl;
  uint64_t next; /* the next event: the checkpointed position */
  bool counted;
} source_state;

static int source_open(sl_ctx *ctx, void *user, void **state) {
  (void)ctx;
  source_state *s = calloc(1, sizeof *s);
  if (!s)
    return -ENOMEM;
  s->ctl = user;
  *state = s;
  return 0;
}

static int source_next(sl_ctx *ctx, void *state) {
  source_state *s = state;
  control *c = s->ctl;
  if (c->pause_at && s->next == c->pause_at && !atomic_load(&c->release)) {
    if (!s->counted)
      atomic_fetch_add(&c->paused, 1);
    s->counted = true;
    sl_test_sleep_us(200); /* checkpoints are triggered between calls */
    return 0;
  }
  if (s->next == c->count)
    return SL_SOURCE_END;
  uint64_t stop = c->pause_at && s->next < c->pause_at ? c->pause_at
                                                       : c->count;
  for (int n = 0; n < 64 && s->next < stop; n++, s->next++) {
    event e = {.seq = s->next};
    name_user(user_of(s->next, c->users), e.user);
    int rc = sl_emit_ts(ctx, &e, sizeof e, (int64_t)s->next);
    if (rc)
      return rc;
  }
  return 0;
}

static void source_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  free(state);
}

static int source_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  return sl_fixture_save_position(ctx, &((source_state *)state)->next);
}

static int source_restore(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  return sl_fixture_load_position(ctx, &((source_state *)state)->next);
}

/* ------------------------------------------------------------ keyed ops */

/* The current key's name, checked against the record's when there is one:
 * 0, or -EBADMSG (the key bytes are not this record's user). */
static int current_name(sl_ctx *ctx, const control *c, const sl_record *in,
                        char out[NAME_BYTES]) {
  const void *key;
  uint32_t key_bytes;
  int rc = sl_ctx_key_bytes(ctx, &key, &key_bytes);
  if (rc == 0)
    rc = key_name(key, key_bytes, c->mode.long_bytes, out);
  if (rc == 0 && in && memcmp(out, ((const event *)in->data)->user,
                              NAME_BYTES) != 0)
    rc = -EBADMSG;
  if (rc)
    sl_ctx_fail(ctx, "the key bytes are not the record's user");
  return rc;
}

/* Count the user in value state 0 and in map state 1 (user key "n"), keep
 * the count of its bucket in map state 2 (user key: the bucket), and set
 * an event-time timer at the bucket's end. */
static int count_process(sl_ctx *ctx, void *state, int input,
                         const sl_record *in) {
  (void)input;
  const control *c = state;
  output o = {.kind = OUT_COUNT};
  int rc = current_name(ctx, c, in, o.user);
  uint64_t *value;
  if (rc == 0)
    rc = sl_state_update(ctx, 0, 8, 0, (void **)&value);
  if (rc)
    return rc;
  o.a = ++*value;
  uint64_t n = 0, bucket = (uint64_t)in->timestamp / BUCKET_MS;
  const void *v;
  uint32_t bytes;
  if (sl_mapstate_get(ctx, 1, "n", 1, &v, &bytes) == 0)
    memcpy(&n, v, 8);
  o.b = ++n;
  rc = sl_mapstate_put(ctx, 1, "n", 1, &n, 8);
  n = 0;
  if (rc == 0 && sl_mapstate_get(ctx, 2, &bucket, 8, &v, &bytes) == 0)
    memcpy(&n, v, 8);
  n++;
  if (rc == 0)
    rc = sl_mapstate_put(ctx, 2, &bucket, 8, &n, 8);
  if (rc == 0)
    rc = sl_timer_register(ctx, SL_EVENT_TIME,
                           (int64_t)(bucket * BUCKET_MS + BUCKET_MS - 1));
  return rc ? rc : sl_emit(ctx, &o, sizeof o);
}

static int count_timer(sl_ctx *ctx, void *state, int domain, int64_t time) {
  (void)domain;
  const control *c = state;
  output o = {.kind = OUT_TIMER, .a = (uint64_t)time / BUCKET_MS};
  int rc = current_name(ctx, c, 0, o.user);
  const void *v;
  uint32_t bytes;
  if (rc == 0)
    rc = sl_mapstate_get(ctx, 2, &o.a, 8, &v, &bytes);
  if (rc)
    return rc;
  memcpy(&o.b, v, 8);
  return sl_emit(ctx, &o, sizeof o);
}

static int count_open(sl_ctx *ctx, void *user, void **state) {
  (void)ctx;
  *state = user; /* the control */
  return 0;
}

static void window_init(void *user, void *acc) {
  (void)user;
  memset(acc, 0, 8);
}

static void window_add(void *user, void *acc, const sl_record *in) {
  (void)user;
  (void)in;
  ++*(uint64_t *)acc;
}

static int window_emit(void *user, sl_ctx *ctx, uint64_t key,
                       const sl_window *window, const void *acc) {
  const control *c = user;
  output o = {.kind = OUT_WINDOW, .a = (uint64_t)window->start};
  uint64_t hash;
  int rc = current_name(ctx, c, 0, o.user);
  if (rc == 0)
    rc = sl_ctx_key(ctx, &hash);
  if (rc == 0 && hash != key) /* sl_ctx_key gives the hash on bytes */
    rc = -EBADMSG;
  if (rc)
    return rc;
  memcpy(&o.b, acc, 8);
  return sl_emit(ctx, &o, sizeof o);
}

/* ------------------------------------------------------------ the job */

typedef struct spec {
  control *ctl;
  const char *state_dir;      /* NULL: no checkpoints */
  const char *from_savepoint;
  int policy;
  int parallelism;            /* of the keyed operators */
  bool window;                /* a tumbling window instead of the counter */
  sl_fixture_collector *out;
} spec;

static sl_job *build(const spec *s) {
  sl_job_config config = SL_JOB_CONFIG_INIT;
  if (s->state_dir) {
    config = sl_fixture_config(s->state_dir, 3600000); /* triggered only */
    config.checkpoint.store_policy = s->policy;
    config.checkpoint.from_savepoint = s->from_savepoint;
  }
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  if (s->ctl->hash)
    cr_assert_eq(sl_testing_set_key_hash(job, s->ctl->hash), 0);
  static const sl_source_ops source_ops = {
      .open = source_open, .next = source_next, .close = source_close,
      .snapshot = source_snapshot, .restore = source_restore};
  sl_op *src, *by, *keyed, *sink;
  cr_assert_eq(sl_op_source(job, "events", 1, &source_ops, s->ctl, &src), 0);
  sl_watermark_config wc = {.every_call = 1};
  cr_assert_eq(sl_op_watermarks(src, &wc), 0);
  cr_assert_eq(sl_op_key_by_bytes(job, "by-user", src, event_key,
                                  &s->ctl->mode, &by), 0);
  int p = s->parallelism ? s->parallelism : 1;
  if (s->window) {
    sl_window_config w = {.type = SL_WINDOW_TUMBLING, .size = BUCKET_MS,
                          .acc_bytes = 8, .init = window_init,
                          .add = window_add, .emit = window_emit,
                          .user = s->ctl};
    cr_assert_eq(sl_op_window(job, "window", by, p, &w, &keyed), 0, "%s",
                 sl_job_error(job));
  } else {
    static const sl_process_ops count_ops = {
        .open = count_open, .process = count_process, .on_timer = count_timer};
    cr_assert_eq(sl_op_process(job, "count", &by, 1, p, &count_ops, s->ctl,
                               &keyed), 0);
  }
  s->out->record_bytes = sizeof(output);
  cr_assert_eq(sl_op_sink(job, "collect", keyed, 1, &sl_fixture_collector_ops,
                          s->out, &sink), 0);
  return job;
}

static int wait_job(sl_job *job) {
  sl_test_watchdog w;
  sl_test_watchdog_arm(&w, job, 120, "byte-key job");
  int rc = sl_job_wait(job);
  cr_assert_not(sl_test_watchdog_disarm(&w), "the job hung");
  return rc;
}

static void wait_paused(control *c) {
  for (int i = 0; i < 60000 && atomic_load(&c->paused) < 1; i++)
    sl_test_sleep_us(1000);
  cr_assert_eq(atomic_load(&c->paused), 1, "the source did not pause");
}

static uint64_t checkpoint_now(sl_job *job) {
  uint64_t id = 0;
  int rc = EBUSY;
  for (int i = 0; i < 1000 && rc == EBUSY; i++)
    rc = sl_job_trigger_checkpoint(job, &id);
  cr_assert_eq(rc, 0, "trigger: %s", sl_strerror(rc));
  for (int i = 0; i < 60000 && sl_job_last_checkpoint(job, 0) < id; i++)
    sl_test_sleep_us(1000);
  cr_assert_geq(sl_job_last_checkpoint(job, 0), id);
  return id;
}

/* ------------------------------------------------------------ checking */

static int by_output(const void *x, const void *y) {
  const output *a = x, *b = y;
  if (a->kind != b->kind)
    return a->kind < b->kind ? -1 : 1;
  int c = memcmp(a->user, b->user, NAME_BYTES);
  if (c)
    return c;
  if (a->a != b->a)
    return a->a < b->a ? -1 : 1;
  return (a->b > b->b) - (a->b < b->b);
}

/* The reference: what an uninterrupted run emits, sorted like by_output.
 * With window, one OUT_WINDOW per (user, bucket); else OUT_COUNT for every
 * event and OUT_TIMER per (user, bucket). */
static output *reference(const control *c, bool window, uint64_t *n) {
  uint64_t users = c->users, buckets = c->count / BUCKET_MS + 1;
  uint64_t *per = calloc(users * buckets, 8), *seen = calloc(users, 8);
  output *out = calloc(c->count * 2 + 1, sizeof *out);
  cr_assert(per && seen && out);
  uint64_t k = 0;
  for (uint64_t i = 0; i < c->count; i++) {
    uint32_t u = user_of(i, c->users);
    per[u * buckets + i / BUCKET_MS]++;
    seen[u]++;
    if (!window) {
      out[k] = (output){.kind = OUT_COUNT, .a = seen[u], .b = seen[u]};
      name_user(u, out[k++].user);
    }
  }
  for (uint64_t u = 0; u < users; u++)
    for (uint64_t b = 0; b < buckets; b++)
      if (per[u * buckets + b]) {
        out[k] = (output){.kind = window ? OUT_WINDOW : OUT_TIMER,
                          .a = window ? b * BUCKET_MS : b,
                          .b = per[u * buckets + b]};
        name_user((uint32_t)u, out[k++].user);
      }
  free(per);
  free(seen);
  qsort(out, k, sizeof *out, by_output);
  *n = k;
  return out;
}

/* The collected outputs equal the reference, record for record. */
static void expect_reference(sl_fixture_collector *got, const control *c,
                             bool window) {
  uint64_t n = 0, want_n = 0;
  output *all = sl_fixture_collector_gather(got, by_output, &n);
  output *want = reference(c, window, &want_n);
  cr_assert(all);
  cr_expect_eq(n, want_n, "%" PRIu64 " outputs, expected %" PRIu64, n,
               want_n);
  uint64_t bad = 0;
  for (uint64_t i = 0; i < n && i < want_n; i++)
    if (by_output(&all[i], &want[i]) != 0 && bad++ < 5)
      cr_log_error("output %" PRIu64 ": kind %u '%s' %" PRIu64 " %" PRIu64
                   ", expected kind %u '%s' %" PRIu64 " %" PRIu64, i,
                   all[i].kind, all[i].user, all[i].a, all[i].b, want[i].kind,
                   want[i].user, want[i].a, want[i].b);
  cr_expect_eq(bad, 0, "%" PRIu64 " outputs differ from the reference", bad);
  free(all);
  free(want);
}

static void run_whole(control *c, bool window) {
  sl_fixture_collector out = {0};
  spec s = {.ctl = c, .window = window, .out = &out};
  sl_job *job = build(&s);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  cr_assert_eq(wait_job(job), 0, "%s", sl_job_error(job));
  sl_job_destroy(job);
  expect_reference(&out, c, window);
}

/* ------------------------------------------------------------ tests */

Test(byte_keys, string_ids_count_like_the_reference) {
  control c = {.count = sl_test_scaled(20000, 2000), .users = 97};
  run_whole(&c, false);
}

Test(byte_keys, colliding_hashes_keep_users_apart) {
  /* Every key hashes to 42: one key group, one instance, and value, map
   * and timer state of 31 users in one map.  Merged users would show as
   * counts above the reference. */
  control c = {.count = sl_test_scaled(20000, 2000), .users = 31,
               .hash = constant_hash};
  run_whole(&c, false);
}

Test(byte_keys, colliding_hashes_keep_windows_apart) {
  control c = {.count = sl_test_scaled(20000, 2000), .users = 31,
               .hash = constant_hash};
  run_whole(&c, true);
}

Test(byte_keys, long_keys_and_the_empty_key) {
  /* User 0's key is empty; with long_keys every key is 10 KiB, and the
   * callbacks check each byte of the key they see. */
  control c = {.count = sl_test_scaled(5000, 1000), .users = 13,
               .mode = {.long_bytes = LONG_KEY_BYTES}, .hash = constant_hash};
  run_whole(&c, false);
  control w = {.count = sl_test_scaled(5000, 1000), .users = 13,
               .mode = {.long_bytes = LONG_KEY_BYTES}};
  run_whole(&w, true);
}

/* Job A runs to the halfway pause, checkpoints and (with sp) savepoints,
 * and stops; job B resumes from the state directory or starts from the
 * savepoint with the keyed operator at parallelism_b.  A's and B's
 * outputs together equal an uninterrupted run's. */
static void resume_case(control *c, bool window, bool savepoint,
                        int parallelism_b) {
  char *dir = sl_test_temp_dir("byte-keys");
  char *state_a = sl_test_path_in(dir, "a"), *state_b = sl_test_path_in(dir, "b");
  char *sp = sl_test_path_in(dir, "sp");
  sl_fixture_collector out = {0};
  c->pause_at = c->count / 2;
  spec a = {.ctl = c, .state_dir = state_a, .window = window, .out = &out};
  sl_job *job = build(&a);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  wait_paused(c);
  checkpoint_now(job);
  char err[512] = "";
  if (savepoint)
    cr_assert_eq(sl_job_savepoint(job, sp, 0, err, sizeof err), 0, "%s", err);
  sl_job_stop(job);
  cr_assert_eq(wait_job(job), SL_ESTOPPED, "%s", sl_job_error(job));
  sl_job_destroy(job);

  atomic_store(&c->release, 1);
  spec b = {.ctl = c, .state_dir = savepoint ? state_b : state_a,
            .from_savepoint = savepoint ? sp : 0,
            .policy = savepoint ? 0 : SL_STORE_RESUME, .window = window,
            .parallelism = parallelism_b, .out = &out};
  job = build(&b);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  cr_assert_eq(wait_job(job), 0, "%s", sl_job_error(job));
  uint64_t restored = 0;
  sl_job_last_checkpoint(job, &restored);
  cr_expect_gt(restored, 0, "job B did not restore");
  sl_job_destroy(job);
  expect_reference(&out, c, window);
  sl_test_remove_tree(dir);
  free(state_a);
  free(state_b);
  free(sp);
}

Test(byte_keys, resume_from_state_dir_keeps_colliding_keys) {
  control c = {.count = sl_test_scaled(20000, 2000), .users = 31,
               .hash = constant_hash};
  resume_case(&c, false, false, 1);
}

Test(byte_keys, resume_from_state_dir_keeps_windows) {
  control c = {.count = sl_test_scaled(20000, 2000), .users = 31,
               .hash = constant_hash};
  resume_case(&c, true, false, 1);
}

Test(byte_keys, resume_keeps_the_longest_stored_keys) {
  /* Keys of SL_KEY_MAX_STORED_BYTES, colliding, through LMDB. */
  control c = {.count = sl_test_scaled(5000, 1000), .users = 13,
               .mode = {.long_bytes = SL_KEY_MAX_STORED_BYTES},
               .hash = constant_hash};
  resume_case(&c, false, false, 1);
}

Test(byte_keys, rescale_through_savepoint_one_to_two) {
  control c = {.count = sl_test_scaled(20000, 2000), .users = 97};
  resume_case(&c, false, true, 2);
  control w = {.count = sl_test_scaled(20000, 2000), .users = 97};
  resume_case(&w, true, true, 2);
}

/* A job that must fail: status want, message naming what; checkpointed
 * in a temporary state directory with stored. */
static void expect_failure(control *c, int want, const char *what,
                           bool stored) {
  sl_fixture_collector out = {0};
  char *dir = stored ? sl_test_temp_dir("byte-keys") : 0;
  spec s = {.ctl = c, .out = &out, .state_dir = dir};
  sl_job *job = build(&s);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  int rc = wait_job(job);
  cr_expect_eq(rc, want, "status %d (%s), expected %d: %s", rc,
               sl_strerror(rc), want, sl_job_error(job));
  cr_expect(strstr(sl_job_error(job), what) != 0, "'%s' lacks '%s'",
            sl_job_error(job), what);
  sl_job_destroy(job);
  uint64_t n = 0;
  free(sl_fixture_collector_gather(&out, by_output, &n));
  if (dir)
    sl_test_remove_tree(dir);
}

Test(byte_keys, failing_key_function_fails_the_job) {
  control c = {.count = 1000, .users = 10, .mode = {.fail_user = 7}};
  expect_failure(&c, -EIO, "key function of key_by 'by-user' returned",
                 false);
}

Test(byte_keys, key_over_the_maximum_fails_the_job) {
  control c = {.count = 1000, .users = 10, .mode = {.huge_user = 3}};
  expect_failure(&c, SL_ETOOBIG, "key_by 'by-user': a key of 65537 bytes",
                 false);
}

Test(byte_keys, key_over_the_stored_maximum_fails_a_checkpointed_job) {
  control c = {.count = 1000, .users = 10,
               .mode = {.long_bytes = SL_KEY_MAX_STORED_BYTES + 1}};
  expect_failure(&c, SL_ETOOBIG, "a key of 449 bytes exceeds the largest, "
                 "448 (SL_KEY_MAX_STORED_BYTES", true);
}

/* ------------------------------------------------------------ refusals */

static uint64_t first_word(void *user, const sl_record *in) {
  (void)user;
  uint64_t k;
  memcpy(&k, in->data, 8);
  return k;
}

static int noop_process(sl_ctx *ctx, void *state, int input,
                        const sl_record *in) {
  (void)ctx;
  (void)state;
  (void)input;
  (void)in;
  return 0;
}

Test(byte_keys, mixed_key_kinds_are_refused) {
  control c = {.count = 10, .users = 3};
  sl_job *job;
  cr_assert_eq(sl_job_create(0, &job), 0);
  static const sl_source_ops source_ops = {
      .open = source_open, .next = source_next, .close = source_close};
  sl_op *src, *by_bytes, *by_u64, *both, *sink;
  cr_assert_eq(sl_op_source(job, "events", 1, &source_ops, &c, &src), 0);
  cr_assert_eq(sl_op_key_by_bytes(job, "by-user", src, event_key, 0,
                                  &by_bytes), 0);
  cr_assert_eq(sl_op_key_by(job, "by-word", src, first_word, 0, &by_u64), 0);
  sl_op *inputs[2] = {by_bytes, by_u64};
  static const sl_process_ops ops = {.process = noop_process};
  cr_assert_eq(sl_op_process(job, "both", inputs, 2, 1, &ops, 0, &both), 0);
  cr_assert_eq(sl_op_sink(job, "sink", both, 1, &ops, 0, &sink), 0);
  cr_expect_eq(sl_job_validate(job), SL_EGRAPH);
  cr_expect(strstr(sl_job_error(job), "operator 'both'") != 0 &&
                strstr(sl_job_error(job), "sl_op_key_by_bytes") != 0,
            "%s", sl_job_error(job));
  sl_op *nofn;
  cr_expect_eq(sl_op_key_by_bytes(job, "none", src, 0, 0, &nofn), SL_EGRAPH);
  sl_job_destroy(job);
}

/* On a 64-bit-keyed stream sl_ctx_key_bytes gives the key's 8 bytes,
 * big-endian. */
static int u64_bytes_process(sl_ctx *ctx, void *state, int input,
                             const sl_record *in) {
  (void)state;
  (void)input;
  const void *key;
  uint32_t n;
  int rc = sl_ctx_key_bytes(ctx, &key, &n);
  if (rc)
    return rc;
  uint8_t want[8];
  uint64_t k;
  memcpy(&k, in->data, 8);
  for (int i = 7; i >= 0; i--, k >>= 8)
    want[i] = (uint8_t)k;
  if (n != 8 || memcmp(key, want, 8) != 0) {
    sl_ctx_fail(ctx, "sl_ctx_key_bytes is not the key big-endian");
    return -EBADMSG;
  }
  return sl_emit(ctx, in->data, in->size_bytes);
}

Test(byte_keys, u64_key_reads_as_eight_bytes) {
  sl_job *job;
  cr_assert_eq(sl_job_create(0, &job), 0);
  sl_op *src, *by, *proc, *sink;
  cr_assert_eq(sl_source_sequence(job, "seq", 1, 1000, 37, &src), 0);
  cr_assert_eq(sl_op_key_by(job, "by-key", src, sl_fixture_tuple_key, 0, &by),
               0);
  static const sl_process_ops ops = {.process = u64_bytes_process};
  cr_assert_eq(sl_op_process(job, "check", &by, 1, 2, &ops, 0, &proc), 0);
  sl_checksum sum = {0};
  cr_assert_eq(sl_sink_checksum(job, "sum", proc, 1, &sum, &sink), 0);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  cr_assert_eq(wait_job(job), 0, "%s", sl_job_error(job));
  cr_expect_eq(sum.records, 1000);
  sl_job_destroy(job);
}

/* ------------------------------------------------------------ joins */

/* The unbounded join's function: both records and the key are one user. */
static int join_pair(void *user, sl_ctx *ctx, uint64_t key,
                     const sl_record *left, const sl_record *right) {
  (void)key;
  const control *c = user;
  output o = {.kind = 4};
  int rc = current_name(ctx, c, left, o.user);
  if (rc == 0 && memcmp(((const event *)right->data)->user, o.user,
                        NAME_BYTES) != 0) {
    sl_ctx_fail(ctx, "a pair of two users");
    rc = -EBADMSG;
  }
  if (rc)
    return rc;
  o.a = ((const event *)left->data)->seq;
  o.b = ((const event *)right->data)->seq;
  return sl_emit(ctx, &o, sizeof o);
}

Test(byte_keys, join_keeps_colliding_keys_apart) {
  /* Both sides are the same events, every key hashing to 42: the join
   * pairs each record with every record of its own user, n_u^2 pairs per
   * user, and none across users (join_pair checks). */
  control left = {.count = 700, .users = 7, .hash = constant_hash};
  control right = left;
  sl_job *job;
  cr_assert_eq(sl_job_create(0, &job), 0);
  cr_assert_eq(sl_testing_set_key_hash(job, constant_hash), 0);
  static const sl_source_ops source_ops = {
      .open = source_open, .next = source_next, .close = source_close};
  sl_op *l, *r, *lk, *rk, *join, *sink;
  cr_assert_eq(sl_op_source(job, "left", 1, &source_ops, &left, &l), 0);
  cr_assert_eq(sl_op_source(job, "right", 1, &source_ops, &right, &r), 0);
  cr_assert_eq(sl_op_key_by_bytes(job, "left-by-user", l, event_key, 0, &lk),
               0);
  cr_assert_eq(sl_op_key_by_bytes(job, "right-by-user", r, event_key, 0,
                                  &rk), 0);
  cr_assert_eq(sl_op_join(job, "join", lk, rk, 2, join_pair, &left, &join), 0,
               "%s", sl_job_error(job));
  sl_fixture_collector out = {.record_bytes = sizeof(output)};
  cr_assert_eq(sl_op_sink(job, "collect", join, 1, &sl_fixture_collector_ops,
                          &out, &sink), 0);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  cr_assert_eq(wait_job(job), 0, "%s", sl_job_error(job));
  sl_job_destroy(job);
  uint64_t per[7] = {0}, want = 0, n = 0;
  for (uint64_t i = 0; i < left.count; i++)
    per[user_of(i, left.users)]++;
  for (int u = 0; u < 7; u++)
    want += per[u] * per[u];
  free(sl_fixture_collector_gather(&out, by_output, &n));
  cr_expect_eq(n, want, "%" PRIu64 " pairs, expected %" PRIu64, n, want);
}

/* ------------------------------------------------------------ fingerprint */

Test(byte_keys, resume_refuses_another_kind_of_key) {
  /* A byte-keyed job's store, resumed by the same graph keyed by 64-bit
   * keys: its state could never be found, so the resume is refused and
   * the message shows the mark. */
  char *dir = sl_test_temp_dir("byte-keys");
  control c = {.count = 500, .users = 5};
  sl_fixture_collector out = {0};
  spec a = {.ctl = &c, .state_dir = dir, .out = &out};
  sl_job *job = build(&a);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  cr_assert_eq(wait_job(job), 0, "%s", sl_job_error(job));
  sl_job_destroy(job);

  sl_job_config config = sl_fixture_config(dir, 3600000);
  config.checkpoint.store_policy = SL_STORE_RESUME;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  static const sl_source_ops source_ops = {
      .open = source_open, .next = source_next, .close = source_close};
  static const sl_process_ops count_ops = {.process = noop_process};
  sl_op *src, *by, *count, *sink;
  cr_assert_eq(sl_op_source(job, "events", 1, &source_ops, &c, &src), 0);
  cr_assert_eq(sl_op_key_by(job, "by-user", src, first_word, 0, &by), 0);
  cr_assert_eq(sl_op_process(job, "count", &by, 1, 1, &count_ops, 0, &count),
               0);
  cr_assert_eq(sl_op_sink(job, "collect", count, 1, &sl_fixture_collector_ops,
                          &out, &sink), 0);
  int rc = sl_job_start(job);
  cr_expect_neq(rc, 0, "a byte-keyed store resumed with 64-bit keys");
  cr_expect(strstr(sl_job_error(job), "process+bytes") != 0, "%s",
            sl_job_error(job));
  if (rc == 0)
    wait_job(job);
  sl_job_destroy(job);
  uint64_t n = 0;
  free(sl_fixture_collector_gather(&out, by_output, &n));
  sl_test_remove_tree(dir);
}
