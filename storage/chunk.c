/* chunk.c — the one job: build and read chunks (chunk.h notes 1, 2); the
 * reading and the adding of each entry are inline in chunk.h
 * (chunk_reader_next, chunk_builder_add). */
#include "chunk.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

static inline void put32(uint8_t *p, uint32_t v) {
  chunk_put16(p, (uint16_t)v);
  chunk_put16(p + 2, (uint16_t)(v >> 16));
}

/* ------------------------------------------------------------ reading */

bool chunk_peek_range(const uint8_t *chunk, size_t bytes, uint32_t *first,
                      uint32_t *last) {
  if (bytes < CHUNK_HEAD_BYTES)
    return false;
  uint32_t op = chunk_le16(chunk);
  *first = op << 16 | chunk_le16(chunk + 2);
  *last = op << 16 | chunk_le16(chunk + 4);
  return true;
}

const char *chunk_reader_open(chunk_reader *r, const uint8_t *chunk,
                              size_t bytes) {
  memset(r, 0, sizeof *r);
  if (bytes < CHUNK_HEAD_BYTES)
    return "chunk shorter than its head";
  r->op = chunk_le16(chunk);
  r->first_group = chunk_le16(chunk + 2);
  r->last_group = chunk_le16(chunk + 4);
  r->left = chunk_le32(chunk + 8);
  if (chunk_le16(chunk + 6) != 0 || r->first_group > r->last_group)
    return "chunk head is malformed";
  /* Every entry takes at least a tombstone's head. */
  if (r->left == 0 ||
      r->left > (bytes - CHUNK_HEAD_BYTES) / CHUNK_TOMB_HEAD_BYTES)
    return "chunk's entry count does not fit it";
  r->at = chunk + CHUNK_HEAD_BYTES;
  r->end = chunk + bytes;
  return 0;
}

/* ------------------------------------------------------------ building */

/* Room for more bytes in the buffer, doubled from 64 KiB. */
int chunk_builder_room(chunk_builder *b, size_t more) {
  if (more <= b->capacity - b->bytes)
    return 0;
  size_t want = b->bytes + more;
  size_t grown = b->capacity < (64u << 10) ? (64u << 10) : b->capacity;
  for (int i = 0; i < 64 && grown < want; i++) /* doubling reaches any size */
    grown = grown > SIZE_MAX / 2 ? want : 2 * grown;
  uint8_t *bigger = realloc(b->buffer, grown);
  if (!bigger)
    return ENOMEM;
  b->buffer = bigger;
  b->capacity = grown;
  return 0;
}

int chunk_builder_start(chunk_builder *b, uint16_t op) {
  b->bytes = 0;
  b->count = 0;
  b->op = op;
  b->last_at = 0;
  int rc = chunk_builder_room(b, CHUNK_HEAD_BYTES);
  if (rc == 0)
    b->bytes = CHUNK_HEAD_BYTES; /* the head is written by the close */
  return rc;
}

void chunk_builder_drop_last(chunk_builder *b) {
  assert(b->count > 0);
  b->bytes = b->last_at;
  b->count--;
  /* The entry before is the chunk's last again: the chunk may be closed
   * before the newer version is added (it may not fit), and the head must
   * then name that entry's group.  first_group stays right as long as an
   * entry of it remains or is added again. */
  b->last_group = b->prev_last_group;
  b->last_at = 0; /* only the newest entry may be dropped */
}

void chunk_builder_close(chunk_builder *b) {
  assert(b->count > 0);
  chunk_put16(b->buffer, b->op);
  chunk_put16(b->buffer + 2, b->first_group);
  chunk_put16(b->buffer + 4, b->last_group);
  chunk_put16(b->buffer + 6, 0);
  put32(b->buffer + 8, b->count);
}

void chunk_builder_free(chunk_builder *b) {
  free(b->buffer);
  memset(b, 0, sizeof *b);
}
