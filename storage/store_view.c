/* store_view.c — the keyed state as the merged view of the base and the
 * log's runs of chunks (store.h note 2): sl_store_read_state, the entry
 * counts and bound, and store_merged_view, which compaction
 * (store_compact.c) runs too.
 *
 * NOTES ON THE IMPLEMENTATION
 *
 * 1. The merged view of a range [first, last] of (op, key group)
 *    prefixes, in one read (or a compaction step's write) transaction:
 *      a. choose the chunks: in the base, seek to the first chunk whose
 *         key (its last prefix) is >= first and take chunks while their
 *         head's first prefix is <= last; in the log the same per run
 *         (seq, run), seeking from one run to the next, so the chunks of
 *         other ranges are skipped unread.  Only references are kept
 *         (32 bytes a chunk, about 1 MiB of state each); they point into
 *         the map, which stays put while the transaction is open.
 *      b. read each run's chunks in order, a chunk's checksum checked when
 *         the run reaches it (store_value_open) and its entries decoded
 *         with every length checked (chunk.h); entries outside the range
 *         (the first and last chunk may hold others) are skipped;
 *      c. merge the runs: with one run (a compacted store, the common
 *         restore) its entries go straight out; with two (a base and one
 *         log run: a checkpoint since the last compaction) a plain
 *         two-way merge, one comparison a step, a key in both runs one
 *         step (merge_two: reading a 1M-key store of 1M + 1M entries
 *         took 33 ms of CPU, 39 ms through the tree); with more, a
 *         tournament (loser) tree over the runs' head entries: a match
 *         puts the smaller key first and, on equal keys, the newer run
 *         (the base is the oldest, log runs by (seq, run)).  Each internal
 *         node keeps the loser of its last match, the root's winner is the
 *         newest version of the smallest key left, and after it is taken
 *         only the matches on its run's path are played again:
 *         ceil(log2 k) comparisons an entry for k runs, where a binary
 *         heap took up to twice that plus one more to find the older
 *         versions.
 *      d. older versions: a match between two equal keys marks the older
 *         head stale (a newer version of its key exists); a stale head
 *         that wins is skipped, and a tombstone that wins emits nothing.
 *         Every older version is marked before it wins, with no
 *         comparison spent looking for it: when the newest version of K
 *         wins, K is the smallest head, and an older head h of K lost the
 *         match at some node to the winner of the other side there, which
 *         is of K too (at most h, at least K) and newer.  A node keeps the
 *         result of the match between the current winners of its two
 *         sides, played when one of them last changed: h met it then, and
 *         that match marked h.
 *      e. across a run's chunks the order is checked too: the first entry
 *         of a chunk must come after the run's last entry before it
 *         (within a chunk, chunk.h checks it), so a damaged run is
 *         SL_ECORRUPT rather than a key emitted twice or out of order.
 *      f. the choice of a. reads a chunk's head before its checksum
 *         (which b. checks only for chunks chosen), so the head is checked
 *         against the key first: its operator and last key group must be
 *         the key's (the walk of lmdb_check.c keeps keys in order, and
 *         the checksum's seed covers the key), its first group at most its
 *         last.  A chunk that ends a run's choice because its first prefix
 *         is above the view's last gets its checksum checked there when it
 *         is of the view's operator: else a damaged first group could
 *         drop a chunk that holds part of the range, unread.  Without
 *         these a flipped byte in a head's operator made a whole chunk of
 *         state vanish with no error (corrupt::random_byte_flips, seed
 *         2045).  At the other end, each seek of a. lands past the
 *         chunks whose key ends below the view's first prefix, and a key
 *         damaged downwards (in order still) hides its chunk there: its
 *         last group (a read that starts inside the operator's groups),
 *         or its operator (any read: the run's first chunk of op X whose
 *         key now says op Y < X is read by no reader of X, and by none at
 *         all when Y is not in the job's graph, so its state vanished
 *         silently).  Such a chunk is the one just before where the seek
 *         lands: it was the first of the run's chunks that reach the
 *         range, and the damage kept it below every one after it.  So
 *         the chunk just before each seek's landing place, if of the same
 *         run (any chunk in the base), must have a head that agrees with
 *         its key, as in take_chunk.  A damage upwards is met by
 *         take_chunk itself: the chunk still lies at or after the seek,
 *         before the run's chunks of higher operators.  Every reader of
 *         a range thus looks at the head of every chunk whose state may
 *         lie in that range, which works for a read of some operators and
 *         some key groups alike (a restore, a rescaled one), with no
 *         count to keep.  The cost: a compare a chunk chosen, one more
 *         seek (and a head, one page) a seek, and for a chunk that ends
 *         a run's choice, its checksum (at most one a run).
 *    A compaction writes only into the other base while it merges, so the
 *    pages the references point to are not touched.
 * 2. Every loop is bounded by the chunks' bytes: an entry takes at least
 *    CHUNK_TOMB_HEAD_BYTES, so no run yields more entries than its chunks'
 *    bytes over that.
 * 3. Chunks are read from the file, not through the map.  The first read
 *    of a page through LMDB's map is a fault, and on this project's VM
 *    faults are dear: hashing the 1.4 GB data.mdb of a 10M-key store
 *    through a fresh map took 700-980 ms, against 86-150 ms once mapped
 *    and 230-260 ms with pread into one reused 1 MiB buffer (2026-12-07,
 *    a scratch program).  A restore (in a fresh process) reads every chunk
 *    once, and compaction every chunk written since it last read, so
 *    both paid that first touch for all of them.  So run_copy_chunk reads
 *    a chunk of VIEW_COPY_MIN_BYTES or more with pread into its run's
 *    buffer, where it is then checked and decoded, in cache.
 *    - Where: the header of the LMDB overflow page the value starts on
 *      gives its page number (LMDB's file format: page number, padding,
 *      flags, page count, then the value); a value that is not at the
 *      start of an overflow page's data is read through the map.
 *    - Why the file holds what the map shows: a read transaction's pages
 *      do not change while it lives, and the store does not use
 *      MDB_WRITEMAP, so LMDB writes pages with pwrite into the same page
 *      cache the map shows.  Compaction's write transaction reads only
 *      committed chunks it does not change (note 1's last paragraph).
 *    - Checked anyway: the copy's first VIEW_COPY_CHECK_BYTES must equal
 *      the map's (the head's page, which check_head read already), and a
 *      copy that fails its checksum is judged again through the map.  A
 *      wrong copy can cost time, never wrong state or a false
 *      SL_ECORRUPT.
 *    - Memory: one buffer a run, as large as its largest chunk, all of
 *      one view's within VIEW_COPY_BUDGET_BYTES; a run whose buffer would
 *      pass it reads through the map.  The copy is overwritten by the
 *      run's next chunk, so the previous chunk's last entry (note 1e)
 *      first moves its key to a small buffer of its own; the entries fn
 *      is handed live until the run moves on, as before (every caller
 *      copies what it keeps).
 *    Measured on one kept 10M-key store (10M base + 10M log entries),
 *    restores in fresh processes, 5 interleaved pairs: the restoring
 *    thread's CPU fell by about 11%; on a store of 10M + 30M entries by
 *    25-29%.  The page faults of a restore fell from 17,700 to 2,300.
 */
