/* test_contract.c — the callback contract of sluice.h ("CALLBACK
 * RETURNS"), with real jobs: a callback that returns any nonzero value,
 * a positive errno included, fails the job; sl_job_run returns that value
 * and sl_job_error names the operator.  Before the contract, a positive
 * return from map, process or filter was taken for success (the job ended
 * with 0), and a library call's own positive errno could not be passed
 * through with `return sl_...(...)`.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "sluice.h"
#include "test_util.h"

#define RECORDS 1000

static uint64_t numbers[RECORDS];

/* A job: memory source -> (the operator under test) -> counting sink. */
typedef struct counted {
  _Atomic uint64_t records;
} counted;

static int count_process(sl_ctx *ctx, void *state, int input,
                         const sl_record *in) {
  (void)ctx, (void)input, (void)in;
  counted *c = state;
  atomic_fetch_add(&c->records, 1);
  return 0;
}

static const sl_process_ops count_ops = {.process = count_process};

static sl_job *new_job(sl_op **source) {
  for (uint64_t i = 0; i < RECORDS; i++)
    numbers[i] = i;
  sl_job_config config = SL_JOB_CONFIG_INIT;
  config.no_pinning = 1;
  sl_job *job = 0;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  cr_assert_eq(sl_source_memory(job, "numbers", numbers, sizeof numbers[0],
                                RECORDS, source), 0);
  return job;
}

/* Run job, expect status, and expect its message to name operator and the
 * status's text. */
static void expect_failure(sl_job *job, int status, const char *operator) {
  int rc = sl_job_run(job);
  const char *message = sl_job_error(job);
  cr_assert_eq(rc, status, "run returned %d (%s): %s", rc, sl_strerror(rc),
               message);
  char quoted[64];
  snprintf(quoted, sizeof quoted, "operator '%s'", operator);
  cr_assert(strstr(message, quoted), "no %s in \"%s\"", quoted, message);
  cr_assert(strstr(message, sl_strerror(status)), "no \"%s\" in \"%s\"",
            sl_strerror(status), message);
  /* A failed job stays failed (sluice.h CAVEATS). */
  cr_assert_eq(sl_job_wait(job), status);
  sl_job_destroy(job);
}

static int map_enomem(void *user, const sl_record *in, void *out,
                      uint32_t *out_size_bytes) {
  (void)user, (void)in, (void)out;
  *out_size_bytes = 0;
  return ENOMEM;
}

Test(contract, map_positive_errno_fails_the_job) {
  sl_op *source, *map, *sink;
  counted c = {0};
  sl_job *job = new_job(&source);
  cr_assert_eq(sl_op_map(job, "grow", source, 1, 8, map_enomem, 0, &map), 0);
  cr_assert_eq(sl_op_sink(job, "count", map, 1, &count_ops, &c, &sink), 0);
  expect_failure(job, ENOMEM, "grow");
  cr_assert_eq(atomic_load(&c.records), 0, "a failed map emitted");
}

static int process_enomem(sl_ctx *ctx, void *state, int input,
                          const sl_record *in) {
  (void)ctx, (void)state, (void)input, (void)in;
  return ENOMEM;
}

/* source -> process operator NAME running fn -> sink: fails with status. */
static void expect_process_failure(const char *name,
                                   int (*fn)(sl_ctx *, void *, int,
                                             const sl_record *),
                                   int status) {
  sl_op *source, *process, *sink;
  counted c = {0};
  sl_job *job = new_job(&source);
  const sl_process_ops ops = {.process = fn};
  cr_assert_eq(sl_op_process(job, name, &source, 1, 1, &ops, 0, &process),
               0);
  cr_assert_eq(sl_op_sink(job, "count", process, 1, &count_ops, &c, &sink),
               0);
  expect_failure(job, status, name);
}

Test(contract, process_positive_errno_fails_the_job) {
  expect_process_failure("grow", process_enomem, ENOMEM);
}

static int filter_enomem(void *user, const sl_record *in) {
  (void)user, (void)in;
  return ENOMEM;
}

Test(contract, filter_other_than_keep_or_drop_fails_the_job) {
  sl_op *source, *filter, *sink;
  counted c = {0};
  sl_job *job = new_job(&source);
  cr_assert_eq(sl_op_filter(job, "pick", source, 1, filter_enomem, 0, &filter),
               0);
  cr_assert_eq(sl_op_sink(job, "count", filter, 1, &count_ops, &c, &sink), 0);
  expect_failure(job, ENOMEM, "pick");
  cr_assert_eq(atomic_load(&c.records), 0, "a failing filter kept records");
}

