/* wait.h — bounded spinning, then parking on a futex (DESIGN.md invariant 7).
 *
 * Every thread that may wait owns one sl_parker.  A waiter publishes "I am
 * about to sleep", re-checks its condition, and only then sleeps; a waker
 * publishes its change, then looks at the parker and wakes only if the owner
 * is parked.  Both sides separate their store from their load with a
 * sequentially consistent fence, so at least one of them sees the other's
 * store (Dekker): either the waiter sees the change and does not sleep, or
 * the waker sees the parked flag and wakes it.  No wake-up is lost.
 *
 *   call                        who may call it
 *   --------------------------  -------------------------------------------
 *   sl_parker_prepare/_cancel    the owner only
 *   sl_parker_prepare_polling    the owner only, before sl_parker_sleep_ns
 *   sl_parker_sleep              the owner only, after prepare
 *   sl_parker_wake               any thread, after publishing its change
 *   sl_parker_nudge              any thread, after publishing a change the
 *                                owner may take up to its timeout to see
 *   sl_cpu_relax                 anyone
 *
 * Waiting protocol of an owner (wait_until and wait_loop in runtime.c):
 *
 *     for (spins = 0; !ready(); spins++) {
 *         if (spins < limit) { sl_cpu_relax(); continue; }
 *         sl_parker_prepare(p);            // state = PARKED; full fence
 *         if (ready()) { sl_parker_cancel(p); break; }
 *         sl_parker_sleep(p);              // futex wait while PARKED
 *     }
 *
 * Polling.  A wake that finds its owner parked is a system call, and on
 * this project's 2-CPU VMs one costs the waker 30-50 us (a futex wake of a
 * thread on the other CPU; uprobes on sl_parker_wake_slow, latency_bench,
 * 2026-12-07).  An owner that will look again soon anyway can say so: it
 * prepares with sl_parker_prepare_polling (state POLLING) and sleeps with a
 * timeout.  sl_parker_wake wakes a POLLING owner as a PARKED one;
 * sl_parker_nudge leaves it to its timeout.  So a nudge is never lost
 * either, only seen up to one timeout late: the owner re-checks its
 * condition after every sleep.  The coordinator polls this way while it
 * waits for acks, which instances nudge (coordinator.c note 16).
 */
#ifndef SL_WAIT_H
#define SL_WAIT_H

#include <stdatomic.h>
#include <stdint.h>

#define SL_PARKER_RUNNING 0u
#define SL_PARKER_PARKED 1u
#define SL_PARKER_POLLING 2u /* parked, and looks again by itself soon */

typedef struct sl_parker {
  _Atomic uint32_t state; /* SL_PARKER_RUNNING, _PARKED or _POLLING */
  uint64_t sleeps;        /* owner-only: calls of sl_parker_sleep (some
                             return at once: a wake came first) */
} sl_parker;

static inline void sl_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#else
  atomic_signal_fence(memory_order_seq_cst);
#endif
}

static inline void sl_parker_init(sl_parker *p) {
  atomic_init(&p->state, SL_PARKER_RUNNING);
  p->sleeps = 0;
}

/* Announce the intention to sleep.  The fence orders the PARKED store before
 * the owner's re-check of its condition: a waker that published its change
 * after our re-check read it must see PARKED. */
#if defined(__SANITIZE_THREAD__)
#define SL_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SL_TSAN 1
#endif
#endif

static inline void sl_parker_announce(sl_parker *p, uint32_t state) {
#ifdef SL_TSAN
  /* ThreadSanitizer does not model stand-alone fences; a sequentially
   * consistent exchange orders the same way and lets it check us. */
  atomic_exchange_explicit(&p->state, state, memory_order_seq_cst);
#else
  atomic_store_explicit(&p->state, state, memory_order_relaxed);
  atomic_thread_fence(memory_order_seq_cst);
#endif
}

static inline void sl_parker_prepare(sl_parker *p) {
  sl_parker_announce(p, SL_PARKER_PARKED);
}

/* As sl_parker_prepare, for a sleep with a timeout after which the owner
 * looks again anyway: nudges (sl_parker_nudge) do not wake it (Polling,
 * above). */
static inline void sl_parker_prepare_polling(sl_parker *p) {
  sl_parker_announce(p, SL_PARKER_POLLING);
}

/* The condition became true during prepare: no sleep.  A waker may already
 * have reset the state; storing RUNNING again is harmless. */
static inline void sl_parker_cancel(sl_parker *p) {
  atomic_store_explicit(&p->state, SL_PARKER_RUNNING, memory_order_relaxed);
}

/* Sleep until a waker resets the state (returns at once if one already did).
 * Spurious returns are allowed; the caller re-checks its condition. */
void sl_parker_sleep(sl_parker *p);

/* sl_parker_sleep, but for at most timeout_ns nanoseconds. */
void sl_parker_sleep_ns(sl_parker *p, uint64_t timeout_ns);

/* Slow path of sl_parker_wake and _nudge: the owner was seen in state
 * (PARKED or POLLING), so wake it. */
void sl_parker_wake_slow(sl_parker *p, uint32_t state);

/* The owner's state, read after the fence that orders the caller's
 * publication before it (the other half of the Dekker pair with
 * sl_parker_prepare). */
static inline uint32_t sl_parker_look(sl_parker *p) {
#ifdef SL_TSAN
  /* A read-modify-write that changes nothing, for TSan (see prepare). */
  return atomic_fetch_add_explicit(&p->state, 0, memory_order_seq_cst);
#else
  atomic_thread_fence(memory_order_seq_cst);
  return atomic_load_explicit(&p->state, memory_order_relaxed);
#endif
}

/* Wake p's owner if it is parked or polling.  Call after publishing the
 * change the owner waits for. */
static inline void sl_parker_wake(sl_parker *p) {
  uint32_t state = sl_parker_look(p);
  if (state != SL_PARKER_RUNNING)
    sl_parker_wake_slow(p, state);
}

/* Wake p's owner if it is parked, but not if it is polling: it will see the
 * change after its timeout (Polling, above). */
static inline void sl_parker_nudge(sl_parker *p) {
  if (sl_parker_look(p) == SL_PARKER_PARKED)
    sl_parker_wake_slow(p, SL_PARKER_PARKED);
}

#endif /* SL_WAIT_H */
