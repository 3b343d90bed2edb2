/* test_graph.c — Criterion tests of the job graph API and the runtime
 * (include/sluice.h, engine/graph.c, engine/runtime.c, operators/builtin.c).
 *
 * Every test builds a real job and runs it on real threads.  Results are
 * checked against values computed independently in the test (closed forms,
 * or sl_checksum_add() over the records the test knows were sent), so a
 * lost, duplicated or altered record shows up as a differing checksum.
 *
 * Callbacks never call Criterion: they count what they see in atomics (in a
 * spec struct the test owns), and the test's main thread asserts after the
 * run.  Runs go through run_guarded(), whose watchdog stops a hung job and
 * fails the test with a clear message instead of waiting for Criterion's
 * timeout.
 *
 * Edges whose producer has a larger parallelism than their consumer
 * (rebalance P -> Q with P > Q) are only used by the tests that are about
 * them (pipeline::rebalance_*), so that a defect there shows up in those
 * tests alone.
 *
 * SLUICE_TEST_SCALE=n divides record counts by n (sanitizer builds: 10).
 * The tests run one at a time (main() sets jobs = 1): several of them
 * measure how promptly a job stops, and two 16-thread jobs sharing the two
 * cores of a development machine would turn that into noise.
 */
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

#include "sluice.h"
#include "sluice_testing.h" /* unstable test helpers */
#include "test_util.h"

/* Largest parallelism whose instances a spec tracks one by one. */
#define MAX_P 16
/* Timestamps given by sources that set them: TS_BASE + TS_STEP * index. */
#define TS_BASE 1000
#define TS_STEP 7
/* Records a custom source emits per next() call. */
#define SOURCE_BATCH 256u
/* Default seconds a run may take before the watchdog stops it. */
#define RUN_LIMIT_S 20.0

/* ------------------------------------------------------------ helpers */

/* Assert that a call returned 0, naming the call and the job's error. */
#define OK(job, call)                                                         \
  do {                                                                        \
    int ok_rc_ = (call);                                                      \
    cr_assert_eq(ok_rc_, 0, "%s returned %d (%s): %s", #call, ok_rc_,         \
                 sl_strerror(ok_rc_), sl_job_error(job));                     \
  } while (0)

/* Jobs made by job_new() and not yet freed by job_free(): a test that
 * fails an assertion leaves its job here, and the suites' fini frees it, so
 * LeakSanitizer reports only real leaks.  Assertions on a job run after
 * sl_job_wait() returned, so a left-over job has no threads running. */
#define MAX_LIVE_JOBS 8
static sl_job *live_jobs[MAX_LIVE_JOBS];

