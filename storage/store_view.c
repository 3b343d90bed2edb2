/* store_view.c — the keyed state as the merged view of the log and the
 * base (store.h note 2): sl_store_read_state, and the compaction that
 * writes the view into the other base (store.h note 3).
 *
 * NOTES ON THE IMPLEMENTATION
 *
 * 1. The merged view (store.h note 2), for a range of (op, key group)
 *    prefixes, in one read (or the compaction's write) transaction:
 *      a. per logged transaction, seek to [seq][first prefix] and take its
 *         entries up to the last prefix: a sorted run, checked as read;
 *         seeking past the other prefixes skips them unread;
 *      b. merge the runs with a binary heap of them, ordered by their next
 *         entry's key and, on equal keys, newer run first: the top is the
 *         newest version of the smallest key left; the older versions of
 *         it (at most one a run) are skipped.  One pass, no copies, about
 *         2 log2(runs) key comparisons an entry;
 *      c. merge-join them with a cursor over the base range: on equal keys
 *         the log's entry wins; tombstones are dropped.
 *    Log entries point into the map, which stays put while the
 *    transaction is open; a compaction writes only into the other base
 *    until the merge is done, so the pages they point to are not touched.
 * 2. Compaction runs the merged view of every prefix into the empty base
 *    with MDB_APPEND (it arrives in key order), then empties the log and
 *    the old base with mdb_drop (their pages go to LMDB's free list, for
 *    later transactions) and flips "base".  Both bases use the checksum
 *    seed of "state", so a base value is checked when read and rewritten
 *    with the same checksum.
 */
#include "store_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <time.h>

#include "sluice.h"

/* ------------------------------------------------------------ merged view */

int sl_store_entry_bound(sl_store *s, uint64_t *entries) {
  MDB_txn *txn;
  int rc = store_read_begin(s, &txn);
  if (rc != 0)
    return rc;
  int base = DB_STATE;
  MDB_stat log_stat, base_stat;
  rc = store_meta_get_base(s, txn, &base); /* sets its own message */
  if (rc != 0) {
    mdb_txn_abort(txn);
    return rc;
  }
  rc = mdb_stat(txn, s->dbi[DB_LOG], &log_stat);
  if (rc == 0)
    rc = mdb_stat(txn, s->dbi[base], &base_stat);
  mdb_txn_abort(txn);
  if (rc != 0)
    return store_lmdb_fail(s, rc, "count entries");
  *entries = (uint64_t)log_stat.ms_entries + base_stat.ms_entries;
  return 0;
}

typedef int (*state_fn)(void *arg, uint16_t key_group, const void *key,
                        uint32_t key_bytes, const void *value,
                        uint32_t value_bytes);

/* Where a merged view goes: sl_store_read_state's fn, or the new base of a
 * compaction.  key is a state key (op, key group, key bytes). */
typedef int (*merged_fn)(void *arg, const uint8_t *key, size_t key_bytes,
                         const void *value, size_t value_bytes);

/* One log entry of a merged view, pointing into the map (note 1). */
typedef struct log_entry {
  const uint8_t *key;   /* the state key: op, key group, key bytes */
  const uint8_t *value; /* the value, after the kind byte */
  uint32_t value_bytes;
  uint16_t key_bytes;
  uint8_t kind; /* LOG_PUT or LOG_TOMBSTONE */
} log_entry;

/* A sorted run of a merged view's log entries: one transaction's entries
 * in the range, [at, end) of log_range.entries; at moves as it is used. */
typedef struct log_run {
  size_t at;
  size_t end;
} log_run;

/* The log entries of a merged view's range, and their merge (note 1).
 * entries and runs are the store's buffers, grown as needed. */
typedef struct log_range {
  merge_buffers *buffers; /* where entries and runs live */
  log_entry *entries;
  size_t count;
  size_t capacity; /* the log's entries: no range holds more */
  log_run *runs; /* run r is older than run r + 1 */
  size_t run_count;
  struct heap_node *heap; /* malloc'd: the runs not used up (node_before) */
  size_t heap_count;
} log_range;

