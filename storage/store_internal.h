/* store_internal.h — what the pieces of the LMDB store share; private to
 * storage/store*.c (and the fuzz target tests/fuzz/fuzz_store.c).
 * store.h is the API and holds the design notes 1-8; each piece opens
 * with the notes of what it does:
 *   store.c           opening, closing, meta, the registry, errors and
 *                     checked values (notes 1-4)
 *   store_txn.c       the write transaction of a checkpoint and its
 *                     commit (notes 1-3)
 *   store_view.c      the merged view of the log's runs and the base,
 *                     reads of keyed state (notes 1-2)
 *   store_compact.c   compaction in steps (note 3)
 *   chunk.c           the layout of a chunk (chunk.h)
 *   store_table.c     table rows: writes in the transaction, reads from
 *                     other threads (note 1)
 *   store_records.c   checkpoint records, blobs, the inspection view
 *   store_savepoint.c sl_store_inspect, sl_store_copy, sl_store_install
 * Here: the layout constants, the handle and its transaction, byte
 * helpers, and the calls one piece makes of another.
 */
#ifndef SL_STORE_INTERNAL_H
#define SL_STORE_INTERNAL_H

#include <assert.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include "chunk.h"
#include "key_order.h"
#include "store.h"

/* Readers at once (open_env): a job's instances restore in parallel. */
#define STORE_MAX_READERS 4096
#define STORE_MAGIC "sluice-store"
#define STORE_MAGIC_BYTES (sizeof STORE_MAGIC - 1)
#define STORE_ERROR_BYTES 1024
#define STORE_DEFAULT_MAP_BYTES (64ull << 20)
/* MDB_WRITEMAP (a writer updates pages in the map itself) or not (it
 * updates copies, written with pwrite at the commit).  Off: a checkpoint
 * appends to the log's last pages, and under WRITEMAP each page it
 * touches takes a write fault and the commit's msync walks the whole used
 * map.  store_bench, runs alternated: 100K sorted puts and a durable
 * commit 39 ms with WRITEMAP, 14 ms without; a compaction of a 1M base
 * and a 1M log about the same (235 and 215 ms).  (With the B-tree
 * updates of format 1, WRITEMAP made puts 1.3x faster.) */
#define STORE_WRITEMAP false
#define STORE_DIR_MODE 0755
/* Free space under which an EIO of LMDB is a full disk (disk_full). */
#define STORE_FULL_DISK_BYTES (256u << 10)
/* A writer waits this long at most for readers that hold the directory's
 * shared lock (lock_directory), unless sl_store_options.lock_wait_ms says
 * otherwise; it looks again every STORE_LOCK_WAIT_US. */
#define STORE_LOCK_WAIT_DEFAULT_MS 5000u
#define STORE_LOCK_WAIT_US 10000
#define STORE_FILE_MODE 0644
/* At least LMDB's largest key (511 by default); longer keys are refused
 * before they reach the buffer. */
#define KEY_BUFFER_BYTES 512u
#define STATE_PREFIX_BYTES 4u /* u16 op, u16 key group, big-endian */
/* Format 2's log key prefix (seq and state prefix): the state key limit
 * stays what it was, so a store upgraded from format 2 holds every key. */
#define LOG_SEQ_BYTES 8u
#define LOG_PREFIX_BYTES (LOG_SEQ_BYTES + STATE_PREFIX_BYTES)
/* Chunk keys (store.h note 1): a log chunk's u64 seq, u32 run, u16 op,
 * u16 last key group, u32 ordinal; a base chunk's u16 op, u16 last key
 * group, u32 ordinal; all big-endian. */
#define LOG_KEY_BYTES 20u
#define LOG_RUN_AT 8u
#define LOG_LAST_AT 12u
#define LOG_ORDINAL_AT 16u
#define BASE_KEY_BYTES 8u
#define BLOB_KEY_BYTES 4u     /* u16 op, u16 instance, big-endian */
#define BLOB_ID_BYTES 8u      /* u64 checkpoint id ahead of a blob */
#define CHECKPOINT_KEY_BYTES 8u
/* LMDB's data file starts with a meta page: a 16-byte page header (u64
 * page number, u16 pad, u16 flags, u16 lower, u16 upper) and then the meta
 * record, whose first field is the u32 magic, in native byte order. */
