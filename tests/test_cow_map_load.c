/* test_cow_map_load.c — Criterion tests of the copy-on-write map's bulk
 * loads (sl_cow_map_load, storage/cow_map.h): a loaded state checkpoints
 * like any other (the property test of test_cow_map.c, from a bulk load),
 * loaded versions are updated, frozen and reclaimed like the rest, a
 * duplicate key is refused, and a load destroyed midway frees all it
 * held.  Keys, model, mutator and writer thread: test_cow_map.h.
 *
 * SLUICE_TEST_SCALE=n divides the operation counts by n (sanitizer builds).
 */
#include <criterion/criterion.h>

#include <errno.h>
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

/* ------------------------------------------------------------ bulk loads */

/* One entry of a bulk load's input. */
typedef struct load_input {
  uint64_t id;
  uint32_t group;
  uint32_t key_bytes;
  uint8_t key[KEY_MAX_BYTES];
} load_input;

/* The store's order: groups ascending, then keys by their bytes over the
 * shorter length, then the shorter first (LMDB's default comparison). */
static int load_input_order(const void *a, const void *b) {
  const load_input *x = a, *y = b;
  if (x->group != y->group)
    return x->group < y->group ? -1 : 1;
  uint32_t common = x->key_bytes < y->key_bytes ? x->key_bytes : y->key_bytes;
  int order = memcmp(x->key, y->key, common);
  if (order != 0)
    return order;
  return (x->key_bytes > y->key_bytes) - (x->key_bytes < y->key_bytes);
}

/* Inputs for ids [0, n) in key groups id % groups: in the store's order, or
 * shuffled (seeded) when sorted is false.  Free with free(). */
static load_input *load_inputs(uint64_t n, uint32_t groups, bool sorted,
                               uint64_t seed) {
  load_input *in = calloc(n, sizeof *in);
  cr_assert(in);
  for (uint64_t id = 0; id < n; id++) {
    in[id].id = id;
    in[id].group = (uint32_t)(id % groups);
    in[id].key_bytes = key_make(id, in[id].key);
  }
  if (sorted) {
    qsort(in, n, sizeof *in, load_input_order);
    return in;
  }
  for (uint64_t i = n; i > 1; i--) { /* Fisher-Yates */
    uint64_t j = rng_next(&seed) % i;
    load_input swap = in[i - 1];
    in[i - 1] = in[j];
    in[j] = swap;
  }
  return in;
}

/* The value an id is loaded with: 8..40 bytes, so puts of other sizes and
 * values smaller than the 8-byte minimum area both occur. */
static uint32_t load_value(uint64_t id, uint8_t *value) {
  uint32_t bytes = (uint32_t)(id % 5) * 8 + (id % 7 == 0 ? 3 : 8);
  value_fill(value, bytes, id + 1000000007ull);
  return bytes;
}

/* Bulk-load in[0..n) (key group 0 for all unless with_groups), into the
 * model as well, and finish.  Returns the first error. */
static int bulk_load(sl_cow_map *map, model *state, const load_input *in,
                     uint64_t n, bool with_groups) {
  int rc = 0;
  for (uint64_t i = 0; rc == 0 && i < n; i++) {
    uint8_t value[VALUE_MAX_BYTES];
    uint32_t bytes = load_value(in[i].id, value);
    rc = sl_cow_map_load_add(map, with_groups ? in[i].group : 0, in[i].key,
                             in[i].key_bytes, value, bytes);
    if (rc == 0 && state)
      model_put(state, in[i].id, value, bytes);
  }
  int finished = sl_cow_map_load_finish(map);
  return rc ? rc : finished;
}

/* Bulk-adds in[0..n) (sorted, into state too), then in[n - 1]'s key again
 * with another value: equal is out of order, so that copy is probed.  The
 * load is not finished. */
static void add_sorted_then_last_again(sl_cow_map *map, model *state,
                                       const load_input *in, uint64_t n) {
  for (uint64_t i = 0; i < n; i++) {
    uint8_t value[VALUE_MAX_BYTES];
    uint32_t bytes = load_value(in[i].id, value);
    cr_assert_eq(sl_cow_map_load_add(map, in[i].group, in[i].key,
                                     in[i].key_bytes, value, bytes), 0);
    model_put(state, in[i].id, value, bytes);
  }
  const load_input *last = &in[n - 1];
  cr_assert_eq(sl_cow_map_load_add(map, last->group, last->key,
                                   last->key_bytes, "other", 5), 0);
}

/* Loads in[0..n) (sorted, in 3 key groups) into map, with the entry at
 * n - 100 moved to the end in group 0 (in[] is reordered so): no error,
 * only that entry probed, and map destroyed after. */
