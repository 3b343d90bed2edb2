/* test_store.c — Criterion tests of the LMDB store (storage/store.h).
 *
 * Every test works on real LMDB files in its own temporary directory
 * (mkdtemp under /tmp, removed by the suite's fini).  Keyed state is
 * checked against a model: entry i of a test has a fixed operator, key
 * group and key, and the model remembers which checkpoint last wrote it
 * (0: absent), so the expected value of every key is a pure function of
 * (i, version) and every read can be compared entry by entry.
 *
 * Bad stores (store.h note 4) are made with the raw LMDB API, and
 * corruption is injected the same way: a stored value is read raw, one
 * byte flipped, and written back raw.  Cases that need a second process
 * (a writer holding the lock, a crash inside a transaction) fork; the
 * child reports through its exit status and never calls Criterion.
 * Compaction's tests are in test_store_compaction.c; the fixture, the
 * model and the raw LMDB helpers both use are in test_store.h.
 */
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <lmdb.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "sluice.h"
#include "store.h"
#include "test_store.h"

TestSuite(store, .init = make_root, .fini = remove_root, .timeout = 60);

/* ------------------------------------------------------------ snapshots */

/* A directory's names and file contents, to show that a refused open
 * changed nothing. */
#define SNAPSHOT_MAX 16
typedef struct dir_snapshot {
  int count;
  char names[SNAPSHOT_MAX][64];
  uint64_t hashes[SNAPSHOT_MAX]; /* of the contents; 0 for a directory */
} dir_snapshot;

static int compare_names(const void *a, const void *b) {
  return strcmp(a, b);
}

static uint64_t file_hash(const char *path) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "%s: %s", path, strerror(errno));
  static uint8_t buffer[1 << 20];
  size_t bytes = fread(buffer, 1, sizeof buffer, f);
  fclose(f);
  return XXH3_64bits(buffer, bytes) | 1;
}

static void snapshot(const char *dir, dir_snapshot *snap) {
  memset(snap, 0, sizeof *snap);
  DIR *d = opendir(dir);
  cr_assert_not_null(d);
  struct dirent *e;
  while ((e = readdir(d)) != 0) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    cr_assert_lt(snap->count, SNAPSHOT_MAX);
    int n = snprintf(snap->names[snap->count++], 64, "%s", e->d_name);
    cr_assert(n > 0 && n < 64);
  }
  closedir(d);
  qsort(snap->names, (size_t)snap->count, sizeof snap->names[0],
        compare_names);
  for (int i = 0; i < snap->count; i++) {
    char path[PATH_MAX];
    struct stat st;
    join(path, dir, snap->names[i]);
    cr_assert_eq(stat(path, &st), 0);
    snap->hashes[i] = S_ISREG(st.st_mode) ? file_hash(path) : 0;
  }
}

static void assert_unchanged(const char *dir, const dir_snapshot *before) {
  dir_snapshot after;
  snapshot(dir, &after);
  cr_assert_eq(after.count, before->count, "%s: %d entries, was %d", dir,
               after.count, before->count);
  for (int i = 0; i < after.count; i++) {
    cr_assert_str_eq(after.names[i], before->names[i]);
    cr_assert_eq(after.hashes[i], before->hashes[i], "%s changed",
                 after.names[i]);
  }
}

static void write_file(const char *path, const void *data, size_t bytes) {
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f, "%s: %s", path, strerror(errno));
  cr_assert_eq(fwrite(data, 1, bytes, f), bytes);
  cr_assert_eq(fclose(f), 0);
}

/* ------------------------------------------------------------ tests */

/* Checkpoints 1..3 with puts, deletes and blobs survive a reopen, and
 * every read returns exactly what was written. */
Test(store, round_trip) {
  char dir[PATH_MAX];
  path_in_root(dir, "state"); /* missing: created */
  sl_store_options o = writer_options(FINGERPRINT);
  model m;
  model_init(&m, 2000);
  sl_store *st = open_ok(dir, &o);
  cr_assert_eq(sl_store_latest(st), 0);
  cr_assert_str_eq(sl_store_error(st), "");
  for (uint32_t version = 1; version <= 3; version++) {
    write_checkpoint(st, &m, version);
    check_all_ranges(st, &m); /* the writer's own handle reads it too */
  }
  sl_store_close(st);

  st = open_ok(dir, &o);
  cr_assert_eq(sl_store_latest(st), 3);
  check_all_ranges(st, &m);
  check_blob(st, 1, 0, 3);
  check_blob(st, 1, 1, 1); /* written by checkpoint 1 only */
  for (uint64_t id = 1; id <= 3; id++)
    check_record(st, id);
  check_list(st, (const uint64_t[]){1, 2, 3}, 3);
  void *data = (void *)1;
  uint32_t bytes = 1;
  cr_assert_eq(sl_store_get_blob(st, 1, 2, &data, &bytes), SL_ENOTFOUND);
  cr_assert_null(data);
  assert_contains(sl_store_error(st), "op 1 instance 2");
  cr_assert_eq(sl_store_get_checkpoint(st, 4, &data, &bytes), SL_ENOTFOUND);
  cr_assert_eq(sl_store_read_state(st, 1, 5, 4, seen_entry, 0), EINVAL);
  sl_store_close(st);

  /* Note 1: each blob carries the id of the checkpoint that wrote it. */
  uint8_t raw[256], key[4] = {0, 1, 0, 1};
  size_t raw_bytes = raw_get(dir, "blobs", key, 4, raw, sizeof raw);
  cr_assert_gt(raw_bytes, 16);
  cr_assert_eq(raw[0], 1, "blob (1, 1) is tagged with checkpoint 1");
  key[3] = 0;
  raw_get(dir, "blobs", key, 4, raw, sizeof raw);
  cr_assert_eq(raw[0], 3, "blob (1, 0) is tagged with checkpoint 3");
  free(m.version);
}

