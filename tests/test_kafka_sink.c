/* test_kafka_sink.c — the at-least-once Kafka sink (operators/
 * kafka_sink.c) against `sluice kafka mock` (kafka_fixture.h), read back
 * with `sluice kafka dump`: a keyed running count from a Kafka topic into
 * another, through produce errors the mock injects, loses no row. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "kafka_fixture.h"
#include "sluice.h"
#include "sluice_testing.h"
#include "test_dirs.h"
#include "test_spawn.h"
#include "test_util.h"

#define COUNT 3000u
#define KEYS 30u

/* source -> key_by -> running count -> Kafka sink "out", checkpointed,
 * restarted on failure.  Returns the job's status; *restarts gets its
 * restarts. */
static int run_count(const kafka_mock *m, const char *dir,
                     uint32_t *restarts) {
  sl_job_config config = sl_fixture_config(dir, 10);
  config.restart = sl_restart_defaults(SL_RESTART_FIXED_DELAY);
  config.restart.attempts = 3;
  config.restart.delay_ms = 10;
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  sl_kafka_source_config in = {.bootstrap = m->bootstrap, .topic = "in",
                               .bounded = 1};
  sl_kafka_sink_config out = {.bootstrap = m->bootstrap, .topic = "out",
                              .format = sl_fixture_format_tuple,
                              .timeout_ms = 20000};
  sl_op *src, *by, *count, *sink;
  cr_assert_eq(sl_source_kafka(job, "source", 2, &in, &src), 0);
  cr_assert_eq(sl_op_key_by(job, "by-key", src, sl_fixture_tuple_key, NULL,
                            &by), 0);
  static const sl_process_ops count_ops = {.process = sl_fixture_count_process};
  cr_assert_eq(sl_op_process(job, "count", &by, 1, 2, &count_ops, NULL,
                             &count), 0);
  cr_assert_eq(sl_sink_kafka(job, "sink", count, 2, &out, &sink), 0,
               "%s", sl_job_error(job));
  sl_test_watchdog w;
  int rc = sl_job_start(job);
  if (rc == 0) {
    sl_test_watchdog_arm(&w, job, 120, "kafka sink job");
    rc = sl_job_wait(job);
    cr_assert_not(sl_test_watchdog_disarm(&w), "the job hung");
  }
  if (rc)
    cr_log_error("job: %s", sl_job_error(job));
  *restarts = sl_job_restarts(job);
  sl_job_destroy(job);
  return rc;
}

/* `sluice kafka dump` of topic "out": every expected row "k,c" (k <
 * KEYS, c = 1 .. COUNT / KEYS) at least once, nothing else.  Returns the
 * number of lines (duplicates included). */
static uint64_t check_rows(const kafka_mock *m, const char *dir) {
  char address[600], log[512];
  snprintf(address, sizeof address, "%s/out", m->bootstrap);
  snprintf(log, sizeof log, "%s/dump.txt", dir);
  int status = sl_test_run_sluice(log, (const char *const[]){"kafka", "dump",
                                                               address, NULL});
  cr_assert_eq(status, 0, "sluice kafka dump failed (see %s)", log);
  static uint32_t seen[KEYS][COUNT / KEYS + 1];
  memset(seen, 0, sizeof seen);
  FILE *f = fopen(log, "r");
  cr_assert(f);
  char line[128];
  uint64_t lines = 0;
  while (fgets(line, sizeof line, f)) {
    uint64_t key, c;
    cr_assert_eq(sscanf(line, "%" SCNu64 ",%" SCNu64, &key, &c), 2,
                 "a line that is no row: %s", line);
    cr_assert(key < KEYS && c >= 1 && c <= COUNT / KEYS, "unexpected row %s",
              line);
    seen[key][c]++;
    lines++;
  }
  fclose(f);
  for (uint32_t k = 0; k < KEYS; k++)
    for (uint32_t c = 1; c <= COUNT / KEYS; c++)
      cr_assert_gt(seen[k][c], 0, "row %u,%u was lost", k, c);
  return lines;
}

/* Without failures every row comes exactly once. */
Test(kafka_sink, rows_reach_the_topic) {
  kafka_mock m;
  kafka_mock_start(&m, (const char *const[]){"in:3", "out:2", NULL});
  kafka_produce_tuples(&m, "in", COUNT, KEYS, 3);
  char *dir = sl_test_temp_dir("kafka-sink");
  uint32_t restarts;
  cr_expect_eq(run_count(&m, dir, &restarts), 0);
  cr_expect_eq(restarts, 0);
  cr_expect_eq(check_rows(&m, dir), COUNT, "duplicates without a failure");
  sl_test_remove_tree(dir);
  kafka_mock_stop(&m);
}

/* Produce requests refused by the mock: retriable ones (NOT_LEADER, 6)
 * are librdkafka's to retry; a permanent one (MSG_SIZE_TOO_LARGE, 10)
 * fails the job, which restarts from its last checkpoint: rows may come
 * twice, none is lost. */
Test(kafka_sink, produce_errors_fail_over_and_lose_nothing) {
  kafka_mock m;
  kafka_mock_start(&m, (const char *const[]){"in:3", "out:2", NULL});
  kafka_produce_tuples(&m, "in", COUNT, KEYS, 3);
  kafka_mock_command(&m, "errors 0 3 6");
  kafka_mock_command(&m, "errors 0 1 10");
  char *dir = sl_test_temp_dir("kafka-sink");
  uint32_t restarts;
  cr_expect_eq(run_count(&m, dir, &restarts), 0);
  cr_expect_geq(restarts, 1, "the refused message did not fail the job");
  cr_expect_geq(check_rows(&m, dir), COUNT);
  sl_test_remove_tree(dir);
  kafka_mock_stop(&m);
}
