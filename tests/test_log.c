/* test_log.c — the engine's log (engine/log.c) and the CLI's live status
 * (cli/status.c): the line format, level filtering, the thread name,
 * whole lines from many threads, the cut of long lines, the status-line
 * clearing; and `sluice run --log-level` / the status line as a user sees
 * them, on a file and on a terminal (a pseudo-terminal).
 *
 * The log is captured by pointing fd 2 at a pipe (dup2), as a terminal or
 * a file would receive it.  The binary comes from SLUICE_BIN (meson). */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <pthread.h>
#include <pty.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"
#include "sluice.h"
#include "test_dirs.h"
#include "test_util.h"

/* ------------------------------------------------------------ capture */

typedef struct capture {
  int saved_fd;
  int read_fd;
} capture;

static capture capture_begin(void) {
  int fds[2];
  cr_assert_eq(pipe(fds), 0);
  /* Room for everything a test writes, so no writer blocks on us. */
  fcntl(fds[1], F_SETPIPE_SZ, 1 << 20);
  capture c = {.saved_fd = dup(2), .read_fd = fds[0]};
  cr_assert(c.saved_fd >= 0);
  cr_assert_eq(dup2(fds[1], 2), 2);
  close(fds[1]);
  return c;
}

/* Restores fd 2 and returns what was written (malloc'd, NUL-ended). */
static char *capture_end(capture *c) {
  cr_assert_eq(dup2(c->saved_fd, 2), 2);
  close(c->saved_fd);
  size_t cap = 1 << 16, used = 0;
  char *text = malloc(cap);
  cr_assert(text);
  for (;;) { /* the write end is closed: ends at EOF */
    if (used + 4096 > cap)
      cr_assert(text = realloc(text, cap *= 2));
    ssize_t n = read(c->read_fd, text + used, cap - used - 1);
    cr_assert(n >= 0, "read: %s", strerror(errno));
    if (n == 0)
      break;
    used += (size_t)n;
  }
  close(c->read_fd);
  text[used] = 0;
  return text;
}

/* A line "YYYY-MM-DDTHH:MM:SS.mmmZ LEVEL [THREAD] MESSAGE": checks the
 * time's shape and returns the part after it. */
static const char *after_time(const char *line) {
  int y, mo, d, h, mi, s, ms;
  char z;
  cr_assert_eq(sscanf(line, "%4d-%2d-%2dT%2d:%2d:%2d.%3d%c", &y, &mo, &d, &h,
                      &mi, &s, &ms, &z),
               8, "no time in '%.80s'", line);
  cr_assert_eq(z, 'Z');
  cr_assert(y >= 2024 && mo >= 1 && mo <= 12 && d >= 1 && d <= 31);
  cr_assert(h < 24 && mi < 60 && s < 61 && ms < 1000);
  cr_assert_eq(line[23], 'Z');
  cr_assert_eq(line[24], ' ');
  return line + 25;
}

/* ------------------------------------------------------------ format */

/* These tests read sl_log_stderr's lines: the library is silent unless a
 * handler is installed (test_host.c checks that default). */
static void install_stderr_handler(void) {
  sl_log_set_handler(sl_log_stderr, NULL);
}

TestSuite(log, .init = install_stderr_handler);

Test(log, line_format_and_thread_name) {
  pthread_setname_np(pthread_self(), "sl:count[3]");
  sl_log_set_level(SL_LOG_INFO);
  capture c = capture_begin();
  sl_log(SL_LOG_WARN, "sluice: job failed: %s %d", "cause", 7);
  char *out = capture_end(&c);
  cr_assert_str_eq(after_time(out),
                   "WARN  [count#3] sluice: job failed: cause 7\n");
  free(out);
}

