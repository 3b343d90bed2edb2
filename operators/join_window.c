/* join_window.c — the windowed join (Flink's window join): the records of
 * two keyed streams that fall in the same tumbling or sliding event-time
 * window are joined pairwise when the window fires.  What the three joins
 * share (state ids, element values, stamps, the operator shell) is in
 * join_internal.h and join_common.c.
 *
 * NOTES ON THE DESIGN
 *
 * 1. Windowed join, state of one key:
 *      HEADER  map, user key = window id (8 bytes BE):
 *              {count[left], count[right], fired}
 *      ELEMENT map, user key = window id + side (1 byte) + sequence
 *              (4 bytes BE): an element
 *    A window's id is its end with the sign bit flipped (as window.c).  A
 *    record is added to each of its windows that is still live; it is late
 *    when none is (window.c note 5: end - 1 + allowed_lateness <=
 *    watermark for all of them).
 * 2. Firing.  A new window registers a timer at end - 1 and, with allowed
 *    lateness L > 0, a cleanup timer at end - 1 + L (timers are found again
 *    from their time, as in window.c note 3).  At end - 1 it joins every
 *    left with every right element (both sides copied out of the state
 *    first) and is purged, or with L > 0 marked fired.  A record that comes
 *    for a fired window is joined at once with the other side's elements
 *    of that window, and only those new pairs are emitted (stamped
 *    end - 1): so every pair of elements of a window is emitted exactly
 *    once, at the firing or at the arrival of its second element.  A
 *    window first created when already due (possible only with L > 0)
 *    starts as fired.  Timestamps so large that end - 1 + L overflows fail
 *    the job.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "config_abi.h"
#include "join_internal.h"

typedef struct window_header {
  uint64_t count[2];
  uint64_t fired;
} window_header;

static inline int64_t floor_mod(int64_t a, int64_t b) {
  int64_t m = a % b;
  return m < 0 ? m + b : m;
}

/* ----------------------------------------------------------- batches */

static int batch_add(element_batch *b, const sl_record *r) {
  int rc = join_grow((void **)&b->refs, &b->ref_capacity, b->count + 1,
                     sizeof *b->refs);
  uint64_t at = (b->used + 7u) & ~7ull; /* records are 8-byte aligned */
  if (rc == 0)
    rc = join_grow((void **)&b->bytes, &b->byte_capacity,
                   at + r->size_bytes + 1, 1);
  if (rc)
    return rc;
  if (r->size_bytes)
    memcpy(b->bytes + at, r->data, r->size_bytes);
  b->refs[b->count++] = (element_ref){.ts = r->timestamp, .offset = at,
                                      .size_bytes = r->size_bytes};
  b->used = at + r->size_bytes;
  return 0;
}

static sl_record batch_record(const element_batch *b, uint64_t i) {
  assert(i < b->count);
  const element_ref *e = &b->refs[i];
  return (sl_record){.data = b->bytes + e->offset,
                     .size_bytes = e->size_bytes,
                     .timestamp = e->ts};
}

static void batch_clear(element_batch *b) {
  b->count = 0;
  b->used = 0;
}

/* ----------------------------------------------------------- windows */

static void window_key(uint8_t k[8], int64_t end) {
  sl_store_be64(k, flip(end));
}

static void window_element_key(uint8_t k[13], int64_t end, int side,
                               uint32_t seq) {
  window_key(k, end);
  k[8] = (uint8_t)side;
  op_store_be32(k + 9, seq);
}

static int header_load(sl_ctx *ctx, int64_t end, window_header *h,
                       bool *found) {
  uint8_t k[8];
  window_key(k, end);
  const void *v;
  uint32_t bytes;
  int rc = sl_mapstate_get(ctx, ID_WINDOW_HEADER, k, 8, &v, &bytes);
  *found = rc == 0;
  if (rc == SL_ENOTFOUND) {
    memset(h, 0, sizeof *h);
    return 0;
  }
  if (rc)
    return rc;
  if (bytes != sizeof *h) {
    sl_ctx_fail(ctx, "window join header of %" PRIu32 " bytes, expected %zu",
                bytes, sizeof *h);
    return SL_ECORRUPT;
  }
  memcpy(h, v, sizeof *h);
  return 0;
}

