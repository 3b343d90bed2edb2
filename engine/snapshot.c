/* snapshot.c — the instance side of checkpointing: barriers, alignment,
 * the synchronous part of a snapshot, and completion notifications.
 *
 * NOTES ON THE DESIGN OF BARRIER HANDLING
 *
 * 1. Everything here runs on the instance's own thread (called from
 *    runtime.c); the coordinator talks to it only through atomics
 *    (trigger_id, cp_completed_id, cp_settled_id) and parker wake-ups.
 * 2. A source sees trigger n between two next() calls: it snapshots, then
 *    writes barrier n into every output ring.  Barriers keep their order
 *    with the records (DESIGN.md invariant 2).
 * 3. Aligned mode (exactly-once, DESIGN.md invariant 3): a channel that
 *    delivers barrier n is blocked — runtime.c reads nothing more from it —
 *    until every channel that has not ended delivered n.  A channel that
 *    delivered END counts as aligned, for n and every later barrier: so
 *    an instance downstream of a finished one goes on checkpointing
 *    (coordinator.c note 4).  Then: snapshot, barrier n on every
 *    output, unblock all channels.  At-least-once mode counts barriers
 *    without blocking and snapshots when the last one arrives; a newer
 *    barrier makes it forget an older, incomplete one.
 * 4. The synchronous part of a snapshot: freeze the keyed-state map (O(1),
 *    cow_map.h note 3), call the operator's snapshot hook (operator state,
 *    a sink's pre-commit), and enqueue the ack.  The asynchronous part is
 *    the writer's (checkpoint_writer.c note 1).
 * 5. A barrier of a settled checkpoint (every id <= cp_settled_id is
 *    complete or aborted; one this instance has not snapshotted can only be
 *    aborted), or older than the newest snapshot taken, is dropped: neither
 *    blocks nor is forwarded.  When the checkpoint being aligned settles,
 *    its alignment is cancelled and the blocked channels are read again
 *    (the records after the barrier then belong to the next checkpoint,
 *    which is still consistent).  Every barrier or trigger received, kept
 *    or dropped, raises max_seen_id, which the final snapshot reports
 *    (coordinator.c note 3).
 * 6. cp_completed_id rising to n: release the cow-map epochs frozen for
 *    checkpoints <= n (their old versions are reclaimed in bounded steps,
 *    sl_cow_map_maintain) and call checkpoint_complete(n).
 * 7. At the end of input an instance takes a final snapshot (no barrier
 *    follows it; its END does that job downstream), then waits until the
 *    final checkpoint is durable before its sinks commit and it closes.
 *    An instance restored as finished takes its final snapshot from what
 *    it restored, without calling a hook (coordinator.c note 10).
 * 8. The aligner state (aligning_id, barriers_seen, blocked channels) obeys
 *    aligner_check(), asserted at each transition.
 * 9. Each snapshot remembers (checkpoint id, epoch); releasing n releases
 *    the epoch of the newest remembered id <= n.  When the table is full the
 *    oldest pair is dropped: releasing a later epoch covers it.
 * 10. Table rows follow the rule of keyed-state deltas (a table sink's
 *    rows are its output, committed by the checkpoint transaction itself,
 *    checkpoint_writer.c note 3).  The sink's snapshot hook hands the rows it
 *    received since its previous snapshot to sl_snapshot_add_rows, as one
 *    batch tagged with the checkpoint id (UINT64_MAX for the final
 *    snapshot) and the next seq of the instance.  The instance keeps
 *    every batch until a completed checkpoint >= its tag, and each ack
 *    carries all batches kept (by pointer, with their seqs), oldest first:
 *    so the rows of an aborted checkpoint go with the next one, as its
 *    deltas do.  A completed checkpoint c was written from acks taken at
 *    or after every batch tagged <= c (snapshots run in id order; a final
 *    ack standing in was taken after all of them), so freeing those
 *    batches on "c complete" frees only written rows; the writer, told
 *    of the commit first, skips them by seq without reading them.  A
 *    restart frees every batch with the instance (rows not yet durable
 *    are replayed from the restored source positions).
 * 11. With a restart strategy (failover.c note 7) the map keeps what a
 *    rollback to its stable epoch needs (cow_map.h note 10), turned on
 *    when the instance has restored, and the instance tracks which
 *    checkpoint that epoch holds (stable_id): the restored one, then each
 *    completed one it released.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "internal.h"

#define unlikely(x) __builtin_expect(!!(x), 0)

/* Entries of deferred reclaiming done per pass of the instance loop. */
#define SL_MAINTAIN_BUDGET 512u

