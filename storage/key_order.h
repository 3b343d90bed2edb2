/* key_order.h — the byte order of keys shared by the store, its chunks
 * and the copy-on-write map's bulk load: LMDB's default comparison
 * (memcmp over the shorter length, then the shorter key first), inline
 * and 8 bytes a step.
 */
#ifndef SL_KEY_ORDER_H
#define SL_KEY_ORDER_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* 8 bytes as a big-endian number: comparing two of them compares the
 * bytes as memcmp does. */
static inline uint64_t load_be64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, sizeof v);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}

/* LMDB's default key order: memcmp, then the shorter key first.  Inline
 * and 8 bytes a step, as the merged view compares every key (store_view.c note
 * 1): the last step reads the final 8 bytes, overlapping bytes already equal.
 */
static inline int key_compare(const uint8_t *a, size_t a_bytes,
                              const uint8_t *b, size_t b_bytes) {
  size_t common = a_bytes < b_bytes ? a_bytes : b_bytes;
  if (common >= 8) {
    for (size_t at = 0;; at += 8) { /* common / 8 + 1 steps at most */
      if (at + 8 > common)
        at = common - 8;
      uint64_t x = load_be64(a + at), y = load_be64(b + at);
      if (x != y)
        return x < y ? -1 : 1;
      if (at + 8 == common)
        break;
    }
  } else {
    int diff = memcmp(a, b, common);
    if (diff != 0)
      return diff;
  }
  return (a_bytes > b_bytes) - (a_bytes < b_bytes);
}

#endif /* SL_KEY_ORDER_H */
