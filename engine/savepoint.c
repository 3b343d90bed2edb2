/* savepoint.c — savepoints: taking one (sl_job_savepoint) and starting a
 * job from one, also with other parallelisms (sl_savepoint_install).
 *
 * NOTES ON THE DESIGN OF SAVEPOINTS
 *
 * 1. A savepoint is a directory holding data.mdb, a compacted copy of the
 *    job's store made inside one LMDB read transaction (store.h note 7), so
 *    it holds one complete checkpoint whole and stalls neither the
 *    instances nor the writer; and manifest.json, written last (temporary
 *    name, fsync, rename, fsync of the directory).  A directory without a
 *    manifest is not a savepoint, whatever else it holds: a crash while
 *    one is taken never leaves a half savepoint that looks valid.
 * 2. Savepoints belong to the user: the engine never deletes one.  Each is
 *    recorded by one JSON line appended to state_dir/savepoints.jsonl,
 *    {"checkpoint_id","created_ms","path","bytes"} (read by `sluice
 *    checkpoints`).
 * 3. Compatibility.  The manifest's "graph" lists every operator, virtual
 *    ones too, by id, kind and name, with the ids of its inputs (and a side
 *    output's port), but no parallelism; max_parallelism and store_format
 *    are fields of their own.  A job starts from a savepoint only if all
 *    three equal its own.  The store's fingerprint (with parallelisms) must
 *    equal the manifest's "store_graph", and its newest checkpoint the
 *    manifest's "checkpoint_id": the manifest describes that store.
 * 4. Rescaling.  Keyed state is stored by (operator, key group) and an
 *    instance restores the key groups it owns under the new parallelism
 *    (restore.c restore_keyed): it needs no conversion.  Blobs are per
 *    instance.  An operator whose parallelism changed is refused if any
 *    old instance's blob holds operator state (SL_BLOB_STATE: a source
 *    position, a sink's pending transactions, anything saved with
 *    sl_operator_state_set): its meaning depends on the instance, and the
 *    engine cannot split or merge it.  Otherwise the old blobs hold at
 *    most the event-time trailer, and every new instance gets one blob
 *    with the lowest watermark and the largest timestamp among them (an
 *    old instance without a trailer counts as having none).  The lowest
 *    watermark never makes a record late that an old instance would have
 *    kept; the instances of a keyed operator normally share one anyway
 *    (every upstream instance's watermark reaches each of them).  If
 *    every old instance had finished (SL_BLOB_FINISHED, coordinator.c
 *    note 10) every new one has; if only some had, it is refused.
 * 5. The rewritten blobs and the job's own fingerprint are committed in
 *    one transaction of the copy before the copy becomes the state
 *    directory's store (sl_store_install), so a crash leaves either no
 *    store or one that opens like any other: resumes, failover restarts
 *    and later savepoints need nothing more.
 * 6. Savepoints stay aligned, as in Flink: a savepoint never holds channel
 *    state (snapshot.c note 12), so it starts a job at any parallelism
 *    (note 4).  In a job with unaligned checkpoints that can take a
 *    checkpoint now (it runs, no failover under way, its input not at its
 *    end), sl_job_savepoint holds the checkpointer aligned (coordinator.c
 *    note 13), requests a checkpoint and waits until it settles (stop.c
 *    note 7), copies the newest complete checkpoint (that one, or a newer
 *    one started under the hold, aligned too) and lets go.  If it aborts,
 *    the error is returned (SL_ECHECKPOINT) and the job goes on.  Otherwise
 *    (a job with aligned checkpoints, one that ended or fails over, and a
 *    stop with a savepoint, whose checkpoint is aligned: sl_savepoint_copy)
 *    the newest is copied as it is.  Every copy is read back before its
 *    manifest is written (copy_check): a checkpoint whose record says
 *    unaligned, or whose blobs hold channel state, is refused
 *    (SL_ECHECKPOINT) and the copy removed.  That happens only to the
 *    newest checkpoint of an unaligned job that no longer runs (or fails
 *    over), or of a job resumed from one before its own first checkpoint.
 *
 *   taking:   [unaligned job: hold, request, wait] -> read "latest" ->
 *             prepare dir -> sl_store_copy -> copy_check -> manifest (tmp,
 *             fsync, rename, fsync dir) -> savepoints.jsonl line [-> let go]
 *   starting: manifest_read (checks of note 3) -> sl_store_install(copy,
 *             rescale_edit (note 4), fingerprint) -> sl_store_open
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "inspect.h"
#include "internal.h"

#define SAVEPOINT_FORMAT "sluice-savepoint"
#define SAVEPOINT_VERSION 1
#define MANIFEST_NAME "manifest.json"
#define MANIFEST_TEMP_NAME "manifest.json.tmp"
#define JOURNAL_NAME "savepoints.jsonl"
#define MESSAGE_BYTES 1024
/* Fingerprints are quoted up to this many bytes in a message. */
#define QUOTE_BYTES 120
#define DIR_MODE 0755
#define FILE_MODE 0644

