/* q4.c — Nexmark q4, average price per category, as a sluice job
 * (the shared rules of every query: query.h). */

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
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
  rc = nxq_pair_insert(ctx, s, Q4_PENDING, array, bytes, at,
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
  return nxq_pair_drop(ctx, s, Q4_PENDING, array, bytes, drop);
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
