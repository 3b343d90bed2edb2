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
#include "test_util.h"

/* ------------------------------------------------------------ utilities */

/* SplitMix64 finaliser: every input gets its own well-mixed word. */
static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Seeded PRNG (SplitMix64 sequence): the same seed gives the same run. */
static uint64_t rng_next(uint64_t *state) {
  *state += 0x9e3779b97f4a7c15ull;
  return mix64(*state);
}

static uint32_t rng_below(uint64_t *state, uint32_t n) {
  return (uint32_t)(rng_next(state) % n);
}

#define KEY_MAX_BYTES 17u
#define VALUE_MAX_BYTES 96u

static uint32_t key_make(uint64_t id, uint8_t *key) {
  uint32_t filler = (uint32_t)(id % 9);
  uint64_t pattern = mix64(id);
  memcpy(key, &id, 8);
  for (uint32_t j = 0; j < filler; j++)
    key[8 + j] = (uint8_t)(pattern >> (8 * j));
  return 8 + filler;
}

/* The id a key names, if it is exactly key_make(id). */
static bool key_parse(const uint8_t *key, uint32_t key_bytes, uint64_t *id) {
  uint8_t expected[KEY_MAX_BYTES];
  if (key_bytes < 8 || key_bytes > KEY_MAX_BYTES)
    return false;
  memcpy(id, key, 8);
  return key_make(*id, expected) == key_bytes &&
         memcmp(expected, key, key_bytes) == 0;
}

static void value_fill(uint8_t *dst, uint32_t bytes, uint64_t seed) {
  for (uint32_t i = 0; i < bytes; i++)
    dst[i] = (uint8_t)(mix64(seed + i / 8) >> (8 * (i % 8)));
}

