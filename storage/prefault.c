/* prefault.c — the helper thread of prefault.h, whose notes say what it
 * does and why.  One mutex guards the queue; the thread holds it only to
 * choose a region and to mark it done, never while it populates.
 */
#include "prefault.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef enum { REGION_QUEUED, REGION_RUNNING, REGION_DONE } region_state;

typedef struct region {
  uint8_t *addr;
  size_t bytes;
  bool spare;
  region_state state;
} region;

struct sl_prefault {
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t wake;
  bool joined;
  bool disabled; /* madvise refused (note 2): posts are refused */
  /* The queue, in post order (note 3); under lock. */
  region regions[SL_PREFAULT_REGIONS];
  size_t count;
  atomic_bool stopping;
  atomic_bool cancel; /* the running spare was taken (note 3) */
  _Atomic uint64_t populated_bytes;
};

/* Note 2: whole pages only; false when the kernel cannot populate. */
static bool populate_range(uint8_t *addr, size_t bytes) {
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t start = ((uintptr_t)addr + page - 1) & ~(page - 1);
  uintptr_t end = ((uintptr_t)addr + bytes) & ~(page - 1);
  if (end <= start)
    return true;
#ifdef MADV_POPULATE_WRITE
  return madvise((void *)start, end - start, MADV_POPULATE_WRITE) == 0 ||
         errno != EINVAL;
#else
  return false;
#endif
}

void sl_prefault_populate(void *addr, size_t bytes) {
  (void)populate_range(addr, bytes);
}

/* The region the thread does next (note 3), or -1; under lock. */
static int region_next(const sl_prefault *p) {
  for (size_t i = 0; i < p->count; i++)
    if (!p->regions[i].spare && p->regions[i].state == REGION_QUEUED)
      return (int)i;
  for (size_t i = p->count; i-- > 0;)
    if (p->regions[i].state == REGION_QUEUED)
      return (int)i;
  return -1;
}

static void region_remove(sl_prefault *p, size_t i) {
  assert(i < p->count);
  memmove(&p->regions[i], &p->regions[i + 1],
          (p->count - i - 1) * sizeof p->regions[0]);
  p->count--;
}

/* Populate one region in steps, stopping early when asked (note 4) or
 * when the running spare was taken (note 3).  false: the kernel cannot. */
static bool region_populate(sl_prefault *p, region r) {
  for (size_t at = 0; at < r.bytes; at += SL_PREFAULT_STEP_BYTES) {
    if (atomic_load_explicit(&p->stopping, memory_order_relaxed) ||
        atomic_load_explicit(&p->cancel, memory_order_relaxed))
      return true;
    size_t step = r.bytes - at < SL_PREFAULT_STEP_BYTES
                      ? r.bytes - at : SL_PREFAULT_STEP_BYTES;
    if (!populate_range(r.addr + at, step))
      return false;
    atomic_fetch_add_explicit(&p->populated_bytes, step,
                              memory_order_relaxed);
  }
  return true;
}

static void *prefault_main(void *arg) {
  sl_prefault *p = arg;
  pthread_mutex_lock(&p->lock);
  while (!atomic_load(&p->stopping)) {
    int i = p->disabled ? -1 : region_next(p);
    if (i < 0) {
      pthread_cond_wait(&p->wake, &p->lock);
      continue;
    }
    region r = p->regions[i];
    if (r.spare)
      p->regions[i].state = REGION_RUNNING;
    else
      region_remove(p, (size_t)i); /* populated and forgotten */
    atomic_store(&p->cancel, false);
    pthread_mutex_unlock(&p->lock);
    bool can = region_populate(p, r);
    pthread_mutex_lock(&p->lock);
    p->disabled |= !can;
    for (size_t k = 0; r.spare && k < p->count; k++)
      if (p->regions[k].addr == r.addr) /* not taken meanwhile */
        p->regions[k].state = REGION_DONE;
  }
  pthread_mutex_unlock(&p->lock);
  return 0;
}

/* Note 7: the helper runs on the process's CPUs (its main thread's mask)
 * less the caller's, if that leaves one; else where the caller may.  An
 * unreadable mask leaves attr as it is (the caller's, inherited). */
