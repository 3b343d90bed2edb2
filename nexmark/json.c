/* json.c — Nexmark events as JSON lines: the writer, a strict parser of
 * exactly that shape, and the event-file source (nexmark.h).
 *
 *   {"event_type":2,"bid":{"auction":1000,"bidder":1001,"price":669,
 *    "channel":"Google","url":"https://...","date_time":1700000000000,
 *    "extra":""}}
 *
 * NOTES ON THE DESIGN
 *
 * 1. One table of fields per kind (name, integer or string, offset in the
 *    view) drives both the writer and the parser, so they cannot disagree
 *    on names or order.
 * 2. The parser is written by hand for this one shape: an object with
 *    "event_type" and one of "person", "auction", "bid", whose members
 *    are integers and strings.  jansson would build a tree per line
 *    (about 1.5 us) and could not name the field of an integer out of
 *    range.  It accepts RFC 8259 syntax for what it takes (whitespace
 *    anywhere, members in any order, any escapes) and refuses, naming the
 *    field: a missing, unknown or duplicate field, a wrong type, a number
 *    with a fraction or exponent, an integer outside int64_t, a string
 *    over NX_MAX_STRING_BYTES, an unknown event_type or one that does not
 *    match the object, and anything after the object.  Strings must be
 *    well-formed UTF-8 under the rule the library's JSON-lines source
 *    uses (operators/utf8_check.h: no overlong form, surrogate, code
 *    point beyond U+10FFFF or cut sequence; no lone surrogate in a \u
 *    escape), so both refuse the same lines; only bytes of 0x80 and up
 *    pay for the check.  Any UTF-8 string the writer wrote reads back
 *    equal.  (One difference stays: \u0000 is taken here, since
 *    Nexmark strings carry their length; the library's C-string fields
 *    refuse it.)
 * 3. Strings are unescaped into the caller's storage; an unescaped string
 *    is never longer than its JSON form, so storage of the line's length
 *    always suffices.  Field names are unescaped there too and the room
 *    taken back once compared.
 * 4. File source (parallelism 1).  Its position is (file index, offset of
 *    the next line, that line's number), a hash of the path list and the
 *    identity of the file being read (note 8).  next() emits every line
 *    it consumed before it returns and snapshots run between next()
 *    calls, so the saved position is exactly after the last record
 *    emitted.  A malformed line fails the job with "FILE line N: reason";
 *    empty (or blank) lines are skipped.
 * 5. Bounded work per next(): at most FILE_RECORDS_PER_CALL records,
 *    FILE_LINES_PER_CALL lines and FILE_BYTES_PER_CALL bytes, so blank
 *    lines do not hold up barriers.
 * 6. The path list is one allocation the job owns (sl_op_set_user_free)
 *    and frees when it is destroyed.
 * 7. Event times (every date_time, and an auction's expires) must lie in
 *    SL_TIME_MIN_VALID .. SL_TIME_MAX_VALID (sluice.h, the library's
 *    time_check.h): INT64_MIN ("no timestamp") and times whose windows
 *    would overflow are refused here, naming the field, so the file
 *    source fails with "FILE line N: field "date_time": reason" before
 *    any query sees them.
 * 8. Changed input.  A restore (resume, savepoint, failover) refuses,
 *    naming the file and what changed: another path list; a file that is
 *    not a regular file, read past its start (its bytes cannot be read
 *    again); another device or inode (replaced, even by an equal copy); a
 *    file shorter than the offset (truncated below the position); other
 *    bytes in the first or the last FILE_IDENTITY_BYTES before the offset
 *    (XXH3 of each, read with pread(2) at the snapshot).  Bytes after the
 *    offset may be new: an appended file resumes and reads them.  An edit
 *    in place strictly between the two hashed ends, keeping inode and
 *    length, goes unnoticed: the bound keeps a snapshot to two 4 KiB
 *    reads.  A position of the older layout (FILE_POSITION_WORDS_V1, no
 *    identity) is accepted with the checks it allows (path list, length),
 *    so state directories of older builds still resume.  The library's
 *    file source (operators/io_reader.c note 6) does the same; this file
 *    keeps to the public API, hence its own copy.
 * 9. Blocking inputs.  A FIFO or device (--input /dev/stdin, a named
 *    pipe) is opened with O_NONBLOCK, since open(2) of a FIFO waits for a
 *    writer, and each read first polls for at most FILE_STREAM_WAIT_MS;
 *    next() returns when nothing came, so sl_job_stop() reaches the
 *    source within that bound and no thread spins.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nexmark.h"
#include "time_check.h" /* the library's valid event times (note 7) */
#include "utf8_check.h" /* the library's UTF-8 rule (note 2) */

/* Longest line of an event file: six strings at their limit, each byte
 * escaped as \u00XX, fit with room to spare. */
#define FILE_MAX_LINE_BYTES (1u << 20)
#define FILE_READ_BYTES (256u << 10)
#define FILE_RECORDS_PER_CALL 1024u
#define FILE_LINES_PER_CALL 8192u
#define FILE_BYTES_PER_CALL (8u << 20)
#define FILE_PATH_BYTES 4096u
#define FILE_POSITION_VERSION 2
#define FILE_POSITION_WORDS_V1 4 /* file, offset, line, list hash */
#define FILE_IDENTITY_BYTES 4096u /* hashed at each end (note 8) */
#define FILE_STREAM_WAIT_MS 100   /* longest poll of a FIFO (note 9) */
#define DEFAULT_WATERMARK_LAG_MS 4000

_Static_assert(6u * 6u * NX_MAX_STRING_BYTES + 1024u < FILE_MAX_LINE_BYTES,
               "a line of six escaped strings at their limit fits");

/* ------------------------------------------------------------ fields */

/* FIELD_TIME: an integer that is an event time, checked (note 7). */
enum field_kind { FIELD_INTEGER = 0, FIELD_STRING = 1, FIELD_TIME = 2 };

typedef struct field {
  const char *name;
  uint8_t name_length;
  uint8_t kind;     /* enum field_kind */
  uint16_t offset;  /* in the kind's view struct */
} field;

#define INTEGER(type, member)                                                  \
  {#member, (uint8_t)(sizeof #member - 1), FIELD_INTEGER,                      \
   (uint16_t)offsetof(type, member)}
