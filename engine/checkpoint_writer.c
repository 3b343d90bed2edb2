/* checkpoint_writer.c — the one job: the asynchronous writer thread,
 * which makes a checkpoint durable in one LMDB write transaction and, in
 * between, compacts the store.
 *
 * NOTES ON THE DESIGN OF THE CHECKPOINT WRITER
 *
 * 1. The coordinator hands the writer a checkpoint n when every instance
 *    has acknowledged it or stands in with its final ack (coordinator.c
 *    notes 3, 5).  The writer puts n's deltas (oldest first, skipping
 *    those already durable) and blobs into one LMDB write transaction,
 *    adds the record of n and commits durably.  Only that commit makes n
 *    complete (DESIGN.md invariant 5).  MDB_MAP_FULL grows the map and
 *    writes the transaction again.
 * 2. advance() visits checkpoints in id order, but a fully acknowledged
 *    newer one is handed over while an older one still waits for acks
 *    (coordinator.c note 8); the writer therefore skips (as subsumed) one
 *    whose id is not above the store's latest, and durable_epoch only
 *    moves on a commit.  It also gives up a checkpoint whose abort the
 *    coordinator requested (timeout, subsumed), looking every 4096
 *    entries; the result is ECANCELED.
 * 3. Table rows (operators/table_sink.c, snapshot.c note 10) are written
 *    like keyed-state deltas: each instance's part of checkpoint n puts
 *    the row batches of its ack, oldest first, skipping those whose seq
 *    is at or below durable_row_seq (written by an earlier commit), into
 *    n's one write transaction, before its blob and the record of n.  So
 *    a table changes only with a complete checkpoint, and exactly by the
 *    rows of the records before n's barrier; rows of an aborted
 *    checkpoint stay in the instance and go with the next.
 * 4. Only the writer touches the store while the job runs; restoring
 *    (restore.c) happens before any checkpointer thread starts.  The
 *    exceptions: table reads (sl_job_table_reader) and savepoint copies
 *    (sl_job_savepoint) from any thread, in read transactions of their
 *    own (store.h CONCURRENCY).
 * 5. Between checkpoints the writer compacts the store when its log has
 *    grown as large as its base (compact_if_due); a checkpoint handed
 *    over or a shutdown cancels a running compaction, which keeps its
 *    committed steps and resumes on the next call (store.h note 3).
 *
 * Entry: sl_checkpoint_writer_main (started by sl_checkpointer_start);
 * per checkpoint: writer_take, write_checkpoint, write_once,
 * write_instance, write_rows.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lmdb.h>

#include "checkpoint_internal.h"
#include "fault.h"

/* Key group of a keyed-state key: its first 8 bytes are the record key,
 * big-endian (state.c). */
static uint16_t entry_group(const sl_job *job, const sl_cow_entry *e) {
  assert(e->key_bytes >= 8);
  uint64_t key = sl_load_be64(sl_cow_entry_key(e));
  return (uint16_t)sl_key_group(key, job->config.max_parallelism);
}

/* An entry to write and its place in LMDB's order: (key group, record
 * key), then the rest of the state key (state id, kind, user key).  The
 * radix sort orders by the first two; runs equal there (several states of
 * one key) are finished by insertion sort on the rest.  Both are stable,
 * so versions of one state key stay oldest first (the newest is written
 * last and wins).  Exact order lets the store append (MDB_APPEND). */
typedef struct sorted_entry {
  uint64_t key;   /* record key */
  uint16_t group; /* key group */
  const sl_cow_entry *entry;
} sorted_entry;

static unsigned sort_byte(const sorted_entry *e, int b) {
  return b < 8 ? (unsigned)(e->key >> (8 * b)) & 0xff
               : (unsigned)(e->group >> (8 * (b - 8))) & 0xff;
}

/* Stable LSD radix sort by (group, key), 8 bits a pass, least significant
 * first; a pass whose byte is the same in every entry is skipped (key
 * groups use few bits).  The result is in a or tmp: the returned pointer. */
