/* lmdb_check.c — the validated walk of an LMDB data file (lmdb_check.h
 * holds the design notes 1-7).
 *
 * NOTES ON THE IMPLEMENTATION
 *
 * 1. Every field is read with memcpy from a page buffer at an offset the
 *    code has checked against the page size first, so a hostile file
 *    cannot move a read outside its buffer.  The buffers are the walker's
 *    own: one a tree level (a branch's keys bound its children, so the
 *    parent's page stays readable while a child is walked), one for the
 *    nodes of the page being checked, one for a free-list value.
 * 2. Recursion is bounded by SL_LMDB_CHECK_DEPTH_MAX (a tree's depth is
 *    checked against it before its walk starts), loops by the page's node
 *    count, which lower bounds; the number of pages walked by the
 *    bitmap: each page is read at most once.
 * 3. walker_check() states what holds between pages: the level buffers
 *    exist, the counts never exceed the pages of the file.
 */
#include "lmdb_check.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sluice.h"

/* The format (lmdb_check.h note 1). */
#define PAGE_HEADER_BYTES 16u
#define NODE_HEADER_BYTES 8u
#define DB_RECORD_BYTES 48u
#define META_BYTES 136u
#define META_MAGIC 0xBEEFC0DEu
#define DATA_VERSION 1u
#define P_BRANCH 0x01u
#define P_LEAF 0x02u
#define P_OVERFLOW 0x04u
#define P_META 0x08u
#define F_BIGDATA 0x01u
#define F_SUBDATA 0x02u
#define F_DUPDATA 0x04u
#define FLAG_INTEGERKEY 0x08u
#define PAGE_INVALID UINT64_MAX
#define KEY_MAX_BYTES 511u /* LMDB's default largest key */
#define PAGE_MIN_BYTES 512u
#define PAGE_MAX_BYTES 32768u /* MAX_PAGESIZE without MDB_DEVEL */
#define NUM_METAS 2u

_Static_assert(PAGE_HEADER_BYTES + META_BYTES < PAGE_MIN_BYTES,
               "a meta page holds its record");
_Static_assert(sizeof(size_t) == 8 && sizeof(void *) == 8,
               "the 64-bit format: pgno_t and size_t are 8 bytes");

typedef struct db_record {
  uint32_t pad;
  uint16_t flags;
  uint16_t depth;
  uint64_t branch_pages, leaf_pages, overflow_pages, entries, root;
} db_record;

typedef struct meta_page {
  uint64_t pgno;
  uint16_t page_flags;
  uint32_t magic, version;
  uint64_t map_bytes;
  db_record dbs[2]; /* [0] the free list, [1] the main database */
  uint64_t last_page, txnid;
} meta_page;

/* A key bound from a parent; data NULL: none. */
typedef struct bound {
  const uint8_t *data;
  size_t bytes;
} bound;

/* A node of the page being checked, as read from it. */
typedef struct node {
  uint32_t offset, bytes; /* where it lies in the page, rounded up even */
  uint16_t flags, key_bytes;
  uint32_t data_bytes; /* leaf: the value's size */
  uint64_t child;      /* branch: the child page */
  const uint8_t *key;
  const uint8_t *data; /* leaf: in the page (BIGDATA: the pgno) */
} node;

enum tree_kind { TREE_MAIN, TREE_NAMED, TREE_FREE };

typedef struct walker {
  int fd;
  const char *name;
  uint32_t page_bytes;
  uint64_t last_page, txnid;
  uint8_t *live, *freed; /* one bit a page number (note 2) */
  uint8_t *levels[SL_LMDB_CHECK_DEPTH_MAX]; /* malloc'd when reached */
  /* One node array a level, and one more: the scratch of nodes_packed. */
  node *nodes[SL_LMDB_CHECK_DEPTH_MAX + 1];
  uint8_t *value; /* an overflow value of the free list */
  size_t value_capacity;
  db_record named[SL_LMDB_CHECK_DBS_MAX];
  char named_names[SL_LMDB_CHECK_DBS_MAX][40];
  uint32_t named_count;
  /* The tree being walked. */
  enum tree_kind kind;
  const char *tree;
  uint16_t depth;
  uint64_t branch_pages, leaf_pages, overflow_pages, entries;
  sl_lmdb_check_stats stats;
  char *err;
  size_t err_bytes;
} walker;

