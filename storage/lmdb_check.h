/* lmdb_check.h — a bounded, validated walk of an LMDB 0.9 data file, read
 * with pread before LMDB maps it (store.h note 8).
 *
 * LMDB does not checksum its pages and trusts every byte of the map: a
 * truncated file faults (SIGBUS) on the first access past its end, and a
 * page header or node offset that was flipped sends its cursors and its
 * page writer (memmove by lower/upper) outside the page.  This walk reads
 * every page the newest meta page reaches, without the map, and refuses a
 * file whose structure LMDB could trip on.  What it cannot see: a flipped
 * byte inside a key or value that keeps every offset and the key order
 * valid; the store's checksums (store.h note 1) catch those when read.
 *
 * NOTES ON THE DESIGN
 *
 * 1. The on-disk format (LMDB 0.9, 64-bit: pgno_t and size_t are 8 bytes,
 *    native byte order).  A page starts with a 16-byte header: u64 pgno,
 *    u16 pad, u16 flags, then u16 lower and u16 upper (branch and leaf
 *    pages) or u32 page count (the first page of an overflow run).  Pages
 *    0 and 1 are meta pages: after the header, u32 magic 0xBEEFC0DE, u32
 *    version 1, u64 address, u64 map size, two database records (the free
 *    list's, whose pad field is the page size and flags the environment's
 *    flags, then the main database's), u64 last page number, u64 txnid.
 *    A database record: u32 pad, u16 flags, u16 depth, u64 branch, leaf
 *    and overflow page counts, u64 entries, u64 root (~0: empty).
 * 2. Meta pages.  Both must carry the magic, version 1, the P_META flag,
 *    their own page number and one page size (a power of two, 512 to
 *    32768).  LMDB uses the one with the greater txnid; the other must be
 *    exactly one transaction older (LMDB writes meta page txnid % 2, so
 *    consecutive commits alternate), or both 0 (never committed).  The
 *    newest must have flags MDB_INTEGERKEY alone (FIXEDMAP would map at
 *    its stored address), a map size no larger than max_map_bytes, and
 *    (last page + 1) * page size must not exceed the file: else LMDB's
 *    reads past the end fault.  That one check turns every truncation
 *    into SL_ECORRUPT.
 * 3. Trees.  From the newest meta: the main database, every named
 *    database found in it (F_SUBDATA leaf nodes), and the free list.
 *    Every page: number in [2, last page], not reached before (a bitmap:
 *    a cycle or a shared page is refused, so the walk ends), read with
 *    pread into a buffer of its level (no map: a walk cannot fault), its
 *    own number in its header, flags exactly P_BRANCH or P_LEAF, lower
 *    and upper inside the page and in order, the nodes packed side by
 *    side from upper to the page's end (as LMDB keeps them: it adds a
 *    node at upper and closes the hole a delete leaves), keys at most
 *    511 bytes, sorted, and within the bounds
 *    its parents' keys give (LMDB's binary search relies on them), all
 *    leaves at the record's depth, at most SL_LMDB_CHECK_DEPTH_MAX
 *    levels (LMDB's cursor stack).  The counts of branch, leaf and
 *    overflow pages and of entries must equal the record's.
 * 4. Leaf nodes: flags within F_BIGDATA | F_SUBDATA, no F_DUPDATA (no
 *    sluice database is DUPSORT); F_SUBDATA only in the main database,
 *    with a 48-byte record; F_BIGDATA: an overflow run whose first page
 *    names itself, has P_OVERFLOW, and whose page count covers the value
 *    (LMDB may keep a longer run when it overwrites a value in place) and
 *    stays within the last page; all its pages are marked reached.
 * 5. The free list: keys are u64 txnids, not above the meta's; values are
 *    ID lists, a u64 count n and n page numbers, strictly descending
 *    (LMDB merges them as sorted lists), each in [2, last page], none
 *    twice, none reached from a tree: a free page that is live would be
 *    handed out by the next write transaction and overwritten under live
 *    data.
 * 6. Cost: one pread a page reached (plus overflow runs), one bit of
 *    memory a page of the file, SL_LMDB_CHECK_DEPTH_MAX page buffers.
 *    It is O(store) time at every open that checks: a store of 1M keyed
 *    entries (compacted, 122 MiB file, 9445 live pages, 21824 free) takes
 *    60 ms of CPU (0.4 s wall on a loaded 2-core machine, page cache
 *    warm), about 6 us a page.
 * 7. Only a file no process writes may be walked: a live writer reuses
 *    free pages under the walk.  store.c walks a store while it holds the
 *    writer's lock, or a reader's shared lock that keeps writers out
 *    (store.h note 5).
 */
#ifndef SL_LMDB_CHECK_H
#define SL_LMDB_CHECK_H

#include <stddef.h>
#include <stdint.h>

/** LMDB's cursor stack (CURSOR_STACK): a deeper tree is refused. */
#define SL_LMDB_CHECK_DEPTH_MAX 32
/** Named databases the walk follows; a sluice store has seven. */
#define SL_LMDB_CHECK_DBS_MAX 64

typedef struct sl_lmdb_check_stats {
  uint32_t page_bytes;
  uint64_t last_page;  /* the newest meta's last page number */
  uint64_t txnid;      /* the newest meta's */
  uint64_t pages_read; /* pages walked, overflow runs counted whole */
  uint64_t free_pages; /* page numbers in the free list */
  uint32_t databases;  /* named databases walked */
} sl_lmdb_check_stats;

/** Check the LMDB data file open at fd (notes 2-5); name is how messages
 * call it (e.g. "DIR/data.mdb").  stats may be NULL.  Returns 0 if LMDB
 * can map and use it without leaving its pages.  Errors: SL_ECORRUPT (the
 * message names the file, the page and what is wrong), SL_ESTORE (no
 * meta page carries LMDB's magic: not an LMDB file), ENOMEM, errno values
 * of fstat and pread.  err (err_bytes > 0, or NULL) gets the message. */
int sl_lmdb_check_file(int fd, const char *name, uint64_t max_map_bytes,
                       sl_lmdb_check_stats *stats, char *err,
                       size_t err_bytes);

#endif /* SL_LMDB_CHECK_H */
