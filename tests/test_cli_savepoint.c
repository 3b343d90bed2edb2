/* test_cli_savepoint.c — `sluice run --savepoint-dir DIR` takes a
 * savepoint on SIGUSR1, and `sluice checkpoints` reads it back: the real
 * CLI (SLUICE_BIN, set by meson) in a child process, real signals, real
 * LMDB copies.  The API side of savepoints is in test_savepoint.c. */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_dirs.h"

/* The whole file at path, NUL-terminated ("" if it cannot be read yet). */
static char *read_all(const char *path) {
  char *data = sl_test_read_file(path, NULL);
  if (!data) {
    data = strdup("");
    cr_assert(data);
  }
  return data;
}

static void sleep_ms(long ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = ms % 1000 * 1000000L};
  nanosleep(&ts, 0);
}

/* Start `sluice run count` checkpointing into state, SIGUSR1 savepoints
 * into savepoints, its stdout and stderr into log. */
static pid_t start_job(const char *bin, const char *state,
                       const char *savepoints, const char *log) {
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    FILE *out = freopen(log, "w", stdout);
    if (!out || dup2(fileno(stdout), 2) < 0)
      _exit(126);
    execl(bin, bin, "run", "count", "--records", "100000000000", "--keys",
          "10000", "--state-dir", state, "--checkpoint-interval-ms", "50",
          "--savepoint-dir", savepoints, "--quiet", (char *)0);
    _exit(127);
  }
  return pid;
}

Test(cli_savepoint, sigusr1_writes_a_savepoint_that_sluice_checkpoints_reads) {
  const char *bin = getenv("SLUICE_BIN");
  cr_assert(bin && *bin, "SLUICE_BIN is not set (meson sets it)");
  char *dir = sl_test_temp_dir("cli-savepoint");
  char *state = sl_test_path_in(dir, "state");
  char *savepoints = sl_test_path_in(dir, "savepoints");
  char *log = sl_test_path_in(dir, "log");
  pid_t pid = start_job(bin, state, savepoints, log);

  /* Signal until the CLI reports a savepoint: the first SIGUSR1 may come
   * before any checkpoint is complete, which the CLI reports as a failed
   * savepoint and the job goes on.  At most 60 s. */
  const char *done = "savepoint of checkpoint ";
  char *text = 0;
  uint64_t id = 0;
  char path[1024] = "";
  for (int i = 0; i < 600 && !id; i++) {
    sleep_ms(100);
    if (i % 5 == 4)
      cr_assert_eq(kill(pid, SIGUSR1), 0, "the job ended early");
    free(text);
    text = read_all(log);
    const char *at = strstr(text, done);
    if (at && strstr(at, "\n") &&
        sscanf(at + strlen(done), "%" SCNu64 " written to %1023s", &id,
               path) == 2)
      break;
    id = 0;
  }
  cr_assert(id > 0, "no savepoint reported; the CLI said:\n%s", text);
  kill(pid, SIGINT);
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 130,
            "exit status %d; output:\n%s", status, text);

  /* The savepoint is complete: its store and, written last, its manifest. */
  char file[1200];
  struct stat st;
  snprintf(file, sizeof file, "%s/manifest.json", path);
  cr_assert_eq(stat(file, &st), 0, "%s: %s", file, strerror(errno));
  cr_assert(strncmp(path, savepoints, strlen(savepoints)) == 0,
            "savepoint %s outside --savepoint-dir %s", path, savepoints);
  char *manifest = read_all(file);
  char want[64];
  snprintf(want, sizeof want, "\"checkpoint_id\": %" PRIu64, id);
  char want_compact[64];
  snprintf(want_compact, sizeof want_compact, "\"checkpoint_id\":%" PRIu64, id);
  cr_assert(strstr(manifest, want) || strstr(manifest, want_compact),
            "manifest does not name checkpoint %" PRIu64 ":\n%s", id,
            manifest);
  free(manifest);

  /* `sluice checkpoints SAVEPOINT` reads it back (exit 0, the same id). */
  char cmd[3000], out_path[1100];
  snprintf(out_path, sizeof out_path, "%s/listing", dir);
  snprintf(cmd, sizeof cmd, "'%s' checkpoints '%s' > '%s' 2>&1", bin, path,
           out_path);
  int rc = system(cmd);
  char *listing = read_all(out_path);
  cr_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "exit %d:\n%s", rc,
            listing);
  char id_text[32];
  snprintf(id_text, sizeof id_text, "%" PRIu64, id);
  cr_assert(strstr(listing, id_text), "listing lacks checkpoint %s:\n%s",
            id_text, listing);
  free(listing);

  /* The state directory's journal lists it too. */
  snprintf(file, sizeof file, "%s/savepoints.jsonl", state);
  char *journal = read_all(file);
  cr_assert(strstr(journal, path), "savepoints.jsonl lacks %s:\n%s", path,
            journal);
  free(journal);
  free(text);
  free(log);
  free(savepoints);
  free(state);
  sl_test_remove_tree(dir);
}
