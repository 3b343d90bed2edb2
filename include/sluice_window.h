/* sluice_window.h — windows and joins: the operators that group a keyed
 * stream by event or processing time (operators/window.c) and that join
 * two keyed streams (operators/join_*.c).  Included by sluice.h; the older
 * name sluice_join.h includes this header.  Event time itself (watermarks,
 * timers, valid times) is in sluice.h.
 */
#ifndef SLUICE_WINDOW_H
#define SLUICE_WINDOW_H

#include <stddef.h>
#include <stdint.h>

#include "sluice.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Windows (operators/window.c).  A window operator consumes a keyed stream
 * (the output of sl_op_key_by) and groups each key's records into windows:
 *
 *   tumbling  [start, start + size) with start = ts - ts mod size
 *             (aligned to the epoch, i.e. to timestamp 0)
 *   sliding   every window [start, start + size) with start a multiple of
 *             slide and start <= ts < start + size (size / slide windows
 *             per record when slide divides size)
 *   session   [first ts, last ts + gap) of a run of records whose gaps are
 *             under gap; sessions that come to overlap merge
 *   count     every `size` records of a key: window k holds its records
 *             k*size .. (k+1)*size - 1 in arrival order (start and end are
 *             those indices); a last, partial window never fires (Flink's
 *             countWindow)
 *
 * A time window fires when the watermark reaches end - 1 (event time) or
 * the wall clock does (processing time), and at the end of input.  Its
 * result is emitted with timestamp end - 1.  With allowed_lateness L an
 * event-time window is kept until the watermark reaches end - 1 + L; a
 * record that arrives for it meanwhile is added and the window fires again
 * with the updated result.  A record whose every window is past that point
 * is late: dropped and counted (sl_op_stats.late_records), or sent to the
 * side output late_port.  Window contents and pending timers are keyed
 * state: checkpointed and restored exactly.  An event-time record whose
 * timestamp is not a valid time (SL_TIME_MIN_VALID .. SL_TIME_MAX_VALID)
 * fails the job with an error naming the operator and the timestamp.
 *
 * Results are computed either incrementally (acc_bytes, init, add, emit;
 * merge too for session windows), keeping one accumulator per window, or
 * by a full-window function (process) that sees every record of the window
 * in arrival order (after sessions merged: each merged part's records in
 * arrival order, one part after the other). */

enum sl_window_type {
  SL_WINDOW_TUMBLING = 0,
  SL_WINDOW_SLIDING = 1,
  SL_WINDOW_SESSION = 2,
  SL_WINDOW_COUNT = 3,
};

typedef struct sl_window {
  int64_t start; /* inclusive (count windows: index of the first record) */
  int64_t end;   /* exclusive */
} sl_window;

/** The records of a window, for a full-window function. */
typedef struct sl_window_contents sl_window_contents;

/** Number of records in the window. */
uint32_t sl_window_count(const sl_window_contents *contents);
/** Record i (0 .. count-1, arrival order) in *out; its data is valid until
 * the next call of this function or of a state function.  Errors: EINVAL
 * (i out of range), SL_ECORRUPT. */
int sl_window_record(const sl_window_contents *contents, uint32_t i,
                     sl_record *out);

typedef struct sl_window_config {
  int type;   /* enum sl_window_type */
  int domain; /* SL_EVENT_TIME (default) or SL_PROCESSING_TIME; unused by
                 count windows */
  int64_t size;  /* tumbling, sliding: length (1 .. SL_TIME_SPAN_MAX);
                    count: records (> 0) */
  int64_t slide; /* sliding: step, 0 < slide <= size */
  int64_t gap;   /* session: the largest gap inside a session
                    (1 .. SL_TIME_SPAN_MAX) */
  int64_t allowed_lateness; /* event time only; 0 .. SL_TIME_SPAN_MAX */
  int late_port; /* 0: drop late records; 1 .. SL_MAX_SIDE_OUTPUTS: emit
                    them there (consume with sl_op_side_output) */
  /* Incremental aggregation: an accumulator of acc_bytes (1 .. 64 KiB)
   * per window.  init sets a fresh one (it must set the same bytes every
   * time: count windows call it once and copy the result); add folds a
   * record in; merge folds
   * other into acc (session windows only, required there); emit produces
   * the result with sl_emit (it may emit any number of records). */
  uint32_t acc_bytes;
  void (*init)(void *user, void *acc);
  void (*add)(void *user, void *acc, const sl_record *in);
  void (*merge)(void *user, void *acc, const void *other);
  int (*emit)(void *user, sl_ctx *ctx, uint64_t key, const sl_window *window,
              const void *acc);
  /* Full-window function (instead of the four above). */
  int (*process)(void *user, sl_ctx *ctx, uint64_t key,
                 const sl_window *window, const sl_window_contents *contents);
  void *user; /* passed to the callbacks; shared by all instances */
} sl_window_config;

