/* push.c — the two ends of embedding: the push source, which application
 * threads feed while the job runs, and the callback sink, which hands each
 * record to an application function.
 *
 * NOTES ON THE DESIGN OF THE PUSH SOURCE
 *
 * 1. Two buffers.  Pushers append to `filling` under the mutex.  The source
 *    instance takes the whole of it at once by swapping it with its own
 *    `draining` buffer, which it has emitted completely (one lock per swap,
 *    not per record), and emits from `draining` without the lock, up to
 *    PUSH_RECORDS_PER_CALL records per next() call.  Both buffers keep
 *    their memory, so after warm-up nothing is allocated.  Records leave
 *    in the order their pushes took the mutex; one thread's records keep
 *    its order.
 * 2. Bounds.  `filling` holds at most capacity_records records; a pusher
 *    that finds it full waits (or, non-blocking, gets EAGAIN).  With
 *    `draining`, at most 2 * capacity_records records are held.  A
 *    buffer's bytes grow by doubling to what its records need (entries: a
 *    24-byte header, then the payload padded to 8 bytes).
 * 3. Waiting (DESIGN.md invariant 7).  A pusher that finds the queue full
 *    releases the mutex and spins PUSH_SPIN_ITERATIONS times on an atomic
 *    copy of the fill count; then it sleeps on `room`, at most
 *    PUSH_PUSHER_WAIT_NS at a time.  The source broadcasts `room` after a
 *    swap only when pushers are counted as sleeping.  The source, finding
 *    `filling` empty, spins the same way, then sleeps on `data` for at most
 *    PUSH_SOURCE_WAIT_NS and returns 0 from next(), so the engine looks at
 *    stop and checkpoint triggers at least every millisecond; a pusher
 *    signals `data` only when the source is counted as sleeping.  Both
 *    counts change only under the mutex, and the sleeper's count is set
 *    before it releases the mutex in pthread_cond_timedwait, so no wake-up
 *    is lost; the timeouts are a second line, not the mechanism.  Before
 *    it sleeps, the source sends the watermark of what it emitted
 *    (sl_source_caught_up, timer.c note 2), so event time moves with a
 *    trickle of pushes instead of on the watermark interval.
 * 4. The end of the job.  A push is refused once nothing will ever take
 *    the queue (job_over): the job finished (sl_job_wait returned), a
 *    stop with drain was asked for (the source ends without another
 *    next(); stop.c wakes pushers and pollers at once), or the job is
 *    stopping and no restart can follow (the user stopped it, it failed
 *    with no restart strategy, or the strategy gave up).  The refusal is
 *    the failure's status when the job failed (what sl_job_wait returns),
 *    else SL_ESTOPPED (over_status).  The source's close callback, which
 *    every instance exit runs, and sl_push_job_over(), which the failover
 *    supervisor calls when it returns, wake sleeping pushers and signal
 *    the eventfd; the sleep's timeout is a second line.
 * 5. Positions.  Every emitted record has a position: the application's
 *    (sl_push_record_at: strictly increasing, checked under the mutex) or,
 *    in the numbered form, one the source gives it as it emits it: the
 *    position after the last one emitted.  The first push fixes the form
 *    of a source (`mode`); the other form is refused.  `emitted_next` (the
 *    source's own) is the position after the last record emitted.
 * 6. Checkpoints.  snapshot() runs between two next() calls, so the
 *    `emitted_next` it saves is exactly what was emitted before the
 *    barrier: the per-barrier bookkeeping that any checkpoint (periodic,
 *    triggered, savepoint, a stop's) needs.  restore() reads it back.  The
 *    first decision of the run (a restore, or the first next() of an
 *    attempt that had nothing to restore) fixes `resume_next`, which
 *    sl_push_resume_position() waits for, and `drop_below`: positioned
 *    records below it are dropped, by the pusher once it is known and by
 *    the source for those queued before it was; each drop is counted in
 *    `dropped`.  Numbered records are never dropped: they are numbered
 *    from the restored position on.
 * 7. The replay log (only with checkpointing and a restart strategy: an
 *    in-process restart is the only reader).  Each record emitted goes,
 *    with its position, into `log` too.  A snapshot notes (checkpoint id,
 *    emitted_next) in `marks`; the completion of a checkpoint cuts the log
 *    before the position its mark saved: those records are in the
 *    checkpoint.  A restart restores the newest complete checkpoint, whose
 *    position is at or after the log's cut, so the log holds every record
 *    after it; the new attempt cuts the records before the restored
 *    position and emits the rest again before anything from the queue.
 *    The log holds at most replay_capacity_records records: when it is
 *    full the source emits nothing until a completed checkpoint frees
 *    room (inside next() it spins, then parks on its instance's parker
 *    until a completion, a trigger or a stop is pending, and returns, so
 *    that the engine acts on it; a WARN line says so once per stall), and
 *    the pushers wait behind the full queue.
 * 8. Restarts.  The queue, `draining`, the log and their cursors live in
 *    the operator's user data, which outlives instance threads (a
 *    restart's new thread starts after the old one was joined).  So the
 *    new instance goes on with the records not emitted yet, after the
 *    log's.  Without the log (no checkpointing), records emitted before the
 *    failure and still in the rings are lost with them (at-most-once).
 * 9. Non-blocking pushes.  A try-push that finds the queue full returns
 *    EAGAIN and sets `fd_armed`; the source writes the eventfd after the
 *    next swap that made room.  Stops, failures, the supervisor's end and
 *    sl_push_close() write it too, so a poller wakes and meets the end on
 *    its next try.  The eventfd is made by the first sl_push_fd() and
 *    closed with the handle (sl_job_destroy).
 * 10. End of input: sl_push_close() sets `closed`; the source returns
 *    SL_SOURCE_END once it is set and both buffers and the log's replay
 *    are empty.
 *
 * Pusher (push_run), under the mutex, for each record:
 *
 *   check --[closed]--> SL_EUSAGE    check --[job_over]--> over_status
 *     |  \--[other form, bad position]--> SL_EUSAGE / EINVAL
 *     |  \--[below drop_below]--> counted in dropped, next record
 *     |  \--[room]--> append, signal `data` if the source sleeps
 *     |
 *     +--[full]--[non-blocking]--> arm the eventfd --> EAGAIN
 *     +--[full]--> spin (unlocked) --> sleep on `room` --> check
 *                  [wait_for_room]      [woken by: swap, close, source
 *                                        close callback, supervisor end,
 *                                        timeout]
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "log.h"
#include "op_util.h"

/* Records emitted per next() call (see builtin.c for why a batch). */
#define PUSH_RECORDS_PER_CALL 1024u
/* Default and largest queue capacity in records. */
#define PUSH_DEFAULT_CAPACITY 4096u
#define PUSH_MAX_CAPACITY (1u << 24)
/* Default and largest replay log in records (note 7).  The default holds
 * one checkpoint interval's records at 256 Ki records per interval; a
 * faster or longer-checkpointing application raises it. */
