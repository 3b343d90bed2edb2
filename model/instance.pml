/* instance.pml — the instance threads of barrier.pml: the sources
 * (run_source) and the instances with inputs (run_inputs), D and the
 * sink K.  Everything here runs on the instance's own thread
 * (engine/snapshot.c note 1); it meets the others only in the rings and
 * the coordinator's globals.
 *
 * A failover (barrier.pml note 4): each body runs under
 * `unless { crashed }`, so a failover can stop an instance between any two
 * of its steps; the instance then counts itself down, waits for the
 * restart and restores (engine/failover.c restart, instance_run). */

#define PENDING_TRIGGER (trigger_id > last_snap && trigger_id > settled)

proctype Source(byte s) {
  byte pos, last_snap, bpos, n;
restart:
  skip;
  {
    /* sl_checkpointer_restore_instance, sl_snapshot_restore_hook: the
     * source's restore hook seeks to its position of the restored id. */
    d_step {
      last_snap = completed;
      pos = (completed > 0 -> spos[SPI(s, completed)] : 0);
      n = 0;
      bpos = 0
    };
    do
    :: /* run_source -> sl_snapshot_source_poll: the newest trigger, between
        * two next() calls; one of a settled checkpoint is not taken
        * (snapshot.c note 5), and a newer trigger replaces an older one the
        * source had not seen yet. */
       atomic {
         PENDING_TRIGGER ->
         n = trigger_id;
         /* take_snapshot: the position; sl_checkpointer_ack */
         spos[SPI(s, n)] = pos;
#ifdef MUT_POSITION_AHEAD
         /* mutant: the position saved is one record ahead */
         spos[SPI(s, n)] = (pos < RECS -> pos + 1 : pos);
#endif
         snapped[n] = snapped[n] | (1 << s);
         acks[n] = acks[n] | (1 << s);
         last_snap = n;
         /* sl_instance_write_barrier -> write_control_all: in-band, always */
         ring_write(s, BAR(n), bpos);
#if MODE == M_UNALIGNED
         /* ... then sl_ring_announce_producer (unaligned mode), at once:
          * D reading the barrier before the announcement, learning (b),
          * is left to K, which D's two writes and announcements let
          * read a barrier first */
         announce(s, n, bpos);
#endif
         bpos = 0;
         n = 0
       }
    :: /* next() emits record pos + 1 (emit, publish) */
       atomic {
         pos < RECS && ROOM(s) ->
         ring[s].buf[ring[s].tail % CAPR(s)] = s * RECS + pos + 1;
         ring[s].tail++;
         pos++
       }
    :: /* next() returned SL_SOURCE_END; run_source polls once more */
       pos == RECS && !PENDING_TRIGGER -> break
    od;
    /* instance_finish: sl_snapshot_final (the final ack; max_seen_id is
     * the newest trigger taken: coordinator.c note 3), then send_end */
    atomic {
      finals = finals | (1 << s);
      msf[s] = last_snap
    };
    atomic { ring_write(s, END_E, bpos); bpos = 0 };
    /* instance_run: wait_until final_done */
    (final_done);
    goto done
  } unless { crashed };
  atomic { down++ };
  (!crashed);
  goto restart;
done:
  skip
}

/* ---------------------------------------------------------------- D, K */

/* The input ring of channel c: D reads rings 0 and 1, K rings 2 and 3. */
#define INR(c) (me == D_INST -> (c) : 2 + (c))

/* The model's scratch variables, zeroed after each step so that they do
 * not tell states apart. */
#define CLEAR_TEMPS c = 0; k = 0; k2 = 0; e = 0; n = 0; m = 0; p = 0; pu = 0; \
                    apos0 = 0; apos1 = 0

/* snapshot.c unblock_all */
#define UNBLOCK_ALL                                                         \
  seen[0] = 0; seen[1] = 0; blocked[0] = 0; blocked[1] = 0; aligning = 0

/* An announcement on input c in slot sl that D has not acted on: an id it
 * has not snapshotted and that is not settled (learning, (a) and (d)), or
 * one whose capture on c is logging (step 3 (i)). */
