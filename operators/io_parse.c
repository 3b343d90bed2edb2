/* io_parse.c — one line of CSV or JSON lines text into one fixed-layout
 * record of a schema (the parsing path shared by the file and stdin
 * sources).
 *
 * NOTES
 *
 * 1. The unit is one line: the caller splits the input at '\n' and hands
 *    each non-empty line over on its own.  So a malformed line can never
 *    swallow the next one, and the reason always belongs to one line
 *    number.  For CSV this means a quoted field cannot hold a line break;
 *    libcsv's strict end check (CSV_STRICT_FINI) reports the open quote.
 * 2. JSON: jansson parses the line into a tree (json_loadb, duplicate keys
 *    refused); each schema field is then looked up by name.  Keys the schema
 *    does not name are ignored.
 * 3. CSV: libcsv (strict) splits the line and calls on_cell() per cell;
 *    each cell is converted straight into the record through the column ->
 *    field map (the identity without a header, else built by
 *    io_parse_header() from each file's first line).  Spaces are not
 *    trimmed.  A wrong column count is the reason given even if a cell
 *    also failed to convert: with columns shifted, the cell errors mean
 *    nothing.
 * 4. After a syntax error libcsv's state is mid-row, so the parser is
 *    freed and initialised again (csv_restart); that happens only for
 *    malformed lines.
 * 5. The record is zeroed before each line, so padding and optional fields
 *    that are absent are zero, and a malformed line leaves no old values.
 * 6. A JSON line must be well-formed UTF-8 (utf8_check.h, the rule the
 *    Nexmark parser uses too); CSV text is taken as bytes.
 * 7. A timestamp field must hold a valid event time (SL_TIME_MIN_VALID ..
 *    SL_TIME_MAX_VALID, time_check.h); INT64_MIN, the library's "no
 *    timestamp", gets a reason of its own.  The line is then malformed
 *    like any other: the source fails with file and line, or writes it to
 *    its dead letters.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io_internal.h"
#include "op_util.h"
#include "time_check.h"
#include "utf8_check.h"

/* bad(reason, reason_bytes, fmt, ...): the reason of a malformed input
 * into the caller's buffer, then IO_MALFORMED. */
#define bad(...) op_errorf(IO_MALFORMED, __VA_ARGS__)

/* ------------------------------------------------------------ setup */

/* Spaces belong to the cell (note 3). */
static int never_space(unsigned char c) {
  (void)c;
  return 0;
}

static int csv_start(io_parser *p) {
  /* APPEND_NULL: every cell arrives NUL-terminated, for strtoll/strtod. */
  if (csv_init(&p->csv, CSV_STRICT | CSV_STRICT_FINI | CSV_APPEND_NULL) != 0)
    return ENOMEM;
  csv_set_delim(&p->csv, (unsigned char)p->delimiter);
  csv_set_space_func(&p->csv, never_space);
  p->csv_ready = true;
  return 0;
}

/* Note 4. */
static int csv_restart(io_parser *p) {
  csv_free(&p->csv);
  p->csv_ready = false;
  return csv_start(p);
}

int io_parser_init(io_parser *p, const io_schema *schema, int format,
                   char delimiter) {
  memset(p, 0, sizeof *p);
  p->schema = schema;
  p->format = format;
  p->delimiter = delimiter ? delimiter : ',';
  if (format == SL_FORMAT_JSONL)
    return 0;
  assert(format == SL_FORMAT_CSV || format == SL_FORMAT_CSV_HEADER);
  int rc = csv_start(p);
  if (rc)
    return rc;
  if (format == SL_FORMAT_CSV) {
    int n = schema->public_schema.field_count;
    p->column_field = malloc(sizeof *p->column_field * (size_t)n);
    if (!p->column_field) {
      io_parser_free(p);
      return ENOMEM;
    }
    for (int i = 0; i < n; i++)
      p->column_field[i] = i;
    p->column_count = n;
    p->header_known = true;
  }
  return 0;
}

static void free_header_names(io_parser *p) {
  for (int i = 0; i < p->header_count; i++)
    free(p->header_names[i]);
  p->header_count = 0;
}