#define PUSH_DEFAULT_REPLAY (1u << 18)
#define PUSH_MAX_REPLAY (1u << 28)
/* Spins (each a CPU pause, ~20 ns here) before sleeping: about what a swap
 * and a few hundred emits take, short enough not to hold a core (note 3). */
#define PUSH_SPIN_ITERATIONS 200
/* Longest sleep of a pusher before it looks at the job again (note 4). */
#define PUSH_PUSHER_WAIT_NS 10000000ull
/* Longest sleep of the source inside next() (note 3). */
#define PUSH_SOURCE_WAIT_NS 1000000ull
/* First allocation of a buffer. */
#define PUSH_INITIAL_BYTES 65536u
/* Snapshots noted while their checkpoints are in flight (note 7); when
 * more are, the oldest note is forgotten: its completion then cuts
 * nothing, which only keeps records longer. */
#define PUSH_MARKS 64
/* The checkpointed state: magic, emitted_next, mode (note 6). */
#define PUSH_STATE_WORDS 3
#define PUSH_STATE_MAGIC 0x31765f6873757073ull /* "spush_v1" */

/* Flags of an entry. */
#define PUSH_ENTRY_POSITIONED 1u

enum push_mode { PUSH_MODE_NONE = 0, PUSH_MODE_NUMBERED, PUSH_MODE_POSITIONED };

/* The header of one queued or logged record (note 2).  position is the
 * application's (PUSH_ENTRY_POSITIONED) or, in the log, the one given at
 * emission. */
typedef struct push_entry {
  uint32_t size_bytes;
  uint32_t flags;
  int64_t timestamp;
  uint64_t position;
} push_entry;
_Static_assert(sizeof(push_entry) == 24, "entries stay 8-byte aligned");

static inline size_t entry_bytes(uint32_t size_bytes) {
  return sizeof(push_entry) + (((size_t)size_bytes + 7u) & ~(size_t)7u);
}

typedef struct push_buffer {
  uint8_t *bytes;
  size_t used_bytes;
  size_t capacity_bytes;
  uint32_t records;
} push_buffer;

/* The replay log (note 7): live entries are bytes [begin, end); those from
 * replay on are still to be emitted again after a restart. */
typedef struct push_log {
  uint8_t *bytes;
  size_t begin;
  size_t replay;
  size_t end;
  size_t capacity_bytes;
  uint32_t records; /* live */
} push_log;

typedef struct push_mark {
  uint64_t checkpoint_id;
  uint64_t next_position;
} push_mark;

struct sl_push {
  sl_job *job;
  uint32_t capacity_records;
  uint32_t max_record_bytes; /* the job's, fixed at sl_job_create */
  uint32_t replay_capacity_records;
  pthread_mutex_t lock;
  pthread_cond_t room; /* pushers and resume waiters sleep here */
  pthread_cond_t data; /* the source sleeps here */
  /* Under lock. */
  push_buffer filling;
  uint32_t pushers_waiting;
  bool source_waiting;
  bool closed;
  int mode;                /* enum push_mode, fixed by the first push */
  bool any_position;       /* last_position is set */
  uint64_t last_position;  /* the last one pushed (positioned form) */
  bool resume_known;       /* note 6: the run's first decision was made */
  uint64_t resume_next;
  uint64_t drop_below;     /* 0 until resume_known */
  int event_fd;            /* -1 until sl_push_fd (note 9) */
  bool fd_armed;
  /* Relaxed copies, for spinning without the lock; every decision is made
   * again under it. */
  _Atomic uint32_t filling_records_shared;
  _Atomic bool closed_shared;
  _Atomic uint64_t dropped;
  /* The source instance's own (note 8). */
  push_buffer draining;
  size_t drain_offset;
  uint32_t drain_left; /* records of draining not emitted yet */
  uint64_t emitted_next;
  bool attempt_decided; /* this attempt restored, or found nothing to */
  bool log_on;
  bool log_stalled; /* the log was found full; said once (wait_for_log) */
  push_log log;
  push_mark marks[PUSH_MARKS];
  int mark_count;
};


/* Does a buffer hold together?  For asserts (inline: unused, and not
 * warned about, when NDEBUG removes them). */
__attribute__((unused)) /* asserts only */
static inline bool buffer_check(const push_buffer *b) {
  assert(b->used_bytes <= b->capacity_bytes);
  assert((b->records == 0) == (b->used_bytes == 0));
  assert(b->used_bytes >= (size_t)b->records * sizeof(push_entry));
  return true;
}

/* The queue side of p; under the lock. */
__attribute__((unused)) /* asserts only */
static inline bool queue_check(const sl_push *p) {
  assert(buffer_check(&p->filling));
  assert(p->filling.records <= p->capacity_records);
  assert(p->filling.records ==
         atomic_load_explicit(&p->filling_records_shared,
                              memory_order_relaxed));
  assert(p->resume_known || p->drop_below == 0);
  return true;
}

/* The source side of p; on the source's thread. */
__attribute__((unused)) /* asserts only */
static inline bool drain_check(const sl_push *p) {
  assert(buffer_check(&p->draining));
  assert(p->drain_left <= p->draining.records);
  assert(p->drain_offset <= p->draining.used_bytes);
  assert((p->drain_left == 0) == (p->drain_offset == p->draining.used_bytes));
  assert(p->log.begin <= p->log.replay && p->log.replay <= p->log.end);
  assert(p->log.end <= p->log.capacity_bytes);
  assert((p->log.records == 0) == (p->log.begin == p->log.end));
  assert(p->log.records <= p->replay_capacity_records);
  assert(p->mark_count >= 0 && p->mark_count <= PUSH_MARKS);
  return true;
}

