/* sources.c — replayable built-in sources: records from memory, and lines
 * of a file (position = byte offset). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "op_util.h"

/* Records emitted per next() call (see builtin.c). */
#define SOURCE_RECORDS_PER_CALL 1024u

/* Save an 8-byte position; restore it (0 if none was saved). */
static int save_position(sl_ctx *ctx, uint64_t position) {
  return sl_operator_state_set(ctx, &position, sizeof position);
}

/* The operator state restored for checkpoint id as `count` 64-bit words
 * (internal.h).  A state of another size fails the instance with a
 * message naming `what`. */
int sl_operator_state_words(sl_ctx *ctx, uint64_t id, const char *what,
                            uint64_t *words, uint32_t count) {
  const void *data;
  uint32_t bytes;
  int rc = sl_operator_state_get(ctx, &data, &bytes);
  if (rc)
    return rc; /* SL_ENOTFOUND: nothing was saved */
  if (bytes != count * 8u) {
    sl_ctx_fail(ctx, "checkpoint %" PRIu64 ": saved %s is %" PRIu32
                " bytes, not %" PRIu32, id, what, bytes, count * 8u);
    return EINVAL;
  }
  memcpy(words, data, bytes);
  return 0;
}

static int load_position(sl_ctx *ctx, uint64_t id, uint64_t *position) {
  int rc = sl_operator_state_words(ctx, id, "position", position, 1);
  if (rc == SL_ENOTFOUND) {
    *position = 0;
    return 0;
  }
  return rc;
}

/* ------------------------------------------------------------ memory */

typedef struct memory_source {
  const uint8_t *records;
  uint32_t record_bytes;
  uint64_t count;
  uint64_t next; /* parallelism is 1: one instance, one cursor */
} memory_source;

/* The cursor lives in the operator's data (parallelism 1), so each start,
 * a restart after a failure too, sets it back to the beginning; restore
 * then moves it to the checkpoint's position. */
static int memory_open(sl_ctx *ctx, void *user, void **state) {
  (void)ctx;
  memory_source *m = user;
  m->next = 0;
  *state = m;
  return 0;
}

static int memory_next(sl_ctx *ctx, void *state) {
  memory_source *m = state;
  uint64_t left = m->count - m->next;
  uint32_t n = left < SOURCE_RECORDS_PER_CALL ? (uint32_t)left
                                              : SOURCE_RECORDS_PER_CALL;
  int rc = sl_emit_batch(ctx, m->records + m->next * m->record_bytes,
                         m->record_bytes, n);
  if (rc)
    return rc;
  m->next += n;
  return m->next == m->count ? SL_SOURCE_END : 0;
}

static int memory_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  return save_position(ctx, ((memory_source *)state)->next);
}

static int memory_restore(sl_ctx *ctx, void *state, uint64_t id) {
  memory_source *m = state;
  uint64_t position;
  int rc = load_position(ctx, id, &position);
  if (rc)
    return rc;
  if (position > m->count) {
    sl_ctx_fail(ctx, "checkpoint %" PRIu64 ": position %" PRIu64
                " is past the %" PRIu64 " records", id, position, m->count);
    return EINVAL;
  }
  m->next = position;
  return 0;
}

SL_EXPORT int sl_source_memory(sl_job *job, const char *name,
                               const void *records, uint32_t record_bytes,
                               uint64_t count, sl_op **op) {
  if (!records && count)
    return EINVAL;
  if (record_bytes == 0)
    return EINVAL;
  memory_source *m = calloc(1, sizeof *m);
  if (!m)
    return ENOMEM;
  m->records = records;
  m->record_bytes = record_bytes;
  m->count = count;
  static const sl_source_ops ops = {.open = memory_open,
                                    .next = memory_next,
                                    .snapshot = memory_snapshot,
                                    .restore = memory_restore};
  int rc = sl_op_source(job, name, 1, &ops, m, op);
  return op_adopt(rc, op, m, free);
}

/* ------------------------------------------------------------ lines */

typedef struct lines_source {
  char path[4096];
} lines_source;

typedef struct lines_instance {
  FILE *file;
  const char *path;
  uint64_t offset; /* byte offset of the next line */
  uint64_t line;   /* number of the next line, from 1 */
  char *buffer;
  size_t buffer_bytes;
} lines_instance;

static int lines_open(sl_ctx *ctx, void *user, void **state) {
  const lines_source *src = user;
  lines_instance *l = calloc(1, sizeof *l);
  if (!l)
    return ENOMEM;
  l->path = src->path;
  l->line = 1;
  l->file = fopen(src->path, "rb");
  if (!l->file) {
    int e = errno;
    sl_ctx_fail(ctx, "cannot open %s: %s", src->path, strerror(e));
    free(l);
    return -e;
  }
  *state = l;
  return 0;
}

static int lines_next(sl_ctx *ctx, void *state) {
  lines_instance *l = state;
  for (uint32_t i = 0; i < SOURCE_RECORDS_PER_CALL; i++) {
    ssize_t got = getline(&l->buffer, &l->buffer_bytes, l->file);
    if (got < 0) {
      if (ferror(l->file)) {
        sl_ctx_fail(ctx, "%s: read error after line %" PRIu64, l->path,
                    l->line - 1);
        return EIO;
      }
      return SL_SOURCE_END;
    }
    l->offset += (uint64_t)got;
    size_t bytes = (size_t)got;
    if (bytes && l->buffer[bytes - 1] == '\n')
      bytes--;
    int rc = sl_emit(ctx, l->buffer, (uint32_t)(bytes > UINT32_MAX ? UINT32_MAX : bytes));
    if (rc == SL_ETOOBIG)
      sl_ctx_fail(ctx, "%s:%" PRIu64 ": line of %zu bytes is over "
                  "max_record_bytes", l->path, l->line, bytes);
    if (rc)
      return rc;
    l->line++;
  }
  return 0;
}

/* Position: the byte offset and the line number (for messages). */
static int lines_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  const lines_instance *l = state;
  uint64_t position[2] = {l->offset, l->line};
  return sl_operator_state_set(ctx, position, sizeof position);
}

static int lines_restore(sl_ctx *ctx, void *state, uint64_t id) {
  lines_instance *l = state;
  uint64_t position[2];
  int rc = sl_operator_state_words(ctx, id, "file position", position, 2);
  if (rc == SL_ENOTFOUND)
    return 0;
  if (rc)
    return rc;
  if (fseeko(l->file, (off_t)position[0], SEEK_SET) != 0) {
    int e = errno;
    sl_ctx_fail(ctx, "%s: cannot seek to byte %" PRIu64 ": %s", l->path,
                position[0], strerror(e));
    return -e;
  }
  l->offset = position[0];
  l->line = position[1];
  return 0;
}

static void lines_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  lines_instance *l = state;
  fclose(l->file);
  free(l->buffer);
  free(l);
}

SL_EXPORT int sl_source_lines(sl_job *job, const char *name, const char *path,
                              sl_op **op) {
  if (!path || strlen(path) >= sizeof(((lines_source *)0)->path))
    return EINVAL;
  lines_source *src = calloc(1, sizeof *src);
  if (!src)
    return ENOMEM;
  strcpy(src->path, path);
  static const sl_source_ops ops = {.open = lines_open,
                                    .next = lines_next,
                                    .close = lines_close,
                                    .snapshot = lines_snapshot,
                                    .restore = lines_restore};
  int rc = sl_op_source(job, name, 1, &ops, src, op);
  return op_adopt(rc, op, src, free);
}
