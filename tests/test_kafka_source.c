/* test_kafka_source.c — the Kafka source (operators/kafka_source.c)
 * against `sluice kafka mock` in a child process (kafka_fixture.h):
 * offsets restored after a failover give exactly-once results, a bad
 * record names its topic, partition and offset (or lands once in the
 * dead letters with them), and an idle partition does not hold the
 * watermark back. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "fixtures.h"
#include "kafka_fixture.h"
#include "sluice.h"
#include "sluice_testing.h"
#include "test_dirs.h"
#include "test_util.h"

/* The time of a tuple: its value; anything else is a bad record. */
static int tuple_time(void *user, const void *value, uint32_t value_bytes,
                      int64_t kafka_timestamp_ms, int64_t *timestamp,
                      char *why, size_t why_bytes) {
  (void)user;
  (void)kafka_timestamp_ms;
  if (value_bytes != sizeof(sl_tuple)) {
    snprintf(why, why_bytes, "expected a %zu-byte tuple, got %" PRIu32
             " bytes", sizeof(sl_tuple), value_bytes);
    return 1;
  }
  sl_tuple t;
  memcpy(&t, value, sizeof t);
  *timestamp = (int64_t)t.value;
  return 0;
}

static int run_to_end(sl_job *job, const char *what) {
  sl_test_watchdog w;
  int rc = sl_job_start(job);
  if (rc == 0) {
    sl_test_watchdog_arm(&w, job, 120, what);
    rc = sl_job_wait(job);
    cr_assert_not(sl_test_watchdog_disarm(&w), "%s hung", what);
  }
  return rc;
}

/* A failure at the second checkpoint completion the source sees: the
 * restart restores a completed checkpoint's offsets, and the verifying
 * sink (its counts are checkpointed) finds every record once, in order. */
Test(kafka_source, offsets_restored_after_failover_give_exactly_once) {
  const uint32_t count = 3000;
  const uint64_t keys = 30;
  kafka_mock m;
  kafka_mock_start(&m, (const char *const[]){"events:3", NULL});
  kafka_produce_tuples(&m, "events", count, keys, 3);
  char *dir = sl_test_temp_dir("kafka-src");
  sl_job_config config = sl_fixture_config(dir, 10);
  config.restart = sl_restart_defaults(SL_RESTART_FIXED_DELAY);
  config.restart.attempts = 2;
  config.restart.delay_ms = 10;
  /* slow: the run lasts well beyond two checkpoint intervals. */
  config.faults = "complete:op=source,nth=2; slow:op=verify,delay_us=100";
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  sl_kafka_source_config kc = {.bootstrap = m.bootstrap, .topic = "events",
                               .bounded = 1, .timestamp_fn = tuple_time};
  sl_op *src, *verify;
  cr_assert_eq(sl_source_kafka(job, "source", 2, &kc, &src), 0,
               "%s", sl_job_error(job));
  cr_assert_eq(sl_sink_verify(job, "verify", src, 2, count, keys, &verify), 0);
  int rc = run_to_end(job, "kafka failover job");
  cr_expect_eq(rc, 0, "job failed: %s", sl_job_error(job));
  cr_expect_eq(sl_job_restarts(job), 1);
  sl_recovery_stats rs;
  cr_assert_eq(sl_job_recovery_stats(job, 0, &rs), 0);
  cr_expect_gt(rs.restored_from, 0, "the restart restored no checkpoint");
  kafka_expect_exactly_once(verify, count);
  sl_job_destroy(job);
  sl_test_remove_tree(dir);
  kafka_mock_stop(&m);
}

static int compare_bytes16(const void *a, const void *b) {
  return memcmp(a, b, 16);
}

/* The job fails with the first bad record's topic, partition and offset
 * and the reason. */
