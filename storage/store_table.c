/* store_table.c — the rows of table sinks (store.h note 6): their
 * puts and deletes inside a checkpoint's write transaction, their row
 * counts at its commit, and the reads other threads make while the
 * writer runs.
 *
 * NOTES ON THE IMPLEMENTATION
 *
 * 1. Tables (store.h note 6).  A row key is [n][name][key]; the row count
 *    of a table is under [0][name], which no row key can equal (n >= 1).
 *    A put first tries MDB_NOOVERWRITE: success means a new row (+1 to the
 *    transaction's delta for the table), MDB_KEYEXIST means a replacement,
 *    done by a second put at the cursor (MDB_CURRENT); a delete that finds
 *    the row is -1.  Puts and deletes go through one cursor of the
 *    transaction: the writer gives the rows in key order, and LMDB skips
 *    the descent from the root when a key falls on the cursor's page
 *    (store_rows, 1M sorted rows: inserts 0.62 s against 0.68 s with
 *    mdb_put, replacements 0.30 s against 0.73 s, medians of 5).  The commit
 *    adds each table's delta to its stored count before the checkpoint
 *    record, so counts and rows change in the same transaction.  Table
 *    reads come from threads other than the writer's, while it runs: they
 *    never touch the handle's error buffer (their messages go to the
 *    caller's) nor the write transaction, and hold map_lock's read side
 *    for their read transaction, because mdb_env_set_mapsize (grow) must
 *    not run while a transaction of this process is open.  The handle of
 *    "tables" is opened before the store is handed out (a writer creates
 *    the database if an older store lacks it), so concurrent reads never
 *    call mdb_dbi_open, which LMDB allows in one transaction at a time;
 *    the one exception, a read-only handle of an older store opening it
 *    once a writer elsewhere has made it, holds tables_lock for that.
 */
#include "store_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "sluice.h"

/* ------------------------------------------------------------ table writes */

int sl_store_table_name_check(const char *name) {
  if (!name)
    return EINVAL;
  size_t n = strnlen(name, SL_STORE_TABLE_NAME_MAX + 1);
  if (n == 0 || n > SL_STORE_TABLE_NAME_MAX)
    return EINVAL;
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
    if (!ok)
      return EINVAL;
  }
  return 0;
}

/* [n][name][key] into out (KEY_BUFFER_BYTES bytes), a row key of note
 * 10; with key_bytes 0 it is the prefix shared by every row of the table. */
static MDB_val row_key(uint8_t *out, const char *name, size_t name_bytes,
                       const void *key, uint32_t key_bytes) {
  assert(name_bytes >= 1 && name_bytes <= SL_STORE_TABLE_NAME_MAX);
  assert(key_bytes <= SL_STORE_TABLE_KEY_MAX);
  out[0] = (uint8_t)name_bytes;
  memcpy(out + 1, name, name_bytes);
  if (key_bytes > 0)
    memcpy(out + 1 + name_bytes, key, key_bytes);
  return (MDB_val){.mv_size = 1 + name_bytes + key_bytes, .mv_data = out};
}

/* [0][name]: where a table's row count is kept (note 1). */
static MDB_val count_key(uint8_t *out, const char *name, size_t name_bytes) {
  assert(name_bytes >= 1 && name_bytes <= SL_STORE_TABLE_NAME_MAX);
  out[0] = 0;
  memcpy(out + 1, name, name_bytes);
  return (MDB_val){.mv_size = 1 + name_bytes, .mv_data = out};
}

