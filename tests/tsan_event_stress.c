/* tsan_event_stress.c — event time under ThreadSanitizer (plain C: Criterion
 * 2.4 aborts under TSan).  Two parallel sources with periodic watermarks
 * (one goes idle for a while), a union into a keyed event-time window with
 * a late side output and processing-time timers, small rings and more
 * threads than cores; then the same with checkpoints and a failover.
 * Checks that every record is accounted for: in a window or late.  Exit 0
 * on success, 1 with a message. */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sluice.h"
#include "stress_check.h"

typedef struct rec {
  uint64_t key;
  uint64_t value;
} rec;

typedef struct src_state {
  uint64_t next, end;
  int idle_from; /* instance 1 pauses once it reaches this record */
} src_state;

#define PER_INSTANCE 40000u

static int src_open(sl_ctx *ctx, void *user, void **state) {
  (void)user;
  src_state *s = calloc(1, sizeof *s);
  if (!s)
    return -ENOMEM;
  s->next = (uint64_t)sl_ctx_instance(ctx) * PER_INSTANCE;
  s->end = s->next + PER_INSTANCE;
  *state = s;
  return 0;
}

static int src_next(sl_ctx *ctx, void *state) {
  src_state *s = state;
  if (sl_ctx_instance(ctx) == 1 && s->next == s->end - PER_INSTANCE / 2 &&
      !s->idle_from) {
    s->idle_from = 1;
    struct timespec t = {.tv_sec = 0, .tv_nsec = 30 * 1000000};
    nanosleep(&t, 0); /* idle for longer than the idle timeout */
    return 0;
  }
  for (int k = 0; k < 100 && s->next < s->end; k++, s->next++) {
    uint64_t i = s->next % PER_INSTANCE;
    rec r = {.key = s->next % 17, .value = s->next};
    /* Event time: i, with every 50th record 400 behind (late). */
    int64_t ts = (int64_t)i - (i % 50 == 0 ? 400 : (int64_t)(i % 7));
    int rc = sl_emit_ts(ctx, &r, sizeof r, ts);
    if (rc)
      return rc;
  }
  return s->next == s->end ? SL_SOURCE_END : 0;
}

static int src_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  src_state *s = state;
  return sl_operator_state_set(ctx, &s->next, 8);
}

static int src_restore(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  src_state *s = state;
  const void *d;
  uint32_t n;
  if (sl_operator_state_get(ctx, &d, &n) == 0 && n == 8)
    memcpy(&s->next, d, 8);
  return 0;
}

static void src_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  free(state);
}

static const sl_source_ops src_ops = {.open = src_open, .next = src_next,
                                      .close = src_close,
                                      .snapshot = src_snapshot,
                                      .restore = src_restore};

static uint64_t key_of(void *user, const sl_record *in) {
  (void)user;
  return ((const rec *)in->data)->key;
}

static void acc_init(void *user, void *acc) {
  (void)user;
  memset(acc, 0, 16);
}
static void acc_add(void *user, void *acc, const sl_record *in) {
  (void)user;
  uint64_t *a = acc;
  a[0] += 1;
  a[1] += ((const rec *)in->data)->value;
}
static int acc_emit(void *user, sl_ctx *ctx, uint64_t key,
                    const sl_window *w, const void *acc) {
  (void)user;
  (void)key;
  (void)w;
  return sl_emit(ctx, acc, 16);
}

/* Per sink instance, overwritten at each close: after a failover the
 * last attempt's (restored, then completed) sums stand. */
typedef struct totals {
  _Atomic uint64_t windowed[2], windowed_sum[2], late, late_sum;
} totals;

/* The sinks keep their sums as operator state, so a failover leaves the
 * committed totals. */
typedef struct sink_state {
  totals *t;
  int late;
  uint64_t count, sum;
} sink_state;

static int sink_open(sl_ctx *ctx, void *user, void **state) {
  (void)ctx;
  sink_state *s = calloc(1, sizeof *s);
  if (!s)
    return -ENOMEM;
  *s = *(sink_state *)user;
  *state = s;
  return 0;
}

static int sink_process(sl_ctx *ctx, void *state, int input,
                        const sl_record *in) {
  (void)ctx;
  (void)input;
  sink_state *s = state;
  if (s->late) {
    s->count++;
    s->sum += ((const rec *)in->data)->value;
  } else {
    const uint64_t *a = in->data;
    s->count += a[0];
    s->sum += a[1];
  }
  return 0;
}

static int sink_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  sink_state *s = state;
  uint64_t v[2] = {s->count, s->sum};
  return sl_operator_state_set(ctx, v, sizeof v);
}

