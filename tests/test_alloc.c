/* test_alloc.c — keyed state lives in jemalloc even in a host whose malloc
 * is glibc's (issue 19, storage/alloc.h).
 *
 * This executable links the shared libsluice and not jemalloc (see
 * tests/meson.build): the process's malloc is glibc's, and jemalloc is
 * loaded only as libsluice's own dependency.  That is the host of the
 * issue: before, libsluice linked jemalloc and called none of it, so its
 * state went to glibc.  jemalloc's statistics are read through
 * dlsym(RTLD_DEFAULT, "mallctl"), which finds the copy libsluice loaded.
 *
 * SL_TEST_JEMALLOC (from meson) says whether the library was built with
 * jemalloc; without it (sanitizer builds) the answer must be "malloc".
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "sluice.h"
#include "sluice_testing.h"

#define KEYS UINT64_C(200000)
/* The smallest keyed-state version: a 40-byte header, the key of at least
 * 8 bytes, a value area of at least 8 (storage/cow_map.h, Memory). */
#define MIN_ENTRY_BYTES 56u

static uint64_t tuple_key(void *user, const sl_record *in) {
  (void)user;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  return t.key;
}

/* Counts records per key in keyed state: one 8-byte value per key. */
static int count_process(sl_ctx *ctx, void *state, int input,
                         const sl_record *in) {
  (void)state;
  (void)input;
  (void)in;
  void *value;
  int rc = sl_state_update(ctx, 0, sizeof(uint64_t), 0, &value);
  if (rc)
    return rc;
  uint64_t count;
  memcpy(&count, value, sizeof count);
  count++;
  memcpy(value, &count, sizeof count);
  return 0;
}

static int drop_process(sl_ctx *ctx, void *state, int input,
                        const sl_record *in) {
  (void)ctx;
  (void)state;
  (void)input;
  (void)in;
  return 0;
}

/* numbers (KEYS records, key = i) -> key_by -> count (2 instances, keyed
 * state) -> a sink with no output.  faults: NULL or a spec; with one, one
 * in-process restart is allowed.  Runs to the end; the job is returned
 * finished, for the hook. */
static sl_job *run_count_job(const char *faults) {
  sl_job_config config = SL_JOB_CONFIG_INIT;
  config.faults = faults;
  if (faults) {
    config.restart = sl_restart_defaults(SL_RESTART_FIXED_DELAY);
    config.restart.attempts = 1;
    config.restart.delay_ms = 0;
  }
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  sl_op *source, *keyed, *count, *sink;
  sl_process_ops count_ops = {.process = count_process};
  sl_process_ops drop_ops = {.process = drop_process};
  cr_assert_eq(sl_source_sequence(job, "numbers", 1, KEYS, 0, &source), 0);
  cr_assert_eq(sl_op_key_by(job, "by-key", source, tuple_key, 0, &keyed), 0);
  cr_assert_eq(sl_op_process(job, "count", &keyed, 1, 2, &count_ops, 0,
                             &count), 0);
  cr_assert_eq(sl_op_sink(job, "drop", count, 1, &drop_ops, 0, &sink), 0);
  int rc = sl_job_run(job);
  cr_assert_eq(rc, 0, "run: %s: %s", sl_strerror(rc), sl_job_error(job));
  cr_assert_eq(sl_job_restarts(job), faults ? 1u : 0u);
  return job;
}

typedef int (*mallctl_fn)(const char *, void *, size_t *, void *, size_t);

/* jemalloc's mallctl as loaded in this process, or NULL if none is. */
static mallctl_fn find_mallctl(void) {
  mallctl_fn fn;
  void *symbol = dlsym(RTLD_DEFAULT, "mallctl");
  memcpy(&fn, &symbol, sizeof fn); /* object to function pointer (POSIX) */
  return fn;
}

/* Bytes jemalloc has allocated, all arenas, after a statistics refresh. */
static uint64_t jemalloc_allocated_bytes(void) {
  mallctl_fn mallctl = find_mallctl();
  cr_assert_not_null(mallctl, "jemalloc is not loaded in this process");
  uint64_t epoch = 1;
  size_t size = sizeof epoch;
  cr_assert_eq(mallctl("epoch", &epoch, &size, &epoch, sizeof epoch), 0);
  size_t allocated = 0;
  size = sizeof allocated;
  cr_assert_eq(mallctl("stats.allocated", &allocated, &size, 0, 0), 0);
  return allocated;
}

static unsigned jemalloc_arena_count(void) {
  mallctl_fn mallctl = find_mallctl();
  cr_assert_not_null(mallctl);
  unsigned arenas = 0;
  size_t size = sizeof arenas;
  cr_assert_eq(mallctl("arenas.narenas", &arenas, &size, 0, 0), 0);
  return arenas;
}

/* The hook's answer for a finished job; asserts it matches the build. */
static uint64_t state_bytes(sl_job *job) {
  char name[16];
  uint64_t bytes = UINT64_MAX;
  int rc = sl_testing_state_allocator(job, name, sizeof name, &bytes);
  cr_assert_eq(rc, 0, "hook: %s", sl_strerror(rc));
  cr_assert_str_eq(name, SL_TEST_JEMALLOC ? "jemalloc" : "malloc");
  if (!SL_TEST_JEMALLOC)
    cr_assert_eq(bytes, 0);
  return bytes;
}

