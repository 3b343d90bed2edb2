/* test_chaining.c — operator chaining (runtime.c note 12, graph.c
 * plan_chains): which instances share a thread, and that a chained job
 * computes what the same job computes in a thread per instance, through
 * checkpoints, failovers, timers, END and failures.
 *
 * Threads are counted from /proc/self/task/N/comm (the engine names each
 * thread after the instance it runs first, "sl:NAME[i]") while a gate in
 * the source holds the job; nothing here waits for a time to pass. */
#include <criterion/criterion.h>
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "fixtures.h"
#include "sluice.h"
#include "sluice_embed.h"
#include "sluice_testing.h"
#include "test_dirs.h"

static void sleep_ms(long ms) {
  struct timespec t = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};
  nanosleep(&t, 0);
}

/* Threads of this process whose name starts with "sl:" and then prefix. */
static int engine_threads(const char *prefix) {
  char full[32];
  snprintf(full, sizeof full, "sl:%s", prefix);
  int n = 0;
  int rc = sl_fixture_threads_named(full, &n);
  cr_assert_eq(rc, 0, "cannot list /proc/self/task: %s", strerror(rc));
  return n;
}

/* ------------------------------------------------------------ a gated job */

/* A source of sl_tuple {i % 10, i} that emits `count` records, but only
 * the first `gate` of them until the test opens the gate. */
typedef struct gate_source {
  uint64_t count, gate;
  atomic_int open;
  atomic_int held; /* the source reached the gate */
} gate_source;

typedef struct gate_state {
  gate_source *spec;
  uint64_t next;
} gate_state;

static int gate_open(sl_ctx *ctx, void *user, void **state) {
  (void)ctx;
  gate_state *s = calloc(1, sizeof *s);
  if (!s)
    return -ENOMEM;
  s->spec = user;
  *state = s;
  return 0;
}

static int gate_next(sl_ctx *ctx, void *state) {
  gate_state *s = state;
  if (s->next == s->spec->count)
    return SL_SOURCE_END;
  if (s->next == s->spec->gate && !atomic_load(&s->spec->open)) {
    atomic_store(&s->spec->held, 1);
    sleep_ms(1); /* next() returns: the engine may stop or checkpoint */
    return 0;
  }
  uint64_t limit = atomic_load(&s->spec->open) ? s->spec->count
                                               : s->spec->gate;
  for (int i = 0; i < 64 && s->next < limit; i++, s->next++) {
    sl_tuple t = {.key = s->next % 10, .value = s->next};
    int rc = sl_emit(ctx, &t, sizeof t);
    if (rc)
      return rc;
  }
  return 0;
}

static void gate_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  free(state);
}

static const sl_source_ops gate_ops = {
    .open = gate_open, .next = gate_next, .close = gate_close};

static int keep_odd(void *user, const sl_record *in) {
  (void)user;
  const sl_tuple *t = in->data;
  return (int)(t->value & 1);
}

static int add_one(void *user, const sl_record *in, void *out,
                   uint32_t *out_bytes) {
  (void)user;
  sl_tuple t = *(const sl_tuple *)in->data;
  t.value += 1;
  memcpy(out, &t, sizeof t);
  *out_bytes = sizeof t;
  return 0;
}

typedef struct pipeline {
  sl_job *job;
  sl_op *source, *map, *filter, *sink;
  gate_source gate;
  sl_checksum sum;
} pipeline;

/* source -> map -> filter -> checksum sink, parallelism 1 each, on the
 * cpu_count CPUs of cpus (0: all the process may use). */
static void pipeline_build_on(pipeline *p, int chaining, bool map_opts_out,
                              int *cpus, int cpu_count) {
  memset(p, 0, sizeof *p);
  p->gate.count = 20000;
  p->gate.gate = 1000;
  sl_job_config config = {.struct_bytes = sizeof config,
                          .chaining = chaining,
                          .cpus = cpus,
                          .cpu_count = cpu_count};
  cr_assert_eq(sl_job_create(&config, &p->job), 0);
  cr_assert_eq(sl_op_source(p->job, "gsrc", 1, &gate_ops, &p->gate,
                            &p->source), 0);
  cr_assert_eq(sl_op_map(p->job, "gmap", p->source, 1, sizeof(sl_tuple),
                         add_one, 0, &p->map), 0);
  if (map_opts_out)
    cr_assert_eq(sl_op_disable_chaining(p->map), 0);
  cr_assert_eq(sl_op_filter(p->job, "gfilter", p->map, 1, keep_odd, 0,
                            &p->filter), 0);
  cr_assert_eq(sl_sink_checksum(p->job, "gsink", p->filter, 1, &p->sum,
                                &p->sink), 0);
}

