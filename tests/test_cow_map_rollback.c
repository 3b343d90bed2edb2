/* test_cow_map_rollback.c — Criterion tests of rolling the copy-on-write
 * map back in memory to its stable epoch (cow_map.h note 10).
 *
 * The reference is the model of test_cow_map.h: a copy of it taken at each
 * freeze is the state that epoch's checkpoint holds, and the "durable"
 * model is what a checkpoint writer builds by applying the released
 * deltas.  After a rollback the map must equal both (the durable state and
 * the snapshot of the stable epoch), pass sl_cow_map_check(), and go on
 * working: more writes, checkpoints and rollbacks.
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
#define PENDING_MAX 6

static void update_id(sl_cow_map *map, uint64_t id, uint32_t bytes,
                      uint64_t seed) {
  uint8_t key[KEY_MAX_BYTES];
  uint32_t key_bytes = key_make(id, key);
  sl_cow_key k = sl_cow_key_of(key, key_bytes);
  void *v = 0;
  cr_assert_eq(sl_cow_map_update(map, &k, 0, bytes, &v), 0);
  value_fill(v, bytes, seed);
}

static void expect_rollback_to(sl_cow_map *map, const model *stable) {
  cr_assert_eq(sl_cow_map_rollback(map, sl_cow_map_stable_epoch(map)), 0);
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(model_diff_map(stable, map), 0);
  cr_assert_eq(sl_cow_map_dirty_entries(map), 0);
  const sl_cow_delta *deltas;
  int count;
  sl_cow_map_pending(map, &deltas, &count);
  cr_assert_eq(count, 0);
}

/* Every kind of write since the checkpoint is undone: a put of the same
 * size (in place without rollback), of another size, an update, a delete,
 * an insert, a key written several times, and one deleted then put back. */
Test(cow_map_rollback, insert_update_delete_since_the_checkpoint) {
  /* 100 keys checkpointed, their versions CLEAN. */
  rollback_fixture f = rollback_fixture_at_checkpoint(IDS, 100, 16);
  sl_cow_map *map = f.map;
  model *stable = f.stable;
  put_value(map, 1, 16, 1001);    /* same size */
  put_value(map, 2, 40, 1002);    /* another size */
  update_id(map, 3, 16, 1003);    /* read-modify-write */
  cr_assert_eq(delete_id(map, 4), 0);
  put_value(map, 200, 8, 1200);   /* new key */
  for (uint64_t i = 0; i < 5; i++)
    put_value(map, 5, (uint32_t)(8 + i * 8), 2000 + i); /* again and again */
  cr_assert_eq(delete_id(map, 6), 0);
  put_value(map, 6, 16, 1006);    /* deleted, then back */
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(sl_cow_map_undo_entries(map), 6); /* 1 2 3 4 5 6: once each */
  expect_rollback_to(map, stable);
  cr_assert_eq(sl_cow_map_undo_entries(map), 0); /* all were taken back */
  cr_assert_eq(sl_cow_map_rollbacks(map), 1);

  /* It goes on: another checkpoint with writes, writes after it, and a
   * second rollback returns to the second checkpoint. */
  put_value(map, 7, 16, 3007);
  model_set(stable, 7, 16, 3007);
  cr_assert_eq(delete_id(map, 8), 0);
  model_delete(stable, 8);
  checkpoint(map);
  put_value(map, 7, 16, 4007);
  put_value(map, 9, 24, 4009);
  put_value(map, 300, 24, 4300);
  expect_rollback_to(map, stable);
  rollback_fixture_free(&f);
}

/* A rollback right after a release, before any reclaiming: the released
 * lists are still on the reclaim chain, versions of them displaced since
 * are undo versions there.  Then the reclaim finishes on the restored map. */
