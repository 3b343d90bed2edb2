/* test_nexmark_queries.c — the Nexmark queries (nexmark/q*.c)
 * on small hand-built event sequences with hand-checked CSV lines, at
 * parallelism 1 and 3; CSV quoting, nx_query_format()'s buffer contract,
 * nx_query_parse() and the query table.
 *
 * A source of parallelism 1 emits the test's events in the given order,
 * one per next() call, each nx_encode()d and stamped with its date_time,
 * with a watermark after every call (max - bound - 1).  The query runs at
 * parallelism P behind it; a callback sink formats every result with
 * nx_query_format() into per-instance arrays (checking the too-small-buffer
 * contract on every record as it goes).  The lines are then sorted and
 * compared with the expected ones, also sorted: rows carry no order.
 *
 * Unless a test says otherwise no event is late (each is within the bound
 * of the ones before it), so the output does not depend on timing.  The
 * late-record test has its source wait, before the late event, until the
 * operator that judges it has seen the watermark before it.  One q5 test
 * checkpoints: its source holds its end until the checkpoint it triggers
 * after the last event completed, and it counts what q5.count_buckets wrote.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nexmark.h"
#include "sluice.h"
#include "sluice_testing.h" /* unstable test helpers */
#include "test_dirs.h"
#include "test_util.h"

#define MAX_P 4
#define B 1000000 /* a base time, a multiple of every window size */

/* ----------------------------------------------------------- events */

static nx_str str(const char *s) { return (nx_str){s, (uint32_t)strlen(s)}; }

static nx_event person(int64_t id, const char *name, const char *city,
                       const char *state, int64_t t) {
  nx_event e = {.type = NX_PERSON};
  e.u.person = (nx_person){.id = id, .name = str(name),
                           .email_address = str("x@y"), .credit_card = str(""),
                           .city = str(city), .state = str(state),
                           .date_time = t, .extra = str("")};
  return e;
}

static nx_event auction(int64_t id, int64_t seller, int64_t category,
                        int64_t t, int64_t expires) {
  nx_event e = {.type = NX_AUCTION};
  e.u.auction = (nx_auction){.id = id, .item_name = str("item"),
                             .description = str(""), .initial_bid = 1,
                             .reserve = 2, .date_time = t,
                             .expires = expires, .seller = seller,
                             .category = category, .extra = str("")};
  return e;
}

static nx_event bid(int64_t auction_id, int64_t bidder, int64_t price,
                    int64_t t) {
  nx_event e = {.type = NX_BID};
  e.u.bid = (nx_bid){.auction = auction_id, .bidder = bidder,
                     .price = price, .channel = str("web"), .url = str(""),
                     .date_time = t, .extra = str("")};
  return e;
}

static int64_t event_time(const nx_event *e) {
  switch (e->type) {
  case NX_PERSON:
    return e->u.person.date_time;
  case NX_AUCTION:
    return e->u.auction.date_time;
  default:
    return e->u.bid.date_time;
  }
}

/* ----------------------------------------------------------- the source */

typedef struct feed {
  const nx_event *events;
  size_t n;
  size_t pos;
  int garbage; /* emit one 3-byte record instead of the events */
  /* Before event sync_at (if > 0): wait until operator sync_op's watermark
   * has reached this source's (see the top). */
  size_t sync_at;
  const char *sync_op;
  sl_job *job;
  bool hold_end; /* after the last event, end only once a checkpoint did */
  _Alignas(8) uint8_t record[NX_MAX_RECORD_BYTES];
} feed;

static int64_t op_watermark(sl_job *job, const char *name) {
  for (int i = 0; i < sl_job_operator_count(job); i++) {
    sl_op_stats s;
    if (sl_job_stats(job, i, &s) == 0 && strcmp(s.name, name) == 0)
      return s.watermark;
  }
  return SL_WATERMARK_MIN;
}

static void feed_sync(sl_ctx *ctx, feed *f) {
  int64_t target = sl_ctx_watermark(ctx);
  /* At most 10 s; the test then fails on its counts. */
  for (int i = 0; i < 10000 && !sl_ctx_stopping(ctx); i++) {
    if (op_watermark(f->job, f->sync_op) >= target)
      return;
    sl_test_sleep_us(1000);
  }
}

static int feed_next(sl_ctx *ctx, void *state) {
  feed *f = state;
  if (f->garbage) {
    f->garbage = 0;
    uint64_t junk = 0;
    return sl_emit_ts(ctx, &junk, 3, B);
  }
  if (f->pos == f->n && f->hold_end && !sl_ctx_stopping(ctx) &&
      sl_job_last_checkpoint(f->job, NULL) == 0) {
    sl_test_sleep_us(1000);
    return 0;
  }
  if (f->pos == f->n)
    return SL_SOURCE_END;
  if (f->sync_at > 0 && f->pos == f->sync_at)
    feed_sync(ctx, f);
  const nx_event *e = &f->events[f->pos++];
  uint32_t size = nx_encode(e, f->record, sizeof f->record);
  if (size == 0 || size > sizeof f->record)
    return -1;
  return sl_emit_ts(ctx, f->record, size, event_time(e));
}

/* ----------------------------------------------------------- the sink */

typedef struct lines {
  char **line;
  size_t count, capacity;
} lines;

typedef struct collector {
  int query;
  lines per_instance[MAX_P];
  _Atomic int errors; /* format contract violations */
} collector;

static void lines_add(lines *l, char *text) {
  if (l->count == l->capacity) {
    l->capacity = l->capacity ? 2 * l->capacity : 64;
    l->line = realloc(l->line, l->capacity * sizeof *l->line);
    if (!l->line)
      abort();
  }
  l->line[l->count++] = text;
}

