/* ring_bench.c — throughput of sluice's SPSC ring (engine/ring.h) between
 * two pinned threads, side by side with three references in one binary:
 *
 *   (s) sluice    sl_ring with parkers, the way the engine uses it
 *   (a) spsc-ref  a minimal SPSC array loop written here: the ceiling
 *   (b) mutex     a bounded queue under a pthread mutex + two condvars
 *   (c) wfcqueue  liburcu's wait-free concurrent queue, pooled nodes
 *   (s0) sluice-noparker  diagnostic, not run by default: sl_ring with no
 *        parkers (no wake checks, waits spin then yield like (a))
 *
 * METHOD
 *
 * 1. The producer runs on --producer-cpu (0), the consumer on
 *    --consumer-cpu (1).  Both start together at a barrier; the clock runs
 *    from the producer's first record to the consumer's last.
 * 2. A record is 16 bytes {key, value}: key i = 0, 1, 2..., value = i times
 *    an odd constant.  The consumer checks every key arrives in order and
 *    sums the values; a run counts only if the count, the order and the sum
 *    all match (else the program stops with an error).
 * 3. batch = records the producer writes per publish (s, a), per splice
 *    into the shared queue (c), or at most per lock acquisition (b).
 *    A full queue publishes the partial batch before waiting.
 * 4. The consumer reads a burst — everything visible, up to a quarter of
 *    the capacity — and releases it once per burst (--release burst, the
 *    default) or once per producer batch (--release batch).
 * 5. Waiting: spin --spin times with a pause instruction, then (s) parks
 *    on its futex parker (wait.h protocol), (a)/(s0)/(c) call sched_yield,
 *    (b) blocks on its condition variable.  Parker sleeps are reported: a
 *    run where they are frequent measured wake-ups, not the ring.
 * 6. Capacity is the same number of bytes for all (--ring-bytes, 256 KiB,
 *    rounded up to a power of two): (a) and (b) hold bytes/16 records, (c)
 *    has a pool of bytes/16 nodes; (s) fits a little less since each batch
 *    entry has an 8-byte header.
 * 7. (c) is unbounded by itself; it is bounded here by a credit counter:
 *    the consumer publishes how many records it has finished, and the
 *    producer reuses pool node i mod capacity only when i - finished <
 *    capacity.  Nodes are preallocated, so malloc is not measured.  The
 *    non-blocking dequeue-side calls are used with our own spin, because the
 *    blocking ones sleep 10 ms in poll() after 10 busy attempts.
 * 8. Configurations are interleaved (for each batch, for each repeat, each
 *    queue in turn) so drift on a shared machine hits all queues alike.
 *    Reported: median, min and max of --repeat runs in M records/s, and
 *    s/a = median(s)/median(a) (target: >= 0.80 at batch >= 64) plus the
 *    median of the per-repeat ratios.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <urcu/wfcqueue.h>

#include "bench_util.h"
#include "ring.h"
#include "wait.h"

/* 64-byte lines on the x86-64 and arm64 machines we run on. */
#define BENCH_LINE 64
#define MAX_BATCHES 16u   /* entries in --batches */
#define MAX_BATCH_RECORDS 256u /* largest batch */
#define DEFAULT_RECORDS 50000000ull
#define DEFAULT_RECORDS_SLOW 5000000ull
#define QUICK_RECORDS 1000000ull
#define QUICK_RECORDS_SLOW 200000ull
#define DEFAULT_SPIN_LIMIT 20000ull
#define VALUE_MULTIPLIER 0x9E3779B97F4A7C15ull /* odd: value i*M is unique */

typedef struct bench_record {
  uint64_t key;
  uint64_t value;
} bench_record;
_Static_assert(sizeof(bench_record) == 16, "the benchmark moves 16-byte records");

/* ------------------------------------------------------------ the run */

typedef struct bench_run {
  /* Inputs, constant during the run. */
  uint64_t records;
  uint64_t batch;
  uint64_t capacity_bytes; /* power of two */
  uint64_t spin_limit;
  bool release_per_batch;
  void *queue; /* the implementation's state */
  pthread_barrier_t start;
  /* Outputs: the producer writes start_ns, the consumer the rest. */
  uint64_t start_ns;
  uint64_t end_ns;
  uint64_t records_seen;
  uint64_t checksum;
  uint64_t key_mismatches;
  uint64_t producer_sleeps; /* futex sleeps (s) or condvar waits (b) */
  uint64_t consumer_sleeps;
} bench_run;

typedef struct bench_impl {
  const char *name;  /* --impl name, JSON key */
  const char *label; /* table column */
  const char *description;
  bool slow; /* moves --records-slow records */
  bool default_on;
  bool counts_sleeps; /* fills producer_sleeps/consumer_sleeps */
  int (*create)(bench_run *run);
  void (*destroy)(bench_run *run);
  void (*produce)(bench_run *run);
  void (*consume)(bench_run *run);
  void (*dump_state)(bench_run *run); /* on a hang; may be NULL */
} bench_impl;

static _Noreturn void fail(const char *what) { bench_fail("ring_bench", what); }

static inline void write_record(void *slot, uint64_t key) {
  bench_record record = {key, key * VALUE_MULTIPLIER};
  memcpy(slot, &record, sizeof record);
}

/* The consumer's running check (method 2); lives in registers. */
typedef struct verifier {
  uint64_t next_key;
  uint64_t checksum;
  uint64_t mismatches;
} verifier;

static inline void verify_record(verifier *v, const void *slot) {
  bench_record record;
  memcpy(&record, slot, sizeof record);
  v->mismatches += record.key != v->next_key;
  v->next_key++;
  v->checksum += record.value;
}

static void finish_consumer(bench_run *run, const verifier *v) {
  run->end_ns = bench_now_ns();
  run->records_seen = v->next_key;
  run->checksum = v->checksum;
  run->key_mismatches = v->mismatches;
}

