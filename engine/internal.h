/* internal.h — the job, operator and instance structures shared by
 * graph.c (building, validating, compiling), runtime.c (the loop) and
 * instance.c (threads, start, end). */
#ifndef SL_INTERNAL_H
#define SL_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "checkpoint.h"
#include "ring.h"
#include "sluice.h"
#include "wait.h"

#define SL_EXPORT __attribute__((visibility("default")))
#define SL_ERROR_BYTES 512

enum sl_op_kind {
  SL_OP_SOURCE,
  SL_OP_MAP,
  SL_OP_FILTER,
  SL_OP_FLAT_MAP,
  SL_OP_PROCESS,
  SL_OP_SINK,
  SL_OP_KEY_BY, /* virtual: partitions the stream, no thread */
  SL_OP_UNION,  /* virtual: merges streams, no thread */
  SL_OP_SIDE,   /* virtual: one side-output port of its input */
};

static inline bool sl_op_kind_is_virtual(enum sl_op_kind k) {
  return k == SL_OP_KEY_BY || k == SL_OP_UNION || k == SL_OP_SIDE;
}

/* How records are routed along one edge. */
enum sl_partition {
  SL_PARTITION_FORWARD,   /* instance i -> instance i */
  SL_PARTITION_REBALANCE, /* round-robin over consumer instances */
  SL_PARTITION_HASH,      /* key -> key group -> instance */
};

struct sl_op {
  sl_job *job;
  enum sl_op_kind kind;
  int id;             /* creation order among all operators */
  int physical_index; /* among physical operators, -1 for virtual */
  char name[SL_MAX_NAME];
  int parallelism; /* 0 for virtual operators */
  sl_op *inputs[SL_MAX_INPUTS];
  int input_count;
  int consumer_count; /* operators that read this one's output */
  union {
    sl_source_ops source;
    sl_process_ops process; /* process and sink */
    sl_map_fn map;
    sl_filter_fn filter;
    sl_flat_map_fn flat_map;
    sl_key_fn key;
  } fn;
  void *user;
  void (*user_free)(void *); /* built-ins that own their user data */
  uint32_t out_max_bytes; /* map only */
  int port;               /* side output: the port of inputs[0] */
  bool has_watermarks;    /* source: sl_op_watermarks was called */
  bool no_chaining;       /* sl_op_disable_chaining (runtime.c note 12) */
  sl_watermark_config watermarks;
  struct sl_ctx *instances;
};

/* One input ring of an instance. */
typedef struct sl_channel { /* struct tag used by checkpoint.h */
  sl_ring *ring;
  int input; /* logical input index of the operator */
  bool ended;
  bool blocked; /* aligned barrier: not read until alignment completes */
  bool barrier_seen; /* delivered the barrier being aligned */
  uint8_t logging;   /* captures logging what is read here (snapshot.c
                        note 12); nonzero: each entry goes to them too */
  uint64_t barrier_in; /* newest barrier id read here in-band */
  sl_key_fn key; /* key function of a key-partitioned edge, else NULL */
  void *key_user;
  bool idle;         /* the producer said it is idle (timer.c) */
  int64_t watermark; /* newest watermark from this channel */
} sl_channel;

/* One outgoing edge of an instance: rings to every consumer instance it
 * feeds (for FORWARD only one). */
typedef struct sl_output {
  enum sl_partition partition;
  sl_key_fn key;
  void *key_user;
  int ring_count;
  sl_ring **rings; /* ring_count entries, consumer instance order */
  uint32_t next;   /* rebalance cursor */
  uint16_t *group_instance; /* HASH: key group -> consumer instance */
  int port; /* 0: main output; else a side output port */
  /* The one consumer instance, when it runs in this instance's thread
   * (runtime.c note 12); ring_count is then 1. */
  struct sl_ctx *chained;
} sl_output;