#define TIME(type, member)                                                     \
  {#member, (uint8_t)(sizeof #member - 1), FIELD_TIME,                         \
   (uint16_t)offsetof(type, member)}
#define STRING(type, member)                                                   \
  {#member, (uint8_t)(sizeof #member - 1), FIELD_STRING,                       \
   (uint16_t)offsetof(type, member)}

static const field person_fields[] = {
    INTEGER(nx_person, id),          STRING(nx_person, name),
    STRING(nx_person, email_address), STRING(nx_person, credit_card),
    STRING(nx_person, city),         STRING(nx_person, state),
    TIME(nx_person, date_time),      STRING(nx_person, extra)};
static const field auction_fields[] = {
    INTEGER(nx_auction, id),          STRING(nx_auction, item_name),
    STRING(nx_auction, description),  INTEGER(nx_auction, initial_bid),
    INTEGER(nx_auction, reserve),     TIME(nx_auction, date_time),
    TIME(nx_auction, expires),        INTEGER(nx_auction, seller),
    INTEGER(nx_auction, category),    STRING(nx_auction, extra)};
static const field bid_fields[] = {
    INTEGER(nx_bid, auction), INTEGER(nx_bid, bidder),
    INTEGER(nx_bid, price),   STRING(nx_bid, channel),
    STRING(nx_bid, url),      TIME(nx_bid, date_time),
    STRING(nx_bid, extra)};

typedef struct kind {
  const char *name;
  uint8_t name_length;
  uint8_t field_count;
  const field *fields;
} kind;

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static const kind kinds[3] = {
    {"person", 6, (uint8_t)COUNT(person_fields), person_fields},
    {"auction", 7, (uint8_t)COUNT(auction_fields), auction_fields},
    {"bid", 3, (uint8_t)COUNT(bid_fields), bid_fields}};

_Static_assert(NX_PERSON == 0 && NX_AUCTION == 1 && NX_BID == 2,
               "kinds[] is indexed by type");
_Static_assert(COUNT(auction_fields) <= 16, "seen[] is a 16-bit mask");

static int64_t *integer_at(nx_event *e, const field *f) {
  return (int64_t *)(void *)((char *)&e->u + f->offset);
}

static nx_str *string_at(nx_event *e, const field *f) {
  return (nx_str *)(void *)((char *)&e->u + f->offset);
}

static int64_t integer_of(const nx_event *e, const field *f) {
  return *(const int64_t *)(const void *)((const char *)&e->u + f->offset);
}

static nx_str string_of(const nx_event *e, const field *f) {
  return *(const nx_str *)(const void *)((const char *)&e->u + f->offset);
}

/* Bytes a JSON string holds as they are: not a control character, a
 * quote or a backslash.  Filled once (both directions use it). */
static bool plain_byte[256];
/* Bytes of a string the parser copies as they are: plain_byte without
 * 0x80 and up, which go through the UTF-8 check (note 2). */
static bool ascii_plain[256];
static pthread_once_t plain_once = PTHREAD_ONCE_INIT;

static void plain_fill(void) {
  for (int c = 0; c < 256; c++) {
    plain_byte[c] = c >= 0x20 && c != '"' && c != '\\';
    ascii_plain[c] = c < 0x80 && plain_byte[c];
  }
}

/* ------------------------------------------------------------ writer */

/* Output that counts what it could not store (nothing useful is written
 * past the buffer, but the length needed comes out right). */
typedef struct json_out {
  char *buffer;
  size_t capacity;
  size_t used;
} json_out;

static void out_bytes(json_out *o, const void *data, size_t bytes) {
  /* An empty string view may be {NULL, 0}: memcpy must not see NULL. */
  if (bytes > 0 && bytes <= o->capacity && o->used <= o->capacity - bytes)
    memcpy(o->buffer + o->used, data, bytes);
  o->used += bytes;
}

static void out_integer(json_out *o, int64_t value) {
  char digits[24];
  uint32_t k = sizeof digits;
  uint64_t v = value < 0 ? 0u - (uint64_t)value : (uint64_t)value;
  do {
    digits[--k] = (char)('0' + v % 10u);
    v /= 10u;
  } while (v);
  if (value < 0)
    digits[--k] = '-';
  out_bytes(o, digits + k, sizeof digits - k);
}

/* A JSON string: quotes, backslashes and control characters escaped,
 * every other byte as it is. */
static void out_string(json_out *o, nx_str s) {
  static const char hex[] = "0123456789abcdef";
  out_bytes(o, "\"", 1);
  uint32_t run = 0; /* start of the bytes not yet written */
  for (uint32_t i = 0; i < s.len; i++) {
    unsigned char c = (unsigned char)s.ptr[i];
    if (plain_byte[c])
      continue;
    out_bytes(o, s.ptr + run, i - run);
    run = i + 1;
    char escape[6] = {'\\', (char)c, 0, 0, 0, 0};
    size_t length = 2;
    switch (c) {
    case '"': case '\\': break;
    case '\b': escape[1] = 'b'; break;
    case '\f': escape[1] = 'f'; break;
    case '\n': escape[1] = 'n'; break;
    case '\r': escape[1] = 'r'; break;
    case '\t': escape[1] = 't'; break;
    default:
      memcpy(escape + 1, "u00", 3);
      escape[4] = hex[c >> 4];
      escape[5] = hex[c & 15u];
      length = 6;
    }
    out_bytes(o, escape, length);
  }
  out_bytes(o, s.ptr + run, s.len - run);
  out_bytes(o, "\"", 1);
}

size_t nx_json_write(const nx_event *e, char *buffer, size_t buffer_bytes) {
  if (!e || e->type < NX_PERSON || e->type > NX_BID)
    return 0;
  pthread_once(&plain_once, plain_fill);
  const kind *k = &kinds[e->type];
  json_out o = {.buffer = buffer, .capacity = buffer ? buffer_bytes : 0};
  out_bytes(&o, "{\"event_type\":", 14);
  out_integer(&o, e->type);
  out_bytes(&o, ",\"", 2);
  out_bytes(&o, k->name, k->name_length);
  out_bytes(&o, "\":{", 3);
  for (uint32_t i = 0; i < k->field_count; i++) {
    const field *f = &k->fields[i];
    out_bytes(&o, i ? ",\"" : "\"", i ? 2 : 1);
    out_bytes(&o, f->name, f->name_length);
    out_bytes(&o, "\":", 2);
    if (f->kind != FIELD_STRING)
      out_integer(&o, integer_of(e, f));
    else
      out_string(&o, string_of(e, f));
  }
  out_bytes(&o, "}}\n", 3);
  if (o.used < o.capacity)
    buffer[o.used] = 0; /* a NUL when there is room, not counted */
  assert(o.used > 20);
  return o.used;
}

