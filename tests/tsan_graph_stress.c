/* tsan_graph_stress.c — whole jobs under ThreadSanitizer (plain C: Criterion
 * 2.4 aborts under TSan).  Runs keyed, rebalanced, fan-out, union and
 * two-input jobs with many more threads than cores and small rings so that
 * threads park constantly, a stop from another thread, and a failing
 * operator; checks every result.  Exit 0 on success, 1 with a message. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fixtures.h"
#include "sluice.h"
#include "sluice_testing.h" /* unstable test helpers */
#include "stress_check.h"

static int add_one(void *user, const sl_record *in, void *out, uint32_t *size) {
  (void)user;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  t.value += 1;
  memcpy(out, &t, sizeof t);
  *size = sizeof t;
  return 0;
}

/* Expected checksum of the sequence 0..n-1 with key i % keys, values + add. */
static sl_checksum expected_sequence(uint64_t n, uint64_t keys, uint64_t add) {
  sl_checksum sum = {0};
  for (uint64_t i = 0; i < n; i++) {
    sl_tuple t = {.key = i % keys, .value = i + add};
    sl_checksum_add(&sum, &t, sizeof t);
  }
  return sum;
}

static void check_sum(const char *what, const sl_checksum *got,
                      const sl_checksum *want) {
  CHECK(got->records == want->records && got->hash_sum == want->hash_sum &&
            got->value_sum == want->value_sum,
        "%s: got %" PRIu64 " records (hash %" PRIx64 "), want %" PRIu64
        " (hash %" PRIx64 ")",
        what, got->records, got->hash_sum, want->records, want->hash_sum);
}

static sl_job *small_job(void) {
  sl_job_config c = {.struct_bytes = sizeof(sl_job_config), .ring_bytes = 4096, .spin_iterations = 1,
                     .output_batch_records = 16};
  sl_job *job = 0;
  int rc = sl_job_create(&c, &job);
  CHECK(rc == 0, "sl_job_create: %s", sl_strerror(rc));
  return job;
}

/* source x3 -> map x2 (rebalance) -> key_by -> sink x4, plus a fan-out sink */
static void keyed_and_fan_out(void) {
  const uint64_t n = 600000, keys = 1000;
  sl_job *job = small_job();
  sl_op *src, *map, *by_key, *sink, *fan;
  sl_checksum keyed = {0}, direct = {0};
  int rc = sl_source_sequence(job, "src", 3, n, keys, &src);
  rc = rc ? rc : sl_op_map(job, "map", src, 2, 16, add_one, 0, &map);
  rc = rc ? rc
          : sl_op_key_by(job, "by-key", map, sl_fixture_tuple_key, 0, &by_key);
  rc = rc ? rc : sl_sink_checksum(job, "keyed", by_key, 4, &keyed, &sink);
  rc = rc ? rc : sl_sink_checksum(job, "direct", src, 1, &direct, &fan);
  rc = rc ? rc : sl_job_run(job);
  CHECK(rc == 0, "keyed job: %s: %s", sl_strerror(rc), sl_job_error(job));
  sl_checksum want_keyed = expected_sequence(n, keys, 1);
  sl_checksum want_direct = expected_sequence(n, keys, 0);
  check_sum("keyed", &keyed, &want_keyed);
  check_sum("fan-out", &direct, &want_direct);
  sl_job_destroy(job);
}

/* Two sources into a two-input operator that forwards both, then a union. */
static int forward_any(sl_ctx *ctx, void *state, int input,
                       const sl_record *in) {
  (void)state;
  (void)input;
  return sl_emit(ctx, in->data, in->size_bytes);
}

