/* cow_map.c — the copy-on-write hash map of an instance's keyed state
 * (cow_map.h).
 *
 * NOTES ON THE IMPLEMENTATION (the header's notes 1-8 hold as well)
 *
 * 1. A version's state follows from its epoch; each state has one list:
 *
 *      epoch == map->epoch          CURRENT   on the current dirty list
 *      epoch of a pending delta     FROZEN    on that delta's list
 *      released, not yet walked     RELEASED  on the reclaim chain
 *      epoch == 0                   CLEAN     on no list
 *
 *      CURRENT  --sl_cow_map_freeze()-->   FROZEN
 *      FROZEN   --sl_cow_map_release()-->  RELEASED
 *      RELEASED --reclaim_steps()-->       CLEAN if live, freed if retired
 *      CLEAN    --put/delete-->            CURRENT, in place
 *      FROZEN, RELEASED --put/delete-->    a new CURRENT version (or a
 *                                          tombstone); the old one retired
 *
 *    So a version whose epoch is neither 0 nor current is always on a list
 *    that has not been walked past it yet.
 * 2. RELEASED versions are copied on write like FROZEN ones, not re-dirtied
 *    in place.  Re-dirtying would overwrite dirty_next, which the reclaim
 *    walk still has to follow.  The walk reads dirty_next before it turns a
 *    live version CLEAN (epoch 0); from then on the version is on no list
 *    and may be re-dirtied in place.  The cost is one extra copy for keys
 *    written between a release and the walk reaching them.
 * 3. Every version is freed exactly once: a retired version that is on a
 *    list by the reclaim walk (or by destroy), a CLEAN one at once when a
 *    put of another size replaces it (it is on no list), a live one by
 *    destroy.  Retired CURRENT versions (superseded, deleted in place) stay
 *    on the current list, so they are reclaimed like any other.
 * 4. The threading contract (header note 5) holds because the only writes
 *    to a FROZEN version are to chain_next (rehash, unlinking a neighbour,
 *    replacing it in its chain) and retired; value, epoch and dirty_next
 *    are written only in CURRENT or CLEAN versions and in RELEASED ones by
 *    the reclaim walk, which the writer no longer reads (header note 7).
 *    tombstone, superseded and retired are separate bytes, hence separate
 *    memory locations in C11: writing one never races with reading another.
 * 5. sl_cow_map_pending()'s array may move only in freeze and release, and
 *    freeze cannot fail, so freeze grows the array ahead of need (doubling
 *    when full).  If that growth failed, a write that would open a
 *    non-empty epoch fails with ENOMEM (the map unaltered), so the next
 *    freeze still has a slot for any non-empty delta; an empty one is then
 *    left out (it has nothing to write, and the array still holds at least
 *    one delta).
 * 6. Incremental rehash as in Redis's dict.c: tables[1] exists only while
 *    rehashing; new entries go there; each operation moves at most
 *    REHASH_BUCKETS_PER_STEP non-empty buckets and visits at most
 *    REHASH_EMPTY_VISITS empty ones.  It starts when the load reaches 1
 *    (n entries, n buckets) and takes at most n/4 operations (each advances
 *    at least 4 buckets), so the new table of 2n buckets is at most 5/8
 *    full when it ends: rehashes never overlap.  A failed table
 *    allocation just postpones growth: chains get longer, nothing breaks.
 * 7. Memory accounting is exact, so sl_cow_map_check() can verify it.  A
 *    version deleted in place keeps its value storage; its size is kept in
 *    the first 4 bytes of the (unused) value area, which is why every
 *    version has a value area of at least 8 bytes.
 * 8. Every put and delete reclaims up to RECLAIM_PER_WRITE versions.  A
 *    write adds at most one version to a list, so the reclaim chain drains
 *    even if sl_cow_map_maintain() is never called.
 */
#include "cow_map.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "sluice.h"

#define INITIAL_BUCKETS 16u
#define REHASH_BUCKETS_PER_STEP 4u
/* Empty buckets one step may visit (Redis's n*10), so a sparse stretch of
 * the old table cannot make one call slow. */
#define REHASH_EMPTY_VISITS (REHASH_BUCKETS_PER_STEP * 10u)
#define RECLAIM_PER_WRITE 4u
#define INITIAL_PENDING 4u

