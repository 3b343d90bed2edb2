/* test_embed_example.c — examples/embed_exactly_once run as a process
 * (EMBED_EO_BIN, set by meson): killed with SIGKILL at random moments and
 * rerun with --resume until it finishes, and stopped with a savepoint
 * without draining and resumed.  Its FILE is checked here against the
 * closed form, independently of the verdict the example prints. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "test_dirs.h"
#include "test_spawn.h"

#define BASE_MS INT64_C(1700000000000)
#define USERS 1024

static const char *example_bin(void) {
  const char *bin = getenv("EMBED_EO_BIN");
  cr_assert(bin && *bin, "EMBED_EO_BIN is not set (meson sets it)");
  return bin;
}

static uint64_t scaled(uint64_t n) {
  const char *s = getenv("SLUICE_TEST_SCALE");
  uint64_t scale = s ? strtoull(s, NULL, 10) : 1;
  return scale > 1 ? n / scale : n;
}

static int run_example(const char *log, const char *state, const char *out,
                       const char *events, const char *extra1,
                       const char *extra2, const char *extra3) {
  const char *args[] = {"--state-dir", state, "--output", out, "--events",
                        events, extra1, extra2, extra3, NULL};
  return sl_test_reap(sl_test_spawn_program(example_bin(), log, args));
}

/* Every (user, window) of events 0 .. n-1 exactly once with its count, and
 * nothing else. */
static void check_output(const char *path, uint64_t n) {
  uint64_t windows = (n + 999) / 1000;
  uint32_t *want = calloc(windows * USERS, sizeof *want);
  uint32_t *got = calloc(windows * USERS, sizeof *got);
  cr_assert(want && got);
  for (uint64_t i = 0; i < n; i++)
    want[i / 1000 * USERS +
         ((uint32_t)(i * UINT64_C(2654435761)) >> 22)]++;
  FILE *f = fopen(path, "r");
  cr_assert(f, "%s: %s", path, strerror(errno));
  char line[128];
  uint64_t lines = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned u;
    int64_t start;
    uint32_t count;
    lines++;
    cr_assert_eq(sscanf(line, "user-%u,%" SCNd64 ",%" SCNu32, &u, &start,
                        &count),
                 3, "line %" PRIu64 " malformed: %s", lines, line);
    cr_assert(u < USERS && start >= BASE_MS && (start - BASE_MS) % 1000 == 0,
              "line %" PRIu64 ": %s", lines, line);
    uint64_t w = (uint64_t)(start - BASE_MS) / 1000;
    cr_assert(w < windows, "line %" PRIu64 ": window past the events: %s",
              lines, line);
    uint64_t cell = w * USERS + u;
    cr_assert_eq(got[cell], 0, "line %" PRIu64 " repeats a window: %s",
                 lines, line);
    got[cell] = count;
    cr_assert_eq(count, want[cell], "line %" PRIu64 ": count %u, want %u",
                 lines, count, want[cell]);
  }
  fclose(f);
  for (uint64_t c = 0; c < windows * USERS; c++)
    cr_assert(!want[c] || got[c], "window %" PRIu64 " of user-%" PRIu64
              " missing", c / USERS, c % USERS);
  free(want);
  free(got);
}

static bool log_has(const char *log, const char *text) {
  size_t size;
  char *all = sl_test_read_file(log, &size);
  bool has = all && strstr(all, text);
  free(all);
  return has;
}

/* Wait up to ms for pid; SIGKILL it if it still runs.  True if it was
 * killed, false if it had exited (then *status is its status). */
static bool kill_after(pid_t pid, unsigned ms, int *status) {
  for (unsigned waited = 0; waited < ms; waited += 2) {
    pid_t r = waitpid(pid, status, WNOHANG);
    cr_assert(r >= 0, "waitpid: %s", strerror(errno));
    if (r == pid)
      return false;
    nanosleep(&(struct timespec){0, 2000000}, NULL);
  }
  cr_assert_eq(kill(pid, SIGKILL), 0);
  cr_assert_eq(waitpid(pid, status, 0), pid);
  return true;
}

static long file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? (long)st.st_size : 0;
}

/* Wait until path grows past size or pid exits (then false, status in
 * *status), polling; true once it grew. */
static bool wait_for_growth(pid_t pid, const char *path, long size,
                            int *status) {
  for (;;) {
    pid_t r = waitpid(pid, status, WNOHANG);
    cr_assert(r >= 0, "waitpid: %s", strerror(errno));
    if (r == pid)
      return false;
    if (file_size(path) > size)
      return true;
    nanosleep(&(struct timespec){0, 1000000}, NULL);
  }
}

