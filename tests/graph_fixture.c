/* graph_fixture.c — the shared helpers of the graph and runtime tests
 * (graph_fixture.h says what they are and how the tests use them). */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_fixture.h"
#include "sluice.h"
#include "test_util.h"

/* ------------------------------------------------------------ helpers */

/* Jobs made by job_new() and not yet freed by job_free(): a test that
 * fails an assertion leaves its job here, and the suites' fini frees it, so
 * LeakSanitizer reports only real leaks.  Assertions on a job run after
 * sl_job_wait() returned, so a left-over job has no threads running. */
#define MAX_LIVE_JOBS 8
static sl_job *live_jobs[MAX_LIVE_JOBS];

sl_job *job_new(const sl_job_config *config) {
  sl_job *job = 0;
  int rc = sl_job_create(config, &job);
  cr_assert_eq(rc, 0, "sl_job_create: %s", sl_strerror(rc));
  cr_assert_not_null(job);
  for (int i = 0; i < MAX_LIVE_JOBS; i++)
    if (!live_jobs[i]) {
      live_jobs[i] = job;
      return job;
    }
  cr_assert_fail("more than %d live jobs in one test", MAX_LIVE_JOBS);
  return 0;
}

void job_free(sl_job *job) {
  for (int i = 0; i < MAX_LIVE_JOBS; i++)
    if (live_jobs[i] == job)
      live_jobs[i] = 0;
  sl_job_destroy(job);
}

void free_leftover_jobs(void) {
  for (int i = 0; i < MAX_LIVE_JOBS; i++) {
    sl_job_destroy(live_jobs[i]);
    live_jobs[i] = 0;
  }
}

/* Start job, wait for it under a watchdog, and return sl_job_wait's
 * status.  Fails the test if the watchdog had to stop the job. */
int run_guarded(sl_job *job, double limit_s) {
  int rc = sl_job_start(job);
  if (rc)
    return rc;
  sl_test_watchdog dog;
  cr_assert_eq(sl_test_watchdog_arm(&dog, job, limit_s, "the job"), 0);
  rc = sl_job_wait(job);
  cr_assert(!sl_test_watchdog_disarm(&dog),
            "the job hung: stopped by the watchdog after %.0f s (wait "
            "returned %d)",
            limit_s, rc);
  return rc;
}

void assert_checksum_eq(const sl_checksum *got, const sl_checksum *want,
                        const char *what) {
  cr_assert_eq(got->records, want->records,
               "%s: %" PRIu64 " records, expected %" PRIu64, what,
               got->records, want->records);
  cr_assert_eq(got->bytes, want->bytes,
               "%s: %" PRIu64 " bytes, expected %" PRIu64, what, got->bytes,
               want->bytes);
  cr_assert_eq(got->value_sum, want->value_sum,
               "%s: value sum %" PRIu64 ", expected %" PRIu64, what,
               got->value_sum, want->value_sum);
  cr_assert_eq(got->hash_sum, want->hash_sum,
               "%s: hash sum differs (same count, different records)", what);
}

void assert_error_has(const sl_job *job, const char *needle) {
  const char *error = sl_job_error(job);
  cr_assert_not_null(error);
  cr_assert(strstr(error, needle) != 0, "sl_job_error '%s' lacks '%s'", error,
            needle);
}

/* A refused builder or validate call: SL_EGRAPH and a message. */
void assert_refused(const sl_job *job, int rc, const char *needle,
                    const char *what) {
  cr_assert_eq(rc, SL_EGRAPH, "%s: returned %d (%s), expected SL_EGRAPH", what,
               rc, sl_strerror(rc));
  const char *error = sl_job_error(job);
  cr_assert(strstr(error, needle) != 0, "%s: error '%s' lacks '%s'", what,
            error, needle);
}

sl_tuple tuple_of(const sl_record *in) {
  sl_tuple t = {0, 0};
  if (in->size_bytes >= sizeof t)
    memcpy(&t, in->data, sizeof t);
  return t;
}

uint64_t tuple_key(void *user, const sl_record *in) {
  (void)user;
  return tuple_of(in).key;
}

void get_stats(const sl_job *job, int i, sl_op_stats *stats) {
  int rc = sl_job_stats(job, i, stats);
  cr_assert_eq(rc, 0, "sl_job_stats(%d): %s", i, sl_strerror(rc));
}

