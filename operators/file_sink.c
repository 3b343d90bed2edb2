/* file_sink.c — file sinks: transactional (exactly-once) and plain
 * (at-least-once).
 *
 * NOTES ON THE DESIGN OF THE TRANSACTIONAL FILE SINK
 *
 * 1. Instance k writes its output into part files of its own, one per
 *    checkpoint interval: DIR/.part-K-SEQ.pending while open or
 *    pre-committed, renamed to DIR/part-K-SEQSUFFIX when committed.  A
 *    reader that ignores dot files never sees uncommitted output; rename()
 *    makes the switch atomic.
 * 2. Pre-commit (snapshot hook of checkpoint n): flush and fsync the open
 *    part (or delete it if empty) and remember it as pre-committed with n.
 *    The operator state saved for n is: the next SEQ, and the SEQs of every
 *    part pre-committed and not yet committed.
 * 3. Commit (checkpoint_complete m): rename every pre-committed part with
 *    checkpoint <= m, then fsync the directory.  Parts of an aborted
 *    checkpoint are committed by the next completion (their records are
 *    part of the stream).
 * 4. Restore from n: rename every part listed in n's state that is still
 *    pending (a commit interrupted by a crash; idempotent: a part already
 *    renamed is skipped), and delete every other .part-K-*.pending file of
 *    this instance — output after n, which the replay writes again.
 * 5. Without checkpointing the sink commits its single part at the end of
 *    input (finish).
 * 6. A start with no checkpoint to restore (a first run, a fresh store, a
 *    restart before any checkpoint completed, a resume of a run killed
 *    before its first checkpoint) deletes the instance's pending parts: no
 *    checkpoint refers to them, so none could ever commit them, and left
 *    alone they would outlive the run as uncommitted files.
 * 7. DIR belongs to one job lineage (output_dir.h): a start with nothing
 *    to restore claims it first, refusing another lineage's committed
 *    parts unless config.clear_other_lineage; a restore checks the lineage
 *    its state names, and refuses a committed part of this instance at or
 *    past the restored next SEQ (output of a run that went on from the
 *    same checkpoint, e.g. the job a savepoint was taken of).  Commits never
 *    replace a part (note 3 uses sl_output_commit).  The instances of one
 *    sink claim under one mutex, so the first does the work and the
 *    others find their own marker.
 *
 * The plain sink appends to DIR/out-K.SUFFIX and flushes on each snapshot;
 * after a resume the records since the restored checkpoint appear again
 * (at-least-once).
 */
#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config_abi.h"
#include "fault.h"
#include "internal.h"
#include "op_util.h"
#include "output_dir.h"

#define FILE_SINK_MAX_PENDING 4096 /* parts awaiting commit per instance */
/* First word of the saved state since lineages (note 7): state saved
 * before starts with the next SEQ, which never comes near it. */
#define FILE_SINK_STATE_MAGIC 0x32766c6e6b6e6973ull /* "sinknlv2" */
#define FILE_SINK_STATE_HEADER_WORDS 3 /* magic, lineage, next SEQ */

typedef struct file_sink {
  sl_file_sink_config config;
  char dir[4096];
  char suffix[32];
  char header[4096]; /* first line of every file, "" for none */
  uint64_t lineage;  /* drawn when built: this run's, if it restores none */
  pthread_mutex_t claim_lock; /* instances claim DIR one at a time */
} file_sink;

/* Write the header line, if any, at the start of a new file. */
static int write_header(const file_sink *sink, FILE *file) {
  if (!sink->header[0])
    return 0;
  return fputs(sink->header, file) < 0 || fputc('\n', file) == EOF ? EIO : 0;
}

typedef struct part {
  uint64_t seq;
  uint64_t checkpoint_id;
} part;

typedef struct file_sink_instance {
  file_sink *sink;
  int index;
  uint64_t lineage; /* the sink's, or the restored state's (note 7) */
  FILE *file;       /* open part (or the plain file) */
  uint64_t seq;     /* SEQ of the open part, or of the next one */
  bool written;     /* the open part holds records */
  part pending[FILE_SINK_MAX_PENDING];
  int pending_count;
  char *line;       /* formatting buffer */
  uint32_t line_bytes;
} file_sink_instance;

static void part_path(const file_sink_instance *f, uint64_t seq, bool final,
                      char *path, size_t bytes) {
  if (final)
    snprintf(path, bytes, "%s/part-%d-%08" PRIu64 "%s", f->sink->dir,
             f->index, seq, f->sink->suffix);
  else
    snprintf(path, bytes, "%s/.part-%d-%08" PRIu64 ".pending", f->sink->dir,
             f->index, seq);
}

