/* barrier.pml — the barrier protocol of sluice, model-checked with Spin.
 *
 * NOTES ON THE DESIGN OF THE MODEL
 *
 * 1. The job: two sources S0, S1 (instances 0, 1) -> ring 0, ring 1 -> one
 *    instance D (instance 2) -> ring 2, ring 3 -> one sink K (instance 3)
 *    reading both.  D keys its output: record r goes to ring 2 + r % 2.
 *    (Two one-input sinks instead of K multiplied the state space by 7
 *    and checked nothing K does not: K is a two-input instance too.)
 *    Rings are bounded (CAP_IN, CAP_OUT entries) single-producer
 *    single-consumer queues with free-running positions (engine/ring.h
 *    notes 1, 2) and the announcement side array of docs/checkpoints.md
 *    "Unaligned checkpoints" (NSLOT slots, slot = id % NSLOT).  An entry
 *    is one byte: a record 1..2*RECS (r = s*RECS+k is record k of source
 *    s), BAR(n), or END.  PAD and the byte layout are left out; WATERMARK
 *    and IDLE would be captured like records.  A producer publishes each
 *    entry as it writes it (batching only delays publication).
 * 2. An operator's state is the set of records it processed, one bit per
 *    record.  In the exactly-once modes adding a bit that is already set is
 *    an assertion failure at once: a record counted twice in one lineage
 *    of state.  A snapshot n holds the frozen set (sst) and per input
 *    channel the channel state (sch); sources snapshot their position
 *    (spos).  These globals stand for what the writer puts in LMDB.
 * 3. The coordinator (engine/coordinator.c) triggers ids 1..NCP, at most
 *    MAXC in flight, completes a checkpoint when every instance acked it
 *    or stands in with its final ack (coordinator.c note 3), aborts older
 *    ones as subsumed, may abort any in flight by "timeout" (at most
 *    TIMEOUTS times: the nondeterministic stand-in for timeouts and failed
 *    snapshots), and writes the final checkpoint when every instance is
 *    final.  Writing is one atomic step: the durable commit.
 * 4. A failover (engine/failover.c) may happen at any step before the final
 *    checkpoint starts, at most CRASHES times: every instance drops what it
 *    was doing (the `unless { crashed }` escapes), the rings are emptied,
 *    in-flight checkpoints are aborted, and every instance restores the
 *    newest complete checkpoint: state, then the channel state replayed
 *    through the operator (D emits it again), sources at their positions.
 * 5. Modes (-DMODE=): 0 aligned, 1 unaligned, 2 aligned with a timeout
 *    (the timeout is a nondeterministic choice while aligning), 3
 *    at-least-once.  Sources announce barriers in mode 1 only; in mode 2 an
 *    instance announces the barriers of checkpoints it switched.
 * 6. What is checked, where:
 *    - snapshot contents, in check_snapshot() when a checkpoint completes:
 *      for each input c of D, D's state restricted to source c and D's
 *      channel state (c, n) are disjoint and together exactly the records
 *      source c wrote before its barrier n (at-least-once: the state holds
 *      at least those); for each sink, state and channel state are
 *      disjoint and together exactly D's snapshot state routed to it;
 *    - exactly-once output: the dup assertions (note 2) and, at the final
 *      checkpoint, every sink holds every record routed to it;
 *    - no deadlock: Spin's invalid end states (every process must reach
 *      its end after the final checkpoint);
 *    - every triggered checkpoint completes or aborts, and one that both
 *      sources snapshotted completes unless a timeout, a failover or a
 *      newer complete checkpoint ends it: check_fates() at the final
 *      checkpoint, with the absence of cycles (run.sh, `pan -l`) showing
 *      that every execution reaches that end.
 * 7. Mutants (-DMUT_*, run.sh --mutants) each break one rule of the
 *    protocol; each must make Spin report an error.
 *
 * Comments name the C function that does each step (engine/snapshot.c
 * sl_snapshot_announced, sl_snapshot_unaligned, capture_entry,
 * copy_overtaken, maybe_ack_unaligned; engine/ring.h
 * sl_ring_announce_producer, sl_ring_announced_consumer; engine/restore.c
 * sl_restore_channel_state, engine/runtime.c replay_channel_state).
 */

#ifndef MODE
#define MODE 1
#endif
#define M_ALIGNED 0
#define M_UNALIGNED 1
#define M_TIMEOUT 2
#define M_ALO 3
#define EXACTLY_ONCE (MODE != M_ALO)

#ifndef RECS
#define RECS 3 /* records per source; at most 4 (a byte of bits) */
#endif
#ifndef NCP
#define NCP 2 /* checkpoint ids 1..NCP over the whole run */
#endif
#ifndef MAXC
#define MAXC 2 /* max_concurrent */
#endif
#ifndef CAP_IN
#define CAP_IN 2 /* capacity of rings 0, 1 (sources -> D), in entries */
#endif
#ifndef CAP_OUT
#define CAP_OUT 1 /* capacity of rings 2, 3 (D -> K) */
#endif
#if CAP_IN > CAP_OUT
#define CAP CAP_IN
#else
#define CAP CAP_OUT
#endif
#define CAPR(r) ((r) < 2 -> CAP_IN : CAP_OUT)
#ifndef CRASHES
#define CRASHES 1
#endif
#ifndef TIMEOUTS
#define TIMEOUTS 1
#endif
#define NSLOT (MAXC + 1) /* announcement slots per ring */
#define NINST 4
#define ALLI 15 /* every instance */
#define D_INST 2
#define K_INST 3

