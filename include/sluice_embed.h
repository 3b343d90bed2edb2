/* sluice_embed.h — generator source, push source, callback sink,
 * exactly-once sink, Kafka source and sink (operators/generator.c,
 * operators/push.c, operators/wal_sink.c, operators/kafka_*.c).  Included
 * by sluice.h.
 *
 * OVERVIEW
 *
 * - sl_source_generator(): a deterministic, replayable source of sl_event
 *   records for event-time tests and benchmarks.  Event i is a pure
 *   function of (config, i): its key, value and timestamp, out of order
 *   within a bound or late beyond it, as configured.  sl_generator_event()
 *   computes the same event outside the engine, so a test can check what a
 *   job produced against an independent reference.
 * - sl_source_push(): a source fed by the application's own threads
 *   (sl_push_record(), sl_push_record_at()) while the job runs; the way to
 *   embed sluice in a service that receives its input elsewhere.  Its
 *   records carry positions in the application's own log, which are
 *   checkpointed: after a resume, sl_push_resume_position() says where to
 *   push from, so the input side is exactly-once.  Results reach the
 *   application exactly once through sl_sink_exactly_once() (or, as table
 *   rows, sl_sink_table() of sluice_table.h).
 * - sl_sink_callback(): a sink that hands every record to an application
 *   function, with optional checkpoint notifications so the application
 *   can commit exactly-once (see its CAVEAT below).
 * - sl_sink_exactly_once(): a write-ahead sink that stores the results of
 *   each checkpoint with it and hands them to the application, with the
 *   checkpoint's id, once it is durable, and again after a crash until the
 *   application acknowledged them: the application only has to be
 *   idempotent per checkpoint id.
 *
 * CAVEATS
 *
 * - The push source is replayable through the application: it checkpoints
 *   the position of the last record it emitted before each barrier, and a
 *   job resumed from its state directory (SL_STORE_RESUME) or a savepoint
 *   starts with an empty queue: the application asks
 *   sl_push_resume_position() and pushes again from there.  Records at or
 *   below the restored position are dropped (sl_push_dropped() counts
 *   them), so pushing again from an earlier position is harmless.
 * - In-process restarts (a restart strategy with checkpointing) are
 *   exactly-once with no help from the application: the source keeps the
 *   records it emitted since the newest completed checkpoint in a replay
 *   log and emits those after the restored position again, then the rest
 *   of its queue.  The log holds at most 262144 records by default
 *   (sl_push_set_replay_capacity()); when it is full the source emits
 *   nothing until a checkpoint completes, so pushers wait: checkpoint
 *   often enough for the push rate.  Without checkpointing a restart
 *   loses the records in flight (at-most-once for them); records still in
 *   the queue survive it.
 * - Positions are uint64_t; UINT64_MAX is reserved.  A source that used
 *   positions once takes only positions (sl_push_record_at(),
 *   sl_push_try_record_at(), sl_push_items() with positions), one that
 *   was numbered only the numbered forms: the first push fixes the form.
 * - A pusher whose job failed and will not be restarted gets the failure's
 *   status (what sl_job_wait() returns; the message is in sl_job_error()),
 *   not SL_ESTOPPED, which stays for sl_job_stop() and a finished job.
 * - The sl_push handle belongs to the job: valid from sl_source_push() until
 *   sl_job_destroy().  Every sl_push_* call must have returned before the
 *   job is destroyed, and none may be made after.
 * - The callback sink calls its function on the sink's instance threads:
 *   with parallelism above 1, calls from different instances run
 *   concurrently (calls for one instance never overlap).
 * - The callback sink hands each record over once, as it arrives: nothing
 *   stores it.  With checkpoint notifications the application must make
 *   its pre-committed records durable itself at SL_CALLBACK_SNAPSHOT: a
 *   crash between the checkpoint's commit and SL_CALLBACK_COMPLETE loses
 *   whatever it held only in memory, since the restored job does not
 *   replay records of a checkpoint that completed.  sl_sink_exactly_once()
 *   closes this hole (the store keeps the records until acknowledged), and
 *   sl_sink_table() writes rows in the checkpoint itself.
 * - sl_sink_exactly_once() calls its function on the sink's instance
 *   threads too, and may call it again with a checkpoint id it delivered
 *   before (see its contract).
 *
 * CONCURRENCY
 *
 *   call                          may be called from
 *   ----------------------------  -------------------------------------------
 *   sl_source_generator,          the building thread, before the job starts
 *   sl_source_push,
 *   sl_sink_callback,
 *   sl_sink_callback_checkpoints,
 *   sl_sink_exactly_once,
 *   sl_source_kafka, sl_sink_kafka
 *   sl_generator_event,           any thread, any time (pure functions)
 *   sl_generator_range,
 *   sl_generator_validate
 *   sl_push_set_replay_capacity   the building thread, before the job starts
 *   sl_push_record, sl_push_batch any number of threads at once, before and
 *   sl_push_record_at,            while the job runs and after it ended
 *   sl_push_try_record,
 *   sl_push_try_record_at,
 *   sl_push_items
 *   sl_push_resume_position       any thread after sl_job_start (it waits
 *                                 for the source's restore)
 *   sl_push_fd, sl_push_dropped   any thread, any time until sl_job_destroy
 *   sl_push_close                 any thread, any number of times
 */
