/* test_cow_map.c — Criterion tests of the copy-on-write state map
 * (storage/cow_map.h).
 *
 * Keys are numbered: key_make(id) is the id (8 bytes) plus 0..8 filler
 * bytes derived from the id, so any key read back from a delta names its id
 * and can be checked byte for byte.  The reference model is an array of
 * slots indexed by id (present, size, bytes): copying it is a snapshot and
 * comparing two is exact.
 *
 * The property test (concurrent_checkpoints_match_reference) is the one the
 * design exists for: a real second thread applies the frozen deltas to its
 * copy of the last durable state while the main thread keeps mutating the
 * map (keys of the frozen delta included, rehashes under way, reclaim of
 * earlier epochs running); the result must equal the snapshot taken at the
 * freeze.  Some checkpoints are aborted, so the next one writes several
 * pending deltas.  Assertions run in the main thread only: the writer
 * counts what it found wrong and the main thread checks the count.
 *
 * Bulk loads are tested in test_cow_map_load.c; the keys, the model, the
 * mutator and the writer thread both use are in test_cow_map.h.
 *
 * SLUICE_TEST_SCALE=n divides the operation counts by n (sanitizer builds).
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cow_map.h"
#include "sluice.h"
#include "test_cow_map.h"
#include "test_util.h"

/* ------------------------------------------------------------ 1. basics */

static int count_visits(void *arg, const sl_cow_entry *e) {
  uint64_t *sum = arg, id;
  cr_assert(key_parse(sl_cow_entry_key(e), e->key_bytes, &id));
  cr_assert(!e->tombstone && !e->retired);
  *sum += id + 1;
  return 0;
}

static int stop_at_first(void *arg, const sl_cow_entry *e) {
  (void)e;
  ++*(int *)arg;
  return 7;
}

Test(cow_map, basic_put_get_delete) {
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(sl_cow_map_count(map), 0);
  uint32_t bytes = 99;
  cr_assert_null(get_id(map, 1, &bytes));
  cr_assert_eq(bytes, 0);
  cr_assert_eq(delete_id(map, 1), SL_ENOTFOUND);

  for (uint64_t id = 0; id < 100; id++)
    put_value(map, id, (uint32_t)(id % 40), id);
  cr_assert_eq(sl_cow_map_count(map), 100);
  cr_assert(sl_cow_map_check(map));
  const uint8_t *v = get_id(map, 37, &bytes);
  uint8_t expected[VALUE_MAX_BYTES];
  value_fill(expected, 37, 37);
  cr_assert(v);
  cr_assert_eq(bytes, 37);
  cr_assert_eq(memcmp(v, expected, 37), 0);

  /* Same size in the current epoch: in place (same storage). */
  put_value(map, 37, 37, 1000);
  cr_assert_eq(get_id(map, 37, &bytes), v);
  /* Other size: a new version; the value is the new one. */
  put_value(map, 37, 80, 1001);
  v = get_id(map, 37, &bytes);
  value_fill(expected, 80, 1001);
  cr_assert_eq(bytes, 80);
  cr_assert_eq(memcmp(v, expected, 80), 0);
  /* value NULL keeps the old bytes as far as they fit, zeros after. */
  uint8_t key[KEY_MAX_BYTES];
  uint32_t key_bytes = key_make(37, key);
  uint8_t *p = sl_cow_map_put(map, key, key_bytes, 0, 90);
  cr_assert(p);
  cr_assert_eq(memcmp(p, expected, 80), 0);
  for (int i = 80; i < 90; i++)
    cr_assert_eq(p[i], 0);
  p = sl_cow_map_put(map, key, key_bytes, 0, 10);
  cr_assert_eq(memcmp(p, expected, 10), 0);
  key_bytes = key_make(5000, key);
  p = sl_cow_map_put(map, key, key_bytes, 0, 16);
  for (int i = 0; i < 16; i++)
    cr_assert_eq(p[i], 0);
  cr_assert_eq(sl_cow_map_count(map), 101);

  /* Empty key and empty value are keys and values like any other. */
  cr_assert(sl_cow_map_put(map, "", 0, "", 0));
  cr_assert(sl_cow_map_get(map, "", 0, &bytes));
  cr_assert_eq(bytes, 0);
  cr_assert_eq(sl_cow_map_delete(map, "", 0), 0);
  cr_assert_null(sl_cow_map_get(map, "", 0, &bytes));

  for (uint64_t id = 0; id < 100; id += 2)
    cr_assert_eq(delete_id(map, id), 0);
  cr_assert_eq(delete_id(map, 0), SL_ENOTFOUND);
  cr_assert_null(get_id(map, 0, &bytes));
  cr_assert(get_id(map, 1, &bytes));
  cr_assert_eq(sl_cow_map_count(map), 51);
  /* Delete then insert again within the epoch. */
  put_value(map, 0, 3, 3);
  cr_assert(get_id(map, 0, &bytes));
  cr_assert_eq(sl_cow_map_count(map), 52);
  cr_assert(sl_cow_map_check(map));

  uint64_t sum = 0, expected_sum = 5001 + 1; /* ids 5000 and 0 */
  for (uint64_t id = 1; id < 100; id += 2)
    expected_sum += id + 1;
  cr_assert_eq(sl_cow_map_foreach(map, count_visits, &sum), 0);
  cr_assert_eq(sum, expected_sum);
  int visits = 0;
  cr_assert_eq(sl_cow_map_foreach(map, stop_at_first, &visits), 7);
  cr_assert_eq(visits, 1);
  sl_cow_map_destroy(map);
  sl_cow_map_destroy(0);
}

/* ------------------------------------------- 2. freeze, pending, apply */

