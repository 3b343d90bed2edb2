/* test_cow_map_written.h — the map the copying freeze's and the copy
 * pass's tests start from (test_cow_map_freeze_copy.c,
 * test_cow_map_copy_pass.c): IDS keys of BYTES bytes written in one
 * epoch, with the two kinds of retired versions a list holds, its model,
 * and where each key's version lives.  Include after test_cow_map.h. */
#ifndef SL_TEST_COW_MAP_WRITTEN_H
#define SL_TEST_COW_MAP_WRITTEN_H

#define IDS 1000u
#define BYTES 16u

/* IDS keys of BYTES bytes (seed id), plus, in the same epoch, key IDS
 * put twice with different sizes (its first version superseded) and key
 * IDS + 1 put and deleted in place (a retired tombstone): the two kinds
 * of retired versions a current list holds.  live gets what is live. */
static inline void write_epoch(sl_cow_map *map, model *live) {
  uint8_t value[VALUE_MAX_BYTES];
  for (uint64_t id = 0; id < IDS; id++) {
    put_value(map, id, BYTES, id);
    value_fill(value, BYTES, id);
    model_put(live, id, value, BYTES);
  }
  put_value(map, IDS, 8, 1);
  put_value(map, IDS, 40, 2);
  value_fill(value, 40, 2);
  model_put(live, IDS, value, 40);
  put_value(map, IDS + 1, BYTES, 3);
  cr_assert_eq(delete_id(map, IDS + 1), 0);
}

/* A map after write_epoch, its model, and where each of [0, IDS) lives. */
typedef struct written {
  sl_cow_map *map;
  model *live, *empty, *at_freeze;
  const uint8_t *where[IDS];
} written;

static inline void written_start(written *w) {
  cr_assert_eq(sl_cow_map_create(&w->map), 0);
  w->live = model_new(IDS + 2);
  w->empty = model_new(IDS + 2);
  w->at_freeze = model_new(IDS + 2);
  write_epoch(w->map, w->live);
  uint32_t bytes;
  for (uint64_t id = 0; id < IDS; id++)
    w->where[id] = get_id(w->map, id, &bytes);
}

static inline void written_end(written *w) {
  model_free(w->live);
  model_free(w->empty);
  model_free(w->at_freeze);
  sl_cow_map_destroy(w->map);
}

/* The delta d applied to a copy of before equals expected. */
static inline void expect_delta(const sl_cow_delta *d, const model *before,
                         const model *expected) {
  model *work = model_new(IDS + 2);
  model_copy(work, before);
  cr_assert_eq(apply_delta(work, d), 0);
  cr_assert(model_equal(work, expected), "the delta's state differs");
  model_free(work);
}

#endif /* SL_TEST_COW_MAP_WRITTEN_H */