static sorted_entry *radix_sort(sorted_entry *a, sorted_entry *tmp,
                                size_t n, size_t counts[10][256]) {
  memset(counts, 0, sizeof(size_t) * 10 * 256);
  for (size_t i = 0; i < n; i++)
    for (int b = 0; b < 10; b++)
      counts[b][sort_byte(&a[i], b)]++;
  for (int b = 0; b < 10; b++) {
    if (counts[b][sort_byte(&a[0], b)] == n)
      continue; /* every entry has the same byte here */
    size_t offset = 0;
    for (int v = 0; v < 256; v++) {
      size_t c = counts[b][v];
      counts[b][v] = offset;
      offset += c;
    }
    for (size_t i = 0; i < n; i++)
      tmp[counts[b][sort_byte(&a[i], b)]++] = a[i];
    sorted_entry *swap = a;
    a = tmp;
    tmp = swap;
  }
  return a;
}

/* Sorts a[0, n) by (group, key) into a or tmp (the returned pointer): a
 * counting sort by key group (groups of them), then each group's bucket
 * by radix_sort, whose group passes are skipped there.  A bucket (n /
 * groups entries) is sorted in the cache: two passes over the whole array
 * instead of one per varying byte (about 9), which for 1M changed keys
 * is half a GB of memory traffic less.  Stable, as radix_sort.  NULL if
 * there is no memory for the counts (the caller then sorts the long
 * way). */
static sorted_entry *group_sort(sorted_entry *a, sorted_entry *tmp, size_t n,
                                uint32_t groups, size_t counts[10][256]) {
  size_t *ends = calloc((size_t)groups + 1, sizeof *ends);
  if (!ends)
    return 0;
  for (size_t i = 0; i < n; i++) {
    assert(a[i].group < groups);
    ends[a[i].group + 1]++;
  }
  for (uint32_t g = 1; g <= groups; g++)
    ends[g] += ends[g - 1]; /* ends[g]: where bucket g starts */
  for (size_t i = 0; i < n; i++)
    tmp[ends[a[i].group]++] = a[i]; /* now ends[g]: where bucket g ends */
  size_t start = 0;
  for (uint32_t g = 0; g < groups; start = ends[g], g++) {
    size_t bucket = ends[g] - start;
    if (bucket < 2)
      continue;
    sorted_entry *sorted =
        radix_sort(tmp + start, a + start, bucket, counts);
    if (sorted != tmp + start)
      memcpy(tmp + start, sorted, bucket * sizeof *sorted);
  }
  assert(start == n);
  free(ends);
  return tmp;
}

/* The rest of two state keys after the record key, as LMDB compares them
 * (bytes, then length). */
static int rest_compare(const sl_cow_entry *x, const sl_cow_entry *y) {
  uint32_t xn = x->key_bytes - 8, yn = y->key_bytes - 8;
  int c = memcmp((const uint8_t *)sl_cow_entry_key(x) + 8,
                 (const uint8_t *)sl_cow_entry_key(y) + 8, xn < yn ? xn : yn);
  return c ? c : (xn > yn) - (xn < yn);
}

/* For long runs: by the rest of the key, then oldest version first (only
 * versions of one state key compare equal on the rest, and they come from
 * different epochs: superseded ones of one epoch are not collected). */
static int run_compare(const void *x, const void *y) {
  const sl_cow_entry *a = ((const sorted_entry *)x)->entry;
  const sl_cow_entry *b = ((const sorted_entry *)y)->entry;
  int c = rest_compare(a, b);
  return c ? c : (a->epoch > b->epoch) - (a->epoch < b->epoch);
}

/* Runs longer than this (map state: many user keys under one record key)
 * are sorted with qsort instead of insertion sort. */
#define SL_SHORT_RUN 16u

/* Finish the order inside runs of equal (group, key): a run is as long as
 * the changed states of one record key — usually a few (insertion sort),
 * for map state possibly many (qsort by run_compare). */
static void sort_runs(sorted_entry *a, size_t n) {
  for (size_t start = 0, end; start < n; start = end) {
    for (end = start + 1; end < n && a[end].key == a[start].key &&
                          a[end].group == a[start].group;
         end++) {
    }
    if (end - start > SL_SHORT_RUN)
      qsort(a + start, end - start, sizeof *a, run_compare);
  }
  for (size_t i = 1; i < n; i++) {
    if (a[i].key != a[i - 1].key || a[i].group != a[i - 1].group)
      continue;
    sorted_entry e = a[i];
    size_t j = i;
    while (j > 0 && a[j - 1].key == e.key && a[j - 1].group == e.group &&
           rest_compare(a[j - 1].entry, e.entry) > 0) {
      a[j] = a[j - 1];
      j--;
    }
    a[j] = e;
  }
}