#define ANN_ID(c, sl) (ring[INR(c)].ann_id[sl])
#define ANN_NEW(c, sl) (ANN_ID(c, sl) > last_snap && ANN_ID(c, sl) > settled)
#define ANN_LOG(c, sl) (ANN_ID(c, sl) != 0 && cap[CAPI(c, ANN_ID(c, sl))] == CAP_LOG)
#if NSLOT == 3
#define ANN_ANY(X) (X(0, 0) || X(0, 1) || X(0, 2) || \
                    (nin > 1 && (X(1, 0) || X(1, 1) || X(1, 2))))
#elif NSLOT == 2
#define ANN_ANY(X) (X(0, 0) || X(0, 1) || (nin > 1 && (X(1, 0) || X(1, 1))))
#else
#error "MAXC is 1 or 2"
#endif

/* maybe_ack_unaligned (step 5) for every id in order: acks of one instance
 * go out in id order; an id without a snapshot here is passed over. */
inline try_acks() {
  d_step {
    do
    :: last_acked < last_snap ->
       k = last_acked + 1;
       if
       :: (capturing & (1 << k)) == 0 -> last_acked = k
       :: else ->
          if
          :: cap[CAPI(0, k)] == CAP_DONE &&
             (nin < 2 || cap[CAPI(1, k)] == CAP_DONE) ->
             capturing = capturing & ~(1 << k);
             if /* sl_checkpointer_ack; take_ack frees one of a settled id */
             :: cp[k] == CP_TRIG -> acks[k] = acks[k] | (1 << me)
             :: else -> skip
             fi;
             last_acked = k
          :: else -> break
          fi
       fi
    :: else -> break
    od
  }
}

/* sl_instance_write_barrier; announced: an unaligned checkpoint (step 2),
 * sl_ring_announce_producer after every in-band barrier is published. */
inline forward(id, announced) {
  if
  :: nout > 0 ->
     ring_write(2, BAR(id), apos0);
     ring_write(3, BAR(id), apos1);
     if
     :: announced ->
        announce(2, id, apos0);
        announce(3, id, apos1)
     :: else -> skip
     fi
  :: else -> skip
  fi
}

/* copy_overtaken(inst, c, id, pos): the entries of [consumer position,
 * pos) into channel state (c, id); records only (barriers of other ids
 * are skipped, END cannot be there).  They stay in the ring and are
 * processed when read. */
inline copy_overtaken(c, id) {
  /* the caller sets pu, the announced position */
  p = ring[INR(c)].head;
#ifdef MUT_COPY_CONSUMED
  /* mutant: copy from one entry before the consumer position */
  p = (p > 0 -> p - 1 : p);
#endif
  assert(p <= pu && pu < ring[INR(c)].tail);
#ifdef MUT_COPY_PAST
  /* mutant: copy on past the overtaken barrier, up to the entry after it */
  pu = (pu + 2 <= ring[INR(c)].tail -> pu + 2 : pu);
#endif
  do
  :: p < pu ->
     e = ring[INR(c)].buf[p % CAPR(INR(c))];
     if
     :: IS_REC(e) -> sch[SCHI(me, c, id)] = sch[SCHI(me, c, id)] | BIT(e)
     :: else -> skip
     fi;
     p++
  :: else -> break
  od
}

/* sl_snapshot_unaligned(inst, n): steps 1-4 for every unsettled id in
 * (last snapshot, n], in increasing order. */
inline unaligned(n) {
  k2 = last_snap + 1;
  do
  :: k2 <= n ->
     if
     :: k2 > settled ->
        d_step { /* 1. take_snapshot, the ack held back */
          sst[SSTI(me, k2)] = st;
          last_snap = k2;
          capturing = capturing | (1 << k2);
          max_seen = (k2 > max_seen -> k2 : max_seen)
        };
        forward(k2, 1); /* 2. in-band, then announced */
        d_step { /* 3. channel-state capture, per input */
          c = 0;
          do
          :: c < 2 ->
             if
             :: c >= nin || ended[c] || bar_in[c] >= k2 ->
                cap[CAPI(c, k2)] = CAP_DONE /* delivered BARRIER k2, or END */
             :: else ->
                if
                :: ANNOUNCED(INR(c), k2) -> /* sl_ring_announced_consumer */
#ifdef MUT_NO_COPY
                   /* mutant: the overtaken entries are not copied */
                   skip;
#else
                   pu = ANN_POS(INR(c), k2);
                   copy_overtaken(c, k2);
#endif
                   cap[CAPI(c, k2)] = CAP_DONE
                :: else -> cap[CAPI(c, k2)] = CAP_LOG /* capture_entry from now */
                fi
             fi;
             c++
          :: else -> break
          od;
          /* 4. a timeout switch unblocks what aligning k2 blocked */
#ifndef MUT_NO_UNBLOCK
          if
          :: aligning != 0 && aligning <= k2 -> UNBLOCK_ALL
          :: else -> skip
          fi
#endif
        };
        try_acks()
     :: else -> skip
     fi;
     k2++
  :: else -> break
  od
}

