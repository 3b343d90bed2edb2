/* query_shared.c — the state helpers the Nexmark queries share that are
 * too large to inline (query.h declares them, with their contracts):
 * per-instance scratch memory, rebuilding a list state, inserting into
 * and dropping a prefix of a sorted array of time pairs, and the one-field
 * projection of the bids with its key. */

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "query.h"

int nxq_scratch_open(sl_ctx *ctx, void *user, void **state) {
  scratch *s = calloc(1, sizeof *s);
  if (!s)
    return -ENOMEM;
  *state = s;
  return 0;
}

void nxq_scratch_close(sl_ctx *ctx, void *state) {
  scratch *s = state;
  if (s)
    free(s->bytes);
  free(s);
}

int nxq_scratch_reserve(scratch *s, uint32_t bytes) {
  if (bytes <= s->capacity)
    return 0;
  uint8_t *grown = realloc(s->bytes, bytes);
  if (!grown)
    return ENOMEM;
  s->bytes = grown;
  s->capacity = bytes;
  return 0;
}

/* Keep only the items of list state id for which keep() holds.  The list
 * is rebuilt (from a copy in s) only when some but not all items stay. */
int nxq_list_retain(sl_ctx *ctx, scratch *s, uint16_t id, keep_fn keep,
                    int64_t arg) {
  const void *list, *item;
  uint32_t list_bytes, item_bytes, offset = 0, items = 0, kept = 0;
  int rc = sl_liststate_get(ctx, id, &list, &list_bytes);
  if (rc)
    return rc == SL_ENOTFOUND ? 0 : rc;
  /* Bounded: each step moves offset forward by at least 4 bytes. */
  while (sl_list_next(list, list_bytes, &offset, &item, &item_bytes)) {
    items++;
    kept += keep(item, item_bytes, arg);
  }
  if (kept == items)
    return 0;
  rc = kept > 0 ? nxq_scratch_reserve(s, list_bytes) : 0;
  if (rc == 0 && kept > 0)
    memcpy(s->bytes, list, list_bytes);
  if (rc == 0)
    rc = sl_state_delete(ctx, id);
  offset = 0;
  while (rc == 0 && kept > 0 &&
         sl_list_next(s->bytes, list_bytes, &offset, &item, &item_bytes))
    if (keep(item, item_bytes, arg))
      rc = sl_liststate_add(ctx, id, item, item_bytes);
  return rc;
}

int nxq_cell_insert(sl_ctx *ctx, scratch *s, uint16_t id, const void *array,
                    uint32_t bytes, uint32_t at, const void *cell,
                    uint32_t cell_bytes) {
  int rc = nxq_scratch_reserve(s, bytes + cell_bytes);
  if (rc)
    return rc;
  size_t head = (size_t)at * cell_bytes;
  assert(head <= bytes);
  if (head > 0)
    memcpy(s->bytes, array, head);
  memcpy(s->bytes + head, cell, cell_bytes);
  if (bytes > head)
    memcpy(s->bytes + head + cell_bytes, (const char *)array + head,
           bytes - head);
  return sl_state_put(ctx, id, s->bytes, bytes + cell_bytes, NULL);
}

int nxq_pair_insert(sl_ctx *ctx, scratch *s, uint16_t id, const void *array,
                    uint32_t bytes, uint32_t at, time_pair fresh) {
  return nxq_cell_insert(ctx, s, id, array, bytes, at, &fresh,
                         (uint32_t)sizeof fresh);
}

int nxq_pair_drop(sl_ctx *ctx, scratch *s, uint16_t id, const void *array,
                  uint32_t bytes, uint32_t drop) {
  uint32_t drop_bytes = drop * (uint32_t)sizeof(time_pair);
  assert(drop_bytes <= bytes);
  if (drop == 0)
    return 0;
  if (drop_bytes == bytes)
    return sl_state_delete(ctx, id);
  int rc = nxq_scratch_reserve(s, bytes - drop_bytes);
  if (rc)
    return rc;
  memcpy(s->bytes, (const char *)array + drop_bytes, bytes - drop_bytes);
  return sl_state_put(ctx, id, s->bytes, bytes - drop_bytes, NULL);
}

int nxq_bid_field(void *user, const sl_record *in, sl_ctx *ctx) {
  intptr_t field = (intptr_t)user;
  assert(field >= NX_BID_AUCTION && field <= NX_BID_DATE_TIME);
  const nx_record *r = event_of(in);
  if (!r)
    return malformed(ctx, in);
  if (r->type != NX_BID)
    return 0;
  return sl_emit(ctx, &r->field[field], sizeof(int64_t));
}

uint64_t nxq_first_integer(void *user, const sl_record *in) {
  return *(const uint64_t *)in->data;
}
