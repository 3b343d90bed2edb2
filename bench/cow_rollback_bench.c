/* cow_rollback_bench.c — what rolling the copy-on-write map back in memory
 * costs (storage/cow_map.h note 10, cow_map_rollback.c), alone, without
 * the rest of a failover around it.
 *
 *   cow_rollback_bench [--keys N] [--changes C] [--rounds R]
 *
 * A map of N keys (16-byte keys, 8-byte values, the count operator's
 * shape) with rollback on, at a completed checkpoint with every version
 * clean.  Each round writes C updates of random keys, half before a freeze
 * whose checkpoint never completes and half after it, then rolls back to
 * the checkpoint and reclaims what is left; the rollback is timed (wall
 * clock and the thread's CPU time) with the versions it handled (written
 * since the checkpoint, and displaced by those writes).  Prints each round
 * and the medians; ns per change (the rollback's CPU time over C) is the
 * figure to compare across builds (recovery_bench's figures hold the
 * whole failover and its noise).  Then the rest: the CPU time of the
 * bounded steps (sl_cow_map_maintain) that finish what the rollback left,
 * freeing the failed epochs' versions and, after a lazy rollback
 * (cow_map_rollback.c notes 5-7, the case here: no key is deleted),
 * putting back every key not touched since; "total" is the two.  Not ns per version: which versions a
 * rollback handles changed (cow_map_rollback.c note 1: with no key
 * inserted since the checkpoint, as here, the undo list's only).
 * Defaults: 1M keys, 100K changes, 7 rounds.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "cow_map.h"

#define MAX_ROUNDS BENCH_MAX_REPEAT

/* xorshift64: the keys each round writes. */
static uint64_t next_random(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static void update(sl_cow_map *map, uint64_t id, uint64_t value) {
  uint8_t key[16];
  memcpy(key, &id, 8);
  memcpy(key + 8, "rollback", 8);
  sl_cow_key k = sl_cow_key_of(key, sizeof key);
  void *slot = 0;
  if (sl_cow_map_update(map, &k, 0, 8, &slot) != 0) {
    fprintf(stderr, "cow_rollback_bench: out of memory\n");
    exit(1);
  }
  memcpy(slot, &value, 8);
}

static uint64_t parse_count(const char *flag, const char *text) {
  char *end;
  unsigned long long n = strtoull(text, &end, 10);
  if (*end || n == 0) {
    fprintf(stderr, "cow_rollback_bench: %s wants a positive count, not '%s'\n",
            flag, text);
    exit(2);
  }
  return n;
}

int main(int argc, char **argv) {
  uint64_t keys = 1000000, changes = 100000, rounds = 7;
  for (int i = 1; i < argc; i++) {
    if (i + 1 < argc && strcmp(argv[i], "--keys") == 0)
      keys = parse_count(argv[i], argv[i + 1]), i++;
    else if (i + 1 < argc && strcmp(argv[i], "--changes") == 0)
      changes = parse_count(argv[i], argv[i + 1]), i++;
    else if (i + 1 < argc && strcmp(argv[i], "--rounds") == 0)
      rounds = parse_count(argv[i], argv[i + 1]), i++;
    else {
      fprintf(stderr, "usage: cow_rollback_bench [--keys N] [--changes C] "
                      "[--rounds R (at most %d)]\n", (int)MAX_ROUNDS);
      return 2;
    }
  }
  if (rounds > MAX_ROUNDS) {
    fprintf(stderr, "cow_rollback_bench: --rounds at most %d\n", (int)MAX_ROUNDS);
    return 2;
  }
  sl_cow_map *map;
  if (sl_cow_map_create(&map) != 0 || sl_cow_map_enable_rollback(map) != 0) {
    fprintf(stderr, "cow_rollback_bench: no map\n");
    return 1;
  }
  for (uint64_t id = 0; id < keys; id++)
    update(map, id, id);
  sl_cow_map_release(map, sl_cow_map_freeze(map).epoch);
  while (sl_cow_map_maintain(map, 1u << 20)) {
  }
  double wall_ms[MAX_ROUNDS], cpu_ms[MAX_ROUNDS], ns_per[MAX_ROUNDS];
  double ns_per_change[MAX_ROUNDS], rest_ms[MAX_ROUNDS], total_ms[MAX_ROUNDS];
  uint64_t seed = 0x9e3779b97f4a7c15u;
  printf("rollback of %" PRIu64 " random updates over %" PRIu64 " keys (half "
         "frozen, half current), %s\n", changes, keys, sl_cow_map_allocator_name());
  for (uint64_t r = 0; r < rounds; r++) {
    for (uint64_t i = 0; i < changes / 2; i++)
      update(map, next_random(&seed) % keys, i);
    sl_cow_map_freeze(map); /* its checkpoint never completes */
    for (uint64_t i = changes / 2; i < changes; i++)
      update(map, next_random(&seed) % keys, i);
    uint64_t visits = sl_cow_map_rollback_visits(map);
    uint64_t w0 = bench_now_ns(), c0 = bench_thread_cpu_ns();
    int rc = sl_cow_map_rollback(map, sl_cow_map_stable_epoch(map));
    uint64_t c1 = bench_thread_cpu_ns(), w1 = bench_now_ns();
    if (rc != 0) {
      fprintf(stderr, "cow_rollback_bench: rollback failed: %d\n", rc);
      return 1;
    }
    visits = sl_cow_map_rollback_visits(map) - visits;
    wall_ms[r] = (double)(w1 - w0) / 1e6;
    cpu_ms[r] = (double)(c1 - c0) / 1e6;
    ns_per[r] = visits ? (double)(c1 - c0) / (double)visits : 0;
    ns_per_change[r] = (double)(c1 - c0) / (double)changes;
    /* The rest, in the steps a running instance takes (bounded: each
     * call frees or settles up to its budget). */
    uint64_t c2 = bench_thread_cpu_ns();
    while (sl_cow_map_maintain(map, 4096)) {
    }
    rest_ms[r] = (double)(bench_thread_cpu_ns() - c2) / 1e6;
    total_ms[r] = cpu_ms[r] + rest_ms[r];
    printf("  round %2" PRIu64 ": %8.2f ms wall, %8.2f ms CPU, %" PRIu64
           " versions, %6.1f ns CPU per version, %6.1f per change; rest "
           "%.2f ms CPU, total %.2f\n", r + 1, wall_ms[r], cpu_ms[r], visits,
           ns_per[r], ns_per_change[r], rest_ms[r], total_ms[r]);
  }
  bench_stats wall = bench_stats_of(wall_ms, rounds);
  bench_stats cpu = bench_stats_of(cpu_ms, rounds);
  bench_stats per = bench_stats_of(ns_per, rounds);
  bench_stats per_change = bench_stats_of(ns_per_change, rounds);
  bench_stats rest = bench_stats_of(rest_ms, rounds);
  bench_stats total = bench_stats_of(total_ms, rounds);
  printf("median: %.2f ms wall [%.2f-%.2f], %.2f ms CPU [%.2f-%.2f], "
         "%.1f ns CPU per version [%.1f-%.1f], %.1f per change [%.1f-%.1f]\n",
         wall.median, wall.min, wall.max, cpu.median, cpu.min, cpu.max,
         per.median, per.min, per.max, per_change.median, per_change.min,
         per_change.max);
  printf("median: the rest %.2f ms CPU [%.2f-%.2f], total %.2f ms CPU "
         "[%.2f-%.2f]\n", rest.median, rest.min, rest.max, total.median,
         total.min, total.max);
  sl_cow_map_destroy(map);
  return 0;
}
