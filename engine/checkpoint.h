/* checkpoint.h — internal interface of checkpointing: the instance side
 * (barriers, alignment, snapshots: snapshot.c), the coordinator and the
 * asynchronous writer (coordinator.c).  See coordinator.c for the design
 * notes and the state diagram of a checkpoint. */
#ifndef SL_CHECKPOINT_H
#define SL_CHECKPOINT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <urcu/wfcqueue.h> /* liburcu-cds: the wait-free MPSC ack queue */

#include "cow_map.h"
#include "store.h"

struct sl_job;
struct sl_ctx;
struct sl_channel;
typedef struct sl_checkpointer sl_checkpointer;

/* Checkpoint statistics kept per job. */
#define SL_CHECKPOINT_HISTORY 64
/* Checkpoint id -> cow-map epoch pairs an instance remembers (note 9). */
#define SL_EPOCH_SLOTS 32

/* One instance's snapshot for one checkpoint, handed to the coordinator
 * through the wait-free queue (an MPSC hand-off: every instance enqueues,
 * only the coordinator dequeues). */
typedef struct sl_ack {
  struct cds_wfcq_node node;
  struct sl_ctx *inst;
  uint64_t checkpoint_id; /* 0 for the final snapshot */
  bool final;             /* taken at the end of input */
  uint64_t max_seen_id;   /* final: the highest barrier (or trigger) the
                             instance ever received, snapshotted or not */
  int status;             /* nonzero: the snapshot failed; cause below */
  char cause[160];
  /* Keyed state: the frozen, not yet released deltas, oldest first; in
   * inline_deltas unless there are more (then malloc'd). */
  sl_cow_delta *deltas;
  int delta_count;
  sl_cow_delta inline_deltas[4];
  /* Operator state (source position, sink transactions), or none. */
  void *blob;
  uint32_t blob_bytes;
  bool has_blob;
  /* Statistics.  barrier_ns: when the first barrier reached the instance
   * (a source: when it saw the trigger); the coordinator turns it into
   * start_delay_us. */
  uint64_t barrier_ns;
  uint64_t start_delay_us;
  uint64_t alignment_us;
  uint64_t sync_us;
} sl_ack;

/* Instance-side bookkeeping, embedded in sl_ctx. */
typedef struct sl_instance_checkpoint {
  sl_cow_map *keyed; /* keyed state, NULL if the operator has none */
  bool keyed_input;  /* every channel is key-partitioned */
  uint64_t current_key;
  bool key_valid;
  const struct sl_record *key_record; /* record current_key belongs to */
  uint16_t group_first, group_last;   /* key groups this instance owns */

  /* Alignment (snapshot.c note 3). */
  uint64_t aligning_id;   /* barrier being aligned, 0 if none */
  int barriers_seen;      /* channels that delivered aligning_id */
  uint64_t align_start_ns;
  uint64_t last_snapshot_id; /* newest checkpoint snapshotted */
  uint64_t max_seen_id;      /* newest barrier or trigger received, also
                                those dropped (coordinator.c note 3) */
  _Atomic uint64_t trigger_id; /* sources: newest id triggered */

  /* Notifications already acted on. */
  uint64_t seen_completed;
  uint64_t seen_settled;
  bool maintain_pending; /* the cow map has reclaiming left to do */
  bool final_acked;      /* the final snapshot was handed over */

  /* Checkpoint id -> epoch frozen for it, oldest first (note 9). */
  struct {
    uint64_t id;
    uint32_t epoch;
  } epochs[SL_EPOCH_SLOTS];
  int epoch_count;

  /* Operator state: being saved (inside a snapshot hook) and restored. */
  bool in_snapshot;
  void *blob_new;
  uint32_t blob_new_bytes;
  bool has_blob_new;
  void *blob_restored;
  uint32_t blob_restored_bytes;
  bool has_blob_restored;
  uint64_t restored_from; /* checkpoint restored, 0 if none */

  sl_ack *next_ack; /* allocated ahead, outside the synchronous part */
  void *key_buffer; /* state key being built (state.c) */
  uint32_t key_buffer_bytes;
  void *value_buffer; /* list and fold updates (state.c) */
  uint32_t value_buffer_bytes;
} sl_instance_checkpoint;

/* coordinator.c */
int sl_checkpointer_setup(struct sl_job *job);   /* before threads start */
int sl_checkpointer_start(struct sl_job *job);   /* coordinator + writer */
void sl_checkpointer_stop(struct sl_job *job);   /* join them */
void sl_checkpointer_reset(struct sl_job *job);  /* failover: after stop */
int sl_checkpointer_restore_instance(struct sl_ctx *inst); /* its thread */
void sl_checkpointer_restore_skip(struct sl_ctx *inst); /* open failed */
void sl_checkpointer_free(struct sl_job *job);
void sl_checkpointer_ack(struct sl_job *job, sl_ack *ack);
void sl_checkpointer_wake(struct sl_job *job);

/* snapshot.c (called from runtime.c on the instance's thread) */
int sl_snapshot_barrier(struct sl_ctx *inst, struct sl_channel *ch,
                        uint64_t id, bool *block);
int sl_snapshot_channel_ended(struct sl_ctx *inst);
int sl_snapshot_source_poll(struct sl_ctx *inst);
int sl_snapshot_final(struct sl_ctx *inst);
int sl_snapshot_notifications(struct sl_ctx *inst);
bool sl_snapshot_notification_pending(const struct sl_ctx *inst);
bool sl_snapshot_wait_final(struct sl_ctx *inst);
int sl_snapshot_restore_hook(struct sl_ctx *inst);
void sl_snapshot_instance_free(struct sl_ctx *inst);
void sl_ack_free(sl_ack *ack);

#endif /* SL_CHECKPOINT_H */
