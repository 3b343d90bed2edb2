/* store.c — the LMDB store of a job's state directory (store.h holds the
 * design notes 1-8 and the contract of every call).
 *
 * NOTES ON THE IMPLEMENTATION
 *
 * 1. Checksums (store.h note 1) are computed in two calls, the key's hash
 *    seeding the value's, so neither a put nor a read needs a buffer for
 *    key || value.  Seeding the key's hash with the database number binds
 *    a value to its database as well: a value copied under another key or
 *    into another database fails its check.
 * 2. Writes use MDB_RESERVE: LMDB makes room for payload + checksum and the
 *    payload is copied once, straight into its page; the key is built in a
 *    fixed buffer of the transaction.  A put allocates nothing.
 * 3. Blob ids.  A checkpoint's id is known only at sl_store_commit, so
 *    sl_store_put_blob writes id 0 and remembers the blob's key; the
 *    commit reads each of them back (checking the checksum), and puts it
 *    again with the real id, before it writes the record and "latest".  A
 *    committed blob never holds 0, so a read treats 0 as corruption.
 * 4. Transaction states.  The one sl_store_txn of a store is embedded in
 *    its handle, so its buffers are reused by every checkpoint and a stale
 *    pointer never points to freed memory.
 *
 *             sl_store_begin              put/delete/put_blob succeed
 *      IDLE ------------------> ACTIVE <------------------------+
 *       ^ ^                     |  |  \--------------------------+
 *       | |  sl_store_commit,   |  |  a call fails: txn_fail() aborts
 *       | |  sl_store_abort     |  |  the LMDB transaction at once
 *       | +---------------------+  v
 *       +-- sl_store_commit, -- FAILED   (calls return its failure)
 *           sl_store_abort
 *
 *    The LMDB write transaction exists exactly in ACTIVE (txn_check()).
 *    As a failed one holds nothing, the map may grow before it is ended.
 * 5. Opening (store.h notes 4, 5, 8), in this order: inspect the
 *    directory with plain file calls (a foreign directory sees no write
 *    at all); read data.mdb's first meta page for LMDB's magic; claim the
 *    directory in the in-process registry; take the flocks (a writer: of
 *    "lock", then of the directory, take_lock; a reader: the directory's
 *    shared one, or none beside a live writer, reader_lock); walk
 *    data.mdb unless a live writer holds it (check_data_file); open the
 *    environment; check meta, or initialise it if the environment is
 *    empty.  The environment is opened once, after the lock and the
 *    walk: a second writer and a damaged file never reach LMDB.
 * 6. In-process registry.  LMDB forbids opening one environment twice in a
 *    process (closing the second handle would drop the first one's fcntl
 *    locks).  flock stops a second writer but not a reader beside a
 *    writer, so open handles are listed by the directory's (device, inode)
 *    and a second open of a directory in one process is refused.
 * 7. Log appends.  A checkpoint rewrites only the log's last pages: its
 *    keys all start with the transaction's seq, above every key already
 *    logged.  A put whose key is above the transaction's greatest so far
 *    (the engine writes in key order) uses MDB_APPEND, which fills pages
 *    completely and skips the search; any other key is an ordinary put
 *    into the transaction's own pages, replacing an equal key's entry.
 *    The comparison is LMDB's default one (memcmp, then the shorter key
 *    first), so MDB_APPEND is never refused.
 * 8. The merged view (store.h note 2), for a range of (op, key group)
 *    prefixes, in one read (or the compaction's write) transaction:
 *      a. per logged transaction, seek to [seq][first prefix] and take its
 *         entries up to the last prefix: a sorted run, checked as read;
 *         seeking past the other prefixes skips them unread;
 *      b. merge the runs with a binary heap of them, ordered by their next
 *         entry's key and, on equal keys, newer run first: the top is the
 *         newest version of the smallest key left; the older versions of
 *         it (at most one a run) are skipped.  One pass, no copies, about
 *         2 log2(runs) key comparisons an entry;
 *      c. merge-join them with a cursor over the base range: on equal keys
 *         the log's entry wins; tombstones are dropped.
 *    Log entries point into the map, which stays put while the
 *    transaction is open; a compaction writes only into the other base
 *    until the merge is done, so the pages they point to are not touched.
 * 9. Compaction runs the merged view of every prefix into the empty base
 *    with MDB_APPEND (it arrives in key order), then empties the log and
 *    the old base with mdb_drop (their pages go to LMDB's free list, for
 *    later transactions) and flips "base".  Both bases use the checksum
 *    seed of "state", so a base value is checked when read and rewritten
 *    with the same checksum.
 * 10. Tables (store.h note 6).  A row key is [n][name][key]; the row count
 *    of a table is under [0][name], which no row key can equal (n >= 1).
 *    A put first tries MDB_NOOVERWRITE: success means a new row (+1 to the
 *    transaction's delta for the table), MDB_KEYEXIST means a replacement,
 *    done by a second put at the cursor (MDB_CURRENT); a delete that finds
 *    the row is -1.  Puts and deletes go through one cursor of the
 *    transaction: the writer gives the rows in key order, and LMDB skips
 *    the descent from the root when a key falls on the cursor's page
 *    (store_rows, 1M sorted rows: inserts 0.62 s against 0.68 s with
 *    mdb_put, replacements 0.30 s against 0.73 s, medians of 5).  The commit
 *    adds each table's delta to its stored count before the checkpoint
 *    record, so counts and rows change in the same transaction.  Table
 *    reads come from threads other than the writer's, while it runs: they
 *    never touch the handle's error buffer (their messages go to the
 *    caller's) nor the write transaction, and hold map_lock's read side
 *    for their read transaction, because mdb_env_set_mapsize (grow) must
 *    not run while a transaction of this process is open.  The handle of
 *    "tables" is opened before the store is handed out (a writer creates
 *    the database if an older store lacks it), so concurrent reads never
 *    call mdb_dbi_open, which LMDB allows in one transaction at a time;
 *    the one exception, a read-only handle of an older store opening it
 *    once a writer elsewhere has made it, holds tables_lock for that.
 */
#include "store.h"

#include <assert.h>
#include <stdatomic.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <lmdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "lmdb_check.h"
#include "sluice.h"

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
 * shared lock (lock_directory): 5 s. */
#define STORE_LOCK_WAIT_TRIES 500
#define STORE_LOCK_WAIT_US 10000
#define STORE_FILE_MODE 0644
/* At least LMDB's largest key (511 by default); longer keys are refused
 * before they reach the buffer. */
#define KEY_BUFFER_BYTES 512u
#define STATE_PREFIX_BYTES 4u /* u16 op, u16 key group, big-endian */
#define LOG_SEQ_BYTES 8u      /* u64 seq, big-endian, ahead of a state key */
#define LOG_PREFIX_BYTES (LOG_SEQ_BYTES + STATE_PREFIX_BYTES)
#define LOG_KIND_BYTES 1u     /* put or tombstone, ahead of a log value */
#define BLOB_KEY_BYTES 4u     /* u16 op, u16 instance, big-endian */
#define BLOB_ID_BYTES 8u      /* u64 checkpoint id ahead of a blob */
#define CHECKPOINT_KEY_BYTES 8u
/* LMDB's data file starts with a meta page: a 16-byte page header (u64
 * page number, u16 pad, u16 flags, u16 lower, u16 upper) and then the meta
 * record, whose first field is the u32 magic, in native byte order. */
#define LMDB_MAGIC 0xBEEFC0DEu
#define LMDB_MAGIC_OFFSET 16u
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

/* The kind byte of a log value. */
enum { LOG_PUT = 1, LOG_TOMBSTONE = 2 };

enum txn_state { TXN_IDLE, TXN_ACTIVE, TXN_FAILED };

/* A table written by the open transaction (sl_store_txn_table), and the
 * rows its puts added less those its deletes removed, for the commit's
 * update of the table's row count (note 10). */
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
  MDB_txn *mdb; /* exactly in TXN_ACTIVE (note 4) */
  enum txn_state state;
  int failure; /* TXN_FAILED: what the failing call returned */
  uint64_t seq; /* of this transaction: its log keys start with it */
  uint8_t key[KEY_BUFFER_BYTES];
  /* The greatest state key logged by this transaction (note 7); 0 bytes:
   * none yet. */
  uint8_t last_key[KEY_BUFFER_BYTES];
  size_t last_key_bytes;
  uint32_t *blob_keys; /* op << 16 | instance of each blob put (note 3) */
  size_t blob_count;
  size_t blob_capacity;
  uint8_t *copy; /* a blob's bytes while the commit rewrites it */
  size_t copy_capacity_bytes;
  txn_table tables[SL_STORE_TXN_TABLES]; /* note 10 */
  int table_count;
  /* Note 10: the rows' cursor, opened by the first row put or delete,
   * freed by LMDB when the transaction ends.  Sorted rows then mostly
   * land on the page the cursor is on, skipping the descent. */
  MDB_cursor *rows;
};

/* The buffers of a merged view (note 8): the log entries of its range and
 * their runs.  A compaction uses the store's, kept for the next one (a
 * fresh page costs a fault); a read of state has its own, so instances
 * restore in parallel, each on its thread. */
typedef struct merge_buffers {
  struct log_entry *entries;
  size_t entry_capacity;
  struct log_run *runs;
  size_t run_capacity;
} merge_buffers;

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
  bool registered; /* listed in the registry (note 6) */
  uint64_t latest; /* writer: exact; read-only: as of the open */
  uint64_t next_seq; /* writer: exact; read-only: as of the open */
  uint32_t state_key_max_bytes;
  dev_t dir_device;
  ino_t dir_inode;
  sl_store *registry_next;
  sl_store_txn txn;
  /* The merged view's buffers of compactions (note 8), kept for the next
   * one: a fresh page costs a fault, and the writer compacts again and
   * again.  Malloc'd when first used. */
  struct merge_buffers *merge;
  const _Atomic int *cancel; /* sl_store_set_cancel: stops a compaction */
  sl_store_fault_fn fault;   /* sl_store_set_fault: the fault layer */
  bool compacting;           /* compactions are not faulted */
  void *fault_arg;
  /* Tables (note 10).  tables_open: dbi[DB_TABLES] is a handle (always
   * for a writer; a read-only open of an older store may lack it until a
   * writer adds it).  map_lock: read side held by every table read,
   * write side by sl_store_grow.  tables_lock: serialises the late
   * mdb_dbi_open of "tables" by read-only handles. */
  _Atomic bool tables_open;
  pthread_rwlock_t map_lock;
  pthread_mutex_t tables_lock;
  char error[STORE_ERROR_BYTES];
};

/* ------------------------------------------------------------ bytes */

static void put_be16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)(v >> 8);
  p[1] = (uint8_t)v;
}

static uint16_t get_be16(const uint8_t *p) {
  return (uint16_t)((unsigned)p[0] << 8 | p[1]);
}

static uint32_t get_be32(const uint8_t *p) {
  return (uint32_t)get_be16(p) << 16 | get_be16(p + 2);
}

static void put_be32(uint8_t *p, uint32_t v) {
  put_be16(p, (uint16_t)(v >> 16));
  put_be16(p + 2, (uint16_t)v);
}

static void put_be64(uint8_t *p, uint64_t v) {
  for (int i = 7; i >= 0; i--, v >>= 8)
    p[i] = (uint8_t)v;
}

static uint64_t get_be64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v = v << 8 | p[i];
  return v;
}

static void put_le64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++, v >>= 8)
    p[i] = (uint8_t)v;
}

static uint64_t get_le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}

/* ------------------------------------------------------------ errors */

/* Formats "<dir>: message" into the handle and returns rc, so a failure
 * is reported in one line: return store_fail(s, EINVAL, "...");. */
__attribute__((format(printf, 3, 4))) static int
store_fail(sl_store *s, int rc, const char *format, ...) {
  assert(rc != 0);
  assert(s->dir != 0);
  /* Damage is always named by the file it is in (store.h note 8). */
  bool name_file = rc == SL_ECORRUPT && strncmp(format, "data.mdb", 8) != 0;
  int at = snprintf(s->error, sizeof s->error, "%s: %s", s->dir,
                    name_file ? "data.mdb is damaged: " : "");
  if (at < 0 || (size_t)at >= sizeof s->error)
    return rc; /* the directory alone fills the buffer */
  va_list args;
  va_start(args, format);
  vsnprintf(s->error + at, sizeof s->error - (size_t)at, format, args);
  va_end(args);
  return rc;
}

/* Store.h note 8: LMDB reports a write cut short as EIO ("TODO: Use which
 * error code?" in mdb_page_flush), and on a file system that filled up
 * under a commit that is what it gets: pwrite writes what fits and
 * returns the short count.  Such a write leaves less than a block free,
 * so EIO with under STORE_FULL_DISK_BYTES free is taken for ENOSPC. */
static bool disk_full(const sl_store *s) {
  struct statvfs fs;
  if (statvfs(s->dir, &fs) != 0)
    return false;
  return (uint64_t)fs.f_bavail * fs.f_frsize < STORE_FULL_DISK_BYTES;
}

/* An LMDB (or errno) failure of the step `what`.  A full map says what to
 * do about it (store.h note 3). */
static int lmdb_fail(sl_store *s, int rc, const char *what) {
  if (rc == EIO && disk_full(s))
    rc = ENOSPC;
  if (rc == MDB_MAP_FULL) {
    MDB_envinfo info;
    mdb_env_info(s->env, &info);
    return store_fail(s, rc,
                      "%s: the map of %zu bytes is full (grow it with "
                      "sl_store_grow and write the transaction again)",
                      what, info.me_mapsize);
  }
  if (rc == MDB_CORRUPTED || rc == MDB_PAGE_NOTFOUND)
    return store_fail(s, SL_ECORRUPT, "data.mdb is damaged: %s: %s", what,
                      mdb_strerror(rc)); /* what the walk cannot see */
  if (rc == ENOSPC)
    return store_fail(s, rc, "%s: %s (writing %s/data.mdb)", what,
                      strerror(rc), s->dir);
  return store_fail(s, rc, "%s: %s", what, mdb_strerror(rc));
}

/* Up to MESSAGE_KEY_BYTES bytes of key in hex, "..." if cut. */
static void hex_text(const uint8_t *key, size_t key_bytes, char *out,
                     size_t out_bytes) {
  assert(out_bytes >= 2 * MESSAGE_KEY_BYTES + 4);
  size_t shown = key_bytes < MESSAGE_KEY_BYTES ? key_bytes : MESSAGE_KEY_BYTES;
  for (size_t i = 0; i < shown; i++)
    snprintf(out + 2 * i, out_bytes - 2 * i, "%02x", key[i]);
  snprintf(out + 2 * shown, out_bytes - 2 * shown, "%s",
           key_bytes > shown ? "..." : "");
}

/* The key of an entry in words: "op 3 key group 17 key 6b6579 (3 bytes)",
 * "seq 9 op 3 key group 17 key 6b6579 (3 bytes)", "op 2 instance 0",
 * "checkpoint 12", "\"latest\"". */
static void key_text(int db, const MDB_val *key, char *out, size_t out_bytes) {
  const uint8_t *k = key->mv_data;
  char hex[2 * MESSAGE_KEY_BYTES + 4];
  if ((db == DB_STATE || db == DB_STATE2) &&
      key->mv_size >= STATE_PREFIX_BYTES) {
    hex_text(k + STATE_PREFIX_BYTES, key->mv_size - STATE_PREFIX_BYTES, hex,
             sizeof hex);
    snprintf(out, out_bytes, "op %u key group %u key %s (%zu bytes)",
             get_be16(k), get_be16(k + 2), hex,
             key->mv_size - STATE_PREFIX_BYTES);
  } else if (db == DB_LOG && key->mv_size >= LOG_PREFIX_BYTES) {
    hex_text(k + LOG_PREFIX_BYTES, key->mv_size - LOG_PREFIX_BYTES, hex,
             sizeof hex);
    snprintf(out, out_bytes,
             "seq %" PRIu64 " op %u key group %u key %s (%zu bytes)",
             get_be64(k), get_be16(k + LOG_SEQ_BYTES),
             get_be16(k + LOG_SEQ_BYTES + 2), hex,
             key->mv_size - LOG_PREFIX_BYTES);
  } else if (db == DB_BLOBS && key->mv_size == BLOB_KEY_BYTES) {
    snprintf(out, out_bytes, "op %u instance %u", get_be16(k),
             get_be16(k + 2));
  } else if (db == DB_CHECKPOINTS && key->mv_size == CHECKPOINT_KEY_BYTES) {
    snprintf(out, out_bytes, "checkpoint %" PRIu64, get_be64(k));
  } else if (db == DB_TABLES && key->mv_size >= 1 && k[0] == 0) {
    snprintf(out, out_bytes, "the row count of table \"%.*s\"",
             (int)(key->mv_size - 1), (const char *)k + 1);
  } else if (db == DB_TABLES && key->mv_size >= 1 &&
             key->mv_size >= 1u + k[0]) {
    hex_text(k + 1 + k[0], key->mv_size - 1 - k[0], hex, sizeof hex);
    snprintf(out, out_bytes, "table \"%.*s\" key %s (%zu bytes)", (int)k[0],
             (const char *)k + 1, hex, key->mv_size - 1 - k[0]);
  } else if (db == DB_META && key->mv_size <= MESSAGE_KEY_BYTES) {
    snprintf(out, out_bytes, "\"%.*s\"", (int)key->mv_size, (const char *)k);
  } else {
    hex_text(k, key->mv_size, hex, sizeof hex);
    snprintf(out, out_bytes, "key %s (%zu bytes)", hex, key->mv_size);
  }
}

static int corrupt(sl_store *s, int db, const MDB_val *key,
                   const char *problem) {
  char text[3 * MESSAGE_KEY_BYTES + 64];
  key_text(db, key, text, sizeof text);
  return store_fail(s, SL_ECORRUPT, "data.mdb is damaged: database %s, %s: %s",
                    db_names[db], text, problem);
}

/* ------------------------------------------------------------ values */

/* state2 is the other buffer of one logical database, the base, and
 * shares the seed of state (note 9). */
static XXH64_hash_t checksum_seed(int db) {
  assert(db > 0 && db < DB_COUNT);
  return (XXH64_hash_t)(db == DB_STATE2 ? DB_STATE : db);
}

static uint64_t checksum(int db, const MDB_val *key, const void *payload,
                         size_t payload_bytes) {
  XXH64_hash_t seed = XXH3_64bits_withSeed(key->mv_data, key->mv_size,
                                           checksum_seed(db));
  return XXH3_64bits_withSeed(payload, payload_bytes, seed);
}

