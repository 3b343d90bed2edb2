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
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "sluice.h"
#include "sluice_testing.h"
#include "test_dirs.h"
#include "test_spawn.h"

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

/* The arenas a job's maps use never purge on a timer (alloc.h note 7),
 * and still hold no pages once the maps are dropped (note 3).  Arenas
 * with decay off are the maps': jemalloc's own have 10 s. */
static unsigned arenas_without_decay(uint64_t *dirty_pages) {
  mallctl_fn mallctl = find_mallctl();
  cr_assert_not_null(mallctl);
  uint64_t epoch = 1;
  size_t size = sizeof epoch;
  cr_assert_eq(mallctl("epoch", &epoch, &size, &epoch, sizeof epoch), 0);
  unsigned found = 0;
  *dirty_pages = 0;
  for (unsigned a = 0; a < jemalloc_arena_count(); a++) {
    char name[96];
    ssize_t dirty = 0, muzzy = 0;
    size = sizeof dirty;
    snprintf(name, sizeof name, "arena.%u.dirty_decay_ms", a);
    if (mallctl(name, &dirty, &size, 0, 0) != 0)
      continue; /* an index jemalloc has not initialised */
    size = sizeof muzzy;
    snprintf(name, sizeof name, "arena.%u.muzzy_decay_ms", a);
    cr_assert_eq(mallctl(name, &muzzy, &size, 0, 0), 0);
    cr_expect_eq(dirty == -1, muzzy == -1, "arena %u: dirty %zd, muzzy %zd",
                 a, dirty, muzzy);
    if (dirty != -1)
      continue;
    found++;
    size_t pages = 0;
    size = sizeof pages;
    snprintf(name, sizeof name, "stats.arenas.%u.pdirty", a);
    cr_assert_eq(mallctl(name, &pages, &size, 0, 0), 0);
    *dirty_pages += pages;
  }
  return found;
}

Test(alloc, map_arenas_do_not_purge_on_a_timer) {
  if (!SL_TEST_JEMALLOC) {
    sl_job_destroy(run_count_job(0)); /* nothing of jemalloc's to check */
    return;
  }
  uint64_t dirty = 0;
  cr_assert_eq(arenas_without_decay(&dirty), 0, "before any job");
  /* Two count instances: two maps, each with an arena, alive until the
   * job is destroyed. */
  sl_job *job = run_count_job(0);
  cr_assert_geq(state_bytes(job), KEYS * MIN_ENTRY_BYTES);
  cr_expect_eq(arenas_without_decay(&dirty), 2, "one per map");
  /* Each map's table doubled several times on the way to its 100K keys;
   * the old tables were purged as each rehash ended, so they do not stay
   * as dirty pages (together about one final table: 1 MiB a map). */
  cr_expect_lt(dirty, 64u, "%" PRIu64 " dirty pages while the maps live",
               dirty);
  sl_job_destroy(job);
  /* Pooled now: reset and purged, so no dirty pages are kept, and still
   * without decay, which the next job's maps get with them. */
  cr_expect_eq(arenas_without_decay(&dirty), 2);
  cr_expect_eq(dirty, 0, "%" PRIu64 " dirty pages in pooled arenas", dirty);
  job = run_count_job(0);
  cr_expect_eq(arenas_without_decay(&dirty), 2, "the pooled ones reused");
  sl_job_destroy(job);
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

/* ---- a host that preloads tcmalloc (alloc.h note 6) ---- */

#define COUNT_RECORDS UINT64_C(200000)
#define COUNT_KEYS UINT64_C(1000)

static _Atomic uint64_t count_sum;

/* Counts records per key in keyed state and emits {key, count so far}. */
static int emit_count_process(sl_ctx *ctx, void *state, int input,
                              const sl_record *in) {
  (void)state;
  (void)input;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  void *value;
  int rc = sl_state_update(ctx, 0, sizeof(uint64_t), 0, &value);
  if (rc)
    return rc;
  uint64_t count;
  memcpy(&count, value, sizeof count);
  count++;
  memcpy(value, &count, sizeof count);
  /* A second value of a size that changes with every record (8 .. 320
   * bytes, so every size class of that range), replaced or deleted: state
   * memory is freed as well as allocated (sl_alloc_free, whose size check
   * once aborted under tcmalloc). */
  uint8_t blob[320];
  memset(blob, (int)(count & 0xff), sizeof blob);
  rc = count % 7 ? sl_state_put(ctx, 1, blob, 8 + 8 * (uint32_t)(count % 40),
                                0)
                 : sl_state_delete(ctx, 1);
  if (rc)
    return rc;
  sl_tuple out = {.key = t.key, .value = count};
  return sl_emit(ctx, &out, sizeof out);
}

static int sum_process(sl_ctx *ctx, void *state, int input,
                       const sl_record *in) {
  (void)ctx;
  (void)state;
  (void)input;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  atomic_fetch_add(&count_sum, t.value);
  return 0;
}

/* The sum of every emitted count: each of COUNT_KEYS keys is seen
 * n = COUNT_RECORDS / COUNT_KEYS times and emits 1 + 2 + ... + n. */
Test(alloc, keyed_counts_are_right) {
  atomic_store(&count_sum, 0);
  sl_job *job;
  cr_assert_eq(sl_job_create(0, &job), 0);
  sl_op *source, *keyed, *count, *sink;
  sl_process_ops count_ops = {.process = emit_count_process};
  sl_process_ops sum_ops = {.process = sum_process};
  cr_assert_eq(sl_source_sequence(job, "numbers", 1, COUNT_RECORDS,
                                  COUNT_KEYS, &source), 0);
  cr_assert_eq(sl_op_key_by(job, "by-key", source, tuple_key, 0, &keyed), 0);
  cr_assert_eq(sl_op_process(job, "count", &keyed, 1, 2, &count_ops, 0,
                             &count), 0);
  cr_assert_eq(sl_op_sink(job, "sum", count, 1, &sum_ops, 0, &sink), 0);
  int rc = sl_job_run(job);
  cr_assert_eq(rc, 0, "run: %s: %s", sl_strerror(rc), sl_job_error(job));
  uint64_t n = COUNT_RECORDS / COUNT_KEYS;
  cr_expect_eq(atomic_load(&count_sum), COUNT_KEYS * n * (n + 1) / 2,
               "sum of counts %" PRIu64, atomic_load(&count_sum));
  char name[16];
  uint64_t bytes;
  cr_assert_eq(sl_testing_state_allocator(job, name, sizeof name, &bytes), 0);
  /* Run by preloaded_tcmalloc below: jemalloc's API is split, so the
   * state must be in malloc/free. */
  if (getenv("SL_TEST_EXPECT_SPLIT"))
    cr_expect_str_eq(name, "malloc");
  sl_job_destroy(job);
}

static const char *tcmalloc_path(void) {
  static const char *const paths[] = {
      "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
      "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4",
      "/usr/lib64/libtcmalloc_minimal.so.4",
      "/usr/lib/libtcmalloc_minimal.so.4",
  };
  for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++)
    if (access(paths[i], R_OK) == 0)
      return paths[i];
  return NULL;
}