Test(cow_map_rollback, right_after_release_before_reclaiming) {
  sl_cow_map *map = rollback_map();
  model *stable = model_new(IDS);
  for (uint64_t id = 0; id < 200; id++) {
    put_value(map, id, 24, id);
    model_set(stable, id, 24, id);
  }
  checkpoint(map); /* nothing reclaimed yet */
  for (uint64_t id = 0; id < 200; id += 2)
    update_id(map, id, 24, 5000 + id);
  for (uint64_t id = 1; id < 200; id += 6)
    cr_assert_eq(delete_id(map, id), 0);
  expect_rollback_to(map, stable);
  maintain_all(map);
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(model_diff_map(stable, map), 0);
  cr_assert_eq(sl_cow_map_undo_entries(map), 0);
  /* Released again after more writes, then rolled back once more. */
  for (uint64_t id = 0; id < 200; id += 3) {
    put_value(map, id, 32, 7000 + id);
    model_set(stable, id, 32, 7000 + id);
  }
  checkpoint(map);
  for (uint64_t id = 0; id < 200; id += 5)
    put_value(map, id, 8, 9000 + id);
  expect_rollback_to(map, stable);
  model_free(stable);
  sl_cow_map_destroy(map);
}

/* Several frozen epochs at once: the ones after the stable epoch are
 * dropped (their checkpoints did not complete), whatever was written in
 * them, also to versions of each other. */
Test(cow_map_rollback, several_frozen_epochs_are_dropped) {
  sl_cow_map *map = rollback_map();
  model *stable = model_new(IDS);
  for (uint64_t id = 0; id < 50; id++) {
    put_value(map, id, 16, id);
    model_set(stable, id, 16, id);
  }
  checkpoint(map);
  for (int epoch = 0; epoch < 4; epoch++) {
    for (uint64_t id = (uint64_t)epoch; id < 80; id += 3)
      put_value(map, id, (uint32_t)(16 + epoch * 8), 100u * (uint64_t)epoch + id);
    cr_assert_eq(delete_id(map, 40u + (uint64_t)epoch), 0);
    sl_cow_map_freeze(map); /* frozen, never released: aborted */
  }
  put_value(map, 10, 8, 77);
  expect_rollback_to(map, stable);
  model_free(stable);
  sl_cow_map_destroy(map);
}

/* Rollback of a bulk-loaded map (a restored checkpoint, stable epoch 0):
 * its arena versions come back from the undo list. */
Test(cow_map_rollback, loaded_state_comes_back) {
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  model *stable = model_new(IDS);
  for (uint64_t id = 0; id < 300; id++) {
    uint8_t key[KEY_MAX_BYTES], value[VALUE_MAX_BYTES];
    uint32_t key_bytes = key_make(id, key);
    value_fill(value, 20, id);
    cr_assert_eq(sl_cow_map_load_add(map, 0, key, key_bytes, value, 20), 0);
    model_put(stable, id, value, 20);
  }
  cr_assert_eq(sl_cow_map_load_finish(map), 0);
  cr_assert_eq(sl_cow_map_enable_rollback(map), 0);
  for (uint64_t id = 0; id < 300; id += 2)
    update_id(map, id, 20, 100000 + id);
  for (uint64_t id = 1; id < 300; id += 4)
    cr_assert_eq(delete_id(map, id), 0);
  sl_cow_map_freeze(map);
  put_value(map, 3, 20, 5);
  expect_rollback_to(map, stable);
  model_free(stable);
  sl_cow_map_destroy(map);
}