/* Bytes for a buffer of at least needed bytes: doubling from what it has
 * (needed < 2^40: records and their sizes are bounded). */
static size_t grown_bytes(size_t capacity_bytes, size_t needed) {
  size_t bytes = capacity_bytes ? capacity_bytes : PUSH_INITIAL_BYTES;
  while (bytes < needed)
    bytes *= 2;
  return bytes;
}

/* Room for extra more bytes; ENOMEM leaves b as it was. */
static int buffer_reserve(push_buffer *b, size_t extra) {
  size_t needed = b->used_bytes + extra;
  if (needed <= b->capacity_bytes)
    return 0;
  size_t bytes = grown_bytes(b->capacity_bytes, needed);
  uint8_t *grown = realloc(b->bytes, bytes);
  if (!grown)
    return ENOMEM;
  b->bytes = grown;
  b->capacity_bytes = bytes;
  return 0;
}

static void entry_write(uint8_t *at, const sl_push_item *item,
                        uint32_t flags) {
  push_entry e = {.size_bytes = item->size_bytes, .flags = flags,
                  .timestamp = item->timestamp, .position = item->position};
  memcpy(at, &e, sizeof e);
  if (item->size_bytes)
    memcpy(at + sizeof e, item->data, item->size_bytes);
}

/* An absolute CLOCK_MONOTONIC time wait_ns from now (the condition
 * variables' clock). */
static struct timespec deadline_after(uint64_t wait_ns) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  uint64_t ns = (uint64_t)t.tv_nsec + wait_ns;
  t.tv_sec += (time_t)(ns / 1000000000u);
  t.tv_nsec = (long)(ns % 1000000000u);
  return t;
}

/* Note 4: will nothing ever take the queue again? */
static bool job_over(sl_job *job) {
  if (atomic_load(&job->state) == SL_JOB_FINISHED)
    return true;
  /* A drain ends the sources without another next() (runtime.c note 9),
   * and is never withdrawn. */
  if (atomic_load(&job->stop_request) == SL_STOP_REQUEST_DRAIN)
    return true;
  if (!atomic_load(&job->stopping))
    return false;
  return atomic_load(&job->user_stopped) ||
         job->config.restart.strategy == SL_RESTART_NONE ||
         atomic_load(&job->restarts_over); /* the strategy gave up */
}

/* Note 4: what a pusher of an over job gets, in *status.  False while a
 * failure is claimed but its status not yet published (internal.h
 * sl_job_failure): the caller waits a round and looks again. */
static bool over_status(sl_job *job, int *status) {
  if (!atomic_load(&job->failed)) {
    *status = SL_ESTOPPED;
    return true;
  }
  return sl_job_failure(job, status);
}

/* Note 9: wake a poller; under the lock (the descriptor lives as long as
 * the handle).  A full counter (EAGAIN) is readable already. */
static void signal_fd(sl_push *p) {
  if (p->event_fd < 0)
    return;
  uint64_t one = 1;
  ssize_t written = write(p->event_fd, &one, sizeof one);
  (void)written; /* only EAGAIN can fail it, and then it is readable */
}

/* ------------------------------------------------------------ pushing */

/* The queue is full: spin unlocked while *spins allows, else sleep on
 * `room` once (note 3).  Called and returns with the lock held; the caller
 * checks everything again. */
static void wait_for_room(sl_push *p, int *spins) {
  if (*spins < PUSH_SPIN_ITERATIONS) {
    pthread_mutex_unlock(&p->lock);
    for (; *spins < PUSH_SPIN_ITERATIONS; (*spins)++) {
      if (atomic_load_explicit(&p->filling_records_shared,
                               memory_order_relaxed) < p->capacity_records ||
          atomic_load_explicit(&p->closed_shared, memory_order_relaxed))
        break;
      sl_cpu_relax();
    }
    *spins = PUSH_SPIN_ITERATIONS; /* one spin phase per call */
    pthread_mutex_lock(&p->lock);
    return;
  }
  struct timespec deadline = deadline_after(PUSH_PUSHER_WAIT_NS);
  p->pushers_waiting++;
  pthread_cond_timedwait(&p->room, &p->lock, &deadline);
  p->pushers_waiting--;
}

/* What one push call queues: count records, either back to back at
 * records (size_bytes each, timestamps may be NULL, positions from
 * *position on when not NULL) or the array items. */
typedef struct push_input {
  const uint8_t *records;
  uint32_t size_bytes;
  const int64_t *timestamps;
  const uint64_t *position;
  const sl_push_item *items;
  uint32_t count;
  int mode;      /* the form of this call (note 5) */
  bool nonblock; /* EAGAIN instead of waiting (note 9) */
} push_input;

static sl_push_item input_item(const push_input *in, uint32_t k) {
  if (in->items)
    return in->items[k];
  sl_push_item item = {
      .data = in->size_bytes ? in->records + (size_t)k * in->size_bytes : 0,
      .size_bytes = in->size_bytes,
      .timestamp = in->timestamps ? in->timestamps[k] : SL_NO_TIMESTAMP,
      .position = in->position ? *in->position + k : 0};
  return item;
}

/* Under the lock: is the call's form the source's (fixing it on the first
 * push)?  SL_EUSAGE if not (note 5). */
static int check_mode(sl_push *p, int mode) {
  if (p->mode == PUSH_MODE_NONE)
    p->mode = mode;
  return p->mode == mode ? 0 : SL_EUSAGE;
}

/* Under the lock: item was taken (queued or dropped); the next positioned
 * push must come after it.  Not before: a push that fails (ENOMEM) may be
 * retried at the same position. */
static void note_position(sl_push *p, const sl_push_item *item) {
  p->any_position = true;
  p->last_position = item->position;
}

/* Under the lock: one record that is not queued (dropped, note 6) or an
 * error; 1 when it is to be queued. */
