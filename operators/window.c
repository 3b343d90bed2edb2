/* window.c — keyed windows: tumbling, sliding, session and count, in event
 * or processing time, with incremental or full-window functions.
 *
 * NOTES ON THE DESIGN
 *
 * 1. The operator is a keyed process operator built on the public API:
 *    map state for window contents, timers (timer.c) for firing, so
 *    everything it holds is checkpointed and restored with the keyed state
 *    and nothing lives outside it between two records.
 * 2. State of one key (ids private to this operator):
 *      HEADER  map state, user key = window id (8 bytes BE):
 *              {count, fired, accumulator (incremental only)}
 *      ELEMENT map state, user key = window id + sequence (12 bytes BE):
 *              {timestamp, record bytes}  (full-window functions only)
 *      SESSIONS value state: the key's open sessions {start, end, id},
 *              sorted by start, and the next session id
 *      COUNTER value state (count windows): records of the key before
 *              the open window, then that window's header (and
 *              accumulator); its elements are under ELEMENT
 *    A time window's id is its end (sign bit flipped: ids of negative
 *    times still sort); a session's id is a per-key counter, stable while
 *    the session grows and merges (Flink's "state window"); a count
 *    window's id is its index.
 * 3. Firing.  A time window registers a timer at end - 1 (and, with
 *    allowed lateness L > 0, a cleanup timer at end - 1 + L).  At end - 1
 *    it fires; without lateness it is purged at once, with lateness it is
 *    kept, marked fired, until the cleanup timer.  A record arriving for a
 *    fired window is added and the window fires again at once.  Both
 *    timers are found again from the timer's time alone: the window with
 *    end = time + 1 (fire) and the one with end = time + 1 - L (cleanup).
 *    Sessions compare the time with each of the key's sessions instead
 *    (note 6).  A record that opens or reaches a window the watermark has
 *    already passed (within the lateness) makes it fire at once.  Results
 *    carry the timestamp end - 1.
 * 4. Sessions merge: a record opens [ts, ts + gap); every session it
 *    overlaps (start < end' and start' < end) merges with it into the one
 *    with the lowest id, whose state absorbs the others' (merge() of the
 *    accumulators, or the elements appended).  Timers are not moved
 *    (note 6).  A merged session that is already due (its end - 1 at or
 *    behind the watermark, possible with lateness) fires at once.
 * 5. Lateness is judged against the watermark before the record: a record
 *    is late when every window it belongs to has end - 1 + L <= watermark.
 *    In a sliding window some of a record's windows may be late and others
 *    not: it is added to the live ones and only counted late if none is.
 * 6. Session timers are re-armed lazily (event time).  A session x is due
 *    at due(x) = end - 1 until it fired, then at its cleanup time
 *    end - 1 + L.  Invariant: for every session x of a key, a timer of the
 *    key is pending at some time <= due(x), and every pending timer's
 *    time is above the watermark (so they fire in time order).  A record
 *    that grows a session deletes nothing: the timers of the sessions it
 *    merged are earlier than the merged session's due time, and only when
 *    none of them is (a new session; or all merged ones had fired and the
 *    result grew past the watermark) does it register one, at the merged
 *    session's due time.  A timer at T visits every session of the key
 *    (session_timer): one with end - 1 <= T fires if it has not, and is
 *    purged if L = 0 or its cleanup time is <= T; the ones left get one
 *    timer at the earliest of their due times (> T), which restores the
 *    invariant.  If that time is at or behind the watermark already (at
 *    the end of input it always is), the timer visits the key's sessions
 *    again at that time instead, until the earliest due time left is past
 *    the watermark: a timer re-armed there would only fire at once, after
 *    a put and a delete of its entry.  So:
 *      - each session fires at its own end - 1, as if it had a timer
 *        there: timers fire in (time, key) order, and the re-armed one is
 *        pushed before its time is reached;
 *      - a timer costs one visit per time the session outgrew it, instead
 *        of a delete and a register per record;
 *      - a key whose sessions are all gone holds no timer: each timer's
 *        time is <= the purge time of the session it was registered for
 *        (sessions only grow), and purges come in time order;
 *      - timers are shared by the key's sessions, and none is deleted:
 *        one session's cleanup time may equal another's end - 1 (deleting
 *        it on a merge, as before, lost the other's firing);
 *      - at the end of input SL_WATERMARK_MAX fires every session of a
 *        key in one firing of its timer, in time order, each stamped
 *        with its own end - 1 (window_fire); only the order of results
 *        among keys differs from one timer per due time.
 *    The visit compares with <=, so exact per-session timers (checkpoints
 *    from before this scheme) work as well.  Processing time cannot re-arm
 *    lazily, since timers registered during the end-of-input firing do not
 *    fire (timer.c note 5): there each session keeps exactly its own timer
 *    at end - 1, deleted when it merges (L is 0 there).
 * 7. Extreme times (time_check.h).  An event-time record must carry a
 *    valid time (SL_TIME_MIN_VALID .. SL_TIME_MAX_VALID), and sizes,
 *    slides, gaps and lateness are at most SL_TIME_SPAN_MAX: so every
 *    start, end and cleanup time is an int64 below SL_WATERMARK_MAX, and
 *    the final watermark still fires and purges every window.  A record
 *    outside the range fails the job, naming the operator and the
 *    timestamp; nothing wraps.  Count windows count records (uint64).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "config_abi.h"
#include "internal.h"
#include "op_util.h"
#include "time_check.h"

enum {
  ID_HEADER = 0xFF01,
  ID_ELEMENT = 0xFF02,
  ID_SESSIONS = 0xFF03,
  ID_COUNTER = 0xFF04,
};

#define MAX_ACC_BYTES (64u << 10)

typedef struct window_header {
  uint64_t count;
  uint64_t fired; /* 1: fired once already (kept for allowed lateness) */
  /* accumulator follows, 8-byte aligned */
} window_header;

typedef struct session {
  int64_t start, end;
  uint64_t id;
} session;

typedef struct session_set {
  uint64_t next_id;
  uint64_t count;
  /* sessions follow */
} session_set;

