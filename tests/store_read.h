/* store_read.h — the store opened for the tests that write stores, damage
 * them and read them back (test_corrupt.c, test_store_counts.c): opened
 * to write, and one read of its keyed state (open read-only, which walks
 * the file; count what a range reads; keep the message).  Nothing here is
 * a test.
 */
#ifndef SL_TEST_STORE_READ_H
#define SL_TEST_STORE_READ_H

#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>

#include "store.h"

/* The store in dir opened to write (graph fingerprint "g", no fsync);
 * the open must succeed. */
static inline sl_store *store_open_writer(const char *dir) {
  sl_store *st;
  char err[1024];
  sl_store_options rw = {.graph_fingerprint = "g", .no_sync = 1};
  cr_assert_eq(sl_store_open(dir, &rw, &st, err, sizeof err), 0, "%s", err);
  return st;
}

static inline int store_read_count_entry(void *arg, uint16_t key_group,
                                         const void *key, uint32_t key_bytes,
                                         const void *value,
                                         uint32_t value_bytes) {
  (void)key_group, (void)key, (void)key_bytes, (void)value, (void)value_bytes;
  ++*(uint64_t *)arg;
  return 0;
}

/* Reads op's key groups [first, last] of the store in dir, read-only: the
 * result; *entries the entries read; err the store's message.  The open
 * must succeed (a damaged file these tests make passes the open's walk). */
static inline int store_read_range(const char *dir, uint16_t op,
                                   uint16_t first, uint16_t last,
                                   uint64_t *entries, char *err,
                                   size_t err_bytes) {
  sl_store *st;
  sl_store_options ro = {.read_only = 1};
  int rc = sl_store_open(dir, &ro, &st, err, err_bytes);
  cr_assert_eq(rc, 0, "the store must open (its walk passes): %s", err);
  *entries = 0;
  rc = sl_store_read_state(st, op, first, last, store_read_count_entry,
                           entries);
  snprintf(err, err_bytes, "%s", sl_store_error(st));
  sl_store_close(st);
  return rc;
}

#endif
