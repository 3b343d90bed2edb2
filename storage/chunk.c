/* chunk.c — the one job: build and read chunks (chunk.h notes 1, 2). */
#include "chunk.h"
#include "key_order.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

static inline uint16_t le16(const uint8_t *p) {
  return (uint16_t)(p[0] | (unsigned)p[1] << 8);
}

static inline uint32_t le32(const uint8_t *p) {
  return (uint32_t)le16(p) | (uint32_t)le16(p + 2) << 16;
}

static inline void put16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}

static inline void put32(uint8_t *p, uint32_t v) {
  put16(p, (uint16_t)v);
  put16(p + 2, (uint16_t)(v >> 16));
}

/* ------------------------------------------------------------ reading */

bool chunk_peek_range(const uint8_t *chunk, size_t bytes, uint32_t *first,
                      uint32_t *last) {
  if (bytes < CHUNK_HEAD_BYTES)
    return false;
  uint32_t op = le16(chunk);
  *first = op << 16 | le16(chunk + 2);
  *last = op << 16 | le16(chunk + 4);
  return true;
}

const char *chunk_reader_open(chunk_reader *r, const uint8_t *chunk,
                              size_t bytes) {
  memset(r, 0, sizeof *r);
  if (bytes < CHUNK_HEAD_BYTES)
    return "chunk shorter than its head";
  r->op = le16(chunk);
  r->first_group = le16(chunk + 2);
  r->last_group = le16(chunk + 4);
  r->left = le32(chunk + 8);
  if (le16(chunk + 6) != 0 || r->first_group > r->last_group)
    return "chunk head is malformed";
  /* Every entry takes at least a tombstone's head. */
  if (r->left == 0 ||
      r->left > (bytes - CHUNK_HEAD_BYTES) / CHUNK_TOMB_HEAD_BYTES)
    return "chunk's entry count does not fit it";
  r->at = chunk + CHUNK_HEAD_BYTES;
  r->end = chunk + bytes;
  return 0;
}

/* Key order of chunk.h note 1 (bytes, then the shorter first).  Every
 * entry read is checked against the one before, so keys are compared
 * inline, 8 bytes a step (key_order.h): calls of memcmp, here
 * and in the map's load, were 15% of a restore's user time (perf). */
static int entry_order(const chunk_entry *a, const chunk_entry *b) {
  if (a->prefix != b->prefix)
    return a->prefix < b->prefix ? -1 : 1;
  return key_compare(a->key, a->key_bytes, b->key, b->key_bytes);
}

/* The entry at r->at into *e, every length checked (note 2). */
static const char *entry_decode(chunk_reader *r, chunk_entry *e) {
  size_t room = (size_t)(r->end - r->at);
  if (room < CHUNK_TOMB_HEAD_BYTES)
    return "entry head runs past the chunk";
  const uint8_t *p = r->at;
  uint16_t group = le16(p);
  e->kind = p[2];
  e->key_bytes = le16(p + 3);
  size_t head = CHUNK_TOMB_HEAD_BYTES;
  e->value_bytes = 0;
  if (e->kind == CHUNK_PUT) {
    if (room < CHUNK_PUT_HEAD_BYTES)
      return "entry head runs past the chunk";
    e->value_bytes = le32(p + 5);
    head = CHUNK_PUT_HEAD_BYTES;
  } else if (e->kind != CHUNK_TOMBSTONE) {
    return "entry is neither a put nor a tombstone";
  }
  if ((size_t)e->key_bytes > room - head ||
      (size_t)e->value_bytes > room - head - e->key_bytes)
    return "entry runs past the chunk";
  if (group < r->first_group || group > r->last_group)
    return "entry's key group is outside the chunk's";
  e->prefix = (uint32_t)r->op << 16 | group;
  e->key = p + head;
  e->value = e->key + e->key_bytes;
  r->at = e->value + e->value_bytes;
  return 0;
}

int chunk_reader_next(chunk_reader *r, chunk_entry *e, const char **problem) {
  if (r->left == 0) {
    if (r->at != r->end) {
      *problem = "chunk holds bytes after its last entry";
      return -1;
    }
    if (r->has_last && (r->last.prefix & 0xffffu) != r->last_group) {
      *problem = "chunk's last entry is not in its last key group";
      return -1;
    }
    return 0;
  }
  *problem = entry_decode(r, e);
  if (*problem)
    return -1;
  if (!r->has_last && (e->prefix & 0xffffu) != r->first_group) {
    *problem = "chunk's first entry is not in its first key group";
    return -1;
  }
  if (r->has_last && entry_order(&r->last, e) >= 0) {
    *problem = "chunk's keys are not in ascending order";
    return -1;
  }
  /* Only what entry_order reads, field by field: a copy of the whole
   * entry read it back with 16-byte loads right after entry_decode's
   * narrower stores, which the store buffer cannot forward, and that
   * stall was half of this function's time in a restore. */
  r->last.prefix = e->prefix;
  r->last.key = e->key;
  r->last.key_bytes = e->key_bytes;
  r->has_last = true;
  r->left--;
  return 1;
}

/* ------------------------------------------------------------ building */

/* Room for more bytes in the buffer, doubled from 64 KiB. */
static int builder_room(chunk_builder *b, size_t more) {
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
  int rc = builder_room(b, CHUNK_HEAD_BYTES);
  if (rc == 0)
    b->bytes = CHUNK_HEAD_BYTES; /* the head is written by the close */
  return rc;
}

int chunk_builder_add(chunk_builder *b, uint16_t group, const void *key,
                      uint16_t key_bytes, const void *value,
                      uint32_t value_bytes) {
  assert(b->bytes >= CHUNK_HEAD_BYTES); /* started */
  bool tombstone = value == 0;
  size_t need = chunk_entry_bytes(tombstone, key_bytes, value_bytes);
  int rc = builder_room(b, need);
  if (rc != 0)
    return rc;
  uint8_t *p = b->buffer + b->bytes;
  put16(p, group);
  p[2] = tombstone ? CHUNK_TOMBSTONE : CHUNK_PUT;
  put16(p + 3, key_bytes);
  size_t head = CHUNK_TOMB_HEAD_BYTES;
  if (!tombstone) {
    put32(p + 5, value_bytes);
    head = CHUNK_PUT_HEAD_BYTES;
  }
  if (key_bytes > 0)
    memcpy(p + head, key, key_bytes);
  if (!tombstone && value_bytes > 0)
    memcpy(p + head + key_bytes, value, value_bytes);
  if (b->count == 0)
    b->first_group = group;
  assert(b->count == 0 || group >= b->last_group);
  b->prev_last_group = b->last_group;
  b->last_group = group;
  b->last_at = b->bytes;
  b->bytes += need;
  b->count++;
  return 0;
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
  put16(b->buffer, b->op);
  put16(b->buffer + 2, b->first_group);
  put16(b->buffer + 4, b->last_group);
  put16(b->buffer + 6, 0);
  put32(b->buffer + 8, b->count);
}

void chunk_builder_free(chunk_builder *b) {
  free(b->buffer);
  memset(b, 0, sizeof *b);
}
