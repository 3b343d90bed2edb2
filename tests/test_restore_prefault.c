/* test_restore_prefault.c — Criterion tests of the helper thread that
 * faults in a restore's memory ahead of the load (storage/prefault.h,
 * cow_map_arena.c, engine/restore.c note 5): the helper populates what is
 * posted to it and hands spares back; a bulk load with the helper gives
 * exactly the map a load without it gives, also when it fails on a
 * duplicate (corrupt input) or adds nothing; and a resumed job restores
 * its keyed state through the helper, and without one when none can
 * start (SLUICE_PREFAULT=0).  No test depends on how far the helper got:
 * the load never waits for it.
 *
 * SLUICE_TEST_SCALE=n divides the entry counts by n (sanitizer builds).
 */
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cow_map.h"
#include "prefault.h"
#include "sluice.h"
#include "sluice_testing.h"
#include "test_dirs.h"
#include "test_util.h"

/* ------------------------------------------------------------ the helper */

/* Whether this kernel populates (MADV_POPULATE_WRITE, prefault.h note 2). */
static bool kernel_populates(void) {
#ifdef MADV_POPULATE_WRITE
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  void *p = mmap(0, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
  cr_assert(p != MAP_FAILED);
  bool can = madvise(p, page, MADV_POPULATE_WRITE) == 0;
  munmap(p, page);
  return can;
#else
  return false;
#endif
}

/* Pages of [p, p + bytes) resident in memory (mincore). */
static size_t resident_pages(void *p, size_t bytes) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t pages = bytes / page, resident = 0;
  unsigned char *vec = calloc(pages, 1);
  cr_assert(vec);
  cr_assert_eq(mincore(p, bytes, vec), 0);
  for (size_t i = 0; i < pages; i++)
    resident += vec[i] & 1;
  free(vec);
  return resident;
}

/* A spare posted to the helper is populated (every page resident, its
 * bytes still zero), then taken back; plain regions are never handed
 * back; after stop nothing more is accepted. */
