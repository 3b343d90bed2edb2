/* test_store_counts.c — damage that reads as a different, valid state:
 * a chunk key (log or base) whose operator field was damaged with the
 * keys' order intact, so LMDB and lmdb_check.c find nothing wrong and the
 * chunk seems to belong to another operator (storage/store_view.c note
 * 1f).  Before that note covered it, a reader of the chunk's own operator
 * seeked past it and read the rest of the state with no error: a restore
 * lost the chunk's state silently when the operator the key named was not
 * in the graph.
 *
 * Each test writes a real store through the store API (several operators
 * in one run, several runs, or a compacted base), finds the live chunk
 * keys by walking the file with LMDB itself (their offsets in the map are
 * their offsets in data.mdb), flips the bytes of one key's operator in
 * the file, and reads through a read-only open, as a restore does (the
 * open walks the file with lmdb_check.c first: the damaged file passes
 * it).  Every read whose range holds any of the chunk's state must be
 * SL_ECORRUPT, naming the file, the database, the key and the head's
 * real operator; a read that is not must return exactly the undamaged
 * count or SL_ECORRUPT.  Undamaged, every range reads its exact count.
 *
 * Beside them, the older of LMDB's two meta pages with its txnid raised
 * by 2, which made LMDB open the snapshot before the last commit as if it
 * were the newest (store.c note 5): refused when the last commit grew
 * the file.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <lmdb.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sluice.h"
#include "store.h"
#include "store_read.h"
#include "test_dirs.h"

/* The key groups every operator writes in the first checkpoint, one key
 * each; a second checkpoint rewrites the lower half (GROUP_FIRST ..
 * GROUP_HALF), so its run overlays the first's. */
#define GROUP_FIRST 10u
#define GROUP_LAST 20u
#define GROUP_HALF 14u
#define LOG_OP_AT 12u  /* a log key: u64 seq, u32 run, u16 op, ... */
#define BASE_OP_AT 0u  /* a base key: u16 op, u16 last group, u32 ordinal */
#define OPS_MAX 4

typedef struct store_plan {
  uint16_t ops[OPS_MAX]; /* the operators written, ascending */
  int op_count;
  bool second;  /* a second checkpoint over the lower half */
  bool compact; /* then compact all of it into the base */
  uint32_t big_bytes; /* > 0: op ops[1]'s values at every other group are
                         this big, so it fills several chunks */
} store_plan;

static void put(sl_store_txn *txn, sl_store *st, uint16_t op, uint16_t group,
                uint32_t version, uint32_t value_bytes, uint8_t *value) {
  uint32_t key = (uint32_t)op << 16 | group;
  memset(value, 0xa5, value_bytes);
  memcpy(value, &version, sizeof version);
  cr_assert_eq(sl_store_put_state(txn, op, group, &key, sizeof key, value,
                                  value_bytes),
               0, "%s", sl_store_error(st));
}

/* A fresh store in dir written as plan says. */
static void build_store(const char *dir, const store_plan *plan) {
  sl_store *st = store_open_writer(dir);
  uint32_t largest = plan->big_bytes > 16 ? plan->big_bytes : 16;
  uint8_t *value = malloc(largest);
  cr_assert(value);
  for (uint32_t cp = 1; cp <= (plan->second ? 2u : 1u); cp++) {
    sl_store_txn *txn;
    cr_assert_eq(sl_store_begin(st, &txn), 0, "%s", sl_store_error(st));
    for (int i = 0; i < plan->op_count; i++) {
      uint16_t op = plan->ops[i];
      for (uint16_t g = GROUP_FIRST; g <= (cp == 1 ? GROUP_LAST : GROUP_HALF);
           g++) {
        bool big = i == 1 && plan->big_bytes > 0 && g % 2 == 0;
        put(txn, st, op, g, cp, big ? plan->big_bytes : 16, value);
      }
    }
    cr_assert_eq(sl_store_commit(txn, cp, "r", 1), 0, "%s",
                 sl_store_error(st));
  }
  if (plan->compact) {
    sl_store_compaction stats;
    cr_assert_eq(sl_store_compact(st, 0, &stats), 0, "%s",
                 sl_store_error(st));
    cr_assert_gt(stats.entries_written, 0);
  }
  free(value);
  sl_store_close(st);
}