static void expect_bad_record(const void *bad, uint32_t bad_bytes,
                              const char *expected) {
  kafka_mock m;
  kafka_mock_start(&m, (const char *const[]){"bad:1", NULL});
  sl_tuple good[3] = {{1, 10}, {2, 20}, {3, 30}};
  const void *values[4] = {&good[0], &good[1], &good[2], bad};
  uint32_t sizes[4] = {16, 16, 16, bad_bytes};
  int32_t parts[4] = {0, 0, 0, 0};
  kafka_produce(&m, "bad", 4, values, sizes, parts, NULL);
  sl_job *job;
  cr_assert_eq(sl_job_create(NULL, &job), 0);
  sl_kafka_source_config kc = {.bootstrap = m.bootstrap, .topic = "bad",
                               .bounded = 1, .timestamp_fn = tuple_time};
  sl_op *src, *sink;
  cr_assert_eq(sl_source_kafka(job, "source", 1, &kc, &src), 0);
  static sl_fixture_collector collector = {.record_bytes = 16};
  cr_assert_eq(sl_op_sink(job, "sink", src, 1, &sl_fixture_collector_ops,
                          &collector, &sink), 0);
  int rc = run_to_end(job, "bad record job");
  cr_expect_neq(rc, 0, "a bad record did not fail the job");
  cr_expect(strstr(sl_job_error(job), expected), "error: %s",
            sl_job_error(job));
  sl_job_destroy(job);
  kafka_mock_stop(&m);
  uint64_t n;
  free(sl_fixture_collector_gather(&collector, compare_bytes16, &n));
}

Test(kafka_source, bad_record_names_topic_partition_and_offset) {
  expect_bad_record("oops", 4, "topic bad partition 0 offset 3: bad record: "
                               "expected a 16-byte tuple, got 4 bytes");
}

Test(kafka_source, message_without_value_is_a_bad_record) {
  expect_bad_record(NULL, 0, "topic bad partition 0 offset 3: bad record: "
                             "the message has no value");
}

/* Per-partition watermarks: partition 0 has times 1000 .. 1009, partition
 * 1 nothing.  Once partition 1 is idle (at its end, quiet for 20 ms) the
 * source's watermark is partition 0's, 1009 - 1: the sink sees it while
 * the (unbounded) source still runs. */
static _Atomic int64_t g_watermark = SL_WATERMARK_MIN;

static int watermark_seen(sl_ctx *ctx, void *state, int64_t watermark) {
  (void)ctx;
  (void)state;
  if (watermark != SL_WATERMARK_MAX)
    atomic_store(&g_watermark, watermark);
  return 0;
}

static int ignore_record(sl_ctx *ctx, void *state, int input,
                         const sl_record *in) {
  (void)ctx, (void)state, (void)input, (void)in;
  return 0;
}

Test(kafka_source, idle_partition_does_not_hold_the_watermark_back) {
  kafka_mock m;
  kafka_mock_start(&m, (const char *const[]){"wm:2", NULL});
  sl_tuple t[10];
  const void *values[10];
  uint32_t sizes[10];
  int32_t parts[10];
  int64_t times[10];
  for (int i = 0; i < 10; i++) {
    t[i] = (sl_tuple){.key = 1, .value = (uint64_t)i};
    values[i] = &t[i], sizes[i] = 16, parts[i] = 0, times[i] = 1000 + i;
  }
  kafka_produce(&m, "wm", 10, values, sizes, parts, times);
  sl_job *job;
  cr_assert_eq(sl_job_create(NULL, &job), 0);
  sl_kafka_source_config kc = {.bootstrap = m.bootstrap, .topic = "wm",
                               .watermarks = 1, .idle_timeout_ms = 20};
  sl_op *src, *sink;
  cr_assert_eq(sl_source_kafka(job, "source", 1, &kc, &src), 0);
  static const sl_process_ops ops = {.process = ignore_record,
                                     .on_watermark = watermark_seen};
  cr_assert_eq(sl_op_sink(job, "sink", src, 1, &ops, NULL, &sink), 0);
  cr_assert_eq(sl_job_start(job), 0);
  /* A condition, not a time: at most 30 s for it. */
  for (int i = 0; i < 30000 && atomic_load(&g_watermark) != 1008; i++)
    sl_test_sleep_us(1000);
  cr_expect_eq(atomic_load(&g_watermark), 1008);
  sl_job_stop(job);
  sl_job_wait(job);
  sl_job_destroy(job);
  kafka_mock_stop(&m);
}