/* Room for one more entry, or run, in a store buffer (*buffer holds
 * *capacity items of item_bytes, at most limit are needed): doubled from
 * 1024.  A buffer moved by realloc is fine: items point into the map, not
 * into the buffer. */
static int buffer_room(sl_store *s, void **buffer, size_t *capacity,
                       size_t used, size_t item_bytes, size_t limit) {
  if (used < *capacity)
    return 0;
  assert(used < limit); /* the callers stop at limit */
  size_t grown = *capacity < 1024 ? 1024 : 2 * *capacity;
  if (grown > limit)
    grown = limit;
  void *bigger = grown <= SIZE_MAX / item_bytes
                     ? realloc(*buffer, grown * item_bytes)
                     : 0;
  if (!bigger)
    return store_fail(s, ENOMEM, "read the log: no memory for %zu entries",
                      grown);
  *buffer = bigger;
  *capacity = grown;
  return 0;
}

/* A log entry read back: checked, and its kind known. */
static int log_entry_open(sl_store *s, const MDB_val *key,
                          const MDB_val *value, log_entry *out) {
  assert(key->mv_size >= LOG_PREFIX_BYTES);
  assert(key->mv_size <= KEY_BUFFER_BYTES); /* LMDB's largest key */
  MDB_val payload;
  int rc = store_value_open(s, DB_LOG, key, value, &payload);
  if (rc != 0)
    return rc;
  const uint8_t *p = payload.mv_data;
  if (payload.mv_size < LOG_KIND_BYTES ||
      (p[0] != LOG_PUT && p[0] != LOG_TOMBSTONE) ||
      (p[0] == LOG_TOMBSTONE && payload.mv_size != LOG_KIND_BYTES))
    return store_corrupt(s, DB_LOG, key,
                         "value is neither a put nor a tombstone");
  out->key = (const uint8_t *)key->mv_data + LOG_SEQ_BYTES;
  out->key_bytes = (uint16_t)(key->mv_size - LOG_SEQ_BYTES);
  out->value = p + LOG_KIND_BYTES;
  out->value_bytes = (uint32_t)(payload.mv_size - LOG_KIND_BYTES);
  out->kind = p[0];
  return 0;
}

/* Records entries [start, range->count) as the newest run. */
static int log_add_run(sl_store *s, log_range *range, size_t start) {
  assert(start < range->count);
  assert(range->run_count == 0 ||
         range->runs[range->run_count - 1].end <= start);
  void *runs = range->buffers->runs;
  int rc = buffer_room(s, &runs, &range->buffers->run_capacity,
                       range->run_count, sizeof *range->runs, range->capacity);
  range->buffers->runs = runs;
  range->runs = runs;
  if (rc != 0)
    return rc;
  range->runs[range->run_count++] = (log_run){.at = start,
                                              .end = range->count};
  return 0;
}

/* Takes log entries from the cursor's (key, value) on while they belong to
 * transaction seq and have a prefix <= last, and records them as a run.
 * Returns 0 with the cursor on the first entry past them, MDB_NOTFOUND at
 * the log's end, or an error. */
