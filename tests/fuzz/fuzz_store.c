/* fuzz_store.c — libFuzzer target: the store's decoders of what it reads
 * back from LMDB (storage/store*.c): the checksum-checked value decode
 * (store_value_open), the chunk decode (storage/chunk.c) and the merged
 * view over the log's runs and the base (store_view.c), blob heads, the
 * checkpoint records and the meta values ("latest", "base", "next_seq",
 * "log_entries", "base_entries").  Compaction (store_compact.c) is not
 * run here.
 *
 * How: LLVMFuzzerInitialize opens a real store in a scratch directory and
 * commits one real checkpoint (state, a blob, a record).  Each input then
 * plants one raw entry (key and value of its choosing, with a correct
 * checksum or not) straight into one of the store's LMDB databases, reads
 * everything back through the store's public reading calls, and takes the
 * entry out again.  A damaged entry must give 0 or an error
 * (SL_ECORRUPT...), never a crash or a sanitizer report.
 *
 * The target includes storage/store_internal.h to reach the handle's
 * LMDB environment and databases and the checksum (store_checksum); the
 * store itself is the static library's, as every test links it.
 *
 * With flag bit 1 the writer is then closed and the directory read as
 * `sluice checkpoints DIR` reads it (sl_state_dir_open and the decode of
 * every checkpoint record, engine/inspect.c), and the writer opened again
 * (which checks the meta values); the entry is taken out through a plain
 * LMDB environment if the damage keeps the writer from opening.
 *
 * Input: byte 0 chooses the database (DB_META .. DB_TABLES), byte 1 the
 * flags (bit 0: append the right checksum; bit 1: the second phase), byte
 * 2 the key's length (1..255; the key follows), the rest is the value.
 */
#include "store_internal.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "fuzz_lines.h"
#include "inspect.h"

#define FUZZ_OP 1u            /* the operator of the real checkpoint */
#define FUZZ_GROUPS 128u      /* key groups read back */
#define FUZZ_BLOB_INSTANCES 4 /* blobs read back: instances 0..3 */

static sl_store *store;
static char dir[] = "/tmp/sluice-fuzz-store-XXXXXX";
static const sl_store_options writer_options = {.graph_fingerprint = "fuzz",
                                                .no_sync = 1};

static void remove_dir(void) {
  const char *names[] = {"data.mdb", "lock.mdb", "lock"};
  char path[sizeof dir + 16];
  sl_store_close(store);
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    unlink(path);
  }
  rmdir(dir);
}

static void must(int rc, const char *what) {
  if (rc != 0) {
    fprintf(stderr, "fuzz_store setup: %s: %d %s\n", what, rc,
            store ? sl_store_error(store) : "");
    abort();
  }
}

/* One real checkpoint: state in two key groups, a blob, a table row, a
 * record. */
static void first_checkpoint(void) {
  sl_store_txn *txn;
  must(sl_store_begin(store, &txn), "begin");
  must(sl_store_put_state(txn, FUZZ_OP, 3, "alpha", 5, "one", 3), "put");
  must(sl_store_put_state(txn, FUZZ_OP, 70, "beta", 4, "two", 3), "put");
  must(sl_store_delete_state(txn, FUZZ_OP, 3, "gone", 4), "delete");
  must(sl_store_put_blob(txn, FUZZ_OP, 0, "position", 8), "blob");
  int table = -1;
  must(sl_store_txn_table(txn, "fuzz", &table), "table");
  must(sl_store_put_row(txn, table, "k", 1, "v", 1), "row");
  static const uint8_t record[24] = {1};
  must(sl_store_commit(txn, 1, record, sizeof record), "commit");
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  if (!mkdtemp(dir))
    abort();
  char err[512];
  if (sl_store_open(dir, &writer_options, &store, err, sizeof err) != 0) {
    fprintf(stderr, "fuzz_store: %s\n", err);
    abort();
  }
  atexit(remove_dir);
  first_checkpoint();
  return 0;
}

