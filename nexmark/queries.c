/* queries.c — the Nexmark queries q0-q5, q7, q8 and q11 as sluice jobs,
 * built on the public API only (sluice.h), and their result records as CSV
 * lines.  Each builder below opens with the query's SQL (after the Nexmark
 * suite's) and how its operators map onto it.
 *
 * NOTES ON THE DESIGN
 *
 * 1. Every query starts with one operator that reads the events, drops the
 *    kinds it does not need and projects what it keeps into a small struct
 *    (fixed-size, except the names, cities and states q3 and q8 carry).
 *    The keyed edges behind it, one ring per pair of instances, then carry
 *    a few bytes per record instead of a whole event.  A query that needs
 *    two kinds uses a process operator that sends the second kind to side
 *    output port 1, so the events are read once.
 * 2. Fields are read straight from the nx_record (type and integers), after
 *    a check that the record's size covers them; nx_decode() runs only for
 *    the persons whose strings a query keeps.  A malformed record fails the
 *    job, naming the operator.
 * 3. Windows are [start, end) in ms with start = ts - (ts mod size), the
 *    modulo taken towards minus infinity.  The windowed process operators
 *    written here (q5's counts and maxima, q7's maxima, q8's join) fire
 *    with an event-time timer at end - 1, as sl_op_window does, and drop
 *    and count as late (SL_COUNT_LATE) a record whose windows have all
 *    fired already.
 * 4. A window result emitted from a timer at end - 1 carries that stamp and
 *    leaves before the watermark that fired it: a second stage keyed by the
 *    window (q5, q7) has all the window's results when its own timer at
 *    end - 1 fires, since its watermark is the minimum over every upstream
 *    instance.
 * 5. Each process operator numbers its state ids from 1.  Pointers from
 *    state calls are used only until the next state call (sl_emit is not
 *    one), and values are copied out with memcpy: list items are only
 *    4-byte aligned.
 * 6. Callbacks return negative errors only: the engine ignores positive
 *    returns, so an errno from a state call is negated after it is put in
 *    the job's message (failed()).
 * 7. Result records are the *_row structs below; nx_query_format() checks a
 *    record's size against its query before it reads it.
 * 8. Times.  Every time a query computes from comes through time_of(): a
 *    time outside SL_TIME_MIN_VALID .. SL_TIME_MAX_VALID fails the job,
 *    naming the operator (the event parser refuses those already, with
 *    file and line; this catches a generator configured past them).  A
 *    valid time plus or minus a window size of seconds stays far inside
 *    int64, and timer times are checked with sl_time_add before use, so
 *    no bound wraps and no timer is ever re-armed into the past (a
 *    wrapped one was due at once, forever, at the final watermark).
 */
#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nexmark.h"
#include "sluice.h"
#include "time_check.h" /* the library's checked time arithmetic (note 8) */

#define WINDOW_TUMBLE_MS 10000 /* q7, q8 */
#define Q5_SIZE_MS 10000
#define Q5_SLIDE_MS 2000
#define Q11_GAP_MS 10000
#define Q2_MODULUS 123
#define Q3_CATEGORY 10
/* q7's first stage spreads each window over this many keys (by auction):
 * enough for any parallelism to get an even share. */
#define Q7_BUCKETS 1024

/* ------------------------------------------------------------------------ */
/* Records between the operators, and the results. */

/* q0, q1 result (q1: price in thousandths, i.e. price * 908), and the bid
 * q7 keeps. */
typedef struct bid_row {
  int64_t auction, bidder, price, date_time;
} bid_row;

typedef struct q2_row {
  int64_t auction, price;
} q2_row;

/* q3: a person as projected (id = person id) and, with the same layout, a
 * result (id = auction id).  Followed by name, city and state bytes. */
typedef struct q3_row {
  int64_t id;
  uint16_t name_len, city_len, state_len, pad;
} q3_row;

typedef struct q3_auction {
  int64_t id, seller;
} q3_auction;

typedef struct q4_bid {
  int64_t auction, price, date_time;
} q4_bid;

typedef struct q4_auction {
  int64_t id, date_time, expires, category;
} q4_auction;

/* q4: the winning bid of one closed auction, keyed by category next. */
typedef struct q4_winner {
  int64_t category, price;
} q4_winner;

typedef struct q4_row {
  int64_t category, avg_thousandths;
} q4_row;

/* q5 result and the record its second stage maximises: one auction's bid
 * count in one window. */
typedef struct q5_row {
  int64_t start, end, auction, count;
} q5_row;

typedef struct q7_row {
  int64_t start, end;
  bid_row bid;
} q7_row;

typedef struct q8_auction {
  int64_t seller, date_time;
} q8_auction;

/* q8: a person as projected; followed by the name bytes. */
typedef struct q8_person {
  int64_t id, date_time;
  uint32_t name_len, pad;
} q8_person;

/* q8 result; followed by the name bytes. */
typedef struct q8_row {
  int64_t start, end, id;
  uint32_t name_len, pad;
} q8_row;

typedef struct q11_row {
  int64_t bidder, start, end, count;
} q11_row;

_Static_assert(sizeof(q3_row) == 16, "q3 rows: 16-byte head, then text");
_Static_assert(sizeof(q8_person) == 24, "q8 persons: 24-byte head");
_Static_assert(sizeof(q8_row) == 32, "q8 rows: 32-byte head, then name");

/* ------------------------------------------------------------------------ */
/* Helpers shared by the queries. */

static const uint32_t kind_integers[3] = {2, 7, 4};

/* The event in `in` when its fixed part (head and integers) is all there,
 * else NULL. */
static const nx_record *event_of(const sl_record *in) {
  if (in->size_bytes < sizeof(nx_record))
    return NULL;
  const nx_record *r = in->data;
  if (r->type > NX_BID ||
      in->size_bytes < sizeof(nx_record) + 8u * kind_integers[r->type])
    return NULL;
  return r;
}

static int malformed(sl_ctx *ctx, const sl_record *in) {
  sl_ctx_fail(ctx, "malformed record of %u bytes", (unsigned)in->size_bytes);
  return -EINVAL;
}

/* rc as a callback's return (note 6): 0, or negative with the cause. */
static int failed(sl_ctx *ctx, int rc, const char *what) {
  if (rc == 0 || rc == SL_ESTOPPED)
    return rc;
  sl_ctx_fail(ctx, "%s: %s", what, sl_strerror(rc));
  return rc > 0 ? -rc : rc;
}

static int64_t window_start(int64_t ts, int64_t size) {
  assert(size > 0 && size <= SL_TIME_SPAN_MAX && sl_time_valid(ts));
  int64_t start, end;
  bool ok = sl_time_window(ts, size, &start, &end);
  assert(ok); /* a valid time's window fits (time_check.h note 2) */
  (void)ok;
  (void)end;
  return start;
}

/* ts if it is a valid time (note 8); else the job fails, naming the
 * operator and the field, and *rc is set. */
static bool time_of(sl_ctx *ctx, int64_t ts, const char *what, int *rc) {
  if (sl_time_valid(ts))
    return true;
  sl_ctx_fail(ctx, "%s %lld is outside the valid event times %lld .. %lld",
              what, (long long)ts, (long long)SL_TIME_MIN_VALID,
              (long long)SL_TIME_MAX_VALID);
  *rc = -ERANGE;
  return false;
}

/* The end of the window that fires at timer time `time`: time + 1, or
 * false when that overflows (no window of a valid time ends there). */
static bool end_of_timer(int64_t time, int64_t *end) {
  return sl_time_add(time, 1, end);
}

/* A record for a window whose timer (end - 1) has fired is late (note 3):
 * count it, and the caller drops it. */
static bool window_late(sl_ctx *ctx, int64_t end) {
  if (end - 1 > sl_ctx_watermark(ctx))
    return false;
  sl_ctx_count(ctx, SL_COUNT_LATE, 1);
  return true;
}