_Static_assert(SL_BLOB_EVENT_TIME_BYTES == 2 * sizeof(int64_t),
               "the trailer is a watermark and a timestamp");

/* One savepoint at a time in the process: two into one directory would
 * both find it empty. */
static pthread_mutex_t savepoint_lock = PTHREAD_MUTEX_INITIALIZER;

/* A message into err (NULL or err_bytes 0: none); returns rc.  Shared
 * with stop.c (checkpoint.h). */
int sl_say_err(char *err, size_t err_bytes, int rc, const char *format,
               ...) {
  if (err && err_bytes > 0) {
    va_list args;
    va_start(args, format);
    vsnprintf(err, err_bytes, format, args);
    va_end(args);
  }
  return rc;
}

static int64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *kind_text(enum sl_op_kind kind) {
  static const char *names[] = {"source",  "map",     "filter",
                                "flat_map", "process", "sink",
                                "key_by",  "union",   "side_output"};
  assert((size_t)kind < sizeof names / sizeof names[0]);
  return names[kind];
}

/* Note 3: the job's operators and edges without parallelisms, malloc'd
 * (NULL: no memory). */
static char *savepoint_graph(const sl_job *job) {
  size_t cap = 16 + (size_t)job->op_count *
                        (SL_MAX_NAME + 48 + 12 * SL_MAX_INPUTS);
  char *text = malloc(cap);
  if (!text)
    return 0;
  size_t used = 0;
  text[0] = 0;
  for (int i = 0; i < job->op_count; i++) {
    const sl_op *op = job->ops[i];
    used += (size_t)snprintf(text + used, cap - used, "%s%d:%s:%s",
                             i ? ";" : "", op->id, kind_text(op->kind),
                             op->name);
    for (int k = 0; k < op->input_count; k++)
      used += (size_t)snprintf(text + used, cap - used, "%c%d",
                               k ? ',' : '<', op->inputs[k]->id);
    if (op->input_count > 0)
      used += (size_t)snprintf(text + used, cap - used, ">");
    if (op->kind == SL_OP_SIDE)
      used += (size_t)snprintf(text + used, cap - used, ":%d", op->port);
    assert(used < cap); /* cap counts every field at its longest */
  }
  return text;
}

/* ------------------------------------------------------------ taking */

/* mkdir -p dir (its last component too).  0 or errno. */
static int make_directories(const char *dir) {
  int rc = sl_store_make_parents(dir, NULL, 0);
  if (rc)
    return rc;
  return mkdir(dir, DIR_MODE) != 0 && errno != EEXIST ? errno : 0;
}

/* dir must be new or empty (*created: this call made it). */
static int prepare_directory(const char *dir, bool *created, char *err,
                             size_t err_bytes) {
  *created = false;
  struct stat st;
  if (stat(dir, &st) != 0) {
    int rc = errno == ENOENT ? make_directories(dir) : errno;
    if (rc)
      return sl_say_err(err, err_bytes, rc, "savepoint %s: cannot create the "
                 "directory: %s", dir, strerror(rc));
    *created = true;
    return 0;
  }
  return sl_savepoint_dir_check(dir, err, err_bytes);
}

/* checkpoint.h: dir is missing, or an empty directory. */
int sl_savepoint_dir_check(const char *dir, char *err, size_t err_bytes) {
  struct stat st;
  if (stat(dir, &st) != 0) {
    int rc = errno;
    return rc == ENOENT ? 0
                        : sl_say_err(err, err_bytes, rc, "savepoint %s: %s", dir,
                              strerror(rc));
  }
  if (!S_ISDIR(st.st_mode))
    return sl_say_err(err, err_bytes, ENOTDIR, "savepoint %s: exists and is not a "
               "directory", dir);
  DIR *d = opendir(dir);
  if (!d)
    return sl_say_err(err, err_bytes, errno, "savepoint %s: cannot read the "
               "directory: %s", dir, strerror(errno));
  bool empty = true;
  struct dirent *entry;
  while (empty && (entry = readdir(d)) != 0) /* stops at the first name */
    empty = strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0;
  closedir(d);
  if (!empty)
    return sl_say_err(err, err_bytes, EEXIST, "savepoint %s: the directory exists "
               "and is not empty (a savepoint goes into a new or empty one)",
               dir);
  return 0;
}

/* Writes the whole of text to the new file path and fsyncs it. */
static int write_file(const char *path, const char *text, int flags) {
  int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | flags, FILE_MODE);
  if (fd < 0)
    return errno;
  size_t n = strlen(text);
  int rc = 0;
  for (size_t at = 0; rc == 0 && at < n;) { /* short writes */
    ssize_t put = write(fd, text + at, n - at);
    if (put < 0)
      rc = errno;
    else
      at += (size_t)put;
  }
  if (rc == 0 && fsync(fd) != 0)
    rc = errno;
  close(fd);
  return rc;
}

