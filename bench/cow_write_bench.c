/* cow_write_bench.c — what an instance's first write to each key after a
 * checkpoint's barrier costs, alone and while another CPU reads the frozen
 * delta as the checkpoint writer does (issue 20: checkpoints must not
 * raise the 50%-load p99 by more than 1.5x).
 *
 *   cow_write_bench [--keys N] [--rounds R] [--quick] [--json PATH]
 *
 * THE QUESTION
 *
 * With checkpoints every 100 ms, latency_bench's job (10,000 keys, one
 * chained thread on one CPU, the writer on the other: coordinator.c note
 * 14) keeps its p50 but its p99 at 50% load grows several times.  At that
 * rate every key is written again within about 1.6 ms of a barrier, and
 * each of those first writes copies the frozen version (storage/cow_map.h
 * note 4).  Meanwhile the writer reads the same frozen versions on the
 * other CPU.  A copy on write also writes the frozen version it displaces
 * (its undo-list link and mark: cow_map.c retire_displaced), so a version
 * the writer has just read costs the owner a cache line taken back from
 * the other CPU.  This benchmark measures that cost without the rest of
 * the engine.
 *
 * WHAT IT DOES
 *
 * A map of N keys (16-byte keys, 16-byte values: the shape of
 * latency_bench's count state), without rollback (a job without a restart
 * strategy, such as latency_bench's) and with it (engine/snapshot.c note
 * 11: with a restart strategy), each size and kind measured apart.
 * Each round: freeze; in "reader" rounds a thread pinned to another CPU
 * walks the frozen delta as collect_all (engine/checkpoint_writer.c) and
 * the encoder do, through the delta's index when it has one: per version
 * its flags, sizes, key and value; meanwhile the owner, pinned to its own
 * CPU, writes every key once (sl_cow_map_update), in the order of the
 * previous round, which is the delta's order, as with a stream that cycles
 * through its keys.  Then the owner waits for the reader, releases the
 * epoch and runs the deferred reclaim to its end (sl_cow_map_maintain).
 * "alone" rounds do the same without the reader.  The two kinds alternate
 * (the first of each pair swapped every other pair) so drift hits both.
 *
 * Timed: the owner's loop of first writes (its thread's CPU time, so that
 * another process taking the CPU does not count; ns per key), the reclaim
 * that follows (CPU, ns per key) and, in reader rounds, the reader's walk
 * (two passes, as the writer collects, then encodes: wall, ns per version)
 * and the share of the owner's loop that came after the walk ended: the
 * reader only interferes with versions it read before the owner displaces
 * them, and every write after the walk displaces such a version, so a
 * round whose reader did not get the other CPU in time (another process
 * on it) measures little.  Printed: medians with min and max, and the
 * median over pairs of (reader / alone) of the first-write cost, over all
 * pairs and over those whose share was at least one half.
 *
 * Defaults: 10,000 and 1,000,000 keys, 101 rounds of each kind for 10K
 * and 9 for 1M; --quick: 10,000 keys, 21 rounds.  --keys N runs one size.
 * Needs two CPUs in the process's mask; with one it says so and exits 0.
 * A diagnostic outside the suite (bench/README.md), like
 * cow_rollback_bench.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "cow_map.h"

#define MAX_ROUNDS 201
#define VALUE_BYTES 16u

/* The reader thread: walks each delta handed to it, as the writer reads
 * one.  The owner hands a delta over by storing `delta_ready` (release)
 * and waits for `walked` (acquire) before it releases the epoch, so the
 * reader never reads a version the reclaim frees (cow_map.h note 7). */
typedef struct reader {
  int cpu;
  sl_cow_delta delta;
  _Atomic int delta_ready; /* owner -> reader: 1 = walk `delta` */
  _Atomic int walked;      /* reader -> owner */
  _Atomic int quit;
  uint64_t start_ns, end_ns; /* of the last walk, monotonic */
  uint64_t versions;         /* of the last walk */
  uint64_t checksum;         /* keeps the reads */
  int pin_error;
} reader;

static uint64_t read_version(const sl_cow_entry *e) {
  if (e->superseded)
    return 1;
  uint64_t key, value = 0;
  memcpy(&key, sl_cow_entry_key(e), 8);
  const uint8_t *data = (const uint8_t *)sl_cow_entry_key(e);
  if (e->value_bytes >= 8)
    memcpy(&value, data + sl_cow_value_offset(e->key_bytes), 8);
  return key ^ value ^ e->key_bytes ^ (uint64_t)e->value_bytes << 32;
}

