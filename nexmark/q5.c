/* q5.c — Nexmark q5, hot items, as a sluice job
 * (the shared rules of every query: query.h). */

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "query.h"

#define Q5_SIZE_MS 10000
#define Q5_SLIDE_MS 2000
/* Auctions per key of q5.count_buckets: ids id >> Q5_BUCKET_BITS share one (see
 * the head comment). */
#define Q5_BUCKET_BITS 3

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
 * q5.bids projects each bid to its auction id.  q5.count_buckets is
 * AuctionBids: it counts the bids of each auction in each 2 s pane (the
 * slide).  Its key is a bucket of 8 consecutive auction ids (id >> 3),
 * whose value state is one array of {auction, pane start, count}, sorted
 * by auction and pane: one lookup and an in-place update per bid.  One
 * event-time timer per bucket walks the window ends (end - 1, in 2 s
 * steps) that hold one of its panes: each emits {start, end, auction,
 * num} for the window [end - 10 s, end) of every auction in the bucket
 * with bids there (num, the sum of its panes in it), and drops the panes
 * that leave.
 *   Why buckets: each key costs the state an entry for its value and one
 *   for its timer, and a checkpoint writes every entry changed since the
 *   last one.  The generator's auctions come in id order and their bids
 *   go to the last hundred or so, so keyed by auction every new auction
 *   cost two new entries and the checkpoint every 100 ms wrote about one
 *   entry per 8 events; eight auctions share a bucket's two entries
 *   (about 8x fewer written, for the same bytes of counts).  Any ids
 *   work: sparse ones just leave buckets of one auction.
 * When the watermark has passed several window ends (at the end of input
 * it passes them all) one firing emits each of them in turn, stamped with
 * its own end - 1, and writes the array once, deleting any timer a later
 * pane set at one of those ends (it would emit them again): a timer
 * re-armed per window cost five timer entries per key put and deleted in
 * one epoch, which the final checkpoint wrote as deletes.  (An
 * sl_op_window of 10 s every 2 s gives the same rows, but updates 5
 * windows and registers 5 timers per bid: 2-4x slower here.)  As there, a
 * bid whose windows have all fired is late, and one whose first windows
 * have fired counts in the rest.  Keyed by window start, q5.hot (the ties
 * process) keeps each window's largest num and the auctions that have it:
 * the MaxBids join. */

/* State 2, not 1: keyed by auction, state 1 held {pane, count} pairs. */
enum { Q5_BUCKET = 2 };
_Static_assert(Q5_SIZE_MS % Q5_SLIDE_MS == 0, "windows are whole panes");

/* One auction's count in one pane. */
typedef struct q5_cell {
  int64_t auction, pane, count;
} q5_cell;

