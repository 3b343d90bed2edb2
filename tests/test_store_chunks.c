/* test_store_chunks.c — Criterion tests of store format 3's chunks
 * (storage/chunk.c, store.h note 1) and of compaction in steps
 * (storage/store_compact.c): chunk boundaries, newest-wins across the base
 * and several runs, tombstones, sub-range reads (rescaling), damage in a
 * chunk, a compaction cancelled and one killed between its steps.
 * Fixture and model: test_store.h.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sluice.h"
#include "chunk.h"
#include "store.h"
#include "test_store.h"

static void reset_hooks(void) {
  sl_store_test_compaction_step_bytes(0);
  sl_store_test_view_copy_budget(SIZE_MAX);
  sl_store_test_crash_after(0);
  remove_root();
}

TestSuite(store_chunks, .init = make_root, .fini = reset_hooks,
          .timeout = 120);

/* ------------------------------------------------------------ raw chunks */

/* Calls fn for every raw value of database db (key and value bytes). */
static void raw_each(const char *dir, const char *db,
                     void (*fn)(void *arg, const MDB_val *key,
                                const MDB_val *value),
                     void *arg) {
  MDB_env *env = raw_open(dir);
  MDB_txn *txn;
  MDB_dbi dbi;
  MDB_cursor *cursor;
  cr_assert_eq(mdb_txn_begin(env, 0, MDB_RDONLY, &txn), 0);
  cr_assert_eq(mdb_dbi_open(txn, db, 0, &dbi), 0);
  cr_assert_eq(mdb_cursor_open(txn, dbi, &cursor), 0);
  MDB_val key, value;
  for (int rc = mdb_cursor_get(cursor, &key, &value, MDB_FIRST); rc == 0;
       rc = mdb_cursor_get(cursor, &key, &value, MDB_NEXT))
    fn(arg, &key, &value);
  mdb_cursor_close(cursor);
  mdb_txn_abort(txn);
  mdb_env_close(env);
}

static uint32_t le32_at(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}

/* What the chunks of a database look like (store.h note 1). */
typedef struct chunk_shape {
  size_t chunks;
  size_t max_bytes;      /* largest chunk, head and checksum included */
  size_t single_over;    /* chunks over 1 MiB: must hold one entry */
  uint64_t entries;      /* the heads' counts */
  uint32_t groups_of[8]; /* chunks whose range holds key group g, g < 8 */
} chunk_shape;

static void shape_of(void *arg, const MDB_val *key, const MDB_val *value) {
  (void)key;
  chunk_shape *shape = arg;
  const uint8_t *v = value->mv_data;
  cr_assert_geq(value->mv_size, 12 + SL_STORE_CHECKSUM_BYTES);
  uint32_t count = le32_at(v + 8);
  uint16_t first = (uint16_t)(v[2] | v[3] << 8), last = (uint16_t)(v[4] | v[5] << 8);
  shape->chunks++;
  shape->entries += count;
  if (value->mv_size > shape->max_bytes)
    shape->max_bytes = value->mv_size;
  if (value->mv_size > (1u << 20) + SL_STORE_CHECKSUM_BYTES) {
    shape->single_over++;
    cr_assert_eq(count, 1, "a chunk over 1 MiB holds one entry");
  }
  for (uint16_t g = first; g <= last && g < 8; g++)
    shape->groups_of[g]++;
}

/* Value i of the boundary test: bytes_of(i) of a pattern of i. */
static uint32_t boundary_bytes(uint32_t i) {
  static const uint32_t sizes[] = {65535, 65536, 65537, 60000, 17, 0,
                                   (1u << 20) + 5, 1000};
  return sizes[i % (sizeof sizes / sizeof *sizes)];
}

static void boundary_value(uint32_t i, uint8_t *out) {
  for (uint32_t j = 0; j < boundary_bytes(i); j++)
    out[j] = (uint8_t)(i * 7 + j / 3);
}

typedef struct boundary_seen {
  uint32_t entries, wrong;
  uint8_t *expected;
} boundary_seen;

static int boundary_entry(void *arg, uint16_t key_group, const void *key,
                          uint32_t key_bytes, const void *value,
                          uint32_t value_bytes) {
  boundary_seen *b = arg;
  uint32_t i = 0;
  cr_assert_eq(key_bytes, sizeof i);
  memcpy(&i, key, sizeof i);
  boundary_value(i, b->expected);
  if (key_group != i / 40 || value_bytes != boundary_bytes(i) ||
      memcmp(value, b->expected, value_bytes) != 0)
    b->wrong++;
  b->entries++;
  return 0;
}

static void check_boundary_range(sl_store *st, uint16_t first, uint16_t last,
                                 uint32_t expected) {
  boundary_seen b = {.expected = malloc((1u << 20) + 64)};
  cr_assert_not_null(b.expected);
  int rc = sl_store_read_state(st, 4, first, last, boundary_entry, &b);
  cr_assert_eq(rc, 0, "%s", sl_store_error(st));
  cr_assert_eq(b.wrong, 0, "[%u, %u]: %u wrong", first, last, b.wrong);
  cr_assert_eq(b.entries, expected, "[%u, %u]: %u entries, not %u", first,
               last, b.entries, expected);
  free(b.expected);
}

/* Store.h note 1: an entry never spans two chunks; values about 64 KiB
 * and one larger than a chunk; a key group's entries split over several
 * chunks; every range of groups reads exactly its entries, from the log
 * and from the base. */