#ifndef SLUICE_EMBED_H
#define SLUICE_EMBED_H

#include "sluice.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Generator source (operators/generator.c). */

/** One generated event: 32 bytes.  ts is also the record's timestamp. */
typedef struct sl_event {
  uint64_t key;
  uint64_t value;
  int64_t ts;   /* event time */
  uint64_t seq; /* the event's index i, 0 .. count-1 */
} sl_event;

/** What a generator emits.  Zero-initialise, then set what you need.
 *
 * Event i (0 .. count-1):
 * - key: i % keys when sequential_keys, else a seeded hash of i reduced to
 *   0 .. keys-1 (every key about equally often);
 * - value: i, or a seeded 64-bit hash of i when random_values;
 * - seq: i;
 * - ts: base_i - delay_i, with base_i = start_ts + i * step (the
 *   generator's event-time clock) and delay_i drawn from the seed:
 *     with probability late_fraction, uniform in
 *       [late_delay_min, late_delay_max] (late: behind the bound);
 *     with probability disorder, uniform in [0, max_delay] (out of order,
 *       within the bound);
 *     otherwise 0.
 *
 * Guarantees, per generator instance (each emits its range in index order):
 * - an event that is not late is never more than max_delay behind the
 *   largest timestamp the instance emitted before it, so a watermark with
 *   out_of_orderness = max_delay (sl_op_watermarks) never makes it late;
 * - a late event is at least late_delay_min behind its own base, and more
 *   than max_delay behind the largest timestamp the instance emitted before
 *   it whenever g * step < late_delay_min - 2 * max_delay, g being how many
 *   positions back the last event before it that was not late is (with
 *   step 1, max_delay 50, late_delay_min 200: within 99 positions), so such
 *   a watermark, once it caught up with that event, makes it late. */
typedef struct sl_generator_config {
  uint64_t count;      /* events in all, over every instance */
  uint64_t seed;       /* any value; equal seeds give equal events */
  uint64_t keys;       /* distinct keys, >= 1 */
  int sequential_keys; /* 1: key = i % keys; 0: hashed (see above) */
  int random_values;   /* 1: value = seeded hash of i; 0: value = i */
  int64_t start_ts;    /* base of event 0 */
  int64_t step;        /* timestamp units per event, >= 0 */
  double disorder;     /* 0 .. 1: fraction delayed within max_delay */
  int64_t max_delay;   /* >= 0: the out-of-orderness bound */
  double late_fraction;   /* 0 .. 1, disorder + late_fraction <= 1 */
  int64_t late_delay_min; /* > max_delay when late_fraction > 0 */
  int64_t late_delay_max; /* >= late_delay_min */
  /** Events per second per instance; 0: as fast as the job takes them.
   * The limiter lets an instance emit at most what its schedule allows;
   * after a stall (back pressure) it catches up by at most one batch of
   * 1024 events, then keeps to the rate. */
  uint64_t events_per_second;
} sl_generator_config;

/** Check a configuration.  Returns 0, or EINVAL with the first problem
 * written to err (NUL-terminated, cut to err_bytes; err may be NULL):
 * cfg NULL, keys 0, step or max_delay negative, a probability outside
 * 0 .. 1 or both summing above 1, late delays not beyond max_delay or
 * min above max, or timestamps that would not fit in int64_t (or reach
 * SL_NO_TIMESTAMP). */
int sl_generator_validate(const sl_generator_config *cfg, char *err,
                          size_t err_bytes);
int sl_generator_validate_sized(const sl_generator_config *cfg, char *err,
                                size_t err_bytes, size_t cfg_bytes);
#define sl_generator_validate(...)                                             \
  sl_generator_validate_sized(__VA_ARGS__, sizeof(sl_generator_config))

