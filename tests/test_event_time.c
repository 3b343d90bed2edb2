/* test_event_time.c — watermarks (periodic, through operators, minimum of
 * inputs, idle inputs, the final one), processing-time timers, side
 * outputs, and the errors of those calls. */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sluice.h"
#include "test_util.h"

typedef struct stamped {
  uint64_t key;
  int64_t ts;
} stamped;

/* ----------------------------------------------------------- sources */

/* A source of `count` records with ts = base + i, batch records per call,
 * sleeping pause_us after each call.  While `wait_for` is set and 0 it
 * holds back its end (idles) after emitting. */
#define WAIT_FOR_LIMIT_S 60.0

typedef struct clock_source {
  int64_t base;
  uint64_t count;
  uint32_t batch;
  uint64_t pause_us;
  uint64_t end_pause_us; /* quiet time after the last record, before END */
  _Atomic int *wait_for;  /* end only once *wait_for != 0 (or after
                             WAIT_FOR_LIMIT_S, so a condition that never
                             comes fails the test's asserts, not its
                             timeout) */
  double waiting_since_s;
  _Atomic int *start_after; /* emit nothing until *start_after != 0 ... */
  uint64_t start_delay_us;  /* ... and this long after */
  _Atomic int *done;      /* set when it ends */
  _Atomic int64_t emitted_max;
  uint64_t i;
} clock_source;

static int cs_next(sl_ctx *ctx, void *state) {
  clock_source *s = state;
  if (s->start_after) {
    if (!atomic_load(s->start_after)) {
      sl_test_sleep_us(1000); /* idle: nothing to emit yet */
      return 0;
    }
    sl_test_sleep_us(s->start_delay_us);
    s->start_after = 0;
  }
  if (s->i == s->count && s->end_pause_us) {
    /* The records went out when the previous call returned. */
    sl_test_sleep_us(s->end_pause_us);
    s->end_pause_us = 0;
  }
  for (uint32_t k = 0; k < s->batch && s->i < s->count; k++, s->i++) {
    stamped r = {.key = s->i % 7, .ts = s->base + (int64_t)s->i};
    atomic_store(&s->emitted_max, r.ts);
    int rc = sl_emit_ts(ctx, &r, sizeof r, r.ts);
    if (rc)
      return rc;
  }
  if (s->pause_us)
    sl_test_sleep_us(s->pause_us);
  if (s->i < s->count || s->end_pause_us)
    return 0;
  if (s->wait_for && !atomic_load(s->wait_for)) {
    if (s->waiting_since_s == 0)
      s->waiting_since_s = sl_test_now_s();
    if (sl_test_now_s() - s->waiting_since_s < WAIT_FOR_LIMIT_S) {
      sl_test_sleep_us(1000); /* idle: nothing to emit */
      return 0;
    }
  }
  if (s->done)
    atomic_store(s->done, 1);
  return SL_SOURCE_END;
}

static const sl_source_ops cs_ops = {.next = cs_next};

/* ----------------------------------------------------------- observer */

/* A process operator (1 or 2 inputs) that records what it sees. */
typedef struct observer {
  _Atomic int64_t last_watermark;
  _Atomic uint64_t watermark_calls;
  _Atomic int went_backwards;
  _Atomic int ahead_of_sources; /* a watermark above what was emitted */
  clock_source *sources[2];
  int source_count;
  uint64_t bound;
  _Atomic int *idle_probe_done; /* while 0, track max watermark below */
  _Atomic int64_t max_watermark_before_done;
  _Atomic uint64_t records;
  _Atomic int record_not_ahead; /* a record's ts <= the watermark */
} observer;

static int obs_process(sl_ctx *ctx, void *state, int input,
                       const sl_record *in) {
  (void)input;
  observer *o = state;
  atomic_fetch_add(&o->records, 1);
  int64_t wm = sl_ctx_watermark(ctx);
  if (o->bound && wm != SL_WATERMARK_MIN && in->timestamp <= wm)
    atomic_store(&o->record_not_ahead, 1);
  return sl_emit(ctx, in->data, in->size_bytes);
}

