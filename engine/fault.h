/* fault.h — fault injection: the spec a user writes, parsed into a plan,
 * and the decisions of when a planned fault fires.  The engine asks; this
 * module never fails, sleeps or kills anything itself, except
 * sl_fault_crash_check(), which exists to make a crash look the same at
 * every crash point.
 *
 * SYNTAX
 *
 * One syntax for the job config string, the CLI flag (--fault SPEC,
 * repeatable) and SLUICE_FAULTS.  Its one home is the section "The fault
 * grammar" of docs/failover-and-faults.md (kinds, parameters, ranges,
 * examples); sl_fault_plan_parse() below implements exactly that text, and the
 * fault suite (tests/test_fault.c) holds both to each other.
 *
 * NOTES ON THE DESIGN
 *
 * 1. A plan is parsed once, before the job starts, and read-only after
 *    that except for two atomic counters per fault (occurrences, fired).
 *    It holds at most SL_FAULT_MAX faults, so every check below is
 *    bounded by that number.
 * 2. Occurrence-counted kinds (snapshot, write, restore, store, crash,
 *    complete):
 *    the engine calls sl_fault_occur() once per event that could fail.
 *    Every fault that matches the event (kind, call or point, op,
 *    instance) takes the next occurrence number k (1, 2, ...) with one
 *    atomic increment, and fires when nth <= k <= nth+times-1.  Numbers
 *    are unique across threads, so a fault fires exactly
 *    min(times, occurrences-nth+1) times however many threads race.
 *    When several faults fire at one event, the first in the plan wins;
 *    the others have still used up that occurrence (and fire once less).
 * 3. Per-record kinds (fail, slow): each instance owns an sl_fault_cursor
 *    holding the faults that match it, its record count since the last
 *    (re)start and, per prob fault, a SplitMix64 state seeded from the
 *    fault's seed and the instance's stable number.  The engine calls
 *    sl_fault_cursor_next() before each record, and only when
 *    sl_fault_cursor_active() says a fault matches, so a job without
 *    per-record faults pays one predictable branch per record.  A fail
 *    fault "claims" one of its `times` with a compare-and-swap on its
 *    fired counter, so the budget is global to the fault across
 *    instances and restarts.
 * 4. After a restore the engine calls sl_fault_cursor_restart(): the
 *    record count starts again (record=N and slow's from/records count
 *    from the restart) but the generators continue, so a replayed record
 *    does not meet the same random failure again and the job progresses.
 *    One draw is taken per record and prob fault whether or not its
 *    budget is left, so the k-th record an instance processes sees the
 *    same draw in every run with that seed.
 * 5. The counters are relaxed atomics: they only need to be unique
 *    (occurrences) or bounded (fired); no other memory is published
 *    through them.
 *
 * Which calls may run concurrently:
 *
 *                 | parse/free | occur | cursor_next     | describe/log
 *   parse/free    | no         | no    | no              | no
 *   occur         | no         | yes   | yes             | yes
 *   cursor_next   | no         | yes   | other cursors   | yes
 *   describe/log  | no         | yes   | yes             | yes
 *
 * (cursor_init and cursor_restart are cursor_next for this table.)
 *
 * Caveats
 * - Operator names that contain ',' ';' '=' ':' or whitespace cannot be
 *   named by op (the engine does not forbid them); such an operator is
 *   still hit by faults without op.
 * - A fault whose op or instance matches nothing in the job never fires;
 *   the plan does not know the graph.  The engine may check with
 *   sl_fault_matches() and warn.
 * - Occurrence and fired counts live in the plan: a new process (a run
 *   resumed after a crash) starts them from zero.
 */
#ifndef SL_FAULT_H
#define SL_FAULT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sluice.h"

#define SL_FAULT_MAX 32          /* faults in one plan */
#define SL_FAULT_TEXT_BYTES 256  /* one fault's text, with NUL */
#define SL_FAULT_DELAY_US_MAX 10000000u
#define SL_FAULT_TIMES_INF UINT64_MAX

