/* q0.c — Nexmark q0, passthrough of the bids, as a sluice job
 * (the shared rules of every query: query.h). */

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "query.h"

/* q0: passthrough of the bids.
 *
 *   SELECT auction, bidder, price, dateTime FROM bid;
 *
 * One flat_map: bids become bid_rows, the rest is dropped. */

int nxq_q0_project(void *user, const sl_record *in, sl_ctx *ctx) {
  const nx_record *r = event_of(in);
  if (!r)
    return malformed(ctx, in);
  if (r->type != NX_BID)
    return 0;
  bid_row row = {r->field[NX_BID_AUCTION], r->field[NX_BID_BIDDER],
                 r->field[NX_BID_PRICE], r->field[NX_BID_DATE_TIME]};
  return sl_emit(ctx, &row, sizeof row);
}

int nxq_build_q0(sl_job *job, sl_op *events, int p, sl_op **result) {
  return sl_op_flat_map(job, "q0.bids", events, p, nxq_q0_project, NULL,
                        result);
}
