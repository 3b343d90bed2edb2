/* ring.c — allocation and checking of sl_ring (the hot path is in ring.h). */
#include "ring.h"

#include <errno.h>
#include <stdlib.h>

int sl_ring_init(sl_ring *r, uint64_t capacity_bytes, sl_parker *consumer,
                 sl_parker *producer, uint32_t batch_records) {
  memset(r, 0, sizeof *r);
  if (capacity_bytes < SL_RING_MIN_BYTES || capacity_bytes > SL_RING_MAX_BYTES)
    return EINVAL;
  if (batch_records > SL_ENTRY_MAX_COUNT)
    return EINVAL;
  r->batch_records = batch_records ? batch_records : SL_ENTRY_MAX_COUNT;
  r->open_key = SL_RING_NO_ENTRY;
  uint64_t capacity = SL_RING_MIN_BYTES;
  while (capacity < capacity_bytes)
    capacity <<= 1;
  _Static_assert((SL_RING_MIN_BYTES & (SL_RING_MIN_BYTES - 1)) == 0,
                 "ring sizes are powers of two");
  /* Page-aligned so the buffer shares no cache line with anything else. */
  r->buffer = aligned_alloc(4096, capacity);
  if (!r->buffer)
    return ENOMEM;
  r->capacity_bytes = capacity;
  r->mask = capacity - 1;
  r->wake_threshold_bytes = capacity / 4;
  r->consumer_parker = consumer;
  r->producer_parker = producer;
  atomic_init(&r->head, 0);
  atomic_init(&r->tail, 0);
  assert(sl_ring_check(r));
  return 0;
}

void sl_ring_destroy(sl_ring *r) {
  free(r->buffer);
  r->buffer = 0;
}

void sl_ring_reset(sl_ring *r) {
  sl_ring saved = *r; /* only the constant part is kept */
  memset(r, 0, sizeof *r);
  r->batch_records = saved.batch_records;
  r->open_key = SL_RING_NO_ENTRY;
  r->buffer = saved.buffer;
  r->capacity_bytes = saved.capacity_bytes;
  r->mask = saved.mask;
  r->wake_threshold_bytes = saved.wake_threshold_bytes;
  r->consumer_parker = saved.consumer_parker;
  r->producer_parker = saved.producer_parker;
  r->consumer_announce_seq = saved.consumer_announce_seq;
  r->payload_bytes = saved.payload_bytes; /* a count over the ring's life */
  atomic_init(&r->head, 0);
  atomic_init(&r->tail, 0);
  assert(sl_ring_check(r));
}

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

uint8_t *sl_ring_append_record_slow(sl_ring *r, uint32_t record_bytes,
                                    unsigned flags) {
  uint64_t key = (uint64_t)flags << 32 | record_bytes;
  uint32_t stride = sl_record_stride(record_bytes, flags);
  uint64_t next = r->producer_position + stride;
  if (key == r->open_key && next <= r->open_static_limit) {
    /* Only the free space we last saw stopped the fast path: look at the
     * consumer's real head (acquire: its reads of the returned slots are
     * done) and extend the entry if there is room now. */
    r->producer_head_cache = atomic_load_explicit(&r->head, memory_order_acquire);
    r->open_limit =
        min_u64(r->open_static_limit, r->producer_head_cache + r->capacity_bytes);
    if (next > r->open_limit)
      return 0; /* full; the entry stays open for the retry */
    uint8_t *slot = r->buffer + (r->producer_position & r->mask);
    r->producer_position = next;
    return slot;
  }
  sl_ring_close_entry_producer(r);
  if (r->closed_records >= r->batch_records) {
    /* The output batch is complete, whatever sizes its records had: make it
     * visible (note 5). */
    sl_ring_publish_producer(r, false);
  }
  uint8_t *p = sl_ring_reserve_producer(r, 8 + stride);
  if (!p)
    return 0;
  sl_entry *e = (sl_entry *)p;
  e->kind = SL_ENTRY_RECORDS;
  e->flags = (uint8_t)flags;
  e->count = 1; /* rewritten when the entry closes, if it grew */
  r->open_header_count = 1;
  e->record_bytes = record_bytes;
  uint64_t start = r->producer_position;
  uint64_t buffer_end = start - (start & r->mask) + r->capacity_bytes;
  uint32_t max_count =
      r->batch_records < SL_ENTRY_MAX_COUNT ? r->batch_records : SL_ENTRY_MAX_COUNT;
  r->open_entry = e;
  r->open_key = key;
  r->open_stride = stride;
  r->open_first = start + 8;
  r->open_static_limit =
      min_u64(buffer_end, start + 8 + (uint64_t)max_count * stride);
  r->open_limit =
      min_u64(r->open_static_limit, r->producer_head_cache + r->capacity_bytes);
  r->producer_position = start + 8 + stride;
  assert(r->producer_position <= r->open_limit);
  return p + 8;
}

bool sl_ring_check(const sl_ring *r) {
  if (!r->buffer || r->capacity_bytes < SL_RING_MIN_BYTES)
    return false;
  if ((r->capacity_bytes & r->mask) != 0 || r->mask != r->capacity_bytes - 1)
    return false;
  uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
  uint64_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
  if (tail - head > r->capacity_bytes)
    return false;
  if (head % 8 != 0 || tail % 8 != 0)
    return false;
  /* Walk the published entries. */
  for (uint64_t at = head; at < tail;) {
    const sl_entry *e = (const sl_entry *)(r->buffer + (at & r->mask));
    uint64_t size;
    if (e->kind == SL_ENTRY_PAD) {
      size = r->capacity_bytes - (at & r->mask);
      if (e->record_bytes != size)
        return false;
    } else if (e->kind == SL_ENTRY_RECORDS) {
      if (e->count == 0)
        return false;
      size = sl_entry_bytes(e);
      if ((at & r->mask) + size > r->capacity_bytes)
        return false; /* entries never wrap */
    } else if (e->kind >= SL_ENTRY_END && e->kind <= SL_ENTRY_IDLE) {
      size = 16;
    } else {
      return false;
    }
    at += size;
    if (at > tail)
      return false;
  }
  return true;
}
