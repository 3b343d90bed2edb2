/* wait.c — futex sleep and wake for sl_parker (see wait.h). */
#include "wait.h"

#include <assert.h>
#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static long futex(_Atomic uint32_t *word, int op, uint32_t value,
                  const struct timespec *timeout) {
  return syscall(SYS_futex, (uint32_t *)word, op, value, timeout, NULL, 0);
}

void sl_parker_sleep(sl_parker *p) {
  /* wait.h, Polling: a nudge does not wake a POLLING owner, so only a
   * sleep with a timeout may follow prepare_polling. */
  assert(atomic_load_explicit(&p->state, memory_order_relaxed) !=
         SL_PARKER_POLLING);
  p->sleeps++;
  /* FUTEX_WAIT returns at once (EAGAIN) if a waker already reset the state
   * between our prepare and this call, which is what makes the protocol
   * free of lost wake-ups.  EINTR and spurious returns are fine: the caller
   * loops and re-checks. */
  long rc = futex(&p->state, FUTEX_WAIT_PRIVATE, SL_PARKER_PARKED, NULL);
  assert(rc == 0 || errno == EAGAIN || errno == EINTR);
  (void)rc;
  atomic_store_explicit(&p->state, SL_PARKER_RUNNING, memory_order_relaxed);
}

void sl_parker_sleep_ns(sl_parker *p, uint64_t timeout_ns) {
  p->sleeps++;
  /* A relative timeout: returning early or late is harmless, the caller
   * re-checks its deadlines. */
  struct timespec t = {.tv_sec = (time_t)(timeout_ns / 1000000000u),
                       .tv_nsec = (long)(timeout_ns % 1000000000u)};
  /* PARKED or POLLING, as the owner prepared; RUNNING if a waker came
   * first: then no sleep (FUTEX_WAIT would wait for RUNNING to change).
   * A wake after this load changes the word, and FUTEX_WAIT returns at
   * once as above. */
  uint32_t prepared = atomic_load_explicit(&p->state, memory_order_relaxed);
  if (prepared != SL_PARKER_RUNNING) {
    long rc = futex(&p->state, FUTEX_WAIT_PRIVATE, prepared, &t);
    assert(rc == 0 || errno == EAGAIN || errno == EINTR ||
           errno == ETIMEDOUT);
    (void)rc;
  }
  atomic_store_explicit(&p->state, SL_PARKER_RUNNING, memory_order_relaxed);
}

void sl_parker_wake_slow(sl_parker *p, uint32_t state) {
  /* Only the waker that flips PARKED (or POLLING) -> RUNNING issues the
   * system call; concurrent wakers of the same parker skip it. */
  uint32_t expected = state;
  if (atomic_compare_exchange_strong_explicit(
          &p->state, &expected, SL_PARKER_RUNNING, memory_order_seq_cst,
          memory_order_relaxed))
    futex(&p->state, FUTEX_WAKE_PRIVATE, 1, NULL);
}
