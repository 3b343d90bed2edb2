/* stop.c — the one job: sl_job_stop_with_savepoint, which stops a job at
 * a checkpoint (without drain) or at its end (drain) and copies that
 * checkpoint as a savepoint (savepoint.c).
 *
 * NOTES ON THE DESIGN OF A STOP WITH A SAVEPOINT
 *
 * 1. The request is job->stop_request, which every source instance reads
 *    between two next() calls (runtime.c note 9).  HOLD: the source calls
 *    next() no more and emits nothing, but still answers triggers.
 *    DRAIN: the source ends as at the end of its input.
 * 2. Without drain (Flink's `stop`): HOLD is set, then checkpoint n is
 *    requested (no periodic one starts meanwhile: coordinator.c note 11).
 *    Each source snapshots n after its last record, so n holds every
 *    record any source emitted and none comes after it.  The caller waits
 *    until n settles.  Complete: the savepoint is copied from it, the job
 *    marked stopped_with_savepoint and stopped.  Aborted (a timeout, a
 *    failed snapshot or write, a failover): the request is withdrawn, the
 *    sources and the coordinator (whose periodic checkpoints resume) are
 *    woken and go on, and the error is returned.  A second
 *    deadline, the checkpoint timeout plus STOP_MARGIN_NS, covers an n
 *    that a failover's reset left unsettled.
 * 3. The job then ends as a stop, but sl_job_wait returns 0 (status
 *    FINISHED): the stop was asked for and its state is safe.  Each
 *    instance delivers the completion of n before it closes (runtime.c
 *    note 9), so exactly-once sinks commit up to n.  Nothing fires at the
 *    stop: no maximum watermark, no finish(), no end-of-input timers, so a
 *    job resumed from n (the savepoint, or state_dir with SL_STORE_RESUME)
 *    goes on as if it had never stopped.
 * 4. With drain (Flink's `stop --drain`): DRAIN is set; the sources end,
 *    the final checkpoint is written as at any end of input
 *    (coordinator.c note 9) and the job finishes by itself.  The caller
 *    waits for cp_final_done, then copies the final checkpoint.  If the
 *    job fails for good first, its error is returned.  Push sources
 *    refuse pushes from the request on (SL_ESTOPPED; pushers and pollers
 *    are woken now, push.c note 4): nothing will take their queues.
 * 5. One stop at a time (stop_claimed).  A stop that succeeded keeps the
 *    claim: the job is over.  A stop that failed gives it back.  A stop
 *    while a failover's restart is pending (stopping set, a restart to
 *    follow) is EBUSY, not SL_ESTOPPED: the job has not ended.
 * 6. The caller's waits poll every STOP_POLL_NS, as
 *    sl_job_trigger_checkpoint's does: the coordinator wakes no caller
 *    thread, and a stop is rare.
 * 7. The request and wait of note 2 (sl_checkpoint_request_settled) also
 *    serve sl_job_savepoint, which takes an aligned checkpoint first in a
 *    job with unaligned checkpoints (savepoint.c note 6); their messages
 *    begin with what the caller names.  The stop copies its checkpoint
 *    with sl_savepoint_copy: it is aligned already (snapshot.c note 12).
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "checkpoint_internal.h"
#include "internal.h"

#define STOP_POLL_NS 200000u             /* note 6: 0.2 ms */
#define STOP_MARGIN_NS 5000000000u       /* note 2: 5 s past the timeout */
#define STOP_DEFAULT_TIMEOUT_NS 60000000000u /* coordinator's default */
#define STOP_PUBLISH_ROUNDS 5000         /* 1 s of STOP_POLL_NS */


static void pause_briefly(void) {
  struct timespec t = {0, STOP_POLL_NS};
  nanosleep(&t, 0);
}

static void wake_sources(sl_job *job) {
  for (int i = 0; i < job->instance_count; i++)
    if (job->instances[i]->op->kind == SL_OP_SOURCE)
      sl_parker_wake(sl_instance_parker(job->instances[i]));
}

/* Note 2: the stop is withdrawn.  The sources go on, and the
 * coordinator, which starts no periodic checkpoint while a stop is
 * pending, looks at its schedule now rather than at its next wake-up. */
static void withdraw(sl_job *job) {
  atomic_store(&job->stop_request, SL_STOP_REQUEST_NONE);
  wake_sources(job);
  sl_parker_wake(&job->cp->coordinator_parker);
}

/* The job stopped or failed and no restart will follow (push.c's test). */
static bool job_over(sl_job *job) {
  if (!atomic_load(&job->stopping))
    return false;
  return atomic_load(&job->user_stopped) ||
         job->config.restart.strategy == SL_RESTART_NONE ||
         atomic_load(&job->restarts_over);
}

