/* test_cow_map_copy_pass.c — Criterion tests of the copy pass
 * (storage/cow_map.c note 17): a delta too large for the copying freeze is
 * frozen as usual and then copied in steps by its owner.  A version the
 * pass reaches stays in the table and is written in place afterwards; one
 * written before the pass reaches it is copied on write and skipped by
 * the pass; the delta, read once the pass is over, holds the values of
 * its epoch.  A freeze or a release finishes a pass under way; the
 * limits, the plain freeze and rollback start none; a copy that fails
 * ends the pass; a map destroyed mid-pass frees everything.  The map is
 * checked whole (sl_cow_map_check, memory count included) at every step.
 * test_cow_map.c runs its concurrent model test with passes as well.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "cow_map.h"
#include "sluice.h"
#include "test_cow_map.h"
#include "test_cow_map_written.h"

/* test_cow_map_written.h's map with the copying freeze off, so that
 * every delta is the pass's. */
static void fixture_start(written *f) {
  written_start(f);
  sl_cow_map_set_freeze_copy(f->map, 0, 0);
}

/* Release epoch and reclaim all: the map checked, and equal to live. */
static void release_whole(written *f, uint32_t epoch) {
  sl_cow_map_release(f->map, epoch);
  maintain_all(f->map);
  cr_assert(sl_cow_map_check(f->map));
  cr_assert_eq(model_diff_map(f->live, f->map), 0);
}

/* Key id written with seed, in the map and in live. */
static void write_id(written *f, uint64_t id, uint64_t seed) {
  uint8_t value[VALUE_MAX_BYTES];
  put_value(f->map, id, BYTES, seed);
  value_fill(value, BYTES, seed);
  model_put(f->live, id, value, BYTES);
}

/* The newest pending delta applied to a copy of before equals expected. */
static void expect_newest(sl_cow_map *map, const model *before,
                          const model *expected) {
  const sl_cow_delta *pending;
  int count;
  sl_cow_map_pending(map, &pending, &count);
  cr_assert(count >= 1);
  expect_delta(&pending[count - 1], before, expected);
}

/* The list holds ids 0..IDS-1 in write order, then key IDS's two versions
 * and key IDS + 1's.  A first step copies ids 0..99; writes to ids
 * 900..999 come before the pass reaches them (copied on write, moved);
 * the rest of the pass skips those and copies the others; every key
 * written afterwards stays where it was.  The delta read after the pass
 * holds the frozen values. */
Test(cow_map_copy_pass, a_pass_copies_in_steps_while_the_map_is_written) {
  written f;
  fixture_start(&f);
  sl_cow_map *map = f.map;
  uint32_t bytes;
  uint64_t copies = sl_cow_map_freeze_copies(map);
  uint64_t passes = sl_cow_map_copy_passes(map);
  sl_cow_delta d = sl_cow_map_freeze_deferred(map);
  model_copy(f.at_freeze, f.live);
  cr_assert_eq(d.entries, IDS + 3);
  cr_assert(sl_cow_map_copying(map));
  cr_assert_eq(sl_cow_map_copy_passes(map) - passes, 1);
  cr_assert_eq(sl_cow_map_freeze_copies(map), copies, "nothing at the freeze");
  cr_assert(sl_cow_map_copy_step(map, 100));
  cr_assert_eq(sl_cow_map_freeze_copies(map) - copies, 100);
  cr_assert(sl_cow_map_check(map));
  for (uint64_t id = 900; id < IDS; id++)
    write_id(&f, id, 10000 + id);
  cr_assert(sl_cow_map_check(map));
  int steps = 0;
  while (sl_cow_map_copy_step(map, 37)) {
    steps++;
    cr_assert(sl_cow_map_check(map), "step %d", steps);
  }
  cr_assert(steps > 10);
  cr_assert(!sl_cow_map_copying(map));
  /* 100 + 800 of ids 0..999, and key IDS's live version. */
  cr_assert_eq(sl_cow_map_freeze_copies(map) - copies, 901);
  for (uint64_t id = 0; id < IDS; id++)
    write_id(&f, id, 20000 + id);
  for (uint64_t id = 0; id < IDS; id++)
    cr_assert_eq(get_id(map, id, &bytes) == f.where[id], id < 900,
                 "id %llu", (unsigned long long)id);
  cr_assert_eq(model_diff_map(f.live, map), 0);
  cr_assert(sl_cow_map_check(map));
  expect_newest(map, f.empty, f.at_freeze);

  sl_cow_delta d2 = sl_cow_map_freeze(map);
  cr_assert(!sl_cow_map_copying(map), "the plain freeze starts no pass");
  expect_newest(map, f.at_freeze, f.live);
  release_whole(&f, d.epoch);
  release_whole(&f, d2.epoch);
  written_end(&f);
}