__attribute__((format(printf, 3, 4))) static int
check_fail(walker *w, int rc, const char *format, ...) {
  if (!w->err || w->err_bytes == 0)
    return rc;
  int at = snprintf(w->err, w->err_bytes, "%s%s: ", w->name,
                    rc == SL_ECORRUPT ? " is damaged" : "");
  if (at < 0 || (size_t)at >= w->err_bytes)
    return rc;
  va_list args;
  va_start(args, format);
  vsnprintf(w->err + at, w->err_bytes - (size_t)at, format, args);
  va_end(args);
  return rc;
}

#define CORRUPT(w, ...) check_fail((w), SL_ECORRUPT, __VA_ARGS__)

__attribute__((unused)) /* asserts only */
static bool walker_check(const walker *w) {
  assert(w->page_bytes >= PAGE_MIN_BYTES && w->page_bytes <= PAGE_MAX_BYTES);
  assert((w->page_bytes & (w->page_bytes - 1)) == 0);
  assert(w->live && w->freed);
  assert(w->depth <= SL_LMDB_CHECK_DEPTH_MAX);
  assert(w->stats.pages_read <= w->last_page + 1);
  assert(w->named_count <= SL_LMDB_CHECK_DBS_MAX);
  return true;
}

static uint16_t load16(const uint8_t *p) {
  uint16_t v;
  memcpy(&v, p, sizeof v);
  return v;
}
static uint32_t load32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, sizeof v);
  return v;
}
static uint64_t load64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, sizeof v);
  return v;
}

/* pread of exactly bytes; a short read (the file shrank) is corruption. */
static int read_at(walker *w, void *buf, size_t bytes, uint64_t offset) {
  size_t done = 0;
  /* Bounded: each pass reads at least one byte or returns. */
  while (done < bytes) {
    ssize_t got = pread(w->fd, (uint8_t *)buf + done, bytes - done,
                        (off_t)(offset + done));
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0)
      return check_fail(w, errno, "read at byte %" PRIu64 ": %s",
                        offset + done, strerror(errno));
    if (got == 0)
      return CORRUPT(w, "ends at byte %" PRIu64 ", inside page %" PRIu64,
                     offset + done, (offset + done) / w->page_bytes);
    done += (size_t)got;
  }
  return 0;
}

static void record_load(const uint8_t *p, db_record *r) {
  r->pad = load32(p);
  r->flags = load16(p + 4);
  r->depth = load16(p + 6);
  r->branch_pages = load64(p + 8);
  r->leaf_pages = load64(p + 16);
  r->overflow_pages = load64(p + 24);
  r->entries = load64(p + 32);
  r->root = load64(p + 40);
}

static void meta_load(const uint8_t *page, meta_page *m) {
  const uint8_t *p = page + PAGE_HEADER_BYTES;
  m->pgno = load64(page);
  m->page_flags = load16(page + 10);
  m->magic = load32(p);
  m->version = load32(p + 4);
  m->map_bytes = load64(p + 16);
  record_load(p + 24, &m->dbs[0]);
  record_load(p + 24 + DB_RECORD_BYTES, &m->dbs[1]);
  m->last_page = load64(p + 120);
  m->txnid = load64(p + 128);
}

/* Marks pgno in bitmap; false if it was marked already. */
static bool mark(uint8_t *bitmap, uint64_t pgno) {
  uint8_t bit = (uint8_t)(1u << (pgno & 7));
  if (bitmap[pgno >> 3] & bit)
    return false;
  bitmap[pgno >> 3] |= bit;
  return true;
}

