/* q4.c — Nexmark q4, average price per category, as a sluice job
 * (the shared rules of every query: query.h). */

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "query.h"

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
 * auctions {id, date_time, expires, category} (port 1), both keyed by a
 * bucket of 8 consecutive auction ids (id >> 3) into q4.winning_buckets,
 * a keyed two-input process that is the inner query.  Per bucket it keeps one
 * array of its open auctions, each with its highest bid in range so far,
 * sorted by id (one lookup and an in-place update per raise), and an
 * event-time timer at each auction's expires.  A timer of the bucket
 * emits {category, highest bid} of every auction there whose expires the
 * watermark has passed, and removes it: each of those has a timer of its
 * own at or before the watermark, due in the same advance, so only the
 * order of winners among keys changes, and their timers find nothing.
 * Once the watermark has passed expires no bid in range can come any more
 * (a bid is stamped with its date_time).  A bid that finds no auction
 * waits, with a timer at its own date_time: its auction, if it is in
 * range, is stamped no later and so has arrived by the time the watermark
 * passes that; the bucket's timers drop the waiting bids up to their time.
 * Waiting bids are summed up as the highest price per auction and
 * date_time (the range test needs nothing else), in one array per bucket
 * sorted by auction and date_time: with two source instances one may run
 * ahead of the other, and then a hot auction's bids from it all wait; most
 * of them share a millisecond with the one before and cost one lookup, no
 * write.
 *   Why buckets: each key costs an entry for its state besides its
 *   timers, and a checkpoint writes every entry changed since the last
 *   one.  Auctions come in id order and their bids go to the last hundred
 *   or so, so eight auctions share one array entry instead of eight
 *   (their timers stay one each: expiries differ); any ids work, sparse
 *   ones just leave buckets of one auction.
 * q4.average, keyed by category, is the outer query: a (sum, count) per
 * category and a timer at SL_WATERMARK_MAX, which fires at the end of
 * input, emits the average rounded half up to thousandths. */

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

/* q4.winning_buckets's state, per bucket of 8 auction ids (head comment); ids 3
 * and 4, not 1 and 2: keyed by auction, those held one auction's. */
enum { Q4_OPENS = 3, Q4_WAITING = 4 };
enum { Q4_SUM = 1 };
#define Q4_BUCKET_BITS 3

/* Q4_OPENS: the bucket's auctions still open, sorted by id. */
typedef struct q4_open {
  int64_t id, date_time, expires, category, best_price, has_bid;
} q4_open;

/* Q4_WAITING: bids of the bucket's auctions not come yet, the highest
 * price at each date_time, sorted by auction and date_time. */
typedef struct q4_wait {
  int64_t auction, date_time, price;
} q4_wait;

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

/* Sorted arrays of cells of `width` int64s, ordered by their first
 * `keys` (1 or 2) int64s: where {k0, k1} (k1 unused for 1) is or belongs
 * among n cells (searched from the end: new auctions and times come
 * last); *found if there. */
static uint32_t cells_find(const void *array, uint32_t n, uint32_t width,
                           int keys, int64_t k0, int64_t k1, bool *found) {
  assert(keys == 1 || keys == 2);
  uint32_t at = n;
  int64_t key[2] = {0, 0};
  for (; at > 0; at--) { /* at most n steps */
    memcpy(key, (const int64_t *)array + (size_t)(at - 1) * width,
           sizeof(int64_t) * (size_t)keys);
    if (key[0] < k0 || (key[0] == k0 && (keys == 1 || key[1] <= k1)))
      break; /* cell at - 1 is at or before {k0, k1} */
  }
  *found = at > 0 && key[0] == k0 && (keys == 1 || key[1] == k1);
  return *found ? at - 1 : at;
}

/* State id's array with `drop` cells from index at replaced by `fresh`
 * (one cell, or none if NULL), built in the scratch (a put may free what
 * array points into); an empty result deletes the state. */
static int cells_splice(sl_ctx *ctx, scratch *s, uint16_t id,
                        const void *array, uint32_t bytes, uint32_t cell,
                        uint32_t at, uint32_t drop, const void *fresh) {
  size_t head = (size_t)at * cell, tail = head + (size_t)drop * cell;
  assert(tail <= bytes);
  uint32_t out = bytes - drop * cell + (fresh ? cell : 0);
  if (out == 0)
    return sl_state_delete(ctx, id);
  int rc = nxq_scratch_reserve(s, out);
  if (rc)
    return rc;
  if (head > 0) /* array is NULL for a state not there yet */
    memcpy(s->bytes, array, head);
  if (fresh)
    memcpy(s->bytes + head, fresh, cell);
  if (bytes > tail)
    memcpy(s->bytes + head + (fresh ? cell : 0), (const char *)array + tail,
           bytes - tail);
  return sl_state_put(ctx, id, s->bytes, out, NULL);
}