static int admit(sl_push *p, const push_input *in, const sl_push_item *item) {
  if (!item->data && item->size_bytes)
    return EINVAL;
  if (item->size_bytes > p->max_record_bytes)
    return SL_ETOOBIG;
  if (in->mode != PUSH_MODE_POSITIONED)
    return 1;
  if (item->position == UINT64_MAX ||
      (p->any_position && item->position <= p->last_position))
    return EINVAL; /* not strictly increasing, or the reserved maximum */
  if (item->position >= p->drop_below)
    return 1; /* queue_some notes the position once it is queued */
  note_position(p, item);
  atomic_fetch_add_explicit(&p->dropped, 1, memory_order_relaxed);
  return 0;
}

/* Queue what fits of in from *done on; under the lock.  0 when the queue
 * is full or everything went in, else the error. */
static int queue_some(sl_push *p, const push_input *in, uint32_t *done) {
  uint32_t room = p->capacity_records - p->filling.records;
  uint32_t queued = 0;
  int rc = 0;
  if (!in->items) { /* equal sizes: one reservation for the run */
    uint32_t n = in->count - *done < room ? in->count - *done : room;
    rc = buffer_reserve(&p->filling, (size_t)n * entry_bytes(in->size_bytes));
    if (rc)
      return rc;
  }
  for (; *done < in->count && queued < room; (*done)++) {
    sl_push_item item = input_item(in, *done);
    rc = admit(p, in, &item);
    if (rc == 0)
      continue; /* dropped */
    if (rc != 1)
      break;
    rc = 0;
    if (in->items &&
        (rc = buffer_reserve(&p->filling, entry_bytes(item.size_bytes))) != 0)
      break;
    uint32_t flags =
        in->mode == PUSH_MODE_POSITIONED ? PUSH_ENTRY_POSITIONED : 0;
    entry_write(p->filling.bytes + p->filling.used_bytes, &item, flags);
    if (in->mode == PUSH_MODE_POSITIONED)
      note_position(p, &item);
    p->filling.used_bytes += entry_bytes(item.size_bytes);
    p->filling.records++;
    queued++;
  }
  if (queued) {
    atomic_store_explicit(&p->filling_records_shared, p->filling.records,
                          memory_order_relaxed);
    if (p->source_waiting)
      pthread_cond_signal(&p->data);
  }
  return rc;
}

/* Queue the records of in; *pushed receives how many were taken (queued
 * or dropped).  Note 1 and the diagram. */
static int push_run(sl_push *p, const push_input *in, uint32_t *pushed) {
  uint32_t done = 0;
  int spins = 0;
  int rc = 0;
  pthread_mutex_lock(&p->lock);
  rc = check_mode(p, in->mode);
  while (rc == 0 && done < in->count) {
    assert(queue_check(p));
    if (p->closed) {
      rc = SL_EUSAGE;
      break;
    }
    if (job_over(p->job)) {
      if (over_status(p->job, &rc))
        break;
      rc = 0;
      wait_for_room(p, &spins); /* its status comes (over_status) */
      continue;
    }
    if (p->filling.records == p->capacity_records) {
      if (in->nonblock) {
        p->fd_armed = true;
        rc = EAGAIN;
        break;
      }
      wait_for_room(p, &spins);
      continue;
    }
    rc = queue_some(p, in, &done);
  }
  pthread_mutex_unlock(&p->lock);
  *pushed = done;
  return rc;
}

/* The single-record forms. */
static int push_one(sl_push *p, const uint64_t *position, const void *data,
                    uint32_t size_bytes, int64_t timestamp, bool nonblock) {
  if (!p || (!data && size_bytes))
    return EINVAL;
  if (size_bytes > p->max_record_bytes)
    return SL_ETOOBIG;
  push_input in = {.records = data, .size_bytes = size_bytes,
                   .timestamps = &timestamp, .position = position,
                   .count = 1, .nonblock = nonblock,
                   .mode = position ? PUSH_MODE_POSITIONED
                                    : PUSH_MODE_NUMBERED};
  uint32_t pushed;
  return push_run(p, &in, &pushed);
}

SL_EXPORT int sl_push_record(sl_push *p, const void *data,
                             uint32_t size_bytes, int64_t timestamp) {
  return push_one(p, 0, data, size_bytes, timestamp, false);
}

SL_EXPORT int sl_push_try_record(sl_push *p, const void *data,
                                 uint32_t size_bytes, int64_t timestamp) {
  return push_one(p, 0, data, size_bytes, timestamp, true);
}

SL_EXPORT int sl_push_record_at(sl_push *p, uint64_t position,
                                const void *data, uint32_t size_bytes,
                                int64_t timestamp) {
  return push_one(p, &position, data, size_bytes, timestamp, false);
}

SL_EXPORT int sl_push_try_record_at(sl_push *p, uint64_t position,
                                    const void *data, uint32_t size_bytes,
                                    int64_t timestamp) {
  return push_one(p, &position, data, size_bytes, timestamp, true);
}

SL_EXPORT int sl_push_batch(sl_push *p, const void *records,
                            uint32_t size_bytes, uint32_t count,
                            const int64_t *timestamps, uint32_t *pushed) {
  uint32_t done = 0;
  int rc;
  if (!p || (!records && size_bytes && count))
    rc = EINVAL;
  else if (size_bytes > p->max_record_bytes)
    rc = SL_ETOOBIG;
  else {
    push_input in = {.records = records, .size_bytes = size_bytes,
                     .timestamps = timestamps, .count = count,
                     .mode = PUSH_MODE_NUMBERED};
    rc = push_run(p, &in, &done);
  }
  if (pushed)
    *pushed = done;
  return rc;
}

