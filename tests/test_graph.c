/* test_graph.c — Criterion tests of how records travel through a job
 * graph (include/sluice.h, engine/graph.c, engine/runtime.c,
 * operators/builtin.c): forward and rebalance pipelines, ordering, fan-out,
 * key_by, union, two-input operators, flat_map, variable-length,
 * word-sized and empty records, timestamps.  Lifecycle, errors, stopping
 * and emit rules are in test_graph_lifecycle.c; graph and configuration
 * validation in test_graph_validate.c; the shared helpers in
 * graph_fixture.h.
 *
 * Edges whose producer has a larger parallelism than their consumer
 * (rebalance P -> Q with P > Q) are only used by the tests that are about
 * them (pipeline::rebalance_*), so that a defect there shows up in those
 * tests alone.
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

#include "graph_fixture.h"
#include "sluice.h"
#include "sluice_testing.h" /* unstable test helpers */
#include "test_util.h"

TestSuite(pipeline, .fini = free_leftover_jobs);
TestSuite(ordering, .fini = free_leftover_jobs);
TestSuite(fanout, .fini = free_leftover_jobs);
TestSuite(keyby, .fini = free_leftover_jobs);
TestSuite(union_op, .fini = free_leftover_jobs);
TestSuite(two_input, .fini = free_leftover_jobs);
TestSuite(records, .fini = free_leftover_jobs);

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

/* Records of 8 to 72 bytes (runtime.c note 14 copies those of up to 64,
 * in multiples of 8, word by word; 12 and 20 take the other path), with
 * a timestamp on every other one.  Record i has word_sizes[i % 11] bytes:
 * its index, then words of i * 1000003 + w, cut to the size.  The map
 * builds its output one 8-byte store at a time, as P1's map does, and the
 * flat_map re-emits it through sl_emit; a process sink checks every
 * record's bytes, size and timestamp. */
#define WORD_SIZES 11u
static const uint32_t word_sizes[WORD_SIZES] = {8,  16, 24, 32, 40, 48,
                                                56, 64, 72, 12, 20};

static uint32_t word_fill(uint8_t *buffer, uint64_t i) {
  uint32_t size = word_sizes[i % WORD_SIZES];
  uint64_t words[10];
  words[0] = i;
  for (uint32_t w = 1; w < 10; w++)
    words[w] = i * 1000003u + w;
  memcpy(buffer, words, size);
  return size;
}

static int64_t word_ts(uint64_t i) {
  return i % 2 == 0 ? (int64_t)i * 3 : SL_NO_TIMESTAMP;
}

static int word_next(sl_ctx *ctx, void *state) {
  varlen_state *s = state;
  uint8_t buffer[80];
  for (unsigned k = 0; k < SOURCE_BATCH && s->next < s->spec->count;
       k++, s->next++) {
    uint32_t size = word_fill(buffer, s->next);
    int rc = sl_emit_ts(ctx, buffer, size, word_ts(s->next));
    if (rc)
      return rc;
  }
  return s->next == s->spec->count ? SL_SOURCE_END : 0;
}

static int word_map(void *user, const sl_record *in, void *out,
                    uint32_t *out_size_bytes) {
  (void)user;
  uint8_t *to = out;
  uint32_t at = 0;
  for (; at + 8 <= in->size_bytes; at += 8) {
    uint64_t w;
    memcpy(&w, (const uint8_t *)in->data + at, 8);
    memcpy(to + at, &w, 8);
  }
  for (; at < in->size_bytes; at++)
    to[at] = ((const uint8_t *)in->data)[at];
  *out_size_bytes = in->size_bytes;
  return 0;
}

typedef struct word_check {
  atomic_ullong records, bad;
} word_check;

static int word_sink(sl_ctx *ctx, void *state, int input, const sl_record *in) {
  (void)ctx;
  (void)input;
  word_check *check = state;
  uint8_t want[80];
  uint64_t i = 0;
  if (in->size_bytes >= 8)
    memcpy(&i, in->data, 8);
  uint32_t size = word_fill(want, i);
  if (in->size_bytes != size || memcmp(in->data, want, size) != 0 ||
      in->timestamp != word_ts(i))
    atomic_fetch_add(&check->bad, 1);
  atomic_fetch_add(&check->records, 1);
  return 0;
}

Test(records, word_sized_records_keep_bytes_and_timestamps, .timeout = 60) {
  varlen_spec spec = {.count = sl_test_scaled(200000, 2000)};
  static const sl_source_ops ops = {
      .open = varlen_open, .next = word_next, .close = varlen_close};
  static const sl_process_ops sink_ops = {.process = word_sink};
  static word_check check;
  /* Once chained (everything in one thread, so the map's stores are
   * fresh when emit copies them), once one thread an instance. */
  const int modes[2] = {SL_CHAINING_ALWAYS, SL_CHAINING_NEVER};
  for (int m = 0; m < 2; m++) {
    atomic_store(&check.records, 0);
    atomic_store(&check.bad, 0);
    sl_job_config config = {.struct_bytes = sizeof(sl_job_config),
                            .ring_bytes = 8192,
                            .chaining = modes[m]};
    sl_job *job = job_new(&config);
    sl_op *src, *map, *fm, *sink;
    OK(job, sl_op_source(job, "words", 1, &ops, &spec, &src));
    OK(job, sl_op_map(job, "copy", src, 1, 80, word_map, 0, &map));
    OK(job, sl_op_flat_map(job, "echo", map, 1, echo_flat_map, 0, &fm));
    OK(job, sl_op_sink(job, "check", fm, 1, &sink_ops, &check, &sink));
    int rc = run_guarded(job, RUN_LIMIT_S);
    cr_assert_eq(rc, 0, "%s", sl_job_error(job));
    cr_assert_eq(atomic_load(&check.records), spec.count, "chaining %d",
                 modes[m]);
    cr_assert_eq(atomic_load(&check.bad), 0,
                 "chaining %d: %llu records differ", modes[m],
                 (unsigned long long)atomic_load(&check.bad));
    job_free(job);
  }
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