Test(store_chunks, chunk_boundaries) {
  sl_store_options o = writer_options(FINGERPRINT);
  o.no_sync = 1;
  sl_store *st = open_ok(root, &o);
  uint8_t *value = malloc((1u << 20) + 64);
  cr_assert_not_null(value);
  sl_store_txn *txn;
  cr_assert_eq(sl_store_begin(st, &txn), 0);
  const uint32_t count = 160; /* key groups 0..3, 40 entries each */
  for (uint32_t i = 0; i < count; i++) {
    boundary_value(i, value);
    uint8_t key[4];
    memcpy(key, &i, sizeof key);
    /* Ascending keys within a group: i's bytes, little-endian, are not in
     * order, so the store starts new runs now and then: both paths. */
    cr_assert_eq(sl_store_put_state(txn, 4, (uint16_t)(i / 40), key,
                                    sizeof key, value, boundary_bytes(i)),
                 0, "%s", sl_store_error(st));
  }
  cr_assert_eq(sl_store_commit(txn, 1, "r", 1), 0, "%s", sl_store_error(st));
  free(value);
  for (int pass = 0; pass < 2; pass++) { /* the log, then the base */
    check_boundary_range(st, 0, UINT16_MAX, count);
    for (uint16_t g = 0; g < 4; g++)
      check_boundary_range(st, g, g, 40);
    check_boundary_range(st, 1, 2, 80);
    check_boundary_range(st, 4, 9, 0);
    sl_store_close(st);
    chunk_shape shape = {0};
    raw_each(root, pass == 0 ? "log" : "state2", shape_of, &shape);
    cr_assert_eq(shape.entries, count);
    cr_assert_gt(shape.chunks, 4, "%zu chunks for about 10 MiB", shape.chunks);
    cr_assert_geq(shape.single_over, 1, "the 1 MiB + 5 values");
    for (uint16_t g = 0; g < 4; g++)
      cr_assert_geq(shape.groups_of[g], 2, "group %u over several chunks", g);
    st = open_ok(root, &o);
    if (pass == 0) {
      sl_store_compaction stats;
      cr_assert_eq(sl_store_compact(st, 0, &stats), 0, "%s",
                   sl_store_error(st));
      cr_assert_eq(stats.entries_written, count);
    }
  }
  sl_store_close(st);
}

/* ------------------------------------------------------------ newest wins */

/* A transaction of the named changes in the order given (value NULL: a
 * delete), committed as id. */
typedef struct change {
  uint16_t group;
  const char *key;
  const char *value;
} change;

static void write_changes_in_order(sl_store *st, const change *c, size_t n,
                                   uint64_t id) {
  sl_store_txn *txn;
  cr_assert_eq(sl_store_begin(st, &txn), 0);
  for (size_t i = 0; i < n; i++) {
    int rc = c[i].value
                 ? sl_store_put_state(txn, 5, c[i].group, c[i].key,
                                      (uint32_t)strlen(c[i].key), c[i].value,
                                      (uint32_t)strlen(c[i].value))
                 : sl_store_delete_state(txn, 5, c[i].group, c[i].key,
                                         (uint32_t)strlen(c[i].key));
    cr_assert_eq(rc, 0, "%s", sl_store_error(st));
  }
  cr_assert_eq(sl_store_commit(txn, id, "r", 1), 0, "%s", sl_store_error(st));
}

static int text_entry(void *arg, uint16_t key_group, const void *key,
                      uint32_t key_bytes, const void *value,
                      uint32_t value_bytes) {
  char *text = arg;
  size_t at = strlen(text);
  snprintf(text + at, 512 - at, "%u:%.*s=%.*s;", key_group, (int)key_bytes,
           (const char *)key, (int)value_bytes, (const char *)value);
  return 0;
}

static void expect_op_text(sl_store *st, uint16_t op, uint16_t first,
                           uint16_t last, const char *expected) {
  char text[512] = {0};
  cr_assert_eq(sl_store_read_state(st, op, first, last, text_entry, text), 0,
               "%s", sl_store_error(st));
  cr_assert_str_eq(text, expected);
}

static void expect_text(sl_store *st, uint16_t first, uint16_t last,
                        const char *expected) {
  expect_op_text(st, 5, first, last, expected);
}

static void expect_text_of(sl_store *st, uint16_t op, const char *expected) {
  expect_op_text(st, op, 0, UINT16_MAX, expected);
}

/* Store.h note 2: the newest version wins across the base, several
 * checkpoints' runs and several runs of one transaction (keys out of
 * order); tombstones hide older puts, and a compaction keeps none. */
Test(store_chunks, newest_wins_and_tombstones) {
  sl_store_options o = writer_options(FINGERPRINT);
  o.no_sync = 1;
  sl_store *st = open_ok(root, &o);
  const change base[] = {{1, "a", "base"}, {1, "b", "base"}, {2, "c", "base"},
                         {3, "d", "base"}};
  write_changes_in_order(st, base, 4, 1);
  sl_store_compaction stats;
  cr_assert_eq(sl_store_compact(st, 0, &stats), 0, "%s", sl_store_error(st));
  cr_assert_eq(stats.entries_written, 4);
  const change second[] = {{1, "a", "two"}, {2, "c", 0}, {3, "e", "two"}};
  write_changes_in_order(st, second, 3, 2);
  /* Out of order: runs of "d", then "b" "x", then "a": each newer. */
  const change third[] = {{3, "d", "three"}, {1, "b", "three"},
                          {1, "x", "three"}, {1, "a", 0},
                          {1, "b", "again"}, {1, "b", "last"}};
  write_changes_in_order(st, third, 6, 3);
  const char *merged = "1:b=last;1:x=three;3:d=three;3:e=two;";
  expect_text(st, 0, UINT16_MAX, merged);
  expect_text(st, 2, 2, "");
  expect_text(st, 3, 3, "3:d=three;3:e=two;");
  /* A tombstone of a key never written, and a re-put after a delete. */
  const change fourth[] = {{2, "c", "back"}, {2, "never", 0}};
  write_changes_in_order(st, fourth, 2, 4);
  merged = "1:b=last;1:x=three;2:c=back;3:d=three;3:e=two;";
  expect_text(st, 0, UINT16_MAX, merged);
  uint64_t before = raw_meta_u64(root, "log_entries");
  cr_assert_eq(before, 3 + 5 + 2, "a direct repeat replaces its entry");
  cr_assert_eq(sl_store_compact(st, 0, &stats), 0, "%s", sl_store_error(st));
  cr_assert_eq(stats.entries_written, 5, "no tombstone is kept");
  cr_assert_eq(stats.log_entries_read, before);
  expect_text(st, 0, UINT16_MAX, merged);
  sl_store_close(st);
  cr_assert_eq(raw_meta_u64(root, "base_entries"), 5);
  cr_assert_eq(raw_meta_u64(root, "log_entries"), 0);
  cr_assert_eq(raw_count(root, "log"), 0);
  st = open_ok(root, &o);
  expect_text(st, 0, UINT16_MAX, merged);
  sl_store_close(st);
}

