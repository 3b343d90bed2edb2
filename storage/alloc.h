/* alloc.h — the one allocator seam of keyed state: each map allocates
 * through its own sl_alloc, which is a private jemalloc arena when the
 * library is built with jemalloc, and malloc/free otherwise.
 *
 * NOTES ON THE DESIGN
 *
 * 1. Why explicit calls.  libsluice.so links jemalloc, but in a host whose
 *    executable links libc before libsluice (the usual case), the symbol
 *    malloc resolves to glibc's: the dynamic linker searches the
 *    executable's DT_NEEDED list before libsluice's.  mallocx(),
 *    sdallocx(), sallocx(), nallocx() and mallctl() are jemalloc's own
 *    API, which glibc does not have, so calling them reaches jemalloc in
 *    such a host.  Other allocators export some of these names too
 *    (gperftools' tcmalloc has nallocx, Google's tcmalloc sdallocx): see
 *    note 6 for a host that links or preloads one.
 * 2. One arena and one explicit tcache per sl_alloc (one per keyed-state
 *    map), both created by mallctl ("arenas.create", "tcache.create").
 *    Every allocation passes MALLOCX_ARENA(arena) | MALLOCX_TCACHE(tcache),
 *    so the tcache only ever caches objects of this arena, and only the
 *    map uses either.  The tcache keeps the fast path of jemalloc's thread
 *    caches; it is not thread-safe, which the map's owner rule (cow_map.h
 *    note 1) already provides: one thread at a time, with a happens-before
 *    hand-off between threads.
 * 3. Dropping a map is one reset: everything in the arena belongs to that
 *    map, so sl_alloc_close() flushes the tcache (jemalloc requires it
 *    before "arena.<i>.reset"), resets the arena (discarding every
 *    allocation at once, with no walk over entries), purges its dirty
 *    pages (so an idle, pooled arena holds no physical memory) and keeps
 *    the pair in a pool for the next sl_alloc_open().  Arenas are thus
 *    reused across restarts and jobs, never leaked.  jemalloc 5.3 also has
 *    "arena.<i>.destroy", used only when the pool is full
 *    (SL_ALLOC_POOL_MAX): a pooled arena costs its metadata only.
 * 4. When no arena can be had (jemalloc's limit of about 4K arenas, or
 *    ENOMEM in mallctl), sl_alloc_open() still succeeds: that sl_alloc
 *    allocates from jemalloc's default arenas without a tcache, and is
 *    not resettable, so its owner frees object by object as without
 *    jemalloc.  Builds without jemalloc (SL_USE_JEMALLOC undefined:
 *    sanitizer builds, -Djemalloc=disabled) are that case throughout, on
 *    malloc/free.  Either way the caller's code is the same; only
 *    sl_alloc_resettable() tells it whether it must free every object.
 * 5. sl_alloc_free() takes the size given at allocation (sdallocx skips a
 *    size lookup); debug builds check it against jemalloc's own record.
 * 6. All of jemalloc or none.  With tcmalloc preloaded (LD_PRELOAD) or
 *    linked by the host, mallocx still resolves to jemalloc but nallocx
 *    (or sdallocx) to tcmalloc: jemalloc's memory would be handed to
 *    tcmalloc to free, corrupting both heaps.  So the first
 *    sl_alloc_open() checks, with dladdr(), that every entry point this
 *    seam calls (mallocx, sdallocx, sallocx, nallocx, mallctl) resolves
 *    into one and the same object; if not, it logs one WARN line naming
 *    the two objects and every sl_alloc of the process uses malloc/free
 *    (the `system` flag below, note 4's fallback), whichever malloc the
 *    host has.  The answer is computed once and kept.
 * 7. No purging on a timer.  jemalloc hands a freed extent's pages back
 *    to the kernel a while later (its dirty and muzzy decay, 10 s by
 *    default), and a later allocation then faults them in again, zeroed.
 *    A map frees and allocates versions in every checkpoint cycle (copy
 *    on write, reclaim: cow_map.h notes 1-3), so under checkpoints the
 *    owner's thread kept zeroing pages it had used a moment before:
 *    checkpoint_bench part 1 (1M keys, every 100 ms) spent 6% of the
 *    keyed thread's CPU in the kernel's clear_page, none with decay
 *    off.  So each arena is created with both decays off (-1): its
 *    pages stay its own up to the map's high-water mark, which
 *    memory_bench's peak measures anyway, and go back at close, whose
 *    purge (note 3) is explicit.  Where jemalloc refuses the setting the
 *    arena keeps the default decay; nothing else changes.  A large free
 *    that will not be allocated again soon, the old bucket table after a
 *    rehash, is purged at once (sl_alloc_purge): kept, the tables a
 *    growing state left behind added 13 bytes an entry to a 10M-key
 *    state's RSS (memory_bench).
 * 8. Huge pages for bucket tables.  A table is read and written at
 *    random, one bucket an operation, and a large one is all used
 *    (the load factor stays between 5/16 and 1, cow_map.c note 6).  On
 *    4 KiB pages nearly every bucket of a 128 MiB table (10M keys) is a
 *    TLB miss, which in a VM is a walk of two page tables, and each page
 *    is one fault at its first touch.  So sl_alloc_advise_huge asks for
 *    transparent huge pages (madvise MADV_HUGEPAGE) over the whole 2 MiB
 *    pages inside a table of at least that size; the kernel's "madvise"
 *    mode, which this project's VM has, gives them only where asked.
 *    Where it refuses, or THP is off, nothing changes.  The pages stay
 *    advised when jemalloc reuses the range: still this arena's memory
 *    (note 2).  Measured on a 10M-key restore in a fresh process (perf,
 *    2026-12-07): the prefault helper's samples in clear_page fell from
 *    4,911 to 2,243, and the restore's time by about 5% (4 interleaved
 *    rounds, medians: start to restored 1,057 against 1,123 ms, the
 *    restoring thread's CPU 1,022 against 1,078 ms).  The
 *    load still stalls at the bucket's prefetch (about 90% of
 *    sl_cow_map_load_add's samples either way), so that is not the TLB
 *    alone.
 */
