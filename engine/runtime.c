/* runtime.c — the loop of an instance thread: reading channels, calling
 * operators, emitting into rings, waiting, and the turns of chained
 * members.  The life around the loop (the thread, open, restore, finish,
 * close, failing and stopping) is instance.c.
 *
 * NOTES ON THE DESIGN OF AN INSTANCE THREAD
 *
 * 1. An instance owns its input channels' consumer sides and its outputs'
 *    producer sides; no other thread touches them (ring.h note 1).
 * 2. Output batching: records are appended privately and published when an
 *    output ring holds output_batch_records unpublished records, when a pass
 *    over the inputs finds nothing new (input dry), every buffer_timeout_us
 *    (1 ms by default, with a forced wake check: ring.h note 8), after each
 *    call of a source's next(), and before the thread waits for anything.  So latency stays low at low load and batches are large at
 *    high load.
 * 3. Before an instance waits (input empty or output full) it publishes all
 *    outputs and returns all consumed input space with forced wake checks;
 *    the rings' quarter-capacity wake thresholds rely on this (ring.h 8).
 * 4. Waiting spins spin_iterations times, then parks (wait.h).  Stopping
 *    and failing set job->stopping and wake every parker (instance.c
 *    note 5); every wait loop re-checks job->stopping after preparing to
 *    park, so nothing sleeps through a stop.
 * 5. End of stream: when every input channel delivered END (a source: when
 *    next() returned SL_SOURCE_END) the instance calls finish, writes END
 *    on every output ring and publishes; from then on sl_emit is refused.
 *    A failure stops the job before the close callback runs; close is
 *    always last.
 * 6. Keyed state of a job without checkpoints is reclaimed here, after a
 *    pass over the inputs, since no checkpoint ever releases its epochs
 *    (reclaim_unversioned).
 * 7. An instance finishes once (coordinator.c note 10).  Restored from a
 *    checkpoint that says it had finished, it runs open and restore (a
 *    sink's restore commits what that checkpoint pre-committed), then
 *    neither reads records nor calls next(), finish or the end-of-input
 *    timers: it hands over its restored state as its final snapshot,
 *    writes END, reads its inputs only up to their END (its upstream
 *    instances finished too; a record there means the checkpoint does
 *    not fit the job, and fails it), and waits for the final checkpoint
 *    like any finished instance (run_finished).
 * 8. Callback returns (the contract in sluice.h, "CALLBACK RETURNS"): 0 is
 *    success and any other value fails the job with that value as its
 *    status, negative SL_E* codes and positive errno values alike, so a
 *    callback may return what a library call (sl_state_put, sl_emit)
 *    returned.  The exceptions are the two with a positive meaning: a
 *    filter's 1 (keep) and a source's SL_SOURCE_END.  The test on the
 *    record path is rc != 0, as cheap as the rc < 0 it replaced.
 *
 * 9. Stop with a savepoint (stop.c).  The request is read in the source
 *    loop only, once per next() call and only with checkpoints on, so
 *    records pay nothing for it.  Drain: the source ends as if next() had
 *    returned SL_SOURCE_END.  Without drain (hold): the source calls
 *    next() no more and emits nothing, not even a watermark; it waits,
 *    answering triggers (the stop checkpoint's barrier is thus its last
 *    output) and notifications, until the job stops or the stop is
 *    withdrawn (the checkpoint aborted), when it goes on as before.  An
 *    instance leaving after such a stop delivers the completion it has
 *    not yet seen, so exactly-once sinks commit up to the stop
 *    checkpoint.
 * 10. Unaligned checkpoints (snapshot.c notes 12, 13).  announce_seq is
 *    compared with what the instance saw (one relaxed load of a line that
 *    only a source's triggers write unless checkpoints are unaligned) before
 *    each entry in drain_channel, between passes in run_inputs, and in
 *    the wait for input (any_input_readable, which also ends at the
 *    aligned-checkpoint timeout; wait_loop bounds its sleep by it).  The
 *    wait for room on a full output does not look: it runs inside an
 *    operator callback, where no snapshot may be taken, and it ends once
 *    downstream has freed a quarter of the ring (ring.h note 8), which
 *    it does as it reads (note 11) and without waiting for a checkpoint
 *    while it is unaligned; the instance then acts at its next entry.  Logging channels hand each entry
 *    to the captures before it is processed.  A restored instance replays
 *    its channel state before it reads any ring (replay_channel_state).
 * 11. A pass reads at most an eighth of a ring before it returns that
 *    space (sl_ring_release_consumer, whose unforced wake check runs at
 *    that step).  Reading everything readable first meant that a slow
 *    consumer of a full 4 MiB ring kept its producer parked until the
 *    whole ring was processed (a second or more behind a slow sink); the
 *    producer was then late for everything, the barriers and
 *    announcements it forwards included.  Passes are cheap (a few loads),
 *    and between them the instance also looks at its timers and
 *    notifications, and the other inputs take their turn sooner.
 * 12. Chaining (sl_job_config.chaining; graph.c plan_chains).  An
 *    instance whose only channel is the only ring of one output of one
 *    upstream instance (a forward edge, or an edge between operators of
 *    parallelism 1) may run as a member of that instance's thread, its
 *    runner; by default when the job's instances outnumber its CPUs,
 *    where threads would otherwise queue for cores (a p99 of one
 *    scheduler tick).  The ring stays, small (64 KiB, or four of the
 *    largest records allowed with their headers: 512 KiB at the default
 *    max_record_bytes of 64 KiB; graph.c plan_chains), and so do the
 *    member's code paths: whenever the producer publishes
 *    (flush_outputs, after every ring is published), after each pass of
 *    run_inputs and while it waits (wait_loop), the member takes a turn
 *    (member_turn): it drains the ring with drain_channel, so barriers,
 *    watermarks and END reach it in order and at once, fires its timers,
 *    acts on notifications, then flushes its own outputs, which gives
 *    its own members their turn.  A producer that finds the chained
 *    ring full flushes, which empties it.
 *    A member's waits (room on a ring of another thread, the final
 *    checkpoint) are the thread's: every ring end and waker of a member
 *    uses its runner's parker (sl_instance_parker).  Its barrier is read
 *    in write_control_all, so it needs no announcement.  Members start
 *    after their runner's own start (open and restore), upstream first,
 *    and end after it (members_start, members_end: instance.c note 3);
 *    a member that fails fails the job at once, and its runner leaves on
 *    the stop.  A member never waits for input, so a callback that blocks
 *    until another operator of its chain acts waits for ever: such an
 *    operator opts out (sl_op_disable_chaining).
 * 13. Keyed state fetched ahead (keyed_slice).  A keyed lookup in a state
 *    larger than the cache waits for two misses in a row, the bucket and
 *    the entry it points to (storage/cow_map.h); one after another, record
 *    after record, they were most of a running sum's time at 1M keys.  So
 *    a process operator that has made a keyed-state call without a user
 *    key (a value, fold or list state), reading a 64-bit keyed channel,
 *    with a state over state.c's SL_PREFETCH_MIN_STATE_BYTES, gets each
 *    slice of up to SL_STOP_CHECK_RECORDS records' keys computed first,
 *    hashed with the (state id, kind) of its last such call (the guess),
 *    and the buckets and then the entries fetched PREFETCH_GROUP records
 *    a stage ahead (sl_cow_map_prefetch), so their misses overlap.  The
 *    guess is a hint only: a wrong one wastes the fetches, never changes
 *    a result.  Each record's key is handed to state.c (key_valid) instead
 *    of computed again on the first state call, and its hash with it (the
 *    memo in checkpoint.h), which state.c takes only for the (id, kind) it
 *    was computed for.  Measured on P2 (bench/README.md): 2.4x the rate
 *    at 1M keys, 1.4x at 100K, a wash at 10K, where the state is in L3
 *    and the extra work costs about what the misses did; there it keeps
 *    what checkpoints add to latency_bench's p99 small, so only states
 *    under state.c's 256 KiB threshold are left out.  A third miss
 *    remained: a chain whose first entry holds another key (a third to a
 *    half of lookups, at a load factor of 1/2 to 1) sends the lookup on to
 *    the second, unfetched.  In a state of SL_PREFETCH_CHAIN_MIN_STATE_BYTES
 *    or more (state.c: 32 MiB), a third stage fetches it, a group ahead:
 *    at 1M keys P2 1.17x the rate, P3 1.22x, at 4M keys P2 1.13x
 *    (bench/README.md); below, where the second entry is in L2 or L3,
 *    the stage costs more than it hides (P2 0.92x at 10K keys).  A slice
 *    runs with two stages or three in one of two functions, each with its
 *    loops unrolled: one function for both, with a variable count, cost
 *    P2 about 3% at 10K keys.
 * 14. Records are copied into a ring a word at a time (copy_payload).  A
 *    map writes its output to inst->scratch, a callback builds the record
 *    it passes to sl_emit on its stack, typically field by field, 8 bytes
 *    at a time; emit copies it into the ring right after.  A 16-byte
 *    vector load over two 8-byte stores still in the store buffer cannot
 *    take its data from them: it waits until both are written to the
 *    cache, about 15 cycles.  In P1, whose whole chain runs in one thread,
 *    that wait in the map's copy was 42% of the thread's samples (perf
 *    annotate).  Loads of 8 bytes are forwarded from a store of 8 or more
 *    that covers them, so records of up to COPY_WORDS_MAX_BYTES, in
 *    multiples of 8, are copied as 8-byte words.  P1 went from 81-83 to
 *    106-111 M tuples/s (30M tuples, 3 runs each, 3 rounds alternated
 *    with the build before, 2026-12-08).  P2 and P3 did not change
 *    measurably: their callbacks' records happened to be written with one
 *    16-byte store, or long enough before the copy.  A record written a
 *    byte or 4 bytes at a time still waits, as it did.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "fault.h"
#include "internal.h"

/* Note 14: records up to this size are copied into rings a word at a time. */
#define COPY_WORDS_MAX_BYTES 64u
/* Records processed between two looks at job->stopping inside an entry. */
#define SL_STOP_CHECK_RECORDS 64
/* Note 13: records whose state entries are fetched a group ahead. */
#define PREFETCH_GROUP 8u
/* sl_cow_map_prefetch's stages 0 to 2; the third only in large states
 * (sl_state_prefetch_stages). */
