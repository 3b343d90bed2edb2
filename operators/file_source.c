/* file_source.c — sources of CSV / JSON lines records: a list of files
 * (replayable) and standard input (not replayable), with dead letters.
 *
 * NOTES ON THE DESIGN
 *
 * 1. One instance (parallelism 1) reads the files in list order through
 *    one io_reader (io_reader.c: large reads, lines cut in place, parsed
 *    by io_parse.c straight into the batch of records).
 * 2. Position.  The reader's offset is the start of the next line.  next()
 *    parses and emits every line it consumed before it returns, and
 *    snapshots run between next() calls, so the saved position (file
 *    index, offset, line number) is exactly after the last record emitted.
 *    Restore seeks there and drops the buffer.
 * 3. An over-long line is reported once, as malformed, with its first
 *    max_line_bytes bytes; the reader then discards the rest of it.  That
 *    can span next() calls and checkpoints, so `skipping` is saved too.
 * 4. Bounded work per next(): at most batch_capacity records (1024, fewer
 *    for big records so a batch stays near 1 MiB), IO_LINES_PER_CALL lines
 *    and IO_BYTES_PER_CALL bytes, so a run of empty or malformed lines
 *    does not hold up barriers.
 * 5. Dead letters (file source).  The file is part of the job's output and
 *    exact: a snapshot flushes and fsyncs it and saves its length; a
 *    restore truncates it to the saved length (the replay writes the later
 *    entries again); a start with nothing to restore empties it.  The
 *    stdin source saves no position, so its dead-letter file is only
 *    appended to and flushed at checkpoints.
 * 6. A restore (a resume, a savepoint start or a failover) checks that
 *    it reads the same input.  The position holds the hash of the path
 *    being read and the file's identity (io_reader.c note 6: device,
 *    inode, hashes of both ends of the consumed prefix).  A restore over
 *    another path list, a file replaced, truncated below the position or
 *    changed before it, or a FIFO read past its start fails the job with
 *    "checkpoint C: input file PATH was replaced: ...".  Bytes appended
 *    after the position are read as new input.  Positions saved before
 *    identities (POSITION_WORDS_V1, version 1) are still accepted, with
 *    a warning, and checked only for the path and the length: refusing
 *    them would strand every state directory written by an older build,
 *    and the next checkpoint saves the full position.  For a CSV file
 *    with a header, restoring past line 1 reads line 1 again to rebuild
 *    the column map.
 * 7. Standard input, and a file that is a FIFO or a device: before each
 *    read the reader polls for at most IO_STDIN_WAIT_MS, and next()
 *    returns with what it has when nothing comes, so sl_job_stop() and
 *    checkpoint barriers are never held up by a quiet pipe; such a file is
 *    opened without blocking (io_open_input), since open(2) of a FIFO
 *    waits for a writer.  The stdin reader, parser and line number live in
 *    the operator's data, not the instance's, so an in-process restart
 *    (failover) goes on with the bytes already read instead of dropping
 *    them.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config_abi.h"
#include "internal.h"
#include "op_util.h"
#include "io_internal.h"
#include "log.h"

#define IO_BATCH_BYTES (1u << 20)      /* records parsed per next(), in bytes */
#define IO_RECORDS_PER_CALL 1024u      /* ... and in records */
#define IO_LINES_PER_CALL 8192u        /* lines looked at per next() */
#define IO_BYTES_PER_CALL (8u << 20)   /* bytes consumed per next() */
#define IO_MAX_LINE_BYTES (256u << 20) /* largest max_line_bytes */
#define IO_PATH_BYTES 4096             /* a path, with its NUL */
#define IO_STDIN_NAME "<stdin>"
#define POSITION_VERSION 2 /* position_word's layout */
#define POSITION_WORDS_V1 6 /* version 1: no version word, no identity */

/* The saved position, in 64-bit words (notes 2, 3, 5, 6). */
enum position_word {
  P_VERSION,    /* POSITION_VERSION */
  P_FILE,       /* index of the file being read; path_count: all were */
  P_OFFSET,     /* of the next line in it */
  P_LINE,       /* that line's number */
  P_DEAD_BYTES, /* length of the dead-letter file */
  P_PATH_HASH,  /* of the path being read; 0 once all were */
  P_SKIPPING,   /* inside an over-long line */
  P_KIND,       /* io_identity: enum io_identity_kind */
  P_DEVICE,
  P_INODE,
  P_SIZE,
  P_HEAD_HASH,
  P_TAIL_HASH,
  POSITION_WORDS
};

