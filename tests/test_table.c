/* test_table.c — the LMDB table sink and its readers: the table equals a
 * map computed here from the records, after an uninterrupted run, after a
 * stop (exactly the records up to the newest checkpoint's source
 * position) and a resume, after in-process failovers and aborted
 * checkpoints; deletes; fresh starts; reads while the job runs and its
 * map grows; the store's table calls under compaction, wipes, failed
 * transactions, faults and corruption; and every error message.
 *
 * Real threads, real LMDB stores in temporary directories. */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "checkpoint.h" /* sl_checkpointer_store: the job's store */
#include "store.h"
#include "sluice_testing.h" /* unstable test helpers */
#include "test_dirs.h"
#include "test_util.h"

/* ------------------------------------------------------------ helpers */

/* The expected content of a table whose keys are 0 .. keys-1 (as 8
 * bytes): present[k] and value[k]. */
typedef struct table_model {
  uint64_t keys;
  bool *present;
  uint64_t *value;
} table_model;

static table_model model_new(uint64_t keys) {
  table_model m = {.keys = keys,
                   .present = calloc(keys, sizeof(bool)),
                   .value = calloc(keys, sizeof(uint64_t))};
  cr_assert(m.present && m.value);
  return m;
}

static void model_free(table_model *m) {
  free(m->present);
  free(m->value);
}

/* The running sums after the first n records of the test sources (record
 * i: key i % keys, value i), computed without the engine. */
static table_model expected_sums(uint64_t n, uint64_t keys) {
  table_model m = model_new(keys);
  for (uint64_t i = 0; i < n; i++) {
    m.present[i % keys] = true;
    m.value[i % keys] += i;
  }
  return m;
}

/* Key bytes of the tables: 8 bytes in memory order (the default row), or
 * big-endian (the delete test's callback). */
typedef struct read_into {
  table_model *m;
  bool big_endian;
  uint64_t rows;
  uint64_t bad; /* rows that are not (8-byte key < keys, 8-byte value) */
  uint64_t duplicates;
} read_into;

static int collect_row(void *arg, const void *key, uint32_t key_bytes,
                       const void *value, uint32_t value_bytes) {
  read_into *r = arg;
  r->rows++;
  if (key_bytes != 8 || value_bytes != 8) {
    r->bad++;
    return 0;
  }
  uint64_t k = 0;
  if (r->big_endian)
    for (int i = 0; i < 8; i++)
      k = k << 8 | ((const uint8_t *)key)[i];
  else
    memcpy(&k, key, 8);
  if (k >= r->m->keys) {
    r->bad++;
    return 0;
  }
  r->duplicates += r->m->present[k];
  r->m->present[k] = true;
  memcpy(&r->m->value[k], value, 8);
  return 0;
}

/* The table as a model, through reader; its count checked against the
 * rows visited. */
static table_model read_table(sl_table_reader *reader, const char *table,
                              uint64_t keys, bool big_endian) {
  table_model m = model_new(keys);
  read_into r = {.m = &m, .big_endian = big_endian};
  int rc = sl_table_foreach(reader, table, collect_row, &r);
  cr_assert_eq(rc, 0, "foreach %s: %s", table, sl_table_error(reader));
  cr_assert_eq(r.bad, 0, "%" PRIu64 " malformed rows in %s", r.bad, table);
  cr_assert_eq(r.duplicates, 0);
  uint64_t count = 0;
  cr_assert_eq(sl_table_count(reader, table, &count), 0, "%s",
               sl_table_error(reader));
  cr_assert_eq(count, r.rows, "count %" PRIu64 ", rows visited %" PRIu64,
               count, r.rows);
  return m;
}

static void assert_models_equal(const table_model *got,
                                const table_model *want, const char *what) {
  cr_assert_eq(got->keys, want->keys);
  for (uint64_t k = 0; k < want->keys; k++) {
    cr_assert_eq(got->present[k], want->present[k],
                 "%s: key %" PRIu64 " present %d, expected %d", what, k,
                 got->present[k], want->present[k]);
    if (want->present[k])
      cr_assert_eq(got->value[k], want->value[k],
                   "%s: key %" PRIu64 " = %" PRIu64 ", expected %" PRIu64,
                   what, k, got->value[k], want->value[k]);
  }
}

/* ------------------------------------------------------------ the job */

/* A replayable source (parallelism 1) of `count` sl_tuple records {key = i
 * % keys, value = i}, `per_call` a next(), sleeping pause_us after each
 * call; after `gate` records it waits until a checkpoint has completed
 * (so failures after the gate have a checkpoint to restore).  With
 * `allowed` set it emits no record beyond *allowed and stores how far it
 * got in *emitted: a test releases the input step by step and triggers a
 * checkpoint between steps, so no count depends on the scheduler. */
typedef struct paced_source {
  uint64_t count, keys, per_call, gate;
  uint32_t pause_us;
  _Atomic uint64_t *allowed, *emitted;
} paced_source;

typedef struct paced_instance {
  const paced_source *config;
  uint64_t next;
  bool completed; /* a checkpoint completed in this attempt */
} paced_instance;

static int paced_open(sl_ctx *ctx, void *user, void **state) {
  (void)ctx;
  paced_instance *s = calloc(1, sizeof *s);
  if (!s)
    return -ENOMEM;
  s->config = user;
  *state = s;
  return 0;
}

static int paced_next(sl_ctx *ctx, void *state) {
  paced_instance *s = state;
  const paced_source *c = s->config;
  if (c->gate && s->next >= c->gate && !s->completed) {
    sl_test_sleep_us(100);
    return 0;
  }
  uint64_t end = c->count;
  if (c->allowed) {
    uint64_t allowed = atomic_load(c->allowed);
    if (s->next >= allowed) {
      sl_test_sleep_us(100);
      return 0;
    }
    if (allowed < end)
      end = allowed;
  }
  sl_tuple batch[256];
  uint64_t n = end - s->next;
  uint64_t limit = c->per_call < 256 ? c->per_call : 256;
  if (n > limit)
    n = limit;
  for (uint64_t i = 0; i < n; i++)
    batch[i] = (sl_tuple){.key = (s->next + i) % c->keys, .value = s->next + i};
  int rc = sl_emit_batch(ctx, batch, sizeof batch[0], (uint32_t)n);
  if (rc)
    return rc;
  s->next += n;
  if (c->emitted)
    atomic_store(c->emitted, s->next);
  if (c->pause_us)
    sl_test_sleep_us(c->pause_us);
  return s->next == c->count ? SL_SOURCE_END : 0;
}

