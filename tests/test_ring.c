/* test_ring.c — Criterion tests of the SPSC byte ring (engine/ring.h) and
 * the futex parker (engine/wait.h).
 *
 * Single-threaded tests (ordering, wrap-around, full/empty, batching, init)
 * check every byte the consumer reads against a stream of planned events
 * that is a pure function of the event's index, so writer and reader never
 * share a queue.  Threaded tests run producer/consumer pairs that wait with
 * the spin-then-park protocol of wait.h and compare running checksums; a
 * watchdog in the test's main thread turns a lost wake-up (a hang) into a
 * failure that names the stuck pair.  Assertions run in the test's main
 * thread only: worker threads record what they saw and the main thread
 * checks it after joining them.
 *
 * SLUICE_TEST_SCALE=n divides the record counts of the threaded tests by n
 * (for sanitizer builds); the default is 1.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ring.h"
#include "wait.h"

/* ------------------------------------------------------------ utilities */

/* SplitMix64 finaliser: a cheap bijective hash, so every index gets its own
 * well-mixed pseudo-random word. */
static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Order-sensitive running checksum (FNV-1a over 64-bit words). */
#define CHECKSUM_SEED 0xcbf29ce484222325ull
static uint64_t checksum_step(uint64_t sum, uint64_t word) {
  return (sum ^ word) * 0x100000001b3ull;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void sleep_ms(unsigned ms) {
  struct timespec t = {.tv_sec = ms / 1000,
                       .tv_nsec = (long)(ms % 1000) * 1000000L};
  while (nanosleep(&t, &t) != 0 && errno == EINTR) {
  }
}

/* SLUICE_TEST_SCALE divisor, at least 1. */
static uint64_t test_scale(void) {
  const char *text = getenv("SLUICE_TEST_SCALE");
  if (!text || !*text)
    return 1;
  unsigned long long scale = strtoull(text, 0, 10);
  return scale >= 1 ? scale : 1;
}

static uint64_t scaled(uint64_t count) {
  uint64_t n = count / test_scale();
  return n > 0 ? n : 1;
}

/* Record payloads: 8-byte words seed + j * step, the last one cut to size,
 * where seed depends on the record's sequence number.  Cheap to write and to
 * check, and different for every record and every word. */
#define PAYLOAD_STEP 0x0101010101010101ull

static void fill_payload(uint8_t *dst, uint32_t bytes, uint64_t seq) {
  uint64_t word = mix64(seq);
  uint32_t at = 0;
  for (; at + 8 <= bytes; at += 8, word += PAYLOAD_STEP)
    memcpy(dst + at, &word, 8);
  if (at < bytes)
    memcpy(dst + at, &word, bytes - at);
}

static bool payload_ok(const uint8_t *src, uint32_t bytes, uint64_t seq) {
  uint64_t word = mix64(seq), seen;
  uint32_t at = 0;
  for (; at + 8 <= bytes; at += 8, word += PAYLOAD_STEP) {
    memcpy(&seen, src + at, 8);
    if (seen != word)
      return false;
  }
  return at == bytes || memcmp(src + at, &word, bytes - at) == 0;
}

/* ------------------------------------------------- planned event stream */

/* One event of a deterministic stream: a record (one record of a RECORDS
 * entry) or a control entry.  event_at(i) depends on i only. */
typedef struct planned_event {
  uint8_t kind;          /* SL_ENTRY_RECORDS or BARRIER/WATERMARK */
  uint8_t flags;         /* records: SL_ENTRY_HAS_TS or 0 */
  uint32_t record_bytes; /* records: 1..200 */
  uint64_t value;        /* control: the value; records: payload seed */
  int64_t timestamp;     /* records with SL_ENTRY_HAS_TS */
} planned_event;

#define PLAN_MAX_RECORD_BYTES 200u

static planned_event event_at(uint64_t index) {
  planned_event ev = {0};
  uint64_t x = mix64(index);
  if (x % 11 == 0) {
    ev.kind = (x >> 8) & 1 ? SL_ENTRY_BARRIER : SL_ENTRY_WATERMARK;
    ev.value = x >> 3;
    return ev;
  }
  /* Records come in groups of 4 of one size and flag setting, so runs of
   * equal records (batched into one entry) alternate with size changes. */
  uint64_t group = mix64((index >> 2) ^ 0x5a5a5a5a5a5a5a5aull);
  ev.kind = SL_ENTRY_RECORDS;
  ev.record_bytes = 1 + (uint32_t)(group % PLAN_MAX_RECORD_BYTES);
  ev.flags = (group >> 40) & 1 ? SL_ENTRY_HAS_TS : 0;
  ev.value = index;
  ev.timestamp = (int64_t)(x ^ (x << 17)); /* negative ones too */
  return ev;
}

/* Write ev; false (and nothing written) if the ring is full. */
static bool write_event(sl_ring *r, const planned_event *ev) {
  if (ev->kind != SL_ENTRY_RECORDS)
    return sl_ring_write_control_producer(r, ev->kind, ev->value);
  uint8_t *slot =
      sl_ring_append_record_producer(r, ev->record_bytes, ev->flags);
  if (!slot)
    return false;
  if (ev->flags & SL_ENTRY_HAS_TS) {
    memcpy(slot, &ev->timestamp, 8);
    slot += 8;
  }
  fill_payload(slot, ev->record_bytes, ev->value);
  return true;
}

/* Check entry e against the planned events from *next_index on, advancing
 * *next_index past the events it covers (count records, or one control). */
static void check_entry(const sl_entry *e, uint64_t *next_index) {
  cr_assert_eq((uintptr_t)e % 8, 0, "entries are 8-byte aligned");
  if (e->kind != SL_ENTRY_RECORDS) {
    planned_event ev = event_at(*next_index);
    cr_assert_eq(e->kind, ev.kind, "event %" PRIu64 ": kind %u, expected %u",
                 *next_index, e->kind, ev.kind);
    cr_assert_eq(sl_entry_value(e), ev.value, "event %" PRIu64 ": value",
                 *next_index);
    cr_assert_eq(sl_entry_bytes(e), 16);
    ++*next_index;
    return;
  }
  cr_assert_geq(e->count, 1, "a RECORDS entry holds at least one record");
  uint32_t stride = sl_record_stride(e->record_bytes, e->flags);
  const uint8_t *record = (const uint8_t *)e + 8;
  for (uint32_t k = 0; k < e->count; k++, record += stride, ++*next_index) {
    planned_event ev = event_at(*next_index);
    cr_assert_eq(ev.kind, SL_ENTRY_RECORDS,
                 "event %" PRIu64 ": a record where a control entry belongs",
                 *next_index);
    cr_assert_eq(e->record_bytes, ev.record_bytes,
                 "event %" PRIu64 ": record size %u, expected %u", *next_index,
                 e->record_bytes, ev.record_bytes);
    cr_assert_eq(e->flags, ev.flags, "event %" PRIu64 ": flags", *next_index);
    const uint8_t *payload = record;
    if (ev.flags & SL_ENTRY_HAS_TS) {
      int64_t timestamp;
      memcpy(&timestamp, record, 8);
      cr_assert_eq(timestamp, ev.timestamp, "event %" PRIu64 ": timestamp",
                   *next_index);
      payload += 8;
    }
    cr_assert(payload_ok(payload, ev.record_bytes, ev.value),
              "event %" PRIu64 ": payload differs", *next_index);
  }
  cr_assert_eq(sl_entry_bytes(e), 8 + (uint64_t)e->count * stride);
}

/* The layout a writer must produce for events [0, n) when it publishes after
 * every event for which publish_after(i) holds, on a ring whose entries hold
 * at most max_count records, assuming nothing pads (the ring is big enough).
 * Mirrors ring.h notes 5-7: equal records extend the open entry; a control
 * entry, a publish or a full entry closes it. */
typedef struct layout {
  uint64_t bytes;
  uint64_t entries;
} layout;

static layout expected_layout(uint64_t n, bool (*publish_after)(uint64_t),
                              uint32_t max_count) {
  layout out = {0, 0};
  bool open = false;
  planned_event open_ev = {0};
  uint32_t open_count = 0;
  for (uint64_t i = 0; i < n; i++) {
    planned_event ev = event_at(i);
    if (ev.kind != SL_ENTRY_RECORDS) {
      out.entries++;
      out.bytes += 16;
      open = false;
    } else {
      uint32_t stride = sl_record_stride(ev.record_bytes, ev.flags);
      if (open && open_ev.record_bytes == ev.record_bytes &&
          open_ev.flags == ev.flags && open_count < max_count) {
        open_count++;
        out.bytes += stride;
      } else {
        out.entries++;
        out.bytes += 8 + stride;
        open = true;
        open_ev = ev;
        open_count = 1;
      }
    }
    if (publish_after && publish_after(i))
      open = false;
  }
  return out;
}

static bool publish_sometimes(uint64_t i) {
  return mix64(i ^ 0x1234567ull) % 5 == 0;
}

/* Read every readable entry, checking each; returns the entries read. */
static uint64_t drain_and_check(sl_ring *r, uint64_t *next_index) {
  uint64_t entries = 0;
  while (sl_ring_readable_consumer(r) > 0) {
    const sl_entry *e = sl_ring_peek_consumer(r);
    check_entry(e, next_index);
    sl_ring_advance_consumer(r, sl_entry_bytes(e));
    entries++;
  }
  return entries;
}

/* ------------------------------------------------ single-thread tests */

/* 1. Records of 1..200 bytes (some with timestamps) and control entries come
 * out exactly as written: content, sizes, timestamps, order, batching.
 * Variants: one publish at the end; publishes at random points; entries of
 * at most 3 records (batch_records), which publish themselves when full. */
Test(ring, ordering, .timeout = 30) {
  enum { EVENTS = 4000 };
  const struct {
    bool (*publish_after)(uint64_t);
    uint32_t batch_records;
  } variants[] = {{0, 0}, {publish_sometimes, 0}, {0, 3}};
  for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
    bool (*publish_after)(uint64_t) = variants[v].publish_after;
    uint32_t batch = variants[v].batch_records;
    sl_ring r;
    cr_assert_eq(sl_ring_init(&r, 1u << 20, 0, 0, batch), 0);
    layout want = expected_layout(EVENTS, publish_after,
                                  batch ? batch : SL_ENTRY_MAX_COUNT);
    cr_assert_lt(want.bytes, r.capacity_bytes,
                 "the plan fits without wrapping");

    uint64_t records = 0, controls = 0;
    for (uint64_t i = 0; i < EVENTS; i++) {
      planned_event ev = event_at(i);
      cr_assert(write_event(&r, &ev), "event %" PRIu64 " fits", i);
      records += ev.kind == SL_ENTRY_RECORDS;
      controls += ev.kind != SL_ENTRY_RECORDS;
      if (publish_after && publish_after(i))
        cr_assert(sl_ring_publish_producer(&r, false));
    }
    if (!publish_after && batch == 0)
      cr_assert_eq(sl_ring_readable_consumer(&r), 0,
                   "nothing is visible before it is published");
    if (batch != 0)
      cr_assert_gt(atomic_load(&r.tail), 0,
                   "full entries published themselves");
    sl_ring_publish_producer(&r, false);
    cr_assert(sl_ring_check(&r));
    cr_assert_eq(sl_ring_readable_consumer(&r), want.bytes,
                 "variant %zu: published bytes: %" PRIu64 ", expected %" PRIu64,
                 v, sl_ring_readable_consumer(&r), want.bytes);

    uint64_t next_index = 0;
    uint64_t entries = drain_and_check(&r, &next_index);
    cr_assert_eq(next_index, EVENTS, "read %" PRIu64 " events of %d",
                 next_index, EVENTS);
    cr_assert_eq(entries, want.entries,
                 "variant %zu: entries: %" PRIu64 ", expected %" PRIu64, v,
                 entries, want.entries);
    cr_assert_gt(records, 2000);
    cr_assert_gt(controls, 100);
    cr_assert_lt(entries, records, "equal records were batched");
    sl_ring_release_consumer(&r, false);
    cr_assert_eq(atomic_load(&r.head), want.bytes);
    cr_assert(sl_ring_check(&r));
    sl_ring_destroy(&r);
  }
}

