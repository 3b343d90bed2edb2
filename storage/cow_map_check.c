/* cow_map_check.c — sl_cow_map_check(), the whole-map consistency check of
 * the copy-on-write map (cow_map.h; the conditions are cow_map.c's notes),
 * for asserts and tests. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cow_map_internal.h"
#include "log.h"

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) {                                                         \
      sl_log(SL_LOG_ERROR, "sl_cow_map_check: line %d: %s", __LINE__, #cond); \
      return false;                                                        \
    }                                                                      \
  } while (0)

/* What the checker adds up while it walks the map. */
typedef struct check_tally {
  uint64_t bytes;          /* memory the map must account for (note 7) */
  uint64_t dirty_live;     /* table versions of a non-zero epoch */
  uint64_t live_on_lists;  /* live versions met on the lists */
  uint64_t arena_versions; /* arena versions met, each once */
  uint64_t heap_versions;  /* malloc'd versions met, each once */
  uint64_t undo_on_lists;  /* undo versions met on the epoch lists */
  /* Versions of the stable epoch a lazy rollback will put back, met on
   * the reclaim chain (so counted in undo_on_lists, though on the undo
   * list no more): cow_map_rollback.c note 6. */
  uint64_t undo_awaited_on_lists;
  /* Displaced versions whose retired mark waits (cow_map.c note 15), by
   * address, and how many of them the lists met. */
  const sl_cow_entry **waiting;
  uint64_t waiting_count;
  uint64_t waiting_met;
} check_tally;

static int compare_address(const void *a, const void *b) {
  uintptr_t x = (uintptr_t) * (const sl_cow_entry *const *)a;
  uintptr_t y = (uintptr_t) * (const sl_cow_entry *const *)b;
  return x < y ? -1 : x > y;
}

/* Whether e's mark waits (cow_map.c note 15). */
static bool mark_waits(const check_tally *tally, const sl_cow_entry *e) {
  return tally->waiting_count &&
         bsearch(&e, tally->waiting, tally->waiting_count,
                 sizeof *tally->waiting, compare_address) != 0;
}

/* Where a version's memory is counted: its own allocation, or (arena) a
 * place inside a chunk of this map, counted with the chunk (note 7). */
static bool check_version_memory(const sl_cow_map *m, const sl_cow_entry *e,
                                 check_tally *tally) {
  CHECK(e->arena <= 1);
  uint64_t bytes = entry_alloc_bytes(e->key_bytes, entry_capacity(e));
  if (!e->arena) {
    tally->bytes += bytes;
    tally->heap_versions++;
    return true;
  }
  const arena_chunk *c = chunk_of(e);
  const uint8_t *at = (const uint8_t *)e, *base = (const uint8_t *)c;
  CHECK(c->owner == m);
  CHECK(at >= base + sizeof *c);
  CHECK(at + bytes <= base + c->used_bytes);
  tally->arena_versions++;
  return true;
}

/* Every table entry: in its bucket, live, found by lookup (so no duplicate
 * shadows it), hash right. */
static bool check_tables(const sl_cow_map *m, check_tally *tally) {
  CHECK(m->tables[0].size >= INITIAL_BUCKETS);
  CHECK(m->rehashing == (m->tables[1].size != 0));
  for (int t = 0; t < 2; t++) {
    const cow_table *table = &m->tables[t];
    CHECK((table->size & (table->size - 1)) == 0);
    tally->bytes += table->size * sizeof *table->buckets;
    uint64_t seen = 0;
    for (uint64_t b = 0; b < table->size; b++) {
      CHECK(t == 1 || !m->rehashing || b >= m->rehash_index || !table->buckets[b]);
      sl_cow_entry *e = table->buckets[b];
      for (; e && seen < table->used; e = e->chain_next, seen++) {
        int found_in = -1;
        CHECK((e->hash & (table->size - 1)) == b);
        CHECK(!e->retired && !e->tombstone && !e->superseded);
        CHECK(e->hash == (uint32_t)sl_cow_hash(e->data, e->key_bytes));
        CHECK(cow_map_find_version(m, e, &found_in));
        CHECK(*cow_map_find_version(m, e, &found_in) == e);
        CHECK(found_in == t);
        CHECK(e->epoch <= m->epoch);
        if (!check_version_memory(m, e, tally))
          return false;
        tally->dirty_live += e->epoch != 0;
      }
      CHECK(e == 0);
    }
    CHECK(seen == table->used);
  }
  return true;
}

