/* cow_map.c — the copy-on-write hash map of an instance's keyed state
 * (cow_map.h).
 *
 * NOTES ON THE IMPLEMENTATION (the header's notes 1-10 hold as well)
 *
 * 1. A version's state follows from its epoch; each state has one list:
 *
 *      epoch == map->epoch          CURRENT   on the current dirty list
 *      epoch of a pending delta     FROZEN    on that delta's list
 *      released, not yet walked     RELEASED  on the reclaim chain
 *      epoch == 0                   CLEAN     on no list (bulk-loaded
 *                                             ones may wait, not yet in
 *                                             the table, note 10)
 *      of a failed epoch after      STALE     on the lazy list
 *      a lazy rollback
 *
 *      CURRENT  --sl_cow_map_freeze()-->   FROZEN, or CLEAN when the
 *                                          freeze copies it (note 16)
 *      FROZEN   --sl_cow_map_release()-->  RELEASED
 *      RELEASED --reclaim_steps()-->       CLEAN if live, freed if retired
 *      CLEAN    --put/delete-->            CURRENT, in place
 *      FROZEN, RELEASED --put/delete-->    a new CURRENT version (or a
 *                                          tombstone); the old one retired
 *      CURRENT, FROZEN --lazy rollback-->  STALE
 *      STALE --first touch, lazy steps-->  out of the table, freed by
 *                                          the steps (cow_map_settle(),
 *                                          cow_map_rollback.c note 6)
 *
 *    So a version whose epoch is neither 0 nor current is always on a list
 *    that has not been walked past it yet.  With rollback on, CLEAN too is
 *    copied on write, and displaced versions are kept on the undo list
 *    until their displacement is stable (note 12).
 * 2. RELEASED versions are copied on write like FROZEN ones, not re-dirtied
 *    in place.  Re-dirtying would overwrite dirty_next, which the reclaim
 *    walk still has to follow.  The walk reads dirty_next before it turns a
 *    live version CLEAN (epoch 0); from then on the version is on no list
 *    and may be re-dirtied in place.  The cost is one extra copy for keys
 *    written between a release and the walk reaching them.
 * 3. Every version is freed exactly once, by entry_free(): a retired
 *    version that is on a list by the reclaim walk (or by destroy), a CLEAN
 *    one at once when a put of another size replaces it (it is on no list),
 *    a live one by destroy, a bulk-loaded duplicate when it is found.
 *    Retired CURRENT versions (superseded, deleted in place) stay on the
 *    current list, so they are reclaimed like any other.  For an arena
 *    version, freeing means one version fewer in its chunk (note 9); destroy
 *    does not even that, it frees the chunks whole, and stops walking the
 *    table once heap_versions (the malloc'd versions) reaches 0.
 * 4. The threading contract (header note 5) holds because the only writes
 *    to a FROZEN version are to chain_next (rehash, unlinking a neighbour,
 *    replacing it in its chain) and retired; value, epoch and dirty_next
 *    are written only in CURRENT or CLEAN versions and in RELEASED ones by
 *    the reclaim walk, which the writer no longer reads (header note 7).
 *    tombstone, superseded and retired are separate bytes, hence separate
 *    memory locations in C11: writing one never races with reading another.
 *    An arena version is freed at exactly the points a malloc'd one would
 *    be, and its chunk only when all of them are, so the writer never reads
 *    a freed chunk; chunk headers are the owner's alone.  A list's index
 *    blocks (header note 11) are written only while their epoch is
 *    current and freed only when it is released (or by rollback or
 *    destroy, when no writer reads), so the writer reads them as it reads
 *    the list.
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
 *    full when it ends: rehashes never overlap.  A table of fewer than
 *    COW_SMALL_TABLE_BUCKETS (2^16, 512 KiB) grows at a load of 1/2
 *    instead (n/2 entries), and is at most 3/8 full after.  There the
 *    chains are shorter for at most 256 KiB more: at load 1/2 to 1, a
 *    third to a half of lookups walk past the first entry of a chain, a
 *    mispredicted branch and another load each, 7% of P2's rate and 10%
 *    of P3's at 10K keys (pipeline_p2/_p3, 20M tuples, 8 and 6 runs
 *    alternated with the build before, medians 32.5 -> 34.9 and 38.9 ->
 *    42.6 M tuples/s; 2026-12-07; bench/README.md), while at the sizes
 *    whose bytes per entry count (bench/memory_bench.c) a load of 1 keeps
 *    the buckets at 8 to 16 bytes an entry.  A failed table allocation
 *    just postpones growth: chains get longer, nothing breaks.
 *    A table stops growing at COW_TABLE_MAX_BUCKETS (2^32, 32 GiB of
 *    buckets), so a version's 32-bit hash always places it.
 * 7. Memory accounting is exact, so sl_cow_map_check() can verify it.  A
 *    version deleted in place keeps its value storage; its size is kept in
 *    the first 4 bytes of the (unused) value area, which is why every
 *    version has a value area of at least 8 bytes.  Arena memory is counted
 *    by the chunk, ARENA_CHUNK_BYTES from its allocation to its free, and
 *    arena versions not at all: that is what the map holds from the
 *    allocator.
 * 8. Every put and delete reclaims up to RECLAIM_PER_WRITE versions.  A
 *    write adds at most one version to a list, so the reclaim chain drains
 *    even if sl_cow_map_maintain() is never called.
 * 9. The load arena.  A restore inserts millions of small versions at once,
 *    and one malloc each was about half the cost of sl_cow_map_load() (and
 *    of destroying the map).  So loaded
 *    versions up to ARENA_VERSION_MAX_BYTES are carved one after another
 *    out of chunks of ARENA_CHUNK_BYTES, aligned to their size, and marked
 *    `arena`.  Such a version is never passed to free(): entry_free() finds
 *    its chunk by masking the address and counts one version fewer there;
 *    the chunk is freed when its count reaches 0 (also the chunk being
 *    carved, which just makes the next load start a new one), or by
 *    destroy.  Nothing else changes for arena versions: they are updated in
 *    place, frozen, copied on write, deleted and reclaimed like any other.
 *    Loads carve, and so does a copying freeze (note 16), whose copies
 *    live until their epoch is released; so arena memory is what was
 *    restored, plus the copies of the pending epochs, plus one spare
 *    chunk (note 16), plus the ends of chunks a version did not fit in
 *    (under 1/64, as larger versions are malloc'd).  It shrinks by whole
 *    chunks only, so a chunk with one surviving version keeps all 4 MiB.
 *    The arena's code is in cow_map_arena.c.
 * 10. The bulk load.  Linking a loaded entry costs a cache miss on a
 *    random bucket, and the duplicate probe (find_link()) another on the
 *    entry the bucket points to, if any.  sl_cow_map_load_add() copies the
 *    entry into the arena, prefetches its bucket and puts it in a ring of
 *    SL_COW_LOAD_WINDOW entries; when the ring is full the oldest entry is
 *    linked as sl_cow_map_load() would link it (rehash step, probe,
 *    insert), its bucket in cache by then.  So up to SL_COW_LOAD_WINDOW
 *    misses are in flight instead of one.  Entries are linked in the order
 *    they were added, so the later of two duplicates is the one found, as
 *    with sl_cow_map_load().
 *    The probe's miss is skipped where order proves there is no duplicate:
 *    a restore reads the store in (key group, key) order, and keys that
 *    strictly ascend cannot repeat.  So while every entry follows the one
 *    before it (load_follows(): one comparison with a key still in cache)
 *    and the map held no key when the load began, entries are linked
 *    unprobed (asserted in debug builds).  The first entry out of order
 *    ends that for the rest of the load: it and every later one are probed,
 *    against everything linked before, which keeps the duplicate check
 *    exact.  Probed entries get their bucket read half way through the
 *    ring and the entry it points to prefetched.  On this machine the
 *    probe's miss, even prefetched, cost as much as everything else.
 *    The ring holds CLEAN versions in no table and on no list; destroy and
 *    the checker know them.
 * 11. The allocator.  Every allocation of the map — versions, load arena
 *    chunks, bucket tables, pending arrays and the map itself — goes
 *    through m->alloc (storage/alloc.h), opened by create and closed by
 *    destroy, and nothing else allocates there.  When it is a jemalloc
 *    arena of the map's own (sl_alloc_resettable()), destroy frees nothing
 *    one by one: closing the arena discards it all, which is what makes
 *    dropping a failed attempt's state cheap (engine/failover.c).
 *    Otherwise (malloc builds, or no arena left) destroy walks as in note
 *    3.  The map's memory accounting (note 7) is the same either way.
 * 12. Rollback (header note 10; the rollback itself is in
 *    cow_map_rollback.c, the checker in cow_map_check.c, both over
 *    cow_map_internal.h).  The stable epoch S is the newest released one.
 *    With rollback on, a write never changes a version of an epoch before
 *    the current one: CLEAN versions are copied on write too (in_place()),
 *    and the displaced version — whatever its epoch: a FROZEN one becomes
 *    part of the stable state once its epoch is released — is marked
 *    RETIRED_UNDO and appended to the undo list, linked through chain_next
 *    (free once a version leaves the table), so dirty_next still serves
 *    its epoch's list, and to the undo list's index, an array of the same
 *    versions by append number that the rollback reads instead of the
 *    list (cow_map_rollback.c note 4).  A version is displaced once (it leaves the table),
 *    so it is on the undo list at most once.  Each pending slot records
 *    the undo list's append count and last version at its freeze
 *    (undo_mark, undo_last); releasing epoch e makes the appends up to e's
 *    mark obsolete (the displacing writes are now stable themselves): that
 *    prefix of the undo list moves whole, in O(1), to the obsolete list,
 *    which reclaim_steps() pops in bounded steps: a CLEAN one (on no other
 *    list) is freed, one still on the reclaim chain becomes RETIRED_FREE
 *    for the walk to free; the walk turns a RETIRED_UNDO version it passes
 *    CLEAN (epoch 0) and leaves it to its undo list.  So a version is
 *    freed once, as in note 3.
 *    Why the undo list holds exactly the stable state's lost versions: a
 *    key's version in the state as of S is its newest of epoch <= S; if a
 *    write after S displaced it, that write was the first after S to the
 *    key, and its mark is above S's, so the version is still on the list;
 *    any other version of the key on the list has an epoch > S.  Rollback
 *    leaves the obsolete list to the reclaim steps (walking it would cost
 *    time in the writes before S), walks the undo list once, putting each
 *    version of epoch <= S in its key's place in the table, unlinks the
 *    keys inserted since S only if there are some (the table holds more
 *    than stable_live_keys, the keys live at S: each freeze records the
 *    count in its pending slot, each release takes it from the newest
 *    slot it releases), and sets the current and pending lists aside
 *    whole on the dropped list, which reclaim_steps() frees in bounded
 *    steps (cow_map_rollback.c, notes 1-2).  That is when a key was
 *    deleted since S; otherwise it does none of that at once, but marks
 *    the epochs after S stale and undoes each key on its first touch,
 *    through the displaced number every write sets, and the rest in the
 *    same bounded steps (cow_map_rollback.c notes 5-7); every lookup
 *    pays one compare for it.
 * 13. The reclaim walk fetches ahead.  It follows the chain, and each
 *    link is a miss once the state outgrows the cache: at 1M keys with
 *    a checkpoint every 100 ms, the four steps every write takes were
 *    about 8% of the keyed thread's CPU (checkpoint_bench part 1, perf:
 *    the loads of dirty_next), and a RELEASED version the walk has not
 *    reached is copied on write (note 2).  So release keeps a released
 *    list's index (header note 11) instead of freeing it, appended to
 *    the reclaim index in chain order, and each step fetches the version
 *    RECLAIM_AHEAD positions further on.  The walk itself still follows
 *    the chain (the index only says where it will go; debug builds check
 *    that it does) and frees each index block when it leaves it.  A
 *    released list without an index stops the fetching until the chain
 *    has drained: the positions would no longer match.
 * 14. Pre-faulting (sl_cow_map_load_prefault, cow_map_arena.c notes 1-3):
 *    a helper thread faults in the table and the arena chunks a bulk
 *    load will write next, on another CPU; sl_cow_map_load_finish stops
 *    it and frees the chunks it held ahead.
 * 15. A copy on write leaves the version it displaces alone (without
 *    rollback).  The first write to a key after a freeze copies its
 *    FROZEN version (note 1) and used to mark the displaced one
 *    RETIRED_FREE and clear its chain_next right away.  But the
 *    checkpoint writer reads the frozen versions on another CPU at that
 *    very time, so each of those writes took a cache line back from it:
 *    one more miss for every first write in the millisecond or two after
 *    a barrier, when every hot key is written again (bench/README.md,
 *    cow_write_bench: about twice the first writes' cost at 10,000 keys,
 *    and gone when the marks were written later).  So without rollback a
 *    displaced version of a pending epoch is only noted, in its epoch's
 *    slot (cow_pending_end.later); its chain_next keeps its old value,
 *    which nothing follows once the version is out of the table.  When
 *    the epoch is released its notes join the marking queue, and the
 *    reclaim steps write the marks (RETIRED_FREE, chain_next 0) before
 *    they walk the reclaim chain any further, so the walk never meets a
 *    displaced version unmarked.  A RELEASED version the walk has not
 *    reached yet is marked at once when it is displaced, as before: the
 *    writer is done with it, and noting it would only hold the walk
 *    back (memory_bench's peak grew by about 60,000 versions at 1M keys
 *    when it did: the marks took the walk's budget, so more keys were
 *    copied before the walk made them CLEAN).  The marks have a budget
 *    of their own in each step.  If an array cannot grow, the version is
 *    marked at once, as before (SL_COW_FAIL_RETIRE_LATER makes that
 *    happen in a test, cow_map_rollback.c note 9).  An array stops
 *    growing at LATER_MAX notes (128 KiB), and later versions are marked
 *    at once too: 8 bytes a displaced version made the peak memory of a
 *    checkpoint that froze and rewrote every key of 10M 10% larger
 *    (memory_bench), while the cost it saves is that of states small
 *    enough to stay in cache (at 1M keys cow_write_bench showed none).
 *    The marks then cost a miss each where the steps run, spread over the
 *    writes after the release, not piled onto the first writes after the
 *    barrier.  With rollback on, the undo list needs the mark and
 *    the link at the write (note 12); that path still writes them there.
 * 16. The copying freeze.  When every key of a small state is written
 *    again within a millisecond or two of a barrier (latency_bench: 10,000
 *    keys, millions of records a second), the copies on write of note 1,
 *    their allocations, the dirty list's appends and the displaced
 *    versions' marks all land on the records due right after the
 *    barrier: at 50% load the p99 with checkpoints every 100 ms was 5.6
 *    to 18 times the p99 without (bench/README.md).  So a freeze whose
 *    current list holds at most freeze_copy_entries versions, with at
 *    most freeze_copy_bytes of keys and values (SL_COW_FREEZE_COPY_ENTRIES
 *    and _BYTES by default: 16,384 and 1 MiB), copies the live ones
 *    itself, in one pass (freeze_by_copy):
 *    - each copy takes its version's place on the list and in the index,
 *      as a version that a copy on write displaced, already marked
 *      (RETIRED_FREE, chain_next 0: nobody else has seen it yet);
 *    - the version itself becomes CLEAN, in the table and on no list, so
 *      the writes after the barrier go in place, as in an epoch's first
 *      write to a key (one dirty_append);
 *    - retired versions on the list (superseded, deleted in place) are
 *      out of the table already and stay as they are.
 *    The writer reads the copies as it reads displaced versions, and the
 *    reclaim walk frees them after the release.  They are carved from
 *    arena chunks (note 9), one memcpy each of header, key and value,
 *    and a chunk that the reclaim empties is kept as the map's one spare
 *    (arena_spare, still counted in memory_bytes) for the next chunk,
 *    instead of freed: a fresh chunk's page faults cost about 190 us a
 *    barrier.  A copy that cannot be had ends the pass, and the versions
 *    after it are frozen the ordinary way.  With rollback on (note 12) a
 *    freeze never copies: a CLEAN version counts as part of the stable
 *    state, and these would hold values of an epoch not yet released.
 *    The cost is a pause at the barrier: 55-90 us of the keyed thread's
 *    CPU at 10,000 keys (bench/barrier_profile.py), against 0.5 to 2 ms
 *    of extra work spread over the first milliseconds after it before.
 *    The limits keep the pause short and the copies' memory small; a
 *    larger delta is frozen the ordinary way.
 *    The copies are carved from arena memory last written a checkpoint
 *    or more before, out of the caches, so every copy waited for its
 *    line to be fetched for writing.  A copy now fetches the arena
 *    COPY_CARVE_AHEAD (2 KiB) ahead for writing, and the versions
 *    COPY_AHEAD ahead through the index, as the copy pass (note 17)
 *    does.  The freeze in latency_bench (10,000 keys, uprobes on
 *    sl_cow_map_freeze_deferred, 57 freezes a run): p50 179-188 us
 *    before, 105-111 us with both, 126 us with the arena's fetch only,
 *    168 us with the versions' only; 512 bytes ahead gave 120 us, 1 and
 *    4 KiB 109-114 us (2026-12-07).  The copy pass gained too
 *    (pipeline_p2 --keys 1000000, checkpoints every 100 ms against none,
 *    5 runs alternated with the build before: 0.73 to 0.81).
 * 17. The copy pass: the copying freeze in steps, for larger deltas.
 *    With 1M keys and a checkpoint every 100 ms, about 600,000 keys are
 *    written in each interval, and each first write after a barrier
 *    copied its FROZEN version: an allocation, a new version's page
 *    faults, the copy, and later a free; with the checkpoint writer
 *    reading in between (checkpoint_bench part 1: 0.55-0.72 of the speed
 *    without checkpoints).  Copying such a delta at the freeze, as note
 *    16 does, costs a few ns a version but pauses the barrier for
 *    milliseconds (600,000 versions).  sl_cow_map_freeze_deferred
 *    therefore freezes as usual and leaves a delta above note 16's
 *    limits, and within SL_COW_COPY_PASS_ENTRIES and _BYTES, to a pass
 *    that the owner runs in bounded steps (sl_cow_map_copy_step) between
 *    records, doing to each live version of the list what note 16 does:
 *    a copy takes its place on the list and in the index, and the
 *    version becomes CLEAN.  The list is the owner's until the pass is
 *    over: the caller hands the delta to the writer only then
 *    (snapshot.c note 14), so nobody reads what the pass changes.  A
 *    write to a version the pass has not reached copies it on write as
 *    before, and marks the displaced version at once (retire_displaced;
 *    note 15's reason to wait, the writer reading it, does not hold yet),
 *    so the pass tells a version still in the table by its mark alone and
 *    skips the others.  The pass fetches COPY_AHEAD versions ahead through
 *    the index.  A freeze or a release of its epoch finishes a pass under
 *    way first; rollback (retain) never has one.  A copy that cannot be
 *    had ends the pass: the rest stay frozen, copied on write.  The
 *    user's bound on a pass, or no pass at all, is
 *    sl_job_config.checkpoint_copy_pass_bytes (sl_cow_map_set_copy_pass,
 *    called by engine/restore.c).
 * 18. The staged bulk load.  Note 10's ring hides a bucket's miss, but not
 *    the page walk of a table larger than the TLB reaches: at 10M keys
 *    (16M buckets, 128 MB) the restoring thread spent most of its time on
 *    the bucket's prefetch (perf, 2026-12-07), where at 1M keys a load
 *    runs at about three times the rate per entry.  Loading keys in bucket
 *    order instead cut the loading thread's CPU time about threefold in a
 *    test program, so a load into a table of stage_min_buckets or more
 *    (SL_COW_STAGE_MIN_BUCKETS, 16M) is staged: sl_cow_map_load_add()
 *    appends the entry's hash, sizes, key and value to an area of
 *    stage_budget bytes (SL_COW_STAGE_BUDGET_BYTES, 16 MiB, and 8 MiB more
 *    for the sort's arrays, allocated once for the load, so no fresh
 *    memory after its first round) and counts
 *    it in its partition, a range of stage_region_buckets buckets (4096,
 *    32 KB of table).  When the area is full, and in finish, the records
 *    are sorted by partition (a counting sort of their offsets, stable,
 *    so within a partition they keep the order they were added in) and
 *    linked in that order, records and buckets fetched ahead.  Each round
 *    thus sweeps the table once, a page at a time, instead of jumping
 *    anywhere for every entry (while the table keeps its size: the
 *    partitions are those of the table the load began with, and if more
 *    entries come than it was reserved for, it grows, and linking moves
 *    buckets as any load does, in a less orderly sweep).  Versions are
 *    carved when their round links them, so the arena is written in
 *    order as before.  The probe
 *    and the order proof are note 10's: each record carries whether it is
 *    to be probed, and a partition's records are linked in the order they
 *    were added, so the first of two copies stays.  A duplicate is found
 *    when its round is linked: by the add that filled the area, or by
 *    finish.  An entry larger than the area is linked at once, after
 *    everything staged.  Without memory for the area, the load runs
 *    unstaged.  Below 16M buckets the table's pages stay within reach and
 *    staging only adds the copy: at 2M keys (4M buckets) it was 1.3x
 *    slower, at 4M keys even, at 10M keys 1.3x to 3x faster
 *    (bench/cow_load_bench.c measures both ways).
 */
