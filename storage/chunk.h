/* chunk.h — the one job: the byte layout of a chunk, the unit in which
 * store format 3 keeps keyed state (store.h note 1): building one in a
 * buffer and reading one back, checking every length against its end.
 * LMDB, checksums and keys are the store's (store_txn.c, store_view.c,
 * store_compact.c); a chunk is the payload of one LMDB value.
 *
 * NOTES ON THE DESIGN
 *
 * 1. A chunk holds entries of ONE operator in strictly ascending (key
 *    group, key bytes) order, keys compared as LMDB compares them (bytes,
 *    then the shorter first).  Layout, little-endian:
 *      head:  u16 op, u16 first key group, u16 last key group, u16 0,
 *             u32 entry count                         (CHUNK_HEAD_BYTES)
 *      entry: u16 key group, u8 kind (1 put, 2 tombstone), u16 key bytes,
 *             then for a put u32 value bytes; then the key, then the
 *             value (a tombstone has none)
 *    The head's groups are the first and the last entry's.  An entry
 *    never spans two chunks: a chunk is closed before an entry that would
 *    take it past CHUNK_TARGET_BYTES, so a chunk is at most the target or
 *    one entry (a value of any size gets a chunk of its own if need be).
 * 2. The reader trusts nothing: a count, a length or a group that leaves
 *    the chunk, a kind that is neither, a group outside the head's range,
 *    or a key not above the one before is damage, reported as a problem
 *    text (the caller names store, database and key: SL_ECORRUPT).  A
 *    checksum over the whole chunk is checked by the store before the
 *    reader sees it; these checks keep a chunk with a right checksum but
 *    wrong contents (the fuzz target plants such) from misleading a merge.
 */
#ifndef SL_CHUNK_H
#define SL_CHUNK_H

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "key_order.h"

#define CHUNK_HEAD_BYTES 12u
/* About 1 MiB a chunk: large enough that a checkpoint of millions of
 * changes is a few hundred LMDB values written as runs of overflow pages,
 * small enough that a restore of a few key groups reads little more than
 * it needs and a chunk's build buffer stays in the cache's reach. */
#define CHUNK_TARGET_BYTES (1u << 20)
#define CHUNK_PUT_HEAD_BYTES 9u  /* group, kind, key bytes, value bytes */
#define CHUNK_TOMB_HEAD_BYTES 5u /* group, kind, key bytes */

enum { CHUNK_PUT = 1, CHUNK_TOMBSTONE = 2 };

/* One entry read from a chunk; key and value point into the chunk. */
typedef struct chunk_entry {
  uint32_t prefix; /* op << 16 | key group: the state key's first 4 bytes */
  uint32_t value_bytes;
  const uint8_t *key;
  const uint8_t *value;
  uint16_t key_bytes;
  uint8_t kind;
} chunk_entry;

typedef struct chunk_reader {
  const uint8_t *at;
  const uint8_t *end;
  uint32_t left; /* entries not yet read */
  uint16_t op;
  uint16_t first_group;
  uint16_t last_group;
  bool has_last; /* last holds the previous entry (the order check) */
  chunk_entry last;
} chunk_reader;

/* The bytes an entry takes in a chunk. */
static inline size_t chunk_entry_bytes(bool tombstone, uint32_t key_bytes,
                                       uint32_t value_bytes) {
  return (tombstone ? CHUNK_TOMB_HEAD_BYTES : CHUNK_PUT_HEAD_BYTES) +
         (size_t)key_bytes + (tombstone ? 0u : (size_t)value_bytes);
}

/* Reads the head of a chunk of bytes bytes: NULL, or the problem. */
const char *chunk_reader_open(chunk_reader *r, const uint8_t *chunk,
                              size_t bytes);

/* The next entry into *e: 1, or 0 after the last (the chunk must then be
 * used up exactly; *e is left as it was), or -1 with *problem set
 * (damage).  Inline, below: a restore calls it for every entry. */
static inline int chunk_reader_next(chunk_reader *r, chunk_entry *e,
                                    const char **problem);

/* The head's range, without a full open: for choosing chunks by range.
 * false if the chunk is too short to have a head. */
bool chunk_peek_range(const uint8_t *chunk, size_t bytes, uint32_t *first,
                      uint32_t *last);

/* A chunk being built: a buffer that grows, reused chunk after chunk. */
typedef struct chunk_builder {
  uint8_t *buffer;
  size_t bytes; /* used, head included */
  size_t capacity;
  size_t last_at; /* offset of the newest entry (chunk_builder_drop_last) */
  uint32_t count;
  uint16_t op;
  uint16_t first_group;
  uint16_t last_group;
  uint16_t prev_last_group; /* last_group before the newest entry */
} chunk_builder;

/* Starts an empty chunk of op.  Returns 0 or ENOMEM. */
int chunk_builder_start(chunk_builder *b, uint16_t op);

/* Appends an entry (value NULL: a tombstone).  The caller keeps the order
 * of note 1.  Returns 0 or ENOMEM.  Inline, below: a checkpoint calls it
 * for every change. */
static inline int chunk_builder_add(chunk_builder *b, uint16_t group,
                                    const void *key, uint16_t key_bytes,
                                    const void *value, uint32_t value_bytes);

/* Makes room for more bytes (chunk_builder_add's slow path).  Returns 0
 * or ENOMEM (the buffer is then as it was). */
