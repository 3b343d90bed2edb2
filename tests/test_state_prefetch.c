/* test_state_prefetch.c — keyed state fetched ahead (runtime.c note 13,
 * sl_cow_map_prefetch): a hint that must never change what a job
 * computes, whatever its guess.
 *
 * The map-level test calls the prefetch on a map in every condition a
 * lookup meets (growing, rehashing, frozen versions, a bulk load under
 * way) and checks the map is what it was.  The job-level tests run a keyed
 * operator whose state is large enough to be prefetched (20,000 keys,
 * several MB, over state.c's SL_PREFETCH_MIN_STATE_BYTES) and whose
 * state calls switch between ids and kinds from record to record, so the
 * guessed (id, kind) and the hashes computed for it are wrong for many
 * records; every key's final figures are checked against closed forms.
 * They run with two prefetch stages, as a state of that size does, and
 * with the third (a chain's second entry: sl_testing_state_chain_prefetch)
 * forced on. */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cow_map.h"
#include "fixtures.h"
#include "sluice.h"
#include "sluice_testing.h"
#include "test_util.h"

/* ------------------------------------------------------------ the map */

static uint64_t key_hash_of(uint64_t id) {
  return sl_cow_key_of(&id, sizeof id).hash;
}

/* Every key 0 .. n-1 holds id * 3 (8 bytes), and nothing else. */
static void expect_contents(sl_cow_map *map, uint64_t n) {
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(sl_cow_map_count(map), n);
  for (uint64_t id = 0; id < n; id++) {
    uint32_t bytes = 0;
    const void *v = sl_cow_map_get(map, &id, sizeof id, &bytes);
    cr_assert_not_null(v, "key %" PRIu64 " lost", id);
    cr_assert_eq(bytes, 8);
    uint64_t got;
    memcpy(&got, v, 8);
    cr_assert_eq(got, id * 3, "key %" PRIu64 ": %" PRIu64, id, got);
  }
}

/* Every stage for keys first .. first + count - 1 (present or not). */
static void prefetch_keys(const sl_cow_map *map, uint64_t first,
                          uint32_t count) {
  uint64_t hashes[SL_COW_PREFETCH_MAX];
  cr_assert(count <= SL_COW_PREFETCH_MAX);
  for (uint32_t i = 0; i < count; i++)
    hashes[i] = key_hash_of(first + i);
  sl_cow_map_prefetch(map, hashes, count, 0);
  sl_cow_map_prefetch(map, hashes, count, 1);
  sl_cow_map_prefetch(map, hashes, count, 2); /* chains' second entries */
}

Test(map, prefetch_changes_nothing_while_growing_frozen_or_loading) {
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  prefetch_keys(map, 0, SL_COW_PREFETCH_MAX); /* empty */
  uint64_t n = 5000;
  for (uint64_t id = 0; id < n; id++) {
    uint64_t value = id * 3;
    cr_assert_not_null(sl_cow_map_put(map, &id, sizeof id, &value, 8));
    /* Between puts, so also while a rehash is under way (cow_map.c
     * note 6): both tables are read. */
    prefetch_keys(map, id, 7);
    prefetch_keys(map, id + n, 3); /* absent keys */
  }
  expect_contents(map, n);
  /* Frozen versions: the prefetch reads chains that hold them. */
  sl_cow_delta delta = sl_cow_map_freeze(map);
  cr_assert_eq(delta.entries, n);
  for (uint64_t first = 0; first < 2 * n; first += SL_COW_PREFETCH_MAX)
    prefetch_keys(map, first, SL_COW_PREFETCH_MAX);
  expect_contents(map, n);
  sl_cow_map_release(map, delta.epoch);
  while (sl_cow_map_maintain(map, 1024))
    ;
  expect_contents(map, n);
  sl_cow_map_destroy(map);

  /* A bulk load under way: entries wait outside the table (cow_map.c
   * note 10); the prefetch must leave them alone. */
  cr_assert_eq(sl_cow_map_create(&map), 0);
  cr_assert_eq(sl_cow_map_reserve(map, n), 0);
  for (uint64_t id = 0; id < n; id++) {
    uint64_t value = id * 3;
    cr_assert_eq(sl_cow_map_load_add(map, 0, &id, sizeof id, &value, 8), 0);
    if (id % 100 == 0)
      prefetch_keys(map, id, 16);
  }
  cr_assert_eq(sl_cow_map_load_finish(map), 0);
  expect_contents(map, n);
  sl_cow_map_destroy(map);
}

