/* store.c — the LMDB store of a job's state directory: opening (the
 * directory, its locks, the environment, meta), closing, the in-process
 * registry, errors, and the checked values every piece reads and writes.
 * store.h holds the design notes 1-8 and the contract of every call;
 * store_internal.h lists the other pieces and what they share.
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
 * 3. Opening (store.h notes 4, 5, 8), in this order: inspect the
 *    directory with plain file calls (a foreign directory sees no write
 *    at all); read data.mdb's first meta page for LMDB's magic (without
 *    it, a file whose second meta page has it is LMDB's, damaged:
 *    SL_ECORRUPT; else a foreign file: SL_ESTORE); claim the
 *    directory in the in-process registry; take the flocks (a writer: of
 *    "lock", then of the directory, store_take_lock; a reader: the
 *    directory's shared one, or none beside a live writer, reader_lock);
 *    walk data.mdb unless a live writer holds it (store_check_data_file);
 *    open the
 *    environment; check meta, or initialise it if the environment is
 *    empty.  The environment is opened once, after the lock and the
 *    walk: a second writer and a damaged file never reach LMDB.
 * 4. In-process registry.  LMDB forbids opening one environment twice in a
 *    process (closing the second handle would drop the first one's fcntl
 *    locks).  flock stops a second writer but not a reader beside a
 *    writer, so open handles are listed by the directory's (device, inode)
 *    and a second open of a directory in one process is refused.
 * 5. The walk (store.h note 8) follows the newest meta page, the one with
 *    the greater txnid, as LMDB does.  A txnid of the older meta page
 *    damaged upwards by 2 (same page parity, one above the newest's) makes
 *    it the newest in the eyes of both, and the store opens as the
 *    previous checkpoint, consistent and silent.  LMDB's last page number
 *    never goes down from one commit to the next (a write transaction
 *    starts at the newest meta's and only adds pages), so the older meta
 *    reaching past the newest's last page is damage (check_meta_order).
 *    That catches the damage whenever the newest commit grew the file,
 *    not when it only reused free pages: a full check needs the txnid of
 *    each commit inside the checksummed meta, a format change (older
 *    binaries of format 3 would write the store without keeping it, and
 *    a savepoint's compacted copy restarts LMDB's txnids at 1).  A crash
 *    cannot trip the check: LMDB writes a commit's meta page last, its
 *    fields in one write inside the page's first sector with the txnid
 *    last, and a failed write puts the old last page and txnid back; a
 *    compacted copy's meta page 0 is LMDB's initial one (last page 1,
 *    txnid 0).  It runs where the walk runs (no live writer), and costs
 *    one pread a page.
 */
#include "store_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "lmdb_check.h"
#include "sluice.h"

/* ------------------------------------------------------------ errors */

/* "<dir>: <prefix><message>" into out (out_bytes > 0), the message
 * cut to fit: the one format of store_fail and store_dir_fail. */
__attribute__((format(printf, 5, 0))) static void
message_format(char *out, size_t out_bytes, const char *dir,
               const char *prefix, const char *format, va_list args) {
  assert(out_bytes > 0);
  int at = snprintf(out, out_bytes, "%s: %s", dir, prefix);
  if (at < 0 || (size_t)at >= out_bytes)
    return; /* the directory alone fills the buffer */
  vsnprintf(out + at, out_bytes - (size_t)at, format, args);
}

/* Formats "<dir>: message" into the handle and returns rc, so a failure
 * is reported in one line: return store_fail(s, EINVAL, "...");. */