/* Sum of i * M for i in [0, n), modulo 2^64. */
static uint64_t expected_checksum(uint64_t n) {
  uint64_t a = n, b = n - 1;
  if (n == 0)
    return 0;
  if (a % 2 == 0)
    a /= 2;
  else
    b /= 2;
  return a * b * VALUE_MULTIPLIER;
}

static inline uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* Spin, then yield: the waiting of every queue without a parker. */
static inline void spin_or_yield(uint64_t *spins, uint64_t spin_limit) {
  if (*spins < spin_limit) {
    (*spins)++;
    sl_cpu_relax();
  } else {
    sched_yield();
  }
}

static void *aligned_zalloc(size_t bytes) {
  size_t rounded = (bytes + BENCH_LINE - 1) / BENCH_LINE * BENCH_LINE;
  void *p = aligned_alloc(BENCH_LINE, rounded);
  if (p)
    memset(p, 0, rounded);
  return p;
}

/* ================================================== (s) sluice's ring */

typedef struct sluice_queue {
  sl_ring ring;
  /* Each parker on its own line: a waker reads it on every publish. */
  alignas(BENCH_LINE) sl_parker consumer_parker;
  alignas(BENCH_LINE) sl_parker producer_parker;
  bool parkers; /* false: (s0), NULL parkers, waits yield */
} sluice_queue;

static int sluice_create_common(bench_run *run, bool parkers) {
  sluice_queue *q = aligned_zalloc(sizeof *q);
  if (!q)
    return ENOMEM;
  sl_parker_init(&q->consumer_parker);
  sl_parker_init(&q->producer_parker);
  q->parkers = parkers;
  /* batch_records = batch bounds an entry to one producer batch, as the
   * runtime's output batch does; the producer also publishes explicitly
   * after each batch, so the ring's own publish-when-full never fires. */
  int rc = sl_ring_init(&q->ring, run->capacity_bytes,
                        parkers ? &q->consumer_parker : NULL,
                        parkers ? &q->producer_parker : NULL,
                        (uint32_t)run->batch);
  if (rc != 0) {
    free(q);
    return rc;
  }
  assert(q->ring.capacity_bytes == run->capacity_bytes);
  run->queue = q;
  return 0;
}

static int sluice_create(bench_run *run) {
  return sluice_create_common(run, true);
}
static int sluice_noparker_create(bench_run *run) {
  return sluice_create_common(run, false);
}

static void sluice_destroy(bench_run *run) {
  sluice_queue *q = run->queue;
  assert(sl_ring_check(&q->ring));
  run->producer_sleeps = q->producer_parker.sleeps;
  run->consumer_sleeps = q->consumer_parker.sleeps;
  sl_ring_destroy(&q->ring);
  free(q);
}

/* The ring is full: publish what we have with force (we are about to wait,
 * ring.h note 8), then retry the append — the append is the re-check —
 * spinning, then parking until the consumer's release wakes us. */
static uint8_t *sluice_append_waiting(sluice_queue *q, uint64_t spin_limit) {
  sl_ring_publish_producer(&q->ring, true);
  for (uint64_t spins = 0;;) {
    uint8_t *slot =
        sl_ring_append_record_producer(&q->ring, sizeof(bench_record), 0);
    if (slot)
      return slot;
    if (spins < spin_limit || !q->parkers) {
      spin_or_yield(&spins, spin_limit);
      continue;
    }
    sl_parker_prepare(&q->producer_parker);
    slot = sl_ring_append_record_producer(&q->ring, sizeof(bench_record), 0);
    if (slot) {
      sl_parker_cancel(&q->producer_parker);
      return slot;
    }
    sl_parker_sleep(&q->producer_parker);
  }
}

static void sluice_produce(bench_run *run) {
  sluice_queue *q = run->queue;
  const uint64_t records = run->records;
  run->start_ns = bench_now_ns();
  for (uint64_t key = 0; key < records;) {
    uint64_t batch_end = min_u64(key + run->batch, records);
    while (key < batch_end) {
      /* Batch enqueue: reserve as many consecutive slots of the open entry
       * as the batch still needs, then fill them. */
      uint32_t got = 1;
      uint8_t *slot = sl_ring_append_records_producer(
          &q->ring, sizeof(bench_record), 0, (uint32_t)(batch_end - key), &got);
      if (!slot)
        slot = sluice_append_waiting(q, run->spin_limit);
      for (uint32_t i = 0; i < got; i++, key++, slot += sizeof(bench_record))
        write_record(slot, key);
    }
    /* Force after the last record: nothing follows to cross the quarter
     * threshold, so a parked consumer must be woken now (note 8). */
    sl_ring_publish_producer(&q->ring, key == records);
  }
}

/* Wait until something is readable: spin, then park (or yield). */
static void sluice_wait_readable(sluice_queue *q, uint64_t spin_limit) {
  for (uint64_t spins = 0; sl_ring_readable_consumer(&q->ring) == 0;) {
    if (spins < spin_limit || !q->parkers) {
      spin_or_yield(&spins, spin_limit);
      continue;
    }
    sl_parker_prepare(&q->consumer_parker);
    if (sl_ring_readable_consumer(&q->ring) != 0) {
      sl_parker_cancel(&q->consumer_parker);
      return;
    }
    sl_parker_sleep(&q->consumer_parker);
  }
}

