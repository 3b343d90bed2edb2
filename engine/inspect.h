/* inspect.h — reading a state directory from outside the job that writes
 * it: its checkpoints, their records, the blobs of the newest one (source
 * positions, operator state sizes), the job graph, and the savepoints made
 * from it.  For `sluice checkpoints` (cli/checkpoints.c) and for tools.
 *
 * Everything here only reads: the store is opened read-only (no lock,
 * read transactions only; storage/store.h note 5), so a directory can be
 * inspected while a job writes it, and nothing in it is changed.
 *
 * CAVEATS
 *
 * - The store keeps the record of every complete checkpoint but the blobs
 *   of the newest one only (store.h note 1); older checkpoints are listed
 *   from their records alone.  Only the newest one can be restored.
 * - A checkpoint record holds its trigger time, whether it was the final
 *   one, its instance count and (from record version 2 on) the bytes and
 *   entries its transaction wrote (engine/checkpoint_writer.c, write_once); its
 *   duration is not stored.
 * - A handle sees the store as of sl_state_dir_open(); open again to see
 *   newer checkpoints.  One process may open a directory only once at a
 *   time (LMDB), also read-only: a process that runs a job on DIR cannot
 *   inspect DIR; another process can.
 *
 * Errors: 0, or a negative SL_E* code or a positive errno value, and a
 * message in err (when err_bytes > 0) naming the path and the problem.
 */
#ifndef SL_INSPECT_H
#define SL_INSPECT_H

#include <stddef.h>
#include <stdint.h>

#include "sluice.h"

/* The largest operator state shown as position words. */
#define SL_INSPECT_POSITION_WORDS 8

typedef struct sl_state_dir sl_state_dir;

/** One physical operator of the job graph (from the graph fingerprint). */
typedef struct sl_inspect_operator {
  int id; /* the key of its blobs and keyed state */
  char name[SL_MAX_NAME];
  char kind[16]; /* "source", "map", "process", "sink", ... */
  int parallelism;
} sl_inspect_operator;

/** The blob of one operator instance: its part of the checkpoint
 * checkpoint_id besides keyed state (checkpoint_writer.c, write_instance). */
typedef struct sl_inspect_blob {
  int operator_index; /* into sl_state_dir_info.operators; -1 unknown */
  int op_id;
  int instance;
  uint64_t checkpoint_id;
  uint32_t bytes;       /* the whole blob */
  int has_state;        /* operator state saved (snapshot hook) */
  uint32_t state_bytes;
  /** Operator state read as little-endian u64 words, when it is 8 ..
   * 8 * SL_INSPECT_POSITION_WORDS bytes, a multiple of 8: for the
   * built-in sources the first word is the position (records emitted,
   * next value, byte offset; a file source: file index, then offset). */
  int position_words; /* 0: not read as words (see state_bytes) */
  uint64_t position[SL_INSPECT_POSITION_WORDS];
  int has_event_time;
  int64_t watermark; /* SL_WATERMARK_MIN: none yet */
  int64_t max_timestamp;
  uint64_t channel_bytes; /* channel state (unaligned checkpoint), bytes */
} sl_inspect_blob;

/** A state directory as of sl_state_dir_open(). */
typedef struct sl_state_dir_info {
  const char *path;
  uint64_t latest;          /* newest complete checkpoint, 0 if none */
  uint32_t store_format;    /* SL_STORE_FORMAT_VERSION */
  uint64_t data_bytes;      /* size of data.mdb */
  uint64_t log_entries;     /* keyed-state changes since the last compaction */
  uint64_t base_entries;    /* keyed-state entries of the compacted base */
  uint64_t table_entries;   /* table sink rows (and their counts) */
  const char *graph;        /* the fingerprint, as stored */
  uint32_t max_parallelism; /* key groups; 0 if the graph did not parse */
  int operator_count;       /* 0 if the graph did not parse */
  const sl_inspect_operator *operators;
  int blob_count;           /* blobs of the newest checkpoint */
  const sl_inspect_blob *blobs;
  size_t checkpoint_count;  /* records, ids ascending, all <= latest */
  const uint64_t *checkpoint_ids;
} sl_state_dir_info;

/** One checkpoint record, decoded. */
typedef struct sl_inspect_checkpoint {
  uint64_t id;
  uint32_t record_version; /* 1, 2 or 3 */
  uint32_t record_bytes;
  int final;               /* taken at the end of input */
  int64_t trigger_time_ms; /* wall clock, Unix epoch */
  uint64_t instance_count;
  int has_sizes;           /* version 2: the next two are known */
  uint64_t bytes_persisted;   /* keyed-state changes, rows and blobs */
  uint64_t entries_persisted; /* keyed-state puts and deletes */
  int unaligned;           /* version 3: an unaligned checkpoint */
  uint64_t channel_bytes;  /* version 3: its channel state */
} sl_inspect_checkpoint;

