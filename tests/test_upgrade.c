/* test_upgrade.c — `sluice checkpoints --upgrade` (cli/upgrade.c) and the
 * reader of the old format (storage/store_v2.c), on the format-2 fixtures
 * of tests/data/store_v2 (SLUICE_TEST_DATA): every entry survives, a real
 * job resumes the upgraded store with exactly the output of an
 * uninterrupted run, a SIGKILL at any step leaves the old store or the
 * new one, and damaged old stores are refused by name, never a crash.
 *
 * While this sluice's format is still 2 (before the store helper's format
 * 3 lands), the upgrade is asked to rewrite the store anyway
 * (SLUICE_TEST_UPGRADE_REWRITE, cli/upgrade.c note 4), so the same path
 * is tested; the refusal of the old format is then a store that opens.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sluice.h"
#include "store.h"
#include "store_v2.h"
#include "store_v2_fixture.h"
#include "test_dirs.h"
#include "test_spawn.h"

#define OLD_FORMAT_REFUSAL                                                  \
  "store format 2 is older than this sluice's format 3; upgrade it with "  \
  "`sluice checkpoints --upgrade"

/* ------------------------------------------------------------ helpers */

/* A copy of the fixture name (a directory of tests/data/store_v2) in a
 * fresh temporary directory; *root is that directory. */
static char *fixture_copy(const char *name, char **root) {
  const char *data = getenv("SLUICE_TEST_DATA");
  cr_assert(data && *data, "SLUICE_TEST_DATA is not set (meson sets it)");
  *root = sl_test_temp_dir("upgrade");
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "cp -r '%s/store_v2/%s' '%s/'", data, name,
           *root);
  cr_assert_eq(system(cmd), 0, "%s", cmd);
  return sl_test_path_in(*root, name);
}

/* Runs `sluice checkpoints --upgrade dir` (rewriting a format-2 store
 * while that is this sluice's own format); its output goes to log.
 * Returns the exit status (128 + signal if killed). */
static int run_upgrade(const char *dir, const char *log, const char *crash) {
  if (SL_STORE_FORMAT_VERSION == 2)
    setenv("SLUICE_TEST_UPGRADE_REWRITE", "1", 1);
  if (crash)
    setenv("SLUICE_TEST_UPGRADE_CRASH", crash, 1);
  const char *args[] = {"checkpoints", "--upgrade", dir, NULL};
  int status = sl_test_run_sluice(log, args);
  unsetenv("SLUICE_TEST_UPGRADE_CRASH");
  unsetenv("SLUICE_TEST_UPGRADE_REWRITE");
  return status;
}

static char *log_text(const char *log) {
  char *text = sl_test_read_file(log, NULL);
  return text ? text : strdup("");
}

/* ------------------------------------------------------------ the api fixture */

/* What a walk of the merged state saw, checked against the fixture's
 * rules (store_v2_fixture.h) as it goes. */
typedef struct seen {
  uint32_t op1, op2;
} seen;

static int check_entry(void *arg, uint16_t op, uint16_t group,
                       const void *key, uint32_t key_bytes,
                       const void *value, uint32_t value_bytes) {
  seen *s = arg;
  char text[32];
  cr_assert(key_bytes > 1 && key_bytes < sizeof text);
  memcpy(text, key, key_bytes);
  text[key_bytes] = 0;
  unsigned i = 0;
  cr_assert_eq(sscanf(text, "k%u", &i), 1, "key %s", text);
  cr_assert_eq(group, v2_fixture_group(op, i), "key %s of op %u", text, op);
  uint64_t v = 0;
  cr_assert_eq(value_bytes, sizeof v);
  memcpy(&v, value, sizeof v);
  uint64_t want = op == 1 ? v2_fixture_value(i) : v2_fixture_op2_value(i);
  cr_assert(op == 1 || op == 2, "op %u", op);
  cr_assert_eq(v, want, "op %u key %s: %" PRIu64 ", not %" PRIu64, op, text,
               v, want);
  if (op == 1)
    s->op1++;
  else
    s->op2++;
  return 0;
}

/* sl_store_read_state's function: one operator's walk. */
typedef struct op_walk {
  seen *seen;
  uint16_t op;
} op_walk;

static int check_state_entry(void *arg, uint16_t group, const void *key,
                             uint32_t key_bytes, const void *value,
                             uint32_t value_bytes) {
  op_walk *w = arg;
  return check_entry(w->seen, w->op, group, key, key_bytes, value,
                     value_bytes);
}

