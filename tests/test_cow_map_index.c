/* test_cow_map_index.c — a dirty list that loses its index (cow_map.h
 * note 11): when no block can be had for it, the epoch goes on without
 * one.  The writer then follows the list, and the reclaim walk stops
 * fetching ahead until its chain has drained (storage/cow_map.c note 13).
 * The failure is made by sl_cow_map_test_fail_alloc at
 * SL_COW_FAIL_DIRTY_INDEX_BLOCK; everything else is the real map, checked
 * whole (sl_cow_map_check) after each step and against a model, with a
 * delta read by a thread of its own as the checkpoint writer reads it.
 */
#include <errno.h>

#include "test_cow_map.h"

/* Enough keys for a list of three index blocks. */
#define KEYS (2u * SL_COW_INDEX_BLOCK + 500u)
#define VALUE_BYTES 16u

/* Write every key with seed + id, in the model too. */
static void write_all(sl_cow_map *map, model *expect, uint64_t seed) {
  for (uint64_t id = 0; id < KEYS; id++) {
    put_value(map, id, VALUE_BYTES, seed + id);
    model_set(expect, id, VALUE_BYTES, seed + id);
  }
}

/* Read d on a thread of its own, as the checkpoint writer does, into
 * durable (apply_delta also checks the index against the list where there
 * is one); the delta must name every key once. */
static void write_delta(const sl_cow_delta *d, model *durable) {
  writer_job job = {.state = durable, .count = 1};
  job.deltas[0] = *d;
  pthread_t thread;
  cr_assert_eq(pthread_create(&thread, 0, writer_main, &job), 0);
  cr_assert_eq(pthread_join(thread, 0), 0);
  cr_assert_eq(job.errors, 0, "the delta of epoch %u read wrong",
               (unsigned)d->epoch);
  cr_assert_eq(d->entries, KEYS);
}

/* The map checked whole and against expect, then freed with both models. */
static void check_and_free(sl_cow_map *map, model *expect, model *durable) {
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(model_diff_map(expect, map), 0);
  model_free(expect);
  model_free(durable);
  sl_cow_map_destroy(map);
}

static sl_cow_map *new_map(bool rollback) {
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  if (rollback)
    cr_assert_eq(sl_cow_map_enable_rollback(map), 0);
  return map;
}

/* The second block of a new epoch's index cannot be had: its first block
 * is freed, the delta has no index, and the writer's walk of the list
 * still finds every key; the next epoch has its index again. */
static void dropped_then_back(bool rollback) {
  sl_cow_map *map = new_map(rollback);
  model *expect = model_new(KEYS), *durable = model_new(KEYS);
  /* The same writes into a map whose index never fails. */
  sl_cow_map *control = new_map(rollback);
  model *unused = model_new(KEYS);
  write_all(control, unused, 1000);
  sl_cow_map_release(control, sl_cow_map_freeze(control).epoch);
  maintain_all(control);
  /* Before any lookup: lookups take rehash steps, which free memory. */
  uint64_t control_bytes = sl_cow_map_memory_bytes(control);
  model_free(unused);
  sl_cow_map_destroy(control);
  sl_cow_map_test_fail_alloc(map, SL_COW_FAIL_DIRTY_INDEX_BLOCK, 2);
  write_all(map, expect, 1000);
  cr_assert(sl_cow_map_check(map));
  sl_cow_delta d = sl_cow_map_freeze(map);
  cr_assert_null(d.index, "an index block failed: the epoch has none");
  write_delta(&d, durable);
  cr_assert(model_equal(durable, expect));
  sl_cow_map_release(map, d.epoch);
  maintain_all(map);
  /* Nothing of the dropped index is left in the map's count. */
  uint64_t bytes = sl_cow_map_memory_bytes(map);
  cr_assert_eq(bytes, control_bytes, "%lu bytes against %lu",
               (unsigned long)bytes, (unsigned long)control_bytes);
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(model_diff_map(expect, map), 0);

  write_all(map, expect, 2000);
  d = sl_cow_map_freeze(map);
  cr_assert_not_null(d.index, "the next epoch has its index again");
  write_delta(&d, durable);
  cr_assert(model_equal(durable, expect));
  sl_cow_map_release(map, d.epoch);
  maintain_all(map);
  check_and_free(map, expect, durable);
}

Test(cow_map_index, dropped_index_is_followed_by_the_list) {
  dropped_then_back(false);
}

Test(cow_map_index, dropped_index_is_followed_by_the_list_with_rollback) {
  dropped_then_back(true);
}

/* Three epochs pending: the first with its index, the second without
 * (its very first block failed), the third with one.  The first two are
 * released together: the reclaim chain holds an indexed list and then
 * an unindexed one, so it stops fetching ahead (note 13).  It is walked
 * in small steps, each checked, while the keys are written again; the
 * third epoch then joins an empty chain with its index, and fetching
 * ahead starts over. */
static void unindexed_list_in_the_chain(bool rollback) {
  sl_cow_map *map = new_map(rollback);
  model *expect = model_new(KEYS), *durable = model_new(KEYS);
  write_all(map, expect, 1000);
  sl_cow_delta first = sl_cow_map_freeze(map);
  cr_assert_not_null(first.index);
  write_delta(&first, durable);
  sl_cow_map_test_fail_alloc(map, SL_COW_FAIL_DIRTY_INDEX_BLOCK, 1);
  write_all(map, expect, 2000); /* copies: first's versions displaced */
  sl_cow_delta second = sl_cow_map_freeze(map);
  cr_assert_null(second.index);
  write_delta(&second, durable);
  write_all(map, expect, 3000);
  sl_cow_delta third = sl_cow_map_freeze(map);
  cr_assert_not_null(third.index);
  cr_assert(sl_cow_map_check(map));

  sl_cow_map_release(map, second.epoch);
  cr_assert(sl_cow_map_check(map));
  uint64_t steps = 0;
  for (uint32_t budget = 7; sl_cow_map_maintain(map, budget); budget += 5) {
    cr_assert(sl_cow_map_check(map), "after reclaim step %lu",
              (unsigned long)steps);
    if (++steps % 4 == 0) /* writes between the steps copy third's */
      put_value(map, steps % KEYS, VALUE_BYTES, 3000 + steps % KEYS);
  }
  cr_assert_gt(steps, 4, "walked in steps");
  cr_assert_eq(model_diff_map(expect, map), 0);

  write_delta(&third, durable);
  cr_assert(model_equal(durable, expect));
  sl_cow_map_release(map, third.epoch);
  for (uint32_t budget = 3; sl_cow_map_maintain(map, budget); budget += 11)
    cr_assert(sl_cow_map_check(map));
  check_and_free(map, expect, durable);
}

Test(cow_map_index, unindexed_list_in_the_reclaim_chain) {
  unindexed_list_in_the_chain(false);
}

Test(cow_map_index, unindexed_list_in_the_reclaim_chain_with_rollback) {
  unindexed_list_in_the_chain(true);
}
