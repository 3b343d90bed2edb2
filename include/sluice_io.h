/* sluice_io.h — file and stdin sources, CSV and JSON lines formats, stdout
 * sink (operators/io_*.c, file_source.c, stdout_sink.c).  Included by
 * sluice.h.
 *
 * OVERVIEW
 *
 * A record schema (sl_schema) describes a C struct field by field.  The file
 * and stdin sources parse each line of text (CSV or JSON lines) into one
 * such fixed-layout binary record and emit it; the formatters
 * sl_format_csv() and sl_format_jsonl() turn a record back into a line for
 * the file sink (sl_sink_file) or the stdout sink (sl_sink_stdout).
 *
 *     typedef struct trade {
 *       int64_t time_ms;
 *       char symbol[8];   // up to 7 bytes, always NUL-terminated
 *       double price;
 *       int32_t quantity;
 *     } trade;
 *     static const sl_field trade_fields[] = {
 *         SL_FIELD(trade, time_ms, SL_FIELD_INT64),
 *         SL_FIELD(trade, symbol, SL_FIELD_STRING),
 *         SL_FIELD(trade, price, SL_FIELD_DOUBLE),
 *         SL_FIELD(trade, quantity, SL_FIELD_INT32)};
 *     static const sl_schema trade_schema = {
 *         trade_fields, 4, sizeof(trade), "time_ms"};
 *     const char *paths[] = {"day1.jsonl", "day2.jsonl"};
 *     sl_file_source_config in = {.paths = paths, .path_count = 2,
 *                                 .format = SL_FORMAT_JSONL,
 *                                 .schema = &trade_schema,
 *                                 .dead_letter_path = "bad-lines.tsv"};
 *     sl_source_file(job, "trades", &in, &src);
 *     sl_file_sink_config out = {.dir = "out", .exactly_once = 1,
 *                                .format = sl_format_csv,
 *                                .format_user = (void *)&trade_schema};
 *     sl_sink_file(job, "csv", src, 1, &out, &sink);
 *
 * LINES AND MALFORMED INPUT
 *
 * Input is read line by line ('\n'; a '\r' before it is dropped, so CRLF
 * files work; a UTF-8 byte order mark opening a file is skipped).  An
 * empty line is skipped (it still counts for line numbers); every other
 * line must be exactly one record.  A line that cannot be turned into a
 * record is malformed; the reason is one of:
 *   - JSON lines: a JSON syntax error (jansson's message and column), not
 *     an object, a duplicate key, a missing field (unless SL_FIELD_OPTIONAL),
 *     null for a field that is not optional, a value of the wrong type.
 *     Fields the schema does not name are ignored.
 *   - CSV: a syntax error (a quote inside an unquoted field, text after a
 *     closing quote), an unterminated quote, a column count other than the
 *     expected one (the header's, or the schema's field count), an empty
 *     numeric or boolean field (unless SL_FIELD_OPTIONAL), a bad number.
 *     A quoted field may hold the delimiter and doubled quotes ("") but not
 *     a line break: one line is one record.  Spaces are kept: " 7" is not
 *     an integer, " ab" is a three-byte string.
 *   - Both: a string longer than its field (size - 1 bytes; never
 *     truncated), an integer out of its type's range, a timestamp field
 *     holding INT64_MIN (which is SL_NO_TIMESTAMP), a line longer than
 *     max_line_bytes.
 * Value rules: integers must be integers (a JSON integer, not 3.0; in CSV
 * an optional sign and decimal digits, nothing else); doubles take
 * integers too, but not NaN or infinities (JSON has neither) and in CSV
 * only decimal notation ([+-]digits[.digits][e[+-]digits]); booleans are
 * JSON true/false, in CSV true, false, 1 or 0.
 *
 * Without a dead-letter file, a malformed line fails the job with the
 * message "file PATH line N: REASON" (sl_job_error()).  With one, the line
 * is appended to the dead-letter file as one line
 *     PATH<TAB>N<TAB>REASON<TAB>THE-LINE-AS-READ
 * (tabs and line breaks in PATH and REASON are written as spaces, so
 * `cut -f4-` gives the bad lines back), counted with SL_COUNT_DEAD_LETTER
 * (sl_op_stats.dead_letters) and skipped; an over-long line is written
 * truncated to max_line_bytes.  A CSV header (SL_FORMAT_CSV_HEADER: line 1
 * of each file) that is empty, malformed or over-long, lacks a column the
 * schema needs or names one twice fails the job even with a dead-letter
 * file: no line of that file could be read.
 *
 * CAVEATS
 *
 * - The sources have parallelism 1: one thread reads and parses the files
 *   one after another (about 1.5 us a JSON line, 0.2 us a CSV line of five
 *   fields), so parsing does not scale with cores.
 * - The dead-letter file of a file source is exact: it is flushed and
 *   fsync'd at each checkpoint, a restore truncates it to its length at
 *   the restored checkpoint (the replay writes the later entries again),
 *   and a start that restores no checkpoint empties it.  So it belongs to
 *   the job: do not share one between jobs.
 * - Doubles are written in the fewest significant digits (15, 16 or 17)
 *   that read back as the same double, so CSV and JSON output round-trips
 *   exactly; in a JSON line the precision is the largest any double field
 *   of the record needs (jansson takes one precision per document).
 * - sl_format_jsonl() needs string fields to be valid UTF-8 (JSON text
 *   is); a record with invalid UTF-8 fails the sink with EILSEQ.  CSV input
 *   is not checked for UTF-8, so CSV to CSV passes any bytes through.
 * - The formatters write no header line themselves: give the text of
 *   sl_format_csv_header() to the file sink as sl_file_sink_config.header
 *   and every file starts with it.
 */
