/* cow_map_rollback.c — rolling an instance's copy-on-write map back in
 * memory to the state of its last released epoch (cow_map.h note 10,
 * cow_map.c note 12): lazily, in O(number of lists) and the rest on
 * first touch and in bounded steps (notes 5-7), or, when keys were
 * deleted since that epoch, at once at a cost in the writes since
 * (notes 1-4).
 *
 * NOTES ON THE DESIGN OF THE ROLLBACK
 *
 * 1. One pass over the undo list, in place, and the rest deferred.  The
 *    undo list holds, for every key written since the stable epoch S that
 *    had a version at S, that version (cow_map.c note 12).  Each undo
 *    version of epoch <= S takes its key's place in the table: it
 *    replaces the key's live version in that version's chain slot, which
 *    is marked RETIRED_FREE, or (the key was deleted since S) goes into
 *    its bucket; an undo version of a later epoch is left alone (it is on
 *    the list of its epoch, see below).  The table then holds the state
 *    at S plus the keys inserted since S that had no version at S.  Those
 *    are counted, not searched: the map knows how many keys were live at
 *    S (stable_live_keys, cow_map.c note 12), and only if the table holds
 *    more does a second pass walk the lists of the epochs after S (the
 *    current dirty list and every pending one) to unlink the versions
 *    still live there (every live version of an epoch after S is on its
 *    epoch's list, and after the first pass only the inserted keys' are
 *    live).  Last, those lists, whose versions are all out of the table
 *    now, are joined whole, in O(number of lists), onto the dropped list,
 *    which the owner's writes free in bounded steps as they free the
 *    reclaim chain (cow_map.c note 8).  Freeing them here was a third of a
 *    rollback at 1M keys (measured with the free left out: 14.3 against
 *    20.5 ms for 380K versions), and unlinking every version of the lists
 *    another half: a job whose keys all exist at S (the common case:
 *    counts, aggregates over a fixed key set) now pays one lookup per key
 *    written since S and nothing per version of the failed epochs.
 * 2. The passes are pointer chases whose cost is cache misses once the
 *    state outgrows the cache: the next version, its bucket, and the
 *    head of that bucket's chain, each a miss on a random line.  So each
 *    pass keeps a ring of ROLLBACK_WINDOW versions read but not yet
 *    handled: a version's bucket is prefetched when it enters the ring,
 *    the chain head that bucket points to half way through it, and the
 *    version is handled when it leaves.  Up to that many misses are then
 *    in flight instead of one (the same idea as the bulk load, cow_map.c
 *    note 10).  A list walk reads a version's link as it enters the ring,
 *    before handling rewrites chain_next.
 * 3. Counted for tests: the versions the passes handled, so a test can
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
 *    freed at release, cow_map.c), and the first pass reads it front to
 *    back, fetching each version ROLLBACK_AHEAD before it enters the ring.
 *    Without it (a block could not be had) the pass follows the list, as
 *    before.  Either way the undo list is empty afterwards, and so is its
 *    index.  The unlink pass follows its lists: their versions were
 *    written recently, mostly in allocation order, and reading the dirty
 *    lists' indexes instead was measured no faster.
 * 5. The lazy rollback.  Notes 1-4 still cost a lookup per key written
 *    since S, each a few cache misses: at 1M keys and a checkpoint every
 *    100 ms, 200-250K keys, 60-80% of a failover's time to first record.
 *    So when it can, the rollback only marks what to undo and leaves the
 *    undoing to the first touch of each key.  It closes the failed epochs
 *    (S, F], F the current one, as a range (stale_base, stale_span) and
 *    starts epoch F + 1 for the writes to come; a version in the table
 *    whose epoch is in the range is stale.  Every lookup, put, update and
 *    delete that lands on a stale version settles it first
 *    (cow_map_settle): the key's version at S takes its slot, or, for a
 *    key inserted after S, the key leaves the table.  The version at S is
 *    found in O(failed epochs) through sl_cow_entry.displaced: each
 *    version written with rollback on names the version whose table
 *    slot it took, skipping versions of its own epoch (superseded in
 *    place of it), so from a stale version the chain goes down one
 *    version per failed epoch that wrote the key, to the first of epoch
 *    <= S or to none.  It names it by number, not by pointer: the
 *    displaced version went onto the undo list, whose index (note 4) has
 *    it at its append number, and the rollback keeps that index (the
 *    lazy index, with an array of its blocks to find a number in O(1)).
 *    32 bits of number, and 32 of hash instead of 64, fit where the hash
 *    was: a pointer would have made the 40-byte header 48, and the usual
 *    version (16-byte key, 8-byte value) 72 bytes, in jemalloc's 80-byte
 *    class instead of 64 (memory_bench: 16 bytes more per entry, over
 *    its target).  Without an index (a block could not be allocated) the
 *    rollback is not lazy.  Versions of epoch <= S that a write after S
 *    displaced are kept (the undo list, cow_map.c note 12) until that
 *    write's epoch is released, which a failed epoch never is, so the
 *    chain's end is alive.  The check costs one compare of an epoch the
 *    lookup has in cache already (the header's line, read to compare the
 *    hash); with no rollback under way stale_span is 0 and it never
 *    holds.
 *    A key deleted after S has no version in the table to trip on, so a
 *    rollback over an epoch that wrote a tombstone (each pending slot
 *    counts them) is done at once, as notes 1-4 say.  So is one with no
 *    write since S (there is nothing to defer).
 * 6. The rest, in bounded steps.  The failed epochs' lists are joined,
 *    newest epoch first, onto the lazy list, in O(number of lists); each
 *    write and sl_cow_map_maintain() step takes versions off it
 *    (cow_map_lazy_steps): a live one is settled, then each is freed.
 *    Newest first matters: a stale version's chain runs through versions
 *    of older failed epochs only, so when the walk frees a version of
 *    epoch E, every version whose chain could reach it (epochs above E)
 *    has been settled already.  When the list is empty the range closes
 *    (stale_span 0).  The versions of epoch <= S that wait to go back are
 *    on no list meanwhile: the undo list is emptied as in note 1, they
 *    are reached only from the stale versions' chains (each from exactly
 *    one: a key has one live version), and the reclaim walk leaves
 *    RETIRED_UNDO versions alone.  The map's key count stays exact: the
 *    rollback knows how many keys the table holds beyond the stable
 *    state's (lazy_inserted, the keys inserted after S, since none was
 *    deleted) and each unlink counts one down.
 * 7. What cannot wait.  Whatever reads the table as a whole finishes the
 *    lazy rollback first (cow_map_lazy_finish): sl_cow_map_foreach() (the
 *    timer restore scan of engine/timer.c is its one caller in the
 *    engine), a second rollback (which then rolls back what came after
 *    this one, from a plain map), and destroy's walk of a map without an
 *    arena of its own.  A freeze need not: the writer reads the frozen
 *    lists, never the table, and stale versions are on no list it will
 *    read (their lists left with the rollback); the first write after the
 *    rollback to a stale key settles it before it writes, so the frozen
 *    delta holds only writes of epoch F + 1 on, which apply to the store's
 *    state at S as after an eager rollback.  A release need not either:
 *    the range stays (S, F] whatever the stable epoch becomes.  The
 *    checker knows the lazy state (cow_map_check.c).
 * 8. The lazy walk fetches ahead.  Settling a version the walk reaches
 *    reads its bucket, its chain and its version at S, three lines on
 *    random addresses once the state outgrows the cache; one after
 *    another they made the steps 4-5x the CPU of notes 1-4's rollback
 *    (cow_rollback_bench, 1M keys, 100K changes: about 30 ms against 6-7
 *    ms for the rollback and its frees; perf: most of it in the load of
 *    the version at S).  The failed lists were written recently, mostly
 *    in allocation order, so following them is cheap; two cursors run
 *    ahead of the walk on the list, LAZY_AHEAD and LAZY_AHEAD / 2
 *    versions on: the far one fetches each live version's bucket and
 *    version at S, the middle one the chain head its bucket points to
 *    (as note 2's ring, without the ring: the list is its own queue).
 * 9. The fallbacks are tested.  Two allocations here may fail without
 *    failing anything (cow_map.c has two more: the arrays of waiting
 *    marks, note 15, and the dirty list's index blocks, note 11 of
 *    cow_map.h): a block of the undo list's index (note 4: the
 *    index is dropped until the undo list is empty again, and a rollback
 *    meanwhile follows the list and is not lazy, note 5) and the lazy
 *    rollback's array of the index's blocks (lazy_index_take: the map
 *    unaltered, the rollback is done at once, notes 1-4).  Running out of
 *    memory is no way to reach them, so sl_cow_map_test_fail_alloc()
 *    makes the nth allocation at any of these points fail, once, per map:
 *    a countdown, as SQLite's test_vfs counts down to a failing call, and
 *    as the store's fault layer (store.h) does for LMDB.  Unarmed, a
 *    point costs a call and a compare (cow_test_alloc_fails), once per
 *    index block, rollback or growth of an array: never on a lookup's
 *    path, and on a write's only where it allocates anyway.  The call is
 *    out of line so that the code around those allocations compiles as
 *    without it (inline, it cost the append of every displaced version
 *    to the undo index a register move).  Tests:
 *    tests/test_cow_map_lazy_rollback.c (these two),
 *    tests/test_cow_map_marks.c and tests/test_cow_map_index.c.
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
  bool lookup[ROLLBACK_WINDOW]; /* whether handling it reads its chain */
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