/* The failure's status and message, once its thread published them
 * (internal.h sl_job_failure): that follows its claim of `failed` at
 * once, so the wait is short; STOP_PUBLISH_ROUNDS bounds it.  what
 * begins the message (note 7). */
static int job_over_error(sl_job *job, const char *what, char *err,
                          size_t err_bytes) {
  if (!atomic_load(&job->failed))
    return sl_say_err(err, err_bytes, SL_ESTOPPED,
                      "%s: the job was stopped meanwhile", what);
  int status = SL_ECALLBACK;
  for (int round = 0; round < STOP_PUBLISH_ROUNDS; round++) {
    if (sl_job_failure(job, &status))
      return sl_say_err(err, err_bytes, status, "%s: the job failed: %s",
                        what, job->error);
    pause_briefly();
  }
  return sl_say_err(err, err_bytes, status, "%s: the job failed", what);
}

/* Note 2: the recorded cause of checkpoint id's abort. */
static void abort_cause(const sl_job *job, uint64_t id, char *cause,
                        size_t cause_bytes) {
  snprintf(cause, cause_bytes, "aborted");
  sl_checkpoint_stats stats;
  for (int k = 0; k < SL_CHECKPOINT_HISTORY; k++)
    if (sl_job_checkpoint_stats(job, k, &stats) == 0 && stats.id == id) {
      snprintf(cause, cause_bytes, "%s", stats.cause[0] ? stats.cause
                                                         : "aborted");
      return;
    }
}

static uint64_t timeout_ns(const sl_job *job) {
  uint32_t ms = job->config.checkpoint.timeout_ms;
  return ms ? (uint64_t)ms * 1000000u : STOP_DEFAULT_TIMEOUT_NS;
}

/* Note 2: request checkpoint *id, retrying while max_concurrent are in
 * flight, until deadline_ns.  EBUSY if none could start. */
static int request_checkpoint(sl_job *job, uint64_t deadline_ns,
                              uint64_t *id) {
  int rc = EBUSY;
  /* Each try waits up to about 1 s; the deadline bounds the tries. */
  while (rc == EBUSY && sl_now_ns() < deadline_ns && !job_over(job) &&
         !atomic_load(&job->cp_final_done))
    rc = sl_job_trigger_checkpoint(job, id);
  return rc;
}

/* checkpoint.h: notes 2 and 7. */
int sl_checkpoint_request_settled(sl_job *job, const char *what,
                                  uint64_t *id, char *err,
                                  size_t err_bytes) {
  uint64_t deadline_ns = sl_now_ns() + timeout_ns(job) + STOP_MARGIN_NS;
  uint64_t n = 0;
  int rc = request_checkpoint(job, deadline_ns, &n);
  if (rc) {
    rc = job_over(job) ? job_over_error(job, what, err, err_bytes)
                       : sl_say_err(err, err_bytes, rc, "%s: no checkpoint "
                                    "could start (%s)", what,
                                    atomic_load(&job->cp_final_done)
                                        ? "the job reached the end of its "
                                          "input"
                                        : "the checkpoints in flight did "
                                          "not end");
  }
  deadline_ns = sl_now_ns() + timeout_ns(job) + STOP_MARGIN_NS;
  /* Polls (note 6) until n settles or the job is over; bounded by the
   * deadline (note 2). */
  while (rc == 0 && atomic_load(&job->cp_completed_id) < n) {
    if (job_over(job)) {
      rc = job_over_error(job, what, err, err_bytes);
    } else if (atomic_load(&job->cp_settled_id) >= n) {
      /* Completed is stored before settled (coordinator.c), but both may
       * have moved since the loop's test: read completed again. */
      if (atomic_load(&job->cp_completed_id) >= n)
        break;
      char cause[200];
      abort_cause(job, n, cause, sizeof cause);
      rc = sl_say_err(err, err_bytes, SL_ECHECKPOINT, "%s: checkpoint %"
                      PRIu64 " failed (%s); the job goes on", what, n,
                      cause);
    } else if (sl_now_ns() > deadline_ns) {
      rc = sl_say_err(err, err_bytes, SL_ECHECKPOINT, "%s: checkpoint %"
                      PRIu64 " did not settle in time; the job goes on",
                      what, n);
    } else {
      pause_briefly();
    }
  }
  if (rc == 0)
    *id = n;
  return rc;
}

/* Note 2: hold the sources and wait for a stop checkpoint to complete.
 * On success the sources still hold (the caller copies, then stops the
 * job); on failure the request is withdrawn. */
