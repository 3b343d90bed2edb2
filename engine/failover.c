/* failover.c — restarting a failed job inside its process from the newest
 * complete checkpoint, and the restart strategies that decide whether and
 * when.
 *
 * NOTES ON THE DESIGN
 *
 * 1. The whole job restarts (Flink's full restart).  Every instance of a
 *    job takes part in each checkpoint, and rings connect them all, so a
 *    restart of one region would still have to roll back its neighbours;
 *    on one machine the whole job restarts in about the time one region
 *    would.
 * 2. A supervisor thread exists when a strategy other than "none" is set.
 *    It joins every instance thread; then, if the job failed and the user
 *    did not stop it, it asks the strategy.  sl_job_stop() sets
 *    user_stopped before it stops the job, and the supervisor reads it
 *    after the instances have all left, so a stop by the user is never
 *    restarted, even when it races with a failure.
 * 3. A restart, in order: the checkpointer's threads are joined (the writer
 *    gives up the write it is in at its next look, or had committed it:
 *    that checkpoint is durable or not, never half; checkpoint_writer.c
 *    note 2a), every instance is closed by its own thread on the way out, the
 *    rings are emptied in place (sl_ring_reset keeps their memory: no page
 *    faults on the way back), the instances' fields return to their
 *    created state, keyed state is recreated and restored from the store
 *    (which stays open), and the threads start again: open, then restore
 *    with the restored checkpoint's id (sources seek; the transactional
 *    sink commits what that checkpoint pre-committed and deletes the rest).
 *    Nothing is allocated per restart that is not freed by the next one, so
 *    memory does not grow with the number of restarts.
 * 4. Without checkpointing a restart begins again from nothing: sources
 *    from their start, sinks with their output so far (at-least-once).
 * 5. Times: a failure is "detected" when its first report claims
 *    job->failed (sl_failover_note_failure); "stopped" when every thread of
 *    the attempt is joined; "restored" when the last instance has loaded
 *    its state (each loads its own, on its thread, in parallel); "first
 *    record" when an instance begins to process a record after that.
 *
 * 6. The failed attempt's keyed state is not freed before the restore
 *    (a million entries, each its own allocation, take about as long to
 *    free as to load: 0.3 s here): the supervisor keeps it aside and frees
 *    it once every instance has restored, while the job already runs.
 * 7. In-process rollback.  Reloading keyed state costs time in its size;
 *    rolling the failed attempt's map back in memory (cow_map.h note 10)
 *    costs time in what was written since the checkpoint.  So the
 *    supervisor rolls back every instance's map whose stable epoch is, or
 *    can be made, the checkpoint being restored (the store's newest
 *    complete one, which a restart always restores): the instance knows
 *    its stable checkpoint (snapshot.c note 11); if it had not yet acted
 *    on that checkpoint's completion, the epoch it froze for it is
 *    released first.  Any other map is reloaded from the store as before:
 *    no checkpoint complete yet (the store is empty: an empty map is
 *    cheaper), a map whose stable state is unknown (its restore failed,
 *    or a final snapshot stood in for the checkpoint), or no map.  Only a
 *    restart within the process rolls back: a job started from a store
 *    or a savepoint, rescaled or not, loads it, and the store stays the
 *    truth across processes.  Both modes qualify: in at-least-once a
 *    snapshot is taken at the last barrier, the same state the store
 *    holds.  The rolled-back map replaces the empty one the setup
 *    created, and the instance skips its keyed-state load (restore.c);
 *    its operator state still comes from the store's blob (small), and
 *    everything derived from keyed state is rebuilt from the map as after
 *    a load (the timer heaps: timer.c note 4).  Statistics say how many
 *    instances took each way (sl_recovery_stats).
 *
 * Supervisor states:
 *
 *   running --[all joined, failed, not user_stopped]--> deciding
 *     ^                                                    |      |
 *     |                                       [restart]    |      | [exhausted
 *     |                                                    v      |  or none]
 *     +----[threads started]---- restoring <---[delay]-- waiting   v
 *                                    |                           ended
 *                                    +--[restore failed: a failure]--> deciding
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "log.h"

#define RECOVERY_HISTORY 16

typedef struct sl_failover {
  struct sl_restart_config config;
  uint32_t restarts;
  uint64_t rng;             /* jitter */
  uint64_t backoff_ms;      /* exponential: the next wait before jitter */
  uint64_t last_failure_ns; /* exponential: for the quiet-time reset */
  uint64_t *failure_ns;     /* failure rate: the newest max_failures + 1
                               detection times, a ring */
  uint32_t failure_slots;
  uint32_t failure_next;
  sl_cow_map **old_state; /* per instance: the failed attempt's keyed
                             state, freed once the restore is done */
  sl_cow_map **kept_state; /* per instance: its map rolled back (note 7),
                              between the reset and the setup */
  uint32_t rolled_back;    /* of the newest restart (note 7) */
  uint32_t reloaded;
  pthread_mutex_t lock; /* the history, read by sl_job_recovery_stats */
  sl_recovery_stats history[RECOVERY_HISTORY];
  uint64_t history_failed_ns[RECOVERY_HISTORY]; /* detection times */
  uint32_t history_count;
  _Atomic uint32_t restarts_shared;
} sl_failover;

