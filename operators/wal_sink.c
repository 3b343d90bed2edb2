/* wal_sink.c — the write-ahead exactly-once sink (sl_sink_exactly_once,
 * sluice_embed.h): the results of checkpoint n are stored with n in the
 * job's store and handed to the application once n is durable, and again
 * after every crash until the application acknowledged them.
 *
 * NOTES ON THE DESIGN OF THE WRITE-AHEAD SINK
 *
 * 1. The model is Flink's GenericWriteAheadSink.  The records an instance
 *    receives after barrier n-1 and up to barrier n are "the results of
 *    checkpoint n".  The snapshot hook of n closes them into batch n.
 * 2. Storage.  Every batch not yet acknowledged (pending) is written, in id
 *    order, as the instance's operator state (sl_operator_state_set), so it
 *    commits in the same LMDB transaction as checkpoint n itself (DESIGN.md
 *    invariant 5): a crash leaves both or neither.  A batch acknowledged
 *    before snapshot m is missing from m's state: its deletion commits with
 *    m.  An instance with nothing pending saves no operator state at all,
 *    so a savepoint taken then can be rescaled (savepoint.c note 4).
 * 3. Delivery.  checkpoint_complete(c) hands every pending batch with id
 *    <= c to the application, oldest first, on the instance's thread, and
 *    drops each one it acknowledged (returned 0).  A checkpoint that was
 *    aborted leaves its batch pending: the next one stores it again and its
 *    completion delivers it, still under its own id.  A nonzero return fails
 *    the job (sluice.h, CALLBACK RETURNS); that batch and those after it
 *    stay pending, and the instance delivers nothing more.
 * 4. Restore from checkpoint r: the state holds exactly the batches that
 *    were pending at r (every id <= r, strictly increasing); the restore
 *    hook delivers them all before the instance reads a record.  So a batch
 *    is delivered at least once, and more than once only with the same id
 *    and the same records: the application deduplicates by (instance, id).
 * 5. The final batch.  The final snapshot (id 0, snapshot.c note 7) takes
 *    the id max_seen_id + 1: above every barrier the instance saw, so above
 *    its earlier batches, and at most the id of every checkpoint its final
 *    ack stands in for (coordinator.c notes 3, 9).  The id is stored with
 *    the batch, so every delivery of it has the same one.  An instance
 *    restored as finished keeps its restored state in every later
 *    checkpoint (no hook runs): each resume delivers its batches again, with
 *    their ids.
 * 6. Size.  One instance's stored state is at most WAL_MAX_STATE_BYTES:
 *    the checkpoint writer adds a flag byte and a trailer to it in a u32
 *    (checkpoint_writer.c), and the whole state is copied on the instance's
 *    thread at each snapshot.  More fails the snapshot, naming the sink, the
 *    instance and the size: checkpoint more often.
 * 7. Nothing read back is trusted (DESIGN.md invariant 9): state_parse checks
 *    every length and id before a byte is used; a damaged state fails the
 *    restore with SL_ECORRUPT naming the state directory.
 *
 * Stored state, native byte order (the store is read by this machine):
 *   u32 magic "SLWA", u32 version 1, u32 batch count, u32 zero,
 *   then per batch: u64 id, u32 records, u32 zero, u64 arena bytes, arena.
 * Arena, per record: u32 size, u32 zero, i64 timestamp, the bytes, zero
 * padding up to a multiple of 8.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "op_util.h"

#define WAL_MAGIC 0x41574c53u /* "SLWA" in memory order on little-endian */
#define WAL_VERSION 1u
#define WAL_HEAD_BYTES 16u
#define WAL_BATCH_HEAD_BYTES 24u
#define WAL_ENTRY_HEAD_BYTES 16u
/* Note 6. */
#define WAL_MAX_STATE_BYTES (UINT64_C(1) << 30)
/* Pending batches of one instance: ids strictly increase and each is a
 * checkpoint that completed or will, so more than this would mean a
 * million checkpoints without a completion. */
#define WAL_MAX_PENDING (1u << 20)
#define WAL_FIRST_ARENA_BYTES 4096u

_Static_assert(WAL_MAX_STATE_BYTES < UINT32_MAX - 64,
               "the writer adds a flag byte and a 16-byte trailer in a u32");
_Static_assert(WAL_ENTRY_HEAD_BYTES % 8 == 0 && WAL_BATCH_HEAD_BYTES % 8 == 0,
               "entries stay 8-byte aligned");

