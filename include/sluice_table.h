/* sluice_table.h — the LMDB table sink and its reader
 * (operators/table_sink.c).  Included by sluice.h.
 *
 * OVERVIEW
 *
 * A table sink turns each record into an upsert or a delete of one row
 * (key bytes -> value bytes) of a named table that lives in the job's own
 * LMDB store (checkpoint.state_dir).  Its rows are committed by the
 * checkpoint transaction itself: the rows of the records before barrier n
 * are buffered by the sink instance (the last write of a key wins) and
 * written into the same LMDB write transaction that holds every
 * instance's keyed state, the source positions and the record of
 * checkpoint n.  So the table always reads as of the newest complete
 * checkpoint, exactly: never a row of a record after it, never a missing
 * row of a record before it, also after stops, crashes, failovers and
 * resumes (exactly-once, with replayable sources and SL_EXACTLY_ONCE
 * checkpoints).  The final checkpoint at the end of input carries the last
 * rows.  A job stopped before it (sl_job_stop) leaves the table at its
 * newest complete checkpoint; resuming from it finishes the table.
 *
 *     static int row(void *user, const sl_record *in, sl_table_row *out) {
 *       const sl_tuple *t = in->data;
 *       out->key = &t->key;  out->key_bytes = 8;
 *       out->value = &t->value;  out->value_bytes = 8;
 *       return 1;
 *     }
 *     sl_table_sink_config tc = {.table = "totals", .row = row};
 *     sl_sink_table(job, "to-table", sums, 2, &tc, &op);
 *     ...
 *     sl_table_reader *r;
 *     sl_job_table_reader(job, &r);        // while it runs, or after
 *     sl_table_count(r, "totals", &rows);
 *     sl_table_close(r);
 *
 * Readers.  Tables are read through a reader: sl_job_table_reader() gives
 * one on a started job's own store (this process; LMDB allows one handle
 * of a store per process, so the job's is shared), usable while the job
 * runs and after it ended, until sl_job_destroy().  sl_table_open() opens
 * a state directory read-only (another process, or this one when no job
 * of this process has the directory open: after sl_job_destroy, or
 * beside a job of another process).  Every read is one LMDB read
 * transaction: it sees one complete checkpoint and never blocks the job.
 *
 * CAVEATS
 *
 * - Requires checkpointing (checkpoint.state_dir): sl_sink_table() refuses
 *   a job without it (SL_EUSAGE, message in sl_job_error()).
 * - In SL_AT_LEAST_ONCE mode the table may hold rows of records after its
 *   checkpoint's barrier; a resume rewrites them from the replay.
 * - With parallelism above 1 the sink partitions its input by the row key
 *   (a key_by named NAME.key that hashes the key bytes), so every key has
 *   one instance and its rows keep their order; the row callback therefore
 *   runs twice per record (once for the key, once in the sink) and must be
 *   a pure function of the record.  Rows of one key coming from two
 *   parallel producers (two source instances) have no defined order.
 * - A sink instance holds the rows received since the last completed
 *   checkpoint in memory (one version per key per checkpoint interval).
 * - SL_STORE_FRESH empties every table with the checkpoints.  Compaction
 *   of the store leaves tables as they are.  Tables are not part of the
 *   job graph's identity: renaming a table starts a new, empty one, and the
 *   old one stays in the store until a fresh start.
 *
 * CONCURRENCY
 *
 *   call                        may be called from
 *   --------------------------  ---------------------------------------
 *   sl_sink_table               the building thread, before the start
 *   sl_job_table_reader         any thread, after sl_job_start returned 0
 *   sl_table_open               any thread
 *   sl_table_get, _foreach,     one thread at a time per reader; use one
 *   _count, _checkpoint,        reader per thread (a job's readers are
 *   sl_table_error              cheap; they share the job's store)
 *   sl_table_close              the reader's thread; a job's readers
 *                               before sl_job_destroy
 */
#ifndef SLUICE_TABLE_H
#define SLUICE_TABLE_H

#include "sluice.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Bytes of a table name, with NUL: a name is 1 .. 40 bytes of A-Z a-z
 * 0-9 '_' '-' '.'. */
#define SL_TABLE_MAX_NAME 41
/** Longest row key in bytes (LMDB's 511-byte keys less the table's
 * prefix).  Values may be as long as records. */
#define SL_TABLE_MAX_KEY 470u
/** Distinct tables the table sinks of one job may write. */
#define SL_TABLE_MAX_TABLES 64
/** Bytes of sl_table_row.buffer. */
#define SL_TABLE_ROW_BUFFER_BYTES 1024u

/** The row a record becomes.  The callback sets key and key_bytes, and
 * either value and value_bytes (an upsert: insert or replace) or
 * is_delete = 1 (the key's row is removed; value is ignored).  The
 * pointers may point into the record, into buffer, or into memory of the
 * callback's that stays valid until it returns: the sink copies the bytes
 * at once. */
typedef struct sl_table_row {
  const void *key;
  uint32_t key_bytes; /* 0 .. SL_TABLE_MAX_KEY */
  const void *value;
  uint32_t value_bytes;
  int is_delete;
  /** SL_TABLE_ROW_BUFFER_BYTES bytes of scratch space for the callback
   * (to build a key or value in), 8-byte aligned, its own per call. */
  void *buffer;
} sl_table_row;