/* Format rec, checking the contract: the length needed comes back for a
 * buffer of 0 and of one byte too few, and nothing is written past the
 * buffer; then the full line. */
static char *format_checked(collector *c, const sl_record *rec) {
  void *q = (void *)(intptr_t)c->query;
  int need = nx_query_format(q, rec, NULL, 0);
  if (need <= 0)
    return NULL;
  char *text = malloc((size_t)need + 2);
  if (!text)
    abort();
  memset(text, '#', (size_t)need + 2);
  int again = nx_query_format(q, rec, text, (uint32_t)need - 1);
  if (again != need || text[need - 1] != '#')
    c->errors++;
  int full = nx_query_format(q, rec, text, (uint32_t)need);
  if (full != need || text[need] != '#')
    c->errors++;
  text[need] = '\0';
  return text;
}

static int collect(void *user, int instance, const sl_record *rec) {
  collector *c = user;
  if (instance < 0 || instance >= MAX_P)
    return -1;
  char *text = format_checked(c, rec);
  if (!text)
    return -1;
  lines_add(&c->per_instance[instance], text);
  return 0;
}

/* ----------------------------------------------------------- running */

typedef struct run_result {
  char **line; /* sorted */
  size_t count;
  int errors;
  uint64_t late; /* late_records of the operator named late_op */
} run_result;

