/* io_reader.c — the line reader and the dead-letter file of the CSV /
 * JSON lines sources (file_source.c).
 *
 * NOTES
 *
 * 1. The reader holds one buffer of max_line_bytes + IO_READ_BYTES, filled
 *    by read(2) in large reads; lines are cut out of it with memchr and
 *    handed out in place (no copy).  Since a line that fits has at most
 *    max_line_bytes bytes, there is always room to read after moving the
 *    unread tail to the front.
 * 2. The reader's offset is that of the first byte not yet consumed, i.e.
 *    the start of the next line; bytes read ahead into the buffer do not
 *    count.  That offset is what a source saves as its position.
 * 3. An over-long line is handed out once (IO_LINE_TOO_LONG, its first
 *    max_line_bytes bytes); the rest of it is then discarded up to its
 *    '\n' (`skipping`), in pieces (IO_LINE_SKIPPED) so the caller keeps its
 *    per-call bound.  Skipping can outlive a call and a checkpoint, so the
 *    flag is part of the position.
 * 4. Standard input, and a file that is a FIFO or device (poll_first):
 *    before each read the reader waits at most IO_STDIN_WAIT_MS for input
 *    and reports IO_LINE_WAIT if none came (or a non-blocking read found
 *    nothing), so the source can return and let the engine stop or
 *    checkpoint.  Such a file is opened with O_NONBLOCK (io_open_input):
 *    open(2) of a FIFO without a writer would otherwise block for as long
 *    as no writer comes, out of reach of sl_job_stop().  Until a writer
 *    comes, poll(2) reports nothing (Linux reports POLLHUP only once a
 *    writer has come and gone), so the wait is the same bounded wait.
 * 5. The dead-letter file counts its own length (what was written, not
 *    ftell(), which an append stream reports from 0 until its first
 *    flush), so a snapshot can save it and a restore can cut the file back
 *    to it.
 * 6. Identity of the input (io_identity_take, io_identity_check).  A
 *    position is only meaningful over the bytes it was taken in.  With it
 *    a file source saves the file's device and inode and the XXH3 hashes
 *    of the first and the last IO_IDENTITY_BYTES before the offset, read
 *    again with pread(2) at the snapshot (two reads of at most 4 KiB per
 *    checkpoint, off the record path).  A restore refuses, naming what
 *    changed: a file that is not a regular file (its bytes cannot be read
 *    again), another inode or device (the file was replaced, even by an
 *    equal copy), a file now shorter than the offset (truncated below the
 *    position), and other bytes at either end of the consumed prefix.
 *    Bytes after the offset may differ or be new: appending is how logs
 *    grow.  The bound has a price: an edit in place strictly between the
 *    first and the last 4 KiB of a large consumed prefix, keeping the
 *    inode and the length, goes unnoticed.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io_internal.h"

_Static_assert(IO_READ_BYTES > 0, "the buffer has room beyond a line");

/* ------------------------------------------------------------ reader */

int io_reader_init(io_reader *r, uint32_t max_line_bytes) {
  memset(r, 0, sizeof *r);
  r->fd = -1;
  r->max_line_bytes = max_line_bytes;
  r->capacity = (size_t)max_line_bytes + IO_READ_BYTES;
  r->buffer = malloc(r->capacity);
  return r->buffer ? 0 : ENOMEM;
}

void io_reader_free(io_reader *r) {
  free(r->buffer);
  r->buffer = 0;
}

void io_reader_reset(io_reader *r, uint64_t offset, bool skipping) {
  r->begin = r->end = 0;
  r->offset = offset;
  r->eof = false;
  r->skipping = skipping;
}

/* Consume n bytes of the buffer. */
static void reader_take(io_reader *r, size_t n) {
  assert(n <= r->end - r->begin);
  r->begin += n;
  r->offset += n;
}

/* Move the unread bytes to the front and read more.  Returns 0,
 * IO_LINE_WAIT (note 4) or -errno. */
static int reader_fill(io_reader *r) {
  if (r->begin) {
    memmove(r->buffer, r->buffer + r->begin, r->end - r->begin);
    r->end -= r->begin;
    r->begin = 0;
  }
  assert(r->end < r->capacity); /* note 1 */
  if (r->poll_first) {
    struct pollfd p = {.fd = r->fd, .events = POLLIN};
    int ready = poll(&p, 1, IO_STDIN_WAIT_MS);
    if (ready == 0 || (ready < 0 && errno == EINTR))
      return IO_LINE_WAIT;
    if (ready < 0)
      return -errno;
  }
  for (;;) {
    ssize_t got = read(r->fd, r->buffer + r->end, r->capacity - r->end);
    if (got > 0) {
      r->end += (size_t)got;
      return 0;
    }
    if (got == 0) {
      r->eof = true;
      return 0;
    }
    if (r->poll_first && (errno == EAGAIN || errno == EWOULDBLOCK))
      return IO_LINE_WAIT; /* note 4: a non-blocking input had nothing */
    if (errno != EINTR)
      return -errno;
  }
}

