/* test_metrics.c — sl_job_metrics() on real jobs: exact counts after the
 * run, snapshots that never go backwards while it runs, busy / idle /
 * backpressured time that adds up to each thread's life and shows a sink
 * held at its first record as backpressure upstream (waited for, never
 * timed), keyed state size, checkpoint counts and history (and the
 * restored id of a resumed job), watermark lag, the operators' own
 * counters, failures and restarts, and the errors. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sluice.h"
#include "sluice_testing.h" /* unstable test helpers */
#include "test_dirs.h"
#include "test_util.h"

/* ------------------------------------------------------------ helpers */

static void snap(const sl_job *job, unsigned flags, sl_metrics *m) {
  int rc = sl_job_metrics(job, flags, m);
  cr_assert_eq(rc, 0, "sl_job_metrics: %s", sl_strerror(rc));
}

static const sl_instance_metrics *instance_of(const sl_metrics *m,
                                              const char *name, int k) {
  for (int i = 0; i < m->instance_count; i++)
    if (strcmp(m->instances[i].name, name) == 0 && m->instances[i].instance == k)
      return &m->instances[i];
  cr_assert_fail("no instance %s[%d]", name, k);
  return 0;
}

static const sl_operator_metrics *operator_of(const sl_metrics *m,
                                              const char *name) {
  for (int i = 0; i < m->operator_count; i++)
    if (strcmp(m->operators[i].name, name) == 0)
      return &m->operators[i];
  cr_assert_fail("no operator %s", name);
  return 0;
}

static uint64_t lifetime_ns(const sl_instance_metrics *i) {
  return i->busy_ns + i->idle_ns + i->backpressured_ns;
}

/* sl_job_wait() on a thread of its own, so the test thread can poll. */
typedef struct waiter {
  pthread_t thread;
  sl_job *job;
  int rc;
  atomic_int done;
} waiter;

static void *waiter_main(void *arg) {
  waiter *w = arg;
  w->rc = sl_job_wait(w->job);
  atomic_store(&w->done, 1);
  return 0;
}

static void waiter_start(waiter *w, sl_job *job) {
  w->job = job;
  atomic_init(&w->done, 0);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  cr_assert_eq(pthread_create(&w->thread, 0, waiter_main, w), 0);
}

static int waiter_join(waiter *w) {
  pthread_join(w->thread, 0);
  return w->rc;
}

static int map_triple(void *user, const sl_record *in, void *out,
                      uint32_t *out_size) {
  (void)user;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  t.value = t.value * 3 + 1;
  memcpy(out, &t, sizeof t);
  *out_size = sizeof t;
  return 0;
}

/* source -> map -> checksum sink, parallelism p each. */
static sl_job *pipeline(const sl_job_config *config, uint64_t n, int p,
                        sl_checksum *sum) {
  sl_job *job = 0;
  sl_op *src, *map, *snk;
  cr_assert_eq(sl_job_create(config, &job), 0);
  cr_assert_eq(sl_source_sequence(job, "source", p, n, 100, &src), 0);
  cr_assert_eq(sl_op_map(job, "map", src, p, 16, map_triple, 0, &map), 0);
  cr_assert_eq(sl_sink_checksum(job, "sink", map, p, sum, &snk), 0);
  return job;
}

/* ------------------------------------------------------------ counts */

