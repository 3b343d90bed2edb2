/* test_spawn.h — run the real `sluice` binary (SLUICE_BIN, set by meson)
 * as a child process with its output appended to a log, for the suites
 * that test the command line. */
#ifndef SL_TEST_SPAWN_H
#define SL_TEST_SPAWN_H

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define SL_TEST_MAX_ARGS 48

static inline const char *sl_test_sluice_bin(void) {
  const char *bin = getenv("SLUICE_BIN");
  cr_assert(bin && *bin, "SLUICE_BIN is not set (meson sets it)");
  return bin;
}

/* Start `program ARGS...` (args ends with NULL) with stdout and stderr
 * appended to log. */
static inline pid_t sl_test_spawn_program(const char *program,
                                          const char *log,
                                          const char *const *args) {
  const char *argv[SL_TEST_MAX_ARGS + 2];
  argv[0] = program;
  int n = 0;
  while (args[n]) {
    cr_assert(n < SL_TEST_MAX_ARGS);
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

/* Start `sluice ARGS...` (args ends with NULL) with stdout and stderr
 * appended to log. */
static inline pid_t sl_test_spawn(const char *log, const char *const *args) {
  return sl_test_spawn_program(sl_test_sluice_bin(), log, args);
}

/* Exit status of pid (128 + signal if killed). */
static inline int sl_test_reap(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    cr_assert(errno == EINTR, "waitpid: %s", strerror(errno));
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static inline int sl_test_run_sluice(const char *log,
                                     const char *const *args) {
  return sl_test_reap(sl_test_spawn(log, args));
}

#endif /* SL_TEST_SPAWN_H */