static uint32_t fixture_live_keys(void) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < V2_FIXTURE_KEYS; i++)
    n += v2_fixture_value(i) != 0;
  return n;
}

static int check_row(void *arg, const void *key, uint32_t key_bytes,
                     const void *value, uint32_t value_bytes) {
  uint32_t *rows = arg;
  char text[32];
  cr_assert(key_bytes < sizeof text);
  memcpy(text, key, key_bytes);
  text[key_bytes] = 0;
  unsigned i = 0;
  cr_assert_eq(sscanf(text, "r%u", &i), 1);
  uint64_t v = 0;
  cr_assert_eq(value_bytes, sizeof v);
  memcpy(&v, value, sizeof v);
  cr_assert_eq(v, v2_fixture_row(i), "row %s", text);
  cr_assert_neq(v, 0, "row %s was deleted", text);
  (*rows)++;
  return 0;
}

static uint32_t fixture_live_rows(void) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < V2_FIXTURE_ROWS; i++)
    n += v2_fixture_row(i) != 0;
  return n;
}

/* The store in dir, opened as this sluice's store, holds exactly what the
 * fixture's rules say. */
static void check_current_store(const char *dir) {
  sl_store *st = NULL;
  char err[1024];
  sl_store_options o = {.graph_fingerprint = V2_FIXTURE_GRAPH,
                        .read_only = 1};
  int rc = sl_store_open(dir, &o, &st, err, sizeof err);
  cr_assert_eq(rc, 0, "%s", err);
  cr_assert_eq(sl_store_latest(st), V2_FIXTURE_LATEST);
  seen s = {0};
  for (uint16_t op = 1; op <= 2; op++) {
    op_walk w = {.seen = &s, .op = op};
    cr_assert_eq(sl_store_read_state(st, op, 0, UINT16_MAX,
                                     check_state_entry, &w),
                 0, "%s", sl_store_error(st));
  }
  cr_assert_eq(s.op1, fixture_live_keys());
  cr_assert_eq(s.op2, V2_FIXTURE_OP2_KEYS);
  for (uint16_t op = 1; op <= 2; op++) {
    void *data;
    uint32_t bytes;
    char want[64];
    int n = v2_fixture_blob(op, want, sizeof want);
    cr_assert_eq(sl_store_get_blob(st, op, 0, &data, &bytes), 0);
    cr_assert_eq(bytes, (uint32_t)n);
    cr_assert_eq(memcmp(data, want, bytes), 0);
    free(data);
  }
  void *record;
  uint32_t record_bytes;
  cr_assert_eq(sl_store_get_checkpoint(st, V2_FIXTURE_LATEST, &record,
                                       &record_bytes), 0);
  cr_assert_eq(record_bytes, strlen("record 3"));
  cr_assert_eq(memcmp(record, "record 3", record_bytes), 0);
  free(record);
  uint32_t rows = 0;
  uint64_t counted = 0;
  cr_assert_eq(sl_store_table_scan(st, V2_FIXTURE_TABLE, check_row, &rows,
                                   err, sizeof err), 0, "%s", err);
  cr_assert_eq(rows, fixture_live_rows());
  cr_assert_eq(sl_store_table_count(st, V2_FIXTURE_TABLE, &counted, err,
                                    sizeof err), 0, "%s", err);
  cr_assert_eq(counted, fixture_live_rows());
  sl_store_close(st);
}

/* The same through the old format's reader (an intact old store). */
static void check_old_store(const char *dir) {
  sl_store_v2 *v = NULL;
  uint32_t format = 0;
  char err[1024];
  cr_assert_eq(sl_store_v2_open(dir, &v, &format, err, sizeof err), 0, "%s",
               err);
  cr_assert_eq(format, 2);
  cr_assert_str_eq(sl_store_v2_graph(v), V2_FIXTURE_GRAPH);
  cr_assert_eq(sl_store_v2_latest(v), V2_FIXTURE_LATEST);
  seen s = {0};
  cr_assert_eq(sl_store_v2_state(v, check_entry, &s), 0, "%s",
               sl_store_v2_error(v));
  cr_assert_eq(s.op1, fixture_live_keys());
  cr_assert_eq(s.op2, V2_FIXTURE_OP2_KEYS);
  sl_store_v2_close(v);
}

