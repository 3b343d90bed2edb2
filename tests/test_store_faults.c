/* test_store_faults.c — fault injection into the store's write paths, in
 * the manner of SQLite's test_vfs, through the public API only, so it
 * exercises whichever store format is in the tree:
 *   - the Nth put, commit or sync of a checkpoint's write fails (the
 *     store's fault layer, sl_store_set_fault), for N = 1, 2, ... until
 *     the write completes without the fault: the store reopens, holds the
 *     last complete checkpoint, and the write succeeds again;
 *   - a compaction runs out of map (a real MDB_MAP_FULL in a small map),
 *     and is SIGKILLed after its Nth put into the new base (a child
 *     process, sl_store_test_crash_after): the merged view is unchanged;
 *   - real jobs (`sluice run count`, SLUICE_BIN) with the Nth store call
 *     failing, killed inside a large checkpoint write (the crash point
 *     mid-write) and inside a compaction: each resumes (--resume) to
 *     exactly the output of an uninterrupted run.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sluice.h"
#include "store.h"
#include "test_dirs.h"
#include "test_spawn.h"
#include "test_util.h"

#define GRAPH "store-faults: op 1"
#define OP 1
#define KEYS 60u      /* keys of checkpoint 1 */
#define NEW_KEYS 20u  /* keys checkpoint 2 adds */
#define GROUPS 16u

/* ------------------------------------------------------------ the model */

/* The value of key i after checkpoint 1 or 2; 0: absent.  Checkpoint 2
 * deletes every 7th key, replaces every 3rd and adds NEW_KEYS keys. */
static uint64_t model(unsigned checkpoint, uint32_t i) {
  if (checkpoint == 1)
    return i < KEYS ? i + 1 : 0;
  if (i >= KEYS + NEW_KEYS)
    return 0;
  if (i >= KEYS)
    return i + 500000;
  if (i % 7 == 0)
    return 0;
  return i % 3 == 0 ? i + 100000 : i + 1;
}

static uint32_t model_keys(unsigned checkpoint) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < KEYS + NEW_KEYS; i++)
    n += model(checkpoint, i) != 0;
  return n;
}

static uint32_t key_of(uint32_t i, char *out) {
  return (uint32_t)sprintf(out, "k%05u", i);
}

typedef struct view_check {
  unsigned checkpoint;
  uint32_t seen;
} view_check;

static int check_entry(void *arg, uint16_t group, const void *key,
                       uint32_t key_bytes, const void *value,
                       uint32_t value_bytes) {
  view_check *c = arg;
  char text[16];
  cr_assert(key_bytes < sizeof text);
  memcpy(text, key, key_bytes);
  text[key_bytes] = 0;
  unsigned i = 0;
  cr_assert_eq(sscanf(text, "k%u", &i), 1);
  cr_assert_eq(group, i % GROUPS);
  uint64_t v;
  cr_assert_eq(value_bytes, sizeof v);
  memcpy(&v, value, sizeof v);
  cr_assert_eq(v, model(c->checkpoint, i), "key %s after checkpoint %u",
               text, c->checkpoint);
  c->seen++;
  return 0;
}

/* The merged view of the store is exactly checkpoint n's. */
static void expect_view(sl_store *st, unsigned n) {
  cr_assert_eq(sl_store_latest(st), n);
  view_check c = {.checkpoint = n};
  cr_assert_eq(sl_store_read_state(st, OP, 0, UINT16_MAX, check_entry, &c),
               0, "%s", sl_store_error(st));
  cr_assert_eq(c.seen, model_keys(n));
  void *blob;
  uint32_t bytes;
  cr_assert_eq(sl_store_get_blob(st, OP, 0, &blob, &bytes), 0);
  cr_assert_eq(bytes, sizeof n);
  cr_assert_eq(memcmp(blob, &n, sizeof n), 0);
  free(blob);
}