SL_EXPORT int sl_push_items(sl_push *p, const sl_push_item *items,
                            uint32_t count, int flags, uint32_t *pushed) {
  uint32_t done = 0;
  int rc;
  if (!p || (!items && count) ||
      (flags & ~(SL_PUSH_NONBLOCK | SL_PUSH_POSITIONED)))
    rc = EINVAL;
  else {
    push_input in = {.items = items, .count = count,
                     .nonblock = (flags & SL_PUSH_NONBLOCK) != 0};
    /* The source's form, or the flag's on its first push (note 5). */
    pthread_mutex_lock(&p->lock);
    int mode = p->mode;
    pthread_mutex_unlock(&p->lock);
    if (mode == PUSH_MODE_NONE)
      mode = flags & SL_PUSH_POSITIONED ? PUSH_MODE_POSITIONED
                                        : PUSH_MODE_NUMBERED;
    in.mode = mode;
    if (mode == PUSH_MODE_NUMBERED && (flags & SL_PUSH_POSITIONED))
      rc = SL_EUSAGE;
    else
      rc = push_run(p, &in, &done);
  }
  if (pushed)
    *pushed = done;
  return rc;
}

SL_EXPORT void sl_push_close(sl_push *p) {
  if (!p)
    return;
  pthread_mutex_lock(&p->lock);
  p->closed = true;
  atomic_store_explicit(&p->closed_shared, true, memory_order_relaxed);
  pthread_cond_broadcast(&p->room); /* waiting pushers: SL_EUSAGE */
  pthread_cond_signal(&p->data);    /* the source: end once drained */
  signal_fd(p);                     /* a poller: SL_EUSAGE on its try */
  pthread_mutex_unlock(&p->lock);
}

SL_EXPORT int sl_push_resume_position(sl_push *p, uint64_t *next_position) {
  if (!p || !next_position)
    return EINVAL;
  if (atomic_load(&p->job->state) == SL_JOB_BUILDING)
    return SL_ENOTSTARTED;
  int rc = 0;
  pthread_mutex_lock(&p->lock);
  /* Bounded by the job: it decides, or ends (job_over), and the sleep's
   * timeout makes each round look again (note 4). */
  for (;;) {
    if (p->resume_known) {
      *next_position = p->resume_next;
      break;
    }
    if (job_over(p->job) && over_status(p->job, &rc))
      break;
    struct timespec deadline = deadline_after(PUSH_PUSHER_WAIT_NS);
    p->pushers_waiting++;
    pthread_cond_timedwait(&p->room, &p->lock, &deadline);
    p->pushers_waiting--;
  }
  pthread_mutex_unlock(&p->lock);
  return rc;
}

SL_EXPORT uint64_t sl_push_dropped(const sl_push *p) {
  return p ? atomic_load_explicit(&p->dropped, memory_order_relaxed) : 0;
}

SL_EXPORT int sl_push_fd(sl_push *p) {
  if (!p)
    return -EINVAL;
  pthread_mutex_lock(&p->lock);
  int fd = p->event_fd;
  if (fd < 0) {
    fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) {
      fd = -errno;
    } else {
      p->event_fd = fd;
      if (p->closed || job_over(p->job))
        signal_fd(p); /* the end came before the descriptor */
    }
  }
  pthread_mutex_unlock(&p->lock);
  return fd;
}

SL_EXPORT int sl_push_set_replay_capacity(sl_push *p, uint32_t records) {
  if (!p || records > PUSH_MAX_REPLAY)
    return EINVAL;
  if (atomic_load(&p->job->state) != SL_JOB_BUILDING)
    return SL_ESTARTED;
  p->replay_capacity_records = records ? records : PUSH_DEFAULT_REPLAY;
  return 0;
}

/* Note 4: the supervisor returned; no attempt follows.  Wake every
 * sleeping pusher and poller of the job's push sources now. */
static int push_next(sl_ctx *ctx, void *state);
void sl_push_job_over(sl_job *job) {
  for (int i = 0; i < job->op_count; i++) {
    sl_op *op = job->ops[i];
    if (op->kind != SL_OP_SOURCE || op->fn.source.next != push_next)
      continue;
    sl_push *p = op->user;
    pthread_mutex_lock(&p->lock);
    pthread_cond_broadcast(&p->room);
    signal_fd(p);
    pthread_mutex_unlock(&p->lock);
  }
}

/* ------------------------------------------------------------ replay log */

/* Room for one more entry of entry_size bytes: first by moving the live
 * entries to the front, then by growing.  ENOMEM leaves the log as it
 * was. */
static int log_reserve(push_log *log, size_t entry_size) {
  if (log->end + entry_size <= log->capacity_bytes)
    return 0;
  if (log->begin > 0) { /* amortized: it moves at most what it keeps */
    size_t live = log->end - log->begin;
    memmove(log->bytes, log->bytes + log->begin, live);
    log->replay -= log->begin;
    log->end = live;
    log->begin = 0;
    if (log->end + entry_size <= log->capacity_bytes)
      return 0;
  }
  size_t bytes = grown_bytes(log->capacity_bytes, log->end + entry_size);
  uint8_t *grown = realloc(log->bytes, bytes);
  if (!grown)
    return ENOMEM;
  log->bytes = grown;
  log->capacity_bytes = bytes;
  return 0;
}

static push_entry log_entry_at(const push_log *log, size_t offset) {
  push_entry e;
  assert(offset + sizeof e <= log->end);
  memcpy(&e, log->bytes + offset, sizeof e);
  return e;
}

/* Cut the entries before position next_position: they are in a complete
 * checkpoint (note 7). */
static void log_cut(push_log *log, uint64_t next_position) {
  for (uint32_t n = log->records; n > 0; n--) {
    push_entry e = log_entry_at(log, log->begin);
    if (e.position >= next_position)
      break;
    log->begin += entry_bytes(e.size_bytes);
    log->records--;
  }
  if (log->replay < log->begin) /* a restore cuts what it need not emit */
    log->replay = log->begin;
  if (log->records == 0) { /* empty: start at the front again */
    assert(log->replay == log->end);
    log->begin = log->replay = log->end = 0;
  }
}

/* ------------------------------------------------------------ source */

/* Parallelism 1: the instance state is the handle itself (note 8).  Each
 * attempt begins undecided (note 6) and, with the log, replays it from
 * its start (note 7); a restore cuts it first. */
static int push_open(sl_ctx *ctx, void *user, void **state) {
  sl_push *p = user;
  p->log_on = ctx->job->cp != 0 &&
              ctx->job->config.restart.strategy != SL_RESTART_NONE;
  p->attempt_decided = false;
  p->mark_count = 0;
  p->log.replay = p->log.begin;
  *state = p;
  return 0;
}

