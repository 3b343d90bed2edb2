/* store_txn.c — the write transaction of a checkpoint: sl_store_begin,
 * state puts and deletes appended to the log, blobs, and the commit that
 * makes checkpoint n complete (store.h note 2); also the savepoint
 * edit's blob delete and graph commit, and grow and wipe, which need no
 * transaction open.  Table rows are written by store_table.c inside the
 * same transaction.
 *
 * NOTES ON THE IMPLEMENTATION
 *
 * 1. Blob ids.  A checkpoint's id is known only at sl_store_commit, so
 *    sl_store_put_blob writes id 0 and remembers the blob's key; the
 *    commit reads each of them back (checking the checksum), and puts it
 *    again with the real id, before it writes the record and "latest".  A
 *    committed blob never holds 0, so a read treats 0 as corruption.
 * 2. Transaction states.  The one sl_store_txn of a store is embedded in
 *    its handle, so its buffers are reused by every checkpoint and a stale
 *    pointer never points to freed memory.
 *
 *             sl_store_begin              put/delete/put_blob succeed
 *      IDLE ------------------> ACTIVE <------------------------+
 *       ^ ^                     |  |  \--------------------------+
 *       | |  sl_store_commit,   |  |  a call fails: store_txn_fail()
 *       | |  sl_store_abort     |  |  aborts the LMDB transaction at once
 *       | +---------------------+  v
 *       +-- sl_store_commit, -- FAILED   (calls return its failure)
 *           sl_store_abort
 *
 *    The LMDB write transaction exists exactly in ACTIVE (txn_check()).
 *    As a failed one holds nothing, the map may grow before it is ended.
 * 3. Chunks (store.h note 1).  State puts and deletes fill the chunk
 *    being built in the transaction's buffer (chunk.c); a chunk goes to
 *    the log as one value, with MDB_APPEND (its key starts with the
 *    transaction's seq, above every key logged), when the next entry
 *    would take it past CHUNK_TARGET_BYTES, when the operator changes,
 *    when a key comes below the one before, and at the commit.  A key
 *    below the one before starts a new run (its chunks get the next run
 *    number: a newer run wins over an older one); a key equal to the one
 *    before replaces it in the buffer (the newest version wins), which
 *    always works because a chunk is sent only before a new entry is
 *    added: the newest entry is always in the buffer.  So a caller that
 *    writes in key order (the engine) makes one run, and a few values of
 *    about 1 MiB.  The fault layer is asked once per state put or delete,
 *    as before, not for the chunk's put.
 */
#include "store_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "sluice.h"

/* ------------------------------------------------------------ transaction */

/* The transaction invariant of note 2 (for asserts). */
__attribute__((unused)) static bool txn_check(const sl_store_txn *t) {
  (void)t; /* only the asserts read it, and NDEBUG removes them */
  assert(t->store && &t->store->txn == t);
  assert((t->state == TXN_ACTIVE) == (t->mdb != 0));
  assert((t->state == TXN_FAILED) == (t->failure != 0));
  assert(t->blob_count <= t->blob_capacity);
  assert(t->last_key_bytes <= KEY_BUFFER_BYTES);
  assert(t->state == TXN_IDLE || t->seq == t->store->next_seq);
  return true;
}

/* 0 if t may take a put; else what the caller gets instead. */
int store_txn_usable(sl_store_txn *t) {
  if (!t)
    return EINVAL;
  assert(txn_check(t));
  if (t->state == TXN_FAILED)
    return t->failure; /* it stays failed (note 2) */
  if (t->state == TXN_IDLE)
    return store_fail(t->store, EINVAL, "the transaction has ended");
  return 0;
}

/* ACTIVE -> FAILED: discard everything written at once (note 2).  rc comes
 * from a *_fail call, so the message is already in place. */
int store_txn_fail(sl_store_txn *t, int rc) {
  assert(t->state == TXN_ACTIVE);
  assert(rc != 0);
  mdb_txn_abort(t->mdb);
  t->mdb = 0;
  t->rows = 0;
  t->state = TXN_FAILED;
  t->failure = rc;
  assert(txn_check(t));
  return rc;
}

/* ACTIVE or FAILED -> IDLE: an ACTIVE transaction is committed if
 * commit, else aborted.  Returns what mdb_txn_commit returned (0 if it
 * did not run); the LMDB transaction is freed either way. */