/* Collect the entries of instance i's deltas that are not yet durable into
 * the writer's sort buffers, sorted.  Returns the count, or -1 (ENOMEM). */
static int64_t collect_sorted(sl_checkpointer *cp, const sl_ack *a, int i,
                              uint32_t *max_epoch, sorted_entry **sorted) {
  const sl_job *job = cp->job;
  uint64_t n = 0;
  for (int d = 0; d < a->delta_count; d++)
    if (a->deltas[d].epoch > cp->durable_epoch[i])
      n += a->deltas[d].entries;
  if (n > cp->sort_capacity) {
    free(cp->sort_a);
    free(cp->sort_b);
    cp->sort_a = malloc(sizeof(sorted_entry) * n);
    cp->sort_b = malloc(sizeof(sorted_entry) * n);
    cp->sort_capacity = cp->sort_a && cp->sort_b ? n : 0;
    if (!cp->sort_capacity)
      return -1;
  }
  size_t count = 0;
  for (int d = 0; d < a->delta_count; d++) {
    const sl_cow_delta *delta = &a->deltas[d];
    if (delta->epoch <= cp->durable_epoch[i])
      continue; /* written by an earlier checkpoint (note 1) */
    if (delta->epoch > *max_epoch)
      *max_epoch = delta->epoch;
    for (const sl_cow_entry *e = delta->head; e; e = e->dirty_next) {
      assert(count < n);
      if (e->superseded)
        continue;
      cp->sort_a[count].key = sl_load_be64(sl_cow_entry_key(e));
      cp->sort_a[count].group = entry_group(job, e);
      cp->sort_a[count].entry = e;
      count++;
    }
  }
  *sorted = count ? group_sort(cp->sort_a, cp->sort_b, count,
                               job->config.max_parallelism, cp->radix_counts)
                 : cp->sort_a;
  if (count && !*sorted) /* no memory for the counts: the long way */
    *sorted = radix_sort(cp->sort_a, cp->sort_b, count, cp->radix_counts);
  sort_runs(*sorted, count);
  return (int64_t)count;
}

/* qsort_r: two rows of the batch arg in LMDB's key order (memcmp, then
 * the shorter first); a batch's keys are distinct. */
static int row_compare(const void *x, const void *y, void *arg) {
  const sl_row_batch *batch = arg;
  const sl_row *a = &batch->rows[*(const uint32_t *)x];
  const sl_row *b = &batch->rows[*(const uint32_t *)y];
  uint32_t n = a->key_bytes < b->key_bytes ? a->key_bytes : b->key_bytes;
  int c = n ? memcmp(batch->arena + a->offset, batch->arena + b->offset, n)
            : 0;
  return c ? c : (a->key_bytes > b->key_bytes) - (a->key_bytes < b->key_bytes);
}

/* The rows of batch in key order, in the writer's buffer: LMDB takes
 * ordered puts about 2x faster (store_rows, 1M rows: 0.78 s vs 1.78 s),
 * and sorting here keeps O(n log n) off the barrier's path.  NULL (no
 * memory): write them as they are, which changes nothing but speed. */
static const uint32_t *row_order(sl_checkpointer *cp,
                                 const sl_row_batch *batch) {
  if (batch->row_count > cp->row_order_capacity) {
    free(cp->row_order);
    cp->row_order = malloc(sizeof *cp->row_order * batch->row_count);
    cp->row_order_capacity = cp->row_order ? batch->row_count : 0;
    if (!cp->row_order)
      return 0;
  }
  for (uint64_t r = 0; r < batch->row_count; r++)
    cp->row_order[r] = (uint32_t)r; /* a batch has < 2^32 rows */
  qsort_r(cp->row_order, batch->row_count, sizeof *cp->row_order,
          row_compare, (void *)batch);
  return cp->row_order;
}

/* Note 3: the row batches of ack a (instance i) not yet durable, oldest
 * first, into txn; *row_seq receives the newest seq written.  Adds to
 * *entries and *bytes.  Returns 0, ECANCELED or a store error. */
