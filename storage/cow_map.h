/* cow_map.h — the copy-on-write hash map that holds an instance's keyed
 * state, with O(1) freezes for checkpoints (O(changes) for small ones).
 *
 * NOTES ON THE DESIGN
 *
 * 1. One map belongs to one operator instance.  Every call below except
 *    reading a frozen delta runs on that instance's thread (the owner).
 *    The map needs no locks: the owner never waits for the writer and the
 *    writer never touches the table.
 * 2. Entries are versioned by epoch.  The map starts in epoch 1; entries
 *    loaded by sl_cow_map_load() are in epoch 0 ("clean", already
 *    durable).  Every entry written (inserted, updated, deleted) in the
 *    current epoch is on the current epoch's dirty list, exactly once per
 *    version.
 * 3. sl_cow_map_freeze() closes the current epoch and starts the next: the
 *    closed dirty list becomes a frozen delta, immutable from then on.  It
 *    costs O(1): no entry and no bucket is visited.  Except for a small
 *    delta (cow_map.c note 16): its versions are copied into the delta at
 *    once, and the versions in the table become clean (epoch 0), so the
 *    writes after the freeze go in place instead of copying (note 4).
 * 4. A write to an entry of a frozen, not yet released epoch copies it: the
 *    new version goes into the table and the current dirty list; the old
 *    one stays, unchanged, on its frozen list for the writer (the "copy on
 *    write").  A delete of such an entry appends a tombstone version.
 *    Entries of epoch 0, and of released epochs once sl_cow_map_maintain()
 *    has reclaimed their delta, are updated in place and re-enter the
 *    current dirty list (unless rollback is on: note 10); entries of the
 *    current epoch are updated in place.
 *    (Until reclaimed, entries of released epochs are copied on write:
 *    cow_map.c note 2.)  sl_cow_map_update() is such a write: the storage
 *    it hands out is never a frozen version's.
 * 5. The writer (any thread, after a happens-before hand-off, e.g. a queue)
 *    walks a frozen delta through sl_cow_entry.dirty_next and reads key,
 *    value and the tombstone/superseded marks.  Those fields are never
 *    written once their epoch is frozen.  Fields the owner keeps changing
 *    (chain_next, retired) are never read by the writer.
 * 6. Applying a frozen delta's entries in list order, skipping superseded
 *    ones, to the state as of the previous delta gives exactly the state at
 *    the freeze (put for a live entry, delete for a tombstone).  Deltas
 *    must be applied in epoch order.
 * 7. sl_cow_map_release(m, e) says every delta of epoch <= e is durable
 *    and will never be read again.  Old versions they kept alive are then
 *    reclaimed — in steps of bounded work (sl_cow_map_maintain), never in
 *    one pass over the state.  Deltas that are not released (their
 *    checkpoint was aborted) stay readable, so the next checkpoint can write
 *    them again together with its own (sl_cow_map_pending()).
 * 8. The table grows by doubling with incremental rehash (as Redis's dict):
 *    each operation moves a bounded number of buckets, so no single call
 *    visits more than SL_COW_STEP_MAX_BUCKETS buckets.
 * 9. Restoring a checkpoint fills an empty map with clean entries, by one
 *    of two paths.  sl_cow_map_load() inserts one entry and checks it is
 *    not a duplicate before it returns.  The bulk load
 *    (sl_cow_map_load_add() per entry, then sl_cow_map_load_finish()) does
 *    the same work but links each entry into the table up to
 *    SL_COW_LOAD_WINDOW calls later, having prefetched its bucket, so the
 *    cache misses of many random buckets overlap, and skips the duplicate
 *    probe while the input is in strictly ascending (key group, key) order,
 *    as the store delivers it (order alone proves no key repeats); it is
 *    several times faster on large states.  Both carve the loaded versions
 *    out of large chunks (an arena) instead of allocating each one.
 * 10. Rollback (sl_cow_map_enable_rollback, sl_cow_map_rollback).  With it
 *    on, the map can return in memory to the state as of its stable epoch:
 *    the newest epoch released (note 7), i.e. the last checkpoint known to
 *    be complete.  Every version a later write displaces from the table —
 *    CLEAN ones included, which are then copied on write instead of
 *    changed in place — is kept until the epoch of that write is released
 *    in turn; only those versions are kept, so the extra memory is at most
 *    one copy of each key written since the stable epoch.  A rollback
 *    costs time in the versions written since the stable epoch (current
 *    and frozen ones), not in the size of the state; unless a key was
 *    deleted since, it is lazy: the call costs O(number of epochs), each
 *    key written since is put back on its first touch, and the rest in
 *    bounded steps (writes, sl_cow_map_maintain()), or at once before
 *    sl_cow_map_foreach() or another rollback (cow_map_rollback.c notes
 *    5-7).
 * 11. The index.  Next to each dirty list the owner keeps the list's
 *    versions as an array of pointers, in list order, in blocks of
 *    SL_COW_INDEX_BLOCK (one more store on the write path, one allocation
 *    a block).  A freeze hands it over with the list (sl_cow_delta.index),
 *    as immutable as the list; the writer reads it front to back and so
 *    can fetch versions ahead, where the list makes it wait for each
 *    version before it knows the next (at 1M changed keys that walk was
 *    50-100 ms of a write of about 250 ms).  It costs 8 bytes per version
 *    on a list until its epoch is released and the reclaim walk has
 *    passed it (which reads it to fetch ahead, cow_map.c note 13), or
 *    until rollback or destroy.  If a block cannot be allocated, that
 *    epoch has no index (NULL) and the writer follows the list: the index
 *    only ever saves time.
 *
 * Memory: one allocation per entry version written: the header below (40
 * bytes) plus key and value, plus one bucket pointer per entry at most,
 * plus 8 bytes per version on a dirty list (note 11), and with rollback 8
 * bytes per version on the undo list (cow_map_rollback.c note 4).
 * Loaded versions (up to 64 KiB each; larger ones are malloc'd) are carved
 * out of 4 MiB chunks instead; a chunk goes back to the allocator when its
 * last version is freed, so the arena never holds more than the restored
 * state did (cow_map.c note 9).  Every allocation goes through the map's
 * own jemalloc arena where there is one (storage/alloc.h), so destroying
 * the map is one arena reset, not a walk over its entries (cow_map.c
 * note 11).
 *
 * Caveats
 * - Between the first sl_cow_map_load_add() and sl_cow_map_load_finish()
 *   the only calls allowed on the map are more of those two,
 *   sl_cow_map_check(), sl_cow_map_memory_bytes(), the bulk load's
 *   counters for tests (sl_cow_map_load_probes, sl_cow_map_load_staged,
 *   sl_cow_map_stage_links) and sl_cow_map_destroy() (the others assert
 *   it).
 * - A duplicate key in a bulk load is reported by a later call than the
 *   one that added it (sl_cow_map_load_add() documents which).
 * - A bulk load into a large table is staged (cow_map.c note 18): its
 *   entries are linked in rounds, so visible later than in an unstaged
 *   one, and it holds an area of up to 24 MiB (16 MiB of entries plus
 *   8 MiB for their sort) until finish.
 */
