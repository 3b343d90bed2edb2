/* histogram.h — a log-linear histogram of uint64 values (nanoseconds in
 * bench/latency_bench.c), after HdrHistogram: every value is counted, none
 * is sampled, and recording is O(1) with no allocation.
 *
 * LAYOUT
 *
 *   values 0 .. 2^S - 1          one bucket per value (exact)
 *   [2^e, 2^(e+1)), e = S .. 39  2^S equal buckets of width 2^(e-S)
 *   values >= 2^40 (~18 min)     the last bucket; counted in `overflow`
 *
 * with S = HIST_SUB_BITS = 7: 128 + 33 * 128 = 4352 counts (34 KiB).
 *
 * ERROR BOUND
 *
 * A value v >= 2^S lands in a bucket of width 2^(e-S) <= v / 2^S, so every
 * value of its bucket is within v / 128 of it: a relative error below
 * 1 / 2^S = 0.79%.  Values below 2^(S+1) = 256 are exact (width 1).  A
 * percentile is reported as its bucket's highest equivalent value (the
 * largest value the bucket holds), so it may read up to 0.79% high, never
 * low, and it is capped at the exact maximum, which is kept on the side
 * (as is the exact minimum).  Values at or above 2^40 read as the exact
 * maximum.
 *
 * USE
 *
 *   hist h;  hist_reset(&h);  hist_record(&h, v) ...;
 *   hist_value_at_percentile(&h, 99.0);  hist_merge(&total, &h);
 *   for (hist_iter it = {0}; hist_iter_next(&h, &it);) it.value, it.cumulative
 *
 * A histogram is plain memory owned by one thread at a time; nothing here
 * is atomic.  Everything is static inline (see bench_util.h for why).
 */
#ifndef SL_BENCH_HISTOGRAM_H
#define SL_BENCH_HISTOGRAM_H

#include <assert.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define HIST_SUB_BITS 7u
#define HIST_SUB_COUNT (1u << HIST_SUB_BITS) /* buckets per power of two */
#define HIST_TOP_BITS 40u                    /* values below 2^40 fit */
#define HIST_BUCKETS (HIST_SUB_COUNT + (HIST_TOP_BITS - HIST_SUB_BITS) * \
                      HIST_SUB_COUNT)
_Static_assert(HIST_SUB_BITS >= 1 && HIST_SUB_BITS < HIST_TOP_BITS,
               "at least one power-of-two range above the exact ones");
_Static_assert(HIST_TOP_BITS < 64, "clzll needs a nonzero 64-bit value");
_Static_assert(HIST_BUCKETS == 4352, "the size the header comment gives");

typedef struct hist {
  uint64_t total;    /* values recorded */
  uint64_t overflow; /* of them, >= 2^HIST_TOP_BITS (in the last bucket) */
  uint64_t min;      /* exact; UINT64_MAX while empty */
  uint64_t max;      /* exact; 0 while empty */
  uint64_t counts[HIST_BUCKETS];
} hist;

/* Empty the histogram. */
static inline void hist_reset(hist *h) {
  memset(h, 0, sizeof *h);
  h->min = UINT64_MAX;
}

/* The bucket of value (which must be below 2^HIST_TOP_BITS). */
static inline uint32_t hist_index(uint64_t value) {
  if (value < HIST_SUB_COUNT)
    return (uint32_t)value;
  uint32_t exponent = 63u - (uint32_t)__builtin_clzll(value); /* >= S */
  uint32_t shift = exponent - HIST_SUB_BITS;
  uint32_t sub = (uint32_t)(value >> shift) - HIST_SUB_COUNT; /* 0..2^S-1 */
  uint32_t index = HIST_SUB_COUNT + shift * HIST_SUB_COUNT + sub;
  assert(sub < HIST_SUB_COUNT);
  assert(index < HIST_BUCKETS);
  return index;
}

