/* instance.c — the life of an instance around its loop: its thread (start,
 * placement, name), open, restore, finish, close; the members its thread
 * runs; failing and stopping the job.  The loop itself (reading channels,
 * calling operators, emitting, waiting, chaining turns) is runtime.c.
 *
 * NOTES ON THE DESIGN OF AN INSTANCE'S LIFE
 *
 * 1. One thread per instance that runs in no other's (runtime.c note 12),
 *    created with its CPU (graph.c's placement, inst->cpu; -1: not pinned)
 *    in its attributes, so it never runs a line on another CPU.  It is
 *    named "sl:NAME[i]" twice, by its creator (start_thread) and by itself
 *    (instance_main), so the name is there once sl_job_start returns and
 *    before open runs, whichever comes first.
 * 2. One order, whatever happens (instance_run): start (open, restore, the
 *    restore hooks: instance_start), run (runtime.c: run_source,
 *    run_inputs, or for an instance restored as finished run_finished
 *    after instance_refinish, runtime.c note 7), finish (end-of-input
 *    timers, the finish callback, the final snapshot, END:
 *    sl_instance_finish_input), end (the wait for the final checkpoint,
 *    the failure told, close: instance_end).  Close runs if and only if
 *    open succeeded, and always last (runtime.c note 5).
 * 3. The members of a thread (runtime.c note 12) start after their
 *    runner's own start, upstream first, and end after its end, in start
 *    order (members_start, members_end); a member opens and closes
 *    whatever happened to its runner, as it would in a thread of its own.
 *    chain_phase (enum chain_phase, internal.h) says where a member is.
 * 4. The first failure writes the job's status and message (claimed by a
 *    compare-and-swap on job->failed, then published with a release store
 *    of fail_published: sl_job_failure); later failures are usually its
 *    consequences and only stop.  A callback's nonzero return is the
 *    status (runtime.c note 8).  A failure stops the job before the close
 *    callback runs, so the other instances stop promptly (DESIGN.md
 *    invariant 8).
 * 5. Stopping (sl_job_stop_internal) sets job->stopping, sequentially
 *    consistent so that it pairs with the fence in sl_parker_prepare, and
 *    then wakes every thread's parker: an instance about to park either
 *    sees the stop or is woken (runtime.c note 4, wait.h).
 *
 * Thread states (function making the transition in brackets):
 *
 *   created --[instance_main: open]--> running --[inputs ended]--> finishing
 *      |   \                              |                            |
 *      |    [restored finished:            | stop / failure             | END sent
 *      |     run_finished]---------------- | -------------------------> |
 *      | open failed                      |                            v
 *      v                                  v                            v
 *   failed <----------------------- stopping -----------------> closed, joined
 *                                     [sl_instance_fail / sl_job_stop]
 */
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "fault.h"
#include "internal.h"

#define unlikely(x) __builtin_expect(!!(x), 0)

/* The whole-instance checker, asserted at each state change of the diagram
 * above (never per record).  O(1): it looks at counters and flags, not at
 * the channels one by one. */
__attribute__((unused)) /* asserts only: NDEBUG builds drop the calls */
static bool instance_check(const sl_instance *inst) {
  assert(inst->job && inst->op);
  assert(inst->index >= 0 && inst->index < inst->op->parallelism);
  assert(inst->channel_count >= 0 && inst->output_count >= 0);
  assert(inst->channels_ended >= 0);
  assert(inst->channels_ended <= inst->channel_count);
  /* A source reads no channel; the fast emit path has one ring or none. */
  assert(inst->op->kind != SL_OP_SOURCE || inst->channel_count == 0);
  assert(!inst->forward_ring || inst->output_count == 1);
  /* Sinks never emit: runtime.c note 5 and sl_op_sink. */
  assert(!inst->in_sink || inst->op->kind == SL_OP_SINK);
  return true;
}

/* END on every output ring, published (runtime.c note 5). */
static int send_end(sl_instance *inst) {
  return sl_instance_write_control(inst, SL_ENTRY_END, 0);
}