static sl_store *open_store(const char *dir, uint64_t map_bytes) {
  sl_store *st = NULL;
  char err[1024];
  sl_store_options o = {.graph_fingerprint = GRAPH, .no_sync = 1,
                        .initial_map_bytes = map_bytes};
  cr_assert_eq(sl_store_open(dir, &o, &st, err, sizeof err), 0, "%s", err);
  return st;
}

/* Writes checkpoint n (1 or 2) of the model; the first failure's code. */
static int write_checkpoint(sl_store *st, unsigned n) {
  sl_store_txn *txn;
  int rc = sl_store_begin(st, &txn);
  cr_assert_eq(rc, 0, "%s", sl_store_error(st));
  char key[16];
  for (uint32_t i = 0; rc == 0 && i < KEYS + NEW_KEYS; i++) {
    uint64_t v = model(n, i), before = n > 1 ? model(n - 1, i) : 0;
    uint32_t kb = key_of(i, key);
    if (v != 0 && v != before)
      rc = sl_store_put_state(txn, OP, (uint16_t)(i % GROUPS), key, kb, &v,
                              sizeof v);
    else if (v == 0 && before != 0)
      rc = sl_store_delete_state(txn, OP, (uint16_t)(i % GROUPS), key, kb);
  }
  if (rc == 0)
    rc = sl_store_put_blob(txn, OP, 0, &n, sizeof n);
  if (rc != 0) {
    sl_store_abort(txn);
    return rc;
  }
  char record[16];
  int bytes = snprintf(record, sizeof record, "cp %u", n);
  return sl_store_commit(txn, n, record, (uint32_t)bytes);
}

/* ------------------------------------------------------------ fault layer */

typedef struct nth_fault {
  enum sl_store_call call;
  uint64_t nth, seen, fired;
} nth_fault;

static int fail_nth(void *arg, enum sl_store_call call) {
  nth_fault *f = arg;
  if (call != f->call || ++f->seen != f->nth)
    return 0;
  f->fired++;
  return EIO;
}

static const char *call_name(enum sl_store_call call) {
  return call == SL_STORE_CALL_PUT ? "put"
         : call == SL_STORE_CALL_COMMIT ? "commit" : "sync";
}

/* One case: checkpoint 1 written, checkpoint 2's write with its Nth call
 * of f->call failing.  Returns whether the fault fired. */
static bool fault_case(nth_fault *f) {
  char *dir = sl_test_temp_dir("store-faults");
  sl_store *st = open_store(dir, 0);
  cr_assert_eq(write_checkpoint(st, 1), 0, "%s", sl_store_error(st));
  sl_store_set_fault(st, fail_nth, f);
  int rc = write_checkpoint(st, 2);
  sl_store_set_fault(st, NULL, NULL);
  bool fired = f->fired > 0;
  const char *what = call_name(f->call);
  if (!fired)
    cr_assert_eq(rc, 0, "%s %" PRIu64 ": %s", what, f->nth,
                 sl_store_error(st));
  else
    cr_assert_eq(rc, EIO, "%s %" PRIu64 ": the write returned %d", what,
                 f->nth, rc);
  if (fired) /* the failure is named */
    cr_assert(strstr(sl_store_error(st), dir), "%s %" PRIu64 ": '%s'", what,
              f->nth, sl_store_error(st));
  /* A failed sync follows a commit that happened (store.h). */
  unsigned complete = fired && f->call != SL_STORE_CALL_SYNC ? 1 : 2;
  sl_store_close(st);
  st = open_store(dir, 0); /* it reopens... */
  expect_view(st, complete); /* ...at the last complete checkpoint */
  if (complete == 1) { /* and the write succeeds again */
    cr_assert_eq(write_checkpoint(st, 2), 0, "%s", sl_store_error(st));
    expect_view(st, 2);
  }
  sl_store_close(st);
  sl_test_remove_tree(dir);
  return fired;
}

#define MAX_NTH 10000 /* far above the calls of one write */

