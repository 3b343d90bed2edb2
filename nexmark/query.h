/* query.h — private to nexmark/: what the query files share.  The queries
 * q0-q5, q7, q8 and q11 are sluice jobs built on the public API only
 * (sluice.h), one file each (q0.c ... q11.c), each builder opening with
 * the query's SQL (after the Nexmark suite's) and how its operators map
 * onto it.  queries.c holds the table of queries, format.c their result
 * records as CSV lines, ties.c the window-maximum process q5 and q7 use,
 * query_shared.c the state helpers below that are too large to inline.
 *
 * NOTES ON THE DESIGN
 *
 * 1. Every query starts with one operator that reads the events, drops the
 *    kinds it does not need and projects what it keeps into a small struct
 *    (fixed-size, except the names, cities and states q3 and q8 carry).
 *    The keyed edges behind it, one ring per pair of instances, then carry
 *    a few bytes per record instead of a whole event.  A query that needs
 *    two kinds uses a process operator that sends the second kind to side
 *    output port 1, so the events are read once.
 * 2. Fields are read straight from the nx_record (type and integers), after
 *    a check that the record's size covers them; nx_decode() runs only for
 *    the persons whose strings a query keeps.  A malformed record fails the
 *    job, naming the operator.
 * 3. Windows are [start, end) in ms with start = ts - (ts mod size), the
 *    modulo taken towards minus infinity.  The windowed process operators
 *    written here (q5's counts and maxima, q7's maxima, q8's join) fire
 *    with an event-time timer at end - 1, as sl_op_window does, and drop
 *    and count as late (SL_COUNT_LATE) a record whose windows have all
 *    fired already.
 * 4. A window result emitted from a timer at end - 1 carries that stamp and
 *    leaves before the watermark that fired it: a second stage keyed by the
 *    window (q5, q7) has all the window's results when its own timer at
 *    end - 1 fires, since its watermark is the minimum over every upstream
 *    instance.
 * 5. Each process operator numbers its state ids from 1, except where a
 *    state changed its layout: q5.count_buckets (id 2) and
 *    q4.winning_buckets (3, 4) keep per-bucket arrays (their files say
 *    why) under ids their per-auction states never used.  Their operators
 *    were renamed with the change (from q5.count and q4.winning), so a
 *    checkpoint of the per-auction layout is refused as another job graph
 *    (store.h note 4) instead of restoring into state nobody reads.
 *    Pointers from state calls are used only until the next state call
 *    (sl_emit is not one), and values are copied out with memcpy: list
 *    items are only 4-byte aligned.
 * 6. Callbacks return 0 or the failing code as it came (any nonzero return
 *    fails the job: sluice.h, CALLBACK RETURNS); failed() first puts the
 *    cause in the job's message.
 * 7. Result records are the *_row structs below; nx_query_format() checks a
 *    record's size against its query before it reads it.
 * 8. Times.  Every time a query computes from comes through time_of(): a
 *    time outside SL_TIME_MIN_VALID .. SL_TIME_MAX_VALID fails the job,
 *    naming the operator (the event parser refuses those already, with
 *    file and line; this catches a generator configured past them).  A
 *    valid time plus or minus a window size of seconds stays far inside
 *    int64, and timer times are checked with sl_time_add before use, so
 *    no bound wraps and no timer is ever re-armed into the past (a
 *    wrapped one was due at once, forever, at the final watermark).
 */

#ifndef SLUICE_NEXMARK_QUERY_H
#define SLUICE_NEXMARK_QUERY_H

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "nexmark.h"
#include "sluice.h"
#include "time_check.h" /* the library's checked time arithmetic (note 8) */

#define WINDOW_TUMBLE_MS 10000 /* q7, q8 */

/* ------------------------------------------------------------------------ */
/* Records between the operators, and the results. */

/* q0, q1 result (q1: price in thousandths, i.e. price * 908), and the bid
 * q7 keeps. */
typedef struct bid_row {
  int64_t auction, bidder, price, date_time;
} bid_row;

typedef struct q2_row {
  int64_t auction, price;
} q2_row;

/* q3: a person as projected (id = person id) and, with the same layout, a
 * result (id = auction id).  Followed by name, city and state bytes. */
typedef struct q3_row {
  int64_t id;
  uint16_t name_len, city_len, state_len, pad;
} q3_row;

typedef struct q4_row {
  int64_t category, avg_thousandths;
} q4_row;