/* LMDB's default order (memcmp, then the shorter first), or for the free
 * list MDB_INTEGERKEY: native u64 (its keys are checked to be 8 bytes). */
static int key_compare(const walker *w, const uint8_t *a, size_t a_bytes,
                       const uint8_t *b, size_t b_bytes) {
  if (w->kind == TREE_FREE) {
    uint64_t x = load64(a), y = load64(b);
    return x < y ? -1 : x > y;
  }
  size_t n = a_bytes < b_bytes ? a_bytes : b_bytes;
  int c = n ? memcmp(a, b, n) : 0;
  if (c != 0)
    return c;
  return a_bytes < b_bytes ? -1 : a_bytes > b_bytes;
}

static int node_order(const void *a, const void *b) {
  uint32_t x = ((const node *)a)->offset, y = ((const node *)b)->offset;
  return x < y ? -1 : x > y;
}

/* Reads node i of page p (note 1: every offset checked before use). */
static int node_read(walker *w, const uint8_t *p, uint64_t pgno, bool leaf,
                     uint32_t i, uint16_t upper, node *out) {
  uint32_t offset = load16(p + PAGE_HEADER_BYTES + 2 * i);
  if (offset < upper || offset % 2 != 0 ||
      offset + NODE_HEADER_BYTES > w->page_bytes)
    return CORRUPT(w, "page %" PRIu64 " of %s: node %" PRIu32
                   " at offset %" PRIu32 " lies outside [%u, %" PRIu32 ")",
                   pgno, w->tree, i, offset, upper, w->page_bytes);
  const uint8_t *n = p + offset;
  out->offset = offset;
  out->flags = load16(n + 4);
  out->key_bytes = load16(n + 6);
  out->key = n + NODE_HEADER_BYTES;
  uint64_t bytes = NODE_HEADER_BYTES + (uint64_t)out->key_bytes;
  if (leaf) {
    out->data_bytes = load32(n);
    out->data = out->key + out->key_bytes;
    bytes += (out->flags & F_BIGDATA) ? sizeof(uint64_t) : out->data_bytes;
  } else {
    out->child = (uint64_t)load32(n) | (uint64_t)out->flags << 32;
    out->data_bytes = 0;
    out->data = 0;
  }
  bytes += bytes & 1; /* LMDB keeps nodes at even offsets */
  if (out->key_bytes > KEY_MAX_BYTES || offset + bytes > w->page_bytes)
    return CORRUPT(w, "page %" PRIu64 " of %s: node %" PRIu32 " (key %u "
                   "bytes) runs past the end of the page",
                   pgno, w->tree, i, out->key_bytes);
  out->bytes = (uint32_t)bytes;
  return 0;
}

/* The nodes of a page lie side by side, from upper to the end of the
 * page, none overlapping (LMDB's deletes move the bytes between upper
 * and a node by its size: an overlap would move them out). */
static int nodes_packed(walker *w, const node *nodes, uint32_t count,
                        uint64_t pgno, uint16_t upper, node *scratch) {
  memcpy(scratch, nodes, count * sizeof *nodes);
  qsort(scratch, count, sizeof *scratch, node_order);
  for (uint32_t i = 1; i < count; i++)
    if (scratch[i - 1].offset + scratch[i - 1].bytes != scratch[i].offset)
      return CORRUPT(w, "page %" PRIu64 " of %s: the nodes at offsets %"
                     PRIu32 " and %" PRIu32 " overlap or leave a gap", pgno,
                     w->tree, scratch[i - 1].offset, scratch[i].offset);
  /* LMDB packs nodes from upper to the page's end (mdb_node_add takes
   * room at upper, mdb_node_del closes the hole). */
  if (scratch[0].offset != upper ||
      scratch[count - 1].offset + scratch[count - 1].bytes != w->page_bytes)
    return CORRUPT(w, "page %" PRIu64 " of %s: its nodes do not fill "
                   "[upper %u, %" PRIu32 ")", pgno, w->tree, upper,
                   w->page_bytes);
  return 0;
}

