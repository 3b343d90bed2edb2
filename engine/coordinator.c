/* coordinator.c — the checkpoint coordinator and the asynchronous writer.
 *
 * NOTES ON THE DESIGN OF CHECKPOINTING
 *
 * 1. The coordinator is one thread.  It triggers checkpoint n by storing n
 *    in every source instance's trigger_id and waking it; a source takes
 *    its snapshot between two next() calls and writes barrier n into every
 *    output ring (snapshot.c).  Ids are strictly increasing; a resumed job
 *    continues after the id it restored.
 * 2. Every instance acknowledges each snapshot with an sl_ack through a
 *    wait-free MPSC queue (liburcu's wfcqueue): instances enqueue, only the
 *    coordinator dequeues.  An ack carries the instance's frozen keyed-state
 *    deltas (descriptors only; the entries stay in the instance's cow map),
 *    its operator state and its timings.
 * 3. An instance that reached the end of its input takes one last, "final"
 *    snapshot.  Its state never changes after that, so it stands in for a
 *    checkpoint n the instance has not acknowledged — but only if it never
 *    received barrier (or trigger) n at all: then every input ended before
 *    n was emitted upstream, and its final state is its state at n.  If it
 *    received n and dropped it (n looked settled, or a newer barrier
 *    replaced it in at-least-once mode), it processed records after n, and
 *    n can no longer complete: it is aborted as subsumed.  The final ack
 *    carries max_seen_id for this test.
 * 3a. Checkpoints go on after sources finished (as Flink's FLIP-147), as
 *    long as one source still runs (can_trigger):
 *    (a) a finished source snapshots and emits nothing for n; a channel
 *        that delivered END counts as aligned for every later barrier and
 *        is never blocked (snapshot.c note 3), so each consumer reads a
 *        finished channel up to its END before it can snapshot n, in
 *        aligned and in at-least-once mode: its snapshot n holds every
 *        record the finished instance emitted;
 *    (b) an instance that stands in for n never received barrier n, so
 *        none of its upstream instances sent n to it; each of them sent
 *        it END, so each finished without emitting n, and stands in for n
 *        too (or n aborts by the test above).  A checkpoint's finished
 *        instances are thus closed upstream, and their consumers' snapshots
 *        hold all their output;
 *    (c) the final ack stands in with SL_BLOB_FINISHED (note 11), so a
 *        restore from n (resume, savepoint, failover) restores it
 *        finished: it emits nothing but END, and its consumers' channels
 *        end at once, as they had when they snapshotted n;
 *    (d) the same final ack stands in for every later checkpoint: its
 *        deltas and row batches are written once (durable_epoch,
 *        durable_row_seq), its blob each time; with max_concurrent > 1
 *        each in-flight id applies the test above on its own; aborts,
 *        timeouts and the final checkpoint (note 7) are as before.
 *    Once every source finished nothing is triggered: no barrier could be
 *    emitted, and the final checkpoint follows when the rest drain.
 * 4. When every instance has acknowledged n (or is final), the coordinator
 *    hands n to the writer thread.  The writer puts n's deltas (oldest
 *    first, skipping those already durable) and blobs into one LMDB write
 *    transaction, adds the record of n and commits durably.  Only that
 *    commit makes n complete (DESIGN.md invariant 5).  MDB_MAP_FULL grows
 *    the map and writes the transaction again.
 * 5. On commit the coordinator publishes cp_completed_id = n and wakes every
 *    instance: they release the cow-map epochs up to n (old versions are
 *    reclaimed) and call checkpoint_complete (an exactly-once sink commits
 *    here).  Older checkpoints still in flight are aborted as subsumed.
 * 6. A checkpoint not complete timeout_ms after its trigger (also while it
 *    is being written), or whose write or snapshot failed, is aborted.
 *    cp_settled_id is the highest x such that every id <= x is complete or
 *    aborted; instances drop barriers <= x and cancel an alignment on one
 *    (with max_concurrent > 1 a newer checkpoint can abort before an older
 *    one settles, so "the newest aborted id" would be wrong).  The aborted
 *    deltas stay pending in the cow maps and are written by the next
 *    checkpoint.  More than tolerable_failures consecutive aborts fail the
 *    job with SL_ECHECKPOINT and the cause; checkpoints subsumed by a newer
 *    complete one (or by the final one) do not count.
 * 9. advance() visits checkpoints in id order, but a fully acknowledged
 *    newer one is handed over while an older one still waits for acks;
 *    the writer therefore skips (as subsumed) one whose id is not above
 *    the store's latest, and durable_epoch only moves on a commit.
 * 7. When every instance is final, in-flight checkpoints that are not being
 *    written are aborted (subsumed), and the final checkpoint is written as
 *    a normal one with the next id; cp_final_done then lets the instances
 *    (waiting after their END) commit their sinks and close.
 * 8. Only the writer touches the store while the job runs; restoring (in
 *    sl_checkpointer_setup) happens before any thread starts.  The
 *    exceptions: table reads (sl_job_table_reader) and savepoint copies
 *    (sl_job_savepoint) from any thread, in read transactions of their
 *    own (store.h CONCURRENCY).  A job started from a savepoint installs
 *    it as its store in open_store, before the store is opened
 *    (savepoint.c).
 * 10. Table rows (operators/table_sink.c, snapshot.c note 10) are written
 *    like keyed-state deltas: each instance's part of checkpoint n puts
 *    the row batches of its ack, oldest first, skipping those whose seq
 *    is at or below durable_row_seq (written by an earlier commit), into
 *    n's one write transaction, before its blob and the record of n.  So
 *    a table changes only with a complete checkpoint, and exactly by the
 *    rows of the records before n's barrier; rows of an aborted
 *    checkpoint stay in the instance and go with the next.
 * 11. Finished instances (after Flink's FLIP-147).  An instance finishes
 *    once per job lineage, not once per attempt: the blob written from a
 *    final ack carries SL_BLOB_FINISHED, so every checkpoint a final ack
 *    stands in for (note 3), the final checkpoint included, records that
 *    the instance had finished, beside its last state.  An instance
 *    restored from such a checkpoint (a resume, a start from a savepoint,
 *    a failover restart) is "restored finished": it opens and restores
 *    (a sink's restore commits what the checkpoint pre-committed, which
 *    is idempotent), but runs neither its input nor finish() nor its
 *    end-of-input timers again (runtime.c note 7, timer.c note 8): it
 *    acknowledges its restored state, unchanged, as its final snapshot
 *    (snapshot.c sl_snapshot_final_restored) and writes END.  So a
 *    resumed finished job adds no output, and a timer re-armed during the
 *    end-of-input firing never fires.  A store written before the flag
 *    existed is still read: there a checkpoint whose record says "final"
 *    has every instance finished (read_restored_final); other old
 *    checkpoints have none.  The upstream instances of a finished one are
 *    finished in the same checkpoint (it finished after all their ENDs,
 *    so none of them sent a barrier it could have snapshotted).
 *
 * States of a checkpoint (function making the transition in brackets):
 *
 *   FREE --[can_trigger: a source still runs, fewer than max_concurrent
 *     |     in flight: trigger]
 *     v
 *   TRIGGERED --[each instance acked, or stands in with its final ack
 *       |        (notes 3, 3a): all_acked, hand_to_writer]--> WRITING
 *       |                                        |  [writer_main: commit]
 *       | [timeout / failed ack / an instance    +-----------> COMPLETED
 *       |  finished after dropping n:            |  [write failed / abort
 *       |  abort_checkpoint]                     |   requested]
 *       v                                        v
 *    ABORTED <-----------------------------------+
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <lmdb.h>

#include "fault.h"
#include "internal.h"
#include "log.h"

#define SL_DEFAULT_INTERVAL_MS 1000u
#define SL_DEFAULT_TIMEOUT_MS 60000u
#define SL_MAX_CONCURRENT 16u
/* Writes of one transaction retried after MDB_MAP_FULL: each retry doubles
 * the map, so 24 doublings of 64 MiB exceed any disk. */
#define SL_MAP_FULL_RETRIES 24
/* Entries the writer puts between two looks at an abort request. */
#define SL_WRITER_ABORT_CHECK 4096u

enum cp_state { CP_FREE, CP_TRIGGERED, CP_WRITING, CP_DONE };

/* Why the coordinator asked the writer to give up a checkpoint. */
enum abort_reason { ABORT_NONE = 0, ABORT_SUBSUMED = 1, ABORT_TIMEOUT = 2 };

typedef struct pending {
  enum cp_state state;
  uint64_t id;
  bool final;
  int64_t trigger_time_ms; /* wall clock, for the record */
  uint64_t trigger_ns;
  uint64_t deadline_ns;
  sl_ack **acks;  /* by instance index in job->instances */
  int ack_count;
  int history_slot;
  /* Set by the coordinator (an enum abort_reason), read by the writer. */
  _Atomic int abort_requested;
  /* Set by the writer before `written` is released. */
  _Atomic int written;
  int write_status;
  char write_cause[400];
  uint64_t write_us;
  uint64_t *async_us;    /* per instance */
  uint64_t *bytes;       /* per instance */
  uint64_t *entries;     /* per instance */
} pending;

struct sl_checkpointer {
  sl_job *job;
  sl_store *store;
  uint64_t interval_ns;
  uint64_t timeout_ns;
  uint64_t min_pause_ns;
  uint32_t max_concurrent;
  uint32_t tolerable_failures;