_Static_assert(sizeof(sl_cow_entry) == 40, "header size of cow_map.h's note");
_Static_assert((INITIAL_BUCKETS & (INITIAL_BUCKETS - 1)) == 0,
               "bucket counts are powers of two");
_Static_assert(REHASH_BUCKETS_PER_STEP + REHASH_EMPTY_VISITS ==
                   SL_COW_STEP_MAX_BUCKETS,
               "the header quotes the per-operation bound");
_Static_assert(SL_COW_MAX_BYTES <= UINT32_MAX - 7u,
               "sl_cow_value_offset cannot overflow");

typedef struct cow_table {
  sl_cow_entry **buckets;
  uint64_t size; /* buckets: a power of two, or 0 when unused */
  uint64_t used; /* entries */
} cow_table;

struct sl_cow_map {
  cow_table tables[2];   /* [1] only while rehashing (note 6) */
  bool rehashing;
  uint64_t rehash_index; /* next bucket of tables[0] to move */
  uint32_t epoch;        /* current */
  sl_cow_entry *dirty_head; /* current dirty list, in write order */
  sl_cow_entry *dirty_tail;
  uint64_t dirty_entries;
  uint64_t dirty_bytes;
  sl_cow_delta *pending;        /* frozen, unreleased; oldest first */
  sl_cow_entry **pending_tails; /* last entry of each pending list */
  uint32_t pending_count;
  uint32_t pending_capacity;
  sl_cow_entry *reclaim_head; /* released lists, concatenated (note 1) */
  sl_cow_entry *reclaim_tail;
  uint64_t reclaim_entries;
  uint64_t memory_bytes;
  uint64_t step_buckets_max; /* most buckets one rehash step visited */
};

/* ------------------------------------------------------------ versions */

static uint64_t key_hash(const void *key, uint32_t key_bytes) {
  return XXH3_64bits(key_bytes ? key : "", key_bytes);
}

static uint8_t *value_area(sl_cow_entry *e) {
  return e->data + sl_cow_value_offset(e->key_bytes);
}

/* Bytes of one allocation: header, key padded to 8, value area of at least
 * 8 bytes (note 7). */
static uint64_t entry_alloc_bytes(uint32_t key_bytes, uint32_t capacity_bytes) {
  uint64_t area = ((uint64_t)capacity_bytes + 7u) & ~(uint64_t)7u;
  if (area < 8)
    area = 8;
  return sizeof(sl_cow_entry) + sl_cow_value_offset(key_bytes) + area;
}

/* Value storage the version was allocated with (note 7). */
static uint32_t entry_capacity(const sl_cow_entry *e) {
  if (!e->tombstone)
    return e->value_bytes;
  uint32_t capacity;
  memcpy(&capacity, e->data + sl_cow_value_offset(e->key_bytes), 4);
  return capacity;
}

static sl_cow_entry *entry_new(sl_cow_map *m, uint64_t hash, const void *key,
                               uint32_t key_bytes, uint32_t value_bytes) {
  assert(key_bytes <= SL_COW_MAX_BYTES);
  assert(value_bytes <= SL_COW_MAX_BYTES);
  uint64_t bytes = entry_alloc_bytes(key_bytes, value_bytes);
  if (bytes > SIZE_MAX)
    return 0;
  sl_cow_entry *e = malloc((size_t)bytes);
  if (!e)
    return 0;
  memset(e, 0, sizeof *e);
  e->hash = hash;
  e->epoch = m->epoch;
  e->key_bytes = key_bytes;
  e->value_bytes = value_bytes;
  if (key_bytes)
    memcpy(e->data, key, key_bytes);
  m->memory_bytes += bytes;
  return e;
}

static void entry_free(sl_cow_map *m, sl_cow_entry *e) {
  uint64_t bytes = entry_alloc_bytes(e->key_bytes, entry_capacity(e));
  assert(m->memory_bytes >= bytes);
  m->memory_bytes -= bytes;
  free(e);
}

/* Turn a version (out of the table, not frozen) into a tombstone in place,
 * keeping the size of its value storage for entry_capacity(). */