/* ----------------------------------------------------------- strategies */

/* Each strategy's defaults (Flink's), indexed by strategy. */
static const struct sl_restart_config restart_defaults[] = {
    [SL_RESTART_NONE] = {.strategy = SL_RESTART_NONE},
    [SL_RESTART_FIXED_DELAY] = {.strategy = SL_RESTART_FIXED_DELAY,
                                .attempts = 1,
                                .delay_ms = 1000},
    [SL_RESTART_EXPONENTIAL_DELAY] = {.strategy = SL_RESTART_EXPONENTIAL_DELAY,
                                      .initial_delay_ms = 1000,
                                      .max_delay_ms = 60000,
                                      .multiplier = 1.5,
                                      .jitter = 0.1,
                                      .reset_after_ms = 3600000},
    [SL_RESTART_FAILURE_RATE] = {.strategy = SL_RESTART_FAILURE_RATE,
                                 .max_failures = 1,
                                 .interval_ms = 60000,
                                 .delay_ms = 1000},
};

SL_EXPORT struct sl_restart_config sl_restart_defaults(int strategy) {
  int known = (int)(sizeof restart_defaults / sizeof restart_defaults[0]);
  if (strategy < 0 || strategy >= known) /* refused later, by validation */
    return (struct sl_restart_config){.strategy = strategy};
  assert(restart_defaults[strategy].strategy == strategy);
  return restart_defaults[strategy];
}

int sl_restart_validate(const struct sl_restart_config *r) {
  switch (r->strategy) {
  case SL_RESTART_NONE:
  case SL_RESTART_FIXED_DELAY:
    return 0;
  case SL_RESTART_EXPONENTIAL_DELAY:
    /* isfinite: NaN fails every comparison, so it would pass them. */
    if (!isfinite(r->multiplier) || r->multiplier < 1.0 ||
        !isfinite(r->jitter) || r->jitter < 0.0 || r->jitter > 1.0 ||
        r->max_delay_ms < r->initial_delay_ms)
      return EINVAL;
    return 0;
  case SL_RESTART_FAILURE_RATE:
    return r->interval_ms == 0 || r->max_failures > 1000000u ? EINVAL : 0;
  default:
    return EINVAL;
  }
}

static const char *strategy_name(int strategy) {
  static const char *names[] = {"none", "fixed-delay", "exponential-delay",
                                "failure-rate"};
  return strategy >= 0 && strategy <= 3 ? names[strategy] : "?";
}