/* 2. A 4 KiB ring used for many cycles: the counters pass the buffer's end
 * hundreds of times, PAD entries appear, nothing is lost or reordered.  Run
 * with unbounded entries and with entries of at most 5 records. */
static void wrap_around_with(uint32_t batch_records) {
  enum { CYCLES = 40000 };
  sl_ring r;
  cr_assert_eq(sl_ring_init(&r, 4096, 0, 0, batch_records), 0);
  uint64_t write_index = 0, read_index = 0, pads = 0, full = 0;
  for (uint64_t cycle = 0; cycle < CYCLES; cycle++) {
    uint64_t x = mix64(cycle);
    /* Write up to 1..40 events, stopping at the first that does not fit
     * (it is retried next cycle). */
    for (uint64_t n = 1 + x % 40; n > 0; n--) {
      planned_event ev = event_at(write_index);
      if (!write_event(&r, &ev)) {
        full++;
        break;
      }
      write_index++;
    }
    /* Publish three cycles in four, so open entries sometimes stay open
     * across cycles and keep growing. */
    if ((x >> 8) % 4 != 0)
      sl_ring_publish_producer(&r, false);
    cr_assert(sl_ring_check(&r), "cycle %" PRIu64 ": ring_check", cycle);

    /* Read up to 1..30 entries; release two cycles in three. */
    for (uint64_t n = 1 + (x >> 16) % 30;
         n > 0 && sl_ring_readable_consumer(&r) > 0; n--) {
      uint64_t slot = r.consumer_position & r.mask;
      const sl_entry *e = sl_ring_peek_consumer(&r);
      if ((const uint8_t *)e != r.buffer + slot) {
        /* peek skipped a PAD, which always leads to the buffer's start. */
        cr_assert_eq((const uint8_t *)e, r.buffer);
        pads++;
      }
      check_entry(e, &read_index);
      sl_ring_advance_consumer(&r, sl_entry_bytes(e));
    }
    if ((x >> 24) % 3 != 0)
      sl_ring_release_consumer(&r, false);
    cr_assert(sl_ring_check(&r), "cycle %" PRIu64 ": ring_check", cycle);
    cr_assert_leq(read_index, write_index);
  }
  sl_ring_publish_producer(&r, false);
  drain_and_check(&r, &read_index);
  sl_ring_release_consumer(&r, false);
  cr_assert_eq(read_index, write_index, "every written event was read");
  cr_assert_eq(atomic_load(&r.head), atomic_load(&r.tail));
  cr_assert(sl_ring_check(&r));
  uint64_t laps = atomic_load(&r.tail) / r.capacity_bytes;
  cr_log_info("wrap_around(batch %u): %" PRIu64 " events, %" PRIu64
              " laps, %" PRIu64 " pads, %" PRIu64 " full",
              batch_records, write_index, laps, pads, full);
  cr_assert_geq(laps, 1000, "counters passed the end %" PRIu64 " times", laps);
  cr_assert_geq(pads, 100, "PAD entries seen: %" PRIu64, pads);
  cr_assert_gt(full, 0, "the ring ran full sometimes");
  sl_ring_destroy(&r);
}