Test(cow_map, freeze_pending_and_apply) {
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  sl_cow_map_set_freeze_copy(map, 0, 0); /* copies on write: note 16 off */
  model *durable = model_new(16), *at_freeze = model_new(16);
  /* Epoch 1: inserts, a resize (superseded), a delete in place, and the
   * deleted key inserted again. */
  put_value(map, 1, 8, 1);
  put_value(map, 2, 8, 2);
  put_value(map, 3, 8, 3);
  put_value(map, 1, 16, 4);
  cr_assert_eq(delete_id(map, 2), 0);
  put_value(map, 2, 4, 5);
  sl_cow_delta d1 = sl_cow_map_freeze(map);
  cr_assert_eq(d1.epoch, 1);
  cr_assert_eq(d1.entries, 5);
  seen_entry seen[8];
  cr_assert_eq(delta_entries(&d1, seen, 8), 5);
  const seen_entry want1[5] = {{1, 0, 1, 8}, {2, 1, 0, 0}, {3, 0, 0, 8},
                               {1, 0, 0, 16}, {2, 0, 0, 4}};
  for (int i = 0; i < 5; i++) {
    cr_assert_eq(seen[i].id, want1[i].id, "entry %d", i);
    cr_assert_eq(seen[i].tombstone, want1[i].tombstone, "entry %d", i);
    cr_assert_eq(seen[i].superseded, want1[i].superseded, "entry %d", i);
    cr_assert_eq(seen[i].bytes, want1[i].bytes, "entry %d", i);
  }
  cr_assert(sl_cow_map_check(map));
  uint64_t digest1 = delta_digest(&d1);

  /* Epoch 2: writes to frozen entries copy them; d1 must not change. */
  uint32_t bytes;
  const uint8_t *frozen_value = get_id(map, 1, &bytes);
  put_value(map, 1, 16, 6); /* same size, but frozen: a copy */
  cr_assert_neq(get_id(map, 1, &bytes), frozen_value);
  cr_assert_eq(delete_id(map, 3), 0); /* a tombstone version */
  put_value(map, 4, 8, 7);
  sl_cow_delta d2 = sl_cow_map_freeze(map);
  cr_assert_eq(d2.epoch, 2);
  cr_assert_eq(delta_entries(&d2, seen, 8), 3);
  cr_assert(seen[0].id == 1 && !seen[0].tombstone);
  cr_assert(seen[1].id == 3 && seen[1].tombstone && seen[1].bytes == 0);
  cr_assert(seen[2].id == 4 && !seen[2].tombstone);
  cr_assert_eq(delta_digest(&d1), digest1);

  /* An empty epoch yields an empty delta, pending like the others. */
  sl_cow_delta d3 = sl_cow_map_freeze(map);
  cr_assert_eq(d3.epoch, 3);
  cr_assert_null(d3.head);
  cr_assert_eq(d3.entries, 0);
  const sl_cow_delta *pending;
  int count;
  sl_cow_map_pending(map, &pending, &count);
  cr_assert_eq(count, 3);
  cr_assert(pending[0].epoch == 1 && pending[1].epoch == 2);
  cr_assert(pending[0].head == d1.head && pending[1].head == d2.head);
  cr_assert(pending[2].epoch == 3 && !pending[2].head);

  /* Applying both in order gives the state now. */
  for (int i = 0; i < count; i++)
    cr_assert_eq(apply_delta(durable, &pending[i]), 0);
  cr_assert_eq(model_diff_map(durable, map), 0);

  sl_cow_map_release(map, 1);
  sl_cow_map_pending(map, &pending, &count);
  cr_assert_eq(count, 2);
  cr_assert_eq(pending[0].epoch, 2);
  cr_assert(sl_cow_map_check(map));
  /* Many aborted checkpoints in a row: the pending array grows. */
  for (uint32_t i = 0; i < 20; i++)
    cr_assert_eq(sl_cow_map_freeze(map).epoch, 4 + i);
  sl_cow_map_pending(map, &pending, &count);
  cr_assert_eq(count, 22);
  cr_assert_eq(pending[21].epoch, 23);
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_release(map, 23);
  sl_cow_map_pending(map, &pending, &count);
  cr_assert_eq(count, 0);
  maintain_all(map);
  cr_assert(sl_cow_map_check(map));
  model_free(durable);
  model_free(at_freeze);
  sl_cow_map_destroy(map);
}

/* The index of a dirty list (cow_map.h note 11), over several blocks:
 * every version of the list in list order (superseded versions and
 * tombstones included), kept with a pending delta and freed, with the
 * memory it was counted as, when the delta is released. */
Test(cow_map, index_names_the_list_across_blocks) {
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  const uint64_t ids = 3 * SL_COW_INDEX_BLOCK + 5;
  model *durable = model_new(ids);
  for (uint64_t id = 0; id < ids; id++)
    put_value(map, id, 8, id);
  for (uint64_t id = 0; id < ids; id += 7)
    cr_assert_eq(delete_id(map, id), 0); /* tombstones in place */
  for (uint64_t id = 0; id < ids; id += 14)
    put_value(map, id, 8, id + 1); /* after a delete: a second version */
  cr_assert(sl_cow_map_check(map)); /* walks the index against the list */
  uint64_t before = sl_cow_map_memory_bytes(map);
  sl_cow_delta d1 = sl_cow_map_freeze(map);
  cr_assert_eq(d1.entries, ids + (ids + 13) / 14);
  cr_assert_not_null(d1.index);
  uint64_t blocks = 0, versions = 0;
  for (const sl_cow_index_block *b = d1.index; b; b = b->next, blocks++)
    versions += b->count;
  cr_assert_eq(versions, d1.entries);
  cr_assert_eq(blocks, (d1.entries + SL_COW_INDEX_BLOCK - 1) /
                           SL_COW_INDEX_BLOCK);
  cr_assert_eq(apply_delta(durable, &d1), 0); /* list and index agree */

  /* Epoch 2 copies every frozen version it writes: its own index. */
  for (uint64_t id = 1; id < ids; id += 2)
    put_value(map, id, 8, id + 2);
  sl_cow_delta d2 = sl_cow_map_freeze(map);
  cr_assert_not_null(d2.index);
  cr_assert_neq(d2.index, d1.index);
  const sl_cow_delta *pending;
  int count;
  sl_cow_map_pending(map, &pending, &count);
  cr_assert_eq(count, 2);
  cr_assert(pending[0].index == d1.index && pending[1].index == d2.index);
  cr_assert(sl_cow_map_check(map));

  /* Releasing epoch 1 hands its index to the reclaim walk (cow_map.c
   * note 13), which frees it as it passes: once the walk is done, the
   * blocks are gone (checked against the accounting). */
  uint64_t with_both = sl_cow_map_memory_bytes(map);
  cr_assert_gt(with_both, before);
  sl_cow_map_release(map, 1);
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(sl_cow_map_memory_bytes(map), with_both, "kept for the walk");
  maintain_all(map);
  cr_assert(sl_cow_map_check(map));
  cr_assert_leq(sl_cow_map_memory_bytes(map),
                with_both - blocks * sizeof(sl_cow_index_block));
  cr_assert_eq(apply_delta(durable, &d2), 0);
  cr_assert_eq(model_diff_map(durable, map), 0);
  /* An empty epoch has no index. */
  sl_cow_delta d3 = sl_cow_map_freeze(map);
  cr_assert(!d3.head && !d3.index);
  sl_cow_map_release(map, 3);
  maintain_all(map);
  cr_assert(sl_cow_map_check(map));
  model_free(durable);
  sl_cow_map_destroy(map);
}