  pthread_t coordinator;
  pthread_t writer;
  bool coordinator_started;
  bool writer_started;
  _Atomic int shutdown;
  sl_parker coordinator_parker;
  sl_parker writer_parker;

  struct __cds_wfcq_head ack_head;
  struct cds_wfcq_tail ack_tail;
  /* Incremented (release) before each enqueue, read (acquire) after each
   * dequeue: the C11 happens-before edge for the ack's contents, which
   * liburcu's own atomics (inline assembly) also give but which tools such
   * as ThreadSanitizer cannot see through. */
  _Atomic uint64_t acks_published;

  /* Coordinator -> writer: checkpoints to write, in id order. */
  pthread_mutex_t write_lock;
  pending *write_queue[SL_MAX_CONCURRENT + 1];
  int write_queue_count;

  /* Coordinator-only. */
  pending slots[SL_MAX_CONCURRENT + 1]; /* +1: the final checkpoint */
  sl_ack **final_acks;                  /* by instance */
  int final_count;
  bool final_started;
  uint64_t last_id;
  uint64_t next_trigger_ns;
  uint64_t last_end_ns;
  uint32_t consecutive_failures;
  int sources_finished; /* source instances with a final ack (note 3a) */
  int source_count;     /* source instances */
  /* sl_job_trigger_checkpoint: requests are numbered; the coordinator
   * serves all requests up to manual_served with one trigger, whose id it
   * stores first in manual_served_id. */
  _Atomic uint64_t manual_requested;
  _Atomic uint64_t manual_served;
  _Atomic uint64_t manual_served_id;

  /* Writer-only: per instance, the newest cow-map epoch and the newest
   * row batch seq durably written (note 10); the sort buffers of
   * collect_sorted. */
  uint32_t *durable_epoch;
  uint64_t *durable_row_seq;
  uint32_t compaction_deferrals; /* cancelled in a row */
  uint64_t compactions; /* store compactions done, and their time */
  uint64_t compaction_us;
  size_t radix_counts[10][256];
  /* Set by the coordinator when it hands the writer a checkpoint (and at
   * shutdown): a running compaction gives way (store.h, set_cancel). */
  _Atomic int compaction_cancel;
  _Atomic int no_compaction; /* the final checkpoint has begun */
  struct sorted_entry *sort_a;
  struct sorted_entry *sort_b;
  uint64_t sort_capacity;
  uint32_t *row_order; /* write_rows: a batch's rows in key order */
  uint64_t row_order_capacity;

  /* History for sl_job_checkpoint_stats (readers take the lock). */
  pthread_mutex_t history_lock;
  sl_checkpoint_stats history[SL_CHECKPOINT_HISTORY];
  sl_checkpoint_instance_stats *history_instances[SL_CHECKPOINT_HISTORY];
  int history_count; /* entries ever added */
  /* For sl_job_metrics (under history_lock too): checkpoints ended each
   * way since the job started, and the newest of each. */
  uint64_t completed_count;
  uint64_t failed_count;
  sl_checkpoint_stats latest_completed; /* id 0: none yet */
  sl_checkpoint_stats latest_failed;
  _Atomic uint64_t restored_from; /* read by sl_job_last_checkpoint() while
                                     a restart writes it */
  bool restored_final; /* restored_from is a final checkpoint (note 11) */
};

uint64_t sl_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void wake_instances(sl_job *job) {
  for (int i = 0; i < job->instance_count; i++)
    sl_parker_wake(&job->instances[i]->parker);
}

sl_store *sl_checkpointer_store(const sl_job *job) {
  return job && job->cp ? job->cp->store : 0;
}

void sl_checkpointer_wake(sl_job *job) {
  if (job->cp)
    sl_parker_wake(&job->cp->coordinator_parker);
}

void sl_ack_free(sl_ack *ack) {
  if (!ack)
    return;
  if (ack->deltas != ack->inline_deltas)
    free(ack->deltas);
  if (ack->batches != ack->inline_batches)
    free(ack->batches); /* the batches are the instance's (note 10) */
  free(ack->blob);
  free(ack);
}

void sl_checkpointer_ack(sl_job *job, sl_ack *ack) {
  sl_checkpointer *cp = job->cp;
  assert(cp);
  cds_wfcq_node_init(&ack->node);
  /* The enqueue is the hand-off: everything the instance wrote into the
   * ack (and the frozen deltas it points to) happens before the
   * coordinator's dequeue. */
  atomic_fetch_add_explicit(&cp->acks_published, 1, memory_order_release);
  cds_wfcq_enqueue(&cp->ack_head, &cp->ack_tail, &ack->node);
  sl_parker_wake(&cp->coordinator_parker);
}

/* ----------------------------------------------------------- history */

static sl_checkpoint_stats *history_at(sl_checkpointer *cp, int slot) {
  return &cp->history[slot % SL_CHECKPOINT_HISTORY];
}

