/* alloc.c — the arenas behind sl_alloc (alloc.h): creating, resetting and
 * pooling them through mallctl, and reading their statistics.  Without
 * jemalloc, only the answers of the malloc fallback.
 */
#include "alloc.h"

#include <errno.h>
#include <stdio.h>
#include <sys/mman.h>

/* Note 8: the huge page size that MADV_HUGEPAGE maps on x86-64. */
#define HUGE_PAGE_BYTES ((uintptr_t)2 << 20)

void sl_alloc_advise_huge(void *p, size_t bytes) {
#ifdef MADV_HUGEPAGE
  uintptr_t start =
      ((uintptr_t)p + HUGE_PAGE_BYTES - 1) & ~(HUGE_PAGE_BYTES - 1);
  uintptr_t end = ((uintptr_t)p + bytes) & ~(HUGE_PAGE_BYTES - 1);
  if (p && end > start)
    (void)madvise((void *)start, end - start, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

#ifdef SL_USE_JEMALLOC

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>
#include <sys/types.h>

#include "log.h"

/* Note 6: whether jemalloc's entry points are split between objects,
 * decided once by split_check. */
static pthread_once_t split_once = PTHREAD_ONCE_INIT;
static bool split;

typedef void (*entry_fn)(void);

/* The object (its load address) that holds fn, and its file name. */
static void *object_of(entry_fn fn, const char **file) {
  void *address;
  memcpy(&address, &fn, sizeof address); /* function to object (POSIX) */
  Dl_info info;
  if (dladdr(address, &info) == 0)
    return NULL;
  *file = info.dli_fname ? info.dli_fname : "?";
  return info.dli_fbase;
}

/* Note 6: every entry point of this seam, as the dynamic linker resolved
 * it for libsluice, must come from the object that holds mallocx. */
static void split_check(void) {
  static const struct {
    const char *name;
    entry_fn fn;
  } entries[] = {
      {"sdallocx", (entry_fn)sdallocx},
      {"sallocx", (entry_fn)sallocx},
      {"nallocx", (entry_fn)nallocx},
      {"mallctl", (entry_fn)mallctl},
  };
  const char *home_file = "?";
  void *home = object_of((entry_fn)mallocx, &home_file);
  for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
    const char *file = "?";
    void *object = object_of(entries[i].fn, &file);
    if (home && object == home)
      continue;
    split = true;
    sl_log(SL_LOG_WARN,
           "sluice: keyed state uses malloc/free, not jemalloc: mallocx "
           "comes from %s but %s from %s (another allocator, such as "
           "tcmalloc, is linked or preloaded)",
           home_file, entries[i].name, file);
    return;
  }
}

static bool jemalloc_split(void) {
  pthread_once(&split_once, split_check);
  return split;
}

/* Reset arenas with their flushed tcaches, ready for reuse (note 3).  A
 * lock, not a lock-free stack: maps are created and destroyed a few times
 * per job attempt, never on the record path. */
typedef struct pooled {
  unsigned arena;
  unsigned tcache;
} pooled;

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pooled pool[SL_ALLOC_POOL_MAX];
static int pool_count;

/* mallctl "arena.<arena>.<suffix>", a command without data: reset,
 * purge or destroy. */
static int arena_command(unsigned arena, const char *suffix) {
  char name[64];
  int n = snprintf(name, sizeof name, "arena.%u.%s", arena, suffix);
  if (n < 0 || (size_t)n >= sizeof name)
    return ENAMETOOLONG;
  return mallctl(name, 0, 0, 0, 0);
}

static bool pool_take(pooled *p) {
  pthread_mutex_lock(&pool_lock);
  bool taken = pool_count > 0;
  if (taken)
    *p = pool[--pool_count];
  pthread_mutex_unlock(&pool_lock);
  return taken;
}

static bool pool_give(pooled p) {
  pthread_mutex_lock(&pool_lock);
  bool kept = pool_count < SL_ALLOC_POOL_MAX;
  if (kept)
    pool[pool_count++] = p;
  pthread_mutex_unlock(&pool_lock);
  return kept;
}

/* Note 7: no decay-driven purging in arena, dirty or muzzy.  A refusal
 * leaves jemalloc's default, which is slower but correct. */
static void decay_off(unsigned arena) {
  static const char *const kinds[2] = {"dirty_decay_ms", "muzzy_decay_ms"};
  for (int k = 0; k < 2; k++) {
    char name[64];
    ssize_t never = -1;
    int n = snprintf(name, sizeof name, "arena.%u.%s", arena, kinds[k]);
    if (n > 0 && (size_t)n < sizeof name)
      (void)mallctl(name, 0, 0, &never, sizeof never);
  }
}

/* A new arena and tcache pair; false if jemalloc has none to give. */
static bool pair_create(pooled *p) {
  size_t size = sizeof p->arena;
  if (mallctl("arenas.create", &p->arena, &size, 0, 0) != 0)
    return false;
  decay_off(p->arena); /* kept while pooled: reset and purge leave it */
  size = sizeof p->tcache;
  if (mallctl("tcache.create", &p->tcache, &size, 0, 0) != 0) {
    /* The arena is empty: destroying it frees its index for reuse. */
    (void)arena_command(p->arena, "destroy");
    return false;
  }
  return true;
}

void sl_alloc_open(sl_alloc *a) {
  if (jemalloc_split()) {
    *a = (sl_alloc){.flags = 0, .resettable = false, .system = true};
    return;
  }
  pooled p;
  if (pool_take(&p) || pair_create(&p)) {
    *a = (sl_alloc){.flags = MALLOCX_ARENA(p.arena) | MALLOCX_TCACHE(p.tcache),
                    .arena = p.arena, .tcache = p.tcache, .resettable = true};
    return;
  }
  /* Note 4: jemalloc's default arenas, object by object. */
  *a = (sl_alloc){.flags = MALLOCX_TCACHE_NONE, .resettable = false};
}

void sl_alloc_close(sl_alloc *a) {
  if (!a->resettable)
    return;
  /* Note 3: the tcache first, as "arena.<i>.reset" requires; then the
   * reset discards every allocation; the purge hands the pages back. */
  unsigned tcache = a->tcache;
  int rc = mallctl("tcache.flush", 0, 0, &tcache, sizeof tcache);
  if (rc == 0)
    rc = arena_command(a->arena, "reset");
  if (rc == 0)
    rc = arena_command(a->arena, "purge");
  pooled p = {.arena = a->arena, .tcache = a->tcache};
  if (rc != 0 || !pool_give(p)) {
    /* Not reusable (a failed mallctl cannot happen with a valid index,
     * but then the pair is dropped rather than reused half reset), or the
     * pool is full: give both back to jemalloc. */
    (void)mallctl("tcache.destroy", 0, 0, &tcache, sizeof tcache);
    (void)arena_command(a->arena, "destroy");
  }
  a->resettable = false;
  a->flags = MALLOCX_TCACHE_NONE;
}

const char *sl_alloc_name(void) {
  return jemalloc_split() ? "malloc" : "jemalloc";
}

/* One uint64 statistic of an arena ("stats.arenas.<i>.<what>"). */
static int arena_stat(unsigned arena, const char *what, uint64_t *value) {
  char name[96];
  int n = snprintf(name, sizeof name, "stats.arenas.%u.%s", arena, what);
  if (n < 0 || (size_t)n >= sizeof name)
    return ENAMETOOLONG;
  size_t bytes = 0, size = sizeof bytes;
  int rc = mallctl(name, &bytes, &size, 0, 0);
  if (rc == 0)
    *value = bytes;
  return rc;
}

void sl_alloc_purge(const sl_alloc *a) {
  if (a->resettable)
    (void)arena_command(a->arena, "purge"); /* pages stay ours if refused */
}

int sl_alloc_allocated_bytes(const sl_alloc *a, uint64_t *bytes) {
  if (!a->resettable)
    return ENOTSUP;
  /* Statistics are cached until an epoch advances. */
  uint64_t epoch = 1;
  size_t size = sizeof epoch;
  int rc = mallctl("epoch", &epoch, &size, &epoch, sizeof epoch);
  uint64_t small = 0, large = 0;
  if (rc == 0)
    rc = arena_stat(a->arena, "small.allocated", &small);
  if (rc == 0)
    rc = arena_stat(a->arena, "large.allocated", &large);
  if (rc == 0)
    *bytes = small + large;
  return rc;
}

#else /* malloc and free (alloc.h note 4) */

void sl_alloc_open(sl_alloc *a) {
  *a = (sl_alloc){.flags = 0, .resettable = false};
}

void sl_alloc_close(sl_alloc *a) { a->resettable = false; }

void sl_alloc_purge(const sl_alloc *a) { (void)a; }

const char *sl_alloc_name(void) { return "malloc"; }

int sl_alloc_allocated_bytes(const sl_alloc *a, uint64_t *bytes) {
  (void)a;
  (void)bytes;
  return ENOTSUP;
}

#endif