static void load_order_broken(sl_cow_map *map, load_input *in, uint64_t n) {
  model *loaded = model_new(n);
  uint64_t break_at = n - 100;
  load_input moved = in[break_at];
  moved.group = 0; /* in[] ends with group 2 */
  memmove(&in[break_at], &in[break_at + 1], (n - break_at - 1) * sizeof *in);
  in[n - 1] = moved;
  cr_assert_eq(bulk_load(map, loaded, in, n, true), 0);
  cr_assert_eq(sl_cow_map_load_probes(map), 1, "only the entry out of order");
  cr_assert_eq(model_diff_map(loaded, map), 0);
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_destroy(map);
  model_free(loaded);
}

/* Bulk-adds shuffled[0..n), but shuffled[3] again in place of
 * shuffled[repeat_at], until an add fails (EINVAL, asserted): the index of
 * that add, or n if none failed.  The load is not finished. */
static uint64_t add_with_repeat(sl_cow_map *map, const load_input *shuffled,
                                uint64_t n, uint64_t repeat_at) {
  for (uint64_t i = 0; i < n; i++) {
    const load_input *x = i == repeat_at ? &shuffled[3] : &shuffled[i];
    uint8_t value[VALUE_MAX_BYTES];
    uint32_t bytes = load_value(x->id, value);
    int rc = sl_cow_map_load_add(map, 0, x->key, x->key_bytes, value, bytes);
    if (rc) {
      cr_assert_eq(rc, EINVAL);
      return i;
    }
  }
  return n;
}

/* x's key holds the value x was first loaded with. */
static void assert_first_copy(sl_cow_map *map, const load_input *x) {
  uint8_t value[VALUE_MAX_BYTES];
  uint32_t bytes = 0, first_bytes = load_value(x->id, value);
  const uint8_t *v = get_id(map, x->id, &bytes);
  cr_assert(v && bytes == first_bytes && memcmp(v, value, bytes) == 0,
            "the first copy stays");
}

/* Bytes of one version as cow_map.c allocates it: header, key padded to 8,
 * value area padded to 8 and at least 8. */
static uint64_t version_bytes(uint32_t key_bytes, uint32_t value_bytes) {
  uint64_t area = ((uint64_t)value_bytes + 7) & ~7ull;
  return sizeof(sl_cow_entry) + (((uint64_t)key_bytes + 7) & ~7ull) +
         (area < 8 ? 8 : area);
}

/* The version whose value storage is at value. */
static const sl_cow_entry *version_of(const void *value, uint32_t key_bytes) {
  return (const sl_cow_entry *)((const uint8_t *)value -
                                sl_cow_value_offset(key_bytes) -
                                offsetof(sl_cow_entry, data));
}

static int count_arena(void *arg, const sl_cow_entry *e) {
  *(uint64_t *)arg += e->arena;
  return 0;
}

static uint64_t arena_entries(sl_cow_map *map) {
  uint64_t n = 0;
  sl_cow_map_foreach(map, count_arena, &n);
  return n;
}

#define ARENA_CHUNK_BYTES_DOCUMENTED (UINT64_C(4) << 20) /* cow_map.h */

static int address_order(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)*(const sl_cow_entry *const *)a;
  uintptr_t y = (uintptr_t)*(const sl_cow_entry *const *)b;
  return (x > y) - (x < y);
}

/* The arena chunk a carved version lies in (chunks are aligned to their
 * size, cow_map.h). */
static uintptr_t chunk_base(const sl_cow_entry *e) {
  return (uintptr_t)e & ~(uintptr_t)(ARENA_CHUNK_BYTES_DOCUMENTED - 1);
}

/* A bulk-loaded state then goes through checkpoints as any other: random
 * writes (many to loaded entries: in place, other sizes, deletes), a
 * writer thread applying the frozen deltas while the writes go on, aborted
 * checkpoints, reclaim.  At the end, with every key deleted and every
 * version reclaimed, the memory is what it was before the load. */
