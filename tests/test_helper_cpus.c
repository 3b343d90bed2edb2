/* test_helper_cpus.c — where threads run.  Suite helper_cpus: the
 * checkpoint coordinator and writer (engine/coordinator.c note 14), on
 * the CPUs of the caller's mask that no instance thread is pinned to,
 * when there are such CPUs and some instance is pinned; else on the
 * caller's mask.  Suite job_cpus: several jobs of one process spread over
 * the CPUs instead of all beginning on the first (engine/cpus.c note 8).
 *
 * A source that emits nothing holds the job running until the test has
 * read the threads' masks (sched_getaffinity of the thread found by its
 * name in /proc/self/task/N/comm); nothing waits for a time to pass
 * except the bounded polls for a thread to appear. */
#include <criterion/criterion.h>
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#include "fixtures.h"
#include "sluice.h"
#include "test_dirs.h"

#define THREAD_POLLS 10000 /* 1 ms apart: a thread appears in 10 s */

static void sleep_ms(long ms) {
  struct timespec t = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};
  nanosleep(&t, 0);
}

/* The id of this process's thread named `name`, or 0 if there is none. */
static pid_t thread_named(const char *name) {
  pid_t tid = 0;
  int rc = sl_fixture_thread_named(name, &tid);
  cr_assert_eq(rc, 0, "cannot list /proc/self/task: %s", strerror(rc));
  return tid;
}

/* The CPU mask of the thread named `name`, once it has that name. */
static cpu_set_t mask_of(const char *name) {
  pid_t tid = 0;
  for (int i = 0; i < THREAD_POLLS && !(tid = thread_named(name)); i++)
    sleep_ms(1);
  cr_assert(tid, "no thread named %s", name);
  cpu_set_t set;
  cr_assert_eq(sched_getaffinity(tid, sizeof set, &set), 0, "%s: %s", name,
               strerror(errno));
  return set;
}

/* ------------------------------------------------------------- the job */

static atomic_int release_source; /* the test lets the source end */

static int idle_next(sl_ctx *ctx, void *state) {
  (void)ctx;
  (void)state;
  if (atomic_load(&release_source))
    return SL_SOURCE_END;
  sleep_ms(1); /* next() returns: the engine may checkpoint */
  return 0;
}

static const sl_source_ops idle_ops = {.next = idle_next};

static int drop_process(sl_ctx *ctx, void *state, int input,
                        const sl_record *in) {
  (void)ctx;
  (void)state;
  (void)input;
  (void)in;
  return 0;
}

static const sl_process_ops drop_ops = {.process = drop_process};

/* Start source -> sink with checkpoints under config (its state_dir set
 * here), check the coordinator's and the writer's masks are `expected`,
 * then end the job. */
static void expect_helper_masks(sl_job_config config,
                                const cpu_set_t *expected) {
  char *dir = sl_test_temp_dir("helper-cpus");
  config.checkpoint.state_dir = dir;
  config.checkpoint.interval_ms = 50;
  config.checkpoint.no_sync = 1;
  atomic_store(&release_source, 0);
  sl_job *job = 0;
  sl_op *source, *sink;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  cr_assert_eq(sl_op_source(job, "idle", 1, &idle_ops, 0, &source), 0);
  cr_assert_eq(sl_op_sink(job, "drop", source, 1, &drop_ops, 0, &sink), 0);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  const char *names[] = {"sl:writer", "sl:coordinator"};
  for (int n = 0; n < 2; n++) {
    cpu_set_t got = mask_of(names[n]);
    cr_expect(CPU_EQUAL(&got, expected), "%s: %d CPUs, expected %d",
              names[n], CPU_COUNT(&got), CPU_COUNT(expected));
  }
  atomic_store(&release_source, 1);
  cr_assert_eq(sl_job_wait(job), 0, "%s", sl_job_error(job));
  sl_job_destroy(job);
  sl_test_remove_tree(dir);
}

static cpu_set_t own_mask(void) {
  cpu_set_t set;
  cr_assert_eq(sched_getaffinity(0, sizeof set, &set), 0);
  return set;
}

static int first_cpu(const cpu_set_t *set) {
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, set))
      return c;
  cr_assert_fail("an empty CPU mask");
  return -1;
}

Test(helper_cpus, off_the_cpu_every_instance_is_pinned_to) {
  cpu_set_t mask = own_mask();
  int pinned[] = {first_cpu(&mask)};
  sl_job_config config = SL_JOB_CONFIG_INIT;
  config.cpus = pinned;
  config.cpu_count = 1;
  cpu_set_t expected = mask;
  if (CPU_COUNT(&mask) > 1) /* else no CPU is left: the caller's mask */
    CPU_CLR(pinned[0], &expected);
  expect_helper_masks(config, &expected);
}

Test(helper_cpus, the_callers_mask_when_nothing_is_pinned) {
  cpu_set_t mask = own_mask();
  sl_job_config config = SL_JOB_CONFIG_INIT;
  config.no_pinning = 1;
  expect_helper_masks(config, &mask);
}

Test(helper_cpus, the_callers_mask_when_every_cpu_has_an_instance) {
  /* Both instances on one CPU, and the test confined to that CPU. */
  cpu_set_t mask = own_mask();
  int cpu = first_cpu(&mask);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  cr_assert_eq(sched_setaffinity(0, sizeof one, &one), 0);
  int pinned[] = {cpu};
  sl_job_config config = SL_JOB_CONFIG_INIT;
  config.cpus = pinned;
  config.cpu_count = 1;
  expect_helper_masks(config, &one);
  cr_assert_eq(sched_setaffinity(0, sizeof mask, &mask), 0);
}

/* ------------------------------------------- several jobs (job_cpus) */

/* idle_next, but ended by the flag its user pointer (its state) points
 * to, one per job. */
