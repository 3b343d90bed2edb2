/* cow_load_bench.c — what restoring keyed state into the copy-on-write map
 * costs (storage/cow_map.h): one sl_cow_map_load() per entry against the
 * bulk load (sl_cow_map_load_add() per entry, then sl_cow_map_load_finish()).
 *
 *   cow_load_bench [--quick] [--repeat R] [--json PATH]
 *
 * Entries are 20-byte keys with 8-byte values, the shape of the count
 * operator's state.  They come from one flat buffer in the order a restore
 * reads the store: by key group (128 of them, from a hash of the key, as the
 * engine's default max_parallelism), then by key.  Four paths:
 *
 *   per-entry     sl_cow_map_load() for each entry (checks every key)
 *   bulk          the bulk load given the key groups: the input is in
 *                 (group, key) order, so no key is probed for a duplicate
 *   bulk, probed  the bulk load given group 0 for all: the order breaks at
 *                 the second group, so nearly every key is probed
 *   bulk, unstaged  bulk with staging off (cow_map.c note 18): each entry
 *                 linked SL_COW_LOAD_WINDOW adds after it, a random bucket
 *                 each; the other bulk paths stage large loads and link
 *                 them partition by partition
 *
 * Each run does what a restore does: create the map, reserve the table for
 * 1.25x the entries (the coordinator's margin), load every entry.  A cold
 * run is a fresh process (this program re-executed), so the map's memory
 * is new to it, page faults included, as in a real restore; a warm run
 * reuses memory the allocator kept from the previous run.  For 1M and 10M
 * entries (quick: 100K and 1M), R cold then R warm runs of each path,
 * interleaved, rotating which path goes first, so drift on a noisy machine
 * hits all alike; medians, and the ratio per-entry / bulk.  Each run is
 * timed twice: wall clock, and the CPU time of the loading thread, which
 * other processes on a busy machine do not stretch (they still compete for
 * caches and memory).  The destroy after a warm run is timed apart.
 * Target: the bulk load well under 50 ms per 1M entries.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "cow_map.h"

/* Huge pages for the heap, as checkpoint_bench: the restored state is tens
 * of megabytes of fresh memory, and page faults are costly on this VM.  The
 * library leaves allocator settings to the program that embeds it; without
 * jemalloc this is an unused variable. */
const char *malloc_conf = "thp:always,metadata_thp:auto";

#define MAX_REPEAT 50
#define KEY_BYTES 20u
#define VALUE_BYTES 8u
#define RECORD_BYTES (KEY_BYTES + VALUE_BYTES)
#define KEY_GROUPS 128u

enum { PATH_PER_ENTRY, PATH_BULK, PATH_BULK_PROBED, PATH_BULK_UNSTAGED, PATHS };
static const char *const path_names[PATHS] = {"per-entry", "bulk",
                                              "bulk, probed", "bulk, unstaged"};
static const char *const path_json[PATHS] = {"per_entry", "bulk",
                                             "bulk_probed", "bulk_unstaged"};

/* The input, as a restore reads it: records in (group, key) order. */
typedef struct feed {
  uint64_t entries;
  uint8_t *records;  /* entries * RECORD_BYTES: key then value */
  uint16_t *groups;  /* the key group of each record */
} feed;

/* SplitMix64 finaliser. */
static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Record of id i: key = i big-endian (so ascending ids are ascending keys)
 * then 12 bytes derived from i; value = i. */
static void record_make(uint64_t i, uint8_t *record) {
  for (int b = 0; b < 8; b++)
    record[b] = (uint8_t)(i >> (56 - 8 * b));
  uint64_t filler[2] = {mix64(i), mix64(~i)};
  memcpy(record + 8, filler, KEY_BYTES - 8);
  memcpy(record + KEY_BYTES, &i, VALUE_BYTES);
}

static uint16_t group_of(uint64_t i) {
  return (uint16_t)((mix64(i ^ 0x5bd1e995u) >> 32) * KEY_GROUPS >> 32);
}

/* Build the feed: ids counted into their groups, then laid out group by
 * group, ascending within each.  Returns 0 or ENOMEM. */