static void entry_make_tombstone(sl_cow_entry *e) {
  assert(!e->tombstone);
  uint32_t capacity = e->value_bytes;
  memcpy(value_area(e), &capacity, 4);
  e->value_bytes = 0;
  e->tombstone = 1;
  e->retired = 1;
}

/* Fill value storage: a copy of value, or (value NULL) the previous value's
 * bytes as far as they fit and zeros after them. */
static void fill_value(uint8_t *dst, uint32_t bytes, const void *value,
                       const uint8_t *previous, uint32_t previous_bytes) {
  if (value) {
    if (bytes)
      memmove(dst, value, bytes); /* value may be this very storage */
    return;
  }
  uint32_t kept = previous_bytes < bytes ? previous_bytes : bytes;
  if (kept && dst != previous)
    memcpy(dst, previous, kept);
  memset(dst + kept, 0, bytes - kept);
}

/* Append to the current dirty list (the version is CURRENT from now on). */
static void dirty_append(sl_cow_map *m, sl_cow_entry *e) {
  assert(e->epoch == m->epoch);
  assert((m->dirty_head == 0) == (m->dirty_tail == 0));
  e->dirty_next = 0;
  if (m->dirty_tail)
    m->dirty_tail->dirty_next = e; /* CURRENT, so not read by the writer */
  else
    m->dirty_head = e;
  m->dirty_tail = e;
  m->dirty_entries++;
  m->dirty_bytes += (uint64_t)e->key_bytes + e->value_bytes;
}

/* A write may add to the dirty list only if freeze will have a pending
 * slot for it (note 5). */
static bool dirty_slot_ready(const sl_cow_map *m) {
  return m->dirty_head != 0 || m->pending_count < m->pending_capacity;
}

/* ------------------------------------------------------------ tables */

static bool key_matches(const sl_cow_entry *e, uint64_t hash, const void *key,
                        uint32_t key_bytes) {
  return e->hash == hash && e->key_bytes == key_bytes &&
         (key_bytes == 0 || memcmp(e->data, key, key_bytes) == 0);
}

/* The link (bucket slot or chain_next) that points at key's entry, and the
 * table it is in; NULL if absent. */
static sl_cow_entry **find_link(const sl_cow_map *m, uint64_t hash,
                                const void *key, uint32_t key_bytes,
                                int *table_index) {
  int tables = m->rehashing ? 2 : 1;
  for (int t = 0; t < tables; t++) {
    const cow_table *table = &m->tables[t];
    sl_cow_entry **link = &table->buckets[hash & (table->size - 1)];
    /* A chain holds at most every entry of its table. */
    for (uint64_t steps = 0; *link && steps <= table->used; steps++) {
      if (key_matches(*link, hash, key, key_bytes)) {
        *table_index = t;
        return link;
      }
      link = &(*link)->chain_next;
    }
    assert(*link == 0);
  }
  return 0;
}

static void table_insert(sl_cow_map *m, sl_cow_entry *e) {
  cow_table *table = &m->tables[m->rehashing ? 1 : 0];
  assert(!e->retired);
  assert(!e->tombstone);
  sl_cow_entry **bucket = &table->buckets[e->hash & (table->size - 1)];
  e->chain_next = *bucket;
  *bucket = e;
  table->used++;
}

static void table_unlink(sl_cow_map *m, sl_cow_entry **link, int table_index) {
  sl_cow_entry *e = *link;
  assert(m->tables[table_index].used > 0);
  *link = e->chain_next; /* may write a FROZEN neighbour's chain_next */
  e->chain_next = 0;
  m->tables[table_index].used--;
}

/* Start growing (note 6) if the load factor reached 1. */
static void rehash_start_if_full(sl_cow_map *m) {
  cow_table *old = &m->tables[0];
  if (m->rehashing || old->used < old->size)
    return;
  uint64_t size = old->size * 2;
  sl_cow_entry **buckets = calloc((size_t)size, sizeof *buckets);
  if (!buckets)
    return; /* retried by the next insert; chains just get longer */
  m->tables[1] = (cow_table){.buckets = buckets, .size = size, .used = 0};
  m->memory_bytes += size * sizeof *buckets;
  m->rehashing = true;
  m->rehash_index = 0;
}