int io_reader_next(io_reader *r, const char **line, size_t *bytes) {
  /* Each pass consumes input or reads more, so the loop ends with the
   * input. */
  for (;;) {
    size_t unread = r->end - r->begin;
    char *start = r->buffer + r->begin;
    char *newline = unread ? memchr(start, '\n', unread) : 0;
    if (r->skipping) { /* note 3 */
      size_t drop = newline ? (size_t)(newline - start) + 1 : unread;
      reader_take(r, drop);
      r->skipping = !newline && !r->eof;
      if (drop)
        return IO_LINE_SKIPPED;
    } else if (newline || unread > r->max_line_bytes || (r->eof && unread)) {
      size_t length = newline ? (size_t)(newline - start) : unread;
      reader_take(r, newline ? length + 1 : length);
      *line = start;
      if (length > r->max_line_bytes) {
        *bytes = r->max_line_bytes;
        r->skipping = !newline && !r->eof;
        return IO_LINE_TOO_LONG;
      }
      if (length && start[length - 1] == '\r')
        length--;
      *bytes = length;
      return IO_LINE_READY;
    } else if (r->eof) {
      return IO_LINE_END;
    }
    int rc = reader_fill(r);
    if (rc)
      return rc;
  }
}

/* ------------------------------------------------------------ inputs */

int io_open_input(const char *path, bool *stream) {
  *stream = false;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* note 4 */
  if (fd < 0)
    return -errno;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  if (!S_ISREG(st.st_mode)) {
    *stream = true; /* stays non-blocking: the reader polls */
    return fd;
  }
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  return fd;
}

/* ------------------------------------------------------------ identity */

/* XXH3 of bytes [from, to) of fd (note 6).  Returns 0, ENODATA if the
 * file ends before to, or an errno. */
static int hash_range(int fd, uint64_t from, uint64_t to, uint64_t *hash) {
  char bytes[IO_IDENTITY_BYTES];
  assert(to >= from);
  size_t want = (size_t)(to - from);
  assert(want <= sizeof bytes);
  size_t got = 0;
  /* Each pass reads at least one byte or returns; EINTR retries. */
  while (got < want) {
    ssize_t n = pread(fd, bytes + got, want - got, (off_t)(from + got));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return errno;
    if (n == 0)
      return ENODATA;
    got += (size_t)n;
  }
  *hash = sl_hash_bytes(bytes, want);
  return 0;
}

static uint64_t head_end(uint64_t offset) {
  return offset < IO_IDENTITY_BYTES ? offset : IO_IDENTITY_BYTES;
}

static uint64_t tail_start(uint64_t offset) {
  return offset > IO_IDENTITY_BYTES ? offset - IO_IDENTITY_BYTES : 0;
}

int io_identity_take(int fd, uint64_t offset, io_identity *identity) {
  memset(identity, 0, sizeof *identity);
  if (offset == 0)
    return 0; /* nothing consumed: any file will do at a restore */
  struct stat st;
  if (fstat(fd, &st) != 0)
    return errno;
  if (!S_ISREG(st.st_mode)) {
    identity->kind = IO_IDENTITY_STREAM;
    return 0;
  }
  identity->kind = IO_IDENTITY_REGULAR;
  identity->device = (uint64_t)st.st_dev;
  identity->inode = (uint64_t)st.st_ino;
  identity->size_bytes = (uint64_t)st.st_size;
  int rc = hash_range(fd, 0, head_end(offset), &identity->head_hash);
  if (rc == 0)
    rc = hash_range(fd, tail_start(offset), offset, &identity->tail_hash);
  return rc;
}

int io_identity_check(int fd, uint64_t offset, const io_identity *saved,
                      char *why, size_t why_bytes) {
  struct stat st;
  if (offset == 0)
    return 0; /* nothing was consumed */
  if (fstat(fd, &st) != 0)
    return errno;
  if (!S_ISREG(st.st_mode) || saved->kind == IO_IDENTITY_STREAM) {
    snprintf(why, why_bytes, "is not a regular file (a pipe, FIFO or "
             "device): the %" PRIu64 " bytes read before the checkpoint "
             "cannot be read again", offset);
    return EINVAL;
  }
  if (saved->kind == IO_IDENTITY_REGULAR &&
      (saved->device != (uint64_t)st.st_dev ||
       saved->inode != (uint64_t)st.st_ino)) {
    snprintf(why, why_bytes, "was replaced: it is now inode %" PRIu64
             " on device %" PRIu64 ", the checkpoint read inode %" PRIu64
             " on device %" PRIu64, (uint64_t)st.st_ino, (uint64_t)st.st_dev,
             saved->inode, saved->device);
    return EINVAL;
  }
  if ((uint64_t)st.st_size < offset) {
    snprintf(why, why_bytes, "was truncated below the checkpointed position: "
             "it is %" PRIu64 " bytes, the position is byte %" PRIu64,
             (uint64_t)st.st_size, offset);
    return EINVAL;
  }
  if (saved->kind != IO_IDENTITY_REGULAR)
    return 0; /* an old position: no more to compare (file_source note 6) */
  io_identity now;
  int rc = io_identity_take(fd, offset, &now);
  if (rc == ENODATA) { /* truncated between fstat() and the reads */
    snprintf(why, why_bytes, "was truncated below the checkpointed position "
             "(byte %" PRIu64 ") while it was being checked", offset);
    return EINVAL;
  }
  if (rc)
    return rc;
  if (now.head_hash != saved->head_hash || now.tail_hash != saved->tail_hash) {
    bool head = now.head_hash != saved->head_hash;
    snprintf(why, why_bytes, "changed before the checkpointed position "
             "(byte %" PRIu64 "): its %s %" PRIu64 " bytes differ from those "
             "read", offset, head ? "first" : "last",
             head ? head_end(offset) : offset - tail_start(offset));
    return EINVAL;
  }
  return 0;
}