static int on_state(void *arg, uint16_t key_group, const void *key,
                    uint32_t key_bytes, const void *value,
                    uint32_t value_bytes) {
  (void)arg;
  FUZZ_CHECK(key_group < FUZZ_GROUPS);
  FUZZ_CHECK(key_bytes == 0 || key != 0);
  FUZZ_CHECK(value_bytes == 0 || value != 0);
  return 0;
}

static int on_row(void *arg, const void *key, uint32_t key_bytes,
                  const void *value, uint32_t value_bytes) {
  (void)arg, (void)key, (void)key_bytes, (void)value, (void)value_bytes;
  return 0;
}

/* Every reading call; each must end in 0 or an error with a message. */
static void read_everything(uint64_t checkpoint_id) {
  int rc = sl_store_read_state(store, FUZZ_OP, 0, FUZZ_GROUPS - 1, on_state,
                               0);
  FUZZ_CHECK(rc == 0 || sl_store_error(store)[0] != 0);
  if (getenv("FUZZ_VERBOSE")) /* to see what a seed reaches */
    fprintf(stderr, "read_state: %d %s\n", rc, rc ? sl_store_error(store) : "");
  for (uint16_t i = 0; i < FUZZ_BLOB_INSTANCES; i++) {
    void *blob = 0;
    uint32_t bytes = 0;
    rc = sl_store_get_blob(store, FUZZ_OP, i, &blob, &bytes);
    FUZZ_CHECK(rc == 0 || blob == 0);
    free(blob);
  }
  uint64_t ids[] = {1, checkpoint_id};
  for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
    void *record = 0;
    uint32_t bytes = 0;
    rc = sl_store_get_checkpoint(store, ids[i], &record, &bytes);
    FUZZ_CHECK(rc == 0 || record == 0);
    free(record);
  }
  uint64_t *list = 0;
  size_t count = 0;
  if (sl_store_list_checkpoints(store, &list, &count) == 0)
    FUZZ_CHECK(count == 0 || list != 0);
  free(list);
  char err[512];
  uint64_t latest = 0;
  (void)sl_store_read_latest(store, &latest, err, sizeof err);
  uint64_t entries = 0;
  (void)sl_store_entry_bound(store, &entries);
  void *row = 0;
  uint32_t row_bytes = 0;
  rc = sl_store_table_get(store, "fuzz", "k", 1, &row, &row_bytes, err,
                          sizeof err);
  FUZZ_CHECK(rc == 0 || row == 0);
  free(row);
  (void)sl_store_table_scan(store, "fuzz", on_row, 0, err, sizeof err);
  uint64_t rows = 0;
  (void)sl_store_table_count(store, "fuzz", &rows, err, sizeof err);
}

/* The directory as `sluice checkpoints` reads it: every record decoded. */
static void inspect_everything(void) {
  sl_state_dir *sd = 0;
  char err[1024] = "";
  int rc = sl_state_dir_open(dir, 0, &sd, err, sizeof err);
  FUZZ_CHECK(rc == 0 || (sd == 0 && err[0] != 0));
  if (rc != 0)
    return;
  const sl_state_dir_info *info = sl_state_dir_info_get(sd);
  FUZZ_CHECK(info->checkpoint_count == 0 || info->checkpoint_ids != 0);
  for (size_t i = 0; i < info->checkpoint_count; i++) {
    sl_inspect_checkpoint c;
    err[0] = 0;
    rc = sl_state_dir_checkpoint(sd, info->checkpoint_ids[i], &c, err,
                                 sizeof err);
    FUZZ_CHECK(rc == 0 || err[0] != 0);
    FUZZ_CHECK(rc != 0 || c.record_version == 1 || c.record_version == 2);
  }
  sl_state_dir_close(sd);
}

/* Puts (value) or deletes (value NULL) key in db through an environment
 * of the harness's own: for when the writer cannot open. */