static int write_rows(sl_checkpointer *cp, sl_store_txn *txn, pending *p,
                      const sl_ack *a, int i, uint64_t *row_seq,
                      uint64_t *entries, uint64_t *bytes) {
  for (int b = 0; b < a->batch_count; b++) {
    if (a->batches[b].seq <= cp->durable_row_seq[i])
      continue; /* written, perhaps freed: not to be touched */
    const sl_row_batch *batch = a->batches[b].batch;
    assert(batch->seq == a->batches[b].seq);
    assert(batch->seq > *row_seq); /* oldest first */
    int table;
    int rc = sl_store_txn_table(txn, batch->table, &table);
    const uint32_t *order = rc == 0 ? row_order(cp, batch) : 0;
    for (uint64_t r = 0; r < batch->row_count && rc == 0; r++) {
      const sl_row *row = &batch->rows[order ? order[r] : r];
      assert(row->offset + row->key_bytes + row->value_bytes <=
             batch->arena_bytes);
      const uint8_t *key = batch->arena + row->offset;
      rc = row->tombstone
               ? sl_store_delete_row(txn, table, key, row->key_bytes)
               : sl_store_put_row(txn, table, key, row->key_bytes,
                                  key + row->key_bytes, row->value_bytes);
      *bytes += row->key_bytes + row->value_bytes;
      if (++*entries % SL_WRITER_ABORT_CHECK == 0 && rc == 0 &&
          (atomic_load(&p->abort_requested) || atomic_load(&cp->shutdown)))
        rc = ECANCELED;
    }
    if (rc)
      return rc;
    *row_seq = batch->seq;
  }
  return 0;
}

/* Put one instance's part of p into txn.  Returns 0 or a store error. */
static int write_instance(sl_checkpointer *cp, sl_store_txn *txn, pending *p,
                          int i, uint32_t *max_epoch, uint64_t *row_seq) {
  sl_job *job = cp->job;
  sl_instance *inst = job->instances[i];
  const sl_ack *a = p->acks[i] ? p->acks[i] : cp->final_acks[i];
  assert(a);
  /* coordinator.c note 3: a final ack stands in only for ids it never
   * received. */
  assert(!a->final || a->max_seen_id < p->id);
  uint16_t op = (uint16_t)inst->op->id;
  uint64_t entries = 0, bytes = 0;
  sorted_entry *sorted = 0;
  int64_t count = collect_sorted(cp, a, i, max_epoch, &sorted);
  if (count < 0)
    return ENOMEM;
  /* The entries are scattered in memory and visited in key order: fetch
   * a few ahead, or each visit waits for a cache miss. */
  enum { PREFETCH_AHEAD = 12 };
  for (int64_t k = 0; k < count; k++) {
    if (k + PREFETCH_AHEAD < count) {
      const sl_cow_entry *ahead = sorted[k + PREFETCH_AHEAD].entry;
      __builtin_prefetch(ahead);
      __builtin_prefetch((const uint8_t *)ahead + 64);
    }
    const sl_cow_entry *e = sorted[k].entry;
    uint16_t group = sorted[k].group;
    int rc;
    if (e->tombstone)
      rc = sl_store_delete_state(txn, op, group, sl_cow_entry_key(e),
                                 e->key_bytes);
    else
      rc = sl_store_put_state(
          txn, op, group, sl_cow_entry_key(e), e->key_bytes,
          e->data + sl_cow_value_offset(e->key_bytes), e->value_bytes);
    if (rc)
      return rc;
    entries++;
    bytes += e->key_bytes + e->value_bytes;
    if (entries % SL_WRITER_ABORT_CHECK == 0 &&
        (atomic_load(&p->abort_requested) || atomic_load(&cp->shutdown)))
      return ECANCELED;
  }
  uint64_t row_entries = 0;
  int rows_rc = write_rows(cp, txn, p, a, i, row_seq, &row_entries, &bytes);
  if (rows_rc)
    return rows_rc;
  /* Every instance gets a blob, with a flag byte, so a snapshot that saved
   * nothing replaces an older one (a restore must not see stale state).
   * Flag bit 0: operator state follows; bit 1: the event-time state
   * (watermark, largest timestamp: 16 bytes) comes last. */
  uint32_t user_bytes = a->has_blob ? a->blob_bytes : 0;
  uint32_t blob_bytes = 1 + user_bytes + (a->has_event_time ? 16u : 0u);
  uint8_t small[64];
  uint8_t *blob = blob_bytes <= sizeof small ? small : malloc(blob_bytes);
  if (!blob)
    return ENOMEM;
  /* coordinator.c note 10: a final ack marks its instance finished in
   * every checkpoint it stands in for. */
  blob[0] = (uint8_t)((a->has_blob ? SL_BLOB_STATE : 0u) |
                      (a->has_event_time ? SL_BLOB_EVENT_TIME : 0u) |
                      (a->final ? SL_BLOB_FINISHED : 0u));
  assert((blob[0] & ~SL_BLOB_FLAGS) == 0);
  if (user_bytes)
    memcpy(blob + 1, a->blob, user_bytes);
  if (a->has_event_time)
    memcpy(blob + 1 + user_bytes, a->event_time, 16);
  int rc = sl_store_put_blob(txn, op, (uint16_t)inst->index, blob, blob_bytes);
  if (blob != small)
    free(blob);
  p->entries[i] = entries;
  p->bytes[i] = bytes + blob_bytes;
  return rc;
}