#define PREFETCH_STAGES_MAX 3u
_Static_assert(SL_STOP_CHECK_RECORDS <= SL_COW_PREFETCH_MAX,
               "a slice's keys are prefetched in one call");

#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

/* ----------------------------------------------------------- keys */

SL_EXPORT int sl_key_instance(uint64_t key, uint32_t max_parallelism,
                              int parallelism) {
  if (max_parallelism == 0 || parallelism < 1 ||
      (uint32_t)parallelism > max_parallelism)
    return -1;
  return sl_group_instance(sl_key_group(key, max_parallelism), max_parallelism,
                           parallelism);
}

SL_EXPORT uint64_t sl_hash_bytes(const void *data, size_t size_bytes) {
  return XXH3_64bits(data, size_bytes);
}

/* ----------------------------------------------------------- flushing */

static void run_chain(sl_instance *inst, bool force);

static void flush_outputs(sl_instance *inst, bool force) {
  /* bytes_out is summed here, from the rings' per-entry counts, rather
   * than added per record: this loop touches each ring's producer line
   * anyway, and a per-record add costs P1 about 8%. */
  uint64_t bytes_out = 0;
  for (int o = 0; o < inst->output_count; o++) {
    sl_output *out = &inst->outputs[o];
    for (int k = 0; k < out->ring_count; k++) {
      sl_ring_publish_producer(out->rings[k], force);
      bytes_out += out->rings[k]->payload_bytes;
    }
  }
  inst->bytes_out = bytes_out;
  /* Note 12: every ring is published before a chained consumer runs, so
   * the other threads never wait for what this one holds back while it
   * runs its members. */
  if (unlikely(inst->chained_outputs))
    run_chain(inst, force);
}

static void release_inputs(sl_instance *inst, bool force) {
  for (int c = 0; c < inst->channel_count; c++)
    sl_ring_release_consumer(inst->channels[c].ring, force);
}

static void publish_counters(sl_instance *inst) {
  /* Plain stores by the only writer; readers accept a slightly old value.
   * No read-modify-write on the hot path. */
  atomic_store_explicit(&inst->records_in_shared, inst->records_in,
                        memory_order_relaxed);
  atomic_store_explicit(&inst->records_out_shared, inst->records_out,
                        memory_order_relaxed);
  atomic_store_explicit(&inst->bytes_in_shared, inst->bytes_in,
                        memory_order_relaxed);
  atomic_store_explicit(&inst->bytes_out_shared, inst->bytes_out,
                        memory_order_relaxed);
  if (inst->cp.keyed) { /* counts the map keeps anyway: O(1) */
    atomic_store_explicit(&inst->state_entries_shared,
                          sl_cow_map_count(inst->cp.keyed),
                          memory_order_relaxed);
    atomic_store_explicit(&inst->state_bytes_shared,
                          sl_cow_map_memory_bytes(inst->cp.keyed),
                          memory_order_relaxed);
  }
  for (int k = 0; k < 2; k++)
    atomic_store_explicit(&inst->counters_shared[k], inst->counters[k],
                          memory_order_relaxed);
  atomic_store_explicit(&inst->watermark_shared, inst->watermark,
                        memory_order_relaxed);
}

SL_EXPORT void sl_ctx_count(sl_ctx *ctx, int counter, uint64_t n) {
  if (counter == SL_COUNT_LATE || counter == SL_COUNT_DEAD_LETTER)
    ctx->counters[counter] += n;
}

/* ----------------------------------------------------------- waiting */

/* An upstream instance announced a checkpoint (snapshot.c note 12): one
 * relaxed load of a line of this instance's own; nobody writes it unless
 * checkpoints are unaligned. */
static inline bool announcement_pending(const sl_instance *inst) {
  return atomic_load_explicit(&inst->cp.announce_seq, memory_order_relaxed) !=
         inst->cp.announce_seen;
}

/* An alignment under way that the aligned-checkpoint timeout may end
 * (snapshot.c note 12); false at once in plain aligned mode. */
static inline bool alignment_may_time_out(const sl_instance *inst) {
  return unlikely(inst->cp.aligning_id != 0) &&
         inst->job->config.checkpoint_aligned_timeout_ms != 0;
}

/* Wait until ready(inst, arg) is true (returns true) or the job is stopping
 * (returns false).  Spins spin_iterations times, then parks.  Everything
 * pending is published first (note 3).  The time spent counts as kind
 * (metrics.c note 3); a wait that is over at its first look costs no
 * clock reads. */
static bool any_input_readable(sl_instance *inst, void *arg);
static bool wait_loop(sl_instance *inst, bool (*ready)(sl_instance *, void *),
                      void *arg);

static bool wait_until(sl_instance *inst, enum sl_wait_kind kind,
                       bool (*ready)(sl_instance *, void *), void *arg) {
  flush_outputs(inst, true);
  release_inputs(inst, true);
  if (ready(inst, arg))
    return true;
  uint64_t since_ns = sl_times_wait_begin(inst, kind);
  bool ok = wait_loop(inst, ready, arg);
  sl_times_wait_end(inst, kind, since_ns);
  return ok;
}

static bool chain_attention(sl_instance *inst);
static uint64_t chain_wait_ns(sl_instance *inst);

