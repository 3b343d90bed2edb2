/* checkpoint_writer.c — the one job: the asynchronous writer thread,
 * which makes a checkpoint durable in one LMDB write transaction and, in
 * between, compacts the store.
 *
 * NOTES ON THE DESIGN OF THE CHECKPOINT WRITER
 *
 * 1. The coordinator hands the writer a checkpoint n when every instance
 *    has acknowledged it or stands in with its final ack (coordinator.c
 *    notes 3, 5).  The writer puts n's deltas (oldest first, skipping
 *    those already durable) and blobs into one LMDB write transaction,
 *    adds the record of n and commits durably.  Only that commit makes n
 *    complete (DESIGN.md invariant 5).  MDB_MAP_FULL grows the map and
 *    writes the transaction again.
 * 2. advance() visits checkpoints in id order, but a fully acknowledged
 *    newer one is handed over while an older one still waits for acks
 *    (coordinator.c note 8); the writer therefore skips (as subsumed) one
 *    whose id is not above the store's latest, and durable_epoch only
 *    moves on a commit.  It also gives up a checkpoint whose abort the
 *    coordinator requested (timeout, subsumed), looking every 4096
 *    entries; the result is ECANCELED.
 * 2a. The stop of a failed attempt (shutdown with the job failed, as a
 *    restart begins: failover.c note 3) gives a write up too, and sooner:
 *    before a queued checkpoint is begun, after each instance's sort and
 *    before the commit, besides every 4096 entries (failed_attempt_over).
 *    The restart waits for the writer before it restores (its store must
 *    hold still), so whatever the writer still does is on the path from
 *    the failure to the first record: at 1M keys, a restart that found
 *    the writer in a sort waited 5.5-7.6 ms for it (recovery_bench,
 *    about 300K changed keys).  What it gives up was not durable, so the
 *    restart restores the checkpoint before it (more to replay, the same
 *    result: DESIGN.md invariant 6); what committed before the look
 *    stays committed.  A stop by the user keeps the old rule (a write it
 *    finds queued, or small, may still commit).
 * 3. Table rows (operators/table_sink.c, snapshot.c note 10) are written
 *    like keyed-state deltas: each instance's part of checkpoint n puts
 *    the row batches of its ack, oldest first, skipping those whose seq
 *    is at or below durable_row_seq (written by an earlier commit), into
 *    n's one write transaction, before its blob and the record of n.  So
 *    a table changes only with a complete checkpoint, and exactly by the
 *    rows of the records before n's barrier; rows of an aborted
 *    checkpoint stay in the instance and go with the next.
 * 4. Only the writer touches the store while the job runs; restoring
 *    (restore.c) happens before any checkpointer thread starts.  The
 *    exceptions: table reads (sl_job_table_reader) and savepoint copies
 *    (sl_job_savepoint) from any thread, in read transactions of their
 *    own (store.h CONCURRENCY).
 * 5. Between checkpoints the writer compacts the store when its log has
 *    grown as large as its base (compact_if_due); a checkpoint handed
 *    over or a shutdown cancels a running compaction, which keeps its
 *    committed steps and resumes on the next call (store.h note 3).  The
 *    shutdown of a failed attempt (the restart waits for the writer, note
 *    2a) gives the step under way up instead of finishing its chunk and
 *    committing it (SL_STORE_CANCEL_ABANDON, sl_checkpointer_stop): a
 *    committed step is a chunk of up to 1 MiB more and an fdatasync,
 *    and a restart at 1M keys once waited 39.8 ms for one.
 *
 * 6. Channel state (unaligned checkpoints, snapshot.c note 12) goes into
 *    the instance's blob, so it is replaced with the rest of the
 *    instance's state in n's one transaction, under the blob's checksum
 *    (store.h note 1): flag SL_BLOB_CHANNELS, then a u64 (native order,
 *    as the event-time trailer) of the section's bytes, then the section
 *    as the ack carries it: per input channel with entries, in index
 *    order, u32 channel index, u32 0, u64 bytes, then that many bytes of
 *    entries in ring format (RECORDS, WATERMARK, IDLE; ring.h notes 4-6).
 *    restore.c checks every field before the instance replays it.
 *
 * Entry: sl_checkpoint_writer_main (started by sl_checkpointer_start);
 * per checkpoint: writer_take, write_checkpoint, write_once,
 * write_instance, write_rows.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lmdb.h>

#include "checkpoint_internal.h"
#include "fault.h"

/* An entry to write and its place in LMDB's order: (key group, record
 * key), then the rest of the state key (state id, kind, user key), then
 * the version order (run_compare), so versions of one state key go
 * oldest first (the newest is written last and wins).  Exact order lets
 * the store append (MDB_APPEND).  16 bytes: the key group rides in the
 * top 16 bits of the entry's address, which user-space addresses leave 0
 * (48 bits on x86-64 and aarch64 Linux unless a mapping asks for more);
 * so the key is hashed once per checkpoint (collect), not again at every
 * move of bucket_by_group, where the hash sat in the chain from one move
 * to the next.  Should an address need the bits, the writer stops
 * tagging for good (sort_untagged) and hashes as before.  At 1M changed
 * keys these entries are a large part of what a checkpoint's write adds
 * to memory (memory_bench: 48 bytes an entry before, in two buffers of
 * 24). */