/* A key put again at once replaces its entry in the chunk being built;
 * when the newer version no longer fits, the chunk is closed without it
 * and must end at the entry before, in that entry's key group (the newer
 * one opens the next chunk).  The fillers leave exactly room for k1 and a
 * one-byte k2. */
Test(store_chunks, a_replaced_entry_that_no_longer_fits) {
  sl_store_options o = writer_options(FINGERPRINT);
  o.no_sync = 1;
  sl_store *st = open_ok(root, &o);
  sl_store_txn *txn;
  cr_assert_eq(sl_store_begin(st, &txn), 0);
  static uint8_t filler[2048];
  size_t room = CHUNK_TARGET_BYTES - CHUNK_HEAD_BYTES -
                chunk_entry_bytes(false, 2, 1) - chunk_entry_bytes(false, 2, 1);
  for (uint32_t i = 0; room > 0; i++) {
    char key[16];
    snprintf(key, sizeof key, "f%06u", i);
    size_t full = chunk_entry_bytes(false, 7, 1024);
    uint32_t value = room >= full + chunk_entry_bytes(false, 7, 0)
                         ? 1024u
                         : (uint32_t)(room - chunk_entry_bytes(false, 7, 0));
    cr_assert_eq(sl_store_put_state(txn, 5, 0, key, 7, filler, value), 0);
    room -= chunk_entry_bytes(false, 7, value);
  }
  static char big[101];
  memset(big, 'v', 100);
  cr_assert_eq(sl_store_put_state(txn, 5, 1, "k1", 2, "1", 1), 0);
  cr_assert_eq(sl_store_put_state(txn, 5, 2, "k2", 2, "2", 1), 0);
  cr_assert_eq(sl_store_put_state(txn, 5, 2, "k2", 2, big, 100), 0);
  cr_assert_eq(sl_store_commit(txn, 1, "r", 1), 0, "%s", sl_store_error(st));
  char expected[160];
  snprintf(expected, sizeof expected, "1:k1=1;2:k2=%s;", big);
  expect_text(st, 1, 2, expected);
  sl_store_compaction stats;
  cr_assert_eq(sl_store_compact(st, 0, &stats), 0, "%s", sl_store_error(st));
  expect_text(st, 1, 2, expected);
  sl_store_close(st);
}

/* ------------------------------------------------------------ sub-ranges */

typedef struct range_seen {
  uint32_t entries;
  uint16_t first, last;
  uint32_t outside;
} range_seen;

static int range_entry(void *arg, uint16_t key_group, const void *key,
                       uint32_t key_bytes, const void *value,
                       uint32_t value_bytes) {
  (void)key, (void)key_bytes, (void)value, (void)value_bytes;
  range_seen *r = arg;
  r->outside += key_group < r->first || key_group > r->last;
  r->entries++;
  return 0;
}

/* Rescaling: state written as one instance's (all 128 groups) reads back
 * as the ranges of 3 or 5 instances, each exactly its own entries, from
 * base and log runs alike. */
Test(store_chunks, sub_ranges_for_any_parallelism) {
  sl_store_options o = writer_options(FINGERPRINT);
  o.no_sync = 1;
  sl_store *st = open_ok(root, &o);
  const uint32_t keys = 50000, groups = 128;
  uint32_t per_group[128] = {0};
  for (uint64_t id = 1; id <= 3; id++) {
    sl_store_txn *txn;
    cr_assert_eq(sl_store_begin(st, &txn), 0);
    for (uint32_t g = 0; g < groups; g++)
      for (uint32_t k = (uint32_t)id - 1; k < keys / groups; k += 3) {
        uint8_t key[8] = {0};
        key[0] = (uint8_t)(k >> 8), key[1] = (uint8_t)k;
        uint64_t v = id;
        cr_assert_eq(sl_store_put_state(txn, 6, (uint16_t)g, key, sizeof key,
                                        &v, sizeof v), 0);
        per_group[g]++;
      }
    cr_assert_eq(sl_store_commit(txn, id, "r", 1), 0);
    if (id == 1) {
      sl_store_compaction stats;
      cr_assert_eq(sl_store_compact(st, 0, &stats), 0);
    }
  }
  static const int parallelisms[] = {1, 3, 5, 128};
  for (size_t p = 0; p < sizeof parallelisms / sizeof *parallelisms; p++) {
    uint32_t total = 0;
    for (int i = 0; i < parallelisms[p]; i++) {
      range_seen r = {.first = (uint16_t)(groups * i / parallelisms[p]),
                      .last = (uint16_t)(groups * (i + 1) / parallelisms[p] -
                                         1)};
      cr_assert_eq(sl_store_read_state(st, 6, r.first, r.last, range_entry,
                                       &r), 0);
      uint32_t expected = 0;
      for (uint32_t g = r.first; g <= r.last; g++)
        expected += per_group[g];
      cr_assert_eq(r.outside, 0);
      cr_assert_eq(r.entries, expected, "instance %d of %d", i,
                   parallelisms[p]);
      total += r.entries;
    }
    cr_assert_eq(total, keys / groups * groups);
  }
  sl_store_close(st);
}