/* The operator's configuration (the user pointer of the process op). */
typedef struct window_op {
  sl_window_config cfg;
  bool incremental;
} window_op;

/* Per instance. */
typedef struct window_instance {
  const window_op *w;
  uint8_t *buffer; /* header + accumulator being built */
  uint64_t buffer_bytes;
  session *sessions; /* working copy of the key's session set */
  uint64_t session_capacity;
  uint8_t *element; /* element being stored */
  uint64_t element_bytes;
  uint8_t *count_template; /* count windows, incremental: an empty window's
                              state (counter 0, header, fresh accumulator) */
} window_instance;

struct sl_window_contents {
  sl_ctx *ctx;
  uint64_t id;
  uint32_t count;
};

/* The cleanup time end - 1 + L of a window (note 3).  Every window of a
 * valid time, with spans the config check allowed, has one below
 * SL_WATERMARK_MAX (time_check.h note 2); the saturation only keeps a
 * window from state written under other rules until the end of input,
 * instead of wrapping. */
static inline int64_t cleanup_time(const sl_window_config *c, int64_t end) {
  assert(end > INT64_MIN);
  return sl_time_add_sat(end - 1, c->allowed_lateness);
}

static inline int64_t floor_mod(int64_t a, int64_t b) {
  int64_t m = a % b;
  return m < 0 ? m + b : m;
}

static void put_id(uint8_t *out, uint64_t id) { sl_store_be64(out, id); }

static uint64_t time_id(int64_t end) { return (uint64_t)end ^ (1ull << 63); }

/* A working buffer of at least need bytes (op_util.h): 0, EINVAL over
 * 1 GiB, ENOMEM. */
static inline int grow(uint8_t **buffer, uint64_t *bytes, uint64_t need) {
  return op_grow((void **)buffer, bytes, need, 1, 1u << 30);
}

static uint32_t header_bytes(const window_op *w) {
  return (uint32_t)sizeof(window_header) +
         (w->incremental ? (w->cfg.acc_bytes + 7u) & ~7u : 0u);
}

/* ----------------------------------------------------------- window state */

/* Load the header of window id into the instance buffer; *found says
 * whether it existed (if not, a fresh one is built). */
static int header_load(sl_ctx *ctx, window_instance *s, uint64_t id,
                       bool *found) {
  uint8_t k[8];
  put_id(k, id);
  const void *v = 0;
  uint32_t bytes = 0;
  uint32_t need = header_bytes(s->w);
  int rc = grow(&s->buffer, &s->buffer_bytes, need);
  if (rc)
    return rc;
  rc = sl_mapstate_get(ctx, ID_HEADER, k, 8, &v, &bytes);
  if (rc == SL_ENOTFOUND) {
    *found = false;
    memset(s->buffer, 0, need);
    if (s->w->incremental)
      s->w->cfg.init(s->w->cfg.user, s->buffer + sizeof(window_header));
    return 0;
  }
  if (rc)
    return rc;
  if (bytes != need) {
    sl_ctx_fail(ctx, "window state of %" PRIu32 " bytes, expected %" PRIu32
                " (state from another window configuration?)", bytes, need);
    return SL_ECORRUPT;
  }
  memcpy(s->buffer, v, need);
  *found = true;
  return 0;
}

static int header_store(sl_ctx *ctx, window_instance *s, uint64_t id) {
  uint8_t k[8];
  put_id(k, id);
  return sl_mapstate_put(ctx, ID_HEADER, k, 8, s->buffer,
                         header_bytes(s->w));
}

/* The ELEMENT key of window id's element seq (note 2). */
static void element_key(uint8_t k[12], uint64_t id, uint64_t seq) {
  put_id(k, id);
  op_store_be32(k + 8, (uint32_t)seq);
}

static int element_store(sl_ctx *ctx, window_instance *s, uint64_t id,
                         uint64_t seq, int64_t ts, const void *data,
                         uint32_t size) {
  uint8_t k[12];
  element_key(k, id, seq);
  int rc = grow(&s->element, &s->element_bytes, 8ull + size);
  if (rc)
    return rc;
  memcpy(s->element, &ts, 8);
  if (size)
    memcpy(s->element + 8, data, size);
  return sl_mapstate_put(ctx, ID_ELEMENT, k, 12, s->element, 8 + size);
}

static int element_get(sl_ctx *ctx, uint64_t id, uint64_t seq,
                       const uint8_t **value, uint32_t *bytes) {
  uint8_t k[12];
  element_key(k, id, seq);
  const void *v;
  int rc = sl_mapstate_get(ctx, ID_ELEMENT, k, 12, &v, bytes);
  if (rc == 0 && *bytes < 8)
    rc = SL_ECORRUPT;
  *value = v;
  return rc;
}

static int element_delete(sl_ctx *ctx, uint64_t id, uint64_t seq) {
  uint8_t k[12];
  element_key(k, id, seq);
  return sl_mapstate_delete(ctx, ID_ELEMENT, k, 12);
}

/* Add a record to window id (header in s->buffer, already loaded). */
static int window_add(sl_ctx *ctx, window_instance *s, uint64_t id,
                      const sl_record *in) {
  window_header *h = (window_header *)s->buffer;
  if (s->w->incremental) {
    s->w->cfg.add(s->w->cfg.user, s->buffer + sizeof(window_header), in);
  } else {
    if (h->count >= UINT32_MAX) {
      sl_ctx_fail(ctx, "a window holds 2^32 records already");
      return EOVERFLOW;
    }
    int rc = element_store(ctx, s, id, h->count, in->timestamp, in->data,
                           in->size_bytes);
    if (rc)
      return rc;
  }
  h->count++;
  return 0;
}

SL_EXPORT uint32_t sl_window_count(const sl_window_contents *contents) {
  return contents ? contents->count : 0;
}

