/* io_schema.c — record schemas: validation, the owned copy the sources
 * keep, text <-> value conversion of one field, and the CSV and JSON lines
 * formatters (sl_format_csv, sl_format_jsonl).
 *
 * NOTES
 *
 * 1. A schema is checked once, when a source is built (or by the caller
 *    with sl_schema_validate()); parsing and formatting then trust it.  The
 *    formatters take the caller's schema as their user pointer and cannot
 *    report a bad one, so they check only what a record can get wrong (its
 *    size).
 * 2. Values are read and written with memcpy: a field need not be aligned,
 *    and the record bytes may come from anywhere.
 * 3. A string field holds at most size - 1 bytes so that it is always
 *    NUL-terminated for C code; the formatters still bound their reads with
 *    strnlen(size), so a record filled by other code cannot make them read
 *    past the field.
 * 4. Doubles are printed with the fewest of 15, 16 or 17 significant digits
 *    that strtod() reads back as the same value (17 always does for an
 *    IEEE double); most values then print as people wrote them ("0.1", not
 *    "0.10000000000000001").
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <csv.h>

#include "internal.h"
#include "io_internal.h"
#include "op_util.h"

_Static_assert(sizeof(double) == 8, "SL_FIELD_DOUBLE is 8 bytes");
_Static_assert(sizeof(json_int_t) == sizeof(int64_t),
               "jansson integers hold int64_t");

/* ------------------------------------------------------------ validation */

static const char *type_name(int type) {
  switch (type) {
  case SL_FIELD_INT64: return "SL_FIELD_INT64";
  case SL_FIELD_INT32: return "SL_FIELD_INT32";
  case SL_FIELD_DOUBLE: return "SL_FIELD_DOUBLE";
  case SL_FIELD_BOOL: return "SL_FIELD_BOOL";
  case SL_FIELD_STRING: return "SL_FIELD_STRING";
  default: return 0;
  }
}

/* The size a fixed-size type requires; 0 for strings (any size >= 1). */
static uint32_t type_size(int type) {
  switch (type) {
  case SL_FIELD_INT64: return 8;
  case SL_FIELD_INT32: return 4;
  case SL_FIELD_DOUBLE: return 8;
  case SL_FIELD_BOOL: return 1;
  default: return 0;
  }
}

/* invalid(err, err_bytes, fmt, ...): why the schema is refused into the
 * caller's buffer (if any), then EINVAL. */
#define invalid(...) op_errorf(EINVAL, __VA_ARGS__)

/* One field on its own: name, type, size, place, flags. */
static int check_field(const sl_schema *s, int i, char *err,
                       size_t err_bytes) {
  const sl_field *f = &s->fields[i];
  if (!f->name || !f->name[0])
    return invalid(err, err_bytes, "field %d has no name", i);
  size_t length = strnlen(f->name, SL_SCHEMA_MAX_NAME + 1);
  if (length > SL_SCHEMA_MAX_NAME)
    return invalid(err, err_bytes, "field %d: name longer than %d bytes", i,
                   SL_SCHEMA_MAX_NAME);
  if (strpbrk(f->name, "\t\r\n"))
    return invalid(err, err_bytes,
                   "field %d: name holds a tab or line break", i);
  if (!type_name(f->type))
    return invalid(err, err_bytes, "field %d (\"%s\"): unknown type %d", i,
                   f->name, f->type);
  uint32_t need = type_size(f->type);
  if (need && f->size != need)
    return invalid(err, err_bytes,
                   "field %d (\"%s\"): an %s is %" PRIu32 " bytes, not %"
                   PRIu32, i, f->name, type_name(f->type), need, f->size);
  if (f->type == SL_FIELD_STRING && f->size == 0)
    return invalid(err, err_bytes,
                   "field %d (\"%s\"): a string field needs at least 1 byte",
                   i, f->name);
  if ((uint64_t)f->offset + f->size > s->record_bytes)
    return invalid(err, err_bytes,
                   "field %d (\"%s\"): bytes %" PRIu32 "..%" PRIu64
                   " are outside the %" PRIu32 "-byte record", i, f->name,
                   f->offset, (uint64_t)f->offset + f->size - 1,
                   s->record_bytes);
  if (f->flags & ~(uint32_t)SL_FIELD_OPTIONAL)
    return invalid(err, err_bytes, "field %d (\"%s\"): unknown flags 0x%"
                   PRIx32, i, f->name, f->flags);
  return 0;
}