/* ------------------------------------------------------------ damage */

/* Flips the byte at_from_end bytes before the checksum of the first value
 * of db (the checksum is left as it was). */
static void raw_flip_first(const char *dir, const char *db,
                           size_t at_from_end) {
  MDB_env *env = raw_open(dir);
  MDB_txn *txn;
  MDB_dbi dbi;
  MDB_cursor *cursor;
  cr_assert_eq(mdb_txn_begin(env, 0, 0, &txn), 0);
  cr_assert_eq(mdb_dbi_open(txn, db, 0, &dbi), 0);
  cr_assert_eq(mdb_cursor_open(txn, dbi, &cursor), 0);
  MDB_val key, value;
  cr_assert_eq(mdb_cursor_get(cursor, &key, &value, MDB_FIRST), 0);
  cr_assert_gt(value.mv_size, SL_STORE_CHECKSUM_BYTES + at_from_end);
  uint8_t *copy = malloc(value.mv_size);
  cr_assert_not_null(copy);
  memcpy(copy, value.mv_data, value.mv_size);
  copy[value.mv_size - SL_STORE_CHECKSUM_BYTES - at_from_end] ^= 0x10;
  MDB_val changed = {value.mv_size, copy};
  cr_assert_eq(mdb_cursor_put(cursor, &key, &changed, MDB_CURRENT), 0);
  free(copy);
  mdb_cursor_close(cursor);
  cr_assert_eq(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
}

/* Checkpoint id: 5000 sorted entries of op 3 (one key group, 100-byte
 * values: one chunk of about 600 KB), then one of op 4. */
static void write_damage_case(sl_store *st, uint64_t id) {
  sl_store_txn *txn;
  cr_assert_eq(sl_store_begin(st, &txn), 0);
  uint8_t value[100];
  for (uint32_t k = 0; k < 5000; k++) {
    uint8_t key[4] = {(uint8_t)(k >> 24), (uint8_t)(k >> 16),
                      (uint8_t)(k >> 8), (uint8_t)k};
    memset(value, (int)k, sizeof value);
    cr_assert_eq(sl_store_put_state(txn, 3, 7, key, 4, value, sizeof value),
                 0);
  }
  cr_assert_eq(sl_store_put_state(txn, 4, 7, "k", 1, "v", 1), 0);
  cr_assert_eq(sl_store_commit(txn, id, "r", 1), 0, "%s", sl_store_error(st));
}

/* A flipped byte deep in a large chunk, in the log and in the base, is
 * SL_ECORRUPT naming the database and the chunk, never a crash; another
 * operator's chunk still reads. */
Test(store_chunks, damage_in_a_chunk) {
  sl_store_options o = writer_options(FINGERPRINT);
  o.no_sync = 1;
  sl_store *st = open_ok(root, &o);
  write_damage_case(st, 1);
  sl_store_close(st);
  raw_flip_first(root, "log", 300000); /* the first chunk: op 3's */
  st = open_ok(root, &o);
  char text[512] = {0};
  /* Read as a copy (store_view.c note 3), and in the map: the same. */
  for (int copies = 1; copies >= 0; copies--) {
    sl_store_test_view_copy_budget(copies ? SIZE_MAX : 0);
    uint64_t before = sl_store_test_view_copies();
    cr_assert_eq(sl_store_read_state(st, 3, 0, UINT16_MAX, text_entry, text),
                 SL_ECORRUPT);
    cr_assert_eq(sl_store_test_view_copies() - before, (uint64_t)copies);
    assert_contains(sl_store_error(st),
                    "database log, seq 1 run 0 chunk 0 of op 3 up to key "
                    "group 7");
    assert_contains(sl_store_error(st), "fails its checksum");
    assert_contains(sl_store_error(st), root);
  }
  sl_store_test_view_copy_budget(SIZE_MAX);
  expect_text_of(st, 4, "7:k=v;");
  sl_store_compaction stats;
  cr_assert_eq(sl_store_compact(st, 0, &stats), SL_ECORRUPT);
  expect_text_of(st, 4, "7:k=v;");
  sl_store_close(st);

  char dir[PATH_MAX];
  path_in_root(dir, "based");
  st = open_ok(dir, &o);
  write_damage_case(st, 1);
  cr_assert_eq(sl_store_compact(st, 0, &stats), 0, "%s", sl_store_error(st));
  sl_store_close(st);
  raw_flip_first(dir, "state2", 12345);
  st = open_ok(dir, &o);
  cr_assert_eq(sl_store_read_state(st, 3, 7, 7, text_entry, text),
               SL_ECORRUPT);
  assert_contains(sl_store_error(st),
                  "database state2, chunk 0 of op 3 up to key group 7");
  expect_text_of(st, 4, "7:k=v;");
  sl_store_close(st);
}

/* write_changes' checkpoint version in store order (operator, key group,
 * key), so its chunks are full ones (a put out of order starts a new
 * chunk). */
static void write_sorted_checkpoint(sl_store *st, model *m,
                                    uint32_t version) {
  sl_store_txn *txn;
  cr_assert_eq(sl_store_begin(st, &txn), 0, "%s", sl_store_error(st));
  uint8_t value[128];
  char key[16];
  for (uint16_t op = 1; op <= 2; op++)
    for (uint16_t g = 0; g < GROUPS; g++)
      for (uint32_t i = 0; i < m->count; i++) {
        if (op_of(i) != op || group_of(i) != g)
          continue;
        uint64_t action = mix64((uint64_t)version << 32 | i) % 4;
        uint32_t key_bytes = key_of(i, key);
        int rc = 0;
        if (action < 2 || version == 1) {
          uint32_t bytes = value_of(i, version, value);
          rc = sl_store_put_state(txn, op, g, key, key_bytes, value, bytes);
          m->version[i] = version;
        } else if (action == 2) {
          rc = sl_store_delete_state(txn, op, g, key, key_bytes);
          m->version[i] = 0;
        }
        cr_assert_eq(rc, 0, "%s", sl_store_error(st));
      }
  cr_assert_eq(sl_store_commit(txn, version, "r", 1), 0, "%s",
               sl_store_error(st));
}

/* store_view.c note 3: chunks of 64 KiB or more are read from the file
 * into a buffer of their run, as far as the view's budget goes, the rest
 * in the map.  A base and three log runs of two operators, each run two
 * or three chunks of about 1 MB an operator: with the default budget,
 * with room for one run's buffer, and with none, every range read and a
 * compaction give the model's state. */
Test(store_chunks, large_chunks_are_read_as_copies) {
  model m;
  model_init(&m, 60000);
  sl_store_options o = writer_options(FINGERPRINT);
  o.no_sync = 1;
  sl_store *st = open_ok(root, &o);
  write_sorted_checkpoint(st, &m, 1); /* every key */
  sl_store_compaction stats;
  cr_assert_eq(sl_store_compact(st, 0, &stats), 0, "%s", sl_store_error(st));
  cr_assert_gt(stats.entries_written, 0);
  for (uint32_t version = 2; version <= 4; version++)
    write_sorted_checkpoint(st, &m, version);
  size_t budgets[3] = {SIZE_MAX, (size_t)1536 << 10, 0};
  uint64_t copies[3];
  for (int b = 0; b < 3; b++) {
    sl_store_test_view_copy_budget(budgets[b]);
    uint64_t before = sl_store_test_view_copies();
    check_all_ranges(st, &m);
    copies[b] = sl_store_test_view_copies() - before;
  }
  /* The whole-operator reads alone copy every chunk of each of the four
   * runs (two or more an operator); room for one buffer copies only its
   * run's; none copies nothing. */
  cr_assert_geq(copies[0], 2 * 4 * 2, "%llu copies",
                (unsigned long long)copies[0]);
  cr_assert(copies[1] > 0 && copies[1] < copies[0], "%llu of %llu copies",
            (unsigned long long)copies[1], (unsigned long long)copies[0]);
  cr_assert_eq(copies[2], 0);
  sl_store_test_view_copy_budget(SIZE_MAX);
  uint64_t before = sl_store_test_view_copies();
  cr_assert_eq(sl_store_compact(st, 0, &stats), 0, "%s", sl_store_error(st));
  cr_assert_gt(sl_store_test_view_copies(), before); /* it read copies */
  check_all_ranges(st, &m);
  sl_store_close(st);
  free(m.version);
}

/* ------------------------------------------------------------ steps */

static uint64_t live_entries(const model *m) {
  uint64_t live = 0;
  for (uint32_t i = 0; i < m->count; i++)
    live += m->version[i] != 0;
  return live;
}

/* The resume test's state: op 1, key group i % 16, key "k%07u" of i,
 * a 100-byte value of (i, version); sorted writes, so a chunk holds about
 * 8000 entries and 40000 entries take several chunks. */
#define RESUME_KEYS 40000u

static void resume_value(uint32_t i, uint32_t version, uint8_t *out) {
  memset(out, (int)(i * 13 + version), 100);
  memcpy(out, &i, sizeof i);
  memcpy(out + 4, &version, sizeof version);
}

/* Checkpoint version: every key with (i + version) % 3 != 0 put, the rest
 * deleted; model[i] is the version of i's value, 0 if absent. */
static void resume_checkpoint(sl_store *st, uint32_t *model_of,
                              uint32_t version) {
  sl_store_txn *txn;
  cr_assert_eq(sl_store_begin(st, &txn), 0);
  uint8_t value[100];
  for (uint32_t g = 0; g < 16; g++)
    for (uint32_t i = g; i < RESUME_KEYS; i += 16) {
      char key[16];
      uint32_t key_bytes = (uint32_t)snprintf(key, sizeof key, "k%07u", i);
      int rc;
      if ((i + version) % 3 != 0) {
        resume_value(i, version, value);
        rc = sl_store_put_state(txn, 1, (uint16_t)g, key, key_bytes, value,
                                sizeof value);
        model_of[i] = version;
      } else {
        rc = sl_store_delete_state(txn, 1, (uint16_t)g, key, key_bytes);
        model_of[i] = 0;
      }
      cr_assert_eq(rc, 0, "%s", sl_store_error(st));
    }
  cr_assert_eq(sl_store_commit(txn, version, "r", 1), 0, "%s",
               sl_store_error(st));
}

typedef struct resume_seen {
  const uint32_t *model_of;
  uint32_t entries, wrong;
} resume_seen;

static int resume_entry(void *arg, uint16_t key_group, const void *key,
                        uint32_t key_bytes, const void *value,
                        uint32_t value_bytes) {
  resume_seen *r = arg;
  char text[16] = {0};
  unsigned i = 0;
  memcpy(text, key, key_bytes < 15 ? key_bytes : 15);
  uint8_t expected[100];
  if (sscanf(text, "k%7u", &i) != 1 || i >= RESUME_KEYS || i % 16 != key_group ||
      r->model_of[i] == 0 || value_bytes != 100)
    r->wrong++;
  else {
    resume_value(i, r->model_of[i], expected);
    r->wrong += memcmp(expected, value, 100) != 0;
  }
  r->entries++;
  return 0;
}

static void resume_check(sl_store *st, const uint32_t *model_of) {
  resume_seen r = {.model_of = model_of};
  cr_assert_eq(sl_store_read_state(st, 1, 0, UINT16_MAX, resume_entry, &r), 0,
               "%s", sl_store_error(st));
  uint32_t live = 0;
  for (uint32_t i = 0; i < RESUME_KEYS; i++)
    live += model_of[i] != 0;
  cr_assert_eq(r.wrong, 0, "%u wrong entries", r.wrong);
  cr_assert_eq(r.entries, live);
}

/* Store.h note 3: a cancelled compaction ends its step at a chunk's end
 * and keeps what its steps wrote; a checkpoint commits meanwhile (its run
 * stays in the log); the next calls resume, and the merged view is the
 * model's throughout. */
Test(store_chunks, compaction_resumes_after_a_checkpoint) {
  sl_store_options o = writer_options(FINGERPRINT);
  o.no_sync = 1;
  static uint32_t model_of[RESUME_KEYS];
  sl_store *st = open_ok(root, &o);
  resume_checkpoint(st, model_of, 1);
  resume_checkpoint(st, model_of, 2);
  sl_store_test_compaction_step_bytes(16u << 10); /* a chunk a step */
  _Atomic int cancel = 1; /* seen between steps: after the first */
  sl_store_set_cancel(st, &cancel);
  sl_store_compaction stats;
  cr_assert_eq(sl_store_compact(st, 0, &stats), ECANCELED);
  cr_assert_eq(stats.entries_written, 0, "not finished");
  resume_check(st, model_of);
  resume_checkpoint(st, model_of, 3); /* between steps */
  sl_store_view view;
  cr_assert_eq(sl_store_read_view(st, &view, 0, 0), 0);
  free(view.graph);
  uint64_t logged3 = view.log_entries;
  resume_check(st, model_of);
  cr_assert_eq(sl_store_compact(st, 0, &stats), ECANCELED);
  resume_check(st, model_of);
  atomic_store(&cancel, 0);
  cr_assert_eq(sl_store_compact(st, 0, &stats), 0, "%s", sl_store_error(st));
  cr_assert_eq(stats.log_entries_read, 2 * RESUME_KEYS);
  resume_check(st, model_of);
  sl_store_set_cancel(st, 0);
  sl_store_close(st);
  uint64_t left = raw_meta_u64(root, "log_entries");
  cr_assert_eq(left, RESUME_KEYS, "checkpoint 3's run stays in the log");
  cr_assert_lt(left, logged3);
  cr_assert_eq(raw_meta_u64(root, "base"), 1);
  cr_assert_eq(raw_count(root, "state"), 0);
  st = open_ok(root, &o);
  resume_check(st, model_of);
  sl_store_close(st);
}

/* Store.h note 3: a process killed after some steps of a compaction
 * committed leaves a partial other base that every read ignores; the
 * next compaction clears it and ends with the same merged view. */
Test(store_chunks, crash_between_compaction_steps) {
  sl_store_options o = writer_options(FINGERPRINT);
  model m;
  model_init(&m, 6000);
  sl_store *st = open_ok(root, &o);
  for (uint32_t version = 1; version <= 3; version++)
    write_checkpoint(st, &m, version);
  sl_store_close(st);
  uint64_t logged = raw_meta_u64(root, "log_entries");
  uint64_t live = live_entries(&m);
  pid_t child = fork();
  cr_assert_geq(child, 0);
  if (child == 0) {
    char err[ERR_BYTES];
    sl_store_compaction stats;
    if (sl_store_open(root, &o, &st, err, sizeof err) != 0)
      _exit(2);
    sl_store_test_compaction_step_bytes(16u << 10);
    sl_store_test_crash_after(3 * live / 4); /* steps committed by then */
    sl_store_compact(st, 0, &stats);
    _exit(3);
  }
  int status = 0;
  cr_assert_eq(waitpid(child, &status, 0), child);
  cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
            "the child died by SIGKILL, not status %d", status);
  cr_assert_gt(raw_count(root, "state2"), 0, "a partial base was left");
  cr_assert_eq(raw_meta_u64(root, "base"), 0);
  cr_assert_eq(raw_meta_u64(root, "log_entries"), logged);
  st = open_ok(root, &o);
  check_all_ranges(st, &m);
  check_blob(st, 1, 0, 3);
  sl_store_compaction stats;
  cr_assert_eq(sl_store_compact(st, 0, &stats), 0, "%s", sl_store_error(st));
  cr_assert_eq(stats.entries_written, live);
  check_all_ranges(st, &m);
  sl_store_close(st);
  cr_assert_eq(raw_meta_u64(root, "base"), 1);
  cr_assert_eq(raw_meta_u64(root, "base_entries"), live);
  cr_assert_eq(raw_count(root, "log"), 0);
  free(m.version);
}