int sl_store_txn_table(sl_store_txn *txn, const char *name, int *table) {
  int rc = store_txn_usable(txn);
  if (rc != 0)
    return rc;
  sl_store *s = txn->store;
  if (sl_store_table_name_check(name) != 0)
    return store_fail(s, EINVAL, "table name \"%.60s\" is not 1..%u bytes "
                      "of A-Z a-z 0-9 _ - .", name ? name : "(null)",
                      SL_STORE_TABLE_NAME_MAX);
  for (int i = 0; i < txn->table_count; i++) /* at most SL_STORE_TXN_TABLES */
    if (strcmp(txn->tables[i].name, name) == 0) {
      *table = i;
      return 0;
    }
  if (txn->table_count == SL_STORE_TXN_TABLES)
    return store_fail(s, ENOSPC, "table \"%s\": one checkpoint writes at "
                      "most %d tables", name, SL_STORE_TXN_TABLES);
  txn_table *t = &txn->tables[txn->table_count];
  t->name_bytes = (uint8_t)strlen(name);
  memcpy(t->name, name, t->name_bytes + 1u);
  t->row_delta = 0;
  *table = txn->table_count++;
  return 0;
}

/* The transaction's rows cursor (note 1), opened if need be.  Returns 0
 * or an LMDB code. */
static int rows_cursor(sl_store_txn *t) {
  if (t->rows)
    return 0;
  int rc = mdb_cursor_open(t->mdb, t->store->dbi[DB_TABLES], &t->rows);
  if (rc != 0)
    t->rows = 0;
  return rc;
}

/* value_put through the rows cursor; flags MDB_NOOVERWRITE, or
 * MDB_CURRENT with the cursor on key. */
static int row_value_put(sl_store_txn *t, MDB_val *key, const void *body,
                         size_t body_bytes, unsigned flags) {
  sl_store *s = t->store;
  assert(flags == MDB_NOOVERWRITE || flags == MDB_CURRENT);
  int rc = rows_cursor(t);
  if (rc != 0)
    return rc;
  if (s->fault) { /* store.h: every put asks the fault layer */
    int injected = s->fault(s->fault_arg, SL_STORE_CALL_PUT);
    if (injected)
      return injected;
  }
  MDB_val value = {.mv_size = body_bytes + SL_STORE_CHECKSUM_BYTES,
                   .mv_data = 0};
  rc = mdb_cursor_put(t->rows, key, &value, MDB_RESERVE | flags);
  if (rc != 0)
    return rc;
  uint8_t *at = value.mv_data;
  if (body_bytes > 0)
    memcpy(at, body, body_bytes);
  put_le64(at + body_bytes, store_checksum(DB_TABLES, key, at, body_bytes));
  return 0;
}

/* 0 and the table in *out if a row of key_bytes may go into table of
 * txn; else fails txn. */
static int row_check(sl_store_txn *txn, int table, uint32_t key_bytes,
                     const char *what, txn_table **out) {
  int rc = store_txn_usable(txn);
  if (rc != 0)
    return rc;
  sl_store *s = txn->store;
  if (table < 0 || table >= txn->table_count)
    return store_txn_fail(txn, store_fail(s, EINVAL, "%s: no table %d in this "
                                          "transaction", what, table));
  if (key_bytes > SL_STORE_TABLE_KEY_MAX)
    return store_txn_fail(txn, store_fail(s, EINVAL,
                                          "%s: table \"%s\": a key of %" PRIu32
                                          " bytes is too long (at most %u)",
                                          what, txn->tables[table].name,
                                          key_bytes, SL_STORE_TABLE_KEY_MAX));
  assert(atomic_load(&s->tables_open)); /* a writer has it (note 1) */
  *out = &txn->tables[table];
  return 0;
}

int sl_store_put_row(sl_store_txn *txn, int table, const void *key,
                     uint32_t key_bytes, const void *value,
                     uint32_t value_bytes) {
  txn_table *t = 0;
  int rc = row_check(txn, table, key_bytes, "put row", &t);
  if (rc != 0)
    return rc;
  sl_store *s = txn->store;
  if (value_bytes > UINT32_MAX - SL_STORE_CHECKSUM_BYTES ||
      (value_bytes > 0 && !value))
    return store_txn_fail(txn, store_fail(s, EINVAL,
                                          "put row: table \"%s\": bad "
                                          "value of %" PRIu32 " bytes",
                                          t->name, value_bytes));
  MDB_val k = row_key(txn->key, t->name, t->name_bytes, key, key_bytes);
  /* Note 1: a new row, or (MDB_KEYEXIST: nothing written, the cursor on
   * the row) a replacement. */
  rc = row_value_put(txn, &k, value, value_bytes, MDB_NOOVERWRITE);
  if (rc == 0) {
    t->row_delta++;
    return 0;
  }
  if (rc == MDB_KEYEXIST)
    rc = row_value_put(txn, &k, value, value_bytes, MDB_CURRENT);
  return rc != 0 ? store_txn_fail(txn, store_lmdb_fail(s, rc, "put row")) : 0;
}