/* ------------------------------------------------------------ parser */

typedef struct parser {
  const char *start; /* the line */
  const char *p;
  const char *end;
  char *store; /* unescaped strings go here (note 3) */
  size_t store_left;
  char *err;
  size_t err_bytes;
} parser;

__attribute__((format(printf, 2, 3))) static int fail(parser *ps,
                                                      const char *fmt, ...) {
  if (ps->err && ps->err_bytes) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ps->err, ps->err_bytes, fmt, ap);
    va_end(ap);
  }
  return EINVAL;
}

static int syntax(parser *ps, const char *what) {
  if (ps->p >= ps->end)
    return fail(ps, "invalid JSON: the line ends early (%s)", what);
  return fail(ps, "invalid JSON at byte %zu: %s",
              (size_t)(ps->p - ps->start) + 1, what);
}

/* An error inside a string: name is the field's, NULL for a field name
 * (formatted only on failure: the hot path builds no text). */
__attribute__((format(printf, 3, 4))) static int
string_fail(parser *ps, const char *name, const char *fmt, ...) {
  char problem[160];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(problem, sizeof problem, fmt, ap);
  va_end(ap);
  if (name)
    return fail(ps, "field \"%s\": %s", name, problem);
  return fail(ps, "a field name: %s", problem);
}

static void skip_space(parser *ps) {
  while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' ||
                             *ps->p == '\n' || *ps->p == '\r'))
    ps->p++;
}

static bool at(parser *ps, char c) { return ps->p < ps->end && *ps->p == c; }

static int hex_value(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  c = (char)(c | 0x20);
  return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Four hex digits after "\u"; -1 if malformed. */
static int32_t read_hex4(parser *ps) {
  if (ps->end - ps->p < 4)
    return -1;
  int32_t v = 0;
  for (int i = 0; i < 4; i++) {
    int h = hex_value(ps->p[i]);
    if (h < 0)
      return -1;
    v = v * 16 + h;
  }
  ps->p += 4;
  return v;
}

static size_t put_utf8(char *dst, uint32_t code) {
  if (code < 0x80) {
    dst[0] = (char)code;
    return 1;
  }
  if (code < 0x800) {
    dst[0] = (char)(0xc0 | (code >> 6));
    dst[1] = (char)(0x80 | (code & 0x3f));
    return 2;
  }
  if (code < 0x10000) {
    dst[0] = (char)(0xe0 | (code >> 12));
    dst[1] = (char)(0x80 | ((code >> 6) & 0x3f));
    dst[2] = (char)(0x80 | (code & 0x3f));
    return 3;
  }
  dst[0] = (char)(0xf0 | (code >> 18));
  dst[1] = (char)(0x80 | ((code >> 12) & 0x3f));
  dst[2] = (char)(0x80 | ((code >> 6) & 0x3f));
  dst[3] = (char)(0x80 | (code & 0x3f));
  return 4;
}

/* A \u escape (ps->p after the 'u'), surrogate pairs joined, as UTF-8 at
 * dst; returns its length, 0 if malformed (the message is set). */
static size_t unicode_escape(parser *ps, const char *name, char *dst) {
  int32_t code = read_hex4(ps);
  if (code < 0) {
    string_fail(ps, name, "invalid \\u escape");
    return 0;
  }
  if (code >= 0xdc00 && code <= 0xdfff) {
    string_fail(ps, name, "invalid \\u escape (an unpaired surrogate)");
    return 0;
  }
  if (code >= 0xd800 && code <= 0xdbff) {
    int32_t low = -1;
    if (ps->end - ps->p >= 2 && ps->p[0] == '\\' && ps->p[1] == 'u') {
      ps->p += 2;
      low = read_hex4(ps);
    }
    if (low < 0xdc00 || low > 0xdfff) {
      string_fail(ps, name, "invalid \\u escape (an unpaired surrogate)");
      return 0;
    }
    code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
  }
  return put_utf8(dst, (uint32_t)code);
}

/* One escape (ps->p after the backslash) at dst; its length, 0 if bad. */
static size_t escape(parser *ps, const char *name, char *dst) {
  static const char from[] = "\"\\/bfnrt";
  static const char to[] = "\"\\/\b\f\n\r\t";
  if (ps->p >= ps->end) {
    string_fail(ps, name, "unterminated string");
    return 0;
  }
  char c = *ps->p++;
  if (c == 'u')
    return unicode_escape(ps, name, dst);
  const char *hit = memchr(from, c, sizeof from - 1);
  if (!hit) {
    ps->p--;
    string_fail(ps, name, "invalid escape \\%c at byte %zu",
         (unsigned char)c >= 0x20 && (unsigned char)c < 0x7f ? c : '?',
         (size_t)(ps->p - ps->start));
    return 0;
  }
  *dst = to[hit - from];
  return 1;
}

/* A UTF-8 sequence at ps->p (its lead byte, 0x80 and up) into dst: its
 * length, 0 if it is not well-formed (the message is set). */
static size_t utf8_run(parser *ps, const char *name, char *dst) {
  const char *why = "";
  size_t n = sl_utf8_sequence((const unsigned char *)ps->p,
                              (size_t)(ps->end - ps->p), &why);
  if (n == 0) {
    string_fail(ps, name, "invalid UTF-8 at byte %zu: %s",
                (size_t)(ps->p - ps->start) + 1, why);
    return 0;
  }
  memcpy(dst, ps->p, n);
  ps->p += n;
  return n;
}

/* A string at ps->p (its opening quote), unescaped into the store (note
 * 3).  name is the field's, for errors; NULL for a field name. */
static int parse_string(parser *ps, const char *name, nx_str *s) {
  assert(at(ps, '"'));
  ps->p++;
  char *dst = ps->store;
  size_t length = 0;
  while (ps->p < ps->end) {
    const char *run = ps->p;
    while (ps->p < ps->end && ascii_plain[(unsigned char)*ps->p])
      ps->p++;
    size_t plain = (size_t)(ps->p - run);
    assert(length + plain <= ps->store_left); /* note 3 */
    memcpy(dst + length, run, plain);
    length += plain;
    if (ps->p == ps->end)
      break;
    if ((unsigned char)*ps->p >= 0x80) {
      size_t n = utf8_run(ps, name, dst + length);
      if (n == 0)
        return EINVAL;
      length += n;
      continue;
    }
    char c = *ps->p++;
    if (c == '"') {
      *s = (nx_str){.ptr = dst, .len = (uint32_t)length};
      ps->store += length;
      ps->store_left -= length;
      return 0;
    }
    if (c != '\\') {
      ps->p--;
      return string_fail(ps, name, "a control character (0x%02x) in the "
                         "string at byte %zu", (unsigned char)c,
                  (size_t)(ps->p - ps->start) + 1);
    }
    size_t n = escape(ps, name, dst + length);
    if (n == 0)
      return EINVAL;
    length += n;
  }
  return string_fail(ps, name, "unterminated string");
}

/* An integer of field name.  JSON numbers with a fraction or exponent are
 * refused as not integers. */
static int parse_integer(parser *ps, const char *name, int64_t *value) {
  bool negative = at(ps, '-');
  const char *digits = ps->p + negative;
  if (digits >= ps->end || *digits < '0' || *digits > '9')
    return fail(ps, "field \"%s\": expected an integer", name);
  ps->p = digits;
  uint64_t limit = negative ? (uint64_t)INT64_MAX + 1u : (uint64_t)INT64_MAX;
  uint64_t v = 0;
  bool over = false;
  while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
    uint64_t d = (uint64_t)(*ps->p++ - '0');
    over = over || v > (limit - d) / 10u;
    if (!over)
      v = v * 10u + d;
  }
  if (ps->p < ps->end && (*ps->p == '.' || *ps->p == 'e' || *ps->p == 'E'))
    return fail(ps, "field \"%s\": expected an integer, not a number with a "
                "fraction or exponent", name);
  if (*digits == '0' && ps->p - digits > 1)
    return fail(ps, "field \"%s\": invalid number (a leading zero)", name);
  if (over)
    return fail(ps, "field \"%s\": integer out of range", name);
  *value = negative ? (int64_t)(0u - v) : (int64_t)v;
  return 0;
}

