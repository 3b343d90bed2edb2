/* test_kafka_nexmark.c — Nexmark over Kafka with the real `sluice`
 * (SLUICE_BIN): `nexmark gen --kafka` into a topic of the mock, `nexmark
 * run --kafka-input --kafka-output` killed (SIGKILL, by the engine's crash
 * fault) right after a checkpoint commit and resumed, then `kafka dump`:
 * every row of the uninterrupted file run is in the output topic, and no
 * other row (at-least-once: a row may come twice). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kafka_fixture.h"
#include "test_dirs.h"
#include "test_spawn.h"

#define EVENTS "40000"

/* The sorted distinct lines of path (skipping `skip` lines first) into
 * a file sorted.txt beside it; returns that path in out. */
static void sorted_unique(const char *path, int skip, char *out,
                          size_t out_bytes) {
  snprintf(out, out_bytes, "%s.sorted", path);
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "tail -n +%d '%s' | LC_ALL=C sort -u > '%s'",
           skip + 1, path, out);
  cr_assert_eq(system(cmd), 0, "%s", cmd);
}

Test(kafka_nexmark, q5_killed_after_a_commit_and_resumed_loses_no_row) {
  kafka_mock m;
  kafka_mock_start(&m, (const char *const[]){"events:3", "rows:2", NULL});
  char *dir = sl_test_temp_dir("kafka-nexmark");
  char log[512], events[512], file[512], state[512], in[600], out[600];
  snprintf(log, sizeof log, "%s/log.txt", dir);
  snprintf(events, sizeof events, "%s/events.jsonl", dir);
  snprintf(file, sizeof file, "%s/q5.csv", dir);
  snprintf(state, sizeof state, "%s/state", dir);
  snprintf(in, sizeof in, "%s/events", m.bootstrap);
  snprintf(out, sizeof out, "%s/rows", m.bootstrap);
  /* The reference: the same events from a file, uninterrupted. */
  cr_assert_eq(sl_test_run_sluice(log, (const char *const[]){
                   "nexmark", "gen", "--events", EVENTS, "--output", events,
                   NULL}), 0);
  cr_assert_eq(sl_test_run_sluice(log, (const char *const[]){
                   "nexmark", "run", "--query", "q5", "--input", events,
                   "--output", file, "--quiet", NULL}), 0);
  cr_assert_eq(sl_test_run_sluice(log, (const char *const[]){
                   "nexmark", "gen", "--events", EVENTS, "--kafka",
                   m.bootstrap, "--topic", "events", "--partitions", "3",
                   NULL}), 0, "gen --kafka failed (see %s)", log);
  /* Killed right after the second checkpoint's commit; slow keeps the
   * run longer than two checkpoint intervals. */
  int status = sl_test_run_sluice(log, (const char *const[]){
      "nexmark", "run", "--query", "q5", "--kafka-input", in,
      "--kafka-output", out, "--parallelism", "2", "--state-dir", state,
      "--checkpoint-interval", "10", "--quiet",
      "--fault", "crash:point=after-commit,nth=2",
      "--fault", "slow:op=events,delay_us=20", NULL});
  cr_assert_eq(status, 128 + 9, "the run was not killed (status %d, see %s)",
               status, log);
  cr_assert_eq(sl_test_run_sluice(log, (const char *const[]){
                   "nexmark", "run", "--query", "q5", "--kafka-input", in,
                   "--kafka-output", out, "--parallelism", "2",
                   "--state-dir", state, "--resume", "--quiet", NULL}), 0,
               "the resume failed (see %s)", log);
  char dump[512];
  snprintf(dump, sizeof dump, "%s/dump.txt", dir);
  cr_assert_eq(sl_test_run_sluice(dump, (const char *const[]){
                   "kafka", "dump", out, NULL}), 0);
  char want[600], got[600];
  sorted_unique(file, 1, want, sizeof want); /* the header line */
  sorted_unique(dump, 0, got, sizeof got);
  char cmd[1400];
  snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", want, got);
  cr_expect_eq(system(cmd), 0, "the output topic's rows differ from the "
               "file run's: diff %s %s", want, got);
  snprintf(cmd, sizeof cmd, "test $(wc -l < '%s') -gt 0", want);
  cr_expect_eq(system(cmd), 0, "q5 gave no row at all");
  kafka_mock_stop(&m);
  sl_test_remove_tree(dir);
}

