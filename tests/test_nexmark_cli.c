/* test_nexmark_cli.c — `sluice nexmark` as a user runs it: a run killed
 * with SIGKILL at random moments and resumed with --resume writes exactly
 * the file an uninterrupted run writes; event files written by `gen` give
 * the same rows as the generator; bad flags and bad files give a clear
 * error and the documented exit status.
 *
 * The binary comes from the environment (SLUICE_BIN, set by meson). */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_dirs.h"

#define MAX_ARGS 48

static const char *sluice_bin(void) {
  const char *bin = getenv("SLUICE_BIN");
  cr_assert(bin && *bin, "SLUICE_BIN is not set (meson sets it)");
  return bin;
}

/* Start `sluice ARGS...` with stdout and stderr appended to log. */
static pid_t start(const char *log, const char *const *args) {
  const char *argv[MAX_ARGS + 2];
  argv[0] = sluice_bin();
  int n = 0;
  while (args[n]) {
    cr_assert(n < MAX_ARGS);
    argv[n + 1] = args[n];
    n++;
  }
  argv[n + 1] = NULL;
  pid_t pid = fork();
  cr_assert(pid >= 0, "fork: %s", strerror(errno));
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0)
      _exit(127);
    dup2(fd, 1);
    dup2(fd, 2);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  return pid;
}