static int log_collect_run(sl_store *s, MDB_cursor *cursor, MDB_val *key,
                           MDB_val *value, uint64_t seq, uint32_t last,
                           log_range *range) {
  size_t start = range->count;
  int rc = 0;
  /* Each turn takes an entry, and the range has room for all of them. */
  for (size_t turn = 0; turn <= range->capacity && rc == 0; turn++) {
    if (key->mv_size < LOG_PREFIX_BYTES)
      return store_corrupt(s, DB_LOG, key, "key shorter than its prefix");
    const uint8_t *k = key->mv_data;
    if (get_be64(k) != seq || get_be32(k + LOG_SEQ_BYTES) > last)
      break;
    if (range->count == range->capacity)
      return store_fail(s, SL_ECORRUPT,
                        "read the log: more entries than the %zu counted",
                        range->capacity);
    void *entries = range->buffers->entries;
    rc = buffer_room(s, &entries, &range->buffers->entry_capacity, range->count,
                     sizeof *range->entries, range->capacity);
    range->buffers->entries = entries;
    range->entries = entries;
    if (rc == 0)
      rc = log_entry_open(s, key, value, &range->entries[range->count]);
    if (rc != 0)
      return rc;
    range->count++;
    rc = mdb_cursor_get(cursor, key, value, MDB_NEXT);
  }
  if (rc != 0 && rc != MDB_NOTFOUND)
    return store_lmdb_fail(s, rc, "read the log");
  int added = range->count > start ? log_add_run(s, range, start) : 0;
  return added != 0 ? added : rc;
}

/* Step a of note 1: the log entries with a prefix (op << 16 | key group)
 * in [first, last] into range, a sorted run per transaction. */
static int log_collect(sl_store *s, MDB_cursor *cursor, uint32_t first,
                       uint32_t last, log_range *range) {
  uint8_t seek[LOG_PREFIX_BYTES];
  uint64_t seq = 0;
  /* Each step seeks into a transaction's range, or lands on the next
   * transaction present: two steps a transaction, and each one logged at
   * least one of the capacity entries. */
  for (size_t step = 0; step <= 2 * range->capacity + 1; step++) {
    put_be64(seek, seq);
    put_be32(seek + LOG_SEQ_BYTES, first);
    MDB_val key = {.mv_size = sizeof seek, .mv_data = seek}, value;
    int rc = mdb_cursor_get(cursor, &key, &value, MDB_SET_RANGE);
    if (rc == MDB_NOTFOUND)
      return 0; /* past the log's last entry */
    if (rc != 0)
      return store_lmdb_fail(s, rc, "read the log");
    if (key.mv_size < LOG_PREFIX_BYTES)
      return store_corrupt(s, DB_LOG, &key, "key shorter than its prefix");
    uint64_t landed = get_be64(key.mv_data);
    if (landed == seq) { /* in the range of seq, or past it */
      rc = log_collect_run(s, cursor, &key, &value, seq, last, range);
      if (rc == MDB_NOTFOUND)
        return 0;
      if (rc != 0)
        return rc;
      landed = get_be64(key.mv_data);
    }
    assert(landed >= seq); /* the cursor only moved forward */
    if (landed == seq && seq == UINT64_MAX)
      return 0;
    seq = landed > seq ? landed : seq + 1;
  }
  return store_fail(s, SL_ECORRUPT,
                    "read the log: more transactions than its %zu entries",
                    range->capacity);
}

static int entry_compare(const log_entry *a, const log_entry *b) {
  return key_compare(a->key, a->key_bytes, b->key, b->key_bytes);
}

/* A heap slot: a run and its head entry, whose first 16 key bytes are
 * kept as two big-endian numbers (zero-padded), so that most comparisons
 * read no key: 16 bytes hold op, key group and an engine key (11 bytes). */
typedef struct heap_node {
  uint64_t prefix[2];
  const log_entry *head;
  size_t run;
} heap_node;

static void node_load(heap_node *node, const log_entry *head, size_t run) {
  uint8_t bytes[16] = {0};
  memcpy(bytes, head->key, head->key_bytes < 16 ? head->key_bytes : 16);
  node->prefix[0] = load_be64(bytes);
  node->prefix[1] = load_be64(bytes + 8);
  node->head = head;
  node->run = run;
}

/* Key order of two nodes' heads; equal prefixes may still differ (in
 * bytes past 16, or in zero padding), so they compare the keys. */