/* What an instance is waiting for (metrics.c note 3). */
enum sl_wait_kind {
  SL_WAIT_IDLE = 0,          /* input (or a checkpoint notification) */
  SL_WAIT_BACKPRESSURED = 1, /* room on a full output ring */
};

/* An instance's time accounting (metrics.c notes 2 and 3).  Written only by
 * the instance's own thread, once per thread start, exit and wait; readers
 * on other threads take a consistent copy through the sequence counter (a
 * seqlock: odd while the owner writes). */
typedef struct sl_instance_times {
  _Atomic uint64_t seq;
  _Atomic uint64_t alive_since_ns;  /* thread start of this attempt; 0: not
                                       running */
  _Atomic uint64_t alive_before_ns; /* lifetime of earlier attempts */
  _Atomic uint64_t idle_ns;         /* completed waits, cumulative */
  _Atomic uint64_t backpressured_ns;
  _Atomic uint64_t wait_since_ns;   /* the wait under way; 0: none */
  _Atomic int wait_kind;            /* enum sl_wait_kind of that wait */
} sl_instance_times;

/* Where a member (an instance run in another's thread, runtime.c note 12)
 * is in its life; an instance with a thread of its own stays at
 * CHAIN_NONE.  Set by instance.c (members_start, members_end) and by the
 * turns in runtime.c. */
enum chain_phase {
  CHAIN_NONE = 0,  /* not started, or over without an end to run */
  CHAIN_STARTED,   /* restored as finished, END not yet sent */
  CHAIN_RUNNING,   /* reads its channel */
  CHAIN_SKIPPING,  /* restored as finished: its input up to END
                      (runtime.c note 7) */
  CHAIN_FINISHED,  /* END sent; notifications only */
  CHAIN_OVER,      /* failed or stopped (chain_rc): its end is left */
};

/* One running instance; also the sl_ctx handed to callbacks. */
struct sl_ctx {
  sl_job *job;
  sl_op *op;
  int index;
  int cpu; /* -1: not pinned */
  pthread_t thread;
  bool thread_started;
  sl_parker parker;
  /* Chaining (runtime.c note 12).  runner: the instance whose thread runs
   * this one, itself when it has its own; every waker wakes the runner's
   * parker.  A runner lists the instances it runs besides itself, in
   * start order (upstream first); chain_phase is a member's place in its
   * life (enum chain_phase, below). */
  struct sl_ctx *runner;
  struct sl_ctx **members;
  int member_count;
  int chained_outputs; /* outputs whose consumer runs in this thread */
  int chain_phase;
  int chain_rc;        /* a member's result, for its end (instance.c) */
  bool in_turn;        /* a member inside member_turn (asserts note 12's
                          "never re-entered") */

  sl_channel *channels;
  int channel_count;
  int channels_ended;
  sl_output *outputs;
  int output_count;
  sl_ring *forward_ring; /* the only output ring, when there is one */

  void *state;           /* from the open callback */
  const sl_record *current; /* record being processed, for sl_emit's ts */
  void *scratch;         /* map output buffer */
  bool in_sink;
  bool stopped_early; /* left its loop because of a stop or failure */
  bool emit_closed;   /* END sent or leaving: sl_emit refused */
  char cause[256];    /* sl_ctx_fail text */
  sl_channel *current_channel; /* channel being drained (keyed state) */
  sl_instance_checkpoint cp;   /* checkpointing (snapshot.c) */

