/* test_cow_map_index.c — a dirty list that loses its index (cow_map.h
 * note 11): when no block can be had for it, the epoch goes on without
 * one.  The writer then follows the list, and the reclaim walk stops
 * fetching ahead until its chain has drained (storage/cow_map.c note 13).
 * The failure is made by sl_cow_map_test_fail_alloc at
 * SL_COW_FAIL_DIRTY_INDEX_BLOCK; everything else is the real map, checked
 * whole (sl_cow_map_check) after each step and against a model, with a
 * delta read by a thread of its own as the checkpoint writer reads it.
 * The last test does the same through a job (sl_testing_fail_state_index),
 * with the real checkpoint writer, LMDB and a resume from the store.
 */
#include <errno.h>

#include "sluice_testing.h"
#include "test_cow_map.h"
#include "test_dirs.h"
#include "test_util.h"

/* Enough keys for a list of three index blocks. */
#define KEYS (2u * SL_COW_INDEX_BLOCK + 500u)
#define VALUE_BYTES 16u

/* Write every key with seed + id, in the model too. */
static void write_all(sl_cow_map *map, model *expect, uint64_t seed) {
  for (uint64_t id = 0; id < KEYS; id++) {
    put_value(map, id, VALUE_BYTES, seed + id);
    model_set(expect, id, VALUE_BYTES, seed + id);
  }
}

/* Read d on a thread of its own, as the checkpoint writer does, into
 * durable (apply_delta also checks the index against the list where there
 * is one); the delta must name every key once. */
static void write_delta(const sl_cow_delta *d, model *durable) {
  writer_job job = {.state = durable, .count = 1};
  job.deltas[0] = *d;
  pthread_t thread;
  cr_assert_eq(pthread_create(&thread, 0, writer_main, &job), 0);
  cr_assert_eq(pthread_join(thread, 0), 0);
  cr_assert_eq(job.errors, 0, "the delta of epoch %u read wrong",
               (unsigned)d->epoch);
  cr_assert_eq(d->entries, KEYS);
}

/* The map checked whole and against expect, then freed with both models. */
static void check_and_free(sl_cow_map *map, model *expect, model *durable) {
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(model_diff_map(expect, map), 0);
  model_free(expect);
  model_free(durable);
  sl_cow_map_destroy(map);
}

static sl_cow_map *new_map(bool rollback) {
  sl_cow_map *map;
  cr_assert_eq(sl_cow_map_create(&map), 0);
  if (rollback)
    cr_assert_eq(sl_cow_map_enable_rollback(map), 0);
  return map;
}

/* The second block of a new epoch's index cannot be had: its first block
 * is freed, the delta has no index, and the writer's walk of the list
 * still finds every key; the next epoch has its index again. */
static void dropped_then_back(bool rollback) {
  sl_cow_map *map = new_map(rollback);
  model *expect = model_new(KEYS), *durable = model_new(KEYS);
  /* The same writes into a map whose index never fails. */
  sl_cow_map *control = new_map(rollback);
  model *unused = model_new(KEYS);
  write_all(control, unused, 1000);
  sl_cow_map_release(control, sl_cow_map_freeze(control).epoch);
  maintain_all(control);
  /* Before any lookup: lookups take rehash steps, which free memory. */
  uint64_t control_bytes = sl_cow_map_memory_bytes(control);
  model_free(unused);
  sl_cow_map_destroy(control);
  sl_cow_map_test_fail_alloc(map, SL_COW_FAIL_DIRTY_INDEX_BLOCK, 2);
  write_all(map, expect, 1000);
  cr_assert(sl_cow_map_check(map));
  sl_cow_delta d = sl_cow_map_freeze(map);
  cr_assert_null(d.index, "an index block failed: the epoch has none");
  write_delta(&d, durable);
  cr_assert(model_equal(durable, expect));
  sl_cow_map_release(map, d.epoch);
  maintain_all(map);
  /* Nothing of the dropped index is left in the map's count. */
  uint64_t bytes = sl_cow_map_memory_bytes(map);
  cr_assert_eq(bytes, control_bytes, "%lu bytes against %lu",
               (unsigned long)bytes, (unsigned long)control_bytes);
  cr_assert(sl_cow_map_check(map));
  cr_assert_eq(model_diff_map(expect, map), 0);

  write_all(map, expect, 2000);
  d = sl_cow_map_freeze(map);
  cr_assert_not_null(d.index, "the next epoch has its index again");
  write_delta(&d, durable);
  cr_assert(model_equal(durable, expect));
  sl_cow_map_release(map, d.epoch);
  maintain_all(map);
  check_and_free(map, expect, durable);
}

