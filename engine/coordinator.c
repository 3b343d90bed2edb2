/* coordinator.c — the one job: the checkpoint coordinator thread, which
 * triggers checkpoints, collects the instances' acks, hands complete sets
 * to the writer (checkpoint_writer.c), and completes or aborts them; with
 * the checkpointer's lifecycle (alloc, start, stop, reset, free).
 * Restoring is in restore.c, the history and statistics in
 * checkpoint_stats.c; what they share is in checkpoint_internal.h.
 *
 * NOTES ON THE DESIGN OF CHECKPOINTING
 *
 * 1. The coordinator is one thread.  It triggers checkpoint n by storing n
 *    in every source instance's trigger_id and waking it; a source takes
 *    its snapshot between two next() calls and writes barrier n into every
 *    output ring (snapshot.c).  Ids are strictly increasing; a resumed job
 *    continues after the id it restored.
 * 2. Every instance acknowledges each snapshot with an sl_ack through a
 *    wait-free MPSC queue (liburcu's wfcqueue): instances enqueue, only the
 *    coordinator dequeues.  An ack carries the instance's frozen keyed-state
 *    deltas (descriptors only; the entries stay in the instance's cow map),
 *    its operator state and its timings.
 * 3. An instance that reached the end of its input takes one last, "final"
 *    snapshot.  Its state never changes after that, so it stands in for a
 *    checkpoint n the instance has not acknowledged — but only if it never
 *    received barrier (or trigger) n at all: then every input ended before
 *    n was emitted upstream, and its final state is its state at n.  If it
 *    received n and dropped it (n looked settled, or a newer barrier
 *    replaced it in at-least-once mode), it processed records after n, and
 *    n can no longer complete: it is aborted as subsumed.  The final ack
 *    carries max_seen_id for this test.
 * 4. Checkpoints go on after sources finished (as Flink's FLIP-147), as
 *    long as one source still runs (can_trigger):
 *    (a) a finished source snapshots and emits nothing for n; a channel
 *        that delivered END counts as aligned for every later barrier and
 *        is never blocked (snapshot.c note 3), so each consumer reads a
 *        finished channel up to its END before it can snapshot n, in
 *        aligned and in at-least-once mode: its snapshot n holds every
 *        record the finished instance emitted;
 *    (b) an instance that stands in for n never received barrier n, so
 *        none of its upstream instances sent n to it; each of them sent
 *        it END, so each finished without emitting n, and stands in for n
 *        too (or n aborts by the test above).  A checkpoint's finished
 *        instances are thus closed upstream, and their consumers' snapshots
 *        hold all their output;
 *    (c) the final ack stands in with SL_BLOB_FINISHED (note 10), so a
 *        restore from n (resume, savepoint, failover) restores it
 *        finished: it emits nothing but END, and its consumers' channels
 *        end at once, as they had when they snapshotted n;
 *    (d) the same final ack stands in for every later checkpoint: its
 *        deltas and row batches are written once (durable_epoch,
 *        durable_row_seq: checkpoint_writer.c notes 1, 3), its blob each
 *        time; with max_concurrent > 1 each in-flight id applies the test
 *        above on its own; aborts, timeouts and the final checkpoint
 *        (note 9) are as before.
 *    Once every source finished nothing is triggered: no barrier could be
 *    emitted, and the final checkpoint follows when the rest drain.
 * 5. When every instance has acknowledged n (or stands in with its final
 *    ack), the coordinator hands n to the writer thread, which writes it
 *    in one LMDB write transaction (checkpoint_writer.c note 1).  Only
 *    that commit makes n complete (DESIGN.md invariant 5).
 * 6. On commit the coordinator publishes cp_completed_id = n and wakes every
 *    instance: they release the cow-map epochs up to n (old versions are
 *    reclaimed) and call checkpoint_complete (an exactly-once sink commits
 *    here).  Older checkpoints still in flight are aborted as subsumed.
 * 7. A checkpoint not complete timeout_ms after its trigger (also while it
 *    is being written), or whose write or snapshot failed, is aborted.
 *    cp_settled_id is the highest x such that every id <= x is complete or
 *    aborted; instances drop barriers <= x and cancel an alignment on one
 *    (with max_concurrent > 1 a newer checkpoint can abort before an older
 *    one settles, so "the newest aborted id" would be wrong).  The aborted
 *    deltas stay pending in the cow maps and are written by the next
 *    checkpoint.  More than tolerable_failures consecutive aborts fail the
 *    job with SL_ECHECKPOINT and the cause; checkpoints subsumed by a newer
 *    complete one (or by the final one) do not count.
 * 8. advance() visits checkpoints in id order, but a fully acknowledged
 *    newer one is handed over while an older one still waits for acks;
 *    the writer therefore skips (as subsumed) one whose id is not above
 *    the store's latest (checkpoint_writer.c note 2).
 * 9. When every instance is final, in-flight checkpoints that are not being
 *    written are aborted (subsumed), and the final checkpoint is written as
 *    a normal one with the next id; cp_final_done then lets the instances
 *    (waiting after their END) commit their sinks and close.
 * 10. Finished instances (after Flink's FLIP-147).  An instance finishes
 *    once per job lineage, not once per attempt: the blob written from a
 *    final ack carries SL_BLOB_FINISHED (checkpoint_writer.c
 *    write_instance), so every checkpoint a final ack stands in for
 *    (notes 3, 4), the final checkpoint included, records that the
 *    instance had finished, beside its last state.  An instance restored
 *    from such a checkpoint (a resume, a start from a savepoint, a
 *    failover restart) is "restored finished": it opens and restores (a
 *    sink's restore commits what the checkpoint pre-committed, which is
 *    idempotent), but runs neither its input nor finish() nor its
 *    end-of-input timers again (runtime.c note 7, timer.c note 8): it
 *    acknowledges its restored state, unchanged, as its final snapshot
 *    (snapshot.c sl_snapshot_final_restored) and writes END.  So a
 *    resumed finished job adds no output, and a timer re-armed during the
 *    end-of-input firing never fires.  A store written before the flag
 *    existed is still read: there a checkpoint whose record says "final"
 *    has every instance finished (restore.c note 3); other old
 *    checkpoints have none.  The upstream instances of a finished one are
 *    finished in the same checkpoint (it finished after all their ENDs,
 *    so none of them sent a barrier it could have snapshotted).
 * 11. Stop with a savepoint (stop.c).  While a stop is pending
 *    (job->stop_request) no periodic checkpoint starts: the stop's own
 *    checkpoint, requested like sl_job_trigger_checkpoint's, is the one
 *    the savepoint is copied from.  Requested ones still start.
 * 12. max_concurrent left at 0 is automatic (auto_max_concurrent): one
 *    checkpoint in flight when the interval is at least
 *    SL_AUTO_CONCURRENT_SPAN_MS, else as many as that span holds
 *    intervals, at most SL_AUTO_CONCURRENT_MAX.  A barrier reaches an
 *    instance only after the records queued ahead of it in its input
 *    rings: behind a busy keyed operator that is a full ring, about 85 ms
 *    at 1M keys (4 MiB of 16-byte tuples).  With one checkpoint in flight
 *    the next is triggered only once that trip and the write are over, so
 *    a 10 ms interval ran at about 12 checkpoints a second; with several,
 *    barriers n+1, n+2 travel behind n at the interval's pace while the
 *    writer makes n durable, in id order (note 8).  An interval of
 *    SL_AUTO_CONCURRENT_SPAN_MS or more keeps Flink's default of one, and
 *    a min_pause_ms (a pause after each checkpoint's end) implies one, as
 *    in Flink.  With several in flight, consecutive failures (note 7) are
 *    counted as they happen: n+1 may fail before n completes.
 * 13. Savepoints stay aligned, as in Flink (savepoint.c note 6).  A
 *    savepoint of a job with unaligned checkpoints holds the checkpointer
 *    (sl_checkpointer_hold_aligned) while it requests a checkpoint, waits
 *    for it and copies it: while any hold is on, no barrier is taken
 *    unaligned and no alignment times out (snapshot.c note 12, as while a
 *    stop is pending), so every checkpoint triggered after the hold began
 *    is aligned.  Periodic checkpoints go on meanwhile, aligned.
 * 14. Where the coordinator and the writer run (sl_checkpointer_start,
 *    helper_cpus).  When instance threads are pinned and the caller's
 *    CPU mask holds CPUs none of them is pinned to, both threads are
 *    confined to those CPUs; otherwise they keep the caller's mask, as
 *    before.  Left to the scheduler, the writer, woken by the
 *    coordinator, which an instance's ack woke, often ran on the CPU of
 *    that instance, right after its snapshot: on 2 CPUs, with the
 *    latency benchmark's job chained into one thread pinned to CPU 0,
 *    the writer took 1-1.5 ms of CPU per checkpoint of 10,000 keys and,
 *    sampled in the 2 ms after each snapshot, ran about half of the time
 *    on the chained thread's CPU, which ran a quarter of the time instead
 *    of three quarters (bench/README.md, latency_bench).  Every record
 *    due meanwhile waited.  The writer's and compaction's CPU time is
 *    then taken from CPUs no instance is pinned to.
 * 15. An instance answers checkpoints in increasing id order, within an
 *    attempt: a source snapshots the newest trigger it sees
 *    (sl_snapshot_source_poll), the others follow their channels'
 *    barriers, which each upstream emits in id order (take_ack asserts
 *    it, per instance, in last_answered).  A source busy
 *    inside one call (a slow operator chained to it, a broker that does
 *    not answer) thus sees triggers m and n > m together and answers n
 *    only; m can then complete no more.  While n may still complete, m is
 *    left alone: n's completion subsumes it (note 6), and m holding its
 *    slot is what stops the triggers until the sources answer the same
 *    one (two sources skipping alternately would otherwise never meet:
 *    ending m at once freed slots for ever newer triggers, and a Kafka
 *    job with its broker down completed no checkpoint).  Once n is gone
 *    without completing, nothing would end m before its deadline, so
 *    skip_unanswered ends it then, as subsumed: when an instance answers
 *    a checkpoint already aborted or fails its snapshot (take_ack), and
 *    when a checkpoint some instances acknowledged is aborted
 *    (abort_checkpoint), for the older ones they did not acknowledge.
 *    Before, had n and the next ones failed, m stayed in flight for the
 *    whole timeout (60 s by default): one slot fewer for the checkpoints
 *    behind it, a history showing it in progress, and at its deadline an
 *    abort counted as a failure toward tolerable_failures.  Subsumed, it
 *    does not count (note 7).
 * 16. Acks nudge the coordinator; it polls for them (wait.h, Polling).
 *    An ack's wake was a futex wake of the coordinator, parked on the
 *    other CPU, made by the instance's thread right after its snapshot:
 *    30-50 us of that thread's time on this project's 2-CPU VMs, twice a
 *    barrier in latency_bench's chained job (its source's ack woke the
 *    coordinator, which took it and parked again before the keyed
 *    instance's and the sink's came).  Every record due meanwhile
 *    waited.  So sl_checkpointer_ack only nudges (sl_parker_nudge), and
 *    while a checkpoint waits for acks (a slot is TRIGGERED) the
 *    coordinator sleeps with prepare_polling, for ACK_POLL_MIN_NS at
 *    first, doubling up to ACK_POLL_MAX_NS while nothing arrives, back to
 *    the minimum when an ack or a trigger came.  A checkpoint thus learns
 *    of its last ack up to one poll later (at most ACK_POLL_MAX_NS, and
 *    ACK_POLL_MIN_NS in a job whose acks come within it), and a
 *    checkpoint held up for seconds by alignment costs about 1,000
 *    wake-ups a second of the coordinator, on a CPU of its own where it
 *    has one (note 14).  With no checkpoint waiting for acks the
 *    coordinator parks as before and an ack (a final one) wakes it; the
 *    writer, a stop and a manual trigger always wake it.  latency_bench
 *    --only load, 4 runs alternated with the build before (2026-12-07),
 *    50% load with checkpoints, records due in the first millisecond
 *    after a barrier: p50 103, 29, 47 and 85 us before, 24, 12, 1.7 and
 *    20 us after; p99 at 80% load with checkpoints 309, 192, 876 and 266
 *    us before, 153, 221, 177 and 152 us after.
 *
 * States of a checkpoint slot (enum cp_state; the function making each
 * transition in brackets).  cp_edge lists exactly these edges; every
 * transition goes through cp_set_state, which asserts its edge, then
 * pending_check (the slot's invariants in its new state) and slots_check
 * (all slots together).
 *
 *            [new_pending: trigger, start_final]
 *   CP_FREE -----------------------------------> CP_TRIGGERED
 *    ^  ^                                          |      |
 *    |  | [abort_checkpoint: the deadline passed   |      | [hand_to_writer:
 *    |  |  (advance), a snapshot failed            |      |  advance, every
 *    |  |  (take_ack), an instance finished after  |      |  instance acked
 *    |  |  dropping n (advance), subsumed by a     |      |  or stands in;
 *    |  |  newer complete one (complete_checkpoint)|      |  start_final at
 *    |  |  or by the final one (start_final), an   |      |  once]
 *    |  |  instance answered a newer aborted one   |      |
 *    |  |  (take_ack, abort_checkpoint, note 15)]  |      |
 *    |  +------------------------------------------+      v
 *    |                                               CP_WRITING
 *    |                                                    |
 *    |                                                    | [advance: the
 *    |                                                    |  writer released
 *    | [complete_checkpoint: written, status 0;           v  `written`]
 *    |  abort_checkpoint: the write failed or         CP_DONE
 *    |  was cancelled (advance)]                          |
 *    +----------------------------------------------------+
 *
 * "Completed" and "aborted" are not states: they are what
 * complete_checkpoint and abort_checkpoint record in the history
 * (checkpoint_stats.c) as they free the slot, and what
 * sl_checkpointer_stop records for the slots still in flight when the
 * threads have stopped (finish_in_flight).  In CP_WRITING nothing
 * frees the slot: a deadline (advance) or a newer complete checkpoint
 * (complete_checkpoint) only sets abort_requested, and the writer ends
 * with ECANCELED (checkpoint_writer.c note 2).  A failed final checkpoint
 * stays CP_DONE and fails the job.  Teardown (sl_checkpointer_reset,
 * sl_checkpointer_free), with neither thread running, frees a slot from
 * any state.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checkpoint_internal.h"
#include "log.h"

uint64_t sl_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void wake_instances(sl_job *job) {
  for (int i = 0; i < job->instance_count; i++)
    sl_parker_wake(sl_instance_parker(job->instances[i]));
}

sl_store *sl_checkpointer_store(const sl_job *job) {
  return job && job->cp ? job->cp->store : 0;
}

void sl_checkpointer_hold_aligned(sl_job *job, bool hold) {
  assert(job->cp);
  /* Sequentially consistent, and before the savepoint's request
   * (sl_job_trigger_checkpoint's fetch_add, read by the coordinator before
   * it triggers): every barrier of a checkpoint requested after the hold
   * comes after it, so the instances' relaxed loads see it (note 13). */
  int before = atomic_fetch_add(&job->cp->aligned_holds, hold ? 1 : -1);
  assert(hold ? before >= 0 : before > 0);
  (void)before;
}