/* The manifest of note 1 as a JSON object (NULL: no memory). */
static json_t *manifest_build(const sl_job *job, uint64_t id,
                              int64_t created_ms, uint64_t bytes) {
  char *graph = savepoint_graph(job);
  char *store_graph = sl_graph_fingerprint(job);
  json_t *ops = json_array();
  for (int i = 0; ops && i < job->physical_count; i++) {
    const sl_op *op = job->physical[i];
    json_t *o = json_pack("{s:i, s:s, s:s, s:i}", "id", op->id, "name",
                          op->name, "kind", kind_text(op->kind),
                          "parallelism", op->parallelism);
    if (!o || json_array_append_new(ops, o) != 0) {
      json_decref(ops);
      ops = 0;
    }
  }
  json_t *m = 0;
  if (graph && store_graph && ops)
    m = json_pack("{s:s, s:i, s:i, s:I, s:I, s:s, s:I, s:o, s:I, s:s}",
                  "format", SAVEPOINT_FORMAT, "version", SAVEPOINT_VERSION,
                  "store_format", (int)SL_STORE_FORMAT_VERSION,
                  "checkpoint_id", (json_int_t)id, "created_ms",
                  (json_int_t)created_ms, "graph", graph, "max_parallelism",
                  (json_int_t)job->config.max_parallelism, "operators", ops,
                  "bytes", (json_int_t)bytes, "store_graph", store_graph);
  else
    json_decref(ops);
  free(graph);
  free(store_graph);
  return m; /* json_pack's "o" took ops, also when it failed */
}