Test(cow_map_rollback, refused_when_it_cannot_be_exact) {
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  cr_assert_eq(sl_cow_map_rollback(map, 0), EINVAL); /* off */
  put_value(map, 1, 8, 1);
  cr_assert_eq(sl_cow_map_enable_rollback(map), EBUSY); /* a write since */
  sl_cow_delta d = sl_cow_map_freeze(map);
  cr_assert_eq(sl_cow_map_enable_rollback(map), EBUSY); /* pending */
  sl_cow_map_release(map, d.epoch);
  cr_assert_eq(sl_cow_map_enable_rollback(map), 0);
  cr_assert_eq(sl_cow_map_enable_rollback(map), 0); /* again: no change */
  cr_assert_eq(sl_cow_map_stable_epoch(map), d.epoch);
  put_value(map, 1, 8, 2);
  cr_assert_eq(sl_cow_map_rollback(map, d.epoch + 1), EINVAL); /* not stable */
  uint32_t bytes;
  const uint8_t *v = get_id(map, 1, &bytes); /* unaltered by the refusal */
  uint8_t expected[8];
  value_fill(expected, 8, 2);
  cr_assert(v && bytes == 8 && memcmp(v, expected, 8) == 0);
  cr_assert_eq(sl_cow_map_rollback(map, d.epoch), 0);
  v = get_id(map, 1, &bytes);
  value_fill(expected, 8, 1);
  cr_assert(v && bytes == 8 && memcmp(v, expected, 8) == 0);
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_destroy(map);
}

/* Only displaced versions of the stable state are kept, once per key, and
 * they go once their displacement is stable: memory comes back to what
 * the state needs. */
Test(cow_map_rollback, keeps_one_copy_per_key_written_and_frees_it) {
  rollback_fixture f = rollback_fixture_at_checkpoint(0, 400, 32);
  sl_cow_map *map = f.map;
  uint64_t steady = sl_cow_map_memory_bytes(map);
  for (int round = 0; round < 20; round++)
    for (uint64_t id = 0; id < 100; id++)
      update_id(map, id, 32, 1000u * (uint64_t)round + id);
  cr_assert_eq(sl_cow_map_undo_entries(map), 100);
  checkpoint(map);
  maintain_all(map);
  cr_assert_eq(sl_cow_map_undo_entries(map), 0);
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(sl_cow_map_memory_bytes(map), steady);
  rollback_fixture_free(&f);
}

/* A map of `keys` keys at a completed checkpoint, then the same writes
 * since it as rollback_work_is_in_the_writes_not_the_state makes in each
 * map: ids 0..written-1 in a frozen epoch (its checkpoint never
 * completes), every other one of them again, a few deletes and new keys in
 * the current one.  Returns the versions the rollback handled; the map is
 * checked to be back at the checkpoint. */
static uint64_t rollback_visits_after_writes(uint64_t keys, uint64_t written) {
  /* Every version CLEAN, nothing left to reclaim. */
  rollback_fixture f = rollback_fixture_at_checkpoint(0, keys, 8);
  sl_cow_map *map = f.map;
  for (uint64_t id = 0; id < written; id++)
    update_id(map, id, 8, 100000 + id);
  sl_cow_map_freeze(map);
  for (uint64_t id = 0; id < written; id += 2)
    update_id(map, id, 8, 200000 + id);
  for (uint64_t id = 1; id < written; id += 8)
    cr_assert_eq(delete_id(map, id), 0);
  for (uint64_t id = keys; id < keys + written / 4; id++)
    put_value(map, id, 8, id); /* new keys, gone again after the rollback */
  uint64_t before = sl_cow_map_rollback_visits(map);
  cr_assert_eq(sl_cow_map_rollback(map, sl_cow_map_stable_epoch(map)), 0);
  uint64_t visits = sl_cow_map_rollback_visits(map) - before;
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(sl_cow_map_count(map), keys);
  for (uint64_t id = 0; id < keys + written / 4; id += 1 + id / 64) {
    uint32_t bytes = 0;
    const uint8_t *v = get_id(map, id, &bytes);
    if (id >= keys) {
      cr_assert_null(v, "new key %llu outlived the rollback",
                     (unsigned long long)id);
      continue;
    }
    uint8_t expected[8];
    value_fill(expected, 8, id);
    cr_assert(v && bytes == 8 && memcmp(v, expected, 8) == 0,
              "key %llu is not as checkpointed", (unsigned long long)id);
  }
  rollback_fixture_free(&f);
  return visits;
}