#include "store_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "sluice.h"

/* Note 3: chunks from this size on are read into memory, and the most
 * all of a view's runs' buffers may take together. */
#define VIEW_COPY_MIN_BYTES (64u << 10)
#define VIEW_COPY_BUDGET_BYTES ((size_t)16 << 20)
/* Note 3: LMDB's page header (lmdb.h's file format, mdb.c's MDB_page):
 * the page number (8 bytes), 2 bytes of padding, the flags (2 bytes),
 * and for an overflow page the count of its pages (4 bytes); a value on
 * overflow pages starts right after it. */
#define LMDB_PAGE_HEAD_BYTES 16u
#define LMDB_PAGE_FLAGS_AT 10u
#define LMDB_PAGE_PAGES_AT 12u
#define LMDB_PAGE_OVERFLOW 0x04u
/* Note 3: how much of a copy is compared with the map (already read). */
#define VIEW_COPY_CHECK_BYTES 256u

/* Note 3: the tests' budget (SIZE_MAX: none set) and the copies made. */
static _Atomic size_t test_copy_budget = SIZE_MAX;
static _Atomic uint64_t copies_made;

void sl_store_test_view_copy_budget(size_t bytes) {
  atomic_store(&test_copy_budget, bytes);
}

uint64_t sl_store_test_view_copies(void) { return atomic_load(&copies_made); }

/* ------------------------------------------------------------ entry counts */

int sl_store_entry_counts(sl_store *s, uint64_t *base_entries,
                          uint64_t *log_entries) {
  MDB_txn *txn;
  int rc = store_read_begin(s, &txn);
  if (rc != 0)
    return rc;
  uint64_t log = 0, base = 0;
  rc = store_meta_get_u64(s, txn, "log_entries", &log);
  if (rc == 0)
    rc = store_meta_get_u64(s, txn, "base_entries", &base);
  mdb_txn_abort(txn);
  if (rc == 0) {
    *base_entries = base;
    *log_entries = log;
  }
  return rc;
}

int sl_store_entry_bound(sl_store *s, uint64_t *entries) {
  uint64_t base = 0, log = 0;
  int rc = sl_store_entry_counts(s, &base, &log);
  if (rc == 0)
    *entries = base + log;
  return rc;
}