/* A live chunk key in data.mdb: its offset in the file and its chunk's
 * key groups (from the head, which the damage leaves alone). */
typedef struct chunk_at {
  size_t at;
  uint16_t first, last;
} chunk_at;

/* The live keys of database db whose operator (the u16 at op_at) is op,
 * in key order, into out (up to max); their count.  A key lies in its
 * leaf page, which the map holds at a multiple of the page size and whose
 * header starts with its page number (u64, native order): that gives the
 * key's offset in the file. */
static size_t op_keys(const char *dir, const char *db, size_t op_at,
                      uint16_t op, chunk_at *out, size_t max) {
  MDB_env *env;
  cr_assert_eq(mdb_env_create(&env), 0);
  cr_assert_eq(mdb_env_set_maxdbs(env, 8), 0);
  int rc = mdb_env_open(env, dir, MDB_RDONLY | MDB_NOLOCK, 0644);
  cr_assert_eq(rc, 0, "%s: %s", dir, mdb_strerror(rc));
  MDB_stat env_stat;
  cr_assert_eq(mdb_env_stat(env, &env_stat), 0);
  uintptr_t page_bytes = env_stat.ms_psize;
  cr_assert_eq(page_bytes & (page_bytes - 1), 0);
  MDB_txn *txn;
  MDB_dbi dbi;
  MDB_cursor *cursor;
  cr_assert_eq(mdb_txn_begin(env, 0, MDB_RDONLY, &txn), 0);
  cr_assert_eq(mdb_dbi_open(txn, db, 0, &dbi), 0, "no database %s", db);
  cr_assert_eq(mdb_cursor_open(txn, dbi, &cursor), 0);
  size_t count = 0;
  MDB_val key, value;
  for (rc = mdb_cursor_get(cursor, &key, &value, MDB_FIRST); rc == 0;
       rc = mdb_cursor_get(cursor, &key, &value, MDB_NEXT)) {
    const uint8_t *k = key.mv_data, *v = value.mv_data;
    cr_assert_geq(key.mv_size, op_at + 2);
    cr_assert_geq(value.mv_size, 6);
    if ((uint16_t)(k[op_at] << 8 | k[op_at + 1]) != op)
      continue;
    cr_assert_lt(count, max);
    /* The head: u16 op, u16 first group, u16 last group, little-endian. */
    uintptr_t within = (uintptr_t)k & (page_bytes - 1);
    uint64_t page;
    memcpy(&page, k - within, sizeof page);
    out[count++] = (chunk_at){
        .at = (size_t)(page * page_bytes + within),
        .first = (uint16_t)(v[2] | v[3] << 8),
        .last = (uint16_t)(v[4] | v[5] << 8)};
  }
  cr_assert_eq(rc, MDB_NOTFOUND);
  mdb_cursor_close(cursor);
  mdb_txn_abort(txn);
  mdb_env_close(env);
  return count;
}

/* XORs the byte at offset `at` of dir/data.mdb with mask (twice undoes it). */
static void flip(const char *dir, size_t at, uint8_t mask) {
  char *path = sl_test_path_in(dir, "data.mdb");
  int fd = open(path, O_RDWR);
  cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
  uint8_t byte;
  cr_assert_eq(pread(fd, &byte, 1, (off_t)at), 1);
  byte ^= mask;
  cr_assert_eq(pwrite(fd, &byte, 1, (off_t)at), 1);
  close(fd);
  free(path);
}

/* The entries op holds in groups [first, last], undamaged. */
static uint64_t expected(uint16_t first, uint16_t last) {
  uint64_t n = 0;
  for (uint32_t g = GROUP_FIRST; g <= GROUP_LAST; g++)
    n += g >= first && g <= last;
  return n;
}

/* Reads used by every test: whole operators, a start inside the groups,
 * an end inside them, one group, and ranges beside the keys. */
static const struct {
  uint16_t first, last;
} ranges[] = {
    {0, UINT16_MAX}, {0, 12}, {13, 30}, {15, 15}, {21, 100}, {0, 9},
};
#define RANGE_COUNT (sizeof ranges / sizeof ranges[0])