/* A callback's nonzero return stops the walk and is returned. */
static int stop_after_two(void *arg, uint16_t key_group, const void *key,
                          uint32_t key_bytes, const void *value,
                          uint32_t value_bytes) {
  (void)key_group, (void)key, (void)key_bytes, (void)value, (void)value_bytes;
  int *calls = arg;
  return ++*calls == 2 ? 77 : 0;
}

/* A read of state, a compaction and a blob read from inside a read: each
 * read has its own transaction and buffers (restores run in parallel), so
 * all of them work, and the outer read goes on over its own snapshot. */
static int read_again(void *arg, uint16_t key_group, const void *key,
                      uint32_t key_bytes, const void *value,
                      uint32_t value_bytes) {
  (void)key_group, (void)key, (void)key_bytes, (void)value, (void)value_bytes;
  sl_store *st = arg;
  int calls = 0;
  sl_store_compaction stats;
  void *data;
  uint32_t bytes;
  cr_assert_eq(sl_store_read_state(st, 1, 0, UINT16_MAX, stop_after_two,
                                   &calls),
               77);
  cr_assert_eq(sl_store_compact(st, 0, &stats), 0, "%s", sl_store_error(st));
  cr_assert_eq(sl_store_get_blob(st, 1, 0, &data, &bytes), 0);
  free(data);
  return 5;
}

Test(store, read_state_stops_on_callback) {
  model m;
  sl_store *st = first_checkpoint(&m, 100); /* the empty root itself */
  int calls = 0;
  cr_assert_eq(sl_store_read_state(st, 1, 0, UINT16_MAX, stop_after_two,
                                   &calls),
               77);
  cr_assert_eq(calls, 2);
  cr_assert_eq(sl_store_read_state(st, 1, 0, UINT16_MAX, read_again, st), 5);
  check_all_ranges(st, &m); /* and reads work again after it */
  sl_store_close(st);
  free(m.version);
}

/* Commit ids must grow; an abort leaves the previous checkpoint; a failed
 * transaction stays failed until it is ended (store_txn.c note 2). */
Test(store, commit_and_abort_rules) {
  model m;
  sl_store *st = first_checkpoint(&m, 500);
  model saved = {m.count, malloc(m.count * sizeof *m.version)};
  memcpy(saved.version, m.version, m.count * sizeof *m.version);

  sl_store_txn *txn, *other;
  cr_assert_eq(sl_store_begin(st, &txn), 0);
  cr_assert_eq(sl_store_begin(st, &other), EBUSY);
  cr_assert_null(other);
  cr_assert_eq(write_changes(txn, &m, 2), 0);
  cr_assert_eq(sl_store_commit(txn, 1, "x", 1), EINVAL); /* not > latest */
  assert_contains(sl_store_error(st), "not newer");
  cr_assert_eq(sl_store_latest(st), 1);
  check_all_ranges(st, &saved); /* the refused commit wrote nothing */

  cr_assert_eq(sl_store_begin(st, &txn), 0); /* the commit ended it */
  cr_assert_eq(write_changes(txn, &m, 2), 0);
  cr_assert_eq(sl_store_put_blob(txn, 1, 0, "lost", 4), 0);
  check_all_ranges(st, &saved); /* reads see only committed checkpoints */
  check_blob(st, 1, 0, 1);
  sl_store_abort(txn);
  sl_store_abort(txn); /* twice is harmless */
  sl_store_abort(0);
  cr_assert_eq(sl_store_put_state(txn, 1, 0, "k", 1, "v", 1), EINVAL);
  cr_assert_eq(sl_store_latest(st), 1);
  check_all_ranges(st, &saved);
  check_blob(st, 1, 0, 1);

  /* A failure: the longest key fits (511 - 12 bytes of the log key's
   * seq, op and group), one byte more fails the txn. */
  static uint8_t key[600];
  cr_assert_eq(sl_store_begin(st, &txn), 0);
  cr_assert_eq(sl_store_put_state(txn, 1, 0, key, 499, "v", 1), 0);
  cr_assert_eq(sl_store_put_state(txn, 1, 0, key, 500, "v", 1), EINVAL);
  assert_contains(sl_store_error(st), "500 bytes is too long");
  cr_assert_eq(sl_store_put_state(txn, 1, 0, "k", 1, "v", 1), EINVAL);
  cr_assert_eq(sl_store_delete_state(txn, 1, 0, "k", 1), EINVAL);
  cr_assert_eq(sl_store_begin(st, &other), EBUSY); /* not ended yet */
  cr_assert_eq(sl_store_grow(st), 0); /* a failed txn holds nothing */
  cr_assert_eq(sl_store_commit(txn, 2, 0, 0), EINVAL); /* its failure */
  cr_assert_eq(sl_store_latest(st), 1);
  check_all_ranges(st, &saved);

  /* Commit 5 after 1 (ids may skip); the blob put twice keeps the last. */
  cr_assert_eq(sl_store_begin(st, &txn), 0);
  cr_assert_eq(sl_store_put_blob(txn, 1, 0, "first", 5), 0);
  char text[64];
  blob_text(text, 1, 0, 5);
  cr_assert_eq(sl_store_put_blob(txn, 1, 0, text, (uint32_t)strlen(text)), 0);
  cr_assert_eq(sl_store_put_blob(txn, 2, 0, 0, 0), 0); /* empty blob */
  cr_assert_eq(sl_store_commit(txn, 5, 0, 0), 0);
  cr_assert_eq(sl_store_latest(st), 5);
  check_blob(st, 1, 0, 5);
  void *data;
  uint32_t bytes;
  cr_assert_eq(sl_store_get_blob(st, 2, 0, &data, &bytes), 0);
  cr_assert_not_null(data);
  cr_assert_eq(bytes, 0);
  free(data);
  check_list(st, (const uint64_t[]){1, 5}, 2);
  sl_store_close(st);
  free(m.version);
  free(saved.version);
}