/* ------------------------------------------------------------ choosing */

/* A chunk chosen for a merged view (note 1a). */
typedef struct chunk_ref {
  MDB_val key;
  MDB_val value;
} chunk_ref;

/* One run being read: its chunks refs[next, end) still to come. */
typedef struct run_cursor {
  size_t next;
  size_t end;
  size_t current;   /* the chunk being read, for messages */
  int db;           /* DB_LOG or the base's */
  bool reading;     /* reader is on a chunk */
  bool skipping;    /* the lower bound is not yet passed */
  bool chunk_start; /* the next entry is its chunk's first (note 1e) */
  bool has_head;    /* an entry was read: before is the previous
                       chunk's last when chunk_start */
  bool done;        /* no entry of the view left: head is not one */
  bool stale;       /* head is an older version (note 1d) */
  chunk_reader reader;
  chunk_entry head;
  chunk_entry before; /* the last entry of the chunk before (note 1e) */
  uint8_t *copy;      /* note 3: the chunk being read, read into memory */
  size_t copy_bytes;
  uint8_t *before_key; /* note 3: before's key, kept from the copy */
  size_t before_key_bytes;
} run_cursor;

typedef struct view {
  sl_store *s;
  uint32_t first, last;
  const uint8_t *after; /* NULL, or the state key the view starts above */
  size_t after_bytes;
  chunk_ref *refs;
  size_t ref_count, ref_capacity;
  run_cursor *runs; /* runs[0] the oldest */
  size_t run_count, run_capacity;
  /* The loser tree (note 1c): tree[0] the winner's run, tree[n] for
   * 1 <= n < leaves the loser at internal node n, whose children are 2n
   * and 2n + 1; leaf i (node leaves + i) is run i, and leaves from
   * run_count on are empty. */
  size_t *tree;
  size_t leaves; /* a power of two, >= run_count */
  size_t bound; /* note 2 */
  /* Note 3: the data file, its page size, what copies may still take. */
  int fd;
  size_t page_bytes;
  size_t copy_budget;
} view;

/* Room for one more item in *buffer (*capacity items of item_bytes). */
static int grow(sl_store *s, void **buffer, size_t *capacity, size_t used,
                size_t item_bytes) {
  if (used < *capacity)
    return 0;
  size_t grown = *capacity < 64 ? 64 : 2 * *capacity;
  void *bigger = grown <= SIZE_MAX / item_bytes / 2
                     ? realloc(*buffer, grown * item_bytes)
                     : 0;
  if (!bigger)
    return store_fail(s, ENOMEM, "read state: out of memory");
  *buffer = bigger;
  *capacity = grown;
  return 0;
}

/* Note 1f: the head of the chunk (key, value) against its key: its
 * operator and last key group must be the key's, and its first group at
 * most its last.  *first, *last: the head's (op << 16 | key group). */
static int check_head(view *v, int db, const MDB_val *key,
                      const MDB_val *value, uint32_t *first, uint32_t *last) {
  if (value->mv_size < SL_STORE_CHECKSUM_BYTES ||
      !chunk_peek_range(value->mv_data,
                        value->mv_size - SL_STORE_CHECKSUM_BYTES, first, last))
    return store_corrupt(v->s, db, key, "value too short to be a chunk");
  /* The key's (op, last key group); its length was checked. */
  uint32_t key_last = get_be32((const uint8_t *)key->mv_data +
                               (db == DB_LOG ? LOG_LAST_AT : 0));
  if (*last == key_last && *first <= *last)
    return 0;
  /* Name the head too: the key in the message is the damaged one when
   * the damage is in the key (its operator moved: note 1f). */
  char problem[128];
  snprintf(problem, sizeof problem,
           "chunk head's operator or key groups disagree with its key "
           "(head: op %" PRIu32 ", key groups %" PRIu32 "..%" PRIu32 ")",
           *last >> 16, *first & 0xffffu, *last & 0xffffu);
  return store_corrupt(v->s, db, key, problem);
}

/* Takes the chunk (key, value) if its head's range starts at or below the
 * view's last prefix; *past: it does not (the run's chunks are done).
 * Note 1f: the head must agree with the key, and a chunk of the view's
 * operator left out is checked whole. */
static int take_chunk(view *v, int db, const MDB_val *key,
                      const MDB_val *value, bool *past) {
  uint32_t first = 0, last = 0;
  int rc = check_head(v, db, key, value, &first, &last);
  if (rc != 0)
    return rc;
  *past = first > v->last;
  if (*past) {
    MDB_val payload;
    return last >> 16 == v->last >> 16
               ? store_value_open(v->s, db, key, value, &payload)
               : 0;
  }
  void *refs = v->refs;
  rc = grow(v->s, &refs, &v->ref_capacity, v->ref_count, sizeof *v->refs);
  v->refs = refs;
  if (rc != 0)
    return rc;
  v->refs[v->ref_count++] = (chunk_ref){.key = *key, .value = *value};
  v->bound += value->mv_size / CHUNK_TOMB_HEAD_BYTES + 1;
  return 0;
}