/* Note 1: manifest.json, atomically. */
static int manifest_write(const sl_job *job, const char *dir, uint64_t id,
                          int64_t created_ms, uint64_t bytes, char *err,
                          size_t err_bytes) {
  char temp[PATH_MAX], path[PATH_MAX];
  if ((size_t)snprintf(temp, sizeof temp, "%s/%s", dir, MANIFEST_TEMP_NAME) >=
          sizeof temp ||
      (size_t)snprintf(path, sizeof path, "%s/%s", dir, MANIFEST_NAME) >=
          sizeof path)
    return sl_say_err(err, err_bytes, ENAMETOOLONG, "savepoint %s: path too long",
               dir);
  assert(id > 0);
  json_t *m = manifest_build(job, id, created_ms, bytes);
  char *text = m ? json_dumps(m, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : 0;
  json_decref(m);
  if (!text)
    return sl_say_err(err, err_bytes, ENOMEM, "savepoint %s: out of memory", dir);
  int rc = write_file(temp, text, O_TRUNC);
  free(text);
  if (rc == 0 && rename(temp, path) != 0)
    rc = errno;
  if (rc == 0)
    rc = sl_store_sync_dir(dir);
  if (rc) {
    unlink(temp);
    unlink(path); /* a rename that happened before the fsync failed */
    return sl_say_err(err, err_bytes, rc, "savepoint %s: cannot write %s: %s", dir,
               MANIFEST_NAME, strerror(rc));
  }
  return 0;
}

/* Note 2: one line appended to state_dir/savepoints.jsonl.  One write()
 * of the whole line with O_APPEND, so lines of two processes never mix. */
static int journal_append(const sl_job *job, const char *dir, uint64_t id,
                          int64_t created_ms, uint64_t bytes, char *err,
                          size_t err_bytes) {
  const char *state_dir = job->config.checkpoint.state_dir;
  char absolute[PATH_MAX], path[PATH_MAX];
  if (!realpath(dir, absolute))
    return sl_say_err(err, err_bytes, errno, "savepoint %s written, but its "
               "absolute path is unknown: %s", dir, strerror(errno));
  if ((size_t)snprintf(path, sizeof path, "%s/%s", state_dir, JOURNAL_NAME) >=
      sizeof path)
    return sl_say_err(err, err_bytes, ENAMETOOLONG, "savepoint %s written, but %s/%s "
               "is too long a path", dir, state_dir, JOURNAL_NAME);
  json_t *line = json_pack("{s:I, s:I, s:s, s:I}", "checkpoint_id",
                           (json_int_t)id, "created_ms",
                           (json_int_t)created_ms, "path", absolute, "bytes",
                           (json_int_t)bytes);
  char *text = line ? json_dumps(line, JSON_COMPACT | JSON_PRESERVE_ORDER) : 0;
  json_decref(line);
  size_t n = text ? strlen(text) : 0;
  char *with_newline = text ? realloc(text, n + 2) : 0;
  if (!with_newline) {
    free(text);
    return sl_say_err(err, err_bytes, ENOMEM, "savepoint %s written, but not "
               "recorded in %s: out of memory", dir, path);
  }
  memcpy(with_newline + n, "\n", 2);
  int rc = write_file(path, with_newline, O_APPEND);
  free(with_newline);
  if (rc)
    return sl_say_err(err, err_bytes, rc, "savepoint %s written, but not recorded "
               "in %s: %s", dir, path, strerror(rc));
  return 0;
}

/* Note 6: why a savepoint of an unaligned checkpoint is refused. */
static int unaligned_refusal(const sl_job *job, const char *dir, uint64_t id,
                             uint64_t channel_bytes, char *err,
                             size_t err_bytes) {
  return sl_say_err(err, err_bytes, SL_ECHECKPOINT, "savepoint %s: checkpoint %"
             PRIu64 " is unaligned (its channel state, %" PRIu64 " bytes, "
             "holds records in flight) and a savepoint is copied from an "
             "aligned checkpoint only; %s", dir, id, channel_bytes,
             job->config.checkpoint_unaligned
                 ? "the job cannot take one now (it does not run, or fails "
                   "over): resume from its state directory instead, or try "
                   "again while it runs"
                 : "try again once the job has completed a checkpoint of "
                   "its own (it was resumed from an unaligned one)");
}

/* Note 6: the checkpoint id copied into dir, read back from the copy, is
 * aligned: its record says so and no blob of it holds channel state. */
static int copy_check(const sl_job *job, const char *dir, uint64_t id,
                      char *err, size_t err_bytes) {
  char message[MESSAGE_BYTES];
  sl_state_dir *sd = 0;
  int rc = sl_state_dir_open(dir, SL_STATE_DIR_NO_LOCK_FILE, &sd, message,
                             sizeof message);
  sl_inspect_checkpoint record;
  if (rc == 0)
    rc = sl_state_dir_checkpoint(sd, id, &record, message, sizeof message);
  if (rc) {
    sl_state_dir_close(sd);
    return sl_say_err(err, err_bytes, rc, "savepoint %s: the copy cannot be "
               "read back: %s", dir, message);
  }
  const sl_state_dir_info *info = sl_state_dir_info_get(sd);
  assert(info->latest == id); /* the copy holds one checkpoint */
  bool unaligned = record.unaligned != 0;
  uint64_t channel_bytes = record.unaligned ? record.channel_bytes : 0;
  for (int i = 0; i < info->blob_count; i++)
    unaligned = unaligned || info->blobs[i].channel_bytes != 0;
  sl_state_dir_close(sd);
  return unaligned ? unaligned_refusal(job, dir, id, channel_bytes, err,
                                       err_bytes)
                   : 0;
}

/* Under savepoint_lock: the steps of note 1. */
static int savepoint_locked(sl_job *job, sl_store *store, const char *dir,
                            uint64_t *checkpoint_id, char *err,
                            size_t err_bytes) {
  char message[MESSAGE_BYTES];
  uint64_t latest = 0;
  int rc = sl_store_read_latest(store, &latest, message, sizeof message);
  if (rc)
    return sl_say_err(err, err_bytes, rc, "savepoint %s: %s", dir, message);
  if (latest == 0)
    return sl_say_err(err, err_bytes, SL_ENOTFOUND, "savepoint %s: no checkpoint is "
               "complete yet (a savepoint copies the newest complete one)",
               dir);
  bool created = false;
  rc = prepare_directory(dir, &created, err, err_bytes);
  if (rc)
    return rc;
  uint64_t id = 0, bytes = 0;
  rc = sl_store_copy(store, dir, &id, &bytes, message, sizeof message);
  if (rc)
    sl_say_err(err, err_bytes, rc, "savepoint %s: %s", dir, message);
  if (rc == 0)
    rc = copy_check(job, dir, id, err, err_bytes); /* note 6 */
  int64_t created_ms = wall_ms();
  if (rc == 0)
    rc = manifest_write(job, dir, id, created_ms, bytes, err, err_bytes);
  if (rc) {
    char path[PATH_MAX];
    if ((size_t)snprintf(path, sizeof path, "%s/data.mdb", dir) < sizeof path)
      unlink(path); /* sl_store_copy removed its own on failure */
    if (created)
      rmdir(dir);
    return rc;
  }
  assert(id >= latest); /* "latest" only grows */
  assert(bytes > 0);
  if (checkpoint_id)
    *checkpoint_id = id;
  return journal_append(job, dir, id, created_ms, bytes, err, err_bytes);
}

/* Note 6: the job can take a checkpoint now. */
static bool can_checkpoint(sl_job *job) {
  return atomic_load(&job->state) == SL_JOB_RUNNING &&
         !atomic_load(&job->stopping) && !atomic_load(&job->cp_final_done);
}

/* Note 6, under savepoint_lock: an aligned checkpoint, then the copy. */
static int savepoint_aligned(sl_job *job, sl_store *store, const char *dir,
                             uint64_t *checkpoint_id, char *err,
                             size_t err_bytes) {
  char what[PATH_MAX + 16];
  snprintf(what, sizeof what, "savepoint %s", dir);
  sl_checkpointer_hold_aligned(job, true);
  uint64_t n = 0;
  int rc = sl_checkpoint_request_settled(job, what, &n, err, err_bytes);
  if (rc && atomic_load(&job->cp_final_done)) {
    /* The end of input came first: the final checkpoint is aligned
     * (every input had ended) and the newest; copy_check says so. */
    rc = 0;
    if (err && err_bytes > 0)
      err[0] = 0;
  }
  if (rc == 0)
    rc = savepoint_locked(job, store, dir, checkpoint_id, err, err_bytes);
  /* The copy is n or newer ("latest" only grows). */
  assert(rc != 0 || !checkpoint_id || *checkpoint_id >= n);
  sl_checkpointer_hold_aligned(job, false);
  return rc;
}

/* The checks of sl_job_savepoint: 0 and *store, or the error. */
static int savepoint_check(sl_job *job, const char *dir, sl_store **store,
                           char *err, size_t err_bytes) {
  if (!job || !dir || !dir[0])
    return sl_say_err(err, err_bytes, EINVAL, "savepoint: %s",
               !job ? "the job is NULL" : "no directory given");
  if (!job->config.checkpoint.state_dir)
    return sl_say_err(err, err_bytes, SL_EUSAGE, "savepoint %s: the job takes no "
               "checkpoints (no checkpoint.state_dir)", dir);
  *store = sl_checkpointer_store(job);
  if (!*store)
    return sl_say_err(err, err_bytes, SL_ENOTSTARTED, "savepoint %s: the job has "
               "not been started", dir);
  return 0;
}

SL_EXPORT int sl_job_savepoint(sl_job *job, const char *dir,
                               uint64_t *checkpoint_id, char *err,
                               size_t err_bytes) {
  if (checkpoint_id)
    *checkpoint_id = 0;
  if (err && err_bytes > 0)
    err[0] = 0;
  sl_store *store = 0;
  int rc = savepoint_check(job, dir, &store, err, err_bytes);
  if (rc)
    return rc;
  /* Note 6: a directory that cannot take the savepoint is refused
   * before a checkpoint is taken for it. */
  bool aligned_first = job->config.checkpoint_unaligned && can_checkpoint(job);
  if (aligned_first && (rc = sl_savepoint_dir_check(dir, err, err_bytes)))
    return rc;
  pthread_mutex_lock(&savepoint_lock);
  rc = aligned_first
           ? savepoint_aligned(job, store, dir, checkpoint_id, err, err_bytes)
           : savepoint_locked(job, store, dir, checkpoint_id, err, err_bytes);
  pthread_mutex_unlock(&savepoint_lock);
  return rc;
}

/* checkpoint.h: note 6, the copy of a stop with a savepoint. */
int sl_savepoint_copy(sl_job *job, const char *dir, uint64_t *checkpoint_id,
                      char *err, size_t err_bytes) {
  if (checkpoint_id)
    *checkpoint_id = 0;
  sl_store *store = 0;
  int rc = savepoint_check(job, dir, &store, err, err_bytes);
  if (rc)
    return rc;
  pthread_mutex_lock(&savepoint_lock);
  rc = savepoint_locked(job, store, dir, checkpoint_id, err, err_bytes);
  pthread_mutex_unlock(&savepoint_lock);
  return rc;
}

/* ------------------------------------------------------------ starting */

/* What a manifest says that starting needs (json owns the strings). */
typedef struct manifest {
  json_t *json;
  uint64_t checkpoint_id;
  const char *store_graph;
  int parallelism[SL_MAX_OPERATORS]; /* by physical index */
} manifest;

/* "text" or its first QUOTE_BYTES bytes and "...". */
#define QUOTE_FORMAT "\"%.*s%s\""
#define QUOTE_ARGS(text)                                                     \
  (int)QUOTE_BYTES, (text), strlen(text) > QUOTE_BYTES ? "..." : ""

/* The operators array against the job's physical operators (the graph
 * matched already, so a mismatch means a manifest edited by hand). */
static int manifest_operators(sl_job *job, const char *dir, json_t *ops,
                              manifest *m) {
  size_t n = json_array_size(ops);
  bool ok = json_is_array(ops) && n == (size_t)job->physical_count;
  for (size_t i = 0; ok && i < n; i++) { /* one per physical operator */
    json_int_t id = -1, parallelism = 0;
    const char *name = "";
    ok = json_unpack(json_array_get(ops, i), "{s:I, s:s, s:I}", "id", &id,
                     "name", &name, "parallelism", &parallelism) == 0 &&
         id == job->physical[i]->id &&
         strcmp(name, job->physical[i]->name) == 0 && parallelism >= 1 &&
         parallelism <= SL_MAX_PARALLELISM;
    m->parallelism[i] = (int)parallelism;
  }
  if (!ok) {
    sl_job_set_error(job, "savepoint %s: the operators of %s do not match "
                     "its graph", dir, MANIFEST_NAME);
    return SL_ESTORE;
  }
  return 0;
}

/* The checks of note 3 that need only the manifest and the job. */
static int manifest_check(sl_job *job, const char *dir, const char *format,
                          json_int_t version, json_int_t store_format,
                          json_int_t max_parallelism, const char *graph) {
  if (strcmp(format, SAVEPOINT_FORMAT) != 0) {
    sl_job_set_error(job, "savepoint %s: %s is not a sluice savepoint's "
                     "(format \"%.60s\")", dir, MANIFEST_NAME, format);
    return SL_ESTORE;
  }
  if (version != SAVEPOINT_VERSION || store_format != SL_STORE_FORMAT_VERSION) {
    /* An older store format is converted by the cli (cli/upgrade.c). */
    bool older = version == SAVEPOINT_VERSION && store_format == 2;
    sl_job_set_error(job, "savepoint %s: %s says savepoint format %lld "
                     "with store format %lld; this sluice reads savepoint "
                     "format %d with store format %u%s%s%s", dir,
                     MANIFEST_NAME, (long long)version,
                     (long long)store_format, SAVEPOINT_VERSION,
                     SL_STORE_FORMAT_VERSION,
                     older ? " (upgrade it with `sluice checkpoints "
                             "--upgrade " : "",
                     older ? dir : "", older ? "`)" : "");
    return SL_ESTORE;
  }
  if (max_parallelism != (json_int_t)job->config.max_parallelism) {
    sl_job_set_error(job, "savepoint %s: %s says max_parallelism %lld, "
                     "this job has %" PRIu32 " (key groups cannot be split "
                     "or merged: start it with max_parallelism %lld)", dir,
                     MANIFEST_NAME, (long long)max_parallelism, job->config.max_parallelism,
                     (long long)max_parallelism);
    return SL_ESTORE;
  }
  char *ours = savepoint_graph(job);
  if (!ours)
    return ENOMEM;
  int rc = strcmp(graph, ours) == 0 ? 0 : SL_ESTORE;
  if (rc)
    sl_job_set_error(job, "savepoint %s: %s: written by job graph "
                     QUOTE_FORMAT ", this job is " QUOTE_FORMAT, dir,
                     MANIFEST_NAME, QUOTE_ARGS(graph),
                     QUOTE_ARGS(ours));
  free(ours);
  return rc;
}

/* Reads and checks dir/manifest.json into *m (free with json_decref). */
static int manifest_read(sl_job *job, const char *dir, manifest *m) {
  char path[PATH_MAX];
  struct stat st;
  if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, MANIFEST_NAME) >=
      sizeof path)
    return sl_job_set_error(job, "savepoint %s: path too long", dir),
           ENAMETOOLONG;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
    return sl_job_set_error(job, "savepoint %s: no such directory", dir),
           ENOENT;
  if (stat(path, &st) != 0)
    return sl_job_set_error(job, "savepoint %s: no %s (not a savepoint, or "
                            "one whose writing did not finish)", dir,
                            MANIFEST_NAME),
           SL_ESTORE;
  json_error_t error;
  m->json = json_load_file(path, JSON_REJECT_DUPLICATES, &error);
  if (!m->json)
    return sl_job_set_error(job, "savepoint %s: %s is not valid JSON (line "
                            "%d: %.100s)", dir, MANIFEST_NAME, error.line,
                            error.text),
           SL_ESTORE;
  const char *format = "", *graph = "";
  json_int_t version = 0, store_format = 0, id = 0, max_parallelism = 0;
  json_t *ops = 0;
  if (json_unpack_ex(m->json, &error, 0,
                     "{s:s, s:I, s:I, s:I, s:s, s:I, s:o, s:s}", "format",
                     &format, "version", &version, "store_format",
                     &store_format, "checkpoint_id", &id, "graph", &graph,
                     "max_parallelism", &max_parallelism, "operators", &ops,
                     "store_graph", &m->store_graph) != 0 ||
      id <= 0)
    return sl_job_set_error(job, "savepoint %s: %s is malformed: %.100s",
                            dir, MANIFEST_NAME,
                            id <= 0 && !error.text[0] ? "bad checkpoint_id"
                                                      : error.text),
           SL_ESTORE;
  m->checkpoint_id = (uint64_t)id;
  int rc = manifest_check(job, dir, format, version, store_format,
                          max_parallelism, graph);
  return rc ? rc : manifest_operators(job, dir, ops, m);
}