Test(cow_map_index, dropped_index_is_followed_by_the_list) {
  dropped_then_back(false);
}

Test(cow_map_index, dropped_index_is_followed_by_the_list_with_rollback) {
  dropped_then_back(true);
}

/* Three epochs pending: the first with its index, the second without
 * (its very first block failed), the third with one.  The first two are
 * released together: the reclaim chain holds an indexed list and then
 * an unindexed one, so it stops fetching ahead (note 13).  It is walked
 * in small steps, each checked, while the keys are written again; the
 * third epoch then joins an empty chain with its index, and fetching
 * ahead starts over. */
static void unindexed_list_in_the_chain(bool rollback) {
  sl_cow_map *map = new_map(rollback);
  model *expect = model_new(KEYS), *durable = model_new(KEYS);
  write_all(map, expect, 1000);
  sl_cow_delta first = sl_cow_map_freeze(map);
  cr_assert_not_null(first.index);
  write_delta(&first, durable);
  sl_cow_map_test_fail_alloc(map, SL_COW_FAIL_DIRTY_INDEX_BLOCK, 1);
  write_all(map, expect, 2000); /* copies: first's versions displaced */
  sl_cow_delta second = sl_cow_map_freeze(map);
  cr_assert_null(second.index);
  write_delta(&second, durable);
  write_all(map, expect, 3000);
  sl_cow_delta third = sl_cow_map_freeze(map);
  cr_assert_not_null(third.index);
  cr_assert(sl_cow_map_check(map));

  sl_cow_map_release(map, second.epoch);
  cr_assert(sl_cow_map_check(map));
  uint64_t steps = 0;
  for (uint32_t budget = 7; sl_cow_map_maintain(map, budget); budget += 5) {
    cr_assert(sl_cow_map_check(map), "after reclaim step %lu",
              (unsigned long)steps);
    if (++steps % 4 == 0) /* writes between the steps copy third's */
      put_value(map, steps % KEYS, VALUE_BYTES, 3000 + steps % KEYS);
  }
  cr_assert_gt(steps, 4, "walked in steps");
  cr_assert_eq(model_diff_map(expect, map), 0);

  write_delta(&third, durable);
  cr_assert(model_equal(durable, expect));
  sl_cow_map_release(map, third.epoch);
  for (uint32_t budget = 3; sl_cow_map_maintain(map, budget); budget += 11)
    cr_assert(sl_cow_map_check(map));
  check_and_free(map, expect, durable);
}

Test(cow_map_index, unindexed_list_in_the_reclaim_chain) {
  unindexed_list_in_the_chain(false);
}

Test(cow_map_index, unindexed_list_in_the_reclaim_chain_with_rollback) {
  unindexed_list_in_the_chain(true);
}

/* ------------------------------------------------------------ the writer */

#define JOB_KEYS 40000u

/* keyed source "src" (JOB_KEYS keys, count records) -> verifying sink
 * "verify" (two instances, one keyed-state map each) on dir, a
 * checkpoint every 5 ms, resumed from dir if it holds one.  4 KiB rings
 * and a sink that takes 20 us a record keep the source a few hundred
 * records ahead of the sink. */