#include "cow_map.h"
#include "key_order.h"

#include <assert.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* XXH3 hashes keys outside 8..16 bytes (cow_map.h, sl_cow_hash), compiled
 * into this file rather than called through the PLT. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "alloc.h"
#include "cow_map_internal.h"
#include "log.h"
#include "sluice.h"

/* Note 6: tables smaller than this grow at a load factor of 1/2. */
#define COW_SMALL_TABLE_BUCKETS (UINT64_C(1) << 16)
#define REHASH_BUCKETS_PER_STEP 4u
/* Empty buckets one step may visit (Redis's n*10), so a sparse stretch of
 * the old table cannot make one call slow. */
#define REHASH_EMPTY_VISITS (REHASH_BUCKETS_PER_STEP * 10u)
#define RECLAIM_PER_WRITE 4u
/* The first size of an array of versions whose mark waits, and the most
 * it grows to (note 15): 128 KiB of notes; past that, marked at once. */
#define LATER_INITIAL 256u
#define LATER_MAX 16384u
/* How far ahead of the marks their versions are fetched (note 15). */
#define MARKING_AHEAD 16u
/* Note 13: how far ahead of the reclaim walk versions are fetched: four
 * writes' worth of steps. */
#define RECLAIM_AHEAD 16u
#define INITIAL_PENDING 4u

_Static_assert(sizeof(sl_cow_entry) == 40, "header size of cow_map.h's note");
_Static_assert((INITIAL_BUCKETS & (INITIAL_BUCKETS - 1)) == 0,
               "bucket counts are powers of two");
_Static_assert(REHASH_BUCKETS_PER_STEP + REHASH_EMPTY_VISITS ==
                   SL_COW_STEP_MAX_BUCKETS,
               "the header quotes the per-operation bound");
_Static_assert(SL_COW_MAX_BYTES <= UINT32_MAX - 7u,
               "sl_cow_value_offset cannot overflow");
_Static_assert((ARENA_CHUNK_BYTES & (ARENA_CHUNK_BYTES - 1)) == 0,
               "chunks are found by masking: a power of two");
_Static_assert((SL_COW_LOAD_WINDOW & (SL_COW_LOAD_WINDOW - 1)) == 0 &&
                   SL_COW_LOAD_WINDOW >= 2,
               "the load ring is indexed with a mask, its middle is used");


_Static_assert(sizeof(arena_chunk) % 8 == 0, "versions are 8-byte aligned");
_Static_assert(ARENA_VERSION_MAX_BYTES <=
                   ARENA_CHUNK_BYTES - sizeof(arena_chunk),
               "an arena version fits an empty chunk");


/* ------------------------------------------------------------ versions */

uint64_t sl_cow_hash(const void *key, uint32_t key_bytes) {
  return sl_cow_key_of(key, key_bytes).hash;
}

uint64_t sl_cow_hash_long(const void *key, uint32_t key_bytes) {
  return XXH3_64bits(key_bytes ? key : "", key_bytes);
}

static inline uint64_t key_hash(const void *key, uint32_t key_bytes) {
  return sl_cow_key_of(key, key_bytes).hash;
}