static int by_name(const void *a, const void *b) {
  return strcmp((*(const sl_field *const *)a)->name,
                (*(const sl_field *const *)b)->name);
}

static int by_offset(const void *a, const void *b) {
  const sl_field *x = *(const sl_field *const *)a;
  const sl_field *y = *(const sl_field *const *)b;
  if (x->offset != y->offset)
    return x->offset < y->offset ? -1 : 1;
  return x < y ? -1 : x > y; /* deterministic: by index */
}

/* Duplicate names and overlaps, found between neighbours of two sorted
 * orders (O(n log n) for up to SL_SCHEMA_MAX_FIELDS fields). */
static int check_pairs(const sl_schema *s, char *err, size_t err_bytes) {
  const sl_field *sorted[SL_SCHEMA_MAX_FIELDS];
  int n = s->field_count;
  for (int i = 0; i < n; i++)
    sorted[i] = &s->fields[i];
  qsort(sorted, (size_t)n, sizeof sorted[0], by_name);
  for (int i = 1; i < n; i++)
    if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0)
      return invalid(err, err_bytes, "fields %d and %d are both named \"%s\"",
                     (int)(sorted[i - 1] - s->fields),
                     (int)(sorted[i] - s->fields), sorted[i]->name);
  qsort(sorted, (size_t)n, sizeof sorted[0], by_offset);
  for (int i = 1; i < n; i++) {
    const sl_field *a = sorted[i - 1], *b = sorted[i];
    if ((uint64_t)a->offset + a->size > b->offset)
      return invalid(err, err_bytes,
                     "field %d (\"%s\") overlaps field %d (\"%s\")",
                     (int)(b - s->fields), b->name, (int)(a - s->fields),
                     a->name);
  }
  return 0;
}

/* Index of the field named name, or -1. */
static int field_index(const sl_schema *s, const char *name) {
  for (int i = 0; i < s->field_count; i++)
    if (strcmp(s->fields[i].name, name) == 0)
      return i;
  return -1;
}

SL_EXPORT int sl_schema_validate(const sl_schema *s, char *err,
                                 size_t err_bytes) {
  if (err && err_bytes)
    err[0] = 0;
  if (!s)
    return invalid(err, err_bytes, "schema is NULL");
  if (s->field_count < 1 || s->field_count > SL_SCHEMA_MAX_FIELDS)
    return invalid(err, err_bytes, "schema has %d fields (1..%d)",
                   s->field_count, SL_SCHEMA_MAX_FIELDS);
  if (!s->fields)
    return invalid(err, err_bytes, "schema fields are NULL");
  if (s->record_bytes == 0)
    return invalid(err, err_bytes, "schema record_bytes is 0");
  for (int i = 0; i < s->field_count; i++) {
    int rc = check_field(s, i, err, err_bytes);
    if (rc)
      return rc;
  }
  int rc = check_pairs(s, err, err_bytes);
  if (rc)
    return rc;
  if (s->timestamp_field) {
    int t = field_index(s, s->timestamp_field);
    if (t < 0)
      return invalid(err, err_bytes,
                     "timestamp_field \"%s\" is not a field of the schema",
                     s->timestamp_field);
    if (s->fields[t].type != SL_FIELD_INT64)
      return invalid(err, err_bytes,
                     "timestamp_field \"%s\" is an %s, not an SL_FIELD_INT64",
                     s->timestamp_field, type_name(s->fields[t].type));
  }
  return 0;
}

/* ------------------------------------------------------------ copy */

int io_schema_copy(const sl_schema *schema, io_schema **copy, char *err,
                   size_t err_bytes) {
  *copy = 0;
  int rc = sl_schema_validate(schema, err, err_bytes);
  if (rc)
    return rc;
  size_t names_bytes = 0;
  for (int i = 0; i < schema->field_count; i++)
    names_bytes += strlen(schema->fields[i].name) + 1;
  io_schema *s = calloc(1, sizeof *s);
  if (s) {
    s->fields = calloc((size_t)schema->field_count, sizeof *s->fields);
    s->names = malloc(names_bytes);
  }
  if (!s || !s->fields || !s->names) {
    io_schema_free(s);
    invalid(err, err_bytes, "out of memory");
    return ENOMEM;
  }
  char *name = s->names;
  for (int i = 0; i < schema->field_count; i++) {
    s->fields[i] = schema->fields[i];
    size_t bytes = strlen(schema->fields[i].name) + 1;
    memcpy(name, schema->fields[i].name, bytes);
    s->fields[i].name = name;
    name += bytes;
  }
  assert(name == s->names + names_bytes);
  s->public_schema = *schema;
  s->public_schema.fields = s->fields;
  s->timestamp_index = schema->timestamp_field
                           ? field_index(schema, schema->timestamp_field)
                           : -1;
  s->public_schema.timestamp_field =
      s->timestamp_index >= 0 ? s->fields[s->timestamp_index].name : 0;
  *copy = s;
  return 0;
}