bool sl_checkpointer_aligned_held(const sl_job *job) {
  return job->cp && atomic_load_explicit(&job->cp->aligned_holds,
                                         memory_order_relaxed) != 0;
}

void sl_checkpointer_wake(sl_job *job) {
  if (job->cp)
    sl_parker_wake(&job->cp->coordinator_parker);
}

void sl_ack_free(sl_ack *ack) {
  if (!ack)
    return;
  if (ack->deltas != ack->inline_deltas)
    free(ack->deltas);
  if (ack->batches != ack->inline_batches)
    free(ack->batches); /* the instance's (checkpoint_writer.c note 3) */
  free(ack->blob);
  free(ack->channel_state); /* snapshot.c note 12 */
  free(ack);
}

void sl_checkpointer_ack(sl_job *job, sl_ack *ack) {
  sl_checkpointer *cp = job->cp;
  assert(cp);
  cds_wfcq_node_init(&ack->node);
  /* The enqueue is the hand-off: everything the instance wrote into the
   * ack (and the frozen deltas it points to) happens before the
   * coordinator's dequeue. */
  atomic_fetch_add_explicit(&cp->acks_published, 1, memory_order_release);
  cds_wfcq_enqueue(&cp->ack_head, &cp->ack_tail, &ack->node);
  sl_parker_nudge(&cp->coordinator_parker); /* note 16 */
}