/* What rescale_edit needs. */
typedef struct rescale {
  sl_job *job;
  const manifest *m;
} rescale;

/* Note 4 for one operator going from old to new instances: the lowest
 * watermark and largest timestamp of the old blobs into event_time[2],
 * and into *finished how many old instances had finished (coordinator.c
 * note 10), or a refusal if one holds operator state. */
static int rescale_read(sl_store *store, const sl_op *op, int old,
                        int64_t event_time[2], int *finished, char *err,
                        size_t err_bytes) {
  assert(old >= 1 && old <= SL_MAX_PARALLELISM); /* manifest_operators */
  assert(old != op->parallelism);
  event_time[0] = INT64_MAX;
  event_time[1] = SL_NO_TIMESTAMP;
  for (int k = 0; k < old; k++) { /* old <= SL_MAX_PARALLELISM */
    uint8_t *blob = 0;
    uint32_t bytes = 0;
    int rc = sl_store_get_blob(store, (uint16_t)op->id, (uint16_t)k,
                               (void **)&blob, &bytes);
    int64_t saved[2] = {SL_WATERMARK_MIN, SL_NO_TIMESTAMP};
    uint8_t flags = rc == 0 && bytes >= 1 ? blob[0] : 0;
    if (rc == 0 && (bytes < 1 || (flags & ~SL_BLOB_FLAGS) != 0 ||
                    ((flags & SL_BLOB_EVENT_TIME) &&
                     bytes < 1 + SL_BLOB_EVENT_TIME_BYTES)))
      rc = SL_ECORRUPT;
    if (rc == 0 && (flags & SL_BLOB_EVENT_TIME))
      memcpy(saved, blob + bytes - SL_BLOB_EVENT_TIME_BYTES, sizeof saved);
    free(blob);
    if (rc == SL_ENOTFOUND)
      rc = 0; /* nothing saved: no event time either */
    if (rc)
      return sl_say_err(err, err_bytes, rc, "the state of operator '%s' instance "
                 "%d cannot be read: %s: %s", op->name,
                 k, sl_strerror(rc), sl_store_error(store));
    if (flags & SL_BLOB_STATE)
      return sl_say_err(err, err_bytes, SL_ESTORE, "operator '%s' has "
                 "parallelism %d there and %d in this job, but its "
                 "instance %d saved operator state (a source position, sink "
                 "transactions or other sl_operator_state_set data), which "
                 "cannot be split or merged: keep its parallelism at %d "
                 "(only keyed state is redistributed)", op->name,
                 old, op->parallelism, k, old);
    *finished += (flags & SL_BLOB_FINISHED) != 0;
    if (saved[0] < event_time[0])
      event_time[0] = saved[0];
    if (saved[1] > event_time[1])
      event_time[1] = saved[1];
  }
  return 0;
}

