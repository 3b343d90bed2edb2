/* fixtures.h — the pieces of test jobs that many suites need: the key of
 * an sl_tuple, the keyed running count (and sum) kept in keyed value
 * state, the "key,value" line of a file sink, and a uint64 position kept
 * in operator state (the snapshot and restore of most test sources and
 * sinks), a sink that collects every record in memory, the config of a
 * checkpointed test job, the verified keyed job that resumes, and this
 * process's threads by name.
 *
 * Compiled once (fixtures.c) into a static library that every test
 * executable links, rather than written as static functions in a header:
 * these are operator callbacks whose addresses the tests pass to the
 * builders, so one definition serves them all, and a suite that uses only
 * some of them gets no unused-function warnings under -Werror.
 *
 * Plain C with no Criterion, so the TSan stress programs (where Criterion
 * aborts) use the same job as the Criterion suites.  Every callback obeys
 * the engine's callback contract: 0 on success, nonzero fails the job. */
#ifndef SL_TEST_FIXTURES_H
#define SL_TEST_FIXTURES_H

#include <stdint.h>
#include <sys/types.h>

#include "sluice.h"

/* ------------------------------------------------------------ keys */

/* The key of a record that starts with a uint64 key (sl_tuple and the
 * tests' own records): a key function for sl_op_key_by. */
uint64_t sl_fixture_tuple_key(void *user, const sl_record *in);

/* ------------------------------------------------------------ keyed state */

/* Add delta to the current key's uint64 in keyed value state 0 (absent
 * counts as 0) and put the new total in *total.  Returns 0, or the error
 * of sl_state_get / sl_state_put; on error *total is untouched. */
int sl_fixture_state_add(sl_ctx *ctx, uint64_t delta, uint64_t *total);

/* The keyed running count: for each sl_tuple {key, value} it counts the
 * key in keyed state and emits the sl_tuple {key, count}.  A process
 * callback for sl_op_process after sl_op_key_by(sl_fixture_tuple_key). */
int sl_fixture_count_process(sl_ctx *ctx, void *state, int input,
                             const sl_record *in);

/* The keyed running count with the record: for each sl_tuple {key,
 * value} it emits an sl_fixture_counted {key, value, count}, count being
 * the key's running count in keyed state (sl_fixture_state_add). */
typedef struct sl_fixture_counted {
  uint64_t key, value, count;
} sl_fixture_counted;
int sl_fixture_count_with_record(sl_ctx *ctx, void *state, int input,
                                 const sl_record *in);

/* ------------------------------------------------------------ sources */

/* The gated keyed source: record i = {key = i % keys, value = i};
 * instance k of p emits the keys with key % p == k, in order (as
 * sl_source_keyed), or, with parts > 0, this source operator (of
 * parallelism 1) emits the keys with key % parts == part, so several
 * source operators share the keys.  Until a checkpoint completed in the
 * current attempt an instance stops after `gate` records (0: no gate), so
 * a failover test has a checkpoint to restore from.  Its position is its
 * operator state.  user: a sl_fixture_gated_source that outlives the job. */
typedef struct sl_fixture_gated_source {
  uint64_t count, keys, gate;
  uint64_t part, parts;
} sl_fixture_gated_source;
extern const sl_source_ops sl_fixture_gated_ops;

/* ------------------------------------------------------------ output */

/* "key,value,count" of an sl_fixture_counted: a format callback for file
 * sinks, as sl_fixture_format_tuple. */
int sl_fixture_format_counted(void *user, const sl_record *in, char *buffer,
                              uint32_t buffer_bytes);

/* "key,value" of an sl_tuple: a format callback for file sinks.  Returns
 * the line's length, or more than buffer_bytes when it does not fit (the
 * sink then asks again with a larger buffer). */
int sl_fixture_format_tuple(void *user, const sl_record *in, char *buffer,
                            uint32_t buffer_bytes);

/* ------------------------------------------------------------ positions */

/* Keep *position as this instance's operator state (its snapshot). */
int sl_fixture_save_position(sl_ctx *ctx, const uint64_t *position);