static int obs_watermark(sl_ctx *ctx, void *state, int64_t wm) {
  (void)ctx;
  observer *o = state;
  atomic_fetch_add(&o->watermark_calls, 1);
  if (wm <= atomic_load(&o->last_watermark))
    atomic_store(&o->went_backwards, 1);
  atomic_store(&o->last_watermark, wm);
  if (wm != SL_WATERMARK_MAX) {
    /* It may not pass what every live source has emitted, minus bound. */
    int64_t low = INT64_MAX;
    for (int i = 0; i < o->source_count; i++) {
      if (o->sources[i]->done && atomic_load(o->sources[i]->done))
        continue;
      int64_t m = atomic_load(&o->sources[i]->emitted_max);
      if (m < low)
        low = m;
    }
    if (!o->idle_probe_done && low != INT64_MAX &&
        wm > low - (int64_t)o->bound - 1)
      atomic_store(&o->ahead_of_sources, 1);
  }
  if (o->idle_probe_done && !atomic_load(o->idle_probe_done) &&
      wm != SL_WATERMARK_MAX &&
      wm > atomic_load(&o->max_watermark_before_done))
    atomic_store(&o->max_watermark_before_done, wm);
  return 0;
}

static int discard(sl_ctx *ctx, void *state, int input, const sl_record *in) {
  (void)ctx;
  (void)state;
  (void)input;
  (void)in;
  return 0;
}

static const sl_process_ops obs_ops = {.process = obs_process,
                                       .on_watermark = obs_watermark};
static const sl_process_ops discard_ops = {.process = discard};

static void observer_init(observer *o) {
  memset(o, 0, sizeof *o);
  atomic_store(&o->last_watermark, SL_WATERMARK_MIN);
  atomic_store(&o->max_watermark_before_done, SL_WATERMARK_MIN);
}

static uint64_t stamped_key(void *user, const sl_record *in) {
  (void)user;
  return ((const stamped *)in->data)->key;
}

/* ----------------------------------------------------------- tests */

static int passthrough(void *user, const sl_record *in, void *out,
                       uint32_t *out_size) {
  (void)user;
  memcpy(out, in->data, in->size_bytes);
  *out_size = in->size_bytes;
  return 0;
}

Test(watermarks, periodic_through_a_map_never_ahead_and_end_with_max) {
  sl_job *job;
  cr_assert_eq(sl_job_create(0, &job), 0);
  clock_source src = {.base = 1000, .count = 200000, .batch = 500,
                      .pause_us = 200};
  observer o;
  observer_init(&o);
  o.sources[0] = &src;
  o.source_count = 1;
  o.bound = 10;
  sl_op *s, *m, *p, *out;
  cr_assert_eq(sl_op_source(job, "src", 1, &cs_ops, &src, &s), 0);
  sl_watermark_config wc = {.out_of_orderness = 10, .interval_ms = 1};
  cr_assert_eq(sl_op_watermarks(s, &wc), 0);
  cr_assert_eq(sl_op_map(job, "map", s, 1, sizeof(stamped), passthrough, 0,
                         &m),
               0);
  cr_assert_eq(sl_op_process(job, "obs", &m, 1, 1, &obs_ops, &o, &p), 0);
  cr_assert_eq(sl_op_sink(job, "out", p, 1, &discard_ops, 0, &out), 0);
  cr_assert_eq(sl_job_run(job), 0, "%s", sl_job_error(job));
  cr_assert_eq(atomic_load(&o.records), 200000);
  cr_assert_gt(atomic_load(&o.watermark_calls), 5,
               "periodic watermarks reached the operator (%" PRIu64 ")",
               atomic_load(&o.watermark_calls));
  cr_assert_eq(atomic_load(&o.went_backwards), 0);
  cr_assert_eq(atomic_load(&o.ahead_of_sources), 0);
  cr_assert_eq(atomic_load(&o.record_not_ahead), 0,
               "ordered records are never behind the watermark");
  cr_assert_eq(atomic_load(&o.last_watermark), SL_WATERMARK_MAX,
               "the final watermark");
  sl_op_stats st;
  cr_assert_eq(sl_job_stats(job, 2, &st), 0);
  cr_assert_str_eq(st.name, "obs");
  cr_assert_eq(st.watermark, SL_WATERMARK_MAX);
  sl_job_destroy(job);
}