Test(log, level_filtering) {
  pthread_setname_np(pthread_self(), "tester");
  cr_assert_eq(sl_log_set_level(SL_LOG_WARN), 0);
  cr_assert_eq(sl_log_get_level(), SL_LOG_WARN);
  cr_assert_eq(sl_log_set_level(9), EINVAL);
  cr_assert_eq(sl_log_get_level(), SL_LOG_WARN); /* unchanged */
  capture c = capture_begin();
  sl_log(SL_LOG_DEBUG, "debug line");
  sl_log(SL_LOG_INFO, "info line");
  sl_log(SL_LOG_WARN, "warn line");
  sl_log(SL_LOG_ERROR, "error line");
  char *out = capture_end(&c);
  cr_assert_null(strstr(out, "debug line"));
  cr_assert_null(strstr(out, "info line"));
  char *second = strchr(out, '\n');
  cr_assert(second);
  *second = 0;
  cr_assert_str_eq(after_time(out), "WARN  [tester] warn line");
  cr_assert_str_eq(after_time(second + 1), "ERROR [tester] error line\n");
  free(out);
}

Test(log, level_names) {
  int level = -1;
  cr_assert_eq(sl_log_level_parse("debug", &level), 0);
  cr_assert_eq(level, SL_LOG_DEBUG);
  cr_assert_eq(sl_log_level_parse("WARN", &level), 0);
  cr_assert_eq(level, SL_LOG_WARN);
  cr_assert_eq(sl_log_level_parse("warning", &level), EINVAL);
  cr_assert_eq(sl_log_level_parse(NULL, &level), EINVAL);
  cr_assert_eq(level, SL_LOG_WARN); /* unchanged by the refusals */
}

/* Criterion runs each test in a process of its own, so the level is still
 * unset here and comes from the environment. */
Test(log, level_from_environment) {
  setenv("SLUICE_LOG_LEVEL", "error", 1);
  cr_assert_eq(sl_log_get_level(), SL_LOG_ERROR);
  cr_assert(!sl_log_enabled(SL_LOG_WARN));
  cr_assert(sl_log_enabled(SL_LOG_ERROR));
}

Test(log, bad_environment_value_warns_once) {
  setenv("SLUICE_LOG_LEVEL", "chatty", 1);
  pthread_setname_np(pthread_self(), "tester");
  capture c = capture_begin();
  cr_assert_eq(sl_log_get_level(), SL_LOG_INFO);
  cr_assert_eq(sl_log_get_level(), SL_LOG_INFO);
  char *out = capture_end(&c);
  cr_assert_str_eq(after_time(out),
                   "WARN  [tester] sluice: SLUICE_LOG_LEVEL='chatty' is not "
                   "error, warn, info or debug; logging at info\n");
  free(out);
}

Test(log, long_message_is_cut) {
  sl_log_set_level(SL_LOG_INFO);
  char *big = malloc(5000);
  cr_assert(big);
  memset(big, 'x', 4999);
  big[4999] = 0;
  capture c = capture_begin();
  sl_log(SL_LOG_INFO, "%s", big);
  char *out = capture_end(&c);
  size_t len = strlen(out);
  cr_assert_eq(len, SL_LOG_LINE_BYTES, "a cut line fills the buffer: %zu",
               len);
  cr_assert_str_eq(out + len - 4, "...\n");
  cr_assert_eq(strchr(out, '\n'), out + len - 1);
  free(out);
  free(big);
}

Test(log, status_line_is_cleared_first) {
  sl_log_set_level(SL_LOG_INFO);
  sl_log_set_status_line(1);
  capture c = capture_begin();
  sl_log(SL_LOG_INFO, "over the status");
  sl_log_set_status_line(0);
  sl_log(SL_LOG_INFO, "plain");
  char *out = capture_end(&c);
  cr_assert_eq(strncmp(out, "\r\033[K", 4), 0);
  char *second = strchr(out, '\n') + 1;
  cr_assert(strstr(out, "over the status\n"));
  cr_assert_neq(second[0], '\r');
  cr_assert(strstr(after_time(second), "plain\n"));
  free(out);
}

