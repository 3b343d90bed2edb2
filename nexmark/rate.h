/* rate.h — private to nexmark/: pacing a source instance to a rate of
 * events per second (generator.c note 7).  A schedule is anchored at the
 * first call; when nothing is due the caller's thread sleeps until the
 * next event is, at most sleep_max_ns per call, and the call returns 0, so
 * stops and barriers are never held up and nothing spins.  After a stall
 * the schedule is anchored again: at most burst_max events are due at
 * once.  (operators/generator.c paces its source the same way, with a copy
 * of this logic; the two are to be joined into one shared helper.) */
#ifndef SLUICE_NEXMARK_RATE_H
#define SLUICE_NEXMARK_RATE_H

#include <stdint.h>

#include "sluice.h"

typedef struct nx_rate {
  uint64_t anchor_ns;      /* 0: not anchored yet */
  uint64_t anchor_emitted; /* since the anchor; the caller adds each event */
} nx_rate;

/* Events the rate (per second; 0: no limit) lets this call emit, at most
 * wanted; 0 after a sleep of at most sleep_max_ns when none is due yet, or
 * at once when ctx is stopping. */
uint64_t nx_rate_due(sl_ctx *ctx, nx_rate *r, uint64_t rate, uint64_t wanted,
                     uint64_t burst_max, uint64_t sleep_max_ns);

#endif /* SLUICE_NEXMARK_RATE_H */
