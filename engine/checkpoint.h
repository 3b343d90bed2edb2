/* checkpoint.h — internal interface of checkpointing: the instance side
 * (barriers, alignment, snapshots: snapshot.c), the coordinator
 * (coordinator.c), the asynchronous writer (checkpoint_writer.c),
 * restoring (restore.c) and the statistics (checkpoint_stats.c).  See
 * coordinator.c for the design notes and the state diagram of a
 * checkpoint; what those four share privately is in
 * checkpoint_internal.h. */
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
/* Row batches an instance may hold that no completed checkpoint has
 * written yet (snapshot.c note 10): one per snapshot, so this many
 * snapshots in a row without a completion. */
#define SL_ROW_BATCHES_MAX 1024

/* Unaligned checkpoints an instance captures channel state for at once
 * (snapshot.c note 12): SL_MAX_CONCURRENT, with room for ids that were
 * aborted but not yet seen settled. */
#define SL_CAPTURES_MAX 32

/* Channel state of one input channel for one checkpoint (snapshot.c
 * note 12), or the channel state restored for one channel (note 13):
 * entries in ring format (ring.h notes 4-6), RECORDS, WATERMARK and IDLE
 * only, 8-byte aligned (malloc'd). */
typedef struct sl_channel_state {
  uint8_t *data;
  uint64_t bytes;
  uint64_t capacity;
  bool done; /* capture: this channel's part is complete */
} sl_channel_state;

/* One unaligned checkpoint being captured (snapshot.c note 12). */
typedef struct sl_capture {
  uint64_t id;
  struct sl_ack *ack;          /* taken at the snapshot, not yet enqueued */
  sl_channel_state *channels;  /* channel_count, by channel index */
  int channels_done;
  int status; /* nonzero: capturing failed (ENOMEM); the ack says so */
} sl_capture;

/* Table rows (operators/table_sink.c; snapshot.c note 10,
 * checkpoint_writer.c note 3).  One row: key_bytes of key, then value_bytes of value (none
 * for a tombstone) at arena + offset. */
typedef struct sl_row {
  uint64_t offset;
  uint32_t key_bytes;
  uint32_t value_bytes;
  bool tombstone;
} sl_row;

/* The rows a table sink instance received between two snapshots, one per
 * key (the last write): built by the sink, handed to the engine in its
 * snapshot hook (sl_snapshot_add_rows), immutable from then on, applied
 * by the writer inside a checkpoint's transaction, freed by the instance
 * once a completed checkpoint has written it. */
typedef struct sl_row_batch {
  struct sl_row_batch *next; /* the instance's list, oldest first */
  uint64_t seq;              /* 1, 2, ... per instance life (the engine's) */
  uint64_t checkpoint_id;    /* the snapshot that took it; UINT64_MAX: the
                                final one (the engine's) */
  char table[SL_STORE_TABLE_NAME_MAX + 1];
  sl_row *rows; /* malloc'd, freed with the batch */
  uint64_t row_count;
  uint8_t *arena; /* malloc'd, freed with the batch */
  uint64_t arena_bytes;
} sl_row_batch;

/* A batch as an ack carries it.  The seq is a copy: the writer compares
 * it with what is durable before it touches the batch, which the
 * instance may have freed once a checkpoint wrote it. */