/* ------------------------------------------------------------ threads */

#define WRITERS 4
#define LINES_PER_WRITER 300

static void *writer_main(void *arg) {
  int k = (int)(intptr_t)arg;
  char name[16];
  snprintf(name, sizeof name, "sl:w[%d]", k);
  pthread_setname_np(pthread_self(), name);
  for (int i = 0; i < LINES_PER_WRITER; i++)
    sl_log(SL_LOG_INFO, "writer %d line %d %s", k, i,
           "padding padding padding padding padding padding padding");
  return NULL;
}

/* Lines of different threads never interleave: every line parses whole,
 * names its own thread, and each writer's lines arrive in order. */
Test(log, threads_write_whole_lines) {
  sl_log_set_level(SL_LOG_INFO);
  capture c = capture_begin();
  pthread_t t[WRITERS];
  for (int k = 0; k < WRITERS; k++)
    cr_assert_eq(pthread_create(&t[k], NULL, writer_main, (void *)(intptr_t)k),
                 0);
  for (int k = 0; k < WRITERS; k++)
    pthread_join(t[k], NULL);
  char *out = capture_end(&c);
  int next[WRITERS] = {0};
  int lines = 0;
  for (char *line = out; *line; lines++) {
    char *end = strchr(line, '\n');
    cr_assert(end, "a line without its newline");
    *end = 0;
    int k = -1, k2 = -1, i = -1;
    cr_assert_eq(sscanf(after_time(line), "INFO  [w#%d] writer %d line %d", &k,
                        &k2, &i),
                 3, "a mixed line: '%s'", line);
    cr_assert_eq(k, k2);
    cr_assert(k >= 0 && k < WRITERS);
    cr_assert_eq(i, next[k]++, "writer %d out of order", k);
    line = end + 1;
  }
  cr_assert_eq(lines, WRITERS * LINES_PER_WRITER);
  free(out);
}

/* ------------------------------------------------------------ CLI */

static const char *sluice_bin(void) {
  const char *bin = getenv("SLUICE_BIN");
  cr_assert(bin && *bin, "SLUICE_BIN is not set (meson sets it)");
  return bin;
}

/* Runs the command line cmd (stdout and stderr to log); its exit status. */
static int run_shell(const char *cmd) {
  int status = system(cmd);
  cr_assert(status != -1);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The window job with one injected failure and a restart, at level. */
static char *window_run_log(const char *dir, const char *level) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "'%s' run window --records 40000 --keys 50 --state-dir '%s/s-%s' "
           "--output '%s/o-%s' --checkpoint-interval-ms 20 "
           "--fault fail:op=window,record=15000 --restart fixed-delay:3:10 "
           "--quiet %s%s >'%s/log-%s' 2>&1",
           sluice_bin(), dir, level, dir, level, level[0] ? "--log-level " : "",
           level, dir, level);
  cr_assert_eq(run_shell(cmd), 0, "%s", cmd);
  char path[1024];
  snprintf(path, sizeof path, "%s/log-%s", dir, level);
  return sl_test_slurp(path);
}

Test(cli, log_level_filters_engine_lines, .timeout = 120) {
  char *dir = sl_test_temp_dir("log-cli");
  char *info = window_run_log(dir, "info");
  /* The tag is the thread's: the window's own, or, chained (runtime.c
   * note 12), its source's; the message names the instance. */
  cr_assert(strstr(info, "#0] sluice: injecting fault "
                         "'fail:op=window,record=15000' (operator 'window' "
                         "instance 0"),
            "%s", info);
  cr_assert(strstr(info, "INFO  [window#0]") ||
                strstr(info, "INFO  [source#0]"),
            "%s", info);
  cr_assert(strstr(info, "WARN  [supervisor] sluice: job failed: "), "%s",
            info);
  cr_assert(strstr(info, "EXACTLY-ONCE"), "%s", info);
  char *warn = window_run_log(dir, "warn");
  cr_assert_null(strstr(warn, "injecting fault"), "%s", warn);
  cr_assert(strstr(warn, "WARN  [supervisor] sluice: job failed: "), "%s",
            warn);
  char *error = window_run_log(dir, "error");
  cr_assert_null(strstr(error, "injecting fault"));
  cr_assert_null(strstr(error, "WARN "));
  cr_assert(strstr(error, "failover: 1 restart"), "%s", error);
  free(info);
  free(warn);
  free(error);
  sl_test_remove_tree(dir);
}