/* ------------------------------------------------------------ a job */

#define KEYS 20000u
#define ID_SUM 0
#define ID_ODD 1
#define ID_FOLD 2

/* What the operator emits for each record: the key's running figures. */
typedef struct figures {
  uint64_t key;
  uint64_t sum;  /* of every value: ID_SUM, updated for every record */
  uint64_t odd;  /* of odd values: ID_ODD, updated for those only */
  uint64_t fold; /* of values divisible by 3: ID_FOLD, a fold state */
  uint64_t seen; /* records of the key: ID_SUM's get after the update */
} figures;

static void fold_add(void *user, void *acc, const void *value,
                     uint32_t value_bytes) {
  (void)user;
  (void)value_bytes;
  uint64_t a, v;
  memcpy(&a, acc, 8);
  memcpy(&v, value, 8);
  a += v;
  memcpy(acc, &a, 8);
}

/* State ids and kinds change from record to record (odd values update a
 * second value state, multiples of 3 a fold state), so the runtime's
 * guess of the next call is often wrong: its prefetch, and the hash it
 * computed for its guess (state.c's memo), must then go unused. */
static int figures_process(sl_ctx *ctx, void *state, int input,
                           const sl_record *in) {
  (void)state;
  (void)input;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  static const uint64_t zero[2];
  figures f = {.key = t.key};
  int rc = 0;
  if (t.value % 3 == 0) { /* first, so it is sometimes the last guess */
    const void *acc;
    rc = sl_state_fold(ctx, ID_FOLD, zero, 8, fold_add, 0, &t.value, 8,
                       &acc);
    if (rc)
      return rc;
    memcpy(&f.fold, acc, 8);
  } else {
    const void *v;
    uint32_t bytes;
    rc = sl_state_get(ctx, ID_FOLD, &v, &bytes); /* a value state: absent */
    if (rc != SL_ENOTFOUND)
      return rc ? rc : -EINVAL;
  }
  void *p;
  rc = sl_state_update(ctx, ID_SUM, 16, zero, &p);
  if (rc)
    return rc;
  uint64_t pair[2];
  memcpy(pair, p, 16);
  pair[0] += t.value;
  pair[1] += 1;
  memcpy(p, pair, 16);
  f.sum = pair[0];
  f.seen = pair[1];
  if (t.value & 1) {
    rc = sl_state_update(ctx, ID_ODD, 8, zero, &p);
    if (rc)
      return rc;
    memcpy(&f.odd, p, 8);
    f.odd += t.value;
    memcpy(p, &f.odd, 8);
  }
  return sl_emit(ctx, &f, sizeof f);
}

/* The sink keeps each key's last figures (the odd and fold sums of the
 * last record that carried them). */
typedef struct last_figures {
  figures per_key[KEYS];
  uint64_t records;
  bool bad;
} last_figures;

static int last_open(sl_ctx *ctx, void *user, void **state) {
  (void)ctx;
  *state = user;
  return 0;
}

static int last_process(sl_ctx *ctx, void *state, int input,
                        const sl_record *in) {
  (void)ctx;
  (void)input;
  last_figures *l = state;
  figures f;
  memcpy(&f, in->data, sizeof f);
  if (f.key >= KEYS) {
    l->bad = true;
    return -EINVAL;
  }
  figures *k = &l->per_key[f.key];
  k->key = f.key;
  k->sum = f.sum;
  k->seen = f.seen;
  if (f.odd)
    k->odd = f.odd;
  if (f.fold)
    k->fold = f.fold;
  l->records++;
  return 0;
}

/* Run source -> key_by -> figures -> sink over n records of KEYS keys
 * with the given chaining, and check every key's figures.  With
 * chain_prefetch the third prefetch stage (a chain's second entry) runs
 * whatever the state's size; without, the state (a few MiB) is below the
 * size it runs from by default, and it must not run. */