_Static_assert(IO_LINES_PER_CALL >= IO_RECORDS_PER_CALL,
               "a call can fill its batch when every line is a record");

/* ------------------------------------------------------------ source data */

/* Where reading stands: the parser and reader with the current file. */
typedef struct input {
  io_parser parser;
  io_reader reader;
  int file_index; /* file being read, path_count when all are done */
  uint64_t line;  /* number of the next line of that file, from 1 */
  bool ready;     /* parser and reader are set up */
} input;

/* The operator's data: the configuration, copied. */
typedef struct io_source {
  io_schema *schema;
  int format;
  char delimiter;
  uint32_t max_line_bytes;
  char **paths; /* path_count of them; for stdin IO_STDIN_NAME */
  int path_count;
  char *dead_letter_path;
  bool is_stdin;
  input stdin_input; /* note 7: kept across restarts */
} io_source;

typedef struct io_instance {
  io_source *source;
  input own;     /* the files' input */
  input *in;     /* &own, or the stdin input of the source */
  io_dead_letter dead;
  uint8_t *batch; /* batch_capacity records */
  int64_t *timestamps;
  uint32_t batch_capacity;
} io_instance;

static int input_init(input *in, const io_source *src) {
  memset(in, 0, sizeof *in);
  int rc = io_reader_init(&in->reader, src->max_line_bytes);
  if (rc == 0)
    rc = io_parser_init(&in->parser, src->schema, src->format,
                        src->delimiter);
  if (rc) {
    io_reader_free(&in->reader);
    return rc;
  }
  in->line = 1;
  in->ready = true;
  return 0;
}

static void input_free(input *in) {
  if (!in->ready)
    return;
  io_parser_free(&in->parser);
  io_reader_free(&in->reader);
  in->ready = false;
}

static void io_source_free(void *p) {
  io_source *src = p;
  if (!src)
    return;
  if (src->is_stdin)
    input_free(&src->stdin_input);
  for (int i = 0; i < src->path_count && src->paths; i++)
    free(src->paths[i]);
  free(src->paths);
  free(src->dead_letter_path);
  io_schema_free(src->schema);
  free(src);
}

static uint64_t path_hash(const char *path) {
  return sl_hash_bytes(path, strlen(path));
}

/* ------------------------------------------------------------ files */

static void close_file(input *in) {
  if (in->reader.fd >= 0)
    close(in->reader.fd);
  in->reader.fd = -1;
}

/* Open file in->file_index, reading from its start; a FIFO or device
 * without blocking (note 7). */
static int open_file(sl_ctx *ctx, io_instance *s) {
  input *in = s->in;
  const char *path = s->source->paths[in->file_index];
  bool stream = false;
  int fd = io_open_input(path, &stream);
  if (fd < 0)
    return io_fail_errno(ctx, -fd, "cannot open file", path);
  if (!stream)
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL); /* advice: may fail */
  in->reader.fd = fd;
  in->reader.poll_first = stream;
  io_reader_reset(&in->reader, 0, false);
  in->line = 1;
  io_parser_new_file(&in->parser);
  return 0;
}

/* A line cut in the middle of a UTF-8 byte order mark is not stripped. */
static void strip_bom(uint64_t number, const char **line, size_t *bytes) {
  if (number == 1 && *bytes >= 3 && memcmp(*line, "\xEF\xBB\xBF", 3) == 0) {
    *line += 3;
    *bytes -= 3;
  }
}

static const char *input_name(const io_instance *s) {
  return s->source->paths[s->source->is_stdin ? 0 : s->in->file_index];
}

/* A malformed line: set it aside, or fail the job. */
static int malformed(sl_ctx *ctx, io_instance *s, uint64_t number,
                     const char *reason, const char *line, size_t bytes) {
  if (!s->dead.path) {
    sl_ctx_fail(ctx, "file %s line %" PRIu64 ": %s", input_name(s), number,
                reason);
    return EINVAL;
  }
  int rc = io_dead_letter_write(ctx, &s->dead, input_name(s), number, reason,
                             line, bytes);
  if (rc == 0)
    sl_ctx_count(ctx, SL_COUNT_DEAD_LETTER, 1);
  return rc;
}