/* Move every entry of one old bucket to the new table. */
static void rehash_move_chain(sl_cow_map *m, sl_cow_entry *e) {
  cow_table *from = &m->tables[0], *to = &m->tables[1];
  uint64_t bound = from->used;
  for (uint64_t moved = 0; e && moved < bound; moved++) {
    sl_cow_entry *next = e->chain_next;
    sl_cow_entry **bucket = &to->buckets[e->hash & (to->size - 1)];
    e->chain_next = *bucket; /* owner-only field, also of FROZEN versions */
    *bucket = e;
    from->used--;
    to->used++;
    e = next;
  }
  assert(e == 0);
}

/* One bounded rehash step (note 6). */
static void rehash_step(sl_cow_map *m) {
  if (!m->rehashing)
    return;
  cow_table *from = &m->tables[0];
  uint32_t moved = 0, empty_visits = 0;
  while (moved < REHASH_BUCKETS_PER_STEP &&
         empty_visits < REHASH_EMPTY_VISITS && from->used > 0) {
    assert(m->rehash_index < from->size);
    sl_cow_entry *chain = from->buckets[m->rehash_index];
    from->buckets[m->rehash_index++] = 0;
    if (!chain) {
      empty_visits++;
      continue;
    }
    rehash_move_chain(m, chain);
    moved++;
  }
  if (moved + empty_visits > m->step_buckets_max)
    m->step_buckets_max = moved + empty_visits;
  if (from->used == 0) {
    m->memory_bytes -= from->size * sizeof *from->buckets;
    free(from->buckets);
    m->tables[0] = m->tables[1];
    m->tables[1] = (cow_table){0};
    m->rehashing = false;
  }
}

/* ------------------------------------------------------------ reclaim */

/* Walk up to budget versions of the reclaim chain (notes 1-3).  Returns
 * true if some remain. */
static bool reclaim_steps(sl_cow_map *m, uint32_t budget) {
  for (uint32_t done = 0; done < budget && m->reclaim_head; done++) {
    sl_cow_entry *e = m->reclaim_head;
    assert(e->epoch != 0 && e->epoch < m->epoch);
    m->reclaim_head = e->dirty_next; /* read before e changes state */
    m->reclaim_entries--;
    if (e->retired) {
      entry_free(m, e);
    } else {
      e->epoch = 0; /* CLEAN: on no list from now on */
      e->dirty_next = 0;
    }
  }
  if (!m->reclaim_head)
    m->reclaim_tail = 0;
  assert((m->reclaim_head == 0) == (m->reclaim_entries == 0));
  return m->reclaim_head != 0;
}

static void write_background(sl_cow_map *m) {
  reclaim_steps(m, RECLAIM_PER_WRITE);
  rehash_step(m);
}

/* ------------------------------------------------------------ lifetime */

int sl_cow_map_create(sl_cow_map **map) {
  assert(map);
  *map = 0;
  sl_cow_map *m = calloc(1, sizeof *m);
  if (!m)
    return ENOMEM;
  m->tables[0].buckets = calloc(INITIAL_BUCKETS, sizeof(sl_cow_entry *));
  m->pending = malloc(INITIAL_PENDING * sizeof *m->pending);
  m->pending_tails = malloc(INITIAL_PENDING * sizeof *m->pending_tails);
  if (!m->tables[0].buckets || !m->pending || !m->pending_tails) {
    free(m->tables[0].buckets);
    free(m->pending);
    free(m->pending_tails);
    free(m);
    return ENOMEM;
  }
  m->tables[0].size = INITIAL_BUCKETS;
  m->pending_capacity = INITIAL_PENDING;
  m->epoch = 1;
  m->memory_bytes = sizeof *m + INITIAL_BUCKETS * sizeof(sl_cow_entry *) +
                    INITIAL_PENDING * (sizeof *m->pending + sizeof *m->pending_tails);
  assert(sl_cow_map_check(m));
  *map = m;
  return 0;
}

/* Free the retired versions of one list (live ones are freed from the
 * table).  bound: the list's length. */
static void free_retired_on_list(sl_cow_map *m, sl_cow_entry *e,
                                 uint64_t bound) {
  for (uint64_t i = 0; e && i < bound; i++) {
    sl_cow_entry *next = e->dirty_next;
    if (e->retired)
      entry_free(m, e);
    e = next;
  }
  assert(e == 0);
}

