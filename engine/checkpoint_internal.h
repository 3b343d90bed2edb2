/* checkpoint_internal.h — what the four files of the checkpointer share:
 * the coordinator (coordinator.c), the writer (checkpoint_writer.c),
 * restoring (restore.c) and the statistics (checkpoint_stats.c).  Private
 * to those four; the rest of the engine sees checkpoint.h only.
 *
 * Who touches what (coordinator.c notes 1, 2; checkpoint_writer.c note 4):
 * the slots and the final acks are the coordinator thread's; the writer
 * reads a slot only between hand_to_writer and its release of `written`,
 * and owns the durable_* arrays and its sort buffers; the history is under
 * history_lock; setup, restore and reset run while neither thread does. */
#ifndef SL_CHECKPOINT_INTERNAL_H
#define SL_CHECKPOINT_INTERNAL_H

#include "internal.h"

#define SL_DEFAULT_INTERVAL_MS 1000u
#define SL_DEFAULT_TIMEOUT_MS 60000u
#define SL_MAX_CONCURRENT 16u
/* ring.h note 9: a slot is reused only after its id settled. */
_Static_assert(SL_RING_ANNOUNCE_SLOTS == SL_MAX_CONCURRENT + 1,
               "one announcement slot per checkpoint in flight, plus one");
_Static_assert(SL_CAPTURES_MAX >= SL_MAX_CONCURRENT,
               "an instance can capture every checkpoint in flight");
/* Writes of one transaction retried after MDB_MAP_FULL: each retry doubles
 * the map, so 24 doublings of 64 MiB exceed any disk. */
#define SL_MAP_FULL_RETRIES 24
/* Entries the writer puts between two looks at an abort request. */
#define SL_WRITER_ABORT_CHECK 4096u
/* The writer's radix sort: at most this many bits a pass (2048 counters,
 * 16 KiB, stay in the L1 cache's reach), so 64-bit keys take at most 6
 * passes. */
#define SL_RADIX_BITS 11
#define SL_RADIX_PASSES 6
_Static_assert(SL_RADIX_BITS * SL_RADIX_PASSES >= 64,
               "the passes cover a whole record key");

/* The state of one checkpoint slot (coordinator.c draws the machine and
 * checks it: pending_check, cp_set_state). */
enum cp_state { CP_FREE, CP_TRIGGERED, CP_WRITING, CP_DONE };
#define CP_STATE_COUNT 4

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
  uint64_t *last_answered; /* by instance: the newest checkpoint id it
                              answered in this attempt (coordinator.c
                              note 15 relies on their order) */
  int final_count;
  bool final_started;
  uint64_t last_id;
  uint64_t next_trigger_ns;
  uint64_t last_end_ns;
  uint32_t consecutive_failures;
  int sources_finished; /* source instances with a final ack
                           (coordinator.c note 4) */
  int source_count;     /* source instances */
  /* sl_job_trigger_checkpoint: requests are numbered; the coordinator
   * serves all requests up to manual_served with one trigger, whose id it
   * stores first in manual_served_id. */
  _Atomic uint64_t manual_requested;
  _Atomic uint64_t manual_served;
  _Atomic uint64_t manual_served_id;
  /* Savepoints waiting for an aligned checkpoint (coordinator.c note
   * 13): while nonzero, every barrier is taken aligned. */
  _Atomic int aligned_holds;

  /* Writer-only: per instance, the newest cow-map epoch and the newest
   * row batch seq durably written
   * (checkpoint_writer.c note 3); the sort buffers of
   * collect_sorted. */
  uint32_t *durable_epoch;
  uint64_t *durable_row_seq;
  uint32_t compaction_deferrals; /* cancelled in a row */
  uint64_t compactions; /* store compactions done, and their time */
  uint64_t compaction_us;
  /* radix_sort (checkpoint_writer.c): one row of counters a pass */
  size_t radix_counts[SL_RADIX_PASSES << SL_RADIX_BITS];
  /* Set by the coordinator when it hands the writer a checkpoint (and at
   * shutdown): a running compaction gives way (store.h, set_cancel). */
  _Atomic int compaction_cancel;
  _Atomic int no_compaction; /* the final checkpoint has begun */
  struct sorted_entry *sort_a;
  struct sorted_entry *sort_b;
  uint64_t sort_capacity;     /* entries sort_a holds */
  uint64_t sort_tmp_capacity; /* entries sort_b holds: a key group's */
  /* Set for good once an entry's address needed more than 48 bits: sort
   * entries then carry no key group (checkpoint_writer.c, sorted_entry). */
  bool sort_untagged;
  size_t *group_ends; /* collect_sorted: 2 x max_parallelism counters */
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
  bool restored_final; /* restored_from is a final checkpoint
                        (coordinator.c note 10) */
};

/* The record of a checkpoint: a small fixed layout, little-endian.
 * Version 2 added the two totals at the end (version 1 records are 24
 * bytes); version 3, written only for an unaligned checkpoint (so a store
 * of aligned ones stays readable by older builds), adds whether it was
 * unaligned and its bytes of channel state (snapshot.c note 12).
 * engine/inspect.c reads all three, restore.c the first two fields. */
typedef struct cp_record {
  uint32_t version;     /* 2, or 3 for an unaligned checkpoint */
  uint32_t final;       /* the end-of-input checkpoint */
  int64_t trigger_time_ms;
  uint64_t instance_count;
  uint64_t bytes_persisted;   /* what this transaction wrote, as in */
  uint64_t entries_persisted; /* sl_checkpoint_stats */
  uint32_t unaligned;         /* version 3: 1 */
  uint32_t reserved;          /* version 3: 0 */
  uint64_t channel_bytes;     /* version 3: channel state written */
} cp_record;
#define SL_CP_RECORD_V2_BYTES 40u
_Static_assert(sizeof(cp_record) == 56, "the record's layout has no padding");

/* coordinator.c: the checkpointer's memory, its threads not started. */
int sl_checkpointer_alloc(sl_job *job);

/* checkpoint_writer.c: the writer thread (pthread entry). */
void *sl_checkpoint_writer_main(void *arg);

/* checkpoint_stats.c: a history entry for a new checkpoint (its slot in
 * the history ring), and its end (status completed or aborted). */
int sl_checkpoint_history_add(sl_checkpointer *cp, uint64_t id, bool final);
void sl_checkpoint_history_finish(sl_checkpointer *cp, pending *p, int status,
                                  const char *cause);
void sl_checkpoint_history_finish_open(sl_checkpointer *cp, pending *p,
                                       int status, const char *cause);

#endif /* SL_CHECKPOINT_INTERNAL_H */
