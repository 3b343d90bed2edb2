/* sluice_checkpoint.h — checkpoint control: triggering a checkpoint,
 * savepoints, and the statistics of past checkpoints (engine/coordinator.c,
 * engine/savepoint.c).  Included by sluice.h.  Checkpoints are configured
 * in sl_job_config.checkpoint (sluice.h); docs/checkpoints.md tells the
 * whole story.
 */
#ifndef SLUICE_CHECKPOINT_H
#define SLUICE_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "sluice.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Checkpoint control and statistics. */

/** Trigger a checkpoint now (in addition to the periodic ones), respecting
 * max_concurrent; *id (if not NULL) receives its id.  Waits up to 1 s for
 * the trigger to start.  Errors: SL_EUSAGE (checkpointing off),
 * SL_ENOTSTARTED, EBUSY (max_concurrent in flight for that second, or the
 * job is ending). */
int sl_job_trigger_checkpoint(sl_job *job, uint64_t *id);

/** Savepoint: write a self-contained, compacted copy of the newest
 * complete checkpoint into dir, for a later job to start from
 * (checkpoint.from_savepoint), also with other parallelisms.  dir is
 * created if missing (its parent too) and refused if it exists and is not
 * empty.  It receives data.mdb (LMDB's compacting copy, made inside a
 * read transaction: neither the instances nor the checkpoint writer wait
 * for it) and then, last, manifest.json (written to a temporary name,
 * fsync'd and renamed, so a directory without it is no savepoint): format
 * "sluice-savepoint", version 1, store_format, checkpoint_id, created_ms
 * (Unix epoch ms), graph (the job's operators and edges, without
 * parallelisms), max_parallelism, operators [{id, name, kind,
 * parallelism}], bytes (of data.mdb) and store_graph (the fingerprint in
 * the store).  Then one line {"checkpoint_id", "created_ms", "path" (dir,
 * absolute), "bytes"} is appended to state_dir/savepoints.jsonl.
 * *checkpoint_id (may be NULL) receives the id of the checkpoint copied.
 * err (may be NULL) receives a message naming dir and the problem.
 *
 * Savepoints stay aligned, as in Flink: a savepoint never holds channel
 * state, so it starts a job at any parallelism.  In a job with
 * checkpoint_unaligned that runs, the call first requests a checkpoint
 * taken aligned (while it waits, no barrier of the job is taken unaligned
 * and no alignment times out), waits until it is durable (under
 * backpressure, as long as the rings take to drain) and copies it (or a
 * newer one, aligned too).  Otherwise the newest complete checkpoint is
 * copied as it is.  Not from an operator callback in such a job: the
 * checkpoint it waits for needs that callback to return.  The copy is
 * read back before its manifest is written;
 * if its checkpoint is unaligned (the newest of an unaligned job that no
 * longer runs or fails over, or of a job resumed from an unaligned
 * checkpoint before its own first one completes), the call fails with
 * SL_ECHECKPOINT.
 *
 * Any thread may call it, at any time from the return of sl_job_start
 * (0) until sl_job_destroy, also while the job runs, fails over, or after
 * sl_job_wait: the store stays open until sl_job_destroy.  Savepoints of
 * one process are taken one at a time.  On error no manifest is written
 * and what the call made in dir is removed, except: if only the line of
 * savepoints.jsonl cannot be written, the savepoint is complete (and
 * *checkpoint_id set) but the error is returned.
 *
 * Starting from a savepoint (sl_job_start) refuses, with SL_ESTORE and a
 * message naming the savepoint: no or a malformed manifest.json, another
 * format or store format version, another max_parallelism, another job
 * graph (operators by id, kind and name, in order, and their inputs), a
 * store that does not match its manifest, and another parallelism for an
 * operator whose instances saved operator state (a source's position, a
 * sink's pending transactions, sl_operator_state_set): that state cannot
 * be split or merged.  Keyed state moves by key group; an operator
 * rescaled without operator state gets, in every new instance, the lowest
 * watermark and the largest timestamp its old instances had saved.
 *
 * Errors: EINVAL (job or dir NULL or empty), SL_EUSAGE (checkpointing
 * off), SL_ENOTSTARTED, SL_ENOTFOUND (no checkpoint is complete yet),
 * EEXIST (dir is not empty), ENOMEM, errno values of the file system,
 * SL_ECORRUPT and LMDB codes (the copy); with unaligned checkpoints also
 * SL_ECHECKPOINT (the aligned checkpoint aborted or did not settle in
 * time, and the job goes on; or the checkpoint copied is unaligned),
 * EBUSY (no checkpoint could start) and the job's failure status, or
 * SL_ESTOPPED, if the job ends while the call waits. */
int sl_job_savepoint(sl_job *job, const char *dir, uint64_t *checkpoint_id,
                     char *err, size_t err_bytes);

/** sl_job_stop_with_savepoint flag: end the sources as at the end of
 * input first (Flink's `stop --drain`). */
#define SL_STOP_DRAIN 1

