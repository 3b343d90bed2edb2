/* cow_map_internal.h — the copy-on-write map's private layout, shared by
 * cow_map.c (everything but rollback) and cow_map_rollback.c (rollback).
 * Nothing outside storage/cow_map*.c includes it. */
#ifndef SL_COW_MAP_INTERNAL_H
#define SL_COW_MAP_INTERNAL_H

#include <assert.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "alloc.h"
#include "cow_map.h"

/* A hint only: the line is wanted soon, for writing when write is 1. */
#if defined(__GNUC__)
#define PREFETCH(address, write) __builtin_prefetch((address), (write))
#else
#define PREFETCH(address, write) ((void)(address))
#endif

#define INITIAL_BUCKETS 16u
/* A version keeps 32 bits of its hash (cow_map.h), enough to place it in
 * a table of up to this many buckets (cow_map.c note 6). */
#define COW_TABLE_MAX_BUCKETS (UINT64_C(1) << 32)
/* Load arena (cow_map.c note 9): 4 MiB holds about 52K versions of the
 * usual 80 bytes, so chunks are few (one allocation per 52K loads), yet a
 * chunk is small next to a restored state, so chunks whose versions were
 * all replaced or deleted do go back to the allocator. */
#define ARENA_CHUNK_BYTES (UINT32_C(4) << 20)
/* Larger loaded versions are malloc'd: a version that does not fit the rest
 * of a chunk wastes that rest, so this bounds the waste to 1/64. */
#define ARENA_VERSION_MAX_BYTES (ARENA_CHUNK_BYTES / 64u)

/* A version's retired mark (cow_map.c note 12). */
enum {
  RETIRED_NOT = 0,  /* live: in the table */
  RETIRED_FREE = 1, /* out of the table; freed when its list is walked */
  RETIRED_UNDO = 2  /* out of the table, kept on the undo list */
};

/* The end of one pending list, and the undo list's append count when it
 * was frozen (cow_map.c note 12). */
typedef struct cow_pending_end {
  sl_cow_entry *last;
  uint64_t undo_mark;
  sl_cow_entry *undo_last; /* the undo list's last version then, or NULL */
  uint64_t live_keys; /* keys in the map then (cow_map.c note 12) */
  uint64_t deletes;   /* tombstones the epoch wrote (cow_map_rollback.c
                         note 5) */
  /* Without rollback, this epoch's versions that writes displaced, their
   * retired mark not yet written (cow_map.c note 15); NULL when none. */
  struct sl_cow_entry **later;
  uint64_t later_count;
  uint64_t later_capacity;
} cow_pending_end;

/* The header of a load arena chunk (note 9); versions follow it. */
typedef struct arena_chunk {
  struct arena_chunk *prev; /* the map's chunks, newest first */
  struct arena_chunk *next;
  const struct sl_cow_map *owner; /* for sl_cow_map_check() */
  uint32_t used_bytes; /* carved so far, this header included */
  uint32_t versions;   /* carved and not yet freed */
} arena_chunk;

/* A record of the staged bulk load (cow_map.c note 18): this header,
 * then the key and the value, padded to 4 bytes.  The key's size carries
 * COW_STAGE_PROBE when the entry is to be probed. */
typedef struct cow_stage_record {
  uint32_t hash; /* as the version keeps it (sl_cow_entry.hash) */
  uint32_t key_bytes;
  uint32_t value_bytes;
} cow_stage_record;
#define COW_STAGE_PROBE 0x80000000u
_Static_assert(sizeof(cow_stage_record) == 12, "records are 4-byte aligned");

