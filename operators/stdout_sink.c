/* stdout_sink.c — a sink writing one formatted line per record to standard
 * output.
 *
 * NOTES
 *
 * 1. Parallelism 1: one writer, so lines never interleave and keep the
 *    order in which the instance received them.
 * 2. Lines are formatted straight into a STDOUT_BUFFER_BYTES buffer and
 *    leave with write(2) when it is full, at each checkpoint (snapshot
 *    hook), at the end of input (finish) and in close (a stop or a
 *    failure); after every record when standard output is a terminal, so
 *    an interactive user sees each line at once.  A line larger than the
 *    buffer is formatted into a buffer of its own and written directly.
 * 3. stdio's stdout is flushed before each write, so what the program
 *    printed through stdio before the records comes out before them.
 * 4. Not transactional: nothing written can be taken back, so there is no
 *    restore hook; after a resume the replayed records are written again.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "op_util.h"

#define STDOUT_BUFFER_BYTES (64u * 1024u)

typedef struct stdout_sink {
  sl_format_fn format; /* NULL: the record's bytes */
  void *format_user;
} stdout_sink;

typedef struct stdout_instance {
  const stdout_sink *sink;
  char buffer[STDOUT_BUFFER_BYTES];
  size_t used;
  char *line; /* a line larger than the buffer (note 2) */
  uint32_t line_bytes;
  bool terminal;
} stdout_instance;

/* Write all n bytes to standard output.  Returns 0 or an errno. */
static int write_all(const char *data, size_t n) {
  while (n) {
    ssize_t done = write(STDOUT_FILENO, data, n);
    if (done < 0 && errno == EINTR)
      continue;
    if (done <= 0)
      return done < 0 ? errno : EIO;
    data += done;
    n -= (size_t)done;
  }
  return 0;
}

static int fail_write(sl_ctx *ctx, int e) {
  sl_ctx_fail(ctx, "cannot write to standard output: %s", strerror(e));
  return e; /* the errno itself (sluice.h, CALLBACK RETURNS) */
}

/* Write the buffer out (note 3).  Returns 0 or an errno (job failed). */
static int flush_buffer(sl_ctx *ctx, stdout_instance *s) {
  if (s->used == 0)
    return 0;
  fflush(stdout);
  int e = write_all(s->buffer, s->used);
  s->used = 0;
  return e ? fail_write(ctx, e) : 0;
}

/* Format into dest (room bytes); the length, which may exceed room. */
static int format_into(sl_ctx *ctx, const stdout_sink *sink,
                       const sl_record *in, char *dest, size_t room) {
  if (!sink->format) {
    if (in->size_bytes <= room)
      memcpy(dest, in->data, in->size_bytes);
    return in->size_bytes > INT32_MAX ? -EOVERFLOW : (int)in->size_bytes;
  }
  int n = sink->format(sink->format_user, in, dest,
                       (uint32_t)(room > UINT32_MAX ? UINT32_MAX : room));
  if (n < 0)
    sl_ctx_fail(ctx, "format function failed: %s", sl_strerror(-n));
  return n;
}

/* A line too large for the buffer: its own buffer, written directly. */
static int write_large(sl_ctx *ctx, stdout_instance *s, const sl_record *in,
                       int n) {
  int rc = flush_buffer(ctx, s);
  if (rc)
    return rc;
  if ((uint32_t)n + 1 > s->line_bytes) {
    char *bigger = realloc(s->line, (size_t)n + 1);
    if (!bigger) {
      sl_ctx_fail(ctx, "out of memory for a line of %d bytes", n);
      return ENOMEM;
    }
    s->line = bigger;
    s->line_bytes = (uint32_t)n + 1;
  }
  int again = format_into(ctx, s->sink, in, s->line, (size_t)n);
  if (again < 0)
    return again;
  if (again != n) {
    sl_ctx_fail(ctx, "format function gave %d bytes, then %d", n, again);
    return EINVAL;
  }
  s->line[n] = '\n';
  fflush(stdout);
  int e = write_all(s->line, (size_t)n + 1);
  return e ? fail_write(ctx, e) : 0;
}

static int stdout_process(sl_ctx *ctx, void *state, int input,
                          const sl_record *in) {
  (void)input;
  stdout_instance *s = state;
  for (int attempt = 0; attempt < 2; attempt++) { /* then with a flush */
    size_t room = STDOUT_BUFFER_BYTES - s->used;
    int n = format_into(ctx, s->sink, in, s->buffer + s->used, room);
    if (n < 0)
      return n;
    if ((size_t)n + 1 <= room) {
      s->used += (size_t)n;
      s->buffer[s->used++] = '\n';
      return s->terminal ? flush_buffer(ctx, s) : 0;
    }
    if ((size_t)n + 1 > STDOUT_BUFFER_BYTES)
      return write_large(ctx, s, in, n);
    int rc = flush_buffer(ctx, s);
    if (rc)
      return rc;
  }
  /* An empty buffer had room for n + 1 bytes, yet the line did not fit:
   * the format function gave two different lengths. */
  sl_ctx_fail(ctx, "format function gave different lengths for one record");
  return EINVAL;
}

static int stdout_open(sl_ctx *ctx, void *user, void **state) {
  (void)ctx;
  stdout_instance *s = calloc(1, sizeof *s);
  if (!s)
    return ENOMEM;
  s->sink = user;
  s->terminal = isatty(STDOUT_FILENO) == 1;
  *state = s;
  return 0;
}

static int stdout_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  return flush_buffer(ctx, state);
}

static int stdout_finish(sl_ctx *ctx, void *state) {
  return flush_buffer(ctx, state);
}

static void stdout_close(sl_ctx *ctx, void *state) {
  stdout_instance *s = state;
  /* A stop or a failure: write what was formatted (at-least-once).  An
   * error can no longer fail the job; the job is ending anyway. */
  if (s->used) {
    fflush(stdout);
    (void)write_all(s->buffer, s->used);
  }
  (void)ctx;
  free(s->line);
  free(s);
}

SL_EXPORT int sl_sink_stdout(sl_job *job, const char *name, sl_op *input,
                             sl_format_fn format, void *format_user,
                             sl_op **op) {
  stdout_sink *sink = calloc(1, sizeof *sink);
  if (!sink)
    return ENOMEM;
  sink->format = format;
  sink->format_user = format_user;
  static const sl_process_ops ops = {.open = stdout_open,
                                     .process = stdout_process,
                                     .finish = stdout_finish,
                                     .close = stdout_close,
                                     .snapshot = stdout_snapshot};
  int rc = sl_op_sink(job, name, input, 1, &ops, sink, op);
  return op_adopt(rc, op, sink, free);
}