/* A configuration the builder refuses, with the reason. */
Test(kafka_source, bad_partition_list_is_refused) {
  sl_job *job;
  cr_assert_eq(sl_job_create(NULL, &job), 0);
  sl_kafka_source_config kc = {.bootstrap = "127.0.0.1:1", .topic = "t",
                               .partitions = "3-1"};
  sl_op *src;
  cr_expect_eq(sl_source_kafka(job, "source", 1, &kc, &src), EINVAL);
  cr_expect(strstr(sl_job_error(job), "LOW <= HIGH"), "%s", sl_job_error(job));
  kc.partitions = "0-3,x";
  cr_expect_eq(sl_source_kafka(job, "source", 1, &kc, &src), EINVAL);
  sl_job_destroy(job);
}

/* A property that would undo a setting the source's guarantees rely on is
 * refused, naming it; another librdkafka setting is taken. */
Test(kafka_source, reserved_property_is_refused) {
  sl_job *job;
  cr_assert_eq(sl_job_create(NULL, &job), 0);
  sl_kafka_source_config kc = {
      .bootstrap = "127.0.0.1:1", .topic = "t",
      .properties = (const char *const[]){"socket.timeout.ms=5000",
                                          "isolation.level=read_uncommitted",
                                          NULL}};
  sl_op *src;
  cr_expect_eq(sl_source_kafka(job, "source", 1, &kc, &src), EINVAL);
  cr_expect(strstr(sl_job_error(job), "isolation.level is set by the "
                                      "operator"), "%s", sl_job_error(job));
  kc.properties = (const char *const[]){"enable.auto.commit=true", NULL};
  cr_expect_eq(sl_source_kafka(job, "source", 1, &kc, &src), EINVAL);
  cr_expect(strstr(sl_job_error(job), "enable.auto.commit"), "%s",
            sl_job_error(job));
  kc.properties = (const char *const[]){"socket.timeout.ms=5000", NULL};
  cr_expect_eq(sl_source_kafka(job, "source", 1, &kc, &src), 0, "%s",
               sl_job_error(job));
  sl_job_destroy(job);
}

/* Offsets committed back on checkpoint completion (commit_offsets) are
 * where a second job starting at SL_KAFKA_COMMITTED begins: after the
 * first job read all 60 messages, the second reads none of them; the 20
 * produced after the first job are all it reads. */
static uint64_t run_committed(const kafka_mock *m, const char *dir,
                              int start) {
  sl_job_config config = sl_fixture_config(dir, 10);
  config.checkpoint.store_policy = SL_STORE_FRESH;
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  sl_kafka_source_config kc = {.bootstrap = m->bootstrap, .topic = "c",
                               .bounded = 1, .start = start,
                               .group_id = "committed-test",
                               .commit_offsets = 1};
  sl_op *src, *sink;
  cr_assert_eq(sl_source_kafka(job, "source", 2, &kc, &src), 0);
  static sl_fixture_collector collector = {.record_bytes = 16};
  cr_assert_eq(sl_op_sink(job, "sink", src, 1, &sl_fixture_collector_ops,
                          &collector, &sink), 0);
  cr_expect_eq(run_to_end(job, "committed offsets job"), 0, "%s",
               sl_job_error(job));
  sl_job_destroy(job);
  uint64_t n;
  free(sl_fixture_collector_gather(&collector, compare_bytes16, &n));
  return n;
}

/* Wait (a condition, at most 30 s) until group committed-test's offsets
 * of topic c's three partitions are 20 each: the first job's final
 * asynchronous commit has landed. */