/* Checks a value read back from db and returns its payload (the value
 * without the checksum) in *payload.  SL_ECORRUPT names db and key. */
static int value_open(sl_store *s, int db, const MDB_val *key,
                      const MDB_val *value, MDB_val *payload) {
  if (value->mv_size < SL_STORE_CHECKSUM_BYTES)
    return corrupt(s, db, key, "value too short to hold its checksum");
  assert(db > 0 && db < DB_COUNT);
  payload->mv_data = value->mv_data;
  payload->mv_size = value->mv_size - SL_STORE_CHECKSUM_BYTES;
  const uint8_t *stored = (const uint8_t *)value->mv_data + payload->mv_size;
  if (get_le64(stored) != checksum(db, key, payload->mv_data, payload->mv_size))
    return corrupt(s, db, key, "value fails its checksum");
  return 0;
}

/* Puts key -> head || body || checksum into db with MDB_RESERVE (note 2)
 * and flags (0 or MDB_APPEND).  head is a blob's id, a log entry's kind
 * (or nothing). */
static int value_put(sl_store *s, MDB_txn *txn, int db, MDB_val *key,
                     const void *head, size_t head_bytes, const void *body,
                     size_t body_bytes, unsigned flags) {
  assert(key->mv_size > 0 && key->mv_size <= KEY_BUFFER_BYTES);
  assert(body_bytes == 0 || body != 0);
  assert(flags == 0 || flags == MDB_APPEND);
  size_t payload_bytes = head_bytes + body_bytes;
  MDB_val value = {.mv_size = payload_bytes + SL_STORE_CHECKSUM_BYTES,
                   .mv_data = 0};
  if (s->fault && !s->compacting) { /* store.h: checkpoint writes only */
    int injected = s->fault(s->fault_arg, SL_STORE_CALL_PUT);
    if (injected)
      return injected; /* nothing was put */
  }
  int rc = mdb_put(txn, s->dbi[db], key, &value, MDB_RESERVE | flags);
  if (rc != 0)
    return rc;
  uint8_t *at = value.mv_data;
  assert(at != 0);
  if (head_bytes > 0)
    memcpy(at, head, head_bytes);
  if (body_bytes > 0)
    memcpy(at + head_bytes, body, body_bytes);
  put_le64(at + payload_bytes, checksum(db, key, at, payload_bytes));
  return 0;
}

static MDB_val meta_key(const char *name) {
  return (MDB_val){.mv_size = strlen(name), .mv_data = (void *)name};
}

/* Reads and checks meta value name.  MDB_NOTFOUND is returned without a
 * message: what a missing value means is the caller's to say. */
static int meta_get(sl_store *s, MDB_txn *txn, const char *name,
                    MDB_val *payload) {
  MDB_val key = meta_key(name), value;
  int rc = mdb_get(txn, s->dbi[DB_META], &key, &value);
  if (rc == MDB_NOTFOUND)
    return rc;
  if (rc != 0)
    return lmdb_fail(s, rc, "read meta");
  return value_open(s, DB_META, &key, &value, payload);
}

/* Reads meta value name, a u64 ("latest", "next_seq", "base"). */
static int meta_get_u64(sl_store *s, MDB_txn *txn, const char *name,
                        uint64_t *out) {
  MDB_val payload;
  int rc = meta_get(s, txn, name, &payload);
  if (rc == MDB_NOTFOUND)
    return store_fail(s, SL_ECORRUPT, "meta \"%s\" is missing", name);
  if (rc == 0 && payload.mv_size != sizeof(uint64_t))
    return store_fail(s, SL_ECORRUPT, "meta \"%s\" has %zu bytes, not 8",
                      name, payload.mv_size);
  if (rc == 0)
    *out = get_le64(payload.mv_data);
  return rc;
}

static int meta_put_u64(sl_store *s, MDB_txn *txn, const char *name,
                        uint64_t v) {
  uint8_t bytes[sizeof(uint64_t)];
  put_le64(bytes, v);
  MDB_val key = meta_key(name);
  return value_put(s, txn, DB_META, &key, 0, 0, bytes, sizeof bytes, 0);
}

/* The database number of the current base (meta "base", note 1). */
static int meta_get_base(sl_store *s, MDB_txn *txn, int *db) {
  uint64_t index = 0;
  int rc = meta_get_u64(s, txn, "base", &index);
  if (rc == 0 && index > 1)
    rc = store_fail(s, SL_ECORRUPT, "meta \"base\" is %" PRIu64
                    ", not 0 or 1", index);
  if (rc == 0)
    *db = base_dbs[index];
  return rc;
}

/* ------------------------------------------------------------ registry */

/* Open handles by directory identity (note 6).  The list is as long as the
 * number of stores open in the process; the mutex guards it only. */
static pthread_mutex_t registry_mutex = PTHREAD_MUTEX_INITIALIZER;
static sl_store *registry_head;

static int registry_add(sl_store *s) {
  assert(!s->registered);
  bool taken = false;
  pthread_mutex_lock(&registry_mutex);
  for (const sl_store *p = registry_head; p && !taken; p = p->registry_next)
    taken = p->dir_device == s->dir_device && p->dir_inode == s->dir_inode;
  if (!taken) {
    s->registry_next = registry_head;
    registry_head = s;
    s->registered = true;
  }
  pthread_mutex_unlock(&registry_mutex);
  if (taken)
    return store_fail(s, SL_ESTORE,
                      "in use: already open in this process (LMDB allows "
                      "one handle per process)");
  return 0;
}

static void registry_remove(sl_store *s) {
  if (!s->registered)
    return;
  pthread_mutex_lock(&registry_mutex);
  sl_store **link = &registry_head;
  while (*link != s) {
    assert(*link != 0); /* a registered handle is on the list */
    link = &(*link)->registry_next;
  }
  *link = s->registry_next;
  pthread_mutex_unlock(&registry_mutex);
  s->registered = false;
}

/* ------------------------------------------------------------ opening */

/* dir/name into out. */
static int dir_path(sl_store *s, const char *name, char *out,
                    size_t out_bytes) {
  int n = snprintf(out, out_bytes, "%s/%s", s->dir, name);
  if (n < 0 || (size_t)n >= out_bytes)
    return store_fail(s, ENAMETOOLONG, "path too long");
  return 0;
}

/* fsync a directory, so the entries created in it survive a power cut. */
static int fsync_directory(sl_store *s, const char *path) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || fsync(fd) != 0) {
    int e = errno;
    if (fd >= 0)
      close(fd);
    return store_fail(s, e, "fsync of directory %s: %s", path, strerror(e));
  }
  close(fd);
  return 0;
}

/* Scans the directory's names: sets *has_data if data.mdb is there, and
 * refuses a directory that holds other files but no data.mdb (note 4).
 * "lock" and "lock.mdb" alone are ours: an interrupted creation; so is
 * the staging directory of an interrupted install (store.h note 7). */
static int inspect_entries(sl_store *s, bool *has_data) {
  DIR *d = opendir(s->dir);
  if (!d)
    return store_fail(s, errno, "cannot read the directory: %s",
                      strerror(errno));
  bool foreign = false;
  struct dirent *entry;
  /* Bounded by the directory's entries; both facts need the whole scan. */
  errno = 0; /* readdir's end and its failure differ only in errno */
  while ((entry = readdir(d)) != 0) {
    const char *name = entry->d_name;
    if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
      continue;
    if (strcmp(name, "data.mdb") == 0)
      *has_data = true;
    else if (strcmp(name, "lock") != 0 && strcmp(name, "lock.mdb") != 0 &&
             strcmp(name, SL_STORE_STAGING_NAME) != 0) /* store.h note 7 */
      foreign = true;
  }
  int read_errno = errno;
  closedir(d);
  if (read_errno != 0)
    return store_fail(s, read_errno, "cannot read the directory: %s",
                      strerror(read_errno));
  if (foreign && !*has_data)
    return store_fail(s, SL_ESTORE,
                      "not a sluice state directory (it holds other files "
                      "and no data.mdb)");
  return 0;
}

/* Note 5, first step: the path must be a directory (a writer creates a
 * missing one, *created) and must not hold someone else's files. */
static int inspect_dir(sl_store *s, bool *has_data, bool *created) {
  struct stat st;
  if (stat(s->dir, &st) != 0) {
    if (errno != ENOENT)
      return store_fail(s, errno, "cannot stat: %s", strerror(errno));
    if (s->read_only)
      return store_fail(s, ENOENT,
                        "no such directory (a read-only open creates no "
                        "store)");
    if (mkdir(s->dir, STORE_DIR_MODE) != 0 && errno != EEXIST)
      return store_fail(s, errno, "cannot create the directory: %s",
                        strerror(errno));
    *created = true;
    if (stat(s->dir, &st) != 0)
      return store_fail(s, errno, "cannot stat: %s", strerror(errno));
  }
  if (!S_ISDIR(st.st_mode))
    return store_fail(s, SL_ESTORE, "not a directory");
  s->dir_device = st.st_dev;
  s->dir_inode = st.st_ino;
  return inspect_entries(s, has_data);
}

/* Is data.mdb an LMDB file?  LMDB would refuse a foreign file as well
 * (MDB_INVALID), but only after creating lock.mdb, and a foreign
 * directory must stay as it was.  *empty: a 0-byte file, left by a
 * creation interrupted before LMDB wrote its meta pages; LMDB initialises
 * it like a missing one. */
static int inspect_data_file(sl_store *s, bool *empty) {
  char path[PATH_MAX];
  int rc = dir_path(s, "data.mdb", path, sizeof path);
  if (rc != 0)
    return rc;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return store_fail(s, errno, "cannot open data.mdb: %s", strerror(errno));
  struct stat st;
  uint8_t head[LMDB_MAGIC_OFFSET + sizeof(uint32_t)];
  bool stated = fstat(fd, &st) == 0;
  bool regular = stated && S_ISREG(st.st_mode);
  ssize_t got = regular ? pread(fd, head, sizeof head, 0) : -1;
  int read_errno = errno;
  close(fd);
  if (stated && !regular)
    return store_fail(s, SL_ESTORE, "data.mdb is not a regular file");
  if (got < 0)
    return store_fail(s, read_errno, "cannot read data.mdb: %s",
                      strerror(read_errno));
  *empty = got == 0;
  uint32_t magic = 0;
  if ((size_t)got == sizeof head)
    memcpy(&magic, head + LMDB_MAGIC_OFFSET, sizeof magic);
  if (!*empty && magic != LMDB_MAGIC)
    return store_fail(s, SL_ESTORE,
                      "data.mdb is not an LMDB file (its first page lacks "
                      "LMDB's magic)");
  return 0;
}

/* Opens the directory itself for its flock (store.h note 5). */
static int open_dir_fd(sl_store *s) {
  assert(s->dir_fd < 0);
  s->dir_fd = open(s->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (s->dir_fd < 0)
    return store_fail(s, errno, "cannot open the directory: %s",
                      strerror(errno));
  return 0;
}

/* The directory's exclusive flock for a writer that holds the "lock"
 * file's (store.h note 5).  A shared holder is a reader that found no
 * writer: inspection is short, so it is waited for, a bounded time; a
 * writer whose "lock" file was deleted under it also holds the directory,
 * and the wait ends in the same refusal. */
static int lock_directory(sl_store *s) {
  int rc = open_dir_fd(s);
  if (rc != 0)
    return rc;
  /* Bounded: STORE_LOCK_WAIT_TRIES waits of STORE_LOCK_WAIT_US. */
  for (int attempt = 0; attempt <= STORE_LOCK_WAIT_TRIES; attempt++) {
    if (flock(s->dir_fd, LOCK_EX | LOCK_NB) == 0)
      return 0;
    if (errno != EWOULDBLOCK)
      return store_fail(s, errno, "cannot lock the directory: %s",
                        strerror(errno));
    struct timespec wait = {0, STORE_LOCK_WAIT_US * 1000L};
    nanosleep(&wait, 0);
  }
  return store_fail(s, SL_ESTORE,
                    "in use by another process (it holds the lock of the "
                    "directory itself)");
}

/* The writer's exclusive lock (store.h note 5): first the "lock" file's
 * flock (writers of every sluice version take it), then the directory's
 * own, which no unlink can take away.  *created: this call made the lock
 * file, so a refusal later may remove it again; *flocked: this call holds
 * its flock (also when the directory's lock is then refused). */
static int take_lock(sl_store *s, bool *created, bool *flocked) {
  assert(!s->read_only);
  assert(s->lock_fd < 0);
  char path[PATH_MAX];
  int rc = dir_path(s, "lock", path, sizeof path);
  if (rc != 0)
    return rc;
  int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, STORE_FILE_MODE);
  *created = fd >= 0;
  if (fd < 0 && errno == EEXIST)
    fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0)
    return store_fail(s, errno, "cannot open the lock file: %s",
                      strerror(errno));
  s->lock_fd = fd;
  /* Bounded: STORE_LOCK_WAIT_TRIES waits of STORE_LOCK_WAIT_US, and only
   * while readers share the file (reader_lock); a writer holds it
   * exclusively, and is refused at once. */
  for (int attempt = 0;; attempt++) {
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
      *flocked = true;
      return lock_directory(s);
    }
    if (errno != EWOULDBLOCK)
      return store_fail(s, errno, "cannot lock %s: %s", path,
                        strerror(errno));
    bool readers = flock(fd, LOCK_SH | LOCK_NB) == 0;
    if (readers)
      flock(fd, LOCK_UN);
    if (!readers || attempt == STORE_LOCK_WAIT_TRIES)
      return store_fail(s, SL_ESTORE,
                        "in use by another process (it holds %s)", path);
    struct timespec wait = {0, STORE_LOCK_WAIT_US * 1000L};
    nanosleep(&wait, 0);
  }
}

/* A reader's view of the writer's lock (store.h note 5): a shared flock
 * of the directory, kept while the handle lives, if no writer holds it
 * (*writer false); else *writer is true and nothing is held. */
static int reader_lock(sl_store *s, bool *writer) {
  assert(s->read_only && s->lock_fd < 0);
  int rc = open_dir_fd(s);
  if (rc != 0)
    return rc;
  *writer = flock(s->dir_fd, LOCK_SH | LOCK_NB) != 0;
  if (*writer && errno != EWOULDBLOCK)
    return store_fail(s, errno, "cannot lock the directory: %s",
                      strerror(errno));
  if (*writer)
    return 0;
  /* A writer of an older version holds only the "lock" file: share it
   * too, if it exists (a reader creates nothing), or see that writer. */
  char path[PATH_MAX];
  rc = dir_path(s, "lock", path, sizeof path);
  if (rc != 0)
    return rc;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return errno == ENOENT ? 0
                           : store_fail(s, errno, "cannot open %s: %s", path,
                                        strerror(errno));
  if (flock(fd, LOCK_SH | LOCK_NB) == 0) {
    s->lock_fd = fd; /* kept, like the directory's, while the handle lives */
    return 0;
  }
  int e = errno;
  close(fd);
  if (e != EWOULDBLOCK)
    return store_fail(s, e, "cannot lock %s: %s", path, strerror(e));
  flock(s->dir_fd, LOCK_UN); /* a live writer: read beside it through LMDB */
  *writer = true;
  return 0;
}

/* Store.h note 8: the walk of data.mdb before LMDB maps it. */
static int check_data_file(sl_store *s) {
  char path[PATH_MAX];
  int rc = dir_path(s, "data.mdb", path, sizeof path);
  if (rc != 0)
    return rc;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return store_fail(s, errno, "cannot open %s: %s", path, strerror(errno));
  /* The walk's message names the file itself: it goes in whole. */
  rc = sl_lmdb_check_file(fd, path, SL_STORE_MAX_MAP_BYTES, 0, s->error,
                          sizeof s->error);
  close(fd);
  if (rc == ENOMEM && !s->error[0])
    return store_fail(s, ENOMEM, "out of memory");
  return rc;
}

static int open_env(sl_store *s, bool writemap) {
  assert(s->env == 0);
  assert(s->registered); /* note 6: only one handle gets this far */
  int rc = mdb_env_create(&s->env);
  if (rc != 0) {
    s->env = 0;
    return lmdb_fail(s, rc, "mdb_env_create");
  }
  rc = mdb_env_set_maxdbs(s->env, DB_COUNT - 1);
  if (rc != 0)
    return lmdb_fail(s, rc, "mdb_env_set_maxdbs");
  /* Every instance restores on its own thread, each with a read
   * transaction: room for more than LMDB's default 126 readers. */
  rc = mdb_env_set_maxreaders(s->env, STORE_MAX_READERS);
  if (rc != 0)
    return lmdb_fail(s, rc, "mdb_env_set_maxreaders");
  /* NOTLS: a read transaction is not tied to its thread (the store moves
   * between the restoring thread and the writer thread).  No map size is
   * set yet, so LMDB adopts the stored one (open_map_size). */
  /* WRITEMAP (STORE_WRITEMAP) extends the data file to the map size,
   * sparsely — which is why an existing directory is then first checked
   * without it (open_store). */
  unsigned flags = MDB_NOTLS | (s->no_sync ? MDB_NOSYNC : 0) |
                   (s->read_only ? MDB_RDONLY : 0) |
                   (s->no_lock_file ? MDB_NOLOCK : 0) |
                   (writemap ? MDB_WRITEMAP : 0);
  rc = mdb_env_open(s->env, s->dir, flags, STORE_FILE_MODE);
  if (rc == MDB_INVALID || rc == MDB_VERSION_MISMATCH)
    return store_fail(s, SL_ESTORE,
                      "data.mdb is not an LMDB file this LMDB reads (%s)",
                      mdb_strerror(rc));
  if (rc != 0)
    return lmdb_fail(s, rc, "mdb_env_open");
  int key_max_bytes = mdb_env_get_maxkeysize(s->env);
  assert(key_max_bytes > (int)LOG_PREFIX_BYTES);
  if ((unsigned)key_max_bytes > KEY_BUFFER_BYTES)
    key_max_bytes = KEY_BUFFER_BYTES; /* an LMDB built with larger keys */
  /* The longest log key is the limit: the base's keys are shorter. */
  s->state_key_max_bytes = (uint32_t)key_max_bytes - LOG_PREFIX_BYTES;
  return 0;
}

/* The map is at least the asked initial size, and never smaller than the
 * stored one (a store that grew stays grown).  No transaction is open. */
static int open_map_size(sl_store *s, uint64_t initial_map_bytes) {
  uint64_t want = initial_map_bytes ? initial_map_bytes
                                    : STORE_DEFAULT_MAP_BYTES;
  if (s->read_only || sl_store_map_bytes(s) >= want)
    return 0;
  int rc = mdb_env_set_mapsize(s->env, (size_t)want);
  if (rc != 0)
    return lmdb_fail(s, rc, "mdb_env_set_mapsize");
  assert(sl_store_map_bytes(s) >= want);
  return 0;
}

