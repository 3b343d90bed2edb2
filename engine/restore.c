/* restore.c — the one job: before a job's threads start, open its store
 * and choose what it resumes from; then, on each instance's thread,
 * restore that instance's state.
 *
 * NOTES ON THE DESIGN OF RESTORING
 *
 * 1. sl_checkpointer_setup runs in sl_job_start after compiling, and in a
 *    restart after sl_checkpointer_reset, while no instance, coordinator
 *    or writer thread runs: it creates the keyed-state maps, opens the
 *    store (refusing a foreign one, or one that holds checkpoints when the
 *    store policy made no choice) and fixes restored_from, the newest
 *    complete checkpoint.  A job started from a savepoint installs it as
 *    its store first (open_store, savepoint.c).  A restart keeps the open
 *    store, which is its own, and restores its newest complete checkpoint
 *    whatever the store policy says.
 * 2. Each instance restores its own keyed state and blob on its own
 *    thread, after open and before its restore hook
 *    (sl_checkpointer_restore_instance), so instances restore in parallel.
 *    Every instance restores the same checkpoint, the newest complete one
 *    (DESIGN.md invariant 6).  The store delivers keyed state in (key
 *    group, key) order, and the map loads it in bulk.  A failure fails
 *    the job naming the state, the operator, the instance, the checkpoint
 *    and the directory; a damaged blob or duplicate key is SL_ECORRUPT.
 * 3. An instance is restored finished (coordinator.c note 10) if its blob
 *    carries SL_BLOB_FINISHED, or if the checkpoint's record says "final"
 *    (stores written before that flag existed; read_restored_final).
 *
 * 4. Channel state (unaligned checkpoints, snapshot.c notes 12, 13) is
 *    part of the blob (checkpoint_writer.c note 6).  It is checked whole
 *    before anything of it is used: channel indexes in range and
 *    increasing, every entry's kind, counts, sizes (a record at most
 *    max_record_bytes) and extent within its channel's bytes.  A
 *    mismatch is SL_ECORRUPT naming the operator, instance, checkpoint,
 *    channel and offset (sl_restore_channel_state), never a crash.
 *
 * 5. A large keyed state is mostly fresh memory: the restoring thread
 *    spent over half a 10M-key restore in the kernel zeroing the pages of
 *    the table and the load arena on their first touch.  So from
 *    RESTORE_PREFAULT_MIN_ENTRIES (4M) on, restore_keyed starts a helper
 *    thread (storage/prefault.h) that faults them in ahead of the load
 *    on another CPU than this instance's (cow_map.c note 14, prefault.h
 *    note 7), and destroys it once the load
 *    is finished.  A helper that cannot start (no thread, SLUICE_PREFAULT=0)
 *    changes nothing but the time: the load then faults its own pages.
 * 6. A table of 16M buckets or more (a state of about 8M keys and up) is
 *    loaded staged, partition by partition (cow_map.c note 18), as the map
 *    decides by itself.  SLUICE_STAGE_MIN_BUCKETS sets that size instead,
 *    for tests (0: a small restore is staged too).
 *
 * Entries: sl_checkpointer_setup (before threads), then per instance
 * sl_checkpointer_restore_instance or, if its open failed,
 * sl_checkpointer_restore_skip.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint_internal.h"
#include "fault.h"
#include "log.h"
#include "prefault.h"

/* Note 5: the helper from this many entries on (SLUICE_PREFAULT_MIN_ENTRIES
 * overrides it, for tests).  Interleaved restores in fresh processes
 * (checkpoint_bench --restore-child, 2026-12-06): at 10M keys it cut the
 * restoring thread's CPU to about 0.62 and the wall to 0.76-0.84 (three
 * sets), but at 1M keys (a 2M-entry log) the wall was 1.04-1.32 of
 * without (the thread's CPU 0.74-0.93), so 1M-entry states stay without. */
#define RESTORE_PREFAULT_MIN_ENTRIES (UINT64_C(1) << 22)

/* The number the environment variable name holds, or otherwise (unset,
 * or not a number) fallback.  For the overrides of notes 5 and 6. */
static uint64_t env_number(const char *name, uint64_t fallback) {
  const char *text = getenv(name);
  char *end = 0;
  unsigned long long n = text ? strtoull(text, &end, 10) : 0;
  return text && end != text && *end == 0 ? (uint64_t)n : fallback;
}

/* The bulk load a restore feeds, and the first error it returned. */
typedef struct restore_load {
  sl_cow_map *map;
  int rc;
} restore_load;

