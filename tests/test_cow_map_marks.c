/* test_cow_map_marks.c — without rollback, a copy on write leaves the
 * version it displaces untouched until its epoch is released, and the
 * reclaim steps write its mark before they walk on (storage/cow_map.c
 * note 15).  Each test drives a real map and checks it whole
 * (sl_cow_map_check) and against what it must hold.
 */
#include <errno.h>

#include "test_cow_map.h"

#define KEYS 600u
#define VALUE_BYTES 16u

/* A map that copies on write after a freeze (cow_map.c note 16's
 * copying freeze off: these tests are about the versions it displaces). */
static sl_cow_map *cow_map_new(void) {
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  sl_cow_map_set_freeze_copy(map, 0, 0);
  return map;
}

/* A map without rollback holding KEYS keys, every version CLEAN. */
static sl_cow_map *clean_map(void) {
  sl_cow_map *map = cow_map_new();
  for (uint64_t id = 0; id < KEYS; id++)
    put_value(map, id, VALUE_BYTES, id);
  sl_cow_map_release(map, sl_cow_map_freeze(map).epoch);
  maintain_all(map);
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(sl_cow_map_retire_waiting(map), 0);
  return map;
}

/* What a frozen version holds that the copy on write displacing it used
 * to write: its mark.  (Its chain link is still written while it is in
 * the table and a neighbour behind it is replaced: that is the table's
 * link, note 4 of cow_map.c.) */
typedef struct frozen_view {
  const sl_cow_entry *version;
  uint8_t retired;
} frozen_view;

static uint64_t view_delta(const sl_cow_delta *d, frozen_view *views,
                           uint64_t max) {
  uint64_t n = 0;
  for (const sl_cow_entry *e = d->head; e && n < max; e = e->dirty_next, n++)
    views[n] = (frozen_view){e, e->retired};
  return n;
}

/* Every key written once more, in id order. */
static void write_all(sl_cow_map *map, uint64_t seed) {
  for (uint64_t id = 0; id < KEYS; id++)
    put_value(map, id, VALUE_BYTES, seed + id);
}

/* clean_map() with every key written again (seed 1000, epoch 2: each
 * version CURRENT, in place) and frozen: the delta, each of its KEYS
 * versions viewed into views. */
static sl_cow_delta frozen_map(sl_cow_map **map, frozen_view *views) {
  *map = clean_map();
  write_all(*map, 1000);
  sl_cow_delta d = sl_cow_map_freeze(*map);
  cr_assert_eq(view_delta(&d, views, KEYS), KEYS);
  return d;
}

static void expect_values(sl_cow_map *map, uint64_t seed) {
  for (uint64_t id = 0; id < KEYS; id++) {
    uint32_t bytes = 0;
    const uint8_t *p = get_id(map, id, &bytes);
    uint8_t expected[VALUE_BYTES];
    value_fill(expected, VALUE_BYTES, seed + id);
    cr_assert(p && bytes == VALUE_BYTES, "id %lu", (unsigned long)id);
    cr_assert_eq(memcmp(p, expected, VALUE_BYTES), 0, "id %lu",
                 (unsigned long)id);
  }
}

/* The rest reclaimed, no mark left waiting, the map checked whole and
 * holding seed's values; then destroyed. */
static void drain_and_destroy(sl_cow_map *map, uint64_t seed) {
  maintain_all(map);
  cr_assert_eq(sl_cow_map_retire_waiting(map), 0);
  cr_assert(sl_cow_map_check(map));
  expect_values(map, seed);
  sl_cow_map_destroy(map);
}

/* The writer's case: every key written again while its frozen version
 * waits to be written.  None of the frozen versions is touched; their
 * marks are written only after the release, by the reclaim steps, and
 * then everything displaced is freed. */
Test(cow_map_marks, frozen_versions_stay_untouched_until_release) {
  sl_cow_map *map;
  frozen_view views[KEYS];
  sl_cow_delta d = frozen_map(&map, views);
  uint64_t memory = sl_cow_map_memory_bytes(map);
  write_all(map, 2000); /* a copy of each: the frozen ones displaced */
  cr_assert_eq(sl_cow_map_retire_waiting(map), KEYS);
  for (uint64_t i = 0; i < KEYS; i++)
    cr_assert_eq(views[i].version->retired, views[i].retired, "version %lu",
                 (unsigned long)i);
  cr_assert(sl_cow_map_check(map));
  expect_values(map, 2000);

  sl_cow_map_release(map, d.epoch);
  cr_assert_eq(sl_cow_map_retire_waiting(map), KEYS, "marked by steps only");
  cr_assert(sl_cow_map_check(map));
  /* One step of 10: 10 marks, and the walk does not start before all. */
  cr_assert(sl_cow_map_maintain(map, 10));
  cr_assert_eq(sl_cow_map_retire_waiting(map), KEYS - 10);
  cr_assert(sl_cow_map_check(map));
  maintain_all(map);
  cr_assert_eq(sl_cow_map_retire_waiting(map), 0);
  cr_assert(sl_cow_map_check(map));
  expect_values(map, 2000);
  /* Each displaced version freed: one version a key again (the copies
   * took the frozen ones' places; the arrays of notes are gone). */
  cr_assert_lt(sl_cow_map_memory_bytes(map), memory + KEYS * 8);
  sl_cow_map_destroy(map);
}

