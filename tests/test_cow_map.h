/* test_cow_map.h — what the copy-on-write map's test files share
 * (test_cow_map.c, test_cow_map_load.c, test_cow_map_rollback.c,
 * test_cow_map_lazy_rollback.c, test_cow_map_marks.c,
 * test_cow_map_index.c): numbered keys and values, the reference
 * model, the mutator that drives a map and its model together, a delta's
 * entries read back, the checkpoint writer thread of the property tests,
 * and the rollback tests' fixture: a map with rollback on at a completed
 * checkpoint.  One copy of each; nothing here is a test.
 */
#ifndef SL_TEST_COW_MAP_H
#define SL_TEST_COW_MAP_H

#include <criterion/criterion.h>

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cow_map.h"
#include "sluice.h"

/* ------------------------------------------------------------ utilities */

/* SplitMix64 finaliser: every input gets its own well-mixed word. */
static inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Seeded PRNG (SplitMix64 sequence): the same seed gives the same run. */
static inline uint64_t rng_next(uint64_t *state) {
  *state += 0x9e3779b97f4a7c15ull;
  return mix64(*state);
}

static inline uint32_t rng_below(uint64_t *state, uint32_t n) {
  return (uint32_t)(rng_next(state) % n);
}

#define KEY_MAX_BYTES 17u
#define VALUE_MAX_BYTES 96u

static inline uint32_t key_make(uint64_t id, uint8_t *key) {
  uint32_t filler = (uint32_t)(id % 9);
  uint64_t pattern = mix64(id);
  memcpy(key, &id, 8);
  for (uint32_t j = 0; j < filler; j++)
    key[8 + j] = (uint8_t)(pattern >> (8 * j));
  return 8 + filler;
}

/* The id a key names, if it is exactly key_make(id). */
static inline bool key_parse(const uint8_t *key, uint32_t key_bytes,
                             uint64_t *id) {
  uint8_t expected[KEY_MAX_BYTES];
  if (key_bytes < 8 || key_bytes > KEY_MAX_BYTES)
    return false;
  memcpy(id, key, 8);
  return key_make(*id, expected) == key_bytes &&
         memcmp(expected, key, key_bytes) == 0;
}

static inline void value_fill(uint8_t *dst, uint32_t bytes, uint64_t seed) {
  for (uint32_t i = 0; i < bytes; i++)
    dst[i] = (uint8_t)(mix64(seed + i / 8) >> (8 * (i % 8)));
}

static inline const uint8_t *entry_value(const sl_cow_entry *e) {
  return e->data + sl_cow_value_offset(e->key_bytes);
}

/* ------------------------------------------------------ reference model */

typedef struct model_slot {
  bool present;
  uint32_t bytes;
  uint8_t value[VALUE_MAX_BYTES];
} model_slot;

typedef struct model {
  uint64_t ids; /* slots */
  uint64_t live;
  model_slot *slots;
} model;

static inline model *model_new(uint64_t ids) {
  model *m = calloc(1, sizeof *m);
  cr_assert(m);
  m->ids = ids;
  m->slots = calloc(ids, sizeof *m->slots);
  cr_assert(m->slots);
  return m;
}

static inline void model_free(model *m) {
  free(m->slots);
  free(m);
}

static inline void model_put(model *m, uint64_t id, const void *value,
                             uint32_t bytes) {
  model_slot *s = &m->slots[id];
  m->live += !s->present;
  s->present = true;
  s->bytes = bytes;
  memcpy(s->value, value, bytes);
}

static inline void model_delete(model *m, uint64_t id) {
  m->live -= m->slots[id].present;
  m->slots[id].present = false;
}

static inline void model_copy(model *dst, const model *src) {
  cr_assert_eq(dst->ids, src->ids);
  memcpy(dst->slots, src->slots, src->ids * sizeof *src->slots);
  dst->live = src->live;
}

static inline bool model_equal(const model *a, const model *b) {
  if (a->ids != b->ids || a->live != b->live)
    return false;
  for (uint64_t id = 0; id < a->ids; id++) {
    const model_slot *x = &a->slots[id], *y = &b->slots[id];
    if (x->present != y->present)
      return false;
    if (x->present &&
        (x->bytes != y->bytes || memcmp(x->value, y->value, x->bytes) != 0))
      return false;
  }
  return true;
}

/* Number of ids whose map contents differ from the model (and 1 more if the
 * counts differ). */