static int restore_entry(void *arg, uint16_t key_group, const void *key,
                         uint32_t key_bytes, const void *value,
                         uint32_t value_bytes) {
  restore_load *load = arg;
  int rc = sl_cow_map_load_add(load->map, key_group, key, key_bytes, value,
                               value_bytes);
  /* A repeated key, found by a later add (staged: when the area fills,
   * cow_map.c note 18), or an entry too large: a damaged store, as when
   * finish finds one (restore_keyed). */
  if (rc == EINVAL)
    rc = SL_ECORRUPT;
  if (rc && !load->rc)
    load->rc = rc;
  return rc;
}

/* The message of a failed restore: which state, which instance, why:
 * reason, or else the store's own message (a failure the store did not
 * report, such as the load's, passes its reason, as the store's last
 * message would not be about it). */
static int restore_failed_because(sl_job *job, const sl_instance *inst,
                                  const char *what, int rc,
                                  const char *reason) {
  /* Instances restore in parallel: copy the message whole (store.h). */
  char detail[1024] = "";
  if (reason)
    snprintf(detail, sizeof detail, "%s", reason);
  else if (rc != ENOMEM)
    sl_store_error_copy(job->cp->store, detail, sizeof detail);
  sl_job_fail(job, rc, "restoring %s of operator '%s' instance %d from "
              "checkpoint %" PRIu64 " in %s failed: %s%s%s",
              what, inst->op->name, inst->index, inst->cp.restored_from,
              job->config.checkpoint.state_dir, sl_strerror(rc),
              detail[0] ? ": " : "", detail);
  return rc;
}

static int restore_failed(sl_job *job, const sl_instance *inst,
                          const char *what, int rc) {
  return restore_failed_because(job, inst, what, rc, 0);
}

static int restore_keyed(sl_job *job, sl_instance *inst) {
  sl_checkpointer *cp = job->cp;
  uint16_t op = (uint16_t)inst->op->id;
  /* Size the map once, from LMDB's counts (no read): loading into a
   * growing table costs more.  The guess is the larger of the base's and
   * the log's counts, not their sum: the log mostly rewrites keys of the
   * base (a 1M-key state after one checkpoint that changed every key: 1M
   * and 1M), and every bucket is a page the kernel zeroes (a table sized
   * for the sum was 32 of the 96 MB a 1M-key restore faulted in).  It
   * covers every operator and key group; this instance gets its share of
   * key groups, with a margin for uneven groups when it holds only some
   * of them.  An instance that holds every group needs no margin: the
   * table is then the size a map that grew to those keys has (the next
   * power of two, load 0.5 to 1), where a quarter more doubled it at 1M
   * keys (2M buckets, 16 of the 80 MB a 1M-key restore faulted in; the
   * 8 MB saved are fresh pages the kernel no longer zeroes).  A guess too
   * small only means some rehashing, which starts once the keys
   * outnumber the buckets and then moves a few buckets per load (cow_map.c
   * note 6). */
  uint64_t base_entries = 0, log_entries = 0;
  int rc = sl_store_entry_counts(cp->store, &base_entries, &log_entries);
  uint64_t entries = base_entries > log_entries ? base_entries : log_entries;
  uint64_t share = 0;
  if (rc == 0) {
    uint64_t groups = (uint64_t)(inst->cp.group_last - inst->cp.group_first) + 1;
    share = entries * groups / job->config.max_parallelism;
    uint64_t margin = groups < job->config.max_parallelism ? share / 4 : 0;
    rc = sl_cow_map_reserve(inst->cp.keyed, share + margin);
  }
  /* Note 6: UINT64_MAX, no override: the map's own default stands. */
  uint64_t stage_min = env_number("SLUICE_STAGE_MIN_BUCKETS", UINT64_MAX);
  if (stage_min != UINT64_MAX)
    sl_cow_map_set_load_stage(inst->cp.keyed, stage_min,
                              SL_COW_STAGE_REGION_BUCKETS,
                              SL_COW_STAGE_BUDGET_BYTES);
  bool read = rc == 0;
  /* Note 5: a helper faults in what the load will write, if it is worth a
   * thread and one can be had (without one the load faults as before). */
  sl_prefault *helper = 0;
  if (read && share >= env_number("SLUICE_PREFAULT_MIN_ENTRIES",
                                  RESTORE_PREFAULT_MIN_ENTRIES) &&
      sl_prefault_start(&helper) == 0)
    sl_cow_map_load_prefault(inst->cp.keyed, helper, share);
  restore_load load = {.map = inst->cp.keyed};
  if (read)
    rc = sl_store_read_state(cp->store, op, inst->cp.group_first,
                             inst->cp.group_last, restore_entry, &load);
  if (read) { /* always ends the bulk load, also after an error */
    int finished = sl_cow_map_load_finish(inst->cp.keyed);
    sl_prefault_destroy(helper); /* stopped by the finish */
    /* The store's keys are unique: a duplicate means a damaged store. */
    if (rc == 0 && finished) {
      rc = finished == EINVAL ? SL_ECORRUPT : finished;
      load.rc = rc;
    }
  }
  if (rc && rc == load.rc) /* the load's, not the store's */
    return restore_failed_because(
        job, inst, "keyed state", rc,
        rc == SL_ECORRUPT ? "the store's entries repeat a key, or hold one "
                            "over 1 GiB"
                          : 0);
  return rc ? restore_failed(job, inst, "keyed state", rc) : 0;
}