/* Records refs [start, ref_count) as the newest run (if not empty). */
static int add_run(view *v, int db, size_t start) {
  if (start == v->ref_count)
    return 0;
  void *runs = v->runs;
  int rc = grow(v->s, &runs, &v->run_capacity, v->run_count, sizeof *v->runs);
  v->runs = runs;
  if (rc != 0)
    return rc;
  v->runs[v->run_count++] = (run_cursor){.next = start, .end = v->ref_count,
                                         .current = start, .db = db,
                                         .skipping = true};
  return 0;
}

/* Note 1f: after a seek to seek (a chunk key whose last prefix is the
 * view's first), the chunk just before where it lands, if it is of the
 * same run (its first same_bytes key bytes are seek's: none for the
 * base), must have a head that agrees with its key.  That chunk is left
 * out of the view by its key, which says it ends before the view's first
 * prefix; if its key's operator or last group was damaged downwards (in
 * order still), its head says otherwise. */
static int check_before_seek(view *v, MDB_cursor *cursor, int db,
                             const uint8_t *seek, size_t seek_bytes,
                             size_t same_bytes) {
  MDB_val key = {.mv_size = seek_bytes, .mv_data = (void *)seek}, value;
  int rc = mdb_cursor_get(cursor, &key, &value, MDB_SET_RANGE);
  if (rc == 0 || rc == MDB_NOTFOUND)
    rc = mdb_cursor_get(cursor, &key, &value,
                        rc == MDB_NOTFOUND ? MDB_LAST : MDB_PREV);
  if (rc == MDB_NOTFOUND)
    return 0;
  if (rc != 0)
    return store_lmdb_fail(v->s, rc, "read the state's chunks");
  if (key.mv_size != seek_bytes)
    return store_corrupt(v->s, db, &key, "key is not a chunk key");
  if (memcmp(key.mv_data, seek, same_bytes) != 0)
    return 0;
  uint32_t first = 0, last = 0;
  return check_head(v, db, &key, &value, &first, &last);
}

/* Note 1a for the base: one run, from its first chunk ending at or after
 * the view's first prefix. */
static int choose_base(view *v, MDB_txn *txn, int db) {
  MDB_cursor *cursor;
  int rc = mdb_cursor_open(txn, v->s->dbi[db], &cursor);
  if (rc != 0)
    return store_lmdb_fail(v->s, rc, "read the base");
  MDB_stat st;
  if ((rc = mdb_stat(txn, v->s->dbi[db], &st)) != 0) {
    mdb_cursor_close(cursor);
    return store_lmdb_fail(v->s, rc, "read the base");
  }
  uint8_t seek[BASE_KEY_BYTES] = {0};
  put_be32(seek, v->first);
  /* Note 1f: the chunk before the seek's. */
  int failed = check_before_seek(v, cursor, db, seek, sizeof seek, 0);
  if (failed) {
    mdb_cursor_close(cursor);
    return failed;
  }
  MDB_val key = {.mv_size = sizeof seek, .mv_data = seek}, value;
  rc = mdb_cursor_get(cursor, &key, &value, MDB_SET_RANGE);
  size_t start = v->ref_count;
  bool past = false;
  /* failed: a store error, its message set */
  for (size_t i = 0; i <= st.ms_entries && rc == 0 && !past && !failed;
       i++) {
    if (key.mv_size != BASE_KEY_BYTES)
      failed = store_corrupt(v->s, db, &key, "key is not a chunk key");
    else if ((failed = take_chunk(v, db, &key, &value, &past)) == 0 && !past)
      rc = mdb_cursor_get(cursor, &key, &value, MDB_NEXT);
  }
  mdb_cursor_close(cursor);
  if (failed)
    return failed;
  if (rc != 0 && rc != MDB_NOTFOUND)
    return store_lmdb_fail(v->s, rc, "read the base");
  return add_run(v, db, start);
}

/* The (seq, run) of a log chunk key, as one 96-bit order: seq, then run. */
typedef struct run_id {
  uint64_t seq;
  uint32_t run;
} run_id;

static int run_id_compare(run_id a, run_id b) {
  if (a.seq != b.seq)
    return a.seq < b.seq ? -1 : 1;
  return (a.run > b.run) - (a.run < b.run);
}