/* Read a CSV header (line number of the file); a bad one fails the job
 * even with dead letters. */
static int read_header(sl_ctx *ctx, io_instance *s, uint64_t number,
                       const char *line, size_t bytes) {
  char reason[IO_REASON_BYTES];
  int rc = bytes == 0 ? (snprintf(reason, sizeof reason, "the CSV header "
                                  "line is empty"), IO_MALFORMED)
                      : io_parse_header(&s->in->parser, line, bytes, reason,
                                        sizeof reason);
  if (rc == IO_MALFORMED) {
    sl_ctx_fail(ctx, "file %s line %" PRIu64 ": %s", input_name(s), number,
                reason);
    return EINVAL;
  }
  if (rc)
    sl_ctx_fail(ctx, "file %s line %" PRIu64 ": out of memory",
                input_name(s), number);
  return rc;
}

/* One line from io_reader_next(): header, record, skipped or malformed.
 * *count grows by the records added to the batch. */
static int handle_line(sl_ctx *ctx, io_instance *s, int status,
                       const char *line, size_t bytes, uint32_t *count) {
  input *in = s->in;
  uint64_t number = in->line++;
  strip_bom(number, &line, &bytes);
  char reason[IO_REASON_BYTES];
  if (status == IO_LINE_TOO_LONG) {
    snprintf(reason, sizeof reason, "line longer than %" PRIu32 " bytes",
             in->reader.max_line_bytes);
    if (io_parser_wants_header(&in->parser)) { /* the file is unreadable */
      sl_ctx_fail(ctx, "file %s line %" PRIu64 ": CSV header %s",
                  input_name(s), number, reason);
      return EINVAL;
    }
    return malformed(ctx, s, number, reason, line, bytes);
  }
  if (io_parser_wants_header(&in->parser))
    return read_header(ctx, s, number, line, bytes);
  if (bytes == 0)
    return 0; /* empty lines are skipped */
  uint32_t record_bytes = s->source->schema->public_schema.record_bytes;
  int rc = io_parse_line(&in->parser, line, bytes,
                         s->batch + (size_t)*count * record_bytes,
                         &s->timestamps[*count], reason, sizeof reason);
  if (rc == IO_PARSED) {
    (*count)++;
    return 0;
  }
  if (rc == IO_MALFORMED)
    return malformed(ctx, s, number, reason, line, bytes);
  sl_ctx_fail(ctx, "file %s line %" PRIu64 ": out of memory", input_name(s),
              number);
  return rc; /* ENOMEM */
}

/* Emit the batch: in runs without timestamps, one by one with them. */
static int emit_batch(sl_ctx *ctx, const io_instance *s, uint32_t count) {
  const io_schema *schema = s->source->schema;
  uint32_t record_bytes = schema->public_schema.record_bytes;
  if (count == 0)
    return 0;
  if (schema->timestamp_index < 0)
    return sl_emit_batch(ctx, s->batch, record_bytes, count);
  for (uint32_t i = 0; i < count; i++) {
    int rc = sl_emit_ts(ctx, s->batch + (size_t)i * record_bytes,
                        record_bytes, s->timestamps[i]);
    if (rc)
      return rc;
  }
  return 0;
}

/* Note 4.  Reads lines until the batch is full, a bound is reached, the
 * input ends or (stdin) nothing comes; then emits the batch. */
static int io_next(sl_ctx *ctx, void *state) {
  io_instance *s = state;
  input *in = s->in;
  const io_source *src = s->source;
  uint32_t count = 0;
  uint64_t bytes_taken = 0;
  bool end = false;
  for (uint32_t lines = 0; count < s->batch_capacity &&
                           lines < IO_LINES_PER_CALL &&
                           bytes_taken < IO_BYTES_PER_CALL;
       lines++) {
    if (!src->is_stdin && in->reader.fd < 0) {
      if (in->file_index == src->path_count) {
        end = true;
        break;
      }
      int rc = open_file(ctx, s);
      if (rc)
        return rc;
    }
    const char *line = 0;
    size_t bytes = 0;
    uint64_t offset = in->reader.offset;
    int status = io_reader_next(&in->reader, &line, &bytes);
    bytes_taken += in->reader.offset - offset;
    if (status < 0) {
      sl_ctx_fail(ctx, "file %s: read error after line %" PRIu64 ": %s",
                  input_name(s), in->line - 1, strerror(-status));
      return status;
    }
    if (status == IO_LINE_WAIT)
      break;
    if (status == IO_LINE_END) {
      if (src->is_stdin) {
        end = true;
        break;
      }
      close_file(in);
      in->file_index++;
      in->line = 1;
      continue;
    }
    if (status == IO_LINE_SKIPPED)
      continue;
    int rc = handle_line(ctx, s, status, line, bytes, &count);
    if (rc)
      return rc;
  }
  int rc = emit_batch(ctx, s, count);
  if (rc)
    return rc;
  return end ? SL_SOURCE_END : 0;
}

