/* test_helper_cpus.c — where the checkpoint coordinator and writer run
 * (engine/coordinator.c note 14): on the CPUs of the caller's mask that
 * no instance thread is pinned to, when there are such CPUs and some
 * instance is pinned; else on the caller's mask.
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