void sl_cow_map_destroy(sl_cow_map *m) {
  if (!m)
    return;
  free_retired_on_list(m, m->dirty_head, m->dirty_entries);
  for (uint32_t i = 0; i < m->pending_count; i++)
    free_retired_on_list(m, m->pending[i].head, m->pending[i].entries);
  free_retired_on_list(m, m->reclaim_head, m->reclaim_entries);
  for (int t = 0; t < 2; t++) {
    cow_table *table = &m->tables[t];
    for (uint64_t b = 0; b < table->size; b++) {
      sl_cow_entry *e = table->buckets[b];
      for (uint64_t i = 0; e && i < table->used; i++) {
        sl_cow_entry *next = e->chain_next;
        entry_free(m, e);
        e = next;
      }
      assert(e == 0);
    }
    free(table->buckets);
  }
  free(m->pending);
  free(m->pending_tails);
  free(m);
}

/* ------------------------------------------------------------ reads */

const void *sl_cow_map_get(sl_cow_map *m, const void *key, uint32_t key_bytes,
                           uint32_t *value_bytes) {
  assert(m);
  assert(key || key_bytes == 0);
  rehash_step(m);
  int table_index;
  sl_cow_entry **link =
      find_link(m, key_hash(key, key_bytes), key, key_bytes, &table_index);
  if (value_bytes)
    *value_bytes = link ? (*link)->value_bytes : 0;
  return link ? value_area(*link) : 0;
}

uint64_t sl_cow_map_count(const sl_cow_map *m) {
  assert(m);
  return m->tables[0].used + m->tables[1].used;
}

int sl_cow_map_foreach(sl_cow_map *m, int (*fn)(void *arg, const sl_cow_entry *e),
                       void *arg) {
  assert(m);
  assert(fn);
  for (int t = 0; t < 2; t++) {
    const cow_table *table = &m->tables[t];
    for (uint64_t b = 0; b < table->size; b++) {
      const sl_cow_entry *e = table->buckets[b];
      for (uint64_t i = 0; e && i < table->used; i++, e = e->chain_next) {
        int rc = fn(arg, e);
        if (rc)
          return rc;
      }
    }
  }
  return 0;
}

uint64_t sl_cow_map_memory_bytes(const sl_cow_map *m) {
  assert(m);
  return m->memory_bytes;
}

uint64_t sl_cow_map_max_step_buckets(const sl_cow_map *m) {
  assert(m);
  return m->step_buckets_max;
}

/* ------------------------------------------------------------ writes */

/* Put a key that is not in the table. */
static void *put_new_key(sl_cow_map *m, uint64_t hash, const void *key,
                         uint32_t key_bytes, const void *value,
                         uint32_t value_bytes) {
  sl_cow_entry *e = entry_new(m, hash, key, key_bytes, value_bytes);
  if (!e)
    return 0;
  fill_value(value_area(e), value_bytes, value, 0, 0);
  rehash_start_if_full(m); /* before inserting: new entries go to [1] */
  table_insert(m, e);
  dirty_append(m, e);
  return value_area(e);
}

/* Replace old (in the table at *link) by a new CURRENT version.  The caller
 * decides what happens to old.  NULL on ENOMEM, nothing changed. */
static sl_cow_entry *put_new_version(sl_cow_map *m, sl_cow_entry **link,
                                     const void *value, uint32_t value_bytes) {
  sl_cow_entry *old = *link;
  sl_cow_entry *e = entry_new(m, old->hash, old->data, old->key_bytes, value_bytes);
  if (!e)
    return 0;
  fill_value(value_area(e), value_bytes, value, value_area(old), old->value_bytes);
  e->chain_next = old->chain_next;
  *link = e; /* the table's count is unchanged */
  old->chain_next = 0;
  dirty_append(m, e);
  return e;
}

