/* test_inspect.c — reading state directories from outside their job
 * (engine/inspect.h) and `sluice checkpoints` (cli/checkpoints.c):
 *
 * - a store written by a real checkpointed job lists its checkpoints, the
 *   graph's operators, the sources' positions (which must equal what the
 *   sources emitted) and the detail of one checkpoint;
 * - while `sluice run` writes a store in another process, this process
 *   lists it again and again, read-only, and the job finishes verified;
 * - savepoints.jsonl and manifest.json files, written here in exactly the
 *   savepoint code's format, are read and shown;
 * - every bad input (not a directory, not a store, a foreign LMDB file, a
 *   corrupt record or blob, an unknown id, a malformed index line or
 *   manifest) gives a clear error, exit status 1 (2 for usage errors), and
 *   leaves every file exactly as it was.
 *
 * The binary comes from SLUICE_BIN (meson). */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <lmdb.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "inspect.h"
#include "sluice.h"
#include "sluice_testing.h" /* unstable test helpers */
#include "store.h"
#include "test_dirs.h"
#include "test_util.h"

#define SOURCE_P 2
#define KEYS 64

/* ------------------------------------------------------------ helpers */

static const char *sluice_bin(void) {
  const char *bin = getenv("SLUICE_BIN");
  cr_assert(bin && *bin, "SLUICE_BIN is not set (meson sets it)");
  return bin;
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  cr_assert(f, "%s: %s", path, strerror(errno));
  cr_assert(fputs(text, f) >= 0);
  cr_assert_eq(fclose(f), 0);
}

/* A file's bytes, to show it unchanged after a refusal. */
typedef struct snapshot {
  char *data;
  size_t size;
} snapshot;

static snapshot take(const char *path) {
  snapshot s = {0};
  s.data = sl_test_read_file(path, &s.size);
  cr_assert(s.data, "%s: %s", path, strerror(errno));
  return s;
}

static void assert_unchanged(const char *path, snapshot *s) {
  size_t size = 0;
  char *now = sl_test_read_file(path, &size);
  cr_assert(now, "%s vanished", path);
  cr_assert_eq(size, s->size, "%s changed size", path);
  cr_assert_eq(memcmp(now, s->data, size), 0, "%s changed", path);
  free(now);
  free(s->data);
}

/* Runs `sluice ARGS` (a shell word list); stdout into *out, stderr into
 * *err (both malloc'd); the exit status. */
static int sluice(const char *args, char **out, char **err) {
  char *dir = sl_test_temp_dir("inspect-cli");
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "'%s' %s >'%s/out' 2>'%s/err'", sluice_bin(),
           args, dir, dir);
  int status = system(cmd);
  cr_assert(status != -1 && WIFEXITED(status), "%s", cmd);
  char path[1024];
  snprintf(path, sizeof path, "%s/out", dir);
  *out = sl_test_read_file(path, NULL);
  snprintf(path, sizeof path, "%s/err", dir);
  *err = sl_test_read_file(path, NULL);
  cr_assert(*out && *err);
  sl_test_remove_tree(dir);
  return WEXITSTATUS(status);
}

/* What the job itself said about its newest checkpoint (run_job). */
static sl_checkpoint_stats newest_stats;

/* A checkpointed job: keyed source (2 instances) -> verifying sink (2),
 * checkpoints every 5 ms; returns the newest checkpoint. */
static uint64_t run_job(const char *state_dir, uint64_t count) {
  sl_job *job;
  sl_op *sink;
  cr_assert_eq(sl_fixture_verified_job(state_dir, SOURCE_P, 2, count, KEYS,
                                       &job, &sink),
               0);
  cr_assert_eq(sl_job_run(job), 0, "%s", sl_job_error(job));
  sl_verify_counts v;
  cr_assert_eq(sl_verify_result(sink, &v), 0);
  cr_assert_eq(v.records, count);
  uint64_t latest = sl_job_last_checkpoint(job, NULL);
  cr_assert(latest >= 1);
  cr_assert_eq(sl_job_checkpoint_stats(job, 0, &newest_stats), 0);
  cr_assert_eq(newest_stats.id, latest);
  sl_job_destroy(job); /* closes the store: this process may open it */
  return latest;
}