static void pipeline_build(pipeline *p, int chaining, bool map_opts_out) {
  pipeline_build_on(p, chaining, map_opts_out, 0, 0);
}

/* The checksum of what the pipeline's sink must get. */
static sl_checksum pipeline_expected(uint64_t count) {
  sl_checksum want = {0};
  for (uint64_t i = 0; i < count; i++) {
    sl_tuple t = {.key = i % 10, .value = i + 1};
    if (t.value & 1)
      sl_checksum_add(&want, &t, sizeof t);
  }
  return want;
}

/* Start p, wait for its source to reach the gate, count the threads, open
 * the gate and run to the end. */
static int pipeline_threads(pipeline *p) {
  cr_assert_eq(sl_job_start(p->job), 0, "%s", sl_job_error(p->job));
  for (int i = 0; i < 60000 && !atomic_load(&p->gate.held) &&
                  !sl_job_error(p->job)[0];
       i++)
    sleep_ms(1);
  cr_assert(atomic_load(&p->gate.held), "the source never reached its gate: %s",
            sl_job_error(p->job));
  int threads = engine_threads("g");
  atomic_store(&p->gate.open, 1);
  cr_assert_eq(sl_job_wait(p->job), 0, "%s", sl_job_error(p->job));
  sl_checksum want = pipeline_expected(p->gate.count);
  cr_expect_eq(p->sum.records, want.records);
  cr_expect_eq(p->sum.value_sum, want.value_sum);
  cr_expect_eq(p->sum.hash_sum, want.hash_sum);
  sl_job_destroy(p->job);
  return threads;
}

Test(plan, always_runs_a_pipeline_in_one_thread) {
  pipeline p;
  pipeline_build(&p, SL_CHAINING_ALWAYS, false);
  cr_expect_eq(pipeline_threads(&p), 1);
}

Test(plan, never_gives_each_instance_a_thread) {
  pipeline p;
  pipeline_build(&p, SL_CHAINING_NEVER, false);
  cr_expect_eq(pipeline_threads(&p), 4);
}

/* The map opts out: it neither joins the source's thread nor takes the
 * filter into its own; the filter and the sink still share one. */
Test(plan, an_operator_that_opts_out_breaks_the_chain_on_both_sides) {
  pipeline p;
  pipeline_build(&p, SL_CHAINING_ALWAYS, true);
  cr_expect_eq(pipeline_threads(&p), 3);
}

/* Automatic: chained when the 4 instances outnumber the CPUs the job may
 * use, a thread each when they do not. */
Test(plan, auto_chains_when_instances_outnumber_cpus) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  cr_assert_eq(sched_getaffinity(0, sizeof mask, &mask), 0);
  int cpus[4], count = 0;
  for (int c = 0; c < CPU_SETSIZE && count < 4; c++)
    if (CPU_ISSET(c, &mask))
      cpus[count++] = c;
  pipeline p;
  pipeline_build_on(&p, SL_CHAINING_AUTO, false, cpus, 1);
  cr_expect_eq(pipeline_threads(&p), 1);
  if (count < 2)
    cr_skip_test("one CPU in this process's mask");
  pipeline_build_on(&p, SL_CHAINING_AUTO, false, cpus, 2);
  cr_expect_eq(pipeline_threads(&p), 1);
  if (count < 4)
    return; /* four CPUs for four instances: not on this machine */
  pipeline_build_on(&p, SL_CHAINING_AUTO, false, cpus, 4);
  cr_expect_eq(pipeline_threads(&p), 4);
}

/* A keyed edge from one source instance to two count instances fans out
 * (two rings on one output): not chained.  Each count's forward edge to
 * its sink instance is. */
Test(plan, a_fan_out_is_not_chained_its_forward_edges_are) {
  gate_source gate = {.count = 20000, .gate = 1000};
  sl_job_config config = {.struct_bytes = sizeof config,
                          .chaining = SL_CHAINING_ALWAYS};
  sl_job *job = 0;
  sl_op *src, *key, *count, *sink;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  cr_assert_eq(sl_op_source(job, "gsrc", 1, &gate_ops, &gate, &src), 0);
  cr_assert_eq(sl_op_key_by(job, "gkey", src, sl_fixture_tuple_key, 0, &key),
               0);
  static const sl_process_ops count_ops = {
      .process = sl_fixture_count_process};
  cr_assert_eq(sl_op_process(job, "gcount", &key, 1, 2, &count_ops, 0,
                             &count), 0);
  sl_checksum sum = {0};
  cr_assert_eq(sl_sink_checksum(job, "gsink", count, 2, &sum, &sink), 0);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  for (int i = 0; i < 60000 && !atomic_load(&gate.held) &&
                  !sl_job_error(job)[0];
       i++)
    sleep_ms(1);
  cr_assert(atomic_load(&gate.held), "the source never reached its gate: %s",
            sl_job_error(job));
  cr_expect_eq(engine_threads("g"), 3, "%d threads", engine_threads("g"));
  atomic_store(&gate.open, 1);
  cr_assert_eq(sl_job_wait(job), 0, "%s", sl_job_error(job));
  cr_expect_eq(sum.records, gate.count);
  sl_job_destroy(job);
}