static void assert_undamaged(const char *dir, const store_plan *plan) {
  char err[1024];
  for (int i = 0; i < plan->op_count; i++)
    for (size_t r = 0; r < RANGE_COUNT; r++) {
      uint64_t entries;
      int rc = store_read_range(dir, plan->ops[i], ranges[r].first, ranges[r].last,
                          &entries, err, sizeof err);
      cr_assert_eq(rc, 0, "op %u %u..%u: %s", plan->ops[i], ranges[r].first,
                   ranges[r].last, err);
      cr_assert_eq(entries, expected(ranges[r].first, ranges[r].last),
                   "op %u %u..%u: %" PRIu64 " entries", plan->ops[i],
                   ranges[r].first, ranges[r].last, entries);
    }
}

/* After the damage to a chunk of op victim holding groups [first, last]:
 * a read of victim whose range meets them is SL_ECORRUPT naming the
 * directory, db and the head's operator; every other read is exact or
 * SL_ECORRUPT (a neighbour's read may meet the damaged head too: a
 * refusal, never a wrong answer). */
static void assert_damage_refused(const char *dir, const store_plan *plan,
                                  uint16_t victim, const chunk_at *chunk,
                                  const char *db) {
  char err[1024], head[64];
  snprintf(head, sizeof head, "(head: op %u,", victim);
  for (int i = 0; i < plan->op_count; i++)
    for (size_t r = 0; r < RANGE_COUNT; r++) {
      uint16_t first = ranges[r].first, last = ranges[r].last;
      uint64_t entries, want = expected(first, last);
      int rc = store_read_range(dir, plan->ops[i], first, last, &entries, err,
                          sizeof err);
      if (plan->ops[i] == victim && first <= chunk->last &&
          last >= chunk->first) {
        cr_assert_eq(rc, SL_ECORRUPT,
                     "op %u %u..%u: rc %d, %" PRIu64 " entries (of %" PRIu64
                     "): %s", victim, first, last, rc, entries, want, err);
      } else if (rc == 0) {
        cr_assert_eq(entries, want, "op %u %u..%u: %" PRIu64 " entries",
                     plan->ops[i], first, last, entries);
        continue;
      }
      cr_assert_eq(rc, SL_ECORRUPT, "op %u: rc %d: %s", plan->ops[i], rc,
                   err);
      cr_assert(strstr(err, "data.mdb is damaged"), "%s", err);
      cr_assert(strstr(err, db), "%s", err);
      cr_assert(strstr(err, dir), "%s", err);
      /* The only chunk that disagrees is the victim's, whose head names
       * its real operator. */
      cr_assert(strstr(err, head), "%s", err);
    }
}

/* One case: build, check, damage the key of the chunk `which` (0: the
 * first; -1: the last) of op victim in the log or, base, in the current
 * base by XOR mask on its operator's low byte, check, undo, check again. */
static void run_case(const store_plan *plan, bool base, uint16_t victim,
                     int which, uint8_t mask) {
  char *root = sl_test_temp_dir("store-counts");
  char *dir = sl_test_path_in(root, "state");
  build_store(dir, plan);
  assert_undamaged(dir, plan);
  size_t op_at = base ? BASE_OP_AT : LOG_OP_AT;
  chunk_at at[64];
  /* The current base: the one that holds chunks (a compaction empties
   * the other). */
  const char *db = base ? "state" : "log";
  size_t count = op_keys(dir, db, op_at, victim, at, 64);
  if (base && count == 0)
    count = op_keys(dir, db = "state2", op_at, victim, at, 64);
  cr_assert_gt(count, 0, "op %u has no chunk in %s", victim, db);
  chunk_at chosen = at[which < 0 ? count - 1 : (size_t)which];
  flip(dir, chosen.at + op_at + 1, mask);
  /* The damage moved the chunk to another operator and kept the key
   * order (else lmdb_check refuses the open, which read_range asserts
   * against). */
  cr_assert_eq(op_keys(dir, db, op_at, victim, at, 64), count - 1);
  char named[32];
  snprintf(named, sizeof named, "database %s,", db);
  assert_damage_refused(dir, plan, victim, &chosen, named);
  flip(dir, chosen.at + op_at + 1, mask);
  assert_undamaged(dir, plan);
  free(dir);
  sl_test_remove_tree(root); /* frees root */
}