static void sluice_consume(bench_run *run) {
  sluice_queue *q = run->queue;
  sl_ring *ring = &q->ring;
  const uint64_t burst_cap_bytes = ring->capacity_bytes / 4;
  const bool per_batch = run->release_per_batch;
  verifier v = {0, 0, 0};
  while (v.next_key < run->records) {
    if (sl_ring_readable_consumer(ring) == 0)
      sluice_wait_readable(q, run->spin_limit);
    uint64_t burst_bytes = 0;
    do {
      const sl_entry *e = sl_ring_peek_consumer(ring);
      if (e->kind != SL_ENTRY_RECORDS || e->flags != 0 || e->count == 0 ||
          e->record_bytes != sizeof(bench_record))
        fail("sluice: unexpected entry in the ring");
      const uint8_t *record = (const uint8_t *)e + sizeof(sl_entry);
      const uint32_t stride = sl_record_stride(e->record_bytes, e->flags);
      for (uint32_t i = 0; i < e->count; i++, record += stride)
        verify_record(&v, record);
      uint64_t bytes = sl_entry_bytes(e);
      sl_ring_advance_consumer(ring, bytes);
      burst_bytes += bytes;
      if (per_batch) /* one entry = one producer batch (publish closes it) */
        sl_ring_release_consumer(ring, false);
    } while (burst_bytes < burst_cap_bytes &&
             sl_ring_readable_consumer(ring) != 0);
    sl_ring_release_consumer(ring, false);
  }
  finish_consumer(run, &v);
}

static void sluice_dump_state(bench_run *run) {
  sluice_queue *q = run->queue;
  fprintf(stderr,
          "  sluice: head %" PRIu64 " tail %" PRIu64
          " producer_position %" PRIu64 " consumer_position %" PRIu64
          " consumer parker %u producer parker %u\n",
          atomic_load(&q->ring.head), atomic_load(&q->ring.tail),
          q->ring.producer_position, q->ring.consumer_position,
          atomic_load(&q->consumer_parker.state),
          atomic_load(&q->producer_parker.state));
}

/* ============================================ (a) minimal SPSC reference */

/* The textbook bounded SPSC queue: free-running indices with a
 * power-of-two mask, each index on its own line, each side caching the
 * other's index, acquire/release only, one release store per batch. */
typedef struct spsc_queue {
  /* Written by the consumer: records consumed. */
  alignas(BENCH_LINE) _Atomic uint64_t head;
  /* Written by the producer: records published. */
  alignas(BENCH_LINE) _Atomic uint64_t tail;
  alignas(BENCH_LINE) bench_record *slots;
  uint64_t capacity; /* records, power of two */
  uint64_t mask;
} spsc_queue;

/* The record slots of a reference queue: run->capacity_bytes, page
 * aligned, zeroed; *capacity and *mask in records.  NULL if out of memory. */
static bench_record *slots_alloc(const bench_run *run, uint64_t *capacity,
                                 uint64_t *mask) {
  *capacity = run->capacity_bytes / sizeof(bench_record);
  *mask = *capacity - 1;
  bench_record *slots = aligned_alloc(4096, run->capacity_bytes);
  if (slots)
    memset(slots, 0, run->capacity_bytes);
  return slots;
}

static int spsc_create(bench_run *run) {
  spsc_queue *q = aligned_zalloc(sizeof *q);
  if (!q)
    return ENOMEM;
  q->slots = slots_alloc(run, &q->capacity, &q->mask);
  if (!q->slots) {
    free(q);
    return ENOMEM;
  }
  atomic_init(&q->head, 0);
  atomic_init(&q->tail, 0);
  run->queue = q;
  return 0;
}

static void spsc_destroy(bench_run *run) {
  spsc_queue *q = run->queue;
  free(q->slots);
  free(q);
}

static void spsc_produce(bench_run *run) {
  spsc_queue *q = run->queue;
  bench_record *const slots = q->slots;
  const uint64_t capacity = q->capacity, mask = q->mask;
  const uint64_t records = run->records;
  uint64_t tail = 0, head_cache = 0; /* producer-private, in registers */
  run->start_ns = bench_now_ns();
  while (tail < records) {
    uint64_t batch_end = min_u64(tail + run->batch, records);
    while (tail < batch_end) {
      if (tail - head_cache == capacity) {
        /* Acquire: the consumer's reads of these slots happen before we
         * overwrite them. */
        head_cache = atomic_load_explicit(&q->head, memory_order_acquire);
        if (tail - head_cache == capacity) {
          /* Full: publish the partial batch, then wait for room. */
          atomic_store_explicit(&q->tail, tail, memory_order_release);
          for (uint64_t spins = 0; tail - head_cache == capacity;) {
            spin_or_yield(&spins, run->spin_limit);
            head_cache = atomic_load_explicit(&q->head, memory_order_acquire);
          }
        }
      }
      write_record(&slots[tail & mask], tail);
      tail++;
    }
    /* Release: the records are written before the consumer sees them. */
    atomic_store_explicit(&q->tail, tail, memory_order_release);
  }
}

static void spsc_consume(bench_run *run) {
  spsc_queue *q = run->queue;
  const bench_record *const slots = q->slots;
  const uint64_t mask = q->mask;
  const uint64_t burst_cap = q->capacity / 4;
  const uint64_t release_every = run->release_per_batch ? run->batch : UINT64_MAX;
  verifier v = {0, 0, 0};
  uint64_t head = 0;
  while (head < run->records) {
    /* Acquire: pairs with the producer's release of tail. */
    uint64_t tail = atomic_load_explicit(&q->tail, memory_order_acquire);
    for (uint64_t spins = 0; tail == head;) {
      spin_or_yield(&spins, run->spin_limit);
      tail = atomic_load_explicit(&q->tail, memory_order_acquire);
    }
    uint64_t burst_end = min_u64(tail, head + burst_cap);
    while (head < burst_end) {
      uint64_t chunk_end = min_u64(burst_end, head + min_u64(release_every, burst_cap));
      for (; head < chunk_end; head++)
        verify_record(&v, &slots[head & mask]);
      /* Release: our reads complete before the producer reuses slots. */
      atomic_store_explicit(&q->head, head, memory_order_release);
    }
  }
  finish_consumer(run, &v);
}

/* ======================================= (b) mutex + condition variables */

typedef struct mutex_queue {
  pthread_mutex_t lock;
  pthread_cond_t not_empty;
  pthread_cond_t not_full;
  /* Protected by lock. */
  uint64_t head, tail;
  bool consumer_waiting, producer_waiting;
  /* Constant. */
  bench_record *slots;
  uint64_t capacity, mask;
} mutex_queue;