static int node_compare(const heap_node *a, const heap_node *b) {
  if (a->prefix[0] != b->prefix[0])
    return a->prefix[0] < b->prefix[0] ? -1 : 1;
  if (a->prefix[1] != b->prefix[1])
    return a->prefix[1] < b->prefix[1] ? -1 : 1;
  return entry_compare(a->head, b->head);
}

/* Heap order: the smaller head key first, of equal ones the newer run's. */
static bool node_before(const heap_node *a, const heap_node *b) {
  int order = node_compare(a, b);
  return order < 0 || (order == 0 && a->run > b->run);
}

/* Moves heap slot i down to its place (a binary heap: one step a level). */
static void heap_down(log_range *range, size_t i) {
  heap_node *heap = range->heap;
  size_t n = range->heap_count;
  assert(i < n);
  for (int level = 0; level < 64; level++) { /* n < 2^64 */
    size_t child = 2 * i + 1, least = i;
    if (child < n && node_before(&heap[child], &heap[least]))
      least = child;
    if (child + 1 < n && node_before(&heap[child + 1], &heap[least]))
      least = child + 1;
    if (least == i)
      return;
    heap_node swap = heap[i];
    heap[i] = heap[least];
    heap[least] = swap;
    i = least;
  }
  assert(!"a heap of fewer than 2^64 runs is fewer than 64 levels deep");
}

/* Step b of note 1, set up: every run in the heap. */
static int log_merge_begin(sl_store *s, log_range *range) {
  assert(range->heap == 0);
  if (range->run_count == 0)
    return 0;
  range->heap = malloc(range->run_count * sizeof *range->heap);
  if (!range->heap)
    return store_fail(s, ENOMEM, "read the log: out of memory");
  for (size_t r = 0; r < range->run_count; r++) {
    assert(range->runs[r].at < range->runs[r].end); /* runs are not empty */
    node_load(&range->heap[r], &range->entries[range->runs[r].at], r);
  }
  range->heap_count = range->run_count;
  for (size_t i = range->heap_count / 2; i-- > 0;)
    heap_down(range, i);
  return 0;
}

/* Uses up the head entry of the run on top of the heap. */
static void heap_pop_head(log_range *range) {
  assert(range->heap_count > 0);
  size_t r = range->heap[0].run;
  log_run *run = &range->runs[r];
  run->at++;
  if (run->at == run->end) /* used up: the last slot takes its place */
    range->heap[0] = range->heap[--range->heap_count];
  else
    node_load(&range->heap[0], &range->entries[run->at], r);
  if (range->heap_count > 0)
    heap_down(range, 0);
}

/* Step b of note 1: the newest entry of the smallest key not yet taken,
 * NULL after the last; the older versions of that key are skipped. */
static const log_entry *log_merge_next(log_range *range) {
  if (range->heap_count == 0)
    return 0;
  heap_node newest = range->heap[0];
  heap_pop_head(range);
  /* A run holds a key once: at most one older version a run. */
  for (size_t r = 0; r < range->run_count && range->heap_count > 0; r++) {
    if (node_compare(&range->heap[0], &newest) != 0)
      break;
    heap_pop_head(range);
  }
  return newest.head;
}

/* Step a of note 1 and the merge's set-up: range holds the runs of the
 * log entries with a prefix in [first, last].  The caller frees
 * range->heap, also on error. */
static int log_gather(sl_store *s, MDB_txn *txn, uint32_t first,
                      uint32_t last, log_range *range) {
  assert(range->count == 0 && range->heap == 0);
  if (range->capacity == 0)
    return 0; /* an empty log */
  MDB_cursor *cursor;
  int rc = mdb_cursor_open(txn, s->dbi[DB_LOG], &cursor);
  if (rc != 0)
    return store_lmdb_fail(s, rc, "read the log");
  rc = log_collect(s, cursor, first, last, range);
  mdb_cursor_close(cursor);
  return rc != 0 ? rc : log_merge_begin(s, range);
}

/* After a base cursor step that returned rc: *in_range says whether the
 * cursor is on an entry with a prefix <= last. */