#ifndef SL_COW_MAP_H
#define SL_COW_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct sl_cow_entry {
  struct sl_cow_entry *chain_next; /* owner only: bucket chain */
  struct sl_cow_entry *dirty_next; /* dirty list; immutable once frozen */
  /* The low 32 bits of the key's hash: a table has at most 2^32 buckets
   * (cow_map.c note 6), so they place it, and they reject other keys in a
   * chain as well as 64 would. */
  uint32_t hash;
  /* Owner only, with rollback on: 1 + the undo list's append number
   * (mod 2^32) of the version this one took the table slot of, i.e. the
   * key's version before this epoch's first write to it; 0 for a key
   * absent then (cow_map_rollback.c note 5).  Read only while its epoch
   * is after the stable one. */
  uint32_t displaced;
  uint32_t epoch;       /* epoch of this version */
  uint32_t key_bytes;
  uint32_t value_bytes; /* 0 for a tombstone */
  uint8_t tombstone;    /* this version deletes the key */
  uint8_t superseded;   /* a later version of the same epoch replaced it
                           (set only while its epoch is current) */
  uint8_t retired;      /* owner only: no longer in the table */
  uint8_t arena;        /* owner only: carved out of a load arena chunk, so
                           never passed to free() (cow_map.c note 9) */
  /* key (key_bytes), then value (value_bytes) at offset
   * sl_cow_value_offset(key_bytes) from data, 8-byte aligned. */
  _Alignas(8) uint8_t data[];
} sl_cow_entry;