/* Two sources with distant timestamps: the watermark follows the slower. */
Test(watermarks, minimum_of_two_inputs) {
  sl_job *job;
  cr_assert_eq(sl_job_create(0, &job), 0);
  _Atomic int a_done = 0, b_done = 0;
  clock_source a = {.base = 0, .count = 100000, .batch = 200,
                    .pause_us = 100, .done = &a_done};
  clock_source b = {.base = 1000000000, .count = 100000, .batch = 200,
                    .pause_us = 100, .done = &b_done};
  observer o;
  observer_init(&o);
  o.sources[0] = &a;
  o.sources[1] = &b;
  o.source_count = 2;
  o.bound = 5;
  sl_op *sa, *sb, *p, *out;
  cr_assert_eq(sl_op_source(job, "a", 1, &cs_ops, &a, &sa), 0);
  cr_assert_eq(sl_op_source(job, "b", 1, &cs_ops, &b, &sb), 0);
  sl_watermark_config wc = {.out_of_orderness = 5, .interval_ms = 1};
  cr_assert_eq(sl_op_watermarks(sa, &wc), 0);
  cr_assert_eq(sl_op_watermarks(sb, &wc), 0);
  sl_op *ins[2] = {sa, sb};
  cr_assert_eq(sl_op_process(job, "obs", ins, 2, 1, &obs_ops, &o, &p), 0);
  cr_assert_eq(sl_op_sink(job, "out", p, 1, &discard_ops, 0, &out), 0);
  cr_assert_eq(sl_job_run(job), 0, "%s", sl_job_error(job));
  cr_assert_eq(atomic_load(&o.went_backwards), 0);
  cr_assert_eq(atomic_load(&o.ahead_of_sources), 0,
               "the watermark passed the slower input");
  cr_assert_eq(atomic_load(&o.last_watermark), SL_WATERMARK_MAX);
  sl_job_destroy(job);
}

/* Source b emits one record and then nothing until a has finished.  With
 * an idle timeout the watermark moves on with a; without it, it waits. */
static int64_t idle_run(uint32_t idle_timeout_ms) {
  sl_job *job;
  cr_assert_eq(sl_job_create(0, &job), 0);
  _Atomic int a_done = 0, b_done = 0;
  clock_source a = {.base = 0, .count = 60000, .batch = 200,
                    .pause_us = 500, .done = &a_done};
  clock_source b = {.base = -100000, .count = 1, .batch = 1,
                    .wait_for = &a_done, .done = &b_done};
  observer o;
  observer_init(&o);
  o.sources[0] = &a;
  o.sources[1] = &b;
  o.source_count = 2;
  o.bound = 5;
  o.idle_probe_done = &b_done;
  sl_op *sa, *sb, *p, *out;
  cr_assert_eq(sl_op_source(job, "a", 1, &cs_ops, &a, &sa), 0);
  cr_assert_eq(sl_op_source(job, "b", 1, &cs_ops, &b, &sb), 0);
  sl_watermark_config wa = {.out_of_orderness = 5, .interval_ms = 1};
  sl_watermark_config wb = {.out_of_orderness = 5, .interval_ms = 1,
                            .idle_timeout_ms = idle_timeout_ms};
  cr_assert_eq(sl_op_watermarks(sa, &wa), 0);
  cr_assert_eq(sl_op_watermarks(sb, &wb), 0);
  sl_op *ins[2] = {sa, sb};
  cr_assert_eq(sl_op_process(job, "obs", ins, 2, 1, &obs_ops, &o, &p), 0);
  cr_assert_eq(sl_op_sink(job, "out", p, 1, &discard_ops, 0, &out), 0);
  cr_assert_eq(sl_job_run(job), 0, "%s", sl_job_error(job));
  cr_assert_eq(atomic_load(&o.went_backwards), 0);
  int64_t seen = atomic_load(&o.max_watermark_before_done);
  sl_job_destroy(job);
  return seen;
}

Test(watermarks, idle_input_does_not_stall_time) {
  int64_t with_idle = idle_run(20);
  int64_t without = idle_run(0);
  /* a runs for about 150 ms up to ts 60000; b idles from the start. */
  cr_assert_gt(with_idle, 10000, "with the idle timeout the watermark "
               "followed a (%" PRId64 ")", with_idle);
  cr_assert_lt(without, -99000, "without it, b held it back (%" PRId64 ")",
               without);
}

/* ----------------------------------------------------------- timers */