/* Node keys in order and within the parent's bounds (lmdb_check.h note
 * 3).  A branch's first key is not used by LMDB: skipped. */
static int keys_ordered(walker *w, const node *nodes, uint32_t count,
                        bool leaf, uint64_t pgno, bound low, bound high) {
  for (uint32_t i = leaf ? 0 : 1; i < count; i++) {
    const node *n = &nodes[i];
    if (w->kind == TREE_FREE && n->key_bytes != sizeof(uint64_t))
      return CORRUPT(w, "page %" PRIu64 " of %s: key %" PRIu32 " is %u "
                     "bytes, not a u64 txnid", pgno, w->tree, i,
                     n->key_bytes);
    bool after_previous =
        i == (leaf ? 0u : 1u) ||
        key_compare(w, nodes[i - 1].key, nodes[i - 1].key_bytes, n->key,
                    n->key_bytes) < 0;
    bool in_bounds =
        (!low.data || key_compare(w, low.data, low.bytes, n->key,
                                  n->key_bytes) <= 0) &&
        (!high.data ||
         key_compare(w, n->key, n->key_bytes, high.data, high.bytes) < 0);
    if (!after_previous || !in_bounds)
      return CORRUPT(w, "page %" PRIu64 " of %s: key %" PRIu32 " is out of "
                     "order", pgno, w->tree, i);
  }
  return 0;
}

/* The overflow run of a F_BIGDATA value (lmdb_check.h note 4); for the
 * free list its bytes go to w->value. */
static int overflow_check(walker *w, uint64_t pgno, uint32_t value_bytes) {
  if (pgno < NUM_METAS || pgno > w->last_page)
    return CORRUPT(w, "%s: overflow page %" PRIu64 " is beyond the last "
                   "page, %" PRIu64, w->tree, pgno, w->last_page);
  uint8_t header[PAGE_HEADER_BYTES];
  int rc = read_at(w, header, sizeof header, pgno * w->page_bytes);
  if (rc != 0)
    return rc;
  uint64_t count = load32(header + 12);
  uint64_t needed =
      (PAGE_HEADER_BYTES - 1 + (uint64_t)value_bytes) / w->page_bytes + 1;
  if (load64(header) != pgno || load16(header + 10) != P_OVERFLOW ||
      count < needed || count > w->last_page + 1 - pgno)
    return CORRUPT(w, "overflow page %" PRIu64 " of %s has a bad header "
                   "(number, flags or page count %" PRIu64 ")",
                   pgno, w->tree, count);
  for (uint64_t i = 0; i < count; i++)
    if (!mark(w->live, pgno + i))
      return CORRUPT(w, "page %" PRIu64 " of %s is reached twice",
                     pgno + i, w->tree);
  w->overflow_pages += count;
  w->stats.pages_read += count;
  if (w->kind != TREE_FREE)
    return 0;
  if (value_bytes > w->value_capacity) {
    uint8_t *bigger = realloc(w->value, value_bytes);
    if (!bigger)
      return check_fail(w, ENOMEM, "out of memory");
    w->value = bigger;
    w->value_capacity = value_bytes;
  }
  return read_at(w, w->value, value_bytes,
                 pgno * w->page_bytes + PAGE_HEADER_BYTES);
}

