/* ties.c — the window-maximum process of the Nexmark queries q5 and q7
 * (nxq_ties_ops, configured by a ties_spec: query.h). */

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "query.h"

/* The largest value of each window and every item that has it (q5, q7): a
 * keyed process whose key stands for one window (and, in q7's first stage,
 * a share of its items).  Per key: the maximum so far (value state) and
 * the items at it (list state); a new maximum clears the list.  A timer at
 * end - 1 emits the items and clears the key.  The common case, an item
 * below the maximum, costs one state lookup. */

enum { TIES_MAX = 1, TIES_ITEMS = 2 };

static int ties_add(sl_ctx *ctx, const ties_spec *spec, const sl_record *in) {
  int rc = 0;
  if (spec->item_time &&
      !time_of(ctx, spec->item_time(in->data), "date_time", &rc))
    return rc;
  int64_t end = spec->window_end(in->data);
  if (window_late(ctx, end))
    return 0;
  int64_t value = spec->value(in->data);
  const void *stored;
  uint32_t bytes;
  rc = sl_state_get(ctx, TIES_MAX, &stored, &bytes);
  if (rc == SL_ENOTFOUND) {
    rc = sl_timer_register(ctx, SL_EVENT_TIME, end - 1); /* a new window */
  } else if (rc == 0) {
    int64_t max;
    assert(bytes == sizeof max);
    memcpy(&max, stored, sizeof max);
    if (value < max)
      return 0;
    if (value == max)
      return sl_liststate_add(ctx, TIES_ITEMS, in->data, in->size_bytes);
    rc = sl_state_delete(ctx, TIES_ITEMS); /* a new maximum */
  }
  if (rc == 0)
    rc = sl_state_put(ctx, TIES_MAX, &value, sizeof value, NULL);
  if (rc == 0)
    rc = sl_liststate_add(ctx, TIES_ITEMS, in->data, in->size_bytes);
  return rc;
}

static int ties_process(sl_ctx *ctx, void *user, int input,
                        const sl_record *in) {
  const ties_spec *spec = user;
  if (in->size_bytes != spec->item_bytes)
    return malformed(ctx, in);
  int rc = ties_add(ctx, spec, in);
  return rc == -ERANGE ? rc : failed(ctx, rc, sl_ctx_name(ctx));
}

static int ties_timer(sl_ctx *ctx, void *user, int domain, int64_t time) {
  const ties_spec *spec = user;
  const void *list, *item;
  uint32_t list_bytes, item_bytes, offset = 0;
  int rc = sl_liststate_get(ctx, TIES_ITEMS, &list, &list_bytes);
  if (rc)
    return rc == SL_ENOTFOUND ? 0 : failed(ctx, rc, sl_ctx_name(ctx));
  /* The list stays valid while emitting (no state call); bounded by it. */
  int64_t end;
  if (!end_of_timer(time, &end))
    return 0; /* no window of a valid time: nothing was added for it */
  while (rc == 0 &&
         sl_list_next(list, list_bytes, &offset, &item, &item_bytes)) {
    int64_t aligned[8];
    assert(item_bytes == spec->item_bytes && item_bytes <= sizeof aligned);
    memcpy(aligned, item, item_bytes);
    rc = spec->emit(ctx, aligned, end);
  }
  if (rc == 0)
    rc = sl_state_delete(ctx, TIES_ITEMS);
  if (rc == 0)
    rc = sl_state_delete(ctx, TIES_MAX);
  return failed(ctx, rc, sl_ctx_name(ctx));
}

const sl_process_ops nxq_ties_ops = {.process = ties_process,
                                     .on_timer = ties_timer};
