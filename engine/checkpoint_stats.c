/* checkpoint_stats.c — the one job: what a job remembers of its
 * checkpoints, for sl_job_checkpoint_stats, sl_job_checkpoint_instance_stats,
 * sl_job_last_checkpoint, sl_job_captures_aborted and sl_job_metrics.
 *
 * 1. The history is a ring of SL_CHECKPOINT_HISTORY entries, each with one
 *    sl_checkpoint_instance_stats per instance, newest overwriting oldest.
 *    The coordinator adds an entry when it triggers (new_pending) and
 *    fills it when the checkpoint completes or aborts; readers on any
 *    thread copy entries out under history_lock, never pointers.
 * 2. completed_count + failed_count never exceed the entries ever added;
 *    the rest are in progress.  An entry is counted once, also when a
 *    restart's reset finishes a final checkpoint that failed before.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "checkpoint_internal.h"

/* The public struct keeps the size and layout it had before its unaligned
 * fields (sluice_checkpoint.h): 192 bytes, cause at 60. */
_Static_assert(sizeof(sl_checkpoint_stats) == 192 &&
                   offsetof(sl_checkpoint_stats, cause) == 60,
               "sl_checkpoint_stats changed size or layout (ABI)");

static sl_checkpoint_stats *history_at(sl_checkpointer *cp, int slot) {
  return &cp->history[slot % SL_CHECKPOINT_HISTORY];
}

/* A new checkpoint's entry, IN_PROGRESS; returns its slot.  Coordinator
 * thread. */
int sl_checkpoint_history_add(sl_checkpointer *cp, uint64_t id, bool final) {
  pthread_mutex_lock(&cp->history_lock);
  int slot = cp->history_count++ % SL_CHECKPOINT_HISTORY;
  sl_checkpoint_stats *h = &cp->history[slot];
  memset(h, 0, sizeof *h);
  h->id = id;
  h->final = final;
  h->status = SL_CHECKPOINT_IN_PROGRESS;
  h->trigger_time_ms = sl_wall_ms();
  h->instance_count = cp->job->instance_count;
  sl_checkpoint_instance_stats *is = cp->history_instances[slot];
  for (int i = 0; i < cp->job->instance_count; i++) {
    sl_instance *inst = cp->job->instances[i];
    memset(&is[i], 0, sizeof is[i]);
    is[i].name = inst->op->name;
    is[i].instance = inst->index;
  }
  pthread_mutex_unlock(&cp->history_lock);
  return slot;
}

/* Fill the history entry of p when it ends (status completed/aborted).
 * Coordinator thread, or stop/reset while no checkpointer thread runs.
 * only_open: leave an entry that has ended already (a failed final
 * checkpoint keeps the cause it was given). */
static void history_finish(sl_checkpointer *cp, pending *p, int status,
                           const char *cause, bool only_open) {
  pthread_mutex_lock(&cp->history_lock);
  sl_checkpoint_stats *h = history_at(cp, p->history_slot);
  if (only_open && (h->id != p->id || h->status != SL_CHECKPOINT_IN_PROGRESS)) {
    pthread_mutex_unlock(&cp->history_lock);
    return;
  }
  /* Counted once: a failed final checkpoint is finished again by the
   * restart's reset. */
  if (h->id != p->id || h->status == SL_CHECKPOINT_IN_PROGRESS) {
    if (status == SL_CHECKPOINT_COMPLETED)
      cp->completed_count++;
    else
      cp->failed_count++;
  }
  if (h->id == p->id) { /* not yet overwritten by 64 newer ones */
    h->status = status;
    h->duration_us = (sl_now_ns() - p->trigger_ns) / 1000u;
    h->write_us = p->write_us;
    snprintf(h->cause, sizeof h->cause, "%s", cause ? cause : "");
    sl_checkpoint_instance_stats *is =
        cp->history_instances[p->history_slot % SL_CHECKPOINT_HISTORY];
    for (int i = 0; i < cp->job->instance_count; i++) {
      const sl_ack *a = p->acks[i] ? p->acks[i] : cp->final_acks[i];
      if (a && (a->checkpoint_id == p->id || (a->final && p->final))) {
        is[i].start_delay_us = a->start_delay_us;
        is[i].alignment_us = a->alignment_us;
        is[i].sync_us = a->sync_us;
        h->unaligned |= a->unaligned; /* snapshot.c note 12 */
        h->channel_bytes += a->channel_state_bytes;
      }
      is[i].async_us = p->async_us[i];
      is[i].bytes_persisted = p->bytes[i];
      is[i].entries_persisted = p->entries[i];
      h->bytes_persisted += p->bytes[i];
      h->entries_persisted += p->entries[i];
    }
    if (status == SL_CHECKPOINT_COMPLETED)
      cp->latest_completed = *h;
    else
      cp->latest_failed = *h;
  }
  pthread_mutex_unlock(&cp->history_lock);
}

