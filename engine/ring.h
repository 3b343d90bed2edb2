/* ring.h — the bounded lock-free single-producer/single-consumer byte ring
 * that connects two operator instances (DESIGN.md invariants 1, 2 and 7).
 *
 * NOTES ON THE DESIGN
 *
 * 1. One producer thread and one consumer thread for the ring's whole life.
 *    Every function name says which side may call it (_producer/_consumer).
 * 2. head and tail are free-running 64-bit byte counters; the slot of a
 *    counter is counter & mask (capacity is a power of two).  They never
 *    wrap in practice (2^64 bytes).  0 <= tail - head <= capacity.
 * 3. The shared counters sit on cache lines of their own, and each side keeps
 *    its private position and a cached copy of the other side's counter on a
 *    third and fourth line, so the lines only travel when a side publishes or
 *    refreshes its cache.
 * 4. The buffer holds entries, each 8-byte aligned and contiguous (never
 *    split across the end).  A PAD entry fills the space before the end when
 *    the next entry does not fit; the consumer skips to the start.
 * 5. A RECORDS entry carries `count` records of the same payload size, each
 *    `stride` bytes (an optional 8-byte timestamp, then the payload rounded up
 *    to 8).  While the producer keeps writing records of one size it extends
 *    the open entry, so small fixed-size records cost their payload plus 8/n
 *    bytes of header: the fast path.  Records of other sizes start new
 *    entries; nothing is allocated per record.  An entry holds at most
 *    batch_records records; when an entry closes and the closed, unpublished
 *    entries hold batch_records records or more, they are published without
 *    a forced wake (the output batch), whatever their sizes.
 * 6. Control entries (END, BARRIER, WATERMARK, IDLE) carry one 64-bit value and
 *    are ordered with the records around them (invariant 2).
 * 7. The producer writes entries privately and makes a whole batch visible
 *    with one store-release of tail (sl_ring_publish_producer).  An entry is
 *    never changed once published: publishing closes the open entry.  The
 *    count in the header is written when the entry opens and again at close
 *    only if it grew since: a late store to the header's line, which the
 *    consumer may hold (it ends the previous entry), costs a transfer.  The
 *    consumer likewise reads a burst and returns its space with one
 *    store-release of head (sl_ring_release_consumer).
 * 8. Waking (wait.h): the producer, after publishing, checks whether the
 *    consumer is parked when it was asked to (force: the producer is about
 *    to wait, is flushing dry input, or ends) or when the ring holds at
 *    least a quarter of its capacity.  The consumer, after releasing, checks
 *    the producer when forced or when at least a quarter is free.  A parked
 *    consumer waits for any data; a parked producer waits for room for one
 *    record or one new entry (at most a quarter of the ring,
 *    sl_ring_max_entry) plus, when it must wrap, the padding to the end:
 *    at most half the ring.  So a producer parks only on a ring more than
 *    half full, and a consumer that keeps reading passes wake checks with
 *    a quarter, then more, free before the data runs out; the thresholds
 *    never leave a waiter asleep while its condition holds: whoever could
 *    satisfy it next either crosses the threshold or forces the check
 *    before it waits itself.  Unforced checks are made at most every eighth
 *    of the ring, which only delays them within that argument.  A producer
 *    that stays busy but stops writing to one ring would leave that ring's
 *    parked consumer asleep: the runtime's buffer timeout (1 ms by default)
 *    forces a check on every output.
 *
 * 9. Announcements (unaligned checkpoints, docs/checkpoints.md): each ring
 *    has SL_RING_ANNOUNCE_SLOTS slots {id, pos}, written only by the
 *    producer, read only by the consumer; id n lives in slot n % slots.
 *    The producer announces n right after it published the in-band
 *    BARRIER n, at pos, the position of that entry
 *    (sl_ring_announce_producer): so the consumer, which may be far
 *    behind, learns of n at once and may copy [its position, pos) out of
 *    the ring (everything there is published and not yet released: the
 *    producer cannot overwrite it).  The slot is written like a seqlock
 *    (id 0, pos, then id n with release), so a reader never pairs one
 *    id with another's pos.  A slot is overwritten only by id n + slots,
 *    which the coordinator triggers only once n settled (at most
 *    SL_MAX_CONCURRENT ids are in flight; checkpoint_internal.h asserts
 *    the relation).  Then the producer bumps the consumer instance's
 *    announce_seq and forces a wake check, as a waker of wait.h does.
 *    A ring that is not announced on costs nothing: the consumer looks at
 *    the slots only when announce_seq moved.
 *
 * Which calls may run concurrently (like liburcu's wfcqueue.h table):
 *
 *                       | producer calls | consumer calls | init/destroy
 *   producer calls      | no (1 thread)  | yes            | no
 *   consumer calls      | yes            | no (1 thread)  | no
 */