static int base_position(sl_store *s, int db, int rc, const MDB_val *key,
                         uint32_t last, bool *in_range) {
  *in_range = false;
  if (rc == MDB_NOTFOUND)
    return 0;
  if (rc != 0)
    return store_lmdb_fail(s, rc, "read the base");
  if (key->mv_size < STATE_PREFIX_BYTES)
    return store_corrupt(s, db, key, "key shorter than its prefix");
  *in_range = get_be32(key->mv_data) <= last;
  return 0;
}

/* A base entry into fn, checked. */
static int base_emit(sl_store *s, int db, const MDB_val *key,
                     const MDB_val *value, merged_fn fn, void *arg) {
  MDB_val payload;
  int rc = store_value_open(s, db, key, value, &payload);
  if (rc != 0)
    return rc;
  return fn(arg, key->mv_data, key->mv_size, payload.mv_data,
            payload.mv_size);
}

/* Step c of note 1: the base's entries with a prefix in [first, last]
 * merged with range's, into fn.  Returns fn's nonzero value or an error. */
static int merge_join(sl_store *s, MDB_cursor *cursor, int db,
                      uint32_t first, uint32_t last, log_range *range,
                      size_t base_entries, merged_fn fn, void *arg) {
  uint8_t seek[STATE_PREFIX_BYTES];
  put_be32(seek, first);
  MDB_val key = {.mv_size = sizeof seek, .mv_data = seek}, value;
  bool in_base = false;
  int rc = mdb_cursor_get(cursor, &key, &value, MDB_SET_RANGE);
  if ((rc = base_position(s, db, rc, &key, last, &in_base)) != 0)
    return rc;
  const log_entry *e = log_merge_next(range); /* NULL: the log's done */
  /* Each step consumes a base entry, a log entry, or both. */
  for (size_t step = 0; step <= base_entries + range->count; step++) {
    if (!in_base && !e)
      return 0;
    int order = !in_base ? 1
                : !e     ? -1
                         : key_compare(key.mv_data, key.mv_size, e->key,
                                       e->key_bytes);
    int stop = 0;
    if (order < 0)
      stop = base_emit(s, db, &key, &value, fn, arg);
    else if (e->kind == LOG_PUT) /* a tombstone hides the base's entry */
      stop = fn(arg, e->key, e->key_bytes, e->value, e->value_bytes);
    if (stop != 0)
      return stop;
    if (order >= 0)
      e = log_merge_next(range);
    if (order <= 0) { /* the base's entry is used up or superseded */
      rc = mdb_cursor_get(cursor, &key, &value, MDB_NEXT);
      if ((rc = base_position(s, db, rc, &key, last, &in_base)) != 0)
        return rc;
    }
  }
  return store_fail(s, SL_ECORRUPT,
                    "read state: more entries than the %zu counted",
                    base_entries + range->count);
}

/* The merged view (store.h note 2, note 1) of the prefixes (op << 16 |
 * key group) in [first, last] into fn, in key order.  Returns fn's
 * nonzero value or an error. */
static int merged_view(sl_store *s, MDB_txn *txn, int base_db,
                       uint32_t first, uint32_t last, merge_buffers *buffers,
                       merged_fn fn, void *arg) {
  assert(base_db == DB_STATE || base_db == DB_STATE2);
  assert(first <= last);
  MDB_stat log_stat, base_stat;
  int rc = mdb_stat(txn, s->dbi[DB_LOG], &log_stat);
  if (rc == 0)
    rc = mdb_stat(txn, s->dbi[base_db], &base_stat);
  if (rc != 0)
    return store_lmdb_fail(s, rc, "read state: count the entries");
  log_range range = {.buffers = buffers, .capacity = log_stat.ms_entries};
  rc = log_gather(s, txn, first, last, &range);
  MDB_cursor *cursor = 0;
  if (rc == 0 && (rc = mdb_cursor_open(txn, s->dbi[base_db], &cursor)) != 0)
    rc = store_lmdb_fail(s, rc, "read the base");
  if (rc == 0)
    rc = merge_join(s, cursor, base_db, first, last, &range,
                    base_stat.ms_entries, fn, arg);
  if (cursor)
    mdb_cursor_close(cursor);
  free(range.heap);
  return rc;
}