typedef struct proc_timers {
  _Atomic uint64_t fired;
  _Atomic uint64_t fired_early; /* before their time */
  _Atomic uint64_t fired_late_at_end;
  _Atomic int *source_done;
  _Atomic uint64_t fired_before_end;
  _Atomic int short_ones_fired; /* all 7 of the 20 ms timers */
} proc_timers;

static int pt_process(sl_ctx *ctx, void *state, int input,
                      const sl_record *in) {
  (void)state;
  (void)input;
  const stamped *r = in->data;
  const void *v;
  if (sl_state_get(ctx, 1, &v, 0) == 0)
    return 0; /* one timer pair per key */
  int64_t now = sl_ctx_processing_time(ctx);
  /* One soon, one an hour away (fires only at the end of input). */
  if (sl_timer_register(ctx, SL_PROCESSING_TIME, now + 20) ||
      sl_timer_register(ctx, SL_PROCESSING_TIME, now + 3600 * 1000))
    return -EINVAL;
  return sl_state_put(ctx, 1, &r->ts, 8, 0) ? -ENOMEM : 0;
}

static int pt_timer(sl_ctx *ctx, void *state, int domain, int64_t time) {
  proc_timers *t = state;
  if (domain != SL_PROCESSING_TIME)
    return -EINVAL;
  uint64_t key;
  if (sl_ctx_key(ctx, &key) != 0)
    return -EINVAL;
  atomic_fetch_add(&t->fired, 1);
  int64_t now = sl_ctx_processing_time(ctx);
  if (!atomic_load(t->source_done)) {
    if (atomic_fetch_add(&t->fired_before_end, 1) + 1 == 7)
      atomic_store(&t->short_ones_fired, 1);
    if (now < time)
      atomic_fetch_add(&t->fired_early, 1);
  } else if (now < time) {
    atomic_fetch_add(&t->fired_late_at_end, 1);
  }
  return 0;
}

Test(timers, processing_time_by_the_clock_and_the_rest_at_the_end) {
  sl_job *job;
  cr_assert_eq(sl_job_create(0, &job), 0);
  _Atomic int done = 0;
  proc_timers t = {.source_done = &done};
  /* 70 records over 7 keys, then quiet: the source ends only once the
   * clock has fired all seven 20 ms timers (a condition, not a pause that
   * a loaded machine may outlast). */
  clock_source src = {.base = 0, .count = 70, .batch = 70, .done = &done,
                      .wait_for = &t.short_ones_fired};
  sl_op *s, *k, *p, *out;
  cr_assert_eq(sl_op_source(job, "src", 1, &cs_ops, &src, &s), 0);
  cr_assert_eq(sl_op_key_by(job, "k", s, stamped_key, 0, &k), 0);
  sl_process_ops ops = {.process = pt_process, .on_timer = pt_timer};
  cr_assert_eq(sl_op_process(job, "timers", &k, 1, 2, &ops, &t, &p), 0);
  cr_assert_eq(sl_op_sink(job, "out", p, 1, &discard_ops, 0, &out), 0);
  cr_assert_eq(sl_job_run(job), 0, "%s", sl_job_error(job));
  cr_assert_eq(atomic_load(&t.fired), 14, "%" PRIu64, atomic_load(&t.fired));
  cr_assert_eq(atomic_load(&t.fired_before_end), 7,
               "the 20 ms timers fired by the clock while the source was "
               "quiet (%" PRIu64 ")", atomic_load(&t.fired_before_end));
  cr_assert_eq(atomic_load(&t.fired_early), 0);
  cr_assert_eq(atomic_load(&t.fired_late_at_end), 7,
               "the one-hour timers fired at the end of input");
  sl_job_destroy(job);
}

static int not_keyed_process(sl_ctx *ctx, void *state, int input,
                             const sl_record *in) {
  (void)input;
  (void)in;
  int *rc = state;
  *rc = sl_timer_register(ctx, SL_EVENT_TIME, 5);
  return 0;
}

static int noop_timer(sl_ctx *ctx, void *state, int domain, int64_t time) {
  (void)ctx;
  (void)state;
  (void)domain;
  (void)time;
  return 0;
}

typedef struct api_probe {
  int unkeyed_rc;
  int no_on_timer_rc;
  int bad_domain_rc;
  int delete_missing_rc;
} api_probe;

