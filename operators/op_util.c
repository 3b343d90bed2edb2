/* op_util.c — small helpers the operators share: growing a working buffer
 * by doubling, formatting a refusal into a caller's buffer, and handing a
 * builder's config copy to its operator.
 */
#include "op_util.h"

#include "internal.h"

#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>

int op_grow_slow(void **buffer, uint64_t *capacity, uint64_t need,
                 size_t unit, uint64_t max_bytes) {
  assert(unit > 0);
  if (need <= *capacity)
    return 0;
  if (need > max_bytes / unit)
    return EINVAL; /* beyond any value the caller may hold */
  /* At least 16 units and 256 bytes at first: few reallocs for small
   * records.  Doubling, then clamped to max_bytes (still >= need). */
  uint64_t cap = max_bytes / unit;
  uint64_t n = *capacity ? *capacity : 16;
  while (n * unit < 256 && n < cap)
    n *= 2;
  while (n < need)
    n *= 2;
  if (n > cap)
    n = cap;
  if (n * unit > SIZE_MAX)
    return ENOMEM;
  void *p = realloc(*buffer, (size_t)(n * unit));
  if (!p)
    return ENOMEM;
  *buffer = p;
  *capacity = n;
  return 0;
}

int op_errorf(int code, char *text, size_t text_bytes, const char *fmt,
              ...) {
  if (text && text_bytes) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, text_bytes, fmt, ap);
    va_end(ap);
  }
  return code;
}

int op_adopt(int rc, sl_op **op, void *user, void (*free_fn)(void *)) {
  assert(free_fn);
  if (rc) {
    free_fn(user); /* the builder's copy: nobody else holds it */
    return rc;
  }
  assert(op && *op && (*op)->user == user);
  rc = sl_op_set_user_free(*op, free_fn);
  assert(rc == 0); /* a fresh built-in: nobody owns its pointer yet */
  return rc;
}
