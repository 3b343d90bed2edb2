/* store_records.c — reads of what a checkpoint holds beside keyed state:
 * blobs (store_txn.c note 1), checkpoint records, the list of complete
 * checkpoints, and the inspection view of a whole store
 * (sl_store_read_view).
 */
#include "store_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "sluice.h"

/* ------------------------------------------------------------ records */

/* The payload under key in db, checked, minus its first head_bytes (read
 * into head), as a malloc'd copy. */
static int read_copy(sl_store *s, int db, MDB_val *key, uint8_t *head,
                     size_t head_bytes, void **data, uint32_t *bytes) {
  MDB_txn *txn;
  int rc = store_read_begin(s, &txn);
  if (rc != 0)
    return rc;
  MDB_val stored, payload;
  rc = mdb_get(txn, s->dbi[db], key, &stored);
  if (rc == MDB_NOTFOUND) {
    char text[3 * MESSAGE_KEY_BYTES + 64];
    store_key_text(db, key, text, sizeof text);
    rc = store_fail(s, SL_ENOTFOUND, "database %s has no %s", db_names[db],
                    text);
  } else if (rc != 0) {
    rc = store_lmdb_fail(s, rc, "read");
  } else {
    rc = store_value_open(s, db, key, &stored, &payload);
  }
  if (rc == 0 && payload.mv_size < head_bytes)
    rc = store_corrupt(s, db, key, "value too short");
  size_t body_bytes = rc == 0 ? payload.mv_size - head_bytes : 0;
  void *copy = rc == 0 ? malloc(body_bytes > 0 ? body_bytes : 1) : 0;
  if (rc == 0 && !copy)
    rc = store_fail(s, ENOMEM, "read: out of memory");
  if (rc == 0) {
    if (head_bytes > 0)
      memcpy(head, payload.mv_data, head_bytes);
    if (body_bytes > 0)
      memcpy(copy, (const uint8_t *)payload.mv_data + head_bytes, body_bytes);
    *data = copy;
    *bytes = (uint32_t)body_bytes;
  }
  mdb_txn_abort(txn);
  return rc;
}

int sl_store_get_blob(sl_store *s, uint16_t op, uint16_t instance,
                      void **data, uint32_t *bytes) {
  *data = 0;
  *bytes = 0;
  uint8_t key_bytes[BLOB_KEY_BYTES], head[BLOB_ID_BYTES];
  MDB_val key = blob_key(key_bytes, op, instance);
  void *copy;
  uint32_t copy_bytes;
  int rc = read_copy(s, DB_BLOBS, &key, head, sizeof head, &copy,
                     &copy_bytes);
  if (rc != 0)
    return rc;
  /* Committed blobs carry their checkpoint's id (store_txn.c note 1); a
   * writer knows the latest exactly, a reader only as of its open. */
  uint64_t id = get_le64(head);
  if (id == 0 || (!s->read_only && id > s->latest)) {
    free(copy);
    return store_corrupt(s, DB_BLOBS, &key,
                         "blob tagged with no valid checkpoint");
  }
  *data = copy;
  *bytes = copy_bytes;
  return 0;
}

int sl_store_get_checkpoint(sl_store *s, uint64_t id, void **record,
                            uint32_t *bytes) {
  *record = 0;
  *bytes = 0;
  uint8_t key_bytes[CHECKPOINT_KEY_BYTES];
  put_be64(key_bytes, id);
  MDB_val key = {.mv_size = sizeof key_bytes, .mv_data = key_bytes};
  return read_copy(s, DB_CHECKPOINTS, &key, 0, 0, record, bytes);
}

/* The ids in key order; entries (the database's count) bounds the walk
 * and sizes ids. */
static int scan_checkpoints(sl_store *s, MDB_cursor *cursor, uint64_t *ids,
                            size_t entries, size_t *count) {
  MDB_val key, value;
  size_t n = 0;
  int rc = mdb_cursor_get(cursor, &key, &value, MDB_FIRST);
  for (; rc == 0; rc = mdb_cursor_get(cursor, &key, &value, MDB_NEXT)) {
    if (n >= entries) /* ids has room for entries */
      return store_fail(s, SL_ECORRUPT,
                        "list checkpoints: more than the %zu counted",
                        entries);
    if (key.mv_size != CHECKPOINT_KEY_BYTES)
      return store_corrupt(s, DB_CHECKPOINTS, &key, "key is not a u64 id");
    uint64_t id = get_be64(key.mv_data);
    /* Big-endian keys sort by id; out of order only in a damaged page
     * (LMDB does not check the order it reads). */
    if (n > 0 && ids[n - 1] >= id)
      return store_corrupt(s, DB_CHECKPOINTS, &key,
                           "checkpoint ids out of order");
    ids[n++] = id;
  }
  if (rc != MDB_NOTFOUND)
    return store_lmdb_fail(s, rc, "list checkpoints");
  if (n != entries) /* the walk and the database's count disagree */
    return store_fail(s, SL_ECORRUPT,
                      "list checkpoints: %zu found, %zu counted", n, entries);
  *count = n;
  return 0;
}