/* The reclaim walk's index (cow_map.c note 13) stays in step with the
 * chain while lists join it part way through the walk, in several
 * blocks, with epochs released one by one and together; the checker
 * compares index and chain at every stop, and the accounting, which
 * counts the blocks, ends where a map without the walk's index ends. */
Test(cow_map, reclaim_index_follows_the_chain) {
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  const uint64_t ids = 3 * SL_COW_INDEX_BLOCK + 100;
  for (uint64_t id = 0; id < ids; id++)
    put_value(map, id, 8, id);
  sl_cow_delta d = sl_cow_map_freeze(map); /* epoch 1: 4 blocks */
  cr_assert_not_null(d.index);
  for (uint64_t id = 0; id < ids; id += 3)
    put_value(map, id, 8, id + 1); /* copies of frozen versions */
  (void)sl_cow_map_freeze(map);       /* epoch 2 */
  for (uint64_t id = 1; id < ids; id += 3)
    put_value(map, id, 8, id + 2);
  (void)sl_cow_map_freeze(map);       /* epoch 3 */
  sl_cow_map_release(map, 1);
  cr_assert(sl_cow_map_check(map));
  /* Part way into epoch 1's second block, then epoch 2 joins. */
  for (uint64_t step = 0; step < SL_COW_INDEX_BLOCK + 7; step += 977) {
    (void)sl_cow_map_maintain(map, 977);
    cr_assert(sl_cow_map_check(map));
  }
  sl_cow_map_release(map, 2);
  cr_assert(sl_cow_map_check(map));
  /* Writes reclaim too (four steps each), into epoch 4's list. */
  for (uint64_t id = 2; id < ids; id += 9) { /* 5.5K steps: not all */
    put_value(map, id, 8, id + 3);
    if (id % 1001 == 2)
      cr_assert(sl_cow_map_check(map));
  }
  (void)sl_cow_map_freeze(map); /* epoch 4 */
  /* Epochs 3 and 4 together, while the walk is still in epoch 2. */
  cr_assert(sl_cow_map_maintain(map, 1), "work is left");
  sl_cow_map_release(map, 4);
  cr_assert(sl_cow_map_check(map));
  while (sl_cow_map_maintain(map, 333))
    cr_assert(sl_cow_map_check(map));
  cr_assert(sl_cow_map_check(map));
  /* Drained: every version is CLEAN and live, one per key, and nothing
   * else is held but the table (the check's accounting is exact). */
  uint64_t drained = sl_cow_map_memory_bytes(map);
  for (uint64_t id = 0; id < ids; id++) {
    uint32_t bytes = 0;
    const uint8_t *v = get_id(map, id, &bytes);
    uint8_t want[8];
    uint64_t seed = id % 3 == 0 ? id + 1 : id % 3 == 1 ? id + 2
                    : (id - 2) % 9 == 0 ? id + 3 : id;
    value_fill(want, 8, seed);
    cr_assert(v && bytes == 8 && memcmp(v, want, 8) == 0, "id %" PRIu64, id);
  }
  sl_cow_map_release(map, 4);
  cr_assert(!sl_cow_map_maintain(map, 1));
  cr_assert_eq(sl_cow_map_memory_bytes(map), drained);
  sl_cow_map_destroy(map);
}

/* Random single-threaded rounds: every delta stays byte-identical while the
 * map changes after its freeze; applying the pending deltas to the previous
 * durable state gives the state at the freeze; some checkpoints abort. */
Test(cow_map, deltas_are_immutable_and_exact) {
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  model *durable = model_new(2000), *at_freeze = model_new(2000);
  model *live = model_new(2000), *work = model_new(2000);
  const sl_cow_delta *pending;
  int count;
  mutator mu = {.map = map, .live = live, .rng = 42, .id_range = 2000,
                .delete_percent = 25};
  uint64_t ops = sl_test_scaled(3000, 500);
  int aborted = 0;
  for (int round = 0; round < 30; round++) {
    for (uint64_t i = 0; i < ops; i++)
      mutate_once(&mu);
    sl_cow_delta d = sl_cow_map_freeze(map);
    model_copy(at_freeze, live);
    sl_cow_map_pending(map, &pending, &count);
    cr_assert(count >= 1 && pending[count - 1].epoch == d.epoch);
    uint64_t digests[32];
    cr_assert(count <= 32);
    for (int i = 0; i < count; i++)
      digests[i] = delta_digest(&pending[i]);
    for (uint64_t i = 0; i < ops; i++)
      mutate_once(&mu);
    model_copy(work, durable);
    for (int i = 0; i < count; i++) {
      cr_assert_eq(delta_digest(&pending[i]), digests[i], "round %d", round);
      cr_assert_eq(apply_delta(work, &pending[i]), 0);
    }
    cr_assert(model_equal(work, at_freeze), "round %d", round);
    if (round % 4 == 1) {
      aborted++;
    } else {
      model_copy(durable, work);
      sl_cow_map_release(map, d.epoch);
      if (round % 3 == 0)
        maintain_all(map);
    }
    cr_assert(sl_cow_map_check(map));
  }
  cr_assert_eq(mu.errors, 0);
  cr_assert_eq(model_diff_map(live, map), 0);
  cr_assert(aborted > 0);
  model_free(durable);
  model_free(at_freeze);
  model_free(live);
  model_free(work);
  sl_cow_map_destroy(map);
}

/* ----------------------------------- 3. the concurrent property test */

