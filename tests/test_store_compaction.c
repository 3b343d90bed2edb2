/* test_store_compaction.c — Criterion tests of the store's compaction
 * (storage/store_view.c, store.h note 3): the merged view against a model
 * over random transactions, the threshold and the flip of the base, a
 * full map, a crash inside a compaction (a forked child killed in the
 * middle), and cancellation.  Fixture and model: test_store.h.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <limits.h>
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
#include "store.h"
#include "test_store.h"

TestSuite(store, .init = make_root, .fini = remove_root, .timeout = 60);

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

/* What the store should hold beside the model: the log's entries (meta
 * "log_entries") and the base's. */
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
  /* The log holds every change but one that directly follows a change of
   * the same key, which replaces it (store_txn.c note 3). */
  for (uint32_t k = 0; k < count; k++) {
    m->version[changes[k].index] = changes[k].version;
    counts->log_entries +=
        k == 0 || changes[k].index != changes[k - 1].index;
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
                stats.entries_written * (9 + 9)); /* entry head, key */
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
  sl_store *st = first_checkpoint(&m, 400);
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
  cr_assert_eq(raw_meta_u64(root, "log_entries"), logged);
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
      bytes += 9 + 9 + value_of(i, m.version[i], value); /* head, key */
  /* One chunk per operator: a head and a checksum each. */
  cr_assert_eq(stats.bytes_written, bytes + 2 * (12 + SL_STORE_CHECKSUM_BYTES));
  cr_assert_lt(stats.duration_us, 60000000u);
  check_all_ranges(st, &m);
  check_record(st, 1); /* records and blobs are not touched */
  check_blob(st, 1, 1, 1);
  sl_store_close(st);
  cr_assert_eq(raw_meta_u64(root, "log_entries"), 0);
  cr_assert_eq(raw_count(root, "state"), 0);
  cr_assert_eq(raw_meta_u64(root, "base_entries"), live);
  cr_assert_eq(raw_meta_u64(root, "base"), 1);

  /* A log smaller than the base stays, whatever the threshold. */
  st = open_ok(root, &o);
  cr_assert_eq(sl_store_begin(st, &txn), 0);
  cr_assert_eq(sl_store_put_state(txn, 1, 0, "new", 3, "v", 1), 0);
  cr_assert_eq(sl_store_commit(txn, 2, 0, 0), 0);
  cr_assert_eq(sl_store_compact(st, 0, &stats), 0);
  cr_assert_eq(stats.log_entries_read, 0);
  sl_store_close(st);
  cr_assert_eq(raw_meta_u64(root, "log_entries"), 1);

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
  cr_assert_eq(raw_meta_u64(root, "log_entries"), 0);
  cr_assert_eq(raw_count(root, "state2"), 0);
  cr_assert_eq(raw_meta_u64(root, "base_entries"), live_entries(&m));
  cr_assert_gt(raw_count(root, "state"), 0);
  cr_assert_eq(raw_meta_u64(root, "base"), 0);

  sl_store_options ro = {.read_only = 1};
  st = open_ok(root, &ro);
  cr_assert_eq(sl_store_compact(st, 0, &stats), EACCES);
  check_all_ranges(st, &m);
  sl_store_close(st);
  free(m.version);
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
  cr_assert_eq(raw_meta_u64(root, "log_entries"), written, "the log is intact");
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
  cr_assert_eq(raw_meta_u64(root, "log_entries"), per_checkpoint);
  cr_assert_eq(raw_meta_u64(root, "base_entries"), written);
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
  uint64_t live = live_entries(&m), logged = raw_meta_u64(root, "log_entries");
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
    cr_assert_eq(raw_meta_u64(root, "log_entries"), logged);
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

/* Checkpoint 1 of st: 20000 entries of 200 bytes in the log, about 4
 * chunks, so a compaction takes several 4096-entry looks at its cancel. */
static void log_20000_entries(sl_store *st) {
  sl_store_txn *txn;
  cr_assert_eq(sl_store_begin(st, &txn), 0);
  uint8_t value[200] = {0}; /* 20000 of them: about 4 chunks */
  for (uint32_t k = 0; k < 20000; k++) {
    uint8_t key[12] = {0};
    memcpy(key, &k, sizeof k);
    memcpy(value, &k, sizeof k);
    cr_assert_eq(sl_store_put_state(txn, 1, (uint16_t)(k % 4), key,
                                    sizeof key, value, sizeof value), 0);
  }
  cr_assert_eq(sl_store_commit(txn, 1, "r", 1), 0, "%s", sl_store_error(st));
}

/* A set cancel flag stops a compaction with ECANCELED at the end of the
 * chunk it is writing (its steps stay, the merged view is unchanged);
 * cleared, the same compaction resumes and ends. */
Test(store, compaction_can_be_cancelled) {
  sl_store_options o = writer_options(FINGERPRINT);
  sl_store *st = open_ok(root, &o);
  log_20000_entries(st);
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
  cr_expect_eq(raw_meta_u64(root, "log_entries"), 0);
  cr_expect_eq(raw_meta_u64(root, "base_entries"), 20000);
}


/* SL_STORE_CANCEL_ABANDON gives the step under way up, uncommitted: the
 * new base stays empty, where a plain cancel commits the chunk it was
 * writing; either way the next call compacts everything. */
Test(store, a_compaction_can_be_given_up_uncommitted) {
  sl_store_options o = writer_options(FINGERPRINT);
  sl_store *st = open_ok(root, &o);
  log_20000_entries(st);
  _Atomic int cancel = SL_STORE_CANCEL_ABANDON;
  sl_store_set_cancel(st, &cancel);
  sl_store_compaction stats;
  cr_expect_eq(sl_store_compact(st, 0, &stats), ECANCELED);
  cr_expect(strstr(sl_store_error(st), "given up"), "%s", sl_store_error(st));
  sl_store_set_cancel(st, 0);
  sl_store_close(st);
  cr_expect_eq(raw_count(root, "state2"), 0, "nothing of the step stays");
  cr_expect_eq(raw_meta_u64(root, "log_entries"), 20000);
  st = open_ok(root, &o); /* a plain cancel keeps a chunk */
  atomic_store(&cancel, 1);
  sl_store_set_cancel(st, &cancel);
  cr_expect_eq(sl_store_compact(st, 0, &stats), ECANCELED);
  sl_store_set_cancel(st, 0);
  sl_store_close(st);
  cr_expect_gt(raw_count(root, "state2"), 0, "the cancelled step committed");
  st = open_ok(root, &o);
  cr_expect_eq(sl_store_compact(st, 0, &stats), 0, "%s", sl_store_error(st));
  uint64_t bound = 0;
  cr_assert_eq(sl_store_entry_bound(st, &bound), 0);
  cr_expect_eq(bound, 20000, "all in the base after it");
  sl_store_close(st);
  cr_expect_eq(raw_meta_u64(root, "log_entries"), 0);
  cr_expect_eq(raw_meta_u64(root, "base_entries"), 20000);
}