SL_EXPORT int sl_window_record(const sl_window_contents *contents, uint32_t i,
                     sl_record *out) {
  if (!contents || !out || i >= contents->count)
    return EINVAL;
  const uint8_t *v;
  uint32_t bytes;
  int rc = element_get(contents->ctx, contents->id, i, &v, &bytes);
  if (rc == SL_ENOTFOUND)
    rc = SL_ECORRUPT; /* the header counted it */
  if (rc)
    return rc;
  memcpy(&out->timestamp, v, 8);
  out->data = v + 8;
  out->size_bytes = bytes - 8;
  return 0;
}

/* Emit the result of window id (header in s->buffer). */
static int window_fire(sl_ctx *ctx, window_instance *s, uint64_t key,
                       uint64_t id, const sl_window *win) {
  const sl_window_config *c = &s->w->cfg;
  window_header *h = (window_header *)s->buffer;
  h->fired = 1;
  if (h->count == 0)
    return 0;
  int rc;
  /* A time window's result carries end - 1, also when a late record makes
   * it fire again (sl_emit stamps with the current record's time). */
  sl_emit_stamp stamp;
  bool stamped = c->type != SL_WINDOW_COUNT;
  if (stamped)
    sl_emit_stamp_begin(ctx, &stamp, win->end - 1);
  if (s->w->incremental) {
    rc = c->emit(c->user, ctx, key, win, s->buffer + sizeof(window_header));
  } else {
    sl_window_contents contents = {.ctx = ctx, .id = id,
                                   .count = (uint32_t)h->count};
    /* The user may make state calls: keep the header elsewhere first. */
    window_header saved = *h;
    rc = c->process(c->user, ctx, key, win, &contents);
    *(window_header *)s->buffer = saved;
  }
  if (stamped)
    sl_emit_stamp_end(ctx, &stamp);
  if (rc != 0 && !ctx->cause[0]) /* any nonzero fails (runtime.c note 8) */
    sl_ctx_fail(ctx, "window function for key %" PRIu64 ", window [%" PRId64
                ", %" PRId64 ") returned %d", key, win->start, win->end, rc);
  return rc;
}

static int window_purge_elements(sl_ctx *ctx, uint64_t id, uint64_t count) {
  for (uint64_t i = 0; i < count; i++) {
    int rc = element_delete(ctx, id, i);
    if (rc && rc != SL_ENOTFOUND)
      return rc;
  }
  return 0;
}

/* Delete window id's state (header and elements). */
static int window_purge(sl_ctx *ctx, window_instance *s, uint64_t id,
                        uint64_t count) {
  if (!s->w->incremental) {
    int rc = window_purge_elements(ctx, id, count);
    if (rc)
      return rc;
  }
  uint8_t k[8];
  put_id(k, id);
  int rc = sl_mapstate_delete(ctx, ID_HEADER, k, 8);
  return rc == SL_ENOTFOUND ? 0 : rc;
}

/* ----------------------------------------------------------- time windows */

/* The time of record in: its timestamp (note 7), or the processing time.
 * 0, or EINVAL (job failed) for a missing or invalid timestamp. */
static int record_time(sl_ctx *ctx, const window_op *w, const sl_record *in,
                       int64_t *ts) {
  if (w->cfg.domain == SL_PROCESSING_TIME) {
    *ts = sl_ctx_processing_time(ctx);
    return 0;
  }
  *ts = in->timestamp;
  if (in->timestamp == SL_NO_TIMESTAMP) {
    sl_ctx_fail(ctx, "a record without a timestamp reached an event-time "
                "window (emit with sl_emit_ts)");
    return EINVAL;
  }
  if (!sl_time_valid(in->timestamp)) {
    /* Its windows' bounds or cleanup time would not fit in an int64
     * (time_check.h note 2): refused, never wrapped. */
    sl_ctx_fail(ctx, "timestamp %" PRId64 " is outside the valid event "
                "times %" PRId64 " .. %" PRId64 " (SL_TIME_MIN_VALID .. "
                "SL_TIME_MAX_VALID)", in->timestamp, SL_TIME_MIN_VALID,
                SL_TIME_MAX_VALID);
    return EINVAL;
  }
  return 0;
}

/* What a time or session window needs of a record first: its time, its
 * key and the watermark to judge its lateness by (note 5; never late in
 * processing time). */
static int record_begin(sl_ctx *ctx, const window_op *w, const sl_record *in,
                        int64_t *ts, uint64_t *key, int64_t *wm) {
  int rc = record_time(ctx, w, in, ts);
  if (rc == 0)
    rc = sl_ctx_key(ctx, key);
  *wm = w->cfg.domain == SL_EVENT_TIME ? sl_ctx_watermark(ctx)
                                       : SL_WATERMARK_MIN;
  return rc;
}

static int late_record(sl_ctx *ctx, const window_op *w, const sl_record *in) {
  sl_ctx_count(ctx, SL_COUNT_LATE, 1);
  if (w->cfg.late_port)
    return sl_emit_side(ctx, w->cfg.late_port, in->data, in->size_bytes,
                        in->timestamp);
  return 0;
}

/* One time window [start, end) receives in. */
static int time_window_add(sl_ctx *ctx, window_instance *s, uint64_t key,
                           int64_t start, int64_t end, int64_t wm,
                           const sl_record *in) {
  const sl_window_config *c = &s->w->cfg;
  uint64_t id = time_id(end);
  bool found;
  int rc = header_load(ctx, s, id, &found);
  if (rc)
    return rc;
  if (!found) {
    rc = sl_timer_register(ctx, c->domain, end - 1);
    if (rc == 0 && c->allowed_lateness > 0)
      rc = sl_timer_register(ctx, c->domain,
                             cleanup_time(c, end));
    if (rc)
      return rc;
  }
  rc = window_add(ctx, s, id, in);
  if (rc)
    return rc;
  window_header *h = (window_header *)s->buffer;
  if (h->fired || (wm != SL_WATERMARK_MIN && end - 1 <= wm)) {
    /* Late but within the allowed lateness: fire (again) now (note 3), as
     * Flink's event-time trigger does. */
    sl_window win = {.start = start, .end = end};
    rc = window_fire(ctx, s, key, id, &win);
    if (rc)
      return rc;
  }
  return header_store(ctx, s, id);
}