/* An event time of field name (note 7). */
static int parse_time(parser *ps, const char *name, int64_t *value) {
  int rc = parse_integer(ps, name, value);
  if (rc)
    return rc;
  if (sl_time_valid(*value))
    return 0;
  if (*value == INT64_MIN)
    return fail(ps, "field \"%s\": INT64_MIN is not a time (it means no "
                "timestamp)", name);
  return fail(ps, "field \"%s\": time %" PRId64 " is outside the valid "
              "event times %" PRId64 " .. %" PRId64, name, *value,
              SL_TIME_MIN_VALID, SL_TIME_MAX_VALID);
}

/* A member's name at ps->p and the ':' after it.  The name is unescaped
 * into the store; the caller takes the room back (note 3). */
static int parse_name(parser *ps, nx_str *name) {
  if (!at(ps, '"'))
    return syntax(ps, "expected a field name in quotes");
  const char *q = ps->p + 1; /* a name without escapes: read in place */
  while (q < ps->end && ascii_plain[(unsigned char)*q])
    q++;
  if (q < ps->end && *q == '"') {
    *name = (nx_str){.ptr = ps->p + 1, .len = (uint32_t)(q - ps->p - 1)};
    ps->p = q + 1;
  } else {
    int rc = parse_string(ps, NULL, name);
    if (rc)
      return rc;
  }
  skip_space(ps);
  if (!at(ps, ':'))
    return syntax(ps, "expected ':'");
  ps->p++;
  skip_space(ps);
  return 0;
}

static bool name_is(nx_str name, const char *text, size_t length) {
  return name.len == length && memcmp(name.ptr, text, length) == 0;
}

/* name for a message: at most 40 bytes, odd bytes as '?'. */
static const char *printable(nx_str name, char buffer[48]) {
  uint32_t n = name.len < 40 ? name.len : 40;
  for (uint32_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)name.ptr[i];
    buffer[i] = c >= 0x20 && c < 0x7f && c != '"' ? (char)c : '?';
  }
  memcpy(buffer + n, name.len > n ? "..." : "", name.len > n ? 4 : 1);
  return buffer;
}

/* After a member: ',' (*last = false) or '}' (*last = true). */
static int member_end(parser *ps, bool *last) {
  skip_space(ps);
  *last = at(ps, '}');
  if (!*last && !at(ps, ','))
    return syntax(ps, "expected ',' or '}'");
  ps->p++;
  skip_space(ps);
  return 0;
}

/* One member of kind k's object: its value into e; *seen marks it, *next
 * is where the next name is looked for first. */
static int parse_member(parser *ps, const kind *k, nx_event *e,
                        uint32_t *seen, uint32_t *next) {
  char *mark = ps->store;
  size_t left = ps->store_left;
  nx_str name;
  int rc = parse_name(ps, &name);
  if (rc)
    return rc;
  /* The writer's order first: the field after the last one seen. */
  uint32_t i = *next < k->field_count ? *next : 0;
  uint32_t tried = 0;
  while (tried < k->field_count &&
         !name_is(name, k->fields[i].name, k->fields[i].name_length)) {
    i = i + 1 < k->field_count ? i + 1 : 0;
    tried++;
  }
  *next = i + 1;
  char shown[48];
  if (tried == k->field_count)
    return fail(ps, "unknown field \"%s\" in \"%s\"", printable(name, shown),
                k->name);
  ps->store = mark; /* the name's room back */
  ps->store_left = left;
  const field *f = &k->fields[i];
  if (*seen & (1u << i))
    return fail(ps, "duplicate field \"%s\"", f->name);
  *seen |= 1u << i;
  if (f->kind == FIELD_INTEGER)
    return parse_integer(ps, f->name, integer_at(e, f));
  if (f->kind == FIELD_TIME)
    return parse_time(ps, f->name, integer_at(e, f));
  if (!at(ps, '"'))
    return fail(ps, "field \"%s\": expected a string", f->name);
  nx_str *s = string_at(e, f);
  rc = parse_string(ps, f->name, s);
  if (rc == 0 && s->len > NX_MAX_STRING_BYTES)
    return fail(ps, "field \"%s\": a string of %" PRIu32 " bytes, longer "
                "than %u", f->name, s->len, NX_MAX_STRING_BYTES);
  return rc;
}