/* Even rounds kill at a random moment; odd ones just after a delivery
 * reached the ledger (plus 0..19 ms), so some kills surely fall after a
 * checkpoint was durable and delivered, and the resume has to skip it. */
Test(embed_example, sigkill_and_resume_until_done, .timeout = 600) {
  char *dir = sl_test_temp_dir("embed-eo");
  char *state = sl_test_path_in(dir, "state");
  char *out = sl_test_path_in(dir, "results.csv");
  char *log = sl_test_path_in(dir, "log");
  char *ledger = sl_test_path_in(dir, "results.csv.delivered");
  uint64_t n = scaled(300000);
  char events[32];
  snprintf(events, sizeof events, "%" PRIu64, n);
  unsigned seed = (unsigned)time(NULL);
  if (getenv("SLUICE_TEST_SEED"))
    seed = (unsigned)strtoul(getenv("SLUICE_TEST_SEED"), NULL, 10);
  cr_log_info("seed %u (SLUICE_TEST_SEED)", seed);
  srand(seed);
  int kills = 0, after_delivery = 0;
  bool done = false;
  for (int round = 0; round < 10 && !done; round++) {
    const char *args[] = {"--state-dir", state, "--output", out, "--events",
                          events, round ? "--resume" : NULL, NULL};
    long ledger_size = file_size(ledger);
    pid_t pid = sl_test_spawn_program(example_bin(), log, args);
    int status = 0;
    bool grew = true;
    unsigned delay = 20 + (unsigned)rand() % 700;
    if (round % 2) {
      grew = wait_for_growth(pid, ledger, ledger_size, &status);
      delay = (unsigned)rand() % 20;
    }
    if (grew && kill_after(pid, delay, &status)) {
      kills++;
      after_delivery += round % 2;
      continue;
    }
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "round %d ended with status %d; see %s", round, status, log);
    done = true;
  }
  if (!done)
    cr_assert_eq(run_example(log, state, out, events, "--resume", NULL, NULL),
                 0, "the last resume failed; see %s", log);
  cr_log_info("%d runs killed, %d of them just after a delivery", kills,
              after_delivery);
  cr_assert(log_has(log, "verdict: EXACTLY-ONCE"), "see %s", log);
  check_output(out, n);
  free(ledger);
  free(state);
  free(out);
  free(log);
  sl_test_remove_tree(dir);
}

Test(embed_example, stop_without_drain_then_resume, .timeout = 300) {
  char *dir = sl_test_temp_dir("embed-stop");
  char *state = sl_test_path_in(dir, "state");
  char *out = sl_test_path_in(dir, "results.csv");
  char *log = sl_test_path_in(dir, "log");
  uint64_t n = scaled(200000);
  char events[32], third[32], two_thirds[32];
  snprintf(events, sizeof events, "%" PRIu64, n);
  /* Stop in the middle of a window, so open windows cross each stop. */
  snprintf(third, sizeof third, "%" PRIu64, n / 3 + 517);
  snprintf(two_thirds, sizeof two_thirds, "%" PRIu64, 2 * n / 3 + 291);
  cr_assert_eq(run_example(log, state, out, events, "--stop-after", third,
                           NULL),
               0, "see %s", log);
  cr_assert(log_has(log, "stopped at checkpoint"), "see %s", log);
  cr_assert_eq(run_example(log, state, out, events, "--resume",
                           "--stop-after", two_thirds),
               0, "see %s", log);
  cr_assert_eq(run_example(log, state, out, events, "--resume", NULL, NULL),
               0, "see %s", log);
  cr_assert(log_has(log, "verdict: EXACTLY-ONCE"), "see %s", log);
  check_output(out, n);
  free(state);
  free(out);
  free(log);
  sl_test_remove_tree(dir);
}

Test(embed_example, usage_errors_exit_2) {
  char *dir = sl_test_temp_dir("embed-usage");
  char *log = sl_test_path_in(dir, "log");
  const char *none[] = {"--events", "10", NULL};
  cr_assert_eq(sl_test_reap(sl_test_spawn_program(example_bin(), log, none)),
               2);
  const char *bad[] = {"--state-dir", dir, "--output", log, "--events", "x",
                       NULL};
  cr_assert_eq(sl_test_reap(sl_test_spawn_program(example_bin(), log, bad)),
               2);
  cr_assert(log_has(log, "--events wants a count"));
  free(log);
  sl_test_remove_tree(dir);
}