static int txn_close(sl_store_txn *t, bool commit) {
  int rc = 0;
  if (t->state == TXN_ACTIVE && commit)
    rc = mdb_txn_commit(t->mdb);
  else if (t->state == TXN_ACTIVE)
    mdb_txn_abort(t->mdb);
  t->mdb = 0;
  t->state = TXN_IDLE;
  t->failure = 0;
  t->blob_count = 0;
  t->table_count = 0;
  t->rows = 0; /* LMDB freed it with the transaction */
  assert(txn_check(t));
  return rc;
}

/* ACTIVE or FAILED -> IDLE, discarding what is written. */
static void txn_end(sl_store_txn *t) { txn_close(t, false); }

int sl_store_begin(sl_store *s, sl_store_txn **txn) {
  *txn = 0;
  if (s->read_only)
    return store_fail(s, EACCES, "begin: the store is open read-only");
  if (s->txn.state != TXN_IDLE)
    return store_fail(s, EBUSY,
                      "begin: a transaction is open (end it with "
                      "sl_store_commit or sl_store_abort)");
  assert(s->next_seq > 0 && s->next_seq < UINT64_MAX); /* meta_check */
  MDB_txn *mdb;
  assert(txn_check(&s->txn));
  assert(s->txn.blob_count == 0); /* txn_end cleared it */
  int rc = mdb_txn_begin(s->env, 0, 0, &mdb);
  if (rc != 0)
    return store_lmdb_fail(s, rc, "begin a write transaction");
  s->txn.mdb = mdb;
  s->txn.state = TXN_ACTIVE;
  s->txn.blob_count = 0;
  s->txn.table_count = 0;
  s->txn.rows = 0;
  s->txn.seq = s->next_seq;
  s->txn.last_key_bytes = 0;
  s->txn.chunk_open = false;
  s->txn.run = 0;
  s->txn.ordinal = 0;
  s->txn.entries = 0;
  assert(txn_check(&s->txn));
  *txn = &s->txn;
  return 0;
}

/* ------------------------------------------------------------ state, blobs */

/* Sends the chunk being built to the log (note 3), if it holds any. */
static int chunk_send(sl_store_txn *t) {
  sl_store *s = t->store;
  bool full = t->chunk_open && t->chunk.count > 0;
  t->chunk_open = false;
  if (!full)
    return 0;
  chunk_builder_close(&t->chunk);
  uint8_t key[LOG_KEY_BYTES];
  put_be64(key, t->seq);
  put_be32(key + LOG_RUN_AT, t->run);
  put_be16(key + LOG_LAST_AT, t->chunk.op);
  put_be16(key + LOG_LAST_AT + 2, t->chunk.last_group);
  put_be32(key + LOG_ORDINAL_AT, t->ordinal++);
  MDB_val k = {.mv_size = sizeof key, .mv_data = key};
  s->unfaulted = true; /* asked per entry already (note 3) */
  int rc = store_value_put(s, t->mdb, DB_LOG, &k, 0, 0, t->chunk.buffer,
                           t->chunk.bytes, MDB_APPEND);
  s->unfaulted = false;
  assert(rc != MDB_KEYEXIST); /* seq, run and ordinal ascend */
  return rc != 0 ? store_lmdb_fail(s, rc, "write a chunk of the log") : 0;
}

/* Adds a put (or a tombstone: value NULL) to the transaction's chunks
 * (note 3). */