Test(cow_map, bulk_loaded_state_checkpoints_match_reference, .timeout = 120) {
  uint64_t ids = sl_test_scaled(100000, 10000);
  model *live = model_new(ids), *durable = model_new(ids);
  model *at_freeze = model_new(ids), *work = model_new(ids);
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  cr_assert_eq(sl_cow_map_reserve(map, ids + ids / 4), 0);
  uint64_t memory_before = sl_cow_map_memory_bytes(map);
  load_input *in = load_inputs(ids, 64, true, 0);
  cr_assert_eq(bulk_load(map, live, in, ids, true), 0);
  free(in);
  cr_assert_eq(sl_cow_map_load_probes(map), 0, "sorted input was probed");
  cr_assert_eq(sl_cow_map_count(map), ids);
  cr_assert_eq(model_diff_map(live, map), 0);
  cr_assert_eq(arena_entries(map), ids);
  cr_assert(sl_cow_map_check(map));
  /* The arena is counted by the chunk (cow_map.c note 7). */
  uint64_t loaded_bytes = 0;
  for (uint64_t id = 0; id < ids; id++)
    loaded_bytes +=
        version_bytes(8 + (uint32_t)(id % 9), live->slots[id].bytes);
  uint64_t arena_bytes = sl_cow_map_memory_bytes(map) - memory_before;
  cr_assert_eq(arena_bytes % ARENA_CHUNK_BYTES_DOCUMENTED, 0);
  cr_assert_geq(arena_bytes, loaded_bytes);
  cr_assert_leq(arena_bytes, loaded_bytes + loaded_bytes / 32 +
                                 ARENA_CHUNK_BYTES_DOCUMENTED);
  sl_cow_delta empty = sl_cow_map_freeze(map);
  cr_assert_null(empty.head, "loaded entries are clean");
  sl_cow_map_release(map, empty.epoch);
  model_copy(durable, live);

  /* No new keys, so the reserved table never grows; no two checkpoints in
   * a row abort, so the pending array never grows: the memory at the end
   * can be compared exactly. */
  mutator mu = {.map = map, .live = live, .rng = 77, .id_range = ids,
                .delete_percent = 20};
  uint64_t ops = sl_test_scaled(8000, 1000);
  int aborted = 0;
  for (int round = 0; round < 24; round++) {
    for (uint64_t i = 0; i < ops; i++)
      mutate_once(&mu);
    sl_cow_delta d = sl_cow_map_freeze(map);
    model_copy(at_freeze, live);
    const sl_cow_delta *pending;
    writer_job job = {.state = work};
    sl_cow_map_pending(map, &pending, &job.count);
    cr_assert(job.count >= 1 && job.count <= 2);
    memcpy(job.deltas, pending, (size_t)job.count * sizeof *pending);
    model_copy(work, durable);
    pthread_t writer;
    cr_assert_eq(pthread_create(&writer, 0, writer_main, &job), 0);
    for (uint64_t i = 0; i < ops; i++)
      mutate_once(&mu);
    cr_assert_eq(pthread_join(writer, 0), 0);
    cr_assert_eq(job.errors, 0, "round %d", round);
    cr_assert(model_equal(work, at_freeze), "round %d", round);
    if (round % 5 == 2) {
      aborted++;
    } else {
      model_copy(durable, work);
      sl_cow_map_release(map, d.epoch);
      sl_cow_map_maintain(map, round % 2 ? 1000000 : 500);
    }
    cr_assert_eq(mu.errors, 0, "round %d", round);
    cr_assert(sl_cow_map_check(map), "round %d", round);
    if (round % 6 == 5)
      cr_assert_eq(model_diff_map(live, map), 0, "round %d", round);
  }
  cr_assert(aborted >= 4);
  cr_assert_lt(arena_entries(map), ids, "no loaded entry was replaced");
  cr_assert_gt(arena_entries(map), 0, "every loaded entry was replaced");

  for (uint64_t id = 0; id < ids; id++)
    if (live->slots[id].present) {
      cr_assert_eq(delete_id(map, id), 0);
      model_delete(live, id);
    }
  sl_cow_map_release(map, sl_cow_map_freeze(map).epoch);
  maintain_all(map);
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(sl_cow_map_count(map), 0);
  /* Less the spare chunk the copying freezes keep (cow_map.c note 16). */
  cr_assert_eq(sl_cow_map_memory_bytes(map) -
                   sl_cow_map_arena_spare_bytes(map),
               memory_before, "versions or arena chunks were not returned");
  model_free(live);
  model_free(durable);
  model_free(at_freeze);
  model_free(work);
  sl_cow_map_destroy(map);
}

/* Arena versions, one change of each kind, with exact memory: in place
 * (same size), replaced by another size (the arena version leaves its
 * chunk), deleted in place, copied after a freeze and reclaimed.  A loaded
 * value too large for the arena is malloc'd. */