/* sl_store_read_state's fn behind a merged_fn. */
typedef struct read_target {
  state_fn fn;
  void *arg;
} read_target;

static int read_emit(void *arg, const uint8_t *key, size_t key_bytes,
                     const void *value, size_t value_bytes) {
  const read_target *target = arg;
  assert(key_bytes >= STATE_PREFIX_BYTES);
  return target->fn(target->arg, get_be16(key + 2), key + STATE_PREFIX_BYTES,
                    (uint32_t)(key_bytes - STATE_PREFIX_BYTES), value,
                    (uint32_t)value_bytes);
}

int sl_store_read_state(sl_store *s, uint16_t op, uint16_t group_first,
                        uint16_t group_last, state_fn fn, void *arg) {
  if (!fn || group_first > group_last)
    return store_fail(s, EINVAL,
                      "read state: no function, or key groups %u > %u",
                      group_first, group_last);
  MDB_txn *txn;
  int rc = store_read_begin(s, &txn);
  if (rc != 0)
    return rc;
  int base_db = DB_STATE;
  read_target target = {.fn = fn, .arg = arg};
  merge_buffers buffers = {0}; /* this read's own: note on merge_buffers */
  rc = store_meta_get_base(s, txn, &base_db);
  if (rc == 0)
    rc = merged_view(s, txn, base_db, (uint32_t)op << 16 | group_first,
                     (uint32_t)op << 16 | group_last, &buffers, read_emit,
                     &target);
  mdb_txn_abort(txn);
  free(buffers.entries);
  free(buffers.runs);
  return rc;
}

/* ------------------------------------------------------------ compaction */

/* For tests only: sl_store_test_crash_after (0: off). */
static uint64_t test_crash_appends;

void sl_store_test_crash_after(uint64_t appends) {
  test_crash_appends = appends;
}

static uint64_t now_us(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (uint64_t)now.tv_sec * 1000000u + (uint64_t)now.tv_nsec / 1000u;
}

/* The new base of a compaction; the merged view arrives in key order. */
typedef struct compaction_target {
  sl_store *s;
  MDB_txn *txn;
  int db;
  uint64_t entries_written;
  uint64_t bytes_written;
} compaction_target;

static int compaction_emit(void *arg, const uint8_t *key, size_t key_bytes,
                           const void *value, size_t value_bytes) {
  compaction_target *t = arg;
  MDB_val k = {.mv_size = key_bytes, .mv_data = (void *)key};
  int rc = store_value_put(t->s, t->txn, t->db, &k, 0, 0, value, value_bytes,
                           MDB_APPEND);
  assert(rc != MDB_KEYEXIST); /* the merged view ascends */
  if (rc != 0)
    return store_lmdb_fail(t->s, rc, "compact: write the new base");
  t->entries_written++;
  t->bytes_written += key_bytes + value_bytes + SL_STORE_CHECKSUM_BYTES;
  /* Every 4096 entries: the caller may want the writer back (a checkpoint
   * is waiting, or the job stops).  The transaction is then aborted and
   * nothing changes. */
  if (t->entries_written % 4096 == 0 && t->s->cancel &&
      atomic_load_explicit(t->s->cancel, memory_order_relaxed))
    return store_fail(t->s, ECANCELED, "compact: cancelled");
  if (test_crash_appends != 0 && t->entries_written == test_crash_appends)
    raise(SIGKILL); /* store.h: a test's crash inside the transaction */
  return 0;
}

/* Store.h note 3 inside the compaction's write transaction.  *done:
 * there was something to do, and stats says what. */