typedef struct sorted_entry {
  uint64_t key; /* record key: the state key's first 8 bytes (state.c) */
  uintptr_t tagged; /* the entry's address | key group << SORT_TAG_SHIFT */
} sorted_entry;

_Static_assert(sizeof(sorted_entry) == 16, "sort entries stay packed");
_Static_assert(sizeof(uintptr_t) == 8, "a 64-bit address holds the tag");

#define SORT_TAG_SHIFT 48
#define SORT_ADDRESS_MASK (((uintptr_t)1 << SORT_TAG_SHIFT) - 1)

/* Key group of a record key (what key_by routed it by). */
static uint16_t sort_group(const sl_job *job, uint64_t key) {
  return (uint16_t)sl_key_group(key, job->config.max_parallelism);
}

/* The address mask of sort entries: tagged or not (sort_untagged). */
static inline uintptr_t sort_mask(bool tagged) {
  return tagged ? SORT_ADDRESS_MASK : UINTPTR_MAX;
}

static inline const sl_cow_entry *sort_entry_of(sorted_entry s,
                                                uintptr_t mask) {
  return (const sl_cow_entry *)(s.tagged & mask);
}

/* The key group of s: its tag, or (untagged) the key's hash. */
static inline uint16_t sort_group_of(const sl_job *job, bool tagged,
                                     sorted_entry s) {
  return tagged ? (uint16_t)(s.tagged >> SORT_TAG_SHIFT)
                : sort_group(job, s.key);
}

/* Buckets of at most this many entries are sorted by insertion: cheaper
 * than clearing radix_sort's counts. */
#define SL_SMALL_BUCKET 32u

/* Moves a[0, n) into buckets by key group, in place (an American flag
 * sort: each entry goes straight to its bucket, swapping out the one it
 * lands on, so no second buffer of n entries is needed).  ends[g] comes
 * in as bucket g's size and leaves as where it ends (it starts at
 * ends[g - 1], or 0); next has room for groups.  Not stable: sort_runs
 * restores the version order (run_compare).  Returns the largest bucket. */
static size_t bucket_by_group(const sl_job *job, bool tagged, sorted_entry *a,
                              size_t n, uint32_t groups, size_t *ends,
                              size_t *next) {
  size_t start = 0, largest = 0;
  for (uint32_t g = 0; g < groups; g++) {
    largest = ends[g] > largest ? ends[g] : largest;
    next[g] = start;
    start += ends[g];
    ends[g] = start;
  }
  assert(start == n);
  /* Buckets below g are complete, and next[h] is bucket h's first slot
   * not yet filled; every move fills one slot for good: n moves at most. */
  for (uint32_t g = 0; g < groups; g++) {
    while (next[g] < ends[g]) {
      sorted_entry e = a[next[g]];
      uint16_t h = sort_group_of(job, tagged, e);
      while (h != g) {
        assert(h > g && next[h] < ends[h]);
        sorted_entry out = a[next[h]];
        /* Each bucket fills from its own place in a 16-byte-an-entry
         * array, too many streams for the hardware to foresee: fetch
         * this bucket's line two ahead, which is then in the cache when
         * the bucket is next visited.  Bucketing 1M entries: 30 -> 14
         * ms. */
        if (next[h] + 8 < n)
          __builtin_prefetch(&a[next[h] + 8], 1);
        a[next[h]++] = e;
        e = out;
        h = sort_group_of(job, tagged, e);
      }
      a[next[g]++] = e;
    }
  }
  return largest;
}

/* Stable LSD radix sort of a[0, n) by record key, only over the bits
 * where the keys differ (their span: lowest to highest differing bit),
 * in as few passes of at most SL_RADIX_BITS bits as the span needs, one
 * counting pass for all of them.  A key group's keys of a 1M-key state
 * differ in about 20 bits: 2 passes, where a byte a pass took 3 and
 * counted all 8 bytes (1M changed keys: 23 -> 9 ms).
 * The result is in a or tmp: the returned pointer. */