static int time_process(sl_ctx *ctx, window_instance *s, const sl_record *in) {
  const sl_window_config *c = &s->w->cfg;
  int64_t ts, wm;
  uint64_t key;
  int rc = record_begin(ctx, s->w, in, &ts, &key, &wm);
  if (rc)
    return rc;
  int64_t slide = c->type == SL_WINDOW_TUMBLING ? c->size : c->slide;
  /* ts is valid and size, slide <= SL_TIME_SPAN_MAX (check_config), so
   * nothing below overflows (time_check.h note 2): each start lies in
   * (ts - size, ts], each end in (ts, ts + size]. */
  assert(sl_time_valid(ts) && sl_time_span_valid(c->size));
  int64_t last_start = ts - floor_mod(ts, slide);
  bool added = false;
  for (int64_t start = last_start; start > ts - c->size; start -= slide) {
    int64_t end = start + c->size;
    if (wm != SL_WATERMARK_MIN && cleanup_time(c, end) <= wm)
      continue; /* this window is gone (note 5) */
    rc = time_window_add(ctx, s, key, start, end, wm, in);
    if (rc)
      return rc;
    added = true;
  }
  return added ? 0 : late_record(ctx, s->w, in);
}

static int time_timer(sl_ctx *ctx, window_instance *s, int64_t time) {
  const sl_window_config *c = &s->w->cfg;
  uint64_t key;
  int rc = sl_ctx_key(ctx, &key);
  if (rc)
    return rc;
  /* Fire: the window ending at time + 1 (none for a saturated cleanup
   * time, nor one whose start would not fit: no record made those). */
  int64_t end = INT64_MAX, start = INT64_MIN;
  bool representable = sl_time_add(time, 1, &end) &&
                       sl_time_sub(end, c->size, &start);
  uint64_t id = time_id(end);
  bool found = false;
  rc = representable ? header_load(ctx, s, id, &found) : 0;
  if (rc)
    return rc;
  if (found) {
    sl_window win = {.start = start, .end = end};
    window_header *h = (window_header *)s->buffer;
    if (!h->fired) {
      rc = window_fire(ctx, s, key, id, &win);
      if (rc)
        return rc;
    }
    if (c->allowed_lateness == 0)
      rc = window_purge(ctx, s, id, h->count);
    else
      rc = header_store(ctx, s, id);
    if (rc)
      return rc;
  }
  if (c->allowed_lateness > 0) {
    /* Cleanup: the window ending at time + 1 - L. */
    int64_t old_end;
    if (!sl_time_sub(time, c->allowed_lateness, &old_end) ||
        !sl_time_add(old_end, 1, &old_end))
      return 0; /* no window's cleanup time */
    uint64_t old_id = time_id(old_end);
    rc = header_load(ctx, s, old_id, &found);
    if (rc == 0 && found)
      rc = window_purge(ctx, s, old_id, ((window_header *)s->buffer)->count);
  }
  return rc;
}

/* ----------------------------------------------------------- sessions */

static int sessions_load(sl_ctx *ctx, window_instance *s, uint64_t *count,
                         uint64_t *next_id) {
  const void *v;
  uint32_t bytes;
  int rc = sl_state_get(ctx, ID_SESSIONS, &v, &bytes);
  if (rc == SL_ENOTFOUND) {
    *count = 0;
    *next_id = 1;
    return 0;
  }
  if (rc)
    return rc;
  session_set set;
  if (bytes < sizeof set)
    return SL_ECORRUPT;
  memcpy(&set, v, sizeof set);
  if (bytes != sizeof set + set.count * sizeof(session))
    return SL_ECORRUPT;
  if (set.count > s->session_capacity) {
    session *grown = realloc(s->sessions, sizeof(session) * set.count);
    if (!grown)
      return ENOMEM;
    s->sessions = grown;
    s->session_capacity = set.count;
  }
  if (set.count)
    memcpy(s->sessions, (const uint8_t *)v + sizeof set,
           sizeof(session) * set.count);
  *count = set.count;
  *next_id = set.next_id;
  return 0;
}

static int sessions_store(sl_ctx *ctx, window_instance *s, uint64_t count,
                          uint64_t next_id) {
  if (count == 0) {
    int rc = sl_state_delete(ctx, ID_SESSIONS);
    return rc == SL_ENOTFOUND ? 0 : rc;
  }
  uint64_t bytes = sizeof(session_set) + count * sizeof(session);
  int rc = grow(&s->element, &s->element_bytes, bytes);
  if (rc)
    return rc;
  session_set set = {.next_id = next_id, .count = count};
  memcpy(s->element, &set, sizeof set);
  memcpy(s->element + sizeof set, s->sessions, sizeof(session) * count);
  return sl_state_put(ctx, ID_SESSIONS, s->element, (uint32_t)bytes, 0);
}

static int session_reserve(window_instance *s, uint64_t count) {
  if (count <= s->session_capacity)
    return 0;
  uint64_t n = s->session_capacity ? s->session_capacity * 2 : 8;
  while (n < count)
    n *= 2;
  session *grown = realloc(s->sessions, sizeof(session) * n);
  if (!grown)
    return ENOMEM;
  s->sessions = grown;
  s->session_capacity = n;
  return 0;
}

/* Processing time only (note 6): register or delete both timers of x. */
static int session_timers(sl_ctx *ctx, const sl_window_config *c,
                          const session *x, bool add) {
  assert(c->domain == SL_PROCESSING_TIME);
  assert(c->allowed_lateness == 0); /* check_config */
  int rc = add ? sl_timer_register(ctx, c->domain, x->end - 1)
               : sl_timer_delete(ctx, c->domain, x->end - 1);
  return rc == SL_ENOTFOUND ? 0 : rc;
}

/* When session x next needs its key's timer (note 6): at end - 1 until it
 * fired, then at its cleanup time end - 1 + L. */
static int64_t session_due(const sl_window_config *c, const session *x,
                           bool fired) {
  return fired ? cleanup_time(c, x->end) : x->end - 1;
}