Test(metrics, counts_exact_after_wait) {
  uint64_t n = sl_test_scaled(2000000, 100000);
  sl_checksum sum = {0};
  sl_job *job = pipeline(0, n, 2, &sum);
  cr_assert_eq(sl_job_run(job), 0, "%s", sl_job_error(job));
  sl_metrics m;
  snap(job, 0, &m);
  cr_assert_eq(m.state, SL_JOB_STATUS_FINISHED);
  cr_assert_str_eq(sl_job_status_name(m.state), "FINISHED");
  cr_assert_eq(m.operator_count, 3);
  cr_assert_eq(m.instance_count, 6);
  cr_assert_eq(m.source_records, n);
  cr_assert_eq(m.restarts, 0);
  cr_assert_eq(m.last_failure_status, 0);
  cr_assert_str_empty(m.last_failure);
  cr_assert_eq(m.checkpointing, 0);
  cr_assert(m.uptime_ns > 0 && m.start_time_ms > 0);
  const sl_operator_metrics *src = operator_of(&m, "source");
  const sl_operator_metrics *map = operator_of(&m, "map");
  const sl_operator_metrics *snk = operator_of(&m, "sink");
  cr_assert_eq(src->records_in, 0);
  cr_assert_eq(src->records_out, n);
  cr_assert_eq(src->bytes_out, n * 16);
  cr_assert_eq(map->records_in, n);
  cr_assert_eq(map->bytes_in, n * 16);
  cr_assert_eq(map->records_out, n);
  cr_assert_eq(map->bytes_out, n * 16);
  cr_assert_eq(snk->records_in, n);
  cr_assert_eq(snk->bytes_in, n * 16);
  cr_assert_eq(snk->records_out, 0);
  cr_assert_eq(snk->bytes_out, 0);
  cr_assert_eq(sum.records, n);
  /* Operators are the sums of their instances, which come in order. */
  for (int o = 0; o < m.operator_count; o++) {
    const sl_operator_metrics *op = &m.operators[o];
    cr_assert_eq(op->parallelism, 2);
    cr_assert_eq(op->first_instance, 2 * o);
    uint64_t in = 0;
    for (int k = 0; k < op->parallelism; k++) {
      const sl_instance_metrics *i = &m.instances[op->first_instance + k];
      cr_assert_str_eq(i->name, op->name);
      cr_assert_eq(i->instance, k);
      cr_assert_eq(i->operator_index, o);
      cr_assert_eq(i->running, 0, "every thread has ended");
      in += i->records_in;
    }
    cr_assert_eq(in, op->records_in);
  }
  /* Forward edges: one output ring per source and map, one input ring per
   * map and sink; all empty at the end. */
  const sl_instance_metrics *m0 = instance_of(&m, "map", 0);
  cr_assert_eq(m0->input_rings, 1);
  cr_assert_eq(m0->output_rings, 1);
  cr_assert_eq(m0->input_fill_max_ratio, 0.0);
  cr_assert_eq(instance_of(&m, "source", 1)->input_rings, 0);
  cr_assert_eq(instance_of(&m, "sink", 1)->output_rings, 0);
  sl_metrics_free(&m);
  cr_assert_null(m.instances);
  sl_job_destroy(job);
}

/* ------------------------------------------------------------ polling */

/* Every counter and time of every instance is at least what the previous
 * snapshot said. */
static void assert_not_backwards(const sl_metrics *a, const sl_metrics *b) {
  cr_assert_eq(a->instance_count, b->instance_count);
  cr_assert(b->uptime_ns >= a->uptime_ns);
  cr_assert(b->source_records >= a->source_records);
  for (int k = 0; k < a->instance_count; k++) {
    const sl_instance_metrics *x = &a->instances[k], *y = &b->instances[k];
    cr_assert(y->records_in >= x->records_in, "%s[%d]", x->name, x->instance);
    cr_assert(y->records_out >= x->records_out);
    cr_assert(y->bytes_in >= x->bytes_in);
    cr_assert(y->bytes_out >= x->bytes_out);
    cr_assert(y->idle_ns >= x->idle_ns, "%s[%d] idle %" PRIu64 " then %" PRIu64,
              x->name, x->instance, x->idle_ns, y->idle_ns);
    cr_assert(y->backpressured_ns >= x->backpressured_ns);
    cr_assert(lifetime_ns(y) >= lifetime_ns(x));
    cr_assert(x->input_fill_max_ratio >= 0 && x->input_fill_max_ratio <= 1);
    cr_assert(x->output_fill_max_ratio >= 0 && x->output_fill_max_ratio <= 1);
  }
}