static sorted_entry *radix_sort(sorted_entry *a, sorted_entry *tmp,
                                size_t n, size_t *counts) {
  assert(n > 0);
  uint64_t differ = 0;
  for (size_t i = 1; i < n; i++)
    differ |= a[i].key ^ a[0].key;
  if (differ == 0)
    return a; /* one key: already in order */
  int low = __builtin_ctzll(differ);
  int span = 64 - __builtin_clzll(differ) - low;
  int passes = (span + SL_RADIX_BITS - 1) / SL_RADIX_BITS;
  int width = (span + passes - 1) / passes;
  assert(passes <= SL_RADIX_PASSES && width <= SL_RADIX_BITS);
  assert(low + (passes - 1) * width < 64); /* every shift is defined */
  size_t digits = (size_t)1 << width;
  uint64_t mask = digits - 1;
  memset(counts, 0, sizeof *counts * digits * (size_t)passes);
  for (size_t i = 0; i < n; i++)
    for (int p = 0; p < passes; p++)
      counts[(size_t)p * digits + ((a[i].key >> (low + p * width)) & mask)]++;
  for (int p = 0; p < passes; p++) {
    size_t *count = counts + (size_t)p * digits;
    int shift = low + p * width;
    size_t offset = 0;
    for (size_t v = 0; v < digits; v++) {
      size_t c = count[v];
      count[v] = offset;
      offset += c;
    }
    for (size_t i = 0; i < n; i++)
      tmp[count[(a[i].key >> shift) & mask]++] = a[i];
    sorted_entry *swap = a;
    a = tmp;
    tmp = swap;
  }
  return a;
}

/* Sorts each bucket of a (ends: bucket_by_group's) by record key, in
 * place; tmp holds the largest bucket.  A bucket (n / groups entries) is
 * sorted in the cache: over the whole array the sort makes two passes
 * (bucket_by_group's), not one per varying byte. */
static void sort_buckets(sorted_entry *a, sorted_entry *tmp,
                         const size_t *ends, uint32_t groups,
                         size_t *counts) {
  size_t start = 0;
  for (uint32_t g = 0; g < groups; start = ends[g], g++) {
    size_t bucket = ends[g] - start;
    sorted_entry *b = a + start;
    if (bucket > SL_SMALL_BUCKET) {
      sorted_entry *sorted = radix_sort(b, tmp, bucket, counts);
      if (sorted != b)
        memcpy(b, sorted, bucket * sizeof *sorted);
      continue;
    }
    for (size_t i = 1; i < bucket; i++) { /* insertion: stable too */
      sorted_entry e = b[i];
      size_t j = i;
      for (; j > 0 && b[j - 1].key > e.key; j--)
        b[j] = b[j - 1];
      b[j] = e;
    }
  }
}

/* The rest of two state keys after the record key, as LMDB compares them
 * (bytes, then length). */
static int rest_compare(const sl_cow_entry *x, const sl_cow_entry *y) {
  uint32_t xn = x->key_bytes - 8, yn = y->key_bytes - 8;
  int c = memcmp((const uint8_t *)sl_cow_entry_key(x) + 8,
                 (const uint8_t *)sl_cow_entry_key(y) + 8, xn < yn ? xn : yn);
  return c ? c : (xn > yn) - (xn < yn);
}

/* Two entries of one record key: by the rest of the key, then oldest
 * version first.  Versions of one state key come from different epochs,
 * except where a key deleted in its own epoch (the version becomes a
 * tombstone in place, cow_map.c) is put again, which adds a new version
 * to the same list: of such versions only the last can be live, so
 * within an epoch tombstones go first and the newest state comes last,
 * as in list order.  (Superseded versions are not collected.) */
static int run_compare(const void *x, const void *y, void *mask_arg) {
  uintptr_t mask = *(const uintptr_t *)mask_arg;
  const sl_cow_entry *a = sort_entry_of(*(const sorted_entry *)x, mask);
  const sl_cow_entry *b = sort_entry_of(*(const sorted_entry *)y, mask);
  int c = rest_compare(a, b);
  if (c)
    return c;
  if (a->epoch != b->epoch)
    return a->epoch < b->epoch ? -1 : 1;
  return (int)b->tombstone - (int)a->tombstone;
}

/* Runs longer than this (map state: many user keys under one record key)
 * are sorted with qsort instead of insertion sort. */
#define SL_SHORT_RUN 16u

/* Finish the order inside runs of equal record key (so of equal group):
 * a run is as long as the changed states of one record key and their
 * versions — usually one or a few (insertion sort), for map state
 * possibly many (qsort). */
static void sort_runs(sorted_entry *a, size_t n, uintptr_t mask) {
  for (size_t start = 0, end; start < n; start = end) {
    for (end = start + 1; end < n && a[end].key == a[start].key; end++) {
    }
    if (end - start > SL_SHORT_RUN) {
      qsort_r(a + start, end - start, sizeof *a, run_compare, &mask);
      continue;
    }
    for (size_t i = start + 1; i < end; i++) {
      sorted_entry e = a[i];
      size_t j = i;
      for (; j > start && run_compare(&a[j - 1], &e, &mask) > 0; j--)
        a[j] = a[j - 1];
      a[j] = e;
    }
  }
}

