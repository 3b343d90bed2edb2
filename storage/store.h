/* store.h — the LMDB store of a job's state directory.  Its calls live
 * in store.c (open, close, meta), store_txn.c (a checkpoint's write
 * transaction and its commit), store_view.c (keyed state: the merged
 * view), store_compact.c (compaction), chunk.c (the chunk layout),
 * store_table.c (table rows), store_records.c (blobs,
 * records, the inspection view) and store_savepoint.c (inspect, copy,
 * install); store_internal.h is what they share.
 *
 * NOTES ON THE DESIGN
 *
 * 1. One LMDB environment per state directory (data.mdb, lock.mdb), with
 *    seven named databases (format 3):
 *      meta         "magic" -> "sluice-store", "format" -> u32 format
 *                   version (3), "graph" -> the job graph fingerprint,
 *                   "latest" -> u64 id of the newest complete checkpoint,
 *                   "next_seq" -> u64 sequence number of the next write
 *                   transaction, "base" -> u64 0 or 1: which of state and
 *                   state2 is the current base, "log_entries" -> u64
 *                   state entries in the log's chunks, "base_entries" ->
 *                   u64 state entries in the current base's chunks
 *      checkpoints  u64 id (big-endian) -> checkpoint record (engine bytes)
 *      blobs        u16 op, u16 instance (big-endian) -> the latest blob of
 *                   that instance (source position, operator state, sink
 *                   transactions), tagged with the checkpoint id
 *      log          u64 seq, u32 run, u16 op, u16 last key group, u32
 *                   ordinal (big-endian, 20 bytes) -> a chunk: the
 *                   keyed-state changes since the last compaction, each
 *                   write transaction's (seq) as one or more sorted runs
 *                   of chunks (note 2)
 *      state,       u16 op, u16 last key group, u32 ordinal (big-endian,
 *      state2       8 bytes) -> a chunk: the base, keyed state as of the
 *                   last compaction, one sorted run without tombstones;
 *                   one of the two is current, the other empty or a
 *                   compaction's partial work (note 3)
 *      tables       u8 n, n bytes of table name, key bytes -> value: the
 *                   rows of table sinks (note 6); u8 0, table name -> u64
 *                   row count of that table (little-endian)
 *    A chunk (storage/chunk.h note 1) holds about 1 MiB of one operator's
 *    entries in strictly ascending (key group, key) order, keys compared
 *    as LMDB compares them (bytes, then the shorter first); little-endian:
 *    a head (u16 op, u16 first key group, u16 last key group, u16 0, u32
 *    entry count), then per entry u16 key group, u8 kind (1 put, 2
 *    tombstone), u16 key bytes, for a put u32 value bytes, then the key
 *    and the value.  An entry never spans two chunks: one larger than
 *    1 MiB gets a chunk of its own.  A chunk's key ends with its last key
 *    group, so a seek to (first group) lands on the first chunk that may
 *    hold it, and a range of key groups is read without the others.
 *    Every stored value ends with an 8-byte checksum of the key and the
 *    value (for a chunk: of the whole chunk), little-endian:
 *    XXH3_64bits_withSeed(value, seed) with seed = XXH3_64bits_withSeed(key,
 *    database number), the numbers being meta 1, checkpoints 2, blobs 3,
 *    state and state2 both 4 (they are one logical database), log 5,
 *    tables 7.  It is checked on every read: a mismatch is SL_ECORRUPT
 *    naming the database and the key (for a chunk: "seq S run R chunk C
 *    of op O up to key group G").  A chunk whose checksum holds but whose
 *    lengths, kinds, groups or order do not is SL_ECORRUPT too.  Meta
 *    values are "sluice-store" (no NUL), u32 and u64 little-endian, the
 *    fingerprint's bytes (no NUL); a blob value starts with the u64
 *    (little-endian) id of the checkpoint that wrote it.
 * 2. Checkpoint n is written by one write transaction with sequence number
 *    seq = "next_seq": its state changes are appended to the log under seq
 *    as chunks (store_txn.c note 3): changes in ascending (op, key group,
 *    key) order make one run; a key below the one before starts the next
 *    run, newer than the one before; a key equal to the one before
 *    replaces it (the newest wins).  Then its blobs, the record of n,
 *    "latest" = n, "log_entries" += its entries and "next_seq" = seq + 1.
 *    Every log key has a seq below "next_seq", so committed transactions
 *    have strictly increasing seqs.  The keyed state is the merged view:
 *    the current base overlaid with the log's runs, the newest run (by
 *    seq, then run) winning and a winning tombstone removing the key;
 *    sl_store_read_state returns it.  The commit is durable (fsync)
 *    unless no_sync was asked for.  A crash at any instant leaves the
 *    store at n-1 or at n (DESIGN.md invariant 5).
 * 3. Compaction (sl_store_compact, storage/store_compact.c) merges the
 *    current base and the log's runs logged before it began into the
 *    other base, in steps: each step a durable write transaction that
 *    appends about 16 MiB of chunks, so its dirty pages (the memory a
 *    write transaction holds) are bounded whatever the state's size, and
 *    checkpoints may commit between steps (their runs are not merged).
 *    The step that writes the merged view's end also deletes the merged
 *    runs from the log, empties the old base, sets "base" to the new one
 *    and the counts.  Until then reads ignore the other base; a crash
 *    between steps leaves a partial other base, which the next compaction
 *    empties first.  So a crash at any instant leaves the merged view
 *    unchanged.  Checkpoint records, blobs and "latest" are not touched.
 *    While it runs the map holds the old base, the log and the new base.
 *    MDB_MAP_FULL from a put, from a compaction step or from a commit
 *    aborts that transaction; the caller grows the map (sl_store_grow)
 *    and writes the transaction (or compacts) again: a compaction resumes
 *    after its last committed step.  Nothing is lost: the previous
 *    checkpoint stays intact.
 * 4. Opening checks, in this order, and refuses with SL_ESTORE and a
 *    message naming the directory and the problem, changing nothing:
 *    the path is not a directory; the directory holds files but no
 *    data.mdb (not a store); data.mdb is not an LMDB file; data.mdb is
 *    damaged (SL_ECORRUPT, note 8); the magic is
 *    wrong (an LMDB file of someone else); the format version is not
 *    SL_STORE_FORMAT_VERSION (an older one: "DIR: store format 2 is older
 *    than this sluice's format 3; upgrade it with `sluice checkpoints
 *    --upgrade DIR` or resume from a savepoint taken with the older
 *    version"; a newer one: "store format version N is newer"); the graph
 *    fingerprint differs (the message quotes both).  A missing or empty
 *    directory is created and initialised; so is one that holds only
 *    "lock" and "lock.mdb" (an interrupted creation).  The "lock" file is
 *    created only once the checks that need no LMDB have passed, and
 *    removed again if a later check refuses the directory.
 * 5. Only one process may write a store: sl_store_open takes an exclusive
 *    flock on a "lock" file in the directory (as older versions do) and
 *    then on the directory itself, which cannot be deleted while it holds
 *    the store: deleting "lock" under a running job lets no second writer
 *    in.  A second writer gets SL_ESTORE "in use by another process".  A
 *    read_only open takes no exclusive lock: if a writer holds the
 *    directory, it reads beside it through LMDB's reader table (lock.mdb,
 *    which the writer made); if none does, it holds a shared flock of the
 *    directory and of "lock" if it exists (a writer of an older version
 *    holds only that one, and is then read beside in the same way) until
 *    it closes, and opens with MDB_NOLOCK, so it creates
 *    and writes no file at all (`sluice checkpoints` changes nothing),
 *    and a writer that starts meanwhile waits for it (at most 5 s, or
 *    lock_wait_ms, then SL_ESTORE "in use"): unregistered readers must
 *    not see pages reused.
 *    LMDB allows one handle per environment per process, so a second open
 *    of the same directory in one process is refused (SL_ESTORE "in use:
 *    already open in this process"), read-only or not.
 * 6. Tables (operators/table_sink.c) are the committed output of table
 *    sinks: plain key -> value maps, one per table name, all in the
 *    database "tables", each table's keys prefixed with its name's length
 *    and bytes (so a table is one contiguous key range), and beside them
 *    a row count per table, under u8 0 and the name.  Rows are put and
 *    deleted inside a checkpoint's write transaction (sl_store_put_row,
 *    sl_store_delete_row), so a table always reads as of the newest
 *    complete checkpoint, in step with the keyed state and the source
 *    positions.  The row counts are updated by the commit from what the
 *    transaction's puts and deletes added and removed.  Compaction does
 *    not touch tables (they are not a log); sl_store_wipe empties them.
 *    A store made before tables existed gets an empty "tables" database
 *    when a writer opens it; a read-only open of such a store reads every
 *    table as empty.  The format version is unchanged: the database is an
 *    addition that older code ignores.
 * 7. Savepoints.  sl_store_copy writes a compacted copy of a store (a
 *    read transaction: it holds the newest complete checkpoint, whole).
 *    sl_store_install makes such a copy the store of a state directory:
 *    it claims the directory (the lock of note 5), copies data.mdb into
 *    the directory SL_STORE_STAGING_NAME inside it, opens the copy there
 *    as a store (every check of note 4, with the copy's own fingerprint),
 *    rewrites its blobs and its fingerprint in one durable transaction,
 *    and only then renames the copy's data.mdb into the directory and
 *    fsyncs it.  A crash before the rename leaves the directory without
 *    data.mdb (or with the old one), a crash after it the installed
 *    store; a staging directory left behind is ignored by sl_store_open
 *    and removed by the next install.
 * 8. Damage.  LMDB 0.9 checksums no page and trusts its map: a truncated
 *    data.mdb faults (SIGBUS) past its end, a flipped page header sends
 *    its cursors and its page writer outside the page.  So before LMDB
 *    maps a data.mdb that no live writer holds (every writer open, every
 *    reader open without a writer, sl_store_inspect, the copy of an
 *    install), storage/lmdb_check.c reads it with pread and walks every
 *    page the newest meta page reaches (its notes 1-7): meta pages, file
 *    size against the last page, every tree, overflow run and the free
 *    list.  A file that fails is refused with SL_ECORRUPT and a message
 *    "DIR/data.mdb is damaged: ..." naming the page and the problem; so
 *    is one whose older meta page reaches past the newest's last page
 *    (store.c note 5: a damaged txnid would open an older snapshot).  What
 *    the walk lets through keeps every offset and order LMDB relies on;
 *    a flipped byte inside a key or value then fails its checksum (note
 *    1) when read: SL_ECORRUPT "DIR: data.mdb is damaged: database ...".
 *    Damage to bytes nothing live uses (free pages, the older meta's
 *    trees, unused page space, lock.mdb and lock of a store no process
 *    has open) changes nothing: the store reads exactly as before.  The
 *    cost is one pread a page at open (O(store)).  A 0-byte data.mdb is
 *    an interrupted creation (note 4), not damage.  A full file system
 *    under a commit is ENOSPC naming data.mdb (LMDB itself says EIO).
 *
 * CONCURRENCY: a store handle is used by one thread at a time (the engine's
 * writer thread, or the restoring thread before the job runs).  A write
 * transaction is begun and ended (commit, abort, close) on one thread:
 * LMDB's write lock is a mutex.  The exception are the table reads
 * (sl_store_table_*), which any number of threads may call at once, also
 * while the writer writes, compacts or grows the map: each runs in a read
 * transaction of its own, reports into its caller's message buffer, and
 * holds the read side of a lock whose write side sl_store_grow takes
 * (LMDB remaps the file when the map grows: no read may be open then).
 * sl_store_copy (a savepoint) and sl_store_read_latest are the same kind
 * of call.
 */
