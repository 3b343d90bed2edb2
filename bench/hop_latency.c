/* hop_latency.c — one-way hop latency through sluice rings (engine/ring.h),
 * measured by ping-pong between two pinned threads.
 *
 * METHOD
 *
 * 1. Two rings: A carries pings from the pinger (--pinger-cpu, 0) to the
 *    ponger (--ponger-cpu, 1), B carries the pongs back.  Each thread owns
 *    one sl_parker, as an engine instance does: the pinger's is A's
 *    producer parker and B's consumer parker, and the other way round.
 * 2. A message is 16 bytes {sequence, ~sequence}; the receiver checks both.
 *    Every message is published with force = true (latency mode: wake the
 *    consumer whatever the fill level) and each consumed message is
 *    released with force = false, as the engine's consumers do per burst.
 * 3. The pinger reads the clock once per round trip, after it has checked
 *    and released pong i; a sample is the time between two such reads:
 *    everything round trip i costs (send ping, wait, check, release the
 *    pong — whose wake check may wake the ponger for the next ping — and
 *    one clock read, the reported overhead, not subtracted).  One-way hop
 *    latency = sample / 2.  --warmup round trips run first, unrecorded.
 * 4. Modes (--modes):
 *      spin   waiters spin without limit and never park; the publish and
 *             release wake checks still run (fence + load), no syscalls.
 *      park   spin limit 0: a waiter parks on its futex at once, so every
 *             hop includes a futex wake and a context switch.
 *      park-release-nowake  diagnostic: park, but the rings get no
 *             producer parker, so releases never wake anyone.  Rings never
 *             fill here, so the producer never needs waking; the difference
 *             to `park` is the effect of releases waking a thread that is
 *             parked for its other ring (futile wake-ups count the harm).
 *      ref-spin  reference floor, no ring: the same ping-pong over two
 *             atomic sequence words on separate cache lines (store-release,
 *             spin on load-acquire).  What the hardware's line round trip
 *             costs; a ring hop also moves its entry's line and head/tail.
 * 5. Reported per mode: min, p50, p99, p99.9 and max of the one-way
 *    latency (nearest rank over --rounds samples), parker sleeps per round
 *    trip, and futile wake-ups per round trip (a sleep that returned while
 *    the awaited ring was still empty).
 */
#include <assert.h>
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

#include "bench_util.h"
#include "ring.h"
#include "wait.h"

#define BENCH_LINE 64
#define DEFAULT_ROUNDS 200000ull
#define DEFAULT_WARMUP 2000ull
#define QUICK_ROUNDS 10000ull
#define QUICK_WARMUP 500ull
#define MESSAGE_BYTES 16u
#define SPIN_FOREVER UINT64_MAX

typedef struct message {
  uint64_t sequence;
  uint64_t check; /* ~sequence */
} message;
_Static_assert(sizeof(message) == MESSAGE_BYTES, "16-byte messages");

enum mode {
  MODE_SPIN,
  MODE_PARK,
  MODE_PARK_RELEASE_NOWAKE,
  MODE_REF_SPIN,
  MODE_COUNT
};

static const char *const mode_names[MODE_COUNT] = {
    "spin", "park", "park-release-nowake", "ref-spin"};
static const char *const mode_labels[MODE_COUNT] = {
    "spin (never park)", "park (spin limit 0)",
    "park, releases never wake (diag.)", "reference: bare atomics, spin"};

/* One thread's side: its parker on a line of its own (the other thread
 * reads it in every wake check) and its owner-only counters. */
typedef struct side {
  alignas(BENCH_LINE) sl_parker parker;
  alignas(BENCH_LINE) uint64_t futile_wakeups;
  int cpu;
} side;