/* Note 4 for one operator: its new blobs, and the old ones beyond its
 * new parallelism deleted. */
static int rescale_operator(sl_store *store, sl_store_txn *txn,
                            const sl_op *op, int old, char *err,
                            size_t err_bytes) {
  int64_t event_time[2];
  int finished = 0;
  int rc = rescale_read(store, op, old, event_time, &finished, err,
                        err_bytes);
  if (rc)
    return rc;
  /* coordinator.c note 10: all finished stay finished; some cannot be
   * told apart once the key groups are dealt out again. */
  if (finished != 0 && finished != old)
    return sl_say_err(err, err_bytes, SL_ESTORE, "operator '%s' has parallelism "
               "%d there and %d in this job, but only %d of its instances "
               "had finished: keep its parallelism at %d", op->name, old,
               op->parallelism, finished, old);
  assert(op->parallelism >= 1 && op->parallelism <= SL_MAX_PARALLELISM);
  bool has_event_time = event_time[0] != SL_WATERMARK_MIN ||
                        event_time[1] != SL_NO_TIMESTAMP;
  uint8_t blob[1 + SL_BLOB_EVENT_TIME_BYTES];
  blob[0] = (uint8_t)((has_event_time ? SL_BLOB_EVENT_TIME : 0u) |
                      (finished ? SL_BLOB_FINISHED : 0u));
  memcpy(blob + 1, event_time, SL_BLOB_EVENT_TIME_BYTES);
  uint32_t bytes = has_event_time ? sizeof blob : 1;
  for (int k = op->parallelism; k < old && rc == 0; k++)
    rc = sl_store_delete_blob(txn, (uint16_t)op->id, (uint16_t)k);
  for (int k = 0; k < op->parallelism && rc == 0; k++)
    rc = sl_store_put_blob(txn, (uint16_t)op->id, (uint16_t)k, blob, bytes);
  if (rc)
    return sl_say_err(err, err_bytes, rc, "rescaling operator '%s': %s", op->name,
               sl_store_error(store));
  return 0;
}