/** Turns one record into a row.  Returns 1 (out is a row), 0 (this record
 * changes no row), or any other value to fail the job with it (the message
 * names the operator, the table and the value returned), as a filter.
 * Must be a pure function of the record (see CAVEATS) and safe to call
 * from several threads at once. */
typedef int (*sl_table_row_fn)(void *user, const sl_record *in,
                               sl_table_row *out);

typedef struct sl_table_sink_config {
  /** The table (1 .. SL_TABLE_MAX_NAME - 1 bytes of A-Z a-z 0-9 _ - .);
   * copied. */
  const char *table;
  /** NULL: the default row: key = the record's first 8 bytes, value = the
   * rest (an sl_tuple becomes key -> value, each as its 8 bytes in
   * memory order); always an upsert; a record shorter than 8 bytes fails
   * the job.  Deletes need a callback. */
  sl_table_row_fn row;
  void *row_user;
} sl_table_sink_config;

/** A table sink named name reading input, with parallelism instances.
 * Errors: EINVAL (config, its table or name NULL, the table name invalid,
 * or name too long for the NAME.key partitioning; sl_job_error() says
 * which), SL_EUSAGE (the job does not take checkpoints), SL_EGRAPH (the
 * job's table sinks would write more than SL_TABLE_MAX_TABLES distinct
 * tables), and those of the builders (SL_EGRAPH, SL_ESTARTED, ENOMEM).
 * At run time the job fails, naming the operator and the table, on a row
 * callback's negative return, a key over SL_TABLE_MAX_KEY bytes, a NULL
 * key or value with a nonzero size, a record too short for the default
 * row, or out of memory. */
int sl_sink_table(sl_job *job, const char *name, sl_op *input,
                  int parallelism, const sl_table_sink_config *config,
                  sl_op **op);
int sl_sink_table_sized(sl_job *job, const char *name, sl_op *input,
                        int parallelism, const sl_table_sink_config *config,
                        sl_op **op, size_t config_bytes);
#define sl_sink_table(...)                                                     \
  sl_sink_table_sized(__VA_ARGS__, sizeof(sl_table_sink_config))

/* ------------------------------------------------------------------------ */
/* Reading tables. */

typedef struct sl_table_reader sl_table_reader;

/** Open the store in state_dir read-only for reading tables.  err (may be
 * NULL) gets a message naming the directory and the problem.  Errors:
 * ENOENT (no such directory, or it holds no store), SL_ESTORE (not a
 * sluice store, a newer format, or already open in this process: use
 * sl_job_table_reader on that job), EINVAL (NULL argument), ENOMEM, and
 * errno or LMDB codes. */
int sl_table_open(const char *state_dir, sl_table_reader **reader,
                  char *err, size_t err_bytes);

/** A reader of the tables of job's store.  Close it before
 * sl_job_destroy().  Errors: EINVAL (NULL argument), SL_EUSAGE (the job
 * takes no checkpoints), SL_ENOTSTARTED (not started, or its start
 * failed), ENOMEM. */
int sl_job_table_reader(sl_job *job, sl_table_reader **reader);

/** Close a reader (for sl_table_open's, its store too).  NULL is
 * accepted. */
void sl_table_close(sl_table_reader *reader);

/** The message of the reader's last failed call ("" if none). */
const char *sl_table_error(const sl_table_reader *reader);

/** The row of key in table, as a malloc'd copy in *value (never NULL on
 * success, also for 0 bytes; free() it) of *value_bytes bytes.  Errors:
 * SL_ENOTFOUND (no such row), EINVAL (bad table name, key over
 * SL_TABLE_MAX_KEY, NULL argument), SL_ECORRUPT (the value fails its
 * checksum), ENOMEM, LMDB codes.  A table nothing was written to is
 * empty. */
int sl_table_get(sl_table_reader *reader, const char *table, const void *key,
                 uint32_t key_bytes, void **value, uint32_t *value_bytes);

/** Visits one row; key and value are valid during the call only.  Return
 * 0 to go on, nonzero to stop (sl_table_foreach then returns it). */
typedef int (*sl_table_visit_fn)(void *arg, const void *key,
                                 uint32_t key_bytes, const void *value,
                                 uint32_t value_bytes);

/** Call fn for every row of table, in key order (bytes compared as
 * memcmp, a shorter key first on a tie), all from one checkpoint.  The
 * job's map cannot grow while fn runs, so keep it short and do not wait
 * for the job in it.  Errors: fn's nonzero value, and those of
 * sl_table_get but SL_ENOTFOUND. */
int sl_table_foreach(sl_table_reader *reader, const char *table,
                     sl_table_visit_fn fn, void *arg);

/** The number of rows of table (kept by the store: no walk).  Errors: as
 * sl_table_foreach. */
int sl_table_count(sl_table_reader *reader, const char *table,
                   uint64_t *rows);

/** The newest complete checkpoint of the store (0: none), read now: the
 * one the tables show, unless a newer one completes before the next read.
 * Errors: SL_ECORRUPT, LMDB codes. */
int sl_table_checkpoint(sl_table_reader *reader, uint64_t *checkpoint_id);

#ifdef __cplusplus
}
#endif
#endif /* SLUICE_TABLE_H */