Test(cow_map, bulk_loaded_versions_live_like_any_other) {
  sl_cow_map *map;
  const uint64_t ids = 3000;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  /* Copy on write after a freeze: cow_map.c note 16's copying freeze off. */
  sl_cow_map_set_freeze_copy(map, 0, 0);
  /* Reserved, so the table never grows and the memory can come back to
   * exactly this. */
  cr_assert_eq(sl_cow_map_reserve(map, ids + 1), 0);
  uint64_t memory_empty = sl_cow_map_memory_bytes(map);
  model *state = model_new(ids); /* all but the large value */
  load_input *in = load_inputs(ids, 1, true, 0);
  for (uint64_t i = 0; i < ids; i++) {
    uint8_t value[VALUE_MAX_BYTES];
    uint32_t bytes = load_value(in[i].id, value);
    cr_assert_eq(sl_cow_map_load_add(map, 0, in[i].key, in[i].key_bytes,
                                     value, bytes), 0);
    model_put(state, in[i].id, value, bytes);
    if (i == 100) /* the ring is not empty: the checker knows it */
      cr_assert(sl_cow_map_check(map));
  }
  free(in);
  /* Last (group 1): 100 KiB, over the arena's 64 KiB limit. */
  const uint32_t big_bytes = 100u << 10;
  uint8_t *big = calloc(1, big_bytes), key[KEY_MAX_BYTES];
  cr_assert(big);
  big[big_bytes - 1] = 0x5a;
  uint32_t key_bytes = key_make(ids, key);
  cr_assert_eq(sl_cow_map_load_add(map, 1, key, key_bytes, big, big_bytes), 0);
  cr_assert_eq(sl_cow_map_load_finish(map), 0);
  cr_assert_eq(sl_cow_map_load_probes(map), 0);
  cr_assert_eq(sl_cow_map_count(map), ids + 1);
  cr_assert_eq(arena_entries(map), ids);
  uint32_t bytes;
  const uint8_t *v = get_id(map, ids, &bytes);
  cr_assert(v && bytes == big_bytes && v[big_bytes - 1] == 0x5a);
  cr_assert_eq(version_of(v, key_bytes)->arena, 0);
  cr_assert_eq(model_diff_map(state, map), 1, "not just the count differs");
  cr_assert(sl_cow_map_check(map));
  uint64_t memory = sl_cow_map_memory_bytes(map);

  /* Same size: in place, still the arena version; no version memory
   * moves (the epoch's first write adds its index's first block,
   * cow_map.h note 11). */
  const uint8_t *before = get_id(map, 5, &bytes);
  uint32_t size5 = bytes;
  put_value(map, 5, size5, 55);
  cr_assert_eq(get_id(map, 5, &bytes), before);
  cr_assert_eq(version_of(before, 8 + 5 % 9)->arena, 1);
  cr_assert_eq(sl_cow_map_memory_bytes(map),
               memory + sizeof(sl_cow_index_block));
  memory = sl_cow_map_memory_bytes(map);
  /* Another size: a malloc'd version; the chunk keeps its other versions,
   * so the memory grows by the new version only. */
  put_value(map, 6, 77, 66);
  v = get_id(map, 6, &bytes);
  cr_assert_eq(version_of(v, 8 + 6 % 9)->arena, 0);
  cr_assert_eq(sl_cow_map_memory_bytes(map),
               memory + version_bytes(8 + 6 % 9, 77));
  memory = sl_cow_map_memory_bytes(map);
  /* Deleted in place: the arena version is the tombstone. */
  cr_assert_eq(delete_id(map, 7), 0);
  cr_assert_eq(sl_cow_map_memory_bytes(map), memory);
  cr_assert(sl_cow_map_check(map));
  sl_cow_delta d = sl_cow_map_freeze(map);
  seen_entry seen[4];
  cr_assert_eq(delta_entries(&d, seen, 4), 3);
  cr_assert(seen[0].id == 5 && !seen[0].tombstone && seen[0].bytes == size5);
  cr_assert(seen[1].id == 6 && !seen[1].tombstone && seen[1].bytes == 77);
  cr_assert(seen[2].id == 7 && seen[2].tombstone);
  /* Frozen: a write copies; the arena version stays on the frozen list. */
  put_value(map, 5, size5, 555);
  cr_assert_neq(get_id(map, 5, &bytes), before);
  uint8_t expected[VALUE_MAX_BYTES];
  value_fill(expected, size5, 55);
  cr_assert_eq(memcmp(before, expected, size5), 0, "frozen version changed");
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_release(map, d.epoch);
  maintain_all(map);
  cr_assert(sl_cow_map_check(map));

  /* Everything deleted and reclaimed: every chunk and version returned. */
  for (uint64_t id = 0; id <= ids; id++)
    if (id != 7)
      cr_assert_eq(delete_id(map, id), 0, "id %lu", (unsigned long)id);
  sl_cow_map_release(map, sl_cow_map_freeze(map).epoch);
  maintain_all(map);
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(sl_cow_map_count(map), 0);
  /* Every chunk emptied; the last one stays as the spare (cow_map.c note
   * 16), still counted. */
  cr_assert_eq(sl_cow_map_arena_spare_bytes(map),
               ARENA_CHUNK_BYTES_DOCUMENTED);
  cr_assert_eq(sl_cow_map_memory_bytes(map),
               memory_empty + ARENA_CHUNK_BYTES_DOCUMENTED);
  /* The map still loads after its arena emptied: into the spare. */
  cr_assert_eq(sl_cow_map_load(map, key, key_bytes, "x", 1), 0);
  cr_assert_eq(sl_cow_map_arena_spare_bytes(map), 0);
  cr_assert_eq(sl_cow_map_memory_bytes(map),
               memory_empty + ARENA_CHUNK_BYTES_DOCUMENTED);
  cr_assert(sl_cow_map_check(map));
  free(big);
  model_free(state);
  sl_cow_map_destroy(map);
}

/* Duplicates are found whatever the order, late but exactly; the load then
 * stays failed; the map stays consistent with what was linked. */
