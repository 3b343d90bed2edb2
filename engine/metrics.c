/* metrics.c — a snapshot of a running (or ended) job for pollers: the
 * instances' counters, their busy / idle / backpressured time, ring
 * occupancy, watermarks, keyed state size, and the job's state, failures
 * and checkpoints (sluice.h, "Metrics").
 *
 * NOTES ON THE DESIGN
 *
 * 1. Counters have one writer, the instance's thread, which keeps them in
 *    plain fields and publishes copies with relaxed atomic stores once per
 *    pass over its inputs, or per call of a source's next()
 *    (runtime.c, publish_counters).  The per-record cost is one add to a
 *    field of its own; there is no lock and no atomic read-modify-write on
 *    the hot path.  A reader loads the copies relaxed: each value is one
 *    the instance really had, at most one pass old.
 * 2. Times are accounted per wait, not per record: the thread's start and
 *    exit, and the start and end of every wait that does not end at its
 *    first look (runtime.c, wait_until), each read the monotonic clock
 *    once.  Busy time is never counted: it is the thread's lifetime minus
 *    its waits, so the three always add up to the lifetime.
 * 3. The time fields of an instance (sl_instance_times) change together,
 *    so they are published under a sequence counter (a seqlock, written by
 *    the owner only: plain stores, no read-modify-write).  A reader retries
 *    a bounded number of times while the count is odd or changes; a wait
 *    under way counts up to the moment of the read, so the figures grow
 *    smoothly between two snapshots instead of jumping at the wait's end.
 * 4. Ring occupancy is read from the rings' shared head and tail counters
 *    (relaxed: a fill level needs no ordering).  A restart empties the rings
 *    in place (failover.c), rewriting those counters; it makes
 *    job->ring_reset_seq odd for that time, and a snapshot that saw the
 *    count odd, or changed, reports every ring empty instead.
 * 5. The job's final result and failure message are plain fields: a reader
 *    looks at them only after it saw state FINISHED, which sl_job_wait()
 *    stores after them.  While the job runs, the newest failure comes from
 *    the failover history, which has its own lock.
 * 6. The checkpoint figures are copied under the history lock, which only
 *    the coordinator takes otherwise (sl_checkpointer_metrics).
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Reads of one instance's times before a reader gives up on a consistent
 * copy (note 3).  The owner's critical section is a few stores, so only a
 * preempted owner makes a reader use this many; it then takes the last
 * copy it read, which is off by at most one wait. */
#define TIMES_READ_TRIES 64

/* ------------------------------------------------------- owner side */

static void times_write_begin(sl_instance_times *t) {
  uint64_t seq = atomic_load_explicit(&t->seq, memory_order_relaxed);
  assert(seq % 2 == 0); /* one writer: never nested */
  /* An exchange, not a store: a full barrier, so the clock the owner reads
   * next (the time a wait began or ended) is read after any reader can see
   * the odd count.  Otherwise a reader could take its own, later clock
   * with the old fields, count a wait up to then, and the owner then store
   * less: a snapshot going backwards.  The field stores that follow are
   * release stores (put), ordered after the odd count (note 3).  Only
   * waits and thread starts and exits write here, never a record. */
  atomic_exchange_explicit(&t->seq, seq + 1, memory_order_seq_cst);
}

static void times_write_end(sl_instance_times *t) {
  uint64_t seq = atomic_load_explicit(&t->seq, memory_order_relaxed);
  assert(seq % 2 == 1);
  /* Release: the field stores are visible before the even count. */
  atomic_store_explicit(&t->seq, seq + 1, memory_order_release);
}

/* Relaxed loads: the owner reads back what only it writes; readers of
 * counters need no ordering (note 1), readers of times get it from the
 * sequence counter (note 3). */
static uint64_t load(const _Atomic uint64_t *field) {
  return atomic_load_explicit(field, memory_order_relaxed);
}

/* A store of a times field inside the owner's section (note 3). */
static void put(_Atomic uint64_t *field, uint64_t value) {
  atomic_store_explicit(field, value, memory_order_release);
}

/* A load of a times field by a reader: acquire, so the second look at the
 * sequence count cannot come before it (note 3). */
static uint64_t load_acquire(const _Atomic uint64_t *field) {
  return atomic_load_explicit(field, memory_order_acquire);
}