static int mutex_create(bench_run *run) {
  mutex_queue *q = aligned_zalloc(sizeof *q);
  if (!q)
    return ENOMEM;
  q->slots = slots_alloc(run, &q->capacity, &q->mask);
  if (!q->slots) {
    free(q);
    return ENOMEM;
  }
  pthread_mutex_init(&q->lock, NULL);
  pthread_cond_init(&q->not_empty, NULL);
  pthread_cond_init(&q->not_full, NULL);
  run->queue = q;
  return 0;
}

static void mutex_destroy(bench_run *run) {
  mutex_queue *q = run->queue;
  pthread_cond_destroy(&q->not_full);
  pthread_cond_destroy(&q->not_empty);
  pthread_mutex_destroy(&q->lock);
  free(q->slots);
  free(q);
}

/* Copy count records between the ring array at index `at` and a flat
 * array, in at most two pieces (the array wraps). */
static void mutex_copy(mutex_queue *q, uint64_t at, bench_record *flat,
                       uint64_t count, bool into_queue) {
  uint64_t first = min_u64(count, q->capacity - (at & q->mask));
  bench_record *slot = &q->slots[at & q->mask];
  if (into_queue) {
    memcpy(slot, flat, first * sizeof *flat);
    memcpy(q->slots, flat + first, (count - first) * sizeof *flat);
  } else {
    memcpy(flat, slot, first * sizeof *flat);
    memcpy(flat + first, q->slots, (count - first) * sizeof *flat);
  }
}

static void mutex_produce(bench_run *run) {
  mutex_queue *q = run->queue;
  bench_record staged[MAX_BATCH_RECORDS];
  assert(run->batch <= MAX_BATCH_RECORDS);
  run->start_ns = bench_now_ns();
  for (uint64_t key = 0; key < run->records;) {
    uint64_t count = min_u64(run->batch, run->records - key);
    for (uint64_t i = 0; i < count; i++)
      write_record(&staged[i], key + i);
    for (uint64_t moved = 0; moved < count;) {
      pthread_mutex_lock(&q->lock);
      while (q->tail - q->head == q->capacity) {
        q->producer_waiting = true;
        run->producer_sleeps++;
        pthread_cond_wait(&q->not_full, &q->lock);
      }
      q->producer_waiting = false;
      uint64_t now = min_u64(count - moved, q->capacity - (q->tail - q->head));
      mutex_copy(q, q->tail, staged + moved, now, true);
      q->tail += now;
      bool wake = q->consumer_waiting;
      pthread_mutex_unlock(&q->lock);
      /* Signal after unlocking: the consumer re-checks under the lock. */
      if (wake)
        pthread_cond_signal(&q->not_empty);
      moved += now;
    }
    key += count;
  }
}

static void mutex_consume(bench_run *run) {
  mutex_queue *q = run->queue;
  const uint64_t take_cap =
      run->release_per_batch ? run->batch : q->capacity / 4;
  bench_record *taken = malloc(take_cap * sizeof *taken);
  if (!taken)
    fail("mutex: out of memory");
  verifier v = {0, 0, 0};
  while (v.next_key < run->records) {
    pthread_mutex_lock(&q->lock);
    while (q->tail == q->head) {
      q->consumer_waiting = true;
      run->consumer_sleeps++;
      pthread_cond_wait(&q->not_empty, &q->lock);
    }
    q->consumer_waiting = false;
    uint64_t count = min_u64(q->tail - q->head, take_cap);
    mutex_copy(q, q->head, taken, count, false);
    q->head += count;
    bool wake = q->producer_waiting;
    pthread_mutex_unlock(&q->lock);
    if (wake)
      pthread_cond_signal(&q->not_full);
    for (uint64_t i = 0; i < count; i++)
      verify_record(&v, &taken[i]);
  }
  finish_consumer(run, &v);
  free(taken);
}

/* ============================================ (c) liburcu wfcqueue */

typedef struct wfcq_item {
  struct cds_wfcq_node node;
  bench_record record;
} wfcq_item;

typedef struct wfcq_queue {
  /* Dequeue side (the consumer splices from here). */
  alignas(BENCH_LINE) struct __cds_wfcq_head head;
  /* Enqueue side: the producer exchanges this pointer per enqueue/splice. */
  alignas(BENCH_LINE) struct cds_wfcq_tail tail;
  /* Credits (method 7): records the consumer has finished with. */
  alignas(BENCH_LINE) _Atomic uint64_t finished;
  alignas(BENCH_LINE) wfcq_item *pool;
  uint64_t capacity, mask;
} wfcq_queue;

static int wfcq_create(bench_run *run) {
  wfcq_queue *q = aligned_zalloc(sizeof *q);
  if (!q)
    return ENOMEM;
  q->capacity = run->capacity_bytes / sizeof(bench_record);
  q->mask = q->capacity - 1;
  q->pool = aligned_zalloc(q->capacity * sizeof *q->pool);
  if (!q->pool) {
    free(q);
    return ENOMEM;
  }
  __cds_wfcq_init(&q->head, &q->tail);
  atomic_init(&q->finished, 0);
  run->queue = q;
  return 0;
}

static void wfcq_destroy(bench_run *run) {
  wfcq_queue *q = run->queue;
  free(q->pool);
  free(q);
}