/** A source of parallelism instances emitting the events of cfg (copied).
 * Instance k emits the contiguous index range [count*k/P, count*(k+1)/P)
 * in index order (sl_generator_range), up to 1024 events per next() call,
 * each with sl_emit_ts(event.ts).  Replayable: the position (next index,
 * with the seed and count to refuse a changed configuration) is
 * checkpointed and restored.
 * Errors: EINVAL (sl_generator_validate failed, op NULL; the reason is in
 * sl_job_error()), as the builders. */
int sl_source_generator(sl_job *job, const char *name, int parallelism,
                        const sl_generator_config *cfg, sl_op **op);
int sl_source_generator_sized(sl_job *job, const char *name, int parallelism,
                              const sl_generator_config *cfg, sl_op **op,
                              size_t cfg_bytes);
#define sl_source_generator(...)                                               \
  sl_source_generator_sized(__VA_ARGS__, sizeof(sl_generator_config))

/** Event i of cfg, exactly as the generator emits it.  cfg must be valid
 * (sl_generator_validate) and i below cfg->count. */
void sl_generator_event(const sl_generator_config *cfg, uint64_t i,
                        sl_event *out);
/** The sized call returns 0, or EINVAL (out zeroed) for a cfg_bytes it
 * cannot read (sluice.h, ABI); the unsized symbol cannot say so. */
int sl_generator_event_sized(const sl_generator_config *cfg, uint64_t i,
                             sl_event *out, size_t cfg_bytes);
#define sl_generator_event(...)                                                \
  sl_generator_event_sized(__VA_ARGS__, sizeof(sl_generator_config))

/** The index range [*begin, *end) that instance (0 .. parallelism-1) of a
 * generator of count events emits: [count*instance/parallelism,
 * count*(instance+1)/parallelism).  An empty range (0, 0) for an instance
 * outside 0 .. parallelism-1. */
void sl_generator_range(uint64_t count, int parallelism, int instance,
                        uint64_t *begin, uint64_t *end);

/* ------------------------------------------------------------------------ */
/* Push source (operators/push.c). */

typedef struct sl_push sl_push;

/** A source (parallelism 1) that emits what application threads push, in
 * the order the pushes took effect; it ends once sl_push_close() was
 * called and everything pushed before was emitted.
 *
 * Between the pushers and the source instance is a bounded queue of
 * capacity_records records (0: 4096; at most 1 << 24).  The source takes
 * the whole queue at once and emits it in batches of up to 1024, so up to
 * 2 * capacity_records records (and their bytes) are held at a time.
 * *push (valid until sl_job_destroy) is the handle to push with.  Each
 * record has a position (see CAVEATS and sl_push_record_at()), which the
 * source checkpoints.  Errors: EINVAL (capacity over 1 << 24, op or
 * push NULL), ENOMEM, as the builders; *push is NULL on error. */
int sl_source_push(sl_job *job, const char *name, uint32_t capacity_records,
                   sl_op **op, sl_push **push);

/** Queue one record (its bytes are copied) with timestamp (SL_NO_TIMESTAMP
 * for none).  Thread-safe; pushes may start before sl_job_start(), they
 * are queued.  While the queue is full the caller waits: it spins briefly,
 * then sleeps on a condition variable until the source takes the queue.
 * The numbered form: the source numbers its records itself as it emits
 * them, 0, 1, 2 ... on a fresh start and from the restored position + 1
 * after a resume (sl_push_resume_position() gives that number).
 * Returns 0 (queued), or:
 *   EINVAL        p NULL, or data NULL with size_bytes above 0;
 *   SL_ETOOBIG    size_bytes over the job's max_record_bytes;
 *   SL_EUSAGE     sl_push_close() was called (also while this call waited),
 *                 or the source takes positions (sl_push_record_at());
 *   SL_ESTOPPED   the job was stopped, has finished, or a stop with drain
 *                 (sl_job_stop_with_savepoint, SL_STOP_DRAIN) was asked
 *                 for: nothing will take the record (a waiting pusher
 *                 notices at once);
 *   (status)      the job failed and will not be restarted: the failure's
 *                 status, as sl_job_wait() returns it (e.g. what a callback
 *                 returned), with the message in sl_job_error();
 *   ENOMEM        the queue's buffer could not grow.
 * On error the record was not queued.  With a restart strategy a pusher
 * keeps waiting through a failover; if the strategy then gives up, it
 * returns the failure's status as soon as the supervisor decides (no
 * sl_job_wait() needed), or SL_ESTOPPED at once after sl_job_stop(). */
int sl_push_record(sl_push *p, const void *data, uint32_t size_bytes,
                   int64_t timestamp);

