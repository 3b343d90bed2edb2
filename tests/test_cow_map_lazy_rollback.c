/* test_cow_map_lazy_rollback.c — Criterion tests of the lazy rollback of
 * the copy-on-write map (cow_map_rollback.c notes 5-7): a rollback with no
 * key deleted since the stable epoch only marks the failed epochs, and
 * each key written since goes back on its first touch, or in bounded
 * steps, or all at once before an iteration or another rollback.
 *
 * Each test checks what the rollback left undone is really undone when it
 * is touched: lookups, updates, deletes and inserts of stale keys, before
 * anything (sl_cow_map_foreach, model_diff_map's lookups of every key)
 * could have settled them another way.  sl_cow_map_check() runs between
 * the steps: it knows the lazy state.  Most tests start from one fixture
 * (lazily_rolled_back, on test_cow_map.h's rollback_fixture).  When an
 * allocation the lazy rollback needs fails, it is done at once instead
 * (note 9): sl_cow_map_test_fail_alloc makes each such failure happen.
 *
 * SLUICE_TEST_SCALE=n divides the operation counts by n (sanitizer builds).
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cow_map.h"
#include "sluice.h"
#include "test_cow_map.h"
#include "test_util.h"

#define IDS 512u
#define STABLE_KEYS 100u
#define NEW_KEY 300u /* ids from here on are inserted after the checkpoint */

/* Whether id holds in the map what the model says (present or not). */
static bool holds(sl_cow_map *map, const model *m, uint64_t id) {
  uint32_t bytes = 0;
  const uint8_t *v = get_id(map, id, &bytes);
  const model_slot *s = &m->slots[id];
  if (!s->present)
    return v == 0;
  return v && bytes == s->bytes && memcmp(v, s->value, bytes) == 0;
}

/* The usual failure on the rollback fixture (test_cow_map.h:
 * STABLE_KEYS keys of 16 bytes checkpointed, CLEAN): in an epoch frozen
 * (its checkpoint never completes) and in the current one, updates of
 * the even ids, another size for every fifth, and new keys; no delete,
 * so the rollback is lazy. */
static void fail_after_checkpoint(sl_cow_map *map) {
  for (uint64_t id = 0; id < STABLE_KEYS; id += 2)
    put_value(map, id, 16, 1000 + id);
  put_value(map, NEW_KEY, 8, 1300);
  sl_cow_map_freeze(map);
  for (uint64_t id = 0; id < STABLE_KEYS; id += 5)
    put_value(map, id, 24, 2000 + id); /* a new version, of another size */
  put_value(map, NEW_KEY, 16, 2300);   /* inserted in the frozen epoch */
  put_value(map, NEW_KEY + 1, 8, 2301); /* and in the current one */
  cr_assert(sl_cow_map_check(map));
}

/* Roll back, and check it was lazy: no version visited by the call, the
 * count already right, nothing settled yet. */
static void roll_back_lazily(sl_cow_map *map, const model *stable) {
  /* One still under way is finished first, which settles its keys. */
  bool finishing = sl_cow_map_rollback_pending(map);
  uint64_t visits = sl_cow_map_rollback_visits(map);
  uint64_t settled = sl_cow_map_rollback_settled(map);
  cr_assert_eq(sl_cow_map_rollback(map, sl_cow_map_stable_epoch(map)), 0);
  cr_assert(sl_cow_map_rollback_pending(map));
  cr_assert_eq(sl_cow_map_rollback_visits(map), visits);
  cr_assert(finishing || sl_cow_map_rollback_settled(map) == settled);
  cr_assert_eq(sl_cow_map_count(map), stable->live);
  cr_assert_eq(sl_cow_map_dirty_entries(map), 0);
  cr_assert(sl_cow_map_check(map));
}

/* Most tests' start: the usual failure, rolled back lazily, nothing
 * settled yet; f.stable is the checkpoint the map is back at. */
static rollback_fixture lazily_rolled_back(void) {
  rollback_fixture f = rollback_fixture_at_checkpoint(IDS, STABLE_KEYS, 16);
  fail_after_checkpoint(f.map);
  roll_back_lazily(f.map, f.stable);
  return f;
}