static int paced_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  return sl_fixture_save_position(ctx, &((paced_instance *)state)->next);
}

static int paced_restore(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  paced_instance *s = state;
  const void *data;
  uint32_t bytes;
  int rc = sl_operator_state_get(ctx, &data, &bytes);
  if (rc == SL_ENOTFOUND)
    return 0;
  if (rc || bytes != 8)
    return -EINVAL;
  memcpy(&s->next, data, 8);
  s->completed = true; /* restored: a checkpoint exists */
  return 0;
}

static void paced_complete(sl_ctx *ctx, void *state, uint64_t id) {
  (void)ctx;
  (void)id;
  ((paced_instance *)state)->completed = true;
}

static void paced_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  free(state);
}

/* The running sum of each key (keyed value state), emitted as {key, sum}. */
static int sum_process(sl_ctx *ctx, void *state, int input,
                       const sl_record *in) {
  (void)state;
  (void)input;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  uint64_t sum;
  int rc = sl_fixture_state_add(ctx, t.value, &sum);
  if (rc)
    return rc;
  sl_tuple out = {.key = t.key, .value = sum};
  return sl_emit(ctx, &out, sizeof out);
}

typedef struct sum_job {
  paced_source source;
  int parallelism; /* of the sum and the table sink */
  const char *state_dir;
  const char *table;
  int policy;
  uint32_t interval_ms;
  uint32_t tolerable;
  uint64_t map_bytes;
  const char *faults;
  struct sl_restart_config restart;
} sum_job;

/* source -> key_by -> sum -> table sink (the default row: key -> sum).
 * The source is operator 0. */
static sl_job *build_sum(sum_job *s) {
  sl_job_config config =
      sl_fixture_config(s->state_dir, s->interval_ms ? s->interval_ms : 10);
  config.checkpoint.store_policy = s->policy;
  config.checkpoint.tolerable_failures = s->tolerable;
  config.checkpoint.initial_map_bytes = s->map_bytes;
  config.faults = s->faults;
  config.restart = s->restart;
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  static const sl_source_ops source_ops = {
      .open = paced_open,
      .next = paced_next,
      .close = paced_close,
      .snapshot = paced_snapshot,
      .restore = paced_restore,
      .checkpoint_complete = paced_complete};
  sl_op *src, *by, *sum, *table;
  cr_assert_eq(sl_op_source(job, "source", 1, &source_ops, &s->source, &src),
               0);
  cr_assert_eq(sl_op_key_by(job, "by-key", src, sl_fixture_tuple_key, 0, &by),
               0);
  static const sl_process_ops sum_ops = {.process = sum_process};
  cr_assert_eq(sl_op_process(job, "sum", &by, 1, s->parallelism, &sum_ops, 0,
                             &sum), 0);
  sl_table_sink_config tc = {.table = s->table ? s->table : "sums"};
  int rc = sl_sink_table(job, "to-table", sum, s->parallelism, &tc, &table);
  cr_assert_eq(rc, 0, "sl_sink_table: %s", sl_job_error(job));
  return job;
}

/* Run to the end under a watchdog; returns sl_job_wait's result. */
static int run_guarded(sl_job *job, const char *what) {
  int rc = sl_job_start(job);
  cr_assert_eq(rc, 0, "%s: start: %s", what, sl_job_error(job));
  sl_test_watchdog w;
  sl_test_watchdog_arm(&w, job, 120, what);
  rc = sl_job_wait(job);
  cr_assert_not(sl_test_watchdog_disarm(&w), "%s hung", what);
  return rc;
}

/* The table of a store, read by a standalone reader (no job of this
 * process may hold the directory). */
static table_model read_dir(const char *dir, const char *table,
                            uint64_t keys, bool big_endian) {
  sl_table_reader *reader;
  char err[512];
  int rc = sl_table_open(dir, &reader, err, sizeof err);
  cr_assert_eq(rc, 0, "sl_table_open: %s", err);
  table_model m = read_table(reader, table, keys, big_endian);
  sl_table_close(reader);
  return m;
}

/* ------------------------------------------------------------ runs */

Test(table, uninterrupted_run_holds_every_running_sum) {
  char *dir = sl_test_temp_dir("table");
  char *state = sl_test_path_in(dir, "state");
  uint64_t count = sl_test_scaled(200000, 20000), keys = 1000;
  sum_job s = {.source = {.count = count, .keys = keys, .per_call = 256},
               .parallelism = 2, .state_dir = state};
  sl_job *job = build_sum(&s);
  int rc = run_guarded(job, "sum job");
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  table_model want = expected_sums(count, keys);
  /* The job's own reader, after the run (the store is still open). */
  sl_table_reader *reader;
  cr_assert_eq(sl_job_table_reader(job, &reader), 0);
  table_model got = read_table(reader, "sums", keys, false);
  assert_models_equal(&got, &want, "job reader");
  uint64_t checkpoint = 0;
  cr_assert_eq(sl_table_checkpoint(reader, &checkpoint), 0);
  cr_assert_eq(checkpoint, sl_job_last_checkpoint(job, 0),
               "the table is at the final checkpoint");
  /* One row by key: a copy of the value. */
  uint64_t key = 7;
  void *value;
  uint32_t bytes;
  cr_assert_eq(sl_table_get(reader, "sums", &key, 8, &value, &bytes), 0, "%s",
               sl_table_error(reader));
  cr_assert_eq(bytes, 8);
  cr_assert_eq(memcmp(value, &want.value[7], 8), 0);
  free(value);
  key = keys + 1;
  cr_assert_eq(sl_table_get(reader, "sums", &key, 8, &value, &bytes),
               SL_ENOTFOUND);
  cr_assert(strstr(sl_table_error(reader), "no row") != 0, "%s",
            sl_table_error(reader));
  /* A table nothing wrote is empty. */
  uint64_t rows = 1;
  cr_assert_eq(sl_table_count(reader, "other", &rows), 0);
  cr_assert_eq(rows, 0);
  sl_table_close(reader);
  model_free(&got);
  sl_job_destroy(job);
  /* After the job: a standalone reader of the directory. */
  got = read_dir(state, "sums", keys, false);
  assert_models_equal(&got, &want, "standalone reader");
  model_free(&got);
  model_free(&want);
  free(state);
  sl_test_remove_tree(dir);
}