/* ------------------------------------------------------------ merging */

/* A log chunk's key (store.h note 1): u64 seq, u32 run, u16 op, u16 last
 * key group, u32 ordinal. */
#define LOG_KEY_TEST_BYTES 20u

static int count_entry(void *arg, uint16_t key_group, const void *key,
                       uint32_t key_bytes, const void *value,
                       uint32_t value_bytes) {
  (void)key_group, (void)key, (void)key_bytes, (void)value, (void)value_bytes;
  (*(uint32_t *)arg)++;
  return 0;
}

/* Key i of the merge tests: "k%05u" in key group i % 4. */
#define MERGE_KEYS 3000u
#define MERGE_GROUPS 4u

/* What run r of the merge tests does to key i: 0 leaves it, 1 puts
 * "r<r>-<i>", 2 deletes it.  Most keys are in most runs, so nearly every
 * key meets its older versions in the merge. */
static int merge_action(uint32_t r, uint32_t i) {
  uint64_t h = mix64((uint64_t)r << 32 | i) % 16;
  return h < 2 ? 0 : h < 14 ? 1 : 2;
}

/* Run r of the merge tests as one transaction (id r + 1) in store order:
 * by key group, then key. */
static void write_merge_run(sl_store *st, uint32_t r) {
  sl_store_txn *txn;
  cr_assert_eq(sl_store_begin(st, &txn), 0);
  for (uint32_t g = 0; g < MERGE_GROUPS; g++)
    for (uint32_t i = g; i < MERGE_KEYS; i += MERGE_GROUPS) {
      char key[16], value[24];
      snprintf(key, sizeof key, "k%05u", i);
      int length = snprintf(value, sizeof value, "r%u-%u", r, i);
      int action = merge_action(r, i), rc = 0;
      if (action == 1)
        rc = sl_store_put_state(txn, 6, (uint16_t)g, key, 6, value,
                                (uint32_t)length);
      else if (action == 2)
        rc = sl_store_delete_state(txn, 6, (uint16_t)g, key, 6);
      cr_assert_eq(rc, 0, "%s", sl_store_error(st));
    }
  cr_assert_eq(sl_store_commit(txn, r + 1, "r", 1), 0, "%s",
               sl_store_error(st));
}