Test(cow_map_lazy_rollback, a_lookup_of_a_stale_key_reads_the_checkpoint) {
  rollback_fixture f = lazily_rolled_back();
  sl_cow_map *map = f.map;
  model *stable = f.stable;
  uint64_t settled = sl_cow_map_rollback_settled(map);
  cr_assert(holds(map, stable, 10)); /* written in both failed epochs */
  cr_assert_eq(sl_cow_map_rollback_settled(map), settled + 1);
  cr_assert(holds(map, stable, 10)); /* settled once: a plain lookup now */
  cr_assert_eq(sl_cow_map_rollback_settled(map), settled + 1);
  cr_assert(holds(map, stable, 2));  /* written in the frozen one only */
  cr_assert(holds(map, stable, 1));  /* never written: not stale */
  cr_assert_eq(sl_cow_map_rollback_settled(map), settled + 2);
  cr_assert(holds(map, stable, NEW_KEY)); /* inserted since: absent */
  cr_assert_eq(sl_cow_map_count(map), STABLE_KEYS);
  cr_assert(sl_cow_map_check(map));
  cr_assert(sl_cow_map_rollback_pending(map));
  maintain_all(map); /* the rest, in steps */
  cr_assert(!sl_cow_map_rollback_pending(map));
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(model_diff_map(stable, map), 0);
  rollback_fixture_free(&f);
}

Test(cow_map_lazy_rollback, an_update_of_a_stale_key_starts_from_the_checkpoint) {
  rollback_fixture f = lazily_rolled_back();
  sl_cow_map *map = f.map;
  model *stable = f.stable;
  /* sl_cow_map_update() hands out the value as checkpointed. */
  uint8_t key[KEY_MAX_BYTES];
  uint32_t key_bytes = key_make(20, key);
  sl_cow_key k = sl_cow_key_of(key, key_bytes);
  void *v = 0;
  cr_assert_eq(sl_cow_map_update(map, &k, 0, 16, &v), 0);
  cr_assert_eq(memcmp(v, stable->slots[20].value, 16), 0);
  value_fill(v, 16, 5020);
  /* A size other than the checkpoint's is refused, as for any key: the
   * failed epoch's 24 bytes are gone. */
  key_bytes = key_make(40, key);
  k = sl_cow_key_of(key, key_bytes);
  cr_assert_eq(sl_cow_map_update(map, &k, 0, 24, &v), EINVAL);
  cr_assert_eq(sl_cow_map_update(map, &k, 0, 16, &v), 0);
  cr_assert_eq(memcmp(v, stable->slots[40].value, 16), 0);
  value_fill(v, 16, 5040);
  /* A put of a stale key, then the next checkpoint's delta carries both
   * writes and nothing of the failed epochs. */
  put_value(map, 30, 8, 5030);
  model *live = model_new(IDS);
  model_copy(live, stable);
  model_set(live, 20, 16, 5020);
  model_set(live, 40, 16, 5040);
  model_set(live, 30, 8, 5030);
  cr_assert(sl_cow_map_check(map));
  sl_cow_delta d = sl_cow_map_freeze(map);
  cr_assert_eq(d.entries, 3);
  cr_assert_eq(apply_delta(stable, &d), 0);
  cr_assert(model_equal(stable, live));
  sl_cow_map_release(map, d.epoch);
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(model_diff_map(live, map), 0);
  model_free(live);
  rollback_fixture_free(&f);
}

Test(cow_map_lazy_rollback, a_delete_of_a_stale_key) {
  rollback_fixture f = lazily_rolled_back();
  sl_cow_map *map = f.map;
  model *stable = f.stable;
  cr_assert_eq(delete_id(map, 50), 0); /* stale: deleted as checkpointed */
  model_delete(stable, 50);
  cr_assert(holds(map, stable, 50));
  /* Inserted after the checkpoint: absent now, so nothing to delete. */
  cr_assert_eq(delete_id(map, NEW_KEY), SL_ENOTFOUND);
  cr_assert_eq(delete_id(map, NEW_KEY + 1), SL_ENOTFOUND);
  cr_assert_eq(sl_cow_map_count(map), STABLE_KEYS - 1);
  cr_assert(sl_cow_map_check(map));
  maintain_all(map);
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(model_diff_map(stable, map), 0);
  rollback_fixture_free(&f);
}