/** Queue count records of size_bytes each, stored back to back at
 * records, with timestamps[i] (timestamps NULL: none).  The same as count
 * sl_push_record() calls (numbered form), with the lock taken once per run
 * of records that fit; another pusher's records may come between runs.
 * *pushed (if not NULL) receives how many were queued; on error, those
 * before the failing one were.  Errors: as sl_push_record(). */
int sl_push_batch(sl_push *p, const void *records, uint32_t size_bytes,
                  uint32_t count, const int64_t *timestamps, uint32_t *pushed);

/** Queue one record with the application's position: its offset in the
 * application's own log, strictly increasing per push source (over every
 * pushing thread), below UINT64_MAX.  The source checkpoints the position
 * of the last record it emitted before each barrier.  A record at or below
 * the restored position (sl_push_resume_position() - 1) is dropped: the
 * call returns 0 without queueing it and sl_push_dropped() counts it (one
 * pushed before the restore was decided is queued, then dropped by the
 * source, and counted then).  Errors: as sl_push_record(), and EINVAL
 * (position not above the last one pushed, or UINT64_MAX), SL_EUSAGE
 * (the source was used with the numbered forms). */
int sl_push_record_at(sl_push *p, uint64_t position, const void *data,
                      uint32_t size_bytes, int64_t timestamp);

/** Non-blocking forms of sl_push_record() and sl_push_record_at(): when
 * the queue is full they return EAGAIN at once (nothing queued) instead of
 * waiting, and arm sl_push_fd(): it becomes readable when the source next
 * makes room.  Errors: as the blocking forms, and EAGAIN. */
int sl_push_try_record(sl_push *p, const void *data, uint32_t size_bytes,
                       int64_t timestamp);
int sl_push_try_record_at(sl_push *p, uint64_t position, const void *data,
                          uint32_t size_bytes, int64_t timestamp);

/** One record of sl_push_items(): its bytes (copied), size, timestamp
 * (SL_NO_TIMESTAMP for none) and, on a source that takes positions, its
 * position (ignored by a numbered source). */
typedef struct sl_push_item {
  const void *data;
  uint32_t size_bytes;
  int64_t timestamp;
  uint64_t position;
} sl_push_item;

/** Flags of sl_push_items(). */
enum sl_push_flags {
  /** Return EAGAIN when the queue is full, as sl_push_try_record(). */
  SL_PUSH_NONBLOCK = 1,
  /** The items' positions are used even on the source's first push,
   * which then fixes it to take positions (else a first sl_push_items()
   * fixes the numbered form). */
  SL_PUSH_POSITIONED = 2,
};

/** Queue count records of any sizes, in order: the same as count calls of
 * the single-record form of the source (sl_push_record_at() on a source
 * that takes positions, else sl_push_record()), with the lock taken once
 * per run of records that fit.  flags: 0 or a combination of
 * enum sl_push_flags; with SL_PUSH_NONBLOCK a full queue stops the call
 * with EAGAIN.  *pushed (if not NULL) receives how many items were taken
 * (queued, or dropped as at or below the restored position): on EAGAIN or
 * an error, the items from *pushed on were not.  Errors: as
 * sl_push_record_at() for the item at *pushed, EAGAIN, EINVAL (items NULL
 * with count above 0, unknown flags), SL_EUSAGE (SL_PUSH_POSITIONED on a
 * numbered source). */
int sl_push_items(sl_push *p, const sl_push_item *items, uint32_t count,
                  int flags, uint32_t *pushed);

/** After sl_job_start(): wait until the source instance has restored its
 * position (or the start found nothing to restore) and set *next_position
 * to the first position the application must push next: 0 on a fresh
 * start, the restored position + 1 after a resume (a state_dir with
 * SL_STORE_RESUME, or from_savepoint).  In the numbered form it is the
 * number the next pushed record gets.  The answer is the run's first
 * restore: in-process restarts replay by themselves (CAVEATS) and do not
 * change it.  Usually it returns within milliseconds of the start.
 * Errors: EINVAL (an argument NULL), SL_ENOTSTARTED (before
 * sl_job_start()), or, when the job ends before the source restored, what
 * a push would get then (SL_ESTOPPED, or the failure's status). */
int sl_push_resume_position(sl_push *p, uint64_t *next_position);

/** Records dropped so far as at or below the restored position (see
 * sl_push_record_at()); 0 for NULL. */
uint64_t sl_push_dropped(const sl_push *p);