/* Load this instance's operator state into *position (its restore): 0 and
 * *position unchanged when there is none, -EINVAL when it cannot be read
 * or is not 8 bytes. */
int sl_fixture_load_position(sl_ctx *ctx, uint64_t *position);

/* ------------------------------------------------------------ config */

/* The config of a checkpointed test job: state in state_dir, a checkpoint
 * every interval_ms, no fsync (the tests kill processes, never the
 * machine) and 64 KiB rings (small, so barriers queue behind few
 * records).  The rest is zero: the caller adds what its test is about. */
sl_job_config sl_fixture_config(const char *state_dir, uint32_t interval_ms);

/* The verified keyed job that resumes: sl_source_keyed "src" (source_p
 * instances, count records over keys) -> sl_sink_verify "verify" (sink_p
 * instances), default rings, a checkpoint every 5 ms on state_dir without
 * fsync, resumed from the newest checkpoint there if it holds one
 * (SL_STORE_RESUME).  The job is built, not started, into *job, and its
 * verifying sink into *sink (for sl_verify_result).  Returns 0, or the
 * error of the sl_* call that failed with *job and *sink untouched and
 * nothing left behind. */
int sl_fixture_verified_job(const char *state_dir, int source_p, int sink_p,
                            uint64_t count, uint64_t keys, sl_job **job,
                            sl_op **sink);

/* ------------------------------------------------------------ collector */

/* A sink that keeps every record it gets, per instance, in memory, and
 * checkpoints how many it kept: a restore drops what came after the
 * checkpoint (the records the restored sources replay), so after
 * failovers the collector holds exactly the committed run.  The records
 * must all be record_bytes long (else the job fails naming the sink).
 * Give sl_fixture_collector_ops with user = the collector to sl_op_sink
 * (at most SL_FIXTURE_COLLECTOR_INSTANCES instances). */
#define SL_FIXTURE_COLLECTOR_INSTANCES 8

typedef struct sl_fixture_collected {
  void *items; /* count records of record_bytes each */
  uint64_t count, capacity;
  uint32_t record_bytes;
} sl_fixture_collected;

typedef struct sl_fixture_collector {
  uint32_t record_bytes; /* set before the job runs */
  sl_fixture_collected per[SL_FIXTURE_COLLECTOR_INSTANCES];
} sl_fixture_collector;

extern const sl_process_ops sl_fixture_collector_ops;

/* The collector's callbacks, for a sink that adds to them (the process
 * callback appends a copy of in->data, and returns 0, -EINVAL for a
 * record of the wrong size, or -ENOMEM). */
int sl_fixture_collector_open(sl_ctx *ctx, void *user, void **state);
int sl_fixture_collector_process(sl_ctx *ctx, void *state, int input,
                                 const sl_record *in);
int sl_fixture_collector_snapshot(sl_ctx *ctx, void *state, uint64_t id);
int sl_fixture_collector_restore(sl_ctx *ctx, void *state, uint64_t id);

/* The record the last successful process call kept (state as given to
 * the sink's callbacks). */
void *sl_fixture_collector_last(void *state);

/* Every instance's records in one array sorted by compare (free() it),
 * their number in *count; the collector is emptied.  NULL if out of
 * memory. */
void *sl_fixture_collector_gather(sl_fixture_collector *c,
                                  int (*compare)(const void *, const void *),
                                  uint64_t *count);

/* ------------------------------------------------------------ threads */

/* The threads of this process by name, read from /proc/self/task/N/comm
 * (the engine names its threads: "sl:NAME[i]" after the instance a thread
 * runs first, "sl:writer", "sl:coordinator").  A thread that exits during
 * the walk is left out.  Each returns 0, or the errno of listing
 * /proc/self/task with the out-parameter untouched. */

/* How many threads have a name that starts with prefix ("": every thread
 * of the process) into *count. */
int sl_fixture_threads_named(const char *prefix, int *count);

/* The id of the thread named exactly name into *tid; 0 if there is none
 * (the first found if there are several). */
int sl_fixture_thread_named(const char *name, pid_t *tid);

#endif /* SL_TEST_FIXTURES_H */