Test(cow_map_lazy_rollback, an_insert_of_a_key_inserted_after_the_checkpoint) {
  rollback_fixture f = lazily_rolled_back();
  sl_cow_map *map = f.map;
  model *stable = f.stable;
  /* The key still has a stale version in the table: the put must not
   * take it as the key's value. */
  uint8_t key[KEY_MAX_BYTES];
  uint32_t key_bytes = key_make(NEW_KEY, key);
  const uint8_t *p = sl_cow_map_put(map, key, key_bytes, 0, 16);
  cr_assert(p);
  for (uint32_t i = 0; i < 16; i++)
    cr_assert_eq(p[i], 0, "a new key starts zeroed, not as the failed one");
  put_value(map, NEW_KEY, 16, 6300);
  model_set(stable, NEW_KEY, 16, 6300);
  /* The same through sl_cow_map_update(), with init. */
  uint8_t init[8];
  value_fill(init, 8, 6301);
  key_bytes = key_make(NEW_KEY + 1, key);
  sl_cow_key k = sl_cow_key_of(key, key_bytes);
  void *v = 0;
  cr_assert_eq(sl_cow_map_update(map, &k, init, 8, &v), 0);
  cr_assert_eq(memcmp(v, init, 8), 0);
  model_set(stable, NEW_KEY + 1, 8, 6301);
  cr_assert_eq(sl_cow_map_count(map), STABLE_KEYS + 2);
  cr_assert(sl_cow_map_check(map));
  maintain_all(map);
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(sl_cow_map_count(map), STABLE_KEYS + 2);
  cr_assert_eq(model_diff_map(stable, map), 0);
  rollback_fixture_free(&f);
}

/* A freeze needs no settling (note 7): the delta holds the writes since
 * the rollback only, and applied to the checkpoint gives the live state;
 * its checkpoint completes while stale versions are still in the table,
 * and a rollback to it comes back to it. */
Test(cow_map_lazy_rollback, a_freeze_and_a_release_while_pending) {
  rollback_fixture f = lazily_rolled_back();
  sl_cow_map *map = f.map;
  model *stable = f.stable;
  model *live = model_new(IDS);
  model_copy(live, stable);
  put_value(map, 4, 16, 7004);
  model_set(live, 4, 16, 7004);
  put_value(map, NEW_KEY + 2, 8, 7302);
  model_set(live, NEW_KEY + 2, 8, 7302);
  sl_cow_delta d = sl_cow_map_freeze(map);
  cr_assert(sl_cow_map_rollback_pending(map));
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(apply_delta(stable, &d), 0);
  cr_assert(model_equal(stable, live));
  sl_cow_map_release(map, d.epoch);
  cr_assert(sl_cow_map_rollback_pending(map));
  cr_assert(sl_cow_map_check(map));
  /* Writes after that checkpoint, then a rollback to it: the first lazy
   * rollback is finished first, then the second is lazy in turn. */
  put_value(map, 6, 16, 8006);
  put_value(map, NEW_KEY + 3, 8, 8303);
  roll_back_lazily(map, stable);
  cr_assert(sl_cow_map_check(map));
  cr_assert(holds(map, stable, 6));
  cr_assert(holds(map, stable, 4));
  cr_assert(holds(map, stable, NEW_KEY + 3));
  cr_assert_eq(model_diff_map(stable, map), 0);
  maintain_all(map);
  cr_assert(sl_cow_map_check(map));
  model_free(live);
  rollback_fixture_free(&f);
}

/* A second failure before the first rollback has settled anything: the
 * second rolls back to the same checkpoint, first lazily, then (a key was
 * deleted meanwhile) at once; and a third with nothing written. */
Test(cow_map_lazy_rollback, a_second_rollback_while_pending) {
  rollback_fixture f = lazily_rolled_back();
  sl_cow_map *map = f.map;
  model *stable = f.stable;
  for (uint64_t id = 0; id < STABLE_KEYS; id += 3)
    put_value(map, id, 8, 9000 + id);
  put_value(map, NEW_KEY, 8, 9300);
  roll_back_lazily(map, stable);
  cr_assert(holds(map, stable, 0));
  cr_assert(holds(map, stable, NEW_KEY));
  put_value(map, 7, 8, 9507);
  cr_assert_eq(delete_id(map, 8), 0);
  cr_assert_eq(sl_cow_map_rollback(map, sl_cow_map_stable_epoch(map)), 0);
  cr_assert(!sl_cow_map_rollback_pending(map)); /* a delete: at once */
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(model_diff_map(stable, map), 0);
  cr_assert_eq(sl_cow_map_rollback(map, sl_cow_map_stable_epoch(map)), 0);
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(model_diff_map(stable, map), 0);
  cr_assert_eq(sl_cow_map_rollbacks(map), 4);
  rollback_fixture_free(&f);
}