/* Takes the chunks of run id in range, the cursor on its first chunk
 * ending at or after the view's first prefix; the cursor is left past
 * them. */
static int choose_run(view *v, MDB_cursor *cursor, MDB_val *key,
                      MDB_val *value, run_id id, size_t chunks) {
  size_t start = v->ref_count;
  bool past = false;
  int rc = 0, failed = 0; /* an LMDB code; a store error, its message set */
  for (size_t i = 0; i <= chunks && rc == 0 && !past && !failed; i++) {
    if (key->mv_size != LOG_KEY_BYTES)
      return store_corrupt(v->s, DB_LOG, key, "key is not a chunk key");
    const uint8_t *k = key->mv_data;
    run_id at = {get_be64(k), get_be32(k + LOG_RUN_AT)};
    if (run_id_compare(at, id) != 0)
      break;
    if ((failed = take_chunk(v, DB_LOG, key, value, &past)) == 0 && !past)
      rc = mdb_cursor_get(cursor, key, value, MDB_NEXT);
  }
  if (failed)
    return failed;
  if (rc != 0 && rc != MDB_NOTFOUND)
    return store_lmdb_fail(v->s, rc, "read the log");
  return add_run(v, DB_LOG, start);
}

/* Note 1a for the log: each run with a seq below upto_seq, oldest first,
 * reached by a seek to (seq, run, first prefix). */
static int choose_log(view *v, MDB_txn *txn, uint64_t upto_seq) {
  MDB_cursor *cursor;
  MDB_stat st;
  int rc = mdb_stat(txn, v->s->dbi[DB_LOG], &st);
  if (rc == 0)
    rc = mdb_cursor_open(txn, v->s->dbi[DB_LOG], &cursor);
  if (rc != 0)
    return store_lmdb_fail(v->s, rc, "read the log");
  run_id id = {0, 0};
  int failed = 0; /* a store error, its message set */
  /* Two seeks a run, and every run holds at least one chunk. */
  for (size_t step = 0; step <= 2 * st.ms_entries + 1 && !failed; step++) {
    uint8_t seek[LOG_KEY_BYTES] = {0};
    put_be64(seek, id.seq);
    put_be32(seek + LOG_RUN_AT, id.run);
    put_be32(seek + LOG_LAST_AT, v->first);
    /* Note 1f: the chunk before the seek's, of the same run. */
    failed = check_before_seek(v, cursor, DB_LOG, seek, sizeof seek,
                               LOG_RUN_AT + 4);
    if (failed)
      break;
    MDB_val key = {.mv_size = sizeof seek, .mv_data = seek}, value;
    rc = mdb_cursor_get(cursor, &key, &value, MDB_SET_RANGE);
    if (rc != 0)
      break;
    if (key.mv_size != LOG_KEY_BYTES) {
      failed = store_corrupt(v->s, DB_LOG, &key, "key is not a chunk key");
      break;
    }
    const uint8_t *k = key.mv_data;
    run_id at = {get_be64(k), get_be32(k + LOG_RUN_AT)};
    if (at.seq >= upto_seq)
      break;
    if (run_id_compare(at, id) != 0) {
      id = at; /* seek again: into this run's range */
      continue;
    }
    failed = choose_run(v, cursor, &key, &value, id, st.ms_entries);
    if (id.run < UINT32_MAX)
      id.run++;
    else if (id.seq + 1 < upto_seq)
      id = (run_id){id.seq + 1, 0};
    else
      break;
  }
  mdb_cursor_close(cursor);
  if (failed)
    return failed;
  if (rc != 0 && rc != MDB_NOTFOUND)
    return store_lmdb_fail(v->s, rc, "read the log");
  return 0;
}

/* ------------------------------------------------------------ reading */

/* Key order of two entries (LMDB's order of their state keys). */
static inline int entry_compare(const chunk_entry *a, const chunk_entry *b) {
  if (a->prefix != b->prefix)
    return a->prefix < b->prefix ? -1 : 1;
  return key_compare(a->key, a->key_bytes, b->key, b->key_bytes);
}

/* Whether e is at or below the view's lower bound (first, after). */
static bool below_bound(const view *v, const chunk_entry *e) {
  if (e->prefix < v->first)
    return true;
  if (!v->after)
    return false;
  chunk_entry bound = {.prefix = get_be32(v->after),
                       .key = v->after + STATE_PREFIX_BYTES,
                       .key_bytes = (uint16_t)(v->after_bytes -
                                               STATE_PREFIX_BYTES)};
  return entry_compare(e, &bound) <= 0;
}

/* Note 3: the data file and its page size, for run_copy_chunk; without
 * them (fd -1) every chunk is read in the map. */