/* Two passes, as the writer makes: one to collect (and sort) the
 * versions, one to encode them. */
static void walk(reader *r) {
  uint64_t sum = 0, versions = 0;
  const sl_cow_delta *d = &r->delta;
  for (int pass = 0; pass < 2; pass++) {
    versions = 0;
    if (d->index) {
      for (const sl_cow_index_block *b = d->index; b; b = b->next)
        for (uint64_t i = 0; i < b->count; i++, versions++)
          sum += read_version(b->versions[i]);
    } else {
      for (const sl_cow_entry *e = d->head; e; e = e->dirty_next, versions++)
        sum += read_version(e);
    }
  }
  r->checksum += sum;
  r->versions = versions;
}

static void *reader_main(void *arg) {
  reader *r = arg;
  r->pin_error = bench_pin_to_cpu(r->cpu);
  for (;;) {
    while (!atomic_load_explicit(&r->delta_ready, memory_order_acquire)) {
      if (atomic_load_explicit(&r->quit, memory_order_relaxed))
        return 0;
      /* spin: the owner's loop starts right after the hand-over, and a
       * parked reader would miss most of it */
    }
    atomic_store_explicit(&r->delta_ready, 0, memory_order_relaxed);
    r->start_ns = bench_now_ns();
    walk(r);
    r->end_ns = bench_now_ns();
    atomic_store_explicit(&r->walked, 1, memory_order_release);
  }
}

typedef struct round_figures {
  double write_ns;    /* owner CPU per key, first writes after the freeze */
  double reclaim_ns;  /* owner CPU per key, the reclaim after the release */
  double walk_ns;     /* reader wall per version (reader rounds) */
  double exposed;     /* the share of the owner's loop after the walk ended */
} round_figures;

static void write_all(sl_cow_map *map, const sl_cow_key *keys, uint64_t n,
                      uint64_t round) {
  for (uint64_t i = 0; i < n; i++) {
    void *slot;
    if (sl_cow_map_update(map, &keys[i], 0, VALUE_BYTES, &slot) != 0) {
      fprintf(stderr, "cow_write_bench: out of memory\n");
      exit(1);
    }
    uint64_t v;
    memcpy(&v, slot, 8);
    v += round;
    memcpy(slot, &v, 8);
  }
}

static void one_round(sl_cow_map *map, const sl_cow_key *keys, uint64_t n,
                      reader *r, bool with_reader, uint64_t round,
                      round_figures *f) {
  sl_cow_delta delta = sl_cow_map_freeze(map);
  if (with_reader) {
    atomic_store_explicit(&r->walked, 0, memory_order_relaxed);
    r->delta = delta;
    atomic_store_explicit(&r->delta_ready, 1, memory_order_release);
  }
  uint64_t w0 = bench_now_ns(), c0 = bench_thread_cpu_ns();
  write_all(map, keys, n, round);
  uint64_t c1 = bench_thread_cpu_ns(), w1 = bench_now_ns();
  f->write_ns = (double)(c1 - c0) / (double)n;
  f->walk_ns = f->exposed = 0;
  if (with_reader) {
    while (!atomic_load_explicit(&r->walked, memory_order_acquire)) {
    }
    if (r->end_ns <= w0)
      f->exposed = 1; /* read whole before the first write */
    else if (r->end_ns < w1)
      f->exposed = (double)(w1 - r->end_ns) / (double)(w1 - w0);
    f->walk_ns = r->versions ? (double)(r->end_ns - r->start_ns) /
                                   (double)r->versions
                             : 0;
  }
  sl_cow_map_release(map, delta.epoch);
  uint64_t c2 = bench_thread_cpu_ns();
  while (sl_cow_map_maintain(map, 4096)) {
  }
  f->reclaim_ns = (double)(bench_thread_cpu_ns() - c2) / (double)n;
}

static void print_stats(const char *what, const double *v, size_t n,
                        const char *unit) {
  bench_stats s = bench_stats_of(v, n);
  printf("    %-34s %8.1f [%.1f-%.1f] %s\n", what, s.median, s.min, s.max,
         unit);
}

