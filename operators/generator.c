/* generator.c — the deterministic event generator: a replayable source of
 * sl_event records whose keys, values and event times (in order, out of
 * order within a bound, or late beyond it) are pure functions of the seed
 * and the event's index.
 *
 * NOTES ON THE DESIGN
 *
 * 1. Event i is computed from (config, i) alone (generator_fill): four
 *    independent 64-bit draws, one per stream (key, value, kind of delay,
 *    amount of delay), each a 64-bit finaliser of i mixed with a salt
 *    derived from the seed and the stream.  No state is carried from one
 *    event to the next, so an instance can start anywhere (a restore is a
 *    seek), and sl_generator_event() gives a test the same events without
 *    the engine.
 * 2. Instances split the index range into contiguous ranges, as the
 *    sequence source does: instance k of P emits [count*k/P,
 *    count*(k+1)/P) in index order.  Contiguous rather than round-robin so
 *    that an instance's base time advances by step per event.  Then an
 *    event that is not late is within max_delay of the instance's running
 *    maximum: every earlier timestamp is at most its base (bases only
 *    grow, delays are not negative) and it is at most max_delay below its
 *    base (the guarantees in sluice_embed.h).
 * 3. The position saved in a checkpoint is three words: the next index,
 *    the seed and the count.  A restore refuses a position outside the
 *    instance's range or a seed or count that differ (a changed
 *    configuration would otherwise resume silently into other events).
 * 4. Rate limit (rate.h): the instance keeps a schedule anchored at its
 *    first next() call (after open and restore): by time t it may have
 *    emitted (t - anchor) * rate events.  When nothing is due it sleeps
 *    until the next event is, at most 1 ms per next() call
 *    (GENERATOR_SLEEP_MAX_NS), and returns, so the engine checks for stop
 *    and checkpoints between sleeps; it never spins.  After a stall the
 *    schedule is moved so that at most one batch is due at once (no long
 *    burst at an unlimited rate).
 * 5. Each next() call emits up to GENERATOR_RECORDS_PER_CALL events, each
 *    with sl_emit_ts (records carry their own timestamps, so the batched
 *    sl_emit_batch, which gives every record the same one, does not fit).
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config_abi.h"
#include "internal.h"
#include "op_util.h"
#include "rate.h"

/* Events per next() call (note 5; see builtin.c for why a batch). */
#define GENERATOR_RECORDS_PER_CALL 1024u
/* Longest sleep of the rate limiter inside one next() call (note 4). */
#define GENERATOR_SLEEP_MAX_NS 1000000ull
/* Words of the saved position (note 3). */
#define GENERATOR_STATE_WORDS 3

_Static_assert(sizeof(sl_event) == 32, "sl_event is a 32-byte record");

__extension__ typedef unsigned __int128 u128;
__extension__ typedef __int128 i128;

enum generator_stream {
  STREAM_KEY = 0,
  STREAM_VALUE = 1,
  STREAM_KIND = 2,
  STREAM_DELAY = 3,
  STREAM_COUNT = 4,
};

/* ------------------------------------------------------------ events */

/* Salts of the streams of a seed (note 1). */
typedef struct generator_salts {
  uint64_t salt[STREAM_COUNT];
} generator_salts;

static generator_salts salts_of(uint64_t seed) {
  generator_salts s;
  for (int k = 0; k < STREAM_COUNT; k++)
    s.salt[k] = sl_mix64(seed ^ sl_mix64(0x243f6a8885a308d3ull * (uint64_t)(k + 1)));
  return s;
}

static inline uint64_t draw(const generator_salts *s, int stream,
                            uint64_t i) {
  return sl_mix64((i + 1) * 0x9e3779b97f4a7c15ull ^ s->salt[stream]);
}

/* A draw reduced to 0 .. n-1 (n >= 1) by multiply-shift: unbiased enough
 * for test data, and no division. */
static inline uint64_t draw_below(uint64_t h, uint64_t n) {
  return (uint64_t)(((u128)h * n) >> 64);
}

