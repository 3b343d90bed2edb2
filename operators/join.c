/* join.c — joins of two keyed streams: windowed (Flink's window join),
 * interval (Flink's interval join) and unbounded (an insert-only SQL inner
 * join).
 *
 * NOTES ON THE DESIGN
 *
 * 1. Each join is a keyed process operator with two inputs (0 = left,
 *    1 = right), built on the public API: what it buffers is keyed state
 *    (map and value state) and event-time timers (timer.c), so it is
 *    checkpointed and restored with the job and nothing lives outside the
 *    state between two records.  The state ids 0xFE00 .. 0xFEFF are the
 *    operator's; a join function must not make state calls (sluice_join.h).
 *    A stored element's value is [timestamp: i64][record bytes], never
 *    empty, and its record bytes sit 8 bytes into the state's 8-aligned
 *    value, so they are handed to the join function in place.
 * 2. Windowed join, state of one key:
 *      HEADER  map, user key = window id (8 bytes BE):
 *              {count[left], count[right], fired}
 *      ELEMENT map, user key = window id + side (1 byte) + sequence
 *              (4 bytes BE): an element
 *    A window's id is its end with the sign bit flipped (as window.c).  A
 *    record is added to each of its windows that is still live; it is late
 *    when none is (window.c note 5: end - 1 + allowed_lateness <=
 *    watermark for all of them).
 * 3. Firing.  A new window registers a timer at end - 1 and, with allowed
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
 * 4. Interval join rules.  With W the watermark before a record:
 *      late      ts < W (Flink's rule): counted, dropped or sent to the
 *                side's late port;
 *      expired   left a at time T: a.ts + upper < T; right b: b.ts - lower
 *                < T.
 *    A record that is not late is first joined with the buffered records
 *    of the other side that match it, then buffered unless it is expired
 *    at W already, and a cleanup timer at the first time it is expired
 *    (a.ts + upper + 1, b.ts - lower + 1, saturated to the int64 range)
 *    purges the side's expired records when it fires.  Why no pair is
 *    lost: let a and b match, both not late, and say b arrives second.  b
 *    not late gives b.ts >= W_b, and b.ts <= a.ts + upper, so a.ts + upper >=
 *    W_b >= every timer time fired so far: a was never expired, so it is
 *    still buffered when b arrives (symmetrically for a second, with
 *    a.ts >= W_a and a.ts + lower <= b.ts).  Why none is repeated: a pair
 *    is emitted only when its second record arrives, and each record
 *    arrives once.  The watermark of a restored instance is restored with
 *    its state (timer.c note 7), so a replay judges lateness the same.
 * 5. Interval join index, per key and side (the API has no iteration over
 *    map state, and a probe needs the buffered timestamps in a range):
 *      DIRECTORY value state: the bucket numbers in use, sorted
 *      BUCKET    map, user key = bucket (8 bytes, sign-flipped BE): the
 *                bucket's {timestamp, count} entries, sorted by timestamp
 *      ELEMENT   map, user key = timestamp (8, sign-flipped BE) + sequence
 *                (4, BE): an element; sequences 0 .. count-1 of a
 *                timestamp are dense, since a timestamp's elements all
 *                expire together
 *    with bucket = floor(ts / bucket_width).  Costs: a record stored
 *    rewrites its bucket (O(timestamps in it) <= bucket_width entries)
 *    and, when it opens a bucket, the directory (O(buckets of the key));
 *    a probe costs a binary search of the directory, one state read per
 *    bucket in range and per matching element; a purge reads only the
 *    buckets it empties and one more (expired records are a prefix of the
 *    sorted index).  Flink scans the whole buffer of the key per record.
 * 6. The cleanup timer purges by the timer's time, not by the timestamp
 *    it was registered for, so duplicates, saturated times and the final
 *    SL_WATERMARK_MAX (which empties the key: no record can come after the
 *    end of input) all work.
 * 7. Unbounded join, per key:
 *      COUNTS  value state {count[left], count[right]}
 *      ELEMENT map (one state id per side), user key = sequence (8 BE)
 *    A record reads the other side's elements 0 .. count-1, joins with
 *    each, and is appended to its own side.  State only grows: one map
 *    entry per record (cow_map.h: 40 bytes of header, a 20-byte key
 *    rounded to 24, the 8-byte timestamp and the record, plus a bucket
 *    pointer: about 80 bytes over the record), and the work of a record
 *    is the number of records of the other side of its key.
 * 8. Stamps.  sl_emit stamps with the timestamp of the record being
 *    processed (ctx->current): in a timer that is the timer's time
 *    (end - 1 of the window firing).  To stamp the pairs emitted while
 *    processing a record (max(a.ts, b.ts) for the interval join, end - 1
 *    for a fired window) the join function runs with ctx->current pointing
 *    at a copy of the record carrying that timestamp; the key was already
 *    computed, so state calls are not affected.  An interval join's stamp
 *    is never behind the watermark it forwards (neither record was late);
 *    pairs of a late arrival in a fired window are, like window.c's late
 *    firings.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

enum {
  ID_WINDOW_HEADER = 0xFE01,
  ID_WINDOW_ELEMENT = 0xFE02,
  ID_INTERVAL_DIRECTORY = 0xFE10, /* + side */
  ID_INTERVAL_BUCKET = 0xFE12,    /* + side */
  ID_INTERVAL_ELEMENT = 0xFE14,   /* + side */
  ID_UNBOUNDED_COUNTS = 0xFE20,
  ID_UNBOUNDED_ELEMENT = 0xFE21, /* + side */
};