void *sl_cow_map_put(sl_cow_map *m, const void *key, uint32_t key_bytes,
                     const void *value, uint32_t value_bytes) {
  assert(m);
  assert(key_bytes <= SL_COW_MAX_BYTES && value_bytes <= SL_COW_MAX_BYTES);
  if (key_bytes > SL_COW_MAX_BYTES || value_bytes > SL_COW_MAX_BYTES)
    return 0;
  if (!dirty_slot_ready(m))
    return 0; /* ENOMEM: freeze could not grow the pending array (note 5) */
  write_background(m); /* first: it moves links and turns versions CLEAN */
  uint64_t hash = key_hash(key, key_bytes);
  int table_index;
  sl_cow_entry **link = find_link(m, hash, key, key_bytes, &table_index);
  if (!link)
    return put_new_key(m, hash, key, key_bytes, value, value_bytes);
  sl_cow_entry *old = *link;
  bool writable = old->epoch == m->epoch || old->epoch == 0; /* note 1 */
  if (writable && old->value_bytes == value_bytes) {
    if (old->epoch == 0) {
      old->epoch = m->epoch;
      dirty_append(m, old);
    }
    fill_value(value_area(old), value_bytes, value, value_area(old), value_bytes);
    return value_area(old);
  }
  sl_cow_entry *e = put_new_version(m, link, value, value_bytes);
  if (!e)
    return 0;
  if (old->epoch == 0) {
    entry_free(m, old); /* CLEAN: on no list (note 3) */
  } else {
    if (old->epoch == m->epoch)
      old->superseded = 1; /* CURRENT, so the writer does not see it yet */
    old->retired = 1;
  }
  return value_area(e);
}

int sl_cow_map_delete(sl_cow_map *m, const void *key, uint32_t key_bytes) {
  assert(m);
  assert(key || key_bytes == 0);
  write_background(m);
  int table_index;
  sl_cow_entry **link =
      find_link(m, key_hash(key, key_bytes), key, key_bytes, &table_index);
  if (!link)
    return SL_ENOTFOUND;
  if (!dirty_slot_ready(m))
    return ENOMEM; /* note 5 */
  sl_cow_entry *old = *link;
  if (old->epoch == m->epoch || old->epoch == 0) {
    /* Not frozen: the version itself becomes the tombstone. */
    table_unlink(m, link, table_index);
    if (old->epoch == m->epoch)
      m->dirty_bytes -= old->value_bytes; /* it stays on the list */
    entry_make_tombstone(old);
    if (old->epoch == 0) {
      old->epoch = m->epoch;
      dirty_append(m, old);
    }
    return 0;
  }
  sl_cow_entry *tombstone = entry_new(m, old->hash, old->data, old->key_bytes, 0);
  if (!tombstone)
    return ENOMEM;
  entry_make_tombstone(tombstone);
  table_unlink(m, link, table_index);
  old->retired = 1; /* stays, unchanged otherwise, on its frozen list */
  dirty_append(m, tombstone);
  return 0;
}

int sl_cow_map_load(sl_cow_map *m, const void *key, uint32_t key_bytes,
                    const void *value, uint32_t value_bytes) {
  assert(m);
  assert(key || key_bytes == 0);
  if (key_bytes > SL_COW_MAX_BYTES || value_bytes > SL_COW_MAX_BYTES)
    return EINVAL;
  rehash_step(m);
  uint64_t hash = key_hash(key, key_bytes);
  int table_index;
  if (find_link(m, hash, key, key_bytes, &table_index))
    return EINVAL;
  sl_cow_entry *e = entry_new(m, hash, key, key_bytes, value_bytes);
  if (!e)
    return ENOMEM;
  e->epoch = 0; /* CLEAN: already durable, on no list */
  fill_value(value_area(e), value_bytes, value, 0, 0);
  rehash_start_if_full(m);
  table_insert(m, e);
  return 0;
}

int sl_cow_map_reserve(sl_cow_map *m, uint64_t entries) {
  assert(m);
  if (m->rehashing || sl_cow_map_count(m) != 0)
    return 0; /* only an empty map: nothing to move */
  uint64_t size = INITIAL_BUCKETS;
  while (size < entries && size < (UINT64_C(1) << 40))
    size *= 2;
  if (size <= m->tables[0].size)
    return 0;
  sl_cow_entry **buckets = calloc((size_t)size, sizeof *buckets);
  if (!buckets)
    return ENOMEM;
  m->memory_bytes += (size - m->tables[0].size) * sizeof *buckets;
  free(m->tables[0].buckets);
  m->tables[0].buckets = buckets;
  m->tables[0].size = size;
  assert(sl_cow_map_check(m));
  return 0;
}