/* Event i (note 1); cfg is valid. */
static void generator_fill(const sl_generator_config *cfg,
                           const generator_salts *s, uint64_t i,
                           sl_event *e) {
  e->seq = i;
  e->key = cfg->sequential_keys ? i % cfg->keys
                                : draw_below(draw(s, STREAM_KEY, i), cfg->keys);
  e->value = cfg->random_values ? draw(s, STREAM_VALUE, i) : i;
  /* Unsigned arithmetic: i * step alone may leave int64_t while the sum,
   * checked by sl_generator_validate, fits. */
  int64_t base = (int64_t)((uint64_t)cfg->start_ts + i * (uint64_t)cfg->step);
  /* A uniform double in [0, 1) from the top 53 bits. */
  double u = (double)(draw(s, STREAM_KIND, i) >> 11) * 0x1.0p-53;
  uint64_t h = draw(s, STREAM_DELAY, i);
  int64_t delay = 0;
  if (u < cfg->late_fraction) {
    uint64_t span = (uint64_t)(cfg->late_delay_max - cfg->late_delay_min);
    /* span + 1 cannot wrap: both delays are non-negative int64_t. */
    delay = cfg->late_delay_min + (int64_t)draw_below(h, span + 1);
  } else if (u < cfg->late_fraction + cfg->disorder) {
    delay = (int64_t)draw_below(h, (uint64_t)cfg->max_delay + 1);
  }
  assert(delay >= 0);
  assert(delay <= cfg->max_delay || delay >= cfg->late_delay_min);
  e->ts = base - delay;
}

SL_EXPORT int sl_generator_event_sized(const sl_generator_config *cfg,
                                       uint64_t i, sl_event *out,
                                       size_t cfg_bytes) {
  sl_generator_config copy;
  if (sl_config_read(NULL, NULL, 0, "sl_generator_event",
                     "sl_generator_config", cfg, cfg_bytes, &copy,
                     sizeof copy, SL_GENERATOR_CONFIG_V1)) {
    memset(out, 0, sizeof *out);
    return EINVAL;
  }
  generator_salts s = salts_of(copy.seed);
  generator_fill(&copy, &s, i, out);
  return 0;
}

/* The version-1 symbol (config_abi.c note 1); it cannot report a refusal,
 * and the version-1 size is always readable. */
SL_EXPORT void(sl_generator_event)(const sl_generator_config *cfg,
                                   uint64_t i, sl_event *out) {
  (void)sl_generator_event_sized(cfg, i, out, SL_GENERATOR_CONFIG_V1);
}

SL_EXPORT void sl_generator_range(uint64_t count, int parallelism,
                                  int instance, uint64_t *begin,
                                  uint64_t *end) {
  if (parallelism < 1 || instance < 0 || instance >= parallelism) {
    *begin = *end = 0; /* no such instance: an empty range */
    return;
  }
  /* 128-bit products so that huge counts do not overflow. */
  *begin = (uint64_t)((u128)count * (uint64_t)instance / (uint64_t)parallelism);
  *end = (uint64_t)((u128)count * (uint64_t)(instance + 1) /
                    (uint64_t)parallelism);
}

/* ------------------------------------------------------------ validation */

/* invalid(err, err_bytes, fmt, ...): why the config is refused into the
 * caller's buffer (if any), then EINVAL. */
#define invalid(...) op_errorf(EINVAL, __VA_ARGS__)

static bool probability(double p) { return p >= 0.0 && p <= 1.0; } /* NaN: no */