/* A RELEASED version the reclaim walk has not reached yet is marked at
 * once when a write displaces it (the writer is done with it), and the
 * walk, which starts at the first key while the writes go from the last,
 * frees it when it gets there. */
Test(cow_map_marks, released_versions_are_marked_at_once) {
  sl_cow_map *map;
  frozen_view views[KEYS];
  sl_cow_delta d = frozen_map(&map, views);
  sl_cow_map_release(map, d.epoch); /* RELEASED, not walked */
  const uint64_t last = KEYS - 1; /* the walk reaches it last */
  put_value(map, last, VALUE_BYTES, 3000 + last);
  cr_assert_eq(sl_cow_map_retire_waiting(map), 0);
  cr_assert_eq(views[last].version->retired, 1 /* RETIRED_FREE */);
  for (uint64_t n = 1; n < KEYS; n++) {
    uint64_t id = KEYS - 1 - n;
    put_value(map, id, VALUE_BYTES, 3000 + id);
    cr_assert_eq(sl_cow_map_retire_waiting(map), 0);
    if (n % 10 == 0)
      cr_assert(sl_cow_map_check(map), "id %lu", (unsigned long)id);
  }
  cr_assert(sl_cow_map_check(map));
  for (uint32_t budget = 1; sl_cow_map_maintain(map, budget); budget += 3)
    cr_assert(sl_cow_map_check(map));
  expect_values(map, 3000);
  sl_cow_map_release(map, sl_cow_map_freeze(map).epoch);
  drain_and_destroy(map, 3000);
}

/* Two checkpoints pending, released one at a time and then both at once:
 * each epoch's notes join the queue with its release. */
Test(cow_map_marks, several_pending_epochs) {
  sl_cow_map *map = clean_map();
  write_all(map, 1000);
  sl_cow_delta first = sl_cow_map_freeze(map);
  write_all(map, 2000); /* displaces first's versions */
  sl_cow_delta second = sl_cow_map_freeze(map);
  write_all(map, 3000); /* displaces second's */
  cr_assert_eq(sl_cow_map_retire_waiting(map), 2 * KEYS);
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_release(map, first.epoch);
  sl_cow_map_maintain(map, KEYS / 2);
  cr_assert_eq(sl_cow_map_retire_waiting(map), 2 * KEYS - KEYS / 2);
  cr_assert(sl_cow_map_check(map));
  write_all(map, 4000); /* CURRENT versions: in place, nothing displaced */
  sl_cow_delta third = sl_cow_map_freeze(map);
  write_all(map, 5000);
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_release(map, third.epoch); /* second and third together */
  (void)second;
  cr_assert(sl_cow_map_check(map));
  drain_and_destroy(map, 5000);
}

/* Destroyed with marks still waiting in a pending slot and on the queue:
 * every version is freed once (ASan's leak and double-free checks). */
Test(cow_map_marks, destroy_with_marks_waiting) {
  sl_cow_map *map = clean_map();
  write_all(map, 1000);
  sl_cow_delta first = sl_cow_map_freeze(map);
  write_all(map, 2000);
  sl_cow_map_freeze(map);
  write_all(map, 3000);
  sl_cow_map_release(map, first.epoch);
  sl_cow_map_maintain(map, 7);
  cr_assert_gt(sl_cow_map_retire_waiting(map), KEYS); /* both kinds */
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_destroy(map);
}

/* An array of notes that cannot grow: that version is marked at once, as
 * before note 15, and the next ones wait again. */
Test(cow_map_marks, no_memory_for_a_note_marks_at_once) {
  sl_cow_map *map;
  frozen_view views[KEYS];
  sl_cow_delta d = frozen_map(&map, views);
  sl_cow_map_test_fail_alloc(map, SL_COW_FAIL_RETIRE_LATER, 1);
  write_all(map, 2000);
  /* The first displaced version found no array: marked; the rest were
   * noted once the array could be had on the next try. */
  cr_assert_eq(views[0].version->retired, 1 /* RETIRED_FREE */);
  cr_assert_eq(sl_cow_map_retire_waiting(map), KEYS - 1);
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_release(map, d.epoch);
  drain_and_destroy(map, 2000);
}