int sl_store_delete_row(sl_store_txn *txn, int table, const void *key,
                        uint32_t key_bytes) {
  txn_table *t = 0;
  int rc = row_check(txn, table, key_bytes, "delete row", &t);
  if (rc != 0)
    return rc;
  sl_store *s = txn->store;
  if (s->fault) { /* store.h: a delete counts as a put */
    int injected = s->fault(s->fault_arg, SL_STORE_CALL_PUT);
    if (injected)
      return store_txn_fail(txn, store_lmdb_fail(s, injected, "delete row"));
  }
  MDB_val k = row_key(txn->key, t->name, t->name_bytes, key, key_bytes);
  MDB_val found;
  rc = rows_cursor(txn);
  if (rc == 0)
    rc = mdb_cursor_get(txn->rows, &k, &found, MDB_SET);
  if (rc == 0)
    rc = mdb_cursor_del(txn->rows, 0);
  if (rc == 0)
    t->row_delta--;
  else if (rc != MDB_NOTFOUND)
    return store_txn_fail(txn, store_lmdb_fail(s, rc, "delete row"));
  return 0;
}

/* Note 1: each table's delta into its stored row count. */
int store_commit_table_counts(sl_store_txn *t) {
  sl_store *s = t->store;
  for (int i = 0; i < t->table_count; i++) { /* at most SL_STORE_TXN_TABLES */
    const txn_table *table = &t->tables[i];
    if (table->row_delta == 0)
      continue;
    uint8_t key_bytes[1 + SL_STORE_TABLE_NAME_MAX];
    MDB_val key = count_key(key_bytes, table->name, table->name_bytes);
    MDB_val stored, payload = {0};
    uint64_t rows = 0;
    int rc = mdb_get(t->mdb, s->dbi[DB_TABLES], &key, &stored);
    if (rc == 0 && (rc = store_value_open(s, DB_TABLES, &key, &stored,
                                          &payload)) != 0)
      return rc;
    if (rc == 0 && payload.mv_size != sizeof rows)
      return store_corrupt(s, DB_TABLES, &key, "not a u64");
    if (rc == 0)
      rows = get_le64(payload.mv_data);
    else if (rc != MDB_NOTFOUND)
      return store_lmdb_fail(s, rc, "commit: read a row count");
    if (table->row_delta < 0 && rows < (uint64_t)-table->row_delta)
      return store_corrupt(s, DB_TABLES, &key,
                           "fewer rows counted than deleted");
    rows += (uint64_t)table->row_delta; /* modular: adds a negative delta */
    uint8_t value[sizeof rows];
    put_le64(value, rows);
    rc = store_value_put(s, t->mdb, DB_TABLES, &key, 0, 0, value, sizeof value,
                         0);
    if (rc != 0)
      return store_lmdb_fail(s, rc, "commit: write a row count");
  }
  return 0;
}

/* ------------------------------------------------------------ table reads */

/* Messages of table reads go to the caller's buffer through
 * store_dir_fail (note 1: never into the handle's buffer, which the
 * writer thread uses meanwhile). */

/* A read-only handle of a store made before tables: a writer (of another
 * process) may have added "tables" since the open.  Opened in a read
 * transaction of its own, committed to keep the handle (note 1). */