/* ------------------------------------------------------------ epochs */

/* Double the pending arrays.  On failure nothing changes (note 5). */
static void pending_grow(sl_cow_map *m) {
  uint32_t capacity = m->pending_capacity * 2;
  assert(capacity > m->pending_capacity);
  sl_cow_delta *deltas = malloc(capacity * sizeof *deltas);
  sl_cow_entry **tails = malloc(capacity * sizeof *tails);
  if (!deltas || !tails) {
    free(deltas);
    free(tails);
    return;
  }
  memcpy(deltas, m->pending, m->pending_count * sizeof *deltas);
  memcpy(tails, m->pending_tails, m->pending_count * sizeof *tails);
  free(m->pending);
  free(m->pending_tails);
  m->pending = deltas;
  m->pending_tails = tails;
  m->memory_bytes += (uint64_t)(capacity - m->pending_capacity) *
                     (sizeof *deltas + sizeof *tails);
  m->pending_capacity = capacity;
}

sl_cow_delta sl_cow_map_freeze(sl_cow_map *m) {
  assert(m);
  assert(m->epoch < UINT32_MAX); /* 4e9 checkpoints: not in this lifetime */
  sl_cow_delta delta = {.epoch = m->epoch,
                        .head = m->dirty_head,
                        .entries = m->dirty_entries,
                        .bytes = m->dirty_bytes};
  if (m->pending_count < m->pending_capacity) {
    m->pending[m->pending_count] = delta;
    m->pending_tails[m->pending_count] = m->dirty_tail;
    m->pending_count++;
  } else {
    assert(!delta.head); /* dirty_slot_ready() kept a slot for it (note 5) */
  }
  m->dirty_head = m->dirty_tail = 0;
  m->dirty_entries = m->dirty_bytes = 0;
  m->epoch++; /* every version of the old epoch is FROZEN from here on */
  if (m->pending_count == m->pending_capacity)
    pending_grow(m);
  return delta;
}

void sl_cow_map_pending(const sl_cow_map *m, const sl_cow_delta **deltas,
                        int *count) {
  assert(m);
  assert(deltas && count);
  *deltas = m->pending;
  *count = (int)m->pending_count;
}

void sl_cow_map_release(sl_cow_map *m, uint32_t epoch) {
  assert(m);
  uint32_t n = 0;
  for (; n < m->pending_count && m->pending[n].epoch <= epoch; n++) {
    const sl_cow_delta *d = &m->pending[n];
    assert((d->head == 0) == (m->pending_tails[n] == 0));
    if (!d->head)
      continue; /* an empty epoch: nothing to reclaim */
    if (m->reclaim_tail)
      m->reclaim_tail->dirty_next = d->head; /* RELEASED: writer is done */
    else
      m->reclaim_head = d->head;
    m->reclaim_tail = m->pending_tails[n];
    m->reclaim_entries += d->entries;
  }
  m->pending_count -= n;
  memmove(m->pending, m->pending + n, m->pending_count * sizeof *m->pending);
  memmove(m->pending_tails, m->pending_tails + n,
          m->pending_count * sizeof *m->pending_tails);
}

bool sl_cow_map_maintain(sl_cow_map *m, uint32_t budget) {
  assert(m);
  return reclaim_steps(m, budget);
}

/* ------------------------------------------------------------ checker */

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "sl_cow_map_check: line %d: %s\n", __LINE__, #cond); \
      return false;                                                        \
    }                                                                      \
  } while (0)

/* Every table entry: in its bucket, live, found by lookup (so no duplicate
 * shadows it), hash right.  Adds live bytes and dirty live entries. */