#define LMDB_MAGIC 0xBEEFC0DEu
#define LMDB_MAGIC_OFFSET 16u
/* ... then u32 version, u64 address, u64 map size and two 48-byte database
 * records; then the u64 last page number and the u64 txnid. */
#define LMDB_META_LAST_PAGE_OFFSET (LMDB_MAGIC_OFFSET + 120u)
/* Messages show at most this many key bytes in hex, and this many bytes
 * of each fingerprint, so one message always fits the error buffer. */
#define MESSAGE_KEY_BYTES 32u
#define MESSAGE_FINGERPRINT_BYTES 160

_Static_assert(SL_STORE_CHECKSUM_BYTES == sizeof(uint64_t),
               "the checksum is one XXH3-64 hash");
_Static_assert(LOG_PREFIX_BYTES < KEY_BUFFER_BYTES, "a log key fits");
_Static_assert(KEY_BUFFER_BYTES <= UINT16_MAX, "a key's size fits a u16");
_Static_assert(2 * MESSAGE_FINGERPRINT_BYTES + 200 < STORE_ERROR_BYTES,
               "a graph mismatch message leaves room for the directory");

/* Database numbers: the index of each handle and, but for state2, the
 * checksum's seed (checksum_seed). */
enum {
  DB_META = 1,
  DB_CHECKPOINTS = 2,
  DB_BLOBS = 3,
  DB_STATE = 4,
  DB_LOG = 5,
  DB_STATE2 = 6,
  DB_TABLES = 7, /* optional in stores made before it (store.h note 6) */
  DB_COUNT
};
static const char *const db_names[DB_COUNT] = {
    "", "meta", "checkpoints", "blobs", "state", "log", "state2", "tables"};
/* The two bases, by the value of meta "base". */
static const int base_dbs[2] = {DB_STATE, DB_STATE2};


enum txn_state { TXN_IDLE, TXN_ACTIVE, TXN_FAILED };

/* A table written by the open transaction (sl_store_txn_table), and the
 * rows its puts added less those its deletes removed, for the commit's
 * update of the table's row count (store_table.c note 1). */
typedef struct txn_table {
  char name[SL_STORE_TABLE_NAME_MAX + 1];
  uint8_t name_bytes;
  int64_t row_delta;
} txn_table;

_Static_assert(1 + SL_STORE_TABLE_NAME_MAX + SL_STORE_TABLE_KEY_MAX == 511,
               "a table key fills LMDB's default largest key exactly");
_Static_assert(SL_STORE_TABLE_NAME_MAX < 255, "a name's length fits a u8");

struct sl_store_txn {
  sl_store *store;
  MDB_txn *mdb; /* exactly in TXN_ACTIVE (store_txn.c note 2) */
  enum txn_state state;
  int failure; /* TXN_FAILED: what the failing call returned */
  uint64_t seq; /* of this transaction: its log keys start with it */
  uint8_t key[KEY_BUFFER_BYTES];
  /* The newest state key logged by this transaction (store_txn.c note 3); 0
   * bytes: none yet. */
  uint8_t last_key[KEY_BUFFER_BYTES];
  size_t last_key_bytes;
  /* The chunk being filled (store_txn.c note 3), its run and the ordinal
   * of the next chunk key; entries: state entries in the chunks so far. */
  chunk_builder chunk;
  bool chunk_open;
  uint32_t run;
  uint32_t ordinal;
  uint64_t entries;
  /* op << 16 | instance of each blob put (store_txn.c note 1) */
  uint32_t *blob_keys;
  size_t blob_count;
  size_t blob_capacity;
  uint8_t *copy; /* a blob's bytes while the commit rewrites it */
  size_t copy_capacity_bytes;
  txn_table tables[SL_STORE_TXN_TABLES]; /* store_table.c note 1 */
  int table_count;
  /* The rows' cursor (store_table.c note 1), opened by the first row put
   * or delete, freed by LMDB when the transaction ends.  Sorted rows then
   * mostly land on the page the cursor is on, skipping the descent. */
  MDB_cursor *rows;
};

