/* store_v2.c — reads a store of the old format 2, read-only, for the
 * upgrade (store_v2.h has the notes).  Its byte helpers and checksum are
 * its own, written from format 2's description, so that the current
 * store's code may change format freely.
 */
#include "store_v2.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <lmdb.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "lmdb_check.h"
#include "sluice.h"

#define V2_MAGIC "sluice-store"
#define V2_CHECKSUM_BYTES 8u
#define V2_STATE_PREFIX 4u  /* u16 op, u16 key group, big-endian */
#define V2_SEQ_BYTES 8u     /* u64 seq ahead of a log key */
#define V2_BLOB_ID_BYTES 8u /* u64 checkpoint id ahead of a blob */
#define V2_MAX_MAP_BYTES (1ull << 40) /* format 2's SL_STORE_MAX_MAP_BYTES */
#define V2_ERROR_BYTES 1024
#define V2_KEY_SHOWN 32u

/* Format 2's databases and their checksum seeds (note 1). */
enum { V2_META, V2_CHECKPOINTS, V2_BLOBS, V2_STATE, V2_STATE2, V2_LOG,
       V2_TABLES, V2_DBS };
static const char *const v2_names[V2_DBS] = {
    "meta", "checkpoints", "blobs", "state", "state2", "log", "tables"};
static const unsigned v2_seeds[V2_DBS] = {1, 2, 3, 4, 4, 5, 7};
enum { V2_LOG_PUT = 1, V2_LOG_TOMBSTONE = 2 };

struct sl_store_v2 {
  char *dir;
  MDB_env *env;
  MDB_txn *txn; /* the one read transaction (note 2) */
  MDB_dbi dbi[V2_DBS];
  bool has_tables;
  int base; /* V2_STATE or V2_STATE2 */
  uint64_t latest;
  char *graph;
  char error[V2_ERROR_BYTES];
};

/* One log entry in the index of the merged view (note 3). */
typedef struct v2_log_entry {
  const uint8_t *key; /* the state key: op, group, key bytes */
  size_t key_bytes;
  uint64_t seq;
  const uint8_t *payload; /* kind byte, then the value */
  size_t payload_bytes;
} v2_log_entry;

/* ------------------------------------------------------------ errors */

__attribute__((format(printf, 3, 4))) static int
v2_fail(sl_store_v2 *v, int rc, const char *format, ...) {
  int at = snprintf(v->error, sizeof v->error, "%s: ", v->dir);
  if (at < 0 || (size_t)at >= sizeof v->error)
    at = 0;
  va_list args;
  va_start(args, format);
  vsnprintf(v->error + at, sizeof v->error - (size_t)at, format, args);
  va_end(args);
  return rc;
}

static int v2_lmdb_fail(sl_store_v2 *v, int rc, const char *what) {
  return v2_fail(v, rc, "%s: %s", what, mdb_strerror(rc));
}

/* SL_ECORRUPT naming the database and the key (its first bytes in hex). */
static int v2_corrupt(sl_store_v2 *v, int db, const MDB_val *key,
                      const char *problem) {
  char hex[2 * V2_KEY_SHOWN + 4] = "";
  size_t shown = key->mv_size < V2_KEY_SHOWN ? key->mv_size : V2_KEY_SHOWN;
  for (size_t i = 0; i < shown; i++) /* bounded by V2_KEY_SHOWN */
    snprintf(hex + 2 * i, 3, "%02x", ((const uint8_t *)key->mv_data)[i]);
  return v2_fail(v, SL_ECORRUPT,
                 "data.mdb is damaged: database %s, key %s%s (%zu bytes): "
                 "%s", v2_names[db], hex, shown < key->mv_size ? "..." : "",
                 key->mv_size, problem);
}

/* ------------------------------------------------------------ values */

static uint64_t v2_le64(const uint8_t *p) {
  uint64_t x = 0;
  for (int i = 7; i >= 0; i--)
    x = x << 8 | p[i];
  return x;
}

static uint64_t v2_be64(const uint8_t *p) {
  uint64_t x = 0;
  for (int i = 0; i < 8; i++)
    x = x << 8 | p[i];
  return x;
}