static void view_find_file(view *v) {
  v->fd = -1;
  MDB_stat stat;
  mdb_filehandle_t fd;
  if (mdb_env_get_fd(v->s->env, &fd) != 0 ||
      mdb_env_stat(v->s->env, &stat) != 0 || stat.ms_psize < 512)
    return;
  v->fd = fd;
  v->page_bytes = stat.ms_psize;
  size_t budget = atomic_load_explicit(&test_copy_budget,
                                       memory_order_relaxed);
  v->copy_budget = budget == SIZE_MAX ? VIEW_COPY_BUDGET_BYTES : budget;
}

/* Note 3: where in the data file value (a chunk) begins, from the header
 * of the overflow page it lies on; 0 if it is not on one. */
static off_t chunk_file_offset(const view *v, const MDB_val *value) {
  const uint8_t *data = value->mv_data;
  if ((uintptr_t)(data - LMDB_PAGE_HEAD_BYTES) % v->page_bytes != 0)
    return 0; /* not at the start of a page's data */
  const uint8_t *page = data - LMDB_PAGE_HEAD_BYTES;
  uint64_t pgno;
  uint16_t flags;
  uint32_t pages;
  memcpy(&pgno, page, sizeof pgno);
  memcpy(&flags, page + LMDB_PAGE_FLAGS_AT, sizeof flags);
  memcpy(&pages, page + LMDB_PAGE_PAGES_AT, sizeof pages);
  uint64_t span = (uint64_t)pages * v->page_bytes;
  if (!(flags & LMDB_PAGE_OVERFLOW) ||
      span < value->mv_size + LMDB_PAGE_HEAD_BYTES || pgno == 0 ||
      pgno > (uint64_t)INT64_MAX / v->page_bytes / 2)
    return 0;
  return (off_t)(pgno * v->page_bytes + LMDB_PAGE_HEAD_BYTES);
}

/* Note 3: *value (a chunk of run r, about to be read) becomes a copy in
 * r's buffer, read from the data file, if it is large enough to be worth
 * it, lies on overflow pages and the budget allows; else it stays as it
 * is (also when memory for it runs out).  Only the chunk read before
 * (whose last entry before may point into the buffer) is overwritten, so
 * before's key moves to a buffer of its own first. */
static void run_copy_chunk(view *v, run_cursor *r, MDB_val *value) {
  size_t bytes = value->mv_size;
  off_t at = v->fd < 0 || bytes < VIEW_COPY_MIN_BYTES
                 ? 0
                 : chunk_file_offset(v, value);
  if (at == 0)
    return;
  uintptr_t before = (uintptr_t)r->before.key, copy = (uintptr_t)r->copy;
  if (r->has_head && r->copy && before >= copy &&
      before < copy + r->copy_bytes) {
    if (r->before.key_bytes > r->before_key_bytes) {
      uint8_t *key = realloc(r->before_key, r->before.key_bytes);
      if (!key)
        return; /* the copy stays as it is; the map serves this one */
      r->before_key = key;
      r->before_key_bytes = r->before.key_bytes;
    }
    memcpy(r->before_key, r->before.key, r->before.key_bytes);
    r->before.key = r->before_key;
    r->before.value = 0; /* only the key is compared */
    r->head = r->before; /* the reader left head on the same entry */
  }
  if (bytes > r->copy_bytes) {
    if (bytes - r->copy_bytes > v->copy_budget)
      return;
    free(r->copy); /* nothing in it is needed any more */
    r->copy = malloc(bytes);
    v->copy_budget -= bytes - r->copy_bytes;
    r->copy_bytes = r->copy ? bytes : 0;
    if (!r->copy)
      return; /* the map still serves */
  }
  for (size_t done = 0; done < bytes;) {
    ssize_t got = pread(v->fd, r->copy + done, bytes - done,
                        at + (off_t)done);
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0)
      return; /* the map still serves (and faults if the file does) */
    done += (size_t)got;
  }
  /* The head's page is in the map already (check_head read it). */
  size_t same = bytes < VIEW_COPY_CHECK_BYTES ? bytes : VIEW_COPY_CHECK_BYTES;
  if (memcmp(r->copy, value->mv_data, same) == 0) {
    value->mv_data = r->copy;
    atomic_fetch_add_explicit(&copies_made, 1, memory_order_relaxed);
  }
}

/* Opens run r's next chunk: its checksum, then its head (note 1b). */
static int run_open_chunk(view *v, run_cursor *r) {
  const chunk_ref *ref = &v->refs[r->next];
  MDB_val payload, value = ref->value;
  run_copy_chunk(v, r, &value);
  int rc = store_value_open(v->s, r->db, &ref->key, &value, &payload);
  /* Note 3: a copy that fails its checksum is judged again in the map. */
  if (rc == SL_ECORRUPT && value.mv_data != ref->value.mv_data)
    rc = store_value_open(v->s, r->db, &ref->key, &ref->value, &payload);
  if (rc != 0)
    return rc;
  const char *problem =
      chunk_reader_open(&r->reader, payload.mv_data, payload.mv_size);
  if (problem)
    return store_corrupt(v->s, r->db, &ref->key, problem);
  r->current = r->next++;
  r->reading = true;
  r->chunk_start = true;
  return 0;
}