#ifndef SL_STORE_H
#define SL_STORE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define SL_STORE_FORMAT_VERSION 3u
#define SL_STORE_CHECKSUM_BYTES 8u
/** sl_store_grow stops doubling here (1 TiB). */
#define SL_STORE_MAX_MAP_BYTES (1ull << 40)

typedef struct sl_store sl_store;
typedef struct sl_store_txn sl_store_txn;

typedef struct sl_store_options {
  /** Required: a text that identifies the job graph (operator ids, names
   * and kinds); a store written under another fingerprint is refused.
   * A read_only open may pass NULL to skip the check. */
  const char *graph_fingerprint;
  /** 1: commit without fsync (MDB_NOSYNC).  A process crash loses
   * nothing; a power cut may lose the latest checkpoints, and on a file
   * system that does not keep write order may corrupt the store (LMDB's
   * MDB_NOSYNC caveat). */
  int no_sync;
  /** Initial map size in bytes; 0 = 64 MiB.  Grows by doubling. */
  uint64_t initial_map_bytes;
  /** 1: open an existing store read-only (no exclusive lock, no writes;
   * without a live writer no file is created or written either, note 5);
   * ENOENT if there is none. */
  int read_only;
  /** With read_only: open without LMDB's lock file (MDB_NOLOCK) even if
   * a writer holds the directory: for a store no process writes (a
   * savepoint's copy).  A writer at the same time could change pages
   * under such a reader. */
  int no_lock_file;
  /** Writer: how long to wait at most for readers that hold the store
   * (note 5) before SL_ESTORE "in use"; 0 = 5000 ms.  Tests that need the
   * refusal, not the wait, set a few milliseconds. */
  uint32_t lock_wait_ms;
} sl_store_options;

