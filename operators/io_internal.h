/* io_internal.h — what the CSV / JSON lines sources share inside
 * operators/: the owned copy of a schema and text conversions of single
 * values (io_schema.c), the line parser (io_parse.c), and the line reader
 * and dead-letter file (io_reader.c). */
#ifndef SL_IO_INTERNAL_H
#define SL_IO_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <csv.h>

#include "sluice.h"

#define IO_REASON_BYTES 256 /* a malformed line's reason, with NUL */
#define IO_MAX_COLUMNS 4096 /* columns of a CSV header */

/* A validated schema copied with everything it points to (io_schema.c). */
typedef struct io_schema {
  sl_schema public_schema; /* fields and timestamp_field point below */
  sl_field *fields;
  int timestamp_index; /* -1: no timestamp field */
  char *names;         /* every name, NUL-terminated, back to back */
} io_schema;

/* Validate schema and copy it.  Returns 0, EINVAL (err says why) or
 * ENOMEM; *copy is NULL on error. */
int io_schema_copy(const sl_schema *schema, io_schema **copy, char *err,
                   size_t err_bytes);
void io_schema_free(io_schema *schema);

/* Text to one field value (CSV cells and header-less text).  text holds
 * bytes bytes followed by a NUL.  Returns 0, or 1 with reason set. */
int io_field_from_text(const sl_field *field, const char *text, size_t bytes,
                       void *record, char *reason, size_t reason_bytes);

/* What io_parse_line() reports. */
enum io_parse_result {
  IO_PARSED = 0,    /* the record is filled in */
  IO_MALFORMED = 1, /* reason says why */
};

/* One line parser: a format, a schema and, for CSV, libcsv's parser and
 * the column -> field map.  Not thread-safe: one per source instance. */
typedef struct io_parser {
  const io_schema *schema;
  int format;     /* enum sl_format */
  char delimiter; /* CSV */
  struct csv_parser csv;
  bool csv_ready; /* csv is initialised */
  int *column_field;  /* CSV: column -> field index or -1 */
  int column_count;   /* CSV: columns a row must have */
  bool header_known;  /* CSV_HEADER: the current file's header was read */
  /* Row being parsed by the libcsv callbacks. */
  uint8_t *record;
  int column;        /* next column index of the row */
  int rows;          /* rows libcsv reported in the line */
  int row_columns;   /* columns of the first row */
  bool failed;       /* a field could not be converted */
  int failed_column; /* which one */
  char *reason;
  size_t reason_bytes;
  /* Header being read. */
  char **header_names;
  int header_count;
  bool header_overflow;
  bool out_of_memory;
} io_parser;

/* Set up a parser for format (enum sl_format) and schema (kept, not
 * copied), CSV delimiter delimiter.  Returns 0 or ENOMEM. */
int io_parser_init(io_parser *parser, const io_schema *schema, int format,
                   char delimiter);
void io_parser_free(io_parser *parser);

/* Does the format expect a header line as line 1 of each file?  After
 * io_parser_new_file() it does again. */
bool io_parser_wants_header(const io_parser *parser);
void io_parser_new_file(io_parser *parser);

/* Read a CSV header line and map its columns to fields.  Returns 0, 1
 * (IO_MALFORMED: reason says why; the file cannot be read) or ENOMEM. */
int io_parse_header(io_parser *parser, const char *line, size_t bytes,
                    char *reason, size_t reason_bytes);

/* Parse one line (without its newline; not empty) into record
 * (schema->record_bytes, zeroed first) and its timestamp (SL_NO_TIMESTAMP
 * without a timestamp field).  Returns IO_PARSED, IO_MALFORMED (reason
 * says why) or ENOMEM. */
int io_parse_line(io_parser *parser, const char *line, size_t bytes,
                  void *record, int64_t *timestamp, char *reason,
                  size_t reason_bytes);

/* ------------------------------------------------------------ io_reader.c */

#define IO_READ_BYTES (1u << 20) /* reader buffer room beyond a line */
#define IO_STDIN_WAIT_MS 100     /* longest wait for standard input */

/* A buffered line reader over a file descriptor (io_reader.c notes). */
typedef struct io_reader {
  int fd;          /* -1: no input open */
  bool poll_first; /* standard input: wait for input with a bound */
  bool eof;
  bool skipping;   /* inside an over-long line */
  char *buffer;
  size_t capacity;
  size_t begin, end; /* unread bytes: buffer[begin .. end) */
  uint64_t offset;   /* input offset of buffer[begin] */
  uint32_t max_line_bytes;
} io_reader;