/* Moves run r to its next entry in the view: *has (r->head), or not (the
 * run is done).  Returns 0 or a store error. */
static int run_advance(view *v, run_cursor *r, bool *has) {
  *has = false;
  r->stale = false;
  for (size_t step = 0; step <= v->bound; step++) {
    if (!r->reading) {
      if (r->next == r->end)
        return 0;
      int rc = run_open_chunk(v, r);
      if (rc != 0)
        return rc;
    }
    const char *problem = 0;
    int got = chunk_reader_next(&r->reader, &r->head, &problem);
    if (got < 0)
      return store_corrupt(v->s, r->db, &v->refs[r->current].key, problem);
    if (got == 0) {
      /* Note 1e: the chunk's last entry (the reader left head alone),
       * which stays mapped, for the next chunk's first. */
      r->reading = false;
      r->before = r->head;
      continue;
    }
    if (r->chunk_start) {
      if (r->has_head && entry_compare(&r->before, &r->head) >= 0)
        return store_corrupt(v->s, r->db, &v->refs[r->current].key,
                             "chunk's first key is not above the run's "
                             "chunk before");
      r->chunk_start = false;
      r->has_head = true;
    }
    if (r->head.prefix > v->last)
      return 0; /* chunks end in key order: nothing further is in range */
    if (r->skipping && below_bound(v, &r->head))
      continue;
    r->skipping = false;
    *has = true;
    return 0;
  }
  return store_fail(v->s, SL_ECORRUPT,
                    "read state: more entries than the chunks can hold");
}

/* Whether run a's head goes before run b's (note 1c): a done run after
 * every other, the smaller key first, of equal keys the newer run's (the
 * higher index), and then the older head is marked stale (note 1d). */
static inline bool run_before(view *v, size_t a, size_t b) {
  bool a_done = a >= v->run_count || v->runs[a].done;
  bool b_done = b >= v->run_count || v->runs[b].done;
  if (a_done || b_done)
    return !a_done;
  int order = entry_compare(&v->runs[a].head, &v->runs[b].head);
  if (order != 0)
    return order < 0;
  v->runs[a < b ? a : b].stale = true;
  return a > b;
}

/* Plays the matches on the path of leaf run up to the root again, after
 * its head changed (note 1c); the winner goes to tree[0]. */
static void tree_replay(view *v, size_t run) {
  size_t *tree = v->tree, winner = run;
  for (size_t node = (v->leaves + run) / 2; node >= 1; node /= 2) {
    if (run_before(v, tree[node], winner)) {
      size_t loser = winner;
      winner = tree[node];
      tree[node] = loser;
    }
  }
  tree[0] = winner;
}

/* Plays every match once, bottom up, every run on its head: winners[n]
 * is the winner below node n, for 1 <= n < 2 * leaves (winners[0] is not
 * used: the scratch is the 2 * leaves - 1 items after the tree's). */
static void tree_build(view *v, size_t *winners) {
  size_t leaves = v->leaves;
  for (size_t i = 0; i < leaves; i++)
    winners[leaves + i] = i;
  for (size_t node = leaves - 1; node >= 1; node--) {
    size_t left = winners[2 * node], right = winners[2 * node + 1];
    bool left_first = run_before(v, left, right);
    winners[node] = left_first ? left : right;
    v->tree[node] = left_first ? right : left;
  }
  v->tree[0] = winners[1];
}

/* Note 1c with one run: its entries straight into fn. */
static int merge_one(view *v, store_merged_fn fn, void *arg) {
  run_cursor *r = &v->runs[0];
  for (size_t step = 0; step <= v->bound; step++) {
    bool has;
    int rc = run_advance(v, r, &has);
    if (rc != 0 || !has)
      return rc;
    if (r->head.kind == CHUNK_PUT) {
      int stop = fn(arg, &r->head);
      if (stop != 0)
        return stop;
    }
  }
  return store_fail(v->s, SL_ECORRUPT, "read state: more entries than the "
                    "chunks can hold");
}

/* Note 1c with two runs: runs[0] the older.  Each step takes the smaller
 * head, or on equal keys the newer one and drops the older (note 1d), so
 * a key in both runs costs one comparison, where the tree played two
 * matches for it (each of its versions' replays). */