/* The source position saved by the newest complete checkpoint of the
 * store in dir (the paced source is operator 0, one instance; its blob
 * is a flag byte, then the u64 position, checkpoint_writer.c write_instance),
 * and that checkpoint's id. */
static uint64_t saved_position(const char *dir, uint64_t *checkpoint) {
  sl_store_options o = {.read_only = 1};
  sl_store *st;
  char err[512];
  cr_assert_eq(sl_store_open(dir, &o, &st, err, sizeof err), 0, "%s", err);
  *checkpoint = sl_store_latest(st);
  void *blob;
  uint32_t bytes;
  cr_assert_eq(sl_store_get_blob(st, 0, 0, &blob, &bytes), 0, "%s",
               sl_store_error(st));
  /* Flag bit 0: operator state follows (the engine may append more after
   * it, e.g. event time). */
  cr_assert_geq(bytes, 9);
  cr_assert(((uint8_t *)blob)[0] & 1, "a position was saved");
  uint64_t position;
  memcpy(&position, (uint8_t *)blob + 1, 8);
  free(blob);
  sl_store_close(st);
  return position;
}

Test(table, stopped_job_holds_exactly_the_checkpointed_records) {
  char *dir = sl_test_temp_dir("table");
  char *state = sl_test_path_in(dir, "state");
  /* Each key gets 4 records, far apart: most keys change in few
   * checkpoint intervals, so a row early or late shows. */
  uint64_t count = 60000, keys = count / 4;
  /* The source stops at count / 2 until the resume: the stop below always
   * finds the job running, however slow or fast the machine. */
  _Atomic uint64_t allowed = count / 2;
  sum_job s = {.source = {.count = count, .keys = keys, .per_call = 64,
                          .pause_us = 200, .allowed = &allowed},
               .parallelism = 2, .state_dir = state, .interval_ms = 15};
  sl_job *job = build_sum(&s);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  /* Stop after a few checkpoints. */
  double deadline = sl_test_now_s() + 60;
  while (sl_job_last_checkpoint(job, 0) < 4 && sl_test_now_s() < deadline)
    sl_test_sleep_us(1000);
  sl_job_stop(job);
  int rc = sl_job_wait(job);
  cr_assert_eq(rc, SL_ESTOPPED, "the job ended with %d: %s", rc,
               sl_job_error(job));
  uint64_t last = sl_job_last_checkpoint(job, 0);
  cr_assert_geq(last, 4);
  sl_job_destroy(job);

  /* The store may be one ahead of what the job reported: a checkpoint the
   * writer committed while the job stopped is durable, though the
   * coordinator never announced it.  The table goes with the store. */
  uint64_t checkpoint = 0;
  uint64_t position = saved_position(state, &checkpoint);
  cr_assert_geq(checkpoint, last);
  cr_assert_gt(position, 0);
  cr_assert_leq(position, count / 2, "stopped at the source's gate");
  table_model want = expected_sums(position, keys);
  table_model got = read_dir(state, "sums", keys, false);
  assert_models_equal(&got, &want, "table at the stop's checkpoint");
  model_free(&got);
  model_free(&want);

  /* Resume to the end: the table of an uninterrupted run. */
  s.policy = SL_STORE_RESUME;
  s.source.pause_us = 0;
  atomic_store(&allowed, count);
  job = build_sum(&s);
  rc = run_guarded(job, "resumed sum job");
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  uint64_t restored = 0;
  sl_job_last_checkpoint(job, &restored);
  cr_assert_eq(restored, checkpoint);
  sl_job_destroy(job);
  want = expected_sums(count, keys);
  got = read_dir(state, "sums", keys, false);
  assert_models_equal(&got, &want, "table after the resume");
  model_free(&got);
  model_free(&want);
  free(state);
  sl_test_remove_tree(dir);
}

/* Failovers: instances of the sum and of the table sink fail after the
 * gate (a checkpoint completed), the job restarts from its newest
 * checkpoint, and the final table equals an uninterrupted run's. */
Test(table, failover_ends_with_the_uninterrupted_table) {
  char *dir = sl_test_temp_dir("table");
  char *state = sl_test_path_in(dir, "state");
  /* One record a key: a row lost across a failover stays lost. */
  uint64_t count = sl_test_scaled(200000, 40000), keys = count;
  char faults[256];
  /* The sum and the sink see about half the records each instance; both
   * reach their fault after the gate (count / 4). */
  snprintf(faults, sizeof faults,
           "fail:op=sum,instance=0,record=%" PRIu64 ";"
           "fail:op=to-table,instance=1,record=%" PRIu64,
           count * 3 / 16, count * 5 / 16);
  struct sl_restart_config restart =
      sl_restart_defaults(SL_RESTART_FIXED_DELAY);
  restart.attempts = 5;
  restart.delay_ms = 0;
  sum_job s = {.source = {.count = count, .keys = keys, .per_call = 256,
                          .gate = count / 4},
               .parallelism = 2, .state_dir = state, .faults = faults,
               .restart = restart};
  sl_job *job = build_sum(&s);
  int rc = run_guarded(job, "failover sum job");
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  cr_assert_eq(sl_job_faults_fired(job), 2);
  cr_assert_eq(sl_job_restarts(job), 2);
  for (int k = 0; k < 2; k++) {
    sl_recovery_stats r;
    cr_assert_eq(sl_job_recovery_stats(job, k, &r), 0);
    cr_assert_gt(r.restored_from, 0, "restart %d restored a checkpoint", k);
  }
  table_model want = expected_sums(count, keys);
  sl_table_reader *reader;
  cr_assert_eq(sl_job_table_reader(job, &reader), 0);
  table_model got = read_table(reader, "sums", keys, false);
  sl_table_close(reader);
  assert_models_equal(&got, &want, "table after failovers");
  model_free(&got);
  model_free(&want);
  sl_job_destroy(job);
  free(state);
  sl_test_remove_tree(dir);
}

/* Checkpoints aborted after the sink handed its rows over (a failed
 * snapshot elsewhere, a failed write, a commit reported failed after it
 * happened): no restart, and the rows are written by a later checkpoint,
 * once, in order. */
/* Triggers a checkpoint and waits until it has completed or aborted
 * (the newest in the statistics is the one triggered: no periodic ones). */
