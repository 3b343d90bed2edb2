/* sluice_testing.h — test and benchmark helpers (operators/builtin.c,
 * operators/verify.c).
 *
 * UNSTABLE: installed so that tests and benchmarks outside this tree can
 * use them, but with no API or ABI promise: any release may change or
 * remove them.  sluice.h does not include this header; include it
 * yourself.  Programs should build on the sources and sinks of
 * sluice_io.h, sluice_embed.h and sluice_table.h instead.
 *
 * The sources emit sl_tuple records (sluice.h); the verifying sink and
 * sl_verify_output_dir() count lost, duplicated and out-of-order records
 * against the keyed source's order (the exactly-once check of the failure
 * tests); the checksum sink sums what it sees, order-independently.
 */
#ifndef SLUICE_TESTING_H
#define SLUICE_TESTING_H

#include <stddef.h>
#include <stdint.h>

#include "sluice.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A source of `count` sl_tuple records {key = i % key_count, value = i},
 * i = 0 .. count-1, split into `parallelism` contiguous ranges (instance k
 * emits its range in order).  key_count 0 means key = i.  Records carry no
 * timestamp.  Errors: as the builders. */
int sl_source_sequence(sl_job *job, const char *name, int parallelism,
                       uint64_t count, uint64_t key_count, sl_op **op);

/** A source of `count` sl_tuple records {key = i % keys, value = i},
 * i = 0 .. count-1, in which instance k of `parallelism` emits the records
 * whose key % parallelism == k, in order.  Each key thus has one producer,
 * and its records arrive anywhere downstream in sequence (the j-th record of
 * a key has value j * keys + key), which is what sl_sink_verify() checks.
 * Replayable (the position is checkpointed).  Errors: EINVAL (keys 0), as
 * the builders. */
int sl_source_keyed(sl_job *job, const char *name, int parallelism,
                    uint64_t count, uint64_t keys, sl_op **op);

/** What a verifying sink found, per key against the keyed source's order,
 * summed over its instances (operators/verify.c has the definitions). */
typedef struct sl_verify_counts {
  uint64_t records;      /* received */
  uint64_t in_order;     /* the next one expected for its key */
  uint64_t duplicates;   /* a sequence number already passed */
  uint64_t out_of_order; /* ahead of the next expected: a gap opened */
  uint64_t lost;         /* expected, and neither in order nor ahead */
  int complete;          /* every instance reached the end of input */
  uint64_t pending_files; /* sl_verify_output_dir: uncommitted parts */
} sl_verify_counts;

/** A verifying sink for failure-injection tests: it partitions input (the
 * records of sl_source_keyed() with `count` and `keys`, or of any operator
 * that forwards them) by key with a key_by named NAME.key, and counts lost,
 * duplicated and out-of-order records per key.  Its counts are checkpointed
 * state, so after failures and restarts they describe the committed run:
 * exactly-once means lost = duplicates = out_of_order = 0.  A record that is
 * not such a tuple fails the job.  Errors: EINVAL, as the builders. */
int sl_sink_verify(sl_job *job, const char *name, sl_op *input,
                   int parallelism, uint64_t count, uint64_t keys, sl_op **op);

/** The counts of a verifying sink (after sl_job_wait(); complete says
 * whether the run reached its end).  Errors: EINVAL (not a verifying
 * sink). */
int sl_verify_result(const sl_op *op, sl_verify_counts *counts);

/** The checker of committed output files: reads the committed files of a
 * file sink's directory (part-K-SEQ* in (K, SEQ) order, and out-K*), whose
 * lines begin "KEY,VALUE" (decimal; more fields may follow), and counts as
 * the verifying sink does against sl_source_keyed(count, keys); so it
 * assumes each key's lines are in one instance's files, as a keyed sink
 * writes them.  Also counts uncommitted (.part-*) files.  Returns 0, or
 * EINVAL for a malformed line or a key >= keys (err says which file and
 * line), an errno for an unreadable directory or file, ENOMEM. */
int sl_verify_output_dir(const char *dir, uint64_t count, uint64_t keys,
                         sl_verify_counts *counts, char *err,
                         size_t err_bytes);

/** What a checksum sink saw, summed over its instances when they close.
 * Order-independent, so two runs that deliver the same multiset of records
 * compare equal whatever the interleaving. */
typedef struct sl_checksum {
  uint64_t records;
  uint64_t bytes;
  uint64_t value_sum; /* sum of the second 64-bit word (sl_tuple.value) of
                         records of at least 16 bytes */
  uint64_t hash_sum;  /* sum of a 64-bit hash of each record's bytes */
} sl_checksum;

/** A sink that adds what it receives into *result (which must outlive the
 * run; zero it first).  Errors: as the builders. */