static uint16_t v2_be16(const uint8_t *p) {
  return (uint16_t)((unsigned)p[0] << 8 | p[1]);
}

/* Checks value of key in db (note 1); *payload is it without checksum. */
static int v2_open_value(sl_store_v2 *v, int db, const MDB_val *key,
                         const MDB_val *value, MDB_val *payload) {
  if (value->mv_size < V2_CHECKSUM_BYTES)
    return v2_corrupt(v, db, key, "value too short to hold its checksum");
  payload->mv_data = value->mv_data;
  payload->mv_size = value->mv_size - V2_CHECKSUM_BYTES;
  XXH64_hash_t seed = XXH3_64bits_withSeed(key->mv_data, key->mv_size,
                                           v2_seeds[db]);
  uint64_t want = XXH3_64bits_withSeed(payload->mv_data, payload->mv_size,
                                       seed);
  const uint8_t *stored = (const uint8_t *)value->mv_data + payload->mv_size;
  if (v2_le64(stored) != want)
    return v2_corrupt(v, db, key, "value fails its checksum");
  return 0;
}

/* The checked payload of key in db; MDB_NOTFOUND is returned silently. */
static int v2_get(sl_store_v2 *v, int db, MDB_val *key, MDB_val *payload) {
  MDB_val value;
  int rc = mdb_get(v->txn, v->dbi[db], key, &value);
  if (rc == MDB_NOTFOUND)
    return rc;
  if (rc != 0)
    return v2_lmdb_fail(v, rc, "read");
  return v2_open_value(v, db, key, &value, payload);
}

/* Meta value name (checked), required: missing is damage. */
static int v2_meta(sl_store_v2 *v, const char *name, MDB_val *payload) {
  MDB_val key = {.mv_size = strlen(name), .mv_data = (void *)name};
  int rc = v2_get(v, V2_META, &key, payload);
  if (rc == MDB_NOTFOUND)
    return v2_fail(v, SL_ECORRUPT, "data.mdb is damaged: meta \"%s\" is "
                   "missing", name);
  return rc;
}

static int v2_meta_u64(sl_store_v2 *v, const char *name, uint64_t *out) {
  MDB_val p;
  int rc = v2_meta(v, name, &p);
  if (rc == 0 && p.mv_size != 8)
    return v2_fail(v, SL_ECORRUPT, "data.mdb is damaged: meta \"%s\" has "
                   "%zu bytes, not 8", name, p.mv_size);
  if (rc == 0)
    *out = v2_le64(p.mv_data);
  return rc;
}

/* ------------------------------------------------------------ opening */

/* Note 2: the walk of data.mdb before LMDB maps it. */
static int v2_check_file(sl_store_v2 *v) {
  char path[PATH_MAX];
  if (snprintf(path, sizeof path, "%s/data.mdb", v->dir) >= (int)sizeof path)
    return v2_fail(v, ENAMETOOLONG, "the path is too long");
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT)
    return v2_fail(v, ENOENT, "no data.mdb: not a state directory");
  if (fd < 0)
    return v2_fail(v, errno, "cannot open data.mdb: %s", strerror(errno));
  struct stat st;
  int rc = 0;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    rc = v2_fail(v, SL_ESTORE, "data.mdb is not a regular file");
  else if (st.st_size == 0)
    rc = v2_fail(v, SL_ESTORE, "data.mdb is empty (a creation that was "
                 "interrupted): nothing to upgrade");
  else
    rc = sl_lmdb_check_file(fd, path, V2_MAX_MAP_BYTES, NULL, v->error,
                            sizeof v->error);
  close(fd);
  return rc;
}