Test(metrics, snapshots_never_go_backwards) {
  uint64_t n = sl_test_scaled(20000000, 500000);
  sl_checksum sum = {0};
  sl_job *job = pipeline(0, n, 1, &sum);
  waiter w;
  waiter_start(&w, job);
  sl_metrics prev;
  snap(job, 0, &prev);
  int snapshots = 1;
  /* Bounded: the job ends within the test's timeout. */
  for (int polls = 0; polls < 100000 && !atomic_load(&w.done); polls++) {
    sl_metrics now;
    snap(job, SL_METRICS_HISTORY, &now);
    assert_not_backwards(&prev, &now);
    sl_metrics_free(&prev);
    prev = now;
    snapshots++;
    sl_test_sleep_us(2000);
  }
  cr_assert_eq(waiter_join(&w), 0, "%s", sl_job_error(job));
  sl_metrics last;
  snap(job, 0, &last);
  assert_not_backwards(&prev, &last);
  cr_assert_eq(operator_of(&last, "sink")->records_in, n);
  cr_log_info("%d snapshots while running", snapshots);
  sl_metrics_free(&prev);
  sl_metrics_free(&last);
  sl_job_destroy(job);
}

/* ------------------------------------------------------------ time */

/* A sink held at its first record until the test lets it go: the
 * bottleneck, by construction rather than by speed.  While it is held it
 * releases nothing of its input ring, so the map fills that ring and then
 * waits for room, and the source does the same on the map's input. */
typedef struct held_sink {
  atomic_int held;    /* the sink is inside its first process() */
  atomic_int release; /* the test lets it go on */
  uint64_t seen;      /* records processed (the sink's thread only) */
} held_sink;

static int held_process(sl_ctx *ctx, void *state, int input,
                        const sl_record *in) {
  (void)input, (void)in;
  held_sink *h = state;
  if (h->seen++ == 0) {
    atomic_store(&h->held, 1);
    /* Bounded by the test: it releases the sink, or fails and the job
     * stops. */
    while (!atomic_load(&h->release) && !sl_ctx_stopping(ctx))
      sl_test_sleep_us(100);
  }
  return 0;
}

/* Polls of the metrics, 1 ms apart, before the test gives up on the held
 * job reaching its blocked state (it always does; this only bounds a
 * broken engine). */
#define BLOCKED_POLLS 60000

/* Whether the held job shows what it must once the sink has held long
 * enough: both upstream threads have waited for room, and every ring on
 * the way is over half full (a producer waits only on a ring more than
 * half full, ring.h note 8, and the held sink frees nothing). */
static bool backpressure_shown(const sl_metrics *m) {
  const sl_instance_metrics *s = instance_of(m, "source", 0);
  const sl_instance_metrics *p = instance_of(m, "map", 0);
  const sl_instance_metrics *k = instance_of(m, "slow", 0);
  return s->backpressured_ns > 0 && p->backpressured_ns > 0 &&
         s->output_fill_max_ratio > 0.5 && p->input_fill_max_ratio > 0.5 &&
         p->output_fill_max_ratio > 0.5 && k->input_fill_max_ratio > 0.5;
}