/* Fold session `from`'s state into `into`'s (header of into in s->buffer);
 * *fired says whether `from` had fired (true, the later due time, if it
 * has no state). */
static int session_absorb(sl_ctx *ctx, window_instance *s, uint64_t into,
                          uint64_t from, bool *fired) {
  const window_op *w = s->w;
  uint8_t k[8];
  put_id(k, from);
  const void *v;
  uint32_t bytes;
  *fired = true;
  int rc = sl_mapstate_get(ctx, ID_HEADER, k, 8, &v, &bytes);
  if (rc == SL_ENOTFOUND)
    return 0;
  if (rc)
    return rc;
  if (bytes != header_bytes(w))
    return SL_ECORRUPT;
  window_header other;
  memcpy(&other, v, sizeof other);
  *fired = other.fired != 0;
  window_header *h = (window_header *)s->buffer;
  if (w->incremental) {
    /* Copy: the next state call may invalidate v. */
    uint8_t *acc = malloc(w->cfg.acc_bytes);
    if (!acc)
      return ENOMEM;
    memcpy(acc, (const uint8_t *)v + sizeof(window_header), w->cfg.acc_bytes);
    w->cfg.merge(w->cfg.user, s->buffer + sizeof(window_header), acc);
    free(acc);
  } else {
    for (uint64_t i = 0; i < other.count; i++) {
      const uint8_t *e;
      uint32_t eb;
      rc = element_get(ctx, from, i, &e, &eb);
      if (rc)
        return rc == SL_ENOTFOUND ? SL_ECORRUPT : rc;
      int64_t ts;
      memcpy(&ts, e, 8);
      /* element_store copies e into its own buffer before the put. */
      uint8_t *copy = malloc(eb);
      if (!copy)
        return ENOMEM;
      memcpy(copy, e, eb);
      rc = element_store(ctx, s, into, h->count, ts, copy + 8, eb - 8);
      free(copy);
      if (rc)
        return rc;
      h->count++;
      rc = element_delete(ctx, from, i);
      if (rc)
        return rc;
    }
    other.count = 0;
  }
  if (w->incremental)
    h->count += other.count;
  return window_purge(ctx, s, from, 0);
}

/* Take the sessions of the key that the record's own session (m->merged
 * on entry) overlaps out of s->sessions (the others stay, in order, as
 * the first *kept): m->merged becomes their union with it, m->parts holds
 * them, the one with the lowest id (the one kept, note 4) first. */
#define MERGE_MAX 65 /* the kept session and 64 absorbed ones */

typedef struct session_merge {
  session merged;
  session parts[MERGE_MAX];
  int count;
} session_merge;

static int session_collect(sl_ctx *ctx, window_instance *s, uint64_t n,
                           session_merge *m, uint64_t *kept) {
  const sl_window_config *c = &s->w->cfg;
  uint64_t out = 0;
  for (uint64_t i = 0; i < n; i++) {
    session x = s->sessions[i];
    if (!(x.start < m->merged.end && m->merged.start < x.end)) {
      s->sessions[out++] = x;
      continue;
    }
    /* Sorted by start and disjoint: the sessions merged are contiguous,
     * and the merged range only grows, so one pass finds them all. */
    if (m->count == MERGE_MAX) {
      uint64_t key = 0;
      (void)sl_ctx_key(ctx, &key);
      sl_ctx_fail(ctx, "a record merged more than 64 sessions of key %"
                  PRIu64, key);
      return EOVERFLOW;
    }
    if (x.start < m->merged.start)
      m->merged.start = x.start;
    if (x.end > m->merged.end)
      m->merged.end = x.end;
    if (c->domain == SL_PROCESSING_TIME) {
      int rc = session_timers(ctx, c, &x, false);
      if (rc)
        return rc;
    }
    m->parts[m->count++] = x;
    if (x.id < m->parts[0].id) {
      m->parts[m->count - 1] = m->parts[0];
      m->parts[0] = x;
    }
  }
  assert(out + (uint64_t)m->count == n);
  *kept = out;
  return 0;
}

/* Fold the absorbed parts into the kept one (its header in s->buffer, it
 * fired if kept_fired) and add the record; *due_min is the earliest time
 * any part was due (note 6). */
static int session_fold(sl_ctx *ctx, window_instance *s, const session_merge *m,
                        bool kept_fired, const sl_record *in,
                        int64_t *due_min) {
  const sl_window_config *c = &s->w->cfg;
  uint64_t keep_id = m->merged.id;
  *due_min = INT64_MAX;
  if (m->count > 0)
    *due_min = session_due(c, &m->parts[0], kept_fired);
  for (int i = 1; i < m->count; i++) {
    assert(m->parts[i].id > keep_id);
    bool fired;
    int rc = session_absorb(ctx, s, keep_id, m->parts[i].id, &fired);
    if (rc)
      return rc;
    int64_t due = session_due(c, &m->parts[i], fired);
    *due_min = due < *due_min ? due : *due_min;
  }
  return window_add(ctx, s, keep_id, in);
}

/* Insert x into the first *count sessions, in start order. */
static int session_insert(window_instance *s, uint64_t *count,
                          const session *x) {
  int rc = session_reserve(s, *count + 1);
  if (rc)
    return rc;
  uint64_t at = *count;
  while (at > 0 && s->sessions[at - 1].start > x->start) {
    s->sessions[at] = s->sessions[at - 1];
    at--;
  }
  s->sessions[at] = *x;
  (*count)++;
  return 0;
}