/* Writes big-value entries 0..count-1 of op 7 as checkpoint id, growing
 * the map on MDB_MAP_FULL and writing the whole transaction again. */
static int write_big(sl_store *st, uint32_t count, uint64_t id, int *grows) {
  for (int attempt = 0; attempt < 12; attempt++) { /* 2^12 x the map */
    int rc = write_big_range(st, 0, count, id);
    if (rc != MDB_MAP_FULL)
      return rc;
    assert_contains(sl_store_error(st), "is full");
    cr_assert_eq(sl_store_grow(st), 0, "%s", sl_store_error(st));
    ++*grows;
  }
  return MDB_MAP_FULL;
}

Test(store, map_full_grow_and_retry) {
  sl_store_options o = writer_options(FINGERPRINT);
  o.initial_map_bytes = 1u << 20;
  o.no_sync = 1; /* speed; the data is checked in this process */
  sl_store *st = open_ok(root, &o);
  uint64_t first_bytes = sl_store_map_bytes(st);
  cr_assert_geq(first_bytes, 1u << 20);
  const uint32_t count = 10000; /* 10 MB of values */
  int grows = 0;
  int rc = write_big(st, count, 1, &grows);
  cr_assert_eq(rc, 0, "%s", sl_store_error(st));
  cr_assert_geq(grows, 3, "1 MiB -> at least 8 MiB: %d grows", grows);
  uint64_t grown_bytes = sl_store_map_bytes(st);
  cr_assert_geq(grown_bytes, first_bytes << grows);
  cr_assert_geq(grown_bytes, (uint64_t)count * BIG_VALUE_BYTES);
  cr_assert_eq(sl_store_latest(st), 1);
  sl_store_close(st);

  st = open_ok(root, &o); /* asks 1 MiB again, keeps the grown map */
  cr_assert_geq(sl_store_map_bytes(st), grown_bytes);
  uint32_t counts[2] = {0, 0};
  cr_assert_eq(sl_store_read_state(st, 7, 0, UINT16_MAX, count_big, counts),
               0);
  cr_assert_eq(counts[0], count);
  cr_assert_eq(counts[1], 0, "%u wrong entries", counts[1]);
  sl_store_close(st);
}

Test(store, refuses_a_regular_file) {
  char path[PATH_MAX];
  path_in_root(path, "file");
  write_file(path, "hello", 5);
  sl_store_options o = writer_options(FINGERPRINT);
  assert_contains(open_fails(path, &o, SL_ESTORE), "not a directory");
  o.read_only = 1;
  assert_contains(open_fails(path, &o, SL_ESTORE), "not a directory");
}

Test(store, refuses_a_foreign_directory_unchanged) {
  char path[PATH_MAX], dir[PATH_MAX];
  path_in_root(dir, "photos");
  cr_assert_eq(mkdir(dir, 0755), 0);
  join(path, dir, "cat.jpg");
  write_file(path, "meow", 4);
  join(path, dir, "lock.mdb"); /* one of our names */
  write_file(path, "x", 1);
  join(path, dir, "album");
  cr_assert_eq(mkdir(path, 0755), 0);
  dir_snapshot before;
  snapshot(dir, &before);
  sl_store_options o = writer_options(FINGERPRINT);
  const char *err = open_fails(dir, &o, SL_ESTORE);
  assert_contains(err, "not a sluice state directory");
  assert_unchanged(dir, &before); /* no lock, no lock.mdb change */
  o.read_only = 1;
  open_fails(dir, &o, SL_ESTORE);
  assert_unchanged(dir, &before);
}

