/* test_cow_map_freeze_copy.c — Criterion tests of the copying freeze
 * (storage/cow_map.c note 16): a small delta is copied at the freeze, its
 * versions stay in the table and are written in place afterwards, and
 * the delta still holds the values of its epoch; the limits and rollback
 * turn it off; a copy that fails leaves the rest to the ordinary freeze;
 * and the copies are reclaimed like displaced versions, the map checked
 * whole (sl_cow_map_check, which also verifies the memory count) at
 * every step.  The concurrent writer and the model are test_cow_map.h's;
 * test_cow_map.c runs its concurrent model test both ways too.
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

/* Every key of [0, IDS) written again, with seed base + id. */
static void rewrite(sl_cow_map *map, model *live, uint64_t base) {
  uint8_t value[VALUE_MAX_BYTES];
  for (uint64_t id = 0; id < IDS; id++) {
    put_value(map, id, BYTES, base + id);
    value_fill(value, BYTES, base + id);
    model_put(live, id, value, BYTES);
  }
}

/* A small delta is copied at the freeze: its live versions stay where
 * they are, in the table, and the writes after the freeze change them in
 * place (the same storage), while the delta read afterwards still holds
 * the frozen values.  The next epoch's delta holds the new ones; after
 * both releases the copies are gone and the map is whole. */
Test(cow_map_freeze_copy, small_delta_copied_then_written_in_place) {
  written w;
  written_start(&w);
  sl_cow_map *map = w.map;
  model *live = w.live, *empty = w.empty, *at_freeze = w.at_freeze;
  const uint8_t *const *where = w.where;
  uint32_t bytes;
  uint64_t copies = sl_cow_map_freeze_copies(map);
  sl_cow_delta d = sl_cow_map_freeze(map);
  model_copy(at_freeze, live);
  /* The live versions only: the superseded and the deleted are retired. */
  cr_assert_eq(sl_cow_map_freeze_copies(map) - copies, IDS + 1);
  cr_assert_eq(d.entries, IDS + 3);
  cr_assert(sl_cow_map_check(map));
  for (uint64_t id = 0; id < IDS; id++)
    cr_assert_eq(get_id(map, id, &bytes), where[id], "id %llu moved",
                 (unsigned long long)id);

  rewrite(map, live, 5000);
  for (uint64_t id = 0; id < IDS; id++)
    cr_assert_eq(get_id(map, id, &bytes), where[id], "id %llu copied",
                 (unsigned long long)id);
  cr_assert_eq(model_diff_map(live, map), 0);
  cr_assert(sl_cow_map_check(map));
  expect_delta(&d, empty, at_freeze); /* written over, read unchanged */

  sl_cow_delta d2 = sl_cow_map_freeze(map);
  cr_assert_eq(d2.entries, IDS);
  expect_delta(&d2, at_freeze, live);
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_release(map, d.epoch);
  maintain_all(map);
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_release(map, d2.epoch);
  maintain_all(map);
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(sl_cow_map_count(map), IDS + 1);
  cr_assert_eq(model_diff_map(live, map), 0);
  written_end(&w);
}

/* Freezes an epoch of IDS rewritten keys (after a first, released one)
 * and says whether it copied them, judged two ways: the copy count, and
 * whether key 0 moved when written after the freeze. */
static bool freeze_copied(sl_cow_map *map, model *live, uint64_t base) {
  rewrite(map, live, base);
  uint32_t bytes;
  const uint8_t *before = get_id(map, 0, &bytes);
  uint64_t copies = sl_cow_map_freeze_copies(map);
  sl_cow_delta d = sl_cow_map_freeze(map);
  uint64_t copied = sl_cow_map_freeze_copies(map) - copies;
  cr_assert(copied == 0 || copied == IDS, "%llu copies",
            (unsigned long long)copied);
  put_value(map, 0, BYTES, base + 999999);
  uint8_t value[VALUE_MAX_BYTES];
  value_fill(value, BYTES, base + 999999);
  model_put(live, 0, value, BYTES);
  bool moved = get_id(map, 0, &bytes) != before;
  cr_assert_eq(moved, copied == 0, "copied %llu, key 0 moved %d",
               (unsigned long long)copied, moved);
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_release(map, d.epoch);
  maintain_all(map);
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(model_diff_map(live, map), 0);
  return copied == IDS;
}

/* The limits are inclusive, by versions and by key and value bytes; 0
 * and 0 turn copying off; rollback turns it off whatever the limits. */