/** A window operator on keyed_input (an sl_op_key_by stream).  The config
 * is copied.  Callbacks return 0; anything else fails the job with it
 * (sluice.h, CALLBACK RETURNS).  Errors:
 * EINVAL (an inconsistent config; sl_job_error() says which field),
 * SL_EGRAPH (input not keyed), as the builders. */
int sl_op_window(sl_job *job, const char *name, sl_op *keyed_input,
                 int parallelism, const sl_window_config *config, sl_op **op);
int sl_op_window_sized(sl_job *job, const char *name, sl_op *keyed_input,
                       int parallelism, const sl_window_config *config,
                       sl_op **op, size_t config_bytes);
#define sl_op_window(...)                                                      \
  sl_op_window_sized(__VA_ARGS__, sizeof(sl_window_config))

/* ------------------------------------------------------------------------ */
/* Joins of two keyed streams: windowed, interval and unbounded
 * (operators/join_window.c, join_interval.c, join_unbounded.c).
 *
 * Each join is a keyed two-input operator: input 0 is the left stream,
 * input 1 the right one, and both must come out of sl_op_key_by with key
 * functions that give the join key (records with equal join keys then meet
 * at one instance).  All three are inner equi-joins: a join function is
 * called once for every matching pair (left, right) of one key, and emits
 * whatever it likes with sl_emit().  What they buffer is keyed state and
 * timers, so it is checkpointed and restored exactly with the job.
 *
 *   windowed  (Flink's stream.join(other).where().equalTo().window()):
 *             pairs of one key that fall in the same event-time tumbling
 *             or sliding window, emitted when the window fires (watermark
 *             >= end - 1), stamped end - 1.
 *   interval  (Flink's intervalJoin().between(lower, upper)): pairs with
 *             right.ts - left.ts in [lower, upper], emitted as soon as the
 *             second of the two arrives, stamped max(left.ts, right.ts).
 *   unbounded (a SQL inner join of two insert-only tables): every pair of
 *             one key, emitted when the second of the two arrives, with
 *             that record's timestamp.
 *
 * Lateness, judged against the join's watermark when the record arrives
 * (the minimum over both inputs).  Windowed: a record joins each of its
 * windows whose end - 1 + allowed_lateness is above the watermark, and is
 * late when there is none (the rule of sl_op_window); a pair is emitted,
 * once, for every window both of its records joined.  Interval: a record
 * is late when ts < watermark (Flink's rule; a record at the watermark
 * itself is still joined, since nothing it can match has been dropped
 * yet); a pair of two records that are not late is emitted exactly once.
 * Late records are counted (sl_op_stats.late_records) and dropped, or
 * sent to a side output, one per input.
 *
 * CAVEATS
 *
 * - The unbounded join keeps every record it ever received, forever: its
 *   state grows with its input (record bytes plus about 80 bytes each),
 *   and its output for a key is (left records) x (right records).  Use it
 *   on bounded inputs or few records per key; otherwise prefer an interval
 *   or windowed join, whose state the watermark cleans up.
 * - A join function gets left and right valid only until it returns, and
 *   must not use keyed state itself (the operator's state ids 0xFE00 ..
 *   0xFEFF are its own, and a state call may move what left or right
 *   point to).  It may emit any number of records.
 * - Windowed with allowed lateness: a record that arrives for a window
 *   that already fired (but is within the lateness) is joined at once with
 *   the other side's records of that window, and only those new pairs are
 *   emitted, stamped end - 1.  Flink would fire the whole window again and
 *   repeat its earlier pairs; here every pair is emitted once.
 * - Windowed and interval joins need event time: a record without a
 *   timestamp fails the job (emit with sl_emit_ts).  Processing-time,
 *   session and count windows are refused.
 */

/** Called for one matching pair of records of key.  Emit with sl_emit()
 * (the stamp is the join's, see above) or sl_emit_ts().  Return 0; any
 * other value fails the job with it (say why with sl_ctx_fail). */
typedef int (*sl_join_fn)(void *user, sl_ctx *ctx, uint64_t key,
                          const sl_record *left, const sl_record *right);

