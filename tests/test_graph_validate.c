/* test_graph_validate.c — Criterion tests of graph and configuration
 * validation (engine/graph.c): refused graphs and builder calls return
 * SL_EGRAPH with a message naming the operator and leave the graph
 * unaltered; invalid configurations are refused at sl_job_create; keyed
 * parallelism is bounded by max_parallelism.  Helpers: graph_fixture.h.
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
#include "test_util.h"

TestSuite(validate, .fini = free_leftover_jobs);
TestSuite(config, .fini = free_leftover_jobs);
TestSuite(keyby, .fini = free_leftover_jobs);

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

Test(keyby, key_instance_rejects_bad_arguments) {
  cr_assert_eq(sl_key_instance(7, 0, 1), -1);
  cr_assert_eq(sl_key_instance(7, 128, 0), -1);
  cr_assert_eq(sl_key_instance(7, 4, 5), -1);
  int i = sl_key_instance(7, 128, 4);
  cr_assert(i >= 0 && i < 4);
}