static int probe_keyed(sl_ctx *ctx, void *state, int input,
                       const sl_record *in) {
  (void)input;
  (void)in;
  api_probe *p = state;
  p->bad_domain_rc = sl_timer_register(ctx, 7, 5);
  p->delete_missing_rc = sl_timer_delete(ctx, SL_EVENT_TIME, 12345);
  return 0;
}

static int probe_no_timer(sl_ctx *ctx, void *state, int input,
                          const sl_record *in) {
  (void)input;
  (void)in;
  api_probe *p = state;
  p->no_on_timer_rc = sl_timer_register(ctx, SL_EVENT_TIME, 5);
  return 0;
}

Test(timers, api_errors) {
  sl_job *job;
  cr_assert_eq(sl_job_create(0, &job), 0);
  clock_source src = {.count = 3, .batch = 3};
  int unkeyed_rc = 0;
  api_probe probe = {0};
  sl_op *s, *k, *a, *b, *c, *o1, *o2, *o3;
  cr_assert_eq(sl_op_source(job, "src", 1, &cs_ops, &src, &s), 0);
  cr_assert_eq(sl_op_key_by(job, "k", s, stamped_key, 0, &k), 0);
  sl_process_ops unkeyed = {.process = not_keyed_process,
                            .on_timer = noop_timer};
  sl_process_ops keyed = {.process = probe_keyed, .on_timer = noop_timer};
  sl_process_ops no_timer = {.process = probe_no_timer};
  cr_assert_eq(sl_op_process(job, "a", &s, 1, 1, &unkeyed, &unkeyed_rc, &a),
               0);
  cr_assert_eq(sl_op_process(job, "b", &k, 1, 1, &keyed, &probe, &b), 0);
  cr_assert_eq(sl_op_process(job, "c", &k, 1, 1, &no_timer, &probe, &c), 0);
  cr_assert_eq(sl_op_sink(job, "o1", a, 1, &discard_ops, 0, &o1), 0);
  cr_assert_eq(sl_op_sink(job, "o2", b, 1, &discard_ops, 0, &o2), 0);
  cr_assert_eq(sl_op_sink(job, "o3", c, 1, &discard_ops, 0, &o3), 0);
  cr_assert_eq(sl_job_run(job), 0, "%s", sl_job_error(job));
  cr_assert_eq(unkeyed_rc, SL_EUSAGE);
  cr_assert_eq(probe.bad_domain_rc, EINVAL);
  cr_assert_eq(probe.delete_missing_rc, SL_ENOTFOUND);
  cr_assert_eq(probe.no_on_timer_rc, SL_EUSAGE);
  sl_job_destroy(job);
}

Test(watermarks, config_errors) {
  sl_job *job;
  cr_assert_eq(sl_job_create(0, &job), 0);
  clock_source src = {.count = 3, .batch = 3};
  sl_op *s, *m;
  cr_assert_eq(sl_op_source(job, "src", 1, &cs_ops, &src, &s), 0);
  cr_assert_eq(sl_op_map(job, "m", s, 1, 16, passthrough, 0, &m), 0);
  sl_watermark_config wc = {.out_of_orderness = 5};
  cr_assert_eq(sl_op_watermarks(m, &wc), EINVAL);
  cr_assert(strstr(sl_job_error(job), "generated at sources"), "%s",
            sl_job_error(job));
  wc.out_of_orderness = -1;
  cr_assert_eq(sl_op_watermarks(s, &wc), EINVAL);
  cr_assert(strstr(sl_job_error(job), "negative"), "%s", sl_job_error(job));
  cr_assert_eq(sl_op_watermarks(0, &wc), EINVAL);
  sl_job_destroy(job);
}

/* ----------------------------------------------------------- side outputs */

typedef struct split_counts {
  _Atomic uint64_t main_sum, side_sum, main_n, side_n;
} split_counts;

static int splitter(sl_ctx *ctx, void *state, int input,
                    const sl_record *in) {
  (void)state;
  (void)input;
  const stamped *r = in->data;
  if (r->ts % 2 == 0)
    return sl_emit(ctx, r, sizeof *r);
  int rc = sl_emit_side(ctx, 1, r, sizeof *r, in->timestamp);
  if (rc == 0 && r->ts % 3 == 0)
    rc = sl_emit_side(ctx, 2, r, sizeof *r, in->timestamp); /* unconsumed */
  if (rc == 0 && sl_emit_side(ctx, 9, r, sizeof *r, 0) != EINVAL)
    rc = -EINVAL;
  return rc;
}