Test(prefault, populates_and_hands_back_spares, .timeout = 60) {
  const size_t bytes = 8u << 20;
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  uint8_t *spare = mmap(0, bytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  uint8_t *plain = mmap(0, bytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  cr_assert(spare != MAP_FAILED && plain != MAP_FAILED);
  cr_assert_eq(resident_pages(spare, bytes), 0, "fresh pages are not mapped");
  sl_prefault *p;
  cr_assert_eq(sl_prefault_start(&p), 0);
  cr_assert_null(sl_prefault_take(p), "no spare yet");
  cr_assert(sl_prefault_post(p, plain, bytes));
  cr_assert(sl_prefault_post_spare(p, spare, bytes));
  if (kernel_populates()) {
    /* A condition, not a time: both regions, whole (60 s test timeout). */
    while (sl_prefault_populated_bytes(p) < 2 * bytes)
      usleep(1000);
    cr_assert_eq(sl_prefault_populated_bytes(p), 2 * bytes);
    cr_assert_eq(resident_pages(spare, bytes), bytes / page);
    cr_assert_eq(resident_pages(plain, bytes), bytes / page);
  }
  for (size_t i = 0; i < bytes; i += page)
    cr_assert_eq(spare[i], 0, "populating writes no byte");
  cr_assert_eq(sl_prefault_take(p), spare);
  cr_assert_null(sl_prefault_take(p), "a plain region is not a spare");
  sl_prefault_stop(p);
  sl_prefault_stop(p); /* idempotent */
  cr_assert_not(sl_prefault_post_spare(p, spare, bytes), "stopped");
  cr_assert_null(sl_prefault_take(p));
  sl_prefault_destroy(p);
  munmap(spare, bytes);
  munmap(plain, bytes);
  /* NULL is no helper: every call is harmless. */
  cr_assert_not(sl_prefault_post(0, plain, bytes));
  cr_assert_null(sl_prefault_take(0));
  sl_prefault_stop(0);
  sl_prefault_destroy(0);
}

/* SLUICE_PREFAULT=0 is a helper that cannot start (prefault.h note 6). */
Test(prefault, switched_off_cannot_start) {
  cr_assert_eq(setenv("SLUICE_PREFAULT", "0", 1), 0);
  sl_prefault *p = (sl_prefault *)&p; /* not NULL: start must clear it */
  cr_assert_eq(sl_prefault_start(&p), EAGAIN);
  cr_assert_null(p);
  cr_assert_eq(unsetenv("SLUICE_PREFAULT"), 0);
  cr_assert_eq(sl_prefault_start(&p), 0);
  sl_prefault_destroy(p);
}

/* The threads of this process (their ids, from /proc/self/task), into
 * tids[0, *count). */
static void task_ids(pid_t *tids, size_t capacity, size_t *count) {
  DIR *dir = opendir("/proc/self/task");
  cr_assert_not_null(dir);
  *count = 0;
  for (struct dirent *e; (e = readdir(dir)) != 0;)
    if (e->d_name[0] != '.' && *count < capacity)
      tids[(*count)++] = (pid_t)atoi(e->d_name);
  closedir(dir);
}

typedef struct placed {
  int owner_cpu;
  cpu_set_t helper; /* the helper thread's CPUs */
  int found;        /* threads that appeared with the helper */
} placed;

/* The owner: pinned to owner_cpu, it starts a helper and reads the CPUs
 * of the one thread that appeared. */
static void *pinned_owner(void *arg) {
  placed *pl = arg;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(pl->owner_cpu, &one);
  cr_assert_eq(pthread_setaffinity_np(pthread_self(), sizeof one, &one), 0);
  pid_t before[64], after[64];
  size_t nb, na;
  task_ids(before, 64, &nb);
  sl_prefault *p;
  cr_assert_eq(sl_prefault_start(&p), 0);
  task_ids(after, 64, &na);
  for (size_t a = 0; a < na; a++) {
    bool old = false;
    for (size_t b = 0; b < nb; b++)
      old |= after[a] == before[b];
    if (!old) {
      pl->found++;
      cr_assert_eq(sched_getaffinity(after[a], sizeof pl->helper,
                                     &pl->helper), 0);
    }
  }
  sl_prefault_destroy(p);
  return 0;
}

/* prefault.h note 7: started by a thread pinned to one CPU, the helper
 * runs on the process's other CPUs, not beside its owner. */
Test(prefault, helper_runs_on_another_cpu_than_its_owner) {
  cpu_set_t process;
  cr_assert_eq(sched_getaffinity(0, sizeof process, &process), 0);
  if (CPU_COUNT(&process) < 2)
    cr_skip_test("one CPU: the helper can only share it");
  placed pl = {.owner_cpu = -1};
  for (int cpu = 0; cpu < CPU_SETSIZE && pl.owner_cpu < 0; cpu++)
    if (CPU_ISSET(cpu, &process))
      pl.owner_cpu = cpu;
  pthread_t owner;
  cr_assert_eq(pthread_create(&owner, 0, pinned_owner, &pl), 0);
  cr_assert_eq(pthread_join(owner, 0), 0);
  cr_assert_eq(pl.found, 1, "%d threads appeared", pl.found);
  cr_assert(!CPU_ISSET(pl.owner_cpu, &pl.helper),
            "the helper may run on its owner's CPU %d", pl.owner_cpu);
  cpu_set_t both;
  CPU_AND(&both, &pl.helper, &process);
  cr_assert(CPU_EQUAL(&both, &pl.helper), "the helper left the process's "
            "CPUs");
  cr_assert_eq(CPU_COUNT(&pl.helper), CPU_COUNT(&process) - 1);
}

/* ------------------------------------------------------------ bulk loads */

/* Key i: 8 bytes, big-endian, so ascending i is the store's order. */
static void key_of(uint64_t i, uint8_t key[8]) {
  for (int b = 0; b < 8; b++)
    key[b] = (uint8_t)(i >> (56 - 8 * b));
}

/* Value of key i: 8..32 bytes, so versions of several sizes fill chunks. */
static uint32_t value_of(uint64_t i, uint8_t value[32]) {
  uint32_t bytes = 8 + (uint32_t)(i % 4) * 8;
  for (uint32_t b = 0; b < bytes; b++)
    value[b] = (uint8_t)(i * 31 + b);
  return bytes;
}

/* Bulk-loads keys [0, n) into a fresh map with a helper attached (if
 * helper), then key dup_of again if dup_of < n; returns finish's result. */
static int load_with(sl_cow_map *map, sl_prefault *helper, uint64_t n,
                     uint64_t dup_of) {
  cr_assert_eq(sl_cow_map_reserve(map, n), 0);
  sl_cow_map_load_prefault(map, helper, n);
  int rc = 0;
  for (uint64_t i = 0; rc == 0 && i <= n; i++) {
    uint64_t k = i < n ? i : dup_of;
    if (k >= n)
      break;
    uint8_t key[8], value[32];
    uint32_t bytes = value_of(k, value);
    key_of(k, key);
    rc = sl_cow_map_load_add(map, (uint32_t)(k >> 40), key, 8, value, bytes);
  }
  int finished = sl_cow_map_load_finish(map);
  sl_prefault_destroy(helper); /* stopped by the finish */
  return rc ? rc : finished;
}

/* Every key [0, n) holds its value. */
static void assert_loaded(sl_cow_map *map, uint64_t n) {
  cr_assert_eq(sl_cow_map_count(map), n);
  for (uint64_t i = 0; i < n; i++) {
    uint8_t key[8], value[32];
    uint32_t bytes = value_of(i, value), got = 0;
    key_of(i, key);
    const void *v = sl_cow_map_get(map, key, 8, &got);
    cr_assert(v && got == bytes && memcmp(v, value, bytes) == 0,
              "key %" PRIu64, i);
  }
  cr_assert(sl_cow_map_check(map));
}

/* A load with the helper: the same map as without it, over enough chunks
 * that spares are taken and replaced (300K versions of 56..80 bytes: about
 * 20 MiB, five chunks). */
Test(prefault, bulk_load_with_helper, .timeout = 120) {
  uint64_t n = sl_test_scaled(300000, 120000);
  sl_cow_map *with, *without;
  cr_assert_eq(sl_cow_map_create(&with), 0);
  cr_assert_eq(sl_cow_map_create(&without), 0);
  sl_prefault *helper;
  cr_assert_eq(sl_prefault_start(&helper), 0);
  cr_assert_eq(load_with(with, helper, n, UINT64_MAX), 0);
  cr_assert_eq(load_with(without, 0, n, UINT64_MAX), 0);
  assert_loaded(with, n);
  assert_loaded(without, n);
  cr_assert_eq(sl_cow_map_memory_bytes(with), sl_cow_map_memory_bytes(without),
               "chunks held ahead and not used are not the map's");
  /* Writes after the load: the map is an ordinary one. */
  uint8_t key[8];
  key_of(n / 2, key);
  cr_assert_eq(sl_cow_map_delete(with, key, 8), 0);
  cr_assert_eq(sl_cow_map_count(with), n - 1);
  cr_assert(sl_cow_map_check(with));
  sl_cow_map_destroy(with);
  sl_cow_map_destroy(without);
}

/* A duplicate key (a damaged store's) found while the helper runs fails
 * the load as without it; the chunks held ahead are freed (ASan checks
 * for leaks); a load that adds nothing frees them too. */
Test(prefault, bulk_load_with_helper_fails_or_adds_nothing, .timeout = 120) {
  uint64_t n = sl_test_scaled(200000, 100000);
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  sl_prefault *helper;
  cr_assert_eq(sl_prefault_start(&helper), 0);
  cr_assert_eq(load_with(map, helper, n, n / 3), EINVAL);
  cr_assert_eq(sl_cow_map_count(map), n, "the first copy stays");
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_destroy(map);

  cr_assert_eq(sl_cow_map_create(&map), 0);
  cr_assert_eq(sl_prefault_start(&helper), 0);
  cr_assert_eq(load_with(map, helper, 0, UINT64_MAX), 0);
  cr_assert_eq(sl_cow_map_count(map), 0);
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_destroy(map);
}

/* ------------------------------------------------------------ restores */

/* keyed source -> verifying sink (one instance, keyed state per key),
 * checkpoints every 5 ms on dir, resumed if it holds one: the sink checks
 * each key's records continue exactly from its restored state. */
/* Returns the entries the restore staged (cow_map.c note 18). */
static uint64_t run_verified(const char *dir, uint64_t keys, uint64_t count) {
  sl_job *job;
  sl_op *sink;
  cr_assert_eq(sl_fixture_verified_job(dir, 1, 1, count, keys, &job, &sink), 0);
  cr_assert_eq(sl_job_run(job), 0, "%s", sl_job_error(job));
  sl_verify_counts v;
  cr_assert_eq(sl_verify_result(sink, &v), 0);
  cr_assert_eq(v.records, count);
  cr_assert_eq(v.lost + v.duplicates + v.out_of_order, 0);
  uint64_t staged = sl_testing_state_load_staged(job);
  sl_job_destroy(job);
  return staged;
}

/* A state of 70000 keys resumed (the job finished: it resumes its final
 * checkpoint) with the helper, its threshold lowered to 65536 entries
 * (engine/restore.c note 5), or with none (SLUICE_PREFAULT=0); and, if
 * staged, loaded staged (note 6: every table size staged). */
static void resume_large(bool helper, bool staged) {
  char *dir = sl_test_temp_dir("restore-prefault");
  const uint64_t keys = 70000;
  cr_assert_eq(setenv("SLUICE_PREFAULT_MIN_ENTRIES", "65536", 1), 0);
  if (!helper)
    cr_assert_eq(setenv("SLUICE_PREFAULT", "0", 1), 0);
  cr_assert_eq(run_verified(dir, keys, 2 * keys), 0); /* every key in it */
  if (staged)
    cr_assert_eq(setenv("SLUICE_STAGE_MIN_BUCKETS", "0", 1), 0);
  /* Restored (a finished job): every key staged, or none. */
  cr_assert_eq(run_verified(dir, keys, 2 * keys), staged ? keys : 0);
  cr_assert_eq(unsetenv("SLUICE_STAGE_MIN_BUCKETS"), 0);
  cr_assert_eq(unsetenv("SLUICE_PREFAULT"), 0);
  cr_assert_eq(unsetenv("SLUICE_PREFAULT_MIN_ENTRIES"), 0);
  sl_test_remove_tree(dir);
}

Test(restore, large_state_with_prefault_helper, .timeout = 300) {
  resume_large(true, false);
}

Test(restore, large_state_without_prefault_helper, .timeout = 300) {
  resume_large(false, false);
}

Test(restore, large_state_staged_with_prefault_helper, .timeout = 300) {
  resume_large(true, true);
}