static int flag_next(sl_ctx *ctx, void *state) {
  (void)ctx;
  if (atomic_load((atomic_int *)state))
    return SL_SOURCE_END;
  sleep_ms(1);
  return 0;
}

static const sl_source_ops flag_ops = {.next = flag_next};

/* Source (user pointer: an atomic_int that ends it) -> `maps` maps ->
 * sink, under chaining (SL_CHAINING_*), pinned by the mask.  Operators
 * are named PREFIX_src, PREFIX_m0.., PREFIX_sink, so their threads are
 * "sl:PREFIX_src[0]" and so on. */
static sl_job *start_idle_job(const char *prefix, int maps, int chaining,
                              const int *cpus, int cpu_count,
                              atomic_int *release) {
  sl_job_config config = SL_JOB_CONFIG_INIT;
  config.chaining = chaining;
  config.cpus = cpus;
  config.cpu_count = cpu_count;
  atomic_store(release, 0);
  sl_job *job = 0;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  char name[32];
  sl_op *op;
  snprintf(name, sizeof name, "%s_src", prefix);
  cr_assert_eq(sl_op_source(job, name, 1, &flag_ops, release, &op), 0);
  for (int m = 0; m < maps; m++) {
    snprintf(name, sizeof name, "%s_m%d", prefix, m);
    sl_op *input = op;
    cr_assert_eq(sl_op_process(job, name, &input, 1, 1, &drop_ops, 0, &op), 0);
  }
  snprintf(name, sizeof name, "%s_sink", prefix);
  cr_assert_eq(sl_op_sink(job, name, op, 1, &drop_ops, 0, &op), 0);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  return job;
}

static void end_idle_job(sl_job *job, atomic_int *release) {
  atomic_store(release, 1);
  cr_assert_eq(sl_job_wait(job), 0, "%s", sl_job_error(job));
  sl_job_destroy(job);
}

/* The one CPU the thread named `name` is pinned to. */
static int pinned_cpu(const char *name) {
  cpu_set_t set = mask_of(name);
  cr_assert_eq(CPU_COUNT(&set), 1, "%s is not pinned to one CPU", name);
  return first_cpu(&set);
}

/* The first two CPUs of the caller's mask; skips the test on one CPU. */
static void two_cpus(int *first, int *second) {
  cpu_set_t mask = own_mask();
  if (CPU_COUNT(&mask) < 2)
    cr_skip_test("one CPU in the mask: nothing to spread over");
  *first = first_cpu(&mask);
  CPU_CLR(*first, &mask);
  *second = first_cpu(&mask);
}

Test(job_cpus, a_second_job_starts_on_the_cpu_the_first_left_free) {
  int c0, c1;
  two_cpus(&c0, &c1);
  static atomic_int ra, rb, rc;
  /* One thread each: source and sink chained. */
  sl_job *a = start_idle_job("a", 0, SL_CHAINING_ALWAYS, 0, 0, &ra);
  cr_expect_eq(pinned_cpu("sl:a_src[0]"), c0);
  sl_job *b = start_idle_job("b", 0, SL_CHAINING_ALWAYS, 0, 0, &rb);
  cr_expect_eq(pinned_cpu("sl:b_src[0]"), c1, "both jobs began on CPU %d",
               c0);
  end_idle_job(a, &ra); /* gives c0 back */
  sl_job *c = start_idle_job("c", 0, SL_CHAINING_ALWAYS, 0, 0, &rc);
  cr_expect_eq(pinned_cpu("sl:c_src[0]"), c0);
  end_idle_job(b, &rb);
  end_idle_job(c, &rc);
}

Test(job_cpus, a_job_goes_where_the_busiest_cpu_stays_least_busy) {
  int c0, c1;
  two_cpus(&c0, &c1);
  cpu_set_t mask = own_mask();
  if (CPU_COUNT(&mask) != 2)
    cr_skip_test("the blocks below are those of 2 CPUs");
  static atomic_int ra, rb;
  /* Three threads in blocks over two CPUs: two on c0, one on c1. */
  sl_job *a = start_idle_job("a", 1, SL_CHAINING_NEVER, 0, 0, &ra);
  cr_expect_eq(pinned_cpu("sl:a_src[0]"), c0);
  cr_expect_eq(pinned_cpu("sl:a_m0[0]"), c0);
  cr_expect_eq(pinned_cpu("sl:a_sink[0]"), c1);
  /* One thread more: c1, where it makes two and two. */
  sl_job *b = start_idle_job("b", 0, SL_CHAINING_ALWAYS, 0, 0, &rb);
  cr_expect_eq(pinned_cpu("sl:b_src[0]"), c1);
  end_idle_job(b, &rb);
  end_idle_job(a, &ra);
}

Test(job_cpus, a_listed_cpu_is_counted_and_kept_as_listed) {
  int c0, c1;
  two_cpus(&c0, &c1);
  static atomic_int ra, rb, rc;
  int listed[] = {c0};
  sl_job *a = start_idle_job("a", 0, SL_CHAINING_ALWAYS, listed, 1, &ra);
  cr_expect_eq(pinned_cpu("sl:a_src[0]"), c0);
  sl_job *b = start_idle_job("b", 0, SL_CHAINING_ALWAYS, 0, 0, &rb);
  cr_expect_eq(pinned_cpu("sl:b_src[0]"), c1, "the listed CPU was not counted");
  /* A list is kept as given, even onto the busier CPU. */
  sl_job *c = start_idle_job("c", 0, SL_CHAINING_ALWAYS, listed, 1, &rc);
  cr_expect_eq(pinned_cpu("sl:c_src[0]"), c0);
  end_idle_job(a, &ra);
  end_idle_job(b, &rb);
  end_idle_job(c, &rc);
}
