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
 * 12. Unaligned checkpoints (docs/checkpoints.md, "Unaligned
 *    checkpoints"; the config's checkpoint_unaligned).  An upstream
 *    instance that snapshots n writes BARRIER n in-band as always, then
 *    announces n on each output ring (ring.h note 9).  This instance
 *    learns n when it reads an announcement (sl_snapshot_announced), when
 *    it reads BARRIER n in-band and checkpoints are unaligned from their
 *    start, or when its alignment of n outlasts
 *    checkpoint_aligned_timeout_ms (sl_snapshot_alignment_timeout).  It
 *    acts only between entries, never inside a callback.  On learning n
 *    (every unsettled id above last_snapshot_id up to n, in order:
 *    learn_upto) sl_snapshot_unaligned takes the synchronous snapshot
 *    without enqueuing the ack, forwards BARRIER n with its announcement,
 *    and starts capturing channel state for n, per input channel c:
 *      DONE at once   c delivered a barrier >= n in-band, or ended;
 *      copy, DONE     an announcement (n, pos) is visible on c: the
 *                     entries in [read position, pos) are copied out of
 *                     the ring (copy_overtaken; PAD and other barriers
 *                     skipped);
 *      LOGGING        otherwise: each entry read from c (records,
 *                     watermarks, idle) is appended (capture_entry) and
 *                     processed as usual, until an announcement of n
 *                     (copy the rest, DONE), a barrier >= n in-band or
 *                     END (DONE; END is not logged).
 *    The blocked channels of an alignment it replaces are unblocked:
 *    nothing blocks while a checkpoint is unaligned.  When every channel
 *    is DONE the ack goes out carrying the channel state
 *    (maybe_ack_unaligned).  Acks go out in id order: a capture finishes
 *    no later than a newer one (whatever finishes n+1 on a channel
 *    finishes n), and only the oldest capture's ack is sent.  Records
 *    processed after the snapshot are in the channel state and change
 *    the state after the snapshot: consistent, since a restore starts
 *    from the snapshot's state and the upstream from its own snapshot,
 *    after BARRIER n.  A capture whose checkpoint settles (an abort) is
 *    dropped with its ack (abort_capture, counted for
 *    sl_job_captures_aborted).  The stop checkpoint of a
 *    stop with a savepoint, and the checkpoint a savepoint copies, stay
 *    aligned: while a stop is pending or a savepoint holds the
 *    checkpointer (coordinator.c note 13) no barrier is taken unaligned
 *    and no alignment times out (aligned_required).  A source announces
 *    when checkpoints are unaligned from their start.  Besides between entries, the instance
 *    also acts between two slices of records inside an entry
 *    (sl_snapshot_between_records, runtime.c records_loop): a backpressured
 *    operator may need a whole entry's time (up to output_batch_records
 *    emits, each waiting for room) to reach the next entry.  Then the
 *    rest of that entry is the channel's first channel state (a RECORDS
 *    entry of the records not yet processed: append_partial), and a copy
 *    of that channel starts after the entry (partial_channel).
 * 13. On restore each channel's channel state (restore.c) is replayed
 *    before its ring is read (runtime.c replay_channel_state), as if it
 *    had been read from the ring.
 * 14. The copy pass (cow_map.c note 17).  An aligned snapshot other than
 *    the final one freezes with sl_cow_map_freeze_deferred; when the map
 *    then runs a copy pass over the new delta, the ack is built but held
 *    (held_ack, without its deltas) and the barrier goes on downstream as
 *    always.  The instance runs the pass in steps of SL_COPY_BUDGET
 *    versions wherever it looks for notifications (a held ack counts as
 *    one, so an instance does not park on it), and when the pass is over
 *    it takes the deltas from the map and enqueues the ack
 *    (send_held_ack).  The writer so never sees a list the pass
 *    changes.  A loop that finds no input, or that comes back more than
 *    SL_COPY_SLOW_NS after the last step (a chained member behind a
 *    source waiting in poll, a backpressured instance), finishes the
 *    pass at once; a step alone does not make run_inputs skip its
 *    announcements, timeouts and flushes (sl_snapshot_copy_only).
 *    Acks stay in id order: any other snapshot (the next aligned one, an
 *    unaligned one, the final one) finishes a held ack's pass and sends it
 *    first (sl_snapshot_finish_held), and so does the end of an instance that
 *    finished or was stopped; a failed instance frees it.  The time the
 *    pass takes is in the checkpoint's duration, not in the snapshot's
 *    synchronous part (sync_us).
 *
 * Capture of n on one channel (sl_capture, channels[c]):
 *
 *                 sl_snapshot_unaligned
 *   (none) ------+-----------------------------------------> DONE
 *                |   [delivered >= n, ended, or announced: copy_overtaken]
 *                v
 *             LOGGING --[capture_entry]--> LOGGING
 *                | [announced: copy_overtaken; barrier >= n; END]
 *                v
 *              DONE  --(all channels)--[maybe_ack_unaligned]--> acked
 *   any --[n settles: abort_capture]--> dropped
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
/* Versions of a copy pass (note 14) done per pass of the instance loop.
 * The loop comes here about once a batch of records, and until the pass
 * reaches a version each write to it is copied on write, the costlier
 * way: with 1,024 a step the pass over 600,000 versions (1M keys, every
 * 100 ms) took 50-80 ms and checkpoint_bench part 1 gained 30%; with
 * 8,192 it gained 45%.  A step costs 5-10 ns a version (cow_map.c note
 * 16's measure), so 40-80 us. */