/* The newest action of runs [0, runs) on key i: its run, or -1 if no
 * run touched it or the newest one deleted it. */
static int merge_newest_put(uint32_t runs, uint32_t i) {
  for (uint32_t r = runs; r-- > 0;) {
    int action = merge_action(r, i);
    if (action != 0)
      return action == 1 ? (int)r : -1;
  }
  return -1;
}

typedef struct merge_seen {
  uint32_t runs, entries, wrong, order;
  int last; /* the previous entry's key index, -1 before the first */
  uint16_t last_group;
} merge_seen;

static int merge_entry(void *arg, uint16_t key_group, const void *key,
                       uint32_t key_bytes, const void *value,
                       uint32_t value_bytes) {
  merge_seen *s = arg;
  char text[8] = {0}, expected[24];
  unsigned i = MERGE_KEYS;
  memcpy(text, key, key_bytes < 7 ? key_bytes : 7);
  if (key_bytes != 6 || sscanf(text, "k%5u", &i) != 1 || i >= MERGE_KEYS ||
      key_group != i % MERGE_GROUPS) {
    s->wrong++;
    return 0;
  }
  int newest = merge_newest_put(s->runs, i);
  int length = snprintf(expected, sizeof expected, "r%d-%u", newest, i);
  if (newest < 0 || value_bytes != (uint32_t)length ||
      memcmp(value, expected, value_bytes) != 0)
    s->wrong++;
  if (s->last >= 0 && (key_group < s->last_group ||
                       (key_group == s->last_group && (int)i <= s->last)))
    s->order++;
  s->last = (int)i;
  s->last_group = key_group;
  s->entries++;
  return 0;
}