/* magic, then format, then graph (store.h note 4: each check may rely on
 * the ones before it). */
static int meta_check_identity(sl_store *s, MDB_txn *txn,
                               const char *fingerprint) {
  MDB_val v;
  int rc = meta_get(s, txn, "magic", &v);
  if (rc == MDB_NOTFOUND && meta_get(s, txn, "format", &v) == 0)
    return store_fail(s, SL_ECORRUPT, "data.mdb is damaged: meta "
                      "\"magic\" is missing, \"format\" is there");
  if (rc == MDB_NOTFOUND || (rc == 0 && (v.mv_size != STORE_MAGIC_BYTES ||
                                         memcmp(v.mv_data, STORE_MAGIC,
                                                STORE_MAGIC_BYTES) != 0)))
    return store_fail(s, SL_ESTORE,
                      "an LMDB environment, but not a sluice store");
  if (rc == 0)
    rc = meta_get(s, txn, "format", &v);
  if (rc == MDB_NOTFOUND || (rc == 0 && v.mv_size != sizeof(uint32_t)))
    return store_fail(s, SL_ECORRUPT,
                      "data.mdb is damaged: meta \"format\" is missing or "
                      "bad");
  if (rc != 0)
    return rc;
  uint32_t format = (uint32_t)((const uint8_t *)v.mv_data)[0] |
                    (uint32_t)((const uint8_t *)v.mv_data)[1] << 8 |
                    (uint32_t)((const uint8_t *)v.mv_data)[2] << 16 |
                    (uint32_t)((const uint8_t *)v.mv_data)[3] << 24;
  if (format > SL_STORE_FORMAT_VERSION)
    return store_fail(s, SL_ESTORE,
                      "store format version %" PRIu32 " is newer than this "
                      "sluice's, %u",
                      format, SL_STORE_FORMAT_VERSION);
  if (format < SL_STORE_FORMAT_VERSION) /* no converter: no users yet */
    return store_fail(s, SL_ESTORE,
                      "store format version %" PRIu32 " is older than this "
                      "sluice's, %u, which does not read it (start from an "
                      "empty directory)",
                      format, SL_STORE_FORMAT_VERSION);
  if ((rc = meta_get(s, txn, "graph", &v)) == MDB_NOTFOUND)
    return store_fail(s, SL_ECORRUPT, "meta \"graph\" is missing");
  if (rc != 0 || !fingerprint)
    return rc; /* read-only opens may skip the graph check */
  size_t bytes = strlen(fingerprint);
  if (v.mv_size == bytes && memcmp(v.mv_data, fingerprint, bytes) == 0)
    return 0;
  int shown = MESSAGE_FINGERPRINT_BYTES;
  return store_fail(s, SL_ESTORE,
                    "written by a different job graph: the store has "
                    "\"%.*s%s\", this job has \"%.*s%s\"",
                    v.mv_size < (size_t)shown ? (int)v.mv_size : shown,
                    (const char *)v.mv_data,
                    v.mv_size > (size_t)shown ? "..." : "",
                    bytes < (size_t)shown ? (int)bytes : shown, fingerprint,
                    bytes > (size_t)shown ? "..." : "");
}

/* Opens the named databases (they exist: meta_init made them together),
 * and "tables" if it exists (store.h note 6: older stores lack it). */
static int meta_open_databases(sl_store *s, MDB_txn *txn) {
  for (int db = DB_CHECKPOINTS; db < DB_TABLES; db++) {
    int rc = mdb_dbi_open(txn, db_names[db], 0, &s->dbi[db]);
    if (rc == MDB_NOTFOUND || rc == MDB_INCOMPATIBLE)
      return store_fail(s, SL_ECORRUPT, "the database %s is missing",
                        db_names[db]);
    if (rc != 0)
      return lmdb_fail(s, rc, "open a database");
  }
  int rc = mdb_dbi_open(txn, db_names[DB_TABLES], 0, &s->dbi[DB_TABLES]);
  if (rc == MDB_NOTFOUND)
    return 0;
  if (rc == MDB_INCOMPATIBLE)
    return store_fail(s, SL_ECORRUPT, "the database tables is not one");
  if (rc != 0)
    return lmdb_fail(s, rc, "open the database tables");
  atomic_store(&s->tables_open, true);
  return 0;
}

/* A writer of a store made before tables existed adds the (empty)
 * database, so that no later transaction needs to create it (note 10). */
static int tables_create(sl_store *s) {
  assert(!s->read_only);
  MDB_txn *txn;
  int rc = mdb_txn_begin(s->env, 0, 0, &txn);
  if (rc != 0)
    return lmdb_fail(s, rc, "begin the transaction that adds tables");
  rc = mdb_dbi_open(txn, db_names[DB_TABLES], MDB_CREATE, &s->dbi[DB_TABLES]);
  if (rc != 0) {
    mdb_txn_abort(txn);
    return lmdb_fail(s, rc, "add the database tables");
  }
  rc = mdb_txn_commit(txn); /* durable unless no_sync, like a checkpoint */
  if (rc != 0)
    return lmdb_fail(s, rc, "commit the database tables");
  atomic_store(&s->tables_open, true);
  return 0;
}

/* Every log key has a seq below "next_seq" (store.h note 2): else the
 * next transaction's appends would land among older entries. */
static int meta_check_log(sl_store *s, MDB_txn *txn) {
  MDB_cursor *cursor;
  int rc = mdb_cursor_open(txn, s->dbi[DB_LOG], &cursor);
  if (rc != 0)
    return lmdb_fail(s, rc, "open a log cursor");
  MDB_val key, value;
  rc = mdb_cursor_get(cursor, &key, &value, MDB_LAST);
  if (rc == MDB_NOTFOUND)
    rc = 0; /* an empty log */
  else if (rc != 0)
    rc = lmdb_fail(s, rc, "read the log");
  else if (key.mv_size < LOG_PREFIX_BYTES)
    rc = corrupt(s, DB_LOG, &key, "key shorter than its prefix");
  else if (get_be64(key.mv_data) >= s->next_seq)
    rc = corrupt(s, DB_LOG, &key, "seq not below meta \"next_seq\"");
  mdb_cursor_close(cursor);
  return rc;
}

/* No meta database: fine if the environment holds nothing at all (*fresh),
 * else it is someone else's. */
static int check_empty(sl_store *s, MDB_txn *txn, bool *fresh) {
  MDB_dbi main_dbi;
  MDB_stat st;
  int rc = mdb_dbi_open(txn, 0, 0, &main_dbi);
  if (rc == 0)
    rc = mdb_stat(txn, main_dbi, &st);
  if (rc != 0)
    return lmdb_fail(s, rc, "look into the environment");
  *fresh = st.ms_entries == 0;
  MDB_dbi other;
  if (!*fresh &&
      mdb_dbi_open(txn, db_names[DB_CHECKPOINTS], 0, &other) == 0)
    return store_fail(s, SL_ECORRUPT, "data.mdb is damaged: the database "
                      "meta is missing, the others are there");
  if (!*fresh)
    return store_fail(s, SL_ESTORE,
                      "an LMDB environment, but not a sluice store");
  return 0;
}

/* Checks meta (store.h note 4) and loads "latest".  *fresh: the
 * environment holds nothing at all, so meta_init may make it a store. */
static int meta_check(sl_store *s, const char *fingerprint, bool *fresh) {
  MDB_txn *txn;
  int rc = mdb_txn_begin(s->env, 0, MDB_RDONLY, &txn);
  if (rc != 0)
    return lmdb_fail(s, rc, "begin a read transaction");
  rc = mdb_dbi_open(txn, db_names[DB_META], 0, &s->dbi[DB_META]);
  if (rc == MDB_NOTFOUND) {
    rc = check_empty(s, txn, fresh);
    mdb_txn_abort(txn);
    return rc;
  }
  if (rc == MDB_INCOMPATIBLE) /* "meta" is a plain key of someone else's */
    rc = store_fail(s, SL_ESTORE,
                    "an LMDB environment, but not a sluice store");
  else if (rc != 0)
    rc = lmdb_fail(s, rc, "open the meta database");
  if (rc == 0)
    rc = meta_check_identity(s, txn, fingerprint);
  int base_db = DB_STATE;
  if (rc == 0)
    rc = meta_get_u64(s, txn, "latest", &s->latest);
  if (rc == 0)
    rc = meta_get_u64(s, txn, "next_seq", &s->next_seq);
  if (rc == 0 && (s->next_seq == 0 || s->next_seq == UINT64_MAX))
    rc = store_fail(s, SL_ECORRUPT, "meta \"next_seq\" is %" PRIu64
                    ", not a seq a transaction may take", s->next_seq);
  if (rc == 0) /* checked here; every transaction reads it again */
    rc = meta_get_base(s, txn, &base_db);
  if (rc == 0)
    rc = meta_open_databases(s, txn);
  if (rc == 0)
    rc = meta_check_log(s, txn);
  if (rc != 0) {
    mdb_txn_abort(txn);
    return rc;
  }
  /* Committing a read transaction keeps the handles it opened. */
  rc = mdb_txn_commit(txn);
  return rc != 0 ? lmdb_fail(s, rc, "end the read transaction") : 0;
}

/* Makes an empty environment a store: the six databases and meta, in one
 * durable transaction. */
static int meta_init(sl_store *s, const char *fingerprint) {
  assert(!s->read_only);
  assert(fingerprint != 0);
  MDB_txn *txn;
  int rc = mdb_txn_begin(s->env, 0, 0, &txn);
  if (rc != 0)
    return lmdb_fail(s, rc, "begin the initial transaction");
  for (int db = DB_META; db < DB_COUNT && rc == 0; db++)
    rc = mdb_dbi_open(txn, db_names[db], MDB_CREATE, &s->dbi[db]);
  uint8_t format[4] = {(uint8_t)SL_STORE_FORMAT_VERSION,
                       (uint8_t)(SL_STORE_FORMAT_VERSION >> 8),
                       (uint8_t)(SL_STORE_FORMAT_VERSION >> 16),
                       (uint8_t)(SL_STORE_FORMAT_VERSION >> 24)};
  MDB_val key = meta_key("magic");
  if (rc == 0)
    rc = value_put(s, txn, DB_META, &key, 0, 0, STORE_MAGIC,
                   STORE_MAGIC_BYTES, 0);
  key = meta_key("format");
  if (rc == 0)
    rc = value_put(s, txn, DB_META, &key, 0, 0, format, sizeof format, 0);
  key = meta_key("graph");
  if (rc == 0)
    rc = value_put(s, txn, DB_META, &key, 0, 0, fingerprint,
                   strlen(fingerprint), 0);
  if (rc == 0)
    rc = meta_put_u64(s, txn, "latest", 0);
  if (rc == 0)
    rc = meta_put_u64(s, txn, "next_seq", 1);
  if (rc == 0)
    rc = meta_put_u64(s, txn, "base", 0);
  if (rc != 0) {
    mdb_txn_abort(txn);
    return lmdb_fail(s, rc, "initialise the store");
  }
  rc = mdb_txn_commit(txn);
  if (rc == 0 && s->no_sync)
    rc = mdb_env_sync(s->env, 1); /* durable even so */
  if (rc != 0)
    return lmdb_fail(s, rc, "commit the initial transaction");
  s->latest = 0;
  s->next_seq = 1;
  atomic_store(&s->tables_open, true);
  /* data.mdb and lock are new entries of the directory. */
  return fsync_directory(s, s->dir);
}

/* Note 5 after the lock: the environment and its meta. */
static int open_store(sl_store *s, const sl_store_options *options,
                      bool existing) {
  bool fresh = false;
  if (existing && !s->read_only && STORE_WRITEMAP) {
    /* Check an existing environment without WRITEMAP first: refusing it
     * (someone else's, another graph, a newer format) must leave data.mdb
     * untouched, and a WRITEMAP open would extend it to the map size. */
    int rc = open_env(s, false);
    if (rc == 0)
      rc = meta_check(s, options->graph_fingerprint, &fresh);
    mdb_env_close(s->env);
    s->env = 0;
    memset(s->dbi, 0, sizeof s->dbi);
    atomic_store(&s->tables_open, false);
    if (rc != 0)
      return rc;
  }
  int rc = open_env(s, STORE_WRITEMAP && !s->read_only);
  if (rc == 0)
    rc = meta_check(s, options->graph_fingerprint, &fresh);
  if (rc == 0 && fresh && s->read_only)
    return store_fail(s, ENOENT,
                      "holds no sluice store yet (a read-only open creates "
                      "none)");
  if (rc == 0)
    rc = open_map_size(s, options->initial_map_bytes);
  if (rc == 0 && fresh)
    rc = meta_init(s, options->graph_fingerprint);
  if (rc == 0 && !s->read_only && !atomic_load(&s->tables_open))
    rc = tables_create(s);
  return rc;
}

/* Note 5, every step. */
static int open_steps(sl_store *s, const sl_store_options *options) {
  bool has_data = false, data_empty = false, dir_created = false;
  int rc = inspect_dir(s, &has_data, &dir_created);
  if (rc == 0 && has_data)
    rc = inspect_data_file(s, &data_empty);
  if (rc == 0 && s->read_only && (!has_data || data_empty))
    rc = store_fail(s, ENOENT,
                    "holds no sluice store (a read-only open creates none)");
  if (rc == 0)
    rc = registry_add(s);
  bool lock_created = false, locked = false, writer_live = false;
  if (rc == 0 && !s->read_only)
    rc = take_lock(s, &lock_created, &locked);
  if (rc == 0 && s->read_only)
    rc = reader_lock(s, &writer_live);
  /* Note 5: a reader that keeps writers out needs no lock.mdb, and makes
   * or writes none. */
  if (rc == 0 && s->read_only && !writer_live)
    s->no_lock_file = true;
  /* Note 8: a store a live writer holds was walked when it opened, and
   * its pages change under a walk; every other one is walked now. */
  if (rc == 0 && has_data && !data_empty && !writer_live)
    rc = check_data_file(s);
  if (rc == 0)
    rc = open_store(s, options, has_data && !data_empty);
  if (rc == SL_ESTORE && lock_created && locked) {
    /* Refused after the lock (someone else's LMDB environment): leave the
     * directory as it was.  This open made the file and holds its lock; an
     * opener that got the file meanwhile is refused the same way. */
    char path[PATH_MAX];
    if (dir_path(s, "lock", path, sizeof path) == 0)
      unlink(path);
  }
  if (rc == 0 && dir_created && !s->no_sync) {
    /* The new directory's own entry, in its parent. */
    char parent[PATH_MAX];
    snprintf(parent, sizeof parent, "%s/..", s->dir);
    rc = fsync_directory(s, parent);
  }
  return rc;
}

int sl_store_open(const char *dir, const sl_store_options *options,
                  sl_store **store, char *err, size_t err_bytes) {
  if (store)
    *store = 0;
  if (err && err_bytes > 0)
    err[0] = 0;
  if (!dir || !options || !store ||
      (!options->read_only && !options->graph_fingerprint)) {
    if (err && err_bytes > 0)
      snprintf(err, err_bytes, "sl_store_open: %s is NULL",
               !dir ? "dir" : !options ? "options" : !store ? "store"
                                                           : "the fingerprint");
    return EINVAL;
  }
  sl_store *s = calloc(1, sizeof *s);
  char *dir_copy = strdup(dir);
  if (!s || !dir_copy) {
    free(s);
    free(dir_copy);
    if (err && err_bytes > 0)
      snprintf(err, err_bytes, "%s: out of memory", dir);
    return ENOMEM;
  }
  s->dir = dir_copy;
  s->lock_fd = -1;
  s->dir_fd = -1;
  s->read_only = options->read_only != 0;
  s->no_lock_file = s->read_only && options->no_lock_file != 0;
  s->no_sync = options->no_sync != 0;
  s->txn.store = s;
  s->txn.state = TXN_IDLE;
  atomic_init(&s->tables_open, false);
  pthread_rwlock_init(&s->map_lock, 0);
  pthread_mutex_init(&s->tables_lock, 0);
  int rc = open_steps(s, options);
  if (rc != 0) {
    if (err && err_bytes > 0)
      snprintf(err, err_bytes, "%s", s->error);
    sl_store_close(s);
    return rc;
  }
  assert(s->env != 0);
  assert(s->read_only || (s->lock_fd >= 0 && s->dir_fd >= 0));
  assert(!s->no_lock_file || s->read_only);
  *store = s;
  return 0;
}

void sl_store_close(sl_store *s) {
  if (!s)
    return;
  if (s->txn.state == TXN_ACTIVE)
    mdb_txn_abort(s->txn.mdb);
  /* The environment closes before the lock is released, so the next
   * writer never overlaps with it. */
  if (s->env)
    mdb_env_close(s->env);
  if (s->lock_fd >= 0)
    close(s->lock_fd);
  if (s->dir_fd >= 0)
    close(s->dir_fd); /* releases the directory's flock */
  registry_remove(s);
  free(s->txn.blob_keys);
  free(s->txn.copy);
  if (s->merge) {
    free(s->merge->entries);
    free(s->merge->runs);
    free(s->merge);
  }
  pthread_rwlock_destroy(&s->map_lock);
  pthread_mutex_destroy(&s->tables_lock);
  free(s->dir);
  free(s);
}

const char *sl_store_error(const sl_store *s) { return s ? s->error : ""; }

uint64_t sl_store_latest(const sl_store *s) { return s->latest; }

uint64_t sl_store_map_bytes(const sl_store *s) {
  MDB_envinfo info;
  int rc = mdb_env_info(s->env, &info);
  assert(rc == 0); /* it only copies fields */
  return rc == 0 ? (uint64_t)info.me_mapsize : 0;
}

/* ------------------------------------------------------------ writing */

/* The transaction invariant of note 4 (for asserts). */
__attribute__((unused)) static bool txn_check(const sl_store_txn *t) {
  (void)t; /* only the asserts read it, and NDEBUG removes them */
  assert(t->store && &t->store->txn == t);
  assert((t->state == TXN_ACTIVE) == (t->mdb != 0));
  assert((t->state == TXN_FAILED) == (t->failure != 0));
  assert(t->blob_count <= t->blob_capacity);
  assert(t->last_key_bytes <= KEY_BUFFER_BYTES);
  assert(t->state == TXN_IDLE || t->seq == t->store->next_seq);
  return true;
}