/* A freeze finishes the pass under way before it freezes, and a release
 * of the pass's epoch finishes it before the delta goes to reclaim: both
 * deltas stay exact. */
Test(cow_map_copy_pass, a_freeze_or_a_release_finishes_the_pass) {
  written f;
  fixture_start(&f);
  sl_cow_map *map = f.map;
  uint64_t copies = sl_cow_map_freeze_copies(map);
  sl_cow_delta d = sl_cow_map_freeze_deferred(map);
  model_copy(f.at_freeze, f.live);
  cr_assert(sl_cow_map_copy_step(map, 10));
  for (uint64_t id = 500; id < IDS; id++)
    write_id(&f, id, 30000 + id);
  model *second = model_new(IDS + 2);
  model_copy(second, f.live);
  sl_cow_delta d2 = sl_cow_map_freeze_deferred(map);
  /* d's pass was finished first: 500 of ids 0..999 and key IDS; then d2
   * (500 versions) got a pass of its own. */
  cr_assert_eq(sl_cow_map_freeze_copies(map) - copies, 501);
  cr_assert(sl_cow_map_copying(map));
  cr_assert(sl_cow_map_check(map));
  const sl_cow_delta *pending;
  int count;
  sl_cow_map_pending(map, &pending, &count);
  cr_assert_eq(count, 2);
  model *work = model_new(IDS + 2);
  cr_assert_eq(apply_delta(work, &pending[0]), 0);
  cr_assert(model_equal(work, f.at_freeze));
  for (uint64_t id = 0; id < 10; id++)
    write_id(&f, id, 40000 + id);
  sl_cow_map_release(map, d2.epoch); /* both, and d2's pass first */
  cr_assert(!sl_cow_map_copying(map));
  cr_assert_eq(sl_cow_map_freeze_copies(map) - copies, 1001);
  cr_assert(sl_cow_map_check(map));
  maintain_all(map);
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(model_diff_map(f.live, map), 0);
  sl_cow_delta d3 = sl_cow_map_freeze(map);
  model_copy(work, second);
  cr_assert_eq(apply_delta(work, &d3), 0);
  cr_assert(model_equal(work, f.live));
  (void)d;
  model_free(work);
  model_free(second);
  written_end(&f);
}

/* Freezes an epoch of IDS rewritten keys with sl_cow_map_freeze_deferred
 * and says whether a pass began; the delta is exact either way. */
static bool pass_began(written *f, uint64_t base) {
  for (uint64_t id = 0; id < IDS; id++)
    write_id(f, id, base + id);
  model_copy(f->at_freeze, f->live);
  uint64_t passes = sl_cow_map_copy_passes(f->map);
  sl_cow_delta d = sl_cow_map_freeze_deferred(f->map);
  bool began = sl_cow_map_copy_passes(f->map) != passes;
  cr_assert_eq(sl_cow_map_copying(f->map), began);
  sl_cow_map_copy_finish(f->map);
  cr_assert(!sl_cow_map_copying(f->map));
  cr_assert(sl_cow_map_check(f->map));
  release_whole(f, d.epoch);
  return began;
}

/* The pass's limits are inclusive, by versions and by key and value
 * bytes; 0 and 0 turn it off; a delta within the copying freeze's limits
 * is copied at the freeze, not by a pass; rollback starts none. */
Test(cow_map_copy_pass, limits_and_rollback_start_no_pass) {
  written f;
  fixture_start(&f);
  sl_cow_map *map = f.map;
  sl_cow_map_release(map, sl_cow_map_freeze(map).epoch);
  maintain_all(map);
  uint8_t key[KEY_MAX_BYTES];
  uint64_t epoch_bytes = (uint64_t)IDS * BYTES;
  for (uint64_t id = 0; id < IDS; id++)
    epoch_bytes += key_make(id, key);
  cr_assert(pass_began(&f, 1000)); /* the defaults */
  sl_cow_map_set_copy_pass(map, IDS - 1, UINT64_MAX);
  cr_assert(!pass_began(&f, 2000));
  sl_cow_map_set_copy_pass(map, IDS, UINT64_MAX);
  cr_assert(pass_began(&f, 3000));
  sl_cow_map_set_copy_pass(map, UINT64_MAX, epoch_bytes - 1);
  cr_assert(!pass_began(&f, 4000));
  sl_cow_map_set_copy_pass(map, UINT64_MAX, epoch_bytes);
  cr_assert(pass_began(&f, 5000));
  sl_cow_map_set_copy_pass(map, 0, 0);
  cr_assert(!pass_began(&f, 6000));
  sl_cow_map_set_copy_pass(map, SL_COW_COPY_PASS_ENTRIES,
                           SL_COW_COPY_PASS_BYTES);
  /* Within the copying freeze's limits: copied at the freeze. */
  sl_cow_map_set_freeze_copy(map, SL_COW_FREEZE_COPY_ENTRIES,
                             SL_COW_FREEZE_COPY_BYTES);
  uint64_t copies = sl_cow_map_freeze_copies(map);
  cr_assert(!pass_began(&f, 7000));
  cr_assert_eq(sl_cow_map_freeze_copies(map) - copies, IDS);
  sl_cow_map_set_freeze_copy(map, 0, 0);
  cr_assert_eq(sl_cow_map_enable_rollback(map), 0);
  cr_assert(!pass_began(&f, 8000));
  written_end(&f);
}