Test(ring, wrap_around, .timeout = 60) {
  wrap_around_with(0);
  wrap_around_with(5);
}

/* Bytes the next record of `stride` bytes needs at the producer's position
 * when it starts a new entry: header, record, and a PAD when it does not fit
 * before the buffer's end (ring.h note 4). */
static uint64_t new_entry_needs(const sl_ring *r, uint32_t stride) {
  uint64_t to_end = r->capacity_bytes - (r->producer_position & r->mask);
  return to_end >= 8 + stride ? 8 + stride : to_end + 8 + stride;
}

static uint64_t producer_free(const sl_ring *r) {
  return r->capacity_bytes - (r->producer_position - atomic_load(&r->head));
}

/* 3. Filling until append fails: exact capacity, nothing lost, space comes
 * back only after the consumer releases it; empty rings read 0. */
Test(ring, full_empty, .timeout = 30) {
  sl_ring r;
  cr_assert_eq(sl_ring_init(&r, 4096, 0, 0, 0), 0);
  cr_assert_eq(sl_ring_readable_consumer(&r), 0, "a new ring is empty");
  cr_assert_not(sl_ring_publish_producer(&r, false), "nothing to publish");
  sl_ring_release_consumer(&r, false);
  cr_assert_eq(sl_ring_readable_consumer(&r), 0);

  /* 16-byte records: one entry of 8 + 255 * 16 = 4088 bytes; the 8 bytes
   * left before the end hold neither a record nor a control entry. */
  uint64_t seq = 0;
  uint8_t *slot;
  while ((slot = sl_ring_append_record_producer(&r, 16, 0)) != 0) {
    memcpy(slot, &seq, 8);
    memcpy(slot + 8, &seq, 8);
    seq++;
    cr_assert_leq(seq, 4096 / 16, "append never overfills");
  }
  cr_assert_eq(seq, 255, "records that fit: %" PRIu64, seq);
  cr_assert_not(sl_ring_write_control_producer(&r, SL_ENTRY_END, 1));
  cr_assert_eq(sl_ring_readable_consumer(&r), 0, "not yet published");
  cr_assert(sl_ring_publish_producer(&r, false));
  cr_assert_eq(sl_ring_readable_consumer(&r), 4088);
  cr_assert(sl_ring_check(&r));
  cr_assert_null(sl_ring_append_record_producer(&r, 16, 0), "still full");

  const sl_entry *e = sl_ring_peek_consumer(&r);
  cr_assert_eq(e->kind, SL_ENTRY_RECORDS);
  cr_assert_eq(e->count, 255);
  for (uint64_t k = 0; k < 255; k++) {
    uint64_t words[2];
    memcpy(words, (const uint8_t *)e + 8 + 16 * k, 16);
    cr_assert_eq(words[0], k);
    cr_assert_eq(words[1], k);
  }
  sl_ring_advance_consumer(&r, sl_entry_bytes(e));
  cr_assert_eq(sl_ring_readable_consumer(&r), 0);
  cr_assert_null(sl_ring_append_record_producer(&r, 16, 0),
                 "read but unreleased space is not reusable");
  sl_ring_release_consumer(&r, false);
  slot = sl_ring_append_record_producer(&r, 16, 0);
  cr_assert_eq(slot, r.buffer + 8, "PAD at the end, new entry at 0");
  sl_ring_publish_producer(&r, false);
  cr_assert_eq(sl_ring_readable_consumer(&r), 8 + 8 + 16, "PAD and entry");
  e = sl_ring_peek_consumer(&r);
  cr_assert_eq((const uint8_t *)e, r.buffer, "peek skips the PAD");
  sl_ring_advance_consumer(&r, sl_entry_bytes(e));
  sl_ring_release_consumer(&r, false);
  cr_assert_eq(sl_ring_readable_consumer(&r), 0);

  /* Many rounds of fill-until-full with planned events of every size:
   * when an append fails there really is no room, and everything that was
   * accepted comes back. */
  uint64_t write_index = 0, read_index = 0;
  for (int round = 0; round < 2000; round++) {
    for (;;) {
      planned_event ev = event_at(write_index);
      if (write_event(&r, &ev)) {
        write_index++;
        continue;
      }
      uint64_t needs = ev.kind == SL_ENTRY_RECORDS
                           ? sl_record_stride(ev.record_bytes, ev.flags)
                           : 8;
      needs = new_entry_needs(&r, (uint32_t)needs);
      cr_assert_lt(producer_free(&r), needs,
                   "round %d: append failed with %" PRIu64 " free, %" PRIu64
                   " needed",
                   round, producer_free(&r), needs);
      break;
    }
    sl_ring_publish_producer(&r, false);
    cr_assert(sl_ring_check(&r));
    drain_and_check(&r, &read_index);
    cr_assert_eq(read_index, write_index, "round %d: all accepted read", round);
    sl_ring_release_consumer(&r, false);
    cr_assert_eq(producer_free(&r), r.capacity_bytes, "empty again");
  }
  sl_ring_destroy(&r);
}

/* 4. Batching: equal records extend one RECORDS entry until a publish, a
 * size or flag change, a control entry, the buffer's end or the entry's
 * record limit closes it.  The open entry's count lives in the producer's
 * state (sl_ring_open_count(&r)) and is written into the header when it closes. */