/* A delta larger than an array of notes may hold (LATER_MAX, 16384 in
 * cow_map.c): the first 16384 displaced versions wait, the rest are
 * marked at once, so the notes never take more than 128 KiB a slot. */
Test(cow_map_marks, a_large_delta_notes_at_most_the_cap) {
  enum { MANY = 20000 };
  sl_cow_map *map = cow_map_new();
  for (uint64_t id = 0; id < MANY; id++)
    put_value(map, id, 8, id);
  sl_cow_delta d = sl_cow_map_freeze(map);
  for (uint64_t id = 0; id < MANY; id++)
    put_value(map, id, 8, 100000 + id);
  cr_assert_eq(sl_cow_map_retire_waiting(map), 16384);
  uint64_t marked = 0;
  for (const sl_cow_entry *e = d.head; e; e = e->dirty_next)
    marked += e->retired != 0;
  cr_assert_eq(marked, MANY - 16384);
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_release(map, d.epoch);
  maintain_all(map);
  cr_assert_eq(sl_cow_map_retire_waiting(map), 0);
  cr_assert(sl_cow_map_check(map));
  for (uint64_t id = 0; id < MANY; id += 997) {
    uint32_t bytes = 0;
    const uint8_t *p = get_id(map, id, &bytes);
    uint8_t expected[8];
    value_fill(expected, 8, 100000 + id);
    cr_assert(p && bytes == 8 && memcmp(p, expected, 8) == 0);
  }
  sl_cow_map_destroy(map);
}

/* Turning rollback on writes every waiting mark first: the undo list
 * (cow_map.c note 12) starts from a map with none. */
Test(cow_map_marks, enable_rollback_writes_the_marks) {
  sl_cow_map *map = clean_map();
  write_all(map, 1000);
  sl_cow_map_freeze(map);
  write_all(map, 2000);
  sl_cow_map_release(map, sl_cow_map_freeze(map).epoch);
  cr_assert_eq(sl_cow_map_retire_waiting(map), KEYS);
  cr_assert_eq(sl_cow_map_enable_rollback(map), 0);
  cr_assert_eq(sl_cow_map_retire_waiting(map), 0);
  cr_assert(sl_cow_map_check(map));
  drain_and_destroy(map, 2000);
}

/* Random writes (puts of any size, updates, deletes) with freezes,
 * releases that lag behind by up to three epochs, and reclaim steps of
 * random budgets, against the model; the map is checked whole every few
 * hundred steps and compared with the model at the end.  Marks must have
 * waited at some point, or the test tested nothing. */
Test(cow_map_marks, random_writes_against_a_model, .timeout = 120) {
  enum { IDS = 2000, STEPS = 60000 };
  sl_cow_map *map = cow_map_new();
  model *live = model_new(IDS);
  mutator mu = {.map = map, .live = live, .rng = 20261207, .id_range = IDS,
                .delete_percent = 10};
  uint32_t pending[8];
  uint32_t pending_count = 0;
  uint64_t waited_most = 0, rng = 7;
  for (uint32_t step = 0; step < STEPS; step++) {
    mutate_once(&mu);
    uint32_t dice = rng_below(&rng, 1000);
    if (dice < 8 && pending_count < 8) {
      pending[pending_count++] = sl_cow_map_freeze(map).epoch;
    } else if (dice < 14 && pending_count > 0) {
      /* Release the oldest, or up to the newest of some. */
      uint32_t upto = rng_below(&rng, pending_count);
      sl_cow_map_release(map, pending[upto]);
      memmove(pending, pending + upto + 1,
              (pending_count - upto - 1) * sizeof *pending);
      pending_count -= upto + 1;
    } else if (dice < 40) {
      sl_cow_map_maintain(map, 1 + rng_below(&rng, 64));
    }
    uint64_t waiting = sl_cow_map_retire_waiting(map);
    if (waiting > waited_most)
      waited_most = waiting;
    if (step % 400 == 0)
      cr_assert(sl_cow_map_check(map), "step %u", step);
  }
  cr_assert_eq(mu.errors, 0);
  cr_assert_gt(waited_most, 100, "marks waited for at most %lu versions",
               (unsigned long)waited_most);
  cr_assert(sl_cow_map_check(map));
  if (pending_count)
    sl_cow_map_release(map, pending[pending_count - 1]);
  maintain_all(map);
  cr_assert_eq(sl_cow_map_retire_waiting(map), 0);
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(model_diff_map(live, map), 0);
  model_free(live);
  sl_cow_map_destroy(map);
}