static int header_store(sl_ctx *ctx, int64_t end, const window_header *h) {
  uint8_t k[8];
  window_key(k, end);
  return sl_mapstate_put(ctx, ID_WINDOW_HEADER, k, 8, h, sizeof *h);
}

/* Copy side's elements of window end (count of them) into the batch. */
static int window_load_side(sl_ctx *ctx, join_instance *s, int64_t end,
                            int side, uint64_t count) {
  element_batch *b = &s->sides[side];
  batch_clear(b);
  for (uint64_t i = 0; i < count; i++) {
    uint8_t k[13];
    window_element_key(k, end, side, (uint32_t)i);
    const void *v;
    uint32_t bytes;
    int rc = sl_mapstate_get(ctx, ID_WINDOW_ELEMENT, k, sizeof k, &v, &bytes);
    if (rc == SL_ENOTFOUND)
      rc = SL_ECORRUPT; /* the header counted it */
    sl_record r;
    if (rc == 0)
      rc = element_record(v, bytes, &r);
    if (rc == 0)
      rc = batch_add(b, &r);
    if (rc)
      return rc;
  }
  return 0;
}

static int window_purge(sl_ctx *ctx, int64_t end, const window_header *h) {
  for (int side = 0; side < 2; side++)
    for (uint64_t i = 0; i < h->count[side]; i++) {
      uint8_t k[13];
      window_element_key(k, end, side, (uint32_t)i);
      int rc = sl_mapstate_delete(ctx, ID_WINDOW_ELEMENT, k, sizeof k);
      if (rc && rc != SL_ENOTFOUND)
        return rc;
    }
  uint8_t k[8];
  window_key(k, end);
  int rc = sl_mapstate_delete(ctx, ID_WINDOW_HEADER, k, 8);
  return rc == SL_ENOTFOUND ? 0 : rc;
}

/* Every left x right pair of the batches (note 2). */
static int window_join_all(sl_ctx *ctx, join_instance *s, uint64_t key,
                           const sl_window *w) {
  const sl_window_join_config *c = &s->j->window;
  const element_batch *left = &s->sides[LEFT], *right = &s->sides[RIGHT];
  for (uint64_t i = 0; i < left->count; i++) {
    sl_record a = batch_record(left, i);
    for (uint64_t k = 0; k < right->count; k++) {
      sl_record b = batch_record(right, k);
      int rc = join_status(ctx, c->join(c->user, ctx, key, w, &a, &b), key);
      if (rc)
        return rc;
    }
  }
  return 0;
}

/* A record for a window that fired already: join it with the other
 * side's elements now, stamped end - 1 (note 2). */
static int window_join_late(sl_ctx *ctx, join_instance *s, uint64_t key,
                            const sl_window *w, int side,
                            const sl_record *in, uint64_t other_count) {
  const sl_window_join_config *c = &s->j->window;
  int other = 1 - side;
  int rc = window_load_side(ctx, s, w->end, other, other_count);
  if (rc)
    return rc;
  const element_batch *b = &s->sides[other];
  sl_emit_stamp st; /* join_internal.h note 2 */
  sl_emit_stamp_begin(ctx, &st, w->end - 1);
  for (uint64_t i = 0; i < b->count && rc == 0; i++) {
    sl_record r = batch_record(b, i);
    rc = side == LEFT ? c->join(c->user, ctx, key, w, in, &r)
                      : c->join(c->user, ctx, key, w, &r, in);
    rc = join_status(ctx, rc, key);
  }
  sl_emit_stamp_end(ctx, &st);
  return rc;
}