static inline uint32_t sl_cow_value_offset(uint32_t key_bytes) {
  return (key_bytes + 7u) & ~7u;
}
static inline const void *sl_cow_entry_key(const sl_cow_entry *e) {
  return e->data;
}
static inline void *sl_cow_entry_value(sl_cow_entry *e) {
  return e->data + sl_cow_value_offset(e->key_bytes);
}

/* Keys as the table sees them.  A key of 8 to 16 bytes, as keyed state's
 * are, is hashed and compared through two words: its first 8 bytes and its
 * last 8 bytes (overlapping), each as memcpy() reads them into a uint64_t.
 * Other lengths are hashed with XXH3 and compared with memcmp().  The hash
 * lives in memory only (never stored), so it may change between versions.
 *
 * sl_cow_map_find(), sl_cow_map_put_key() and sl_cow_map_update() take a
 * prepared key (sl_cow_key): the bytes with their hash and words.
 * sl_cow_key_of() prepares one from the bytes; a caller that has the words
 * in registers fills it with sl_cow_hash_words() instead and saves reading
 * back a key it just wrote: a load that spans several stores still in
 * flight (a key written piecewise) waits for them, which was a third of
 * the time of a keyed-state update (engine/state.c). */
typedef struct sl_cow_key {
  const void *bytes;
  uint32_t key_bytes;
  uint64_t hash;  /* sl_cow_hash(bytes, key_bytes) */
  uint64_t first; /* 8 to 16 bytes: the first 8 bytes, else 0 */
  uint64_t last;  /* 8 to 16 bytes: the last 8 bytes, else 0 */
} sl_cow_key;

/** The hash of a key of key_bytes (8 to 16) bytes from its two words. */
static inline uint64_t sl_cow_hash_words(uint64_t first, uint64_t last,
                                         uint32_t key_bytes) {
  /* XXH3's construction for 9-16 bytes with other constants: a 128-bit
   * product folded to 64 bits, plus the words themselves (so no single
   * word value can zero the product's contribution), then a final
   * avalanche that spreads every input bit over the low bits the table
   * indexes with. */
  __extension__ typedef unsigned __int128 sl_cow_u128;
  uint64_t a = first ^ UINT64_C(0x9e3779b97f4a7c15);
  uint64_t b = last ^ UINT64_C(0xc2b2ae3d27d4eb4f);
  sl_cow_u128 product = (sl_cow_u128)a * b;
  uint64_t h = key_bytes + first + (last << 32 | last >> 32) +
               ((uint64_t)product ^ (uint64_t)(product >> 64));
  h ^= h >> 37;
  h *= UINT64_C(0x165667919e3779f9);
  h ^= h >> 32;
  return h;
}

/** The hash of a key of another length (XXH3). */
uint64_t sl_cow_hash_long(const void *key, uint32_t key_bytes);

/** key (key_bytes bytes, which must stay valid while the result is used)
 * prepared for a lookup. */
static inline sl_cow_key sl_cow_key_of(const void *key, uint32_t key_bytes) {
  sl_cow_key k = {.bytes = key, .key_bytes = key_bytes};
  if (key_bytes >= 8 && key_bytes <= 16) {
    memcpy(&k.first, key, 8);
    memcpy(&k.last, (const uint8_t *)key + key_bytes - 8, 8);
    k.hash = sl_cow_hash_words(k.first, k.last, key_bytes);
  } else {
    k.hash = sl_cow_hash_long(key, key_bytes);
  }
  return k;
}

/** The table's hash of any key. */
uint64_t sl_cow_hash(const void *key, uint32_t key_bytes);

/* Versions one block of a dirty list's index holds (note 11): a block is
 * then 32 KiB. */
#define SL_COW_INDEX_BLOCK 4094u

/* A block of a dirty list's index (note 11): the list's versions, in list
 * order, count of them here; next block or NULL. */
typedef struct sl_cow_index_block {
  struct sl_cow_index_block *next;
  uint64_t count;
  sl_cow_entry *versions[SL_COW_INDEX_BLOCK];
} sl_cow_index_block;

/* The version ahead positions after position at of block, in it or in
 * the next block; NULL past the index's end (or ahead spanning more than
 * one block boundary).  For fetching ahead of a walk over an index. */
static inline sl_cow_entry *sl_cow_index_ahead(const sl_cow_index_block *block,
                                               uint64_t at, uint64_t ahead) {
  if (at + ahead < block->count)
    return block->versions[at + ahead];
  const sl_cow_index_block *next = block->next;
  uint64_t rest = at + ahead - block->count;
  return next && rest < next->count ? next->versions[rest] : 0;
}