static uint8_t *value_area(sl_cow_entry *e) {
  return e->data + sl_cow_value_offset(e->key_bytes);
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

/* Header and key of a new version; no list, no table, no marks. */
static void entry_init(sl_cow_entry *e, uint64_t hash, uint32_t epoch,
                       const void *key, uint32_t key_bytes,
                       uint32_t value_bytes) {
  memset(e, 0, sizeof *e);
  e->hash = (uint32_t)hash; /* the low half: cow_map.h */
  e->epoch = epoch;
  e->key_bytes = key_bytes;
  e->value_bytes = value_bytes;
  if (key_bytes)
    memcpy(e->data, key, key_bytes);
}

/* A malloc'd version in the current epoch.  NULL on ENOMEM. */
static sl_cow_entry *entry_new(sl_cow_map *m, uint64_t hash, const void *key,
                               uint32_t key_bytes, uint32_t value_bytes) {
  assert(key_bytes <= SL_COW_MAX_BYTES);
  assert(value_bytes <= SL_COW_MAX_BYTES);
  uint64_t bytes = entry_alloc_bytes(key_bytes, value_bytes);
  if (bytes > SIZE_MAX)
    return 0;
  sl_cow_entry *e = sl_alloc_bytes(&m->alloc, (size_t)bytes);
  if (!e)
    return 0;
  entry_init(e, hash, m->epoch, key, key_bytes, value_bytes);
  m->memory_bytes += bytes;
  m->heap_versions++;
  return e;
}

/* A new CLEAN version (epoch 0, in no table, on no list) holding key and a
 * copy of value: carved out of the arena unless it is large (note 9).
 * NULL on ENOMEM. */
static sl_cow_entry *clean_version_new(sl_cow_map *m, uint64_t hash,
                                       const void *key, uint32_t key_bytes,
                                       const void *value,
                                       uint32_t value_bytes) {
  uint64_t bytes = entry_alloc_bytes(key_bytes, value_bytes);
  sl_cow_entry *e;
  if (bytes <= ARENA_VERSION_MAX_BYTES) {
    e = cow_arena_carve(m, bytes);
    if (!e)
      return 0;
    entry_init(e, hash, 0, key, key_bytes, value_bytes);
    e->arena = 1;
  } else {
    e = entry_new(m, hash, key, key_bytes, value_bytes);
    if (!e)
      return 0;
    e->epoch = 0;
  }
  fill_value(value_area(e), value_bytes, value, 0, 0);
  return e;
}

/* Free a version (note 3); an arena one only leaves its chunk (note 9). */
static void entry_free(sl_cow_map *m, sl_cow_entry *e) {
  if (e->arena) {
    arena_chunk *c = chunk_of(e);
    assert(c->owner == m);
    assert(c->versions > 0);
    if (--c->versions == 0)
      cow_arena_chunk_free(m, c);
    return;
  }
  uint64_t bytes = entry_alloc_bytes(e->key_bytes, entry_capacity(e));
  assert(m->memory_bytes >= bytes);
  assert(m->heap_versions > 0);
  m->memory_bytes -= bytes;
  m->heap_versions--;
  sl_alloc_free(&m->alloc, e, (size_t)bytes);
}

/* Turn a version (out of the table, not frozen) into a tombstone in place,
 * keeping the size of its value storage for entry_capacity(). */
static void entry_make_tombstone(sl_cow_entry *e) {
  assert(!e->tombstone);
  uint32_t capacity = e->value_bytes;
  memcpy(value_area(e), &capacity, 4);
  e->value_bytes = 0;
  e->tombstone = 1;
  e->retired = RETIRED_FREE;
}

void cow_map_free_index(sl_cow_map *m, const sl_cow_index_block *index,
                        uint64_t entries) {
  /* A list of n versions has at most n / SL_COW_INDEX_BLOCK + 1 blocks. */
  for (uint64_t b = 0; index && b <= entries / SL_COW_INDEX_BLOCK; b++) {
    /* The map's own memory: const only to the writer, which reads it. */
    sl_cow_index_block *block = (sl_cow_index_block *)index;
    index = block->next;
    assert(m->memory_bytes >= sizeof *block);
    m->memory_bytes -= sizeof *block;
    sl_alloc_free(&m->alloc, block, sizeof *block);
  }
  assert(index == 0);
}

/* Append e to the current dirty list's index (header note 11).  If no
 * block can be had, the epoch loses its index (the writer then follows
 * the list); the write itself goes on. */
static void index_append(sl_cow_map *m, sl_cow_entry *e) {
  if (m->index_dropped)
    return;
  sl_cow_index_block *block = m->index_tail;
  if (!block || block->count == SL_COW_INDEX_BLOCK) {
    sl_cow_index_block *fresh =
        cow_test_alloc_fails(m, SL_COW_FAIL_DIRTY_INDEX_BLOCK)
            ? 0
            : sl_alloc_bytes(&m->alloc, sizeof *fresh);
    if (!fresh) {
      cow_map_free_index(m, m->index_head, m->dirty_entries);
      m->index_head = m->index_tail = 0;
      m->index_dropped = true;
      m->index_drops++;
      return;
    }
    m->memory_bytes += sizeof *fresh;
    fresh->next = 0;
    fresh->count = 0;
    if (block)
      block->next = fresh; /* CURRENT, so not read by the writer */
    else
      m->index_head = fresh;
    m->index_tail = block = fresh;
  }
  block->versions[block->count++] = e;
}

void cow_map_undo_index_clear(sl_cow_map *m) {
  sl_cow_index_block *block = m->undo_index_head;
  while (block) {
    sl_cow_index_block *next = block->next;
    assert(m->memory_bytes >= sizeof *block);
    m->memory_bytes -= sizeof *block;
    sl_alloc_free(&m->alloc, block, sizeof *block);
    block = next;
  }
  m->undo_index_head = m->undo_index_tail = 0;
  m->undo_index_dropped = false;
}

/* Append v, the undo list's version number undo_pushed, to the undo
 * list's index (cow_map_rollback.c note 4).  Without a block the index is
 * dropped until the undo list is empty again; the write goes on. */
static void undo_index_append(sl_cow_map *m, sl_cow_entry *v) {
  if (m->undo_index_dropped)
    return;
  sl_cow_index_block *block = m->undo_index_tail;
  if (!block || block->count == SL_COW_INDEX_BLOCK) {
    sl_cow_index_block *fresh =
        cow_test_alloc_fails(m, SL_COW_FAIL_UNDO_INDEX_BLOCK)
            ? 0
            : sl_alloc_bytes(&m->alloc, sizeof *fresh);
    if (!fresh) {
      cow_map_undo_index_clear(m);
      m->undo_index_dropped = true;
      return;
    }
    m->memory_bytes += sizeof *fresh;
    fresh->next = 0;
    fresh->count = 0;
    if (block) {
      block->next = fresh;
    } else {
      m->undo_index_head = fresh;
      m->undo_index_base = m->undo_pushed;
    }
    m->undo_index_tail = block = fresh;
  }
  block->versions[block->count++] = v;
}

/* After a release: free the undo index's blocks whose versions are all
 * below undo_releasable (off the undo list), and end a dropped index once
 * the undo list is empty (cow_map_rollback.c note 4). */
static void undo_index_trim(sl_cow_map *m) {
  sl_cow_index_block *block = m->undo_index_head;
  while (block && m->undo_index_base + block->count <= m->undo_releasable) {
    sl_cow_index_block *next = block->next;
    m->undo_index_base += block->count;
    assert(m->memory_bytes >= sizeof *block);
    m->memory_bytes -= sizeof *block;
    sl_alloc_free(&m->alloc, block, sizeof *block);
    block = next;
  }
  m->undo_index_head = block;
  if (!block)
    m->undo_index_tail = 0;
  if (m->undo_index_dropped && m->undo_releasable == m->undo_pushed)
    m->undo_index_dropped = false;
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
  index_append(m, e); /* before the count: it frees by it on failure */
  m->dirty_entries++;
  m->dirty_bytes += (uint64_t)e->key_bytes + e->value_bytes;
}

/* A write may add to the dirty list only if freeze will have a pending
 * slot for it (note 5). */
static bool dirty_slot_ready(const sl_cow_map *m) {
  return m->dirty_head != 0 || m->pending_count < m->pending_capacity;
}

/* Whether a write to old may change it in place: a CURRENT version, or a
 * CLEAN one unless rollback keeps committed versions (note 12). */
static inline bool in_place(const sl_cow_map *m, const sl_cow_entry *old) {
  return old->epoch == m->epoch || (old->epoch == 0 && !m->retain);
}

/* ------------------------------------------- marks that wait (note 15) */

/* The retired mark of a displaced version without rollback: the reclaim
 * walk frees it when it reaches it. */
static inline void mark_retired(sl_cow_entry *v) {
  v->chain_next = 0;
  v->retired = RETIRED_FREE;
}

/* Make room for one more version in an array of *count of *capacity,
 * doubling it.  false: no memory (the array unchanged). */
static bool later_room(sl_cow_map *m, sl_cow_entry ***array, uint64_t *count,
                       uint64_t *capacity) {
  if (*count < *capacity)
    return true;
  if (*capacity >= LATER_MAX)
    return false; /* note 15: a large delta marks the rest at once */
  uint64_t grown = *capacity ? *capacity * 2 : LATER_INITIAL;
  sl_cow_entry **fresh =
      cow_test_alloc_fails(m, SL_COW_FAIL_RETIRE_LATER)
          ? 0 : sl_alloc_bytes(&m->alloc, (size_t)grown * sizeof *fresh);
  if (!fresh)
    return false;
  if (*count)
    memcpy(fresh, *array, *count * sizeof *fresh);
  if (*array)
    sl_alloc_free(&m->alloc, *array, (size_t)*capacity * sizeof **array);
  m->memory_bytes += (grown - *capacity) * sizeof *fresh;
  *array = fresh;
  *capacity = grown;
  return true;
}

/* Put v on the marking queue; false if the queue cannot grow. */
static bool marking_push(sl_cow_map *m, sl_cow_entry *v) {
  if (m->marking_done == m->marking_count) {
    m->marking_done = m->marking_count = 0; /* empty: start over */
  } else if (m->marking_count == m->marking_capacity && m->marking_done) {
    /* Full, with marks done at its front: reuse their room. */
    m->marking_count -= m->marking_done;
    memmove(m->marking, m->marking + m->marking_done,
            m->marking_count * sizeof *m->marking);
    m->marking_done = 0;
  }
  if (!later_room(m, &m->marking, &m->marking_count, &m->marking_capacity))
    return false;
  m->marking[m->marking_count++] = v;
  return true;
}

/* Note 15: note old, displaced from the table by a write of the current
 * epoch without rollback, for its mark to be written later.  false: no
 * memory to note it (the caller marks it now). */
static bool retire_later(sl_cow_map *m, sl_cow_entry *old) {
  assert(!m->retain && old->epoch != 0 && old->epoch != m->epoch);
  assert(!old->retired); /* displaced once: noted once, marked once */
  if (old->epoch <= m->stable_epoch)
    return false; /* RELEASED: the writer is done with it, mark it now */
  for (uint32_t i = 0; i < m->pending_count; i++) {
    if (m->pending[i].epoch != old->epoch)
      continue;
    cow_pending_end *slot = &m->pending_tails[i];
    if (!later_room(m, &slot->later, &slot->later_count,
                    &slot->later_capacity))
      return false;
    slot->later[slot->later_count++] = old;
    return true;
  }
  assert(!"a FROZEN version's epoch has a pending slot");
  return false;
}

/* Free an array of versions whose marks waited. */
static void later_free(sl_cow_map *m, sl_cow_entry **array, uint64_t capacity) {
  if (!array)
    return;
  assert(m->memory_bytes >= capacity * sizeof *array);
  m->memory_bytes -= capacity * sizeof *array;
  sl_alloc_free(&m->alloc, array, (size_t)capacity * sizeof *array);
}

/* A released slot's notes join the marking queue (its array, if the
 * queue is empty; else one by one, marked at once where it cannot grow). */
static void marking_take(sl_cow_map *m, cow_pending_end *slot) {
  if (slot->later_count && m->marking_done == m->marking_count) {
    later_free(m, m->marking, m->marking_capacity);
    m->marking = slot->later;
    m->marking_count = slot->later_count;
    m->marking_capacity = slot->later_capacity;
    m->marking_done = 0;
  } else {
    for (uint64_t i = 0; i < slot->later_count; i++)
      if (!marking_push(m, slot->later[i]))
        mark_retired(slot->later[i]);
    later_free(m, slot->later, slot->later_capacity);
  }
  slot->later = 0;
  slot->later_count = slot->later_capacity = 0;
}

/* Write up to budget of the marking queue's marks; returns how many.
 * The queue's versions are scattered over the state: each one is fetched
 * (for writing) MARKING_AHEAD marks before its turn, so that once the
 * state outgrows the cache the misses overlap instead of queueing, as in
 * the reclaim walk (note 13), which then finds them in cache. */
static uint32_t marking_steps(sl_cow_map *m, uint32_t budget) {
  uint32_t done = 0;
  for (; done < budget && m->marking_done < m->marking_count; done++) {
    if (m->marking_done + MARKING_AHEAD < m->marking_count)
      PREFETCH(m->marking[m->marking_done + MARKING_AHEAD], 1);
    mark_retired(m->marking[m->marking_done++]);
  }
  if (m->marking_done == m->marking_count && m->marking) {
    /* Emptied: its memory goes back, so an idle map holds none. */
    later_free(m, m->marking, m->marking_capacity);
    m->marking = 0;
    m->marking_done = m->marking_count = m->marking_capacity = 0;
  }
  return done;
}

/* Every waiting mark, now: the pending slots' and the queue's. */
static void marks_finish(sl_cow_map *m) {
  for (uint32_t i = 0; i < m->pending_count; i++) {
    cow_pending_end *slot = &m->pending_tails[i];
    for (uint64_t k = 0; k < slot->later_count; k++)
      mark_retired(slot->later[k]);
    later_free(m, slot->later, slot->later_capacity);
    slot->later = 0;
    slot->later_count = slot->later_capacity = 0;
  }
  while (m->marking_done < m->marking_count) /* a step: at most 2^32 - 1 */
    marking_steps(m, UINT32_MAX);
}

uint64_t sl_cow_map_index_drops(const sl_cow_map *m) {
  assert(m);
  return m->index_drops;
}

uint64_t sl_cow_map_retire_waiting(const sl_cow_map *m) {
  assert(m);
  uint64_t n = m->marking_count - m->marking_done;
  for (uint32_t i = 0; i < m->pending_count; i++)
    n += m->pending_tails[i].later_count;
  return n;
}

/* old (not CURRENT) was just displaced from the table by a write of the
 * current epoch: without rollback it is retired (and a CLEAN one, on no
 * list, freed at once: note 3); with rollback it goes on the undo list
 * (note 12), whatever its epoch. */
static void retire_displaced(sl_cow_map *m, sl_cow_entry *old) {
  assert(old->epoch != m->epoch && !old->retired);
  if (!m->retain) {
    if (old->epoch == 0)
      entry_free(m, old);
    else if (old->epoch == m->copy_epoch || !retire_later(m, old))
      mark_retired(old); /* stays, unchanged, on its list (note 17) */
    return;
  }
  old->retired = RETIRED_UNDO;
  old->chain_next = 0; /* out of the table: chain_next links the undo list */
  if (m->undo_tail)
    m->undo_tail->chain_next = old;
  else
    m->undo_head = old;
  m->undo_tail = old;
  undo_index_append(m, old);
  m->undo_pushed++;
}

/* ------------------------------------------------------------ tables */

/* Whether e holds key k.  Keys of 8 to 16 bytes (keyed state's are 11 and
 * up) are compared as their two words (cow_map.h), without a call to
 * memcmp and without reading the caller's bytes. */
static inline bool key_matches(const sl_cow_entry *e, const sl_cow_key *k) {
  if (e->hash != (uint32_t)k->hash || e->key_bytes != k->key_bytes)
    return false;
  if (k->key_bytes >= 8 && k->key_bytes <= 16) {
    uint64_t first, last;
    memcpy(&first, e->data, 8);
    memcpy(&last, e->data + k->key_bytes - 8, 8);
    return ((first ^ k->first) | (last ^ k->last)) == 0;
  }
  return k->key_bytes == 0 || memcmp(e->data, k->bytes, k->key_bytes) == 0;
}

/* The link (bucket slot or chain_next) that points at k's entry, and the
 * table it is in; NULL if absent.  Inline: it is most of a lookup. */
static inline sl_cow_entry **find_key(const sl_cow_map *m, const sl_cow_key *k,
                                      int *table_index) {
  int tables = m->rehashing ? 2 : 1;
  for (int t = 0; t < tables; t++) {
    const cow_table *table = &m->tables[t];
    sl_cow_entry **link = &table->buckets[k->hash & (table->size - 1)];
    /* A chain holds at most every entry of its table. */
    for (uint64_t steps = 0; *link && steps <= table->used; steps++) {
      if (key_matches(*link, k)) {
        *table_index = t;
        return link;
      }
      link = &(*link)->chain_next;
    }
    assert(*link == 0);
  }
  return 0;
}

/* Whether key holds the hash and words of its bytes (the promise of a
 * caller that prepared it itself; for asserts). */
__attribute__((unused)) /* asserts only */
static inline bool key_prepared(const sl_cow_key *key) {
  sl_cow_key expected = sl_cow_key_of(key->bytes, key->key_bytes);
  return key->hash == expected.hash && key->first == expected.first &&
         key->last == expected.last;
}

/* find_key() of key's bytes with a hash already known. */
static inline sl_cow_entry **find_link(const sl_cow_map *m, uint64_t hash,
                                       const void *key, uint32_t key_bytes,
                                       int *table_index) {
  sl_cow_key k = sl_cow_key_of(key, key_bytes);
  k.hash = hash;
  return find_key(m, &k, table_index);
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

/* The entries at which a table of size buckets grows (note 6). */
static inline uint64_t table_capacity(uint64_t size) {
  return size < COW_SMALL_TABLE_BUCKETS ? size / 2 : size;
}

/* Start growing (note 6) if the load factor reached its bound. */
static void rehash_start_if_full(sl_cow_map *m) {
  cow_table *old = &m->tables[0];
  if (m->rehashing || old->used < table_capacity(old->size) ||
      old->size >= COW_TABLE_MAX_BUCKETS)
    return; /* at the most, chains just get longer (note 6) */
  uint64_t size = old->size * 2;
  sl_cow_entry **buckets =
      sl_alloc_zeroed(&m->alloc, (size_t)size * sizeof *buckets);
  if (!buckets)
    return; /* retried by the next insert; chains just get longer */
  sl_alloc_advise_huge(buckets, (size_t)size * sizeof *buckets);
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
    sl_alloc_free(&m->alloc, from->buckets,
                  (size_t)from->size * sizeof *from->buckets);
    sl_alloc_purge(&m->alloc); /* not wanted again: alloc.h note 7 */
    m->tables[0] = m->tables[1];
    m->tables[1] = (cow_table){0};
    m->rehashing = false;
  }
}

/* ------------------------------------------------------------ reclaim */

/* Note 13: free the reclaim index, every block of it, and stop fetching
 * (the chain drained, or the map is destroyed). */
static void reclaim_index_clear(sl_cow_map *m) {
  for (sl_cow_index_block *b = m->reclaim_index; b;) {
    sl_cow_index_block *next = b->next;
    assert(m->memory_bytes >= sizeof *b);
    m->memory_bytes -= sizeof *b;
    sl_alloc_free(&m->alloc, b, sizeof *b);
    b = next;
  }
  m->reclaim_index = m->reclaim_index_tail = m->reclaim_ahead = 0;
  m->reclaim_index_at = m->reclaim_ahead_at = 0;
}

/* Note 13: fetch the version under the cursor and move it on one, unless
 * it is at the end of what has been released. */
static inline void reclaim_fetch_next(sl_cow_map *m) {
  sl_cow_index_block *b = m->reclaim_ahead;
  if (b && m->reclaim_ahead_at == b->count && b->next)
    b = m->reclaim_ahead = b->next, m->reclaim_ahead_at = 0;
  if (!b || m->reclaim_ahead_at == b->count)
    return;
  PREFETCH(b->versions[m->reclaim_ahead_at], 1);
  m->reclaim_ahead_at++;
}

/* Note 13: the walk moved past the version at the index's position. */
static inline void reclaim_index_step(sl_cow_map *m, const sl_cow_entry *e) {
  sl_cow_index_block *b = m->reclaim_index;
  (void)e;
  assert(b->versions[m->reclaim_index_at] == e && "note 13: in step");
  if (++m->reclaim_index_at < b->count)
    return;
  /* Past this block.  The cursor ahead, never behind the walk, can still
   * be in it only at its end (waiting for its next fetch, or at the end
   * of the index): it moves on to the next block with the walk. */
  m->reclaim_index = b->next;
  m->reclaim_index_at = 0;
  if (m->reclaim_ahead == b)
    m->reclaim_ahead = b->next, m->reclaim_ahead_at = 0;
  if (!b->next)
    m->reclaim_index_tail = 0;
  assert(m->memory_bytes >= sizeof *b);
  m->memory_bytes -= sizeof *b;
  sl_alloc_free(&m->alloc, b, sizeof *b);
}

/* Walk up to budget versions of the reclaim chain (notes 1-3, 13), then
 * pop released undo versions with what is left of it (note 12).  Returns
 * true if some work remains. */
static bool reclaim_steps(sl_cow_map *m, uint32_t budget) {
  /* Note 15: the walk goes on only once every waiting mark is written;
   * the marks have a budget of their own, so the walk keeps its pace. */
  marking_steps(m, budget);
  if (m->marking_done < m->marking_count)
    return true;
  uint32_t done = 0;
  for (; done < budget && m->reclaim_head; done++) {
    sl_cow_entry *e = m->reclaim_head;
    if (m->reclaim_index) {
      reclaim_fetch_next(m);
      reclaim_index_step(m, e);
    }
    assert(e->epoch != 0 && e->epoch < m->epoch);
    m->reclaim_head = e->dirty_next; /* read before e changes state */
    m->reclaim_entries--;
    if (e->retired == RETIRED_FREE) {
      entry_free(m, e);
    } else {
      /* CLEAN: on no list from now on (an undo version stays on the undo
       * list, which frees it: note 12). */
      e->epoch = 0;
      e->dirty_next = 0;
    }
  }
  if (!m->reclaim_head) {
    m->reclaim_tail = 0;
    assert(!m->reclaim_index); /* the index ends with the chain */
    m->reclaim_unindexed = false;
  }
  assert((m->reclaim_head == 0) == (m->reclaim_entries == 0));
  done += cow_map_dropped_free(m, budget - done); /* rollback's, note 12 */
  done += cow_map_lazy_steps(m, budget - done); /* a lazy rollback's */
  bool undo_left = cow_map_undo_pop(m, budget - done); /* the rest */
  return m->reclaim_head != 0 || m->dropped_head != 0 || m->lazy_head != 0 ||
         undo_left;
}

bool cow_map_undo_pop(sl_cow_map *m, uint64_t budget) {
  for (uint64_t done = 0;
       done < budget && m->undo_popped < m->undo_releasable; done++) {
    sl_cow_entry *e = m->obsolete_head;
    assert(e && e->retired == RETIRED_UNDO);
    m->obsolete_head = e->chain_next;
    e->chain_next = 0;
    m->undo_popped++;
    if (e->epoch == 0)
      entry_free(m, e); /* on no other list */
    else
      e->retired = RETIRED_FREE; /* the reclaim walk frees it */
  }
  if (!m->obsolete_head)
    m->obsolete_tail = 0;
  assert((m->obsolete_head == 0) == (m->undo_popped == m->undo_releasable));
  return m->undo_popped < m->undo_releasable;
}

/* The slot of the newest epoch released: the undo versions appended up to
 * its freeze, a prefix of the undo list that ends at its undo_last, move
 * to the obsolete list whole (note 12), so a rollback never walks them. */
static void undo_release(sl_cow_map *m, const cow_pending_end *slot) {
  if (slot->undo_mark <= m->undo_releasable)
    return; /* none appended since the previous release */
  sl_cow_entry *last = slot->undo_last;
  assert(last && m->undo_head && last->retired == RETIRED_UNDO);
  if (m->obsolete_tail)
    m->obsolete_tail->chain_next = m->undo_head;
  else
    m->obsolete_head = m->undo_head;
  m->obsolete_tail = last;
  m->undo_head = last->chain_next;
  last->chain_next = 0;
  if (!m->undo_head)
    m->undo_tail = 0;
  m->undo_releasable = slot->undo_mark;
}

/* Inline, so a write with nothing to reclaim and no rehash under way pays
 * two tests and no call. */
static inline void write_background(sl_cow_map *m) {
  if (m->reclaim_head || m->dropped_head || m->lazy_head ||
      m->undo_popped < m->undo_releasable ||
      m->marking_done < m->marking_count)
    reclaim_steps(m, RECLAIM_PER_WRITE);
  if (m->rehashing)
    rehash_step(m);
}

/* ------------------------------------------------------------ lifetime */

/* Free what create allocated; each NULL is accepted. */
static void map_free_parts(sl_cow_map *m, sl_alloc *alloc) {
  sl_alloc_free(alloc, m->tables[0].buckets,
                INITIAL_BUCKETS * sizeof(sl_cow_entry *));
  sl_alloc_free(alloc, m->pending, INITIAL_PENDING * sizeof *m->pending);
  sl_alloc_free(alloc, m->pending_tails,
                INITIAL_PENDING * sizeof *m->pending_tails);
  sl_alloc_free(alloc, m, sizeof *m);
}

int sl_cow_map_create(sl_cow_map **map) {
  assert(map);
  *map = 0;
  /* Note 11: the map's own arena first; the map lives in it too. */
  sl_alloc alloc;
  sl_alloc_open(&alloc);
  sl_cow_map *m = sl_alloc_zeroed(&alloc, sizeof *m);
  if (!m) {
    sl_alloc_close(&alloc);
    return ENOMEM;
  }
  m->alloc = alloc;
  m->tables[0].buckets =
      sl_alloc_zeroed(&alloc, INITIAL_BUCKETS * sizeof(sl_cow_entry *));
  m->pending = sl_alloc_bytes(&alloc, INITIAL_PENDING * sizeof *m->pending);
  m->pending_tails =
      sl_alloc_bytes(&alloc, INITIAL_PENDING * sizeof *m->pending_tails);
  if (!m->tables[0].buckets || !m->pending || !m->pending_tails) {
    map_free_parts(m, &alloc);
    sl_alloc_close(&alloc);
    return ENOMEM;
  }
  m->tables[0].size = INITIAL_BUCKETS;
  m->pending_capacity = INITIAL_PENDING;
  m->epoch = 1;
  m->freeze_copy_entries = SL_COW_FREEZE_COPY_ENTRIES; /* note 16 */
  m->freeze_copy_bytes = SL_COW_FREEZE_COPY_BYTES;
  m->copy_pass_entries = SL_COW_COPY_PASS_ENTRIES; /* note 17 */
  m->copy_pass_bytes = SL_COW_COPY_PASS_BYTES;
  m->stage_min_buckets = SL_COW_STAGE_MIN_BUCKETS; /* note 18 */
  m->stage_region_buckets = SL_COW_STAGE_REGION_BUCKETS;
  m->stage_budget = SL_COW_STAGE_BUDGET_BYTES;
  m->memory_bytes = sizeof *m + INITIAL_BUCKETS * sizeof(sl_cow_entry *) +
                    INITIAL_PENDING * (sizeof *m->pending + sizeof *m->pending_tails);
  assert(sl_cow_map_check(m));
  *map = m;
  return 0;
}

static void stage_end(sl_cow_map *m, bool link); /* note 18 */

/* Free a version at destroy: arena ones go with their chunks (note 3). */
static void destroy_version(sl_cow_map *m, sl_cow_entry *e) {
  if (!e->arena)
    entry_free(m, e);
}

/* Free the retired versions of one list (live ones are freed from the
 * table).  bound: the list's length. */
static void free_retired_on_list(sl_cow_map *m, sl_cow_entry *e,
                                 uint64_t bound) {
  for (uint64_t i = 0; e && i < bound; i++) {
    sl_cow_entry *next = e->dirty_next;
    if (e->retired)
      destroy_version(m, e);
    e = next;
  }
  assert(e == 0);
}

/* Free every version and table one by one (note 3): the way without an
 * arena of the map's own (note 11). */
static void destroy_walk(sl_cow_map *m) {
  /* A lazy rollback's versions waiting to go back into the table are on
   * no list (cow_map_rollback.c note 6): put them back first. */
  cow_map_lazy_finish(m);
  /* Displaced versions whose mark waits (note 15) are freed as retired
   * ones on their lists below. */
  marks_finish(m); /* frees the arrays too */
  /* Then the undo lists (note 12): they are linked through versions the
   * other lists free; only their CLEAN ones are on no other list. */
  sl_cow_entry *lists[2] = {m->obsolete_head, m->undo_head};
  for (int l = 0; l < 2; l++) {
    sl_cow_entry *u = lists[l];
    for (uint64_t i = m->undo_popped; u && i < m->undo_pushed; i++) {
      sl_cow_entry *next = u->chain_next;
      if (u->epoch == 0)
        destroy_version(m, u);
      u = next;
    }
  }
  free_retired_on_list(m, m->dirty_head, m->dirty_entries);
  cow_map_free_index(m, m->index_head, m->dirty_entries);
  cow_map_undo_index_clear(m);
  for (uint32_t i = 0; i < m->pending_count; i++) {
    free_retired_on_list(m, m->pending[i].head, m->pending[i].entries);
    cow_map_free_index(m, m->pending[i].index, m->pending[i].entries);
  }
  free_retired_on_list(m, m->reclaim_head, m->reclaim_entries);
  reclaim_index_clear(m);
  free_retired_on_list(m, m->dropped_head, m->dropped_entries); /* all */
  /* A bulk load not finished: its staged records (note 18) are no
   * versions yet, its ring's versions are in no table. */
  stage_end(m, false);
  for (uint32_t i = 0; i < m->load_count; i++)
    destroy_version(m, m->load_window[(m->load_first + i) &
                                      (SL_COW_LOAD_WINDOW - 1)]);
  /* The table's malloc'd versions; the walk ends with the last of them, so
   * a map of loaded versions only is not walked at all (each visit is a
   * cache miss: 50 ms for 1M entries). */
  for (int t = 0; t < 2; t++) {
    cow_table *table = &m->tables[t];
    for (uint64_t b = 0; b < table->size && m->heap_versions > 0; b++) {
      sl_cow_entry *e = table->buckets[b];
      for (uint64_t i = 0; e && i < table->used; i++) {
        sl_cow_entry *next = e->chain_next;
        destroy_version(m, e);
        e = next;
      }
      assert(e == 0);
    }
    sl_alloc_free(&m->alloc, table->buckets,
                  (size_t)table->size * sizeof *table->buckets);
  }
  assert(m->heap_versions == 0);
  for (uint64_t i = 0; m->arena_chunks && i < m->arena_chunk_count; i++) {
    arena_chunk *next = m->arena_chunks->next;
    sl_alloc_free_aligned(&m->alloc, m->arena_chunks, ARENA_CHUNK_BYTES,
                          ARENA_CHUNK_BYTES);
    m->arena_chunks = next;
  }
  assert(m->arena_chunks == 0);
  if (m->arena_spare)
    sl_alloc_free_aligned(&m->alloc, m->arena_spare, ARENA_CHUNK_BYTES,
                          ARENA_CHUNK_BYTES);
  sl_alloc_free(&m->alloc, m->pending,
                m->pending_capacity * sizeof *m->pending);
  sl_alloc_free(&m->alloc, m->pending_tails,
                m->pending_capacity * sizeof *m->pending_tails);
}

void sl_cow_map_destroy(sl_cow_map *m) {
  if (!m)
    return;
  /* Note 11: with an arena of its own, closing it frees everything at
   * once, the map itself included; so the handle is copied out first. */
  sl_alloc alloc = m->alloc;
  if (!sl_alloc_resettable(&alloc)) {
    destroy_walk(m);
    sl_alloc_free(&alloc, m, sizeof *m);
  }
  sl_alloc_close(&alloc);
}

const char *sl_cow_map_allocator_name(void) { return sl_alloc_name(); }

int sl_cow_map_allocator(const sl_cow_map *m, const char **name,
                         uint64_t *allocated_bytes) {
  assert(m);
  *name = sl_alloc_name();
  return sl_alloc_allocated_bytes(&m->alloc, allocated_bytes);
}

/* ------------------------------------------------------------ reads */

const void *sl_cow_map_get(sl_cow_map *m, const void *key, uint32_t key_bytes,
                           uint32_t *value_bytes) {
  assert(key || key_bytes == 0);
  sl_cow_key k = sl_cow_key_of(key, key_bytes);
  return sl_cow_map_find(m, &k, value_bytes);
}

const void *sl_cow_map_find(sl_cow_map *m, const sl_cow_key *key,
                            uint32_t *value_bytes) {
  assert(m);
  assert(!m->loading); /* no bulk load under way (header Caveats) */
  assert(key && (key->bytes || key->key_bytes == 0));
  assert(key_prepared(key));
  if (m->rehashing)
    rehash_step(m);
  int table_index;
  sl_cow_entry **link = find_key(m, key, &table_index);
  if (link && cow_stale(m, *link)) /* cow_map_rollback.c note 5 */
    link = cow_map_settle(m, link, table_index);
  if (value_bytes)
    *value_bytes = link ? (*link)->value_bytes : 0;
  return link ? value_area(*link) : 0;
}

/* What a lookup reads of version e: the header (chain_next, hash,
 * key_bytes) and the key; then where the value of a key of 9 to 16 bytes
 * starts, which is another line when the version straddles one.  (A hint
 * to write made no difference.) */
static inline void prefetch_version(const sl_cow_entry *e) {
  PREFETCH(e, 0);
  PREFETCH(e->data + sl_cow_value_offset(16), 0);
}

void sl_cow_map_prefetch(const sl_cow_map *m, const uint64_t *hashes,
                         uint32_t count, int stage) {
  assert(m);
  assert(count <= SL_COW_PREFETCH_MAX);
  assert(count == 0 || hashes);
  assert(stage >= 0 && stage <= 2);
  if (m->loading)
    return; /* the ring's entries are in no table yet (note 10) */
  /* While rehashing a key is in either table (note 6): both are fetched. */
  int tables = m->rehashing ? 2 : 1;
  for (int t = 0; t < tables; t++) {
    const cow_table *table = &m->tables[t];
    uint64_t mask = table->size - 1;
    if (stage == 0) {
      for (uint32_t i = 0; i < count; i++)
        PREFETCH(&table->buckets[hashes[i] & mask], 0);
      continue;
    }
    if (stage == 2) {
      /* The heads are in cache since stage 1: where one holds another
       * key, the lookup goes on to the next entry, which is fetched now
       * (the next's hash is known only once it arrives).  A loop of its
       * own: one loop for stages 1 and 2 cost P2 2-3%. */
      for (uint32_t i = 0; i < count; i++) {
        const sl_cow_entry *e = table->buckets[hashes[i] & mask];
        if (e && e->hash != (uint32_t)hashes[i] && e->chain_next)
          prefetch_version(e->chain_next);
      }
      continue;
    }
    for (uint32_t i = 0; i < count; i++) {
      const sl_cow_entry *e = table->buckets[hashes[i] & mask];
      if (e)
        prefetch_version(e);
    }
  }
}

uint64_t sl_cow_map_dirty_entries(const sl_cow_map *m) {
  assert(m);
  return m->dirty_entries;
}

uint64_t sl_cow_map_count(const sl_cow_map *m) {
  assert(m);
  assert(!m->loading); /* no bulk load under way (header Caveats) */
  return cow_live_keys(m); /* exact under a lazy rollback too */
}

int sl_cow_map_foreach(sl_cow_map *m, int (*fn)(void *arg, const sl_cow_entry *e),
                       void *arg) {
  assert(m);
  assert(!m->loading); /* no bulk load under way (header Caveats) */
  assert(fn);
  /* The table must hold exactly the map's entries: no stale version
   * (cow_map_rollback.c note 6). */
  cow_map_lazy_finish(m);
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

uint64_t sl_cow_map_buckets(const sl_cow_map *m) {
  assert(m);
  return m->tables[m->rehashing ? 1 : 0].size;
}

uint64_t sl_cow_map_load_probes(const sl_cow_map *m) {
  assert(m);
  return m->load_probes;
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
  /* cow_map_rollback.c note 5: what the key held before this epoch: the
   * undo list's next version, which the caller makes old (a version of
   * this epoch is superseded instead, and was not the key's then). */
  if (m->retain)
    e->displaced = old->epoch == m->epoch ? old->displaced
                                          : (uint32_t)(m->undo_pushed + 1);
  e->chain_next = old->chain_next;
  *link = e; /* the table's count is unchanged */
  /* old's chain_next is cleared by whoever marks it: the caller, or the
   * reclaim steps (note 15). */
  dirty_append(m, e);
  return e;
}

void *sl_cow_map_put(sl_cow_map *m, const void *key, uint32_t key_bytes,
                     const void *value, uint32_t value_bytes) {
  assert(key || key_bytes == 0);
  sl_cow_key k = sl_cow_key_of(key, key_bytes);
  return sl_cow_map_put_key(m, &k, value, value_bytes);
}

void *sl_cow_map_put_key(sl_cow_map *m, const sl_cow_key *key,
                         const void *value, uint32_t value_bytes) {
  assert(m);
  assert(!m->loading); /* no bulk load under way (header Caveats) */
  assert(key && (key->bytes || key->key_bytes == 0));
  assert(key->key_bytes <= SL_COW_MAX_BYTES && value_bytes <= SL_COW_MAX_BYTES);
  if (key->key_bytes > SL_COW_MAX_BYTES || value_bytes > SL_COW_MAX_BYTES)
    return 0;
  assert(key_prepared(key));
  if (!dirty_slot_ready(m))
    return 0; /* ENOMEM: freeze could not grow the pending array (note 5) */
  write_background(m); /* first: it moves links and turns versions CLEAN */
  int table_index;
  sl_cow_entry **link = find_key(m, key, &table_index);
  if (link && cow_stale(m, *link)) /* cow_map_rollback.c note 5 */
    link = cow_map_settle(m, link, table_index);
  if (!link)
    return put_new_key(m, key->hash, key->bytes, key->key_bytes, value,
                       value_bytes);
  sl_cow_entry *old = *link;
  bool writable = in_place(m, old); /* notes 1, 12 */
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
  if (old->epoch == m->epoch) {
    old->chain_next = 0;
    old->superseded = 1; /* CURRENT, so the writer does not see it yet */
    old->retired = RETIRED_FREE;
  } else {
    retire_displaced(m, old);
  }
  return value_area(e);
}

int sl_cow_map_update(sl_cow_map *m, const sl_cow_key *key,
                      const void *init, uint32_t value_bytes, void **value) {
  assert(m);
  assert(!m->loading); /* no bulk load under way (header Caveats) */
  assert(key && (key->bytes || key->key_bytes == 0));
  assert(value);
  if (key->key_bytes > SL_COW_MAX_BYTES || value_bytes > SL_COW_MAX_BYTES)
    return EINVAL;
  assert(key_prepared(key));
  if (!dirty_slot_ready(m))
    return ENOMEM; /* freeze could not grow the pending array (note 5) */
  write_background(m); /* first: it moves links and turns versions CLEAN */
  int table_index;
  sl_cow_entry **link = find_key(m, key, &table_index);
  if (link && cow_stale(m, *link)) /* cow_map_rollback.c note 5 */
    link = cow_map_settle(m, link, table_index);
  if (!link) {
    void *stored = put_new_key(m, key->hash, key->bytes, key->key_bytes, init,
                               value_bytes);
    if (!stored)
      return ENOMEM;
    *value = stored;
    return 0;
  }
  sl_cow_entry *old = *link;
  if (old->value_bytes != value_bytes)
    return EINVAL;
  if (old->epoch == m->epoch) { /* CURRENT: already on the dirty list */
    *value = value_area(old);
    return 0;
  }
  if (old->epoch == 0 && !m->retain) { /* CLEAN: on no list, in place */
    old->epoch = m->epoch;
    dirty_append(m, old);
    *value = value_area(old);
    return 0;
  }
  /* FROZEN or RELEASED (note 1), or CLEAN under rollback (note 12): the
   * copy on write.  put_new_version() copies the old value when given
   * none. */
  sl_cow_entry *e = put_new_version(m, link, 0, value_bytes);
  if (!e)
    return ENOMEM;
  retire_displaced(m, old);
  *value = value_area(e);
  return 0;
}

int sl_cow_map_delete(sl_cow_map *m, const void *key, uint32_t key_bytes) {
  assert(m);
  assert(!m->loading); /* no bulk load under way (header Caveats) */
  assert(key || key_bytes == 0);
  write_background(m);
  int table_index;
  sl_cow_entry **link =
      find_link(m, key_hash(key, key_bytes), key, key_bytes, &table_index);
  if (link && cow_stale(m, *link)) /* cow_map_rollback.c note 5 */
    link = cow_map_settle(m, link, table_index);
  if (!link)
    return SL_ENOTFOUND;
  if (!dirty_slot_ready(m))
    return ENOMEM; /* note 5 */
  sl_cow_entry *old = *link;
  if (in_place(m, old)) {
    /* Not frozen: the version itself becomes the tombstone. */
    table_unlink(m, link, table_index);
    if (old->epoch == m->epoch)
      m->dirty_bytes -= old->value_bytes; /* it stays on the list */
    entry_make_tombstone(old);
    if (old->epoch == 0) {
      old->epoch = m->epoch;
      dirty_append(m, old);
    }
    m->dirty_deletes++; /* cow_map_rollback.c note 5 */
    return 0;
  }
  sl_cow_entry *tombstone = entry_new(m, old->hash, old->data, old->key_bytes, 0);
  if (!tombstone)
    return ENOMEM;
  entry_make_tombstone(tombstone);
  table_unlink(m, link, table_index);
  retire_displaced(m, old);
  dirty_append(m, tombstone);
  m->dirty_deletes++; /* cow_map_rollback.c note 5 */
  return 0;
}

/* ------------------------------------------------------------ loads */

int sl_cow_map_load(sl_cow_map *m, const void *key, uint32_t key_bytes,
                    const void *value, uint32_t value_bytes) {
  assert(m);
  assert(key || key_bytes == 0);
  assert(!m->loading); /* no bulk load under way (header Caveats) */
  if (key_bytes > SL_COW_MAX_BYTES || value_bytes > SL_COW_MAX_BYTES)
    return EINVAL;
  rehash_step(m);
  uint64_t hash = key_hash(key, key_bytes);
  int table_index;
  if (find_link(m, hash, key, key_bytes, &table_index))
    return EINVAL;
  /* CLEAN: already durable, on no list. */
  sl_cow_entry *e =
      clean_version_new(m, hash, key, key_bytes, value, value_bytes);
  if (!e)
    return ENOMEM;
  rehash_start_if_full(m);
  table_insert(m, e);
  return 0;
}

/* The bulk load fails for good with its first error (header). */
static int load_fail(sl_cow_map *m, int rc) {
  assert(rc != 0);
  if (m->load_error == 0)
    m->load_error = rc;
  return m->load_error;
}

/* The bucket of table t a hash belongs to. */
static sl_cow_entry *const *bucket_of(const sl_cow_map *m, int t,
                                      uint64_t hash) {
  const cow_table *table = &m->tables[t];
  assert(table->size > 0);
  return &table->buckets[hash & (table->size - 1)];
}

/* Whether (key_group, key) sorts after the entry added before it: key
 * groups ascending, then keys as LMDB's default comparison orders them
 * (bytes over the shorter length, then the shorter first).  The previous
 * key is in the arena just behind, so this costs no cache miss. */
static bool load_follows(const sl_cow_map *m, uint32_t key_group,
                         const void *key, uint32_t key_bytes) {
  if (!m->load_previous)
    return true;
  if (key_group != m->load_previous_group)
    return key_group > m->load_previous_group;
  return key_compare(key, key_bytes, m->load_previous,
                     m->load_previous_bytes) > 0;
}

/* Link a loaded version into the table as sl_cow_map_load() would.  If it
 * must be probed and its key is there already, free it instead and fail
 * the load. */
static void load_link(sl_cow_map *m, sl_cow_entry *e, bool probe) {
  m->load_probes += probe;
  assert(e->epoch == 0 && !e->retired);
  rehash_step(m);
  int table_index;
  if (probe && find_link(m, e->hash, e->data, e->key_bytes, &table_index)) {
    entry_free(m, e); /* the later copy; the first one stays */
    load_fail(m, EINVAL);
    return;
  }
  /* Unprobed: keys in strictly ascending order cannot repeat (note 10). */
  assert(probe || !find_link(m, e->hash, e->data, e->key_bytes, &table_index));
  rehash_start_if_full(m);
  table_insert(m, e);
}

/* Link the oldest version of the ring into the table as sl_cow_map_load()
 * would.  If it must be probed and its key is there already, free it
 * instead and fail the load. */
static void load_link_oldest(sl_cow_map *m) {
  assert(m->load_count > 0);
  assert(m->load_unprobed <= m->load_count);
  sl_cow_entry *e = m->load_window[m->load_first];
  m->load_first = (m->load_first + 1) & (SL_COW_LOAD_WINDOW - 1);
  m->load_count--;
  bool probe = m->load_unprobed == 0;
  if (!probe)
    m->load_unprobed--;
  load_link(m, e, probe);
}

/* Put e in the ring; prefetch what linking it will read (note 10). */
static void load_enqueue(sl_cow_map *m, sl_cow_entry *e) {
  /* The prefetches are written here, not in a helper: GCC deems a function
   * that only prefetches free of effects and, at -O2, drops its calls. */
  int to = m->rehashing ? 1 : 0; /* where table_insert() will put e */
  PREFETCH(bucket_of(m, to, e->hash), 1);
  if (m->rehashing) /* find_link() reads the old table's bucket as well */
    PREFETCH(bucket_of(m, 0, e->hash), 0);
  uint32_t mask = SL_COW_LOAD_WINDOW - 1;
  assert(!m->stage_area); /* a staged load links by rounds (note 18) */
  assert(m->load_count < SL_COW_LOAD_WINDOW);
  m->load_window[(m->load_first + m->load_count) & mask] = e;
  m->load_count++;
  uint32_t half = SL_COW_LOAD_WINDOW / 2;
  if (m->load_count > half && m->load_count - 1 - half >= m->load_unprobed) {
    /* Half way through the ring, an entry to be probed: its bucket was
     * prefetched that many adds ago, so reading it rarely waits; the entry
     * it points to is the one the probe will read (chain_next, hash). */
    const sl_cow_entry *waiting =
        m->load_window[(m->load_first + m->load_count - 1 - half) & mask];
    const sl_cow_entry *head = *bucket_of(m, to, waiting->hash);
    if (head) {
      PREFETCH(head, 0);
      PREFETCH(&head->hash, 0); /* another line when head ends a line */
    }
  }
}

/* ----------------------------------------- the staged bulk load (note 18) */

/* The most bytes staged at once: the offsets are 32-bit. */
#define STAGE_BUDGET_MAX (UINT64_C(1) << 30)
/* How far ahead of the record being linked the records, and their
 * buckets, are fetched. */
#define STAGE_RECORD_AHEAD 16u
#define STAGE_BUCKET_AHEAD 8u

_Static_assert(SL_COW_MAX_BYTES < COW_STAGE_PROBE, "the probe bit is free");
_Static_assert(STAGE_BUDGET_MAX / 16u <= UINT32_MAX, "counts fit 32 bits");

/* At a bulk load's first add: stage it if its table is large enough. */
static void stage_begin(sl_cow_map *m) {
  const cow_table *table = &m->tables[0];
  assert(!m->stage_area);
  if (m->rehashing || table->size < m->stage_min_buckets)
    return;
  uint64_t parts = table->size / m->stage_region_buckets;
  parts = parts == 0 ? 1 : parts > SL_COW_STAGE_MAX_PARTS ? SL_COW_STAGE_MAX_PARTS
                                                          : parts;
  uint64_t budget = m->stage_budget > STAGE_BUDGET_MAX ? STAGE_BUDGET_MAX
                                                       : m->stage_budget;
  /* No more than the table's keys could take (32 bytes a bucket), so a
   * small load does not pay for the whole area's pages. */
  uint64_t fill = table->size * 32u;
  budget = budget < fill ? budget : fill;
  budget = (budget + 3u) & ~(uint64_t)3u;
  /* An offset and a hash a record; records of 16 bytes or more fill the
   * budget first, smaller ones the arrays. */
  uint64_t max_records = budget / 16u ? budget / 16u : 1u;
  uint64_t bytes = budget + (2u * max_records + parts) * sizeof(uint32_t);
  uint8_t *area = cow_test_alloc_fails(m, SL_COW_FAIL_STAGE_AREA)
                      ? 0 : sl_alloc_bytes(&m->alloc, (size_t)bytes);
  if (!area)
    return; /* not staged: slower, not wrong */
  m->memory_bytes += bytes;
  m->stage_area = area;
  m->stage_area_bytes = bytes;
  m->stage_used = 0;
  m->stage_records = 0;
  m->stage_max_records = (uint32_t)max_records;
  m->stage_sorted = (uint32_t *)(area + budget);
  m->stage_hashes = m->stage_sorted + max_records;
  m->stage_counts = m->stage_hashes + max_records;
  memset(m->stage_counts, 0, (size_t)parts * sizeof *m->stage_counts);
  m->stage_parts = (uint32_t)parts;
  m->stage_mask = table->size - 1;
  /* Both are powers of two: partition = bucket index >> shift. */
  m->stage_shift = (uint32_t)(__builtin_ctzll(table->size) -
                              __builtin_ctzll(parts));
}

/* Link one staged record. */
static void stage_link_record(sl_cow_map *m, const cow_stage_record *r) {
  uint32_t key_bytes = r->key_bytes & ~COW_STAGE_PROBE;
  const uint8_t *key = (const uint8_t *)(r + 1);
  sl_cow_entry *e = clean_version_new(m, r->hash, key, key_bytes,
                                      key + key_bytes, r->value_bytes);
  if (!e) {
    load_fail(m, ENOMEM);
    return;
  }
  if (m->load_previous == key) /* the key order's mark moves to it */
    m->load_previous = e->data;
  load_link(m, e, (r->key_bytes & COW_STAGE_PROBE) != 0);
}

/* Link every staged record, partition by partition, in the order they
 * were added within each (a counting sort by partition: the counts were
 * taken as they were added); the records and their buckets fetched ahead.
 * The area is empty after. */
static void stage_link_all(sl_cow_map *m) {
  uint32_t n = m->stage_records;
  if (n == 0)
    return;
  const uint8_t *area = m->stage_area;
  uint32_t *sorted = m->stage_sorted, *hashes = m->stage_hashes;
  uint32_t *counts = m->stage_counts;
  uint32_t start = 0;
  for (uint32_t p = 0; p < m->stage_parts; p++) {
    uint32_t count = counts[p];
    counts[p] = start; /* where partition p starts, then its next slot */
    start += count;
  }
  assert(start == n);
  for (uint64_t at = 0; at < m->stage_used;) {
    const cow_stage_record *r = (const cow_stage_record *)(area + at);
    uint32_t slot = counts[cow_stage_part(m, r->hash)]++;
    sorted[slot] = (uint32_t)at;
    hashes[slot] = r->hash;
    at += cow_stage_record_bytes(r->key_bytes & ~COW_STAGE_PROBE, r->value_bytes);
  }
  for (uint32_t i = 0; i < n; i++) {
    /* The prefetches are written here, not in a helper (load_enqueue). */
    if (i + STAGE_RECORD_AHEAD < n)
      PREFETCH(area + sorted[i + STAGE_RECORD_AHEAD], 0);
    if (i + STAGE_BUCKET_AHEAD < n)
      PREFETCH(bucket_of(m, m->rehashing ? 1 : 0, hashes[i + STAGE_BUCKET_AHEAD]),
               1);
    stage_link_record(m, (const cow_stage_record *)(area + sorted[i]));
  }
  memset(counts, 0, (size_t)m->stage_parts * sizeof *counts);
  m->stage_used = 0;
  m->stage_records = 0;
  m->stage_links++;
}

/* Stage one entry: true, or false if it is larger than the budget, when
 * the caller links it at once.  May first link everything staged, to make
 * room; the caller checks load_error after. */
static bool stage_add(sl_cow_map *m, bool probe, uint64_t hash,
                      const void *key, uint32_t key_bytes, const void *value,
                      uint32_t value_bytes) {
  uint64_t need = cow_stage_record_bytes(key_bytes, value_bytes);
  uint64_t budget = (uint64_t)((uint8_t *)m->stage_sorted - m->stage_area);
  if (need > budget)
    return false;
  if (m->stage_used + need > budget ||
      m->stage_records == m->stage_max_records) {
    stage_link_all(m);
    if (m->load_error)
      return true; /* failed: the caller reports it, adds nothing */
  }
  cow_stage_record *r = (cow_stage_record *)(m->stage_area + m->stage_used);
  r->hash = (uint32_t)hash;
  r->key_bytes = key_bytes | (probe ? COW_STAGE_PROBE : 0);
  r->value_bytes = value_bytes;
  uint8_t *bytes = (uint8_t *)(r + 1);
  if (key_bytes)
    memcpy(bytes, key, key_bytes);
  if (value_bytes)
    memcpy(bytes + key_bytes, value, value_bytes);
  m->stage_counts[cow_stage_part(m, r->hash)]++;
  m->stage_records++;
  m->stage_used += need;
  m->load_staged++;
  if (!probe) { /* sorted so far: its key is the order's mark */
    m->load_previous = bytes;
    m->load_previous_bytes = key_bytes;
  }
  return true;
}

/* Link what is staged, if link, and free the area (finish, destroy). */
static void stage_end(sl_cow_map *m, bool link) {
  if (!m->stage_area)
    return;
  if (link)
    stage_link_all(m);
  sl_alloc_free(&m->alloc, m->stage_area, (size_t)m->stage_area_bytes);
  if (link) /* not wanted again: alloc.h note 7 */
    sl_alloc_purge(&m->alloc);
  m->memory_bytes -= m->stage_area_bytes;
  m->stage_area = 0;
  m->stage_area_bytes = 0;
  m->stage_used = 0;
  m->stage_records = 0;
}

void sl_cow_map_set_load_stage(sl_cow_map *m, uint64_t min_buckets,
                               uint64_t region_buckets, uint64_t budget_bytes) {
  assert(m);
  assert(!m->loading); /* header Caveats */
  assert(region_buckets > 0 && (region_buckets & (region_buckets - 1)) == 0);
  assert(budget_bytes > 0);
  m->stage_min_buckets = min_buckets;
  m->stage_region_buckets = region_buckets;
  m->stage_budget = budget_bytes;
}

uint64_t sl_cow_map_load_staged(const sl_cow_map *m) {
  assert(m);
  return m->load_staged;
}

uint64_t sl_cow_map_stage_links(const sl_cow_map *m) {
  assert(m);
  return m->stage_links;
}

int sl_cow_map_load_add(sl_cow_map *m, uint32_t key_group, const void *key,
                        uint32_t key_bytes, const void *value,
                        uint32_t value_bytes) {
  assert(m);
  assert(key || key_bytes == 0);
  if (m->load_error)
    return m->load_error;
  if (!m->loading) {
    /* Order proves uniqueness only among the loaded keys: the map must
     * hold no other (note 10). */
    m->loading = true;
    m->load_sorted = m->tables[0].used + m->tables[1].used == 0;
    m->load_previous = 0;
    stage_begin(m); /* note 18 */
  }
  if (key_bytes > SL_COW_MAX_BYTES || value_bytes > SL_COW_MAX_BYTES)
    return load_fail(m, EINVAL);
  if (m->load_count == SL_COW_LOAD_WINDOW) {
    load_link_oldest(m); /* first: the ring has room for e after it */
    if (m->load_error)
      return m->load_error;
  }
  if (m->load_sorted && !load_follows(m, key_group, key, key_bytes)) {
    m->load_sorted = false; /* this entry and all later ones are probed */
    m->load_previous = 0;
  }
  uint64_t hash = key_hash(key, key_bytes);
  if (m->load_sorted)
    m->load_previous_group = key_group;
  if (m->stage_area) { /* note 18: the ring stays empty */
    if (stage_add(m, !m->load_sorted, hash, key, key_bytes, value,
                  value_bytes))
      return m->load_error;
    /* Not staged: linked now, after everything added before it. */
    stage_link_all(m);
    if (m->load_error)
      return m->load_error;
  }
  sl_cow_entry *e =
      clean_version_new(m, hash, key, key_bytes, value, value_bytes);
  if (!e)
    return load_fail(m, ENOMEM);
  if (m->load_sorted) {
    m->load_previous = e->data;
    m->load_previous_bytes = key_bytes;
  }
  if (m->stage_area) {
    load_link(m, e, !m->load_sorted);
    return m->load_error;
  }
  if (m->load_sorted) {
    assert(m->load_unprobed == m->load_count); /* a prefix of the ring */
    m->load_unprobed++;
  }
  load_enqueue(m, e);
  return 0;
}

int sl_cow_map_load_finish(sl_cow_map *m) {
  assert(m);
  /* Bounded: the ring holds at most SL_COW_LOAD_WINDOW.  A staged load
   * (note 18) links its records here, at most its budget's worth. */
  stage_end(m, true);
  while (m->load_count > 0)
    load_link_oldest(m);
  assert(m->load_unprobed == 0);
  if (m->load_prefault) /* the helper stopped, spares freed (note 14) */
    cow_arena_spares_drop(m);
  m->loading = false;
  m->load_sorted = false;
  m->load_previous = 0;
  return m->load_error;
}

int sl_cow_map_reserve(sl_cow_map *m, uint64_t entries) {
  assert(m);
  assert(!m->loading); /* no bulk load under way (header Caveats) */
  if (m->rehashing || sl_cow_map_count(m) != 0)
    return 0; /* only an empty map: nothing to move */
  uint64_t size = INITIAL_BUCKETS;
  while (table_capacity(size) < entries && size < COW_TABLE_MAX_BUCKETS)
    size *= 2;
  if (size <= m->tables[0].size)
    return 0;
  sl_cow_entry **buckets =
      sl_alloc_zeroed(&m->alloc, (size_t)size * sizeof *buckets);
  if (!buckets)
    return ENOMEM;
  sl_alloc_advise_huge(buckets, (size_t)size * sizeof *buckets);
  m->memory_bytes += (size - m->tables[0].size) * sizeof *buckets;
  sl_alloc_free(&m->alloc, m->tables[0].buckets,
                (size_t)m->tables[0].size * sizeof *buckets);
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
  sl_cow_delta *deltas = sl_alloc_bytes(&m->alloc, capacity * sizeof *deltas);
  cow_pending_end *tails = sl_alloc_bytes(&m->alloc, capacity * sizeof *tails);
  if (!deltas || !tails) {
    sl_alloc_free(&m->alloc, deltas, capacity * sizeof *deltas);
    sl_alloc_free(&m->alloc, tails, capacity * sizeof *tails);
    return;
  }
  memcpy(deltas, m->pending, m->pending_count * sizeof *deltas);
  memcpy(tails, m->pending_tails, m->pending_count * sizeof *tails);
  sl_alloc_free(&m->alloc, m->pending,
                m->pending_capacity * sizeof *m->pending);
  sl_alloc_free(&m->alloc, m->pending_tails,
                m->pending_capacity * sizeof *m->pending_tails);
  m->pending = deltas;
  m->pending_tails = tails;
  m->memory_bytes += (uint64_t)(capacity - m->pending_capacity) *
                     (sizeof *deltas + sizeof *tails);
  m->pending_capacity = capacity;
}

/* A copy of v, in table and on a list, for the list (note 16): carved
 * from an arena chunk, or from the heap when large.  NULL when no memory
 * (or the test fail point) says so. */
static sl_cow_entry *version_copy(sl_cow_map *m, sl_cow_entry *v) {
  uint64_t bytes = entry_alloc_bytes(v->key_bytes, v->value_bytes);
  sl_cow_entry *c;
  if (cow_test_alloc_fails(m, SL_COW_FAIL_FREEZE_COPY))
    return 0;
  if (bytes <= ARENA_VERSION_MAX_BYTES) {
    c = cow_arena_carve(m, bytes);
    if (!c)
      return 0;
    memcpy(c, v, (size_t)bytes); /* header, key and value at once */
    c->arena = 1;
  } else {
    c = entry_new(m, v->hash, v->data, v->key_bytes, v->value_bytes);
    if (!c)
      return 0;
    memcpy(value_area(c), value_area(v), v->value_bytes);
    c->epoch = v->epoch; /* entry_new's is the current one: not in a pass */
  }
  return c;
}

/* Copy c of version v takes v's place on a list (after prev, or at *head;
 * *tail its last version) and in its index (block at position at), as a
 * version that a copy on write displaced, already marked; v becomes
 * CLEAN: in the table, on no list (notes 16, 17). */
static void version_replace(sl_cow_map *m, sl_cow_entry *c, sl_cow_entry *v,
                            sl_cow_entry *prev, sl_cow_entry **head,
                            sl_cow_entry **tail, sl_cow_index_block *block,
                            uint64_t at) {
  c->dirty_next = v->dirty_next;
  mark_retired(c);
  if (prev)
    prev->dirty_next = c;
  else
    *head = c;
  if (*tail == v)
    *tail = c;
  if (block)
    block->versions[at] = c;
  v->epoch = 0; /* CLEAN: in the table, on no list */
  v->dirty_next = 0;
  m->freeze_copies++;
}

/* Versions a copy (notes 16, 17) fetches ahead, through the index, and
 * how far past the next version to be carved it fetches the arena. */
#define COPY_AHEAD 16u
#define COPY_CARVE_AHEAD 2048u

/* Notes 16, 17: before copying the version at position at of index block
 * block (NULL: a list without an index), fetch the one COPY_AHEAD further
 * on, and, for writing, the arena line COPY_CARVE_AHEAD bytes past the
 * next carve if that is still in the chunk.  Always inlined: GCC takes a
 * function that only prefetches for one without effects, and, where it
 * does not inline it early, drops the call (GCC 12 -O3 did, at both
 * callers: the freeze of 10,000 keys went back to 190 us). */
static inline __attribute__((always_inline)) void
copy_prefetch(const sl_cow_map *m, const sl_cow_index_block *block,
              uint64_t at) {
  if (block) {
    const sl_cow_entry *ahead = sl_cow_index_ahead(block, at, COPY_AHEAD);
    if (ahead)
      PREFETCH(ahead, 1);
  }
  const arena_chunk *c = m->arena_carving;
  if (c && c->used_bytes + COPY_CARVE_AHEAD < ARENA_CHUNK_BYTES)
    PREFETCH((const uint8_t *)c + c->used_bytes + COPY_CARVE_AHEAD, 1);
}

/* Note 16: the current epoch's live versions, if few, are copied now: each
 * copy takes its version's place on the list (and in the index) as a
 * displaced version, marked, and the version itself becomes CLEAN, so
 * the writes after the barrier go in place.  Stops at the first copy it
 * cannot allocate: the rest stay on the list as they are, to be frozen. */
static bool freeze_by_copy(sl_cow_map *m) {
  if (m->retain || m->dirty_entries == 0 ||
      m->dirty_entries > m->freeze_copy_entries ||
      m->dirty_bytes > m->freeze_copy_bytes)
    return false;
  sl_cow_index_block *block = m->index_head;
  uint64_t at = 0;
  sl_cow_entry *prev = 0;
  for (sl_cow_entry *v = m->dirty_head, *next; v; v = next) {
    next = v->dirty_next;
    if (block && at == block->count) {
      block = block->next;
      at = 0;
    }
    assert(!block || block->versions[at] == v);
    copy_prefetch(m, block, at); /* the index: no wait on the list's chase */
    if (v->retired == RETIRED_NOT) {
      /* In the table: CURRENT, and neither a tombstone nor superseded
       * (both are retired, out of the table, when made). */
      assert(v->epoch == m->epoch && !v->tombstone && !v->superseded);
      sl_cow_entry *c = version_copy(m, v);
      if (!c)
        return true;
      version_replace(m, c, v, prev, &m->dirty_head, &m->dirty_tail, block,
                      at);
      prev = c;
    } else {
      prev = v;
    }
    at++;
  }
  return true;
}

/* The pending slot of epoch (one exists). */
static uint32_t pending_slot_of(const sl_cow_map *m, uint32_t epoch) {
  uint32_t i = m->pending_count;
  while (i > 0 && m->pending[i - 1].epoch != epoch)
    i--;
  assert(i > 0);
  return i - 1;
}

bool sl_cow_map_copy_step(sl_cow_map *m, uint32_t budget) {
  assert(m);
  if (m->copy_epoch == 0)
    return false;
  assert(!m->retain);
  uint32_t slot = pending_slot_of(m, m->copy_epoch);
  sl_cow_entry **head = &m->pending[slot].head;
  sl_cow_entry **tail = &m->pending_tails[slot].last;
  for (uint32_t done = 0; done < budget && m->copy_next; done++) {
    sl_cow_index_block *block = m->copy_block;
    if (block && m->copy_at == block->count) {
      block = m->copy_block = block->next;
      m->copy_at = 0;
    }
    uint64_t at = m->copy_at;
    assert(!block || block->versions[at] == m->copy_next);
    copy_prefetch(m, block, at);
    sl_cow_entry *v = m->copy_next;
    m->copy_next = v->dirty_next;
    m->copy_at = at + 1;
    if (v->retired != RETIRED_NOT) {
      m->copy_prev = v; /* out of the table: stays as it is */
      continue;
    }
    /* In the table, frozen with the pass's epoch: a write since the freeze
     * would have displaced it and marked it at once (retire_displaced). */
    assert(v->epoch == m->copy_epoch && !v->tombstone && !v->superseded);
    sl_cow_entry *c = version_copy(m, v);
    if (!c) {
      m->copy_next = 0; /* the rest stay frozen, copied on write */
      break;
    }
    version_replace(m, c, v, m->copy_prev, head, tail, block, at);
    m->copy_prev = c;
  }
  if (m->copy_next)
    return true;
  m->copy_epoch = 0;
  m->copy_prev = 0;
  m->copy_block = 0;
  m->copy_at = 0;
  assert(sl_cow_map_check(m));
  return false;
}

void sl_cow_map_copy_finish(sl_cow_map *m) {
  assert(m);
  while (sl_cow_map_copy_step(m, UINT32_MAX))
    ;
}

bool sl_cow_map_copying(const sl_cow_map *m) {
  assert(m);
  return m->copy_epoch != 0;
}

uint64_t sl_cow_map_copy_passes(const sl_cow_map *m) {
  assert(m);
  return m->copy_passes;
}

void sl_cow_map_set_copy_pass(sl_cow_map *m, uint64_t max_entries,
                              uint64_t max_bytes) {
  assert(m);
  m->copy_pass_entries = max_entries;
  m->copy_pass_bytes = max_bytes;
}

/* Freeze; a delta within the copy pass's limits (note 17) is left to it
 * if defer, copied now if within the copying freeze's (note 16). */
static sl_cow_delta freeze(sl_cow_map *m, bool defer) {
  assert(m);
  assert(!m->loading); /* no bulk load under way (header Caveats) */
  assert(m->epoch < UINT32_MAX); /* 4e9 checkpoints: not in this lifetime */
  sl_cow_map_copy_finish(m); /* the previous delta's pass, if any */
  bool pass = !freeze_by_copy(m) && defer && !m->retain &&
              m->dirty_entries > 0 &&
              m->dirty_entries <= m->copy_pass_entries &&
              m->dirty_bytes <= m->copy_pass_bytes;
  sl_cow_delta delta = {.epoch = m->epoch,
                        .head = m->dirty_head,
                        .entries = m->dirty_entries,
                        .bytes = m->dirty_bytes,
                        .index = m->index_head};
  assert(!m->index_head || (m->dirty_head && !m->index_dropped));
  if (m->pending_count < m->pending_capacity) {
    m->pending[m->pending_count] = delta;
    m->pending_tails[m->pending_count] =
        (cow_pending_end){.last = m->dirty_tail, .undo_mark = m->undo_pushed,
                          .undo_last = m->undo_tail,
                          .live_keys = cow_live_keys(m),
                          .deletes = m->dirty_deletes};
    m->pending_count++;
  } else {
    assert(!delta.head); /* dirty_slot_ready() kept a slot for it (note 5) */
  }
  if (pass && delta.head) {
    m->copy_epoch = m->epoch; /* note 17: copied in steps from now on */
    m->copy_next = delta.head;
    m->copy_prev = 0;
    m->copy_block = m->index_head;
    m->copy_at = 0;
    m->copy_passes++;
  }
  m->dirty_head = m->dirty_tail = 0;
  m->dirty_entries = m->dirty_bytes = 0;
  m->dirty_deletes = 0;
  m->index_head = m->index_tail = 0; /* the delta has it now */
  m->index_dropped = false;
  m->epoch++; /* every version of the old epoch is FROZEN from here on */
  if (m->pending_count == m->pending_capacity)
    pending_grow(m);
  return delta;
}

sl_cow_delta sl_cow_map_freeze(sl_cow_map *m) { return freeze(m, false); }

sl_cow_delta sl_cow_map_freeze_deferred(sl_cow_map *m) {
  return freeze(m, true);
}

void sl_cow_map_set_freeze_copy(sl_cow_map *m, uint64_t max_entries,
                                uint64_t max_bytes) {
  assert(m);
  m->freeze_copy_entries = max_entries;
  m->freeze_copy_bytes = max_bytes;
}

uint64_t sl_cow_map_freeze_copies(const sl_cow_map *m) {
  return m->freeze_copies;
}

uint64_t sl_cow_map_arena_spare_bytes(const sl_cow_map *m) {
  return m->arena_spare ? ARENA_CHUNK_BYTES : 0;
}

void sl_cow_map_pending(const sl_cow_map *m, const sl_cow_delta **deltas,
                        int *count) {
  assert(m);
  assert(!m->loading); /* no bulk load under way (header Caveats) */
  assert(deltas && count);
  *deltas = m->pending;
  *count = (int)m->pending_count;
}

/* Note 13: d's list is about to join the reclaim chain; its index joins
 * the reclaim index, or is freed if positions could not match.  The
 * index covers the chain exactly (it empties with the chain), unless an
 * unindexed list joined it. */
static void reclaim_index_add(sl_cow_map *m, const sl_cow_delta *d) {
  /* The map's own memory: const only to the writer, which reads it. */
  sl_cow_index_block *first = (sl_cow_index_block *)d->index;
  assert(!m->reclaim_head || m->reclaim_index || m->reclaim_unindexed);
  if (!d->head || !first || m->reclaim_unindexed) {
    cow_map_free_index(m, d->index, d->entries); /* header note 11 */
    if (d->head && !first) {
      m->reclaim_unindexed = true;
      reclaim_index_clear(m);
    }
    return;
  }
  sl_cow_index_block *last = first;
  while (last->next)
    last = last->next;
  if (m->reclaim_index_tail) {
    /* A cursor ahead at the end of the old tail moves on into first at
     * its next fetch (reclaim_fetch_next). */
    m->reclaim_index_tail->next = first;
  } else {
    m->reclaim_index = m->reclaim_ahead = first;
    m->reclaim_index_at = m->reclaim_ahead_at = 0;
    for (uint32_t i = 0; i < RECLAIM_AHEAD; i++)
      reclaim_fetch_next(m);
  }
  m->reclaim_index_tail = last;
}

void sl_cow_map_release(sl_cow_map *m, uint32_t epoch) {
  assert(m);
  assert(!m->loading); /* no bulk load under way (header Caveats) */
  if (m->copy_epoch && m->copy_epoch <= epoch)
    sl_cow_map_copy_finish(m); /* note 17: its delta goes to reclaim */
  uint32_t n = 0;
  for (; n < m->pending_count && m->pending[n].epoch <= epoch; n++) {
    const sl_cow_delta *d = &m->pending[n];
    assert((d->head == 0) == (m->pending_tails[n].last == 0));
    marking_take(m, &m->pending_tails[n]); /* note 15 */
    reclaim_index_add(m, d);
    if (!d->head)
      continue; /* an empty epoch: nothing to reclaim */
    if (m->reclaim_tail)
      m->reclaim_tail->dirty_next = d->head; /* RELEASED: writer is done */
    else
      m->reclaim_head = d->head;
    m->reclaim_tail = m->pending_tails[n].last;
    m->reclaim_entries += d->entries;
  }
  /* Note 12: the state as of epoch is the one a rollback restores, and
   * versions displaced in released epochs are needed no more (an empty
   * epoch left out of pending, note 5, displaced none). */
  uint32_t stable = epoch < m->epoch ? epoch : m->epoch - 1;
  if (stable > m->stable_epoch)
    m->stable_epoch = stable;
  if (n > 0) {
    /* The epochs after the newest released slot up to stable, if any,
     * had no slot: they were empty (note 5), so the count holds. */
    m->stable_live_keys = m->pending_tails[n - 1].live_keys;
    undo_release(m, &m->pending_tails[n - 1]);
    undo_index_trim(m);
  }
  m->pending_count -= n;
  memmove(m->pending, m->pending + n, m->pending_count * sizeof *m->pending);
  memmove(m->pending_tails, m->pending_tails + n,
          m->pending_count * sizeof *m->pending_tails);
}

bool sl_cow_map_maintain(sl_cow_map *m, uint32_t budget) {
  assert(m);
  assert(!m->loading); /* no bulk load under way (header Caveats) */
  return reclaim_steps(m, budget);
}

/* ------------------------------------------------------------ rollback */

int sl_cow_map_enable_rollback(sl_cow_map *m) {
  assert(m);
  assert(!m->loading); /* no bulk load under way (header Caveats) */
  if (m->retain)
    return 0;
  /* Note 12: versions displaced so far were not kept, so the state to
   * return to must be the present one: nothing written since the last
   * release. */
  if (m->dirty_head || m->pending_count)
    return EBUSY;
  marks_finish(m); /* note 15: rollback keeps no waiting marks */
  m->stable_epoch = m->epoch - 1;
  m->stable_live_keys = m->tables[0].used + m->tables[1].used;
  assert(m->copy_epoch == 0); /* note 17: a pass has a pending slot */
  m->retain = true;
  return 0;
}

bool sl_cow_map_rollback_enabled(const sl_cow_map *m) {
  assert(m);
  return m->retain;
}

uint32_t sl_cow_map_stable_epoch(const sl_cow_map *m) {
  assert(m);
  return m->stable_epoch;
}

uint64_t sl_cow_map_undo_entries(const sl_cow_map *m) {
  assert(m);
  return m->undo_pushed - m->undo_popped;
}

uint64_t sl_cow_map_rollbacks(const sl_cow_map *m) {
  assert(m);
  return m->rollbacks;
}

sl_cow_entry **cow_map_find_version(const sl_cow_map *m,
                                    const sl_cow_entry *e, int *table_index) {
  return find_link(m, e->hash, e->data, e->key_bytes, table_index);
}

void cow_map_unlink(sl_cow_map *m, sl_cow_entry **link, int table_index) {
  table_unlink(m, link, table_index);
}

void cow_map_link(sl_cow_map *m, sl_cow_entry *e) {
  rehash_start_if_full(m); /* before inserting: new entries go to [1] */
  table_insert(m, e);
}

void cow_map_free_version(sl_cow_map *m, sl_cow_entry *e) { entry_free(m, e); }