Test(cow_map, bulk_load_finds_duplicates) {
  const uint64_t n = 2000;
  uint8_t value[VALUE_MAX_BYTES];
  uint32_t bytes;
  /* 1. Sorted input, then the last key again: equal is out of order, so
   * it is probed and found, by finish (the ring had not moved on). */
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  model *state = model_new(n);
  load_input *in = load_inputs(n, 3, true, 0);
  add_sorted_then_last_again(map, state, in, n);
  cr_assert_eq(sl_cow_map_load_finish(map), EINVAL);
  cr_assert_eq(sl_cow_map_load_probes(map), 1);
  cr_assert_eq(sl_cow_map_count(map), n);
  cr_assert_eq(model_diff_map(state, map), 0, "the first copy stays");
  cr_assert(sl_cow_map_check(map));
  /* Failed for good. */
  cr_assert_eq(sl_cow_map_load_add(map, 9, "new", 3, "x", 1), EINVAL);
  cr_assert_eq(sl_cow_map_load_finish(map), EINVAL);
  cr_assert_eq(sl_cow_map_count(map), n);
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_destroy(map);

  /* 2. Shuffled input, an early key repeated late: reported within
   * SL_COW_LOAD_WINDOW adds; everything before stays linked. */
  cr_assert_eq(sl_cow_map_create(&map), 0);
  load_input *shuffled = load_inputs(n, 1, false, 5);
  uint64_t repeat_at = n / 2;
  uint64_t failed_at = add_with_repeat(map, shuffled, n, repeat_at);
  cr_assert_gt(failed_at, repeat_at);
  cr_assert_leq(failed_at, repeat_at + SL_COW_LOAD_WINDOW);
  cr_assert_eq(sl_cow_map_load_finish(map), EINVAL);
  cr_assert_eq(sl_cow_map_count(map), failed_at - 1, "all but the copy");
  /* Probed: all but the random order's first ascending run. */
  cr_assert_geq(sl_cow_map_load_probes(map) + 10, failed_at);
  assert_first_copy(map, &shuffled[3]);
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_destroy(map);

  /* 3. A map that held keys before the bulk load: order proves nothing
   * about those, so every entry is probed. */
  cr_assert_eq(sl_cow_map_create(&map), 0);
  bytes = load_value(in[10].id, value);
  cr_assert_eq(
      sl_cow_map_load(map, in[10].key, in[10].key_bytes, value, bytes), 0);
  cr_assert_eq(sl_cow_map_load(map, in[10].key, in[10].key_bytes, value, bytes),
               EINVAL, "sl_cow_map_load checks at once");
  cr_assert_eq(bulk_load(map, 0, in, n, true), EINVAL);
  /* in[10] is the 11th added; its copy is linked (and the load fails) by
   * the add SL_COW_LOAD_WINDOW later, the ones in between by finish. */
  cr_assert_eq(sl_cow_map_load_probes(map), 10 + SL_COW_LOAD_WINDOW);
  cr_assert_eq(sl_cow_map_count(map), 10 + SL_COW_LOAD_WINDOW);
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_destroy(map);

  /* 4. Too large a key: refused at once, and the load fails. */
  cr_assert_eq(sl_cow_map_create(&map), 0);
  cr_assert_eq(
      sl_cow_map_load_add(map, 0, in[0].key, in[0].key_bytes, "v", 1), 0);
  cr_assert_eq(sl_cow_map_load_add(map, 0, in[1].key, SL_COW_MAX_BYTES + 1u,
                                   "v", 1), EINVAL);
  cr_assert_eq(sl_cow_map_load_finish(map), EINVAL);
  cr_assert_eq(sl_cow_map_count(map), 1);
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_destroy(map);

  /* 5. Order broken without a duplicate (a key group goes back): no
   * error; the entries from the break on are probed. */
  cr_assert_eq(sl_cow_map_create(&map), 0);
  load_order_broken(map, in, n);
  /* Shuffled: the order breaks at once. */
  cr_assert_eq(sl_cow_map_create(&map), 0);
  cr_assert_eq(bulk_load(map, 0, shuffled, n, false), 0);
  cr_assert_geq(sl_cow_map_load_probes(map), n - 10);
  cr_assert_eq(sl_cow_map_count(map), n);
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_destroy(map);
  model_free(state);
  free(shuffled);
  free(in);
}

/* Destroy in the middle of a bulk load, or after a failed one, frees every
 * version (ASan builds report a leak or a bad free otherwise). */
Test(cow_map, bulk_load_destroyed_midway) {
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  load_input *in = load_inputs(500, 1, true, 0);
  uint8_t *big = calloc(1, 1u << 20);
  cr_assert(big);
  for (uint64_t i = 0; i < 500; i++) {
    uint8_t value[VALUE_MAX_BYTES];
    uint32_t bytes = load_value(in[i].id, value);
    /* Some malloc'd versions among the ones still in the ring. */
    bool large = i >= 495 && i % 2;
    cr_assert_eq(sl_cow_map_load_add(map, 0, in[i].key, in[i].key_bytes,
                                     large ? big : value,
                                     large ? 1u << 20 : bytes), 0);
  }
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_destroy(map);

  cr_assert_eq(sl_cow_map_create(&map), 0);
  cr_assert_eq(sl_cow_map_load_add(map, 0, in[0].key, in[0].key_bytes, big,
                                   1u << 20), 0);
  cr_assert_eq(sl_cow_map_load_add(map, 0, in[0].key, in[0].key_bytes, big,
                                   1u << 20), 0);
  cr_assert_eq(sl_cow_map_load_finish(map), EINVAL); /* the copy freed */
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_destroy(map);
  free(big);
  free(in);
}