static int compare_text(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void gather(collector *c, int p, run_result *out) {
  size_t total = 0;
  for (int i = 0; i < p; i++)
    total += c->per_instance[i].count;
  out->line = calloc(total ? total : 1, sizeof *out->line);
  cr_assert(out->line);
  for (int i = 0; i < p; i++) {
    lines *l = &c->per_instance[i];
    for (size_t k = 0; k < l->count; k++)
      out->line[out->count++] = l->line[k];
    free(l->line);
  }
  qsort(out->line, out->count, sizeof *out->line, compare_text);
  out->errors = c->errors;
}

typedef struct run_config {
  int query, parallelism;
  const nx_event *events;
  size_t n;
  int64_t bound; /* out_of_orderness of the source's watermarks */
  size_t sync_at;
  const char *sync_op;
  const char *late_op;
  int garbage;
} run_config;

static void run_query(const run_config *rc, run_result *out, int *status,
                      char *error, size_t error_bytes) {
  sl_job_config cfg = {.struct_bytes = sizeof(sl_job_config), .ring_bytes = 1u << 16};
  sl_job *job;
  cr_assert_eq(sl_job_create(&cfg, &job), 0);
  feed *f = calloc(1, sizeof *f);
  collector *c = calloc(1, sizeof *c);
  cr_assert(f && c);
  *f = (feed){.events = rc->events, .n = rc->n, .job = job,
              .sync_at = rc->sync_at, .sync_op = rc->sync_op,
              .garbage = rc->garbage};
  c->query = rc->query;
  sl_source_ops ops = {.next = feed_next};
  sl_op *src, *result, *sink;
  cr_assert_eq(sl_op_source(job, "events", 1, &ops, f, &src), 0);
  sl_watermark_config w = {.out_of_orderness = rc->bound, .every_call = 1};
  cr_assert_eq(sl_op_watermarks(src, &w), 0);
  cr_assert_eq(nx_query_build(job, rc->query, src, rc->parallelism, &result),
               0, "%s", sl_job_error(job));
  cr_assert_eq(sl_sink_callback(job, "sink", result, rc->parallelism, collect,
                                c, &sink), 0);
  sl_test_watchdog dog;
  cr_assert_eq(sl_test_watchdog_arm(&dog, job, 60, "query run"), 0);
  *status = sl_job_run(job);
  cr_assert_not(sl_test_watchdog_disarm(&dog), "the job hung");
  snprintf(error, error_bytes, "%s", sl_job_error(job));
  *out = (run_result){0};
  for (int i = 0; rc->late_op && i < sl_job_operator_count(job); i++) {
    sl_op_stats s;
    if (sl_job_stats(job, i, &s) == 0 && strcmp(s.name, rc->late_op) == 0)
      out->late = s.late_records;
  }
  sl_job_destroy(job);
  gather(c, rc->parallelism, out);
  free(c);
  free(f);
}

static void free_result(run_result *r) {
  for (size_t i = 0; i < r->count; i++)
    free(r->line[i]);
  free(r->line);
}

/* Run rc at parallelism 1 and 3; the sorted lines must be expected. */
static void expect_lines(run_config rc, const char *const *expected,
                         size_t m) {
  char **want = malloc((m ? m : 1) * sizeof *want);
  cr_assert(want);
  memcpy(want, expected, m * sizeof *want);
  qsort(want, m, sizeof *want, compare_text);
  static const int parallelism[] = {1, 3};
  for (int k = 0; k < 2; k++) {
    rc.parallelism = parallelism[k];
    run_result got;
    int status;
    char error[512];
    run_query(&rc, &got, &status, error, sizeof error);
    cr_assert_eq(status, 0, "q%d P%d: %s", rc.query, rc.parallelism, error);
    cr_assert_eq(got.errors, 0, "q%d: nx_query_format broke its contract",
                 rc.query);
    for (size_t i = 0; i < got.count && i < m; i++)
      cr_expect_str_eq(got.line[i], want[i], "q%d P%d line %zu", rc.query,
                       rc.parallelism, i);
    cr_assert_eq(got.count, m, "q%d P%d: %zu lines, expected %zu", rc.query,
                 rc.parallelism, got.count, m);
    free_result(&got);
  }
  free(want);
}

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* ----------------------------------------------------------- q0, q1, q2 */

Test(nexmark_queries, q0_passes_every_bid_and_nothing_else) {
  nx_event ev[] = {
      person(1000, "Ann", "Paris", "OR", B), bid(1000, 7, 42, B + 1),
      auction(1000, 1000, 10, B + 2, B + 90), bid(1001, 8, 0, B + 3),
      bid(-5, -6, 9223372036854775807LL, B + 4)};
  static const char *const want[] = {
      "1000,7,42,1000001", "1001,8,0,1000003",
      "-5,-6,9223372036854775807,1000004"};
  expect_lines((run_config){.query = NX_Q0, .events = ev, .n = COUNT(ev),
                            .bound = 10},
               want, COUNT(want));
}

Test(nexmark_queries, q1_prints_the_converted_price_exactly) {
  nx_event ev[] = {bid(1, 2, 1, B),         bid(1, 2, 7, B + 1),
                   bid(1, 2, 1000, B + 2),  bid(1, 2, 1001, B + 3),
                   bid(1, 2, 0, B + 4),     bid(1, 2, 123456, B + 5),
                   bid(1, 2, 11, B + 6),    person(5, "P", "C", "CA", B + 7)};
  /* 1*908 = 908, 7*908 = 6356, 11*908 = 9988, 123456*908 = 112098048 */
  static const char *const want[] = {
      "1,2,0.908,1000000",      "1,2,6.356,1000001",
      "1,2,908.000,1000002",    "1,2,908.908,1000003",
      "1,2,0.000,1000004",      "1,2,112098.048,1000005",
      "1,2,9.988,1000006"};
  expect_lines((run_config){.query = NX_Q1, .events = ev, .n = COUNT(ev),
                            .bound = 10},
               want, COUNT(want));
}

Test(nexmark_queries, q2_selects_auctions_divisible_by_123) {
  nx_event ev[] = {bid(0, 1, 10, B),      bid(123, 1, 11, B + 1),
                   bid(124, 1, 12, B + 2), bid(246, 1, 13, B + 3),
                   bid(1000, 1, 14, B + 4), bid(1107, 1, 15, B + 5),
                   bid(122, 1, 16, B + 6), auction(123, 1, 10, B + 7, B + 9)};
  static const char *const want[] = {"0,10", "123,11", "246,13", "1107,15"};
  expect_lines((run_config){.query = NX_Q2, .events = ev, .n = COUNT(ev),
                            .bound = 10},
               want, COUNT(want));
}

/* ----------------------------------------------------------- q3 */

Test(nexmark_queries, q3_joins_filtered_sellers_and_quotes_names) {
  nx_event ev[] = {
      person(1001, "Alice", "Portland", "OR", B),
      person(1002, "Walt", "Seattle", "WA", B + 1),
      auction(2001, 1001, 10, B + 2, B + 100),
      auction(2002, 1001, 10, B + 3, B + 100),
      auction(2003, 1001, 11, B + 4, B + 100), /* category 11 */
      auction(2004, 1002, 10, B + 5, B + 100), /* seller in WA */
      auction(2005, 1003, 10, B + 6, B + 100), /* before its seller */
      person(1003, "Smith, \"Bo\"", "Boise", "CA", B + 7),
      person(1004, "Ida", "Line\nBreak", "ID", B + 8),
      auction(2006, 1004, 10, B + 9, B + 100),
      auction(2007, 1004, 10, B + 10, B + 100),
      auction(2008, 1005, 10, B + 11, B + 100), /* no such person */
      person(1006, "Cal", "LA", "ca", B + 12),  /* lower case: not CA */
      auction(2009, 1006, 10, B + 13, B + 100),
  };
  static const char *const want[] = {
      "Alice,Portland,OR,2001", "Alice,Portland,OR,2002",
      "\"Smith, \"\"Bo\"\"\",Boise,CA,2005", "Ida,\"Line\nBreak\",ID,2006",
      "Ida,\"Line\nBreak\",ID,2007"};
  expect_lines((run_config){.query = NX_Q3, .events = ev, .n = COUNT(ev),
                            .bound = 10},
               want, COUNT(want));
}

/* ----------------------------------------------------------- q4 */

Test(nexmark_queries, q4_averages_winning_bids_per_category) {
  nx_event ev[64];
  size_t n = 0;
  /* Category 10: auction 3001 [B+1000, B+5000]: bids before its start and
   * after its expiry are ignored, both bounds count; winner 90.  Auction
   * 3002 [B+2000, B+8000]: its first bid arrives before it (out of order
   * within the bound); winner 20.  Average 55. */
  ev[n++] = auction(3001, 1, 10, B + 1000, B + 5000);
  ev[n++] = bid(3001, 1, 999, B + 999);
  ev[n++] = bid(3001, 1, 50, B + 1000);
  ev[n++] = bid(3002, 1, 20, B + 2500);
  ev[n++] = auction(3002, 1, 10, B + 2000, B + 8000);
  ev[n++] = bid(3002, 1, 10, B + 3000);
  ev[n++] = bid(3001, 1, 80, B + 3000);
  ev[n++] = bid(3001, 1, 90, B + 5000);
  ev[n++] = bid(3001, 1, 500, B + 5001);
  /* Category 11: 16 winners summing to 17: 1.0625 rounds up to 1.063. */
  for (int i = 0; i < 16; i++) {
    ev[n++] = auction(3100 + i, 2, 11, B + 6000 + i, B + 7000);
    ev[n++] = bid(3100 + i, 2, i == 0 ? 2 : 1, B + 6100 + i);
  }
  /* Category 12: winners 1, 1, 2: 1.333; an auction whose only bid is
   * after its expiry does not count. */
  ev[n++] = auction(3201, 3, 12, B + 7000, B + 9000);
  ev[n++] = auction(3202, 3, 12, B + 7000, B + 9000);
  ev[n++] = auction(3203, 3, 12, B + 7000, B + 9000);
  ev[n++] = auction(3204, 3, 12, B + 7000, B + 7500);
  ev[n++] = bid(3201, 3, 1, B + 8000);
  ev[n++] = bid(3202, 3, 1, B + 8000);
  ev[n++] = bid(3203, 3, 2, B + 8000);
  ev[n++] = bid(3204, 3, 1000, B + 8000);
  /* Category 13: 2, 2, 1: 1.6666.. rounds to 1.667.  Category 14: an
   * auction without bids: no row.  A bid for an auction that never
   * comes: nothing. */
  ev[n++] = auction(3301, 4, 13, B + 9000, B + 20000);
  ev[n++] = auction(3302, 4, 13, B + 9000, B + 20000);
  ev[n++] = auction(3303, 4, 13, B + 9000, B + 20000);
  ev[n++] = auction(3401, 4, 14, B + 9000, B + 20000);
  ev[n++] = bid(3301, 4, 2, B + 9500);
  ev[n++] = bid(3302, 4, 2, B + 9500);
  ev[n++] = bid(3303, 4, 1, B + 9500);
  ev[n++] = bid(9999, 4, 7, B + 9600);
  ev[n++] = bid(3301, 4, 0, B + 30000); /* moves the watermark on */
  cr_assert_leq(n, COUNT(ev));
  static const char *const want[] = {"10,55.000", "11,1.063", "12,1.333",
                                     "13,1.667"};
  expect_lines((run_config){.query = NX_Q4, .events = ev, .n = n,
                            .bound = 1000},
               want, COUNT(want));
}

Test(nexmark_queries, q4_bids_wait_for_a_late_arriving_auction) {
  /* Every bid comes before its auction, within the bound: into the
   * waiting array out of date_time order, a raise at a date_time already
   * there (7 -> 10 at B+100), a lower price there (4 at B+300, ignored),
   * a bid after the expiry.  Then the watermark passes everything. */
  nx_event ev[] = {bid(5001, 1, 9, B + 300),  bid(5001, 1, 7, B + 100),
                   bid(5001, 1, 10, B + 100), bid(5001, 1, 4, B + 300),
                   bid(5001, 1, 11, B + 700), /* after expiry */
                   bid(5002, 1, 3, B + 150),
                   auction(5001, 1, 12, B + 100, B + 600),
                   auction(5002, 1, 12, B + 150, B + 150),
                   bid(1, 1, 1, B + 50000)};
  /* 5001: 10; 5002: 3 (its bid at exactly date_time = expires). */
  static const char *const want[] = {"12,6.500"};
  expect_lines((run_config){.query = NX_Q4, .events = ev, .n = COUNT(ev),
                            .bound = 5000},
               want, COUNT(want));
}

Test(nexmark_queries, q4_waiting_bids_expire_with_the_watermark) {
  /* Auction 6001's bids wait at B+100 (50) and B+20000 (5); the second
   * moves the watermark to B+14999, which drops the first (its auction
   * would have come by then); the auction then arrives (B+19000, within
   * the bound) and takes the second. */
  nx_event ev[] = {bid(6001, 1, 50, B + 100), bid(6001, 1, 5, B + 20000),
                   auction(6001, 1, 13, B + 19000, B + 30000)};
  static const char *const want[] = {"13,5.000"};
  expect_lines((run_config){.query = NX_Q4, .events = ev, .n = COUNT(ev),
                            .bound = 5000},
               want, COUNT(want));
}

/* ----------------------------------------------------------- q5 */

Test(nexmark_queries, q5_keeps_every_auction_tied_at_the_maximum) {
  /* Windows [s, s + 10000) with s a multiple of 2000 and s <= t < s +
   * 10000.  Bids at B+100, B+300, B+500 fall in s = B-8000 .. B; at
   * B+2100 and B+2500 in s = B-6000 .. B+2000; a4's lone bid at B+50000
   * in s = B+42000 .. B+50000. */
  nx_event ev[] = {bid(1, 9, 1, B + 100),  bid(2, 9, 1, B + 300),
                   bid(1, 9, 1, B + 500),  bid(2, 9, 1, B + 2100),
                   bid(3, 9, 1, B + 2500), bid(4, 9, 1, B + 50000)};
  static const char *const want[] = {
      "992000,1002000,1,2",    /* a1 2, a2 1 */
      "994000,1004000,1,2",    "994000,1004000,2,2", /* a3 1 */
      "996000,1006000,1,2",    "996000,1006000,2,2",
      "998000,1008000,1,2",    "998000,1008000,2,2",
      "1000000,1010000,1,2",   "1000000,1010000,2,2",
      "1002000,1012000,2,1",   "1002000,1012000,3,1",
      "1042000,1052000,4,1",   "1044000,1054000,4,1",
      "1046000,1056000,4,1",   "1048000,1058000,4,1",
      "1050000,1060000,4,1"};
  expect_lines((run_config){.query = NX_Q5, .events = ev, .n = COUNT(ev),
                            .bound = 100},
               want, COUNT(want));
}

Test(nexmark_queries, q5_counts_a_bid_only_in_its_windows_still_open) {
  /* Bound 0: after the bid at B+2500 the watermark is B+2499, and window
   * [B-8000, B+2000) has fired with a1's one bid.  Then a2's two bids at
   * B+1000 count in their four windows still open, not in that one, and
   * a bid at B-10000 (every window fired) is late. */
  nx_event ev[] = {bid(1, 9, 1, B + 100),  bid(1, 9, 1, B + 2500),
                   bid(2, 9, 1, B + 1000), bid(2, 9, 1, B + 1000),
                   bid(3, 9, 1, B - 10000)};
  static const char *const want[] = {
      "1002000,1012000,1,1",  "1000000,1010000,1,2",
      "1000000,1010000,2,2",  "992000,1002000,1,1",
      "994000,1004000,1,2",   "994000,1004000,2,2",
      "996000,1006000,1,2",   "996000,1006000,2,2",
      "998000,1008000,1,2",   "998000,1008000,2,2"};
  static const int parallelism[] = {1, 3};
  for (int k = 0; k < 2; k++) {
    run_config rc = {.query = NX_Q5, .parallelism = parallelism[k],
                     .events = ev, .n = COUNT(ev), .bound = 0,
                     .sync_at = 2, .sync_op = "q5.count_buckets",
                     .late_op = "q5.count_buckets"};
    run_result got;
    int status;
    char error[512];
    run_query(&rc, &got, &status, error, sizeof error);
    cr_assert_eq(status, 0, "%s", error);
    cr_assert_eq(got.count, COUNT(want), "P%d: %zu lines", rc.parallelism,
                 got.count);
    const char *sorted[COUNT(want)];
    memcpy(sorted, want, sizeof want);
    qsort(sorted, COUNT(want), sizeof *sorted, compare_text);
    for (size_t i = 0; i < COUNT(want); i++)
      cr_assert_str_eq(got.line[i], sorted[i], "P%d", rc.parallelism);
    cr_assert_eq(got.late, 1, "P%d: late %" PRIu64, rc.parallelism, got.late);
    free_result(&got);
  }
}

/* Auction 1's two bids are far apart: two timers pending, one per pane
 * (at B+1999 and B+51999).  Auction 2's bid then moves the watermark (bound
 * 100000) to B+53000, past both: the first timer emits every window then
 * due, the second pane's first one too, and the second pane's own timer
 * (q5_count_timer deletes it) must not emit that window again, although
 * the pane is still kept for its later windows.  Each window once. */
Test(nexmark_queries, q5_emits_each_window_once_when_the_watermark_jumps) {
  nx_event ev[] = {bid(1, 9, 1, B + 100), bid(1, 9, 1, B + 50000),
                   bid(2, 9, 1, B + 153001)};
  static const char *const want[] = {
      "992000,1002000,1,1",  "994000,1004000,1,1",  "996000,1006000,1,1",
      "998000,1008000,1,1",  "1000000,1010000,1,1", "1042000,1052000,1,1",
      "1044000,1054000,1,1", "1046000,1056000,1,1", "1048000,1058000,1,1",
      "1050000,1060000,1,1", "1144000,1154000,2,1", "1146000,1156000,2,1",
      "1148000,1158000,2,1", "1150000,1160000,2,1", "1152000,1162000,2,1"};
  expect_lines((run_config){.query = NX_Q5, .events = ev, .n = COUNT(ev),
                            .bound = 100000},
               want, COUNT(want));
}

/* Stats of the operator called name (the test fails without one). */
static sl_op_stats stats_of(sl_job *job, const char *name) {
  sl_op_stats st;
  for (int i = 0; i < sl_job_operator_count(job); i++)
    if (sl_job_stats(job, i, &st) == 0 && strcmp(st.name, name) == 0)
      return st;
  cr_assert_fail("no operator %s", name);
  return st;
}

/* Entries the instance of operator name persisted in the k-th newest
 * checkpoint (parallelism 1). */
static uint64_t entries_of(sl_job *job, int k, const char *name) {
  sl_checkpoint_stats cs;
  cr_assert_eq(sl_job_checkpoint_stats(job, k, &cs), 0);
  for (int i = 0; i < cs.instance_count; i++) {
    sl_checkpoint_instance_stats is;
    cr_assert_eq(sl_job_checkpoint_instance_stats(job, k, i, &is), 0);
    if (strcmp(is.name, name) == 0)
      return is.entries_persisted;
  }
  cr_assert_fail("no instance of %s in checkpoint %d", name, k);
  return 0;
}

/* Run query q at parallelism 1 over events ev with one checkpoint,
 * triggered once operator `op` has every one of its `records` records (the
 * source holds its end until then); *entries gets what op's instance
 * wrote in it, *got the sorted lines. */
static void run_checkpointed(int q, const nx_event *ev, size_t n,
                             const char *op, uint64_t records,
                             uint64_t *entries, run_result *got) {
  char *dir = sl_test_temp_dir("nexmark-entries");
  sl_job_config cfg = SL_JOB_CONFIG_INIT;
  cfg.checkpoint.state_dir = dir;
  cfg.checkpoint.interval_ms = 3600000; /* only the one triggered here */
  cfg.checkpoint.no_sync = 1;
  sl_job *job;
  cr_assert_eq(sl_job_create(&cfg, &job), 0);
  feed *f = calloc(1, sizeof *f);
  collector *c = calloc(1, sizeof *c);
  cr_assert(f && c);
  *f = (feed){.events = ev, .n = n, .job = job, .hold_end = true};
  c->query = q;
  sl_source_ops ops = {.next = feed_next};
  sl_op *src, *result, *sink;
  cr_assert_eq(sl_op_source(job, "events", 1, &ops, f, &src), 0);
  sl_watermark_config w = {.out_of_orderness = 100000, .every_call = 1};
  cr_assert_eq(sl_op_watermarks(src, &w), 0);
  cr_assert_eq(nx_query_build(job, q, src, 1, &result), 0, "%s",
               sl_job_error(job));
  cr_assert_eq(sl_sink_callback(job, "sink", result, 1, collect, c, &sink),
               0);
  sl_test_watchdog dog;
  cr_assert_eq(sl_test_watchdog_arm(&dog, job, 60, "checkpointed run"), 0);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  for (int i = 0; i < 60000 && stats_of(job, op).records_in < records;
       i++) /* about a minute */
    sl_test_sleep_us(1000);
  uint64_t id = 0;
  int rc = sl_job_trigger_checkpoint(job, &id);
  cr_assert_eq(rc, 0, "trigger: %s", sl_strerror(rc));
  cr_assert_eq(sl_job_wait(job), 0, "%s", sl_job_error(job));
  cr_assert_not(sl_test_watchdog_disarm(&dog), "the job hung");
  sl_checkpoint_stats cs;
  cr_assert_eq(sl_job_checkpoint_stats(job, 1, &cs), 0);
  cr_assert_eq(cs.id, id, "the triggered checkpoint precedes the final");
  *entries = entries_of(job, 1, op);
  sl_job_destroy(job);
  *got = (run_result){0};
  gather(c, 1, got);
  free(c);
  free(f);
  sl_test_remove_tree(dir);
}

/* 80 auctions with consecutive ids, one bid each, in one pane; no window
 * fires before the end of input.  A checkpoint taken after the last bid
 * holds q5.count_buckets's counts: keyed by auction that was a pane array
 * and a timer per auction (160 entries); q5.count_buckets keys a bucket of
 * 8 auctions, so 10 arrays and 10 timers.  The rows are those of keying
 * by auction: every auction ties at 1 in each of its 5 windows. */
Test(nexmark_queries, q5_checkpoint_writes_two_entries_per_8_auctions) {
  enum { AUCTIONS = 80 };
  nx_event ev[AUCTIONS];
  for (int i = 0; i < AUCTIONS; i++)
    ev[i] = bid(i, 9, 1, B + 100 + i);
  uint64_t entries;
  run_result got;
  run_checkpointed(NX_Q5, ev, AUCTIONS, "q5.count_buckets", AUCTIONS, &entries,
                   &got);
  cr_expect_eq(entries, 2 * AUCTIONS / 8, "q5.count_buckets wrote %" PRIu64
               " entries for %d auctions", entries, AUCTIONS);
  cr_expect_eq(got.count, 5 * AUCTIONS, "%zu rows", got.count);
  for (size_t i = 0; i < got.count; i++) { /* "start,end,auction,1" */
    long long start, end, auction, num;
    cr_assert_eq(sscanf(got.line[i], "%lld,%lld,%lld,%lld", &start, &end,
                        &auction, &num), 4, "%s", got.line[i]);
    cr_expect(end - start == 10000 && start <= B && start > B - 10000 &&
                  auction >= 0 && auction < AUCTIONS && num == 1,
              "row %s", got.line[i]);
  }
  free_result(&got);
}

/* 80 auctions with consecutive ids and expiries 1 ms apart, open past the
 * end of input.  The checkpoint after the last holds q4.winning_buckets's open
 * auctions: keyed by auction, an entry per auction besides its timer at
 * expires (160); in buckets of 8, 10 arrays and the 80 timers.  (No
 * bids: q4.winning_buckets gets them on another input than the auctions,
 * so some would wait for their auction or not as the two interleave, and the
 * count would vary.)  No
 * auction has a bid, so there is no winner and no row. */
Test(nexmark_queries, q4_checkpoint_writes_an_array_per_8_auctions) {
  enum { AUCTIONS = 80 };
  nx_event ev[AUCTIONS];
  for (int i = 0; i < AUCTIONS; i++)
    ev[i] = auction(i, 1, 10 + i % 2, B + i, B + 50000 + i);
  uint64_t entries;
  run_result got;
  run_checkpointed(NX_Q4, ev, AUCTIONS, "q4.winning_buckets", AUCTIONS,
                   &entries, &got);
  cr_expect_eq(entries, AUCTIONS / 8 + AUCTIONS, "q4.winning_buckets wrote %"
               PRIu64 " entries for %d auctions", entries, AUCTIONS);
  cr_expect_eq(got.count, 0, "%zu rows", got.count);
  free_result(&got);
}

/* ----------------------------------------------------------- q7 */

Test(nexmark_queries, q7_keeps_ties_and_window_bounds) {
  /* [B, B+10000): 300 is the maximum, reached by auctions 2, 1026 (the
   * same share of the first stage) and 3 (another).  The bid at exactly
   * B+10000 belongs to the next window, where it is alone at the top. */
  nx_event ev[] = {bid(1, 11, 100, B),          bid(2, 12, 300, B + 5000),
                   bid(1026, 16, 300, B + 6000), bid(4, 14, 200, B + 7000),
                   bid(3, 13, 300, B + 9999),   bid(7, 17, 500, B + 10000),
                   bid(5, 15, 50, B + 12000),   bid(6, 18, 49, B + 25000)};
  static const char *const want[] = {
      "1000000,1010000,2,12,300,1005000",
      "1000000,1010000,1026,16,300,1006000",
      "1000000,1010000,3,13,300,1009999",
      "1010000,1020000,7,17,500,1010000",
      "1020000,1030000,6,18,49,1025000"};
  expect_lines((run_config){.query = NX_Q7, .events = ev, .n = COUNT(ev),
                            .bound = 100},
               want, COUNT(want));
}

Test(nexmark_queries, q7_drops_and_counts_a_late_bid) {
  /* With a bound of 0 the bid at B+25000 makes the watermark B+24999:
   * [B, B+10000) has fired, so the bid at B+5000 after it is late. */
  nx_event ev[] = {bid(1, 11, 100, B), bid(2, 12, 300, B + 5000),
                   bid(3, 13, 7, B + 25000), bid(4, 14, 999, B + 5001)};
  static const char *const want[] = {"1000000,1010000,2,12,300,1005000",
                                     "1020000,1030000,3,13,7,1025000"};
  static const int parallelism[] = {1, 3};
  for (int k = 0; k < 2; k++) {
    run_config rc = {.query = NX_Q7, .parallelism = parallelism[k],
                     .events = ev, .n = COUNT(ev), .bound = 0,
                     .sync_at = 3, .sync_op = "q7.local",
                     .late_op = "q7.local"};
    run_result got;
    int status;
    char error[512];
    run_query(&rc, &got, &status, error, sizeof error);
    cr_assert_eq(status, 0, "%s", error);
    cr_assert_eq(got.count, 2, "P%d: %zu lines", rc.parallelism, got.count);
    for (size_t i = 0; i < 2; i++)
      cr_assert_str_eq(got.line[i], want[i]);
    cr_assert_eq(got.late, 1, "P%d: late %" PRIu64, rc.parallelism, got.late);
    free_result(&got);
  }
}

/* ----------------------------------------------------------- q8 */

Test(nexmark_queries, q8_one_row_per_person_and_window) {
  nx_event ev[] = {
      /* Two auctions of Ann in her window: one row. */
      person(1001, "Ann", "X", "OR", B + 1000),
      auction(1, 1001, 10, B + 2000, B + 9000),
      auction(2, 1001, 11, B + 3000, B + 9000),
      /* Ann again (a duplicate person event): no second row; the same id
       * under another name is another (id, name, window). */
      person(1001, "Ann", "X", "OR", B + 4000),
      person(1001, "Anne", "X", "OR", B + 4500),
      /* Bob registers at the last ms of a window, sells in the next:
       * none. */
      person(1002, "Bob", "X", "OR", B + 9999),
      auction(3, 1002, 10, B + 10000, B + 19000),
      /* The auction before the person, same window; a name to quote. */
      auction(4, 1003, 10, B + 11000, B + 19000),
      person(1003, "Lee, \"Jr\"", "X", "CA", B + 12000),
      /* An auction without a person. */
      auction(5, 1004, 10, B + 13000, B + 19000),
      /* Auctions on both sides of the person, inside [B+20000, B+30000). */
      auction(6, 1005, 10, B + 21000, B + 29000),
      person(1005, "Eve", "X", "WA", B + 25000),
      auction(7, 1005, 10, B + 29999, B + 39000),
      /* Cal registers in one window and sells in the one before: none. */
      auction(8, 1006, 10, B + 29500, B + 39000),
      person(1006, "Cal", "X", "WA", B + 30000),
  };
  static const char *const want[] = {
      "1000000,1010000,1001,Ann", "1000000,1010000,1001,Anne",
      "1010000,1020000,1003,\"Lee, \"\"Jr\"\"\"",
      "1020000,1030000,1005,Eve"};
  expect_lines((run_config){.query = NX_Q8, .events = ev, .n = COUNT(ev),
                            .bound = 1000},
               want, COUNT(want));
}

/* ----------------------------------------------------------- q11 */

Test(nexmark_queries, q11_sessions_split_at_a_gap_of_10_s) {
  nx_event ev[] = {
      bid(1, 1, 5, B),            /* bidder 1: B, B+9999 (gap 9999) ... */
      bid(1, 2, 5, B + 5000),     /* bidder 2: B+5000, B+15000 (10000) */
      bid(1, 3, 5, B + 1000),     /* bidder 3: gaps of 9999 twice */
      bid(1, 1, 5, B + 9999),     bid(1, 3, 5, B + 10999),
      bid(1, 2, 5, B + 15000),    bid(1, 1, 5, B + 19999), /* ... 10000 */
      bid(1, 3, 5, B + 20998),
  };
  static const char *const want[] = {
      "1,1000000,1019999,2", "1,1019999,1029999,1",
      "2,1005000,1015000,1", "2,1015000,1025000,1",
      "3,1001000,1030998,3"};
  expect_lines((run_config){.query = NX_Q11, .events = ev, .n = COUNT(ev),
                            .bound = 2000},
               want, COUNT(want));
}

/* ----------------------------------------------------------- all queries */

/* A mixed stream (1 person, 3 auctions, 46 bids in every 50, few ids so
 * that joins and windows have matches): every query gives the same lines
 * at parallelism 1 and 3. */
Test(nexmark_queries, every_query_agrees_at_parallelism_1_and_3) {
  size_t n = 5000;
  nx_event *ev = calloc(n, sizeof *ev);
  cr_assert(ev);
  static const char *const states[] = {"OR", "WA", "CA", "ID", "AZ"};
  static const char *const names[] = {"Ann", "Bob, Jr", "Cy \"C\"", "Di"};
  uint64_t s = 7;
  for (size_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t r = s >> 33;
    int64_t t = B + (int64_t)i * 37 - (int64_t)(r % 500); /* disorder */
    size_t kind = i % 50;
    int64_t id = (int64_t)(i / 50);
    if (kind == 0)
      ev[i] = person(id, names[r % 4], "Town", states[r % 5], t);
    else if (kind <= 3)
      ev[i] = auction(id * 3 + (int64_t)kind, (int64_t)(r % (id + 1)),
                      10 + (int64_t)(r % 5), t, t + (int64_t)(r % 20000));
    else
      ev[i] = bid((int64_t)(r % (uint64_t)(3 * id + 4)), (int64_t)(r % 13),
                  (int64_t)(r % 100), t);
  }
  for (int i = 0; i < nx_query_count(); i++) {
    run_config rc = {.query = nx_query_at(i), .events = ev, .n = n,
                     .bound = 600};
    run_result got[2];
    for (int k = 0; k < 2; k++) {
      rc.parallelism = k == 0 ? 1 : 3;
      int status;
      char error[512];
      run_query(&rc, &got[k], &status, error, sizeof error);
      cr_assert_eq(status, 0, "q%d: %s", rc.query, error);
      cr_assert_eq(got[k].errors, 0);
    }
    cr_assert_gt(got[0].count, 0, "q%d produced nothing", rc.query);
    cr_assert_eq(got[0].count, got[1].count, "q%d: %zu vs %zu lines",
                 rc.query, got[0].count, got[1].count);
    for (size_t k = 0; k < got[0].count; k++)
      cr_assert_str_eq(got[0].line[k], got[1].line[k], "q%d", rc.query);
    free_result(&got[0]);
    free_result(&got[1]);
  }
  free(ev);
}

Test(nexmark_queries, a_malformed_record_fails_the_job_naming_the_query) {
  static const int qs[] = {NX_Q0, NX_Q4, NX_Q8};
  for (size_t i = 0; i < COUNT(qs); i++) {
    run_config rc = {.query = qs[i], .parallelism = 1, .garbage = 1};
    run_result got;
    int status;
    char error[512];
    run_query(&rc, &got, &status, error, sizeof error);
    cr_assert_eq(status, -EINVAL, "%d", status); /* the query's return */
    char prefix[8];
    snprintf(prefix, sizeof prefix, "q%d.", qs[i]);
    cr_assert(strstr(error, prefix) && strstr(error, "malformed"), "%s",
              error);
    free_result(&got);
  }
}

/* ----------------------------------------------------------- the API */

Test(nexmark_queries, parse_accepts_the_queries_we_run) {
  cr_assert_eq(nx_query_parse("q0"), 0);
  cr_assert_eq(nx_query_parse("Q5"), 5);
  cr_assert_eq(nx_query_parse("11"), 11);
  cr_assert_eq(nx_query_parse("q11"), 11);
  cr_assert_eq(nx_query_parse("7"), 7);
  cr_assert_eq(nx_query_parse("q6"), -1);  /* not one we run */
  cr_assert_eq(nx_query_parse("q9"), -1);
  cr_assert_eq(nx_query_parse("q12"), -1);
  cr_assert_eq(nx_query_parse("q"), -1);
  cr_assert_eq(nx_query_parse(""), -1);
  cr_assert_eq(nx_query_parse("q01"), -1);
  cr_assert_eq(nx_query_parse("q1 "), -1);
  cr_assert_eq(nx_query_parse("-1"), -1);
  cr_assert_eq(nx_query_parse("q111"), -1);
  cr_assert_eq(nx_query_parse(NULL), -1);
}

Test(nexmark_queries, the_query_table) {
  static const int want[] = {0, 1, 2, 3, 4, 5, 7, 8, 11};
  cr_assert_eq(nx_query_count(), (int)COUNT(want));
  for (int i = 0; i < nx_query_count(); i++) {
    cr_assert_eq(nx_query_at(i), want[i]);
    cr_assert_not_null(nx_query_header(want[i]));
  }
  cr_assert_eq(nx_query_at(-1), -1);
  cr_assert_eq(nx_query_at(nx_query_count()), -1);
  cr_assert_null(nx_query_header(6));
  cr_assert_str_eq(nx_query_header(NX_Q5),
                   "window_start,window_end,auction,num");
  cr_assert_str_eq(nx_query_header(NX_Q11),
                   "bidder,window_start,window_end,bid_count");
  sl_job *job;
  cr_assert_eq(sl_job_create(NULL, &job), 0);
  sl_op *src, *out;
  cr_assert_eq(sl_source_sequence(job, "s", 1, 1, 0, &src), 0);
  cr_assert_eq(nx_query_build(job, 6, src, 1, &out), EINVAL);
  cr_assert_eq(nx_query_build(job, NX_Q0, NULL, 1, &out), EINVAL);
  sl_job_destroy(job);
}

Test(nexmark_queries, format_refuses_records_of_the_wrong_size) {
  int64_t words[4] = {1, 2, 3, 4};
  char buffer[64];
  sl_record rec = {.data = words, .size_bytes = 24, .timestamp = 0};
  /* q0 rows are 32 bytes, q2 rows 16. */
  cr_assert_lt(nx_query_format((void *)(intptr_t)NX_Q0, &rec, buffer,
                               sizeof buffer), 0);
  cr_assert_lt(nx_query_format((void *)(intptr_t)NX_Q2, &rec, buffer,
                               sizeof buffer), 0);
  cr_assert_lt(nx_query_format((void *)(intptr_t)6, &rec, buffer,
                               sizeof buffer), 0);
  /* A q3 row whose string lengths run past its end. */
  rec.size_bytes = 16;
  words[1] = 0x0001000100010001LL; /* name, city, state: 1 byte each */
  cr_assert_lt(nx_query_format((void *)(intptr_t)NX_Q3, &rec, buffer,
                               sizeof buffer), 0);
  /* A well-formed q2 row, and its too-small-buffer contract. */
  rec.size_bytes = 16;
  words[0] = 246;
  words[1] = -17;
  cr_assert_eq(nx_query_format((void *)(intptr_t)NX_Q2, &rec, buffer,
                               sizeof buffer), 7);
  cr_assert_eq(memcmp(buffer, "246,-17", 7), 0);
  memset(buffer, '#', sizeof buffer);
  cr_assert_eq(nx_query_format((void *)(intptr_t)NX_Q2, &rec, buffer, 3), 7);
  cr_assert_eq(buffer[3], '#');
}