#ifndef SL_RING_H
#define SL_RING_H

#include <assert.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "wait.h"

#define SL_CACHE_LINE 64

enum sl_entry_kind {
  SL_ENTRY_RECORDS = 1,   /* count records of record_bytes each */
  SL_ENTRY_PAD = 2,       /* skip to the start of the buffer */
  SL_ENTRY_END = 3,       /* end of stream from this producer */
  SL_ENTRY_BARRIER = 4,   /* checkpoint barrier, value = checkpoint id */
  SL_ENTRY_WATERMARK = 5, /* watermark, value = event time */
  SL_ENTRY_IDLE = 6,      /* input status, value 1 = idle, 0 = active */
};

#define SL_ENTRY_HAS_TS 0x01u /* each record starts with an int64 timestamp */

typedef struct sl_entry {
  uint8_t kind;          /* enum sl_entry_kind */
  uint8_t flags;         /* SL_ENTRY_HAS_TS */
  uint16_t count;        /* RECORDS: records in this entry (>= 1) */
  uint32_t record_bytes; /* RECORDS: payload bytes of each record */
} sl_entry;
_Static_assert(sizeof(sl_entry) == 8, "entry header is one 8-byte word");

#define SL_ENTRY_MAX_COUNT UINT16_MAX
#define SL_RING_NO_ENTRY UINT64_MAX
#define SL_RING_MIN_BYTES (4u << 10)
#define SL_RING_MAX_BYTES (1ull << 30)

static inline uint32_t sl_round8(uint32_t n) { return (n + 7u) & ~7u; }

/* Bytes one record occupies inside a RECORDS entry. */
static inline uint32_t sl_record_stride(uint32_t record_bytes, unsigned flags) {
  /* An empty record still takes 8 bytes, so every record advances the
   * write position and the entry limits (count, batch) hold for it too. */
  uint32_t payload = record_bytes ? sl_round8(record_bytes) : 8u;
  return payload + ((flags & SL_ENTRY_HAS_TS) ? 8u : 0u);
}

/* Largest entry a ring of capacity_bytes accepts: a quarter (note 8). */
static inline uint64_t sl_ring_max_entry(uint64_t capacity_bytes) {
  return capacity_bytes / 4;
}

/* Announcement slots of a ring (note 9): SL_MAX_CONCURRENT + 1. */
#define SL_RING_ANNOUNCE_SLOTS 17u

typedef struct sl_ring_announce {
  _Atomic uint64_t id; /* 0: none (checkpoint ids start at 1) */
  _Atomic uint64_t pos;
} sl_ring_announce;

typedef struct sl_ring {
  /* Written by the consumer only: bytes consumed and returned. */
  alignas(SL_CACHE_LINE) _Atomic uint64_t head;
  /* Written by the producer only: bytes published. */
  alignas(SL_CACHE_LINE) _Atomic uint64_t tail;

  /* Consumer-private. */
  alignas(SL_CACHE_LINE) uint64_t consumer_position; /* >= head */
  uint64_t consumer_tail_cache;                      /* <= tail */
  uint64_t consumer_released;      /* == head, without reading its line */
  uint64_t release_check_position; /* where the last unforced check was */

  /* Producer-private.  The open RECORDS entry is described here, not read
   * back from its header, so extending it touches no shared memory; its
   * count is written into the header when it closes (note 7). */
  alignas(SL_CACHE_LINE) uint64_t producer_position; /* >= tail */
  uint64_t producer_head_cache;                      /* <= head */
  uint64_t producer_published;  /* == tail, without reading the shared line */
  uint64_t wake_check_position; /* where the last unforced wake check was */
  uint64_t open_key;   /* flags << 32 | record_bytes; SL_RING_NO_ENTRY */
  uint64_t open_limit; /* the open entry may grow up to this position */
  uint64_t open_static_limit; /* the same, ignoring free space */
  sl_entry *open_entry;
  uint64_t open_first; /* position of the open entry's first record */
  uint32_t open_stride;
  uint32_t batch_records;   /* unpublished records that make a batch */
  uint32_t closed_records;  /* records in closed, unpublished entries */
  uint32_t open_header_count; /* count now stored in the open header */
  uint64_t payload_bytes; /* record payload bytes of the closed entries,
                             ever (metrics: counted per entry, not per
                             record; kept by sl_ring_reset) */
  uint64_t barrier_position; /* of the last BARRIER written (note 9) */

  /* Written by the producer only, read by the consumer (note 9). */
  alignas(SL_CACHE_LINE) sl_ring_announce announce[SL_RING_ANNOUNCE_SLOTS];

  /* Constant after init. */
  alignas(SL_CACHE_LINE) uint8_t *buffer;
  uint64_t capacity_bytes;
  uint64_t mask;
  uint64_t wake_threshold_bytes;
  sl_parker *consumer_parker; /* may be NULL: no one to wake */
  sl_parker *producer_parker;
  /* The consumer instance's announcement counter (note 9), or NULL. */
  _Atomic uint64_t *consumer_announce_seq;
} sl_ring;

