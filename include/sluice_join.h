/* sluice_join.h — joins of two keyed streams: windowed, interval and
 * unbounded (operators/join.c).  Included by sluice.h.
 *
 * OVERVIEW
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
#ifndef SLUICE_JOIN_H
#define SLUICE_JOIN_H

#include "sluice.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Called for one matching pair of records of key.  Emit with sl_emit()
 * (the stamp is the join's, see above) or sl_emit_ts().  Return 0, or a
 * negative value to fail the job (say why with sl_ctx_fail); a positive
 * value fails it too. */
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
   * timestamps of a key (join.c note 5).  0: 256.  A record costs about
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
#endif /* SLUICE_JOIN_H */
