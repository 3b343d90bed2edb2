/* fixtures.h — the jobs the benchmarks and the command-line tool build
 * again and again, written once: the pieces of P1 (map, filter), the key of
 * a 16-byte sl_tuple, the keyed running count (one 8-byte count per key in
 * keyed state), the source -> key_by -> process -> sink shape around it,
 * and the small chores of a measured run (CPU time, counting completed
 * checkpoints, removing a temporary state directory).
 *
 * Notes on the design:
 *  1. Header only, every function static inline, like bench_util.h: a
 *     program that includes it needs no extra object to link, and a
 *     callback taken from here is the same static function the program
 *     used to write itself.  The record path is the library's; these
 *     callbacks do the same work per record as the copies they replace
 *     (no extra call, no extra branch on the common path).
 *  2. It needs only include/sluice.h and libc, not bench_util.h, so cli/
 *     can include it too (add bench/ to the CLI's include directories).
 *  3. Every builder returns 0 or the error of the sl_* call that failed,
 *     and leaves cleaning up the job to the caller (sl_job_destroy frees
 *     every operator added so far).
 */
#ifndef SL_BENCH_FIXTURES_H
#define SL_BENCH_FIXTURES_H

#include <assert.h>
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "sluice.h"

/* The keyed state id the running count keeps its count under. */
#define FIXTURE_COUNT_STATE 0

/* ------------------------------------------------------------- records */

/* Key of a 16-byte sl_tuple {key, value} for sl_op_key_by: its key.  Any
 * record of 16 bytes or more that starts with a uint64_t key may use it. */
static inline uint64_t fixture_tuple_key(void *user, const sl_record *in) {
  (void)user;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  return t.key;
}

/* P1's map: value = value * 3 + 1, key kept. */
static inline int fixture_p1_map(void *user, const sl_record *in, void *out,
                                 uint32_t *out_size) {
  (void)user;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  t.value = t.value * 3 + 1;
  memcpy(out, &t, sizeof t);
  *out_size = sizeof t;
  return 0;
}

/* P1's filter: keeps the tuples whose value is not a multiple of 4. */
static inline int fixture_p1_filter(void *user, const sl_record *in) {
  (void)user;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  return t.value % 4 != 0;
}

/* A sink that drops every record (the measured work is upstream). */
static inline int fixture_discard(sl_ctx *ctx, void *state, int input,
                                  const sl_record *in) {
  (void)ctx;
  (void)state;
  (void)input;
  (void)in;
  return 0;
}

/* ------------------------------------------------------- running count */

/* An operator's open that hands the operator's user pointer to every
 * instance as its state (shared, owned by the caller, outliving the job). */
static inline int fixture_open_shared(sl_ctx *ctx, void *user, void **state) {
  (void)ctx;
  *state = user;
  return 0;
}

/* Add one to the current key's count in keyed state FIXTURE_COUNT_STATE and
 * store the new count in *count.  A key seen for the first time counts 1.
 * Returns 0, or the error of sl_state_get/sl_state_put after failing the
 * job with a message naming the key (*count is then unspecified). */
static inline int fixture_count_add(sl_ctx *ctx, uint64_t key,
                                    uint64_t *count) {
  const void *value;
  uint32_t bytes;
  uint64_t now = 0;
  int rc = sl_state_get(ctx, FIXTURE_COUNT_STATE, &value, &bytes);
  if (rc == 0 && bytes == sizeof now)
    memcpy(&now, value, sizeof now);
  else if (rc != SL_ENOTFOUND) {
    sl_ctx_fail(ctx, "keyed state of key %" PRIu64 ": %s", key,
                rc ? sl_strerror(rc) : "wrong size");
    return rc ? rc : -EINVAL;
  }
  now++;
  rc = sl_state_put(ctx, FIXTURE_COUNT_STATE, &now, sizeof now, 0);
  if (rc) {
    sl_ctx_fail(ctx, "keyed state of key %" PRIu64 ": %s", key,
                sl_strerror(rc));
    return rc;
  }
  *count = now;
  return 0;
}

/* The keyed running count as an operator: for each tuple, emit {key, the
 * number of tuples of that key so far}, the count kept in keyed state (so
 * checkpoints and restores carry it). */
static inline int fixture_running_count(sl_ctx *ctx, void *state, int input,
                                        const sl_record *in) {
  (void)state;
  (void)input;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  uint64_t count = 0;
  int rc = fixture_count_add(ctx, t.key, &count);
  if (rc)
    return rc;
  sl_tuple out = {.key = t.key, .value = count};
  return sl_emit(ctx, &out, sizeof out);
}

/* The operators after the source in the keyed job:
 * source -> key_by(key) -> "count" (parallelism) -> "sink" (sink_parallelism). */