/* ----------------------------------------------------------- failing */

void sl_job_fail(sl_job *job, int status, const char *fmt, ...) {
  int expected = 0;
  if (atomic_compare_exchange_strong(&job->failed, &expected, 1)) {
    sl_failover_note_failure(job);
    char message[SL_ERROR_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    job->fail_status = status;
    sl_job_set_error(job, "%s", message);
    atomic_store_explicit(&job->fail_published, 1, memory_order_release);
  }
  sl_job_stop_internal(job);
}

void sl_instance_fail(sl_instance *inst, int status) {
  sl_job *job = inst->job;
  /* running --[failure]--> stopping: a failure always has a status, and
   * a stop is no failure (instance_run tells them apart). */
  assert(status != 0);
  assert(instance_check(inst));
  int expected = 0;
  if (atomic_compare_exchange_strong(&job->failed, &expected, 1)) {
    sl_failover_note_failure(job);
    /* Only the first failure writes the message: later ones are usually
     * consequences of it. */
    job->fail_status = status; /* note 4: sl_job_wait returns it */
    char code[64];
    if (status < 0 && status > -4096)
      snprintf(code, sizeof code, "error %d", status);
    else
      snprintf(code, sizeof code, "status %d", status);
    sl_job_set_error(job, "operator '%s' instance %d/%d failed: %s%s%s (%s)",
                     inst->op->name, inst->index, inst->op->parallelism,
                     inst->cause, inst->cause[0] ? ": " : "",
                     sl_strerror(status), code);
    atomic_store_explicit(&job->fail_published, 1, memory_order_release);
  }
  sl_job_stop_internal(job);
  assert(atomic_load(&job->failed) == 1);
}

SL_EXPORT void sl_ctx_fail(sl_ctx *ctx, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ctx->cause, sizeof ctx->cause, fmt, ap);
  va_end(ap);
}

SL_EXPORT int sl_ctx_instance(const sl_ctx *ctx) { return ctx->index; }
SL_EXPORT int sl_ctx_parallelism(const sl_ctx *ctx) {
  return ctx->op->parallelism;
}
SL_EXPORT const char *sl_ctx_name(const sl_ctx *ctx) { return ctx->op->name; }
SL_EXPORT int sl_ctx_stopping(const sl_ctx *ctx) {
  return sl_job_stopping(ctx->job);
}

/* ----------------------------------------------------------- threads */

static void set_thread_name(sl_instance *inst, pthread_t thread) {
  /* "sl:NAME[i]" within the kernel's 16 bytes: the operator name is cut
   * so that the instance number always shows. */
  char index[16];
  int index_len = snprintf(index, sizeof index, "[%d]", inst->index);
  int name_room = 15 - 3 - index_len;
  char name[16] = "sl:";
  size_t used = 3;
  size_t op_len = strnlen(inst->op->name, (size_t)(name_room > 0 ? name_room : 0));
  memcpy(name + used, inst->op->name, op_len);
  used += op_len;
  memcpy(name + used, index, (size_t)index_len + 1);
  pthread_setname_np(thread, name);
}

static int instance_open(sl_instance *inst) {
  sl_op *op = inst->op;
  if (op->kind == SL_OP_SOURCE && op->fn.source.open)
    return op->fn.source.open(inst, op->user, &inst->state);
  if ((op->kind == SL_OP_PROCESS || op->kind == SL_OP_SINK) &&
      op->fn.process.open)
    return op->fn.process.open(inst, op->user, &inst->state);
  if (op->kind == SL_OP_SOURCE || op->kind == SL_OP_PROCESS ||
      op->kind == SL_OP_SINK)
    inst->state = op->user; /* no open: callbacks get the user pointer */
  return 0;
}

static void instance_close(sl_instance *inst) {
  sl_op *op = inst->op;
  if (op->kind == SL_OP_SOURCE && op->fn.source.close)
    op->fn.source.close(inst, inst->state);
  else if ((op->kind == SL_OP_PROCESS || op->kind == SL_OP_SINK) &&
           op->fn.process.close)
    op->fn.process.close(inst, inst->state);
}

