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

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
 * (damage). */
int chunk_reader_next(chunk_reader *r, chunk_entry *e, const char **problem);

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
 * of note 1.  Returns 0 or ENOMEM. */
int chunk_builder_add(chunk_builder *b, uint16_t group, const void *key,
                      uint16_t key_bytes, const void *value,
                      uint32_t value_bytes);

/* Removes the newest entry (a newer version of its key replaces it). */
void chunk_builder_drop_last(chunk_builder *b);

/* Writes the head; the chunk is then buffer[0, bytes). */
void chunk_builder_close(chunk_builder *b);

void chunk_builder_free(chunk_builder *b);

#endif /* SL_CHUNK_H */