/* One size: returns 0, or 1 if the map could not be made. */
static int one_size(bench_json *json, uint64_t n, int rounds, reader *r,
                    bool rollback) {
  sl_cow_map *map;
  if (sl_cow_map_create(&map) != 0 ||
      (rollback && sl_cow_map_enable_rollback(map) != 0))
    return 1;
  sl_cow_key *keys = malloc(n * sizeof *keys);
  uint8_t (*bytes)[16] = malloc(n * sizeof *bytes);
  if (!keys || !bytes)
    return 1;
  for (uint64_t i = 0; i < n; i++) {
    memcpy(bytes[i], &i, 8);
    memcpy(bytes[i] + 8, "cowwrite", 8);
    keys[i] = sl_cow_key_of(bytes[i], 16);
  }
  /* Fill, make every version CLEAN, then one round of each kind unmeasured
   * (warm caches, the allocator's free lists at their steady size). */
  write_all(map, keys, n, 0);
  round_figures warm;
  one_round(map, keys, n, r, false, 1, &warm);
  one_round(map, keys, n, r, true, 2, &warm);
  double alone_w[MAX_ROUNDS], alone_r[MAX_ROUNDS], with_w[MAX_ROUNDS];
  double with_r[MAX_ROUNDS], walk[MAX_ROUNDS], exposed[MAX_ROUNDS];
  double ratio[MAX_ROUNDS];
  for (int p = 0; p < rounds; p++) {
    round_figures a, b;
    bool reader_first = p % 2 == 1;
    one_round(map, keys, n, r, reader_first, 3 + 2 * (uint64_t)p,
              reader_first ? &b : &a);
    one_round(map, keys, n, r, !reader_first, 4 + 2 * (uint64_t)p,
              reader_first ? &a : &b);
    alone_w[p] = a.write_ns;
    alone_r[p] = a.reclaim_ns;
    with_w[p] = b.write_ns;
    with_r[p] = b.reclaim_ns;
    walk[p] = b.walk_ns;
    exposed[p] = b.exposed;
    ratio[p] = a.write_ns > 0 ? b.write_ns / a.write_ns : 0;
  }
  printf("  %" PRIu64 " keys, rollback %s, %d rounds of each kind (%s)\n", n,
         rollback ? "on" : "off", rounds, sl_cow_map_allocator_name());
  print_stats("first writes, alone", alone_w, (size_t)rounds, "ns/key");
  print_stats("first writes, reader alongside", with_w, (size_t)rounds,
              "ns/key");
  print_stats("ratio (pairs)", ratio, (size_t)rounds, "x");
  print_stats("reclaim after release, alone", alone_r, (size_t)rounds,
              "ns/key");
  print_stats("reclaim after release, with reader", with_r, (size_t)rounds,
              "ns/key");
  print_stats("reader's walk (two passes)", walk, (size_t)rounds,
              "ns/version");
  /* The pairs whose reader read everything while at least half of the
   * owner's first writes were still to come. */
  double exposed_ratio[MAX_ROUNDS];
  size_t exposed_pairs = 0;
  for (int p = 0; p < rounds; p++)
    if (exposed[p] >= 0.5)
      exposed_ratio[exposed_pairs++] = ratio[p];
  print_stats("share of writes after the walk", exposed, (size_t)rounds, "");
  if (exposed_pairs)
    print_stats("ratio (pairs with a share >= 0.5)", exposed_ratio,
                exposed_pairs, "x");
  printf("    (%zu of %d pairs had a share >= 0.5)\n", exposed_pairs, rounds);
  bench_json_begin_object(json, 0);
  bench_json_u64(json, "keys", n);
  bench_json_bool(json, "rollback", rollback);
  bench_json_u64(json, "rounds", (uint64_t)rounds);
  bench_json_stats(json, "first_write_ns_alone",
                   bench_stats_of(alone_w, (size_t)rounds));
  bench_json_stats(json, "first_write_ns_with_reader",
                   bench_stats_of(with_w, (size_t)rounds));
  bench_json_stats(json, "ratio", bench_stats_of(ratio, (size_t)rounds));
  bench_json_stats(json, "reclaim_ns_alone",
                   bench_stats_of(alone_r, (size_t)rounds));
  bench_json_stats(json, "reclaim_ns_with_reader",
                   bench_stats_of(with_r, (size_t)rounds));
  bench_json_stats(json, "reader_walk_ns_per_version",
                   bench_stats_of(walk, (size_t)rounds));
  bench_json_stats(json, "share_of_writes_after_walk",
                   bench_stats_of(exposed, (size_t)rounds));
  bench_json_u64(json, "exposed_pairs", exposed_pairs);
  if (exposed_pairs)
    bench_json_stats(json, "ratio_exposed_pairs",
                     bench_stats_of(exposed_ratio, exposed_pairs));
  bench_json_end_object(json);
  sl_cow_map_destroy(map);
  free(keys);
  free(bytes);
  return 0;
}