void io_schema_free(io_schema *schema) {
  if (!schema)
    return;
  free(schema->fields);
  free(schema->names);
  free(schema);
}

/* ------------------------------------------------------------ text in */

/* bad(reason, reason_bytes, fmt, ...): the reason of a malformed input
 * into the caller's buffer, then IO_MALFORMED. */
#define bad(...) op_errorf(IO_MALFORMED, __VA_ARGS__)

/* Bytes of a value quoted in a reason: enough to recognise it. */
#define REASON_QUOTE_BYTES 40

/* A CSV integer: [+-]digits, nothing else.  Returns 0 or IO_MALFORMED. */
static int integer_from_text(const sl_field *f, const char *text,
                             size_t bytes, int64_t *value, char *reason,
                             size_t reason_bytes) {
  size_t i = text[0] == '-' || text[0] == '+';
  bool digits = i < bytes;
  for (; i < bytes && digits; i++)
    digits = text[i] >= '0' && text[i] <= '9';
  if (!digits)
    return bad(reason, reason_bytes, "field \"%s\": bad integer \"%.*s\"",
               f->name, (int)(bytes < REASON_QUOTE_BYTES ? bytes
                                                         : REASON_QUOTE_BYTES),
               text);
  errno = 0;
  long long v = strtoll(text, 0, 10); /* text ends with a NUL */
  if (errno == ERANGE ||
      (f->type == SL_FIELD_INT32 && (v < INT32_MIN || v > INT32_MAX)))
    return bad(reason, reason_bytes,
               "field \"%s\": integer %.*s is out of range", f->name,
               (int)(bytes < REASON_QUOTE_BYTES ? bytes : REASON_QUOTE_BYTES),
               text);
  *value = v;
  return 0;
}

/* A CSV double in decimal notation.  Returns 0 or IO_MALFORMED. */
static int double_from_text(const sl_field *f, const char *text,
                            size_t bytes, double *value, char *reason,
                            size_t reason_bytes) {
  int shown = (int)(bytes < REASON_QUOTE_BYTES ? bytes : REASON_QUOTE_BYTES);
  /* strtod() also takes spaces, hex, "nan" and "inf": refuse them first. */
  if (strspn(text, "0123456789+-.eE") != bytes)
    return bad(reason, reason_bytes, "field \"%s\": bad number \"%.*s\"",
               f->name, shown, text);
  char *end;
  errno = 0;
  double v = strtod(text, &end);
  if (end != text + bytes)
    return bad(reason, reason_bytes, "field \"%s\": bad number \"%.*s\"",
               f->name, shown, text);
  if (errno == ERANGE && isinf(v)) /* underflow to 0 or subnormal is fine */
    return bad(reason, reason_bytes,
               "field \"%s\": number %.*s is out of range", f->name, shown,
               text);
  *value = v;
  return 0;
}