/* Put e in the ring and, if handling it looks its key up (lookup), prefetch
 * what that reads (note 2): its bucket in each table now, and the chain
 * head of the version pushed half a ring ago.  The prefetches are written
 * here and not in a helper of their own: GCC drops calls of a function
 * that does nothing but prefetch (cow_map.c, load_enqueue). */
static void ring_push(const sl_cow_map *m, rollback_ring *ring,
                      sl_cow_entry *e, bool lookup) {
  assert(ring->count < ROLLBACK_WINDOW);
  uint32_t mask = ROLLBACK_WINDOW - 1;
  ring->versions[(ring->first + ring->count) & mask] = e;
  ring->lookup[(ring->first + ring->count) & mask] = lookup;
  ring->count++;
  if (lookup) {
    PREFETCH(bucket_of(m, 0, e), 1);
    if (m->rehashing)
      PREFETCH(bucket_of(m, 1, e), 1);
  }
  uint32_t half = ROLLBACK_WINDOW / 2;
  if (ring->count <= half)
    return;
  /* Half way: the bucket of the version pushed that long ago is in cache
   * by now; the chain head it points to is what its lookup reads next. */
  uint32_t at = (ring->first + ring->count - 1 - half) & mask;
  if (!ring->lookup[at])
    return;
  const sl_cow_entry *head = *bucket_of(m, 0, ring->versions[at]);
  if (head)
    PREFETCH(&head->hash, 1);
}