/* Growable per-instance memory for the rare rebuild of a list state. */
typedef struct scratch {
  uint8_t *bytes;
  uint32_t capacity;
} scratch;

static int scratch_open(sl_ctx *ctx, void *user, void **state) {
  scratch *s = calloc(1, sizeof *s);
  if (!s)
    return -ENOMEM;
  *state = s;
  return 0;
}

static void scratch_close(sl_ctx *ctx, void *state) {
  scratch *s = state;
  if (s)
    free(s->bytes);
  free(s);
}

static int scratch_reserve(scratch *s, uint32_t bytes) {
  if (bytes <= s->capacity)
    return 0;
  uint8_t *grown = realloc(s->bytes, bytes);
  if (!grown)
    return ENOMEM;
  s->bytes = grown;
  s->capacity = bytes;
  return 0;
}

typedef bool (*keep_fn)(const void *item, uint32_t item_bytes, int64_t arg);

/* Keep only the items of list state id for which keep() holds.  The list
 * is rebuilt (from a copy in s) only when some but not all items stay. */
static int list_retain(sl_ctx *ctx, scratch *s, uint16_t id, keep_fn keep,
                       int64_t arg) {
  const void *list, *item;
  uint32_t list_bytes, item_bytes, offset = 0, items = 0, kept = 0;
  int rc = sl_liststate_get(ctx, id, &list, &list_bytes);
  if (rc)
    return rc == SL_ENOTFOUND ? 0 : rc;
  /* Bounded: each step moves offset forward by at least 4 bytes. */
  while (sl_list_next(list, list_bytes, &offset, &item, &item_bytes)) {
    items++;
    kept += keep(item, item_bytes, arg);
  }
  if (kept == items)
    return 0;
  rc = kept > 0 ? scratch_reserve(s, list_bytes) : 0;
  if (rc == 0 && kept > 0)
    memcpy(s->bytes, list, list_bytes);
  if (rc == 0)
    rc = sl_state_delete(ctx, id);
  offset = 0;
  while (rc == 0 && kept > 0 &&
         sl_list_next(s->bytes, list_bytes, &offset, &item, &item_bytes))
    if (keep(item, item_bytes, arg))
      rc = sl_liststate_add(ctx, id, item, item_bytes);
  return rc;
}

/* Sorted arrays of 16-byte {time, value} pairs in a value state (q4's
 * waiting bids, q5's panes): the pair at i, insertion, and dropping a
 * prefix.  A put may free the version a state pointer points into, so
 * the new array is built in the instance's scratch first. */
typedef struct time_pair {
  int64_t time, value;
} time_pair;

static time_pair pair_at(const void *array, uint32_t i) {
  time_pair p;
  memcpy(&p, (const char *)array + (size_t)i * sizeof p, sizeof p);
  return p;
}

/* The index where time belongs in array (n pairs), searching from the
 * end since times come mostly in order; *found if it is there already
 * (then at is its index). */
static uint32_t pair_find(const void *array, uint32_t n, int64_t time,
                          bool *found) {
  uint32_t at = n;
  while (at > 0 && pair_at(array, at - 1).time > time) /* at most n */
    at--;
  *found = at > 0 && pair_at(array, at - 1).time == time;
  return *found ? at - 1 : at;
}

/* Add 1 to (or raise to at least, when raise) the value of pair at of
 * state id, in place. */
static int pair_update(sl_ctx *ctx, uint16_t id, uint32_t bytes, uint32_t at,
                       int64_t value, bool raise) {
  void *stored;
  int rc = sl_state_update(ctx, id, bytes, NULL, &stored);
  if (rc)
    return rc;
  char *slot = (char *)stored + (size_t)at * sizeof(time_pair) + 8;
  int64_t v;
  memcpy(&v, slot, sizeof v);
  v = raise ? (value > v ? value : v) : v + value;
  memcpy(slot, &v, sizeof v);
  return 0;
}

static int pair_insert(sl_ctx *ctx, scratch *s, uint16_t id,
                       const void *array, uint32_t bytes, uint32_t at,
                       time_pair fresh) {
  int rc = scratch_reserve(s, bytes + (uint32_t)sizeof fresh);
  if (rc)
    return rc;
  size_t head = (size_t)at * sizeof fresh;
  assert(head <= bytes);
  if (head > 0)
    memcpy(s->bytes, array, head);
  memcpy(s->bytes + head, &fresh, sizeof fresh);
  if (bytes > head)
    memcpy(s->bytes + head + sizeof fresh, (const char *)array + head,
           bytes - head);
  return sl_state_put(ctx, id, s->bytes, bytes + (uint32_t)sizeof fresh,
                      NULL);
}

static int pair_drop(sl_ctx *ctx, scratch *s, uint16_t id, const void *array,
                     uint32_t bytes, uint32_t drop) {
  uint32_t drop_bytes = drop * (uint32_t)sizeof(time_pair);
  assert(drop_bytes <= bytes);
  if (drop == 0)
    return 0;
  if (drop_bytes == bytes)
    return sl_state_delete(ctx, id);
  int rc = scratch_reserve(s, bytes - drop_bytes);
  if (rc)
    return rc;
  memcpy(s->bytes, (const char *)array + drop_bytes, bytes - drop_bytes);
  return sl_state_put(ctx, id, s->bytes, bytes - drop_bytes, NULL);
}

/* ------------------------------------------------------------------------ */
/* q0: passthrough of the bids.
 *
 *   SELECT auction, bidder, price, dateTime FROM bid;
 *
 * One flat_map: bids become bid_rows, the rest is dropped. */

static int q0_project(void *user, const sl_record *in, sl_ctx *ctx) {
  const nx_record *r = event_of(in);
  if (!r)
    return malformed(ctx, in);
  if (r->type != NX_BID)
    return 0;
  bid_row row = {r->field[NX_BID_AUCTION], r->field[NX_BID_BIDDER],
                 r->field[NX_BID_PRICE], r->field[NX_BID_DATE_TIME]};
  return sl_emit(ctx, &row, sizeof row);
}

static int build_q0(sl_job *job, sl_op *events, int p, sl_op **result) {
  return sl_op_flat_map(job, "q0.bids", events, p, q0_project, NULL, result);
}

/* ------------------------------------------------------------------------ */
/* q1: currency conversion.
 *
 *   SELECT auction, bidder, 0.908 * price AS price, dateTime FROM bid;
 *
 * One flat_map.  The price is kept exact, in thousandths (price * 908), and
 * printed with three decimals. */

static int q1_convert(void *user, const sl_record *in, sl_ctx *ctx) {
  const nx_record *r = event_of(in);
  if (!r)
    return malformed(ctx, in);
  if (r->type != NX_BID)
    return 0;
  int64_t price = r->field[NX_BID_PRICE];
  if (price > INT64_MAX / 908 || price < INT64_MIN / 908) {
    sl_ctx_fail(ctx, "q1: price %lld too large to convert", (long long)price);
    return -ERANGE;
  }
  bid_row row = {r->field[NX_BID_AUCTION], r->field[NX_BID_BIDDER],
                 price * 908, r->field[NX_BID_DATE_TIME]};
  return sl_emit(ctx, &row, sizeof row);
}

static int build_q1(sl_job *job, sl_op *events, int p, sl_op **result) {
  return sl_op_flat_map(job, "q1.convert", events, p, q1_convert, NULL,
                        result);
}

/* ------------------------------------------------------------------------ */
/* q2: selection.
 *
 *   SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0;
 *
 * One flat_map. */

static int q2_select(void *user, const sl_record *in, sl_ctx *ctx) {
  const nx_record *r = event_of(in);
  if (!r)
    return malformed(ctx, in);
  if (r->type != NX_BID || r->field[NX_BID_AUCTION] % Q2_MODULUS != 0)
    return 0;
  q2_row row = {r->field[NX_BID_AUCTION], r->field[NX_BID_PRICE]};
  return sl_emit(ctx, &row, sizeof row);
}