/* ------------------------------------------------ the state machine */

/* The edges of the diagram above.  Teardown (sl_checkpointer_reset,
 * sl_checkpointer_free), with neither checkpointer thread running, may
 * also free a slot from any state. */
static __attribute__((unused))
const bool cp_edge[CP_STATE_COUNT][CP_STATE_COUNT] = {
    [CP_FREE][CP_TRIGGERED] = true,    /* new_pending */
    [CP_TRIGGERED][CP_WRITING] = true, /* hand_to_writer */
    [CP_TRIGGERED][CP_FREE] = true,    /* abort_checkpoint */
    [CP_WRITING][CP_DONE] = true,      /* advance: `written` released */
    [CP_DONE][CP_FREE] = true, /* complete_checkpoint, abort_checkpoint */
};

/* The acks p holds: each from its own instance, for p, not final; as many
 * as ack_count says.  O(instances). */
static __attribute__((unused)) bool
pending_acks_check(const sl_checkpointer *cp, const pending *p) {
  if (!p->acks) /* sl_checkpointer_alloc ran out of memory before it */
    return p->state == CP_FREE && p->ack_count == 0;
  int held = 0;
  for (int i = 0; i < cp->job->instance_count; i++) {
    const sl_ack *a = p->acks[i];
    if (!a)
      continue;
    held++;
    if (a->checkpoint_id != p->id || a->final ||
        a->inst != cp->job->instances[i])
      return false;
  }
  return held == p->ack_count;
}

/* Handed to the writer: every instance acknowledged p or stands in with
 * its final ack (note 3), which is what write_instance relies on. */
static __attribute__((unused)) bool
pending_covered(const sl_checkpointer *cp, const pending *p) {
  for (int i = 0; i < cp->job->instance_count; i++)
    if (!p->acks[i] && !cp->final_acks[i])
      return false;
  return true;
}

/* The invariants of slot p in its state (diagram above).  Reads only what
 * the coordinator owns, atomics, and (in CP_DONE, after the acquire of
 * `written`) the writer's results.  O(instances). */
static __attribute__((unused)) bool
pending_check(const sl_checkpointer *cp, const pending *p) {
  if (!pending_acks_check(cp, p))
    return false;
  int written = atomic_load_explicit(&p->written, memory_order_acquire);
  int abort_reason = atomic_load(&p->abort_requested);
  bool live = p->id >= 1 && p->id <= cp->last_id &&
              p->deadline_ns >= p->trigger_ns &&
              abort_reason >= ABORT_NONE && abort_reason <= ABORT_TIMEOUT;
  switch (p->state) {
  case CP_FREE:
    return p->ack_count == 0;
  case CP_TRIGGERED: /* nothing asks the writer to abort what it lacks */
    return live && written == 0 && abort_reason == ABORT_NONE &&
           (!p->final || p->ack_count == 0);
  case CP_WRITING:
    return live && pending_covered(cp, p);
  case CP_DONE: /* every failure says why (write_checkpoint) */
    return live && written == 1 && pending_covered(cp, p) &&
           (p->write_status == 0 || p->write_cause[0] != 0);
  }
  return false;
}

/* The slots together: ids of occupied slots distinct and issued, and no
 * more than max_concurrent in flight (the final one waits for an empty
 * pipeline, start_final).  O(slots^2 + slots * instances). */