static int checkpoint_now(sl_job *job) {
  uint64_t id;
  int rc;
  while ((rc = sl_job_trigger_checkpoint(job, &id)) == EBUSY)
    sl_test_sleep_us(200); /* the previous one is still being written */
  cr_assert_eq(rc, 0, "trigger: %s", sl_strerror(rc));
  for (;;) {
    sl_checkpoint_stats cs;
    if (sl_job_checkpoint_stats(job, 0, &cs) == 0 && cs.id == id &&
        cs.status != SL_CHECKPOINT_IN_PROGRESS)
      return cs.status;
    sl_test_sleep_us(200);
  }
}

Test(table, rows_of_aborted_checkpoints_go_with_the_next) {
  char *dir = sl_test_temp_dir("table");
  char *state = sl_test_path_in(dir, "state");
  /* Every record its own key: a row lost from any batch stays lost. */
  uint64_t count = 40000, keys = count, step = 1000;
  _Atomic uint64_t allowed = 0, emitted = 0;
  /* The test releases `step` records, waits for them, then triggers one
   * checkpoint and waits for its end, so the faults (snapshots 2-3, the
   * 4th write, the 6th sync) hit ordinary checkpoints in a known order;
   * periodic checkpoints are out of the way (an hour apart). */
  sum_job s = {.source = {.count = count, .keys = keys, .per_call = 32,
                          .allowed = &allowed, .emitted = &emitted},
               .parallelism = 2, .state_dir = state, .tolerable = 10,
               .interval_ms = 3600 * 1000,
               .faults = "snapshot:op=sum,nth=2,times=2;write:nth=4;"
                         "store:call=sync,nth=6"};
  sl_job *job = build_sum(&s);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  sl_test_watchdog w;
  sl_test_watchdog_arm(&w, job, 120, "aborting sum job");
  int aborted = 0, completed = 0;
  /* Bounded: 20 checkpoints are far more than the faults need. */
  for (int round = 0; round < 20 && (aborted < 4 || completed < 2); round++) {
    atomic_store(&allowed, (uint64_t)(round + 1) * step);
    while (atomic_load(&emitted) < (uint64_t)(round + 1) * step)
      sl_test_sleep_us(200);
    int status = checkpoint_now(job);
    aborted += status == SL_CHECKPOINT_ABORTED;
    completed += status == SL_CHECKPOINT_COMPLETED;
  }
  atomic_store(&allowed, count); /* the rest, then the final checkpoint */
  int rc = sl_job_wait(job);
  cr_assert_not(sl_test_watchdog_disarm(&w), "aborting sum job hung");
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  cr_assert_eq(sl_job_restarts(job), 0);
  cr_assert_geq(aborted, 4, "%d checkpoints aborted", aborted);
  cr_assert_geq(completed, 2);
  table_model want = expected_sums(count, keys);
  sl_table_reader *reader;
  cr_assert_eq(sl_job_table_reader(job, &reader), 0);
  table_model got = read_table(reader, "sums", keys, false);
  sl_table_close(reader);
  assert_models_equal(&got, &want, "table after aborted checkpoints");
  model_free(&got);
  model_free(&want);
  sl_job_destroy(job);
  free(state);
  sl_test_remove_tree(dir);
}

/* A running sum of key k after j of its records (values k, k + K, ...):
 * j k + K j (j - 1) / 2.  Is v one of them? */
static bool is_prefix_sum(uint64_t v, uint64_t k, uint64_t keys,
                          uint64_t most) {
  for (uint64_t j = 1; j <= most; j++) {
    uint64_t sum = j * k + keys * j * (j - 1) / 2;
    if (sum == v)
      return true;
    if (sum > v)
      return false;
  }
  return false;
}

typedef struct prefix_check {
  uint64_t keys, most, rows, bad;
} prefix_check;

static int check_prefix_row(void *arg, const void *key, uint32_t key_bytes,
                            const void *value, uint32_t value_bytes) {
  prefix_check *c = arg;
  c->rows++;
  uint64_t k, v;
  if (key_bytes != 8 || value_bytes != 8) {
    c->bad++;
    return 0;
  }
  memcpy(&k, key, 8);
  memcpy(&v, value, 8);
  if (k >= c->keys || !is_prefix_sum(v, k, c->keys, c->most))
    c->bad++;
  return 0;
}

/* Reads from another thread while the job runs, with a map small enough
 * to grow several times meanwhile: every row seen is a running sum that
 * some prefix of the key's records gives, and checkpoints only advance. */
Test(table, reads_while_running_see_whole_checkpoints) {
  char *dir = sl_test_temp_dir("table");
  char *state = sl_test_path_in(dir, "state");
  uint64_t count = 30000, keys = 3000;
  sum_job s = {.source = {.count = count, .keys = keys, .per_call = 64,
                          .pause_us = 150},
               .parallelism = 2, .state_dir = state, .interval_ms = 5,
               .map_bytes = 64 * 1024};
  sl_job *job = build_sum(&s);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  sl_table_reader *reader;
  cr_assert_eq(sl_job_table_reader(job, &reader), 0);
  uint64_t reads = 0, previous = 0, nonempty = 0;
  uint64_t map_at_start = sl_store_map_bytes(sl_checkpointer_store(job));
  double deadline = sl_test_now_s() + 60;
  while (sl_job_progress(job) < count && sl_test_now_s() < deadline) {
    uint64_t checkpoint = 0;
    cr_assert_eq(sl_table_checkpoint(reader, &checkpoint), 0);
    cr_assert_geq(checkpoint, previous, "checkpoints only advance");
    previous = checkpoint;
    prefix_check c = {.keys = keys, .most = count / keys + 1};
    int rc = sl_table_foreach(reader, "sums", check_prefix_row, &c);
    cr_assert_eq(rc, 0, "%s", sl_table_error(reader));
    cr_assert_eq(c.bad, 0, "read %" PRIu64 ": %" PRIu64 " rows are no "
                 "running sum", reads, c.bad);
    nonempty += c.rows > 0;
    reads++;
  }
  int rc = sl_job_wait(job);
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  cr_assert_gt(nonempty, 2, "%" PRIu64 " of %" PRIu64 " reads saw rows",
               nonempty, reads);
  cr_assert_gt(sl_store_map_bytes(sl_checkpointer_store(job)), map_at_start,
               "the map grew while the reads went on");
  table_model want = expected_sums(count, keys);
  table_model got = read_table(reader, "sums", keys, false);
  assert_models_equal(&got, &want, "table after the run");
  sl_table_close(reader);
  model_free(&got);
  model_free(&want);
  sl_job_destroy(job);
  free(state);
  sl_test_remove_tree(dir);
}

