/* sluice.h — public interface of the sluice stream engine: the core.
 *
 * OVERVIEW
 *
 * sluice runs a dataflow job on one multi-core machine.  A job is a directed
 * acyclic graph of operators; each operator has a parallelism P and runs as P
 * instances, one thread each, optionally pinned to a CPU.  Instances are
 * connected by bounded lock-free single-producer/single-consumer rings, one
 * ring per (producer instance, consumer instance) pair.  Records and control
 * events (checkpoint barriers, watermarks, end of stream) travel in order
 * through the same rings.
 *
 * With checkpoint.state_dir set, the job takes checkpoints: barriers in-band
 * (aligned for exactly-once, or at-least-once), copy-on-write keyed state
 * snapshotted in O(1), and an asynchronous writer that commits each
 * checkpoint in one durable LMDB transaction.  A job resumed from its state
 * directory continues from the newest complete checkpoint; with replayable
 * sources and an exactly-once sink its committed output equals that of an
 * uninterrupted run.
 *
 * A job is built with the sl_op_* calls, then run with sl_job_run() (or
 * sl_job_start() + sl_job_wait()).  Records are opaque byte strings with an
 * optional 64-bit timestamp; the engine copies them into the rings, so a
 * callback may emit from a stack buffer.
 *
 *     sl_job_config config = SL_JOB_CONFIG_INIT;
 *     sl_job *job;
 *     sl_op *src, *m, *snk;
 *     sl_job_create(&config, &job);
 *     sl_op_source(job, "numbers", 1, &my_source, &state, &src);
 *     sl_op_map(job, "triple", src, 1, 16, triple_fn, NULL, &m);
 *     sl_op_sink(job, "out", m, 1, &my_sink, NULL, &snk);
 *     int rc = sl_job_run(job);
 *     if (rc != 0) fprintf(stderr, "%s\n", sl_job_error(job));
 *     sl_job_destroy(job);
 *
 * HEADERS
 *
 *   sluice.h             the core: status codes, configuration, building,
 *                        running, emitting, event time, side outputs,
 *                        keyed and operator state, hashing, logging; it
 *                        includes every header below but sluice_testing.h
 *   sluice_checkpoint.h  triggering checkpoints, savepoints, their stats
 *   sluice_metrics.h     metrics snapshots and the HTTP endpoint
 *   sluice_window.h      windows and joins (sluice_join.h includes it)
 *   sluice_io.h          memory, line, file and stdin sources; file and
 *                        stdout sinks; CSV and JSON lines
 *   sluice_embed.h       generator and push sources, callback sink
 *   sluice_table.h       LMDB table sink and its readers
 *   sluice_testing.h     test and benchmark helpers (sequence and keyed
 *                        sources, verifying and checksum sinks): installed
 *                        but unstable, no ABI promise; include it yourself
 *
 * LIBRARY RETURNS
 *
 * Every call that can fail returns an int status: 0 on success, else a
 * negative SL_E* code (sluice's own, a reserved range like LMDB's) or a
 * positive errno value (ENOMEM, EINVAL, ...) passed on as the system or
 * the library gave it.  Both kinds are final: no call flips a sign.
 * sl_strerror() turns either into text.  Each call lists its errors.
 *
 * CALLBACK RETURNS
 *
 * A callback returns 0 for success.  Any other value fails the job with
 * that value as its status: sl_job_wait() and sl_job_run() return it and
 * sl_job_error() names the operator, the instance, the cause (sl_ctx_fail)
 * and the value's text.  So a callback may pass a library call's failure
 * straight on: `return sl_state_put(...)`.  Two callbacks have a second
 * success value: a filter returns 1 to keep a record and 0 to drop it, a
 * source's next() returns SL_SOURCE_END at its end (both 1, so neither
 * can pass on EPERM).  SL_ESTOPPED, returned while the job is stopping,
 * ends the instance quietly.  SL_ECALLBACK is a generic failure code a
 * callback may return when it has no better one.
 *
 * ERROR MESSAGES
 *
 * A message lives with the handle it is about: sl_job_error(job) for
 * everything done to a job (a refused build step, a failed start, the
 * failure that ended the run) and sl_table_error(reader) for a table
 * reader.  A call that has no handle to keep it in (it creates the handle,
 * or runs on any thread beside the job's own failure: sl_job_savepoint,
 * sl_table_open, sl_schema_validate, sl_generator_validate) writes it to a
 * caller buffer given as its last two arguments (char *err, size_t
 * err_bytes; NULL or 0: none), always NUL-terminated.  Messages name
 * what and where (operator, file, line); none needs freeing.
 *
 * OWNERSHIP
 *
 * - The caller owns every handle it gets (sl_job, sl_http, table readers)
 *   and frees it with its destroy/stop/close call; each accepts NULL.
 *   sl_job_destroy() frees the job's operators (sl_op) and instances
 *   (sl_ctx): never free those.
 * - Configuration structs and strings passed in are copied before the
 *   call returns (cpus, state_dir, names, paths...), unless a call says
 *   otherwise (sl_source_memory's records, sl_sink_checksum's result in
 *   sluice_testing.h, and the user pointers: they must outlive the job).
 *   A user pointer stays the caller's, unless it is handed over with
 *   sl_op_set_user_free().
 * - A const char * returned by the library (sl_job_error, sl_strerror,
 *   sl_ctx_name, names in stats and metrics) is owned by it: valid until
 *   the handle it came from is destroyed (sl_strerror's: forever).
 * - A record pointer given to a callback is valid during that call; a
 *   state value pointer until the next state call of the instance.
 * - Out structs the caller passes (stats, metrics) are filled; only
 *   sl_metrics owns memory afterwards, freed with sl_metrics_free().
 *
 * GETTERS
 *
 * A getter is named sl_<object>_<what>(object, ...): sl_job_error,
 * sl_job_restarts, sl_ctx_instance, sl_http_port.  One that cannot fail
 * returns its value; one that can (an index out of range, a missing entry)
 * returns a status and fills its last argument: sl_job_stats(job, i,
 * &stats), sl_state_get(ctx, id, &value, &size).
 *
 * ABI
 *
 * A configuration struct the caller fills and passes by pointer and that
 * may grow (sl_job_config, sl_http_options) starts with size_t
 * struct_bytes = sizeof the struct as the caller's header had it; its
 * initializer (SL_JOB_CONFIG_INIT, SL_HTTP_OPTIONS_INIT) sets it and zeroes
 * the rest.  A later library reads only the bytes the caller knows and
 * gives newer fields their defaults; a size below the first version's, or
 * larger than the library's with nonzero bytes past its fields, is refused
 * with EINVAL.  Fields are only ever added at the end.
 *
 * The config structs given to a builder (sl_watermark_config,
 * sl_window_config, sl_file_sink_config, ...) carry no size field: the
 * builder's exported symbol is NAME_sized(..., size_t config_bytes), the
 * size last, and the header's macro NAME(...) appends sizeof the struct as
 * this header declares it, so calls are written as before, compound
 * literals included.  The library reads them by that size, as above, and
 * the refusal (EINVAL) names the builder and the struct (in sl_job_error(),
 * or err for sl_generator_validate).
 * The unsized symbols stay exported for programs linked before and read a
 * first-version struct; `(NAME)(...)` reaches them past the macro.
 *
 * CAVEATS
 *
 * - A job runs once.  After sl_job_run() returns, only sl_job_error(),
 *   sl_job_stats(), sl_job_wait() (which returns the same result again) and
 *   sl_job_destroy() are useful; starting it again returns SL_ESTARTED.
 * - A refused graph change leaves the graph unaltered, so building can go
 *   on after it; a job whose run failed stays failed (its message stays in
 *   sl_job_error()).
 * - Callbacks run on the engine's threads.  map, filter, flat_map and key
 *   functions receive one user pointer shared by all instances of the
 *   operator: they must be safe to call concurrently (pure functions are).
 *   Process operators get per-instance state through their open callback.
 * - A record pointer passed to a callback is valid only during that call.
 * - The engine allows more threads than CPUs: waiting threads spin briefly and
 *   then sleep on a futex, so oversubscription costs context switches, not
 *   burned cores.
 *
 * CONCURRENCY
 *
 *   call                       may be called from
 *   -------------------------  ----------------------------------------------
 *   sl_job_create, sl_op_*     the building thread, before the job starts
 *   sl_job_start, sl_job_run   the building thread, once
 *   sl_job_stop                any thread, any number of times, also a
 *                              signal handler (it only stores and wakes)
 *   sl_job_wait                one thread, after sl_job_start
 *   sl_job_progress            any thread while the job runs
 *   sl_emit*, sl_ctx_*         only inside a callback, with its own ctx
 *   sl_state_*, sl_mapstate_*,  only inside process() of a keyed instance
 *   sl_liststate_*
 *   sl_operator_state_set/get  only inside snapshot() / restore() (and open)
 *   sl_job_trigger_checkpoint  any thread while the job runs
 *   sl_job_savepoint           any thread from sl_job_start to
 *                              sl_job_destroy (one at a time); with
 *                              unaligned checkpoints not from a callback
 *                              (it waits for a checkpoint)
 *   sl_job_stop_with_savepoint any thread while the job runs, not from a
 *                              callback (it waits for them); one at a time
 *   sl_job_checkpoint_*stats,  any thread (a consistent copy under a lock)
 *   sl_job_last_checkpoint
 *   sl_job_metrics             any thread, any time until sl_job_destroy
 *   sl_http_start(_with), _stop  any thread; stop before sl_job_destroy
 *   sl_log_*                   any thread, any time; not from inside a
 *                              log handler (sl_log_set_handler)
 */