static int build_q2(sl_job *job, sl_op *events, int p, sl_op **result) {
  return sl_op_flat_map(job, "q2.select", events, p, q2_select, NULL,
                        result);
}

/* ------------------------------------------------------------------------ */
/* q3: local item suggestion.
 *
 *   SELECT P.name, P.city, P.state, A.id
 *   FROM auction AS A INNER JOIN person AS P ON A.seller = P.id
 *   WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID'
 *                              OR P.state = 'CA');
 *
 * q3.split (process) applies both WHERE conditions and projects: auctions
 * {id, seller} on its main output, persons {id, name, city, state} on port
 * 1.  Each side is keyed by the join key (seller, person id) into
 * sl_op_join, the unbounded join of two insert-only tables, whose join
 * function emits one row per pair.  Its state keeps every matching auction
 * and person (sluice_join.h, CAVEATS); they are few after the filters. */

static bool q3_state_wanted(nx_str state) {
  static const char wanted[3][2] = {{'O', 'R'}, {'I', 'D'}, {'C', 'A'}};
  if (state.len != 2)
    return false;
  for (int i = 0; i < 3; i++)
    if (memcmp(state.ptr, wanted[i], 2) == 0)
      return true;
  return false;
}

static int q3_person(sl_ctx *ctx, const sl_record *in) {
  nx_event e;
  if (nx_decode(in->data, in->size_bytes, &e) != 0)
    return malformed(ctx, in);
  const nx_person *p = &e.u.person;
  if (!q3_state_wanted(p->state))
    return 0;
  if (p->name.len > NX_MAX_STRING_BYTES || p->city.len > NX_MAX_STRING_BYTES)
    return malformed(ctx, in);
  _Alignas(8) char buffer[sizeof(q3_row) + 3 * NX_MAX_STRING_BYTES];
  q3_row head = {p->id, (uint16_t)p->name.len, (uint16_t)p->city.len,
                 (uint16_t)p->state.len, 0};
  memcpy(buffer, &head, sizeof head);
  char *text = buffer + sizeof head;
  memcpy(text, p->name.ptr, p->name.len);
  memcpy(text + p->name.len, p->city.ptr, p->city.len);
  memcpy(text + p->name.len + p->city.len, p->state.ptr, p->state.len);
  uint32_t size =
      (uint32_t)sizeof head + p->name.len + p->city.len + p->state.len;
  return sl_emit_side(ctx, 1, buffer, size, in->timestamp);
}

static int q3_split(sl_ctx *ctx, void *state, int input,
                    const sl_record *in) {
  const nx_record *r = event_of(in);
  if (!r)
    return malformed(ctx, in);
  if (r->type == NX_PERSON)
    return q3_person(ctx, in);
  if (r->type != NX_AUCTION ||
      r->field[NX_AUCTION_CATEGORY] != Q3_CATEGORY)
    return 0;
  q3_auction a = {r->field[NX_AUCTION_ID], r->field[NX_AUCTION_SELLER]};
  return sl_emit(ctx, &a, sizeof a);
}

static uint64_t q3_auction_seller(void *user, const sl_record *in) {
  return (uint64_t)((const q3_auction *)in->data)->seller;
}

static uint64_t q3_person_id(void *user, const sl_record *in) {
  return (uint64_t)((const q3_row *)in->data)->id;
}

/* One (auction, person) pair: the person's record with the auction's id. */
static int q3_pair(void *user, sl_ctx *ctx, uint64_t key,
                   const sl_record *left, const sl_record *right) {
  assert(left->size_bytes == sizeof(q3_auction));
  assert(right->size_bytes >= sizeof(q3_row));
  _Alignas(8) char buffer[sizeof(q3_row) + 3 * NX_MAX_STRING_BYTES];
  if (right->size_bytes > sizeof buffer)
    return malformed(ctx, right);
  memcpy(buffer, right->data, right->size_bytes);
  q3_row head;
  memcpy(&head, buffer, sizeof head);
  head.id = ((const q3_auction *)left->data)->id;
  memcpy(buffer, &head, sizeof head);
  return sl_emit(ctx, buffer, right->size_bytes);
}