static int count_main(sl_ctx *ctx, void *state, int input,
                      const sl_record *in) {
  (void)ctx;
  (void)input;
  split_counts *c = state;
  const stamped *r = in->data;
  atomic_fetch_add(&c->main_sum, (uint64_t)r->ts);
  atomic_fetch_add(&c->main_n, 1);
  return r->ts % 2 == 0 ? 0 : -EINVAL;
}

static int count_side(sl_ctx *ctx, void *state, int input,
                      const sl_record *in) {
  (void)ctx;
  (void)input;
  split_counts *c = state;
  const stamped *r = in->data;
  atomic_fetch_add(&c->side_sum, (uint64_t)r->ts);
  atomic_fetch_add(&c->side_n, 1);
  return r->ts % 2 == 1 && in->timestamp == r->ts ? 0 : -EINVAL;
}

Test(side_outputs, records_go_to_their_port_only) {
  sl_job *job;
  cr_assert_eq(sl_job_create(0, &job), 0);
  const uint64_t n = 100000;
  clock_source src = {.base = 0, .count = n, .batch = 1000};
  split_counts counts = {0};
  sl_op *s, *p, *side, *side2, *o1, *o2;
  cr_assert_eq(sl_op_source(job, "src", 1, &cs_ops, &src, &s), 0);
  sl_process_ops split = {.process = splitter};
  cr_assert_eq(sl_op_process(job, "split", &s, 1, 2, &split, 0, &p), 0);
  cr_assert_eq(sl_op_side_output(job, "odd", p, 1, &side), 0,
               "%s", sl_job_error(job));
  cr_assert_eq(sl_op_side_output(job, "by3", p, 2, &side2), 0);
  sl_process_ops mo = {.process = count_main}, so = {.process = count_side};
  cr_assert_eq(sl_op_sink(job, "main", p, 1, &mo, &counts, &o1), 0);
  cr_assert_eq(sl_op_sink(job, "side", side, 3, &so, &counts, &o2), 0);
  /* by3 feeds nothing: a dangling stream is refused. */
  cr_assert_eq(sl_job_validate(job), SL_EGRAPH);
  cr_assert(strstr(sl_job_error(job), "by3"), "%s", sl_job_error(job));
  sl_op *o3;
  sl_process_ops d = {.process = discard};
  cr_assert_eq(sl_op_sink(job, "by3-out", side2, 1, &d, 0, &o3), 0);
  cr_assert_eq(sl_job_run(job), 0, "%s", sl_job_error(job));
  uint64_t evens = n / 2, odds = n - evens;
  cr_assert_eq(atomic_load(&counts.main_n), evens);
  cr_assert_eq(atomic_load(&counts.side_n), odds);
  uint64_t even_sum = 0, odd_sum = 0;
  for (uint64_t i = 0; i < n; i++) {
    if (i % 2)
      odd_sum += i;
    else
      even_sum += i;
  }
  cr_assert_eq(atomic_load(&counts.main_sum), even_sum);
  cr_assert_eq(atomic_load(&counts.side_sum), odd_sum);
  sl_job_destroy(job);
}

Test(side_outputs, graph_errors) {
  sl_job *job;
  cr_assert_eq(sl_job_create(0, &job), 0);
  clock_source src = {.count = 3, .batch = 3};
  sl_op *s, *m, *p, *side;
  cr_assert_eq(sl_op_source(job, "src", 1, &cs_ops, &src, &s), 0);
  cr_assert_eq(sl_op_map(job, "m", s, 1, 16, passthrough, 0, &m), 0);
  cr_assert_eq(sl_op_side_output(job, "x", m, 1, &side), SL_EGRAPH);
  cr_assert(strstr(sl_job_error(job), "process"), "%s", sl_job_error(job));
  sl_process_ops ops = {.process = discard};
  cr_assert_eq(sl_op_process(job, "p", &m, 1, 1, &ops, 0, &p), 0);
  cr_assert_eq(sl_op_side_output(job, "x", p, 0, &side), SL_EGRAPH);
  cr_assert_eq(sl_op_side_output(job, "x", p, SL_MAX_SIDE_OUTPUTS + 1, &side),
               SL_EGRAPH);
  cr_assert(strstr(sl_job_error(job), "port"), "%s", sl_job_error(job));
  sl_job_destroy(job);
}