/* splitmix64: the jitter needs no more than a well-mixed sequence. */
static uint64_t next_random(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Decide on a failure detected at now_ns: true and the wait, or false and
 * why not (the strategy is exhausted or there is none). */
static bool restart_next(sl_failover *f, uint64_t now_ns, uint64_t *delay_ms,
                         char *why, size_t why_bytes) {
  const struct sl_restart_config *r = &f->config;
  *delay_ms = 0;
  switch (r->strategy) {
  case SL_RESTART_FIXED_DELAY:
    if (f->restarts >= r->attempts) {
      snprintf(why, why_bytes, "the fixed-delay strategy allows %" PRIu32
               " restart%s", r->attempts, r->attempts == 1 ? "" : "s");
      return false;
    }
    *delay_ms = r->delay_ms;
    return true;
  case SL_RESTART_EXPONENTIAL_DELAY: {
    if (r->attempts && f->restarts >= r->attempts) {
      snprintf(why, why_bytes, "the exponential-delay strategy allows %" PRIu32
               " restart%s", r->attempts, r->attempts == 1 ? "" : "s");
      return false;
    }
    bool quiet = f->last_failure_ns &&
                 now_ns - f->last_failure_ns >= (uint64_t)r->reset_after_ms * 1000000u;
    if (f->backoff_ms == 0 || quiet)
      f->backoff_ms = r->initial_delay_ms;
    f->last_failure_ns = now_ns;
    double wait = (double)f->backoff_ms;
    if (r->jitter > 0) {
      /* Uniform in [1 - jitter, 1 + jitter]. */
      double u = (double)(next_random(&f->rng) >> 11) * 0x1.0p-53;
      wait *= 1.0 + r->jitter * (2.0 * u - 1.0);
    }
    if (wait > r->max_delay_ms)
      wait = r->max_delay_ms;
    *delay_ms = (uint64_t)(wait + 0.5);
    double next = (double)f->backoff_ms * r->multiplier;
    f->backoff_ms = next > r->max_delay_ms ? r->max_delay_ms : (uint64_t)next;
    if (f->backoff_ms == 0 && r->max_delay_ms > 0)
      f->backoff_ms = 1; /* from an initial delay of 0, grow from 1 ms */
    return true;
  }
  case SL_RESTART_FAILURE_RATE: {
    f->failure_ns[f->failure_next] = now_ns;
    f->failure_next = (f->failure_next + 1) % f->failure_slots;
    uint64_t window = (uint64_t)r->interval_ms * 1000000u;
    uint32_t recent = 0;
    for (uint32_t i = 0; i < f->failure_slots; i++)
      recent += f->failure_ns[i] && now_ns - f->failure_ns[i] < window;
    if (recent > r->max_failures) {
      snprintf(why, why_bytes, "the failure-rate strategy allows %" PRIu32
               " failure%s per %" PRIu32 " ms, and %" PRIu32 " happened",
               r->max_failures, r->max_failures == 1 ? "" : "s",
               r->interval_ms, recent);
      return false;
    }
    *delay_ms = r->delay_ms;
    return true;
  }
  default:
    snprintf(why, why_bytes, "no restart strategy is set");
    return false;
  }
}

/* ----------------------------------------------------------- timing */

void sl_failover_note_failure(sl_job *job) {
  atomic_store(&job->failed_ns, sl_now_ns());
}

void sl_failover_first_record(sl_job *job) {
  /* Note 5: the first record once every instance has its state (before,
   * an instance with little state may already run while others load). */
  if (atomic_load(&job->restores_pending) > 0)
    return;
  int expected = 1;
  if (atomic_compare_exchange_strong(&job->awaiting_first_record, &expected,
                                     0))
    atomic_store(&job->first_record_ns, sl_now_ns());
}

static uint64_t since_failure_us(const sl_job *job, uint64_t now_ns) {
  uint64_t failed = atomic_load(&job->failed_ns);
  return now_ns > failed ? (now_ns - failed) / 1000u : 0;
}

/* Fill in the newest recovery's first record once one was processed
 * (note 5); the next restart overwrites first_record_ns, so the supervisor
 * also calls this before each decision.  f->lock held. */
static void note_first_record(sl_failover *f, const sl_job *job) {
  if (f->history_count == 0)
    return;
  uint32_t slot = (f->history_count - 1) % RECOVERY_HISTORY;
  sl_recovery_stats *h = &f->history[slot];
  uint64_t failed = f->history_failed_ns[slot];
  uint64_t restored = atomic_load(&job->restored_ns);
  if (!h->restored_us && restored > failed)
    h->restored_us = (restored - failed) / 1000u;
  if (h->first_record_us || atomic_load(&job->awaiting_first_record))
    return;
  uint64_t first = atomic_load(&job->first_record_ns);
  if (first > failed)
    h->first_record_us = (first - failed) / 1000u;
}

SL_EXPORT uint32_t sl_job_restarts(const sl_job *job) {
  if (!job || !job->failover)
    return 0;
  return atomic_load(&job->failover->restarts_shared);
}

SL_EXPORT int sl_job_recovery_stats(const sl_job *job, int k,
                                    sl_recovery_stats *stats) {
  if (!job || !stats || k < 0 || !job->failover)
    return EINVAL;
  sl_failover *f = job->failover;
  int rc = EINVAL;
  pthread_mutex_lock(&f->lock);
  if ((uint32_t)k < f->history_count && k < RECOVERY_HISTORY) {
    if (k == 0)
      note_first_record(f, job);
    *stats = f->history[(f->history_count - 1 - (uint32_t)k) % RECOVERY_HISTORY];
    rc = 0;
  }
  pthread_mutex_unlock(&f->lock);
  return rc;
}

/* ----------------------------------------------------------- restarting */

/* Note 3: an instance as sl_job_compile() made it, its wiring kept. */
static void reset_instance(sl_instance *inst) {
  sl_snapshot_instance_free(inst);
  for (int c = 0; c < inst->channel_count; c++) {
    sl_channel *ch = &inst->channels[c];
    ch->ended = false;
    ch->blocked = false;
    ch->barrier_seen = false;
    ch->logging = 0;    /* the captures went with the snapshot state */
    ch->barrier_in = 0; /* learn_upto and "done at once" read it */
  }
  inst->channels_ended = 0;
  for (int o = 0; o < inst->output_count; o++)
    inst->outputs[o].next = 0;
  sl_event_reset(inst); /* watermarks, idleness; timers come back with the
                           restored state */
  inst->state = 0;
  inst->current = 0;
  inst->stopped_early = false;
  inst->emit_closed = false;
  inst->cause[0] = 0;
  inst->current_channel = 0;
  inst->chain_phase = 0; /* runtime.c note 12: members start again */
  inst->chain_rc = 0;
  /* The parker stays as it is: sl_job_stop() may wake it at any time, and
   * a stale wake only makes one sleep return at once. */
}

/* Note 7: roll inst's map back to checkpoint latest in memory if its
 * state there is known; returns 0, or an error with the map unaltered
 * (then it is reloaded). */
static int roll_back_map(sl_instance *inst, uint64_t latest) {
  sl_instance_checkpoint *cp = &inst->cp;
  sl_cow_map *m = cp->keyed;
  if (!m || latest == 0 || !cp->stable_known ||
      !sl_cow_map_rollback_enabled(m) || cp->stable_id > latest)
    return EINVAL;
  if (cp->stable_id < latest) {
    /* The completion of latest came after this instance's last look:
     * its epoch is still pending, if it snapshotted latest at all. */
    int k = 0;
    while (k < cp->epoch_count && cp->epochs[k].id != latest)
      k++;
    if (k == cp->epoch_count)
      return EINVAL;
    sl_cow_map_release(m, cp->epochs[k].epoch);
  }
  return sl_cow_map_rollback(m, sl_cow_map_stable_epoch(m));
}

/* Note 7, after the setup made new maps: each rolled-back map replaces
 * its instance's new (empty) one.  setup_rc: the setup's result; if it
 * failed, the rolled-back maps are freed with the old state instead.
 * latest: the checkpoint they were rolled back to. */
static void install_kept_state(sl_job *job, int setup_rc, uint64_t latest) {
  sl_failover *f = job->failover;
  f->rolled_back = f->reloaded = 0;
  for (int i = 0; i < job->instance_count; i++) {
    sl_instance *inst = job->instances[i];
    sl_cow_map *kept = f->kept_state[i];
    f->kept_state[i] = 0;
    if (!kept) {
      f->reloaded += setup_rc == 0 && inst->cp.keyed && inst->cp.restored_from;
      continue;
    }
    if (setup_rc || !inst->cp.keyed) {
      assert(!f->old_state[i]);
      f->old_state[i] = kept;
      continue;
    }
    /* The setup restores the checkpoint the map was rolled back to. */
    assert(inst->cp.restored_from == latest);
    (void)latest; /* asserts only */
    sl_cow_map_destroy(inst->cp.keyed); /* empty: cheap */
    inst->cp.keyed = kept;
    inst->cp.keyed_rolled_back = true;
    /* The versions the rollback set aside are freed in steps by the
     * instance (cow_map_rollback.c note 1), also while it has no input. */
    inst->cp.maintain_pending = true;
    f->rolled_back++;
  }
}

/* Free the failed attempt's keyed state (note 6). */
static void free_old_state(sl_job *job) {
  sl_failover *f = job->failover;
  for (int i = 0; i < job->instance_count; i++) {
    sl_cow_map_destroy(f->old_state[i]);
    f->old_state[i] = 0;
  }
}

/* Note 6: wait until every instance has restored (or the attempt ended),
 * then free the old state. */
static void free_old_state_after_restore(sl_job *job) {
  while (atomic_load(&job->restores_pending) > 0 &&
         !atomic_load(&job->stopping)) {
    struct timespec t = {.tv_sec = 0, .tv_nsec = 1000000};
    nanosleep(&t, 0);
  }
  free_old_state(job);
}

/* Note 3, up to the threads' start.  Returns 0, or a failure status with
 * the job failed (and its message set). */
static int restart(sl_job *job) {
  sl_failover *f = job->failover;
  sl_checkpointer_reset(job); /* frees the acks that point into the maps */
  /* Note 7: the checkpoint the setup will restore; the writer is joined,
   * so no other can complete meanwhile. */
  sl_store *store = sl_checkpointer_store(job);
  uint64_t latest = store ? sl_store_latest(store) : 0;
  for (int i = 0; i < job->instance_count; i++) {
    sl_instance *inst = job->instances[i];
    assert(!inst->thread_started); /* note 3: every thread was joined */
    assert(!f->old_state[i] && !f->kept_state[i]);
    if (roll_back_map(inst, latest) == 0)
      f->kept_state[i] = inst->cp.keyed; /* note 7 */
    else
      f->old_state[i] = inst->cp.keyed; /* note 6: freed later */
    inst->cp.keyed = 0;
    reset_instance(inst);
  }
  /* Odd while the rings are emptied: a metrics reader discards what it
   * read meanwhile (metrics.c note 4). */
  atomic_fetch_add(&job->ring_reset_seq, 1);
  for (int i = 0; i < job->ring_count; i++) {
    sl_ring_reset(&job->rings[i]); /* in-flight records are discarded */
    assert(sl_ring_readable_consumer(&job->rings[i]) == 0);
  }
  atomic_fetch_add(&job->ring_reset_seq, 1);
  assert(sl_graph_check(job)); /* note 3: the wiring is as compiled */
  sl_inject_restart(job);
  atomic_store(&job->fail_published, 0); /* first: readers look no more */
  job->error[0] = 0;
  job->fail_status = 0;
  job->restarting = true;
  atomic_store(&job->restored_ns, 0);
  atomic_store(&job->restores_pending, 0);
  atomic_store(&job->failed, 0);
  atomic_store(&job->stopping, 0);
  /* A stop that came during the reset (note 2) must still stop the new
   * attempt: the user's flag was set before its stop. */
  if (atomic_load(&job->user_stopped))
    atomic_store(&job->stopping, 1);
  int rc = sl_checkpointer_setup(job);
  install_kept_state(job, rc, latest);
  if (rc) {
    sl_job_fail(job, rc, "restart: %s",
                job->error[0] ? job->error : sl_strerror(rc));
    return rc;
  }
  rc = sl_checkpointer_start(job);
  if (rc) {
    sl_job_fail(job, rc, "restart: cannot start the checkpoint threads: %s",
                sl_strerror(rc));
    return rc;
  }
  return 0;
}

/* Wait delay_ms unless the user stops the job first (returns false). */
static bool wait_delay(sl_job *job, uint64_t delay_ms) {
  uint64_t end = sl_now_ns() + delay_ms * 1000000u;
  for (;;) {
    if (atomic_load(&job->user_stopped))
      return false;
    uint64_t now = sl_now_ns();
    if (now >= end)
      return true;
    sl_parker_prepare(&job->supervisor_parker);
    if (atomic_load(&job->user_stopped)) {
      sl_parker_cancel(&job->supervisor_parker);
      return false;
    }
    sl_parker_sleep_ns(&job->supervisor_parker, end - now);
  }
}

static void record_recovery(sl_failover *f, const sl_recovery_stats *r,
                            uint64_t failed_ns) {
  pthread_mutex_lock(&f->lock);
  f->history_failed_ns[f->history_count % RECOVERY_HISTORY] = failed_ns;
  f->history[f->history_count % RECOVERY_HISTORY] = *r;
  f->history_count++;
  pthread_mutex_unlock(&f->lock);
}

static void update_recovery(sl_failover *f, uint32_t restart_number,
                            uint64_t restored_from) {
  pthread_mutex_lock(&f->lock);
  sl_recovery_stats *h = &f->history[(f->history_count - 1) % RECOVERY_HISTORY];
  if (h->restart == restart_number) {
    h->restored_from = restored_from;
    h->rolled_back = f->rolled_back;
    h->reloaded = f->reloaded;
  }
  pthread_mutex_unlock(&f->lock);
}

static void supervise(sl_job *job);

static void *supervisor_main(void *arg) {
  sl_job *job = arg;
  pthread_setname_np(pthread_self(), "sl:supervisor");
  supervise(job);
  /* No restart follows: a push source's blocked pushers may give up now,
   * before anyone calls sl_job_wait(). */
  atomic_store(&job->restarts_over, 1);
  sl_push_job_over(job); /* wake them now, not at their next timeout */
  return 0;
}

static void supervise(sl_job *job) {
  sl_failover *f = job->failover;
  for (;;) {
    sl_job_join_threads(job);
    sl_checkpointer_stop(job);
    pthread_mutex_lock(&f->lock);
    note_first_record(f, job);
    pthread_mutex_unlock(&f->lock);
    if (!atomic_load(&job->failed))
      return; /* finished, or stopped by the user */
    uint64_t now = sl_now_ns();
    if (atomic_load(&job->user_stopped))
      return; /* failed while the user stopped it: no restart */
    char why[200];
    uint64_t delay_ms = 0;
    if (!restart_next(f, now, &delay_ms, why, sizeof why)) {
      /* The cause stays first; the message says why it was final. */
      size_t used = strlen(job->error);
      snprintf(job->error + used, sizeof job->error - used,
               " (not restarted after %" PRIu32 " restart%s: %s)",
               f->restarts, f->restarts == 1 ? "" : "s", why);
      sl_log(SL_LOG_ERROR, "sluice: job failed: %s", job->error);
      return;
    }
    sl_recovery_stats r = {.restart = f->restarts + 1,
                           .status = job->fail_status ? job->fail_status
                                                      : SL_ECALLBACK,
                           .delay_us = delay_ms * 1000u,
                           .stopped_us = since_failure_us(job, now)};
    sl_copy_text(r.cause, sizeof r.cause, job->error);
    sl_log(SL_LOG_WARN, "sluice: job failed: %s; restart %" PRIu32 " (%s) in %"
           PRIu64 " ms", job->error, r.restart,
           strategy_name(f->config.strategy), delay_ms);
    record_recovery(f, &r, atomic_load(&job->failed_ns));
    if (delay_ms && !wait_delay(job, delay_ms)) {
      size_t used = strlen(job->error);
      snprintf(job->error + used, sizeof job->error - used,
               " (not restarted: stopped while waiting to restart)");
      return;
    }
    f->restarts++;
    atomic_store(&f->restarts_shared, f->restarts);
    int rc = restart(job);
    uint64_t restored_from = 0;
    sl_job_last_checkpoint(job, &restored_from);
    update_recovery(f, r.restart, restored_from);
    if (rc == 0 && atomic_load(&job->restores_pending) == 0)
      atomic_store(&job->restored_ns, sl_now_ns()); /* nothing to load */
    if (rc == 0) {
      atomic_store(&job->awaiting_first_record, 1);
      sl_job_start_threads(job); /* a failure here is handled as any */
    }
    free_old_state_after_restore(job);
  }
}

/* ----------------------------------------------------------- lifecycle */

int sl_failover_setup(sl_job *job) {
  sl_parker_init(&job->supervisor_parker);
  const struct sl_restart_config *r = &job->config.restart;
  if (r->strategy == SL_RESTART_NONE)
    return 0;
  sl_failover *f = calloc(1, sizeof *f);
  if (!f)
    return ENOMEM;
  f->config = *r;
  f->rng = sl_now_ns();
  if (r->strategy == SL_RESTART_FAILURE_RATE) {
    f->failure_slots = r->max_failures + 1;
    f->failure_ns = calloc(f->failure_slots, sizeof *f->failure_ns);
    if (!f->failure_ns) {
      free(f);
      return ENOMEM;
    }
  }
  f->old_state = calloc((size_t)job->instance_count, sizeof *f->old_state);
  f->kept_state = calloc((size_t)job->instance_count, sizeof *f->kept_state);
  if (!f->old_state || !f->kept_state) {
    free(f->old_state);
    free(f->kept_state);
    free(f->failure_ns);
    free(f);
    return ENOMEM;
  }
  pthread_mutex_init(&f->lock, 0);
  job->failover = f;
  return 0;
}

int sl_failover_start(sl_job *job) {
  if (!job->failover)
    return 0;
  int rc = pthread_create(&job->supervisor, 0, supervisor_main, job);
  job->supervisor_started = rc == 0;
  return rc;
}

bool sl_failover_wait(sl_job *job) {
  if (!job->supervisor_started)
    return false;
  pthread_join(job->supervisor, 0);
  job->supervisor_started = false;
  return true;
}

void sl_failover_free(sl_job *job) {
  sl_failover *f = job->failover;
  if (!f)
    return;
  assert(!job->supervisor_started);
  free_old_state(job);
  free(f->old_state);
  free(f->kept_state); /* empty between restarts (install_kept_state) */
  pthread_mutex_destroy(&f->lock);
  free(f->failure_ns);
  free(f);
  job->failover = 0;
}