/* The format of the store in dir, by its reader (2) or the current one. */
static uint32_t store_format(const char *dir) {
  sl_store_v2 *v = NULL;
  uint32_t format = 0;
  char err[1024];
  int rc = sl_store_v2_open(dir, &v, &format, err, sizeof err);
  sl_store_v2_close(v);
  if (rc == 0)
    return format;
  sl_store_info info = {0}; /* a layout the old reader cannot read */
  cr_assert_eq(sl_store_inspect(dir, &info, err, sizeof err), 0, "%s", err);
  free(info.graph);
  return info.format;
}

Test(upgrade, the_old_reader_sees_the_merged_view_of_base_and_log) {
  char *root;
  char *dir = fixture_copy("api", &root);
  check_old_store(dir);
  free(dir);
  sl_test_remove_tree(root);
}

Test(upgrade, every_entry_blob_row_and_the_record_survive) {
  char *root;
  char *dir = fixture_copy("api", &root);
  char *log = sl_test_path_in(root, "log");
  cr_assert_eq(run_upgrade(dir, log, NULL), 0, "%s", log_text(log));
  char *text = log_text(log);
  char want[512];
  snprintf(want, sizeof want, "%s: upgraded store format 2 -> %u: checkpoint "
           "3, %u entries, 1 tables\n", dir, SL_STORE_FORMAT_VERSION,
           fixture_live_keys() + V2_FIXTURE_OP2_KEYS);
  cr_assert_str_eq(text, want);
  cr_assert_eq(store_format(dir), SL_STORE_FORMAT_VERSION);
  check_current_store(dir);
  char *staging = sl_test_path_in(dir, SL_STORE_STAGING_NAME);
  struct stat st;
  cr_assert_neq(stat(staging, &st), 0, "the staging directory is left");
  /* Again: nothing to do (without the rewrite hook). */
  unlink(log);
  const char *args[] = {"checkpoints", "--upgrade", dir, NULL};
  cr_assert_eq(sl_test_run_sluice(log, args), 0);
  free(text);
  text = log_text(log);
  cr_assert(strstr(text, "nothing to upgrade"), "%s", text);
  check_current_store(dir);
  free(text), free(staging), free(log), free(dir);
  sl_test_remove_tree(root);
}

Test(upgrade, a_store_in_use_is_refused_and_left_alone) {
  char *root;
  char *dir = fixture_copy("api", &root);
  char *log = sl_test_path_in(root, "log");
  char *lock = sl_test_path_in(dir, "lock");
  int fd = open(lock, O_RDWR | O_CREAT, 0644);
  cr_assert(fd >= 0);
  cr_assert_eq(flock(fd, LOCK_EX | LOCK_NB), 0); /* as a writer holds it */
  cr_assert_eq(run_upgrade(dir, log, NULL), 1);
  char *text = log_text(log);
  cr_assert(strstr(text, "in use by another process"), "%s", text);
  cr_assert(strstr(text, dir), "%s", text);
  close(fd);
  check_old_store(dir);
  free(text), free(lock), free(log), free(dir);
  sl_test_remove_tree(root);
}

Test(upgrade, a_directory_without_a_store_or_a_foreign_file_is_an_error) {
  char *root = sl_test_temp_dir("upgrade");
  char *log = sl_test_path_in(root, "log");
  char *empty = sl_test_path_in(root, "empty");
  cr_assert_eq(mkdir(empty, 0755), 0);
  cr_assert_eq(run_upgrade(empty, log, NULL), 1);
  char *text = log_text(log);
  cr_assert(strstr(text, "no data.mdb"), "%s", text);
  struct stat st;
  char *lock = sl_test_path_in(empty, "lock");
  cr_assert_neq(stat(lock, &st), 0, "a file was created");
  /* A data.mdb that is no LMDB file, and a path that is no directory. */
  char *data = sl_test_path_in(empty, "data.mdb");
  FILE *f = fopen(data, "w");
  cr_assert(f);
  fputs("not an LMDB file, but long enough to hold a page header or two\n",
        f);
  fclose(f);
  unlink(log);
  cr_assert_eq(run_upgrade(empty, log, NULL), 1);
  free(text);
  text = log_text(log);
  cr_assert(strstr(text, data) || strstr(text, empty), "%s", text);
  unlink(log);
  cr_assert_eq(run_upgrade(data, log, NULL), 1);
  free(text);
  text = log_text(log);
  cr_assert(strstr(text, "not a directory"), "%s", text);
  free(data), free(lock), free(text), free(empty), free(log);
  sl_test_remove_tree(root);
}