static bool exactly_once(const sl_job *job) {
  return job->config.checkpoint.mode == SL_EXACTLY_ONCE;
}

/* Every channel delivered the barrier being aligned, or ended.  (Counting
 * would be wrong in at-least-once mode: a channel can deliver the barrier
 * and then END.) */
static bool all_aligned(const sl_instance *inst) {
  for (int c = 0; c < inst->channel_count; c++)
    if (!inst->channels[c].barrier_seen && !inst->channels[c].ended)
      return false;
  return true;
}

static __attribute__((unused)) bool aligner_check(const sl_instance *inst) {
  int blocked = 0, seen = 0;
  for (int c = 0; c < inst->channel_count; c++) {
    const sl_channel *ch = &inst->channels[c];
    blocked += ch->blocked;
    seen += ch->barrier_seen;
    if (ch->blocked && ch->ended)
      return false; /* a blocked channel is not read, so cannot end */
  }
  if (seen != inst->cp.barriers_seen)
    return false;
  /* coordinator.c note 10: a restored finished instance never aligns. */
  if (inst->cp.restored_finished && (inst->cp.aligning_id || blocked))
    return false;
  if (inst->cp.aligning_id == 0)
    return blocked == 0 && seen == 0;
  /* Aligned mode blocks exactly the channels that delivered the barrier. */
  return exactly_once(inst->job) ? blocked == seen : blocked == 0;
}

static void remember_epoch(sl_instance *inst, uint64_t id, uint32_t epoch) {
  sl_instance_checkpoint *cp = &inst->cp;
  if (cp->epoch_count == SL_EPOCH_SLOTS) { /* note 9 */
    memmove(cp->epochs, cp->epochs + 1,
            sizeof cp->epochs[0] * (SL_EPOCH_SLOTS - 1));
    cp->epoch_count--;
  }
  cp->epochs[cp->epoch_count].id = id;
  cp->epochs[cp->epoch_count].epoch = epoch;
  cp->epoch_count++;
}

static void release_epochs(sl_instance *inst, uint64_t completed) {
  sl_instance_checkpoint *cp = &inst->cp;
  int n = 0;
  while (n < cp->epoch_count && cp->epochs[n].id <= completed)
    n++;
  if (n == 0)
    return;
  sl_cow_map_release(cp->keyed, cp->epochs[n - 1].epoch);
  cp->maintain_pending = true;
  /* Note 11: the stable state is now that of checkpoint epochs[n-1].id,
   * which is the one completed unless this instance took no snapshot for
   * it (a final snapshot stands in): then it is not known. */
  cp->stable_known = cp->stable_known && cp->epochs[n - 1].id == completed;
  cp->stable_id = completed;
  memmove(cp->epochs, cp->epochs + n,
          sizeof cp->epochs[0] * (size_t)(cp->epoch_count - n));
  cp->epoch_count -= n;
}

static int call_snapshot_hook(sl_instance *inst, uint64_t id) {
  sl_op *op = inst->op;
  int (*hook)(sl_ctx *, void *, uint64_t) = 0;
  if (op->kind == SL_OP_SOURCE)
    hook = op->fn.source.snapshot;
  else if (op->kind == SL_OP_PROCESS || op->kind == SL_OP_SINK)
    hook = op->fn.process.snapshot;
  /* coordinator.c note 10: a finished instance's state is what it
   * restored; its operator does not run again. */
  if (!hook || inst->cp.restored_finished)
    return 0;
  inst->cp.in_snapshot = true;
  inst->cp.row_tag = id ? id : UINT64_MAX; /* note 10: 0 is the final */
  inst->cause[0] = 0;
  int rc = hook(inst, inst->state, id);
  inst->cp.in_snapshot = false;
  return rc; /* nonzero fails the job (runtime.c note 8) */
}

int sl_snapshot_add_rows(sl_instance *inst, sl_row_batch *batch) {
  sl_instance_checkpoint *cp = &inst->cp;
  if (!batch || !cp->in_snapshot || !inst->job->cp)
    return SL_EUSAGE;
  if (cp->row_batch_count == SL_ROW_BATCHES_MAX) {
    snprintf(inst->cause, sizeof inst->cause,
             "%d row batches await a completed checkpoint",
             SL_ROW_BATCHES_MAX);
    return ENOSPC;
  }
  assert(!cp->rows_tail || cp->rows_tail->checkpoint_id <= cp->row_tag);
  batch->next = 0;
  batch->seq = ++cp->row_seq;
  batch->checkpoint_id = cp->row_tag;
  if (cp->rows_tail)
    cp->rows_tail->next = batch;
  else
    cp->rows_head = batch;
  cp->rows_tail = batch;
  cp->row_batch_count++;
  return 0;
}

