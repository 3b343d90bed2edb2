/* upgrade.c — `sluice checkpoints --upgrade DIR`: converts a store of the
 * old format 2 (read by storage/store_v2.c) into this sluice's format, in
 * place and crash-safely.  DIR is a state directory or a savepoint.
 *
 * NOTES ON THE DESIGN
 *
 * 1. Claim.  The store's lock as a writer takes it (store.h note 5): an
 *    exclusive flock of DIR/lock and of DIR itself, both without waiting;
 *    a job or reader holding either is "in use by another process" and
 *    nothing changes.  Held until the end, so the old store is read with
 *    MDB_NOLOCK and no writer can start meanwhile.  A lock file the claim
 *    had to create is removed at the end.
 * 2. Build.  The new store is written through the public store API into
 *    DIR/SL_STORE_STAGING_NAME (emptied first: a staging directory is
 *    always a leftover, store.h note 7): sl_store_open with the old
 *    store's graph fingerprint, then ONE transaction holding every live
 *    keyed-state entry of the merged view (sl_store_put_state, in key
 *    order), every blob, every table row and the record of the latest
 *    checkpoint, committed with its id, durably.  A store with no
 *    checkpoint becomes an empty store.  The map starts at twice the old
 *    data.mdb (at least the store's default); MDB_MAP_FULL grows it and
 *    writes the transaction again (at most UPGRADE_GROWS times).
 * 3. Move.  The staging data.mdb is renamed over DIR/data.mdb (atomic:
 *    before it DIR holds the intact old store, after it the complete new
 *    one), then DIR is fsync'd, then the staging directory removed.  A
 *    crash at any instant leaves one of the two stores, and a staging
 *    directory that sl_store_open ignores and the next upgrade or install
 *    removes.  The old lock.mdb stays: LMDB re-initialises a lock file
 *    no process has open.  A savepoint's manifest then gets the new
 *    store_format (written beside and renamed); if a crash came between
 *    the two renames, upgrading again finds the new store and fixes the
 *    manifest only.
 * 4. Test hooks (environment, for tests/test_upgrade.c only):
 *    SLUICE_TEST_UPGRADE_CRASH=K[:P] raises SIGKILL at step K (1 ..
 *    UPGRADE_STEPS, see crash_point) and, for K = 2, after the P-th state
 *    put; SLUICE_TEST_UPGRADE_REWRITE=1 rewrites a format-2 store also
 *    when 2 is this sluice's own format (so the path is tested before the
 *    format changes).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <lmdb.h> /* MDB_MAP_FULL, which the store passes on */
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "cli_util.h"
#include "inspect.h"
#include "store.h"
#include "store_v2.h"

#define UPGRADE_ERR_BYTES 1536
#define UPGRADE_GROWS 24 /* map doublings at most (64 MiB .. 1 TiB) */
#define UPGRADE_STEPS 8
#define UPGRADE_STAGING_FILES 64 /* files a staging directory may hold */

typedef struct upgrade {
  const char *dir;         /* as given */
  char store_dir[PATH_MAX]; /* dir, or a savepoint's store directory */
  char staging[PATH_MAX];
  bool savepoint;
  int lock_fd, dir_fd;
  bool created_lock; /* claim made DIR/lock: removed at the end */
  sl_store_v2 *old;
  sl_store *store;
  uint64_t entries, rows;
  int tables;
  char table[SL_STORE_TABLE_NAME_MAX + 1]; /* of the last row put */
  int table_handle;
  uint64_t crash_step, crash_puts; /* note 4 */
  char err[UPGRADE_ERR_BYTES];
} upgrade;

__attribute__((format(printf, 3, 4))) static int
upgrade_fail(upgrade *u, int rc, const char *format, ...) {
  va_list args;
  va_start(args, format);
  vsnprintf(u->err, sizeof u->err, format, args);
  va_end(args);
  return rc;
}

/* Note 4: SIGKILL at step k if the test asked for it. */
static void crash_point(const upgrade *u, uint64_t k) {
  if (u->crash_step == k)
    raise(SIGKILL);
}

static void read_test_hooks(upgrade *u) {
  const char *crash = getenv("SLUICE_TEST_UPGRADE_CRASH");
  if (crash && *crash) {
    char *end;
    u->crash_step = strtoull(crash, &end, 10);
    if (*end == ':')
      u->crash_puts = strtoull(end + 1, NULL, 10);
  }
}