static sl_cow_entry *ring_pop(rollback_ring *ring) {
  assert(ring->count > 0);
  sl_cow_entry *e = ring->versions[ring->first];
  ring->first = (ring->first + 1) & (ROLLBACK_WINDOW - 1);
  ring->count--;
  return e;
}

/* The live count of both tables: keys in the map. */
static uint64_t live_keys(const sl_cow_map *m) {
  return m->tables[0].used + m->tables[1].used;
}

/* ------------------------------------------------------------ first pass */

/* Whether undo version u is its key's version at the stable epoch (and
 * so goes back into the table): note 1. */
static bool stable_version(const sl_cow_map *m, const sl_cow_entry *u) {
  assert(u->retired == RETIRED_UNDO);
  return u->epoch <= m->stable_epoch;
}

/* The first pass's work on one undo version (note 1): one of the stable
 * state takes its key's place in the table, in the chain slot of the
 * key's live version if there is one (then marked RETIRED_FREE, freed
 * with the dropped list), else in its bucket; one of a later epoch stays
 * as it is, on its epoch's list. */
static void restore_version(sl_cow_map *m, sl_cow_entry *u) {
  if (!stable_version(m, u))
    return;
  /* CLEAN, or RELEASED and still on the reclaim chain, which then turns
   * it CLEAN like any live version. */
  u->retired = RETIRED_NOT;
  int table_index;
  sl_cow_entry **link = cow_map_find_version(m, u, &table_index);
  if (!link) {
    u->chain_next = 0;
    cow_map_link(m, u); /* deleted since S */
    return;
  }
  sl_cow_entry *newer = *link;
  assert(newer != u && newer->epoch > m->stable_epoch);
  assert(newer->retired == RETIRED_NOT);
  u->chain_next = newer->chain_next;
  *link = u; /* same key, same bucket, same table: the count stays */
  newer->chain_next = 0;
  newer->retired = RETIRED_FREE;
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
      ring_push(m, ring, u, stable_version(m, u));
      m->rollback_visits++;
    }
    left -= end - first;
  }
  assert(left == 0);
}