/* ----------------------------------------------------------- reclaiming */

#include "internal.h" /* the instance's copy-on-write map, for its size */

/* Keyed state without checkpoints: values that change size and keys that
 * come and go leave superseded versions behind, which nothing would ever
 * release without a checkpoint; the runtime reclaims them (runtime.c note
 * 6), so memory follows the live state, not the number of writes. */
typedef struct churn {
  _Atomic uint64_t memory_at_close;
  _Atomic uint64_t live_at_close;
} churn;

static int churn_process(sl_ctx *ctx, void *state, int input,
                         const sl_record *in) {
  (void)state;
  (void)input;
  const stamped *r = in->data;
  uint8_t value[128];
  memset(value, (int)r->ts, sizeof value);
  /* Alternate 64- and 128-byte values; every 5th record deletes. */
  if (r->ts % 5 == 4) {
    int rc = sl_state_delete(ctx, 1);
    return rc == 0 || rc == SL_ENOTFOUND ? 0 : rc;
  }
  return sl_state_put(ctx, 1, value, r->ts % 2 ? 64 : 128, 0) ? -ENOMEM : 0;
}

static void churn_close(sl_ctx *ctx, void *state) {
  churn *c = state;
  atomic_store(&c->memory_at_close, sl_cow_map_memory_bytes(ctx->cp.keyed));
  atomic_store(&c->live_at_close, sl_cow_map_count(ctx->cp.keyed));
}

Test(state, superseded_versions_are_reclaimed_without_checkpoints) {
  sl_job *job;
  cr_assert_eq(sl_job_create(0, &job), 0);
  const uint64_t n = sl_test_scaled(3000000, 300000);
  clock_source src = {.base = 0, .count = n, .batch = 1000};
  churn c = {0};
  sl_op *s, *k, *p;
  cr_assert_eq(sl_op_source(job, "src", 1, &cs_ops, &src, &s), 0);
  cr_assert_eq(sl_op_key_by(job, "k", s, stamped_key, 0, &k), 0);
  sl_process_ops ops = {.process = churn_process, .close = churn_close};
  cr_assert_eq(sl_op_sink(job, "churn", k, 1, &ops, &c, &p), 0);
  cr_assert_eq(sl_job_run(job), 0, "%s", sl_job_error(job));
  sl_job_destroy(job);
  uint64_t memory = atomic_load(&c.memory_at_close);
  /* 7 keys live at most, against n writes of up to 128 bytes: without
   * reclaiming this held hundreds of MB. */
  cr_assert_leq(atomic_load(&c.live_at_close), 7);
  cr_assert_lt(memory, 40u << 20,
               "%" PRIu64 " bytes of state memory for 7 keys after %" PRIu64
               " writes", memory, n);
}

/* ----------------------------------------------------------- review cases */

/* Source a finishes (its SL_WATERMARK_MAX arrives) while source b is idle:
 * that must not end event time downstream; b's later records are on
 * time. */
static int64_t key_window_count[8];
static int ts_window_process(sl_ctx *ctx, void *state, int input,
                             const sl_record *in) {
  (void)state;
  (void)input;
  const stamped *r = in->data;
  if (r->ts <= sl_ctx_watermark(ctx))
    sl_ctx_count(ctx, SL_COUNT_LATE, 1);
  return sl_timer_register(ctx, SL_EVENT_TIME, r->ts) ? -EINVAL : 0;
}
static int ts_window_timer(sl_ctx *ctx, void *state, int domain,
                           int64_t time) {
  (void)state;
  (void)domain;
  (void)time;
  uint64_t key;
  if (sl_ctx_key(ctx, &key) || key >= 8)
    return -EINVAL;
  key_window_count[key]++;
  return 0;
}