void sl_row_batch_free(sl_row_batch *batch) {
  if (!batch)
    return;
  free(batch->rows);
  free(batch->arena);
  free(batch);
}

/* Note 10: every batch kept, into the ack (after the hook, so this
 * snapshot's own batch is in).  Returns 0 or ENOMEM. */
static int ack_rows(sl_instance *inst, sl_ack *ack) {
  sl_instance_checkpoint *cp = &inst->cp;
  int n = cp->row_batch_count;
  if (n == 0)
    return 0;
  int inline_slots = (int)(sizeof ack->inline_batches /
                           sizeof ack->inline_batches[0]);
  ack->batches = n <= inline_slots ? ack->inline_batches
                                   : malloc(sizeof *ack->batches * (size_t)n);
  if (!ack->batches)
    return ENOMEM;
  int k = 0;
  for (const sl_row_batch *b = cp->rows_head; b; b = b->next) {
    assert(k < n);
    assert(k == 0 || ack->batches[k - 1].seq < b->seq);
    ack->batches[k].seq = b->seq;
    ack->batches[k].batch = b;
    k++;
  }
  assert(k == n);
  ack->batch_count = n;
  return 0;
}

/* Note 10: "completed" wrote every batch tagged <= it. */
static void release_rows(sl_instance *inst, uint64_t completed) {
  sl_instance_checkpoint *cp = &inst->cp;
  while (cp->rows_head && cp->rows_head->checkpoint_id <= completed) {
    sl_row_batch *b = cp->rows_head;
    cp->rows_head = b->next;
    if (!cp->rows_head)
      cp->rows_tail = 0;
    cp->row_batch_count--;
    sl_row_batch_free(b);
  }
  assert(cp->row_batch_count >= 0);
  assert((cp->row_batch_count == 0) == (cp->rows_head == 0));
}

/* The synchronous part (note 4).  id is 0 for the final snapshot. */
static int take_snapshot(sl_instance *inst, uint64_t id, bool final,
                         uint64_t barrier_ns, uint64_t alignment_ns) {
  uint64_t t0 = sl_now_ns();
  /* Allocated after the previous snapshot, so that this one, which holds
   * up the barrier, does not wait for the allocator. */
  assert(final || !inst->cp.restored_finished); /* note 7 */
  sl_ack *ack = inst->cp.next_ack ? inst->cp.next_ack : calloc(1, sizeof *ack);
  inst->cp.next_ack = 0;
  if (!ack)
    return ENOMEM;
  ack->inst = inst;
  ack->checkpoint_id = id;
  ack->final = final;
  ack->barrier_ns = barrier_ns;
  ack->alignment_us = alignment_ns / 1000u;
  ack->max_seen_id = inst->cp.max_seen_id;
  sl_instance_checkpoint *cp = &inst->cp;
  if (cp->keyed) {
    sl_cow_delta frozen = sl_cow_map_freeze(cp->keyed);
    remember_epoch(inst, final ? UINT64_MAX : id, frozen.epoch);
    const sl_cow_delta *deltas;
    int count;
    sl_cow_map_pending(cp->keyed, &deltas, &count);
    assert(count >= 1);
    ack->deltas = count <= (int)(sizeof ack->inline_deltas /
                                 sizeof ack->inline_deltas[0])
                      ? ack->inline_deltas
                      : malloc(sizeof *deltas * (size_t)count);
    if (!ack->deltas) {
      free(ack);
      return ENOMEM;
    }
    memcpy(ack->deltas, deltas, sizeof *deltas * (size_t)count);
    ack->delta_count = count;
  }
  int rc = call_snapshot_hook(inst, id);
  if (rc == 0)
    rc = ack_rows(inst, ack);
  if (rc == 0 && unlikely(inst->job->faults != 0)) { /* inject.c */
    sl_inject_crash_point(inst->job, SL_CRASH_SNAPSHOT);
    rc = sl_inject_occurrence(inst->job, inst, SL_FAULT_SNAPSHOT, -1,
                              inst->cause, sizeof inst->cause);
  }
  if (rc) {
    ack->status = rc;
    snprintf(ack->cause, sizeof ack->cause, "%.100s%s(%.50s)", inst->cause,
             inst->cause[0] ? " " : "", sl_strerror(rc));
  }
  ack->blob = cp->blob_new;
  ack->blob_bytes = cp->blob_new_bytes;
  ack->has_blob = cp->has_blob_new;
  /* Event time goes with the snapshot, so that a restored job judges
   * lateness as the failed one did (timer.c note 7). */
  ack->has_event_time = inst->watermark != SL_WATERMARK_MIN ||
                        inst->max_timestamp != SL_NO_TIMESTAMP;
  ack->event_time[0] = inst->watermark;
  ack->event_time[1] = inst->max_timestamp;
  cp->blob_new = 0;
  cp->blob_new_bytes = 0;
  cp->has_blob_new = false;
  ack->sync_us = (sl_now_ns() - t0) / 1000u;
  if (!final)
    cp->last_snapshot_id = id;
  sl_checkpointer_ack(inst->job, ack);
  if (!final)
    cp->next_ack = calloc(1, sizeof *ack); /* NULL: allocated next time */
  return 0;
}