/* q5 result and the record its second stage maximises: one auction's bid
 * count in one window. */
typedef struct q5_row {
  int64_t start, end, auction, count;
} q5_row;

typedef struct q7_row {
  int64_t start, end;
  bid_row bid;
} q7_row;

/* q8 result; followed by the name bytes. */
typedef struct q8_row {
  int64_t start, end, id;
  uint32_t name_len, pad;
} q8_row;

typedef struct q11_row {
  int64_t bidder, start, end, count;
} q11_row;

_Static_assert(sizeof(q3_row) == 16, "q3 rows: 16-byte head, then text");
_Static_assert(sizeof(q8_row) == 32, "q8 rows: 32-byte head, then name");

/* ------------------------------------------------------------------------ */
/* The builders (queries.c's table): each adds its query behind `events`,
 * with parallelism p, and sets *result to the operator of its rows. */

int nxq_build_q0(sl_job *job, sl_op *events, int p, sl_op **result);
int nxq_build_q1(sl_job *job, sl_op *events, int p, sl_op **result);
int nxq_build_q2(sl_job *job, sl_op *events, int p, sl_op **result);
int nxq_build_q3(sl_job *job, sl_op *events, int p, sl_op **result);
int nxq_build_q4(sl_job *job, sl_op *events, int p, sl_op **result);
int nxq_build_q5(sl_job *job, sl_op *events, int p, sl_op **result);
int nxq_build_q7(sl_job *job, sl_op *events, int p, sl_op **result);
int nxq_build_q8(sl_job *job, sl_op *events, int p, sl_op **result);
int nxq_build_q11(sl_job *job, sl_op *events, int p, sl_op **result);

/* q0's flat_map: bids become bid_rows, the rest is dropped (q7 reuses it). */
int nxq_q0_project(void *user, const sl_record *in, sl_ctx *ctx);

/* ------------------------------------------------------------------------ */
/* Helpers shared by the queries. */

static const uint32_t kind_integers[3] = {2, 7, 4};

/* The event in `in` when its fixed part (head and integers) is all there,
 * else NULL. */
static inline const nx_record *event_of(const sl_record *in) {
  if (in->size_bytes < sizeof(nx_record))
    return NULL;
  const nx_record *r = in->data;
  if (r->type > NX_BID ||
      in->size_bytes < sizeof(nx_record) + 8u * kind_integers[r->type])
    return NULL;
  return r;
}

static inline int malformed(sl_ctx *ctx, const sl_record *in) {
  sl_ctx_fail(ctx, "malformed record of %u bytes", (unsigned)in->size_bytes);
  return -EINVAL;
}

/* rc as a callback's return (note 6): 0, or rc with the cause recorded. */
static inline int failed(sl_ctx *ctx, int rc, const char *what) {
  if (rc == 0 || rc == SL_ESTOPPED)
    return rc;
  sl_ctx_fail(ctx, "%s: %s", what, sl_strerror(rc));
  return rc;
}

static inline int64_t window_start(int64_t ts, int64_t size) {
  assert(size > 0 && size <= SL_TIME_SPAN_MAX && sl_time_valid(ts));
  int64_t start = 0, end = 0; /* set by sl_time_window; 0 quiets -O3 */
  bool ok = sl_time_window(ts, size, &start, &end);
  assert(ok); /* a valid time's window fits (time_check.h note 2) */
  (void)ok;
  (void)end;
  return start;
}

/* ts if it is a valid time (note 8); else the job fails, naming the
 * operator and the field, and *rc is set. */
static inline bool time_of(sl_ctx *ctx, int64_t ts, const char *what,
                           int *rc) {
  if (sl_time_valid(ts))
    return true;
  sl_ctx_fail(ctx, "%s %lld is outside the valid event times %lld .. %lld",
              what, (long long)ts, (long long)SL_TIME_MIN_VALID,
              (long long)SL_TIME_MAX_VALID);
  *rc = -ERANGE;
  return false;
}

/* The end of the window that fires at timer time `time`: time + 1, or
 * false when that overflows (no window of a valid time ends there). */
static inline bool end_of_timer(int64_t time, int64_t *end) {
  return sl_time_add(time, 1, end);
}

/* A record for a window whose timer (end - 1) has fired is late (note 3):
 * count it, and the caller drops it. */
static inline bool window_late(sl_ctx *ctx, int64_t end) {
  if (end - 1 > sl_ctx_watermark(ctx))
    return false;
  sl_ctx_count(ctx, SL_COUNT_LATE, 1);
  return true;
}