static inline uint64_t model_diff_map(const model *m, sl_cow_map *map) {
  uint64_t wrong = sl_cow_map_count(map) != m->live;
  for (uint64_t id = 0; id < m->ids; id++) {
    uint8_t key[KEY_MAX_BYTES];
    uint32_t key_bytes = key_make(id, key), bytes;
    const uint8_t *v = sl_cow_map_get(map, key, key_bytes, &bytes);
    const model_slot *s = &m->slots[id];
    if ((v != 0) != s->present)
      wrong++;
    else if (v && (bytes != s->bytes || memcmp(v, s->value, bytes) != 0))
      wrong++;
  }
  return wrong;
}

/* Apply one delta the way a checkpoint writer does (header note 6).
 * Returns the number of problems found (bad keys, epochs, counts). */
static inline uint64_t apply_delta(model *m, const sl_cow_delta *d) {
  uint64_t errors = 0, n = 0, bytes = 0;
  const sl_cow_entry *e = d->head;
  /* The index, where there is one, names the same versions in the same
   * order (cow_map.h note 11): at is the next slot of block. */
  const sl_cow_index_block *block = d->index;
  uint64_t at = 0;
  for (; e && n < d->entries; e = e->dirty_next, n++) {
    uint64_t id;
    if (d->index) {
      if (block && at == block->count) {
        block = block->next;
        at = 0;
      }
      errors += !block || block->versions[at++] != e;
    }
    bytes += (uint64_t)e->key_bytes + e->value_bytes;
    errors += e->epoch != d->epoch;
    if (e->superseded)
      continue;
    if (!key_parse(sl_cow_entry_key(e), e->key_bytes, &id) || id >= m->ids) {
      errors++;
      continue;
    }
    if (e->tombstone) {
      errors += e->value_bytes != 0;
      model_delete(m, id);
    } else if (e->value_bytes > VALUE_MAX_BYTES) {
      errors++;
    } else {
      model_put(m, id, entry_value(e), e->value_bytes);
    }
  }
  errors += e != 0 || n != d->entries || bytes != d->bytes;
  errors += d->index && (!block || at != block->count || block->next);
  return errors;
}

/* Order-sensitive digest of everything a writer may read from a delta. */
static inline uint64_t delta_digest(const sl_cow_delta *d) {
  uint64_t sum = 0xcbf29ce484222325ull, n = 0;
  for (const sl_cow_entry *e = d->head; e && n <= d->entries;
       e = e->dirty_next, n++) {
    const uint8_t *k = sl_cow_entry_key(e), *v = entry_value(e);
    sum = (sum ^ e->epoch ^ (uint64_t)e->tombstone << 40 ^
           (uint64_t)e->superseded << 48) * 0x100000001b3ull;
    for (uint32_t i = 0; i < e->key_bytes; i++)
      sum = (sum ^ k[i]) * 0x100000001b3ull;
    for (uint32_t i = 0; i < e->value_bytes; i++)
      sum = (sum ^ v[i]) * 0x100000001b3ull;
  }
  return sum;
}

/* ------------------------------------------------------------ mutator */

/* Random writes to the map and the model alike.  errors counts API results
 * that disagree with the model. */
typedef struct mutator {
  sl_cow_map *map;
  model *live;
  uint64_t rng;
  uint64_t id_range;
  uint32_t delete_percent;
  uint64_t seed; /* makes every written value distinct */
  uint64_t errors;
} mutator;

/* put(key, NULL, bytes), then check the storage holds the old value as far
 * as it fits and zeros after, then write a new value through it. */
static inline void mutate_in_place(mutator *mu, uint64_t id, const uint8_t *key,
                                   uint32_t key_bytes, uint32_t bytes) {
  model_slot *s = &mu->live->slots[id];
  uint8_t *p = sl_cow_map_put(mu->map, key, key_bytes, 0, bytes);
  if (!p) {
    mu->errors++;
    return;
  }
  uint32_t kept = s->present ? (s->bytes < bytes ? s->bytes : bytes) : 0;
  mu->errors += kept && memcmp(p, s->value, kept) != 0;
  for (uint32_t i = kept; i < bytes; i++)
    mu->errors += p[i] != 0;
  value_fill(p, bytes, ++mu->seed);
  model_put(mu->live, id, p, bytes);
}

/* sl_cow_map_update(): the storage must hold the current value (or init,
 * or zeros for a NULL init, when absent); a size other than the current
 * value's is refused with nothing changed.  A new value is then written
 * through the returned storage, as an operator updating in place does. */