static int build_q3(sl_job *job, sl_op *events, int p, sl_op **result) {
  static const sl_process_ops split = {.process = q3_split};
  sl_op *auctions, *persons, *by_seller, *by_id;
  int rc = sl_op_process(job, "q3.split", &events, 1, p, &split, NULL,
                         &auctions);
  if (rc == 0)
    rc = sl_op_side_output(job, "q3.persons", auctions, 1, &persons);
  if (rc == 0)
    rc = sl_op_key_by(job, "q3.auctions-by-seller", auctions,
                      q3_auction_seller, NULL, &by_seller);
  if (rc == 0)
    rc = sl_op_key_by(job, "q3.persons-by-id", persons, q3_person_id, NULL,
                      &by_id);
  if (rc == 0)
    rc = sl_op_join(job, "q3.join", by_seller, by_id, p, q3_pair, NULL,
                    result);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* q4: average price per category.
 *
 *   SELECT Q.category, AVG(Q.final)
 *   FROM (SELECT MAX(B.price) AS final, A.category
 *         FROM auction A, bid B
 *         WHERE A.id = B.auction
 *           AND B.dateTime BETWEEN A.dateTime AND A.expires
 *         GROUP BY A.id, A.category) Q
 *   GROUP BY Q.category;
 *
 * q4.split projects bids {auction, price, date_time} (main output) and
 * auctions {id, date_time, expires, category} (port 1), both keyed by
 * auction id into q4.winning, a keyed two-input process that is the inner
 * query: per auction it keeps the auction and its highest bid in range,
 * and an event-time timer at expires emits {category, highest bid} and
 * clears the key.  Once the watermark has passed expires no bid in range
 * can come any more (a bid is stamped with its date_time).  A bid that
 * finds no auction waits, with a timer at its own date_time: its auction,
 * if it is in range, is stamped no later and so has arrived by the time
 * the watermark passes that; the timer then drops it.  Waiting bids are
 * summed up per key as the highest price at each date_time (the range
 * test needs nothing else), in one sorted array: with two source instances
 * one may run ahead of the other, and then a hot auction's bids from it
 * all wait; most of them share a millisecond with the one before and cost
 * one lookup, no write.
 * q4.average, keyed by category, is the outer query: a (sum, count) per
 * category and a timer at SL_WATERMARK_MAX, which fires at the end of
 * input, emits the average rounded half up to thousandths. */

enum { Q4_OPEN = 1, Q4_PENDING = 2 };
enum { Q4_SUM = 1 };

/* Value state of an auction still open. */
typedef struct q4_open {
  int64_t date_time, expires, category, best_price, has_bid;
} q4_open;

/* Q4_PENDING, the bids of an auction not come yet: time_pairs
 * {date_time, highest price at it}, sorted. */

typedef struct q4_sum {
  int64_t sum, count;
} q4_sum;

static int q4_split(sl_ctx *ctx, void *state, int input,
                    const sl_record *in) {
  const nx_record *r = event_of(in);
  if (!r)
    return malformed(ctx, in);
  const int64_t *f = r->field;
  if (r->type == NX_BID) {
    q4_bid b = {f[NX_BID_AUCTION], f[NX_BID_PRICE], f[NX_BID_DATE_TIME]};
    return sl_emit(ctx, &b, sizeof b);
  }
  if (r->type != NX_AUCTION)
    return 0;
  q4_auction a = {f[NX_AUCTION_ID], f[NX_AUCTION_DATE_TIME],
                  f[NX_AUCTION_EXPIRES], f[NX_AUCTION_CATEGORY]};
  return sl_emit_side(ctx, 1, &a, sizeof a, in->timestamp);
}

/* Offer a bid to an open auction; true if it became the highest. */
static bool q4_offer(q4_open *open, int64_t price, int64_t date_time) {
  if (date_time < open->date_time || date_time > open->expires)
    return false;
  if (open->has_bid && price <= open->best_price)
    return false;
  open->best_price = price;
  open->has_bid = 1;
  return true;
}

/* A bid whose auction is not there: into the key's waiting pairs. */
static int q4_bid_waits(sl_ctx *ctx, scratch *s, const q4_bid *b) {
  const void *array = NULL;
  uint32_t bytes = 0;
  int rc = sl_state_get(ctx, Q4_PENDING, &array, &bytes);
  if (rc && rc != SL_ENOTFOUND)
    return rc;
  assert(bytes % sizeof(time_pair) == 0);
  bool found;
  uint32_t n = bytes / (uint32_t)sizeof(time_pair);
  uint32_t at = pair_find(array, n, b->date_time, &found);
  if (found) /* most bids: one lookup, and a write only for a raise */
    return pair_at(array, at).value >= b->price
               ? 0
               : pair_update(ctx, Q4_PENDING, bytes, at, b->price, true);
  rc = pair_insert(ctx, s, Q4_PENDING, array, bytes, at,
                   (time_pair){b->date_time, b->price});
  if (rc == 0)
    rc = sl_timer_register(ctx, SL_EVENT_TIME, b->date_time);
  return rc;
}

static int q4_bid_arrives(sl_ctx *ctx, scratch *s, const q4_bid *b) {
  const void *value;
  uint32_t bytes;
  int rc = sl_state_get(ctx, Q4_OPEN, &value, &bytes);
  if (rc == 0) {
    assert(bytes == sizeof(q4_open));
    q4_open open;
    memcpy(&open, value, sizeof open);
    if (!q4_offer(&open, b->price, b->date_time))
      return 0;
    return sl_state_put(ctx, Q4_OPEN, &open, sizeof open, NULL);
  }
  if (rc != SL_ENOTFOUND)
    return rc;
  /* No auction yet (or closed already: then the bid is past its expiry,
   * and its timer drops it like any other). */
  return q4_bid_waits(ctx, s, b);
}

static int q4_auction_arrives(sl_ctx *ctx, const q4_auction *a) {
  int rc = sl_state_get(ctx, Q4_OPEN, NULL, NULL);
  if (rc != SL_ENOTFOUND)
    return rc; /* 0: a second auction with this id; the first one stands */
  q4_open open = {a->date_time, a->expires, a->category, 0, 0};
  const void *array;
  uint32_t bytes;
  rc = sl_state_get(ctx, Q4_PENDING, &array, &bytes);
  if (rc == 0) {
    assert(bytes % sizeof(time_pair) == 0);
    for (uint32_t i = 0; i < bytes / sizeof(time_pair); i++) {
      time_pair p = pair_at(array, i);
      q4_offer(&open, p.value, p.time);
    }
    rc = sl_state_delete(ctx, Q4_PENDING);
  } else if (rc == SL_ENOTFOUND) {
    rc = 0;
  }
  if (rc == 0)
    rc = sl_state_put(ctx, Q4_OPEN, &open, sizeof open, NULL);
  if (rc == 0)
    rc = sl_timer_register(ctx, SL_EVENT_TIME, a->expires);
  return rc;
}

static int q4_winning(sl_ctx *ctx, void *state, int input,
                      const sl_record *in) {
  int rc;
  if (input == 0 && in->size_bytes == sizeof(q4_bid))
    rc = q4_bid_arrives(ctx, state, in->data);
  else if (input == 1 && in->size_bytes == sizeof(q4_auction))
    rc = q4_auction_arrives(ctx, in->data);
  else
    return malformed(ctx, in);
  return failed(ctx, rc, "q4.winning");
}

/* Drop the waiting bids up to time: a prefix of the sorted pairs. */
static int q4_pending_expire(sl_ctx *ctx, scratch *s, int64_t time) {
  const void *array;
  uint32_t bytes;
  int rc = sl_state_get(ctx, Q4_PENDING, &array, &bytes);
  if (rc)
    return rc == SL_ENOTFOUND ? 0 : rc;
  uint32_t n = bytes / (uint32_t)sizeof(time_pair), drop = 0;
  while (drop < n && pair_at(array, drop).time <= time)
    drop++;
  return pair_drop(ctx, s, Q4_PENDING, array, bytes, drop);
}

/* At expires: emit the winner and clear the auction.  At a pending bid's
 * date_time with no auction: drop the bids up to then.  Any other time is
 * a pending bid's timer whose auction came meanwhile: nothing to do. */
static int q4_winning_timer(sl_ctx *ctx, void *state, int domain,
                            int64_t time) {
  const void *value;
  uint32_t bytes;
  int rc = sl_state_get(ctx, Q4_OPEN, &value, &bytes);
  if (rc == SL_ENOTFOUND)
    return failed(ctx, q4_pending_expire(ctx, state, time), "q4.winning");
  if (rc)
    return failed(ctx, rc, "q4.winning");
  q4_open open;
  memcpy(&open, value, sizeof open);
  if (time < open.expires)
    return 0;
  if (open.has_bid) {
    q4_winner w = {open.category, open.best_price};
    rc = sl_emit(ctx, &w, sizeof w);
    if (rc)
      return rc;
  }
  return failed(ctx, sl_state_delete(ctx, Q4_OPEN), "q4.winning");
}

static int q4_average_add(sl_ctx *ctx, void *state, int input,
                          const sl_record *in) {
  if (in->size_bytes != sizeof(q4_winner))
    return malformed(ctx, in);
  const q4_winner *w = in->data;
  void *value;
  int rc = sl_state_update(ctx, Q4_SUM, sizeof(q4_sum), NULL, &value);
  if (rc)
    return failed(ctx, rc, "q4.average");
  q4_sum *s = value;
  s->sum += w->price;
  s->count++;
  /* The category's first winner: its average is emitted at the end. */
  if (s->count == 1)
    rc = sl_timer_register(ctx, SL_EVENT_TIME, SL_WATERMARK_MAX);
  return failed(ctx, rc, "q4.average");
}

/* sum / count in thousandths, rounded half up: floor((2000 sum + count) /
 * (2 count)), computed from sum = q count + r (0 <= r < count) so that
 * nothing overflows. */
static int64_t average_thousandths(int64_t sum, int64_t count) {
  assert(count > 0);
  int64_t q = sum / count, r = sum % count;
  if (r < 0) {
    q -= 1;
    r += count;
  }
  assert(r >= 0 && r < count);
  return q * 1000 + (int64_t)((2000u * (uint64_t)r + (uint64_t)count) /
                              (2u * (uint64_t)count));
}

static int q4_average_timer(sl_ctx *ctx, void *state, int domain,
                            int64_t time) {
  const void *value;
  uint32_t bytes;
  int rc = sl_state_get(ctx, Q4_SUM, &value, &bytes);
  if (rc)
    return failed(ctx, rc, "q4.average");
  q4_sum s;
  memcpy(&s, value, sizeof s);
  uint64_t category;
  rc = sl_ctx_key(ctx, &category);
  if (rc)
    return failed(ctx, rc, "q4.average");
  q4_row row = {(int64_t)category, average_thousandths(s.sum, s.count)};
  rc = sl_emit(ctx, &row, sizeof row);
  if (rc == 0)
    rc = failed(ctx, sl_state_delete(ctx, Q4_SUM), "q4.average");
  return rc;
}

static uint64_t q4_bid_auction(void *user, const sl_record *in) {
  return (uint64_t)((const q4_bid *)in->data)->auction;
}

static uint64_t q4_auction_id(void *user, const sl_record *in) {
  return (uint64_t)((const q4_auction *)in->data)->id;
}

static uint64_t q4_winner_category(void *user, const sl_record *in) {
  return (uint64_t)((const q4_winner *)in->data)->category;
}

static int build_q4(sl_job *job, sl_op *events, int p, sl_op **result) {
  static const sl_process_ops split = {.process = q4_split};
  static const sl_process_ops winning = {
      .open = scratch_open, .process = q4_winning,
      .on_timer = q4_winning_timer, .close = scratch_close};
  static const sl_process_ops average = {.process = q4_average_add,
                                         .on_timer = q4_average_timer};
  sl_op *bids, *auctions, *keyed[2], *winners, *by_category;
  int rc = sl_op_process(job, "q4.split", &events, 1, p, &split, NULL, &bids);
  if (rc == 0)
    rc = sl_op_side_output(job, "q4.auctions", bids, 1, &auctions);
  if (rc == 0)
    rc = sl_op_key_by(job, "q4.bids-by-auction", bids, q4_bid_auction, NULL,
                      &keyed[0]);
  if (rc == 0)
    rc = sl_op_key_by(job, "q4.auctions-by-id", auctions, q4_auction_id,
                      NULL, &keyed[1]);
  if (rc == 0)
    rc = sl_op_process(job, "q4.winning", keyed, 2, p, &winning, NULL,
                       &winners);
  if (rc == 0)
    rc = sl_op_key_by(job, "q4.by-category", winners, q4_winner_category,
                      NULL, &by_category);
  if (rc == 0)
    rc = sl_op_process(job, "q4.average", &by_category, 1, p, &average,
                       NULL, result);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* The largest value of each window and every item that has it (q5, q7): a
 * keyed process whose key stands for one window (and, in q7's first stage,
 * a share of its items).  Per key: the maximum so far (value state) and
 * the items at it (list state); a new maximum clears the list.  A timer at
 * end - 1 emits the items and clears the key.  The common case, an item
 * below the maximum, costs one state lookup. */

enum { TIES_MAX = 1, TIES_ITEMS = 2 };

typedef struct ties_spec {
  uint32_t item_bytes;                      /* at most 64 */
  int64_t (*value)(const void *item);       /* what is maximised */
  int64_t (*item_time)(const void *item);   /* checked first (note 8);
                                               NULL: checked upstream */
  int64_t (*window_end)(const void *item);  /* the item's window */
  int (*emit)(sl_ctx *ctx, const void *item, int64_t end); /* one winner */
} ties_spec;

static int ties_add(sl_ctx *ctx, const ties_spec *spec, const sl_record *in) {
  int rc = 0;
  if (spec->item_time &&
      !time_of(ctx, spec->item_time(in->data), "date_time", &rc))
    return rc;
  int64_t end = spec->window_end(in->data);
  if (window_late(ctx, end))
    return 0;
  int64_t value = spec->value(in->data);
  const void *stored;
  uint32_t bytes;
  rc = sl_state_get(ctx, TIES_MAX, &stored, &bytes);
  if (rc == SL_ENOTFOUND) {
    rc = sl_timer_register(ctx, SL_EVENT_TIME, end - 1); /* a new window */
  } else if (rc == 0) {
    int64_t max;
    assert(bytes == sizeof max);
    memcpy(&max, stored, sizeof max);
    if (value < max)
      return 0;
    if (value == max)
      return sl_liststate_add(ctx, TIES_ITEMS, in->data, in->size_bytes);
    rc = sl_state_delete(ctx, TIES_ITEMS); /* a new maximum */
  }
  if (rc == 0)
    rc = sl_state_put(ctx, TIES_MAX, &value, sizeof value, NULL);
  if (rc == 0)
    rc = sl_liststate_add(ctx, TIES_ITEMS, in->data, in->size_bytes);
  return rc;
}

static int ties_process(sl_ctx *ctx, void *user, int input,
                        const sl_record *in) {
  const ties_spec *spec = user;
  if (in->size_bytes != spec->item_bytes)
    return malformed(ctx, in);
  int rc = ties_add(ctx, spec, in);
  return rc == -ERANGE ? rc : failed(ctx, rc, sl_ctx_name(ctx));
}

static int ties_timer(sl_ctx *ctx, void *user, int domain, int64_t time) {
  const ties_spec *spec = user;
  const void *list, *item;
  uint32_t list_bytes, item_bytes, offset = 0;
  int rc = sl_liststate_get(ctx, TIES_ITEMS, &list, &list_bytes);
  if (rc)
    return rc == SL_ENOTFOUND ? 0 : failed(ctx, rc, sl_ctx_name(ctx));
  /* The list stays valid while emitting (no state call); bounded by it. */
  int64_t end;
  if (!end_of_timer(time, &end))
    return 0; /* no window of a valid time: nothing was added for it */
  while (rc == 0 &&
         sl_list_next(list, list_bytes, &offset, &item, &item_bytes)) {
    int64_t aligned[8];
    assert(item_bytes == spec->item_bytes && item_bytes <= sizeof aligned);
    memcpy(aligned, item, item_bytes);
    rc = spec->emit(ctx, aligned, end);
  }
  if (rc == 0)
    rc = sl_state_delete(ctx, TIES_ITEMS);
  if (rc == 0)
    rc = sl_state_delete(ctx, TIES_MAX);
  return failed(ctx, rc, sl_ctx_name(ctx));
}

static const sl_process_ops ties_ops = {.process = ties_process,
                                        .on_timer = ties_timer};

/* ------------------------------------------------------------------------ */
/* q5: hot items.
 *
 *   SELECT AuctionBids.wstart, AuctionBids.wend, AuctionBids.auction,
 *          AuctionBids.num
 *   FROM (SELECT auction, COUNT(*) AS num, window_start AS wstart,
 *                window_end AS wend
 *         FROM TABLE(HOP(TABLE bid, DESCRIPTOR(dateTime),
 *                        INTERVAL '2' SECOND, INTERVAL '10' SECOND))
 *         GROUP BY auction, window_start, window_end) AS AuctionBids
 *   JOIN (SELECT MAX(num) AS maxn, wstart, wend
 *         FROM (... the same counts ...) GROUP BY wstart, wend) AS MaxBids
 *   ON AuctionBids.wstart = MaxBids.wstart AND
 *      AuctionBids.wend = MaxBids.wend AND AuctionBids.num >= MaxBids.maxn;
 *
 * q5.bids projects each bid to its auction id.  Keyed by auction, q5.count
 * is AuctionBids: it counts the bids of each 2 s pane (the slide) in a
 * sorted array of {pane start, count}, one lookup and an in-place update
 * per bid, and one event-time timer per auction walks the window ends
 * (end - 1, in 2 s steps): each emits {start, end, auction, num} for the
 * window [end - 10 s, end), the sum of its 5 panes, and drops the pane
 * that leaves.  (An sl_op_window of 10 s every 2 s gives the same rows,
 * but updates 5 windows and registers 5 timers per bid: 2-4x slower
 * here.)  As there, a bid whose windows have all fired is late, and one
 * whose first windows have fired counts in the rest.  Keyed by window
 * start, q5.hot (the ties process) keeps each window's largest num and
 * the auctions that have it: the MaxBids join. */

enum { Q5_PANES = 1 };
_Static_assert(Q5_SIZE_MS % Q5_SLIDE_MS == 0, "windows are whole panes");

static int q5_project(void *user, const sl_record *in, sl_ctx *ctx) {
  const nx_record *r = event_of(in);
  if (!r)
    return malformed(ctx, in);
  if (r->type != NX_BID)
    return 0;
  return sl_emit(ctx, &r->field[NX_BID_AUCTION], sizeof(int64_t));
}

/* The key of the 8-byte projections of q5 and q11. */
static uint64_t first_integer(void *user, const sl_record *in) {
  return *(const uint64_t *)in->data;
}

/* The first window end - 1 of pane that the watermark has not passed (the
 * caller checked that the last one, pane + size - 1, is not passed). */
static int64_t q5_first_due(int64_t pane, int64_t watermark) {
  int64_t due = pane + Q5_SLIDE_MS - 1;
  for (int i = 0; i < Q5_SIZE_MS / Q5_SLIDE_MS && due <= watermark; i++)
    due += Q5_SLIDE_MS;
  assert(due > watermark);
  return due;
}

static int q5_count_bid(sl_ctx *ctx, scratch *s, int64_t ts) {
  int rc = 0;
  if (!time_of(ctx, ts, "timestamp", &rc))
    return rc;
  int64_t pane = window_start(ts, Q5_SLIDE_MS);
  if (window_late(ctx, pane + Q5_SIZE_MS))
    return 0;
  const void *array = NULL;
  uint32_t bytes = 0;
  rc = sl_state_get(ctx, Q5_PANES, &array, &bytes);
  if (rc && rc != SL_ENOTFOUND)
    return rc;
  bool found;
  uint32_t n = bytes / (uint32_t)sizeof(time_pair);
  uint32_t at = pair_find(array, n, pane, &found);
  if (found)
    return pair_update(ctx, Q5_PANES, bytes, at, 1, false);
  rc = pair_insert(ctx, s, Q5_PANES, array, bytes, at, (time_pair){pane, 1});
  if (rc == 0)
    rc = sl_timer_register(ctx, SL_EVENT_TIME,
                           q5_first_due(pane, sl_ctx_watermark(ctx)));
  return rc;
}

static int q5_count(sl_ctx *ctx, void *state, int input,
                    const sl_record *in) {
  if (in->size_bytes != sizeof(int64_t) || in->timestamp == SL_NO_TIMESTAMP)
    return malformed(ctx, in);
  int rc = q5_count_bid(ctx, state, in->timestamp);
  return rc == -ERANGE ? rc : failed(ctx, rc, "q5.count");
}

/* Window [time + 1 - size, time + 1) of the key's auction: emit its count,
 * drop the pane no later window holds, and come back at the next window
 * end that holds a pane still kept. */
static int q5_count_timer(sl_ctx *ctx, void *state, int domain,
                          int64_t time) {
  /* Panes are of valid times (q5_count_bid), so their timers are far
   * from the int64 limits; a time that is not (the final watermark's
   * reach) has no window (note 8). */
  if (time < SL_TIME_MIN_VALID - Q5_SIZE_MS ||
      time > SL_TIME_MAX_VALID + Q5_SIZE_MS)
    return 0;
  int64_t end = time + 1, start = end - Q5_SIZE_MS;
  const void *array;
  uint32_t bytes;
  int rc = sl_state_get(ctx, Q5_PANES, &array, &bytes);
  if (rc)
    return rc == SL_ENOTFOUND ? 0 : failed(ctx, rc, "q5.count");
  uint32_t n = bytes / (uint32_t)sizeof(time_pair), done = 0;
  int64_t num = 0, next = INT64_MAX;
  for (uint32_t i = 0; i < n; i++) {
    time_pair pane = pair_at(array, i);
    assert(pane.time >= start); /* earlier ones were dropped */
    if (pane.time < end)
      num += pane.value;
    if (pane.time <= start)
      done++; /* this was its last window */
    else if (next == INT64_MAX) /* the first pane kept: its next window */
      next = pane.time + Q5_SLIDE_MS - 1 > time + Q5_SLIDE_MS
                 ? pane.time + Q5_SLIDE_MS - 1
                 : time + Q5_SLIDE_MS;
  }
  assert(next == INT64_MAX || next > time); /* never into the past */
  uint64_t auction;
  rc = sl_ctx_key(ctx, &auction);
  if (rc == 0 && num > 0) {
    q5_row row = {start, end, (int64_t)auction, num};
    rc = sl_emit(ctx, &row, sizeof row); /* not a state call: array stays */
  }
  if (rc == 0)
    rc = pair_drop(ctx, state, Q5_PANES, array, bytes, done);
  if (rc == 0 && next != INT64_MAX)
    rc = sl_timer_register(ctx, SL_EVENT_TIME, next);
  return failed(ctx, rc, "q5.count");
}

static int64_t q5_value(const void *item) {
  return ((const q5_row *)item)->count;
}

static int64_t q5_window_end(const void *item) {
  return ((const q5_row *)item)->end;
}


static int q5_emit(sl_ctx *ctx, const void *item, int64_t end) {
  return sl_emit(ctx, item, sizeof(q5_row));
}

static uint64_t q5_row_start(void *user, const sl_record *in) {
  return (uint64_t)((const q5_row *)in->data)->start;
}

static int build_q5(sl_job *job, sl_op *events, int p, sl_op **result) {
  static const sl_process_ops count = {.open = scratch_open,
                                       .process = q5_count,
                                       .on_timer = q5_count_timer,
                                       .close = scratch_close};
  /* q5.count made the windows from valid times (note 8). */
  static const ties_spec hot = {sizeof(q5_row), q5_value, NULL,
                                q5_window_end, q5_emit};
  sl_op *bids, *by_auction, *counts, *by_window;
  int rc = sl_op_flat_map(job, "q5.bids", events, p, q5_project, NULL, &bids);
  if (rc == 0)
    rc = sl_op_key_by(job, "q5.by-auction", bids, first_integer, NULL,
                      &by_auction);
  if (rc == 0)
    rc = sl_op_process(job, "q5.count", &by_auction, 1, p, &count, NULL,
                       &counts);
  if (rc == 0)
    rc = sl_op_key_by(job, "q5.by-window", counts, q5_row_start, NULL,
                      &by_window);
  if (rc == 0)
    rc = sl_op_process(job, "q5.hot", &by_window, 1, p, &ties_ops,
                       (void *)&hot, result);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* q7: highest bid.
 *
 *   SELECT B.auction, B.price, B.bidder, B.dateTime
 *   FROM bid B
 *   JOIN (SELECT MAX(price) AS maxprice, window_end AS dateTime
 *         FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime),
 *                           INTERVAL '10' SECOND))
 *         GROUP BY window_start, window_end) B1
 *   ON B.price = B1.maxprice
 *   WHERE B.dateTime BETWEEN B1.dateTime - INTERVAL '10' SECOND
 *                        AND B1.dateTime;
 *
 * (printed with the window's bounds, as nexmark.h's columns).  Keying
 * every bid of a window to one key would leave one instance with all the
 * work, so the maximum is taken in two stages of the ties process:
 * q7.local keyed by (window, auction mod Q7_BUCKETS) keeps each share's
 * top bids and emits them at end - 1; q7.global keyed by window start
 * keeps the top of those (note 4) and emits them as result rows. */