typedef struct visit {
  const model *stable;
  uint64_t seen;
  uint64_t wrong;
} visit;

static int visit_entry(void *arg, const sl_cow_entry *e) {
  visit *v = arg;
  uint64_t id;
  v->seen++;
  if (!key_parse(sl_cow_entry_key(e), e->key_bytes, &id) || id >= IDS) {
    v->wrong++;
    return 0;
  }
  const model_slot *s = &v->stable->slots[id];
  v->wrong += !s->present || s->bytes != e->value_bytes ||
              memcmp(entry_value(e), s->value, s->bytes) != 0;
  return 0;
}

/* An iteration sees the checkpoint's entries only: it finishes the lazy
 * rollback first (note 7). */
Test(cow_map_lazy_rollback, an_iteration_while_pending) {
  rollback_fixture f = lazily_rolled_back();
  sl_cow_map *map = f.map;
  model *stable = f.stable;
  cr_assert(holds(map, stable, 10)); /* one settled before */
  visit v = {.stable = stable};
  cr_assert_eq(sl_cow_map_foreach(map, visit_entry, &v), 0);
  cr_assert(!sl_cow_map_rollback_pending(map));
  cr_assert_eq(v.wrong, 0);
  cr_assert_eq(v.seen, STABLE_KEYS);
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(model_diff_map(stable, map), 0);
  rollback_fixture_free(&f);
}

/* The call's own work does not follow the writes since the checkpoint:
 * none at all, in a state 32 times larger as in a small one, and for 8
 * times the writes; the undoing (settled versions:
 * one per key written since) is done afterwards, by the steps. */
static uint64_t settled_after(uint64_t keys, uint64_t written) {
  rollback_fixture f = rollback_fixture_at_checkpoint(0, keys, 8);
  sl_cow_map *map = f.map;
  uint64_t steady = sl_cow_map_memory_bytes(map);
  for (uint64_t id = 0; id < written; id++)
    put_value(map, id % keys, 8, 100000 + id);
  sl_cow_map_freeze(map);
  for (uint64_t id = 0; id < written; id += 2)
    put_value(map, id % keys, 8, 200000 + id);
  for (uint64_t id = keys; id < keys + written / 8; id++)
    put_value(map, id, 8, id);
  uint64_t visits = sl_cow_map_rollback_visits(map);
  cr_assert_eq(sl_cow_map_rollback(map, sl_cow_map_stable_epoch(map)), 0);
  cr_assert_eq(sl_cow_map_rollback_visits(map), visits);
  cr_assert(sl_cow_map_rollback_pending(map));
  cr_assert_eq(sl_cow_map_rollback_settled(map), 0);
  cr_assert_eq(sl_cow_map_count(map), keys);
  /* Bounded steps: a call settles and frees at most its budget. */
  cr_assert(sl_cow_map_maintain(map, 8));
  cr_assert(sl_cow_map_rollback_pending(map));
  maintain_all(map);
  cr_assert(!sl_cow_map_rollback_pending(map));
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(sl_cow_map_memory_bytes(map), steady);
  for (uint64_t id = 0; id < keys + written / 8; id += 1 + id / 64) {
    uint32_t bytes = 0;
    const uint8_t *v = get_id(map, id, &bytes);
    if (id >= keys) {
      cr_assert_null(v);
      continue;
    }
    uint8_t expected[8];
    value_fill(expected, 8, id);
    cr_assert(v && bytes == 8 && memcmp(v, expected, 8) == 0);
  }
  uint64_t settled = sl_cow_map_rollback_settled(map);
  rollback_fixture_free(&f);
  return settled;
}

