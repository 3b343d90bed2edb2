/* join_internal.h — what the three joins of two keyed streams share:
 * windowed (join_window.c, Flink's window join), interval
 * (join_interval.c, Flink's interval join) and unbounded
 * (join_unbounded.c, an insert-only SQL inner join).  Private to them;
 * the operator shell (open, close, checks, building) is join_common.c.
 *
 * NOTES ON THE DESIGN
 *
 * 1. Each join is a keyed process operator with two inputs (0 = left,
 *    1 = right), built on the public API: what it buffers is keyed state
 *    (map and value state) and event-time timers (timer.c), so it is
 *    checkpointed and restored with the job and nothing lives outside the
 *    state between two records.  The state ids 0xFE00 .. 0xFEFF are the
 *    operator's (all listed below, so they stay distinct); a join
 *    function must not make state calls (sluice_join.h).  A stored
 *    element's value is [timestamp: i64][record bytes], never empty, and
 *    its record bytes sit 8 bytes into the state's 8-aligned value, so
 *    they are handed to the join function in place.
 * 2. Stamps.  sl_emit stamps with the timestamp of the record being
 *    processed (ctx->current): in a timer that is the timer's time
 *    (end - 1 of the window firing).  To stamp the pairs emitted while
 *    processing a record (max(a.ts, b.ts) for the interval join, end - 1
 *    for a fired window) the join function runs with ctx->current pointing
 *    at a copy of the record carrying that timestamp; the key was already
 *    computed, so state calls are not affected.  An interval join's stamp
 *    is never behind the watermark it forwards (neither record was late);
 *    pairs of a late arrival in a fired window are, like window.c's late
 *    firings.
 * 3. Return codes: one contract, the engine's (sluice.h).  Every function
 *    of the joins returns 0 or the code that failed, unchanged: a state
 *    call's (positive errno or SL_E*), the join function's (any nonzero
 *    value) or the join's own (positive errno, as the library's).  The
 *    record and timer callbacks hand it to the engine as it is, and any
 *    nonzero status fails the job with it; join_status and fail_status
 *    only add a cause naming what failed when none was set.  SL_ESTOPPED
 *    (the job is stopping) passes without a cause.
 */
#ifndef SLUICE_JOIN_INTERNAL_H
#define SLUICE_JOIN_INTERNAL_H

#include <inttypes.h>
#include <string.h>

#include "internal.h"
#include "op_util.h"

enum {
  ID_WINDOW_HEADER = 0xFE01,
  ID_WINDOW_ELEMENT = 0xFE02,
  ID_INTERVAL_DIRECTORY = 0xFE10, /* + side */
  ID_INTERVAL_BUCKET = 0xFE12,    /* + side */
  ID_INTERVAL_ELEMENT = 0xFE14,   /* + side */
  ID_UNBOUNDED_COUNTS = 0xFE20,
  ID_UNBOUNDED_ELEMENT = 0xFE21, /* + side */
};

enum { LEFT = 0, RIGHT = 1 };

#define ELEMENT_TS_BYTES 8u

__extension__ typedef __int128 wide; /* exact sums of two int64 values */

/* The operator's configuration (the user pointer of the process op). */
typedef struct join_op join_op;
typedef struct join_instance join_instance;

/* A join's record and timer callbacks (join_build). */
typedef int (*join_process_fn)(sl_ctx *ctx, join_instance *s, int side,
                               const sl_record *in);
typedef int (*join_timer_fn)(sl_ctx *ctx, join_instance *s, int64_t time);

struct join_op {
  join_process_fn process;          /* set by join_build */
  join_timer_fn timer;              /* set by join_build; NULL: none */
  sl_window_join_config window;     /* window join */
  sl_interval_join_config interval; /* interval join */
  sl_join_fn join;                  /* unbounded join */
  void *user;                       /* unbounded join */
  int late_port[2]; /* per side; 0: drop */
  int64_t bucket_width;             /* interval join, resolved */
};

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

/* {timestamp, count} of the interval join index (join_interval.c
 * note 2). */
typedef struct ts_entry {
  int64_t ts;
  uint32_t count;
  uint32_t unused; /* zero */
} ts_entry;
_Static_assert(sizeof(ts_entry) == 16, "index entries are stored as is");

