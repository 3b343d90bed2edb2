/* store_bench.c — what the log-structured store costs (storage/store.h).
 *
 *   store_bench [--rounds N] [--dir DIR]
 *
 * The state is the engine's shape: one operator, 1M keys of 11 bytes (the
 * 8-byte big-endian record key, a 2-byte state id, a kind byte), 8-byte
 * values, key groups 0..127 by a hash of the record key.  It is written
 * once and compacted into the base.  Then each round:
 *   a. 10 checkpoints, each a transaction putting 100K distinct keys spread
 *      over the state (a stride coprime with 1M), in the store's key
 *      order, committed with fsync (no_sync = 0): begin to durable, and
 *      the puts alone;
 *   b. after the third (a 300K-entry log): sl_store_read_state of the whole
 *      1M-key merged view, 3 times; also with an empty log (just after the
 *      compaction) and with the 1M-entry log (before it);
 *   c. sl_store_compact(0) of the 1M base and the 1M-entry log: the
 *      compaction rule (log >= base) never compacts a 300K log into a 1M
 *      base, so this is the compaction the rule runs for a 1M-key state.
 * Every figure is the median (min, max) in ms over the rounds' samples.
 * The directory (default: a new one under /tmp) is removed at the end.
 */
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "sluice.h"
#include "store.h"

#define STATE_KEYS 1000000u
#define CHANGED_KEYS 100000u
#define CHECKPOINTS_PER_ROUND 10u
#define READ_AT_CHECKPOINT 3u /* a 300K-entry log */
#define READS_PER_ROUND 3u
#define GROUPS 128u
#define KEY_BYTES 11u
#define VALUE_BYTES 8u
#define OP 1u
#define STRIDE 7919u /* prime, coprime with STATE_KEYS */
#define MAX_ROUNDS 20u
#define MAP_BYTES (4ull << 30) /* sparse: no growth in the measurements */

_Static_assert(MAX_ROUNDS * CHECKPOINTS_PER_ROUND <= BENCH_MAX_REPEAT,
               "the samples fit bench_stats_of");

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static uint16_t group_of(uint64_t record_key) {
  return (uint16_t)(mix64(record_key) % GROUPS);
}

/* The store's order of one operator's keys: key group, then the key bytes
 * (the big-endian record key first). */
static int compare_keys(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  uint16_t gx = group_of(x), gy = group_of(y);
  if (gx != gy)
    return gx < gy ? -1 : 1;
  return (x > y) - (x < y);
}

static void make_key(uint64_t record_key, uint8_t *key) {
  for (int i = 7; i >= 0; i--, record_key >>= 8)
    key[i] = (uint8_t)record_key;
  key[8] = 0; /* state id 0 */
  key[9] = 0;
  key[10] = 1; /* a value state */
}

/* One transaction putting keys[0..count) (sorted) with values of
 * version, committed as checkpoint id.  Returns its ms, or -1; *puts_ms
 * (may be NULL): the part before sl_store_commit. */
static double write_checkpoint(sl_store *store, const uint64_t *keys,
                               size_t count, uint64_t version, uint64_t id,
                               double *puts_ms) {
  uint64_t start_ns = bench_now_ns();
  sl_store_txn *txn;
  int rc = sl_store_begin(store, &txn);
  for (size_t i = 0; i < count && rc == 0; i++) {
    uint8_t key[KEY_BYTES];
    uint64_t value = version << 32 | keys[i];
    make_key(keys[i], key);
    rc = sl_store_put_state(txn, OP, group_of(keys[i]), key, KEY_BYTES,
                            &value, VALUE_BYTES);
  }
  if (puts_ms)
    *puts_ms = (double)(bench_now_ns() - start_ns) / 1e6;
  rc = rc == 0 ? sl_store_commit(txn, id, "bench", 5)
               : (sl_store_abort(txn), rc);
  if (rc != 0) {
    fprintf(stderr, "checkpoint %" PRIu64 ": %s: %s\n", id, sl_strerror(rc),
            sl_store_error(store));
    return -1;
  }
  return (double)(bench_now_ns() - start_ns) / 1e6;
}

typedef struct tally {
  uint64_t entries;
  uint64_t sum; /* of the values, so the reads are not optimised away */
} tally;

static int count_entry(void *arg, uint16_t key_group, const void *key,
                       uint32_t key_bytes, const void *value,
                       uint32_t value_bytes) {
  (void)key_group, (void)key, (void)key_bytes;
  tally *t = arg;
  uint64_t v = 0;
  memcpy(&v, value, value_bytes < 8 ? value_bytes : 8);
  t->sum += v;
  t->entries++;
  return 0;
}

/* sl_store_read_state of the whole state; its ms, or -1. */
static double read_all(sl_store *store) {
  tally t = {0, 0};
  uint64_t start_ns = bench_now_ns();
  int rc = sl_store_read_state(store, OP, 0, GROUPS - 1, count_entry, &t);
  double ms = (double)(bench_now_ns() - start_ns) / 1e6;
  if (rc != 0 || t.entries != STATE_KEYS) {
    fprintf(stderr, "read: %s (%" PRIu64 " entries): %s\n", sl_strerror(rc),
            t.entries, sl_store_error(store));
    return -1;
  }
  return ms;
}

/* sl_store_compact(0); its ms, or -1 (also if it did nothing). */
static double compact(sl_store *store, sl_store_compaction *stats) {
  uint64_t start_ns = bench_now_ns();
  int rc = sl_store_compact(store, 0, stats);
  double ms = (double)(bench_now_ns() - start_ns) / 1e6;
  if (rc != 0 || stats->entries_written != STATE_KEYS) {
    fprintf(stderr, "compact: %s (%" PRIu64 " written): %s\n",
            sl_strerror(rc), stats->entries_written, sl_store_error(store));
    return -1;
  }
  return ms;
}

