/* inject.c — the engine's side of fault injection: the plan read from the
 * job config and SLUICE_FAULTS (fault.h has the syntax), per-instance
 * cursors for per-record faults, and the places where faults fire.
 *
 * Where each kind fires:
 *   fail, slow   runtime.c, before a record is processed (a source: after
 *                the next() call that emitted it): the instance fails with
 *                SL_EINJECTED, or sleeps (in slices, so a stop is noticed).
 *   snapshot     snapshot.c, in the synchronous part: the snapshot fails,
 *                so the checkpoint is aborted (a checkpoint failure, which
 *                fails the job beyond tolerable_failures).
 *   write        checkpoint_writer.c, before it writes anything:
 *                the checkpoint's write fails (also a checkpoint failure).
 *   restore      instance.c, before an instance's restore hook runs (only
 *                when it restores a checkpoint): the instance fails.
 *   store        storage/store_txn.c's fault layer (sl_store_set_fault): the
 *                put, commit or sync returns the error.
 *   complete     snapshot.c, when an instance acts on a completed
 *                checkpoint, after the commit and before its
 *                checkpoint_complete hook runs (so before an exactly-once
 *                sink commits or delivers): the instance fails.
 *   crash        the named points: SIGKILL at once.
 * Every fault that fires is logged (an INFO line through the host's log
 * handler, sl_log_set_handler) with its spec, and the spec is part of the
 * failure's message.
 *
 * One failure per attempt.  A fault that fails the job claims the attempt
 * (attempt_fault_fired); a second one that would fail the same attempt
 * before it stopped gives its turn back, and no fault fires in an attempt
 * that is already failing or stopping.  So with the default
 * tolerable_failures of 0 every fault that fires costs exactly one restart.
 * Faults that do not fail the job take no claim: a store MAP_FULL (the
 * writer grows the map and writes again), a slow instance, and snapshot,
 * write and store faults while tolerable_failures > 0 (a few aborted
 * checkpoints are tolerated).  Compactions are not faulted: a failed
 * compaction loses nothing and fails nothing (store faults hit checkpoint
 * writes only).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <lmdb.h>

#include "fault.h"
#include "internal.h"

_Static_assert((int)SL_STORE_CALL_PUT == (int)SL_FAULT_CALL_PUT &&
                   (int)SL_STORE_CALL_COMMIT == (int)SL_FAULT_CALL_COMMIT &&
                   (int)SL_STORE_CALL_SYNC == (int)SL_FAULT_CALL_SYNC,
               "store calls and fault calls are numbered alike");

/* Longest sleep between two looks at a stop while a slow fault delays. */
#define SLOW_SLICE_US 1000u

int sl_inject_setup(sl_job *job) {
  const char *specs[2] = {job->config.faults, getenv("SLUICE_FAULTS")};
  const char *origins[2] = {"faults", "SLUICE_FAULTS"};
  char err[SL_ERROR_BYTES - 32];
  err[0] = 0;
  int rc = sl_fault_plan_parse_many(specs, origins, 2, &job->faults, err,
                                    sizeof err);
  if (rc) {
    sl_job_set_error(job, "fault injection: %s", err[0] ? err : sl_strerror(rc));
    return rc;
  }
  sl_fault_plan *plan = job->faults;
  if (!plan)
    return 0;
  if (pthread_mutex_init(&job->fault_lock, 0) != 0)
    return ENOMEM;
  job->fault_lock_ready = true;
  /* A fault aimed at an operator the job does not have would silently
   * never fire: refuse it, as any other mistake in the spec. */
  for (int k = 0; k < plan->count; k++) {
    const sl_fault *f = &plan->faults[k];
    if (!f->op[0] && f->instance < 0)
      continue;
    bool hit = false;
    for (int i = 0; i < job->instance_count && !hit; i++)
      hit = sl_fault_matches(f, job->instances[i]->op->name,
                             job->instances[i]->index);
    if (!hit) {
      sl_job_set_error(job, "fault injection: fault '%s' names no instance "
                       "of this job (operator '%s', instance %d)", f->text,
                       f->op[0] ? f->op : "any", f->instance);
      return EINVAL;
    }
  }
  if (!sl_fault_plan_has(plan, SL_FAULT_FAIL) &&
      !sl_fault_plan_has(plan, SL_FAULT_SLOW))
    return 0;
  for (int i = 0; i < job->instance_count; i++) {
    sl_instance *inst = job->instances[i];
    sl_fault_cursor *c = malloc(sizeof *c);
    if (!c)
      return ENOMEM;
    uint32_t stable = (uint32_t)inst->op->id * SL_MAX_PARALLELISM +
                      (uint32_t)inst->index;
    sl_fault_cursor_init(c, plan, inst->op->name, inst->index, stable);
    if (sl_fault_cursor_active(c))
      inst->fault = c;
    else
      free(c);
  }
  return 0;
}