/** Open (creating if missing or empty) the store in dir.  On error *store is
 * NULL and err (if not NULL) holds a message naming dir and the problem.
 * Errors: SL_ESTORE (notes 4 and 5), SL_ECORRUPT (data.mdb is damaged,
 * note 8; a meta value fails its checksum or is missing), EINVAL (NULL argument or fingerprint), ENOENT
 * (read_only and no store), ENOMEM, errno values from the file system,
 * LMDB codes. */
int sl_store_open(const char *dir, const sl_store_options *options,
                  sl_store **store, char *err, size_t err_bytes);

/** Close; an open transaction is aborted (on the thread that began it).
 * NULL is accepted. */
void sl_store_close(sl_store *store);

/** The message of the store's last failure ("" if none), for the thread
 * that uses the handle (store.h CONCURRENCY). */
const char *sl_store_error(const sl_store *store);

/** The same message copied into out (cut to fit), whole even while
 * another thread's call on the store fails at the same moment: for
 * callers that share the handle (parallel restores, table reads). */
void sl_store_error_copy(sl_store *store, char *out, size_t out_bytes);

/** Id of the newest complete checkpoint, 0 if none (for a read_only
 * handle: as of sl_store_open). */
uint64_t sl_store_latest(const sl_store *store);

/** Current map size in bytes. */
uint64_t sl_store_map_bytes(const sl_store *store);