void sl_times_thread_start(sl_instance *inst) {
  sl_instance_times *t = &inst->times;
  assert(load(&t->alive_since_ns) == 0); /* the previous attempt exited */
  times_write_begin(t);
  uint64_t now = sl_now_ns(); /* inside the section (times_write_begin) */
  put(&t->alive_since_ns, now ? now : 1); /* 0 means "not running" */
  put(&t->wait_since_ns, 0);
  times_write_end(t);
}

void sl_times_thread_exit(sl_instance *inst) {
  sl_instance_times *t = &inst->times;
  uint64_t since = load(&t->alive_since_ns);
  assert(since != 0);
  assert(load(&t->wait_since_ns) == 0); /* every wait ended */
  times_write_begin(t);
  uint64_t now = sl_now_ns(); /* inside the section (times_write_begin) */
  put(&t->alive_before_ns,
      load(&t->alive_before_ns) + (now > since ? now - since : 0));
  put(&t->alive_since_ns, 0);
  times_write_end(t);
}

uint64_t sl_times_wait_begin(sl_instance *inst, enum sl_wait_kind kind) {
  sl_instance_times *t = &inst->times;
  assert(load(&t->wait_since_ns) == 0); /* waits do not nest */
  times_write_begin(t);
  uint64_t now = sl_now_ns(); /* inside the section (times_write_begin) */
  if (now == 0)
    now = 1; /* 0 means "no wait" */
  put(&t->wait_since_ns, now);
  atomic_store_explicit(&t->wait_kind, (int)kind, memory_order_release);
  times_write_end(t);
  return now;
}

void sl_times_wait_end(sl_instance *inst, enum sl_wait_kind kind,
                       uint64_t since_ns) {
  sl_instance_times *t = &inst->times;
  assert(load(&t->wait_since_ns) == since_ns);
  _Atomic uint64_t *total =
      kind == SL_WAIT_IDLE ? &t->idle_ns : &t->backpressured_ns;
  times_write_begin(t);
  uint64_t now = sl_now_ns(); /* inside the section (times_write_begin) */
  uint64_t waited = now > since_ns ? now - since_ns : 0;
  put(total, load(total) + waited);
  put(&t->wait_since_ns, 0);
  times_write_end(t);
}

/* ------------------------------------------------------- reader side */

typedef struct times_copy {
  uint64_t alive_since_ns, alive_before_ns, idle_ns, backpressured_ns;
  uint64_t wait_since_ns;
  int wait_kind;
} times_copy;

static void times_load(const sl_instance_times *t, times_copy *c) {
  c->alive_since_ns = load_acquire(&t->alive_since_ns);
  c->alive_before_ns = load_acquire(&t->alive_before_ns);
  c->idle_ns = load_acquire(&t->idle_ns);
  c->backpressured_ns = load_acquire(&t->backpressured_ns);
  c->wait_since_ns = load_acquire(&t->wait_since_ns);
  c->wait_kind = atomic_load_explicit(&t->wait_kind, memory_order_acquire);
}

/* A consistent copy of t (note 3) and the time *now_ns at which it held,
 * or after TIMES_READ_TRIES the last one read.  The clock is read inside
 * the checked section: had the owner begun or ended a wait before that
 * instant, the count would have changed, so the copy and the instant
 * agree and successive snapshots never go backwards. */
static void times_read(const sl_instance_times *t, times_copy *c,
                       uint64_t *now_ns) {
  for (int tries = 0; tries < TIMES_READ_TRIES; tries++) {
    uint64_t before = atomic_load_explicit(&t->seq, memory_order_acquire);
    times_load(t, c);
    *now_ns = sl_now_ns();
    /* The field loads were acquire loads: this second look at the count
     * comes after them. */
    uint64_t after = atomic_load_explicit(&t->seq, memory_order_relaxed);
    if (before == after && before % 2 == 0)
      return;
    sl_cpu_relax();
  }
}

static uint64_t elapsed(uint64_t now, uint64_t since) {
  return since != 0 && now > since ? now - since : 0;
}

static void instance_times(const sl_instance *inst, sl_instance_metrics *out) {
  times_copy c = {0};
  uint64_t now = 0;
  times_read(&inst->times, &c, &now);
  uint64_t alive = c.alive_before_ns + elapsed(now, c.alive_since_ns);
  uint64_t waiting = elapsed(now, c.wait_since_ns);
  out->running = c.alive_since_ns != 0;
  out->idle_ns = c.idle_ns + (c.wait_kind == SL_WAIT_IDLE ? waiting : 0);
  out->backpressured_ns =
      c.backpressured_ns + (c.wait_kind == SL_WAIT_IDLE ? 0 : waiting);
  uint64_t waited = out->idle_ns + out->backpressured_ns;
  /* Equal to the waits only after an inconsistent read (note 3). */
  out->busy_ns = alive > waited ? alive - waited : 0;
}