/* cow_map_rollback.c note 4: the undo list's index.  More displacements
 * than one index block holds in each of two epochs; the first epoch's
 * checkpoint completes while the second's is pending, so the undo list
 * then starts in the middle of a block, and a block wholly released is
 * freed.  Writes in the current epoch follow.  The rollback, which reads
 * the index from there, returns to the first checkpoint; afterwards the
 * index is empty (its memory back: sl_cow_map_check counts it) and works
 * again for the next rollback. */
Test(cow_map_rollback, the_undo_index_spans_blocks_and_partial_releases) {
  uint64_t block = SL_COW_INDEX_BLOCK;
  uint64_t keys = 3 * block + 100;
  /* Every version CLEAN. */
  rollback_fixture f = rollback_fixture_at_checkpoint(keys, keys, 8);
  sl_cow_map *map = f.map;
  model *stable = f.stable;
  uint64_t steady = sl_cow_map_memory_bytes(map);
  uint64_t first = block + block / 4; /* epoch A: over one block */
  for (uint64_t id = 0; id < first; id++) {
    update_id(map, id, 8, 10000 + id);
    model_set(stable, id, 8, 10000 + id);
  }
  sl_cow_delta a = sl_cow_map_freeze(map);
  for (uint64_t id = first; id < keys; id++) /* epoch B: two blocks more */
    update_id(map, id, 8, 20000 + id);
  sl_cow_map_freeze(map);
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_release(map, a.epoch); /* A's checkpoint completes; B's not */
  cr_assert_eq(sl_cow_map_stable_epoch(map), a.epoch);
  cr_assert_eq(sl_cow_map_undo_entries(map), keys); /* A's until reclaimed */
  cr_assert(sl_cow_map_check(map));
  for (uint64_t id = 0; id < keys; id += 3) /* the current epoch */
    update_id(map, id, 8, 30000 + id);
  for (uint64_t id = 1; id < keys; id += 97)
    cr_assert_eq(delete_id(map, id), 0);
  cr_assert(sl_cow_map_check(map));
  expect_rollback_to(map, stable);
  maintain_all(map);
  cr_assert_eq(sl_cow_map_undo_entries(map), 0);
  cr_assert(sl_cow_map_check(map));

  /* Again from the restored map: writes over two blocks, a rollback. */
  for (int round = 0; round < 2; round++)
    for (uint64_t id = 0; id < keys; id += 1 + (uint64_t)round)
      update_id(map, id, 8, 40000 + id);
  expect_rollback_to(map, stable);
  maintain_all(map);
  checkpoint(map);
  maintain_all(map);
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(sl_cow_map_memory_bytes(map), steady);
  rollback_fixture_free(&f);
}

/* cow_map.h note 10: a rollback's work is in the writes since the stable
 * epoch, not in the size of the state.  The same writes into a state 64
 * times larger visit exactly the same versions, and as many as the
 * writes made: each write of a frozen or current epoch (its version), and
 * each version it displaced (on the undo list). */
Test(cow_map_rollback, rollback_work_is_in_the_writes_not_the_state) {
  uint64_t written = sl_test_scaled(2048, 256);
  uint64_t small = rollback_visits_after_writes(written * 2, written);
  uint64_t large = rollback_visits_after_writes(written * 128, written);
  cr_assert_eq(small, large, "%llu versions visited at %llu keys, %llu at "
               "%llu", (unsigned long long)small,
               (unsigned long long)(written * 2), (unsigned long long)large,
               (unsigned long long)(written * 128));
  /* The lists: written versions in the frozen epoch; in the current one
   * the even ids again, the deletes (odd ids, so a tombstone version
   * each) and the new keys.  The undo list: the version each write of a
   * key not yet written in its epoch displaced (none for a new key). */
  uint64_t again = (written + 1) / 2, deletes = (written + 6) / 8;
  uint64_t fresh = written / 4;
  uint64_t expected = 2 * (written + again + deletes) + fresh;
  cr_assert_eq(small, expected, "%llu versions visited, %llu expected",
               (unsigned long long)small, (unsigned long long)expected);
}

