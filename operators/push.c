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
 *    that finds it full waits.  With `draining`, at most
 *    2 * capacity_records records are held.  A buffer's bytes grow by
 *    doubling to what its records need (entries: a 16-byte header, then
 *    the payload padded to 8 bytes).
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
 *    is lost; the timeouts are a second line, not the mechanism.
 * 4. The end of the job.  A push is refused with SL_ESTOPPED once nothing
 *    will ever take the queue (job_over): the job finished (sl_job_wait
 *    returned), or it is stopping and no restart can follow (the user
 *    stopped it, it failed with no restart strategy, or the strategy gave
 *    up).  The source's
 *    close callback, which every instance exit runs, broadcasts `room` so
 *    that sleeping pushers look at once; the sleep's timeout covers the
 *    cases where no instance is left to tell them (a strategy that gives
 *    up: the supervisor sets job->restarts_over when it returns).
 * 5. Restarts.  The queue, `draining` and its cursor live in the operator's
 *    user data, which outlives instance threads (a restart's new thread
 *    starts after the old one was joined).  So the new instance goes on
 *    with the records not emitted yet; records emitted before the failure
 *    and still in the rings are discarded with them (at-most-once).  No
 *    position is checkpointed: a resume from a state directory starts with
 *    the queue the application fills.
 * 6. End of input: sl_push_close() sets `closed`; the source returns
 *    SL_SOURCE_END once it is set and both buffers are empty.
 *
 * Pusher (sl_push_record / sl_push_batch), under the mutex:
 *
 *   check --[closed]--> SL_EUSAGE        check --[job_over]--> SL_ESTOPPED
 *     |  \--[room]--> append, signal `data` if the source sleeps --> 0
 *     |
 *     +--[full]--> spin (unlocked) --> sleep on `room` --> check
 *                  [wait_for_room]      [woken by: swap, close, source
 *                                        close callback, timeout]
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "op_util.h"

/* Records emitted per next() call (see builtin.c for why a batch). */
#define PUSH_RECORDS_PER_CALL 1024u
/* Default and largest queue capacity in records. */
#define PUSH_DEFAULT_CAPACITY 4096u
#define PUSH_MAX_CAPACITY (1u << 24)
/* Spins (each a CPU pause, ~20 ns here) before sleeping: about what a swap
 * and a few hundred emits take, short enough not to hold a core (note 3). */
#define PUSH_SPIN_ITERATIONS 200
/* Longest sleep of a pusher before it looks at the job again (note 4). */
#define PUSH_PUSHER_WAIT_NS 10000000ull
/* Longest sleep of the source inside next() (note 3). */
#define PUSH_SOURCE_WAIT_NS 1000000ull
/* First allocation of a buffer. */
#define PUSH_INITIAL_BYTES 65536u

/* The header of one queued record (note 2). */
typedef struct push_entry {
  uint32_t size_bytes;
  uint32_t reserved;
  int64_t timestamp;
} push_entry;
_Static_assert(sizeof(push_entry) == 16, "entries stay 8-byte aligned");

static inline size_t entry_bytes(uint32_t size_bytes) {
  return sizeof(push_entry) + (((size_t)size_bytes + 7u) & ~(size_t)7u);
}

typedef struct push_buffer {
  uint8_t *bytes;
  size_t used_bytes;
  size_t capacity_bytes;
  uint32_t records;
} push_buffer;

struct sl_push {
  sl_job *job;
  uint32_t capacity_records;
  uint32_t max_record_bytes; /* the job's, fixed at sl_job_create */
  pthread_mutex_t lock;
  pthread_cond_t room; /* pushers sleep here (note 3) */
  pthread_cond_t data; /* the source sleeps here */
  /* Under lock. */
  push_buffer filling;
  uint32_t pushers_waiting;
  bool source_waiting;
  bool closed;
  /* Relaxed copies, for spinning without the lock; every decision is made
   * again under it. */
  _Atomic uint32_t filling_records_shared;
  _Atomic bool closed_shared;
  /* The source instance's own (note 5). */
  push_buffer draining;
  size_t drain_offset;
  uint32_t drain_left; /* records of draining not emitted yet */
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
  return true;
}

/* The source side of p; on the source's thread. */
__attribute__((unused)) /* asserts only */
static inline bool drain_check(const sl_push *p) {
  assert(buffer_check(&p->draining));
  assert(p->drain_left <= p->draining.records);
  assert(p->drain_offset <= p->draining.used_bytes);
  assert((p->drain_left == 0) == (p->drain_offset == p->draining.used_bytes));
  return true;
}

/* Room for extra more bytes; ENOMEM leaves b as it was. */
static int buffer_reserve(push_buffer *b, size_t extra) {
  size_t needed = b->used_bytes + extra;
  if (needed <= b->capacity_bytes)
    return 0;
  size_t bytes = b->capacity_bytes ? b->capacity_bytes : PUSH_INITIAL_BYTES;
  while (bytes < needed)
    bytes *= 2; /* needed < 2^40 (records bounded, sizes bounded) */
  uint8_t *grown = realloc(b->bytes, bytes);
  if (!grown)
    return ENOMEM;
  b->bytes = grown;
  b->capacity_bytes = bytes;
  return 0;
}