Test(store, refuses_garbage_data_file_unchanged) {
  static uint8_t garbage[8192];
  for (size_t i = 0; i < sizeof garbage; i++)
    garbage[i] = (uint8_t)mix64(i);
  char path[PATH_MAX];
  path_in_root(path, "data.mdb");
  write_file(path, garbage, sizeof garbage);
  dir_snapshot before;
  snapshot(root, &before);
  sl_store_options o = writer_options(FINGERPRINT);
  assert_contains(open_fails(root, &o, SL_ESTORE), "not an LMDB file");
  assert_unchanged(root, &before);
  write_file(path, garbage, 7); /* too short to hold a meta page */
  snapshot(root, &before);
  assert_contains(open_fails(root, &o, SL_ESTORE), "not an LMDB file");
  assert_unchanged(root, &before);
}

Test(store, refuses_someone_elses_lmdb) {
  char dir[PATH_MAX], lock[PATH_MAX];
  sl_store_options o = writer_options(FINGERPRINT);
  /* A plain key in the main database, then a named database "meta"
   * holding something else, then "meta" as a plain key. */
  for (int variant = 0; variant < 3; variant++) {
    char name[32];
    snprintf(name, sizeof name, "other-%d", variant);
    path_in_root(dir, name);
    cr_assert_eq(mkdir(dir, 0755), 0);
    const char *db = variant == 1 ? "meta" : 0;
    const char *key = variant == 2 ? "meta" : "hello";
    raw_put(dir, db, key, strlen(key), "world", 5);
    uint8_t before[16], after[16];
    size_t before_bytes = raw_get(dir, db, key, strlen(key), before, 16);
    char data[PATH_MAX];
    join(data, dir, "data.mdb");
    uint64_t data_hash = file_hash(data);
    const char *err = open_fails(dir, &o, SL_ESTORE);
    cr_assert_eq(file_hash(data), data_hash, "data.mdb is unchanged");
    assert_contains(err, "not a sluice store");
    join(lock, dir, "lock");
    cr_assert_neq(access(lock, F_OK), 0, "the lock file was removed again");
    cr_assert_eq(raw_get(dir, db, key, strlen(key), after, 16), before_bytes);
    cr_assert_eq(memcmp(before, after, before_bytes), 0);
  }
}

/* Meta "format" set to version, with a valid checksum. */
static void raw_put_format(const char *dir, uint32_t version) {
  uint8_t value[12] = {(uint8_t)version, (uint8_t)(version >> 8),
                       (uint8_t)(version >> 16), (uint8_t)(version >> 24)};
  uint64_t sum = format_checksum(1, "format", 6, value, 4);
  for (int i = 0; i < 8; i++)
    value[4 + i] = (uint8_t)(sum >> (8 * i));
  raw_put(dir, "meta", "format", 6, value, sizeof value);
}

/* Store.h note 4: only SL_STORE_FORMAT_VERSION is read; an older store
 * is refused with the way to upgrade it. */
Test(store, refuses_another_format) {
  cr_assert_eq(SL_STORE_FORMAT_VERSION, 3);
  sl_store_options o = writer_options(FINGERPRINT);
  sl_store_close(open_ok(root, &o));
  raw_put_format(root, 4);
  const char *err = open_fails(root, &o, SL_ESTORE);
  assert_contains(err, "format version 4 is newer");
  sl_store_options ro = {.read_only = 1};
  open_fails(root, &ro, SL_ESTORE);
  raw_put_format(root, 2); /* the format of one entry per change */
  err = open_fails(root, &o, SL_ESTORE);
  char expected[2 * PATH_MAX + 300];
  snprintf(expected, sizeof expected,
           "%s: store format 2 is older than this sluice's format 3; "
           "upgrade it with `sluice checkpoints --upgrade %s` (a savepoint "
           "taken with the older version is upgraded the same way)",
           root, root);
  cr_assert_str_eq(err, expected);
  open_fails(root, &ro, SL_ESTORE);
  raw_put_format(root, 1);
  assert_contains(open_fails(root, &o, SL_ESTORE),
                  "store format 1 is older than this sluice's format 3");
  raw_put_format(root, 3);
  sl_store_close(open_ok(root, &o));
}