Test(cow_map_freeze_copy, limits_and_rollback_turn_it_off) {
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  model *live = model_new(IDS + 2);
  rewrite(map, live, 0);
  sl_cow_map_release(map, sl_cow_map_freeze(map).epoch);
  maintain_all(map);
  uint8_t key[KEY_MAX_BYTES];
  uint64_t key_bytes = 0; /* the keys and values of one epoch */
  for (uint64_t id = 0; id < IDS; id++)
    key_bytes += key_make(id, key);
  uint64_t epoch_bytes = key_bytes + (uint64_t)IDS * BYTES;

  cr_assert(freeze_copied(map, live, 10000)); /* the defaults */
  sl_cow_map_set_freeze_copy(map, IDS - 1, UINT64_MAX);
  cr_assert(!freeze_copied(map, live, 20000));
  sl_cow_map_set_freeze_copy(map, IDS, UINT64_MAX);
  cr_assert(freeze_copied(map, live, 30000));
  sl_cow_map_set_freeze_copy(map, UINT64_MAX, epoch_bytes - 1);
  cr_assert(!freeze_copied(map, live, 40000));
  sl_cow_map_set_freeze_copy(map, UINT64_MAX, epoch_bytes);
  cr_assert(freeze_copied(map, live, 50000));
  sl_cow_map_set_freeze_copy(map, 0, 0);
  cr_assert(!freeze_copied(map, live, 60000));
  sl_cow_map_set_freeze_copy(map, SL_COW_FREEZE_COPY_ENTRIES,
                             SL_COW_FREEZE_COPY_BYTES);
  /* Rollback starts from a map with nothing written since a release. */
  sl_cow_map_release(map, sl_cow_map_freeze(map).epoch);
  maintain_all(map);
  cr_assert_eq(sl_cow_map_enable_rollback(map), 0);
  cr_assert(!freeze_copied(map, live, 70000));
  model_free(live);
  sl_cow_map_destroy(map);
}

/* A copy that cannot be had (SL_COW_FAIL_FREEZE_COPY, the 301st) ends the
 * pass: the first 300 versions on the list are copied and written in
 * place afterwards, the others frozen and copied on write; the delta is
 * exact either way, and everything is reclaimed after the release. */
Test(cow_map_freeze_copy, a_failed_copy_leaves_the_rest_frozen) {
  written w;
  written_start(&w);
  sl_cow_map *map = w.map;
  model *live = w.live, *empty = w.empty, *at_freeze = w.at_freeze;
  uint32_t bytes;
  sl_cow_map_test_fail_alloc(map, SL_COW_FAIL_FREEZE_COPY, 301);
  uint64_t copies = sl_cow_map_freeze_copies(map);
  sl_cow_delta d = sl_cow_map_freeze(map);
  model_copy(at_freeze, live);
  cr_assert_eq(sl_cow_map_freeze_copies(map) - copies, 300);
  cr_assert(sl_cow_map_check(map));
  rewrite(map, live, 7000);
  /* The list is in write order: ids 0.. first. */
  for (uint64_t id = 0; id < IDS; id++)
    cr_assert_eq(get_id(map, id, &bytes) == w.where[id], id < 300,
                 "id %llu", (unsigned long long)id);
  cr_assert(sl_cow_map_check(map));
  expect_delta(&d, empty, at_freeze);
  sl_cow_map_release(map, d.epoch);
  maintain_all(map);
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(model_diff_map(live, map), 0);
  sl_cow_delta d2 = sl_cow_map_freeze(map);
  expect_delta(&d2, at_freeze, live);
  sl_cow_map_release(map, d2.epoch);
  maintain_all(map);
  cr_assert(sl_cow_map_check(map));
  written_end(&w);
}

/* A map destroyed with copied deltas pending, and with its spare chunk,
 * frees them (ASan's leak check in the sanitizer build). */
Test(cow_map_freeze_copy, destroyed_with_copies_pending) {
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  model *live = model_new(IDS + 2);
  write_epoch(map, live);
  sl_cow_map_release(map, sl_cow_map_freeze(map).epoch);
  maintain_all(map); /* the copies' chunk emptied: now the spare */
  cr_assert_eq(sl_cow_map_arena_spare_bytes(map) > 0,
               sl_cow_map_freeze_copies(map) > 0);
  rewrite(map, live, 100);
  sl_cow_map_freeze(map);
  rewrite(map, live, 200);
  sl_cow_map_freeze(map);
  cr_assert(sl_cow_map_freeze_copies(map) >= 3 * (uint64_t)IDS);
  cr_assert(sl_cow_map_check(map));
  model_free(live);
  sl_cow_map_destroy(map);
}

/* A version too large for an arena chunk's carving (over 1/64 of a chunk)
 * is copied into a malloc'd version of its own: the delta holds its
 * frozen bytes, the table's version is written in place, and both are
 * accounted for (sl_cow_map_check) until the release frees the copy. */
Test(cow_map_freeze_copy, a_large_version_is_copied_on_the_heap) {
  enum { LARGE = 100000 };
  static uint8_t value[LARGE];
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  memset(value, 7, LARGE);
  const uint8_t *p = sl_cow_map_put(map, "big", 3, value, LARGE);
  cr_assert_not_null(p);
  uint64_t copies = sl_cow_map_freeze_copies(map);
  sl_cow_delta d = sl_cow_map_freeze(map);
  cr_assert_eq(sl_cow_map_freeze_copies(map) - copies, 1);
  cr_assert(sl_cow_map_check(map));
  memset(value, 9, LARGE);
  cr_assert_eq(sl_cow_map_put(map, "big", 3, value, LARGE), p, "not in place");
  const sl_cow_entry *frozen = d.head;
  cr_assert_not_null(frozen);
  cr_assert_null(frozen->dirty_next);
  large_copy_released(map, frozen, d.epoch, p, LARGE);
}