/* A frozen delta: the versions written during one epoch, in write order. */
typedef struct sl_cow_delta {
  uint32_t epoch;
  sl_cow_entry *head; /* first entry; follow dirty_next; NULL if empty */
  uint64_t entries;   /* list length (superseded ones included) */
  uint64_t bytes;     /* sum of key_bytes + value_bytes over the list */
  /* The same list as an array (note 11): its first block, or NULL, when
   * the list must be followed instead. */
  const sl_cow_index_block *index;
} sl_cow_delta;

typedef struct sl_cow_map sl_cow_map;

/* Largest key or value accepted (bytes). */
#define SL_COW_MAX_BYTES (1u << 30)

/* Most buckets one operation's rehash step visits (4 moved + 40 empty). */
#define SL_COW_STEP_MAX_BUCKETS 44u

/** Create an empty map in epoch 1.  Errors: ENOMEM. */
int sl_cow_map_create(sl_cow_map **map);

/** Free the map and every version it still holds, frozen deltas included.
 * No writer may still be reading a delta.  NULL is accepted. */
void sl_cow_map_destroy(sl_cow_map *map);

/** Look a key up.  Returns the entry's value and sets *value_bytes, or
 * NULL if absent.  The pointer is valid until the next write to the map. */
const void *sl_cow_map_get(sl_cow_map *map, const void *key,
                           uint32_t key_bytes, uint32_t *value_bytes);
/** sl_cow_map_get() of a prepared key (sl_cow_key_of(), or filled by the
 * caller with the same hash and words: asserted). */
const void *sl_cow_map_find(sl_cow_map *map, const sl_cow_key *key,
                            uint32_t *value_bytes);

/* Keys a sl_cow_map_prefetch() call takes at most. */
#define SL_COW_PREFETCH_MAX 64u

/** A hint that keys with these `count` hashes (at most
 * SL_COW_PREFETCH_MAX) are about to be looked up: start fetching what the
 * lookups will read, so that their cache misses overlap instead of
 * waiting one after another (a lookup of a state larger than the cache
 * costs two misses in a row, the bucket, then the entry it points to, and
 * a third when that entry holds another key).
 * stage 0 fetches the buckets; stage 1 reads them (in cache by then if
 * stage 0 ran a little earlier) and fetches the first entry of each chain,
 * header and value; stage 2 reads those first entries (in cache by then
 * if stage 1 ran a little earlier) and, where one holds another key,
 * fetches the chain's second entry, which that lookup reads next (one
 * further along still misses).  Changes nothing and fails never: a stale
 * hash or a table grown since only wastes the fetch.  Owner thread (note
 * 1). */
void sl_cow_map_prefetch(const sl_cow_map *map, const uint64_t *hashes,
                         uint32_t count, int stage);

/** Insert or replace.  Returns a pointer to the value storage of the
 * version now in the table (value_bytes writable bytes, already holding a
 * copy of value if value is not NULL; with value NULL, the previous value's
 * bytes as far as they fit and zeros after them, all zeros for a new key),
 * valid until the next write to the map or freeze; NULL on ENOMEM, with the
 * map unaltered.  Sizes over SL_COW_MAX_BYTES are a caller bug (asserted;
 * NULL without asserts). */
void *sl_cow_map_put(sl_cow_map *map, const void *key, uint32_t key_bytes,
                     const void *value, uint32_t value_bytes);
/** sl_cow_map_put() of a prepared key (as sl_cow_map_find()). */
void *sl_cow_map_put_key(sl_cow_map *map, const sl_cow_key *key,
                         const void *value, uint32_t value_bytes);

/** Read-modify-write of a prepared key (as sl_cow_map_find()) in one
 * lookup.  Sets *value to writable storage of value_bytes bytes holding
 * key's current value, valid until the next write to the map or freeze,
 * and counts as a write of key (the version is on the current dirty list,
 * so what the caller writes there is in the next frozen delta):
 * - key present with value_bytes bytes: its value, in place if its version
 *   is CURRENT or CLEAN (CLEAN only with rollback off), else (FROZEN, or
 *   RELEASED and not yet reclaimed) in a new CURRENT version that starts
 *   as a copy; the old version is never written (notes 4, 10);
 * - key absent: a new version holding a copy of init (value_bytes bytes),
 *   or zeros if init is NULL.
 * Returns 0; EINVAL (the key holds a value of another size, or a size over
 * SL_COW_MAX_BYTES); ENOMEM.  On error *value is untouched and the map's
 * contents are unaltered. */
