/* cow_map_arena.c — the copy-on-write map's load arena (cow_map.c note 9):
 * the chunks bulk-loaded versions are carved from, and the helper thread
 * that faults those chunks and the bucket table in ahead of the load.
 *
 * NOTES ON THE DESIGN
 *
 * 1. Pre-faulting (sl_cow_map_load_prefault).  A large restore spends
 *    most of its time in the kernel, zeroing the fresh pages of the table
 *    and the chunks on their first touch (prefault.h note 1).  With a
 *    helper (storage/prefault.h) attached, the load keeps ARENA_SPARES
 *    chunks allocated ahead of the one it carves and posts each to the
 *    helper as a spare; when the carving chunk is full the oldest spare
 *    becomes the next one (faulted in by then, or partly, or not: the
 *    load never waits) and a new spare is allocated and posted.  Spares
 *    are allocations the map holds but has not counted yet: they enter
 *    memory_bytes and the chunk list (note 7 of cow_map.c) only when
 *    taken, so the checker sees no difference.  The number ahead is
 *    bounded by what the announced entries can fill (ARENA_SPARES).
 * 2. The bucket table is written at random from the first entry on, so
 *    it is faulted in before the load starts: its upper half by the
 *    helper, its lower half by the loading thread meanwhile.
 * 3. sl_cow_map_load_finish stops the helper (joins it: no populate runs
 *    after that, prefault.h note 4) before it frees the spares not taken
 *    (cow_arena_spares_drop), and forgets it; the caller destroys it.
 *    Nothing here depends on the helper having done anything: without
 *    it, or when its kernel cannot populate, the load touches the pages
 *    itself as before.
 */
#include <assert.h>
#include <stdint.h>

#include "alloc.h"
#include "cow_map_internal.h"
#include "prefault.h"

/* Chunks allocated ahead of the carving one (note 1): 32 MiB at most,
 * and no more than the entries announced can fill, counting every version
 * at the smallest size (header and an 8-byte value area): a small load
 * is not handed 32 MiB it will never use. */
#define ARENA_SPARES 8u
#define ARENA_VERSION_MIN_BYTES (sizeof(sl_cow_entry) + 8u)

_Static_assert(ARENA_SPARES < SL_PREFAULT_REGIONS,
               "the table's half and every spare fit the helper's queue");

/* Allocate one chunk ahead and post it to the helper (note 1); nothing
 * if the allocation or the post fails (the load then allocates as it
 * goes). */
static void arena_spare_add(sl_cow_map *m) {
  void *c = sl_alloc_aligned(&m->alloc, ARENA_CHUNK_BYTES, ARENA_CHUNK_BYTES);
  if (!c)
    return;
  if (!sl_prefault_post_spare(m->load_prefault, c, ARENA_CHUNK_BYTES)) {
    sl_alloc_free_aligned(&m->alloc, c, ARENA_CHUNK_BYTES, ARENA_CHUNK_BYTES);
    return;
  }
  m->load_spares++;
}

/* Make a new, empty chunk the one loads carve from (the previous one stays
 * until its versions are freed): the oldest spare if there is one (note
 * 1).  false on ENOMEM, nothing changed. */
bool cow_arena_chunk_new(sl_cow_map *m) {
  /* Aligned to its size, so chunk_of() finds it from any version in it. */
  arena_chunk *c = sl_prefault_take(m->load_prefault);
  bool counted = false;
  if (c) {
    assert(m->load_spares > 0);
    m->load_spares--;
    if (m->load_spares < m->load_spares_max)
      arena_spare_add(m); /* one taken, one more ahead */
  } else if (m->arena_spare) { /* cow_map.c note 16: in cache, faulted in */
    c = m->arena_spare;
    m->arena_spare = 0;
    counted = true;
  } else {
    c = sl_alloc_aligned(&m->alloc, ARENA_CHUNK_BYTES, ARENA_CHUNK_BYTES);
  }
  if (!c)
    return false;
  c->prev = 0;
  c->next = m->arena_chunks;
  c->owner = m;
  c->used_bytes = sizeof *c;
  c->versions = 0;
  if (m->arena_chunks)
    m->arena_chunks->prev = c;
  m->arena_chunks = c;
  m->arena_carving = c;
  m->arena_chunk_count++;
  if (!counted)
    m->memory_bytes += ARENA_CHUNK_BYTES; /* the chunk, whole (note 7) */
  return true;
}

void cow_arena_chunk_free(sl_cow_map *m, arena_chunk *c) {
  assert(m->arena_chunk_count > 0);
  if (c->prev)
    c->prev->next = c->next;
  else
    m->arena_chunks = c->next;
  if (c->next)
    c->next->prev = c->prev;
  if (m->arena_carving == c)
    m->arena_carving = 0; /* the next load starts a new chunk */
  m->arena_chunk_count--;
  if (!m->arena_spare && !m->loading) {
    m->arena_spare = c; /* cow_map.c note 16: for the next chunk */
    return;
  }
  assert(m->memory_bytes >= ARENA_CHUNK_BYTES);
  m->memory_bytes -= ARENA_CHUNK_BYTES;
  sl_alloc_free_aligned(&m->alloc, c, ARENA_CHUNK_BYTES, ARENA_CHUNK_BYTES);
}

void sl_cow_map_load_prefault(sl_cow_map *m, struct sl_prefault *helper,
                              uint64_t entries) {
  assert(m);
  assert(!m->loading && !m->load_prefault && m->load_spares == 0);
  if (!helper)
    return;
  m->load_prefault = helper;
  m->load_spares_max = ARENA_SPARES;
  if (entries / (ARENA_CHUNK_BYTES / ARENA_VERSION_MIN_BYTES) < ARENA_SPARES)
    m->load_spares_max =
        (uint32_t)(entries / (ARENA_CHUNK_BYTES / ARENA_VERSION_MIN_BYTES)) + 1;
  /* Note 2: the table, half there and half here, before any entry. */
  uint8_t *table = (uint8_t *)m->tables[0].buckets;
  size_t bytes = (size_t)m->tables[0].size * sizeof *m->tables[0].buckets;
  (void)sl_prefault_post(helper, table + bytes / 2, bytes - bytes / 2);
  for (uint32_t i = 0; i < m->load_spares_max; i++)
    arena_spare_add(m);
  sl_prefault_populate(table, bytes / 2);
}

void cow_arena_spares_drop(sl_cow_map *m) {
  sl_prefault_stop(m->load_prefault); /* note 3: before any free */
  for (void *c; (c = sl_prefault_take(m->load_prefault)) != 0;) {
    assert(m->load_spares > 0);
    m->load_spares--;
    sl_alloc_free_aligned(&m->alloc, c, ARENA_CHUNK_BYTES, ARENA_CHUNK_BYTES);
  }
  assert(m->load_spares == 0);
  m->load_prefault = 0;
}