typedef struct samples {
  double a[MAX_ROUNDS * CHECKPOINTS_PER_ROUND];
  double a_puts[MAX_ROUNDS * CHECKPOINTS_PER_ROUND];
  double b[MAX_ROUNDS * READS_PER_ROUND];
  double b_empty[MAX_ROUNDS], b_full[MAX_ROUNDS], c[MAX_ROUNDS];
  size_t a_count, b_count, rounds;
} samples;

/* The 100K keys changed by checkpoint n, sorted. */
static void changed_keys(uint64_t n, uint64_t *keys) {
  for (uint64_t j = 0; j < CHANGED_KEYS; j++)
    keys[j] = (n * CHANGED_KEYS + j) * STRIDE % STATE_KEYS;
  qsort(keys, CHANGED_KEYS, sizeof *keys, compare_keys);
}

/* One round (see the top); *id is the latest checkpoint id. */
static int round_run(sl_store *store, uint64_t *keys, uint64_t *id,
                     samples *out) {
  double ms = read_all(store);
  if (ms < 0)
    return -1;
  out->b_empty[out->rounds] = ms;
  for (uint32_t k = 1; k <= CHECKPOINTS_PER_ROUND; k++) {
    changed_keys(*id, keys);
    ms = write_checkpoint(store, keys, CHANGED_KEYS, *id + 1, *id + 1,
                          &out->a_puts[out->a_count]);
    if (ms < 0)
      return -1;
    ++*id;
    out->a[out->a_count++] = ms;
    for (uint32_t r = 0; k == READ_AT_CHECKPOINT && r < READS_PER_ROUND;
         r++) {
      if ((ms = read_all(store)) < 0)
        return -1;
      out->b[out->b_count++] = ms;
    }
  }
  if ((ms = read_all(store)) < 0)
    return -1;
  out->b_full[out->rounds] = ms;
  sl_store_compaction stats;
  if ((ms = compact(store, &stats)) < 0)
    return -1;
  out->c[out->rounds++] = ms;
  printf("  round %zu: compaction read %" PRIu64 " log + %" PRIu64
         " base entries, wrote %" PRIu64 " (%.1f MB) in %.1f ms\n",
         out->rounds, stats.log_entries_read, stats.base_entries_read,
         stats.entries_written, (double)stats.bytes_written / 1e6,
         (double)stats.duration_us / 1e3);
  return 0;
}

static void print_stats(const char *what, const double *values,
                        size_t count) {
  bench_stats s = bench_stats_of(values, count);
  printf("%-58s %8.1f %8.1f %8.1f  (%zu)\n", what, s.median, s.min, s.max,
         count);
}

static int remove_one(const char *path, const struct stat *st, int flag,
                      struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

/* Writes the 1M-key state as checkpoint 1 and compacts it into the base. */
static int build_base(sl_store *store, uint64_t *keys) {
  for (uint64_t k = 0; k < STATE_KEYS; k++)
    keys[k] = k;
  qsort(keys, STATE_KEYS, sizeof *keys, compare_keys);
  double ms = write_checkpoint(store, keys, STATE_KEYS, 0, 1, 0);
  if (ms < 0)
    return -1;
  sl_store_compaction stats;
  double compact_ms = compact(store, &stats);
  if (compact_ms < 0)
    return -1;
  printf("base: 1M puts in one checkpoint %.1f ms, compaction %.1f ms\n", ms,
         compact_ms);
  return 0;
}

static int run(const char *dir, uint64_t rounds) {
  sl_store_options options = {.graph_fingerprint = "store_bench",
                              .initial_map_bytes = MAP_BYTES};
  sl_store *store;
  char err[1024];
  int rc = sl_store_open(dir, &options, &store, err, sizeof err);
  if (rc != 0) {
    fprintf(stderr, "open: %s: %s\n", sl_strerror(rc), err);
    return 1;
  }
  uint64_t *keys = malloc(STATE_KEYS * sizeof *keys);
  static samples out;
  uint64_t id = 1;
  int failed = !keys || build_base(store, keys) != 0;
  for (uint64_t r = 0; r < rounds && !failed; r++)
    failed = round_run(store, keys, &id, &out) != 0;
  sl_store_close(store);
  free(keys);
  if (failed)
    return 1;
  printf("\n%-58s %8s %8s %8s\n", "ms", "median", "min", "max");
  print_stats("a. checkpoint of 100K sorted puts, fsync", out.a, out.a_count);
  print_stats("   of which the puts", out.a_puts, out.a_count);
  print_stats("b. read 1M merged, 300K log", out.b, out.b_count);
  print_stats("   read 1M merged, empty log", out.b_empty, out.rounds);
  print_stats("   read 1M merged, 1M log", out.b_full, out.rounds);
  print_stats("c. compaction, 1M base + 1M log", out.c, out.rounds);
  return 0;
}

int main(int argc, char **argv) {
  uint64_t rounds = 1;
  const char *dir = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc &&
        bench_parse_count(argv[i + 1], 1000, &rounds) == 0 && rounds >= 1 &&
        rounds <= MAX_ROUNDS) {
      i++;
    } else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc) {
      dir = argv[++i];
    } else {
      fprintf(stderr, "usage: store_bench [--rounds 1..%u] [--dir DIR]\n",
              MAX_ROUNDS);
      return 2;
    }
  }
  char made[64] = "/tmp/sluice-store-bench-XXXXXX";
  if (!dir && !(dir = mkdtemp(made))) {
    fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
    return 1;
  }
  int status = run(dir, rounds);
  nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
  return status;
}