typedef struct wal_sink {
  sl_deliver_fn fn;
  void *user;
} wal_sink;

/* The records of one checkpoint, in arrival order (note 1). */
typedef struct wal_batch {
  uint64_t checkpoint_id; /* 0 while being built */
  uint32_t count;
  uint64_t bytes;    /* used bytes of arena */
  uint64_t capacity; /* allocated bytes of arena */
  uint8_t *arena;
} wal_batch;

typedef struct wal_instance {
  const wal_sink *sink;
  int index;
  bool failed;       /* a delivery failed: deliver nothing more (note 3) */
  wal_batch building; /* records since the last snapshot */
  wal_batch *pending; /* oldest first, ids strictly increasing */
  uint32_t pending_count;
  uint32_t pending_capacity;
  sl_record *records; /* the array a delivery passes */
  uint32_t records_capacity;
  uint8_t *scratch; /* the serialized state (note 2) */
  uint64_t scratch_capacity;
} wal_instance;

/* ------------------------------------------------------------ checker */

static uint64_t entry_bytes(uint32_t size_bytes) {
  return WAL_ENTRY_HEAD_BYTES + (((uint64_t)size_bytes + 7u) & ~UINT64_C(7));
}

/* The whole instance: pending ids strictly increasing and nonzero, counts
 * within capacities, the batch being built unnumbered. */
__attribute__((unused)) /* asserts only */
static bool wal_check(const wal_instance *w) {
  assert(w->pending_count <= w->pending_capacity);
  assert(w->building.checkpoint_id == 0);
  assert(w->building.bytes <= w->building.capacity);
  for (uint32_t i = 0; i < w->pending_count; i++) {
    assert(w->pending[i].checkpoint_id != 0);
    assert(i == 0 ||
           w->pending[i - 1].checkpoint_id < w->pending[i].checkpoint_id);
    assert(w->pending[i].count > 0); /* empty batches are never kept */
  }
  return true;
}

/* ------------------------------------------------------------ batches */

static void batch_free(wal_batch *b) {
  free(b->arena);
  memset(b, 0, sizeof *b);
}

/* Room for bytes more in b's arena.  Returns 0 or ENOMEM (b unchanged). */
static int batch_room(wal_batch *b, uint64_t bytes) {
  if (b->bytes + bytes <= b->capacity)
    return 0;
  uint64_t capacity = b->capacity ? b->capacity : WAL_FIRST_ARENA_BYTES;
  while (capacity < b->bytes + bytes) /* ends: capacity doubles */
    capacity *= 2;
  uint8_t *arena = realloc(b->arena, capacity);
  if (!arena)
    return ENOMEM;
  b->arena = arena;
  b->capacity = capacity;
  return 0;
}

/* Append rec to b.  Returns 0, ENOMEM or ENOSPC (a u32 count of records
 * would overflow); b is unchanged on error. */
static int batch_add(wal_batch *b, const sl_record *rec) {
  if (b->count == UINT32_MAX)
    return ENOSPC;
  uint64_t bytes = entry_bytes(rec->size_bytes);
  int rc = batch_room(b, bytes);
  if (rc)
    return rc;
  uint8_t *at = b->arena + b->bytes;
  uint32_t head[2] = {rec->size_bytes, 0};
  memcpy(at, head, sizeof head);
  memcpy(at + 8, &rec->timestamp, 8);
  if (rec->size_bytes > 0)
    memcpy(at + WAL_ENTRY_HEAD_BYTES, rec->data, rec->size_bytes);
  memset(at + WAL_ENTRY_HEAD_BYTES + rec->size_bytes, 0,
         bytes - WAL_ENTRY_HEAD_BYTES - rec->size_bytes);
  b->bytes += bytes;
  b->count++;
  return 0;
}

/* The records of b as sl_records into w->records (pointing into b's
 * arena).  Returns 0 or ENOMEM. */
static int batch_records(wal_instance *w, const wal_batch *b) {
  if (b->count > w->records_capacity) {
    sl_record *records = realloc(w->records, (size_t)b->count * sizeof *records);
    if (!records)
      return ENOMEM;
    w->records = records;
    w->records_capacity = b->count;
  }
  uint64_t offset = 0;
  for (uint32_t i = 0; i < b->count; i++) { /* bounded by count */
    const uint8_t *at = b->arena + offset;
    uint32_t size_bytes;
    memcpy(&size_bytes, at, 4);
    memcpy(&w->records[i].timestamp, at + 8, 8);
    w->records[i].size_bytes = size_bytes;
    w->records[i].data = at + WAL_ENTRY_HEAD_BYTES;
    offset += entry_bytes(size_bytes);
    assert(offset <= b->bytes); /* built by batch_add or checked by parse */
  }
  assert(offset == b->bytes);
  return 0;
}