/* 0 if t may take a put; else what the caller gets instead. */
static int txn_usable(sl_store_txn *t) {
  if (!t)
    return EINVAL;
  assert(txn_check(t));
  if (t->state == TXN_FAILED)
    return t->failure; /* it stays failed (note 4) */
  if (t->state == TXN_IDLE)
    return store_fail(t->store, EINVAL, "the transaction has ended");
  return 0;
}

/* ACTIVE -> FAILED: discard everything written at once (note 4).  rc comes
 * from a *_fail call, so the message is already in place. */
static int txn_fail(sl_store_txn *t, int rc) {
  assert(t->state == TXN_ACTIVE);
  assert(rc != 0);
  mdb_txn_abort(t->mdb);
  t->mdb = 0;
  t->rows = 0;
  t->state = TXN_FAILED;
  t->failure = rc;
  assert(txn_check(t));
  return rc;
}

/* ACTIVE or FAILED -> IDLE, discarding what is written. */
static void txn_end(sl_store_txn *t) {
  if (t->state == TXN_ACTIVE)
    mdb_txn_abort(t->mdb);
  t->mdb = 0;
  t->state = TXN_IDLE;
  t->failure = 0;
  t->blob_count = 0;
  t->table_count = 0;
  t->rows = 0; /* LMDB freed it with the transaction */
  assert(txn_check(t));
}

int sl_store_begin(sl_store *s, sl_store_txn **txn) {
  *txn = 0;
  if (s->read_only)
    return store_fail(s, EACCES, "begin: the store is open read-only");
  if (s->txn.state != TXN_IDLE)
    return store_fail(s, EBUSY,
                      "begin: a transaction is open (end it with "
                      "sl_store_commit or sl_store_abort)");
  assert(s->next_seq > 0 && s->next_seq < UINT64_MAX); /* meta_check */
  MDB_txn *mdb;
  assert(txn_check(&s->txn));
  assert(s->txn.blob_count == 0); /* txn_end cleared it */
  int rc = mdb_txn_begin(s->env, 0, 0, &mdb);
  if (rc != 0)
    return lmdb_fail(s, rc, "begin a write transaction");
  s->txn.mdb = mdb;
  s->txn.state = TXN_ACTIVE;
  s->txn.blob_count = 0;
  s->txn.table_count = 0;
  s->txn.rows = 0;
  s->txn.seq = s->next_seq;
  s->txn.last_key_bytes = 0;
  assert(txn_check(&s->txn));
  *txn = &s->txn;
  return 0;
}

/* The log key (seq, op, key group, key) in the transaction's buffer. */
static MDB_val log_key(sl_store_txn *t, uint16_t op, uint16_t key_group,
                       const void *key, uint32_t key_bytes) {
  assert(key_bytes <= KEY_BUFFER_BYTES - LOG_PREFIX_BYTES);
  put_be64(t->key, t->seq);
  put_be16(t->key + LOG_SEQ_BYTES, op);
  put_be16(t->key + LOG_SEQ_BYTES + 2, key_group);
  if (key_bytes > 0)
    memcpy(t->key + LOG_PREFIX_BYTES, key, key_bytes);
  return (MDB_val){.mv_size = LOG_PREFIX_BYTES + key_bytes,
                   .mv_data = t->key};
}

/* 8 bytes as a big-endian number: comparing two of them compares the
 * bytes as memcmp does. */
static inline uint64_t load_be64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, sizeof v);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}

/* LMDB's default key order: memcmp, then the shorter key first.  Inline
 * and 8 bytes a step, as the merged view compares every key (note 8): the
 * last step reads the final 8 bytes, overlapping bytes already equal. */
static inline int key_compare(const uint8_t *a, size_t a_bytes,
                              const uint8_t *b, size_t b_bytes) {
  size_t common = a_bytes < b_bytes ? a_bytes : b_bytes;
  if (common >= 8) {
    for (size_t at = 0;; at += 8) { /* common / 8 + 1 steps at most */
      if (at + 8 > common)
        at = common - 8;
      uint64_t x = load_be64(a + at), y = load_be64(b + at);
      if (x != y)
        return x < y ? -1 : 1;
      if (at + 8 == common)
        break;
    }
  } else {
    int diff = memcmp(a, b, common);
    if (diff != 0)
      return diff;
  }
  return (a_bytes > b_bytes) - (a_bytes < b_bytes);
}

/* Appends a put (or a tombstone: value NULL) to the log (note 7). */
static int log_append(sl_store_txn *t, uint16_t op, uint16_t key_group,
                      const void *key, uint32_t key_bytes,
                      const void *value, uint32_t value_bytes,
                      const char *what) {
  sl_store *s = t->store;
  MDB_val k = log_key(t, op, key_group, key, key_bytes);
  const uint8_t *state_key = t->key + LOG_SEQ_BYTES;
  size_t state_key_bytes = k.mv_size - LOG_SEQ_BYTES;
  bool ascending = t->last_key_bytes == 0 ||
                   key_compare(state_key, state_key_bytes, t->last_key,
                               t->last_key_bytes) > 0;
  uint8_t kind = value ? LOG_PUT : LOG_TOMBSTONE;
  int rc = value_put(s, t->mdb, DB_LOG, &k, &kind, LOG_KIND_BYTES, value,
                     value_bytes, ascending ? MDB_APPEND : 0);
  if (rc != 0)
    return txn_fail(t, lmdb_fail(s, rc, what));
  if (ascending) {
    memcpy(t->last_key, state_key, state_key_bytes);
    t->last_key_bytes = state_key_bytes;
  }
  return 0;
}

/* EINVAL (and a failed transaction) for a key LMDB cannot hold. */
static int check_state_key(sl_store_txn *t, uint32_t key_bytes,
                           const char *what) {
  sl_store *s = t->store;
  if (key_bytes <= s->state_key_max_bytes)
    return 0;
  return txn_fail(t, store_fail(s, EINVAL,
                                "%s: a key of %" PRIu32 " bytes is too long "
                                "(at most %" PRIu32 ")",
                                what, key_bytes, s->state_key_max_bytes));
}

int sl_store_put_state(sl_store_txn *txn, uint16_t op, uint16_t key_group,
                       const void *key, uint32_t key_bytes,
                       const void *value, uint32_t value_bytes) {
  int rc = txn_usable(txn);
  if (rc == 0)
    rc = check_state_key(txn, key_bytes, "put state");
  if (rc != 0)
    return rc;
  sl_store *s = txn->store;
  if (value_bytes > UINT32_MAX - SL_STORE_CHECKSUM_BYTES - LOG_KIND_BYTES)
    return txn_fail(txn, store_fail(s, EINVAL,
                                    "put state: a value of %" PRIu32
                                    " bytes is too long",
                                    value_bytes));
  /* A 0-byte value may come as NULL; NULL means a tombstone below. */
  static const uint8_t empty[1];
  return log_append(txn, op, key_group, key, key_bytes,
                    value_bytes > 0 ? value : empty, value_bytes,
                    "put state");
}

int sl_store_delete_state(sl_store_txn *txn, uint16_t op, uint16_t key_group,
                          const void *key, uint32_t key_bytes) {
  int rc = txn_usable(txn);
  if (rc == 0)
    rc = check_state_key(txn, key_bytes, "delete state");
  if (rc != 0)
    return rc;
  return log_append(txn, op, key_group, key, key_bytes, 0, 0,
                    "delete state");
}

/* Remembers a blob's key for the commit's rewrite (note 3). */
static int remember_blob(sl_store_txn *t, uint16_t op, uint16_t instance) {
  if (t->blob_count == t->blob_capacity) {
    size_t capacity = t->blob_capacity ? 2 * t->blob_capacity : 64;
    uint32_t *keys = realloc(t->blob_keys, capacity * sizeof *keys);
    if (!keys)
      return store_fail(t->store, ENOMEM, "put blob: out of memory");
    t->blob_keys = keys;
    t->blob_capacity = capacity;
  }
  t->blob_keys[t->blob_count++] = (uint32_t)op << 16 | instance;
  return 0;
}

int sl_store_put_blob(sl_store_txn *txn, uint16_t op, uint16_t instance,
                      const void *data, uint32_t bytes) {
  int rc = txn_usable(txn);
  if (rc != 0)
    return rc;
  sl_store *s = txn->store;
  if (bytes > UINT32_MAX - BLOB_ID_BYTES - SL_STORE_CHECKSUM_BYTES)
    return txn_fail(txn, store_fail(s, EINVAL,
                                    "put blob: %" PRIu32
                                    " bytes are too many",
                                    bytes));
  uint8_t key_bytes[BLOB_KEY_BYTES], pending_id[BLOB_ID_BYTES] = {0};
  put_be16(key_bytes, op);
  put_be16(key_bytes + 2, instance);
  MDB_val key = {.mv_size = sizeof key_bytes, .mv_data = key_bytes};
  rc = value_put(s, txn->mdb, DB_BLOBS, &key, pending_id, sizeof pending_id,
                 data, bytes, 0);
  if (rc != 0)
    return txn_fail(txn, lmdb_fail(s, rc, "put blob"));
  rc = remember_blob(txn, op, instance);
  return rc != 0 ? txn_fail(txn, rc) : 0;
}

/* Gives every blob of this transaction its checkpoint id (note 3). */
static int commit_blob_ids(sl_store_txn *t, uint64_t id) {
  sl_store *s = t->store;
  for (size_t i = 0; i < t->blob_count; i++) { /* blobs put, at most */
    uint8_t key_bytes[BLOB_KEY_BYTES];
    put_be16(key_bytes, (uint16_t)(t->blob_keys[i] >> 16));
    put_be16(key_bytes + 2, (uint16_t)t->blob_keys[i]);
    MDB_val key = {.mv_size = sizeof key_bytes, .mv_data = key_bytes};
    MDB_val stored, payload;
    int rc = mdb_get(t->mdb, s->dbi[DB_BLOBS], &key, &stored);
    if (rc != 0)
      return lmdb_fail(s, rc, "commit: read a blob back");
    if ((rc = value_open(s, DB_BLOBS, &key, &stored, &payload)) != 0)
      return rc;
    assert(payload.mv_size >= BLOB_ID_BYTES);
    uint64_t stored_id = get_le64(payload.mv_data);
    if (stored_id == id)
      continue; /* put twice in this transaction: already rewritten */
    assert(stored_id == 0);
    size_t body_bytes = payload.mv_size - BLOB_ID_BYTES;
    if (body_bytes > t->copy_capacity_bytes) {
      uint8_t *copy = realloc(t->copy, body_bytes);
      if (!copy)
        return store_fail(s, ENOMEM, "commit: out of memory");
      t->copy = copy;
      t->copy_capacity_bytes = body_bytes;
    }
    if (body_bytes > 0) /* the page may move under the put: copy first */
      memcpy(t->copy, (uint8_t *)payload.mv_data + BLOB_ID_BYTES, body_bytes);
    uint8_t head[BLOB_ID_BYTES];
    put_le64(head, id);
    rc = value_put(s, t->mdb, DB_BLOBS, &key, head, sizeof head, t->copy,
                   body_bytes, 0);
    if (rc != 0)
      return lmdb_fail(s, rc, "commit: rewrite a blob");
  }
  return 0;
}

/* ------------------------------------------------------------ tables */

int sl_store_table_name_check(const char *name) {
  if (!name)
    return EINVAL;
  size_t n = strnlen(name, SL_STORE_TABLE_NAME_MAX + 1);
  if (n == 0 || n > SL_STORE_TABLE_NAME_MAX)
    return EINVAL;
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
    if (!ok)
      return EINVAL;
  }
  return 0;
}

/* [n][name][key] into out (KEY_BUFFER_BYTES bytes), a row key of note
 * 10; with key_bytes 0 it is the prefix shared by every row of the table. */
static MDB_val row_key(uint8_t *out, const char *name, size_t name_bytes,
                       const void *key, uint32_t key_bytes) {
  assert(name_bytes >= 1 && name_bytes <= SL_STORE_TABLE_NAME_MAX);
  assert(key_bytes <= SL_STORE_TABLE_KEY_MAX);
  out[0] = (uint8_t)name_bytes;
  memcpy(out + 1, name, name_bytes);
  if (key_bytes > 0)
    memcpy(out + 1 + name_bytes, key, key_bytes);
  return (MDB_val){.mv_size = 1 + name_bytes + key_bytes, .mv_data = out};
}

/* [0][name]: where a table's row count is kept (note 10). */
static MDB_val count_key(uint8_t *out, const char *name, size_t name_bytes) {
  assert(name_bytes >= 1 && name_bytes <= SL_STORE_TABLE_NAME_MAX);
  out[0] = 0;
  memcpy(out + 1, name, name_bytes);
  return (MDB_val){.mv_size = 1 + name_bytes, .mv_data = out};
}

int sl_store_txn_table(sl_store_txn *txn, const char *name, int *table) {
  int rc = txn_usable(txn);
  if (rc != 0)
    return rc;
  sl_store *s = txn->store;
  if (sl_store_table_name_check(name) != 0)
    return store_fail(s, EINVAL, "table name \"%.60s\" is not 1..%u bytes "
                      "of A-Z a-z 0-9 _ - .", name ? name : "(null)",
                      SL_STORE_TABLE_NAME_MAX);
  for (int i = 0; i < txn->table_count; i++) /* at most SL_STORE_TXN_TABLES */
    if (strcmp(txn->tables[i].name, name) == 0) {
      *table = i;
      return 0;
    }
  if (txn->table_count == SL_STORE_TXN_TABLES)
    return store_fail(s, ENOSPC, "table \"%s\": one checkpoint writes at "
                      "most %d tables", name, SL_STORE_TXN_TABLES);
  txn_table *t = &txn->tables[txn->table_count];
  t->name_bytes = (uint8_t)strlen(name);
  memcpy(t->name, name, t->name_bytes + 1u);
  t->row_delta = 0;
  *table = txn->table_count++;
  return 0;
}

/* The transaction's rows cursor (note 10), opened if need be.  Returns 0
 * or an LMDB code. */
static int rows_cursor(sl_store_txn *t) {
  if (t->rows)
    return 0;
  int rc = mdb_cursor_open(t->mdb, t->store->dbi[DB_TABLES], &t->rows);
  if (rc != 0)
    t->rows = 0;
  return rc;
}

/* value_put through the rows cursor; flags MDB_NOOVERWRITE, or
 * MDB_CURRENT with the cursor on key. */
static int row_value_put(sl_store_txn *t, MDB_val *key, const void *body,
                         size_t body_bytes, unsigned flags) {
  sl_store *s = t->store;
  assert(flags == MDB_NOOVERWRITE || flags == MDB_CURRENT);
  int rc = rows_cursor(t);
  if (rc != 0)
    return rc;
  if (s->fault) { /* store.h: every put asks the fault layer */
    int injected = s->fault(s->fault_arg, SL_STORE_CALL_PUT);
    if (injected)
      return injected;
  }
  MDB_val value = {.mv_size = body_bytes + SL_STORE_CHECKSUM_BYTES,
                   .mv_data = 0};
  rc = mdb_cursor_put(t->rows, key, &value, MDB_RESERVE | flags);
  if (rc != 0)
    return rc;
  uint8_t *at = value.mv_data;
  if (body_bytes > 0)
    memcpy(at, body, body_bytes);
  put_le64(at + body_bytes, checksum(DB_TABLES, key, at, body_bytes));
  return 0;
}

/* 0 if a row of key_bytes may go into table of txn; else fails txn. */
static int row_check(sl_store_txn *txn, int table, uint32_t key_bytes,
                     const char *what) {
  int rc = txn_usable(txn);
  if (rc != 0)
    return rc;
  sl_store *s = txn->store;
  if (table < 0 || table >= txn->table_count)
    return txn_fail(txn, store_fail(s, EINVAL, "%s: no table %d in this "
                                    "transaction", what, table));
  if (key_bytes > SL_STORE_TABLE_KEY_MAX)
    return txn_fail(txn, store_fail(s, EINVAL,
                                    "%s: table \"%s\": a key of %" PRIu32
                                    " bytes is too long (at most %u)",
                                    what, txn->tables[table].name, key_bytes,
                                    SL_STORE_TABLE_KEY_MAX));
  assert(atomic_load(&s->tables_open)); /* a writer has it (note 10) */
  return 0;
}

int sl_store_put_row(sl_store_txn *txn, int table, const void *key,
                     uint32_t key_bytes, const void *value,
                     uint32_t value_bytes) {
  int rc = row_check(txn, table, key_bytes, "put row");
  if (rc != 0)
    return rc;
  sl_store *s = txn->store;
  txn_table *t = &txn->tables[table];
  if (value_bytes > UINT32_MAX - SL_STORE_CHECKSUM_BYTES ||
      (value_bytes > 0 && !value))
    return txn_fail(txn, store_fail(s, EINVAL, "put row: table \"%s\": bad "
                                    "value of %" PRIu32 " bytes", t->name,
                                    value_bytes));
  MDB_val k = row_key(txn->key, t->name, t->name_bytes, key, key_bytes);
  /* Note 10: a new row, or (MDB_KEYEXIST: nothing written, the cursor on
   * the row) a replacement. */
  rc = row_value_put(txn, &k, value, value_bytes, MDB_NOOVERWRITE);
  if (rc == 0) {
    t->row_delta++;
    return 0;
  }
  if (rc == MDB_KEYEXIST)
    rc = row_value_put(txn, &k, value, value_bytes, MDB_CURRENT);
  return rc != 0 ? txn_fail(txn, lmdb_fail(s, rc, "put row")) : 0;
}

int sl_store_delete_row(sl_store_txn *txn, int table, const void *key,
                        uint32_t key_bytes) {
  int rc = row_check(txn, table, key_bytes, "delete row");
  if (rc != 0)
    return rc;
  sl_store *s = txn->store;
  txn_table *t = &txn->tables[table];
  if (s->fault) { /* store.h: a delete counts as a put */
    int injected = s->fault(s->fault_arg, SL_STORE_CALL_PUT);
    if (injected)
      return txn_fail(txn, lmdb_fail(s, injected, "delete row"));
  }
  MDB_val k = row_key(txn->key, t->name, t->name_bytes, key, key_bytes);
  MDB_val found;
  rc = rows_cursor(txn);
  if (rc == 0)
    rc = mdb_cursor_get(txn->rows, &k, &found, MDB_SET);
  if (rc == 0)
    rc = mdb_cursor_del(txn->rows, 0);
  if (rc == 0)
    t->row_delta--;
  else if (rc != MDB_NOTFOUND)
    return txn_fail(txn, lmdb_fail(s, rc, "delete row"));
  return 0;
}