/* The object of kind k at ps->p ('{'), into e. */
static int parse_object(parser *ps, const kind *k, nx_event *e) {
  if (!at(ps, '{'))
    return fail(ps, "field \"%s\": expected an object", k->name);
  ps->p++;
  skip_space(ps);
  uint32_t seen = 0, next = 0;
  bool last = at(ps, '}');
  if (last)
    ps->p++;
  /* Each member consumes input: at most one per byte of the line. */
  while (!last) {
    int rc = parse_member(ps, k, e, &seen, &next);
    if (rc == 0)
      rc = member_end(ps, &last);
    if (rc)
      return rc;
  }
  for (uint32_t i = 0; i < k->field_count; i++)
    if (!(seen & (1u << i)))
      return fail(ps, "missing field \"%s\" in \"%s\"", k->fields[i].name,
                  k->name);
  assert(seen == (1u << k->field_count) - 1u);
  return 0;
}

/* What the top-level members said. */
typedef struct top {
  bool have_type;
  int64_t event_type;
  int kind; /* -1: no event object yet */
} top;

static int parse_top_member(parser *ps, top *t, nx_event *e) {
  char *mark = ps->store;
  size_t left = ps->store_left;
  nx_str name;
  int rc = parse_name(ps, &name);
  if (rc)
    return rc;
  int k = 0;
  while (k < 3 && !name_is(name, kinds[k].name, kinds[k].name_length))
    k++;
  bool is_type = name_is(name, "event_type", 10);
  char shown[48];
  if (!is_type && k == 3)
    return fail(ps, "unknown field \"%s\"", printable(name, shown));
  ps->store = mark;
  ps->store_left = left;
  if (is_type) {
    if (t->have_type)
      return fail(ps, "duplicate field \"event_type\"");
    t->have_type = true;
    return parse_integer(ps, "event_type", &t->event_type);
  }
  if (t->kind >= 0)
    return fail(ps, "more than one event object (\"%s\" and \"%s\")",
                kinds[t->kind].name, kinds[k].name);
  t->kind = k;
  return parse_object(ps, &kinds[k], e);
}

/* The whole line: the object, then nothing but whitespace. */
static int parse_event(parser *ps, nx_event *e) {
  skip_space(ps);
  if (!at(ps, '{'))
    return fail(ps, "not a JSON object");
  ps->p++;
  skip_space(ps);
  top t = {.kind = -1};
  bool last = at(ps, '}');
  if (last)
    ps->p++;
  while (!last) {
    int rc = parse_top_member(ps, &t, e);
    if (rc == 0)
      rc = member_end(ps, &last);
    if (rc)
      return rc;
  }
  skip_space(ps);
  if (ps->p != ps->end)
    return fail(ps, "trailing characters after the object at byte %zu",
                (size_t)(ps->p - ps->start) + 1);
  if (!t.have_type)
    return fail(ps, "missing field \"event_type\"");
  if (t.event_type < NX_PERSON || t.event_type > NX_BID)
    return fail(ps, "unknown event_type %" PRId64 " (0 person, 1 auction, "
                "2 bid)", t.event_type);
  if (t.kind < 0)
    return fail(ps, "missing the event object (\"person\", \"auction\" or "
                "\"bid\")");
  if (t.kind != t.event_type)
    return fail(ps, "event_type %" PRId64 " does not match the object \"%s\"",
                t.event_type, kinds[t.kind].name);
  e->type = t.kind;
  return 0;
}

int nx_json_parse(const char *line, size_t len, nx_event *out, char *storage,
                  size_t storage_bytes, char *err, size_t err_bytes) {
  parser ps = {.start = line, .p = line, .end = line + len, .store = storage,
               .store_left = storage_bytes, .err = err,
               .err_bytes = err_bytes};
  if (err && err_bytes)
    err[0] = 0;
  if (!out || (!line && len) || (!storage && len) || storage_bytes < len)
    return fail(&ps, "no line, view or storage (storage_bytes below the "
                "line's length)");
  pthread_once(&plain_once, plain_fill);
  memset(out, 0, sizeof *out);
  int rc = parse_event(&ps, out);
  if (rc)
    memset(out, 0, sizeof *out); /* nothing half-filled */
  return rc;
}

/* ------------------------------------------------------------ file source */

/* The operator's data, one block: this head, path_count offsets, then the
 * paths with their NULs. */
typedef struct file_list {
  uint64_t list_hash; /* of the paths' bytes, NULs included (note 4) */
  uint32_t path_count;
  uint32_t offset[]; /* of path i from the start of the block */
} file_list;

static const char *path_at(const file_list *list, uint32_t i) {
  assert(i < list->path_count);
  return (const char *)list + list->offset[i];
}

typedef struct file_reader {
  const file_list *list;
  uint32_t file;   /* being read; path_count once all are */
  int fd;          /* -1: the file is not open yet */
  uint64_t offset; /* the position: the next line's offset... */
  uint64_t line;   /* ...and number, from 1 */
  char *buffer;    /* unread bytes: [begin, end) */
  size_t begin, end, capacity;
  bool eof;
  bool stream;   /* a FIFO or device: poll before reading (note 9) */
  char *storage; /* parsed strings (FILE_MAX_LINE_BYTES) */
  uint64_t *record; /* NX_MAX_RECORD_BYTES */
} file_reader;

static int file_open(sl_ctx *ctx, void *user, void **state) {
  file_reader *fr = calloc(1, sizeof *fr);
  if (fr) {
    fr->list = user;
    fr->fd = -1;
    fr->line = 1;
    fr->capacity = FILE_MAX_LINE_BYTES + FILE_READ_BYTES;
    fr->buffer = malloc(fr->capacity);
    fr->storage = malloc(FILE_MAX_LINE_BYTES);
    fr->record = malloc(NX_MAX_RECORD_BYTES);
  }
  if (!fr || !fr->buffer || !fr->storage || !fr->record) {
    if (fr) {
      free(fr->buffer);
      free(fr->storage);
      free(fr->record);
      free(fr);
    }
    sl_ctx_fail(ctx, "out of memory");
    return -ENOMEM;
  }
  *state = fr;
  return 0;
}