#ifndef SLUICE_IO_H
#define SLUICE_IO_H

#include <stddef.h>
#include <stdint.h>

#include "sluice.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Replayable sources and file sinks (operators/sources.c, file_sink.c). */

/** A source (parallelism 1) of count records of record_bytes each, stored
 * back to back at records, which must outlive the job.  Replayable:
 * position = records emitted.  Errors: EINVAL, as the builders. */
int sl_source_memory(sl_job *job, const char *name, const void *records,
                     uint32_t record_bytes, uint64_t count, sl_op **op);

/** A source (parallelism 1) of the lines of the file at path, each emitted
 * without its newline.  Replayable: position = byte offset.  A line longer
 * than max_record_bytes fails the job naming the file and line number.
 * Errors: EINVAL (path NULL or over 4095 bytes), as the builders. */
int sl_source_lines(sl_job *job, const char *name, const char *path,
                    sl_op **op);

/** Formats one record as text for a file sink: writes at most buffer_bytes
 * bytes (no newline; the sink adds it) and returns the length.  A return
 * above buffer_bytes asks to be called again with a buffer that large;
 * negative fails the job. */
typedef int (*sl_format_fn)(void *user, const sl_record *in, char *buffer,
                            uint32_t buffer_bytes);

typedef struct sl_file_sink_config {
  const char *dir;        /* created if missing */
  /** 1: transactional (exactly-once): output goes to hidden pending part
   * files, renamed to part-K-SEQ<suffix> when the checkpoint that covers
   * them completes; after a resume, output past the restored checkpoint is
   * deleted and written again by the replay.  0: plain (at-least-once):
   * appends to out-K<suffix>, flushed at each checkpoint; after a resume
   * the records since the restored checkpoint appear twice. */
  int exactly_once;
  sl_format_fn format;    /* NULL: the record's bytes as they are */
  void *format_user;
  const char *suffix;     /* file name suffix; NULL: ".txt" */
  /** A first line for every file (e.g. a CSV header, from
   * sl_format_csv_header()); NULL: none.  At most 4095 bytes, no newline.
   * Each committed part starts with it, and a plain out file gets it when
   * it is created (not when appended to). */
  const char *header;
  /** Transactional sink, a start with nothing to restore: 1 deletes the
   * committed parts of another job lineage in dir (see below) and claims
   * it; 0 (default) refuses them: the job fails with EEXIST and a
   * message naming dir and a file.  Set it for a start that means to
   * replace what dir holds (the CLI's --fresh, or a run that checkpoints
   * nowhere and so can never be resumed). */
  int clear_other_lineage;
} sl_file_sink_config;