int main(int argc, char **argv) {
  bool quick = false;
  int repeat = 0; /* --repeat is accepted and ignored: see --rounds */
  const char *json_path = "bench/results/cow_write_bench.json";
  const char *dir = 0;
  uint64_t only_keys = 0;
  int rounds = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : 0;
    int used = bench_run_option(a, v, &quick, &repeat, 1, &json_path, &dir);
    if (used) {
      i += used - 1;
    } else if (strcmp(a, "--keys") == 0 && v) {
      only_keys = bench_parse_or_die("cow_write_bench", "--keys", v, 1);
      i++;
    } else if (strcmp(a, "--rounds") == 0 && v) {
      rounds = (int)bench_parse_or_die("cow_write_bench", "--rounds", v, 1);
      i++;
    } else {
      fprintf(stderr, "usage: cow_write_bench [--keys N] [--rounds R (at "
                      "most %d)] [--quick] [--json PATH]\n", MAX_ROUNDS);
      return 2;
    }
  }
  if (rounds > MAX_ROUNDS) {
    fprintf(stderr, "cow_write_bench: --rounds at most %d\n", MAX_ROUNDS);
    return 2;
  }
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  int cpus[2], found = 0;
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0)
    for (int c = 0; c < CPU_SETSIZE && found < 2; c++)
      if (CPU_ISSET(c, &allowed))
        cpus[found++] = c;
  if (found < 2) {
    printf("cow_write_bench: one CPU in this process's mask: the reader "
           "cannot run alongside the owner; not measured\n");
    return 0;
  }
  reader r = {.cpu = cpus[1]};
  pthread_t thread; /* before the owner pins itself: the thread inherits */
  if (pthread_create(&thread, 0, reader_main, &r) != 0) {
    fprintf(stderr, "cow_write_bench: no reader thread\n");
    return 1;
  }
  if (bench_pin_to_cpu(cpus[0]) != 0) {
    fprintf(stderr, "cow_write_bench: cannot pin to CPU %d\n", cpus[0]);
    return 1;
  }
  bench_json json;
  if (bench_json_create(&json, "cow_write_bench", json_path) != 0)
    return 1;
  bench_json_string(&json, "benchmark", "cow_write_bench");
  bench_json_machine(&json);
  printf("first write to each key after a freeze, owner on CPU %d, reader "
         "of the frozen delta on CPU %d\n", cpus[0], cpus[1]);
  bench_json_begin_array(&json, "sizes");
  uint64_t sizes[2] = {10000, 1000000};
  int size_rounds[2] = {101, 9};
  int count = 2;
  if (only_keys) {
    sizes[0] = only_keys;
    size_rounds[0] = only_keys <= 100000 ? 101 : 9;
    count = 1;
  } else if (quick) {
    size_rounds[0] = 21;
    count = 1;
  }
  int rc = 0;
  for (int s = 0; rc == 0 && s < count; s++)
    for (int rollback = 0; rc == 0 && rollback < 2; rollback++)
      rc = one_size(&json, sizes[s], rounds ? rounds : size_rounds[s], &r,
                    rollback);
  bench_json_end_array(&json);
  atomic_store(&r.quit, 1);
  pthread_join(thread, 0);
  if (r.pin_error)
    fprintf(stderr, "cow_write_bench: the reader could not be pinned to CPU "
            "%d (error %d); it ran where the scheduler put it\n", cpus[1],
            r.pin_error);
  bench_json_u64(&json, "checksum", r.checksum);
  int written = bench_json_finish(&json, "cow_write_bench", json_path);
  if (rc)
    fprintf(stderr, "cow_write_bench: no map\n");
  return rc ? 1 : written != 0;
}