/* One list: length, tail, bytes (unless expected_bytes is UINT64_MAX),
 * epochs in [epoch_min, epoch_max] and not decreasing, marks consistent,
 * live versions in the table.  Retired versions are counted here, live
 * ones by check_tables(). */
static bool check_list(const sl_cow_map *m, const sl_cow_entry *head,
                       const sl_cow_entry *tail, uint64_t entries,
                       uint64_t expected_bytes, uint32_t epoch_min,
                       uint32_t epoch_max, check_tally *tally) {
  const sl_cow_entry *e = head, *last = 0;
  uint64_t n = 0, list_bytes = 0;
  uint32_t epoch = epoch_min;
  for (; e && n < entries; last = e, e = e->dirty_next, n++) {
    CHECK(e->epoch >= epoch && e->epoch <= epoch_max);
    epoch = e->epoch;
    CHECK(!e->tombstone || (e->retired && e->value_bytes == 0));
    CHECK(!e->superseded || e->retired);
    CHECK(e->retired <= RETIRED_UNDO);
    /* An undo version was live when displaced, by a later epoch. */
    CHECK(e->retired != RETIRED_UNDO || (!e->tombstone && !e->superseded));
    tally->undo_on_lists += e->retired == RETIRED_UNDO;
    if (e->retired) {
      if (!check_version_memory(m, e, tally))
        return false;
    } else if (mark_waits(tally, e)) {
      /* Displaced, out of the table, its mark to come (note 15). */
      int found_in;
      sl_cow_entry **link = cow_map_find_version(m, e, &found_in);
      CHECK(!link || *link != e);
      CHECK(!e->tombstone && !e->superseded);
      tally->waiting_met++;
      if (!check_version_memory(m, e, tally))
        return false;
    } else {
      int found_in;
      sl_cow_entry **link = cow_map_find_version(m, e, &found_in);
      CHECK(link && *link == e);
      tally->live_on_lists++;
    }
    list_bytes += (uint64_t)e->key_bytes + e->value_bytes;
  }
  CHECK(e == 0);
  CHECK(n == entries);
  CHECK(last == tail);
  CHECK(expected_bytes == UINT64_MAX || list_bytes == expected_bytes);
  return true;
}

/* One undo list of `entries` versions (note 12): displaced live versions
 * out of the table; the CLEAN ones, on no other list, are counted here
 * (and in *clean). */
static bool check_undo_list(const sl_cow_map *m, const sl_cow_entry *head,
                            const sl_cow_entry *tail, uint64_t entries,
                            uint64_t *clean, check_tally *tally) {
  const sl_cow_entry *e = head, *last = 0;
  uint64_t n = 0;
  for (; e && n < entries; last = e, e = e->chain_next, n++) {
    CHECK(e->retired == RETIRED_UNDO);
    CHECK(!e->tombstone && !e->superseded);
    CHECK(e->epoch < m->epoch);
    CHECK(e->hash == (uint32_t)sl_cow_hash(e->data, e->key_bytes));
    int found_in;
    sl_cow_entry **link = cow_map_find_version(m, e, &found_in);
    CHECK(!link || *link != e);
    if (e->epoch == 0) {
      if (!check_version_memory(m, e, tally))
        return false;
      ++*clean;
    }
  }
  CHECK(e == 0);
  CHECK(n == entries);
  CHECK(last == tail);
  return true;
}

/* The undo list's index (cow_map_rollback.c note 4): blocks, all full but
 * the last, whose slots from append number undo_releasable on are the undo
 * list in order; none wholly below undo_releasable (freed at release);
 * none while dropped.  Its blocks count as the map's memory. */
