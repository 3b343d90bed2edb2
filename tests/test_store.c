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
 */
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
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

#define FINGERPRINT "graph v1: 1 source(1) 2 keyed(4) 3 sink(1)"
#define ERR_BYTES 1024

/* ------------------------------------------------------------ fixture */

static char root[PATH_MAX]; /* this test's temporary directory */

static void make_root(void) {
  snprintf(root, sizeof root, "/tmp/sluice-store-test-XXXXXX");
  cr_assert_not_null(mkdtemp(root), "mkdtemp: %s", strerror(errno));
}

static int remove_one(const char *path, const struct stat *st, int flag,
                      struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

static void remove_root(void) {
  if (root[0])
    nftw(root, remove_one, 16, FTW_DEPTH | FTW_PHYS);
  root[0] = 0;
}

TestSuite(store, .init = make_root, .fini = remove_root, .timeout = 60);

/* dir/name into out (PATH_MAX bytes). */
static void join(char *out, const char *dir, const char *name) {
  int n = snprintf(out, PATH_MAX, "%s/%s", dir, name);
  cr_assert(n > 0 && n < PATH_MAX, "path too long");
}

static void path_in_root(char *out, const char *name) { join(out, root, name); }

/* ------------------------------------------------------------ helpers */

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static sl_store_options writer_options(const char *fingerprint) {
  return (sl_store_options){.graph_fingerprint = fingerprint};
}

static sl_store *open_ok(const char *dir, const sl_store_options *o) {
  sl_store *s = 0;
  char err[ERR_BYTES];
  int rc = sl_store_open(dir, o, &s, err, sizeof err);
  cr_assert_eq(rc, 0, "open %s: %s: %s", dir, sl_strerror(rc), err);
  cr_assert_not_null(s);
  return s;
}

/* Opens expecting failure rc; returns the message. */
static const char *open_fails(const char *dir, const sl_store_options *o,
                              int expected) {
  static char err[ERR_BYTES];
  sl_store *s = (sl_store *)1;
  int rc = sl_store_open(dir, o, &s, err, sizeof err);
  cr_assert_eq(rc, expected, "open %s: got %d (%s), not %d: %s", dir, rc,
               sl_strerror(rc), expected, err);
  cr_assert_null(s, "a failed open leaves *store NULL");
  cr_assert(strstr(err, dir) != 0, "message names the directory: %s", err);
  return err;
}

static void assert_contains(const char *text, const char *part) {
  cr_assert(strstr(text, part) != 0, "\"%s\" lacks \"%s\"", text, part);
}

/* ------------------------------------------------------------ model */

/* Entry i: operator 1 or 2, one of 32 key groups, key "key-%05u". */
#define GROUPS 32u
static uint16_t op_of(uint32_t i) { return (uint16_t)(1 + i % 2); }
static uint16_t group_of(uint32_t i) { return (uint16_t)(i * 7 % GROUPS); }
static uint32_t key_of(uint32_t i, char *key) {
  return (uint32_t)snprintf(key, 16, "key-%05u", i);
}

/* Value of entry i as written by checkpoint version: 0..119 bytes. */
static uint32_t value_of(uint32_t i, uint32_t version, uint8_t *value) {
  uint64_t seed = mix64((uint64_t)i << 20 | version);
  uint32_t bytes = (uint32_t)(seed % 120);
  for (uint32_t j = 0; j < bytes; j++)
    value[j] = (uint8_t)(seed >> (j % 8 * 8)) ^ (uint8_t)j;
  return bytes;
}

typedef struct model {
  uint32_t count;
  uint32_t *version; /* 0: absent */
} model;

/* What one read_state pass saw, checked against the model afterwards. */
typedef struct seen {
  const model *m;
  uint16_t op;
  uint32_t entries;
  uint32_t wrong;  /* entries whose key or value the model disagrees with */
  uint32_t order;  /* entries not after their predecessor */
  uint32_t last_group, last_index;
} seen;

static int seen_entry(void *arg, uint16_t key_group, const void *key,
                      uint32_t key_bytes, const void *value,
                      uint32_t value_bytes) {
  seen *s = arg;
  char text[16] = {0};
  unsigned index = 0;
  memcpy(text, key, key_bytes < 15 ? key_bytes : 15);
  uint8_t expected[128];
  bool parsed = key_bytes == 9 && sscanf(text, "key-%5u", &index) == 1 &&
                index < s->m->count;
  if (!parsed || op_of(index) != s->op || group_of(index) != key_group ||
      s->m->version[index] == 0 ||
      value_of(index, s->m->version[index], expected) != value_bytes ||
      memcmp(expected, value, value_bytes) != 0)
    s->wrong++;
  if (s->entries > 0 &&
      (key_group < s->last_group ||
       (key_group == s->last_group && index <= s->last_index)))
    s->order++;
  s->last_group = key_group;
  s->last_index = index;
  s->entries++;
  return 0;
}

/* read_state(op, [first, last]) must return exactly the model's entries. */
static void check_range(sl_store *st, const model *m, uint16_t op,
                        uint16_t first, uint16_t last) {
  seen s = {.m = m, .op = op};
  int rc = sl_store_read_state(st, op, first, last, seen_entry, &s);
  cr_assert_eq(rc, 0, "read_state: %s", sl_store_error(st));
  uint32_t expected = 0;
  for (uint32_t i = 0; i < m->count; i++)
    expected += m->version[i] != 0 && op_of(i) == op &&
                group_of(i) >= first && group_of(i) <= last;
  cr_assert_eq(s.wrong, 0, "op %u [%u, %u]: %u wrong entries", op, first,
               last, s.wrong);
  cr_assert_eq(s.order, 0, "op %u: %u entries out of order", op, s.order);
  cr_assert_eq(s.entries, expected, "op %u [%u, %u]: %u entries, not %u", op,
               first, last, s.entries, expected);
}

static void check_all_ranges(sl_store *st, const model *m) {
  for (uint16_t op = 0; op <= 3; op++) {
    check_range(st, m, op, 0, UINT16_MAX);
    check_range(st, m, op, 0, 0);
    check_range(st, m, op, 3, 9);
    check_range(st, m, op, GROUPS - 1, GROUPS - 1);
  }
}

/* Checkpoint version's changes: entry i is put (half), deleted (a
 * quarter) or left alone, by a hash of (i, version). */
static int write_changes(sl_store_txn *txn, model *m, uint32_t version) {
  uint8_t value[128];
  char key[16];
  for (uint32_t i = 0; i < m->count; i++) {
    uint64_t action = mix64((uint64_t)version << 32 | i) % 4;
    uint32_t key_bytes = key_of(i, key);
    int rc = 0;
    if (action < 2) {
      uint32_t bytes = value_of(i, version, value);
      rc = sl_store_put_state(txn, op_of(i), group_of(i), key, key_bytes,
                              value, bytes);
      m->version[i] = version;
    } else if (action == 2) {
      rc = sl_store_delete_state(txn, op_of(i), group_of(i), key, key_bytes);
      m->version[i] = 0;
    }
    if (rc != 0)
      return rc;
  }
  return 0;
}

static void model_init(model *m, uint32_t count) {
  m->count = count;
  m->version = calloc(count, sizeof *m->version);
  cr_assert_not_null(m->version);
}

static void blob_text(char *out, uint16_t op, uint16_t instance,
                      uint32_t version) {
  snprintf(out, 64, "blob of op %u instance %u at checkpoint %u", op,
           instance, version);
}

static void record_text(char *out, uint64_t id) {
  snprintf(out, 64, "record of checkpoint %llu", (unsigned long long)id);
}

/* One checkpoint: the model's changes, the blob of (1, 0) and, in
 * checkpoint 1 only, of (1, 1); then commit with record_text. */
static void write_checkpoint(sl_store *st, model *m, uint32_t version) {
  sl_store_txn *txn;
  cr_assert_eq(sl_store_begin(st, &txn), 0, "%s", sl_store_error(st));
  cr_assert_eq(write_changes(txn, m, version), 0, "%s", sl_store_error(st));
  char text[64];
  for (uint16_t instance = 0; instance < (version == 1 ? 2 : 1); instance++) {
    blob_text(text, 1, instance, version);
    cr_assert_eq(sl_store_put_blob(txn, 1, instance, text,
                                   (uint32_t)strlen(text)),
                 0);
  }
  record_text(text, version);
  int rc = sl_store_commit(txn, version, text, (uint32_t)strlen(text));
  cr_assert_eq(rc, 0, "commit %u: %s", version, sl_store_error(st));
  cr_assert_eq(sl_store_latest(st), version);
}

static void check_blob(sl_store *st, uint16_t op, uint16_t instance,
                       uint32_t version) {
  char expected[64];
  blob_text(expected, op, instance, version);
  void *data;
  uint32_t bytes;
  int rc = sl_store_get_blob(st, op, instance, &data, &bytes);
  cr_assert_eq(rc, 0, "get_blob: %s", sl_store_error(st));
  cr_assert_eq(bytes, strlen(expected));
  cr_assert_eq(memcmp(data, expected, bytes), 0);
  free(data);
}

static void check_record(sl_store *st, uint64_t id) {
  char expected[64];
  record_text(expected, id);
  void *data;
  uint32_t bytes;
  int rc = sl_store_get_checkpoint(st, id, &data, &bytes);
  cr_assert_eq(rc, 0, "get_checkpoint: %s", sl_store_error(st));
  cr_assert_eq(bytes, strlen(expected));
  cr_assert_eq(memcmp(data, expected, bytes), 0);
  free(data);
}

static void check_list(sl_store *st, const uint64_t *expected, size_t count) {
  uint64_t *ids;
  size_t n;
  cr_assert_eq(sl_store_list_checkpoints(st, &ids, &n), 0);
  cr_assert_not_null(ids);
  cr_assert_eq(n, count, "%zu checkpoints listed, not %zu", n, count);
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(ids[i], expected[i]);
  free(ids);
}

/* ------------------------------------------------------------ raw LMDB */

/* The store's checksum (store.h note 1), written independently. */
static uint64_t format_checksum(unsigned db, const void *key, size_t key_bytes,
                                const void *payload, size_t payload_bytes) {
  return XXH3_64bits_withSeed(payload, payload_bytes,
                              XXH3_64bits_withSeed(key, key_bytes, db));
}

static MDB_env *raw_open(const char *dir) {
  MDB_env *env;
  cr_assert_eq(mdb_env_create(&env), 0);
  cr_assert_eq(mdb_env_set_maxdbs(env, 8), 0);
  int rc = mdb_env_open(env, dir, 0, 0644);
  cr_assert_eq(rc, 0, "raw open: %s", mdb_strerror(rc));
  return env;
}

/* Reads db/key raw (value with its checksum) into out; returns bytes. */
static size_t raw_get(const char *dir, const char *db, const void *key,
                      size_t key_bytes, uint8_t *out, size_t out_bytes) {
  MDB_env *env = raw_open(dir);
  MDB_txn *txn;
  MDB_dbi dbi;
  cr_assert_eq(mdb_txn_begin(env, 0, MDB_RDONLY, &txn), 0);
  cr_assert_eq(mdb_dbi_open(txn, db, 0, &dbi), 0);
  MDB_val k = {key_bytes, (void *)key}, v;
  cr_assert_eq(mdb_get(txn, dbi, &k, &v), 0, "raw get in %s", db);
  cr_assert_leq(v.mv_size, out_bytes);
  memcpy(out, v.mv_data, v.mv_size);
  mdb_txn_abort(txn);
  mdb_env_close(env);
  return v.mv_size;
}

static void raw_put(const char *dir, const char *db, const void *key,
                    size_t key_bytes, const void *value, size_t value_bytes) {
  MDB_env *env = raw_open(dir);
  MDB_txn *txn;
  MDB_dbi dbi;
  cr_assert_eq(mdb_txn_begin(env, 0, 0, &txn), 0);
  cr_assert_eq(mdb_dbi_open(txn, db, db ? MDB_CREATE : 0, &dbi), 0);
  MDB_val k = {key_bytes, (void *)key}, v = {value_bytes, (void *)value};
  cr_assert_eq(mdb_put(txn, dbi, &k, &v, 0), 0);
  cr_assert_eq(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
}

/* The entries of database db (0 if it does not exist). */
static size_t raw_count(const char *dir, const char *db) {
  MDB_env *env = raw_open(dir);
  MDB_txn *txn;
  MDB_dbi dbi;
  MDB_stat st = {0};
  cr_assert_eq(mdb_txn_begin(env, 0, MDB_RDONLY, &txn), 0);
  if (mdb_dbi_open(txn, db, 0, &dbi) == 0)
    cr_assert_eq(mdb_stat(txn, dbi, &st), 0);
  mdb_txn_abort(txn);
  mdb_env_close(env);
  return st.ms_entries;
}

/* A u64 of meta (little-endian, ahead of its checksum). */
static uint64_t raw_meta_u64(const char *dir, const char *name) {
  uint8_t value[64];
  size_t bytes = raw_get(dir, "meta", name, strlen(name), value, sizeof value);
  cr_assert_eq(bytes, 8 + SL_STORE_CHECKSUM_BYTES);
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = v << 8 | value[i];
  return v;
}

/* Flips one payload byte of db/key, leaving the checksum as it was. */
static void raw_corrupt(const char *dir, const char *db, const void *key,
                        size_t key_bytes, size_t at) {
  uint8_t value[4096];
  size_t bytes = raw_get(dir, db, key, key_bytes, value, sizeof value);
  cr_assert_lt(at, bytes - SL_STORE_CHECKSUM_BYTES);
  value[at] ^= 0x20;
  raw_put(dir, db, key, key_bytes, value, bytes);
}

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
  sl_store_options o = writer_options(FINGERPRINT);
  model m;
  model_init(&m, 100);
  sl_store *st = open_ok(root, &o); /* the empty root itself */
  write_checkpoint(st, &m, 1);
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
 * transaction stays failed until it is ended (store.c note 4). */
Test(store, commit_and_abort_rules) {
  sl_store_options o = writer_options(FINGERPRINT);
  model m;
  model_init(&m, 500);
  sl_store *st = open_ok(root, &o);
  write_checkpoint(st, &m, 1);
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
#define BIG_VALUE_BYTES 1000u
static void big_value(uint32_t i, uint8_t *value) {
  for (uint32_t j = 0; j < BIG_VALUE_BYTES; j++)
    value[j] = (uint8_t)(i * 31 + j);
}

static int write_big(sl_store *st, uint32_t count, uint64_t id, int *grows) {
  static uint8_t value[BIG_VALUE_BYTES];
  for (int attempt = 0; attempt < 12; attempt++) { /* 2^12 x the map */
    sl_store_txn *txn;
    int rc = sl_store_begin(st, &txn);
    char key[16];
    for (uint32_t i = 0; i < count && rc == 0; i++) {
      big_value(i, value);
      uint32_t key_bytes = (uint32_t)snprintf(key, sizeof key, "big-%06u", i);
      rc = sl_store_put_state(txn, 7, (uint16_t)(i % 64), key, key_bytes,
                              value, BIG_VALUE_BYTES);
    }
    if (rc == 0)
      rc = sl_store_commit(txn, id, "big", 3);
    else
      sl_store_abort(txn);
    if (rc != MDB_MAP_FULL)
      return rc;
    assert_contains(sl_store_error(st), "is full");
    cr_assert_eq(sl_store_grow(st), 0, "%s", sl_store_error(st));
    ++*grows;
  }
  return MDB_MAP_FULL;
}

static int count_big(void *arg, uint16_t key_group, const void *key,
                     uint32_t key_bytes, const void *value,
                     uint32_t value_bytes) {
  uint32_t *counts = arg; /* [0] entries, [1] wrong */
  static uint8_t expected[BIG_VALUE_BYTES];
  char text[16] = {0};
  unsigned i = 0;
  memcpy(text, key, key_bytes < 15 ? key_bytes : 15);
  if (sscanf(text, "big-%6u", &i) != 1 || i % 64 != key_group ||
      value_bytes != BIG_VALUE_BYTES)
    counts[1]++;
  big_value(i, expected);
  if (memcmp(expected, value, BIG_VALUE_BYTES) != 0)
    counts[1]++;
  counts[0]++;
  return 0;
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

/* Store.h note 4: only SL_STORE_FORMAT_VERSION is read. */
Test(store, refuses_another_format) {
  cr_assert_eq(SL_STORE_FORMAT_VERSION, 2);
  sl_store_options o = writer_options(FINGERPRINT);
  sl_store_close(open_ok(root, &o));
  raw_put_format(root, 3);
  const char *err = open_fails(root, &o, SL_ESTORE);
  assert_contains(err, "format version 3 is newer");
  sl_store_options ro = {.read_only = 1};
  open_fails(root, &ro, SL_ESTORE);
  raw_put_format(root, 1); /* the format before the log */
  err = open_fails(root, &o, SL_ESTORE);
  assert_contains(err, "format version 1 is older");
  open_fails(root, &ro, SL_ESTORE);
  raw_put_format(root, 2);
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
  static uint8_t value[BIG_VALUE_BYTES];
  for (int attempt = 0; attempt < 12; attempt++) {
    sl_store_txn *txn;
    int rc = sl_store_begin(st, &txn);
    char key[16];
    for (uint32_t i = 0; i < count && rc == 0; i++) {
      big_value(i, value);
      uint32_t key_bytes = (uint32_t)snprintf(key, sizeof key, "big-%06u", i);
      rc = sl_store_put_state(txn, 7, (uint16_t)(i % 64), key, key_bytes,
                              value, BIG_VALUE_BYTES);
    }
    rc = rc == 0 ? sl_store_commit(txn, id, "big", 3)
                 : (sl_store_abort(txn), rc);
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

/* The log key of write_op9's entry: seq 2, op 9, group 0x0102, ab cd. */
static const char op9_log_key[] = "\0\0\0\0\0\0\0\x02\x00\x09\x01\x02\xab\xcd";
#define OP9_LOG_KEY_BYTES 14u

/* A flipped byte in a stored value is SL_ECORRUPT naming db and key: in
 * the log, and in a base after a compaction. */
Test(store, detects_corruption) {
  sl_store_options o = writer_options(FINGERPRINT);
  model m;
  model_init(&m, 50);
  sl_store *st = open_ok(root, &o);
  write_op9(st, &m);
  sl_store_close(st);

  /* Byte 1 of a log value is the first of the value, after the kind. */
  raw_corrupt(root, "log", op9_log_key, OP9_LOG_KEY_BYTES, 1);
  raw_corrupt(root, "blobs", "\x00\x03\x00\x02", 4, 9);
  raw_corrupt(root, "checkpoints", "\0\0\0\0\0\0\0\x02", 8, 0);
  st = open_ok(root, &o);
  cr_assert_eq(sl_store_read_state(st, 9, 0, UINT16_MAX, seen_entry, 0),
               SL_ECORRUPT);
  const char *err = sl_store_error(st);
  assert_contains(err, "database log");
  assert_contains(err, "seq 2 op 9 key group 258 key abcd");
  assert_contains(err, root);
  check_all_ranges(st, &m); /* other operators still read */
  sl_store_compaction stats = {.entries_written = 1};
  cr_assert_eq(sl_store_compact(st, 0, &stats), SL_ECORRUPT);
  assert_contains(sl_store_error(st), "seq 2 op 9 key group 258 key abcd");
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
  raw_corrupt(dir, "state2", op9_log_key + 8, OP9_LOG_KEY_BYTES - 8, 1);
  st = open_ok(dir, &o);
  cr_assert_eq(sl_store_read_state(st, 9, 0, UINT16_MAX, seen_entry, 0),
               SL_ECORRUPT);
  err = sl_store_error(st);
  assert_contains(err, "database state2, op 9 key group 258 key abcd");
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

/* A log entry written raw as store.h note 1 says (seed 5, kind byte). */
static void raw_put_log(const char *dir, uint64_t seq, uint16_t op,
                        uint16_t group, const char *key, uint8_t kind,
                        const char *value) {
  uint8_t k[64], v[64];
  size_t key_bytes = strlen(key), value_bytes = strlen(value);
  for (int i = 0; i < 8; i++)
    k[i] = (uint8_t)(seq >> (56 - 8 * i));
  k[8] = (uint8_t)(op >> 8), k[9] = (uint8_t)op;
  k[10] = (uint8_t)(group >> 8), k[11] = (uint8_t)group;
  memcpy(k + 12, key, key_bytes);
  v[0] = kind;
  memcpy(v + 1, value, value_bytes);
  uint64_t sum = format_checksum(5, k, 12 + key_bytes, v, 1 + value_bytes);
  for (int i = 0; i < 8; i++)
    v[1 + value_bytes + i] = (uint8_t)(sum >> (8 * i));
  raw_put(dir, "log", k, 12 + key_bytes, v, 1 + value_bytes + 8);
}

/* The log's layout is the one store.h note 1 documents: entries written
 * raw are read as puts and tombstones, a kind that is neither is
 * corruption, and a seq not below "next_seq" refuses the open. */
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
  raw_put_log(root, 1, 9, 4, "cc", 1, "raw");
  raw_put_log(root, 1, 9, 3, "aa", 2, ""); /* replaces the put of "aa" */
  static char text[256];
  st = open_ok(root, &o);
  cr_assert_eq(sl_store_read_state(st, 9, 0, UINT16_MAX, text_entry, text),
               0, "%s", sl_store_error(st));
  cr_assert_str_eq(text, "3:bb=two;4:cc=raw;");
  sl_store_close(st);

  raw_put_log(root, 1, 9, 5, "dd", 7, "x");
  st = open_ok(root, &o);
  text[0] = 0;
  cr_assert_eq(sl_store_read_state(st, 9, 0, UINT16_MAX, text_entry, text),
               SL_ECORRUPT);
  assert_contains(sl_store_error(st), "neither a put nor a tombstone");
  sl_store_close(st);

  raw_put_log(root, 2, 9, 5, "dd", 1, "x");
  assert_contains(open_fails(root, &o, SL_ECORRUPT),
                  "seq not below meta \"next_seq\"");
}

Test(store, wipe_starts_fresh) {
  sl_store_options o = writer_options(FINGERPRINT);
  model m;
  model_init(&m, 400);
  sl_store *st = open_ok(root, &o);
  write_checkpoint(st, &m, 1);
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

/* ------------------------------------------------------------ compaction */

/* One change of a random transaction: entry index, and the version it
 * writes (0: a delete). */
typedef struct change {
  uint32_t index;
  uint32_t version;
} change;

/* Store order of the entries' keys (op, key group, key): the order the
 * engine writes in, so these puts take the append path. */
static int compare_changes(const void *a, const void *b) {
  const change *x = a, *y = b;
  char kx[16], ky[16];
  key_of(x->index, kx);
  key_of(y->index, ky);
  int order = op_of(x->index) != op_of(y->index)
                  ? op_of(x->index) - op_of(y->index)
              : group_of(x->index) != group_of(y->index)
                  ? (int)group_of(x->index) - (int)group_of(y->index)
                  : strcmp(kx, ky);
  if (order != 0)
    return order;
  /* Equal keys in a fixed order (the model applies the sorted list). */
  return x->version < y->version ? -1 : x->version > y->version;
}

/* What the store should hold beside the model: the log's entries (one per
 * distinct key a committed transaction changed) and the base's. */
typedef struct expected_counts {
  uint64_t log_entries;
  uint64_t base_entries;
} expected_counts;

static uint64_t live_entries(const model *m) {
  uint64_t live = 0;
  for (uint32_t i = 0; i < m->count; i++)
    live += m->version[i] != 0;
  return live;
}

/* Transaction t of the random test: up to 300 changes of random entries,
 * puts (versions t * 1000 + k) and deletes, some keys changed several
 * times; in store order (even t) or in random order (odd t).  Aborted if
 * abort_it; else committed as checkpoint t and applied to m and counts. */
static void random_transaction(sl_store *st, model *m, uint32_t t,
                               bool abort_it, expected_counts *counts) {
  static change changes[300];
  uint64_t seed = mix64(0x5eed0000ull + t);
  uint32_t count = (uint32_t)(seed % 300);
  for (uint32_t k = 0; k < count; k++) {
    uint64_t r = mix64(seed + k);
    changes[k].index = (uint32_t)(r % m->count);
    changes[k].version = (r >> 32) % 5 < 3 ? t * 1000 + k : 0;
  }
  if (t % 2 == 0)
    qsort(changes, count, sizeof *changes, compare_changes);
  sl_store_txn *txn;
  cr_assert_eq(sl_store_begin(st, &txn), 0, "%s", sl_store_error(st));
  uint8_t value[128];
  char key[16];
  for (uint32_t k = 0; k < count; k++) {
    const change *c = &changes[k];
    uint32_t key_bytes = key_of(c->index, key);
    int rc = c->version
                 ? sl_store_put_state(txn, op_of(c->index),
                                      group_of(c->index), key, key_bytes,
                                      value,
                                      value_of(c->index, c->version, value))
                 : sl_store_delete_state(txn, op_of(c->index),
                                         group_of(c->index), key, key_bytes);
    cr_assert_eq(rc, 0, "change %u of %u: %s", k, t, sl_store_error(st));
  }
  if (abort_it) {
    sl_store_abort(txn);
    return;
  }
  cr_assert_eq(sl_store_commit(txn, t, "r", 1), 0, "%s", sl_store_error(st));
  /* Apply in the order written: the last change of a key wins. */
  static bool touched[4096];
  cr_assert_leq(m->count, 4096);
  memset(touched, 0, sizeof touched);
  for (uint32_t k = 0; k < count; k++) {
    m->version[changes[k].index] = changes[k].version;
    counts->log_entries += !touched[changes[k].index];
    touched[changes[k].index] = true;
  }
}

/* sl_store_compact(min) must compact exactly when the rule says so, and
 * then report what it read and wrote.  Returns whether it compacted. */
static bool compact_and_check(sl_store *st, const model *m, uint64_t min,
                              expected_counts *counts) {
  bool due = counts->log_entries > 0 && counts->log_entries >= min &&
             counts->log_entries >= counts->base_entries;
  sl_store_compaction stats;
  int rc = sl_store_compact(st, min, &stats);
  cr_assert_eq(rc, 0, "compact: %s", sl_store_error(st));
  if (!due) {
    cr_assert_eq(stats.log_entries_read, 0);
    cr_assert_eq(stats.entries_written, 0);
    cr_assert_eq(stats.bytes_written, 0);
    return false;
  }
  cr_assert_eq(stats.log_entries_read, counts->log_entries);
  cr_assert_eq(stats.base_entries_read, counts->base_entries);
  cr_assert_eq(stats.entries_written, live_entries(m));
  cr_assert_geq(stats.bytes_written,
                stats.entries_written * (4 + 9 + SL_STORE_CHECKSUM_BYTES));
  counts->log_entries = 0;
  counts->base_entries = stats.entries_written;
  return true;
}

/* The merged view equals the model after every transaction: random puts,
 * deletes and re-puts (several in one transaction, in and out of store
 * order), aborted transactions, compactions at random points with random
 * thresholds, and reopens. */
Test(store, merged_view_matches_a_model) {
  sl_store_options o = writer_options(FINGERPRINT);
  o.no_sync = 1; /* speed: every check runs in this process */
  model m;
  model_init(&m, 700);
  expected_counts counts = {0, 0};
  sl_store *st = open_ok(root, &o);
  uint32_t compactions = 0;
  for (uint32_t t = 1; t <= 90; t++) {
    bool abort_it = mix64(t) % 8 == 0;
    random_transaction(st, &m, t, abort_it, &counts);
    check_all_ranges(st, &m);
    uint64_t r = mix64(0xc0ffee00ull + t);
    if (r % 4 == 0) {
      static const uint64_t mins[] = {0, 1, 150, 400, 100000};
      compactions += compact_and_check(st, &m, mins[(r >> 8) % 5], &counts);
      check_all_ranges(st, &m);
    }
    if (t % 20 == 0) {
      sl_store_close(st);
      st = open_ok(root, &o);
      check_all_ranges(st, &m);
    }
  }
  cr_assert_geq(compactions, 5, "only %u compactions ran", compactions);
  sl_store_close(st);
  st = open_ok(root, &o);
  check_all_ranges(st, &m);
  if (counts.log_entries >= counts.base_entries)
    cr_assert(compact_and_check(st, &m, 0, &counts));
  check_all_ranges(st, &m);
  sl_store_close(st);
  free(m.version);
}

/* The entries write_changes writes for version (puts and deletes). */
static uint64_t changes_of(const model *m, uint32_t version) {
  uint64_t n = 0;
  for (uint32_t i = 0; i < m->count; i++)
    n += mix64((uint64_t)version << 32 | i) % 4 < 3;
  return n;
}

/* Store.h note 3: the threshold, the rule log >= base, stats, an empty log
 * and a flipped base afterwards; EBUSY and EACCES. */
Test(store, compaction_threshold_and_flip) {
  sl_store_options o = writer_options(FINGERPRINT);
  model m;
  model_init(&m, 400);
  sl_store *st = open_ok(root, &o);
  write_checkpoint(st, &m, 1);
  uint64_t logged = changes_of(&m, 1), live = live_entries(&m);
  cr_assert_gt(logged, live, "deletes are logged too");
  sl_store_compaction stats;
  cr_assert_eq(sl_store_compact(st, logged + 1, &stats), 0);
  cr_assert_eq(stats.log_entries_read + stats.entries_written, 0);
  sl_store_txn *txn;
  cr_assert_eq(sl_store_begin(st, &txn), 0);
  cr_assert_eq(sl_store_compact(st, 0, &stats), EBUSY);
  assert_contains(sl_store_error(st), "a transaction is open");
  sl_store_abort(txn);
  sl_store_close(st);
  cr_assert_eq(raw_count(root, "log"), logged);
  cr_assert_eq(raw_meta_u64(root, "base"), 0);

  st = open_ok(root, &o);
  cr_assert_eq(sl_store_compact(st, logged, &stats), 0, "%s",
               sl_store_error(st));
  cr_assert_eq(stats.log_entries_read, logged);
  cr_assert_eq(stats.base_entries_read, 0);
  cr_assert_eq(stats.entries_written, live);
  uint64_t bytes = 0;
  uint8_t value[128];
  for (uint32_t i = 0; i < m.count; i++)
    if (m.version[i])
      bytes += 4 + 9 + value_of(i, m.version[i], value) + 8;
  cr_assert_eq(stats.bytes_written, bytes);
  cr_assert_lt(stats.duration_us, 60000000u);
  check_all_ranges(st, &m);
  check_record(st, 1); /* records and blobs are not touched */
  check_blob(st, 1, 1, 1);
  sl_store_close(st);
  cr_assert_eq(raw_count(root, "log"), 0);
  cr_assert_eq(raw_count(root, "state"), 0);
  cr_assert_eq(raw_count(root, "state2"), live);
  cr_assert_eq(raw_meta_u64(root, "base"), 1);

  /* A log smaller than the base stays, whatever the threshold. */
  st = open_ok(root, &o);
  cr_assert_eq(sl_store_begin(st, &txn), 0);
  cr_assert_eq(sl_store_put_state(txn, 1, 0, "new", 3, "v", 1), 0);
  cr_assert_eq(sl_store_commit(txn, 2, 0, 0), 0);
  cr_assert_eq(sl_store_compact(st, 0, &stats), 0);
  cr_assert_eq(stats.log_entries_read, 0);
  sl_store_close(st);
  cr_assert_eq(raw_count(root, "log"), 1);

  /* Once it is as large, it is merged into state again. */
  st = open_ok(root, &o);
  cr_assert_eq(sl_store_begin(st, &txn), 0);
  cr_assert_eq(write_changes(txn, &m, 3), 0);
  cr_assert_eq(sl_store_delete_state(txn, 1, 0, "new", 3), 0);
  cr_assert_eq(sl_store_commit(txn, 3, 0, 0), 0);
  cr_assert_eq(sl_store_compact(st, 0, &stats), 0);
  /* "new": put by checkpoint 2, deleted by 3 (another seq: 2 entries). */
  cr_assert_eq(stats.log_entries_read, 2 + changes_of(&m, 3));
  cr_assert_eq(stats.base_entries_read, live);
  cr_assert_eq(stats.entries_written, live_entries(&m));
  check_all_ranges(st, &m);
  sl_store_close(st);
  cr_assert_eq(raw_count(root, "log"), 0);
  cr_assert_eq(raw_count(root, "state2"), 0);
  cr_assert_eq(raw_count(root, "state"), live_entries(&m));
  cr_assert_eq(raw_meta_u64(root, "base"), 0);

  sl_store_options ro = {.read_only = 1};
  st = open_ok(root, &ro);
  cr_assert_eq(sl_store_compact(st, 0, &stats), EACCES);
  check_all_ranges(st, &m);
  sl_store_close(st);
  free(m.version);
}

/* Checkpoint id of big entries [first, first + count): 0, MDB_MAP_FULL
 * (the transaction aborted) or a failure. */
static int write_big_range(sl_store *st, uint32_t first, uint32_t count,
                           uint64_t id) {
  static uint8_t value[BIG_VALUE_BYTES];
  sl_store_txn *txn;
  int rc = sl_store_begin(st, &txn);
  char key[16];
  for (uint32_t i = first; i < first + count && rc == 0; i++) {
    big_value(i, value);
    uint32_t key_bytes = (uint32_t)snprintf(key, sizeof key, "big-%06u", i);
    rc = sl_store_put_state(txn, 7, (uint16_t)(i % 64), key, key_bytes,
                            value, BIG_VALUE_BYTES);
  }
  return rc == 0 ? sl_store_commit(txn, id, "big", 3)
                 : (sl_store_abort(txn), rc);
}

static void check_big(sl_store *st, uint32_t count) {
  uint32_t counts[2] = {0, 0};
  cr_assert_eq(sl_store_read_state(st, 7, 0, UINT16_MAX, count_big, counts),
               0, "%s", sl_store_error(st));
  cr_assert_eq(counts[0], count);
  cr_assert_eq(counts[1], 0, "%u wrong entries", counts[1]);
}

/* A compaction needs room for the new base beside the old base and the
 * log: MDB_MAP_FULL changes nothing, and after sl_store_grow it runs. */
Test(store, compaction_map_full_grow_and_retry) {
  sl_store_options o = writer_options(FINGERPRINT);
  o.initial_map_bytes = 1u << 20;
  o.no_sync = 1;
  sl_store *st = open_ok(root, &o);
  const uint32_t per_checkpoint = 100; /* 100 KB */
  uint32_t written = 0;
  uint64_t id = 1;
  int rc = 0;
  /* Fill the map with log: 1 MiB holds about ten checkpoints. */
  for (; id <= 64; id++, written += per_checkpoint)
    if ((rc = write_big_range(st, written, per_checkpoint, id)) != 0)
      break;
  cr_assert_eq(rc, MDB_MAP_FULL, "%s", sl_store_error(st));
  cr_assert_geq(written, 3 * per_checkpoint);
  cr_assert_eq(sl_store_latest(st), id - 1);
  sl_store_compaction stats;
  cr_assert_eq(sl_store_compact(st, 0, &stats), MDB_MAP_FULL);
  assert_contains(sl_store_error(st), "is full");
  cr_assert_eq(stats.entries_written, 0);
  check_big(st, written);
  sl_store_close(st);
  cr_assert_eq(raw_count(root, "log"), written, "the log is intact");
  cr_assert_eq(raw_count(root, "state2"), 0);

  st = open_ok(root, &o);
  int grows = 0;
  for (rc = MDB_MAP_FULL; rc == MDB_MAP_FULL && grows < 8; grows++) {
    cr_assert_eq(sl_store_grow(st), 0, "%s", sl_store_error(st));
    rc = sl_store_compact(st, 0, &stats);
  }
  cr_assert_eq(rc, 0, "%s", sl_store_error(st));
  cr_assert_eq(stats.entries_written, written);
  check_big(st, written);
  cr_assert_eq(write_big_range(st, written, per_checkpoint, id), 0, "%s",
               sl_store_error(st)); /* and the store goes on */
  check_big(st, written + per_checkpoint);
  sl_store_close(st);
  cr_assert_eq(raw_count(root, "log"), per_checkpoint);
  cr_assert_eq(raw_count(root, "state2"), written);
}

/* A process killed inside a compaction's write transaction (after 1/4,
 * 1/2, 3/4 and all of its appends to the new base) leaves the store as it
 * was: the same merged view, log and base (store.h note 3). */
Test(store, crash_inside_a_compaction) {
  sl_store_options o = writer_options(FINGERPRINT);
  model m;
  model_init(&m, 4000);
  sl_store *st = open_ok(root, &o);
  for (uint32_t version = 1; version <= 3; version++)
    write_checkpoint(st, &m, version);
  sl_store_close(st);
  uint64_t live = live_entries(&m), logged = raw_count(root, "log");
  cr_assert_gt(live, 1000);
  const uint64_t crash_at[] = {live / 4, live / 2, 3 * live / 4, live};
  for (size_t c = 0; c < sizeof crash_at / sizeof *crash_at; c++) {
    pid_t child = fork();
    cr_assert_geq(child, 0);
    if (child == 0) {
      char err[ERR_BYTES];
      sl_store_compaction stats;
      if (sl_store_open(root, &o, &st, err, sizeof err) != 0)
        _exit(2);
      sl_store_test_crash_after(crash_at[c]);
      sl_store_compact(st, 0, &stats); /* raises SIGKILL */
      _exit(3);
    }
    int status = 0;
    cr_assert_eq(waitpid(child, &status, 0), child);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
              "crash %zu: the child died by SIGKILL, not status %d", c,
              status);
    cr_assert_eq(raw_count(root, "log"), logged);
    cr_assert_eq(raw_count(root, "state2"), 0);
    cr_assert_eq(raw_meta_u64(root, "base"), 0);
    st = open_ok(root, &o);
    cr_assert_eq(sl_store_latest(st), 3);
    check_all_ranges(st, &m);
    check_blob(st, 1, 0, 3);
    sl_store_close(st);
  }
  st = open_ok(root, &o); /* and a compaction that runs to its end */
  sl_store_compaction stats;
  cr_assert_eq(sl_store_compact(st, 0, &stats), 0, "%s", sl_store_error(st));
  cr_assert_eq(stats.entries_written, live);
  check_all_ranges(st, &m);
  write_checkpoint(st, &m, 4);
  check_all_ranges(st, &m);
  sl_store_close(st);
  st = open_ok(root, &o);
  check_all_ranges(st, &m);
  sl_store_close(st);
  free(m.version);
}

/* A set cancel flag stops a compaction with ECANCELED and changes nothing;
 * cleared, the same compaction runs. */
Test(store, compaction_can_be_cancelled) {
  sl_store_options o = writer_options(FINGERPRINT);
  sl_store *st = open_ok(root, &o);
  sl_store_txn *txn;
  cr_assert_eq(sl_store_begin(st, &txn), 0);
  for (uint32_t k = 0; k < 20000; k++) {
    uint8_t key[12] = {0};
    memcpy(key, &k, sizeof k);
    cr_assert_eq(sl_store_put_state(txn, 1, (uint16_t)(k % 4), key,
                                    sizeof key, &k, sizeof k), 0);
  }
  cr_assert_eq(sl_store_commit(txn, 1, "r", 1), 0, "%s", sl_store_error(st));
  _Atomic int cancel = 1;
  sl_store_set_cancel(st, &cancel);
  sl_store_compaction stats;
  cr_expect_eq(sl_store_compact(st, 0, &stats), ECANCELED);
  cr_expect_eq(stats.entries_written, 0);
  uint64_t bound = 0;
  cr_assert_eq(sl_store_entry_bound(st, &bound), 0);
  cr_expect_eq(bound, 20000, "all in the log before the compaction");
  atomic_store(&cancel, 0);
  cr_expect_eq(sl_store_compact(st, 0, &stats), 0, "%s", sl_store_error(st));
  cr_expect_eq(stats.entries_written, 20000);
  cr_assert_eq(sl_store_entry_bound(st, &bound), 0);
  cr_expect_eq(bound, 20000, "all in the base after it");
  sl_store_set_cancel(st, 0);
  sl_store_close(st);
  cr_expect_eq(raw_count(root, "log"), 0);
  cr_expect_eq(raw_count(root, "state2"), 20000);
}