typedef struct sl_ack_batch {
  uint64_t seq;
  const sl_row_batch *batch;
} sl_ack_batch;

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
  /* Table rows: the instance's batches not yet freed, oldest first; in
   * inline_batches unless there are more (then malloc'd).  Not owned. */
  sl_ack_batch *batches;
  int batch_count;
  sl_ack_batch inline_batches[2];
  /* Event time (timer.c): the instance's watermark and the largest
   * timestamp it emitted, stored after the blob (flag bit 1). */
  bool has_event_time;
  int64_t event_time[2];
  /* Unaligned (snapshot.c note 12): the instance took this snapshot as
   * an unaligned one; channel_state is its serialized channel state
   * (checkpoint_writer.c note 6; malloc'd, owned), NULL when empty. */
  bool unaligned;
  uint8_t *channel_state;
  uint64_t channel_state_bytes;
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
  /* The (state id, kind) of the instance's last keyed-state call without
   * a user key (state.c), the guess runtime.c prefetches a slice's
   * entries with (runtime.c note 13); hint_kind 0: no such call yet. */
  uint16_t hint_id;
  uint8_t hint_kind;
  /* The map hash of (memo_key, memo_id, memo_kind), computed for the
   * prefetch and reused by the state call it guessed (state.c); always
   * that hash while memo_kind is not 0. */
  uint16_t memo_id;
  uint8_t memo_kind;
  uint64_t memo_key;
  uint64_t memo_hash;
  /* Slices whose chains' second entries were fetched too (runtime.c note
   * 13, sl_state_prefetch_stages); for sl_testing_state_chain_prefetches. */
  uint64_t chain_prefetches;
  /* Byte-string keys (state.c): every keyed channel is byte-keyed; then
   * current_key is the hash of the key_data_bytes bytes at key_data (a
   * copy owned by the instance, or a timer's), valid with key_valid. */
  bool byte_keys;
  const uint8_t *key_data;
  uint32_t key_data_bytes;
  uint8_t *key_copy; /* owned: the current record's key bytes */
  uint32_t key_copy_capacity;
  uint8_t key_be[8]; /* sl_ctx_key_bytes of a 64-bit key */
  uint16_t group_first, group_last;   /* key groups this instance owns */

  /* Alignment (snapshot.c note 3). */
  uint64_t aligning_id;   /* barrier being aligned, 0 if none */
  int barriers_seen;      /* channels that delivered aligning_id */
  uint64_t align_start_ns;
  uint64_t last_snapshot_id; /* newest checkpoint snapshotted */
  uint64_t max_seen_id;      /* newest barrier or trigger received, also
                                those dropped (coordinator.c note 3) */
  _Atomic uint64_t trigger_id; /* sources: newest id triggered */

  /* Unaligned checkpoints (snapshot.c notes 12, 13).  announce_seq is
   * bumped by the producers of the input rings when they announce
   * (ring.h note 9); announce_seen is what the instance acted on.
   * captures: the checkpoints being captured, oldest first.  replay:
   * restored channel state, by channel (NULL: none), replayed before the
   * rings are read. */
  _Atomic uint64_t announce_seq;
  uint64_t announce_seen;
  sl_capture captures[SL_CAPTURES_MAX];
  int capture_count;
  sl_channel_state *replay;
  bool replaying; /* replay_channel_state runs: no mid-entry action */
  /* Mid-entry (snapshot.c note 12): while sl_snapshot_between_records
   * runs, the RECORDS entry being processed on partial_channel (at that
   * ring's read position) and the index of its next record. */
  struct sl_channel *partial_channel;
  const void *partial_entry;
  uint32_t partial_next;

  /* Notifications already acted on. */
  uint64_t seen_completed;
  uint64_t seen_settled;
  bool maintain_pending; /* the cow map has reclaiming left to do */
  bool final_acked;      /* the final snapshot was handed over */
  /* The checkpoint restored says this instance had finished (its blob
   * carries SL_BLOB_FINISHED, or the checkpoint is a final one): it is
   * never finished again (coordinator.c note 10). */
  bool restored_finished;

  /* In-process rollback (failover.c note 7): the map's stable epoch holds
   * the state of checkpoint stable_id (0: the empty state of a job that
   * restored nothing), valid when stable_known; keyed_rolled_back: this
   * attempt's map was rolled back in memory, not reloaded. */
  uint64_t stable_id;
  bool stable_known;
  bool keyed_rolled_back;

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
  bool has_event_time_restored; /* the watermark state in the blob */
  int64_t event_time_restored[2];

  /* Table rows (snapshot.c note 10): batches handed over by the snapshot
   * hook and not yet written by a completed checkpoint, oldest first;
   * row_seq: the seq of the newest; row_tag: the checkpoint id the hook
   * that is running tags its batches with. */
  sl_row_batch *rows_head;
  sl_row_batch *rows_tail;
  int row_batch_count;
  uint64_t row_seq;
  uint64_t row_tag;

  sl_ack *next_ack; /* allocated ahead, outside the synchronous part */
  sl_ack *held_ack; /* snapshot.c note 14: waits for the map's copy pass */
  uint64_t held_step_ns; /* when the pass last took a step (or began) */
  void *key_buffer; /* state key being built (state.c) */
  uint32_t key_buffer_bytes;
  void *value_buffer; /* list and fold updates (state.c) */
  uint32_t value_buffer_bytes;
} sl_instance_checkpoint;

