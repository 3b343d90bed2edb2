/* test_store.h — what the store's test files share (test_store.c,
 * test_store_compaction.c): a temporary directory per test, opening
 * helpers, the model of keyed state that every read is checked against,
 * and raw LMDB access for making bad stores.  One copy of each, included
 * by both; nothing here is a test.
 */
#ifndef SL_TEST_STORE_H
#define SL_TEST_STORE_H

#include <criterion/criterion.h>

#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <lmdb.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "sluice.h"
#include "store.h"

#define FINGERPRINT "graph v1: 1 source(1) 2 keyed(4) 3 sink(1)"
#define ERR_BYTES 1024

/* ------------------------------------------------------------ fixture */

static char root[PATH_MAX]; /* this test's temporary directory */

static inline void make_root(void) {
  snprintf(root, sizeof root, "/tmp/sluice-store-test-XXXXXX");
  cr_assert_not_null(mkdtemp(root), "mkdtemp: %s", strerror(errno));
}

static inline int remove_one(const char *path, const struct stat *st, int flag,
                             struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

static inline void remove_root(void) {
  if (root[0])
    nftw(root, remove_one, 16, FTW_DEPTH | FTW_PHYS);
  root[0] = 0;
}

/* dir/name into out (PATH_MAX bytes). */
static inline void join(char *out, const char *dir, const char *name) {
  int n = snprintf(out, PATH_MAX, "%s/%s", dir, name);
  cr_assert(n > 0 && n < PATH_MAX, "path too long");
}

static inline void path_in_root(char *out, const char *name) {
  join(out, root, name);
}

/* ------------------------------------------------------------ helpers */

static inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static inline sl_store_options writer_options(const char *fingerprint) {
  return (sl_store_options){.graph_fingerprint = fingerprint};
}

static inline sl_store *open_ok(const char *dir, const sl_store_options *o) {
  sl_store *s = 0;
  char err[ERR_BYTES];
  int rc = sl_store_open(dir, o, &s, err, sizeof err);
  cr_assert_eq(rc, 0, "open %s: %s: %s", dir, sl_strerror(rc), err);
  cr_assert_not_null(s);
  return s;
}

/* Opens expecting failure rc; returns the message. */
static inline const char *open_fails(const char *dir,
                                     const sl_store_options *o,
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

static inline void assert_contains(const char *text, const char *part) {
  cr_assert(strstr(text, part) != 0, "\"%s\" lacks \"%s\"", text, part);
}

/* ------------------------------------------------------------ model */

/* Entry i: operator 1 or 2, one of 32 key groups, key "key-%05u". */
#define GROUPS 32u
static inline uint16_t op_of(uint32_t i) { return (uint16_t)(1 + i % 2); }
static inline uint16_t group_of(uint32_t i) {
  return (uint16_t)(i * 7 % GROUPS);
}
static inline uint32_t key_of(uint32_t i, char *key) {
  return (uint32_t)snprintf(key, 16, "key-%05u", i);
}

/* Value of entry i as written by checkpoint version: 0..119 bytes. */
static inline uint32_t value_of(uint32_t i, uint32_t version, uint8_t *value) {
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

static inline int seen_entry(void *arg, uint16_t key_group, const void *key,
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
static inline void check_range(sl_store *st, const model *m, uint16_t op,
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

static inline void check_all_ranges(sl_store *st, const model *m) {
  for (uint16_t op = 0; op <= 3; op++) {
    check_range(st, m, op, 0, UINT16_MAX);
    check_range(st, m, op, 0, 0);
    check_range(st, m, op, 3, 9);
    check_range(st, m, op, GROUPS - 1, GROUPS - 1);
  }
}

/* Checkpoint version's changes: entry i is put (half), deleted (a
 * quarter) or left alone, by a hash of (i, version). */
static inline int write_changes(sl_store_txn *txn, model *m, uint32_t version) {
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

static inline void model_init(model *m, uint32_t count) {
  m->count = count;
  m->version = calloc(count, sizeof *m->version);
  cr_assert_not_null(m->version);
}

static inline void blob_text(char *out, uint16_t op, uint16_t instance,
                             uint32_t version) {
  snprintf(out, 64, "blob of op %u instance %u at checkpoint %u", op,
           instance, version);
}

static inline void record_text(char *out, uint64_t id) {
  snprintf(out, 64, "record of checkpoint %llu", (unsigned long long)id);
}

/* One checkpoint: the model's changes, the blob of (1, 0) and, in
 * checkpoint 1 only, of (1, 1); then commit with record_text. */
static inline void write_checkpoint(sl_store *st, model *m, uint32_t version) {
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

static inline void check_blob(sl_store *st, uint16_t op, uint16_t instance,
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

static inline void check_record(sl_store *st, uint64_t id) {
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

static inline void check_list(sl_store *st, const uint64_t *expected,
                              size_t count) {
  uint64_t *ids;
  size_t n;
  cr_assert_eq(sl_store_list_checkpoints(st, &ids, &n), 0);
  cr_assert_not_null(ids);
  cr_assert_eq(n, count, "%zu checkpoints listed, not %zu", n, count);
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(ids[i], expected[i]);
  free(ids);
}

/* A writer of a fresh store at root, holding checkpoint 1 of the new
 * model m of count entries. */
static inline sl_store *first_checkpoint(model *m, uint32_t count) {
  sl_store_options o = writer_options(FINGERPRINT);
  model_init(m, count);
  sl_store *st = open_ok(root, &o);
  write_checkpoint(st, m, 1);
  return st;
}

/* ------------------------------------------------------------ raw LMDB */

/* The store's checksum (store.h note 1), written independently. */
static inline uint64_t format_checksum(unsigned db, const void *key,
                                       size_t key_bytes, const void *payload,
                                       size_t payload_bytes) {
  return XXH3_64bits_withSeed(payload, payload_bytes,
                              XXH3_64bits_withSeed(key, key_bytes, db));
}

static inline MDB_env *raw_open(const char *dir) {
  MDB_env *env;
  cr_assert_eq(mdb_env_create(&env), 0);
  cr_assert_eq(mdb_env_set_maxdbs(env, 8), 0);
  int rc = mdb_env_open(env, dir, 0, 0644);
  cr_assert_eq(rc, 0, "raw open: %s", mdb_strerror(rc));
  return env;
}

/* Reads db/key raw (value with its checksum) into out; returns bytes. */
static inline size_t raw_get(const char *dir, const char *db, const void *key,
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

static inline void raw_put(const char *dir, const char *db, const void *key,
                           size_t key_bytes, const void *value,
                           size_t value_bytes) {
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
static inline size_t raw_count(const char *dir, const char *db) {
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
static inline uint64_t raw_meta_u64(const char *dir, const char *name) {
  uint8_t value[64];
  size_t bytes = raw_get(dir, "meta", name, strlen(name), value, sizeof value);
  cr_assert_eq(bytes, 8 + SL_STORE_CHECKSUM_BYTES);
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = v << 8 | value[i];
  return v;
}

/* Flips one payload byte of db/key, leaving the checksum as it was. */
static inline void raw_corrupt(const char *dir, const char *db, const void *key,
                               size_t key_bytes, size_t at) {
  uint8_t value[4096];
  size_t bytes = raw_get(dir, db, key, key_bytes, value, sizeof value);
  cr_assert_lt(at, bytes - SL_STORE_CHECKSUM_BYTES);
  value[at] ^= 0x20;
  raw_put(dir, db, key, key_bytes, value, bytes);
}

/* Big-value entries (the map-full tests): BIG_VALUE_BYTES of a pattern
 * of i. */
#define BIG_VALUE_BYTES 1000u
static inline void big_value(uint32_t i, uint8_t *value) {
  for (uint32_t j = 0; j < BIG_VALUE_BYTES; j++)
    value[j] = (uint8_t)(i * 31 + j);
}

/* Checkpoint id of big entries [first, first + count): 0, MDB_MAP_FULL
 * (the transaction aborted) or a failure. */
static inline int write_big_range(sl_store *st, uint32_t first,
                                  uint32_t count, uint64_t id) {
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

/* A read_state callback over big-value entries ("big-%06u", key group
 * i % 64): counts[0] the entries, counts[1] the wrong ones. */
static inline int count_big(void *arg, uint16_t key_group, const void *key,
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

#endif /* SL_TEST_STORE_H */
