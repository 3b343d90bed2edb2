/* q5.c — Nexmark q5, hot items, as a sluice job
 * (the shared rules of every query: query.h). */

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "query.h"

#define Q5_SIZE_MS 10000
#define Q5_SLIDE_MS 2000
/* Windows one timer of q5.count emits beyond its own when the watermark
 * has passed them (q5_count_timer): a pane's five, with room to spare. */
#define Q5_INLINE_WINDOWS 15u

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
 * that leaves.  When the watermark has passed several window ends (at the
 * end of input it passes them all) one firing emits each of them in turn,
 * stamped with its own end - 1, and writes the panes once, deleting any
 * timer a later pane set at one of those ends: re-arming a timer per
 * window instead cost every auction five timer entries, each put and
 * deleted in one epoch (cache-missing lookups on the instance's thread,
 * and five deletes the final checkpoint wrote).  (An sl_op_window of 10 s every 2 s gives the same rows,
 * but updates 5 windows and registers 5 timers per bid: 2-4x slower
 * here.)  As there, a bid whose windows have all fired is late, and one
 * whose first windows have fired counts in the rest.  Keyed by window
 * start, q5.hot (the ties process) keeps each window's largest num and
 * the auctions that have it: the MaxBids join. */

enum { Q5_PANES = 1 };
_Static_assert(Q5_SIZE_MS % Q5_SLIDE_MS == 0, "windows are whole panes");

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
  rc = nxq_pair_insert(ctx, s, Q5_PANES, array, bytes, at,
                       (time_pair){pane, 1});
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

/* One window of the key's auction, [time + 1 - size, time + 1), over its
 * panes from *first on (those before were dropped): emit its count,
 * stamped with time as its own timer would have, step *first past the
 * panes no later window holds, and set *next to the next window end - 1
 * that holds a pane still kept (INT64_MAX if none). */
static int q5_window(sl_ctx *ctx, const void *array, uint32_t n,
                     uint32_t *first, int64_t time, int64_t *next) {
  int64_t end = time + 1, start = end - Q5_SIZE_MS, num = 0;
  uint32_t done = *first;
  *next = INT64_MAX;
  for (uint32_t i = *first; i < n; i++) {
    time_pair pane = pair_at(array, i);
    assert(pane.time >= start); /* earlier ones were dropped */
    if (pane.time < end)
      num += pane.value;
    if (pane.time <= start)
      done++; /* this was its last window */
    else if (*next == INT64_MAX) /* the first pane kept: its next window */
      *next = pane.time + Q5_SLIDE_MS - 1 > time + Q5_SLIDE_MS
                  ? pane.time + Q5_SLIDE_MS - 1
                  : time + Q5_SLIDE_MS;
  }
  assert(*next == INT64_MAX || *next > time); /* never into the past */
  *first = done;
  uint64_t auction;
  int rc = sl_ctx_key(ctx, &auction);
  if (rc == 0 && num > 0) {
    q5_row row = {start, end, (int64_t)auction, num};
    rc = sl_emit_ts(ctx, &row, sizeof row, time); /* not a state call */
  }
  return rc;
}

/* Window ends of the key's auction, from time on: every window the
 * watermark has passed is emitted here in turn, in time order (see the
 * head comment: one firing, one state write and no timer re-armed per
 * window, however many came due); the panes no later window holds are
 * dropped, and one timer comes back at the next window end that holds a
 * pane still kept.  A timer that a pane registered at a window end emitted
 * here is deleted (mostly there is none: one lookup), or it would emit
 * that window again. */
static int q5_count_timer(sl_ctx *ctx, void *state, int domain,
                          int64_t time) {
  /* Panes are of valid times (q5_count_bid), so their timers are far
   * from the int64 limits; a time that is not (the final watermark's
   * reach) has no window (query.h note 8). */
  if (time < SL_TIME_MIN_VALID - Q5_SIZE_MS ||
      time > SL_TIME_MAX_VALID + Q5_SIZE_MS)
    return 0;
  const void *array;
  uint32_t bytes;
  int rc = sl_state_get(ctx, Q5_PANES, &array, &bytes);
  if (rc)
    return rc == SL_ENOTFOUND ? 0 : failed(ctx, rc, "q5.count");
  int64_t watermark = sl_ctx_watermark(ctx), next = time;
  int64_t emitted[Q5_INLINE_WINDOWS]; /* window ends - 1 after time's */
  uint32_t n = bytes / (uint32_t)sizeof(time_pair), first = 0, extra = 0;
  /* Bounded by the array: up to 1 + Q5_INLINE_WINDOWS windows here, the
   * rest (if any) when the timer re-armed below fires, at once. */
  for (uint32_t pass = 0; rc == 0 && next != INT64_MAX &&
                          next <= watermark && pass <= Q5_INLINE_WINDOWS;
       pass++) {
    if (pass > 0)
      emitted[extra++] = next;
    rc = q5_window(ctx, array, n, &first, next, &next);
  }
  if (rc == 0) /* the array was read to here: now the state may change */
    rc = nxq_pair_drop(ctx, state, Q5_PANES, array, bytes, first);
  for (uint32_t i = 0; rc == 0 && i < extra; i++) {
    rc = sl_timer_delete(ctx, SL_EVENT_TIME, emitted[i]);
    rc = rc == SL_ENOTFOUND ? 0 : rc;
  }
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

int nxq_build_q5(sl_job *job, sl_op *events, int p, sl_op **result) {
  static const sl_process_ops count = {.open = nxq_scratch_open,
                                       .process = q5_count,
                                       .on_timer = q5_count_timer,
                                       .close = nxq_scratch_close};
  /* q5.count made the windows from valid times (query.h note 8). */
  static const ties_spec hot = {sizeof(q5_row), q5_value, NULL,
                                q5_window_end, q5_emit};
  sl_op *bids, *by_auction, *counts, *by_window;
  int rc = sl_op_flat_map(job, "q5.bids", events, p, nxq_bid_field,
                          (void *)(intptr_t)NX_BID_AUCTION, &bids);
  if (rc == 0)
    rc = sl_op_key_by(job, "q5.by-auction", bids, nxq_first_integer, NULL,
                      &by_auction);
  if (rc == 0)
    rc = sl_op_process(job, "q5.count", &by_auction, 1, p, &count, NULL,
                       &counts);
  if (rc == 0)
    rc = sl_op_key_by(job, "q5.by-window", counts, q5_row_start, NULL,
                      &by_window);
  if (rc == 0)
    rc = sl_op_process(job, "q5.hot", &by_window, 1, p, &nxq_ties_ops,
                       (void *)&hot, result);
  return rc;
}