SL_EXPORT int sl_generator_validate_sized(const sl_generator_config *cfg,
                                          char *err, size_t err_bytes,
                                          size_t cfg_bytes) {
  if (err && err_bytes)
    err[0] = 0;
  if (!cfg)
    return invalid(err, err_bytes, "no configuration");
  sl_generator_config copy;
  if (sl_config_read(NULL, err, err_bytes, "sl_generator_validate",
                     "sl_generator_config", cfg, cfg_bytes, &copy,
                     sizeof copy, SL_GENERATOR_CONFIG_V1))
    return EINVAL;
  cfg = &copy;
  if (cfg->keys == 0)
    return invalid(err, err_bytes, "keys is 0 (at least 1 key)");
  if (cfg->step < 0)
    return invalid(err, err_bytes, "step %" PRId64 " is negative", cfg->step);
  if (cfg->max_delay < 0)
    return invalid(err, err_bytes, "max_delay %" PRId64 " is negative",
                   cfg->max_delay);
  if (!probability(cfg->disorder))
    return invalid(err, err_bytes, "disorder %g is outside 0 .. 1",
                   cfg->disorder);
  if (!probability(cfg->late_fraction))
    return invalid(err, err_bytes, "late_fraction %g is outside 0 .. 1",
                   cfg->late_fraction);
  /* A little slack for sums like 0.7 + 0.3 that round above 1. */
  if (cfg->disorder + cfg->late_fraction > 1.0 + 1e-12)
    return invalid(err, err_bytes, "disorder %g + late_fraction %g is above 1",
                   cfg->disorder, cfg->late_fraction);
  int64_t deepest = cfg->max_delay;
  if (cfg->late_fraction > 0) {
    if (cfg->late_delay_min <= cfg->max_delay)
      return invalid(err, err_bytes, "late_delay_min %" PRId64 " is not "
                     "beyond max_delay %" PRId64 " (late events must be "
                     "behind the bound)", cfg->late_delay_min, cfg->max_delay);
    if (cfg->late_delay_max < cfg->late_delay_min)
      return invalid(err, err_bytes, "late_delay_max %" PRId64 " is below "
                     "late_delay_min %" PRId64, cfg->late_delay_max,
                     cfg->late_delay_min);
    deepest = cfg->late_delay_max;
  }
  /* Every timestamp within int64_t and above SL_NO_TIMESTAMP (INT64_MIN). */
  i128 last = cfg->count ? (i128)cfg->start_ts +
                               (i128)(cfg->count - 1) * (i128)cfg->step
                         : (i128)cfg->start_ts;
  if (last > (i128)INT64_MAX)
    return invalid(err, err_bytes, "the last base timestamp, start_ts + "
                   "(count - 1) * step, is beyond INT64_MAX");
  if ((i128)cfg->start_ts - (i128)deepest <= (i128)INT64_MIN)
    return invalid(err, err_bytes, "start_ts %" PRId64 " minus the largest "
                   "delay %" PRId64 " reaches SL_NO_TIMESTAMP", cfg->start_ts,
                   deepest);
  return 0;
}

/* ------------------------------------------------------------ source */

typedef struct generator_instance {
  const sl_generator_config *cfg;
  generator_salts salts;
  uint64_t begin; /* this instance's range (note 2) */
  uint64_t end;
  uint64_t next;  /* the position (note 3) */
  rate_limiter rate; /* note 4 */
} generator_instance;

static int generator_open(sl_ctx *ctx, void *user, void **state) {
  const sl_generator_config *cfg = user;
  generator_instance *g = calloc(1, sizeof *g);
  if (!g)
    return ENOMEM;
  g->cfg = cfg;
  g->salts = salts_of(cfg->seed);
  sl_generator_range(cfg->count, sl_ctx_parallelism(ctx),
                     sl_ctx_instance(ctx), &g->begin, &g->end);
  g->next = g->begin;
  g->rate = rate_limiter_make(cfg->events_per_second,
                              GENERATOR_RECORDS_PER_CALL,
                              GENERATOR_SLEEP_MAX_NS);
  *state = g;
  return 0;
}

static int generator_next(sl_ctx *ctx, void *state) {
  generator_instance *g = state;
  uint64_t left = g->end - g->next;
  if (left == 0)
    return SL_SOURCE_END;
  uint64_t n = rate_due(&g->rate, ctx, left < GENERATOR_RECORDS_PER_CALL
                                            ? left
                                            : GENERATOR_RECORDS_PER_CALL);
  assert(n <= left);
  assert(n <= GENERATOR_RECORDS_PER_CALL);
  for (uint64_t k = 0; k < n; k++) {
    sl_event e;
    generator_fill(g->cfg, &g->salts, g->next, &e);
    int rc = sl_emit_ts(ctx, &e, sizeof e, e.ts);
    if (rc)
      return rc; /* this event was not emitted: next stays on it */
    g->next++;
    rate_emitted(&g->rate, 1);
  }
  return g->next == g->end ? SL_SOURCE_END : 0;
}