static void wfcq_produce(bench_run *run) {
  wfcq_queue *q = run->queue;
  /* Batch > 1: enqueue privately, then one splice publishes the batch. */
  struct __cds_wfcq_head staged_head;
  struct cds_wfcq_tail staged_tail;
  __cds_wfcq_init(&staged_head, &staged_tail);
  uint64_t finished_cache = 0;
  run->start_ns = bench_now_ns();
  for (uint64_t key = 0; key < run->records;) {
    uint64_t batch_end = min_u64(key + run->batch, run->records);
    for (; key < batch_end; key++) {
      if (key - finished_cache >= q->capacity) {
        /* Acquire: the consumer is done reading node key mod capacity. */
        finished_cache = atomic_load_explicit(&q->finished, memory_order_acquire);
        if (key - finished_cache >= q->capacity)
          __cds_wfcq_splice_blocking(&q->head, &q->tail, &staged_head,
                                     &staged_tail); /* no-op if empty */
        for (uint64_t spins = 0; key - finished_cache >= q->capacity;) {
          spin_or_yield(&spins, run->spin_limit);
          finished_cache =
              atomic_load_explicit(&q->finished, memory_order_acquire);
        }
      }
      wfcq_item *item = &q->pool[key & q->mask];
      cds_wfcq_node_init(&item->node);
      write_record(&item->record, key);
      if (run->batch == 1)
        cds_wfcq_enqueue(&q->head, &q->tail, &item->node);
      else
        cds_wfcq_enqueue(&staged_head, &staged_tail, &item->node);
    }
    if (run->batch > 1)
      __cds_wfcq_splice_blocking(&q->head, &q->tail, &staged_head,
                                 &staged_tail);
  }
}

/* Next node of the consumer's private list (first if node is NULL),
 * spinning while the producer is between its tail exchange and its link. */
static struct cds_wfcq_node *wfcq_next(struct __cds_wfcq_head *head,
                                       struct cds_wfcq_tail *tail,
                                       struct cds_wfcq_node *node) {
  for (;;) {
    struct cds_wfcq_node *next =
        node ? __cds_wfcq_next_nonblocking(head, tail, node)
             : __cds_wfcq_first_nonblocking(head, tail);
    if (next != CDS_WFCQ_WOULDBLOCK)
      return next;
    sl_cpu_relax();
  }
}

static void wfcq_consume(bench_run *run) {
  wfcq_queue *q = run->queue;
  const uint64_t release_every = run->release_per_batch ? run->batch : UINT64_MAX;
  struct __cds_wfcq_head burst_head;
  struct cds_wfcq_tail burst_tail;
  verifier v = {0, 0, 0};
  while (v.next_key < run->records) {
    /* Re-init each time: the old tail points at a node the producer may
     * be reusing, and a splice would link onto it. */
    __cds_wfcq_init(&burst_head, &burst_tail);
    enum cds_wfcq_ret rc;
    uint64_t spins = 0;
    while ((rc = __cds_wfcq_splice_nonblocking(&burst_head, &burst_tail,
                                               &q->head, &q->tail)) ==
               CDS_WFCQ_RET_SRC_EMPTY ||
           rc == CDS_WFCQ_RET_WOULDBLOCK)
      spin_or_yield(&spins, run->spin_limit);
    uint64_t since_release = 0;
    for (struct cds_wfcq_node *node = wfcq_next(&burst_head, &burst_tail, 0);
         node; node = wfcq_next(&burst_head, &burst_tail, node)) {
      const wfcq_item *item = caa_container_of(node, wfcq_item, node);
      verify_record(&v, &item->record);
      if (++since_release == release_every) {
        /* Not this node: wfcq_next still reads its next pointer. */
        atomic_store_explicit(&q->finished, v.next_key - 1,
                              memory_order_release);
        since_release = 0;
      }
    }
    /* Release: our reads of the nodes complete before their reuse. */
    atomic_store_explicit(&q->finished, v.next_key, memory_order_release);
  }
  finish_consumer(run, &v);
}

/* ======================================================== the harness */

static const bench_impl impls[] = {
    {.name = "sluice", .label = "(s) sluice",
     .description = "sluice sl_ring (engine/ring.h) with parkers",
     .default_on = true, .counts_sleeps = true, .create = sluice_create,
     .destroy = sluice_destroy, .produce = sluice_produce,
     .consume = sluice_consume, .dump_state = sluice_dump_state},
    {.name = "spsc", .label = "(a) spsc-ref",
     .description = "minimal SPSC array loop: cached indices, "
                    "acquire/release, batch publish",
     .default_on = true, .create = spsc_create, .destroy = spsc_destroy,
     .produce = spsc_produce, .consume = spsc_consume},
    {.name = "mutex", .label = "(b) mutex+cond",
     .description = "bounded array under a pthread mutex + 2 condvars",
     .slow = true, .default_on = true, .counts_sleeps = true,
     .create = mutex_create, .destroy = mutex_destroy,
     .produce = mutex_produce, .consume = mutex_consume},
    {.name = "wfcq", .label = "(c) wfcqueue",
     .description = "liburcu wfcqueue, pooled nodes, bounded by a credit "
                    "counter",
     .slow = true, .default_on = true, .create = wfcq_create,
     .destroy = wfcq_destroy, .produce = wfcq_produce,
     .consume = wfcq_consume},
    {.name = "sluice-noparker", .label = "(s0) no-parker",
     .description = "diagnostic: sl_ring with NULL parkers (no wake "
                    "checks), waits spin then yield",
     .create = sluice_noparker_create, .destroy = sluice_destroy,
     .produce = sluice_produce, .consume = sluice_consume,
     .dump_state = sluice_dump_state},
};
#define IMPL_COUNT (sizeof impls / sizeof impls[0])

typedef struct options {
  uint64_t records;
  uint64_t records_slow;
  uint64_t repeat;
  uint64_t ring_bytes;
  uint64_t spin_limit;
  uint64_t timeout_s;
  uint64_t batches[MAX_BATCHES];
  unsigned batch_count;
  bool selected[IMPL_COUNT];
  bool release_per_batch;
  int producer_cpu, consumer_cpu;
  const char *json_path;
} options;

typedef struct side {
  bench_run *run;
  void (*body)(bench_run *run);
  int cpu;
} side;