/* Published, unread bytes of r over its capacity (note 4). */
static double ring_fill(const sl_ring *r) {
  /* head first: the tail read after it is at least as new, so tail >=
   * head; it may run ahead by more than a ring, hence the clamp. */
  uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
  uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
  uint64_t capacity = r->capacity_bytes;
  if (capacity == 0 || tail <= head)
    return 0;
  uint64_t used = tail - head < capacity ? tail - head : capacity;
  return (double)used / (double)capacity;
}

static void instance_rings(const sl_instance *inst, sl_instance_metrics *out) {
  double sum = 0, max = 0;
  for (int c = 0; c < inst->channel_count; c++) {
    double fill = ring_fill(inst->channels[c].ring);
    sum += fill;
    max = fill > max ? fill : max;
  }
  out->input_rings = inst->channel_count;
  out->input_fill_ratio = inst->channel_count ? sum / inst->channel_count : 0;
  out->input_fill_max_ratio = max;
  double out_max = 0;
  int rings = 0;
  for (int o = 0; o < inst->output_count; o++) {
    const sl_output *output = &inst->outputs[o];
    for (int k = 0; k < output->ring_count; k++, rings++) {
      double fill = ring_fill(output->rings[k]);
      out_max = fill > out_max ? fill : out_max;
    }
  }
  out->output_rings = rings;
  out->output_fill_max_ratio = out_max;
}

static void instance_metrics(const sl_instance *inst, int operator_index,
                             bool read_rings, int64_t now_ms,
                             sl_instance_metrics *out) {
  memset(out, 0, sizeof *out);
  out->name = inst->op->name;
  out->operator_index = operator_index;
  out->instance = inst->index;
  out->records_in = load(&inst->records_in_shared);
  out->records_out = load(&inst->records_out_shared);
  out->bytes_in = load(&inst->bytes_in_shared);
  out->bytes_out = load(&inst->bytes_out_shared);
  out->late_records = load(&inst->counters_shared[SL_COUNT_LATE]);
  out->dead_letters = load(&inst->counters_shared[SL_COUNT_DEAD_LETTER]);
  out->state_entries = load(&inst->state_entries_shared);
  out->state_bytes = load(&inst->state_bytes_shared);
  out->watermark =
      atomic_load_explicit(&inst->watermark_shared, memory_order_relaxed);
  out->has_watermark_lag =
      out->watermark > 0 && out->watermark != SL_WATERMARK_MAX;
  if (out->has_watermark_lag)
    out->watermark_lag_ms = now_ms - out->watermark;
  instance_times(inst, out);
  if (read_rings)
    instance_rings(inst, out);
}

/* ------------------------------------------------------- the job */

SL_EXPORT const char *sl_job_status_name(int status) {
  static const char *const names[] = {"CREATED",  "RUNNING",  "FAILING",
                                      "CANCELLING", "FINISHED", "FAILED",
                                      "CANCELED"};
  _Static_assert(sizeof names / sizeof names[0] == SL_JOB_STATUS_CANCELED + 1,
                 "a name per status");
  if (status < 0 || status > SL_JOB_STATUS_CANCELED)
    return "UNKNOWN";
  return names[status];
}

/* Note 5: the result is read only once FINISHED was seen. */
static int job_status(const sl_job *job, int state) {
  if (state == SL_JOB_BUILDING)
    return SL_JOB_STATUS_CREATED;
  if (state == SL_JOB_FINISHED) {
    assert(job->waited);
    if (job->result == 0)
      return SL_JOB_STATUS_FINISHED;
    return job->result == SL_ESTOPPED ? SL_JOB_STATUS_CANCELED
                                      : SL_JOB_STATUS_FAILED;
  }
  if (atomic_load(&job->failed))
    return SL_JOB_STATUS_FAILING;
  if (atomic_load(&job->user_stopped))
    return SL_JOB_STATUS_CANCELLING;
  return SL_JOB_STATUS_RUNNING;
}