typedef struct hop_run {
  sl_ring ping_ring; /* A: pinger -> ponger */
  sl_ring pong_ring; /* B: ponger -> pinger */
  side pinger, ponger;
  /* ref-spin only: the last sequence sent each way, a line each. */
  alignas(BENCH_LINE) _Atomic uint64_t ping_sequence;
  alignas(BENCH_LINE) _Atomic uint64_t pong_sequence;
  uint64_t spin_limit;
  uint64_t warmup;
  uint64_t rounds;
  uint64_t *round_trip_ns; /* rounds samples, written by the pinger */
  pthread_barrier_t start;
} hop_run;

static _Noreturn void fail(const char *what) { bench_fail("hop_latency", what); }

/* Wait until `ring` has something to read: spin up to spin_limit, then
 * park (wait.h protocol).  Counts sleeps that ended with the ring still
 * empty. */
static void wait_readable(sl_ring *ring, side *self, uint64_t spin_limit) {
  for (uint64_t spins = 0; sl_ring_readable_consumer(ring) == 0;) {
    if (spins < spin_limit) {
      spins++;
      sl_cpu_relax();
      continue;
    }
    sl_parker_prepare(&self->parker);
    if (sl_ring_readable_consumer(ring) != 0) {
      sl_parker_cancel(&self->parker);
      return;
    }
    sl_parker_sleep(&self->parker);
    if (sl_ring_readable_consumer(ring) == 0)
      self->futile_wakeups++;
  }
}

/* Append and publish one message with a forced wake check (method 2). */
static void send_message(sl_ring *ring, uint64_t sequence) {
  uint8_t *slot = sl_ring_append_record_producer(ring, MESSAGE_BYTES, 0);
  /* At most one message is in flight, so the ring never fills. */
  if (!slot)
    fail("ring unexpectedly full");
  message m = {sequence, ~sequence};
  memcpy(slot, &m, sizeof m);
  sl_ring_publish_producer(ring, true);
}

/* Read the one message at the read position and check it is `sequence`.
 * Does not release: the caller does, after its time-critical part. */
static void receive_message(sl_ring *ring, uint64_t sequence) {
  const sl_entry *e = sl_ring_peek_consumer(ring);
  if (e->kind != SL_ENTRY_RECORDS || e->count != 1 ||
      e->record_bytes != MESSAGE_BYTES)
    fail("unexpected entry");
  message m;
  memcpy(&m, (const uint8_t *)e + sizeof(sl_entry), sizeof m);
  if (m.sequence != sequence || m.check != ~sequence)
    fail("message out of sequence or corrupt");
  sl_ring_advance_consumer(ring, sl_entry_bytes(e));
}

/* Round trip i ended now: keep its time unless it is a warm-up round. */
static inline void note_round_trip(hop_run *run, uint64_t i,
                                   uint64_t *previous_ns) {
  uint64_t now_ns = bench_now_ns();
  if (i >= run->warmup)
    run->round_trip_ns[i - run->warmup] = now_ns - *previous_ns;
  *previous_ns = now_ns;
}

static void pinger_loop(hop_run *run) {
  const uint64_t total = run->warmup + run->rounds;
  uint64_t previous_ns = bench_now_ns();
  for (uint64_t i = 0; i < total; i++) {
    send_message(&run->ping_ring, i);
    wait_readable(&run->pong_ring, &run->pinger, run->spin_limit);
    receive_message(&run->pong_ring, i);
    sl_ring_release_consumer(&run->pong_ring, false);
    note_round_trip(run, i, &previous_ns);
  }
}

static void ponger_loop(hop_run *run) {
  const uint64_t total = run->warmup + run->rounds;
  for (uint64_t i = 0; i < total; i++) {
    wait_readable(&run->ping_ring, &run->ponger, run->spin_limit);
    receive_message(&run->ping_ring, i);
    send_message(&run->pong_ring, i); /* reply first: it is the latency */
    sl_ring_release_consumer(&run->ping_ring, false);
  }
}