static void helper_cpus(pthread_attr_t *attr) {
  cpu_set_t process, caller, others;
  if (sched_getaffinity(getpid(), sizeof process, &process) != 0 ||
      pthread_getaffinity_np(pthread_self(), sizeof caller, &caller) != 0)
    return;
  CPU_ZERO(&others);
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
    if (CPU_ISSET(cpu, &process) && !CPU_ISSET(cpu, &caller))
      CPU_SET(cpu, &others);
  (void)pthread_attr_setaffinity_np(
      attr, sizeof others, CPU_COUNT(&others) > 0 ? &others : &process);
}

int sl_prefault_start(sl_prefault **out) {
  *out = 0;
  const char *knob = getenv("SLUICE_PREFAULT"); /* note 6 */
  if (knob && strcmp(knob, "0") == 0)
    return EAGAIN;
  sl_prefault *p = calloc(1, sizeof *p);
  if (!p)
    return ENOMEM;
  atomic_init(&p->stopping, false);
  atomic_init(&p->cancel, false);
  atomic_init(&p->populated_bytes, 0);
  int rc = pthread_mutex_init(&p->lock, 0);
  if (rc) {
    free(p);
    return rc;
  }
  rc = pthread_cond_init(&p->wake, 0);
  pthread_attr_t attr;
  bool placed = rc == 0 && pthread_attr_init(&attr) == 0;
  if (placed)
    helper_cpus(&attr);
  if (rc == 0) {
    rc = pthread_create(&p->thread, placed ? &attr : 0, prefault_main, p);
    if (rc)
      pthread_cond_destroy(&p->wake);
  }
  if (placed)
    pthread_attr_destroy(&attr);
  if (rc) {
    pthread_mutex_destroy(&p->lock);
    free(p);
    return rc;
  }
  *out = p;
  return 0;
}

static bool post(sl_prefault *p, void *addr, size_t bytes, bool spare) {
  if (!p || !addr)
    return false;
  pthread_mutex_lock(&p->lock);
  bool room = p->count < SL_PREFAULT_REGIONS && !p->disabled &&
              !atomic_load(&p->stopping);
  if (room) {
    p->regions[p->count++] = (region){.addr = addr, .bytes = bytes,
                                      .spare = spare,
                                      .state = REGION_QUEUED};
    pthread_cond_signal(&p->wake);
  }
  pthread_mutex_unlock(&p->lock);
  return room;
}

bool sl_prefault_post(sl_prefault *p, void *addr, size_t bytes) {
  return post(p, addr, bytes, false);
}

bool sl_prefault_post_spare(sl_prefault *p, void *addr, size_t bytes) {
  return post(p, addr, bytes, true);
}

void *sl_prefault_take(sl_prefault *p) {
  if (!p)
    return 0;
  void *addr = 0;
  pthread_mutex_lock(&p->lock);
  for (size_t i = 0; i < p->count && !addr; i++) {
    if (!p->regions[i].spare)
      continue;
    addr = p->regions[i].addr;
    if (p->regions[i].state == REGION_RUNNING) /* note 3 */
      atomic_store(&p->cancel, true);
    region_remove(p, i);
  }
  pthread_mutex_unlock(&p->lock);
  return addr;
}

void sl_prefault_stop(sl_prefault *p) {
  if (!p || p->joined)
    return;
  pthread_mutex_lock(&p->lock);
  atomic_store(&p->stopping, true);
  pthread_cond_signal(&p->wake);
  pthread_mutex_unlock(&p->lock);
  pthread_join(p->thread, 0);
  p->joined = true;
}

void sl_prefault_destroy(sl_prefault *p) {
  if (!p)
    return;
  sl_prefault_stop(p);
  for (size_t i = 0; i < p->count; i++)
    assert(!p->regions[i].spare); /* the owner took every spare */
  pthread_cond_destroy(&p->wake);
  pthread_mutex_destroy(&p->lock);
  free(p);
}

uint64_t sl_prefault_populated_bytes(const sl_prefault *p) {
  return p ? atomic_load_explicit(&p->populated_bytes,
                                  memory_order_relaxed)
           : 0;
}