int sl_cow_map_update(sl_cow_map *map, const sl_cow_key *key,
                      const void *init, uint32_t value_bytes, void **value);

/** Delete a key.  Returns 0, SL_ENOTFOUND (-30888) if absent, or ENOMEM
 * (the map unaltered) when a tombstone version cannot be allocated. */
int sl_cow_map_delete(sl_cow_map *map, const void *key, uint32_t key_bytes);

/** Live keys. */
uint64_t sl_cow_map_count(const sl_cow_map *map);

/** Versions on the current epoch's dirty list (superseded ones and
 * tombstones included): what the next freeze would hand over. */
uint64_t sl_cow_map_dirty_entries(const sl_cow_map *map);

/** Freeze the current epoch (note 3) and return it as a delta; the map
 * moves to the next epoch.  O(1), or, for a delta within the copying
 * freeze's limits, O(its versions) (cow_map.c note 16).  The delta stays
 * valid until released. */
sl_cow_delta sl_cow_map_freeze(sl_cow_map *map);

/* cow_map.c note 16: a freeze of at most this many live versions, whose
 * keys and values take at most this many bytes, copies them at once. */
#define SL_COW_FREEZE_COPY_ENTRIES 16384u
#define SL_COW_FREEZE_COPY_BYTES ((uint64_t)1 << 20)

/** The limits of the copying freeze (cow_map.c note 16); 0 and 0 turn it
 * off.  Rollback (note 10) turns it off too.  Owner thread (note 1). */
void sl_cow_map_set_freeze_copy(sl_cow_map *map, uint64_t max_entries,
                                uint64_t max_bytes);

/** For tests: versions the copying freeze copied since creation, those
 * of copy passes (below) included. */
uint64_t sl_cow_map_freeze_copies(const sl_cow_map *map);

/** Freeze as sl_cow_map_freeze(), but a delta above the copying freeze's
 * limits and within the copy pass's (SL_COW_COPY_PASS_*) is copied after
 * the freeze, in steps (cow_map.c note 17): while sl_cow_map_copying(),
 * the caller must not hand the delta to another thread, and takes it
 * from sl_cow_map_pending() once the pass is over (the pass changes the
 * list's head).  O(1), or O(its versions) as sl_cow_map_freeze(). */
sl_cow_delta sl_cow_map_freeze_deferred(sl_cow_map *map);

/* cow_map.c note 17: the largest delta a copy pass copies. */
#define SL_COW_COPY_PASS_ENTRIES ((uint64_t)4 << 20)
#define SL_COW_COPY_PASS_BYTES ((uint64_t)256 << 20)

/** The limits of the copy pass (cow_map.c note 17); 0 and 0 turn it off.
 * Rollback turns it off too.  Owner thread. */
void sl_cow_map_set_copy_pass(sl_cow_map *map, uint64_t max_entries,
                              uint64_t max_bytes);

/** A copy pass is under way (cow_map.c note 17). */
bool sl_cow_map_copying(const sl_cow_map *map);

/** Copy up to budget versions of the pass under way; true while some are
 * left.  Owner thread. */
bool sl_cow_map_copy_step(sl_cow_map *map, uint32_t budget);

/** Finish the pass under way, if any, now. */
void sl_cow_map_copy_finish(sl_cow_map *map);

/** For tests: copy passes begun since creation. */
uint64_t sl_cow_map_copy_passes(const sl_cow_map *map);

/** For tests: bytes of the emptied arena chunk the map keeps for its next
 * one (cow_map.c note 16), counted in sl_cow_map_memory_bytes. */
uint64_t sl_cow_map_arena_spare_bytes(const sl_cow_map *map);

/** The frozen, not yet released deltas, oldest first: *count of them at
 * *deltas (owned by the map, valid until the next freeze or release).  A
 * checkpoint after an aborted one writes all of them (note 7).  Empty
 * deltas are kept too, unless memory ran out (cow_map.c note 5). */
void sl_cow_map_pending(const sl_cow_map *map, const sl_cow_delta **deltas,
                        int *count);

/** Every delta of epoch <= epoch is durable (note 7): its old versions may
 * be reclaimed.  Cheap; the freeing happens in sl_cow_map_maintain(). */
void sl_cow_map_release(sl_cow_map *map, uint32_t epoch);

