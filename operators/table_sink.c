/* table_sink.c — the LMDB table sink, whose rows commit in the checkpoint's
 * own transaction, and the table reader (sluice_table.h).
 *
 * NOTES ON THE DESIGN OF THE TABLE SINK
 *
 * 1. Exactly-once without a second transaction.  Other exactly-once sinks
 *    pre-commit on the barrier and commit on "n complete", which needs
 *    recovery of pending output (file_sink.c).  A table lives in the job's
 *    own store, so its rows simply go into the write transaction of
 *    checkpoint n (checkpoint_writer.c note 3): the commit that makes n
 *    complete is the commit of the rows, and a crash leaves both or
 *    neither.  Nothing is pending after a restore.
 * 2. Buffering.  An instance collects the rows of the records it
 *    processes into the batch being built: rows in the order their keys
 *    first appeared, key and value bytes in an arena, and an open-
 *    addressing index (key hash -> row) so that a later write of a key
 *    replaces its row (the last write wins; a delete becomes a tombstone
 *    row).  A value no longer than the one it replaces is overwritten in
 *    place, else appended (the old bytes stay unused until the hand-over).
 * 3. Hand-over.  The snapshot hook of checkpoint n (or the final snapshot)
 *    gives the batch, if it has rows, to the engine (sl_snapshot_add_rows,
 *    snapshot.c note 10): from then on it is immutable, the engine's, and
 *    the next record starts a new batch.  The engine keeps it, and puts it
 *    into every ack, until a completed checkpoint has written it: the rows
 *    of an aborted checkpoint are written by the next one that completes,
 *    in order.  The hook's work is O(1) plus clearing the index (bounded:
 *    a large index is freed instead).  If the hand-over fails (too many
 *    batches await a completion) the snapshot fails, checkpoint n is
 *    aborted, and the rows stay in the batch being built, for the next.
 * 4. Restore.  An instance starts with an empty buffer: the store already
 *    holds exactly the rows of the restored checkpoint, and the sources
 *    replay the records after it.  After a failover the failed attempt's
 *    buffer and batches are freed with its instances.
 * 5. Partitioning.  With parallelism above 1 a key_by named NAME.key hashes
 *    the row key (the row callback runs on the producer's thread for
 *    that), so each key's rows are produced by one instance in input
 *    order and the table does not depend on timing.
 * 6. Readers (sl_table_reader) are thin: a store handle (the job's, or one
 *    opened read-only) and a message buffer; every call is one read
 *    transaction of the store's table reads (store.h note 6).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_abi.h"
#include "internal.h"

/* Rows and arena bytes of a new batch: the previous batch's count (a
 * steady stream needs no regrowth), at least these. */
#define TABLE_FIRST_ROWS 64u
#define TABLE_FIRST_ARENA_BYTES 4096u
/* An index of more slots than this is freed at a hand-over rather than
 * cleared, so the snapshot hook never clears more than 256 KiB. */
#define TABLE_INDEX_KEEP_SLOTS 65536u
/* Rows of one batch: the index stores row number + 1 in a u32. */
#define TABLE_MAX_BATCH_ROWS (UINT32_MAX - 1u)

_Static_assert(SL_TABLE_MAX_NAME == SL_STORE_TABLE_NAME_MAX + 1,
               "the public name limit is the store's, with the NUL");
_Static_assert(SL_TABLE_MAX_KEY == SL_STORE_TABLE_KEY_MAX,
               "the public key limit is the store's");
_Static_assert(SL_TABLE_MAX_TABLES == SL_STORE_TXN_TABLES,
               "a checkpoint's transaction takes every table of the job");
_Static_assert(SL_TABLE_ROW_BUFFER_BYTES % 8 == 0, "the buffer is u64s");

typedef struct table_sink {
  char table[SL_TABLE_MAX_NAME];
  sl_table_row_fn row; /* NULL: the default row */
  void *row_user;
} table_sink;