/* Note 6: this attempt starts after position next - 1.  The run's first
 * decision fixes what sl_push_resume_position() answers.  On the source's
 * thread. */
static void decide(sl_push *p, uint64_t next) {
  p->attempt_decided = true;
  p->emitted_next = next;
  pthread_mutex_lock(&p->lock);
  if (!p->resume_known) {
    p->resume_known = true;
    p->resume_next = next;
    p->drop_below = next;
  }
  if (p->pushers_waiting)
    pthread_cond_broadcast(&p->room); /* resume waiters */
  pthread_mutex_unlock(&p->lock);
}

/* Note 6: an attempt that had nothing to restore starts at 0 when it
 * replays the whole log (a restart before the first complete
 * checkpoint), else where the run is (numbering continues). */
static void decide_unrestored(sl_push *p) {
  decide(p, p->log_on || !p->resume_known ? 0 : p->emitted_next);
}

static int push_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  sl_push *p = state;
  if (!p->attempt_decided) /* a trigger before the first next() */
    decide_unrestored(p);
  pthread_mutex_lock(&p->lock);
  uint64_t mode = (uint64_t)p->mode; /* a pusher's, fixed under the lock */
  pthread_mutex_unlock(&p->lock);
  uint64_t words[PUSH_STATE_WORDS] = {PUSH_STATE_MAGIC, p->emitted_next,
                                      mode};
  int rc = sl_operator_state_set(ctx, words, sizeof words);
  if (rc || !p->log_on || id == 0)
    return rc; /* the final checkpoint (id 0) is followed by nothing */
  if (p->mark_count == PUSH_MARKS) { /* forget the oldest (PUSH_MARKS) */
    memmove(p->marks, p->marks + 1, sizeof p->marks[0] * (PUSH_MARKS - 1));
    p->mark_count--;
  }
  p->marks[p->mark_count++] = (push_mark){id, p->emitted_next};
  return 0;
}

static void push_complete(sl_ctx *ctx, void *state, uint64_t id) {
  (void)ctx;
  sl_push *p = state;
  int n = 0;
  while (n < p->mark_count && p->marks[n].checkpoint_id <= id)
    n++;
  if (n == 0)
    return;
  /* The mark was taken in this attempt: those records were emitted. */
  assert(p->marks[n - 1].next_position <= p->emitted_next);
  log_cut(&p->log, p->marks[n - 1].next_position);
  if (p->log.records < p->replay_capacity_records)
    p->log_stalled = false; /* the stall, if any, is over */
  memmove(p->marks, p->marks + n, sizeof p->marks[0] * (size_t)(p->mark_count - n));
  p->mark_count -= n;
  assert(drain_check(p));
}

static int push_restore(sl_ctx *ctx, void *state, uint64_t id) {
  sl_push *p = state;
  uint64_t words[PUSH_STATE_WORDS];
  int rc = sl_operator_state_words(ctx, id, "push source position", words,
                                   PUSH_STATE_WORDS);
  if (rc == SL_ENOTFOUND) {
    words[1] = 0; /* a checkpoint with no position: nothing emitted */
  } else if (rc) {
    return rc;
  } else if (words[0] != PUSH_STATE_MAGIC || words[2] > PUSH_MODE_POSITIONED) {
    sl_ctx_fail(ctx, "checkpoint %" PRIu64 ": the push source position is "
                "damaged (magic %#" PRIx64 ", form %" PRIu64 ")", id,
                words[0], words[2]);
    return SL_ECORRUPT;
  }
  log_cut(&p->log, words[1]);
  p->log.replay = p->log.begin;
  /* A replayed record is after the restored position (note 7). */
  assert(p->log.records == 0 ||
         log_entry_at(&p->log, p->log.begin).position >= words[1]);
  decide(p, words[1]);
  return 0;
}

/* Swap `filling` into the empty `draining` (note 1), waiting up to
 * PUSH_SOURCE_WAIT_NS for records.  Returns 0 (records to emit, or none
 * yet) or SL_SOURCE_END. */
static int take_queue(sl_ctx *ctx, sl_push *p) {
  assert(p->drain_left == 0);
  for (int spins = 0; spins < PUSH_SPIN_ITERATIONS; spins++) {
    if (atomic_load_explicit(&p->filling_records_shared,
                             memory_order_relaxed) ||
        atomic_load_explicit(&p->closed_shared, memory_order_relaxed))
      break;
    sl_cpu_relax();
  }
  /* Caught up: the watermark of what was emitted leaves before the wait
   * (note 3), not when the wait ends.  Outside the lock: it may wait for
   * room in the rings, and pushers must not wait for that. */
  if (!atomic_load_explicit(&p->filling_records_shared, memory_order_relaxed))
    sl_source_caught_up(ctx);
  pthread_mutex_lock(&p->lock);
  assert(queue_check(p));
  if (p->filling.records == 0 && !p->closed && !sl_ctx_stopping(ctx)) {
    struct timespec deadline = deadline_after(PUSH_SOURCE_WAIT_NS);
    p->source_waiting = true;
    pthread_cond_timedwait(&p->data, &p->lock, &deadline);
    p->source_waiting = false;
  }
  int rc = 0;
  if (p->filling.records) {
    push_buffer emptied = p->draining;
    emptied.used_bytes = 0;
    emptied.records = 0;
    p->draining = p->filling;
    p->filling = emptied;
    p->drain_offset = 0;
    p->drain_left = p->draining.records;
    atomic_store_explicit(&p->filling_records_shared, 0,
                          memory_order_relaxed);
    if (p->pushers_waiting)
      pthread_cond_broadcast(&p->room);
    if (p->fd_armed) { /* note 9 */
      p->fd_armed = false;
      signal_fd(p);
    }
  } else if (p->closed) {
    rc = SL_SOURCE_END;
  }
  pthread_mutex_unlock(&p->lock);
  return rc;
}