/** Do a bounded amount of deferred work (reclaiming released versions, at
 * most budget entries).  Returns true if work remains. */
bool sl_cow_map_maintain(sl_cow_map *map, uint32_t budget);

/** Size an empty map's table for `entries` keys at once, so loading them
 * moves nothing (no rehash).  No effect on a map that holds keys.
 * Errors: ENOMEM (the map unaltered). */
int sl_cow_map_reserve(sl_cow_map *map, uint64_t entries);

struct sl_prefault;

/** Before a bulk load, after sl_cow_map_reserve: attach a helper thread
 * (storage/prefault.h, started by the caller) that faults in the table
 * and the load arena's next chunks ahead of the load (cow_map.c note 14);
 * entries: how many the load expects.  The table's lower half is faulted
 * in by this call.  The map holds up to 32 MiB of chunks ahead until sl_cow_map_load_finish(), which must follow
 * (also when no entry was added): it stops the helper and frees them; the
 * caller then destroys the helper.  NULL: nothing (no helper). */
void sl_cow_map_load_prefault(sl_cow_map *map, struct sl_prefault *helper,
                              uint64_t entries);

/** Insert a clean (epoch 0) entry while restoring, before any other write.
 * The key and value are copied before it returns.  Errors: ENOMEM; EINVAL
 * if the key is already present or a size exceeds SL_COW_MAX_BYTES.  On
 * error the map is unaltered.  Not allowed during a bulk load. */
int sl_cow_map_load(sl_cow_map *map, const void *key, uint32_t key_bytes,
                    const void *value, uint32_t value_bytes);

/* Entries a bulk load holds added but not yet linked into the table. */
#define SL_COW_LOAD_WINDOW 16u

/** Bulk load, the fast way to restore (note 9): add one clean (epoch 0)
 * entry.  Protocol, on a map with no write yet:
 *
 *     sl_cow_map_reserve(map, expected_entries);     // optional, advised
 *     for each entry, in (key_group, key) order:     // any order works
 *       if ((rc = sl_cow_map_load_add(map, key_group, k, kb, v, vb)) != 0)
 *         break;
 *     int finished = sl_cow_map_load_finish(map);    // always, even after
 *     rc = rc ? rc : finished;                       // an error
 *
 * key_group is any number the input is sorted by before the key (a
 * restore passes the store's key group).  While the map was empty at the
 * first add and every entry follows the one before in (key_group, key)
 * order — groups ascending, then keys as LMDB's default comparison orders
 * them: bytes over the shorter length, then the shorter first — no key can
 * repeat, so the costly duplicate probe is skipped.  An entry out of order
 * is no error: from it on, every entry is probed, which costs one more
 * cache miss each (1.5x to 4x the time in bench/cow_load_bench.c, still
 * faster than sl_cow_map_load()); duplicates are found either way.
 *
 * The key and value are copied before the call returns, so they need to be
 * valid only during it (an LMDB cursor's pointers do).  The entry becomes
 * visible in the table up to SL_COW_LOAD_WINDOW calls later, or in
 * sl_cow_map_load_finish(); in a staged load (cow_map.c note 18), when
 * the staging area next fills, when an entry too large to stage is
 * added, or in finish.  See the header's Caveats for what may be called
 * meanwhile.
 *
 * Errors: ENOMEM (this entry not added); EINVAL if a size exceeds
 * SL_COW_MAX_BYTES (this entry not added), or if an entry added earlier
 * repeats a key already loaded: that later copy is dropped, the first one
 * stays.  A duplicate is found when its entry is linked, i.e. by the add
 * SL_COW_LOAD_WINDOW calls after it (staged: by the add that fills the
 * area, or its own if it is too large to stage), or by
 * sl_cow_map_load_finish().
 *
 * In a staged load, ENOMEM for a version is found when its round is
 * linked, so it is reported late too, and that entry is lost; the round
 * goes on linking the rest (a later copy of the lost key among them
 * then stays).  The load has failed all the same.
 *
 * An error fails the bulk load for good (as a failed LMDB transaction): it
 * and every later sl_cow_map_load_add() and sl_cow_map_load_finish()
 * return it and add nothing more.  sl_cow_map_load_finish() must still be
 * called (or the map destroyed): it links what was added before the error,
 * so the map is consistent, though not a complete restore. */
int sl_cow_map_load_add(sl_cow_map *map, uint32_t key_group, const void *key,
                        uint32_t key_bytes, const void *value,
                        uint32_t value_bytes);