static int session_process(sl_ctx *ctx, window_instance *s,
                           const sl_record *in) {
  const sl_window_config *c = &s->w->cfg;
  int64_t ts, wm;
  uint64_t key;
  int rc = record_begin(ctx, s->w, in, &ts, &key, &wm);
  if (rc)
    return rc;
  uint64_t n, next_id;
  rc = sessions_load(ctx, s, &n, &next_id);
  if (rc)
    return rc;
  /* Lateness is judged on the session the record would end up in (note 5,
   * as Flink's merging windows): a record inside an open session is not
   * late even if its own [ts, ts + gap) would be. */
  assert(sl_time_valid(ts) && sl_time_span_valid(c->gap)); /* no overflow */
  session probe = {.start = ts, .end = ts + c->gap};
  for (uint64_t i = 0; i < n; i++) {
    const session *x = &s->sessions[i];
    if (x->start < probe.end && probe.start < x->end) {
      probe.start = x->start < probe.start ? x->start : probe.start;
      probe.end = x->end > probe.end ? x->end : probe.end;
    }
  }
  if (wm != SL_WATERMARK_MIN &&
      cleanup_time(c, probe.end) <= wm)
    return late_record(ctx, s->w, in);
  /* Find the sessions the new one overlaps; merge them (note 4). */
  session_merge m = {.merged = {.start = ts, .end = ts + c->gap}};
  uint64_t out;
  rc = session_collect(ctx, s, n, &m, &out);
  if (rc)
    return rc;
  m.merged.id = m.count > 0 ? m.parts[0].id : next_id++;
  bool found;
  rc = header_load(ctx, s, m.merged.id, &found);
  if (rc)
    return rc;
  bool kept_fired = !found || ((window_header *)s->buffer)->fired;
  int64_t due_min;
  rc = session_fold(ctx, s, &m, kept_fired, in, &due_min);
  if (rc)
    return rc;
  rc = session_insert(s, &out, &m.merged);
  if (rc)
    return rc;
  window_header *h = (window_header *)s->buffer;
  bool due_now = wm != SL_WATERMARK_MIN && m.merged.end - 1 <= wm;
  if (due_now) {
    /* Already due (within the allowed lateness): fire now; the cleanup
     * timer still comes. */
    sl_window win = {.start = m.merged.start, .end = m.merged.end};
    rc = window_fire(ctx, s, key, m.merged.id, &win);
    if (rc)
      return rc;
  } else {
    h->fired = 0; /* it grew past the watermark: it will fire again */
  }
  if (c->domain == SL_PROCESSING_TIME)
    rc = session_timers(ctx, c, &m.merged, true);
  else if (m.count == 0 || due_min > session_due(c, &m.merged, due_now))
    rc = sl_timer_register(ctx, c->domain,
                           session_due(c, &m.merged, due_now));
  if (rc == 0)
    rc = header_store(ctx, s, m.merged.id);
  if (rc == 0)
    rc = sessions_store(ctx, s, out, next_id);
  return rc;
}

/* Session x at its key's timer `time` (note 6): fire it if its end - 1 is
 * due and it has not fired, and purge it (*dropped) once its lateness has
 * passed as well.  Otherwise *wake is when it next needs a timer. */
static int session_visit(sl_ctx *ctx, window_instance *s, uint64_t key,
                         const session *x, int64_t time, bool *dropped,
                         int64_t *wake) {
  const sl_window_config *c = &s->w->cfg;
  *dropped = false;
  *wake = x->end - 1;
  if (x->end - 1 > time)
    return 0; /* not due; if it fired, its cleanup is later still */
  bool found;
  int rc = header_load(ctx, s, x->id, &found);
  if (rc)
    return rc;
  window_header *h = (window_header *)s->buffer;
  bool fired_before = found && h->fired;
  if (found && !h->fired) {
    sl_window win = {.start = x->start, .end = x->end};
    rc = window_fire(ctx, s, key, x->id, &win);
    if (rc)
      return rc;
    assert(h->fired);
  }
  *wake = session_due(c, x, true);
  *dropped = c->allowed_lateness == 0 || *wake <= time;
  if (!found)
    return 0;
  if (*dropped)
    return window_purge(ctx, s, x->id, h->count);
  return fired_before ? 0 : header_store(ctx, s, x->id);
}

/* One visit of the first *n sessions of the key (s->sessions) at time:
 * the ones left are moved to the front, *n becomes their number and
 * *wake_min the earliest time one of them is due (note 6). */
static int session_pass(sl_ctx *ctx, window_instance *s, uint64_t key,
                        int64_t time, uint64_t *n, int64_t *wake_min) {
  uint64_t out = 0;
  int rc = 0;
  *wake_min = INT64_MAX;
  for (uint64_t i = 0; i < *n && rc == 0; i++) {
    session x = s->sessions[i];
    bool dropped;
    int64_t wake;
    rc = session_visit(ctx, s, key, &x, time, &dropped, &wake);
    if (rc || dropped)
      continue; /* dropped from the set */
    assert(wake > time);
    *wake_min = wake < *wake_min ? wake : *wake_min;
    s->sessions[out++] = x;
  }
  *n = out;
  return rc;
}

/* The key's timer at time (note 6).  In event time, when the earliest due
 * time of the sessions left is at or behind the watermark already (at the
 * end of input it always is) they are visited again at that time, here,
 * instead of through a timer re-armed only to fire at once: so a key costs
 * one firing and no timer entry put and deleted in one epoch (the final
 * checkpoint wrote each of those as a delete).  Results are stamped end - 1
 * all the same (window_fire); only their order among other keys' results
 * between two watermarks differs. */
static int session_timer(sl_ctx *ctx, window_instance *s, int64_t time) {
  const sl_window_config *c = &s->w->cfg;
  uint64_t key;
  int rc = sl_ctx_key(ctx, &key);
  if (rc)
    return rc;
  uint64_t n, left, next_id;
  rc = sessions_load(ctx, s, &n, &next_id);
  if (rc)
    return rc;
  int64_t watermark = sl_ctx_watermark(ctx), wake_min = time;
  left = n;
  /* Bounded: every pass after the first starts at the due time of a
   * session left, which it fires or purges, and a session is fired once
   * and purged once: at most 2n further passes. */
  for (uint64_t pass = 0; rc == 0 && left > 0 && pass <= 2 * n; pass++) {
    rc = session_pass(ctx, s, key, wake_min, &left, &wake_min);
    if (c->domain != SL_EVENT_TIME || wake_min > watermark)
      break;
  }
  if (rc)
    return rc;
  /* Event time: the sessions left wait for one timer, at the earliest
   * time one of them is due (note 6), which is past the watermark.
   * Processing time keeps a timer per session already. */
  if (left > 0 && c->domain == SL_EVENT_TIME) {
    assert(wake_min > watermark);
    rc = sl_timer_register(ctx, c->domain, wake_min);
  }
  if (rc == 0 && left != n)
    rc = sessions_store(ctx, s, left, next_id);
  return rc;
}