/** Delete every checkpoint, blob and state entry (the log and both
 * bases; start fresh) and every table row, in one durable transaction;
 * keeps meta with latest = 0 (and "next_seq": seqs only grow).  Errors:
 * EBUSY (a transaction is open), EACCES (read-only), LMDB codes. */
int sl_store_wipe(sl_store *store);

/** Begin the write transaction of one checkpoint.  One at a time: the
 * handle *txn belongs to the store and stays valid until exactly one
 * sl_store_commit or sl_store_abort ends it, also after a failure.
 * Errors: EBUSY (one is open, or a failed one was not ended), EACCES
 * (read-only), LMDB codes. */
int sl_store_begin(sl_store *store, sl_store_txn **txn);

/** Put (replace) one keyed-state entry: adds it to the transaction's
 * chunks (note 2).  Keys given in ascending (op, key group, key) order make
 * one sorted run; other orders work, but every key below the one before
 * starts a new run, which later reads must merge.  Errors: MDB_MAP_FULL
 * (note 3), EINVAL (key too long: key_bytes + 12 > 511, the limit of
 * format 2, kept so that every store converts; value too long),
 * ENOMEM, LMDB codes.  On error the transaction has failed: everything it
 * wrote is discarded at once (so sl_store_grow may run), later puts,
 * deletes and sl_store_commit return the same error, and the caller ends
 * it with sl_store_abort (or sl_store_commit).  A put on an ended
 * transaction returns EINVAL. */
int sl_store_put_state(sl_store_txn *txn, uint16_t op, uint16_t key_group,
                       const void *key, uint32_t key_bytes,
                       const void *value, uint32_t value_bytes);

/** Delete one keyed-state entry (appends a tombstone to the log); absent
 * is not an error.  Errors as put. */
int sl_store_delete_state(sl_store_txn *txn, uint16_t op, uint16_t key_group,
                          const void *key, uint32_t key_bytes);

/** Replace the blob of (op, instance).  Errors as put. */
int sl_store_put_blob(sl_store_txn *txn, uint16_t op, uint16_t instance,
                      const void *data, uint32_t bytes);

/** Write the record of checkpoint id, set latest = id, and commit (durably
 * unless no_sync).  id must be greater than the latest (EINVAL otherwise).
 * The transaction is finished either way.  Errors: the failure of a failed
 * transaction, EINVAL, MDB_MAP_FULL, ENOMEM, SL_ECORRUPT (a blob or
 * "latest" does not read back), EIO and other LMDB/errno codes (the store
 * stays at the previous checkpoint). */
int sl_store_commit(sl_store_txn *txn, uint64_t id, const void *record,
                    uint32_t record_bytes);

/** Abort an open or failed transaction.  NULL and an already ended
 * transaction are accepted (no-op). */
void sl_store_abort(sl_store_txn *txn);

/** Double the map size.  No transaction may be open (a failed one may:
 * it holds nothing); table reads of other threads are waited for.
 * Errors: EBUSY, EACCES (read-only), ENOMEM (past SL_STORE_MAX_MAP_BYTES),
 * LMDB codes. */