/* --------------------------------------------- lifecycle bookkeeping */

/* Each of the first p instances saw open/close/finish the given times. */
void assert_lifecycle(const lifecycle *life, int p, int opens,
                      int closes, int finishes, const char *what) {
  for (int i = 0; i < p; i++) {
    cr_assert_eq(atomic_load(&life->open[i]), opens,
                 "%s[%d]: open called %d times, expected %d", what, i,
                 atomic_load(&life->open[i]), opens);
    cr_assert_eq(atomic_load(&life->close[i]), closes,
                 "%s[%d]: close called %d times, expected %d", what, i,
                 atomic_load(&life->close[i]), closes);
    cr_assert_eq(atomic_load(&life->finish[i]), finishes,
                 "%s[%d]: finish called %d times, expected %d", what, i,
                 atomic_load(&life->finish[i]), finishes);
  }
}

static void capture_thread_name(char name[16]) {
  if (pthread_getname_np(pthread_self(), name, 16) != 0)
    strcpy(name, "?");
}

/* ------------------------------------------------------ range source */

typedef struct range_state {
  range_spec *spec;
  int instance;
  uint64_t next;
  uint64_t end;
} range_state;

static sl_tuple range_tuple(const range_spec *spec, uint64_t index) {
  sl_tuple t = {.key = spec->key_count ? index % spec->key_count : index,
                .value = spec->value_start + spec->value_step * index};
  return t;
}

static int range_open(sl_ctx *ctx, void *user, void **state) {
  range_spec *spec = user;
  int i = sl_ctx_instance(ctx);
  int p = sl_ctx_parallelism(ctx);
  if (i < 0 || i >= p || p > MAX_P) {
    atomic_fetch_add(&spec->bad_ctx, 1);
    return -EINVAL;
  }
  atomic_fetch_add(&spec->life.open[i], 1);
  if (spec->capture_names)
    capture_thread_name(spec->names[i]);
  if (spec->open_status) {
    if (spec->open_cause)
      sl_ctx_fail(ctx, "%s", spec->open_cause);
    return spec->open_status;
  }
  range_state *s = calloc(1, sizeof *s);
  if (!s)
    return -ENOMEM;
  s->spec = spec;
  s->instance = i;
  /* Counts stay far below 2^32, so the products do not overflow. */
  s->next = spec->count * (uint64_t)i / (uint64_t)p;
  s->end = spec->count * (uint64_t)(i + 1) / (uint64_t)p;
  *state = s;
  return 0;
}

static int range_next(sl_ctx *ctx, void *state) {
  range_state *s = state;
  range_spec *spec = s->spec;
  if (sl_ctx_instance(ctx) != s->instance)
    atomic_fetch_add(&spec->bad_ctx, 1);
  if (spec->idle) {
    sl_test_sleep_us(1000);
    return 0;
  }
  for (unsigned k = 0; k < SOURCE_BATCH && (spec->endless || s->next < s->end);
       k++, s->next++) {
    sl_tuple t = range_tuple(spec, s->next);
    int rc = spec->with_ts
                 ? sl_emit_ts(ctx, &t, sizeof t,
                              TS_BASE + TS_STEP * (int64_t)s->next)
                 : sl_emit(ctx, &t, sizeof t);
    if (rc) {
      if (rc != SL_ESTOPPED)
        atomic_fetch_add(&spec->emit_errors, 1);
      return rc;
    }
  }
  if (spec->endless || s->next < s->end)
    return 0;
  if (spec->hold_open) {
    sl_test_sleep_us(1000);
    return 0;
  }
  return SL_SOURCE_END;
}

static void range_close(sl_ctx *ctx, void *state) {
  range_state *s = state;
  if (sl_ctx_instance(ctx) != s->instance)
    atomic_fetch_add(&s->spec->bad_ctx, 1);
  atomic_fetch_add(&s->spec->life.close[s->instance], 1);
  free(s);
}

static const sl_source_ops range_ops = {
    .open = range_open, .next = range_next, .close = range_close};

sl_op *add_range(sl_job *job, const char *name, int parallelism,
                 range_spec *spec) {
  sl_op *op = 0;
  OK(job, sl_op_source(job, name, parallelism, &range_ops, spec, &op));
  return op;
}