/* The largest value that falls in bucket index. */
static inline uint64_t hist_highest_equivalent(uint32_t index) {
  assert(index < HIST_BUCKETS);
  if (index < HIST_SUB_COUNT)
    return index;
  uint32_t shift = (index - HIST_SUB_COUNT) / HIST_SUB_COUNT;
  uint64_t sub = (index - HIST_SUB_COUNT) % HIST_SUB_COUNT;
  uint64_t lowest = (HIST_SUB_COUNT + sub) << shift;
  return lowest + ((uint64_t)1 << shift) - 1;
}

/* What bucket index reports: its highest equivalent value capped at the
 * exact maximum; the last bucket (which also holds the overflow) reports
 * the maximum. */
static inline uint64_t hist_bucket_value(const hist *h, uint32_t index) {
  if (index == HIST_BUCKETS - 1)
    return h->max;
  uint64_t value = hist_highest_equivalent(index);
  return value < h->max ? value : h->max;
}

/* Count one value.  O(1): one clz, a shift and an add. */
static inline void hist_record(hist *h, uint64_t value) {
  uint32_t index;
  if (value >> HIST_TOP_BITS) {
    index = HIST_BUCKETS - 1;
    h->overflow++;
  } else {
    index = hist_index(value);
  }
  h->counts[index]++;
  h->total++;
  if (value < h->min)
    h->min = value;
  if (value > h->max)
    h->max = value;
}

/* Add every count of src to dst (src unchanged). */
static inline void hist_merge(hist *dst, const hist *src) {
  for (uint32_t i = 0; i < HIST_BUCKETS; i++)
    dst->counts[i] += src->counts[i];
  dst->total += src->total;
  dst->overflow += src->overflow;
  if (src->min < dst->min)
    dst->min = src->min;
  if (src->max > dst->max)
    dst->max = src->max;
  assert(dst->total >= src->total);
}

static inline uint64_t hist_count(const hist *h) { return h->total; }
/* Exact extremes; 0 for an empty histogram. */
static inline uint64_t hist_min(const hist *h) {
  return h->total ? h->min : 0;
}
static inline uint64_t hist_max(const hist *h) { return h->max; }

/* The nearest-rank percentile (0 .. 100): the highest equivalent value of
 * the bucket that holds the ceil(percentile / 100 * count)-th smallest
 * value (the first, for 0), capped at the exact maximum.  0 when empty.
 * O(HIST_BUCKETS). */
static inline uint64_t hist_value_at_percentile(const hist *h,
                                                double percentile) {
  if (h->total == 0)
    return 0;
  double wanted = percentile / 100.0 * (double)h->total;
  uint64_t rank = (uint64_t)wanted;
  if ((double)rank < wanted)
    rank++;
  if (rank < 1)
    rank = 1;
  if (rank > h->total)
    rank = h->total;
  uint64_t seen = 0;
  for (uint32_t i = 0; i < HIST_BUCKETS; i++) {
    seen += h->counts[i];
    if (seen >= rank)
      return hist_bucket_value(h, i);
  }
  assert(0 && "the counts add up to total");
  return h->max;
}

/* Iteration over the non-empty buckets in ascending order, for a CDF.
 * Start with a zeroed hist_iter; each true return describes one bucket:
 * value (highest equivalent, capped at the maximum), count, and cumulative
 * (values at or below it).  At most HIST_BUCKETS steps. */
typedef struct hist_iter {
  uint32_t next_index;
  uint64_t value;
  uint64_t count;
  uint64_t cumulative;
} hist_iter;

static inline bool hist_iter_next(const hist *h, hist_iter *it) {
  for (; it->next_index < HIST_BUCKETS; it->next_index++) {
    uint32_t i = it->next_index;
    if (h->counts[i] == 0)
      continue;
    it->value = hist_bucket_value(h, i);
    it->count = h->counts[i];
    it->cumulative += h->counts[i];
    it->next_index = i + 1;
    assert(it->cumulative <= h->total);
    return true;
  }
  return false;
}

#endif /* SL_BENCH_HISTOGRAM_H */