static const uint8_t *entry_value(const sl_cow_entry *e) {
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

static model *model_new(uint64_t ids) {
  model *m = calloc(1, sizeof *m);
  cr_assert(m);
  m->ids = ids;
  m->slots = calloc(ids, sizeof *m->slots);
  cr_assert(m->slots);
  return m;
}

static void model_free(model *m) {
  free(m->slots);
  free(m);
}

static void model_put(model *m, uint64_t id, const void *value, uint32_t bytes) {
  model_slot *s = &m->slots[id];
  m->live += !s->present;
  s->present = true;
  s->bytes = bytes;
  memcpy(s->value, value, bytes);
}

static void model_delete(model *m, uint64_t id) {
  m->live -= m->slots[id].present;
  m->slots[id].present = false;
}

static void model_copy(model *dst, const model *src) {
  cr_assert_eq(dst->ids, src->ids);
  memcpy(dst->slots, src->slots, src->ids * sizeof *src->slots);
  dst->live = src->live;
}

static bool model_equal(const model *a, const model *b) {
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
static uint64_t model_diff_map(const model *m, sl_cow_map *map) {
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
static uint64_t apply_delta(model *m, const sl_cow_delta *d) {
  uint64_t errors = 0, n = 0, bytes = 0;
  const sl_cow_entry *e = d->head;
  for (; e && n < d->entries; e = e->dirty_next, n++) {
    uint64_t id;
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
  return errors;
}

/* Order-sensitive digest of everything a writer may read from a delta. */
static uint64_t delta_digest(const sl_cow_delta *d) {
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
static void mutate_in_place(mutator *mu, uint64_t id, const uint8_t *key,
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
static void mutate_update(mutator *mu, uint64_t id, const uint8_t *key,
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

static void mutate_once(mutator *mu) {
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

static void maintain_all(sl_cow_map *map) {
  /* Bounded: each call reclaims 256 versions, far more calls than needed. */
  for (int i = 0; i < 1000000 && sl_cow_map_maintain(map, 256); i++) {
  }
  cr_assert(!sl_cow_map_maintain(map, 1));
}

static void put_value(sl_cow_map *map, uint64_t id, uint32_t bytes,
                      uint64_t seed) {
  uint8_t key[KEY_MAX_BYTES], value[VALUE_MAX_BYTES];
  uint32_t key_bytes = key_make(id, key);
  value_fill(value, bytes, seed);
  const uint8_t *p = sl_cow_map_put(map, key, key_bytes, value, bytes);
  cr_assert(p);
  cr_assert_eq(memcmp(p, value, bytes), 0);
}

static const uint8_t *get_id(sl_cow_map *map, uint64_t id, uint32_t *bytes) {
  uint8_t key[KEY_MAX_BYTES];
  uint32_t key_bytes = key_make(id, key);
  return sl_cow_map_get(map, key, key_bytes, bytes);
}

static int delete_id(sl_cow_map *map, uint64_t id) {
  uint8_t key[KEY_MAX_BYTES];
  uint32_t key_bytes = key_make(id, key);
  return sl_cow_map_delete(map, key, key_bytes);
}

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

/* Read a delta's entries as (id, tombstone, superseded, value_bytes). */
typedef struct seen_entry {
  uint64_t id;
  int tombstone, superseded;
  uint32_t bytes;
} seen_entry;

static int delta_entries(const sl_cow_delta *d, seen_entry *out, int max) {
  int n = 0;
  for (const sl_cow_entry *e = d->head; e && n < max; e = e->dirty_next, n++) {
    cr_assert(key_parse(sl_cow_entry_key(e), e->key_bytes, &out[n].id));
    out[n].tombstone = e->tombstone;
    out[n].superseded = e->superseded;
    out[n].bytes = e->value_bytes;
  }
  return n;
}

Test(cow_map, freeze_pending_and_apply) {
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
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

#define WRITER_MAX_DELTAS 64

/* What the checkpoint writer thread gets (by pthread_create, which orders
 * the freeze before its reads) and what it leaves for the main thread. */
typedef struct writer_job {
  model *state; /* the durable state; the writer applies deltas to it */
  sl_cow_delta deltas[WRITER_MAX_DELTAS];
  int count;
  uint64_t errors;
} writer_job;

static void *writer_main(void *arg) {
  writer_job *job = arg;
  for (int i = 0; i < job->count; i++)
    job->errors += apply_delta(job->state, &job->deltas[i]);
  return 0;
}

Test(cow_map, concurrent_checkpoints_match_reference, .timeout = 120) {
  const int rounds = 48;
  uint64_t ops = sl_test_scaled(12000, 1500);
  uint64_t ids = sl_test_scaled(40000, 4000);
  model *live = model_new(ids), *durable = model_new(ids);
  model *at_freeze = model_new(ids), *work = model_new(ids);
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
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

    sl_cow_delta d = sl_cow_map_freeze(map);
    model_copy(at_freeze, live);
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
  sl_cow_map_release(map, UINT32_MAX);
  maintain_all(map);
  cr_assert(sl_cow_map_check(map));
  model_free(live);
  model_free(durable);
  model_free(at_freeze);
  model_free(work);
  sl_cow_map_destroy(map);
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
  uint64_t memory = sl_cow_map_memory_bytes(map);
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

/* A key prepared by the caller from its words (as engine/state.c does)
 * reaches the same entry as the same bytes given to get, put and delete. */
Test(cow_map, prepared_keys_match_byte_keys) {
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  for (uint64_t k = 0; k < 3000; k++) {
    uint8_t bytes[11];
    for (int i = 0; i < 8; i++)
      bytes[i] = (uint8_t)(k >> (56 - 8 * i));
    bytes[8] = 0xFF;
    bytes[9] = 0x04;
    bytes[10] = (uint8_t)(1 + k % 4);
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
    for (int i = 0; i < 8; i++)
      bytes[i] = (uint8_t)(k >> (56 - 8 * i));
    bytes[8] = 0xFF;
    bytes[9] = 0x04;
    bytes[10] = (uint8_t)(1 + k % 4);
    cr_assert_eq(sl_cow_map_delete(map, bytes, 11), 0);
    sl_cow_key key = sl_cow_key_of(bytes, 11);
    cr_assert_null(sl_cow_map_find(map, &key, 0));
  }
  cr_assert_eq(sl_cow_map_count(map), 2000);
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_destroy(map);
}

/* ------------------------------------------------------ 7. bulk loads */

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
  cr_assert_eq(sl_cow_map_memory_bytes(map), memory_before,
               "versions or arena chunks were not returned");
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

  /* Same size: in place, still the arena version; no memory moves. */
  const uint8_t *before = get_id(map, 5, &bytes);
  uint32_t size5 = bytes;
  put_value(map, 5, size5, 55);
  cr_assert_eq(get_id(map, 5, &bytes), before);
  cr_assert_eq(version_of(before, 8 + 5 % 9)->arena, 1);
  cr_assert_eq(sl_cow_map_memory_bytes(map), memory);
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
  cr_assert_eq(sl_cow_map_memory_bytes(map), memory_empty);
  /* The map still loads (a new chunk) after its arena emptied. */
  cr_assert_eq(sl_cow_map_load(map, key, key_bytes, "x", 1), 0);
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
  for (uint64_t i = 0; i < n; i++) {
    bytes = load_value(in[i].id, value);
    cr_assert_eq(sl_cow_map_load_add(map, in[i].group, in[i].key,
                                     in[i].key_bytes, value, bytes), 0);
    model_put(state, in[i].id, value, bytes);
  }
  const load_input *last = &in[n - 1];
  cr_assert_eq(sl_cow_map_load_add(map, last->group, last->key,
                                   last->key_bytes, "other", 5), 0);
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
  uint64_t repeat_at = n / 2, failed_at = UINT64_MAX;
  for (uint64_t i = 0; i < n; i++) {
    const load_input *x = i == repeat_at ? &shuffled[3] : &shuffled[i];
    bytes = load_value(x->id, value);
    int rc = sl_cow_map_load_add(map, 0, x->key, x->key_bytes, value, bytes);
    if (rc) {
      cr_assert_eq(rc, EINVAL);
      failed_at = i;
      break;
    }
  }
  cr_assert_gt(failed_at, repeat_at);
  cr_assert_leq(failed_at, repeat_at + SL_COW_LOAD_WINDOW);
  cr_assert_eq(sl_cow_map_load_finish(map), EINVAL);
  cr_assert_eq(sl_cow_map_count(map), failed_at - 1, "all but the copy");
  /* Probed: all but the random order's first ascending run. */
  cr_assert_geq(sl_cow_map_load_probes(map) + 10, failed_at);
  const uint8_t *v = get_id(map, shuffled[3].id, &bytes);
  uint32_t first_bytes = load_value(shuffled[3].id, value);
  cr_assert(v && bytes == first_bytes && memcmp(v, value, bytes) == 0);
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
  /* Shuffled: the order breaks at once. */
  cr_assert_eq(sl_cow_map_create(&map), 0);
  cr_assert_eq(bulk_load(map, 0, shuffled, n, false), 0);
  cr_assert_geq(sl_cow_map_load_probes(map), n - 10);
  cr_assert_eq(sl_cow_map_count(map), n);
  cr_assert(sl_cow_map_check(map));
  sl_cow_map_destroy(map);
  model_free(loaded);
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