/* Initialise r with capacity_bytes rounded up to a power of two within
 * [SL_RING_MIN_BYTES, SL_RING_MAX_BYTES].  The parkers (either may be NULL)
 * belong to the consumer and producer threads.  batch_records (1 ..
 * SL_ENTRY_MAX_COUNT, 0 for the maximum) bounds the records of one entry;
 * when an entry is full the next append publishes it (the output batch).
 * Returns 0, EINVAL or ENOMEM; on error r holds no memory. */
int sl_ring_init(sl_ring *r, uint64_t capacity_bytes, sl_parker *consumer,
                 sl_parker *producer, uint32_t batch_records);
void sl_ring_destroy(sl_ring *r);

/* Empty r as if just initialised, keeping its buffer and parkers: whatever
 * it held is discarded (failover: in-flight records of a failed attempt are
 * replayed from the restored checkpoint).  Neither side may be using it. */
void sl_ring_reset(sl_ring *r);

/* Whole-ring checker for asserts: counters ordered, entries well formed
 * from head to tail.  Call only when neither side runs concurrently (or
 * from the consumer, which walks only published bytes). */
bool sl_ring_check(const sl_ring *r);

/* ---------------------------------------------------------------- producer */

/* Bytes the producer can still write, refreshing its cache of head only when
 * the cached value shows less than `needed`. */
static inline uint64_t sl_ring_free_producer(sl_ring *r, uint64_t needed) {
  uint64_t free_bytes =
      r->capacity_bytes - (r->producer_position - r->producer_head_cache);
  if (free_bytes < needed) {
    /* Acquire: the consumer's reads of the slots it returned happen before
     * we overwrite them. */
    r->producer_head_cache =
        atomic_load_explicit(&r->head, memory_order_acquire);
    free_bytes =
        r->capacity_bytes - (r->producer_position - r->producer_head_cache);
  }
  return free_bytes;
}

/* Reserve `bytes` (a multiple of 8, <= the max entry) contiguous bytes at the
 * write position, padding to the start of the buffer if needed.  Returns the
 * slot, or NULL if the ring is too full (nothing changed then).  Closes the
 * open RECORDS entry when it pads. */
static inline uint8_t *sl_ring_reserve_producer(sl_ring *r, uint32_t bytes) {
  assert(bytes % 8 == 0 && bytes >= 8);
  assert(bytes <= sl_ring_max_entry(r->capacity_bytes));
  uint64_t slot = r->producer_position & r->mask;
  uint64_t to_end = r->capacity_bytes - slot;
  uint64_t needed = to_end >= bytes ? bytes : to_end + bytes;
  if (sl_ring_free_producer(r, needed) < needed)
    return 0;
  if (to_end < bytes) {
    sl_entry *pad = (sl_entry *)(r->buffer + slot);
    pad->kind = SL_ENTRY_PAD;
    pad->flags = 0;
    pad->count = 0;
    pad->record_bytes = (uint32_t)to_end;
    r->producer_position += to_end;
    slot = 0;
  }
  return r->buffer + slot;
}