/** A file descriptor for poll/epoll/libuv: an eventfd (non-blocking,
 * close-on-exec), made by the first call and owned by the job (closed by
 * sl_job_destroy(); do not close it).  It becomes readable when room
 * appears in the queue after a non-blocking push got EAGAIN, and when the
 * job stops (also as soon as a stop with drain is asked for), fails, is
 * closed or will not restart (the next try then returns the end's
 * status).  Reset it by reading its 8-byte counter
 * (read(fd, &u64, 8); EAGAIN from that read means it was already reset)
 * before the next try, and wait on it only after a try returned EAGAIN:
 * a try that finds room does not arm it.  Returns the descriptor, or a
 * negative errno value (-EINVAL for NULL, or eventfd()'s, e.g. -EMFILE). */
int sl_push_fd(sl_push *p);

/** The replay log's bound in records (0: the default, 262144; at most
 * 1 << 28); see CAVEATS.  Its memory is that of the records it holds
 * (a 24-byte header each, payloads padded to 8 bytes), growing as
 * needed.  Only a job with checkpointing and a restart strategy keeps
 * the log.  Errors: EINVAL (p NULL, over the maximum), SL_ESTARTED. */
int sl_push_set_replay_capacity(sl_push *p, uint32_t records);

/** End of input: the source ends once everything pushed before this call
 * was emitted.  Pushes after it (and pushers waiting for room) get
 * SL_EUSAGE.  Idempotent; NULL is accepted. */
void sl_push_close(sl_push *p);

/* ------------------------------------------------------------------------ */
/* Callback sink (operators/push.c). */

/** Called for each record, on the sink instance's thread (instance: 0 ..
 * parallelism-1).  Return 0 to go on; any other value fails the job with
 * it (sluice.h, CALLBACK RETURNS); its message names the sink, the
 * instance, the value returned and the record's number. */
typedef int (*sl_callback_fn)(void *user, int instance, const sl_record *rec);

/** A sink calling fn(user, instance, record) for each record it receives.
 * Records of one instance arrive in its input order; different instances
 * call fn concurrently.  Errors: EINVAL (fn NULL), as the builders. */
int sl_sink_callback(sl_job *job, const char *name, sl_op *input,
                     int parallelism, sl_callback_fn fn, void *user,
                     sl_op **op);

/** Checkpoint events of a callback sink instance (jobs with checkpointing;
 * all on the instance's thread, between record calls):
 * - SL_CALLBACK_SNAPSHOT id: the records this instance received before now
 *   belong to checkpoint id, those after to later ones (pre-commit).  The
 *   final snapshot at the end of input has id UINT64_MAX.
 * - SL_CALLBACK_COMPLETE id: checkpoint id and every earlier one are
 *   durable: commit what was pre-committed with ids <= id.  The completion
 *   of the final checkpoint comes with id UINT64_MAX.
 * - SL_CALLBACK_RESTORE id: the job resumed from checkpoint id (a restart
 *   in-process or a resume from the state directory): what was
 *   pre-committed with ids <= id must be committed, everything else the
 *   instance received since is replayed after this call and must be
 *   discarded.  Not called on a start with nothing to restore.
 * With these an application commits exactly what the job committed: an
 * exactly-once sink, provided it made the records of SNAPSHOT id durable
 * before returning from it.  Output not made durable at SNAPSHOT is lost by
 * a crash between the checkpoint's commit and COMPLETE: after the restart
 * the job does not emit it again and RESTORE cannot give it back.
 * sl_sink_exactly_once() stores that output in the job's store instead
 * (and sl_sink_table(), sluice_table.h, for rows).  Return 0; anything
 * else fails the job (for COMPLETE too: committed output must not silently
 * lag). */
enum sl_callback_event {
  SL_CALLBACK_SNAPSHOT = 1,
  SL_CALLBACK_COMPLETE = 2,
  SL_CALLBACK_RESTORE = 3,
};
typedef int (*sl_callback_checkpoint_fn)(void *user, int instance, int event,
                                         uint64_t checkpoint_id);

/** Give callback sink op a checkpoint function (called with the sink's
 * user pointer); NULL removes it.  Errors: EINVAL (op is not a callback
 * sink), SL_ESTARTED. */
int sl_sink_callback_checkpoints(sl_op *op, sl_callback_checkpoint_fn fn);

/* ------------------------------------------------------------------------ */
/* Exactly-once delivery into the application: the write-ahead sink
 * (operators/wal_sink.c), after Flink's GenericWriteAheadSink. */