static char *job_store(uint64_t *latest) {
  char *dir = sl_test_temp_dir("inspect");
  char *state = sl_test_path_in(dir, "state");
  uint64_t count = sl_test_scaled(400000, 20000);
  uint64_t first = run_job(state, count);
  /* Resumed at its end: one more (final) checkpoint, so the store always
   * holds at least two, whatever the timing. */
  *latest = run_job(state, count);
  cr_assert(*latest > first);
  free(state);
  return dir;
}

/* ------------------------------------------------------------ listing */

Test(inspect, lists_a_real_store) {
  uint64_t count = sl_test_scaled(400000, 20000), latest = 0;
  char *dir = job_store(&latest);
  char *state = sl_test_path_in(dir, "state");
  int64_t now_ms = (int64_t)time(NULL) * 1000;
  sl_state_dir *sd = NULL;
  char err[1024] = "";
  cr_assert_eq(sl_state_dir_open(state, 0, &sd, err, sizeof err), 0, "%s",
               err);
  const sl_state_dir_info *info = sl_state_dir_info_get(sd);
  cr_assert_eq(info->latest, latest);
  cr_assert(info->checkpoint_count >= 1);
  cr_assert_eq(info->checkpoint_ids[info->checkpoint_count - 1], latest);
  for (size_t k = 1; k < info->checkpoint_count; k++)
    cr_assert(info->checkpoint_ids[k - 1] < info->checkpoint_ids[k]);
  cr_assert(info->data_bytes > 0);
  cr_assert_eq(info->store_format, SL_STORE_FORMAT_VERSION);
  /* The graph: the source, the verifying sink's key_by is no thread, the
   * sink. */
  cr_assert_eq(info->max_parallelism, 128);
  cr_assert_eq(info->operator_count, 2, "%s", info->graph);
  cr_assert_str_eq(info->operators[0].name, "src");
  cr_assert_str_eq(info->operators[0].kind, "source");
  cr_assert_eq(info->operators[0].parallelism, SOURCE_P);
  cr_assert_str_eq(info->operators[1].name, "verify");
  cr_assert_str_eq(info->operators[1].kind, "sink");
  /* Keyed state: the sink's per-key counts. */
  cr_assert(info->base_entries + info->log_entries >= KEYS);
  /* Every instance has a blob of the newest checkpoint; the sources'
   * positions are what they emitted: all records, as the job ended. */
  cr_assert_eq(info->blob_count, SOURCE_P + 2);
  uint64_t emitted = 0;
  for (int i = 0; i < info->blob_count; i++) {
    const sl_inspect_blob *b = &info->blobs[i];
    cr_assert_eq(b->checkpoint_id, latest);
    cr_assert(b->operator_index >= 0);
    if (b->operator_index == 0) {
      cr_assert_eq(b->position_words, 1);
      emitted += b->position[0];
    }
  }
  cr_assert_eq(emitted, count);
  /* The newest record: the final checkpoint, with every instance. */
  sl_inspect_checkpoint c;
  cr_assert_eq(sl_state_dir_checkpoint(sd, latest, &c, err, sizeof err), 0,
               "%s", err);
  cr_assert_eq(c.final, 1);
  cr_assert_eq(c.instance_count, (uint64_t)(SOURCE_P + 2));
  cr_assert_eq(c.record_version, 2);
  cr_assert(c.has_sizes);
  /* The record's totals are the job's own figures for it. */
  cr_assert_eq(c.bytes_persisted, newest_stats.bytes_persisted);
  cr_assert_eq(c.entries_persisted, newest_stats.entries_persisted);
  cr_assert(c.bytes_persisted > 0);
  cr_assert(c.trigger_time_ms > now_ms - 600000 &&
            c.trigger_time_ms <= now_ms + 600000);
  /* An older one is listed from its record (job_store made two at
   * least); an unknown one is not. */
  cr_assert(info->checkpoint_count >= 2);
  cr_assert_eq(sl_state_dir_checkpoint(sd, info->checkpoint_ids[0], &c, err,
                                       sizeof err),
               0, "%s", err);
  cr_assert_eq(c.id, info->checkpoint_ids[0]);
  cr_assert_eq(c.instance_count, (uint64_t)(SOURCE_P + 2));
  cr_assert_eq(sl_state_dir_checkpoint(sd, latest + 1, &c, err, sizeof err),
               SL_ENOTFOUND);
  cr_assert(strstr(err, "no checkpoint"), "%s", err);
  sl_state_dir_close(sd);
  free(state);
  sl_test_remove_tree(dir);
}