/* read_state of groups [first, last] after `runs` runs: exactly the keys
 * whose newest version is a put, with it, in order. */
static void check_merge(sl_store *st, uint32_t runs, uint16_t first,
                        uint16_t last) {
  merge_seen s = {.runs = runs, .last = -1};
  int rc = sl_store_read_state(st, 6, first, last, merge_entry, &s);
  cr_assert_eq(rc, 0, "%s", sl_store_error(st));
  uint32_t expected = 0;
  for (uint32_t i = 0; i < MERGE_KEYS; i++)
    expected += merge_newest_put(runs, i) >= 0 && i % MERGE_GROUPS >= first &&
                i % MERGE_GROUPS <= last;
  cr_assert_eq(s.wrong, 0, "%u runs: %u wrong entries", runs, s.wrong);
  cr_assert_eq(s.order, 0, "%u runs: %u out of order", runs, s.order);
  cr_assert_eq(s.entries, expected, "%u runs, groups [%u, %u]: %u entries, "
               "not %u", runs, first, last, s.entries, expected);
}

/* store_view.c notes 1c and 1d: 2 to 9 runs (a base and log runs, or log
 * runs only), each holding most keys: two in the two-way merge, more in
 * the tournament, where equal keys meet in every match of the tree, at
 * every power of two and between; the newest version wins, older ones and
 * tombstones emit nothing, and a range of groups reads only its keys. */
Test(store_chunks, merges_of_many_overlapping_runs) {
  sl_store_options o = writer_options(FINGERPRINT);
  o.no_sync = 1;
  for (uint32_t runs = 2; runs <= 9; runs++) {
    char dir[PATH_MAX];
    char name[16];
    snprintf(name, sizeof name, "runs-%u", runs);
    path_in_root(dir, name);
    sl_store *st = open_ok(dir, &o);
    for (uint32_t r = 0; r < runs; r++) {
      write_merge_run(st, r);
      if (r == 0 && runs % 2 == 1) { /* odd counts: run 0 is the base */
        sl_store_compaction stats;
        cr_assert_eq(sl_store_compact(st, 0, &stats), 0, "%s",
                     sl_store_error(st));
        cr_assert_gt(stats.entries_written, 0);
      }
    }
    check_merge(st, runs, 0, UINT16_MAX);
    check_merge(st, runs, 1, 2);
    check_merge(st, runs, 3, 3);
    sl_store_close(st);
  }
}

/* Stops the read after 10 entries, returning 77. */
static int stop_after_ten(void *arg, uint16_t key_group, const void *key,
                          uint32_t key_bytes, const void *value,
                          uint32_t value_bytes) {
  uint32_t *entries = arg;
  count_entry(arg, key_group, key, key_bytes, value, value_bytes);
  return *entries == 10 ? 77 : 0;
}

/* store_view.c note 1c's two-way merge, in the shape a restore after one
 * checkpoint past a compaction reads: a base and one log run.  Newest wins
 * and tombstones as in the model; a callback's stop comes back as is; a
 * flipped byte in either run's chunk is SL_ECORRUPT naming it. */