static int merge_two(view *v, store_merged_fn fn, void *arg) {
  run_cursor *older = &v->runs[0], *newer = &v->runs[1];
  bool has_older, has_newer;
  int rc = run_advance(v, older, &has_older);
  if (rc == 0)
    rc = run_advance(v, newer, &has_newer);
  for (size_t step = 0; rc == 0 && step <= v->bound; step++) {
    if (!has_older && !has_newer)
      return 0;
    /* < 0: the older run's head first; > 0: the newer's; 0: same key. */
    int order = !has_older   ? 1
                : !has_newer ? -1
                             : entry_compare(&older->head, &newer->head);
    const chunk_entry *taken = order < 0 ? &older->head : &newer->head;
    if (taken->kind == CHUNK_PUT) {
      int stop = fn(arg, taken);
      if (stop != 0)
        return stop;
    }
    if (order <= 0)
      rc = run_advance(v, older, &has_older);
    if (rc == 0 && order >= 0)
      rc = run_advance(v, newer, &has_newer);
  }
  return rc ? rc : store_fail(v->s, SL_ECORRUPT, "read state: more entries "
                              "than the chunks can hold");
}

/* Notes 1c and 1d with several runs. */
static int merge_many(view *v, store_merged_fn fn, void *arg) {
  size_t leaves = 1;
  while (leaves < v->run_count) /* run_count <= refs: no overflow */
    leaves *= 2;
  v->leaves = leaves;
  /* The tree (leaves items), then tree_build's scratch. */
  v->tree = malloc((3 * leaves - 1) * sizeof *v->tree);
  if (!v->tree)
    return store_fail(v->s, ENOMEM, "read state: out of memory");
  for (size_t r = 0; r < v->run_count; r++) {
    bool has;
    int rc = run_advance(v, &v->runs[r], &has);
    if (rc != 0)
      return rc;
    v->runs[r].done = !has;
  }
  tree_build(v, v->tree + leaves - 1);
  for (size_t step = 0; step <= v->bound; step++) {
    size_t top = v->tree[0];
    if (top >= v->run_count || v->runs[top].done)
      return 0; /* every run is: a done run wins only over done ones */
    run_cursor *r = &v->runs[top];
    if (!r->stale && r->head.kind == CHUNK_PUT) {
      int stop = fn(arg, &r->head);
      if (stop != 0)
        return stop;
    }
    bool has;
    int rc = run_advance(v, r, &has);
    if (rc != 0)
      return rc;
    r->done = !has;
    tree_replay(v, top);
  }
  return store_fail(v->s, SL_ECORRUPT, "read state: more entries than the "
                    "chunks can hold");
}

int store_merged_view(sl_store *s, MDB_txn *txn, int base_db,
                      uint64_t upto_seq, uint32_t first, uint32_t last,
                      const uint8_t *after, size_t after_bytes,
                      store_merged_fn fn, void *arg) {
  assert(base_db == DB_STATE || base_db == DB_STATE2);
  assert(first <= last);
  assert(!after || (after_bytes >= STATE_PREFIX_BYTES &&
                    get_be32(after) >= first));
  view v = {.s = s, .first = first, .last = last, .after = after,
            .after_bytes = after_bytes};
  view_find_file(&v);
  int rc = choose_base(&v, txn, base_db);
  if (rc == 0)
    rc = choose_log(&v, txn, upto_seq);
  if (rc == 0 && v.run_count == 1)
    rc = merge_one(&v, fn, arg);
  else if (rc == 0 && v.run_count == 2)
    rc = merge_two(&v, fn, arg);
  else if (rc == 0 && v.run_count > 2)
    rc = merge_many(&v, fn, arg);
  for (size_t r = 0; r < v.run_count; r++) {
    free(v.runs[r].copy);
    free(v.runs[r].before_key);
  }
  free(v.refs);
  free(v.runs);
  free(v.tree);
  return rc;
}

/* ------------------------------------------------------------ read state */

typedef int (*state_fn)(void *arg, uint16_t key_group, const void *key,
                        uint32_t key_bytes, const void *value,
                        uint32_t value_bytes);

/* sl_store_read_state's fn behind a store_merged_fn. */
typedef struct read_target {
  state_fn fn;
  void *arg;
} read_target;

static int read_emit(void *arg, const chunk_entry *e) {
  const read_target *target = arg;
  return target->fn(target->arg, (uint16_t)e->prefix, e->key, e->key_bytes,
                    e->value, e->value_bytes);
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
  rc = store_meta_get_base(s, txn, &base_db);
  if (rc == 0)
    rc = store_merged_view(s, txn, base_db, UINT64_MAX,
                           (uint32_t)op << 16 | group_first,
                           (uint32_t)op << 16 | group_last, 0, 0, read_emit,
                           &target);
  mdb_txn_abort(txn);
  return rc;
}
