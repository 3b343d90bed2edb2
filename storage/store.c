/* store.c — the LMDB store of a job's state directory (store.h holds the
 * design notes 1-5 and the contract of every call).
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
 * 5. Opening (store.h notes 4, 5), in this order: inspect the directory
 *    with plain file calls (a foreign directory sees no write at all);
 *    read data.mdb's first meta page for LMDB's magic; claim the directory
 *    in the in-process registry; take the flock (writers); open the
 *    environment; check meta, or initialise it if the environment is
 *    empty.  The environment is opened once, after the lock: a second
 *    writer never reaches LMDB.
 * 6. In-process registry.  LMDB forbids opening one environment twice in a
 *    process (closing the second handle would drop the first one's fcntl
 *    locks).  flock stops a second writer but not a reader beside a
 *    writer, so open handles are listed by the directory's (device, inode)
 *    and a second open of a directory in one process is refused.
 */
#include "store.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "sluice.h"

#define STORE_MAGIC "sluice-store"
#define STORE_MAGIC_BYTES (sizeof STORE_MAGIC - 1)
#define STORE_ERROR_BYTES 1024
#define STORE_DEFAULT_MAP_BYTES (64ull << 20)
#define STORE_DIR_MODE 0755
#define STORE_FILE_MODE 0644
/* At least LMDB's largest key (511 by default); longer keys are refused
 * before they reach the buffer. */
#define KEY_BUFFER_BYTES 512u
#define STATE_PREFIX_BYTES 4u /* u16 op, u16 key group, big-endian */
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
_Static_assert(STATE_PREFIX_BYTES < KEY_BUFFER_BYTES, "a state key fits");
_Static_assert(2 * MESSAGE_FINGERPRINT_BYTES + 200 < STORE_ERROR_BYTES,
               "a graph mismatch message leaves room for the directory");

/* Database numbers: the index of each handle and the checksum's seed. */
enum { DB_META = 1, DB_CHECKPOINTS = 2, DB_BLOBS = 3, DB_STATE = 4, DB_COUNT };
static const char *const db_names[DB_COUNT] = {
    "", "meta", "checkpoints", "blobs", "state"};

enum txn_state { TXN_IDLE, TXN_ACTIVE, TXN_FAILED };

struct sl_store_txn {
  sl_store *store;
  MDB_txn *mdb; /* exactly in TXN_ACTIVE (note 4) */
  enum txn_state state;
  int failure; /* TXN_FAILED: what the failing call returned */
  uint8_t key[KEY_BUFFER_BYTES];
  uint32_t *blob_keys; /* op << 16 | instance of each blob put (note 3) */
  size_t blob_count;
  size_t blob_capacity;
  uint8_t *copy; /* a blob's bytes while the commit rewrites it */
  size_t copy_capacity_bytes;
};

struct sl_store {
  MDB_env *env;
  MDB_dbi dbi[DB_COUNT]; /* indexed by database number */
  char *dir;
  int lock_fd; /* -1: none (read-only, or not taken yet) */
  bool read_only;
  bool no_sync;
  bool registered; /* listed in the registry (note 6) */
  uint64_t latest; /* writer: exact; read-only: as of the open */
  uint32_t state_key_max_bytes;
  dev_t dir_device;
  ino_t dir_inode;
  sl_store *registry_next;
  sl_store_txn txn;
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
  int at = snprintf(s->error, sizeof s->error, "%s: ", s->dir);
  if (at < 0 || (size_t)at >= sizeof s->error)
    return rc; /* the directory alone fills the buffer */
  va_list args;
  va_start(args, format);
  vsnprintf(s->error + at, sizeof s->error - (size_t)at, format, args);
  va_end(args);
  return rc;
}

/* An LMDB (or errno) failure of the step `what`.  A full map says what to
 * do about it (store.h note 3). */