Test(metrics, slow_sink_shows_backpressure_upstream) {
  /* Far more than the two rings hold (16 KiB each, about 1000 records). */
  uint64_t n = 100000;
  /* Threads of their own: a chained sink would run in the map's thread
   * (runtime.c note 12), which then never waits for room. */
  sl_job_config config = {.struct_bytes = sizeof(sl_job_config),
                          .ring_bytes = 16384,
                          .chaining = SL_CHAINING_NEVER};
  sl_job *job = 0;
  sl_op *src, *map, *snk;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  cr_assert_eq(sl_source_sequence(job, "source", 1, n, 100, &src), 0);
  cr_assert_eq(sl_op_map(job, "map", src, 1, 16, map_triple, 0, &map), 0);
  static held_sink sink;
  atomic_init(&sink.held, 0);
  atomic_init(&sink.release, 0);
  sink.seen = 0;
  static const sl_process_ops ops = {.process = held_process};
  cr_assert_eq(sl_op_sink(job, "slow", map, 1, &ops, &sink, &snk), 0);
  waiter w;
  waiter_start(&w, job);
  /* Wait for the blocked state explicitly, the sink held first (the rings
   * may fill before the sink reads at all): no figure here depends on how
   * fast the machine is, only on the sink being held. */
  int polls = 0;
  for (; polls < BLOCKED_POLLS && !atomic_load(&sink.held); polls++)
    sl_test_sleep_us(1000);
  cr_assert_eq(atomic_load(&sink.held), 1, "the sink got no record");
  sl_metrics held;
  snap(job, 0, &held);
  for (; polls < BLOCKED_POLLS && !backpressure_shown(&held); polls++) {
    sl_metrics_free(&held);
    sl_test_sleep_us(1000);
    snap(job, 0, &held);
  }
  cr_assert(backpressure_shown(&held),
            "no backpressure upstream after %d polls", polls);
  cr_assert_eq(atomic_load(&w.done), 0, "the held job cannot end");
  const sl_instance_metrics *hs = instance_of(&held, "source", 0);
  const sl_instance_metrics *hk = instance_of(&held, "slow", 0);
  /* The sink is inside process(): it has no output to wait for, and
   * everything upstream could not pass it. */
  cr_assert_eq(hk->backpressured_ns, 0, "a sink has no output to wait for");
  cr_assert(hs->records_out < n, "%" PRIu64 " of %" PRIu64 " emitted",
            hs->records_out, n);
  cr_assert_eq(hs->idle_ns, 0, "a source never waits for input");
  sl_metrics_free(&held);

  atomic_store(&sink.release, 1);
  cr_assert_eq(waiter_join(&w), 0, "%s", sl_job_error(job));
  sl_metrics m;
  snap(job, 0, &m);
  const sl_instance_metrics *s = instance_of(&m, "source", 0);
  const sl_instance_metrics *p = instance_of(&m, "map", 0);
  const sl_instance_metrics *k = instance_of(&m, "slow", 0);
  cr_log_info("source busy %.1f idle %.1f bp %.1f ms; map %.1f %.1f %.1f; "
              "sink %.1f %.1f %.1f; uptime %.1f ms; %d polls held",
              s->busy_ns / 1e6, s->idle_ns / 1e6, s->backpressured_ns / 1e6,
              p->busy_ns / 1e6, p->idle_ns / 1e6, p->backpressured_ns / 1e6,
              k->busy_ns / 1e6, k->idle_ns / 1e6, k->backpressured_ns / 1e6,
              m.uptime_ns / 1e6, polls);
  cr_assert_eq(sink.seen, n, "every record reached the sink");
  cr_assert_eq(k->records_in, n);
  /* Over the whole run: the waits for room stay counted, the sink still
   * never waited for room and the source never for input. */
  cr_assert(s->backpressured_ns > 0);
  cr_assert(p->backpressured_ns > 0);
  cr_assert_eq(k->backpressured_ns, 0, "a sink has no output to wait for");
  cr_assert_eq(s->idle_ns, 0, "a source never waits for input");
  /* Each thread lived within the job's run. */
  for (int i = 0; i < m.instance_count; i++) {
    uint64_t life = lifetime_ns(&m.instances[i]);
    cr_assert(life <= m.uptime_ns, "%s: %" PRIu64 " > %" PRIu64,
              m.instances[i].name, life, m.uptime_ns);
  }
  sl_metrics_free(&m);
  sl_job_destroy(job);
}

/* ------------------------------------------------------------ state and
 * checkpoints */

static int running_sum(sl_ctx *ctx, void *state, int input,
                       const sl_record *in) {
  (void)state, (void)input;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  uint64_t *acc = 0;
  int rc = sl_state_update(ctx, 1, sizeof *acc, 0, (void **)&acc);
  if (rc)
    return rc > 0 ? -rc : rc;
  *acc += t.value;
  t.value = *acc;
  return sl_emit(ctx, &t, sizeof t);
}