Test(plan, a_bad_chaining_value_is_refused) {
  sl_job_config config = {.struct_bytes = sizeof config, .chaining = 3};
  sl_job *job = 0;
  cr_expect_eq(sl_job_create(&config, &job), EINVAL);
  cr_expect_null(job);
  config.chaining = -1;
  cr_expect_eq(sl_job_create(&config, &job), EINVAL);
  cr_expect_eq(sl_op_disable_chaining(0), EINVAL);
}

Test(plan, opting_out_after_the_start_is_refused) {
  pipeline p;
  pipeline_build(&p, SL_CHAINING_ALWAYS, false);
  atomic_store(&p.gate.open, 1);
  cr_assert_eq(sl_job_start(p.job), 0, "%s", sl_job_error(p.job));
  cr_expect_eq(sl_op_disable_chaining(p.map), SL_EUSAGE);
  cr_assert_eq(sl_job_wait(p.job), 0, "%s", sl_job_error(p.job));
  sl_job_destroy(p.job);
}

/* ------------------------------------------------------------ failover */

static int same(void *user, const sl_record *in, void *out,
                uint32_t *out_bytes) {
  (void)user;
  memcpy(out, in->data, sizeof(sl_tuple));
  *out_bytes = sizeof(sl_tuple);
  return 0;
}

/* The keyed source's records through a map and a verifying sink (whose
 * key_by edge joins parallelism 1 to 1: chained), checkpointed every
 * 5 ms, with faults and restarts: exactly once, whatever the chaining. */
static void exactly_once_through_faults(int chaining, const char *faults,
                                        uint32_t restarts) {
  char *state = sl_test_temp_dir("chain");
  uint64_t count = 200000, keys = 17;
  sl_job_config config = sl_fixture_config(state, 5);
  config.chaining = chaining;
  config.faults = faults;
  config.restart = sl_restart_defaults(SL_RESTART_FIXED_DELAY);
  config.restart.attempts = 10;
  config.restart.delay_ms = 0;
  sl_job *job = 0;
  sl_op *src, *map, *sink;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  /* Gated: 20,000 records until a checkpoint completed, so the fault at
   * 50,000 always has one to restore (and the restore fault fires). */
  static sl_fixture_gated_source gated;
  gated = (sl_fixture_gated_source){.count = count, .keys = keys,
                                    .gate = 20000};
  cr_assert_eq(sl_op_source(job, "src", 1, &sl_fixture_gated_ops, &gated,
                            &src), 0);
  cr_assert_eq(sl_op_map(job, "map", src, 1, sizeof(sl_tuple), same, 0,
                         &map), 0);
  cr_assert_eq(sl_sink_verify(job, "verify", map, 1, count, keys, &sink), 0);
  int rc = sl_job_run(job);
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  sl_verify_counts c;
  cr_assert_eq(sl_verify_result(sink, &c), 0);
  cr_expect_eq(c.records, count, "records %lu", (unsigned long)c.records);
  cr_expect_eq(c.in_order, count);
  cr_expect_eq(c.lost + c.duplicates + c.out_of_order, 0,
               "lost %lu duplicates %lu out of order %lu",
               (unsigned long)c.lost, (unsigned long)c.duplicates,
               (unsigned long)c.out_of_order);
  cr_expect(c.complete);
  cr_expect_eq(sl_job_restarts(job), restarts);
  sl_job_destroy(job);
  sl_test_remove_tree(state);
}

/* A member fails (the map, in the source's thread), then a member fails
 * its restore: each time the whole chain restarts from the newest
 * checkpoint.  (The head's failures: test_failover at parallelism 1,
 * whose jobs chain by default on a machine of few CPUs.) */
Test(failover, faults_in_members_restart_exactly_once,
     .timeout = 300) {
  exactly_once_through_faults(SL_CHAINING_ALWAYS,
                              "fail:op=map,record=50000;"
                              "restore:op=verify",
                              2);
}

Test(failover, the_same_faults_without_chaining, .timeout = 300) {
  exactly_once_through_faults(SL_CHAINING_NEVER,
                              "fail:op=map,record=50000;"
                              "restore:op=verify",
                              2);
}