static int tables_open_late(sl_store *s, char *err, size_t err_bytes) {
  pthread_mutex_lock(&s->tables_lock);
  int rc = 0;
  if (!atomic_load(&s->tables_open)) {
    MDB_txn *txn;
    rc = mdb_txn_begin(s->env, 0, MDB_RDONLY, &txn);
    if (rc == 0) {
      rc = mdb_dbi_open(txn, db_names[DB_TABLES], 0, &s->dbi[DB_TABLES]);
      if (rc == 0) {
        rc = mdb_txn_commit(txn);
        if (rc == 0)
          atomic_store(&s->tables_open, true);
      } else {
        mdb_txn_abort(txn);
      }
    }
    if (rc == MDB_NOTFOUND)
      rc = 0; /* still none: every table is empty */
    else if (rc != 0)
      rc = store_dir_fail(s->dir, err, err_bytes, rc,
                          "open the database tables: %s", mdb_strerror(rc));
  }
  pthread_mutex_unlock(&s->tables_lock);
  return rc;
}

/* The read side of map_lock, then a read transaction (note 1).  A map
 * grown by a writer in another process (MDB_MAP_RESIZED, read-only
 * handles only) is adopted under the write side.  End with
 * table_read_end. */
static int locked_read_begin(sl_store *s, MDB_txn **txn, char *err,
                             size_t err_bytes) {
  pthread_rwlock_rdlock(&s->map_lock);
  int rc = mdb_txn_begin(s->env, 0, MDB_RDONLY, txn);
  if (rc == MDB_MAP_RESIZED) {
    pthread_rwlock_unlock(&s->map_lock);
    pthread_rwlock_wrlock(&s->map_lock);
    rc = mdb_env_set_mapsize(s->env, 0); /* no transaction is open here */
    pthread_rwlock_unlock(&s->map_lock);
    pthread_rwlock_rdlock(&s->map_lock);
    if (rc == 0)
      rc = mdb_txn_begin(s->env, 0, MDB_RDONLY, txn);
  }
  if (rc != 0) {
    pthread_rwlock_unlock(&s->map_lock);
    *txn = 0;
    return store_dir_fail(s->dir, err, err_bytes, rc,
                          "begin a read transaction: %s", mdb_strerror(rc));
  }
  return 0;
}

/* Begin a table read (locked_read_begin).  *txn NULL with 0: the store
 * has no tables yet. */
static int table_read_begin(sl_store *s, MDB_txn **txn, char *err,
                            size_t err_bytes) {
  *txn = 0;
  int rc = atomic_load(&s->tables_open) ? 0
                                         : tables_open_late(s, err, err_bytes);
  if (rc != 0 || !atomic_load(&s->tables_open))
    return rc;
  return locked_read_begin(s, txn, err, err_bytes);
}

static void table_read_end(sl_store *s, MDB_txn *txn) {
  if (!txn)
    return;
  mdb_txn_abort(txn);
  pthread_rwlock_unlock(&s->map_lock);
}

/* A table value read back: checked, its payload in *payload. */
static int table_value_open(const sl_store *s, const char *table,
                            const MDB_val *key, const MDB_val *value,
                            MDB_val *payload, char *err, size_t err_bytes) {
  const uint8_t *stored = (const uint8_t *)value->mv_data +
                          value->mv_size - SL_STORE_CHECKSUM_BYTES;
  if (value->mv_size >= SL_STORE_CHECKSUM_BYTES) {
    payload->mv_data = value->mv_data;
    payload->mv_size = value->mv_size - SL_STORE_CHECKSUM_BYTES;
    if (get_le64(stored) ==
        store_checksum(DB_TABLES, key, payload->mv_data, payload->mv_size))
      return 0;
  }
  char text[3 * MESSAGE_KEY_BYTES + 128];
  store_key_text(DB_TABLES, key, text, sizeof text);
  return store_dir_fail(s->dir, err, err_bytes, SL_ECORRUPT,
                        "database tables, %s: value fails its checksum (table "
                        "\"%s\")", text, table);
}