/* The checksum of every record of a (bounded) range source. */
void range_expect(sl_checksum *sum, const range_spec *spec) {
  for (uint64_t i = 0; i < spec->count; i++) {
    sl_tuple t = range_tuple(spec, i);
    sl_checksum_add(sum, &t, sizeof t);
  }
}

/* ------------------------------------------------------ relay process */

typedef struct relay_state {
  relay_spec *spec;
  int instance;
  uint64_t records;
} relay_state;

void relay_init(relay_spec *spec) {
  memset(spec, 0, sizeof *spec);
  spec->fail_instance = -1;
  atomic_init(&spec->emit_status_process, 1);
  atomic_init(&spec->emit_status_finish, 1);
}

static int relay_open(sl_ctx *ctx, void *user, void **state) {
  relay_spec *spec = user;
  int i = sl_ctx_instance(ctx);
  if (i < 0 || i >= sl_ctx_parallelism(ctx) || i >= MAX_P) {
    atomic_fetch_add(&spec->bad_ctx, 1);
    return -EINVAL;
  }
  atomic_fetch_add(&spec->life.open[i], 1);
  if (spec->capture_names)
    capture_thread_name(spec->names[i]);
  if (spec->open_sleep_us)
    sl_test_sleep_us(spec->open_sleep_us);
  relay_state *s = calloc(1, sizeof *s);
  if (!s)
    return -ENOMEM;
  s->spec = spec;
  s->instance = i;
  *state = s;
  return 0;
}

static int relay_process(sl_ctx *ctx, void *state, int input,
                         const sl_record *in) {
  relay_state *s = state;
  relay_spec *spec = s->spec;
  if (sl_ctx_instance(ctx) != s->instance || input != 0)
    atomic_fetch_add(&spec->bad_ctx, 1);
  s->records++;
  if (spec->sleep_us)
    sl_test_sleep_us(spec->sleep_us);
  if (s->instance == spec->fail_instance && s->records == spec->fail_at) {
    sl_tuple t = tuple_of(in);
    if (spec->fail_cause)
      sl_ctx_fail(ctx, "%s (value %" PRIu64 ")", spec->fail_cause, t.value);
    return spec->fail_status;
  }
  if (spec->try_emit && s->records == 1)
    atomic_store(&spec->emit_status_process,
                 sl_emit(ctx, in->data, in->size_bytes));
  if (spec->forward)
    return sl_emit(ctx, in->data, in->size_bytes);
  return 0;
}

static int relay_finish(sl_ctx *ctx, void *state) {
  relay_state *s = state;
  if (sl_ctx_instance(ctx) != s->instance)
    atomic_fetch_add(&s->spec->bad_ctx, 1);
  atomic_fetch_add(&s->spec->life.finish[s->instance], 1);
  if (s->spec->try_emit) {
    sl_tuple t = {1, 2};
    atomic_store(&s->spec->emit_status_finish, sl_emit(ctx, &t, sizeof t));
  }
  return 0;
}

static void relay_close(sl_ctx *ctx, void *state) {
  relay_state *s = state;
  if (sl_ctx_instance(ctx) != s->instance)
    atomic_fetch_add(&s->spec->bad_ctx, 1);
  atomic_fetch_add(&s->spec->life.close[s->instance], 1);
  atomic_fetch_add(&s->spec->records, s->records);
  free(s);
}

const sl_process_ops relay_ops = {.open = relay_open,
                                         .process = relay_process,
                                         .finish = relay_finish,
                                         .close = relay_close};

/* ------------------------------------------------------ map and filter */

/* {key, v} -> {key, 3v + 1} */
int triple_plus_one(void *user, const sl_record *in, void *out,
                    uint32_t *out_size_bytes) {
  (void)user;
  if (in->size_bytes != sizeof(sl_tuple))
    return -EINVAL;
  sl_tuple t = tuple_of(in);
  t.value = 3 * t.value + 1;
  memcpy(out, &t, sizeof t);
  *out_size_bytes = sizeof t;
  return 0;
}

int keep_even_value(void *user, const sl_record *in) {
  (void)user;
  return tuple_of(in).value % 2 == 0;
}