static void file_shut(file_reader *fr) {
  if (fr->fd >= 0)
    close(fr->fd);
  fr->fd = -1;
  fr->begin = fr->end = 0;
  fr->eof = false;
  fr->stream = false;
}

static void file_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  file_reader *fr = state;
  file_shut(fr);
  free(fr->buffer);
  free(fr->storage);
  free(fr->record);
  free(fr);
}

static int errno_fail(sl_ctx *ctx, const char *what, const char *path) {
  int e = errno ? errno : EIO;
  sl_ctx_fail(ctx, "%s %s: %s", what, path, strerror(e));
  return -e;
}

/* Open file fr->file at its start; a FIFO or device without blocking
 * (note 9), a regular file then set back to blocking reads. */
static int file_start(sl_ctx *ctx, file_reader *fr) {
  const char *path = path_at(fr->list, fr->file);
  file_shut(fr);
  fr->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fr->fd < 0)
    return errno_fail(ctx, "cannot open event file", path);
  struct stat st;
  if (fstat(fr->fd, &st) != 0)
    return errno_fail(ctx, "cannot stat event file", path);
  fr->stream = !S_ISREG(st.st_mode);
  int flags = fr->stream ? 0 : fcntl(fr->fd, F_GETFL);
  if (flags < 0 || (!fr->stream &&
                    fcntl(fr->fd, F_SETFL, flags & ~O_NONBLOCK) != 0))
    return errno_fail(ctx, "cannot set up event file", path);
  fr->offset = 0;
  fr->line = 1;
  return 0;
}

/* What file_fill() and file_line() report besides a line and the end. */
#define FILE_WAIT 2 /* a FIFO or device had nothing for now (note 9) */

/* Move the unread bytes to the front and read more.  Returns 0,
 * FILE_WAIT or a negative errno with the instance failed. */
static int file_fill(sl_ctx *ctx, file_reader *fr) {
  memmove(fr->buffer, fr->buffer + fr->begin, fr->end - fr->begin);
  fr->end -= fr->begin;
  fr->begin = 0;
  assert(fr->end < fr->capacity);
  if (fr->stream) {
    struct pollfd p = {.fd = fr->fd, .events = POLLIN};
    int ready = poll(&p, 1, FILE_STREAM_WAIT_MS);
    if (ready == 0 || (ready < 0 && errno == EINTR))
      return FILE_WAIT;
    if (ready < 0)
      return errno_fail(ctx, "cannot wait for event file",
                        path_at(fr->list, fr->file));
  }
  for (;;) { /* retries only on EINTR */
    ssize_t got = read(fr->fd, fr->buffer + fr->end, fr->capacity - fr->end);
    if (got >= 0) {
      fr->end += (size_t)got;
      fr->eof = got == 0;
      return 0;
    }
    if (fr->stream && (errno == EAGAIN || errno == EWOULDBLOCK))
      return FILE_WAIT;
    if (errno != EINTR)
      return errno_fail(ctx, "cannot read event file",
                        path_at(fr->list, fr->file));
  }
}

/* The next line of the open file: 1 with *line and *bytes (no newline)
 * and *consumed (with it), 0 at its end, FILE_WAIT, negative on failure.
 * Takes it from the buffer (fr->offset moves once the line is handled). */
static int file_line(sl_ctx *ctx, file_reader *fr, const char **line,
                     size_t *bytes, size_t *consumed) {
  /* Each pass reads more or returns: bounded by the file's size. */
  for (;;) {
    char *start = fr->buffer + fr->begin;
    size_t unread = fr->end - fr->begin;
    char *newline = unread ? memchr(start, '\n', unread) : NULL;
    if (newline || (fr->eof && unread)) {
      size_t length = newline ? (size_t)(newline - start) : unread;
      if (length > FILE_MAX_LINE_BYTES)
        break;
      *consumed = newline ? length + 1 : length;
      fr->begin += *consumed;
      *line = start;
      *bytes = length;
      return 1;
    }
    if (fr->eof)
      return 0;
    if (unread > FILE_MAX_LINE_BYTES)
      break;
    int rc = file_fill(ctx, fr);
    if (rc)
      return rc; /* FILE_WAIT or a failure */
  }
  sl_ctx_fail(ctx, "%s line %" PRIu64 ": longer than %u bytes",
              path_at(fr->list, fr->file), fr->line, FILE_MAX_LINE_BYTES);
  return -EINVAL;
}

static bool blank(const char *line, size_t bytes) {
  for (size_t i = 0; i < bytes; i++)
    if (line[i] != ' ' && line[i] != '\t' && line[i] != '\r')
      return false;
  return true;
}

/* Parse, encode and emit one line (not blank). */
static int file_emit(sl_ctx *ctx, file_reader *fr, const char *text,
                     size_t bytes) {
  nx_event e;
  char why[256];
  if (nx_json_parse(text, bytes, &e, fr->storage, FILE_MAX_LINE_BYTES, why,
                    sizeof why) != 0) {
    sl_ctx_fail(ctx, "%s line %" PRIu64 ": %s", path_at(fr->list, fr->file),
                fr->line, why);
    return -EINVAL;
  }
  uint32_t size = nx_encode(&e, fr->record, NX_MAX_RECORD_BYTES);
  assert(size > 0 && size <= NX_MAX_RECORD_BYTES); /* parse checked it */
  int64_t date_time = e.type == NX_PERSON    ? e.u.person.date_time
                      : e.type == NX_AUCTION ? e.u.auction.date_time
                                             : e.u.bid.date_time;
  int rc = sl_emit_ts(ctx, fr->record, size, date_time);
  if (rc == SL_ETOOBIG)
    sl_ctx_fail(ctx, "%s line %" PRIu64 ": a record of %" PRIu32 " bytes is "
                "over the job's max_record_bytes", path_at(fr->list, fr->file),
                fr->line, size);
  return rc;
}