/* Append b (its arena moves over) to the pending batches.  Returns 0 or
 * ENOMEM, ENOSPC (WAL_MAX_PENDING); b is unchanged on error. */
static int pending_push(wal_instance *w, wal_batch *b) {
  if (w->pending_count == WAL_MAX_PENDING)
    return ENOSPC;
  if (w->pending_count == w->pending_capacity) {
    uint32_t capacity = w->pending_capacity ? 2 * w->pending_capacity : 8;
    wal_batch *pending = realloc(w->pending, capacity * sizeof *pending);
    if (!pending)
      return ENOMEM;
    w->pending = pending;
    w->pending_capacity = capacity;
  }
  w->pending[w->pending_count++] = *b;
  memset(b, 0, sizeof *b);
  return 0;
}

_Static_assert(WAL_MAX_PENDING == 1048576u, "pending_error names the limit");

/* Why pending_push failed, for a message. */
static const char *pending_error(int rc) {
  return rc == ENOSPC ? "more than 1048576 (WAL_MAX_PENDING) batches would "
                        "be unacknowledged"
                      : "out of memory";
}

/* Drop the oldest pending batch (acknowledged). */
static void pending_pop(wal_instance *w) {
  assert(w->pending_count > 0);
  batch_free(&w->pending[0]);
  w->pending_count--;
  memmove(w->pending, w->pending + 1, w->pending_count * sizeof *w->pending);
}

/* ------------------------------------------------------------ delivery */

/* Note 3: hand every pending batch with id <= upto to the application.
 * Returns 0, or the function's nonzero value (or ENOMEM) with the cause
 * set; the failing batch and later ones stay pending. */
static int deliver_upto(sl_ctx *ctx, wal_instance *w, uint64_t upto) {
  assert(wal_check(w));
  while (!w->failed && w->pending_count > 0 &&
         w->pending[0].checkpoint_id <= upto) { /* pending_count falls */
    const wal_batch *b = &w->pending[0];
    int rc = batch_records(w, b);
    if (rc == 0)
      rc = w->sink->fn(w->sink->user, w->index, b->checkpoint_id, w->records,
                       b->count);
    if (rc) {
      w->failed = true;
      sl_ctx_fail(ctx, "the delivery of checkpoint %" PRIu64 " (%" PRIu32
                  " records) %s %d; it stays stored and is delivered again "
                  "after a restart or resume", b->checkpoint_id, b->count,
                  rc == ENOMEM ? "ran out of memory:" : "returned", rc);
      return rc;
    }
    pending_pop(w);
  }
  return 0;
}

/* ------------------------------------------------------------ state */

static uint64_t state_bytes(const wal_instance *w) {
  uint64_t bytes = WAL_HEAD_BYTES;
  for (uint32_t i = 0; i < w->pending_count; i++)
    bytes += WAL_BATCH_HEAD_BYTES + w->pending[i].bytes;
  return bytes;
}

/* Note 2: the pending batches into w->scratch; *bytes gets its size.
 * Returns 0, ENOMEM, or SL_ETOOBIG (note 6, cause set). */
static int state_write(sl_ctx *ctx, wal_instance *w, uint64_t *bytes) {
  uint64_t need = state_bytes(w);
  if (need > WAL_MAX_STATE_BYTES) {
    sl_ctx_fail(ctx, "%" PRIu64 " bytes of unacknowledged results (%" PRIu32
                " checkpoints) exceed the %" PRIu64 " bytes one instance can "
                "store with a checkpoint; take checkpoints more often",
                need, w->pending_count, WAL_MAX_STATE_BYTES);
    return SL_ETOOBIG;
  }
  if (need > w->scratch_capacity) {
    uint8_t *scratch = realloc(w->scratch, need);
    if (!scratch)
      return ENOMEM;
    w->scratch = scratch;
    w->scratch_capacity = need;
  }
  uint32_t head[4] = {WAL_MAGIC, WAL_VERSION, w->pending_count, 0};
  memcpy(w->scratch, head, sizeof head);
  uint64_t at = WAL_HEAD_BYTES;
  for (uint32_t i = 0; i < w->pending_count; i++) {
    const wal_batch *b = &w->pending[i];
    uint32_t counts[2] = {b->count, 0};
    memcpy(w->scratch + at, &b->checkpoint_id, 8);
    memcpy(w->scratch + at + 8, counts, sizeof counts);
    memcpy(w->scratch + at + 16, &b->bytes, 8);
    memcpy(w->scratch + at + WAL_BATCH_HEAD_BYTES, b->arena, b->bytes);
    at += WAL_BATCH_HEAD_BYTES + b->bytes;
  }
  assert(at == need);
  *bytes = need;
  return 0;
}