int sl_store_list_checkpoints(sl_store *s, uint64_t **ids, size_t *count) {
  *ids = 0;
  *count = 0;
  MDB_txn *txn;
  int rc = store_read_begin(s, &txn);
  if (rc != 0)
    return rc;
  MDB_stat st;
  MDB_cursor *cursor = 0;
  uint64_t *list = 0;
  rc = mdb_stat(txn, s->dbi[DB_CHECKPOINTS], &st);
  if (rc == 0)
    rc = mdb_cursor_open(txn, s->dbi[DB_CHECKPOINTS], &cursor);
  if (rc != 0)
    rc = store_lmdb_fail(s, rc, "list checkpoints");
  if (rc == 0 && !(list = malloc((st.ms_entries + 1) * sizeof *list)))
    rc = store_fail(s, ENOMEM, "list checkpoints: out of memory");
  if (rc == 0)
    rc = scan_checkpoints(s, cursor, list, st.ms_entries, count);
  if (cursor)
    mdb_cursor_close(cursor);
  mdb_txn_abort(txn);
  if (rc != 0) {
    free(list);
    *count = 0;
    return rc;
  }
  *ids = list;
  return 0;
}

/* ------------------------------------------------------------ inspection */

/* Every blob in key order, checked, with its checkpoint id (store_txn.c note
 * 1). */
static int view_blobs(sl_store *s, MDB_txn *txn, uint64_t latest,
                      sl_store_blob_fn fn, void *arg) {
  MDB_cursor *cursor;
  int rc = mdb_cursor_open(txn, s->dbi[DB_BLOBS], &cursor);
  if (rc != 0)
    return store_lmdb_fail(s, rc, "open a blob cursor");
  MDB_val key, stored, payload;
  rc = mdb_cursor_get(cursor, &key, &stored, MDB_FIRST);
  /* Bounded by the blobs database: one entry per operator instance. */
  for (; rc == 0; rc = mdb_cursor_get(cursor, &key, &stored, MDB_NEXT)) {
    if (key.mv_size != BLOB_KEY_BYTES) {
      rc = store_corrupt(s, DB_BLOBS, &key, "key is not (op, instance)");
      break;
    }
    if ((rc = store_value_open(s, DB_BLOBS, &key, &stored, &payload)) != 0)
      break;
    if (payload.mv_size < BLOB_ID_BYTES) {
      rc = store_corrupt(s, DB_BLOBS, &key, "value too short");
      break;
    }
    uint64_t id = get_le64(payload.mv_data);
    if (id == 0 || id > latest) {
      rc = store_corrupt(s, DB_BLOBS, &key,
                         "blob tagged with no valid checkpoint");
      break;
    }
    rc = fn ? fn(arg, get_be16(key.mv_data),
                 get_be16((uint8_t *)key.mv_data + 2), id,
                 (const uint8_t *)payload.mv_data + BLOB_ID_BYTES,
                 (uint32_t)(payload.mv_size - BLOB_ID_BYTES))
            : 0;
    if (rc != 0)
      break;
  }
  mdb_cursor_close(cursor);
  if (rc == MDB_NOTFOUND)
    return 0;
  return rc;
}

/* The counts and the fingerprint of view, in txn. */
static int view_meta(sl_store *s, MDB_txn *txn, sl_store_view *view) {
  int rc = store_meta_get_u64(s, txn, "latest", &view->latest);
  if (rc == 0)
    rc = store_meta_get_u64(s, txn, "log_entries", &view->log_entries);
  if (rc == 0)
    rc = store_meta_get_u64(s, txn, "base_entries", &view->base_entries);
  MDB_stat table_stat = {0};
  if (rc == 0 && atomic_load(&s->tables_open) &&
      (rc = mdb_stat(txn, s->dbi[DB_TABLES], &table_stat)) != 0)
    rc = store_lmdb_fail(s, rc, "count entries");
  MDB_val graph;
  if (rc == 0 && (rc = store_meta_get(s, txn, "graph", &graph)) == MDB_NOTFOUND)
    rc = store_fail(s, SL_ECORRUPT, "meta \"graph\" is missing");
  if (rc != 0)
    return rc;
  view->format = SL_STORE_FORMAT_VERSION; /* sl_store_open checked it */
  view->table_entries = table_stat.ms_entries;
  view->graph = malloc(graph.mv_size + 1);
  if (!view->graph)
    return store_fail(s, ENOMEM, "read the graph: out of memory");
  memcpy(view->graph, graph.mv_data, graph.mv_size);
  view->graph[graph.mv_size] = 0;
  return 0;
}

int sl_store_read_view(sl_store *s, sl_store_view *view, sl_store_blob_fn fn,
                       void *arg) {
  assert(s != 0);
  assert(view != 0);
  memset(view, 0, sizeof *view);
  MDB_txn *txn;
  int rc = store_read_begin(s, &txn);
  if (rc != 0)
    return rc;
  rc = view_meta(s, txn, view);
  if (rc == 0)
    rc = view_blobs(s, txn, view->latest, fn, arg);
  mdb_txn_abort(txn);
  if (rc != 0) {
    free(view->graph);
    view->graph = 0;
  }
  return rc;
}
