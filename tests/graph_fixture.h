/* graph_fixture.h — what the graph and runtime tests share
 * (test_graph.c, test_graph_lifecycle.c, test_graph_validate.c): job
 * bookkeeping, a watchdog-guarded run, checksum and error assertions, a
 * range source, a relay process, a keyed consumer and small maps and
 * filters.  Defined in graph_fixture.c, linked into each of them.
 *
 * Every test builds a real job and runs it on real threads.  Results are
 * checked against values computed independently in the test (closed forms,
 * or sl_checksum_add() over the records the test knows were sent), so a
 * lost, duplicated or altered record shows up as a differing checksum.
 *
 * Callbacks never call Criterion: they count what they see in atomics (in a
 * spec struct the test owns), and the test's main thread asserts after the
 * run.  Runs go through run_guarded(), whose watchdog stops a hung job and
 * fails the test with a clear message instead of waiting for Criterion's
 * timeout.
 *
 * Every suite is declared with .fini = free_leftover_jobs, so a job a
 * failed test left behind is freed and LeakSanitizer reports only real
 * leaks.
 *
 * SLUICE_TEST_SCALE=n divides record counts by n (sanitizer builds: 10).
 * The tests run one at a time (meson passes -j1): several of them measure
 * how promptly a job stops, and two 16-thread jobs sharing the two cores
 * of a development machine would turn that into noise.
 */
#ifndef SL_GRAPH_FIXTURE_H
#define SL_GRAPH_FIXTURE_H

#include <criterion/criterion.h>

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "sluice.h"
#include "sluice_testing.h" /* unstable test helpers */

/* Largest parallelism whose instances a spec tracks one by one. */
#define MAX_P 16
/* Timestamps given by sources that set them: TS_BASE + TS_STEP * index. */
#define TS_BASE 1000
#define TS_STEP 7
/* Records a custom source emits per next() call. */
#define SOURCE_BATCH 256u
/* Default seconds a run may take before the watchdog stops it. */
#define RUN_LIMIT_S 20.0

/* Assert that a call returned 0, naming the call and the job's error. */
#define OK(job, call)                                                         \
  do {                                                                        \
    int ok_rc_ = (call);                                                      \
    cr_assert_eq(ok_rc_, 0, "%s returned %d (%s): %s", #call, ok_rc_,         \
                 sl_strerror(ok_rc_), sl_job_error(job));                     \
  } while (0)

typedef struct lifecycle {
  atomic_int open[MAX_P];
  atomic_int close[MAX_P];
  atomic_int finish[MAX_P];
} lifecycle;

/* A source of sl_tuple {key, value} for index 0 .. count-1, split into
 * contiguous ranges per instance like sl_source_sequence:
 * key = index % key_count (index when key_count is 0),
 * value = value_start + value_step * index,
 * timestamp TS_BASE + TS_STEP * index when with_ts. */
typedef struct range_spec {
  uint64_t count;
  uint64_t value_start;
  uint64_t value_step;
  uint64_t key_count;
  bool with_ts;
  bool endless;        /* never end; count is ignored */
  bool idle;           /* emit nothing, sleep 1 ms per next() */
  bool hold_open;      /* after the last record: idle instead of ending */
  int open_status;     /* nonzero: open fails with it */
  const char *open_cause; /* given to sl_ctx_fail when open fails */
  bool capture_names;
  lifecycle life;
  atomic_int emit_errors; /* sl_emit results other than 0 and SL_ESTOPPED */
  atomic_int bad_ctx;     /* ctx reports that do not fit the state */
  char names[MAX_P][16];
} range_spec;

/* A process operator (or sink) that counts its lifecycle calls and
 * records, optionally forwards every record, sleeps, or fails. */
typedef struct relay_spec {
  bool forward;       /* emit every record unchanged */
  uint64_t sleep_us;  /* per record */
  uint64_t open_sleep_us; /* in open, before returning */
  int fail_instance;  /* instance that fails, -1 none (set by relay_init) */
  uint64_t fail_at;   /* that instance's record (1-based) it fails on */
  int fail_status;
  const char *fail_cause;
  bool capture_names;
  bool try_emit;      /* a sink: call sl_emit and remember its status */
  lifecycle life;
  atomic_ullong records;
  atomic_int bad_ctx;
  atomic_int emit_status_process; /* try_emit: what sl_emit returned */
  atomic_int emit_status_finish;
  char names[MAX_P][16];
} relay_spec;

#define KEYED_MAX_KEYS 4096

/* What a keyed consumer saw: which instance owns each key, and per-key
 * order (per-instance last value arrays live in the instance state). */
typedef struct keyed_spec {
  uint64_t key_count;
  bool check_order;    /* one producer: values per key must increase */
  bool key_is_residue; /* the key is value % REKEY_COUNT, not tuple.key */
  atomic_int owner[KEYED_MAX_KEYS]; /* -1 until seen; then the instance */
  atomic_ullong records;
  atomic_ullong per_instance[MAX_P];
  atomic_ullong conflicts;    /* a key seen by a second instance */
  atomic_ullong out_of_order; /* per key, value not increasing */
  atomic_ullong bad_keys;     /* key outside 0..key_count-1 */
} keyed_spec;

/* The re-keyed test's outer key. */
#define REKEY_COUNT 7

sl_job *job_new(const sl_job_config *config);

void job_free(sl_job *job);

void free_leftover_jobs(void);

/* Start job, wait for it under a watchdog, and return sl_job_wait's
 * status.  Fails the test if the watchdog had to stop the job. */
int run_guarded(sl_job *job, double limit_s);

void assert_checksum_eq(const sl_checksum *got, const sl_checksum *want,
                        const char *what);

void assert_error_has(const sl_job *job, const char *needle);

/* A refused builder or validate call: SL_EGRAPH and a message. */
void assert_refused(const sl_job *job, int rc, const char *needle,
                    const char *what);

sl_tuple tuple_of(const sl_record *in);

uint64_t tuple_key(void *user, const sl_record *in);

void get_stats(const sl_job *job, int i, sl_op_stats *stats);

/* Each of the first p instances saw open/close/finish the given times. */
void assert_lifecycle(const lifecycle *life, int p, int opens,
                      int closes, int finishes, const char *what);

sl_op *add_range(sl_job *job, const char *name, int parallelism,
                 range_spec *spec);

/* The checksum of every record of a (bounded) range source. */
void range_expect(sl_checksum *sum, const range_spec *spec);

void relay_init(relay_spec *spec);

/* {key, v} -> {key, 3v + 1} */
int triple_plus_one(void *user, const sl_record *in, void *out,
                    uint32_t *out_size_bytes);

int keep_even_value(void *user, const sl_record *in);

int copy_map(void *user, const sl_record *in, void *out,
             uint32_t *out_size_bytes);

int keep_all(void *user, const sl_record *in);

int echo_flat_map(void *user, const sl_record *in, sl_ctx *ctx);

void keyed_init(keyed_spec *spec, uint64_t key_count, bool order);

uint64_t rekey_value(void *user, const sl_record *in);

/* Every key seen by exactly one instance, the one sl_key_instance names. */
void assert_key_ownership(keyed_spec *spec, uint32_t max_parallelism,
                          int parallelism);

extern const sl_process_ops relay_ops;
extern const sl_process_ops keyed_ops;

#endif /* SL_GRAPH_FIXTURE_H */