/* Check one stored arena of count records in bytes bytes.  Returns NULL
 * or what is wrong. */
static const char *arena_check(const uint8_t *arena, uint64_t bytes,
                               uint32_t count) {
  uint64_t offset = 0;
  for (uint32_t i = 0; i < count; i++) { /* bounded by count */
    if (bytes - offset < WAL_ENTRY_HEAD_BYTES)
      return "a record header runs past its batch";
    uint32_t head[2];
    memcpy(head, arena + offset, sizeof head);
    if (head[1] != 0)
      return "a record header has a nonzero reserved field";
    if (entry_bytes(head[0]) > bytes - offset)
      return "a record runs past its batch";
    offset += entry_bytes(head[0]);
  }
  return offset == bytes ? NULL : "a batch has bytes after its last record";
}

/* Note 7: parse the stored state of checkpoint restored into pending
 * batches.  Returns 0, ENOMEM, or SL_ECORRUPT (cause set). */
static int state_parse(sl_ctx *ctx, wal_instance *w, const uint8_t *data,
                       uint64_t bytes, uint64_t restored) {
  const char *wrong = NULL;
  uint32_t head[4] = {0};
  if (bytes < WAL_HEAD_BYTES)
    wrong = "it is shorter than its header";
  else if (memcpy(head, data, sizeof head),
           head[0] != WAL_MAGIC || head[1] != WAL_VERSION || head[3] != 0)
    wrong = "its header is not that of write-ahead sink state version 1";
  uint64_t at = WAL_HEAD_BYTES;
  for (uint32_t i = 0; !wrong && i < head[2]; i++) { /* bounded by head[2] */
    wal_batch b = {0};
    uint32_t counts[2];
    if (bytes - at < WAL_BATCH_HEAD_BYTES) {
      wrong = "a batch header runs past the end";
      break;
    }
    memcpy(&b.checkpoint_id, data + at, 8);
    memcpy(counts, data + at + 8, sizeof counts);
    memcpy(&b.bytes, data + at + 16, 8);
    at += WAL_BATCH_HEAD_BYTES;
    uint64_t last = w->pending_count
                        ? w->pending[w->pending_count - 1].checkpoint_id
                        : 0;
    if (b.checkpoint_id <= last || b.checkpoint_id > restored)
      wrong = "batch ids are not increasing or above the restored checkpoint";
    else if (counts[0] == 0 || counts[1] != 0 || b.bytes > bytes - at)
      wrong = "a batch header has a bad count or length";
    else
      wrong = arena_check(data + at, b.bytes, counts[0]);
    if (wrong)
      break;
    uint64_t arena_bytes = b.bytes;
    b.count = counts[0];
    b.capacity = arena_bytes;
    b.arena = malloc(arena_bytes ? arena_bytes : 1);
    if (b.arena)
      memcpy(b.arena, data + at, arena_bytes);
    int rc = b.arena ? pending_push(w, &b) : ENOMEM; /* b moves */
    if (rc) {
      free(b.arena);
      sl_ctx_fail(ctx, "cannot keep the stored results of checkpoint %"
                  PRIu64 ": %s", restored, pending_error(rc));
      return rc;
    }
    at += arena_bytes;
  }
  if (!wrong && at != bytes)
    wrong = "it has bytes after its last batch";
  if (!wrong)
    return 0;
  sl_ctx_fail(ctx, "%s: the stored results of checkpoint %" PRIu64 " are "
              "damaged: %s", ctx->job->config.checkpoint.state_dir, restored,
              wrong);
  return SL_ECORRUPT;
}

/* ------------------------------------------------------------ callbacks */

static int wal_open(sl_ctx *ctx, void *user, void **state) {
  if (!sl_ctx_checkpointing(ctx)) { /* sl_sink_exactly_once refuses first */
    sl_ctx_fail(ctx, "an exactly-once sink stores its results with the "
                "checkpoints, and the job takes none (set "
                "checkpoint.state_dir)");
    return EINVAL;
  }
  wal_instance *w = calloc(1, sizeof *w);
  if (!w)
    return ENOMEM;
  w->sink = user;
  w->index = sl_ctx_instance(ctx);
  *state = w;
  return 0;
}

