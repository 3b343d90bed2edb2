/* q1.c — Nexmark q1, currency conversion, as a sluice job
 * (the shared rules of every query: query.h). */

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "query.h"

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

int nxq_build_q1(sl_job *job, sl_op *events, int p, sl_op **result) {
  return sl_op_flat_map(job, "q1.convert", events, p, q1_convert, NULL,
                        result);
}