/* One free-list record: txnid -> ID list (lmdb_check.h note 5). */
static int free_record_check(walker *w, const node *n, const uint8_t *value) {
  uint64_t txnid = load64(n->key);
  uint64_t capacity = n->data_bytes / sizeof(uint64_t);
  uint64_t count = n->data_bytes >= sizeof(uint64_t) ? load64(value) : 0;
  if (txnid > w->txnid || capacity == 0 || count > capacity - 1)
    return CORRUPT(w, "free-list record of txn %" PRIu64 " is malformed "
                   "(%" PRIu64 " pages in %" PRIu32 " bytes)",
                   txnid, count, n->data_bytes);
  uint64_t previous = UINT64_MAX;
  for (uint64_t i = 1; i <= count; i++) {
    uint64_t pgno = load64(value + i * sizeof(uint64_t));
    if (pgno < NUM_METAS || pgno > w->last_page || pgno >= previous)
      return CORRUPT(w, "free-list record of txn %" PRIu64 ": page %" PRIu64
                     " is out of range or order", txnid, pgno);
    if (!mark(w->freed, pgno))
      return CORRUPT(w, "page %" PRIu64 " is in the free list twice", pgno);
    previous = pgno;
  }
  w->stats.free_pages += count;
  return 0;
}

/* A leaf node's value (lmdb_check.h notes 4 and 5). */
static int leaf_node_check(walker *w, const node *n, uint64_t pgno) {
  if ((n->flags & ~(F_BIGDATA | F_SUBDATA)) != 0 ||
      (n->flags & F_SUBDATA &&
       (w->kind != TREE_MAIN || n->flags & F_BIGDATA ||
        n->data_bytes != DB_RECORD_BYTES)))
    return CORRUPT(w, "page %" PRIu64 " of %s: a node has flags 0x%x, "
                   "which this database does not use", pgno, w->tree,
                   n->flags);
  w->entries++;
  const uint8_t *value = n->data;
  if (n->flags & F_BIGDATA) {
    int rc = overflow_check(w, load64(n->data), n->data_bytes);
    if (rc != 0)
      return rc;
    value = w->value;
  }
  if (w->kind == TREE_FREE)
    return free_record_check(w, n, value);
  if (!(n->flags & F_SUBDATA))
    return 0;
  if (w->named_count == SL_LMDB_CHECK_DBS_MAX)
    return CORRUPT(w, "more than %d named databases",
                   SL_LMDB_CHECK_DBS_MAX);
  uint32_t k = w->named_count++;
  record_load(n->data, &w->named[k]);
  size_t shown = n->key_bytes < sizeof w->named_names[k] - 1
                     ? n->key_bytes
                     : sizeof w->named_names[k] - 1;
  for (size_t i = 0; i < shown; i++) /* printable, for messages */
    w->named_names[k][i] =
        n->key[i] >= 0x20 && n->key[i] < 0x7f ? (char)n->key[i] : '?';
  w->named_names[k][shown] = 0;
  return 0;
}

static int page_walk(walker *w, uint64_t pgno, int level, bound low,
                     bound high);

/* The children of branch page p at level (keys bound them). */
static int branch_walk(walker *w, const node *nodes, uint32_t count,
                       int level, bound low, bound high) {
  for (uint32_t i = 0; i < count; i++) {
    bound child_low = i == 0 ? low : (bound){nodes[i].key, nodes[i].key_bytes};
    bound child_high = i + 1 == count
                           ? high
                           : (bound){nodes[i + 1].key, nodes[i + 1].key_bytes};
    int rc = page_walk(w, nodes[i].child, level + 1, child_low, child_high);
    if (rc != 0)
      return rc;
  }
  return 0;
}

/* The header of page p, read as pgno at level: *count gets its nodes. */
static int page_header_check(walker *w, const uint8_t *p, uint64_t pgno,
                             int level, bool *leaf, uint32_t *count,
                             uint16_t *upper) {
  uint16_t flags = load16(p + 10);
  uint16_t lower = load16(p + 12);
  *upper = load16(p + 14);
  *leaf = flags == P_LEAF;
  bool leaf_level = level + 1 == w->depth;
  if (load64(p) != pgno || (flags != P_LEAF && flags != P_BRANCH) ||
      *leaf != leaf_level)
    return CORRUPT(w, "page %" PRIu64 " of %s: bad header (number %" PRIu64
                   ", flags 0x%x at level %d of %u)",
                   pgno, w->tree, load64(p), flags, level + 1, w->depth);
  if (lower < PAGE_HEADER_BYTES + 2 || lower % 2 != 0 || *upper < lower ||
      *upper > w->page_bytes)
    return CORRUPT(w, "page %" PRIu64 " of %s: bad header (lower %u, upper "
                   "%u)", pgno, w->tree, lower, *upper);
  *count = (lower - PAGE_HEADER_BYTES) / 2u;
  return 0;
}