/* The first pass (note 1) over the undo list: the versions displaced
 * after the stable epoch (the others wait on the obsolete list, not
 * walked).  Bounded: each version is on the undo list once.  The list is
 * empty afterwards, with its pending marks and its index. */
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
      ring_push(m, &ring, u, stable_version(m, u));
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

/* ------------------------------------------------- unlink pass, drop */

/* The unlink pass's work on one version of an epoch after the stable
 * one: a live one (its key was inserted since S) leaves the table and is
 * marked for the dropped list; the others are out of it already. */
static void unlink_version(sl_cow_map *m, sl_cow_entry *e) {
  assert(e->epoch > m->stable_epoch);
  if (e->retired != RETIRED_NOT)
    return;
  int table_index;
  sl_cow_entry **link = cow_map_find_version(m, e, &table_index);
  assert(link && *link == e);
  cow_map_unlink(m, link, table_index);
  e->retired = RETIRED_FREE;
}

/* Unlink the live versions of one list of an epoch after the stable one
 * (note 1).  bound: the list's length. */
static void unlink_list(sl_cow_map *m, sl_cow_entry *e, uint64_t bound) {
  rollback_ring ring = {.count = 0};
  for (uint64_t i = 0; e && i < bound; i++) {
    if (ring.count == ROLLBACK_WINDOW)
      unlink_version(m, ring_pop(&ring));
    ring_push(m, &ring, e, e->retired == RETIRED_NOT);
    m->rollback_visits++;
    e = e->dirty_next; /* unlinking leaves dirty_next as it is */
  }
  assert(e == 0);
  while (ring.count > 0)
    unlink_version(m, ring_pop(&ring));
}

/* Join the list head .. tail of `entries` versions, whole, onto the end
 * of the list onto_head .. onto_tail (onto_entries long), in O(1), and
 * free the joined list's index, which nothing reads any more: the
 * rollback's one way of handing a failed epoch's list on, to the dropped
 * list (note 1) or the lazy list (note 6).  Both are chained through
 * dirty_next like the epoch lists, so the versions need no visit. */
static void join_list(sl_cow_map *m, sl_cow_entry **onto_head,
                      sl_cow_entry **onto_tail, uint64_t *onto_entries,
                      sl_cow_entry *head, sl_cow_entry *tail,
                      uint64_t entries, const sl_cow_index_block *index) {
  cow_map_free_index(m, index, entries);
  if (!head)
    return;
  assert(tail && !tail->dirty_next);
  if (*onto_tail)
    (*onto_tail)->dirty_next = head;
  else
    *onto_head = head;
  *onto_tail = tail;
  *onto_entries += entries;
}

/* Join one list of an epoch after the stable one, every version out of
 * the table by now, onto the dropped list (note 1). */
static void drop_list(sl_cow_map *m, sl_cow_entry *head, sl_cow_entry *tail,
                      uint64_t entries, const sl_cow_index_block *index) {
  join_list(m, &m->dropped_head, &m->dropped_tail, &m->dropped_entries, head,
            tail, entries, index);
}

/* ------------------------------------------------------- lazy rollback */

/* Whether the epochs after the stable one wrote anything, and whether
 * one of them deleted a key (note 5). */
static bool failed_writes(const sl_cow_map *m, bool *deleted) {
  bool wrote = m->dirty_entries > 0;
  *deleted = m->dirty_deletes > 0;
  for (uint32_t i = 0; i < m->pending_count; i++) {
    wrote |= m->pending[i].entries > 0;
    *deleted |= m->pending_tails[i].deletes > 0;
  }
  return wrote;
}

/* Join one failed epoch's list onto the end of the lazy list (note 6). */
static void lazy_append(sl_cow_map *m, sl_cow_entry *head, sl_cow_entry *tail,
                        uint64_t entries, const sl_cow_index_block *index) {
  join_list(m, &m->lazy_head, &m->lazy_tail, &m->lazy_entries, head, tail,
            entries, index);
}

/* Note 5: keep the undo list's index to resolve displaced numbers, with
 * its blocks by position.  False (nothing changed) if the index was
 * dropped or the positions cannot be allocated: then the rollback is not
 * lazy. */