void sl_inject_free(sl_job *job) {
  for (int i = 0; i < job->instance_count; i++) {
    free(job->instances[i]->fault);
    job->instances[i]->fault = 0;
  }
  sl_fault_plan_free(job->faults);
  job->faults = 0;
  if (job->fault_lock_ready)
    pthread_mutex_destroy(&job->fault_lock);
  job->fault_lock_ready = false;
}

void sl_inject_restart(sl_job *job) {
  atomic_store(&job->attempt_fault_fired, 0);
  for (int i = 0; i < job->instance_count; i++)
    if (job->instances[i]->fault)
      sl_fault_cursor_restart(job->instances[i]->fault);
}

static bool attempt_failing(const sl_job *job) {
  return atomic_load(&job->failed) || atomic_load(&job->stopping) ||
         atomic_load(&job->attempt_fault_fired);
}

/* Claim the attempt for fault f, which fails the job; false (f's firing
 * given back) if the attempt is already failing or another fault claimed
 * it first. */
static bool claim_attempt(sl_job *job, sl_fault *f) {
  int expected = 0;
  if (!atomic_load(&job->failed) && !atomic_load(&job->stopping) &&
      atomic_compare_exchange_strong(&job->attempt_fault_fired, &expected, 1))
    return true;
  atomic_fetch_sub(&f->fired, 1);
  return false;
}

/* Whether a checkpoint fault (snapshot, write, store) fails the job. */
static bool checkpoint_fault_fails(const sl_job *job, const sl_fault *f) {
  return job->config.checkpoint.tolerable_failures == 0 &&
         !(f->kind == SL_FAULT_STORE && f->error == MDB_MAP_FULL);
}

SL_EXPORT uint64_t sl_job_faults_fired(const sl_job *job) {
  if (!job || !job->faults)
    return 0;
  uint64_t n = 0;
  for (int k = 0; k < job->faults->count; k++) {
    const sl_fault *f = &job->faults->faults[k];
    /* A slow fault counts the records it delayed: one fault. */
    uint64_t fired = atomic_load_explicit(&f->fired, memory_order_relaxed);
    n += f->kind == SL_FAULT_SLOW ? fired > 0 : fired;
  }
  return n;
}

/* Sleep us microseconds in slices, returning early on a stop. */
static void slow_down(sl_instance *inst, uint32_t us) {
  while (us > 0 && !atomic_load_explicit(&inst->job->stopping,
                                         memory_order_relaxed)) {
    uint32_t slice = us < SLOW_SLICE_US ? us : SLOW_SLICE_US;
    struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)slice * 1000};
    nanosleep(&ts, 0);
    us -= slice;
  }
}