Test(ring, batch, .timeout = 30) {
  sl_ring r;
  cr_assert_eq(sl_ring_init(&r, 1u << 20, 0, 0, 0), 0);
  const uint32_t stride24 = sl_record_stride(24, 0);

  uint8_t *first = sl_ring_append_record_producer(&r, 24, 0);
  cr_assert_not_null(first);
  sl_entry *entry = (sl_entry *)(first - 8);
  cr_assert_eq(entry->kind, SL_ENTRY_RECORDS);
  cr_assert_eq(entry->record_bytes, 24);
  uint8_t *previous = first;
  for (uint32_t k = 2; k <= 10; k++) {
    uint8_t *slot = sl_ring_append_record_producer(&r, 24, 0);
    cr_assert_eq(slot, previous + stride24, "record %u is contiguous", k);
    cr_assert_eq(sl_ring_open_count(&r), k, "count grows: %u", sl_ring_open_count(&r));
    previous = slot;
  }
  cr_assert(sl_ring_publish_producer(&r, false));
  cr_assert_eq(entry->count, 10, "publishing wrote the count");

  /* After the publish the entry is closed: a new header, count stays. */
  uint8_t *slot = sl_ring_append_record_producer(&r, 24, 0);
  cr_assert_eq(slot, previous + stride24 + 8, "new entry after publish");
  cr_assert_eq(sl_ring_open_count(&r), 1);
  cr_assert_eq(entry->count, 10, "a published entry never changes");
  previous = slot;

  /* Size change, flag change and control entries start new entries. */
  slot = sl_ring_append_record_producer(&r, 25, 0);
  cr_assert_eq(slot, previous + stride24 + 8, "size change: new entry");
  cr_assert_eq(sl_ring_open_count(&r), 1);
  previous = slot;
  slot = sl_ring_append_record_producer(&r, 25, SL_ENTRY_HAS_TS);
  cr_assert_eq(slot, previous + sl_record_stride(25, 0) + 8,
               "flag change: new entry");
  previous = slot;
  cr_assert(sl_ring_write_control_producer(&r, SL_ENTRY_WATERMARK, 77));
  slot = sl_ring_append_record_producer(&r, 25, SL_ENTRY_HAS_TS);
  cr_assert_eq(slot, previous + sl_record_stride(25, SL_ENTRY_HAS_TS) + 16 + 8,
               "control entry closes the open entry");
  slot = sl_ring_append_record_producer(&r, 25, SL_ENTRY_HAS_TS);
  cr_assert_eq(sl_ring_open_count(&r), 2);
  sl_ring_publish_producer(&r, false);
  const uint32_t counts[6] = {10, 1, 1, 1, 0, 2};
  const uint8_t kinds[6] = {SL_ENTRY_RECORDS,   SL_ENTRY_RECORDS,
                            SL_ENTRY_RECORDS,   SL_ENTRY_RECORDS,
                            SL_ENTRY_WATERMARK, SL_ENTRY_RECORDS};
  for (int i = 0; i < 6; i++) {
    cr_assert_gt(sl_ring_readable_consumer(&r), 0);
    const sl_entry *e = sl_ring_peek_consumer(&r);
    cr_assert_eq(e->kind, kinds[i], "entry %d kind", i);
    if (e->kind == SL_ENTRY_RECORDS)
      cr_assert_eq(e->count, counts[i], "entry %d count %u", i, e->count);
    else
      cr_assert_eq(sl_entry_value(e), 77);
    sl_ring_advance_consumer(&r, sl_entry_bytes(e));
  }
  cr_assert_eq(sl_ring_readable_consumer(&r), 0);
  sl_ring_release_consumer(&r, false);

  /* SL_ENTRY_MAX_COUNT: 65535 one-byte records share an entry, the next one
   * opens a second entry. */
  uint64_t start = r.producer_position;
  entry = 0;
  for (uint64_t k = 0; k <= SL_ENTRY_MAX_COUNT; k++) {
    slot = sl_ring_append_record_producer(&r, 1, 0);
    cr_assert_not_null(slot);
    *slot = (uint8_t)k;
    if (k == 0)
      entry = (sl_entry *)(slot - 8);
  }
  cr_assert_eq(sl_ring_open_count(&r), 1, "the 65536th record opened a new entry");
  cr_assert_eq(r.producer_position - start,
               8 + 8 * (uint64_t)SL_ENTRY_MAX_COUNT + 8 + 8);
  sl_ring_publish_producer(&r, false);
  cr_assert_eq(entry->count, SL_ENTRY_MAX_COUNT);
  sl_entry *overflow = (sl_entry *)((uint8_t *)entry + sl_entry_bytes(entry));
  cr_assert_eq(overflow->kind, SL_ENTRY_RECORDS);
  cr_assert_eq(overflow->count, 1);
  uint64_t seen = 0;
  while (sl_ring_readable_consumer(&r) > 0) {
    const sl_entry *e = sl_ring_peek_consumer(&r);
    cr_assert_eq(e->record_bytes, 1);
    for (uint32_t k = 0; k < e->count; k++, seen++)
      cr_assert_eq(((const uint8_t *)e)[8 + 8 * k], (uint8_t)seen);
    sl_ring_advance_consumer(&r, sl_entry_bytes(e));
  }
  cr_assert_eq(seen, (uint64_t)SL_ENTRY_MAX_COUNT + 1);
  sl_ring_release_consumer(&r, false);
  sl_ring_destroy(&r);

  /* An open entry that ends exactly at the buffer's end is not extended
   * across it: the next record opens a new entry at 0, with no PAD. */
  cr_assert_eq(sl_ring_init(&r, 4096, 0, 0, 0), 0);
  for (int k = 0; k < 128; k++) /* move both sides to 2048 */
    cr_assert(sl_ring_write_control_producer(&r, SL_ENTRY_BARRIER, 1));
  sl_ring_publish_producer(&r, false);
  while (sl_ring_readable_consumer(&r) > 0)
    sl_ring_advance_consumer(&r, sl_entry_bytes(sl_ring_peek_consumer(&r)));
  sl_ring_release_consumer(&r, false);
  entry = 0;
  for (int k = 0; k < 255; k++) { /* 8 + 255 * 8 = 2048 bytes: to the end */
    slot = sl_ring_append_record_producer(&r, 8, 0);
    cr_assert_not_null(slot);
    if (k == 0)
      entry = (sl_entry *)(slot - 8);
  }
  cr_assert_eq((uint8_t *)entry, r.buffer + 2048);
  slot = sl_ring_append_record_producer(&r, 8, 0);
  cr_assert_eq(slot, r.buffer + 8, "new entry at the buffer's start");
  cr_assert_eq(entry->count, 255, "the entry at the end was closed at 255");
  sl_ring_publish_producer(&r, false);
  cr_assert_eq(((sl_entry *)r.buffer)->count, 1);
  cr_assert(sl_ring_check(&r));
  cr_assert_eq(sl_ring_readable_consumer(&r), 2048 + 16);
  sl_ring_destroy(&r);
}

/* 4b. batch_records bounds an entry; the append that finds the open entry
 * full publishes it (the output batch), whatever that append writes. */
Test(ring, batch_records, .timeout = 30) {
  sl_ring r;
  cr_assert_eq(sl_ring_init(&r, 64u << 10, 0, 0, 10), 0);
  const uint64_t entry10 = 8 + 10 * (uint64_t)sl_record_stride(24, 0);
  for (int k = 0; k < 10; k++)
    cr_assert_not_null(sl_ring_append_record_producer(&r, 24, 0));
  cr_assert_eq(atomic_load(&r.tail), 0,
               "a batch is published only when full"
               " and another record comes");
  cr_assert_not_null(sl_ring_append_record_producer(&r, 24, 0));
  cr_assert_eq(atomic_load(&r.tail), entry10, "the full entry was published");
  cr_assert_eq(sl_ring_open_count(&r), 1);
  cr_assert_eq(sl_ring_readable_consumer(&r), entry10);
  const sl_entry *e = sl_ring_peek_consumer(&r);
  cr_assert_eq(e->count, 10);
  sl_ring_advance_consumer(&r, sl_entry_bytes(e));

  /* Fill the second entry to 10, then change the size: still published by
   * the append that finds it full.  A partial entry followed by a size
   * change is not. */
  for (int k = 1; k < 10; k++)
    cr_assert_not_null(sl_ring_append_record_producer(&r, 24, 0));
  cr_assert_not_null(sl_ring_append_record_producer(&r, 40, 0));
  cr_assert_eq(atomic_load(&r.tail), 2 * entry10);
  cr_assert_not_null(sl_ring_append_record_producer(&r, 48, 0));
  cr_assert_eq(atomic_load(&r.tail), 2 * entry10,
               "partial entry not published");
  sl_ring_publish_producer(&r, false);
  uint32_t expected_counts[3] = {10, 1, 1};
  for (int i = 0; i < 3; i++) {
    cr_assert_gt(sl_ring_readable_consumer(&r), 0);
    e = sl_ring_peek_consumer(&r);
    cr_assert_eq(e->count, expected_counts[i]);
    sl_ring_advance_consumer(&r, sl_entry_bytes(e));
  }
  cr_assert_eq(sl_ring_readable_consumer(&r), 0);
  sl_ring_destroy(&r);

  /* batch_records = 1: every record is an entry, each append publishes the
   * one before. */
  cr_assert_eq(sl_ring_init(&r, 4096, 0, 0, 1), 0);
  for (uint64_t k = 1; k <= 20; k++) {
    cr_assert_not_null(sl_ring_append_record_producer(&r, 8, 0));
    cr_assert_eq(atomic_load(&r.tail), (k - 1) * 16);
  }
  sl_ring_destroy(&r);
}