Test(store, refuses_a_different_graph) {
  sl_store_options o = writer_options("graph-A: source, map, sink");
  sl_store_close(open_ok(root, &o));
  o.graph_fingerprint = "graph-B: source, sink";
  const char *err = open_fails(root, &o, SL_ESTORE);
  assert_contains(err, "graph-A: source, map, sink");
  assert_contains(err, "graph-B: source, sink");
  o.read_only = 1; /* read-only checks it too, unless NULL */
  open_fails(root, &o, SL_ESTORE);
  o.graph_fingerprint = 0;
  sl_store_close(open_ok(root, &o));

  /* Long fingerprints are cut, the directory still named. */
  static char long_a[2000], long_b[2000];
  memset(long_a, 'a', sizeof long_a - 1);
  memset(long_b, 'b', sizeof long_b - 1);
  char dir[PATH_MAX];
  path_in_root(dir, "long");
  o = writer_options(long_a);
  sl_store_close(open_ok(dir, &o));
  o.graph_fingerprint = long_b;
  err = open_fails(dir, &o, SL_ESTORE);
  assert_contains(err, "aaaa...");
  assert_contains(err, "bbbb...");
}

/* write_big for a child process: no Criterion calls, 0 or a failure. */
static int child_write_big(sl_store *st, uint32_t count, uint64_t id) {
  for (int attempt = 0; attempt < 12; attempt++) {
    int rc = write_big_range(st, 0, count, id);
    if (rc != MDB_MAP_FULL)
      return rc;
    if ((rc = sl_store_grow(st)) != 0)
      return rc;
  }
  return MDB_MAP_FULL;
}

/* Compacts everything (the log is at least the base here), growing the
 * map as needed; for a child process: 0 or a failure. */
static int child_compact(sl_store *st) {
  for (int attempt = 0; attempt < 12; attempt++) {
    sl_store_compaction stats;
    int rc = sl_store_compact(st, 0, &stats);
    if (rc == 0)
      return stats.entries_written > 0 ? 0 : -1;
    if (rc != MDB_MAP_FULL || (rc = sl_store_grow(st)) != 0)
      return rc;
  }
  return MDB_MAP_FULL;
}

/* A child writer holds the store; this process is refused as a writer
 * but may read (store.h note 5), also after the writer grew the map and
 * compacted the log into the other base. */
Test(store, one_writer_many_readers) {
  sl_store_options o = writer_options(FINGERPRINT);
  o.initial_map_bytes = 1u << 20; /* so the child's big write grows it */
  model m;
  model_init(&m, 300);
  int ready[2], release[2];
  cr_assert_eq(pipe(ready), 0);
  cr_assert_eq(pipe(release), 0);
  pid_t child = fork();
  cr_assert_geq(child, 0);
  if (child == 0) {
    sl_store *st;
    char err[ERR_BYTES], byte = 0;
    if (sl_store_open(root, &o, &st, err, sizeof err) != 0)
      _exit(2);
    sl_store_txn *txn;
    if (sl_store_begin(st, &txn) != 0 || write_changes(txn, &m, 1) != 0 ||
        sl_store_commit(txn, 1, "r", 1) != 0)
      _exit(3);
    if (write(ready[1], "r", 1) != 1 || read(release[0], &byte, 1) != 1)
      _exit(4);
    if (child_write_big(st, 3000, 2) != 0) /* 3 MB: past a 1 MiB map */
      _exit(5);
    if (child_compact(st) != 0) /* into state2, the log emptied */
      _exit(7);
    if (write(ready[1], "g", 1) != 1 || read(release[0], &byte, 1) != 1)
      _exit(6);
    sl_store_close(st);
    _exit(0);
  }
  char byte = 0;
  cr_assert_eq(read(ready[0], &byte, 1), 1, "the child opened the store");
  for (uint32_t i = 0; i < m.count; i++) /* the child's checkpoint 1 */
    m.version[i] = mix64((uint64_t)1 << 32 | i) % 4 < 2 ? 1 : 0;
  assert_contains(open_fails(root, &o, SL_ESTORE), "in use by another process");
  sl_store_options ro = {.read_only = 1};
  sl_store *reader = open_ok(root, &ro);
  cr_assert_eq(sl_store_latest(reader), 1);
  check_all_ranges(reader, &m);
  sl_store_txn *txn;
  cr_assert_eq(sl_store_begin(reader, &txn), EACCES);
  cr_assert_eq(sl_store_wipe(reader), EACCES);
  cr_assert_eq(sl_store_grow(reader), EACCES);
  /* A second handle in this process is refused, reader or writer. */
  assert_contains(open_fails(root, &ro, SL_ESTORE), "already open");

  /* The child grows the map and writes past this reader's map. */
  uint64_t reader_map_bytes = sl_store_map_bytes(reader);
  cr_assert_eq(write(release[1], "w", 1), 1);
  cr_assert_eq(read(ready[0], &byte, 1), 1, "the child wrote checkpoint 2");
  check_all_ranges(reader, &m); /* checkpoint 1's state, now in state2 */
  uint32_t counts[2] = {0, 0};
  cr_assert_eq(sl_store_read_state(reader, 7, 0, UINT16_MAX, count_big,
                                   counts),
               0, "%s", sl_store_error(reader));
  cr_assert_eq(counts[0], 3000);
  cr_assert_eq(counts[1], 0);
  cr_assert_gt(sl_store_map_bytes(reader), reader_map_bytes);
  uint64_t *ids;
  size_t n;
  cr_assert_eq(sl_store_list_checkpoints(reader, &ids, &n), 0);
  cr_assert_eq(n, 2);
  free(ids);
  sl_store_close(reader);

  cr_assert_eq(write(release[1], "x", 1), 1);
  int status = 0;
  cr_assert_eq(waitpid(child, &status, 0), child);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: %d",
            status);
  sl_store *writer = open_ok(root, &o); /* free again */
  cr_assert_eq(sl_store_latest(writer), 2);
  assert_contains(open_fails(root, &o, SL_ESTORE), "already open");
  sl_store_close(writer);
  free(m.version);
}