static int q7_project(void *user, const sl_record *in, sl_ctx *ctx) {
  return q0_project(user, in, ctx);
}

static int64_t bid_price(const void *item) {
  return ((const bid_row *)item)->price;
}

static int64_t bid_time(const void *item) {
  return ((const bid_row *)item)->date_time;
}

/* ties_add checked the time first (bid_time). */
static int64_t q7_window_end(const void *item) {
  int64_t ts = ((const bid_row *)item)->date_time;
  return window_start(ts, WINDOW_TUMBLE_MS) + WINDOW_TUMBLE_MS;
}

static int q7_emit_local(sl_ctx *ctx, const void *item, int64_t end) {
  return sl_emit(ctx, item, sizeof(bid_row));
}

static int q7_emit_global(sl_ctx *ctx, const void *item, int64_t end) {
  q7_row row = {end - WINDOW_TUMBLE_MS, end, *(const bid_row *)item};
  return sl_emit(ctx, &row, sizeof row);
}

/* The key functions cannot fail: a bid of an invalid time gets key 0 and
 * is refused by the ties process it reaches (note 8). */
static uint64_t q7_share_key(void *user, const sl_record *in) {
  const bid_row *b = in->data;
  if (!sl_time_valid(b->date_time))
    return 0;
  uint64_t window = (uint64_t)(window_start(b->date_time, WINDOW_TUMBLE_MS) /
                               WINDOW_TUMBLE_MS);
  uint64_t bucket = (uint64_t)b->auction % Q7_BUCKETS;
  return window * Q7_BUCKETS + bucket;
}