int io_field_from_text(const sl_field *f, const char *text, size_t bytes,
                       void *record, char *reason, size_t reason_bytes) {
  assert(text[bytes] == 0);
  uint8_t *at = (uint8_t *)record + f->offset;
  if (f->type == SL_FIELD_STRING) {
    if (memchr(text, 0, bytes))
      return bad(reason, reason_bytes, "field \"%s\": string holds a NUL byte",
                 f->name);
    if (bytes > f->size - 1)
      return bad(reason, reason_bytes,
                 "field \"%s\": string of %zu bytes is too long (at most %"
                 PRIu32 ")", f->name, bytes, f->size - 1);
    memcpy(at, text, bytes); /* the rest of the field is already zero */
    return 0;
  }
  if (bytes == 0) {
    if (f->flags & SL_FIELD_OPTIONAL)
      return 0;
    return bad(reason, reason_bytes, "field \"%s\" is empty", f->name);
  }
  int rc = 0;
  switch (f->type) {
  case SL_FIELD_INT64:
  case SL_FIELD_INT32: {
    int64_t v = 0;
    rc = integer_from_text(f, text, bytes, &v, reason, reason_bytes);
    if (rc == 0 && f->type == SL_FIELD_INT64)
      memcpy(at, &v, sizeof v);
    else if (rc == 0) {
      int32_t v32 = (int32_t)v;
      memcpy(at, &v32, sizeof v32);
    }
    break;
  }
  case SL_FIELD_DOUBLE: {
    double v = 0;
    rc = double_from_text(f, text, bytes, &v, reason, reason_bytes);
    if (rc == 0)
      memcpy(at, &v, sizeof v);
    break;
  }
  case SL_FIELD_BOOL:
    if (strcmp(text, "true") == 0 || strcmp(text, "1") == 0)
      *at = 1;
    else if (strcmp(text, "false") == 0 || strcmp(text, "0") == 0)
      *at = 0;
    else
      rc = bad(reason, reason_bytes,
               "field \"%s\": bad boolean \"%.*s\" (true, false, 1 or 0)",
               f->name, (int)(bytes < REASON_QUOTE_BYTES ? bytes
                                                         : REASON_QUOTE_BYTES),
               text);
    break;
  default:
    assert(!"type checked by sl_schema_validate");
  }
  return rc;
}

/* ------------------------------------------------------------ text out */

/* v in the fewest significant digits (15..17) that read back as v (note
 * 4), into text (32 bytes); returns the length, and the digits in
 * *digits. */
static int print_double(double v, char *text, int *digits) {
  int n = 0;
  for (int d = 15; d <= 17; d++) {
    n = snprintf(text, 32, "%.*g", d, v);
    *digits = d;
    if (d == 17 || strtod(text, 0) == v)
      break;
  }
  return n;
}

/* v in decimal into text (at least 21 bytes); returns the length.  Faster
 * than snprintf, which matters at a few hundred nanoseconds a record. */
static int print_int64(int64_t v, char *text) {
  char digits[20];
  int n = 0;
  /* Work on the magnitude as unsigned: -INT64_MIN does not fit int64_t. */
  uint64_t magnitude = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
  do {
    digits[n++] = (char)('0' + magnitude % 10);
    magnitude /= 10;
  } while (magnitude);
  int length = 0;
  if (v < 0)
    text[length++] = '-';
  while (n)
    text[length++] = digits[--n];
  return length;
}

/* Output cursor: bytes past the end of buffer are counted, not written, so
 * the total is the length the caller needs (the sl_format_fn protocol). */
typedef struct cursor {
  char *buffer;
  size_t capacity;
  size_t length;
} cursor;

static void put(cursor *c, const void *bytes, size_t n) {
  if (c->length < c->capacity)
    memcpy(c->buffer + c->length, bytes,
           n < c->capacity - c->length ? n : c->capacity - c->length);
  c->length += n;
}

/* A CSV cell of text: quoted by libcsv (quotes doubled) when it holds the
 * delimiter, a quote or a line break, else as it is. */
static void put_csv_text(cursor *c, const char *text, size_t n) {
  bool quote = false;
  for (size_t i = 0; i < n && !quote; i++)
    quote = text[i] == ',' || text[i] == '"' || text[i] == '\r' ||
            text[i] == '\n';
  if (!quote) {
    put(c, text, n);
    return;
  }
  size_t room = c->length < c->capacity ? c->capacity - c->length : 0;
  size_t need = csv_write(room ? c->buffer + c->length : 0, room, text, n);
  c->length += need; /* csv_write wrote min(need, room) bytes */
}

/* The value of field f of record as CSV text. */
static void put_csv_field(cursor *c, const sl_field *f, const uint8_t *rec) {
  const uint8_t *at = rec + f->offset;
  char text[40];
  int n = 0;
  switch (f->type) {
  case SL_FIELD_INT64: {
    int64_t v;
    memcpy(&v, at, sizeof v);
    n = print_int64(v, text);
    break;
  }
  case SL_FIELD_INT32: {
    int32_t v;
    memcpy(&v, at, sizeof v);
    n = print_int64(v, text);
    break;
  }
  case SL_FIELD_DOUBLE: {
    double v;
    memcpy(&v, at, sizeof v);
    int digits;
    n = print_double(v, text, &digits);
    break;
  }
  case SL_FIELD_BOOL:
    n = *at ? 4 : 5;
    memcpy(text, *at ? "true" : "false", (size_t)n);
    break;
  case SL_FIELD_STRING:
    put_csv_text(c, (const char *)at, strnlen((const char *)at, f->size));
    return;
  default:
    assert(!"type checked by sl_schema_validate");
  }
  put(c, text, (size_t)n);
}