#define SL_COPY_BUDGET 8192u
/* Note 14: a loop that came back to the pass this long after its last
 * step (it waited for input in a source's poll, or for room downstream)
 * finishes it at once: a checkpoint is not held up by a slow loop, and
 * such a loop is not one whose latency a pause would hurt. */
#define SL_COPY_SLOW_NS 1000000u

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

/* The map's pending deltas into ack (ENOMEM: none).  Note 14: never
 * while a copy pass changes the newest one's list. */
static int ack_deltas(sl_instance *inst, sl_ack *ack) {
  assert(!sl_cow_map_copying(inst->cp.keyed));
  const sl_cow_delta *deltas;
  int count;
  sl_cow_map_pending(inst->cp.keyed, &deltas, &count);
  assert(count >= 1);
  ack->deltas = count <= (int)(sizeof ack->inline_deltas /
                               sizeof ack->inline_deltas[0])
                    ? ack->inline_deltas
                    : malloc(sizeof *deltas * (size_t)count);
  if (!ack->deltas)
    return ENOMEM;
  memcpy(ack->deltas, deltas, sizeof *deltas * (size_t)count);
  ack->delta_count = count;
  return 0;
}

/* Note 14: the held ack, its map's copy pass over, gets its deltas and
 * is enqueued. */
static void send_held_ack(sl_instance *inst) {
  sl_ack *ack = inst->cp.held_ack;
  inst->cp.held_ack = 0;
  assert(ack);
  int rc = ack_deltas(inst, ack);
  if (rc && ack->status == 0) {
    ack->status = rc; /* this checkpoint fails; the deltas go with the next */
    snprintf(ack->cause, sizeof ack->cause,
             "handing over the keyed state of checkpoint %" PRIu64 " (%s)",
             ack->checkpoint_id, sl_strerror(rc));
  }
  sl_checkpointer_ack(inst->job, ack);
}

/* Note 14: finish the held ack's copy pass now and send it. */
void sl_snapshot_finish_held(sl_instance *inst) {
  if (!inst->cp.held_ack)
    return;
  sl_cow_map_copy_finish(inst->cp.keyed);
  send_held_ack(inst);
}

/* The synchronous part (note 4), the ack not yet enqueued: *out.  id is
 * 0 for the final snapshot.  With defer, the map may start a copy pass
 * (note 14): then the ack has no deltas yet.  On error nothing is frozen
 * and *out is untouched. */