/* The checks every table read makes of its arguments. */
static int table_args(const sl_store *s, const char *table, uint32_t key_bytes,
                      char *err, size_t err_bytes) {
  if (sl_store_table_name_check(table) != 0)
    return store_dir_fail(s->dir, err, err_bytes, EINVAL,
                          "table name \"%.60s\" is not 1..%u bytes of A-Z a-z "
                          "0-9 _ - .", table ? table : "(null)",
                          SL_STORE_TABLE_NAME_MAX);
  if (key_bytes > SL_STORE_TABLE_KEY_MAX)
    return store_dir_fail(s->dir, err, err_bytes, EINVAL,
                          "table \"%s\": a key of %" PRIu32
                          " bytes is too long "
                          "(at most %u)",
                          table, key_bytes, SL_STORE_TABLE_KEY_MAX);
  return 0;
}

int sl_store_table_get(sl_store *s, const char *table, const void *key,
                       uint32_t key_bytes, void **value,
                       uint32_t *value_bytes, char *err, size_t err_bytes) {
  *value = 0;
  *value_bytes = 0;
  int rc = table_args(s, table, key_bytes, err, err_bytes);
  if (rc == 0 && key_bytes > 0 && !key)
    rc = store_dir_fail(s->dir, err, err_bytes, EINVAL,
                        "table \"%s\": key is NULL", table);
  MDB_txn *txn = 0;
  if (rc == 0)
    rc = table_read_begin(s, &txn, err, err_bytes);
  if (rc != 0)
    return rc;
  uint8_t key_buffer[KEY_BUFFER_BYTES];
  MDB_val k = row_key(key_buffer, table, strlen(table), key, key_bytes);
  MDB_val stored, payload = {0};
  rc = txn ? mdb_get(txn, s->dbi[DB_TABLES], &k, &stored) : MDB_NOTFOUND;
  if (rc == MDB_NOTFOUND)
    rc = store_dir_fail(s->dir, err, err_bytes, SL_ENOTFOUND,
                        "table \"%s\" has no row with that key", table);
  else if (rc != 0)
    rc = store_dir_fail(s->dir, err, err_bytes, rc, "table \"%s\": read: %s",
                        table, mdb_strerror(rc));
  else
    rc = table_value_open(s, table, &k, &stored, &payload, err, err_bytes);
  void *copy = 0;
  if (rc == 0 && !(copy = malloc(payload.mv_size ? payload.mv_size : 1)))
    rc = store_dir_fail(s->dir, err, err_bytes, ENOMEM,
                        "table \"%s\": out of memory", table);
  if (rc == 0) {
    if (payload.mv_size > 0)
      memcpy(copy, payload.mv_data, payload.mv_size);
    *value = copy;
    *value_bytes = (uint32_t)payload.mv_size;
  }
  table_read_end(s, txn);
  return rc;
}

/* The rows of table in txn into fn (sl_store_table_scan). */
static int table_walk(const sl_store *s, MDB_txn *txn, const char *table,
                      sl_store_row_fn fn, void *arg, char *err,
                      size_t err_bytes) {
  MDB_stat st;
  MDB_cursor *cursor;
  int rc = mdb_stat(txn, s->dbi[DB_TABLES], &st);
  if (rc == 0)
    rc = mdb_cursor_open(txn, s->dbi[DB_TABLES], &cursor);
  if (rc != 0)
    return store_dir_fail(s->dir, err, err_bytes, rc, "table \"%s\": read: %s",
                          table, mdb_strerror(rc));
  size_t name_bytes = strlen(table);
  uint8_t prefix[KEY_BUFFER_BYTES];
  MDB_val seek = row_key(prefix, table, name_bytes, 0, 0), key = seek, value;
  size_t prefix_bytes = seek.mv_size;
  int step = mdb_cursor_get(cursor, &key, &value, MDB_SET_RANGE);
  /* Bounded by the database's entries: each turn takes one. */
  rc = 0;
  for (size_t turn = 0; step == 0 && rc == 0 && turn < st.ms_entries;
       turn++) {
    if (key.mv_size < prefix_bytes ||
        memcmp(key.mv_data, prefix, prefix_bytes) != 0)
      break; /* past the table's range */
    MDB_val payload = {0};
    rc = table_value_open(s, table, &key, &value, &payload, err, err_bytes);
    if (rc == 0) /* nonzero: fn's value, which stops the walk */
      rc = fn(arg, (const uint8_t *)key.mv_data + prefix_bytes,
              (uint32_t)(key.mv_size - prefix_bytes), payload.mv_data,
              (uint32_t)payload.mv_size);
    if (rc == 0)
      step = mdb_cursor_get(cursor, &key, &value, MDB_NEXT);
  }
  mdb_cursor_close(cursor);
  if (rc == 0 && step != 0 && step != MDB_NOTFOUND)
    rc = store_dir_fail(s->dir, err, err_bytes, step, "table \"%s\": read: %s",
                        table, mdb_strerror(step));
  return rc;
}

