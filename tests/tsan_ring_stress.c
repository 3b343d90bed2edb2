/* tsan_ring_stress.c — producer/consumer stress of the SPSC ring and the
 * parkers, as a plain program for ThreadSanitizer builds (Criterion 2.4
 * aborts under TSan, so this is not a Criterion test).
 *
 * Same protocol as the threaded tests in test_ring.c: the producer publishes
 * every 64 records (not forced) and with force before it waits and at the
 * end; each side spins a bounded number of times, then parks with
 * prepare / re-check / sleep (wait.h).  Three parts:
 *   1. one pair, 16-byte records (key, value), value = 0, 1, 2, ...
 *   2. one pair, records of 1..200 bytes with timestamps, WATERMARK and
 *      BARRIER entries in between;
 *   3. six pairs on 4 KiB rings with spin limits 0..2 (12 threads on the
 *      development machines' 2 cores), so both sides park all the time.
 * Every stream ends with END.  Both sides keep a running checksum; the
 * consumer also checks sequence, sizes, payload bytes and control values.
 *
 * Exit status 0 when every pair matches, 1 with a message otherwise (also
 * when a pair makes no progress within the deadline: a lost wake-up).
 * SLUICE_TEST_SCALE=n divides the record counts by n.
 */
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

#define PUBLISH_EVERY 64
#define RELEASE_EVERY_ENTRIES 16
#define WATERMARK_EVERY 997
#define BARRIER_EVERY 4999
#define DEADLINE_S 300.0 /* TSan is slow; a healthy run takes far less */

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Order-sensitive running checksum (FNV-1a over 64-bit words). */
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

/* ---------------------------------------------------------- the streams */

static uint64_t key_of(uint64_t seq) { return seq * 0x9e3779b97f4a7c15ull; }

#define MIXED_MAX_BYTES 200u

static uint32_t mixed_bytes(uint64_t seq) {
  return 1 + (uint32_t)(mix64(seq >> 3) % MIXED_MAX_BYTES);
}

static unsigned mixed_flags(uint64_t seq) {
  return (seq >> 3) & 1 ? SL_ENTRY_HAS_TS : 0;
}

static int64_t mixed_timestamp(uint64_t seq) { return (int64_t)seq * 7 - 1000; }

/* Payload of record seq: words mix64(seq) + j * step, the last one cut. */
static void fill_payload(uint8_t *dst, uint32_t bytes, uint64_t seq) {
  uint64_t word = mix64(seq);
  uint32_t at = 0;
  for (; at + 8 <= bytes; at += 8, word += 0x0101010101010101ull)
    memcpy(dst + at, &word, 8);
  if (at < bytes)
    memcpy(dst + at, &word, bytes - at);
}

static bool payload_ok(const uint8_t *src, uint32_t bytes, uint64_t seq) {
  uint8_t expected[MIXED_MAX_BYTES];
  if (bytes > sizeof expected)
    return false;
  fill_payload(expected, bytes, seq);
  return memcmp(src, expected, bytes) == 0;
}

#include "ring_wait.h"

/* ---------------------------------------------------------------- pairs */

typedef struct stress_pair {
  sl_ring ring;
  alignas(SL_CACHE_LINE) sl_parker consumer_parker;
  alignas(SL_CACHE_LINE) sl_parker producer_parker;
  uint64_t records;
  unsigned spin_limit;
  bool mixed;
  alignas(SL_CACHE_LINE) uint64_t producer_checksum;
  _Atomic uint64_t produced;
  _Atomic bool producer_done;
  alignas(SL_CACHE_LINE) uint64_t consumer_checksum;
  uint64_t consumed_records, errors, watermarks, barriers, end_value;
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

static uint64_t produce_mixed(stress_pair *p, uint64_t seq, uint64_t sum,
                              uint64_t *barriers) {
  sl_ring *r = &p->ring;
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
    control_waiting(r, &p->producer_parker, p->spin_limit, SL_ENTRY_WATERMARK,
                    seq + 1);
    sum = checksum_step(sum, seq + 1);
  }
  if ((seq + 1) % BARRIER_EVERY == 0) {
    control_waiting(r, &p->producer_parker, p->spin_limit, SL_ENTRY_BARRIER,
                    ++*barriers);
    sum = checksum_step(sum, *barriers);
  }
  return sum;
}