/* ref-spin (method 4): sequence numbers count from 1 so 0 means none. */
static void reference_pinger_loop(hop_run *run) {
  const uint64_t total = run->warmup + run->rounds;
  uint64_t previous_ns = bench_now_ns();
  for (uint64_t i = 0; i < total; i++) {
    /* Release/acquire mirror a ring's tail store and load. */
    atomic_store_explicit(&run->ping_sequence, i + 1, memory_order_release);
    while (atomic_load_explicit(&run->pong_sequence, memory_order_acquire) !=
           i + 1)
      sl_cpu_relax();
    note_round_trip(run, i, &previous_ns);
  }
}

static void reference_ponger_loop(hop_run *run) {
  const uint64_t total = run->warmup + run->rounds;
  for (uint64_t i = 0; i < total; i++) {
    while (atomic_load_explicit(&run->ping_sequence, memory_order_acquire) !=
           i + 1)
      sl_cpu_relax();
    atomic_store_explicit(&run->pong_sequence, i + 1, memory_order_release);
  }
}

typedef struct thread_arg {
  hop_run *run;
  side *self;
  void (*loop)(hop_run *run);
} thread_arg;

static void *thread_main(void *p) {
  thread_arg *arg = p;
  int rc = bench_pin_to_cpu(arg->self->cpu);
  if (rc != 0) {
    fprintf(stderr, "hop_latency: cannot pin to CPU %d: %s\n", arg->self->cpu,
            strerror(rc));
    exit(2);
  }
  pthread_barrier_wait(&arg->run->start);
  arg->loop(arg->run);
  return NULL;
}

/* ------------------------------------------------------------- results */

typedef struct mode_result {
  bool ran;
  uint64_t one_way_ns_min, one_way_ns_p50, one_way_ns_p99, one_way_ns_p999,
      one_way_ns_max;
  double one_way_ns_mean;
  double pinger_sleeps_per_round, ponger_sleeps_per_round;
  double futile_wakeups_per_round;
} mode_result;

typedef struct options {
  uint64_t rounds;
  uint64_t warmup;
  uint64_t ring_bytes;
  uint64_t timeout_s;
  bool selected[MODE_COUNT];
  int pinger_cpu, ponger_cpu;
  const char *json_path;
} options;

static void join_or_die(pthread_t thread, const struct timespec *deadline,
                        hop_run *run, enum mode mode) {
  int rc = pthread_timedjoin_np(thread, NULL, deadline);
  if (rc == 0)
    return;
  fprintf(stderr,
          "hop_latency: mode %s did not finish (%s): ping head %" PRIu64
          " tail %" PRIu64 ", pong head %" PRIu64 " tail %" PRIu64
          ", parkers %u/%u\n",
          mode_names[mode], strerror(rc), atomic_load(&run->ping_ring.head),
          atomic_load(&run->ping_ring.tail), atomic_load(&run->pong_ring.head),
          atomic_load(&run->pong_ring.tail),
          atomic_load(&run->pinger.parker.state),
          atomic_load(&run->ponger.parker.state));
  exit(3);
}