Test(watermarks, an_input_ending_while_another_is_idle_does_not_end_time) {
  sl_job *job;
  cr_assert_eq(sl_job_create(0, &job), 0);
  _Atomic int a_done = 0, b_done = 0;
  memset(key_window_count, 0, sizeof key_window_count);
  /* a: 200 records over 20 ms, then its end.  b: idles (idle timeout
   * 5 ms) until a is done, 50 ms more, then sends 7 records ahead of a's
   * last watermark: on time unless a's end (SL_WATERMARK_MAX) ended event
   * time for both. */
  clock_source a = {.base = 1000000, .count = 200, .batch = 10,
                    .pause_us = 1000, .done = &a_done}; /* 20 ms: b idles */
  clock_source b = {.base = 2000000, .count = 7, .batch = 7,
                    .start_after = &a_done,
                    .start_delay_us = 50000, .done = &b_done};
  sl_op *sa, *sb, *u, *k, *p, *out;
  cr_assert_eq(sl_op_source(job, "a", 1, &cs_ops, &a, &sa), 0);
  cr_assert_eq(sl_op_source(job, "b", 1, &cs_ops, &b, &sb), 0);
  sl_watermark_config wc = {.out_of_orderness = 1, .interval_ms = 1,
                            .idle_timeout_ms = 5};
  cr_assert_eq(sl_op_watermarks(sa, &wc), 0);
  cr_assert_eq(sl_op_watermarks(sb, &wc), 0);
  sl_op *ins[2] = {sa, sb};
  cr_assert_eq(sl_op_union(job, "u", ins, 2, &u), 0);
  cr_assert_eq(sl_op_key_by(job, "k", u, stamped_key, 0, &k), 0);
  sl_process_ops ops = {.process = ts_window_process,
                        .on_timer = ts_window_timer};
  cr_assert_eq(sl_op_process(job, "p", &k, 1, 1, &ops, 0, &p), 0);
  cr_assert_eq(sl_op_sink(job, "out", p, 1, &discard_ops, 0, &out), 0);
  cr_assert_eq(sl_job_run(job), 0, "%s", sl_job_error(job));
  sl_op_stats st;
  cr_assert_eq(sl_job_stats(job, 2, &st), 0);
  cr_assert_str_eq(st.name, "p");
  cr_assert_eq(st.late_records, 0, "b's records came after a MAX watermark");
  uint64_t fired = 0;
  for (int i = 0; i < 8; i++)
    fired += (uint64_t)key_window_count[i];
  cr_assert_eq(fired, 200 + 7);
  sl_job_destroy(job);
}

/* A periodic processing-time timer that re-arms itself: at the end of
 * input the pending ones fire once; the job ends. */
static _Atomic uint64_t periodic_fired;
static int periodic_process(sl_ctx *ctx, void *state, int input,
                            const sl_record *in) {
  (void)state;
  (void)input;
  (void)in;
  return sl_timer_register(ctx, SL_PROCESSING_TIME,
                           sl_ctx_processing_time(ctx) + 1000)
             ? -EINVAL
             : 0;
}
static int periodic_timer(sl_ctx *ctx, void *state, int domain,
                          int64_t time) {
  (void)state;
  (void)domain;
  atomic_fetch_add(&periodic_fired, 1);
  return sl_timer_register(ctx, SL_PROCESSING_TIME, time + 1) ? -EINVAL : 0;
}

Test(timers, a_self_rearming_processing_timer_does_not_hold_the_end) {
  sl_job *job;
  cr_assert_eq(sl_job_create(0, &job), 0);
  atomic_store(&periodic_fired, 0);
  clock_source src = {.base = 0, .count = 7, .batch = 7};
  sl_op *s, *k, *p, *out;
  cr_assert_eq(sl_op_source(job, "src", 1, &cs_ops, &src, &s), 0);
  cr_assert_eq(sl_op_key_by(job, "k", s, stamped_key, 0, &k), 0);
  sl_process_ops ops = {.process = periodic_process,
                        .on_timer = periodic_timer};
  cr_assert_eq(sl_op_process(job, "p", &k, 1, 1, &ops, 0, &p), 0);
  cr_assert_eq(sl_op_sink(job, "out", p, 1, &discard_ops, 0, &out), 0);
  sl_test_watchdog w;
  cr_assert_eq(sl_job_start(job), 0);
  sl_test_watchdog_arm(&w, job, 20, "self-rearming timer");
  cr_assert_eq(sl_job_wait(job), 0, "%s", sl_job_error(job));
  cr_assert_not(sl_test_watchdog_disarm(&w), "the job did not end");
  cr_assert_eq(atomic_load(&periodic_fired), 7, "one per key at the end");
  sl_job_destroy(job);
}