/* How the model test freezes: plainly, with cow_map.c note 16's copying
 * freeze, or with note 17's copy pass, run in steps between writes before
 * the writer is given the deltas. */
enum freezing { FREEZE_PLAIN, FREEZE_COPYING, FREEZE_PASS };

static void concurrent_checkpoints(enum freezing freezing) {
  const int rounds = 48;
  uint64_t ops = sl_test_scaled(12000, 1500);
  uint64_t ids = sl_test_scaled(40000, 4000);
  model *live = model_new(ids), *durable = model_new(ids);
  model *at_freeze = model_new(ids), *work = model_new(ids);
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  if (freezing != FREEZE_COPYING)
    sl_cow_map_set_freeze_copy(map, 0, 0);
  mutator mu = {.map = map, .live = live, .rng = 20240601};
  uint64_t rng = 7;
  int aborted = 0, multi_pending = 0;
  for (int round = 0; round < rounds; round++) {
    /* The key space grows (rehashes keep happening, also while the writer
     * runs); deletes dominate in the second half. */
    mu.id_range = ids * (uint64_t)(round + 1) / rounds;
    mu.delete_percent = round < rounds / 2 ? 15 : 40;
    for (uint64_t i = 0; i < ops; i++)
      mutate_once(&mu);
    cr_assert_eq(mu.errors, 0, "round %d", round);

    sl_cow_delta d = freezing == FREEZE_PASS ? sl_cow_map_freeze_deferred(map)
                                             : sl_cow_map_freeze(map);
    model_copy(at_freeze, live);
    /* Note 17: the pass in steps, the map written (keys of the delta
     * among them) and reclaimed in between, the writer not started. */
    cr_assert_eq(sl_cow_map_copying(map), freezing == FREEZE_PASS && d.head);
    for (uint64_t i = 0; sl_cow_map_copying(map); i++) {
      mutate_once(&mu);
      if (i % 8 == 0)
        sl_cow_map_copy_step(map, 16);
      if (i % 512 == 0)
        sl_cow_map_maintain(map, 64);
    }
    const sl_cow_delta *pending;
    writer_job job = {.state = work};
    sl_cow_map_pending(map, &pending, &job.count);
    cr_assert(job.count >= 1 && job.count <= WRITER_MAX_DELTAS);
    cr_assert_eq(pending[job.count - 1].epoch, d.epoch);
    memcpy(job.deltas, pending, (size_t)job.count * sizeof *pending);
    multi_pending += job.count > 1;
    model_copy(work, durable);

    pthread_t writer;
    cr_assert_eq(pthread_create(&writer, 0, writer_main, &job), 0);
    /* Meanwhile: heavy writes (many to keys of the frozen delta), rehash
     * steps, reclaim of earlier released epochs. */
    for (uint64_t i = 0; i < ops; i++) {
      mutate_once(&mu);
      if (i % 512 == 0)
        sl_cow_map_maintain(map, 64);
    }
    cr_assert_eq(pthread_join(writer, 0), 0);
    cr_assert_eq(job.errors, 0, "round %d", round);
    cr_assert(model_equal(work, at_freeze), "round %d: writer's state differs",
              round);

    bool abort_checkpoint = round == 6 || round == 7 || rng_next(&rng) % 6 == 0;
    if (abort_checkpoint) {
      aborted++; /* not released: the next round writes these deltas too */
    } else {
      model *swap = durable;
      durable = work;
      work = swap;
      sl_cow_map_release(map, d.epoch);
      if (round % 3 == 0)
        maintain_all(map);
      else
        sl_cow_map_maintain(map, 100); /* leave some for the writes */
    }
    cr_assert(sl_cow_map_check(map), "round %d", round);
    cr_assert_eq(model_diff_map(live, map), 0, "round %d", round);
  }
  cr_assert_eq(mu.errors, 0);
  cr_assert(aborted >= 2);
  cr_assert(multi_pending >= 2);
  cr_assert(sl_cow_map_max_step_buckets(map) <= SL_COW_STEP_MAX_BUCKETS);
  /* Each round's delta (at most ops versions) is within the copying
   * freeze's limits (cow_map.c note 16), so with it on every one is
   * copied. */
  cr_assert_eq(sl_cow_map_freeze_copies(map) > 0, freezing != FREEZE_PLAIN);
  cr_assert_eq(sl_cow_map_copy_passes(map) > 0, freezing == FREEZE_PASS);
  sl_cow_map_release(map, UINT32_MAX);
  maintain_all(map);
  cr_assert(sl_cow_map_check(map));
  model_free(live);
  model_free(durable);
  model_free(at_freeze);
  model_free(work);
  sl_cow_map_destroy(map);
}

Test(cow_map, concurrent_checkpoints_match_reference, .timeout = 120) {
  concurrent_checkpoints(FREEZE_PLAIN);
}

/* The same with cow_map.c note 16's copying freezes: the deltas the
 * writer reads are copies, and the writes meanwhile go in place. */
Test(cow_map, concurrent_copying_checkpoints_match_reference,
     .timeout = 120) {
  concurrent_checkpoints(FREEZE_COPYING);
}

/* The same with cow_map.c note 17's copy passes, run in steps while the
 * map is written, before the writer reads the deltas. */
Test(cow_map, concurrent_copy_passes_match_reference, .timeout = 120) {
  concurrent_checkpoints(FREEZE_PASS);
}

/* ------------------------------------------------------ 4. reclamation */

/* Round r leaves every id present with size_of(id, r) bytes, so the live
 * state after round r depends only on r's parity. */
static uint32_t size_of(uint64_t id, int round) {
  return 8 + (uint32_t)((id + (uint64_t)round) & 1) * 40;
}

/* One round: each id reaches its final value along a different path
 * (overwrite; delete then insert; an extra version first; put NULL and
 * write in place). */
