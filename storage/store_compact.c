/* store_compact.c — the one job: compaction (store.h note 3), the merge
 * of the base and the log's runs into the other base, in steps.
 *
 * NOTES ON THE IMPLEMENTATION
 *
 * 1. A compaction merges what was logged before it began: the runs with a
 *    seq below upto_seq ("next_seq" at its start) and the current base.
 *    That merged view never changes while it runs (checkpoints only add
 *    runs at or above upto_seq, and nothing else writes the base or
 *    removes runs), so it can be written in several transactions.
 * 2. Each step is one write transaction: the merged view (store_view.c)
 *    from just above the last key the steps before wrote, chunked like a
 *    checkpoint's (chunk.c) and appended to the other base with
 *    MDB_APPEND, until about STEP_BYTES are written; it stops at a chunk's
 *    end, so a step's last key is a whole chunk's last.  Its commit is
 *    durable like a checkpoint's; the next step starts above that key.
 *    What a step has done is kept in the handle (compaction_progress), so
 *    a step cancelled (a checkpoint is waiting), failed (MDB_MAP_FULL) or
 *    left between calls resumes where the last committed one ended; the
 *    writer's checkpoints commit between steps.  A cancel seen inside a
 *    step ends it at the end of the chunk being built, and that shorter
 *    step commits: every call moves the compaction on by a chunk at
 *    least.  A cancel of SL_STORE_CANCEL_ABANDON (a restart waits for the
 *    store) instead gives the step up within 4096 entries: its
 *    transaction is aborted, so nothing of it stays, neither in the file
 *    nor in the progress, and the next call redoes it.  A step's dirty
 *    pages are its chunks: the write's memory is bounded by STEP_BYTES
 *    (and a chunk), not by the state.
 * 3. The step that writes the view's end also switches, in the same
 *    transaction: it deletes the log's runs below upto_seq (a few chunks a
 *    checkpoint), empties the old base (mdb_drop: its pages go to LMDB's
 *    free list), sets "base" to the new one, "base_entries" to the
 *    entries written and takes the merged runs' entries off
 *    "log_entries".  Before that commit the old base and the whole log
 *    are the merged view and the other base is ignored by every read; a
 *    crash between steps leaves a partial other base, which the next
 *    compaction empties in its first step.  So a crash at any instant
 *    leaves the merged view unchanged (store.h note 3).
 */
#include "store_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "sluice.h"

/* About this many chunk bytes a step (note 2). */
#define STEP_BYTES (16u << 20)

/* For tests only (store.h). */
static uint64_t test_crash_appends;
static uint64_t test_step_bytes;

void sl_store_test_crash_after(uint64_t appends) {
  test_crash_appends = appends;
}

void sl_store_test_compaction_step_bytes(uint64_t bytes) {
  test_step_bytes = bytes;
}

/* A compaction under way (note 2): what its committed steps did. */
typedef struct compaction_progress {
  int old_db, new_db;
  uint64_t upto_seq;     /* note 1 */
  uint64_t log_entries;  /* "log_entries" at its start: the runs' entries */
  uint64_t base_entries; /* "base_entries" at its start */
  uint64_t entries_written;
  uint64_t bytes_written;
  uint64_t duration_us;
  uint32_t ordinal; /* of the next chunk key of the new base */
  uint32_t steps;   /* committed */
  size_t after_bytes; /* 0: no step committed yet */
  uint8_t after[KEY_BUFFER_BYTES];
} compaction_progress;

void store_compaction_forget(sl_store *s) {
  free(s->compaction);
  s->compaction = 0;
}

static uint64_t now_us(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (uint64_t)now.tv_sec * 1000000u + (uint64_t)now.tv_nsec / 1000u;
}

/* One step's writing: its chunks, and what it adds to the progress once
 * it commits. */
