/* format.c — the Nexmark query results as CSV lines: nx_query_format
 * (nexmark.h) checks a record's size against its query's row (query.h
 * note 7) and prints it. */

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "query.h"

/* CSV lines. */

/* A line being written: bytes past capacity are counted, not written, so
 * length ends as the length needed. */
typedef struct line {
  char *buffer;
  uint32_t capacity;
  uint32_t length;
} line;

static void put_bytes(line *l, const char *bytes, uint32_t n) {
  if (l->length <= l->capacity && n <= l->capacity - l->length)
    memcpy(l->buffer + l->length, bytes, n);
  l->length += n;
}

static void put_char(line *l, char c) { put_bytes(l, &c, 1); }

static void put_u64(line *l, uint64_t v) {
  char digits[20];
  int n = 0;
  do { /* at most 20 digits */
    digits[19 - n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v > 0);
  put_bytes(l, digits + 20 - n, (uint32_t)n);
}

static uint64_t magnitude(int64_t v) {
  return v < 0 ? (uint64_t)-(v + 1) + 1u : (uint64_t)v;
}

static void put_i64(line *l, int64_t v) {
  if (v < 0)
    put_char(l, '-');
  put_u64(l, magnitude(v));
}

/* A value in thousandths with exactly three decimals: 1234 -> 1.234. */
static void put_thousandths(line *l, int64_t v) {
  uint64_t m = magnitude(v);
  if (v < 0)
    put_char(l, '-');
  put_u64(l, m / 1000);
  char frac[4] = {'.', (char)('0' + m / 100 % 10), (char)('0' + m / 10 % 10),
                  (char)('0' + m % 10)};
  put_bytes(l, frac, sizeof frac);
}

/* A string field, quoted as RFC 4180 when it holds a comma, a quote, CR or
 * LF (quotes inside doubled). */
static void put_text(line *l, const char *text, uint32_t n) {
  bool quote = false;
  for (uint32_t i = 0; i < n && !quote; i++)
    quote = text[i] == ',' || text[i] == '"' || text[i] == '\r' ||
            text[i] == '\n';
  if (!quote) {
    put_bytes(l, text, n);
    return;
  }
  put_char(l, '"');
  uint32_t from = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (text[i] != '"')
      continue;
    put_bytes(l, text + from, i + 1 - from); /* up to the quote, with it */
    put_char(l, '"');
    from = i + 1;
  }
  put_bytes(l, text + from, n - from);
  put_char(l, '"');
}

/* Integers separated by commas. */
static void put_integers(line *l, const int64_t *v, int n) {
  for (int i = 0; i < n; i++) {
    if (i > 0)
      put_char(l, ',');
    put_i64(l, v[i]);
  }
}

static bool format_q3(line *l, const sl_record *in) {
  if (in->size_bytes < sizeof(q3_row))
    return false;
  q3_row head;
  memcpy(&head, in->data, sizeof head);
  const char *text = (const char *)in->data + sizeof head;
  if (in->size_bytes !=
      sizeof head + (uint32_t)head.name_len + head.city_len + head.state_len)
    return false;
  put_text(l, text, head.name_len);
  put_char(l, ',');
  put_text(l, text + head.name_len, head.city_len);
  put_char(l, ',');
  put_text(l, text + head.name_len + head.city_len, head.state_len);
  put_char(l, ',');
  put_i64(l, head.id);
  return true;
}

static bool format_q8(line *l, const sl_record *in) {
  if (in->size_bytes < sizeof(q8_row))
    return false;
  q8_row head;
  memcpy(&head, in->data, sizeof head);
  if (in->size_bytes != sizeof head + (uint64_t)head.name_len)
    return false;
  put_integers(l, &head.start, 3);
  put_char(l, ',');
  put_text(l, (const char *)in->data + sizeof head, head.name_len);
  return true;
}

/* The fixed-size rows: their size, and how many leading integers are
 * printed as they are. */
static bool format_fixed(line *l, int q, const sl_record *in) {
  static const struct {
    int q;
    uint32_t bytes;
  } sizes[] = {{NX_Q0, sizeof(bid_row)}, {NX_Q1, sizeof(bid_row)},
               {NX_Q2, sizeof(q2_row)},  {NX_Q4, sizeof(q4_row)},
               {NX_Q5, sizeof(q5_row)},  {NX_Q7, sizeof(q7_row)},
               {NX_Q11, sizeof(q11_row)}};
  uint32_t bytes = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    if (sizes[i].q == q)
      bytes = sizes[i].bytes;
  if (bytes == 0 || in->size_bytes != bytes)
    return false;
  int64_t v[6];
  assert(bytes <= sizeof v);
  memcpy(v, in->data, bytes);
  if (q == NX_Q1) { /* price in thousandths */
    put_integers(l, v, 2);
    put_char(l, ',');
    put_thousandths(l, v[2]);
    put_char(l, ',');
    put_i64(l, v[3]);
  } else if (q == NX_Q4) { /* average in thousandths */
    put_i64(l, v[0]);
    put_char(l, ',');
    put_thousandths(l, v[1]);
  } else {
    put_integers(l, v, (int)(bytes / 8));
  }
  return true;
}

int nx_query_format(void *query, const sl_record *in, char *buffer,
                    uint32_t buffer_bytes) {
  int q = (int)(intptr_t)query;
  if (in == NULL || (buffer == NULL && buffer_bytes > 0))
    return -EINVAL;
  line l = {buffer, buffer_bytes, 0};
  bool ok;
  if (q == NX_Q3)
    ok = format_q3(&l, in);
  else if (q == NX_Q8)
    ok = format_q8(&l, in);
  else
    ok = format_fixed(&l, q, in);
  assert(!ok || l.length > 0);
  return ok ? (int)l.length : -EINVAL;
}
