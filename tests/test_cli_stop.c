/* test_cli_stop.c — `--stop-savepoint DIR` of `sluice run` and `sluice
 * nexmark run`: the first SIGTERM stops the job with a savepoint into DIR,
 * prints `stopped with savepoint DIR (checkpoint N)` and exits 0, and a run
 * started from there (--from-savepoint, or --state-dir --resume) finishes
 * with exactly the output of an uninterrupted run.  The real CLI
 * (SLUICE_BIN, set by meson) in child processes, real signals, real LMDB.
 * The API side is in test_stop_savepoint.c, POST /stop in test_http.c. */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_dirs.h"
#include "test_spawn.h"
#include "test_util.h"

static bool exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* Poll (bounded: about 60 s) until path exists: the job has started. */
static void wait_exists(const char *path, pid_t pid) {
  for (int i = 0; i < 60000 && !exists(path); i++) {
    cr_assert_eq(kill(pid, 0), 0, "the job ended before %s appeared", path);
    sl_test_sleep_us(1000);
  }
  cr_assert(exists(path), "%s never appeared", path);
}

/* The log's `stopped with savepoint DIR (checkpoint N)` line: N, or 0. */
static uint64_t stopped_line(const char *log, const char *dir) {
  char *text = sl_test_read_file(log, 0);
  cr_assert(text, "no log %s", log);
  char want[1200];
  snprintf(want, sizeof want, "stopped with savepoint %s (checkpoint ", dir);
  const char *at = strstr(text, want);
  uint64_t id = 0;
  if (at)
    sscanf(at + strlen(want), "%" SCNu64 ")", &id);
  if (!id)
    cr_log_error("log:\n%s", text);
  free(text);
  return id;
}

static bool log_has(const char *log, const char *words) {
  char *text = sl_test_read_file(log, 0);
  cr_assert(text);
  bool found = strstr(text, words) != 0;
  if (!found)
    cr_log_error("no '%s' in the log:\n%s", words, text);
  free(text);
  return found;
}

TestSuite(cli_stop, .timeout = 300);

Test(cli_stop, sigterm_stops_run_with_a_savepoint_that_a_run_continues) {
  char *dir = sl_test_temp_dir("cli-stop");
  char *state = sl_test_path_in(dir, "state");
  char *state2 = sl_test_path_in(dir, "state2");
  char *out = sl_test_path_in(dir, "out");
  char *sp = sl_test_path_in(dir, "sp");
  char *log = sl_test_path_in(dir, "log");
  char *log2 = sl_test_path_in(dir, "log2");
  /* The slow source (0.1 ms a record) keeps the job running until the
   * signal; the resumed run goes at full speed. */
  const char *first[] = {"run", "window", "--records", "100000", "--keys",
                         "100", "--state-dir", state, "--output", out,
                         "--checkpoint-interval-ms", "50", "--stop-savepoint",
                         sp, "--fault", "slow:op=source,delay_us=100",
                         "--quiet", NULL};
  pid_t pid = sl_test_spawn(log, first);
  wait_exists(state, pid);
  cr_assert_eq(kill(pid, SIGTERM), 0);
  cr_assert_eq(sl_test_reap(pid), 0, "a stop with a savepoint exits 0");
  uint64_t id = stopped_line(log, sp);
  cr_assert_gt(id, 0, "no `stopped with savepoint` line");
  char *manifest = sl_test_path_in(sp, "manifest.json");
  cr_assert(exists(manifest), "no savepoint in %s", sp);

  const char *second[] = {"run", "window", "--records", "100000", "--keys",
                          "100", "--state-dir", state2, "--output", out,
                          "--from-savepoint", sp, "--quiet", NULL};
  cr_assert_eq(sl_test_run_sluice(log2, second), 0);
  char resumed[64];
  snprintf(resumed, sizeof resumed, "resumed from checkpoint %" PRIu64, id);
  cr_assert(log_has(log2, resumed));
  cr_assert(log_has(log2, "verdict: EXACTLY-ONCE"));
  cr_assert(log_has(log2, " 0 lost, 0 duplicated"));
  free(manifest);
  free(log2);
  free(log);
  free(sp);
  free(out);
  free(state2);
  free(state);
  sl_test_remove_tree(dir);
}

Test(cli_stop, drain_and_stop_savepoint_need_their_partners) {
  char *dir = sl_test_temp_dir("cli-stop");
  char *log = sl_test_path_in(dir, "log");
  const char *no_state[] = {"run", "count", "--stop-savepoint", "x", NULL};
  cr_assert_eq(sl_test_run_sluice(log, no_state), 2);
  cr_assert(log_has(log, "--stop-savepoint needs --state-dir"));
  const char *no_stop[] = {"nexmark", "run", "--query", "q1", "--drain",
                           NULL};
  cr_assert_eq(sl_test_run_sluice(log, no_stop), 2);
  cr_assert(log_has(log, "--drain is for --stop-savepoint"));
  free(log);
  sl_test_remove_tree(dir);
}

/* nexmark q5 (sliding event-time windows): stopped without drain by
 * SIGTERM, it writes no FILE; resumed from its state directory it writes
 * the FILE an uninterrupted run writes. */
Test(cli_stop, nexmark_stopped_and_resumed_equals_an_uninterrupted_run) {
  char *dir = sl_test_temp_dir("cli-stop");
  char *state = sl_test_path_in(dir, "state");
  char *state_ref = sl_test_path_in(dir, "state-ref");
  char *file = sl_test_path_in(dir, "q5.csv");
  char *file_ref = sl_test_path_in(dir, "q5-ref.csv");
  char *sp = sl_test_path_in(dir, "sp");
  char *log = sl_test_path_in(dir, "log");
  const char *ref[] = {"nexmark", "run", "--query", "q5", "--events",
                       "200000", "--state-dir", state_ref, "--output",
                       file_ref, "--quiet", NULL};
  cr_assert_eq(sl_test_run_sluice(log, ref), 0);
  const char *first[] = {"nexmark", "run", "--query", "q5", "--events",
                         "200000", "--rate-limit", "20000", "--state-dir",
                         state, "--checkpoint-interval", "50", "--output",
                         file, "--stop-savepoint", sp, "--quiet", NULL};
  pid_t pid = sl_test_spawn(log, first);
  wait_exists(state, pid);
  cr_assert_eq(kill(pid, SIGTERM), 0);
  cr_assert_eq(sl_test_reap(pid), 0, "a stop with a savepoint exits 0");
  cr_assert_gt(stopped_line(log, sp), 0);
  cr_assert_not(exists(file), "FILE is written by a finished run only");
  const char *second[] = {"nexmark", "run", "--query", "q5", "--events",
                          "200000", "--state-dir", state, "--resume",
                          "--output", file, "--quiet", NULL};
  cr_assert_eq(sl_test_run_sluice(log, second), 0);
  char *got = sl_test_slurp(file), *want = sl_test_slurp(file_ref);
  cr_assert(strcmp(got, want) == 0, "the resumed output differs from an "
            "uninterrupted run's (%zu vs %zu bytes)", strlen(got),
            strlen(want));
  free(got);
  free(want);
  free(log);
  free(sp);
  free(file_ref);
  free(file);
  free(state_ref);
  free(state);
  sl_test_remove_tree(dir);
}