static bool lazy_index_take(sl_cow_map *m) {
  if (m->undo_index_dropped)
    return false;
  uint64_t blocks = 0;
  for (const sl_cow_index_block *b = m->undo_index_head; b; b = b->next)
    blocks++; /* bounded: the index's blocks, each allocated once */
  sl_cow_index_block **at = 0;
  if (blocks > 0) {
    at = cow_test_alloc_fails(m, SL_COW_FAIL_LAZY_BLOCKS)
             ? 0
             : sl_alloc_bytes(&m->alloc, (size_t)blocks * sizeof *at);
    if (!at)
      return false;
    m->memory_bytes += blocks * sizeof *at;
    uint64_t i = 0;
    for (sl_cow_index_block *b = m->undo_index_head; b; b = b->next)
      at[i++] = b;
  }
  m->lazy_index = m->undo_index_head;
  m->lazy_blocks = at;
  m->lazy_block_count = blocks;
  m->lazy_index_base = m->undo_index_base;
  m->lazy_index_end = m->undo_pushed;
  m->undo_index_head = m->undo_index_tail = 0; /* the lazy rollback's now */
  return true;
}

/* Note 6: the lazy rollback is over; free the index it kept. */
static void lazy_index_free(sl_cow_map *m) {
  sl_cow_index_block *b = m->lazy_index;
  for (uint64_t i = 0; b && i < m->lazy_block_count; i++) {
    sl_cow_index_block *next = b->next;
    assert(m->memory_bytes >= sizeof *b);
    m->memory_bytes -= sizeof *b;
    sl_alloc_free(&m->alloc, b, sizeof *b);
    b = next;
  }
  assert(b == 0);
  if (m->lazy_blocks) {
    uint64_t bytes = m->lazy_block_count * sizeof *m->lazy_blocks;
    assert(m->memory_bytes >= bytes);
    m->memory_bytes -= bytes;
    sl_alloc_free(&m->alloc, m->lazy_blocks, (size_t)bytes);
  }
  m->lazy_index = 0;
  m->lazy_blocks = 0;
  m->lazy_block_count = 0;
  m->lazy_index_base = m->lazy_index_end = 0;
}

/* Note 5: the rollback itself, O(number of lists and index blocks).
 * False, the map unaltered, if it cannot be lazy (lazy_index_take). */
static bool rollback_lazily(sl_cow_map *m) {
  assert(!m->lazy_head && m->stale_span == 0 && m->lazy_inserted == 0);
  assert(m->epoch > m->stable_epoch && m->epoch < UINT32_MAX);
  if (!lazy_index_take(m))
    return false;
  /* No key was deleted since S, so the table holds every key of S and
   * the ones inserted since (note 6). */
  assert(live_keys(m) >= m->stable_live_keys);
  m->lazy_inserted = live_keys(m) - m->stable_live_keys;
  /* Newest epoch first (note 6): the current list, then the pending ones
   * from the newest. */
  lazy_append(m, m->dirty_head, m->dirty_tail, m->dirty_entries,
              m->index_head);
  for (uint32_t i = m->pending_count; i-- > 0;)
    lazy_append(m, m->pending[i].head, m->pending_tails[i].last,
                m->pending[i].entries, m->pending[i].index);
  m->dirty_head = m->dirty_tail = 0;
  m->index_head = m->index_tail = 0;
  m->index_dropped = false;
  m->dirty_entries = m->dirty_bytes = m->dirty_deletes = 0;
  m->pending_count = 0;
  /* The undo list's versions of epoch <= S wait on no list now, reached
   * from the stale versions' chains; its others are on the lazy list. */
  m->undo_head = m->undo_tail = 0;
  m->undo_pushed = m->undo_releasable;
  cow_map_undo_index_clear(m); /* empty: its blocks went to the lazy index */
  m->stale_base = m->stable_epoch + 1;
  m->stale_span = m->epoch - m->stable_epoch;
  m->epoch++; /* the writes to come are not stale */
  return true;
}

sl_cow_entry **cow_map_settle(sl_cow_map *m, sl_cow_entry **link,
                              int table_index) {
  sl_cow_entry *v = *link;
  assert(cow_stale(m, v) && v->retired == RETIRED_NOT);
  /* Down the chain to the version at S (note 5): one version per failed
   * epoch at most. */
  sl_cow_entry *u = cow_lazy_displaced(m, v);
  for (uint32_t n = 0; u && cow_stale(m, u); n++) {
    assert(n < m->stale_span);
    u = cow_lazy_displaced(m, u);
  }
  m->lazy_settled++;
  v->retired = RETIRED_FREE; /* freed when the lazy walk reaches it */
  if (!u) { /* inserted after S */
    cow_map_unlink(m, link, table_index);
    assert(m->lazy_inserted > 0);
    m->lazy_inserted--;
    return 0;
  }
  /* Kept since S on the undo list, or CLEAN, or still on the reclaim
   * chain, which turns it CLEAN like any live version. */
  assert(u->retired == RETIRED_UNDO);
  assert(u->epoch < m->stale_base);
  u->retired = RETIRED_NOT;
  u->chain_next = v->chain_next;
  *link = u; /* same key, same bucket, same table: the count stays */
  v->chain_next = 0;
  return link;
}