static bool wait_loop(sl_instance *inst, bool (*ready)(sl_instance *, void *),
                      void *arg) {
  sl_job *job = inst->job;
  uint32_t spin_limit = job->spin_iterations;
  sl_parker *parker = sl_instance_parker(inst); /* its thread's: note 12 */
  for (uint32_t spins = 0;; spins++) {
    if (ready(inst, arg))
      return true;
    if (sl_job_stopping(job))
      return false;
    /* Note 12: the instances this thread runs for this one keep their
     * timers and notifications while it waits. */
    if (unlikely(inst->chained_outputs) && chain_attention(inst)) {
      run_chain(inst, true);
      continue;
    }
    if (spins < spin_limit) {
      sl_cpu_relax();
      continue;
    }
    sl_parker_prepare(parker);
    if (ready(inst, arg)) {
      sl_parker_cancel(parker);
      return true;
    }
    if (sl_job_stopping(job)) {
      sl_parker_cancel(parker);
      return false;
    }
    if (unlikely(inst->chained_outputs) && chain_attention(inst)) {
      sl_parker_cancel(parker);
      continue;
    }
    /* A pending processing-time timer bounds a wait for input (timer.c);
     * a wait for room on an output cannot fire it anyway. */
    uint64_t timeout_ns = unlikely(inst->timers != 0) &&
                                  ready == any_input_readable
                              ? sl_event_processing_wait_ns(inst)
                              : UINT64_MAX;
    if (unlikely(inst->chained_outputs)) {
      uint64_t chain_ns = chain_wait_ns(inst);
      if (chain_ns < timeout_ns)
        timeout_ns = chain_ns;
    }
    /* snapshot.c note 12: the aligned-checkpoint timeout ends a wait for
     * input too (no input may come while channels are blocked). */
    if (alignment_may_time_out(inst) && ready == any_input_readable) {
      uint64_t align_ns = sl_snapshot_alignment_wait_ns(inst);
      if (align_ns < timeout_ns)
        timeout_ns = align_ns;
    }
    if (timeout_ns == UINT64_MAX)
      sl_parker_sleep(parker);
    else
      sl_parker_sleep_ns(parker, timeout_ns ? timeout_ns : 1);
  }
}

/* Input to read, or a checkpoint notification to act on. */
static bool any_input_readable(sl_instance *inst, void *arg) {
  (void)arg;
  for (int c = 0; c < inst->channel_count; c++) {
    sl_channel *ch = &inst->channels[c];
    if (!ch->ended && !ch->blocked && sl_ring_readable_consumer(ch->ring) > 0)
      return true;
  }
  if (unlikely(inst->timers != 0) && sl_event_processing_due(inst))
    return true;
  /* snapshot.c note 12: an announcement (also on a blocked channel), or
   * an alignment that outlasted the aligned-checkpoint timeout. */
  if (announcement_pending(inst) ||
      (alignment_may_time_out(inst) &&
       sl_snapshot_alignment_timed_out(inst, sl_now_ns())))
    return true;
  if (unlikely(inst->chained_outputs) && chain_attention(inst))
    return true; /* note 12: run_inputs runs the chain after its pass */
  return sl_snapshot_notification_pending(inst);
}

typedef struct append_wait {
  sl_ring *ring;
  uint32_t record_bytes;
  unsigned flags;
  uint8_t *slot;
  unsigned control_kind;
  uint64_t control_value;
} append_wait;

static bool try_append(sl_instance *inst, void *arg) {
  (void)inst;
  append_wait *w = arg;
  w->slot = sl_ring_append_record_producer(w->ring, w->record_bytes, w->flags);
  return w->slot != 0;
}

static bool try_control(sl_instance *inst, void *arg) {
  (void)inst;
  append_wait *w = arg;
  return sl_ring_write_control_producer(w->ring, w->control_kind,
                                        w->control_value);
}

/* ----------------------------------------------------------- emitting */

/* Note 14: one 8-byte word, loaded and stored as one; the empty asm keeps
 * the compiler from merging neighbouring words into a wider copy. */
static inline __attribute__((always_inline)) void
copy_word(uint8_t *to, const uint8_t *from) {
  uint64_t w;
  memcpy(&w, from, 8);
  __asm__("" : "+r"(w));
  memcpy(to, &w, 8);
}

static inline void copy_payload(uint8_t *slot, const void *data,
                                uint32_t size) {
  /* Constant sizes let the compiler inline the common small copies; tests
   * in order of likelihood are cheaper than a jump table here.  Note 14:
   * small records go a word at a time. */
  const uint8_t *from = data;
  if (likely(size == 16)) {
    copy_word(slot, from);
    copy_word(slot + 8, from + 8);
  } else if (size % 8 == 0 && size <= COPY_WORDS_MAX_BYTES) {
    for (uint32_t i = 0; i < size; i += 8)
      copy_word(slot + i, from + i);
  } else {
    memcpy(slot, data, size);
  }
}

/* Inline into emit, forced like it (see emit). */
static inline __attribute__((always_inline)) int
write_record(sl_instance *inst, sl_ring *ring, const void *data, uint32_t size,
             int64_t ts) {
  unsigned flags = ts != SL_NO_TIMESTAMP ? SL_ENTRY_HAS_TS : 0;
  uint8_t *slot = sl_ring_append_record_producer(ring, size, flags);
  if (unlikely(!slot)) {
    append_wait w = {.ring = ring, .record_bytes = size, .flags = flags};
    if (!wait_until(inst, SL_WAIT_BACKPRESSURED, try_append, &w))
      return SL_ESTOPPED;
    slot = w.slot;
  }
  if (flags) {
    memcpy(slot, &ts, 8);
    slot += 8;
  }
  copy_payload(slot, data, size);
  return 0;
}

static int emit_port(sl_instance *inst, int port, const void *data,
                     uint32_t size, int64_t ts) {
  for (int o = 0; o < inst->output_count; o++) {
    sl_output *out = &inst->outputs[o];
    if (out->port != port)
      continue; /* another port's consumers */
    sl_ring *ring;
    if (out->partition == SL_PARTITION_FORWARD) {
      ring = out->rings[0];
    } else if (out->partition == SL_PARTITION_HASH) {
      sl_record rec = {.data = data, .size_bytes = size, .timestamp = ts};
      uint64_t key = out->key(out->key_user, &rec);
      uint32_t group = sl_key_group(key, inst->job->config.max_parallelism);
      ring = out->rings[out->group_instance[group]];
    } else {
      ring = out->rings[out->next];
      if (++out->next == (uint32_t)out->ring_count)
        out->next = 0;
    }
    int rc = write_record(inst, ring, data, size, ts);
    if (unlikely(rc))
      return rc;
  }
  inst->records_out++;
  return 0;
}

static int emit_general(sl_instance *inst, const void *data, uint32_t size,
                        int64_t ts) {
  return emit_port(inst, 0, data, size, ts);
}

/* The common case, one forward output ring, stays inline: forced, with
 * write_record, since GCC's own choice changed with the file around it
 * (when the instance's life moved to instance.c it called emit, then
 * write_record, out of line, and pipeline P1 lost 7-12%). */
static inline __attribute__((always_inline)) int
emit(sl_instance *inst, const void *data, uint32_t size, int64_t ts) {
  sl_ring *ring = inst->forward_ring;
  if (likely(ring)) {
    int rc = write_record(inst, ring, data, size, ts);
    inst->records_out += rc == 0;
    return rc;
  }
  return emit_general(inst, data, size, ts);
}

SL_EXPORT int sl_emit_ts(sl_ctx *ctx, const void *data, uint32_t size_bytes,
                         int64_t timestamp) {
  if (unlikely(ctx->in_sink || ctx->emit_closed))
    return SL_EUSAGE;
  if (unlikely(size_bytes > ctx->job->config.max_record_bytes))
    return SL_ETOOBIG;
  if (timestamp > ctx->max_timestamp) /* for the source's watermarks */
    ctx->max_timestamp = timestamp;
  return emit(ctx, data, size_bytes, timestamp);
}

SL_EXPORT int sl_emit_side(sl_ctx *ctx, int port, const void *data,
                           uint32_t size_bytes, int64_t timestamp) {
  if (port == 0)
    return sl_emit_ts(ctx, data, size_bytes, timestamp);
  if (port < 0 || port > SL_MAX_SIDE_OUTPUTS)
    return EINVAL;
  if (unlikely(ctx->in_sink || ctx->emit_closed))
    return SL_EUSAGE;
  if (unlikely(size_bytes > ctx->job->config.max_record_bytes))
    return SL_ETOOBIG;
  return emit_port(ctx, port, data, size_bytes, timestamp);
}