/* Record in of side goes into the live window [start, end). */
static int window_add(sl_ctx *ctx, join_instance *s, uint64_t key, int side,
                      int64_t start, int64_t end, int64_t watermark,
                      const sl_record *in) {
  const sl_window_join_config *c = &s->j->window;
  window_header h;
  bool found;
  int rc = header_load(ctx, end, &h, &found);
  if (rc)
    return rc;
  if (!found) {
    if (watermark != SL_WATERMARK_MIN && end - 1 <= watermark)
      h.fired = 1; /* due already, within the lateness */
    else
      rc = sl_timer_register(ctx, SL_EVENT_TIME, end - 1);
    if (rc == 0 && c->allowed_lateness > 0)
      rc = sl_timer_register(ctx, SL_EVENT_TIME,
                             end - 1 + c->allowed_lateness);
    if (rc)
      return rc;
  }
  if (h.count[side] >= UINT32_MAX) {
    sl_ctx_fail(ctx, "window [%" PRId64 ", %" PRId64 ") of key %" PRIu64
                " holds 2^32 - 1 records of one side already", start, end,
                key);
    return EOVERFLOW;
  }
  uint8_t k[13];
  window_element_key(k, end, side, (uint32_t)h.count[side]);
  uint32_t bytes;
  rc = element_value(s, in, &bytes);
  if (rc == 0)
    rc = sl_mapstate_put(ctx, ID_WINDOW_ELEMENT, k, sizeof k, s->element,
                         bytes);
  if (rc)
    return rc;
  h.count[side]++;
  if (h.fired && h.count[1 - side] > 0) {
    sl_window w = {.start = start, .end = end};
    rc = window_join_late(ctx, s, key, &w, side, in, h.count[1 - side]);
    if (rc)
      return rc;
  }
  return header_store(ctx, end, &h);
}

static int window_process(sl_ctx *ctx, join_instance *s, int side,
                          const sl_record *in) {
  const sl_window_join_config *c = &s->j->window;
  int64_t ts, watermark;
  uint64_t key;
  int rc = join_record_begin(ctx, in, &ts, &key, &watermark);
  if (rc)
    return rc;
  int64_t slide = c->type == SL_WINDOW_TUMBLING ? c->size : c->slide;
  bool added = false;
  /* Its windows, newest first; computed wide, since the first start of
   * a timestamp near INT64_MIN lies below it. */
  for (wide start = (wide)ts - floor_mod(ts, slide);
       start > (wide)ts - c->size; start -= slide) {
    if (start < INT64_MIN ||
        start + c->size - 1 + c->allowed_lateness > INT64_MAX) {
      sl_ctx_fail(ctx, "timestamp %" PRId64 " is too close to the int64 "
                  "limits for windows of size %" PRId64 " and allowed "
                  "lateness %" PRId64, ts, c->size, c->allowed_lateness);
      return EOVERFLOW;
    }
    int64_t end = (int64_t)(start + c->size);
    if (watermark != SL_WATERMARK_MIN &&
        end - 1 + c->allowed_lateness <= watermark)
      continue; /* this window is gone (note 1) */
    rc = window_add(ctx, s, key, side, (int64_t)start, end, watermark, in);
    if (rc)
      return rc;
    added = true;
  }
  return added ? 0 : join_late_record(ctx, s->j, side, in);
}