/** End a bulk load: link every entry still waiting, and return 0 or the
 * bulk load's error (sl_cow_map_load_add()).  Bounded work: at most
 * SL_COW_LOAD_WINDOW entries, or a staged load's area (cow_map.c note 18:
 * up to 1M entries, a round of the load).  Every call is allowed again
 * afterwards.
 * Calling it with no bulk load under way returns 0 (or the error of a
 * failed earlier one). */
int sl_cow_map_load_finish(sl_cow_map *map);

/** Visit every live entry (owner thread, no writes meanwhile).  Stops and
 * returns fn's value when it is nonzero.  Finishes a lazy rollback under
 * way first (note 10), in the writes it has left to undo. */
int sl_cow_map_foreach(sl_cow_map *map,
                       int (*fn)(void *arg, const sl_cow_entry *e),
                       void *arg);

/** What allocates the map's memory (storage/alloc.h): sets *name to
 * "jemalloc" or "malloc", and *allocated_bytes to the bytes jemalloc's
 * arena of this map holds (statistics refreshed by this call).  Returns
 * 0, or ENOTSUP when the map has no arena of its own (always so with
 * "malloc"; *allocated_bytes is then untouched).  Owner thread, or any
 * thread while the owner does not write; for tests. */
int sl_cow_map_allocator(const sl_cow_map *map, const char **name,
                         uint64_t *allocated_bytes);

/** "jemalloc" or "malloc": what serves keyed state in this build. */
const char *sl_cow_map_allocator_name(void);

/** Memory held by the map in bytes (entries of every version and the
 * tables), for statistics. */
uint64_t sl_cow_map_memory_bytes(const sl_cow_map *map);

/** Turn rollback on (note 10), from now to the map's destruction.  The
 * stable epoch becomes the last one frozen, so the map must have no write
 * since its last release (no dirty version, no pending delta): right
 * after create, a load, or a rollback.  Returns 0 (also if already on) or
 * EBUSY. */
int sl_cow_map_enable_rollback(sl_cow_map *map);

/** Whether rollback is on. */
bool sl_cow_map_rollback_enabled(const sl_cow_map *map);

/** The stable epoch (note 10): the newest epoch released, or the one
 * before the first write when rollback was turned on (0 for a new map). */
uint32_t sl_cow_map_stable_epoch(const sl_cow_map *map);

/** Return the map to its state as of the stable epoch, which epoch must
 * be (note 10): versions written since are out of the table (freed
 * later, a few by each write and by sl_cow_map_maintain()), the versions
 * they displaced are back in the table, pending deltas are gone (so no
 * writer may still read one) and the current epoch's dirty list is
 * empty; the map is as if loaded at that epoch's checkpoint.  If no key
 * was deleted since the stable epoch, the call is lazy (note 10): O(1) in
 * the writes since, which are undone key by key as the map is used, and
 * writes go on in a new epoch.  Otherwise it costs time and memory
 * traffic in the keys written since the stable epoch (and in the versions
 * written since, if keys were inserted since), and writes go on in the
 * current epoch.  A lazy rollback still under way is finished first (in
 * the writes since the previous one).  Returns 0; EINVAL (rollback off, a bulk load under
 * way, or epoch not the stable one), the map unaltered. */
int sl_cow_map_rollback(sl_cow_map *map, uint32_t epoch);

/* For tests: displaced versions the map keeps for rollback (those no
 * longer needed and not yet freed included), and rollbacks done since
 * creation. */
uint64_t sl_cow_map_undo_entries(const sl_cow_map *map);
uint64_t sl_cow_map_rollbacks(const sl_cow_map *map);
/* For tests: the versions every rollback since creation handled, each
 * one written or displaced since its stable epoch (cow_map_rollback.c
 * note 3): a rollback's work, which must not follow the state's size. */
uint64_t sl_cow_map_rollback_visits(const sl_cow_map *map);
/* For tests: the stale versions lazy rollbacks have settled since
 * creation, on first touch or in steps (cow_map_rollback.c note 5), and
 * whether a lazy rollback is still under way (note 6). */
uint64_t sl_cow_map_rollback_settled(const sl_cow_map *map);
bool sl_cow_map_rollback_pending(const sl_cow_map *map);

/** Whole-map consistency check for asserts and tests (walks everything).
 * Logs the first failed condition (an ERROR line, engine/log.h). */
bool sl_cow_map_check(const sl_cow_map *map);