static __attribute__((unused)) bool slots_check(const sl_checkpointer *cp) {
  unsigned in_flight = 0;
  for (unsigned s = 0; s <= SL_MAX_CONCURRENT; s++) {
    const pending *p = &cp->slots[s];
    if (!pending_check(cp, p))
      return false;
    if (p->state == CP_FREE)
      continue;
    in_flight += p->state == CP_TRIGGERED || p->state == CP_WRITING;
    for (unsigned t = s + 1; t <= SL_MAX_CONCURRENT; t++)
      if (cp->slots[t].state != CP_FREE && cp->slots[t].id == p->id)
        return false;
  }
  return in_flight <= cp->max_concurrent;
}

/* Every transition of a slot goes through here: a legal edge, then the
 * invariants of the new state and of all slots. */
static void cp_set_state(sl_checkpointer *cp, pending *p, enum cp_state to,
                         bool teardown) {
  assert(cp_edge[p->state][to] || (teardown && to == CP_FREE));
  p->state = to;
  assert(pending_check(cp, p));
  assert(slots_check(cp));
}

/* The slot becomes free, its acks freed.  teardown: see cp_edge. */
static void pending_clear(sl_checkpointer *cp, pending *p, bool teardown) {
  for (int i = 0; i < cp->job->instance_count; i++) {
    sl_ack_free(p->acks[i]);
    p->acks[i] = 0;
  }
  p->ack_count = 0;
  cp_set_state(cp, p, CP_FREE, teardown);
}

/* ------------------------------------------------- the coordinator */

static void fail_job(sl_checkpointer *cp, int status, const char *cause) {
  sl_job_fail(cp->job, status, "%s", cause);
}

/* Note 7: the highest id with nothing at or below it still in flight. */
static void update_settled(sl_checkpointer *cp) {
  uint64_t settled = cp->last_id;
  for (unsigned s = 0; s <= SL_MAX_CONCURRENT; s++) {
    const pending *q = &cp->slots[s];
    if ((q->state == CP_TRIGGERED || q->state == CP_WRITING) &&
        q->id - 1 < settled)
      settled = q->id - 1;
  }
  if (settled > atomic_load(&cp->job->cp_settled_id))
    atomic_store(&cp->job->cp_settled_id, settled);
}

static void skip_unanswered(sl_checkpointer *cp, int i, uint64_t answered);

static void abort_checkpoint(sl_checkpointer *cp, pending *p,
                             const char *cause, bool counts_as_failure) {
  sl_job *job = cp->job;
  /* Note 15: an instance that acknowledged p skipped the older ones it
   * did not acknowledge; with p gone, they cannot complete either. */
  if (p->state == CP_TRIGGERED)
    for (int i = 0; i < job->instance_count; i++)
      if (p->acks[i])
        skip_unanswered(cp, i, p->id);
  sl_log(counts_as_failure ? SL_LOG_WARN : SL_LOG_DEBUG,
         "sluice: checkpoint %" PRIu64 " aborted: %s", p->id, cause);
  sl_checkpoint_history_finish(cp, p, SL_CHECKPOINT_ABORTED, cause);
  pending_clear(cp, p, false);
  update_settled(cp);
  cp->last_end_ns = sl_now_ns();
  wake_instances(job);
  if (!counts_as_failure)
    return;
  if (++cp->consecutive_failures > cp->tolerable_failures) {
    char message[300];
    snprintf(message, sizeof message,
             "checkpoint %" PRIu64 " failed (%s); %" PRIu32
             " consecutive failures, %" PRIu32 " tolerated",
             p->id, cause, cp->consecutive_failures, cp->tolerable_failures);
    fail_job(cp, SL_ECHECKPOINT, message);
  }
}

static void complete_checkpoint(sl_checkpointer *cp, pending *p) {
  sl_job *job = cp->job;
  /* DESIGN.md invariant 5: only the writer's durable commit completes. */
  assert(p->state == CP_DONE);
  assert(p->write_status == 0);
  assert(p->id > atomic_load(&job->cp_completed_id));
  sl_checkpoint_history_finish(cp, p, SL_CHECKPOINT_COMPLETED, 0);
  /* The history entry just written says whether it was unaligned (the
   * tests that kill a run wait for one with channel state). */
  pthread_mutex_lock(&cp->history_lock);
  char channels[80] = "";
  if (cp->latest_completed.id == p->id && cp->latest_completed.unaligned)
    snprintf(channels, sizeof channels,
             ", unaligned: %" PRIu64 " bytes of channel state",
             cp->latest_completed.channel_bytes);
  pthread_mutex_unlock(&cp->history_lock);
  sl_log(SL_LOG_DEBUG, "sluice: checkpoint %" PRIu64 " complete%s in %.1f ms%s",
         p->id, p->final ? " (final)" : "",
         (double)(sl_now_ns() - p->trigger_ns) / 1e6, channels);
  cp->consecutive_failures = 0;
  cp->last_end_ns = sl_now_ns();
  uint64_t id = p->id;
  bool final = p->final;
  /* Completed before anything settles it (the aborts of older ones below
   * raise cp_settled_id too): a reader that sees n settled then sees it
   * complete if it was.  stop.c's wait took a completed stop checkpoint
   * for an aborted one, now and then, when the stores came the other way
   * (its older, subsumed checkpoint aborted first). */
  atomic_store(&job->cp_completed_id, id);
  pending_clear(cp, p, false);
  /* Note 6: older ones can never complete now. */
  for (unsigned s = 0; s <= SL_MAX_CONCURRENT; s++) {
    pending *q = &cp->slots[s];
    if (q->state == CP_TRIGGERED && q->id < id)
      abort_checkpoint(cp, q, "subsumed by a newer checkpoint", false);
    else if (q->state == CP_WRITING && q->id < id)
      atomic_store(&q->abort_requested, ABORT_SUBSUMED);
  }
  update_settled(cp);
  if (final)
    atomic_store(&job->cp_final_done, 1);
  wake_instances(job);
}

static void hand_to_writer(sl_checkpointer *cp, pending *p) {
  atomic_store(&p->written, 0);
  cp_set_state(cp, p, CP_WRITING, false); /* before the writer sees it */
  pthread_mutex_lock(&cp->write_lock);
  assert(cp->write_queue_count <= (int)SL_MAX_CONCURRENT);
  cp->write_queue[cp->write_queue_count++] = p;
  pthread_mutex_unlock(&cp->write_lock);
  atomic_store(&cp->compaction_cancel, 1);
  sl_parker_wake(&cp->writer_parker);
}

static pending *find_pending(sl_checkpointer *cp, uint64_t id) {
  for (unsigned s = 0; s <= SL_MAX_CONCURRENT; s++)
    if (cp->slots[s].state != CP_FREE && cp->slots[s].id == id)
      return &cp->slots[s];
  return 0;
}