static int v2_open_env(sl_store_v2 *v) {
  int rc = mdb_env_create(&v->env);
  if (rc != 0) {
    v->env = NULL;
    return v2_lmdb_fail(v, rc, "mdb_env_create");
  }
  if ((rc = mdb_env_set_maxdbs(v->env, V2_DBS + 1)) != 0)
    return v2_lmdb_fail(v, rc, "mdb_env_set_maxdbs");
  rc = mdb_env_open(v->env, v->dir, MDB_RDONLY | MDB_NOLOCK | MDB_NOTLS,
                    0644);
  if (rc == MDB_INVALID || rc == MDB_VERSION_MISMATCH)
    return v2_fail(v, SL_ESTORE, "data.mdb is not an LMDB file this LMDB "
                   "reads (%s)", mdb_strerror(rc));
  if (rc != 0)
    return v2_lmdb_fail(v, rc, "mdb_env_open");
  if ((rc = mdb_txn_begin(v->env, NULL, MDB_RDONLY, &v->txn)) != 0) {
    v->txn = NULL;
    return v2_lmdb_fail(v, rc, "begin a read transaction");
  }
  return 0;
}

/* The database meta: its absence means not a store. */
static int v2_open_meta(sl_store_v2 *v) {
  int rc = mdb_dbi_open(v->txn, v2_names[V2_META], 0, &v->dbi[V2_META]);
  if (rc == MDB_NOTFOUND || rc == MDB_INCOMPATIBLE)
    return v2_fail(v, SL_ESTORE, "an LMDB environment, but not a sluice "
                   "store (no database meta)");
  return rc != 0 ? v2_lmdb_fail(v, rc, "open the database meta") : 0;
}

/* The other databases, once the format is known to be 2: their absence
 * is damage; tables is optional (format 2 added it late). */
static int v2_open_databases(sl_store_v2 *v) {
  for (int db = V2_CHECKPOINTS; db < V2_DBS; db++) {
    int rc = mdb_dbi_open(v->txn, v2_names[db], 0, &v->dbi[db]);
    if (db == V2_TABLES && rc == MDB_NOTFOUND)
      return 0;
    if (rc == MDB_NOTFOUND || rc == MDB_INCOMPATIBLE)
      return v2_fail(v, SL_ECORRUPT, "data.mdb is damaged: the database %s "
                     "is missing", v2_names[db]);
    if (rc != 0)
      return v2_lmdb_fail(v, rc, "open a database");
  }
  v->has_tables = true;
  return 0;
}

/* Magic, format, graph, latest, base (format 2's meta). */
static int v2_read_meta(sl_store_v2 *v, uint32_t *format) {
  MDB_val p;
  MDB_val key = {.mv_size = 5, .mv_data = "magic"};
  int rc = v2_get(v, V2_META, &key, &p);
  if (rc == MDB_NOTFOUND || (rc == 0 && (p.mv_size != strlen(V2_MAGIC) ||
                                         memcmp(p.mv_data, V2_MAGIC,
                                                p.mv_size) != 0)))
    return v2_fail(v, SL_ESTORE, "an LMDB environment, but not a sluice "
                   "store");
  if (rc == 0)
    rc = v2_meta(v, "format", &p);
  if (rc == 0 && p.mv_size != 4)
    return v2_fail(v, SL_ECORRUPT, "data.mdb is damaged: meta \"format\" "
                   "has %zu bytes, not 4", p.mv_size);
  if (rc != 0)
    return rc;
  const uint8_t *f = p.mv_data;
  *format = (uint32_t)f[0] | (uint32_t)f[1] << 8 | (uint32_t)f[2] << 16 |
            (uint32_t)f[3] << 24;
  if (*format != SL_STORE_V2_FORMAT)
    return v2_fail(v, SL_ESTORE, "store format %" PRIu32 ", not %u",
                   *format, SL_STORE_V2_FORMAT);
  uint64_t base = 0;
  if ((rc = v2_open_databases(v)) != 0 ||
      (rc = v2_meta(v, "graph", &p)) != 0 ||
      (rc = v2_meta_u64(v, "latest", &v->latest)) != 0 ||
      (rc = v2_meta_u64(v, "base", &base)) != 0)
    return rc;
  if (base > 1)
    return v2_fail(v, SL_ECORRUPT, "data.mdb is damaged: meta \"base\" is "
                   "%" PRIu64 ", not 0 or 1", base);
  v->base = base == 0 ? V2_STATE : V2_STATE2;
  if (memchr(p.mv_data, 0, p.mv_size) || !(v->graph = malloc(p.mv_size + 1)))
    return v2_fail(v, p.mv_size && memchr(p.mv_data, 0, p.mv_size)
                          ? SL_ECORRUPT : ENOMEM,
                   "meta \"graph\" cannot be read (a NUL in it, or no "
                   "memory)");
  memcpy(v->graph, p.mv_data, p.mv_size);
  v->graph[p.mv_size] = 0;
  return 0;
}