/* Lazily, the node array of a level: a page holds at most this many. */
static node *level_nodes(walker *w, int level) {
  if (!w->nodes[level])
    w->nodes[level] =
        malloc((w->page_bytes - PAGE_HEADER_BYTES) / 2 * sizeof(node));
  return w->nodes[level];
}

/* Lazily, the page buffer of a level. */
static uint8_t *level_page(walker *w, int level) {
  if (!w->levels[level])
    w->levels[level] = malloc(w->page_bytes);
  return w->levels[level];
}

/* Page pgno at level (0: the root) and everything below it. */
static int page_walk(walker *w, uint64_t pgno, int level, bound low,
                     bound high) {
  assert(level >= 0 && level < w->depth);
  assert(w->depth <= SL_LMDB_CHECK_DEPTH_MAX);
  if (pgno < NUM_METAS || pgno > w->last_page)
    return CORRUPT(w, "%s: page %" PRIu64 " is beyond the last page, "
                   "%" PRIu64, w->tree, pgno, w->last_page);
  if (!mark(w->live, pgno))
    return CORRUPT(w, "page %" PRIu64 " of %s is reached twice", pgno,
                   w->tree);
  uint8_t *p = level_page(w, level);
  node *nodes = level_nodes(w, level);
  node *scratch = level_nodes(w, SL_LMDB_CHECK_DEPTH_MAX);
  if (!p || !nodes || !scratch)
    return check_fail(w, ENOMEM, "out of memory");
  int rc = read_at(w, p, w->page_bytes, pgno * w->page_bytes);
  bool leaf = false;
  uint32_t count = 0;
  uint16_t upper = 0;
  if (rc == 0)
    rc = page_header_check(w, p, pgno, level, &leaf, &count, &upper);
  w->stats.pages_read++;
  *(leaf ? &w->leaf_pages : &w->branch_pages) += 1;
  for (uint32_t i = 0; rc == 0 && i < count; i++)
    rc = node_read(w, p, pgno, leaf, i, upper, &nodes[i]);
  if (rc == 0 && count == 0)
    rc = CORRUPT(w, "page %" PRIu64 " of %s has no nodes", pgno, w->tree);
  if (rc == 0)
    rc = nodes_packed(w, nodes, count, pgno, upper, scratch);
  if (rc == 0)
    rc = keys_ordered(w, nodes, count, leaf, pgno, low, high);
  for (uint32_t i = 0; rc == 0 && leaf && i < count; i++)
    rc = leaf_node_check(w, &nodes[i], pgno);
  if (rc == 0 && !leaf)
    rc = branch_walk(w, nodes, count, level, low, high);
  return rc;
}