static uint64_t q7_window_key(void *user, const sl_record *in) {
  const bid_row *b = in->data;
  if (!sl_time_valid(b->date_time))
    return 0;
  return (uint64_t)window_start(b->date_time, WINDOW_TUMBLE_MS);
}

static int build_q7(sl_job *job, sl_op *events, int p, sl_op **result) {
  static const ties_spec local = {sizeof(bid_row), bid_price, bid_time,
                                  q7_window_end, q7_emit_local};
  static const ties_spec global = {sizeof(bid_row), bid_price, bid_time,
                                   q7_window_end, q7_emit_global};
  sl_op *bids, *by_share, *tops, *by_window;
  int rc = sl_op_flat_map(job, "q7.bids", events, p, q7_project, NULL, &bids);
  if (rc == 0)
    rc = sl_op_key_by(job, "q7.by-share", bids, q7_share_key, NULL,
                      &by_share);
  if (rc == 0)
    rc = sl_op_process(job, "q7.local", &by_share, 1, p, &ties_ops,
                       (void *)&local, &tops);
  if (rc == 0)
    rc = sl_op_key_by(job, "q7.by-window", tops, q7_window_key, NULL,
                      &by_window);
  if (rc == 0)
    rc = sl_op_process(job, "q7.global", &by_window, 1, p, &ties_ops,
                       (void *)&global, result);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* q8: monitor new users.
 *
 *   SELECT P.id, P.name, P.starttime
 *   FROM (SELECT id, name, window_start AS starttime, window_end AS endtime
 *         FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(dateTime),
 *                           INTERVAL '10' SECOND))
 *         GROUP BY id, name, window_start, window_end) P
 *   JOIN (SELECT seller, window_start AS starttime, window_end AS endtime
 *         FROM TABLE(TUMBLE(TABLE auction, DESCRIPTOR(dateTime),
 *                           INTERVAL '10' SECOND))
 *         GROUP BY seller, window_start, window_end) A
 *   ON P.id = A.seller AND P.starttime = A.starttime
 *      AND P.endtime = A.endtime;
 *
 * q8.split projects auctions {seller, date_time} (main output) and persons
 * {id, date_time, name} (port 1), keyed by seller / person id into
 * q8.join, a keyed two-input process that is both GROUP BYs and the join:
 * per key, a map state from window start to "an auction opened" (A) and a
 * list of the (window, name) pairs registered (P).  A row is emitted as
 * soon as both sides of one (id, name, window) are there, once: an
 * auction for a window already in A costs one lookup and emits nothing,
 * and a person already in P is ignored.  A timer at end - 1 forgets the
 * window.  Only 8% of the events reach q8.join. */