/* Note 7: emit the log's records after the restored position again. */
static int replay_some(sl_ctx *ctx, sl_push *p, uint32_t *budget) {
  for (; *budget > 0 && p->log.replay < p->log.end; (*budget)--) {
    push_entry e = log_entry_at(&p->log, p->log.replay);
    assert(e.position >= p->emitted_next);
    int rc = sl_emit_ts(ctx, p->log.bytes + p->log.replay + sizeof e,
                        e.size_bytes, e.timestamp);
    if (rc)
      return rc; /* not emitted: the cursor stays on it */
    p->log.replay += entry_bytes(e.size_bytes);
    p->emitted_next = e.position + 1;
  }
  return 0;
}

/* Note 7: the log is full; park until the engine has a completion (or a
 * trigger, or a stop) for the source to act on, and emit nothing in this
 * call.  The first wait of a stall says so once. */
static void wait_for_log(sl_ctx *ctx, sl_push *p) {
  if (!p->log_stalled) {
    p->log_stalled = true;
    sl_log(SL_LOG_WARN, "sluice: push source '%s': the replay log is full "
           "(%" PRIu32 " records); nothing is emitted until a checkpoint "
           "completes (raise sl_push_set_replay_capacity or checkpoint "
           "more often)", ctx->op->name, p->log.records);
  }
  sl_source_wait_checkpoint_news(ctx);
}

/* Emit one record of `draining` with its position (note 5), logging it
 * (note 7).  0 or the error of the emit; *waited when the log was full. */
static int drain_one(sl_ctx *ctx, sl_push *p, bool *waited) {
  push_entry e;
  memcpy(&e, p->draining.bytes + p->drain_offset, sizeof e);
  assert(e.size_bytes <= p->max_record_bytes);
  const uint8_t *payload = p->draining.bytes + p->drain_offset + sizeof e;
  if (!(e.flags & PUSH_ENTRY_POSITIONED)) {
    e.position = p->emitted_next; /* the numbered form */
  } else if (e.position < p->drop_below) { /* queued before the restore */
    atomic_fetch_add_explicit(&p->dropped, 1, memory_order_relaxed);
    p->drain_offset += entry_bytes(e.size_bytes);
    p->drain_left--;
    return 0;
  }
  assert(e.position >= p->emitted_next);
  if (p->log_on) {
    if (p->log.records == p->replay_capacity_records) {
      wait_for_log(ctx, p);
      *waited = true;
      return 0;
    }
    int rc = log_reserve(&p->log, entry_bytes(e.size_bytes));
    if (rc) {
      sl_ctx_fail(ctx, "the replay log of %" PRIu32 " records could not "
                  "grow", p->log.records);
      return rc;
    }
  }
  int rc = sl_emit_ts(ctx, payload, e.size_bytes, e.timestamp);
  if (rc)
    return rc; /* not emitted: the cursor stays on it (note 8) */
  if (p->log_on) {
    sl_push_item item = {payload, e.size_bytes, e.timestamp, e.position};
    assert(p->log.replay == p->log.end); /* no replay pending (push_next) */
    entry_write(p->log.bytes + p->log.end, &item, e.flags);
    p->log.end += entry_bytes(e.size_bytes);
    p->log.replay = p->log.end; /* emitted: not to be replayed now */
    p->log.records++;
  }
  p->emitted_next = e.position + 1;
  p->drain_offset += entry_bytes(e.size_bytes);
  p->drain_left--;
  return 0;
}

static int push_next(sl_ctx *ctx, void *state) {
  sl_push *p = state;
  assert(drain_check(p));
  if (!p->attempt_decided) /* nothing was restored (note 6) */
    decide_unrestored(p);
  uint32_t budget = PUSH_RECORDS_PER_CALL;
  int rc = replay_some(ctx, p, &budget);
  if (rc || p->log.replay < p->log.end)
    return rc;
  if (p->drain_left == 0) {
    rc = take_queue(ctx, p);
    if (rc || p->drain_left == 0)
      return rc;
  }
  bool waited = false;
  for (; budget > 0 && p->drain_left && !waited; budget--) {
    rc = drain_one(ctx, p, &waited);
    if (rc)
      return rc;
  }
  if (p->drain_left == 0) {
    p->draining.used_bytes = 0;
    p->draining.records = 0;
    p->drain_offset = 0;
  }
  return 0;
}

/* Every instance exit (end, stop, failure, before a restart): sleeping
 * pushers and pollers look at the job again (notes 4, 9). */
static void push_close_instance(sl_ctx *ctx, void *state) {
  (void)ctx;
  sl_push *p = state;
  pthread_mutex_lock(&p->lock);
  if (p->pushers_waiting)
    pthread_cond_broadcast(&p->room);
  if (atomic_load(&p->job->stopping) || job_over(p->job))
    signal_fd(p);
  pthread_mutex_unlock(&p->lock);
}

/* The operator's user_free: sl_job_destroy, after every thread ended. */
static void push_free(void *user) {
  sl_push *p = user;
  if (p->event_fd >= 0)
    close(p->event_fd);
  pthread_cond_destroy(&p->data);
  pthread_cond_destroy(&p->room);
  pthread_mutex_destroy(&p->lock);
  free(p->filling.bytes);
  free(p->draining.bytes);
  free(p->log.bytes);
  free(p);
}

static int push_new(sl_job *job, uint32_t capacity_records, sl_push **out) {
  sl_push *p = calloc(1, sizeof *p);
  if (!p)
    return ENOMEM;
  p->job = job;
  p->capacity_records = capacity_records;
  p->max_record_bytes = job->config.max_record_bytes;
  p->replay_capacity_records = PUSH_DEFAULT_REPLAY;
  p->event_fd = -1;
  atomic_init(&p->filling_records_shared, 0);
  atomic_init(&p->closed_shared, false);
  atomic_init(&p->dropped, 0);
  pthread_condattr_t attr;
  int rc = pthread_condattr_init(&attr);
  if (rc) {
    free(p);
    return rc;
  }
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC); /* deadline_after */
  rc = pthread_mutex_init(&p->lock, 0);
  if (rc == 0 && (rc = pthread_cond_init(&p->room, &attr)) != 0)
    pthread_mutex_destroy(&p->lock);
  if (rc == 0 && (rc = pthread_cond_init(&p->data, &attr)) != 0) {
    pthread_cond_destroy(&p->room);
    pthread_mutex_destroy(&p->lock);
  }
  pthread_condattr_destroy(&attr);
  if (rc) {
    free(p);
    return rc;
  }
  *out = p;
  return 0;
}