int sl_inject_records(sl_instance *inst, uint64_t n) {
  sl_fault_cursor *c = inst->fault;
  for (uint64_t i = 0; i < n; i++) {
    sl_fault_step step = sl_fault_cursor_next(c);
    if (step.slow_begins)
      sl_fault_log(step.slow_begins, "operator '%s' instance %d, from record "
                   "%" PRIu64, inst->op->name, inst->index, c->record);
    if (step.delay_us)
      slow_down(inst, step.delay_us);
    if (step.fail) {
      /* One failure per attempt: a second instance failing before the
       * job stopped would be the same failover, so its fault gives back
       * its claim and stays for a later attempt ("restarts = faults
       * injected" holds exactly). */
      if (!claim_attempt(inst->job, step.fail))
        continue;
      sl_fault_log(step.fail, "operator '%s' instance %d, record %" PRIu64,
                   inst->op->name, inst->index, c->record);
      char text[SL_FAULT_TEXT_BYTES + 32];
      sl_fault_describe(step.fail, text, sizeof text);
      sl_ctx_fail(inst, "%s at record %" PRIu64, text, c->record);
      return SL_EINJECTED;
    }
  }
  return 0;
}

/* An occurrence of an occurrence-counted fault kind (snapshot, write,
 * restore, store): take its number and, when a fault fires that fails the
 * job, claim the attempt, all under fault_lock.  Without the lock two
 * instances could both see a healthy attempt, both take a number, and the
 * loser would give back its claim but not its number: that fault would
 * fire once less than its times= says.  A refused claim (a record fault or
 * another failure got there first) takes the number back.  The lock is
 * only taken by jobs with faults of the kind, at events that are rare
 * (snapshots, checkpoint writes, restores, store calls).  NULL: nothing
 * fired. */
static sl_fault *occur_and_claim(sl_job *job, int kind, int sub,
                                 const sl_instance *inst) {
  const char *op = inst ? inst->op->name : 0;
  int index = inst ? inst->index : -1;
  pthread_mutex_lock(&job->fault_lock);
  sl_fault *f = 0;
  if (!attempt_failing(job)) { /* one failure per attempt (the top note) */
    f = sl_fault_occur(job->faults, (enum sl_fault_kind)kind, sub, op, index);
    bool fails = f && (kind == SL_FAULT_RESTORE || kind == SL_FAULT_COMPLETE ||
                       checkpoint_fault_fails(job, f));
    if (fails && !claim_attempt(job, f)) {
      sl_fault_unoccur(job->faults, (enum sl_fault_kind)kind, sub, op, index);
      f = 0;
    }
  }
  pthread_mutex_unlock(&job->fault_lock);
  return f;
}

int sl_inject_occurrence(sl_job *job, sl_instance *inst, int kind, int sub,
                         char *cause, size_t cause_bytes) {
  if (!job->faults || !sl_fault_plan_has(job->faults, (enum sl_fault_kind)kind))
    return 0;
  sl_fault *f = occur_and_claim(job, kind, sub, inst);
  if (!f)
    return 0;
  char text[SL_FAULT_TEXT_BYTES + 32];
  sl_fault_describe(f, text, sizeof text);
  if (inst)
    sl_fault_log(f, "operator '%s' instance %d", inst->op->name, inst->index);
  else
    sl_fault_log(f, 0);
  if (cause)
    snprintf(cause, cause_bytes, "%s", text);
  return SL_EINJECTED;
}

void sl_inject_crash_point(sl_job *job, int point) {
  if (job->faults && sl_fault_plan_has(job->faults, SL_FAULT_CRASH))
    sl_fault_crash_check(job->faults, (enum sl_fault_point)point);
}

/* The store's fault layer (store.h): called on the writer's thread (and on
 * the restoring thread, which only reads). */
int sl_inject_store_call(void *arg, enum sl_store_call call) {
  sl_job *job = arg;
  sl_fault *f = occur_and_claim(job, SL_FAULT_STORE, (int)call, 0);
  if (!f)
    return 0;
  sl_fault_log(f, "store %s", sl_fault_call_name((enum sl_fault_call)call));
  /* Kept for the writer's failure message, which names the fault. */
  snprintf(job->store_fault_text, sizeof job->store_fault_text, "%s", f->text);
  return f->error;
}