static void two_inputs_and_union(void) {
  const uint64_t n = 300000;
  sl_job *job = small_job();
  sl_op *a, *b, *co, *u, *sink, *c;
  sl_op *pair[2];
  sl_checksum got = {0};
  static const sl_process_ops forward = {.process = forward_any};
  int rc = sl_source_sequence(job, "a", 2, n, 7, &a);
  rc = rc ? rc : sl_source_sequence(job, "b", 1, n, 7, &b);
  pair[0] = a;
  pair[1] = b;
  rc = rc ? rc : sl_op_process(job, "co", pair, 2, 3, &forward, 0, &co);
  rc = rc ? rc : sl_source_sequence(job, "c", 1, n, 7, &c);
  pair[0] = co;
  pair[1] = c;
  rc = rc ? rc : sl_op_union(job, "u", pair, 2, &u);
  rc = rc ? rc : sl_sink_checksum(job, "sink", u, 2, &got, &sink);
  rc = rc ? rc : sl_job_run(job);
  CHECK(rc == 0, "two-input job: %s: %s", sl_strerror(rc), sl_job_error(job));
  sl_checksum one = expected_sequence(n, 7, 0);
  sl_checksum want = {.records = 3 * one.records,
                      .bytes = 3 * one.bytes,
                      .value_sum = 3 * one.value_sum,
                      .hash_sum = 3 * one.hash_sum};
  check_sum("two-input + union", &got, &want);
  sl_job_destroy(job);
}

/* An endless source stopped from another thread. */
static int endless_next(sl_ctx *ctx, void *state) {
  uint64_t *i = state;
  for (int k = 0; k < 256; k++, (*i)++) {
    sl_tuple t = {.key = *i, .value = *i};
    int rc = sl_emit(ctx, &t, sizeof t);
    if (rc)
      return rc;
  }
  return 0;
}

static void *stop_later(void *arg) {
  struct timespec d = {0, 100 * 1000 * 1000};
  nanosleep(&d, 0);
  sl_job_stop(arg);
  return 0;
}

static void stop_from_other_thread(void) {
  sl_job *job = small_job();
  uint64_t position = 0;
  sl_op *src, *map, *sink;
  sl_checksum got = {0};
  static const sl_source_ops endless = {.next = endless_next};
  int rc = sl_op_source(job, "endless", 1, &endless, &position, &src);
  rc = rc ? rc : sl_op_map(job, "map", src, 2, 16, add_one, 0, &map);
  rc = rc ? rc : sl_sink_checksum(job, "sink", map, 1, &got, &sink);
  rc = rc ? rc : sl_job_start(job);
  CHECK(rc == 0, "start: %s", sl_strerror(rc));
  pthread_t t;
  pthread_create(&t, 0, stop_later, job);
  rc = sl_job_wait(job);
  pthread_join(t, 0);
  CHECK(rc == SL_ESTOPPED, "stop: got %s", sl_strerror(rc));
  sl_job_destroy(job);
}

/* A map failing mid-stream while the source is blocked on full rings. */
static int fail_at_5000(void *user, const sl_record *in, void *out,
                        uint32_t *size) {
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  if (t.value == 5000) {
    (void)user;
    return -EIO;
  }
  memcpy(out, &t, sizeof t);
  *size = sizeof t;
  return 0;
}

static void failure_propagates(void) {
  sl_job *job = small_job();
  sl_op *src, *map, *sink;
  sl_checksum got = {0};
  int rc = sl_source_sequence(job, "src", 1, 10000000, 10, &src);
  rc = rc ? rc : sl_op_map(job, "fails", src, 1, 16, fail_at_5000, 0, &map);
  rc = rc ? rc : sl_sink_checksum(job, "sink", map, 1, &got, &sink);
  rc = rc ? rc : sl_job_run(job);
  CHECK(rc == -EIO, "failure: got %s", sl_strerror(rc)); /* the map's */
  CHECK(strstr(sl_job_error(job), "'fails'") != 0, "message: %s",
        sl_job_error(job));
  sl_job_destroy(job);
}

int main(void) {
  for (int round = 0; round < 3; round++) {
    keyed_and_fan_out();
    two_inputs_and_union();
    stop_from_other_thread();
    failure_propagates();
  }
  if (failures) {
    fprintf(stderr, "tsan_graph_stress: %d checks failed\n", failures);
    return 1;
  }
  printf("tsan_graph_stress: 4 job shapes x 3 rounds passed\n");
  return 0;
}