int sl_store_table_scan(sl_store *s, const char *table, sl_store_row_fn fn,
                        void *arg, char *err, size_t err_bytes) {
  int rc = table_args(s, table, 0, err, err_bytes);
  if (rc == 0 && !fn)
    rc = store_dir_fail(s->dir, err, err_bytes, EINVAL,
                        "table \"%s\": no function", table);
  MDB_txn *txn = 0;
  if (rc == 0)
    rc = table_read_begin(s, &txn, err, err_bytes);
  if (rc != 0 || !txn)
    return rc; /* !txn: no tables yet, nothing to walk */
  rc = table_walk(s, txn, table, fn, arg, err, err_bytes);
  table_read_end(s, txn);
  return rc;
}

int sl_store_table_count(sl_store *s, const char *table, uint64_t *rows,
                         char *err, size_t err_bytes) {
  *rows = 0;
  int rc = table_args(s, table, 0, err, err_bytes);
  MDB_txn *txn = 0;
  if (rc == 0)
    rc = table_read_begin(s, &txn, err, err_bytes);
  if (rc != 0 || !txn)
    return rc;
  uint8_t key_buffer[1 + SL_STORE_TABLE_NAME_MAX];
  MDB_val key = count_key(key_buffer, table, strlen(table)), stored;
  MDB_val payload = {0};
  rc = mdb_get(txn, s->dbi[DB_TABLES], &key, &stored);
  if (rc == MDB_NOTFOUND) {
    rc = 0; /* never written: empty */
  } else if (rc != 0) {
    rc = store_dir_fail(s->dir, err, err_bytes, rc,
                        "table \"%s\": read the row "
                        "count: %s",
                        table, mdb_strerror(rc));
  } else {
    rc = table_value_open(s, table, &key, &stored, &payload, err, err_bytes);
    if (rc == 0 && payload.mv_size != sizeof(uint64_t))
      rc = store_dir_fail(s->dir, err, err_bytes, SL_ECORRUPT,
                          "table \"%s\": the row count is %zu bytes, not 8",
                          table, payload.mv_size);
    if (rc == 0)
      *rows = get_le64(payload.mv_data);
  }
  table_read_end(s, txn);
  return rc;
}

int sl_store_read_latest(sl_store *s, uint64_t *id, char *err,
                         size_t err_bytes) {
  *id = 0;
  MDB_txn *txn;
  int rc = locked_read_begin(s, &txn, err, err_bytes);
  if (rc != 0)
    return rc;
  MDB_val key = meta_key("latest"), stored;
  rc = mdb_get(txn, s->dbi[DB_META], &key, &stored);
  if (rc != 0) {
    rc = store_dir_fail(s->dir, err, err_bytes,
                        rc == MDB_NOTFOUND ? SL_ECORRUPT : rc,
                        "read meta \"latest\": %s", mdb_strerror(rc));
  } else if (stored.mv_size != 8 + SL_STORE_CHECKSUM_BYTES ||
             get_le64((const uint8_t *)stored.mv_data + 8) !=
                 store_checksum(DB_META, &key, stored.mv_data, 8)) {
    rc = store_dir_fail(s->dir, err, err_bytes, SL_ECORRUPT,
                        "meta \"latest\" fails its checksum");
  } else {
    *id = get_le64(stored.mv_data);
  }
  table_read_end(s, txn);
  return rc;
}