static sl_job *job_new(const sl_job_config *config) {
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

static void job_free(sl_job *job) {
  for (int i = 0; i < MAX_LIVE_JOBS; i++)
    if (live_jobs[i] == job)
      live_jobs[i] = 0;
  sl_job_destroy(job);
}

static void free_leftover_jobs(void) {
  for (int i = 0; i < MAX_LIVE_JOBS; i++) {
    sl_job_destroy(live_jobs[i]);
    live_jobs[i] = 0;
  }
}

TestSuite(pipeline, .fini = free_leftover_jobs);
TestSuite(ordering, .fini = free_leftover_jobs);
TestSuite(fanout, .fini = free_leftover_jobs);
TestSuite(keyby, .fini = free_leftover_jobs);
TestSuite(union_op, .fini = free_leftover_jobs);
TestSuite(two_input, .fini = free_leftover_jobs);
TestSuite(records, .fini = free_leftover_jobs);
TestSuite(lifecycle, .fini = free_leftover_jobs);
TestSuite(errors, .fini = free_leftover_jobs);
TestSuite(stop, .fini = free_leftover_jobs);
TestSuite(validate, .fini = free_leftover_jobs);
TestSuite(config, .fini = free_leftover_jobs);
TestSuite(oversubscribed, .fini = free_leftover_jobs);
TestSuite(emit, .fini = free_leftover_jobs);
TestSuite(names, .fini = free_leftover_jobs);

/* Start job, wait for it under a watchdog, and return sl_job_wait's
 * status.  Fails the test if the watchdog had to stop the job. */
static int run_guarded(sl_job *job, double limit_s) {
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

static void assert_checksum_eq(const sl_checksum *got, const sl_checksum *want,
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

static void assert_error_has(const sl_job *job, const char *needle) {
  const char *error = sl_job_error(job);
  cr_assert_not_null(error);
  cr_assert(strstr(error, needle) != 0, "sl_job_error '%s' lacks '%s'", error,
            needle);
}

/* A refused builder or validate call: SL_EGRAPH and a message. */
static void assert_refused(const sl_job *job, int rc, const char *needle,
                           const char *what) {
  cr_assert_eq(rc, SL_EGRAPH, "%s: returned %d (%s), expected SL_EGRAPH", what,
               rc, sl_strerror(rc));
  const char *error = sl_job_error(job);
  cr_assert(strstr(error, needle) != 0, "%s: error '%s' lacks '%s'", what,
            error, needle);
}

static sl_tuple tuple_of(const sl_record *in) {
  sl_tuple t = {0, 0};
  if (in->size_bytes >= sizeof t)
    memcpy(&t, in->data, sizeof t);
  return t;
}

static uint64_t tuple_key(void *user, const sl_record *in) {
  (void)user;
  return tuple_of(in).key;
}

static void get_stats(const sl_job *job, int i, sl_op_stats *stats) {
  int rc = sl_job_stats(job, i, stats);
  cr_assert_eq(rc, 0, "sl_job_stats(%d): %s", i, sl_strerror(rc));
}

/* --------------------------------------------- lifecycle bookkeeping */

typedef struct lifecycle {
  atomic_int open[MAX_P];
  atomic_int close[MAX_P];
  atomic_int finish[MAX_P];
} lifecycle;

/* Each of the first p instances saw open/close/finish the given times. */
static void assert_lifecycle(const lifecycle *life, int p, int opens,
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

/* A source of sl_tuple {key, value} for index 0 .. count-1, split into
 * contiguous ranges per instance like sl_source_sequence:
 * key = index % key_count (index when key_count is 0),
 * value = value_start + value_step * index,
 * timestamp TS_BASE + TS_STEP * index when with_ts. */
typedef struct range_spec {
  uint64_t count;
  uint64_t value_start;
  uint64_t value_step;
  uint64_t key_count;
  bool with_ts;
  bool endless;        /* never end; count is ignored */
  bool idle;           /* emit nothing, sleep 1 ms per next() */
  bool hold_open;      /* after the last record: idle instead of ending */
  int open_status;     /* nonzero: open fails with it */
  const char *open_cause; /* given to sl_ctx_fail when open fails */
  bool capture_names;
  lifecycle life;
  atomic_int emit_errors; /* sl_emit results other than 0 and SL_ESTOPPED */
  atomic_int bad_ctx;     /* ctx reports that do not fit the state */
  char names[MAX_P][16];
} range_spec;

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

static sl_op *add_range(sl_job *job, const char *name, int parallelism,
                        range_spec *spec) {
  sl_op *op = 0;
  OK(job, sl_op_source(job, name, parallelism, &range_ops, spec, &op));
  return op;
}

/* The checksum of every record of a (bounded) range source. */
static void range_expect(sl_checksum *sum, const range_spec *spec) {
  for (uint64_t i = 0; i < spec->count; i++) {
    sl_tuple t = range_tuple(spec, i);
    sl_checksum_add(sum, &t, sizeof t);
  }
}

/* ------------------------------------------------------ relay process */

/* A process operator (or sink) that counts its lifecycle calls and
 * records, optionally forwards every record, sleeps, or fails. */
typedef struct relay_spec {
  bool forward;       /* emit every record unchanged */
  uint64_t sleep_us;  /* per record */
  uint64_t open_sleep_us; /* in open, before returning */
  int fail_instance;  /* instance that fails, -1 none (set by relay_init) */
  uint64_t fail_at;   /* that instance's record (1-based) it fails on */
  int fail_status;
  const char *fail_cause;
  bool capture_names;
  bool try_emit;      /* a sink: call sl_emit and remember its status */
  lifecycle life;
  atomic_ullong records;
  atomic_int bad_ctx;
  atomic_int emit_status_process; /* try_emit: what sl_emit returned */
  atomic_int emit_status_finish;
  char names[MAX_P][16];
} relay_spec;

typedef struct relay_state {
  relay_spec *spec;
  int instance;
  uint64_t records;
} relay_state;

static void relay_init(relay_spec *spec) {
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

static const sl_process_ops relay_ops = {.open = relay_open,
                                         .process = relay_process,
                                         .finish = relay_finish,
                                         .close = relay_close};

/* ------------------------------------------------------ map and filter */

/* {key, v} -> {key, 3v + 1} */
static int triple_plus_one(void *user, const sl_record *in, void *out,
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

static int keep_even_value(void *user, const sl_record *in) {
  (void)user;
  return tuple_of(in).value % 2 == 0;
}

static int copy_map(void *user, const sl_record *in, void *out,
                    uint32_t *out_size_bytes) {
  (void)user;
  memcpy(out, in->data, in->size_bytes);
  *out_size_bytes = in->size_bytes;
  return 0;
}

static int keep_all(void *user, const sl_record *in) {
  (void)user;
  (void)in;
  return 1;
}

static int echo_flat_map(void *user, const sl_record *in, sl_ctx *ctx) {
  (void)user;
  return sl_emit(ctx, in->data, in->size_bytes);
}

/* =================================================== 1. linear pipeline */

/* numbers -> triple (3v+1) -> even -> checksum, with the given
 * parallelisms.  Values v = 0 .. n-1; 3v+1 is even exactly for odd v. */
static void run_linear(int p_source, int p_map, int p_filter, int p_sink,
                       uint64_t n) {
  sl_job *job = job_new(0);
  sl_op *src, *map, *filter, *sink;
  sl_checksum got = {0};
  OK(job, sl_source_sequence(job, "numbers", p_source, n, 0, &src));
  OK(job, sl_op_map(job, "triple", src, p_map, sizeof(sl_tuple),
                    triple_plus_one, 0, &map));
  OK(job, sl_op_filter(job, "even", map, p_filter, keep_even_value, 0,
                       &filter));
  OK(job, sl_sink_checksum(job, "sum", filter, p_sink, &got, &sink));
  cr_assert_eq(sl_job_operator_count(job), 4);
  int rc = run_guarded(job, RUN_LIMIT_S);
  cr_assert_eq(rc, 0, "run: %s: %s", sl_strerror(rc), sl_job_error(job));

  /* Closed form: odd v < n are n/2 values whose sum is (n/2)^2. */
  uint64_t odd = n / 2;
  cr_assert_eq(got.records, odd, "records %" PRIu64 ", expected %" PRIu64,
               got.records, odd);
  cr_assert_eq(got.bytes, odd * sizeof(sl_tuple));
  cr_assert_eq(got.value_sum, 3 * odd * odd + odd);
  sl_checksum want = {0};
  for (uint64_t v = 1; v < n; v += 2) {
    sl_tuple t = {.key = v, .value = 3 * v + 1};
    sl_checksum_add(&want, &t, sizeof t);
  }
  assert_checksum_eq(&got, &want, "sink");

  sl_op_stats stats;
  get_stats(job, 0, &stats);
  cr_assert_str_eq(stats.name, "numbers");
  cr_assert_eq(stats.parallelism, p_source);
  cr_assert_eq(stats.records_out, n);
  get_stats(job, 1, &stats);
  cr_assert_eq(stats.records_in, n);
  cr_assert_eq(stats.records_out, n);
  get_stats(job, 2, &stats);
  cr_assert_eq(stats.records_in, n);
  cr_assert_eq(stats.records_out, odd);
  get_stats(job, 3, &stats);
  cr_assert_str_eq(stats.name, "sum");
  cr_assert_eq(stats.records_in, odd);
  cr_assert_eq(sl_job_progress(job), n);
  job_free(job);
}

Test(pipeline, forward_parallelism_1, .timeout = 60) {
  run_linear(1, 1, 1, 1, sl_test_scaled(1000000, 1000));
}

Test(pipeline, forward_parallelism_2, .timeout = 60) {
  run_linear(2, 2, 2, 2, sl_test_scaled(1000000, 1000));
}

Test(pipeline, forward_parallelism_3, .timeout = 60) {
  run_linear(3, 3, 3, 3, sl_test_scaled(1000000, 1000));
}

/* Rebalance edges that widen: 1 -> 3 -> 3 -> 4. */
Test(pipeline, rebalance_widening_1_3_4, .timeout = 60) {
  run_linear(1, 3, 3, 4, sl_test_scaled(600000, 1000));
}

/* The shape the brief asks for: 1 -> 3 -> 2 (the map's 3 instances feed the
 * filter's 2 round-robin). */
Test(pipeline, rebalance_1_3_2, .timeout = 60) {
  run_linear(1, 3, 2, 2, sl_test_scaled(600000, 1000));
}

/* Narrowing to one consumer: 4 map instances feed 1 filter instance. */
Test(pipeline, rebalance_narrowing_4_1, .timeout = 60) {
  run_linear(2, 4, 1, 1, sl_test_scaled(600000, 1000));
}

/* ========================================================== 2. ordering */

typedef struct order_spec {
  atomic_ullong records;
  atomic_ullong out_of_order; /* value not above the previous one */
  atomic_ullong gaps;         /* value not the expected next one */
  atomic_ullong with_ts;      /* records that carried a timestamp */
} order_spec;

typedef struct order_state {
  order_spec *spec;
  uint64_t records, out_of_order, gaps, with_ts;
  uint64_t last;
} order_state;

static int order_open(sl_ctx *ctx, void *user, void **state) {
  (void)ctx;
  order_state *s = calloc(1, sizeof *s);
  if (!s)
    return -ENOMEM;
  s->spec = user;
  *state = s;
  return 0;
}

static int order_process(sl_ctx *ctx, void *state, int input,
                         const sl_record *in) {
  (void)ctx;
  (void)input;
  order_state *s = state;
  uint64_t v = tuple_of(in).value;
  if (s->records > 0 && v <= s->last)
    s->out_of_order++;
  if (v != 3 * s->records + 1) /* the stream 3i+1, i = 0, 1, ... */
    s->gaps++;
  if (in->timestamp != SL_NO_TIMESTAMP)
    s->with_ts++;
  s->last = v;
  s->records++;
  return 0;
}

static void order_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  order_state *s = state;
  atomic_fetch_add(&s->spec->records, s->records);
  atomic_fetch_add(&s->spec->out_of_order, s->out_of_order);
  atomic_fetch_add(&s->spec->gaps, s->gaps);
  atomic_fetch_add(&s->spec->with_ts, s->with_ts);
  free(s);
}

Test(ordering, parallelism_1_keeps_order, .timeout = 60) {
  uint64_t n = sl_test_scaled(1000000, 1000);
  sl_job *job = job_new(0);
  sl_op *src, *map, *sink;
  order_spec spec = {0};
  static const sl_process_ops ops = {
      .open = order_open, .process = order_process, .close = order_close};
  OK(job, sl_source_sequence(job, "numbers", 1, n, 0, &src));
  OK(job, sl_op_map(job, "triple", src, 1, sizeof(sl_tuple), triple_plus_one,
                    0, &map));
  OK(job, sl_op_sink(job, "ordered", map, 1, &ops, &spec, &sink));
  int rc = run_guarded(job, RUN_LIMIT_S);
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  cr_assert_eq(atomic_load(&spec.records), n);
  cr_assert_eq(atomic_load(&spec.out_of_order), 0,
               "%" PRIu64 " records arrived out of order",
               (uint64_t)atomic_load(&spec.out_of_order));
  cr_assert_eq(atomic_load(&spec.gaps), 0);
  cr_assert_eq(atomic_load(&spec.with_ts), 0,
               "the sequence source sets no timestamp");
  job_free(job);
}

/* ============================================================ 3. fan-out */

Test(fanout, one_source_two_sinks, .timeout = 60) {
  uint64_t n = sl_test_scaled(500000, 1000);
  sl_job *job = job_new(0);
  sl_op *src, *a, *b, *map, *c;
  sl_checksum got_a = {0}, got_b = {0}, got_c = {0};
  OK(job, sl_source_sequence(job, "numbers", 2, n, 10, &src));
  OK(job, sl_sink_checksum(job, "forward_sink", src, 2, &got_a, &a));
  OK(job, sl_sink_checksum(job, "rebalance_sink", src, 3, &got_b, &b));
  OK(job, sl_op_map(job, "triple", src, 2, sizeof(sl_tuple), triple_plus_one,
                    0, &map));
  OK(job, sl_sink_checksum(job, "mapped_sink", map, 2, &got_c, &c));
  int rc = run_guarded(job, RUN_LIMIT_S);
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  sl_checksum want = {0}, want_mapped = {0};
  for (uint64_t i = 0; i < n; i++) {
    sl_tuple t = {.key = i % 10, .value = i};
    sl_checksum_add(&want, &t, sizeof t);
    t.value = 3 * i + 1;
    sl_checksum_add(&want_mapped, &t, sizeof t);
  }
  assert_checksum_eq(&got_a, &want, "forward_sink");
  assert_checksum_eq(&got_b, &want, "rebalance_sink");
  assert_checksum_eq(&got_c, &want_mapped, "mapped_sink");
  sl_op_stats stats;
  get_stats(job, 0, &stats);
  cr_assert_eq(stats.records_out, n, "a fanned-out record counts once");
  job_free(job);
}

/* ============================================================= 4. key_by */

#define KEYED_MAX_KEYS 4096

/* What a keyed consumer saw: which instance owns each key, and per-key
 * order (per-instance last value arrays live in the instance state). */
typedef struct keyed_spec {
  uint64_t key_count;
  bool check_order;    /* one producer: values per key must increase */
  bool key_is_residue; /* the key is value % REKEY_COUNT, not tuple.key */
  atomic_int owner[KEYED_MAX_KEYS]; /* -1 until seen; then the instance */
  atomic_ullong records;
  atomic_ullong per_instance[MAX_P];
  atomic_ullong conflicts;    /* a key seen by a second instance */
  atomic_ullong out_of_order; /* per key, value not increasing */
  atomic_ullong bad_keys;     /* key outside 0..key_count-1 */
} keyed_spec;

typedef struct keyed_state {
  keyed_spec *spec;
  int instance;
  uint64_t records;
  uint64_t *last; /* key_count entries, UINT64_MAX: none yet */
} keyed_state;

static void keyed_init(keyed_spec *spec, uint64_t key_count, bool order) {
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

/* The re-keyed test's outer key. */
#define REKEY_COUNT 7

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

static const sl_process_ops keyed_ops = {
    .open = keyed_open, .process = keyed_process, .close = keyed_close};

static uint64_t rekey_value(void *user, const sl_record *in) {
  (void)user;
  return tuple_of(in).value % REKEY_COUNT;
}

/* Every key seen by exactly one instance, the one sl_key_instance names. */
static void assert_key_ownership(keyed_spec *spec, uint32_t max_parallelism,
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

Test(keyby, partitions_by_key_stably_and_in_order, .timeout = 60) {
  uint64_t n = sl_test_scaled(400000, 20000);
  const uint64_t keys = 1000;
  static keyed_spec spec;
  keyed_init(&spec, keys, true);
  sl_job *job = job_new(0);
  sl_op *src, *by, *sink;
  OK(job, sl_source_sequence(job, "numbers", 1, n, keys, &src));
  OK(job, sl_op_key_by(job, "by_key", src, tuple_key, 0, &by));
  OK(job, sl_op_sink(job, "keyed", by, 4, &keyed_ops, &spec, &sink));
  cr_assert_eq(sl_job_operator_count(job), 2, "key_by is not physical");
  int rc = run_guarded(job, RUN_LIMIT_S);
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  cr_assert_eq(atomic_load(&spec.records), n);
  assert_key_ownership(&spec, 128, 4); /* 128: the default max_parallelism */
  cr_assert_eq(atomic_load(&spec.out_of_order), 0,
               "%" PRIu64 " records overtook an earlier one of their key",
               (uint64_t)atomic_load(&spec.out_of_order));
  for (int i = 0; i < 4; i++)
    cr_assert_gt(atomic_load(&spec.per_instance[i]), 0,
                 "instance %d got no key of 1000", i);
  job_free(job);
}

/* Several producers (3 map instances), max_parallelism 16. */
Test(keyby, stable_under_configured_max_parallelism, .timeout = 60) {
  uint64_t n = sl_test_scaled(300000, 20000);
  const uint64_t keys = 500;
  static keyed_spec spec;
  keyed_init(&spec, keys, false);
  sl_job_config config = {.struct_bytes = sizeof(sl_job_config), .max_parallelism = 16};
  sl_job *job = job_new(&config);
  sl_op *src, *map, *by, *sink;
  OK(job, sl_source_sequence(job, "numbers", 3, n, keys, &src));
  OK(job, sl_op_map(job, "triple", src, 3, sizeof(sl_tuple), triple_plus_one,
                    0, &map));
  OK(job, sl_op_key_by(job, "by_key", map, tuple_key, 0, &by));
  OK(job, sl_op_sink(job, "keyed", by, 4, &keyed_ops, &spec, &sink));
  int rc = run_guarded(job, RUN_LIMIT_S);
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  cr_assert_eq(atomic_load(&spec.records), n);
  assert_key_ownership(&spec, 16, 4);
  job_free(job);
}

/* key_by applied to a stream that is already keyed: the consumer must be
 * partitioned by the last (outer) key function, as for any keyed stream.
 * tuple.key = i % 5 (inner key), the outer key is value % 7. */
Test(keyby, rekeying_uses_the_outer_key, .timeout = 60) {
  uint64_t n = sl_test_scaled(100000, 10000);
  static keyed_spec spec;
  keyed_init(&spec, REKEY_COUNT, false);
  spec.key_is_residue = true;
  sl_job *job = job_new(0);
  sl_op *src, *inner, *outer, *sink;
  OK(job, sl_source_sequence(job, "numbers", 1, n, 5, &src));
  OK(job, sl_op_key_by(job, "by_key", src, tuple_key, 0, &inner));
  OK(job, sl_op_key_by(job, "by_residue", inner, rekey_value, 0, &outer));
  OK(job, sl_op_sink(job, "keyed", outer, 4, &keyed_ops, &spec, &sink));
  int rc = run_guarded(job, RUN_LIMIT_S);
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  cr_assert_eq(atomic_load(&spec.records), n);
  assert_key_ownership(&spec, 128, 4);
  job_free(job);
}

/* ============================================================== 5. union */

/* Exactly-once check by slot: slot = value for range A (values 0..na-1),
 * na + index for range B (values B_BASE + 3 * index). */
#define B_BASE 1000000000000ull

typedef struct once_spec {
  uint64_t na, nb;
  atomic_uint *seen; /* na + nb counters */
  atomic_ullong strays; /* values in neither range */
} once_spec;

static int once_process(sl_ctx *ctx, void *state, int input,
                        const sl_record *in) {
  (void)ctx;
  (void)input;
  once_spec *spec = state; /* no open: the user pointer */
  uint64_t v = tuple_of(in).value;
  uint64_t slot;
  if (v < spec->na)
    slot = v;
  else if (v >= B_BASE && (v - B_BASE) % 3 == 0 && (v - B_BASE) / 3 < spec->nb)
    slot = spec->na + (v - B_BASE) / 3;
  else {
    atomic_fetch_add(&spec->strays, 1);
    return 0;
  }
  atomic_fetch_add_explicit(&spec->seen[slot], 1, memory_order_relaxed);
  return 0;
}

Test(union_op, two_sources_every_record_once, .timeout = 60) {
  uint64_t na = sl_test_scaled(300000, 1000), nb = sl_test_scaled(200000, 1000);
  static range_spec a, b;
  a = (range_spec){.count = na, .value_start = 0, .value_step = 1};
  b = (range_spec){.count = nb, .value_start = B_BASE, .value_step = 3};
  once_spec once = {.na = na, .nb = nb};
  once.seen = calloc(na + nb, sizeof *once.seen);
  cr_assert_not_null(once.seen);
  static const sl_process_ops once_ops = {.process = once_process};

  sl_job *job = job_new(0);
  sl_op *src_a, *src_b, *both, *sink, *checker;
  sl_checksum got = {0};
  src_a = add_range(job, "range_a", 2, &a);
  src_b = add_range(job, "range_b", 1, &b);
  sl_op *inputs[2] = {src_a, src_b};
  OK(job, sl_op_union(job, "both", inputs, 2, &both));
  OK(job, sl_sink_checksum(job, "sum", both, 2, &got, &sink));
  OK(job, sl_op_sink(job, "once", both, 3, &once_ops, &once, &checker));
  cr_assert_eq(sl_job_operator_count(job), 4, "union is not physical");
  int rc = run_guarded(job, RUN_LIMIT_S);
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));

  sl_checksum want = {0};
  range_expect(&want, &a);
  range_expect(&want, &b);
  assert_checksum_eq(&got, &want, "union sink");
  cr_assert_eq(atomic_load(&once.strays), 0);
  for (uint64_t s = 0; s < na + nb; s++)
    cr_assert_eq(atomic_load(&once.seen[s]), 1,
                 "%s record %" PRIu64 " arrived %u times",
                 s < na ? "A" : "B", s < na ? s : s - na,
                 atomic_load(&once.seen[s]));
  free(once.seen);
  job_free(job);
}

/* ======================================================= 6. two inputs */

#define FINAL_MARK UINT64_MAX

typedef struct co_spec {
  atomic_ullong wrong_input;   /* a record at the input of the other side */
  atomic_ullong per_input[2];  /* at finish, summed over instances */
  atomic_ullong at_close[2];   /* at close: must equal the finish values */
  atomic_int finish_calls[MAX_P];
  /* The sink downstream. */
  atomic_ullong data_records;
  atomic_ullong marks;
  atomic_ullong mark_sum;
} co_spec;

typedef struct co_state {
  co_spec *spec;
  int instance;
  uint64_t per_input[2];
} co_state;

static int co_open(sl_ctx *ctx, void *user, void **state) {
  co_state *s = calloc(1, sizeof *s);
  if (!s)
    return -ENOMEM;
  s->spec = user;
  s->instance = sl_ctx_instance(ctx);
  *state = s;
  return 0;
}

/* Input 0 carries even values, input 1 odd ones. */
static int co_process(sl_ctx *ctx, void *state, int input,
                      const sl_record *in) {
  co_state *s = state;
  uint64_t v = tuple_of(in).value;
  if (input < 0 || input > 1 || (uint64_t)input != v % 2) {
    atomic_fetch_add(&s->spec->wrong_input, 1);
    return 0;
  }
  s->per_input[input]++;
  return sl_emit(ctx, in->data, in->size_bytes);
}

static int co_finish(sl_ctx *ctx, void *state) {
  co_state *s = state;
  atomic_fetch_add(&s->spec->finish_calls[s->instance], 1);
  atomic_fetch_add(&s->spec->per_input[0], s->per_input[0]);
  atomic_fetch_add(&s->spec->per_input[1], s->per_input[1]);
  sl_tuple mark = {.key = FINAL_MARK,
                   .value = s->per_input[0] + s->per_input[1]};
  return sl_emit(ctx, &mark, sizeof mark);
}

static void co_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  co_state *s = state;
  atomic_fetch_add(&s->spec->at_close[0], s->per_input[0]);
  atomic_fetch_add(&s->spec->at_close[1], s->per_input[1]);
  free(s);
}

static int co_sink_process(sl_ctx *ctx, void *state, int input,
                           const sl_record *in) {
  (void)ctx;
  (void)input;
  co_spec *spec = state;
  sl_tuple t = tuple_of(in);
  if (t.key == FINAL_MARK) {
    atomic_fetch_add(&spec->marks, 1);
    atomic_fetch_add(&spec->mark_sum, t.value);
  } else {
    atomic_fetch_add(&spec->data_records, 1);
  }
  return 0;
}

static void run_two_input(int p_a, int p_b, int p_co) {
  uint64_t na = sl_test_scaled(200000, 1000), nb = sl_test_scaled(150000, 1000);
  static range_spec a, b;
  a = (range_spec){.count = na, .value_start = 0, .value_step = 2};
  b = (range_spec){.count = nb, .value_start = 1, .value_step = 2};
  static co_spec spec;
  memset(&spec, 0, sizeof spec);
  static const sl_process_ops ops = {.open = co_open,
                                     .process = co_process,
                                     .finish = co_finish,
                                     .close = co_close};
  static const sl_process_ops sink_ops = {.process = co_sink_process};
  sl_job *job = job_new(0);
  sl_op *co, *sink;
  sl_op *inputs[2] = {add_range(job, "evens", p_a, &a),
                      add_range(job, "odds", p_b, &b)};
  OK(job, sl_op_process(job, "co", inputs, 2, p_co, &ops, &spec, &co));
  OK(job, sl_op_sink(job, "out", co, p_co, &sink_ops, &spec, &sink));
  int rc = run_guarded(job, RUN_LIMIT_S);
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  cr_assert_eq(atomic_load(&spec.wrong_input), 0,
               "%" PRIu64 " records came with the other input's index",
               (uint64_t)atomic_load(&spec.wrong_input));
  cr_assert_eq(atomic_load(&spec.per_input[0]), na);
  cr_assert_eq(atomic_load(&spec.per_input[1]), nb);
  /* Nothing arrived after finish: the counts at close are the same. */
  cr_assert_eq(atomic_load(&spec.at_close[0]), na);
  cr_assert_eq(atomic_load(&spec.at_close[1]), nb);
  for (int i = 0; i < p_co; i++)
    cr_assert_eq(atomic_load(&spec.finish_calls[i]), 1,
                 "instance %d: finish called %d times", i,
                 atomic_load(&spec.finish_calls[i]));
  cr_assert_eq(atomic_load(&spec.data_records), na + nb);
  cr_assert_eq(atomic_load(&spec.marks), (uint64_t)p_co,
               "one final record per instance reaches the sink");
  cr_assert_eq(atomic_load(&spec.mark_sum), na + nb);
  job_free(job);
}

Test(two_input, inputs_indexed_and_finish_emits_forward, .timeout = 60) {
  run_two_input(2, 2, 2);
}

Test(two_input, inputs_indexed_and_finish_emits_rebalance, .timeout = 60) {
  run_two_input(1, 1, 3);
}

/* ============================================= 7. records: shape and time */

/* flat_map: v % 3 == 0 -> nothing, 1 -> {v, 10v}, 2 -> {v, 10v + j}, j<3 */
static int fan_flat_map(void *user, const sl_record *in, sl_ctx *ctx) {
  (void)user;
  sl_tuple t = tuple_of(in);
  uint64_t v = t.value;
  int copies = v % 3 == 0 ? 0 : v % 3 == 1 ? 1 : 3;
  for (int j = 0; j < copies; j++) {
    sl_tuple out = {.key = v, .value = 10 * v + (uint64_t)j};
    int rc = sl_emit(ctx, &out, sizeof out);
    if (rc)
      return rc;
  }
  return 0;
}

Test(records, flat_map_emits_zero_one_or_three, .timeout = 60) {
  uint64_t n = sl_test_scaled(300000, 1000);
  sl_job *job = job_new(0);
  sl_op *src, *fm, *sink;
  sl_checksum got = {0};
  OK(job, sl_source_sequence(job, "numbers", 1, n, 0, &src));
  OK(job, sl_op_flat_map(job, "fan", src, 2, fan_flat_map, 0, &fm));
  OK(job, sl_sink_checksum(job, "sum", fm, 2, &got, &sink));
  int rc = run_guarded(job, RUN_LIMIT_S);
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  sl_checksum want = {0};
  for (uint64_t v = 0; v < n; v++) {
    int copies = v % 3 == 0 ? 0 : v % 3 == 1 ? 1 : 3;
    for (int j = 0; j < copies; j++) {
      sl_tuple t = {.key = v, .value = 10 * v + (uint64_t)j};
      sl_checksum_add(&want, &t, sizeof t);
    }
  }
  assert_checksum_eq(&got, &want, "flat_map output");
  sl_op_stats stats;
  get_stats(job, 1, &stats);
  cr_assert_eq(stats.records_in, n);
  cr_assert_eq(stats.records_out, want.records);
  job_free(job);
}

/* Variable-length records: record i has 1 + i % 300 bytes, byte k of it is
 * (i * 131 + k * 7 + 3) mod 256. */
#define VARLEN_MAX 300u

typedef struct varlen_spec {
  uint64_t count; /* one instance emits them all */
} varlen_spec;

typedef struct varlen_state {
  const varlen_spec *spec;
  uint64_t next;
} varlen_state;

static int varlen_open(sl_ctx *ctx, void *user, void **state) {
  (void)ctx;
  varlen_state *s = calloc(1, sizeof *s);
  if (!s)
    return -ENOMEM;
  s->spec = user;
  *state = s;
  return 0;
}

static void varlen_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  free(state);
}

static uint32_t varlen_fill(uint8_t *buffer, uint64_t i) {
  uint32_t size = 1 + (uint32_t)(i % VARLEN_MAX);
  for (uint32_t k = 0; k < size; k++)
    buffer[k] = (uint8_t)(i * 131 + k * 7 + 3);
  return size;
}

static int varlen_next(sl_ctx *ctx, void *state) {
  varlen_state *s = state;
  uint8_t buffer[VARLEN_MAX];
  for (unsigned k = 0; k < SOURCE_BATCH && s->next < s->spec->count;
       k++, s->next++) {
    int rc = sl_emit(ctx, buffer, varlen_fill(buffer, s->next));
    if (rc)
      return rc;
  }
  return s->next == s->spec->count ? SL_SOURCE_END : 0;
}

Test(records, variable_length_records_pass_intact, .timeout = 60) {
  varlen_spec spec = {.count = sl_test_scaled(100000, 2000)};
  static const sl_source_ops ops = {
      .open = varlen_open, .next = varlen_next, .close = varlen_close};
  /* A small ring so that entries of changing sizes wrap around (pad)
   * often. */
  sl_job_config config = {.struct_bytes = sizeof(sl_job_config), .ring_bytes = 8192};
  sl_job *job = job_new(&config);
  sl_op *src, *map, *fm, *filter, *sink;
  sl_checksum got = {0};
  OK(job, sl_op_source(job, "varlen", 1, &ops, &spec, &src));
  OK(job, sl_op_map(job, "copy", src, 2, VARLEN_MAX, copy_map, 0, &map));
  OK(job, sl_op_flat_map(job, "echo", map, 2, echo_flat_map, 0, &fm));
  OK(job, sl_op_filter(job, "all", fm, 2, keep_all, 0, &filter));
  OK(job, sl_sink_checksum(job, "sum", filter, 2, &got, &sink));
  int rc = run_guarded(job, RUN_LIMIT_S);
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  sl_checksum want = {0};
  uint8_t buffer[VARLEN_MAX];
  for (uint64_t i = 0; i < spec.count; i++)
    sl_checksum_add(&want, buffer, varlen_fill(buffer, i));
  assert_checksum_eq(&got, &want, "variable-length records");
  job_free(job);
}

/* Empty records: record i is empty when i % 3 == 0, else the 8 bytes of i;
 * every fifth record carries the timestamp i. */
static uint32_t mixed_fill(uint64_t *word, uint64_t i) {
  *word = i;
  return i % 3 == 0 ? 0 : 8;
}

static int mixed_next(sl_ctx *ctx, void *state) {
  varlen_state *s = state;
  for (unsigned k = 0; k < SOURCE_BATCH && s->next < s->spec->count;
       k++, s->next++) {
    uint64_t word;
    uint32_t size = mixed_fill(&word, s->next);
    int64_t ts = s->next % 5 == 0 ? (int64_t)s->next : SL_NO_TIMESTAMP;
    int rc = sl_emit_ts(ctx, &word, size, ts);
    if (rc)
      return rc;
  }
  return s->next == s->spec->count ? SL_SOURCE_END : 0;
}

Test(records, empty_records_pass_through, .timeout = 60) {
  varlen_spec spec = {.count = sl_test_scaled(200000, 2000)};
  static const sl_source_ops ops = {
      .open = varlen_open, .next = mixed_next, .close = varlen_close};
  sl_job_config config = {.struct_bytes = sizeof(sl_job_config), .ring_bytes = 4096};
  sl_job *job = job_new(&config);
  sl_op *src, *map, *fm, *sink;
  sl_checksum got = {0};
  OK(job, sl_op_source(job, "mixed", 1, &ops, &spec, &src));
  OK(job, sl_op_map(job, "copy", src, 2, 8, copy_map, 0, &map));
  OK(job, sl_op_flat_map(job, "echo", map, 2, echo_flat_map, 0, &fm));
  OK(job, sl_sink_checksum(job, "sum", fm, 2, &got, &sink));
  int rc = run_guarded(job, RUN_LIMIT_S);
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  sl_checksum want = {0};
  for (uint64_t i = 0; i < spec.count; i++) {
    uint64_t word;
    uint32_t size = mixed_fill(&word, i);
    sl_checksum_add(&want, &word, size);
  }
  assert_checksum_eq(&got, &want, "empty and 8-byte records");
  job_free(job);
}

/* Timestamps: the source stamps index i with TS_BASE + TS_STEP * i (key =
 * i); a map and a flat_map check them; the map's output keeps it; the
 * flat_map re-emits the record (inheriting it) plus a copy with an explicit
 * timestamp -(i + 1) and the top bit of the value set. */
#define COPY_BIT (1ull << 63)

typedef struct ts_spec {
  atomic_ullong map_bad, flat_bad, sink_bad;
  atomic_ullong originals, copies;
} ts_spec;

static int64_t ts_of_index(uint64_t i) { return TS_BASE + TS_STEP * (int64_t)i; }

static int ts_map(void *user, const sl_record *in, void *out,
                  uint32_t *out_size_bytes) {
  ts_spec *spec = user;
  sl_tuple t = tuple_of(in);
  if (in->timestamp != ts_of_index(t.key))
    atomic_fetch_add(&spec->map_bad, 1);
  t.value += 1;
  memcpy(out, &t, sizeof t);
  *out_size_bytes = sizeof t;
  return 0;
}

static int ts_flat_map(void *user, const sl_record *in, sl_ctx *ctx) {
  ts_spec *spec = user;
  sl_tuple t = tuple_of(in);
  if (in->timestamp != ts_of_index(t.key))
    atomic_fetch_add(&spec->flat_bad, 1);
  int rc = sl_emit(ctx, &t, sizeof t);
  if (rc)
    return rc;
  t.value |= COPY_BIT;
  return sl_emit_ts(ctx, &t, sizeof t, -(int64_t)t.key - 1);
}

static int ts_sink(sl_ctx *ctx, void *state, int input, const sl_record *in) {
  (void)ctx;
  (void)input;
  ts_spec *spec = state;
  sl_tuple t = tuple_of(in);
  bool copy = (t.value & COPY_BIT) != 0;
  int64_t want = copy ? -(int64_t)t.key - 1 : ts_of_index(t.key);
  if (in->timestamp != want || (t.value & ~COPY_BIT) != 2 * t.key + 1)
    atomic_fetch_add(&spec->sink_bad, 1);
  atomic_fetch_add(copy ? &spec->copies : &spec->originals, 1);
  return 0;
}

Test(records, timestamps_travel_with_records, .timeout = 60) {
  uint64_t n = sl_test_scaled(200000, 1000);
  static range_spec src_spec;
  /* value = 2i: the map adds 1, so the sink expects 2 * key + 1. */
  src_spec = (range_spec){.count = n, .value_step = 2, .with_ts = true};
  static ts_spec spec;
  memset(&spec, 0, sizeof spec);
  static const sl_process_ops sink_ops = {.process = ts_sink};
  sl_job *job = job_new(0);
  sl_op *src, *map, *fm, *sink;
  src = add_range(job, "stamped", 1, &src_spec);
  OK(job, sl_op_map(job, "check_map", src, 2, sizeof(sl_tuple), ts_map, &spec,
                    &map));
  OK(job, sl_op_flat_map(job, "check_flat", map, 2, ts_flat_map, &spec, &fm));
  OK(job, sl_op_sink(job, "check_sink", fm, 2, &sink_ops, &spec, &sink));
  int rc = run_guarded(job, RUN_LIMIT_S);
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  cr_assert_eq(atomic_load(&spec.map_bad), 0, "the map saw wrong timestamps");
  cr_assert_eq(atomic_load(&spec.flat_bad), 0,
               "the map's output lost its input's timestamp");
  cr_assert_eq(atomic_load(&spec.sink_bad), 0,
               "the sink saw wrong timestamps or values");
  cr_assert_eq(atomic_load(&spec.originals), n);
  cr_assert_eq(atomic_load(&spec.copies), n);
  job_free(job);
}

/* ======================================================= 8. end of stream */

Test(lifecycle, bounded_job_ends_and_calls_each_callback_once, .timeout = 60) {
  uint64_t n = sl_test_scaled(300000, 1000);
  static range_spec src_spec;
  src_spec = (range_spec){.count = n, .value_step = 1, .key_count = 97};
  static relay_spec middle, last;
  relay_init(&middle);
  middle.forward = true;
  relay_init(&last);
  sl_job *job = job_new(0);
  sl_op *src, *map, *proc, *by, *sink;
  src = add_range(job, "bounded", 3, &src_spec);
  OK(job, sl_op_map(job, "triple", src, 3, sizeof(sl_tuple), triple_plus_one,
                    0, &map));
  sl_op *inputs[1] = {map};
  OK(job, sl_op_process(job, "relay", inputs, 1, 4, &relay_ops, &middle,
                        &proc));
  OK(job, sl_op_key_by(job, "by_key", proc, tuple_key, 0, &by));
  OK(job, sl_op_sink(job, "end", by, 2, &relay_ops, &last, &sink));
  int rc = run_guarded(job, RUN_LIMIT_S);
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  assert_lifecycle(&src_spec.life, 3, 1, 1, 0, "source");
  assert_lifecycle(&middle.life, 4, 1, 1, 1, "relay");
  assert_lifecycle(&last.life, 2, 1, 1, 1, "sink");
  cr_assert_eq(atomic_load(&src_spec.bad_ctx), 0);
  cr_assert_eq(atomic_load(&middle.bad_ctx), 0);
  cr_assert_eq(atomic_load(&last.bad_ctx), 0);
  cr_assert_eq(atomic_load(&src_spec.emit_errors), 0);
  cr_assert_eq(atomic_load(&middle.records), n);
  cr_assert_eq(atomic_load(&last.records), n);
  cr_assert_str_eq(sl_job_error(job), "", "no failure, no message");

  /* The job runs once; later calls report, they do not rerun. */
  cr_assert_eq(sl_job_wait(job), 0);
  cr_assert_eq(sl_job_run(job), SL_ESTARTED);
  cr_assert_eq(sl_job_start(job), SL_ESTARTED);
  sl_job_stop(job); /* no effect on a finished job */
  cr_assert_eq(sl_job_wait(job), 0);
  sl_op *late;
  cr_assert_eq(sl_source_sequence(job, "late", 1, 10, 0, &late), SL_ESTARTED);
  assert_lifecycle(&middle.life, 4, 1, 1, 1, "relay after the run");
  job_free(job);
}

Test(lifecycle, wait_before_start_and_empty_stream, .timeout = 30) {
  /* A source of zero records still ends the job cleanly, and finish runs
   * even though no record arrived. */
  static relay_spec last;
  relay_init(&last);
  sl_job *job = job_new(0);
  sl_op *src, *sink;
  OK(job, sl_source_sequence(job, "empty", 2, 0, 0, &src));
  OK(job, sl_op_sink(job, "end", src, 3, &relay_ops, &last, &sink));
  cr_assert_eq(sl_job_wait(job), SL_ENOTSTARTED);
  cr_assert_eq(sl_job_progress(job), 0);
  int rc = run_guarded(job, RUN_LIMIT_S);
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  assert_lifecycle(&last.life, 3, 1, 1, 1, "sink");
  cr_assert_eq(atomic_load(&last.records), 0);
  job_free(job);
}

/* ================================================= 9. error propagation */

typedef struct fail_map_spec {
  uint64_t fail_at; /* fail on the fail_at-th record (1-based) */
  atomic_ullong seen;
} fail_map_spec;

static int fail_map(void *user, const sl_record *in, void *out,
                    uint32_t *out_size_bytes) {
  fail_map_spec *spec = user;
  if (atomic_fetch_add(&spec->seen, 1) + 1 == spec->fail_at)
    return -EIO;
  memcpy(out, in->data, in->size_bytes);
  *out_size_bytes = in->size_bytes;
  return 0;
}

/* After a failed run every later call reports, none reruns. */
static void assert_stays_failed(sl_job *job, int status) {
  cr_assert_eq(sl_job_run(job), SL_ESTARTED);
  cr_assert_eq(sl_job_start(job), SL_ESTARTED);
  cr_assert_eq(sl_job_wait(job), status, "wait repeats the failure");
  sl_op *late;
  cr_assert_eq(sl_source_sequence(job, "late", 1, 10, 0, &late), SL_ESTARTED);
}

Test(errors, map_failure_names_operator_and_cause, .timeout = 30) {
  static range_spec src_spec;
  src_spec = (range_spec){.value_step = 1, .endless = true};
  static fail_map_spec spec;
  spec.fail_at = sl_test_scaled(50000, 500);
  sl_job *job = job_new(0);
  sl_op *src, *map, *sink;
  sl_checksum got = {0};
  src = add_range(job, "endless", 1, &src_spec);
  OK(job, sl_op_map(job, "fragile", src, 1, sizeof(sl_tuple), fail_map, &spec,
                    &map));
  OK(job, sl_sink_checksum(job, "sum", map, 1, &got, &sink));
  double t0 = sl_test_now_s();
  int rc = run_guarded(job, 10.0);
  double elapsed = sl_test_now_s() - t0;
  cr_assert_eq(rc, -EIO, "run returned %d (%s)", rc, sl_strerror(rc));
  cr_assert_lt(elapsed, 15.0, "the failed job took %.2f s to end", elapsed);
  assert_error_has(job, "operator 'fragile'");
  assert_error_has(job, "instance 0/1");
  assert_error_has(job, strerror(EIO));
  assert_error_has(job, "error -5");
  cr_assert_leq(got.records, spec.fail_at - 1,
                "records after the failing one reached the sink");
  assert_lifecycle(&src_spec.life, 1, 1, 1, 0, "source");
  assert_stays_failed(job, -EIO);
  job_free(job);
}

Test(errors, process_failure_carries_ctx_fail_cause, .timeout = 30) {
  static range_spec src_spec;
  src_spec = (range_spec){.value_step = 1, .endless = true};
  static relay_spec checker, last;
  relay_init(&checker);
  checker.forward = true;
  checker.fail_instance = 1;
  checker.fail_at = sl_test_scaled(20000, 200);
  checker.fail_status = -EPROTO;
  checker.fail_cause = "record is cursed";
  relay_init(&last);
  sl_job *job = job_new(0);
  sl_op *src, *proc, *sink;
  src = add_range(job, "endless", 2, &src_spec);
  sl_op *inputs[1] = {src};
  OK(job, sl_op_process(job, "checker", inputs, 1, 2, &relay_ops, &checker,
                        &proc));
  OK(job, sl_op_sink(job, "end", proc, 2, &relay_ops, &last, &sink));
  double t0 = sl_test_now_s();
  int rc = run_guarded(job, 10.0);
  double elapsed = sl_test_now_s() - t0;
  cr_assert_eq(rc, -EPROTO, "run returned %d (%s)", rc, sl_strerror(rc));
  cr_assert_lt(elapsed, 15.0, "the failed job took %.2f s to end", elapsed);
  assert_error_has(job, "operator 'checker' instance 1/2 failed");
  assert_error_has(job, "record is cursed (value ");
  assert_error_has(job, strerror(EPROTO));
  /* Not finished: finish is not called on failure; close always is. */
  assert_lifecycle(&checker.life, 2, 1, 1, 0, "checker");
  assert_lifecycle(&last.life, 2, 1, 1, 0, "sink");
  assert_lifecycle(&src_spec.life, 2, 1, 1, 0, "source");
  assert_stays_failed(job, -EPROTO);
  job_free(job);
}

Test(errors, source_open_failure, .timeout = 30) {
  static range_spec src_spec;
  src_spec = (range_spec){.count = 1000,
                          .value_step = 1,
                          .open_status = -EACCES,
                          .open_cause = "cannot open the feed"};
  static relay_spec last;
  relay_init(&last);
  sl_job *job = job_new(0);
  sl_op *src, *sink;
  src = add_range(job, "feed", 2, &src_spec);
  OK(job, sl_op_sink(job, "end", src, 2, &relay_ops, &last, &sink));
  int rc = run_guarded(job, 10.0);
  cr_assert_eq(rc, -EACCES, "run returned %d (%s)", rc, sl_strerror(rc));
  assert_error_has(job, "operator 'feed' instance ");
  assert_error_has(job, "cannot open the feed");
  /* open ran on both instances and failed: close is not called. */
  assert_lifecycle(&src_spec.life, 2, 1, 0, 0, "source");
  assert_lifecycle(&last.life, 2, 1, 1, 0, "sink");
  cr_assert_eq(atomic_load(&last.records), 0);
  assert_stays_failed(job, -EACCES);
  job_free(job);
}

Test(errors, source_open_failure_without_cause, .timeout = 30) {
  static range_spec src_spec;
  src_spec = (range_spec){.count = 1000, .value_step = 1, .open_status = 7};
  sl_job *job = job_new(0);
  sl_op *src, *sink;
  sl_checksum got = {0};
  src = add_range(job, "feed", 1, &src_spec);
  OK(job, sl_sink_checksum(job, "sum", src, 1, &got, &sink));
  int rc = run_guarded(job, 10.0);
  cr_assert_eq(rc, 7, "run returned %d (%s)", rc, sl_strerror(rc));
  assert_error_has(job, "operator 'feed' instance 0/1 failed");
  assert_error_has(job, "open callback returned 7");
  job_free(job);
}

/* The sink is slow (the 4 KiB rings fill and the source and map block on
 * them), then fails: the blocked producers must notice and the job end. */
Test(errors, failing_sink_with_blocked_upstream, .timeout = 30) {
  static range_spec src_spec;
  src_spec = (range_spec){.value_step = 1, .endless = true};
  static relay_spec slow;
  relay_init(&slow);
  slow.sleep_us = 200;
  slow.fail_instance = 0;
  slow.fail_at = 300;
  slow.fail_status = -EIO;
  slow.fail_cause = "disk full";
  sl_job_config config = {.struct_bytes = sizeof(sl_job_config), .ring_bytes = 4096};
  sl_job *job = job_new(&config);
  sl_op *src, *map, *sink;
  src = add_range(job, "endless", 1, &src_spec);
  OK(job, sl_op_map(job, "triple", src, 1, sizeof(sl_tuple), triple_plus_one,
                    0, &map));
  OK(job, sl_op_sink(job, "slow_sink", map, 1, &relay_ops, &slow, &sink));
  double t0 = sl_test_now_s();
  int rc = run_guarded(job, 10.0);
  double elapsed = sl_test_now_s() - t0;
  cr_assert_eq(rc, -EIO, "run returned %d (%s)", rc, sl_strerror(rc));
  cr_assert_lt(elapsed, 15.0, "the failed job took %.2f s to end", elapsed);
  assert_error_has(job, "operator 'slow_sink' instance 0/1 failed: disk full");
  /* Back-pressure held the endless source to a few rings' worth. */
  sl_op_stats stats;
  get_stats(job, 0, &stats);
  cr_assert_lt(stats.records_out, 5000,
               "the source emitted %" PRIu64 " records past a blocked ring",
               stats.records_out);
  assert_lifecycle(&src_spec.life, 1, 1, 1, 0, "source");
  assert_lifecycle(&slow.life, 1, 1, 1, 0, "sink");
  assert_stays_failed(job, -EIO);
  job_free(job);
}

/* ================================================================ 10. stop */

/* Start job, stop it from another thread after delay_us, and return the
 * wait status; *latency_s is the time from the stop to wait's return. */
static int run_and_stop(sl_job *job, uint64_t delay_us, double *latency_s) {
  OK(job, sl_job_start(job));
  sl_test_watchdog dog;
  cr_assert_eq(sl_test_watchdog_arm(&dog, job, 15.0, "the stopped job"), 0);
  sl_test_stopper stopper;
  cr_assert_eq(sl_test_stopper_start(&stopper, job, delay_us), 0);
  int rc = sl_job_wait(job);
  double returned_s = sl_test_now_s();
  double stopped_s = sl_test_stopper_join(&stopper);
  cr_assert(!sl_test_watchdog_disarm(&dog),
            "the job did not stop: the watchdog stopped it again");
  *latency_s = returned_s - stopped_s;
  return rc;
}

Test(stop, endless_source_stops_from_another_thread, .timeout = 30) {
  static range_spec src_spec;
  src_spec = (range_spec){.value_step = 1, .endless = true};
  static relay_spec last;
  relay_init(&last);
  sl_job *job = job_new(0);
  sl_op *src, *map, *sink;
  src = add_range(job, "endless", 2, &src_spec);
  OK(job, sl_op_map(job, "triple", src, 2, sizeof(sl_tuple), triple_plus_one,
                    0, &map));
  OK(job, sl_op_sink(job, "end", map, 2, &relay_ops, &last, &sink));
  double latency_s;
  int rc = run_and_stop(job, 100000, &latency_s);
  cr_assert_eq(rc, SL_ESTOPPED, "wait returned %d (%s): %s", rc,
               sl_strerror(rc), sl_job_error(job));
  cr_log_info("stop took %.1f ms", latency_s * 1e3); /* measured, not asserted */
  cr_assert_str_eq(sl_job_error(job), "", "a stop is not a failure");
  uint64_t emitted = sl_job_progress(job);
  cr_assert_gt(emitted, 0, "the job ran before it was stopped");
  cr_assert_leq(atomic_load(&last.records), emitted);
  assert_lifecycle(&src_spec.life, 2, 1, 1, 0, "source");
  assert_lifecycle(&last.life, 2, 1, 1, 0, "sink (no finish on stop)");
  sl_job_stop(job); /* again: harmless */
  cr_assert_eq(sl_job_wait(job), SL_ESTOPPED);
  cr_assert_eq(sl_job_run(job), SL_ESTARTED);
  job_free(job);
}

/* Every thread is parked: the source emits nothing (sleeping 1 ms per
 * call), so the map and sink wait on empty rings. */
Test(stop, idle_parked_job_stops_promptly, .timeout = 30) {
  static range_spec src_spec;
  src_spec = (range_spec){.idle = true};
  static relay_spec last;
  relay_init(&last);
  sl_job_config config = {.struct_bytes = sizeof(sl_job_config), .spin_iterations = 1};
  sl_job *job = job_new(&config);
  sl_op *src, *map, *sink;
  src = add_range(job, "idle", 1, &src_spec);
  OK(job, sl_op_map(job, "triple", src, 2, sizeof(sl_tuple), triple_plus_one,
                    0, &map));
  OK(job, sl_op_sink(job, "end", map, 2, &relay_ops, &last, &sink));
  double latency_s;
  int rc = run_and_stop(job, 100000, &latency_s);
  cr_assert_eq(rc, SL_ESTOPPED, "wait returned %d (%s)", rc, sl_strerror(rc));
  cr_log_info("stop took %.1f ms", latency_s * 1e3); /* measured, not asserted */
  assert_lifecycle(&last.life, 2, 1, 1, 0, "sink");
  assert_lifecycle(&src_spec.life, 1, 1, 1, 0, "source");
  job_free(job);
}

/* The sink sleeps 1 ms per record and the 4 KiB rings are full: the source
 * and the map are parked on full rings when the stop comes.  The job must
 * end soon; the bound allows the engine to finish the ring's backlog of
 * about 250 records (see the next test for why it should not need to). */
Test(stop, blocked_full_ring_stops, .timeout = 30) {
  static range_spec src_spec;
  src_spec = (range_spec){.value_step = 1, .endless = true};
  static relay_spec slow;
  relay_init(&slow);
  slow.sleep_us = 1000;
  sl_job_config config = {.struct_bytes = sizeof(sl_job_config), .ring_bytes = 4096};
  sl_job *job = job_new(&config);
  sl_op *src, *map, *sink;
  src = add_range(job, "endless", 1, &src_spec);
  OK(job, sl_op_map(job, "triple", src, 1, sizeof(sl_tuple), triple_plus_one,
                    0, &map));
  OK(job, sl_op_sink(job, "slow_sink", map, 1, &relay_ops, &slow, &sink));
  double latency_s;
  int rc = run_and_stop(job, 100000, &latency_s);
  cr_assert_eq(rc, SL_ESTOPPED, "wait returned %d (%s)", rc, sl_strerror(rc));
  cr_log_info("stop took %.1f ms", latency_s * 1e3); /* measured, not asserted */
  assert_lifecycle(&slow.life, 1, 1, 1, 0, "sink");
  assert_lifecycle(&src_spec.life, 1, 1, 1, 0, "source");
  job_free(job);
}

/* sl_job_stop promises that "every instance notices within microseconds".
 * Here a sink spends 100 us per record and has a backlog of 12000 records
 * (the source emits them at once and then idles; the sink's open sleeps
 * 100 ms, so all of them are readable when it starts).  Stopped 300 ms
 * later, the sink must notice within a few records (the engine looks every
 * 64 records), not after the rest of the backlog, which takes
 * seconds.  The sink does not poll sl_ctx_stopping(): 100 us per record is
 * not a long-running callback. */
Test(stop, busy_consumer_notices_stop_before_backlog, .timeout = 30) {
  static range_spec src_spec;
  src_spec = (range_spec){.count = 12000, .value_step = 1, .hold_open = true};
  static relay_spec slow;
  relay_init(&slow);
  slow.sleep_us = 100;
  slow.open_sleep_us = 100000;
  sl_job *job = job_new(0); /* the default rings hold the 12000 records */
  sl_op *src, *sink;
  src = add_range(job, "burst", 1, &src_spec);
  OK(job, sl_op_sink(job, "slow_sink", src, 1, &relay_ops, &slow, &sink));
  double latency_s;
  int rc = run_and_stop(job, 300000, &latency_s);
  cr_assert_eq(rc, SL_ESTOPPED, "wait returned %d (%s)", rc, sl_strerror(rc));
  /* 12000 records take at least 1.2 s, so the stop came well before the
   * end of the backlog. */
  uint64_t processed = atomic_load(&slow.records);
  /* A sink that went on through its backlog would have processed all
   * 12000 before sl_job_wait returned; the latency is only logged, as
   * timing is not asserted in tests (run_and_stop's watchdog catches a
   * stop that never arrives). */
  cr_log_info("stop took %.1f ms, %" PRIu64 " of 12000 records processed",
              latency_s * 1e3, processed);
  cr_assert_lt(processed, 12000, "the sink went on through its backlog");
  job_free(job);
}

/* ================================================== 11. invalid graphs */

Test(validate, no_source, .timeout = 30) {
  sl_job *job = job_new(0);
  assert_refused(job, sl_job_validate(job), "no source", "validate");
  assert_refused(job, sl_job_run(job), "no source", "run");
  cr_assert_eq(sl_job_wait(job), SL_ENOTSTARTED, "a refused start starts nothing");
  /* The refused start left the job buildable. */
  sl_op *src, *sink;
  sl_checksum got = {0};
  OK(job, sl_source_sequence(job, "numbers", 1, 1000, 0, &src));
  OK(job, sl_sink_checksum(job, "sum", src, 1, &got, &sink));
  OK(job, run_guarded(job, RUN_LIMIT_S));
  cr_assert_eq(got.records, 1000);
  job_free(job);
}

Test(validate, cycle, .timeout = 30) {
  static relay_spec relay;
  relay_init(&relay);
  sl_job *job = job_new(0);
  sl_op *src, *sink, *a, *b;
  sl_checksum got = {0};
  OK(job, sl_source_sequence(job, "numbers", 1, 100, 0, &src));
  OK(job, sl_sink_checksum(job, "sum", src, 1, &got, &sink));
  OK(job, sl_op_process(job, "a", 0, 0, 1, &relay_ops, &relay, &a));
  sl_op *a_in[1] = {a};
  OK(job, sl_op_process(job, "b", a_in, 1, 1, &relay_ops, &relay, &b));
  OK(job, sl_op_add_input(job, a, b)); /* a <- b <- a */
  assert_refused(job, sl_job_validate(job), "cycle", "validate");
  assert_refused(job, sl_job_start(job), "cycle", "start");
  cr_assert_eq(sl_job_wait(job), SL_ENOTSTARTED);
  job_free(job);

  /* An operator feeding itself. */
  job = job_new(0);
  OK(job, sl_source_sequence(job, "numbers", 1, 100, 0, &src));
  OK(job, sl_sink_checksum(job, "sum", src, 1, &got, &sink));
  OK(job, sl_op_process(job, "self", 0, 0, 1, &relay_ops, &relay, &a));
  OK(job, sl_op_add_input(job, a, a));
  assert_refused(job, sl_job_validate(job), "cycle", "validate self-loop");
  job_free(job);
}

Test(validate, dangling_streams, .timeout = 30) {
  sl_job *job = job_new(0);
  sl_op *src, *sink, *lonely, *by, *sink2, *sink3;
  sl_checksum got = {0}, got2 = {0}, got3 = {0};
  OK(job, sl_source_sequence(job, "numbers", 1, 5000, 0, &src));
  OK(job, sl_sink_checksum(job, "sum", src, 1, &got, &sink));
  OK(job, sl_op_map(job, "lonely", src, 1, sizeof(sl_tuple), triple_plus_one,
                    0, &lonely));
  assert_refused(job, sl_job_validate(job), "'lonely'", "dangling map");
  assert_error_has(job, "not consumed");
  OK(job, sl_sink_checksum(job, "sum2", lonely, 1, &got2, &sink2));
  OK(job, sl_job_validate(job));
  OK(job, sl_op_key_by(job, "by_key", src, tuple_key, 0, &by));
  assert_refused(job, sl_job_validate(job), "'by_key'", "dangling key_by");
  OK(job, sl_sink_checksum(job, "sum3", by, 2, &got3, &sink3));
  /* Completed, the graph runs. */
  OK(job, run_guarded(job, RUN_LIMIT_S));
  cr_assert_eq(got.records, 5000);
  cr_assert_eq(got2.records, 5000);
  cr_assert_eq(got3.records, 5000);
  cr_assert_eq(got2.value_sum, 3 * (5000ull * 4999 / 2) + 5000);
  job_free(job);

  job = job_new(0);
  sl_op *u;
  OK(job, sl_source_sequence(job, "numbers", 1, 10, 0, &src));
  OK(job, sl_sink_checksum(job, "sum", src, 1, &got, &sink));
  OK(job, sl_op_union(job, "merged", &src, 1, &u));
  assert_refused(job, sl_job_validate(job), "'merged'", "dangling union");
  job_free(job);
}

Test(validate, parallelism_out_of_range, .timeout = 30) {
  sl_job *job = job_new(0);
  sl_op *src, *op;
  OK(job, sl_source_sequence(job, "numbers", 1, 10, 0, &src));
  assert_refused(job, sl_op_map(job, "m0", src, 0, 16, triple_plus_one, 0, &op),
                 "parallelism 0", "map parallelism 0");
  assert_refused(job,
                 sl_op_map(job, "m257", src, SL_MAX_PARALLELISM + 1, 16,
                           triple_plus_one, 0, &op),
                 "parallelism 257", "map parallelism 257");
  assert_refused(job, sl_op_filter(job, "f", src, -1, keep_all, 0, &op),
                 "parallelism -1", "filter parallelism -1");
  assert_refused(job, sl_source_sequence(job, "s0", 0, 10, 0, &op),
                 "parallelism 0", "source parallelism 0");
  sl_checksum got = {0};
  assert_refused(job, sl_sink_checksum(job, "k", src, 257, &got, &op),
                 "parallelism 257", "sink parallelism 257");
  /* The maximum itself is accepted (built only, not run). */
  OK(job, sl_op_filter(job, "widest", src, SL_MAX_PARALLELISM, keep_all, 0,
                       &op));
  cr_assert_eq(sl_job_operator_count(job), 2, "refused operators were added");
  job_free(job);
}

Test(validate, bad_inputs, .timeout = 30) {
  static relay_spec relay;
  relay_init(&relay);
  sl_job *job = job_new(0), *other = job_new(0);
  sl_op *src, *sink, *foreign, *op, *map;
  sl_checksum got = {0};
  OK(job, sl_source_sequence(job, "numbers", 1, 10, 0, &src));
  OK(job, sl_sink_checksum(job, "sum", src, 1, &got, &sink));
  OK(other, sl_source_sequence(other, "theirs", 1, 10, 0, &foreign));

  assert_refused(job, sl_op_map(job, "m", 0, 1, 16, triple_plus_one, 0, &op),
                 "NULL", "NULL input");
  assert_refused(job,
                 sl_op_map(job, "m", foreign, 1, 16, triple_plus_one, 0, &op),
                 "another job", "input of another job");
  assert_refused(job, sl_op_filter(job, "f", sink, 1, keep_all, 0, &op),
                 "sink", "a sink as input");
  assert_refused(job, sl_op_key_by(job, "k", src, 0, 0, &op), "key function",
                 "key_by without a key function");
  assert_refused(job, sl_op_union(job, "u", 0, 0, &op), "at least one input",
                 "union of nothing");
  sl_op *with_null[2] = {src, 0};
  assert_refused(job, sl_op_union(job, "u", with_null, 2, &op), "NULL",
                 "union with a NULL input");
  assert_refused(job,
                 sl_op_process(job, "p", with_null, 2, 1, &relay_ops, &relay,
                               &op),
                 "NULL", "process with a NULL input");
  assert_refused(job, sl_op_map(job, "m", src, 1, 0, triple_plus_one, 0, &op),
                 "out_max_bytes", "map out_max_bytes 0");
  assert_refused(job,
                 sl_op_map(job, "m", src, 1, (64u << 10) + 1, triple_plus_one,
                           0, &op),
                 "out_max_bytes", "map out_max_bytes over max_record_bytes");
  assert_refused(job, sl_op_map(job, "m", src, 1, 16, 0, 0, &op),
                 "map function", "map without a function");
  assert_refused(job, sl_op_source(job, "s", 1, 0, 0, &op), "next",
                 "source without ops");
  sl_source_ops no_next = {0};
  assert_refused(job, sl_op_source(job, "s", 1, &no_next, 0, &op), "next",
                 "source without next");
  assert_refused(job, sl_op_sink(job, "k", src, 1, 0, 0, &op), "process",
                 "sink without ops");

  /* sl_op_add_input refusals. */
  OK(job, sl_op_map(job, "map", src, 1, 16, triple_plus_one, 0, &map));
  assert_refused(job, sl_op_add_input(job, map, src), "no further inputs",
                 "add_input to a map");
  assert_refused(job, sl_op_add_input(job, sink, map), "a sink has one input",
                 "second input of a sink");
  assert_refused(job, sl_op_add_input(job, 0, src), "consumer",
                 "add_input without consumer");
  OK(job, sl_op_process(job, "p", 0, 0, 1, &relay_ops, &relay, &op));
  assert_refused(job, sl_op_add_input(job, op, foreign), "another job",
                 "add_input from another job");
  assert_refused(job, sl_op_add_input(job, op, sink), "sink",
                 "add_input of a sink");
  assert_refused(job, sl_op_add_input(job, op, 0), "NULL",
                 "add_input of NULL");
  job_free(job);
  job_free(other);
}

Test(validate, names, .timeout = 30) {
  sl_job *job = job_new(0);
  sl_op *src, *op;
  OK(job, sl_source_sequence(job, "numbers", 1, 10, 0, &src));
  assert_refused(job,
                 sl_op_map(job, "numbers", src, 1, 16, triple_plus_one, 0, &op),
                 "exists", "duplicate name");
  assert_refused(job, sl_op_filter(job, "", src, 1, keep_all, 0, &op), "name",
                 "empty name");
  assert_refused(job, sl_op_filter(job, 0, src, 1, keep_all, 0, &op), "name",
                 "NULL name");
  char longest[SL_MAX_NAME], too_long[SL_MAX_NAME + 1];
  memset(longest, 'x', SL_MAX_NAME - 1);
  longest[SL_MAX_NAME - 1] = 0;
  memset(too_long, 'y', SL_MAX_NAME);
  too_long[SL_MAX_NAME] = 0;
  assert_refused(job, sl_op_filter(job, too_long, src, 1, keep_all, 0, &op),
                 "name", "48-byte name");
  OK(job, sl_op_filter(job, longest, src, 1, keep_all, 0, &op));
  sl_op_stats stats;
  get_stats(job, 1, &stats);
  cr_assert_str_eq(stats.name, longest);
  job_free(job);
}

/* The message for an empty name should describe it; it says "a longer one"
 * today (graph.c op_new). */
Test(validate, empty_name_message_is_accurate, .timeout = 30) {
  sl_job *job = job_new(0);
  sl_op *src, *op;
  OK(job, sl_source_sequence(job, "numbers", 1, 10, 0, &src));
  int rc = sl_op_filter(job, "", src, 1, keep_all, 0, &op);
  cr_assert_eq(rc, SL_EGRAPH);
  cr_assert(strstr(sl_job_error(job), "longer") == 0,
            "an empty name is reported as too long: '%s'", sl_job_error(job));
  job_free(job);
}

Test(validate, process_without_input, .timeout = 30) {
  static relay_spec relay, last;
  relay_init(&relay);
  relay.forward = true;
  relay_init(&last);
  sl_job *job = job_new(0);
  sl_op *src, *sink, *proc, *sink2;
  sl_checksum got = {0};
  OK(job, sl_source_sequence(job, "numbers", 1, 3000, 0, &src));
  OK(job, sl_sink_checksum(job, "sum", src, 1, &got, &sink));
  OK(job, sl_op_process(job, "orphan", 0, 0, 1, &relay_ops, &relay, &proc));
  OK(job, sl_op_sink(job, "end", proc, 1, &relay_ops, &last, &sink2));
  assert_refused(job, sl_job_validate(job), "'orphan'", "validate");
  assert_error_has(job, "no input");
  assert_refused(job, sl_job_start(job), "no input", "start");
  /* Given an input later, it runs. */
  OK(job, sl_op_add_input(job, proc, src));
  OK(job, run_guarded(job, RUN_LIMIT_S));
  cr_assert_eq(got.records, 3000);
  cr_assert_eq(atomic_load(&relay.records), 3000);
  cr_assert_eq(atomic_load(&last.records), 3000);
  job_free(job);
}

Test(validate, keyed_parallelism_above_max_parallelism, .timeout = 30) {
  sl_job_config config = {.struct_bytes = sizeof(sl_job_config), .max_parallelism = 2};
  sl_job *job = job_new(&config);
  sl_op *src, *by, *sink, *u;
  sl_checksum got = {0};
  OK(job, sl_source_sequence(job, "numbers", 1, 100, 10, &src));
  OK(job, sl_op_key_by(job, "by_key", src, tuple_key, 0, &by));
  OK(job, sl_sink_checksum(job, "wide", by, 4, &got, &sink));
  assert_refused(job, sl_job_validate(job), "max_parallelism",
                 "keyed parallelism 4 > 2");
  assert_error_has(job, "'wide'");
  assert_refused(job, sl_job_start(job), "max_parallelism", "start");
  job_free(job);

  /* Also through a union after the key_by. */
  job = job_new(&config);
  OK(job, sl_source_sequence(job, "numbers", 1, 100, 10, &src));
  OK(job, sl_op_key_by(job, "by_key", src, tuple_key, 0, &by));
  OK(job, sl_op_union(job, "merged", &by, 1, &u));
  OK(job, sl_sink_checksum(job, "wide", u, 3, &got, &sink));
  assert_refused(job, sl_job_validate(job), "max_parallelism",
                 "keyed through a union");
  job_free(job);

  /* At the limit it runs, and keys land where sl_key_instance says. */
  static keyed_spec spec;
  keyed_init(&spec, 50, true);
  job = job_new(&config);
  OK(job, sl_source_sequence(job, "numbers", 1, 20000, 50, &src));
  OK(job, sl_op_key_by(job, "by_key", src, tuple_key, 0, &by));
  OK(job, sl_op_sink(job, "keyed", by, 2, &keyed_ops, &spec, &sink));
  OK(job, run_guarded(job, RUN_LIMIT_S));
  cr_assert_eq(atomic_load(&spec.records), 20000);
  assert_key_ownership(&spec, 2, 2);
  job_free(job);
}

/* Refused calls change nothing: no operator added, no name taken, no input
 * counted as consumed. */
Test(validate, refused_calls_leave_graph_unaltered, .timeout = 30) {
  uint64_t n = 20000;
  sl_job *job = job_new(0);
  sl_op *src, *extra, *op, *map, *sink, *sink2;
  sl_checksum got = {0}, got2 = {0};
  OK(job, sl_source_sequence(job, "numbers", 2, n, 0, &src));
  OK(job, sl_source_sequence(job, "extra", 1, n, 0, &extra));
  int before = sl_job_operator_count(job);
  /* Each of these names extra as input and is refused. */
  cr_assert_eq(sl_op_map(job, "triple", extra, 0, 16, triple_plus_one, 0, &op),
               SL_EGRAPH);
  cr_assert_eq(sl_op_map(job, "triple", extra, 1, 0, triple_plus_one, 0, &op),
               SL_EGRAPH);
  cr_assert_eq(sl_op_key_by(job, "triple", extra, 0, 0, &op), SL_EGRAPH);
  sl_op *pair[2] = {extra, 0};
  cr_assert_eq(sl_op_union(job, "triple", pair, 2, &op), SL_EGRAPH);
  cr_assert_eq(sl_op_filter(job, "numbers", extra, 1, keep_all, 0, &op),
               SL_EGRAPH);
  cr_assert_eq(sl_source_sequence(job, "numbers", 1, 5, 0, &op), SL_EGRAPH);
  cr_assert_eq(sl_job_operator_count(job), before);
  /* "triple" is still free, and extra is still unconsumed. */
  OK(job, sl_op_map(job, "triple", src, 2, sizeof(sl_tuple), triple_plus_one,
                    0, &map));
  OK(job, sl_sink_checksum(job, "sum", map, 2, &got, &sink));
  assert_refused(job, sl_job_validate(job), "'extra'",
                 "extra is still dangling");
  OK(job, sl_sink_checksum(job, "sum2", extra, 1, &got2, &sink2));
  OK(job, run_guarded(job, RUN_LIMIT_S));
  cr_assert_eq(got.records, n);
  cr_assert_eq(got.value_sum, 3 * (n * (n - 1) / 2) + n);
  cr_assert_eq(got2.records, n);
  cr_assert_eq(got2.value_sum, n * (n - 1) / 2);
  job_free(job);
}

Test(config, invalid_values_rejected, .timeout = 30) {
  static const struct {
    sl_job_config config;
    const char *what;
  } bad[] = {
      {{.struct_bytes = sizeof(sl_job_config), .ring_bytes = 100}, "ring_bytes 100"},
      {{.struct_bytes = sizeof(sl_job_config), .ring_bytes = (1ull << 30) + 1}, "ring_bytes over 1 GiB"},
      {{.struct_bytes = sizeof(sl_job_config), .output_batch_records = 70000}, "output_batch_records 70000"},
      {{.struct_bytes = sizeof(sl_job_config), .pin_policy = 7}, "pin_policy 7"},
      {{.struct_bytes = sizeof(sl_job_config), .pin_policy = -1}, "pin_policy -1"},
      {{.struct_bytes = sizeof(sl_job_config), .max_parallelism = 40000}, "max_parallelism 40000"},
      {{.struct_bytes = sizeof(sl_job_config), .cpu_count = 1}, "cpu_count 1 without cpus"},
      {{.struct_bytes = sizeof(sl_job_config), .cpu_count = -1}, "cpu_count -1"},
      {{.struct_bytes = sizeof(sl_job_config), .ring_bytes = 4096, .max_record_bytes = 2048},
       "max_record_bytes over ring_bytes / 4"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    static int not_a_job;
    sl_job *job = (sl_job *)(void *)&not_a_job; /* must become NULL */
    int rc = sl_job_create(&bad[i].config, &job);
    cr_assert_eq(rc, EINVAL, "%s: returned %d, expected EINVAL", bad[i].what,
                 rc);
    cr_assert_null(job, "%s: *job is not NULL after an error", bad[i].what);
  }
  static const int cpus[1] = {-3};
  sl_job_config bad_cpu = {.struct_bytes = sizeof(sl_job_config), .cpus = cpus, .cpu_count = 1};
  sl_job *job = 0;
  cr_assert_eq(sl_job_create(&bad_cpu, &job), EINVAL, "cpu -3");
  /* The ends of the ranges are accepted. */
  static const sl_job_config good[] = {
      {.struct_bytes = sizeof(sl_job_config), .ring_bytes = 4096},
      {.struct_bytes = sizeof(sl_job_config), .output_batch_records = 65535},
      {.struct_bytes = sizeof(sl_job_config), .output_batch_records = 1},
      {.struct_bytes = sizeof(sl_job_config), .pin_policy = SL_PIN_ROUND_ROBIN},
      {.struct_bytes = sizeof(sl_job_config), .max_parallelism = 32768},
      {.struct_bytes = sizeof(sl_job_config), .max_parallelism = 1},
      {.struct_bytes = sizeof(sl_job_config), .ring_bytes = 5000}, /* rounded up */
  };
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    job = 0;
    int rc = sl_job_create(&good[i], &job);
    cr_assert_eq(rc, 0, "good config %zu refused: %d", i, rc);
    job_free(job);
  }
  sl_job_destroy(0); /* accepted */
}

/* sluice.h documents max_record_bytes as "at most ring_bytes / 4 - 16". */
Test(config, max_record_bytes_quarter_ring_accepted, .timeout = 30) {
  sl_job_config config = {.struct_bytes = sizeof(sl_job_config), .ring_bytes = 4096, .max_record_bytes = 1008};
  sl_job *job = 0;
  int rc = sl_job_create(&config, &job);
  cr_assert_eq(rc, 0,
               "max_record_bytes = ring_bytes / 4 - 16 (documented as "
               "allowed) refused with %d",
               rc);
  job_free(job);
  config.max_record_bytes = 1009;
  job = 0;
  rc = sl_job_create(&config, &job);
  cr_assert_eq(rc, EINVAL, "one byte over the bound is refused, got %d", rc);
  cr_assert_null(job);
}

/* ================================================ 12. oversubscription */

Test(oversubscribed, twenty_threads_on_few_cores, .timeout = 120) {
  uint64_t n = sl_test_scaled(3000000, 20000);
  static relay_spec relay;
  relay_init(&relay);
  relay.forward = true;
  /* Small rings and almost no spinning: threads park all the time. */
  sl_job_config config = {.struct_bytes = sizeof(sl_job_config), .ring_bytes = 8192, .spin_iterations = 1};
  sl_job *job = job_new(&config);
  sl_op *src, *map, *filter, *by, *proc, *sink;
  sl_checksum got = {0};
  OK(job, sl_source_sequence(job, "numbers", 4, n, 1000, &src));
  OK(job, sl_op_map(job, "triple", src, 4, sizeof(sl_tuple), triple_plus_one,
                    0, &map));
  OK(job, sl_op_filter(job, "all", map, 4, keep_all, 0, &filter));
  OK(job, sl_op_key_by(job, "by_key", filter, tuple_key, 0, &by));
  sl_op *inputs[1] = {by};
  OK(job, sl_op_process(job, "relay", inputs, 1, 4, &relay_ops, &relay, &proc));
  OK(job, sl_sink_checksum(job, "sum", proc, 4, &got, &sink));
  double t0 = sl_test_now_s();
  int rc = run_guarded(job, 100.0);
  double elapsed = sl_test_now_s() - t0;
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  cr_log_info("oversubscribed: %" PRIu64 " records through 20 threads in %.2f s",
              n, elapsed);
  sl_checksum want = {0};
  for (uint64_t i = 0; i < n; i++) {
    sl_tuple t = {.key = i % 1000, .value = 3 * i + 1};
    sl_checksum_add(&want, &t, sizeof t);
  }
  assert_checksum_eq(&got, &want, "sink");
  cr_assert_eq(atomic_load(&relay.records), n);
  assert_lifecycle(&relay.life, 4, 1, 1, 1, "relay");
  job_free(job);
}

/* ============================================== 13. emit usage errors */

Test(emit, sink_may_not_emit, .timeout = 30) {
  static relay_spec last;
  relay_init(&last);
  last.try_emit = true;
  sl_job *job = job_new(0);
  sl_op *src, *sink;
  OK(job, sl_source_sequence(job, "numbers", 1, 100, 0, &src));
  OK(job, sl_op_sink(job, "end", src, 1, &relay_ops, &last, &sink));
  int rc = run_guarded(job, RUN_LIMIT_S);
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  cr_assert_eq(atomic_load(&last.emit_status_process), SL_EUSAGE,
               "sl_emit in a sink's process returned %d",
               atomic_load(&last.emit_status_process));
  cr_assert_eq(atomic_load(&last.emit_status_finish), SL_EUSAGE,
               "sl_emit in a sink's finish returned %d",
               atomic_load(&last.emit_status_finish));
  cr_assert_eq(atomic_load(&last.records), 100);
  job_free(job);
}

#define PROBE_LIMIT 100u

typedef struct probe_spec {
  atomic_int source_big, source_fit, source_big_ts, source_stamped_fit;
  atomic_int process_big, process_fit;
} probe_spec;

static int probe_next(sl_ctx *ctx, void *state) {
  probe_spec *spec = state;
  uint8_t buffer[PROBE_LIMIT + 8];
  memset(buffer, 0xab, sizeof buffer);
  atomic_store(&spec->source_big, sl_emit(ctx, buffer, PROBE_LIMIT + 1));
  atomic_store(&spec->source_fit, sl_emit(ctx, buffer, PROBE_LIMIT));
  atomic_store(&spec->source_big_ts,
               sl_emit_ts(ctx, buffer, PROBE_LIMIT + 8, 5));
  atomic_store(&spec->source_stamped_fit,
               sl_emit_ts(ctx, buffer, PROBE_LIMIT, 5));
  return SL_SOURCE_END;
}

static int probe_process(sl_ctx *ctx, void *state, int input,
                         const sl_record *in) {
  (void)input;
  probe_spec *spec = state;
  uint8_t buffer[PROBE_LIMIT + 1];
  memset(buffer, 0xcd, sizeof buffer);
  atomic_store(&spec->process_big, sl_emit(ctx, buffer, PROBE_LIMIT + 1));
  int rc = sl_emit(ctx, in->data, in->size_bytes);
  atomic_store(&spec->process_fit, rc);
  return rc;
}

Test(emit, record_over_max_record_bytes_is_too_big, .timeout = 30) {
  static probe_spec spec;
  static const sl_source_ops src_ops = {.next = probe_next};
  static const sl_process_ops proc_ops = {.process = probe_process};
  sl_job_config config = {.struct_bytes = sizeof(sl_job_config), .max_record_bytes = PROBE_LIMIT};
  sl_job *job = job_new(&config);
  sl_op *src, *proc, *sink;
  sl_checksum got = {0};
  OK(job, sl_op_source(job, "probe_src", 1, &src_ops, &spec, &src));
  sl_op *inputs[1] = {src};
  OK(job, sl_op_process(job, "probe", inputs, 1, 1, &proc_ops, &spec, &proc));
  OK(job, sl_sink_checksum(job, "sum", proc, 1, &got, &sink));
  int rc = run_guarded(job, RUN_LIMIT_S);
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  cr_assert_eq(atomic_load(&spec.source_big), SL_ETOOBIG);
  cr_assert_eq(atomic_load(&spec.source_fit), 0);
  cr_assert_eq(atomic_load(&spec.source_big_ts), SL_ETOOBIG);
  cr_assert_eq(atomic_load(&spec.source_stamped_fit), 0);
  cr_assert_eq(atomic_load(&spec.process_big), SL_ETOOBIG);
  cr_assert_eq(atomic_load(&spec.process_fit), 0);
  /* Only the two records that fit went through. */
  sl_checksum want = {0};
  uint8_t buffer[PROBE_LIMIT];
  memset(buffer, 0xab, sizeof buffer);
  sl_checksum_add(&want, buffer, PROBE_LIMIT);
  sl_checksum_add(&want, buffer, PROBE_LIMIT);
  assert_checksum_eq(&got, &want, "sink");
  job_free(job);
}

/* A map that reports more output than it declared fails the job. */
static int overclaiming_map(void *user, const sl_record *in, void *out,
                            uint32_t *out_size_bytes) {
  (void)user;
  memcpy(out, in->data, sizeof(sl_tuple));
  *out_size_bytes = sizeof(sl_tuple) + 8; /* declared: 16 */
  return 0;
}

Test(emit, map_output_over_its_declared_size_fails, .timeout = 30) {
  sl_job *job = job_new(0);
  sl_op *src, *map, *sink;
  sl_checksum got = {0};
  OK(job, sl_source_sequence(job, "numbers", 1, 1000, 0, &src));
  OK(job, sl_op_map(job, "liar", src, 1, sizeof(sl_tuple), overclaiming_map, 0,
                    &map));
  OK(job, sl_sink_checksum(job, "sum", map, 1, &got, &sink));
  int rc = run_guarded(job, RUN_LIMIT_S);
  /* sl_job_wait: the engine's refusal of the map's output. */
  cr_assert(rc == SL_ETOOBIG, "run returned %d (%s)", rc, sl_strerror(rc));
  assert_error_has(job, "operator 'liar' instance 0/1");
  assert_error_has(job, "map wrote 24 bytes");
  cr_assert_eq(got.records, 0);
  job_free(job);
}

/* ====================================================== 14. thread names */

/* The name the engine gives instance i of operator name: "sl:NAME[i]" cut
 * to 15 bytes by shortening NAME, so "[i]" always shows. */
static void expected_thread_name(char out[16], const char *name, int i) {
  char index[8];
  int index_len = snprintf(index, sizeof index, "[%d]", i & 0xffff);
  size_t room = (size_t)(15 - 3 - index_len);
  size_t name_len = strnlen(name, room);
  memcpy(out, "sl:", 3);
  memcpy(out + 3, name, name_len);
  memcpy(out + 3 + name_len, index, (size_t)index_len + 1);
}

Test(names, threads_named_after_operator_and_instance, .timeout = 30) {
  static range_spec src_spec;
  src_spec = (range_spec){.count = 1000, .value_step = 1, .capture_names = true};
  static relay_spec long_sink;
  relay_init(&long_sink);
  long_sink.capture_names = true;
  const char *long_name = "a_rather_long_operator_name";
  sl_job *job = job_new(0);
  sl_op *src, *sink;
  src = add_range(job, "src", 2, &src_spec);
  OK(job, sl_op_sink(job, long_name, src, 11, &relay_ops, &long_sink, &sink));
  int rc = run_guarded(job, RUN_LIMIT_S);
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  cr_assert_str_eq(src_spec.names[0], "sl:src[0]");
  cr_assert_str_eq(src_spec.names[1], "sl:src[1]");
  for (int i = 0; i < 11; i++) {
    char want[16];
    expected_thread_name(want, long_name, i);
    cr_assert_eq(strlen(want), 15);
    cr_assert_str_eq(long_sink.names[i], want, "instance %d: '%s', expected '%s'",
                     i, long_sink.names[i], want);
  }
  /* Spelled out once, so expected_thread_name is checked too. */
  cr_assert_str_eq(long_sink.names[3], "sl:a_rather_[3]");
  cr_assert_str_eq(long_sink.names[10], "sl:a_rather[10]");
  job_free(job);
}

/* ================================================================ main */

int main(int argc, char *argv[]) {
  struct criterion_test_set *tests = criterion_initialize();
  /* One test at a time unless the command line says otherwise (see the
   * file comment); criterion_handle_args may override it with -j. */
  criterion_options.jobs = 1;
  int result = 0;
  if (criterion_handle_args(argc, argv, true))
    result = !criterion_run_all_tests(tests);
  criterion_finalize(tests);
  return result;
}

/* ==================================================== sl_emit_batch */

/* Each input tuple becomes three, emitted in one sl_emit_batch call. */
static int triple_by_batch(void *user, const sl_record *in, sl_ctx *ctx) {
  (void)user;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  sl_tuple out[3];
  for (int j = 0; j < 3; j++)
    out[j] = (sl_tuple){.key = t.key, .value = t.value * 3 + (uint64_t)j};
  return sl_emit_batch(ctx, out, sizeof out[0], 3);
}

/* The batch path (forward edge: runs copied into the ring) and the
 * fallback (rebalanced edge, one sl_emit per record) deliver exactly the
 * records of the equivalent single emits. */
Test(emit, batch_matches_single_emits, .timeout = 60) {
  uint64_t n = sl_test_scaled(400000, 1000);
  sl_job_config config = {.struct_bytes = sizeof(sl_job_config), .ring_bytes = 8192, .output_batch_records = 100};
  sl_job *job = job_new(&config);
  sl_op *src, *fm, *sink, *src2, *sink2;
  sl_checksum forward = {0}, rebalanced = {0};
  OK(job, sl_source_sequence(job, "seq", 1, n, 13, &src));
  OK(job, sl_op_flat_map(job, "triple", src, 1, triple_by_batch, 0, &fm));
  OK(job, sl_sink_checksum(job, "forward", fm, 1, &forward, &sink));
  OK(job, sl_source_sequence(job, "seq2", 2, n, 13, &src2));
  OK(job, sl_sink_checksum(job, "rebalanced", src2, 3, &rebalanced, &sink2));
  int rc = run_guarded(job, RUN_LIMIT_S);
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  sl_checksum want_forward = {0}, want_rebalanced = {0};
  for (uint64_t i = 0; i < n; i++) {
    sl_tuple t = {.key = i % 13, .value = i};
    sl_checksum_add(&want_rebalanced, &t, sizeof t);
    for (uint64_t j = 0; j < 3; j++) {
      sl_tuple o = {.key = i % 13, .value = i * 3 + j};
      sl_checksum_add(&want_forward, &o, sizeof o);
    }
  }
  cr_assert_eq(forward.records, want_forward.records);
  cr_assert_eq(forward.hash_sum, want_forward.hash_sum);
  cr_assert_eq(forward.value_sum, want_forward.value_sum);
  cr_assert_eq(rebalanced.records, want_rebalanced.records);
  cr_assert_eq(rebalanced.hash_sum, want_rebalanced.hash_sum);
  job_free(job);
}

/* ============================================ callbacks after the stream */

typedef struct close_emit {
  atomic_int close_rc;
} close_emit;

static int two_then_end(sl_ctx *ctx, void *state) {
  (void)state;
  sl_tuple t = {.key = 1, .value = 1};
  int rc = sl_emit(ctx, &t, sizeof t);
  return rc ? rc : SL_SOURCE_END;
}

static void emit_in_close(sl_ctx *ctx, void *state) {
  close_emit *c = state;
  sl_tuple t = {.key = 2, .value = 2};
  atomic_store(&c->close_rc, sl_emit(ctx, &t, sizeof t));
}

static int open_pass_user(sl_ctx *ctx, void *user, void **state) {
  (void)ctx;
  *state = user;
  return 0;
}

/* A close callback runs after END went downstream: its emits are refused
 * instead of being lost or waiting forever for a finished consumer. */
Test(emit, close_may_not_emit, .timeout = 60) {
  static close_emit c;
  atomic_store(&c.close_rc, 12345);
  static const sl_source_ops ops = {
      .open = open_pass_user, .next = two_then_end, .close = emit_in_close};
  sl_job *job = job_new(0);
  sl_op *src, *sink;
  sl_checksum got = {0};
  OK(job, sl_op_source(job, "src", 1, &ops, &c, &src));
  OK(job, sl_sink_checksum(job, "sink", src, 1, &got, &sink));
  int rc = run_guarded(job, RUN_LIMIT_S);
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  cr_assert_eq(atomic_load(&c.close_rc), SL_EUSAGE);
  cr_assert_eq(got.records, 1);
  job_free(job);
}

static int returns_two(sl_ctx *ctx, void *state) {
  (void)ctx;
  (void)state;
  return 2;
}

/* A source's next() returning something other than 0 or SL_SOURCE_END
 * fails the job with that value and a message, instead of looping
 * (sluice.h, CALLBACK RETURNS). */
Test(errors, source_next_bad_return_value, .timeout = 60) {
  static const sl_source_ops ops = {.next = returns_two};
  sl_job *job = job_new(0);
  sl_op *src, *sink;
  sl_checksum got = {0};
  OK(job, sl_op_source(job, "odd", 1, &ops, 0, &src));
  OK(job, sl_sink_checksum(job, "sink", src, 1, &got, &sink));
  int rc = run_guarded(job, RUN_LIMIT_S);
  cr_assert_eq(rc, 2);
  cr_assert(strstr(sl_job_error(job), "next() returned 2") != 0, "%s",
            sl_job_error(job));
  job_free(job);
}

Test(keyby, key_instance_rejects_bad_arguments) {
  cr_assert_eq(sl_key_instance(7, 0, 1), -1);
  cr_assert_eq(sl_key_instance(7, 128, 0), -1);
  cr_assert_eq(sl_key_instance(7, 4, 5), -1);
  int i = sl_key_instance(7, 128, 4);
  cr_assert(i >= 0 && i < 4);
}