/* Run one mode and summarise it into *result. */
static void run_mode(enum mode mode, const options *opt, mode_result *result) {
  hop_run *run = aligned_alloc(BENCH_LINE, (sizeof *run + BENCH_LINE - 1) /
                                               BENCH_LINE * BENCH_LINE);
  if (!run)
    fail("out of memory");
  memset(run, 0, sizeof *run);
  sl_parker_init(&run->pinger.parker);
  sl_parker_init(&run->ponger.parker);
  run->pinger.cpu = opt->pinger_cpu;
  run->ponger.cpu = opt->ponger_cpu;
  run->spin_limit =
      mode == MODE_SPIN || mode == MODE_REF_SPIN ? SPIN_FOREVER : 0;
  run->warmup = opt->warmup;
  run->rounds = opt->rounds;
  run->round_trip_ns = calloc(opt->rounds, sizeof *run->round_trip_ns);
  if (!run->round_trip_ns)
    fail("out of memory");
  bool producer_parkers = mode != MODE_PARK_RELEASE_NOWAKE;
  /* batch_records 1: every message is its own entry (latency mode). */
  if (sl_ring_init(&run->ping_ring, opt->ring_bytes, &run->ponger.parker,
                   producer_parkers ? &run->pinger.parker : NULL, 1) != 0 ||
      sl_ring_init(&run->pong_ring, opt->ring_bytes, &run->pinger.parker,
                   producer_parkers ? &run->ponger.parker : NULL, 1) != 0)
    fail("cannot create the rings");
  pthread_barrier_init(&run->start, NULL, 2);
  bool reference = mode == MODE_REF_SPIN;
  thread_arg pinger = {run, &run->pinger,
                       reference ? reference_pinger_loop : pinger_loop};
  thread_arg ponger = {run, &run->ponger,
                       reference ? reference_ponger_loop : ponger_loop};
  pthread_t threads[2];
  if (pthread_create(&threads[0], NULL, thread_main, &ponger) != 0 ||
      pthread_create(&threads[1], NULL, thread_main, &pinger) != 0)
    fail("cannot create threads");
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += (time_t)opt->timeout_s;
  join_or_die(threads[1], &deadline, run, mode);
  join_or_die(threads[0], &deadline, run, mode);
  pthread_barrier_destroy(&run->start);
  assert(sl_ring_check(&run->ping_ring) && sl_ring_check(&run->pong_ring));

  uint64_t *rt = run->round_trip_ns;
  const uint64_t n = opt->rounds;
  double sum = 0;
  for (uint64_t i = 0; i < n; i++)
    sum += (double)rt[i];
  bench_sort_u64(rt, n);
  /* One way = round trip / 2, rounded to the nearest nanosecond. */
  result->ran = true;
  result->one_way_ns_min = (rt[0] + 1) / 2;
  result->one_way_ns_p50 = (bench_percentile_sorted_u64(rt, n, 0.50) + 1) / 2;
  result->one_way_ns_p99 = (bench_percentile_sorted_u64(rt, n, 0.99) + 1) / 2;
  result->one_way_ns_p999 =
      (bench_percentile_sorted_u64(rt, n, 0.999) + 1) / 2;
  result->one_way_ns_max = (rt[n - 1] + 1) / 2;
  result->one_way_ns_mean = sum / (double)n / 2;
  const double total = (double)(opt->warmup + opt->rounds);
  result->pinger_sleeps_per_round = (double)run->pinger.parker.sleeps / total;
  result->ponger_sleeps_per_round = (double)run->ponger.parker.sleeps / total;
  result->futile_wakeups_per_round =
      (double)(run->pinger.futile_wakeups + run->ponger.futile_wakeups) /
      total;

  sl_ring_destroy(&run->ping_ring);
  sl_ring_destroy(&run->pong_ring);
  free(run->round_trip_ns);
  free(run);
}

static void print_results(const options *opt, const mode_result *results,
                          uint64_t clock_overhead_ns) {
  printf("hop_latency: sluice rings, %u-byte messages, CPU %d <-> CPU %d, "
         "%" PRIu64 " round trips (+%" PRIu64 " warm-up)\n",
         MESSAGE_BYTES, opt->pinger_cpu, opt->ponger_cpu, opt->rounds,
         opt->warmup);
  printf("one-way latency = round trip / 2, ns; each sample includes one "
         "clock read (%" PRIu64 " ns, not subtracted)\n\n",
         clock_overhead_ns);
  printf("%-34s %7s %7s %7s %8s %9s | %s\n", "mode", "min", "p50", "p99",
         "p99.9", "max", "sleeps/rt ping+pong, futile wakes/rt");
  for (int m = 0; m < MODE_COUNT; m++) {
    const mode_result *r = &results[m];
    if (!r->ran)
      continue;
    printf("%-34s %7" PRIu64 " %7" PRIu64 " %7" PRIu64 " %8" PRIu64
           " %9" PRIu64 " | %.2f+%.2f, %.3f\n",
           mode_labels[m], r->one_way_ns_min, r->one_way_ns_p50,
           r->one_way_ns_p99, r->one_way_ns_p999, r->one_way_ns_max,
           r->pinger_sleeps_per_round, r->ponger_sleeps_per_round,
           r->futile_wakeups_per_round);
  }
}