SL_EXPORT int sl_emit_batch(sl_ctx *ctx, const void *records,
                            uint32_t size_bytes, uint32_t count) {
  int64_t ts = ctx->current ? ctx->current->timestamp : SL_NO_TIMESTAMP;
  const uint8_t *at = records;
  sl_ring *ring = ctx->forward_ring;
  if (!ring || ts != SL_NO_TIMESTAMP || size_bytes % 8 != 0 ||
      size_bytes == 0 || ctx->in_sink || ctx->emit_closed ||
      size_bytes > ctx->job->config.max_record_bytes) {
    for (uint32_t i = 0; i < count; i++, at += size_bytes) {
      int rc = sl_emit_ts(ctx, at, size_bytes, ts);
      if (rc)
        return rc;
    }
    return 0;
  }
  /* Here the stride equals size_bytes, so a run of records is one copy. */
  assert(sl_record_stride(size_bytes, 0) == size_bytes);
  while (count > 0) {
    uint32_t got = 0;
    uint8_t *slot =
        sl_ring_append_records_producer(ring, size_bytes, 0, count, &got);
    if (unlikely(!slot)) {
      int rc = write_record(ctx, ring, at, size_bytes, SL_NO_TIMESTAMP);
      if (rc)
        return rc;
      got = 1;
    } else {
      memcpy(slot, at, (size_t)got * size_bytes);
    }
    ctx->records_out += got;
    at += (size_t)got * size_bytes;
    count -= got;
  }
  return 0;
}

SL_EXPORT int sl_emit(sl_ctx *ctx, const void *data, uint32_t size_bytes) {
  int64_t ts = ctx->current ? ctx->current->timestamp : SL_NO_TIMESTAMP;
  return sl_emit_ts(ctx, data, size_bytes, ts);
}

/* ----------------------------------------------------------- processing */

/* One record of a RECORDS entry through the operator.  Inlined into a loop
 * per operator kind, so the kind is decided once per entry.  key: the
 * record's key already computed (note 13), or NULL. */
static inline __attribute__((always_inline)) int
process_one(sl_instance *inst, enum sl_op_kind kind, int input,
            const sl_record *rec, const uint64_t *key, uint64_t hash) {
  sl_op *op = inst->op;
  switch (kind) {
  case SL_OP_MAP: {
    uint32_t out_size = 0;
    int rc = op->fn.map(op->user, rec, inst->scratch, &out_size);
    if (unlikely(rc != 0))
      return rc; /* note 8: any nonzero return fails the job */
    if (unlikely(out_size > op->out_max_bytes)) {
      sl_ctx_fail(inst, "map wrote %" PRIu32 " bytes, declared at most %" PRIu32,
                  out_size, op->out_max_bytes);
      return SL_ETOOBIG;
    }
    return emit(inst, inst->scratch, out_size, rec->timestamp);
  }
  case SL_OP_FILTER: {
    int rc = op->fn.filter(op->user, rec);
    if (rc == 1) /* note 8: 1 keeps, 0 drops, anything else fails */
      rc = emit(inst, rec->data, rec->size_bytes, rec->timestamp);
    return rc;
  }
  case SL_OP_FLAT_MAP:
    return op->fn.flat_map(op->user, rec, inst);
  default:
    if (key) { /* note 13: computed for the prefetch */
      inst->cp.current_key = *key;
      inst->cp.key_valid = true;
      inst->cp.memo_key = *key; /* and the hash state.c will need */
      inst->cp.memo_hash = hash;
    } else {
      inst->cp.key_valid = false; /* a new record: its key is computed on
                                     the first keyed-state call */
    }
    return op->fn.process.process(inst, inst->state, input, rec);
  }
}

/* Note 10: between two records of entry e (first: its first record; at:
 * the next), outside any callback.  Out of line: the loop stays small. */
static __attribute__((noinline)) int
between_records(sl_instance *inst, const sl_entry *e, const uint8_t *first,
                const uint8_t *at, uint32_t stride) {
  const sl_record *saved = inst->current;
  inst->current = 0; /* a snapshot hook runs outside any record */
  inst->cp.key_valid = false;
  int rc = sl_snapshot_between_records(
      inst, e, (uint32_t)((size_t)(at - first) / stride));
  inst->current = saved;
  return rc;
}

/* Note 13: sl_cow_map_prefetch() stage `stage` of the records of group
 * `group` among the count of a slice, if there are any. */
static inline void prefetch_group(const sl_cow_map *map,
                                  const uint64_t *hashes, uint32_t count,
                                  uint32_t group, int stage) {
  uint32_t first = group * PREFETCH_GROUP;
  if (first >= count)
    return;
  uint32_t n = count - first < PREFETCH_GROUP ? count - first : PREFETCH_GROUP;
  sl_cow_map_prefetch(map, hashes + first, n, stage);
}

/* Note 13: the records of one slice [at, end) of entry e through a
 * process operator that used keyed state, their keys computed first and
 * the state they will likely touch fetched ahead, in `stages` stages: a
 * constant in each of the two functions below, so that each has the
 * loops unrolled for its own. */
static inline __attribute__((always_inline)) int
slice_prefetched(sl_instance *inst, int input, const sl_entry *e,
                 sl_record *rec, const uint8_t *at, const uint8_t *end,
                 uint32_t stride, const uint32_t stages) {
  uint64_t keys[SL_STOP_CHECK_RECORDS];
  uint64_t hashes[SL_STOP_CHECK_RECORDS];
  uint32_t count = (uint32_t)((size_t)(end - at) / stride);
  assert(count >= 1 && count <= SL_STOP_CHECK_RECORDS);
  if (count == 0 || count > SL_STOP_CHECK_RECORDS)
    return 0; /* never (records_loop's slices); tells the compiler so */
  uint32_t data_offset = (e->flags & SL_ENTRY_HAS_TS) ? 8u : 0u;
  const sl_channel *ch = inst->current_channel;
  assert(ch && ch->key); /* sl_state_prefetch_stages() */
  /* Every record's key first (the call state.c would make on the
   * record's first state call, made here instead) and the hash its state
   * entry will likely have.  Then, a group of records at a time, the
   * buckets of the records two groups ahead are fetched and the entries
   * of those one group ahead (whose buckets arrived meanwhile), so both
   * of a record's misses were under way for a while when it is
   * processed, and a few dozen at most are in flight at once.  In a large
   * state a third stage fetches, one group ahead, the second entry of
   * each chain whose first holds another key, and the other two stages
   * run a group earlier.  The first groups of a slice get their stages
   * here, one after the other, and wait once. */
  const uint8_t *p = at;
  for (uint32_t i = 0; i < count; i++, p += stride) {
    if (data_offset)
      memcpy(&rec->timestamp, p, 8);
    rec->data = p + data_offset;
    keys[i] = ch->key(ch->key_user, rec);
  }
  sl_state_prefetch_hashes(inst, keys, count, hashes);
  const sl_cow_map *map = inst->cp.keyed;
  for (uint32_t stage = 0; stage < stages; stage++)
    for (uint32_t group = 0; group < stages - stage; group++)
      prefetch_group(map, hashes, count, group, (int)stage);
  for (uint32_t i = 0; i < count; i++, at += stride) {
    if (i % PREFETCH_GROUP == 0) {
      /* Stage s for the records stages - s groups ahead. */
      uint32_t group = i / PREFETCH_GROUP;
      for (uint32_t stage = 0; stage < stages; stage++)
        prefetch_group(map, hashes, count, group + stages - stage,
                       (int)stage);
    }
    if (data_offset)
      memcpy(&rec->timestamp, at, 8);
    rec->data = at + data_offset;
    int rc = process_one(inst, SL_OP_PROCESS, input, rec, &keys[i],
                         hashes[i]);
    if (rc)
      return rc;
  }
  return 0;
}