/** Receives the results of one checkpoint of one sink instance: the
 * records that instance received after barrier checkpoint_id - 1 and up to
 * barrier checkpoint_id, in arrival order (count >= 1; a checkpoint with no
 * results is not delivered).  records and the bytes they point to are
 * valid during the call only.  Called on the instance's thread (calls of
 * one instance never overlap; different instances call concurrently).
 * Return 0 once the results are durable in the application: the batch is
 * acknowledged and deleted from the job's store (the deletion commits with
 * a later checkpoint).  Any other value fails the job with it (sluice.h,
 * CALLBACK RETURNS); the message names the sink, the instance, the
 * checkpoint and the value.  The batch then stays stored and is delivered
 * again by the next restart or resume. */
typedef int (*sl_deliver_fn)(void *user, int instance, uint64_t checkpoint_id,
                             const sl_record *records, uint32_t count);

/** A sink of parallelism instances that hands its input to fn exactly once
 * per checkpoint, as far as the application deduplicates by checkpoint id.
 *
 * How it works.  At barrier n an instance stores the records it received
 * since barrier n-1 ("the results of checkpoint n") as its operator state,
 * in the very LMDB transaction that commits checkpoint n (with every
 * instance's state and every source's position).  When n is durable (n
 * complete), the instance calls fn(user, instance, n, records, count) for
 * every stored batch with an id <= n, oldest first, before it reads
 * another record.  A batch fn acknowledged (returned 0) is deleted from
 * the store with the next checkpoint.  After a crash or a stop (in-process
 * failover, a resume from the state directory, a start from a savepoint)
 * every stored batch that was not deleted is delivered again, in id order,
 * with its id and the same records, before the instance processes a new
 * record.  At the end of input the final checkpoint's batch is delivered
 * before sl_job_wait() returns (its id is above every earlier id of the
 * instance).  A job stopped (sl_job_stop) delivers what completed before
 * the stop; what was stored and not delivered comes with the resume.
 *
 * The contract.  For each instance (0 .. parallelism-1):
 * - ids of one instance strictly increase from one new batch to the next,
 *   and a batch delivered again has the id and records it had the first
 *   time;
 * - a batch may be delivered more than once: every batch fn saw but that a
 *   crash stopped from being deleted comes again after the restart, and so
 *   do all later ones;
 * - no result is lost: a record of a checkpoint that completed is
 *   delivered until fn acknowledges its batch.
 * So the application makes a batch durable together with its (instance,
 * id), and skips a batch whose id is not above the last id it made durable
 * for that instance:
 *
 *     static int deliver(void *user, int instance, uint64_t id,
 *                        const sl_record *records, uint32_t count) {
 *       app *a = user;
 *       if (id <= a->last_id[instance])  // made durable before a crash
 *         return 0;
 *       // in one transaction of the application's own store: the records,
 *       // and last_id[instance] = id; commit, then
 *       return app_commit(a, instance, id, records, count);
 *     }
 *
 * (A file works too: write the records and the id, fsync, then a crash
 * leaves either the batch and its id or neither.)
 *
 * Caveats.
 * - Requires checkpointing: without checkpoint.state_dir the builder
 *   refuses the job (SL_EUSAGE).  With SL_AT_LEAST_ONCE checkpoints the same
 *   mechanism runs, but barriers are not aligned, so a batch may hold
 *   records after its barrier that the sources replay after a restore:
 *   results may then be delivered twice under different ids
 *   (at-least-once).  Exactly-once needs SL_EXACTLY_ONCE and replayable
 *   sources (or a push source with positions).
 * - Results reach the application one checkpoint interval late (they wait
 *   for their checkpoint), and an instance keeps them in memory until
 *   acknowledged.  One instance's unacknowledged results may take up to
 *   1 GiB in the store (each record its bytes rounded up to 8, plus 16);
 *   more fails the job at the snapshot (SL_ETOOBIG), naming the sink and
 *   the size: checkpoint more often.  It may also hold at most 1,048,576
 *   (2^20) unacknowledged batches (one per checkpoint): more fails the
 *   job with ENOSPC, naming the sink and the limit.  The unacknowledged
 *   batches are copied at each snapshot on the instance's thread.
 * - Starting from an older savepoint goes back in time: results after its
 *   checkpoint s are produced again, with ids above s that the application
 *   may have seen before.  Reset the application's last ids to s (or keep
 *   its output per savepoint) when it starts a job from a savepoint older
 *   than its newest checkpoint.  A savepoint holding unacknowledged
 *   batches cannot change the sink's parallelism (operator state,
 *   sl_job_savepoint).
 * - An instance whose input ended before a checkpoint keeps its final
 *   state, frozen, in every later checkpoint (none of its hooks runs
 *   again, so an acknowledgement is never stored): each resume from them
 *   delivers again the batches that state held, although fn acknowledged
 *   them before, with the same ids and records (the application's last
 *   ids skip them).
 *
 * Records stay in arrival order within an instance; with parallelism
 * different from the input's they are spread round-robin, with equal
 * parallelism instance i gets input instance i.  For results that are
 * rows of a table (an upsert per key) sl_sink_table (sluice_table.h) is
 * simpler: its rows commit with the checkpoint and need no application
 * store at all.
 * Errors: EINVAL (fn or op NULL), SL_EUSAGE (the job takes no
 * checkpoints), and those of the builders. */
