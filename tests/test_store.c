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

  /* A failure: the longest key fits, one byte more fails the txn. */
  static uint8_t key[600];
  cr_assert_eq(sl_store_begin(st, &txn), 0);
  cr_assert_eq(sl_store_put_state(txn, 1, 0, key, 507, "v", 1), 0);
  cr_assert_eq(sl_store_put_state(txn, 1, 0, key, 508, "v", 1), EINVAL);
  assert_contains(sl_store_error(st), "508 bytes is too long");
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

Test(store, refuses_a_newer_format) {
  sl_store_options o = writer_options(FINGERPRINT);
  sl_store_close(open_ok(root, &o));
  uint8_t value[12] = {2, 0, 0, 0};
  uint64_t sum = format_checksum(1, "format", 6, value, 4);
  for (int i = 0; i < 8; i++)
    value[4 + i] = (uint8_t)(sum >> (8 * i));
  raw_put(root, "meta", "format", 6, value, sizeof value);
  const char *err = open_fails(root, &o, SL_ESTORE);
  assert_contains(err, "format version 2");
  assert_contains(err, "reads up to 1");
  o.read_only = 1;
  open_fails(root, &o, SL_ESTORE);
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

/* A child writer holds the store; this process is refused as a writer
 * but may read (store.h note 5), also after the writer grew the map. */
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

/* A flipped byte in a stored value is SL_ECORRUPT naming db and key. */
Test(store, detects_corruption) {
  sl_store_options o = writer_options(FINGERPRINT);
  model m;
  model_init(&m, 50);
  sl_store *st = open_ok(root, &o);
  write_checkpoint(st, &m, 1);
  sl_store_txn *txn;
  cr_assert_eq(sl_store_begin(st, &txn), 0);
  cr_assert_eq(sl_store_put_state(txn, 9, 0x0102, "\xab\xcd", 2, "value", 5),
               0);
  cr_assert_eq(sl_store_put_blob(txn, 3, 2, "blob bytes", 10), 0);
  cr_assert_eq(sl_store_commit(txn, 2, "record", 6), 0);
  sl_store_close(st);

  raw_corrupt(root, "state", "\x00\x09\x01\x02\xab\xcd", 6, 1);
  raw_corrupt(root, "blobs", "\x00\x03\x00\x02", 4, 9);
  raw_corrupt(root, "checkpoints", "\0\0\0\0\0\0\0\x02", 8, 0);
  st = open_ok(root, &o);
  cr_assert_eq(sl_store_read_state(st, 9, 0, UINT16_MAX, seen_entry, 0),
               SL_ECORRUPT);
  const char *err = sl_store_error(st);
  assert_contains(err, "database state");
  assert_contains(err, "op 9 key group 258 key abcd");
  assert_contains(err, root);
  check_all_ranges(st, &m); /* other operators still read */
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
  free(m.version);
}

Test(store, wipe_starts_fresh) {
  sl_store_options o = writer_options(FINGERPRINT);
  model m;
  model_init(&m, 400);
  sl_store *st = open_ok(root, &o);
  write_checkpoint(st, &m, 1);
  write_checkpoint(st, &m, 2);
  cr_assert_eq(sl_store_wipe(st), 0, "%s", sl_store_error(st));
  memset(m.version, 0, m.count * sizeof *m.version);
  cr_assert_eq(sl_store_latest(st), 0);
  check_all_ranges(st, &m);
  check_list(st, 0, 0);
  void *data;
  uint32_t bytes;
  cr_assert_eq(sl_store_get_blob(st, 1, 0, &data, &bytes), SL_ENOTFOUND);
  sl_store_close(st);
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