/* entries (note 1) */
#define BAR(n) (64 + (n))
#define END_E 128
#define IS_REC(e) ((e) >= 1 && (e) <= 2 * RECS)
#define IS_BAR(e) ((e) > 64 && (e) < 128)
#define BAR_ID(e) ((e) - 64)
#define BIT(r) (1 << ((r) - 1))
#define ALLREC ((1 << (2 * RECS)) - 1)
#define PREFIX(s, p) (((1 << (p)) - 1) << ((s) * RECS))
#define SRCMASK(s) PREFIX(s, RECS)
#define ROUTE(j) ((j) == 0 -> (170 & ALLREC) : (85 & ALLREC))
#define OUT_RING(r) (2 + (r) % 2)

/* checkpoint states (coordinator.c enum cp_state, CP_WRITING and CP_DONE
 * folded into the one commit step) and fates (how each ended) */
#define CP_NONE 0
#define CP_TRIG 1
#define CP_COMPLETE 2
#define CP_ABORTED 3
#define F_NONE 0
#define F_COMPLETE 1
#define F_SUBSUMED 2  /* by a newer complete checkpoint */
#define F_TIMEOUT 3   /* the nondeterministic timeout */
#define F_CRASH 4     /* given up by a failover */
#define F_DROPPED 5   /* an instance finished after dropping it */
#define F_FINAL 6     /* subsumed by the final checkpoint */

/* capture states of (channel, id) */
#define CAP_NONE 0
#define CAP_LOG 1
#define CAP_DONE 2

typedef Ring {
  byte buf[CAP];
  byte head; /* consumer position (sl_ring consumer_position) */
  byte tail; /* producer position, published */
  byte ann_id[NSLOT];
  byte ann_pos[NSLOT];
};
Ring ring[4];

/* the coordinator */
byte cp[NCP + 1];
byte fate[NCP + 1];
byte acks[NCP + 1];   /* instances that acked, a bit each */
byte last_id, completed, settled, trigger_id;
byte finals;          /* instances holding a final ack */
byte msf[NINST];      /* max_seen_id of each final ack */
bit final_started, final_done;
byte timeouts;
byte first_id = 1; /* the first id of the current attempt (check_fates) */

/* the store (note 2); index helpers */
#define SPI(s, k) ((s) * (NCP + 1) + (k))
#define SSTI(i, k) (((i) - 2) * (NCP + 1) + (k))
#define SCHI(i, c, k) ((((i) - 2) * 2 + (c)) * (NCP + 1) + (k))
#define CAPI(c, k) ((c) * (NCP + 1) + (k))
byte spos[2 * (NCP + 1)];
byte sst[2 * (NCP + 1)];
byte sch[4 * (NCP + 1)];
byte fstate[NINST];    /* final states of D and K */
byte snapped[NCP + 1]; /* sources that snapshotted n (note 6) */

/* the failover */
bit crashed;
byte down, crashes;

#define ROOM(r) (ring[r].tail - ring[r].head < CAPR(r))
#define READABLE(r) (ring[r].head != ring[r].tail)

/* sl_ring_write_control_producer / the record path of emit, then
 * sl_ring_publish_producer: waits for room (write_control_all's
 * wait_until, emit's backpressure wait).  pos_out: the entry's position. */
inline ring_write(r, e, pos_out) {
  atomic {
    ROOM(r) ->
    ring[r].buf[ring[r].tail % CAPR(r)] = e;
    pos_out = ring[r].tail;
    ring[r].tail++
  }
}

/* sl_ring_announce_producer(r, id, pos): pos first, then id (release);
 * one step here, since the consumer's acquire of id orders them. */
inline announce(r, id, pos) {
  d_step {
    ring[r].ann_pos[(id) % NSLOT] = pos;
    ring[r].ann_id[(id) % NSLOT] = id
  }
}

#define ANNOUNCED(r, id) (ring[r].ann_id[(id) % NSLOT] == (id))
#define ANN_POS(r, id) (ring[r].ann_pos[(id) % NSLOT])

/* coordinator.c update_settled (note 7): the highest id with nothing at or
 * below it in flight. */
inline update_settled() {
  /* the caller declares us_k and settled_tmp */
  settled_tmp = last_id;
  us_k = NCP;
  do
  :: us_k >= 1 ->
     if
     :: cp[us_k] == CP_TRIG && us_k - 1 < settled_tmp -> settled_tmp = us_k - 1
     :: else -> skip
     fi;
     us_k--
  :: else -> break
  od;
  if
  :: settled_tmp > settled -> settled = settled_tmp
  :: else -> skip
  fi
}

#include "instance.pml"
#include "coordinator.pml"

init {
  atomic {
    run Coordinator();
    run Failover();
    run Source(0);
    run Source(1);
    run Instance(2, 2, 2);
    run Instance(3, 2, 0)
  }
}