/* The manifest's parallelism of op against the copy (note 3): every
 * instance of a checkpoint has a blob (checkpoint_writer.c), so blobs 0 .. old-1
 * are there and blob old is not.  A manifest whose text was damaged into
 * another valid number would otherwise rescale what was not rescaled. */
static int instances_check(sl_store *store, const sl_op *op, int old,
                           char *err, size_t err_bytes) {
  assert(old >= 1 && old <= SL_MAX_PARALLELISM);
  void *blob = 0;
  uint32_t bytes = 0;
  int last = sl_store_get_blob(store, (uint16_t)op->id, (uint16_t)(old - 1),
                               &blob, &bytes);
  free(blob);
  blob = 0;
  int beyond = old < SL_MAX_PARALLELISM
                   ? sl_store_get_blob(store, (uint16_t)op->id,
                                       (uint16_t)old, &blob, &bytes)
                   : SL_ENOTFOUND;
  free(blob);
  if (last == SL_ECORRUPT || beyond == SL_ECORRUPT)
    return sl_say_err(err, err_bytes, SL_ECORRUPT, "%s", sl_store_error(store));
  if (last == 0 && beyond == SL_ENOTFOUND)
    return 0;
  if ((last != 0 && last != SL_ENOTFOUND) ||
      (beyond != 0 && beyond != SL_ENOTFOUND))
    return sl_say_err(err, err_bytes, last ? last : beyond, "%s",
               sl_store_error(store));
  return sl_say_err(err, err_bytes, SL_ESTORE, "%s says operator '%s' had %d "
             "instances, but data.mdb holds blobs of another number",
             MANIFEST_NAME, op->name, old);
}