Test(inspect, time_text) {
  char text[40];
  cr_assert_str_eq(sl_inspect_time_text(1796268897593, text, sizeof text),
                   "2026-12-03T03:34:57.593Z");
  cr_assert_str_eq(sl_inspect_time_text(0, text, sizeof text),
                   "1970-01-01T00:00:00.000Z");
}

Test(cli, lists_and_details, .timeout = 120) {
  uint64_t latest = 0;
  char *dir = job_store(&latest);
  char *state = sl_test_path_in(dir, "state");
  char *data = sl_test_path_in(state, "data.mdb");
  snapshot before = take(data);
  char args[2048], *out, *err;
  snprintf(args, sizeof args, "checkpoints '%s'", state);
  cr_assert_eq(sluice(args, &out, &err), 0, "%s", err);
  char line[128];
  snprintf(line, sizeof line, "newest complete %" PRIu64, latest);
  cr_assert(strstr(out, line), "%s", out);
  cr_assert(strstr(out, "latest      yes"), "%s", out);
  cr_assert(strstr(out, "       0  src                  source    2"), "%s",
            out);
  cr_assert(strstr(out, "src#0  position "), "%s", out);
  cr_assert_str_eq(err, "");
  free(out), free(err);
  snprintf(args, sizeof args, "checkpoints '%s' --id %" PRIu64, state, latest);
  cr_assert_eq(sluice(args, &out, &err), 0, "%s", err);
  cr_assert(strstr(out, "latest (restorable), final (end of input)"), "%s",
            out);
  cr_assert(strstr(out, "verify               sink             1"), "%s", out);
  free(out), free(err);
  snprintf(args, sizeof args, "checkpoints '%s' --json", state);
  cr_assert_eq(sluice(args, &out, &err), 0, "%s", err);
  snprintf(line, sizeof line, "\"latest\": %" PRIu64, latest);
  cr_assert(strstr(out, line), "%s", out);
  cr_assert(strstr(out, "\"status\": \"latest\""));
  cr_assert(strstr(out, "\"savepoints\": []"));
  free(out), free(err);
  assert_unchanged(data, &before);
  free(data);
  free(state);
  sl_test_remove_tree(dir);
}

/* ------------------------------------------------------------ running */

/* `sluice run count` writes the store in a child process while this one
 * lists it read-only, again and again: each listing is consistent (ids up
 * to latest, every blob of latest), the ids it sees grow, and the job is
 * neither blocked nor disturbed: it finishes and verifies its output. */
Test(inspect, while_a_job_runs, .timeout = 240) {
  char *dir = sl_test_temp_dir("inspect-live");
  char *state = sl_test_path_in(dir, "state");
  char *output = sl_test_path_in(dir, "out");
  char records[32];
  snprintf(records, sizeof records, "%" PRIu64,
           sl_test_scaled(30000000, 3000000));
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    int fd = open("/dev/null", O_WRONLY);
    dup2(fd, 1);
    dup2(fd, 2);
    execl(sluice_bin(), sluice_bin(), "run", "count", "--records", records,
          "--keys", "1000", "--parallelism", "2", "--state-dir", state,
          "--output", output,
          "--checkpoint-interval-ms", "20", "--no-sync", "--quiet",
          (char *)NULL);
    _exit(127);
  }
  int listings_while_running = 0, status = 0;
  bool reaped = false;
  uint64_t first_seen = 0, last_seen = 0;
  for (int round = 0; round < 100000; round++) { /* ends with the child */
    if ((reaped = waitpid(pid, &status, WNOHANG) == pid))
      break;
    sl_state_dir *sd = NULL;
    char err[1024];
    int rc = sl_state_dir_open(state, 0, &sd, err, sizeof err);
    if (rc == ENOENT) { /* not created yet */
      sl_test_sleep_us(2000);
      continue;
    }
    cr_assert_eq(rc, 0, "%s", err);
    const sl_state_dir_info *info = sl_state_dir_info_get(sd);
    if (info->latest > 0) {
      cr_assert_eq(info->checkpoint_ids[info->checkpoint_count - 1],
                   info->latest);
      cr_assert_eq(info->blob_count, 6); /* source, count, sink x2 */
      for (int i = 0; i < info->blob_count; i++)
        cr_assert(info->blobs[i].checkpoint_id <= info->latest);
      cr_assert(info->latest >= last_seen, "ids never go back");
      if (!first_seen)
        first_seen = info->latest;
      last_seen = info->latest;
    }
    sl_state_dir_close(sd);
    if ((reaped = waitpid(pid, &status, WNOHANG) == pid))
      break;
    listings_while_running++; /* the job ran all through this listing */
    sl_test_sleep_us(5000);
  }
  if (!reaped)
    cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "the job failed (status %d)", status);
  cr_assert(listings_while_running > 0);
  cr_assert(last_seen >= first_seen);
  cr_log_info("%d listings while the job ran, checkpoints %" PRIu64
              " .. %" PRIu64, listings_while_running, first_seen, last_seen);
  free(state);
  free(output);
  sl_test_remove_tree(dir);
}