/* ------------------------------------------------------------ checkpoints */

/* The position (position_word; notes 2, 3, 5, 6). */
static int io_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  io_instance *s = state;
  int rc = io_dead_letter_sync(ctx, &s->dead);
  if (rc || s->source->is_stdin)
    return rc; /* stdin: no position (not replayable) */
  const input *in = s->in;
  bool open = in->reader.fd >= 0;
  io_identity identity = {0};
  if (open && (rc = io_identity_take(in->reader.fd, in->reader.offset,
                                     &identity)) != 0) {
    sl_ctx_fail(ctx, "checkpoint %" PRIu64 ": input file %s %s: %s", id,
                input_name(s), rc == ENODATA ? "was truncated below the "
                "position while it was read" : "cannot be read",
                strerror(rc));
    return rc;
  }
  uint64_t words[POSITION_WORDS] = {
      [P_VERSION] = POSITION_VERSION,
      [P_FILE] = (uint64_t)in->file_index,
      [P_OFFSET] = open ? in->reader.offset : 0,
      [P_LINE] = open ? in->line : 1,
      [P_DEAD_BYTES] = s->dead.bytes,
      [P_PATH_HASH] = in->file_index < s->source->path_count
                          ? path_hash(s->source->paths[in->file_index])
                          : 0,
      [P_SKIPPING] = open && in->reader.skipping,
      [P_KIND] = identity.kind,
      [P_DEVICE] = identity.device,
      [P_INODE] = identity.inode,
      [P_SIZE] = identity.size_bytes,
      [P_HEAD_HASH] = identity.head_hash,
      [P_TAIL_HASH] = identity.tail_hash};
  assert(words[P_FILE] <= (uint64_t)s->source->path_count);
  assert(!open || words[P_OFFSET] == 0 || identity.kind != IO_IDENTITY_NONE);
  return sl_operator_state_set(ctx, words, sizeof words);
}

/* Rebuild a CSV header's column map from line 1 of the open file (note
 * 6).  Leaves the reader to be reset by the caller. */
static int reread_header(sl_ctx *ctx, io_instance *s) {
  input *in = s->in;
  if (lseek(in->reader.fd, 0, SEEK_SET) != 0)
    return io_fail_errno(ctx, errno, "cannot seek in file", input_name(s));
  io_reader_reset(&in->reader, 0, false);
  const char *line = 0;
  size_t bytes = 0;
  int status = io_reader_next(&in->reader, &line, &bytes);
  if (status < 0)
    return io_fail_errno(ctx, -status, "cannot read file", input_name(s));
  if (status != IO_LINE_READY) {
    sl_ctx_fail(ctx, "file %s line 1: no CSV header to restore from",
                input_name(s));
    return EINVAL;
  }
  strip_bom(1, &line, &bytes);
  return read_header(ctx, s, 1, line, bytes);
}

/* Is the open file the one the position was taken in (note 6)? */
static int check_identity(sl_ctx *ctx, io_instance *s, uint64_t id,
                          const uint64_t *words) {
  const io_identity saved = {.kind = words[P_KIND],
                             .device = words[P_DEVICE],
                             .inode = words[P_INODE],
                             .size_bytes = words[P_SIZE],
                             .head_hash = words[P_HEAD_HASH],
                             .tail_hash = words[P_TAIL_HASH]};
  char why[SL_ERROR_BYTES / 2];
  int rc = io_identity_check(s->in->reader.fd, words[P_OFFSET], &saved, why,
                             sizeof why);
  if (rc == EINVAL) {
    sl_ctx_fail(ctx, "checkpoint %" PRIu64 ": input file %s %s; it cannot "
                "be resumed from there (the position is line %" PRIu64
                ", byte %" PRIu64 ")", id, input_name(s), why,
                words[P_LINE], words[P_OFFSET]);
    return EINVAL;
  }
  if (rc)
    return io_fail_errno(ctx, rc, "cannot read file", input_name(s));
  return 0;
}

