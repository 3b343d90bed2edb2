/* ring_wait.h — the spin-then-park waits of wait.h's protocol, for the
 * ring tests' producer and consumer threads (test_ring.c and the plain-C
 * tsan_ring_stress.c share them). */
#ifndef SL_TEST_RING_WAIT_H
#define SL_TEST_RING_WAIT_H

#include <stdbool.h>
#include <stdint.h>

#include "ring.h"
#include "wait.h"

/* The waiting protocol of wait.h, step by step: try; spin spin_limit times
 * re-trying; then announce parking (prepare), try once more — a waker that
 * published after that try is guaranteed to see PARKED — and sleep until
 * woken.  attempt() is the condition and, for a producer, also the action
 * (it appends when there is room). */
typedef bool (*attempt_fn)(void *context);

static void wait_until(attempt_fn attempt, void *context, sl_parker *self,
                       unsigned spin_limit) {
  for (uint64_t spins = 0; !attempt(context); spins++) {
    if (spins < spin_limit) {
      sl_cpu_relax();
      continue;
    }
    sl_parker_prepare(self);
    if (attempt(context)) {
      sl_parker_cancel(self);
      return;
    }
    sl_parker_sleep(self);
  }
}

typedef struct append_attempt {
  sl_ring *ring;
  uint32_t record_bytes;
  unsigned flags;
  uint8_t *slot; /* the result */
} append_attempt;

static bool try_append(void *context) {
  append_attempt *a = context;
  a->slot = sl_ring_append_record_producer(a->ring, a->record_bytes, a->flags);
  return a->slot != 0;
}

typedef struct control_attempt {
  sl_ring *ring;
  unsigned kind;
  uint64_t value;
} control_attempt;

static bool try_control(void *context) {
  control_attempt *a = context;
  return sl_ring_write_control_producer(a->ring, a->kind, a->value);
}

static bool has_data(void *ring) { return sl_ring_readable_consumer(ring) > 0; }

/* Producer: append a record, waiting for room.  Before it waits it
 * publishes with force, so the consumer sees everything and is woken if
 * parked (ring.h note 8) — otherwise both sides could wait for each other. */
static uint8_t *append_waiting(sl_ring *r, sl_parker *self, unsigned spin_limit,
                               uint32_t record_bytes, unsigned flags) {
  uint8_t *slot = sl_ring_append_record_producer(r, record_bytes, flags);
  if (slot)
    return slot;
  sl_ring_publish_producer(r, true);
  append_attempt a = {r, record_bytes, flags, 0};
  wait_until(try_append, &a, self, spin_limit);
  return a.slot;
}

static void control_waiting(sl_ring *r, sl_parker *self, unsigned spin_limit,
                            unsigned kind, uint64_t value) {
  if (sl_ring_write_control_producer(r, kind, value))
    return;
  sl_ring_publish_producer(r, true);
  control_attempt a = {r, kind, value};
  wait_until(try_control, &a, self, spin_limit);
}

/* Consumer: wait until something is readable.  Before it waits it returns
 * the space it read, not forced: a parked producer left the ring more than
 * half full, so the consumer passed a (rate-limited) wake check with a
 * quarter free before it ran dry (ring.h note 8); the tests exercise that. */
static void wait_readable(sl_ring *r, sl_parker *self, unsigned spin_limit) {
  if (sl_ring_readable_consumer(r) > 0)
    return;
  sl_ring_release_consumer(r, false);
  wait_until(has_data, r, self, spin_limit);
}

#endif /* SL_TEST_RING_WAIT_H */