/* ----------------------------------------------------------- count windows */

/* Count windows with an incremental function: the state is updated in
 * place with one lookup (sl_state_update), and reset before the user's
 * emit runs on a copy of the accumulator, so emit may do anything. */
static int count_process_incremental(sl_ctx *ctx, window_instance *s,
                                     const sl_record *in) {
  const sl_window_config *c = &s->w->cfg;
  uint32_t need = 8 + header_bytes(s->w);
  void *v;
  int rc = sl_state_update(ctx, ID_COUNTER, need, s->count_template, &v);
  if (rc) {
    if (rc == EINVAL)
      sl_ctx_fail(ctx, "count window state has another size than %" PRIu32
                  " bytes (state from another window configuration?)", need);
    return rc;
  }
  uint8_t *p = v;
  window_header *h = (window_header *)(p + 8);
  uint8_t *acc = p + 8 + sizeof(window_header);
  c->add(c->user, acc, in);
  if (++h->count < (uint64_t)c->size)
    return 0;
  uint64_t base;
  memcpy(&base, p, 8);
  sl_window win = {.start = (int64_t)base,
                   .end = (int64_t)(base + (uint64_t)c->size)};
  memcpy(s->buffer, acc, c->acc_bytes);
  /* The next window starts empty. */
  base += (uint64_t)c->size;
  memcpy(p + 8, s->count_template + 8, need - 8);
  memcpy(p, &base, 8);
  uint64_t key;
  rc = sl_ctx_key(ctx, &key);
  if (rc)
    return rc;
  rc = c->emit(c->user, ctx, key, &win, s->buffer);
  if (rc != 0 && !ctx->cause[0]) /* any nonzero fails (runtime.c note 8) */
    sl_ctx_fail(ctx, "window function for key %" PRIu64 ", count window [%"
                PRId64 ", %" PRId64 ") returned %d", key, win.start, win.end,
                rc);
  return rc;
}

static int count_process(sl_ctx *ctx, window_instance *s, const sl_record *in) {
  const sl_window_config *c = &s->w->cfg;
  if (s->w->incremental)
    return count_process_incremental(ctx, s, in);
  /* One value state per key: [records seen before the open window]
   * [header][accumulator] (note 2), so a record costs one get and one put. */
  uint32_t need = 8 + header_bytes(s->w);
  int rc = grow(&s->buffer, &s->buffer_bytes, need);
  if (rc)
    return rc;
  const void *v;
  uint32_t bytes;
  rc = sl_state_get(ctx, ID_COUNTER, &v, &bytes);
  if (rc == 0) {
    if (bytes != need) {
      sl_ctx_fail(ctx, "count window state of %" PRIu32 " bytes, expected %"
                  PRIu32, bytes, need);
      return SL_ECORRUPT;
    }
    memcpy(s->buffer, v, need);
  } else if (rc == SL_ENOTFOUND) {
    memset(s->buffer, 0, need);
    if (s->w->incremental)
      c->init(c->user, s->buffer + 8 + sizeof(window_header));
  } else {
    return rc;
  }
  uint64_t base;
  memcpy(&base, s->buffer, 8);
  uint64_t size = (uint64_t)c->size;
  uint64_t index = base / size;
  /* window_add and window_fire work on s->buffer's header: shift the view
   * past the counter for them. */
  uint8_t *whole = s->buffer;
  s->buffer = whole + 8;
  rc = window_add(ctx, s, index, in);
  window_header *h = (window_header *)s->buffer;
  if (rc == 0 && h->count == size) {
    uint64_t key;
    rc = sl_ctx_key(ctx, &key);
    sl_window win = {.start = (int64_t)base, .end = (int64_t)(base + size)};
    if (rc == 0)
      rc = window_fire(ctx, s, key, index, &win);
    if (rc == 0 && !s->w->incremental)
      rc = window_purge_elements(ctx, index, h->count);
    /* The next window starts empty. */
    base += size;
    memset(h, 0, sizeof *h);
    if (s->w->incremental)
      c->init(c->user, s->buffer + sizeof(window_header));
  }
  s->buffer = whole;
  if (rc)
    return rc;
  memcpy(s->buffer, &base, 8);
  return sl_state_put(ctx, ID_COUNTER, s->buffer, need, 0);
}

/* ----------------------------------------------------------- callbacks */

static int window_open(sl_ctx *ctx, void *user, void **state) {
  (void)ctx;
  window_instance *s = calloc(1, sizeof *s);
  if (!s)
    return ENOMEM;
  s->w = user;
  if (s->w->cfg.type == SL_WINDOW_COUNT && s->w->incremental) {
    uint32_t need = 8 + header_bytes(s->w);
    s->count_template = calloc(1, need);
    if (!s->count_template ||
        grow(&s->buffer, &s->buffer_bytes, s->w->cfg.acc_bytes) != 0) {
      free(s->count_template);
      free(s->buffer);
      free(s);
      return ENOMEM;
    }
    s->w->cfg.init(s->w->cfg.user,
                   s->count_template + 8 + sizeof(window_header));
  }
  *state = s;
  return 0;
}

static void window_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  window_instance *s = state;
  if (!s)
    return;
  free(s->buffer);
  free(s->sessions);
  free(s->element);
  free(s->count_template);
  free(s);
}

/* A state call's failure gets a cause naming the window operator's step;
 * the status passes through unchanged (runtime.c note 8). */
static int fail_status(sl_ctx *ctx, int rc, const char *what) {
  if (rc > 0 || rc == SL_ENOTFOUND || rc == SL_ECORRUPT || rc == SL_EUSAGE) {
    if (!ctx->cause[0])
      sl_ctx_fail(ctx, "%s: %s", what, sl_strerror(rc));
  }
  return rc;
}