TestSuite(store_counts, .timeout = 120);

/* The lead case: the chunk of op 3 between ops 1 and 5 in one run, its
 * key's operator damaged to 2, which the job may not have. */
Test(store_counts, log_operator_down) {
  store_plan plan = {.ops = {1, 3, 5}, .op_count = 3};
  run_case(&plan, false, 3, 0, 0x01); /* 3 -> 2 */
}

/* The same chunk moved up, to op 4: met by the read's own choice. */
Test(store_counts, log_operator_up) {
  store_plan plan = {.ops = {1, 3, 5}, .op_count = 3};
  run_case(&plan, false, 3, 0, 0x07); /* 3 -> 4 */
}

/* The log's last chunk: a seek for op 3 finds nothing after it. */
Test(store_counts, log_operator_down_last_chunk) {
  store_plan plan = {.ops = {1, 3}, .op_count = 2};
  run_case(&plan, false, 3, 0, 0x01); /* 3 -> 2 */
}

/* The run's first chunk: nothing of the run before it. */
Test(store_counts, log_operator_down_first_chunk) {
  store_plan plan = {.ops = {3, 5}, .op_count = 2};
  run_case(&plan, false, 3, 0, 0x03); /* 3 -> 0 */
}

/* Op 3 in several chunks: its first moved down below them. */
Test(store_counts, log_operator_down_of_several_chunks) {
  store_plan plan = {.ops = {1, 3, 5}, .op_count = 3,
                     .big_bytes = 600u << 10};
  run_case(&plan, false, 3, 0, 0x01); /* 3 -> 2 */
}

/* Op 3 in several chunks: its last moved up past them. */
Test(store_counts, log_operator_up_of_several_chunks) {
  store_plan plan = {.ops = {1, 3, 5}, .op_count = 3,
                     .big_bytes = 600u << 10};
  run_case(&plan, false, 3, -1, 0x07); /* 3 -> 4 */
}

/* Two runs: the older run's chunk moved, the newer one still holding the
 * lower half, so a silent read would have returned 5 of 11 keys. */
Test(store_counts, log_operator_down_older_run) {
  store_plan plan = {.ops = {1, 3, 5}, .op_count = 3, .second = true};
  run_case(&plan, false, 3, 0, 0x01); /* 3 -> 2: seq 1's chunk, first */
}

/* The same in the newer run. */
Test(store_counts, log_operator_down_newer_run) {
  store_plan plan = {.ops = {1, 3, 5}, .op_count = 3, .second = true};
  run_case(&plan, false, 3, -1, 0x01); /* 3 -> 2: seq 2's chunk */
}

/* The base after a compaction. */
Test(store_counts, base_operator_down) {
  store_plan plan = {.ops = {1, 3, 5}, .op_count = 3, .second = true,
                     .compact = true};
  run_case(&plan, true, 3, 0, 0x01); /* 3 -> 2 */
}

Test(store_counts, base_operator_up) {
  store_plan plan = {.ops = {1, 3, 5}, .op_count = 3, .second = true,
                     .compact = true};
  run_case(&plan, true, 3, 0, 0x07); /* 3 -> 4 */
}

Test(store_counts, base_operator_down_of_several_chunks) {
  store_plan plan = {.ops = {1, 3, 5}, .op_count = 3, .compact = true,
                     .big_bytes = 600u << 10};
  run_case(&plan, true, 3, 0, 0x01); /* 3 -> 2 */
}

/* ------------------------------------------------------------ meta pages */

/* The u64 at offset `at` of meta page `page` of dir/data.mdb (native
 * order), read or, with put, written. */