static int write_json(const options *opt, const mode_result *results,
                      uint64_t clock_overhead_ns) {
  bench_json json;
  int rc = bench_json_create(&json, "hop_latency", opt->json_path);
  if (rc != 0)
    return rc;
  bench_json_string(&json, "benchmark", "hop_latency");
  bench_json_machine(&json);
  bench_json_begin_object(&json, "config");
  bench_json_u64(&json, "message_bytes", MESSAGE_BYTES);
  bench_json_u64(&json, "ring_bytes", opt->ring_bytes);
  bench_json_u64(&json, "round_trips", opt->rounds);
  bench_json_u64(&json, "warmup_round_trips", opt->warmup);
  bench_json_u64(&json, "pinger_cpu", (uint64_t)opt->pinger_cpu);
  bench_json_u64(&json, "ponger_cpu", (uint64_t)opt->ponger_cpu);
  bench_json_u64(&json, "clock_overhead_ns", clock_overhead_ns);
  bench_json_string(&json, "latency",
                    "one way = round trip / 2, nearest-rank percentiles");
  bench_json_end_object(&json);
  bench_json_begin_array(&json, "modes");
  for (int m = 0; m < MODE_COUNT; m++) {
    const mode_result *r = &results[m];
    if (!r->ran)
      continue;
    bench_json_begin_object(&json, NULL);
    bench_json_string(&json, "mode", mode_names[m]);
    bench_json_string(&json, "description", mode_labels[m]);
    bench_json_begin_object(&json, "one_way_ns");
    bench_json_u64(&json, "min", r->one_way_ns_min);
    bench_json_u64(&json, "p50", r->one_way_ns_p50);
    bench_json_u64(&json, "p99", r->one_way_ns_p99);
    bench_json_u64(&json, "p99_9", r->one_way_ns_p999);
    bench_json_u64(&json, "max", r->one_way_ns_max);
    bench_json_double(&json, "mean", r->one_way_ns_mean);
    bench_json_end_object(&json);
    bench_json_double(&json, "pinger_sleeps_per_round_trip",
                      r->pinger_sleeps_per_round);
    bench_json_double(&json, "ponger_sleeps_per_round_trip",
                      r->ponger_sleeps_per_round);
    bench_json_double(&json, "futile_wakeups_per_round_trip",
                      r->futile_wakeups_per_round);
    bench_json_end_object(&json);
  }
  bench_json_end_array(&json);
  return bench_json_finish(&json, "hop_latency", opt->json_path);
}

/* ------------------------------------------------------------- options */

static void usage(FILE *out) {
  fprintf(out,
          "usage: hop_latency [options]\n"
          "  --rounds N        measured round trips per mode (default 200k)\n"
          "  --warmup N        unrecorded round trips first (default 2000)\n"
          "  --modes LIST      of spin,park,park-release-nowake,ref-spin\n"
          "                    (default all)\n"
          "  --ring-bytes B    capacity of each ring (default 64KiB)\n"
          "  --pinger-cpu C    (default 0)   --ponger-cpu C (default 1)\n"
          "  --timeout-s S     give up on a mode after S s (default 300)\n"
          "  --json PATH       (default bench/results/hop_latency.json)\n"
          "  --quick           10k round trips: a smoke run\n");
}

static uint64_t parse_or_die(const char *flag, const char *text,
                             uint64_t unit) {
  return bench_parse_or_die("hop_latency", flag, text, unit);
}