/* Room for n entries in buffer *a (capacity *capacity): false if there is
 * no memory (the buffer is then gone). */
static bool sort_room(sorted_entry **a, uint64_t *capacity, uint64_t n) {
  if (n <= *capacity)
    return true;
  free(*a);
  *a = malloc(sizeof **a * n);
  *capacity = *a ? n : 0;
  return *a != 0;
}

/* The sort entry of version e of record key (in key group), tagged with
 * the group if tag; *addresses gathers the address bits (collect_sorted
 * checks that none reaches the tag). */
static inline sorted_entry sort_entry(uint64_t key, const sl_cow_entry *e,
                                      uint16_t group, bool tag,
                                      uintptr_t *addresses) {
  uintptr_t address = (uintptr_t)e;
  *addresses |= address;
  return (sorted_entry){
      .key = key,
      .tagged = address | (tag ? (uintptr_t)group << SORT_TAG_SHIFT : 0)};
}

/* Versions collect_indexed fetches ahead. */
#define SL_COLLECT_AHEAD 16u

/* The live versions of delta, read through its index (cow_map.h note
 * 11), into a from a[count] on, each counted in its key group's size.
 * Returns the new count.  The index is an array, so versions are fetched
 * SL_COLLECT_AHEAD ahead (their header and the key's first 8 bytes); the
 * dirty list made each visit wait for the one before. */
static size_t collect_indexed(const sl_job *job, const sl_cow_delta *delta,
                              size_t *sizes, sorted_entry *a, size_t count,
                              bool tag, uintptr_t *addresses) {
  const sl_cow_index_block *block = delta->index;
  /* A list of n versions has at most n / SL_COW_INDEX_BLOCK + 1 blocks. */
  for (uint64_t b = 0; block && b <= delta->entries / SL_COW_INDEX_BLOCK;
       b++, block = block->next) {
    assert(block->count <= SL_COW_INDEX_BLOCK);
    for (uint64_t v = 0; v < block->count; v++) {
      const sl_cow_entry *ahead =
          sl_cow_index_ahead(block, v, SL_COLLECT_AHEAD);
      if (ahead) {
        __builtin_prefetch(ahead);
        __builtin_prefetch(ahead->data + 7); /* the same line, mostly */
      }
      assert(b * SL_COW_INDEX_BLOCK + v < delta->entries);
      const sl_cow_entry *e = block->versions[v];
      if (e->superseded)
        continue;
      assert(e->key_bytes >= 8);
      uint64_t key = sl_load_be64(sl_cow_entry_key(e));
      uint16_t group = sort_group(job, key);
      sizes[group]++;
      a[count++] = sort_entry(key, e, group, tag, addresses);
    }
  }
  assert(block == 0);
  return count;
}

/* Collect the live versions of instance i's deltas not yet durable into
 * the sort buffer (room made), counting each in its key group's size in
 * sizes; tagged unless sort_untagged.  Returns the count. */
static size_t collect_all(sl_checkpointer *cp, const sl_ack *a, int i,
                          uint32_t *max_epoch, size_t *sizes,
                          uintptr_t *addresses) {
  const sl_job *job = cp->job;
  bool tag = !cp->sort_untagged;
  memset(sizes, 0, sizeof *sizes * job->config.max_parallelism);
  size_t count = 0;
  for (int d = 0; d < a->delta_count; d++) {
    const sl_cow_delta *delta = &a->deltas[d];
    if (delta->epoch <= cp->durable_epoch[i])
      continue; /* written by an earlier checkpoint (note 1) */
    if (delta->epoch > *max_epoch)
      *max_epoch = delta->epoch;
    if (delta->index) {
      count = collect_indexed(job, delta, sizes, cp->sort_a, count, tag,
                              addresses);
      continue;
    }
    for (const sl_cow_entry *e = delta->head; e; e = e->dirty_next) {
      assert(count < cp->sort_capacity); /* collect_sorted made room */
      if (e->superseded)
        continue;
      assert(e->key_bytes >= 8);
      uint64_t key = sl_load_be64(sl_cow_entry_key(e));
      uint16_t group = sort_group(job, key);
      sizes[group]++;
      cp->sort_a[count++] = sort_entry(key, e, group, tag, addresses);
    }
  }
  return count;
}

/* Collect the entries of instance i's deltas that are not yet durable into
 * the writer's sort buffer, sorted (*sorted).  Returns the count, or -1
 * (ENOMEM). */
