/* q11.c — Nexmark q11, user sessions, as a sluice job
 * (the shared rules of every query: query.h). */

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "query.h"

#define Q11_GAP_MS 10000

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

int nxq_build_q11(sl_job *job, sl_op *events, int p, sl_op **result) {
  sl_window_config w = {.type = SL_WINDOW_SESSION, .gap = Q11_GAP_MS,
                        .acc_bytes = sizeof(int64_t), .init = count_init,
                        .add = count_add, .merge = count_merge,
                        .emit = q11_emit};
  sl_op *bids, *by_bidder;
  int rc = sl_op_flat_map(job, "q11.bids", events, p, nxq_bid_field,
                          (void *)(intptr_t)NX_BID_BIDDER, &bids);
  if (rc == 0)
    rc = sl_op_key_by(job, "q11.by-bidder", bids, nxq_first_integer, NULL,
                      &by_bidder);
  if (rc == 0)
    rc = sl_op_window(job, "q11.sessions", by_bidder, p, &w, result);
  return rc;
}