typedef struct step {
  sl_store *s;
  MDB_txn *txn;
  const compaction_progress *p;
  chunk_builder *chunk;
  bool chunk_open;
  bool full;      /* stopped at STEP_BYTES, or cancelled (note 2) */
  bool cancelled; /* cancel was seen: end at the next chunk's end */
  uint64_t budget;
  uint32_t ordinal;
  uint64_t entries, bytes, added;
  uint8_t last[KEY_BUFFER_BYTES]; /* the state key last added */
  size_t last_bytes;
  uint8_t sent[KEY_BUFFER_BYTES]; /* the last key of the last chunk sent */
  size_t sent_bytes;
} step;

/* Appends the chunk being built to the new base. */
static int step_send(step *t) {
  if (!t->chunk_open || t->chunk->count == 0)
    return 0;
  t->chunk_open = false;
  chunk_builder_close(t->chunk);
  uint8_t key[BASE_KEY_BYTES];
  put_be16(key, t->chunk->op);
  put_be16(key + 2, t->chunk->last_group);
  put_be32(key + 4, t->ordinal++);
  MDB_val k = {.mv_size = sizeof key, .mv_data = key};
  int rc = store_value_put(t->s, t->txn, t->p->new_db, &k, 0, 0,
                           t->chunk->buffer, t->chunk->bytes, MDB_APPEND);
  assert(rc != MDB_KEYEXIST); /* the view ascends, and so do ordinals */
  if (rc != 0)
    return store_lmdb_fail(t->s, rc, "compact: write the new base");
  t->entries += t->chunk->count;
  t->bytes += t->chunk->bytes + SL_STORE_CHECKSUM_BYTES;
  memcpy(t->sent, t->last, t->last_bytes);
  t->sent_bytes = t->last_bytes;
  return 0;
}

/* The merged view's entries into chunks of the new base (note 2). */
static int step_emit(void *arg, const chunk_entry *e) {
  step *t = arg;
  uint16_t op = (uint16_t)(e->prefix >> 16);
  size_t need = chunk_entry_bytes(false, e->key_bytes, e->value_bytes);
  int rc = 0;
  if (t->chunk_open && (t->chunk->op != op ||
                        t->chunk->bytes + need > CHUNK_TARGET_BYTES)) {
    if ((rc = step_send(t)) != 0)
      return rc;
    if (t->bytes >= t->budget || t->cancelled) {
      t->full = true; /* e is the next step's first */
      return 1;
    }
  }
  if (!t->chunk_open && (rc = chunk_builder_start(t->chunk, op)) != 0)
    return store_fail(t->s, rc, "compact: out of memory");
  t->chunk_open = true;
  rc = chunk_builder_add(t->chunk, (uint16_t)e->prefix, e->key, e->key_bytes,
                         e->value, e->value_bytes);
  if (rc != 0)
    return store_fail(t->s, rc, "compact: out of memory");
  /* A key longer than any put could write (store_txn.c check_state_key)
   * came from damage that kept its checksum: never copy it into the
   * key buffers below. */
  if (STATE_PREFIX_BYTES + (size_t)e->key_bytes > KEY_BUFFER_BYTES)
    return store_fail(t->s, SL_ECORRUPT,
                      "compact: an entry of op %u has a key of %u bytes, "
                      "longer than any store key",
                      (unsigned)(e->prefix >> 16), (unsigned)e->key_bytes);
  put_be32(t->last, e->prefix);
  memcpy(t->last + STATE_PREFIX_BYTES, e->key, e->key_bytes);
  t->last_bytes = STATE_PREFIX_BYTES + e->key_bytes;
  t->added++;
  /* Every 4096 entries: the writer may want the store back (a checkpoint
   * waits, or the job stops).  The step then ends with the chunk being
   * built and commits (note 2): each call gets at least a chunk done, so
   * compactions progress however often checkpoints cancel them. */
  if (t->added % 4096 == 0 && t->s->cancel) {
    int cancel = atomic_load_explicit(t->s->cancel, memory_order_relaxed);
    if (cancel == SL_STORE_CANCEL_ABANDON) /* note 2: given up, undone */
      return store_fail(t->s, ECANCELED, "compact: step given up");
    t->cancelled = cancel != 0;
  }
  if (test_crash_appends != 0 &&
      t->p->entries_written + t->added == test_crash_appends)
    raise(SIGKILL); /* store.h: a test's crash inside a compaction */
  return 0;
}