static int64_t collect_sorted(sl_checkpointer *cp, const sl_ack *a, int i,
                              uint32_t *max_epoch, sorted_entry **sorted) {
  const sl_job *job = cp->job;
  uint32_t groups = job->config.max_parallelism;
  uint64_t n = 0;
  for (int d = 0; d < a->delta_count; d++)
    if (a->deltas[d].epoch > cp->durable_epoch[i])
      n += a->deltas[d].entries;
  *sorted = cp->sort_a;
  if (n == 0)
    return 0; /* a stateless instance, or no change */
  if (!sort_room(&cp->sort_a, &cp->sort_capacity, n))
    return -1;
  size_t *ends = cp->group_ends; /* sizes, then next: bucket_by_group */
  uintptr_t addresses = 0;
  size_t count = collect_all(cp, a, i, max_epoch, ends, &addresses);
  if (!cp->sort_untagged && (addresses & ~SORT_ADDRESS_MASK) != 0) {
    cp->sort_untagged = true; /* see sorted_entry; once, then never again */
    count = collect_all(cp, a, i, max_epoch, ends, &addresses);
  }
  assert(count <= n);
  bool tagged = !cp->sort_untagged;
  size_t largest = count ? bucket_by_group(job, tagged, cp->sort_a, count,
                                           groups, ends, ends + groups)
                         : 0; /* every change was superseded */
  bool ok = largest <= SL_SMALL_BUCKET ||
            sort_room(&cp->sort_b, &cp->sort_tmp_capacity, largest);
  if (ok && count) {
    sort_buckets(cp->sort_a, cp->sort_b, ends, groups, cp->radix_counts);
    sort_runs(cp->sort_a, count, sort_mask(tagged));
  }
  *sorted = cp->sort_a;
  return ok ? (int64_t)count : -1;
}

/* qsort_r: two rows of the batch arg in LMDB's key order (memcmp, then
 * the shorter first); a batch's keys are distinct. */
static int row_compare(const void *x, const void *y, void *arg) {
  const sl_row_batch *batch = arg;
  const sl_row *a = &batch->rows[*(const uint32_t *)x];
  const sl_row *b = &batch->rows[*(const uint32_t *)y];
  uint32_t n = a->key_bytes < b->key_bytes ? a->key_bytes : b->key_bytes;
  int c = n ? memcmp(batch->arena + a->offset, batch->arena + b->offset, n)
            : 0;
  return c ? c : (a->key_bytes > b->key_bytes) - (a->key_bytes < b->key_bytes);
}

/* The rows of batch in key order, in the writer's buffer: LMDB takes
 * ordered puts about 2x faster (store_rows, 1M rows: 0.78 s vs 1.78 s),
 * and sorting here keeps O(n log n) off the barrier's path.  NULL (no
 * memory): write them as they are, which changes nothing but speed. */
static const uint32_t *row_order(sl_checkpointer *cp,
                                 const sl_row_batch *batch) {
  if (batch->row_count > cp->row_order_capacity) {
    free(cp->row_order);
    cp->row_order = malloc(sizeof *cp->row_order * batch->row_count);
    cp->row_order_capacity = cp->row_order ? batch->row_count : 0;
    if (!cp->row_order)
      return 0;
  }
  for (uint64_t r = 0; r < batch->row_count; r++)
    cp->row_order[r] = (uint32_t)r; /* a batch has < 2^32 rows */
  qsort_r(cp->row_order, batch->row_count, sizeof *cp->row_order,
          row_compare, (void *)batch);
  return cp->row_order;
}

/* Note 3: the row batches of ack a (instance i) not yet durable, oldest
 * first, into txn; *row_seq receives the newest seq written.  Adds to
 * *entries and *bytes.  Returns 0, ECANCELED or a store error. */
static int write_rows(sl_checkpointer *cp, sl_store_txn *txn, pending *p,
                      const sl_ack *a, int i, uint64_t *row_seq,
                      uint64_t *entries, uint64_t *bytes) {
  for (int b = 0; b < a->batch_count; b++) {
    if (a->batches[b].seq <= cp->durable_row_seq[i])
      continue; /* written, perhaps freed: not to be touched */
    const sl_row_batch *batch = a->batches[b].batch;
    assert(batch->seq == a->batches[b].seq);
    assert(batch->seq > *row_seq); /* oldest first */
    int table;
    int rc = sl_store_txn_table(txn, batch->table, &table);
    const uint32_t *order = rc == 0 ? row_order(cp, batch) : 0;
    for (uint64_t r = 0; r < batch->row_count && rc == 0; r++) {
      const sl_row *row = &batch->rows[order ? order[r] : r];
      assert(row->offset + row->key_bytes + row->value_bytes <=
             batch->arena_bytes);
      const uint8_t *key = batch->arena + row->offset;
      rc = row->tombstone
               ? sl_store_delete_row(txn, table, key, row->key_bytes)
               : sl_store_put_row(txn, table, key, row->key_bytes,
                                  key + row->key_bytes, row->value_bytes);
      *bytes += row->key_bytes + row->value_bytes;
      if (++*entries % SL_WRITER_ABORT_CHECK == 0 && rc == 0 &&
          (atomic_load(&p->abort_requested) || atomic_load(&cp->shutdown)))
        rc = ECANCELED;
    }
    if (rc)
      return rc;
    *row_seq = batch->seq;
  }
  return 0;
}

