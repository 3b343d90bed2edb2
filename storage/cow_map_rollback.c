/* cow_map_rollback.c — rolling an instance's copy-on-write map back in
 * memory to the state of its last released epoch (cow_map.h note 10,
 * cow_map.c note 12), at a cost in the writes since that epoch.
 *
 * NOTES ON THE DESIGN OF THE ROLLBACK
 *
 * 1. Two passes, each over versions written or displaced since the stable
 *    epoch S, never over the state: first the lists of the epochs after S
 *    (the current dirty list and every pending one) are dropped: live
 *    versions leave the table, and all are freed except those still on
 *    the undo list; then the undo list is walked once: a version of epoch
 *    <= S is the key's version in the stable state and goes back into the
 *    table, any other is freed.  The drop comes first so that no key is
 *    ever in the table twice.
 * 2. Both passes are pointer chases whose cost is cache misses once the
 *    state outgrows the cache: the next version of a list, its bucket,
 *    and the head of that bucket's chain, each a miss on a random line.
 *    So each pass keeps a ring of ROLLBACK_WINDOW versions read from the
 *    list but not yet handled: a version's bucket is prefetched when it
 *    enters the ring, the chain head that bucket points to half way
 *    through it, and the version is unlinked or linked when it leaves.
 *    Up to that many misses are then in flight instead of one (the same
 *    idea as the bulk load, cow_map.c note 10).  The walk itself reads a
 *    version's list link as it enters the ring, before the version is
 *    freed or linked (which rewrites chain_next).
 * 3. Counted for tests: the versions both passes handled, so a test can
 *    check that a rollback's work follows the writes since S, whatever
 *    the size of the state (sl_cow_map_rollback_visits).
 * 4. The undo list's index.  Following a list is a chase: each link is a
 *    miss the walk must wait for before it knows the next address, and
 *    the ring of note 2 cannot help the walk itself.  The undo list links
 *    old versions scattered over the state, and walking it was 86% of a
 *    rollback at 1M keys (about 200 ns a version).  So the map keeps the
 *    undo list's versions also in an array, by append number, in blocks
 *    of the dirty index's kind (one store per displacement, 8 bytes a
 *    version while it is on the undo list; blocks wholly released are
 *    freed at release, cow_map.c), and the restore pass reads it front to
 *    back, fetching each version ROLLBACK_AHEAD before it enters the ring.
 *    Without it (a block could not be had) the pass follows the list, as
 *    before.  Either way the undo list is empty afterwards, and so is its
 *    index.  The drop pass follows its lists: their versions were written
 *    recently, mostly in allocation order, and reading the dirty lists'
 *    indexes instead was measured no faster.
 */
#include <errno.h>
#include <stdint.h>

#include "cow_map_internal.h"

/* Versions in flight in a pass (note 2): enough to cover a miss with the
 * walk's own work, few enough to stay in registers and L1. */
#define ROLLBACK_WINDOW 16u
_Static_assert((ROLLBACK_WINDOW & (ROLLBACK_WINDOW - 1)) == 0 &&
                   ROLLBACK_WINDOW >= 2,
               "the ring is indexed with a mask, its middle is used");

/* How far ahead of the ring the indexed restore pass fetches versions
 * (note 4): a ring's worth, so a version is in cache when it enters. */
#define ROLLBACK_AHEAD ROLLBACK_WINDOW

/* The ring of one pass (note 2). */
typedef struct rollback_ring {
  sl_cow_entry *versions[ROLLBACK_WINDOW];
  uint32_t first; /* the oldest, handled next */
  uint32_t count;
} rollback_ring;

/* The slot of table t where e's key lives. */
static sl_cow_entry **bucket_of(const sl_cow_map *m, int t,
                                const sl_cow_entry *e) {
  const cow_table *table = &m->tables[t];
  assert(table->size > 0);
  return &table->buckets[e->hash & (table->size - 1)];
}

/* Put e in the ring and prefetch what handling it reads (note 2); unlink:
 * the drop pass (reads the chain of e's bucket), or the restore pass
 * (writes the bucket table_insert() will use).  The prefetches are written
 * here and not in a helper of their own: GCC drops calls of a function
 * that does nothing but prefetch (cow_map.c, load_enqueue). */
static void ring_push(const sl_cow_map *m, rollback_ring *ring,
                      sl_cow_entry *e, bool unlink) {
  assert(ring->count < ROLLBACK_WINDOW);
  uint32_t mask = ROLLBACK_WINDOW - 1;
  ring->versions[(ring->first + ring->count) & mask] = e;
  ring->count++;
  if (!unlink) {
    PREFETCH(bucket_of(m, m->rehashing ? 1 : 0, e), 1);
    return;
  }
  if (e->retired != RETIRED_NOT)
    return; /* out of the table: no bucket to read */
  PREFETCH(bucket_of(m, 0, e), 1);
  if (m->rehashing)
    PREFETCH(bucket_of(m, 1, e), 1);
  uint32_t half = ROLLBACK_WINDOW / 2;
  if (ring->count <= half)
    return;
  /* Half way: the bucket of the version pushed that long ago is in cache
   * by now; the chain head it points to is what the unlink reads next. */
  const sl_cow_entry *waiting =
      ring->versions[(ring->first + ring->count - 1 - half) & mask];
  if (waiting->retired != RETIRED_NOT)
    return;
  const sl_cow_entry *head = *bucket_of(m, 0, waiting);
  if (head && head != waiting)
    PREFETCH(&head->hash, 0);
}

static sl_cow_entry *ring_pop(rollback_ring *ring) {
  assert(ring->count > 0);
  sl_cow_entry *e = ring->versions[ring->first];
  ring->first = (ring->first + 1) & (ROLLBACK_WINDOW - 1);
  ring->count--;
  return e;
}