  struct sl_fault_cursor *fault; /* per-record injected faults (inject.c),
                                    NULL when none matches this instance */
  uint64_t records_in;  /* owner-only counters */
  uint64_t records_out;
  _Atomic uint64_t records_in_shared; /* relaxed copies for readers */
  _Atomic uint64_t records_out_shared;
  /* Event time (timer.c), owner-only.  watermark: the combined input
   * watermark (a source: the last it emitted); watermark_out: the last
   * sent downstream. */
  int64_t watermark;
  int64_t watermark_out;
  int64_t max_timestamp;   /* largest timestamp emitted (sources) */
  uint64_t watermark_due_ns; /* source: next periodic watermark */
  uint64_t last_active_ns;   /* source: last time it emitted something */
  uint64_t records_at_tick;  /* source: records_out at the last tick */
  bool output_idle;          /* IDLE was sent and not revoked */
  struct sl_timers *timers;  /* NULL until a timer is registered */
  uint64_t counters[2]; /* enum sl_counter, owner-only */
  _Atomic uint64_t counters_shared[2];
  _Atomic int64_t watermark_shared; /* relaxed copy of the event time */
  /* Metrics (metrics.c), last: the fields above keep their places on the
   * hot cache lines. */
  uint64_t bytes_in;  /* record payload bytes, owner-only */
  uint64_t bytes_out; /* written into the output rings, summed over them
                         at each flush (runtime.c, flush_outputs) */
  _Atomic uint64_t bytes_in_shared; /* relaxed copies for readers */
  _Atomic uint64_t bytes_out_shared;
  _Atomic uint64_t state_entries_shared; /* keyed state (cp.keyed) */
  _Atomic uint64_t state_bytes_shared;
  sl_instance_times times; /* busy / idle / backpressured */
};
typedef struct sl_ctx sl_instance;

/* The parker the instance's thread sleeps on: its runner's (chaining,
 * runtime.c note 12).  Whoever wakes an instance wakes this one. */
static inline sl_parker *sl_instance_parker(sl_instance *inst) {
  return &inst->runner->parker;
}

/* What a stop with a savepoint asks of the sources (stop.c note 1). */
enum sl_stop_request {
  SL_STOP_REQUEST_NONE = 0,  /* run as usual */
  SL_STOP_REQUEST_HOLD = 1,  /* emit nothing more; answer triggers (no drain) */
  SL_STOP_REQUEST_DRAIN = 2, /* end now, as at the end of input */
};

enum sl_job_state {
  SL_JOB_BUILDING,
  SL_JOB_RUNNING,
  SL_JOB_FINISHED,
};

struct sl_job {
  sl_job_config config; /* defaults filled in */
  int *cpus;            /* owned copy */
  char *state_dir;      /* owned copy of config.checkpoint.state_dir */
  char *from_savepoint; /* owned copy of config.checkpoint.from_savepoint */
  _Atomic int state; /* enum sl_job_state; read by sl_job_stop from any
                        thread while the owner changes it */
  sl_op **ops;
  int op_count;
  int physical_count;
  sl_op **physical; /* physical operators in creation order */

  sl_instance **instances; /* all instances, start order */
  int instance_count;
  int thread_count; /* instances that run in a thread of their own */
  sl_ring *rings;
  int ring_count;

  uint32_t spin_iterations; /* resolved from config (0 = automatic) */
  int usable_cpus; /* mask (or list) capped by the cgroup quota (cpus.c) */
  int *placed_cpus; /* the CPU of each pinned thread, counted in the
                       process's tally until freed (cpus.c note 8) */
  int placed_count;
  uint64_t ring_bytes;      /* resolved from config (0 = automatic) */
  _Atomic int stopping;   /* set by sl_job_stop or a failure */
  _Atomic int failed;     /* the first failure claims this */
  /* A failure's status for sl_job_wait (0: the default SL_ECALLBACK),
   * and fail_published, stored with release once status and error are
   * written (sl_job_failure): threads that do not join the instances
   * (pushers, a stop's caller) read them only after it.  A failover's
   * reset clears fail_published first. */
  _Atomic int fail_status;
  _Atomic int fail_published;
  int result;             /* what sl_job_wait returns */

