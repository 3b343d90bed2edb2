/* test_latency.c — what leaves a job at once instead of on a timer
 * (issue 20, part 1), checked by conditions, never by timing:
 *
 * - flush on idle: one record pushed into an idle job reaches the sink
 *   through a map, with no further input and the buffer timeout set to
 *   over an hour, so only the publish of a partial batch when the input
 *   runs dry (runtime.c note 2) can deliver it;
 * - watermarks when they advance (timer.c note 2), with the watermark
 *   interval set to an hour: a trickle of pushes closes an event-time
 *   window while the job runs (the push source says it caught up before
 *   it waits), and so does a source whose next() finds nothing to emit.
 *
 * Each test waits for its condition with a generous bound (WAIT_S) and
 * fails if the bound passes: on the code before these rules, the record
 * or the window result would only come after the hour-long timer or at
 * the end of input, which the tests only cause after the check.
 */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "sluice.h"
#include "sluice_embed.h"
#include "sluice_window.h"
#include "test_util.h"

#define WAIT_S 60.0                  /* generous: the condition, not speed */
#define HOUR_MS 3600000u             /* an interval no test outlives */
#define HOUR_US 3600000000u          /* the buffer timeout of the flush test */
#define WINDOW_SIZE 100              /* event-time units */

/* What the sinks saw.  Written by the sink's thread, read by the test's. */
typedef struct seen {
  _Atomic uint64_t records;
  _Atomic int64_t first_window_end; /* window tests: the first result's */
  _Atomic uint64_t first_count;     /* ... and its record count */
} seen;

/* Wait until *counter is at least want; false if WAIT_S passed first. */
static bool wait_for(_Atomic uint64_t *counter, uint64_t want) {
  double deadline = sl_test_now_s() + WAIT_S;
  while (atomic_load(counter) < want) {
    if (sl_test_now_s() > deadline)
      return false;
    sl_test_sleep_us(200);
  }
  return true;
}

/* ------------------------------------------------------ flush on idle */

static int plus_one(void *user, const sl_record *in, void *out,
                    uint32_t *out_size_bytes) {
  (void)user;
  uint64_t v;
  memcpy(&v, in->data, sizeof v);
  v++;
  memcpy(out, &v, sizeof v);
  *out_size_bytes = sizeof v;
  return 0;
}

static int count_record(void *user, int instance, const sl_record *rec) {
  (void)instance;
  seen *s = user;
  uint64_t v;
  if (rec->size_bytes != sizeof v)
    return EINVAL;
  memcpy(&v, rec->data, sizeof v);
  if (v != 42)
    return EINVAL; /* 41 pushed, plus one */
  atomic_fetch_add(&s->records, 1);
  return 0;
}

Test(flush, a_single_record_reaches_the_sink_without_more_input) {
  sl_job_config config = SL_JOB_CONFIG_INIT;
  config.buffer_timeout_us = HOUR_US; /* no timed flush within the test */
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  sl_op *src, *map, *sink;
  sl_push *push;
  seen s = {0};
  cr_assert_eq(sl_source_push(job, "push", 0, &src, &push), 0);
  cr_assert_eq(sl_op_map(job, "plus", src, 1, sizeof(uint64_t), plus_one, 0,
                         &map), 0);
  cr_assert_eq(sl_sink_callback(job, "sink", map, 1, count_record, &s,
                                &sink), 0);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  uint64_t v = 41;
  cr_assert_eq(sl_push_record(push, &v, sizeof v, SL_NO_TIMESTAMP), 0);
  /* Nothing else is pushed until the record has arrived. */
  bool arrived = wait_for(&s.records, 1);
  sl_push_close(push);
  int rc = sl_job_wait(job);
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  sl_job_destroy(job);
  cr_assert(arrived, "the record did not reach the sink within %.0f s "
            "without more input", WAIT_S);
  cr_assert_eq(atomic_load(&s.records), 1);
}

/* ------------------------------------------- watermarks when they advance */

typedef struct event {
  uint64_t key;
  int64_t ts;
} event;

static uint64_t event_key(void *user, const sl_record *in) {
  (void)user;
  event e;
  memcpy(&e, in->data, sizeof e);
  return e.key;
}

static void count_init(void *user, void *acc) {
  (void)user;
  memset(acc, 0, sizeof(uint64_t));
}

static void count_add(void *user, void *acc, const sl_record *in) {
  (void)user;
  (void)in;
  uint64_t n;
  memcpy(&n, acc, sizeof n);
  n++;
  memcpy(acc, &n, sizeof n);
}

typedef struct window_result {
  int64_t end;
  uint64_t count;
} window_result;

static int count_emit(void *user, sl_ctx *ctx, uint64_t key,
                      const sl_window *window, const void *acc) {
  (void)user;
  (void)key;
  window_result r = {.end = window->end};
  memcpy(&r.count, acc, sizeof r.count);
  return sl_emit(ctx, &r, sizeof r);
}