int sl_store_v2_open(const char *dir, sl_store_v2 **out, uint32_t *format,
                     char *err, size_t err_bytes) {
  *out = NULL;
  *format = 0;
  sl_store_v2 *v = calloc(1, sizeof *v);
  if (!v || !(v->dir = strdup(dir))) {
    free(v);
    if (err && err_bytes)
      snprintf(err, err_bytes, "%s: out of memory", dir);
    return ENOMEM;
  }
  int rc = v2_check_file(v);
  if (rc == 0)
    rc = v2_open_env(v);
  if (rc == 0)
    rc = v2_open_meta(v);
  if (rc == 0)
    rc = v2_read_meta(v, format);
  if (rc != 0) {
    if (err && err_bytes)
      snprintf(err, err_bytes, "%s", v->error);
    sl_store_v2_close(v);
    return rc;
  }
  *out = v;
  return 0;
}

void sl_store_v2_close(sl_store_v2 *v) {
  if (!v)
    return;
  if (v->txn)
    mdb_txn_abort(v->txn);
  if (v->env)
    mdb_env_close(v->env);
  free(v->graph);
  free(v->dir);
  free(v);
}

const char *sl_store_v2_error(const sl_store_v2 *v) { return v->error; }

uint64_t sl_store_v2_latest(const sl_store_v2 *v) { return v->latest; }

const char *sl_store_v2_graph(const sl_store_v2 *v) { return v->graph; }

/* ------------------------------------------------------------ records */

int sl_store_v2_record(sl_store_v2 *v, uint64_t id, const void **record,
                       uint32_t *bytes) {
  uint8_t k[8];
  for (int i = 7, s = 0; i >= 0; i--, s += 8)
    k[i] = (uint8_t)(id >> s);
  MDB_val key = {.mv_size = 8, .mv_data = k}, p;
  int rc = v2_get(v, V2_CHECKPOINTS, &key, &p);
  if (rc == MDB_NOTFOUND)
    return v2_fail(v, SL_ENOTFOUND, "data.mdb is damaged: no record of "
                   "checkpoint %" PRIu64, id);
  if (rc == 0 && p.mv_size > UINT32_MAX)
    return v2_corrupt(v, V2_CHECKPOINTS, &key, "record too long");
  if (rc == 0)
    *record = p.mv_data, *bytes = (uint32_t)p.mv_size;
  return rc;
}

/* Calls each(v, key, payload, arg) for every entry of db, checked. */
typedef int (*v2_entry_fn)(sl_store_v2 *v, const MDB_val *key,
                           const MDB_val *payload, void *arg);

static int v2_walk(sl_store_v2 *v, int db, v2_entry_fn each, void *arg) {
  MDB_cursor *c;
  int rc = mdb_cursor_open(v->txn, v->dbi[db], &c);
  if (rc != 0)
    return v2_lmdb_fail(v, rc, "open a cursor");
  MDB_val key, value, payload = {0, 0};
  /* Bounded by the database's entries. */
  for (rc = mdb_cursor_get(c, &key, &value, MDB_FIRST);;
       rc = mdb_cursor_get(c, &key, &value, MDB_NEXT)) {
    if (rc == MDB_NOTFOUND) {
      rc = 0;
      break;
    }
    if (rc != 0) {
      rc = v2_lmdb_fail(v, rc, "walk a database");
      break;
    }
    if ((rc = v2_open_value(v, db, &key, &value, &payload)) != 0 ||
        (rc = each(v, &key, &payload, arg)) != 0)
      break;
  }
  mdb_cursor_close(c);
  return rc;
}

/* The caller's function of a walk (one of the three) and its arg. */
typedef struct v2_call {
  sl_store_v2_blob_fn blob;
  sl_store_v2_state_fn state;
  sl_store_v2_row_fn row;
  void *arg;
} v2_call;