static void await_committed_ends(const kafka_mock *m) {
  char err[256];
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  cr_assert_eq(rd_kafka_conf_set(conf, "bootstrap.servers", m->bootstrap,
                                 err, sizeof err), RD_KAFKA_CONF_OK);
  cr_assert_eq(rd_kafka_conf_set(conf, "group.id", "committed-test", err,
                                 sizeof err), RD_KAFKA_CONF_OK);
  rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
  rd_kafka_t *c = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
  cr_assert(c, "consumer: %s", err);
  bool landed = false;
  for (int i = 0; i < 300 && !landed; i++) { /* 300 x (<= 100 ms + 0.1 s) */
    rd_kafka_topic_partition_list_t *list =
        rd_kafka_topic_partition_list_new(3);
    for (int32_t p = 0; p < 3; p++)
      rd_kafka_topic_partition_list_add(list, "c", p);
    landed = rd_kafka_committed(c, list, 100) == 0;
    for (int p = 0; landed && p < 3; p++)
      landed = list->elems[p].err == 0 && list->elems[p].offset == 20;
    rd_kafka_topic_partition_list_destroy(list);
    if (!landed)
      sl_test_sleep_us(100000);
  }
  rd_kafka_destroy(c);
  cr_assert(landed, "the first job's offsets were not committed");
}

Test(kafka_source, committed_offsets_start_the_next_job) {
  kafka_mock m;
  kafka_mock_start(&m, (const char *const[]){"c:3", NULL});
  kafka_produce_tuples(&m, "c", 60, 6, 3);
  char *dir = sl_test_temp_dir("kafka-commit");
  cr_expect_eq(run_committed(&m, dir, SL_KAFKA_EARLIEST), 60);
  await_committed_ends(&m);
  kafka_produce_tuples(&m, "c", 20, 6, 3);
  uint64_t second = run_committed(&m, dir, SL_KAFKA_COMMITTED);
  cr_expect_eq(second, 20, "the second job read %" PRIu64, second);
  sl_test_remove_tree(dir);
  kafka_mock_stop(&m);
}

/* Dead letters (kafka_source.c note 8): 3000 tuples with a bad record in
 * the middle of partition 1 (after the 500 tuples of that partition among
 * the first 1500), and a failover at the source's second checkpoint
 * completion.  The job does not fail on the record; instance 1 (partition
 * 1 % 2) writes it, with its topic, partition and offset, exactly once into
 * PATH.1 however the failover fell; instance 0's PATH.0 stays empty; the
 * verifying sink finds every tuple once. */
Test(kafka_source, bad_record_goes_to_the_dead_letters_once) {
  const uint32_t count = 3000, half = 1500;
  const uint64_t keys = 30;
  kafka_mock m;
  kafka_mock_start(&m, (const char *const[]){"events:3", NULL});
  sl_tuple *tuples = calloc(count, sizeof *tuples);
  const void **values = calloc(count + 1, sizeof *values);
  uint32_t *sizes = calloc(count + 1, sizeof *sizes);
  int32_t *parts = calloc(count + 1, sizeof *parts);
  cr_assert(tuples && values && sizes && parts);
  for (uint32_t i = 0, at = 0; i < count; i++, at++) {
    if (i == half) { /* the bad record, between the two halves */
      values[at] = "oops", sizes[at] = 4, parts[at] = 1;
      at++;
    }
    tuples[i] = (sl_tuple){.key = i % keys, .value = i};
    values[at] = &tuples[i];
    sizes[at] = sizeof tuples[i];
    parts[at] = (int32_t)(tuples[i].key % 3);
  }
  kafka_produce(&m, "events", count + 1, values, sizes, parts, NULL);
  free(tuples), free(values), free(sizes), free(parts);
  char *dir = sl_test_temp_dir("kafka-dead");
  char *dead = sl_test_path_in(dir, "dead.tsv");
  sl_job_config config = sl_fixture_config(dir, 10);
  config.restart = sl_restart_defaults(SL_RESTART_FIXED_DELAY);
  config.restart.attempts = 2;
  config.restart.delay_ms = 10;
  config.faults = "complete:op=source,nth=2; slow:op=verify,delay_us=100";
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  sl_kafka_source_config kc = {.bootstrap = m.bootstrap, .topic = "events",
                               .bounded = 1, .timestamp_fn = tuple_time,
                               .dead_letter_path = dead};
  sl_op *src, *verify;
  cr_assert_eq(sl_source_kafka(job, "source", 2, &kc, &src), 0, "%s",
               sl_job_error(job));
  cr_assert_eq(sl_sink_verify(job, "verify", src, 2, count, keys, &verify), 0);
  int rc = run_to_end(job, "kafka dead-letter job");
  cr_expect_eq(rc, 0, "job failed: %s", sl_job_error(job));
  cr_expect_eq(sl_job_restarts(job), 1);
  sl_verify_counts v;
  cr_assert_eq(sl_verify_result(verify, &v), 0);
  cr_expect(v.complete);
  cr_expect_eq(v.records, count);
  cr_expect_eq(v.lost + v.duplicates + v.out_of_order, 0);
  sl_job_destroy(job);
  char path[4200];
  snprintf(path, sizeof path, "%s.1", dead);
  char *text = sl_test_slurp(path);
  cr_expect_str_eq(text, "topic events partition 1\t500\texpected a 16-byte "
                         "tuple, got 4 bytes\toops\n");
  free(text);
  snprintf(path, sizeof path, "%s.0", dead);
  text = sl_test_slurp(path);
  cr_expect_str_eq(text, "");
  free(text);
  free(dead);
  sl_test_remove_tree(dir);
  kafka_mock_stop(&m);
}