/* A line that is not an event fails the run, naming where it is. */
Test(kafka_nexmark, bad_event_line_names_topic_partition_and_offset) {
  kafka_mock m;
  kafka_mock_start(&m, (const char *const[]){"events:1", NULL});
  const void *values[1] = {"{\"event_type\":2}"};
  uint32_t sizes[1] = {(uint32_t)strlen(values[0])};
  int32_t parts[1] = {0};
  kafka_produce(&m, "events", 1, values, sizes, parts, NULL);
  char *dir = sl_test_temp_dir("kafka-nexmark");
  char log[512], in[600];
  snprintf(log, sizeof log, "%s/log.txt", dir);
  snprintf(in, sizeof in, "%s/events", m.bootstrap);
  int status = sl_test_run_sluice(log, (const char *const[]){
      "nexmark", "run", "--query", "q0", "--kafka-input", in, "--quiet",
      NULL});
  cr_expect_eq(status, 1);
  char cmd[700];
  snprintf(cmd, sizeof cmd, "grep -q 'topic events partition 0 offset 0: "
           "bad record' '%s'", log);
  cr_expect_eq(system(cmd), 0, "no message naming the record (see %s)", log);
  kafka_mock_stop(&m);
  sl_test_remove_tree(dir);
}

/* Two processes split a topic's partitions ("0" and "1-2"), each with its
 * own state directory, into one output topic: together they give the
 * single file run's rows, each once (q1: one row per bid, no state across
 * events). */
Test(kafka_nexmark, two_processes_splitting_a_topic_give_the_single_run) {
  kafka_mock m;
  kafka_mock_start(&m, (const char *const[]){"events:3", "rows:2", NULL});
  char *dir = sl_test_temp_dir("kafka-nexmark");
  char log[512], events[512], file[512], in[600], out[600];
  snprintf(log, sizeof log, "%s/log.txt", dir);
  snprintf(events, sizeof events, "%s/events.jsonl", dir);
  snprintf(file, sizeof file, "%s/q1.csv", dir);
  snprintf(in, sizeof in, "%s/events", m.bootstrap);
  snprintf(out, sizeof out, "%s/rows", m.bootstrap);
  cr_assert_eq(sl_test_run_sluice(log, (const char *const[]){
                   "nexmark", "gen", "--events", "20000", "--output", events,
                   NULL}), 0);
  cr_assert_eq(sl_test_run_sluice(log, (const char *const[]){
                   "nexmark", "run", "--query", "q1", "--input", events,
                   "--output", file, "--quiet", NULL}), 0);
  cr_assert_eq(sl_test_run_sluice(log, (const char *const[]){
                   "nexmark", "gen", "--events", "20000", "--kafka",
                   m.bootstrap, "--topic", "events", "--partitions", "3",
                   NULL}), 0, "gen --kafka failed (see %s)", log);
  const char *lists[2] = {"0", "1-2"};
  for (int p = 0; p < 2; p++) {
    char state[600];
    snprintf(state, sizeof state, "%s/state-%d", dir, p);
    cr_assert_eq(sl_test_run_sluice(log, (const char *const[]){
                     "nexmark", "run", "--query", "q1", "--kafka-input", in,
                     "--kafka-partitions", lists[p], "--kafka-output", out,
                     "--state-dir", state, "--quiet", NULL}), 0,
                 "process %d failed (see %s)", p, log);
  }
  char dump[512];
  snprintf(dump, sizeof dump, "%s/dump.txt", dir);
  cr_assert_eq(sl_test_run_sluice(dump, (const char *const[]){
                   "kafka", "dump", out, NULL}), 0);
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "tail -n +2 '%s' | LC_ALL=C sort > '%s.want' && "
           "LC_ALL=C sort '%s' > '%s.got' && cmp -s '%s.want' '%s.got' && "
           "test -s '%s.want'", file, dir, dump, dir, dir, dir, dir);
  cr_expect_eq(system(cmd), 0, "the two processes' rows differ from the "
               "single run's: diff %s.want %s.got", dir, dir);
  kafka_mock_stop(&m);
  sl_test_remove_tree(dir);
}