static int in_flight(const sl_checkpointer *cp) {
  int n = 0;
  for (unsigned s = 0; s <= SL_MAX_CONCURRENT; s++)
    n += cp->slots[s].state == CP_TRIGGERED || cp->slots[s].state == CP_WRITING;
  return n;
}

static pending *new_pending(sl_checkpointer *cp, bool final) {
  for (unsigned s = 0; s <= SL_MAX_CONCURRENT; s++) {
    pending *p = &cp->slots[s];
    if (p->state != CP_FREE)
      continue;
    p->id = ++cp->last_id;
    p->final = final;
    p->trigger_ns = sl_now_ns();
    p->trigger_time_ms = sl_wall_ms();
    p->deadline_ns = p->trigger_ns + cp->timeout_ns;
    p->ack_count = 0;
    atomic_store(&p->abort_requested, ABORT_NONE);
    atomic_store(&p->written, 0); /* the slot's last use left it 1 */
    p->write_us = 0;
    p->write_cause[0] = 0;
    for (int i = 0; i < cp->job->instance_count; i++)
      p->async_us[i] = p->bytes[i] = p->entries[i] = 0;
    p->history_slot = sl_checkpoint_history_add(cp, p->id, final);
    cp_set_state(cp, p, CP_TRIGGERED, false);
    return p;
  }
  return 0;
}

static void trigger(sl_checkpointer *cp) {
  sl_job *job = cp->job;
  pending *p = new_pending(cp, false);
  assert(p);
  for (int i = 0; i < job->instance_count; i++) {
    sl_instance *inst = job->instances[i];
    if (inst->op->kind != SL_OP_SOURCE)
      continue;
    /* Release: pairs with the source's acquire of trigger_id. */
    atomic_store_explicit(&inst->cp.trigger_id, p->id, memory_order_release);
    sl_parker_wake(sl_instance_parker(inst));
  }
}

static int instance_slot(const sl_job *job, const sl_instance *inst) {
  for (int i = 0; i < job->instance_count; i++)
    if (job->instances[i] == inst)
      return i;
  assert(!"ack from an unknown instance");
  return -1;
}

/* Notes 3, 4: the counts of finished instances agree with the final
 * acks held. */
static __attribute__((unused)) bool finished_check(const sl_checkpointer *cp) {
  int finals = 0, sources = 0, finished_sources = 0;
  for (int i = 0; i < cp->job->instance_count; i++) {
    bool source = cp->job->instances[i]->op->kind == SL_OP_SOURCE;
    const sl_ack *f = cp->final_acks[i];
    sources += source;
    if (!f)
      continue;
    if (!f->final || f->inst != cp->job->instances[i])
      return false;
    finals++;
    finished_sources += source;
  }
  return finals == cp->final_count && sources == cp->source_count &&
         finished_sources == cp->sources_finished;
}

/* Note 15: instance i answered checkpoint `answered`; the checkpoints
 * below it that i has not acknowledged are aborted as subsumed. */
static void skip_unanswered(sl_checkpointer *cp, int i, uint64_t answered) {
  for (unsigned s = 0; s <= SL_MAX_CONCURRENT; s++) {
    pending *p = &cp->slots[s];
    if (p->state != CP_TRIGGERED || p->id >= answered || p->acks[i])
      continue;
    const sl_instance *inst = cp->job->instances[i];
    char cause[300]; /* the history keeps what fits */
    snprintf(cause, sizeof cause,
             "subsumed: operator '%s' instance %d answered checkpoint "
             "%" PRIu64 " first",
             inst->op->name, inst->index, answered);
    abort_checkpoint(cp, p, cause, false);
  }
}

static void take_ack(sl_checkpointer *cp, sl_ack *a) {
  sl_job *job = cp->job;
  int i = instance_slot(job, a->inst);
  if (!a->final) { /* note 15: an answer for a checkpoint already gone */
    assert(a->checkpoint_id > cp->last_answered[i]); /* the order it needs */
    cp->last_answered[i] = a->checkpoint_id;
    const pending *n = find_pending(cp, a->checkpoint_id);
    if (a->status || !n || n->state != CP_TRIGGERED)
      skip_unanswered(cp, i, a->checkpoint_id);
  }
  if (a->status) {
    pending *p = a->final ? 0 : find_pending(cp, a->checkpoint_id);
    char message[300];
    snprintf(message, sizeof message,
             "the snapshot of operator '%s' instance %d failed: %s",
             a->inst->op->name, a->inst->index, a->cause);
    if (p && p->state == CP_TRIGGERED)
      abort_checkpoint(cp, p, message, true);
    else if (a->final)
      fail_job(cp, SL_ECALLBACK, message);
    sl_ack_free(a);
    return;
  }
  pending *of = find_pending(cp, a->checkpoint_id);
  if (of && a->barrier_ns > of->trigger_ns)
    a->start_delay_us = (a->barrier_ns - of->trigger_ns) / 1000u;
  if (a->final) {
    assert(!cp->final_acks[i]);
    cp->final_acks[i] = a;
    cp->final_count++;
    cp->sources_finished += a->inst->op->kind == SL_OP_SOURCE;
    assert(finished_check(cp));
    return;
  }
  pending *p = find_pending(cp, a->checkpoint_id);
  if (!p || p->state != CP_TRIGGERED || p->acks[i]) {
    sl_ack_free(a); /* for an aborted checkpoint */
    return;
  }
  p->acks[i] = a;
  p->ack_count++;
}

/* 1: every instance acknowledged p or stands in with its final snapshot
 * (note 3); 0: some have yet to; -1: p can never complete (an instance
 * finished after dropping p's barrier). */
static int all_acked(const sl_checkpointer *cp, const pending *p) {
  int result = 1;
  for (int i = 0; i < cp->job->instance_count; i++) {
    assert(!p->acks[i] ||
           (p->acks[i]->checkpoint_id == p->id && !p->acks[i]->final));
    if (p->acks[i])
      continue;
    const sl_ack *f = cp->final_acks[i];
    if (!f)
      result = 0;
    else if (f->max_seen_id >= p->id)
      return -1;
  }
  return result;
}

/* The in-flight slot with the lowest id above `after`, or NULL. */
static pending *next_by_id(sl_checkpointer *cp, uint64_t after) {
  pending *best = 0;
  for (unsigned s = 0; s <= SL_MAX_CONCURRENT; s++) {
    pending *p = &cp->slots[s];
    if (p->state != CP_FREE && p->id > after && (!best || p->id < best->id))
      best = p;
  }
  return best;
}

/* One pass over the in-flight checkpoints, in id order (note 8).  Returns
 * the nearest deadline. */