static int sink_restore(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  sink_state *s = state;
  const void *d;
  uint32_t n;
  if (sl_operator_state_get(ctx, &d, &n) == 0 && n == 16) {
    uint64_t v[2];
    memcpy(v, d, 16);
    s->count = v[0];
    s->sum = v[1];
  }
  return 0;
}

static void sink_close(sl_ctx *ctx, void *state) {
  sink_state *s = state;
  if (s->late) {
    atomic_store(&s->t->late, s->count);
    atomic_store(&s->t->late_sum, s->sum);
  } else {
    atomic_store(&s->t->windowed[sl_ctx_instance(ctx)], s->count);
    atomic_store(&s->t->windowed_sum[sl_ctx_instance(ctx)], s->sum);
  }
  free(s);
}

static const sl_process_ops sink_ops = {.open = sink_open,
                                        .process = sink_process,
                                        .snapshot = sink_snapshot,
                                        .restore = sink_restore,
                                        .close = sink_close};

static void run(const char *state_dir) {
  sl_job_config c = {.struct_bytes = sizeof(sl_job_config), .ring_bytes = 8192, .spin_iterations = 1,
                     .output_batch_records = 16};
  if (state_dir) {
    c.checkpoint.state_dir = state_dir;
    c.checkpoint.interval_ms = 10;
    c.checkpoint.no_sync = 1;
    c.checkpoint.store_policy = SL_STORE_FRESH;
    c.restart = sl_restart_defaults(SL_RESTART_FIXED_DELAY);
    c.restart.attempts = 3;
    c.restart.delay_ms = 0;
    c.faults = "fail:op=win,instance=1,record=9000";
  }
  sl_job *job = 0;
  int rc = sl_job_create(&c, &job);
  CHECK(rc == 0, "create: %s", sl_strerror(rc));
  totals t = {0};
  sink_state main_user = {.t = &t}, late_user = {.t = &t, .late = 1};
  sl_op *s, *k, *w, *late, *o1, *o2;
  rc = sl_op_source(job, "src", 2, &src_ops, 0, &s);
  sl_watermark_config wc = {.out_of_orderness = 10, .interval_ms = 1,
                            .idle_timeout_ms = 5};
  if (!rc)
    rc = sl_op_watermarks(s, &wc);
  if (!rc)
    rc = sl_op_key_by(job, "k", s, key_of, 0, &k);
  sl_window_config win = {.type = SL_WINDOW_SLIDING, .size = 200,
                          .slide = 100, .late_port = 1, .acc_bytes = 16,
                          .init = acc_init, .add = acc_add, .emit = acc_emit};
  if (!rc)
    rc = sl_op_window(job, "win", k, 3, &win, &w);
  if (!rc)
    rc = sl_op_side_output(job, "late", w, 1, &late);
  if (!rc)
    rc = sl_op_sink(job, "out", w, 2, &sink_ops, &main_user, &o1);
  if (!rc)
    rc = sl_op_sink(job, "late-out", late, 1, &sink_ops, &late_user, &o2);
  CHECK(rc == 0, "build: %s (%s)", sl_strerror(rc), sl_job_error(job));
  rc = sl_job_run(job);
  CHECK(rc == 0, "run: %s (%s)", sl_strerror(rc), sl_job_error(job));
  /* Each record is in two sliding windows unless it is late (then in
   * none; a record late for one of its windows only is not counted late
   * and is in one window). */
  uint64_t n = 2ull * PER_INSTANCE;
  uint64_t all_sum = n * (n - 1) / 2;
  uint64_t windowed = atomic_load(&t.windowed[0]) + atomic_load(&t.windowed[1]);
  uint64_t late_n = atomic_load(&t.late);
  CHECK(late_n > 0, "some records were late");
  CHECK(windowed + 2 * late_n >= n && windowed + 2 * late_n <= 2 * n,
        "windowed %" PRIu64 " + 2 x late %" PRIu64 " within n .. 2n (n %"
        PRIu64 ")", windowed, late_n, n);
  CHECK(atomic_load(&t.windowed_sum[0]) + atomic_load(&t.windowed_sum[1]) +
                atomic_load(&t.late_sum) <= 2 * all_sum,
        "sums bounded");
  if (state_dir)
    CHECK(sl_job_restarts(job) == 1, "one restart, got %u",
          sl_job_restarts(job));
  sl_job_destroy(job);
}

int main(void) {
  run(0);
  char dir[] = "/tmp/sluice-tsan-event-XXXXXX";
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  run(dir);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0)
    failures++;
  if (failures) {
    fprintf(stderr, "tsan_event_stress: %d checks failed\n", failures);
    return 1;
  }
  printf("tsan_event_stress: ok\n");
  return 0;
}