/* Note 2a: the stop of a failed attempt has begun, so the write under way
 * is given up (ECANCELED) at the writer's next look. */
static bool failed_attempt_over(const sl_checkpointer *cp) {
  return atomic_load(&cp->shutdown) && atomic_load(&cp->job->failed);
}

/* Put one instance's part of p into txn.  Returns 0 or a store error. */
static int write_instance(sl_checkpointer *cp, sl_store_txn *txn, pending *p,
                          int i, uint32_t *max_epoch, uint64_t *row_seq) {
  sl_job *job = cp->job;
  sl_instance *inst = job->instances[i];
  const sl_ack *a = p->acks[i] ? p->acks[i] : cp->final_acks[i];
  assert(a);
  /* coordinator.c note 3: a final ack stands in only for ids it never
   * received. */
  assert(!a->final || a->max_seen_id < p->id);
  uint16_t op = (uint16_t)inst->op->id;
  uint64_t entries = 0, bytes = 0;
  sorted_entry *sorted = 0;
  int64_t count = collect_sorted(cp, a, i, max_epoch, &sorted);
  if (count < 0)
    return ENOMEM;
  if (failed_attempt_over(cp))
    return ECANCELED; /* note 2a */
  const size_t *ends = cp->group_ends; /* bucket g ends at ends[g] */
  uintptr_t mask = sort_mask(!cp->sort_untagged);
  uint32_t group = 0;
  /* The entries are scattered in memory and visited in key order: fetch
   * a few ahead, or each visit waits for a cache miss. */
  enum { PREFETCH_AHEAD = 12 };
  for (int64_t k = 0; k < count; k++) {
    if (k + PREFETCH_AHEAD < count) {
      const sl_cow_entry *ahead =
          sort_entry_of(sorted[k + PREFETCH_AHEAD], mask);
      __builtin_prefetch(ahead);
      __builtin_prefetch((const uint8_t *)ahead + 64);
    }
    while ((size_t)k >= ends[group])
      group++; /* the sort's buckets: no second hash of the key */
    assert(group == sort_group(job, sorted[k].key));
    const sl_cow_entry *e = sort_entry_of(sorted[k], mask);
    int rc;
    if (e->tombstone)
      rc = sl_store_delete_state(txn, op, (uint16_t)group,
                                 sl_cow_entry_key(e), e->key_bytes);
    else
      rc = sl_store_put_state(
          txn, op, (uint16_t)group, sl_cow_entry_key(e), e->key_bytes,
          e->data + sl_cow_value_offset(e->key_bytes), e->value_bytes);
    if (rc)
      return rc;
    entries++;
    bytes += e->key_bytes + e->value_bytes;
    if (entries % SL_WRITER_ABORT_CHECK == 0 &&
        (atomic_load(&p->abort_requested) || atomic_load(&cp->shutdown)))
      return ECANCELED;
  }
  uint64_t row_entries = 0;
  int rows_rc = write_rows(cp, txn, p, a, i, row_seq, &row_entries, &bytes);
  if (rows_rc)
    return rows_rc;
  /* Every instance gets a blob, with a flag byte, so a snapshot that saved
   * nothing replaces an older one (a restore must not see stale state).
   * Flag bit 0: operator state follows; bit 1: the event-time state
   * (watermark, largest timestamp: 16 bytes) comes last. */
  uint32_t user_bytes = a->has_blob ? a->blob_bytes : 0;
  /* Note 6: the channel state first, with its length. */
  uint64_t channel_bytes = a->channel_state_bytes
                               ? 8 + a->channel_state_bytes : 0;
  uint64_t total = 1 + channel_bytes + user_bytes +
                   (a->has_event_time ? 16u : 0u);
  if (total > UINT32_MAX)
    return EFBIG; /* more than a blob holds: this checkpoint fails */
  uint32_t blob_bytes = (uint32_t)total;
  uint8_t small[64];
  uint8_t *blob = blob_bytes <= sizeof small ? small : malloc(blob_bytes);
  if (!blob)
    return ENOMEM;
  /* coordinator.c note 10: a final ack marks its instance finished in
   * every checkpoint it stands in for. */
  blob[0] = (uint8_t)((a->has_blob ? SL_BLOB_STATE : 0u) |
                      (a->has_event_time ? SL_BLOB_EVENT_TIME : 0u) |
                      (a->final ? SL_BLOB_FINISHED : 0u) |
                      (channel_bytes ? SL_BLOB_CHANNELS : 0u));
  assert((blob[0] & ~SL_BLOB_FLAGS) == 0);
  assert(!a->final || channel_bytes == 0); /* every input had ended */
  if (channel_bytes) {
    memcpy(blob + 1, &a->channel_state_bytes, 8);
    memcpy(blob + 9, a->channel_state, a->channel_state_bytes);
  }
  if (user_bytes)
    memcpy(blob + 1 + channel_bytes, a->blob, user_bytes);
  if (a->has_event_time)
    memcpy(blob + 1 + channel_bytes + user_bytes, a->event_time, 16);
  int rc = sl_store_put_blob(txn, op, (uint16_t)inst->index, blob, blob_bytes);
  if (blob != small)
    free(blob);
  p->entries[i] = entries;
  p->bytes[i] = bytes + blob_bytes;
  return rc;
}

