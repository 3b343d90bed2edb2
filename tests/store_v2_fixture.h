/* store_v2_fixture.h — what the store fixture tests/data/store_v2/api
 * holds, as rules both its generator (tests/data/store_v2/make_api.c,
 * built once against the format-2 sluice) and test_upgrade.c follow, so
 * the test derives every expected entry instead of listing it.
 *
 * Three checkpoints, a compaction after the first (so the merged view has
 * a base and a log), tombstones in the second, a key put again after its
 * tombstone in the third, two operators, blobs rewritten and kept, and a
 * table with rows put, replaced and deleted.
 */
#ifndef SL_STORE_V2_FIXTURE_H
#define SL_STORE_V2_FIXTURE_H

#include <stdint.h>
#include <stdio.h>

#define V2_FIXTURE_GRAPH "upgrade-fixture: op 1 keyed, op 2 keyed"
#define V2_FIXTURE_KEYS 40u   /* keys k0 .. k39 of op 1 */
#define V2_FIXTURE_OP2_KEYS 6u /* keys k0 .. k5 of op 2, checkpoint 3 */
#define V2_FIXTURE_ROWS 12u   /* rows r0 .. r11 of table "totals" */
#define V2_FIXTURE_LATEST 3u
#define V2_FIXTURE_TABLE "totals"

/* op 1's key i lives in key group i % 7; op 2's in i % 3. */
static inline uint16_t v2_fixture_group(uint16_t op, uint32_t i) {
  return (uint16_t)(op == 1 ? i % 7 : i % 3);
}

/* The merged value of op 1's key i after checkpoint 3: 0 if absent.
 * Checkpoint 1 puts every key with value i + 1000; checkpoint 2 deletes
 * keys divisible by 5 and puts i + 2000 for keys divisible by 3;
 * checkpoint 3 puts i + 3000 for keys divisible by 10 (resurrecting
 * them) and deletes key 39. */
static inline uint64_t v2_fixture_value(uint32_t i) {
  if (i == 39)
    return 0;
  if (i % 10 == 0)
    return i + 3000u;
  if (i % 5 == 0)
    return 0;
  if (i % 3 == 0)
    return i + 2000u;
  return i + 1000u;
}

/* op 2's key i (checkpoint 3 only). */
static inline uint64_t v2_fixture_op2_value(uint32_t i) { return i * 7u + 1; }

/* Row i of the table after checkpoint 3: 0 if absent.  Checkpoint 1 puts
 * rows 0..7 = i + 100, checkpoint 2 puts rows 8..11 = i + 200 and deletes
 * row 2, checkpoint 3 replaces row 5 with 555 and deletes row 9. */
static inline uint64_t v2_fixture_row(uint32_t i) {
  if (i == 2 || i == 9)
    return 0;
  if (i == 5)
    return 555;
  return i < 8 ? i + 100u : i + 200u;
}

/* The blob of (op, instance 0) after checkpoint 3: op 1's was last
 * written by checkpoint 3, op 2's by checkpoint 1 (kept since). */
static inline int v2_fixture_blob(uint16_t op, char *out, size_t n) {
  return snprintf(out, n, "blob of op %u from checkpoint %u", (unsigned)op,
                  op == 1 ? 3u : 1u);
}

static inline int v2_fixture_key(uint32_t i, char *out, size_t n) {
  return snprintf(out, n, "k%u", (unsigned)i);
}

#endif /* SL_STORE_V2_FIXTURE_H */