enum io_line_status {
  IO_LINE_END = 0,      /* end of input */
  IO_LINE_READY = 1,    /* a whole line */
  IO_LINE_TOO_LONG = 2, /* the start of an over-long line */
  IO_LINE_WAIT = 3,     /* standard input: nothing arrived in time */
  IO_LINE_SKIPPED = 4,  /* discarded part of an over-long line; call again */
};

/* Allocate the buffer (fd stays -1).  Returns 0 or ENOMEM. */
int io_reader_init(io_reader *reader, uint32_t max_line_bytes);
void io_reader_free(io_reader *reader);
/* Forget buffered bytes: the next read is at offset of the input, which
 * the caller has seeked to; skipping as saved with the position. */
void io_reader_reset(io_reader *reader, uint64_t offset, bool skipping);
/* The next line, without its '\n' and a '\r' before it.  Returns an
 * io_line_status (*line and *bytes are set for IO_LINE_READY and
 * IO_LINE_TOO_LONG, valid until the next call) or -errno. */
int io_reader_next(io_reader *reader, const char **line, size_t *bytes);

/* The dead-letter file: one line "PATH\tLINE\tREASON\tTEXT" per malformed
 * line.  path NULL: none (every call is then a no-op, except write). */
typedef struct io_dead_letter {
  const char *path;
  FILE *file;
  uint64_t bytes; /* length of the file, buffered bytes included */
  bool dirty;     /* written since the last sync */
} io_dead_letter;

/* sl_ctx_fail("WHAT PATH: strerror(e)"), then e (EIO for e == 0). */
int io_fail_errno(sl_ctx *ctx, int e, const char *what, const char *path);
/* Open (creating) for appending; empty it first if empty is set.  Returns
 * 0 or -errno with the instance failed. */
int io_dead_letter_open(sl_ctx *ctx, io_dead_letter *d, bool empty);
/* Flush and fdatasync what was written since the last sync. */
int io_dead_letter_sync(sl_ctx *ctx, io_dead_letter *d);
/* Cut the file back to length, its length at checkpoint id; fails
 * (EINVAL) if it is shorter. */
int io_dead_letter_truncate(sl_ctx *ctx, io_dead_letter *d, uint64_t id,
                            uint64_t length);
/* Append one entry (tabs and line breaks of path and reason as spaces). */
int io_dead_letter_write(sl_ctx *ctx, io_dead_letter *d, const char *path,
                         uint64_t number, const char *reason,
                         const char *text, size_t bytes);
/* Flush, sync if needed and close; errors are ignored (the end). */
void io_dead_letter_close(io_dead_letter *d);

/* ------------------------------------------------------------ identity */

/* What a file source's position says about the input it was taken in
 * (io_reader.c note 6): enough to tell, at a restore, that the bytes
 * before the position are still the bytes that were read. */
#define IO_IDENTITY_BYTES 4096u /* hashed at each end of the consumed prefix */

enum io_identity_kind {
  IO_IDENTITY_NONE = 0,    /* nothing consumed, or an old position: unknown */
  IO_IDENTITY_REGULAR = 1, /* a regular file: the fields below are set */
  IO_IDENTITY_STREAM = 2,  /* a pipe, FIFO, socket or device: not re-readable */
};

typedef struct io_identity {
  uint64_t kind; /* enum io_identity_kind */
  uint64_t device, inode;
  uint64_t size_bytes; /* the file's size when the position was taken */
  uint64_t head_hash;  /* XXH3 of bytes [0, min(offset, IO_IDENTITY_BYTES)) */
  uint64_t tail_hash;  /* ... of the last IO_IDENTITY_BYTES before offset */
} io_identity;

/* The identity of the file open on fd, whose first offset bytes were
 * consumed.  Offset 0 gives IO_IDENTITY_NONE (nothing to check later).
 * Returns 0 or an errno (ENODATA: the file is now shorter than offset). */
int io_identity_take(int fd, uint64_t offset, io_identity *identity);

/* Is the file open on fd still the one saved read up to offset?  Returns
 * 0, or EINVAL with why set to the end of a sentence that starts with the
 * file's name ("was replaced: ..."), or an errno of reading it.  A file
 * that grew past offset is the same file: logs grow by appending. */
int io_identity_check(int fd, uint64_t offset, const io_identity *saved,
                      char *why, size_t why_bytes);

/* Open path for reading without blocking on a FIFO that has no writer
 * yet.  A regular file is then set back to blocking reads; for anything
 * else *stream is set and the reader must poll (io_reader note 4).
 * Returns the descriptor or -errno. */
int io_open_input(const char *path, bool *stream);

#endif /* SL_IO_INTERNAL_H */