/* One database from its record (lmdb_check.h note 3). */
static int tree_walk(walker *w, enum tree_kind kind, const char *tree,
                     const db_record *r) {
  assert(walker_check(w));
  w->kind = kind;
  w->tree = tree;
  w->depth = r->depth;
  w->branch_pages = w->leaf_pages = w->overflow_pages = w->entries = 0;
  uint32_t pad = kind == TREE_FREE ? w->page_bytes : 0;
  uint16_t flags = kind == TREE_FREE ? FLAG_INTEGERKEY : 0;
  if (r->pad != pad || r->flags != flags)
    return CORRUPT(w, "the record of %s has bad flags (0x%x, pad %" PRIu32
                   ")", tree, r->flags, r->pad);
  if (r->root == PAGE_INVALID) {
    if (r->depth != 0 || r->branch_pages || r->leaf_pages ||
        r->overflow_pages || r->entries)
      return CORRUPT(w, "the record of %s: an empty tree with pages or "
                     "entries", tree);
    return 0;
  }
  if (r->depth == 0 || r->depth > SL_LMDB_CHECK_DEPTH_MAX)
    return CORRUPT(w, "the record of %s: depth %u", tree, r->depth);
  int rc = page_walk(w, r->root, 0, (bound){0, 0}, (bound){0, 0});
  if (rc != 0)
    return rc;
  if (w->branch_pages != r->branch_pages || w->leaf_pages != r->leaf_pages ||
      w->overflow_pages != r->overflow_pages || w->entries != r->entries)
    return CORRUPT(w, "%s holds %" PRIu64 "/%" PRIu64 "/%" PRIu64
                   " branch/leaf/overflow pages and %" PRIu64 " entries; "
                   "its record says %" PRIu64 "/%" PRIu64 "/%" PRIu64
                   " and %" PRIu64,
                   tree, w->branch_pages, w->leaf_pages, w->overflow_pages,
                   w->entries, r->branch_pages, r->leaf_pages,
                   r->overflow_pages, r->entries);
  return 0;
}

/* A meta page on its own (lmdb_check.h note 2). */
static bool meta_valid(const meta_page *m, uint64_t index) {
  uint32_t page_bytes = m->dbs[0].pad;
  return m->magic == META_MAGIC && m->version == DATA_VERSION &&
         m->pgno == index && (m->page_flags & P_META) &&
         page_bytes >= PAGE_MIN_BYTES && page_bytes <= PAGE_MAX_BYTES &&
         (page_bytes & (page_bytes - 1)) == 0;
}

/* Reads both meta pages and picks LMDB's (note 2): *newest. */
static int metas_check(walker *w, uint64_t file_bytes, uint64_t max_map_bytes,
                       meta_page *newest) {
  uint8_t page[PAGE_HEADER_BYTES + META_BYTES];
  meta_page m[NUM_METAS];
  w->page_bytes = PAGE_MIN_BYTES; /* for messages until it is known */
  if (file_bytes < sizeof page)
    return CORRUPT(w, "is %" PRIu64 " bytes, shorter than a meta page",
                   file_bytes);
  int rc = read_at(w, page, sizeof page, 0);
  if (rc != 0)
    return rc;
  meta_load(page, &m[0]);
  /* A damaged first meta page hides the page size: try the usual one. */
  uint64_t second = meta_valid(&m[0], 0) ? m[0].dbs[0].pad : 4096;
  if (file_bytes < second + sizeof page)
    return CORRUPT(w, "is %" PRIu64 " bytes, shorter than two meta pages",
                   file_bytes);
  if ((rc = read_at(w, page, sizeof page, second)) != 0)
    return rc;
  meta_load(page, &m[1]);
  bool valid0 = meta_valid(&m[0], 0), valid1 = meta_valid(&m[1], 1);
  if (!valid0 && !valid1 && m[0].magic != META_MAGIC &&
      m[1].magic != META_MAGIC)
    return check_fail(w, SL_ESTORE, "not an LMDB file (no meta page "
                      "carries LMDB's magic)");
  if (!valid0 || !valid1 || m[0].dbs[0].pad != m[1].dbs[0].pad)
    return CORRUPT(w, "meta page %d is damaged (magic, version, page "
                   "number, flags or page size)", !valid0 ? 0 : 1);
  uint64_t t0 = m[0].txnid, t1 = m[1].txnid;
  if (!(t0 == 0 && t1 == 0) && t0 + 1 != t1 && t1 + 1 != t0)
    return CORRUPT(w, "the meta pages' txnids %" PRIu64 " and %" PRIu64
                   " are not consecutive", t0, t1);
  *newest = m[t0 < t1 ? 1 : 0]; /* LMDB's mdb_env_pick_meta */
  w->page_bytes = newest->dbs[0].pad;
  uint64_t pages = file_bytes / w->page_bytes;
  if (newest->last_page < NUM_METAS - 1 || newest->last_page >= pages)
    return CORRUPT(w, "is %" PRIu64 " bytes, but its meta page's last page "
                   "is %" PRIu64 " (of %" PRIu32 " bytes): truncated",
                   file_bytes, newest->last_page, w->page_bytes);
  if (newest->map_bytes > max_map_bytes ||
      newest->dbs[0].flags != FLAG_INTEGERKEY)
    return CORRUPT(w, "meta page %" PRIu64 ": bad map size %" PRIu64
                   " or flags 0x%x", newest->pgno, newest->map_bytes,
                   newest->dbs[0].flags);
  return 0;
}