Test(alloc, host_malloc_is_glibc) {
  /* The premise of this suite: the executable's malloc is not jemalloc's
   * but libc's (under AddressSanitizer, its interceptor, loaded first). */
  void *host_malloc = dlsym(RTLD_DEFAULT, "malloc");
  Dl_info where;
  cr_assert_neq(dladdr(host_malloc, &where), 0);
  cr_assert_not_null(where.dli_fname);
  cr_expect_null(strstr(where.dli_fname, "jemalloc"),
                 "malloc comes from %s: the test proves nothing",
                 where.dli_fname);
#ifndef __SANITIZE_ADDRESS__
  void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
  cr_assert_not_null(libc, "libc.so.6 not loaded: %s", dlerror());
  cr_expect_eq(host_malloc, dlsym(libc, "malloc"),
               "malloc is %s's, not libc's", where.dli_fname);
  dlclose(libc);
#endif
  /* ... and jemalloc is there all the same, brought by libsluice. */
  if (SL_TEST_JEMALLOC)
    cr_expect_not_null(find_mallctl());
}

Test(alloc, keyed_state_is_in_jemalloc_arenas) {
  uint64_t before = SL_TEST_JEMALLOC ? jemalloc_allocated_bytes() : 0;
  sl_job *job = run_count_job(0);
  uint64_t bytes = state_bytes(job);
  if (SL_TEST_JEMALLOC) {
    cr_expect_geq(bytes, KEYS * MIN_ENTRY_BYTES,
                  "%" PRIu64 " bytes for %" PRIu64 " keys", bytes, KEYS);
    /* Nothing else of the process allocates from jemalloc, so its total
     * grew by the state at least: the state is not in glibc's heap. */
    uint64_t grown = jemalloc_allocated_bytes() - before;
    cr_expect_geq(grown, KEYS * MIN_ENTRY_BYTES,
                  "jemalloc grew by %" PRIu64, grown);
  }
  sl_job_destroy(job);
  if (SL_TEST_JEMALLOC) {
    /* Destroying the job reset the maps' arenas: their bytes are gone. */
    uint64_t after = jemalloc_allocated_bytes();
    cr_expect_lt(after, before + KEYS * MIN_ENTRY_BYTES / 10,
                 "%" PRIu64 " bytes before, %" PRIu64 " after destroy",
                 before, after);
  }
}

Test(alloc, restart_drops_the_failed_attempts_arena) {
  sl_job *job = run_count_job(0);
  uint64_t clean_bytes = state_bytes(job);
  sl_job_destroy(job);
  uint64_t before = SL_TEST_JEMALLOC ? jemalloc_allocated_bytes() : 0;
  /* Instance 0 of count fails half way through its keys; the job restarts
   * in-process and builds its state again in fresh maps. */
  job = run_count_job("fail:op=count,instance=0,record=50000");
  uint64_t restarted_bytes = state_bytes(job);
  if (SL_TEST_JEMALLOC) {
    cr_expect_geq(restarted_bytes, KEYS * MIN_ENTRY_BYTES);
    /* Same order as a run without the failure, not that plus the old. */
    cr_expect_leq(restarted_bytes, clean_bytes + clean_bytes / 2,
                  "%" PRIu64 " bytes after a restart, %" PRIu64 " without",
                  restarted_bytes, clean_bytes);
    /* The failed attempt's maps were dropped, arena and all: what
     * jemalloc holds beyond the start is the new state only. */
    uint64_t grown = jemalloc_allocated_bytes() - before;
    cr_expect_leq(grown, clean_bytes + clean_bytes / 2,
                  "jemalloc grew by %" PRIu64 ", the state holds %" PRIu64,
                  grown, restarted_bytes);
  }
  sl_job_destroy(job);
}

Test(alloc, arenas_are_reused_across_jobs) {
  /* Without jemalloc only the hook's answer is checked (state_bytes). */
  if (!SL_TEST_JEMALLOC) {
    sl_job *job = run_count_job(0);
    (void)state_bytes(job);
    sl_job_destroy(job);
    return;
  }
  /* The first job with a restart creates arenas: 2 for the maps of the
   * failed attempt and 2 for the new one, alive together until the new
   * attempt restored.  Later jobs take them from the pool. */
  sl_job_destroy(run_count_job("fail:op=count,instance=1,record=20000"));
  unsigned arenas = jemalloc_arena_count();
  for (int round = 0; round < 3; round++)
    sl_job_destroy(run_count_job("fail:op=count,instance=1,record=20000"));
  cr_expect_eq(jemalloc_arena_count(), arenas,
               "arenas grew from %u to %u over 3 jobs with restarts", arenas,
               jemalloc_arena_count());
}

Test(alloc, hook_refuses_bad_arguments) {
  sl_job *job;
  cr_assert_eq(sl_job_create(0, &job), 0);
  char name[16];
  uint64_t bytes;
  cr_expect_eq(sl_testing_state_allocator(0, name, sizeof name, &bytes), EINVAL);
  cr_expect_eq(sl_testing_state_allocator(job, name, 0, &bytes), EINVAL);
  cr_expect_eq(sl_testing_state_allocator(job, name, 4, &bytes), ERANGE);
  /* A job with no keyed state: the build's allocator, no bytes. */
  cr_assert_eq(sl_testing_state_allocator(job, name, sizeof name, &bytes), 0);
  cr_expect_str_eq(name, SL_TEST_JEMALLOC ? "jemalloc" : "malloc");
  cr_expect_eq(bytes, 0);
  sl_job_destroy(job);
}