static __attribute__((noinline)) int
keyed_slice(sl_instance *inst, int input, const sl_entry *e, sl_record *rec,
            const uint8_t *at, const uint8_t *end, uint32_t stride) {
  return slice_prefetched(inst, input, e, rec, at, end, stride, 2);
}

/* keyed_slice with the third stage, in a large state (state.c). */
static __attribute__((noinline)) int
keyed_slice_chains(sl_instance *inst, int input, const sl_entry *e,
                   sl_record *rec, const uint8_t *at, const uint8_t *end,
                   uint32_t stride) {
  inst->cp.chain_prefetches++;
  return slice_prefetched(inst, input, e, rec, at, end, stride, 3);
}

static inline __attribute__((always_inline)) int
records_loop(sl_instance *inst, enum sl_op_kind kind, int input,
             const sl_entry *e) {
  uint32_t stride = sl_record_stride(e->record_bytes, e->flags);
  const uint8_t *at = (const uint8_t *)e + 8;
  const uint8_t *end = at + (size_t)e->count * stride;
  sl_record rec = {.size_bytes = e->record_bytes,
                   .timestamp = SL_NO_TIMESTAMP};
  inst->current = &rec;
  int rc = 0;
  /* Slices of SL_STOP_CHECK_RECORDS records: a stop is noticed within one
   * slice, not after a whole entry (up to output_batch_records records of
   * a possibly slow callback). */
  size_t slice_bytes = (size_t)SL_STOP_CHECK_RECORDS * stride;
  while (at < end && rc == 0) {
    const uint8_t *slice_end =
        (size_t)(end - at) > slice_bytes ? at + slice_bytes : end;
    uint32_t stages = 0;
    if (kind == SL_OP_PROCESS && unlikely(inst->cp.hint_kind != 0))
      stages = sl_state_prefetch_stages(inst);
    if (stages != 0) {
      assert(stages >= 2 && stages <= PREFETCH_STAGES_MAX);
      rc = stages == PREFETCH_STAGES_MAX
               ? keyed_slice_chains(inst, input, e, &rec, at, slice_end,
                                    stride)
               : keyed_slice(inst, input, e, &rec, at, slice_end, stride);
      at = rc == 0 ? slice_end : at; /* a failure ends the entry anyway */
    } else if (e->flags & SL_ENTRY_HAS_TS) {
      for (; at < slice_end && rc == 0; at += stride) {
        memcpy(&rec.timestamp, at, 8);
        rec.data = at + 8;
        rc = process_one(inst, kind, input, &rec, 0, 0);
      }
    } else {
      for (; at < slice_end && rc == 0; at += stride) {
        rec.data = at;
        rc = process_one(inst, kind, input, &rec, 0, 0);
      }
    }
    if (at < end && rc == 0 && unlikely(sl_job_stopping(inst->job)))
      rc = SL_ESTOPPED;
    /* Note 10: unaligned checkpoints act between slices too. */
    if (at < end && rc == 0 &&
        unlikely(announcement_pending(inst) || alignment_may_time_out(inst)))
      rc = between_records(inst, e, (const uint8_t *)e + 8, at, stride);
  }
  inst->current = 0;
  inst->cp.key_valid = false; /* no state access outside a record */
  return rc;
}

/* process_records with injected per-record faults: one record at a time,
 * each announced to the fault layer first (failover tests, not speed). */
static __attribute__((noinline)) int
process_records_injected(sl_instance *inst, int input, const sl_entry *e) {
  uint32_t stride = sl_record_stride(e->record_bytes, e->flags);
  const uint8_t *at = (const uint8_t *)e + 8;
  sl_record rec = {.size_bytes = e->record_bytes,
                   .timestamp = SL_NO_TIMESTAMP};
  enum sl_op_kind kind = inst->op->kind == SL_OP_SINK ? SL_OP_PROCESS
                                                       : inst->op->kind;
  int rc = 0;
  inst->current = &rec;
  for (uint32_t i = 0; i < e->count && rc == 0; i++, at += stride) {
    rc = sl_inject_records(inst, 1);
    if (rc)
      break;
    if (e->flags & SL_ENTRY_HAS_TS) {
      memcpy(&rec.timestamp, at, 8);
      rec.data = at + 8;
    } else {
      rec.data = at;
    }
    switch (kind) { /* constant arguments keep process_one's switch cheap */
    case SL_OP_MAP:
      rc = process_one(inst, SL_OP_MAP, input, &rec, 0, 0);
      break;
    case SL_OP_FILTER:
      rc = process_one(inst, SL_OP_FILTER, input, &rec, 0, 0);
      break;
    case SL_OP_FLAT_MAP:
      rc = process_one(inst, SL_OP_FLAT_MAP, input, &rec, 0, 0);
      break;
    default:
      rc = process_one(inst, SL_OP_PROCESS, input, &rec, 0, 0);
      break;
    }
    if (rc == 0 && sl_job_stopping(inst->job))
      rc = SL_ESTOPPED;
    if (rc == 0 && i + 1 < e->count &&
        unlikely(announcement_pending(inst) || alignment_may_time_out(inst)))
      rc = between_records(inst, e, (const uint8_t *)e + 8, at + stride,
                           stride); /* note 10 */
  }
  inst->current = 0;
  inst->cp.key_valid = false; /* no state access outside a record */
  return rc;
}

/* Run the operator on every record of one RECORDS entry. */
static int process_records(sl_instance *inst, int input, const sl_entry *e) {
  inst->records_in += e->count;
  inst->bytes_in += (uint64_t)e->count * e->record_bytes; /* per entry */
  if (unlikely(inst->fault != 0))
    return process_records_injected(inst, input, e);
  switch (inst->op->kind) {
  case SL_OP_MAP:
    return records_loop(inst, SL_OP_MAP, input, e);
  case SL_OP_FILTER:
    return records_loop(inst, SL_OP_FILTER, input, e);
  case SL_OP_FLAT_MAP:
    return records_loop(inst, SL_OP_FLAT_MAP, input, e);
  case SL_OP_PROCESS:
  case SL_OP_SINK:
    return records_loop(inst, SL_OP_PROCESS, input, e);
  default:
    assert(!"not a record-processing operator");
    return EINVAL;
  }
}

/* Handle the `available` published bytes of one channel. */
static int drain_channel(sl_instance *inst, sl_channel *ch,
                         uint64_t available) {
  sl_ring *r = ch->ring;
  uint64_t end = r->consumer_position + available;
  inst->current_channel = ch;
  while (r->consumer_position < end) {
    /* snapshot.c note 12: announcements are acted on between entries. */
    if (unlikely(announcement_pending(inst))) {
      int rc = sl_snapshot_announced(inst);
      if (rc)
        return rc;
      inst->current_channel = ch;
    }
    const sl_entry *e = sl_ring_peek_consumer(r);
    if (unlikely(ch->logging) && e->kind != SL_ENTRY_BARRIER &&
        e->kind != SL_ENTRY_END) {
      int rc = sl_snapshot_capture_entry(inst, ch, e, sl_entry_bytes(e));
      if (rc)
        return rc;
    }
    if (likely(e->kind == SL_ENTRY_RECORDS)) {
      if (unlikely(atomic_load_explicit(&inst->job->awaiting_first_record,
                                        memory_order_relaxed)))
        sl_failover_first_record(inst->job);
      if (unlikely(ch->idle)) {
        int rc = sl_event_channel_record(inst, ch);
        if (rc)
          return rc;
      }
      int rc = process_records(inst, ch->input, e);
      if (unlikely(rc)) {
        /* A callback that failed without sl_ctx_fail still gets a cause:
         * the value it returned (invariant 8); once per failure, never
         * per record. */
        if (rc != SL_ESTOPPED && !inst->cause[0])
          sl_ctx_fail(inst, "the %s callback returned %d",
                      inst->op->kind == SL_OP_FILTER  ? "filter"
                      : inst->op->kind == SL_OP_MAP   ? "map"
                      : inst->op->kind == SL_OP_FLAT_MAP ? "flat_map"
                                                         : "process",
                      rc);
        return rc;
      }
    } else if (e->kind == SL_ENTRY_END) {
      assert(!ch->ended);
      ch->ended = true;
      inst->channels_ended++;
      sl_ring_advance_consumer(r, sl_entry_bytes(e));
      /* END is the producer's last entry on this ring. */
      assert(sl_ring_readable_consumer(r) == 0);
      int rc = sl_snapshot_channel_ended(inst, ch);
      return rc ? rc : sl_event_channel_ended(inst);
    } else if (e->kind == SL_ENTRY_BARRIER) {
      uint64_t id = sl_entry_value(e);
      sl_ring_advance_consumer(r, sl_entry_bytes(e));
      bool block = false;
      int rc = sl_snapshot_barrier(inst, ch, id, &block);
      if (rc || block)
        return rc; /* aligned: nothing more from this channel for now */
      continue;
    } else if (e->kind == SL_ENTRY_WATERMARK || e->kind == SL_ENTRY_IDLE) {
      uint64_t v = sl_entry_value(e);
      unsigned kind = e->kind;
      sl_ring_advance_consumer(r, sl_entry_bytes(e));
      int rc = kind == SL_ENTRY_WATERMARK
                   ? sl_event_channel_watermark(inst, ch, (int64_t)v)
                   : sl_event_channel_idle(inst, ch, v != 0);
      if (rc)
        return rc;
      continue;
    }
    /* Past the records. */
    sl_ring_advance_consumer(r, sl_entry_bytes(e));
    /* A stop is noticed within one entry (one output batch), not after the
     * whole backlog. */
    if (unlikely(sl_job_stopping(inst->job)))
      return SL_ESTOPPED;
  }
  return 0;
}