static int log_append(sl_store_txn *t, uint16_t op, uint16_t key_group,
                      const void *key, uint32_t key_bytes,
                      const void *value, uint32_t value_bytes,
                      const char *what) {
  sl_store *s = t->store;
  int injected = s->fault ? s->fault(s->fault_arg, SL_STORE_CALL_PUT) : 0;
  if (injected)
    return store_txn_fail(t, store_lmdb_fail(s, injected, what));
  assert(key_bytes <= KEY_BUFFER_BYTES - STATE_PREFIX_BYTES);
  /* The state key is the prefix (op, key group: big-endian, so in number
   * order) and then key; it is compared with the one before part by
   * part, not assembled first: a key read back just after it was written
   * piecewise waits for those stores (about half of this function's time
   * at 1M puts). */
  uint32_t prefix = (uint32_t)op << 16 | key_group;
  size_t state_bytes = STATE_PREFIX_BYTES + key_bytes;
  int order = 1;
  if (t->last_key_bytes > 0) {
    assert(t->last_key_bytes >= STATE_PREFIX_BYTES);
    uint32_t last_prefix = get_be32(t->last_key);
    order = prefix != last_prefix
                ? (prefix < last_prefix ? -1 : 1)
                : key_compare(key_bytes > 0 ? key : t->last_key, key_bytes,
                              t->last_key + STATE_PREFIX_BYTES,
                              t->last_key_bytes - STATE_PREFIX_BYTES);
  }
  int rc = 0;
  if (order == 0) { /* the newest version wins: it is in the buffer */
    assert(t->chunk_open && t->chunk.count > 0);
    chunk_builder_drop_last(&t->chunk);
    t->entries--;
  }
  size_t need = chunk_entry_bytes(value == 0, key_bytes, value_bytes);
  if (order < 0 || (t->chunk_open && (t->chunk.op != op ||
                                       t->chunk.bytes + need >
                                           CHUNK_TARGET_BYTES)))
    rc = chunk_send(t);
  if (order < 0)
    t->run++; /* a new run, newer than the one before */
  if (rc == 0 && !t->chunk_open &&
      (rc = chunk_builder_start(&t->chunk, op)) != 0)
    rc = store_fail(s, rc, "%s: out of memory", what);
  t->chunk_open = rc == 0;
  if (rc == 0 && (rc = chunk_builder_add(&t->chunk, key_group, key,
                                         (uint16_t)key_bytes, value,
                                         value_bytes)) != 0)
    rc = store_fail(s, rc, "%s: out of memory", what);
  if (rc != 0)
    return store_txn_fail(t, rc);
  put_be16(t->last_key, op);
  put_be16(t->last_key + 2, key_group);
  chunk_copy(t->last_key + STATE_PREFIX_BYTES, key, key_bytes);
  t->last_key_bytes = state_bytes;
  t->entries++;
  return 0;
}

/* EINVAL (and a failed transaction) for a key LMDB cannot hold. */
static int check_state_key(sl_store_txn *t, uint32_t key_bytes,
                           const char *what) {
  sl_store *s = t->store;
  if (key_bytes <= s->state_key_max_bytes)
    return 0;
  return store_txn_fail(t,
                        store_fail(s, EINVAL,
                                   "%s: a key of %" PRIu32 " bytes is too long "
                                   "(at most %" PRIu32 ")",
                                   what, key_bytes, s->state_key_max_bytes));
}

/* EINVAL (and a failed transaction) for a value that, with head_bytes
 * ahead of it and the checksum behind, is longer than a u32 counts. */
static int check_value_bytes(sl_store_txn *t, uint32_t bytes,
                             uint32_t head_bytes, const char *what) {
  if (bytes <= UINT32_MAX - SL_STORE_CHECKSUM_BYTES - head_bytes)
    return 0;
  return store_txn_fail(t, store_fail(t->store, EINVAL,
                                      "%s: a value of %" PRIu32
                                      " bytes is too long",
                                      what, bytes));
}

int sl_store_put_state(sl_store_txn *txn, uint16_t op, uint16_t key_group,
                       const void *key, uint32_t key_bytes,
                       const void *value, uint32_t value_bytes) {
  int rc = store_txn_usable(txn);
  if (rc == 0)
    rc = check_state_key(txn, key_bytes, "put state");
  if (rc == 0)
    rc = check_value_bytes(txn, value_bytes, CHUNK_PUT_HEAD_BYTES + key_bytes,
                           "put state");
  if (rc != 0)
    return rc;
  /* A 0-byte value may come as NULL; NULL means a tombstone below. */
  static const uint8_t empty[1];
  return log_append(txn, op, key_group, key, key_bytes,
                    value_bytes > 0 ? value : empty, value_bytes,
                    "put state");
}

int sl_store_delete_state(sl_store_txn *txn, uint16_t op, uint16_t key_group,
                          const void *key, uint32_t key_bytes) {
  int rc = store_txn_usable(txn);
  if (rc == 0)
    rc = check_state_key(txn, key_bytes, "delete state");
  if (rc != 0)
    return rc;
  return log_append(txn, op, key_group, key, key_bytes, 0, 0,
                    "delete state");
}