enum { Q8_PEOPLE = 1, Q8_AUCTION_WINDOWS = 2 };

static int q8_split(sl_ctx *ctx, void *state, int input,
                    const sl_record *in) {
  const nx_record *r = event_of(in);
  if (!r)
    return malformed(ctx, in);
  if (r->type == NX_AUCTION) {
    q8_auction a = {r->field[NX_AUCTION_SELLER],
                    r->field[NX_AUCTION_DATE_TIME]};
    return sl_emit(ctx, &a, sizeof a);
  }
  if (r->type != NX_PERSON)
    return 0;
  nx_event e;
  if (nx_decode(in->data, in->size_bytes, &e) != 0 ||
      e.u.person.name.len > NX_MAX_STRING_BYTES)
    return malformed(ctx, in);
  _Alignas(8) char buffer[sizeof(q8_person) + NX_MAX_STRING_BYTES];
  q8_person head = {e.u.person.id, e.u.person.date_time,
                    e.u.person.name.len, 0};
  memcpy(buffer, &head, sizeof head);
  memcpy(buffer + sizeof head, e.u.person.name.ptr, head.name_len);
  return sl_emit_side(ctx, 1, buffer, (uint32_t)sizeof head + head.name_len,
                      in->timestamp);
}

static int q8_emit(sl_ctx *ctx, int64_t start, int64_t id, const char *name,
                   uint32_t name_len) {
  _Alignas(8) char buffer[sizeof(q8_row) + NX_MAX_STRING_BYTES];
  assert(name_len <= NX_MAX_STRING_BYTES);
  q8_row head = {start, start + WINDOW_TUMBLE_MS, id, name_len, 0};
  memcpy(buffer, &head, sizeof head);
  memcpy(buffer + sizeof head, name, name_len);
  return sl_emit(ctx, buffer, (uint32_t)sizeof head + name_len);
}

/* A P item: the window start (8 bytes), then the name. */
static int64_t q8_item_start(const void *item) {
  int64_t start;
  memcpy(&start, item, sizeof start);
  return start;
}

static int q8_person_arrives(sl_ctx *ctx, const q8_person *p,
                             const char *name) {
  int rc = 0;
  if (!time_of(ctx, p->date_time, "person date_time", &rc))
    return rc;
  int64_t start = window_start(p->date_time, WINDOW_TUMBLE_MS);
  if (window_late(ctx, start + WINDOW_TUMBLE_MS))
    return 0;
  const void *list, *item;
  uint32_t list_bytes, item_bytes, offset = 0;
  rc = sl_liststate_get(ctx, Q8_PEOPLE, &list, &list_bytes);
  if (rc && rc != SL_ENOTFOUND)
    return rc;
  /* Bounded by the list: each step moves offset forward. */
  while (rc == 0 && sl_list_next(list, list_bytes, &offset, &item,
                                 &item_bytes))
    if (q8_item_start(item) == start && item_bytes == 8u + p->name_len &&
        memcmp((const char *)item + 8, name, p->name_len) == 0)
      return 0; /* this (id, name, window) is known */
  rc = sl_mapstate_get(ctx, Q8_AUCTION_WINDOWS, &start, sizeof start, NULL,
                       NULL);
  if (rc == 0)
    rc = q8_emit(ctx, start, p->id, name, p->name_len);
  else if (rc == SL_ENOTFOUND)
    rc = 0;
  char entry[8 + NX_MAX_STRING_BYTES];
  memcpy(entry, &start, 8);
  memcpy(entry + 8, name, p->name_len);
  if (rc == 0)
    rc = sl_liststate_add(ctx, Q8_PEOPLE, entry, 8u + p->name_len);
  if (rc == 0)
    rc = sl_timer_register(ctx, SL_EVENT_TIME, start + WINDOW_TUMBLE_MS - 1);
  return rc;
}

static int q8_auction_arrives(sl_ctx *ctx, const q8_auction *a) {
  int rc = 0;
  if (!time_of(ctx, a->date_time, "auction date_time", &rc))
    return rc;
  int64_t start = window_start(a->date_time, WINDOW_TUMBLE_MS);
  if (window_late(ctx, start + WINDOW_TUMBLE_MS))
    return 0;
  rc = sl_mapstate_get(ctx, Q8_AUCTION_WINDOWS, &start, sizeof start,
                           NULL, NULL);
  if (rc != SL_ENOTFOUND)
    return rc; /* 0: the seller has an auction in this window already */
  uint8_t opened = 1;
  rc = sl_mapstate_put(ctx, Q8_AUCTION_WINDOWS, &start, sizeof start,
                       &opened, sizeof opened);
  if (rc == 0)
    rc = sl_timer_register(ctx, SL_EVENT_TIME, start + WINDOW_TUMBLE_MS - 1);
  const void *list, *item;
  uint32_t list_bytes, item_bytes, offset = 0;
  if (rc == 0)
    rc = sl_liststate_get(ctx, Q8_PEOPLE, &list, &list_bytes);
  if (rc)
    return rc == SL_ENOTFOUND ? 0 : rc;
  /* The persons of this window, each once; bounded by the list. */
  while (rc == 0 && sl_list_next(list, list_bytes, &offset, &item,
                                 &item_bytes))
    if (q8_item_start(item) == start)
      rc = q8_emit(ctx, start, a->seller, (const char *)item + 8,
                   item_bytes - 8u);
  return rc;
}