#ifndef SL_ALLOC_H
#define SL_ALLOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#ifdef SL_USE_JEMALLOC
#include <assert.h>
#include <jemalloc/jemalloc.h>
#endif

typedef struct sl_alloc {
  int flags;         /* mallocx flags: arena and tcache (note 2) */
  unsigned arena;    /* valid when resettable */
  unsigned tcache;   /* valid when resettable */
  bool resettable;   /* own arena: close discards everything (note 3) */
  bool system;       /* jemalloc's API is split (note 6): malloc/free */
} sl_alloc;

/* Pooled (reset) arenas kept for reuse; beyond this they are destroyed. */
#define SL_ALLOC_POOL_MAX 256

/** Take an arena for one owner (from the pool, or a new one).  Cannot
 * fail: without an arena the sl_alloc frees object by object (note 4). */
void sl_alloc_open(sl_alloc *a);

/** Give the arena back: with a resettable sl_alloc every object allocated
 * through it is freed at once (the caller must not touch any afterwards,
 * and must have freed them itself otherwise).  Any thread, once the owner
 * has stopped using it. */
void sl_alloc_close(sl_alloc *a);

static inline bool sl_alloc_resettable(const sl_alloc *a) {
  return a->resettable;
}

/** "jemalloc" or "malloc": what serves keyed state in this build. */
const char *sl_alloc_name(void);

/** Hand the unused pages of a's arena back to the kernel now (alloc.h
 * note 7: with decay off nothing else does while a lives).  For rare,
 * large frees, such as an old bucket table after a rehash.  A no-op
 * without an arena of a's own. */
void sl_alloc_purge(const sl_alloc *a);

/** Advise huge pages for the 2 MiB pages inside [p, p + bytes) (note 8),
 * before they are first touched.  Best effort; any allocation. */
void sl_alloc_advise_huge(void *p, size_t bytes);

/** Bytes allocated in a's arena (jemalloc's stats after an "epoch"
 * refresh; objects in its tcache count as allocated).  Returns 0, or
 * ENOTSUP when a has no arena of its own (or without jemalloc), or the
 * mallctl error. */
int sl_alloc_allocated_bytes(const sl_alloc *a, uint64_t *bytes);

#ifdef SL_USE_JEMALLOC

static inline void *sl_alloc_bytes(const sl_alloc *a, size_t bytes) {
  if (a->system)
    return malloc(bytes ? bytes : 1);
  return mallocx(bytes ? bytes : 1, a->flags);
}
static inline void *sl_alloc_zeroed(const sl_alloc *a, size_t bytes) {
  if (a->system)
    return calloc(1, bytes ? bytes : 1);
  return mallocx(bytes ? bytes : 1, a->flags | MALLOCX_ZERO);
}
/** alignment: a power of two. */
static inline void *sl_alloc_aligned(const sl_alloc *a, size_t alignment,
                                     size_t bytes) {
  if (a->system)
    return aligned_alloc(alignment, bytes);
  return mallocx(bytes, a->flags | MALLOCX_ALIGN(alignment));
}
/** Free p (NULL accepted), allocated through a with `bytes` (and
 * `alignment`, 0 for none) as given then (note 5). */
static inline void sl_alloc_free_aligned(const sl_alloc *a, void *p,
                                         size_t alignment, size_t bytes) {
  if (!p)
    return;
  if (a->system) {
    free(p);
    return;
  }
  int flags = a->flags | (alignment ? MALLOCX_ALIGN(alignment) : 0);
  if (!bytes)
    bytes = 1;
  /* Note 5: a wrong size would corrupt jemalloc's size classes silently. */
  assert(sallocx(p, 0) == nallocx(bytes, flags));
  sdallocx(p, bytes, flags);
}

#else /* malloc and free (note 4) */

static inline void *sl_alloc_bytes(const sl_alloc *a, size_t bytes) {
  (void)a;
  return malloc(bytes ? bytes : 1);
}
static inline void *sl_alloc_zeroed(const sl_alloc *a, size_t bytes) {
  (void)a;
  return calloc(1, bytes ? bytes : 1);
}
static inline void *sl_alloc_aligned(const sl_alloc *a, size_t alignment,
                                     size_t bytes) {
  (void)a;
  return aligned_alloc(alignment, bytes);
}
static inline void sl_alloc_free_aligned(const sl_alloc *a, void *p,
                                         size_t alignment, size_t bytes) {
  (void)a;
  (void)alignment;
  (void)bytes;
  free(p);
}

#endif

static inline void sl_alloc_free(const sl_alloc *a, void *p, size_t bytes) {
  sl_alloc_free_aligned(a, p, 0, bytes);
}

#endif /* SL_ALLOC_H */