/* ------------------------------------------------------------ staged loads */

/* Stage every bulk load into map (cow_map.c note 18) in partitions of 64
 * buckets of a table reserved for `entries`, through an area of budget
 * bytes, so a small load links in many rounds and partitions. */
static void stage_small(sl_cow_map *map, uint64_t entries, uint64_t budget) {
  cr_assert_eq(sl_cow_map_reserve(map, entries), 0);
  sl_cow_map_set_load_stage(map, 0, 64, budget);
}

/* bulk_load(), checking the map every 997 adds (the stage's records
 * among the rest). */
static int bulk_load_checked(sl_cow_map *map, model *state,
                             const load_input *in, uint64_t n) {
  int rc = 0;
  for (uint64_t i = 0; rc == 0 && i < n; i++) {
    uint8_t value[VALUE_MAX_BYTES];
    uint32_t bytes = load_value(in[i].id, value);
    rc = sl_cow_map_load_add(map, in[i].group, in[i].key, in[i].key_bytes,
                             value, bytes);
    if (rc == 0 && state)
      model_put(state, in[i].id, value, bytes);
    if (i % 997 == 0)
      cr_assert(sl_cow_map_check(map), "add %lu", (unsigned long)i);
  }
  int finished = sl_cow_map_load_finish(map);
  return rc ? rc : finished;
}

/* A staged load gives the map an unstaged one gives: the same entries,
 * the same memory once finished (the area is freed), no probe on sorted
 * input; in a table it outgrows (rehashing while it links) and in one
 * it does not. */
Test(cow_map, staged_load_matches_unstaged) {
  const uint64_t sizes[2] = {20000, 3000};
  for (int s = 0; s < 2; s++) {
    uint64_t n = sizes[s];
    load_input *in = load_inputs(n, 7, true, 0);
    sl_cow_map *staged, *unstaged;
    cr_assert_eq(sl_cow_map_create(&staged), 0);
    cr_assert_eq(sl_cow_map_create(&unstaged), 0);
    stage_small(staged, 4096, 64u << 10);
    cr_assert_eq(sl_cow_map_reserve(unstaged, 4096), 0);
    sl_cow_map_set_load_stage(unstaged, UINT64_MAX, 64, 64u << 10);
    model *state = model_new(n);
    cr_assert_eq(bulk_load_checked(staged, state, in, n), 0);
    cr_assert_eq(bulk_load(unstaged, 0, in, n, true), 0);
    cr_assert_eq(sl_cow_map_load_staged(staged), n);
    cr_assert_eq(sl_cow_map_load_staged(unstaged), 0);
    /* About 40 bytes a record: every 64 KiB links once more. */
    cr_assert_geq(sl_cow_map_stage_links(staged), n * 36 / (64u << 10));
    cr_assert_eq(sl_cow_map_load_probes(staged), 0, "sorted: none probed");
    cr_assert_eq(sl_cow_map_count(staged), n);
    cr_assert_eq(model_diff_map(state, staged), 0);
    cr_assert_eq(model_diff_map(state, unstaged), 0);
    cr_assert_eq(arena_entries(staged), n);
    cr_assert_eq(sl_cow_map_memory_bytes(staged),
                 sl_cow_map_memory_bytes(unstaged), "the area is freed");
    cr_assert(sl_cow_map_check(staged));
    /* An ordinary map after: written, frozen, released. */
    uint8_t value[VALUE_MAX_BYTES];
    uint32_t bytes = load_value(in[n / 2].id, value);
    value[0] ^= 0xff;
    cr_assert(sl_cow_map_put(staged, in[n / 2].key, in[n / 2].key_bytes,
                             value, bytes));
    cr_assert_eq(delete_id(staged, in[1].id), 0);
    sl_cow_map_release(staged, sl_cow_map_freeze(staged).epoch);
    maintain_all(staged);
    cr_assert_eq(sl_cow_map_count(staged), n - 1);
    cr_assert(sl_cow_map_check(staged));
    sl_cow_map_destroy(staged);
    sl_cow_map_destroy(unstaged);
    model_free(state);
    free(in);
  }
}

/* Duplicates in a staged load are found when their round is linked, the
 * first copy stays, the load stays failed; order broken without one is no
 * error. */