/* ------------------------------------------------------------ a real job */

/* The committed lines of an output directory, sorted, as one text. */
static char *committed_lines(const char *root, const char *output,
                             const char *name) {
  char *path = sl_test_path_in(root, name);
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "cat '%s'/part-*.csv | sort > '%s'", output,
           path);
  cr_assert_eq(system(cmd), 0, "%s", cmd);
  char *text = sl_test_slurp(path);
  free(path);
  return text;
}

#define WINDOW_JOB "window", "--records", "20000", "--keys", "50", \
                   "--window", "7", "--quiet"

Test(upgrade, the_old_store_is_refused_then_upgraded_and_resumed_exactly,
     .timeout = 240) {
  char *root;
  char *fixture = fixture_copy("window", &root);
  char *state = sl_test_path_in(fixture, "state");
  char *output = sl_test_path_in(fixture, "output");
  char *log = sl_test_path_in(root, "log");
  const char *resume[] = {"run", WINDOW_JOB, "--state-dir", state,
                          "--output", output, "--resume", NULL};
  if (SL_STORE_FORMAT_VERSION > 2) {
    cr_assert_eq(sl_test_run_sluice(log, resume), 1);
    char *text = log_text(log);
    cr_assert(strstr(text, OLD_FORMAT_REFUSAL), "%s", text);
    cr_assert(strstr(text, state), "%s", text);
    free(text);
  } else { /* format 2 is this sluice's: the store opens as it is */
    sl_store *st = NULL;
    char err[1024];
    sl_store_options o = {.read_only = 1};
    cr_assert_eq(sl_store_open(state, &o, &st, err, sizeof err), 0, "%s",
                 err);
    sl_store_close(st);
  }
  cr_assert_eq(store_format(state), 2, "the refusal changed the store");
  cr_assert_eq(run_upgrade(state, log, NULL), 0, "%s", log_text(log));
  cr_assert_eq(sl_test_run_sluice(log, resume), 0, "%s", log_text(log));

  char *fresh_state = sl_test_path_in(root, "fresh-state");
  char *fresh_output = sl_test_path_in(root, "fresh-output");
  const char *whole[] = {"run", WINDOW_JOB, "--state-dir", fresh_state,
                         "--output", fresh_output, NULL};
  cr_assert_eq(sl_test_run_sluice(log, whole), 0, "%s", log_text(log));
  char *resumed = committed_lines(root, output, "resumed.txt");
  char *uninterrupted = committed_lines(root, fresh_output, "whole.txt");
  cr_assert_gt(strlen(uninterrupted), 1000);
  cr_assert_str_eq(resumed, uninterrupted);
  free(resumed), free(uninterrupted), free(fresh_state), free(fresh_output);
  free(log), free(output), free(state), free(fixture);
  sl_test_remove_tree(root);
}

/* A savepoint of the old format (taken by a stop with savepoint): it is
 * upgraded in place, its manifest says the new format, and a job started
 * from it commits exactly an uninterrupted run's output. */
Test(upgrade, an_old_savepoint_is_upgraded_and_started_from, .timeout = 240) {
  char *root;
  char *fixture = fixture_copy("savepoint", &root);
  char *sp = sl_test_path_in(fixture, "sp");
  char *output = sl_test_path_in(fixture, "output");
  char *state = sl_test_path_in(root, "state");
  char *log = sl_test_path_in(root, "log");
  /* Before the upgrade a start from it is refused, and told how. */
  const char *early[] = {"run", WINDOW_JOB, "--state-dir", state,
                         "--output", output, "--from-savepoint", sp, NULL};
  cr_assert_neq(sl_test_run_sluice(log, early), 0, "%s", log_text(log));
  char *text = log_text(log);
  cr_assert(strstr(text, "store format 2") &&
                strstr(text, "sluice checkpoints --upgrade "),
            "%s", text);
  free(text);
  unlink(log);
  cr_assert_eq(run_upgrade(sp, log, NULL), 0, "%s", log_text(log));
  text = log_text(log);
  cr_assert(strstr(text, "upgraded store format 2 -> "), "%s", text);
  free(text);
  cr_assert_eq(store_format(sp), SL_STORE_FORMAT_VERSION);
  char *manifest_path = sl_test_path_in(sp, "manifest.json");
  char *manifest = sl_test_slurp(manifest_path);
  char want[64];
  snprintf(want, sizeof want, "\"store_format\": %u",
           SL_STORE_FORMAT_VERSION);
  cr_assert(strstr(manifest, want), "%s", manifest);
  char *lock = sl_test_path_in(sp, "lock");
  struct stat st;
  cr_assert_neq(stat(lock, &st), 0, "the upgrade left a lock file");
  const char *from[] = {"run", WINDOW_JOB, "--state-dir", state,
                        "--output", output, "--from-savepoint", sp, NULL};
  unlink(log);
  cr_assert_eq(sl_test_run_sluice(log, from), 0, "%s", log_text(log));
  char *fresh_output = sl_test_path_in(root, "fresh-output");
  char *fresh_state = sl_test_path_in(root, "fresh-state");
  const char *whole[] = {"run", WINDOW_JOB, "--state-dir", fresh_state,
                         "--output", fresh_output, NULL};
  cr_assert_eq(sl_test_run_sluice(log, whole), 0, "%s", log_text(log));
  char *resumed = committed_lines(root, output, "resumed.txt");
  char *uninterrupted = committed_lines(root, fresh_output, "whole.txt");
  cr_assert_gt(strlen(uninterrupted), 1000);
  cr_assert_str_eq(resumed, uninterrupted);
  free(resumed), free(uninterrupted), free(fresh_output), free(lock);
  free(fresh_state);
  free(manifest), free(manifest_path), free(log), free(state), free(output);
  free(sp), free(fixture);
  sl_test_remove_tree(root);
}