static void rewrite_round(sl_cow_map *map, uint64_t ids, int round) {
  for (uint64_t id = 0; id < ids; id++) {
    uint32_t bytes = size_of(id, round);
    uint64_t seed = id * 1000 + (uint64_t)(round & 1);
    switch (id % 4) {
    case 0:
      put_value(map, id, bytes, seed);
      break;
    case 1:
      cr_assert_eq(delete_id(map, id), round == 0 ? SL_ENOTFOUND : 0);
      put_value(map, id, bytes, seed);
      break;
    case 2:
      put_value(map, id, 60, seed + 1);
      put_value(map, id, bytes, seed);
      break;
    default: {
      uint8_t key[KEY_MAX_BYTES];
      uint32_t key_bytes = key_make(id, key);
      uint8_t *p = sl_cow_map_put(map, key, key_bytes, 0, bytes);
      cr_assert(p);
      value_fill(p, bytes, seed);
    }
    }
  }
}

Test(cow_map, reclamation_returns_memory) {
  uint64_t ids = sl_test_scaled(4000, 1000);
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  uint64_t settled[2] = {0, 0}; /* memory after reclaim, by round parity */
  for (int round = 0; round < 100; round++) {
    rewrite_round(map, ids, round);
    sl_cow_delta d = sl_cow_map_freeze(map);
    uint64_t before = sl_cow_map_memory_bytes(map);
    sl_cow_map_release(map, d.epoch);
    if (round % 2 == 0 || round == 99) {
      maintain_all(map);
      uint64_t after = sl_cow_map_memory_bytes(map);
      if (round > 0)
        cr_assert_lt(after, before, "round %d: nothing reclaimed", round);
      /* Same live state, same memory: no growth across rounds. */
      if (round >= 2 && settled[round & 1])
        cr_assert_eq(after, settled[round & 1], "round %d", round);
      settled[round & 1] = after;
    }
    /* Odd rounds leave reclaiming to the writes: memory stays bounded. */
    cr_assert_leq(before, 4 * settled[0] + 4096, "round %d", round);
    cr_assert(sl_cow_map_check(map), "round %d", round);
  }
  cr_assert(settled[1] != 0);
  /* Settled memory is the live entries plus the table, no more. */
  uint64_t entries_min = 0, entries_max = 0;
  for (uint64_t id = 0; id < ids; id++) {
    uint8_t key[KEY_MAX_BYTES];
    uint64_t key_bytes = key_make(id, key), value_bytes = size_of(id, 99);
    entries_min += sizeof(sl_cow_entry) + key_bytes + value_bytes;
    entries_max += sizeof(sl_cow_entry) + ((key_bytes + 7) & ~7ull) +
                   (value_bytes < 8 ? 8 : (value_bytes + 7) & ~7ull);
  }
  uint64_t buckets_max = 4; /* the table has at most 2 * ids buckets */
  while (buckets_max < 2 * ids)
    buckets_max *= 2;
  /* Less the one spare chunk copying freezes keep (cow_map.c note 16). */
  uint64_t memory =
      sl_cow_map_memory_bytes(map) - sl_cow_map_arena_spare_bytes(map);
  cr_assert_geq(memory, entries_min);
  cr_assert_leq(memory, entries_max + buckets_max * sizeof(void *) + 4096);
  sl_cow_map_destroy(map);
}

/* -------------------------------------------------- 5. rehash is bounded */

Test(cow_map, incremental_rehash_is_bounded, .timeout = 120) {
  uint64_t n = sl_test_scaled(1000000, 100000);
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  uint64_t rng = 99;
  for (uint64_t id = 0; id < n; id++) {
    uint8_t key[KEY_MAX_BYTES];
    uint32_t key_bytes = key_make(id, key);
    uint8_t *p = sl_cow_map_put(map, key, key_bytes, &id, 8);
    cr_assert(p);
    /* Earlier keys stay visible while buckets move between tables. */
    if (id % 64 == 0) {
      uint64_t old = rng_next(&rng) % (id + 1), seen;
      uint32_t bytes;
      const void *v = get_id(map, old, &bytes);
      cr_assert(v && bytes == 8);
      memcpy(&seen, v, 8);
      cr_assert_eq(seen, old);
    }
  }
  uint64_t step_max = sl_cow_map_max_step_buckets(map);
  cr_assert_gt(step_max, 0, "the table never grew");
  cr_assert_leq(step_max, SL_COW_STEP_MAX_BUCKETS);
  cr_assert_eq(sl_cow_map_count(map), n);
  cr_assert(sl_cow_map_check(map));
  for (uint64_t id = 0; id < n; id += 2)
    cr_assert_eq(delete_id(map, id), 0);
  cr_assert_eq(sl_cow_map_count(map), n / 2);
  for (uint64_t id = 0; id < n; id += 997) {
    uint32_t bytes;
    cr_assert_eq(get_id(map, id, &bytes) != 0, id % 2 == 1);
  }
  cr_assert(sl_cow_map_check(map));
  cr_assert_leq(sl_cow_map_max_step_buckets(map), SL_COW_STEP_MAX_BUCKETS);
  sl_cow_map_destroy(map);
}

/* ------------------------------------------------- 6. load, then update */

