/* join_unbounded.c — the unbounded join (an insert-only SQL inner join):
 * every left record of a key is joined with every right record of that
 * key, whenever the second of the two arrives; nothing expires.  What the
 * three joins share (state ids, element values, the operator shell) is in
 * join_internal.h and join_common.c.
 *
 * NOTES ON THE DESIGN
 *
 * 1. Unbounded join, per key:
 *      COUNTS  value state {count[left], count[right]}
 *      ELEMENT map (one state id per side), user key = sequence (8 BE)
 *    A record reads the other side's elements 0 .. count-1, joins with
 *    each, and is appended to its own side.  State only grows: one map
 *    entry per record (cow_map.h: 40 bytes of header, a 20-byte key
 *    rounded to 24, the 8-byte timestamp and the record, plus a bucket
 *    pointer: about 80 bytes over the record), and the work of a record
 *    is the number of records of the other side of its key.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "join_internal.h"

typedef struct unbounded_counts {
  uint64_t count[2];
} unbounded_counts;

static int unbounded_process(sl_ctx *ctx, join_instance *s, int side,
                             const sl_record *in) {
  uint64_t key;
  int rc = sl_ctx_key(ctx, &key);
  if (rc)
    return rc;
  unbounded_counts counts = {{0, 0}};
  const void *v;
  uint32_t bytes;
  rc = sl_state_get(ctx, ID_UNBOUNDED_COUNTS, &v, &bytes);
  if (rc == 0 && bytes != sizeof counts)
    rc = SL_ECORRUPT;
  if (rc == 0)
    memcpy(&counts, v, sizeof counts);
  else if (rc != SL_ENOTFOUND)
    return rc;
  int other = 1 - side;
  uint16_t other_id = (uint16_t)(ID_UNBOUNDED_ELEMENT + other);
  for (uint64_t i = 0; i < counts.count[other]; i++) {
    uint8_t k[8];
    sl_store_be64(k, i);
    sl_record r;
    rc = sl_mapstate_get(ctx, other_id, k, 8, &v, &bytes);
    if (rc == SL_ENOTFOUND)
      rc = SL_ECORRUPT; /* the counts include it */
    if (rc == 0)
      rc = element_record(v, bytes, &r);
    if (rc)
      return rc;
    rc = side == LEFT ? s->j->join(s->j->user, ctx, key, in, &r)
                      : s->j->join(s->j->user, ctx, key, &r, in);
    rc = join_status(ctx, rc, key);
    if (rc)
      return rc;
  }
  uint8_t k[8];
  sl_store_be64(k, counts.count[side]);
  rc = element_value(s, in, &bytes);
  if (rc == 0)
    rc = sl_mapstate_put(ctx, (uint16_t)(ID_UNBOUNDED_ELEMENT + side), k, 8,
                         s->element, bytes);
  if (rc)
    return rc;
  counts.count[side]++;
  return sl_state_put(ctx, ID_UNBOUNDED_COUNTS, &counts, sizeof counts, 0);
}

/* ----------------------------------------------------------- building */

SL_EXPORT int sl_op_join(sl_job *job, const char *name, sl_op *left_keyed,
                         sl_op *right_keyed, int parallelism,
                         sl_join_fn join, void *user, sl_op **op) {
  if (op)
    *op = 0;
  if (!job || !op)
    return EINVAL;
  if (!join)
    return join_config_error(job, "join", name, "join function is NULL");
  join_op *j = calloc(1, sizeof *j);
  if (!j)
    return ENOMEM;
  j->join = join;
  j->user = user;
  return join_build(job, "join", name, left_keyed, right_keyed, parallelism,
                    j, unbounded_process, 0, op);
}