static int q8_join(sl_ctx *ctx, void *state, int input,
                   const sl_record *in) {
  int rc;
  if (input == 0 && in->size_bytes == sizeof(q8_auction)) {
    rc = q8_auction_arrives(ctx, in->data);
  } else if (input == 1 && in->size_bytes >= sizeof(q8_person)) {
    const q8_person *p = in->data;
    if (in->size_bytes != sizeof *p + p->name_len ||
        p->name_len > NX_MAX_STRING_BYTES)
      return malformed(ctx, in);
    rc = q8_person_arrives(ctx, p, (const char *)(p + 1));
  } else {
    return malformed(ctx, in);
  }
  return rc == -ERANGE ? rc : failed(ctx, rc, "q8.join");
}

static bool q8_item_not_in(const void *item, uint32_t item_bytes,
                           int64_t start) {
  assert(item_bytes >= 8);
  return q8_item_start(item) != start;
}

/* end - 1 of window start: forget it on both sides. */
static int q8_timer(sl_ctx *ctx, void *state, int domain, int64_t time) {
  int64_t end, start;
  if (!end_of_timer(time, &end) ||
      !sl_time_sub(end, WINDOW_TUMBLE_MS, &start))
    return 0; /* no window of a valid time (note 8) */
  int rc = sl_mapstate_delete(ctx, Q8_AUCTION_WINDOWS, &start, sizeof start);
  if (rc == 0 || rc == SL_ENOTFOUND)
    rc = list_retain(ctx, state, Q8_PEOPLE, q8_item_not_in, start);
  return failed(ctx, rc, "q8.join");
}

static uint64_t q8_auction_seller(void *user, const sl_record *in) {
  return (uint64_t)((const q8_auction *)in->data)->seller;
}

static uint64_t q8_person_id(void *user, const sl_record *in) {
  return (uint64_t)((const q8_person *)in->data)->id;
}

static int build_q8(sl_job *job, sl_op *events, int p, sl_op **result) {
  static const sl_process_ops split = {.process = q8_split};
  static const sl_process_ops join = {.open = scratch_open,
                                      .process = q8_join,
                                      .on_timer = q8_timer,
                                      .close = scratch_close};
  sl_op *auctions, *persons, *keyed[2];
  int rc = sl_op_process(job, "q8.split", &events, 1, p, &split, NULL,
                         &auctions);
  if (rc == 0)
    rc = sl_op_side_output(job, "q8.persons", auctions, 1, &persons);
  if (rc == 0)
    rc = sl_op_key_by(job, "q8.auctions-by-seller", auctions,
                      q8_auction_seller, NULL, &keyed[0]);
  if (rc == 0)
    rc = sl_op_key_by(job, "q8.persons-by-id", persons, q8_person_id, NULL,
                      &keyed[1]);
  if (rc == 0)
    rc = sl_op_process(job, "q8.join", keyed, 2, p, &join, NULL, result);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* q11: user sessions.
 *
 *   SELECT B.bidder, count(*) AS bid_count,
 *          SESSION_START(B.dateTime, INTERVAL '10' SECOND) AS starttime,
 *          SESSION_END(B.dateTime, INTERVAL '10' SECOND) AS endtime
 *   FROM bid B
 *   GROUP BY B.bidder, SESSION(B.dateTime, INTERVAL '10' SECOND);
 *
 * q11.bids projects each bid to its bidder; keyed by bidder, a session
 * sl_op_window with a gap of 10 s counts (8-byte accumulator, merged when
 * sessions merge) and emits {bidder, start, end, count}. */

static int q11_project(void *user, const sl_record *in, sl_ctx *ctx) {
  const nx_record *r = event_of(in);
  if (!r)
    return malformed(ctx, in);
  if (r->type != NX_BID)
    return 0;
  return sl_emit(ctx, &r->field[NX_BID_BIDDER], sizeof(int64_t));
}

static void count_init(void *user, void *acc) { *(int64_t *)acc = 0; }

static void count_add(void *user, void *acc, const sl_record *in) {
  *(int64_t *)acc += 1;
}

static void count_merge(void *user, void *acc, const void *other) {
  *(int64_t *)acc += *(const int64_t *)other;
}

static int q11_emit(void *user, sl_ctx *ctx, uint64_t key,
                    const sl_window *w, const void *acc) {
  q11_row row = {(int64_t)key, w->start, w->end, *(const int64_t *)acc};
  return sl_emit(ctx, &row, sizeof row);
}

static int build_q11(sl_job *job, sl_op *events, int p, sl_op **result) {
  sl_window_config w = {.type = SL_WINDOW_SESSION, .gap = Q11_GAP_MS,
                        .acc_bytes = sizeof(int64_t), .init = count_init,
                        .add = count_add, .merge = count_merge,
                        .emit = q11_emit};
  sl_op *bids, *by_bidder;
  int rc = sl_op_flat_map(job, "q11.bids", events, p, q11_project, NULL,
                          &bids);
  if (rc == 0)
    rc = sl_op_key_by(job, "q11.by-bidder", bids, first_integer, NULL,
                      &by_bidder);
  if (rc == 0)
    rc = sl_op_window(job, "q11.sessions", by_bidder, p, &w, result);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* The table of queries. */

typedef int (*build_fn)(sl_job *job, sl_op *events, int p, sl_op **result);

static const struct query {
  int number;
  const char *header;
  build_fn build;
} queries[] = {
    {NX_Q0, "auction,bidder,price,date_time", build_q0},
    {NX_Q1, "auction,bidder,price,date_time", build_q1},
    {NX_Q2, "auction,price", build_q2},
    {NX_Q3, "name,city,state,id", build_q3},
    {NX_Q4, "category,avg_price", build_q4},
    {NX_Q5, "window_start,window_end,auction,num", build_q5},
    {NX_Q7, "window_start,window_end,auction,bidder,price,date_time",
     build_q7},
    {NX_Q8, "window_start,window_end,id,name", build_q8},
    {NX_Q11, "bidder,window_start,window_end,bid_count", build_q11},
};

#define QUERY_COUNT ((int)(sizeof queries / sizeof queries[0]))

static const struct query *query_find(int q) {
  for (int i = 0; i < QUERY_COUNT; i++)
    if (queries[i].number == q)
      return &queries[i];
  return NULL;
}

int nx_query_parse(const char *text) {
  if (text == NULL)
    return -1;
  if (text[0] == 'q' || text[0] == 'Q')
    text++;
  /* One or two digits, no sign, no leading zero, nothing after. */
  size_t n = strlen(text);
  if (n < 1 || n > 2 || (n == 2 && text[0] == '0'))
    return -1;
  int q = 0;
  for (size_t i = 0; i < n; i++) {
    if (text[i] < '0' || text[i] > '9')
      return -1;
    q = q * 10 + (text[i] - '0');
  }
  return query_find(q) ? q : -1;
}

int nx_query_count(void) { return QUERY_COUNT; }

int nx_query_at(int i) {
  return i >= 0 && i < QUERY_COUNT ? queries[i].number : -1;
}

int nx_query_build(sl_job *job, int query, sl_op *events, int parallelism,
                   sl_op **result) {
  const struct query *q = query_find(query);
  if (job == NULL || events == NULL || result == NULL || q == NULL)
    return EINVAL;
  return q->build(job, events, parallelism, result);
}

const char *nx_query_header(int query) {
  const struct query *q = query_find(query);
  return q ? q->header : NULL;
}

/* ------------------------------------------------------------------------ */
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