int sl_sink_exactly_once(sl_job *job, const char *name, sl_op *input,
                         int parallelism, sl_deliver_fn fn, void *user,
                         sl_op **op);

/* ------------------------------------------------------------------------ */
/* Kafka source (operators/kafka_source.c, docs/kafka.md). */

/** Where a partition starts when no checkpoint gives its offset. */
enum sl_kafka_start {
  SL_KAFKA_EARLIEST = 0,  /* its first offset (default) */
  SL_KAFKA_LATEST = 1,    /* its end when the instance first starts */
  SL_KAFKA_TIMESTAMP = 2, /* the first message at or after start_timestamp_ms */
  SL_KAFKA_COMMITTED = 3, /* group_id's committed offset; none: earliest */
};

/** The event time of one message, for a source with timestamp_fn: set
 * *timestamp from the value (or the message's Kafka timestamp,
 * kafka_timestamp_ms, -1 when it has none).  Return 0, or nonzero for a
 * bad record, with a reason written to why (why_bytes, NUL-terminated);
 * the source then fails the job naming the topic, partition and offset.
 * Called on the source instance's thread. */
typedef int (*sl_kafka_timestamp_fn)(void *user, const void *value,
                                     uint32_t value_bytes,
                                     int64_t kafka_timestamp_ms,
                                     int64_t *timestamp, char *why,
                                     size_t why_bytes);

/** A Kafka source.  Zero-initialise, then set what you need; the strings
 * are copied by sl_source_kafka(). */
typedef struct sl_kafka_source_config {
  const char *bootstrap; /* "HOST:PORT,...": required */
  const char *topic;     /* required */
  /** The partitions this source reads: NULL or "" for every partition of
   * the topic, else a list such as "0-3,7" (so that several processes can
   * split a topic).  Instance i of P reads those whose id % P == i. */
  const char *partitions;
  int start;                  /* enum sl_kafka_start */
  int64_t start_timestamp_ms; /* SL_KAFKA_TIMESTAMP */
  /** The consumer group whose offsets SL_KAFKA_COMMITTED reads and
   * commit_offsets writes.  NULL: "sluice-JOB-OPERATOR".  The source never
   * joins the group: partitions are assigned statically. */
  const char *group_id;
  /** 1: when a checkpoint completes, commit its offsets to group_id
   * (asynchronously, for monitoring only: the checkpoints hold the
   * offsets the source restores from). */
  int commit_offsets;
  /** NULL: each record's time is the message's Kafka timestamp (a
   * message without one is a bad record). */
  sl_kafka_timestamp_fn timestamp_fn;
  void *timestamp_user;
  /** 1: per-partition watermarks: each partition's watermark trails the
   * largest time read from it by out_of_orderness (W = max - bound - 1);
   * the instance emits the least over its partitions that are not idle. */
  int watermarks;
  int64_t out_of_orderness;
  /** A partition at its end that has had no message for this long is
   * idle: it does not hold the watermark back; when every partition of
   * an instance is, the instance marks its outputs idle.  0: never. */
  uint32_t idle_timeout_ms;
  /** 1: a bounded source: each partition ends at the end offset it had
   * when the job first started (kept in the checkpoints); the source ends
   * when every partition reached it.  0: it runs until stopped. */
  int bounded;
  /** Extra librdkafka settings, "name=value" each, NULL-terminated (NULL:
   * none), applied after the source's own; one of isolation.level,
   * auto.offset.reset, enable.auto.commit, enable.auto.offset.store or
   * enable.partition.eof is refused with EINVAL (see docs/kafka.md). */
  const char *const *properties;
  /** Bound, in ms, of each wait on the cluster at start (metadata, end
   * offsets, committed offsets); 0: 30000.  Running out fails the job,
   * naming what was waited for. */
  uint32_t timeout_ms;
  /** NULL: a bad record fails the job.  Else the dead-letter file: a bad
   * record is appended to it as one line "topic T partition P<TAB>OFFSET
   * <TAB>REASON<TAB>VALUE" (the value's bytes as they came) and skipped,
   * as the file sources do (sluice_io.h).  With parallelism P > 1,
   * instance i writes PATH.i.  Exact as theirs: synced at each checkpoint,
   * cut back on a restore, emptied by a start that restores nothing. */
  const char *dead_letter_path;
} sl_kafka_source_config;