static int fail_errno(sl_ctx *ctx, int e, const char *what, const char *path) {
  if (e == 0)
    e = EIO; /* a failure without errno (a short write) is still one */
  sl_ctx_fail(ctx, "%s %s: %s", what, path, strerror(e));
  return e; /* the errno itself (sluice.h, CALLBACK RETURNS) */
}

static int open_part(sl_ctx *ctx, file_sink_instance *f) {
  char path[4200];
  part_path(f, f->seq, false, path, sizeof path);
  f->file = fopen(path, "wb");
  if (!f->file)
    return fail_errno(ctx, errno, "cannot create", path);
  f->written = false;
  if (write_header(f->sink, f->file) != 0)
    return fail_errno(ctx, errno ? errno : EIO, "cannot write", path);
  return 0;
}

/* Flush, fsync and close the open part.  Returns 0 or an errno. */
static int close_part(sl_ctx *ctx, file_sink_instance *f) {
  if (!f->file)
    return 0;
  char path[4200];
  part_path(f, f->seq, false, path, sizeof path);
  int rc = 0;
  if (fflush(f->file) != 0 || fsync(fileno(f->file)) != 0)
    rc = fail_errno(ctx, errno, "cannot write", path);
  if (fclose(f->file) != 0 && rc == 0)
    rc = fail_errno(ctx, errno, "cannot close", path);
  f->file = 0;
  return rc;
}

static int format_record(file_sink_instance *f, const sl_record *in,
                         const char **text, uint32_t *bytes) {
  const sl_file_sink_config *c = &f->sink->config;
  if (!c->format) {
    *text = in->data;
    *bytes = in->size_bytes;
    return 0;
  }
  for (;;) {
    int n = c->format(c->format_user, in, f->line, f->line_bytes);
    if (n < 0)
      return n;
    if ((uint32_t)n <= f->line_bytes) {
      *text = f->line;
      *bytes = (uint32_t)n;
      return 0;
    }
    char *bigger = realloc(f->line, (size_t)n);
    if (!bigger)
      return ENOMEM;
    f->line = bigger;
    f->line_bytes = (uint32_t)n;
  }
}

static int file_sink_process(sl_ctx *ctx, void *state, int input,
                             const sl_record *in) {
  (void)input;
  file_sink_instance *f = state;
  if (!f->file) {
    int rc = open_part(ctx, f);
    if (rc)
      return rc;
  }
  const char *text;
  uint32_t bytes;
  int rc = format_record(f, in, &text, &bytes);
  if (rc)
    return rc;
  if (fwrite(text, 1, bytes, f->file) != bytes || fputc('\n', f->file) == EOF)
    return fail_errno(ctx, errno, "cannot write to part", f->sink->dir);
  f->written = true;
  return 0;
}

/* Note 3: commit parts pre-committed with checkpoints <= id.  A part that
 * is already gone is an error, except on restore (it may have been renamed
 * before a crash: note 4). */
static int commit_parts(sl_ctx *ctx, file_sink_instance *f, uint64_t id,
                        bool restoring) {
  int kept = 0, rc = 0;
  for (int i = 0; i < f->pending_count; i++) {
    if (f->pending[i].checkpoint_id > id) {
      f->pending[kept++] = f->pending[i];
      continue;
    }
    char from[4200], to[4200];
    part_path(f, f->pending[i].seq, false, from, sizeof from);
    part_path(f, f->pending[i].seq, true, to, sizeof to);
    int e = sl_output_commit(from, to, restoring);
    if (e && rc == 0) {
      struct stat st;
      if (e == EEXIST)
        rc = fail_errno(ctx, e, "cannot commit (a committed part is never "
                        "replaced)", to);
      else if (!(e == ENOENT && restoring && stat(to, &st) == 0))
        rc = fail_errno(ctx, e, "cannot commit", from);
    } else if (e == 0 && ctx->job->faults) {
      /* inject.c: a crash between the renames of one commit */
      sl_inject_crash_point(ctx->job, SL_CRASH_SINK_COMMIT);
    }
  }
  bool any = kept != f->pending_count;
  f->pending_count = kept;
  if (any && rc == 0) {
    int e = sl_output_sync_dir(f->sink->dir);
    if (e)
      rc = fail_errno(ctx, e, "cannot sync directory", f->sink->dir);
  }
  return rc;
}