/* Write the open entry's count into its header and forget it. */
static inline void sl_ring_close_entry_producer(sl_ring *r) {
  if (r->open_entry) {
    /* The count is derived here, once per entry, so the per-record fast
     * path stores nothing but producer_position. */
    uint64_t count = (r->producer_position - r->open_first) / r->open_stride;
    assert(count >= 1 && count <= SL_ENTRY_MAX_COUNT);
    /* Store only if it changed: the header's line may have gone to the
     * consumer since the entry opened (it reads the previous entry's last
     * record there, or prefetches it), and a store would pull it back. */
    if (count != r->open_header_count)
      r->open_entry->count = (uint16_t)count;
    r->closed_records += (uint32_t)count;
    r->payload_bytes += count * (uint32_t)r->open_key; /* record_bytes */
    r->open_entry = 0;
  }
  r->open_key = SL_RING_NO_ENTRY;
  r->open_limit = 0;
}

/* Out of line: start a new entry, publish a full one, or refresh the cached
 * head.  Same contract as sl_ring_append_record_producer. */
uint8_t *sl_ring_append_record_slow(sl_ring *r, uint32_t record_bytes,
                                    unsigned flags);

/* Append one record slot of record_bytes payload (plus a timestamp word if
 * flags has SL_ENTRY_HAS_TS).  Returns a pointer to the record's stride
 * (timestamp first if any) for the caller to fill, or NULL if the ring is
 * full (nothing changed then except that the open entry may be closed).
 * The fast path, a record like the previous one with room left in the open
 * entry, is two compares and two adds (note 5). */
static inline uint8_t *sl_ring_append_record_producer(sl_ring *r,
                                                      uint32_t record_bytes,
                                                      unsigned flags) {
  uint64_t key = (uint64_t)flags << 32 | record_bytes;
  uint64_t next = r->producer_position + r->open_stride;
  if (__builtin_expect(key == r->open_key && next <= r->open_limit, 1)) {
    uint8_t *slot = r->buffer + (r->producer_position & r->mask);
    r->producer_position = next;
    return slot;
  }
  return sl_ring_append_record_slow(r, record_bytes, flags);
}

/* Records in the open entry (0 if none); for tests and assertions. */
static inline uint32_t sl_ring_open_count(const sl_ring *r) {
  if (!r->open_entry)
    return 0;
  return (uint32_t)((r->producer_position - r->open_first) / r->open_stride);
}

/* Append up to `want` (>= 1) records like sl_ring_append_record_producer in
 * one step: returns the first record's slot and sets *got (1 .. want) to
 * the number of consecutive strides from there the caller must fill, or
 * returns NULL if the ring is full (*got untouched).  One update of
 * producer_position per call instead of one per record. */
static inline uint8_t *sl_ring_append_records_producer(sl_ring *r,
                                                       uint32_t record_bytes,
                                                       unsigned flags,
                                                       uint32_t want,
                                                       uint32_t *got) {
  assert(want >= 1);
  uint8_t *first = sl_ring_append_record_producer(r, record_bytes, flags);
  if (!first)
    return 0;
  /* The open entry now holds `first`; extend it within its limit. */
  uint64_t room = (r->open_limit - r->producer_position) / r->open_stride;
  uint64_t more = want - 1 < room ? want - 1 : room;
  r->producer_position += more * r->open_stride;
  if (more && first == (uint8_t *)r->open_entry + sizeof(sl_entry)) {
    /* This call opened the entry: its header's line is still ours, so
     * store the count now, and closing need not touch the line again. */
    r->open_entry->count = (uint16_t)(1 + more);
    r->open_header_count = (uint32_t)(1 + more);
  }
  *got = (uint32_t)(1 + more);
  return first;
}

/* Write a control entry (END, BARRIER, WATERMARK).  Returns false if full. */
static inline bool sl_ring_write_control_producer(sl_ring *r, unsigned kind,
                                                  uint64_t value) {
  assert(kind == SL_ENTRY_END || kind == SL_ENTRY_BARRIER ||
         kind == SL_ENTRY_WATERMARK || kind == SL_ENTRY_IDLE);
  sl_ring_close_entry_producer(r); /* records after it start a new entry */
  uint8_t *p = sl_ring_reserve_producer(r, 16);
  if (!p)
    return false;
  sl_entry *e = (sl_entry *)p;
  e->kind = (uint8_t)kind;
  e->flags = 0;
  e->count = 0;
  e->record_bytes = 8;
  memcpy(p + 8, &value, 8);
  if (kind == SL_ENTRY_BARRIER)
    r->barrier_position = r->producer_position; /* note 9 */
  r->producer_position += 16;
  return true;
}

