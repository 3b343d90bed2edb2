/* make_api.c — writes the store fixture tests/data/store_v2/api with the
 * store API of a format-2 sluice (store.h notes 1-3), following the rules
 * of tests/store_v2_fixture.h.  Not built by meson: it was run once,
 * against the tree at b113ecd (format 2), as
 *   cc -Istorage -Iinclude -Itests tests/data/store_v2/make_api.c \
 *      build/libsluice.a -llmdb -lxxhash -ljemalloc -ljansson \
 *      -lpthread -lm -o /tmp/make_api && /tmp/make_api DIR
 * and DIR/data.mdb committed.  Run against a newer format it would make a
 * store of that format instead: the fixture is the file, not this. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store.h"
#include "store_v2_fixture.h"

#define CHECK(call)                                                         \
  do {                                                                      \
    int rc_ = (call);                                                       \
    if (rc_) {                                                              \
      fprintf(stderr, "%s: %d %s\n", #call, rc_, sl_store_error(store));    \
      exit(1);                                                              \
    }                                                                       \
  } while (0)

static sl_store *store;

static void put(sl_store_txn *t, uint16_t op, uint32_t i, uint64_t v) {
  char key[16];
  int n = v2_fixture_key(i, key, sizeof key);
  CHECK(sl_store_put_state(t, op, v2_fixture_group(op, i), key, (uint32_t)n,
                           &v, sizeof v));
}

static void del(sl_store_txn *t, uint16_t op, uint32_t i) {
  char key[16];
  int n = v2_fixture_key(i, key, sizeof key);
  CHECK(sl_store_delete_state(t, op, v2_fixture_group(op, i), key,
                              (uint32_t)n));
}

static void row(sl_store_txn *t, int table, uint32_t i, uint64_t v) {
  char key[16];
  int n = snprintf(key, sizeof key, "r%u", i);
  if (v)
    CHECK(sl_store_put_row(t, table, key, (uint32_t)n, &v, sizeof v));
  else
    CHECK(sl_store_delete_row(t, table, key, (uint32_t)n));
}

static void blob(sl_store_txn *t, uint16_t op, unsigned id) {
  char text[64];
  int n = snprintf(text, sizeof text, "blob of op %u from checkpoint %u", op,
                   id);
  CHECK(sl_store_put_blob(t, op, 0, text, (uint32_t)n));
}

static void commit(sl_store_txn *t, uint64_t id) {
  char record[32];
  int n = snprintf(record, sizeof record, "record %u", (unsigned)id);
  CHECK(sl_store_commit(t, id, record, (uint32_t)n));
}

int main(int argc, char **argv) {
  if (argc != 2)
    return 2;
  char err[1024];
  sl_store_options o = {.graph_fingerprint = V2_FIXTURE_GRAPH};
  if (sl_store_open(argv[1], &o, &store, err, sizeof err))
    return fprintf(stderr, "%s\n", err), 1;
  sl_store_txn *t;
  int table;
  CHECK(sl_store_begin(store, &t));
  CHECK(sl_store_txn_table(t, V2_FIXTURE_TABLE, &table));
  for (uint32_t i = 0; i < V2_FIXTURE_KEYS; i++)
    put(t, 1, i, i + 1000u);
  for (uint32_t i = 0; i < 8; i++)
    row(t, table, i, i + 100u);
  blob(t, 1, 1), blob(t, 2, 1);
  commit(t, 1);
  CHECK(sl_store_compact(store, 1, NULL));
  CHECK(sl_store_begin(store, &t));
  CHECK(sl_store_txn_table(t, V2_FIXTURE_TABLE, &table));
  for (uint32_t i = 0; i < V2_FIXTURE_KEYS; i++)
    if (i % 5 == 0)
      del(t, 1, i);
    else if (i % 3 == 0)
      put(t, 1, i, i + 2000u);
  for (uint32_t i = 8; i < V2_FIXTURE_ROWS; i++)
    row(t, table, i, i + 200u);
  row(t, table, 2, 0);
  blob(t, 1, 2);
  commit(t, 2);
  CHECK(sl_store_begin(store, &t));
  CHECK(sl_store_txn_table(t, V2_FIXTURE_TABLE, &table));
  for (uint32_t i = 0; i < V2_FIXTURE_KEYS; i += 10)
    put(t, 1, i, i + 3000u);
  del(t, 1, 39);
  for (uint32_t i = 0; i < V2_FIXTURE_OP2_KEYS; i++)
    put(t, 2, i, v2_fixture_op2_value(i));
  row(t, table, 5, 555), row(t, table, 9, 0);
  blob(t, 1, 3);
  commit(t, 3);
  sl_store_close(store);
  return 0;
}