/* snapshot.c maybe_complete_alignment: every live channel delivered the
 * barrier being aligned: take_snapshot (ack at once: no channel state),
 * sl_instance_write_barrier, unblock_all. */
inline maybe_complete_alignment() {
  if
  :: aligning != 0 && (seen[0] || ended[0]) && (nin < 2 || seen[1] || ended[1]) ->
     n = aligning;
     d_step {
       sst[SSTI(me, n)] = st;
       last_snap = n;
       capturing = capturing | (1 << n);
       cap[CAPI(0, n)] = CAP_DONE;
       cap[CAPI(1, n)] = CAP_DONE
     };
     try_acks();
     forward(n, 0);
     d_step { UNBLOCK_ALL }
  :: else -> skip
  fi
}

/* The operator's work on one record: process_records, then capture_entry
 * for every id logging on c (step 3); D's output goes into pend, to be
 * written when its output ring has room (emit inside the callback). */
inline process(c, e, logging) {
  d_step {
    assert(!EXACTLY_ONCE || (st & BIT(e)) == 0); /* barrier.pml note 2 */
    st = st | BIT(e);
    if
    :: logging ->
       k = 1;
       do
       :: k <= NCP ->
          if
          :: cap[CAPI(c, k)] == CAP_LOG ->
             sch[SCHI(me, c, k)] = sch[SCHI(me, c, k)] | BIT(e)
          :: else -> skip
          fi;
          k++
       :: else -> break
       od
    :: else -> skip
    fi;
    if
    :: nout > 0 && ROOM(OUT_RING(e)) ->
       ring[OUT_RING(e)].buf[ring[OUT_RING(e)].tail % CAPR(OUT_RING(e))] = e;
       ring[OUT_RING(e)].tail++
    :: nout > 0 && !ROOM(OUT_RING(e)) -> pend = e
    :: else -> skip
    fi
  }
}

/* In-band BARRIER m on channel c (drain_channel). */
inline on_barrier(c, m) {
  d_step {
    bar_in[c] = m;
    max_seen = (m > max_seen -> m : max_seen); /* snapshot.c note 5 */
    /* capture (ii): the barrier ends the logging of c for m, and for an
     * older id whose barrier the source never wrote (it skipped the
     * trigger): nothing of that id can follow on c. */
    k = 1;
    do
#ifdef MUT_LOG_PAST_BARRIER
    :: k <= NCP && k < m ->
#else
    :: k <= NCP && k <= m ->
#endif
       if
       :: cap[CAPI(c, k)] == CAP_LOG -> cap[CAPI(c, k)] = CAP_DONE
       :: else -> skip
       fi;
       k++
    :: else -> break
    od
  };
  try_acks();
#if MODE == M_UNALIGNED
  if
  :: m > last_snap && m > settled -> unaligned(m) /* learning (b) */
  :: else -> skip                                 /* note 5: dropped */
  fi
#else
  /* sl_snapshot_barrier */
  if
  :: m <= last_snap || m <= settled || aligning > m -> skip /* note 5 */
  :: else ->
     d_step {
       if
       :: aligning != m -> UNBLOCK_ALL; aligning = m /* replaces an older */
       :: else -> skip
       fi;
       assert(!seen[c]); /* one barrier m per ring */
       seen[c] = 1;
#ifndef MUT_NO_BLOCK /* mutant: aligned mode reads on past the barrier */
       if
       :: EXACTLY_ONCE -> blocked[c] = 1 /* note 3 */
       :: else -> skip
       fi
#endif
     };
     maybe_complete_alignment()
  fi
#endif
}