/* Open the saved file, check it and seek to the saved offset. */
static int seek_to(sl_ctx *ctx, io_instance *s, uint64_t id,
                   const uint64_t *words) {
  input *in = s->in;
  int rc = open_file(ctx, s);
  if (rc == 0)
    rc = check_identity(ctx, s, id, words);
  if (rc)
    return rc;
  uint64_t offset = words[P_OFFSET];
  if (offset > 0 && io_parser_wants_header(&in->parser)) {
    rc = reread_header(ctx, s);
    if (rc)
      return rc;
  }
  if (offset > 0 && lseek(in->reader.fd, (off_t)offset, SEEK_SET) < 0)
    return io_fail_errno(ctx, errno, "cannot seek in file", input_name(s));
  io_reader_reset(&in->reader, offset, words[P_SKIPPING] != 0);
  in->line = words[P_LINE];
  return 0;
}

/* The saved position into words, in the current layout: a version 1
 * position gets identity kind NONE (note 6).  Returns 0, SL_ENOTFOUND
 * (none saved) or -EINVAL with the instance failed. */
static int read_position(sl_ctx *ctx, io_instance *s, uint64_t id,
                         uint64_t *words) {
  const void *data = 0;
  uint32_t bytes = 0;
  int rc = sl_operator_state_get(ctx, &data, &bytes);
  if (rc)
    return rc;
  memset(words, 0, sizeof(uint64_t) * POSITION_WORDS);
  if (bytes == sizeof(uint64_t) * POSITION_WORDS_V1) {
    memcpy(words + P_FILE, data, bytes); /* the same order, shifted by one */
    words[P_VERSION] = 1;
    if (words[P_OFFSET] > 0)
      sl_log(SL_LOG_WARN, "checkpoint %" PRIu64 ": a file source position "
             "of the older format (version 1, at file #%" PRIu64 " of the list "
             "that begins %s): the input is checked for its path and length "
             "only, not its identity", id, words[P_FILE],
             s->source->paths[0]);
    return 0;
  }
  /* The version word if there is one, then the rest if the size fits. */
  memcpy(words, data, bytes < sizeof(uint64_t) * POSITION_WORDS
                          ? (bytes >= 8 ? 8 : 0)
                          : sizeof(uint64_t) * POSITION_WORDS);
  if (bytes != sizeof(uint64_t) * POSITION_WORDS ||
      words[P_VERSION] != POSITION_VERSION) {
    sl_ctx_fail(ctx, "checkpoint %" PRIu64 ": the file source position is "
                "%" PRIu32 " bytes of version %" PRIu64 ", a format this "
                "build does not read (version %d, or 1)", id, bytes,
                words[P_VERSION], POSITION_VERSION);
    return EINVAL;
  }
  return 0;
}

static int io_restore(sl_ctx *ctx, void *state, uint64_t id) {
  io_instance *s = state;
  const io_source *src = s->source;
  uint64_t words[POSITION_WORDS];
  int rc = read_position(ctx, s, id, words);
  if (rc == SL_ENOTFOUND) /* from the beginning */
    return io_dead_letter_truncate(ctx, &s->dead, id, 0);
  if (rc)
    return rc;
  /* The hash of the path being read; 0 once every file was read. */
  uint64_t file = words[P_FILE];
  if (file > (uint64_t)src->path_count ||
      words[P_PATH_HASH] != (file < (uint64_t)src->path_count
                                 ? path_hash(src->paths[file])
                                 : 0)) {
    sl_ctx_fail(ctx, "checkpoint %" PRIu64 " was taken reading file #%"
                PRIu64 " of another file list (now %d files, #%" PRIu64
                " being %s)", id, file, src->path_count, file,
                file < (uint64_t)src->path_count ? src->paths[file]
                                                 : "past the end");
    return EINVAL;
  }
  rc = io_dead_letter_truncate(ctx, &s->dead, id, words[P_DEAD_BYTES]);
  if (rc)
    return rc;
  close_file(s->in);
  s->in->file_index = (int)file;
  if (s->in->file_index == src->path_count)
    return 0; /* every file was read */
  return seek_to(ctx, s, id, words);
}

/* ------------------------------------------------------------ lifecycle */