Test(cow_map, staged_load_finds_duplicates) {
  const uint64_t n = 6000;
  uint32_t bytes;
  /* 1. Sorted, then the last key again: found by finish, one probe. */
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  stage_small(map, n, 16u << 10);
  model *state = model_new(n);
  load_input *in = load_inputs(n, 3, true, 0);
  add_sorted_then_last_again(map, state, in, n);
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(sl_cow_map_load_finish(map), EINVAL);
  cr_assert_eq(sl_cow_map_load_staged(map), n + 1);
  cr_assert_eq(sl_cow_map_load_probes(map), 1);
  cr_assert_eq(sl_cow_map_count(map), n);
  cr_assert_eq(model_diff_map(state, map), 0, "the first copy stays");
  cr_assert_eq(sl_cow_map_load_add(map, 9, "new", 3, "x", 1), EINVAL);
  cr_assert_eq(sl_cow_map_load_finish(map), EINVAL);
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_destroy(map);

  /* 2. Shuffled, an early key repeated: reported by the add whose round
   * links it, or by finish; all added before that stay but the copy. */
  cr_assert_eq(sl_cow_map_create(&map), 0);
  stage_small(map, n, 16u << 10);
  load_input *shuffled = load_inputs(n, 1, false, 5);
  uint64_t repeat_at = n / 2;
  uint64_t failed_at = add_with_repeat(map, shuffled, n, repeat_at);
  cr_assert_gt(failed_at, repeat_at);
  /* A round holds at most 16 KiB / 16 records (cow_map.c stage_begin). */
  cr_assert_leq(failed_at, repeat_at + (16u << 10) / 16u + 1u);
  cr_assert_eq(sl_cow_map_load_finish(map), EINVAL);
  cr_assert_eq(sl_cow_map_count(map), failed_at - 1, "all but the copy");
  assert_first_copy(map, &shuffled[3]);
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_destroy(map);

  /* 3. A map that held a key before: every entry probed; the key held
   * keeps its value. */
  cr_assert_eq(sl_cow_map_create(&map), 0);
  stage_small(map, n, 16u << 10);
  cr_assert_eq(sl_cow_map_load(map, in[10].key, in[10].key_bytes, "held", 4),
               0);
  cr_assert_eq(bulk_load(map, 0, in, n, true), EINVAL);
  cr_assert_eq(sl_cow_map_load_probes(map), sl_cow_map_load_staged(map));
  cr_assert_geq(sl_cow_map_load_probes(map), 11);
  const uint8_t *v = sl_cow_map_get(map, in[10].key, in[10].key_bytes, &bytes);
  cr_assert(v && bytes == 4 && memcmp(v, "held", 4) == 0);
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_destroy(map);

  /* 4. Order broken without a duplicate: no error; probed from the break. */
  cr_assert_eq(sl_cow_map_create(&map), 0);
  stage_small(map, n, 16u << 10);
  load_order_broken(map, in, n);
  model_free(state);
  free(shuffled);
  free(in);
}

/* An entry larger than the area is linked at once, after everything
 * staged before it, so the first of two copies stays either way; without
 * memory for the area the load is not staged and gives the same map. */
Test(cow_map, staged_load_large_entries_and_no_area) {
  const uint64_t n = 3000;
  load_input *in = load_inputs(n, 1, true, 0);
  uint8_t *big = calloc(1, 8192);
  cr_assert(big);
  value_fill(big, 8192, 99);
  /* Large entries among staged ones, and a large copy of a staged key,
   * and a staged copy of a large one. */
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  stage_small(map, n, 4096);
  int rc = 0;
  for (uint64_t i = 0; rc == 0 && i < n; i++) {
    uint8_t value[VALUE_MAX_BYTES];
    bool large = i % 500 == 7;
    uint32_t bytes = large ? 8192 : load_value(in[i].id, value);
    rc = sl_cow_map_load_add(map, 0, in[i].key, in[i].key_bytes,
                             large ? big : value, bytes);
  }
  cr_assert_eq(rc, 0);
  cr_assert_eq(sl_cow_map_load_finish(map), 0);
  cr_assert_eq(sl_cow_map_load_staged(map), n - 6);
  cr_assert_eq(sl_cow_map_count(map), n);
  for (uint64_t i = 0; i < n; i++) { /* larger than the model holds */
    uint8_t value[VALUE_MAX_BYTES];
    bool large = i % 500 == 7;
    uint32_t bytes = large ? 8192 : load_value(in[i].id, value), got = 0;
    const uint8_t *v = get_id(map, in[i].id, &got);
    cr_assert(v && got == bytes && memcmp(v, large ? big : value, bytes) == 0,
              "entry %lu", (unsigned long)i);
  }
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_destroy(map);
  for (int large_first = 0; large_first < 2; large_first++) {
    cr_assert_eq(sl_cow_map_create(&map), 0);
    stage_small(map, n, 4096);
    uint8_t value[VALUE_MAX_BYTES];
    uint32_t bytes = load_value(in[0].id, value);
    for (int copy = 0; copy < 2; copy++) {
      bool large = (copy == 0) == (large_first == 1);
      /* A large second copy is linked, so found, by its own add; a staged
       * one by finish. */
      int expected = copy == 1 && large ? EINVAL : 0;
      cr_assert_eq(sl_cow_map_load_add(map, 0, in[0].key, in[0].key_bytes,
                                       large ? big : value,
                                       large ? 8192 : bytes), expected);
    }
    cr_assert_eq(sl_cow_map_load_finish(map), EINVAL);
    uint32_t got = 0;
    const uint8_t *v = sl_cow_map_get(map, in[0].key, in[0].key_bytes, &got);
    cr_assert(v);
    if (large_first)
      cr_assert(got == 8192 && memcmp(v, big, 8192) == 0, "the large first");
    else
      cr_assert(got == bytes && memcmp(v, value, bytes) == 0, "the staged first");
    cr_assert(sl_cow_map_check(map));
    sl_cow_map_destroy(map);
  }
  /* No memory for the area: unstaged, the same entries. */
  cr_assert_eq(sl_cow_map_create(&map), 0);
  stage_small(map, n, 4096);
  sl_cow_map_test_fail_alloc(map, SL_COW_FAIL_STAGE_AREA, 1);
  model *plain = model_new(n);
  cr_assert_eq(bulk_load(map, plain, in, n, false), 0);
  cr_assert_eq(sl_cow_map_load_staged(map), 0);
  cr_assert_eq(model_diff_map(plain, map), 0);
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_destroy(map);
  model_free(plain);
  free(big);
  free(in);
}