static int v2_blob_entry(sl_store_v2 *v, const MDB_val *key,
                         const MDB_val *p, void *arg) {
  const v2_call *call = arg;
  if (key->mv_size != 4 || p->mv_size < V2_BLOB_ID_BYTES ||
      p->mv_size - V2_BLOB_ID_BYTES > UINT32_MAX)
    return v2_corrupt(v, V2_BLOBS, key, "not a blob's key and value");
  const uint8_t *k = key->mv_data, *d = p->mv_data;
  return call->blob(call->arg, v2_be16(k), v2_be16(k + 2), v2_le64(d),
            d + V2_BLOB_ID_BYTES, (uint32_t)(p->mv_size - V2_BLOB_ID_BYTES));
}

int sl_store_v2_blobs(sl_store_v2 *v, sl_store_v2_blob_fn fn, void *arg) {
  v2_call call = {.blob = fn, .arg = arg};
  return v2_walk(v, V2_BLOBS, v2_blob_entry, &call);
}

/* A table's key: u8 n > 0, n name bytes, the row key; n = 0 is a row
 * count (skipped: the new store counts its rows itself). */
static int v2_row_entry(sl_store_v2 *v, const MDB_val *key, const MDB_val *p,
                        void *arg) {
  const v2_call *call = arg;
  const uint8_t *k = key->mv_data;
  if (key->mv_size < 1 || key->mv_size < 1u + k[0])
    return v2_corrupt(v, V2_TABLES, key, "key shorter than its table name");
  if (k[0] == 0)
    return 0;
  char name[256];
  memcpy(name, k + 1, k[0]);
  name[k[0]] = 0;
  if (p->mv_size > UINT32_MAX)
    return v2_corrupt(v, V2_TABLES, key, "value too long");
  return call->row(call->arg, name, k + 1 + k[0],
            (uint32_t)(key->mv_size - 1 - k[0]), p->mv_data,
            (uint32_t)p->mv_size);
}

int sl_store_v2_rows(sl_store_v2 *v, sl_store_v2_row_fn fn, void *arg) {
  if (!v->has_tables)
    return 0;
  v2_call call = {.row = fn, .arg = arg};
  return v2_walk(v, V2_TABLES, v2_row_entry, &call);
}

/* ------------------------------------------------------------ state */

/* The log index (note 3). */
typedef struct v2_log_index {
  v2_log_entry *entries;
  size_t count, capacity;
} v2_log_index;

static int v2_log_entry_add(sl_store_v2 *v, const MDB_val *key,
                            const MDB_val *p, void *arg) {
  v2_log_index *ix = arg;
  if (key->mv_size < V2_SEQ_BYTES + V2_STATE_PREFIX)
    return v2_corrupt(v, V2_LOG, key, "key shorter than its prefix");
  const uint8_t *kind = p->mv_data;
  if (p->mv_size < 1 || (kind[0] != V2_LOG_PUT && kind[0] != V2_LOG_TOMBSTONE) ||
      (kind[0] == V2_LOG_TOMBSTONE && p->mv_size != 1))
    return v2_corrupt(v, V2_LOG, key, "not a put or a tombstone");
  if (ix->count == ix->capacity) {
    size_t n = ix->capacity ? 2 * ix->capacity : 1024;
    v2_log_entry *e = realloc(ix->entries, n * sizeof *e);
    if (!e)
      return v2_fail(v, ENOMEM, "out of memory for the log's index");
    ix->entries = e, ix->capacity = n;
  }
  const uint8_t *k = key->mv_data;
  ix->entries[ix->count++] = (v2_log_entry){
      .key = k + V2_SEQ_BYTES, .key_bytes = key->mv_size - V2_SEQ_BYTES,
      .seq = v2_be64(k), .payload = p->mv_data,
      .payload_bytes = p->mv_size};
  return 0;
}

/* LMDB's key order (memcmp, then the shorter first). */
static int v2_key_compare(const uint8_t *a, size_t an, const uint8_t *b,
                          size_t bn) {
  int d = memcmp(a, b, an < bn ? an : bn);
  return d != 0 ? d : (an > bn) - (an < bn);
}