static q5_cell cell_at(const void *array, uint32_t i) {
  q5_cell c;
  memcpy(&c, (const char *)array + (size_t)i * sizeof c, sizeof c);
  return c;
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

/* Where {auction, pane} is or belongs in the bucket's n cells (searched
 * from the end: new auctions and panes come last); *found if there, and
 * *pane_known if some cell has that pane already. */
static uint32_t q5_find(const void *array, uint32_t n, int64_t auction,
                        int64_t pane, bool *found, bool *pane_known) {
  uint32_t at = n;
  *pane_known = false;
  for (uint32_t i = n; i > 0; i--) { /* at most n */
    q5_cell c = cell_at(array, i - 1);
    *pane_known = *pane_known || c.pane == pane;
    if (c.auction > auction || (c.auction == auction && c.pane > pane))
      at = i - 1;
  }
  *found = at > 0 && cell_at(array, at - 1).auction == auction &&
           cell_at(array, at - 1).pane == pane;
  return *found ? at - 1 : at;
}

/* A new cell at index at of the bucket's array, built in the scratch (a
 * put may free what array points into). */
static int q5_insert(sl_ctx *ctx, scratch *s, const void *array,
                     uint32_t bytes, uint32_t at, q5_cell fresh) {
  return nxq_cell_insert(ctx, s, Q5_BUCKET, array, bytes, at, &fresh,
                         (uint32_t)sizeof fresh);
}

static int q5_count_bid(sl_ctx *ctx, scratch *s, int64_t auction,
                        int64_t ts) {
  int rc = 0;
  if (!time_of(ctx, ts, "timestamp", &rc))
    return rc;
  int64_t pane = window_start(ts, Q5_SLIDE_MS);
  if (window_late(ctx, pane + Q5_SIZE_MS))
    return 0;
  const void *array = NULL;
  uint32_t bytes = 0;
  rc = sl_state_get(ctx, Q5_BUCKET, &array, &bytes);
  if (rc && rc != SL_ENOTFOUND)
    return rc;
  if (bytes % sizeof(q5_cell) != 0)
    return SL_ECORRUPT;
  bool found, pane_known;
  uint32_t n = bytes / (uint32_t)sizeof(q5_cell);
  uint32_t at = q5_find(array, n, auction, pane, &found, &pane_known);
  if (found) { /* most bids: one more in place */
    void *stored;
    rc = sl_state_update(ctx, Q5_BUCKET, bytes, NULL, &stored);
    if (rc == 0) {
      char *slot = (char *)stored + (size_t)at * sizeof(q5_cell) +
                   offsetof(q5_cell, count);
      int64_t count;
      memcpy(&count, slot, sizeof count);
      count++;
      memcpy(slot, &count, sizeof count);
    }
    return rc;
  }
  rc = q5_insert(ctx, s, array, bytes, at, (q5_cell){auction, pane, 1});
  /* A pane the bucket holds already has its windows walked by the
   * pending timer (none of them is due yet: due ones fired before this
   * record); a new one needs a timer at its first window not passed. */
  if (rc == 0 && !pane_known)
    rc = sl_timer_register(ctx, SL_EVENT_TIME,
                           q5_first_due(pane, sl_ctx_watermark(ctx)));
  return rc;
}

static int q5_count(sl_ctx *ctx, void *state, int input,
                    const sl_record *in) {
  if (in->size_bytes != sizeof(int64_t) || in->timestamp == SL_NO_TIMESTAMP)
    return malformed(ctx, in);
  int64_t auction;
  memcpy(&auction, in->data, sizeof auction);
  int rc = q5_count_bid(ctx, state, auction, in->timestamp);
  return rc == -ERANGE ? rc : failed(ctx, rc, "q5.count_buckets");
}

/* One window of the bucket, [time + 1 - size, time + 1), over its *n
 * cells (in cells, a copy): emit each auction's count in it, stamped with
 * time as its own timer would have been; drop the cells no later window
 * holds (*n shrinks); set *next to the next window end - 1 that holds a
 * cell still kept (INT64_MAX if none). */
static int q5_window(sl_ctx *ctx, q5_cell *cells, uint32_t *n, int64_t time,
                     int64_t *next) {
  int64_t end = time + 1, start = end - Q5_SIZE_MS, num = 0;
  uint32_t kept = 0;
  int rc = 0;
  *next = INT64_MAX;
  for (uint32_t i = 0; i < *n && rc == 0; i++) {
    q5_cell c = cells[i];
    assert(c.pane >= start); /* earlier ones were dropped */
    if (c.pane < end)
      num += c.count;
    if (c.pane > start) { /* it has later windows */
      int64_t its_next = c.pane + Q5_SLIDE_MS - 1 > time + Q5_SLIDE_MS
                             ? c.pane + Q5_SLIDE_MS - 1
                             : time + Q5_SLIDE_MS;
      *next = its_next < *next ? its_next : *next;
      cells[kept++] = c;
    }
    bool last_of_auction = i + 1 == *n || cells[i + 1].auction != c.auction;
    if (last_of_auction && num > 0) {
      q5_row row = {start, end, c.auction, num};
      rc = sl_emit_ts(ctx, &row, sizeof row, time); /* not a state call */
    }
    if (last_of_auction)
      num = 0;
  }
  assert(rc || *next == INT64_MAX || *next > time); /* never the past */
  *n = rc ? *n : kept;
  return rc;
}

/* Window ends of the bucket, from time on, on a copy of its cells in the
 * scratch: every window the watermark has passed is emitted here in turn,
 * in time order (see the head comment), a timer a later pane set at one
 * of those ends deleted (mostly there is none: one lookup); then the cells
 * are written once and one timer comes back at the next window end that
 * holds a cell still kept. */
static int q5_count_timer(sl_ctx *ctx, void *state, int domain,
                          int64_t time) {
  /* Panes are of valid times (q5_count_bid), so their timers are far
   * from the int64 limits; a time that is not (the final watermark's
   * reach) has no window (query.h note 8). */
  if (time < SL_TIME_MIN_VALID - Q5_SIZE_MS ||
      time > SL_TIME_MAX_VALID + Q5_SIZE_MS)
    return 0;
  scratch *s = state;
  const void *array;
  uint32_t bytes;
  int rc = sl_state_get(ctx, Q5_BUCKET, &array, &bytes);
  if (rc)
    return rc == SL_ENOTFOUND ? 0 : failed(ctx, rc, "q5.count_buckets");
  if (bytes % sizeof(q5_cell) != 0)
    return failed(ctx, SL_ECORRUPT, "q5.count_buckets");
  rc = nxq_scratch_reserve(s, bytes);
  if (rc)
    return failed(ctx, rc, "q5.count_buckets");
  memcpy(s->bytes, array, bytes); /* from here on, state calls are safe */
  q5_cell *cells = (q5_cell *)(void *)s->bytes;
  uint32_t n0 = bytes / (uint32_t)sizeof(q5_cell), n = n0;
  int64_t watermark = sl_ctx_watermark(ctx), next = time;
  /* Bounded: each window visited holds a kept pane, and a pane is in
   * size / slide windows, so at most n0 * size / slide + 1 passes. */
  for (uint32_t pass = 0; rc == 0 && next != INT64_MAX && next <= watermark &&
                          pass <= n0 * (Q5_SIZE_MS / Q5_SLIDE_MS);
       pass++) {
    if (pass > 0) {
      rc = sl_timer_delete(ctx, SL_EVENT_TIME, next);
      rc = rc == SL_ENOTFOUND ? 0 : rc;
    }
    if (rc == 0)
      rc = q5_window(ctx, cells, &n, next, &next);
  }
  if (rc == 0 && n == 0)
    rc = sl_state_delete(ctx, Q5_BUCKET);
  else if (rc == 0 && n != n0)
    rc = sl_state_put(ctx, Q5_BUCKET, cells, n * (uint32_t)sizeof(q5_cell),
                      NULL);
  if (rc == 0 && next != INT64_MAX)
    rc = sl_timer_register(ctx, SL_EVENT_TIME, next);
  return failed(ctx, rc, "q5.count_buckets");
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

/* q5.count_buckets's key: the bucket of the bid's auction (head comment). */
static uint64_t q5_bucket_of(void *user, const sl_record *in) {
  uint64_t auction;
  memcpy(&auction, in->data, sizeof auction);
  return auction >> Q5_BUCKET_BITS;
}

static uint64_t q5_row_start(void *user, const sl_record *in) {
  return (uint64_t)((const q5_row *)in->data)->start;
}

int nxq_build_q5(sl_job *job, sl_op *events, int p, sl_op **result) {
  static const sl_process_ops count = {.open = nxq_scratch_open,
                                       .process = q5_count,
                                       .on_timer = q5_count_timer,
                                       .close = nxq_scratch_close};
  /* q5.count_buckets made the windows from valid times (query.h note 8). */
  static const ties_spec hot = {sizeof(q5_row), q5_value, NULL,
                                q5_window_end, q5_emit};
  sl_op *bids, *by_auction, *counts, *by_window;
  int rc = sl_op_flat_map(job, "q5.bids", events, p, nxq_bid_field,
                          (void *)(intptr_t)NX_BID_AUCTION, &bids);
  if (rc == 0)
    rc = sl_op_key_by(job, "q5.by-auction", bids, q5_bucket_of, NULL,
                      &by_auction);
  if (rc == 0)
    rc = sl_op_process(job, "q5.count_buckets", &by_auction, 1, p, &count,
                       NULL, &counts);
  if (rc == 0)
    rc = sl_op_key_by(job, "q5.by-window", counts, q5_row_start, NULL,
                      &by_window);
  if (rc == 0)
    rc = sl_op_process(job, "q5.hot", &by_window, 1, p, &nxq_ties_ops,
                       (void *)&hot, result);
  return rc;
}