static sl_job *verified_job(const char *dir, uint64_t count, sl_op **sink) {
  sl_job_config config = sl_fixture_config(dir, 5);
  config.checkpoint.store_policy = SL_STORE_RESUME;
  config.ring_bytes = 4096;
  config.faults = "slow:op=verify,delay_us=20";
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  sl_op *src;
  cr_assert_eq(sl_source_keyed(job, "src", 1, count, JOB_KEYS, &src), 0);
  cr_assert_eq(sl_sink_verify(job, "verify", src, 2, count, JOB_KEYS, sink),
               0);
  return job;
}

/* The same through a whole job, with the real checkpoint writer and LMDB.
 * In each map the second index block fails (sl_testing_fail_state_index).
 * An epoch here holds a few hundred keys a map, so that is the second
 * epoch's first block: that epoch reaches the writer without an index,
 * and the writer follows its list (engine/checkpoint_writer.c,
 * collect_all).  A writer that skipped the first version of such a list
 * fails this test (tried: 2 out of order).  The first run is stopped
 * with a savepoint once the source has emitted a quarter of the keys
 * (5,000 a map: past the second block however the epochs fall), so
 * every key it wrote was written once: its state is in one epoch's delta only,
 * which the stop's checkpoint makes durable if no earlier one did.  The
 * second run resumes from the store and sends every key again: a key
 * whose state the writer left out would expect its first record again
 * and count the second as lost; one written wrong fails the restore. */
Test(cow_map_index, checkpoint_writer_follows_an_unindexed_list,
     .timeout = 300) {
  char *dir = sl_test_temp_dir("cow-map-index");
  const uint64_t count = 2 * JOB_KEYS;
  sl_op *sink;
  sl_job *job = verified_job(dir, count, &sink);
  cr_assert_eq(sl_testing_fail_state_index(job, 2), 0);
  sl_test_watchdog w;
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  sl_test_watchdog_arm(&w, job, 120, "the first run");
  for (int i = 0; i < 60000 && sl_job_progress(job) < JOB_KEYS / 4; i++)
    sl_test_sleep_us(1000);
  cr_assert_geq(sl_job_progress(job), JOB_KEYS / 4, "the source stalled");
  /* The second pass over the keys is 30,000 records away, at least 0.3 s
   * at the sink's pace: the stop lands well before it. */
  char err[256] = "";
  int rc = EBUSY;
  for (int i = 0; i < 1000 && rc == EBUSY; i++) /* a checkpoint holds it */
    if ((rc = sl_job_stop_with_savepoint(job, NULL, 0, NULL, err,
                                         sizeof err)) == EBUSY)
      sl_test_sleep_us(1000);
  cr_assert_eq(rc, 0, "%s: %s", sl_strerror(rc), err);
  cr_assert_eq(sl_job_wait(job), 0, "%s", sl_job_error(job));
  cr_assert_not(sl_test_watchdog_disarm(&w), "the first run hung");
  sl_verify_counts v;
  cr_assert_eq(sl_verify_result(sink, &v), 0);
  cr_assert_lt(v.records, JOB_KEYS, "the stop came after the first pass");
  /* Stopped before its end: lost counts what was still to come. */
  cr_assert_eq(v.duplicates + v.out_of_order, 0);
  cr_assert_eq(sl_testing_state_index_drops(job), 2,
               "each map lost one epoch's index");
  sl_job_destroy(job);

  job = verified_job(dir, count, &sink);
  sl_test_watchdog_arm(&w, job, 120, "the resumed run");
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  cr_assert_eq(sl_job_wait(job), 0, "%s", sl_job_error(job));
  cr_assert_not(sl_test_watchdog_disarm(&w), "the resumed run hung");
  cr_assert_eq(sl_verify_result(sink, &v), 0);
  cr_assert_eq(v.lost + v.duplicates + v.out_of_order, 0,
               "lost %lu, duplicates %lu, out of order %lu",
               (unsigned long)v.lost, (unsigned long)v.duplicates,
               (unsigned long)v.out_of_order);
  cr_assert(v.complete);
  cr_assert_eq(sl_testing_state_index_drops(job), 0);
  sl_job_destroy(job);
  sl_test_remove_tree(dir);
}