/* ------------------------------------------------------------ deletes */

/* Record i (an sl_tuple of sl_source_keyed): i % 5 == 0 deletes its key,
 * else i % 7 == 0 changes nothing, else key -> 3 i.  The key goes into
 * the table big-endian, built in the row's buffer. */
static int delete_row(void *user, const sl_record *in, sl_table_row *out) {
  (void)user;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  uint8_t *buffer = out->buffer;
  for (int i = 0; i < 8; i++)
    buffer[i] = (uint8_t)(t.key >> (56 - 8 * i));
  out->key = buffer;
  out->key_bytes = 8;
  if (t.value % 5 == 0) {
    out->is_delete = 1;
    return 1;
  }
  if (t.value % 7 == 0)
    return 0;
  uint64_t value = 3 * t.value;
  memcpy(buffer + 8, &value, 8);
  out->value = buffer + 8;
  out->value_bytes = 8;
  return 1;
}

static table_model expected_deletes(uint64_t count, uint64_t keys) {
  table_model m = model_new(keys);
  for (uint64_t i = 0; i < count; i++) {
    if (i % 5 == 0)
      m.present[i % keys] = false;
    else if (i % 7 != 0) {
      m.present[i % keys] = true;
      m.value[i % keys] = 3 * i;
    }
  }
  return m;
}

static void run_deletes(int source_parallelism, int sink_parallelism) {
  char *dir = sl_test_temp_dir("table");
  char *state = sl_test_path_in(dir, "state");
  uint64_t count = sl_test_scaled(100000, 20000), keys = 997;
  sl_job_config config = sl_fixture_config(state, 5);
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  sl_op *src, *table;
  cr_assert_eq(sl_source_keyed(job, "source", source_parallelism, count, keys,
                               &src), 0);
  sl_table_sink_config tc = {.table = "last-writes", .row = delete_row};
  cr_assert_eq(sl_sink_table(job, "to-table", src, sink_parallelism, &tc,
                             &table), 0, "%s", sl_job_error(job));
  int rc = run_guarded(job, "delete job");
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  sl_job_destroy(job);
  table_model want = expected_deletes(count, keys);
  table_model got = read_dir(state, "last-writes", keys, true);
  uint64_t present = 0;
  for (uint64_t k = 0; k < keys; k++)
    present += want.present[k];
  cr_assert(present > 0 && present < keys, "some keys end deleted");
  assert_models_equal(&got, &want, "deletes");
  model_free(&got);
  model_free(&want);
  free(state);
  sl_test_remove_tree(dir);
}

Test(table, deletes_and_skips_one_instance) { run_deletes(1, 1); }

/* Parallel sink: partitioned by the row key (NAME.key), each key from one
 * source instance in order. */
Test(table, deletes_and_skips_partitioned_by_row_key) { run_deletes(2, 3); }

/* ------------------------------------------------------------ fresh */

static sl_job *build_memory(const char *state, const sl_tuple *records,
                            uint64_t count, const char *table, int policy) {
  sl_job_config config = SL_JOB_CONFIG_INIT;
  config.checkpoint.state_dir = state;
  config.checkpoint.no_sync = 1;
  config.checkpoint.store_policy = policy;
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  sl_op *src, *sink;
  cr_assert_eq(sl_source_memory(job, "source", records, sizeof *records,
                                count, &src), 0);
  sl_table_sink_config tc = {.table = table};
  cr_assert_eq(sl_sink_table(job, "to-table", src, 1, &tc, &sink), 0);
  return job;
}

Test(table, fresh_start_empties_every_table) {
  char *dir = sl_test_temp_dir("table");
  char *state = sl_test_path_in(dir, "state");
  sl_tuple first[100], second[50];
  for (uint64_t i = 0; i < 100; i++)
    first[i] = (sl_tuple){.key = i, .value = i * i};
  for (uint64_t i = 0; i < 50; i++)
    second[i] = (sl_tuple){.key = 1000 + i, .value = i};
  sl_job *job = build_memory(state, first, 100, "alpha", SL_STORE_REFUSE);
  cr_assert_eq(run_guarded(job, "first"), 0, "%s", sl_job_error(job));
  sl_job_destroy(job);
  sl_table_reader *reader;
  char err[512];
  cr_assert_eq(sl_table_open(state, &reader, err, sizeof err), 0, "%s", err);
  uint64_t rows = 0;
  cr_assert_eq(sl_table_count(reader, "alpha", &rows), 0);
  cr_assert_eq(rows, 100);
  sl_table_close(reader);

  /* Without a policy the store is refused; with FRESH every table goes. */
  job = build_memory(state, second, 50, "beta", SL_STORE_REFUSE);
  cr_assert_eq(sl_job_start(job), SL_EHASSTATE);
  sl_job_destroy(job);
  job = build_memory(state, second, 50, "beta", SL_STORE_FRESH);
  cr_assert_eq(run_guarded(job, "fresh"), 0, "%s", sl_job_error(job));
  sl_job_destroy(job);
  cr_assert_eq(sl_table_open(state, &reader, err, sizeof err), 0, "%s", err);
  cr_assert_eq(sl_table_count(reader, "alpha", &rows), 0);
  cr_assert_eq(rows, 0, "the old table was emptied");
  read_into none = {0};
  table_model empty = model_new(1);
  none.m = &empty;
  cr_assert_eq(sl_table_foreach(reader, "alpha", collect_row, &none), 0);
  cr_assert_eq(none.rows, 0);
  uint64_t key = 3;
  void *value;
  uint32_t bytes;
  cr_assert_eq(sl_table_get(reader, "alpha", &key, 8, &value, &bytes),
               SL_ENOTFOUND);
  cr_assert_eq(sl_table_count(reader, "beta", &rows), 0);
  cr_assert_eq(rows, 50);
  key = 1049;
  cr_assert_eq(sl_table_get(reader, "beta", &key, 8, &value, &bytes), 0);
  cr_assert_eq(bytes, 8);
  uint64_t got;
  memcpy(&got, value, 8);
  cr_assert_eq(got, 49);
  free(value);
  sl_table_close(reader);
  model_free(&empty);
  free(state);
  sl_test_remove_tree(dir);
}