Test(store, read_only_needs_a_store) {
  char dir[PATH_MAX];
  path_in_root(dir, "missing");
  sl_store_options ro = {.read_only = 1};
  open_fails(dir, &ro, ENOENT);
  open_fails(root, &ro, ENOENT); /* empty */
  cr_assert_eq(access(dir, F_OK), -1, "nothing was created");
  sl_store *s = (sl_store *)1;
  cr_assert_eq(sl_store_open(root, &(sl_store_options){0}, &s, 0, 0), EINVAL);
  cr_assert_null(s);
}

/* Checkpoint 1 of m, then checkpoint 2 (seq 2): op 9, key group 0x0102,
 * key ab cd -> "value", and the blob of (3, 2). */
static void write_op9(sl_store *st, model *m) {
  write_checkpoint(st, m, 1);
  sl_store_txn *txn;
  cr_assert_eq(sl_store_begin(st, &txn), 0);
  cr_assert_eq(sl_store_put_state(txn, 9, 0x0102, "\xab\xcd", 2, "value", 5),
               0);
  cr_assert_eq(sl_store_put_blob(txn, 3, 2, "blob bytes", 10), 0);
  cr_assert_eq(sl_store_commit(txn, 2, "record", 6), 0);
}

/* The log key of write_op9's chunk (store.h note 1): seq 2, run 0, op 9,
 * last key group 0x0102, chunk 0; and the base key of that chunk after a
 * compaction, the third chunk (after those of ops 1 and 2). */
static const char op9_log_key[] = "\0\0\0\0\0\0\0\x02\0\0\0\0\x00\x09\x01\x02"
                                  "\0\0\0\0";
#define OP9_LOG_KEY_BYTES 20u
static const char op9_base_key[] = "\x00\x09\x01\x02\0\0\0\x02";
/* The first byte of the chunk's one value: after the chunk's head (12
 * bytes), the put's head (9) and the key (2). */
#define OP9_VALUE_AT (12u + 9u + 2u)

/* A flipped byte in a stored value is SL_ECORRUPT naming db and key: in
 * the log, and in a base after a compaction. */
Test(store, detects_corruption) {
  sl_store_options o = writer_options(FINGERPRINT);
  model m;
  model_init(&m, 50);
  sl_store *st = open_ok(root, &o);
  write_op9(st, &m);
  sl_store_close(st);

  raw_corrupt(root, "log", op9_log_key, OP9_LOG_KEY_BYTES, OP9_VALUE_AT);
  raw_corrupt(root, "blobs", "\x00\x03\x00\x02", 4, 9);
  raw_corrupt(root, "checkpoints", "\0\0\0\0\0\0\0\x02", 8, 0);
  st = open_ok(root, &o);
  cr_assert_eq(sl_store_read_state(st, 9, 0, UINT16_MAX, seen_entry, 0),
               SL_ECORRUPT);
  const char *err = sl_store_error(st);
  assert_contains(err, "database log");
  assert_contains(err, "seq 2 run 0 chunk 0 of op 9 up to key group 258");
  assert_contains(err, root);
  check_all_ranges(st, &m); /* other operators still read */
  sl_store_compaction stats = {.entries_written = 1};
  cr_assert_eq(sl_store_compact(st, 0, &stats), SL_ECORRUPT);
  assert_contains(sl_store_error(st),
                  "seq 2 run 0 chunk 0 of op 9 up to key group 258");
  cr_assert_eq(stats.entries_written, 0, "stats are zeroed");
  check_all_ranges(st, &m); /* the failed compaction changed nothing */
  void *data = (void *)1;
  uint32_t bytes;
  cr_assert_eq(sl_store_get_blob(st, 3, 2, &data, &bytes), SL_ECORRUPT);
  cr_assert_null(data);
  assert_contains(sl_store_error(st), "database blobs, op 3 instance 2");
  cr_assert_eq(sl_store_get_checkpoint(st, 2, &data, &bytes), SL_ECORRUPT);
  assert_contains(sl_store_error(st), "checkpoint 2");
  sl_store_close(st);

  /* Corrupt meta refuses the open. */
  raw_corrupt(root, "meta", "latest", 6, 0);
  assert_contains(open_fails(root, &o, SL_ECORRUPT), "\"latest\"");

  /* A base value, after a compaction into state2. */
  char dir[PATH_MAX];
  path_in_root(dir, "compacted");
  memset(m.version, 0, m.count * sizeof *m.version);
  st = open_ok(dir, &o);
  write_op9(st, &m);
  cr_assert_eq(sl_store_compact(st, 0, &stats), 0, "%s", sl_store_error(st));
  cr_assert_gt(stats.entries_written, 0);
  sl_store_close(st);
  raw_corrupt(dir, "state2", op9_base_key, 8, OP9_VALUE_AT);
  st = open_ok(dir, &o);
  cr_assert_eq(sl_store_read_state(st, 9, 0, UINT16_MAX, seen_entry, 0),
               SL_ECORRUPT);
  err = sl_store_error(st);
  assert_contains(err, "database state2, chunk 2 of op 9 up to key group 258");
  assert_contains(err, "fails its checksum");
  check_all_ranges(st, &m);
  sl_store_close(st);
  free(m.version);
}