/** The same for a windowed join, with the window both records fall in. */
typedef int (*sl_window_join_fn)(void *user, sl_ctx *ctx, uint64_t key,
                                 const sl_window *window,
                                 const sl_record *left,
                                 const sl_record *right);

typedef struct sl_window_join_config {
  int type;   /* SL_WINDOW_TUMBLING or SL_WINDOW_SLIDING (others: EINVAL) */
  int domain; /* SL_EVENT_TIME (the default; SL_PROCESSING_TIME: EINVAL) */
  int64_t size;  /* window length, > 0 */
  int64_t slide; /* sliding: step, 0 < slide <= size; unused by tumbling */
  int64_t allowed_lateness; /* >= 0: a window is kept (and joins records
                               that come for it) until the watermark
                               reaches end - 1 + allowed_lateness */
  int left_late_port;  /* 0: drop late left records; 1 ..
                          SL_MAX_SIDE_OUTPUTS: emit them there */
  int right_late_port; /* the same for the right input (may be equal) */
  sl_window_join_fn join;
  void *user; /* passed to join; shared by all instances */
} sl_window_join_config;

/** A windowed join of left_keyed (input 0) and right_keyed (input 1), both
 * sl_op_key_by streams.  The config is copied.  Errors: EINVAL (an
 * inconsistent config; sl_job_error() names the field), SL_EGRAPH (an
 * input that is not keyed), as the builders. */
int sl_op_window_join(sl_job *job, const char *name, sl_op *left_keyed,
                      sl_op *right_keyed, int parallelism,
                      const sl_window_join_config *cfg, sl_op **op);
int sl_op_window_join_sized(sl_job *job, const char *name, sl_op *left_keyed,
                            sl_op *right_keyed, int parallelism,
                            const sl_window_join_config *cfg, sl_op **op,
                            size_t cfg_bytes);
#define sl_op_window_join(...)                                                 \
  sl_op_window_join_sized(__VA_ARGS__, sizeof(sl_window_join_config))

typedef struct sl_interval_join_config {
  /** A left record a and a right record b of one key match when
   * a.ts + lower <= b.ts <= a.ts + upper (both bounds inclusive, either
   * may be negative, lower <= upper). */
  int64_t lower;
  int64_t upper;
  int left_late_port;  /* 0: drop late left records; 1 ..
                          SL_MAX_SIDE_OUTPUTS: emit them there */
  int right_late_port; /* the same for the right input (may be equal) */
  /** Width, in timestamp units, of the buckets that index the buffered
   * timestamps of a key (join_interval.c note 2).  0: 256.  A record costs about
   * (distinct timestamps in its bucket) + (buckets of its key, when it
   * opens a new one); choose about the number of units that hold a few
   * dozen records of one key. */
  int64_t bucket_width;
  sl_join_fn join;
  void *user; /* passed to join; shared by all instances */
} sl_interval_join_config;

/** An interval join of left_keyed (input 0) and right_keyed (input 1).
 * Buffered records are dropped once the watermark shows they can match
 * nothing more: a left a when watermark > a.ts + upper, a right b when
 * watermark > b.ts - lower.  The config is copied.  Errors: EINVAL (lower
 * > upper, a port out of range, no join function, ...: sl_job_error()
 * says which), SL_EGRAPH (an input that is not keyed), as the builders. */
int sl_op_interval_join(sl_job *job, const char *name, sl_op *left_keyed,
                        sl_op *right_keyed, int parallelism,
                        const sl_interval_join_config *cfg, sl_op **op);
int sl_op_interval_join_sized(sl_job *job, const char *name, sl_op *left_keyed,
                              sl_op *right_keyed, int parallelism,
                              const sl_interval_join_config *cfg, sl_op **op,
                              size_t cfg_bytes);
#define sl_op_interval_join(...)                                               \
  sl_op_interval_join_sized(__VA_ARGS__, sizeof(sl_interval_join_config))

/** An unbounded equi-join of left_keyed (input 0) and right_keyed (input
 * 1): each record is kept forever and joined with every record of the
 * other side of its key, present and future (see CAVEATS: its state only
 * grows).  Records need no timestamp; a pair is emitted with the
 * timestamp of whichever of its two records arrived second (none if that
 * one has none).  Errors: EINVAL (join NULL),
 * SL_EGRAPH (an input that is not keyed), as the builders. */
int sl_op_join(sl_job *job, const char *name, sl_op *left_keyed,
               sl_op *right_keyed, int parallelism, sl_join_fn join,
               void *user, sl_op **op);

#ifdef __cplusplus
}
#endif
#endif /* SLUICE_WINDOW_H */