/* The bucket's array of state id (NULL and 0 bytes if none), checked to
 * be whole cells. */
static int cells_get(sl_ctx *ctx, uint16_t id, uint32_t cell,
                     const void **array, uint32_t *bytes) {
  *array = NULL;
  *bytes = 0;
  int rc = sl_state_get(ctx, id, array, bytes);
  if (rc == SL_ENOTFOUND)
    return 0;
  return rc ? rc : *bytes % cell ? SL_ECORRUPT : 0;
}

/* A bid whose auction is not there: into the bucket's waiting bids. */
static int q4_bid_waits(sl_ctx *ctx, scratch *s, const q4_bid *b) {
  const void *array;
  uint32_t bytes;
  int rc = cells_get(ctx, Q4_WAITING, sizeof(q4_wait), &array, &bytes);
  if (rc)
    return rc;
  bool found;
  uint32_t n = bytes / (uint32_t)sizeof(q4_wait);
  uint32_t at =
      cells_find(array, n, 3, 2, b->auction, b->date_time, &found);
  if (found) { /* most bids: one lookup, and a write only for a raise */
    q4_wait w;
    memcpy(&w, (const char *)array + (size_t)at * sizeof w, sizeof w);
    if (w.price >= b->price)
      return 0;
    void *stored;
    rc = sl_state_update(ctx, Q4_WAITING, bytes, NULL, &stored);
    if (rc == 0)
      memcpy((char *)stored + (size_t)at * sizeof w +
                 offsetof(q4_wait, price),
             &b->price, sizeof b->price);
    return rc;
  }
  q4_wait fresh = {b->auction, b->date_time, b->price};
  rc = cells_splice(ctx, s, Q4_WAITING, array, bytes, sizeof fresh, at, 0,
                    &fresh);
  if (rc == 0)
    rc = sl_timer_register(ctx, SL_EVENT_TIME, b->date_time);
  return rc;
}

static int q4_bid_arrives(sl_ctx *ctx, scratch *s, const q4_bid *b) {
  const void *array;
  uint32_t bytes;
  int rc = cells_get(ctx, Q4_OPENS, sizeof(q4_open), &array, &bytes);
  if (rc)
    return rc;
  bool found;
  uint32_t at = cells_find(array, bytes / (uint32_t)sizeof(q4_open), 6, 1,
                           b->auction, 0, &found);
  if (!found) /* no auction yet (or closed already: then the bid is past
               * its expiry, and its timer drops it like any other) */
    return q4_bid_waits(ctx, s, b);
  q4_open open;
  memcpy(&open, (const char *)array + (size_t)at * sizeof open, sizeof open);
  if (!q4_offer(&open, b->price, b->date_time))
    return 0;
  void *stored;
  rc = sl_state_update(ctx, Q4_OPENS, bytes, NULL, &stored);
  if (rc == 0)
    memcpy((char *)stored + (size_t)at * sizeof open, &open, sizeof open);
  return rc;
}

/* The waiting bids of auction a.id offered to it, then dropped. */
static int q4_take_waiting(sl_ctx *ctx, scratch *s, q4_open *open) {
  const void *array;
  uint32_t bytes;
  int rc = cells_get(ctx, Q4_WAITING, sizeof(q4_wait), &array, &bytes);
  if (rc || bytes == 0)
    return rc;
  bool found;
  uint32_t n = bytes / (uint32_t)sizeof(q4_wait), end = n;
  uint32_t first = cells_find(array, n, 3, 2, open->id, INT64_MIN, &found);
  for (uint32_t i = first; i < n; i++) {
    q4_wait w;
    memcpy(&w, (const char *)array + (size_t)i * sizeof w, sizeof w);
    if (w.auction != open->id) {
      end = i;
      break;
    }
    q4_offer(open, w.price, w.date_time);
  }
  if (end == first)
    return 0;
  return cells_splice(ctx, s, Q4_WAITING, array, bytes, sizeof(q4_wait),
                      first, end - first, NULL);
}

static int q4_auction_arrives(sl_ctx *ctx, scratch *s,
                              const q4_auction *a) {
  const void *array;
  uint32_t bytes;
  int rc = cells_get(ctx, Q4_OPENS, sizeof(q4_open), &array, &bytes);
  bool found = false;
  if (rc == 0)
    cells_find(array, bytes / (uint32_t)sizeof(q4_open), 6, 1, a->id, 0,
               &found);
  if (rc || found)
    return rc; /* found: a second auction with this id; the first stands */
  q4_open open = {a->id, a->date_time, a->expires, a->category, 0, 0};
  rc = q4_take_waiting(ctx, s, &open);
  if (rc == 0) /* again: the waiting bids' put may have moved it */
    rc = cells_get(ctx, Q4_OPENS, sizeof(q4_open), &array, &bytes);
  uint32_t at = 0;
  if (rc == 0)
    at = cells_find(array, bytes / (uint32_t)sizeof(q4_open), 6, 1, a->id,
                    0, &found);
  if (rc == 0)
    rc = cells_splice(ctx, s, Q4_OPENS, array, bytes, sizeof open, at, 0,
                      &open);
  if (rc == 0)
    rc = sl_timer_register(ctx, SL_EVENT_TIME, a->expires);
  return rc;
}