/* ------------------------------------------------------------ SIGKILL */

static uint64_t test_seed(void) {
  const char *s = getenv("SLUICE_TEST_SEED");
  return s && *s ? strtoull(s, NULL, 10) : 21;
}

static uint64_t next_random(uint64_t *x) { /* SplitMix64 */
  uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static bool same_file(const char *a, const char *b) {
  size_t an = 0, bn = 0;
  char *x = sl_test_read_file(a, &an), *y = sl_test_read_file(b, &bn);
  bool same = x && y && an == bn && memcmp(x, y, an) == 0;
  free(x), free(y);
  return same;
}

#define KILL_ROUNDS 12
#define UPGRADE_STEPS 8 /* cli/upgrade.c */

Test(upgrade, a_sigkill_at_any_step_leaves_the_old_or_the_new_store,
     .timeout = 300) {
  uint64_t seed = test_seed(), x = seed;
  const char *data = getenv("SLUICE_TEST_DATA");
  cr_assert(data);
  char original[1024];
  snprintf(original, sizeof original, "%s/store_v2/api/data.mdb", data);
  uint32_t entries = fixture_live_keys() + V2_FIXTURE_OP2_KEYS;
  for (int round = 0; round < KILL_ROUNDS; round++) {
    char *root;
    char *dir = fixture_copy("api", &root);
    char *log = sl_test_path_in(root, "log");
    uint64_t step = 1 + next_random(&x) % UPGRADE_STEPS;
    uint64_t puts = next_random(&x) % entries;
    char crash[64];
    snprintf(crash, sizeof crash, "%" PRIu64 ":%" PRIu64, step, puts);
    cr_assert_eq(run_upgrade(dir, log, crash), 128 + SIGKILL,
                 "seed %" PRIu64 " crash %s: %s", seed, crash, log_text(log));
    char *data_file = sl_test_path_in(dir, "data.mdb");
    if (step <= 5) /* before the rename: the old store, byte for byte */
      cr_assert(same_file(data_file, original), "seed %" PRIu64 " crash %s",
                seed, crash);
    else /* after it: the complete new one */
      check_current_store(dir);
    unlink(log);
    cr_assert_eq(run_upgrade(dir, log, NULL), 0, "seed %" PRIu64
                 " crash %s, then: %s", seed, crash, log_text(log));
    cr_assert_eq(store_format(dir), SL_STORE_FORMAT_VERSION);
    check_current_store(dir);
    char *staging = sl_test_path_in(dir, SL_STORE_STAGING_NAME);
    struct stat st;
    cr_assert_neq(stat(staging, &st), 0, "seed %" PRIu64 " crash %s: the "
                  "staging directory is left", seed, crash);
    free(staging), free(data_file), free(log), free(dir);
    sl_test_remove_tree(root);
  }
}

/* ------------------------------------------------------------ damage */

/* Every read of the old reader on a damaged copy: 0 (then the content is
 * exact: the damage hit nothing live) or a refusal naming the
 * directory. */
static void read_damaged(const char *dir, const char *what) {
  sl_store_v2 *v = NULL;
  uint32_t format = 0;
  char err[1024] = "";
  int rc = sl_store_v2_open(dir, &v, &format, err, sizeof err);
  cr_assert(rc == 0 || rc == SL_ECORRUPT || rc == SL_ESTORE,
            "%s: rc %d: %s", what, rc, err);
  if (rc != 0) {
    cr_assert(strstr(err, dir), "%s: %s", what, err);
    return;
  }
  seen s = {0};
  rc = sl_store_v2_state(v, check_entry, &s);
  cr_assert(rc == 0 || rc == SL_ECORRUPT, "%s: rc %d", what, rc);
  if (rc)
    cr_assert(strstr(sl_store_v2_error(v), dir), "%s: %s", what,
              sl_store_v2_error(v));
  else
    cr_assert_eq(s.op1 + s.op2, fixture_live_keys() + V2_FIXTURE_OP2_KEYS,
                 "%s", what);
  sl_store_v2_close(v);
}

#define DAMAGE_ROUNDS 24

/* Bytes of live values and keys: a blob, a checkpoint record, a state
 * key, a table key, the graph fingerprint. */
static const char *const live_bytes[] = {
    "blob of op 1 from checkpoint 3", "record 3", "k17", "r11",
    V2_FIXTURE_GRAPH};

/* Flips a bit in every copy of text in the file (old copies may sit in
 * free pages; one of them is the live one).  Returns the copies. */
static int flip_every(int fd, size_t size, const char *text) {
  char *file = malloc(size);
  cr_assert(file);
  cr_assert_eq(pread(fd, file, size, 0), (ssize_t)size);
  int copies = 0;
  size_t n = strlen(text);
  for (size_t at = 0; at + n <= size; at++) { /* bounded by the file */
    if (memcmp(file + at, text, n) != 0)
      continue;
    char b = (char)(file[at + n / 2] ^ 0x20);
    cr_assert_eq(pwrite(fd, &b, 1, (off_t)(at + n / 2)), 1);
    copies++;
  }
  free(file);
  return copies;
}

Test(upgrade, damaged_old_stores_are_refused_by_name_never_a_crash,
     .timeout = 300) {
  uint64_t seed = test_seed(), x = seed ^ 0xDA3A6Eull;
  for (int round = 0; round < DAMAGE_ROUNDS; round++) {
    char *root;
    char *dir = fixture_copy("api", &root);
    char *data_file = sl_test_path_in(dir, "data.mdb");
    char *log = sl_test_path_in(root, "log");
    struct stat st;
    cr_assert_eq(stat(data_file, &st), 0);
    uint64_t at = next_random(&x) % (uint64_t)st.st_size;
    char what[128];
    int fd = open(data_file, O_RDWR);
    cr_assert(fd >= 0);
    bool live = round % 4 == 2;
    if (live) {
      const char *text = live_bytes[(size_t)round / 4 % (sizeof live_bytes /
                                                         sizeof *live_bytes)];
      cr_assert_gt(flip_every(fd, (size_t)st.st_size, text), 0, "%s", text);
      snprintf(what, sizeof what, "'%s' flipped", text);
    } else if (round % 4 == 3) { /* truncated */
      cr_assert_eq(ftruncate(fd, (off_t)at), 0);
      snprintf(what, sizeof what, "seed %" PRIu64 ": truncated to %" PRIu64,
               seed, at);
    } else { /* a flipped byte */
      uint8_t b;
      cr_assert_eq(pread(fd, &b, 1, (off_t)at), 1);
      b ^= (uint8_t)(1 + next_random(&x) % 255);
      cr_assert_eq(pwrite(fd, &b, 1, (off_t)at), 1);
      snprintf(what, sizeof what, "seed %" PRIu64 ": byte %" PRIu64
               " flipped", seed, at);
    }
    close(fd);
    read_damaged(dir, what);
    int status = run_upgrade(dir, log, NULL);
    char *text = log_text(log);
    cr_assert(status == 0 || status == 1, "%s: exit %d: %s", what, status,
              text);
    cr_assert(!live || status == 1, "%s: upgraded: %s", what, text);
    if (live)
      cr_assert(strstr(text, "damaged"), "%s: %s", what, text);
    if (status == 1)
      cr_assert(strstr(text, dir), "%s: %s", what, text);
    else
      check_current_store(dir);
    free(text), free(log), free(data_file), free(dir);
    sl_test_remove_tree(root);
  }
}