static int build_snapshot(sl_instance *inst, uint64_t id, bool final,
                          uint64_t barrier_ns, uint64_t alignment_ns,
                          bool defer, sl_ack **out) {
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
    assert(!cp->held_ack); /* sl_snapshot_finish_held came first */
    sl_cow_delta frozen = defer ? sl_cow_map_freeze_deferred(cp->keyed)
                                : sl_cow_map_freeze(cp->keyed);
    remember_epoch(inst, final ? UINT64_MAX : id, frozen.epoch);
    if (!sl_cow_map_copying(cp->keyed) && ack_deltas(inst, ack) != 0) {
      free(ack);
      return ENOMEM;
    }
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
  *out = ack;
  return 0;
}

/* The synchronous part (note 4), its ack enqueued. */
static int take_snapshot(sl_instance *inst, uint64_t id, bool final,
                         uint64_t barrier_ns, uint64_t alignment_ns) {
  sl_ack *ack = 0;
  sl_snapshot_finish_held(inst); /* note 14: acks in id order */
  int rc = build_snapshot(inst, id, final, barrier_ns, alignment_ns, !final,
                          &ack);
  if (rc)
    return rc;
  /* Note 12: acks in id order; an aligned snapshot comes only once every
   * channel delivered its barrier, which finished every older capture. */
  assert(inst->cp.capture_count == 0);
  if (inst->cp.keyed && sl_cow_map_copying(inst->cp.keyed)) {
    inst->cp.held_ack = ack; /* note 14 */
    inst->cp.held_step_ns = sl_now_ns();
  } else
    sl_checkpointer_ack(inst->job, ack);
  if (!final)
    inst->cp.next_ack = calloc(1, sizeof *ack); /* NULL: next time */
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

/* ------------------------------------------ unaligned checkpoints (12) */

static bool unaligned_on(const sl_job *job) {
  return job->config.checkpoint_unaligned != 0;
}

/* Note 12: a stop with a savepoint is pending, or a savepoint holds the
 * checkpointer: their checkpoints stay aligned.  The request and the
 * hold are stored before their checkpoint is triggered, and every
 * barrier of that checkpoint comes after the trigger (acquire chains
 * through the rings), so relaxed looks suffice. */
static bool aligned_required(const sl_job *job) {
  return atomic_load_explicit(&job->stop_request, memory_order_relaxed) !=
             SL_STOP_REQUEST_NONE ||
         sl_checkpointer_aligned_held(job);
}

/* Note 12: a barrier read now is taken unaligned at once. */
static bool unaligned_now(const sl_job *job) {
  return unaligned_on(job) && job->config.checkpoint_aligned_timeout_ms == 0 &&
         !aligned_required(job);
}

static __attribute__((unused)) bool capture_check(const sl_instance *inst) {
  const sl_instance_checkpoint *cp = &inst->cp;
  if (cp->capture_count < 0 || cp->capture_count > SL_CAPTURES_MAX)
    return false;
  for (int k = 0; k < cp->capture_count; k++) {
    const sl_capture *cap = &cp->captures[k];
    if (cap->id > cp->last_snapshot_id || !cap->ack)
      return false;
    if (k > 0 && cap->id <= cp->captures[k - 1].id)
      return false; /* oldest first, one capture per id */
    int done = 0;
    for (int c = 0; c < inst->channel_count && cap->channels; c++)
      done += cap->channels[c].done;
    if (cap->channels && done != cap->channels_done)
      return false;
  }
  for (int c = 0; c < inst->channel_count; c++) {
    int n = 0;
    for (int k = 0; k < cp->capture_count; k++)
      n += cp->captures[k].channels && !cp->captures[k].channels[c].done;
    if (n != inst->channels[c].logging)
      return false;
  }
  return true;
}

/* Append bytes to a channel state; false when out of memory. */
static bool state_append(sl_channel_state *st, const void *data,
                         uint64_t bytes) {
  if (st->bytes + bytes > st->capacity) {
    uint64_t want = st->capacity ? st->capacity * 2 : 4096;
    while (want < st->bytes + bytes)
      want *= 2;
    void *grown = realloc(st->data, want);
    if (!grown)
      return false;
    st->data = grown;
    st->capacity = want;
  }
  memcpy(st->data + st->bytes, data, bytes);
  st->bytes += bytes;
  return true;
}

static void channel_done(sl_instance *inst, sl_capture *cap, int c) {
  if (!cap->channels || cap->channels[c].done)
    return;
  cap->channels[c].done = true;
  cap->channels_done++;
  assert(inst->channels[c].logging > 0);
  inst->channels[c].logging--;
}

/* Note 12, copy: the entries of channel c in [its read position, pos)
 * into the channel state of cap, then c is DONE.  The producer published
 * them before it announced (ring.h note 9) and cannot overwrite them:
 * this instance has not released them. */
static void copy_overtaken(sl_instance *inst, sl_capture *cap, int c,
                           uint64_t pos) {
  sl_ring *r = inst->channels[c].ring;
  uint64_t at = r->consumer_position;
  /* Mid-entry: the rest of the entry at the read position is in the
   * capture already (append_partial, or logged when it began). */
  if (inst->cp.partial_channel == &inst->channels[c])
    at += sl_entry_bytes(inst->cp.partial_entry);
  assert(at <= pos);
  sl_channel_state *st = &cap->channels[c];
  while (at < pos) {
    const sl_entry *e = (const sl_entry *)(r->buffer + (at & r->mask));
    uint64_t bytes = e->kind == SL_ENTRY_PAD ? e->record_bytes
                                             : sl_entry_bytes(e);
    assert(e->kind != SL_ENTRY_END); /* END is the last entry, after pos */
    if ((e->kind == SL_ENTRY_RECORDS || e->kind == SL_ENTRY_WATERMARK ||
         e->kind == SL_ENTRY_IDLE) &&
        !state_append(st, e, bytes))
      cap->status = ENOMEM;
    at += bytes;
  }
  assert(at == pos);
  channel_done(inst, cap, c);
}

/* Note 12, mid-entry: the records of the entry being processed on
 * channel c that are not processed yet, as one RECORDS entry, into cap
 * (they will be processed after the snapshot). */
static void append_partial(sl_instance *inst, sl_capture *cap, int c) {
  const sl_instance_checkpoint *cp = &inst->cp;
  if (cp->partial_channel != &inst->channels[c])
    return;
  const sl_entry *e = cp->partial_entry;
  assert(e->kind == SL_ENTRY_RECORDS && cp->partial_next < e->count);
  uint32_t stride = sl_record_stride(e->record_bytes, e->flags);
  sl_entry head = *e;
  head.count = (uint16_t)(e->count - cp->partial_next);
  const uint8_t *rest = (const uint8_t *)e + 8 + (size_t)cp->partial_next *
                                                     stride;
  if (!state_append(&cap->channels[c], &head, sizeof head) ||
      !state_append(&cap->channels[c], rest, (uint64_t)head.count * stride))
    cap->status = ENOMEM;
}

/* Note 12, LOGGING: one entry read from ch (RECORDS, WATERMARK or IDLE)
 * goes into every capture logging ch. */
static int capture_entry(sl_instance *inst, sl_channel *ch, const void *entry,
                         uint64_t bytes) {
  int c = (int)(ch - inst->channels);
  for (int k = 0; k < inst->cp.capture_count; k++) {
    sl_capture *cap = &inst->cp.captures[k];
    if (cap->channels && !cap->channels[c].done &&
        !state_append(&cap->channels[c], entry, bytes))
      cap->status = ENOMEM; /* the ack will fail the checkpoint */
  }
  return 0;
}

int sl_snapshot_capture_entry(sl_instance *inst, sl_channel *ch,
                              const void *entry, uint64_t bytes) {
  assert(ch->logging > 0);
  return capture_entry(inst, ch, entry, bytes);
}

static void free_capture(sl_capture *cap, int channel_count) {
  if (cap->channels)
    for (int c = 0; c < channel_count; c++)
      free(cap->channels[c].data);
  free(cap->channels);
  memset(cap, 0, sizeof *cap);
}

/* Note 12: forget capture k (its checkpoint settled, or the table is
 * full), its ack with it: the deltas it lists stay frozen for the next
 * snapshot, as after any aborted checkpoint. */
static void drop_capture(sl_instance *inst, int k) {
  sl_instance_checkpoint *cp = &inst->cp;
  sl_capture *cap = &cp->captures[k];
  for (int c = 0; c < inst->channel_count; c++)
    channel_done(inst, cap, c);
  sl_ack_free(cap->ack);
  free_capture(cap, inst->channel_count);
  memmove(cp->captures + k, cp->captures + k + 1,
          sizeof cp->captures[0] * (size_t)(cp->capture_count - k - 1));
  cp->capture_count--;
  memset(&cp->captures[cp->capture_count], 0, sizeof cp->captures[0]);
}

/* Note 12: the oldest capture's checkpoint aborted (settled before the
 * capture's ack went out): drop it, and count it for
 * sl_job_captures_aborted(). */
static void abort_capture(sl_instance *inst) {
  assert(inst->cp.capture_count > 0);
  atomic_fetch_add_explicit(&inst->job->captures_aborted, 1,
                            memory_order_relaxed);
  drop_capture(inst, 0);
}

/* The channel state of cap as the ack carries it (checkpoint_writer.c
 * note 6): per channel with entries, in index order, u32 channel, u32 0,
 * u64 bytes, then the entries.  0 or ENOMEM. */
static int serialize_capture(const sl_instance *inst, const sl_capture *cap,
                             sl_ack *ack) {
  uint64_t total = 0;
  for (int c = 0; c < inst->channel_count; c++)
    if (cap->channels[c].bytes)
      total += 16 + cap->channels[c].bytes;
  if (total == 0)
    return 0;
  uint8_t *out = malloc(total);
  if (!out)
    return ENOMEM;
  uint64_t at = 0;
  for (int c = 0; c < inst->channel_count; c++) {
    const sl_channel_state *st = &cap->channels[c];
    if (!st->bytes)
      continue;
    uint32_t head[2] = {(uint32_t)c, 0};
    memcpy(out + at, head, 8);
    memcpy(out + at + 8, &st->bytes, 8);
    memcpy(out + at + 16, st->data, st->bytes);
    at += 16 + st->bytes;
  }
  assert(at == total);
  ack->channel_state = out;
  ack->channel_state_bytes = total;
  return 0;
}

/* Note 12: enqueue the acks of the oldest captures that are complete, in
 * id order. */
static void maybe_ack_unaligned(sl_instance *inst) {
  sl_instance_checkpoint *cp = &inst->cp;
  while (cp->capture_count > 0 &&
         (!cp->captures[0].channels ||
          cp->captures[0].channels_done == inst->channel_count)) {
    sl_capture *cap = &cp->captures[0];
    sl_ack *ack = cap->ack;
    int rc = cap->status;
    if (rc == 0 && cap->channels)
      rc = serialize_capture(inst, cap, ack);
    if (rc && ack->status == 0) {
      ack->status = rc;
      snprintf(ack->cause, sizeof ack->cause,
               "capturing the channel state of checkpoint %" PRIu64
               " (%s)", cap->id, sl_strerror(rc));
    }
    cap->ack = 0;
    drop_capture(inst, 0); /* nothing logs any more */
    sl_checkpointer_ack(inst->job, ack);
  }
  assert(capture_check(inst));
}

/* Note 12, steps 1-5 for id (above last_snapshot_id, unsettled). */
int sl_snapshot_unaligned(sl_instance *inst, uint64_t id) {
  sl_instance_checkpoint *cp = &inst->cp;
  assert(id > cp->last_snapshot_id);
  assert(unaligned_on(inst->job));
  if (cp->capture_count == SL_CAPTURES_MAX)
    abort_capture(inst); /* aborted long ago, not yet seen settled */
  uint64_t now = sl_now_ns();
  bool was_aligning = cp->aligning_id == id;
  sl_ack *ack = 0;
  sl_snapshot_finish_held(inst); /* note 14: acks in id order */
  int rc = build_snapshot(inst, id, false,
                          was_aligning ? cp->align_start_ns : now,
                          was_aligning ? now - cp->align_start_ns : 0, false,
                          &ack);
  if (rc)
    return rc;
  ack->unaligned = true;
  inst->cp.next_ack = calloc(1, sizeof *ack); /* NULL: next time */
  sl_capture *cap = &cp->captures[cp->capture_count++];
  cap->id = id;
  cap->ack = ack;
  cap->channels = calloc((size_t)(inst->channel_count ? inst->channel_count
                                                       : 1),
                         sizeof *cap->channels);
  if (!cap->channels)
    cap->status = ENOMEM; /* counts as done everywhere; the ack fails */
  for (int c = 0; c < inst->channel_count && cap->channels; c++)
    inst->channels[c].logging++;
  /* Step 2: downstream learns n at once, ahead of the queued records. */
  rc = sl_instance_write_barrier_announced(inst, id);
  /* Step 3, per channel. */
  for (int c = 0; c < inst->channel_count && cap->channels; c++) {
    sl_channel *ch = &inst->channels[c];
    uint64_t pos;
    if (ch->ended || ch->barrier_in >= id) {
      channel_done(inst, cap, c);
      continue;
    }
    append_partial(inst, cap, c); /* mid-entry: the rest comes later */
    if (sl_ring_announced_consumer(ch->ring, id, &pos))
      copy_overtaken(inst, cap, c, pos);
  }
  /* Step 4: an alignment this replaces (or an older one) ends. */
  if (cp->aligning_id && cp->aligning_id <= id)
    unblock_all(inst);
  assert(aligner_check(inst));
  maybe_ack_unaligned(inst); /* step 5 */
  return rc;
}

/* Note 12: learn every unsettled id above the newest snapshot up to n.
 * An id below a barrier some channel already delivered in-band is
 * skipped: that channel may have delivered records after the id's own
 * barrier (or an upstream instance skipped the id, taking only a newer
 * trigger), so a snapshot now would hold them; such an id was abandoned
 * here (note 5) and cannot complete anyway. */
static int learn_upto(sl_instance *inst, uint64_t n) {
  sl_instance_checkpoint *cp = &inst->cp;
  uint64_t settled =
      atomic_load_explicit(&inst->job->cp_settled_id, memory_order_relaxed);
  uint64_t from = (cp->last_snapshot_id > settled ? cp->last_snapshot_id
                                                  : settled) + 1;
  if (n >= from && n - from >= SL_CAPTURES_MAX)
    from = n - SL_CAPTURES_MAX + 1; /* older ones cannot be in flight */
  if (n > cp->max_seen_id)
    cp->max_seen_id = n;
  uint64_t delivered = 0; /* the newest barrier read in-band anywhere */
  for (int c = 0; c < inst->channel_count; c++)
    if (inst->channels[c].barrier_in > delivered)
      delivered = inst->channels[c].barrier_in;
  for (uint64_t k = from; k <= n; k++) {
    if (k < delivered)
      continue;
    int rc = sl_snapshot_unaligned(inst, k);
    if (rc)
      return rc;
  }
  return 0;
}

/* Note 12: ch delivered BARRIER id in-band: every capture up to id is
 * DONE there. */
static void captures_delivered(sl_instance *inst, sl_channel *ch,
                               uint64_t id) {
  int c = (int)(ch - inst->channels);
  for (int k = 0; k < inst->cp.capture_count; k++)
    if (inst->cp.captures[k].id <= id)
      channel_done(inst, &inst->cp.captures[k], c);
  maybe_ack_unaligned(inst);
}

int sl_snapshot_announced(sl_instance *inst) {
  sl_job *job = inst->job;
  sl_instance_checkpoint *cp = &inst->cp;
  /* Acquire: pairs with the producers' bumps; the slots are read after. */
  cp->announce_seen =
      atomic_load_explicit(&cp->announce_seq, memory_order_acquire);
  if (!job->cp || !unaligned_on(job) || cp->restored_finished)
    return 0;
  uint64_t newest = 0;
  for (int c = 0; c < inst->channel_count; c++) {
    uint64_t id = sl_ring_announced_max_consumer(inst->channels[c].ring);
    if (!inst->channels[c].ended && id > newest)
      newest = id;
  }
  uint64_t settled =
      atomic_load_explicit(&job->cp_settled_id, memory_order_relaxed);
  if (newest > cp->last_snapshot_id && newest > settled) {
    int rc = learn_upto(inst, newest); /* new captures copy what they can */
    if (rc)
      return rc;
  }
  /* Captures taken before: announcements that finish their LOGGING. */
  for (int k = 0; k < cp->capture_count; k++) {
    sl_capture *cap = &cp->captures[k];
    for (int c = 0; c < inst->channel_count && cap->channels; c++) {
      uint64_t pos;
      if (!cap->channels[c].done &&
          sl_ring_announced_consumer(inst->channels[c].ring, cap->id, &pos))
        copy_overtaken(inst, cap, c, pos);
    }
  }
  maybe_ack_unaligned(inst);
  return 0;
}

bool sl_snapshot_alignment_timed_out(const sl_instance *inst,
                                     uint64_t now_ns) {
  const sl_job *job = inst->job;
  uint32_t ms = job->config.checkpoint_aligned_timeout_ms;
  return inst->cp.aligning_id != 0 && ms != 0 && !aligned_required(job) &&
         now_ns - inst->cp.align_start_ns >= (uint64_t)ms * 1000000u;
}

uint64_t sl_snapshot_alignment_wait_ns(const sl_instance *inst) {
  uint32_t ms = inst->job->config.checkpoint_aligned_timeout_ms;
  /* While aligned is required nothing times out: a wait for input parks
   * rather than waking every nanosecond once the timeout has passed. */
  if (inst->cp.aligning_id == 0 || ms == 0 || aligned_required(inst->job))
    return UINT64_MAX;
  uint64_t waited = sl_now_ns() - inst->cp.align_start_ns;
  uint64_t limit = (uint64_t)ms * 1000000u;
  return waited >= limit ? 0 : limit - waited;
}

/* Note 12: the alignment being made outlasted the timeout: switch it
 * (and any older unsettled id) to unaligned. */
int sl_snapshot_alignment_timeout(sl_instance *inst) {
  if (!sl_snapshot_alignment_timed_out(inst, sl_now_ns()))
    return 0;
  return learn_upto(inst, inst->cp.aligning_id);
}

/* Note 12: between two slices of the records of entry (the ring's entry
 * at the read position of inst->current_channel), next the index of the
 * next record to process: act on announcements and the aligned timeout
 * now rather than after the whole entry. */
int sl_snapshot_between_records(sl_instance *inst, const void *entry,
                                uint32_t next) {
  sl_instance_checkpoint *cp = &inst->cp;
  if (cp->replaying || !inst->current_channel)
    return 0; /* replayed entries are not in a ring */
  cp->partial_channel = inst->current_channel;
  cp->partial_entry = entry;
  cp->partial_next = next;
  int rc = sl_snapshot_announced(inst);
  if (rc == 0 && cp->aligning_id != 0 &&
      inst->job->config.checkpoint_aligned_timeout_ms != 0)
    rc = sl_snapshot_alignment_timeout(inst);
  cp->partial_channel = 0;
  cp->partial_entry = 0;
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
  if (id > ch->barrier_in)
    ch->barrier_in = id;
  if (unlikely(cp->capture_count != 0))
    captures_delivered(inst, ch, id); /* note 12 */
  if (id <= cp->last_snapshot_id ||
      id <= atomic_load_explicit(&job->cp_settled_id, memory_order_relaxed))
    return 0; /* note 5 */
  if (unaligned_now(job))
    return learn_upto(inst, id); /* note 12 */
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

int sl_snapshot_channel_ended(sl_instance *inst, sl_channel *ch) {
  if (!inst->job->cp)
    return 0;
  if (unlikely(inst->cp.capture_count != 0)) {
    /* Note 12: END finishes every capture on ch (END is not logged: a
     * restored upstream that had finished writes it again itself). */
    for (int k = 0; k < inst->cp.capture_count; k++)
      channel_done(inst, &inst->cp.captures[k], (int)(ch - inst->channels));
    maybe_ack_unaligned(inst);
  }
  return maybe_complete_alignment(inst);
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
  if (rc)
    return rc;
  /* Note 12: a source's barrier overtakes what waits in its rings. */
  return unaligned_now(job) ? sl_instance_write_barrier_announced(inst, id)
                            : sl_instance_write_barrier(inst, id);
}

int sl_snapshot_final(sl_instance *inst) {
  if (!inst->job->cp)
    return 0;
  /* Note 12: every channel ended, so every capture was acked. */
  assert(inst->cp.capture_count == 0);
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
  return inst->cp.maintain_pending || inst->cp.held_ack ||
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
    while (cp->capture_count > 0 && cp->captures[0].id <= settled)
      abort_capture(inst); /* note 12: it was aborted */
  }
  if (cp->maintain_pending)
    cp->maintain_pending = sl_cow_map_maintain(cp->keyed, SL_MAINTAIN_BUDGET);
  if (cp->held_ack) { /* note 14 */
    uint64_t now = sl_now_ns();
    if (now - cp->held_step_ns > SL_COPY_SLOW_NS && !job->test_copy_budget)
      sl_cow_map_copy_finish(cp->keyed); /* a slow loop: all of it now */
    else
      (void)sl_cow_map_copy_step(cp->keyed, job->test_copy_budget
                                                ? job->test_copy_budget
                                                : SL_COPY_BUDGET);
    cp->held_step_ns = now;
    if (!sl_cow_map_copying(cp->keyed))
      send_held_ack(inst);
  }
  return 0;
}

bool sl_snapshot_copy_only(const sl_instance *inst) {
  const sl_job *job = inst->job;
  return inst->cp.held_ack && !inst->cp.maintain_pending &&
         atomic_load_explicit(&job->cp_completed_id, memory_order_relaxed) ==
             inst->cp.seen_completed &&
         atomic_load_explicit(&job->cp_settled_id, memory_order_relaxed) ==
             inst->cp.seen_settled;
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
  while (inst->cp.capture_count > 0)
    drop_capture(inst, 0);
  if (inst->cp.replay) {
    for (int c = 0; c < inst->channel_count; c++)
      free(inst->cp.replay[c].data);
    free(inst->cp.replay);
  }
  release_rows(inst, UINT64_MAX); /* note 10: the writer has stopped */
  free(inst->cp.next_ack);
  sl_ack_free(inst->cp.held_ack); /* note 14: a failed instance's */
  sl_cow_map_destroy(inst->cp.keyed);
  inst->cp.keyed = 0;
  free(inst->cp.blob_new);
  free(inst->cp.blob_restored);
  free(inst->cp.key_buffer);
  free(inst->cp.value_buffer);
  free(inst->cp.key_copy);
  memset(&inst->cp, 0, sizeof inst->cp);
}
