/* tsan_failover_stress.c — in-process failover under ThreadSanitizer (plain
 * C: Criterion 2.4 aborts under TSan).  A keyed counting job takes a
 * checkpoint every 2 ms while injected faults of several kinds fail it
 * again and again: random record failures, failed snapshots and writes, a
 * failed store commit.  The supervisor restarts it each time (its threads
 * are joined, rings emptied, state restored on the instance threads in
 * parallel, while a second thread reads the job's statistics), and the
 * verifying sink must find the committed run exactly-once.  Then a stop
 * by the user while a restart waits.  Exit 0 on success, 1 with a
 * message. */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fixtures.h"
#include "sluice.h"
#include "sluice_testing.h" /* unstable test helpers */
#include "stress_check.h"

#define RECORDS 200000u
#define KEYS 300u

/* A running count per key in keyed state; the tuple goes on unchanged. */
static int count(sl_ctx *ctx, void *state, int input, const sl_record *in) {
  (void)state;
  (void)input;
  uint64_t c;
  int rc = sl_fixture_state_add(ctx, 1, &c);
  return rc ? rc : sl_emit(ctx, in->data, in->size_bytes);
}

static char *temp_dir(void) {
  char *dir = strdup("/tmp/sluice-tsan-fo-XXXXXX");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    exit(1);
  }
  return dir;
}

static void remove_tree(char *dir) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0)
    fprintf(stderr, "cannot remove %s\n", dir);
  free(dir);
}

static sl_job *build(const char *state, const char *faults,
                     struct sl_restart_config restart, sl_op **verify) {
  sl_job_config c = sl_fixture_config(state, 2);
  c.restart = restart;
  c.faults = faults;
  sl_job *job;
  if (sl_job_create(&c, &job) != 0) {
    fprintf(stderr, "sl_job_create failed\n");
    exit(1);
  }
  sl_op *src, *by, *counted;
  static const sl_process_ops ops = {.process = count};
  int rc = sl_source_keyed(job, "source", 2, RECORDS, KEYS, &src);
  if (!rc)
    rc = sl_op_key_by(job, "by-key", src, sl_fixture_tuple_key, 0, &by);
  if (!rc)
    rc = sl_op_process(job, "count", &by, 1, 2, &ops, 0, &counted);
  if (!rc)
    rc = sl_sink_verify(job, "verify", counted, 2, RECORDS, KEYS, verify);
  if (rc) {
    fprintf(stderr, "building the job: %s\n", sl_strerror(rc));
    exit(1);
  }
  return job;
}

/* Reads statistics while the job restarts (the readers' side of the
 * history locks and atomics). */
typedef struct watcher {
  sl_job *job;
  atomic_int done;
  uint64_t reads;
} watcher;

static void *watch(void *arg) {
  watcher *w = arg;
  while (!atomic_load(&w->done)) {
    sl_recovery_stats r;
    sl_checkpoint_stats cs;
    (void)sl_job_recovery_stats(w->job, 0, &r);
    (void)sl_job_checkpoint_stats(w->job, 0, &cs);
    (void)sl_job_restarts(w->job);
    (void)sl_job_faults_fired(w->job);
    (void)sl_job_progress(w->job);
    uint64_t from;
    (void)sl_job_last_checkpoint(w->job, &from);
    w->reads++;
    struct timespec t = {.tv_sec = 0, .tv_nsec = 200000};
    nanosleep(&t, 0);
  }
  return 0;
}

static void many_failovers(void) {
  char *state = temp_dir();
  struct sl_restart_config r = sl_restart_defaults(SL_RESTART_FIXED_DELAY);
  r.attempts = 1000;
  r.delay_ms = 0;
  sl_op *verify;
  sl_job *job = build(state,
                      "fail:op=count,prob=0.0002,seed=3,times=12;"
                      "snapshot:op=count,nth=5;write:nth=9;"
                      "store:call=commit,error=EIO,nth=14",
                      r, &verify);
  watcher w = {.job = job};
  pthread_t t;
  CHECK(sl_job_start(job) == 0, "start: %s", sl_job_error(job));
  pthread_create(&t, 0, watch, &w);
  int rc = sl_job_wait(job);
  atomic_store(&w.done, 1);
  pthread_join(t, 0);
  CHECK(rc == 0, "the job failed: %s", sl_job_error(job));
  uint32_t restarts = sl_job_restarts(job);
  uint64_t fired = sl_job_faults_fired(job);
  CHECK(restarts == fired && restarts >= 4,
        "%" PRIu32 " restarts for %" PRIu64 " faults", restarts, fired);
  sl_verify_counts v;
  CHECK(sl_verify_result(verify, &v) == 0 && v.complete, "verifier");
  CHECK(v.lost == 0 && v.duplicates == 0 && v.out_of_order == 0 &&
            v.records == RECORDS,
        "%" PRIu64 " records, %" PRIu64 " lost, %" PRIu64 " duplicates, %"
        PRIu64 " out of order", v.records, v.lost, v.duplicates,
        v.out_of_order);
  printf("failovers: %" PRIu32 " restarts, %" PRIu64 " statistics reads\n",
         restarts, w.reads);
  sl_job_destroy(job);
  remove_tree(state);
}

static void stop_while_waiting(void) {
  char *state = temp_dir();
  struct sl_restart_config r = sl_restart_defaults(SL_RESTART_FIXED_DELAY);
  r.attempts = 5;
  r.delay_ms = 60000;
  sl_op *verify;
  sl_job *job = build(state, "fail:op=count,record=50", r, &verify);
  CHECK(sl_job_start(job) == 0, "start: %s", sl_job_error(job));
  sl_recovery_stats rs;
  for (int i = 0; i < 20000 && sl_job_recovery_stats(job, 0, &rs) != 0; i++)
    usleep(500);
  sl_job_stop(job);
  int rc = sl_job_wait(job);
  CHECK(rc != 0 && strstr(sl_job_error(job), "stopped while waiting"),
        "stop during the delay: %d, %s", rc, sl_job_error(job));
  sl_job_destroy(job);
  remove_tree(state);
}

int main(void) {
  many_failovers();
  stop_while_waiting();
  if (failures)
    fprintf(stderr, "%d check(s) failed\n", failures);
  return failures ? 1 : 0;
}