static void instance_run(sl_instance *inst);

static void *instance_main(void *arg) {
  sl_instance *inst = arg;
  /* Named by itself before open runs, and by its creator too (start_
   * thread), so the name is there when sl_job_start returns. */
  set_thread_name(inst, pthread_self());
  sl_times_thread_start(inst);
  for (int i = 0; i < inst->member_count; i++)
    sl_times_thread_start(inst->members[i]); /* note 3: its thread's */
  instance_run(inst);
  for (int i = 0; i < inst->member_count; i++)
    sl_times_thread_exit(inst->members[i]);
  sl_times_thread_exit(inst);
  return 0;
}

/* After the end of input (rc 0) or a failure: the timers the end fires,
 * finish, the final snapshot and END. */
int sl_instance_finish_input(sl_instance *inst, int rc) {
  sl_op *op = inst->op;
  /* running --[inputs ended]--> finishing: every channel delivered END. */
  assert(rc != 0 || inst->channels_ended == inst->channel_count);
  assert(instance_check(inst));
  /* End of input: the final watermark fires every event-time timer still
   * pending, and the processing-time ones too (timer.c note 5). */
  if (rc == 0)
    rc = op->kind == SL_OP_SOURCE ? sl_event_source_end(inst)
                                  : sl_event_input_end(inst);
  if (rc == 0 && (op->kind == SL_OP_PROCESS || op->kind == SL_OP_SINK) &&
      op->fn.process.finish) {
    inst->current = 0;
    rc = op->fn.process.finish(inst, inst->state); /* runtime.c note 8 */
  }
  if (rc == 0)
    rc = sl_snapshot_final(inst); /* snapshot.c note 7 */
  assert(!inst->emit_closed); /* END is still to be written */
  return rc == 0 ? send_end(inst) : rc;
}

/* Run the instance to its end of input, finish, take the final snapshot
 * and write END. */
static int instance_finish(sl_instance *inst) {
  int rc = sl_instance_run_loop(inst);
  return sl_instance_finish_input(inst, rc);
}

/* runtime.c note 7: an instance restored as finished: its restored state
 * as its final snapshot, END, then its inputs up to their END. */
static int instance_refinish(sl_instance *inst) {
  assert(inst->cp.restored_finished);
  assert(inst->job->cp);
  assert(instance_check(inst));
  assert(inst->channels_ended == 0); /* nothing read yet: runtime.c note 7 */
  int rc = sl_snapshot_final_restored(inst);
  if (rc == 0)
    rc = send_end(inst);
  return rc;
}

/* What instance_start leaves to do. */
enum start_result {
  START_RUN,  /* opened and restored: run it */
  START_END,  /* opened, then a restore hook failed: end it with rc */
  START_GONE, /* it failed and is over (its open failed, or its restore,
                 which closed it): nothing more */
};

/* created --[open]--> running: open, restore and the restore hooks. */
static enum start_result instance_start(sl_instance *inst, int *rc_out) {
  assert(instance_check(inst));
  assert(!inst->emit_closed && !inst->stopped_early);
  assert(inst->current == 0);
  int rc = instance_open(inst);
  *rc_out = rc;
  if (rc) {
    if (!inst->cause[0])
      sl_ctx_fail(inst, "open callback returned %d", rc);
    sl_instance_fail(inst, rc);
    sl_checkpointer_restore_skip(inst); /* it will not restore */
    return START_GONE;
  }
  rc = sl_checkpointer_restore_instance(inst); /* fails the job itself */
  if (rc) {
    inst->emit_closed = true;
    instance_close(inst);
    return START_GONE;
  }
  if (inst->cp.restored_from && unlikely(inst->job->faults != 0)) {
    rc = sl_inject_occurrence(inst->job, inst, SL_FAULT_RESTORE, -1,
                              inst->cause, sizeof inst->cause);
    if (rc) {
      size_t used = strlen(inst->cause);
      snprintf(inst->cause + used, sizeof inst->cause - used,
               " while restoring checkpoint %" PRIu64, inst->cp.restored_from);
    }
  }
  if (rc == 0 && inst->cp.restored_from)
    rc = sl_event_restore(inst); /* timers from the restored state */
  if (rc == 0)
    rc = sl_snapshot_restore_hook(inst);
  if (rc && !inst->cause[0])
    sl_ctx_fail(inst, "restore from checkpoint %" PRIu64 " failed",
                inst->cp.restored_from);
  if (rc == 0 && inst->cp.restored_from && unlikely(inst->job->faults != 0))
    sl_inject_crash_point(inst->job, SL_CRASH_AFTER_RESTORE);
  *rc_out = rc;
  return rc ? START_END : START_RUN;
}