enum join_kind { JOIN_WINDOW, JOIN_INTERVAL, JOIN_UNBOUNDED };
enum { LEFT = 0, RIGHT = 1 };

#define DEFAULT_BUCKET_WIDTH 256
#define ELEMENT_TS_BYTES 8u

__extension__ typedef __int128 wide; /* exact sums of two int64 values */

/* The operator's configuration (the user pointer of the process op). */
typedef struct join_op {
  enum join_kind kind;
  sl_window_join_config window;     /* JOIN_WINDOW */
  sl_interval_join_config interval; /* JOIN_INTERVAL */
  sl_join_fn join;                  /* JOIN_UNBOUNDED */
  void *user;                       /* JOIN_UNBOUNDED */
  int late_port[2]; /* per side; 0: drop */
  int64_t bucket_width;             /* JOIN_INTERVAL, resolved */
} join_op;

/* One element copied out of the state (windowed join firing). */
typedef struct element_ref {
  int64_t ts;
  uint64_t offset; /* of its bytes in the batch, 8-aligned */
  uint32_t size_bytes;
} element_ref;

typedef struct element_batch {
  element_ref *refs;
  uint64_t count, ref_capacity;
  uint8_t *bytes;
  uint64_t used, byte_capacity;
} element_batch;

/* {timestamp, count} of the interval join index (note 5). */
typedef struct ts_entry {
  int64_t ts;
  uint32_t count;
  uint32_t unused; /* zero */
} ts_entry;
_Static_assert(sizeof(ts_entry) == 16, "index entries are stored as is");

typedef struct window_header {
  uint64_t count[2];
  uint64_t fired;
} window_header;

/* Per instance: working buffers, reused from record to record. */
typedef struct join_instance {
  const join_op *j;
  uint8_t *element; /* element value being stored */
  uint64_t element_capacity;
  element_batch sides[2];
  int64_t *directory; /* a copy of one side's directory */
  uint64_t directory_capacity;
  ts_entry *bucket; /* a copy of one bucket */
  uint64_t bucket_capacity;
  ts_entry *matches; /* probe: the matching timestamps */
  uint64_t match_capacity;
} join_instance;

/* ----------------------------------------------------------- helpers */

static int grow(void **buffer, uint64_t *capacity, uint64_t need,
                size_t unit) {
  if (need <= *capacity)
    return 0;
  if (need > (1ull << 31) / unit)
    return EINVAL; /* beyond any state value (1 GiB) */
  uint64_t n = *capacity ? *capacity : 16;
  while (n < need)
    n *= 2;
  void *p = realloc(*buffer, n * unit);
  if (!p)
    return ENOMEM;
  *buffer = p;
  *capacity = n;
  return 0;
}

static inline int64_t floor_mod(int64_t a, int64_t b) {
  int64_t m = a % b;
  return m < 0 ? m + b : m;
}

static inline int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

/* v clamped to the int64 range. */
static inline int64_t saturate(wide v) {
  return v > INT64_MAX ? INT64_MAX : v < INT64_MIN ? INT64_MIN : (int64_t)v;
}

static inline uint64_t flip(int64_t v) { return (uint64_t)v ^ (1ull << 63); }

/* The element value [ts][bytes] of in, built in the instance buffer. */
static int element_value(join_instance *s, const sl_record *in,
                         uint32_t *bytes) {
  uint64_t need = ELEMENT_TS_BYTES + in->size_bytes;
  int rc = grow((void **)&s->element, &s->element_capacity, need, 1);
  if (rc)
    return rc;
  memcpy(s->element, &in->timestamp, ELEMENT_TS_BYTES);
  if (in->size_bytes)
    memcpy(s->element + ELEMENT_TS_BYTES, in->data, in->size_bytes);
  *bytes = (uint32_t)need;
  return 0;
}