static void *side_main(void *arg) {
  side *s = arg;
  int rc = bench_pin_to_cpu(s->cpu);
  if (rc != 0) {
    fprintf(stderr, "ring_bench: cannot pin to CPU %d: %s\n", s->cpu,
            strerror(rc));
    exit(2);
  }
  pthread_barrier_wait(&s->run->start);
  s->body(s->run);
  return NULL;
}

/* Join t, giving up after deadline (a lost wake-up shows as a hang). */
static void join_or_die(pthread_t thread, const struct timespec *deadline,
                        const bench_impl *impl, bench_run *run) {
  int rc = pthread_timedjoin_np(thread, NULL, deadline);
  if (rc == 0)
    return;
  fprintf(stderr, "ring_bench: %s batch %" PRIu64 " did not finish (%s)\n",
          impl->name, run->batch, strerror(rc));
  if (impl->dump_state)
    impl->dump_state(run);
  exit(3);
}

/* One measurement.  Returns M records/s; stops the program if the run
 * fails its checks. */
static double run_once(const bench_impl *impl, const options *opt,
                       uint64_t batch, bench_run *run) {
  memset(run, 0, sizeof *run);
  run->records = impl->slow ? opt->records_slow : opt->records;
  run->batch = batch;
  run->capacity_bytes = opt->ring_bytes;
  run->spin_limit = opt->spin_limit;
  run->release_per_batch = opt->release_per_batch;
  if (impl->create(run) != 0)
    fail("cannot create the queue (out of memory?)");
  pthread_barrier_init(&run->start, NULL, 2);
  side producer = {run, impl->produce, opt->producer_cpu};
  side consumer = {run, impl->consume, opt->consumer_cpu};
  pthread_t threads[2];
  if (pthread_create(&threads[0], NULL, side_main, &consumer) != 0 ||
      pthread_create(&threads[1], NULL, side_main, &producer) != 0)
    fail("cannot create threads");
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += (time_t)opt->timeout_s;
  join_or_die(threads[1], &deadline, impl, run);
  join_or_die(threads[0], &deadline, impl, run);
  pthread_barrier_destroy(&run->start);
  impl->destroy(run);

  if (run->records_seen != run->records || run->key_mismatches != 0 ||
      run->checksum != expected_checksum(run->records)) {
    fprintf(stderr,
            "ring_bench: %s batch %" PRIu64 ": %" PRIu64 " of %" PRIu64
            " records, %" PRIu64 " out of order, checksum %s\n",
            impl->name, batch, run->records_seen, run->records,
            run->key_mismatches,
            run->checksum == expected_checksum(run->records) ? "ok" : "BAD");
    exit(4);
  }
  assert(run->end_ns > run->start_ns);
  return (double)run->records * 1e3 / (double)(run->end_ns - run->start_ns);
}

/* ------------------------------------------------------------- results */

typedef struct cell {
  double mrps[BENCH_MAX_REPEAT];
  uint64_t producer_sleeps[BENCH_MAX_REPEAT];
  uint64_t consumer_sleeps[BENCH_MAX_REPEAT];
  bench_stats stats;
} cell;

static cell *cell_at(cell *cells, size_t impl, size_t batch) {
  return &cells[impl * MAX_BATCHES + batch];
}

/* median over repeats of s_i / a_i (runs i of s and a ran back to back). */
static double paired_ratio(const cell *s, const cell *a, uint64_t repeat) {
  double ratios[BENCH_MAX_REPEAT];
  for (uint64_t i = 0; i < repeat; i++)
    ratios[i] = s->mrps[i] / a->mrps[i];
  return bench_stats_of(ratios, repeat).median;
}

static uint64_t sum_u64(const uint64_t *values, uint64_t count) {
  uint64_t sum = 0;
  for (uint64_t i = 0; i < count; i++)
    sum += values[i];
  return sum;
}

static void print_header(const options *opt) {
  printf("ring_bench: 16-byte records, %" PRIu64 " KiB per queue, producer "
         "CPU %d -> consumer CPU %d, consumer releases once per %s\n",
         opt->ring_bytes >> 10, opt->producer_cpu, opt->consumer_cpu,
         opt->release_per_batch ? "batch" : "burst (all visible, <= 1/4 ring)");
  printf("M records/s: median [min - max] of %" PRIu64 " runs; %" PRIu64
         " records/run for s, a, s0; %" PRIu64 " for b, c; spin limit %" PRIu64
         "\n",
         opt->repeat, opt->records, opt->records_slow, opt->spin_limit);
  printf("(c) wfcqueue is bounded by a credit counter (pool of %" PRIu64
         " nodes)\n\n",
         opt->ring_bytes / sizeof(bench_record));
  printf("batch");
  for (size_t i = 0; i < IMPL_COUNT; i++)
    if (opt->selected[i])
      printf(" | %-22s", impls[i].label);
  if (opt->selected[0] && opt->selected[1])
    printf(" |  s/a  paired");
  printf("\n");
}

static void print_row(const options *opt, cell *cells, unsigned b) {
  printf("%5" PRIu64, opt->batches[b]);
  for (size_t i = 0; i < IMPL_COUNT; i++) {
    if (!opt->selected[i])
      continue;
    bench_stats s = cell_at(cells, i, b)->stats;
    printf(" | %6.1f [%6.1f-%6.1f]", s.median, s.min, s.max);
  }
  if (opt->selected[0] && opt->selected[1]) {
    const cell *s = cell_at(cells, 0, b), *a = cell_at(cells, 1, b);
    printf(" | %5.2f  %5.2f", s->stats.median / a->stats.median,
           paired_ratio(s, a, opt->repeat));
  }
  printf("\n");
  fflush(stdout);
}