static void *producer_main(void *arg) {
  stress_pair *p = arg;
  sl_ring *r = &p->ring;
  uint64_t sum = 0xcbf29ce484222325ull, barriers = 0;
  for (uint64_t seq = 0; seq < p->records; seq++) {
    if (p->mixed) {
      sum = produce_mixed(p, seq, sum, &barriers);
    } else {
      uint8_t *slot =
          append_waiting(r, &p->producer_parker, p->spin_limit, 16, 0);
      uint64_t key = key_of(seq);
      memcpy(slot, &key, 8);
      memcpy(slot + 8, &seq, 8);
      sum = checksum_step(checksum_step(sum, key), seq);
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
  uint32_t stride = sl_record_stride(e->record_bytes, e->flags);
  for (uint32_t k = 0; k < e->count; k++, record += stride, seq++) {
    if (!p->mixed) {
      uint64_t key, value;
      memcpy(&key, record, 8);
      memcpy(&value, record + 8, 8);
      if (e->record_bytes != 16 || e->flags != 0)
        pair_error(p, "wrong record size or flags", seq);
      if (value != seq) {
        pair_error(p, "sequence gap", seq);
        seq = value;
      }
      if (key != key_of(value))
        pair_error(p, "key does not match value", seq);
      *sum = checksum_step(checksum_step(*sum, key), value);
      continue;
    }
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

static void *consumer_main(void *arg) {
  stress_pair *p = arg;
  sl_ring *r = &p->ring;
  uint64_t sum = 0xcbf29ce484222325ull, seq = 0;
  for (uint64_t entries = 1; !p->end_seen; entries++) {
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
      break; /* corrupt stream: the watchdog reports it */
    }
    sl_ring_advance_consumer(r, sl_entry_bytes(e));
    atomic_store_explicit(&p->consumed, seq, memory_order_relaxed);
    if (entries % RELEASE_EVERY_ENTRIES == 0)
      sl_ring_release_consumer(r, false);
  }
  sl_ring_release_consumer(r, true);
  p->consumed_records = seq;
  p->consumer_checksum = sum;
  atomic_store_explicit(&p->consumer_done, true, memory_order_release);
  return 0;
}

/* What is wrong with a finished pair, or NULL if nothing is. */
static const char *pair_problem(stress_pair *p) {
  if (p->errors)
    return p->first_error;
  if (!p->end_seen || p->end_value != p->records)
    return "END missing or wrong";
  if (p->consumed_records != p->records)
    return "record count differs";
  if (p->consumer_checksum != p->producer_checksum)
    return "checksum differs";
  if (p->mixed && (p->watermarks != p->records / WATERMARK_EVERY ||
                   p->barriers != p->records / BARRIER_EVERY))
    return "control entry count differs";
  if (atomic_load(&p->ring.head) != atomic_load(&p->ring.tail))
    return "ring not drained";
  if (!sl_ring_check(&p->ring))
    return "sl_ring_check failed";
  return 0;
}

/* Run n pairs, two threads each; false (with a message) if they do not all
 * finish within DEADLINE_S or a consumer found a corrupt stream. */
static bool run_pairs(stress_pair *pairs, size_t n, const char *part) {
  pthread_t threads[2 * 8];
  if (n > 8)
    return false;
  double start = now_s();
  for (size_t i = 0; i < n; i++) {
    if (pthread_create(&threads[2 * i], 0, consumer_main, &pairs[i]) != 0 ||
        pthread_create(&threads[2 * i + 1], 0, producer_main, &pairs[i]) != 0) {
      fprintf(stderr, "%s: pthread_create failed\n", part);
      return false;
    }
  }
  bool all_done = false, corrupt = false;
  while (!all_done && !corrupt && now_s() - start < DEADLINE_S) {
    sleep_ms(10);
    all_done = true;
    for (size_t i = 0; i < n; i++) {
      bool consumer_done =
          atomic_load_explicit(&pairs[i].consumer_done, memory_order_acquire);
      all_done =
          all_done && consumer_done &&
          atomic_load_explicit(&pairs[i].producer_done, memory_order_acquire);
      corrupt = corrupt || (consumer_done && !pairs[i].end_seen);
    }
  }
  if (!all_done) {
    fprintf(stderr, "%s: %s after %.1f s\n", part,
            corrupt ? "corrupt stream" : "no progress (lost wake-up?)",
            now_s() - start);
    for (size_t i = 0; i < n; i++) {
      stress_pair *p = &pairs[i];
      bool consumer_done = atomic_load(&p->consumer_done);
      fprintf(stderr,
              "  pair %zu: produced %" PRIu64 " consumed %" PRIu64
              " of %" PRIu64 ", consumer %s, producer %s%s%s\n",
              i, atomic_load(&p->produced), atomic_load(&p->consumed),
              p->records,
              consumer_done                            ? "done"
              : atomic_load(&p->consumer_parker.state) ? "PARKED"
                                                       : "running",
              atomic_load(&p->producer_done)           ? "done"
              : atomic_load(&p->producer_parker.state) ? "PARKED"
                                                       : "running",
              consumer_done ? ": " : "", consumer_done ? p->first_error : "");
    }
    return false; /* threads are left running; main exits */
  }
  for (size_t i = 0; i < 2 * n; i++)
    pthread_join(threads[i], 0);
  double seconds = now_s() - start;
  bool ok = true;
  uint64_t records = 0, sleeps = 0;
  for (size_t i = 0; i < n; i++) {
    stress_pair *p = &pairs[i];
    records += p->records;
    sleeps += p->consumer_parker.sleeps + p->producer_parker.sleeps;
    const char *problem = pair_problem(p);
    if (problem) {
      fprintf(stderr,
              "%s: pair %zu: %s (%" PRIu64 " errors; consumed %" PRIu64
              " of %" PRIu64 "; checksums %016" PRIx64 " %016" PRIx64 ")\n",
              part, i, problem, p->errors, p->consumed_records, p->records,
              p->consumer_checksum, p->producer_checksum);
      ok = false;
    }
  }
  printf("%s: %zu pair(s), %" PRIu64 " records in %.2f s, %" PRIu64
         " sleeps: %s\n",
         part, n, records, seconds, sleeps, ok ? "ok" : "FAILED");
  return ok;
}

/* n pairs on rings of ring_bytes; exits the process if that fails. */
static stress_pair *pairs_create(size_t n, uint64_t ring_bytes) {
  stress_pair *pairs = aligned_alloc(alignof(stress_pair), n * sizeof *pairs);
  if (!pairs) {
    fprintf(stderr, "tsan_ring_stress: out of memory\n");
    exit(1);
  }
  memset(pairs, 0, n * sizeof *pairs);
  for (size_t i = 0; i < n; i++) {
    sl_parker_init(&pairs[i].consumer_parker);
    sl_parker_init(&pairs[i].producer_parker);
    if (sl_ring_init(&pairs[i].ring, ring_bytes, &pairs[i].consumer_parker,
                     &pairs[i].producer_parker, 0) != 0) {
      fprintf(stderr, "tsan_ring_stress: sl_ring_init failed\n");
      exit(1);
    }
  }
  return pairs;
}

static void pairs_destroy(stress_pair *pairs, size_t n) {
  for (size_t i = 0; i < n; i++)
    sl_ring_destroy(&pairs[i].ring);
  free(pairs);
}

static uint64_t scaled(uint64_t count, uint64_t scale) {
  return count / scale > 0 ? count / scale : 1;
}

/* Run one part; on failure the threads may still be running, so the
 * process ends at once instead of freeing what they use. */
static void run_part_or_exit(stress_pair *pairs, size_t n, const char *part) {
  if (!run_pairs(pairs, n, part)) {
    printf("tsan_ring_stress: FAILED\n");
    fflush(stdout);
    exit(1);
  }
}

int main(void) {
  uint64_t scale = 1;
  const char *text = getenv("SLUICE_TEST_SCALE");
  if (text && strtoull(text, 0, 10) >= 1)
    scale = strtoull(text, 0, 10);
  const uint64_t fixed_records = scaled(5000000, scale);
  const uint64_t mixed_records = scaled(1000000, scale);
  const uint64_t storm_records = scaled(1000000, scale);

  stress_pair *one = pairs_create(1, 64u << 10);
  one->records = fixed_records;
  one->spin_limit = 100;
  run_part_or_exit(one, 1, "fixed 16-byte records");
  pairs_destroy(one, 1);

  one = pairs_create(1, 64u << 10);
  one->records = mixed_records;
  one->mixed = true;
  one->spin_limit = 100;
  run_part_or_exit(one, 1, "mixed records and control entries");
  pairs_destroy(one, 1);

  stress_pair *storm = pairs_create(6, 4096);
  for (size_t i = 0; i < 6; i++) {
    storm[i].mixed = i % 2 == 1;
    storm[i].records = storm[i].mixed ? storm_records / 2 : storm_records;
    storm[i].spin_limit = (unsigned)(i / 2);
  }
  run_part_or_exit(storm, 6, "6 parking pairs on 4 KiB rings");
  uint64_t storm_sleeps = 0;
  for (size_t i = 0; i < 6; i++)
    storm_sleeps +=
        storm[i].consumer_parker.sleeps + storm[i].producer_parker.sleeps;
  pairs_destroy(storm, 6);
  if (storm_sleeps == 0) {
    fprintf(stderr, "parking pairs never slept: parking was not exercised\n");
    printf("tsan_ring_stress: FAILED\n");
    return 1;
  }
  printf("tsan_ring_stress: all pairs matched\n");
  return 0;
}