Test(store_faults, the_nth_put_commit_or_sync_of_a_write_fails_cleanly,
     .timeout = 600) {
  const enum sl_store_call calls[] = {SL_STORE_CALL_PUT,
                                      SL_STORE_CALL_COMMIT,
                                      SL_STORE_CALL_SYNC};
  for (size_t c = 0; c < sizeof calls / sizeof *calls; c++) {
    uint64_t nth = 1;
    for (; nth <= MAX_NTH; nth++) {
      nth_fault f = {.call = calls[c], .nth = nth};
      if (!fault_case(&f))
        break; /* the write completed without reaching the Nth call */
    }
    cr_assert(nth > 1 && nth <= MAX_NTH, "%s: %" PRIu64, call_name(calls[c]),
              nth);
  }
}

/* ------------------------------------------------------------ compaction */

/* A store at checkpoint 2 with everything in the log (never compacted). */
static char *two_checkpoints(void) {
  char *dir = sl_test_temp_dir("store-faults");
  sl_store *st = open_store(dir, 0);
  cr_assert_eq(write_checkpoint(st, 1), 0, "%s", sl_store_error(st));
  cr_assert_eq(write_checkpoint(st, 2), 0, "%s", sl_store_error(st));
  sl_store_close(st);
  return dir;
}

/* In a child: compact dir, dying by SIGKILL after the nth put into the
 * new base.  The child's exit status (128 + signal if killed). */
static int compact_in_child(const char *dir, uint64_t nth) {
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    sl_store *st = NULL;
    char err[1024];
    sl_store_options o = {.graph_fingerprint = GRAPH, .no_sync = 1};
    if (sl_store_open(dir, &o, &st, err, sizeof err) != 0)
      _exit(3);
    sl_store_test_crash_after(nth);
    sl_store_compaction stats;
    int rc = sl_store_compact(st, 1, &stats);
    sl_store_close(st);
    _exit(rc == 0 && stats.entries_written > 0 ? 0 : 4);
  }
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

Test(store_faults, a_compaction_killed_at_its_nth_put_changes_nothing,
     .timeout = 600) {
  char *model_dir = two_checkpoints();
  uint64_t nth = 1;
  for (; nth <= MAX_NTH; nth++) {
    char *root = sl_test_temp_dir("store-faults");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s/s'", model_dir, root);
    cr_assert_eq(system(cmd), 0);
    char *dir = sl_test_path_in(root, "s");
    int status = compact_in_child(dir, nth);
    cr_assert(status == 0 || status == 128 + SIGKILL, "put %" PRIu64
              ": exit %d", nth, status);
    sl_store *st = open_store(dir, 0);
    expect_view(st, 2); /* killed or not, the view is checkpoint 2's */
    if (status == 128 + SIGKILL) { /* and the next compaction completes */
      sl_store_compaction stats;
      cr_assert_eq(sl_store_compact(st, 1, &stats), 0, "%s",
                   sl_store_error(st));
      expect_view(st, 2);
    }
    sl_store_close(st);
    free(dir);
    sl_test_remove_tree(root);
    if (status == 0)
      break; /* the compaction wrote fewer than nth entries */
  }
  cr_assert(nth > 1 && nth <= MAX_NTH, "%" PRIu64, nth);
  sl_test_remove_tree(model_dir);
}

/* ------------------------------------------------------------ real jobs */

/* The committed lines of an output directory, sorted. */
static char *committed_lines(const char *root, const char *output) {
  char *path = sl_test_path_in(root, "lines.txt");
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "cat '%s'/part-*.csv | sort > '%s'", output,
           path);
  cr_assert_eq(system(cmd), 0, "%s", cmd);
  char *text = sl_test_slurp(path);
  free(path);
  return text;
}

static char *log_text(const char *log) {
  char *text = sl_test_read_file(log, NULL);
  return text ? text : strdup("");
}

/* `sluice run count` with --records and --keys, into root/state and
 * root/out, plus extra (NULL-terminated, at most 6 words); exit status. */