static int filter_even(void *user, const sl_record *in) {
  (void)user;
  uint64_t v;
  memcpy(&v, in->data, sizeof v);
  return v % 2 == 0; /* 1 keeps, 0 drops */
}

/* The filter's two success values still mean keep and drop. */
Test(contract, filter_keeps_one_and_drops_zero) {
  sl_op *source, *filter, *sink;
  counted c = {0};
  sl_job *job = new_job(&source);
  cr_assert_eq(sl_op_filter(job, "even", source, 1, filter_even, 0, &filter),
               0);
  cr_assert_eq(sl_op_sink(job, "count", filter, 1, &count_ops, &c, &sink), 0);
  int rc = sl_job_run(job);
  cr_assert_eq(rc, 0, "%s: %s", sl_strerror(rc), sl_job_error(job));
  cr_assert_eq(atomic_load(&c.records), RECORDS / 2);
  sl_job_destroy(job);
}

/* A library call's positive errno passes straight through a callback:
 * sl_emit_side to a port out of range returns EINVAL. */
static int process_pass_through(sl_ctx *ctx, void *state, int input,
                                const sl_record *in) {
  (void)state, (void)input;
  return sl_emit_side(ctx, SL_MAX_SIDE_OUTPUTS + 1, in->data, in->size_bytes,
                      in->timestamp);
}

Test(contract, library_errno_returned_by_a_callback_fails_the_job) {
  expect_process_failure("side", process_pass_through, EINVAL);
}

/* A finish callback's positive errno fails the job too (it was dropped). */
static int finish_enomem(sl_ctx *ctx, void *state) {
  (void)ctx, (void)state;
  return ENOMEM;
}

Test(contract, finish_positive_errno_fails_the_job) {
  sl_op *source, *sink;
  counted c = {0};
  sl_job *job = new_job(&source);
  const sl_process_ops ops = {.process = count_process,
                              .finish = finish_enomem};
  cr_assert_eq(sl_op_sink(job, "last", source, 1, &ops, &c, &sink), 0);
  expect_failure(job, ENOMEM, "last");
  cr_assert_eq(atomic_load(&c.records), RECORDS);
}

/* ------------------------------------------------------------------ ABI */

/* struct_bytes (sluice.h, ABI): 0 (a config zeroed by hand, as before the
 * field) is refused; a later caller's larger struct is read when the bytes
 * this library does not know are zero, refused when one is set. */
Test(contract, config_struct_bytes_is_checked) {
  sl_job *job = (sl_job *)(void *)&job; /* must become NULL */
  sl_job_config zeroed;
  memset(&zeroed, 0, sizeof zeroed);
  cr_assert_eq(sl_job_create(&zeroed, &job), EINVAL);
  cr_assert_null(job);
  zeroed.struct_bytes = sizeof zeroed - 1; /* below the first version */
  cr_assert_eq(sl_job_create(&zeroed, &job), EINVAL);

  struct {
    sl_job_config config;
    uint64_t newer_field;
  } later;
  memset(&later, 0, sizeof later);
  later.config.struct_bytes = sizeof later;
  later.config.max_parallelism = 4;
  cr_assert_eq(sl_job_create(&later.config, &job), 0);
  sl_op *source, *sink;
  counted c = {0};
  cr_assert_eq(sl_source_memory(job, "numbers", numbers, sizeof numbers[0],
                                RECORDS, &source), 0);
  cr_assert_eq(sl_op_sink(job, "count", source, 1, &count_ops, &c, &sink), 0);
  cr_assert_eq(sl_job_run(job), 0, "%s", sl_job_error(job));
  cr_assert_eq(atomic_load(&c.records), RECORDS);
  sl_job_destroy(job);

  later.newer_field = 1; /* a field this library cannot honour */
  job = (sl_job *)(void *)&job;
  cr_assert_eq(sl_job_create(&later.config, &job), EINVAL);
  cr_assert_null(job);
  cr_assert_eq(sl_job_create(NULL, &job), 0, "NULL takes every default");
  sl_job_destroy(job);
}
