/* tsan_checkpoint_stress.c — checkpointing under ThreadSanitizer (plain C:
 * Criterion 2.4 aborts under TSan).  A keyed counting job with keyed state
 * takes a checkpoint every 2 ms (the writer serializes frozen deltas while
 * the instances keep writing), is stopped twice and resumed, and must end
 * with exactly the running counts of an uninterrupted run; then the same in
 * at-least-once mode with a check that nothing was lost.  Exit 0 on success,
 * 1 with a message. */
#include <errno.h>
#include <inttypes.h>
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
#define KEYS 500u

/* The running count per key is the shared fixture
 * (sl_fixture_count_process); the sink keeps, per key, the highest count
 * it saw. */
typedef struct seen {
  uint64_t max[KEYS];
} seen;

/* The sink's operator state is its table: restored on resume. */
static int sink_open(sl_ctx *ctx, void *user, void **state) {
  (void)ctx;
  (void)user;
  seen *s = calloc(1, sizeof *s);
  if (!s)
    return -ENOMEM;
  *state = s;
  return 0;
}

static int sink_process(sl_ctx *ctx, void *state, int input,
                        const sl_record *in) {
  (void)ctx;
  (void)input;
  seen *s = state;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  if (t.key >= KEYS)
    return -EINVAL;
  if (t.value > s->max[t.key])
    s->max[t.key] = t.value;
  return 0;
}

static int sink_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  return sl_operator_state_set(ctx, state, sizeof(seen));
}

static int sink_restore(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  const void *data;
  uint32_t bytes;
  if (sl_operator_state_get(ctx, &data, &bytes) == 0 && bytes == sizeof(seen))
    memcpy(state, data, sizeof(seen));
  return 0;
}

static seen *final_table;

static void sink_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  if (final_table)
    memcpy(final_table, state, sizeof(seen));
  free(state);
}

static int run(const char *dir, int mode, int policy, unsigned stop_after_ms,
               seen *result) {
  sl_job_config config = SL_JOB_CONFIG_INIT;
  config.ring_bytes = 8192;
  config.checkpoint.state_dir = dir;
  config.checkpoint.interval_ms = 2;
  config.checkpoint.no_sync = 1;
  config.checkpoint.mode = mode;
  config.checkpoint.store_policy = policy;
  config.checkpoint.tolerable_failures = 1000;
  sl_job *job;
  if (sl_job_create(&config, &job))
    return -1;
  sl_op *src, *by, *counter, *sink;
  static const sl_process_ops count_ops = {.process = sl_fixture_count_process};
  static const sl_process_ops sink_ops = {.open = sink_open,
                                          .process = sink_process,
                                          .snapshot = sink_snapshot,
                                          .restore = sink_restore,
                                          .close = sink_close};
  int rc = sl_source_sequence(job, "source", 2, RECORDS, KEYS, &src);
  if (!rc)
    rc = sl_op_key_by(job, "by", src, sl_fixture_tuple_key, 0, &by);
  if (!rc)
    rc = sl_op_process(job, "count", &by, 1, 3, &count_ops, 0, &counter);
  if (!rc)
    rc = sl_op_sink(job, "sink", counter, 1, &sink_ops, 0, &sink);
  final_table = result;
  if (!rc)
    rc = sl_job_start(job);
  if (!rc && stop_after_ms) {
    struct timespec t = {0, (long)stop_after_ms * 1000000L};
    nanosleep(&t, 0);
    sl_job_stop(job);
  }
  if (!rc)
    rc = sl_job_wait(job);
  if (rc && rc != SL_ESTOPPED)
    fprintf(stderr, "job: %s\n", sl_job_error(job));
  sl_job_destroy(job);
  return rc;
}

static void scenario(int mode) {
  char dir[] = "/tmp/sluice-tsan-XXXXXX";
  if (!mkdtemp(dir)) {
    CHECK(0, "mkdtemp: %s", strerror(errno));
    return;
  }
  seen *result = calloc(1, sizeof *result);
  int rc = run(dir, mode, 0, 80, result);
  CHECK(rc == 0 || rc == SL_ESTOPPED, "first run: %d", rc);
  rc = run(dir, mode, SL_STORE_RESUME, 80, result);
  CHECK(rc == 0 || rc == SL_ESTOPPED, "second run: %d", rc);
  rc = run(dir, mode, SL_STORE_RESUME, 0, result);
  CHECK(rc == 0, "last run: %d", rc);
  uint64_t wrong = 0;
  for (unsigned k = 0; k < KEYS; k++) {
    uint64_t want = RECORDS / KEYS;
    /* Exactly-once: the counts are exact; at-least-once: never below. */
    wrong += mode == SL_EXACTLY_ONCE ? result->max[k] != want
                                     : result->max[k] < want;
  }
  CHECK(wrong == 0, "mode %d: %" PRIu64 " keys with a wrong count", mode,
        wrong);
  free(result);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0, "cleanup");
}

int main(void) {
  scenario(SL_EXACTLY_ONCE);
  scenario(SL_AT_LEAST_ONCE);
  if (failures)
    return 1;
  puts("checkpoint stress: ok");
  return 0;
}