/* Note 2. */
static int file_sink_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  file_sink_instance *f = state;
  if (f->file) {
    bool written = f->written;
    if (written && f->pending_count == FILE_SINK_MAX_PENDING) {
      /* Checked before closing: the open part keeps its records and goes
       * with a later snapshot. */
      sl_ctx_fail(ctx, "%d parts await a completed checkpoint",
                  FILE_SINK_MAX_PENDING);
      return ENOSPC;
    }
    int rc = close_part(ctx, f);
    if (written) {
      /* Recorded even if closing failed: the part holds records, and the
       * next part must not reuse (truncate) its SEQ.  The final snapshot
       * has id 0: it commits with the final checkpoint, whatever its id. */
      f->pending[f->pending_count].seq = f->seq;
      f->pending[f->pending_count].checkpoint_id = id ? id : UINT64_MAX - 1;
      f->pending_count++;
    } else if (rc == 0) {
      char path[4200];
      part_path(f, f->seq, false, path, sizeof path);
      unlink(path);
    }
    f->seq++;
    if (rc)
      return rc;
  }
  /* State: magic, lineage, next SEQ, then the pending SEQs. */
  enum { H = FILE_SINK_STATE_HEADER_WORDS };
  uint64_t state_words[H + FILE_SINK_MAX_PENDING];
  assert(f->lineage != 0);
  state_words[0] = FILE_SINK_STATE_MAGIC;
  state_words[1] = f->lineage;
  state_words[2] = f->seq;
  for (int i = 0; i < f->pending_count; i++)
    state_words[H + i] = f->pending[i].seq;
  return sl_operator_state_set(ctx, state_words,
                               (uint32_t)(8 * (H + f->pending_count)));
}

static void file_sink_complete(sl_ctx *ctx, void *state, uint64_t id) {
  file_sink_instance *f = state;
  /* The final checkpoint completes with the highest id: commit all. */
  if (atomic_load(&ctx->job->cp_final_done))
    id = UINT64_MAX;
  if (commit_parts(ctx, f, id, false) != 0)
    sl_instance_fail(ctx, EIO); /* committed data must not silently lag */
}

/* Is name a pending part of instance index?  Returns its SEQ or -1. */
static int64_t pending_seq(const char *name, int index) {
  int k;
  unsigned long long seq;
  int end = 0;
  if (sscanf(name, ".part-%d-%llu.pending%n", &k, &seq, &end) != 2 ||
      name[end] != 0 || k != index)
    return -1;
  return (int64_t)seq;
}

/* Delete every pending part of instance index in dir (output of a run
 * whose checkpoints never completed: note 4 and file_sink_open). */
static void delete_pending(const char *dir, int index) {
  DIR *d = opendir(dir);
  if (!d)
    return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (pending_seq(e->d_name, index) < 0)
      continue;
    char path[4096 + 256 + 2];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  closedir(d);
}

/* Decode the saved state (bytes 0: none) into f: the next SEQ, the
 * pending parts, and the lineage (0 in state saved before lineages). */
static int decode_state(sl_ctx *ctx, file_sink_instance *f, const void *data,
                        uint32_t bytes, uint64_t id) {
  uint32_t words = bytes / 8, header = 1;
  uint64_t w0 = 0;
  if (bytes >= 8)
    memcpy(&w0, data, 8);
  if (w0 == FILE_SINK_STATE_MAGIC)
    header = FILE_SINK_STATE_HEADER_WORDS;
  if (bytes && (bytes % 8 || words < header ||
                words - header > FILE_SINK_MAX_PENDING)) {
    sl_ctx_fail(ctx, "checkpoint %" PRIu64 ": file sink state of %" PRIu32
                " bytes is malformed", id, bytes);
    return EINVAL;
  }
  uint64_t word[FILE_SINK_STATE_HEADER_WORDS] = {0};
  if (bytes)
    memcpy(word, data, 8 * header);
  f->lineage = header == FILE_SINK_STATE_HEADER_WORDS ? word[1] : 0;
  f->seq = bytes ? word[header - 1] : 0;
  f->pending_count = 0;
  for (uint32_t i = header; i < words; i++) {
    uint64_t seq;
    memcpy(&seq, (const char *)data + 8 * i, 8);
    f->pending[f->pending_count].seq = seq;
    f->pending[f->pending_count].checkpoint_id = id;
    f->pending_count++;
  }
  assert(f->pending_count <= FILE_SINK_MAX_PENDING);
  return 0;
}