SL_EXPORT int sl_source_push(sl_job *job, const char *name,
                             uint32_t capacity_records, sl_op **op,
                             sl_push **push) {
  if (push)
    *push = 0;
  if (!job || !op || !push)
    return EINVAL;
  if (job->state != SL_JOB_BUILDING)
    return SL_ESTARTED;
  if (capacity_records > PUSH_MAX_CAPACITY) {
    sl_job_set_error(job, "push source '%s': capacity of %" PRIu32
                     " records is over %u", name ? name : "(null)",
                     capacity_records, PUSH_MAX_CAPACITY);
    return EINVAL;
  }
  sl_push *p;
  int rc = push_new(job, capacity_records ? capacity_records
                                          : PUSH_DEFAULT_CAPACITY, &p);
  if (rc)
    return rc;
  static const sl_source_ops ops = {.open = push_open,
                                    .next = push_next,
                                    .close = push_close_instance,
                                    .snapshot = push_snapshot,
                                    .restore = push_restore,
                                    .checkpoint_complete = push_complete};
  rc = op_adopt(sl_op_source(job, name, 1, &ops, p, op), op, p, push_free);
  if (rc == 0)
    *push = p;
  return rc;
}

/* ------------------------------------------------------------ callback sink
 *
 * A process operator whose process() calls the application's function.
 * The optional checkpoint function turns the engine's snapshot, completion
 * and restore hooks into SL_CALLBACK_* events (sluice_embed.h); the final
 * snapshot's id 0 and the final completion become UINT64_MAX, so that "commit
 * everything pre-committed with an id <= the completed one" is right for
 * both, as in the transactional file sink (file_sink.c note 2). */

typedef struct callback_sink {
  sl_callback_fn fn;
  void *user;
  sl_callback_checkpoint_fn checkpoint; /* NULL: none */
} callback_sink;

typedef struct callback_instance {
  const callback_sink *sink;
  int index;
  uint64_t records; /* received in this attempt, for messages */
} callback_instance;

static const char *event_name(int event) {
  switch (event) {
  case SL_CALLBACK_SNAPSHOT:
    return "snapshot";
  case SL_CALLBACK_COMPLETE:
    return "completion";
  default:
    return "restore";
  }
}

static int callback_open(sl_ctx *ctx, void *user, void **state) {
  callback_instance *c = calloc(1, sizeof *c);
  if (!c)
    return ENOMEM;
  c->sink = user;
  c->index = sl_ctx_instance(ctx);
  *state = c;
  return 0;
}

static int callback_process(sl_ctx *ctx, void *state, int input,
                            const sl_record *rec) {
  (void)input;
  callback_instance *c = state;
  c->records++;
  int rc = c->sink->fn(c->sink->user, c->index, rec);
  if (rc == 0) /* anything else fails (runtime.c note 8) */
    return 0;
  sl_ctx_fail(ctx, "callback returned %d on record %" PRIu64
              " of this instance", rc, c->records);
  return rc;
}

/* Deliver a checkpoint event; 0, or the function's value with the cause
 * set. */
static int callback_event(sl_ctx *ctx, callback_instance *c, int event,
                          uint64_t id) {
  if (!c->sink->checkpoint)
    return 0;
  int rc = c->sink->checkpoint(c->sink->user, c->index, event, id);
  if (rc == 0) /* anything else fails (runtime.c note 8) */
    return 0;
  if (id == UINT64_MAX)
    sl_ctx_fail(ctx, "checkpoint function returned %d on the %s of the "
                "final checkpoint", rc, event_name(event));
  else
    sl_ctx_fail(ctx, "checkpoint function returned %d on the %s of "
                "checkpoint %" PRIu64, rc, event_name(event), id);
  return rc;
}

static int callback_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  return callback_event(ctx, state, SL_CALLBACK_SNAPSHOT,
                        id ? id : UINT64_MAX);
}

static void callback_complete(sl_ctx *ctx, void *state, uint64_t id) {
  if (atomic_load(&ctx->job->cp_final_done))
    id = UINT64_MAX; /* the final checkpoint: commit everything */
  int rc = callback_event(ctx, state, SL_CALLBACK_COMPLETE, id);
  if (rc)
    sl_instance_fail(ctx, rc); /* committed output must not silently lag */
}

static int callback_restore(sl_ctx *ctx, void *state, uint64_t id) {
  return callback_event(ctx, state, SL_CALLBACK_RESTORE, id);
}

static void callback_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  free(state);
}

static const sl_process_ops callback_ops = {.open = callback_open,
                                            .process = callback_process,
                                            .close = callback_close,
                                            .snapshot = callback_snapshot,
                                            .checkpoint_complete =
                                                callback_complete,
                                            .restore = callback_restore};

SL_EXPORT int sl_sink_callback(sl_job *job, const char *name, sl_op *input,
                               int parallelism, sl_callback_fn fn, void *user,
                               sl_op **op) {
  if (!job || !op)
    return EINVAL;
  if (job->state != SL_JOB_BUILDING)
    return SL_ESTARTED;
  if (!fn) {
    sl_job_set_error(job, "callback sink '%s': no callback function",
                     name ? name : "(null)");
    return EINVAL;
  }
  callback_sink *sink = calloc(1, sizeof *sink);
  if (!sink)
    return ENOMEM;
  sink->fn = fn;
  sink->user = user;
  int rc = sl_op_sink(job, name, input, parallelism, &callback_ops, sink, op);
  return op_adopt(rc, op, sink, free);
}

SL_EXPORT int sl_sink_callback_checkpoints(sl_op *op,
                                           sl_callback_checkpoint_fn fn) {
  if (!op || op->kind != SL_OP_SINK ||
      op->fn.process.process != callback_process)
    return EINVAL;
  if (op->job->state != SL_JOB_BUILDING)
    return SL_ESTARTED;
  ((callback_sink *)op->user)->checkpoint = fn;
  return 0;
}