static bool check_undo_index(const sl_cow_map *m, check_tally *tally) {
  const sl_cow_index_block *block = m->undo_index_head, *last = 0;
  CHECK(!m->undo_index_dropped || !block);
  uint64_t waiting = m->undo_pushed - m->undo_releasable;
  if (!block) {
    CHECK(m->undo_index_dropped || waiting == 0);
    CHECK(!m->undo_index_tail);
    return true;
  }
  CHECK(m->undo_index_base <= m->undo_releasable);
  uint64_t number = m->undo_index_base;
  const sl_cow_entry *u = m->undo_head;
  for (; block; last = block, block = block->next) {
    CHECK(block->count <= SL_COW_INDEX_BLOCK);
    CHECK(!block->next || block->count == SL_COW_INDEX_BLOCK);
    CHECK(number + block->count > m->undo_releasable);
    for (uint64_t k = 0; k < block->count; k++, number++) {
      if (number < m->undo_releasable)
        continue; /* released: may be freed already */
      CHECK(u && block->versions[k] == u);
      u = u->chain_next;
    }
    tally->bytes += sizeof *block;
  }
  CHECK(last == m->undo_index_tail);
  CHECK(number == m->undo_pushed);
  CHECK(u == 0);
  return true;
}

/* The undo lists (note 12): every version on them once, each on exactly
 * one of them or the epoch lists' undo versions. */
static bool check_undo(const sl_cow_map *m, check_tally *tally) {
  CHECK(m->retain || m->undo_pushed == 0);
  CHECK(m->undo_popped <= m->undo_releasable);
  CHECK(m->undo_releasable <= m->undo_pushed);
  CHECK(m->stable_epoch < m->epoch);
  uint64_t clean = 0;
  if (!check_undo_list(m, m->obsolete_head, m->obsolete_tail,
                       m->undo_releasable - m->undo_popped, &clean, tally) ||
      !check_undo_list(m, m->undo_head, m->undo_tail,
                       m->undo_pushed - m->undo_releasable, &clean, tally))
    return false;
  CHECK(clean + tally->undo_on_lists - tally->undo_awaited_on_lists ==
        m->undo_pushed - m->undo_popped);
  if (!check_undo_index(m, tally))
    return false;
  uint64_t mark = m->undo_releasable; /* pending marks: not decreasing */
  for (uint32_t i = 0; i < m->pending_count; i++) {
    CHECK(m->pending[i].epoch > m->stable_epoch);
    CHECK(m->pending_tails[i].undo_mark >= mark);
    mark = m->pending_tails[i].undo_mark;
  }
  CHECK(mark <= m->undo_pushed);
  return true;
}
/* The dropped list (cow_map_rollback.c note 1): `entries` versions out of
 * the table, counted here; undo ones among them are the undo list's no
 * more, so they are not tallied as such. */
static bool check_dropped(const sl_cow_map *m, check_tally *tally) {
  const sl_cow_entry *e = m->dropped_head, *last = 0;
  uint64_t n = 0;
  for (; e && n < m->dropped_entries; last = e, e = e->dirty_next, n++) {
    CHECK(e->retired == RETIRED_FREE || e->retired == RETIRED_UNDO);
    CHECK(e->epoch > 0 && e->epoch <= m->epoch);
    if (!check_version_memory(m, e, tally))
      return false;
  }
  CHECK(e == 0);
  CHECK(n == m->dropped_entries);
  CHECK(last == m->dropped_tail);
  return true;
}

/* The end of stale version e's chain (cow_map_rollback.c note 5), the
 * version at the stable epoch that goes back in its place, or NULL. */
static const sl_cow_entry *chain_end(const sl_cow_map *m,
                                     const sl_cow_entry *e) {
  const sl_cow_entry *u = cow_lazy_displaced(m, e);
  for (uint32_t n = 0; u && cow_stale(m, u) && n <= m->stale_span; n++)
    u = cow_lazy_displaced(m, u);
  return u;
}

/* The undo index a lazy rollback kept (cow_map_rollback.c note 5): its
 * blocks in order in lazy_blocks, all full but the last, spanning
 * lazy_index_base .. lazy_index_end; its memory the map's. */