Test(cow_map_lazy_rollback, the_call_does_no_work_per_write) {
  uint64_t written = sl_test_scaled(4096, 512);
  /* Key counts well below a power of two: the new keys do not grow the
   * table, so the memory comes back to the checkpoint's exactly. */
  uint64_t small = settled_after(written * 3, written);
  uint64_t large = settled_after(written * 96, written);
  /* Each key written since the checkpoint settled once: the distinct
   * keys written, and the new ones. */
  uint64_t expected = written + written / 8;
  cr_assert_eq(small, expected, "%llu settled, %llu expected",
               (unsigned long long)small, (unsigned long long)expected);
  cr_assert_eq(large, expected);
  /* Eight times the writes: still nothing in the call. */
  uint64_t more = settled_after(written * 96, written * 8);
  cr_assert_eq(more, written * 8 + written);
}

/* Destroyed with a lazy rollback under way: the versions waiting to go
 * back are on no list, and must not leak (the sanitizer build, which has
 * no arena to reset, walks the map). */
Test(cow_map_lazy_rollback, destroyed_while_pending) {
  rollback_fixture f = lazily_rolled_back();
  sl_cow_map *map = f.map;
  model *stable = f.stable;
  cr_assert(holds(map, stable, 0));
  rollback_fixture_free(&f);
}

/* ------------------------------------------- allocation failures */

/* A rollback that could not be lazy (cow_map_rollback.c note 9) and was
 * done at once instead: the call visited the versions written since the
 * checkpoint, nothing waits to be settled, and the map is the
 * checkpoint's, as the model has it. */
static void expect_rolled_back_at_once(sl_cow_map *map, const model *stable) {
  uint64_t visits = sl_cow_map_rollback_visits(map);
  uint64_t settled = sl_cow_map_rollback_settled(map);
  uint64_t rollbacks = sl_cow_map_rollbacks(map);
  cr_assert_eq(sl_cow_map_rollback(map, sl_cow_map_stable_epoch(map)), 0);
  cr_assert_eq(sl_cow_map_rollbacks(map), rollbacks + 1);
  cr_assert_not(sl_cow_map_rollback_pending(map), "the rollback was lazy");
  cr_assert_gt(sl_cow_map_rollback_visits(map), visits);
  cr_assert_eq(sl_cow_map_rollback_settled(map), settled);
  cr_assert_eq(sl_cow_map_dirty_entries(map), 0);
  const sl_cow_delta *deltas;
  int count;
  sl_cow_map_pending(map, &deltas, &count);
  cr_assert_eq(count, 0);
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(model_diff_map(stable, map), 0);
}

/* After a fallback the map goes on as before: the next failure's
 * rollback is lazy again, and comes back to the same checkpoint. */
static void expect_lazy_again(sl_cow_map *map, const model *stable) {
  maintain_all(map); /* the dropped versions of the fallback */
  fail_after_checkpoint(map);
  roll_back_lazily(map, stable);
  cr_assert(holds(map, stable, 10));
  maintain_all(map);
  cr_assert_not(sl_cow_map_rollback_pending(map));
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(model_diff_map(stable, map), 0);
}

/* Note 9, the first fallback: a block of the undo list's index cannot be
 * had while the failed epochs write, so the index is dropped (the writes
 * go on), and the rollback follows the undo list at once.  The block that
 * fails is the first (nothing indexed yet) or the second (one full block
 * to free). */
Test(cow_map_lazy_rollback, an_undo_index_block_fails_so_it_is_done_at_once) {
  uint64_t keys = SL_COW_INDEX_BLOCK + 100;
  for (uint32_t nth = 1; nth <= 2; nth++) {
    /* Ids up to keys + 5, which has no version at the checkpoint. */
    rollback_fixture f = rollback_fixture_at_checkpoint(keys + 6, keys, 16);
    sl_cow_map_test_fail_alloc(f.map, SL_COW_FAIL_UNDO_INDEX_BLOCK, nth);
    for (uint64_t id = 0; id < keys; id++) /* a displacement each */
      put_value(f.map, id, 16, 10000 + id);
    sl_cow_map_freeze(f.map); /* never completes */
    for (uint64_t id = 0; id < keys; id += 3)
      put_value(f.map, id, 24, 20000 + id);
    put_value(f.map, keys + 5, 8, 5); /* inserted: the unlink pass runs */
    cr_assert(sl_cow_map_check(f.map));
    expect_rolled_back_at_once(f.map, f.stable);
    expect_lazy_again(f.map, f.stable);
    rollback_fixture_free(&f);
  }
}

/* Note 9, the second fallback: the lazy rollback's array of the undo
 * index's blocks cannot be had, so the rollback, the map unaltered by the
 * attempt, is done at once.  Armed for the second rollback, the first is
 * lazy as usual. */