static int window_process_record(sl_ctx *ctx, void *state, int input,
                                 const sl_record *in) {
  (void)input;
  window_instance *s = state;
  int rc;
  switch (s->w->cfg.type) {
  case SL_WINDOW_COUNT:
    rc = count_process(ctx, s, in);
    break;
  case SL_WINDOW_SESSION:
    rc = session_process(ctx, s, in);
    break;
  default:
    rc = time_process(ctx, s, in);
    break;
  }
  return rc ? fail_status(ctx, rc, "window") : 0;
}

static int window_on_timer(sl_ctx *ctx, void *state, int domain,
                           int64_t time) {
  window_instance *s = state;
  if (domain != s->w->cfg.domain)
    return 0;
  int rc = s->w->cfg.type == SL_WINDOW_SESSION ? session_timer(ctx, s, time)
                                               : time_timer(ctx, s, time);
  return rc ? fail_status(ctx, rc, "window timer") : 0;
}

static int config_error(sl_job *job, const char *name, const char *what) {
  sl_job_set_error(job, "window '%s': %s", name ? name : "(null)", what);
  return EINVAL;
}

static int check_config(sl_job *job, const char *name,
                        const sl_window_config *c) {
  if (!c)
    return config_error(job, name, "config is NULL");
  if (c->type < SL_WINDOW_TUMBLING || c->type > SL_WINDOW_COUNT)
    return config_error(job, name, "type is not an sl_window_type");
  if (c->domain != SL_EVENT_TIME && c->domain != SL_PROCESSING_TIME)
    return config_error(job, name, "domain must be SL_EVENT_TIME or "
                                   "SL_PROCESSING_TIME");
  if (c->type != SL_WINDOW_SESSION && c->size <= 0)
    return config_error(job, name, "size must be > 0");
  /* Spans up to 2^61 keep every window bound of a valid time in range
   * (time_check.h note 2). */
  bool timed = c->type != SL_WINDOW_COUNT;
  if (timed && c->type != SL_WINDOW_SESSION && c->size > SL_TIME_SPAN_MAX)
    return config_error(job, name, "size must be at most SL_TIME_SPAN_MAX "
                                   "(2^61)");
  if (c->type == SL_WINDOW_SLIDING && (c->slide <= 0 || c->slide > c->size))
    return config_error(job, name, "slide must be in 1 .. size");
  if (c->type == SL_WINDOW_SESSION && c->gap <= 0)
    return config_error(job, name, "gap must be > 0");
  if (c->type == SL_WINDOW_SESSION && c->gap > SL_TIME_SPAN_MAX)
    return config_error(job, name, "gap must be at most SL_TIME_SPAN_MAX "
                                   "(2^61)");
  if (c->allowed_lateness < 0)
    return config_error(job, name, "allowed_lateness must be >= 0");
  if (c->allowed_lateness > SL_TIME_SPAN_MAX)
    return config_error(job, name, "allowed_lateness must be at most "
                                   "SL_TIME_SPAN_MAX (2^61)");
  if (c->allowed_lateness > 0 &&
      (c->domain != SL_EVENT_TIME || c->type == SL_WINDOW_COUNT))
    return config_error(job, name, "allowed_lateness applies to event-time "
                                   "windows only");
  if (c->late_port < 0 || c->late_port > SL_MAX_SIDE_OUTPUTS)
    return config_error(job, name, "late_port must be 0..SL_MAX_SIDE_OUTPUTS");
  bool incremental = c->add || c->init || c->emit || c->acc_bytes;
  if (incremental && c->process)
    return config_error(job, name, "give either an incremental aggregation "
                                   "(acc_bytes, init, add, emit) or a "
                                   "full-window process function, not both");
  if (!incremental && !c->process)
    return config_error(job, name, "no window function: set acc_bytes, "
                                   "init, add and emit, or process");
  if (incremental) {
    if (!c->init || !c->add || !c->emit)
      return config_error(job, name, "incremental aggregation needs init, "
                                     "add and emit");
    if (c->acc_bytes == 0 || c->acc_bytes > MAX_ACC_BYTES)
      return config_error(job, name, "acc_bytes must be 1 .. 65536");
    if (c->type == SL_WINDOW_SESSION && !c->merge)
      return config_error(job, name, "session windows with an incremental "
                                     "aggregation need merge");
  }
  return 0;
}

SL_EXPORT int sl_op_window_sized(sl_job *job, const char *name,
                                 sl_op *keyed_input, int parallelism,
                                 const sl_window_config *config, sl_op **op,
                                 size_t config_bytes) {
  if (op)
    *op = 0;
  if (!job)
    return EINVAL;
  sl_window_config copy;
  if (SL_CONFIG_READ(job, sl_op_window, sl_window_config, SL_WINDOW_CONFIG_V1,
                     config, config_bytes, &copy))
    return EINVAL;
  if (config)
    config = &copy;
  int rc = check_config(job, name, config);
  if (rc)
    return rc;
  if (keyed_input && keyed_input->kind != SL_OP_KEY_BY) {
    sl_job_set_error(job, "window '%s': its input '%s' is not keyed (put an "
                     "sl_op_key_by in front)", name ? name : "(null)",
                     keyed_input->name);
    return SL_EGRAPH;
  }
  window_op *w = calloc(1, sizeof *w);
  if (!w)
    return ENOMEM;
  w->cfg = *config;
  w->incremental = config->process == 0;
  sl_process_ops ops = {.open = window_open,
                        .process = window_process_record,
                        .close = window_close,
                        .on_timer = window_on_timer};
  rc = sl_op_process(job, name, &keyed_input, 1, parallelism, &ops, w, op);
  return op_adopt(rc, op, w, free);
}

/* The version-1 symbol (config_abi.c note 1): a program linked before the
 * sized call existed passed a version-1 struct. */
SL_EXPORT int(sl_op_window)(sl_job *job, const char *name, sl_op *keyed_input,
                            int parallelism, const sl_window_config *config,
                            sl_op **op) {
  return sl_op_window_sized(job, name, keyed_input, parallelism, config, op,
                            SL_WINDOW_CONFIG_V1);
}