/* Note 10: each table's delta into its stored row count. */
static int commit_table_counts(sl_store_txn *t) {
  sl_store *s = t->store;
  for (int i = 0; i < t->table_count; i++) { /* at most SL_STORE_TXN_TABLES */
    const txn_table *table = &t->tables[i];
    if (table->row_delta == 0)
      continue;
    uint8_t key_bytes[1 + SL_STORE_TABLE_NAME_MAX];
    MDB_val key = count_key(key_bytes, table->name, table->name_bytes);
    MDB_val stored, payload;
    uint64_t rows = 0;
    int rc = mdb_get(t->mdb, s->dbi[DB_TABLES], &key, &stored);
    if (rc == 0 && (rc = value_open(s, DB_TABLES, &key, &stored,
                                    &payload)) != 0)
      return rc;
    if (rc == 0 && payload.mv_size != sizeof rows)
      return corrupt(s, DB_TABLES, &key, "not a u64");
    if (rc == 0)
      rows = get_le64(payload.mv_data);
    else if (rc != MDB_NOTFOUND)
      return lmdb_fail(s, rc, "commit: read a row count");
    if (table->row_delta < 0 && rows < (uint64_t)-table->row_delta)
      return corrupt(s, DB_TABLES, &key, "fewer rows counted than deleted");
    rows += (uint64_t)table->row_delta; /* modular: adds a negative delta */
    uint8_t value[sizeof rows];
    put_le64(value, rows);
    rc = value_put(s, t->mdb, DB_TABLES, &key, 0, 0, value, sizeof value, 0);
    if (rc != 0)
      return lmdb_fail(s, rc, "commit: write a row count");
  }
  return 0;
}

/* The record of checkpoint id, "latest" = id and "next_seq" (store.h note
 * 2); "latest" is read back before the commit sends them to disk. */
static int commit_record(sl_store_txn *t, uint64_t id, const void *record,
                         uint32_t record_bytes) {
  sl_store *s = t->store;
  if (record_bytes > UINT32_MAX - SL_STORE_CHECKSUM_BYTES)
    return store_fail(s, EINVAL, "commit: a record of %" PRIu32
                      " bytes is too long", record_bytes);
  uint8_t key_bytes[CHECKPOINT_KEY_BYTES];
  put_be64(key_bytes, id);
  MDB_val key = {.mv_size = sizeof key_bytes, .mv_data = key_bytes};
  int rc = value_put(s, t->mdb, DB_CHECKPOINTS, &key, 0, 0, record,
                     record_bytes, 0);
  if (rc == 0)
    rc = meta_put_u64(s, t->mdb, "latest", id);
  assert(t->seq < UINT64_MAX); /* sl_store_begin asserts it */
  if (rc == 0)
    rc = meta_put_u64(s, t->mdb, "next_seq", t->seq + 1);
  if (rc != 0)
    return lmdb_fail(s, rc, "commit: write the checkpoint record");
  uint64_t latest = 0;
  rc = meta_get_u64(s, t->mdb, "latest", &latest);
  if (rc == 0 && latest != id)
    return store_fail(s, SL_ECORRUPT,
                      "commit: \"latest\" reads back as %" PRIu64
                      ", not %" PRIu64, latest, id);
  return rc;
}

int sl_store_commit(sl_store_txn *txn, uint64_t id, const void *record,
                    uint32_t record_bytes) {
  int rc = txn_usable(txn);
  if (rc != 0) {
    if (txn)
      txn_end(txn); /* a failed transaction is finished by its commit */
    return rc;
  }
  sl_store *s = txn->store;
  if (id <= s->latest)
    rc = store_fail(s, EINVAL,
                    "commit: checkpoint %" PRIu64 " is not newer than the "
                    "latest, %" PRIu64, id, s->latest);
  if (rc == 0)
    rc = commit_blob_ids(txn, id);
  if (rc == 0)
    rc = commit_table_counts(txn);
  if (rc == 0)
    rc = commit_record(txn, id, record, record_bytes);
  if (rc != 0) {
    txn_end(txn);
    return rc;
  }
  assert(id > s->latest);
  int injected = s->fault ? s->fault(s->fault_arg, SL_STORE_CALL_COMMIT) : 0;
  if (injected)
    mdb_txn_abort(txn->mdb); /* the fault layer: nothing is committed */
  else
    rc = mdb_txn_commit(txn->mdb); /* frees the LMDB transaction either way */
  txn->mdb = 0;
  txn->state = TXN_IDLE;
  txn->blob_count = 0;
  txn->table_count = 0;
  txn->rows = 0;
  assert(txn_check(txn));
  if (injected)
    return lmdb_fail(s, injected, "commit (injected fault)");
  if (rc != 0)
    return lmdb_fail(s, rc, "commit");
  s->latest = id;
  s->next_seq++;
  injected = s->fault ? s->fault(s->fault_arg, SL_STORE_CALL_SYNC) : 0;
  if (injected) /* committed, but reported as a failed fsync */
    return lmdb_fail(s, injected, "commit's sync (injected fault)");
  return 0;
}

void sl_store_set_fault(sl_store *s, sl_store_fault_fn fn, void *arg) {
  s->fault = fn;
  s->fault_arg = arg;
}

void sl_store_abort(sl_store_txn *txn) {
  if (txn)
    txn_end(txn);
}

int sl_store_grow(sl_store *s) {
  if (s->read_only)
    return store_fail(s, EACCES, "grow: the store is open read-only");
  if (s->txn.state == TXN_ACTIVE)
    return store_fail(s, EBUSY, "grow: a transaction is open");
  uint64_t now_bytes = sl_store_map_bytes(s);
  if (now_bytes > SL_STORE_MAX_MAP_BYTES / 2)
    return store_fail(s, ENOMEM,
                      "grow: the map of %" PRIu64 " bytes may not double "
                      "past %llu",
                      now_bytes, SL_STORE_MAX_MAP_BYTES);
  /* Note 10: waits for the table reads of other threads to end. */
  pthread_rwlock_wrlock(&s->map_lock);
  int rc = mdb_env_set_mapsize(s->env, (size_t)(2 * now_bytes));
  pthread_rwlock_unlock(&s->map_lock);
  if (rc != 0)
    return lmdb_fail(s, rc, "grow: mdb_env_set_mapsize");
  assert(sl_store_map_bytes(s) >= 2 * now_bytes);
  return 0;
}

int sl_store_wipe(sl_store *s) {
  if (s->read_only)
    return store_fail(s, EACCES, "wipe: the store is open read-only");
  if (s->txn.state != TXN_IDLE)
    return store_fail(s, EBUSY, "wipe: a transaction is open");
  MDB_txn *txn;
  int rc = mdb_txn_begin(s->env, 0, 0, &txn);
  if (rc != 0)
    return lmdb_fail(s, rc, "wipe: begin");
  /* Every database but meta: the log, both bases and the tables too.
   * "next_seq" stays: seqs only grow. */
  assert(atomic_load(&s->tables_open)); /* a writer has it (note 10) */
  for (int db = DB_CHECKPOINTS; db < DB_COUNT && rc == 0; db++)
    rc = mdb_drop(txn, s->dbi[db], 0); /* empty it, keep the database */
  if (rc == 0)
    rc = meta_put_u64(s, txn, "latest", 0);
  if (rc == 0)
    rc = meta_put_u64(s, txn, "base", 0);
  if (rc != 0) {
    mdb_txn_abort(txn);
    return lmdb_fail(s, rc, "wipe");
  }
  rc = mdb_txn_commit(txn);
  if (rc != 0)
    return lmdb_fail(s, rc, "wipe: commit");
  s->latest = 0;
  rc = s->no_sync ? mdb_env_sync(s->env, 1) : 0; /* durable even so */
  return rc != 0 ? lmdb_fail(s, rc, "wipe: sync") : 0;
}

/* ------------------------------------------------------------ reading */

/* A read transaction.  A map grown by the writer in another process is
 * adopted once (MDB_MAP_RESIZED; only read-only handles meet it). */
static int read_begin(sl_store *s, MDB_txn **txn) {
  int rc = mdb_txn_begin(s->env, 0, MDB_RDONLY, txn);
  if (rc == MDB_MAP_RESIZED && s->txn.state != TXN_ACTIVE) {
    rc = mdb_env_set_mapsize(s->env, 0);
    if (rc == 0)
      rc = mdb_txn_begin(s->env, 0, MDB_RDONLY, txn);
  }
  if (rc != 0) {
    *txn = 0;
    return lmdb_fail(s, rc, "begin a read transaction");
  }
  return 0;
}

int sl_store_entry_bound(sl_store *s, uint64_t *entries) {
  MDB_txn *txn;
  int rc = read_begin(s, &txn);
  if (rc != 0)
    return rc;
  int base = DB_STATE;
  MDB_stat log_stat, base_stat;
  rc = meta_get_base(s, txn, &base); /* sets its own message */
  if (rc != 0) {
    mdb_txn_abort(txn);
    return rc;
  }
  rc = mdb_stat(txn, s->dbi[DB_LOG], &log_stat);
  if (rc == 0)
    rc = mdb_stat(txn, s->dbi[base], &base_stat);
  mdb_txn_abort(txn);
  if (rc != 0)
    return lmdb_fail(s, rc, "count entries");
  *entries = (uint64_t)log_stat.ms_entries + base_stat.ms_entries;
  return 0;
}

typedef int (*state_fn)(void *arg, uint16_t key_group, const void *key,
                        uint32_t key_bytes, const void *value,
                        uint32_t value_bytes);

/* Where a merged view goes: sl_store_read_state's fn, or the new base of a
 * compaction.  key is a state key (op, key group, key bytes). */
typedef int (*merged_fn)(void *arg, const uint8_t *key, size_t key_bytes,
                         const void *value, size_t value_bytes);

/* One log entry of a merged view, pointing into the map (note 8). */
typedef struct log_entry {
  const uint8_t *key;   /* the state key: op, key group, key bytes */
  const uint8_t *value; /* the value, after the kind byte */
  uint32_t value_bytes;
  uint16_t key_bytes;
  uint8_t kind; /* LOG_PUT or LOG_TOMBSTONE */
} log_entry;

/* A sorted run of a merged view's log entries: one transaction's entries
 * in the range, [at, end) of log_range.entries; at moves as it is used. */
typedef struct log_run {
  size_t at;
  size_t end;
} log_run;

/* The log entries of a merged view's range, and their merge (note 8).
 * entries and runs are the store's buffers, grown as needed. */
typedef struct log_range {
  merge_buffers *buffers; /* where entries and runs live */
  log_entry *entries;
  size_t count;
  size_t capacity; /* the log's entries: no range holds more */
  log_run *runs; /* run r is older than run r + 1 */
  size_t run_count;
  struct heap_node *heap; /* malloc'd: the runs not used up (node_before) */
  size_t heap_count;
} log_range;

/* Room for one more entry, or run, in a store buffer (*buffer holds
 * *capacity items of item_bytes, at most limit are needed): doubled from
 * 1024.  A buffer moved by realloc is fine: items point into the map, not
 * into the buffer. */
static int buffer_room(sl_store *s, void **buffer, size_t *capacity,
                       size_t used, size_t item_bytes, size_t limit) {
  if (used < *capacity)
    return 0;
  assert(used < limit); /* the callers stop at limit */
  size_t grown = *capacity < 1024 ? 1024 : 2 * *capacity;
  if (grown > limit)
    grown = limit;
  void *bigger = grown <= SIZE_MAX / item_bytes
                     ? realloc(*buffer, grown * item_bytes)
                     : 0;
  if (!bigger)
    return store_fail(s, ENOMEM, "read the log: no memory for %zu entries",
                      grown);
  *buffer = bigger;
  *capacity = grown;
  return 0;
}

/* A log entry read back: checked, and its kind known. */
static int log_entry_open(sl_store *s, const MDB_val *key,
                          const MDB_val *value, log_entry *out) {
  assert(key->mv_size >= LOG_PREFIX_BYTES);
  assert(key->mv_size <= KEY_BUFFER_BYTES); /* LMDB's largest key */
  MDB_val payload;
  int rc = value_open(s, DB_LOG, key, value, &payload);
  if (rc != 0)
    return rc;
  const uint8_t *p = payload.mv_data;
  if (payload.mv_size < LOG_KIND_BYTES ||
      (p[0] != LOG_PUT && p[0] != LOG_TOMBSTONE) ||
      (p[0] == LOG_TOMBSTONE && payload.mv_size != LOG_KIND_BYTES))
    return corrupt(s, DB_LOG, key, "value is neither a put nor a tombstone");
  out->key = (const uint8_t *)key->mv_data + LOG_SEQ_BYTES;
  out->key_bytes = (uint16_t)(key->mv_size - LOG_SEQ_BYTES);
  out->value = p + LOG_KIND_BYTES;
  out->value_bytes = (uint32_t)(payload.mv_size - LOG_KIND_BYTES);
  out->kind = p[0];
  return 0;
}

/* Records entries [start, range->count) as the newest run. */
static int log_add_run(sl_store *s, log_range *range, size_t start) {
  assert(start < range->count);
  assert(range->run_count == 0 ||
         range->runs[range->run_count - 1].end <= start);
  void *runs = range->buffers->runs;
  int rc = buffer_room(s, &runs, &range->buffers->run_capacity, range->run_count,
                       sizeof *range->runs, range->capacity);
  range->buffers->runs = runs;
  range->runs = runs;
  if (rc != 0)
    return rc;
  range->runs[range->run_count++] = (log_run){.at = start,
                                              .end = range->count};
  return 0;
}

/* Takes log entries from the cursor's (key, value) on while they belong to
 * transaction seq and have a prefix <= last, and records them as a run.
 * Returns 0 with the cursor on the first entry past them, MDB_NOTFOUND at
 * the log's end, or an error. */
static int log_collect_run(sl_store *s, MDB_cursor *cursor, MDB_val *key,
                           MDB_val *value, uint64_t seq, uint32_t last,
                           log_range *range) {
  size_t start = range->count;
  int rc = 0;
  /* Each turn takes an entry, and the range has room for all of them. */
  for (size_t turn = 0; turn <= range->capacity && rc == 0; turn++) {
    if (key->mv_size < LOG_PREFIX_BYTES)
      return corrupt(s, DB_LOG, key, "key shorter than its prefix");
    const uint8_t *k = key->mv_data;
    if (get_be64(k) != seq || get_be32(k + LOG_SEQ_BYTES) > last)
      break;
    if (range->count == range->capacity)
      return store_fail(s, SL_ECORRUPT,
                        "read the log: more entries than the %zu counted",
                        range->capacity);
    void *entries = range->buffers->entries;
    rc = buffer_room(s, &entries, &range->buffers->entry_capacity, range->count,
                     sizeof *range->entries, range->capacity);
    range->buffers->entries = entries;
    range->entries = entries;
    if (rc == 0)
      rc = log_entry_open(s, key, value, &range->entries[range->count]);
    if (rc != 0)
      return rc;
    range->count++;
    rc = mdb_cursor_get(cursor, key, value, MDB_NEXT);
  }
  if (rc != 0 && rc != MDB_NOTFOUND)
    return lmdb_fail(s, rc, "read the log");
  int added = range->count > start ? log_add_run(s, range, start) : 0;
  return added != 0 ? added : rc;
}

/* Step a of note 8: the log entries with a prefix (op << 16 | key group)
 * in [first, last] into range, a sorted run per transaction. */
static int log_collect(sl_store *s, MDB_cursor *cursor, uint32_t first,
                       uint32_t last, log_range *range) {
  uint8_t seek[LOG_PREFIX_BYTES];
  uint64_t seq = 0;
  /* Each step seeks into a transaction's range, or lands on the next
   * transaction present: two steps a transaction, and each one logged at
   * least one of the capacity entries. */
  for (size_t step = 0; step <= 2 * range->capacity + 1; step++) {
    put_be64(seek, seq);
    put_be32(seek + LOG_SEQ_BYTES, first);
    MDB_val key = {.mv_size = sizeof seek, .mv_data = seek}, value;
    int rc = mdb_cursor_get(cursor, &key, &value, MDB_SET_RANGE);
    if (rc == MDB_NOTFOUND)
      return 0; /* past the log's last entry */
    if (rc != 0)
      return lmdb_fail(s, rc, "read the log");
    if (key.mv_size < LOG_PREFIX_BYTES)
      return corrupt(s, DB_LOG, &key, "key shorter than its prefix");
    uint64_t landed = get_be64(key.mv_data);
    if (landed == seq) { /* in the range of seq, or past it */
      rc = log_collect_run(s, cursor, &key, &value, seq, last, range);
      if (rc == MDB_NOTFOUND)
        return 0;
      if (rc != 0)
        return rc;
      landed = get_be64(key.mv_data);
    }
    assert(landed >= seq); /* the cursor only moved forward */
    if (landed == seq && seq == UINT64_MAX)
      return 0;
    seq = landed > seq ? landed : seq + 1;
  }
  return store_fail(s, SL_ECORRUPT,
                    "read the log: more transactions than its %zu entries",
                    range->capacity);
}

static int entry_compare(const log_entry *a, const log_entry *b) {
  return key_compare(a->key, a->key_bytes, b->key, b->key_bytes);
}

/* A heap slot: a run and its head entry, whose first 16 key bytes are
 * kept as two big-endian numbers (zero-padded), so that most comparisons
 * read no key: 16 bytes hold op, key group and an engine key (11 bytes). */
typedef struct heap_node {
  uint64_t prefix[2];
  const log_entry *head;
  size_t run;
} heap_node;

static void node_load(heap_node *node, const log_entry *head, size_t run) {
  uint8_t bytes[16] = {0};
  memcpy(bytes, head->key, head->key_bytes < 16 ? head->key_bytes : 16);
  node->prefix[0] = load_be64(bytes);
  node->prefix[1] = load_be64(bytes + 8);
  node->head = head;
  node->run = run;
}

/* Key order of two nodes' heads; equal prefixes may still differ (in
 * bytes past 16, or in zero padding), so they compare the keys. */
static int node_compare(const heap_node *a, const heap_node *b) {
  if (a->prefix[0] != b->prefix[0])
    return a->prefix[0] < b->prefix[0] ? -1 : 1;
  if (a->prefix[1] != b->prefix[1])
    return a->prefix[1] < b->prefix[1] ? -1 : 1;
  return entry_compare(a->head, b->head);
}

/* Heap order: the smaller head key first, of equal ones the newer run's. */
static bool node_before(const heap_node *a, const heap_node *b) {
  int order = node_compare(a, b);
  return order < 0 || (order == 0 && a->run > b->run);
}