/* One attempt at writing p.  *epochs and *row_seqs receive, per
 * instance, the newest epoch and row batch written. */
static int write_once(sl_checkpointer *cp, pending *p, uint32_t *epochs,
                      uint64_t *row_seqs) {
  sl_job *job = cp->job;
  sl_store_txn *txn = 0;
  if (job->faults) { /* inject.c: the cause names the fault */
    int rc = sl_inject_occurrence(job, 0, SL_FAULT_WRITE, -1, p->write_cause,
                                  sizeof p->write_cause);
    if (rc)
      return rc;
  }
  int rc = sl_store_begin(cp->store, &txn);
  if (rc)
    return rc;
  for (int i = 0; i < job->instance_count && rc == 0; i++) {
    uint64_t t0 = sl_now_ns();
    epochs[i] = cp->durable_epoch[i];
    row_seqs[i] = cp->durable_row_seq[i];
    rc = write_instance(cp, txn, p, i, &epochs[i], &row_seqs[i]);
    p->async_us[i] = (sl_now_ns() - t0) / 1000u;
    if (i == 0 && job->faults)
      sl_inject_crash_point(job, SL_CRASH_MID_WRITE);
  }
  if (rc) {
    sl_store_abort(txn);
    return rc;
  }
  cp_record rec = {.version = 2,
                   .final = p->final,
                   .trigger_time_ms = p->trigger_time_ms,
                   .instance_count = (uint64_t)job->instance_count};
  for (int i = 0; i < job->instance_count; i++) {
    rec.bytes_persisted += p->bytes[i];
    rec.entries_persisted += p->entries[i];
    const sl_ack *a = p->acks[i] ? p->acks[i] : cp->final_acks[i];
    rec.unaligned |= a->unaligned; /* note 6 */
    rec.channel_bytes += a->channel_state_bytes;
  }
  rec.version = rec.unaligned ? 3 : 2;
  if (failed_attempt_over(cp)) { /* note 2a: the commit is the rest */
    sl_store_abort(txn);
    return ECANCELED;
  }
  return sl_store_commit(txn, p->id, &rec,
                         rec.unaligned ? sizeof rec : SL_CP_RECORD_V2_BYTES);
}

static void write_checkpoint(sl_checkpointer *cp, pending *p) {
  sl_job *job = cp->job;
  uint64_t t0 = sl_now_ns();
  uint32_t *epochs = calloc((size_t)job->instance_count, sizeof *epochs);
  uint64_t *row_seqs = calloc((size_t)job->instance_count, sizeof *row_seqs);
  int rc = epochs && row_seqs ? 0 : ENOMEM;
  /* Note 2: given up, or a newer one is already durable. */
  if (atomic_load(&p->abort_requested) ||
      p->id <= sl_store_latest(cp->store) || failed_attempt_over(cp))
    rc = ECANCELED; /* note 2a: a queued one is not begun */
  for (int attempt = 0; rc == 0; attempt++) {
    rc = write_once(cp, p, epochs, row_seqs);
    if (rc != MDB_MAP_FULL || attempt == SL_MAP_FULL_RETRIES)
      break;
    /* Note 1: nothing was committed; grow and write it all again. */
    rc = sl_store_grow(cp->store);
  }
  p->write_us = (sl_now_ns() - t0) / 1000u;
  p->write_status = rc;
  if (rc == 0) {
    for (int i = 0; i < job->instance_count; i++) {
      cp->durable_epoch[i] = epochs[i];
      cp->durable_row_seq[i] = row_seqs[i];
    }
    if (job->faults) /* durable, the sinks not yet told */
      sl_inject_crash_point(job, SL_CRASH_AFTER_COMMIT);
  } else if (rc == SL_EINJECTED) {
    char text[sizeof p->write_cause];
    memcpy(text, p->write_cause, sizeof text);
    int used = snprintf(p->write_cause, sizeof p->write_cause,
                        "writing checkpoint %" PRIu64 " failed: ", p->id);
    sl_copy_text(p->write_cause + used, sizeof p->write_cause - (size_t)used,
                 text);
  } else if (rc == ECANCELED) {
    int reason = atomic_load(&p->abort_requested);
    snprintf(p->write_cause, sizeof p->write_cause, "%s",
             reason == ABORT_TIMEOUT ? "timed out while being written"
             : reason == ABORT_NONE && failed_attempt_over(cp)
                 ? "the job failed while it was being written" /* 2a */
                 : "subsumed by a newer checkpoint while being written");
  } else {
    snprintf(p->write_cause, sizeof p->write_cause,
             "writing checkpoint %" PRIu64 " to %s failed: %s%s%s%s%s%s",
             p->id, job->config.checkpoint.state_dir, sl_strerror(rc),
             sl_store_error(cp->store)[0] ? ": " : "",
             sl_store_error(cp->store),
             job->store_fault_text[0] ? " [injected fault '" : "",
             job->store_fault_text, job->store_fault_text[0] ? "']" : "");
  }
  job->store_fault_text[0] = 0;
  free(epochs);
  free(row_seqs);
}