static int window_timer(sl_ctx *ctx, join_instance *s, int64_t time) {
  const sl_window_join_config *c = &s->j->window;
  uint64_t key;
  int rc = sl_ctx_key(ctx, &key);
  if (rc)
    return rc;
  window_header h;
  bool found;
  if (time < INT64_MAX) {
    /* Fire the window ending at time + 1 (note 2). */
    int64_t end = time + 1;
    rc = header_load(ctx, end, &h, &found);
    if (rc)
      return rc;
    if (found && !h.fired) {
      sl_window w = {.start = end - c->size, .end = end};
      rc = window_load_side(ctx, s, end, LEFT, h.count[LEFT]);
      if (rc == 0)
        rc = window_load_side(ctx, s, end, RIGHT, h.count[RIGHT]);
      if (rc == 0)
        rc = window_join_all(ctx, s, key, &w);
      if (rc)
        return rc;
      h.fired = 1;
      rc = c->allowed_lateness == 0 ? window_purge(ctx, end, &h)
                                    : header_store(ctx, end, &h);
      if (rc)
        return rc;
    }
    /* A window that started fired (note 2) has allowed lateness: only its
     * cleanup timer removes it. */
  }
  if (c->allowed_lateness > 0 &&
      (wide)time + 1 - c->allowed_lateness >= INT64_MIN) {
    /* Clean up the window ending at time + 1 - L. */
    int64_t end = (int64_t)((wide)time + 1 - c->allowed_lateness);
    rc = header_load(ctx, end, &h, &found);
    if (rc == 0 && found)
      rc = window_purge(ctx, end, &h);
  }
  return rc;
}

/* ----------------------------------------------------------- building */

static int check_window(sl_job *job, const char *name,
                        const sl_window_join_config *c) {
  const char *what = "window join";
  if (!c)
    return join_config_error(job, what, name, "config is NULL");
  if (c->type != SL_WINDOW_TUMBLING && c->type != SL_WINDOW_SLIDING)
    return join_config_error(job, what, name, "type must be SL_WINDOW_TUMBLING "
                        "or SL_WINDOW_SLIDING (session and count windows "
                        "are not supported by the join)");
  if (c->domain != SL_EVENT_TIME)
    return join_config_error(job, what, name, "domain must be SL_EVENT_TIME "
                        "(processing-time joins are not supported)");
  if (c->size <= 0)
    return join_config_error(job, what, name, "size must be > 0");
  if (c->type == SL_WINDOW_SLIDING && (c->slide <= 0 || c->slide > c->size))
    return join_config_error(job, what, name, "slide must be in 1 .. size");
  if (c->allowed_lateness < 0)
    return join_config_error(job, what, name, "allowed_lateness must be >= 0");
  if (!c->join)
    return join_config_error(job, what, name, "join function is NULL");
  int rc = join_check_port(job, what, name, c->left_late_port, "left_late_port");
  return rc ? rc : join_check_port(job, what, name, c->right_late_port,
                              "right_late_port");
}

SL_EXPORT int sl_op_window_join_sized(sl_job *job, const char *name,
                                      sl_op *left_keyed, sl_op *right_keyed,
                                      int parallelism,
                                      const sl_window_join_config *cfg,
                                      sl_op **op, size_t cfg_bytes) {
  if (op)
    *op = 0;
  if (!job || !op)
    return EINVAL;
  sl_window_join_config copy;
  if (SL_CONFIG_READ(job, sl_op_window_join, sl_window_join_config,
                     SL_WINDOW_JOIN_CONFIG_V1, cfg, cfg_bytes, &copy))
    return EINVAL;
  if (cfg)
    cfg = &copy;
  int rc = check_window(job, name, cfg);
  if (rc)
    return rc;
  join_op *j = calloc(1, sizeof *j);
  if (!j)
    return ENOMEM;
  j->window = *cfg;
  j->late_port[LEFT] = cfg->left_late_port;
  j->late_port[RIGHT] = cfg->right_late_port;
  return join_build(job, "window join", name, left_keyed, right_keyed,
                    parallelism, j, window_process, window_timer, op);
}

/* The version-1 symbol (config_abi.c note 1): a program linked before the
 * sized call existed passed a version-1 struct. */
SL_EXPORT int(sl_op_window_join)(sl_job *job, const char *name,
                                 sl_op *left_keyed, sl_op *right_keyed,
                                 int parallelism,
                                 const sl_window_join_config *cfg,
                                 sl_op **op) {
  return sl_op_window_join_sized(job, name, left_keyed, right_keyed,
                                 parallelism, cfg, op,
                                 SL_WINDOW_JOIN_CONFIG_V1);
}