/* Growable per-instance memory for the rare rebuild of a list state. */
typedef struct scratch {
  uint8_t *bytes;
  uint32_t capacity;
} scratch;

/* An instance's scratch as its state (open), freed at close; reserve grows
 * it to at least bytes, returning ENOMEM (and keeping it) when it cannot. */
int nxq_scratch_open(sl_ctx *ctx, void *user, void **state);
void nxq_scratch_close(sl_ctx *ctx, void *state);
int nxq_scratch_reserve(scratch *s, uint32_t bytes);

typedef bool (*keep_fn)(const void *item, uint32_t item_bytes, int64_t arg);

/* Keep only the items of list state id for which keep() holds.  The list
 * is rebuilt (from a copy in s) only when some but not all items stay. */
int nxq_list_retain(sl_ctx *ctx, scratch *s, uint16_t id, keep_fn keep,
                    int64_t arg);

/* Sorted arrays of 16-byte {time, value} pairs in a value state (q4's
 * waiting bids, q5's panes): the pair at i, insertion, and dropping a
 * prefix.  A put may free the version a state pointer points into, so
 * the new array is built in the instance's scratch first. */
typedef struct time_pair {
  int64_t time, value;
} time_pair;

static inline time_pair pair_at(const void *array, uint32_t i) {
  time_pair p;
  memcpy(&p, (const char *)array + (size_t)i * sizeof p, sizeof p);
  return p;
}

/* The index where time belongs in array (n pairs), searching from the
 * end since times come mostly in order; *found if it is there already
 * (then at is its index). */
static inline uint32_t pair_find(const void *array, uint32_t n, int64_t time,
                                 bool *found) {
  uint32_t at = n;
  while (at > 0 && pair_at(array, at - 1).time > time) /* at most n */
    at--;
  *found = at > 0 && pair_at(array, at - 1).time == time;
  return *found ? at - 1 : at;
}

/* Add 1 to (or raise to at least, when raise) the value of pair at of
 * state id, in place. */
static inline int pair_update(sl_ctx *ctx, uint16_t id, uint32_t bytes,
                              uint32_t at, int64_t value, bool raise) {
  void *stored;
  int rc = sl_state_update(ctx, id, bytes, NULL, &stored);
  if (rc)
    return rc;
  char *slot = (char *)stored + (size_t)at * sizeof(time_pair) + 8;
  int64_t v;
  memcpy(&v, slot, sizeof v);
  v = raise ? (value > v ? value : v) : v + value;
  memcpy(slot, &v, sizeof v);
  return 0;
}

/* Puts value id as the array (bytes long, of cells of cell_bytes) with
 * cell put in at index at, built in the scratch (a put may free what
 * array points into). */
int nxq_cell_insert(sl_ctx *ctx, scratch *s, uint16_t id, const void *array,
                    uint32_t bytes, uint32_t at, const void *cell,
                    uint32_t cell_bytes);

int nxq_pair_insert(sl_ctx *ctx, scratch *s, uint16_t id, const void *array,
                    uint32_t bytes, uint32_t at, time_pair fresh);

int nxq_pair_drop(sl_ctx *ctx, scratch *s, uint16_t id, const void *array,
                  uint32_t bytes, uint32_t drop);

/* The flat_map of q5 and q11: each bid becomes one of its integers, the
 * index (NX_BID_AUCTION, NX_BID_BIDDER, ...) being the user pointer; the
 * rest is dropped.  nxq_first_integer is the key of such a projection. */
int nxq_bid_field(void *user, const sl_record *in, sl_ctx *ctx);
uint64_t nxq_first_integer(void *user, const sl_record *in);

/* ------------------------------------------------------------------------ */
/* The largest value of each window and every item that has it (ties.c). */

typedef struct ties_spec {
  uint32_t item_bytes;                      /* at most 64 */
  int64_t (*value)(const void *item);       /* what is maximised */
  int64_t (*item_time)(const void *item);   /* checked first (note 8);
                                               NULL: checked upstream */
  int64_t (*window_end)(const void *item);  /* the item's window */
  int (*emit)(sl_ctx *ctx, const void *item, int64_t end); /* one winner */
} ties_spec;

/* The process operator; its user pointer is a ties_spec. */
extern const sl_process_ops nxq_ties_ops;

#endif /* SLUICE_NEXMARK_QUERY_H */