typedef struct table_instance {
  const table_sink *sink;
  sl_row_batch *building; /* note 2; NULL until the first row after a
                             hand-over */
  uint64_t row_capacity;
  uint64_t arena_capacity;
  uint32_t *index;     /* slot -> row number + 1, 0: empty */
  uint64_t index_slots; /* a power of two, at least twice the rows */
  uint64_t last_rows;  /* rows of the batch handed over last */
  uint64_t buffer[SL_TABLE_ROW_BUFFER_BYTES / 8]; /* sl_table_row.buffer */
} table_instance;

/* ------------------------------------------------------------ rows */

/* The default row: key = the first 8 bytes, value = the rest.  Returns 1,
 * or -EINVAL for a record too short. */
static int default_row(const sl_record *in, sl_table_row *out) {
  if (in->size_bytes < 8)
    return EINVAL;
  out->key = in->data;
  out->key_bytes = 8;
  out->value = (const uint8_t *)in->data + 8;
  out->value_bytes = in->size_bytes - 8;
  out->is_delete = 0;
  return 1;
}

/* The row of in: 1 (out set), 0 (none), or another value: a failure. */
static int row_of(const table_sink *sink, const sl_record *in,
                  sl_table_row *out) {
  return sink->row ? sink->row(sink->row_user, in, out) : default_row(in, out);
}

/* Note 5: the key_by's key function. */
static uint64_t table_key(void *user, const sl_record *in) {
  const table_sink *sink = user;
  uint64_t buffer[SL_TABLE_ROW_BUFFER_BYTES / 8];
  sl_table_row row = {.buffer = buffer};
  if (row_of(sink, in, &row) != 1 || row.key_bytes > SL_TABLE_MAX_KEY ||
      (row.key_bytes > 0 && !row.key))
    return 0; /* no row, or a bad one that the sink instance reports */
  return sl_hash_bytes(row.key, row.key_bytes);
}

/* ------------------------------------------------------------ buffer */

static const uint8_t *row_key_bytes(const sl_row_batch *b, const sl_row *r) {
  return b->arena + r->offset;
}

/* The slot of key in the index: the one holding its row, or the empty one
 * where it would go.  The index is at most half full, so the probe ends. */
static uint64_t index_find(const table_instance *t, const void *key,
                           uint32_t key_bytes, uint64_t hash) {
  const sl_row_batch *b = t->building;
  uint64_t mask = t->index_slots - 1;
  for (uint64_t probe = 0, slot = hash & mask; probe < t->index_slots;
       probe++, slot = (slot + 1) & mask) {
    uint32_t entry = t->index[slot];
    if (entry == 0)
      return slot;
    const sl_row *r = &b->rows[entry - 1];
    if (r->key_bytes == key_bytes &&
        (key_bytes == 0 || memcmp(row_key_bytes(b, r), key, key_bytes) == 0))
      return slot;
  }
  assert(!"a half-full index has an empty slot");
  return 0;
}

/* An index of slots slots (a power of two) holding every row of the
 * batch being built.  Returns 0 or ENOMEM (the old index stays). */
static int index_rebuild(table_instance *t, uint64_t slots) {
  assert((slots & (slots - 1)) == 0);
  uint32_t *index = calloc(slots, sizeof *index);
  if (!index)
    return ENOMEM;
  free(t->index);
  t->index = index;
  t->index_slots = slots;
  const sl_row_batch *b = t->building;
  for (uint64_t r = 0; b && r < b->row_count; r++) {
    const sl_row *row = &b->rows[r];
    uint64_t hash = sl_hash_bytes(row_key_bytes(b, row), row->key_bytes);
    uint64_t slot = index_find(t, row_key_bytes(b, row), row->key_bytes, hash);
    assert(t->index[slot] == 0); /* the batch's keys are distinct */
    t->index[slot] = (uint32_t)(r + 1);
  }
  return 0;
}

/* A new, empty batch to build (note 2).  Returns 0 or ENOMEM. */
static int building_start(table_instance *t) {
  assert(!t->building);
  uint64_t rows = t->last_rows > TABLE_FIRST_ROWS ? t->last_rows
                                                  : TABLE_FIRST_ROWS;
  sl_row_batch *b = calloc(1, sizeof *b);
  if (b) {
    b->rows = malloc(rows * sizeof *b->rows);
    b->arena = malloc(TABLE_FIRST_ARENA_BYTES);
  }
  if (!b || !b->rows || !b->arena) {
    sl_row_batch_free(b);
    return ENOMEM;
  }
  memcpy(b->table, t->sink->table, sizeof b->table);
  t->building = b;
  t->row_capacity = rows;
  t->arena_capacity = TABLE_FIRST_ARENA_BYTES;
  uint64_t slots = 128;
  while (slots < 2 * rows)
    slots *= 2;
  return t->index && t->index_slots >= slots ? 0 : index_rebuild(t, slots);
}

