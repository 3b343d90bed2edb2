/* store_savepoint.c — savepoints (store.h note 7): sl_store_inspect of a
 * directory that is not opened as a store, sl_store_copy of an open
 * store, and sl_store_install of a copy as a directory's store.
 */
#include "store_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sluice.h"

/* ------------------------------------------------------------ inspect */

/* The identity of the environment s->env (sl_store_inspect): magic and
 * format, and with the current format the graph and "latest". */
static int inspect_meta(sl_store *s, MDB_txn *txn, sl_store_info *info) {
  int rc = mdb_dbi_open(txn, db_names[DB_META], 0, &s->dbi[DB_META]);
  if (rc != 0 && rc != MDB_NOTFOUND && rc != MDB_INCOMPATIBLE)
    return store_lmdb_fail(s, rc, "open the meta database");
  MDB_val v;
  if (rc == 0)
    rc = store_meta_get(s, txn, "magic", &v); /* sets a message but NOTFOUND */
  MDB_val format;
  if (rc == MDB_NOTFOUND && store_meta_get(s, txn, "format", &format) == 0)
    return store_fail(s, SL_ECORRUPT, "meta \"magic\" is missing, "
                      "\"format\" is there");
  if (rc == MDB_NOTFOUND || rc == MDB_INCOMPATIBLE ||
      (rc == 0 && (v.mv_size != STORE_MAGIC_BYTES ||
                   memcmp(v.mv_data, STORE_MAGIC, STORE_MAGIC_BYTES) != 0)))
    return store_fail(s, SL_ESTORE,
                      "an LMDB environment, but not a sluice store");
  if (rc != 0)
    return rc;
  rc = store_meta_get(s, txn, "format", &v);
  if (rc == MDB_NOTFOUND || (rc == 0 && v.mv_size != sizeof(uint32_t)))
    return store_fail(s, SL_ECORRUPT, "meta \"format\" is missing or bad");
  if (rc != 0)
    return rc;
  const uint8_t *f = v.mv_data;
  info->format = (uint32_t)f[0] | (uint32_t)f[1] << 8 |
                 (uint32_t)f[2] << 16 | (uint32_t)f[3] << 24;
  if (info->format != SL_STORE_FORMAT_VERSION)
    return 0; /* the caller decides; the rest may be laid out otherwise */
  rc = store_meta_get(s, txn, "graph", &v);
  if (rc == MDB_NOTFOUND)
    return store_fail(s, SL_ECORRUPT, "meta \"graph\" is missing");
  if (rc != 0)
    return rc;
  info->graph = malloc(v.mv_size + 1);
  if (!info->graph)
    return store_fail(s, ENOMEM, "out of memory");
  memcpy(info->graph, v.mv_data, v.mv_size);
  info->graph[v.mv_size] = 0;
  return store_meta_get_u64(s, txn, "latest", &info->latest);
}