int chunk_builder_room(chunk_builder *b, size_t more);

/* Removes the newest entry (a newer version of its key replaces it). */
void chunk_builder_drop_last(chunk_builder *b);

/* Writes the head; the chunk is then buffer[0, bytes). */
void chunk_builder_close(chunk_builder *b);

void chunk_builder_free(chunk_builder *b);

/* ------------------------------------------------------------ reading
 *
 * Inline: store_view.c reads every entry of a restore through
 * chunk_reader_next, and as a call from chunk.c (saving and restoring
 * registers, its checks not folded into the caller's) it made reading a
 * 1M-key store of 1M + 1M entries take 33 ms of CPU; inline, 25. */

static inline uint16_t chunk_le16(const uint8_t *p) {
  return (uint16_t)(p[0] | (unsigned)p[1] << 8);
}

static inline uint32_t chunk_le32(const uint8_t *p) {
  return (uint32_t)chunk_le16(p) | (uint32_t)chunk_le16(p + 2) << 16;
}

/* Key order of note 1 (bytes, then the shorter first).  Every
 * entry read is checked against the one before, so keys are compared
 * inline, 8 bytes a step (key_order.h): calls of memcmp, here
 * and in the map's load, were 15% of a restore's user time (perf). */
static inline int chunk_entry_order(const chunk_entry *a,
                                    const chunk_entry *b) {
  if (a->prefix != b->prefix)
    return a->prefix < b->prefix ? -1 : 1;
  return key_compare(a->key, a->key_bytes, b->key, b->key_bytes);
}

/* The entry at r->at into *e, every length checked (note 2). */
static inline const char *chunk_entry_decode(chunk_reader *r,
                                             chunk_entry *e) {
  size_t room = (size_t)(r->end - r->at);
  if (room < CHUNK_TOMB_HEAD_BYTES)
    return "entry head runs past the chunk";
  const uint8_t *p = r->at;
  uint16_t group = chunk_le16(p);
  e->kind = p[2];
  e->key_bytes = chunk_le16(p + 3);
  size_t head = CHUNK_TOMB_HEAD_BYTES;
  e->value_bytes = 0;
  if (e->kind == CHUNK_PUT) {
    if (room < CHUNK_PUT_HEAD_BYTES)
      return "entry head runs past the chunk";
    e->value_bytes = chunk_le32(p + 5);
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

static inline int chunk_reader_next(chunk_reader *r, chunk_entry *e,
                                    const char **problem) {
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
  *problem = chunk_entry_decode(r, e);
  if (*problem)
    return -1;
  if (!r->has_last && (e->prefix & 0xffffu) != r->first_group) {
    *problem = "chunk's first entry is not in its first key group";
    return -1;
  }
  if (r->has_last && chunk_entry_order(&r->last, e) >= 0) {
    *problem = "chunk's keys are not in ascending order";
    return -1;
  }
  /* Only what chunk_entry_order reads, field by field: a copy of the
   * whole entry read it back with 16-byte loads right after the decode's
   * narrower stores, which the store buffer cannot forward, and that
   * stall was half of this function's time in a restore. */
  r->last.prefix = e->prefix;
  r->last.key = e->key;
  r->last.key_bytes = e->key_bytes;
  r->has_last = true;
  r->left--;
  return 1;
}

/* ------------------------------------------------------------ building
 *
 * Inline with a copy of its own for short keys and values: a checkpoint
 * of 1M changes calls it a million times, with keys and values of 8-16
 * bytes, each of which was a call of memcpy. */

/* Copies n bytes; 8 to 16 as two 8-byte moves (they may overlap). */
static inline void chunk_copy(uint8_t *to, const void *from, size_t n) {
  const uint8_t *f = from;
  if (n >= 8 && n <= 16) {
    uint64_t head, tail;
    memcpy(&head, f, 8);
    memcpy(&tail, f + n - 8, 8);
    memcpy(to, &head, 8);
    memcpy(to + n - 8, &tail, 8);
  } else if (n > 0) {
    memcpy(to, f, n);
  }
}

static inline void chunk_put16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}

static inline int chunk_builder_add(chunk_builder *b, uint16_t group,
                                    const void *key, uint16_t key_bytes,
                                    const void *value, uint32_t value_bytes) {
  assert(b->bytes >= CHUNK_HEAD_BYTES); /* started */
  bool tombstone = value == 0;
  size_t need = chunk_entry_bytes(tombstone, key_bytes, value_bytes);
  if (need > b->capacity - b->bytes && chunk_builder_room(b, need) != 0)
    return ENOMEM;
  uint8_t *p = b->buffer + b->bytes;
  chunk_put16(p, group);
  p[2] = tombstone ? CHUNK_TOMBSTONE : CHUNK_PUT;
  chunk_put16(p + 3, key_bytes);
  size_t head = CHUNK_TOMB_HEAD_BYTES;
  if (!tombstone) {
    chunk_put16(p + 5, (uint16_t)value_bytes);
    chunk_put16(p + 7, (uint16_t)(value_bytes >> 16));
    head = CHUNK_PUT_HEAD_BYTES;
  }
  chunk_copy(p + head, key, key_bytes);
  if (!tombstone)
    chunk_copy(p + head + key_bytes, value, value_bytes);
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

#endif /* SL_CHUNK_H */