static inline void mutate_update(mutator *mu, uint64_t id, const uint8_t *key,
                                 uint32_t key_bytes, uint32_t bytes) {
  model_slot *s = &mu->live->slots[id];
  uint8_t init[VALUE_MAX_BYTES] = {0};
  bool zero_init = mu->seed % 5 == 0;
  value_fill(init, bytes, ++mu->seed);
  if (zero_init)
    memset(init, 0, sizeof init);
  void *p = 0;
  sl_cow_key k = sl_cow_key_of(key, key_bytes);
  int rc = sl_cow_map_update(mu->map, &k, zero_init ? 0 : init, bytes, &p);
  if (s->present && s->bytes != bytes) {
    mu->errors += rc != EINVAL || p != 0;
    return;
  }
  if (rc != 0 || !p) {
    mu->errors++;
    return;
  }
  const uint8_t *expected = s->present ? s->value : init;
  mu->errors += bytes && memcmp(p, expected, bytes) != 0;
  value_fill(p, bytes, ++mu->seed);
  model_put(mu->live, id, p, bytes);
}

static inline void mutate_once(mutator *mu) {
  uint64_t id = rng_next(&mu->rng) % mu->id_range;
  uint8_t key[KEY_MAX_BYTES], value[VALUE_MAX_BYTES];
  uint32_t key_bytes = key_make(id, key);
  model_slot *s = &mu->live->slots[id];
  uint32_t dice = rng_below(&mu->rng, 100);
  uint32_t bytes = rng_below(&mu->rng, VALUE_MAX_BYTES + 1);
  if (dice < mu->delete_percent) {
    int rc = sl_cow_map_delete(mu->map, key, key_bytes);
    mu->errors += rc != (s->present ? 0 : SL_ENOTFOUND);
    model_delete(mu->live, id);
    return;
  }
  if (s->present && dice % 3 == 0)
    bytes = s->bytes; /* same size: the in-place paths */
  if (dice % 4 == 1) {
    mutate_in_place(mu, id, key, key_bytes, bytes);
    return;
  }
  if (dice % 4 == 2) {
    /* Mostly the current size (the operator's case), sometimes another
     * (refused). */
    if (s->present && dice % 5 != 0)
      bytes = s->bytes;
    mutate_update(mu, id, key, key_bytes, bytes);
    return;
  }
  value_fill(value, bytes, ++mu->seed);
  const uint8_t *p = sl_cow_map_put(mu->map, key, key_bytes, value, bytes);
  mu->errors += !p || memcmp(p, value, bytes) != 0;
  model_put(mu->live, id, value, bytes);
}

static inline void maintain_all(sl_cow_map *map) {
  /* Bounded: each call reclaims 256 versions, far more calls than needed. */
  for (int i = 0; i < 1000000 && sl_cow_map_maintain(map, 256); i++) {
  }
  cr_assert(!sl_cow_map_maintain(map, 1));
}

static inline void put_value(sl_cow_map *map, uint64_t id, uint32_t bytes,
                             uint64_t seed) {
  uint8_t key[KEY_MAX_BYTES], value[VALUE_MAX_BYTES];
  uint32_t key_bytes = key_make(id, key);
  value_fill(value, bytes, seed);
  const uint8_t *p = sl_cow_map_put(map, key, key_bytes, value, bytes);
  cr_assert(p);
  cr_assert_eq(memcmp(p, value, bytes), 0);
}

static inline const uint8_t *get_id(sl_cow_map *map, uint64_t id,
                                    uint32_t *bytes) {
  uint8_t key[KEY_MAX_BYTES];
  uint32_t key_bytes = key_make(id, key);
  return sl_cow_map_get(map, key, key_bytes, bytes);
}

static inline int delete_id(sl_cow_map *map, uint64_t id) {
  uint8_t key[KEY_MAX_BYTES];
  uint32_t key_bytes = key_make(id, key);
  return sl_cow_map_delete(map, key, key_bytes);
}

/* ------------------------------------------------------------ deltas */

/* Read a delta's entries as (id, tombstone, superseded, value_bytes). */
typedef struct seen_entry {
  uint64_t id;
  int tombstone, superseded;
  uint32_t bytes;
} seen_entry;

static inline int delta_entries(const sl_cow_delta *d, seen_entry *out,
                                int max) {
  int n = 0;
  for (const sl_cow_entry *e = d->head; e && n < max; e = e->dirty_next, n++) {
    cr_assert(key_parse(sl_cow_entry_key(e), e->key_bytes, &out[n].id));
    out[n].tombstone = e->tombstone;
    out[n].superseded = e->superseded;
    out[n].bytes = e->value_bytes;
  }
  return n;
}

