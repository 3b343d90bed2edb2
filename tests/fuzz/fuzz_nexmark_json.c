/* fuzz_nexmark_json.c — libFuzzer target: the Nexmark event parser
 * (nexmark/json.c, nx_json_parse) over every line of the input.
 *
 * An event it accepts must be one it can write back (nx_json_write) and
 * read again to the same event: the writer and the parser share one table
 * of fields (json.c note 1), so a difference is a bug in one of them.  Its
 * strings must be well-formed UTF-8 and its times valid event times (the
 * library's rules: utf8_check.h, time_check.h), as the JSON-lines source
 * of the library requires.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_lines.h"
#include "nexmark.h"
#include "time_check.h"
#include "utf8_check.h"

#define ERR_BYTES 256

static int string_is(nx_str a, nx_str b) {
  return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0);
}

/* A string of an accepted event: within its limit and inside storage. */
static void check_string(nx_str s, const char *storage, size_t bytes) {
  FUZZ_CHECK(s.len <= NX_MAX_STRING_BYTES);
  if (s.len > 0)
    FUZZ_CHECK(s.ptr >= storage && s.ptr + s.len <= storage + bytes);
  const char *why = 0;
  FUZZ_CHECK(sl_utf8_invalid_at(s.ptr, s.len, &why) == s.len);
}

/* The event times of an accepted event (json.c note 7). */
static void check_times(const nx_event *e) {
  if (e->type == NX_PERSON) {
    FUZZ_CHECK(sl_time_valid(e->u.person.date_time));
  } else if (e->type == NX_AUCTION) {
    FUZZ_CHECK(sl_time_valid(e->u.auction.date_time));
    FUZZ_CHECK(sl_time_valid(e->u.auction.expires));
  } else {
    FUZZ_CHECK(sl_time_valid(e->u.bid.date_time));
  }
}

static void check_strings(const nx_event *e, const char *storage,
                          size_t bytes) {
  if (e->type == NX_PERSON) {
    const nx_person *p = &e->u.person;
    nx_str all[] = {p->name, p->email_address, p->credit_card, p->city,
                    p->state, p->extra};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
      check_string(all[i], storage, bytes);
  } else if (e->type == NX_AUCTION) {
    const nx_auction *a = &e->u.auction;
    nx_str all[] = {a->item_name, a->description, a->extra};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
      check_string(all[i], storage, bytes);
  } else {
    FUZZ_CHECK(e->type == NX_BID);
    const nx_bid *b = &e->u.bid;
    nx_str all[] = {b->channel, b->url, b->extra};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
      check_string(all[i], storage, bytes);
  }
}

static int same_event(const nx_event *x, const nx_event *y) {
  if (x->type != y->type)
    return 0;
  if (x->type == NX_PERSON) {
    const nx_person *a = &x->u.person, *b = &y->u.person;
    return a->id == b->id && a->date_time == b->date_time &&
           string_is(a->name, b->name) &&
           string_is(a->email_address, b->email_address) &&
           string_is(a->credit_card, b->credit_card) &&
           string_is(a->city, b->city) && string_is(a->state, b->state) &&
           string_is(a->extra, b->extra);
  }
  if (x->type == NX_AUCTION) {
    const nx_auction *a = &x->u.auction, *b = &y->u.auction;
    return a->id == b->id && a->initial_bid == b->initial_bid &&
           a->reserve == b->reserve && a->date_time == b->date_time &&
           a->expires == b->expires && a->seller == b->seller &&
           a->category == b->category &&
           string_is(a->item_name, b->item_name) &&
           string_is(a->description, b->description) &&
           string_is(a->extra, b->extra);
  }
  const nx_bid *a = &x->u.bid, *b = &y->u.bid;
  return a->auction == b->auction && a->bidder == b->bidder &&
         a->price == b->price && a->date_time == b->date_time &&
         string_is(a->channel, b->channel) && string_is(a->url, b->url) &&
         string_is(a->extra, b->extra);
}

/* Write e, parse the text back and compare. */
static void round_trip(const nx_event *e) {
  size_t need = nx_json_write(e, 0, 0);
  FUZZ_CHECK(need > 0);
  char *text = malloc(need + 1);
  char *storage = malloc(need + 1);
  if (!text || !storage)
    abort();
  FUZZ_CHECK(nx_json_write(e, text, need + 1) == need);
  FUZZ_CHECK(text[need - 1] == '\n');
  nx_event again;
  char err[ERR_BYTES];
  int rc = nx_json_parse(text, need - 1, &again, storage, need + 1, err,
                         sizeof err);
  if (rc != 0)
    fprintf(stderr, "written %.*s read back as: %s\n", (int)need - 1, text,
            err);
  FUZZ_CHECK(rc == 0);
  FUZZ_CHECK(same_event(e, &again));
  free(text);
  free(storage);
}

static int parse_one(void *arg, const char *line, size_t bytes) {
  (void)arg;
  char *storage = malloc(bytes); /* exactly the line's length (json.c) */
  if (!storage)
    abort();
  nx_event e;
  char err[ERR_BYTES] = "";
  int rc = nx_json_parse(line, bytes, &e, storage, bytes, err, sizeof err);
  FUZZ_CHECK(rc == 0 || rc == EINVAL);
  FUZZ_CHECK(memchr(err, 0, sizeof err) != 0);
  if (rc == 0) {
    check_strings(&e, storage, bytes);
    check_times(&e);
    round_trip(&e);
  } else {
    FUZZ_CHECK(err[0] != 0);
  }
  free(storage);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_each_line(data, size, parse_one, 0);
  return 0;
}