static int history_add(sl_checkpointer *cp, uint64_t id, bool final) {
  pthread_mutex_lock(&cp->history_lock);
  int slot = cp->history_count++ % SL_CHECKPOINT_HISTORY;
  sl_checkpoint_stats *h = &cp->history[slot];
  memset(h, 0, sizeof *h);
  h->id = id;
  h->final = final;
  h->status = SL_CHECKPOINT_IN_PROGRESS;
  h->trigger_time_ms = wall_ms();
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

/* Fill the history entry of p when it ends (status completed/aborted). */
static void history_finish(sl_checkpointer *cp, pending *p, int status,
                           const char *cause) {
  pthread_mutex_lock(&cp->history_lock);
  sl_checkpoint_stats *h = history_at(cp, p->history_slot);
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

SL_EXPORT uint64_t sl_job_last_checkpoint(const sl_job *job,
                                          uint64_t *restored_from) {
  if (restored_from)
    *restored_from = job && job->cp ? atomic_load(&job->cp->restored_from) : 0;
  if (!job || !job->cp)
    return 0;
  uint64_t id = atomic_load(&job->cp_completed_id);
  return id == atomic_load(&job->cp->restored_from) ? 0 : id;
}

/* ----------------------------------------------------------- the writer */

/* Key group of a keyed-state key: its first 8 bytes are the record key,
 * big-endian (state.c). */
static uint16_t entry_group(const sl_job *job, const sl_cow_entry *e) {
  assert(e->key_bytes >= 8);
  uint64_t key = sl_load_be64(sl_cow_entry_key(e));
  return (uint16_t)sl_key_group(key, job->config.max_parallelism);
}

/* An entry to write and its place in LMDB's order: (key group, record
 * key), then the rest of the state key (state id, kind, user key).  The
 * radix sort orders by the first two; runs equal there (several states of
 * one key) are finished by insertion sort on the rest.  Both are stable,
 * so versions of one state key stay oldest first (the newest is written
 * last and wins).  Exact order lets the store append (MDB_APPEND). */
typedef struct sorted_entry {
  uint64_t key;   /* record key */
  uint16_t group; /* key group */
  const sl_cow_entry *entry;
} sorted_entry;

static unsigned sort_byte(const sorted_entry *e, int b) {
  return b < 8 ? (unsigned)(e->key >> (8 * b)) & 0xff
               : (unsigned)(e->group >> (8 * (b - 8))) & 0xff;
}

/* Stable LSD radix sort by (group, key), 8 bits a pass, least significant
 * first; a pass whose byte is the same in every entry is skipped (key
 * groups use few bits).  The result is in a or tmp: the returned pointer. */
static sorted_entry *radix_sort(sorted_entry *a, sorted_entry *tmp,
                                size_t n, size_t counts[10][256]) {
  memset(counts, 0, sizeof(size_t) * 10 * 256);
  for (size_t i = 0; i < n; i++)
    for (int b = 0; b < 10; b++)
      counts[b][sort_byte(&a[i], b)]++;
  for (int b = 0; b < 10; b++) {
    if (counts[b][sort_byte(&a[0], b)] == n)
      continue; /* every entry has the same byte here */
    size_t offset = 0;
    for (int v = 0; v < 256; v++) {
      size_t c = counts[b][v];
      counts[b][v] = offset;
      offset += c;
    }
    for (size_t i = 0; i < n; i++)
      tmp[counts[b][sort_byte(&a[i], b)]++] = a[i];
    sorted_entry *swap = a;
    a = tmp;
    tmp = swap;
  }
  return a;
}

/* The rest of two state keys after the record key, as LMDB compares them
 * (bytes, then length). */
static int rest_compare(const sl_cow_entry *x, const sl_cow_entry *y) {
  uint32_t xn = x->key_bytes - 8, yn = y->key_bytes - 8;
  int c = memcmp((const uint8_t *)sl_cow_entry_key(x) + 8,
                 (const uint8_t *)sl_cow_entry_key(y) + 8, xn < yn ? xn : yn);
  return c ? c : (xn > yn) - (xn < yn);
}

/* For long runs: by the rest of the key, then oldest version first (only
 * versions of one state key compare equal on the rest, and they come from
 * different epochs: superseded ones of one epoch are not collected). */
static int run_compare(const void *x, const void *y) {
  const sl_cow_entry *a = ((const sorted_entry *)x)->entry;
  const sl_cow_entry *b = ((const sorted_entry *)y)->entry;
  int c = rest_compare(a, b);
  return c ? c : (a->epoch > b->epoch) - (a->epoch < b->epoch);
}

/* Runs longer than this (map state: many user keys under one record key)
 * are sorted with qsort instead of insertion sort. */
#define SL_SHORT_RUN 16u

/* Finish the order inside runs of equal (group, key): a run is as long as
 * the changed states of one record key — usually a few (insertion sort),
 * for map state possibly many (qsort by run_compare). */
static void sort_runs(sorted_entry *a, size_t n) {
  for (size_t start = 0, end; start < n; start = end) {
    for (end = start + 1; end < n && a[end].key == a[start].key &&
                          a[end].group == a[start].group;
         end++) {
    }
    if (end - start > SL_SHORT_RUN)
      qsort(a + start, end - start, sizeof *a, run_compare);
  }
  for (size_t i = 1; i < n; i++) {
    if (a[i].key != a[i - 1].key || a[i].group != a[i - 1].group)
      continue;
    sorted_entry e = a[i];
    size_t j = i;
    while (j > 0 && a[j - 1].key == e.key && a[j - 1].group == e.group &&
           rest_compare(a[j - 1].entry, e.entry) > 0) {
      a[j] = a[j - 1];
      j--;
    }
    a[j] = e;
  }
}

/* Collect the entries of instance i's deltas that are not yet durable into
 * the writer's sort buffers, sorted.  Returns the count, or -1 (ENOMEM). */
static int64_t collect_sorted(sl_checkpointer *cp, const sl_ack *a, int i,
                              uint32_t *max_epoch, sorted_entry **sorted) {
  const sl_job *job = cp->job;
  uint64_t n = 0;
  for (int d = 0; d < a->delta_count; d++)
    if (a->deltas[d].epoch > cp->durable_epoch[i])
      n += a->deltas[d].entries;
  if (n > cp->sort_capacity) {
    free(cp->sort_a);
    free(cp->sort_b);
    cp->sort_a = malloc(sizeof(sorted_entry) * n);
    cp->sort_b = malloc(sizeof(sorted_entry) * n);
    cp->sort_capacity = cp->sort_a && cp->sort_b ? n : 0;
    if (!cp->sort_capacity)
      return -1;
  }
  size_t count = 0;
  for (int d = 0; d < a->delta_count; d++) {
    const sl_cow_delta *delta = &a->deltas[d];
    if (delta->epoch <= cp->durable_epoch[i])
      continue; /* written by an earlier checkpoint (note 4) */
    if (delta->epoch > *max_epoch)
      *max_epoch = delta->epoch;
    for (const sl_cow_entry *e = delta->head; e; e = e->dirty_next) {
      assert(count < n);
      if (e->superseded)
        continue;
      cp->sort_a[count].key = sl_load_be64(sl_cow_entry_key(e));
      cp->sort_a[count].group = entry_group(job, e);
      cp->sort_a[count].entry = e;
      count++;
    }
  }
  *sorted = count ? radix_sort(cp->sort_a, cp->sort_b, count, cp->radix_counts)
                 : cp->sort_a;
  sort_runs(*sorted, count);
  return (int64_t)count;
}

/* qsort_r: two rows of the batch arg in LMDB's key order (memcmp, then
 * the shorter first); a batch's keys are distinct. */
static int row_compare(const void *x, const void *y, void *arg) {
  const sl_row_batch *batch = arg;
  const sl_row *a = &batch->rows[*(const uint32_t *)x];
  const sl_row *b = &batch->rows[*(const uint32_t *)y];
  uint32_t n = a->key_bytes < b->key_bytes ? a->key_bytes : b->key_bytes;
  int c = n ? memcmp(batch->arena + a->offset, batch->arena + b->offset, n)
            : 0;
  return c ? c : (a->key_bytes > b->key_bytes) - (a->key_bytes < b->key_bytes);
}

/* The rows of batch in key order, in the writer's buffer: LMDB takes
 * ordered puts about 2x faster (store_rows, 1M rows: 0.78 s vs 1.78 s),
 * and sorting here keeps O(n log n) off the barrier's path.  NULL (no
 * memory): write them as they are, which changes nothing but speed. */
static const uint32_t *row_order(sl_checkpointer *cp,
                                 const sl_row_batch *batch) {
  if (batch->row_count > cp->row_order_capacity) {
    free(cp->row_order);
    cp->row_order = malloc(sizeof *cp->row_order * batch->row_count);
    cp->row_order_capacity = cp->row_order ? batch->row_count : 0;
    if (!cp->row_order)
      return 0;
  }
  for (uint64_t r = 0; r < batch->row_count; r++)
    cp->row_order[r] = (uint32_t)r; /* a batch has < 2^32 rows */
  qsort_r(cp->row_order, batch->row_count, sizeof *cp->row_order,
          row_compare, (void *)batch);
  return cp->row_order;
}

/* Note 10: the row batches of ack a (instance i) not yet durable, oldest
 * first, into txn; *row_seq receives the newest seq written.  Adds to
 * *entries and *bytes.  Returns 0, ECANCELED or a store error. */
static int write_rows(sl_checkpointer *cp, sl_store_txn *txn, pending *p,
                      const sl_ack *a, int i, uint64_t *row_seq,
                      uint64_t *entries, uint64_t *bytes) {
  for (int b = 0; b < a->batch_count; b++) {
    if (a->batches[b].seq <= cp->durable_row_seq[i])
      continue; /* written, perhaps freed: not to be touched */
    const sl_row_batch *batch = a->batches[b].batch;
    assert(batch->seq == a->batches[b].seq);
    assert(batch->seq > *row_seq); /* oldest first */
    int table;
    int rc = sl_store_txn_table(txn, batch->table, &table);
    const uint32_t *order = rc == 0 ? row_order(cp, batch) : 0;
    for (uint64_t r = 0; r < batch->row_count && rc == 0; r++) {
      const sl_row *row = &batch->rows[order ? order[r] : r];
      assert(row->offset + row->key_bytes + row->value_bytes <=
             batch->arena_bytes);
      const uint8_t *key = batch->arena + row->offset;
      rc = row->tombstone
               ? sl_store_delete_row(txn, table, key, row->key_bytes)
               : sl_store_put_row(txn, table, key, row->key_bytes,
                                  key + row->key_bytes, row->value_bytes);
      *bytes += row->key_bytes + row->value_bytes;
      if (++*entries % SL_WRITER_ABORT_CHECK == 0 && rc == 0 &&
          (atomic_load(&p->abort_requested) || atomic_load(&cp->shutdown)))
        rc = ECANCELED;
    }
    if (rc)
      return rc;
    *row_seq = batch->seq;
  }
  return 0;
}

/* Put one instance's part of p into txn.  Returns 0 or a store error. */
static int write_instance(sl_checkpointer *cp, sl_store_txn *txn, pending *p,
                          int i, uint32_t *max_epoch, uint64_t *row_seq) {
  sl_job *job = cp->job;
  sl_instance *inst = job->instances[i];
  const sl_ack *a = p->acks[i] ? p->acks[i] : cp->final_acks[i];
  assert(a);
  /* Note 3: a final ack stands in only for ids it never received. */
  assert(!a->final || a->max_seen_id < p->id);
  uint16_t op = (uint16_t)inst->op->id;
  uint64_t entries = 0, bytes = 0;
  sorted_entry *sorted = 0;
  int64_t count = collect_sorted(cp, a, i, max_epoch, &sorted);
  if (count < 0)
    return ENOMEM;
  /* The entries are scattered in memory and visited in key order: fetch
   * a few ahead, or each visit waits for a cache miss. */
  enum { PREFETCH_AHEAD = 12 };
  for (int64_t k = 0; k < count; k++) {
    if (k + PREFETCH_AHEAD < count) {
      const sl_cow_entry *ahead = sorted[k + PREFETCH_AHEAD].entry;
      __builtin_prefetch(ahead);
      __builtin_prefetch((const uint8_t *)ahead + 64);
    }
    const sl_cow_entry *e = sorted[k].entry;
    uint16_t group = sorted[k].group;
    int rc;
    if (e->tombstone)
      rc = sl_store_delete_state(txn, op, group, sl_cow_entry_key(e),
                                 e->key_bytes);
    else
      rc = sl_store_put_state(
          txn, op, group, sl_cow_entry_key(e), e->key_bytes,
          e->data + sl_cow_value_offset(e->key_bytes), e->value_bytes);
    if (rc)
      return rc;
    entries++;
    bytes += e->key_bytes + e->value_bytes;
    if (entries % SL_WRITER_ABORT_CHECK == 0 &&
        (atomic_load(&p->abort_requested) || atomic_load(&cp->shutdown)))
      return ECANCELED;
  }
  uint64_t row_entries = 0;
  int rows_rc = write_rows(cp, txn, p, a, i, row_seq, &row_entries, &bytes);
  if (rows_rc)
    return rows_rc;
  /* Every instance gets a blob, with a flag byte, so a snapshot that saved
   * nothing replaces an older one (a restore must not see stale state).
   * Flag bit 0: operator state follows; bit 1: the event-time state
   * (watermark, largest timestamp: 16 bytes) comes last. */
  uint32_t user_bytes = a->has_blob ? a->blob_bytes : 0;
  uint32_t blob_bytes = 1 + user_bytes + (a->has_event_time ? 16u : 0u);
  uint8_t small[64];
  uint8_t *blob = blob_bytes <= sizeof small ? small : malloc(blob_bytes);
  if (!blob)
    return ENOMEM;
  /* Note 11: a final ack marks its instance finished in every checkpoint
   * it stands in for. */
  blob[0] = (uint8_t)((a->has_blob ? SL_BLOB_STATE : 0u) |
                      (a->has_event_time ? SL_BLOB_EVENT_TIME : 0u) |
                      (a->final ? SL_BLOB_FINISHED : 0u));
  assert((blob[0] & ~SL_BLOB_FLAGS) == 0);
  if (user_bytes)
    memcpy(blob + 1, a->blob, user_bytes);
  if (a->has_event_time)
    memcpy(blob + 1 + user_bytes, a->event_time, 16);
  int rc = sl_store_put_blob(txn, op, (uint16_t)inst->index, blob, blob_bytes);
  if (blob != small)
    free(blob);
  p->entries[i] = entries;
  p->bytes[i] = bytes + blob_bytes;
  return rc;
}

/* The record of a checkpoint: a small fixed layout, little-endian.
 * Version 2 added the two totals at the end (version 1 records are 24
 * bytes); engine/inspect.c reads both. */
typedef struct cp_record {
  uint32_t version;     /* 2 */
  uint32_t final;       /* the end-of-input checkpoint */
  int64_t trigger_time_ms;
  uint64_t instance_count;
  uint64_t bytes_persisted;   /* what this transaction wrote, as in */
  uint64_t entries_persisted; /* sl_checkpoint_stats */
} cp_record;
_Static_assert(sizeof(cp_record) == 40, "the record's layout has no padding");

/* One attempt at writing p.  *epochs and *row_seqs receive, per
 * instance, the newest epoch and row batch written. */
static int write_once(sl_checkpointer *cp, pending *p, uint32_t *epochs,
                      uint64_t *row_seqs) {
  sl_job *job = cp->job;
  sl_store_txn *txn = 0;
  if (job->faults) { /* inject.c: the cause names the fault */
    int rc = sl_inject_occurrence(job, 0, SL_FAULT_WRITE, -1, p->write_cause,
                                  sizeof p->write_cause);
    if (rc)
      return rc;
  }
  int rc = sl_store_begin(cp->store, &txn);
  if (rc)
    return rc;
  for (int i = 0; i < job->instance_count && rc == 0; i++) {
    uint64_t t0 = sl_now_ns();
    epochs[i] = cp->durable_epoch[i];
    row_seqs[i] = cp->durable_row_seq[i];
    rc = write_instance(cp, txn, p, i, &epochs[i], &row_seqs[i]);
    p->async_us[i] = (sl_now_ns() - t0) / 1000u;
    if (i == 0 && job->faults)
      sl_inject_crash_point(job, SL_CRASH_MID_WRITE);
  }
  if (rc) {
    sl_store_abort(txn);
    return rc;
  }
  cp_record rec = {.version = 2,
                   .final = p->final,
                   .trigger_time_ms = p->trigger_time_ms,
                   .instance_count = (uint64_t)job->instance_count};
  for (int i = 0; i < job->instance_count; i++) {
    rec.bytes_persisted += p->bytes[i];
    rec.entries_persisted += p->entries[i];
  }
  return sl_store_commit(txn, p->id, &rec, sizeof rec);
}

static void write_checkpoint(sl_checkpointer *cp, pending *p) {
  sl_job *job = cp->job;
  uint64_t t0 = sl_now_ns();
  uint32_t *epochs = calloc((size_t)job->instance_count, sizeof *epochs);
  uint64_t *row_seqs = calloc((size_t)job->instance_count, sizeof *row_seqs);
  int rc = epochs && row_seqs ? 0 : ENOMEM;
  /* Note 9: given up, or a newer one is already durable. */
  if (atomic_load(&p->abort_requested) ||
      p->id <= sl_store_latest(cp->store))
    rc = ECANCELED;
  for (int attempt = 0; rc == 0; attempt++) {
    rc = write_once(cp, p, epochs, row_seqs);
    if (rc != MDB_MAP_FULL || attempt == SL_MAP_FULL_RETRIES)
      break;
    /* Note 4: nothing was committed; grow and write it all again. */
    rc = sl_store_grow(cp->store);
  }
  p->write_us = (sl_now_ns() - t0) / 1000u;
  p->write_status = rc;
  if (rc == 0) {
    for (int i = 0; i < job->instance_count; i++) {
      cp->durable_epoch[i] = epochs[i];
      cp->durable_row_seq[i] = row_seqs[i];
    }
    if (job->faults) /* durable, the sinks not yet told */
      sl_inject_crash_point(job, SL_CRASH_AFTER_COMMIT);
  } else if (rc == SL_EINJECTED) {
    char text[sizeof p->write_cause];
    memcpy(text, p->write_cause, sizeof text);
    int used = snprintf(p->write_cause, sizeof p->write_cause,
                        "writing checkpoint %" PRIu64 " failed: ", p->id);
    sl_copy_text(p->write_cause + used, sizeof p->write_cause - (size_t)used,
                 text);
  } else if (rc == ECANCELED) {
    snprintf(p->write_cause, sizeof p->write_cause, "%s",
             atomic_load(&p->abort_requested) == ABORT_TIMEOUT
                 ? "timed out while being written"
                 : "subsumed by a newer checkpoint while being written");
  } else {
    snprintf(p->write_cause, sizeof p->write_cause,
             "writing checkpoint %" PRIu64 " to %s failed: %s%s%s%s%s%s",
             p->id, job->config.checkpoint.state_dir, sl_strerror(rc),
             sl_store_error(cp->store)[0] ? ": " : "",
             sl_store_error(cp->store),
             job->store_fault_text[0] ? " [injected fault '" : "",
             job->store_fault_text, job->store_fault_text[0] ? "']" : "");
  }
  job->store_fault_text[0] = 0;
  free(epochs);
  free(row_seqs);
}

static pending *writer_take(sl_checkpointer *cp) {
  pthread_mutex_lock(&cp->write_lock);
  pending *p = 0;
  if (cp->write_queue_count > 0) {
    p = cp->write_queue[0];
    memmove(cp->write_queue, cp->write_queue + 1,
            sizeof(pending *) * (size_t)(cp->write_queue_count - 1));
    cp->write_queue_count--;
  }
  pthread_mutex_unlock(&cp->write_lock);
  return p;
}

/* Log entries below which the store is not compacted: a small state
 * would otherwise be rewritten after nearly every checkpoint. */
#define SL_COMPACT_MIN_LOG_ENTRIES 65536u
/* Compactions a waiting checkpoint may cancel in a row (compact_if_due). */
#define SL_COMPACT_MAX_DEFERRALS 3u

/* Between checkpoints: merge the store's log into its base when the log
 * has grown as large as the base (store.h note 3).  A checkpoint handed
 * over meanwhile cancels it within 4096 entries (it is retried after that
 * checkpoint), so a compaction delays a checkpoint by milliseconds, not by
 * its whole length (but see the deferral bound below); so does a shutdown.
 * A failure loses nothing (the log stays) and is retried after the next
 * checkpoint. */
static void compact_if_due(sl_checkpointer *cp) {
  atomic_store(&cp->compaction_cancel, 0);
  pthread_mutex_lock(&cp->write_lock);
  bool queued = cp->write_queue_count > 0; /* after the reset: no race */
  pthread_mutex_unlock(&cp->write_lock);
  /* Checkpoints back to back would cancel every compaction, and the log
   * (which reads and restores must merge) would grow without bound: after
   * SL_COMPACT_MAX_DEFERRALS cancellations one runs to the end, delaying
   * one checkpoint. */
  bool forced = cp->compaction_deferrals >= SL_COMPACT_MAX_DEFERRALS;
  if ((queued && !forced) || atomic_load(&cp->no_compaction) ||
      atomic_load(&cp->shutdown) || atomic_load(&cp->job->stopping))
    return;
  /* A forced one ignores waiting checkpoints, not a shutdown: a stop or a
   * failover must not wait for a whole compaction (up to a second at 1M
   * keys). */
  sl_store_set_cancel(cp->store, forced ? &cp->shutdown : &cp->compaction_cancel);
  for (int attempt = 0; attempt < SL_MAP_FULL_RETRIES; attempt++) {
    sl_store_compaction stats;
    int rc = sl_store_compact(cp->store, SL_COMPACT_MIN_LOG_ENTRIES, &stats);
    if (rc == 0) {
      cp->compaction_deferrals = 0;
      if (stats.entries_written + stats.log_entries_read > 0) {
        cp->compactions++;
        cp->compaction_us += stats.duration_us;
      }
    } else if (rc == ECANCELED) {
      cp->compaction_deferrals++;
    }
    if (rc != MDB_MAP_FULL || sl_store_grow(cp->store) != 0)
      break;
  }
  sl_store_set_cancel(cp->store, &cp->compaction_cancel);
}

static void *writer_main(void *arg) {
  sl_checkpointer *cp = arg;
  pthread_setname_np(pthread_self(), "sl:writer");
  bool wrote = false;
  for (;;) {
    pending *p = writer_take(cp);
    if (!p && wrote && !atomic_load(&cp->shutdown)) {
      wrote = false;
      compact_if_due(cp);
      continue; /* look for work again before sleeping */
    }
    if (!p) {
      sl_parker_prepare(&cp->writer_parker);
      if (atomic_load(&cp->shutdown)) {
        sl_parker_cancel(&cp->writer_parker);
        return 0;
      }
      pthread_mutex_lock(&cp->write_lock);
      bool work = cp->write_queue_count > 0;
      pthread_mutex_unlock(&cp->write_lock);
      if (work)
        sl_parker_cancel(&cp->writer_parker);
      else
        sl_parker_sleep(&cp->writer_parker);
      continue;
    }
    write_checkpoint(cp, p);
    wrote = wrote || p->write_status == 0;
    /* Release: the coordinator reads the results after acquiring this. */
    atomic_store_explicit(&p->written, 1, memory_order_release);
    sl_parker_wake(&cp->coordinator_parker);
  }
}

/* ----------------------------------------------------------- coordinator */

static void pending_clear(sl_checkpointer *cp, pending *p) {
  for (int i = 0; i < cp->job->instance_count; i++) {
    sl_ack_free(p->acks[i]);
    p->acks[i] = 0;
  }
  p->ack_count = 0;
  p->state = CP_FREE;
}

static void fail_job(sl_checkpointer *cp, int status, const char *cause) {
  sl_job_fail(cp->job, status, "%s", cause);
}

/* Note 6: the highest id with nothing at or below it still in flight. */
static void update_settled(sl_checkpointer *cp) {
  uint64_t settled = cp->last_id;
  for (unsigned s = 0; s <= SL_MAX_CONCURRENT; s++) {
    const pending *q = &cp->slots[s];
    if ((q->state == CP_TRIGGERED || q->state == CP_WRITING) &&
        q->id - 1 < settled)
      settled = q->id - 1;
  }
  if (settled > atomic_load(&cp->job->cp_settled_id))
    atomic_store(&cp->job->cp_settled_id, settled);
}

static void abort_checkpoint(sl_checkpointer *cp, pending *p,
                             const char *cause, bool counts_as_failure) {
  sl_job *job = cp->job;
  sl_log(counts_as_failure ? SL_LOG_WARN : SL_LOG_DEBUG,
         "sluice: checkpoint %" PRIu64 " aborted: %s", p->id, cause);
  history_finish(cp, p, SL_CHECKPOINT_ABORTED, cause);
  pending_clear(cp, p);
  update_settled(cp);
  cp->last_end_ns = sl_now_ns();
  wake_instances(job);
  if (!counts_as_failure)
    return;
  if (++cp->consecutive_failures > cp->tolerable_failures) {
    char message[300];
    snprintf(message, sizeof message,
             "checkpoint %" PRIu64 " failed (%s); %" PRIu32
             " consecutive failures, %" PRIu32 " tolerated",
             p->id, cause, cp->consecutive_failures, cp->tolerable_failures);
    fail_job(cp, SL_ECHECKPOINT, message);
  }
}

static void complete_checkpoint(sl_checkpointer *cp, pending *p) {
  sl_job *job = cp->job;
  /* DESIGN.md invariant 5: only the writer's durable commit completes. */
  assert(p->state == CP_DONE);
  assert(p->write_status == 0);
  assert(p->id > atomic_load(&job->cp_completed_id));
  history_finish(cp, p, SL_CHECKPOINT_COMPLETED, 0);
  sl_log(SL_LOG_DEBUG, "sluice: checkpoint %" PRIu64 " complete%s in %.1f ms",
         p->id, p->final ? " (final)" : "",
         (double)(sl_now_ns() - p->trigger_ns) / 1e6);
  cp->consecutive_failures = 0;
  cp->last_end_ns = sl_now_ns();
  uint64_t id = p->id;
  bool final = p->final;
  pending_clear(cp, p);
  /* Note 5: older ones can never complete now. */
  for (unsigned s = 0; s <= SL_MAX_CONCURRENT; s++) {
    pending *q = &cp->slots[s];
    if (q->state == CP_TRIGGERED && q->id < id)
      abort_checkpoint(cp, q, "subsumed by a newer checkpoint", false);
    else if (q->state == CP_WRITING && q->id < id)
      atomic_store(&q->abort_requested, ABORT_SUBSUMED);
  }
  update_settled(cp);
  atomic_store(&job->cp_completed_id, id);
  if (final)
    atomic_store(&job->cp_final_done, 1);
  wake_instances(job);
}

static void hand_to_writer(sl_checkpointer *cp, pending *p) {
  p->state = CP_WRITING;
  atomic_store(&p->written, 0);
  pthread_mutex_lock(&cp->write_lock);
  assert(cp->write_queue_count <= (int)SL_MAX_CONCURRENT);
  cp->write_queue[cp->write_queue_count++] = p;
  pthread_mutex_unlock(&cp->write_lock);
  atomic_store(&cp->compaction_cancel, 1);
  sl_parker_wake(&cp->writer_parker);
}

static pending *find_pending(sl_checkpointer *cp, uint64_t id) {
  for (unsigned s = 0; s <= SL_MAX_CONCURRENT; s++)
    if (cp->slots[s].state != CP_FREE && cp->slots[s].id == id)
      return &cp->slots[s];
  return 0;
}

static int in_flight(const sl_checkpointer *cp) {
  int n = 0;
  for (unsigned s = 0; s <= SL_MAX_CONCURRENT; s++)
    n += cp->slots[s].state == CP_TRIGGERED || cp->slots[s].state == CP_WRITING;
  return n;
}

static pending *new_pending(sl_checkpointer *cp, bool final) {
  for (unsigned s = 0; s <= SL_MAX_CONCURRENT; s++) {
    pending *p = &cp->slots[s];
    if (p->state != CP_FREE)
      continue;
    p->state = CP_TRIGGERED;
    p->id = ++cp->last_id;
    p->final = final;
    p->trigger_ns = sl_now_ns();
    p->trigger_time_ms = wall_ms();
    p->deadline_ns = p->trigger_ns + cp->timeout_ns;
    p->ack_count = 0;
    atomic_store(&p->abort_requested, 0);
    p->write_us = 0;
    p->write_cause[0] = 0;
    for (int i = 0; i < cp->job->instance_count; i++)
      p->async_us[i] = p->bytes[i] = p->entries[i] = 0;
    p->history_slot = history_add(cp, p->id, final);
    return p;
  }
  return 0;
}

static void trigger(sl_checkpointer *cp) {
  sl_job *job = cp->job;
  pending *p = new_pending(cp, false);
  assert(p);
  for (int i = 0; i < job->instance_count; i++) {
    sl_instance *inst = job->instances[i];
    if (inst->op->kind != SL_OP_SOURCE)
      continue;
    /* Release: pairs with the source's acquire of trigger_id. */
    atomic_store_explicit(&inst->cp.trigger_id, p->id, memory_order_release);
    sl_parker_wake(&inst->parker);
  }
}

static int instance_slot(const sl_job *job, const sl_instance *inst) {
  for (int i = 0; i < job->instance_count; i++)
    if (job->instances[i] == inst)
      return i;
  assert(!"ack from an unknown instance");
  return -1;
}

/* Notes 3, 3a: the counts of finished instances agree with the final
 * acks held. */
static __attribute__((unused)) bool finished_check(const sl_checkpointer *cp) {
  int finals = 0, sources = 0, finished_sources = 0;
  for (int i = 0; i < cp->job->instance_count; i++) {
    bool source = cp->job->instances[i]->op->kind == SL_OP_SOURCE;
    const sl_ack *f = cp->final_acks[i];
    sources += source;
    if (!f)
      continue;
    if (!f->final || f->inst != cp->job->instances[i])
      return false;
    finals++;
    finished_sources += source;
  }
  return finals == cp->final_count && sources == cp->source_count &&
         finished_sources == cp->sources_finished;
}

static void take_ack(sl_checkpointer *cp, sl_ack *a) {
  sl_job *job = cp->job;
  int i = instance_slot(job, a->inst);
  if (a->status) {
    pending *p = a->final ? 0 : find_pending(cp, a->checkpoint_id);
    char message[300];
    snprintf(message, sizeof message,
             "the snapshot of operator '%s' instance %d failed: %s",
             a->inst->op->name, a->inst->index, a->cause);
    if (p && p->state == CP_TRIGGERED)
      abort_checkpoint(cp, p, message, true);
    else if (a->final)
      fail_job(cp, SL_ECALLBACK, message);
    sl_ack_free(a);
    return;
  }
  pending *of = find_pending(cp, a->checkpoint_id);
  if (of && a->barrier_ns > of->trigger_ns)
    a->start_delay_us = (a->barrier_ns - of->trigger_ns) / 1000u;
  if (a->final) {
    assert(!cp->final_acks[i]);
    cp->final_acks[i] = a;
    cp->final_count++;
    cp->sources_finished += a->inst->op->kind == SL_OP_SOURCE;
    assert(finished_check(cp));
    return;
  }
  pending *p = find_pending(cp, a->checkpoint_id);
  if (!p || p->state != CP_TRIGGERED || p->acks[i]) {
    sl_ack_free(a); /* for an aborted checkpoint */
    return;
  }
  p->acks[i] = a;
  p->ack_count++;
}

/* 1: every instance acknowledged p or stands in with its final snapshot
 * (note 3); 0: some have yet to; -1: p can never complete (an instance
 * finished after dropping p's barrier). */
static int all_acked(const sl_checkpointer *cp, const pending *p) {
  int result = 1;
  for (int i = 0; i < cp->job->instance_count; i++) {
    assert(!p->acks[i] ||
           (p->acks[i]->checkpoint_id == p->id && !p->acks[i]->final));
    if (p->acks[i])
      continue;
    const sl_ack *f = cp->final_acks[i];
    if (!f)
      result = 0;
    else if (f->max_seen_id >= p->id)
      return -1;
  }
  return result;
}

/* The in-flight slot with the lowest id above `after`, or NULL. */
static pending *next_by_id(sl_checkpointer *cp, uint64_t after) {
  pending *best = 0;
  for (unsigned s = 0; s <= SL_MAX_CONCURRENT; s++) {
    pending *p = &cp->slots[s];
    if (p->state != CP_FREE && p->id > after && (!best || p->id < best->id))
      best = p;
  }
  return best;
}

/* One pass over the in-flight checkpoints, in id order (note 9).  Returns
 * the nearest deadline. */
static uint64_t advance(sl_checkpointer *cp, uint64_t now) {
  uint64_t next = UINT64_MAX;
  uint64_t after = 0;
  for (pending *p; (p = next_by_id(cp, after));) {
    after = p->id;
    if (p->state == CP_WRITING &&
        atomic_load_explicit(&p->written, memory_order_acquire)) {
      p->state = CP_DONE;
      if (p->write_status == 0) {
        complete_checkpoint(cp, p);
      } else if (p->final) {
        history_finish(cp, p, SL_CHECKPOINT_ABORTED, p->write_cause);
        fail_job(cp, p->write_status == ECANCELED ? SL_ESTOPPED : SL_ECHECKPOINT,
                 p->write_cause);
      } else {
        bool counts = p->write_status != ECANCELED ||
                      atomic_load(&p->abort_requested) == ABORT_TIMEOUT;
        abort_checkpoint(cp, p, p->write_cause, counts);
      }
      continue;
    }
    if (p->state == CP_TRIGGERED) {
      int acked = all_acked(cp, p);
      if (acked > 0) {
        hand_to_writer(cp, p);
      } else if (acked < 0) {
        abort_checkpoint(cp, p, "an instance finished after dropping its "
                         "barrier", false);
        continue;
      }
    }
    if ((p->state == CP_TRIGGERED || p->state == CP_WRITING) && !p->final) {
      if (now >= p->deadline_ns) {
        if (p->state == CP_TRIGGERED)
          abort_checkpoint(cp, p, "timed out before every instance acknowledged", true);
        else { /* a subsumed one stays subsumed (not a failure) */
          int none = ABORT_NONE;
          atomic_compare_exchange_strong(&p->abort_requested, &none,
                                         ABORT_TIMEOUT);
        }
      } else if (p->deadline_ns < next) {
        next = p->deadline_ns;
      }
    }
  }
  return next;
}

/* A checkpoint the writer finished that advance() has not seen yet. */
static bool written_pending(sl_checkpointer *cp) {
  for (unsigned s = 0; s <= SL_MAX_CONCURRENT; s++)
    if (cp->slots[s].state == CP_WRITING &&
        atomic_load_explicit(&cp->slots[s].written, memory_order_acquire))
      return true;
  return false;
}

/* Note 7: every instance is final. */
static void start_final(sl_checkpointer *cp) {
  for (unsigned s = 0; s <= SL_MAX_CONCURRENT; s++) {
    pending *p = &cp->slots[s];
    if (p->state == CP_TRIGGERED)
      abort_checkpoint(cp, p, "subsumed by the final checkpoint", false);
  }
  if (in_flight(cp) > 0)
    return; /* let the writer finish first; called again */
  pending *p = new_pending(cp, true);
  assert(p);
  cp->final_started = true;
  atomic_store(&cp->no_compaction, 1); /* the job is about to end */
  hand_to_writer(cp, p);
}

/* A new checkpoint may start: the job runs, a source still runs (note
 * 3a: finished ones stand in), the final checkpoint has not begun, and
 * fewer than max_concurrent are in flight. */
static bool can_trigger(sl_checkpointer *cp) {
  assert(cp->sources_finished <= cp->source_count);
  return !atomic_load(&cp->job->stopping) && !cp->final_started &&
         cp->sources_finished < cp->source_count &&
         (uint32_t)in_flight(cp) < cp->max_concurrent;
}

static void *coordinator_main(void *arg) {
  sl_checkpointer *cp = arg;
  sl_job *job = cp->job;
  pthread_setname_np(pthread_self(), "sl:coordinator");
  cp->next_trigger_ns = sl_now_ns() + cp->interval_ns;
  while (!atomic_load(&cp->shutdown)) {
    struct cds_wfcq_node *node;
    while ((node = __cds_wfcq_dequeue_blocking(&cp->ack_head, &cp->ack_tail))) {
      (void)atomic_load_explicit(&cp->acks_published, memory_order_acquire);
      take_ack(cp, caa_container_of(node, sl_ack, node));
    }
    uint64_t now = sl_now_ns();
    uint64_t wake_at = advance(cp, now);
    bool stopping = atomic_load(&job->stopping);
    if (!stopping && !cp->final_started &&
        cp->final_count == job->instance_count)
      start_final(cp);
    uint64_t requested = atomic_load(&cp->manual_requested);
    bool manual = requested > atomic_load(&cp->manual_served);
    if (can_trigger(cp) &&
        (manual || (now >= cp->next_trigger_ns &&
                    now >= cp->last_end_ns + cp->min_pause_ns))) {
      trigger(cp);
      /* Serves every request made before it (requested was read first). */
      atomic_store(&cp->manual_served_id, cp->last_id);
      atomic_store(&cp->manual_served, requested);
      update_settled(cp);
      cp->next_trigger_ns = now + cp->interval_ns;
      continue;
    }
    /* Sleep until the next trigger may happen or a deadline passes; with
     * max_concurrent in flight (or the end reached) only an ack, the
     * writer or a deadline can change anything, and they wake us. */
    uint64_t at = UINT64_MAX;
    if (can_trigger(cp)) {
      at = cp->next_trigger_ns;
      if (cp->last_end_ns + cp->min_pause_ns > at)
        at = cp->last_end_ns + cp->min_pause_ns;
    }
    if (wake_at < at)
      at = wake_at;
    if (at == UINT64_MAX) /* nothing timed: wake up now and then anyway */
      at = sl_now_ns() + 100000000u;
    /* Re-check, after announcing the sleep, everything whose producer
     * wakes us (wait.h): acks, the writer's results, a shutdown, a manual
     * trigger.  A wake that came before the announcement is not lost. */
    sl_parker_prepare(&cp->coordinator_parker);
    if (!cds_wfcq_empty(&cp->ack_head, &cp->ack_tail) || written_pending(cp) ||
        atomic_load(&cp->shutdown) ||
        (can_trigger(cp) && /* else a request waits for a free slot */
         atomic_load(&cp->manual_requested) > atomic_load(&cp->manual_served))) {
      sl_parker_cancel(&cp->coordinator_parker);
      continue;
    }
    now = sl_now_ns();
    if (at > now)
      sl_parker_sleep_ns(&cp->coordinator_parker, at - now);
    else
      sl_parker_cancel(&cp->coordinator_parker);
  }
  return 0;
}

SL_EXPORT int sl_job_trigger_checkpoint(sl_job *job, uint64_t *id) {
  if (!job)
    return EINVAL;
  if (!job->config.checkpoint.state_dir)
    return SL_EUSAGE;
  if (job->state != SL_JOB_RUNNING || !job->cp)
    return SL_ENOTSTARTED;
  sl_checkpointer *cp = job->cp;
  uint64_t ticket = atomic_fetch_add(&cp->manual_requested, 1) + 1;
  sl_parker_wake(&cp->coordinator_parker);
  /* Wait (bounded, about 1 s) for a trigger that started after this
   * request, so its id can be returned. */
  for (int i = 0; i < 100000; i++) {
    if (atomic_load(&cp->manual_served) >= ticket) {
      if (id)
        *id = atomic_load(&cp->manual_served_id);
      return 0;
    }
    struct timespec t = {0, 10000};
    nanosleep(&t, 0);
  }
  /* Withdraw the request if no later one came, so it does not fire when a
   * slot frees up (a later caller's request would serve it anyway). */
  uint64_t expected = ticket;
  atomic_compare_exchange_strong(&cp->manual_requested, &expected,
                                 ticket - 1);
  return EBUSY; /* max_concurrent in flight, or the job is ending */
}

/* ----------------------------------------------------------- setup */

/* The text a store remembers its job graph by: every physical operator's
 * id, kind, name and parallelism, and the key-group count. */
char *sl_graph_fingerprint(const sl_job *job) {
  static const char *kinds[] = {"source", "map",     "filter", "flat_map",
                                "process", "sink",   "key_by", "union"};
  size_t cap = 64 + (size_t)job->physical_count * (SL_MAX_NAME + 48);
  char *text = malloc(cap);
  if (!text)
    return 0;
  size_t used = (size_t)snprintf(text, cap, "max_parallelism=%" PRIu32,
                                 job->config.max_parallelism);
  for (int i = 0; i < job->physical_count; i++) {
    const sl_op *op = job->physical[i];
    used += (size_t)snprintf(text + used, cap - used, ";%d:%s:%s:%d", op->id,
                             kinds[op->kind], op->name, op->parallelism);
  }
  return text;
}

/* The store delivers entries in (key group, key) order, so the map's bulk
 * load skips its duplicate probe (cow_map.h). */
static int restore_entry(void *arg, uint16_t key_group, const void *key,
                         uint32_t key_bytes, const void *value,
                         uint32_t value_bytes) {
  return sl_cow_map_load_add(arg, key_group, key, key_bytes, value,
                             value_bytes);
}


/* The message of a failed restore: which state, which instance, why (with
 * the store's own message when the store failed). */
static int restore_failed(sl_job *job, const sl_instance *inst,
                          const char *what, int rc) {
  const char *detail = rc == ENOMEM ? "" : sl_store_error(job->cp->store);
  sl_job_fail(job, rc, "restoring %s of operator '%s' instance %d from "
              "checkpoint %" PRIu64 " in %s failed: %s%s%s",
              what, inst->op->name, inst->index, inst->cp.restored_from,
              job->config.checkpoint.state_dir, sl_strerror(rc),
              detail[0] ? ": " : "", detail);
  return rc;
}

static int restore_keyed(sl_job *job, sl_instance *inst) {
  sl_checkpointer *cp = job->cp;
  uint16_t op = (uint16_t)inst->op->id;
  /* Size the map once, from LMDB's counts (no read): loading into a
   * growing table costs more.  The bound covers every operator and key
   * group; this instance gets its share of key groups, with a margin for
   * uneven groups.  A guess too small only means some rehashing. */
  uint64_t entries = 0;
  int rc = sl_store_entry_bound(cp->store, &entries);
  if (rc == 0) {
    uint64_t groups = (uint64_t)(inst->cp.group_last - inst->cp.group_first) + 1;
    uint64_t share = entries * groups / job->config.max_parallelism;
    rc = sl_cow_map_reserve(inst->cp.keyed, share + share / 4);
  }
  bool read = rc == 0;
  if (read)
    rc = sl_store_read_state(cp->store, op, inst->cp.group_first,
                             inst->cp.group_last, restore_entry,
                             inst->cp.keyed);
  if (read) { /* always ends the bulk load, also after an error */
    int finished = sl_cow_map_load_finish(inst->cp.keyed);
    /* The store's keys are unique: a duplicate means a damaged store. */
    if (rc == 0 && finished)
      rc = finished == EINVAL ? SL_ECORRUPT : finished;
  }
  return rc ? restore_failed(job, inst, "keyed state", rc) : 0;
}

/* The instance's blob: a flag byte (operator state saved or not), then the
 * state (write_instance). */
static int restore_blob(sl_job *job, sl_instance *inst) {
  void *blob = 0;
  uint32_t bytes = 0;
  int rc = sl_store_get_blob(job->cp->store, (uint16_t)inst->op->id,
                             (uint16_t)inst->index, &blob, &bytes);
  if (rc == SL_ENOTFOUND)
    return 0;
  uint8_t flags = rc == 0 && bytes >= 1 ? ((uint8_t *)blob)[0] : 0;
  if (rc == 0 &&
      (bytes < 1 || (flags & ~SL_BLOB_FLAGS) != 0 ||
       ((flags & SL_BLOB_EVENT_TIME) && bytes < 1 + SL_BLOB_EVENT_TIME_BYTES)))
    rc = SL_ECORRUPT;
  if (rc) {
    free(blob);
    return restore_failed(job, inst, "operator state", rc);
  }
  if (flags & SL_BLOB_FINISHED) /* note 11 */
    inst->cp.restored_finished = true;
  if (flags & SL_BLOB_EVENT_TIME) { /* the trailer (write_instance) */
    bytes -= 16;
    memcpy(inst->cp.event_time_restored, (uint8_t *)blob + bytes, 16);
    inst->cp.has_event_time_restored = true;
  }
  if ((flags & 1) == 0) {
    free(blob);
    return 0;
  }
  memmove(blob, (uint8_t *)blob + 1, bytes - 1); /* drop the flag byte */
  inst->cp.blob_restored = blob;
  inst->cp.blob_restored_bytes = bytes - 1;
  inst->cp.has_blob_restored = true;
  return 0;
}

static int restore_instance(sl_job *job, sl_instance *inst) {
  /* Note 11: every instance of a final checkpoint had finished, also in a
   * store older than SL_BLOB_FINISHED. */
  inst->cp.restored_finished = job->cp->restored_final;
  int rc = inst->cp.keyed ? restore_keyed(job, inst) : 0;
  return rc ? rc : restore_blob(job, inst);
}

/* Note 11: whether checkpoint id (being restored) is a final one, from
 * its record (write_once's layout: u32 version, u32 final, ...). */
static int read_restored_final(sl_job *job, uint64_t id) {
  sl_checkpointer *cp = job->cp;
  void *record = 0;
  uint32_t bytes = 0;
  int rc = sl_store_get_checkpoint(cp->store, id, &record, &bytes);
  cp->restored_final = false;
  if (rc == 0) {
    uint32_t head[2] = {0, 0};
    if (bytes >= sizeof head)
      memcpy(head, record, sizeof head);
    bool known = (head[0] == 1 && bytes == 24) ||
                 (head[0] == 2 && bytes == sizeof(cp_record));
    if (!known || head[1] > 1)
      rc = SL_ECORRUPT;
    cp->restored_final = rc == 0 && head[1] == 1;
  }
  free(record);
  if (rc)
    sl_job_set_error(job, "%s: the record of checkpoint %" PRIu64
                     " cannot be read: %s%s%s",
                     job->config.checkpoint.state_dir, id, sl_strerror(rc),
                     rc == SL_ECORRUPT ? "" : ": ",
                     rc == SL_ECORRUPT ? "" : sl_store_error(cp->store));
  return rc;
}

/* Key groups owned by instance k of p: a contiguous range. */
static void group_range(uint32_t groups, int parallelism, int k,
                        uint16_t *first, uint16_t *last) {
  uint32_t lo = UINT32_MAX, hi = 0;
  for (uint32_t g = 0; g < groups; g++)
    if (sl_group_instance(g, groups, parallelism) == k) {
      if (g < lo)
        lo = g;
      hi = g;
    }
  assert(lo <= hi);
  *first = (uint16_t)lo;
  *last = (uint16_t)hi;
}

static int open_store(sl_job *job) {
  sl_checkpointer *cp = job->cp;
  const struct sl_checkpoint_config *c = &job->config.checkpoint;
  char *fingerprint = sl_graph_fingerprint(job);
  if (!fingerprint)
    return ENOMEM;
  /* A savepoint becomes the store first (savepoint.c); its checkpoint is
   * then resumed whatever store_policy says (SL_STORE_FRESH chose to
   * replace what the directory held with it). */
  bool installed = c->from_savepoint != 0;
  int rc = installed ? sl_savepoint_install(job, fingerprint) : 0;
  if (rc) {
    free(fingerprint);
    return rc; /* the message is set */
  }
  sl_store_options options = {.graph_fingerprint = fingerprint,
                              .no_sync = c->no_sync,
                              .initial_map_bytes = c->initial_map_bytes};
  char err[SL_ERROR_BYTES];
  err[0] = 0;
  rc = sl_store_open(c->state_dir, &options, &cp->store, err, sizeof err);
  free(fingerprint);
  if (rc) {
    sl_job_set_error(job, "state directory: %s", err[0] ? err : sl_strerror(rc));
    return rc;
  }
  sl_store_set_cancel(cp->store, &cp->compaction_cancel);
  if (job->faults)
    sl_store_set_fault(cp->store, sl_inject_store_call, job);
  uint64_t latest = sl_store_latest(cp->store);
  if (latest == 0)
    return 0;
  if (c->store_policy == SL_STORE_FRESH && !installed) {
    rc = sl_store_wipe(cp->store);
    if (rc)
      sl_job_set_error(job, "%s: cannot start fresh: %s", c->state_dir,
                       sl_strerror(rc));
    return rc;
  }
  if (c->store_policy != SL_STORE_RESUME && !installed) {
    sl_job_set_error(job,
                     "%s holds checkpoints (the newest complete one is %" PRIu64
                     "); ask to resume from it or to start fresh (which "
                     "deletes them)",
                     c->state_dir, latest);
    return SL_EHASSTATE;
  }
  sl_log(SL_LOG_INFO, "sluice: resuming from checkpoint %" PRIu64 " in %s",
         latest, c->state_dir);
  cp->restored_from = latest;
  cp->last_id = latest;
  atomic_store(&job->cp_completed_id, latest);
  atomic_store(&job->cp_settled_id, latest);
  return 0;
}

static int alloc_checkpointer(sl_job *job) {
  sl_checkpointer *cp = calloc(1, sizeof *cp);
  if (!cp)
    return ENOMEM;
  job->cp = cp;
  cp->job = job;
  const struct sl_checkpoint_config *c = &job->config.checkpoint;
  cp->interval_ns = (uint64_t)(c->interval_ms ? c->interval_ms : SL_DEFAULT_INTERVAL_MS) * 1000000u;
  cp->timeout_ns = (uint64_t)(c->timeout_ms ? c->timeout_ms : SL_DEFAULT_TIMEOUT_MS) * 1000000u;
  cp->min_pause_ns = (uint64_t)c->min_pause_ms * 1000000u;
  cp->max_concurrent = c->max_concurrent ? c->max_concurrent : 1;
  cp->tolerable_failures = c->tolerable_failures;
  sl_parker_init(&cp->coordinator_parker);
  sl_parker_init(&cp->writer_parker);
  __cds_wfcq_init(&cp->ack_head, &cp->ack_tail);
  pthread_mutex_init(&cp->write_lock, 0);
  pthread_mutex_init(&cp->history_lock, 0);
  size_t n = (size_t)job->instance_count;
  for (int i = 0; i < job->instance_count; i++)
    cp->source_count += job->instances[i]->op->kind == SL_OP_SOURCE;
  cp->final_acks = calloc(n, sizeof *cp->final_acks);
  cp->durable_epoch = calloc(n, sizeof *cp->durable_epoch);
  cp->durable_row_seq = calloc(n, sizeof *cp->durable_row_seq);
  if (!cp->final_acks || !cp->durable_epoch || !cp->durable_row_seq)
    return ENOMEM;
  for (unsigned s = 0; s <= SL_MAX_CONCURRENT; s++) {
    pending *p = &cp->slots[s];
    p->acks = calloc(n, sizeof *p->acks);
    p->async_us = calloc(n, sizeof(uint64_t));
    p->bytes = calloc(n, sizeof(uint64_t));
    p->entries = calloc(n, sizeof(uint64_t));
    if (!p->acks || !p->async_us || !p->bytes || !p->entries)
      return ENOMEM;
  }
  for (int h = 0; h < SL_CHECKPOINT_HISTORY; h++) {
    cp->history_instances[h] = calloc(n, sizeof(sl_checkpoint_instance_stats));
    if (!cp->history_instances[h])
      return ENOMEM;
  }
  return 0;
}

/* Keyed-state maps for instances whose every input is key-partitioned. */
static int setup_instances(sl_job *job) {
  for (int i = 0; i < job->instance_count; i++) {
    sl_instance *inst = job->instances[i];
    bool keyed = inst->channel_count > 0 &&
                 (inst->op->kind == SL_OP_PROCESS || inst->op->kind == SL_OP_SINK);
    for (int c = 0; c < inst->channel_count; c++)
      keyed = keyed && inst->channels[c].key;
    inst->cp.keyed_input = keyed;
    if (!keyed)
      continue;
    int rc = sl_cow_map_create(&inst->cp.keyed);
    if (rc)
      return rc;
    group_range(job->config.max_parallelism, inst->op->parallelism,
                inst->index, &inst->cp.group_first, &inst->cp.group_last);
  }
  return 0;
}

/* A restart (failover.c): the store stays open and is our own, so the
 * newest complete checkpoint in it is restored whatever store_policy says.
 * Ids go on from the highest ever triggered: every id at or below it is now
 * complete or aborted. */
static int reopen_for_restart(sl_job *job) {
  sl_checkpointer *cp = job->cp;
  uint64_t latest = sl_store_latest(cp->store);
  cp->restored_from = latest;
  if (latest > cp->last_id)
    cp->last_id = latest;
  atomic_store(&job->cp_completed_id, latest);
  atomic_store(&job->cp_settled_id, cp->last_id);
  atomic_store(&job->cp_final_done, 0);
  return 0;
}

/* After sl_checkpointer_stop(), before a restart: every checkpoint in
 * flight is given up (the one being written was finished by the writer
 * before it stopped: it is durable or not), and everything the attempt
 * left behind is cleared.  The store, the history and the id counter
 * stay. */
void sl_checkpointer_reset(sl_job *job) {
  sl_checkpointer *cp = job->cp;
  if (!cp)
    return;
  assert(!cp->coordinator_started && !cp->writer_started);
  uint64_t latest = sl_store_latest(cp->store);
  for (unsigned s = 0; s <= SL_MAX_CONCURRENT; s++) {
    pending *p = &cp->slots[s];
    if (p->state == CP_FREE)
      continue;
    if (p->id <= latest && p->state != CP_TRIGGERED)
      history_finish(cp, p, SL_CHECKPOINT_COMPLETED, 0);
    else
      history_finish(cp, p, SL_CHECKPOINT_ABORTED, "the job failed");
    pending_clear(cp, p);
  }
  cp->write_queue_count = 0;
  for (int i = 0; i < job->instance_count; i++) {
    sl_ack_free(cp->final_acks[i]);
    cp->final_acks[i] = 0;
    cp->durable_epoch[i] = 0; /* the maps are made anew */
    cp->durable_row_seq[i] = 0; /* and the row batches (note 10) */
  }
  cp->final_count = 0;
  cp->final_started = false;
  cp->sources_finished = 0;
  cp->consecutive_failures = 0;
  cp->last_end_ns = 0;
  atomic_store(&cp->shutdown, 0);
  atomic_store(&cp->compaction_cancel, 0);
  atomic_store(&cp->no_compaction, 0);
  /* The parkers are left as they are: a waker (sl_job_trigger_checkpoint)
   * may touch them at any time, and a stale wake only makes the first
   * sleep return at once. */
}

/* Called by sl_job_start after compiling, before any thread starts, and by
 * a restart after sl_checkpointer_reset(): keyed state maps for every
 * keyed instance, and with checkpointing on, the store opened (refused if
 * foreign or holding checkpoints without a choice) and the newest complete
 * checkpoint restored. */
int sl_checkpointer_setup(sl_job *job) {
  int rc = setup_instances(job);
  if (rc || !job->config.checkpoint.state_dir)
    return rc;
  if (job->cp) {
    assert(job->restarting);
    rc = reopen_for_restart(job);
  } else {
    rc = alloc_checkpointer(job);
    if (rc == 0)
      rc = open_store(job);
  }
  /* Each instance restores its own state on its thread, in parallel
   * (sl_checkpointer_restore_instance). */
  uint64_t from = rc == 0 ? atomic_load(&job->cp->restored_from) : 0;
  if (rc == 0)
    job->cp->restored_final = false;
  if (from)
    rc = read_restored_final(job, from);
  for (int i = 0; i < job->instance_count && rc == 0; i++)
    job->instances[i]->cp.restored_from = from;
  atomic_store(&job->restores_pending, from ? job->instance_count : 0);
  return rc;
}

/* On the instance's thread, after open and before its restore hook: its
 * keyed state and operator state from the checkpoint being restored.  A
 * failure fails the job with the store's status and message. */
int sl_checkpointer_restore_instance(sl_instance *inst) {
  sl_job *job = inst->job;
  if (!inst->cp.restored_from || !job->cp)
    return 0;
  /* DESIGN.md invariant 6: every instance restores the same checkpoint,
   * the newest complete one. */
  assert(inst->cp.restored_from == atomic_load(&job->cp->restored_from));
  assert(inst->cp.restored_from == sl_store_latest(job->cp->store));
  int rc = restore_instance(job, inst);
  sl_checkpointer_restore_skip(inst);
  return rc;
}

/* The instance is done with restoring (or will not restore: its open
 * failed), so the count of instances still restoring goes down. */
void sl_checkpointer_restore_skip(sl_instance *inst) {
  sl_job *job = inst->job;
  if (!inst->cp.restored_from || !job->cp)
    return;
  if (atomic_fetch_sub(&job->restores_pending, 1) == 1)
    atomic_store(&job->restored_ns, sl_now_ns());
}

int sl_checkpointer_start(sl_job *job) {
  sl_checkpointer *cp = job->cp;
  if (!cp)
    return 0;
  int rc = pthread_create(&cp->writer, 0, writer_main, cp);
  if (rc)
    return rc;
  cp->writer_started = true;
  rc = pthread_create(&cp->coordinator, 0, coordinator_main, cp);
  if (rc)
    return rc;
  cp->coordinator_started = true;
  return 0;
}

void sl_checkpointer_stop(sl_job *job) {
  sl_checkpointer *cp = job->cp;
  if (!cp)
    return;
  atomic_store(&cp->shutdown, 1);
  atomic_store(&cp->compaction_cancel, 1);
  sl_parker_wake(&cp->coordinator_parker);
  sl_parker_wake(&cp->writer_parker);
  if (cp->coordinator_started)
    pthread_join(cp->coordinator, 0);
  if (cp->writer_started)
    pthread_join(cp->writer, 0);
  cp->coordinator_started = cp->writer_started = false;
  /* Acks still queued (e.g. after a stop) are freed. */
  struct cds_wfcq_node *node;
  while ((node = __cds_wfcq_dequeue_blocking(&cp->ack_head, &cp->ack_tail)))
    sl_ack_free(caa_container_of(node, sl_ack, node));
}

void sl_checkpointer_free(sl_job *job) {
  sl_checkpointer *cp = job->cp;
  if (!cp)
    return;
  sl_checkpointer_stop(job);
  for (unsigned s = 0; s <= SL_MAX_CONCURRENT; s++) {
    pending *p = &cp->slots[s];
    if (p->acks)
      pending_clear(cp, p);
    free(p->acks);
    free(p->async_us);
    free(p->bytes);
    free(p->entries);
  }
  for (int i = 0; cp->final_acks && i < job->instance_count; i++)
    sl_ack_free(cp->final_acks[i]);
  free(cp->final_acks);
  free(cp->durable_epoch);
  free(cp->durable_row_seq);
  free(cp->sort_a);
  free(cp->sort_b);
  free(cp->row_order);
  for (int h = 0; h < SL_CHECKPOINT_HISTORY; h++)
    free(cp->history_instances[h]);
  sl_store_close(cp->store);
  pthread_mutex_destroy(&cp->write_lock);
  pthread_mutex_destroy(&cp->history_lock);
  free(cp);
  job->cp = 0;
}