/* Note 4: the entries of one channel's state, data[0, bytes), are well
 * formed.  0, or SL_ECORRUPT with *bad the offset of the first bad one
 * and why. */
static int channel_entries_check(const sl_job *job, const uint8_t *data,
                                 uint64_t bytes, uint64_t *bad,
                                 const char **why) {
  uint64_t at = 0;
  while (at < bytes) {
    *bad = at;
    sl_entry e;
    if (bytes - at < sizeof e) {
      *why = "an entry header is cut short";
      return SL_ECORRUPT;
    }
    memcpy(&e, data + at, sizeof e);
    uint64_t size;
    if (e.kind == SL_ENTRY_RECORDS) {
      if (e.count == 0 || (e.flags & ~SL_ENTRY_HAS_TS) != 0 ||
          e.record_bytes > job->config.max_record_bytes) {
        *why = "a records entry has a bad count, flags or record size";
        return SL_ECORRUPT;
      }
      size = sl_entry_bytes(&e);
    } else if (e.kind == SL_ENTRY_WATERMARK || e.kind == SL_ENTRY_IDLE) {
      if (e.flags != 0 || e.count != 0 || e.record_bytes != 8) {
        *why = "a watermark or idle entry is malformed";
        return SL_ECORRUPT;
      }
      size = 16;
    } else {
      *why = "an entry of a kind channel state never holds";
      return SL_ECORRUPT;
    }
    if (size > bytes - at) {
      *why = "an entry runs past the channel's bytes";
      return SL_ECORRUPT;
    }
    at += size;
  }
  return 0;
}

/* Note 4: the channel section of a blob, section[0, bytes), into
 * inst->cp.replay (one malloc'd, 8-aligned copy per channel).  0,
 * ENOMEM, or SL_ECORRUPT with the job failed naming where. */
int sl_restore_channel_state(sl_instance *inst, const uint8_t *section,
                             uint64_t bytes) {
  sl_job *job = inst->job;
  sl_channel_state *replay =
      calloc((size_t)(inst->channel_count ? inst->channel_count : 1),
             sizeof *replay);
  if (!replay)
    return ENOMEM;
  uint64_t at = 0;
  int64_t channel = -1;  /* the last channel read, for the order */
  int64_t named = -1;    /* the channel whose header was read last */
  uint64_t bad = 0;
  const char *why = 0;
  int rc = 0;
  while (rc == 0 && at < bytes) {
    uint32_t head[2];
    uint64_t size;
    bad = at;
    if (bytes - at < 16) {
      why = "a channel header is cut short";
      rc = SL_ECORRUPT;
      break;
    }
    memcpy(head, section + at, 8);
    memcpy(&size, section + at + 8, 8);
    named = head[0];
    if (head[1] != 0 || (int64_t)head[0] <= channel ||
        head[0] >= (uint32_t)inst->channel_count) {
      why = "a channel index is out of range or out of order (a channel "
            "state of another job?)";
      rc = SL_ECORRUPT;
      break;
    }
    channel = head[0];
    if (size == 0 || size % 8 != 0 || size > bytes - at - 16) {
      why = "a channel's byte count is zero, unaligned or too large";
      rc = SL_ECORRUPT;
      break;
    }
    uint64_t entry_bad = 0;
    rc = channel_entries_check(job, section + at + 16, size, &entry_bad, &why);
    if (rc) {
      bad = at + 16 + entry_bad;
      break;
    }
    replay[channel].data = malloc(size);
    if (!replay[channel].data) {
      rc = ENOMEM;
      break;
    }
    memcpy(replay[channel].data, section + at + 16, size);
    replay[channel].bytes = size;
    at += 16 + size;
  }
  if (rc) {
    for (int c = 0; c < inst->channel_count; c++)
      free(replay[c].data);
    free(replay);
    if (rc == SL_ECORRUPT)
      sl_job_fail(job, rc, "restoring the channel state of operator '%s' "
                  "instance %d from checkpoint %" PRIu64 " in %s failed: "
                  "%s: %s, at byte %" PRIu64 " of the channel state "
                  "(channel %" PRId64 ")",
                  inst->op->name, inst->index, inst->cp.restored_from,
                  job->config.checkpoint.state_dir, sl_strerror(rc), why,
                  bad, named);
    return rc;
  }
  inst->cp.replay = replay;
  return 0;
}