/* 4c. Records of 0 bytes without a timestamp occupy no bytes (stride 0),
 * but an entry must still hold at most batch_records records and at most
 * SL_ENTRY_MAX_COUNT (its header count is 16 bits). */
Test(ring, zero_byte_records, .timeout = 30) {
  sl_ring r;
  cr_assert_eq(sl_ring_init(&r, 4096, 0, 0, 64), 0);
  bool appended = true;
  for (int k = 0; k < 100; k++)
    appended = appended && sl_ring_append_record_producer(&r, 0, 0) != 0;
  uint32_t open_count = sl_ring_open_count(&r);
  uint64_t published = atomic_load(&r.tail);
  sl_ring_destroy(&r);
  cr_assert(appended);
  cr_assert_leq(open_count, 64, "open entry holds %u records, batch is 64",
                open_count);
  cr_assert_gt(published, 0, "the first full batch of 64 was published");

  /* An empty record takes 8 bytes (ring.h sl_record_stride): 65536 of them
   * need a 1 MiB ring to fit without a consumer. */
  cr_assert_eq(sl_ring_init(&r, 1u << 20, 0, 0, 0), 0);
  for (uint64_t k = 0; k <= SL_ENTRY_MAX_COUNT; k++)
    cr_assert_not_null(sl_ring_append_record_producer(&r, 0, 0));
  cr_assert_leq(sl_ring_open_count(&r), SL_ENTRY_MAX_COUNT, "open entry holds %u records",
                sl_ring_open_count(&r));
  sl_ring_publish_producer(&r, false);
  uint64_t records = 0;
  while (sl_ring_readable_consumer(&r) > 0) {
    const sl_entry *e = sl_ring_peek_consumer(&r);
    records += e->count;
    sl_ring_advance_consumer(&r, sl_entry_bytes(e));
  }
  cr_assert_eq(records, (uint64_t)SL_ENTRY_MAX_COUNT + 1,
               "every record arrives: %" PRIu64, records);
  cr_assert(sl_ring_check(&r));
  sl_ring_destroy(&r);
}

/* 7. Sizes outside [4 KiB, 1 GiB] are refused, others round up to a power
 * of two. */
Test(ring, init_sizes, .timeout = 30) {
  sl_ring r;
  const uint64_t refused[] = {
      0, 1, 4095, SL_RING_MAX_BYTES + 1, 2ull << 30, UINT64_MAX};
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    cr_assert_eq(sl_ring_init(&r, refused[i], 0, 0, 0), EINVAL,
                 "size %" PRIu64 " refused", refused[i]);
    cr_assert_null(r.buffer, "a refused ring holds no memory");
  }
  cr_assert_eq(sl_ring_init(&r, 4096, 0, 0, SL_ENTRY_MAX_COUNT + 1u), EINVAL,
               "batch_records above SL_ENTRY_MAX_COUNT refused");
  cr_assert_null(r.buffer);
  cr_assert_eq(sl_ring_init(&r, 4096, 0, 0, 0), 0);
  cr_assert_eq(r.batch_records, SL_ENTRY_MAX_COUNT, "0 means the maximum");
  sl_ring_destroy(&r);
  const uint64_t sizes[][2] = {
      {4096, 4096},         {4097, 8192},   {5000, 8192},
      {65535, 65536},       {65536, 65536}, {(1u << 20) + 1, 2u << 20},
      {3u << 20, 4u << 20},
  };
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    cr_assert_eq(sl_ring_init(&r, sizes[i][0], 0, 0, 0), 0);
    cr_assert_eq(r.capacity_bytes, sizes[i][1],
                 "size %" PRIu64 " -> %" PRIu64 ", expected %" PRIu64,
                 sizes[i][0], r.capacity_bytes, sizes[i][1]);
    cr_assert_eq(r.mask, sizes[i][1] - 1);
    cr_assert_eq(r.wake_threshold_bytes, sizes[i][1] / 4);
    cr_assert_eq((uintptr_t)r.buffer % 4096, 0, "page-aligned buffer");
    cr_assert(sl_ring_check(&r));
    sl_ring_destroy(&r);
    cr_assert_null(r.buffer);
  }
  /* 1 GiB itself is not allocated here: under MALLOC_PERTURB_ (which meson
   * test sets) the allocator would write the whole GiB, for seconds. */
}

#include "ring_wait.h"

/* --------------------------------------------- producer/consumer pairs */

/* The stream of one pair.  Fixed: 16-byte records (key, value) with value
 * = 0, 1, 2, ...  Mixed: record seq has 1..200 payload bytes (equal in runs
 * of 8) and a timestamp every other run; after every WATERMARK_EVERY records
 * a WATERMARK (value: records so far), after every BARRIER_EVERY a BARRIER
 * (value: barriers so far).  Both end with END (value: records). */
#define PUBLISH_EVERY 64
#define WATERMARK_EVERY 997
#define BARRIER_EVERY 4999

static uint64_t key_of(uint64_t seq) { return seq * 0x9e3779b97f4a7c15ull; }

static uint32_t mixed_bytes(uint64_t seq) {
  return 1 + (uint32_t)(mix64(seq >> 3) % 200);
}

static unsigned mixed_flags(uint64_t seq) {
  return (seq >> 3) & 1 ? SL_ENTRY_HAS_TS : 0;
}

static int64_t mixed_timestamp(uint64_t seq) { return (int64_t)seq * 7 - 1000; }

typedef struct stress_pair {
  sl_ring ring;
  alignas(SL_CACHE_LINE) sl_parker consumer_parker;
  alignas(SL_CACHE_LINE) sl_parker producer_parker;
  /* Set before the threads start. */
  uint64_t records;
  unsigned spin_limit;
  bool mixed;
  /* Producer's results (read after join) and progress (for the watchdog). */
  alignas(SL_CACHE_LINE) uint64_t producer_checksum;
  _Atomic uint64_t produced;
  _Atomic bool producer_done;
  /* Consumer's results and progress. */
  alignas(SL_CACHE_LINE) uint64_t consumer_checksum;
  uint64_t consumed_records;
  uint64_t errors;
  uint64_t watermarks, barriers;
  uint64_t end_value;
  bool end_seen;
  char first_error[160];
  _Atomic uint64_t consumed;
  _Atomic bool consumer_done;
} stress_pair;

static void pair_error(stress_pair *p, const char *what, uint64_t seq) {
  if (p->errors++ == 0)
    snprintf(p->first_error, sizeof p->first_error, "%s at record %" PRIu64,
             what, seq);
}

static void *producer_main(void *arg) {
  stress_pair *p = arg;
  sl_ring *r = &p->ring;
  uint64_t sum = CHECKSUM_SEED;
  uint64_t barriers = 0;
  for (uint64_t seq = 0; seq < p->records; seq++) {
    if (!p->mixed) {
      uint8_t *slot =
          append_waiting(r, &p->producer_parker, p->spin_limit, 16, 0);
      uint64_t key = key_of(seq);
      memcpy(slot, &key, 8);
      memcpy(slot + 8, &seq, 8);
      sum = checksum_step(checksum_step(sum, key), seq);
    } else {
      uint32_t bytes = mixed_bytes(seq);
      unsigned flags = mixed_flags(seq);
      uint8_t *slot =
          append_waiting(r, &p->producer_parker, p->spin_limit, bytes, flags);
      if (flags & SL_ENTRY_HAS_TS) {
        int64_t timestamp = mixed_timestamp(seq);
        memcpy(slot, &timestamp, 8);
        slot += 8;
      }
      fill_payload(slot, bytes, seq);
      sum = checksum_step(checksum_step(sum, seq), bytes);
      if ((seq + 1) % WATERMARK_EVERY == 0) {
        control_waiting(r, &p->producer_parker, p->spin_limit,
                        SL_ENTRY_WATERMARK, seq + 1);
        sum = checksum_step(sum, seq + 1);
      }
      if ((seq + 1) % BARRIER_EVERY == 0) {
        control_waiting(r, &p->producer_parker, p->spin_limit, SL_ENTRY_BARRIER,
                        ++barriers);
        sum = checksum_step(sum, barriers);
      }
    }
    if ((seq + 1) % PUBLISH_EVERY == 0) {
      sl_ring_publish_producer(r, false);
      atomic_store_explicit(&p->produced, seq + 1, memory_order_relaxed);
    }
  }
  control_waiting(r, &p->producer_parker, p->spin_limit, SL_ENTRY_END,
                  p->records);
  sl_ring_publish_producer(r, true);
  atomic_store_explicit(&p->produced, p->records, memory_order_relaxed);
  p->producer_checksum = sum;
  atomic_store_explicit(&p->producer_done, true, memory_order_release);
  return 0;
}