  /* Checkpointing (coordinator.c, checkpoint.h); cp is NULL when it is
   * off. */
  struct sl_checkpointer *cp;
  _Atomic uint64_t cp_completed_id; /* newest complete checkpoint */
  _Atomic uint64_t cp_settled_id;   /* every id <= this one is complete or
                                       aborted (coordinator.c note 7) */
  _Atomic int cp_final_done;        /* the final checkpoint is durable */
  /* Channel-state captures dropped because their checkpoint aborted
   * before the instance could ack it (snapshot.c note 12), over the run,
   * restarts included: sl_job_captures_aborted().  Instance threads add,
   * relaxed: a count, publishing nothing. */
  _Atomic uint64_t captures_aborted;
  /* Stop with a savepoint (stop.c): the request the sources obey
   * (enum sl_stop_request, read in runtime.c's source loop), the claim
   * that makes stops one at a time, and "the job stopped with a
   * savepoint", which makes sl_job_wait return 0. */
  _Atomic int stop_request;
  _Atomic int stop_claimed;
  _Atomic int stopped_with_savepoint;
  bool waited;
  char error[SL_ERROR_BYTES];
  char name[SL_MAX_NAME]; /* sl_job_config.name, copied (default "sluice") */

  /* Metrics (metrics.c).  Set before `state` becomes RUNNING, resp. before
   * it becomes FINISHED, so a reader that saw the state sees them. */
  int64_t start_wall_ms;
  uint64_t start_ns;
  _Atomic uint64_t end_ns;
  /* Odd while a restart empties the rings (failover.c): ring counters
   * read meanwhile are discarded (metrics.c note 4). */
  _Atomic uint64_t ring_reset_seq;

  /* Failover (failover.c). */
  _Atomic int user_stopped;     /* sl_job_stop() was called: no restart */
  _Atomic int restarts_over;    /* the supervisor returned: whatever has
                                   stopped now stays stopped (push.c) */
  _Atomic uint64_t failed_ns;   /* when the current failure was detected */
  _Atomic int awaiting_first_record; /* set at a restart, cleared by the
                                        first instance to process a record */
  _Atomic uint64_t first_record_ns;
  _Atomic int restores_pending;  /* instances still restoring their state */
  _Atomic uint64_t restored_ns;  /* when the last one finished */
  bool restarting;              /* open_store/restore resume regardless of
                                   store_policy: the store is our own */
  bool supervisor_started;
  pthread_t supervisor;
  sl_parker supervisor_parker;  /* woken by sl_job_stop during a delay */
  struct sl_failover *failover;
  /* Byte-string keys (state.c): the test hook's hash, NULL: XXH3. */
  uint64_t (*key_hash)(const void *key, uint32_t key_bytes);
  /* sl_testing_fail_state_index: armed in each keyed map as it is made
   * (restore.c); 0: never. */
  uint32_t test_index_fail_nth;
  uint32_t test_copy_budget; /* sl_testing_state_copy_budget; 0: default */
  /* sl_testing_state_chain_prefetch: the state size from which chains'
   * second entries are fetched ahead, instead of state.c's default. */
  bool test_chain_prefetch;
  uint64_t test_chain_prefetch_bytes;
  /* Fault injection (inject.c). */
  struct sl_fault_plan *faults; /* NULL: none */
  char *faults_text;            /* owned copy of config.faults */
  _Atomic int attempt_fault_fired; /* a fault that fails the job fired in
                                      this attempt (inject.c) */
  /* Serializes "is the attempt failing?", taking an occurrence number and
   * claiming the attempt, for occurrence-counted faults (inject.c).  Only
   * initialized (fault_lock_ready) when the job has a fault plan. */
  pthread_mutex_t fault_lock;
  bool fault_lock_ready;
  char store_fault_text[256];   /* the store fault that fired last (writer
                                   thread), for the failure message */
};