/* Note 3. */
static int generator_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  const generator_instance *g = state;
  uint64_t words[GENERATOR_STATE_WORDS] = {g->next, g->cfg->seed,
                                           g->cfg->count};
  return sl_operator_state_set(ctx, words, sizeof words);
}

static int generator_restore(sl_ctx *ctx, void *state, uint64_t id) {
  generator_instance *g = state;
  uint64_t words[GENERATOR_STATE_WORDS];
  int rc = sl_operator_state_words(ctx, id, "generator position", words,
                                   GENERATOR_STATE_WORDS);
  if (rc == SL_ENOTFOUND)
    return 0; /* nothing saved: from the beginning of the range */
  if (rc)
    return rc;
  if (words[1] != g->cfg->seed || words[2] != g->cfg->count) {
    sl_ctx_fail(ctx, "checkpoint %" PRIu64 " was written by a generator "
                "with seed %" PRIu64 " and count %" PRIu64 ", this one has "
                "seed %" PRIu64 " and count %" PRIu64, id, words[1], words[2],
                g->cfg->seed, g->cfg->count);
    return EINVAL;
  }
  if (words[0] < g->begin || words[0] > g->end) {
    sl_ctx_fail(ctx, "checkpoint %" PRIu64 ": position %" PRIu64 " is "
                "outside this instance's range [%" PRIu64 ", %" PRIu64 ")",
                id, words[0], g->begin, g->end);
    return EINVAL;
  }
  g->next = words[0];
  assert(g->begin <= g->next && g->next <= g->end);
  return 0;
}

static void generator_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  free(state);
}

SL_EXPORT int sl_source_generator_sized(sl_job *job, const char *name,
                                        int parallelism,
                                        const sl_generator_config *cfg,
                                        sl_op **op, size_t cfg_bytes) {
  if (!job || !op)
    return EINVAL;
  if (job->state != SL_JOB_BUILDING)
    return SL_ESTARTED;
  sl_generator_config in;
  if (SL_CONFIG_READ(job, sl_source_generator, sl_generator_config,
                     SL_GENERATOR_CONFIG_V1, cfg, cfg_bytes, &in))
    return EINVAL;
  if (cfg)
    cfg = &in;
  char why[200];
  int rc = sl_generator_validate(cfg, why, sizeof why);
  if (rc) {
    sl_job_set_error(job, "generator '%s': %s", name ? name : "(null)", why);
    return rc;
  }
  sl_generator_config *copy = malloc(sizeof *copy);
  if (!copy)
    return ENOMEM;
  *copy = *cfg;
  static const sl_source_ops ops = {.open = generator_open,
                                    .next = generator_next,
                                    .close = generator_close,
                                    .snapshot = generator_snapshot,
                                    .restore = generator_restore};
  rc = sl_op_source(job, name, parallelism, &ops, copy, op);
  return op_adopt(rc, op, copy, free);
}

/* The version-1 symbols (config_abi.c note 1): a program linked before the
 * sized calls existed passed a version-1 struct. */
SL_EXPORT int(sl_generator_validate)(const sl_generator_config *cfg,
                                     char *err, size_t err_bytes) {
  return sl_generator_validate_sized(cfg, err, err_bytes,
                                     SL_GENERATOR_CONFIG_V1);
}

SL_EXPORT int(sl_source_generator)(sl_job *job, const char *name,
                                   int parallelism,
                                   const sl_generator_config *cfg,
                                   sl_op **op) {
  return sl_source_generator_sized(job, name, parallelism, cfg, op,
                                   SL_GENERATOR_CONFIG_V1);
}
