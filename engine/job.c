/* job.c — the job API a program calls to run a job: reading its
 * configuration, starting, waiting, stopping, and reading progress and
 * per-operator counters.  The instance threads themselves live in
 * instance.c and runtime.c, building and compiling the graph in graph.c.
 *
 * NOTES
 *
 * 1. A job's life (internal.h enum sl_job_state): BUILDING until
 *    sl_job_start succeeds, RUNNING until sl_job_wait has joined every
 *    thread and set the result, then FINISHED for good (a job runs once).
 *    A start that fails before any thread runs leaves it BUILDING; one
 *    that fails after leaves it FINISHED with the failure as its result.
 * 2. The result is set once, by the first sl_job_wait (job->waited), and
 *    every later call returns it again (sluice.h CAVEATS).  A failed job
 *    returns the status of its first failure (runtime.c note 8).
 * 3. The configuration is read by size (sl_job_config_read): the caller's
 *    struct_bytes says which fields it knows; the rest take defaults
 *    (sluice.h, ABI).
 */
#include <errno.h>
#include <stddef.h>
#include <string.h>

#include "internal.h"
#include "log.h"

/* The first version of sl_job_config ends with faults. */
#define SL_JOB_CONFIG_FIRST_BYTES                                              \
  (offsetof(sl_job_config, faults) + sizeof(((sl_job_config *)0)->faults))

/* Note 3. */
int sl_job_config_read(const sl_job_config *in, sl_job_config *out) {
  memset(out, 0, sizeof *out);
  if (!in)
    return 0; /* every default */
  if (in->struct_bytes < SL_JOB_CONFIG_FIRST_BYTES) {
    sl_log(SL_LOG_ERROR, "sl_job_create: sl_job_config.struct_bytes is %zu, "
           "at least %zu expected: start the config from SL_JOB_CONFIG_INIT",
           in->struct_bytes, (size_t)SL_JOB_CONFIG_FIRST_BYTES);
    return EINVAL;
  }
  const unsigned char *tail = (const unsigned char *)in + sizeof *out;
  for (size_t i = sizeof *out; i < in->struct_bytes; i++)
    if (tail[i - sizeof *out]) { /* a later header set a field we lack */
      sl_log(SL_LOG_ERROR, "sl_job_create: sl_job_config.struct_bytes is "
             "%zu, this library knows %zu bytes and byte %zu is set",
             in->struct_bytes, sizeof *out, i);
      return EINVAL;
    }
  memcpy(out, in, in->struct_bytes < sizeof *out ? in->struct_bytes
                                                  : sizeof *out);
  out->struct_bytes = sizeof *out;
  return 0;
}

SL_EXPORT int sl_job_start(sl_job *job) {
  if (!job)
    return EINVAL;
  if (job->state != SL_JOB_BUILDING)
    return SL_ESTARTED;
  int rc = sl_job_validate(job);
  if (rc)
    return rc;
  rc = sl_job_compile(job);
  if (rc) {
    sl_job_set_error(job, "cannot set up the job: %s", sl_strerror(rc));
    return rc;
  }
  job->error[0] = 0;
  rc = sl_inject_setup(job); /* a malformed fault spec: EINVAL, message */
  if (rc == 0)
    rc = sl_failover_setup(job);
  if (rc) {
    sl_job_free_compiled(job);
    return rc;
  }
  rc = sl_checkpointer_setup(job);
  if (rc == 0)
    rc = sl_checkpointer_start(job);
  if (rc) {
    if (!job->error[0])
      sl_job_set_error(job, "cannot set up checkpointing: %s",
                       sl_strerror(rc));
    sl_job_free_compiled(job); /* also stops and frees the checkpointer */
    return rc;
  }
  job->start_wall_ms = sl_wall_ms(); /* before the state: metrics.c */
  job->start_ns = sl_now_ns();
  job->state = SL_JOB_RUNNING;
  rc = sl_job_start_threads(job);
  if (rc == 0)
    rc = sl_failover_start(job);
  if (rc) {
    if (!atomic_load(&job->failed))
      sl_job_fail(job, rc, "cannot start the supervisor thread: %s",
                  sl_strerror(rc));
    sl_job_join_threads(job);
    sl_checkpointer_stop(job);
    atomic_store(&job->end_ns, sl_now_ns());
    job->waited = true;
    job->result = rc;
    job->state = SL_JOB_FINISHED; /* last: metrics.c reads the above */
    return rc;
  }
  return 0;
}