static inline uint64_t cow_stage_record_bytes(uint32_t key_bytes,
                                              uint32_t value_bytes) {
  return (sizeof(cow_stage_record) + (uint64_t)key_bytes + value_bytes + 3u) &
         ~(uint64_t)3u;
}

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
  /* The current dirty list's index (header note 11): first and last
   * block, both NULL while the list is empty or the index was dropped
   * (index_dropped: a block could not be allocated this epoch). */
  sl_cow_index_block *index_head;
  sl_cow_index_block *index_tail;
  bool index_dropped;
  uint64_t index_drops; /* epochs that lost their index, since creation */
  uint64_t dirty_entries;
  uint64_t dirty_bytes;
  sl_cow_delta *pending;        /* frozen, unreleased; oldest first */
  cow_pending_end *pending_tails; /* per pending list: last entry, mark */
  uint32_t pending_count;
  uint32_t pending_capacity;
  sl_cow_entry *reclaim_head; /* released lists, concatenated (note 1) */
  sl_cow_entry *reclaim_tail;
  uint64_t reclaim_entries;
  /* Note 15: displaced versions of released epochs whose retired mark the
   * reclaim steps write before they walk on: marking[marking_done ..
   * marking_count), in an array of marking_capacity (NULL when 0). */
  sl_cow_entry **marking;
  uint64_t marking_done;
  uint64_t marking_count;
  uint64_t marking_capacity;
  /* The released lists' indexes, concatenated in the same order, kept so
   * the reclaim walk can fetch ahead (cow_map.c note 13): the block and
   * position of the walk's next version (NULL: no fetching), the last
   * block, and the fetch cursor, ahead of the walk.  unindexed: a list
   * without an index is on the chain, so there is no fetching until the
   * chain is empty again. */
  sl_cow_index_block *reclaim_index;
  uint64_t reclaim_index_at;
  sl_cow_index_block *reclaim_index_tail;
  sl_cow_index_block *reclaim_ahead;
  uint64_t reclaim_ahead_at;
  bool reclaim_unindexed;
  uint64_t memory_bytes;
  uint64_t step_buckets_max; /* most buckets one rehash step visited */
  uint64_t heap_versions;     /* malloc'd versions, wherever they are */
  arena_chunk *arena_chunks;  /* every chunk, newest first (note 9) */
  arena_chunk *arena_carving; /* where loads carve next; NULL: none yet */
  uint64_t arena_chunk_count;
  arena_chunk *arena_spare;   /* an emptied chunk kept for the next one,
                                 counted in memory_bytes (note 16) */
  uint64_t freeze_copy_entries; /* note 16's limits; 0: no copying */
  uint64_t freeze_copy_bytes;
  uint64_t freeze_copies;       /* versions copied so far */
  /* Note 17: the copy pass over a frozen delta's list.  copy_epoch: the
   * delta's epoch, 0 when no pass is under way; copy_next: the next
   * version to look at (on that list), copy_prev the one before it (0: at
   * the head), and the index block and position of copy_next (block 0
   * when the delta has no index). */
  uint32_t copy_epoch;
  sl_cow_entry *copy_next;
  sl_cow_entry *copy_prev;
  sl_cow_index_block *copy_block;
  uint64_t copy_at;
  uint64_t copy_pass_entries; /* note 17's limits; 0: no pass */
  uint64_t copy_pass_bytes;
  uint64_t copy_passes;       /* passes begun since creation */
  /* The bulk load's helper thread (cow_map_arena.c note 1), or NULL, and
   * the chunks allocated ahead and posted to it, not yet taken. */
  struct sl_prefault *load_prefault;
  uint32_t load_spares;
  uint32_t load_spares_max;
  /* The bulk load (note 10).  The ring: load_count versions added and not
   * yet linked, the oldest at load_first; the oldest load_unprobed of them
   * are linked without the duplicate probe. */
  sl_cow_entry *load_window[SL_COW_LOAD_WINDOW];
  uint32_t load_first;
  uint32_t load_count;
  uint32_t load_unprobed;
  bool loading;     /* from the first sl_cow_map_load_add() to finish */
  bool load_sorted; /* every entry so far followed the one before it */
  uint32_t load_previous_group;
  /* The key of the last entry added, if sorted: in its version, or in its
   * staged record until that is linked (note 18). */
  const void *load_previous;
  uint32_t load_previous_bytes;
  int load_error; /* the bulk load's first error; never cleared */
  uint64_t load_probes; /* bulk-loaded entries probed, for tests */
  /* Note 18: the staged bulk load.  stage_area (0: this load is not
   * staged) holds, in one allocation of stage_area_bytes counted in
   * memory_bytes: the records, stage_used bytes of stage_budget, by add
   * order, stage_records of them (at most stage_max_records); room for
   * their offsets and hashes by partition; and the records each
   * partition holds.  Partition = (hash & stage_mask) >> stage_shift,
   * stage_parts of them.  The settings: stage a load into a table of at
   * least stage_min_buckets, in partitions of stage_region_buckets. */
  uint8_t *stage_area;
  uint64_t stage_area_bytes;
  uint64_t stage_used;
  uint32_t stage_records;
  uint32_t stage_max_records;
  uint32_t *stage_sorted;
  uint32_t *stage_hashes;
  uint32_t *stage_counts;
  uint32_t stage_parts;
  uint32_t stage_shift;
  uint64_t stage_mask;
  uint64_t stage_min_buckets;
  uint64_t stage_region_buckets;
  uint64_t stage_budget;
  uint64_t load_staged;  /* entries staged since creation, for tests */
  uint64_t stage_links;  /* times the staged records were linked, for tests */
  sl_alloc alloc; /* every allocation of the map, itself included (note 11) */
  /* Rollback (cow_map.c note 12).  Versions displaced by writes, kept for
   * a rollback, oldest displacement first, linked by chain_next, are
   * numbered by append: those undo_popped .. undo_releasable - 1 were
   * displaced in released epochs, are needed no more and wait on the
   * obsolete list to be freed in bounded steps; those undo_releasable ..
   * undo_pushed - 1 are on the undo list. */
  bool retain;           /* rollback on (sl_cow_map_enable_rollback) */
  uint32_t stable_epoch; /* newest released epoch: what rollback restores */
  sl_cow_entry *undo_head;
  sl_cow_entry *undo_tail;
  sl_cow_entry *obsolete_head;
  sl_cow_entry *obsolete_tail;
  uint64_t undo_pushed;
  uint64_t undo_popped;
  uint64_t undo_releasable;
  /* The undo list's index (cow_map_rollback.c note 4): its versions by
   * append number, in blocks of the dirty index's kind; slot 0 of the
   * first block holds append number undo_index_base.  Blocks wholly below
   * undo_releasable are freed at release.  NULL when empty; dropped (no
   * block, the rollback follows the list) if a block could not be had,
   * until the undo list is empty again. */
  sl_cow_index_block *undo_index_head;
  sl_cow_index_block *undo_index_tail;
  uint64_t undo_index_base;
  bool undo_index_dropped;
  /* Keys in the table at the stable epoch (cow_map.c note 12). */
  uint64_t stable_live_keys;
  /* The lists of the epochs a rollback dropped, joined by dirty_next:
   * versions out of the table, on no other list, each freed by the
   * reclaim steps (cow_map_rollback.c note 1). */
  sl_cow_entry *dropped_head;
  sl_cow_entry *dropped_tail;
  uint64_t dropped_entries;
  uint64_t rollbacks; /* for tests */
  uint64_t rollback_visits; /* versions rollbacks handled, for tests */
  /* Tombstones written in the current epoch: a rollback over an epoch
   * that deleted keys is not lazy (cow_map_rollback.c note 5). */
  uint64_t dirty_deletes;
  /* The lazy rollback under way (cow_map_rollback.c notes 5-7).  A
   * version is stale when epoch - stale_base < stale_span (unsigned): its
   * epoch failed, after stable epoch stale_base - 1, up to stale_base +
   * stale_span - 1; stale_span is 0 when none is under way, so the test
   * is one compare that never holds.  The failed epochs' lists, joined
   * newest epoch first by dirty_next, wait on the lazy list to be settled
   * and freed; lazy_inserted of the keys in the table were inserted in
   * a failed epoch and are not unlinked yet. */
  uint32_t stale_base;
  uint32_t stale_span;
  sl_cow_entry *lazy_head;
  sl_cow_entry *lazy_tail;
  /* Two cursors on the lazy list ahead of its head, for fetching
   * (cow_map_rollback.c note 8): lazy_ahead lazy_ahead_by versions
   * ahead, lazy_mid lazy_mid_by versions ahead; NULL past the end. */
  sl_cow_entry *lazy_ahead;
  sl_cow_entry *lazy_mid;
  uint32_t lazy_ahead_by;
  uint32_t lazy_mid_by;
  uint64_t lazy_entries;
  uint64_t lazy_inserted;
  /* The undo list's index as the rollback found it, kept to resolve the
   * stale versions' displaced numbers (cow_map_rollback.c note 5): its
   * blocks, also by position in lazy_blocks (lazy_block_count of them,
   * all full but the last), slot 0 of the first holding append number
   * lazy_index_base, lazy_index_end the number after the last. */
  sl_cow_index_block *lazy_index;
  sl_cow_index_block **lazy_blocks;
  uint64_t lazy_block_count;
  uint64_t lazy_index_base;
  uint64_t lazy_index_end;
  uint64_t lazy_settled; /* stale versions settled since creation, tests */
  /* sl_cow_map_test_fail_alloc: per failure point, the allocations there
   * still to pass before the one that fails (0: none fails). */
  uint32_t test_fail_countdown[SL_COW_FAIL_POINTS];
};