Test(store_chunks, two_runs_a_base_and_a_log_run) {
  sl_store_options o = writer_options(FINGERPRINT);
  o.no_sync = 1;
  char dir[PATH_MAX];
  path_in_root(dir, "two");
  sl_store *st = open_ok(dir, &o);
  sl_store_compaction stats;
  write_merge_run(st, 0);
  cr_assert_eq(sl_store_compact(st, 0, &stats), 0, "%s", sl_store_error(st));
  write_merge_run(st, 1);
  uint64_t base = 0, log = 0;
  cr_assert_eq(sl_store_entry_counts(st, &base, &log), 0);
  cr_assert_gt(base, 0);
  cr_assert_gt(log, 0);
  check_merge(st, 2, 0, UINT16_MAX);
  check_merge(st, 2, 1, 2);
  check_merge(st, 2, 3, 3);
  uint32_t entries = 0;
  cr_assert_eq(sl_store_read_state(st, 6, 0, UINT16_MAX, stop_after_ten,
                                   &entries), 77);
  cr_assert_eq(entries, 10);
  sl_store_close(st);

  /* Damage in the log run, then (another store) in the base. */
  const char *damaged_db[2] = {"log", "state2"};
  for (int which = 0; which < 2; which++) {
    path_in_root(dir, damaged_db[which]);
    st = open_ok(dir, &o);
    write_damage_case(st, 1);
    cr_assert_eq(sl_store_compact(st, 0, &stats), 0, "%s",
                 sl_store_error(st));
    write_damage_case(st, 2);
    sl_store_close(st);
    raw_flip_first(dir, damaged_db[which], 4321);
    st = open_ok(dir, &o);
    char text[512] = {0};
    cr_assert_eq(sl_store_read_state(st, 3, 0, UINT16_MAX, text_entry, text),
                 SL_ECORRUPT, "damage in %s", damaged_db[which]);
    char named[64];
    snprintf(named, sizeof named, "database %s", damaged_db[which]);
    assert_contains(sl_store_error(st), named);
    assert_contains(sl_store_error(st), "fails its checksum");
    expect_text_of(st, 4, "7:k=v;");
    sl_store_close(st);
  }
}

/* The log chunks of one run, read raw: the first two (key and value). */
typedef struct raw_chunks {
  size_t count;
  uint8_t key[2][LOG_KEY_TEST_BYTES];
  uint8_t *value[2];
  size_t value_bytes[2];
} raw_chunks;

static void collect_first_two(void *arg, const MDB_val *key,
                              const MDB_val *value) {
  raw_chunks *c = arg;
  if (c->count < 2) {
    cr_assert_eq(key->mv_size, LOG_KEY_TEST_BYTES);
    memcpy(c->key[c->count], key->mv_data, key->mv_size);
    c->value[c->count] = malloc(value->mv_size);
    cr_assert_not_null(c->value[c->count]);
    memcpy(c->value[c->count], value->mv_data, value->mv_size);
    c->value_bytes[c->count] = value->mv_size;
  }
  c->count++;
}

/* store_view.c note 1e: a run whose second chunk holds keys below its
 * first's — each chunk intact, its checksum right (the two chunks'
 * payloads swapped and checksummed again under the other's key) — is
 * SL_ECORRUPT naming the chunk, not keys handed out of order. */
Test(store_chunks, a_run_out_of_order_across_chunks) {
  sl_store_options o = writer_options(FINGERPRINT);
  o.no_sync = 1;
  sl_store *st = open_ok(root, &o);
  sl_store_txn *txn;
  cr_assert_eq(sl_store_begin(st, &txn), 0);
  static uint8_t value[700];
  for (uint32_t k = 0; k < 3000; k++) { /* about 2.1 MB: three chunks */
    uint8_t key[4] = {(uint8_t)(k >> 24), (uint8_t)(k >> 16),
                      (uint8_t)(k >> 8), (uint8_t)k};
    memset(value, (int)k, sizeof value);
    cr_assert_eq(sl_store_put_state(txn, 3, 7, key, 4, value, sizeof value),
                 0);
  }
  cr_assert_eq(sl_store_commit(txn, 1, "r", 1), 0, "%s", sl_store_error(st));
  uint32_t entries = 0;
  cr_assert_eq(sl_store_read_state(st, 3, 0, UINT16_MAX, count_entry,
                                   &entries), 0);
  cr_assert_eq(entries, 3000);
  sl_store_close(st);

  raw_chunks c = {0};
  raw_each(root, "log", collect_first_two, &c);
  cr_assert_eq(c.count, 3, "%zu chunks", c.count);
  for (int i = 0; i < 2; i++) {
    const uint8_t *payload = c.value[1 - i];
    size_t payload_bytes = c.value_bytes[1 - i] - SL_STORE_CHECKSUM_BYTES;
    uint8_t *swapped = malloc(payload_bytes + SL_STORE_CHECKSUM_BYTES);
    cr_assert_not_null(swapped);
    memcpy(swapped, payload, payload_bytes);
    uint64_t sum = format_checksum(5, c.key[i], LOG_KEY_TEST_BYTES, payload,
                                   payload_bytes);
    for (int b = 0; b < 8; b++)
      swapped[payload_bytes + b] = (uint8_t)(sum >> (8 * b));
    raw_put(root, "log", c.key[i], LOG_KEY_TEST_BYTES, swapped,
            payload_bytes + SL_STORE_CHECKSUM_BYTES);
    free(swapped);
  }
  free(c.value[0]);
  free(c.value[1]);

  st = open_ok(root, &o);
  entries = 0;
  cr_assert_eq(sl_store_read_state(st, 3, 0, UINT16_MAX, count_entry,
                                   &entries), SL_ECORRUPT);
  assert_contains(sl_store_error(st), "database log, seq 1 run 0 chunk 1");
  assert_contains(sl_store_error(st), "not above the run's chunk before");
  sl_store_close(st);
}