Test(cow_map, loaded_entries_become_dirty_in_place) {
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  sl_cow_map_set_freeze_copy(map, 0, 0); /* copies on write: note 16 off */
  const uint64_t ids = 1000;
  model *state = model_new(ids);
  for (uint64_t id = 0; id < ids; id++) {
    uint8_t key[KEY_MAX_BYTES], value[VALUE_MAX_BYTES];
    uint32_t key_bytes = key_make(id, key), bytes = 16;
    value_fill(value, bytes, id);
    cr_assert_eq(sl_cow_map_load(map, key, key_bytes, value, bytes), 0);
    model_put(state, id, value, bytes);
  }
  uint8_t key[KEY_MAX_BYTES];
  uint32_t key_bytes = key_make(5, key), bytes;
  cr_assert_eq(sl_cow_map_load(map, key, key_bytes, "x", 1), EINVAL);
  cr_assert_eq(sl_cow_map_count(map), ids);
  cr_assert(sl_cow_map_check(map));
  const sl_cow_delta *pending;
  int count;
  sl_cow_delta empty = sl_cow_map_freeze(map);
  cr_assert_null(empty.head); /* loaded entries are clean */
  sl_cow_map_release(map, empty.epoch);

  /* Same size: updated in place and now dirty.  Other size: a new version
   * (the clean one is freed).  Delete: a tombstone. */
  const uint8_t *clean = get_id(map, 5, &bytes);
  put_value(map, 5, 16, 5005);
  cr_assert_eq(get_id(map, 5, &bytes), clean, "not updated in place");
  put_value(map, 6, 40, 6006);
  cr_assert_eq(delete_id(map, 7), 0);
  /* Many more updates so the released delta below is long. */
  for (uint64_t id = 100; id < 200; id++)
    put_value(map, id, 16, id + 1);
  put_value(map, 8, 16, 8008);
  sl_cow_delta d = sl_cow_map_freeze(map);
  cr_assert_eq(d.entries, 104);
  seen_entry seen[3];
  cr_assert_eq(delta_entries(&d, seen, 3), 3);
  cr_assert(seen[0].id == 5 && !seen[0].tombstone && seen[0].bytes == 16);
  cr_assert(seen[1].id == 6 && !seen[1].tombstone && seen[1].bytes == 40);
  cr_assert(seen[2].id == 7 && seen[2].tombstone);
  cr_assert_eq(apply_delta(state, &d), 0);
  cr_assert_eq(model_diff_map(state, map), 0);

  /* Frozen: a same-size write copies. */
  const uint8_t *frozen = get_id(map, 5, &bytes);
  put_value(map, 5, 16, 1);
  cr_assert_neq(get_id(map, 5, &bytes), frozen);
  /* Released but not yet reclaimed (the walk has not reached key 8, the
   * last of 104): still copied (cow_map.c note 2). */
  sl_cow_map_release(map, d.epoch);
  const uint8_t *released = get_id(map, 8, &bytes);
  put_value(map, 8, 16, 2);
  cr_assert_neq(get_id(map, 8, &bytes), released);
  cr_assert(sl_cow_map_check(map));
  /* Reclaimed: clean again, so in place again (key 9 was never written
   * after the load, key 150 was written in the released epoch). */
  sl_cow_map_freeze(map);
  sl_cow_map_pending(map, &pending, &count);
  sl_cow_map_release(map, pending[count - 1].epoch);
  maintain_all(map);
  const uint8_t *before = get_id(map, 150, &bytes);
  put_value(map, 150, 16, 3);
  cr_assert_eq(get_id(map, 150, &bytes), before);
  before = get_id(map, 9, &bytes);
  put_value(map, 9, 16, 4);
  cr_assert_eq(get_id(map, 9, &bytes), before);
  cr_assert(sl_cow_map_check(map));
  model_free(state);
  sl_cow_map_destroy(map);
}

/* A reserved table takes every loaded key without a rehash step. */
Test(cow_map, reserve_sizes_the_table_once) {
  sl_cow_map *m;
  cr_assert_eq(sl_cow_map_create(&m), 0);
  const uint64_t keys = 50000;
  cr_assert_eq(sl_cow_map_reserve(m, keys), 0);
  uint64_t memory_after_reserve = sl_cow_map_memory_bytes(m);
  cr_expect_geq(memory_after_reserve, keys * sizeof(void *));
  for (uint64_t k = 0; k < keys; k++)
    cr_assert_eq(sl_cow_map_load(m, &k, sizeof k, &k, sizeof k), 0);
  cr_expect_eq(sl_cow_map_max_step_buckets(m), 0, "a rehash ran");
  cr_expect_eq(sl_cow_map_count(m), keys);
  cr_expect(sl_cow_map_check(m));
  /* A map with keys is left as it is. */
  cr_assert_eq(sl_cow_map_reserve(m, 10 * keys), 0);
  cr_expect(sl_cow_map_check(m));
  for (uint64_t k = 0; k < keys; k += 997) {
    uint32_t bytes = 0;
    const void *v = sl_cow_map_get(m, &k, sizeof k, &bytes);
    cr_assert(v);
    cr_expect_eq(bytes, sizeof k);
    cr_expect_eq(memcmp(v, &k, sizeof k), 0);
  }
  sl_cow_map_destroy(m);
}

/* cow_map.c note 6: a table of fewer than 2^16 buckets grows at a load
 * factor of 1/2, a larger one at 1; so do the tables reserve() sizes.
 * Checked by the bucket count after given numbers of puts, and every key
 * still found. */
Test(cow_map, small_tables_grow_at_half_load) {
  sl_cow_map *m;
  cr_assert_eq(sl_cow_map_create(&m), 0);
  const struct {
    uint64_t puts, buckets;
  } after[] = {
      {100, 256},      /* 128 buckets grew at 64 keys */
      {20000, 65536},  /* 32768 grew at 16384 */
      {65536, 65536},  /* 2^16 buckets: a load of 1 before it grows */
      {70000, 131072}, /* grew at 65536 */
  };
  uint64_t k = 0;
  for (size_t i = 0; i < sizeof after / sizeof after[0]; i++) {
    for (; k < after[i].puts; k++)
      cr_assert_not_null(sl_cow_map_put(m, &k, sizeof k, &k, sizeof k));
    cr_expect_eq(sl_cow_map_buckets(m), after[i].buckets,
                 "after %" PRIu64 " puts: %" PRIu64 " buckets", k,
                 sl_cow_map_buckets(m));
  }
  cr_expect(sl_cow_map_check(m));
  for (uint64_t id = 0; id < k; id += 7) {
    uint32_t bytes = 0;
    const void *v = sl_cow_map_get(m, &id, sizeof id, &bytes);
    cr_assert(v && bytes == sizeof id && memcmp(v, &id, sizeof id) == 0);
  }
  sl_cow_map_destroy(m);
  /* reserve(): room for 5000 keys is 16384 buckets, for 100000 keys
   * 131072 (a load of 1 from 2^16 on). */
  const uint64_t reserve[][2] = {{5000, 16384}, {100000, 131072}};
  for (size_t i = 0; i < 2; i++) {
    cr_assert_eq(sl_cow_map_create(&m), 0);
    cr_assert_eq(sl_cow_map_reserve(m, reserve[i][0]), 0);
    cr_expect_eq(sl_cow_map_buckets(m), reserve[i][1]);
    cr_expect(sl_cow_map_check(m));
    sl_cow_map_destroy(m);
  }
}

/* ---------------------------------------------- 6b. update in place */

/* sl_cow_map_update() of id with its hash, init (may be NULL) and size;
 * returns the status, the storage in *p. */