/* ------------------------------------------------------------ claim */

/* Note 1: the writer's two flocks, without waiting. */
static int claim(upgrade *u) {
  char path[PATH_MAX];
  if (snprintf(path, sizeof path, "%s/lock", u->store_dir) >= (int)sizeof path)
    return upgrade_fail(u, ENAMETOOLONG, "%s: path too long", u->store_dir);
  u->lock_fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  u->created_lock = u->lock_fd >= 0;
  if (u->lock_fd < 0 && errno == EEXIST)
    u->lock_fd = open(path, O_RDWR | O_CLOEXEC);
  if (u->lock_fd < 0)
    return upgrade_fail(u, errno, "%s: cannot open the lock file: %s",
                        u->store_dir, strerror(errno));
  u->dir_fd = open(u->store_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (u->dir_fd < 0)
    return upgrade_fail(u, errno, "%s: cannot open the directory: %s",
                        u->store_dir, strerror(errno));
  if (flock(u->lock_fd, LOCK_EX | LOCK_NB) != 0 ||
      flock(u->dir_fd, LOCK_EX | LOCK_NB) != 0)
    return upgrade_fail(u, SL_ESTORE, "%s: in use by another process (a "
                        "job or a reader holds its lock): stop it first",
                        u->store_dir);
  return 0;
}

/* The savepoint's store directory (from its manifest), or dir itself. */
static int find_store(upgrade *u) {
  u->savepoint = sl_savepoint_is_dir(u->dir);
  if (!u->savepoint) {
    if (snprintf(u->store_dir, sizeof u->store_dir, "%s", u->dir) >=
        (int)sizeof u->store_dir)
      return upgrade_fail(u, ENAMETOOLONG, "%s: path too long", u->dir);
    return 0;
  }
  sl_savepoint_manifest m = {0};
  int rc = sl_savepoint_manifest_read(u->dir, &m, u->err, sizeof u->err);
  if (rc == 0 && !m.store_dir[0])
    rc = upgrade_fail(u, SL_ESTORE, "%s: a savepoint manifest, but no "
                      "data.mdb in the directory or a subdirectory of it",
                      u->dir);
  if (rc == 0)
    snprintf(u->store_dir, sizeof u->store_dir, "%s", m.store_dir);
  sl_savepoint_manifest_free(&m);
  return rc;
}

/* ------------------------------------------------------------ staging */

/* Empties and removes the staging directory (its files are LMDB's and the
 * lock: no subdirectories); absent is fine. */
static int staging_remove(upgrade *u) {
  DIR *d = opendir(u->staging);
  if (!d && errno == ENOENT)
    return 0;
  if (!d)
    return upgrade_fail(u, errno, "%s: cannot read: %s", u->staging,
                        strerror(errno));
  struct dirent *e;
  int rc = 0, files = 0;
  while (rc == 0 && (e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    if (++files > UPGRADE_STAGING_FILES)
      rc = upgrade_fail(u, EEXIST, "%s: more files than a staging "
                        "directory holds: not removed", u->staging);
    else if (unlinkat(dirfd(d), e->d_name, 0) != 0)
      rc = upgrade_fail(u, errno, "%s/%s: cannot remove: %s", u->staging,
                        e->d_name, strerror(errno));
  }
  closedir(d);
  if (rc == 0 && rmdir(u->staging) != 0)
    rc = upgrade_fail(u, errno, "%s: cannot remove: %s", u->staging,
                      strerror(errno));
  return rc;
}

/* ------------------------------------------------------------ build */

static int put_entry(void *arg, uint16_t op, uint16_t key_group,
                     const void *key, uint32_t key_bytes, const void *value,
                     uint32_t value_bytes) {
  void **pair = arg;
  upgrade *u = pair[0];
  sl_store_txn *txn = pair[1];
  u->entries++;
  if (u->crash_step == 2 && u->entries > u->crash_puts)
    raise(SIGKILL); /* note 4: inside the transaction */
  return sl_store_put_state(txn, op, key_group, key, key_bytes, value,
                            value_bytes);
}

static int put_blob(void *arg, uint16_t op, uint16_t instance,
                    uint64_t checkpoint_id, const void *data,
                    uint32_t bytes) {
  (void)checkpoint_id; /* the commit tags every blob with the latest id */
  void **pair = arg;
  return sl_store_put_blob(pair[1], op, instance, data, bytes);
}

static int put_row(void *arg, const char *table, const void *key,
                   uint32_t key_bytes, const void *value,
                   uint32_t value_bytes) {
  void **pair = arg;
  upgrade *u = pair[0];
  if (strcmp(table, u->table) != 0) { /* rows come table by table */
    int rc = sl_store_txn_table(pair[1], table, &u->table_handle);
    if (rc)
      return rc;
    snprintf(u->table, sizeof u->table, "%s", table);
    u->tables++;
  }
  u->rows++;
  return sl_store_put_row(pair[1], u->table_handle, key, key_bytes, value,
                          value_bytes);
}

/* The failure of a walk: the old store's message if it failed, else the
 * new store's. */
static int write_failed(upgrade *u, int rc, const char *what) {
  const char *old = sl_store_v2_error(u->old);
  const char *fresh = sl_store_error(u->store);
  if (rc == SL_ECORRUPT && old[0])
    return upgrade_fail(u, rc, "%s", old);
  return upgrade_fail(u, rc, "%s: %s: %s", u->dir, what,
                      fresh[0] ? fresh : old[0] ? old : sl_strerror(rc));
}

/* Note 2: the one transaction.  MDB_MAP_FULL comes back for a grow. */
static int write_checkpoint(upgrade *u) {
  sl_store_txn *txn;
  int rc = sl_store_begin(u->store, &txn);
  if (rc)
    return write_failed(u, rc, "begin the transaction");
  void *pair[2] = {u, txn};
  u->entries = u->rows = 0;
  u->tables = 0;
  u->table[0] = 0;
  rc = sl_store_v2_state(u->old, put_entry, pair);
  if (rc == 0)
    rc = sl_store_v2_blobs(u->old, put_blob, pair);
  if (rc == 0)
    rc = sl_store_v2_rows(u->old, put_row, pair);
  const void *record = NULL;
  uint32_t record_bytes = 0;
  uint64_t id = sl_store_v2_latest(u->old);
  if (rc == 0)
    rc = sl_store_v2_record(u->old, id, &record, &record_bytes);
  if (rc != 0) {
    sl_store_abort(txn);
    return rc == MDB_MAP_FULL ? rc : write_failed(u, rc, "copy the state");
  }
  crash_point(u, 3);
  rc = sl_store_commit(txn, id, record, record_bytes);
  if (rc != 0 && rc != MDB_MAP_FULL)
    return write_failed(u, rc, "commit the new store");
  return rc;
}

static int build(upgrade *u) {
  int rc = staging_remove(u);
  if (rc)
    return rc;
  if (mkdir(u->staging, 0755) != 0)
    return upgrade_fail(u, errno, "%s: cannot create: %s", u->staging,
                        strerror(errno));
  crash_point(u, 1);
  /* Room for the old store's size twice at once, so a large store is not
   * written again after each of many doublings (note 2). */
  char data[PATH_MAX + 16];
  snprintf(data, sizeof data, "%s/data.mdb", u->store_dir);
  struct stat st;
  uint64_t map = stat(data, &st) == 0 ? 2 * (uint64_t)st.st_size : 0;
  sl_store_options o = {.graph_fingerprint = sl_store_v2_graph(u->old),
                        .initial_map_bytes = map > (64u << 20) ? map : 0};
  rc = sl_store_open(u->staging, &o, &u->store, u->err, sizeof u->err);
  if (rc || sl_store_v2_latest(u->old) == 0)
    return rc; /* no checkpoint: the new store stays empty */
  rc = write_checkpoint(u);
  for (int grows = 0; rc == MDB_MAP_FULL && grows < UPGRADE_GROWS; grows++) {
    rc = sl_store_grow(u->store);
    if (rc)
      return write_failed(u, rc, "grow the map");
    rc = write_checkpoint(u);
  }
  if (rc == MDB_MAP_FULL)
    return write_failed(u, rc, "write the new store");
  crash_point(u, 4);
  return rc;
}

/* ------------------------------------------------------------ move */

/* A savepoint's manifest.json with the new store_format and the new
 * store's size, written beside and renamed over it (note 3). */
static int manifest_update(upgrade *u) {
  char path[PATH_MAX], next[PATH_MAX + 8];
  snprintf(path, sizeof path, "%s/manifest.json", u->dir);
  snprintf(next, sizeof next, "%s.next", path);
  json_error_t jerr;
  json_t *m = json_load_file(path, 0, &jerr);
  if (!m || !json_is_object(m)) {
    json_decref(m);
    return upgrade_fail(u, SL_ECORRUPT, "%s: not a JSON object (line %d: "
                        "%s)", path, jerr.line, jerr.text);
  }
  char data[PATH_MAX + 16];
  snprintf(data, sizeof data, "%s/data.mdb", u->store_dir);
  struct stat st;
  int rc = json_object_set_new(m, "store_format",
                               json_integer(SL_STORE_FORMAT_VERSION));
  if (rc == 0 && stat(data, &st) == 0) /* the size it lists */
    rc = json_object_set_new(m, "bytes", json_integer(st.st_size));
  if (rc == 0)
    rc = json_dump_file(m, next, JSON_INDENT(2) | JSON_SORT_KEYS);
  json_decref(m);
  int fd = rc == 0 ? open(next, O_RDONLY | O_CLOEXEC) : -1;
  if (fd < 0 || fsync(fd) != 0 || rename(next, path) != 0) {
    int e = errno;
    if (fd >= 0)
      close(fd);
    return upgrade_fail(u, e ? e : EIO, "%s: cannot write: %s", path,
                        strerror(e ? e : EIO));
  }
  close(fd);
  return sl_store_sync_dir(u->dir);
}

static int move_into_place(upgrade *u) {
  char from[PATH_MAX + 16], to[PATH_MAX + 16];
  snprintf(from, sizeof from, "%s/data.mdb", u->staging);
  snprintf(to, sizeof to, "%s/data.mdb", u->store_dir);
  int rc = sl_store_sync_dir(u->staging);
  crash_point(u, 5);
  if (rc == 0 && rename(from, to) != 0)
    rc = errno;
  if (rc)
    return upgrade_fail(u, rc, "%s: cannot move the new store into "
                        "place: %s", to, strerror(rc));
  crash_point(u, 6);
  if ((rc = sl_store_sync_dir(u->store_dir)) != 0)
    return upgrade_fail(u, rc, "%s: fsync: %s", u->store_dir, strerror(rc));
  crash_point(u, 7);
  if (u->savepoint && (rc = manifest_update(u)) != 0)
    return rc;
  rc = staging_remove(u);
  if (rc == 0)
    rc = sl_store_sync_dir(u->store_dir);
  crash_point(u, 8);
  return rc;
}

/* ------------------------------------------------------------ main */

/* A store of this sluice's format: nothing to convert, only the
 * leftovers of an interrupted upgrade to clear (note 3). */
static int already_current(upgrade *u) {
  int rc = staging_remove(u);
  if (rc == 0 && u->savepoint) {
    sl_savepoint_manifest m = {0};
    rc = sl_savepoint_manifest_read(u->dir, &m, u->err, sizeof u->err);
    bool stale = rc == 0 && m.store_format != SL_STORE_FORMAT_VERSION;
    sl_savepoint_manifest_free(&m);
    if (stale && (rc = manifest_update(u)) == 0)
      printf("%s: the manifest now says store format %u\n", u->dir,
             SL_STORE_FORMAT_VERSION);
  }
  if (rc == 0)
    printf("%s: store format %u is this sluice's: nothing to upgrade\n",
           u->dir, SL_STORE_FORMAT_VERSION);
  return rc;
}

/* Whether the store in the directory reads as one of this sluice's
 * format (sl_store_inspect: meta only, no lock taken; the claim keeps
 * writers out). */
static bool current_format(upgrade *u) {
  sl_store_info info = {0};
  char err[UPGRADE_ERR_BYTES];
  bool ours = sl_store_inspect(u->store_dir, &info, err, sizeof err) == 0 &&
              info.format == SL_STORE_FORMAT_VERSION;
  free(info.graph);
  return ours;
}

/* Why a store of format (not 2, not ours) cannot be upgraded. */
static int unsupported(upgrade *u, uint32_t format) {
  if (format > SL_STORE_FORMAT_VERSION)
    return upgrade_fail(u, SL_ESTORE, "%s: store format %" PRIu32 " is "
                        "newer than this sluice's, %u: use a newer sluice",
                        u->store_dir, format, SL_STORE_FORMAT_VERSION);
  return upgrade_fail(u, SL_ESTORE, "%s: store format %" PRIu32 " cannot be "
                      "upgraded: this sluice converts format %u only",
                      u->store_dir, format, SL_STORE_V2_FORMAT);
}

/* Checks that dir holds a data.mdb before anything is created in it. */
static int has_data_file(upgrade *u) {
  char path[PATH_MAX + 16];
  snprintf(path, sizeof path, "%s/data.mdb", u->store_dir);
  struct stat st;
  if (stat(u->store_dir, &st) != 0)
    return upgrade_fail(u, errno, "%s: %s", u->store_dir, strerror(errno));
  if (!S_ISDIR(st.st_mode))
    return upgrade_fail(u, SL_ESTORE, "%s: not a directory", u->store_dir);
  if (stat(path, &st) != 0)
    return upgrade_fail(u, SL_ESTORE, "%s: no data.mdb: not a state "
                        "directory or a savepoint", u->store_dir);
  return 0;
}

static int run_upgrade(upgrade *u) {
  bool rewrite = getenv("SLUICE_TEST_UPGRADE_REWRITE") &&
                 strcmp(getenv("SLUICE_TEST_UPGRADE_REWRITE"), "1") == 0;
  int rc = find_store(u);
  if (rc == 0 && snprintf(u->staging, sizeof u->staging, "%s/%s",
                          u->store_dir, SL_STORE_STAGING_NAME) >=
                     (int)sizeof u->staging)
    rc = upgrade_fail(u, ENAMETOOLONG, "%s: path too long", u->store_dir);
  if (rc == 0)
    rc = has_data_file(u);
  if (rc == 0)
    rc = claim(u);
  if (rc != 0)
    return rc;
  uint32_t format = 0;
  rc = sl_store_v2_open(u->store_dir, &u->old, &format, u->err,
                        sizeof u->err);
  /* A store of our own format: while that is 2, one the reader opened;
   * after, one the current store reads (the old reader need not make
   * sense of a newer layout). */
  bool ours = rc == 0 ? format == SL_STORE_FORMAT_VERSION && !rewrite
                      : current_format(u);
  if (ours)
    return already_current(u);
  if (rc == SL_ESTORE && format != 0 && format != SL_STORE_V2_FORMAT)
    return unsupported(u, format);
  if (rc != 0)
    return rc;
  rc = build(u);
  sl_store_close(u->store);
  u->store = NULL;
  if (rc == 0) {
    rc = move_into_place(u);
  } else { /* best effort, keeping the message: the next run removes it */
    char kept[UPGRADE_ERR_BYTES];
    memcpy(kept, u->err, sizeof kept);
    staging_remove(u);
    memcpy(u->err, kept, sizeof kept);
  }
  if (rc == 0)
    printf("%s: upgraded store format %u -> %u: checkpoint %" PRIu64
           ", %" PRIu64 " entries, %d tables\n", u->dir, SL_STORE_V2_FORMAT,
           SL_STORE_FORMAT_VERSION, sl_store_v2_latest(u->old), u->entries,
           u->tables);
  return rc;
}

int checkpoints_upgrade(const char *dir) {
  upgrade *u = calloc(1, sizeof *u);
  if (!u) {
    fprintf(stderr, "sluice: checkpoints --upgrade: out of memory\n");
    return 1;
  }
  u->dir = dir;
  u->lock_fd = u->dir_fd = -1;
  read_test_hooks(u);
  int rc = run_upgrade(u);
  if (rc)
    fprintf(stderr, "sluice: checkpoints --upgrade: %s\n",
            u->err[0] ? u->err : sl_strerror(rc));
  sl_store_v2_close(u->old);
  char lock[PATH_MAX + 8];
  /* A lock file this run made goes again (a savepoint stays as it was);
   * the directory's flock, held until the close below, keeps writers
   * out meanwhile. */
  if (u->created_lock &&
      snprintf(lock, sizeof lock, "%s/lock", u->store_dir) < (int)sizeof lock)
    unlink(lock);
  if (u->dir_fd >= 0)
    close(u->dir_fd);
  if (u->lock_fd >= 0)
    close(u->lock_fd);
  free(u);
  if (rc == 0 && fflush(stdout) != 0)
    return 1;
  return rc ? 1 : 0;
}