/* END on channel c (drain_channel): capture (iii), then
 * sl_snapshot_channel_ended. */
inline on_end(c) {
  d_step {
    ended[c] = 1;
    k = 1;
    do
    :: k <= NCP ->
       if
#ifdef MUT_END_DROPS
       /* mutant: END drops the capture (and its ack) instead of ending it */
       :: cap[CAPI(c, k)] == CAP_LOG ->
          cap[CAPI(0, k)] = CAP_NONE;
          cap[CAPI(1, k)] = CAP_NONE;
          capturing = capturing & ~(1 << k)
#else
       :: cap[CAPI(c, k)] == CAP_LOG -> cap[CAPI(c, k)] = CAP_DONE
#endif
       :: else -> skip
       fi;
       k++
    :: else -> break
    od
  };
  try_acks();
#if MODE != M_UNALIGNED
  maybe_complete_alignment()
#endif
}

/* An announcement to act on (sl_snapshot_announced).  The instance looks
 * at announce_seq between any two entries, so it reads no entry while one
 * is visible.  Notifications (a settled id) are likewise acted on before
 * the next entry: the engine does so once per pass over the inputs, a
 * lag the model leaves out to keep its state space small. */
#if MODE == M_UNALIGNED || MODE == M_TIMEOUT
#define ANN_PENDING (ANN_ANY(ANN_NEW) || ANN_ANY(ANN_LOG))
#else
#define ANN_PENDING false
#endif

/* One entry of channel ch (drain_channel), consumer position advanced.
 * ch is a constant; the inlines below use the variables c, k, e. */
inline consume(ch) {
  atomic {
    ch < nin && pend == 0 && !ended[ch] && !blocked[ch] && READABLE(INR(ch)) &&
    !ANN_PENDING && settled == seen_settled ->
    e = ring[INR(ch)].buf[ring[INR(ch)].head % CAPR(INR(ch))];
    ring[INR(ch)].buf[ring[INR(ch)].head % CAPR(INR(ch))] = 0; /* (model: no stale bytes) */
    ring[INR(ch)].head++;
    if
    :: IS_REC(e) -> process(ch, e, 1)
    :: IS_BAR(e) -> m = BAR_ID(e); on_barrier(ch, m)
    :: e == END_E -> on_end(ch)
    fi;
    CLEAR_TEMPS
  }
}

