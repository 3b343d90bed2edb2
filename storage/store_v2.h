/* store_v2.h — a read-only reader of the OLD store format, version 2
 * (storage/store.h notes 1-3 as of b113ecd: one LMDB entry per change, a
 * log over a base), for `sluice checkpoints --upgrade` (cli/upgrade.c).
 * It shares no code with the current store (storage/store*.c), so it
 * keeps reading format 2 whatever the current format becomes.
 *
 * NOTES ON THE DESIGN
 *
 * 1. What it reads, as format 2 wrote it: the databases meta,
 *    checkpoints, blobs, log, state, state2 and (if present) tables;
 *    every value ends with its XXH3 checksum seeded by the key and the
 *    database number (meta 1, checkpoints 2, blobs 3, state and state2 4,
 *    log 5, tables 7), and every value read is checked: a mismatch is
 *    SL_ECORRUPT "DIR: data.mdb is damaged: database D, key K: ...".
 * 2. Opening walks data.mdb with storage/lmdb_check.c before LMDB maps
 *    it (as sl_store_open does: a damaged file is SL_ECORRUPT, never a
 *    fault), then opens it MDB_RDONLY | MDB_NOLOCK: no file is created or
 *    written.  The caller must keep writers out (the upgrade holds the
 *    store's lock, store.h note 5) for the handle's life: one read
 *    transaction is open from the open to the close, and every pointer
 *    handed to a callback points into the map.
 * 3. The merged keyed state (store.h note 2 of format 2): the current
 *    base (meta "base": 0 state, 1 state2) overlaid with the log, the
 *    log entry of the highest seq winning and a winning tombstone
 *    removing the key.  The log is indexed in memory (40 bytes an entry),
 *    sorted by (state key, seq descending), and merged with one pass over
 *    the base: O(base + log log log) time, O(log) memory.
 */
#ifndef SL_STORE_V2_H
#define SL_STORE_V2_H

#include <stddef.h>
#include <stdint.h>

#define SL_STORE_V2_FORMAT 2u

typedef struct sl_store_v2 sl_store_v2;

/** Open the format-2 store in dir read-only (notes 2).  *format gets the
 * store's meta "format" as soon as it is read (0 before), also when the
 * open then refuses it.  On error *v2 is NULL and err says what and
 * where.  Errors: ENOENT (no dir/data.mdb), SL_ESTORE (not an LMDB file,
 * not a sluice store, a format other than 2: *format says which),
 * SL_ECORRUPT (damaged, note 1), ENOMEM, errno values, LMDB codes. */
int sl_store_v2_open(const char *dir, sl_store_v2 **v2, uint32_t *format,
                     char *err, size_t err_bytes);

/** Close (the read transaction ends: pointers handed out die).  NULL is
 * accepted. */
void sl_store_v2_close(sl_store_v2 *v2);

/** The message of the last failure of a read below. */
const char *sl_store_v2_error(const sl_store_v2 *v2);

/** Meta "latest": the newest complete checkpoint, 0 if none. */
uint64_t sl_store_v2_latest(const sl_store_v2 *v2);

/** Meta "graph" as a NUL-terminated string owned by the handle. */
const char *sl_store_v2_graph(const sl_store_v2 *v2);

/** The record of checkpoint id (pointing into the map).  Errors:
 * SL_ENOTFOUND, SL_ECORRUPT, LMDB codes. */
int sl_store_v2_record(sl_store_v2 *v2, uint64_t id, const void **record,
                       uint32_t *bytes);

typedef int (*sl_store_v2_blob_fn)(void *arg, uint16_t op, uint16_t instance,
                                   uint64_t checkpoint_id, const void *data,
                                   uint32_t bytes);
typedef int (*sl_store_v2_state_fn)(void *arg, uint16_t op,
                                    uint16_t key_group, const void *key,
                                    uint32_t key_bytes, const void *value,
                                    uint32_t value_bytes);
typedef int (*sl_store_v2_row_fn)(void *arg, const char *table,
                                  const void *key, uint32_t key_bytes,
                                  const void *value, uint32_t value_bytes);

/* The walks: each calls fn in key order and stops at fn's first nonzero
 * value, which it returns.  Errors besides: SL_ECORRUPT, ENOMEM, LMDB
 * codes. */

/** Every blob, with the id of the checkpoint that wrote it. */
int sl_store_v2_blobs(sl_store_v2 *v2, sl_store_v2_blob_fn fn, void *arg);

/** The merged keyed state of every operator (note 3), each live key once,
 * in (op, key group, key) order. */
int sl_store_v2_state(sl_store_v2 *v2, sl_store_v2_state_fn fn, void *arg);

/** Every row of every table (none if the store has no "tables"), in
 * (table, key) order; table is NUL-terminated. */
int sl_store_v2_rows(sl_store_v2 *v2, sl_store_v2_row_fn fn, void *arg);

#endif /* SL_STORE_V2_H */