/* sl_store_inspect on the bare handle s. */
static int inspect_steps(sl_store *s, sl_store_info *info) {
  bool empty = false;
  int rc = store_inspect_data_file(s, &empty);
  if (rc == ENOENT)
    return store_fail(s, ENOENT, "holds no data.mdb");
  if (rc == 0 && empty)
    return store_fail(s, SL_ESTORE, "data.mdb is empty");
  if (rc == 0)
    rc = store_check_data_file(s); /* store.h note 8 */
  if (rc != 0)
    return rc; /* with its message */
  if ((rc = mdb_env_create(&s->env)) != 0) {
    s->env = 0;
    return store_lmdb_fail(s, rc, "mdb_env_create");
  }
  rc = mdb_env_set_maxdbs(s->env, DB_COUNT - 1);
  /* NOLOCK: no lock.mdb is made or used (a savepoint stays as it was). */
  if (rc == 0)
    rc = mdb_env_open(s->env, s->dir, MDB_RDONLY | MDB_NOLOCK,
                      STORE_FILE_MODE);
  if ((rc = store_env_opened(s, rc, "open the environment")) != 0)
    return rc;
  MDB_txn *txn;
  rc = mdb_txn_begin(s->env, 0, MDB_RDONLY, &txn);
  if (rc != 0)
    return store_lmdb_fail(s, rc, "begin a read transaction");
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
    return store_dir_fail("(null)", err, err_bytes, EINVAL, "no directory");
  sl_store *s = store_handle_new(dir, true);
  if (!s)
    return store_dir_fail(dir, err, err_bytes, ENOMEM, "out of memory");
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

/* ------------------------------------------------------------ copy */

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
    return store_dir_fail(dir, err, err_bytes, ENAMETOOLONG, "path too long");
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                STORE_FILE_MODE);
  if (fd < 0)
    return store_dir_fail(dir, err, err_bytes, errno,
                          "cannot create data.mdb: %s", strerror(errno));
  /* The read side keeps sl_store_grow from remapping under the copy's
   * read transaction (store_table.c note 1). */
  pthread_rwlock_rdlock(&s->map_lock);
  int rc = mdb_env_copyfd2(s->env, fd, MDB_CP_COMPACT);
  pthread_rwlock_unlock(&s->map_lock);
  struct stat st;
  memset(&st, 0, sizeof st);
  if (rc != 0)
    store_dir_fail(dir, err, err_bytes, rc, "copy of the store %s: %s", s->dir,
                   mdb_strerror(rc));
  else if (fsync(fd) != 0 || fstat(fd, &st) != 0)
    rc = store_dir_fail(dir, err, err_bytes, errno, "sync of data.mdb: %s",
                        strerror(errno));
  close(fd);
  if (rc == 0 && (rc = sl_store_sync_dir(dir)) != 0)
    store_dir_fail(dir, err, err_bytes, rc, "fsync of the directory: %s",
                   strerror(rc));
  sl_store_info info = {0};
  if (rc == 0)
    rc = sl_store_inspect(dir, &info, err, err_bytes); /* read back */
  if (rc == 0 && info.latest == 0)
    rc = store_dir_fail(dir, err, err_bytes, SL_ENOTFOUND,
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

/* ------------------------------------------------------------ install */

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
  if (store_dir_path(s, SL_STORE_STAGING_NAME, path, sizeof path) == 0)
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

/* Store.h note 7: a store with checkpoints already in the directory is
 * replaced only when asked; someone else's file never. */
static int install_check_target(sl_store *s, bool replace) {
  bool empty = false;
  int rc = store_inspect_data_file(s, &empty);
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

/* Store.h note 7: the copy, checked and edited in the staging directory. */
static int install_stage(sl_store *s, const char *source_dir,
                         const sl_store_install_options *o) {
  assert(o->source_graph && o->graph); /* sl_store_install checked */
  assert(s->lock_fd >= 0 && s->dir_fd >= 0); /* the directory is ours */
  char staging[PATH_MAX], from[PATH_MAX], to[PATH_MAX];
  int rc = store_dir_path(s, SL_STORE_STAGING_NAME, staging, sizeof staging);
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

/* Store.h note 7: the rename that installs the copy, then the cleanup. */
static int install_move(sl_store *s) {
  assert(s->lock_fd >= 0);
  char from[PATH_MAX], to[PATH_MAX];
  int n = snprintf(from, sizeof from, "%s/%s/data.mdb", s->dir,
                   SL_STORE_STAGING_NAME);
  if (n < 0 || (size_t)n >= sizeof from)
    return store_fail(s, ENAMETOOLONG, "path too long");
  int rc = store_dir_path(s, "data.mdb", to, sizeof to);
  if (rc == 0 && rename(from, to) != 0)
    rc = store_fail(s, errno, "cannot move %s to %s: %s", from, to,
                    strerror(errno));
  if (rc == 0)
    rc = store_fsync_dir(s, s->dir);
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
    return store_dir_fail(dir ? dir : "(null)", err, err_bytes, EINVAL,
                          "sl_store_install: an argument is NULL");
  sl_store *s = store_handle_new(dir, false);
  if (!s)
    return store_dir_fail(dir, err, err_bytes, ENOMEM, "out of memory");
  bool has_data = false, created = false, lock_created = false;
  bool flocked = false;
  int rc = store_inspect_dir(s, &has_data, &created);
  /* No handle of this process has the directory (store.c note 4), nor
   * has another process. */
  if (rc == 0)
    rc = store_registry_add(s);
  if (rc == 0)
    rc = store_take_lock(s, &lock_created, &flocked);
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
    if (lock_created && store_dir_path(s, "lock", path, sizeof path) == 0)
      unlink(path);
  }
  sl_store_close(s);
  if (rc != 0 && created)
    rmdir(dir); /* made by this call, empty again */
  return rc;
}