/* How far ahead of the lazy walk its versions' lines are fetched (note
 * 8), and where their chains' heads are: half way. */
#define LAZY_AHEAD 16u
_Static_assert(LAZY_AHEAD % 2 == 0 && LAZY_AHEAD >= 2, "a middle");

/* The table slot where e's key is, in the table new entries go to (and,
 * rehashing, the old one's: both are fetched). */
static sl_cow_entry **lazy_bucket(const sl_cow_map *m, int t,
                                  const sl_cow_entry *e) {
  const cow_table *table = &m->tables[t];
  return &table->buckets[e->hash & (table->size - 1)];
}

/* Note 8: move a cursor one version on along the lazy list (it stays on
 * the list or becomes NULL past its end); returns where it is now. */
static sl_cow_entry *lazy_cursor_step(sl_cow_entry **cursor, uint32_t *by) {
  if (*cursor) {
    *cursor = (*cursor)->dirty_next; /* on the lazy list: alive */
    (*by)++;
  }
  return *cursor;
}

/* Note 8: before the walk frees its head, keep the cursors ahead of it
 * and LAZY_AHEAD and LAZY_AHEAD / 2 versions on, fetching on the way:
 * the far cursor fetches a live version's bucket(s) and its version at S
 * (through the lazy index: the version's line is read for its number);
 * the middle one reads the bucket it fetched half the distance ago and
 * fetches the chain's head.  Hints only: a version settled meanwhile
 * only wastes a fetch. */
static void lazy_fetch_ahead(sl_cow_map *m) {
  sl_cow_entry *head = m->lazy_head;
  /* The head is about to go: a cursor on it moves on first. */
  if (m->lazy_ahead == head || m->lazy_ahead_by == 0) {
    m->lazy_ahead = head->dirty_next;
    m->lazy_ahead_by = 1;
  }
  if (m->lazy_mid == head || m->lazy_mid_by == 0) {
    m->lazy_mid = head->dirty_next;
    m->lazy_mid_by = 1;
  }
  while (m->lazy_ahead && m->lazy_ahead_by < LAZY_AHEAD) {
    sl_cow_entry *v = lazy_cursor_step(&m->lazy_ahead, &m->lazy_ahead_by);
    if (!v || v->retired != RETIRED_NOT)
      continue;
    PREFETCH(lazy_bucket(m, m->rehashing ? 1 : 0, v), 0);
    if (m->rehashing)
      PREFETCH(lazy_bucket(m, 0, v), 0);
    const sl_cow_entry *u = cow_lazy_displaced(m, v);
    if (u)
      PREFETCH(u, 1);
  }
  while (m->lazy_mid && m->lazy_mid_by < LAZY_AHEAD / 2) {
    sl_cow_entry *v = lazy_cursor_step(&m->lazy_mid, &m->lazy_mid_by);
    if (!v || v->retired != RETIRED_NOT)
      continue;
    const sl_cow_entry *chain = *lazy_bucket(m, m->rehashing ? 1 : 0, v);
    if (chain)
      PREFETCH(chain, 0);
  }
}

