/* time_check.h — checked arithmetic on event times, one set of rules for
 * the engine (timer.c), the operators (window.c) and the Nexmark
 * queries.  Internal: not part of the public API.
 *
 * NOTES ON THE DESIGN
 *
 * 1. A valid event time lies in [SL_TIME_MIN_VALID, SL_TIME_MAX_VALID]
 *    (sluice.h): +-2^62, about 146 million years of milliseconds either
 *    side of the epoch.  The sources refuse anything else where it enters
 *    (file and line, or a dead letter); INT64_MIN is SL_NO_TIMESTAMP and
 *    INT64_MAX is SL_WATERMARK_MAX, so neither can be a record's time.
 * 2. Window sizes, slides, gaps and allowed lateness are at most
 *    SL_TIME_SPAN_MAX (2^61).  With a valid time t, a window holding t
 *    starts at or above t - SPAN + 1 and ends at or below t + SPAN, and
 *    its cleanup time end - 1 + lateness is at most 2^63 - 2: every
 *    bound is representable, and none equals SL_WATERMARK_MAX, which
 *    keeps its one meaning (end of input).  The _Static_asserts below
 *    hold that arithmetic.
 * 3. Code that gets a time from elsewhere (a user's sl_emit_ts, a
 *    restored state) still checks: sl_time_add/sl_time_sub return false
 *    on overflow and leave *out alone, and the caller refuses the record
 *    with an error naming the operator.  Nothing here wraps.
 * 4. Saturating forms are for watermarks only, where the ends of the
 *    range have a meaning: a watermark below every time is as good as
 *    SL_WATERMARK_MIN + 1, one above every time means "all is due".
 */
#ifndef SL_TIME_CHECK_H
#define SL_TIME_CHECK_H

#include <stdbool.h>
#include <stdint.h>

#include "sluice.h"

_Static_assert(SL_TIME_MIN_VALID > INT64_MIN && SL_TIME_MAX_VALID < INT64_MAX,
               "SL_NO_TIMESTAMP and SL_WATERMARK_MAX are never valid times");
_Static_assert(SL_TIME_MIN_VALID - SL_TIME_SPAN_MAX > INT64_MIN,
               "the earliest window start is representable (note 2)");
_Static_assert(SL_TIME_MAX_VALID - 1 <=
                   INT64_MAX - 2 * SL_TIME_SPAN_MAX - 1,
               "end - 1 + lateness of a valid time stays below "
               "SL_WATERMARK_MAX (note 2)");

/* Is t a valid event time (note 1)? */
static inline bool sl_time_valid(int64_t t) {
  return t >= SL_TIME_MIN_VALID && t <= SL_TIME_MAX_VALID;
}

/* Is d a valid span (size, slide, gap, lateness: 1 or 0 .. SPAN_MAX)? */
static inline bool sl_time_span_valid(int64_t d) {
  return d >= 0 && d <= SL_TIME_SPAN_MAX;
}

/* *out = a + b; false (and *out untouched) on overflow (note 3). */
static inline bool sl_time_add(int64_t a, int64_t b, int64_t *out) {
  int64_t sum;
  if (__builtin_add_overflow(a, b, &sum))
    return false;
  *out = sum;
  return true;
}

/* *out = a - b; false (and *out untouched) on overflow. */
static inline bool sl_time_sub(int64_t a, int64_t b, int64_t *out) {
  int64_t difference;
  if (__builtin_sub_overflow(a, b, &difference))
    return false;
  *out = difference;
  return true;
}

/* a + b clamped to [INT64_MIN, INT64_MAX] (note 4). */
static inline int64_t sl_time_add_sat(int64_t a, int64_t b) {
  int64_t sum;
  if (!__builtin_add_overflow(a, b, &sum))
    return sum;
  return b > 0 ? INT64_MAX : INT64_MIN;
}

/* a - b clamped to [INT64_MIN, INT64_MAX] (note 4). */
static inline int64_t sl_time_sub_sat(int64_t a, int64_t b) {
  int64_t difference;
  if (!__builtin_sub_overflow(a, b, &difference))
    return difference;
  return b > 0 ? INT64_MIN : INT64_MAX;
}

/* The window of size size (> 0) aligned to the epoch that holds t:
 * [*start, *end) with *start = t - (t mod size), the modulo taken towards
 * minus infinity.  false (outputs untouched) if a bound overflows. */
static inline bool sl_time_window(int64_t t, int64_t size, int64_t *start,
                                  int64_t *end) {
  if (size <= 0)
    return false;
  int64_t m = t % size; /* no overflow: size > 0, so size != -1 */
  int64_t s;
  if (!sl_time_sub(t, m < 0 ? m + size : m, &s))
    return false;
  int64_t e;
  if (!sl_time_add(s, size, &e))
    return false;
  *start = s;
  *end = e;
  return true;
}

#endif