/* The end of an instance's life after rc (0: it finished): the wait for
 * the final checkpoint, then nothing more emitted, the failure or stop
 * told, and the close callback. */
static void instance_end(sl_instance *inst, int rc) {
  /* snapshot.c note 14: a checkpoint taken before a stop may still
   * complete; a failed instance's held ack is freed with it. */
  if (rc == 0 || rc == SL_ESTOPPED)
    sl_snapshot_finish_held(inst);
  if (rc == 0 && inst->cp.final_acked) {
    /* Sinks commit only once the final checkpoint is durable. */
    if (!sl_instance_wait_final(inst))
      rc = SL_ESTOPPED;
    else
      rc = sl_snapshot_notifications(inst);
  }
  /* After END (or on the way out) nothing may be emitted: the consumers
   * may have finished, and a record written now would be lost or wait
   * forever for room. */
  inst->emit_closed = true;
  assert(inst->current == 0); /* no record outlives its call */
  assert(instance_check(inst));
  sl_instance_counters_publish(inst);
  /* Stop the job before the close callback runs, so a failure stops the
   * other instances promptly (DESIGN.md invariant 8). */
  if (rc == SL_ESTOPPED && sl_job_stopping(inst->job))
    inst->stopped_early = true;
  else if (rc != 0)
    sl_instance_fail(inst, rc);
  /* runtime.c note 9: the stop checkpoint's completion reaches every
   * instance, also one that stopped before it looked (the stopper saw it
   * complete before it stopped the job, so the acquire in here sees it
   * too). */
  if (rc == SL_ESTOPPED && atomic_load(&inst->job->stopped_with_savepoint))
    (void)sl_snapshot_notifications(inst);
  instance_close(inst);
}

/* ----------------------------------------------------------- members */

/* Start the members of runner inst (note 3), before inst reads or emits
 * anything: open and restore each, upstream first; then those restored as
 * finished take their final snapshot and send END (runtime.c note 7).  A
 * member's channel state is replayed at its first turn (member_turn,
 * runtime.c), before it reads its ring, whatever order the turns come
 * in. */
static void members_start(sl_instance *inst) {
  for (int i = 0; i < inst->member_count; i++) {
    sl_instance *m = inst->members[i];
    int rc = 0;
    enum start_result start = instance_start(m, &rc);
    m->chain_rc = rc;
    m->chain_phase = start == START_END ? CHAIN_OVER
                     : start == START_GONE ? CHAIN_NONE
                     : m->cp.restored_finished ? CHAIN_STARTED
                                               : CHAIN_RUNNING;
    /* A restore hook failed: the job fails now, as it would in the
     * member's own thread (its end, with this status, comes later). */
    if (start == START_END && rc != SL_ESTOPPED)
      sl_instance_fail(m, rc);
  }
  for (int i = 0; i < inst->member_count; i++) {
    sl_instance *m = inst->members[i];
    if (m->chain_phase != CHAIN_STARTED)
      continue;
    m->chain_phase = CHAIN_SKIPPING; /* its input up to END, from now */
    int rc = instance_refinish(m);
    if (rc) {
      m->chain_rc = rc;
      m->chain_phase = CHAIN_OVER;
      if (rc != SL_ESTOPPED)
        sl_instance_fail(m, rc);
    }
  }
}