/* The instance's blob: a flag byte (operator state saved or not), then the
 * state (write_instance). */
static int restore_blob(sl_job *job, sl_instance *inst) {
  void *blob = 0;
  uint32_t bytes = 0;
  int rc = sl_store_get_blob(job->cp->store, (uint16_t)inst->op->id,
                             (uint16_t)inst->index, &blob, &bytes);
  if (rc == SL_ENOTFOUND)
    return 0;
  uint8_t flags = rc == 0 && bytes >= 1 ? ((uint8_t *)blob)[0] : 0;
  if (rc == 0 &&
      (bytes < 1 || (flags & ~SL_BLOB_FLAGS) != 0 ||
       ((flags & SL_BLOB_EVENT_TIME) && bytes < 1 + SL_BLOB_EVENT_TIME_BYTES)))
    rc = SL_ECORRUPT;
  if (rc) {
    free(blob);
    return restore_failed(job, inst, "operator state", rc);
  }
  if (flags & SL_BLOB_FINISHED) /* coordinator.c note 10 */
    inst->cp.restored_finished = true;
  if (flags & SL_BLOB_EVENT_TIME) { /* the trailer (write_instance) */
    bytes -= 16;
    memcpy(inst->cp.event_time_restored, (uint8_t *)blob + bytes, 16);
    inst->cp.has_event_time_restored = true;
  }
  uint32_t skip = 1; /* the flag byte, and the channel state if any */
  if (flags & SL_BLOB_CHANNELS) { /* note 4 */
    uint64_t section = 0;
    if (bytes >= 9)
      memcpy(&section, (uint8_t *)blob + 1, 8);
    if (bytes < 9 || section > bytes - 9 || (flags & SL_BLOB_FINISHED)) {
      free(blob);
      return restore_failed(job, inst, "channel state (its length)",
                            SL_ECORRUPT);
    }
    rc = sl_restore_channel_state(inst, (uint8_t *)blob + 9, section);
    if (rc) {
      free(blob);
      return rc == SL_ECORRUPT ? rc
                               : restore_failed(job, inst, "channel state", rc);
    }
    skip = 9 + (uint32_t)section;
  }
  if ((flags & SL_BLOB_STATE) == 0) {
    free(blob);
    return 0;
  }
  memmove(blob, (uint8_t *)blob + skip, bytes - skip); /* the state only */
  inst->cp.blob_restored = blob;
  inst->cp.blob_restored_bytes = bytes - skip;
  inst->cp.has_blob_restored = true;
  return 0;
}

static int restore_instance(sl_job *job, sl_instance *inst) {
  /* Note 3: every instance of a final checkpoint had finished, also in a
   * store older than SL_BLOB_FINISHED. */
  inst->cp.restored_finished = job->cp->restored_final;
  /* failover.c note 7: a map rolled back in memory is restored already. */
  int rc = inst->cp.keyed && !inst->cp.keyed_rolled_back
               ? restore_keyed(job, inst) : 0;
  return rc ? rc : restore_blob(job, inst);
}

/* Note 3: whether checkpoint id (being restored) is a final one, from
 * its record (cp_record, written by write_once: u32 version, u32 final,
 * ...). */