/* Deletes the log's runs below upto_seq (note 3): its first chunks. */
static int drop_merged_runs(sl_store *s, MDB_txn *txn, uint64_t upto_seq) {
  MDB_cursor *cursor;
  MDB_stat st;
  int rc = mdb_stat(txn, s->dbi[DB_LOG], &st);
  if (rc == 0)
    rc = mdb_cursor_open(txn, s->dbi[DB_LOG], &cursor);
  if (rc != 0)
    return store_lmdb_fail(s, rc, "compact: drop the merged log");
  MDB_val key, value;
  for (size_t i = 0; i <= st.ms_entries && rc == 0; i++) {
    rc = mdb_cursor_get(cursor, &key, &value, MDB_FIRST);
    if (rc != 0 || key.mv_size < LOG_SEQ_BYTES ||
        get_be64(key.mv_data) >= upto_seq)
      break;
    rc = mdb_cursor_del(cursor, 0);
  }
  mdb_cursor_close(cursor);
  if (rc != 0 && rc != MDB_NOTFOUND)
    return store_lmdb_fail(s, rc, "compact: drop the merged log");
  return 0;
}

/* Note 3: the switch, in the last step's transaction. */
static int compact_switch(sl_store *s, MDB_txn *txn,
                          const compaction_progress *p, uint64_t entries) {
  int rc = drop_merged_runs(s, txn, p->upto_seq);
  if (rc != 0)
    return rc;
  rc = mdb_drop(txn, s->dbi[p->old_db], 0);
  if (rc == 0)
    rc = store_meta_put_u64(s, txn, "base", p->new_db == DB_STATE ? 0 : 1);
  if (rc == 0)
    rc = store_meta_put_u64(s, txn, "base_entries", entries);
  if (rc != 0)
    return store_lmdb_fail(s, rc, "compact: switch to the new base");
  return store_meta_add_u64(s, txn, "log_entries", -(int64_t)p->log_entries);
}

/* Begins a compaction in txn if one is due (store.h note 3): *p filled
 * and the other base emptied; else *due is false. */
static int compact_start(sl_store *s, MDB_txn *txn, uint64_t min_log_entries,
                         compaction_progress *p, bool *due) {
  int old_db = DB_STATE;
  uint64_t log_entries = 0, base_entries = 0;
  int rc = store_meta_get_base(s, txn, &old_db);
  if (rc == 0)
    rc = store_meta_get_u64(s, txn, "log_entries", &log_entries);
  if (rc == 0)
    rc = store_meta_get_u64(s, txn, "base_entries", &base_entries);
  if (rc != 0)
    return rc;
  *due = log_entries > 0 && log_entries >= min_log_entries &&
         log_entries >= base_entries;
  if (!*due)
    return 0;
  *p = (compaction_progress){.old_db = old_db,
                             .new_db = old_db == DB_STATE ? DB_STATE2
                                                          : DB_STATE,
                             .upto_seq = s->next_seq,
                             .log_entries = log_entries,
                             .base_entries = base_entries};
  /* Empty unless a crash left a partial one (note 3); MDB_APPEND needs it
   * empty. */
  rc = mdb_drop(txn, s->dbi[p->new_db], 0);
  return rc != 0 ? store_lmdb_fail(s, rc, "compact: empty the new base") : 0;
}

