/* join_interval.c — the interval join (Flink's interval join): a left
 * record a and a right record b of a key are joined when
 * a.ts + lower <= b.ts <= a.ts + upper, each record buffered until the
 * watermark makes it unable to match.  What the three joins share (state
 * ids, element values, stamps, the operator shell) is in join_internal.h
 * and join_common.c.
 *
 * NOTES ON THE DESIGN
 *
 * 1. Interval join rules.  With W the watermark before a record:
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
 * 2. Interval join index, per key and side (the API has no iteration over
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
 * 3. The cleanup timer purges by the timer's time, not by the timestamp
 *    it was registered for, so duplicates, saturated times and the final
 *    SL_WATERMARK_MAX (which empties the key: no record can come after the
 *    end of input) all work.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "config_abi.h"
#include "join_internal.h"

#define DEFAULT_BUCKET_WIDTH 256

static inline int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}


/* ----------------------------------------------------------- index */

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
  op_store_be32(k + 8, seq);
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
  int rc = join_grow((void **)&s->directory, &s->directory_capacity,
                     count + 1, 8);
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
  rc = join_grow((void **)&s->bucket, &s->bucket_capacity,
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

/* Buffer record in of side in the index and the elements (note 2). */
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
      return EOVERFLOW;
    }
    seq = s->bucket[at].count++;
  } else {
    rc = join_grow((void **)&s->bucket, &s->bucket_capacity, n + 1,
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
      rc = join_grow((void **)&s->matches, &s->match_capacity,
                     matches + 1, sizeof(ts_entry));
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
      sl_emit_stamp st; /* join_internal.h note 2 */
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
 * (note 1), saturated. */
static int64_t interval_cleanup_time(const sl_interval_join_config *c,
                                     int side, int64_t ts) {
  return side == LEFT ? saturate((wide)ts + c->upper + 1)
                      : saturate((wide)ts - c->lower + 1);
}

static int interval_process(sl_ctx *ctx, join_instance *s, int side,
                            const sl_record *in) {
  const sl_interval_join_config *c = &s->j->interval;
  int64_t ts, watermark;
  uint64_t key;
  int rc = join_record_begin(ctx, in, &ts, &key, &watermark);
  if (rc)
    return rc;
  if (watermark != SL_WATERMARK_MIN && ts < watermark)
    return join_late_record(ctx, s->j, side, in);
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
 * of the index (notes 2, 3). */
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

/* ----------------------------------------------------------- building */

SL_EXPORT int sl_op_interval_join_sized(sl_job *job, const char *name,
                                        sl_op *left_keyed, sl_op *right_keyed,
                                        int parallelism,
                                        const sl_interval_join_config *cfg,
                                        sl_op **op, size_t cfg_bytes) {
  if (op)
    *op = 0;
  if (!job || !op)
    return EINVAL;
  sl_interval_join_config copy;
  if (SL_CONFIG_READ(job, sl_op_interval_join, sl_interval_join_config,
                     SL_INTERVAL_JOIN_CONFIG_V1, cfg, cfg_bytes, &copy))
    return EINVAL;
  if (cfg)
    cfg = &copy;
  const char *what = "interval join";
  if (!cfg)
    return join_config_error(job, what, name, "config is NULL");
  if (cfg->lower > cfg->upper) {
    sl_job_set_error(job, "%s '%s': lower bound %" PRId64 " is above upper "
                     "bound %" PRId64 " (lower <= upper required)", what,
                     name ? name : "(null)", cfg->lower, cfg->upper);
    return EINVAL;
  }
  if (cfg->bucket_width < 0)
    return join_config_error(job, what, name, "bucket_width must be >= 0");
  if (!cfg->join)
    return join_config_error(job, what, name, "join function is NULL");
  int rc = join_check_port(job, what, name, cfg->left_late_port,
                      "left_late_port");
  if (rc == 0)
    rc = join_check_port(job, what, name, cfg->right_late_port, "right_late_port");
  if (rc)
    return rc;
  join_op *j = calloc(1, sizeof *j);
  if (!j)
    return ENOMEM;
  j->interval = *cfg;
  j->late_port[LEFT] = cfg->left_late_port;
  j->late_port[RIGHT] = cfg->right_late_port;
  j->bucket_width = cfg->bucket_width ? cfg->bucket_width
                                      : DEFAULT_BUCKET_WIDTH;
  return join_build(job, what, name, left_keyed, right_keyed, parallelism, j,
                    interval_process, interval_timer, op);
}

/* The version-1 symbol (config_abi.c note 1): a program linked before the
 * sized call existed passed a version-1 struct. */
SL_EXPORT int(sl_op_interval_join)(sl_job *job, const char *name,
                                   sl_op *left_keyed, sl_op *right_keyed,
                                   int parallelism,
                                   const sl_interval_join_config *cfg,
                                   sl_op **op) {
  return sl_op_interval_join_sized(job, name, left_keyed, right_keyed,
                                   parallelism, cfg, op,
                                   SL_INTERVAL_JOIN_CONFIG_V1);
}