/* Room for bytes more in the arena.  Returns 0 or ENOMEM. */
static int arena_room(table_instance *t, uint64_t bytes) {
  sl_row_batch *b = t->building;
  if (b->arena_bytes + bytes <= t->arena_capacity)
    return 0;
  uint64_t capacity = t->arena_capacity;
  while (capacity < b->arena_bytes + bytes)
    capacity *= 2;
  uint8_t *arena = realloc(b->arena, capacity);
  if (!arena)
    return ENOMEM;
  b->arena = arena;
  t->arena_capacity = capacity;
  return 0;
}

/* Room for one more row, and an index still at most half full.  Returns
 * 0, ENOMEM, or ENOSPC (TABLE_MAX_BATCH_ROWS). */
static int row_room(table_instance *t) {
  sl_row_batch *b = t->building;
  if (b->row_count == TABLE_MAX_BATCH_ROWS)
    return ENOSPC;
  if (b->row_count == t->row_capacity) {
    sl_row *rows = realloc(b->rows, 2 * t->row_capacity * sizeof *rows);
    if (!rows)
      return ENOMEM;
    b->rows = rows;
    t->row_capacity *= 2;
  }
  if (2 * (b->row_count + 1) > t->index_slots)
    return index_rebuild(t, 2 * t->index_slots);
  return 0;
}

/* Note 2: row into the batch being built, replacing the key's row if it
 * has one.  Returns 0, ENOMEM or ENOSPC; on error the batch is as it
 * was. */
static int buffer_add(table_instance *t, const sl_table_row *row) {
  int rc = t->building ? 0 : building_start(t);
  if (rc)
    return rc;
  sl_row_batch *b = t->building;
  uint32_t value_bytes = row->is_delete ? 0 : row->value_bytes;
  uint64_t hash = sl_hash_bytes(row->key, row->key_bytes);
  uint64_t slot = index_find(t, row->key, row->key_bytes, hash);
  if (t->index[slot] != 0) { /* the key has a row: replace it */
    sl_row *r = &b->rows[t->index[slot] - 1];
    if (value_bytes > r->value_bytes) { /* append a new version */
      if ((rc = arena_room(t, row->key_bytes + (uint64_t)value_bytes)))
        return rc;
      memcpy(b->arena + b->arena_bytes, row_key_bytes(b, r), r->key_bytes);
      r->offset = b->arena_bytes;
      b->arena_bytes += r->key_bytes + (uint64_t)value_bytes;
    }
    if (value_bytes > 0)
      memcpy(b->arena + r->offset + r->key_bytes, row->value, value_bytes);
    r->value_bytes = value_bytes;
    r->tombstone = row->is_delete != 0;
    return 0;
  }
  if ((rc = row_room(t)) != 0 ||
      (rc = arena_room(t, row->key_bytes + (uint64_t)value_bytes)) != 0)
    return rc;
  assert(2 * (b->row_count + 1) <= t->index_slots); /* row_room */
  slot = index_find(t, row->key, row->key_bytes, hash); /* index may be new */
  assert(t->index[slot] == 0);
  sl_row *r = &b->rows[b->row_count];
  r->offset = b->arena_bytes;
  r->key_bytes = row->key_bytes;
  r->value_bytes = value_bytes;
  r->tombstone = row->is_delete != 0;
  if (row->key_bytes > 0)
    memcpy(b->arena + r->offset, row->key, row->key_bytes);
  if (value_bytes > 0)
    memcpy(b->arena + r->offset + row->key_bytes, row->value, value_bytes);
  b->arena_bytes += row->key_bytes + (uint64_t)value_bytes;
  t->index[slot] = (uint32_t)(++b->row_count);
  return 0;
}