struct sl_store {
  MDB_env *env;
  MDB_dbi dbi[DB_COUNT]; /* indexed by database number */
  char *dir;
  /* The "lock" file, flock'd: exclusively by a writer, shared by a
   * reader that found no writer (store.h note 5; older writers take only
   * this one); -1: not open. */
  int lock_fd;
  /* The directory itself, flock'd: exclusively by a writer, shared by a
   * reader that found no writer (store.h note 5); -1: not open. */
  int dir_fd;
  bool read_only;
  bool no_lock_file; /* read_only without lock.mdb (MDB_NOLOCK) */
  bool no_sync;
  /* Writer: how many times it looks again for the locks readers hold,
   * STORE_LOCK_WAIT_US apart (sl_store_options.lock_wait_ms). */
  uint32_t lock_wait_tries;
  bool registered; /* listed in the registry (store.c note 4) */
  uint64_t latest; /* writer: exact; read-only: as of the open */
  uint64_t next_seq; /* writer: exact; read-only: as of the open */
  uint32_t state_key_max_bytes;
  dev_t dir_device;
  ino_t dir_inode;
  sl_store *registry_next;
  sl_store_txn txn;
  const _Atomic int *cancel; /* sl_store_set_cancel: stops a compaction */
  sl_store_fault_fn fault;   /* sl_store_set_fault: the fault layer */
  bool compacting;           /* compactions are not faulted */
  bool unfaulted; /* a chunk's put: its entries' puts were asked already */
  /* A compaction under way (store_compact.c note 2), kept between calls. */
  struct compaction_progress *compaction;
  void *fault_arg;
  /* Tables (store_table.c note 1).  tables_open: dbi[DB_TABLES] is a handle
   * (always for a writer; a read-only open of an older store may lack it until
   * a writer adds it).  map_lock: read side held by every table read, write
   * side by sl_store_grow.  tables_lock: serialises the late mdb_dbi_open of
   * "tables" by read-only handles. */
  _Atomic bool tables_open;
  pthread_rwlock_t map_lock;
  pthread_mutex_t tables_lock;
  /* error_lock: held while error is written (store_fail) or copied out
   * (sl_store_error_copy), since restores fail on several instance threads
   * at once (store.h, sl_store_read_state). */
  pthread_mutex_t error_lock;
  char error[STORE_ERROR_BYTES];
};

/* ------------------------------------------------------------ bytes */

static inline void put_be16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)(v >> 8);
  p[1] = (uint8_t)v;
}

static inline uint16_t get_be16(const uint8_t *p) {
  return (uint16_t)((unsigned)p[0] << 8 | p[1]);
}

static inline uint32_t get_be32(const uint8_t *p) {
  return (uint32_t)get_be16(p) << 16 | get_be16(p + 2);
}

static inline void put_be32(uint8_t *p, uint32_t v) {
  put_be16(p, (uint16_t)(v >> 16));
  put_be16(p + 2, (uint16_t)v);
}

static inline void put_be64(uint8_t *p, uint64_t v) {
  for (int i = 7; i >= 0; i--, v >>= 8)
    p[i] = (uint8_t)v;
}

static inline uint64_t get_be64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v = v << 8 | p[i];
  return v;
}

static inline void put_le64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++, v >>= 8)
    p[i] = (uint8_t)v;
}

static inline uint64_t get_le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}

/* The key of meta value name. */
static inline MDB_val meta_key(const char *name) {
  return (MDB_val){.mv_size = strlen(name), .mv_data = (void *)name};
}

/* The key of the blob of (op, instance), built in out (store.h note 1). */
static inline MDB_val blob_key(uint8_t out[BLOB_KEY_BYTES], uint16_t op,
                               uint16_t instance) {
  put_be16(out, op);
  put_be16(out + 2, instance);
  return (MDB_val){.mv_size = BLOB_KEY_BYTES, .mv_data = out};
}