/* Remembers a blob's key for the commit's rewrite (note 1). */
static int remember_blob(sl_store_txn *t, uint16_t op, uint16_t instance) {
  if (t->blob_count == t->blob_capacity) {
    size_t capacity = t->blob_capacity ? 2 * t->blob_capacity : 64;
    uint32_t *keys = realloc(t->blob_keys, capacity * sizeof *keys);
    if (!keys)
      return store_fail(t->store, ENOMEM, "put blob: out of memory");
    t->blob_keys = keys;
    t->blob_capacity = capacity;
  }
  t->blob_keys[t->blob_count++] = (uint32_t)op << 16 | instance;
  return 0;
}

int sl_store_put_blob(sl_store_txn *txn, uint16_t op, uint16_t instance,
                      const void *data, uint32_t bytes) {
  int rc = store_txn_usable(txn);
  if (rc == 0)
    rc = check_value_bytes(txn, bytes, BLOB_ID_BYTES, "put blob");
  if (rc != 0)
    return rc;
  sl_store *s = txn->store;
  uint8_t key_bytes[BLOB_KEY_BYTES], pending_id[BLOB_ID_BYTES] = {0};
  MDB_val key = blob_key(key_bytes, op, instance);
  rc = store_value_put(s, txn->mdb, DB_BLOBS, &key, pending_id,
                       sizeof pending_id, data, bytes, 0);
  if (rc != 0)
    return store_txn_fail(txn, store_lmdb_fail(s, rc, "put blob"));
  rc = remember_blob(txn, op, instance);
  return rc != 0 ? store_txn_fail(txn, rc) : 0;
}

/* ------------------------------------------------------------ commit */

/* Gives every blob of this transaction its checkpoint id (note 1). */
static int commit_blob_ids(sl_store_txn *t, uint64_t id) {
  sl_store *s = t->store;
  for (size_t i = 0; i < t->blob_count; i++) { /* blobs put, at most */
    uint8_t key_bytes[BLOB_KEY_BYTES];
    MDB_val key = blob_key(key_bytes, (uint16_t)(t->blob_keys[i] >> 16),
                           (uint16_t)t->blob_keys[i]);
    MDB_val stored, payload;
    int rc = mdb_get(t->mdb, s->dbi[DB_BLOBS], &key, &stored);
    if (rc != 0)
      return store_lmdb_fail(s, rc, "commit: read a blob back");
    if ((rc = store_value_open(s, DB_BLOBS, &key, &stored, &payload)) != 0)
      return rc;
    assert(payload.mv_size >= BLOB_ID_BYTES);
    uint64_t stored_id = get_le64(payload.mv_data);
    if (stored_id == id)
      continue; /* put twice in this transaction: already rewritten */
    assert(stored_id == 0);
    size_t body_bytes = payload.mv_size - BLOB_ID_BYTES;
    if (body_bytes > t->copy_capacity_bytes) {
      uint8_t *copy = realloc(t->copy, body_bytes);
      if (!copy)
        return store_fail(s, ENOMEM, "commit: out of memory");
      t->copy = copy;
      t->copy_capacity_bytes = body_bytes;
    }
    if (body_bytes > 0) /* the page may move under the put: copy first */
      memcpy(t->copy, (uint8_t *)payload.mv_data + BLOB_ID_BYTES, body_bytes);
    uint8_t head[BLOB_ID_BYTES];
    put_le64(head, id);
    rc = store_value_put(s, t->mdb, DB_BLOBS, &key, head, sizeof head, t->copy,
                         body_bytes, 0);
    if (rc != 0)
      return store_lmdb_fail(s, rc, "commit: rewrite a blob");
  }
  return 0;
}

/* The record of checkpoint id, "latest" = id and "next_seq" (store.h note
 * 2); "latest" is read back before the commit sends them to disk. */
