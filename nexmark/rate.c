/* rate.c — the rate limit of the Nexmark generator's source instances
 * (rate.h; generator.c note 7). */
#include <assert.h>
#include <stdint.h>
#include <time.h>

#include "rate.h"

__extension__ typedef unsigned __int128 u128;

static uint64_t monotonic_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

uint64_t nx_rate_due(sl_ctx *ctx, nx_rate *r, uint64_t rate, uint64_t wanted,
                     uint64_t burst_max, uint64_t sleep_max_ns) {
  assert(burst_max > 0);
  assert(sleep_max_ns < 1000000000ull); /* one nanosleep, tv_sec 0 */
  if (rate == 0)
    return wanted;
  uint64_t now = monotonic_ns();
  if (r->anchor_ns == 0) {
    r->anchor_ns = now;
    r->anchor_emitted = 0;
  }
  uint64_t allowed =
      (uint64_t)((u128)(now - r->anchor_ns) * rate / 1000000000u);
  if (allowed > r->anchor_emitted + burst_max) {
    r->anchor_ns = now; /* behind by more than burst_max: no burst */
    r->anchor_emitted = 0;
    return wanted < burst_max ? wanted : burst_max;
  }
  if (allowed > r->anchor_emitted) {
    uint64_t due = allowed - r->anchor_emitted;
    return due < wanted ? due : wanted;
  }
  if (sl_ctx_stopping(ctx))
    return 0;
  /* When the next event is due: anchor + (emitted + 1) / rate seconds. */
  uint64_t due_ns = r->anchor_ns +
                    (uint64_t)(((u128)(r->anchor_emitted + 1) * 1000000000u +
                                rate - 1) / rate);
  uint64_t wait_ns = due_ns > now ? due_ns - now : 0;
  if (wait_ns > sleep_max_ns)
    wait_ns = sleep_max_ns;
  struct timespec t = {.tv_sec = 0, .tv_nsec = (long)wait_ns};
  nanosleep(&t, NULL); /* EINTR: a shorter sleep; the next call sleeps */
  return 0;
}