/* Finish a format call: the length, or a request for a larger buffer. */
static int format_result(const cursor *c) {
  return c->length > INT_MAX ? -EOVERFLOW : (int)c->length;
}

SL_EXPORT int sl_format_csv(void *user, const sl_record *in, char *buffer,
                            uint32_t buffer_bytes) {
  const sl_schema *s = user;
  if (!s || !s->fields || in->size_bytes != s->record_bytes)
    return -EINVAL;
  cursor c = {buffer, buffer ? buffer_bytes : 0, 0};
  for (int i = 0; i < s->field_count; i++) {
    if (i)
      put(&c, ",", 1);
    put_csv_field(&c, &s->fields[i], in->data);
  }
  return format_result(&c);
}

SL_EXPORT int sl_format_csv_header(const sl_schema *s, char *buffer,
                                   uint32_t buffer_bytes) {
  if (!s || !s->fields)
    return -EINVAL;
  cursor c = {buffer, buffer ? buffer_bytes : 0, 0};
  for (int i = 0; i < s->field_count; i++) {
    if (i)
      put(&c, ",", 1);
    put_csv_text(&c, s->fields[i].name, strlen(s->fields[i].name));
  }
  return format_result(&c);
}

/* The JSON value of field f of record; *digits is raised to what a double
 * needs.  NULL: not representable (errno-style code in *error). */
static json_t *json_field(const sl_field *f, const uint8_t *rec, int *digits,
                          int *error) {
  const uint8_t *at = rec + f->offset;
  json_t *value = 0;
  switch (f->type) {
  case SL_FIELD_INT64: {
    int64_t v;
    memcpy(&v, at, sizeof v);
    value = json_integer((json_int_t)v);
    break;
  }
  case SL_FIELD_INT32: {
    int32_t v;
    memcpy(&v, at, sizeof v);
    value = json_integer(v);
    break;
  }
  case SL_FIELD_DOUBLE: {
    double v;
    memcpy(&v, at, sizeof v);
    if (!isfinite(v)) {
      *error = EDOM; /* JSON has no NaN or infinity */
      return 0;
    }
    char text[32];
    int need;
    print_double(v, text, &need);
    if (need > *digits)
      *digits = need;
    value = json_real(v);
    break;
  }
  case SL_FIELD_BOOL:
    value = json_boolean(*at != 0);
    break;
  case SL_FIELD_STRING: {
    const char *text = (const char *)at;
    value = json_stringn(text, strnlen(text, f->size));
    if (!value) {
      *error = EILSEQ; /* jansson refuses invalid UTF-8 */
      return 0;
    }
    break;
  }
  default:
    assert(!"type checked by sl_schema_validate");
  }
  if (!value)
    *error = ENOMEM;
  return value;
}

SL_EXPORT int sl_format_jsonl(void *user, const sl_record *in, char *buffer,
                              uint32_t buffer_bytes) {
  const sl_schema *s = user;
  if (!s || !s->fields || in->size_bytes != s->record_bytes)
    return -EINVAL;
  json_t *object = json_object();
  if (!object)
    return -ENOMEM;
  int digits = 15, error = 0;
  for (int i = 0; i < s->field_count && !error; i++) {
    json_t *value = json_field(&s->fields[i], in->data, &digits, &error);
    /* json_object_set_new() takes the value even when it fails; it fails
     * for a key that is not UTF-8 (or out of memory). */
    if (value && json_object_set_new(object, s->fields[i].name, value) != 0)
      error = EILSEQ;
  }
  int rc = -error;
  if (!error) {
    /* json_dumpb() copies only what fits; a 1-byte stand-in keeps it from
     * copying into a NULL buffer. */
    char spare[1];
    size_t n = json_dumpb(object, buffer ? buffer : spare,
                          buffer ? buffer_bytes : 0,
                          JSON_COMPACT | JSON_PRESERVE_ORDER |
                              JSON_REAL_PRECISION(digits));
    rc = n == 0 ? -ENOMEM : n > INT_MAX ? -EOVERFLOW : (int)n;
  }
  json_decref(object);
  return rc;
}