#ifndef SLUICE_H
#define SLUICE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SL_VERSION_MAJOR 0
#define SL_VERSION_MINOR 1
#define SL_VERSION_PATCH 0

/** The version of the library loaded at run time, "MAJOR.MINOR.PATCH"
 * (static storage).  It equals the SL_VERSION_* macros of the header the
 * library was built with (meson refuses to configure otherwise), so a
 * program compares it with its own macros to detect a different library. */
const char *sl_version(void);

/* ------------------------------------------------------------------------ */
/* Status codes.  sluice's own codes sit in a reserved negative range, like
 * LMDB's; positive values are errno values (ENOMEM, EINVAL, ...). */

#define SL_SUCCESS 0
#define SL_ERRCODE_FIRST (-30900)
/** The job graph is invalid (cycle, dangling input, bad parallelism, ...). */
#define SL_EGRAPH (-30900)
/** The job has already been started (or run) once. */
#define SL_ESTARTED (-30899)
/* -30898 is reserved (formerly SL_EFAILED). */
/** An operator callback reported an error; sl_job_error() names it. */
#define SL_ECALLBACK (-30897)
/** The job was stopped by sl_job_stop() before its sources ended. */
#define SL_ESTOPPED (-30896)
/** A record is larger than the job's max_record_bytes. */
#define SL_ETOOBIG (-30895)
/** A call was made in a context where it is not allowed. */
#define SL_EUSAGE (-30894)
/** The job has not been started. */
#define SL_ENOTSTARTED (-30893)
/** A state directory cannot be used: not a sluice store, a newer format
 * version, or written by a different job graph; or a savepoint cannot be
 * started from (sl_job_savepoint); sl_job_error() says which.  Nothing in
 * the directory was changed. */
#define SL_ESTORE (-30892)
/** Stored data failed its checksum when read back. */
#define SL_ECORRUPT (-30891)
/** The state directory already holds checkpoints, and the job asked neither
 * to resume from them nor to start fresh (SL_STORE_RESUME/SL_STORE_FRESH). */
#define SL_EHASSTATE (-30890)
/** More consecutive checkpoints failed than the job tolerates. */
#define SL_ECHECKPOINT (-30889)
/** No such entry (keyed state lookups). */
#define SL_ENOTFOUND (-30888)
/** An injected fault fired (sl_job_config.faults); the message names it. */
#define SL_EINJECTED (-30887)
#define SL_ERRCODE_LAST (-30887)

/** Return a static description of a status code (ours or an errno). */
const char *sl_strerror(int status);

/* Limits, documented so a caller can check before building. */
#define SL_MAX_PARALLELISM 256     /* instances of one operator */
#define SL_MAX_OPERATORS 1024      /* operators in one job */
#define SL_MAX_INPUTS 16           /* input streams of one operator */
#define SL_MAX_NAME 48             /* bytes of an operator name, with NUL */
#define SL_NO_TIMESTAMP INT64_MIN  /* a record without a timestamp */

/* ------------------------------------------------------------------------ */
/* Opaque handles. */

typedef struct sl_job sl_job; /* a dataflow job */
typedef struct sl_op sl_op;   /* one operator of a job (build time) */
typedef struct sl_ctx sl_ctx; /* one running instance, given to callbacks */

/** A record as a callback sees it.  data is 8-byte aligned. */
typedef struct sl_record {
  const void *data;
  uint32_t size_bytes;
  int64_t timestamp; /* SL_NO_TIMESTAMP when the record has none */
} sl_record;

/* ------------------------------------------------------------------------ */
/* Job configuration.  Start from SL_JOB_CONFIG_INIT, set what you need;
 * zero means the documented default.  sl_job_create(NULL, ...) takes all
 * defaults. */