/* keyed source -> key_by -> running sum (keyed state) -> checksum. */
static sl_job *keyed_job(const char *state_dir, int policy, uint64_t n,
                         uint64_t keys, sl_checksum *sum) {
  sl_job_config config = SL_JOB_CONFIG_INIT;
  config.checkpoint.state_dir = state_dir;
  config.checkpoint.interval_ms = 5;
  config.checkpoint.no_sync = 1;
  config.checkpoint.store_policy = policy;
  sl_job *job = 0;
  sl_op *src, *by, *op, *snk;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  cr_assert_eq(sl_source_keyed(job, "source", 2, n, keys, &src), 0);
  cr_assert_eq(sl_op_key_by(job, "by_key", src, sl_fixture_tuple_key, 0, &by),
               0);
  static const sl_process_ops ops = {.process = running_sum};
  cr_assert_eq(sl_op_process(job, "sum", &by, 1, 2, &ops, 0, &op), 0);
  cr_assert_eq(sl_sink_checksum(job, "sink", op, 1, sum, &snk), 0);
  return job;
}

static void assert_history(const sl_metrics *m) {
  uint64_t expect = m->checkpoints_total < 64 ? m->checkpoints_total : 64;
  cr_assert_eq((uint64_t)m->history_count, expect);
  cr_assert_eq(m->history_instance_count, m->instance_count);
  bool completed_seen = false;
  for (int k = 0; k < m->history_count; k++) {
    const sl_checkpoint_stats *c = &m->history[k];
    if (k > 0)
      cr_assert(c->id < m->history[k - 1].id, "newest first");
    cr_assert_neq(c->status, SL_CHECKPOINT_IN_PROGRESS, "all ended");
    if (c->status == SL_CHECKPOINT_COMPLETED && !completed_seen) {
      completed_seen = true;
      cr_assert_eq(c->id, m->latest_completed.id);
    }
    for (int i = 0; i < m->history_instance_count; i++) {
      const sl_checkpoint_instance_stats *s =
          &m->history_instances[(size_t)k * m->history_instance_count + i];
      cr_assert_not_null(s->name);
    }
  }
  cr_assert(completed_seen);
}

Test(metrics, keyed_state_and_checkpoints) {
  char *dir = sl_test_temp_dir("metrics");
  uint64_t n = sl_test_scaled(2000000, 200000), keys = 1000;
  sl_checksum sum = {0};
  sl_job *job = keyed_job(dir, SL_STORE_FRESH, n, keys, &sum);
  cr_assert_eq(sl_job_run(job), 0, "%s", sl_job_error(job));
  sl_metrics m;
  snap(job, SL_METRICS_HISTORY, &m);
  const sl_operator_metrics *op = operator_of(&m, "sum");
  cr_assert_eq(op->records_in, n);
  cr_assert_eq(op->state_entries, keys, "one value per key");
  cr_assert(op->state_bytes >= keys * 16);
  cr_assert_eq(operator_of(&m, "sink")->state_entries, 0);
  cr_assert_eq(m.checkpointing, 1);
  cr_assert(m.checkpoints_completed >= 1, "the final one at least");
  cr_assert_eq(m.checkpoints_in_progress, 0);
  cr_assert_eq(m.checkpoints_total, m.checkpoints_completed +
                                        m.checkpoints_failed +
                                        m.checkpoints_in_progress);
  cr_assert(m.has_latest_completed);
  cr_assert_eq(m.latest_completed.status, SL_CHECKPOINT_COMPLETED);
  uint64_t from = 99;
  cr_assert_eq(m.latest_completed.id, sl_job_last_checkpoint(job, &from));
  cr_assert_eq(m.restored_from, 0);
  cr_assert_eq(from, 0);
  assert_history(&m);
  uint64_t latest = m.latest_completed.id;
  sl_metrics_free(&m);
  sl_job_destroy(job);

  /* Resumed: the newest complete checkpoint is where it came from. */
  sl_checksum again = {0};
  job = keyed_job(dir, SL_STORE_RESUME, n, keys, &again);
  cr_assert_eq(sl_job_run(job), 0, "%s", sl_job_error(job));
  snap(job, 0, &m);
  cr_assert_eq(m.restored_from, latest);
  cr_assert_null(m.history, "no history without SL_METRICS_HISTORY");
  cr_assert_eq(operator_of(&m, "sum")->state_entries, keys, "restored");
  sl_metrics_free(&m);
  sl_job_destroy(job);
  sl_test_remove_tree(dir);
}