/* Keyed state without checkpoints (note 6).  No delta is ever written, so
 * versions a write supersedes (a value resized, a key deleted: window and
 * join state does both all the time) would stay on the current dirty list
 * for ever.  Once that list is long, freeze it and release it at once, and
 * let the map reclaim it in bounded steps; entries then become clean and
 * later writes update them in place.  A state whose writes are in place
 * (a running sum) never reaches the threshold and pays nothing. */
#define SL_UNCHECKPOINTED_DIRTY_LIMIT 65536u
#define SL_UNCHECKPOINTED_BUDGET 4096u

static void reclaim_unversioned(sl_instance *inst) {
  sl_cow_map *m = inst->cp.keyed;
  if (inst->cp.maintain_pending) {
    inst->cp.maintain_pending =
        sl_cow_map_maintain(m, SL_UNCHECKPOINTED_BUDGET);
    return;
  }
  if (sl_cow_map_dirty_entries(m) < SL_UNCHECKPOINTED_DIRTY_LIMIT)
    return;
  sl_cow_delta d = sl_cow_map_freeze(m);
  sl_cow_map_release(m, d.epoch);
  inst->cp.maintain_pending = sl_cow_map_maintain(m, SL_UNCHECKPOINTED_BUDGET);
}

/* snapshot.c note 13: the channel state restored with the instance,
 * channel by channel in index order, through the operator as if read from
 * each channel's ring, before anything is read from the rings.  The
 * entries were checked when restored (restore.c). */
static int replay_channel_state(sl_instance *inst) {
  sl_channel_state *replay = inst->cp.replay;
  int rc = 0;
  inst->cp.replaying = true;
  for (int c = 0; c < inst->channel_count && rc == 0; c++) {
    sl_channel *ch = &inst->channels[c];
    uint64_t at = 0;
    inst->current_channel = ch;
    while (at < replay[c].bytes && rc == 0) {
      const sl_entry *e = (const sl_entry *)(replay[c].data + at);
      if (e->kind == SL_ENTRY_RECORDS) {
        if (unlikely(ch->idle))
          rc = sl_event_channel_record(inst, ch);
        if (rc == 0)
          rc = process_records(inst, ch->input, e);
      } else if (e->kind == SL_ENTRY_WATERMARK) {
        rc = sl_event_channel_watermark(inst, ch, (int64_t)sl_entry_value(e));
      } else {
        assert(e->kind == SL_ENTRY_IDLE);
        rc = sl_event_channel_idle(inst, ch, sl_entry_value(e) != 0);
      }
      at += sl_entry_bytes(e);
    }
    if (rc && rc != SL_ESTOPPED && !inst->cause[0])
      sl_ctx_fail(inst, "replaying the channel state of input %d from "
                  "checkpoint %" PRIu64 " failed (%d)", ch->input,
                  inst->cp.restored_from, rc);
  }
  inst->cp.replaying = false;
  for (int c = 0; c < inst->channel_count; c++)
    free(replay[c].data);
  free(replay);
  inst->cp.replay = 0;
  return rc;
}

/* The loop of an instance with inputs.  Returns 0 when every input ended,
 * SL_ESTOPPED on stop, or the failing callback's status. */
static int run_inputs(sl_instance *inst) {
  sl_job *job = inst->job;
  uint64_t timeout_ns = (uint64_t)job->config.buffer_timeout_us * 1000u;
  assert(timeout_ns > 0); /* resolved: never off (ring.h note 8) */
  uint64_t last_flush_ns = sl_now_ns();
  if (unlikely(inst->cp.replay != 0)) {
    int rc = replay_channel_state(inst); /* snapshot.c note 13 */
    if (rc)
      return rc;
  }
  while (inst->channels_ended < inst->channel_count) {
    bool progressed = false;
    for (int c = 0; c < inst->channel_count; c++) {
      sl_channel *ch = &inst->channels[c];
      if (ch->ended || ch->blocked)
        continue;
      uint64_t available = sl_ring_readable_consumer(ch->ring);
      if (!available)
        continue;
      /* Note 11: at most an eighth of the ring before its space goes back. */
      if (available > ch->ring->wake_threshold_bytes / 2)
        available = ch->ring->wake_threshold_bytes / 2;
      int rc = drain_channel(inst, ch, available);
      sl_ring_release_consumer(ch->ring, false);
      if (unlikely(rc))
        return rc;
      progressed = true;
    }
    /* Note 12: what this pass emitted to chained consumers is theirs now
     * (and their own timers and notifications are looked at). */
    if (unlikely(inst->chained_outputs))
      run_chain(inst, false);
    publish_counters(inst);
    if (unlikely(sl_job_stopping(job)))
      return SL_ESTOPPED;
    if (unlikely(inst->cp.keyed != 0) && !job->cp)
      reclaim_unversioned(inst);
    if (unlikely(inst->timers != 0) && sl_event_processing_due(inst)) {
      int rc = sl_event_fire_processing(inst);
      if (rc)
        return rc;
      progressed = true;
    }
    if (unlikely(sl_snapshot_notification_pending(inst))) {
      bool copy_only = sl_snapshot_copy_only(inst);
      int rc = sl_snapshot_notifications(inst);
      if (rc)
        return rc;
      if (!copy_only)
        continue; /* an abort may have unblocked channels */
    }
    /* snapshot.c note 12: announcements (a blocked channel's too) and the
     * aligned-checkpoint timeout, between passes. */
    if (unlikely(announcement_pending(inst))) {
      int rc = sl_snapshot_announced(inst);
      if (rc)
        return rc;
      continue;
    }
    if (alignment_may_time_out(inst) &&
        sl_snapshot_alignment_timed_out(inst, sl_now_ns())) {
      int rc = sl_snapshot_alignment_timeout(inst);
      if (rc)
        return rc;
      continue; /* the blocked channels are read again */
    }
    if (!progressed) {
      if (inst->channels_ended == inst->channel_count)
        break;
      if (unlikely(inst->cp.held_ack != 0)) {
        sl_snapshot_finish_held(inst); /* snapshot.c note 14: idle */
        continue;
      }
      if (!wait_until(inst, SL_WAIT_IDLE, any_input_readable, 0))
        return SL_ESTOPPED;
      last_flush_ns = sl_now_ns();
    } else {
      uint64_t t = sl_now_ns();
      if (t - last_flush_ns >= timeout_ns) {
        flush_outputs(inst, true);
        last_flush_ns = t;
      }
    }
  }
  return 0;
}

