/* prefault.h — a helper thread that faults in memory a bulk load will
 * write soon, so the kernel's page zeroing runs on another CPU than the
 * load's (cow_map.c note 14, engine/restore.c note 5, and note 7).
 *
 * NOTES ON THE DESIGN
 *
 * 1. Why.  A 10M-key restore writes about 700 MB of fresh memory (the
 *    bucket table and the load arena's chunks).  Every first touch of a
 *    page is a fault whose kernel zeroes the page; on this project's VM
 *    that zeroing was 56% of a 10M-key restore's samples (perf, the
 *    restoring thread in clear_page_erms under the arena's huge-page
 *    faults), at well under 1 GB/s.  The other CPU is idle meanwhile.
 * 2. How.  The thread calls madvise(MADV_POPULATE_WRITE) on the regions
 *    posted to it, one huge page (2 MiB) at a time.  Populating writes
 *    no byte a program can see: the kernel maps zeroed pages where none
 *    are mapped and leaves mapped ones alone.  So the owner may write a
 *    region while it is being populated (no data race: the thread never
 *    reads or writes the memory itself, and the kernel serializes faults
 *    on one page), and the worst a late populate can do is waste work.
 *    Kernels without MADV_POPULATE_WRITE (before 5.14) answer EINVAL;
 *    the thread then stops populating and the owner faults as before.
 * 3. Two kinds of region.  A spare (sl_prefault_post_spare) is memory the
 *    owner allocated ahead and will take back, oldest first
 *    (sl_prefault_take): the load arena's next chunks.  Other regions
 *    (sl_prefault_post) are populated and forgotten.  The thread takes
 *    plain regions first, in order, then the newest spare not yet
 *    started: the owner takes the oldest, so the two work from opposite
 *    ends and rarely fault the same page.  A spare taken while it is
 *    being populated stops being populated at the next 2 MiB step.
 * 4. The owner never waits for the thread, except in sl_prefault_stop,
 *    for at most one 2 MiB step.  After sl_prefault_stop returns, no
 *    populate runs: the owner may free any region it posted.
 * 5. Bounded: at most SL_PREFAULT_REGIONS regions are queued; a post
 *    beyond that is refused (false), and the owner simply faults that
 *    memory itself.
 * 6. SLUICE_PREFAULT=0 in the environment makes sl_prefault_start fail
 *    with EAGAIN, as when no thread can be created: the load then runs
 *    without a helper (and tests exercise that path this way).  Which
 *    restores start one at all is engine/restore.c's choice (its note 5,
 *    SLUICE_PREFAULT_MIN_ENTRIES).
 * 7. Where the thread runs.  Its owner is an instance thread, usually
 *    pinned to one CPU, and a new thread inherits its creator's CPUs: the
 *    helper used to share its owner's CPU, so the zeroing it took off the
 *    load ran in the load's time slices all the same.  So
 *    sl_prefault_start gives the thread the process's CPUs (its main
 *    thread's mask) less the owner's, or the owner's where that leaves
 *    none (a process on one CPU).  A 10M-key restore in a fresh process
 *    (checkpoint_bench --restore-child on one kept store, 4 interleaved
 *    rounds, 2026-12-07): from start to restored 1.72-1.94 s before,
 *    the restoring thread's CPU 1.04-1.22 s of it; 1.07-1.18 s after,
 *    its CPU 1.04-1.13 s.
 *
 * Which calls may run concurrently: every call is the owner's (one
 * thread), except that sl_prefault_populated_bytes may be called by any
 * thread; the helper thread is internal.
 */
#ifndef SL_PREFAULT_H
#define SL_PREFAULT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SL_PREFAULT_REGIONS 32u
#define SL_PREFAULT_STEP_BYTES ((size_t)2 << 20) /* a huge page */

typedef struct sl_prefault sl_prefault;

/** Start the helper thread.  0; ENOMEM; EAGAIN (SLUICE_PREFAULT=0, note 6)
 * or pthread_create's error, with *out NULL and nothing started. */
int sl_prefault_start(sl_prefault **out);

/** Queue [addr, addr + bytes) to be populated (note 3).  false if the
 * queue is full (note 5), p is NULL, or the thread stopped populating. */
bool sl_prefault_post(sl_prefault *p, void *addr, size_t bytes);

/** Queue a spare region the owner will take back (note 3).  false as
 * sl_prefault_post; then the owner still holds the region. */
bool sl_prefault_post_spare(sl_prefault *p, void *addr, size_t bytes);

/** The oldest spare not yet taken, out of the queue (populated or not),
 * or NULL if none (or p is NULL). */
void *sl_prefault_take(sl_prefault *p);

/** Populate [addr, addr + bytes) on the calling thread (note 2). */
void sl_prefault_populate(void *addr, size_t bytes);

/** Stop and join the thread (note 4); spares stay queued for
 * sl_prefault_take.  Idempotent; NULL accepted. */
void sl_prefault_stop(sl_prefault *p);

/** Stop (if not yet) and free p; every spare must have been taken.  NULL
 * accepted. */
void sl_prefault_destroy(sl_prefault *p);

/** Bytes the thread populated so far (for tests and benchmarks). */
uint64_t sl_prefault_populated_bytes(const sl_prefault *p);

#endif /* SL_PREFAULT_H */