SL_EXPORT int sl_job_wait(sl_job *job) {
  if (!job)
    return EINVAL;
  if (job->state == SL_JOB_BUILDING)
    return SL_ENOTSTARTED;
  if (job->waited)
    return job->result;
  if (!sl_failover_wait(job)) { /* no supervisor: join them here */
    sl_job_join_threads(job);
    sl_checkpointer_stop(job);
  }
  atomic_store(&job->end_ns, sl_now_ns());
  job->waited = true;
  if (atomic_load(&job->failed)) {
    /* The cause is in job->error. */
    job->result = job->fail_status ? job->fail_status : SL_ECALLBACK;
  } else {
    job->result = 0;
    /* A stop with a savepoint is a success (stop.c note 3). */
    bool by_savepoint = atomic_load(&job->stopped_with_savepoint) != 0;
    for (int i = 0; i < job->instance_count && !by_savepoint; i++)
      if (job->instances[i]->stopped_early)
        job->result = SL_ESTOPPED;
  }
  /* Last: a reader on another thread (metrics.c) that sees FINISHED sees
   * the result and the final message too. */
  job->state = SL_JOB_FINISHED;
  return job->result;
}

SL_EXPORT int sl_job_run(sl_job *job) {
  int rc = sl_job_start(job);
  return rc ? rc : sl_job_wait(job);
}

SL_EXPORT void sl_job_stop(sl_job *job) {
  if (!job)
    return;
  /* Before stopping: the supervisor reads it after it sees the stop, so a
   * stop by the user is never taken for a failure's (failover.c note 2). */
  atomic_store(&job->user_stopped, 1);
  sl_job_stop_internal(job);
  if (atomic_load(&job->state) == SL_JOB_RUNNING)
    sl_parker_wake(&job->supervisor_parker);
}

SL_EXPORT uint64_t sl_job_progress(const sl_job *job) {
  if (!job || job->state == SL_JOB_BUILDING)
    return 0;
  uint64_t total = 0;
  for (int i = 0; i < job->instance_count; i++) {
    sl_instance *inst = job->instances[i];
    if (inst->op->kind == SL_OP_SOURCE)
      total += atomic_load_explicit(&inst->records_out_shared,
                                    memory_order_relaxed);
  }
  return total;
}

SL_EXPORT int sl_job_stats(const sl_job *job, int i, sl_op_stats *stats) {
  if (!job || !stats || i < 0 || i >= sl_job_operator_count(job))
    return EINVAL;
  memset(stats, 0, sizeof *stats);
  const sl_op *op = 0;
  if (job->physical) {
    op = job->physical[i];
  } else {
    for (int k = 0, n = 0; k < job->op_count; k++)
      if (!sl_op_kind_is_virtual(job->ops[k]->kind) && n++ == i)
        op = job->ops[k];
  }
  assert(op);
  stats->name = op->name;
  stats->parallelism = op->parallelism;
  stats->watermark = SL_WATERMARK_MIN;
  if (!op->instances)
    return 0;
  for (int k = 0; k < op->parallelism; k++) {
    stats->records_in += atomic_load_explicit(
        &op->instances[k].records_in_shared, memory_order_relaxed);
    stats->records_out += atomic_load_explicit(
        &op->instances[k].records_out_shared, memory_order_relaxed);
    stats->late_records += atomic_load_explicit(
        &op->instances[k].counters_shared[SL_COUNT_LATE],
        memory_order_relaxed);
    stats->dead_letters += atomic_load_explicit(
        &op->instances[k].counters_shared[SL_COUNT_DEAD_LETTER],
        memory_order_relaxed);
    int64_t wm = atomic_load_explicit(&op->instances[k].watermark_shared,
                                      memory_order_relaxed);
    if (k == 0 || wm < stats->watermark)
      stats->watermark = wm;
  }
  return 0;
}