typedef struct sl_job_config {
  /** sizeof(sl_job_config) as the caller was built with (ABI above); the
   * initializer SL_JOB_CONFIG_INIT sets it.  0 is refused (EINVAL). */
  size_t struct_bytes;
  /** Bytes of each ring; rounded up to a power of two, range 4 KiB ..
   * 1 GiB.  Default (0): automatic, 4 MiB per ring while the job's rings
   * fit in 256 MiB together, halved as they get more numerous down to
   * 512 KiB (and never too small for max_record_bytes).  A job has one ring
   * per connected pair of instances (P x C on a keyed or rebalanced edge).
   * Larger rings mean fewer context switches when threads outnumber
   * cores; pages are touched only as a ring fills. */
  uint64_t ring_bytes;
  /** Largest record payload accepted by sl_emit().  Default 64 KiB, or
   * less if ring_bytes is set small; at most ring_bytes / 4 - 16 (a record
   * and its headers fit in a quarter ring). */
  uint32_t max_record_bytes;
  /** Records an instance may write to one output ring before it publishes
   * them (the output batch).  A batch also leaves when the instance's input
   * runs dry, before it waits, and after buffer_timeout_us.  Default 1024
   * (on P1 about 1.2x the throughput of 128; latency at low load is not
   * affected, since a batch also leaves when the input runs dry), range
   * 1 .. 65535. */
  uint32_t output_batch_records;
  /** Pending output is published, with a forced wake-up check on every
   * output ring, when this many microseconds have passed since the last
   * flush, even while input keeps arriving.  Checked after each pass over
   * the inputs, so the bound is this plus one pass (at most a ring's
   * worth of records).  Default (0): 1000. */
  uint32_t buffer_timeout_us;
  /** Spin iterations (each a CPU pause, about 20 ns here) a waiting thread
   * makes before it parks on a futex.  Default (0): automatic, 20 when the
   * job has more threads than usable CPUs (a spinner would hold a core its
   * peer needs), 2000 when each thread can have a CPU of its own.  Usable
   * CPUs: the distinct CPUs of cpus below (or of the affinity mask), at
   * most the cgroup CPU quota rounded up to whole CPUs. */
  uint32_t spin_iterations;
  /** 1: do not pin instance threads to CPUs. */
  int no_pinning;
  /** CPUs to pin to.  NULL or zero count: the CPUs of the process's
   * affinity mask (sched_getaffinity(): taskset, a cpuset), in ascending
   * order; but when the process's cgroup CPU quota (v2 cpu.max, v1
   * cpu.cfs_quota_us / cpu.cfs_period_us, the smallest up the hierarchy)
   * allows fewer whole CPUs (rounded up) than the mask holds, threads are
   * not pinned: the kernel places them within the mask (every process
   * picking the same first CPUs would pile up on them).  A listed CPU
   * outside the mask fails sl_job_start (EINVAL, named in sl_job_error).
   * A CPU may be listed more than once. */
  const int *cpus;
  int cpu_count;
  /** How instances are spread over the CPUs; see enum sl_pin_policy. */
  int pin_policy;
  /** Maximum parallelism of keyed operators: keys hash into this many key
   * groups, and each instance owns a contiguous range.  Default 128, range
   * 1 .. 32768; at least the parallelism of every keyed operator. */
  uint32_t max_parallelism;
  /** Checkpointing (off unless checkpoint.state_dir is set); see below. */
  struct sl_checkpoint_config {
    /** Directory of the job's LMDB store; NULL: no checkpoints.  It and
     * its missing parents are created (mode 0755, as savepoint
     * directories); a parent that is not a directory fails the job,
     * named in sl_job_error. */
    const char *state_dir;
    /** Time between checkpoint triggers.  Default (0): 1000 ms. */
    uint32_t interval_ms;
    /** A checkpoint not complete this long after its trigger is aborted.
     * Default (0): 60000 ms. */
    uint32_t timeout_ms;
    /** Least time from the end of one checkpoint to the next trigger.
     * Default 0. */
    uint32_t min_pause_ms;
    /** Checkpoints in flight at once, range 1 .. 16.  Default (0):
     * automatic, 1 when interval_ms is 100 or more or min_pause_ms is
     * set, else ceil(100 / interval_ms) up to 4 (barriers queue behind
     * full rings for tens of ms, so one at a time would not reach a short
     * interval). */
    uint32_t max_concurrent;
    /** Consecutive failed (aborted) checkpoints tolerated; one more fails
     * the job with SL_ECHECKPOINT and the last cause.  Default 0. */
    uint32_t tolerable_failures;
    /** SL_EXACTLY_ONCE (default: aligned barriers) or SL_AT_LEAST_ONCE. */
    int mode;
    /** 1: commit checkpoints without fsync.  A process crash loses nothing;
     * a power cut or kernel crash may lose the checkpoints of the last ~30
     * seconds (whatever the kernel had not written back), and the job then
     * resumes from an older one — never from a torn one.  For benchmarks. */
    int no_sync;
    /** What to do when state_dir already holds checkpoints: SL_STORE_REFUSE
     * (default: fail with SL_EHASSTATE), SL_STORE_RESUME (restore the
     * newest complete checkpoint), SL_STORE_FRESH (delete them first).
     * A state_dir with no complete checkpoint (new, empty, or only
     * checkpoints that never completed) starts fresh under every policy:
     * with SL_STORE_RESUME that is not an error, so one command can both
     * start a job and resume it (an info line says which happened). */
    int store_policy;
    /** Initial LMDB map size in bytes; grown by doubling when full.
     * Default (0): 64 MiB. */
    uint64_t initial_map_bytes;
    /** A savepoint directory (sl_job_savepoint) to start from, or NULL.
     * sl_job_start copies its store into state_dir (required), which
     * must hold no checkpoints unless store_policy is SL_STORE_FRESH
     * (then they are replaced), and resumes its checkpoint.  Operators
     * may have another parallelism than when it was taken if their state
     * is keyed (redistributed by key group) or if they have no operator
     * state; see sl_job_savepoint for what is refused.  The path is
     * copied; without state_dir, sl_job_create returns EINVAL. */
    const char *from_savepoint;
  } checkpoint;
  /** What happens when an instance fails: restart the job in-process from
   * the newest complete checkpoint, or not (the default).  See
   * sl_restart_defaults(). */
  struct sl_restart_config {
    /** SL_RESTART_NONE (default), SL_RESTART_FIXED_DELAY,
     * SL_RESTART_EXPONENTIAL_DELAY or SL_RESTART_FAILURE_RATE. */
    int strategy;
    /** Fixed delay: restarts allowed in all.  Exponential delay: restarts
     * allowed in all, 0 for no limit.  Unused by failure rate. */
    uint32_t attempts;
    /** Fixed delay and failure rate: wait before each restart. */
    uint32_t delay_ms;
    /** Exponential delay: the first wait, the largest, the factor from one
     * wait to the next (>= 1), the random spread of each wait (0 .. 1: a
     * wait of d becomes d * (1 +- jitter)), and the quiet time after which
     * the wait starts again from initial_delay_ms. */
    uint32_t initial_delay_ms;
    uint32_t max_delay_ms;
    double multiplier;
    double jitter;
    uint32_t reset_after_ms;
    /** Failure rate: no restart once more than max_failures failures fell
     * within the last interval_ms. */
    uint32_t max_failures;
    uint32_t interval_ms;
  } restart;
  /** Faults to inject, for failure-injection tests (the grammar is in
   * docs/failover-and-faults.md).  NULL: none.  The environment variable
   * SLUICE_FAULTS, when set, adds its faults to these.  A malformed spec
   * makes sl_job_start() fail with EINVAL and the reason. */
  const char *faults;
  /** The job's name, shown as the label job="NAME" on every Prometheus
   * metric (sl_metrics_prometheus, GET /metrics), so the metrics of
   * several jobs in one process (or host) stay apart.  1 .. SL_MAX_NAME-1
   * bytes of well-formed UTF-8, as Prometheus requires of a label value
   * (escaped as needed); copied.  Otherwise sl_job_create returns EINVAL
   * with an ERROR line naming sl_job_config.name.  NULL: the
   * default "sluice" (the CLI passes its job's name).  Added after the
   * first version: a program built before sees the default. */
  const char *name;
  /** Unaligned checkpoints (docs/checkpoints.md, "Unaligned
   * checkpoints"), exactly-once mode only: 1 makes a barrier overtake the
   * records in flight, which become part of the checkpoint as channel
   * state and are replayed on restore.  Savepoints (sl_job_savepoint,
   * sl_job_stop_with_savepoint) and the final checkpoint stay aligned.
   * With checkpoint.mode SL_AT_LEAST_ONCE, or a value other than 0 or 1,
   * sl_job_create returns EINVAL with an ERROR line saying why.
   * These two fields belong to checkpointing but sit here, at the end:
   * a field added inside `checkpoint` would move every field after it,
   * and programs built against the older header would read them wrongly
   * (sluice.h, ABI).  Added after the first version: default 0. */
  int checkpoint_unaligned;
  /** With checkpoint_unaligned: 0 (default) makes every checkpoint
   * unaligned from its start; more makes a checkpoint start aligned and
   * switch to unaligned at an instance whose alignment lasted this many
   * milliseconds (Flink's aligned-checkpoint-timeout).  Nonzero without
   * checkpoint_unaligned is EINVAL. */
  uint32_t checkpoint_aligned_timeout_ms;
  /** Operator chaining (enum sl_chaining; docs/DESIGN.md, "Chaining"):
   * an instance whose only input is one ring from one upstream instance
   * (a forward edge, or any edge between two operators of parallelism 1)
   * runs in its upstream's thread, which hands it each batch as it
   * publishes it, instead of in a thread of its own.  Default
   * SL_CHAINING_AUTO: chain when the job's instances outnumber the CPUs it
   * may use, so that threads do not queue for cores.  A callback that
   * blocks until another operator of its chain does something would then
   * wait for ever: such an operator calls sl_op_disable_chaining.  Other
   * values are EINVAL.  Added after the first version: default 0. */
  int chaining;
  /** The copy pass (docs/checkpoints.md, step 3 of its list): after an
   * aligned checkpoint's barrier, a keyed instance whose changes since
   * the last checkpoint hold more than 16,384 entries or 1 MiB copies
   * them in steps between batches of records, so that its writes after
   * the barrier go in place; the checkpoint's ack waits for the copy.
   * It keeps throughput and costs memory (bench/README.md, "The copy
   * pass's switch", has both measured): a copy of every entry changed in
   * the interval until the checkpoint is durable, where copy on write
   * copies only the entries written again before then.  This field
   * bounds it: the most bytes of keys and values a pass copies; a larger
   * change is copied on write.  Default (0): 256 MiB and at most
   * 4,194,304 entries.  A positive value: that many bytes, any number of
   * entries.  -1: no copy pass.  Other negative values are EINVAL.
   * Changes of at most 16,384 entries and 1 MiB are copied at the barrier
   * whatever this says, and a job with a restart strategy never copies
   * (its rollback keeps the versions instead).  Added after the first
   * version: default 0. */
  int64_t checkpoint_copy_pass_bytes;
} sl_job_config;