/* graph.c */
void sl_job_set_error(sl_job *job, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
int sl_job_compile(sl_job *job);
void sl_job_free_compiled(sl_job *job);

/* job.c: the caller's config (NULL: all defaults) into out, read by its
 * struct_bytes (sluice.h ABI); EINVAL, with a log line, for a size this
 * library cannot read. */
int sl_job_config_read(const sl_job_config *in, sl_job_config *out);

/* push.c: the failover supervisor returned (no attempt follows); wake
 * the job's sleeping pushers and pollers (push.c note 4). */
void sl_push_job_over(sl_job *job);
/* runtime.c: inside a source's next(), park until a checkpoint
 * notification, a trigger or a stop request is pending (push.c note 7). */
void sl_source_wait_checkpoint_news(sl_ctx *ctx);
/* timer.c: inside a source's next(), before it waits for more input: it
 * has emitted all it has, so an advanced watermark goes out now (timer.c
 * note 2).  Does nothing for a source without watermarks. */
void sl_source_caught_up(sl_ctx *ctx);

/* The failure's status once published (fail_published): true and
 * *status; false while none is (a failure may be claimed, not yet
 * written).  Any thread. */
static inline bool sl_job_failure(sl_job *job, int *status) {
  if (!atomic_load_explicit(&job->fail_published, memory_order_acquire))
    return false;
  int s = atomic_load_explicit(&job->fail_status, memory_order_relaxed);
  *status = s ? s : SL_ECALLBACK;
  return true;
}

/* instance.c */
void sl_instance_fail(sl_instance *inst, int status);
/* Stop every instance without marking the stop as the user's (a failure
 * does this; sl_job_stop() also records that the user asked). */
void sl_job_stop_internal(sl_job *job);
/* Start every instance thread; on failure fails the job and returns the
 * status (threads already started keep running until stopped). */
int sl_job_start_threads(sl_job *job);
void sl_job_join_threads(sl_job *job);
/* After the end of input (rc 0) or a failure (rc): the timers the end
 * fires, finish, the final snapshot and END; a chained member's too
 * (runtime.c, member_turn). */
int sl_instance_finish_input(sl_instance *inst, int rc);

/* runtime.c, for instance.c: the loop (run_source or run_inputs; an
 * instance restored as finished: run_finished), the counters' shared
 * copies, and the wait for the final checkpoint (false: the job stopped
 * first). */
int sl_instance_run_loop(sl_instance *inst);
int sl_instance_run_finished(sl_instance *inst);
void sl_instance_counters_publish(sl_instance *inst);
bool sl_instance_wait_final(sl_instance *inst);

/* job->stopping, read on the instances' own threads: a relaxed load, as
 * each loop looks again after preparing to park (runtime.c note 4). */
static inline bool sl_job_stopping(const sl_job *job) {
  return atomic_load_explicit(&job->stopping, memory_order_relaxed) != 0;
}

/* operators/sources.c: restored operator state as count 64-bit words;
 * SL_ENOTFOUND if none was saved, EINVAL (instance failed, naming what)
 * for another size. */
int sl_operator_state_words(sl_ctx *ctx, uint64_t id, const char *what,
                            uint64_t *words, uint32_t count);

/* timer.c: event time and timers */
void sl_event_reset(sl_instance *inst);   /* created state (also failover) */
void sl_event_free(sl_instance *inst);
int sl_event_restore(sl_instance *inst);  /* rebuild timers from the state */
int sl_event_channel_watermark(sl_instance *inst, sl_channel *ch,
                               int64_t watermark);
int sl_event_channel_idle(sl_instance *inst, sl_channel *ch, bool idle);
int sl_event_channel_ended(sl_instance *inst);
int sl_event_source_tick(sl_instance *inst); /* after each next() */
int sl_event_source_end(sl_instance *inst);  /* SL_WATERMARK_MAX */
int sl_event_input_end(sl_instance *inst);   /* every input ended */
bool sl_event_processing_due(sl_instance *inst);
uint64_t sl_event_processing_wait_ns(sl_instance *inst); /* UINT64_MAX: none */
int sl_event_fire_processing(sl_instance *inst);
/* A record arrived on an idle channel: it is active again. */
int sl_event_channel_record(sl_instance *inst, sl_channel *ch);

/* runtime.c, for timer.c */
int sl_instance_write_control(sl_instance *inst, unsigned kind,
                              uint64_t value);
int64_t sl_wall_ms(void);

/* metrics.c: time accounting on the instance's own thread (note 3). */
void sl_times_thread_start(sl_instance *inst);
void sl_times_thread_exit(sl_instance *inst);
uint64_t sl_times_wait_begin(sl_instance *inst, enum sl_wait_kind kind);
void sl_times_wait_end(sl_instance *inst, enum sl_wait_kind kind,
                       uint64_t since_ns);

/* checkpoint_stats.c, for metrics.c: the checkpoint counts, latest completed
 * and failed, restored id, and with history the newest entries (history
 * and history_instances arrays allocated by the caller for
 * SL_CHECKPOINT_HISTORY entries), all under one lock. */
void sl_checkpointer_metrics(const sl_job *job, sl_metrics *m, bool history);

/* graph.c: the compiled job's wiring is whole (every ring one channel and
 * one output, ports and partitions in range); for asserts, while no
 * instance thread runs. */
bool sl_graph_check(const sl_job *job);

/* failover.c */
int sl_failover_setup(sl_job *job);     /* sl_job_start, before threads */
int sl_failover_start(sl_job *job);     /* the supervisor thread, if any */
bool sl_failover_wait(sl_job *job);     /* join it; false if there is none */
void sl_failover_free(sl_job *job);
void sl_failover_note_failure(sl_job *job); /* the first claim of failed */
void sl_failover_first_record(sl_job *job); /* after a restart */
int sl_restart_validate(const struct sl_restart_config *r);

/* inject.c: the engine's side of fault injection (fault.h) */
int sl_inject_setup(sl_job *job);
void sl_inject_free(sl_job *job);
void sl_inject_restart(sl_job *job); /* per-attempt counters restart */
int sl_inject_records(sl_instance *inst, uint64_t n); /* n records processed
                                     next; 0, or a failure (cause set) */
/* An occurrence of kind (sub: call or point, or -1) at inst (NULL: none):
 * 0, or the failure status with the cause in inst->cause when inst. */
int sl_inject_occurrence(sl_job *job, sl_instance *inst, int kind, int sub,
                         char *cause, size_t cause_bytes);
void sl_inject_crash_point(sl_job *job, int point); /* may not return */
int sl_inject_store_call(void *arg, enum sl_store_call call);
/* Fail the whole job with status (returned by sl_job_wait) and a message,
 * unless it failed already; then stop it. */
void sl_job_fail(sl_job *job, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int sl_instance_write_barrier(sl_instance *inst, uint64_t id);
/* The same, then the announcement of id on every output ring (ring.h
 * note 9; snapshot.c note 12). */
int sl_instance_write_barrier_announced(sl_instance *inst, uint64_t id);
uint64_t sl_now_ns(void);

/* Emitting on behalf of a record with another time (window results at
 * end - 1, join pairs at the later of their two times): sl_emit stamps
 * with ctx->current's timestamp, so point it at a copy that carries ts
 * until sl_emit_stamp_end().  The key must be computed already, or state
 * calls would take it from the copy (asserted). */
typedef struct sl_emit_stamp {
  const sl_record *saved;
  sl_record record;
} sl_emit_stamp;

static inline void sl_emit_stamp_begin(sl_ctx *ctx, sl_emit_stamp *st,
                                       int64_t ts) {
  assert(ctx->cp.key_valid);
  st->saved = ctx->current;
  st->record = st->saved ? *st->saved : (sl_record){.data = 0};
  st->record.timestamp = ts;
  ctx->current = &st->record;
}

static inline void sl_emit_stamp_end(sl_ctx *ctx, const sl_emit_stamp *st) {
  ctx->current = st->saved;
}

/* A byte-string key_by (sl_op_key_by_bytes, state.c): its op->user.  The
 * edges it partitions carry sl_byte_key_route as their sl_key_fn, with this
 * as the key_user, so the producer's routing (runtime.c, emit_port) is the
 * same indirect call as for 64-bit keys; the consumer tells a byte-keyed
 * channel by that function (sl_channel_bytes) and computes the key's bytes
 * itself (sl_byte_key_compute), once per record. */
typedef struct sl_byte_key {
  sl_key_bytes_fn fn;
  void *user;
  const sl_op *op; /* the key_by, named in failures */
} sl_byte_key;

/* The routing key of a record on a byte-keyed edge: the hash of its key
 * bytes.  A failing key function fails the job (naming the key_by) and
 * routes the record by hash 0; the producer stops at its next check. */
uint64_t sl_byte_key_route(void *user, const sl_record *in);
/* The hash of key bytes: sl_hash_bytes, or the test hook's function
 * (sl_testing_set_key_hash). */
uint64_t sl_byte_key_hash(const sl_job *job, const void *key,
                          uint32_t key_bytes);
/* Compute the current record's key through byte-keyed channel ch into
 * ctx->cp (current_key = hash, key_data/key_data_bytes = a copy of the
 * bytes, key_valid).  0, or the failure (cause set in ctx). */
int sl_byte_key_compute(sl_ctx *ctx, const sl_channel *ch);

/* Keyed state's prefetch (runtime.c note 13).  sl_state_prefetch_stages():
 * the sl_cow_map_prefetch() stages worth running for the records now read
 * (through ctx->current_channel): 0 (no prefetch) unless the instance has
 * keyed state with 64-bit keys, larger than SL_PREFETCH_MIN_STATE_BYTES,
 * the channel has a key function, and the operator made a keyed-state
 * call without a user key (its (state id, kind) is the guess); then 2, or
 * 3 when the state is at least SL_PREFETCH_CHAIN_MIN_STATE_BYTES
 * (state.c), where a chain's second entry is a miss to memory too.
 * sl_state_prefetch_hashes(), only when not 0: set
 * hashes[i] to the map hash of that guess for record_keys[i] (count of
 * them, 1 to SL_COW_PREFETCH_MAX) and point the instance's memo at them
 * (checkpoint.h): the caller then sets memo_key and memo_hash to each
 * record's before it is processed. */
uint32_t sl_state_prefetch_stages(const sl_ctx *ctx);
void sl_state_prefetch_hashes(sl_ctx *ctx, const uint64_t *record_keys,
                              uint32_t count, uint64_t *hashes);

static inline bool sl_channel_bytes(const sl_channel *ch) {
  return ch->key == sl_byte_key_route;
}

/* Copy the text src into dst of dst_bytes (> 0), cut if need be. */
static inline void sl_copy_text(char *dst, size_t dst_bytes, const char *src) {
  size_t n = strnlen(src, dst_bytes - 1);
  memcpy(dst, src, n);
  dst[n] = 0;
}

/* Big-endian 64-bit integers in keys (byte order = numeric order). */
static inline void sl_store_be64(uint8_t *out, uint64_t v) {
  for (int i = 7; i >= 0; i--, v >>= 8)
    out[i] = (uint8_t)v;
}
static inline uint64_t sl_load_be64(const uint8_t *in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v = v << 8 | in[i];
  return v;
}

/* A 64-bit finaliser (murmur3's fmix64): spreads consecutive keys. */
static inline uint64_t sl_mix64(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

/* Key group of key among max_parallelism groups: a multiply-shift range
 * reduction of the mixed key (no division on the hot path). */
static inline uint32_t sl_key_group(uint64_t key, uint32_t max_parallelism) {
  return (uint32_t)(((sl_mix64(key) >> 32) * max_parallelism) >> 32);
}

/* The instance owning a key group: contiguous ranges of groups. */
static inline int sl_group_instance(uint32_t group, uint32_t max_parallelism,
                                    int parallelism) {
  return (int)((uint64_t)group * (uint32_t)parallelism / max_parallelism);
}

#endif /* SL_INTERNAL_H */