static uint64_t advance(sl_checkpointer *cp, uint64_t now) {
  uint64_t next = UINT64_MAX;
  uint64_t after = 0;
  for (pending *p; (p = next_by_id(cp, after));) {
    after = p->id;
    if (p->state == CP_WRITING &&
        atomic_load_explicit(&p->written, memory_order_acquire)) {
      cp_set_state(cp, p, CP_DONE, false);
      if (p->write_status == 0) {
        complete_checkpoint(cp, p);
      } else if (p->final) {
        sl_checkpoint_history_finish(cp, p, SL_CHECKPOINT_ABORTED,
                                     p->write_cause);
        fail_job(cp, p->write_status == ECANCELED ? SL_ESTOPPED : SL_ECHECKPOINT,
                 p->write_cause);
      } else {
        bool counts = p->write_status != ECANCELED ||
                      atomic_load(&p->abort_requested) == ABORT_TIMEOUT;
        abort_checkpoint(cp, p, p->write_cause, counts);
      }
      continue;
    }
    if (p->state == CP_TRIGGERED) {
      int acked = all_acked(cp, p);
      if (acked > 0) {
        hand_to_writer(cp, p);
      } else if (acked < 0) {
        abort_checkpoint(cp, p, "an instance finished after dropping its "
                         "barrier", false);
        continue;
      }
    }
    if ((p->state == CP_TRIGGERED || p->state == CP_WRITING) && !p->final) {
      if (now >= p->deadline_ns) {
        if (p->state == CP_TRIGGERED)
          abort_checkpoint(cp, p, "timed out before every instance acknowledged", true);
        else { /* a subsumed one stays subsumed (not a failure) */
          int none = ABORT_NONE;
          atomic_compare_exchange_strong(&p->abort_requested, &none,
                                         ABORT_TIMEOUT);
        }
      } else if (p->deadline_ns < next) {
        next = p->deadline_ns;
      }
    }
  }
  return next;
}

/* A checkpoint the writer finished that advance() has not seen yet. */
static bool written_pending(sl_checkpointer *cp) {
  for (unsigned s = 0; s <= SL_MAX_CONCURRENT; s++)
    if (cp->slots[s].state == CP_WRITING &&
        atomic_load_explicit(&cp->slots[s].written, memory_order_acquire))
      return true;
  return false;
}

/* Note 9: every instance is final. */
static void start_final(sl_checkpointer *cp) {
  for (unsigned s = 0; s <= SL_MAX_CONCURRENT; s++) {
    pending *p = &cp->slots[s];
    if (p->state == CP_TRIGGERED)
      abort_checkpoint(cp, p, "subsumed by the final checkpoint", false);
  }
  if (in_flight(cp) > 0)
    return; /* let the writer finish first; called again */
  pending *p = new_pending(cp, true);
  assert(p);
  cp->final_started = true;
  atomic_store(&cp->no_compaction, 1); /* the job is about to end */
  hand_to_writer(cp, p);
}

/* A new checkpoint may start: the job runs, a source still runs (note
 * 4: finished ones stand in), the final checkpoint has not begun, and
 * fewer than max_concurrent are in flight. */
static bool can_trigger(sl_checkpointer *cp) {
  assert(cp->sources_finished <= cp->source_count);
  return !atomic_load(&cp->job->stopping) && !cp->final_started &&
         cp->sources_finished < cp->source_count &&
         (uint32_t)in_flight(cp) < cp->max_concurrent;
}

/* Note 16: the coordinator's sleeps while acks are awaited. */
#define ACK_POLL_MIN_NS 100000u  /* 100 us */
#define ACK_POLL_MAX_NS 1000000u /* 1 ms */

/* Whether a checkpoint waits for acks (note 16). */
static bool awaiting_acks(const sl_checkpointer *cp) {
  for (unsigned s = 0; s <= SL_MAX_CONCURRENT; s++)
    if (cp->slots[s].state == CP_TRIGGERED)
      return true;
  return false;
}

static void *coordinator_main(void *arg) {
  sl_checkpointer *cp = arg;
  sl_job *job = cp->job;
  pthread_setname_np(pthread_self(), "sl:coordinator");
  cp->next_trigger_ns = sl_now_ns() + cp->interval_ns;
  uint64_t poll_ns = ACK_POLL_MIN_NS; /* note 16 */
  while (!atomic_load(&cp->shutdown)) {
    struct cds_wfcq_node *node;
    while ((node = __cds_wfcq_dequeue_blocking(&cp->ack_head, &cp->ack_tail))) {
      (void)atomic_load_explicit(&cp->acks_published, memory_order_acquire);
      take_ack(cp, caa_container_of(node, sl_ack, node));
      poll_ns = ACK_POLL_MIN_NS;
    }
    uint64_t now = sl_now_ns();
    uint64_t wake_at = advance(cp, now);
    bool stopping = atomic_load(&job->stopping);
    if (!stopping && !cp->final_started &&
        cp->final_count == job->instance_count)
      start_final(cp);
    uint64_t requested = atomic_load(&cp->manual_requested);
    bool manual = requested > atomic_load(&cp->manual_served);
    /* Note 11: while a stop is pending only requested ones start. */
    bool periodic = !atomic_load(&job->stop_request);
    if (can_trigger(cp) &&
        (manual || (periodic && now >= cp->next_trigger_ns &&
                    now >= cp->last_end_ns + cp->min_pause_ns))) {
      trigger(cp);
      /* Serves every request made before it (requested was read first). */
      atomic_store(&cp->manual_served_id, cp->last_id);
      atomic_store(&cp->manual_served, requested);
      update_settled(cp);
      cp->next_trigger_ns = now + cp->interval_ns;
      poll_ns = ACK_POLL_MIN_NS;
      continue;
    }
    /* Sleep until the next trigger may happen or a deadline passes; with
     * max_concurrent in flight (or the end reached) only an ack, the
     * writer or a deadline can change anything, and they wake us. */
    uint64_t at = UINT64_MAX;
    if (can_trigger(cp) && periodic) {
      at = cp->next_trigger_ns;
      if (cp->last_end_ns + cp->min_pause_ns > at)
        at = cp->last_end_ns + cp->min_pause_ns;
    }
    if (wake_at < at)
      at = wake_at;
    if (at == UINT64_MAX) /* nothing timed: wake up now and then anyway */
      at = sl_now_ns() + 100000000u;
    /* Note 16: acks only nudge; look for them every poll_ns. */
    bool polling = awaiting_acks(cp);
    if (polling) {
      uint64_t look = sl_now_ns() + poll_ns;
      if (look < at)
        at = look;
      poll_ns = poll_ns < ACK_POLL_MAX_NS / 2 ? 2 * poll_ns : ACK_POLL_MAX_NS;
    }
    /* Re-check, after announcing the sleep, everything whose producer
     * wakes (or nudges) us (wait.h): acks, the writer's results, a
     * shutdown, a manual trigger.  A wake that came before the
     * announcement is not lost. */
    if (polling)
      sl_parker_prepare_polling(&cp->coordinator_parker);
    else
      sl_parker_prepare(&cp->coordinator_parker);
    if (!cds_wfcq_empty(&cp->ack_head, &cp->ack_tail) || written_pending(cp) ||
        atomic_load(&cp->shutdown) ||
        (can_trigger(cp) && /* else a request waits for a free slot */
         atomic_load(&cp->manual_requested) > atomic_load(&cp->manual_served))) {
      sl_parker_cancel(&cp->coordinator_parker);
      continue;
    }
    now = sl_now_ns();
    if (at > now)
      sl_parker_sleep_ns(&cp->coordinator_parker, at - now);
    else
      sl_parker_cancel(&cp->coordinator_parker);
  }
  return 0;
}