static int count_job(const char *root, uint64_t records, uint64_t keys,
                     const char *const *extra, const char *log) {
  char rec[32], key[32];
  snprintf(rec, sizeof rec, "%" PRIu64, records);
  snprintf(key, sizeof key, "%" PRIu64, keys);
  char *state = sl_test_path_in(root, "state");
  char *out = sl_test_path_in(root, "out");
  const char *args[24] = {"run", "count", "--records", rec, "--keys", key,
                          "--state-dir", state, "--output", out,
                          "--no-sync", "--quiet"};
  int n = 12;
  for (int i = 0; extra && extra[i]; i++) {
    cr_assert(n < 22);
    args[n++] = extra[i];
  }
  args[n] = NULL;
  int status = sl_test_run_sluice(log, args);
  free(state), free(out);
  return status;
}

/* The sorted committed lines of an uninterrupted run. */
static char *uninterrupted(uint64_t records, uint64_t keys) {
  char *root = sl_test_temp_dir("store-faults-ref");
  char *log = sl_test_path_in(root, "log");
  cr_assert_eq(count_job(root, records, keys, NULL, log), 0, "%s",
               log_text(log));
  char *out = sl_test_path_in(root, "out");
  char *lines = committed_lines(root, out);
  free(out), free(log);
  sl_test_remove_tree(root);
  return lines;
}

/* Resumes the job in root until it completes (at most 3 runs) and checks
 * its committed output against want. */
static void resume_and_compare(const char *root, uint64_t records,
                               uint64_t keys, const char *want,
                               const char *what) {
  char *log = sl_test_path_in(root, "log");
  /* A failure before the first checkpoint completed leaves nothing to
   * resume: then the job starts again (--fresh: no output was
   * committed either). */
  char *state = sl_test_path_in(root, "state");
  sl_store *st = NULL;
  char err[1024];
  sl_store_options o = {.read_only = 1};
  int rc = sl_store_open(state, &o, &st, err, sizeof err);
  cr_assert_eq(rc, 0, "%s: %s", what, err);
  bool any = sl_store_latest(st) > 0;
  sl_store_close(st);
  free(state);
  const char *resume[] = {any ? "--resume" : "--fresh", NULL};
  int status = count_job(root, records, keys, resume, log);
  cr_assert_eq(status, 0, "%s: the resume exited %d: %s", what, status,
               log_text(log));
  char *out = sl_test_path_in(root, "out");
  char *lines = committed_lines(root, out);
  cr_assert(strcmp(lines, want) == 0, "%s: the committed output differs "
            "from an uninterrupted run's", what);
  free(lines), free(out), free(log);
}

#define JOB_KEYS 200u
#define MAX_DOUBLINGS 16

Test(store_faults, a_job_whose_nth_store_call_fails_resumes_exactly,
     .timeout = 900) {
  uint64_t records = sl_test_scaled(60000, 20000);
  char *want = uninterrupted(records, JOB_KEYS);
  const char *calls[] = {"put", "commit", "sync"};
  for (size_t c = 0; c < 3; c++) {
    bool completed = false;
    /* N = 1, 2, 4, ...: until the job completes before its Nth call. */
    for (uint64_t nth = 1, k = 0; !completed && k < MAX_DOUBLINGS;
         k++, nth *= 2) {
      char *root = sl_test_temp_dir("store-faults-job");
      char *log = sl_test_path_in(root, "log");
      char spec[96], what[128];
      snprintf(spec, sizeof spec, "store:call=%s,nth=%" PRIu64, calls[c],
               nth);
      snprintf(what, sizeof what, "--fault %s", spec);
      const char *extra[] = {"--fault", spec, "--checkpoint-interval-ms",
                             "5", NULL};
      int status = count_job(root, records, JOB_KEYS, extra, log);
      char *text = log_text(log);
      bool fired = strstr(text, "injecting fault") != NULL;
      cr_assert(status == (fired ? 1 : 0), "%s: exit %d: %s", what, status,
                text);
      if (fired) /* the failure says which fault and where */
        cr_assert(strstr(text, spec) && strstr(text, "failed"), "%s: %s",
                  what, text);
      completed = !fired;
      if (fired)
        resume_and_compare(root, records, JOB_KEYS, want, what);
      free(text), free(log);
      sl_test_remove_tree(root);
    }
    cr_assert(completed, "%s: still failing after %d doublings", calls[c],
              MAX_DOUBLINGS);
  }
  free(want);
}