Test(cow_map_lazy_rollback, the_lazy_blocks_fail_so_it_is_done_at_once) {
  rollback_fixture f = rollback_fixture_at_checkpoint(IDS, STABLE_KEYS, 16);
  sl_cow_map_test_fail_alloc(f.map, SL_COW_FAIL_LAZY_BLOCKS, 2);
  fail_after_checkpoint(f.map);
  roll_back_lazily(f.map, f.stable); /* the first allocation passes */
  maintain_all(f.map);
  cr_assert_eq(model_diff_map(f.stable, f.map), 0);
  fail_after_checkpoint(f.map);
  expect_rolled_back_at_once(f.map, f.stable); /* the second fails */
  expect_lazy_again(f.map, f.stable);
  rollback_fixture_free(&f);
}

/* ---------------------------------------------------- random property */

/* Random writes, checkpoints that complete or not, rollbacks and steps,
 * with deletes only in some stretches, so most rollbacks are lazy and
 * many come while another is still under way; the live map is compared
 * with the model key by key (lookups, which settle) and checked whole. */
Test(cow_map_lazy_rollback, random_writes_and_lazy_rollbacks, .timeout = 300) {
  sl_cow_map *map = rollback_map();
  model *durable = model_new(IDS);
  mutator mu = {.map = map, .live = model_new(IDS), .rng = 0x1a2b,
                .id_range = IDS, .delete_percent = 0};
  uint64_t steps = sl_test_scaled(200000, 20000);
  uint64_t lazy = 0, pending_at_rollback = 0;
  sl_cow_delta frozen[8];
  model *at_freeze[8];
  int frozen_count = 0;
  for (uint64_t step = 0; step < steps; step++) {
    if (step % 5000 == 0) /* deletes in one stretch of four */
      mu.delete_percent = step % 20000 == 0 ? 10 : 0;
    mutate_once(&mu);
    uint32_t dice = rng_below(&mu.rng, 1000);
    if (dice < 8 && frozen_count < 8) {
      frozen[frozen_count] = sl_cow_map_freeze(map);
      at_freeze[frozen_count] = model_new(IDS);
      model_copy(at_freeze[frozen_count], mu.live);
      frozen_count++;
    } else if (dice < 12 && frozen_count > 0) {
      /* The oldest checkpoint completes: the writer applies its delta. */
      cr_assert_eq(apply_delta(durable, &frozen[0]), 0);
      cr_assert(model_equal(durable, at_freeze[0]));
      sl_cow_map_release(map, frozen[0].epoch);
      model_free(at_freeze[0]);
      frozen_count--;
      memmove(frozen, frozen + 1, sizeof frozen[0] * (size_t)frozen_count);
      memmove(at_freeze, at_freeze + 1,
              sizeof at_freeze[0] * (size_t)frozen_count);
    } else if (dice < 15) {
      pending_at_rollback += sl_cow_map_rollback_pending(map);
      cr_assert_eq(sl_cow_map_rollback(map, sl_cow_map_stable_epoch(map)), 0);
      lazy += sl_cow_map_rollback_pending(map);
      for (int i = 0; i < frozen_count; i++)
        model_free(at_freeze[i]);
      frozen_count = 0;
      model_copy(mu.live, durable);
      cr_assert_eq(sl_cow_map_count(map), durable->live);
    } else if (dice < 30) {
      sl_cow_map_maintain(map, rng_below(&mu.rng, 16));
    }
    if (step % 499 == 0) {
      cr_assert(sl_cow_map_check(map));
      /* Lookups of a few keys only, so much stays unsettled. */
      for (int i = 0; i < 8; i++)
        cr_assert(holds(map, mu.live, rng_below(&mu.rng, IDS)));
    }
    if (step % 4999 == 0)
      cr_assert_eq(model_diff_map(mu.live, map), 0);
  }
  cr_assert_eq(mu.errors, 0);
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(model_diff_map(mu.live, map), 0);
  cr_assert_gt(lazy, 10);
  cr_assert_gt(pending_at_rollback, 3);
  for (int i = 0; i < frozen_count; i++)
    model_free(at_freeze[i]);
  model_free(mu.live);
  model_free(durable);
  sl_cow_map_destroy(map);
}