/* Note 7: the entries of one channel of an instance restored as finished,
 * up to END.  Returns 0, or SL_ESTORE (a record) with the cause set. */
static int skip_to_end(sl_instance *inst, sl_channel *ch, bool *progressed) {
  sl_ring *r = ch->ring;
  uint64_t end = r->consumer_position + sl_ring_readable_consumer(r);
  while (!ch->ended && r->consumer_position < end) {
    const sl_entry *e = sl_ring_peek_consumer(r);
    if (e->kind == SL_ENTRY_RECORDS) {
      sl_ctx_fail(inst, "checkpoint %" PRIu64 " says this instance had "
                  "finished, but input %d delivered records: the "
                  "checkpoint does not fit this job",
                  inst->cp.restored_from, ch->input);
      return SL_ESTORE;
    }
    if (e->kind == SL_ENTRY_END) {
      ch->ended = true;
      inst->channels_ended++;
    }
    sl_ring_advance_consumer(r, sl_entry_bytes(e)); /* controls: nothing */
    *progressed = true;
  }
  sl_ring_release_consumer(r, false);
  return 0;
}

/* Note 7, after the final snapshot and END: every input up to its END,
 * notifications acted on meanwhile (a complete hook is idempotent). */
static int run_finished(sl_instance *inst) {
  sl_job *job = inst->job;
  assert(inst->cp.restored_finished);
  while (inst->channels_ended < inst->channel_count) {
    bool progressed = false;
    for (int c = 0; c < inst->channel_count; c++) {
      int rc = inst->channels[c].ended
                   ? 0
                   : skip_to_end(inst, &inst->channels[c], &progressed);
      if (rc)
        return rc;
    }
    if (unlikely(sl_job_stopping(job)))
      return SL_ESTOPPED;
    if (sl_snapshot_notification_pending(inst)) {
      int rc = sl_snapshot_notifications(inst);
      if (rc)
        return rc;
      continue;
    }
    if (announcement_pending(inst)) /* finished: no snapshot to take */
      (void)sl_snapshot_announced(inst);
    if (!progressed && inst->channels_ended < inst->channel_count &&
        !wait_until(inst, SL_WAIT_IDLE, any_input_readable, 0))
      return SL_ESTOPPED;
  }
  return 0;
}

/* Note 9: a stop without drain is pending.  Ready when the request
 * changed, a trigger or a notification came (or the job stops). */
static bool stop_hold_ready(sl_instance *inst, void *arg) {
  (void)arg;
  return atomic_load(&inst->job->stop_request) != SL_STOP_REQUEST_HOLD ||
         atomic_load_explicit(&inst->cp.trigger_id, memory_order_acquire) >
             inst->cp.max_seen_id ||
         sl_snapshot_notification_pending(inst);
}

/* A source that can emit nothing until a checkpoint completes (push.c
 * note 7: its replay log is full).  Ready when a notification or a
 * trigger is to be answered, or a stop is requested: the source loop
 * (run_source) acts on each before the next next() call. */
static bool checkpoint_news(sl_instance *inst, void *arg) {
  (void)arg;
  return atomic_load(&inst->job->stop_request) != SL_STOP_REQUEST_NONE ||
         atomic_load_explicit(&inst->cp.trigger_id, memory_order_acquire) >
             inst->cp.max_seen_id ||
         sl_snapshot_notification_pending(inst);
}

/* Called inside a source's next(): spin briefly, then park on the
 * instance's parker until checkpoint_news (or the job stops). */
void sl_source_wait_checkpoint_news(sl_ctx *ctx) {
  assert(ctx->op->kind == SL_OP_SOURCE && ctx->job->cp != 0);
  (void)wait_until(ctx, SL_WAIT_IDLE, checkpoint_news, 0);
}

/* Note 9: the source obeys a stop request.  Returns SL_SOURCE_END (drain:
 * end as at the end of input), 0 (the request was withdrawn: go on),
 * SL_ESTOPPED (the job stopped) or a snapshot's failure. */
static int source_stop(sl_instance *inst) {
  sl_job *job = inst->job;
  int request = atomic_load(&job->stop_request);
  if (request == SL_STOP_REQUEST_DRAIN)
    return SL_SOURCE_END;
  /* Each turn answers a trigger, a notification or the end of the hold;
   * the hold lasts until the job stops or the stop is withdrawn (stop.c
   * note 2), so the loop is bounded by that, not by a count. */
  /* Held, the source emits no record: the stop checkpoint's barrier is
   * its last output (invariant 10, docs/DESIGN.md). */
  const uint64_t records_held = inst->records_out;
  while (request == SL_STOP_REQUEST_HOLD) {
    if (!wait_until(inst, SL_WAIT_IDLE, stop_hold_ready, 0))
      return SL_ESTOPPED;
    int rc = sl_snapshot_notifications(inst);
    if (rc == 0)
      rc = sl_snapshot_source_poll(inst); /* a barrier, and no record */
    assert(inst->records_out == records_held);
    if (rc)
      return rc;
    request = atomic_load(&job->stop_request);
  }
  (void)records_held;
  return request == SL_STOP_REQUEST_DRAIN ? SL_SOURCE_END : 0;
}

static int run_source(sl_instance *inst) {
  sl_job *job = inst->job;
  for (;;) {
    if (unlikely(sl_job_stopping(job)))
      return SL_ESTOPPED;
    if (unlikely(job->cp != 0)) {
      int rc = sl_snapshot_notifications(inst);
      if (rc == 0)
        rc = sl_snapshot_source_poll(inst);
      /* Note 9: once per next() call, and only with checkpoints on. */
      if (rc == 0 && unlikely(atomic_load_explicit(&job->stop_request,
                                                   memory_order_relaxed)))
        rc = source_stop(inst);
      if (rc == SL_SOURCE_END)
        return 0; /* drain: the end of input, without another next() */
      if (rc)
        return rc;
    }
    uint64_t emitted = inst->records_out;
    int rc = inst->op->fn.source.next(inst, inst->state);
    /* Each call ends a batch (note 2): a source that blocks inside next()
     * must not hold back what it emitted before. */
    if (inst->op->has_watermarks && (rc == 0 || rc == SL_SOURCE_END)) {
      int wrc = sl_event_source_tick(inst);
      if (wrc)
        return wrc;
    }
    flush_outputs(inst, true);
    publish_counters(inst);
    if (rc != 0 && rc != SL_SOURCE_END) {
      if (!inst->cause[0])
        sl_ctx_fail(inst, "next() returned %d", rc);
      return rc; /* note 8: any other value fails the job with it */
    }
    /* A source's records are those it emitted; an injected fault fires
     * after the call that emitted its record. */
    if (unlikely(inst->fault != 0)) {
      int injected = sl_inject_records(inst, inst->records_out - emitted);
      if (injected)
        return injected;
    }
    if (rc == SL_SOURCE_END)
      return sl_snapshot_source_poll(inst); /* a trigger that came last */
  }
}

/* Write a control entry (END, a barrier) on every output ring, waiting for
 * room if needed, then publish: consumers see it at once. */
static int write_control_all(sl_instance *inst, unsigned kind,
                             uint64_t value) {
  for (int o = 0; o < inst->output_count; o++) {
    sl_output *out = &inst->outputs[o];
    for (int k = 0; k < out->ring_count; k++) {
      sl_ring *ring = out->rings[k];
      if (sl_ring_write_control_producer(ring, kind, value))
        continue;
      append_wait w = {.ring = ring, .control_kind = kind,
                       .control_value = value};
      if (!wait_until(inst, SL_WAIT_BACKPRESSURED, try_control, &w))
        return SL_ESTOPPED;
    }
  }
  flush_outputs(inst, true);
  return 0;
}

int sl_instance_write_control(sl_instance *inst, unsigned kind,
                              uint64_t value) {
  return write_control_all(inst, kind, value);
}

int64_t sl_wall_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Barrier id on every output ring (snapshot.c note 2). */
int sl_instance_write_barrier(sl_instance *inst, uint64_t id) {
  return write_control_all(inst, SL_ENTRY_BARRIER, id);
}