/* Check and sum one RECORDS entry; seq is the next expected record. */
static uint64_t consume_records(stress_pair *p, const sl_entry *e, uint64_t seq,
                                uint64_t *sum) {
  const uint8_t *record = (const uint8_t *)e + 8;
  if (!p->mixed) {
    if (e->record_bytes != 16 || e->flags != 0)
      pair_error(p, "wrong record size or flags", seq);
    for (uint32_t k = 0; k < e->count; k++, record += 16, seq++) {
      uint64_t key, value;
      memcpy(&key, record, 8);
      memcpy(&value, record + 8, 8);
      if (value != seq) {
        pair_error(p, "sequence gap", seq);
        seq = value; /* resynchronise to count every gap once */
      }
      if (key != key_of(value))
        pair_error(p, "key does not match value", seq);
      *sum = checksum_step(checksum_step(*sum, key), value);
    }
    return seq;
  }
  uint32_t stride = sl_record_stride(e->record_bytes, e->flags);
  for (uint32_t k = 0; k < e->count; k++, record += stride, seq++) {
    if (e->record_bytes != mixed_bytes(seq) || e->flags != mixed_flags(seq)) {
      pair_error(p, "wrong record size or flags", seq);
      continue;
    }
    const uint8_t *payload = record;
    if (e->flags & SL_ENTRY_HAS_TS) {
      int64_t timestamp;
      memcpy(&timestamp, record, 8);
      if (timestamp != mixed_timestamp(seq))
        pair_error(p, "wrong timestamp", seq);
      payload += 8;
    }
    if (!payload_ok(payload, e->record_bytes, seq))
      pair_error(p, "wrong payload", seq);
    *sum = checksum_step(checksum_step(*sum, seq), e->record_bytes);
  }
  return seq;
}

#define RELEASE_EVERY_ENTRIES 16

static void *consumer_main(void *arg) {
  stress_pair *p = arg;
  sl_ring *r = &p->ring;
  uint64_t sum = CHECKSUM_SEED, seq = 0;
  for (uint64_t entries = 1;; entries++) {
    wait_readable(r, &p->consumer_parker, p->spin_limit);
    const sl_entry *e = sl_ring_peek_consumer(r);
    if (e->kind == SL_ENTRY_RECORDS) {
      seq = consume_records(p, e, seq, &sum);
    } else if (e->kind == SL_ENTRY_WATERMARK) {
      p->watermarks++;
      if (seq % WATERMARK_EVERY != 0 || sl_entry_value(e) != seq)
        pair_error(p, "misplaced WATERMARK", seq);
      sum = checksum_step(sum, sl_entry_value(e));
    } else if (e->kind == SL_ENTRY_BARRIER) {
      p->barriers++;
      if (seq % BARRIER_EVERY != 0 || sl_entry_value(e) != p->barriers)
        pair_error(p, "misplaced BARRIER", seq);
      sum = checksum_step(sum, sl_entry_value(e));
    } else if (e->kind == SL_ENTRY_END) {
      p->end_seen = true;
      p->end_value = sl_entry_value(e);
    } else {
      pair_error(p, "unknown entry kind", seq);
      break; /* the stream is corrupt; the watchdog reports it */
    }
    sl_ring_advance_consumer(r, sl_entry_bytes(e));
    atomic_store_explicit(&p->consumed, seq, memory_order_relaxed);
    if (p->end_seen)
      break;
    if (entries % RELEASE_EVERY_ENTRIES == 0)
      sl_ring_release_consumer(r, false);
  }
  sl_ring_release_consumer(r, true);
  p->consumed_records = seq;
  p->consumer_checksum = sum;
  atomic_store_explicit(&p->consumer_done, true, memory_order_release);
  return 0;
}

/* n pairs on rings of ring_bytes, each side's parker passed to sl_ring_init
 * (consumer's, producer's); the caller sets records, mixed, spin_limit. */
static stress_pair *pairs_create(size_t n, uint64_t ring_bytes,
                                 uint32_t batch_records) {
  stress_pair *pairs = aligned_alloc(alignof(stress_pair), n * sizeof *pairs);
  cr_assert_not_null(pairs);
  memset(pairs, 0, n * sizeof *pairs);
  for (size_t i = 0; i < n; i++) {
    stress_pair *p = &pairs[i];
    sl_parker_init(&p->consumer_parker);
    sl_parker_init(&p->producer_parker);
    cr_assert_eq(sl_ring_init(&p->ring, ring_bytes, &p->consumer_parker,
                              &p->producer_parker, batch_records),
                 0);
  }
  return pairs;
}

static void pairs_destroy(stress_pair *pairs, size_t n) {
  for (size_t i = 0; i < n; i++)
    sl_ring_destroy(&pairs[i].ring);
  free(pairs);
}

/* Run every pair on two threads of its own and wait at most deadline_s.
 * On a timeout (a lost wake-up or a livelock) or a corrupt stream, fail the
 * test naming each unfinished pair and its progress; the test process ends
 * the threads that are left.  Returns the elapsed seconds. */
static double run_pairs(stress_pair *pairs, size_t n, double deadline_s) {
  pthread_t *threads = calloc(2 * n, sizeof *threads);
  cr_assert_not_null(threads);
  double start = now_s();
  for (size_t i = 0; i < n; i++) {
    cr_assert_eq(pthread_create(&threads[2 * i], 0, consumer_main, &pairs[i]),
                 0);
    cr_assert_eq(
        pthread_create(&threads[2 * i + 1], 0, producer_main, &pairs[i]), 0);
  }
  /* Watchdog: poll the done flags; a consumer that stopped on a corrupt
   * stream ends the wait at once. */
  bool all_done = false, corrupt = false;
  while (!all_done && !corrupt && now_s() - start < deadline_s) {
    sleep_ms(5);
    all_done = true;
    for (size_t i = 0; i < n; i++) {
      bool consumer_done =
          atomic_load_explicit(&pairs[i].consumer_done, memory_order_acquire);
      bool producer_done =
          atomic_load_explicit(&pairs[i].producer_done, memory_order_acquire);
      all_done = all_done && consumer_done && producer_done;
      corrupt = corrupt || (consumer_done && !pairs[i].end_seen);
    }
  }
  if (!all_done) {
    char why[2048];
    size_t used =
        (size_t)snprintf(why, sizeof why, "%s after %.1f s:",
                         corrupt ? "corrupt stream" : "no progress (deadlock?)",
                         now_s() - start);
    for (size_t i = 0; i < n && used < sizeof why; i++) {
      stress_pair *p = &pairs[i];
      if (atomic_load(&p->consumer_done) && atomic_load(&p->producer_done))
        continue;
      used += (size_t)snprintf(
          why + used, sizeof why - used,
          " [pair %zu: produced %" PRIu64 " consumed %" PRIu64 " of %" PRIu64
          ", consumer parker %s, producer parker %s%s%s]",
          i, atomic_load(&p->produced), atomic_load(&p->consumed), p->records,
          atomic_load(&p->consumer_parker.state) ? "PARKED" : "RUNNING",
          atomic_load(&p->producer_parker.state) ? "PARKED" : "RUNNING",
          atomic_load(&p->consumer_done) ? ", consumer: " : "",
          atomic_load(&p->consumer_done) ? p->first_error : "");
    }
    cr_assert_fail("%s", why);
  }
  for (size_t i = 0; i < 2 * n; i++)
    cr_assert_eq(pthread_join(threads[i], 0), 0);
  free(threads);
  return now_s() - start;
}