/** A file sink writing one line per record.  Committed files of instance K
 * are named part-K-SEQ<suffix> (SEQ zero-padded, increasing), so reading
 * them in name order gives the instance's output in order.
 *
 * A transactional sink's dir belongs to one job lineage: the run that
 * started with nothing to restore and every run resumed from its
 * checkpoints (resume, failover, savepoint).  The lineage id is random, in
 * dir/.sluice-lineage and in the sink's checkpointed state.  A start with
 * nothing to restore accepts dir if its marker names the same lineage (an
 * in-process restart before the first checkpoint) or if it holds no
 * committed part (part-*); it then deletes every pending part in dir (no
 * checkpoint of its lineage refers to them) and writes the marker.
 * Another lineage's committed parts: see clear_other_lineage.  A restore refuses
 * (EEXIST) a dir whose marker names another lineage, and one holding
 * a committed part of an instance past the restored checkpoint (output of
 * a run that went on from it, as the job a savepoint was taken of); a
 * missing marker is written.  A commit never replaces an existing file: a
 * target that exists fails the job (EEXIST, naming it).  The plain sink
 * claims nothing (it appends).  Errors: EINVAL (no dir, or over 4095
 * bytes; a header too long or with a newline), as the builders. */
int sl_sink_file(sl_job *job, const char *name, sl_op *input, int parallelism,
                 const sl_file_sink_config *config, sl_op **op);
int sl_sink_file_sized(sl_job *job, const char *name, sl_op *input,
                       int parallelism, const sl_file_sink_config *config,
                       sl_op **op, size_t config_bytes);
#define sl_sink_file(...)                                                      \
  sl_sink_file_sized(__VA_ARGS__, sizeof(sl_file_sink_config))

/* ------------------------------------------------------------------------ */
/* Record schemas (operators/io_schema.c). */

/** Field types, with the C type and size each one requires. */
enum sl_field_type {
  SL_FIELD_INT64 = 1,  /* int64_t, 8 bytes */
  SL_FIELD_INT32 = 2,  /* int32_t, 4 bytes */
  SL_FIELD_DOUBLE = 3, /* double, 8 bytes */
  SL_FIELD_BOOL = 4,   /* bool or uint8_t, 1 byte, holding 0 or 1 */
  SL_FIELD_STRING = 5, /* char[size]: at most size - 1 bytes, then NUL
                          bytes to the end of the field */
};

/** Field flags. */
enum sl_field_flag {
  /** A JSON line may omit the field or give null; a CSV header may lack its
   * column, and an empty CSV field is accepted.  The value is then zero
   * (the empty string, false). */
  SL_FIELD_OPTIONAL = 1,
};

/** One field of a record: its name in the text (JSON key or CSV header
 * column), its type, where it is in the struct and its size in bytes. */
typedef struct sl_field {
  const char *name;
  int type;        /* enum sl_field_type */
  uint32_t offset; /* offsetof(struct, member) */
  uint32_t size;   /* sizeof member */
  uint32_t flags;  /* enum sl_field_flag, or 0 */
} sl_field;

/** The usual way to describe a member: its name, offset and size. */
#define SL_FIELD(struct_type, member, field_type)                            \
  {#member, (field_type), (uint32_t)offsetof(struct_type, member),           \
   (uint32_t)sizeof(((struct_type *)0)->member), 0}
#define SL_FIELD_OPT(struct_type, member, field_type)                        \
  {#member, (field_type), (uint32_t)offsetof(struct_type, member),           \
   (uint32_t)sizeof(((struct_type *)0)->member), SL_FIELD_OPTIONAL}