int sl_store_grow(sl_store *store);

/* Reading: each call runs in its own read transaction, so it sees
 * committed checkpoints only, also while a write transaction is open. */

/** Call fn for every state entry of op with key group in
 * [group_first, group_last] in the merged view (note 2), each key once, in
 * key order.  Stops and returns fn's value if nonzero.  key and value point
 * into the map: valid during the call only.  Cost: per run (the base, each
 * of the log's runs) a seek to the range's first chunk and a pass over the
 * chunks that overlap the range, each checked (checksum, then every length
 * and the order) as it is reached; with one run the entries go straight
 * to fn, with more they are merged by a tournament tree of the runs
 * (ceil(log2 runs) comparisons an entry).  Memory: 32 bytes a chunk of
 * the range.  Several threads may read
 * one store at once (each read has its own transaction and buffers), also
 * while its writer writes or compacts: restores run in parallel, one per
 * instance thread.  Only the message of sl_store_error() is shared, so of
 * two reads failing at once the later message wins: read it with
 * sl_store_error_copy(), which never returns half of one.  Errors: SL_ECORRUPT
 * (checksum, with the chunk's key in the message), EINVAL (group_first >
 * group_last), ENOMEM, LMDB codes. */
int sl_store_read_state(sl_store *store, uint16_t op, uint16_t group_first,
                        uint16_t group_last,
                        int (*fn)(void *arg, uint16_t key_group,
                                  const void *key, uint32_t key_bytes,
                                  const void *value, uint32_t value_bytes),
                        void *arg);

/* Compaction (note 3). */

/** What one sl_store_compact did; all zero if it had nothing to do (or
 * did not finish). */
typedef struct sl_store_compaction {
  uint64_t log_entries_read;  /* the merged runs' entries */
  uint64_t base_entries_read; /* the whole old base */
  uint64_t entries_written;   /* into the new base: the live keys */
  uint64_t bytes_written;     /* its chunks, with their checksums */
  uint64_t duration_us;       /* the steps' time, begin to durable commit */
} sl_store_compaction;

/** Merge the current base and the log into the other base and drop the
 * merged runs (note 3), if the log holds at least min_log_entries
 * entries, at least one, and at least as many as the base (so the work
 * of a compaction, about base + log entries, is at most twice the log
 * it removes); else do nothing and return 0.  The counts are meta's
 * "log_entries" and "base_entries": deciding reads no entry.  A
 * compaction cancelled or failed between its steps is resumed by the next
 * call (which then does not decide again).  stats (may be NULL) is
 * zeroed, then filled if a compaction was finished.  Needs memory for a
 * chunk and the references of the chunks (32 bytes each), and map space
 * for a second base.  On error the merged view is unchanged.  Errors:
 * EBUSY (a transaction is open, or a failed one was not ended), EACCES
 * (read-only), ECANCELED (note sl_store_set_cancel), MDB_MAP_FULL (grow
 * with sl_store_grow and call again), SL_ECORRUPT, ENOMEM, EIO and other
 * LMDB codes. */
int sl_store_compact(sl_store *store, uint64_t min_log_entries,
                     sl_store_compaction *stats);

/** While *cancel is nonzero, a running compaction stops within 4096
 * entries, or before its next step, with ECANCELED: the step under way
 * ends at the chunk it is building and commits, so every call makes
 * progress; the steps committed stay (the next sl_store_compact resumes).
 * While *cancel is SL_STORE_CANCEL_ABANDON the step under way is given up
 * instead, uncommitted (what it wrote is undone; the steps before stay):
 * for a caller that must have the store back at once, not after a chunk
 * and a durable commit (a restart after a failure, checkpoint_writer.c
 * note 5).  cancel (may be NULL) must outlive the store or be reset. */
#define SL_STORE_CANCEL_ABANDON 2
void sl_store_set_cancel(sl_store *store, const _Atomic int *cancel);

/* The fault layer (failure injection, in the manner of SQLite's test_vfs):
 * before each put and each commit, and after each commit's sync, the store
 * asks fn; a nonzero answer (an errno value or an LMDB code such as
 * MDB_MAP_FULL) becomes that call's result as if LMDB had returned it.  A
 * failed put or commit changes nothing (the transaction is aborted); a
 * failed sync comes after a commit that did happen, as when fsync reports
 * an error: the checkpoint is durable, but its writer is told it failed.
 * Compactions are not faulted (a failed one loses nothing and fails
 * nothing, so a fault there would only go unseen). */