/* By state key, then the newest seq first. */
static int v2_log_order(const void *x, const void *y) {
  const v2_log_entry *a = x, *b = y;
  int d = v2_key_compare(a->key, a->key_bytes, b->key, b->key_bytes);
  if (d != 0)
    return d;
  return (a->seq < b->seq) - (a->seq > b->seq);
}

static int v2_emit(const v2_call *call, const uint8_t *key, size_t key_bytes,
                   const uint8_t *value, size_t value_bytes) {
  return call->state(call->arg, v2_be16(key), v2_be16(key + 2), key + V2_STATE_PREFIX,
            (uint32_t)(key_bytes - V2_STATE_PREFIX), value,
            (uint32_t)value_bytes);
}

/* The base entry at the cursor, checked, or *done at its end. */
static int v2_base_next(sl_store_v2 *v, MDB_cursor *c, MDB_cursor_op op,
                        MDB_val *key, MDB_val *p, bool *done) {
  MDB_val value;
  int rc = mdb_cursor_get(c, key, &value, op);
  *done = rc == MDB_NOTFOUND;
  if (*done)
    return 0;
  if (rc != 0)
    return v2_lmdb_fail(v, rc, "read the base");
  if (key->mv_size < V2_STATE_PREFIX)
    return v2_corrupt(v, v->base, key, "key shorter than its prefix");
  return v2_open_value(v, v->base, key, &value, p);
}

/* Merges the base with the sorted, deduplicated log (note 3). */
static int v2_merge(sl_store_v2 *v, const v2_log_index *ix,
                    const v2_call *call) {
  MDB_cursor *c;
  int rc = mdb_cursor_open(v->txn, v->dbi[v->base], &c);
  if (rc != 0)
    return v2_lmdb_fail(v, rc, "open a cursor on the base");
  MDB_val bk, bp;
  bool base_done = false;
  size_t at = 0;
  rc = v2_base_next(v, c, MDB_FIRST, &bk, &bp, &base_done);
  /* Each step consumes a base entry or a log entry: bounded by both. */
  while (rc == 0 && (!base_done || at < ix->count)) {
    const v2_log_entry *e = at < ix->count ? &ix->entries[at] : NULL;
    int d = base_done ? 1 : !e ? -1
                           : v2_key_compare(bk.mv_data, bk.mv_size, e->key,
                                            e->key_bytes);
    if (d < 0) {
      rc = v2_emit(call, bk.mv_data, bk.mv_size, bp.mv_data, bp.mv_size);
    } else if (e->payload[0] == V2_LOG_PUT) {
      rc = v2_emit(call, e->key, e->key_bytes, e->payload + 1,
                   e->payload_bytes - 1);
    }
    if (d >= 0) { /* the log's key: skip its older entries */
      size_t next = at + 1;
      while (next < ix->count &&
             v2_key_compare(e->key, e->key_bytes, ix->entries[next].key,
                            ix->entries[next].key_bytes) == 0)
        next++;
      at = next;
    }
    if (rc == 0 && d <= 0)
      rc = v2_base_next(v, c, MDB_NEXT, &bk, &bp, &base_done);
  }
  mdb_cursor_close(c);
  return rc;
}

int sl_store_v2_state(sl_store_v2 *v, sl_store_v2_state_fn fn, void *arg) {
  v2_log_index ix = {0};
  int rc = v2_walk(v, V2_LOG, v2_log_entry_add, &ix);
  if (rc == 0 && ix.count > 1)
    qsort(ix.entries, ix.count, sizeof *ix.entries, v2_log_order);
  /* Two entries of one key with one seq: format 2 never wrote them (a
   * transaction's second change of a key replaced its first). */
  for (size_t i = 1; rc == 0 && i < ix.count; i++)
    if (v2_log_order(&ix.entries[i - 1], &ix.entries[i]) == 0)
      rc = v2_fail(v, SL_ECORRUPT, "data.mdb is damaged: database log has "
                   "two entries of one key under seq %" PRIu64,
                   ix.entries[i].seq);
  v2_call call = {.state = fn, .arg = arg};
  if (rc == 0)
    rc = v2_merge(v, &ix, &call);
  free(ix.entries);
  return rc;
}