/* ------------------------------------------------------------ event time */

/* Records stamped 5 s behind the wall clock, until stopped. */
static int behind_next(sl_ctx *ctx, void *state) {
  (void)state;
  for (int k = 0; k < 64; k++) {
    sl_tuple t = {.key = (uint64_t)k, .value = (uint64_t)k};
    int rc = sl_emit_ts(ctx, &t, sizeof t, sl_ctx_processing_time(ctx) - 5000);
    if (rc)
      return rc;
  }
  sl_test_sleep_us(1000);
  return 0;
}

static int drop(sl_ctx *ctx, void *state, int input, const sl_record *in) {
  (void)ctx, (void)state, (void)input, (void)in;
  return 0;
}

Test(metrics, watermark_lag) {
  sl_job *job = 0;
  sl_op *src, *snk;
  cr_assert_eq(sl_job_create(0, &job), 0);
  static const sl_source_ops source = {.next = behind_next};
  cr_assert_eq(sl_op_source(job, "behind", 1, &source, 0, &src), 0);
  sl_watermark_config wm = {.every_call = 1};
  cr_assert_eq(sl_op_watermarks(src, &wm), 0);
  static const sl_process_ops sink = {.process = drop};
  cr_assert_eq(sl_op_sink(job, "drop", src, 1, &sink, 0, &snk), 0);
  cr_assert_eq(sl_job_start(job), 0);
  bool seen = false;
  int64_t lag = 0;
  for (int polls = 0; polls < 5000 && !seen; polls++) { /* <= 5 s */
    sl_metrics m;
    snap(job, 0, &m);
    const sl_instance_metrics *d = instance_of(&m, "drop", 0);
    seen = d->has_watermark_lag;
    lag = d->watermark_lag_ms;
    if (seen)
      cr_assert(instance_of(&m, "behind", 0)->has_watermark_lag);
    sl_metrics_free(&m);
    sl_test_sleep_us(1000);
  }
  sl_job_stop(job);
  cr_assert_eq(sl_job_wait(job), SL_ESTOPPED);
  cr_assert(seen, "no watermark reached the sink");
  /* The watermark is at most the newest timestamp, 5 s behind. */
  cr_assert(lag >= 5000 && lag < 65000, "lag %" PRId64 " ms", lag);
  sl_metrics m;
  snap(job, 0, &m);
  cr_assert_eq(m.state, SL_JOB_STATUS_CANCELED);
  sl_metrics_free(&m);
  sl_job_destroy(job);
}

/* ------------------------------------------------------------ counters */

static int classify(sl_ctx *ctx, void *state, int input, const sl_record *in) {
  (void)state, (void)input;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  if (t.value % 2 == 0)
    sl_ctx_count(ctx, SL_COUNT_LATE, 1);
  if (t.value % 10 == 0)
    sl_ctx_count(ctx, SL_COUNT_DEAD_LETTER, 1);
  return 0;
}

Test(metrics, late_and_dead_letter_counters) {
  uint64_t n = 100000; /* values 0 .. n-1 */
  sl_job *job = 0;
  sl_op *src, *snk;
  cr_assert_eq(sl_job_create(0, &job), 0);
  cr_assert_eq(sl_source_sequence(job, "source", 1, n, 0, &src), 0);
  static const sl_process_ops ops = {.process = classify};
  cr_assert_eq(sl_op_sink(job, "classify", src, 2, &ops, 0, &snk), 0);
  cr_assert_eq(sl_job_run(job), 0, "%s", sl_job_error(job));
  sl_metrics m;
  snap(job, 0, &m);
  const sl_operator_metrics *op = operator_of(&m, "classify");
  cr_assert_eq(op->late_records, n / 2);
  cr_assert_eq(op->dead_letters, n / 10);
  cr_assert_eq(instance_of(&m, "classify", 0)->late_records +
                   instance_of(&m, "classify", 1)->late_records,
               n / 2);
  sl_metrics_free(&m);
  sl_job_destroy(job);
}