/* cow_map_rollback.c note 1: when every key written since the checkpoint
 * existed at it, the rollback handles the undo list alone (one visit per
 * key written, none per version of the failed epochs), across several
 * undo index blocks; the dropped epochs' versions are freed afterwards, in
 * bounded steps, and the memory comes back to the checkpoint's. */
Test(cow_map_rollback, keys_all_known_at_the_checkpoint_skip_the_lists) {
  uint64_t keys = SL_COW_INDEX_BLOCK * 3 + 17;
  rollback_fixture f = rollback_fixture_at_checkpoint(keys, keys, 16);
  sl_cow_map *map = f.map;
  model *stable = f.stable;
  uint64_t steady = sl_cow_map_memory_bytes(map);
  for (uint64_t id = 0; id < keys; id++)
    update_id(map, id, 16, 10000 + id);
  sl_cow_map_freeze(map); /* never completes */
  for (uint64_t id = 0; id < keys; id += 2)
    put_value(map, id, 40, 20000 + id); /* another size: a new version */
  for (uint64_t id = 1; id < keys; id += 10)
    cr_assert_eq(delete_id(map, id), 0);
  uint64_t undo = sl_cow_map_undo_entries(map);
  cr_assert_eq(undo, keys + (keys + 1) / 2 + (keys + 8) / 10);
  uint64_t before = sl_cow_map_rollback_visits(map);
  expect_rollback_to(map, stable);
  cr_assert_eq(sl_cow_map_rollback_visits(map) - before, undo);
  cr_assert_gt(sl_cow_map_memory_bytes(map), steady); /* not freed yet */
  /* Bounded: a call of the steps frees at most its budget. */
  cr_assert(sl_cow_map_maintain(map, 8));
  cr_assert(sl_cow_map_check(map));
  maintain_all(map);
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(sl_cow_map_memory_bytes(map), steady);
  cr_assert_eq(model_diff_map(stable, map), 0);
  rollback_fixture_free(&f);
}

/* A second failure right after the first: the first rollback's dropped
 * versions are not freed yet when writes, a completed checkpoint (before
 * any reclaiming), new keys and a deletion come, and a second rollback
 * returns to that checkpoint.  Then once more with nothing written at all,
 * and the map is destroyed with dropped versions still waiting (freed by
 * destroy: the sanitizer build checks for leaks). */
Test(cow_map_rollback, a_second_rollback_before_the_first_is_reclaimed) {
  rollback_fixture f = rollback_fixture_at_checkpoint(IDS, 300, 24);
  sl_cow_map *map = f.map;
  model *stable = f.stable;
  for (uint64_t id = 0; id < 300; id += 2)
    update_id(map, id, 24, 1000 + id);
  put_value(map, 400, 24, 1400); /* a new key: the unlink pass runs */
  expect_rollback_to(map, stable);
  for (uint64_t id = 0; id < 300; id += 3) {
    put_value(map, id, 8, 2000 + id);
    model_set(stable, id, 8, 2000 + id);
  }
  put_value(map, 401, 8, 2401);
  model_set(stable, 401, 8, 2401);
  cr_assert_eq(delete_id(map, 5), 0);
  model_delete(stable, 5);
  checkpoint(map); /* the lists released, nothing reclaimed */
  for (uint64_t id = 0; id < 300; id += 4)
    put_value(map, id, 16, 3000 + id);
  put_value(map, 402, 8, 3402);
  cr_assert_eq(delete_id(map, 401), 0);
  put_value(map, 5, 8, 3005); /* deleted at the checkpoint: inserted */
  expect_rollback_to(map, stable);
  expect_rollback_to(map, stable); /* nothing since: a no-op */
  for (uint64_t id = 0; id < 300; id += 7)
    put_value(map, id, 8, 4000 + id);
  expect_rollback_to(map, stable);
  rollback_fixture_free(&f);
}