/* Moves heap slot i down to its place (a binary heap: one step a level). */
static void heap_down(log_range *range, size_t i) {
  heap_node *heap = range->heap;
  size_t n = range->heap_count;
  assert(i < n);
  for (int level = 0; level < 64; level++) { /* n < 2^64 */
    size_t child = 2 * i + 1, least = i;
    if (child < n && node_before(&heap[child], &heap[least]))
      least = child;
    if (child + 1 < n && node_before(&heap[child + 1], &heap[least]))
      least = child + 1;
    if (least == i)
      return;
    heap_node swap = heap[i];
    heap[i] = heap[least];
    heap[least] = swap;
    i = least;
  }
  assert(!"a heap of fewer than 2^64 runs is fewer than 64 levels deep");
}

/* Step b of note 8, set up: every run in the heap. */
static int log_merge_begin(sl_store *s, log_range *range) {
  assert(range->heap == 0);
  if (range->run_count == 0)
    return 0;
  range->heap = malloc(range->run_count * sizeof *range->heap);
  if (!range->heap)
    return store_fail(s, ENOMEM, "read the log: out of memory");
  for (size_t r = 0; r < range->run_count; r++) {
    assert(range->runs[r].at < range->runs[r].end); /* runs are not empty */
    node_load(&range->heap[r], &range->entries[range->runs[r].at], r);
  }
  range->heap_count = range->run_count;
  for (size_t i = range->heap_count / 2; i-- > 0;)
    heap_down(range, i);
  return 0;
}

/* Uses up the head entry of the run on top of the heap. */
static void heap_pop_head(log_range *range) {
  assert(range->heap_count > 0);
  size_t r = range->heap[0].run;
  log_run *run = &range->runs[r];
  run->at++;
  if (run->at == run->end) /* used up: the last slot takes its place */
    range->heap[0] = range->heap[--range->heap_count];
  else
    node_load(&range->heap[0], &range->entries[run->at], r);
  if (range->heap_count > 0)
    heap_down(range, 0);
}

/* Step b of note 8: the newest entry of the smallest key not yet taken,
 * NULL after the last; the older versions of that key are skipped. */
static const log_entry *log_merge_next(log_range *range) {
  if (range->heap_count == 0)
    return 0;
  heap_node newest = range->heap[0];
  heap_pop_head(range);
  /* A run holds a key once: at most one older version a run. */
  for (size_t r = 0; r < range->run_count && range->heap_count > 0; r++) {
    if (node_compare(&range->heap[0], &newest) != 0)
      break;
    heap_pop_head(range);
  }
  return newest.head;
}

/* Step a of note 8 and the merge's set-up: range holds the runs of the
 * log entries with a prefix in [first, last].  The caller frees
 * range->heap, also on error. */
static int log_gather(sl_store *s, MDB_txn *txn, uint32_t first,
                      uint32_t last, log_range *range) {
  assert(range->count == 0 && range->heap == 0);
  if (range->capacity == 0)
    return 0; /* an empty log */
  MDB_cursor *cursor;
  int rc = mdb_cursor_open(txn, s->dbi[DB_LOG], &cursor);
  if (rc != 0)
    return lmdb_fail(s, rc, "read the log");
  rc = log_collect(s, cursor, first, last, range);
  mdb_cursor_close(cursor);
  return rc != 0 ? rc : log_merge_begin(s, range);
}

/* After a base cursor step that returned rc: *in_range says whether the
 * cursor is on an entry with a prefix <= last. */
static int base_position(sl_store *s, int db, int rc, const MDB_val *key,
                         uint32_t last, bool *in_range) {
  *in_range = false;
  if (rc == MDB_NOTFOUND)
    return 0;
  if (rc != 0)
    return lmdb_fail(s, rc, "read the base");
  if (key->mv_size < STATE_PREFIX_BYTES)
    return corrupt(s, db, key, "key shorter than its prefix");
  *in_range = get_be32(key->mv_data) <= last;
  return 0;
}

/* A base entry into fn, checked. */
static int base_emit(sl_store *s, int db, const MDB_val *key,
                     const MDB_val *value, merged_fn fn, void *arg) {
  MDB_val payload;
  int rc = value_open(s, db, key, value, &payload);
  if (rc != 0)
    return rc;
  return fn(arg, key->mv_data, key->mv_size, payload.mv_data,
            payload.mv_size);
}

/* Step c of note 8: the base's entries with a prefix in [first, last]
 * merged with range's, into fn.  Returns fn's nonzero value or an error. */
static int merge_join(sl_store *s, MDB_cursor *cursor, int db,
                      uint32_t first, uint32_t last, log_range *range,
                      size_t base_entries, merged_fn fn, void *arg) {
  uint8_t seek[STATE_PREFIX_BYTES];
  put_be32(seek, first);
  MDB_val key = {.mv_size = sizeof seek, .mv_data = seek}, value;
  bool in_base = false;
  int rc = mdb_cursor_get(cursor, &key, &value, MDB_SET_RANGE);
  if ((rc = base_position(s, db, rc, &key, last, &in_base)) != 0)
    return rc;
  const log_entry *e = log_merge_next(range); /* NULL: the log's done */
  /* Each step consumes a base entry, a log entry, or both. */
  for (size_t step = 0; step <= base_entries + range->count; step++) {
    if (!in_base && !e)
      return 0;
    int order = !in_base ? 1
                : !e     ? -1
                         : key_compare(key.mv_data, key.mv_size, e->key,
                                       e->key_bytes);
    int stop = 0;
    if (order < 0)
      stop = base_emit(s, db, &key, &value, fn, arg);
    else if (e->kind == LOG_PUT) /* a tombstone hides the base's entry */
      stop = fn(arg, e->key, e->key_bytes, e->value, e->value_bytes);
    if (stop != 0)
      return stop;
    if (order >= 0)
      e = log_merge_next(range);
    if (order <= 0) { /* the base's entry is used up or superseded */
      rc = mdb_cursor_get(cursor, &key, &value, MDB_NEXT);
      if ((rc = base_position(s, db, rc, &key, last, &in_base)) != 0)
        return rc;
    }
  }
  return store_fail(s, SL_ECORRUPT,
                    "read state: more entries than the %zu counted",
                    base_entries + range->count);
}

/* The merged view (store.h note 2, note 8) of the prefixes (op << 16 |
 * key group) in [first, last] into fn, in key order.  Returns fn's
 * nonzero value or an error. */
static int merged_view(sl_store *s, MDB_txn *txn, int base_db,
                       uint32_t first, uint32_t last, merge_buffers *buffers,
                       merged_fn fn, void *arg) {
  assert(base_db == DB_STATE || base_db == DB_STATE2);
  assert(first <= last);
  MDB_stat log_stat, base_stat;
  int rc = mdb_stat(txn, s->dbi[DB_LOG], &log_stat);
  if (rc == 0)
    rc = mdb_stat(txn, s->dbi[base_db], &base_stat);
  if (rc != 0)
    return lmdb_fail(s, rc, "read state: count the entries");
  log_range range = {.buffers = buffers, .capacity = log_stat.ms_entries};
  rc = log_gather(s, txn, first, last, &range);
  MDB_cursor *cursor = 0;
  if (rc == 0 && (rc = mdb_cursor_open(txn, s->dbi[base_db], &cursor)) != 0)
    rc = lmdb_fail(s, rc, "read the base");
  if (rc == 0)
    rc = merge_join(s, cursor, base_db, first, last, &range,
                    base_stat.ms_entries, fn, arg);
  if (cursor)
    mdb_cursor_close(cursor);
  free(range.heap);
  return rc;
}

/* sl_store_read_state's fn behind a merged_fn. */
typedef struct read_target {
  state_fn fn;
  void *arg;
} read_target;

static int read_emit(void *arg, const uint8_t *key, size_t key_bytes,
                     const void *value, size_t value_bytes) {
  const read_target *target = arg;
  assert(key_bytes >= STATE_PREFIX_BYTES);
  return target->fn(target->arg, get_be16(key + 2), key + STATE_PREFIX_BYTES,
                    (uint32_t)(key_bytes - STATE_PREFIX_BYTES), value,
                    (uint32_t)value_bytes);
}

int sl_store_read_state(sl_store *s, uint16_t op, uint16_t group_first,
                        uint16_t group_last, state_fn fn, void *arg) {
  if (!fn || group_first > group_last)
    return store_fail(s, EINVAL,
                      "read state: no function, or key groups %u > %u",
                      group_first, group_last);
  MDB_txn *txn;
  int rc = read_begin(s, &txn);
  if (rc != 0)
    return rc;
  int base_db = DB_STATE;
  read_target target = {.fn = fn, .arg = arg};
  merge_buffers buffers = {0}; /* this read's own: note on merge_buffers */
  rc = meta_get_base(s, txn, &base_db);
  if (rc == 0)
    rc = merged_view(s, txn, base_db, (uint32_t)op << 16 | group_first,
                     (uint32_t)op << 16 | group_last, &buffers, read_emit,
                     &target);
  mdb_txn_abort(txn);
  free(buffers.entries);
  free(buffers.runs);
  return rc;
}

/* ------------------------------------------------------------ compaction */

/* For tests only: sl_store_test_crash_after (0: off). */
static uint64_t test_crash_appends;

void sl_store_test_crash_after(uint64_t appends) {
  test_crash_appends = appends;
}

static uint64_t now_us(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (uint64_t)now.tv_sec * 1000000u + (uint64_t)now.tv_nsec / 1000u;
}

/* The new base of a compaction; the merged view arrives in key order. */
typedef struct compaction_target {
  sl_store *s;
  MDB_txn *txn;
  int db;
  uint64_t entries_written;
  uint64_t bytes_written;
} compaction_target;

static int compaction_emit(void *arg, const uint8_t *key, size_t key_bytes,
                           const void *value, size_t value_bytes) {
  compaction_target *t = arg;
  MDB_val k = {.mv_size = key_bytes, .mv_data = (void *)key};
  int rc = value_put(t->s, t->txn, t->db, &k, 0, 0, value, value_bytes,
                     MDB_APPEND);
  assert(rc != MDB_KEYEXIST); /* the merged view ascends */
  if (rc != 0)
    return lmdb_fail(t->s, rc, "compact: write the new base");
  t->entries_written++;
  t->bytes_written += key_bytes + value_bytes + SL_STORE_CHECKSUM_BYTES;
  /* Every 4096 entries: the caller may want the writer back (a checkpoint
   * is waiting, or the job stops).  The transaction is then aborted and
   * nothing changes. */
  if (t->entries_written % 4096 == 0 && t->s->cancel &&
      atomic_load_explicit(t->s->cancel, memory_order_relaxed))
    return store_fail(t->s, ECANCELED, "compact: cancelled");
  if (test_crash_appends != 0 && t->entries_written == test_crash_appends)
    raise(SIGKILL); /* store.h: a test's crash inside the transaction */
  return 0;
}

/* Store.h note 3 inside the compaction's write transaction.  *done:
 * there was something to do, and stats says what. */
static int compact_in(sl_store *s, MDB_txn *txn, uint64_t min_log_entries,
                      sl_store_compaction *stats, bool *done) {
  int old_db = DB_STATE;
  int rc = meta_get_base(s, txn, &old_db);
  if (rc != 0)
    return rc;
  MDB_stat log_stat, base_stat;
  rc = mdb_stat(txn, s->dbi[DB_LOG], &log_stat);
  if (rc == 0)
    rc = mdb_stat(txn, s->dbi[old_db], &base_stat);
  if (rc != 0)
    return lmdb_fail(s, rc, "compact: count the entries");
  uint64_t log_entries = log_stat.ms_entries;
  uint64_t base_entries = base_stat.ms_entries;
  *done = log_entries > 0 && log_entries >= min_log_entries &&
          log_entries >= base_entries;
  if (!*done)
    return 0;
  int new_db = old_db == DB_STATE ? DB_STATE2 : DB_STATE;
  compaction_target target = {.s = s, .txn = txn, .db = new_db};
  /* Empty since the last compaction; emptied again, as MDB_APPEND needs. */
  if ((rc = mdb_drop(txn, s->dbi[new_db], 0)) != 0)
    return lmdb_fail(s, rc, "compact: empty the new base");
  if (!s->merge && !(s->merge = calloc(1, sizeof *s->merge)))
    return store_fail(s, ENOMEM, "compact: out of memory");
  rc = merged_view(s, txn, old_db, 0, UINT32_MAX, s->merge, compaction_emit,
                   &target);
  if (rc != 0)
    return rc;
  rc = mdb_drop(txn, s->dbi[DB_LOG], 0);
  if (rc == 0)
    rc = mdb_drop(txn, s->dbi[old_db], 0);
  if (rc == 0)
    rc = meta_put_u64(s, txn, "base", new_db == DB_STATE ? 0 : 1);
  if (rc == 0)
    rc = mdb_stat(txn, s->dbi[new_db], &base_stat);
  if (rc != 0)
    return lmdb_fail(s, rc, "compact: switch to the new base");
  if (base_stat.ms_entries != target.entries_written)
    return store_fail(s, SL_ECORRUPT, "compact: the new base holds %zu "
                      "entries, not the %" PRIu64 " written",
                      base_stat.ms_entries, target.entries_written);
  *stats = (sl_store_compaction){.log_entries_read = log_entries,
                                 .base_entries_read = base_entries,
                                 .entries_written = target.entries_written,
                                 .bytes_written = target.bytes_written};
  return 0;
}

void sl_store_set_cancel(sl_store *s, const _Atomic int *cancel) {
  s->cancel = cancel;
}

int sl_store_compact(sl_store *s, uint64_t min_log_entries,
                     sl_store_compaction *stats) {
  sl_store_compaction result = {0};
  if (stats)
    *stats = result;
  if (s->read_only)
    return store_fail(s, EACCES, "compact: the store is open read-only");
  if (s->txn.state != TXN_IDLE)
    return store_fail(s, EBUSY, "compact: a transaction is open");
  uint64_t start_us = now_us();
  MDB_txn *txn;
  int rc = mdb_txn_begin(s->env, 0, 0, &txn);
  if (rc != 0)
    return lmdb_fail(s, rc, "compact: begin");
  bool done = false;
  s->compacting = true;
  rc = compact_in(s, txn, min_log_entries, &result, &done);
  s->compacting = false;
  if (rc != 0 || !done) {
    mdb_txn_abort(txn); /* nothing changed */
    return rc;
  }
  rc = mdb_txn_commit(txn); /* durable unless no_sync (store.h note 3) */
  if (rc != 0)
    return lmdb_fail(s, rc, "compact: commit");
  result.duration_us = now_us() - start_us;
  if (stats)
    *stats = result;
  return 0;
}

/* ------------------------------------------------------------ records */

/* The payload under key in db, checked, minus its first head_bytes (read
 * into head), as a malloc'd copy. */
static int read_copy(sl_store *s, int db, MDB_val *key, uint8_t *head,
                     size_t head_bytes, void **data, uint32_t *bytes) {
  MDB_txn *txn;
  int rc = read_begin(s, &txn);
  if (rc != 0)
    return rc;
  MDB_val stored, payload;
  rc = mdb_get(txn, s->dbi[db], key, &stored);
  if (rc == MDB_NOTFOUND) {
    char text[3 * MESSAGE_KEY_BYTES + 64];
    key_text(db, key, text, sizeof text);
    rc = store_fail(s, SL_ENOTFOUND, "database %s has no %s", db_names[db],
                    text);
  } else if (rc != 0) {
    rc = lmdb_fail(s, rc, "read");
  } else {
    rc = value_open(s, db, key, &stored, &payload);
  }
  if (rc == 0 && payload.mv_size < head_bytes)
    rc = corrupt(s, db, key, "value too short");
  size_t body_bytes = rc == 0 ? payload.mv_size - head_bytes : 0;
  void *copy = rc == 0 ? malloc(body_bytes > 0 ? body_bytes : 1) : 0;
  if (rc == 0 && !copy)
    rc = store_fail(s, ENOMEM, "read: out of memory");
  if (rc == 0) {
    if (head_bytes > 0)
      memcpy(head, payload.mv_data, head_bytes);
    if (body_bytes > 0)
      memcpy(copy, (const uint8_t *)payload.mv_data + head_bytes, body_bytes);
    *data = copy;
    *bytes = (uint32_t)body_bytes;
  }
  mdb_txn_abort(txn);
  return rc;
}

int sl_store_get_blob(sl_store *s, uint16_t op, uint16_t instance,
                      void **data, uint32_t *bytes) {
  *data = 0;
  *bytes = 0;
  uint8_t key_bytes[BLOB_KEY_BYTES], head[BLOB_ID_BYTES];
  put_be16(key_bytes, op);
  put_be16(key_bytes + 2, instance);
  MDB_val key = {.mv_size = sizeof key_bytes, .mv_data = key_bytes};
  void *copy;
  uint32_t copy_bytes;
  int rc = read_copy(s, DB_BLOBS, &key, head, sizeof head, &copy,
                     &copy_bytes);
  if (rc != 0)
    return rc;
  /* Note 3: committed blobs carry their checkpoint's id; a writer knows
   * the latest exactly, a reader only as of its open. */
  uint64_t id = get_le64(head);
  if (id == 0 || (!s->read_only && id > s->latest)) {
    free(copy);
    return corrupt(s, DB_BLOBS, &key, "blob tagged with no valid checkpoint");
  }
  *data = copy;
  *bytes = copy_bytes;
  return 0;
}

int sl_store_get_checkpoint(sl_store *s, uint64_t id, void **record,
                            uint32_t *bytes) {
  *record = 0;
  *bytes = 0;
  uint8_t key_bytes[CHECKPOINT_KEY_BYTES];
  put_be64(key_bytes, id);
  MDB_val key = {.mv_size = sizeof key_bytes, .mv_data = key_bytes};
  return read_copy(s, DB_CHECKPOINTS, &key, 0, 0, record, bytes);
}

/* The ids in key order; entries (the database's count) bounds the walk
 * and sizes ids. */
static int scan_checkpoints(sl_store *s, MDB_cursor *cursor, uint64_t *ids,
                            size_t entries, size_t *count) {
  MDB_val key, value;
  size_t n = 0;
  int rc = mdb_cursor_get(cursor, &key, &value, MDB_FIRST);
  for (; rc == 0; rc = mdb_cursor_get(cursor, &key, &value, MDB_NEXT)) {
    if (n >= entries) /* ids has room for entries */
      return store_fail(s, SL_ECORRUPT,
                        "list checkpoints: more than the %zu counted",
                        entries);
    if (key.mv_size != CHECKPOINT_KEY_BYTES)
      return corrupt(s, DB_CHECKPOINTS, &key, "key is not a u64 id");
    uint64_t id = get_be64(key.mv_data);
    assert(n == 0 || ids[n - 1] < id); /* big-endian keys sort by id */
    ids[n++] = id;
  }
  if (rc != MDB_NOTFOUND)
    return lmdb_fail(s, rc, "list checkpoints");
  assert(n == entries);
  *count = n;
  return 0;
}