/* Note 5. */
static int file_next(sl_ctx *ctx, void *state) {
  file_reader *fr = state;
  uint32_t records = 0;
  uint64_t taken_bytes = 0;
  for (uint32_t lines = 0; lines < FILE_LINES_PER_CALL &&
                           records < FILE_RECORDS_PER_CALL &&
                           taken_bytes < FILE_BYTES_PER_CALL;
       lines++) {
    if (fr->file == fr->list->path_count)
      return SL_SOURCE_END;
    int rc = fr->fd < 0 ? file_start(ctx, fr) : 0;
    const char *text = NULL;
    size_t bytes = 0, consumed = 0;
    if (rc == 0)
      rc = file_line(ctx, fr, &text, &bytes, &consumed);
    if (rc < 0)
      return rc;
    if (rc == FILE_WAIT)
      return 0; /* note 9: back to the engine, which may stop or checkpoint */
    if (rc == 0) { /* the end of this file */
      file_shut(fr);
      fr->file++;
      fr->offset = 0;
      fr->line = 1;
      continue;
    }
    if (!blank(text, bytes)) {
      rc = file_emit(ctx, fr, text, bytes);
      if (rc)
        return rc; /* not emitted: the position stays before the line */
      records++;
    }
    fr->offset += consumed;
    fr->line++;
    taken_bytes += consumed;
  }
  return fr->file == fr->list->path_count ? SL_SOURCE_END : 0;
}

/* ------------------------------------------------------------ positions */

/* The saved position, in 64-bit words (notes 4, 7). */
enum file_position_word {
  FP_VERSION,   /* FILE_POSITION_VERSION */
  FP_FILE,      /* index of the file being read; path_count: all were */
  FP_OFFSET,    /* of the next line in it */
  FP_LINE,      /* that line's number */
  FP_LIST_HASH, /* of the path list */
  FP_KIND,      /* enum file_kind */
  FP_DEVICE,
  FP_INODE,
  FP_HEAD_HASH, /* XXH3 of the first FILE_IDENTITY_BYTES before the offset */
  FP_TAIL_HASH, /* ... of the last ones */
  FILE_POSITION_WORDS
};

enum file_kind {
  KIND_UNKNOWN = 0, /* nothing read yet, or a position of the old layout */
  KIND_REGULAR = 1,
  KIND_STREAM = 2, /* a FIFO or device: not readable again */
};

/* XXH3 of bytes [from, to) of fd.  Returns 0, ENODATA (the file ends
 * first) or an errno. */
static int hash_range(int fd, uint64_t from, uint64_t to, uint64_t *hash) {
  char bytes[FILE_IDENTITY_BYTES];
  assert(to >= from && to - from <= sizeof bytes);
  size_t want = (size_t)(to - from), got = 0;
  while (got < want) { /* each pass reads a byte or more, or returns */
    ssize_t n = pread(fd, bytes + got, want - got, (off_t)(from + got));
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return n < 0 ? errno : ENODATA;
    got += (size_t)n;
  }
  *hash = sl_hash_bytes(bytes, want);
  return 0;
}

/* The identity words (FP_KIND..FP_TAIL_HASH) of the file open on fd,
 * read up to offset.  Returns 0 or an errno (ENODATA: now shorter). */
static int identity_of(int fd, uint64_t offset, uint64_t *words) {
  memset(words + FP_KIND, 0, sizeof *words * (FILE_POSITION_WORDS - FP_KIND));
  struct stat st;
  if (offset == 0)
    return 0; /* nothing read: any file will do */
  if (fstat(fd, &st) != 0)
    return errno;
  words[FP_KIND] = S_ISREG(st.st_mode) ? KIND_REGULAR : KIND_STREAM;
  if (words[FP_KIND] == KIND_STREAM)
    return 0;
  words[FP_DEVICE] = (uint64_t)st.st_dev;
  words[FP_INODE] = (uint64_t)st.st_ino;
  uint64_t head = offset < FILE_IDENTITY_BYTES ? offset : FILE_IDENTITY_BYTES;
  int rc = hash_range(fd, 0, head, &words[FP_HEAD_HASH]);
  return rc ? rc : hash_range(fd, offset - head, offset, &words[FP_TAIL_HASH]);
}

static int file_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  const file_reader *fr = state;
  assert(fr->file <= fr->list->path_count);
  uint64_t words[FILE_POSITION_WORDS] = {
      [FP_VERSION] = FILE_POSITION_VERSION, [FP_FILE] = fr->file,
      [FP_OFFSET] = fr->offset, [FP_LINE] = fr->line,
      [FP_LIST_HASH] = fr->list->list_hash};
  int rc = fr->fd >= 0 ? identity_of(fr->fd, fr->offset, words) : 0;
  if (rc) {
    sl_ctx_fail(ctx, "checkpoint %" PRIu64 ": event file %s %s", id,
                path_at(fr->list, fr->file), rc == ENODATA
                    ? "was truncated below the position while it was read"
                    : strerror(rc));
    return -rc;
  }
  assert(fr->offset == 0 || fr->fd < 0 || words[FP_KIND] != KIND_UNKNOWN);
  return sl_operator_state_set(ctx, words, sizeof words);
}

/* The saved position into words in the current layout (an old one gets
 * KIND_UNKNOWN).  Returns 0, SL_ENOTFOUND or -EINVAL (instance failed). */
static int read_position(sl_ctx *ctx, uint64_t id, uint64_t *words) {
  const void *data;
  uint32_t bytes;
  int rc = sl_operator_state_get(ctx, &data, &bytes);
  if (rc)
    return rc;
  memset(words, 0, sizeof *words * FILE_POSITION_WORDS);
  if (bytes == sizeof *words * FILE_POSITION_WORDS_V1) {
    memcpy(words + FP_FILE, data, bytes); /* same order, one word later */
    words[FP_VERSION] = 1;
    return 0;
  }
  if (bytes == sizeof *words * FILE_POSITION_WORDS)
    memcpy(words, data, bytes);
  if (bytes != sizeof *words * FILE_POSITION_WORDS ||
      words[FP_VERSION] != FILE_POSITION_VERSION) {
    sl_ctx_fail(ctx, "checkpoint %" PRIu64 ": the event-file position is %"
                PRIu32 " bytes of version %" PRIu64 ", a format this build "
                "does not read", id, bytes, words[FP_VERSION]);
    return -EINVAL;
  }
  return 0;
}

/* Why the open file is not the one words were taken in (note 8), into
 * why; false if it is.  *rc: 0, or an errno of reading it. */