/* ---------------------------------------------------- random property */

typedef struct pending_epoch {
  uint32_t epoch;
  sl_cow_delta delta;
  model *at_freeze;
} pending_epoch;

typedef struct history {
  sl_cow_map *map;
  model *durable; /* what the writer built from the released deltas */
  pending_epoch pending[PENDING_MAX];
  int count;
} history;

static void history_freeze(history *h, const model *live) {
  if (h->count == PENDING_MAX) { /* the oldest was aborted: forget it */
    model_free(h->pending[0].at_freeze);
    memmove(h->pending, h->pending + 1, sizeof h->pending[0] * (PENDING_MAX - 1));
    h->count--;
  }
  pending_epoch *p = &h->pending[h->count++];
  p->delta = sl_cow_map_freeze(h->map);
  p->epoch = p->delta.epoch;
  p->at_freeze = model_new(IDS);
  model_copy(p->at_freeze, live);
}

/* Checkpoint of pending[k] completes: the writer wrote every pending delta
 * up to it (sl_cow_map_pending, as the engine's ack carries them). */
static void history_complete(history *h, int k) {
  const sl_cow_delta *deltas;
  int count;
  sl_cow_map_pending(h->map, &deltas, &count);
  for (int i = 0; i < count && deltas[i].epoch <= h->pending[k].epoch; i++)
    cr_assert_eq(apply_delta(h->durable, &deltas[i]), 0);
  cr_assert(model_equal(h->durable, h->pending[k].at_freeze));
  sl_cow_map_release(h->map, h->pending[k].epoch);
  for (int i = 0; i <= k; i++)
    model_free(h->pending[i].at_freeze);
  memmove(h->pending, h->pending + k + 1,
          sizeof h->pending[0] * (size_t)(h->count - k - 1));
  h->count -= k + 1;
}

static void history_rollback(history *h, model *live) {
  expect_rollback_to(h->map, h->durable);
  for (int i = 0; i < h->count; i++)
    model_free(h->pending[i].at_freeze);
  h->count = 0;
  model_copy(live, h->durable);
}

Test(cow_map_rollback, random_writes_checkpoints_aborts_and_rollbacks,
     .timeout = 300) {
  history h = {.map = rollback_map(), .durable = model_new(IDS)};
  mutator mu = {.map = h.map, .live = model_new(IDS), .rng = 0x5eed,
                .id_range = IDS, .delete_percent = 15};
  uint64_t steps = sl_test_scaled(200000, 20000);
  uint64_t rollbacks = 0;
  for (uint64_t step = 0; step < steps; step++) {
    mutate_once(&mu);
    uint32_t dice = rng_below(&mu.rng, 1000);
    if (dice < 8) {
      history_freeze(&h, mu.live);
    } else if (dice < 12 && h.count > 0) {
      history_complete(&h, (int)rng_below(&mu.rng, (uint32_t)h.count));
    } else if (dice < 14) {
      history_rollback(&h, mu.live);
      rollbacks++;
    } else if (dice < 40) {
      sl_cow_map_maintain(h.map, rng_below(&mu.rng, 64));
    }
    if (step % 997 == 0) {
      cr_assert(sl_cow_map_check(h.map));
      cr_assert_eq(model_diff_map(mu.live, h.map), 0);
    }
  }
  cr_assert_eq(mu.errors, 0);
  history_rollback(&h, mu.live);
  cr_assert_gt(rollbacks, 5);
  cr_assert_eq(sl_cow_map_rollbacks(h.map), rollbacks + 1);
  model_free(mu.live);
  model_free(h.durable);
  sl_cow_map_destroy(h.map);
}