int sl_sink_checksum(sl_job *job, const char *name, sl_op *input,
                     int parallelism, sl_checksum *result, sl_op **op);

/** The checksum contribution of one record, as the checksum sink computes
 * it; lets a test compute the expected sums independently of the engine. */
void sl_checksum_add(sl_checksum *sum, const void *data, uint32_t size_bytes);

/** Which allocator holds the job's keyed state, and how much.  Writes
 * "jemalloc" or "malloc" (NUL-terminated) into name (bytes long), and sets
 * *allocated_bytes to the bytes the arenas of the job's keyed-state maps
 * hold, per jemalloc's statistics refreshed by this call (the library
 * allocates keyed state through jemalloc's explicit API in a private arena
 * per operator instance, whatever malloc the host process uses; objects
 * jemalloc caches for the map count as held).  0 with "malloc" (builds
 * without jemalloc: sanitizer builds, -Djemalloc=disabled) and for a job
 * with no keyed state.  Call it on the job's owning thread before
 * sl_job_start() or after sl_job_wait() (or sl_job_run()) returned, before
 * sl_job_destroy().  Errors: EINVAL (an argument NULL or bytes 0),
 * SL_EUSAGE (the job is running), ERANGE (name too short: 9 bytes hold
 * either answer), or a jemalloc mallctl error. */
int sl_testing_state_allocator(sl_job *job, char *name, size_t bytes,
                               uint64_t *allocated_bytes);

/** Replace the 64-bit hash of byte-string keys (sl_op_key_by_bytes) in job
 * by hash, e.g. a constant one so that every key collides: the test that
 * keyed state, timers and windows still keep the keys apart.  The hash
 * decides key groups too, so a store written under one hash must be
 * resumed under the same.  NULL restores XXH3.  Call before the job
 * starts, from the building thread.  Errors: EINVAL (job NULL),
 * SL_ESTARTED. */
int sl_testing_set_key_hash(sl_job *job,
                            uint64_t (*hash)(const void *key,
                                             uint32_t key_bytes));

/** In every keyed-state map of job, from its start on, make the nth block
 * of the dirty list's index that the map allocates fail, once (0: none),
 * as if memory had run out: the epoch goes on without an index, and the
 * checkpoint writer follows that epoch's list instead of the index
 * (storage/cow_map.h note 11).  Call before the job starts, from the
 * building thread.  Errors: EINVAL (job NULL), SL_ESTARTED. */
int sl_testing_fail_state_index(sl_job *job, uint32_t nth);

/** Epochs whose dirty list lost its index, summed over job's keyed-state
 * maps (sl_testing_fail_state_index, or real allocation failures).  Call
 * after sl_job_wait() returned, before sl_job_destroy(); 0 for NULL. */
uint64_t sl_testing_state_index_drops(const sl_job *job);

/** Copy passes (storage/cow_map.c note 17: a checkpoint's delta copied in
 * steps after its barrier) begun, summed over job's keyed-state maps.
 * Call after sl_job_wait() returned, before sl_job_destroy(); 0 for
 * NULL. */
uint64_t sl_testing_state_copy_passes(const sl_job *job);

/** Entries restored through a staged bulk load (storage/cow_map.c note
 * 18), summed over job's keyed-state maps.  Call after sl_job_wait()
 * returned, before sl_job_destroy(); 0 for NULL. */
uint64_t sl_testing_state_load_staged(const sl_job *job);

/** Keyed state of at least min_state_bytes (0: any size the prefetch
 * runs at) gets the second entries of its hash chains fetched ahead too
 * (engine/runtime.c note 13), instead of from state.c's default size on.
 * Call before the job starts, from the building thread.  Errors: EINVAL
 * (job NULL), SL_ESTARTED. */
int sl_testing_state_chain_prefetch(sl_job *job, uint64_t min_state_bytes);

/** Slices of records whose chains' second entries were fetched ahead
 * (sl_testing_state_chain_prefetch), summed over job's instances.  Call
 * after sl_job_wait() returned, before sl_job_destroy(); 0 for NULL. */
uint64_t sl_testing_state_chain_prefetches(const sl_job *job);

/** Versions an instance copies per step of a copy pass (engine/snapshot.c
 * note 14), instead of the default: 1 keeps a checkpoint's ack held for
 * many steps, so that a stop or the next barrier finds it held.  Call
 * before the job starts, from the building thread.  Errors: EINVAL (job
 * NULL or budget 0), SL_ESTARTED. */
int sl_testing_state_copy_budget(sl_job *job, uint32_t budget);

#ifdef __cplusplus
}
#endif
#endif /* SLUICE_TESTING_H */