/* ------------------------------------------------------------ store.c */

/* Errors: "<dir>: message" into the handle (store_fail) or into a
 * caller's buffer (store_dir_fail: calls that run beside the writer, or
 * before a handle exists); each returns rc. */
__attribute__((format(printf, 3, 4))) int
store_fail(sl_store *s, int rc, const char *format, ...);
__attribute__((format(printf, 5, 6))) int
store_dir_fail(const char *dir, char *err, size_t err_bytes, int rc,
               const char *format, ...);
int store_lmdb_fail(sl_store *s, int rc, const char *what);
int store_corrupt(sl_store *s, int db, const MDB_val *key,
                  const char *problem);
void store_key_text(int db, const MDB_val *key, char *out, size_t out_bytes);

/* Checked values (store.c notes 1, 2) and meta. */
uint64_t store_checksum(int db, const MDB_val *key, const void *payload,
                        size_t payload_bytes);
int store_value_open(sl_store *s, int db, const MDB_val *key,
                     const MDB_val *value, MDB_val *payload);
int store_value_put(sl_store *s, MDB_txn *txn, int db, MDB_val *key,
                    const void *head, size_t head_bytes, const void *body,
                    size_t body_bytes, unsigned flags);
int store_meta_get(sl_store *s, MDB_txn *txn, const char *name,
                   MDB_val *payload);
int store_meta_get_u64(sl_store *s, MDB_txn *txn, const char *name,
                       uint64_t *out);
int store_meta_put_u64(sl_store *s, MDB_txn *txn, const char *name,
                       uint64_t v);
int store_meta_get_base(sl_store *s, MDB_txn *txn, int *db);
int store_read_begin(sl_store *s, MDB_txn **txn);
int store_write_end(sl_store *s, MDB_txn *txn, int rc, const char *what,
                    const char *commit_what);
int store_env_opened(sl_store *s, int rc, const char *what);

/* Opening's steps that sl_store_inspect and sl_store_install take too
 * (store.c note 3). */
sl_store *store_handle_new(const char *dir, bool read_only);
int store_registry_add(sl_store *s);
int store_dir_path(sl_store *s, const char *name, char *out,
                   size_t out_bytes);
int store_fsync_dir(sl_store *s, const char *path);
int store_inspect_dir(sl_store *s, bool *has_data, bool *created);
int store_inspect_data_file(sl_store *s, bool *empty);
int store_take_lock(sl_store *s, bool *created, bool *flocked);
int store_check_data_file(sl_store *s);

/* ------------------------------------------------------------ the rest */

/* store_txn.c: the transaction's state machine (store_txn.c note 2). */
int store_txn_usable(sl_store_txn *t);
int store_txn_fail(sl_store_txn *t, int rc);

/* store_table.c: each table's row delta into its count, at the commit. */
int store_commit_table_counts(sl_store_txn *t);

/* store_view.c: the merged view (store_view.c note 1) of the state keys
 * with a prefix in [first, last] and, if after is given, above the state
 * key after (after_bytes), over the base base_db and the log runs with a
 * seq below upto_seq, into fn in key order.  fn's nonzero value stops it
 * and is returned. */
typedef int (*store_merged_fn)(void *arg, const chunk_entry *e);
int store_merged_view(sl_store *s, MDB_txn *txn, int base_db,
                      uint64_t upto_seq, uint32_t first, uint32_t last,
                      const uint8_t *after, size_t after_bytes,
                      store_merged_fn fn, void *arg);

/* store_compact.c: forget a compaction under way (sl_store_wipe, close). */
void store_compaction_forget(sl_store *s);

/* The u64 counters of meta "log_entries" and "base_entries": state
 * entries in the log's chunks and in the base's (store.h note 1). */
int store_meta_add_u64(sl_store *s, MDB_txn *txn, const char *name,
                       int64_t delta);

#endif /* SL_STORE_INTERNAL_H */