static void raw_write(int db, MDB_val *key, MDB_val *value) {
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi dbi;
  if (mdb_env_create(&env) != 0 || mdb_env_set_maxdbs(env, DB_COUNT - 1) ||
      mdb_env_open(env, dir, MDB_NOSYNC, 0644) != 0 ||
      mdb_txn_begin(env, 0, 0, &txn) != 0 ||
      mdb_dbi_open(txn, db_names[db], 0, &dbi) != 0)
    abort();
  int rc = value ? mdb_put(txn, dbi, key, value, 0) : mdb_del(txn, dbi, key, 0);
  if (rc != 0 || mdb_txn_commit(txn) != 0)
    abort();
  mdb_env_close(env);
}

/* Put key -> value into db in its own transaction, saving what was there
 * into *saved (malloc'd; NULL: nothing). */
static int plant(int db, MDB_val *key, MDB_val *value, MDB_val *saved) {
  MDB_txn *txn;
  if (mdb_txn_begin(store->env, 0, 0, &txn) != 0)
    abort();
  MDB_val old;
  saved->mv_data = 0;
  saved->mv_size = 0;
  if (mdb_get(txn, store->dbi[db], key, &old) == 0) {
    saved->mv_data = malloc(old.mv_size ? old.mv_size : 1);
    if (!saved->mv_data)
      abort();
    memcpy(saved->mv_data, old.mv_data, old.mv_size);
    saved->mv_size = old.mv_size;
  }
  int rc = mdb_put(txn, store->dbi[db], key, value, 0);
  if (rc != 0) { /* a key LMDB refuses (too long): nothing planted */
    mdb_txn_abort(txn);
    free(saved->mv_data);
    saved->mv_data = 0;
    return rc;
  }
  if (mdb_txn_commit(txn) != 0)
    abort();
  return 0;
}

/* Second phase: close the writer, inspect, open the writer again; if the
 * damage keeps it from opening, that must be an error with a message,
 * and the entry is taken out without it.  Returns whether the writer is
 * open again. */
static bool reopen(int db, MDB_val *key, MDB_val *saved) {
  sl_store_close(store);
  store = 0;
  inspect_everything();
  char err[1024] = "";
  int rc = sl_store_open(dir, &writer_options, &store, err, sizeof err);
  FUZZ_CHECK(rc == 0 || (store == 0 && err[0] != 0));
  if (rc == 0)
    return true;
  raw_write(db, key, saved->mv_data ? saved : 0);
  free(saved->mv_data);
  if (sl_store_open(dir, &writer_options, &store, err, sizeof err) != 0) {
    fprintf(stderr, "fuzz_store: the store does not open once repaired: "
            "%s\n", err);
    abort();
  }
  return false;
}

static void unplant(int db, MDB_val *key, MDB_val *saved) {
  MDB_txn *txn;
  if (mdb_txn_begin(store->env, 0, 0, &txn) != 0)
    abort();
  int rc = saved->mv_data ? mdb_put(txn, store->dbi[db], key, saved, 0)
                          : mdb_del(txn, store->dbi[db], key, 0);
  if (rc != 0 || mdb_txn_commit(txn) != 0)
    abort();
  free(saved->mv_data);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 3 || data[2] == 0 || size < 3u + data[2])
    return 0;
  int db = DB_META + data[0] % (DB_COUNT - DB_META);
  bool add_checksum = data[1] & 1;
  MDB_val key = {.mv_size = data[2], .mv_data = (void *)(data + 3)};
  size_t payload_bytes = size - 3 - data[2];
  size_t value_bytes = payload_bytes + (add_checksum ? 8 : 0);
  uint8_t *value = malloc(value_bytes ? value_bytes : 1);
  if (!value)
    abort();
  memcpy(value, data + 3 + data[2], payload_bytes);
  if (add_checksum)
    put_le64(value + payload_bytes,
             store_checksum(db, &key, value, payload_bytes));
  MDB_val v = {.mv_size = value_bytes, .mv_data = value}, saved;
  uint64_t id = key.mv_size == CHECKPOINT_KEY_BYTES ? get_be64(key.mv_data)
                                                    : 2;
  if (plant(db, &key, &v, &saved) == 0) {
    read_everything(id);
    if (!(data[1] & 2) || reopen(db, &key, &saved))
      unplant(db, &key, &saved);
  }
  free(value);
  return 0;
}