static bool check_lazy_index(const sl_cow_map *m, check_tally *tally) {
  if (!m->lazy_head) {
    CHECK(!m->lazy_index && !m->lazy_blocks && m->lazy_block_count == 0);
    return true;
  }
  CHECK((m->lazy_index == 0) == (m->lazy_block_count == 0));
  CHECK((m->lazy_blocks == 0) == (m->lazy_block_count == 0));
  const sl_cow_index_block *b = m->lazy_index;
  uint64_t n = 0;
  for (uint64_t i = 0; b && i < m->lazy_block_count; i++, b = b->next) {
    CHECK(m->lazy_blocks[i] == b);
    CHECK(b->count > 0 && b->count <= SL_COW_INDEX_BLOCK);
    CHECK(!b->next || b->count == SL_COW_INDEX_BLOCK);
    n += b->count;
    tally->bytes += sizeof *b;
  }
  CHECK(b == 0);
  CHECK(m->lazy_index_base + n == m->lazy_index_end || !m->lazy_index);
  tally->bytes += m->lazy_block_count * sizeof *m->lazy_blocks;
  return true;
}

/* A lazy rollback under way (cow_map_rollback.c notes 5-6): the lazy
 * list, epochs in the failed range and not increasing; each live version
 * on it found in the table, with a chain down to a kept version of the
 * stable epoch (counted here when CLEAN: it is on no list) or to NULL
 * (the keys inserted since, lazy_inserted of them). */
static bool check_lazy(const sl_cow_map *m, check_tally *tally) {
  CHECK((m->lazy_head == 0) == (m->stale_span == 0));
  CHECK((m->lazy_head == 0) == (m->lazy_entries == 0));
  CHECK(m->lazy_head || (!m->lazy_tail && m->lazy_inserted == 0));
  CHECK(m->stale_span == 0 ||
        (uint64_t)m->stale_base + m->stale_span <= m->epoch);
  CHECK(m->lazy_head || (!m->lazy_ahead && !m->lazy_mid));
  const sl_cow_entry *e = m->lazy_head, *last = 0;
  uint64_t n = 0, inserted = 0;
  uint32_t epoch = UINT32_MAX;
  bool ahead_seen = !m->lazy_ahead, mid_seen = !m->lazy_mid;
  for (; e && n < m->lazy_entries; last = e, e = e->dirty_next, n++) {
    /* The fetch cursors (cow_map_rollback.c note 8): on the list, past
     * its head, where their distances say. */
    if (e == m->lazy_ahead) {
      CHECK(n > 0 && n == m->lazy_ahead_by);
      ahead_seen = true;
    }
    if (e == m->lazy_mid) {
      CHECK(n > 0 && n == m->lazy_mid_by);
      mid_seen = true;
    }
    CHECK(cow_stale(m, e));
    CHECK(e->epoch <= epoch);
    epoch = e->epoch;
    CHECK(e->retired <= RETIRED_UNDO);
    if (e->retired) {
      if (!check_version_memory(m, e, tally))
        return false;
      continue;
    }
    int found_in;
    sl_cow_entry **link = cow_map_find_version(m, e, &found_in);
    CHECK(link && *link == e);
    tally->live_on_lists++;
    const sl_cow_entry *u = chain_end(m, e);
    if (!u) {
      inserted++;
      continue;
    }
    CHECK(u->retired == RETIRED_UNDO);
    CHECK(u->epoch < m->stale_base);
    CHECK(!u->tombstone && !u->superseded);
    if (u->epoch == 0) {
      if (!check_version_memory(m, u, tally))
        return false;
    } else {
      tally->undo_awaited_on_lists++;
    }
  }
  CHECK(e == 0);
  CHECK(n == m->lazy_entries);
  CHECK(last == m->lazy_tail);
  CHECK(inserted == m->lazy_inserted);
  CHECK(ahead_seen && mid_seen);
  return check_lazy_index(m, tally);
}

/* The bulk load's ring: CLEAN versions in no table and on no list. */
static bool check_load_window(const sl_cow_map *m, check_tally *tally) {
  CHECK(m->load_count <= SL_COW_LOAD_WINDOW);
  CHECK(m->load_first < SL_COW_LOAD_WINDOW);
  CHECK(m->load_unprobed <= m->load_count);
  CHECK(m->loading || m->load_count == 0);
  CHECK(!m->load_sorted || m->loading);
  for (uint32_t i = 0; i < m->load_count; i++) {
    const sl_cow_entry *e =
        m->load_window[(m->load_first + i) & (SL_COW_LOAD_WINDOW - 1)];
    CHECK(e->epoch == 0);
    CHECK(!e->retired && !e->tombstone && !e->superseded);
    CHECK(e->hash == (uint32_t)sl_cow_hash(e->data, e->key_bytes));
    if (!check_version_memory(m, e, tally))
      return false;
  }
  return true;
}