/* A bounded source over a partition with nothing in it ends: partition 1
 * of "e" is empty, so its position stays "earliest" until the consumer
 * reports the partition's end (its EOF offset becomes the position).
 * Then a job over partition 1 alone ends with no record. */
static uint64_t run_bounded(const kafka_mock *m, const char *topic,
                            const char *partitions, int *rc) {
  sl_job *job;
  cr_assert_eq(sl_job_create(NULL, &job), 0);
  sl_kafka_source_config kc = {.bootstrap = m->bootstrap, .topic = topic,
                               .bounded = 1, .partitions = partitions,
                               .timeout_ms = 3000};
  sl_op *src, *sink;
  cr_assert_eq(sl_source_kafka(job, "source", 1, &kc, &src), 0);
  static sl_fixture_collector collector = {.record_bytes = 16};
  cr_assert_eq(sl_op_sink(job, "sink", src, 1, &sl_fixture_collector_ops,
                          &collector, &sink), 0);
  *rc = run_to_end(job, "bounded job");
  if (*rc)
    cr_expect(sl_job_error(job)[0], "the job failed without an error text");
  sl_job_destroy(job);
  uint64_t n;
  free(sl_fixture_collector_gather(&collector, compare_bytes16, &n));
  return n;
}

Test(kafka_source, empty_partition_ends_a_bounded_source) {
  kafka_mock m;
  kafka_mock_start(&m, (const char *const[]){"e:2", NULL});
  sl_tuple t[5];
  const void *values[5];
  uint32_t sizes[5];
  int32_t parts[5];
  for (int i = 0; i < 5; i++) {
    t[i] = (sl_tuple){.key = 1, .value = (uint64_t)i};
    values[i] = &t[i], sizes[i] = 16, parts[i] = 0;
  }
  kafka_produce(&m, "e", 5, values, sizes, parts, NULL);
  int rc;
  cr_expect_eq(run_bounded(&m, "e", NULL, &rc), 5);
  cr_expect_eq(rc, 0);
  cr_expect_eq(run_bounded(&m, "e", "1", &rc), 0);
  cr_expect_eq(rc, 0);
  kafka_mock_stop(&m);
}

/* A topic that does not exist: the mock makes it on the metadata request,
 * with empty partitions; the bounded job ends (or fails with a reason)
 * rather than waiting for ever. */
Test(kafka_source, missing_topic_does_not_hang_a_bounded_source) {
  kafka_mock m;
  kafka_mock_start(&m, (const char *const[]){"other:1", NULL});
  int rc;
  cr_expect_eq(run_bounded(&m, "nosuch", NULL, &rc), 0);
  kafka_mock_stop(&m);
}