SL_EXPORT int sl_job_trigger_checkpoint(sl_job *job, uint64_t *id) {
  if (!job)
    return EINVAL;
  if (!job->config.checkpoint.state_dir)
    return SL_EUSAGE;
  if (job->state != SL_JOB_RUNNING || !job->cp)
    return SL_ENOTSTARTED;
  sl_checkpointer *cp = job->cp;
  uint64_t ticket = atomic_fetch_add(&cp->manual_requested, 1) + 1;
  sl_parker_wake(&cp->coordinator_parker);
  /* Wait (1 s by the clock) for a trigger that started after this
   * request, so its id can be returned.  Bounded by time, not by a count
   * of sleeps: a 10 us nanosleep takes 60-100 us here (timer slack), so
   * 100,000 of them, meant as 1 s, were 6-11 s.  The sleeps double from
   * 10 us to 1 ms: an answer seldom waits more than its own time again. */
  const uint64_t deadline = sl_now_ns() + 1000000000ull;
  for (long nap_ns = 10000;; nap_ns = nap_ns < 1000000 ? 2 * nap_ns : nap_ns) {
    if (atomic_load(&cp->manual_served) >= ticket) {
      if (id)
        *id = atomic_load(&cp->manual_served_id);
      return 0;
    }
    if (sl_now_ns() >= deadline)
      break;
    struct timespec t = {0, nap_ns};
    nanosleep(&t, 0);
  }
  /* Withdraw the request if no later one came, so it does not fire when a
   * slot frees up (a later caller's request would serve it anyway). */
  uint64_t expected = ticket;
  atomic_compare_exchange_strong(&cp->manual_requested, &expected,
                                 ticket - 1);
  return EBUSY; /* max_concurrent in flight, or the job is ending */
}

/* ------------------------------------------------- lifecycle */

/* Note 12: the automatic max_concurrent. */
#define SL_AUTO_CONCURRENT_SPAN_MS 100u
#define SL_AUTO_CONCURRENT_MAX 4u
_Static_assert(SL_AUTO_CONCURRENT_MAX <= SL_MAX_CONCURRENT,
               "the automatic limit is a limit the slots can hold");

static uint32_t auto_max_concurrent(uint32_t interval_ms,
                                    uint32_t min_pause_ms) {
  assert(interval_ms > 0);
  if (min_pause_ms > 0 || interval_ms >= SL_AUTO_CONCURRENT_SPAN_MS)
    return 1;
  uint32_t n = (SL_AUTO_CONCURRENT_SPAN_MS + interval_ms - 1) / interval_ms;
  assert(n >= 2);
  return n < SL_AUTO_CONCURRENT_MAX ? n : SL_AUTO_CONCURRENT_MAX;
}

/* The checkpointer of job, its slots, history and per-instance arrays;
 * no thread started.  ENOMEM leaves what was allocated for
 * sl_checkpointer_free. */
int sl_checkpointer_alloc(sl_job *job) {
  sl_checkpointer *cp = calloc(1, sizeof *cp);
  if (!cp)
    return ENOMEM;
  job->cp = cp;
  cp->job = job;
  const struct sl_checkpoint_config *c = &job->config.checkpoint;
  uint32_t interval_ms = c->interval_ms ? c->interval_ms : SL_DEFAULT_INTERVAL_MS;
  cp->interval_ns = (uint64_t)interval_ms * 1000000u;
  cp->timeout_ns = (uint64_t)(c->timeout_ms ? c->timeout_ms : SL_DEFAULT_TIMEOUT_MS) * 1000000u;
  cp->min_pause_ns = (uint64_t)c->min_pause_ms * 1000000u;
  cp->max_concurrent = c->max_concurrent
                           ? c->max_concurrent
                           : auto_max_concurrent(interval_ms, c->min_pause_ms);
  cp->tolerable_failures = c->tolerable_failures;
  sl_parker_init(&cp->coordinator_parker);
  sl_parker_init(&cp->writer_parker);
  __cds_wfcq_init(&cp->ack_head, &cp->ack_tail);
  pthread_mutex_init(&cp->write_lock, 0);
  pthread_mutex_init(&cp->history_lock, 0);
  size_t n = (size_t)job->instance_count;
  for (int i = 0; i < job->instance_count; i++)
    cp->source_count += job->instances[i]->op->kind == SL_OP_SOURCE;
  cp->final_acks = calloc(n, sizeof *cp->final_acks);
  cp->last_answered = calloc(n, sizeof *cp->last_answered);
  cp->durable_epoch = calloc(n, sizeof *cp->durable_epoch);
  cp->durable_row_seq = calloc(n, sizeof *cp->durable_row_seq);
  cp->group_ends = calloc(2 * (size_t)job->config.max_parallelism,
                           sizeof *cp->group_ends);
  if (!cp->final_acks || !cp->last_answered || !cp->durable_epoch || !cp->durable_row_seq ||
      !cp->group_ends)
    return ENOMEM;
  for (unsigned s = 0; s <= SL_MAX_CONCURRENT; s++) {
    pending *p = &cp->slots[s];
    p->acks = calloc(n, sizeof *p->acks);
    p->async_us = calloc(n, sizeof(uint64_t));
    p->bytes = calloc(n, sizeof(uint64_t));
    p->entries = calloc(n, sizeof(uint64_t));
    if (!p->acks || !p->async_us || !p->bytes || !p->entries)
      return ENOMEM;
  }
  for (int h = 0; h < SL_CHECKPOINT_HISTORY; h++) {
    cp->history_instances[h] = calloc(n, sizeof(sl_checkpoint_instance_stats));
    if (!cp->history_instances[h])
      return ENOMEM;
  }
  return 0;
}