/** Stop the job with a savepoint, as Flink's `stop` (flags 0) or
 * `stop --drain` (SL_STOP_DRAIN).  Blocks until done.
 *
 * Without SL_STOP_DRAIN: every source instance stops calling next() and
 * emits nothing more, but one last barrier: that of a checkpoint
 * triggered for the stop (no periodic checkpoint starts meanwhile).  No
 * end of input, no maximum watermark, no window fired or timer advanced
 * by the stop.  Once that checkpoint is durable it is copied as a
 * savepoint into dir (as sl_job_savepoint; dir NULL: no copy, the
 * checkpoint in state_dir is the resume point), and the job is stopped:
 * every instance receives the checkpoint's completion before it closes
 * (exactly-once sinks commit up to it), sl_job_wait returns 0 and the
 * status (sl_metrics.state) is SL_JOB_STATUS_FINISHED.  Pushers then get
 * SL_ESTOPPED.  A job started from the savepoint, or from state_dir with
 * SL_STORE_RESUME, goes on with its windows, timers and watermarks as if
 * it had never stopped: no record lost, late or duplicated in what
 * exactly-once sinks commit.  A processing-time timer downstream may
 * still fire after the stop barrier: what it emits lands in sink
 * transactions never committed, so a non-transactional sink (a callback
 * sink) sees those records, and sees them again after the resume.  If the
 * checkpoint aborts (timeout, a failed snapshot or write, a failover) or
 * the copy fails, the error is returned and the job goes on running.
 *
 * With SL_STOP_DRAIN: the sources end now, as at the end of input (the
 * maximum watermark, windows fire, finish() runs), the job writes its
 * final checkpoint and finishes by itself (sl_job_wait returns 0), and
 * the savepoint is copied from that final checkpoint.  If the job fails
 * first, its error is returned.
 *
 * *checkpoint_id (may be NULL) receives the id of the checkpoint stopped
 * at (and copied); err (may be NULL) a message saying what failed.
 *
 * Errors: EINVAL (job NULL, dir "", unknown flags), SL_EUSAGE
 * (checkpointing off), SL_ENOTSTARTED, SL_ESTOPPED (the job already
 * ended, or is stopping with no restart to follow), EEXIST (dir is not
 * empty; checked first, the job goes on), EBUSY (another stop is under
 * way, no checkpoint could start, or the job failed and its restart is
 * pending: try again once it runs), SL_ECHECKPOINT (the stop checkpoint
 * aborted: err has the cause), the job's failure status, and
 * sl_job_savepoint's errors.
 *
 * Any thread may call it while the job runs (not from an operator
 * callback: it waits for them); one stop at a time. */
int sl_job_stop_with_savepoint(sl_job *job, const char *dir, int flags,
                               uint64_t *checkpoint_id, char *err,
                               size_t err_bytes);

/** Id of the newest complete checkpoint of this run (0 if none) and, in
 * *restored_from, the checkpoint the job resumed from (0 if it did not). */
uint64_t sl_job_last_checkpoint(const sl_job *job, uint64_t *restored_from);

/** With unaligned checkpoints (docs/checkpoints.md): how many captures of
 * channel state were dropped because their checkpoint aborted (timeout, a
 * failed snapshot or write elsewhere) while the instance was still
 * capturing, or had captured but not yet acked, since sl_job_start(),
 * restarts included; one per instance and checkpoint.  The instances
 * count it as they learn of the abort, so it may trail the checkpoint's
 * ABORTED status in sl_job_checkpoint_stats().  0 for a job without
 * checkpoints or with aligned ones only, and for NULL.  Any thread, until
 * sl_job_destroy(). */
uint64_t sl_job_captures_aborted(const sl_job *job);

enum sl_checkpoint_status {
  SL_CHECKPOINT_IN_PROGRESS = 0,
  SL_CHECKPOINT_COMPLETED = 1,
  SL_CHECKPOINT_ABORTED = 2
};

/** One checkpoint.  Durations in microseconds. */
typedef struct sl_checkpoint_stats {
  uint64_t id;
  int status;       /* enum sl_checkpoint_status */
  int final;        /* the checkpoint taken at the end of input */
  int64_t trigger_time_ms; /* wall clock, Unix epoch */
  uint64_t duration_us;    /* trigger to durable commit (or abort) */
  uint64_t write_us;       /* the writer's transaction, commit included */
  uint64_t bytes_persisted;
  uint64_t entries_persisted; /* keyed-state puts and deletes */
  int instance_count;
  /* Why it was aborted.  128 bytes before unaligned checkpoints; the
   * two fields after it took its last 12 (and the padding after it), so
   * that the struct and sl_metrics, which embeds it, keep their size and
   * layout for programs built against the older header (they read a
   * string that ends within the first 116 bytes). */
  char cause[116];
  /* Unaligned checkpoints (docs/checkpoints.md): 1 if any instance took
   * its snapshot unaligned (from the start, or switched by the aligned
   * checkpoint timeout); the bytes of channel state (records in flight)
   * it holds, summed over the instances. */
  int unaligned;
  uint64_t channel_bytes;
} sl_checkpoint_stats;
/* Once a job has ended (sl_job_wait returned) no checkpoint is
 * IN_PROGRESS: those in flight at a stop or a failure that is not
 * restarted are ABORTED with the cause "the job stopped" or "the job
 * failed" (or COMPLETED if their write had committed). */

/** One instance's part of a checkpoint. */
typedef struct sl_checkpoint_instance_stats {
  const char *name; /* operator */
  int instance;
  uint64_t start_delay_us; /* trigger to the first barrier at the instance */
  uint64_t alignment_us;   /* first to last barrier */
  uint64_t sync_us;        /* the snapshot on the instance's thread */
  uint64_t async_us;       /* the writer serializing its state */
  uint64_t bytes_persisted;
  uint64_t entries_persisted;
} sl_checkpoint_instance_stats;

/** The k-th newest checkpoint of this run (k = 0 the newest; the last 64
 * are kept).  Errors: SL_ENOTFOUND. */
int sl_job_checkpoint_stats(const sl_job *job, int k,
                            sl_checkpoint_stats *stats);
/** Instance i (0 .. instance_count-1, operators in creation order) of the
 * k-th newest checkpoint.  Errors: SL_ENOTFOUND, EINVAL. */
int sl_job_checkpoint_instance_stats(const sl_job *job, int k, int i,
                                     sl_checkpoint_instance_stats *stats);

#ifdef __cplusplus
}
#endif
#endif /* SLUICE_CHECKPOINT_H */
