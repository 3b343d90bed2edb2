/* test_util.h — small helpers shared by the Criterion tests of sluice:
 * the SLUICE_TEST_SCALE divisor, a monotonic clock, sleeping, and a
 * watchdog thread that turns a hung job into a clear failure.
 *
 * Everything is static (header-only) so each test executable gets its own
 * copy; nothing here calls Criterion, so the helpers may run on any thread.
 * It also brings in fixtures.h (the shared pieces of test jobs, compiled
 * once into a library), so one include gives a suite both.
 */
#ifndef SL_TEST_UTIL_H
#define SL_TEST_UTIL_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "fixtures.h" /* the shared job pieces; linked from fixtures.c */
#include "sluice.h"

/* ------------------------------------------------------------ scaling */

/* SLUICE_TEST_SCALE=n divides record counts by n (sanitizer builds set 10);
 * unset, empty, 0 or garbage mean 1. */
static inline uint64_t sl_test_scale(void) {
  const char *text = getenv("SLUICE_TEST_SCALE");
  if (!text || !*text)
    return 1;
  unsigned long long scale = strtoull(text, 0, 10);
  return scale >= 1 ? (uint64_t)scale : 1;
}

/* count divided by the scale, but never below floor (so a test keeps enough
 * records to mean something under heavy scaling). */
static inline uint64_t sl_test_scaled(uint64_t count, uint64_t floor) {
  uint64_t n = count / sl_test_scale();
  return n > floor ? n : floor;
}

/* ------------------------------------------------------------ time */

static inline double sl_test_now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static inline void sl_test_sleep_us(uint64_t us) {
  struct timespec t = {.tv_sec = (time_t)(us / 1000000u),
                       .tv_nsec = (long)(us % 1000000u) * 1000L};
  while (nanosleep(&t, &t) != 0 && errno == EINTR) {
  }
}

/* ------------------------------------------------------------ watchdog */

/* A thread that waits timeout_s seconds for sl_test_watchdog_disarm().  If
 * that does not come it marks itself fired, prints what it was guarding
 * and calls sl_job_stop(job), so a hung job ends (as SL_ESTOPPED or a
 * failure) and the test fails on `fired` instead of blocking until
 * Criterion's own timeout kills it.  With job NULL it aborts instead. */
typedef struct sl_test_watchdog {
  pthread_t thread;
  pthread_mutex_t mutex;
  pthread_cond_t cond;
  bool disarmed; /* under mutex */
  atomic_bool fired;
  double timeout_s;
  sl_job *job;
  const char *what;
} sl_test_watchdog;

static void *sl_test_watchdog_main(void *arg) {
  sl_test_watchdog *w = arg;
  struct timespec deadline;
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  double whole = (double)(time_t)w->timeout_s;
  deadline.tv_sec += (time_t)w->timeout_s;
  deadline.tv_nsec += (long)((w->timeout_s - whole) * 1e9);
  if (deadline.tv_nsec >= 1000000000L) {
    deadline.tv_sec++;
    deadline.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&w->mutex);
  int rc = 0;
  while (!w->disarmed && rc != ETIMEDOUT)
    rc = pthread_cond_timedwait(&w->cond, &w->mutex, &deadline);
  bool fire = !w->disarmed;
  pthread_mutex_unlock(&w->mutex);
  if (fire) {
    atomic_store(&w->fired, true);
    fprintf(stderr, "watchdog: %s did not finish within %.1f s\n", w->what,
            w->timeout_s);
    if (!w->job)
      abort();
    sl_job_stop(w->job);
  }
  return 0;
}

/* Start guarding job (may be NULL) for timeout_s seconds.  Returns 0 or the
 * pthread error. */
static inline int sl_test_watchdog_arm(sl_test_watchdog *w, sl_job *job,
                                       double timeout_s, const char *what) {
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC); /* the deadline's clock */
  pthread_cond_init(&w->cond, &attr);
  pthread_condattr_destroy(&attr);
  pthread_mutex_init(&w->mutex, 0);
  w->disarmed = false;
  atomic_init(&w->fired, false);
  w->timeout_s = timeout_s;
  w->job = job;
  w->what = what;
  return pthread_create(&w->thread, 0, sl_test_watchdog_main, w);
}

/* Stop guarding and join the thread.  Returns true if the watchdog fired. */
static inline bool sl_test_watchdog_disarm(sl_test_watchdog *w) {
  pthread_mutex_lock(&w->mutex);
  w->disarmed = true;
  pthread_cond_signal(&w->cond);
  pthread_mutex_unlock(&w->mutex);
  pthread_join(w->thread, 0);
  pthread_cond_destroy(&w->cond);
  pthread_mutex_destroy(&w->mutex);
  return atomic_load(&w->fired);
}

/* ------------------------------------------------------------ stopper */

/* A thread that calls sl_job_stop(job) after delay_us and records when. */
typedef struct sl_test_stopper {
  pthread_t thread;
  sl_job *job;
  uint64_t delay_us;
  _Atomic double stopped_at_s; /* sl_test_now_s() right before the stop */
} sl_test_stopper;

static void *sl_test_stopper_main(void *arg) {
  sl_test_stopper *s = arg;
  sl_test_sleep_us(s->delay_us);
  atomic_store(&s->stopped_at_s, sl_test_now_s());
  sl_job_stop(s->job);
  return 0;
}

static inline int sl_test_stopper_start(sl_test_stopper *s, sl_job *job,
                                        uint64_t delay_us) {
  s->job = job;
  s->delay_us = delay_us;
  atomic_init(&s->stopped_at_s, 0.0);
  return pthread_create(&s->thread, 0, sl_test_stopper_main, s);
}

/* Join; returns the time the stop was issued. */
static inline double sl_test_stopper_join(sl_test_stopper *s) {
  pthread_join(s->thread, 0);
  return atomic_load(&s->stopped_at_s);
}

#endif /* SL_TEST_UTIL_H */