/* One step (note 2) of the compaction p, in txn; *finished: it switched. */
static int compact_step_in(sl_store *s, MDB_txn *txn, compaction_progress *p,
                           bool *finished) {
  step t = {.s = s, .txn = txn, .p = p, .chunk = &s->txn.chunk,
            .budget = test_step_bytes ? test_step_bytes : STEP_BYTES,
            .ordinal = p->ordinal};
  int base = DB_STATE;
  int rc = store_meta_get_base(s, txn, &base);
  if (rc == 0 && base != p->old_db)
    rc = store_fail(s, SL_ECORRUPT, "compact: meta \"base\" changed while "
                    "a compaction was under way");
  uint32_t first = p->after_bytes ? get_be32(p->after) : 0;
  if (rc == 0)
    rc = store_merged_view(s, txn, p->old_db, p->upto_seq, first, UINT32_MAX,
                           p->after_bytes ? p->after : 0, p->after_bytes,
                           step_emit, &t);
  if (rc == 1 && t.full)
    rc = 0;
  else if (rc == 0)
    rc = step_send(&t); /* the view's end: the last chunk */
  *finished = rc == 0 && !t.full;
  if (rc == 0 && *finished)
    rc = compact_switch(s, txn, p, p->entries_written + t.entries);
  if (rc != 0)
    return rc;
  p->entries_written += t.entries;
  p->bytes_written += t.bytes;
  p->ordinal = t.ordinal;
  if (t.sent_bytes > 0) {
    memcpy(p->after, t.sent, t.sent_bytes);
    p->after_bytes = t.sent_bytes;
  }
  return 0;
}

/* One step in a write transaction of its own, on a copy of the progress
 * that replaces the handle's only once the step committed.  *due: a
 * compaction is under way (or began). */
static int compact_step(sl_store *s, uint64_t min_log_entries, bool *due,
                        bool *finished) {
  *due = true;
  *finished = false;
  if (!s->compaction && !(s->compaction = calloc(1, sizeof *s->compaction)))
    return store_fail(s, ENOMEM, "compact: out of memory");
  bool under_way = s->compaction->upto_seq != 0;
  compaction_progress next = *s->compaction;
  MDB_txn *txn;
  int rc = mdb_txn_begin(s->env, 0, 0, &txn);
  if (rc != 0)
    return store_lmdb_fail(s, rc, "compact: begin");
  if (!under_way)
    rc = compact_start(s, txn, min_log_entries, &next, due);
  if (rc == 0 && *due)
    rc = compact_step_in(s, txn, &next, finished);
  if (rc != 0 || !*due) {
    mdb_txn_abort(txn); /* nothing of this step stays */
    return rc;
  }
  rc = mdb_txn_commit(txn); /* durable unless no_sync (note 2) */
  if (rc != 0)
    return store_lmdb_fail(s, rc, "compact: commit a step");
  next.steps++;
  *s->compaction = next;
  return 0;
}

void sl_store_set_cancel(sl_store *s, const _Atomic int *cancel) {
  s->cancel = cancel;
}

int sl_store_compact(sl_store *s, uint64_t min_log_entries,
                     sl_store_compaction *stats) {
  if (stats)
    *stats = (sl_store_compaction){0};
  if (s->read_only)
    return store_fail(s, EACCES, "compact: the store is open read-only");
  if (s->txn.state != TXN_IDLE)
    return store_fail(s, EBUSY, "compact: a transaction is open");
  int rc = 0;
  s->compacting = true; /* compactions are not faulted */
  /* Each step writes STEP_BYTES or ends the compaction (note 2). */
  for (uint32_t i = 0; i < UINT32_MAX; i++) {
    if (i > 0 && s->cancel &&
        atomic_load_explicit(s->cancel, memory_order_relaxed)) {
      rc = store_fail(s, ECANCELED, "compact: cancelled between steps");
      break;
    }
    uint64_t start_us = now_us();
    bool due, finished;
    rc = compact_step(s, min_log_entries, &due, &finished);
    if (s->compaction)
      s->compaction->duration_us += now_us() - start_us;
    if (rc != 0 || !due)
      break;
    if (finished) {
      const compaction_progress *p = s->compaction;
      if (stats)
        *stats = (sl_store_compaction){
            .log_entries_read = p->log_entries,
            .base_entries_read = p->base_entries,
            .entries_written = p->entries_written,
            .bytes_written = p->bytes_written,
            .duration_us = p->duration_us};
      store_compaction_forget(s);
      break;
    }
  }
  if (s->compaction && s->compaction->upto_seq == 0) /* none began */
    *s->compaction = (compaction_progress){0};
  s->compacting = false;
  return rc;
}