static void buffer_append(push_buffer *b, const void *data,
                          uint32_t size_bytes, int64_t timestamp) {
  push_entry e = {.size_bytes = size_bytes, .timestamp = timestamp};
  memcpy(b->bytes + b->used_bytes, &e, sizeof e);
  if (size_bytes)
    memcpy(b->bytes + b->used_bytes + sizeof e, data, size_bytes);
  b->used_bytes += entry_bytes(size_bytes);
  b->records++;
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
  if (!atomic_load(&job->stopping))
    return false;
  return atomic_load(&job->user_stopped) ||
         job->config.restart.strategy == SL_RESTART_NONE ||
         atomic_load(&job->restarts_over); /* the strategy gave up */
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

/* Queue count records of size_bytes at records (timestamps NULL: none);
 * *pushed receives how many were queued.  Note 1 and the diagram. */
static int push_run(sl_push *p, const uint8_t *records, uint32_t size_bytes,
                    uint32_t count, const int64_t *timestamps,
                    uint32_t *pushed) {
  uint32_t done = 0;
  int spins = 0;
  int rc = 0;
  pthread_mutex_lock(&p->lock);
  while (done < count) {
    assert(queue_check(p));
    if (p->closed) {
      rc = SL_EUSAGE;
      break;
    }
    if (job_over(p->job)) {
      rc = SL_ESTOPPED;
      break;
    }
    uint32_t room = p->capacity_records - p->filling.records;
    if (room == 0) {
      wait_for_room(p, &spins);
      continue;
    }
    uint32_t n = count - done < room ? count - done : room;
    rc = buffer_reserve(&p->filling, (size_t)n * entry_bytes(size_bytes));
    if (rc)
      break;
    for (uint32_t k = 0; k < n; k++, done++)
      buffer_append(&p->filling,
                    size_bytes ? records + (size_t)done * size_bytes : 0,
                    size_bytes, timestamps ? timestamps[done] : SL_NO_TIMESTAMP);
    atomic_store_explicit(&p->filling_records_shared, p->filling.records,
                          memory_order_relaxed);
    if (p->source_waiting)
      pthread_cond_signal(&p->data);
  }
  pthread_mutex_unlock(&p->lock);
  *pushed = done;
  return rc;
}

SL_EXPORT int sl_push_record(sl_push *p, const void *data,
                             uint32_t size_bytes, int64_t timestamp) {
  if (!p || (!data && size_bytes))
    return EINVAL;
  if (size_bytes > p->max_record_bytes)
    return SL_ETOOBIG;
  uint32_t pushed;
  return push_run(p, data, size_bytes, 1, &timestamp, &pushed);
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
  else
    rc = push_run(p, records, size_bytes, count, timestamps, &done);
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
  pthread_mutex_unlock(&p->lock);
}

/* ------------------------------------------------------------ source */

/* Parallelism 1: the instance state is the handle itself (note 5). */
static int push_open(sl_ctx *ctx, void *user, void **state) {
  (void)ctx;
  *state = user;
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
  } else if (p->closed) {
    rc = SL_SOURCE_END;
  }
  pthread_mutex_unlock(&p->lock);
  return rc;
}

static int push_next(sl_ctx *ctx, void *state) {
  sl_push *p = state;
  assert(drain_check(p));
  if (p->drain_left == 0) {
    int rc = take_queue(ctx, p);
    if (rc || p->drain_left == 0)
      return rc;
  }
  for (uint32_t n = 0; n < PUSH_RECORDS_PER_CALL && p->drain_left; n++) {
    push_entry e;
    memcpy(&e, p->draining.bytes + p->drain_offset, sizeof e);
    assert(e.size_bytes <= p->max_record_bytes);
    int rc = sl_emit_ts(ctx, p->draining.bytes + p->drain_offset + sizeof e,
                        e.size_bytes, e.timestamp);
    if (rc)
      return rc; /* not emitted: the cursor stays on it (note 5) */
    p->drain_offset += entry_bytes(e.size_bytes);
    p->drain_left--;
  }
  if (p->drain_left == 0) {
    p->draining.used_bytes = 0;
    p->draining.records = 0;
    p->drain_offset = 0;
  }
  return 0;
}

/* Every instance exit (end, stop, failure, before a restart): sleeping
 * pushers look at the job again (note 4). */
static void push_close_instance(sl_ctx *ctx, void *state) {
  (void)ctx;
  sl_push *p = state;
  pthread_mutex_lock(&p->lock);
  if (p->pushers_waiting)
    pthread_cond_broadcast(&p->room);
  pthread_mutex_unlock(&p->lock);
}

/* The operator's user_free: sl_job_destroy, after every thread ended. */
static void push_free(void *user) {
  sl_push *p = user;
  pthread_cond_destroy(&p->data);
  pthread_cond_destroy(&p->room);
  pthread_mutex_destroy(&p->lock);
  free(p->filling.bytes);
  free(p->draining.bytes);
  free(p);
}

static int push_new(sl_job *job, uint32_t capacity_records, sl_push **out) {
  sl_push *p = calloc(1, sizeof *p);
  if (!p)
    return ENOMEM;
  p->job = job;
  p->capacity_records = capacity_records;
  p->max_record_bytes = job->config.max_record_bytes;
  atomic_init(&p->filling_records_shared, 0);
  atomic_init(&p->closed_shared, false);
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
                                    .close = push_close_instance};
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