static void unblock_all(sl_instance *inst) {
  for (int c = 0; c < inst->channel_count; c++) {
    inst->channels[c].blocked = false;
    inst->channels[c].barrier_seen = false;
  }
  inst->cp.aligning_id = 0;
  inst->cp.barriers_seen = 0;
}

/* Note 3: all live channels delivered the barrier being aligned. */
static int maybe_complete_alignment(sl_instance *inst) {
  sl_instance_checkpoint *cp = &inst->cp;
  if (cp->aligning_id == 0 || !all_aligned(inst))
    return 0;
  assert(aligner_check(inst));
  uint64_t id = cp->aligning_id;
  uint64_t now = sl_now_ns();
  int rc = take_snapshot(inst, id, false, cp->align_start_ns,
                         now - cp->align_start_ns);
  if (rc == 0)
    rc = sl_instance_write_barrier(inst, id);
  unblock_all(inst);
  assert(aligner_check(inst));
  return rc;
}

int sl_snapshot_barrier(sl_instance *inst, sl_channel *ch, uint64_t id,
                        bool *block) {
  *block = false;
  sl_job *job = inst->job;
  sl_instance_checkpoint *cp = &inst->cp;
  if (!job->cp)
    return 0;
  if (id > cp->max_seen_id)
    cp->max_seen_id = id;
  if (id <= cp->last_snapshot_id ||
      id <= atomic_load_explicit(&job->cp_settled_id, memory_order_relaxed))
    return 0; /* note 5 */
  if (cp->aligning_id != id) {
    if (cp->aligning_id > id)
      return 0; /* older than the one being aligned: forgotten */
    unblock_all(inst); /* a newer one replaces an abandoned older one */
    cp->aligning_id = id;
    cp->align_start_ns = sl_now_ns();
  }
  assert(!ch->barrier_seen); /* one barrier n per ring */
  ch->barrier_seen = true;
  cp->barriers_seen++;
  if (exactly_once(job)) {
    ch->blocked = true;
    *block = true;
  }
  assert(aligner_check(inst));
  return maybe_complete_alignment(inst);
}

int sl_snapshot_channel_ended(sl_instance *inst) {
  return inst->job->cp ? maybe_complete_alignment(inst) : 0;
}

int sl_snapshot_source_poll(sl_instance *inst) {
  sl_job *job = inst->job;
  if (!job->cp)
    return 0;
  /* Acquire: pairs with the coordinator's release of the trigger. */
  uint64_t id =
      atomic_load_explicit(&inst->cp.trigger_id, memory_order_acquire);
  if (id > inst->cp.max_seen_id)
    inst->cp.max_seen_id = id;
  if (id <= inst->cp.last_snapshot_id ||
      id <= atomic_load_explicit(&job->cp_settled_id, memory_order_relaxed))
    return 0;
  int rc = take_snapshot(inst, id, false, sl_now_ns(), 0);
  return rc ? rc : sl_instance_write_barrier(inst, id);
}

int sl_snapshot_final(sl_instance *inst) {
  if (!inst->job->cp)
    return 0;
  int rc = take_snapshot(inst, 0, true, sl_now_ns(), 0);
  inst->cp.final_acked = rc == 0;
  return rc;
}

/* coordinator.c note 10: the final snapshot of an instance restored as
 * finished.  Its keyed state is the map it restored (no delta: the store
 * holds it already); its operator state is the blob it restored, copied
 * as it was (no hook runs); its event time is the restored one. */
int sl_snapshot_final_restored(sl_instance *inst) {
  sl_instance_checkpoint *cp = &inst->cp;
  assert(cp->restored_finished && cp->restored_from != 0);
  assert(!cp->has_blob_new && !cp->final_acked);
  if (cp->has_blob_restored) {
    cp->blob_new = malloc(cp->blob_restored_bytes ? cp->blob_restored_bytes
                                                  : 1);
    if (!cp->blob_new)
      return ENOMEM;
    memcpy(cp->blob_new, cp->blob_restored, cp->blob_restored_bytes);
    cp->blob_new_bytes = cp->blob_restored_bytes;
    cp->has_blob_new = true;
  }
  return sl_snapshot_final(inst);
}