/* The drop pass's work on one version of an epoch after the stable one:
 * a live one leaves the table; an undo one (displaced in turn, still on
 * the undo list) is left to the restore pass; the others are freed. */
static void drop_version(sl_cow_map *m, sl_cow_entry *e) {
  assert(e->epoch > m->stable_epoch);
  if (e->retired == RETIRED_UNDO)
    return; /* freed by restore_undo() */
  if (e->retired == RETIRED_NOT) {
    int table_index;
    sl_cow_entry **link = cow_map_find_version(m, e, &table_index);
    assert(link && *link == e);
    cow_map_unlink(m, link, table_index);
  }
  cow_map_free_version(m, e);
}

/* Drop every version of one list of an epoch after the stable one.
 * bound: the list's length. */
static void drop_list(sl_cow_map *m, sl_cow_entry *e, uint64_t bound) {
  rollback_ring ring = {.count = 0};
  for (uint64_t i = 0; e && i < bound; i++) {
    sl_cow_entry *next = e->dirty_next; /* read before e is freed */
    if (ring.count == ROLLBACK_WINDOW)
      drop_version(m, ring_pop(&ring));
    ring_push(m, &ring, e, true);
    m->rollback_visits++;
    e = next;
  }
  assert(e == 0);
  while (ring.count > 0)
    drop_version(m, ring_pop(&ring));
}

/* The restore pass's work on one version of the undo list. */
static void restore_version(sl_cow_map *m, sl_cow_entry *u) {
  assert(u->retired == RETIRED_UNDO);
  if (u->epoch > m->stable_epoch) {
    cow_map_free_version(m, u); /* its list was dropped: note 1 */
    return;
  }
  /* CLEAN, or RELEASED and still on the reclaim chain, which then turns
   * it CLEAN like any live version. */
  u->retired = RETIRED_NOT;
  u->chain_next = 0;
  cow_map_link(m, u);
}

/* The undo list's versions through its index (note 4): append numbers
 * undo_releasable .. undo_pushed - 1, each fetched ROLLBACK_AHEAD before
 * it enters the ring. */
static void restore_indexed(sl_cow_map *m, rollback_ring *ring) {
  const sl_cow_index_block *block = m->undo_index_head;
  assert(block && m->undo_index_base <= m->undo_releasable);
  uint64_t skip = m->undo_releasable - m->undo_index_base;
  uint64_t left = m->undo_pushed - m->undo_releasable;
  for (; block && left > 0; block = block->next) {
    assert(skip <= block->count);
    uint64_t first = skip, end = block->count;
    skip = 0;
    if (end - first > left)
      end = first + left;
    for (uint64_t k = first; k < end && k < first + ROLLBACK_AHEAD; k++)
      PREFETCH(&block->versions[k]->hash, 1);
    for (uint64_t k = first; k < end; k++) {
      if (k + ROLLBACK_AHEAD < end)
        PREFETCH(&block->versions[k + ROLLBACK_AHEAD]->hash, 1);
      sl_cow_entry *u = block->versions[k];
      if (ring->count == ROLLBACK_WINDOW)
        restore_version(m, ring_pop(ring));
      ring_push(m, ring, u, false);
      m->rollback_visits++;
    }
    left -= end - first;
  }
  assert(left == 0);
}

/* Walk the undo list: the versions displaced after the stable epoch (the
 * others wait on the obsolete list, not walked).  Each that belongs to the
 * stable state (epoch at most the stable one) is the key's version in it
 * (cow_map.c note 12) and goes back into the table; the others are freed.
 * Bounded: each version is on the undo list once.  The list is empty
 * afterwards, with its pending marks and its index. */
static void restore_undo(sl_cow_map *m) {
  rollback_ring ring = {.count = 0};
  if (m->undo_pushed > m->undo_releasable && !m->undo_index_dropped) {
    restore_indexed(m, &ring);
  } else {
    sl_cow_entry *u = m->undo_head;
    for (uint64_t n = m->undo_releasable; u && n < m->undo_pushed; n++) {
      sl_cow_entry *next = u->chain_next; /* read before u is linked */
      if (ring.count == ROLLBACK_WINDOW)
        restore_version(m, ring_pop(&ring));
      ring_push(m, &ring, u, false);
      m->rollback_visits++;
      u = next;
    }
    assert(u == 0);
  }
  while (ring.count > 0)
    restore_version(m, ring_pop(&ring));
  m->undo_head = m->undo_tail = 0;
  m->undo_pushed = m->undo_releasable;
  cow_map_undo_index_clear(m);
}

int sl_cow_map_rollback(sl_cow_map *m, uint32_t epoch) {
  assert(m);
  if (!m->retain || m->loading || epoch != m->stable_epoch)
    return EINVAL;
  /* Note 1.  Every pending epoch is after the stable one (released ones
   * are not pending), and so is the current one. */
  drop_list(m, m->dirty_head, m->dirty_entries);
  cow_map_free_index(m, m->index_head, m->dirty_entries);
  m->dirty_head = m->dirty_tail = 0;
  m->index_head = m->index_tail = 0;
  m->index_dropped = false;
  m->dirty_entries = m->dirty_bytes = 0;
  for (uint32_t i = 0; i < m->pending_count; i++) {
    drop_list(m, m->pending[i].head, m->pending[i].entries);
    cow_map_free_index(m, m->pending[i].index, m->pending[i].entries);
  }
  m->pending_count = 0;
  /* Only now, with the newer versions out of the table, can the stable
   * ones go back without a key appearing twice. */
  restore_undo(m);
  m->rollbacks++;
  assert(sl_cow_map_check(m));
  return 0;
}

uint64_t sl_cow_map_rollback_visits(const sl_cow_map *m) {
  assert(m);
  return m->rollback_visits;
}
