/* test_graph_lifecycle.c — Criterion tests of a job's life on real
 * threads (engine/instance.c, engine/runtime.c, engine/graph.c): each
 * callback called once, errors that name the operator and cause, stopping
 * from another thread, oversubscribed threads, what emit refuses, thread
 * names.  Helpers: graph_fixture.h.
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

TestSuite(lifecycle, .fini = free_leftover_jobs);
TestSuite(errors, .fini = free_leftover_jobs);
TestSuite(stop, .fini = free_leftover_jobs);
TestSuite(oversubscribed, .fini = free_leftover_jobs);
TestSuite(emit, .fini = free_leftover_jobs);
TestSuite(names, .fini = free_leftover_jobs);

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

/* source -> triple -> relay sink, parallelism p after the source,
 * stopped 100 ms after it started: wait must return SL_ESTOPPED, and
 * every instance must have opened and closed once (none finished). */
static void stop_pipeline(const sl_job_config *config, const char *src_name,
                          range_spec *src_spec, int p, const char *sink_name,
                          relay_spec *sink_spec) {
  sl_job *job = job_new(config);
  sl_op *src, *map, *sink;
  src = add_range(job, src_name, 1, src_spec);
  OK(job, sl_op_map(job, "triple", src, p, sizeof(sl_tuple), triple_plus_one,
                    0, &map));
  OK(job, sl_op_sink(job, sink_name, map, p, &relay_ops, sink_spec, &sink));
  double latency_s;
  int rc = run_and_stop(job, 100000, &latency_s);
  cr_assert_eq(rc, SL_ESTOPPED, "wait returned %d (%s)", rc, sl_strerror(rc));
  cr_log_info("stop took %.1f ms", latency_s * 1e3); /* measured, not asserted */
  assert_lifecycle(&sink_spec->life, p, 1, 1, 0, "sink");
  assert_lifecycle(&src_spec->life, 1, 1, 1, 0, "source");
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
  stop_pipeline(&config, "idle", &src_spec, 2, "end", &last);
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
  stop_pipeline(&config, "endless", &src_spec, 1, "slow_sink", &slow);
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

/* A source's next() returning something other than 0, SL_SOURCE_END or a
 * negative error fails the job with a message, instead of looping. */
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