static int read_restored_final(sl_job *job, uint64_t id) {
  sl_checkpointer *cp = job->cp;
  void *record = 0;
  uint32_t bytes = 0;
  int rc = sl_store_get_checkpoint(cp->store, id, &record, &bytes);
  cp->restored_final = false;
  if (rc == 0) {
    uint32_t head[2] = {0, 0};
    if (bytes >= sizeof head)
      memcpy(head, record, sizeof head);
    bool known = (head[0] == 1 && bytes == 24) ||
                 (head[0] == 2 && bytes == SL_CP_RECORD_V2_BYTES) ||
                 (head[0] == 3 && bytes == sizeof(cp_record));
    if (!known || head[1] > 1)
      rc = SL_ECORRUPT;
    cp->restored_final = rc == 0 && head[1] == 1;
  }
  free(record);
  if (rc)
    sl_job_set_error(job, "%s: the record of checkpoint %" PRIu64
                     " cannot be read: %s%s%s",
                     job->config.checkpoint.state_dir, id, sl_strerror(rc),
                     rc == SL_ECORRUPT ? "" : ": ",
                     rc == SL_ECORRUPT ? "" : sl_store_error(cp->store));
  return rc;
}

/* Key groups owned by instance k of p: a contiguous range. */
static void group_range(uint32_t groups, int parallelism, int k,
                        uint16_t *first, uint16_t *last) {
  uint32_t lo = UINT32_MAX, hi = 0;
  for (uint32_t g = 0; g < groups; g++)
    if (sl_group_instance(g, groups, parallelism) == k) {
      if (g < lo)
        lo = g;
      hi = g;
    }
  assert(lo <= hi);
  *first = (uint16_t)lo;
  *last = (uint16_t)hi;
}

static int open_store(sl_job *job) {
  sl_checkpointer *cp = job->cp;
  const struct sl_checkpoint_config *c = &job->config.checkpoint;
  char *fingerprint = sl_graph_fingerprint(job);
  if (!fingerprint)
    return ENOMEM;
  /* A savepoint becomes the store first (savepoint.c); its checkpoint is
   * then resumed whatever store_policy says (SL_STORE_FRESH chose to
   * replace what the directory held with it). */
  bool installed = c->from_savepoint != 0;
  int rc = installed ? sl_savepoint_install(job, fingerprint) : 0;
  if (rc) {
    free(fingerprint);
    return rc; /* the message is set */
  }
  sl_store_options options = {.graph_fingerprint = fingerprint,
                              .no_sync = c->no_sync,
                              .initial_map_bytes = c->initial_map_bytes};
  char err[SL_ERROR_BYTES];
  err[0] = 0;
  rc = sl_store_open(c->state_dir, &options, &cp->store, err, sizeof err);
  free(fingerprint);
  if (rc) {
    sl_job_set_error(job, "state directory: %s", err[0] ? err : sl_strerror(rc));
    return rc;
  }
  sl_store_set_cancel(cp->store, &cp->compaction_cancel);
  if (job->faults)
    sl_store_set_fault(cp->store, sl_inject_store_call, job);
  uint64_t latest = sl_store_latest(cp->store);
  if (latest == 0) {
    /* Nothing to resume: a resume of a job that never completed a
     * checkpoint is its first start (sluice.h, store_policy). */
    if (c->store_policy == SL_STORE_RESUME)
      sl_log(SL_LOG_INFO, "sluice: no complete checkpoint in %s: starting "
             "fresh", c->state_dir);
    return 0;
  }
  if (c->store_policy == SL_STORE_FRESH && !installed) {
    rc = sl_store_wipe(cp->store);
    if (rc)
      sl_job_set_error(job, "%s: cannot start fresh: %s", c->state_dir,
                       sl_strerror(rc));
    return rc;
  }
  if (c->store_policy != SL_STORE_RESUME && !installed) {
    sl_job_set_error(job,
                     "%s holds checkpoints (the newest complete one is %" PRIu64
                     "); ask to resume from it or to start fresh (which "
                     "deletes them)",
                     c->state_dir, latest);
    return SL_EHASSTATE;
  }
  sl_log(SL_LOG_INFO, "sluice: resuming from checkpoint %" PRIu64 " in %s",
         latest, c->state_dir);
  cp->restored_from = latest;
  cp->last_id = latest;
  atomic_store(&job->cp_completed_id, latest);
  atomic_store(&job->cp_settled_id, latest);
  return 0;
}