/* A failing member names itself, and its runner stops. */
static int fail_at_100(void *user, const sl_record *in, void *out,
                       uint32_t *out_bytes) {
  const sl_tuple *t = in->data;
  if (t->value == 100)
    return -EPROTO;
  return same(user, in, out, out_bytes);
}

Test(failures, a_member_failure_names_the_member) {
  sl_job_config config = {.struct_bytes = sizeof config,
                          .chaining = SL_CHAINING_ALWAYS};
  sl_job *job = 0;
  sl_op *src, *map, *sink;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  cr_assert_eq(sl_source_sequence(job, "src", 1, 1000000, 10, &src), 0);
  cr_assert_eq(sl_op_map(job, "picky", src, 1, sizeof(sl_tuple), fail_at_100,
                         0, &map), 0);
  sl_checksum sum = {0};
  cr_assert_eq(sl_sink_checksum(job, "sum", map, 1, &sum, &sink), 0);
  cr_expect_eq(sl_job_run(job), -EPROTO);
  cr_expect(strstr(sl_job_error(job), "operator 'picky' instance 0/1") != 0,
            "%s", sl_job_error(job));
  cr_expect_lt(sum.records, 1000000);
  sl_job_destroy(job);
}

/* ------------------------------------------------------------ timers */

/* A keyed process in the middle of a chain registers a processing-time
 * timer 20 ms ahead for each record; its runner (a process of its own
 * that forwards what the push source gives it) then waits for input, and
 * the timer must still fire: wait_loop bounds the runner's sleep by its
 * members' timers (chain_wait_ns).  No records follow, so only that can
 * wake it. */
static int forward(sl_ctx *ctx, void *state, int input, const sl_record *in) {
  (void)state;
  (void)input;
  return sl_emit(ctx, in->data, in->size_bytes);
}

static int64_t wall_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static int arm(sl_ctx *ctx, void *state, int input, const sl_record *in) {
  (void)state;
  (void)input;
  (void)in;
  return sl_timer_register(ctx, SL_PROCESSING_TIME, wall_ms() + 20);
}

static int fired(sl_ctx *ctx, void *state, int domain, int64_t time) {
  (void)state;
  (void)domain;
  sl_tuple t = {.value = (uint64_t)time};
  int rc = sl_ctx_key(ctx, &t.key);
  return rc ? rc : sl_emit(ctx, &t, sizeof t);
}

static atomic_uint_fast64_t timer_outputs;

static int count_output(sl_ctx *ctx, void *state, int input,
                        const sl_record *in) {
  (void)ctx;
  (void)state;
  (void)input;
  (void)in;
  atomic_fetch_add(&timer_outputs, 1);
  return 0;
}

Test(timers, a_member_timer_fires_while_its_runner_waits_for_input,
     .timeout = 120) {
  atomic_store(&timer_outputs, 0);
  sl_job_config config = {.struct_bytes = sizeof config,
                          .chaining = SL_CHAINING_ALWAYS};
  sl_job *job = 0;
  sl_op *src, *head, *key, *timers, *sink;
  sl_push *push = 0;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  cr_assert_eq(sl_source_push(job, "push", 0, &src, &push), 0);
  cr_assert_eq(sl_op_disable_chaining(src), 0); /* the head waits, not it */
  static const sl_process_ops forward_ops = {.process = forward};
  cr_assert_eq(sl_op_process(job, "head", &src, 1, 1, &forward_ops, 0, &head),
               0);
  cr_assert_eq(sl_op_key_by(job, "key", head, sl_fixture_tuple_key, 0, &key),
               0);
  static const sl_process_ops timer_ops = {.process = arm, .on_timer = fired};
  cr_assert_eq(sl_op_process(job, "timers", &key, 1, 1, &timer_ops, 0,
                             &timers), 0);
  static const sl_process_ops sink_ops = {.process = count_output};
  cr_assert_eq(sl_op_sink(job, "out", timers, 1, &sink_ops, 0, &sink), 0);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  for (uint64_t k = 0; k < 3; k++) {
    sl_tuple t = {.key = k, .value = k};
    cr_assert_eq(sl_push_record(push, &t, sizeof t, SL_NO_TIMESTAMP), 0);
  }
  for (int i = 0; i < 60000 && atomic_load(&timer_outputs) < 3; i++)
    sleep_ms(1);
  cr_expect_eq(atomic_load(&timer_outputs), 3, "the timers did not fire");
  sl_push_close(push);
  cr_assert_eq(sl_job_wait(job), 0, "%s", sl_job_error(job));
  sl_job_destroy(job);
}