int sl_store_list_checkpoints(sl_store *s, uint64_t **ids, size_t *count) {
  *ids = 0;
  *count = 0;
  MDB_txn *txn;
  int rc = read_begin(s, &txn);
  if (rc != 0)
    return rc;
  MDB_stat st;
  MDB_cursor *cursor = 0;
  uint64_t *list = 0;
  rc = mdb_stat(txn, s->dbi[DB_CHECKPOINTS], &st);
  if (rc == 0)
    rc = mdb_cursor_open(txn, s->dbi[DB_CHECKPOINTS], &cursor);
  if (rc != 0)
    rc = lmdb_fail(s, rc, "list checkpoints");
  if (rc == 0 && !(list = malloc((st.ms_entries + 1) * sizeof *list)))
    rc = store_fail(s, ENOMEM, "list checkpoints: out of memory");
  if (rc == 0)
    rc = scan_checkpoints(s, cursor, list, st.ms_entries, count);
  if (cursor)
    mdb_cursor_close(cursor);
  mdb_txn_abort(txn);
  if (rc != 0) {
    free(list);
    *count = 0;
    return rc;
  }
  *ids = list;
  return 0;
}

/* ------------------------------------------------------------ table reads */

/* "<dir>: message" into err (note 10: never into the handle's buffer,
 * which the writer thread uses meanwhile).  Returns rc. */
__attribute__((format(printf, 5, 6))) static int
table_fail(const sl_store *s, char *err, size_t err_bytes, int rc,
           const char *format, ...) {
  assert(rc != 0);
  if (!err || err_bytes == 0)
    return rc;
  int at = snprintf(err, err_bytes, "%s: ", s->dir);
  if (at < 0 || (size_t)at >= err_bytes)
    return rc;
  va_list args;
  va_start(args, format);
  vsnprintf(err + at, err_bytes - (size_t)at, format, args);
  va_end(args);
  return rc;
}

/* A read-only handle of a store made before tables: a writer (of another
 * process) may have added "tables" since the open.  Opened in a read
 * transaction of its own, committed to keep the handle (note 10). */
static int tables_open_late(sl_store *s, char *err, size_t err_bytes) {
  pthread_mutex_lock(&s->tables_lock);
  int rc = 0;
  if (!atomic_load(&s->tables_open)) {
    MDB_txn *txn;
    rc = mdb_txn_begin(s->env, 0, MDB_RDONLY, &txn);
    if (rc == 0) {
      rc = mdb_dbi_open(txn, db_names[DB_TABLES], 0, &s->dbi[DB_TABLES]);
      if (rc == 0) {
        rc = mdb_txn_commit(txn);
        if (rc == 0)
          atomic_store(&s->tables_open, true);
      } else {
        mdb_txn_abort(txn);
      }
    }
    if (rc == MDB_NOTFOUND)
      rc = 0; /* still none: every table is empty */
    else if (rc != 0)
      rc = table_fail(s, err, err_bytes, rc, "open the database tables: %s",
                      mdb_strerror(rc));
  }
  pthread_mutex_unlock(&s->tables_lock);
  return rc;
}

/* The read side of map_lock, then a read transaction (note 10).  A map
 * grown by a writer in another process (MDB_MAP_RESIZED, read-only
 * handles only) is adopted under the write side.  End with
 * table_read_end. */
static int locked_read_begin(sl_store *s, MDB_txn **txn, char *err,
                             size_t err_bytes) {
  pthread_rwlock_rdlock(&s->map_lock);
  int rc = mdb_txn_begin(s->env, 0, MDB_RDONLY, txn);
  if (rc == MDB_MAP_RESIZED) {
    pthread_rwlock_unlock(&s->map_lock);
    pthread_rwlock_wrlock(&s->map_lock);
    rc = mdb_env_set_mapsize(s->env, 0); /* no transaction is open here */
    pthread_rwlock_unlock(&s->map_lock);
    pthread_rwlock_rdlock(&s->map_lock);
    if (rc == 0)
      rc = mdb_txn_begin(s->env, 0, MDB_RDONLY, txn);
  }
  if (rc != 0) {
    pthread_rwlock_unlock(&s->map_lock);
    *txn = 0;
    return table_fail(s, err, err_bytes, rc, "begin a read transaction: %s",
                      mdb_strerror(rc));
  }
  return 0;
}

/* Begin a table read (locked_read_begin).  *txn NULL with 0: the store
 * has no tables yet. */
static int table_read_begin(sl_store *s, MDB_txn **txn, char *err,
                            size_t err_bytes) {
  *txn = 0;
  int rc = atomic_load(&s->tables_open) ? 0
                                         : tables_open_late(s, err, err_bytes);
  if (rc != 0 || !atomic_load(&s->tables_open))
    return rc;
  return locked_read_begin(s, txn, err, err_bytes);
}

static void table_read_end(sl_store *s, MDB_txn *txn) {
  if (!txn)
    return;
  mdb_txn_abort(txn);
  pthread_rwlock_unlock(&s->map_lock);
}

/* A table value read back: checked, its payload in *payload. */
static int table_value_open(const sl_store *s, const char *table,
                            const MDB_val *key, const MDB_val *value,
                            MDB_val *payload, char *err, size_t err_bytes) {
  const uint8_t *stored = (const uint8_t *)value->mv_data +
                          value->mv_size - SL_STORE_CHECKSUM_BYTES;
  if (value->mv_size >= SL_STORE_CHECKSUM_BYTES) {
    payload->mv_data = value->mv_data;
    payload->mv_size = value->mv_size - SL_STORE_CHECKSUM_BYTES;
    if (get_le64(stored) ==
        checksum(DB_TABLES, key, payload->mv_data, payload->mv_size))
      return 0;
  }
  char text[3 * MESSAGE_KEY_BYTES + 128];
  key_text(DB_TABLES, key, text, sizeof text);
  return table_fail(s, err, err_bytes, SL_ECORRUPT,
                    "database tables, %s: value fails its checksum (table "
                    "\"%s\")", text, table);
}

/* The checks every table read makes of its arguments. */
static int table_args(const sl_store *s, const char *table, uint32_t key_bytes,
                      char *err, size_t err_bytes) {
  if (sl_store_table_name_check(table) != 0)
    return table_fail(s, err, err_bytes, EINVAL,
                      "table name \"%.60s\" is not 1..%u bytes of A-Z a-z "
                      "0-9 _ - .", table ? table : "(null)",
                      SL_STORE_TABLE_NAME_MAX);
  if (key_bytes > SL_STORE_TABLE_KEY_MAX)
    return table_fail(s, err, err_bytes, EINVAL,
                      "table \"%s\": a key of %" PRIu32 " bytes is too long "
                      "(at most %u)", table, key_bytes,
                      SL_STORE_TABLE_KEY_MAX);
  return 0;
}

int sl_store_table_get(sl_store *s, const char *table, const void *key,
                       uint32_t key_bytes, void **value,
                       uint32_t *value_bytes, char *err, size_t err_bytes) {
  *value = 0;
  *value_bytes = 0;
  int rc = table_args(s, table, key_bytes, err, err_bytes);
  if (rc == 0 && key_bytes > 0 && !key)
    rc = table_fail(s, err, err_bytes, EINVAL, "table \"%s\": key is NULL",
                    table);
  MDB_txn *txn = 0;
  if (rc == 0)
    rc = table_read_begin(s, &txn, err, err_bytes);
  if (rc != 0)
    return rc;
  uint8_t key_buffer[KEY_BUFFER_BYTES];
  MDB_val k = row_key(key_buffer, table, strlen(table), key, key_bytes);
  MDB_val stored, payload;
  rc = txn ? mdb_get(txn, s->dbi[DB_TABLES], &k, &stored) : MDB_NOTFOUND;
  if (rc == MDB_NOTFOUND)
    rc = table_fail(s, err, err_bytes, SL_ENOTFOUND,
                    "table \"%s\" has no row with that key", table);
  else if (rc != 0)
    rc = table_fail(s, err, err_bytes, rc, "table \"%s\": read: %s", table,
                    mdb_strerror(rc));
  else
    rc = table_value_open(s, table, &k, &stored, &payload, err, err_bytes);
  void *copy = 0;
  if (rc == 0 && !(copy = malloc(payload.mv_size ? payload.mv_size : 1)))
    rc = table_fail(s, err, err_bytes, ENOMEM, "table \"%s\": out of memory",
                    table);
  if (rc == 0) {
    if (payload.mv_size > 0)
      memcpy(copy, payload.mv_data, payload.mv_size);
    *value = copy;
    *value_bytes = (uint32_t)payload.mv_size;
  }
  table_read_end(s, txn);
  return rc;
}

/* The rows of table in txn into fn (sl_store_table_scan). */
static int table_walk(const sl_store *s, MDB_txn *txn, const char *table,
                      sl_store_row_fn fn, void *arg, char *err,
                      size_t err_bytes) {
  MDB_stat st;
  MDB_cursor *cursor;
  int rc = mdb_stat(txn, s->dbi[DB_TABLES], &st);
  if (rc == 0)
    rc = mdb_cursor_open(txn, s->dbi[DB_TABLES], &cursor);
  if (rc != 0)
    return table_fail(s, err, err_bytes, rc, "table \"%s\": read: %s", table,
                      mdb_strerror(rc));
  size_t name_bytes = strlen(table);
  uint8_t prefix[KEY_BUFFER_BYTES];
  MDB_val seek = row_key(prefix, table, name_bytes, 0, 0), key = seek, value;
  size_t prefix_bytes = seek.mv_size;
  int step = mdb_cursor_get(cursor, &key, &value, MDB_SET_RANGE);
  /* Bounded by the database's entries: each turn takes one. */
  rc = 0;
  for (size_t turn = 0; step == 0 && rc == 0 && turn < st.ms_entries;
       turn++) {
    if (key.mv_size < prefix_bytes ||
        memcmp(key.mv_data, prefix, prefix_bytes) != 0)
      break; /* past the table's range */
    MDB_val payload;
    rc = table_value_open(s, table, &key, &value, &payload, err, err_bytes);
    if (rc == 0) /* nonzero: fn's value, which stops the walk */
      rc = fn(arg, (const uint8_t *)key.mv_data + prefix_bytes,
              (uint32_t)(key.mv_size - prefix_bytes), payload.mv_data,
              (uint32_t)payload.mv_size);
    if (rc == 0)
      step = mdb_cursor_get(cursor, &key, &value, MDB_NEXT);
  }
  mdb_cursor_close(cursor);
  if (rc == 0 && step != 0 && step != MDB_NOTFOUND)
    rc = table_fail(s, err, err_bytes, step, "table \"%s\": read: %s", table,
                    mdb_strerror(step));
  return rc;
}

int sl_store_table_scan(sl_store *s, const char *table, sl_store_row_fn fn,
                        void *arg, char *err, size_t err_bytes) {
  int rc = table_args(s, table, 0, err, err_bytes);
  if (rc == 0 && !fn)
    rc = table_fail(s, err, err_bytes, EINVAL, "table \"%s\": no function",
                    table);
  MDB_txn *txn = 0;
  if (rc == 0)
    rc = table_read_begin(s, &txn, err, err_bytes);
  if (rc != 0 || !txn)
    return rc; /* !txn: no tables yet, nothing to walk */
  rc = table_walk(s, txn, table, fn, arg, err, err_bytes);
  table_read_end(s, txn);
  return rc;
}

int sl_store_table_count(sl_store *s, const char *table, uint64_t *rows,
                         char *err, size_t err_bytes) {
  *rows = 0;
  int rc = table_args(s, table, 0, err, err_bytes);
  MDB_txn *txn = 0;
  if (rc == 0)
    rc = table_read_begin(s, &txn, err, err_bytes);
  if (rc != 0 || !txn)
    return rc;
  uint8_t key_buffer[1 + SL_STORE_TABLE_NAME_MAX];
  MDB_val key = count_key(key_buffer, table, strlen(table)), stored, payload;
  rc = mdb_get(txn, s->dbi[DB_TABLES], &key, &stored);
  if (rc == MDB_NOTFOUND) {
    rc = 0; /* never written: empty */
  } else if (rc != 0) {
    rc = table_fail(s, err, err_bytes, rc, "table \"%s\": read the row "
                    "count: %s", table, mdb_strerror(rc));
  } else {
    rc = table_value_open(s, table, &key, &stored, &payload, err, err_bytes);
    if (rc == 0 && payload.mv_size != sizeof(uint64_t))
      rc = table_fail(s, err, err_bytes, SL_ECORRUPT,
                      "table \"%s\": the row count is %zu bytes, not 8",
                      table, payload.mv_size);
    if (rc == 0)
      *rows = get_le64(payload.mv_data);
  }
  table_read_end(s, txn);
  return rc;
}

int sl_store_read_latest(sl_store *s, uint64_t *id, char *err,
                         size_t err_bytes) {
  *id = 0;
  MDB_txn *txn;
  int rc = locked_read_begin(s, &txn, err, err_bytes);
  if (rc != 0)
    return rc;
  MDB_val key = meta_key("latest"), stored;
  rc = mdb_get(txn, s->dbi[DB_META], &key, &stored);
  if (rc != 0) {
    rc = table_fail(s, err, err_bytes, rc == MDB_NOTFOUND ? SL_ECORRUPT : rc,
                    "read meta \"latest\": %s", mdb_strerror(rc));
  } else if (stored.mv_size != 8 + SL_STORE_CHECKSUM_BYTES ||
             get_le64((const uint8_t *)stored.mv_data + 8) !=
                 checksum(DB_META, &key, stored.mv_data, 8)) {
    rc = table_fail(s, err, err_bytes, SL_ECORRUPT,
                    "meta \"latest\" fails its checksum");
  } else {
    *id = get_le64(stored.mv_data);
  }
  table_read_end(s, txn);
  return rc;
}

/* ------------------------------------------------------------ savepoints */

/* "<dir>: message" into err (NULL or err_bytes 0: none).  Returns rc. */
__attribute__((format(printf, 5, 6))) static int
dir_fail(const char *dir, char *err, size_t err_bytes, int rc,
         const char *format, ...) {
  assert(rc != 0);
  if (!err || err_bytes == 0)
    return rc;
  int at = snprintf(err, err_bytes, "%s: ", dir);
  if (at < 0 || (size_t)at >= err_bytes)
    return rc;
  va_list args;
  va_start(args, format);
  vsnprintf(err + at, err_bytes - (size_t)at, format, args);
  va_end(args);
  return rc;
}

/* A handle that sl_store_close frees, for dir, with nothing open yet. */
static sl_store *handle_new(const char *dir, bool read_only) {
  sl_store *s = calloc(1, sizeof *s);
  char *dir_copy = strdup(dir);
  if (!s || !dir_copy) {
    free(s);
    free(dir_copy);
    return 0;
  }
  s->dir = dir_copy;
  s->lock_fd = -1;
  s->dir_fd = -1;
  s->read_only = read_only;
  s->txn.store = s;
  s->txn.state = TXN_IDLE;
  atomic_init(&s->tables_open, false);
  pthread_rwlock_init(&s->map_lock, 0);
  pthread_mutex_init(&s->tables_lock, 0);
  return s;
}

/* 0, or errno: fsync of the directory path. */
static int sync_directory(const char *path) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return errno;
  int rc = fsync(fd) == 0 ? 0 : errno;
  close(fd);
  return rc;
}

/* The identity of the environment s->env (sl_store_inspect): magic and
 * format, and with the current format the graph and "latest". */
static int inspect_meta(sl_store *s, MDB_txn *txn, sl_store_info *info) {
  int rc = mdb_dbi_open(txn, db_names[DB_META], 0, &s->dbi[DB_META]);
  if (rc != 0 && rc != MDB_NOTFOUND && rc != MDB_INCOMPATIBLE)
    return lmdb_fail(s, rc, "open the meta database");
  MDB_val v;
  if (rc == 0)
    rc = meta_get(s, txn, "magic", &v); /* sets a message but NOTFOUND */
  MDB_val format;
  if (rc == MDB_NOTFOUND && meta_get(s, txn, "format", &format) == 0)
    return store_fail(s, SL_ECORRUPT, "meta \"magic\" is missing, "
                      "\"format\" is there");
  if (rc == MDB_NOTFOUND || rc == MDB_INCOMPATIBLE ||
      (rc == 0 && (v.mv_size != STORE_MAGIC_BYTES ||
                   memcmp(v.mv_data, STORE_MAGIC, STORE_MAGIC_BYTES) != 0)))
    return store_fail(s, SL_ESTORE,
                      "an LMDB environment, but not a sluice store");
  if (rc != 0)
    return rc;
  rc = meta_get(s, txn, "format", &v);
  if (rc == MDB_NOTFOUND || (rc == 0 && v.mv_size != sizeof(uint32_t)))
    return store_fail(s, SL_ECORRUPT, "meta \"format\" is missing or bad");
  if (rc != 0)
    return rc;
  const uint8_t *f = v.mv_data;
  info->format = (uint32_t)f[0] | (uint32_t)f[1] << 8 |
                 (uint32_t)f[2] << 16 | (uint32_t)f[3] << 24;
  if (info->format != SL_STORE_FORMAT_VERSION)
    return 0; /* the caller decides; the rest may be laid out otherwise */
  rc = meta_get(s, txn, "graph", &v);
  if (rc == MDB_NOTFOUND)
    return store_fail(s, SL_ECORRUPT, "meta \"graph\" is missing");
  if (rc != 0)
    return rc;
  info->graph = malloc(v.mv_size + 1);
  if (!info->graph)
    return store_fail(s, ENOMEM, "out of memory");
  memcpy(info->graph, v.mv_data, v.mv_size);
  info->graph[v.mv_size] = 0;
  return meta_get_u64(s, txn, "latest", &info->latest);
}