/* Make everything written so far visible to the consumer, and wake it if it
 * is parked and either force is set or the ring is at least a quarter full
 * (note 8).  Returns true if anything was published. */
static inline bool sl_ring_publish_producer(sl_ring *r, bool force) {
  if (r->producer_published == r->producer_position) {
    if (force && r->consumer_parker)
      sl_parker_wake(r->consumer_parker);
    return false;
  }
  sl_ring_close_entry_producer(r); /* published entries never grow (7) */
  r->closed_records = 0;
  /* Release: the entries' bytes, and the count just written into the open
   * entry's header, are written before the consumer can see the tail that
   * covers them. */
  atomic_store_explicit(&r->tail, r->producer_position, memory_order_release);
  r->producer_published = r->producer_position;
  if (!r->consumer_parker)
    return true;
  if (!force) {
    /* Unforced checks happen at most every eighth of the ring: each costs a
     * read of the consumer's line and a fence.  A parked consumer is still
     * woken within an eighth past the quarter threshold, since the producer
     * keeps producing (it would force the check before it stopped). */
    if (r->producer_position - r->wake_check_position <
        r->wake_threshold_bytes / 2)
      return true;
    r->wake_check_position = r->producer_position;
    if (r->producer_position - r->producer_head_cache < r->wake_threshold_bytes)
      return true;
    /* The cached head may be old; look at the real fill level before we
     * decide, so a parked consumer is woken for a quarter ring, not for
     * every batch. */
    r->producer_head_cache =
        atomic_load_explicit(&r->head, memory_order_acquire);
    if (r->producer_position - r->producer_head_cache < r->wake_threshold_bytes)
      return true;
  }
  sl_parker_wake(r->consumer_parker);
  return true;
}

/* Note 9: announce checkpoint id, whose in-band BARRIER entry is at pos
 * and already published, then tell the consumer (a forced wake check). */
static inline void sl_ring_announce_producer(sl_ring *r, uint64_t id,
                                             uint64_t pos) {
  assert(id != 0);
  assert(pos + 16 <= r->producer_published); /* the barrier is visible */
  sl_ring_announce *slot = &r->announce[id % SL_RING_ANNOUNCE_SLOTS];
  /* A seqlock write: a reader that sees the new id sees the new pos, and
   * one that read the old id and then our pos rereads the id as 0 (the
   * release store of pos orders the id's clearing before it).  No fence:
   * the orders sit on the accesses, which ThreadSanitizer can follow. */
  atomic_store_explicit(&slot->id, 0, memory_order_relaxed);
  atomic_store_explicit(&slot->pos, pos, memory_order_release);
  atomic_store_explicit(&slot->id, id, memory_order_release);
  if (r->consumer_announce_seq)
    atomic_fetch_add_explicit(r->consumer_announce_seq, 1,
                              memory_order_release);
  /* sl_parker_wake's fence orders the bump before its look at the
   * parker: a consumer about to park rechecks announce_seq after its own
   * fence (wait.h), so the news is never slept through. */
  if (r->consumer_parker)
    sl_parker_wake(r->consumer_parker);
}

/* ---------------------------------------------------------------- consumer */

/* Note 9: true, with *pos, if the producer announced id on r (its slot
 * holds id now); false if not, or no longer. */
static inline bool sl_ring_announced_consumer(const sl_ring *r, uint64_t id,
                                              uint64_t *pos) {
  const sl_ring_announce *slot = &r->announce[id % SL_RING_ANNOUNCE_SLOTS];
  /* Acquire: pairs with the producer's release of id, which follows its
   * publication of the barrier (so the bytes below pos are visible). */
  if (atomic_load_explicit(&slot->id, memory_order_acquire) != id)
    return false;
  /* Acquire: the reread below stays after it, and a pos of a newer
   * announcement brings the producer's clearing of id with it. */
  uint64_t p = atomic_load_explicit(&slot->pos, memory_order_acquire);
  if (atomic_load_explicit(&slot->id, memory_order_relaxed) != id)
    return false; /* overwritten meanwhile */
  *pos = p;
  return true;
}

