/* q7.c — Nexmark q7, highest bid, as a sluice job
 * (the shared rules of every query: query.h). */

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "query.h"

/* q7's first stage spreads each window over this many keys (by auction):
 * enough for any parallelism to get an even share. */
#define Q7_BUCKETS 1024

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
 * keeps the top of those (query.h note 4) and emits them as result rows. */

static int q7_project(void *user, const sl_record *in, sl_ctx *ctx) {
  return nxq_q0_project(user, in, ctx);
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
 * is refused by the ties process it reaches (query.h note 8). */
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

int nxq_build_q7(sl_job *job, sl_op *events, int p, sl_op **result) {
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
    rc = sl_op_process(job, "q7.local", &by_share, 1, p, &nxq_ties_ops,
                       (void *)&local, &tops);
  if (rc == 0)
    rc = sl_op_key_by(job, "q7.by-window", tops, q7_window_key, NULL,
                      &by_window);
  if (rc == 0)
    rc = sl_op_process(job, "q7.global", &by_window, 1, p, &nxq_ties_ops,
                       (void *)&global, result);
  return rc;
}