static bool input_changed(int fd, const uint64_t *words, char *why,
                          size_t why_bytes, int *rc) {
  uint64_t offset = words[FP_OFFSET];
  struct stat st;
  *rc = 0;
  if (offset == 0)
    return false;
  if (fstat(fd, &st) != 0)
    return (*rc = errno), false;
  if (!S_ISREG(st.st_mode) || words[FP_KIND] == KIND_STREAM)
    return snprintf(why, why_bytes, "is not a regular file (a pipe, FIFO "
                    "or device): the %" PRIu64 " bytes read before the "
                    "checkpoint cannot be read again", offset), true;
  if (words[FP_KIND] == KIND_REGULAR &&
      (words[FP_DEVICE] != (uint64_t)st.st_dev ||
       words[FP_INODE] != (uint64_t)st.st_ino))
    return snprintf(why, why_bytes, "was replaced: it is now inode %" PRIu64
                    " on device %" PRIu64 ", the checkpoint read inode %"
                    PRIu64 " on device %" PRIu64, (uint64_t)st.st_ino,
                    (uint64_t)st.st_dev, words[FP_INODE], words[FP_DEVICE]),
           true;
  uint64_t now[FILE_POSITION_WORDS];
  int e = (uint64_t)st.st_size < offset ? ENODATA
          : words[FP_KIND] == KIND_REGULAR ? identity_of(fd, offset, now)
                                           : 0;
  if (e == ENODATA)
    return snprintf(why, why_bytes, "was truncated below the checkpointed "
                    "position: it is %" PRIu64 " bytes, the position is "
                    "byte %" PRIu64, (uint64_t)st.st_size, offset), true;
  if (e)
    return (*rc = e), false;
  if (words[FP_KIND] == KIND_REGULAR &&
      (now[FP_HEAD_HASH] != words[FP_HEAD_HASH] ||
       now[FP_TAIL_HASH] != words[FP_TAIL_HASH]))
    return snprintf(why, why_bytes, "changed before the checkpointed "
                    "position (byte %" PRIu64 "): its %s bytes differ from "
                    "those read", offset,
                    now[FP_HEAD_HASH] != words[FP_HEAD_HASH] ? "first 4 KiB"
                    : "last 4 KiB before the position"), true;
  return false;
}

static int file_restore(sl_ctx *ctx, void *state, uint64_t id) {
  file_reader *fr = state;
  const file_list *list = fr->list;
  uint64_t words[FILE_POSITION_WORDS];
  int rc = read_position(ctx, id, words);
  if (rc == SL_ENOTFOUND)
    return 0; /* nothing saved: from the beginning */
  if (rc)
    return rc;
  if (words[FP_LIST_HASH] != list->list_hash ||
      words[FP_FILE] > list->path_count) {
    sl_ctx_fail(ctx, "checkpoint %" PRIu64 " was taken reading another list "
                "of event files (now %" PRIu32 " files, the first %s)", id,
                list->path_count, path_at(list, 0));
    return -EINVAL;
  }
  file_shut(fr);
  fr->file = (uint32_t)words[FP_FILE];
  fr->offset = 0;
  fr->line = 1;
  if (fr->file == list->path_count)
    return 0; /* every file was read */
  const char *path = path_at(list, fr->file);
  rc = file_start(ctx, fr);
  if (rc)
    return rc;
  char why[512];
  if (input_changed(fr->fd, words, why, sizeof why, &rc)) {
    sl_ctx_fail(ctx, "checkpoint %" PRIu64 ": event file %s %s; it cannot be "
                "resumed from there (the position is line %" PRIu64 ", byte %"
                PRIu64 ")", id, path, why, words[FP_LINE], words[FP_OFFSET]);
    return -EINVAL;
  }
  if (rc)
    return errno = rc, errno_fail(ctx, "cannot read event file", path);
  if (words[FP_OFFSET] &&
      lseek(fr->fd, (off_t)words[FP_OFFSET], SEEK_SET) < 0)
    return errno_fail(ctx, "cannot seek in event file", path);
  fr->offset = words[FP_OFFSET];
  fr->line = words[FP_LINE];
  return 0;
}

/* The list as one block (file_list), malloc'd; NULL: ENOMEM. */
static file_list *list_of(const char *const *paths, uint32_t count,
                          size_t *bytes) {
  size_t head = sizeof(file_list) + count * sizeof(uint32_t);
  head = (head + 7u) & ~(size_t)7u;
  size_t total = head;
  for (uint32_t i = 0; i < count; i++)
    total += strlen(paths[i]) + 1;
  file_list *list = calloc(1, (total + 7u) & ~(size_t)7u);
  if (!list)
    return NULL;
  *bytes = (total + 7u) & ~(size_t)7u;
  list->path_count = count;
  char *p = (char *)list + head;
  for (uint32_t i = 0; i < count; i++) {
    size_t n = strlen(paths[i]) + 1;
    list->offset[i] = (uint32_t)(p - (char *)list);
    memcpy(p, paths[i], n);
    p += n;
  }
  list->list_hash = sl_hash_bytes((char *)list + head, total - head);
  assert(p == (char *)list + total);
  return list;
}

int nx_source_file(sl_job *job, const char *name, const char *const *paths,
                   int path_count, const nx_source_config *source,
                   sl_op **op) {
  if (!job || !op || !paths || path_count < 1 ||
      (source && source->watermark_lag_ms < 0))
    return EINVAL;
  for (int i = 0; i < path_count; i++)
    if (!paths[i] || !paths[i][0] || strlen(paths[i]) >= FILE_PATH_BYTES)
      return EINVAL;
  size_t bytes = 0;
  file_list *list = list_of(paths, (uint32_t)path_count, &bytes);
  if (!list)
    return ENOMEM;
  static const sl_source_ops ops = {.open = file_open,
                                    .next = file_next,
                                    .close = file_close,
                                    .snapshot = file_snapshot,
                                    .restore = file_restore};
  int rc = sl_op_source(job, name, 1, &ops, list, op);
  if (rc) {
    free(list);
    return rc;
  }
  rc = sl_op_set_user_free(*op, free); /* the job frees the list */
  assert(rc == 0);
  sl_watermark_config wc = {
      .out_of_orderness = source && source->watermark_lag_ms
                              ? source->watermark_lag_ms
                              : DEFAULT_WATERMARK_LAG_MS,
      .every_call = source && source->deterministic_watermarks};
  return sl_op_watermarks(*op, &wc);
}