static void print_sleeps(const options *opt, cell *cells) {
  printf("\nparker sleeps per run (producer/consumer), averaged over repeats; "
         "(b) counts condvar waits:\n");
  for (size_t i = 0; i < IMPL_COUNT; i++) {
    if (!opt->selected[i] || !impls[i].counts_sleeps)
      continue;
    printf("  %-16s", impls[i].label);
    for (unsigned b = 0; b < opt->batch_count; b++) {
      const cell *c = cell_at(cells, i, b);
      printf("  b%" PRIu64 ": %" PRIu64 "/%" PRIu64, opt->batches[b],
             sum_u64(c->producer_sleeps, opt->repeat) / opt->repeat,
             sum_u64(c->consumer_sleeps, opt->repeat) / opt->repeat);
    }
    printf("\n");
  }
}

static int write_json(const options *opt, cell *cells) {
  bench_json json;
  int rc = bench_json_create(&json, "ring_bench", opt->json_path);
  if (rc != 0)
    return rc;
  bench_json_string(&json, "benchmark", "ring");
  bench_json_machine(&json);
  bench_json_begin_object(&json, "config");
  bench_json_u64(&json, "record_bytes", sizeof(bench_record));
  bench_json_u64(&json, "ring_bytes", opt->ring_bytes);
  bench_json_u64(&json, "records", opt->records);
  bench_json_u64(&json, "records_slow", opt->records_slow);
  bench_json_u64(&json, "repeat", opt->repeat);
  bench_json_u64(&json, "spin_limit", opt->spin_limit);
  bench_json_u64(&json, "producer_cpu", (uint64_t)opt->producer_cpu);
  bench_json_u64(&json, "consumer_cpu", (uint64_t)opt->consumer_cpu);
  bench_json_string(&json, "consumer_release",
                    opt->release_per_batch ? "per batch" : "per burst");
  bench_json_string(&json, "wfcq_bound", "credit counter");
  bench_json_string(&json, "unit", "million records per second");
  bench_json_end_object(&json);
  bench_json_begin_array(&json, "results");
  for (size_t i = 0; i < IMPL_COUNT; i++) {
    if (!opt->selected[i])
      continue;
    for (unsigned b = 0; b < opt->batch_count; b++) {
      const cell *c = cell_at(cells, i, b);
      bench_json_begin_object(&json, NULL);
      bench_json_string(&json, "impl", impls[i].name);
      bench_json_string(&json, "description", impls[i].description);
      bench_json_u64(&json, "batch", opt->batches[b]);
      bench_json_u64(&json, "records",
                     impls[i].slow ? opt->records_slow : opt->records);
      bench_json_stats(&json, "mrecords_per_s", c->stats);
      bench_json_begin_array(&json, "runs_mrecords_per_s");
      for (uint64_t r = 0; r < opt->repeat; r++)
        bench_json_double(&json, NULL, c->mrps[r]);
      bench_json_end_array(&json);
      bench_json_u64(&json, "producer_sleeps_total",
                     sum_u64(c->producer_sleeps, opt->repeat));
      bench_json_u64(&json, "consumer_sleeps_total",
                     sum_u64(c->consumer_sleeps, opt->repeat));
      bench_json_end_object(&json);
    }
  }
  bench_json_end_array(&json);
  if (opt->selected[0] && opt->selected[1]) {
    bench_json_begin_array(&json, "ratio_sluice_over_spsc");
    for (unsigned b = 0; b < opt->batch_count; b++) {
      const cell *s = cell_at(cells, 0, b), *a = cell_at(cells, 1, b);
      bench_json_begin_object(&json, NULL);
      bench_json_u64(&json, "batch", opt->batches[b]);
      bench_json_double(&json, "ratio_of_medians",
                        s->stats.median / a->stats.median);
      bench_json_double(&json, "median_paired_ratio",
                        paired_ratio(s, a, opt->repeat));
      bench_json_end_object(&json);
    }
    bench_json_end_array(&json);
  }
  return bench_json_finish(&json, "ring_bench", opt->json_path);
}

/* ------------------------------------------------------------- options */

static void usage(FILE *out) {
  fprintf(out,
          "usage: ring_bench [options]\n"
          "  --records N        records per run for s, a, s0 (default 50M)\n"
          "  --records-slow N   records per run for b, c (default 5M)\n"
          "  --repeat R         runs per configuration (default 5)\n"
          "  --ring-bytes B     capacity per queue (default 256KiB)\n"
          "  --batches LIST     e.g. 1,4,16,64,128,256 (the default; max 256)\n"
          "  --impl LIST        of sluice,spsc,mutex,wfcq,sluice-noparker\n"
          "                     (or s,a,b,c,s0; default s,a,b,c)\n"
          "  --release MODE     burst (default) or batch\n"
          "  --spin N           pause iterations before parking/yielding "
          "(default 20000)\n"
          "  --producer-cpu C   (default 0)   --consumer-cpu C (default 1)\n"
          "  --timeout-s S      give up on a run after S s (default 300)\n"
          "  --json PATH        (default bench/results/ring.json)\n"
          "  --quick            1M/200k records, 1 repeat: a smoke run\n");
}

static uint64_t parse_or_die(const char *flag, const char *text,
                             uint64_t unit) {
  return bench_parse_or_die("ring_bench", flag, text, unit);
}

static int find_impl(const char *name, size_t length) {
  static const char *const letters[IMPL_COUNT] = {"s", "a", "b", "c", "s0"};
  for (size_t i = 0; i < IMPL_COUNT; i++)
    if ((strlen(impls[i].name) == length &&
         strncmp(impls[i].name, name, length) == 0) ||
        (strlen(letters[i]) == length && strncmp(letters[i], name, length) == 0))
      return (int)i;
  return -1;
}

static void parse_list(const char *flag, const char *text, options *opt,
                       bool is_impl) {
  if (!text)
    parse_or_die(flag, text, 1);
  if (is_impl)
    memset(opt->selected, 0, sizeof opt->selected);
  else
    opt->batch_count = 0;
  for (const char *at = text; *at;) {
    size_t length = strcspn(at, ",");
    char item[64];
    if (length == 0 || length >= sizeof item)
      parse_or_die(flag, text, 1);
    memcpy(item, at, length);
    item[length] = '\0';
    if (is_impl) {
      int i = find_impl(item, length);
      if (i < 0)
        parse_or_die(flag, item, 1);
      opt->selected[i] = true;
    } else {
      uint64_t batch = parse_or_die(flag, item, 1000);
      if (batch < 1 || batch > MAX_BATCH_RECORDS || opt->batch_count == MAX_BATCHES)
        parse_or_die(flag, item, 1);
      opt->batches[opt->batch_count++] = batch;
    }
    at += length;
    if (*at == ',')
      at++;
  }
}