#define SL_SCHEMA_MAX_FIELDS 1024 /* fields of one schema */
#define SL_SCHEMA_MAX_NAME 255    /* bytes of a field name, without NUL */

/** A record layout.  Bytes no field covers (padding) are zero in parsed
 * records.  Field order is the CSV column order (without a header) and the
 * order of output columns and JSON keys. */
typedef struct sl_schema {
  const sl_field *fields;
  int field_count;             /* 1 .. SL_SCHEMA_MAX_FIELDS */
  uint32_t record_bytes;       /* sizeof the struct */
  const char *timestamp_field; /* an SL_FIELD_INT64 field whose value is the
                                  record's timestamp; NULL: records have
                                  none (SL_NO_TIMESTAMP) */
} sl_schema;

/** Check a schema: 1 .. SL_SCHEMA_MAX_FIELDS fields; each with a name of
 * 1 .. SL_SCHEMA_MAX_NAME bytes, unique, without tab, CR, LF or NUL; a known
 * type and its size (a string at least 1 byte); inside record_bytes; no
 * two fields overlapping; known flags; timestamp_field, if set, naming an
 * SL_FIELD_INT64 field.  Returns 0, or EINVAL with the first problem in
 * err (err_bytes > 0; err may be NULL) such as
 * "field 2 (\"price\") overlaps field 1 (\"symbol\")". */
int sl_schema_validate(const sl_schema *schema, char *err, size_t err_bytes);

/* ------------------------------------------------------------------------ */
/* Formats. */

enum sl_format {
  SL_FORMAT_JSONL = 1,      /* one JSON object per line */
  SL_FORMAT_CSV = 2,        /* columns in schema field order, no header */
  SL_FORMAT_CSV_HEADER = 3, /* the first line names the columns; fields
                               are matched by name, in any order, and
                               columns the schema does not name are
                               ignored */
};

/** sl_format_fn for a record of the schema passed as user (a const
 * sl_schema *, which must outlive the job): one CSV line with the fields in
 * schema order, separated by ','.  A string is quoted (quotes doubled) when
 * it holds ',', '"', '\r' or '\n'; integers in decimal; doubles as
 * described above (NaN and infinities as printf writes them, "nan", "inf",
 * which the CSV reader refuses); booleans true/false.  Returns the length,
 * or -EINVAL if user is NULL or the record's size is not
 * schema->record_bytes.  Not checked: the schema (validate it first). */
int sl_format_csv(void *user, const sl_record *in, char *buffer,
                  uint32_t buffer_bytes);

/** sl_format_fn: one JSON object per line, keys in schema order, built and
 * escaped by jansson (compact: no spaces; a double always has a '.' or an
 * exponent, so it reads back as a double).  Returns the length, -EINVAL
 * (record size), -EILSEQ (a string field or a field name that is not valid
 * UTF-8), -EDOM (a NaN or infinite double: JSON has none) or -ENOMEM. */
int sl_format_jsonl(void *user, const sl_record *in, char *buffer,
                    uint32_t buffer_bytes);

/** The CSV header line for schema (field names, quoted where needed), in
 * the sl_format_fn convention: writes at most buffer_bytes bytes and
 * returns the full length. */
int sl_format_csv_header(const sl_schema *schema, char *buffer,
                         uint32_t buffer_bytes);

/* ------------------------------------------------------------------------ */
/* Sources (operators/file_source.c). */

#define SL_FILE_SOURCE_MAX_PATHS 65536
#define SL_IO_DEFAULT_MAX_LINE_BYTES (1u << 20)