static int wal_process(sl_ctx *ctx, void *state, int input,
                       const sl_record *in) {
  (void)input;
  wal_instance *w = state;
  int rc = batch_add(&w->building, in);
  if (rc)
    sl_ctx_fail(ctx, "cannot keep a record of %" PRIu32 " bytes with the %"
                PRIu32 " (%" PRIu64 " bytes) received since the last "
                "checkpoint", in->size_bytes, w->building.count,
                w->building.bytes);
  return rc;
}

/* Notes 1, 2, 5. */
static int wal_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  wal_instance *w = state;
  assert(wal_check(w));
  if (id == 0) /* the final snapshot (note 5) */
    id = ctx->cp.max_seen_id + 1;
  assert(w->pending_count == 0 ||
         w->pending[w->pending_count - 1].checkpoint_id < id);
  if (w->building.count > 0) {
    w->building.checkpoint_id = id;
    int rc = pending_push(w, &w->building);
    if (rc) {
      w->building.checkpoint_id = 0;
      sl_ctx_fail(ctx, "cannot keep the results of checkpoint %" PRIu64
                  ": %s", id, pending_error(rc));
      return rc;
    }
  }
  if (w->pending_count == 0)
    return 0; /* nothing pending: no operator state (note 2) */
  uint64_t bytes = 0;
  int rc = state_write(ctx, w, &bytes);
  if (rc == 0)
    rc = sl_operator_state_set(ctx, w->scratch, (uint32_t)bytes);
  /* The bytes are copied: the scratch copy (up to 1 GiB) goes at once
   * rather than doubling the instance's memory until the next snapshot. */
  free(w->scratch);
  w->scratch = NULL;
  w->scratch_capacity = 0;
  return rc;
}

static void wal_complete(sl_ctx *ctx, void *state, uint64_t id) {
  int rc = deliver_upto(ctx, state, id);
  if (rc)
    sl_instance_fail(ctx, rc); /* the hook cannot return it */
}

/* Note 4. */
static int wal_restore(sl_ctx *ctx, void *state, uint64_t id) {
  wal_instance *w = state;
  assert(w->pending_count == 0 && w->building.count == 0);
  const void *data;
  uint32_t bytes;
  int rc = sl_operator_state_get(ctx, &data, &bytes);
  if (rc == SL_ENOTFOUND)
    return 0; /* nothing was pending at id */
  if (rc == 0)
    rc = state_parse(ctx, w, data, bytes, id);
  return rc ? rc : deliver_upto(ctx, w, id);
}

static void wal_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  wal_instance *w = state;
  batch_free(&w->building); /* not stored: the sources replay it */
  for (uint32_t i = 0; i < w->pending_count; i++)
    batch_free(&w->pending[i]); /* stored ones are in the store */
  free(w->pending);
  free(w->records);
  free(w->scratch);
  free(w);
}

static const sl_process_ops wal_ops = {.open = wal_open,
                                       .process = wal_process,
                                       .close = wal_close,
                                       .snapshot = wal_snapshot,
                                       .checkpoint_complete = wal_complete,
                                       .restore = wal_restore};

SL_EXPORT int sl_sink_exactly_once(sl_job *job, const char *name,
                                   sl_op *input, int parallelism,
                                   sl_deliver_fn fn, void *user, sl_op **op) {
  if (!job || !op)
    return EINVAL;
  *op = 0;
  if (atomic_load(&job->state) != SL_JOB_BUILDING)
    return SL_ESTARTED; /* as every builder */
  if (!fn) {
    sl_job_set_error(job, "exactly-once sink '%s': no delivery function",
                     name ? name : "(null)");
    return EINVAL;
  }
  if (!job->config.checkpoint.state_dir) {
    sl_job_set_error(job, "exactly-once sink '%s': its results are stored "
                     "with the job's checkpoints, and the job takes none "
                     "(set checkpoint.state_dir)", name ? name : "(null)");
    return SL_EUSAGE;
  }
  wal_sink *sink = calloc(1, sizeof *sink);
  if (!sink)
    return ENOMEM;
  sink->fn = fn;
  sink->user = user;
  int rc = sl_op_sink(job, name, input, parallelism, &wal_ops, sink, op);
  return op_adopt(rc, op, sink, free);
}