/* ------------------------------------------------------------ writer */

#define WRITER_MAX_DELTAS 64

/* What the checkpoint writer thread gets (by pthread_create, which orders
 * the freeze before its reads) and what it leaves for the main thread. */
typedef struct writer_job {
  model *state; /* the durable state; the writer applies deltas to it */
  sl_cow_delta deltas[WRITER_MAX_DELTAS];
  int count;
  uint64_t errors;
} writer_job;

static inline void *writer_main(void *arg) {
  writer_job *job = arg;
  for (int i = 0; i < job->count; i++)
    job->errors += apply_delta(job->state, &job->deltas[i]);
  return 0;
}

/* ------------------------------------------------------------ rollback */

/* The model of what put_value (or an update of the same bytes) wrote. */
static inline void model_set(model *m, uint64_t id, uint32_t bytes,
                             uint64_t seed) {
  uint8_t value[VALUE_MAX_BYTES];
  value_fill(value, bytes, seed);
  model_put(m, id, value, bytes);
}

/* A new map with rollback on (cow_map.h note 10), stable at epoch 0. */
static inline sl_cow_map *rollback_map(void) {
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  cr_assert_eq(sl_cow_map_enable_rollback(map), 0);
  cr_assert(sl_cow_map_rollback_enabled(map));
  cr_assert_eq(sl_cow_map_stable_epoch(map), 0);
  return map;
}

/* Freeze and release at once: a checkpoint that completes.  Returns its
 * epoch, the map's stable one now. */
static inline uint32_t checkpoint(sl_cow_map *map) {
  sl_cow_delta d = sl_cow_map_freeze(map);
  sl_cow_map_release(map, d.epoch);
  cr_assert_eq(sl_cow_map_stable_epoch(map), d.epoch);
  return d.epoch;
}

/* The rollback tests' fixture: a map with rollback on whose keys 0 ..
 * keys - 1 (each `bytes` of value_fill(id), written by put_value) were
 * checkpointed, the checkpoint completed and reclaimed, so every version
 * is CLEAN and nothing waits to be freed; stable holds the checkpoint's
 * state (ids slots), or is NULL when ids is 0 (for states too large to
 * model).  rollback_fixture_free() ends it. */
typedef struct rollback_fixture {
  sl_cow_map *map;
  model *stable;
} rollback_fixture;

static inline rollback_fixture rollback_fixture_at_checkpoint(uint64_t ids,
                                                              uint64_t keys,
                                                              uint32_t bytes) {
  cr_assert(ids == 0 || keys <= ids);
  rollback_fixture f = {.map = rollback_map(),
                        .stable = ids ? model_new(ids) : 0};
  for (uint64_t id = 0; id < keys; id++) {
    put_value(f.map, id, bytes, id);
    if (f.stable)
      model_set(f.stable, id, bytes, id);
  }
  checkpoint(f.map);
  maintain_all(f.map);
  cr_assert_eq(sl_cow_map_count(f.map), keys);
  cr_assert_eq(sl_cow_map_undo_entries(f.map), 0);
  return f;
}

static inline void rollback_fixture_free(rollback_fixture *f) {
  sl_cow_map_destroy(f->map);
  if (f->stable)
    model_free(f->stable);
  f->map = 0;
  f->stable = 0;
}

/* The end of a test of a large version (key "big", value bytes of 7
 * frozen, 9 written since in place at p) copied at a freeze: frozen, the
 * copy in the delta of epoch, holds the 7s; after the release and the
 * reclaim the map is whole and holds the 9s at p.  Destroys the map. */
static inline void large_copy_released(sl_cow_map *map,
                                       const sl_cow_entry *frozen,
                                       uint32_t epoch, const uint8_t *p,
                                       uint32_t large) {
  cr_assert(frozen->value_bytes == large && !frozen->arena);
  const uint8_t *bytes = frozen->data + sl_cow_value_offset(3);
  for (uint32_t i = 0; i < large; i++)
    cr_assert_eq(bytes[i], 7, "byte %u", i);
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_release(map, epoch);
  maintain_all(map);
  cr_assert(sl_cow_map_check(map));
  uint32_t got;
  const uint8_t *now = sl_cow_map_get(map, "big", 3, &got);
  cr_assert(now == p && got == large && now[large - 1] == 9);
  sl_cow_map_destroy(map);
}

#endif /* SL_TEST_COW_MAP_H */