static int update_id(sl_cow_map *map, uint64_t id, const void *init,
                     uint32_t bytes, uint8_t **p) {
  uint8_t key[KEY_MAX_BYTES];
  uint32_t key_bytes = key_make(id, key);
  void *value = 0;
  sl_cow_key k = sl_cow_key_of(key, key_bytes);
  int rc = sl_cow_map_update(map, &k, init, bytes, &value);
  *p = value;
  return rc;
}

/* Every state a version can be in (cow_map.c note 1) through the update
 * path: absent (init, or zeros), CURRENT (in place), FROZEN and RELEASED
 * (copied: the delta keeps its bytes), CLEAN (in place, dirty again), and
 * a refused size. */
Test(cow_map, update_in_place_copies_frozen_versions) {
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  sl_cow_map_set_freeze_copy(map, 0, 0); /* copies on write: note 16 off */
  model *durable = model_new(32), *live = model_new(32);
  uint8_t init[16], value[16], *p, *q;
  uint32_t bytes;
  value_fill(init, 16, 1);

  /* Absent: a copy of init; NULL init: zeros. */
  cr_assert_eq(update_id(map, 1, init, 16, &p), 0);
  cr_assert_eq(memcmp(p, init, 16), 0);
  value_fill(p, 16, 2);
  model_put(live, 1, p, 16);
  /* Ten more keys, so that key 2 comes late in the first delta and is not
   * reached by the few reclaim steps of the first write after its release
   * (below). */
  for (uint64_t id = 10; id < 20; id++) {
    cr_assert_eq(update_id(map, id, init, 16, &p), 0);
    model_put(live, id, p, 16);
  }
  cr_assert_eq(update_id(map, 2, 0, 16, &p), 0);
  for (int i = 0; i < 16; i++)
    cr_assert_eq(p[i], 0);
  value_fill(p, 16, 3);
  model_put(live, 2, p, 16);
  /* CURRENT: the same storage, holding what was written through it. */
  cr_assert_eq(update_id(map, 1, init, 16, &p), 0);
  cr_assert_eq(p, get_id(map, 1, &bytes));
  cr_assert_eq(memcmp(p, live->slots[1].value, 16), 0);
  /* Another size: refused, nothing changed, *value untouched. */
  q = (uint8_t *)&bytes;
  cr_assert_eq(update_id(map, 1, init, 8, &q), EINVAL);
  cr_assert_null(q);
  cr_assert_eq(model_diff_map(live, map), 0);
  cr_assert(sl_cow_map_check(map));

  /* FROZEN: a new version, starting as a copy; the delta keeps the old
   * bytes and the updated key appears in the next delta. */
  sl_cow_delta d1 = sl_cow_map_freeze(map);
  cr_assert_eq(d1.entries, 12);
  uint64_t digest1 = delta_digest(&d1);
  const uint8_t *frozen = get_id(map, 1, &bytes);
  cr_assert_eq(update_id(map, 1, init, 16, &p), 0);
  cr_assert_neq(p, frozen);
  cr_assert_eq(memcmp(p, live->slots[1].value, 16), 0);
  value_fill(p, 16, 4);
  model_put(live, 1, p, 16);
  cr_assert_eq(update_id(map, 1, init, 16, &q), 0);
  cr_assert_eq(q, p, "CURRENT again: in place");
  cr_assert_eq(delta_digest(&d1), digest1);
  sl_cow_delta d2 = sl_cow_map_freeze(map);
  cr_assert_eq(d2.entries, 1);
  cr_assert_eq(apply_delta(durable, &d1), 0);
  cr_assert_eq(apply_delta(durable, &d2), 0);
  cr_assert(model_equal(durable, live));
  cr_assert(sl_cow_map_check(map));

  /* RELEASED, not yet reclaimed: still copied (cow_map.c note 2). */
  sl_cow_map_release(map, d2.epoch);
  frozen = get_id(map, 2, &bytes);
  cr_assert_eq(update_id(map, 2, init, 16, &p), 0);
  cr_assert_neq(p, frozen);
  cr_assert_eq(memcmp(p, live->slots[2].value, 16), 0);
  value_fill(p, 16, 5);
  model_put(live, 2, p, 16);
  /* Reclaimed: CLEAN, updated in place and on the next delta. */
  sl_cow_delta d3 = sl_cow_map_freeze(map);
  cr_assert_eq(apply_delta(durable, &d3), 0);
  sl_cow_map_release(map, d3.epoch);
  maintain_all(map);
  const uint8_t *clean = get_id(map, 1, &bytes);
  cr_assert_eq(update_id(map, 1, init, 16, &p), 0);
  cr_assert_eq(p, clean, "CLEAN: in place");
  value_fill(p, 16, 6);
  model_put(live, 1, p, 16);
  sl_cow_delta d4 = sl_cow_map_freeze(map);
  seen_entry seen[2];
  cr_assert_eq(delta_entries(&d4, seen, 2), 1);
  cr_assert(seen[0].id == 1 && !seen[0].tombstone && seen[0].bytes == 16);
  cr_assert_eq(apply_delta(durable, &d4), 0);
  cr_assert(model_equal(durable, live));
  cr_assert_eq(model_diff_map(live, map), 0);

  /* A loaded (CLEAN, arena) version, as after a restore. */
  sl_cow_map *loaded;
  cr_assert_eq(sl_cow_map_create(&loaded), 0);
  uint8_t key[KEY_MAX_BYTES];
  uint32_t key_bytes = key_make(7, key);
  value_fill(value, 16, 7);
  cr_assert_eq(sl_cow_map_load(loaded, key, key_bytes, value, 16), 0);
  clean = get_id(loaded, 7, &bytes);
  cr_assert_eq(update_id(loaded, 7, init, 16, &p), 0);
  cr_assert_eq(p, clean);
  cr_assert_eq(memcmp(p, value, 16), 0);
  cr_assert_eq(sl_cow_map_freeze(loaded).entries, 1);
  cr_assert(sl_cow_map_check(loaded));
  sl_cow_map_destroy(loaded);

  cr_assert(sl_cow_map_check(map));
  model_free(durable);
  model_free(live);
  sl_cow_map_destroy(map);
}

/* The short-key hash: the same through either entry point, and spread
 * like a random function over the buckets for keyed-state keys (record key
 * big-endian, state id, kind) of consecutive record keys and for plain
 * consecutive integers. */