static void run_and_check(uint64_t n, int chaining, bool chain_prefetch) {
  sl_job_config config = {.struct_bytes = sizeof config,
                          .chaining = chaining};
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  sl_op *source, *keyed, *proc, *sink;
  cr_assert_eq(sl_source_sequence(job, "seq", 1, n, KEYS, &source), 0);
  cr_assert_eq(sl_op_key_by(job, "by-key", source, sl_fixture_tuple_key, 0,
                            &keyed), 0);
  static const sl_process_ops ops = {.process = figures_process};
  cr_assert_eq(sl_op_process(job, "figures", &keyed, 1, 1, &ops, 0, &proc),
               0);
  last_figures *l = calloc(1, sizeof *l);
  cr_assert_not_null(l);
  static const sl_process_ops sink_ops = {.open = last_open,
                                          .process = last_process};
  cr_assert_eq(sl_op_sink(job, "last", proc, 1, &sink_ops, l, &sink), 0);
  if (chain_prefetch)
    cr_assert_eq(sl_testing_state_chain_prefetch(job, 0), 0);
  int rc = sl_job_run(job);
  cr_assert_eq(rc, 0, "job: %s", sl_strerror(rc));
  uint64_t chain_slices = sl_testing_state_chain_prefetches(job);
  sl_job_destroy(job);
  if (chain_prefetch) /* the state passes 256 KiB early in the run */
    cr_assert_gt(chain_slices, 0);
  else
    cr_assert_eq(chain_slices, 0);
  cr_assert(!l->bad);
  cr_assert_eq(l->records, n);
  /* Key k gets values k + KEYS j, j = 0 .. n_k - 1. */
  for (uint64_t k = 0; k < KEYS; k++) {
    uint64_t nk = n / KEYS + (k < n % KEYS);
    uint64_t sum = 0, odd = 0, fold = 0;
    for (uint64_t j = 0; j < nk; j++) {
      uint64_t v = k + (uint64_t)KEYS * j;
      sum += v;
      odd += (v & 1) ? v : 0;
      fold += v % 3 == 0 ? v : 0;
    }
    const figures *f = &l->per_key[k];
    cr_assert_eq(f->seen, nk, "key %" PRIu64 ": %" PRIu64 " records, "
                 "expected %" PRIu64, k, f->seen, nk);
    cr_assert_eq(f->sum, sum, "key %" PRIu64 ": sum", k);
    cr_assert_eq(f->odd, odd, "key %" PRIu64 ": odd sum", k);
    cr_assert_eq(f->fold, fold, "key %" PRIu64 ": fold", k);
  }
  free(l);
}

Test(job, mixed_state_calls_on_a_prefetched_state_chained, .timeout = 120) {
  run_and_check(sl_test_scaled(400000, 3 * KEYS), SL_CHAINING_ALWAYS, false);
}

Test(job, mixed_state_calls_on_a_prefetched_state_threaded, .timeout = 120) {
  run_and_check(sl_test_scaled(400000, 3 * KEYS), SL_CHAINING_NEVER, false);
}

/* The same with the third stage (runtime.c note 13), which reads the
 * chains' first entries and fetches past those that hold other keys. */
Test(job, mixed_state_calls_with_chains_fetched_ahead_chained,
     .timeout = 120) {
  run_and_check(sl_test_scaled(400000, 3 * KEYS), SL_CHAINING_ALWAYS, true);
}

Test(job, mixed_state_calls_with_chains_fetched_ahead_threaded,
     .timeout = 120) {
  run_and_check(sl_test_scaled(400000, 3 * KEYS), SL_CHAINING_NEVER, true);
}

Test(job, chain_prefetch_setter_refuses_a_started_or_missing_job) {
  cr_assert_eq(sl_testing_state_chain_prefetch(0, 0), EINVAL);
  cr_assert_eq(sl_testing_state_chain_prefetches(0), 0);
  sl_job_config config = SL_JOB_CONFIG_INIT;
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  sl_op *source, *sink;
  cr_assert_eq(sl_source_sequence(job, "seq", 1, 10, 10, &source), 0);
  sl_checksum sum = {0};
  cr_assert_eq(sl_sink_checksum(job, "sink", source, 1, &sum, &sink), 0);
  cr_assert_eq(sl_job_run(job), 0);
  cr_assert_eq(sum.records, 10);
  cr_assert_eq(sl_testing_state_chain_prefetch(job, 0), SL_ESTARTED);
  sl_job_destroy(job);
}