/* Everything a finished pair must satisfy. */
static void check_pair(const stress_pair *p, size_t i) {
  cr_assert_eq(p->errors, 0, "pair %zu: %" PRIu64 " errors, first: %s", i,
               p->errors, p->first_error);
  cr_assert(p->end_seen, "pair %zu: END arrived", i);
  cr_assert_eq(p->end_value, p->records, "pair %zu: END value", i);
  cr_assert_eq(p->consumed_records, p->records,
               "pair %zu: consumed %" PRIu64 " of %" PRIu64, i,
               p->consumed_records, p->records);
  cr_assert_eq(p->consumer_checksum, p->producer_checksum,
               "pair %zu: checksum %016" PRIx64 " != %016" PRIx64, i,
               p->consumer_checksum, p->producer_checksum);
  if (p->mixed) {
    cr_assert_eq(p->watermarks, p->records / WATERMARK_EVERY);
    cr_assert_eq(p->barriers, p->records / BARRIER_EVERY);
  }
  uint64_t tail = atomic_load(&p->ring.tail);
  cr_assert_eq(atomic_load(&p->ring.head), tail, "pair %zu: ring drained", i);
  cr_assert(sl_ring_check(&p->ring));
}

/* 5a. One producer, one consumer, 100 M records of 16 bytes. */
Test(ring, stress_fixed, .timeout = 600) {
  uint64_t records = scaled(100000000);
  stress_pair *p = pairs_create(1, 64u << 10, 0);
  p->records = records;
  p->spin_limit = 200;
  double seconds = run_pairs(p, 1, 300);
  check_pair(p, 0);
  cr_log_info("stress_fixed: %" PRIu64 " records in %.2f s (%.1f M/s), sleeps"
              " consumer %" PRIu64 " producer %" PRIu64,
              records, seconds, (double)records / seconds / 1e6,
              p->consumer_parker.sleeps, p->producer_parker.sleeps);
  pairs_destroy(p, 1);
}

/* 5b. The same with 1..200-byte records, timestamps and control entries. */
Test(ring, stress_mixed, .timeout = 600) {
  uint64_t records = scaled(20000000);
  stress_pair *p = pairs_create(1, 64u << 10, 0);
  p->records = records;
  p->mixed = true;
  p->spin_limit = 200;
  double seconds = run_pairs(p, 1, 300);
  check_pair(p, 0);
  cr_log_info("stress_mixed: %" PRIu64 " records in %.2f s (%.1f M/s), sleeps"
              " consumer %" PRIu64 " producer %" PRIu64,
              records, seconds, (double)records / seconds / 1e6,
              p->consumer_parker.sleeps, p->producer_parker.sleeps);
  pairs_destroy(p, 1);
}

/* 6. Eight pairs (16 threads on 2 cores) on 4 KiB rings with spin limits of
 * 0..3: they park all the time.  Every pair must finish (no lost wake-up)
 * with matching checksums, and the parkers must really have slept. */
Test(ring, park_storm, .timeout = 600) {
  enum { PAIRS = 8 };
  uint64_t records = scaled(5000000);
  stress_pair *group = pairs_create(PAIRS, 4096, 0);
  for (size_t i = 0; i < PAIRS; i++) {
    /* Half the pairs carry 16-byte records, half the mixed stream (fewer:
     * its records are bigger); spin limits 0, 1, 2, 3. */
    group[i].mixed = i % 2 == 1;
    group[i].records = group[i].mixed ? records / 2 : records;
    group[i].spin_limit = (unsigned)(i / 2);
  }
  double seconds = run_pairs(group, PAIRS, 60);
  uint64_t sleeps = 0, consumer_sleeps = 0, producer_sleeps = 0;
  for (size_t i = 0; i < PAIRS; i++) {
    check_pair(&group[i], i);
    consumer_sleeps += group[i].consumer_parker.sleeps;
    producer_sleeps += group[i].producer_parker.sleeps;
  }
  sleeps = consumer_sleeps + producer_sleeps;
  cr_log_info("park_storm: %d pairs in %.2f s, sleeps consumer %" PRIu64
              " producer %" PRIu64,
              PAIRS, seconds, consumer_sleeps, producer_sleeps);
  cr_assert_gt(consumer_sleeps, 0, "consumers parked");
  cr_assert_gt(producer_sleeps, 0, "producers parked");
  cr_assert_gt(sleeps, 1000, "parking was exercised: %" PRIu64 " sleeps",
               sleeps);
  pairs_destroy(group, PAIRS);
}

/* ----------------------------------------------------------- parker */

typedef struct sleeper {
  sl_parker parker;
  _Atomic bool go;       /* the condition the sleeper waits for */
  _Atomic bool prepared; /* the sleeper announced parking */
  _Atomic bool returned; /* the sleeper saw go and returned */
  double slept_s;
} sleeper;

static void *sleeper_main(void *arg) {
  sleeper *s = arg;
  double start = now_s();
  while (!atomic_load(&s->go)) {
    sl_parker_prepare(&s->parker);
    atomic_store(&s->prepared, true);
    if (atomic_load(&s->go)) {
      sl_parker_cancel(&s->parker);
      break;
    }
    sl_parker_sleep(&s->parker);
  }
  s->slept_s = now_s() - start;
  atomic_store(&s->returned, true);
  return 0;
}

/* 8a. A thread that prepared and sleeps stays asleep until sl_parker_wake. */
Test(parker, wake_wakes_sleeper, .timeout = 30) {
  sleeper s;
  sl_parker_init(&s.parker);
  atomic_init(&s.go, false);
  atomic_init(&s.prepared, false);
  atomic_init(&s.returned, false);
  pthread_t thread;
  cr_assert_eq(pthread_create(&thread, 0, sleeper_main, &s), 0);
  while (!atomic_load(&s.prepared))
    sleep_ms(1);
  sleep_ms(200);
  cr_assert_not(atomic_load(&s.returned), "sleeps until woken");
  cr_assert_eq(atomic_load(&s.parker.state), SL_PARKER_PARKED);
  atomic_store(&s.go, true);
  sl_parker_wake(&s.parker);
  cr_assert_eq(pthread_join(thread, 0), 0);
  cr_assert(atomic_load(&s.returned));
  cr_assert_geq(s.parker.sleeps, 1, "it really slept");
  cr_assert_geq(s.slept_s, 0.15, "slept %.3f s", s.slept_s);
  cr_assert_eq(atomic_load(&s.parker.state), SL_PARKER_RUNNING);
}

/* 8b. A wake between prepare and sleep makes the sleep return at once; a
 * wake of a running parker does nothing. */
