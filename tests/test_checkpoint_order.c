/* test_checkpoint_order.c — the order in which the checkpoint writer hands
 * a checkpoint's changes to the store (engine/checkpoint_writer.c,
 * collect_sorted): versions of one state key must reach it oldest first,
 * or an older version overwrites the newest.
 *
 * The case that needs care: a key deleted in its own epoch becomes a
 * tombstone in place and stays on the dirty list, and a put of the same
 * key in that epoch adds a second version to the same list
 * (storage/cow_map.c).  Both reach the writer with the same key and the
 * same epoch; the writer's bucket step is not stable, so only its
 * tie-break (tombstones first) keeps the put.  The job below makes every
 * such sequence, many times per key, over thousands of keys in every key
 * group, and the test reads the store afterwards: each key must hold
 * exactly what the last record for it left, or be absent.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "sluice_testing.h" /* unstable test helpers */
#include "test_dirs.h"
#include "test_util.h"

#include "store.h"

#define ORDER_STATE_ID 1
#define ORDER_ROUNDS 12u /* records per key: each round one of three steps */

static uint64_t order_keys(void) { return sl_test_scaled(20000, 3000); }

/* What round r of key k does to its value state (v: the record's value),
 * by step (r + k) % 3, so the last round leaves each of the three ends
 * on a third of the keys:
 *   0: put v
 *   1: delete (if present), then put v + 1: after a round 2 or 1 in the
 *      same epoch, a tombstone and a live version of the key on one list
 *   2: put v, then delete: the key ends deleted */
static uint64_t order_step(uint64_t round, uint64_t key) {
  return (round + key) % 3;
}

static int order_process(sl_ctx *ctx, void *state, int input,
                         const sl_record *in) {
  (void)state;
  (void)input;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  uint64_t step = order_step(t.value / order_keys(), t.key), v = t.value;
  int rc = 0;
  if (step == 1) {
    rc = sl_state_delete(ctx, ORDER_STATE_ID);
    if (rc == SL_ENOTFOUND)
      rc = 0;
    v++;
  }
  if (rc == 0)
    rc = sl_state_put(ctx, ORDER_STATE_ID, &v, sizeof v, 0);
  if (rc == 0 && step == 2)
    rc = sl_state_delete(ctx, ORDER_STATE_ID);
  return rc;
}

/* The keyed state the store holds, by record key: found[k] set and
 * value[k] the stored value. */
typedef struct order_read {
  uint64_t keys;
  uint64_t entries;
  uint64_t duplicates;
  uint64_t bad;
  bool *found;
  uint64_t *value;
} order_read;

static int order_collect(void *arg, uint16_t key_group, const void *key,
                         uint32_t key_bytes, const void *value,
                         uint32_t value_bytes) {
  (void)key_group;
  order_read *r = arg;
  r->entries++;
  if (key_bytes < 8 || value_bytes != 8) {
    r->bad++;
    return 0;
  }
  const uint8_t *p = key;
  uint64_t k = 0;
  for (int b = 0; b < 8; b++)
    k = k << 8 | p[b]; /* big-endian record key (engine/state.c) */
  if (k >= r->keys) {
    r->bad++;
    return 0;
  }
  r->duplicates += r->found[k];
  r->found[k] = true;
  memcpy(&r->value[k], value, 8);
  return 0;
}

/* Runs the job to its end (its final checkpoint holds every change) with
 * a checkpoint every interval_ms, then checks the store key by key. */
static void run_and_check(uint32_t interval_ms) {
  char *state = sl_test_temp_dir("order");
  uint64_t keys = order_keys(), records = keys * ORDER_ROUNDS;
  sl_job_config config = sl_fixture_config(state, interval_ms);
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  sl_op *src, *by, *keep;
  /* One source instance: each key's records arrive in order. */
  cr_assert_eq(sl_source_sequence(job, "source", 1, records, keys, &src), 0);
  cr_assert_eq(sl_op_key_by(job, "by", src, sl_fixture_tuple_key, 0, &by), 0);
  static const sl_process_ops ops = {.process = order_process};
  cr_assert_eq(sl_op_sink(job, "keep", by, 2, &ops, 0, &keep), 0);
  cr_assert_eq(sl_job_run(job), 0, "%s", sl_job_error(job));
  sl_job_destroy(job);

  sl_store_options options = {.read_only = 1};
  sl_store *store;
  char err[512];
  cr_assert_eq(sl_store_open(state, &options, &store, err, sizeof err), 0,
               "%s", err);
  order_read r = {.keys = keys,
                  .found = calloc(keys, sizeof(bool)),
                  .value = calloc(keys, sizeof(uint64_t))};
  cr_assert(r.found && r.value);
  /* Operators by id: source 0, by 1, keep 2; reading every one of them
   * finds keyed state only in keep's. */
  for (uint16_t op = 0; op < 3; op++)
    cr_assert_eq(sl_store_read_state(store, op, 0, UINT16_MAX,
                                     order_collect, &r), 0, "%s",
                 sl_store_error(store));
  sl_store_close(store);
  cr_expect_eq(r.bad, 0);
  cr_expect_eq(r.duplicates, 0);
  uint64_t wrong = 0, expected_entries = 0;
  for (uint64_t k = 0; k < keys; k++) {
    uint64_t last_round = ORDER_ROUNDS - 1, v = last_round * keys + k;
    bool present = order_step(last_round, k) != 2;
    uint64_t want = order_step(last_round, k) == 1 ? v + 1 : v;
    expected_entries += present;
    wrong += r.found[k] != present || (present && r.value[k] != want);
  }
  cr_expect_eq(wrong, 0, "%" PRIu64 " of %" PRIu64 " keys hold the wrong "
               "state", wrong, keys);
  cr_expect_eq(r.entries, expected_entries);
  free(r.found);
  free(r.value);
  sl_test_remove_tree(state);
}

TestSuite(checkpoint_order, .timeout = 240);

/* Interval far beyond the run: one epoch, written by the final
 * checkpoint, holds every sequence of all the rounds. */
Test(checkpoint_order, delete_and_put_again_in_one_epoch_keeps_the_put) {
  run_and_check(3600000);
}

/* Checkpoints every millisecond as well: the rounds are spread over many
 * epochs and deltas (the result must not depend on where they fall). */
Test(checkpoint_order, the_newest_version_wins_across_many_checkpoints) {
  run_and_check(1);
}