/* The staged load's partition of a hash (cow_map.c note 18). */
static inline uint32_t cow_stage_part(const sl_cow_map *m, uint32_t hash) {
  return (uint32_t)((hash & m->stage_mask) >> m->stage_shift);
}

/* Whether the allocation about to be made at point must fail for a test
 * (sl_cow_map_test_fail_alloc, cow_map_rollback.c note 9): counts it
 * down.  Asked only where a failure has a fallback, never on a lookup's
 * path, and on a write's only where it allocates anyway (a new index
 * block, a grown array); a call, not inline, so that the paths around
 * those allocations compile as without it. */
bool cow_test_alloc_fails(sl_cow_map *m, enum sl_cow_fail_point point);

/* Whether e is stale: of an epoch a lazy rollback has not finished
 * undoing (cow_map_rollback.c note 5).  One compare on every lookup. */
static inline bool cow_stale(const sl_cow_map *m, const sl_cow_entry *e) {
  return (uint32_t)(e->epoch - m->stale_base) < m->stale_span;
}

/* Keys in the map: the table's, less the keys a lazy rollback has yet
 * to unlink (cow_map_rollback.c note 6). */
static inline uint64_t cow_live_keys(const sl_cow_map *m) {
  return m->tables[0].used + m->tables[1].used - m->lazy_inserted;
}