static int feed_make(feed *f, uint64_t entries) {
  uint64_t starts[KEY_GROUPS + 1] = {0};
  f->entries = entries;
  f->records = malloc((size_t)(entries * RECORD_BYTES));
  f->groups = malloc((size_t)entries * sizeof *f->groups);
  if (!f->records || !f->groups) {
    free(f->records);
    free(f->groups);
    return ENOMEM;
  }
  for (uint64_t i = 0; i < entries; i++)
    starts[group_of(i) + 1]++;
  for (uint32_t g = 0; g < KEY_GROUPS; g++)
    starts[g + 1] += starts[g];
  for (uint64_t i = 0; i < entries; i++) {
    uint16_t g = group_of(i);
    uint64_t at = starts[g]++;
    record_make(i, f->records + at * RECORD_BYTES);
    f->groups[at] = g;
  }
  return 0;
}

/* CPU time of the calling thread, in nanoseconds. */
static uint64_t cpu_now_ns(void) {
  struct timespec now;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
}

/* What one run measured (ms). */
typedef struct timing {
  double wall_ms;
  double cpu_ms;
} timing;

/* Load the feed into a fresh map by one path.  Returns the map or NULL
 * (message printed). */
static sl_cow_map *load(const feed *f, int path) {
  sl_cow_map *map;
  uint64_t n = f->entries;
  if (sl_cow_map_create(&map) != 0 || sl_cow_map_reserve(map, n + n / 4) != 0) {
    fprintf(stderr, "cow_load_bench: out of memory\n");
    sl_cow_map_destroy(map);
    return 0;
  }
  int rc = 0;
  const uint8_t *r = f->records;
  if (path == PATH_PER_ENTRY) {
    for (uint64_t i = 0; rc == 0 && i < n; i++, r += RECORD_BYTES)
      rc = sl_cow_map_load(map, r, KEY_BYTES, r + KEY_BYTES, VALUE_BYTES);
  } else {
    if (path == PATH_BULK_UNSTAGED) /* the ring alone (cow_map.c note 10) */
      sl_cow_map_set_load_stage(map, UINT64_MAX, SL_COW_STAGE_REGION_BUCKETS,
                                SL_COW_STAGE_BUDGET_BYTES);
    bool groups = path != PATH_BULK_PROBED;
    for (uint64_t i = 0; rc == 0 && i < n; i++, r += RECORD_BYTES)
      rc = sl_cow_map_load_add(map, groups ? f->groups[i] : 0, r, KEY_BYTES,
                               r + KEY_BYTES, VALUE_BYTES);
    int finished = sl_cow_map_load_finish(map); /* also after an error */
    rc = rc ? rc : finished;
  }
  if (rc) {
    fprintf(stderr, "cow_load_bench: %s: error %d\n", path_names[path], rc);
    sl_cow_map_destroy(map);
    return 0;
  }
  return map;
}

/* Outside the timing: every entry counted, a sample of them read back. */
static bool verify(sl_cow_map *map, const feed *f) {
  if (sl_cow_map_count(map) != f->entries)
    return false;
  for (uint64_t i = 0; i < f->entries; i += 1 + f->entries / 1000) {
    const uint8_t *r = f->records + i * RECORD_BYTES;
    uint32_t bytes = 0;
    const void *v = sl_cow_map_get(map, r, KEY_BYTES, &bytes);
    if (!v || bytes != VALUE_BYTES || memcmp(v, r + KEY_BYTES, VALUE_BYTES))
      return false;
  }
  return true;
}

/* One timed load into *t; *destroy_ms, *memory_bytes and *staged (the
 * entries the load staged: cow_map.c note 18) as well if not NULL.
 * Returns 0, or 1 on failure (message printed). */
static int run_once(const feed *f, int path, timing *t, double *destroy_ms,
                    uint64_t *memory_bytes, uint64_t *staged) {
  uint64_t t0 = bench_now_ns(), c0 = cpu_now_ns();
  sl_cow_map *map = load(f, path);
  uint64_t t1 = bench_now_ns(), c1 = cpu_now_ns();
  if (!map)
    return 1;
  bool right = verify(map, f);
  if (memory_bytes)
    *memory_bytes = sl_cow_map_memory_bytes(map);
  if (staged)
    *staged = sl_cow_map_load_staged(map);
  uint64_t t2 = bench_now_ns();
  sl_cow_map_destroy(map);
  if (destroy_ms)
    *destroy_ms = (double)(bench_now_ns() - t2) / 1e6;
  if (!right) {
    fprintf(stderr, "cow_load_bench: %s: wrong contents\n", path_names[path]);
    return 1;
  }
  t->wall_ms = (double)(t1 - t0) / 1e6;
  t->cpu_ms = (double)(c1 - c0) / 1e6;
  return 0;
}