/* ------------------------------------------------------------ savepoints */

#define MANIFEST_TEXT \
    "{\"format\":\"sluice-savepoint\",\"version\":1,\"store_format\":2," \
    "\"checkpoint_id\":%" PRIu64 ",\"created_ms\":1796268897593," \
    "\"graph\":\"max_parallelism=128;0:source:src:2;2:sink:verify:2\"," \
    "\"max_parallelism\":128,\"operators\":[{\"id\":0,\"name\":\"src\"," \
    "\"kind\":\"source\",\"parallelism\":2},{\"id\":2,\"name\":\"verify\"," \
    "\"kind\":\"sink\",\"parallelism\":2}],\"bytes\":%zu}\n"

/* A savepoint as the savepoint code makes it: a store copy and a
 * manifest, and its line in the state directory's index. */
static char *make_savepoint(const char *dir, uint64_t latest) {
  char *sp = sl_test_path_in(dir, "sp-1");
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "mkdir -p '%s/store' && cp '%s/state/data.mdb' "
           "'%s/store/data.mdb'", sp, dir, sp);
  cr_assert_eq(system(cmd), 0);
  size_t bytes = 0;
  char *data_path = sl_test_path_in(sp, "store/data.mdb");
  free(sl_test_read_file(data_path, &bytes));
  char text[2048];
  snprintf(text, sizeof text, MANIFEST_TEXT, latest, bytes);
  char *manifest = sl_test_path_in(sp, "manifest.json");
  write_file(manifest, text);
  char *index = sl_test_path_in(dir, "state/savepoints.jsonl");
  snprintf(text, sizeof text,
           "{\"checkpoint_id\":%" PRIu64 ",\"created_ms\":1796268897593,"
           "\"path\":\"%s\",\"bytes\":%zu}\n"
           "\n"
           "{\"checkpoint_id\":1,\"created_ms\":1796268800000,"
           "\"path\":\"/nonexistent/sp-0\",\"bytes\":4096}\n",
           latest, sp, bytes);
  write_file(index, text);
  free(data_path);
  free(manifest);
  free(index);
  return sp;
}

Test(savepoint, index_and_manifest) {
  uint64_t latest = 0;
  char *dir = job_store(&latest);
  char *sp = make_savepoint(dir, latest);
  char *state = sl_test_path_in(dir, "state");
  sl_savepoint_entry *entries = NULL;
  size_t n = 0;
  char err[1024] = "";
  cr_assert_eq(sl_savepoints_read(state, &entries, &n, err, sizeof err), 0,
               "%s", err);
  cr_assert_eq(n, 2);
  cr_assert_eq(entries[0].checkpoint_id, latest);
  cr_assert_eq(entries[0].created_ms, 1796268897593);
  cr_assert_str_eq(entries[0].path, sp);
  cr_assert_eq(entries[1].bytes, 4096);
  free(entries);
  cr_assert(sl_savepoint_is_dir(sp));
  cr_assert(!sl_savepoint_is_dir(state));
  sl_savepoint_manifest m;
  cr_assert_eq(sl_savepoint_manifest_read(sp, &m, err, sizeof err), 0, "%s",
               err);
  cr_assert_eq(m.checkpoint_id, latest);
  cr_assert_eq(m.operator_count, 2);
  cr_assert_str_eq(m.operators[1].name, "verify");
  char *store_dir = sl_test_path_in(sp, "store");
  cr_assert_str_eq(m.store_dir, store_dir);
  sl_savepoint_manifest_free(&m);
  free(store_dir);
  free(state);
  free(sp);
  sl_test_remove_tree(dir);
}