/* With neither checkpointer thread running: the history of every
 * checkpoint still in flight is finished.  One the writer made durable
 * before it stopped completed; any other can never complete in this
 * attempt.  only_open (at a stop): an entry that ended already keeps its
 * cause; a restart's reset then finds them ended and counts none twice.
 * Without this, a job that fails for good, or is stopped, with
 * checkpoints in flight would report them in progress for ever. */
static void finish_in_flight(sl_checkpointer *cp, bool only_open) {
  const char *why = atomic_load(&cp->job->failed) || !only_open
                        ? "the job failed"
                        : "the job stopped";
  for (unsigned s = 0; s <= SL_MAX_CONCURRENT; s++) {
    pending *p = &cp->slots[s];
    if (p->state == CP_FREE)
      continue;
    uint64_t latest = sl_store_latest(cp->store); /* open while in flight */
    bool durable = p->id <= latest && p->state != CP_TRIGGERED;
    int status = durable ? SL_CHECKPOINT_COMPLETED : SL_CHECKPOINT_ABORTED;
    const char *cause = durable ? 0 : why;
    if (only_open)
      sl_checkpoint_history_finish_open(cp, p, status, cause);
    else
      sl_checkpoint_history_finish(cp, p, status, cause);
  }
}

/* After sl_checkpointer_stop(), before a restart: every checkpoint in
 * flight is given up (the one being written was finished by the writer
 * before it stopped: it is durable or not), and everything the attempt
 * left behind is cleared.  The store, the history and the id counter
 * stay. */
void sl_checkpointer_reset(sl_job *job) {
  sl_checkpointer *cp = job->cp;
  if (!cp)
    return;
  assert(!cp->coordinator_started && !cp->writer_started);
  finish_in_flight(cp, false);
  for (unsigned s = 0; s <= SL_MAX_CONCURRENT; s++) {
    pending *p = &cp->slots[s];
    if (p->state != CP_FREE)
      pending_clear(cp, p, true); /* neither thread runs */
  }
  cp->write_queue_count = 0;
  for (int i = 0; i < job->instance_count; i++) {
    sl_ack_free(cp->final_acks[i]);
    cp->final_acks[i] = 0;
    cp->last_answered[i] = 0;
    cp->durable_epoch[i] = 0; /* the maps are made anew */
    cp->durable_row_seq[i] = 0; /* and the row batches */
  }
  cp->final_count = 0;
  cp->final_started = false;
  cp->sources_finished = 0;
  cp->consecutive_failures = 0;
  cp->last_end_ns = 0;
  atomic_store(&cp->shutdown, 0);
  atomic_store(&cp->compaction_cancel, 0);
  atomic_store(&cp->no_compaction, 0);
  /* The parkers are left as they are: a waker (sl_job_trigger_checkpoint)
   * may touch them at any time, and a stale wake only makes the first
   * sleep return at once. */
}

/* Note 14: the CPUs of the caller's mask that no instance thread is
 * pinned to, into *set.  False when no instance is pinned, when every
 * CPU of the mask has one, or when the mask cannot be read: the helper
 * threads then keep the caller's mask. */
static bool helper_cpus(const sl_job *job, cpu_set_t *set) {
  if (sched_getaffinity(0, sizeof *set, set) != 0)
    return false;
  int before = CPU_COUNT(set);
  for (int i = 0; i < job->instance_count; i++) {
    int cpu = job->instances[i]->cpu;
    if (cpu >= 0 && cpu < CPU_SETSIZE)
      CPU_CLR(cpu, set);
  }
  int after = CPU_COUNT(set);
  assert(after <= before);
  return after > 0 && after < before;
}

int sl_checkpointer_start(sl_job *job) {
  sl_checkpointer *cp = job->cp;
  if (!cp)
    return 0;
  pthread_attr_t attr;
  int rc = pthread_attr_init(&attr);
  if (rc)
    return rc;
  cpu_set_t set;
  if (helper_cpus(job, &set))
    rc = pthread_attr_setaffinity_np(&attr, sizeof set, &set);
  if (rc == 0)
    rc = pthread_create(&cp->writer, &attr, sl_checkpoint_writer_main, cp);
  cp->writer_started = rc == 0;
  if (rc == 0)
    rc = pthread_create(&cp->coordinator, &attr, coordinator_main, cp);
  cp->coordinator_started = rc == 0;
  pthread_attr_destroy(&attr);
  return rc;
}

void sl_checkpointer_stop(sl_job *job) {
  sl_checkpointer *cp = job->cp;
  if (!cp)
    return;
  atomic_store(&cp->shutdown, 1);
  /* checkpoint_writer.c note 5: after a failure, a compaction's step is
   * given up, not finished and committed. */
  atomic_store(&cp->compaction_cancel, atomic_load(&job->failed)
                                           ? SL_STORE_CANCEL_ABANDON
                                           : 1);
  sl_parker_wake(&cp->coordinator_parker);
  sl_parker_wake(&cp->writer_parker);
  if (cp->coordinator_started)
    pthread_join(cp->coordinator, 0);
  if (cp->writer_started)
    pthread_join(cp->writer, 0);
  cp->coordinator_started = cp->writer_started = false;
  finish_in_flight(cp, true);
  /* Acks still queued (e.g. after a stop) are freed. */
  struct cds_wfcq_node *node;
  while ((node = __cds_wfcq_dequeue_blocking(&cp->ack_head, &cp->ack_tail)))
    sl_ack_free(caa_container_of(node, sl_ack, node));
}

void sl_checkpointer_free(sl_job *job) {
  sl_checkpointer *cp = job->cp;
  if (!cp)
    return;
  sl_checkpointer_stop(job);
  /* Every slot freed first: cp_set_state checks all slots, so none may
   * lose its arrays while another is being cleared. */
  for (unsigned s = 0; s <= SL_MAX_CONCURRENT; s++)
    if (cp->slots[s].acks)
      pending_clear(cp, &cp->slots[s], true); /* stopped above */
  for (unsigned s = 0; s <= SL_MAX_CONCURRENT; s++) {
    pending *p = &cp->slots[s];
    free(p->acks);
    free(p->async_us);
    free(p->bytes);
    free(p->entries);
  }
  for (int i = 0; cp->final_acks && i < job->instance_count; i++)
    sl_ack_free(cp->final_acks[i]);
  free(cp->final_acks);
  free(cp->last_answered);
  free(cp->durable_epoch);
  free(cp->durable_row_seq);
  free(cp->sort_a);
  free(cp->sort_b);
  free(cp->group_ends);
  free(cp->row_order);
  for (int h = 0; h < SL_CHECKPOINT_HISTORY; h++)
    free(cp->history_instances[h]);
  sl_store_close(cp->store);
  pthread_mutex_destroy(&cp->write_lock);
  pthread_mutex_destroy(&cp->history_lock);
  free(cp);
  job->cp = 0;
}