/* One attempt at writing p.  *epochs and *row_seqs receive, per
 * instance, the newest epoch and row batch written. */
static int write_once(sl_checkpointer *cp, pending *p, uint32_t *epochs,
                      uint64_t *row_seqs) {
  sl_job *job = cp->job;
  sl_store_txn *txn = 0;
  if (job->faults) { /* inject.c: the cause names the fault */
    int rc = sl_inject_occurrence(job, 0, SL_FAULT_WRITE, -1, p->write_cause,
                                  sizeof p->write_cause);
    if (rc)
      return rc;
  }
  int rc = sl_store_begin(cp->store, &txn);
  if (rc)
    return rc;
  for (int i = 0; i < job->instance_count && rc == 0; i++) {
    uint64_t t0 = sl_now_ns();
    epochs[i] = cp->durable_epoch[i];
    row_seqs[i] = cp->durable_row_seq[i];
    rc = write_instance(cp, txn, p, i, &epochs[i], &row_seqs[i]);
    p->async_us[i] = (sl_now_ns() - t0) / 1000u;
    if (i == 0 && job->faults)
      sl_inject_crash_point(job, SL_CRASH_MID_WRITE);
  }
  if (rc) {
    sl_store_abort(txn);
    return rc;
  }
  cp_record rec = {.version = 2,
                   .final = p->final,
                   .trigger_time_ms = p->trigger_time_ms,
                   .instance_count = (uint64_t)job->instance_count};
  for (int i = 0; i < job->instance_count; i++) {
    rec.bytes_persisted += p->bytes[i];
    rec.entries_persisted += p->entries[i];
  }
  return sl_store_commit(txn, p->id, &rec, sizeof rec);
}

static void write_checkpoint(sl_checkpointer *cp, pending *p) {
  sl_job *job = cp->job;
  uint64_t t0 = sl_now_ns();
  uint32_t *epochs = calloc((size_t)job->instance_count, sizeof *epochs);
  uint64_t *row_seqs = calloc((size_t)job->instance_count, sizeof *row_seqs);
  int rc = epochs && row_seqs ? 0 : ENOMEM;
  /* Note 2: given up, or a newer one is already durable. */
  if (atomic_load(&p->abort_requested) ||
      p->id <= sl_store_latest(cp->store))
    rc = ECANCELED;
  for (int attempt = 0; rc == 0; attempt++) {
    rc = write_once(cp, p, epochs, row_seqs);
    if (rc != MDB_MAP_FULL || attempt == SL_MAP_FULL_RETRIES)
      break;
    /* Note 1: nothing was committed; grow and write it all again. */
    rc = sl_store_grow(cp->store);
  }
  p->write_us = (sl_now_ns() - t0) / 1000u;
  p->write_status = rc;
  if (rc == 0) {
    for (int i = 0; i < job->instance_count; i++) {
      cp->durable_epoch[i] = epochs[i];
      cp->durable_row_seq[i] = row_seqs[i];
    }
    if (job->faults) /* durable, the sinks not yet told */
      sl_inject_crash_point(job, SL_CRASH_AFTER_COMMIT);
  } else if (rc == SL_EINJECTED) {
    char text[sizeof p->write_cause];
    memcpy(text, p->write_cause, sizeof text);
    int used = snprintf(p->write_cause, sizeof p->write_cause,
                        "writing checkpoint %" PRIu64 " failed: ", p->id);
    sl_copy_text(p->write_cause + used, sizeof p->write_cause - (size_t)used,
                 text);
  } else if (rc == ECANCELED) {
    snprintf(p->write_cause, sizeof p->write_cause, "%s",
             atomic_load(&p->abort_requested) == ABORT_TIMEOUT
                 ? "timed out while being written"
                 : "subsumed by a newer checkpoint while being written");
  } else {
    snprintf(p->write_cause, sizeof p->write_cause,
             "writing checkpoint %" PRIu64 " to %s failed: %s%s%s%s%s%s",
             p->id, job->config.checkpoint.state_dir, sl_strerror(rc),
             sl_store_error(cp->store)[0] ? ": " : "",
             sl_store_error(cp->store),
             job->store_fault_text[0] ? " [injected fault '" : "",
             job->store_fault_text, job->store_fault_text[0] ? "']" : "");
  }
  job->store_fault_text[0] = 0;
  free(epochs);
  free(row_seqs);
}