int copy_map(void *user, const sl_record *in, void *out,
             uint32_t *out_size_bytes) {
  (void)user;
  memcpy(out, in->data, in->size_bytes);
  *out_size_bytes = in->size_bytes;
  return 0;
}

int keep_all(void *user, const sl_record *in) {
  (void)user;
  (void)in;
  return 1;
}

int echo_flat_map(void *user, const sl_record *in, sl_ctx *ctx) {
  (void)user;
  return sl_emit(ctx, in->data, in->size_bytes);
}

/* ------------------------------------------------------ keyed consumer */

typedef struct keyed_state {
  keyed_spec *spec;
  int instance;
  uint64_t records;
  uint64_t *last; /* key_count entries, UINT64_MAX: none yet */
} keyed_state;

void keyed_init(keyed_spec *spec, uint64_t key_count, bool order) {
  memset(spec, 0, sizeof *spec);
  cr_assert_leq(key_count, KEYED_MAX_KEYS);
  spec->key_count = key_count;
  spec->check_order = order;
  for (int k = 0; k < KEYED_MAX_KEYS; k++)
    atomic_init(&spec->owner[k], -1);
}

static int keyed_open(sl_ctx *ctx, void *user, void **state) {
  keyed_spec *spec = user;
  keyed_state *s = calloc(1, sizeof *s);
  if (!s)
    return -ENOMEM;
  s->spec = spec;
  s->instance = sl_ctx_instance(ctx);
  s->last = malloc(sizeof(uint64_t) * spec->key_count);
  if (!s->last) {
    free(s);
    return -ENOMEM;
  }
  for (uint64_t k = 0; k < spec->key_count; k++)
    s->last[k] = UINT64_MAX;
  *state = s;
  return 0;
}

/* The key a keyed consumer checks. */
static uint64_t keyed_key_of(const keyed_spec *spec, const sl_tuple *t) {
  return spec->key_is_residue ? t->value % REKEY_COUNT : t->key;
}

static int keyed_process(sl_ctx *ctx, void *state, int input,
                         const sl_record *in) {
  (void)ctx;
  (void)input;
  keyed_state *s = state;
  keyed_spec *spec = s->spec;
  sl_tuple t = tuple_of(in);
  uint64_t key = keyed_key_of(spec, &t);
  s->records++;
  if (key >= spec->key_count) {
    atomic_fetch_add(&spec->bad_keys, 1);
    return 0;
  }
  int expected = -1;
  if (!atomic_compare_exchange_strong(&spec->owner[key], &expected,
                                      s->instance) &&
      expected != s->instance)
    atomic_fetch_add(&spec->conflicts, 1);
  if (spec->check_order) {
    if (s->last[key] != UINT64_MAX && t.value <= s->last[key])
      atomic_fetch_add(&spec->out_of_order, 1);
    s->last[key] = t.value;
  }
  return 0;
}

static void keyed_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  keyed_state *s = state;
  atomic_fetch_add(&s->spec->records, s->records);
  if (s->instance >= 0 && s->instance < MAX_P)
    atomic_fetch_add(&s->spec->per_instance[s->instance], s->records);
  free(s->last);
  free(s);
}

const sl_process_ops keyed_ops = {
    .open = keyed_open, .process = keyed_process, .close = keyed_close};

uint64_t rekey_value(void *user, const sl_record *in) {
  (void)user;
  return tuple_of(in).value % REKEY_COUNT;
}

/* Every key seen by exactly one instance, the one sl_key_instance names. */
void assert_key_ownership(keyed_spec *spec, uint32_t max_parallelism,
                          int parallelism) {
  cr_assert_eq(atomic_load(&spec->bad_keys), 0);
  cr_assert_eq(atomic_load(&spec->conflicts), 0,
               "%" PRIu64 " records of a key reached a second instance",
               (uint64_t)atomic_load(&spec->conflicts));
  for (uint64_t k = 0; k < spec->key_count; k++) {
    int owner = atomic_load(&spec->owner[k]);
    int want = sl_key_instance(k, max_parallelism, parallelism);
    cr_assert_eq(owner, want,
                 "key %" PRIu64 " went to instance %d, sl_key_instance says %d",
                 k, owner, want);
  }
}