/* ------------------------------------------------------------ errors */

Test(table, refused_without_checkpointing_or_a_valid_name) {
  sl_job *job;
  cr_assert_eq(sl_job_create(0, &job), 0);
  sl_op *src, *sink;
  cr_assert_eq(sl_source_sequence(job, "source", 1, 10, 0, &src), 0);
  sl_table_sink_config tc = {.table = "t"};
  cr_assert_eq(sl_sink_table(job, "to-table", src, 1, &tc, &sink),
               SL_EUSAGE);
  cr_assert(strstr(sl_job_error(job), "table sink 'to-table'") != 0 &&
                strstr(sl_job_error(job), "checkpoint.state_dir") != 0,
            "%s", sl_job_error(job));
  sl_table_reader *reader = (sl_table_reader *)1;
  cr_assert_eq(sl_job_table_reader(job, &reader), SL_EUSAGE);
  cr_assert_null(reader);
  sl_job_destroy(job);

  sl_job_config config = SL_JOB_CONFIG_INIT;
  config.checkpoint.state_dir = "/tmp/never-created-by-this-test";
  cr_assert_eq(sl_job_create(&config, &job), 0);
  cr_assert_eq(sl_source_sequence(job, "source", 1, 10, 0, &src), 0);
  static const char *const bad[] = {
      "", "with space", "slash/es",
      "a-name-of-forty-one-bytes-is-one-too-long"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    tc.table = bad[i];
    cr_assert_eq(sl_sink_table(job, "to-table", src, 1, &tc, &sink), EINVAL,
                 "\"%s\"", bad[i]);
    cr_assert(strstr(sl_job_error(job), "table name") != 0, "%s",
              sl_job_error(job));
  }
  cr_assert_eq(sl_sink_table(job, "to-table", src, 1, 0, &sink), EINVAL);
  tc.table = "a-name-of-forty-bytes-is-just-allowed.00";
  cr_assert_eq(strlen(tc.table), 40);
  cr_assert_eq(sl_sink_table(job, "to-table", src, 1, &tc, &sink), 0, "%s",
               sl_job_error(job));
  cr_assert_eq(sl_job_table_reader(job, &reader), SL_ENOTSTARTED);
  /* 64 distinct tables (with the one above), any number of sinks of
   * them; the 65th table is refused. */
  char name[32], table[32];
  for (int i = 1; i < SL_TABLE_MAX_TABLES; i++) {
    snprintf(name, sizeof name, "sink-%d", i);
    snprintf(table, sizeof table, "table-%d", i);
    tc.table = table;
    cr_assert_eq(sl_sink_table(job, name, src, 1, &tc, &sink), 0, "%s",
                 sl_job_error(job));
  }
  tc.table = "table-7";
  cr_assert_eq(sl_sink_table(job, "another-sink", src, 1, &tc, &sink), 0);
  tc.table = "one-too-many";
  cr_assert_eq(sl_sink_table(job, "last-sink", src, 1, &tc, &sink),
               SL_EGRAPH);
  cr_assert(strstr(sl_job_error(job), "would be the job's 65th") != 0, "%s",
            sl_job_error(job));
  sl_job_destroy(job);
}

static int failing_row(void *user, const sl_record *in, sl_table_row *out) {
  (void)user;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  if (t.value == 500)
    return -7;
  out->key = in->data;
  out->key_bytes = 8;
  out->value = (const uint8_t *)in->data + 8;
  out->value_bytes = 8;
  return 1;
}

static int long_key_row(void *user, const sl_record *in, sl_table_row *out) {
  (void)user;
  out->key = out->buffer;
  out->key_bytes = SL_TABLE_MAX_KEY + 1;
  memset(out->buffer, 'k', SL_TABLE_MAX_KEY + 1);
  out->value = in->data;
  out->value_bytes = in->size_bytes;
  return 1;
}

/* The job's failure message for a sink fed by a sequence source. */
static void expect_run_failure(sl_table_row_fn row, int parallelism,
                               bool short_records, const char *needle,
                               int status) {
  char *dir = sl_test_temp_dir("table");
  char *state = sl_test_path_in(dir, "state");
  sl_job_config config = SL_JOB_CONFIG_INIT;
  config.checkpoint.state_dir = state;
  config.checkpoint.no_sync = 1;
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  sl_op *src, *sink;
  static const uint32_t shorts[4] = {1, 2, 3, 4};
  if (short_records)
    cr_assert_eq(sl_source_memory(job, "source", shorts, 4, 4, &src), 0);
  else
    cr_assert_eq(sl_source_sequence(job, "source", 1, 1000, 0, &src), 0);
  sl_table_sink_config tc = {.table = "t", .row = row};
  cr_assert_eq(sl_sink_table(job, "to-table", src, parallelism, &tc, &sink),
               0);
  int rc = run_guarded(job, "failing table job");
  cr_assert_eq(rc, status, "%d: %s", rc, sl_job_error(job));
  const char *e = sl_job_error(job);
  cr_assert(strstr(e, "operator 'to-table'") != 0 &&
                strstr(e, "table \"t\"") != 0 && strstr(e, needle) != 0,
            "%s", e);
  sl_job_destroy(job);
  free(state);
  sl_test_remove_tree(dir);
}

Test(table, run_time_errors_name_the_operator_and_table) {
  expect_run_failure(failing_row, 1, false, "the row callback returned -7",
                     -7);
  expect_run_failure(failing_row, 2, false, "the row callback returned -7",
                     -7);
  expect_run_failure(long_key_row, 1, false, "471 bytes is longer than 470",
                     EINVAL);
  expect_run_failure(0, 1, true,
                     "record of 4 bytes is shorter than the default row's",
                     EINVAL);
}