Test(cli, shows_savepoints, .timeout = 120) {
  uint64_t latest = 0;
  char *dir = job_store(&latest);
  char *sp = make_savepoint(dir, latest);
  char args[2048], *out, *err;
  snprintf(args, sizeof args, "checkpoints '%s/state'", dir);
  cr_assert_eq(sluice(args, &out, &err), 0, "%s", err);
  cr_assert(strstr(out, "savepoints (savepoints.jsonl):"), "%s", out);
  cr_assert(strstr(out, sp), "%s", out);
  cr_assert(strstr(out, "/nonexistent/sp-0  (missing)"), "%s", out);
  free(out), free(err);
  /* The savepoint itself: manifest and checkpoint; no lock file made. */
  char *data = sl_test_path_in(sp, "store/data.mdb");
  snapshot before = take(data);
  snprintf(args, sizeof args, "checkpoints '%s'", sp);
  cr_assert_eq(sluice(args, &out, &err), 0, "%s", err);
  cr_assert(strstr(out, "manifest: format sluice-savepoint version 1"), "%s",
            out);
  char line[128];
  snprintf(line, sizeof line, "newest complete %" PRIu64, latest);
  cr_assert(strstr(out, line), "%s", out);
  free(out), free(err);
  snprintf(args, sizeof args, "checkpoints '%s' --json", sp);
  cr_assert_eq(sluice(args, &out, &err), 0, "%s", err);
  cr_assert(strstr(out, "\"format\": \"sluice-savepoint\""), "%s", out);
  free(out), free(err);
  assert_unchanged(data, &before);
  char *lock = sl_test_path_in(sp, "store/lock.mdb");
  struct stat st;
  cr_assert_neq(stat(lock, &st), 0, "a savepoint's store stays as it was");
  free(lock);
  free(data);
  free(sp);
  sl_test_remove_tree(dir);
}

/* ------------------------------------------------------------ bad input */

/* sluice checkpoints ARGS fails with status and a message holding what. */
static void refused(const char *args, int status, const char *what) {
  char *out, *err;
  cr_assert_eq(sluice(args, &out, &err), status, "%s: %s%s", args, out, err);
  cr_assert(strstr(err, what), "%s: expected '%s' in: %s", args, what, err);
  cr_assert_str_eq(out, "", "no partial listing");
  free(out), free(err);
}

Test(bad_input, not_a_directory_or_not_a_store) {
  char *dir = sl_test_temp_dir("inspect-bad");
  char *file = sl_test_path_in(dir, "file");
  write_file(file, "hello\n");
  snapshot before = take(file);
  char args[1024];
  snprintf(args, sizeof args, "checkpoints '%s'", file);
  refused(args, 1, "not a directory");
  assert_unchanged(file, &before);
  /* A directory of other files. */
  before = take(file);
  snprintf(args, sizeof args, "checkpoints '%s'", dir);
  refused(args, 1, "not a sluice state directory");
  assert_unchanged(file, &before);
  /* No such directory; an empty one. */
  snprintf(args, sizeof args, "checkpoints '%s/none'", dir);
  refused(args, 1, "no such directory");
  char *empty = sl_test_path_in(dir, "empty");
  cr_assert_eq(mkdir(empty, 0755), 0);
  snprintf(args, sizeof args, "checkpoints '%s'", empty);
  refused(args, 1, "holds no sluice store");
  struct stat st;
  char *data = sl_test_path_in(empty, "data.mdb");
  cr_assert_neq(stat(data, &st), 0, "nothing was created");
  free(data);
  free(empty);
  free(file);
  sl_test_remove_tree(dir);
}