uint32_t cow_map_lazy_steps(sl_cow_map *m, uint32_t budget) {
  uint32_t done = 0;
  for (; done < budget && m->lazy_head; done++) {
    sl_cow_entry *e = m->lazy_head;
    assert(cow_stale(m, e));
    lazy_fetch_ahead(m);
    if (e->retired == RETIRED_NOT) {
      int table_index;
      sl_cow_entry **link = cow_map_find_version(m, e, &table_index);
      assert(link && *link == e);
      cow_map_settle(m, link, table_index);
    }
    m->lazy_head = e->dirty_next; /* read before e is freed */
    m->lazy_entries--;
    /* The cursors are past e (lazy_fetch_ahead): one version nearer; a
     * cursor past the list's end has no distance. */
    assert(m->lazy_ahead != e && m->lazy_mid != e);
    m->lazy_ahead_by = m->lazy_ahead ? m->lazy_ahead_by - 1 : 0;
    m->lazy_mid_by = m->lazy_mid ? m->lazy_mid_by - 1 : 0;
    cow_map_free_version(m, e);
  }
  if (!m->lazy_head && m->stale_span != 0) {
    /* Every stale version was on the list: none is left (note 6). */
    assert(m->lazy_entries == 0 && m->lazy_inserted == 0);
    m->lazy_tail = 0;
    m->lazy_ahead = m->lazy_mid = 0;
    m->lazy_ahead_by = m->lazy_mid_by = 0;
    m->stale_span = 0;
    lazy_index_free(m);
  }
  return done;
}

void cow_map_lazy_finish(sl_cow_map *m) {
  /* Bounded: each call takes up to UINT32_MAX versions off a list of
   * lazy_entries. */
  while (m->lazy_head)
    cow_map_lazy_steps(m, UINT32_MAX);
}

int sl_cow_map_rollback(sl_cow_map *m, uint32_t epoch) {
  assert(m);
  if (!m->retain || m->loading || epoch != m->stable_epoch)
    return EINVAL;
  /* Note 7: a lazy rollback still under way ends first, so what follows
   * sees a plain map whose writes since S are on its lists. */
  cow_map_lazy_finish(m);
  bool deleted;
  if (failed_writes(m, &deleted) && !deleted && rollback_lazily(m)) {
    m->rollbacks++; /* note 5 */
    assert(sl_cow_map_check(m));
    return 0;
  }
  /* Note 1.  Every pending epoch is after the stable one (released ones
   * are not pending), and so is the current one. */
  restore_undo(m);
  assert(live_keys(m) >= m->stable_live_keys);
  if (live_keys(m) > m->stable_live_keys) {
    unlink_list(m, m->dirty_head, m->dirty_entries);
    for (uint32_t i = 0; i < m->pending_count; i++)
      unlink_list(m, m->pending[i].head, m->pending[i].entries);
  }
  assert(live_keys(m) == m->stable_live_keys);
  drop_list(m, m->dirty_head, m->dirty_tail, m->dirty_entries, m->index_head);
  m->dirty_head = m->dirty_tail = 0;
  m->index_head = m->index_tail = 0;
  m->index_dropped = false;
  m->dirty_entries = m->dirty_bytes = m->dirty_deletes = 0;
  for (uint32_t i = 0; i < m->pending_count; i++)
    drop_list(m, m->pending[i].head, m->pending_tails[i].last,
              m->pending[i].entries, m->pending[i].index);
  m->pending_count = 0;
  m->rollbacks++;
  assert(sl_cow_map_check(m));
  return 0;
}

uint32_t cow_map_dropped_free(sl_cow_map *m, uint32_t budget) {
  uint32_t done = 0;
  for (; done < budget && m->dropped_head; done++) {
    sl_cow_entry *e = m->dropped_head;
    assert(e->retired != RETIRED_NOT); /* out of the table: note 1 */
    m->dropped_head = e->dirty_next; /* read before e is freed */
    m->dropped_entries--;
    cow_map_free_version(m, e);
  }
  if (!m->dropped_head)
    m->dropped_tail = 0;
  assert((m->dropped_head == 0) == (m->dropped_entries == 0));
  return done;
}

bool cow_test_alloc_fails(sl_cow_map *m, enum sl_cow_fail_point point) {
  assert(point < SL_COW_FAIL_POINTS);
  if (m->test_fail_countdown[point] == 0)
    return false;
  return --m->test_fail_countdown[point] == 0; /* note 9 */
}

void sl_cow_map_test_fail_alloc(sl_cow_map *m, enum sl_cow_fail_point point,
                                uint32_t nth) {
  assert(m);
  assert(point < SL_COW_FAIL_POINTS);
  m->test_fail_countdown[point] = nth; /* note 9 */
}

uint64_t sl_cow_map_rollback_visits(const sl_cow_map *m) {
  assert(m);
  return m->rollback_visits;
}

uint64_t sl_cow_map_rollback_settled(const sl_cow_map *m) {
  assert(m);
  return m->lazy_settled;
}

bool sl_cow_map_rollback_pending(const sl_cow_map *m) {
  assert(m);
  return m->lazy_head != 0;
}