/* restore.c */
int sl_checkpointer_setup(struct sl_job *job);   /* before threads start */
int sl_checkpointer_restore_instance(struct sl_ctx *inst); /* its thread */
/* restore.c note 4: a blob's channel section into inst->cp.replay. */
int sl_restore_channel_state(struct sl_ctx *inst, const uint8_t *section,
                             uint64_t bytes);
void sl_checkpointer_restore_skip(struct sl_ctx *inst); /* open failed */
/* coordinator.c */
int sl_checkpointer_start(struct sl_job *job);   /* coordinator + writer */
void sl_checkpointer_stop(struct sl_job *job);   /* join them */
void sl_checkpointer_reset(struct sl_job *job);  /* failover: after stop */
void sl_checkpointer_free(struct sl_job *job);
void sl_checkpointer_ack(struct sl_job *job, sl_ack *ack);
void sl_checkpointer_wake(struct sl_job *job);
/* The job's open store (table reads), or NULL: no checkpointing, or not
 * started.  Valid until sl_job_destroy. */
sl_store *sl_checkpointer_store(const struct sl_job *job);
/* Note 13 of coordinator.c: a savepoint holds (hold true) and lets go
 * (false) of "every barrier aligned"; holds nest.  Checkpointing is on.
 * Any thread. */
void sl_checkpointer_hold_aligned(struct sl_job *job, bool hold);
/* Some hold is on (false without checkpointing).  Any thread. */
bool sl_checkpointer_aligned_held(const struct sl_job *job);

/* graph.c: the fingerprint a job's store carries (every physical operator's id,
 * kind, name and parallelism, and max_parallelism), malloc'd; NULL: no
 * memory.  The job is compiled. */
char *sl_graph_fingerprint(const struct sl_job *job);

/* savepoint.c: make the savepoint of config.checkpoint.from_savepoint the
 * store of state_dir, rescaled to this job, before the store is opened
 * (it then holds the savepoint's checkpoint under fingerprint).  0, or
 * the status with the job's message set; the state directory is then as
 * it was. */
int sl_savepoint_install(struct sl_job *job, const char *fingerprint);
/* savepoint.c: 0 if dir does not exist or is an empty directory (a
 * savepoint may go there); else EEXIST (not empty), ENOTDIR or an errno
 * value, with a message naming dir in err (may be NULL).  Creates
 * nothing: stop.c checks before it stops anything. */
int sl_savepoint_dir_check(const char *dir, char *err, size_t err_bytes);
/* savepoint.c: sl_job_savepoint's copy of the newest complete
 * checkpoint (savepoint.c note 1), without the aligned checkpoint it
 * takes first in a job with unaligned checkpoints (note 6): a stop's own
 * checkpoint is aligned already.  Errors as sl_job_savepoint's. */
int sl_savepoint_copy(struct sl_job *job, const char *dir,
                      uint64_t *checkpoint_id, char *err, size_t err_bytes);
/* stop.c: request a checkpoint (retried while max_concurrent are in
 * flight) and wait until it settles (stop.c notes 2, 7).  0 once it
 * completed, *id its id; else a status and a message in err beginning
 * with what ("stop with a savepoint", "savepoint DIR"): EBUSY (none could
 * start), SL_ECHECKPOINT (it aborted, or did not settle in time), or,
 * if the job ended meanwhile, SL_ESTOPPED or its failure status. */
int sl_checkpoint_request_settled(struct sl_job *job, const char *what,
                                  uint64_t *id, char *err, size_t err_bytes);