void io_parser_free(io_parser *p) {
  if (p->csv_ready)
    csv_free(&p->csv);
  p->csv_ready = false;
  if (p->header_names)
    free_header_names(p);
  free(p->header_names);
  p->header_names = 0;
  free(p->column_field);
  p->column_field = 0;
}

bool io_parser_wants_header(const io_parser *p) {
  return p->format == SL_FORMAT_CSV_HEADER && !p->header_known;
}

void io_parser_new_file(io_parser *p) {
  if (p->format == SL_FORMAT_CSV_HEADER)
    p->header_known = false;
}

/* ------------------------------------------------------------ CSV header */

static void on_header_cell(void *cell, size_t bytes, void *data) {
  io_parser *p = data;
  if (p->header_count == IO_MAX_COLUMNS) {
    p->header_overflow = true;
    return;
  }
  char *name = malloc(bytes + 1);
  if (!name) {
    p->out_of_memory = true;
    return;
  }
  if (bytes)
    memcpy(name, cell, bytes);
  name[bytes] = 0;
  p->header_names[p->header_count++] = name;
}

static void on_header_row(int c, void *data) {
  (void)c;
  ((io_parser *)data)->rows++;
}

/* Map the header's columns to fields; header_names holds them. */
static int map_header(io_parser *p, char *reason, size_t reason_bytes) {
  const sl_schema *s = &p->schema->public_schema;
  int *map = realloc(p->column_field,
                     sizeof *map * (size_t)(p->header_count ? p->header_count
                                                            : 1));
  if (!map)
    return ENOMEM;
  p->column_field = map;
  for (int c = 0; c < p->header_count; c++) {
    map[c] = -1;
    for (int f = 0; f < s->field_count && map[c] < 0; f++)
      if (strcmp(p->header_names[c], s->fields[f].name) == 0)
        map[c] = f;
    for (int earlier = 0; earlier < c && map[c] >= 0; earlier++)
      if (map[earlier] == map[c])
        return bad(reason, reason_bytes,
                   "header names column \"%s\" twice (columns %d and %d)",
                   p->header_names[c], earlier + 1, c + 1);
  }
  for (int f = 0; f < s->field_count; f++) {
    if (s->fields[f].flags & SL_FIELD_OPTIONAL)
      continue;
    int c = 0;
    while (c < p->header_count && map[c] != f)
      c++;
    if (c == p->header_count)
      return bad(reason, reason_bytes, "header lacks column \"%s\"",
                 s->fields[f].name);
  }
  p->column_count = p->header_count;
  return 0;
}

int io_parse_header(io_parser *p, const char *line, size_t bytes,
                    char *reason, size_t reason_bytes) {
  assert(p->format == SL_FORMAT_CSV_HEADER);
  if (!p->header_names) {
    p->header_names = calloc(IO_MAX_COLUMNS, sizeof *p->header_names);
    if (!p->header_names)
      return ENOMEM;
  }
  free_header_names(p);
  p->rows = 0;
  p->header_overflow = p->out_of_memory = false;
  int rc = 0;
  size_t done = csv_parse(&p->csv, line, bytes, on_header_cell,
                          on_header_row, p);
  if (done != bytes) {
    rc = csv_error(&p->csv) == CSV_EPARSE
             ? bad(reason, reason_bytes, "header: CSV syntax error at byte "
                   "%zu", done + 1)
             : ENOMEM;
  } else if (csv_fini(&p->csv, on_header_cell, on_header_row, p) != 0) {
    rc = bad(reason, reason_bytes, "header: unterminated quote");
  }
  if (rc) {
    int restart = csv_restart(p);
    free_header_names(p);
    return restart ? restart : rc;
  }
  if (p->out_of_memory)
    rc = ENOMEM;
  else if (p->header_overflow)
    rc = bad(reason, reason_bytes, "header has more than %d columns",
             IO_MAX_COLUMNS);
  else if (p->rows != 1)
    rc = bad(reason, reason_bytes, "header: a carriage return outside "
             "quotes splits the line");
  else
    rc = map_header(p, reason, reason_bytes);
  free_header_names(p);
  if (rc == 0)
    p->header_known = true;
  return rc;
}