static void parse_modes(const char *text, options *opt) {
  if (!text)
    parse_or_die("--modes", text, 1);
  memset(opt->selected, 0, sizeof opt->selected);
  for (const char *at = text; *at;) {
    size_t length = strcspn(at, ",");
    int found = bench_find_name(mode_names, MODE_COUNT, at, length);
    if (found < 0)
      parse_or_die("--modes", text, 1);
    opt->selected[found] = true;
    at += length;
    if (*at == ',')
      at++;
  }
}

static void parse_options(int argc, char **argv, options *opt) {
  memset(opt, 0, sizeof *opt);
  opt->rounds = DEFAULT_ROUNDS;
  opt->warmup = DEFAULT_WARMUP;
  opt->ring_bytes = 64u << 10;
  opt->timeout_s = 300;
  for (int m = 0; m < MODE_COUNT; m++)
    opt->selected[m] = true;
  opt->pinger_cpu = 0;
  opt->ponger_cpu = 1;
  opt->json_path = "bench/results/hop_latency.json";
  bool quick = false, rounds_set = false, warmup_set = false;
  for (int i = 1; i < argc; i++) {
    const char *flag = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
    bool takes_value = true;
    if (strcmp(flag, "--rounds") == 0) {
      opt->rounds = parse_or_die(flag, value, 1000);
      rounds_set = true;
    } else if (strcmp(flag, "--warmup") == 0) {
      opt->warmup = parse_or_die(flag, value, 1000);
      warmup_set = true;
    } else if (strcmp(flag, "--ring-bytes") == 0) {
      opt->ring_bytes = parse_or_die(flag, value, 1024);
    } else if (strcmp(flag, "--timeout-s") == 0) {
      opt->timeout_s = parse_or_die(flag, value, 1000);
    } else if (strcmp(flag, "--pinger-cpu") == 0) {
      opt->pinger_cpu = (int)parse_or_die(flag, value, 1000);
    } else if (strcmp(flag, "--ponger-cpu") == 0) {
      opt->ponger_cpu = (int)parse_or_die(flag, value, 1000);
    } else if (strcmp(flag, "--modes") == 0) {
      parse_modes(value, opt);
    } else {
      int used = bench_common_flag("hop_latency", flag, value, &opt->json_path,
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
    if (!rounds_set)
      opt->rounds = QUICK_ROUNDS;
    if (!warmup_set)
      opt->warmup = QUICK_WARMUP;
  }
  if (opt->rounds < 1 || opt->timeout_s < 1)
    fail("--rounds and --timeout-s must be >= 1");
  if (opt->ring_bytes < SL_RING_MIN_BYTES)
    opt->ring_bytes = SL_RING_MIN_BYTES;
  if (opt->ring_bytes > SL_RING_MAX_BYTES)
    fail("--ring-bytes is above the ring's maximum (1 GiB)");
  if (opt->pinger_cpu == opt->ponger_cpu)
    fprintf(stderr, "hop_latency: warning: both threads on CPU %d; the spin "
                    "mode will crawl\n",
            opt->pinger_cpu);
}

int main(int argc, char **argv) {
  options opt;
  parse_options(argc, argv, &opt);
  if (bench_allowed_cpu_count() < 2)
    fprintf(stderr, "hop_latency: warning: fewer than 2 CPUs allowed\n");
  uint64_t clock_overhead_ns = bench_clock_overhead_ns(10000);
  mode_result results[MODE_COUNT];
  memset(results, 0, sizeof results);
  for (int m = 0; m < MODE_COUNT; m++)
    if (opt.selected[m])
      run_mode((enum mode)m, &opt, &results[m]);
  print_results(&opt, results, clock_overhead_ns);
  printf("\n");
  return write_json(&opt, results, clock_overhead_ns) == 0 ? 0 : 1;
}