Test(bad_input, foreign_lmdb_file) {
  char *dir = sl_test_temp_dir("inspect-foreign");
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi dbi;
  cr_assert_eq(mdb_env_create(&env), 0);
  cr_assert_eq(mdb_env_open(env, dir, 0, 0644), 0);
  cr_assert_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
  cr_assert_eq(mdb_dbi_open(txn, NULL, 0, &dbi), 0);
  MDB_val key = {.mv_size = 3, .mv_data = "abc"};
  MDB_val value = {.mv_size = 3, .mv_data = "xyz"};
  cr_assert_eq(mdb_put(txn, dbi, &key, &value, 0), 0);
  cr_assert_eq(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
  char *data = sl_test_path_in(dir, "data.mdb");
  snapshot before = take(data);
  char args[1024];
  snprintf(args, sizeof args, "checkpoints '%s'", dir);
  refused(args, 1, "an LMDB environment, but not a sluice store");
  assert_unchanged(data, &before);
  /* Not an LMDB file at all. */
  write_file(data, "this is not an LMDB file, only text of some length.....\n");
  before = take(data);
  refused(args, 1, "data.mdb is not an LMDB file");
  assert_unchanged(data, &before);
  free(data);
  sl_test_remove_tree(dir);
}

/* A record whose checksum fails: one byte of it flipped in data.mdb. */
Test(bad_input, corrupt_record) {
  uint64_t latest = 0;
  char *dir = job_store(&latest);
  char *state = sl_test_path_in(dir, "state");
  sl_state_dir *sd;
  char err[1024];
  cr_assert_eq(sl_state_dir_open(state, 0, &sd, err, sizeof err), 0);
  const sl_state_dir_info *info = sl_state_dir_info_get(sd);
  uint64_t first = info->checkpoint_ids[0];
  sl_state_dir_close(sd);
  sl_store *store;
  sl_store_options options = {.read_only = 1};
  cr_assert_eq(sl_store_open(state, &options, &store, err, sizeof err), 0);
  void *record;
  uint32_t bytes;
  cr_assert_eq(sl_store_get_checkpoint(store, first, &record, &bytes), 0);
  sl_store_close(store);
  char *data = sl_test_path_in(state, "data.mdb");
  size_t size;
  char *file = sl_test_read_file(data, &size);
  /* Every copy: LMDB's free pages may hold older copies of the page. */
  FILE *f = fopen(data, "r+b");
  cr_assert(f);
  int copies = 0;
  for (char *at = file; at && copies < 1000; copies++) {
    at = memmem(at, size - (size_t)(at - file), record, bytes);
    if (!at)
      break;
    at[8] ^= 0x40; /* its trigger time */
    cr_assert_eq(fseek(f, at - file + 8, SEEK_SET), 0);
    cr_assert_eq(fwrite(at + 8, 1, 1, f), 1);
    at += bytes;
  }
  cr_assert(copies > 0, "the record's bytes are in data.mdb");
  cr_assert_eq(fclose(f), 0);
  free(file);
  free(record);
  snapshot before = take(data);
  char args[1024];
  snprintf(args, sizeof args, "checkpoints '%s' --all", state);
  refused(args, 1, "fails its checksum");
  snprintf(args, sizeof args, "checkpoints '%s' --id %" PRIu64, state, first);
  refused(args, 1, "fails its checksum");
  assert_unchanged(data, &before);
  /* The newest one is intact: its detail still shows. */
  char *out, *cerr;
  snprintf(args, sizeof args, "checkpoints '%s' --id %" PRIu64, state, latest);
  cr_assert_eq(sluice(args, &out, &cerr), 0, "%s", cerr);
  free(out), free(cerr);
  free(data);
  free(state);
  sl_test_remove_tree(dir);
}

/* A damaged key can move a checkpoint record above the latest id, where a
 * listing taken after the view would leave it out as committed meanwhile
 * (engine/inspect.c note 2).  Modelled exactly: the first record's bytes
 * put raw under id latest + 1, so its checksum (over the key too) fails.
 * The open must say so, not list one checkpoint fewer. */
Test(bad_input, record_moved_above_the_latest) {
  uint64_t latest = 0;
  char *dir = job_store(&latest);
  char *state = sl_test_path_in(dir, "state");
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi dbi;
  cr_assert_eq(mdb_env_create(&env), 0);
  cr_assert_eq(mdb_env_set_maxdbs(env, 8), 0);
  cr_assert_eq(mdb_env_open(env, state, 0, 0644), 0);
  cr_assert_eq(mdb_txn_begin(env, 0, 0, &txn), 0);
  cr_assert_eq(mdb_dbi_open(txn, "checkpoints", 0, &dbi), 0);
  MDB_cursor *cursor;
  MDB_val key, value;
  cr_assert_eq(mdb_cursor_open(txn, dbi, &cursor), 0);
  cr_assert_eq(mdb_cursor_get(cursor, &key, &value, MDB_FIRST), 0);
  cr_assert_eq(key.mv_size, 8);
  uint8_t *copy = malloc(value.mv_size);
  cr_assert(copy);
  memcpy(copy, value.mv_data, value.mv_size);
  size_t copy_bytes = value.mv_size;
  mdb_cursor_close(cursor);
  uint8_t moved[8];
  for (int i = 0; i < 8; i++) /* big-endian, as the store keys ids */
    moved[i] = (uint8_t)((latest + 1) >> (56 - 8 * i));
  MDB_val moved_key = {sizeof moved, moved};
  MDB_val moved_value = {copy_bytes, copy};
  cr_assert_eq(mdb_put(txn, dbi, &moved_key, &moved_value, 0), 0);
  cr_assert_eq(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
  free(copy);

  sl_state_dir *sd = 0;
  char err[1024] = "";
  int rc = sl_state_dir_open(state, 0, &sd, err, sizeof err);
  cr_expect_eq(rc, SL_ECORRUPT, "opened (rc %d), listing %zu checkpoints",
               rc, sd ? sl_state_dir_info_get(sd)->checkpoint_count : 0);
  cr_expect(strstr(err, "data.mdb") && strstr(err, "checksum"), "%s", err);
  if (sd)
    sl_state_dir_close(sd);
  char args[1024];
  snprintf(args, sizeof args, "checkpoints '%s'", state);
  refused(args, 1, "fails its checksum");
  free(state);
  sl_test_remove_tree(dir);
}

/* Bytes that pass the checksum but are not a record or a blob this sluice
 * wrote: written through the store's own API. */
Test(bad_input, undecodable_record_and_blob) {
  char *dir = sl_test_temp_dir("inspect-undecodable");
  sl_store_options options = {
      .graph_fingerprint = "max_parallelism=128;0:source:src:1", .no_sync = 1};
  sl_store *store;
  char err[1024];
  cr_assert_eq(sl_store_open(dir, &options, &store, err, sizeof err), 0, "%s",
               err);
  sl_store_txn *txn;
  uint8_t blob[9] = {1, 5, 0, 0, 0, 0, 0, 0, 0}; /* state: position 5 */
  cr_assert_eq(sl_store_begin(store, &txn), 0);
  cr_assert_eq(sl_store_put_blob(txn, 0, 0, blob, sizeof blob), 0);
  cr_assert_eq(sl_store_commit(txn, 1, "xyz", 3), 0);
  sl_store_close(store);
  sl_state_dir *sd;
  cr_assert_eq(sl_state_dir_open(dir, 0, &sd, err, sizeof err), 0, "%s", err);
  cr_assert_eq(sl_state_dir_info_get(sd)->blobs[0].position[0], 5);
  sl_inspect_checkpoint c;
  cr_assert_eq(sl_state_dir_checkpoint(sd, 1, &c, err, sizeof err),
               SL_ECORRUPT);
  cr_assert(strstr(err, "the record of checkpoint 1 is corrupt: 3 bytes"),
            "%s", err);
  sl_state_dir_close(sd);
  char args[1024];
  snprintf(args, sizeof args, "checkpoints '%s'", dir);
  refused(args, 1, "is corrupt: 3 bytes");
  /* A blob with flag bits this sluice never writes. */
  cr_assert_eq(sl_store_open(dir, &options, &store, err, sizeof err), 0);
  blob[0] = 0x80;
  cr_assert_eq(sl_store_begin(store, &txn), 0);
  cr_assert_eq(sl_store_put_blob(txn, 0, 0, blob, sizeof blob), 0);
  uint8_t record[24] = {1};
  cr_assert_eq(sl_store_commit(txn, 2, record, sizeof record), 0);
  sl_store_close(store);
  cr_assert_eq(sl_state_dir_open(dir, 0, &sd, err, sizeof err), SL_ECORRUPT);
  cr_assert_null(sd);
  cr_assert(strstr(err, "the blob of operator 0 instance 0"), "%s", err);
  refused(args, 1, "is not one this sluice wrote");
  sl_test_remove_tree(dir);
}

Test(bad_input, unknown_id_and_usage) {
  uint64_t latest = 0;
  char *dir = job_store(&latest);
  char args[1024];
  snprintf(args, sizeof args, "checkpoints '%s/state' --id %" PRIu64, dir,
           latest + 5);
  refused(args, 1, "no checkpoint");
  refused("checkpoints", 2, "checkpoints needs a state directory");
  snprintf(args, sizeof args, "checkpoints '%s/state' --id x", dir);
  refused(args, 2, "is not a whole number");
  snprintf(args, sizeof args, "checkpoints '%s/state' --frobnicate", dir);
  refused(args, 2, "unknown option '--frobnicate'");
  snprintf(args, sizeof args, "checkpoints '%s/state' '%s'", dir, dir);
  refused(args, 2, "one directory only");
  sl_test_remove_tree(dir);
}

/* Each malformed line of the index: the file, the line and the fault. */
Test(bad_input, malformed_savepoint_index) {
  uint64_t latest = 0;
  char *dir = job_store(&latest);
  char *index = sl_test_path_in(dir, "state/savepoints.jsonl");
  static const struct {
    const char *second_line, *what;
  } cases[] = {
      {"{\"checkpoint_id\":2,\"created_ms\":5,\"path\":\"/x\"}",
       "savepoints.jsonl:2: \"bytes\" is missing"},
      {"{\"checkpoint_id\":\"2\",\"created_ms\":5,\"path\":\"/x\",\"bytes\":1}",
       "savepoints.jsonl:2: \"checkpoint_id\" is not a whole number >= 0"},
      {"{\"checkpoint_id\":2,\"created_ms\":5,\"path\":7,\"bytes\":1}",
       "savepoints.jsonl:2: \"path\" is not a non-empty string"},
      {"{\"checkpoint_id\":2,", "savepoints.jsonl:2: not JSON"},
      {"[1,2]", "savepoints.jsonl:2: \"the line\" is not a JSON object"},
  };
  char args[1024];
  snprintf(args, sizeof args, "checkpoints '%s/state'", dir);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char text[1024];
    snprintf(text, sizeof text,
             "{\"checkpoint_id\":1,\"created_ms\":5,\"path\":\"/x\","
             "\"bytes\":1}\n%s\n",
             cases[i].second_line);
    write_file(index, text);
    snapshot before = take(index);
    sl_savepoint_entry *entries = (void *)1;
    size_t n = 9;
    char err[1024];
    cr_assert_eq(sl_savepoints_read(dir, &entries, &n, err, sizeof err),
                 ENOENT, "the index is in the state directory");
    char *state = sl_test_path_in(dir, "state");
    cr_assert_eq(sl_savepoints_read(state, &entries, &n, err, sizeof err),
                 EINVAL);
    cr_assert_null(entries);
    cr_assert_eq(n, 0);
    cr_assert(strstr(err, cases[i].what), "%s", err);
    free(state);
    refused(args, 1, cases[i].what);
    assert_unchanged(index, &before);
  }
  free(index);
  sl_test_remove_tree(dir);
}

Test(bad_input, malformed_manifest) {
  uint64_t latest = 0;
  char *dir = job_store(&latest);
  char *sp = make_savepoint(dir, latest);
  char *manifest = sl_test_path_in(sp, "manifest.json");
  static const struct {
    const char *text, *what;
  } cases[] = {
      {"{\"format\":\"other\"}", "\"format\" is not \"sluice-savepoint\""},
      {"{\"format\":\"sluice-savepoint\",\"version\":1}",
       "\"store_format\" is missing"},
      {"not json", "manifest.json: line 1: not JSON"},
      {"{\"format\":\"sluice-savepoint\",\"version\":1,\"store_format\":2,"
       "\"checkpoint_id\":3,\"created_ms\":1,\"bytes\":1,\"max_parallelism\":"
       "128,\"graph\":\"g\",\"operators\":[{\"id\":0}]}",
       "\"operators\" has an entry without"},
  };
  char args[1024];
  snprintf(args, sizeof args, "checkpoints '%s'", sp);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    write_file(manifest, cases[i].text);
    snapshot before = take(manifest);
    refused(args, 1, cases[i].what);
    assert_unchanged(manifest, &before);
  }
  /* A manifest that names another checkpoint than its store holds. */
  char text[2048];
  snprintf(text, sizeof text, MANIFEST_TEXT, latest + 1, (size_t)1);
  write_file(manifest, text);
  refused(args, 1, "the manifest names checkpoint");
  free(manifest);
  free(sp);
  sl_test_remove_tree(dir);
}