/* The child of a cold run: build the feed, load it once, print the ms. */
static int cold_child(int path, uint64_t entries) {
  feed f;
  timing t;
  if (path < 0 || path >= PATHS || feed_make(&f, entries) != 0)
    return 1;
  int rc = run_once(&f, path, &t, 0, 0, 0);
  free(f.records);
  free(f.groups);
  if (rc == 0)
    printf("%.6f %.6f\n", t.wall_ms, t.cpu_ms);
  return rc;
}

/* This program's file, for cold runs (read from /proc/self/exe by main:
 * in the shell popen starts, that name would be the shell). */
static char self_path[4096];

/* A cold run: this program again, in a new process.  Returns 0 or 1. */
static int run_cold(int path, uint64_t entries, timing *t) {
  char command[sizeof self_path + 64];
  snprintf(command, sizeof command, "'%s' --cold %d %" PRIu64, self_path,
           path, entries);
  FILE *child = popen(command, "r");
  if (!child)
    return 1;
  int read = fscanf(child, "%lf %lf", &t->wall_ms, &t->cpu_ms);
  return pclose(child) == 0 && read == 2 ? 0 : 1;
}

/* Median of one path's runs, wall clock or CPU. */
static bench_stats stats_of(const timing *runs, int repeat, bool cpu) {
  double ms[MAX_REPEAT];
  for (int r = 0; r < repeat; r++)
    ms[r] = cpu ? runs[r].cpu_ms : runs[r].wall_ms;
  return bench_stats_of(ms, (size_t)repeat);
}