/* gperftools' tcmalloc exports nallocx (and malloc/free) but no mallocx:
 * preloaded, it splits jemalloc's API.  Before note 6, the size check of
 * sl_alloc_free aborted (tcmalloc's nallocx against jemalloc's sallocx),
 * and a release build freed jemalloc memory into tcmalloc.  The keyed job
 * runs in a child process with tcmalloc preloaded and must give the
 * right counts, from malloc/free. */
Test(alloc, preloaded_tcmalloc) {
  if (!SL_TEST_JEMALLOC)
    cr_skip_test("built without jemalloc: no API to split");
  const char *tcmalloc = tcmalloc_path();
  if (!tcmalloc)
    cr_skip_test("libtcmalloc_minimal.so.4 is not installed "
                 "(Debian package libtcmalloc-minimal4)");
  char *dir = sl_test_temp_dir("alloc-tcmalloc");
  char *log = sl_test_path_in(dir, "child.log");
  cr_assert_eq(setenv("LD_PRELOAD", tcmalloc, 1), 0);
  cr_assert_eq(setenv("SL_TEST_EXPECT_SPLIT", "1", 1), 0);
  cr_assert_eq(setenv("SLUICE_LOG_LEVEL", "warn", 1), 0);
  /* Criterion's sandbox (BoxFort) marks its workers with BXFI_MAP: the
   * child must start as a runner of its own, not as such a worker. */
  const char *map = getenv("BXFI_MAP");
  char *saved_map = map ? strdup(map) : NULL;
  unsetenv("BXFI_MAP");
  const char *args[] = {"--filter", "alloc/keyed_counts_are_right", "-j1",
                        NULL};
  int status = sl_test_reap(sl_test_spawn_program("/proc/self/exe", log,
                                                  args));
  unsetenv("LD_PRELOAD");
  if (saved_map)
    setenv("BXFI_MAP", saved_map, 1);
  free(saved_map);
  char *out = sl_test_slurp(log);
  cr_expect_eq(status, 0, "child exited with %d:\n%s", status, out);
  cr_expect(strstr(out, "Synthesis: Tested: 1 | Passing: 1"),
            "the child ran no passing test:\n%s", out);
  cr_expect(strstr(out, "keyed state uses malloc/free"),
            "no warning in the child's log:\n%s", out);
  free(out);
  free(log);
  sl_test_remove_tree(dir);
}