/* The members' ends, after their runner's, in start order.  A member that
 * did not finish ends stopped (or with its failure). */
static void members_end(sl_instance *inst) {
  for (int i = 0; i < inst->member_count; i++) {
    sl_instance *m = inst->members[i];
    if (m->chain_phase == CHAIN_NONE)
      continue; /* over already (instance_start) */
    int rc = m->chain_phase == CHAIN_FINISHED ? 0
             : m->chain_rc                   ? m->chain_rc
                                             : SL_ESTOPPED;
    m->chain_phase = CHAIN_NONE;
    instance_end(m, rc);
  }
}

/* The whole life of an instance: open, restore, run, finish, close; and
 * of the members its thread runs (note 3). */
static void instance_run(sl_instance *inst) {
  int rc = 0;
  enum start_result start = instance_start(inst, &rc);
  /* Members open and close whatever happened to their runner, as they
   * would in threads of their own (a failed start stops them at once). */
  if (inst->member_count)
    members_start(inst);
  if (start == START_RUN) {
    if (inst->cp.restored_finished) {
      rc = instance_refinish(inst); /* runtime.c note 7: never finished twice */
      if (rc == 0)
        rc = sl_instance_run_finished(inst);
    } else {
      rc = instance_finish(inst);
    }
  }
  if (start != START_GONE)
    instance_end(inst, rc);
  if (inst->member_count)
    members_end(inst);
}

/* ----------------------------------------------------------- job control */

void sl_job_join_threads(sl_job *job) {
  for (int i = 0; i < job->instance_count; i++) {
    sl_instance *inst = job->instances[i];
    if (inst->thread_started) {
      pthread_join(inst->thread, 0);
      inst->thread_started = false;
    }
  }
}

static int start_thread(sl_instance *inst) {
  pthread_attr_t attr;
  int rc = pthread_attr_init(&attr);
  if (rc)
    return rc;
  if (inst->cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(inst->cpu, &set);
    rc = pthread_attr_setaffinity_np(&attr, sizeof set, &set);
  }
  if (rc == 0)
    rc = pthread_create(&inst->thread, &attr, instance_main, inst);
  pthread_attr_destroy(&attr);
  inst->thread_started = rc == 0;
  /* Named here, so it has its name once sl_job_start returns. */
  if (rc == 0)
    set_thread_name(inst, inst->thread);
  return rc;
}

int sl_job_start_threads(sl_job *job) {
  for (int i = 0; i < job->instance_count; i++) {
    if (job->instances[i]->runner != job->instances[i])
      continue; /* runtime.c note 12: run by another instance's thread */
    int rc = start_thread(job->instances[i]);
    if (rc) {
      sl_instance *inst = job->instances[i];
      /* Instances already running may fail too: the first one writes. */
      sl_job_fail(job, rc,
                  "cannot start the thread of operator '%s' instance %d "
                  "(cpu %d): %s%s",
                  inst->op->name, inst->index, inst->cpu, sl_strerror(rc),
                  rc == EINVAL && inst->cpu >= 0
                      ? " (is the CPU in the process's affinity mask? "
                        "sl_job_config.cpus may name only those)"
                      : "");
      return rc;
    }
  }
  return 0;
}

void sl_job_stop_internal(sl_job *job) {
  /* Sequentially consistent: pairs with the fence in sl_parker_prepare, so
   * an instance about to park either sees stopping or is woken below. */
  atomic_store(&job->stopping, 1);
  if (atomic_load(&job->state) != SL_JOB_RUNNING)
    return;
  /* running --[stop]--> stopping: every instance exists to be woken. */
  assert(job->instances || job->instance_count == 0);
  for (int i = 0; i < job->instance_count; i++)
    sl_parker_wake(sl_instance_parker(job->instances[i]));
}