/* A copy that cannot be had (SL_COW_FAIL_FREEZE_COPY, the 301st) ends the
 * pass: ids 0..299 are copied and written in place afterwards, the others
 * copied on write; the delta is exact. */
Test(cow_map_copy_pass, a_failed_copy_ends_the_pass) {
  written f;
  fixture_start(&f);
  sl_cow_map *map = f.map;
  uint32_t bytes;
  sl_cow_map_test_fail_alloc(map, SL_COW_FAIL_FREEZE_COPY, 301);
  uint64_t copies = sl_cow_map_freeze_copies(map);
  sl_cow_delta d = sl_cow_map_freeze_deferred(map);
  model_copy(f.at_freeze, f.live);
  cr_assert(sl_cow_map_copy_step(map, 200));
  cr_assert(!sl_cow_map_copy_step(map, 200), "ended by the failed copy");
  cr_assert(!sl_cow_map_copying(map));
  cr_assert_eq(sl_cow_map_freeze_copies(map) - copies, 300);
  cr_assert(sl_cow_map_check(map));
  for (uint64_t id = 0; id < IDS; id++)
    write_id(&f, id, 50000 + id);
  for (uint64_t id = 0; id < IDS; id++)
    cr_assert_eq(get_id(map, id, &bytes) == f.where[id], id < 300,
                 "id %llu", (unsigned long long)id);
  cr_assert(sl_cow_map_check(map));
  expect_newest(map, f.empty, f.at_freeze);
  release_whole(&f, d.epoch);
  written_end(&f);
}

/* A map destroyed in the middle of a pass, with writes copied on write
 * and versions copied, frees everything (ASan's leak check). */
Test(cow_map_copy_pass, destroyed_mid_pass) {
  written f;
  fixture_start(&f);
  sl_cow_map_freeze_deferred(f.map);
  cr_assert(sl_cow_map_copy_step(f.map, 400));
  for (uint64_t id = 0; id < IDS; id += 2)
    write_id(&f, id, 60000 + id);
  cr_assert(sl_cow_map_copying(f.map));
  cr_assert(sl_cow_map_check(f.map));
  written_end(&f);
}

/* A version too large for an arena chunk's carving is copied by the pass
 * into a malloc'd version of its own, which keeps the frozen epoch (the
 * check of every list's epochs, sl_cow_map_check); the table's version is
 * written in place afterwards and the delta holds the frozen bytes. */
Test(cow_map_copy_pass, a_large_version_is_copied_on_the_heap) {
  enum { LARGE = 100000 };
  static uint8_t value[LARGE];
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  sl_cow_map_set_freeze_copy(map, 0, 0);
  memset(value, 7, LARGE);
  const uint8_t *p = sl_cow_map_put(map, "big", 3, value, LARGE);
  cr_assert_not_null(p);
  uint64_t copies = sl_cow_map_freeze_copies(map);
  sl_cow_delta d = sl_cow_map_freeze_deferred(map);
  cr_assert(sl_cow_map_copying(map));
  cr_assert(!sl_cow_map_copy_step(map, 1));
  cr_assert_eq(sl_cow_map_freeze_copies(map) - copies, 1);
  cr_assert(sl_cow_map_check(map));
  memset(value, 9, LARGE);
  cr_assert_eq(sl_cow_map_put(map, "big", 3, value, LARGE), p, "not in place");
  const sl_cow_delta *pending;
  int count;
  sl_cow_map_pending(map, &pending, &count);
  cr_assert_eq(count, 1);
  const sl_cow_entry *frozen = pending[0].head;
  cr_assert(frozen && frozen != (const sl_cow_entry *)d.head);
  cr_assert_eq(frozen->epoch, d.epoch);
  large_copy_released(map, frozen, d.epoch, p, LARGE);
}