static uint64_t meta_u64(const char *dir, int page, size_t at, bool put,
                         uint64_t value) {
  char *path = sl_test_path_in(dir, "data.mdb");
  int fd = open(path, O_RDWR);
  cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
  /* The free list's record starts at 16 + 24; its first u32 is the page
   * size (lmdb_check.h note 1). */
  uint32_t page_bytes = 0;
  cr_assert_eq(pread(fd, &page_bytes, sizeof page_bytes, 16 + 24), 4);
  cr_assert(page_bytes >= 512 && (page_bytes & (page_bytes - 1)) == 0);
  off_t offset = (off_t)page * page_bytes + (off_t)at;
  if (put)
    cr_assert_eq(pwrite(fd, &value, sizeof value, offset), 8);
  else
    cr_assert_eq(pread(fd, &value, sizeof value, offset), 8);
  close(fd);
  free(path);
  return value;
}

#define META_LAST_PAGE_AT (16 + 120) /* after the header: ... u64 last page */
#define META_TXNID_AT (16 + 128)     /* ... then u64 txnid */

static int open_latest(const char *dir, bool read_only, uint64_t *latest,
                       char *err, size_t err_bytes) {
  sl_store *st;
  sl_store_options o = {.graph_fingerprint = "g", .no_sync = 1,
                        .read_only = read_only};
  int rc = sl_store_open(dir, &o, &st, err, err_bytes);
  if (rc == 0) {
    *latest = sl_store_latest(st);
    sl_store_close(st);
  }
  return rc;
}

/* The older meta page's txnid damaged upwards by 2 (same page, one above
 * the newest's) made LMDB open the snapshot before the last commit:
 * checkpoint 1 of 2, with no error.  The last commit grew the file, so the
 * older meta reaches past the other's last page (store.c note 5). */
Test(store_counts, older_meta_txnid_raised) {
  char *root = sl_test_temp_dir("store-counts");
  char *dir = sl_test_path_in(root, "state");
  store_plan plan = {.ops = {1, 3}, .op_count = 2};
  build_store(dir, &plan);
  {
    sl_store *st = store_open_writer(dir);
    sl_store_txn *txn;
    cr_assert_eq(sl_store_begin(st, &txn), 0);
    static uint8_t big[2u << 20]; /* new overflow pages: the file grows */
    uint32_t key = 7;
    cr_assert_eq(sl_store_put_state(txn, 1, 7, &key, sizeof key, big,
                                    sizeof big), 0, "%s", sl_store_error(st));
    cr_assert_eq(sl_store_commit(txn, 2, "r", 1), 0, "%s", sl_store_error(st));
    sl_store_close(st);
  }
  uint64_t txnid[2], last[2];
  for (int page = 0; page < 2; page++) {
    txnid[page] = meta_u64(dir, page, META_TXNID_AT, false, 0);
    last[page] = meta_u64(dir, page, META_LAST_PAGE_AT, false, 0);
  }
  int newest = txnid[1] > txnid[0];
  cr_assert_eq(txnid[newest], txnid[!newest] + 1);
  cr_assert_gt(last[newest], last[!newest], "the last commit grew the file");
  char err[1024];
  uint64_t latest = 0;
  cr_assert_eq(open_latest(dir, true, &latest, err, sizeof err), 0, "%s", err);
  cr_assert_eq(latest, 2);
  meta_u64(dir, !newest, META_TXNID_AT, true, txnid[!newest] + 2);
  for (int read_only = 1; read_only >= 0; read_only--) {
    latest = 0;
    int rc = open_latest(dir, read_only, &latest, err, sizeof err);
    cr_assert_eq(rc, SL_ECORRUPT, "read_only %d: rc %d, latest %" PRIu64
                 ": %s", read_only, rc, latest, err);
    cr_assert(strstr(err, "data.mdb is damaged: meta page"), "%s", err);
    cr_assert(strstr(err, dir), "%s", err);
  }
  /* Undone, the store is whole again, and a writer may go on. */
  meta_u64(dir, !newest, META_TXNID_AT, true, txnid[!newest]);
  cr_assert_eq(open_latest(dir, false, &latest, err, sizeof err), 0, "%s",
               err);
  cr_assert_eq(latest, 2);
  uint64_t entries = 0;
  cr_assert_eq(store_read_range(dir, 3, 0, UINT16_MAX, &entries, err, sizeof err),
               0, "%s", err);
  cr_assert_eq(entries, expected(0, UINT16_MAX));
  free(dir);
  sl_test_remove_tree(root); /* frees root */
}