static int run_size(bench_json *json, uint64_t n, int repeat) {
  timing cold_runs[PATHS][MAX_REPEAT], warm_runs[PATHS][MAX_REPEAT];
  double destroy_ms[PATHS][MAX_REPEAT];
  uint64_t memory_bytes[PATHS] = {0}, staged[PATHS] = {0};
  for (int rep = 0; rep < repeat; rep++)
    for (int k = 0; k < PATHS; k++) {
      int path = (rep + k) % PATHS; /* rotate which path goes first */
      if (run_cold(path, n, &cold_runs[path][rep]) != 0) {
        fprintf(stderr, "cow_load_bench: cold run of %s failed\n",
                path_names[path]);
        return 1;
      }
    }
  feed f;
  if (feed_make(&f, n) != 0) {
    fprintf(stderr, "cow_load_bench: out of memory\n");
    return 1;
  }
  int rc = 0;
  for (int rep = 0; rc == 0 && rep < repeat; rep++)
    for (int k = 0; rc == 0 && k < PATHS; k++) {
      int path = (rep + k) % PATHS;
      rc = run_once(&f, path, &warm_runs[path][rep], &destroy_ms[path][rep],
                    &memory_bytes[path], &staged[path]);
    }
  free(f.records);
  free(f.groups);
  if (rc)
    return 1;
  bench_stats cold[PATHS], cold_cpu[PATHS], warm[PATHS], warm_cpu[PATHS];
  bench_stats destroy[PATHS];
  for (int p = 0; p < PATHS; p++) {
    cold[p] = stats_of(cold_runs[p], repeat, false);
    cold_cpu[p] = stats_of(cold_runs[p], repeat, true);
    warm[p] = stats_of(warm_runs[p], repeat, false);
    warm_cpu[p] = stats_of(warm_runs[p], repeat, true);
    destroy[p] = bench_stats_of(destroy_ms[p], (size_t)repeat);
  }
  printf("%" PRIu64 " entries (%u-byte keys, %u-byte values, %u key groups), "
         "%d runs of each\n", n, KEY_BYTES, VALUE_BYTES, KEY_GROUPS, repeat);
  printf("   %-13s %9s %9s %9s %9s %9s %9s %9s %8s\n", "path", "cold",
         "cold cpu", "warm", "warm cpu", "warm min", "warm max", "destroy",
         "memory");
  for (int p = 0; p < PATHS; p++)
    printf("   %-13s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %7.1fM\n",
           path_names[p], cold[p].median, cold_cpu[p].median, warm[p].median,
           warm_cpu[p].median, warm[p].min, warm[p].max, destroy[p].median,
           (double)memory_bytes[p] / (1 << 20));
  printf("   (ms; medians but for min and max, which are wall clock; memory: "
         "sl_cow_map_memory_bytes, MiB)\n");
  double ratio_cold = cold[PATH_PER_ENTRY].median / cold[PATH_BULK].median;
  double ratio_warm = warm[PATH_PER_ENTRY].median / warm[PATH_BULK].median;
  double per_million = 1e6 / (double)n;
  printf("   unstaged / bulk (the staged load's gain, cow_map.c note 18): "
         "cold %.2fx, warm %.2fx (wall)%s\n",
         cold[PATH_BULK_UNSTAGED].median / cold[PATH_BULK].median,
         warm[PATH_BULK_UNSTAGED].median / warm[PATH_BULK].median,
         staged[PATH_BULK] == 0
             ? "; both unstaged: a table under SL_COW_STAGE_MIN_BUCKETS"
             : "");
  printf("   per-entry / bulk: cold %.2fx, warm %.2fx (wall); bulk per 1M "
         "entries: cold %.1f ms (cpu %.1f), warm %.1f ms (cpu %.1f)\n",
         ratio_cold, ratio_warm, cold[PATH_BULK].median * per_million,
         cold_cpu[PATH_BULK].median * per_million,
         warm[PATH_BULK].median * per_million,
         warm_cpu[PATH_BULK].median * per_million);
  bench_json_begin_object(json, 0);
  bench_json_u64(json, "entries", n);
  for (int p = 0; p < PATHS; p++) {
    bench_json_begin_object(json, path_json[p]);
    bench_json_stats(json, "cold_ms", cold[p]);
    bench_json_stats(json, "cold_cpu_ms", cold_cpu[p]);
    bench_json_stats(json, "warm_ms", warm[p]);
    bench_json_stats(json, "warm_cpu_ms", warm_cpu[p]);
    bench_json_stats(json, "destroy_ms", destroy[p]);
    bench_json_u64(json, "memory_bytes", memory_bytes[p]);
    bench_json_end_object(json);
  }
  bench_json_double(json, "ratio_per_entry_to_bulk_cold", ratio_cold);
  bench_json_double(json, "ratio_per_entry_to_bulk_warm", ratio_warm);
  bench_json_end_object(json);
  fflush(stdout); /* a long run shows each size as it ends */
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "--cold") == 0)
    return cold_child(atoi(argv[2]), strtoull(argv[3], 0, 10));
  bool quick = false;
  int repeat = 5;
  const char *json_path = "bench/results/cow_load_bench.json";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : 0;
    int used = bench_run_option(a, v, &quick, &repeat, 3, &json_path, 0);
    if (used)
      i += used - 1;
    else {
      fprintf(stderr, "usage: cow_load_bench [--quick] [--repeat R] "
                      "[--json PATH]\n");
      return 2;
    }
  }
  if (repeat < 1 || repeat > MAX_REPEAT) {
    fprintf(stderr, "cow_load_bench: --repeat must be 1..%d\n", MAX_REPEAT);
    return 2;
  }
  if (bench_self_path(self_path, sizeof self_path) != 0) {
    fprintf(stderr, "cow_load_bench: cannot name this program for cold runs\n");
    return 1;
  }
  const uint64_t sizes[2] = {quick ? 100000u : 1000000u,
                             quick ? 1000000u : 10000000u};
  bench_json json;
  if (bench_json_create(&json, "cow_load_bench", json_path) != 0)
    return 1;
  bench_json_string(&json, "benchmark", "cow_load_bench");
  bench_json_machine(&json);
  bench_json_u64(&json, "repeat", (uint64_t)repeat);
  bench_json_begin_array(&json, "sizes");
  int rc = 0;
  for (int s = 0; rc == 0 && s < 2; s++)
    rc = run_size(&json, sizes[s], repeat);
  bench_json_end_array(&json);
  int written = bench_json_finish(&json, "cow_load_bench", json_path);
  return rc ? rc : written != 0;
}