/** sl_job_config.checkpoint_copy_pass_bytes: no copy pass. */
#define SL_COPY_PASS_OFF ((int64_t)-1)

/** sl_job_config.chaining. */
enum sl_chaining {
  SL_CHAINING_AUTO = 0,   /* when instances outnumber the usable CPUs */
  SL_CHAINING_ALWAYS = 1, /* every edge that can be chained */
  SL_CHAINING_NEVER = 2,  /* a thread per instance */
};

enum sl_restart_strategy {
  SL_RESTART_NONE = 0,
  SL_RESTART_FIXED_DELAY = 1,
  SL_RESTART_EXPONENTIAL_DELAY = 2,
  SL_RESTART_FAILURE_RATE = 3,
};

/** A restart configuration with Flink's defaults for strategy: fixed delay
 * 1 attempt after 1 s; exponential delay from 1 s up to 60 s, multiplier
 * 1.5, jitter 0.1, reset after 1 h quiet, no attempt limit; failure rate at
 * most 1 failure per 60 s, 1 s delay.  Adjust fields, then put it in
 * sl_job_config.restart. */
struct sl_restart_config sl_restart_defaults(int strategy);

enum sl_checkpoint_mode { SL_EXACTLY_ONCE = 0, SL_AT_LEAST_ONCE = 1 };
enum sl_store_policy {
  SL_STORE_REFUSE = 0,
  SL_STORE_RESUME = 1,
  SL_STORE_FRESH = 2
};

/** Pinning policies.
 *
 * SL_PIN_CHAINS (default): instances are ordered chain by chain (instance 0
 * of every operator in creation order, then instance 1 of every operator,
 * ...) and that order is cut into one contiguous block per CPU.  Neighbours
 * in a pipeline then share a CPU, so most rings stay inside one core's
 * cache, and parallel chains land on different CPUs.  On a 2-core machine
 * the 4-operator pipeline runs about 1.4x faster than with round-robin.
 *
 * SL_PIN_ROUND_ROBIN: instance i (creation order) goes to cpus[i % n].
 *
 * Several jobs in one process: a job pinned by the affinity mask (no
 * cpus list) rotates its placement to start on the CPUs the process's
 * other live jobs (from sl_job_start to sl_job_destroy) hold fewest
 * threads on, so two jobs on 2 CPUs do not both begin on the first.  A
 * job with a cpus list is placed as listed, and counted.  Other processes
 * are not seen: give each its own mask, or set no_pinning. */
enum sl_pin_policy { SL_PIN_CHAINS = 0, SL_PIN_ROUND_ROBIN = 1 };

/** Every field zero (its default) and struct_bytes set: start every
 * sl_job_config from it (`sl_job_config c = SL_JOB_CONFIG_INIT;`). */
#define SL_JOB_CONFIG_INIT {.struct_bytes = sizeof(sl_job_config)}

/** Create an empty job.  config may be NULL for defaults; it is copied (the
 * cpus array and the strings too).  Errors: EINVAL (a setting out of
 * range, a name of 0 or SL_MAX_NAME or more bytes; config->struct_bytes 0, below the first version's size, or
 * larger than this library's with nonzero bytes past its fields; or the
 * environment variable SLUICE_LOG_LEVEL set to no level name while
 * sl_log_set_level was never called: a line on the log says which; *job
 * is NULL), ENOMEM. */
int sl_job_create(const sl_job_config *config, sl_job **job);

/** Free a job and everything it owns.  A running job is stopped and waited
 * for first.  NULL is accepted. */
void sl_job_destroy(sl_job *job);

/* ------------------------------------------------------------------------ */
/* Callbacks. */

/** Source: emits the next records with sl_emit() or sl_emit_batch().
 * Called repeatedly until it returns SL_SOURCE_END.  Emit a batch per call
 * (a few hundred records or more) for throughput: each call ends an output
 * batch.  The engine checks for stop between calls.  Return 0 to be called
 * again, SL_SOURCE_END when exhausted; any other value fails the job with
 * it (CALLBACK RETURNS above). */
#define SL_SOURCE_END 1
typedef struct sl_source_ops {
  /** Optional.  Called once on the instance's thread before the first
   * next(); may set *instance_state.  Nonzero return fails the job. */
  int (*open)(sl_ctx *ctx, void *user, void **instance_state);
  int (*next)(sl_ctx *ctx, void *instance_state);
  /** Optional.  Called once after the last next(), also on stop or failure,
   * if open succeeded (or was absent).  It may not emit (SL_EUSAGE). */
  void (*close)(sl_ctx *ctx, void *instance_state);
  /** Replayable sources.  snapshot() records the position after the last
   * record emitted so far with sl_operator_state_set(); it runs between two
   * next() calls when a checkpoint is triggered.  restore() runs after open()
   * when the job resumes from checkpoint_id and seeks to the position that
   * sl_operator_state_get() returns.  A source without them is not
   * replayable: after a resume it starts from its beginning (duplicates).
   * Return 0; anything else fails the job. */
  int (*snapshot)(sl_ctx *ctx, void *instance_state, uint64_t checkpoint_id);
  int (*restore)(sl_ctx *ctx, void *instance_state, uint64_t checkpoint_id);
  /** Optional: checkpoint_id (and every earlier one) is durable. */
  void (*checkpoint_complete)(sl_ctx *ctx, void *instance_state,
                              uint64_t checkpoint_id);
} sl_source_ops;

/** Map: write at most out_max_bytes bytes to out (8-byte aligned) and set
 * *out_size_bytes.  Return 0; anything else fails the job with it.  The
 * output keeps the input's timestamp. */
typedef int (*sl_map_fn)(void *user, const sl_record *in, void *out,
                         uint32_t *out_size_bytes);

/** Filter: return 1 to keep the record, 0 to drop it; anything else fails
 * the job with it. */
typedef int (*sl_filter_fn)(void *user, const sl_record *in);

/** Flat map: emit zero or more records with sl_emit(); return 0 or a
 * anything else fails the job with it. */
typedef int (*sl_flat_map_fn)(void *user, const sl_record *in, sl_ctx *ctx);

/** Key function for sl_op_key_by: the record's key.  Records with equal keys
 * reach the same instance.  Hash byte-string keys with sl_hash_bytes().
 * The key must depend on the record alone: the function runs on the
 * producer's thread to route the record and again on the consumer's for
 * its keyed state, there possibly before the records ahead of it are
 * processed (engine/runtime.c note 13). */
typedef uint64_t (*sl_key_fn)(void *user, const sl_record *in);

/** General process operator, also used for sinks and multi-input operators.
 * process() is called for each record with the index of the input it came
 * from (0 .. n_inputs-1) and may emit any number of records.  Return 0, or
 * anything else fails the job with it. */