/* Destroyed with records staged, or after a staged load failed: nothing
 * leaks (ASan builds report it otherwise). */
Test(cow_map, staged_load_destroyed_midway) {
  load_input *in = load_inputs(2000, 1, true, 0);
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  stage_small(map, 2000, 8192);
  for (uint64_t i = 0; i < 2000; i++) {
    uint8_t value[VALUE_MAX_BYTES];
    uint32_t bytes = load_value(in[i].id, value);
    cr_assert_eq(sl_cow_map_load_add(map, 0, in[i].key, in[i].key_bytes,
                                     value, bytes), 0);
  }
  cr_assert_gt(sl_cow_map_stage_links(map), 0);
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_destroy(map); /* records still staged */

  cr_assert_eq(sl_cow_map_create(&map), 0);
  stage_small(map, 2000, 8192);
  cr_assert_eq(sl_cow_map_load_add(map, 0, in[0].key, in[0].key_bytes, "a", 1),
               0);
  cr_assert_eq(sl_cow_map_load_add(map, 0, in[0].key, in[0].key_bytes, "b", 1),
               0);
  cr_assert_eq(sl_cow_map_load_finish(map), EINVAL);
  sl_cow_map_destroy(map);
  free(in);
}

/* A round links its records partition by partition: the versions, carved
 * one after another as they are linked, lie in partition order.  Empty
 * keys and empty values stage like any other. */
Test(cow_map, staged_load_links_in_partition_order) {
  const uint64_t n = 2000;
  load_input *in = load_inputs(n, 1, true, 0);
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  /* Partitions of 64 buckets: partition = (hash & (buckets - 1)) >> 6. */
  stage_small(map, 4096, 1u << 20);
  uint64_t mask = sl_cow_map_buckets(map) - 1;
  cr_assert_geq(mask, 4095, "room for every entry, the load grows nothing");
  model *state = model_new(n);
  cr_assert_eq(bulk_load(map, state, in, n, false), 0);
  cr_assert_eq(sl_cow_map_buckets(map) - 1, mask);
  cr_assert_eq(sl_cow_map_stage_links(map), 1, "one round, at finish");
  cr_assert_eq(model_diff_map(state, map), 0);
  /* One fresh arena chunk holds them all: address order is link order. */
  const sl_cow_entry **by_address = calloc(n, sizeof *by_address);
  cr_assert(by_address);
  for (uint64_t i = 0; i < n; i++) {
    uint32_t bytes = 0;
    const uint8_t *v = get_id(map, in[i].id, &bytes);
    cr_assert(v);
    by_address[i] = version_of(v, in[i].key_bytes);
  }
  qsort(by_address, n, sizeof *by_address, address_order);
  for (uint64_t i = 1; i < n; i++) {
    cr_assert_eq(chunk_base(by_address[i]), chunk_base(by_address[0]));
    cr_assert_leq((by_address[i - 1]->hash & mask) >> 6,
                  (by_address[i]->hash & mask) >> 6, "version %lu",
                  (unsigned long)i);
  }
  free(by_address);
  sl_cow_map_destroy(map);
  model_free(state);

  cr_assert_eq(sl_cow_map_create(&map), 0);
  stage_small(map, 4096, 1u << 20);
  cr_assert_eq(sl_cow_map_load_add(map, 0, "", 0, "v", 1), 0);
  cr_assert_eq(sl_cow_map_load_add(map, 0, "k", 1, "", 0), 0);
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(sl_cow_map_load_finish(map), 0);
  cr_assert_eq(sl_cow_map_load_staged(map), 2);
  cr_assert_eq(sl_cow_map_load_probes(map), 0);
  uint32_t bytes = 9;
  const uint8_t *v = sl_cow_map_get(map, "", 0, &bytes);
  cr_assert(v && bytes == 1 && v[0] == 'v');
  cr_assert(sl_cow_map_get(map, "k", 1, &bytes) && bytes == 0);
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_destroy(map);
  free(in);
}