enum sl_fault_kind {
  SL_FAULT_FAIL,     /* per record */
  SL_FAULT_SNAPSHOT, /* occurrence-counted */
  SL_FAULT_WRITE,    /* occurrence-counted */
  SL_FAULT_RESTORE,  /* occurrence-counted */
  SL_FAULT_STORE,    /* occurrence-counted, by call */
  SL_FAULT_SLOW,     /* per record */
  SL_FAULT_CRASH,    /* occurrence-counted, by point */
  /* Occurrence-counted: an instance told that a checkpoint completed
   * fails before its checkpoint_complete hook runs (after the commit,
   * before an exactly-once sink commits or delivers). */
  SL_FAULT_COMPLETE,
};

enum sl_fault_call {
  SL_FAULT_CALL_PUT,
  SL_FAULT_CALL_COMMIT,
  SL_FAULT_CALL_SYNC,
};

enum sl_fault_point {
  SL_CRASH_MID_WRITE,
  SL_CRASH_AFTER_COMMIT,
  SL_CRASH_SINK_COMMIT,
  SL_CRASH_SNAPSHOT,
  SL_CRASH_AFTER_RESTORE,
};

/* One planned fault.  Fields a kind does not take keep their defaults. */
typedef struct sl_fault {
  enum sl_fault_kind kind;
  /* This fault's spec as the user wrote it, trimmed: for log lines and
   * failure messages. */
  char text[SL_FAULT_TEXT_BYTES];
  char op[SL_MAX_NAME];  /* "" = any operator */
  int instance;          /* -1 = any instance */
  uint64_t record;       /* fail: 0 when prob is used */
  double prob;           /* fail: 0 when record is used */
  uint64_t prob_threshold; /* fail: fire when draw >> 11 < this (prob*2^53) */
  uint64_t seed;         /* fail with prob, default 1 */
  uint64_t nth;          /* default 1 */
  uint64_t times;        /* default 1; SL_FAULT_TIMES_INF = no limit */
  enum sl_fault_call call;   /* store */
  int error;             /* store: EIO, ENOSPC or MDB_MAP_FULL */
  uint32_t delay_us;     /* slow */
  uint64_t from;         /* slow, default 1 */
  uint64_t records;      /* slow, default UINT64_MAX (all) */
  enum sl_fault_point point; /* crash */
  /* Occurrence-counted kinds: matching events seen.  fail: records at
   * which it was due (whether or not it still had a time left). */
  _Atomic uint64_t occurrences;
  /* Times it fired.  slow: records delayed. */
  _Atomic uint64_t fired;
} sl_fault;

typedef struct sl_fault_plan {
  int count; /* 1..SL_FAULT_MAX */
  sl_fault faults[];
} sl_fault_plan;

/* Parse spec into a new plan.  spec NULL or without faults: returns 0 and
 * *out = NULL (no plan: every call below accepts a NULL plan).
 * Errors (*out = NULL, err filled when err_bytes > 0):
 *   EINVAL  the spec is wrong; err says which fault (1-based, and its text)
 *           and what is wrong, e.g.
 *           "fault 2 ('store:call=put,error=EBADF'): unknown error 'EBADF'
 *           (EIO, ENOSPC or MAP_FULL)"
 *   ENOMEM */
int sl_fault_plan_parse(const char *spec, sl_fault_plan **out, char *err,
                        size_t err_bytes);

/* Parse several specs into one plan, in order: specs[i] came from
 * origins[i] ("config", "SLUICE_FAULTS", "--fault 2"...), which prefixes
 * its error messages ("SLUICE_FAULTS: fault 1 ('...'): ...").  A NULL
 * spec is skipped; origins may be NULL (no prefix).  Faults are numbered
 * within their spec.  Returns as sl_fault_plan_parse; SL_FAULT_MAX is the
 * limit for all specs together. */
int sl_fault_plan_parse_many(const char *const *specs,
                             const char *const *origins, int spec_count,
                             sl_fault_plan **out, char *err, size_t err_bytes);

/* Free a plan (NULL is fine).  No cursor may use it after this. */
void sl_fault_plan_free(sl_fault_plan *plan);

/* Whether the plan has a fault of that kind (false for a NULL plan): lets
 * the engine skip an event's bookkeeping altogether. */
bool sl_fault_plan_has(const sl_fault_plan *plan, enum sl_fault_kind kind);

/* Whether f applies to instance `instance` of operator op.  op NULL or
 * instance -1 stand for "no operator"/"no instance" (the writer, the
 * store): they match only a fault without op/instance. */
bool sl_fault_matches(const sl_fault *f, const char *op, int instance);