/* Bytes of one allocation: header, key padded to 8, value area of at least
 * 8 bytes (cow_map.c note 7). */
static inline uint64_t entry_alloc_bytes(uint32_t key_bytes, uint32_t capacity_bytes) {
  uint64_t area = ((uint64_t)capacity_bytes + 7u) & ~(uint64_t)7u;
  if (area < 8)
    area = 8;
  return sizeof(sl_cow_entry) + sl_cow_value_offset(key_bytes) + area;
}

/* Value storage the version was allocated with (cow_map.c note 7). */
static inline uint32_t entry_capacity(const sl_cow_entry *e) {
  if (!e->tombstone)
    return e->value_bytes;
  uint32_t capacity;
  memcpy(&capacity, e->data + sl_cow_value_offset(e->key_bytes), 4);
  return capacity;
}

static inline arena_chunk *chunk_of(const sl_cow_entry *e) {
  assert(e->arena);
  return (arena_chunk *)((uintptr_t)e & ~(uintptr_t)(ARENA_CHUNK_BYTES - 1));
}

/* The load arena (cow_map.c note 9, cow_map_arena.c). */
bool cow_arena_chunk_new(sl_cow_map *m);
void cow_arena_chunk_free(sl_cow_map *m, arena_chunk *c);

/* bytes (a multiple of 8, at most ARENA_VERSION_MAX_BYTES) for a version,
 * carved after the previous one.  NULL on ENOMEM.  Inline: a restore
 * calls it for every entry, a new chunk only every few thousand. */
