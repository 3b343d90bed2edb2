/* test_contract.c — the API contract of sluice.h, with real jobs.
 * CALLBACK RETURNS: a callback that returns any nonzero value, a positive
 * errno included, fails the job; sl_job_run returns that value and
 * sl_job_error names the operator.  Before the contract, a positive
 * return from map, process or filter was taken for success (the job ended
 * with 0), and a library call's own positive errno could not be passed
 * through with `return sl_...(...)`.  ABI: config structs are read by the
 * size the caller was built with (struct_bytes, or a builder's _sized
 * symbol).
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
static void expect_failure_saying(sl_job *job, int status,
                                  const char *operator, const char *cause) {
  int rc = sl_job_run(job);
  const char *message = sl_job_error(job);
  if (cause)
    cr_assert(strstr(message, cause), "no \"%s\" in \"%s\"", cause,
              message);
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

static void expect_failure(sl_job *job, int status, const char *operator) {
  expect_failure_saying(job, status, operator, NULL);
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
  /* map_enomem set no cause: the engine names what returned what. */
  char cause[64];
  snprintf(cause, sizeof cause, "the map callback returned %d", ENOMEM);
  expect_failure_saying(job, ENOMEM, "grow", cause);
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
  /* Below the first version, which ends with faults (later fields, like
   * name, were appended after it). */
  zeroed.struct_bytes =
      offsetof(sl_job_config, faults) + sizeof zeroed.faults - 1;
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

/* A keyed count window of 10 records over the RECORDS numbers, 4 keys: 25
 * windows per key, one output record each. */
#define WINDOW_KEYS 4
#define WINDOW_SIZE 10
#define WINDOW_OUTPUTS (RECORDS / WINDOW_SIZE)

static uint64_t key_mod(void *user, const sl_record *in) {
  (void)user;
  return *(const uint64_t *)in->data % WINDOW_KEYS;
}

static void acc_init(void *user, void *acc) {
  (void)user;
  memset(acc, 0, sizeof(uint64_t));
}

static void acc_add(void *user, void *acc, const sl_record *in) {
  (void)user, (void)in;
  ++*(uint64_t *)acc;
}

static int acc_emit(void *user, sl_ctx *ctx, uint64_t key,
                    const sl_window *window, const void *acc) {
  (void)user, (void)key, (void)window;
  return sl_emit(ctx, acc, sizeof(uint64_t));
}

static const sl_window_config count_window = {
    .type = SL_WINDOW_COUNT, .size = WINDOW_SIZE, .acc_bytes = 8,
    .init = acc_init, .add = acc_add, .emit = acc_emit};

/* sl_op_window_sized (sluice.h, ABI): a size below version 1 is refused
 * naming the builder and the struct, as is a later caller's larger struct
 * with a byte set that this library does not know; the same struct with
 * those bytes zero is read, and the window runs.  Each refusal leaves the
 * graph unaltered, so the job built on is the one that runs. */
Test(contract, builder_config_bytes_are_checked) {
  sl_op *source, *keyed, *window, *sink;
  sl_job *job = new_job(&source);
  cr_assert_eq(sl_op_key_by(job, "key", source, key_mod, NULL, &keyed), 0);

  cr_assert_eq(sl_op_window_sized(job, "win", keyed, 2, &count_window,
                                  &window, sizeof count_window / 2), EINVAL);
  cr_assert_null(window);
  const char *message = sl_job_error(job);
  cr_assert(strstr(message, "sl_op_window") &&
            strstr(message, "sl_window_config") &&
            strstr(message, "at least"), "message: %s", message);

  struct {
    sl_window_config config;
    uint64_t newer_field;
  } later;
  memset(&later, 0, sizeof later);
  later.config = count_window;
  later.newer_field = 1; /* a field this library cannot honour */
  cr_assert_eq(sl_op_window_sized(job, "win", keyed, 2, &later.config,
                                  &window, sizeof later), EINVAL);
  message = sl_job_error(job);
  cr_assert(strstr(message, "sl_op_window") && strstr(message, "is set"),
            "message: %s", message);

  later.newer_field = 0;
  cr_assert_eq(sl_op_window_sized(job, "win", keyed, 2, &later.config,
                                  &window, sizeof later), 0, "%s",
               sl_job_error(job));
  counted c = {0};
  cr_assert_eq(sl_op_sink(job, "count", window, 1, &count_ops, &c, &sink), 0);
  cr_assert_eq(sl_job_run(job), 0, "%s", sl_job_error(job));
  cr_assert_eq(atomic_load(&c.records), WINDOW_OUTPUTS);
  sl_job_destroy(job);
}

/* The names a program uses: the macro passes the caller's size (a compound
 * literal, as the README writes it), and the unsized symbol a program
 * linked before the sized calls existed (called here past the macro) reads
 * a version-1 struct.  Both windows run. */
Test(contract, unsized_builder_names_still_work) {
  sl_op *source, *keyed, *by_macro, *by_symbol, *merged, *sink;
  sl_job *job = new_job(&source);
  cr_assert_eq(sl_op_key_by(job, "key", source, key_mod, NULL, &keyed), 0);
  cr_assert_eq(sl_op_window(job, "macro", keyed, 1,
                            &(sl_window_config){
                                .type = SL_WINDOW_COUNT, .size = WINDOW_SIZE,
                                .acc_bytes = 8, .init = acc_init,
                                .add = acc_add, .emit = acc_emit},
                            &by_macro), 0, "%s", sl_job_error(job));
  cr_assert_eq((sl_op_window)(job, "symbol", keyed, 1, &count_window,
                              &by_symbol), 0, "%s", sl_job_error(job));
  sl_op *both[2] = {by_macro, by_symbol};
  cr_assert_eq(sl_op_union(job, "both", both, 2, &merged), 0);
  counted c = {0};
  cr_assert_eq(sl_op_sink(job, "count", merged, 1, &count_ops, &c, &sink), 0);
  cr_assert_eq(sl_job_run(job), 0, "%s", sl_job_error(job));
  cr_assert_eq(atomic_load(&c.records), 2 * WINDOW_OUTPUTS);
  sl_job_destroy(job);
}

/* The calls without a job report through their own channel: the
 * generator's check into the caller's buffer, the event call by its
 * return. */
Test(contract, generator_config_bytes_are_checked) {
  sl_generator_config g = {.count = 10, .seed = 1, .keys = 3, .step = 1};
  char err[256];
  cr_assert_eq(sl_generator_validate_sized(&g, err, sizeof err, 8), EINVAL);
  cr_assert(strstr(err, "sl_generator_validate") &&
            strstr(err, "sl_generator_config"), "err: %s", err);
  cr_assert_eq(sl_generator_validate(&g, err, sizeof err), 0, "%s", err);
  sl_event e, expected;
  cr_assert_eq(sl_generator_event_sized(&g, 3, &e, 8), EINVAL);
  cr_assert_eq(sl_generator_event(&g, 3, &expected), 0);
  (sl_generator_event)(&g, 3, &e); /* the version-1 symbol */
  cr_assert_eq(memcmp(&e, &expected, sizeof e), 0);
}