static void io_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  io_instance *s = state;
  if (!s->source->is_stdin) {
    close_file(&s->own);
    input_free(&s->own);
  }
  io_dead_letter_close(&s->dead);
  free(s->batch);
  free(s->timestamps);
  free(s);
}

static int io_open(sl_ctx *ctx, void *user, void **state) {
  io_source *src = user;
  io_instance *s = calloc(1, sizeof *s);
  if (!s)
    return ENOMEM;
  s->source = src;
  uint32_t record_bytes = src->schema->public_schema.record_bytes;
  s->batch_capacity = IO_BATCH_BYTES / record_bytes;
  if (s->batch_capacity > IO_RECORDS_PER_CALL)
    s->batch_capacity = IO_RECORDS_PER_CALL;
  if (s->batch_capacity == 0)
    s->batch_capacity = 1;
  s->batch = malloc((size_t)s->batch_capacity * record_bytes);
  s->timestamps = malloc(sizeof *s->timestamps * s->batch_capacity);
  int rc = s->batch && s->timestamps ? 0 : ENOMEM;
  if (rc == 0 && src->is_stdin && !src->stdin_input.ready) {
    rc = input_init(&src->stdin_input, src);
    if (rc == 0) {
      src->stdin_input.reader.fd = STDIN_FILENO;
      src->stdin_input.reader.poll_first = true;
    }
  } else if (rc == 0 && !src->is_stdin) {
    rc = input_init(&s->own, src);
  }
  if (rc) {
    free(s->batch);
    free(s->timestamps);
    free(s);
    sl_ctx_fail(ctx, "out of memory");
    return rc;
  }
  s->in = src->is_stdin ? &src->stdin_input : &s->own;
  s->dead.path = src->dead_letter_path;
  /* Note 5: a file source with nothing to restore starts its dead letters
   * afresh; a restore truncates them to the checkpoint's length. */
  rc = io_dead_letter_open(ctx, &s->dead,
                        !src->is_stdin && ctx->cp.restored_from == 0);
  if (rc) {
    io_close(ctx, s);
    return rc;
  }
  *state = s;
  return 0;
}

/* ------------------------------------------------------------ builders */