Test(table, readers_refuse_what_is_no_store) {
  sl_table_reader *reader;
  char err[512];
  int rc = sl_table_open("/tmp/sluice-table-no-such-dir/x", &reader, err,
                         sizeof err);
  cr_assert_eq(rc, ENOENT);
  cr_assert_null(reader);
  cr_assert(strstr(err, "/tmp/sluice-table-no-such-dir/x") != 0 &&
                strstr(err, "no such directory") != 0, "%s", err);

  char *dir = sl_test_temp_dir("table");
  rc = sl_table_open(dir, &reader, err, sizeof err); /* empty: no store */
  cr_assert_eq(rc, ENOENT, "%s", err);
  char *file = sl_test_path_in(dir, "notes.txt");
  FILE *f = fopen(file, "w");
  cr_assert(f);
  fputs("not a store\n", f);
  fclose(f);
  rc = sl_table_open(dir, &reader, err, sizeof err);
  cr_assert_eq(rc, SL_ESTORE);
  cr_assert(strstr(err, "not a sluice state directory") != 0, "%s", err);
  free(file);

  /* A directory a job of this process holds: one handle per process. */
  char *state = sl_test_path_in(dir, "state");
  sl_tuple records[10];
  for (uint64_t i = 0; i < 10; i++)
    records[i] = (sl_tuple){.key = i, .value = i};
  sl_job *job = build_memory(state, records, 10, "t", SL_STORE_REFUSE);
  cr_assert_eq(run_guarded(job, "small job"), 0, "%s", sl_job_error(job));
  rc = sl_table_open(state, &reader, err, sizeof err);
  cr_assert_eq(rc, SL_ESTORE);
  cr_assert(strstr(err, "already open in this process") != 0, "%s", err);
  cr_assert_eq(sl_job_table_reader(job, &reader), 0);
  void *value;
  uint32_t bytes;
  cr_assert_eq(sl_table_get(reader, "bad name", "k", 1, &value, &bytes),
               EINVAL);
  cr_assert(strstr(sl_table_error(reader), "table name \"bad name\"") != 0,
            "%s", sl_table_error(reader));
  char long_key[SL_TABLE_MAX_KEY + 1] = {0};
  cr_assert_eq(sl_table_get(reader, "t", long_key, sizeof long_key, &value,
                            &bytes), EINVAL);
  cr_assert(strstr(sl_table_error(reader), "471 bytes is too long") != 0,
            "%s", sl_table_error(reader));
  cr_assert_eq(sl_table_foreach(reader, "t", 0, 0), EINVAL);
  sl_table_close(reader);
  sl_job_destroy(job);
  free(state);
  sl_test_remove_tree(dir);
}

/* ------------------------------------------------------------ the store */

typedef struct row_list {
  uint64_t rows;
  char keys[64][16];
  char values[64][16];
} row_list;

static int list_row(void *arg, const void *key, uint32_t key_bytes,
                    const void *value, uint32_t value_bytes) {
  row_list *l = arg;
  cr_assert_lt(l->rows, 64);
  cr_assert_lt(key_bytes, 16);
  cr_assert_lt(value_bytes, 16);
  memcpy(l->keys[l->rows], key, key_bytes);
  l->keys[l->rows][key_bytes] = 0;
  memcpy(l->values[l->rows], value, value_bytes);
  l->values[l->rows][value_bytes] = 0;
  l->rows++;
  return 0;
}

/* "k1=v1,k2=v2" of table, and its count checked. */
static void expect_rows(sl_store *st, const char *table, const char *want) {
  row_list l = {0};
  char err[512] = "";
  cr_assert_eq(sl_store_table_scan(st, table, list_row, &l, err, sizeof err),
               0, "%s", err);
  char got[1024] = "";
  for (uint64_t i = 0; i < l.rows; i++)
    snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s=%s",
             i ? "," : "", l.keys[i], l.values[i]);
  cr_assert_str_eq(got, want, "table %s", table);
  uint64_t rows = 99;
  cr_assert_eq(sl_store_table_count(st, table, &rows, err, sizeof err), 0,
               "%s", err);
  cr_assert_eq(rows, l.rows, "count of %s", table);
}

static void put(sl_store_txn *txn, int table, const char *key,
                const char *value) {
  int rc = sl_store_put_row(txn, table, key, (uint32_t)strlen(key), value,
                            (uint32_t)strlen(value));
  cr_assert_eq(rc, 0);
}

static int fail_third_put(void *arg, enum sl_store_call call) {
  int *puts = arg;
  return call == SL_STORE_CALL_PUT && ++*puts == 3 ? EIO : 0;
}

Test(table, store_tables_commit_with_checkpoints_and_survive_compaction) {
  char *dir = sl_test_temp_dir("table");
  sl_store_options o = {.graph_fingerprint = "table test", .no_sync = 1};
  sl_store *st;
  char err[512];
  cr_assert_eq(sl_store_open(dir, &o, &st, err, sizeof err), 0, "%s", err);
  sl_store_txn *txn;
  int a, b, again;
  cr_assert_eq(sl_store_begin(st, &txn), 0);
  cr_assert_eq(sl_store_txn_table(txn, "a", &a), 0);
  cr_assert_eq(sl_store_txn_table(txn, "b", &b), 0);
  cr_assert_eq(sl_store_txn_table(txn, "a", &again), 0);
  cr_assert_eq(again, a);
  cr_assert_eq(sl_store_txn_table(txn, "no good", &again), EINVAL);
  put(txn, a, "k1", "v1");
  put(txn, a, "k2", "v2");
  put(txn, a, "k1", "v1b"); /* replaced in the same transaction */
  put(txn, b, "k1", "other");
  cr_assert_eq(sl_store_delete_row(txn, a, "k9", 2), 0); /* absent */
  for (int i = 0; i < 5000; i++) { /* keyed state, to compact later */
    uint8_t key[12] = {0};
    memcpy(key, &i, sizeof i);
    cr_assert_eq(sl_store_put_state(txn, 1, 0, key, sizeof key, "s", 1), 0);
  }
  /* Before the commit nothing is visible to reads. */
  expect_rows(st, "a", "");
  cr_assert_eq(sl_store_commit(txn, 1, "r", 1), 0, "%s", sl_store_error(st));
  expect_rows(st, "a", "k1=v1b,k2=v2");
  expect_rows(st, "b", "k1=other");

  /* A failed transaction (an injected put fault) changes nothing. */
  int puts = 0;
  sl_store_set_fault(st, fail_third_put, &puts);
  cr_assert_eq(sl_store_begin(st, &txn), 0);
  cr_assert_eq(sl_store_txn_table(txn, "a", &a), 0);
  put(txn, a, "k3", "v3");
  cr_assert_eq(sl_store_delete_row(txn, a, "k1", 2), 0);
  cr_assert_eq(sl_store_put_row(txn, a, "k4", 2, "v4", 2), EIO);
  cr_assert_eq(sl_store_commit(txn, 2, "r", 1), EIO);
  sl_store_set_fault(st, 0, 0);
  expect_rows(st, "a", "k1=v1b,k2=v2");
  /* An aborted one neither. */
  cr_assert_eq(sl_store_begin(st, &txn), 0);
  cr_assert_eq(sl_store_txn_table(txn, "a", &a), 0);
  put(txn, a, "k5", "v5");
  sl_store_abort(txn);
  expect_rows(st, "a", "k1=v1b,k2=v2");

  /* Deletes and replacements keep the count right. */
  cr_assert_eq(sl_store_begin(st, &txn), 0);
  cr_assert_eq(sl_store_txn_table(txn, "a", &a), 0);
  cr_assert_eq(sl_store_delete_row(txn, a, "k1", 2), 0);
  put(txn, a, "k2", "v2b");
  put(txn, a, "k3", "v3");
  put(txn, a, "", "empty key");
  cr_assert_eq(sl_store_commit(txn, 2, "r", 1), 0, "%s", sl_store_error(st));
  expect_rows(st, "a", "=empty key,k2=v2b,k3=v3");

  /* Compaction merges the keyed state and leaves the tables alone. */
  sl_store_compaction stats;
  cr_assert_eq(sl_store_compact(st, 0, &stats), 0, "%s", sl_store_error(st));
  cr_assert_eq(stats.entries_written, 5000);
  expect_rows(st, "a", "=empty key,k2=v2b,k3=v3");
  expect_rows(st, "b", "k1=other");
  void *value;
  uint32_t bytes;
  cr_assert_eq(sl_store_table_get(st, "a", "k3", 2, &value, &bytes, err,
                                  sizeof err), 0, "%s", err);
  cr_assert_eq(bytes, 2);
  cr_assert_eq(memcmp(value, "v3", 2), 0);
  free(value);
  uint64_t latest = 0;
  cr_assert_eq(sl_store_read_latest(st, &latest, err, sizeof err), 0);
  cr_assert_eq(latest, 2);

  /* A wipe empties them, counts too. */
  cr_assert_eq(sl_store_wipe(st), 0, "%s", sl_store_error(st));
  expect_rows(st, "a", "");
  expect_rows(st, "b", "");
  sl_store_close(st);
  sl_test_remove_tree(dir);
}