/* Exit status of pid (128 + signal if killed). */
static int finish(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    cr_assert(errno == EINTR, "waitpid: %s", strerror(errno));
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int run(const char *log, const char *const *args) {
  return finish(start(log, args));
}

static size_t count_lines(const char *data, size_t size) {
  size_t n = 0;
  for (size_t i = 0; i < size; i++)
    n += data[i] == '\n';
  return n;
}

/* got equals expected byte for byte, and expected has more than min_rows
 * rows below its header (a comparison of two empty results proves
 * nothing). */
static void assert_same_file(const char *expected, const char *got,
                             size_t min_rows) {
  size_t n1 = 0, n2 = 0;
  char *a = sl_test_read_file(expected, &n1);
  char *b = sl_test_read_file(got, &n2);
  cr_assert(a, "cannot read %s", expected);
  cr_assert(b, "cannot read %s", got);
  cr_assert_eq(n1, n2, "%s has %zu bytes (%zu lines), %s %zu (%zu lines)",
               expected, n1, count_lines(a, n1), got, n2,
               count_lines(b, n2));
  cr_assert(memcmp(a, b, n1) == 0, "%s and %s differ", expected, got);
  cr_assert_gt(count_lines(a, n1), min_rows + 1, "%s has only %zu lines",
               expected, count_lines(a, n1));
  free(a);
  free(b);
}

static void assert_log_has(const char *log, const char *text) {
  size_t n = 0;
  char *data = sl_test_read_file(log, &n);
  cr_assert(data, "no log %s", log);
  cr_assert(strstr(data, text), "log %s lacks \"%s\":\n%s", log, text, data);
  free(data);
}

static unsigned scale(void) {
  const char *s = getenv("SLUICE_TEST_SCALE");
  unsigned v = s ? (unsigned)atoi(s) : 1;
  return v ? v : 1;
}

/* Kill a checkpointed run of query at random moments, resume until it
 * finishes, and compare its file with an uninterrupted run's. */
static void kill_and_resume(const char *query, const char *parallelism,
                            unsigned seed) {
  char *dir = sl_test_temp_dir("nexmark-cli");
  char *expected = sl_test_path_in(dir, "expected.csv");
  char *got = sl_test_path_in(dir, "got.csv");
  char *state = sl_test_path_in(dir, "state");
  char *log = sl_test_path_in(dir, "log");
  char events[32], limit[32], rate[32];
  snprintf(events, sizeof events, "%u", 300000 / scale());
  /* 150 s of event time at any scale: dozens of windows and sessions. */
  snprintf(rate, sizeof rate, "%u", 2000 / scale());
  /* A rate limit spreads the run over about a second and a half, so the
   * kills land while it works. */
  snprintf(limit, sizeof limit, "%u", 200000 / scale());
  const char *base[] = {"nexmark", "run", "--query", query, "--events",
                        events, "--rate", rate, "--out-of-order-ms",
                        "2000", "--parallelism", parallelism, "--quiet"};
  const char *plain[32];
  size_t nb = sizeof base / sizeof base[0];
  memcpy(plain, base, sizeof base);
  plain[nb] = "--output", plain[nb + 1] = expected, plain[nb + 2] = NULL;
  cr_assert_eq(run(log, plain), 0, "uninterrupted run failed");

  const char *killed[40];
  memcpy(killed, base, sizeof base);
  const char *more[] = {"--output", got, "--state-dir", state,
                        "--checkpoint-interval", "50", "--rate-limit",
                        limit, "--resume", NULL};
  memcpy(killed + nb, more, sizeof more);
  srand(seed);
  int kills = 0, rc = -1;
  for (int attempt = 0; attempt < 8 && rc != 0; attempt++) {
    pid_t pid = start(log, killed);
    if (attempt < 3) {
      struct timespec t = {0, (100 + rand() % 500) * 1000000L};
      nanosleep(&t, NULL);
      kill(pid, SIGKILL);
    }
    rc = finish(pid);
    kills += rc == 128 + SIGKILL;
  }
  cr_assert_eq(rc, 0, "the resumed run did not finish");
  cr_assert_geq(kills, 1, "no run was killed mid-way");
  assert_same_file(expected, got, 20);
  sl_test_remove_tree(dir);
  free(expected), free(got), free(state), free(log);
}

Test(nexmark_cli, killed_and_resumed_q5_writes_the_uninterrupted_file,
     .timeout = 240) {
  kill_and_resume("q5", "2", 5);
}

Test(nexmark_cli, killed_and_resumed_q3_writes_the_uninterrupted_file,
     .timeout = 240) {
  kill_and_resume("q3", "1", 3);
}

Test(nexmark_cli, killed_and_resumed_q11_writes_the_uninterrupted_file,
     .timeout = 240) {
  kill_and_resume("q11", "2", 11);
}

/* Events written by gen and read back with --input give the rows the
 * generator gives. */
Test(nexmark_cli, event_file_gives_the_generator_rows, .timeout = 240) {
  char *dir = sl_test_temp_dir("nexmark-cli");
  char *file = sl_test_path_in(dir, "events.jsonl");
  char *a = sl_test_path_in(dir, "a.csv");
  char *b = sl_test_path_in(dir, "b.csv");
  char *log = sl_test_path_in(dir, "log");
  char events[32], rate[32];
  snprintf(events, sizeof events, "%u", 60000 / scale());
  /* 120 s of event time at any scale: a dozen tumbling windows. */
  snprintf(rate, sizeof rate, "%u", 500 / scale());
  const char *gen[] = {"nexmark", "gen", "--events", events, "--rate",
                       rate, "--out-of-order-ms", "1000", "--output",
                       file, NULL};
  cr_assert_eq(run(log, gen), 0);
  const char *queries[] = {"q2", "q8", "q7"};
  for (int i = 0; i < 3; i++) {
    const char *from_gen[] = {"nexmark", "run", "--query", queries[i],
                              "--events", events, "--rate", rate,
                              "--out-of-order-ms", "1000", "--output", a,
                              "--quiet", NULL};
    const char *from_file[] = {"nexmark", "run", "--query", queries[i],
                               "--input", file, "--output", b, "--quiet",
                               NULL};
    cr_assert_eq(run(log, from_gen), 0, "%s from the generator", queries[i]);
    cr_assert_eq(run(log, from_file), 0, "%s from the file", queries[i]);
    assert_same_file(a, b, 5);
  }
  sl_test_remove_tree(dir);
  free(file), free(a), free(b), free(log);
}

Test(nexmark_cli, bad_flags_and_files_are_refused_clearly, .timeout = 120) {
  char *dir = sl_test_temp_dir("nexmark-cli");
  char *log = sl_test_path_in(dir, "log");
  char *bad = sl_test_path_in(dir, "bad.jsonl");
  char *out = sl_test_path_in(dir, "out.csv");
  const char *q6[] = {"nexmark", "run", "--query", "q6", NULL};
  cr_assert_eq(run(log, q6), 2);
  assert_log_has(log, "--query: 'q6' is not one of");
  const char *both[] = {"nexmark", "run", "--query", "q1", "--events", "10",
                        "--input", bad, NULL};
  cr_assert_eq(run(log, both), 2);
  assert_log_has(log, "--events and --input exclude each other");
  const char *nonum[] = {"nexmark", "gen", "--events", "ten", NULL};
  cr_assert_eq(run(log, nonum), 2);
  assert_log_has(log, "--events: 'ten' is not a whole number");
  const char *resume[] = {"nexmark", "run", "--query", "q1", "--resume",
                          NULL};
  cr_assert_eq(run(log, resume), 2);
  assert_log_has(log, "--resume and --fresh need --state-dir");
  const char *verb[] = {"nexmark", "walk", NULL};
  cr_assert_eq(run(log, verb), 2);
  assert_log_has(log, "unknown command 'walk'");

  /* A missing file and a malformed line fail the job, naming them; the
   * output file is not written. */
  char *missing = sl_test_path_in(dir, "missing.jsonl");
  const char *nofile[] = {"nexmark", "run", "--query", "q0", "--input",
                          missing, "--output", out, "--quiet", NULL};
  cr_assert_eq(run(log, nofile), 1);
  assert_log_has(log, missing);
  FILE *f = fopen(bad, "w");
  cr_assert(f);
  fputs("{\"event_type\":2,\"bid\":{\"auction\":1000,\"bidder\":1001,"
        "\"price\":150,\"channel\":\"Google\",\"url\":\"u\","
        "\"date_time\":1700000000002,\"extra\":\"\"}}\n"
        "{\"event_type\":2,\"bid\":{\"auction\":\"x\"}}\n",
        f);
  fclose(f);
  const char *malformed[] = {"nexmark", "run", "--query", "q0", "--input",
                             bad, "--output", out, "--quiet", NULL};
  cr_assert_eq(run(log, malformed), 1);
  assert_log_has(log, "line 2");
  cr_assert_eq(access(out, F_OK), -1, "output written by a failed run");
  sl_test_remove_tree(dir);
  free(log), free(bad), free(out), free(missing);
}