__attribute__((format(printf, 3, 4))) int
store_fail(sl_store *s, int rc, const char *format, ...) {
  assert(rc != 0);
  assert(s->dir != 0);
  /* Damage is always named by the file it is in (store.h note 8). */
  bool name_file = rc == SL_ECORRUPT && strncmp(format, "data.mdb", 8) != 0;
  /* Formatted aside, then copied under the lock: a reader on another
   * thread (sl_store_error_copy) never sees half a message. */
  char text[STORE_ERROR_BYTES];
  va_list args;
  va_start(args, format);
  message_format(text, sizeof text, s->dir,
                 name_file ? "data.mdb is damaged: " : "", format, args);
  va_end(args);
  pthread_mutex_lock(&s->error_lock);
  memcpy(s->error, text, sizeof text);
  pthread_mutex_unlock(&s->error_lock);
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
int store_lmdb_fail(sl_store *s, int rc, const char *what) {
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
void store_key_text(int db, const MDB_val *key, char *out, size_t out_bytes) {
  const uint8_t *k = key->mv_data;
  char hex[2 * MESSAGE_KEY_BYTES + 4];
  if ((db == DB_STATE || db == DB_STATE2) &&
      key->mv_size == BASE_KEY_BYTES) {
    snprintf(out, out_bytes, "chunk %" PRIu32 " of op %u up to key group %u",
             get_be32(k + 4), get_be16(k), get_be16(k + 2));
  } else if (db == DB_LOG && key->mv_size == LOG_KEY_BYTES) {
    snprintf(out, out_bytes,
             "seq %" PRIu64 " run %" PRIu32 " chunk %" PRIu32
             " of op %u up to key group %u",
             get_be64(k), get_be32(k + LOG_RUN_AT), get_be32(k + LOG_ORDINAL_AT),
             get_be16(k + LOG_LAST_AT), get_be16(k + LOG_LAST_AT + 2));
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

int store_corrupt(sl_store *s, int db, const MDB_val *key,
                  const char *problem) {
  char text[3 * MESSAGE_KEY_BYTES + 64];
  store_key_text(db, key, text, sizeof text);
  return store_fail(s, SL_ECORRUPT, "data.mdb is damaged: database %s, %s: %s",
                    db_names[db], text, problem);
}

/* "<dir>: message" into err (NULL or err_bytes 0: none).  Returns rc. */
__attribute__((format(printf, 5, 6))) int
store_dir_fail(const char *dir, char *err, size_t err_bytes, int rc,
               const char *format, ...) {
  assert(rc != 0);
  if (!err || err_bytes == 0)
    return rc;
  va_list args;
  va_start(args, format);
  message_format(err, err_bytes, dir, "", format, args);
  va_end(args);
  return rc;
}

/* ------------------------------------------------------------ values, meta */

/* state2 is the other buffer of one logical database, the base, and
 * shares the seed of state (store_view.c note 2). */
static XXH64_hash_t checksum_seed(int db) {
  assert(db > 0 && db < DB_COUNT);
  return (XXH64_hash_t)(db == DB_STATE2 ? DB_STATE : db);
}

uint64_t store_checksum(int db, const MDB_val *key, const void *payload,
                        size_t payload_bytes) {
  XXH64_hash_t seed = XXH3_64bits_withSeed(key->mv_data, key->mv_size,
                                           checksum_seed(db));
  return XXH3_64bits_withSeed(payload, payload_bytes, seed);
}

/* Checks a value read back from db and returns its payload (the value
 * without the checksum) in *payload.  SL_ECORRUPT names db and key. */
int store_value_open(sl_store *s, int db, const MDB_val *key,
                     const MDB_val *value, MDB_val *payload) {
  if (value->mv_size < SL_STORE_CHECKSUM_BYTES)
    return store_corrupt(s, db, key, "value too short to hold its checksum");
  assert(db > 0 && db < DB_COUNT);
  payload->mv_data = value->mv_data;
  payload->mv_size = value->mv_size - SL_STORE_CHECKSUM_BYTES;
  const uint8_t *stored = (const uint8_t *)value->mv_data + payload->mv_size;
  if (get_le64(stored) !=
      store_checksum(db, key, payload->mv_data, payload->mv_size))
    return store_corrupt(s, db, key, "value fails its checksum");
  return 0;
}

/* Puts key -> head || body || checksum into db with MDB_RESERVE (note 2)
 * and flags (0 or MDB_APPEND).  head is a blob's id, a log entry's kind
 * (or nothing). */
int store_value_put(sl_store *s, MDB_txn *txn, int db, MDB_val *key,
                    const void *head, size_t head_bytes, const void *body,
                    size_t body_bytes, unsigned flags) {
  assert(key->mv_size > 0 && key->mv_size <= KEY_BUFFER_BYTES);
  assert(body_bytes == 0 || body != 0);
  assert(flags == 0 || flags == MDB_APPEND);
  size_t payload_bytes = head_bytes + body_bytes;
  MDB_val value = {.mv_size = payload_bytes + SL_STORE_CHECKSUM_BYTES,
                   .mv_data = 0};
  if (s->fault && !s->compacting && !s->unfaulted) { /* checkpoints only */
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
  put_le64(at + payload_bytes, store_checksum(db, key, at, payload_bytes));
  return 0;
}

/* Reads and checks meta value name.  MDB_NOTFOUND is returned without a
 * message: what a missing value means is the caller's to say. */
int store_meta_get(sl_store *s, MDB_txn *txn, const char *name,
                   MDB_val *payload) {
  MDB_val key = meta_key(name), value;
  int rc = mdb_get(txn, s->dbi[DB_META], &key, &value);
  if (rc == MDB_NOTFOUND)
    return rc;
  if (rc != 0)
    return store_lmdb_fail(s, rc, "read meta");
  return store_value_open(s, DB_META, &key, &value, payload);
}

/* Reads meta value name, a u64 ("latest", "next_seq", "base"). */
int store_meta_get_u64(sl_store *s, MDB_txn *txn, const char *name,
                       uint64_t *out) {
  MDB_val payload;
  int rc = store_meta_get(s, txn, name, &payload);
  if (rc == MDB_NOTFOUND)
    return store_fail(s, SL_ECORRUPT, "meta \"%s\" is missing", name);
  if (rc == 0 && payload.mv_size != sizeof(uint64_t))
    return store_fail(s, SL_ECORRUPT, "meta \"%s\" has %zu bytes, not 8",
                      name, payload.mv_size);
  if (rc == 0)
    *out = get_le64(payload.mv_data);
  return rc;
}

int store_meta_put_u64(sl_store *s, MDB_txn *txn, const char *name,
                       uint64_t v) {
  uint8_t bytes[sizeof(uint64_t)];
  put_le64(bytes, v);
  MDB_val key = meta_key(name);
  return store_value_put(s, txn, DB_META, &key, 0, 0, bytes, sizeof bytes, 0);
}

int store_meta_add_u64(sl_store *s, MDB_txn *txn, const char *name,
                       int64_t delta) {
  uint64_t v = 0;
  int rc = store_meta_get_u64(s, txn, name, &v);
  if (rc != 0)
    return rc;
  if (delta < 0 && (uint64_t)-delta > v)
    return store_fail(s, SL_ECORRUPT, "meta \"%s\" is %" PRIu64
                      ", less than the %" PRIu64 " entries it loses", name,
                      v, (uint64_t)-delta);
  rc = store_meta_put_u64(s, txn, name, v + (uint64_t)delta);
  return rc != 0 ? store_lmdb_fail(s, rc, "write meta") : 0;
}

/* The database number of the current base (meta "base", store.h note 1). */
int store_meta_get_base(sl_store *s, MDB_txn *txn, int *db) {
  uint64_t index = 0;
  int rc = store_meta_get_u64(s, txn, "base", &index);
  if (rc == 0 && index > 1)
    rc = store_fail(s, SL_ECORRUPT, "meta \"base\" is %" PRIu64
                    ", not 0 or 1", index);
  if (rc == 0)
    *db = base_dbs[index];
  return rc;
}

/* A read transaction.  A map grown by the writer in another process is
 * adopted once (MDB_MAP_RESIZED; only read-only handles meet it). */
int store_read_begin(sl_store *s, MDB_txn **txn) {
  int rc = mdb_txn_begin(s->env, 0, MDB_RDONLY, txn);
  if (rc == MDB_MAP_RESIZED && s->txn.state != TXN_ACTIVE) {
    rc = mdb_env_set_mapsize(s->env, 0);
    if (rc == 0)
      rc = mdb_txn_begin(s->env, 0, MDB_RDONLY, txn);
  }
  if (rc != 0) {
    *txn = 0;
    return store_lmdb_fail(s, rc, "begin a read transaction");
  }
  return 0;
}

/* Ends txn, a write transaction of meta's own (not a checkpoint's):
 * aborted if rc (from the writes, named what), else committed.  Returns
 * 0 or the failure with its message; a commit that fails is named
 * commit_what. */
int store_write_end(sl_store *s, MDB_txn *txn, int rc, const char *what,
                    const char *commit_what) {
  if (rc != 0) {
    mdb_txn_abort(txn);
    return store_lmdb_fail(s, rc, what);
  }
  rc = mdb_txn_commit(txn);
  return rc != 0 ? store_lmdb_fail(s, rc, commit_what) : 0;
}

/* What mdb_env_open (named what) returned, for a data.mdb that the walk
 * let through: a file of another LMDB version or kind is SL_ESTORE. */
int store_env_opened(sl_store *s, int rc, const char *what) {
  if (rc == MDB_INVALID || rc == MDB_VERSION_MISMATCH)
    return store_fail(s, SL_ESTORE,
                      "data.mdb is not an LMDB file this LMDB reads (%s)",
                      mdb_strerror(rc));
  return rc != 0 ? store_lmdb_fail(s, rc, what) : 0;
}

/* ------------------------------------------------------------ registry */

/* Open handles by directory identity (note 4).  The list is as long as the
 * number of stores open in the process; the mutex guards it only. */
static pthread_mutex_t registry_mutex = PTHREAD_MUTEX_INITIALIZER;
static sl_store *registry_head;

int store_registry_add(sl_store *s) {
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

/* ------------------------------------------------------------ open, close */

/* dir/name into out. */
int store_dir_path(sl_store *s, const char *name, char *out,
                   size_t out_bytes) {
  int n = snprintf(out, out_bytes, "%s/%s", s->dir, name);
  if (n < 0 || (size_t)n >= out_bytes)
    return store_fail(s, ENAMETOOLONG, "path too long");
  return 0;
}

int sl_store_sync_dir(const char *path) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return errno;
  int rc = fsync(fd) == 0 ? 0 : errno;
  close(fd);
  return rc;
}

/* fsync a directory, so the entries created in it survive a power cut. */
int store_fsync_dir(sl_store *s, const char *path) {
  int rc = sl_store_sync_dir(path);
  if (rc != 0)
    return store_fail(s, rc, "fsync of directory %s: %s", path, strerror(rc));
  return 0;
}

/* Scans the directory's names: sets *has_data if data.mdb is there, and
 * refuses a directory that holds other files but no data.mdb (store.h note 4).
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

/* The shared part of sl_store_make_parents: path is a writable copy. */
static int make_parents_in(char *path, size_t n, char *failed,
                           size_t failed_bytes) {
  for (size_t i = 1; i < n; i++) { /* each '/' once: one level at a time */
    if (path[i] != '/' || path[i - 1] == '/')
      continue;
    path[i] = 0;
    struct stat st;
    int rc = 0;
    if (mkdir(path, STORE_DIR_MODE) != 0 && errno != EEXIST)
      rc = errno;
    else if (stat(path, &st) != 0)
      rc = errno;
    else if (!S_ISDIR(st.st_mode))
      rc = ENOTDIR;
    if (rc) {
      if (failed && failed_bytes)
        snprintf(failed, failed_bytes, "%s", path);
      return rc;
    }
    path[i] = '/';
  }
  return 0;
}

int sl_store_make_parents(const char *dir, char *failed,
                          size_t failed_bytes) {
  char path[PATH_MAX];
  size_t n = strlen(dir);
  if (n >= sizeof path)
    return ENAMETOOLONG;
  memcpy(path, dir, n + 1);
  return make_parents_in(path, n, failed, failed_bytes);
}

/* Note 3, first step: the path must be a directory (a writer creates a
 * missing one and its missing parents, *created) and must not hold
 * someone else's files. */
int store_inspect_dir(sl_store *s, bool *has_data, bool *created) {
  struct stat st;
  if (stat(s->dir, &st) != 0) {
    /* ENOTDIR: a parent is a file; sl_store_make_parents names which. */
    if (errno != ENOENT && (errno != ENOTDIR || s->read_only))
      return store_fail(s, errno, "cannot stat: %s", strerror(errno));
    if (s->read_only)
      return store_fail(s, ENOENT,
                        "no such directory (a read-only open creates no "
                        "store)");
    char parent[PATH_MAX];
    int rc = sl_store_make_parents(s->dir, parent, sizeof parent);
    if (rc == ENAMETOOLONG)
      return store_fail(s, rc, "the path is too long");
    if (rc == ENOTDIR)
      return store_fail(s, rc, "the parent %s exists and is not a directory",
                        parent);
    if (rc)
      return store_fail(s, rc, "cannot create the parent directory %s: %s",
                        parent, strerror(rc));
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

/* dir/data.mdb opened for reading into *fd, its path into path
 * (PATH_MAX bytes). */
static int data_file_open(sl_store *s, char *path, int *fd) {
  int rc = store_dir_path(s, "data.mdb", path, PATH_MAX);
  if (rc != 0)
    return rc;
  *fd = open(path, O_RDONLY | O_CLOEXEC);
  if (*fd < 0)
    return store_fail(s, errno, "cannot open data.mdb: %s", strerror(errno));
  return 0;
}

/* Is data.mdb an LMDB file?  LMDB would refuse a foreign file as well
 * (MDB_INVALID), but only after creating lock.mdb, and a foreign
 * directory must stay as it was.  *empty: a 0-byte file, left by a
 * creation interrupted before LMDB wrote its meta pages; LMDB initialises
 * it like a missing one. */
int store_inspect_data_file(sl_store *s, bool *empty) {
  char path[PATH_MAX];
  int fd = -1;
  int rc = data_file_open(s, path, &fd);
  if (rc != 0)
    return rc;
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
  if (*empty || magic == LMDB_MAGIC)
    return 0;
  /* A file whose second meta page carries the magic is LMDB's, its first
   * meta page damaged: corruption to report as such, not a foreign file.
   * The first page's size field is suspect too, so each page size LMDB
   * may have used is tried. */
  static const uint32_t page_sizes[] = {4096, 8192, 16384, 32768, 65536};
  fd = open(path, O_RDONLY | O_CLOEXEC);
  for (size_t i = 0; fd >= 0 && i < sizeof page_sizes / sizeof page_sizes[0];
       i++) {
    uint32_t second = 0;
    if (pread(fd, &second, sizeof second,
              (off_t)page_sizes[i] + LMDB_MAGIC_OFFSET) == sizeof second &&
        second == LMDB_MAGIC) {
      close(fd);
      return store_fail(s, SL_ECORRUPT,
                        "data.mdb: meta page 0 is damaged (it lacks LMDB's "
                        "magic, which meta page 1 at offset %" PRIu32
                        " carries)",
                        page_sizes[i]);
    }
  }
  if (fd >= 0)
    close(fd);
  return store_fail(s, SL_ESTORE,
                    "data.mdb is not an LMDB file (its first page lacks "
                    "LMDB's magic)");
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
  /* Bounded: lock_wait_tries waits of STORE_LOCK_WAIT_US. */
  for (uint32_t attempt = 0; attempt <= s->lock_wait_tries; attempt++) {
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
int store_take_lock(sl_store *s, bool *created, bool *flocked) {
  assert(!s->read_only);
  assert(s->lock_fd < 0);
  char path[PATH_MAX];
  int rc = store_dir_path(s, "lock", path, sizeof path);
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
  /* Bounded: lock_wait_tries waits of STORE_LOCK_WAIT_US, and only while
   * readers share the file (reader_lock); a writer holds it exclusively,
   * and is refused at once. */
  for (uint32_t attempt = 0;; attempt++) {
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
    if (!readers || attempt >= s->lock_wait_tries)
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
  rc = store_dir_path(s, "lock", path, sizeof path);
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

/* Note 5: the older meta page must not reach past the newest's last
 * page (the walk checked both pages' headers and page size). */
static int check_meta_order(sl_store *s, int fd, uint32_t page_bytes) {
  /* Per meta page: u64 last page, then u64 txnid, native order
   * (lmdb_check.h note 1). */
  uint64_t meta[2][2] = {{0, 0}, {0, 0}};
  for (int page = 0; page < 2; page++) {
    ssize_t got = pread(fd, meta[page], sizeof meta[page],
                        (off_t)page * page_bytes +
                            LMDB_META_LAST_PAGE_OFFSET);
    if (got != (ssize_t)sizeof meta[page])
      return store_fail(s, got < 0 ? errno : EIO, "cannot read data.mdb's "
                        "meta page %d: %s", page,
                        got < 0 ? strerror(errno) : "short read");
  }
  int newest = meta[1][1] > meta[0][1]; /* LMDB's choice */
  const uint64_t *older = meta[!newest];
  if (older[0] <= meta[newest][0])
    return 0;
  return store_fail(s, SL_ECORRUPT, "data.mdb is damaged: meta page %d "
                    "(txnid %" PRIu64 ") reaches page %" PRIu64 ", past the "
                    "last page %" PRIu64 " of meta page %d (txnid %" PRIu64
                    ", which LMDB would open): a damaged txnid would open "
                    "an older snapshot", !newest, older[1], older[0],
                    meta[newest][0], newest, meta[newest][1]);
}

/* Store.h note 8: the walk of data.mdb before LMDB maps it. */
int store_check_data_file(sl_store *s) {
  char path[PATH_MAX];
  int fd = -1;
  int rc = data_file_open(s, path, &fd);
  if (rc != 0)
    return rc;
  /* The walk's message names the file itself: it goes in whole. */
  sl_lmdb_check_stats walked = {0};
  rc = sl_lmdb_check_file(fd, path, SL_STORE_MAX_MAP_BYTES, &walked,
                          s->error, sizeof s->error);
  if (rc == 0)
    rc = check_meta_order(s, fd, walked.page_bytes);
  close(fd);
  if (rc == ENOMEM && !s->error[0])
    return store_fail(s, ENOMEM, "out of memory");
  return rc;
}

static int open_env(sl_store *s, bool writemap) {
  assert(s->env == 0);
  assert(s->registered); /* note 4: only one handle gets this far */
  int rc = mdb_env_create(&s->env);
  if (rc != 0) {
    s->env = 0;
    return store_lmdb_fail(s, rc, "mdb_env_create");
  }
  rc = mdb_env_set_maxdbs(s->env, DB_COUNT - 1);
  if (rc != 0)
    return store_lmdb_fail(s, rc, "mdb_env_set_maxdbs");
  /* Every instance restores on its own thread, each with a read
   * transaction: room for more than LMDB's default 126 readers. */
  rc = mdb_env_set_maxreaders(s->env, STORE_MAX_READERS);
  if (rc != 0)
    return store_lmdb_fail(s, rc, "mdb_env_set_maxreaders");
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
  if ((rc = store_env_opened(s, rc, "mdb_env_open")) != 0)
    return rc;
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
    return store_lmdb_fail(s, rc, "mdb_env_set_mapsize");
  assert(sl_store_map_bytes(s) >= want);
  return 0;
}

/* A graph fingerprint (engine/graph.c sl_graph_fingerprint) is
 * "max_parallelism=M" then ";ID:KIND:NAME:P" per physical operator.  The
 * next ';'-separated entry of text[*at..len) into *entry, *entry_len;
 * false at the end. */
static bool fingerprint_entry(const char *text, size_t len, size_t *at,
                              const char **entry, size_t *entry_len) {
  if (*at > len)
    return false;
  const char *end = memchr(text + *at, ';', len - *at);
  size_t n = end ? (size_t)(end - (text + *at)) : len - *at;
  *entry = text + *at;
  *entry_len = n;
  *at += n + 1; /* past the ';' (or past len: the end) */
  return true;
}

/* The fields of one operator entry "ID:KIND:NAME:P" (the name may hold
 * ':', the kind never does): false if it is not of that form. */
typedef struct fp_op {
  const char *kind, *name, *parallelism;
  int kind_len, name_len, parallelism_len;
} fp_op;

static bool fingerprint_op(const char *e, size_t n, fp_op *op) {
  const char *c1 = memchr(e, ':', n);
  const char *c2 = c1 ? memchr(c1 + 1, ':', n - (size_t)(c1 + 1 - e)) : 0;
  const char *c3 = e + n;
  while (c2 && c3 > c2 && c3[-1] != ':') /* the last ':' */
    c3--;
  if (!c2 || c3 <= c2 + 1)
    return false;
  *op = (fp_op){.kind = c1 + 1, .kind_len = (int)(c2 - c1 - 1),
                .name = c2 + 1, .name_len = (int)(c3 - 1 - c2 - 1),
                .parallelism = c3, .parallelism_len = (int)(e + n - c3)};
  return true;
}

/* The first difference between the store's fingerprint and this job's,
 * in words, into out: the operator (by name) and what differs.  Rescaling
 * is what users try most, so the hint names savepoints (engine/savepoint.c
 * rewrites state for new parallelisms).  False if the texts do not parse
 * (a name holding ';'): the caller shows them raw. */
/* The longest operator entry graph.c writes: two ints, a kind, a name. */
#define FINGERPRINT_ENTRY_MAX (SL_MAX_NAME + 48)

static bool fingerprint_difference(const char *had, size_t had_len,
                                   const char *has, size_t has_len,
                                   char *out, size_t out_bytes) {
  size_t a = 0, b = 0;
  const char *x = 0, *y = 0;
  size_t xn = 0, yn = 0;
  for (int i = 0; i <= SL_MAX_OPERATORS; i++) { /* bounded: one per op */
    bool more_x = fingerprint_entry(had, had_len, &a, &x, &xn);
    bool more_y = fingerprint_entry(has, has_len, &b, &y, &yn);
    fp_op ox, oy;
    if (!more_x && !more_y)
      return false; /* equal entry by entry: not a difference we can name */
    if (more_x && more_y && xn == yn && memcmp(x, y, xn) == 0)
      continue;
    /* Only the form graph.c writes is read; any other text (a store
     * test's, a name holding ';') is shown raw by the caller. */
    if ((more_x && xn > FINGERPRINT_ENTRY_MAX) ||
        (more_y && yn > FINGERPRINT_ENTRY_MAX))
      return false;
    if (i == 0 && !(more_x && more_y && xn > 16 && yn > 16 &&
                    memcmp(x, "max_parallelism=", 16) == 0 &&
                    memcmp(y, "max_parallelism=", 16) == 0))
      return false;
    if (i == 0) /* max_parallelism=M: the key-group count */
      snprintf(out, out_bytes, "the store has %.*s, this job has %.*s",
               (int)xn, x, (int)yn, y);
    else if (!more_y && fingerprint_op(x, xn, &ox))
      snprintf(out, out_bytes, "operator \"%.*s\" (%.*s) is in the store's "
               "graph, not in this job's", ox.name_len, ox.name, ox.kind_len,
               ox.kind);
    else if (!more_x && fingerprint_op(y, yn, &oy))
      snprintf(out, out_bytes, "operator \"%.*s\" (%.*s) is in this job's "
               "graph, not in the store's", oy.name_len, oy.name, oy.kind_len,
               oy.kind);
    else if (more_x && more_y && fingerprint_op(x, xn, &ox) &&
             fingerprint_op(y, yn, &oy))
      snprintf(out, out_bytes, "operator \"%.*s\" (%.*s, parallelism %.*s) "
               "in the store is \"%.*s\" (%.*s, parallelism %.*s) in this job",
               ox.name_len, ox.name, ox.kind_len, ox.kind, ox.parallelism_len,
               ox.parallelism, oy.name_len, oy.name, oy.kind_len, oy.kind,
               oy.parallelism_len, oy.parallelism);
    else
      return false;
    return true;
  }
  return false;
}

/* magic, then format, then graph (store.h note 4: each check may rely on
 * the ones before it). */
static int meta_check_identity(sl_store *s, MDB_txn *txn,
                               const char *fingerprint) {
  MDB_val v;
  int rc = store_meta_get(s, txn, "magic", &v);
  if (rc == MDB_NOTFOUND && store_meta_get(s, txn, "format", &v) == 0)
    return store_fail(s, SL_ECORRUPT, "data.mdb is damaged: meta "
                      "\"magic\" is missing, \"format\" is there");
  if (rc == MDB_NOTFOUND || (rc == 0 && (v.mv_size != STORE_MAGIC_BYTES ||
                                         memcmp(v.mv_data, STORE_MAGIC,
                                                STORE_MAGIC_BYTES) != 0)))
    return store_fail(s, SL_ESTORE,
                      "an LMDB environment, but not a sluice store");
  if (rc == 0)
    rc = store_meta_get(s, txn, "format", &v);
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
  if (format < SL_STORE_FORMAT_VERSION) /* converted by the cli */
    return store_fail(s, SL_ESTORE,
                      "store format %" PRIu32 " is older than this "
                      "sluice's format %u; upgrade it with `sluice "
                      "checkpoints --upgrade %s` (a savepoint taken with "
                      "the older version is upgraded the same way)",
                      format, SL_STORE_FORMAT_VERSION, s->dir);
  if ((rc = store_meta_get(s, txn, "graph", &v)) == MDB_NOTFOUND)
    return store_fail(s, SL_ECORRUPT, "meta \"graph\" is missing");
  if (rc != 0 || !fingerprint)
    return rc; /* read-only opens may skip the graph check */
  size_t bytes = strlen(fingerprint);
  if (v.mv_size == bytes && memcmp(v.mv_data, fingerprint, bytes) == 0)
    return 0;
  char difference[400];
  if (fingerprint_difference(v.mv_data, v.mv_size, fingerprint, bytes,
                             difference, sizeof difference))
    return store_fail(s, SL_ESTORE,
                      "written by a different job graph: %s.  To change an "
                      "operator's parallelism, take a savepoint and start "
                      "the job from it in a new state directory "
                      "(--from-savepoint, "
                      "sl_job_config.checkpoint.from_savepoint)",
                      difference);
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
      return store_lmdb_fail(s, rc, "open a database");
  }
  int rc = mdb_dbi_open(txn, db_names[DB_TABLES], 0, &s->dbi[DB_TABLES]);
  if (rc == MDB_NOTFOUND)
    return 0;
  if (rc == MDB_INCOMPATIBLE)
    return store_fail(s, SL_ECORRUPT, "the database tables is not one");
  if (rc != 0)
    return store_lmdb_fail(s, rc, "open the database tables");
  atomic_store(&s->tables_open, true);
  return 0;
}

/* A writer of a store made before tables existed adds the (empty)
 * database, so that no later transaction needs to create it (store_table.c note
 * 1). */
static int tables_create(sl_store *s) {
  assert(!s->read_only);
  MDB_txn *txn;
  int rc = mdb_txn_begin(s->env, 0, 0, &txn);
  if (rc != 0)
    return store_lmdb_fail(s, rc, "begin the transaction that adds tables");
  rc = mdb_dbi_open(txn, db_names[DB_TABLES], MDB_CREATE, &s->dbi[DB_TABLES]);
  if (rc != 0) {
    mdb_txn_abort(txn);
    return store_lmdb_fail(s, rc, "add the database tables");
  }
  rc = mdb_txn_commit(txn); /* durable unless no_sync, like a checkpoint */
  if (rc != 0)
    return store_lmdb_fail(s, rc, "commit the database tables");
  atomic_store(&s->tables_open, true);
  return 0;
}

/* Every log key has a seq below "next_seq" (store.h note 2): else the
 * next transaction's appends would land among older entries. */
static int meta_check_log(sl_store *s, MDB_txn *txn) {
  MDB_cursor *cursor;
  int rc = mdb_cursor_open(txn, s->dbi[DB_LOG], &cursor);
  if (rc != 0)
    return store_lmdb_fail(s, rc, "open a log cursor");
  MDB_val key, value;
  rc = mdb_cursor_get(cursor, &key, &value, MDB_LAST);
  if (rc == MDB_NOTFOUND)
    rc = 0; /* an empty log */
  else if (rc != 0)
    rc = store_lmdb_fail(s, rc, "read the log");
  else if (key.mv_size != LOG_KEY_BYTES)
    rc = store_corrupt(s, DB_LOG, &key, "key is not a chunk key");
  else if (get_be64(key.mv_data) >= s->next_seq)
    rc = store_corrupt(s, DB_LOG, &key, "seq not below meta \"next_seq\"");
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
    return store_lmdb_fail(s, rc, "look into the environment");
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
    return store_lmdb_fail(s, rc, "begin a read transaction");
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
    rc = store_lmdb_fail(s, rc, "open the meta database");
  if (rc == 0)
    rc = meta_check_identity(s, txn, fingerprint);
  int base_db = DB_STATE;
  if (rc == 0)
    rc = store_meta_get_u64(s, txn, "latest", &s->latest);
  if (rc == 0)
    rc = store_meta_get_u64(s, txn, "next_seq", &s->next_seq);
  if (rc == 0 && (s->next_seq == 0 || s->next_seq == UINT64_MAX))
    rc = store_fail(s, SL_ECORRUPT, "meta \"next_seq\" is %" PRIu64
                    ", not a seq a transaction may take", s->next_seq);
  if (rc == 0) /* checked here; every transaction reads it again */
    rc = store_meta_get_base(s, txn, &base_db);
  uint64_t counted = 0;
  if (rc == 0)
    rc = store_meta_get_u64(s, txn, "log_entries", &counted);
  if (rc == 0)
    rc = store_meta_get_u64(s, txn, "base_entries", &counted);
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
  return rc != 0 ? store_lmdb_fail(s, rc, "end the read transaction") : 0;
}

/* Makes an empty environment a store: the six databases and meta, in one
 * durable transaction. */
static int meta_init(sl_store *s, const char *fingerprint) {
  assert(!s->read_only);
  assert(fingerprint != 0);
  MDB_txn *txn;
  int rc = mdb_txn_begin(s->env, 0, 0, &txn);
  if (rc != 0)
    return store_lmdb_fail(s, rc, "begin the initial transaction");
  for (int db = DB_META; db < DB_COUNT && rc == 0; db++)
    rc = mdb_dbi_open(txn, db_names[db], MDB_CREATE, &s->dbi[db]);
  uint8_t format[4] = {(uint8_t)SL_STORE_FORMAT_VERSION,
                       (uint8_t)(SL_STORE_FORMAT_VERSION >> 8),
                       (uint8_t)(SL_STORE_FORMAT_VERSION >> 16),
                       (uint8_t)(SL_STORE_FORMAT_VERSION >> 24)};
  MDB_val key = meta_key("magic");
  if (rc == 0)
    rc = store_value_put(s, txn, DB_META, &key, 0, 0, STORE_MAGIC,
                         STORE_MAGIC_BYTES, 0);
  key = meta_key("format");
  if (rc == 0)
    rc = store_value_put(s, txn, DB_META, &key, 0, 0, format, sizeof format, 0);
  key = meta_key("graph");
  if (rc == 0)
    rc = store_value_put(s, txn, DB_META, &key, 0, 0, fingerprint,
                         strlen(fingerprint), 0);
  if (rc == 0)
    rc = store_meta_put_u64(s, txn, "latest", 0);
  if (rc == 0)
    rc = store_meta_put_u64(s, txn, "next_seq", 1);
  if (rc == 0)
    rc = store_meta_put_u64(s, txn, "base", 0);
  if (rc == 0)
    rc = store_meta_put_u64(s, txn, "log_entries", 0);
  if (rc == 0)
    rc = store_meta_put_u64(s, txn, "base_entries", 0);
  rc = store_write_end(s, txn, rc, "initialise the store",
                       "commit the initial transaction");
  if (rc != 0)
    return rc;
  rc = s->no_sync ? mdb_env_sync(s->env, 1) : 0; /* durable even so */
  if (rc != 0)
    return store_lmdb_fail(s, rc, "commit the initial transaction");
  s->latest = 0;
  s->next_seq = 1;
  atomic_store(&s->tables_open, true);
  /* data.mdb and lock are new entries of the directory. */
  return store_fsync_dir(s, s->dir);
}

/* Note 3 after the lock: the environment and its meta. */
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

/* Note 3, every step. */
static int open_steps(sl_store *s, const sl_store_options *options) {
  bool has_data = false, data_empty = false, dir_created = false;
  int rc = store_inspect_dir(s, &has_data, &dir_created);
  if (rc == 0 && has_data)
    rc = store_inspect_data_file(s, &data_empty);
  if (rc == 0 && s->read_only && (!has_data || data_empty))
    rc = store_fail(s, ENOENT,
                    "holds no sluice store (a read-only open creates none)");
  if (rc == 0)
    rc = store_registry_add(s);
  bool lock_created = false, locked = false, writer_live = false;
  if (rc == 0 && !s->read_only)
    rc = store_take_lock(s, &lock_created, &locked);
  if (rc == 0 && s->read_only)
    rc = reader_lock(s, &writer_live);
  /* Note 3: a reader that keeps writers out needs no lock.mdb, and makes
   * or writes none. */
  if (rc == 0 && s->read_only && !writer_live)
    s->no_lock_file = true;
  /* Store.h note 8: a store a live writer holds was walked when it
   * opened, and its pages change under a walk; every other one is walked
   * now. */
  if (rc == 0 && has_data && !data_empty && !writer_live)
    rc = store_check_data_file(s);
  if (rc == 0)
    rc = open_store(s, options, has_data && !data_empty);
  if (rc == SL_ESTORE && lock_created && locked) {
    /* Refused after the lock (someone else's LMDB environment): leave the
     * directory as it was.  This open made the file and holds its lock; an
     * opener that got the file meanwhile is refused the same way. */
    char path[PATH_MAX];
    if (store_dir_path(s, "lock", path, sizeof path) == 0)
      unlink(path);
  }
  if (rc == 0 && dir_created && !s->no_sync) {
    /* The new directory's own entry, in its parent. */
    char parent[PATH_MAX];
    snprintf(parent, sizeof parent, "%s/..", s->dir);
    rc = store_fsync_dir(s, parent);
  }
  return rc;
}

/* A handle that sl_store_close frees, for dir, with nothing open yet. */
sl_store *store_handle_new(const char *dir, bool read_only) {
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
  /* The default wait; sl_store_open applies lock_wait_ms. */
  s->lock_wait_tries =
      STORE_LOCK_WAIT_DEFAULT_MS * 1000u / STORE_LOCK_WAIT_US;
  s->txn.store = s;
  s->txn.state = TXN_IDLE;
  atomic_init(&s->tables_open, false);
  pthread_rwlock_init(&s->map_lock, 0);
  pthread_mutex_init(&s->tables_lock, 0);
  pthread_mutex_init(&s->error_lock, 0);
  return s;
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
  sl_store *s = store_handle_new(dir, options->read_only != 0);
  if (!s) {
    if (err && err_bytes > 0)
      snprintf(err, err_bytes, "%s: out of memory", dir);
    return ENOMEM;
  }
  s->no_lock_file = s->read_only && options->no_lock_file != 0;
  s->no_sync = options->no_sync != 0;
  if (options->lock_wait_ms) /* at most UINT32_MAX ms: the tries fit */
    s->lock_wait_tries =
        (uint32_t)(options->lock_wait_ms * 1000ull / STORE_LOCK_WAIT_US);
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
  chunk_builder_free(&s->txn.chunk);
  store_compaction_forget(s);
  pthread_rwlock_destroy(&s->map_lock);
  pthread_mutex_destroy(&s->tables_lock);
  pthread_mutex_destroy(&s->error_lock);
  free(s->dir);
  free(s);
}

const char *sl_store_error(const sl_store *s) { return s ? s->error : ""; }

void sl_store_error_copy(sl_store *s, char *out, size_t out_bytes) {
  assert(out_bytes > 0);
  pthread_mutex_lock(&s->error_lock);
  snprintf(out, out_bytes, "%s", s->error);
  pthread_mutex_unlock(&s->error_lock);
}

uint64_t sl_store_latest(const sl_store *s) { return s->latest; }

uint64_t sl_store_map_bytes(const sl_store *s) {
  MDB_envinfo info;
  int rc = mdb_env_info(s->env, &info);
  assert(rc == 0); /* it only copies fields */
  return rc == 0 ? (uint64_t)info.me_mapsize : 0;
}