void sl_checkpoint_history_finish(sl_checkpointer *cp, pending *p, int status,
                                  const char *cause) {
  history_finish(cp, p, status, cause, false);
}

void sl_checkpoint_history_finish_open(sl_checkpointer *cp, pending *p,
                                       int status, const char *cause) {
  history_finish(cp, p, status, cause, true);
}

void sl_checkpointer_metrics(const sl_job *job, sl_metrics *m, bool history) {
  sl_checkpointer *cp = job->cp;
  if (!cp)
    return;
  m->checkpointing = 1;
  m->restored_from = atomic_load(&cp->restored_from);
  pthread_mutex_lock(&cp->history_lock);
  assert(cp->completed_count + cp->failed_count <=
         (uint64_t)cp->history_count);
  m->checkpoints_completed = cp->completed_count;
  m->checkpoints_failed = cp->failed_count;
  m->checkpoints_total = (uint64_t)cp->history_count;
  m->checkpoints_in_progress = m->checkpoints_total -
                               m->checkpoints_completed -
                               m->checkpoints_failed;
  m->has_latest_completed = cp->latest_completed.id != 0;
  m->latest_completed = cp->latest_completed;
  m->has_latest_failed = cp->latest_failed.id != 0;
  m->latest_failed = cp->latest_failed;
  int n = cp->history_count < SL_CHECKPOINT_HISTORY ? cp->history_count
                                                     : SL_CHECKPOINT_HISTORY;
  int per = job->instance_count;
  for (int k = 0; history && k < n; k++) { /* newest first */
    int slot = (cp->history_count - 1 - k) % SL_CHECKPOINT_HISTORY;
    m->history[k] = cp->history[slot];
    memcpy(&m->history_instances[(size_t)k * (size_t)per],
           cp->history_instances[slot], (size_t)per * sizeof(*m->history_instances));
  }
  m->history_count = history ? n : 0;
  m->history_instance_count = history ? per : 0;
  pthread_mutex_unlock(&cp->history_lock);
}

SL_EXPORT int sl_job_checkpoint_stats(const sl_job *job, int k,
                                      sl_checkpoint_stats *stats) {
  if (!job || !stats || k < 0)
    return EINVAL;
  sl_checkpointer *cp = job->cp;
  if (!cp)
    return SL_ENOTFOUND;
  int rc = SL_ENOTFOUND;
  pthread_mutex_lock(&cp->history_lock);
  if (k < cp->history_count && k < SL_CHECKPOINT_HISTORY) {
    *stats = *history_at(cp, cp->history_count - 1 - k);
    rc = 0;
  }
  pthread_mutex_unlock(&cp->history_lock);
  return rc;
}

SL_EXPORT int sl_job_checkpoint_instance_stats(
    const sl_job *job, int k, int i, sl_checkpoint_instance_stats *stats) {
  if (!job || !stats || k < 0)
    return EINVAL;
  sl_checkpointer *cp = job->cp;
  if (!cp)
    return SL_ENOTFOUND;
  if (i < 0 || i >= job->instance_count)
    return EINVAL;
  int rc = SL_ENOTFOUND;
  pthread_mutex_lock(&cp->history_lock);
  if (k < cp->history_count && k < SL_CHECKPOINT_HISTORY) {
    int slot = (cp->history_count - 1 - k) % SL_CHECKPOINT_HISTORY;
    *stats = cp->history_instances[slot][i];
    rc = 0;
  }
  pthread_mutex_unlock(&cp->history_lock);
  return rc;
}

SL_EXPORT uint64_t sl_job_captures_aborted(const sl_job *job) {
  /* Counted by the instances (snapshot.c note 12, abort_capture). */
  return job ? atomic_load_explicit(&job->captures_aborted,
                                    memory_order_relaxed)
             : 0;
}

SL_EXPORT uint64_t sl_job_last_checkpoint(const sl_job *job,
                                          uint64_t *restored_from) {
  if (restored_from)
    *restored_from = job && job->cp ? atomic_load(&job->cp->restored_from) : 0;
  if (!job || !job->cp)
    return 0;
  uint64_t id = atomic_load(&job->cp_completed_id);
  return id == atomic_load(&job->cp->restored_from) ? 0 : id;
}