bool sl_snapshot_notification_pending(const sl_instance *inst) {
  const sl_job *job = inst->job;
  if (!job->cp)
    return false;
  return inst->cp.maintain_pending ||
         atomic_load_explicit(&job->cp_completed_id, memory_order_relaxed) !=
             inst->cp.seen_completed ||
         atomic_load_explicit(&job->cp_settled_id, memory_order_relaxed) !=
             inst->cp.seen_settled;
}

static void call_complete_hook(sl_instance *inst, uint64_t id) {
  sl_op *op = inst->op;
  if (op->kind == SL_OP_SOURCE && op->fn.source.checkpoint_complete)
    op->fn.source.checkpoint_complete(inst, inst->state, id);
  else if ((op->kind == SL_OP_PROCESS || op->kind == SL_OP_SINK) &&
           op->fn.process.checkpoint_complete)
    op->fn.process.checkpoint_complete(inst, inst->state, id);
}

int sl_snapshot_notifications(sl_instance *inst) {
  sl_job *job = inst->job;
  sl_instance_checkpoint *cp = &inst->cp;
  if (!job->cp)
    return 0;
  /* Acquire: the coordinator stored the id after the commit. */
  uint64_t completed = atomic_load_explicit(&job->cp_completed_id,
                                            memory_order_acquire);
  if (completed > cp->seen_completed) {
    cp->seen_completed = completed;
    if (cp->keyed)
      release_epochs(inst, completed);
    release_rows(inst, completed);
    /* inject.c: a failure after the commit, before the hook acts on it. */
    int rc = unlikely(job->faults != 0)
                 ? sl_inject_occurrence(job, inst, SL_FAULT_COMPLETE, -1,
                                        inst->cause, sizeof inst->cause)
                 : 0;
    if (rc) {
      size_t used = strlen(inst->cause);
      snprintf(inst->cause + used, sizeof inst->cause - used,
               " on the completion of checkpoint %" PRIu64, completed);
      return rc;
    }
    call_complete_hook(inst, completed);
  }
  uint64_t settled = atomic_load_explicit(&job->cp_settled_id,
                                          memory_order_acquire);
  if (settled > cp->seen_settled) {
    cp->seen_settled = settled;
    if (cp->aligning_id && cp->aligning_id <= settled)
      unblock_all(inst); /* note 5: it was aborted */
  }
  if (cp->maintain_pending)
    cp->maintain_pending = sl_cow_map_maintain(cp->keyed, SL_MAINTAIN_BUDGET);
  return 0;
}

/* Note 11: keep what an in-process rollback needs, from the state just
 * restored (or the empty one) on. */
static void enable_rollback(sl_instance *inst) {
  sl_instance_checkpoint *cp = &inst->cp;
  if (!cp->keyed || !inst->job->failover || !inst->job->cp)
    return;
  /* Nothing was written since the restore (or the rollback), so it
   * cannot be refused; if it were, failover would reload the store. */
  cp->stable_known = sl_cow_map_enable_rollback(cp->keyed) == 0;
  cp->stable_id = cp->restored_from;
}

int sl_snapshot_restore_hook(sl_instance *inst) {
  uint64_t id = inst->cp.restored_from;
  enable_rollback(inst); /* before the operator's hook can write */
  if (!id)
    return 0;
  inst->cp.seen_completed = id;
  inst->cp.seen_settled = id;
  inst->cp.last_snapshot_id = id;
  inst->cp.max_seen_id = id;
  sl_op *op = inst->op;
  int (*hook)(sl_ctx *, void *, uint64_t) = 0;
  if (op->kind == SL_OP_SOURCE)
    hook = op->fn.source.restore;
  else if (op->kind == SL_OP_PROCESS || op->kind == SL_OP_SINK)
    hook = op->fn.process.restore;
  int rc = hook ? hook(inst, inst->state, id) : 0;
  return rc; /* nonzero fails the job (runtime.c note 8) */
}

void sl_snapshot_instance_free(sl_instance *inst) {
  release_rows(inst, UINT64_MAX); /* note 10: the writer has stopped */
  free(inst->cp.next_ack);
  sl_cow_map_destroy(inst->cp.keyed);
  inst->cp.keyed = 0;
  free(inst->cp.blob_new);
  free(inst->cp.blob_restored);
  free(inst->cp.key_buffer);
  free(inst->cp.value_buffer);
  free(inst->cp.key_copy);
  memset(&inst->cp, 0, sizeof inst->cp);
}