/* Every tree from the newest meta, then the free list against them. */
static int trees_check(walker *w, const meta_page *meta) {
  int rc = tree_walk(w, TREE_MAIN, "the main database", &meta->dbs[1]);
  for (uint32_t i = 0; rc == 0 && i < w->named_count; i++) {
    char tree[64];
    snprintf(tree, sizeof tree, "database %s", w->named_names[i]);
    rc = tree_walk(w, TREE_NAMED, tree, &w->named[i]);
  }
  if (rc == 0)
    rc = tree_walk(w, TREE_FREE, "the free list", &meta->dbs[0]);
  if (rc != 0)
    return rc;
  /* Note 5: no page both free and live.  Bounded by the bitmap. */
  for (uint64_t byte = 0; byte <= w->last_page / 8; byte++) {
    uint8_t both = w->live[byte] & w->freed[byte];
    if (both == 0)
      continue;
    uint64_t pgno = byte * 8;
    while (!(both & 1)) /* at most 7 shifts: both is nonzero */
      both >>= 1, pgno++;
    return CORRUPT(w, "page %" PRIu64 " is in the free list and in use",
                   pgno);
  }
  return 0;
}

static void walker_free(walker *w) {
  free(w->live);
  free(w->freed);
  free(w->value);
  for (int i = 0; i < SL_LMDB_CHECK_DEPTH_MAX; i++)
    free(w->levels[i]);
  for (int i = 0; i <= SL_LMDB_CHECK_DEPTH_MAX; i++)
    free(w->nodes[i]);
}

int sl_lmdb_check_file(int fd, const char *name, uint64_t max_map_bytes,
                       sl_lmdb_check_stats *stats, char *err,
                       size_t err_bytes) {
  assert(name != 0);
  if (err && err_bytes > 0)
    err[0] = 0;
  walker *w = calloc(1, sizeof *w);
  if (!w)
    return ENOMEM;
  w->fd = fd;
  w->name = name;
  w->err = err;
  w->err_bytes = err_bytes;
  struct stat st;
  meta_page meta;
  int rc = fstat(fd, &st) == 0 ? 0
                               : check_fail(w, errno, "fstat: %s",
                                            strerror(errno));
  if (rc == 0)
    rc = metas_check(w, (uint64_t)st.st_size, max_map_bytes, &meta);
  if (rc == 0) {
    w->last_page = meta.last_page;
    w->txnid = meta.txnid;
    size_t bitmap_bytes = (size_t)(meta.last_page / 8 + 1);
    w->live = calloc(bitmap_bytes, 1);
    w->freed = calloc(bitmap_bytes, 1);
    if (!w->live || !w->freed)
      rc = check_fail(w, ENOMEM, "out of memory");
  }
  if (rc == 0)
    rc = trees_check(w, &meta);
  if (rc == 0 && stats) {
    *stats = w->stats;
    stats->page_bytes = w->page_bytes;
    stats->last_page = w->last_page;
    stats->txnid = w->txnid;
    stats->databases = w->named_count;
  }
  walker_free(w);
  free(w);
  return rc;
}