static bool check_tables(const sl_cow_map *m, uint64_t *bytes,
                         uint64_t *dirty_live) {
  CHECK(m->tables[0].size >= INITIAL_BUCKETS);
  CHECK(m->rehashing == (m->tables[1].size != 0));
  for (int t = 0; t < 2; t++) {
    const cow_table *table = &m->tables[t];
    CHECK((table->size & (table->size - 1)) == 0);
    *bytes += table->size * sizeof *table->buckets;
    uint64_t seen = 0;
    for (uint64_t b = 0; b < table->size; b++) {
      CHECK(t == 1 || !m->rehashing || b >= m->rehash_index || !table->buckets[b]);
      sl_cow_entry *e = table->buckets[b];
      for (; e && seen < table->used; e = e->chain_next, seen++) {
        int found_in = -1;
        CHECK((e->hash & (table->size - 1)) == b);
        CHECK(!e->retired && !e->tombstone && !e->superseded);
        CHECK(e->hash == key_hash(e->data, e->key_bytes));
        CHECK(find_link(m, e->hash, e->data, e->key_bytes, &found_in));
        CHECK(*find_link(m, e->hash, e->data, e->key_bytes, &found_in) == e);
        CHECK(found_in == t);
        CHECK(e->epoch <= m->epoch);
        *bytes += entry_alloc_bytes(e->key_bytes, e->value_bytes);
        *dirty_live += e->epoch != 0;
      }
      CHECK(e == 0);
    }
    CHECK(seen == table->used);
  }
  return true;
}

/* One list: length, tail, bytes (unless expected_bytes is UINT64_MAX),
 * epochs in [epoch_min, epoch_max] and not decreasing, marks consistent,
 * live versions in the table.  Adds retired bytes and live entries. */
static bool check_list(const sl_cow_map *m, const sl_cow_entry *head,
                       const sl_cow_entry *tail, uint64_t entries,
                       uint64_t expected_bytes, uint32_t epoch_min,
                       uint32_t epoch_max, uint64_t *bytes, uint64_t *live) {
  const sl_cow_entry *e = head, *last = 0;
  uint64_t n = 0, list_bytes = 0;
  uint32_t epoch = epoch_min;
  for (; e && n < entries; last = e, e = e->dirty_next, n++) {
    CHECK(e->epoch >= epoch && e->epoch <= epoch_max);
    epoch = e->epoch;
    CHECK(!e->tombstone || (e->retired && e->value_bytes == 0));
    CHECK(!e->superseded || e->retired);
    if (e->retired) {
      *bytes += entry_alloc_bytes(e->key_bytes, entry_capacity(e));
    } else {
      int found_in;
      sl_cow_entry **link = find_link(m, e->hash, e->data, e->key_bytes, &found_in);
      CHECK(link && *link == e);
      (*live)++;
    }
    list_bytes += (uint64_t)e->key_bytes + e->value_bytes;
  }
  CHECK(e == 0);
  CHECK(n == entries);
  CHECK(last == tail);
  CHECK(expected_bytes == UINT64_MAX || list_bytes == expected_bytes);
  return true;
}

bool sl_cow_map_check(const sl_cow_map *m) {
  CHECK(m);
  CHECK(m->epoch >= 1);
  uint64_t bytes = sizeof *m + (uint64_t)m->pending_capacity *
                                   (sizeof *m->pending + sizeof *m->pending_tails);
  uint64_t dirty_live = 0, live_on_lists = 0;
  if (!check_tables(m, &bytes, &dirty_live))
    return false;
  if (!check_list(m, m->dirty_head, m->dirty_tail, m->dirty_entries,
                  m->dirty_bytes, m->epoch, m->epoch, &bytes, &live_on_lists))
    return false;
  CHECK(m->pending_count <= m->pending_capacity);
  uint32_t after = 0; /* pending epochs strictly increase, below current */
  for (uint32_t i = 0; i < m->pending_count; i++) {
    const sl_cow_delta *d = &m->pending[i];
    CHECK(d->epoch > after && d->epoch < m->epoch);
    after = d->epoch;
    if (!check_list(m, d->head, m->pending_tails[i], d->entries, d->bytes,
                    d->epoch, d->epoch, &bytes, &live_on_lists))
      return false;
  }
  uint32_t reclaim_max = m->pending_count ? m->pending[0].epoch - 1 : m->epoch - 1;
  if (!check_list(m, m->reclaim_head, m->reclaim_tail, m->reclaim_entries,
                  UINT64_MAX, 1, reclaim_max, &bytes, &live_on_lists))
    return false;
  /* Every live version of a non-zero epoch is on exactly one list. */
  CHECK(live_on_lists == dirty_live);
  CHECK(bytes == m->memory_bytes);
  return true;
}