Test(parker, wake_before_sleep, .timeout = 10) {
  sl_parker p;
  sl_parker_init(&p);
  sl_parker_wake(&p);
  cr_assert_eq(atomic_load(&p.state), SL_PARKER_RUNNING);

  sl_parker_prepare(&p);
  cr_assert_eq(atomic_load(&p.state), SL_PARKER_PARKED);
  sl_parker_cancel(&p);
  cr_assert_eq(atomic_load(&p.state), SL_PARKER_RUNNING);

  for (int i = 0; i < 1000; i++) {
    sl_parker_prepare(&p);
    sl_parker_wake(&p); /* resets the state to RUNNING */
    cr_assert_eq(atomic_load(&p.state), SL_PARKER_RUNNING);
    double start = now_s();
    sl_parker_sleep(&p); /* would hang here if the wake were lost */
    cr_assert_lt(now_s() - start, 10.0); /* a lost wake, not a slow one */
    cr_assert_eq(atomic_load(&p.state), SL_PARKER_RUNNING);
  }
}

/* 8c. Two threads hand a token back and forth through parkers only (spin
 * limit 0): every hand-over needs a wake that must not be lost. */
typedef struct ping_pong {
  _Atomic uint64_t token; /* even: ping's turn, odd: pong's */
  sl_parker parkers[2];
  uint64_t rounds;
} ping_pong;

typedef struct ping_pong_side {
  ping_pong *game;
  unsigned side;
} ping_pong_side;

static bool my_turn(void *arg) {
  ping_pong_side *s = arg;
  return atomic_load(&s->game->token) % 2 == s->side;
}

static void *ping_pong_main(void *arg) {
  ping_pong_side *s = arg;
  ping_pong *g = s->game;
  for (uint64_t i = 0; i < g->rounds; i++) {
    wait_until(my_turn, s, &g->parkers[s->side], 0);
    atomic_fetch_add(&g->token, 1);
    sl_parker_wake(&g->parkers[1 - s->side]);
  }
  return 0;
}

Test(parker, ping_pong, .timeout = 120) {
  ping_pong g;
  atomic_init(&g.token, 0);
  sl_parker_init(&g.parkers[0]);
  sl_parker_init(&g.parkers[1]);
  g.rounds = scaled(100000);
  ping_pong_side sides[2] = {{&g, 0}, {&g, 1}};
  pthread_t threads[2];
  for (int i = 0; i < 2; i++)
    cr_assert_eq(pthread_create(&threads[i], 0, ping_pong_main, &sides[i]), 0);
  double start = now_s();
  while (atomic_load(&g.token) < 2 * g.rounds && now_s() - start < 60)
    sleep_ms(5);
  cr_assert_eq(atomic_load(&g.token), 2 * g.rounds,
               "lost wake-up: token stuck at %" PRIu64 " of %" PRIu64,
               atomic_load(&g.token), 2 * g.rounds);
  for (int i = 0; i < 2; i++)
    cr_assert_eq(pthread_join(threads[i], 0), 0);
  cr_assert_gt(g.parkers[0].sleeps + g.parkers[1].sleeps, 0);
}

/* 8d. Polling (wait.h): a nudge wakes a PARKED owner but leaves a POLLING
 * one to its timeout; a wake wakes both; a sleep after a wake returns at
 * once (a lost wake would sleep the whole timeout: longer than the
 * test's). */
Test(parker, nudge_leaves_polling_owner, .timeout = 30) {
  sl_parker p;
  sl_parker_init(&p);
  sl_parker_nudge(&p); /* running: nothing */
  cr_assert_eq(atomic_load(&p.state), SL_PARKER_RUNNING);

  sl_parker_prepare_polling(&p);
  cr_assert_eq(atomic_load(&p.state), SL_PARKER_POLLING);
  sl_parker_nudge(&p);
  cr_assert_eq(atomic_load(&p.state), SL_PARKER_POLLING,
               "a nudge left the poller alone");
  sl_parker_wake(&p);
  cr_assert_eq(atomic_load(&p.state), SL_PARKER_RUNNING,
               "a wake reset the poller");
  sl_parker_sleep_ns(&p, 1000000000000ull); /* 1000 s, unless woken */
  cr_assert_eq(atomic_load(&p.state), SL_PARKER_RUNNING);

  sl_parker_prepare(&p);
  sl_parker_nudge(&p);
  cr_assert_eq(atomic_load(&p.state), SL_PARKER_RUNNING,
               "a nudge woke the parked owner");
  sl_parker_sleep_ns(&p, 1000000000000ull);
  cr_assert_eq(atomic_load(&p.state), SL_PARKER_RUNNING);
}

typedef struct poller {
  sl_parker parker;
  _Atomic bool go;
  _Atomic uint64_t polls; /* sleeps begun */
  uint64_t timeout_ns;
} poller;

static void *poller_main(void *arg) {
  poller *q = arg;
  while (!atomic_load(&q->go)) {
    sl_parker_prepare_polling(&q->parker);
    if (atomic_load(&q->go)) {
      sl_parker_cancel(&q->parker);
      break;
    }
    atomic_fetch_add(&q->polls, 1);
    sl_parker_sleep_ns(&q->parker, q->timeout_ns);
  }
  return 0;
}

/* 8e. A polling thread sees a change that was only nudged (after its
 * timeout, 1 ms), and one that was woken while it slept with a timeout
 * of 1000 s (at once: the test's own timeout would end it otherwise). */
Test(parker, poller_sees_nudge_and_wake, .timeout = 60) {
  for (int round = 0; round < 2; round++) {
    bool nudge = round == 0;
    poller q;
    sl_parker_init(&q.parker);
    atomic_init(&q.go, false);
    atomic_init(&q.polls, 0);
    q.timeout_ns = nudge ? 1000000u : 1000000000000ull;
    pthread_t thread;
    cr_assert_eq(pthread_create(&thread, 0, poller_main, &q), 0);
    while (atomic_load(&q.polls) == 0)
      sleep_ms(1); /* it is about to sleep, or sleeps */
    atomic_store(&q.go, true);
    if (nudge)
      sl_parker_nudge(&q.parker);
    else
      sl_parker_wake(&q.parker);
    cr_assert_eq(pthread_join(thread, 0), 0);
    cr_assert_eq(atomic_load(&q.parker.state), SL_PARKER_RUNNING);
    cr_assert_geq(atomic_load(&q.polls), 1);
  }
}

/* A batch is counted per ring, not per entry: records of alternating sizes
 * (each starting a new entry) are still published once batch_records of
 * them are waiting. */
Test(ring, batch_counts_across_entries, .timeout = 30) {
  sl_ring r;
  cr_assert_eq(sl_ring_init(&r, 1u << 20, 0, 0, 64), 0);
  uint64_t first_publish_at = 0;
  for (uint64_t k = 1; k <= 1000 && first_publish_at == 0; k++) {
    uint8_t *slot = sl_ring_append_record_producer(&r, k % 2 ? 8 : 16, 0);
    cr_assert_not_null(slot);
    memset(slot, (int)k, k % 2 ? 8 : 16);
    if (atomic_load(&r.tail) != 0)
      first_publish_at = k;
  }
  cr_assert_gt(first_publish_at, 0, "nothing was published in 1000 records");
  cr_assert_leq(first_publish_at, 66,
                "published after %" PRIu64 " records, batch is 64",
                first_publish_at);
  uint64_t records = 0;
  while (sl_ring_readable_consumer(&r) > 0) {
    const sl_entry *e = sl_ring_peek_consumer(&r);
    records += e->count;
    sl_ring_advance_consumer(&r, sl_entry_bytes(e));
  }
  cr_assert_geq(records, 64);
  cr_assert(sl_ring_check(&r));
  sl_ring_destroy(&r);
}