/* The staged bulk load's area (cow_map.c note 18): its records whole,
 * one after another, each hash its key's. */
static bool check_stage(const sl_cow_map *m, check_tally *tally) {
  CHECK(m->loading || !m->stage_area);
  if (!m->stage_area)
    return true;
  CHECK(m->load_count == 0); /* the ring unused */
  CHECK(m->stage_parts >= 1 && m->stage_parts <= SL_COW_STAGE_MAX_PARTS);
  CHECK(m->stage_records <= m->stage_max_records);
  CHECK(m->stage_area + m->stage_used <= (const uint8_t *)m->stage_sorted);
  /* Each partition's count is its records' (the sort's slots rely on
   * it): counted again here, down to 0. */
  uint64_t *left = calloc(m->stage_parts, sizeof *left);
  CHECK(left);
  for (uint32_t p = 0; p < m->stage_parts; p++)
    left[p] = m->stage_counts[p];
  uint64_t at = 0;
  bool whole = true;
  for (uint32_t i = 0; whole && i < m->stage_records; i++) {
    cow_stage_record r;
    whole = at + sizeof r <= m->stage_used;
    if (!whole)
      break;
    memcpy(&r, m->stage_area + at, sizeof r);
    uint32_t key_bytes = r.key_bytes & ~COW_STAGE_PROBE;
    uint64_t bytes = cow_stage_record_bytes(key_bytes, r.value_bytes);
    uint32_t part = cow_stage_part(m, r.hash);
    whole = key_bytes <= SL_COW_MAX_BYTES && r.value_bytes <= SL_COW_MAX_BYTES &&
            at + bytes <= m->stage_used && part < m->stage_parts &&
            left[part] > 0 &&
            r.hash == (uint32_t)sl_cow_hash(m->stage_area + at + sizeof r,
                                            key_bytes);
    if (whole)
      left[part]--;
    at += bytes;
  }
  for (uint32_t p = 0; whole && p < m->stage_parts; p++)
    whole = left[p] == 0;
  free(left);
  CHECK(whole);
  CHECK(at == m->stage_used);
  tally->bytes += m->stage_area_bytes;
  return true;
}

/* The chunk list, and every carved version not yet freed met exactly once
 * (in the table, retired on a list, or in the ring). */
static bool check_arena(const sl_cow_map *m, check_tally *tally) {
  const arena_chunk *c = m->arena_chunks, *prev = 0;
  uint64_t chunks = 0, versions = 0;
  bool carving_listed = m->arena_carving == 0;
  for (; c && chunks < m->arena_chunk_count; prev = c, c = c->next, chunks++) {
    CHECK(((uintptr_t)c & (ARENA_CHUNK_BYTES - 1)) == 0);
    CHECK(c->owner == m);
    CHECK(c->prev == prev);
    CHECK(c->used_bytes >= sizeof *c && c->used_bytes <= ARENA_CHUNK_BYTES);
    CHECK(c->used_bytes % 8 == 0);
    CHECK(c->versions > 0); /* an empty chunk is freed at once */
    /* The smallest version: a header and an 8-byte value area. */
    CHECK((uint64_t)c->versions * (sizeof(sl_cow_entry) + 8) <=
          c->used_bytes - sizeof *c);
    versions += c->versions;
    carving_listed |= c == m->arena_carving;
  }
  CHECK(c == 0);
  CHECK(chunks == m->arena_chunk_count);
  CHECK(carving_listed);
  CHECK(versions == tally->arena_versions);
  tally->bytes += chunks * ARENA_CHUNK_BYTES;
  if (m->arena_spare) { /* cow_map.c note 16: off the list, counted */
    CHECK(((uintptr_t)m->arena_spare & (ARENA_CHUNK_BYTES - 1)) == 0);
    CHECK(m->arena_spare != m->arena_carving);
    tally->bytes += ARENA_CHUNK_BYTES;
  }
  return true;
}

