/* cow_map_rollback.c — rolling an instance's copy-on-write map back in
 * memory to the state of its last released epoch (cow_map.h note 10,
 * cow_map.c note 12), at a cost in the writes since that epoch. */
#include <errno.h>
#include <stdint.h>

#include "cow_map_internal.h"

/* Drop every version of one list of an epoch after the one rolled back to:
 * live ones leave the table, and all are freed.  bound: the list's length.
 * Undo versions on it were marked RETIRED_FREE first (rollback_undo). */
static void drop_list(sl_cow_map *m, sl_cow_entry *e, uint64_t bound) {
  for (uint64_t i = 0; e && i < bound; i++) {
    sl_cow_entry *next = e->dirty_next; /* read before e is freed */
    assert(e->epoch > m->stable_epoch);
    assert(e->retired != RETIRED_UNDO);
    if (!e->retired) {
      int table_index;
      sl_cow_entry **link = cow_map_find_version(m, e, &table_index);
      assert(link && *link == e);
      cow_map_unlink(m, link, table_index);
    }
    cow_map_free_version(m, e);
    e = next;
  }
  assert(e == 0);
}

/* Walk the undo list: the versions displaced after the stable epoch (the
 * others wait on the obsolete list, not walked).  Each that belongs to the stable state (epoch
 * at most the stable one) is the key's version in it (cow_map.c note 12):
 * returned, linked by chain_next, to go back into the table.  The others
 * are left to the lists of their epochs, which rollback drops.  The undo
 * list is empty afterwards. */
static sl_cow_entry *rollback_undo(sl_cow_map *m) {
  sl_cow_entry *restore = 0, *u = m->undo_head;
  for (uint64_t n = m->undo_releasable; u && n < m->undo_pushed; n++) {
    sl_cow_entry *next = u->chain_next;
    assert(u->retired == RETIRED_UNDO);
    if (u->epoch <= m->stable_epoch) {
      /* CLEAN, or RELEASED and still on the reclaim chain, which then
       * turns it CLEAN like any live version. */
      u->retired = RETIRED_NOT;
      u->chain_next = restore;
      restore = u;
    } else {
      u->retired = RETIRED_FREE; /* dropped with its epoch's list */
      u->chain_next = 0;
    }
    u = next;
  }
  assert(u == 0);
  m->undo_head = m->undo_tail = 0;
  m->undo_pushed = m->undo_releasable; /* the pending marks go too */
  return restore;
}

int sl_cow_map_rollback(sl_cow_map *m, uint32_t epoch) {
  assert(m);
  if (!m->retain || m->loading || epoch != m->stable_epoch)
    return EINVAL;
  sl_cow_entry *restore = rollback_undo(m);
  /* Every pending epoch is after the stable one (released ones are not
   * pending), and so is the current one. */
  drop_list(m, m->dirty_head, m->dirty_entries);
  m->dirty_head = m->dirty_tail = 0;
  m->dirty_entries = m->dirty_bytes = 0;
  for (uint32_t i = 0; i < m->pending_count; i++)
    drop_list(m, m->pending[i].head, m->pending[i].entries);
  m->pending_count = 0;
  /* Only now, with the newer versions out of the table, can the stable
   * ones go back without a key appearing twice.  Bounded: each restored
   * version was on the undo list once. */
  while (restore) {
    sl_cow_entry *next = restore->chain_next;
    restore->chain_next = 0;
    cow_map_link(m, restore);
    restore = next;
  }
  m->rollbacks++;
  assert(sl_cow_map_check(m));
  return 0;
}