/* Raw LMDB access to the "tables" database of a store in dir. */
static void raw_tables(const char *dir, void (*fn)(MDB_txn *, MDB_dbi)) {
  MDB_env *env;
  cr_assert_eq(mdb_env_create(&env), 0);
  cr_assert_eq(mdb_env_set_maxdbs(env, 8), 0);
  cr_assert_eq(mdb_env_open(env, dir, 0, 0644), 0);
  MDB_txn *txn;
  MDB_dbi dbi;
  cr_assert_eq(mdb_txn_begin(env, 0, 0, &txn), 0);
  cr_assert_eq(mdb_dbi_open(txn, "tables", 0, &dbi), 0);
  fn(txn, dbi);
  cr_assert_eq(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
}

/* Flip a byte of the value of row "key" of table "a". */
static void corrupt_row(MDB_txn *txn, MDB_dbi dbi) {
  uint8_t key[] = {1, 'a', 'k', 'e', 'y'};
  MDB_val k = {sizeof key, key}, v;
  cr_assert_eq(mdb_get(txn, dbi, &k, &v), 0);
  uint8_t copy[64];
  cr_assert_leq(v.mv_size, sizeof copy);
  memcpy(copy, v.mv_data, v.mv_size);
  copy[0] ^= 1;
  MDB_val w = {v.mv_size, copy};
  cr_assert_eq(mdb_put(txn, dbi, &k, &w, 0), 0);
}

/* Remove the database: a store as made before tables existed. */
static void drop_tables(MDB_txn *txn, MDB_dbi dbi) {
  cr_assert_eq(mdb_drop(txn, dbi, 1), 0);
}

Test(table, store_reports_corrupt_rows_and_adds_tables_to_older_stores) {
  char *dir = sl_test_temp_dir("table");
  sl_store_options o = {.graph_fingerprint = "table test", .no_sync = 1};
  sl_store *st;
  char err[512];
  cr_assert_eq(sl_store_open(dir, &o, &st, err, sizeof err), 0, "%s", err);
  sl_store_txn *txn;
  int a;
  cr_assert_eq(sl_store_begin(st, &txn), 0);
  cr_assert_eq(sl_store_txn_table(txn, "a", &a), 0);
  put(txn, a, "key", "value");
  cr_assert_eq(sl_store_commit(txn, 1, "r", 1), 0);
  sl_store_close(st);

  raw_tables(dir, corrupt_row);
  sl_store_options ro = {.read_only = 1};
  cr_assert_eq(sl_store_open(dir, &ro, &st, err, sizeof err), 0, "%s", err);
  void *value;
  uint32_t bytes;
  cr_assert_eq(sl_store_table_get(st, "a", "key", 3, &value, &bytes, err,
                                  sizeof err), SL_ECORRUPT);
  cr_assert(strstr(err, "table \"a\" key 6b6579 (3 bytes): value fails its "
                        "checksum") != 0, "%s", err);
  row_list l = {0};
  cr_assert_eq(sl_store_table_scan(st, "a", list_row, &l, err, sizeof err),
               SL_ECORRUPT);
  sl_store_close(st);

  raw_tables(dir, drop_tables);
  cr_assert_eq(sl_store_open(dir, &ro, &st, err, sizeof err), 0, "%s", err);
  expect_rows(st, "a", ""); /* read-only: no tables database, all empty */
  cr_assert_eq(sl_store_table_get(st, "a", "key", 3, &value, &bytes, err,
                                  sizeof err), SL_ENOTFOUND);
  sl_store_close(st);
  cr_assert_eq(sl_store_open(dir, &o, &st, err, sizeof err), 0, "%s", err);
  cr_assert_eq(sl_store_begin(st, &txn), 0); /* the writer added it */
  cr_assert_eq(sl_store_txn_table(txn, "a", &a), 0);
  put(txn, a, "new", "row");
  cr_assert_eq(sl_store_commit(txn, 2, "r", 1), 0, "%s", sl_store_error(st));
  expect_rows(st, "a", "new=row");
  sl_store_close(st);
  sl_test_remove_tree(dir);
}
