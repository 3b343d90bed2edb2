/* op_util.h — small helpers the operators share (op_util.c): growing a
 * working buffer, writing a refusal into a caller's text buffer, and
 * handing a builder's config copy to its operator.
 * Private to operators/.
 */
#ifndef SLUICE_OP_UTIL_H
#define SLUICE_OP_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "sluice.h"

int op_grow_slow(void **buffer, uint64_t *capacity, uint64_t need,
                 size_t unit, uint64_t max_bytes);

/* *buffer holds at least need units of unit bytes (*capacity counts
 * units): 0; EINVAL when need units are over max_bytes; ENOMEM.  On error
 * the buffer and *capacity are unchanged.  Inline because the usual case,
 * room already, is one compare on a per-record path. */
static inline int op_grow(void **buffer, uint64_t *capacity, uint64_t need,
                          size_t unit, uint64_t max_bytes) {
  if (need <= *capacity)
    return 0;
  return op_grow_slow(buffer, capacity, need, unit, max_bytes);
}

/* v as 4 big-endian bytes: sequence numbers in state keys sort. */
static inline void op_store_be32(uint8_t *out, uint32_t v) {
  out[0] = (uint8_t)(v >> 24);
  out[1] = (uint8_t)(v >> 16);
  out[2] = (uint8_t)(v >> 8);
  out[3] = (uint8_t)v;
}

/* Format fmt into text (text_bytes; nothing when text is NULL or
 * text_bytes is 0) and return code: one line for a check that refuses
 * with a reason. */
int op_errorf(int code, char *text, size_t text_bytes, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The end of a builder that hands its own copy of the config (user) to
 * the operator it just added, rc being the add's status: on success *op
 * frees user with free_fn when the job is destroyed; on failure user is
 * freed now.  Returns rc. */
int op_adopt(int rc, sl_op **op, void *user, void (*free_fn)(void *));

#endif