Test(cow_map, short_key_hash_spreads_consecutive_keys) {
  enum { KEYS = 10000, BUCKETS = 16384 };
  static uint16_t state_keys[BUCKETS], integers[BUCKETS];
  for (uint64_t k = 0; k < KEYS; k++) {
    uint8_t key[16];
    for (int i = 0; i < 8; i++)
      key[i] = (uint8_t)(k >> (56 - 8 * i));
    key[8] = 0;
    key[9] = 3;
    key[10] = 1;
    uint64_t first, last;
    memcpy(&first, key, 8);
    memcpy(&last, key + 3, 8);
    uint64_t h = sl_cow_hash(key, 11);
    cr_assert_eq(h, sl_cow_hash_words(first, last, 11));
    state_keys[h % BUCKETS]++;
    integers[sl_cow_hash(&k, 8) % BUCKETS]++;
    for (uint32_t length = 8; length <= 16; length++) {
      memcpy(&last, key + length - 8, 8);
      cr_assert_eq(sl_cow_hash(key, length),
                   sl_cow_hash_words(first, last, length));
    }
  }
  /* Random placement: empty buckets 16384 e^(-10000/16384) = 8897 with a
   * standard deviation of 64; the fullest bucket holds 6 or 7. */
  const uint16_t *tables[2] = {state_keys, integers};
  for (int t = 0; t < 2; t++) {
    uint32_t empty = 0, fullest = 0;
    for (int b = 0; b < BUCKETS; b++) {
      empty += tables[t][b] == 0;
      fullest = tables[t][b] > fullest ? tables[t][b] : fullest;
    }
    cr_expect(empty > 8500 && empty < 9300, "table %d: %u empty", t, empty);
    cr_expect(fullest <= 10, "table %d: a bucket of %u", t, fullest);
  }
}

/* An engine-shaped key of 11 bytes: k big-endian, then 0xFF 0x04 and a
 * byte 1..4. */
static void engine_key_bytes(uint64_t k, uint8_t bytes[11]) {
  for (int i = 0; i < 8; i++)
    bytes[i] = (uint8_t)(k >> (56 - 8 * i));
  bytes[8] = 0xFF;
  bytes[9] = 0x04;
  bytes[10] = (uint8_t)(1 + k % 4);
}

/* A key prepared by the caller from its words (as engine/state.c does)
 * reaches the same entry as the same bytes given to get, put and delete. */
Test(cow_map, prepared_keys_match_byte_keys) {
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  for (uint64_t k = 0; k < 3000; k++) {
    uint8_t bytes[11];
    engine_key_bytes(k, bytes);
    sl_cow_key key = {.bytes = bytes, .key_bytes = 11};
    memcpy(&key.first, bytes, 8);
    memcpy(&key.last, bytes + 3, 8);
    key.hash = sl_cow_hash_words(key.first, key.last, 11);
    uint64_t value = k * 7;
    if (k % 2) {
      cr_assert(sl_cow_map_put_key(map, &key, &value, 8));
    } else {
      void *p;
      cr_assert_eq(sl_cow_map_update(map, &key, &value, 8, &p), 0);
    }
    uint32_t got_bytes = 0;
    const void *got = sl_cow_map_get(map, bytes, 11, &got_bytes);
    cr_assert(got);
    cr_assert_eq(got_bytes, 8);
    cr_assert_eq(memcmp(got, &value, 8), 0);
    cr_assert_eq(sl_cow_map_find(map, &key, &got_bytes), got);
  }
  cr_assert_eq(sl_cow_map_count(map), 3000);
  for (uint64_t k = 0; k < 3000; k += 3) {
    uint8_t bytes[11];
    engine_key_bytes(k, bytes);
    cr_assert_eq(sl_cow_map_delete(map, bytes, 11), 0);
    sl_cow_key key = sl_cow_key_of(bytes, 11);
    cr_assert_null(sl_cow_map_find(map, &key, 0));
  }
  cr_assert_eq(sl_cow_map_count(map), 2000);
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_destroy(map);
}

/* More maps alive at once than the allocator pools (storage/alloc.h, note
 * 3): each has an arena of its own where jemalloc is used, and every one is
 * written through (inserts, a freeze, copies on write, a release, a
 * reclaim), then dropped; the arenas past the pool's bound are destroyed
 * rather than kept.  A second round takes the pooled ones again.  (Without
 * jemalloc every map frees entry by entry: the same calls, checked the
 * same way.) */
Test(cow_map, more_maps_than_the_arena_pool) {
  enum { MAPS = 300, KEYS = 64 };
  static sl_cow_map *maps[MAPS];
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < MAPS; i++) {
      cr_assert_eq(sl_cow_map_create(&maps[i]), 0);
      for (uint64_t k = 0; k < KEYS; k++) {
        uint64_t value = k + (uint64_t)i;
        cr_assert(sl_cow_map_put(maps[i], &k, 8, &value, 8));
      }
      sl_cow_delta delta = sl_cow_map_freeze(maps[i]);
      for (uint64_t k = 0; k < KEYS; k += 2) { /* copies on write */
        uint64_t value = k * 3;
        cr_assert(sl_cow_map_put(maps[i], &k, 8, &value, 8));
      }
      sl_cow_map_release(maps[i], delta.epoch);
      while (sl_cow_map_maintain(maps[i], 16)) {
      }
      const char *name = 0;
      uint64_t bytes = 0;
      int rc = sl_cow_map_allocator(maps[i], &name, &bytes);
      cr_assert(rc == 0 || rc == ENOTSUP);
      cr_assert_str_eq(name, sl_cow_map_allocator_name());
      if (rc == 0) /* every version is in the map's own arena */
        cr_expect_geq(bytes, KEYS * 56u);
      cr_assert(sl_cow_map_check(maps[i]));
    }
    for (int i = 0; i < MAPS; i++) {
      uint32_t value_bytes = 0;
      uint64_t k = 3;
      const uint64_t *value = sl_cow_map_get(maps[i], &k, 8, &value_bytes);
      cr_assert_not_null(value);
      cr_expect_eq(*value, 3 + (uint64_t)i);
      sl_cow_map_destroy(maps[i]);
    }
  }
}