static int lmdb_fail(sl_store *s, int rc, const char *what) {
  if (rc == MDB_MAP_FULL) {
    MDB_envinfo info;
    mdb_env_info(s->env, &info);
    return store_fail(s, rc,
                      "%s: the map of %zu bytes is full (grow it with "
                      "sl_store_grow and write the transaction again)",
                      what, info.me_mapsize);
  }
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
 * "op 2 instance 0", "checkpoint 12", "\"latest\"". */
static void key_text(int db, const MDB_val *key, char *out, size_t out_bytes) {
  const uint8_t *k = key->mv_data;
  char hex[2 * MESSAGE_KEY_BYTES + 4];
  if (db == DB_STATE && key->mv_size >= STATE_PREFIX_BYTES) {
    hex_text(k + STATE_PREFIX_BYTES, key->mv_size - STATE_PREFIX_BYTES, hex,
             sizeof hex);
    snprintf(out, out_bytes, "op %u key group %u key %s (%zu bytes)",
             get_be16(k), get_be16(k + 2), hex,
             key->mv_size - STATE_PREFIX_BYTES);
  } else if (db == DB_BLOBS && key->mv_size == BLOB_KEY_BYTES) {
    snprintf(out, out_bytes, "op %u instance %u", get_be16(k),
             get_be16(k + 2));
  } else if (db == DB_CHECKPOINTS && key->mv_size == CHECKPOINT_KEY_BYTES) {
    snprintf(out, out_bytes, "checkpoint %" PRIu64, get_be64(k));
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
  return store_fail(s, SL_ECORRUPT, "database %s, %s: %s", db_names[db], text,
                    problem);
}

/* ------------------------------------------------------------ values */

static uint64_t checksum(int db, const MDB_val *key, const void *payload,
                         size_t payload_bytes) {
  assert(db > 0 && db < DB_COUNT);
  XXH64_hash_t seed = XXH3_64bits_withSeed(key->mv_data, key->mv_size,
                                           (XXH64_hash_t)db);
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

/* Puts key -> head || body || checksum into db with MDB_RESERVE (note 2).
 * head is a blob's id (or nothing). */
static int value_put(sl_store *s, MDB_txn *txn, int db, MDB_val *key,
                     const void *head, size_t head_bytes, const void *body,
                     size_t body_bytes) {
  assert(key->mv_size > 0 && key->mv_size <= KEY_BUFFER_BYTES);
  assert(body_bytes == 0 || body != 0);
  size_t payload_bytes = head_bytes + body_bytes;
  MDB_val value = {.mv_size = payload_bytes + SL_STORE_CHECKSUM_BYTES,
                   .mv_data = 0};
  int rc = mdb_put(txn, s->dbi[db], key, &value, MDB_RESERVE);
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

/* Reads meta "latest" (u64). */
static int meta_get_latest(sl_store *s, MDB_txn *txn, uint64_t *latest) {
  MDB_val payload;
  int rc = meta_get(s, txn, "latest", &payload);
  if (rc == MDB_NOTFOUND)
    return store_fail(s, SL_ECORRUPT, "meta \"latest\" is missing");
  if (rc == 0 && payload.mv_size != sizeof(uint64_t))
    return store_fail(s, SL_ECORRUPT, "meta \"latest\" has %zu bytes, not 8",
                      payload.mv_size);
  if (rc == 0)
    *latest = get_le64(payload.mv_data);
  return rc;
}

static int meta_put_latest(sl_store *s, MDB_txn *txn, uint64_t latest) {
  uint8_t bytes[sizeof(uint64_t)];
  put_le64(bytes, latest);
  MDB_val key = meta_key("latest");
  return value_put(s, txn, DB_META, &key, 0, 0, bytes, sizeof bytes);
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
 * "lock" and "lock.mdb" alone are ours: an interrupted creation. */
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
    else if (strcmp(name, "lock") != 0 && strcmp(name, "lock.mdb") != 0)
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

/* The writer's exclusive lock (store.h note 5).  *created: this call made
 * the lock file, so a refusal later may remove it again. */
static int take_lock(sl_store *s, bool *created) {
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
  if (flock(fd, LOCK_EX | LOCK_NB) == 0)
    return 0;
  if (errno == EWOULDBLOCK)
    return store_fail(s, SL_ESTORE,
                      "in use by another process (it holds %s)", path);
  return store_fail(s, errno, "cannot lock %s: %s", path, strerror(errno));
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
  /* NOTLS: a read transaction is not tied to its thread (the store moves
   * between the restoring thread and the writer thread).  No map size is
   * set yet, so LMDB adopts the stored one (open_map_size). */
  /* WRITEMAP: a writer updates pages in the map itself instead of copies
   * in a dirty-page list (about 1.3x faster puts here); the data file is
   * then extended to the map size, sparsely — which is why an existing
   * directory is first checked without it (open_store). */
  unsigned flags = MDB_NOTLS | (s->no_sync ? MDB_NOSYNC : 0) |
                   (s->read_only ? MDB_RDONLY : 0) |
                   (writemap ? MDB_WRITEMAP : 0);
  rc = mdb_env_open(s->env, s->dir, flags, STORE_FILE_MODE);
  if (rc == MDB_INVALID || rc == MDB_VERSION_MISMATCH)
    return store_fail(s, SL_ESTORE,
                      "data.mdb is not an LMDB file this LMDB reads (%s)",
                      mdb_strerror(rc));
  if (rc != 0)
    return lmdb_fail(s, rc, "mdb_env_open");
  int key_max_bytes = mdb_env_get_maxkeysize(s->env);
  assert(key_max_bytes > (int)STATE_PREFIX_BYTES);
  if ((unsigned)key_max_bytes > KEY_BUFFER_BYTES)
    key_max_bytes = KEY_BUFFER_BYTES; /* an LMDB built with larger keys */
  s->state_key_max_bytes = (uint32_t)key_max_bytes - STATE_PREFIX_BYTES;
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
  if (rc == MDB_NOTFOUND || (rc == 0 && (v.mv_size != STORE_MAGIC_BYTES ||
                                         memcmp(v.mv_data, STORE_MAGIC,
                                                STORE_MAGIC_BYTES) != 0)))
    return store_fail(s, SL_ESTORE,
                      "an LMDB environment, but not a sluice store");
  if (rc == 0)
    rc = meta_get(s, txn, "format", &v);
  if (rc == MDB_NOTFOUND || (rc == 0 && v.mv_size != sizeof(uint32_t)))
    return store_fail(s, SL_ECORRUPT, "meta \"format\" is missing or bad");
  if (rc != 0)
    return rc;
  uint32_t format = (uint32_t)((const uint8_t *)v.mv_data)[0] |
                    (uint32_t)((const uint8_t *)v.mv_data)[1] << 8 |
                    (uint32_t)((const uint8_t *)v.mv_data)[2] << 16 |
                    (uint32_t)((const uint8_t *)v.mv_data)[3] << 24;
  if (format > SL_STORE_FORMAT_VERSION || format == 0)
    return store_fail(s, SL_ESTORE,
                      "store format version %" PRIu32 ", this sluice reads "
                      "up to %u",
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

/* Opens the named databases (they exist: meta_init made them together). */
static int meta_open_databases(sl_store *s, MDB_txn *txn) {
  for (int db = DB_CHECKPOINTS; db < DB_COUNT; db++) {
    int rc = mdb_dbi_open(txn, db_names[db], 0, &s->dbi[db]);
    if (rc == MDB_NOTFOUND || rc == MDB_INCOMPATIBLE)
      return store_fail(s, SL_ECORRUPT, "the database %s is missing",
                        db_names[db]);
    if (rc != 0)
      return lmdb_fail(s, rc, "open a database");
  }
  return 0;
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
  if (rc == 0)
    rc = meta_get_latest(s, txn, &s->latest);
  if (rc == 0)
    rc = meta_open_databases(s, txn);
  if (rc != 0) {
    mdb_txn_abort(txn);
    return rc;
  }
  /* Committing a read transaction keeps the handles it opened. */
  rc = mdb_txn_commit(txn);
  return rc != 0 ? lmdb_fail(s, rc, "end the read transaction") : 0;
}

/* Makes an empty environment a store: the four databases and meta, in
 * one durable transaction. */
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
                   STORE_MAGIC_BYTES);
  key = meta_key("format");
  if (rc == 0)
    rc = value_put(s, txn, DB_META, &key, 0, 0, format, sizeof format);
  key = meta_key("graph");
  if (rc == 0)
    rc = value_put(s, txn, DB_META, &key, 0, 0, fingerprint,
                   strlen(fingerprint));
  if (rc == 0)
    rc = meta_put_latest(s, txn, 0);
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
  /* data.mdb and lock are new entries of the directory. */
  return fsync_directory(s, s->dir);
}

/* Note 5 after the lock: the environment and its meta. */
static int open_store(sl_store *s, const sl_store_options *options,
                      bool existing) {
  bool fresh = false;
  if (existing && !s->read_only) {
    /* Check an existing environment without WRITEMAP first: refusing it
     * (someone else's, another graph, a newer format) must leave data.mdb
     * untouched, and a WRITEMAP open would extend it to the map size. */
    int rc = open_env(s, false);
    if (rc == 0)
      rc = meta_check(s, options->graph_fingerprint, &fresh);
    mdb_env_close(s->env);
    s->env = 0;
    memset(s->dbi, 0, sizeof s->dbi);
    if (rc != 0)
      return rc;
  }
  int rc = open_env(s, !s->read_only);
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
  bool lock_created = false, locked = false;
  if (rc == 0 && !s->read_only)
    rc = take_lock(s, &lock_created);
  locked = rc == 0 && !s->read_only;
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
  s->read_only = options->read_only != 0;
  s->no_sync = options->no_sync != 0;
  s->txn.store = s;
  s->txn.state = TXN_IDLE;
  int rc = open_steps(s, options);
  if (rc != 0) {
    if (err && err_bytes > 0)
      snprintf(err, err_bytes, "%s", s->error);
    sl_store_close(s);
    return rc;
  }
  assert(s->env != 0);
  assert(s->read_only == (s->lock_fd < 0));
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
  registry_remove(s);
  free(s->txn.blob_keys);
  free(s->txn.copy);
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
  MDB_txn *mdb;
  assert(txn_check(&s->txn));
  assert(s->txn.blob_count == 0); /* txn_end cleared it */
  int rc = mdb_txn_begin(s->env, 0, 0, &mdb);
  if (rc != 0)
    return lmdb_fail(s, rc, "begin a write transaction");
  s->txn.mdb = mdb;
  s->txn.state = TXN_ACTIVE;
  s->txn.blob_count = 0;
  assert(txn_check(&s->txn));
  *txn = &s->txn;
  return 0;
}

/* The state key (op, key group, key) in the transaction's buffer. */
static MDB_val state_key(sl_store_txn *t, uint16_t op, uint16_t key_group,
                         const void *key, uint32_t key_bytes) {
  assert(key_bytes <= KEY_BUFFER_BYTES - STATE_PREFIX_BYTES);
  put_be16(t->key, op);
  put_be16(t->key + 2, key_group);
  if (key_bytes > 0)
    memcpy(t->key + STATE_PREFIX_BYTES, key, key_bytes);
  return (MDB_val){.mv_size = STATE_PREFIX_BYTES + key_bytes,
                   .mv_data = t->key};
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
  if (value_bytes > UINT32_MAX - SL_STORE_CHECKSUM_BYTES)
    return txn_fail(txn, store_fail(s, EINVAL,
                                    "put state: a value of %" PRIu32
                                    " bytes is too long",
                                    value_bytes));
  MDB_val k = state_key(txn, op, key_group, key, key_bytes);
  rc = value_put(s, txn->mdb, DB_STATE, &k, 0, 0, value, value_bytes);
  if (rc != 0)
    return txn_fail(txn, lmdb_fail(s, rc, "put state"));
  return 0;
}

int sl_store_delete_state(sl_store_txn *txn, uint16_t op, uint16_t key_group,
                          const void *key, uint32_t key_bytes) {
  int rc = txn_usable(txn);
  if (rc == 0)
    rc = check_state_key(txn, key_bytes, "delete state");
  if (rc != 0)
    return rc;
  sl_store *s = txn->store;
  MDB_val k = state_key(txn, op, key_group, key, key_bytes);
  rc = mdb_del(txn->mdb, s->dbi[DB_STATE], &k, 0);
  if (rc != 0 && rc != MDB_NOTFOUND) /* absent is not an error */
    return txn_fail(txn, lmdb_fail(s, rc, "delete state"));
  return 0;
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
                 data, bytes);
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
                   body_bytes);
    if (rc != 0)
      return lmdb_fail(s, rc, "commit: rewrite a blob");
  }
  return 0;
}

/* The record of checkpoint id and "latest" = id, read back before the
 * commit sends them to disk. */
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
                     record_bytes);
  if (rc == 0)
    rc = meta_put_latest(s, t->mdb, id);
  if (rc != 0)
    return lmdb_fail(s, rc, "commit: write the checkpoint record");
  uint64_t latest = 0;
  rc = meta_get_latest(s, t->mdb, &latest);
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
    rc = commit_record(txn, id, record, record_bytes);
  if (rc != 0) {
    txn_end(txn);
    return rc;
  }
  assert(id > s->latest);
  rc = mdb_txn_commit(txn->mdb); /* frees the LMDB transaction either way */
  txn->mdb = 0;
  txn->state = TXN_IDLE;
  txn->blob_count = 0;
  assert(txn_check(txn));
  if (rc != 0)
    return lmdb_fail(s, rc, "commit");
  s->latest = id;
  return 0;
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
  int rc = mdb_env_set_mapsize(s->env, (size_t)(2 * now_bytes));
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
  for (int db = DB_CHECKPOINTS; db < DB_COUNT && rc == 0; db++)
    rc = mdb_drop(txn, s->dbi[db], 0); /* empty it, keep the database */
  if (rc == 0)
    rc = meta_put_latest(s, txn, 0);
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

typedef int (*state_fn)(void *arg, uint16_t key_group, const void *key,
                        uint32_t key_bytes, const void *value,
                        uint32_t value_bytes);

/* Walks the state entries from (op, group_first) on while they belong to
 * op and group_last.  entries (the database's count) bounds the walk. */
static int scan_state(sl_store *s, MDB_cursor *cursor, uint16_t op,
                      uint16_t group_first, uint16_t group_last, state_fn fn,
                      void *arg, size_t entries) {
  uint8_t prefix[STATE_PREFIX_BYTES];
  put_be16(prefix, op);
  put_be16(prefix + 2, group_first);
  MDB_val key = {.mv_size = sizeof prefix, .mv_data = prefix}, value, payload;
  int rc = mdb_cursor_get(cursor, &key, &value, MDB_SET_RANGE);
  for (size_t visited = 0; rc == 0; visited++) {
    if (visited >= entries) /* each step is another entry */
      return store_fail(s, SL_ECORRUPT,
                        "read state: more entries than the %zu counted",
                        entries);
    if (key.mv_size < STATE_PREFIX_BYTES)
      return corrupt(s, DB_STATE, &key, "key shorter than its prefix");
    const uint8_t *k = key.mv_data;
    uint16_t group = get_be16(k + 2);
    if (get_be16(k) != op || group > group_last)
      return 0; /* past the range: big-endian prefixes sort by (op, group) */
    assert(group >= group_first); /* MDB_SET_RANGE started at the prefix */
    if ((rc = value_open(s, DB_STATE, &key, &value, &payload)) != 0)
      return rc;
    int stop = fn(arg, group, k + STATE_PREFIX_BYTES,
                  (uint32_t)(key.mv_size - STATE_PREFIX_BYTES),
                  payload.mv_data, (uint32_t)payload.mv_size);
    if (stop != 0)
      return stop;
    rc = mdb_cursor_get(cursor, &key, &value, MDB_NEXT);
  }
  return rc == MDB_NOTFOUND ? 0 : lmdb_fail(s, rc, "read state");
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
  MDB_stat st;
  MDB_cursor *cursor = 0;
  rc = mdb_stat(txn, s->dbi[DB_STATE], &st);
  if (rc == 0)
    rc = mdb_cursor_open(txn, s->dbi[DB_STATE], &cursor);
  if (rc != 0)
    rc = lmdb_fail(s, rc, "read state");
  else
    rc = scan_state(s, cursor, op, group_first, group_last, fn, arg,
                    st.ms_entries);
  if (cursor)
    mdb_cursor_close(cursor);
  mdb_txn_abort(txn);
  return rc;
}

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