/** A source of parallelism instances reading cfg->topic (cfg is copied).
 * Each record is a message's value (its key is not read), with the time
 * cfg says (sl_emit_ts).  Replayable: each instance checkpoints the next
 * offset of each of its partitions (with the end offsets of a bounded
 * source and the partitions' watermarks) and a restore seeks there.  It
 * reads with isolation.level=read_committed.  A bad record (no value, over
 * max_record_bytes, no usable time) fails the job naming the topic,
 * partition and offset, or goes to cfg->dead_letter_path.  The partition list of a restore must be the one
 * checkpointed: a partition an instance saved and no longer reads fails
 * the restore; one it reads and did not save starts as cfg->start says.
 * Errors: EINVAL (cfg, bootstrap or topic NULL, a bad partition list or
 * start, a dead_letter_path empty or of 4096 bytes or more, the reason in
 * sl_job_error()), ENOMEM, as the builders. */
int sl_source_kafka(sl_job *job, const char *name, int parallelism,
                    const sl_kafka_source_config *cfg, sl_op **op);

/* ------------------------------------------------------------------------ */
/* Kafka sink (operators/kafka_sink.c, docs/kafka.md). */

/** The key of the message a record becomes: set *key (valid until the
 * next call on the same thread) and *key_bytes; *key NULL for no key.
 * Return 0; anything else fails the job. */
typedef int (*sl_kafka_key_fn)(void *user, const sl_record *rec,
                               const void **key, uint32_t *key_bytes);

/** The partition of a record's message, 0 .. partitions-1, or -1 to let
 * librdkafka's partitioner choose by the key (murmur2-random, Java's
 * default).  Anything else fails the job. */
typedef int32_t (*sl_kafka_partition_fn)(void *user, const sl_record *rec,
                                         int32_t partitions);

/** A Kafka sink.  Zero-initialise, then set what you need; the strings
 * are copied by sl_sink_kafka(). */
typedef struct sl_kafka_sink_config {
  const char *bootstrap; /* "HOST:PORT,...": required */
  const char *topic;     /* required */
  /** The message value: format (sluice_io.h; the line without a newline)
   * or, NULL, the record's bytes. */
  sl_format_fn format;
  void *format_user;
  /** NULL: the record's key when the sink's input is keyed (its bytes, as
   * sl_ctx_key_bytes() gives them), else no key. */
  sl_kafka_key_fn key_fn;
  void *key_user;
  sl_kafka_partition_fn partition_fn; /* NULL: by the key */
  void *partition_user;
  /** Extra librdkafka producer settings, "name=value" each,
   * NULL-terminated (NULL: none), applied after the sink's own; acks,
   * request.required.acks or enable.idempotence is refused with EINVAL. */
  const char *const *properties;
  /** Bound, in ms, of every wait for the cluster: the acknowledgement of
   * a checkpoint's messages, room in a full producer queue; 0: 30000.
   * Running out fails the job, naming the topic and what was waited
   * for. */
  uint32_t timeout_ms;
} sl_kafka_sink_config;

/** A sink of parallelism instances producing each record as one message
 * to cfg->topic (cfg is copied), with an idempotent producer (acks=all).
 * At-least-once: the snapshot of checkpoint n returns only after every
 * message of a record received before barrier n was acknowledged by the
 * cluster (else it fails the job), so a restore from n replays only
 * records whose messages may be missing: a failure can duplicate
 * messages, never lose one.  A message the cluster refuses fails the job,
 * naming the topic, partition and error.  No transactions: librdkafka
 * 2.0.2's mock cluster, the only broker the tests can run, does not
 * implement them (docs/kafka.md says what exactly-once would take).
 * Errors: EINVAL (cfg, bootstrap or topic NULL, a property without '=';
 * the reason in sl_job_error()), ENOMEM, as the builders. */
int sl_sink_kafka(sl_job *job, const char *name, sl_op *input,
                  int parallelism, const sl_kafka_sink_config *cfg,
                  sl_op **op);

#ifdef __cplusplus
}
#endif
#endif /* SLUICE_EMBED_H */