/* Note 7: a committed part of this instance at or past the restored next
 * SEQ is another run's (the restore never wrote it); its name goes into
 * found.  Returns 0 or an errno value. */
static int committed_past(const file_sink_instance *f, char *found,
                          size_t found_bytes) {
  found[0] = 0;
  DIR *d = opendir(f->sink->dir);
  if (!d)
    return errno;
  struct dirent *e;
  while ((e = readdir(d))) {
    int k, end = 0;
    unsigned long long seq;
    if (sscanf(e->d_name, "part-%d-%llu%n", &k, &seq, &end) != 2 ||
        k != f->index || seq < f->seq ||
        strcmp(e->d_name + end, f->sink->suffix) != 0)
      continue;
    snprintf(found, found_bytes, "%s", e->d_name);
    break;
  }
  closedir(d);
  return 0;
}

/* Note 7: the restored lineage must own DIR. */
static int check_lineage(sl_ctx *ctx, file_sink_instance *f, uint64_t id) {
  char err[SL_ERROR_BYTES] = "";
  pthread_mutex_lock(&f->sink->claim_lock);
  int rc = sl_output_check_restored(f->sink->dir, &f->lineage,
                                    f->sink->lineage, id, err, sizeof err);
  pthread_mutex_unlock(&f->sink->claim_lock);
  if (rc) {
    sl_ctx_fail(ctx, "%s", err[0] ? err : sl_strerror(rc));
    return rc;
  }
  char found[256];
  rc = committed_past(f, found, sizeof found);
  if (rc)
    return fail_errno(ctx, rc, "cannot read directory", f->sink->dir);
  if (found[0]) {
    sl_ctx_fail(ctx, "output directory %s holds %s, committed after "
                "checkpoint %" PRIu64 " by a run that went on from it: "
                "start from it into another directory", f->sink->dir,
                found, id);
    return EEXIST;
  }
  return 0;
}

/* Note 4. */
static int file_sink_restore(sl_ctx *ctx, void *state, uint64_t id) {
  file_sink_instance *f = state;
  const void *data;
  uint32_t bytes;
  int rc = sl_operator_state_get(ctx, &data, &bytes);
  if (rc == SL_ENOTFOUND)
    bytes = 0; /* nothing committed yet: every pending part is later output */
  else if (rc)
    return rc;
  rc = decode_state(ctx, f, data, bytes, id);
  if (rc == 0)
    rc = check_lineage(ctx, f, id);
  if (rc == 0)
    rc = commit_parts(ctx, f, id, true);
  if (rc)
    return rc;
  DIR *d = opendir(f->sink->dir);
  if (!d)
    return fail_errno(ctx, errno, "cannot read directory", f->sink->dir);
  closedir(d);
  delete_pending(f->sink->dir, f->index); /* after n: the replay writes it
                                             again */
  return 0;
}

/* Note 7: a start with nothing to restore claims DIR for this run. */
static int claim_dir(sl_ctx *ctx, file_sink *sink) {
  char err[SL_ERROR_BYTES] = "";
  pthread_mutex_lock(&sink->claim_lock);
  int rc = sl_output_claim(sink->dir, sink->lineage,
                           sink->config.clear_other_lineage != 0, err,
                           sizeof err);
  pthread_mutex_unlock(&sink->claim_lock);
  if (rc == 0)
    return 0;
  sl_ctx_fail(ctx, "%s", err[0] ? err : sl_strerror(rc));
  return rc;
}

static int file_sink_open(sl_ctx *ctx, void *user, void **state) {
  file_sink *sink = user;
  if (mkdir(sink->dir, 0777) != 0 && errno != EEXIST)
    return fail_errno(ctx, errno, "cannot create directory", sink->dir);
  if (sink->config.exactly_once && ctx->cp.restored_from == 0) {
    int rc = claim_dir(ctx, sink);
    if (rc)
      return rc;
  }
  file_sink_instance *f = calloc(1, sizeof *f);
  if (!f)
    return ENOMEM;
  f->sink = sink;
  f->index = sl_ctx_instance(ctx);
  f->lineage = sink->lineage; /* a restore replaces it with its own */
  /* Note 6: nothing to restore, so any pending part of this instance is
   * the output of an earlier run (or attempt) none of whose checkpoints
   * completed: no checkpoint can ever commit it. */
  if (sink->config.exactly_once && ctx->cp.restored_from == 0)
    delete_pending(sink->dir, f->index);
  if (!sink->config.exactly_once) {
    char path[4200];
    snprintf(path, sizeof path, "%s/out-%d%s", sink->dir, f->index,
             sink->suffix);
    f->file = fopen(path, "ab");
    if (!f->file) {
      int rc = fail_errno(ctx, errno, "cannot open", path);
      free(f);
      return rc;
    }
    /* A new (empty) file gets the header; appending to one does not. */
    if (fseek(f->file, 0, SEEK_END) == 0 && ftell(f->file) == 0 &&
        write_header(sink, f->file) != 0) {
      int rc = fail_errno(ctx, errno ? errno : EIO, "cannot write", path);
      fclose(f->file);
      free(f);
      return rc;
    }
  }
  *state = f;
  return 0;
}

