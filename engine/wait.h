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
 *   sl_parker_sleep              the owner only, after prepare
 *   sl_parker_wake               any thread, after publishing its change
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
 */
#ifndef SL_WAIT_H
#define SL_WAIT_H

#include <stdatomic.h>
#include <stdint.h>

#define SL_PARKER_RUNNING 0u
#define SL_PARKER_PARKED 1u

typedef struct sl_parker {
  _Atomic uint32_t state; /* SL_PARKER_RUNNING or SL_PARKER_PARKED */
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

static inline void sl_parker_prepare(sl_parker *p) {
#ifdef SL_TSAN
  /* ThreadSanitizer does not model stand-alone fences; a sequentially
   * consistent exchange orders the same way and lets it check us. */
  atomic_exchange_explicit(&p->state, SL_PARKER_PARKED, memory_order_seq_cst);
#else
  atomic_store_explicit(&p->state, SL_PARKER_PARKED, memory_order_relaxed);
  atomic_thread_fence(memory_order_seq_cst);
#endif
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

/* Slow path of sl_parker_wake: the owner is parked, so wake it. */
void sl_parker_wake_slow(sl_parker *p);

/* Wake p's owner if it is parked.  Call after publishing the change the owner
 * waits for.  The fence orders that publication before our read of the
 * state (the other half of the Dekker pair with sl_parker_prepare). */
static inline void sl_parker_wake(sl_parker *p) {
#ifdef SL_TSAN
  /* A read-modify-write that changes nothing, for TSan (see prepare). */
  if (atomic_fetch_add_explicit(&p->state, 0, memory_order_seq_cst) ==
      SL_PARKER_PARKED)
    sl_parker_wake_slow(p);
#else
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(&p->state, memory_order_relaxed) ==
      SL_PARKER_PARKED)
    sl_parker_wake_slow(p);
#endif
}

#endif /* SL_WAIT_H */
