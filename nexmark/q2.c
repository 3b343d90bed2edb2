/* q2.c — Nexmark q2, selection, as a sluice job
 * (the shared rules of every query: query.h). */

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "query.h"

#define Q2_MODULUS 123

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

int nxq_build_q2(sl_job *job, sl_op *events, int p, sl_op **result) {
  return sl_op_flat_map(job, "q2.select", events, p, q2_select, NULL,
                        result);
}