/* ------------------------------------------------------------ CSV rows */

static void on_cell(void *cell, size_t bytes, void *data) {
  io_parser *p = data;
  int column = p->column++;
  if (p->failed || p->rows > 0 || column >= p->column_count)
    return; /* the row is malformed already (note 3) */
  int f = p->column_field[column];
  if (f < 0)
    return; /* a header column the schema does not name */
  const char *text = cell ? cell : "";
  if (io_field_from_text(&p->schema->fields[f], text, bytes, p->record,
                         p->reason, p->reason_bytes) != 0) {
    p->failed = true;
    p->failed_column = column;
  }
}

static void on_row(int c, void *data) {
  (void)c;
  io_parser *p = data;
  if (p->rows++ == 0)
    p->row_columns = p->column;
}

static int parse_csv(io_parser *p, const char *line, size_t bytes,
                     void *record, char *reason, size_t reason_bytes) {
  assert(p->header_known);
  char cell_reason[IO_REASON_BYTES];
  p->record = record;
  p->column = 0;
  p->rows = 0;
  p->row_columns = 0;
  p->failed = false;
  p->reason = cell_reason;
  p->reason_bytes = sizeof cell_reason;
  size_t done = csv_parse(&p->csv, line, bytes, on_cell, on_row, p);
  if (done != bytes) {
    int e = csv_error(&p->csv);
    int rc = csv_restart(p);
    if (rc || e != CSV_EPARSE)
      return ENOMEM;
    return bad(reason, reason_bytes, "CSV syntax error at byte %zu: a quote "
               "inside an unquoted field or text after a closing quote",
               done + 1);
  }
  if (csv_fini(&p->csv, on_cell, on_row, p) != 0) {
    int rc = csv_restart(p);
    return rc ? rc : bad(reason, reason_bytes, "unterminated quote");
  }
  if (p->rows != 1)
    return bad(reason, reason_bytes,
               "a carriage return outside quotes splits the line");
  if (p->row_columns != p->column_count)
    return bad(reason, reason_bytes, "%d columns, expected %d",
               p->row_columns, p->column_count);
  if (p->failed)
    return bad(reason, reason_bytes, "column %d: %s", p->failed_column + 1,
               cell_reason);
  return IO_PARSED;
}

/* ------------------------------------------------------------ JSON */

static const char *json_kind(const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT: return "an object";
  case JSON_ARRAY: return "an array";
  case JSON_STRING: return "a string";
  case JSON_INTEGER: return "an integer";
  case JSON_REAL: return "a real";
  case JSON_TRUE: return "true";
  case JSON_FALSE: return "false";
  default: return "null";
  }
}

/* One JSON value into field f of record. */
static int field_from_json(const sl_field *f, const json_t *v, void *record,
                           char *reason, size_t reason_bytes) {
  uint8_t *at = (uint8_t *)record + f->offset;
  switch (f->type) {
  case SL_FIELD_INT64:
  case SL_FIELD_INT32: {
    if (!json_is_integer(v))
      return bad(reason, reason_bytes,
                 "field \"%s\": expected an integer, got %s", f->name,
                 json_kind(v));
    int64_t value = json_integer_value(v);
    if (f->type == SL_FIELD_INT64) {
      memcpy(at, &value, sizeof value);
      return 0;
    }
    if (value < INT32_MIN || value > INT32_MAX)
      return bad(reason, reason_bytes,
                 "field \"%s\": integer %" PRId64 " is out of range", f->name,
                 value);
    int32_t value32 = (int32_t)value;
    memcpy(at, &value32, sizeof value32);
    return 0;
  }
  case SL_FIELD_DOUBLE: {
    if (!json_is_number(v))
      return bad(reason, reason_bytes,
                 "field \"%s\": expected a number, got %s", f->name,
                 json_kind(v));
    double value = json_number_value(v);
    memcpy(at, &value, sizeof value);
    return 0;
  }
  case SL_FIELD_BOOL:
    if (!json_is_boolean(v))
      return bad(reason, reason_bytes,
                 "field \"%s\": expected true or false, got %s", f->name,
                 json_kind(v));
    *at = json_is_true(v) ? 1 : 0;
    return 0;
  case SL_FIELD_STRING: {
    if (!json_is_string(v))
      return bad(reason, reason_bytes,
                 "field \"%s\": expected a string, got %s", f->name,
                 json_kind(v));
    size_t bytes = json_string_length(v); /* no NUL: JSON_ALLOW_NUL is off */
    if (bytes > f->size - 1)
      return bad(reason, reason_bytes,
                 "field \"%s\": string of %zu bytes is too long (at most %"
                 PRIu32 ")", f->name, bytes, f->size - 1);
    memcpy(at, json_string_value(v), bytes);
    return 0;
  }
  default:
    assert(!"type checked by sl_schema_validate");
    return bad(reason, reason_bytes, "unknown type");
  }
}