typedef struct sl_file_source_config {
  /** Files read one after another, in this order; each path below 4096
   * bytes.  The strings are copied. */
  const char *const *paths;
  int path_count; /* 1 .. SL_FILE_SOURCE_MAX_PATHS */
  int format;     /* enum sl_format */
  /** Copied, field names too. */
  const sl_schema *schema;
  /** CSV field delimiter; 0: ','.  Not '"', '\r' or '\n'. */
  char csv_delimiter;
  /** NULL: a malformed line fails the job.  Else the dead-letter file
   * (created if missing; see above). */
  const char *dead_letter_path;
  /** Longest line accepted, without its newline; 0: 1 MiB, at most
   * 256 MiB. */
  uint32_t max_line_bytes;
} sl_file_source_config;

/** A source (parallelism 1) that reads the files of config in order and
 * emits one record of schema->record_bytes per line, with the timestamp
 * taken from schema->timestamp_field (or none).
 *
 * Replayable: a checkpoint saves the file index, the byte offset and line
 * number of the next line, and the dead-letter file's length; a restore
 * seeks there (and truncates the dead-letter file), so with an exactly-once
 * sink the output equals that of an uninterrupted run.  The files must not
 * change between a checkpoint and a restore: a restore fails if the file
 * list changed (each path's hash is checked) or a file is now shorter than
 * the saved offset.
 *
 * A file that cannot be opened or read fails the job naming it.
 *
 * Errors: EINVAL (config NULL, no paths, a path NULL or too long, unknown
 * format, bad delimiter, max_line_bytes out of range, an invalid schema,
 * record_bytes over the job's max_record_bytes; sl_job_error() says
 * which), ENOMEM, as the builders. */
int sl_source_file(sl_job *job, const char *name,
                   const sl_file_source_config *config, sl_op **op);
int sl_source_file_sized(sl_job *job, const char *name,
                         const sl_file_source_config *config, sl_op **op,
                         size_t config_bytes);
#define sl_source_file(...)                                                    \
  sl_source_file_sized(__VA_ARGS__, sizeof(sl_file_source_config))

/** A source (parallelism 1) reading standard input the same way (a CSV
 * delimiter of ',', lines up to 1 MiB, messages name the file "<stdin>").
 * It waits for input at most 100 ms per call, so a stop and checkpoints
 * are not held up by a quiet pipe; it ends at end of file.
 *
 * NOT replayable.  A checkpoint saves no position (it only flushes the
 * dead-letter file), so after a failover restart or a resume from a state
 * directory the source simply goes on reading standard input: lines that
 * were read before the failure are not read again, and the records emitted
 * after the restored checkpoint are lost downstream, even with an
 * exactly-once sink.  Output is at-most-once for the input read before a
 * failure; a run without failures emits every line once.  (Unread input
 * still in the source's buffer survives an in-process restart.)  The
 * dead-letter file is appended to, never truncated.
 *
 * Use one per process: two would share one input.
 *
 * Errors: EINVAL (format, schema, record_bytes, dead_letter_path too
 * long), ENOMEM, as the builders. */
int sl_source_stdin(sl_job *job, const char *name, int format,
                    const sl_schema *schema, const char *dead_letter_path,
                    sl_op **op);

/* ------------------------------------------------------------------------ */
/* Standard output (operators/stdout_sink.c). */

/** A sink (parallelism 1) writing one line per record to standard output:
 * format(format_user, ...) as for the file sink (NULL: the record's bytes
 * as they are), then '\n'.  Output goes through a 64 KiB buffer, written
 * with write(2) when full, at each checkpoint, at the end of input and when
 * the job stops; after every record when standard output is a terminal.
 * Anything the program itself printed with stdio is flushed first, so the
 * two do not interleave mid-line.
 *
 * Not transactional: what was written stays written.  After a resume, the
 * records since the restored checkpoint are written again (at-least-once
 * with a replayable source).  A write error (EPIPE with SIGPIPE ignored,
 * ENOSPC, ...) fails the job; with SIGPIPE at its default a closed pipe
 * kills the process, as for any program.
 *
 * Errors: as the builders. */
int sl_sink_stdout(sl_job *job, const char *name, sl_op *input,
                   sl_format_fn format, void *format_user, sl_op **op);

#ifdef __cplusplus
}
#endif
#endif /* SLUICE_IO_H */
