/* inspect_internal.h — what inspect.c and inspect_savepoint.c share, and
 * nothing else includes. */
#ifndef SL_INSPECT_INTERNAL_H
#define SL_INSPECT_INTERNAL_H

#include <stddef.h>

/* Write the message (printf format) into err (err_bytes; either may be
 * 0: no message) and return rc, so a reader fails in one statement:
 * `return sl_inspect_fail(err, err_bytes, SL_ECORRUPT, "%s: ...", path)`. */
int sl_inspect_fail(char *err, size_t err_bytes, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif /* SL_INSPECT_INTERNAL_H */