Test(cli, bad_log_level_is_a_usage_error) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "'%s' run pipeline --records 10 --log-level loud 2>/dev/null",
           sluice_bin());
  cr_assert_eq(run_shell(cmd), 2);
  snprintf(cmd, sizeof cmd,
           "'%s' nexmark run --query q0 --events 10 --log-level 2>/dev/null",
           sluice_bin());
  cr_assert_eq(run_shell(cmd), 2);
}

/* Records for a run of a second or so (the keyed job moves about 70M
 * records/s here; a sanitizer build is ten times slower and scales). */
static uint64_t status_records(void) {
  return sl_test_scaled(80000000, 8000000);
}

/* Not a terminal: plain periodic lines with the log's time prefix. */
Test(cli, status_lines_when_not_a_terminal, .timeout = 120) {
  char *dir = sl_test_temp_dir("status");
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "'%s' run keyed --records %" PRIu64 " --keys 1000 --spin 1 "
           "--status-interval-ms 20 2>'%s/err' >/dev/null",
           sluice_bin(), status_records(), dir);
  cr_assert_eq(run_shell(cmd), 0);
  char path[1024];
  snprintf(path, sizeof path, "%s/err", dir);
  char *err = sl_test_slurp(path);
  char *line = strstr(err, "INFO  [status] keyed: ");
  cr_assert(line, "no status line in: %s", err);
  cr_assert(strstr(line, "records/s"));
  cr_assert(strstr(line, "0 restarts"));
  cr_assert_null(strchr(err, '\r'), "no carriage return off a terminal");
  free(err);
  /* --quiet silences it. */
  snprintf(cmd, sizeof cmd,
           "'%s' run keyed --records 3000000 --keys 1000 --spin 1 "
           "--status-interval-ms 20 --quiet 2>'%s/err' >/dev/null",
           sluice_bin(), dir);
  cr_assert_eq(run_shell(cmd), 0);
  err = sl_test_slurp(path);
  cr_assert_str_eq(err, "");
  free(err);
  sl_test_remove_tree(dir);
}

/* On a terminal: one line redrawn in place, cleared before the summary. */
Test(cli, status_line_on_a_terminal, .timeout = 120) {
  int master = -1;
  pid_t pid = forkpty(&master, NULL, NULL, NULL);
  cr_assert(pid >= 0, "forkpty: %s", strerror(errno));
  if (pid == 0) {
    char records[32];
    snprintf(records, sizeof records, "%" PRIu64, status_records());
    execl(sluice_bin(), sluice_bin(), "run", "keyed", "--records", records,
          "--keys", "1000", "--spin", "1", "--status-interval-ms", "20",
          (char *)NULL);
    _exit(127);
  }
  size_t cap = 1 << 20, used = 0;
  char *out = malloc(cap);
  cr_assert(out);
  for (;;) { /* EIO once the child has gone and the terminal closed */
    ssize_t n = read(master, out + used, cap - used - 1);
    if (n <= 0)
      break;
    used += (size_t)n;
    cr_assert(used < cap - 1, "too much output");
  }
  out[used] = 0;
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s", out);
  cr_assert(strstr(out, "\rkeyed: "), "no redrawn line: %s", out);
  cr_assert(strstr(out, "\033[K"));
  /* The clear, then the summary on a clean line. */
  cr_assert(strstr(out, "\r\033[Kjob keyed: finished"), "%s", out);
  close(master);
  free(out);
}