static int file_sink_finish(sl_ctx *ctx, void *state) {
  file_sink_instance *f = state;
  if (!f->sink->config.exactly_once || sl_ctx_checkpointing(ctx))
    return 0; /* plain: close flushes; checkpointed: the final checkpoint */
  /* Note 5: no checkpoints, commit at the end of input. */
  if (f->file) {
    int rc = close_part(ctx, f);
    if (rc)
      return rc;
    f->pending[0].seq = f->seq++;
    f->pending[0].checkpoint_id = 0;
    f->pending_count = 1;
  }
  return commit_parts(ctx, f, UINT64_MAX, false);
}

static int plain_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  file_sink_instance *f = state;
  if (fflush(f->file) != 0 || fsync(fileno(f->file)) != 0)
    return fail_errno(ctx, errno, "cannot write", f->sink->dir);
  return 0;
}

static void file_sink_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  file_sink_instance *f = state;
  if (f->file)
    fclose(f->file); /* an uncommitted part stays pending (note 4) */
  free(f->line);
  free(f);
}

static void free_sink(void *user) {
  file_sink *sink = user;
  pthread_mutex_destroy(&sink->claim_lock);
  free(sink);
}

SL_EXPORT int sl_sink_file_sized(sl_job *job, const char *name,
                                 sl_op *input, int parallelism,
                                 const sl_file_sink_config *config,
                                 sl_op **op, size_t config_bytes) {
  sl_file_sink_config copy;
  if (SL_CONFIG_READ(job, sl_sink_file, sl_file_sink_config,
                     SL_FILE_SINK_CONFIG_V1, config, config_bytes, &copy))
    return EINVAL;
  if (config)
    config = &copy;
  if (!config || !config->dir || !config->dir[0] ||
      strlen(config->dir) >= sizeof(((file_sink *)0)->dir) ||
      (config->suffix && strlen(config->suffix) >= 32) ||
      (config->header && (strlen(config->header) >= 4096 ||
                          strchr(config->header, '\n'))))
    return EINVAL;
  file_sink *sink = calloc(1, sizeof *sink);
  if (!sink)
    return ENOMEM;
  sink->config = *config;
  strcpy(sink->dir, config->dir);
  strcpy(sink->suffix, config->suffix ? config->suffix : ".txt");
  if (config->header)
    strcpy(sink->header, config->header);
  sink->config.dir = sink->dir;
  sink->config.suffix = sink->suffix;
  sink->config.header = sink->header;
  sink->lineage = sl_output_new_lineage();
  pthread_mutex_init(&sink->claim_lock, NULL);
  static const sl_process_ops exactly_once = {
      .open = file_sink_open,
      .process = file_sink_process,
      .finish = file_sink_finish,
      .close = file_sink_close,
      .snapshot = file_sink_snapshot,
      .checkpoint_complete = file_sink_complete,
      .restore = file_sink_restore};
  static const sl_process_ops plain = {.open = file_sink_open,
                                       .process = file_sink_process,
                                       .close = file_sink_close,
                                       .snapshot = plain_snapshot};
  int rc = sl_op_sink(job, name, input, parallelism,
                      config->exactly_once ? &exactly_once : &plain, sink, op);
  return op_adopt(rc, op, sink, free_sink);
}

/* The version-1 symbol (config_abi.c note 1): a program linked before the
 * sized call existed passed a version-1 struct. */
SL_EXPORT int(sl_sink_file)(sl_job *job, const char *name, sl_op *input,
                            int parallelism, const sl_file_sink_config *config,
                            sl_op **op) {
  return sl_sink_file_sized(job, name, input, parallelism, config, op,
                            SL_FILE_SINK_CONFIG_V1);
}