static uint64_t q4_bucket(int64_t auction) {
  return (uint64_t)auction >> Q4_BUCKET_BITS;
}

static int q4_winning(sl_ctx *ctx, void *state, int input,
                      const sl_record *in) {
  int rc;
  if (input == 0 && in->size_bytes == sizeof(q4_bid))
    rc = q4_bid_arrives(ctx, state, in->data);
  else if (input == 1 && in->size_bytes == sizeof(q4_auction))
    rc = q4_auction_arrives(ctx, state, in->data);
  else
    return malformed(ctx, in);
  return failed(ctx, rc, "q4.winning_buckets");
}

/* Keep the cells of state id (`cell` bytes each, their int64 at `field`
 * the time) whose time is after `time`; for Q4_OPENS, emit the winner of
 * each auction that leaves, stamped with its expiry as its own timer
 * would have been. */
static int q4_expire(sl_ctx *ctx, scratch *s, uint16_t id, uint32_t cell,
                     size_t field, int64_t time) {
  const void *array;
  uint32_t bytes;
  int rc = cells_get(ctx, id, cell, &array, &bytes);
  if (rc || bytes == 0)
    return rc;
  rc = nxq_scratch_reserve(s, bytes);
  if (rc)
    return rc;
  uint32_t n = bytes / cell, kept = 0;
  for (uint32_t i = 0; i < n && rc == 0; i++) {
    const char *c = (const char *)array + (size_t)i * cell;
    int64_t t;
    memcpy(&t, c + field, sizeof t);
    if (t > time) {
      memcpy(s->bytes + (size_t)kept++ * cell, c, cell);
      continue;
    }
    q4_open open;
    if (id == Q4_OPENS &&
        (memcpy(&open, c, sizeof open), open.has_bid)) {
      q4_winner w = {open.category, open.best_price};
      rc = sl_emit_ts(ctx, &w, sizeof w, open.expires); /* no state call */
    }
  }
  if (rc || kept == n)
    return rc;
  return kept == 0 ? sl_state_delete(ctx, id)
                   : sl_state_put(ctx, id, s->bytes, kept * cell, NULL);
}

/* A timer of the bucket (an expiry, or a waiting bid's date_time):
 * every auction the watermark has passed the expiry of emits its winner
 * and leaves, and every waiting bid up to the watermark is dropped.  Each
 * has a timer of its own at or before the watermark, due in this same
 * advance, so doing them together changes only the order of winners among
 * keys; those timers then find nothing (at the end of input: one pass per
 * bucket instead of one per auction). */
static int q4_winning_timer(sl_ctx *ctx, void *state, int domain,
                            int64_t time) {
  int64_t watermark = sl_ctx_watermark(ctx);
  assert(watermark >= time); /* it fired this timer */
  int rc = q4_expire(ctx, state, Q4_OPENS, sizeof(q4_open),
                     offsetof(q4_open, expires), watermark);
  if (rc == 0)
    rc = q4_expire(ctx, state, Q4_WAITING, sizeof(q4_wait),
                   offsetof(q4_wait, date_time), watermark);
  return failed(ctx, rc, "q4.winning_buckets");
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
  return q4_bucket(((const q4_bid *)in->data)->auction);
}

static uint64_t q4_auction_id(void *user, const sl_record *in) {
  return q4_bucket(((const q4_auction *)in->data)->id);
}

static uint64_t q4_winner_category(void *user, const sl_record *in) {
  return (uint64_t)((const q4_winner *)in->data)->category;
}

int nxq_build_q4(sl_job *job, sl_op *events, int p, sl_op **result) {
  static const sl_process_ops split = {.process = q4_split};
  static const sl_process_ops winning = {
      .open = nxq_scratch_open, .process = q4_winning,
      .on_timer = q4_winning_timer, .close = nxq_scratch_close};
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
    rc = sl_op_process(job, "q4.winning_buckets", keyed, 2, p, &winning,
                       NULL, &winners);
  if (rc == 0)
    rc = sl_op_key_by(job, "q4.by-category", winners, q4_winner_category,
                      NULL, &by_category);
  if (rc == 0)
    rc = sl_op_process(job, "q4.average", &by_category, 1, p, &average,
                       NULL, result);
  return rc;
}
