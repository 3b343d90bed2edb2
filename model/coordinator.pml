/* coordinator.pml — the coordinator thread (engine/coordinator.c) and the
 * failover (engine/failover.c) of barrier.pml, with the checks made when a
 * checkpoint completes and at the final checkpoint (barrier.pml note 6). */

/* coordinator.c all_acked (note 3): instance i stands in for n with its
 * final ack when it never saw n. */
#define STANDS_IN(i, n) ((finals & (1 << (i))) != 0 && msf[i] < (n))
#define SI(i, n) (STANDS_IN(i, n) -> (1 << (i)) : 0)
#define STANDIN(n) (SI(0, n) | SI(1, n) | SI(2, n) | SI(3, n))
#define ALL_ACKED(n) ((acks[n] | STANDIN(n)) == ALLI)
/* all_acked returns -1: an instance finished after seeing n, without an ack */
#define DR(i, n) ((acks[n] & (1 << (i))) == 0 && (finals & (1 << (i))) != 0 && \
                  msf[i] >= (n))
#define DROPPED(n) (DR(0, n) || DR(1, n) || DR(2, n) || DR(3, n))

/* advance() acts on n before start_final runs in the same pass */
#define ADVANCES(n) (cp[n] == CP_TRIG && (ALL_ACKED(n) || DROPPED(n)))
#if NCP == 1
#define IN_FLIGHT (cp[1] == CP_TRIG)
#define ANY_ADVANCES ADVANCES(1)
#elif NCP == 2
#define IN_FLIGHT ((cp[1] == CP_TRIG) + (cp[2] == CP_TRIG))
#define ANY_ADVANCES (ADVANCES(1) || ADVANCES(2))
#elif NCP == 3
#define IN_FLIGHT ((cp[1] == CP_TRIG) + (cp[2] == CP_TRIG) + (cp[3] == CP_TRIG))
#define ANY_ADVANCES (ADVANCES(1) || ADVANCES(2) || ADVANCES(3))
#else
#error "NCP is 1, 2 or 3"
#endif

/* can_trigger: a source still runs, the final checkpoint has not begun,
 * fewer than max_concurrent in flight (and the model's id bound). */
#define CAN_TRIGGER (last_id < NCP && IN_FLIGHT < MAXC && (finals & 3) != 3 && \
                     !final_started)

#define CLEAR_COORD i = 0; mine = 0; chs = 0; want = 0; us_k = 0; settled_tmp = 0

/* What the store held for n, forgotten once no restore can need it (the
 * model's own bookkeeping: it keeps states that differ only there apart
 * no longer). */
inline forget_checkpoint(n) {
  acks[n] = 0;
  spos[SPI(0, n)] = 0;
  spos[SPI(1, n)] = 0;
  sst[SSTI(D_INST, n)] = 0;
  sst[SSTI(K_INST, n)] = 0;
  sch[SCHI(D_INST, 0, n)] = 0;
  sch[SCHI(D_INST, 1, n)] = 0;
  sch[SCHI(K_INST, 0, n)] = 0;
  sch[SCHI(K_INST, 1, n)] = 0
}

/* abort_checkpoint; check_fates reads snapped[] only for the fates it
 * does not accept outright. */
inline abort_checkpoint(n, why) {
  cp[n] = CP_ABORTED;
  fate[n] = why;
  forget_checkpoint(n);
  if
  :: why != F_DROPPED && why != F_FINAL -> snapped[n] = 0
  :: else -> skip
  fi;
  update_settled()
}

/* The contents of snapshot n (barrier.pml note 6).  A final ack standing
 * in gives its final state (a source: its end), as the writer writes it
 * (write_instance). */
inline check_snapshot(n) {
  i = 0;
  do
  :: i < 2 ->
     if
     :: (acks[n] & (1 << i)) == 0 -> spos[SPI(i, n)] = RECS
     :: else -> skip
     fi;
     i++
  :: else -> break
  od;
  i = 2;
  do
  :: i < NINST ->
     if
     :: (acks[n] & (1 << i)) == 0 ->
        sst[SSTI(i, n)] = fstate[i];
        sch[SCHI(i, 0, n)] = 0;
        sch[SCHI(i, 1, n)] = 0
     :: else -> skip
     fi;
     i++
  :: else -> break
  od;
  /* D: each input's records before its barrier n, in state or channel
   * state, exactly once; none after it */
  i = 0;
  do
  :: i < 2 ->
     mine = sst[SSTI(D_INST, n)] & SRCMASK(i);
     chs = sch[SCHI(D_INST, i, n)];
     want = PREFIX(i, spos[SPI(i, n)]);
#if MODE == M_ALO
     assert(chs == 0);
     assert((mine & want) == want); /* at least once: later ones may be in */
#else
     assert((mine & chs) == 0);    /* exactly once */
     assert(((mine | chs) & want) == want); /* all before the barrier */
     assert((mine | chs) == want); /* nothing after the barrier */
#endif
     i++
  :: else -> break
  od;
  /* the sink: what D wrote before barrier n on each of its rings,
   * likewise */
  i = 0;
  do
  :: i < 2 ->
     mine = sst[SSTI(K_INST, n)] & ROUTE(i);
     chs = sch[SCHI(K_INST, i, n)];
     want = sst[SSTI(D_INST, n)] & ROUTE(i);
#if MODE == M_ALO
     assert(chs == 0);
     assert((mine & want) == want); /* K too snapshots on its last barrier */
#else
     assert((mine & chs) == 0);
     assert(((mine | chs) & want) == want);
     assert((mine | chs) == want);
#endif
     i++
  :: else -> break
  od
}