static int commit_record(sl_store_txn *t, uint64_t id, const void *record,
                         uint32_t record_bytes) {
  sl_store *s = t->store;
  if (record_bytes > UINT32_MAX - SL_STORE_CHECKSUM_BYTES)
    return store_fail(s, EINVAL, "commit: a record of %" PRIu32
                      " bytes is too long", record_bytes);
  uint8_t key_bytes[CHECKPOINT_KEY_BYTES];
  put_be64(key_bytes, id);
  MDB_val key = {.mv_size = sizeof key_bytes, .mv_data = key_bytes};
  int rc = store_value_put(s, t->mdb, DB_CHECKPOINTS, &key, 0, 0, record,
                           record_bytes, 0);
  if (rc == 0)
    rc = store_meta_put_u64(s, t->mdb, "latest", id);
  assert(t->seq < UINT64_MAX); /* sl_store_begin asserts it */
  if (rc == 0)
    rc = store_meta_put_u64(s, t->mdb, "next_seq", t->seq + 1);
  if (rc != 0)
    return store_lmdb_fail(s, rc, "commit: write the checkpoint record");
  uint64_t latest = 0;
  rc = store_meta_get_u64(s, t->mdb, "latest", &latest);
  if (rc == 0 && latest != id)
    return store_fail(s, SL_ECORRUPT,
                      "commit: \"latest\" reads back as %" PRIu64
                      ", not %" PRIu64, latest, id);
  return rc;
}

int sl_store_commit(sl_store_txn *txn, uint64_t id, const void *record,
                    uint32_t record_bytes) {
  int rc = store_txn_usable(txn);
  if (rc != 0) {
    if (txn)
      txn_end(txn); /* a failed transaction is finished by its commit */
    return rc;
  }
  sl_store *s = txn->store;
  if (id <= s->latest)
    rc = store_fail(s, EINVAL,
                    "commit: checkpoint %" PRIu64 " is not newer than the "
                    "latest, %" PRIu64, id, s->latest);
  if (rc == 0)
    rc = chunk_send(txn);
  if (rc == 0 && txn->entries > 0)
    rc = store_meta_add_u64(s, txn->mdb, "log_entries",
                            (int64_t)txn->entries);
  if (rc == 0)
    rc = commit_blob_ids(txn, id);
  if (rc == 0)
    rc = store_commit_table_counts(txn);
  if (rc == 0)
    rc = commit_record(txn, id, record, record_bytes);
  if (rc != 0) {
    txn_end(txn);
    return rc;
  }
  assert(id > s->latest);
  int injected = s->fault ? s->fault(s->fault_arg, SL_STORE_CALL_COMMIT) : 0;
  /* An injected fault aborts: nothing is committed. */
  rc = txn_close(txn, !injected);
  if (injected)
    return store_lmdb_fail(s, injected, "commit (injected fault)");
  if (rc != 0)
    return store_lmdb_fail(s, rc, "commit");
  s->latest = id;
  s->next_seq++;
  injected = s->fault ? s->fault(s->fault_arg, SL_STORE_CALL_SYNC) : 0;
  if (injected) /* committed, but reported as a failed fsync */
    return store_lmdb_fail(s, injected, "commit's sync (injected fault)");
  return 0;
}

void sl_store_set_fault(sl_store *s, sl_store_fault_fn fn, void *arg) {
  s->fault = fn;
  s->fault_arg = arg;
}

void sl_store_abort(sl_store_txn *txn) {
  if (txn)
    txn_end(txn);
}

/* ------------------------------------------------------------ grow, wipe */

int sl_store_grow(sl_store *s) {
  if (s->read_only)
    return store_fail(s, EACCES, "grow: the store is open read-only");
  if (s->txn.state == TXN_ACTIVE)
    return store_fail(s, EBUSY, "grow: a transaction is open");
  uint64_t now_bytes = sl_store_map_bytes(s);
  if (now_bytes > SL_STORE_MAX_MAP_BYTES / 2)
    return store_fail(s, ENOMEM,
                      "grow: the map of %" PRIu64 " bytes may not double "
                      "past %llu",
                      now_bytes, SL_STORE_MAX_MAP_BYTES);
  /* Waits for the table reads of other threads to end (store_table.c
   * note 1). */
  pthread_rwlock_wrlock(&s->map_lock);
  int rc = mdb_env_set_mapsize(s->env, (size_t)(2 * now_bytes));
  pthread_rwlock_unlock(&s->map_lock);
  if (rc != 0)
    return store_lmdb_fail(s, rc, "grow: mdb_env_set_mapsize");
  assert(sl_store_map_bytes(s) >= 2 * now_bytes);
  return 0;
}