typedef struct sl_process_ops {
  int (*open)(sl_ctx *ctx, void *user, void **instance_state); /* optional */
  int (*process)(sl_ctx *ctx, void *instance_state, int input,
                 const sl_record *in);
  /** Optional.  Called when every input has ended, before the end of stream
   * is forwarded; may emit final records.  Not called on stop/failure.
   * Return 0; anything else fails the job. */
  int (*finish)(sl_ctx *ctx, void *instance_state);
  /** Optional.  Always called last if open succeeded (or was absent), after
   * the end of stream was forwarded; it may not emit (SL_EUSAGE). */
  void (*close)(sl_ctx *ctx, void *instance_state);
  /** Checkpoint hooks, all optional.  snapshot() runs when barrier
   * checkpoint_id has been aligned, before it is forwarded: save operator
   * (non-keyed) state with sl_operator_state_set(); an exactly-once sink
   * pre-commits here.  Keyed state is snapshotted by the engine.  Also called
   * once at the end of input (after finish()) for the job's final
   * checkpoint.  checkpoint_complete() says checkpoint_id and all earlier
   * ones are durable (an exactly-once sink commits everything pre-committed
   * up to it; after an abort, the next completion covers the aborted one's
   * data too).  restore() runs after open() when the job resumes from
   * checkpoint_id; sl_operator_state_get() returns what snapshot() saved.
   * Keyed state is already restored when it runs.  Return 0; anything
   * else fails the job. */
  int (*snapshot)(sl_ctx *ctx, void *instance_state, uint64_t checkpoint_id);
  void (*checkpoint_complete)(sl_ctx *ctx, void *instance_state,
                              uint64_t checkpoint_id);
  int (*restore)(sl_ctx *ctx, void *instance_state, uint64_t checkpoint_id);
  /** Event time, optional.  on_timer() runs for each timer that is due
   * (sl_timer_register), in time order, with the timer's key current (keyed
   * state reaches it) and records emitted stamped with the timer's time.
   * domain is SL_EVENT_TIME or SL_PROCESSING_TIME.  on_watermark() runs
   * when the input watermark advances to watermark, after the event-time
   * timers it made due; the engine forwards the watermark downstream after
   * it returns.  Return 0; anything else fails the job. */
  int (*on_timer)(sl_ctx *ctx, void *instance_state, int domain,
                  int64_t time);
  int (*on_watermark)(sl_ctx *ctx, void *instance_state, int64_t watermark);
} sl_process_ops;

/* ------------------------------------------------------------------------ */
/* Building a job.  Each call adds one operator and returns it in *op.
 * name: 1..SL_MAX_NAME-1 bytes, unique in the job.  parallelism:
 * 1..SL_MAX_PARALLELISM.  An input must be an operator of the same job.
 *
 * Edges: between operators of equal parallelism, instance i feeds instance i
 * (forward); otherwise records are spread round-robin (rebalance); after
 * sl_op_key_by they are partitioned by key hash.
 *
 * Errors of every builder: SL_EGRAPH (the change is refused and the graph is
 * unaltered; sl_job_error() says what is wrong), SL_ESTARTED, ENOMEM. */

int sl_op_source(sl_job *job, const char *name, int parallelism,
                 const sl_source_ops *ops, void *user, sl_op **op);

/** out_max_bytes: the largest output the map writes (<= max_record_bytes). */
int sl_op_map(sl_job *job, const char *name, sl_op *input, int parallelism,
              uint32_t out_max_bytes, sl_map_fn fn, void *user, sl_op **op);

int sl_op_filter(sl_job *job, const char *name, sl_op *input, int parallelism,
                 sl_filter_fn fn, void *user, sl_op **op);

int sl_op_flat_map(sl_job *job, const char *name, sl_op *input,
                   int parallelism, sl_flat_map_fn fn, void *user, sl_op **op);

/** Partition input's records by key: the operator that consumes the returned
 * stream gets each key at exactly one instance (key -> key group ->
 * instance, stable for a given parallelism and max_parallelism).  A key_by is
 * not a thread of its own; it has no parallelism. */
int sl_op_key_by(sl_job *job, const char *name, sl_op *input, sl_key_fn fn,
                 void *user, sl_op **op);

/** Key function for sl_op_key_by_bytes: set *key and *key_bytes to the
 * record's key, a byte string of 0 .. SL_KEY_MAX_BYTES bytes (with a state
 * directory, 0 .. SL_KEY_MAX_STORED_BYTES: LMDB's key limit).  *key may
 * point into the record or into memory of the function's own (a per-thread
 * buffer will do): it must stay valid and unchanged until the function is
 * called again on the same thread, since the engine copies or hashes it
 * before then.  It is called on the producer's thread (to route) and on the
 * consumer's (to find the key's state), possibly by several threads at
 * once, and must give equal keys for equal records.  Return 0; anything
 * else fails the job with it (CALLBACK RETURNS), and so does a key longer
 * than the maximum (SL_ETOOBIG), naming the key_by. */
typedef int (*sl_key_bytes_fn)(void *user, const sl_record *in,
                               const void **key, uint32_t *key_bytes);

/** Longest byte-string key; longer fails the job (sl_key_bytes_fn). */
#define SL_KEY_MAX_BYTES 65536u
/** Longest byte-string key of a job with a state directory: every entry of
 * keyed state is one LMDB key of at most 499 bytes, which holds the key,
 * a 15-byte header and up to 36 bytes of map-state user key (windows and
 * joins use at most 13, timers 9). */
#define SL_KEY_MAX_STORED_BYTES 448u

/** Partition input's records by a byte-string key (sl_key_bytes_fn), like
 * sl_op_key_by.  Key groups hash the bytes (sl_hash_bytes); keyed state,
 * timers and windows downstream are kept per full key, so two keys whose
 * hashes collide are two keys, never merged.  In the consumer's callbacks
 * (process, on_timer, a window's or join's functions) sl_ctx_key_bytes()
 * gives the key's bytes and sl_ctx_key() its 64-bit hash.  An operator's
 * keyed inputs must all be byte-keyed or all 64-bit-keyed (SL_EGRAPH at
 * validation).  Joins take byte keys on both sides.  Errors: as the
 * builders (SL_EGRAPH for a NULL fn). */
int sl_op_key_by_bytes(sl_job *job, const char *name, sl_op *input,
                       sl_key_bytes_fn fn, void *user, sl_op **out);

/** Merge n_inputs streams into one.  Like key_by, not a thread of its own. */
int sl_op_union(sl_job *job, const char *name, sl_op *const *inputs,
                int n_inputs, sl_op **op);

/** A process operator with n_inputs inputs (0 .. SL_MAX_INPUTS); with 2 it
 * is a two-input ("co") operator.  More inputs can be added later with
 * sl_op_add_input(). */
int sl_op_process(sl_job *job, const char *name, sl_op *const *inputs,
                  int n_inputs, int parallelism, const sl_process_ops *ops,
                  void *user, sl_op **op);

/** A sink: a process operator whose emits are refused (SL_EUSAGE). */
int sl_op_sink(sl_job *job, const char *name, sl_op *input, int parallelism,
               const sl_process_ops *ops, void *user, sl_op **op);

/** Add input as the next input of process or sink operator consumer (or of a
 * union).  This is the one call that can close a cycle; cycles are refused
 * by sl_job_validate() and sl_job_start().  Errors: SL_EGRAPH. */
int sl_op_add_input(sl_job *job, sl_op *consumer, sl_op *input);

/** Hand op's user pointer (the one given to its builder) to the job:
 * sl_job_destroy() calls free_fn(user) once, after every thread has
 * stopped.  For operators whose callbacks share data the builder
 * allocated (a copied configuration, say); NULL takes the duty back.
 * Errors: EINVAL (op NULL, or a key_by, union or side output),
 * SL_EUSAGE (a built-in operator that already frees its own data). */
int sl_op_set_user_free(sl_op *op, void (*free_fn)(void *user));
/** Keep op out of every chain (sl_job_config.chaining): its instances run
 * in threads of their own, and neither its upstream nor its downstream
 * instances run in theirs.  For an operator whose callbacks block on what
 * a neighbour does (Flink's disableChaining).  Before sl_job_start; EINVAL
 * for NULL or a virtual operator (key_by, union, side output), SL_EUSAGE
 * once the job started. */