/* A list's index (header note 11): blocks, all full but the last, that
 * name the list's versions in list order, counted in the map's memory;
 * *last receives the last block. */
static bool check_index(const sl_cow_entry *head,
                        const sl_cow_index_block *index, uint64_t entries,
                        const sl_cow_index_block **last, check_tally *tally) {
  const sl_cow_entry *e = head;
  const sl_cow_index_block *block = index;
  uint64_t n = 0;
  *last = 0;
  for (uint64_t b = 0; block && b <= entries / SL_COW_INDEX_BLOCK; b++) {
    CHECK(block->count > 0 && block->count <= SL_COW_INDEX_BLOCK);
    CHECK(!block->next || block->count == SL_COW_INDEX_BLOCK);
    for (uint64_t i = 0; i < block->count; i++, n++) {
      CHECK(e && block->versions[i] == e);
      e = e->dirty_next;
    }
    tally->bytes += sizeof *block;
    *last = block;
    block = block->next;
  }
  CHECK(block == 0);
  CHECK(!index || n == entries);
  return true;
}

/* The reclaim index (cow_map.c note 13): from the walk's position on,
 * blocks (each a released list's, so any may be part full) that name the
 * reclaim chain's versions in chain order, every one of them; the cursor
 * ahead is in them, not behind the walk. */
static bool check_reclaim_index(const sl_cow_map *m, check_tally *tally) {
  const sl_cow_index_block *block = m->reclaim_index, *last = 0;
  if (!block) {
    CHECK(!m->reclaim_index_tail && !m->reclaim_ahead);
    CHECK(!m->reclaim_head || m->reclaim_unindexed);
    return true;
  }
  CHECK(!m->reclaim_unindexed && m->reclaim_head);
  CHECK(m->reclaim_index_at < block->count);
  const sl_cow_entry *e = m->reclaim_head;
  uint64_t n = 0, at = m->reclaim_index_at;
  bool ahead_seen = false;
  for (; block; block = block->next, at = 0) {
    CHECK(block->count > 0 && block->count <= SL_COW_INDEX_BLOCK);
    if (block == m->reclaim_ahead) {
      CHECK(m->reclaim_ahead_at >= at && m->reclaim_ahead_at <= block->count);
      ahead_seen = true;
    }
    for (uint64_t i = at; i < block->count; i++, n++) {
      CHECK(e && block->versions[i] == e);
      e = e->dirty_next;
    }
    tally->bytes += sizeof *block;
    last = block;
    CHECK(n <= m->reclaim_entries);
  }
  CHECK(e == 0 && n == m->reclaim_entries);
  CHECK(last == m->reclaim_index_tail);
  CHECK(ahead_seen);
  return true;
}

/* The displaced versions whose mark waits (cow_map.c note 15), gathered
 * and sorted into tally->waiting (the caller frees it), each checked
 * where it is noted: a pending slot's are of its epoch, the marking
 * queue's of a released one; the arrays' memory is the map's. */