static int compact_in(sl_store *s, MDB_txn *txn, uint64_t min_log_entries,
                      sl_store_compaction *stats, bool *done) {
  int old_db = DB_STATE;
  int rc = store_meta_get_base(s, txn, &old_db);
  if (rc != 0)
    return rc;
  MDB_stat log_stat, base_stat;
  rc = mdb_stat(txn, s->dbi[DB_LOG], &log_stat);
  if (rc == 0)
    rc = mdb_stat(txn, s->dbi[old_db], &base_stat);
  if (rc != 0)
    return store_lmdb_fail(s, rc, "compact: count the entries");
  uint64_t log_entries = log_stat.ms_entries;
  uint64_t base_entries = base_stat.ms_entries;
  *done = log_entries > 0 && log_entries >= min_log_entries &&
          log_entries >= base_entries;
  if (!*done)
    return 0;
  int new_db = old_db == DB_STATE ? DB_STATE2 : DB_STATE;
  compaction_target target = {.s = s, .txn = txn, .db = new_db};
  /* Empty since the last compaction; emptied again, as MDB_APPEND needs. */
  if ((rc = mdb_drop(txn, s->dbi[new_db], 0)) != 0)
    return store_lmdb_fail(s, rc, "compact: empty the new base");
  if (!s->merge && !(s->merge = calloc(1, sizeof *s->merge)))
    return store_fail(s, ENOMEM, "compact: out of memory");
  rc = merged_view(s, txn, old_db, 0, UINT32_MAX, s->merge, compaction_emit,
                   &target);
  if (rc != 0)
    return rc;
  rc = mdb_drop(txn, s->dbi[DB_LOG], 0);
  if (rc == 0)
    rc = mdb_drop(txn, s->dbi[old_db], 0);
  if (rc == 0)
    rc = store_meta_put_u64(s, txn, "base", new_db == DB_STATE ? 0 : 1);
  if (rc == 0)
    rc = mdb_stat(txn, s->dbi[new_db], &base_stat);
  if (rc != 0)
    return store_lmdb_fail(s, rc, "compact: switch to the new base");
  if (base_stat.ms_entries != target.entries_written)
    return store_fail(s, SL_ECORRUPT, "compact: the new base holds %zu "
                      "entries, not the %" PRIu64 " written",
                      base_stat.ms_entries, target.entries_written);
  *stats = (sl_store_compaction){.log_entries_read = log_entries,
                                 .base_entries_read = base_entries,
                                 .entries_written = target.entries_written,
                                 .bytes_written = target.bytes_written};
  return 0;
}

void sl_store_set_cancel(sl_store *s, const _Atomic int *cancel) {
  s->cancel = cancel;
}

int sl_store_compact(sl_store *s, uint64_t min_log_entries,
                     sl_store_compaction *stats) {
  sl_store_compaction result = {0};
  if (stats)
    *stats = result;
  if (s->read_only)
    return store_fail(s, EACCES, "compact: the store is open read-only");
  if (s->txn.state != TXN_IDLE)
    return store_fail(s, EBUSY, "compact: a transaction is open");
  uint64_t start_us = now_us();
  MDB_txn *txn;
  int rc = mdb_txn_begin(s->env, 0, 0, &txn);
  if (rc != 0)
    return store_lmdb_fail(s, rc, "compact: begin");
  bool done = false;
  s->compacting = true;
  rc = compact_in(s, txn, min_log_entries, &result, &done);
  s->compacting = false;
  if (rc != 0 || !done) {
    mdb_txn_abort(txn); /* nothing changed */
    return rc;
  }
  rc = mdb_txn_commit(txn); /* durable unless no_sync (store.h note 3) */
  if (rc != 0)
    return store_lmdb_fail(s, rc, "compact: commit");
  result.duration_us = now_us() - start_us;
  if (stats)
    *stats = result;
  return 0;
}