/* Keyed-state maps for instances whose every input is key-partitioned. */
static int setup_instances(sl_job *job) {
  for (int i = 0; i < job->instance_count; i++) {
    sl_instance *inst = job->instances[i];
    bool keyed = inst->channel_count > 0 &&
                 (inst->op->kind == SL_OP_PROCESS || inst->op->kind == SL_OP_SINK);
    for (int c = 0; c < inst->channel_count; c++)
      keyed = keyed && inst->channels[c].key;
    inst->cp.keyed_input = keyed;
    if (!keyed)
      continue;
    /* One kind of key per operator (graph.c, validation): the first
     * channel's says which layout state.c and timer.c use. */
    inst->cp.byte_keys = sl_channel_bytes(&inst->channels[0]);
    for (int c = 1; c < inst->channel_count; c++)
      assert(sl_channel_bytes(&inst->channels[c]) == inst->cp.byte_keys);
    int rc = sl_cow_map_create(&inst->cp.keyed);
    if (rc)
      return rc;
    /* sluice.h, checkpoint_copy_pass_bytes; 0 leaves the map's limits. */
    int64_t pass = job->config.checkpoint_copy_pass_bytes;
    assert(pass >= SL_COPY_PASS_OFF); /* graph.c refused the rest */
    if (pass != 0)
      sl_cow_map_set_copy_pass(inst->cp.keyed, pass > 0 ? UINT64_MAX : 0,
                               pass > 0 ? (uint64_t)pass : 0);
    if (job->test_index_fail_nth) /* sl_testing_fail_state_index */
      sl_cow_map_test_fail_alloc(inst->cp.keyed,
                                 SL_COW_FAIL_DIRTY_INDEX_BLOCK,
                                 job->test_index_fail_nth);
    group_range(job->config.max_parallelism, inst->op->parallelism,
                inst->index, &inst->cp.group_first, &inst->cp.group_last);
  }
  return 0;
}

/* A restart (failover.c): the store stays open and is our own, so the
 * newest complete checkpoint in it is restored whatever store_policy says.
 * Ids go on from the highest ever triggered: every id at or below it is now
 * complete or aborted. */
static int reopen_for_restart(sl_job *job) {
  sl_checkpointer *cp = job->cp;
  uint64_t latest = sl_store_latest(cp->store);
  cp->restored_from = latest;
  if (latest > cp->last_id)
    cp->last_id = latest;
  atomic_store(&job->cp_completed_id, latest);
  atomic_store(&job->cp_settled_id, cp->last_id);
  atomic_store(&job->cp_final_done, 0);
  return 0;
}

/* Called by sl_job_start after compiling, before any thread starts, and by
 * a restart after sl_checkpointer_reset(): keyed state maps for every
 * keyed instance, and with checkpointing on, the store opened (refused if
 * foreign or holding checkpoints without a choice) and the newest complete
 * checkpoint restored. */
int sl_checkpointer_setup(sl_job *job) {
  int rc = setup_instances(job);
  if (rc || !job->config.checkpoint.state_dir)
    return rc;
  if (job->cp) {
    assert(job->restarting);
    rc = reopen_for_restart(job);
  } else {
    rc = sl_checkpointer_alloc(job);
    if (rc == 0)
      rc = open_store(job);
  }
  /* Each instance restores its own state on its thread, in parallel
   * (sl_checkpointer_restore_instance). */
  uint64_t from = rc == 0 ? atomic_load(&job->cp->restored_from) : 0;
  if (rc == 0)
    job->cp->restored_final = false;
  if (from)
    rc = read_restored_final(job, from);
  for (int i = 0; i < job->instance_count && rc == 0; i++)
    job->instances[i]->cp.restored_from = from;
  atomic_store(&job->restores_pending, from ? job->instance_count : 0);
  return rc;
}

/* On the instance's thread, after open and before its restore hook: its
 * keyed state and operator state from the checkpoint being restored.  A
 * failure fails the job with the store's status and message. */
int sl_checkpointer_restore_instance(sl_instance *inst) {
  sl_job *job = inst->job;
  if (!inst->cp.restored_from || !job->cp)
    return 0;
  /* DESIGN.md invariant 6: every instance restores the same checkpoint,
   * the newest complete one. */
  assert(inst->cp.restored_from == atomic_load(&job->cp->restored_from));
  assert(inst->cp.restored_from == sl_store_latest(job->cp->store));
  int rc = restore_instance(job, inst);
  sl_checkpointer_restore_skip(inst);
  return rc;
}

/* The instance is done with restoring (or will not restore: its open
 * failed), so the count of instances still restoring goes down. */
void sl_checkpointer_restore_skip(sl_instance *inst) {
  sl_job *job = inst->job;
  if (!inst->cp.restored_from || !job->cp)
    return;
  if (atomic_fetch_sub(&job->restores_pending, 1) == 1)
    atomic_store(&job->restored_ns, sl_now_ns());
}