static pending *writer_take(sl_checkpointer *cp) {
  pthread_mutex_lock(&cp->write_lock);
  pending *p = 0;
  if (cp->write_queue_count > 0) {
    p = cp->write_queue[0];
    memmove(cp->write_queue, cp->write_queue + 1,
            sizeof(pending *) * (size_t)(cp->write_queue_count - 1));
    cp->write_queue_count--;
  }
  pthread_mutex_unlock(&cp->write_lock);
  return p;
}

/* Log entries below which the store is not compacted: a small state
 * would otherwise be rewritten after nearly every checkpoint. */
#define SL_COMPACT_MIN_LOG_ENTRIES 65536u

/* Between checkpoints: merge the store's log into its base when the log
 * has grown as large as its base (store.h note 3).  A compaction runs in
 * steps of bounded size; a checkpoint handed over meanwhile cancels it,
 * which ends the step under way at its chunk's end (milliseconds) and
 * keeps every step done: the next call resumes it.  So a compaction never
 * delays a checkpoint by its whole length, and still finishes however
 * often checkpoints come.  A shutdown cancels it the same way.  A failure
 * loses nothing (the log stays) and is retried after the next
 * checkpoint. */
static void compact_if_due(sl_checkpointer *cp) {
  atomic_store(&cp->compaction_cancel, 0);
  pthread_mutex_lock(&cp->write_lock);
  bool queued = cp->write_queue_count > 0; /* after the reset: no race */
  pthread_mutex_unlock(&cp->write_lock);
  if (queued || atomic_load(&cp->no_compaction) ||
      atomic_load(&cp->shutdown) || atomic_load(&cp->job->stopping))
    return;
  sl_store_set_cancel(cp->store, &cp->compaction_cancel);
  for (int attempt = 0; attempt < SL_MAP_FULL_RETRIES; attempt++) {
    sl_store_compaction stats;
    int rc = sl_store_compact(cp->store, SL_COMPACT_MIN_LOG_ENTRIES, &stats);
    if (rc == 0) {
      cp->compaction_deferrals = 0;
      if (stats.entries_written + stats.log_entries_read > 0) {
        cp->compactions++;
        cp->compaction_us += stats.duration_us;
      }
    } else if (rc == ECANCELED) {
      cp->compaction_deferrals++;
    }
    if (rc != MDB_MAP_FULL || sl_store_grow(cp->store) != 0)
      break;
  }
}

/* The writer thread: checkpoints from the queue, in id order, each
 * written whole (note 1), then its result released to the coordinator;
 * compaction when the queue is empty (note 5). */
void *sl_checkpoint_writer_main(void *arg) {
  sl_checkpointer *cp = arg;
  pthread_setname_np(pthread_self(), "sl:writer");
  bool wrote = false;
  for (;;) {
    pending *p = writer_take(cp);
    if (!p && wrote && !atomic_load(&cp->shutdown)) {
      wrote = false;
      compact_if_due(cp);
      continue; /* look for work again before sleeping */
    }
    if (!p) {
      sl_parker_prepare(&cp->writer_parker);
      if (atomic_load(&cp->shutdown)) {
        sl_parker_cancel(&cp->writer_parker);
        return 0;
      }
      pthread_mutex_lock(&cp->write_lock);
      bool work = cp->write_queue_count > 0;
      pthread_mutex_unlock(&cp->write_lock);
      if (work)
        sl_parker_cancel(&cp->writer_parker);
      else
        sl_parker_sleep(&cp->writer_parker);
      continue;
    }
    write_checkpoint(cp, p);
    wrote = wrote || p->write_status == 0;
    /* Release: the coordinator reads the results after acquiring this. */
    atomic_store_explicit(&p->written, 1, memory_order_release);
    sl_parker_wake(&cp->coordinator_parker);
  }
}