/** For tests: versions a copy on write displaced whose retired mark still
 * waits for their epoch's release and the reclaim steps (cow_map.c note
 * 15). */
uint64_t sl_cow_map_retire_waiting(const sl_cow_map *map);

/** For tests: epochs whose dirty list lost its index (note 11) since the
 * map was created. */
uint64_t sl_cow_map_index_drops(const sl_cow_map *map);

/* For tests only: the allocation failure points that have a fallback
 * (the rollback's indexes, the waiting marks' arrays, the dirty list's
 * index), countdown-then-fail as in SQLite's test_vfs
 * (cow_map_rollback.c note 9).  Each one is a place where the map goes on
 * without the memory it asked for, by a slower way, and is otherwise
 * unreachable short of running out of memory. */
enum sl_cow_fail_point {
  /* A block of the undo list's index (cow_map_rollback.c note 4): the
   * index is dropped, a rollback follows the list and is not lazy. */
  SL_COW_FAIL_UNDO_INDEX_BLOCK,
  /* The lazy rollback's array of those blocks (cow_map_rollback.c note
   * 5): the rollback is done at once instead. */
  SL_COW_FAIL_LAZY_BLOCKS,
  /* An array of versions whose retired mark waits (cow_map.c note 15):
   * the version is marked at once instead. */
  SL_COW_FAIL_RETIRE_LATER,
  /* A block of the current dirty list's index (note 11): the epoch loses
   * its index; the writer and the reclaim walk follow the list instead
   * (cow_map.c note 13). */
  SL_COW_FAIL_DIRTY_INDEX_BLOCK,
  /* A copy of the copying freeze (cow_map.c note 16): the pass ends
   * there, and the versions after it are frozen the ordinary way. */
  SL_COW_FAIL_FREEZE_COPY,
  /* The staged bulk load's area (cow_map.c note 18): the load is not
   * staged. */
  SL_COW_FAIL_STAGE_AREA,
  SL_COW_FAIL_POINTS
};
/* For tests only: the nth allocation at point from now on (1: the next
 * one) fails, once, as if the allocator had returned NULL; 0 disarms it.
 * Owner thread (note 1). */
void sl_cow_map_test_fail_alloc(sl_cow_map *map, enum sl_cow_fail_point point,
                                uint32_t nth);

/* For tests: the most buckets a single operation's rehash step visited
 * since creation (at most SL_COW_STEP_MAX_BUCKETS, note 8). */
uint64_t sl_cow_map_max_step_buckets(const sl_cow_map *map);

/* For tests: the buckets of the map's table (the new one's while a rehash
 * is under way: cow_map.c note 6). */
uint64_t sl_cow_map_buckets(const sl_cow_map *map);

/* For tests: the bulk-loaded entries linked with the duplicate probe since
 * creation (the others were proved unique by their order). */
uint64_t sl_cow_map_load_probes(const sl_cow_map *map);

/* For tests and benchmarks: the settings of the staged bulk load
 * (cow_map.c note 18).  A bulk load into a table of at least min_buckets
 * buckets is staged: its entries are kept in an area of budget_bytes
 * (at most 1 GiB; the area adds half as much again for the sort's
 * arrays), and each time it is full they are linked in order of
 * partitions of region_buckets buckets (a power of two; at most
 * SL_COW_STAGE_MAX_PARTS partitions).  UINT64_MAX min_buckets: never
 * staged.  Not during a bulk load.  Defaults: SL_COW_STAGE_MIN_BUCKETS,
 * SL_COW_STAGE_REGION_BUCKETS, SL_COW_STAGE_BUDGET_BYTES. */
#define SL_COW_STAGE_MIN_BUCKETS (UINT64_C(1) << 24)
#define SL_COW_STAGE_REGION_BUCKETS (UINT64_C(1) << 12)
#define SL_COW_STAGE_BUDGET_BYTES (UINT64_C(16) << 20)
#define SL_COW_STAGE_MAX_PARTS 65536u
void sl_cow_map_set_load_stage(sl_cow_map *map, uint64_t min_buckets,
                               uint64_t region_buckets, uint64_t budget_bytes);

/* For tests: the bulk-loaded entries staged (cow_map.c note 18) since
 * creation, and the times staged entries were linked. */
uint64_t sl_cow_map_load_staged(const sl_cow_map *map);
uint64_t sl_cow_map_stage_links(const sl_cow_map *map);

#endif /* SL_COW_MAP_H */