/* Count one event of an occurrence-counted kind (note 2) and return the
 * fault that fires at it, or NULL.  sub: the call (store) or the point
 * (crash), -1 for the other kinds.  op/instance: as sl_fault_matches (the
 * writer, the store and crash points pass NULL, -1).  Thread-safe. */
sl_fault *sl_fault_occur(sl_fault_plan *plan, enum sl_fault_kind kind,
                         int sub, const char *op, int instance);

/* Take back the occurrence the last sl_fault_occur() call with the same
 * arguments counted (every matching fault's number goes down by one; the
 * winner's fired count is the caller's to give back).  For an event that
 * turned out not to count: the attempt was already failing.  The caller
 * serializes it with that sl_fault_occur() call. */
void sl_fault_unoccur(sl_fault_plan *plan, enum sl_fault_kind kind, int sub,
                      const char *op, int instance);

/* If a crash fault fires at this occurrence of point, log it and kill the
 * process with SIGKILL (no atexit handlers, no flushing: like a power
 * cut).  Returns only if nothing fires. */
void sl_fault_crash_check(sl_fault_plan *plan, enum sl_fault_point point);

/* ------------------------------------------------------ per-record faults */

/* One instance's view of the per-record faults (note 3).  Owned by the
 * instance's thread; ~0.5 KB, no allocation. */
typedef struct sl_fault_cursor {
  uint64_t record; /* records stepped since the last (re)start */
  int count;       /* matching fail/slow faults; 0 = inactive */
  sl_fault *faults[SL_FAULT_MAX];
  uint64_t rng_state[SL_FAULT_MAX]; /* SplitMix64 state of prob faults */
} sl_fault_cursor;

/* What to do with the next record. */
typedef struct sl_fault_step {
  sl_fault *fail;        /* fail here with this fault (already claimed) */
  uint32_t delay_us;     /* sleep this long first (sum of slow faults) */
  sl_fault *slow_begins; /* a slow fault whose range starts at this
                            record: log it once, not every record */
} sl_fault_step;

/* Set c up for instance `instance` of operator op.  stable_instance_number
 * must be the same for this instance in every run of the job (e.g.
 * operator index * SL_MAX_PARALLELISM + instance) and differ between
 * instances, so prob faults draw the same sequence per seed and not the
 * same one on every instance.  plan may be NULL (inactive cursor). */
void sl_fault_cursor_init(sl_fault_cursor *c, sl_fault_plan *plan,
                          const char *op, int instance,
                          uint32_t stable_instance_number);

/* Whether any per-record fault matches c's instance: call
 * sl_fault_cursor_next() only then. */
static inline bool sl_fault_cursor_active(const sl_fault_cursor *c) {
  return c->count > 0;
}

/* Step c over the next record and say what to do with it (note 3).  The
 * engine sleeps step.delay_us, then fails the instance with step.fail
 * (sl_fault_describe) if it is set, before processing the record. */
sl_fault_step sl_fault_cursor_next(sl_fault_cursor *c);

/* The instance restarted (restore): the record count starts again from 0,
 * the generators continue (note 4). */
void sl_fault_cursor_restart(sl_fault_cursor *c);

/* ---------------------------------------------------------------- text */

/* "injected fault 'fail:op=count,record=5000'" into buf (n bytes, always
 * NUL-terminated when n > 0).  Returns what snprintf returns. */
int sl_fault_describe(const sl_fault *f, char *buf, size_t n);

/* One log line at SL_LOG_INFO (log.h: with time, level and thread name
 * ahead, written with one call so lines of different threads do not mix):
 *   sluice: injecting fault 'TEXT' (DETAIL)
 * DETAIL from detail_fmt (e.g. "operator 'count' instance 2, record
 * 5000"); without it (NULL) the parenthesis is left out.  A longer line
 * is cut to 511 bytes with its ')' and newline. */
void sl_fault_log(const sl_fault *f, const char *detail_fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Names for messages: "fail", "put", "mid-write", "MAP_FULL"... */
const char *sl_fault_kind_name(enum sl_fault_kind kind);
const char *sl_fault_call_name(enum sl_fault_call call);
const char *sl_fault_point_name(enum sl_fault_point point);
const char *sl_fault_error_name(int error);

#endif /* SL_FAULT_H */