static void last_failure(const sl_job *job, sl_metrics *m) {
  if (m->state == SL_JOB_STATUS_FAILED) {
    m->last_failure_status = job->result;
    sl_copy_text(m->last_failure, sizeof m->last_failure, job->error);
    return;
  }
  sl_recovery_stats r;
  if (sl_job_recovery_stats(job, 0, &r) == 0) {
    m->last_failure_status = r.status;
    sl_copy_text(m->last_failure, sizeof m->last_failure, r.cause);
  }
}

static void operator_sums(sl_operator_metrics *op,
                          const sl_instance_metrics *instances) {
  op->watermark = SL_WATERMARK_MIN;
  for (int k = 0; k < op->parallelism; k++) {
    const sl_instance_metrics *i = &instances[op->first_instance + k];
    op->records_in += i->records_in;
    op->records_out += i->records_out;
    op->bytes_in += i->bytes_in;
    op->bytes_out += i->bytes_out;
    op->state_entries += i->state_entries;
    op->state_bytes += i->state_bytes;
    op->late_records += i->late_records;
    op->dead_letters += i->dead_letters;
    if (k == 0 || i->watermark < op->watermark)
      op->watermark = i->watermark;
  }
}

/* Every operator and instance (notes 1 to 4). */
static void fill_instances(const sl_job *job, sl_metrics *m) {
  uint64_t rings_seq = atomic_load(&job->ring_reset_seq);
  int64_t now_ms = sl_wall_ms();
  int next = 0;
  for (int i = 0; i < job->physical_count; i++) {
    const sl_op *op = job->physical[i];
    sl_operator_metrics *om = &m->operators[i];
    om->name = op->name;
    om->parallelism = op->parallelism;
    om->first_instance = next;
    for (int k = 0; k < op->parallelism; k++, next++)
      instance_metrics(&op->instances[k], i, rings_seq % 2 == 0, now_ms,
                       &m->instances[next]);
    operator_sums(om, m->instances);
  }
  assert(next == m->instance_count);
  if (atomic_load(&job->ring_reset_seq) != rings_seq) { /* note 4 */
    for (int i = 0; i < m->instance_count; i++) {
      m->instances[i].input_fill_ratio = 0;
      m->instances[i].input_fill_max_ratio = 0;
      m->instances[i].output_fill_max_ratio = 0;
    }
  }
}

static int allocate(const sl_job *job, bool history, sl_metrics *m) {
  m->operator_count = job->physical_count;
  m->instance_count = job->instance_count;
  m->operators = calloc((size_t)job->physical_count, sizeof *m->operators);
  m->instances = calloc((size_t)job->instance_count, sizeof *m->instances);
  if (history && job->cp) {
    m->history = calloc(SL_CHECKPOINT_HISTORY, sizeof *m->history);
    m->history_instances =
        calloc((size_t)SL_CHECKPOINT_HISTORY * (size_t)job->instance_count,
               sizeof *m->history_instances);
    if (!m->history || !m->history_instances)
      return ENOMEM;
  }
  return m->operators && m->instances ? 0 : ENOMEM;
}

SL_EXPORT int sl_job_metrics(const sl_job *job, unsigned flags,
                             sl_metrics *out) {
  if (!job || !out || (flags & ~SL_METRICS_HISTORY))
    return EINVAL;
  memset(out, 0, sizeof *out);
  out->time_ms = sl_wall_ms();
  /* Seq-cst load: sl_job_start() compiled the job, and set the fields
   * read below, before it stored RUNNING. */
  int state = atomic_load(&job->state);
  out->state = job_status(job, state);
  if (state == SL_JOB_BUILDING)
    return SL_ENOTSTARTED;
  assert(job->physical && job->instances);
  int rc = allocate(job, flags & SL_METRICS_HISTORY, out);
  if (rc) {
    sl_metrics_free(out);
    return rc;
  }
  out->start_time_ms = job->start_wall_ms;
  uint64_t end = atomic_load(&job->end_ns);
  uint64_t now = end ? end : sl_now_ns();
  out->uptime_ns = now > job->start_ns ? now - job->start_ns : 0;
  out->source_records = sl_job_progress(job);
  out->restarts = sl_job_restarts(job);
  out->faults_fired = sl_job_faults_fired(job);
  last_failure(job, out);
  fill_instances(job, out);
  sl_checkpointer_metrics(job, out, out->history != 0);
  return 0;
}

SL_EXPORT void sl_metrics_free(sl_metrics *m) {
  if (!m)
    return;
  free(m->operators);
  free(m->instances);
  free(m->history);
  free(m->history_instances);
  memset(m, 0, sizeof *m);
}