/* complete_checkpoint: the writer's durable commit, then older ones in
 * flight are aborted as subsumed (note 6). */
inline complete_checkpoint(n) {
  assert(n > completed);
  check_snapshot(n);
  cp[n] = CP_COMPLETE;
  fate[n] = F_COMPLETE;
  acks[n] = 0;
  snapped[n] = 0;
  if
  :: completed > 0 -> forget_checkpoint(completed) /* restores take n now */
  :: else -> skip
  fi;
  completed = n;
  i = 1;
  do
  :: i < n ->
     if
     :: cp[i] == CP_TRIG -> abort_checkpoint(i, F_SUBSUMED)
     :: else -> skip
     fi;
     i++
  :: else -> break
  od;
  update_settled()
}

/* At the final checkpoint: every checkpoint triggered ended, and one that
 * every source took part in (a snapshot, or a final ack standing in)
 * completed unless a timeout, a failover or a newer complete one ended
 * it (barrier.pml note 6). */
#define TOOK_PART(s, i) ((snapped[i] & (1 << (s))) || \
                         ((finals & (1 << (s))) && msf[s] < (i)))
inline check_fates() {
  i = first_id;
  do
  :: i <= last_id ->
     assert(cp[i] == CP_COMPLETE || cp[i] == CP_ABORTED);
     if
     :: TOOK_PART(0, i) && TOOK_PART(1, i) ->
        /* at-least-once: an instance forgets n when a barrier n + 1
         * comes first (snapshot.c note 3), and n aborts as dropped */
        assert(fate[i] == F_COMPLETE || fate[i] == F_SUBSUMED ||
               fate[i] == F_TIMEOUT || fate[i] == F_CRASH ||
               (MODE == M_ALO && fate[i] == F_DROPPED))
     :: else -> skip
     fi;
     i++
  :: else -> break
  od
}

inline coordinator_abort(n) {
  atomic {
    !crashed && timeouts < TIMEOUTS && cp[n] == CP_TRIG ->
    abort_checkpoint(n, F_TIMEOUT);
    timeouts++;
    CLEAR_COORD
  }
}

inline coordinator_advance(n) {
  atomic {
    !crashed && cp[n] == CP_TRIG && ALL_ACKED(n) -> complete_checkpoint(n);
    CLEAR_COORD
  }
}

inline coordinator_dropped(n) {
  atomic {
    !crashed && cp[n] == CP_TRIG && !ALL_ACKED(n) && DROPPED(n) ->
    abort_checkpoint(n, F_DROPPED);
    CLEAR_COORD
  }
}

proctype Coordinator() {
  byte us_k, settled_tmp, i, mine, chs, want;
  do
  :: final_done -> break
  :: /* trigger: store trigger_id for the sources */
     atomic {
       !crashed && CAN_TRIGGER ->
       last_id++;
       cp[last_id] = CP_TRIG;
       trigger_id = last_id;
       update_settled();
       CLEAR_COORD
     }
  :: coordinator_advance(1)
  :: coordinator_dropped(1)
  :: coordinator_abort(1)
#if NCP >= 2
  :: coordinator_advance(2)
  :: coordinator_dropped(2)
  :: coordinator_abort(2)
#endif
#if NCP >= 3
  :: coordinator_advance(3)
  :: coordinator_dropped(3)
  :: coordinator_abort(3)
#endif
  :: /* start_final: every instance is final */
     atomic {
       !crashed && !final_started && finals == ALLI && !ANY_ADVANCES ->
       i = 1;
       do
       :: i <= last_id ->
          if
          :: cp[i] == CP_TRIG -> abort_checkpoint(i, F_FINAL)
          :: else -> skip
          fi;
          i++
       :: else -> break
       od;
       final_started = 1;
       /* exactly-once output (at least once in mode 3): every sink's
        * final state holds every record routed to it; in the exactly-once
        * modes none twice (the asserts in process) */
       assert(fstate[D_INST] == ALLREC);
       assert(fstate[K_INST] == ALLREC);
       check_fates();
       final_done = 1;
       CLEAR_COORD
     }
  od
}

/* failover.c supervise / restart: every instance stops and is joined
 * (each counts itself down), sl_ring_reset empties the rings and their
 * announcements, sl_checkpointer_reset gives up the checkpoints in
 * flight and the final acks; the id counter and the store stay. */
proctype Failover() {
  byte us_k, settled_tmp, i;
  do
  :: atomic {
       crashes < CRASHES && !final_started && !crashed ->
       crashed = 1;
       crashes++
     };
     atomic {
       down == NINST ->
       i = 0;
       do
       :: i < 4 ->
          ring[i].head = 0;
          ring[i].tail = 0;
          us_k = 0;
          do
          :: us_k < CAP -> ring[i].buf[us_k] = 0; us_k++
          :: else -> break
          od;
          us_k = 0;
          do
          :: us_k < NSLOT -> ring[i].ann_id[us_k] = 0; ring[i].ann_pos[us_k] = 0; us_k++
          :: else -> break
          od;
          i++
       :: else -> break
       od;
       i = 1;
       do
       :: i <= NCP ->
          if
          :: cp[i] == CP_TRIG -> abort_checkpoint(i, F_CRASH)
          :: else -> skip
          fi;
          i++
       :: else -> break
       od;
       /* the fates of the attempt that failed, with its final acks */
       check_fates();
       first_id = last_id + 1;
       finals = 0;
       i = 0;
       do
       :: i < NINST -> msf[i] = 0; fstate[i] = 0; i++
       :: else -> break
       od;
       down = 0;
       crashed = 0;
       i = 0; us_k = 0; settled_tmp = 0
     }
  :: final_done -> break
  od
}