int sl_store_wipe(sl_store *s) {
  if (s->read_only)
    return store_fail(s, EACCES, "wipe: the store is open read-only");
  if (s->txn.state != TXN_IDLE)
    return store_fail(s, EBUSY, "wipe: a transaction is open");
  MDB_txn *txn;
  int rc = mdb_txn_begin(s->env, 0, 0, &txn);
  if (rc != 0)
    return store_lmdb_fail(s, rc, "wipe: begin");
  /* Every database but meta: the log, both bases and the tables too.
   * "next_seq" stays: seqs only grow. */
  assert(atomic_load(&s->tables_open)); /* store_table.c note 1 */
  for (int db = DB_CHECKPOINTS; db < DB_COUNT && rc == 0; db++)
    rc = mdb_drop(txn, s->dbi[db], 0); /* empty it, keep the database */
  if (rc == 0)
    rc = store_meta_put_u64(s, txn, "latest", 0);
  if (rc == 0)
    rc = store_meta_put_u64(s, txn, "base", 0);
  if (rc == 0)
    rc = store_meta_put_u64(s, txn, "log_entries", 0);
  if (rc == 0)
    rc = store_meta_put_u64(s, txn, "base_entries", 0);
  store_compaction_forget(s); /* its runs and partial base are gone */
  rc = store_write_end(s, txn, rc, "wipe", "wipe: commit");
  if (rc != 0)
    return rc;
  s->latest = 0;
  rc = s->no_sync ? mdb_env_sync(s->env, 1) : 0; /* durable even so */
  return rc != 0 ? store_lmdb_fail(s, rc, "wipe: sync") : 0;
}

/* ------------------------------------------------------------ savepoints */

int sl_store_delete_blob(sl_store_txn *txn, uint16_t op, uint16_t instance) {
  int rc = store_txn_usable(txn);
  if (rc != 0)
    return rc;
  sl_store *s = txn->store;
  uint8_t key_bytes[BLOB_KEY_BYTES];
  MDB_val key = blob_key(key_bytes, op, instance);
  rc = mdb_del(txn->mdb, s->dbi[DB_BLOBS], &key, 0);
  if (rc != 0 && rc != MDB_NOTFOUND)
    return store_txn_fail(txn, store_lmdb_fail(s, rc, "delete blob"));
  /* A blob put earlier in txn is no longer there for commit_blob_ids. */
  uint32_t gone = (uint32_t)op << 16 | instance;
  for (size_t i = 0; i < txn->blob_count;) /* one pass over the puts */
    if (txn->blob_keys[i] == gone)
      txn->blob_keys[i] = txn->blob_keys[--txn->blob_count];
    else
      i++;
  return 0;
}

int sl_store_commit_graph(sl_store_txn *txn, const char *graph_fingerprint) {
  int rc = store_txn_usable(txn);
  if (rc != 0) {
    if (txn)
      txn_end(txn);
    return rc;
  }
  sl_store *s = txn->store;
  if (!graph_fingerprint)
    rc = store_fail(s, EINVAL, "commit graph: no fingerprint");
  else if (txn->last_key_bytes > 0 || txn->table_count > 0)
    rc = store_fail(s, EINVAL, "commit graph: the transaction wrote keyed "
                    "state or table rows");
  else if (txn->blob_count > 0 && s->latest == 0)
    rc = store_fail(s, EINVAL, "commit graph: blobs were put, but no "
                    "checkpoint is complete to hold them");
  if (rc == 0)
    rc = commit_blob_ids(txn, s->latest); /* note 1, with the latest id */
  MDB_val key = meta_key("graph");
  if (rc == 0 && (rc = store_value_put(s, txn->mdb, DB_META, &key, 0, 0,
                                       graph_fingerprint,
                                       strlen(graph_fingerprint), 0)) != 0)
    rc = store_lmdb_fail(s, rc, "commit graph: write meta \"graph\"");
  if (rc != 0) {
    txn_end(txn);
    return rc;
  }
  rc = txn_close(txn, true);
  return rc != 0 ? store_lmdb_fail(s, rc, "commit graph") : 0;
}