Test(store_faults, a_job_killed_inside_a_large_checkpoint_write_resumes,
     .timeout = 600) {
  uint64_t keys = sl_test_scaled(200000, 50000);
  uint64_t records = 3 * keys;
  char *want = uninterrupted(records, keys);
  char *root = sl_test_temp_dir("store-faults-job");
  char *log = sl_test_path_in(root, "log");
  /* The crash point inside the writer's write: SIGKILL mid-transaction
   * of the 2nd checkpoint, which holds up to every key.  There is a 2nd:
   * the source pauses half-way (half a second, 25 intervals), so one is
   * triggered there, and the final one follows at the end of the input. */
  char pause[96];
  snprintf(pause, sizeof pause, "slow:op=source,delay_us=500000,from=%"
           PRIu64 ",records=1", records / 2);
  const char *extra[] = {"--fault", "crash:point=mid-write,nth=2",
                         "--fault", pause, "--checkpoint-interval-ms", "20",
                         NULL};
  int status = count_job(root, records, keys, extra, log);
  cr_assert_eq(status, 128 + SIGKILL, "exit %d: %s", status, log_text(log));
  resume_and_compare(root, records, keys, want, "killed mid-write");
  free(log), free(want);
  sl_test_remove_tree(root);
}

/* The writer compacts when the log holds at least 65536 entries
 * (engine/checkpoint_writer.c); more keys than that make every
 * checkpoint's log large enough. */
#define COMPACTION_KEYS 70000u
#define COMPACTION_ATTEMPTS 6

Test(store_faults, a_job_killed_inside_a_compaction_resumes_exactly,
     .timeout = 900) {
  uint64_t records = 4 * COMPACTION_KEYS;
  char *want = uninterrupted(records, COMPACTION_KEYS);
  int killed = 0;
  uint64_t x = 0x5EEDull;
  /* Whether a compaction runs before the input ends depends on how the
   * checkpoints fall: the kill itself is the condition waited for. */
  for (int attempt = 0; attempt < COMPACTION_ATTEMPTS && killed < 2;
       attempt++) {
    char *root = sl_test_temp_dir("store-faults-job");
    char *log = sl_test_path_in(root, "log");
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    char nth[32];
    snprintf(nth, sizeof nth, "%" PRIu64, 1 + (x >> 33) % COMPACTION_KEYS);
    setenv("SLUICE_TEST_COMPACTION_CRASH_AFTER", nth, 1);
    /* Two pauses of the source: in the first a checkpoint of every key
     * is triggered (its log alone is due for compaction), in the second
     * the writer is idle, and compacts. */
    char first[96], second[96];
    snprintf(first, sizeof first, "slow:op=source,delay_us=500000,from=%u,"
             "records=1", 2 * COMPACTION_KEYS);
    snprintf(second, sizeof second, "slow:op=source,delay_us=1500000,"
             "from=%u,records=1", 3 * COMPACTION_KEYS);
    const char *extra[] = {"--checkpoint-interval-ms", "50", "--fault",
                           first, "--fault", second, NULL};
    int status = count_job(root, records, COMPACTION_KEYS, extra, log);
    unsetenv("SLUICE_TEST_COMPACTION_CRASH_AFTER");
    cr_assert(status == 0 || status == 128 + SIGKILL, "exit %d: %s", status,
              log_text(log));
    if (status == 128 + SIGKILL) {
      killed++;
      char what[64];
      snprintf(what, sizeof what, "killed at compaction put %s", nth);
      resume_and_compare(root, records, COMPACTION_KEYS, want, what);
    }
    free(log);
    sl_test_remove_tree(root);
  }
  cr_assert_gt(killed, 0, "no compaction ran in %d runs",
               COMPACTION_ATTEMPTS);
  free(want);
}