enum sl_store_call {
  SL_STORE_CALL_PUT,
  SL_STORE_CALL_COMMIT,
  SL_STORE_CALL_SYNC,
};
typedef int (*sl_store_fault_fn)(void *arg, enum sl_store_call call);
void sl_store_set_fault(sl_store *store, sl_store_fault_fn fn, void *arg);

/* For tests only: the next compactions of this process raise SIGKILL
 * right after their appends-th entry into the new base (counted over all
 * steps; 0: never), so a test can kill one inside or between steps. */
void sl_store_test_crash_after(uint64_t appends);

/* For tests only: compaction steps of about this many chunk bytes (0: the
 * default, 16 MiB), so a test of a small store sees several steps. */
void sl_store_test_compaction_step_bytes(uint64_t bytes);

/* For tests only: the budget of the copies of one merged view's chunks
 * (store_view.c note 3; SIZE_MAX: the default, 16 MiB; 0: none, every
 * chunk is read in the map), and how many chunks this process's views
 * have read as copies so far. */
void sl_store_test_view_copy_budget(size_t bytes);
uint64_t sl_store_test_view_copies(void);

/** An upper bound of the keyed-state entries of every operator: base plus
 * log entries (log entries may repeat or delete keys), from meta's
 * counts, without reading any entry.  Errors: SL_ECORRUPT, LMDB codes. */
int sl_store_entry_bound(sl_store *store, uint64_t *entries);

/** The two counts behind the bound: *base_entries, the current base's
 * entries (live keys, as of the last compaction), and *log_entries, the
 * log's (puts and tombstones; a key may repeat across runs).  Read from
 * meta, without reading any entry.  Errors: SL_ECORRUPT, LMDB codes. */
int sl_store_entry_counts(sl_store *store, uint64_t *base_entries,
                          uint64_t *log_entries);

/** The blob of (op, instance) as a malloc'd copy (*data, *bytes; never
 * NULL on success, also for 0 bytes).  Errors: SL_ENOTFOUND, SL_ECORRUPT,
 * ENOMEM, LMDB codes. */
int sl_store_get_blob(sl_store *store, uint16_t op, uint16_t instance,
                      void **data, uint32_t *bytes);

/** The record of checkpoint id as a malloc'd copy.  Errors as get_blob. */
int sl_store_get_checkpoint(sl_store *store, uint64_t id, void **record,
                            uint32_t *bytes);

/** Ids of all stored checkpoint records, ascending, as a malloc'd array
 * (never NULL on success).  Errors: ENOMEM, SL_ECORRUPT, LMDB codes. */
int sl_store_list_checkpoints(sl_store *store, uint64_t **ids, size_t *count);

/* Tables (note 6). */

/** Longest table name in bytes (without NUL).  A name is 1 ..
 * SL_STORE_TABLE_NAME_MAX bytes of A-Z a-z 0-9 '_' '-' '.'. */
#define SL_STORE_TABLE_NAME_MAX 40u
/** Longest row key in bytes: LMDB's 511-byte keys less the table prefix
 * (a length byte and the longest name). */
#define SL_STORE_TABLE_KEY_MAX (511u - 1u - SL_STORE_TABLE_NAME_MAX)
/** Tables one write transaction may write. */
#define SL_STORE_TXN_TABLES 64

/** 0 if name is a valid table name, else EINVAL (NULL, empty, too long, or
 * a byte outside the allowed set). */
int sl_store_table_name_check(const char *name);

/** The handle (*table) under which txn writes rows of the table name; the
 * same name gives the same handle until the transaction ends.  Errors:
 * EINVAL (bad name; the transaction is not failed by it), ENOSPC (more
 * than SL_STORE_TXN_TABLES tables in one transaction; it is not failed
 * either), and the errors of a failed or ended transaction. */
int sl_store_txn_table(sl_store_txn *txn, const char *name, int *table);

/** Put (insert or replace) one row of table (a handle of
 * sl_store_txn_table).  Errors: EINVAL (key over SL_STORE_TABLE_KEY_MAX
 * bytes, value too long, bad handle), and otherwise as
 * sl_store_put_state, which also says what a failure leaves. */
int sl_store_put_row(sl_store_txn *txn, int table, const void *key,
                     uint32_t key_bytes, const void *value,
                     uint32_t value_bytes);

/** Delete one row; absent is not an error.  The fault layer sees it as a
 * put.  Errors as sl_store_put_row. */
int sl_store_delete_row(sl_store_txn *txn, int table, const void *key,
                        uint32_t key_bytes);

