/* test_cli_help.c — the real `sluice` binary's help, usage errors and
 * version (issue 19's small frictions): `--help` after any subcommand
 * prints that command's usage and exits 0, a wrong flag is still a usage
 * error (exit 2, naming the flag), the help describes `--at-least-once`
 * for what it does, and `sluice --version` prints the library's
 * sl_version().  `sluice kafka`, its mock and dump subcommands are
 * covered the same way. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "sluice.h"
#include "test_dirs.h"
#include "test_spawn.h"

/* Runs `sluice ARGS` with its output in a fresh log; returns the exit
 * status and the log's text in *text (malloc'd). */
static int run_sluice(const char *const *args, char **text) {
  char *dir = sl_test_temp_dir("cli-help");
  char *log = sl_test_path_in(dir, "log");
  int status = sl_test_run_sluice(log, args);
  *text = sl_test_slurp(log);
  free(log);
  sl_test_remove_tree(dir);
  return status;
}

/* Every command's help, including after a subcommand (`sluice run
 * --help` exited 2 before issue 19, asking for a job name). */
Test(cli_help, help_after_each_subcommand_exits_0) {
  static const char *const cases[][4] = {
      {"--help", NULL},
      {"run", "--help", NULL},
      {"run", "-h", NULL},
      {"run", "window", "--help", NULL},
      {"nexmark", "--help", NULL},
      {"nexmark", "run", "--help", NULL},
      {"nexmark", "gen", "-h", NULL},
      {"checkpoints", "--help", NULL},
      {"checkpoints", "-h", NULL},
      {"kafka", "--help", NULL},
      {"kafka", "-h", NULL},
      {"kafka", "mock", "--help", NULL},
      {"kafka", "dump", "-h", NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *text = NULL;
    int status = run_sluice(cases[i], &text);
    cr_expect_eq(status, 0, "sluice %s %s: exit %d, output:\n%s", cases[i][0],
                 cases[i][1] ? cases[i][1] : "", status, text);
    cr_expect(strstr(text, "usage: sluice"), "sluice %s %s: no usage in:\n%s",
              cases[i][0], cases[i][1] ? cases[i][1] : "", text);
    free(text);
  }
}

/* A wrong flag stays a usage error that names what was wrong. */
Test(cli_help, wrong_flags_still_exit_2) {
  static const char *const cases[][4] = {
      {"run", "--bogus", NULL},
      {"run", "window", "--bogus", NULL},
      {"nexmark", "run", "--bogus", NULL},
      {"checkpoints", "--bogus", NULL},
      {"kafka", NULL},
      {"kafka", "bogus", NULL},
      {"kafka", "mock", "--bogus", NULL},
      {"kafka", "dump", "--bogus", NULL},
      {"kafka", "dump", NULL},
  };
  static const char *const says[] = {
      "run needs a job name", "unknown option '--bogus'",
      "unknown option '--bogus'", "unknown option '--bogus'",
      "usage: sluice kafka", "kafka: unknown command 'bogus'",
      "kafka mock: unknown option '--bogus'",
      "kafka dump: unexpected '--bogus'", "kafka dump needs BOOTSTRAP/TOPIC"};
  _Static_assert(sizeof says / sizeof says[0] ==
                     sizeof cases / sizeof cases[0],
                 "one message per case");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *text = NULL;
    int status = run_sluice(cases[i], &text);
    cr_expect_eq(status, 2, "case %zu: exit %d, output:\n%s", i, status, text);
    cr_expect(strstr(text, says[i]), "case %zu: '%s' not in:\n%s", i, says[i],
              text);
    free(text);
  }
}

/* `--at-least-once` is not "unaligned barriers" (no barrier overtakes
 * records; docs/DESIGN.md invariant 3): the help says that barriers are
 * not aligned and that records after one are replayed after a failure.
 * Unaligned checkpoints are the option of their own, --unaligned. */
Test(cli_help, at_least_once_described_as_replay) {
  static const char *const cases[][3] = {{"run", "--help", NULL},
                                         {"nexmark", "--help", NULL}};
  for (size_t i = 0; i < 2; i++) {
    char *text = NULL;
    cr_assert_eq(run_sluice(cases[i], &text), 0);
    const char *line = strstr(text, "--at-least-once");
    cr_assert(line, "no --at-least-once in:\n%s", text);
    const char *next = strstr(line + 1, "\n  --"); /* the next option */
    cr_assert(next, "--at-least-once is the last option:\n%s", text);
    const char *unaligned = strstr(line, "unaligned");
    cr_expect(!unaligned || unaligned > next, "%.*s", (int)(next - line),
              line);
    cr_expect(strstr(text, "\n  --unaligned "), "no --unaligned in:\n%s",
              text);
    cr_expect(strstr(line, "barriers not aligned"), "%s", line);
    cr_expect(strstr(line, "replayed"), "%s", line);
    free(text);
  }
}

/* `sluice --version` prints the loaded library's sl_version() (before
 * issue 19 it printed the header's macros; the two now agree by build). */
Test(cli_help, version_is_the_library_version) {
  static const char *const args[] = {"--version", NULL};
  char *text = NULL;
  cr_assert_eq(run_sluice(args, &text), 0);
  char want[64];
  snprintf(want, sizeof want, "sluice %s\n", sl_version());
  cr_expect_str_eq(text, want);
  free(text);
}