static int parse_json(io_parser *p, const char *line, size_t bytes,
                      void *record, char *reason, size_t reason_bytes) {
  json_error_t error;
  /* DECODE_ANY: a scalar line parses, and is refused as "not an object". */
  json_t *root = json_loadb(line, bytes,
                            JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &error);
  if (!root) {
    if (json_error_code(&error) == json_error_out_of_memory)
      return ENOMEM;
    /* jansson refuses invalid UTF-8 by the same rule as the Nexmark
     * parser (utf8_check.h note 1), so a valid line is scanned once; a
     * refused one is scanned again for a reason that says where and what
     * (note 6). */
    const char *why = "";
    size_t invalid = sl_utf8_invalid_at(line, bytes, &why);
    if (invalid < bytes)
      return bad(reason, reason_bytes, "invalid UTF-8 at byte %zu: %s",
                 invalid + 1, why);
    return bad(reason, reason_bytes, "JSON syntax error at column %d: %s",
               error.column, error.text);
  }
  int rc = IO_PARSED;
  if (!json_is_object(root))
    rc = bad(reason, reason_bytes, "not a JSON object (%s)", json_kind(root));
  const sl_schema *s = &p->schema->public_schema;
  for (int i = 0; i < s->field_count && rc == IO_PARSED; i++) {
    const sl_field *f = &s->fields[i];
    json_t *v = json_object_get(root, f->name);
    if (!v || json_is_null(v)) {
      if (!(f->flags & SL_FIELD_OPTIONAL))
        rc = v ? bad(reason, reason_bytes, "field \"%s\" is null", f->name)
               : bad(reason, reason_bytes, "missing field \"%s\"", f->name);
      continue; /* optional: stays zero */
    }
    rc = field_from_json(f, v, record, reason, reason_bytes);
  }
  json_decref(root);
  return rc;
}

/* ------------------------------------------------------------ lines */

int io_parse_line(io_parser *p, const char *line, size_t bytes, void *record,
                  int64_t *timestamp, char *reason, size_t reason_bytes) {
  assert(bytes > 0);
  const io_schema *s = p->schema;
  memset(record, 0, s->public_schema.record_bytes); /* note 5 */
  int rc = p->format == SL_FORMAT_JSONL
               ? parse_json(p, line, bytes, record, reason, reason_bytes)
               : parse_csv(p, line, bytes, record, reason, reason_bytes);
  if (rc != IO_PARSED)
    return rc;
  *timestamp = SL_NO_TIMESTAMP;
  if (s->timestamp_index >= 0) {
    const sl_field *f = &s->fields[s->timestamp_index];
    memcpy(timestamp, (const uint8_t *)record + f->offset, sizeof *timestamp);
    if (!sl_time_valid(*timestamp)) { /* note 7 */
      if (*timestamp == SL_NO_TIMESTAMP)
        return bad(reason, reason_bytes,
                   "timestamp field \"%s\" holds INT64_MIN, which means "
                   "no timestamp", f->name);
      return bad(reason, reason_bytes,
                 "timestamp field \"%s\" holds %" PRId64 ", outside the "
                 "valid event times %" PRId64 " .. %" PRId64, f->name,
                 *timestamp, SL_TIME_MIN_VALID, SL_TIME_MAX_VALID);
    }
  }
  return IO_PARSED;
}