int sl_instance_write_barrier_announced(sl_instance *inst, uint64_t id) {
  int rc = write_control_all(inst, SL_ENTRY_BARRIER, id);
  if (rc)
    return rc;
  /* write_control_all published every ring: the barriers are visible
   * before their announcements (ring.h note 9). */
  for (int o = 0; o < inst->output_count; o++) {
    sl_output *out = &inst->outputs[o];
    if (out->chained)
      continue; /* note 12: it read the barrier in write_control_all */
    for (int k = 0; k < out->ring_count; k++)
      sl_ring_announce_producer(out->rings[k], id,
                                out->rings[k]->barrier_position);
  }
  return 0;
}

/* ----------------------------------------------------------- chaining */

/* One turn of member m: everything readable on its one channel, its
 * timers, notifications and announcements, then its own outputs (which
 * runs its own members).  At END it finishes like an instance of its own
 * thread (sl_instance_finish_input, instance.c). */
static int member_turn_body(sl_instance *m, bool force) {
  sl_channel *ch = &m->channels[0];
  assert(m->channel_count == 1 && m->runner != m);
  if (unlikely(m->cp.replay != 0) && m->chain_phase == CHAIN_RUNNING) {
    int rc = replay_channel_state(m); /* snapshot.c note 13 */
    if (rc)
      return rc;
  }
  for (int turn = 0; turn < 4; turn++) {
    bool again = false;
    if (m->chain_phase == CHAIN_RUNNING) {
      uint64_t available;
      while (!ch->ended && !ch->blocked &&
             (available = sl_ring_readable_consumer(ch->ring)) > 0) {
        int rc = drain_channel(m, ch, available);
        sl_ring_release_consumer(ch->ring, false);
        if (unlikely(rc))
          return rc;
      }
    } else if (m->chain_phase == CHAIN_SKIPPING) {
      bool progressed = false;
      int rc = ch->ended ? 0 : skip_to_end(m, ch, &progressed);
      if (rc)
        return rc;
      if (ch->ended)
        m->chain_phase = CHAIN_FINISHED;
    }
    if (unlikely(sl_job_stopping(m->job)))
      return SL_ESTOPPED;
    if (m->chain_phase == CHAIN_RUNNING) {
      if (unlikely(m->cp.keyed != 0) && !m->job->cp)
        reclaim_unversioned(m);
      if (unlikely(m->timers != 0) && sl_event_processing_due(m)) {
        int rc = sl_event_fire_processing(m);
        if (rc)
          return rc;
      }
    }
    /* Finished, a member leaves its notifications to its end, after the
     * final checkpoint (instance_end, instance.c), as an instance of its
     * own thread does: a sink that saw the final checkpoint's completion before
     * cp_final_done was set would take it for an ordinary one and leave
     * its final output uncommitted. */
    if (m->chain_phase == CHAIN_FINISHED)
      break;
    if (unlikely(sl_snapshot_notification_pending(m))) {
      int rc = sl_snapshot_notifications(m);
      if (rc)
        return rc;
      again = true; /* an abort may have unblocked the channel */
    }
    if (unlikely(announcement_pending(m))) {
      /* Only a ring of another thread announces (sl_instance_write_
       * barrier_announced), so this is rare; a finished member has no
       * snapshot to take (run_finished). */
      int rc = sl_snapshot_announced(m);
      if (rc && m->chain_phase == CHAIN_RUNNING)
        return rc;
      again = true;
    }
    if (!again)
      break;
  }
  publish_counters(m);
  if (m->chain_phase == CHAIN_RUNNING &&
      m->channels_ended == m->channel_count) {
    m->chain_phase = CHAIN_FINISHED;
    return sl_instance_finish_input(m, 0);
  }
  flush_outputs(m, force); /* and so its own members */
  return 0;
}

/* Note 12: a member is never re-entered.  Its turn runs only from its
 * runner's publishes and waits, and nothing a member does calls upstream;
 * this checks that argument in debug builds. */
static int member_turn(sl_instance *m, bool force) {
  assert(!m->in_turn && "a chained member re-entered (runtime.c note 12)");
  m->in_turn = true;
  int rc = member_turn_body(m, force);
  m->in_turn = false;
  return rc;
}

/* Note 12: publish every chained output of inst and give each of their
 * consumers a turn.  A member that fails fails the job at once (the
 * thread's other instances then see the stop); its end comes with its
 * runner's. */
static void run_chain(sl_instance *inst, bool force) {
  for (int o = 0; o < inst->output_count; o++) {
    sl_instance *m = inst->outputs[o].chained;
    if (!m)
      continue;
    if (m->chain_phase == CHAIN_NONE || m->chain_phase == CHAIN_OVER ||
        m->chain_phase == CHAIN_STARTED)
      continue;
    int rc = member_turn(m, force);
    if (unlikely(rc)) {
      m->chain_rc = rc;
      m->chain_phase = CHAIN_OVER;
      if (rc != SL_ESTOPPED)
        sl_instance_fail(m, rc);
    }
  }
}

/* Whether a member downstream of inst in this thread has something to do
 * that no publish of inst will bring: input left over (a blocked channel
 * freed by an abort), a due timer, a notification or an announcement. */
static bool chain_attention(sl_instance *inst) {
  for (int o = 0; o < inst->output_count; o++) {
    sl_instance *m = inst->outputs[o].chained;
    if (!m || m->chain_phase == CHAIN_NONE || m->chain_phase == CHAIN_OVER ||
        m->chain_phase == CHAIN_STARTED)
      continue;
    if (m->chain_phase == CHAIN_RUNNING && m->cp.replay)
      return true;
    const sl_channel *ch = &m->channels[0];
    if (m->chain_phase != CHAIN_FINISHED && !ch->ended && !ch->blocked &&
        sl_ring_readable_consumer(ch->ring) > 0)
      return true;
    if (m->chain_phase == CHAIN_RUNNING && unlikely(m->timers != 0) &&
        sl_event_processing_due(m))
      return true;
    if (m->chain_phase != CHAIN_FINISHED && /* member_turn: at its end */
        (sl_snapshot_notification_pending(m) || announcement_pending(m)))
      return true;
    if (m->chained_outputs && chain_attention(m))
      return true;
  }
  return false;
}

/* The nearest processing-time timer of the members downstream of inst:
 * it bounds inst's sleep (wait_loop). */
static uint64_t chain_wait_ns(sl_instance *inst) {
  uint64_t wait_ns = UINT64_MAX;
  for (int o = 0; o < inst->output_count; o++) {
    sl_instance *m = inst->outputs[o].chained;
    if (!m || m->chain_phase != CHAIN_RUNNING)
      continue;
    if (m->timers) {
      uint64_t ns = sl_event_processing_wait_ns(m);
      if (ns < wait_ns)
        wait_ns = ns;
    }
    if (m->chained_outputs) {
      uint64_t ns = chain_wait_ns(m);
      if (ns < wait_ns)
        wait_ns = ns;
    }
  }
  return wait_ns;
}

/* ----------------------------------------------------------- for instance.c */

/* The loop of an instance to its end of input: 0 then, SL_ESTOPPED on a
 * stop, or the failing callback's status (the cause set). */
int sl_instance_run_loop(sl_instance *inst) {
  return inst->op->kind == SL_OP_SOURCE ? run_source(inst) : run_inputs(inst);
}

/* Note 7: an instance restored as finished, after its final snapshot and
 * END: its inputs up to their END. */
int sl_instance_run_finished(sl_instance *inst) { return run_finished(inst); }

void sl_instance_counters_publish(sl_instance *inst) { publish_counters(inst); }

static bool final_done(sl_instance *inst, void *arg) {
  (void)arg;
  return atomic_load(&inst->job->cp_final_done) != 0;
}

/* Wait for the final checkpoint to be durable (cp_final_done): true, or
 * false if the job stops first. */
bool sl_instance_wait_final(sl_instance *inst) {
  return wait_until(inst, SL_WAIT_IDLE, final_done, 0);
}