/* ------------------------------------------------------------ failures */

static int fail_at_500(sl_ctx *ctx, void *state, int input,
                       const sl_record *in) {
  (void)state, (void)input;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  if (t.value == 500) {
    sl_ctx_fail(ctx, "record 500 is \"bad\"");
    return -1;
  }
  return 0;
}

Test(metrics, failed_job) {
  sl_job *job = 0;
  sl_op *src, *snk;
  cr_assert_eq(sl_job_create(0, &job), 0);
  cr_assert_eq(sl_source_sequence(job, "source", 1, 10000, 0, &src), 0);
  static const sl_process_ops ops = {.process = fail_at_500};
  cr_assert_eq(sl_op_sink(job, "picky", src, 1, &ops, 0, &snk), 0);
  cr_assert_eq(sl_job_run(job), -1); /* fail_at_500 returns it */
  sl_metrics m;
  snap(job, 0, &m);
  cr_assert_eq(m.state, SL_JOB_STATUS_FAILED);
  cr_assert_eq(m.last_failure_status, -1);
  cr_assert(strstr(m.last_failure, "'picky'") != 0, "%s", m.last_failure);
  cr_assert(strstr(m.last_failure, "record 500") != 0, "%s", m.last_failure);
  sl_metrics_free(&m);
  sl_job_destroy(job);
}

Test(metrics, restart_counted_with_its_cause) {
  uint64_t n = 50000;
  sl_job_config config = SL_JOB_CONFIG_INIT;
  config.faults = "fail:op=map,instance=0,record=10000";
  config.restart = sl_restart_defaults(SL_RESTART_FIXED_DELAY);
  config.restart.delay_ms = 0;
  sl_checksum sum = {0};
  sl_job *job = pipeline(&config, n, 1, &sum);
  cr_assert_eq(sl_job_run(job), 0, "%s", sl_job_error(job));
  sl_metrics m;
  snap(job, 0, &m);
  cr_assert_eq(m.state, SL_JOB_STATUS_FINISHED);
  cr_assert_eq(m.restarts, 1);
  cr_assert_eq(m.faults_fired, 1);
  cr_assert_neq(m.last_failure_status, 0);
  cr_assert(strstr(m.last_failure, "map") != 0, "%s", m.last_failure);
  /* Without checkpoints the restart starts over: records count again. */
  cr_assert(operator_of(&m, "map")->records_in > n);
  sl_metrics_free(&m);
  sl_job_destroy(job);
}

/* ------------------------------------------------------------ errors */

Test(metrics, errors_and_not_started) {
  sl_metrics m;
  cr_assert_eq(sl_job_metrics(0, 0, &m), EINVAL);
  sl_job *job = 0;
  sl_checksum sum = {0};
  job = pipeline(0, 10, 1, &sum);
  cr_assert_eq(sl_job_metrics(job, 0, 0), EINVAL);
  cr_assert_eq(sl_job_metrics(job, 0x100, &m), EINVAL);
  cr_assert_eq(sl_job_metrics(job, 0, &m), SL_ENOTSTARTED);
  cr_assert_eq(m.state, SL_JOB_STATUS_CREATED);
  cr_assert_null(m.instances);
  sl_metrics_free(&m); /* accepted, nothing to free */
  sl_metrics_free(0);
  cr_assert_str_eq(sl_job_status_name(SL_JOB_STATUS_RUNNING), "RUNNING");
  cr_assert_str_eq(sl_job_status_name(42), "UNKNOWN");
  cr_assert_str_eq(sl_job_status_name(-1), "UNKNOWN");
  sl_job_destroy(job);
}