/* Per instance: working buffers, reused from record to record. */
struct join_instance {
  const join_op *j;
  uint8_t *element; /* element value being stored */
  uint64_t element_capacity;
  element_batch sides[2];     /* window join */
  int64_t *directory; /* a copy of one side's directory */
  uint64_t directory_capacity;
  ts_entry *bucket; /* a copy of one bucket */
  uint64_t bucket_capacity;
  ts_entry *matches; /* probe: the matching timestamps */
  uint64_t match_capacity;
};

/* ----------------------------------------------------------- helpers */

/* *buffer holds at least need units of unit bytes: 0, EINVAL beyond 2 GiB
 * (above any state value, whose limit is 1 GiB) or ENOMEM (the buffer
 * unchanged). */
static inline int join_grow(void **buffer, uint64_t *capacity, uint64_t need,
                            size_t unit) {
  return op_grow(buffer, capacity, need, unit, 1ull << 31);
}

/* v clamped to the int64 range. */
static inline int64_t saturate(wide v) {
  return v > INT64_MAX ? INT64_MAX : v < INT64_MIN ? INT64_MIN : (int64_t)v;
}

/* v with the sign bit flipped: big-endian keys of negative times sort. */
static inline uint64_t flip(int64_t v) { return (uint64_t)v ^ (1ull << 63); }

/* The element value [ts][bytes] of in (note 1), built in the instance
 * buffer. */
static inline int element_value(join_instance *s, const sl_record *in,
                                uint32_t *bytes) {
  uint64_t need = ELEMENT_TS_BYTES + in->size_bytes;
  int rc = join_grow((void **)&s->element, &s->element_capacity, need, 1);
  if (rc)
    return rc;
  memcpy(s->element, &in->timestamp, ELEMENT_TS_BYTES);
  if (in->size_bytes)
    memcpy(s->element + ELEMENT_TS_BYTES, in->data, in->size_bytes);
  *bytes = (uint32_t)need;
  return 0;
}

/* A stored element value as a record (pointing into the value). */
static inline int element_record(const void *value, uint32_t bytes,
                                 sl_record *out) {
  if (bytes < ELEMENT_TS_BYTES)
    return SL_ECORRUPT;
  memcpy(&out->timestamp, value, ELEMENT_TS_BYTES);
  out->data = (const uint8_t *)value + ELEMENT_TS_BYTES;
  out->size_bytes = bytes - ELEMENT_TS_BYTES;
  return 0;
}

/* The join function's status, unchanged (note 3), with a cause. */
static inline int join_status(sl_ctx *ctx, int rc, uint64_t key) {
  if (rc == 0 || rc == SL_ESTOPPED)
    return rc;
  if (!ctx->cause[0])
    sl_ctx_fail(ctx, "join function returned %d for key %" PRIu64, rc, key);
  return rc;
}

/* A state, engine or join error, unchanged (note 3), with a cause
 * naming what failed. */
static inline int fail_status(sl_ctx *ctx, int rc, const char *what) {
  if (rc == 0 || rc == SL_ESTOPPED)
    return rc;
  if (!ctx->cause[0])
    sl_ctx_fail(ctx, "%s: %s", what, sl_strerror(rc));
  return rc;
}

/* What an event-time join needs of a record first: its event time, its
 * key and the watermark before it (to judge lateness).  0, or EINVAL (job
 * failed) for a record without a timestamp. */
int join_record_begin(sl_ctx *ctx, const sl_record *in, int64_t *ts,
                      uint64_t *key, int64_t *watermark);

/* A late record of side: counted, and sent to the side's late port. */
int join_late_record(sl_ctx *ctx, const join_op *j, int side,
                     const sl_record *in);

/* ----------------------------------------------------------- building */

/* Fail the build: "what 'name': text" as the job's error; EINVAL. */
int join_config_error(sl_job *job, const char *what, const char *name,
                      const char *text);

/* A late port of the config: 0 .. SL_MAX_SIDE_OUTPUTS, or EINVAL. */
int join_check_port(sl_job *job, const char *what, const char *name,
                    int port, const char *field);

/* Validate the keyed inputs and build the operator, whose callbacks run
 * process for each record and timer (NULL: none) for each event-time
 * timer; owns j (freed on error). */
int join_build(sl_job *job, const char *what, const char *name, sl_op *left,
               sl_op *right, int parallelism, join_op *j,
               join_process_fn process, join_timer_fn timer, sl_op **op);

#endif