/* Table reads: see CONCURRENCY above.  Each call is one read transaction,
 * so it sees one complete checkpoint.  On failure err (err_bytes > 0, or
 * NULL) gets a message naming the directory, the table and the problem.
 * A table that no committed checkpoint has written reads as empty.
 * Errors of all: EINVAL (bad name or key, NULL argument), SL_ECORRUPT (a
 * value fails its checksum; the message names the key), ENOMEM, LMDB
 * codes. */

/** One row of table as a malloc'd copy (*value, never NULL on success,
 * also for 0 bytes; the caller frees it).  Errors: SL_ENOTFOUND (no such
 * row). */
int sl_store_table_get(sl_store *store, const char *table, const void *key,
                       uint32_t key_bytes, void **value,
                       uint32_t *value_bytes, char *err, size_t err_bytes);

typedef int (*sl_store_row_fn)(void *arg, const void *key, uint32_t key_bytes,
                               const void *value, uint32_t value_bytes);

/** Call fn for every row of table in key order (bytes, then length), with
 * key and value pointing into the map (valid during the call only).
 * Stops and returns fn's value if nonzero.  The read transaction stays
 * open for the whole walk (the map cannot grow meanwhile: keep fn short).
 * Errors: as above. */
int sl_store_table_scan(sl_store *store, const char *table,
                        sl_store_row_fn fn, void *arg, char *err,
                        size_t err_bytes);

/** The number of rows of table (a stored count: no walk).  Errors: as
 * above. */
int sl_store_table_count(sl_store *store, const char *table, uint64_t *rows,
                         char *err, size_t err_bytes);

/** The newest complete checkpoint, read now (sl_store_latest of a
 * read-only handle is as of its open).  Errors: SL_ECORRUPT, LMDB codes. */
int sl_store_read_latest(sl_store *store, uint64_t *id, char *err,
                         size_t err_bytes);

/* Savepoints (note 7; engine/savepoint.c). */

/** Name of the directory inside a state directory in which
 * sl_store_install builds the store before it moves in (note 7). */
#define SL_STORE_STAGING_NAME ".savepoint-install"

/** Write a compacted copy of the store, as of its newest complete
 * checkpoint, to dir/data.mdb (dir exists and holds no data.mdb):
 * mdb_env_copyfd2 with MDB_CP_COMPACT, inside a read transaction of its
 * own, so the writer, compactions and table reads go on meanwhile; only
 * sl_store_grow waits for the copy to end (LMDB may not remap while a
 * transaction of the process is open).  The file is fsync'd, and so is
 * dir.  *id gets the id of the checkpoint the copy holds (read back from
 * the copy: a checkpoint may complete while it is made), *bytes the size
 * of the copy.  Any thread may call it, also while the writer writes;
 * the message goes to err, never to the handle's buffer.  On error no
 * dir/data.mdb is left.  Errors: EEXIST (dir/data.mdb exists), errno
 * values from the file system, SL_ENOTFOUND (the copy holds no complete
 * checkpoint), SL_ECORRUPT, LMDB codes. */
int sl_store_copy(sl_store *store, const char *dir, uint64_t *id,
                  uint64_t *bytes, char *err, size_t err_bytes);

/** fsync the directory path, so the entries made, renamed or removed in
 * it survive a power cut (a state directory, a savepoint's directory).
 * Returns 0 or an errno value; nothing else changes. */
int sl_store_sync_dir(const char *path);

/** Creates the missing parents of dir (not dir itself), mode 0755, as the
 * store does for a state directory and savepoints for theirs: a host that
 * names a directory under a path of its own need not make the path first.
 * Returns 0 or an errno value (ENOTDIR: a parent exists and is not a
 * directory); then the parent that failed is in failed (may be NULL). */
int sl_store_make_parents(const char *dir, char *failed, size_t failed_bytes);

/** What sl_store_inspect read from a store directory. */
typedef struct sl_store_info {
  uint32_t format; /* meta "format" */
  /* The rest only when format is SL_STORE_FORMAT_VERSION: */
  uint64_t latest; /* the newest complete checkpoint, 0: none */
  char *graph;     /* meta "graph", NUL-terminated, malloc'd (free it) */
} sl_store_info;

/** Read the identity of the store in dir without opening it as a store:
 * no lock is taken and no file is created (LMDB's MDB_NOLOCK), so only
 * for a store no process writes (a savepoint).  A format other than
 * SL_STORE_FORMAT_VERSION is returned, not refused.  Errors: ENOENT (no
 * dir/data.mdb), SL_ESTORE (not an LMDB file or not a sluice store),
 * SL_ECORRUPT (data.mdb is damaged, note 8: it is walked first; a meta
 * value fails its checksum or is missing), ENOMEM, LMDB codes; err names
 * dir and the problem. */