static int note_result(void *user, int instance, const sl_record *rec) {
  (void)instance;
  seen *s = user;
  window_result r;
  if (rec->size_bytes != sizeof r)
    return EINVAL;
  memcpy(&r, rec->data, sizeof r);
  if (atomic_load(&s->records) == 0) { /* one sink thread: no race */
    atomic_store(&s->first_window_end, r.end);
    atomic_store(&s->first_count, r.count);
  }
  atomic_fetch_add(&s->records, 1); /* last: the fields above are set */
  return 0;
}

/* src (watermarks every HOUR_MS, ordered input) -> key_by -> tumbling
 * event-time count window of WINDOW_SIZE -> callback sink into s. */
static sl_job *window_job(sl_op **src_out, const sl_source_ops *ops,
                          void *user, sl_push **push, seen *s) {
  sl_job *job;
  cr_assert_eq(sl_job_create(NULL, &job), 0);
  sl_op *src, *keyed, *win, *sink;
  if (push)
    cr_assert_eq(sl_source_push(job, "push", 0, &src, push), 0);
  else
    cr_assert_eq(sl_op_source(job, "src", 1, ops, user, &src), 0);
  sl_watermark_config wc = {.out_of_orderness = 0, .interval_ms = HOUR_MS};
  cr_assert_eq(sl_op_watermarks(src, &wc), 0);
  cr_assert_eq(sl_op_key_by(job, "by-key", src, event_key, 0, &keyed), 0);
  sl_window_config w = {.type = SL_WINDOW_TUMBLING,
                        .domain = SL_EVENT_TIME,
                        .size = WINDOW_SIZE,
                        .acc_bytes = sizeof(uint64_t),
                        .init = count_init,
                        .add = count_add,
                        .emit = count_emit};
  cr_assert_eq(sl_op_window(job, "win", keyed, 1, &w, &win), 0, "%s",
               sl_job_error(job));
  cr_assert_eq(sl_sink_callback(job, "sink", win, 1, note_result, s, &sink),
               0);
  *src_out = src;
  return job;
}

/* The first result is [0, 100)'s, of its two records, and it arrived
 * while the job ran. */
static void assert_first_window(seen *s, bool arrived) {
  cr_assert(arrived, "no window result within %.0f s of the watermark "
            "passing its end (the interval is an hour)", WAIT_S);
  cr_assert_eq(atomic_load(&s->first_window_end), WINDOW_SIZE);
  cr_assert_eq(atomic_load(&s->first_count), 2);
}

Test(watermark, a_trickle_of_pushes_closes_a_window_without_the_interval) {
  seen s = {0};
  sl_op *src;
  sl_push *push;
  sl_job *job = window_job(&src, 0, 0, &push, &s);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  /* One push at a time, each emitted before the next is pushed (the
   * source reports its records as emitted): every push is a trickle. */
  const int64_t times[] = {10, 60, 150};
  for (size_t i = 0; i < sizeof times / sizeof times[0]; i++) {
    event e = {.key = 7, .ts = times[i]};
    cr_assert_eq(sl_push_record(push, &e, sizeof e, e.ts), 0);
    sl_op_stats st;
    double deadline = sl_test_now_s() + WAIT_S;
    do {
      cr_assert_eq(sl_job_stats(job, 0, &st), 0);
      cr_assert(sl_test_now_s() < deadline, "push %zu was not emitted", i);
      sl_test_sleep_us(200);
    } while (st.records_out < i + 1);
  }
  /* W = 149 passed the end of [0, 100): its result leaves now. */
  bool arrived = wait_for(&s.records, 1);
  uint64_t before_end = atomic_load(&s.records);
  sl_push_close(push);
  int rc = sl_job_wait(job);
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  sl_job_destroy(job);
  assert_first_window(&s, arrived);
  cr_assert_eq(before_end, 1, "only [0, 100) was due before the end");
  cr_assert_eq(atomic_load(&s.records), 2, "[100, 200) at the end");
}

/* A source that emits one event per call from script, then finds nothing
 * (returns 0 without emitting) until the test sets done. */
typedef struct script_source {
  const int64_t *times;
  size_t count;
  size_t next;
  _Atomic int done;
} script_source;

static int script_next(sl_ctx *ctx, void *state) {
  script_source *src = state;
  if (atomic_load(&src->done))
    return SL_SOURCE_END;
  if (src->next == src->count) {
    sl_test_sleep_us(100); /* nothing to emit: do not hog the CPU */
    return 0;
  }
  event e = {.key = 3, .ts = src->times[src->next++]};
  return sl_emit_ts(ctx, &e, sizeof e, e.ts);
}

Test(watermark, a_source_that_finds_nothing_sends_its_watermark) {
  static const int64_t times[] = {10, 60, 150};
  script_source src_state = {.times = times, .count = 3};
  static const sl_source_ops ops = {.next = script_next};
  seen s = {0};
  sl_op *src;
  sl_job *job = window_job(&src, &ops, &src_state, 0, &s);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  bool arrived = wait_for(&s.records, 1);
  uint64_t before_end = atomic_load(&s.records);
  atomic_store(&src_state.done, 1);
  int rc = sl_job_wait(job);
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  sl_job_destroy(job);
  assert_first_window(&s, arrived);
  cr_assert_eq(before_end, 1, "only [0, 100) was due before the end");
  cr_assert_eq(atomic_load(&s.records), 2, "[100, 200) at the end");
}