static int stop_hold(sl_job *job, uint64_t *id, char *err,
                     size_t err_bytes) {
  atomic_store(&job->stop_request, SL_STOP_REQUEST_HOLD);
  wake_sources(job);
  uint64_t n = 0;
  int rc = sl_checkpoint_request_settled(job, "stop with a savepoint", &n,
                                         err, err_bytes);
  if (rc) {
    withdraw(job);
    return rc;
  }
  /* A manual trigger by someone else may have completed after n: the
   * sources emitted nothing since n either, so it is as good. */
  *id = atomic_load(&job->cp_completed_id);
  assert(*id >= n);
  return 0;
}

/* Note 4: end the sources and wait for the final checkpoint. */
static int stop_drain(sl_job *job, uint64_t *id, char *err,
                      size_t err_bytes) {
  atomic_store(&job->stop_request, SL_STOP_REQUEST_DRAIN);
  wake_sources(job);
  /* The push sources take nothing more (push.c note 4): their pushers
   * and pollers learn it now, not at sl_job_wait. */
  sl_push_job_over(job);
  /* Not bounded by a count: the final checkpoint has no timeout (it is
   * the job's end, as sl_job_wait's join has none); the job failing for
   * good ends the loop. */
  while (!atomic_load(&job->cp_final_done)) {
    if (job_over(job))
      return job_over_error(job, "stop with a savepoint", err, err_bytes);
    pause_briefly();
  }
  *id = atomic_load(&job->cp_completed_id);
  return 0;
}

/* The checks before anything changes; 0 if the stop may go ahead. */
static int stop_check(sl_job *job, const char *dir, int flags, char *err,
                      size_t err_bytes) {
  if (!job)
    return sl_say_err(err, err_bytes, EINVAL, "stop with a savepoint: job is NULL");
  if (dir && !*dir)
    return sl_say_err(err, err_bytes, EINVAL, "stop with a savepoint: dir is empty "
               "(NULL: no copy)");
  if (flags & ~SL_STOP_DRAIN)
    return sl_say_err(err, err_bytes, EINVAL, "stop with a savepoint: unknown flags "
               "0x%x", (unsigned)flags);
  if (!job->config.checkpoint.state_dir)
    return sl_say_err(err, err_bytes, SL_EUSAGE, "stop with a savepoint: "
               "checkpointing is off (set checkpoint.state_dir)");
  int state = atomic_load(&job->state);
  if (state == SL_JOB_BUILDING || !job->cp)
    return sl_say_err(err, err_bytes, SL_ENOTSTARTED,
               "stop with a savepoint: the job has not started");
  if (state == SL_JOB_FINISHED || job_over(job) ||
      atomic_load(&job->cp_final_done) ||
      atomic_load(&job->stopped_with_savepoint))
    return sl_say_err(err, err_bytes, SL_ESTOPPED,
               "stop with a savepoint: the job has already ended");
  if (atomic_load(&job->stopping)) /* a failure; its restart follows */
    return sl_say_err(err, err_bytes, EBUSY, "stop with a savepoint: the job "
               "failed and is restarting; try again once it runs");
  return dir ? sl_savepoint_dir_check(dir, err, err_bytes) : 0;
}

SL_EXPORT int sl_job_stop_with_savepoint(sl_job *job, const char *dir,
                                         int flags, uint64_t *checkpoint_id,
                                         char *err, size_t err_bytes) {
  if (err && err_bytes)
    err[0] = 0;
  if (checkpoint_id)
    *checkpoint_id = 0;
  int rc = stop_check(job, dir, flags, err, err_bytes);
  if (rc)
    return rc;
  int unclaimed = 0;
  if (!atomic_compare_exchange_strong(&job->stop_claimed, &unclaimed, 1))
    return sl_say_err(err, err_bytes, EBUSY, "stop with a savepoint: another stop "
               "is under way");
  bool drain = flags & SL_STOP_DRAIN;
  uint64_t id = 0;
  rc = drain ? stop_drain(job, &id, err, err_bytes)
             : stop_hold(job, &id, err, err_bytes);
  assert(rc != 0 || id != 0);
  uint64_t copied = id;
  if (rc == 0 && dir)
    rc = sl_savepoint_copy(job, dir, &copied, err, err_bytes); /* note 7 */
  /* Without drain, copied is id unless someone else's requested
   * checkpoint completed after it: also one with no record after it. */
  assert(rc != 0 || copied >= id);
  if (rc && !drain) /* note 2: the job goes on */
    withdraw(job);
  if (rc) {
    atomic_store(&job->stop_claimed, 0);
    return rc;
  }
  if (!drain) { /* note 3 */
    atomic_store(&job->stopped_with_savepoint, 1);
    sl_job_stop(job);
  }
  if (checkpoint_id)
    *checkpoint_id = copied;
  return 0;
}