/* A message into err (NULL or err_bytes 0: none); returns rc (savepoint.c,
 * used by the savepoint and stop calls). */
__attribute__((format(printf, 4, 5))) int
sl_say_err(char *err, size_t err_bytes, int rc, const char *format, ...);

/* The blob of an instance (checkpoint_writer.c write_instance): a flag byte,
 * the channel state if flag SL_BLOB_CHANNELS (a u64 of its bytes, then
 * the section of checkpoint_writer.c note 6), the operator state if flag
 * SL_BLOB_STATE, then the event-time trailer
 * (watermark, largest timestamp: two int64, native order) if flag
 * SL_BLOB_EVENT_TIME.  SL_BLOB_FINISHED: the blob is the instance's final
 * snapshot, taken after its end of input (coordinator.c note 10).  Stores
 * written before that flag existed have none; their final checkpoints are
 * recognised by the checkpoint record's "final" field. */
#define SL_BLOB_STATE 1u
#define SL_BLOB_EVENT_TIME 2u
#define SL_BLOB_FINISHED 4u
#define SL_BLOB_CHANNELS 8u /* unaligned: channel state (snapshot.c 12) */
#define SL_BLOB_FLAGS                                                          \
  (SL_BLOB_STATE | SL_BLOB_EVENT_TIME | SL_BLOB_FINISHED | SL_BLOB_CHANNELS)
#define SL_BLOB_EVENT_TIME_BYTES 16u

/* snapshot.c (called from runtime.c on the instance's thread) */
int sl_snapshot_barrier(struct sl_ctx *inst, struct sl_channel *ch,
                        uint64_t id, bool *block);
int sl_snapshot_channel_ended(struct sl_ctx *inst, struct sl_channel *ch);
/* Unaligned checkpoints (snapshot.c notes 12, 13). */
int sl_snapshot_announced(struct sl_ctx *inst);
int sl_snapshot_unaligned(struct sl_ctx *inst, uint64_t id);
int sl_snapshot_capture_entry(struct sl_ctx *inst, struct sl_channel *ch,
                              const void *entry, uint64_t bytes);
bool sl_snapshot_alignment_timed_out(const struct sl_ctx *inst,
                                     uint64_t now_ns);
uint64_t sl_snapshot_alignment_wait_ns(const struct sl_ctx *inst);
int sl_snapshot_alignment_timeout(struct sl_ctx *inst);
int sl_snapshot_between_records(struct sl_ctx *inst, const void *entry,
                                uint32_t next);
int sl_snapshot_source_poll(struct sl_ctx *inst);
int sl_snapshot_final(struct sl_ctx *inst);
int sl_snapshot_final_restored(struct sl_ctx *inst);
int sl_snapshot_notifications(struct sl_ctx *inst);
bool sl_snapshot_notification_pending(const struct sl_ctx *inst);
/* snapshot.c note 14: finish the copy pass of a held ack and send it. */
void sl_snapshot_finish_held(struct sl_ctx *inst);
/* snapshot.c note 14: the only notification pending is a held ack's copy
 * pass (so the loop may go on with its other business after a step). */
bool sl_snapshot_copy_only(const struct sl_ctx *inst);
bool sl_snapshot_wait_final(struct sl_ctx *inst);
int sl_snapshot_restore_hook(struct sl_ctx *inst);
void sl_snapshot_instance_free(struct sl_ctx *inst);
void sl_ack_free(sl_ack *ack);
/* Inside a snapshot hook only: hand batch (malloc'd, its rows and arena
 * too) to this snapshot; the engine owns it from then on and sets its seq
 * and checkpoint_id.  On error the caller keeps it, unchanged.  Errors:
 * SL_EUSAGE (outside a snapshot hook, or no checkpointing), ENOSPC
 * (SL_ROW_BATCHES_MAX batches await a completed checkpoint; the
 * instance's cause says so). */
int sl_snapshot_add_rows(struct sl_ctx *inst, sl_row_batch *batch);
void sl_row_batch_free(sl_row_batch *batch);

#endif /* SL_CHECKPOINT_H */