/* Note 9: the newest id announced on r, 0 if none (a scan of the slots;
 * only when the consumer's announce_seq moved). */
static inline uint64_t sl_ring_announced_max_consumer(const sl_ring *r) {
  uint64_t newest = 0;
  for (unsigned k = 0; k < SL_RING_ANNOUNCE_SLOTS; k++) {
    uint64_t id =
        atomic_load_explicit(&r->announce[k].id, memory_order_acquire);
    if (id > newest)
      newest = id;
  }
  return newest;
}

/* Published bytes not yet read, refreshing the cache of tail only when the
 * cached value shows none. */
static inline uint64_t sl_ring_readable_consumer(sl_ring *r) {
  if (r->consumer_position == r->consumer_tail_cache) {
    /* Acquire: pairs with the producer's release of tail, so the entries
     * below the tail we read are fully written. */
    r->consumer_tail_cache =
        atomic_load_explicit(&r->tail, memory_order_acquire);
  }
  return r->consumer_tail_cache - r->consumer_position;
}

/* The entry at the read position, skipping PAD.  Only valid when
 * sl_ring_readable_consumer() returned nonzero. */
static inline const sl_entry *sl_ring_peek_consumer(sl_ring *r) {
  assert(r->consumer_position < r->consumer_tail_cache);
  const sl_entry *e =
      (const sl_entry *)(r->buffer + (r->consumer_position & r->mask));
  if (e->kind == SL_ENTRY_PAD) {
    assert(e->record_bytes ==
           r->capacity_bytes - (r->consumer_position & r->mask));
    r->consumer_position += e->record_bytes;
    /* A PAD is only written right before an entry that follows it, and both
     * are published together, so an entry is always there. */
    assert(r->consumer_position < r->consumer_tail_cache);
    e = (const sl_entry *)r->buffer;
  }
  assert(e->kind >= SL_ENTRY_RECORDS && e->kind <= SL_ENTRY_IDLE);
  return e;
}

/* Total bytes of entry e. */
static inline uint64_t sl_entry_bytes(const sl_entry *e) {
  if (e->kind == SL_ENTRY_RECORDS)
    return 8 + (uint64_t)e->count * sl_record_stride(e->record_bytes, e->flags);
  return 16;
}

static inline uint64_t sl_entry_value(const sl_entry *e) {
  uint64_t v;
  memcpy(&v, (const uint8_t *)e + 8, 8);
  return v;
}

/* Step past the entry just peeked (or part of it: bytes). */
static inline void sl_ring_advance_consumer(sl_ring *r, uint64_t bytes) {
  r->consumer_position += bytes;
  assert(r->consumer_position <= r->consumer_tail_cache);
}

/* Return the space read so far to the producer, and wake it if it is parked
 * and either force is set or at least a quarter of the ring is free. */
static inline void sl_ring_release_consumer(sl_ring *r, bool force) {
  bool moved = r->consumer_released != r->consumer_position;
  if (moved) {
    /* Release: our reads of the slots complete before the producer may
     * overwrite them. */
    atomic_store_explicit(&r->head, r->consumer_position,
                          memory_order_release);
    r->consumer_released = r->consumer_position;
  }
  if (!r->producer_parker)
    return;
  if (!force) {
    /* Unforced checks happen at most every eighth of the ring consumed
     * (each costs a fence).  A producer parks only on a ring more than
     * half full (note 8), so a consumer that keeps reading passes checks
     * with a quarter and more free before the data runs out; one that
     * stops forces the check first. */
    if (!moved || r->consumer_position - r->release_check_position <
                      r->wake_threshold_bytes / 2)
      return;
    r->release_check_position = r->consumer_position;
    /* Our cached tail may be old (estimating too much free space): read the
     * real one before deciding, as the producer does for head. */
    if (r->capacity_bytes - (r->consumer_tail_cache - r->consumer_position) <
        r->wake_threshold_bytes)
      return;
    r->consumer_tail_cache =
        atomic_load_explicit(&r->tail, memory_order_acquire);
    if (r->capacity_bytes - (r->consumer_tail_cache - r->consumer_position) <
        r->wake_threshold_bytes)
      return;
  }
  sl_parker_wake(r->producer_parker);
}

#endif /* SL_RING_H */