static bool gather_waiting(const sl_cow_map *m, check_tally *tally) {
  CHECK(m->marking_done <= m->marking_count);
  CHECK(m->marking_count <= m->marking_capacity);
  CHECK((m->marking == 0) == (m->marking_capacity == 0));
  uint64_t n = m->marking_count - m->marking_done;
  tally->bytes += m->marking_capacity * sizeof *m->marking;
  for (uint32_t i = 0; i < m->pending_count; i++) {
    const cow_pending_end *slot = &m->pending_tails[i];
    CHECK(slot->later_count <= slot->later_capacity);
    CHECK((slot->later == 0) == (slot->later_capacity == 0));
    n += slot->later_count;
    tally->bytes += slot->later_capacity * sizeof *slot->later;
  }
  CHECK(n == 0 || !m->retain);
  if (n == 0)
    return true;
  const sl_cow_entry **all = malloc(n * sizeof *all);
  CHECK(all);
  uint64_t k = 0;
  for (uint64_t i = m->marking_done; i < m->marking_count; i++)
    all[k++] = m->marking[i];
  for (uint32_t i = 0; i < m->pending_count; i++)
    for (uint64_t j = 0; j < m->pending_tails[i].later_count; j++)
      all[k++] = m->pending_tails[i].later[j];
  tally->waiting = all;
  tally->waiting_count = n;
  for (uint64_t i = m->marking_done; i < m->marking_count; i++) {
    const sl_cow_entry *e = m->marking[i];
    CHECK(e->epoch != 0 && e->epoch <= m->stable_epoch);
    CHECK(!e->retired);
  }
  for (uint32_t i = 0; i < m->pending_count; i++)
    for (uint64_t j = 0; j < m->pending_tails[i].later_count; j++) {
      const sl_cow_entry *e = m->pending_tails[i].later[j];
      CHECK(e->epoch == m->pending[i].epoch);
      CHECK(!e->retired);
    }
  qsort(all, n, sizeof *all, compare_address);
  for (uint64_t i = 1; i < n; i++)
    CHECK(all[i - 1] != all[i]); /* noted once */
  return true;
}

static bool check_all(const sl_cow_map *m, check_tally *tally);

bool sl_cow_map_check(const sl_cow_map *m) {
  CHECK(m);
  CHECK(m->epoch >= 1);
  check_tally tally = {
      .bytes = sizeof *m + (uint64_t)m->pending_capacity *
                               (sizeof *m->pending + sizeof *m->pending_tails)};
  bool ok = gather_waiting(m, &tally) && check_all(m, &tally);
  free((void *)tally.waiting);
  return ok;
}

static bool check_all(const sl_cow_map *m, check_tally *tally_in) {
  check_tally tally = *tally_in;
  if (!check_tables(m, &tally))
    return false;
  if (!check_list(m, m->dirty_head, m->dirty_tail, m->dirty_entries,
                  m->dirty_bytes, m->epoch, m->epoch, &tally))
    return false;
  const sl_cow_index_block *index_last;
  if (!check_index(m->dirty_head, m->index_head, m->dirty_entries,
                   &index_last, &tally))
    return false;
  CHECK(index_last == m->index_tail);
  /* Every non-empty list has its index unless it was dropped. */
  CHECK(!m->index_dropped || !m->index_head);
  CHECK(m->index_dropped || (m->index_head != 0) == (m->dirty_head != 0));
  CHECK(m->pending_count <= m->pending_capacity);
  uint32_t after = 0; /* pending epochs strictly increase, below current */
  for (uint32_t i = 0; i < m->pending_count; i++) {
    const sl_cow_delta *d = &m->pending[i];
    CHECK(d->epoch > after && d->epoch < m->epoch);
    after = d->epoch;
    if (!check_list(m, d->head, m->pending_tails[i].last, d->entries, d->bytes,
                    d->epoch, d->epoch, &tally) ||
        !check_index(d->head, d->index, d->entries, &index_last, &tally))
      return false;
  }
  uint32_t reclaim_max = m->pending_count ? m->pending[0].epoch - 1 : m->epoch - 1;
  if (!check_list(m, m->reclaim_head, m->reclaim_tail, m->reclaim_entries,
                  UINT64_MAX, 1, reclaim_max, &tally))
    return false;
  if (!check_reclaim_index(m, &tally))
    return false;
  if (!check_dropped(m, &tally) || !check_lazy(m, &tally))
    return false;
  /* The count a rollback trusts (cow_map_rollback.c note 1) can only be
   * checked right after one: nothing written since. */
  CHECK(!m->retain || m->dirty_head || m->pending_count ||
        cow_live_keys(m) == m->stable_live_keys);
  /* Every live version of a non-zero epoch is on exactly one list. */
  CHECK(tally.live_on_lists == tally.dirty_live);
  if (!check_undo(m, &tally))
    return false;
  if (!check_load_window(m, &tally) || !check_stage(m, &tally) ||
      !check_arena(m, &tally))
    return false;
  CHECK(tally.waiting_met == tally.waiting_count); /* each on a list */
  CHECK(tally.bytes == m->memory_bytes);
  CHECK(tally.heap_versions == m->heap_versions);
  return true;
}