/* Collects what read_state returns into a text "key=value;..." */
static int text_entry(void *arg, uint16_t key_group, const void *key,
                      uint32_t key_bytes, const void *value,
                      uint32_t value_bytes) {
  char *text = arg;
  size_t at = strlen(text);
  snprintf(text + at, 256 - at, "%u:%.*s=%.*s;", key_group, (int)key_bytes,
           (const char *)key, (int)value_bytes, (const char *)value);
  return 0;
}

/* A chunk built raw as store.h note 1 says: op, entries of (group, kind,
 * key, value) in order; returns its bytes in out. */
typedef struct raw_entry {
  uint16_t group;
  uint8_t kind;
  const char *key;
  const char *value;
} raw_entry;

static size_t raw_chunk(uint8_t *out, uint16_t op, const raw_entry *e,
                        uint32_t count) {
  size_t at = 12;
  for (uint32_t i = 0; i < count; i++) {
    size_t kb = strlen(e[i].key), vb = strlen(e[i].value);
    out[at] = (uint8_t)e[i].group, out[at + 1] = (uint8_t)(e[i].group >> 8);
    out[at + 2] = e[i].kind;
    out[at + 3] = (uint8_t)kb, out[at + 4] = 0;
    at += 5;
    if (e[i].kind != 2) {
      out[at] = (uint8_t)vb, out[at + 1] = out[at + 2] = out[at + 3] = 0;
      at += 4;
    }
    memcpy(out + at, e[i].key, kb);
    at += kb;
    if (e[i].kind != 2) {
      memcpy(out + at, e[i].value, vb);
      at += vb;
    }
  }
  uint16_t head[4] = {op, e[0].group, e[count - 1].group, 0};
  for (int i = 0; i < 4; i++)
    out[2 * i] = (uint8_t)head[i], out[2 * i + 1] = (uint8_t)(head[i] >> 8);
  for (int i = 0; i < 4; i++)
    out[8 + i] = (uint8_t)(count >> (8 * i));
  return at;
}

/* A log chunk written raw (seed 5, key: seq, run, op, last group,
 * ordinal). */
static void raw_put_log(const char *dir, uint64_t seq, uint32_t run,
                        uint16_t op, const raw_entry *e, uint32_t count) {
  uint8_t k[20], v[512];
  for (int i = 0; i < 8; i++)
    k[i] = (uint8_t)(seq >> (56 - 8 * i));
  for (int i = 0; i < 4; i++)
    k[8 + i] = (uint8_t)(run >> (24 - 8 * i)), k[16 + i] = 0;
  uint16_t last = e[count - 1].group;
  k[12] = (uint8_t)(op >> 8), k[13] = (uint8_t)op;
  k[14] = (uint8_t)(last >> 8), k[15] = (uint8_t)last;
  size_t bytes = raw_chunk(v, op, e, count);
  uint64_t sum = format_checksum(5, k, sizeof k, v, bytes);
  for (int i = 0; i < 8; i++)
    v[bytes + i] = (uint8_t)(sum >> (8 * i));
  raw_put(dir, "log", k, sizeof k, v, bytes + 8);
}

/* The log's layout is the one store.h note 1 documents: a chunk written
 * raw as a newer run is read, its puts and tombstones winning over the
 * older run's; a kind that is neither is corruption, and a seq not below
 * "next_seq" refuses the open. */