static inline sl_cow_entry *cow_arena_carve(sl_cow_map *m, uint64_t bytes) {
  assert(bytes % 8 == 0);
  assert(bytes <= ARENA_VERSION_MAX_BYTES);
  arena_chunk *c = m->arena_carving;
  if (!c || ARENA_CHUNK_BYTES - c->used_bytes < bytes) {
    if (!cow_arena_chunk_new(m))
      return 0;
    c = m->arena_carving;
  }
  sl_cow_entry *e = (sl_cow_entry *)((uint8_t *)c + c->used_bytes);
  c->used_bytes += (uint32_t)bytes;
  c->versions++;
  return e;
}
void cow_arena_spares_drop(sl_cow_map *m);

/* cow_map.c's own operations, for cow_map_rollback.c and
 * cow_map_check.c. */
sl_cow_entry **cow_map_find_version(const sl_cow_map *m,
                                    const sl_cow_entry *e, int *table_index);
void cow_map_unlink(sl_cow_map *m, sl_cow_entry **link, int table_index);
void cow_map_link(sl_cow_map *m, sl_cow_entry *e);
void cow_map_free_version(sl_cow_map *m, sl_cow_entry *e);
/* Free the index (header note 11) of a dirty list of `entries` versions,
 * given its first block (NULL: none). */
void cow_map_free_index(sl_cow_map *m, const sl_cow_index_block *index,
                        uint64_t entries);
/* Free every block of the undo list's index and start it again empty
 * (cow_map_rollback.c note 4): after a rollback emptied the undo list, or
 * when the map is destroyed. */
void cow_map_undo_index_clear(sl_cow_map *m);

/* Free up to budget versions of the dropped list (cow_map_rollback.c
 * note 1); returns how many it freed. */
uint32_t cow_map_dropped_free(sl_cow_map *m, uint32_t budget);

/* Pop released undo versions (note 12), at most budget; true if some
 * remain. */
bool cow_map_undo_pop(sl_cow_map *m, uint64_t budget);

/* The lazy rollback (cow_map_rollback.c notes 5-7).  cow_map_settle():
 * the stale version at *link (in table table_index) gives way to its
 * key's version at the stable epoch, or leaves the table if the key had
 * none; returns link if the key is still in the table, else NULL.  Out
 * of line: only the first touch of a stale key after a rollback gets
 * here. */
sl_cow_entry **cow_map_settle(sl_cow_map *m, sl_cow_entry **link,
                              int table_index);
/* The version a stale version's displaced number names (or NULL for 0),
 * through the lazy index (cow_map_rollback.c note 5). */
static inline sl_cow_entry *cow_lazy_displaced(const sl_cow_map *m,
                                               const sl_cow_entry *e) {
  if (e->displaced == 0)
    return 0;
  /* Numbers are kept mod 2^32; the index spans far fewer. */
  uint64_t at = (uint32_t)(e->displaced - 1u - (uint32_t)m->lazy_index_base);
  assert(at < m->lazy_index_end - m->lazy_index_base);
  const sl_cow_index_block *block = m->lazy_blocks[at / SL_COW_INDEX_BLOCK];
  assert(at % SL_COW_INDEX_BLOCK < block->count);
  return block->versions[at % SL_COW_INDEX_BLOCK];
}

/* Settle and free up to budget versions of the lazy list; returns how
 * many. */
uint32_t cow_map_lazy_steps(sl_cow_map *m, uint32_t budget);
/* Finish the lazy rollback under way, if any: before whatever must see
 * the table as it is (iteration, a second rollback, destroy's walk). */
void cow_map_lazy_finish(sl_cow_map *m);

#endif /* SL_COW_MAP_INTERNAL_H */