/* A stored element value as a record (pointing into the value). */
static int element_record(const void *value, uint32_t bytes, sl_record *out) {
  if (bytes < ELEMENT_TS_BYTES)
    return SL_ECORRUPT;
  memcpy(&out->timestamp, value, ELEMENT_TS_BYTES);
  out->data = (const uint8_t *)value + ELEMENT_TS_BYTES;
  out->size_bytes = bytes - ELEMENT_TS_BYTES;
  return 0;
}

static int batch_add(element_batch *b, const sl_record *r) {
  int rc = grow((void **)&b->refs, &b->ref_capacity, b->count + 1,
                sizeof *b->refs);
  uint64_t at = (b->used + 7u) & ~7ull; /* records are 8-byte aligned */
  if (rc == 0)
    rc = grow((void **)&b->bytes, &b->byte_capacity, at + r->size_bytes + 1,
              1);
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


/* The join function's status as the callback's: 0, or negative with a
 * cause. */
static int join_status(sl_ctx *ctx, int rc, uint64_t key) {
  if (rc == 0 || rc == SL_ESTOPPED)
    return rc;
  if (!ctx->cause[0])
    sl_ctx_fail(ctx, "join function returned %d for key %" PRIu64, rc, key);
  return rc < 0 ? rc : -rc;
}

/* A state or engine error as the callback's status, with a cause. */
static int fail_status(sl_ctx *ctx, int rc, const char *what) {
  if (rc == 0 || rc == SL_ESTOPPED)
    return rc;
  if (!ctx->cause[0])
    sl_ctx_fail(ctx, "%s: %s", what, sl_strerror(rc));
  return rc > 0 ? -rc : rc;
}

static int64_t event_time(sl_ctx *ctx, const sl_record *in, int *rc) {
  *rc = 0;
  if (in->timestamp == SL_NO_TIMESTAMP) {
    sl_ctx_fail(ctx, "a record without a timestamp reached an event-time "
                "join (emit with sl_emit_ts)");
    *rc = -EINVAL;
  }
  return in->timestamp;
}

static int late_record(sl_ctx *ctx, const join_op *j, int side,
                       const sl_record *in) {
  sl_ctx_count(ctx, SL_COUNT_LATE, 1);
  if (j->late_port[side])
    return sl_emit_side(ctx, j->late_port[side], in->data, in->size_bytes,
                        in->timestamp);
  return 0;
}

/* ----------------------------------------------------------- windowed */

static void window_key(uint8_t k[8], int64_t end) {
  sl_store_be64(k, flip(end));
}

static void window_element_key(uint8_t k[13], int64_t end, int side,
                               uint32_t seq) {
  window_key(k, end);
  k[8] = (uint8_t)side;
  k[9] = (uint8_t)(seq >> 24);
  k[10] = (uint8_t)(seq >> 16);
  k[11] = (uint8_t)(seq >> 8);
  k[12] = (uint8_t)seq;
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

/* Every left x right pair of the batches (note 3). */
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
 * side's elements now, stamped end - 1 (note 3). */
static int window_join_late(sl_ctx *ctx, join_instance *s, uint64_t key,
                            const sl_window *w, int side,
                            const sl_record *in, uint64_t other_count) {
  const sl_window_join_config *c = &s->j->window;
  int other = 1 - side;
  int rc = window_load_side(ctx, s, w->end, other, other_count);
  if (rc)
    return rc;
  const element_batch *b = &s->sides[other];
  sl_emit_stamp st; /* note 8 */
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
    return -EOVERFLOW;
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
  int rc;
  int64_t ts = event_time(ctx, in, &rc);
  if (rc)
    return rc;
  uint64_t key;
  rc = sl_ctx_key(ctx, &key);
  if (rc)
    return rc;
  int64_t watermark = sl_ctx_watermark(ctx);
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
      return -EOVERFLOW;
    }
    int64_t end = (int64_t)(start + c->size);
    if (watermark != SL_WATERMARK_MIN &&
        end - 1 + c->allowed_lateness <= watermark)
      continue; /* this window is gone (note 2) */
    rc = window_add(ctx, s, key, side, (int64_t)start, end, watermark, in);
    if (rc)
      return rc;
    added = true;
  }
  return added ? 0 : late_record(ctx, s->j, side, in);
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
    /* Fire the window ending at time + 1 (note 3). */
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
    /* A window that started fired (note 3) has allowed lateness: only its
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

/* ----------------------------------------------------------- interval */

static inline bool interval_expired(const sl_interval_join_config *c,
                                    int side, int64_t ts, int64_t time) {
  return side == LEFT ? (wide)ts + c->upper < time
                      : (wide)ts - c->lower < time;
}

static inline bool interval_match(const sl_interval_join_config *c,
                                  int64_t left_ts, int64_t right_ts) {
  wide d = (wide)right_ts - left_ts;
  return d >= c->lower && d <= c->upper;
}

static void bucket_key(uint8_t k[8], int64_t bucket) {
  sl_store_be64(k, flip(bucket));
}

static void interval_element_key(uint8_t k[12], int64_t ts, uint32_t seq) {
  sl_store_be64(k, flip(ts));
  k[8] = (uint8_t)(seq >> 24);
  k[9] = (uint8_t)(seq >> 16);
  k[10] = (uint8_t)(seq >> 8);
  k[11] = (uint8_t)seq;
}

/* Side's directory as it is in the state: *n bucket numbers at *view,
 * valid until the next state call. */
static int directory_view(sl_ctx *ctx, int side, const int64_t **view,
                          uint64_t *n) {
  const void *v;
  uint32_t bytes;
  int rc = sl_state_get(ctx, (uint16_t)(ID_INTERVAL_DIRECTORY + side), &v,
                        &bytes);
  *view = 0;
  *n = 0;
  if (rc == SL_ENOTFOUND)
    return 0;
  if (rc)
    return rc;
  if (bytes % 8 != 0 || bytes == 0)
    return SL_ECORRUPT;
  *view = v; /* state values are 8-byte aligned */
  *n = bytes / 8;
  return 0;
}

/* Copy entries from .. from + count - 1 of a directory view (of n
 * entries, just read: no state call since) into s->directory, with room
 * for one more. */
static int directory_copy(join_instance *s, const int64_t *view, uint64_t n,
                          uint64_t from, uint64_t count) {
  if (from + count > n)
    return SL_ECORRUPT;
  int rc = grow((void **)&s->directory, &s->directory_capacity, count + 1, 8);
  if (rc)
    return rc;
  if (count)
    memcpy(s->directory, view + from, count * 8);
  return 0;
}

static int directory_store(sl_ctx *ctx, join_instance *s, int side,
                           uint64_t n) {
  uint16_t id = (uint16_t)(ID_INTERVAL_DIRECTORY + side);
  if (n == 0) {
    int rc = sl_state_delete(ctx, id);
    return rc == SL_ENOTFOUND ? 0 : rc;
  }
  return sl_state_put(ctx, id, s->directory, (uint32_t)(n * 8), 0);
}

/* Copy a bucket of side into s->bucket; *n entries (0: none). */
static int bucket_load(sl_ctx *ctx, join_instance *s, int side,
                       int64_t bucket, uint64_t *n) {
  uint8_t k[8];
  bucket_key(k, bucket);
  const void *v;
  uint32_t bytes;
  int rc = sl_mapstate_get(ctx, (uint16_t)(ID_INTERVAL_BUCKET + side), k, 8,
                           &v, &bytes);
  *n = 0;
  if (rc == SL_ENOTFOUND)
    return 0;
  if (rc)
    return rc;
  if (bytes % sizeof(ts_entry) != 0 || bytes == 0)
    return SL_ECORRUPT;
  rc = grow((void **)&s->bucket, &s->bucket_capacity,
            bytes / sizeof(ts_entry) + 1, sizeof(ts_entry));
  if (rc)
    return rc;
  memcpy(s->bucket, v, bytes);
  *n = bytes / sizeof(ts_entry);
  return 0;
}

static int bucket_store(sl_ctx *ctx, join_instance *s, int side,
                        int64_t bucket, uint64_t n) {
  uint8_t k[8];
  bucket_key(k, bucket);
  uint16_t id = (uint16_t)(ID_INTERVAL_BUCKET + side);
  if (n == 0) {
    int rc = sl_mapstate_delete(ctx, id, k, 8);
    return rc == SL_ENOTFOUND ? 0 : rc;
  }
  return sl_mapstate_put(ctx, id, k, 8, s->bucket,
                         (uint32_t)(n * sizeof(ts_entry)));
}

/* First index in the sorted array v[0..n) whose value is >= x. */
static uint64_t lower_bound_i64(const int64_t *v, uint64_t n, int64_t x) {
  uint64_t lo = 0, hi = n;
  while (lo < hi) {
    uint64_t mid = lo + (hi - lo) / 2;
    if (v[mid] < x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static uint64_t lower_bound_ts(const ts_entry *v, uint64_t n, int64_t x) {
  uint64_t lo = 0, hi = n;
  while (lo < hi) {
    uint64_t mid = lo + (hi - lo) / 2;
    if (v[mid].ts < x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Buffer record in of side in the index and the elements (note 5). */
static int interval_insert(sl_ctx *ctx, join_instance *s, int side,
                           const sl_record *in) {
  int64_t ts = in->timestamp;
  int64_t bucket = floor_div(ts, s->j->bucket_width);
  uint64_t n;
  int rc = bucket_load(ctx, s, side, bucket, &n);
  if (rc)
    return rc;
  if (n == 0) {
    /* A new bucket: into the directory (O(buckets of the key)). */
    const int64_t *view;
    uint64_t d;
    rc = directory_view(ctx, side, &view, &d);
    if (rc == 0)
      rc = directory_copy(s, view, d, 0, d);
    if (rc)
      return rc;
    uint64_t at = lower_bound_i64(s->directory, d, bucket);
    assert(at == d || s->directory[at] != bucket);
    if (at < d)
      memmove(s->directory + at + 1, s->directory + at, (d - at) * 8);
    s->directory[at] = bucket;
    rc = directory_store(ctx, s, side, d + 1);
    if (rc)
      return rc;
  }
  uint64_t at = lower_bound_ts(s->bucket, n, ts);
  uint32_t seq;
  if (at < n && s->bucket[at].ts == ts) {
    if (s->bucket[at].count == UINT32_MAX) {
      sl_ctx_fail(ctx, "2^32 - 1 records of timestamp %" PRId64 " buffered "
                  "for one key and side", ts);
      return -EOVERFLOW;
    }
    seq = s->bucket[at].count++;
  } else {
    rc = grow((void **)&s->bucket, &s->bucket_capacity, n + 1,
              sizeof(ts_entry));
    if (rc)
      return rc;
    if (at < n)
      memmove(s->bucket + at + 1, s->bucket + at,
              (n - at) * sizeof(ts_entry));
    s->bucket[at] = (ts_entry){.ts = ts, .count = 1};
    seq = 0;
    n++;
  }
  uint8_t k[12];
  interval_element_key(k, ts, seq);
  uint32_t bytes;
  rc = element_value(s, in, &bytes);
  if (rc == 0)
    rc = sl_mapstate_put(ctx, (uint16_t)(ID_INTERVAL_ELEMENT + side), k,
                         sizeof k, s->element, bytes);
  if (rc == 0)
    rc = bucket_store(ctx, s, side, bucket, n);
  return rc;
}

/* Join in (of side) with every buffered match of the other side. */
static int interval_probe(sl_ctx *ctx, join_instance *s, uint64_t key,
                          int side, const sl_record *in) {
  const sl_interval_join_config *c = &s->j->interval;
  int other = 1 - side;
  int64_t ts = in->timestamp;
  /* The other side's timestamps that can match, clamped (a superset;
   * interval_match decides). */
  int64_t lo = side == LEFT ? saturate((wide)ts + c->lower)
                            : saturate((wide)ts - c->upper);
  int64_t hi = side == LEFT ? saturate((wide)ts + c->upper)
                            : saturate((wide)ts - c->lower);
  int64_t first_bucket = floor_div(lo, s->j->bucket_width);
  int64_t last_bucket = floor_div(hi, s->j->bucket_width);
  /* The buckets in range: a binary search in the directory, and a copy
   * of that range only (reading a bucket may move the directory). */
  const int64_t *view;
  uint64_t d;
  int rc = directory_view(ctx, other, &view, &d);
  if (rc)
    return rc;
  uint64_t first = lower_bound_i64(view, d, first_bucket);
  uint64_t end = first;
  while (end < d && view[end] <= last_bucket)
    end++;
  rc = directory_copy(s, view, d, first, end - first);
  if (rc)
    return rc;
  uint64_t matches = 0;
  for (uint64_t i = 0; i < end - first; i++) {
    uint64_t n;
    rc = bucket_load(ctx, s, other, s->directory[i], &n);
    if (rc == 0 && n == 0)
      rc = SL_ECORRUPT; /* the directory lists it */
    if (rc)
      return rc;
    for (uint64_t e = lower_bound_ts(s->bucket, n, lo);
         e < n && s->bucket[e].ts <= hi; e++) {
      bool match = side == LEFT ? interval_match(c, ts, s->bucket[e].ts)
                                : interval_match(c, s->bucket[e].ts, ts);
      if (!match)
        continue;
      rc = grow((void **)&s->matches, &s->match_capacity, matches + 1,
                sizeof(ts_entry));
      if (rc)
        return rc;
      s->matches[matches++] = s->bucket[e];
    }
  }
  for (uint64_t m = 0; m < matches; m++) {
    const ts_entry *e = &s->matches[m];
    for (uint32_t seq = 0; seq < e->count; seq++) {
      uint8_t k[12];
      interval_element_key(k, e->ts, seq);
      const void *v;
      uint32_t bytes;
      sl_record r;
      rc = sl_mapstate_get(ctx, (uint16_t)(ID_INTERVAL_ELEMENT + other), k,
                           sizeof k, &v, &bytes);
      if (rc == SL_ENOTFOUND)
        rc = SL_ECORRUPT; /* the index counts it */
      if (rc == 0)
        rc = element_record(v, bytes, &r);
      if (rc)
        return rc;
      sl_emit_stamp st; /* note 8 */
      sl_emit_stamp_begin(ctx, &st, ts > e->ts ? ts : e->ts);
      rc = side == LEFT ? c->join(c->user, ctx, key, in, &r)
                        : c->join(c->user, ctx, key, &r, in);
      sl_emit_stamp_end(ctx, &st);
      rc = join_status(ctx, rc, key);
      if (rc)
        return rc;
    }
  }
  return 0;
}

/* The first time at which a record of side with timestamp ts is expired
 * (note 4), saturated. */
static int64_t interval_cleanup_time(const sl_interval_join_config *c,
                                     int side, int64_t ts) {
  return side == LEFT ? saturate((wide)ts + c->upper + 1)
                      : saturate((wide)ts - c->lower + 1);
}

static int interval_process(sl_ctx *ctx, join_instance *s, int side,
                            const sl_record *in) {
  const sl_interval_join_config *c = &s->j->interval;
  int rc;
  int64_t ts = event_time(ctx, in, &rc);
  if (rc)
    return rc;
  uint64_t key;
  rc = sl_ctx_key(ctx, &key);
  if (rc)
    return rc;
  int64_t watermark = sl_ctx_watermark(ctx);
  if (watermark != SL_WATERMARK_MIN && ts < watermark)
    return late_record(ctx, s->j, side, in);
  rc = interval_probe(ctx, s, key, side, in);
  if (rc)
    return rc;
  if (watermark != SL_WATERMARK_MIN &&
      interval_expired(c, side, ts, watermark))
    return 0; /* it matched what it could; nothing later can match it */
  rc = interval_insert(ctx, s, side, in);
  if (rc == 0)
    rc = sl_timer_register(ctx, SL_EVENT_TIME,
                           interval_cleanup_time(c, side, ts));
  return rc;
}

/* Drop side's records expired at time (all at SL_WATERMARK_MAX): a prefix
 * of the index (note 5, 6). */
static int interval_purge(sl_ctx *ctx, join_instance *s, int side,
                          int64_t time) {
  const sl_interval_join_config *c = &s->j->interval;
  bool all = time == SL_WATERMARK_MAX;
  const int64_t *view;
  uint64_t d;
  int rc = 0;
  uint64_t emptied = 0;
  for (;; emptied++) {
    /* Read again each time: the deletes below may move it. */
    rc = directory_view(ctx, side, &view, &d);
    if (rc)
      return rc;
    if (emptied >= d)
      break;
    int64_t bucket = view[emptied];
    uint64_t n;
    rc = bucket_load(ctx, s, side, bucket, &n);
    if (rc == 0 && n == 0)
      rc = SL_ECORRUPT; /* the directory lists it */
    if (rc)
      return rc;
    uint64_t gone = 0;
    while (gone < n &&
           (all || interval_expired(c, side, s->bucket[gone].ts, time))) {
      for (uint32_t seq = 0; seq < s->bucket[gone].count; seq++) {
        uint8_t k[12];
        interval_element_key(k, s->bucket[gone].ts, seq);
        rc = sl_mapstate_delete(ctx, (uint16_t)(ID_INTERVAL_ELEMENT + side),
                                k, sizeof k);
        if (rc && rc != SL_ENOTFOUND)
          return rc;
      }
      gone++;
    }
    if (gone < n) {
      /* The first bucket with a live record: what follows is live too. */
      if (gone > 0) {
        memmove(s->bucket, s->bucket + gone, (n - gone) * sizeof(ts_entry));
        rc = bucket_store(ctx, s, side, bucket, n - gone);
        if (rc)
          return rc;
      }
      break;
    }
    rc = bucket_store(ctx, s, side, bucket, 0);
    if (rc)
      return rc;
  }
  if (emptied == 0)
    return 0;
  /* Drop the emptied buckets (O(buckets of the key), once per bucket). */
  rc = directory_view(ctx, side, &view, &d);
  if (rc == 0 && emptied > d)
    rc = SL_ECORRUPT;
  if (rc == 0)
    rc = directory_copy(s, view, d, emptied, d - emptied);
  return rc ? rc : directory_store(ctx, s, side, d - emptied);
}

static int interval_timer(sl_ctx *ctx, join_instance *s, int64_t time) {
  int rc = interval_purge(ctx, s, LEFT, time);
  return rc ? rc : interval_purge(ctx, s, RIGHT, time);
}

/* ----------------------------------------------------------- unbounded */

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

/* ----------------------------------------------------------- callbacks */

static int join_open(sl_ctx *ctx, void *user, void **state) {
  (void)ctx;
  join_instance *s = calloc(1, sizeof *s);
  if (!s)
    return -ENOMEM;
  s->j = user;
  *state = s;
  return 0;
}

static void join_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  join_instance *s = state;
  if (!s)
    return;
  free(s->element);
  for (int side = 0; side < 2; side++) {
    free(s->sides[side].refs);
    free(s->sides[side].bytes);
  }
  free(s->directory);
  free(s->bucket);
  free(s->matches);
  free(s);
}

static int join_process(sl_ctx *ctx, void *state, int input,
                        const sl_record *in) {
  join_instance *s = state;
  assert(input == LEFT || input == RIGHT);
  int rc;
  switch (s->j->kind) {
  case JOIN_WINDOW:
    rc = window_process(ctx, s, input, in);
    break;
  case JOIN_INTERVAL:
    rc = interval_process(ctx, s, input, in);
    break;
  default:
    rc = unbounded_process(ctx, s, input, in);
    break;
  }
  return fail_status(ctx, rc, input == LEFT ? "join, left record"
                                            : "join, right record");
}

static int join_on_timer(sl_ctx *ctx, void *state, int domain,
                         int64_t time) {
  join_instance *s = state;
  if (domain != SL_EVENT_TIME)
    return 0;
  int rc = s->j->kind == JOIN_WINDOW ? window_timer(ctx, s, time)
                                     : interval_timer(ctx, s, time);
  return fail_status(ctx, rc, "join timer");
}

/* ----------------------------------------------------------- building */

static int config_error(sl_job *job, const char *what, const char *name,
                        const char *text) {
  sl_job_set_error(job, "%s '%s': %s", what, name ? name : "(null)", text);
  return EINVAL;
}

static int check_port(sl_job *job, const char *what, const char *name,
                      int port, const char *field) {
  if (port >= 0 && port <= SL_MAX_SIDE_OUTPUTS)
    return 0;
  sl_job_set_error(job, "%s '%s': %s must be 0..SL_MAX_SIDE_OUTPUTS (%d)",
                   what, name ? name : "(null)", field, SL_MAX_SIDE_OUTPUTS);
  return EINVAL;
}

static int check_keyed(sl_job *job, const char *what, const char *name,
                       const sl_op *input, const char *side) {
  if (!input) {
    sl_job_set_error(job, "%s '%s': the %s input is NULL", what,
                     name ? name : "(null)", side);
    return SL_EGRAPH;
  }
  if (input->kind != SL_OP_KEY_BY) {
    sl_job_set_error(job, "%s '%s': its %s input '%s' is not keyed (put an "
                     "sl_op_key_by in front whose key is the join key)",
                     what, name ? name : "(null)", side, input->name);
    return SL_EGRAPH;
  }
  return 0;
}

/* Validate the inputs and build the operator; owns j (freed on error). */
static int build(sl_job *job, const char *what, const char *name,
                 sl_op *left, sl_op *right, int parallelism, join_op *j,
                 sl_op **op) {
  int rc = check_keyed(job, what, name, left, "left");
  if (rc == 0)
    rc = check_keyed(job, what, name, right, "right");
  if (rc) {
    free(j);
    return rc;
  }
  sl_op *inputs[2] = {left, right};
  sl_process_ops ops = {.open = join_open,
                        .process = join_process,
                        .close = join_close,
                        .on_timer = j->kind == JOIN_UNBOUNDED ? 0
                                                              : join_on_timer};
  rc = sl_op_process(job, name, inputs, 2, parallelism, &ops, j, op);
  if (rc) {
    free(j);
    return rc;
  }
  (*op)->user_free = free;
  return 0;
}

static int check_window(sl_job *job, const char *name,
                        const sl_window_join_config *c) {
  const char *what = "window join";
  if (!c)
    return config_error(job, what, name, "config is NULL");
  if (c->type != SL_WINDOW_TUMBLING && c->type != SL_WINDOW_SLIDING)
    return config_error(job, what, name, "type must be SL_WINDOW_TUMBLING "
                        "or SL_WINDOW_SLIDING (session and count windows "
                        "are not supported by the join)");
  if (c->domain != SL_EVENT_TIME)
    return config_error(job, what, name, "domain must be SL_EVENT_TIME "
                        "(processing-time joins are not supported)");
  if (c->size <= 0)
    return config_error(job, what, name, "size must be > 0");
  if (c->type == SL_WINDOW_SLIDING && (c->slide <= 0 || c->slide > c->size))
    return config_error(job, what, name, "slide must be in 1 .. size");
  if (c->allowed_lateness < 0)
    return config_error(job, what, name, "allowed_lateness must be >= 0");
  if (!c->join)
    return config_error(job, what, name, "join function is NULL");
  int rc = check_port(job, what, name, c->left_late_port, "left_late_port");
  return rc ? rc : check_port(job, what, name, c->right_late_port,
                              "right_late_port");
}

SL_EXPORT int sl_op_window_join(sl_job *job, const char *name,
                                sl_op *left_keyed, sl_op *right_keyed,
                                int parallelism,
                                const sl_window_join_config *cfg,
                                sl_op **op) {
  if (op)
    *op = 0;
  if (!job || !op)
    return EINVAL;
  int rc = check_window(job, name, cfg);
  if (rc)
    return rc;
  join_op *j = calloc(1, sizeof *j);
  if (!j)
    return ENOMEM;
  j->kind = JOIN_WINDOW;
  j->window = *cfg;
  j->late_port[LEFT] = cfg->left_late_port;
  j->late_port[RIGHT] = cfg->right_late_port;
  return build(job, "window join", name, left_keyed, right_keyed,
               parallelism, j, op);
}

SL_EXPORT int sl_op_interval_join(sl_job *job, const char *name,
                                  sl_op *left_keyed, sl_op *right_keyed,
                                  int parallelism,
                                  const sl_interval_join_config *cfg,
                                  sl_op **op) {
  if (op)
    *op = 0;
  if (!job || !op)
    return EINVAL;
  const char *what = "interval join";
  if (!cfg)
    return config_error(job, what, name, "config is NULL");
  if (cfg->lower > cfg->upper) {
    sl_job_set_error(job, "%s '%s': lower bound %" PRId64 " is above upper "
                     "bound %" PRId64 " (lower <= upper required)", what,
                     name ? name : "(null)", cfg->lower, cfg->upper);
    return EINVAL;
  }
  if (cfg->bucket_width < 0)
    return config_error(job, what, name, "bucket_width must be >= 0");
  if (!cfg->join)
    return config_error(job, what, name, "join function is NULL");
  int rc = check_port(job, what, name, cfg->left_late_port,
                      "left_late_port");
  if (rc == 0)
    rc = check_port(job, what, name, cfg->right_late_port, "right_late_port");
  if (rc)
    return rc;
  join_op *j = calloc(1, sizeof *j);
  if (!j)
    return ENOMEM;
  j->kind = JOIN_INTERVAL;
  j->interval = *cfg;
  j->late_port[LEFT] = cfg->left_late_port;
  j->late_port[RIGHT] = cfg->right_late_port;
  j->bucket_width = cfg->bucket_width ? cfg->bucket_width
                                      : DEFAULT_BUCKET_WIDTH;
  return build(job, what, name, left_keyed, right_keyed, parallelism, j, op);
}

SL_EXPORT int sl_op_join(sl_job *job, const char *name, sl_op *left_keyed,
                         sl_op *right_keyed, int parallelism,
                         sl_join_fn join, void *user, sl_op **op) {
  if (op)
    *op = 0;
  if (!job || !op)
    return EINVAL;
  if (!join)
    return config_error(job, "join", name, "join function is NULL");
  join_op *j = calloc(1, sizeof *j);
  if (!j)
    return ENOMEM;
  j->kind = JOIN_UNBOUNDED;
  j->join = join;
  j->user = user;
  return build(job, "join", name, left_keyed, right_keyed, parallelism, j,
               op);
}