/* ------------------------------------------------------------ callbacks */

static int table_open(sl_ctx *ctx, void *user, void **state) {
  const table_sink *sink = user;
  if (!sl_ctx_checkpointing(ctx)) { /* sl_sink_table refuses this first */
    sl_ctx_fail(ctx, "table \"%s\": a table sink writes its rows with the "
                "checkpoints, and the job takes none (set "
                "checkpoint.state_dir)", sink->table);
    return EINVAL;
  }
  table_instance *t = calloc(1, sizeof *t);
  if (!t)
    return ENOMEM;
  t->sink = sink; /* note 4: the buffer starts empty, restored or not */
  *state = t;
  return 0;
}

/* The checks of a row the callback made (key_fn may have hashed a bad one
 * to 0: this is where it is reported).  Returns 0 or -EINVAL. */
static int row_check(sl_ctx *ctx, const table_sink *sink,
                     const sl_table_row *row) {
  if (row->key_bytes > SL_TABLE_MAX_KEY)
    sl_ctx_fail(ctx, "table \"%s\": a row key of %" PRIu32 " bytes is longer "
                "than %u", sink->table, row->key_bytes, SL_TABLE_MAX_KEY);
  else if (row->key_bytes > 0 && !row->key)
    sl_ctx_fail(ctx, "table \"%s\": the row callback gave a NULL key of %"
                PRIu32 " bytes", sink->table, row->key_bytes);
  else if (!row->is_delete && row->value_bytes > 0 && !row->value)
    sl_ctx_fail(ctx, "table \"%s\": the row callback gave a NULL value of %"
                PRIu32 " bytes", sink->table, row->value_bytes);
  else
    return 0;
  return EINVAL;
}

static int table_process(sl_ctx *ctx, void *state, int input,
                         const sl_record *in) {
  (void)input;
  table_instance *t = state;
  const table_sink *sink = t->sink;
  sl_table_row row = {.buffer = t->buffer};
  int rc = row_of(sink, in, &row);
  if (rc == 0)
    return 0; /* the record changes no row */
  if (rc != 1) {
    if (!sink->row)
      sl_ctx_fail(ctx, "table \"%s\": a record of %" PRIu32 " bytes is "
                  "shorter than the default row's 8-byte key", sink->table,
                  in->size_bytes);
    else
      sl_ctx_fail(ctx, "table \"%s\": the row callback returned %d",
                  sink->table, rc);
    return rc; /* fails the job with it (runtime.c note 8) */
  }
  if ((rc = row_check(ctx, sink, &row)) != 0)
    return rc;
  rc = buffer_add(t, &row);
  if (rc) {
    sl_ctx_fail(ctx, "table \"%s\": cannot buffer a row (%" PRIu64 " rows "
                "buffered since the last checkpoint)", sink->table,
                t->building ? t->building->row_count : 0);
    return rc; /* passes through (runtime.c note 8) */
  }
  return 0;
}

/* Note 3. */
static int table_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  table_instance *t = state;
  sl_row_batch *b = t->building;
  if (!b || b->row_count == 0)
    return 0;
  int rc = sl_snapshot_add_rows(ctx, b);
  if (rc) /* the rows stay in b, for the next snapshot */
    return rc;
  t->last_rows = b->row_count;
  t->building = 0;
  if (t->index_slots > TABLE_INDEX_KEEP_SLOTS) {
    free(t->index);
    t->index = 0;
    t->index_slots = 0;
  } else {
    memset(t->index, 0, t->index_slots * sizeof *t->index);
  }
  return 0;
}

static void table_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  table_instance *t = state;
  sl_row_batch_free(t->building); /* rows no checkpoint took: replayed */
  free(t->index);
  free(t);
}

/* The distinct tables of the job's table sinks with table added (at most
 * SL_STORE_TXN_TABLES + 1 are counted).  One checkpoint's transaction
 * writes at most SL_STORE_TXN_TABLES tables (store.h), so more are refused
 * when the job is built rather than failing every checkpoint. */
