/* rate.h — the rate limiter of sources that emit a set number of events
 * per second: the generator source (generator.c) and the Nexmark
 * generator.  Header only (inline), so a caller outside libsluice's
 * objects can use it too.
 *
 * NOTES ON THE DESIGN
 *
 * 1. A schedule anchored at the first call: by time t the source may have
 *    emitted (t - anchor) * rate events.  The caller asks how many of the
 *    events it wants are due (rate_due), emits them and reports how many
 *    it did (rate_emitted); an event it could not emit stays owed.
 * 2. When nothing is due, rate_due sleeps until the next event is, at
 *    most sleep_max_ns, and returns 0, so the engine checks for stop and
 *    checkpoints between sleeps; it never spins.  A stopping job gets 0
 *    without a sleep.
 * 3. After a stall (more than burst_max events due) the schedule is
 *    anchored again at now and at most burst_max events are due at once:
 *    no long burst at an unlimited rate to catch up.
 */
#ifndef SLUICE_RATE_H
#define SLUICE_RATE_H

#include <assert.h>
#include <stdint.h>
#include <time.h>

#include "sluice.h"

typedef struct rate_limiter {
  uint64_t events_per_second; /* 0: no limit */
  uint64_t burst_max;         /* note 3; > 0 */
  uint64_t sleep_max_ns;      /* note 2; below one second */
  uint64_t anchor_ns;         /* 0: not anchored yet */
  uint64_t anchor_emitted;    /* events emitted since the anchor */
} rate_limiter;

/* A limiter of events_per_second (0: none), not anchored yet. */
static inline rate_limiter rate_limiter_make(uint64_t events_per_second,
                                             uint64_t burst_max,
                                             uint64_t sleep_max_ns) {
  /* burst_max 0 would return 0 forever without sleeping: a spin; one
   * nanosleep takes tv_nsec below a second. */
  assert(burst_max > 0 && sleep_max_ns < 1000000000u);
  return (rate_limiter){.events_per_second = events_per_second,
                        .burst_max = burst_max,
                        .sleep_max_ns = sleep_max_ns};
}

static inline uint64_t rate_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* How many of wanted events are due now (note 1): at most wanted, and at
 * most burst_max after a stall (note 3); 0 after a sleep of at most
 * sleep_max_ns, or at once when the job is stopping (note 2). */
static inline uint64_t rate_due(rate_limiter *r, sl_ctx *ctx,
                                uint64_t wanted) {
  __extension__ typedef unsigned __int128 rate_u128;
  uint64_t rate = r->events_per_second;
  if (rate == 0)
    return wanted;
  uint64_t now = rate_now_ns();
  if (r->anchor_ns == 0) {
    r->anchor_ns = now;
    r->anchor_emitted = 0;
  }
  uint64_t allowed =
      (uint64_t)((rate_u128)(now - r->anchor_ns) * rate / 1000000000u);
  if (allowed > r->anchor_emitted + r->burst_max) {
    /* Behind schedule by more than a burst: forget the rest (note 3). */
    r->anchor_ns = now;
    r->anchor_emitted = 0;
    return wanted < r->burst_max ? wanted : r->burst_max;
  }
  if (allowed > r->anchor_emitted) {
    uint64_t due = allowed - r->anchor_emitted;
    return due < wanted ? due : wanted;
  }
  if (sl_ctx_stopping(ctx))
    return 0;
  /* When the next event is due: anchor + (emitted + 1) / rate seconds. */
  uint64_t due_ns =
      r->anchor_ns +
      (uint64_t)(((rate_u128)(r->anchor_emitted + 1) * 1000000000u + rate -
                  1) / rate);
  uint64_t wait_ns = due_ns > now ? due_ns - now : 0;
  if (wait_ns > r->sleep_max_ns)
    wait_ns = r->sleep_max_ns;
  struct timespec t = {.tv_sec = 0, .tv_nsec = (long)wait_ns};
  nanosleep(&t, 0); /* EINTR: a shorter sleep, the next call sleeps again */
  return 0;
}

/* n events were emitted (of those rate_due allowed). */
static inline void rate_emitted(rate_limiter *r, uint64_t n) {
  r->anchor_emitted += n;
}

#endif