int sl_op_disable_chaining(sl_op *op);

/** Check the whole graph: at least one source, no cycle, every operator's
 * output consumed (a dangling stream is almost always a mistake), keyed
 * parallelism within max_parallelism.  Returns 0 or SL_EGRAPH with the
 * reason in sl_job_error(). */
int sl_job_validate(sl_job *job);

/* ------------------------------------------------------------------------ */
/* Running. */

/** Validate, create rings and threads, and start.  Errors: SL_EGRAPH,
 * SL_ESTARTED, ENOMEM, EAGAIN (thread creation), EINVAL (a configured CPU
 * is not usable).  On error nothing is left running. */
int sl_job_start(sl_job *job);

/** Wait until every instance has finished.  Returns 0 if every source ended
 * and every record was processed; SL_ESTOPPED if sl_job_stop() ended it;
 * if an operator failed, the status of its failure: the value its callback
 * returned (CALLBACK RETURNS above), or the engine's refusal of what it
 * emitted (SL_ETOOBIG for a map output over its declared size), with the
 * message in sl_job_error() naming the operator.  A later call returns the
 * same value.  Errors: SL_ENOTSTARTED. */
int sl_job_wait(sl_job *job);

/** sl_job_start() then sl_job_wait(). */
int sl_job_run(sl_job *job);

/** Ask a running job to stop.  Returns at once; every instance notices
 * within microseconds (parked threads are woken).  Safe from any thread and
 * from a signal handler.  No effect on a job that has finished. */
void sl_job_stop(sl_job *job);

/** The message of the job's first failure ("" if none).  Valid until the
 * job is destroyed.  After restarts, the message of the failure that ended
 * the job, followed by the restart count; the failures that were recovered
 * are in sl_job_recovery_stats(). */
const char *sl_job_error(const sl_job *job);

/** Restarts done so far (failovers; see sl_job_config.restart). */
uint32_t sl_job_restarts(const sl_job *job);

/** Injected faults that fired so far (sl_job_config.faults). */
uint64_t sl_job_faults_fired(const sl_job *job);

/** One failover.  Times are microseconds after the failure was detected
 * (the first failing instance or checkpoint reported it). */
typedef struct sl_recovery_stats {
  uint32_t restart;         /* 1 for the first restart */
  int status;               /* the failure's status */
  char cause[256];          /* the failure's message */
  uint64_t restored_from;   /* checkpoint restored; 0: none yet, from the
                               beginning */
  uint64_t delay_us;        /* waited by the restart strategy */
  uint64_t stopped_us;      /* every thread of the failed attempt joined */
  uint64_t restored_us;     /* every instance has restored its state
                               (each on its own thread, in parallel) */
  uint64_t first_record_us; /* the first record processed after the
                               restore, or 0 if none yet */
  uint32_t rolled_back;     /* instances whose keyed state was rolled back
                               in memory to the restored checkpoint */
  uint32_t reloaded;        /* instances whose keyed state was reloaded
                               from the store instead */
} sl_recovery_stats;

/** The k-th newest failover (k = 0 is the newest), of the last 16.
 * Errors: EINVAL (no such failover). */
int sl_job_recovery_stats(const sl_job *job, int k, sl_recovery_stats *stats);

/** Counters of one operator, summed over its instances. */
typedef struct sl_op_stats {
  const char *name;
  int parallelism;
  uint64_t records_in;
  uint64_t records_out;
  uint64_t late_records; /* behind the watermark: dropped, or sent to a
                            side output (SL_COUNT_LATE) */
  uint64_t dead_letters; /* malformed input set aside (SL_COUNT_DEAD_LETTER) */
  int64_t watermark;     /* lowest current input watermark among the
                            instances (SL_WATERMARK_MIN: none yet) */
} sl_op_stats;

/** Progress while running: records emitted by all sources so far (relaxed
 * reads of per-instance counters; monotonic, possibly a little behind). */
uint64_t sl_job_progress(const sl_job *job);

/** Number of physical operators (thread-running ones: not key_by/union). */
int sl_job_operator_count(const sl_job *job);

/** Statistics of physical operator i (0 .. sl_job_operator_count()-1), in
 * creation order.  Exact after sl_job_wait(); approximate while running.
 * Errors: EINVAL (i out of range). */
int sl_job_stats(const sl_job *job, int i, sl_op_stats *stats);

/* ------------------------------------------------------------------------ */
/* Inside callbacks. */

/** Emit a record (copied) with the timestamp of the record being processed
 * (none in a source).  May block while a downstream ring is full.
 * Errors: SL_ETOOBIG (size over max_record_bytes), SL_EUSAGE (in a sink, or
 * from a close callback), SL_ESTOPPED (the job is stopping: return from the
 * callback). */
int sl_emit(sl_ctx *ctx, const void *data, uint32_t size_bytes);

/** Emit `count` records of size_bytes each, stored back to back at records
 * (record i at records + i * size_bytes), with the timestamp sl_emit() would
 * give them.  The same as count sl_emit() calls, but on a forward edge with
 * no timestamp and size_bytes a multiple of 8 the records are copied into
 * the ring in runs: sources should emit this way.  On error, the records
 * before the failing one were emitted.  Errors: as sl_emit(). */
int sl_emit_batch(sl_ctx *ctx, const void *records, uint32_t size_bytes,
                  uint32_t count);

/** Emit with an explicit timestamp (SL_NO_TIMESTAMP for none). */
int sl_emit_ts(sl_ctx *ctx, const void *data, uint32_t size_bytes,
               int64_t timestamp);

/** Attach a human-readable cause to the error the callback is about to
 * return; it becomes part of sl_job_error().  printf-style. */