/* me: the instance (2 D, 3 K); nin inputs, nout outputs. */
proctype Instance(byte me; byte nin; byte nout) {
  byte st, last_snap, max_seen, last_acked, seen_settled, aligning, pend;
  byte capturing; /* ids snapshotted whose ack is not enqueued: a bit each */
  bit seen[2], blocked[2], ended[2];
  byte bar_in[2]; /* newest barrier consumed on each channel */
  byte cap[2 * (NCP + 1)];
  byte c, k, k2, e, n, m, p, pu, apos0, apos1;
restart:
  skip;
  {
    /* sl_checkpointer_restore_instance: the newest complete checkpoint's
     * state (restore_keyed), sl_snapshot_restore_hook */
    atomic {
      m = completed;
      st = (m > 0 -> sst[SSTI(me, m)] : 0);
      last_snap = m;
      max_seen = m;
      last_acked = m;
      seen_settled = settled;
      aligning = 0;
      pend = 0;
      capturing = 0;
      UNBLOCK_ALL;
      ended[0] = 0; ended[1] = 0;
      bar_in[0] = 0; bar_in[1] = 0;
      k = 0;
      do
      :: k < 2 * (NCP + 1) -> cap[k] = CAP_NONE; k++
      :: else -> break
      od;
    /* sl_restore_channel_state (restore.c) reads it back and
     * replay_channel_state (runtime.c) hands each channel's captured
     * records to the operator, in order, before anything read from its
     * ring */
    c = 0;
    do
#ifdef MUT_NO_REPLAY /* mutant: the channel state is not replayed */
    :: false ->
#else
    :: c < nin && m > 0 ->
#endif
       e = 1;
       do
       :: e <= 2 * RECS ->
          if
          :: sch[SCHI(me, c, m)] & BIT(e) ->
             process(c, e, 0);
             if
             :: pend != 0 -> ring_write(OUT_RING(pend), pend, p); pend = 0
             :: else -> skip
             fi
          :: else -> skip
          fi;
          e++
       :: else -> break
       od;
       c++
    :: else -> break
    od;
    CLEAR_TEMPS
    };
    do
    :: /* the record's output, from inside the callback: emit waits for room */
       atomic {
         pend != 0 && ROOM(OUT_RING(pend)) ->
         ring[OUT_RING(pend)].buf[ring[OUT_RING(pend)].tail % CAPR(OUT_RING(pend))] = pend;
         ring[OUT_RING(pend)].tail++;
         pend = 0
       }
    :: consume(0)
    :: consume(1)
#if MODE == M_UNALIGNED || MODE == M_TIMEOUT
    :: /* sl_snapshot_announced, learning (a), (d): the newest new id */
       atomic {
         pend == 0 && ANN_ANY(ANN_NEW) ->
         n = 0;
         c = 0;
         do
         :: c < nin ->
            k = 0;
            do
            :: k < NSLOT ->
               if
               :: ANN_NEW(c, k) && ANN_ID(c, k) > n -> n = ANN_ID(c, k)
               :: else -> skip
               fi;
               k++
            :: else -> break
            od;
            c++
         :: else -> break
         od;
         unaligned(n);
         CLEAR_TEMPS
       }
    :: /* sl_snapshot_announced, step 3 (i): logging until the announcement */
       atomic {
         pend == 0 && ANN_ANY(ANN_LOG) ->
         c = 0;
         do
         :: c < nin ->
            k = 0;
            do
            :: k < NSLOT ->
               n = ANN_ID(c, k);
               if
               :: n != 0 && cap[CAPI(c, n)] == CAP_LOG ->
#ifndef MUT_NO_COPY
                  pu = ANN_POS(INR(c), n);
                  copy_overtaken(c, n);
#endif
                  cap[CAPI(c, n)] = CAP_DONE
               :: else -> skip
               fi;
               k++
            :: else -> break
            od;
            c++
         :: else -> break
         od;
         try_acks();
         CLEAR_TEMPS
       }
#endif
#if MODE == M_TIMEOUT
    :: /* the alignment of `aligning` outlasted aligned_timeout_ms: (c) */
       atomic {
         pend == 0 && aligning != 0 && aligning > settled ->
         n = aligning;
         unaligned(n);
         CLEAR_TEMPS
       }
#endif
    :: /* sl_snapshot_notifications: cp_settled_id rose */
       atomic {
         pend == 0 && settled != seen_settled ->
         seen_settled = settled;
         /* note 5: an aborted alignment is cancelled */
         if
         :: aligning != 0 && aligning <= settled -> UNBLOCK_ALL
         :: else -> skip
         fi;
         /* abort / settle while capturing: drop the channel state */
         k = 1;
         do
         :: k <= NCP && k <= settled ->
            if
            :: (capturing & (1 << k)) != 0 ->
               capturing = capturing & ~(1 << k);
               cap[CAPI(0, k)] = CAP_NONE;
               cap[CAPI(1, k)] = CAP_NONE;
               sch[SCHI(me, 0, k)] = 0;
               sch[SCHI(me, 1, k)] = 0
            :: else -> skip
            fi;
            k++
         :: else -> break
         od;
         try_acks();
         CLEAR_TEMPS
       }
    :: /* every input ended (run_inputs returns) */
       pend == 0 && ended[0] && (nin < 2 || ended[1]) -> break
    od;
    assert(capturing == 0); /* every capture ended with its inputs */
    /* instance_finish: sl_snapshot_final, then send_end */
    atomic {
      fstate[me] = st;
      finals = finals | (1 << me);
      msf[me] = max_seen
    };
    atomic {
      if
      :: nout > 0 ->
         ring_write(2, END_E, p);
         ring_write(3, END_E, p)
      :: else -> skip
      fi;
      p = 0
    };
    (final_done);
    goto done
  } unless { crashed };
  atomic { down++ };
  (!crashed);
  goto restart;
done:
  skip
}