/* sl_store_inspect on the bare handle s. */
static int inspect_steps(sl_store *s, sl_store_info *info) {
  bool empty = false;
  int rc = inspect_data_file(s, &empty);
  if (rc == ENOENT)
    return store_fail(s, ENOENT, "holds no data.mdb");
  if (rc == 0 && empty)
    return store_fail(s, SL_ESTORE, "data.mdb is empty");
  if (rc == 0)
    rc = check_data_file(s); /* store.h note 8 */
  if (rc != 0)
    return rc; /* with its message */
  if ((rc = mdb_env_create(&s->env)) != 0) {
    s->env = 0;
    return lmdb_fail(s, rc, "mdb_env_create");
  }
  rc = mdb_env_set_maxdbs(s->env, DB_COUNT - 1);
  /* NOLOCK: no lock.mdb is made or used (a savepoint stays as it was). */
  if (rc == 0)
    rc = mdb_env_open(s->env, s->dir, MDB_RDONLY | MDB_NOLOCK,
                      STORE_FILE_MODE);
  if (rc == MDB_INVALID || rc == MDB_VERSION_MISMATCH)
    return store_fail(s, SL_ESTORE,
                      "data.mdb is not an LMDB file this LMDB reads (%s)",
                      mdb_strerror(rc));
  if (rc != 0)
    return lmdb_fail(s, rc, "open the environment");
  MDB_txn *txn;
  rc = mdb_txn_begin(s->env, 0, MDB_RDONLY, &txn);
  if (rc != 0)
    return lmdb_fail(s, rc, "begin a read transaction");
  rc = inspect_meta(s, txn, info);
  mdb_txn_abort(txn);
  return rc;
}

int sl_store_inspect(const char *dir, sl_store_info *info, char *err,
                     size_t err_bytes) {
  if (err && err_bytes > 0)
    err[0] = 0;
  if (!info)
    return EINVAL;
  memset(info, 0, sizeof *info);
  if (!dir)
    return dir_fail("(null)", err, err_bytes, EINVAL, "no directory");
  sl_store *s = handle_new(dir, true);
  if (!s)
    return dir_fail(dir, err, err_bytes, ENOMEM, "out of memory");
  int rc = inspect_steps(s, info);
  if (rc != 0) {
    if (err && err_bytes > 0)
      snprintf(err, err_bytes, "%s", s->error);
    free(info->graph);
    memset(info, 0, sizeof *info);
  }
  sl_store_close(s);
  assert(rc != 0 || info->format != SL_STORE_FORMAT_VERSION || info->graph);
  return rc;
}

int sl_store_copy(sl_store *s, const char *dir, uint64_t *id,
                  uint64_t *bytes, char *err, size_t err_bytes) {
  assert(s && s->env); /* an open handle */
  assert(dir != 0);
  *id = 0;
  *bytes = 0;
  if (err && err_bytes > 0)
    err[0] = 0;
  char path[PATH_MAX];
  int n = snprintf(path, sizeof path, "%s/data.mdb", dir);
  if (n < 0 || (size_t)n >= sizeof path)
    return dir_fail(dir, err, err_bytes, ENAMETOOLONG, "path too long");
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                STORE_FILE_MODE);
  if (fd < 0)
    return dir_fail(dir, err, err_bytes, errno, "cannot create data.mdb: %s",
                    strerror(errno));
  /* Note 10: the read side keeps sl_store_grow from remapping under the
   * copy's read transaction. */
  pthread_rwlock_rdlock(&s->map_lock);
  int rc = mdb_env_copyfd2(s->env, fd, MDB_CP_COMPACT);
  pthread_rwlock_unlock(&s->map_lock);
  struct stat st;
  memset(&st, 0, sizeof st);
  if (rc != 0)
    dir_fail(dir, err, err_bytes, rc, "copy of the store %s: %s", s->dir,
             mdb_strerror(rc));
  else if (fsync(fd) != 0 || fstat(fd, &st) != 0)
    rc = dir_fail(dir, err, err_bytes, errno, "sync of data.mdb: %s",
                  strerror(errno));
  close(fd);
  if (rc == 0 && (rc = sync_directory(dir)) != 0)
    dir_fail(dir, err, err_bytes, rc, "fsync of the directory: %s",
             strerror(rc));
  sl_store_info info = {0};
  if (rc == 0)
    rc = sl_store_inspect(dir, &info, err, err_bytes); /* read back */
  if (rc == 0 && info.latest == 0)
    rc = dir_fail(dir, err, err_bytes, SL_ENOTFOUND,
                  "the copy holds no complete checkpoint");
  if (rc == 0) {
    assert(info.format == SL_STORE_FORMAT_VERSION); /* ours */
    *id = info.latest;
    *bytes = (uint64_t)st.st_size;
  }
  free(info.graph);
  if (rc != 0)
    unlink(path);
  return rc;
}

int sl_store_delete_blob(sl_store_txn *txn, uint16_t op, uint16_t instance) {
  int rc = txn_usable(txn);
  if (rc != 0)
    return rc;
  sl_store *s = txn->store;
  uint8_t key_bytes[BLOB_KEY_BYTES];
  put_be16(key_bytes, op);
  put_be16(key_bytes + 2, instance);
  MDB_val key = {.mv_size = sizeof key_bytes, .mv_data = key_bytes};
  rc = mdb_del(txn->mdb, s->dbi[DB_BLOBS], &key, 0);
  if (rc != 0 && rc != MDB_NOTFOUND)
    return txn_fail(txn, lmdb_fail(s, rc, "delete blob"));
  /* A blob put earlier in txn is no longer there for commit_blob_ids. */
  uint32_t gone = (uint32_t)op << 16 | instance;
  for (size_t i = 0; i < txn->blob_count;) /* one pass over the puts */
    if (txn->blob_keys[i] == gone)
      txn->blob_keys[i] = txn->blob_keys[--txn->blob_count];
    else
      i++;
  return 0;
}

int sl_store_commit_graph(sl_store_txn *txn, const char *graph_fingerprint) {
  int rc = txn_usable(txn);
  if (rc != 0) {
    if (txn)
      txn_end(txn);
    return rc;
  }
  sl_store *s = txn->store;
  if (!graph_fingerprint)
    rc = store_fail(s, EINVAL, "commit graph: no fingerprint");
  else if (txn->last_key_bytes > 0 || txn->table_count > 0)
    rc = store_fail(s, EINVAL, "commit graph: the transaction wrote keyed "
                    "state or table rows");
  else if (txn->blob_count > 0 && s->latest == 0)
    rc = store_fail(s, EINVAL, "commit graph: blobs were put, but no "
                    "checkpoint is complete to hold them");
  if (rc == 0)
    rc = commit_blob_ids(txn, s->latest); /* note 3, with the latest id */
  MDB_val key = meta_key("graph");
  if (rc == 0 && (rc = value_put(s, txn->mdb, DB_META, &key, 0, 0,
                                 graph_fingerprint,
                                 strlen(graph_fingerprint), 0)) != 0)
    rc = lmdb_fail(s, rc, "commit graph: write meta \"graph\"");
  if (rc != 0) {
    txn_end(txn);
    return rc;
  }
  rc = mdb_txn_commit(txn->mdb); /* frees the LMDB transaction either way */
  txn->mdb = 0;
  txn->state = TXN_IDLE;
  txn->blob_count = 0;
  txn->table_count = 0;
  txn->rows = 0;
  assert(txn_check(txn));
  return rc != 0 ? lmdb_fail(s, rc, "commit graph") : 0;
}

/* Removes the staging directory of an install and what it holds (only
 * the files an install puts there; anything else stays). */
static void staging_remove(sl_store *s) {
  static const char *const names[] = {"data.mdb", "lock.mdb", "lock"};
  char path[PATH_MAX];
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    int n = snprintf(path, sizeof path, "%s/%s/%s", s->dir,
                     SL_STORE_STAGING_NAME, names[i]);
    if (n > 0 && (size_t)n < sizeof path)
      unlink(path);
  }
  if (dir_path(s, SL_STORE_STAGING_NAME, path, sizeof path) == 0)
    rmdir(path);
}

/* Copies the file from into the new file to, and fsyncs it. */
static int copy_file(sl_store *s, const char *from, const char *to) {
  int in = open(from, O_RDONLY | O_CLOEXEC);
  if (in < 0)
    return store_fail(s, errno, "cannot open %s: %s", from, strerror(errno));
  int out = open(to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                 STORE_FILE_MODE);
  enum { CHUNK_BYTES = 1 << 20 };
  char *buffer = out >= 0 ? malloc(CHUNK_BYTES) : 0;
  struct stat st;
  int rc = out < 0 ? errno : !buffer ? ENOMEM : fstat(in, &st) ? errno : 0;
  /* Bounded by the file's size: each turn copies a chunk or ends. */
  uint64_t turns = rc == 0 ? (uint64_t)st.st_size / CHUNK_BYTES + 2 : 0;
  for (uint64_t turn = 0; rc == 0 && turn < turns; turn++) {
    ssize_t got = read(in, buffer, CHUNK_BYTES);
    if (got <= 0) {
      rc = got < 0 ? errno : 0;
      break;
    }
    for (ssize_t at = 0; rc == 0 && at < got;) { /* short writes */
      ssize_t put = write(out, buffer + at, (size_t)(got - at));
      if (put < 0)
        rc = errno;
      else
        at += put;
    }
  }
  if (rc == 0 && fsync(out) != 0)
    rc = errno;
  free(buffer);
  close(in);
  if (out >= 0)
    close(out);
  return rc ? store_fail(s, rc, "cannot copy %s to %s: %s", from, to,
                         strerror(rc))
            : 0;
}

/* Note 7: a store with checkpoints already in the directory is replaced
 * only when asked; someone else's file never. */
static int install_check_target(sl_store *s, bool replace) {
  bool empty = false;
  int rc = inspect_data_file(s, &empty);
  if (rc != 0 || empty)
    return rc; /* empty: an interrupted creation, nothing to keep */
  sl_store_info info;
  char message[STORE_ERROR_BYTES];
  rc = sl_store_inspect(s->dir, &info, message, sizeof message);
  if (rc != 0)
    return store_fail(s, rc == ENOENT ? SL_ESTORE : rc, "%s", message);
  uint64_t latest = info.latest;
  free(info.graph);
  if (info.format != SL_STORE_FORMAT_VERSION)
    return store_fail(s, SL_ESTORE, "holds a store of format version %"
                      PRIu32 " (this sluice writes %u)", info.format,
                      SL_STORE_FORMAT_VERSION);
  if (latest > 0 && !replace)
    return store_fail(s, SL_EHASSTATE,
                      "holds checkpoints (the newest complete one is %"
                      PRIu64 "): a job started from a savepoint needs a "
                      "state directory without any, or the policy to start "
                      "fresh (which replaces them)", latest);
  return 0;
}

/* Note 7: the copy, checked and edited in the staging directory. */
static int install_stage(sl_store *s, const char *source_dir,
                         const sl_store_install_options *o) {
  assert(o->source_graph && o->graph); /* sl_store_install checked */
  assert(s->lock_fd >= 0 && s->dir_fd >= 0); /* the directory is ours */
  char staging[PATH_MAX], from[PATH_MAX], to[PATH_MAX];
  int rc = dir_path(s, SL_STORE_STAGING_NAME, staging, sizeof staging);
  if (rc != 0)
    return rc;
  staging_remove(s); /* an interrupted install's */
  if (mkdir(staging, STORE_DIR_MODE) != 0)
    return store_fail(s, errno, "cannot create %s: %s", staging,
                      strerror(errno));
  int n = snprintf(from, sizeof from, "%s/data.mdb", source_dir);
  int m = snprintf(to, sizeof to, "%s/data.mdb", staging);
  if (n < 0 || (size_t)n >= sizeof from || m < 0 || (size_t)m >= sizeof to)
    return store_fail(s, ENAMETOOLONG, "path too long");
  if ((rc = copy_file(s, from, to)) != 0)
    return rc;
  sl_store *copy;
  char message[STORE_ERROR_BYTES];
  sl_store_options options = {.graph_fingerprint = o->source_graph,
                              .no_sync = o->no_sync};
  rc = sl_store_open(staging, &options, &copy, message, sizeof message);
  if (rc != 0)
    return store_fail(s, rc, "the copy of %s: %s", source_dir, message);
  sl_store_txn *txn = 0;
  if (sl_store_latest(copy) == 0)
    rc = store_fail(s, SL_ENOTFOUND, "%s holds no complete checkpoint",
                    source_dir);
  if (rc == 0 && (rc = sl_store_begin(copy, &txn)) != 0)
    store_fail(s, rc, "%s", sl_store_error(copy));
  if (rc == 0 && o->edit) {
    s->error[0] = 0;
    rc = o->edit(o->edit_arg, copy, txn, s->error, sizeof s->error);
    if (rc != 0)
      sl_store_abort(txn);
  }
  if (rc == 0 && (rc = sl_store_commit_graph(txn, o->graph)) != 0)
    store_fail(s, rc, "%s", sl_store_error(copy));
  sl_store_close(copy);
  return rc;
}

/* Note 7: the rename that installs the copy, then the cleanup. */
static int install_move(sl_store *s) {
  assert(s->lock_fd >= 0);
  char from[PATH_MAX], to[PATH_MAX];
  int n = snprintf(from, sizeof from, "%s/%s/data.mdb", s->dir,
                   SL_STORE_STAGING_NAME);
  if (n < 0 || (size_t)n >= sizeof from)
    return store_fail(s, ENAMETOOLONG, "path too long");
  int rc = dir_path(s, "data.mdb", to, sizeof to);
  if (rc == 0 && rename(from, to) != 0)
    rc = store_fail(s, errno, "cannot move %s to %s: %s", from, to,
                    strerror(errno));
  if (rc == 0)
    rc = fsync_directory(s, s->dir);
  if (rc == 0)
    staging_remove(s);
  return rc;
}

int sl_store_install(const char *dir, const char *source_dir,
                     const sl_store_install_options *options, char *err,
                     size_t err_bytes) {
  if (err && err_bytes > 0)
    err[0] = 0;
  if (!dir || !source_dir || !options || !options->source_graph ||
      !options->graph)
    return dir_fail(dir ? dir : "(null)", err, err_bytes, EINVAL,
                    "sl_store_install: an argument is NULL");
  sl_store *s = handle_new(dir, false);
  if (!s)
    return dir_fail(dir, err, err_bytes, ENOMEM, "out of memory");
  bool has_data = false, created = false, lock_created = false;
  bool flocked = false;
  int rc = inspect_dir(s, &has_data, &created);
  if (rc == 0)
    rc = registry_add(s); /* note 6: no handle of this process has it */
  if (rc == 0)
    rc = take_lock(s, &lock_created, &flocked); /* nor has another process */
  if (rc == 0 && has_data)
    rc = install_check_target(s, options->replace != 0);
  if (rc == 0)
    rc = install_stage(s, source_dir, options);
  if (rc == 0)
    rc = install_move(s);
  if (rc != 0) {
    if (err && err_bytes > 0)
      snprintf(err, err_bytes, "%s", s->error);
    staging_remove(s);
    char path[PATH_MAX];
    if (lock_created && dir_path(s, "lock", path, sizeof path) == 0)
      unlink(path);
  }
  sl_store_close(s);
  if (rc != 0 && created)
    rmdir(dir); /* made by this call, empty again */
  return rc;
}

/* ------------------------------------------------------------ inspection */

/* Every blob in key order, checked, with its checkpoint id (note 1). */
static int view_blobs(sl_store *s, MDB_txn *txn, uint64_t latest,
                      sl_store_blob_fn fn, void *arg) {
  MDB_cursor *cursor;
  int rc = mdb_cursor_open(txn, s->dbi[DB_BLOBS], &cursor);
  if (rc != 0)
    return lmdb_fail(s, rc, "open a blob cursor");
  MDB_val key, stored, payload;
  rc = mdb_cursor_get(cursor, &key, &stored, MDB_FIRST);
  /* Bounded by the blobs database: one entry per operator instance. */
  for (; rc == 0; rc = mdb_cursor_get(cursor, &key, &stored, MDB_NEXT)) {
    if (key.mv_size != BLOB_KEY_BYTES) {
      rc = corrupt(s, DB_BLOBS, &key, "key is not (op, instance)");
      break;
    }
    if ((rc = value_open(s, DB_BLOBS, &key, &stored, &payload)) != 0)
      break;
    if (payload.mv_size < BLOB_ID_BYTES) {
      rc = corrupt(s, DB_BLOBS, &key, "value too short");
      break;
    }
    uint64_t id = get_le64(payload.mv_data);
    if (id == 0 || id > latest) {
      rc = corrupt(s, DB_BLOBS, &key, "blob tagged with no valid checkpoint");
      break;
    }
    rc = fn ? fn(arg, get_be16(key.mv_data), get_be16((uint8_t *)key.mv_data + 2),
                 id, (const uint8_t *)payload.mv_data + BLOB_ID_BYTES,
                 (uint32_t)(payload.mv_size - BLOB_ID_BYTES))
            : 0;
    if (rc != 0)
      break;
  }
  mdb_cursor_close(cursor);
  if (rc == MDB_NOTFOUND)
    return 0;
  return rc;
}

/* The counts and the fingerprint of view, in txn. */
static int view_meta(sl_store *s, MDB_txn *txn, sl_store_view *view) {
  int base = DB_STATE;
  int rc = meta_get_u64(s, txn, "latest", &view->latest);
  if (rc == 0)
    rc = meta_get_base(s, txn, &base);
  MDB_stat log_stat, base_stat, table_stat = {0};
  if (rc == 0 && ((rc = mdb_stat(txn, s->dbi[DB_LOG], &log_stat)) != 0 ||
                  (rc = mdb_stat(txn, s->dbi[base], &base_stat)) != 0 ||
                  (atomic_load(&s->tables_open) &&
                   (rc = mdb_stat(txn, s->dbi[DB_TABLES], &table_stat)) != 0)))
    rc = lmdb_fail(s, rc, "count entries");
  MDB_val graph;
  if (rc == 0 && (rc = meta_get(s, txn, "graph", &graph)) == MDB_NOTFOUND)
    rc = store_fail(s, SL_ECORRUPT, "meta \"graph\" is missing");
  if (rc != 0)
    return rc;
  view->format = SL_STORE_FORMAT_VERSION; /* sl_store_open checked it */
  view->log_entries = log_stat.ms_entries;
  view->base_entries = base_stat.ms_entries;
  view->table_entries = table_stat.ms_entries;
  view->graph = malloc(graph.mv_size + 1);
  if (!view->graph)
    return store_fail(s, ENOMEM, "read the graph: out of memory");
  memcpy(view->graph, graph.mv_data, graph.mv_size);
  view->graph[graph.mv_size] = 0;
  return 0;
}

int sl_store_read_view(sl_store *s, sl_store_view *view, sl_store_blob_fn fn,
                       void *arg) {
  assert(s != 0);
  assert(view != 0);
  memset(view, 0, sizeof *view);
  MDB_txn *txn;
  int rc = read_begin(s, &txn);
  if (rc != 0)
    return rc;
  rc = view_meta(s, txn, view);
  if (rc == 0)
    rc = view_blobs(s, txn, view->latest, fn, arg);
  mdb_txn_abort(txn);
  if (rc != 0) {
    free(view->graph);
    view->graph = 0;
  }
  return rc;
}