static pending *writer_take(sl_checkpointer *cp) {
  pthread_mutex_lock(&cp->write_lock);
  pending *p = 0;
  if (cp->write_queue_count > 0) {
    p = cp->write_queue[0];
    memmove(cp->write_queue, cp->write_queue + 1,
            sizeof(pending *) * (size_t)(cp->write_queue_count - 1));
    cp->write_queue_count--;
  }
  pthread_mutex_unlock(&cp->write_lock);
  return p;
}

/* Log entries below which the store is not compacted: a small state
 * would otherwise be rewritten after nearly every checkpoint. */
#define SL_COMPACT_MIN_LOG_ENTRIES 65536u

/* Between checkpoints: merge the store's log into its base when the log
 * has grown as large as its base (store.h note 3).  A compaction runs in
 * steps of bounded size; a checkpoint handed over meanwhile cancels it,
 * which ends the step under way at its chunk's end (milliseconds) and
 * keeps every step done: the next call resumes it.  So a compaction never
 * delays a checkpoint by its whole length, and still finishes however
 * often checkpoints come.  A shutdown cancels it the same way.  A failure
 * loses nothing (the log stays) and is retried after the next
 * checkpoint. */
static void compact_if_due(sl_checkpointer *cp) {
  atomic_store(&cp->compaction_cancel, 0);
  pthread_mutex_lock(&cp->write_lock);
  bool queued = cp->write_queue_count > 0; /* after the reset: no race */
  pthread_mutex_unlock(&cp->write_lock);
  if (queued || atomic_load(&cp->no_compaction) ||
      atomic_load(&cp->shutdown) || atomic_load(&cp->job->stopping))
    return;
  sl_store_set_cancel(cp->store, &cp->compaction_cancel);
  for (int attempt = 0; attempt < SL_MAP_FULL_RETRIES; attempt++) {
    sl_store_compaction stats;
    int rc = sl_store_compact(cp->store, SL_COMPACT_MIN_LOG_ENTRIES, &stats);
    if (rc == 0) {
      cp->compaction_deferrals = 0;
      if (stats.entries_written + stats.log_entries_read > 0) {
        cp->compactions++;
        cp->compaction_us += stats.duration_us;
      }
    } else if (rc == ECANCELED) {
      cp->compaction_deferrals++;
    }
    if (rc != MDB_MAP_FULL || sl_store_grow(cp->store) != 0)
      break;
  }
}

/* The writer thread: checkpoints from the queue, in id order, each
 * written whole (note 1), then its result released to the coordinator;
 * compaction when the queue is empty (note 5). */
void *sl_checkpoint_writer_main(void *arg) {
  sl_checkpointer *cp = arg;
  pthread_setname_np(pthread_self(), "sl:writer");
  bool wrote = false;
  for (;;) {
    pending *p = writer_take(cp);
    if (!p && wrote && !atomic_load(&cp->shutdown)) {
      wrote = false;
      compact_if_due(cp);
      continue; /* look for work again before sleeping */
    }
    if (!p) {
      sl_parker_prepare(&cp->writer_parker);
      if (atomic_load(&cp->shutdown)) {
        sl_parker_cancel(&cp->writer_parker);
        return 0;
      }
      pthread_mutex_lock(&cp->write_lock);
      bool work = cp->write_queue_count > 0;
      pthread_mutex_unlock(&cp->write_lock);
      if (work)
        sl_parker_cancel(&cp->writer_parker);
      else
        sl_parker_sleep(&cp->writer_parker);
      continue;
    }
    write_checkpoint(cp, p);
    wrote = wrote || p->write_status == 0;
    /* Release: the coordinator reads the results after acquiring this. */
    atomic_store_explicit(&p->written, 1, memory_order_release);
    sl_parker_wake(&cp->coordinator_parker);
  }
}