Test(store, log_format_as_documented) {
  sl_store_options o = writer_options(FINGERPRINT);
  sl_store *st = open_ok(root, &o);
  sl_store_txn *txn;
  cr_assert_eq(sl_store_begin(st, &txn), 0);
  cr_assert_eq(sl_store_put_state(txn, 9, 3, "aa", 2, "one", 3), 0);
  cr_assert_eq(sl_store_put_state(txn, 9, 3, "bb", 2, "two", 3), 0);
  cr_assert_eq(sl_store_commit(txn, 1, 0, 0), 0);
  sl_store_close(st);
  /* Seq 1 is the only transaction so far: "next_seq" is 2. */
  cr_assert_eq(raw_meta_u64(root, "next_seq"), 2);
  const raw_entry newer[] = {{3, 2, "aa", ""}, {4, 1, "cc", "raw"}};
  raw_put_log(root, 1, 1, 9, newer, 2); /* run 1 of seq 1 */
  static char text[256];
  st = open_ok(root, &o);
  cr_assert_eq(sl_store_read_state(st, 9, 0, UINT16_MAX, text_entry, text),
               0, "%s", sl_store_error(st));
  cr_assert_str_eq(text, "3:bb=two;4:cc=raw;");
  sl_store_close(st);

  const raw_entry bad[] = {{5, 7, "dd", "x"}};
  raw_put_log(root, 1, 2, 9, bad, 1);
  st = open_ok(root, &o);
  text[0] = 0;
  cr_assert_eq(sl_store_read_state(st, 9, 0, UINT16_MAX, text_entry, text),
               SL_ECORRUPT);
  assert_contains(sl_store_error(st), "neither a put nor a tombstone");
  assert_contains(sl_store_error(st), "seq 1 run 2 chunk 0 of op 9");
  sl_store_close(st);

  const raw_entry later[] = {{5, 1, "dd", "x"}};
  raw_put_log(root, 2, 0, 9, later, 1);
  assert_contains(open_fails(root, &o, SL_ECORRUPT),
                  "seq not below meta \"next_seq\"");
}

Test(store, wipe_starts_fresh) {
  sl_store_options o = writer_options(FINGERPRINT);
  model m;
  sl_store *st = first_checkpoint(&m, 400);
  sl_store_compaction stats;
  cr_assert_eq(sl_store_compact(st, 0, &stats), 0); /* a base in state2 */
  cr_assert_gt(stats.entries_written, 0);
  write_checkpoint(st, &m, 2); /* and a log */
  cr_assert_eq(sl_store_wipe(st), 0, "%s", sl_store_error(st));
  memset(m.version, 0, m.count * sizeof *m.version);
  cr_assert_eq(sl_store_latest(st), 0);
  check_all_ranges(st, &m);
  check_list(st, 0, 0);
  void *data;
  uint32_t bytes;
  cr_assert_eq(sl_store_get_blob(st, 1, 0, &data, &bytes), SL_ENOTFOUND);
  sl_store_close(st);
  static const char *const emptied[] = {"log", "state", "state2", "blobs",
                                        "checkpoints"};
  for (size_t i = 0; i < sizeof emptied / sizeof *emptied; i++)
    cr_assert_eq(raw_count(root, emptied[i]), 0, "%s", emptied[i]);
  cr_assert_eq(raw_meta_u64(root, "base"), 0);
  cr_assert_eq(raw_meta_u64(root, "next_seq"), 3, "seqs only grow");
  st = open_ok(root, &o);
  cr_assert_eq(sl_store_latest(st), 0);
  check_all_ranges(st, &m);
  write_checkpoint(st, &m, 1); /* ids start over */
  check_all_ranges(st, &m);
  sl_store_close(st);
  free(m.version);
}

/* A process killed inside checkpoint 2's transaction leaves checkpoint 1
 * whole (store.h note 2). */
Test(store, crash_inside_a_transaction) {
  sl_store_options o = writer_options(FINGERPRINT);
  model m;
  model_init(&m, 20000);
  pid_t child = fork();
  cr_assert_geq(child, 0);
  if (child == 0) {
    sl_store *st;
    char err[ERR_BYTES];
    sl_store_txn *txn;
    if (sl_store_open(root, &o, &st, err, sizeof err) != 0)
      _exit(2);
    if (sl_store_begin(st, &txn) != 0 || write_changes(txn, &m, 1) != 0 ||
        sl_store_commit(txn, 1, "r", 1) != 0)
      _exit(3);
    if (sl_store_begin(st, &txn) != 0 || write_changes(txn, &m, 2) != 0 ||
        write_changes(txn, &m, 3) != 0 ||
        sl_store_put_blob(txn, 1, 0, "lost", 4) != 0)
      _exit(4);
    raise(SIGKILL); /* with the write transaction open */
    _exit(5);
  }
  int status = 0;
  cr_assert_eq(waitpid(child, &status, 0), child);
  cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
            "the child died by SIGKILL, not status %d", status);
  for (uint32_t i = 0; i < m.count; i++) /* checkpoint 1, as the child */
    m.version[i] = mix64((uint64_t)1 << 32 | i) % 4 < 2 ? 1 : 0;
  sl_store *st = open_ok(root, &o);
  cr_assert_eq(sl_store_latest(st), 1);
  check_all_ranges(st, &m);
  check_list(st, (const uint64_t[]){1}, 1);
  write_checkpoint(st, &m, 2); /* and the store goes on */
  check_all_ranges(st, &m);
  sl_store_close(st);
  free(m.version);
}