static int refuse(sl_job *job, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int refuse(sl_job *job, const char *name, const char *fmt, ...) {
  char what[SL_ERROR_BYTES - 64];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  sl_job_set_error(job, "operator '%s': %s", name ? name : "(null)", what);
  return EINVAL;
}

/* Checks shared by both sources; on success *out holds a new io_source
 * with the schema copied. */
static int make_source(sl_job *job, const char *name, int format,
                       const sl_schema *schema, const char *dead_letter_path,
                       io_source **out) {
  *out = 0;
  if (format != SL_FORMAT_JSONL && format != SL_FORMAT_CSV &&
      format != SL_FORMAT_CSV_HEADER)
    return refuse(job, name, "unknown format %d", format);
  if (dead_letter_path &&
      (!dead_letter_path[0] || strlen(dead_letter_path) >= IO_PATH_BYTES))
    return refuse(job, name, "dead_letter_path is empty or longer than %d "
                  "bytes", IO_PATH_BYTES - 1);
  io_source *src = calloc(1, sizeof *src);
  if (!src)
    return ENOMEM;
  char err[256];
  int rc = io_schema_copy(schema, &src->schema, err, sizeof err);
  if (rc) {
    free(src);
    return rc == EINVAL ? refuse(job, name, "schema: %s", err) : rc;
  }
  if (schema->record_bytes > job->config.max_record_bytes) {
    io_source_free(src);
    return refuse(job, name, "schema record_bytes %" PRIu32 " is over the "
                  "job's max_record_bytes %" PRIu32, schema->record_bytes,
                  job->config.max_record_bytes);
  }
  src->format = format;
  src->delimiter = ',';
  src->max_line_bytes = SL_IO_DEFAULT_MAX_LINE_BYTES;
  if (dead_letter_path && !(src->dead_letter_path = strdup(dead_letter_path))) {
    io_source_free(src);
    return ENOMEM;
  }
  *out = src;
  return 0;
}

/* Add the operator; on failure the source is freed. */
static int add_source(sl_job *job, const char *name, io_source *src,
                      sl_op **op) {
  static const sl_source_ops file_ops = {.open = io_open,
                                         .next = io_next,
                                         .close = io_close,
                                         .snapshot = io_snapshot,
                                         .restore = io_restore};
  /* No restore: not replayable.  The snapshot hook only syncs the
   * dead-letter file. */
  static const sl_source_ops stdin_ops = {.open = io_open,
                                          .next = io_next,
                                          .close = io_close,
                                          .snapshot = io_snapshot};
  int rc = sl_op_source(job, name, 1, src->is_stdin ? &stdin_ops : &file_ops,
                        src, op);
  return op_adopt(rc, op, src, io_source_free);
}

/* The config checks of the file source.  Returns 0 or refuse()'s EINVAL. */
static int check_file_config(sl_job *job, const char *name,
                             const sl_file_source_config *c) {
  if (!c)
    return refuse(job, name, "file source config is NULL");
  if (!c->paths || c->path_count < 1 ||
      c->path_count > SL_FILE_SOURCE_MAX_PATHS)
    return refuse(job, name, "file source needs 1..%d paths (has %d)",
                  SL_FILE_SOURCE_MAX_PATHS, c->path_count);
  for (int i = 0; i < c->path_count; i++)
    if (!c->paths[i] || !c->paths[i][0] ||
        strlen(c->paths[i]) >= IO_PATH_BYTES)
      return refuse(job, name, "path %d is NULL, empty or longer than %d "
                    "bytes", i, IO_PATH_BYTES - 1);
  char d = c->csv_delimiter;
  if (d == '"' || d == '\r' || d == '\n')
    return refuse(job, name, "csv_delimiter cannot be a quote or a line "
                  "break");
  if (c->max_line_bytes > IO_MAX_LINE_BYTES)
    return refuse(job, name, "max_line_bytes %" PRIu32 " is over %u",
                  c->max_line_bytes, IO_MAX_LINE_BYTES);
  return 0;
}

SL_EXPORT int sl_source_file_sized(sl_job *job, const char *name,
                                   const sl_file_source_config *c, sl_op **op,
                                   size_t config_bytes) {
  if (!job || !op)
    return EINVAL;
  sl_file_source_config copy;
  if (SL_CONFIG_READ(job, sl_source_file, sl_file_source_config,
                     SL_FILE_SOURCE_CONFIG_V1, c, config_bytes, &copy))
    return EINVAL;
  if (c)
    c = &copy;
  if (atomic_load(&job->state) != SL_JOB_BUILDING)
    return SL_ESTARTED;
  int rc = check_file_config(job, name, c);
  if (rc)
    return rc;
  io_source *src;
  rc = make_source(job, name, c->format,
                   c->schema, c->dead_letter_path, &src);
  if (rc)
    return rc;
  src->delimiter = c->csv_delimiter ? c->csv_delimiter : ',';
  if (c->max_line_bytes)
    src->max_line_bytes = c->max_line_bytes;
  src->paths = calloc((size_t)c->path_count, sizeof *src->paths);
  if (!src->paths) {
    io_source_free(src);
    return ENOMEM;
  }
  for (int i = 0; i < c->path_count; i++) {
    if (!(src->paths[i] = strdup(c->paths[i]))) {
      src->path_count = i;
      io_source_free(src);
      return ENOMEM;
    }
  }
  src->path_count = c->path_count;
  return add_source(job, name, src, op);
}

SL_EXPORT int sl_source_stdin(sl_job *job, const char *name, int format,
                              const sl_schema *schema,
                              const char *dead_letter_path, sl_op **op) {
  if (!job || !op)
    return EINVAL;
  if (atomic_load(&job->state) != SL_JOB_BUILDING)
    return SL_ESTARTED;
  io_source *src;
  int rc = make_source(job, name, format, schema, dead_letter_path, &src);
  if (rc)
    return rc;
  src->is_stdin = true;
  src->paths = calloc(1, sizeof *src->paths);
  if (!src->paths || !(src->paths[0] = strdup(IO_STDIN_NAME))) {
    io_source_free(src);
    return ENOMEM;
  }
  src->path_count = 1;
  return add_source(job, name, src, op);
}

/* The version-1 symbol (config_abi.c note 1): a program linked before the
 * sized call existed passed a version-1 struct. */
SL_EXPORT int(sl_source_file)(sl_job *job, const char *name,
                              const sl_file_source_config *config,
                              sl_op **op) {
  return sl_source_file_sized(job, name, config, op, SL_FILE_SOURCE_CONFIG_V1);
}