int sl_store_inspect(const char *dir, sl_store_info *info, char *err,
                     size_t err_bytes);

/** Delete the blob of (op, instance) in txn; absent is not an error.  Not
 * seen by the fault layer.  Errors as sl_store_put_blob. */
int sl_store_delete_blob(sl_store_txn *txn, uint16_t op, uint16_t instance);

/** Commit txn without adding a checkpoint: meta "graph" becomes
 * graph_fingerprint and the blobs put get the id of the newest complete
 * checkpoint (they replace its blobs); "latest" and the log are
 * untouched.  Durable unless no_sync.  The transaction is finished
 * either way.  For the edit of sl_store_install.  Errors: EINVAL (state
 * or table rows were written, blobs were put with no checkpoint complete,
 * NULL fingerprint), the failure of a failed transaction, LMDB codes. */
int sl_store_commit_graph(sl_store_txn *txn, const char *graph_fingerprint);

/** Called by sl_store_install with the store being installed and an open
 * transaction of it: puts and deletes blobs.  Nonzero refuses the
 * install (the function writes its message to err). */
typedef int (*sl_store_edit_fn)(void *arg, sl_store *store,
                                sl_store_txn *txn, char *err,
                                size_t err_bytes);

typedef struct sl_store_install_options {
  const char *source_graph; /* required: the fingerprint of the copy */
  const char *graph;        /* required: the fingerprint it takes on */
  int replace;  /* 1: a store with checkpoints in dir is replaced */
  int no_sync;  /* as sl_store_options.no_sync */
  sl_store_edit_fn edit; /* may be NULL */
  void *edit_arg;
} sl_store_install_options;

/** Make a copy of the store in source_dir (its data.mdb; source_dir is
 * only read) the store of dir (note 7): dir is created if missing; it
 * must hold no store with checkpoints, unless replace.  The copy must
 * carry source_graph and a checkpoint; edit runs in one transaction of
 * it, which sl_store_commit_graph ends with graph.  A later sl_store_open
 * of dir with graph then finds the copy's newest checkpoint.  On error
 * dir holds what it held before (a directory this call made is removed
 * again) and err says why.  Errors: SL_EHASSTATE (dir holds checkpoints
 * and not replace), SL_ESTORE (dir is not a state directory or is in
 * use; the copy is not a sluice store, has another format or graph),
 * SL_ENOTFOUND (the copy holds no checkpoint), the edit's, SL_ECORRUPT,
 * EINVAL, ENOMEM, errno values, LMDB codes. */
int sl_store_install(const char *dir, const char *source_dir,
                     const sl_store_install_options *options, char *err,
                     size_t err_bytes);

/* Inspection (engine/inspect.c). */

/** What a store holds besides its checkpoint records, read in one read
 * transaction (so the parts agree with each other, also while a writer
 * commits).  graph is malloc'd (the caller frees it). */
typedef struct sl_store_view {
  uint64_t latest;       /* newest complete checkpoint, 0 if none */
  uint32_t format;       /* SL_STORE_FORMAT_VERSION */
  uint64_t log_entries;  /* keyed-state changes since the last compaction
                            (meta "log_entries") */
  uint64_t base_entries; /* keyed-state entries of the current base
                            (meta "base_entries") */
  uint64_t table_entries; /* rows and row counts of table sinks */
  char *graph;           /* the graph fingerprint, NUL-terminated */
} sl_store_view;

/** Called by sl_store_read_view for every blob, in (op, instance) order,
 * with the id of the checkpoint that wrote it; data points into the map
 * (valid during the call only).  A nonzero return stops the walk and is
 * returned. */
typedef int (*sl_store_blob_fn)(void *arg, uint16_t op, uint16_t instance,
                                uint64_t checkpoint_id, const void *data,
                                uint32_t bytes);

/** Fill *view and call fn (may be NULL) for every blob, all in one read
 * transaction.  On error view->graph is NULL and the store's message says
 * what failed.  Errors: SL_ECORRUPT (a value fails its checksum or is
 * malformed; the message names the key), ENOMEM, fn's value, LMDB codes. */
int sl_store_read_view(sl_store *store, sl_store_view *view,
                       sl_store_blob_fn fn, void *arg);

#endif /* SL_STORE_H */