void sl_ctx_fail(sl_ctx *ctx, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/** This instance's index (0 .. parallelism-1) and its operator's
 * parallelism and name. */
int sl_ctx_instance(const sl_ctx *ctx);
int sl_ctx_parallelism(const sl_ctx *ctx);
const char *sl_ctx_name(const sl_ctx *ctx);

/** Nonzero once the job is stopping; long-running callbacks should return. */
int sl_ctx_stopping(const sl_ctx *ctx);


/* ------------------------------------------------------------------------ */
/* Event time (engine/timer.c, runtime.c).
 *
 * A record's timestamp is its event time, in units the job chooses
 * (milliseconds since the epoch by convention; window sizes, bounds and
 * timer times use the same units).  Watermarks travel in-band with the
 * records: a watermark W says that no more records with timestamp <= W are
 * expected.  Sources generate them (sl_op_watermarks); every other operator
 * tracks one watermark per input channel, takes the minimum over the
 * channels that are neither idle nor ended, fires the event-time timers it
 * makes due, and forwards it.  A source that emits nothing for the idle
 * timeout marks its outputs idle, so one quiet input does not stall event
 * time downstream; its next record or watermark makes them active again.
 * At the end of input every source sends SL_WATERMARK_MAX, which fires
 * every event-time timer (and so every window) still open.
 *
 * Processing time is the wall clock in milliseconds since the epoch
 * (CLOCK_REALTIME). */

#define SL_WATERMARK_MIN INT64_MIN /* no watermark yet */
#define SL_WATERMARK_MAX INT64_MAX /* end of input: everything is due */

/* Valid event times.  A record time that windows, timers and watermarks
 * can work with lies in [SL_TIME_MIN_VALID, SL_TIME_MAX_VALID] (+-2^62,
 * about 146 million years of milliseconds either side of the epoch); the
 * room left up to the int64 limits holds window sizes, slides, gaps and
 * allowed lateness of up to SL_TIME_SPAN_MAX (2^61), so every window
 * bound and cleanup time of a valid time is representable and below
 * SL_WATERMARK_MAX.  The file sources refuse a timestamp outside the
 * range ("FILE line N: ...", or a dead letter where the source has
 * them), and so does the Nexmark event parser; a window operator fails
 * the job, naming itself and the time, on a record outside it (one a
 * callback emitted with sl_emit_ts).  Nothing wraps.  Timers and
 * sl_emit_ts take any int64 (a timer at SL_WATERMARK_MAX fires at the
 * end of input). */
#define SL_TIME_MIN_VALID (-(INT64_C(1) << 62))
#define SL_TIME_MAX_VALID ((INT64_C(1) << 62) - 1)
#define SL_TIME_SPAN_MAX (INT64_C(1) << 61)

enum sl_time_domain { SL_EVENT_TIME = 0, SL_PROCESSING_TIME = 1 };

typedef struct sl_watermark_config {
  /** Bounded out-of-orderness: the watermark trails the largest timestamp
   * the source instance emitted by this much (W = max - bound - 1, as in
   * Flink's BoundedOutOfOrdernessWatermarks); 0 for ordered input. */
  int64_t out_of_orderness;
  /** How often (wall clock), at most, a new watermark is emitted while
   * the source keeps emitting records, if it advanced.  Default (0):
   * 200 ms.  A source that has caught up with its input (a next() call
   * that emitted nothing, or the push source before it waits for pushes)
   * emits an advanced watermark at once, whatever the interval. */
  uint32_t interval_ms;
  /** 1: check after every next() call instead (a watermark per batch the
   * source emits).  Which records are late then depends only on the
   * input and the source's batches, not on timing: the same in every run,
   * and after a restore (the watermark state is checkpointed). */
  int every_call;
  /** A source instance that emitted nothing for this long marks its
   * outputs idle.  0: never. */
  uint32_t idle_timeout_ms;
} sl_watermark_config;

/** Generate watermarks at source (from the timestamps it emits with
 * sl_emit_ts).  A source without this sends no watermarks, except
 * SL_WATERMARK_MAX at its end.  Errors: EINVAL (not a source, negative
 * bound), SL_ESTARTED. */
int sl_op_watermarks(sl_op *source, const sl_watermark_config *config);
int sl_op_watermarks_sized(sl_op *source, const sl_watermark_config *config,
                           size_t config_bytes);
#define sl_op_watermarks(...)                                                  \
  sl_op_watermarks_sized(__VA_ARGS__, sizeof(sl_watermark_config))

/** Emit a watermark from a source or process callback (a custom
 * generator).  Watermarks only move forward: a lower one is ignored.  In a
 * process operator this holds back nothing: the engine still forwards the
 * input watermark after on_watermark.  Errors: SL_EUSAGE (in a sink or a
 * close callback), SL_ESTOPPED. */
int sl_emit_watermark(sl_ctx *ctx, int64_t watermark);

/** The instance's current input watermark (a source: the last it emitted);
 * SL_WATERMARK_MIN before the first. */
int64_t sl_ctx_watermark(const sl_ctx *ctx);

/** Processing time now: wall clock, milliseconds since the epoch. */
int64_t sl_ctx_processing_time(const sl_ctx *ctx);

/** The key of the record being processed (or of the timer firing), in a
 * keyed operator.  After sl_op_key_by_bytes it is the 64-bit hash of the
 * key's bytes (sl_hash_bytes), which two keys may share: their state is
 * still apart; sl_ctx_key_bytes() tells them apart.  Errors: SL_EUSAGE
 * (not keyed, or no current record), and the failure of a byte-key
 * function (the job fails). */
int sl_ctx_key(sl_ctx *ctx, uint64_t *key);

/** The key of the record being processed (or of the timer firing) as
 * bytes.  After sl_op_key_by_bytes: the key's bytes (then sl_ctx_key()
 * gives their 64-bit hash, which two keys may share).  After sl_op_key_by:
 * the 8 bytes of the 64-bit key, big-endian.  *key stays valid until the
 * callback returns.  Errors: SL_EUSAGE (not keyed, or no current record),
 * EINVAL (NULL argument), and the key function's failure (the job fails). */
int sl_ctx_key_bytes(sl_ctx *ctx, const void **key, uint32_t *key_bytes);

/** Timers, per key, in keyed process operators (every input through
 * sl_op_key_by) with an on_timer callback.  Register a timer for the
 * current key at time in domain; registering the same (key, domain, time)
 * twice keeps one.  An event-time timer fires when the watermark reaches
 * time (>= time), a processing-time timer when the wall clock does.
 * Timers are keyed state: checkpointed and restored with it.  Errors:
 * SL_EUSAGE (not keyed, no current key, no on_timer), EINVAL (domain),
 * ENOMEM.  Delete: SL_ENOTFOUND if there is no such timer. */
int sl_timer_register(sl_ctx *ctx, int domain, int64_t time);
int sl_timer_delete(sl_ctx *ctx, int domain, int64_t time);

/* ------------------------------------------------------------------------ */
/* Side outputs.  An operator has one main output and up to
 * SL_MAX_SIDE_OUTPUTS side outputs (ports 1 ..); sl_op_side_output returns
 * a stream of one port that other operators consume like any other; the
 * records a callback sends there with sl_emit_side go to its consumers
 * only.  Watermarks and barriers go to every port. */
#define SL_MAX_SIDE_OUTPUTS 7

/** A stream of port (1 .. SL_MAX_SIDE_OUTPUTS) of op, which must be a
 * process or window operator.  Like key_by, not a thread of its own.
 * Errors: SL_EGRAPH, as the builders. */
int sl_op_side_output(sl_job *job, const char *name, sl_op *op, int port,
                      sl_op **side);

/** Emit to side output port (0 is the main output), with an explicit
 * timestamp.  A port nobody consumes discards the record.  Errors: as
 * sl_emit, EINVAL (port out of range). */
int sl_emit_side(sl_ctx *ctx, int port, const void *data, uint32_t size_bytes,
                 int64_t timestamp);

/** Counters that operators (built-in or user) keep in their statistics. */
enum sl_counter { SL_COUNT_LATE = 0, SL_COUNT_DEAD_LETTER = 1 };
/** Add n to a counter of this instance (read through sl_job_stats). */
void sl_ctx_count(sl_ctx *ctx, int counter, uint64_t n);

/* ------------------------------------------------------------------------ */
/* State.  Keyed state is reached through the key of the record being
 * processed: it is available in process operators and sinks whose input
 * streams all come through sl_op_key_by (SL_EUSAGE otherwise, and outside
 * process()).  state_id names one state of the operator (the caller picks
 * small numbers); the same id must always be used with the same kind.
 * Values are byte strings of up to 1 GiB; pointers returned are valid until
 * the next state call of the instance.  All keyed state is checkpointed
 * (incrementally: only what changed) and restored on resume. */

/** Value state: the value of state_id for the current key.  Errors:
 * SL_ENOTFOUND (no value), SL_EUSAGE. */
int sl_state_get(sl_ctx *ctx, uint16_t state_id, const void **value,
                 uint32_t *size_bytes);
/** Set the value; returns the stored copy in *stored if not NULL (writable
 * until the next state call, for in-place updates).  Errors: ENOMEM,
 * SL_EUSAGE, EINVAL (too large). */
int sl_state_put(sl_ctx *ctx, uint16_t state_id, const void *value,
                 uint32_t size_bytes, void **stored);
/** Remove the value.  Errors: SL_ENOTFOUND, ENOMEM, SL_EUSAGE. */
int sl_state_delete(sl_ctx *ctx, uint16_t state_id);

/** Map state: a map from user keys to values, per current key. */
int sl_mapstate_get(sl_ctx *ctx, uint16_t state_id, const void *user_key,
                    uint32_t user_key_bytes, const void **value,
                    uint32_t *size_bytes);
int sl_mapstate_put(sl_ctx *ctx, uint16_t state_id, const void *user_key,
                    uint32_t user_key_bytes, const void *value,
                    uint32_t size_bytes);
int sl_mapstate_delete(sl_ctx *ctx, uint16_t state_id, const void *user_key,
                       uint32_t user_key_bytes);

/** List state: append an item (copy-on-write appends copy the list once per
 * checkpoint interval).  Errors as sl_state_put. */
int sl_liststate_add(sl_ctx *ctx, uint16_t state_id, const void *item,
                     uint32_t item_bytes);
/** The list as an opaque buffer for sl_list_next(); SL_ENOTFOUND if empty.
 * Clear it with sl_state_delete(). */
int sl_liststate_get(sl_ctx *ctx, uint16_t state_id, const void **list,
                     uint32_t *list_bytes);
/** Iterate a list buffer: *offset starts at 0; returns 1 with the next item,
 * or 0 at the end. */
int sl_list_next(const void *list, uint32_t list_bytes, uint32_t *offset,
                 const void **item, uint32_t *item_bytes);

/** Reducing / aggregating state: fold value into the accumulator of
 * state_id for the current key.  The accumulator has acc_bytes bytes; when
 * absent it starts as a copy of init (acc_bytes bytes).  fold(user, acc,
 * value, value_bytes) updates acc in place.  The result is returned in
 * *acc_out if not NULL.  Errors as sl_state_put. */
typedef void (*sl_fold_fn)(void *user, void *acc, const void *value,
                           uint32_t value_bytes);
int sl_state_fold(sl_ctx *ctx, uint16_t state_id, const void *init,
                  uint32_t acc_bytes, sl_fold_fn fold, void *user,
                  const void *value, uint32_t value_bytes,
                  const void **acc_out);
/** Value state, read-modify-write in one lookup: *value receives writable
 * storage of size_bytes bytes (8-byte aligned) holding the value of
 * state_id for the current key, to be updated in place until the next
 * state call of the instance.  A value that did not exist is created as a
 * copy of init (size_bytes bytes; zeros if init is NULL).  The call counts
 * as a write (the value is checkpointed as it is when the next checkpoint
 * is taken); a value captured by an earlier checkpoint is copied first, so
 * that checkpoint never sees the update.  The same value as sl_state_get
 * and sl_state_put reach.  Errors: SL_EUSAGE, ENOMEM, EINVAL (value NULL,
 * size over 1 GiB, or the current value has another size: nothing is
 * changed). */
int sl_state_update(sl_ctx *ctx, uint16_t state_id, uint32_t size_bytes,
                    const void *init, void **value);

/** Operator (non-keyed) state of this instance, for sources and sinks.
 * set: only inside a snapshot() hook (SL_EUSAGE elsewhere); the bytes are
 * copied.  get: inside restore() (and open()), the bytes the last snapshot
 * of the checkpoint being restored saved; SL_ENOTFOUND if none. */
int sl_operator_state_set(sl_ctx *ctx, const void *data, uint32_t bytes);
int sl_operator_state_get(sl_ctx *ctx, const void **data, uint32_t *bytes);

/** Nonzero if the job takes checkpoints. */
int sl_ctx_checkpointing(const sl_ctx *ctx);

/* ------------------------------------------------------------------------ */
/* A record shape shared by built-in operators. */

/** A (key, value) record of 16 bytes: what the sources of sluice_testing.h
 * emit, the table sink's default row reads, and the CLI's jobs carry. */
typedef struct sl_tuple {
  uint64_t key;
  uint64_t value;
} sl_tuple;

/* ------------------------------------------------------------------------ */
/* Keys. */

/** A 64-bit hash of a byte string (XXH3), for key functions. */
uint64_t sl_hash_bytes(const void *data, size_t size_bytes);

/** The instance (0..parallelism-1) that owns key under the job's key
 * partitioning: key group = a multiply-shift reduction of a 64-bit mix of
 * the key into 0..max_parallelism-1, instance = key group * parallelism /
 * max_parallelism (contiguous ranges of key groups).  A byte-string key
 * (sl_op_key_by_bytes) is placed by sl_hash_bytes() of its bytes.
 * Returns -1 if max_parallelism is 0 or parallelism is outside
 * 1..max_parallelism. */
int sl_key_instance(uint64_t key, uint32_t max_parallelism, int parallelism);

/* ------------------------------------------------------------------------ */
/* Logging (engine/log.c).  The engine reports what happens besides a job's
 * result — injected faults, failures and restarts — as log lines, handed
 * to a handler the host installs.  By default a library inside someone
 * else's process writes nothing to its stderr: there is no handler,
 * unless the environment variable SLUICE_LOG_LEVEL is set (non-empty),
 * which installs sl_log_stderr as before.  sl_log_stderr writes
 *
 *   2026-12-03T04:12:01.123Z WARN  [supervisor] sluice: job failed: ...
 *
 * (UTC time with milliseconds, level, the thread's name, message), each
 * line with one write(2) and without allocating, so lines of different
 * threads never mix.  The `sluice` CLI and the benchmarks install it. */

/** A log handler: one message (no newline, NUL-ended, at most
 * SL_LOG_LINE_BYTES - 1 bytes, cut with "..." beyond) of level (enum
 * sl_log_level), with the user pointer given to sl_log_set_handler.  The
 * message is valid during the call only.  It is called on whichever thread
 * logs (instance threads, the supervisor, the checkpoint writer, the
 * caller of sl_job_create...), never by two threads at once: calls are
 * serialized by the library.  It must not call back into sluice — no job
 * calls, no sl_log_set_handler (that deadlocks) — and should return soon:
 * the thread that logs waits for it. */
typedef void (*sl_log_fn)(void *user, int level, const char *message);

/** Install fn (with user) as the process-wide log handler; NULL: silent.
 * Replaces the default (none, or sl_log_stderr when SLUICE_LOG_LEVEL is
 * set) for good.  When it returns, the previous handler is not running
 * and will not be called again, so its user data may be freed.  Lines are
 * filtered by the level (sl_log_set_level) before the handler sees them.
 * Any thread, any time, except from inside a handler. */
void sl_log_set_handler(sl_log_fn fn, void *user);

/** The ready-made handler: the line format above on stderr (fd 2); user is
 * ignored.  A program wanting sluice's lines on its stderr calls
 * sl_log_set_handler(sl_log_stderr, NULL). */
void sl_log_stderr(void *user, int level, const char *message);

/* The longest line sl_log_stderr writes, newline included; a handler's
 * message is shorter than this. */
#define SL_LOG_LINE_BYTES 2048

enum sl_log_level {
  SL_LOG_ERROR = 0, /* the job cannot go on */
  SL_LOG_WARN = 1,  /* a failure the engine handles (restart, abort) */
  SL_LOG_INFO = 2,  /* what an operator wants to know (injected faults) */
  SL_LOG_DEBUG = 3, /* details */
};

/** Write lines of level and more severe ones only.  Until this is called
 * the level comes from the environment variable SLUICE_LOG_LEVEL (error,
 * warn, info or debug), else SL_LOG_INFO.  Errors: EINVAL (not a level;
 * nothing changes). */
int sl_log_set_level(int level);

/** The level in force. */
int sl_log_get_level(void);

/** "error", "warn", "info" or "debug" (any case) into *level.  Errors:
 * EINVAL (anything else, or NULL; *level is unchanged). */
int sl_log_level_parse(const char *name, int *level);

/** 1: stderr shows a status line that a program redraws in place with
 * '\r' (as `sluice run` does on a terminal); every log line then starts
 * by clearing it ("\r" and erase to the end of the line), so the two never
 * share a line.  0 (the default): lines are written as they are. */
void sl_log_set_status_line(int on);

#ifdef __cplusplus
}
#endif

/* The other public headers (see HEADERS above); sluice_testing.h is left
 * out on purpose: the test helpers are no stable API. */
#include "sluice_checkpoint.h" /* checkpoints, savepoints, their stats */
#include "sluice_metrics.h"    /* metrics snapshots, HTTP endpoint */
#include "sluice_window.h"     /* windows and joins */
#include "sluice_io.h"         /* sources and sinks: memory, lines, files */
#include "sluice_embed.h"      /* generator, push source, callback sink */
#include "sluice_table.h"      /* LMDB table sink */

#endif /* SLUICE_H */