/* Flags of sl_state_dir_open. */
/** Create and touch no lock.mdb (LMDB's MDB_NOLOCK): for a directory no
 * process writes, such as a savepoint's store copy, which then stays
 * exactly as it was.  Never for the state directory of a running job. */
#define SL_STATE_DIR_NO_LOCK_FILE 1u

/** Open the store in dir read-only and read its graph, blobs and the ids
 * of its checkpoints (one read transaction for the graph and blobs).  On
 * error *sd is NULL.  Errors: SL_ESTORE (not a directory, not a sluice
 * store, an LMDB file of someone else, another format version; or already
 * open in this process), ENOENT (no such directory, or no store in it),
 * SL_ECORRUPT (a value fails its checksum or is malformed), ENOMEM, errno
 * values, LMDB codes; EINVAL (NULL argument, unknown flag). */
int sl_state_dir_open(const char *dir, unsigned flags, sl_state_dir **sd,
                      char *err, size_t err_bytes);

/** What sd holds; valid until sl_state_dir_close(). */
const sl_state_dir_info *sl_state_dir_info_get(const sl_state_dir *sd);

/** Read and decode the record of checkpoint id.  Errors: SL_ENOTFOUND (no
 * such checkpoint; also one newer than the handle's latest), SL_ECORRUPT
 * (fails its checksum, or its bytes are not a record this sluice knows:
 * err says what is wrong), ENOMEM, LMDB codes. */
int sl_state_dir_checkpoint(sl_state_dir *sd, uint64_t id,
                            sl_inspect_checkpoint *out, char *err,
                            size_t err_bytes);

/** Close; NULL is accepted. */
void sl_state_dir_close(sl_state_dir *sd);

/* ------------------------------------------------------------ savepoints
 * (written by the savepoint code; read here, engine/inspect_savepoint.c).
 *
 *   <state_dir>/savepoints.jsonl  one JSON object a line:
 *     {"checkpoint_id":N,"created_ms":T,"path":"<dir>","bytes":B}
 *   <savepoint dir>/manifest.json  one JSON object:
 *     {"format":"sluice-savepoint","version":V,"store_format":F,
 *      "checkpoint_id":N,"created_ms":T,"graph":"...",
 *      "max_parallelism":M,"operators":[{"id":I,"name":"...",
 *      "kind":"...","parallelism":P}, ...],"bytes":B}
 *   and beside it the store copy (data.mdb, in the directory or in one of
 *   its subdirectories). */

#define SL_SAVEPOINT_PATH_BYTES 4096

typedef struct sl_savepoint_entry {
  uint64_t checkpoint_id;
  int64_t created_ms;
  uint64_t bytes;
  char path[SL_SAVEPOINT_PATH_BYTES];
} sl_savepoint_entry;

/** Read <state_dir>/savepoints.jsonl into a malloc'd array (*entries,
 * NULL when *count is 0).  Blank lines are skipped.  Errors: ENOENT (no
 * such file: no savepoints), EINVAL (a line is not such an object: err
 * names the file, the line number and what is wrong), ENAMETOOLONG,
 * ENOMEM, errno values of reading. */
int sl_savepoints_read(const char *state_dir, sl_savepoint_entry **entries,
                       size_t *count, char *err, size_t err_bytes);

typedef struct sl_savepoint_manifest {
  char format[32];
  uint32_t version;
  uint32_t store_format;
  uint64_t checkpoint_id;
  int64_t created_ms;
  uint64_t bytes;
  uint32_t max_parallelism;
  char *graph; /* malloc'd */
  int operator_count;
  sl_inspect_operator *operators; /* malloc'd */
  char store_dir[SL_SAVEPOINT_PATH_BYTES]; /* where its data.mdb is; "" if
                                              none was found */
} sl_savepoint_manifest;

/** 1 if dir holds a manifest.json (a savepoint), else 0. */
int sl_savepoint_is_dir(const char *dir);

/** Read <dir>/manifest.json into *m (free it with
 * sl_savepoint_manifest_free, also after an error).  Errors: ENOENT (no
 * manifest), EINVAL (not JSON, a field missing or of the wrong type, or
 * format is not "sluice-savepoint": err names the file and the field),
 * ENOMEM, errno values of reading. */
int sl_savepoint_manifest_read(const char *dir, sl_savepoint_manifest *m,
                               char *err, size_t err_bytes);

void sl_savepoint_manifest_free(sl_savepoint_manifest *m);

/** "2026-12-03T04:12:01.123Z" for ms since the epoch into out (at least
 * 32 bytes).  Returns out. */
char *sl_inspect_time_text(int64_t ms, char *out, size_t out_bytes);

#endif /* SL_INSPECT_H */