static void parse_options(int argc, char **argv, options *opt) {
  static const uint64_t default_batches[] = {1, 4, 16, 64, 128, 256};
  memset(opt, 0, sizeof *opt);
  opt->records = DEFAULT_RECORDS;
  opt->records_slow = DEFAULT_RECORDS_SLOW;
  opt->repeat = 5;
  opt->ring_bytes = 256u << 10;
  opt->spin_limit = DEFAULT_SPIN_LIMIT;
  opt->timeout_s = 300;
  opt->batch_count = sizeof default_batches / sizeof default_batches[0];
  memcpy(opt->batches, default_batches, sizeof default_batches);
  for (size_t i = 0; i < IMPL_COUNT; i++)
    opt->selected[i] = impls[i].default_on;
  opt->producer_cpu = 0;
  opt->consumer_cpu = 1;
  opt->json_path = "bench/results/ring.json";
  bool quick = false, records_set = false, slow_set = false, repeat_set = false;
  for (int i = 1; i < argc; i++) {
    const char *flag = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
    bool takes_value = true;
    if (strcmp(flag, "--records") == 0) {
      opt->records = parse_or_die(flag, value, 1000);
      records_set = true;
    } else if (strcmp(flag, "--records-slow") == 0) {
      opt->records_slow = parse_or_die(flag, value, 1000);
      slow_set = true;
    } else if (strcmp(flag, "--repeat") == 0) {
      opt->repeat = parse_or_die(flag, value, 1000);
      repeat_set = true;
    } else if (strcmp(flag, "--ring-bytes") == 0) {
      opt->ring_bytes = parse_or_die(flag, value, 1024);
    } else if (strcmp(flag, "--spin") == 0) {
      opt->spin_limit = parse_or_die(flag, value, 1000);
    } else if (strcmp(flag, "--timeout-s") == 0) {
      opt->timeout_s = parse_or_die(flag, value, 1000);
    } else if (strcmp(flag, "--producer-cpu") == 0) {
      opt->producer_cpu = (int)parse_or_die(flag, value, 1000);
    } else if (strcmp(flag, "--consumer-cpu") == 0) {
      opt->consumer_cpu = (int)parse_or_die(flag, value, 1000);
    } else if (strcmp(flag, "--batches") == 0) {
      parse_list(flag, value, opt, false);
    } else if (strcmp(flag, "--impl") == 0) {
      parse_list(flag, value, opt, true);
    } else if (strcmp(flag, "--release") == 0) {
      if (!value || (strcmp(value, "burst") != 0 && strcmp(value, "batch") != 0))
        parse_or_die(flag, value, 1);
      opt->release_per_batch = strcmp(value, "batch") == 0;
    } else {
      int used = bench_common_flag("ring_bench", flag, value, &opt->json_path,
                                   &quick, usage);
      if (used == 0) {
        usage(stderr);
        exit(1);
      }
      takes_value = used == 2;
    }
    if (takes_value)
      i++;
  }
  if (quick) {
    if (!records_set)
      opt->records = QUICK_RECORDS;
    if (!slow_set)
      opt->records_slow = QUICK_RECORDS_SLOW;
    if (!repeat_set)
      opt->repeat = 1;
  }
  /* Round up to a power of two within the ring's limits, as sl_ring_init
   * does, so every queue gets exactly the same capacity. */
  uint64_t capacity = SL_RING_MIN_BYTES;
  while (capacity < opt->ring_bytes && capacity < SL_RING_MAX_BYTES)
    capacity <<= 1;
  opt->ring_bytes = capacity;
  if (opt->repeat < 1 || opt->repeat > BENCH_MAX_REPEAT ||
      opt->records < 1 || opt->records_slow < 1 || opt->timeout_s < 1)
    fail("--repeat must be in [1, 1000]; --records, --timeout-s >= 1");
  if (opt->producer_cpu == opt->consumer_cpu)
    fprintf(stderr, "ring_bench: warning: producer and consumer share CPU "
                    "%d; spinning waits will stall\n",
            opt->producer_cpu);
}

int main(int argc, char **argv) {
  options opt;
  parse_options(argc, argv, &opt);
  if (bench_allowed_cpu_count() < 2)
    fprintf(stderr, "ring_bench: warning: fewer than 2 CPUs allowed\n");
  cell *cells = calloc(IMPL_COUNT * MAX_BATCHES, sizeof *cells);
  if (!cells)
    fail("out of memory");
  print_header(&opt);
  for (unsigned b = 0; b < opt.batch_count; b++) {
    for (uint64_t r = 0; r < opt.repeat; r++) {
      for (size_t i = 0; i < IMPL_COUNT; i++) {
        if (!opt.selected[i])
          continue;
        bench_run run;
        cell *c = cell_at(cells, i, b);
        c->mrps[r] = run_once(&impls[i], &opt, opt.batches[b], &run);
        c->producer_sleeps[r] = run.producer_sleeps;
        c->consumer_sleeps[r] = run.consumer_sleeps;
      }
    }
    for (size_t i = 0; i < IMPL_COUNT; i++)
      if (opt.selected[i])
        cell_at(cells, i, b)->stats =
            bench_stats_of(cell_at(cells, i, b)->mrps, opt.repeat);
    print_row(&opt, cells, b);
  }
  print_sleeps(&opt, cells);
  printf("\n");
  int rc = write_json(&opt, cells);
  free(cells);
  return rc == 0 ? 0 : 1;
}