/* Note 4: rescaling moves channels (an operator's instances read one
 * ring per upstream instance), so a checkpoint whose blobs hold channel
 * state (unaligned, SL_BLOB_CHANNELS) is refused: its channel state
 * cannot be dealt out again. */
static int channel_state_refuse(sl_store *store, const sl_job *job,
                                const manifest *m, char *err,
                                size_t err_bytes) {
  for (int i = 0; i < job->physical_count; i++) {
    const sl_op *op = job->physical[i];
    for (int k = 0; k < m->parallelism[i]; k++) {
      uint8_t *blob = 0;
      uint32_t bytes = 0;
      int rc = sl_store_get_blob(store, (uint16_t)op->id, (uint16_t)k,
                                 (void **)&blob, &bytes);
      bool channels = rc == 0 && bytes >= 1 && (blob[0] & SL_BLOB_CHANNELS);
      free(blob);
      if (rc && rc != SL_ENOTFOUND)
        return sl_say_err(err, err_bytes, rc, "the state of operator '%s' "
                   "instance %d cannot be read: %s: %s", op->name, k,
                   sl_strerror(rc), sl_store_error(store));
      if (channels)
        return sl_say_err(err, err_bytes, SL_ESTORE, "checkpoint %" PRIu64
                   " is an unaligned checkpoint whose operator '%s' "
                   "instance %d holds channel state (records in flight), "
                   "which cannot be redistributed: start it with the "
                   "parallelisms it was taken with, or take the savepoint "
                   "from an aligned checkpoint (a stop with a savepoint "
                   "is always aligned)", m->checkpoint_id, op->name, k);
    }
  }
  return 0;
}

/* sl_store_install's edit (store.h): the copy against its manifest, then
 * every operator whose parallelism changed. */
static int rescale_edit(void *arg, sl_store *store, sl_store_txn *txn,
                        char *err, size_t err_bytes) {
  const rescale *r = arg;
  const sl_job *job = r->job;
  assert(job->physical_count <= SL_MAX_OPERATORS);
  if (sl_store_latest(store) != r->m->checkpoint_id)
    return sl_say_err(err, err_bytes, SL_ESTORE, "data.mdb holds checkpoint %"
               PRIu64 ", its manifest says %" PRIu64,
               sl_store_latest(store), r->m->checkpoint_id);
  bool rescaled = false;
  for (int i = 0; i < job->physical_count; i++)
    rescaled = rescaled || r->m->parallelism[i] != job->physical[i]->parallelism;
  if (rescaled) {
    int rc = channel_state_refuse(store, job, r->m, err, err_bytes);
    if (rc)
      return rc;
  }
  for (int i = 0; i < job->physical_count; i++) {
    const sl_op *op = job->physical[i];
    int old = r->m->parallelism[i];
    int rc = instances_check(store, op, old, err, err_bytes);
    if (rc)
      return rc;
    if (old == op->parallelism)
      continue;
    rc = rescale_operator(store, txn, op, old, err, err_bytes);
    if (rc)
      return rc;
  }
  return 0;
}

int sl_savepoint_install(sl_job *job, const char *fingerprint) {
  const struct sl_checkpoint_config *c = &job->config.checkpoint;
  const char *dir = c->from_savepoint;
  assert(dir && c->state_dir); /* config_resolve_rest */
  assert(fingerprint != 0);
  assert(!job->restarting); /* a restart resumes its own store */
  manifest *m = calloc(1, sizeof *m);
  if (!m)
    return ENOMEM;
  int rc = manifest_read(job, dir, m);
  if (rc == 0) {
    rescale r = {.job = job, .m = m};
    sl_store_install_options options = {
        .source_graph = m->store_graph,
        .graph = fingerprint,
        .replace = c->store_policy == SL_STORE_FRESH,
        .no_sync = c->no_sync,
        .edit = rescale_edit,
        .edit_arg = &r};
    char message[MESSAGE_BYTES];
    rc = sl_store_install(c->state_dir, dir, &options, message,
                          sizeof message);
    if (rc)
      sl_job_set_error(job, "starting from savepoint %s (its data.mdb "
                       "against its %s): %s", dir, MANIFEST_NAME, message);
  }
  json_decref(m->json);
  free(m);
  return rc;
}