static int tables_with(const sl_job *job, const char *table) {
  const char *names[SL_STORE_TXN_TABLES + 1];
  int n = 0;
  names[n++] = table;
  for (int i = 0; i < job->op_count && n <= SL_STORE_TXN_TABLES; i++) {
    const sl_op *op = job->ops[i];
    if (op->kind != SL_OP_SINK || op->fn.process.process != table_process)
      continue;
    const char *other = ((const table_sink *)op->user)->table;
    bool seen = false;
    for (int k = 0; k < n && !seen; k++)
      seen = strcmp(names[k], other) == 0;
    if (!seen)
      names[n++] = other;
  }
  return n;
}

SL_EXPORT int sl_sink_table_sized(sl_job *job, const char *name,
                                  sl_op *input, int parallelism,
                                  const sl_table_sink_config *config,
                                  sl_op **op, size_t config_bytes) {
  if (!job)
    return EINVAL;
  sl_table_sink_config copy;
  if (SL_CONFIG_READ(job, sl_sink_table, sl_table_sink_config,
                     SL_TABLE_SINK_CONFIG_V1, config, config_bytes, &copy))
    return EINVAL;
  if (config)
    config = &copy;
  if (atomic_load(&job->state) != SL_JOB_BUILDING)
    return SL_ESTARTED; /* as every builder */
  if (!name || !config || !config->table) {
    sl_job_set_error(job, "table sink: %s is NULL",
                     !name ? "the name" : !config ? "the config" : "the table");
    return EINVAL;
  }
  if (sl_store_table_name_check(config->table) != 0) {
    sl_job_set_error(job, "table sink '%s': the table name \"%.60s\" is not "
                     "1..%d bytes of A-Z a-z 0-9 _ - .", name, config->table,
                     SL_TABLE_MAX_NAME - 1);
    return EINVAL;
  }
  if (!job->config.checkpoint.state_dir) {
    sl_job_set_error(job, "table sink '%s': table \"%s\" is written by the "
                     "job's checkpoints, and the job takes none (set "
                     "checkpoint.state_dir)", name, config->table);
    return SL_EUSAGE;
  }
  if (tables_with(job, config->table) > SL_STORE_TXN_TABLES) {
    sl_job_set_error(job, "table sink '%s': table \"%s\" would be the "
                     "job's %dth; a checkpoint writes at most %d tables",
                     name, config->table, SL_TABLE_MAX_TABLES + 1,
                     SL_TABLE_MAX_TABLES);
    return SL_EGRAPH;
  }
  char key_name[SL_MAX_NAME];
  bool partition = parallelism > 1 && parallelism <= SL_MAX_PARALLELISM;
  if (partition && snprintf(key_name, sizeof key_name, "%s.key", name) >=
                       (int)sizeof key_name) {
    sl_job_set_error(job, "table sink '%.60s': the name is too long for the "
                     "key_by of its partitioning, '<name>.key' (a name of "
                     "at most %d bytes)", name, SL_MAX_NAME - 1 - 4);
    return EINVAL;
  }
  table_sink *sink = calloc(1, sizeof *sink);
  if (!sink)
    return ENOMEM;
  memcpy(sink->table, config->table, strlen(config->table) + 1);
  sink->row = config->row;
  sink->row_user = config->row_user;
  static const sl_process_ops ops = {.open = table_open,
                                     .process = table_process,
                                     .close = table_close,
                                     .snapshot = table_snapshot};
  sl_op *in = input;
  int rc = partition ? sl_op_key_by(job, key_name, input, table_key, sink, &in)
                     : 0;
  if (rc == 0)
    rc = sl_op_sink(job, name, in, parallelism, &ops, sink, op);
  if (rc) {
    /* A key_by already added stays, dangling (as in sl_sink_verify):
     * sl_job_validate refuses the graph; it never calls table_key. */
    free(sink);
    return rc;
  }
  (*op)->user_free = free; /* the key_by shares it and frees nothing */
  return 0;
}

/* ------------------------------------------------------------ readers */

struct sl_table_reader {
  sl_store *store;
  bool owned; /* sl_table_open's: closed with the reader */
  char error[SL_ERROR_BYTES];
};