typedef struct fixture_keyed_spec {
  sl_key_fn key;                   /* NULL: fixture_tuple_key */
  const sl_process_ops *count_ops; /* NULL: fixture_running_count */
  void *count_user;
  int parallelism;      /* of "count"; 0 means 1 */
  const sl_process_ops *sink_ops; /* fixture_keyed_job only */
  void *sink_user;
  int sink_parallelism; /* 0: the same as "count" */
} fixture_keyed_spec;

/* Add "by-key" and "count" behind `source` (see fixture_keyed_spec; its
 * sink fields are not used) and set *count, for a caller that attaches a
 * sink of its own (a built-in file or checksum sink).  Returns 0 or the
 * error of the builder call that failed. */
static inline int fixture_keyed_count(sl_job *job, sl_op *source,
                                      const fixture_keyed_spec *spec,
                                      sl_op **count) {
  static const sl_process_ops running_count_ops = {
      .process = fixture_running_count};
  assert(job && source && count);
  assert(spec->parallelism >= 0 && spec->parallelism <= SL_MAX_PARALLELISM);
  const sl_process_ops *count_ops =
      spec->count_ops ? spec->count_ops : &running_count_ops;
  int parallelism = spec->parallelism ? spec->parallelism : 1;
  sl_op *by_key;
  int rc = sl_op_key_by(job, "by-key", source,
                        spec->key ? spec->key : fixture_tuple_key, 0, &by_key);
  if (!rc)
    rc = sl_op_process(job, "count", &by_key, 1, parallelism, count_ops,
                       spec->count_user, count);
  return rc;
}

/* fixture_keyed_count, then "sink" (spec->sink_ops, sink_user) behind the
 * count; sets *sink.  Returns 0 or the error of the call that failed. */
static inline int fixture_keyed_job(sl_job *job, sl_op *source,
                                    const fixture_keyed_spec *spec,
                                    sl_op **sink) {
  int parallelism = spec->parallelism ? spec->parallelism : 1;
  int sink_parallelism =
      spec->sink_parallelism ? spec->sink_parallelism : parallelism;
  assert(spec->sink_ops); /* a keyed job without a sink has no output */
  sl_op *count;
  int rc = fixture_keyed_count(job, source, spec, &count);
  if (!rc)
    rc = sl_op_sink(job, "sink", count, sink_parallelism, spec->sink_ops,
                    spec->sink_user, sink);
  return rc;
}

/* ------------------------------------------------- source positions */

/* A source's snapshot of its position (records emitted so far) as its
 * 8-byte operator state.  Returns 0 or the error of
 * sl_operator_state_set. */
static inline int fixture_position_snapshot(sl_ctx *ctx,
                                            const uint64_t *position) {
  return sl_operator_state_set(ctx, position, sizeof *position);
}

/* Restore a position fixture_position_snapshot stored for checkpoint id
 * into *position.  Returns 0; SL_ENOTFOUND when the checkpoint came before
 * the source's first snapshot (*position untouched: the source starts
 * from 0, and its restore should return 0); the error of
 * sl_operator_state_get; or SL_ECALLBACK after failing the job when the
 * state is not 8 bytes. */
static inline int fixture_position_restore(sl_ctx *ctx, uint64_t id,
                                           uint64_t *position) {
  assert(position);
  const void *data;
  uint32_t bytes;
  int rc = sl_operator_state_get(ctx, &data, &bytes);
  if (rc)
    return rc;
  if (bytes != sizeof *position) {
    sl_ctx_fail(ctx, "checkpoint %" PRIu64 ": source position of %" PRIu32
                " bytes", id, bytes);
    return SL_ECALLBACK;
  }
  memcpy(position, data, sizeof *position);
  return 0;
}

/* ------------------------------------------------------------ chores */

/* User + system CPU time of the whole process so far, in seconds: every
 * engine thread (the checkpoint writer included) plus the main thread,
 * which only waits in sl_job_run(). */
static inline double fixture_cpu_now_s(void) {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return (double)usage.ru_utime.tv_sec + (double)usage.ru_utime.tv_usec / 1e6 +
         (double)usage.ru_stime.tv_sec + (double)usage.ru_stime.tv_usec / 1e6;
}

/* Completed checkpoints of a finished job (of the newest ones it keeps
 * statistics for). */
static inline uint64_t fixture_completed_checkpoints(const sl_job *job) {
  uint64_t completed = 0;
  sl_checkpoint_stats stats;
  for (int k = 0; sl_job_checkpoint_stats(job, k, &stats) == 0; k++)
    completed += stats.status == SL_CHECKPOINT_COMPLETED;
  return completed;
}

static inline int fixture_remove_entry(const char *path, const struct stat *st,
                                       int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path) == 0 ? 0 : errno;
}

/* Remove the directory tree `dir` (a run's temporary state directory).
 * Returns 0 or the errno of the first entry that could not be removed. */
static inline int fixture_remove_tree(const char *dir) {
  /* 16 open directories: a state directory is two levels deep. */
  return nftw(dir, fixture_remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

#endif /* SL_BENCH_FIXTURES_H */