/* ------------------------------------------------------------ dead letters */

int io_fail_errno(sl_ctx *ctx, int e, const char *what, const char *path) {
  if (e == 0)
    e = EIO; /* a failure without errno (a short write) is still one */
  sl_ctx_fail(ctx, "%s %s: %s", what, path, strerror(e));
  return e; /* the errno itself (sluice.h, CALLBACK RETURNS) */
}

int io_dead_letter_open(sl_ctx *ctx, io_dead_letter *d, bool empty) {
  if (!d->path)
    return 0;
  int fd = open(d->path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
  if (fd < 0)
    return io_fail_errno(ctx, errno, "cannot open dead-letter file", d->path);
  struct stat st;
  if ((empty && ftruncate(fd, 0) != 0) || fstat(fd, &st) != 0 ||
      !(d->file = fdopen(fd, "a"))) {
    int e = errno;
    close(fd);
    return io_fail_errno(ctx, e, "cannot open dead-letter file", d->path);
  }
  d->bytes = (uint64_t)st.st_size;
  d->dirty = false;
  return 0;
}

int io_dead_letter_sync(sl_ctx *ctx, io_dead_letter *d) {
  if (!d->file || !d->dirty)
    return 0;
  if (fflush(d->file) != 0 || fdatasync(fileno(d->file)) != 0)
    return io_fail_errno(ctx, errno, "cannot write dead-letter file",
                         d->path);
  d->dirty = false;
  return 0;
}

int io_dead_letter_truncate(sl_ctx *ctx, io_dead_letter *d, uint64_t id,
                            uint64_t length) {
  if (!d->file)
    return 0;
  struct stat st;
  if (fflush(d->file) != 0 || fstat(fileno(d->file), &st) != 0)
    return io_fail_errno(ctx, errno, "cannot read dead-letter file",
                         d->path);
  if ((uint64_t)st.st_size < length) {
    sl_ctx_fail(ctx, "dead-letter file %s holds %" PRIu64 " bytes, fewer "
                "than the %" PRIu64 " it held at checkpoint %" PRIu64
                ": it was changed outside the job", d->path,
                (uint64_t)st.st_size, length, id);
    return EINVAL;
  }
  if (ftruncate(fileno(d->file), (off_t)length) != 0)
    return io_fail_errno(ctx, errno, "cannot truncate dead-letter file",
                         d->path);
  d->bytes = length;
  d->dirty = true;
  return 0;
}

/* text with tabs and line breaks as spaces: one column of the entry.
 * Returns the bytes written. */
static size_t put_column(FILE *f, const char *text) {
  size_t n = 0;
  for (; text[n]; n++)
    putc(text[n] == '\t' || text[n] == '\r' || text[n] == '\n' ? ' '
                                                              : text[n],
         f);
  return n;
}

int io_dead_letter_write(sl_ctx *ctx, io_dead_letter *d, const char *path,
                         uint64_t number, const char *reason,
                         const char *text, size_t bytes) {
  assert(d->file);
  size_t written = put_column(d->file, path);
  int n = fprintf(d->file, "\t%" PRIu64 "\t", number);
  written += n > 0 ? (size_t)n : 0;
  written += put_column(d->file, reason);
  putc('\t', d->file);
  written += 1 + fwrite(text, 1, bytes, d->file);
  putc('\n', d->file);
  written++;
  if (ferror(d->file) || n < 0)
    return io_fail_errno(ctx, errno, "cannot write dead-letter file",
                         d->path);
  d->bytes += written; /* note 5 */
  d->dirty = true;
  return 0;
}

void io_dead_letter_close(io_dead_letter *d) {
  if (!d->file)
    return;
  fflush(d->file);
  if (d->dirty)
    fdatasync(fileno(d->file));
  fclose(d->file);
  d->file = 0;
}