SL_EXPORT int sl_table_open(const char *state_dir, sl_table_reader **reader,
                            char *err, size_t err_bytes) {
  if (err && err_bytes > 0)
    err[0] = 0;
  if (!reader || !state_dir) {
    if (err && err_bytes > 0)
      snprintf(err, err_bytes, "sl_table_open: %s is NULL",
               !reader ? "reader" : "state_dir");
    if (reader)
      *reader = 0;
    return EINVAL;
  }
  *reader = 0;
  sl_table_reader *r = calloc(1, sizeof *r);
  if (!r) {
    if (err && err_bytes > 0)
      snprintf(err, err_bytes, "%s: out of memory", state_dir);
    return ENOMEM;
  }
  sl_store_options options = {.read_only = 1}; /* no graph check */
  int rc = sl_store_open(state_dir, &options, &r->store, err, err_bytes);
  if (rc) {
    free(r);
    return rc;
  }
  r->owned = true;
  *reader = r;
  return 0;
}

SL_EXPORT int sl_job_table_reader(sl_job *job, sl_table_reader **reader) {
  if (reader)
    *reader = 0;
  if (!job || !reader)
    return EINVAL;
  if (!job->config.checkpoint.state_dir)
    return SL_EUSAGE;
  sl_store *store = sl_checkpointer_store(job);
  if (!store)
    return SL_ENOTSTARTED;
  sl_table_reader *r = calloc(1, sizeof *r);
  if (!r)
    return ENOMEM;
  r->store = store;
  *reader = r;
  return 0;
}

SL_EXPORT void sl_table_close(sl_table_reader *reader) {
  if (!reader)
    return;
  if (reader->owned)
    sl_store_close(reader->store);
  free(reader);
}

SL_EXPORT const char *sl_table_error(const sl_table_reader *reader) {
  return reader ? reader->error : "";
}

/* A NULL argument of a read: EINVAL with a message. */
static int reader_null(sl_table_reader *r, const char *call, const char *what) {
  snprintf(r->error, sizeof r->error, "%s: %s is NULL", call, what);
  return EINVAL;
}

SL_EXPORT int sl_table_get(sl_table_reader *reader, const char *table,
                           const void *key, uint32_t key_bytes, void **value,
                           uint32_t *value_bytes) {
  if (!reader)
    return EINVAL;
  reader->error[0] = 0;
  if (!value || !value_bytes)
    return reader_null(reader, "sl_table_get",
                       !value ? "value" : "value_bytes");
  return sl_store_table_get(reader->store, table, key, key_bytes, value,
                            value_bytes, reader->error, sizeof reader->error);
}

SL_EXPORT int sl_table_foreach(sl_table_reader *reader, const char *table,
                               sl_table_visit_fn fn, void *arg) {
  if (!reader)
    return EINVAL;
  reader->error[0] = 0;
  if (!fn)
    return reader_null(reader, "sl_table_foreach", "fn");
  return sl_store_table_scan(reader->store, table, fn, arg, reader->error,
                             sizeof reader->error);
}

SL_EXPORT int sl_table_count(sl_table_reader *reader, const char *table,
                             uint64_t *rows) {
  if (!reader)
    return EINVAL;
  reader->error[0] = 0;
  if (!rows)
    return reader_null(reader, "sl_table_count", "rows");
  return sl_store_table_count(reader->store, table, rows, reader->error,
                              sizeof reader->error);
}

SL_EXPORT int sl_table_checkpoint(sl_table_reader *reader,
                                  uint64_t *checkpoint_id) {
  if (!reader)
    return EINVAL;
  reader->error[0] = 0;
  if (!checkpoint_id)
    return reader_null(reader, "sl_table_checkpoint", "checkpoint_id");
  return sl_store_read_latest(reader->store, checkpoint_id, reader->error,
                              sizeof reader->error);
}

/* The version-1 symbol (config_abi.c note 1): a program linked before the
 * sized call existed passed a version-1 struct. */
SL_EXPORT int(sl_sink_table)(sl_job *job, const char *name, sl_op *input,
                             int parallelism,
                             const sl_table_sink_config *config, sl_op **op) {
  return sl_sink_table_sized(job, name, input, parallelism, config, op,
                             SL_TABLE_SINK_CONFIG_V1);
}
