/* test_join.c — the windowed, interval and unbounded joins against
 * nested-loop references over all pairs, at parallelism 1 and 4, plain
 * and with a failure of the join in the middle of the run; late records;
 * configuration errors.
 *
 * Two ways to feed a join:
 *
 * - Two sources, one per side (the realistic shape): the join's watermark
 *   is the minimum of the two, and how the batches of the two interleave
 *   depends on timing.  So this data has no late record at all: every
 *   timestamp is within the out-of-orderness bound B of its own source's
 *   running maximum, hence above that source's watermark, hence above the
 *   join's (a minimum), whatever the interleaving.  The output is then
 *   every matching pair, and the reference is the plain nested loop.
 * - One source emitting both sides with a tag, split by two filters into
 *   two keyed streams, for late records.  A watermark follows each batch
 *   of BATCH records (every_call), so the watermark after batch k-1 is
 *   W(k-1) = max(ts of batches 0..k-1) - B - 1.  Before it emits batch k
 *   the source waits until the join's watermark (sl_job_stats, the
 *   minimum over its instances) has reached W(k-1): then every record of
 *   batch k meets exactly W(k-1) at the join (its own channel is at
 *   W(k-1), the other one at least there, and it sees nothing of batch
 *   k+1's watermark before W(k) is sent).  The reference judges lateness
 *   with the same W(k-1) and models nothing else of the engine.  A
 *   restore brings back the source's and the join's watermarks (timer.c
 *   note 7), so failures do not change it either.  Without the wait the
 *   join reads its two channels at different paces and a record meets
 *   any watermark from the lagging channel's up to W(k-1): with the wait
 *   taken out, the five tests with late records failed in 4 runs of 4.
 * - With a failure injected, the sources also hold back from a quarter of
 *   their input until a checkpoint is complete, so the failure (at half
 *   of the failing instance's input) always has one to restore.
 *
 * The sink collects results per instance in memory; its snapshot saves
 * how many it holds and a restore truncates back to that, so after a
 * failover the results are those of the committed run (as test_window.c).
 *
 * After each run the test also counts the entries left in the join's
 * keyed state (through engine/internal.h): none for the windowed and
 * interval joins, whose state the final watermark cleans up, and one per
 * record plus one per key for the unbounded join, which keeps everything.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* the join's keyed state, counted after a run */
#include "sluice.h"
#include "test_dirs.h"
#include "test_util.h"

#define BATCH 64
#define BOUND 50
#define KEYS 7
#define JOIN_NAME "join"

enum { LEFT = 0, RIGHT = 1 };

typedef struct side_event {
  uint64_t key;
  uint64_t value; /* unique within the test's data */
  int64_t ts;
  uint64_t tag; /* LEFT or RIGHT */
} side_event;

/* One joined pair as the sink receives it (stamp: the record's timestamp
 * as the sink saw it). */
typedef struct pair_out {
  uint64_t key;
  int64_t start, end; /* the window (windowed join), else 0 */
  uint64_t left, right; /* values */
  int64_t left_ts, right_ts;
  int64_t stamp;
} pair_out;

static uint64_t rng_next(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 33;
}

/* n events of keys 0..KEYS-1: ts advances 3 per event; 30% jitter back
 * within the bound (0 .. BOUND-1), late_pct% moved back by BOUND + 10 ..
 * BOUND + 199.  tag < 0: a random side per event, else that side. */
static side_event *make_events(uint64_t n, int tag, uint64_t value_base,
                               int late_pct, uint64_t seed) {
  side_event *e = malloc(sizeof *e * n);
  cr_assert(e);
  uint64_t s = seed;
  for (uint64_t i = 0; i < n; i++) {
    e[i].key = rng_next(&s) % KEYS;
    e[i].value = value_base + i + 1;
    e[i].tag = tag < 0 ? rng_next(&s) % 2 : (uint64_t)tag;
    int64_t ts = 1000 + (int64_t)i * 3;
    uint64_t r = rng_next(&s) % 100;
    if (r < (uint64_t)late_pct)
      ts -= BOUND + 10 + (int64_t)(rng_next(&s) % 190);
    else if (r < 30u + (uint64_t)late_pct)
      ts -= (int64_t)(rng_next(&s) % BOUND);
    e[i].ts = ts;
  }
  return e;
}

/* The watermark record i of one source meets: from the batches before its
 * own (SL_WATERMARK_MIN before the first). */
static int64_t *watermark_before(const side_event *e, uint64_t n) {
  int64_t *wm = malloc(sizeof *wm * (n ? n : 1));
  cr_assert(wm);
  int64_t max = INT64_MIN, current = SL_WATERMARK_MIN;
  for (uint64_t i = 0; i < n; i++) {
    if (i % BATCH == 0 && i > 0 && max != INT64_MIN &&
        max - BOUND - 1 > current)
      current = max - BOUND - 1;
    wm[i] = current;
    if (e[i].ts > max)
      max = e[i].ts;
  }
  return wm;
}

/* ----------------------------------------------------------- the source */

typedef struct source {
  const side_event *events;
  uint64_t n;
  uint64_t pos;
  uint64_t delay_us;  /* per batch: lets checkpoints complete mid-run */
  int no_timestamps;  /* emit with sl_emit: records without a timestamp */
  sl_job *job;
  int sync;           /* wait for the join's watermark (see the top) */
  int join_index;
  uint64_t gate_at;   /* > 0: emit nothing from this position on until a
                         checkpoint has completed */
  double held_since;  /* when the current wait began; 0: not waiting */
} source;

static int src_open(sl_ctx *ctx, void *user, void **state) {
  (void)ctx;
  source *s = calloc(1, sizeof *s);
  if (!s)
    return -ENOMEM;
  *s = *(const source *)user;
  s->pos = 0;
  *state = s;
  return 0;
}

/* Whether the source must hold back its next batch: until every join
 * instance has the watermark this source sent last (sync), and from
 * gate_at on until a checkpoint is complete, so that the failure at half
 * the join's input always finds one to restore.  A holding source returns
 * from next() without emitting and is called again: blocking inside
 * next() would hold back the barriers it injects between calls. */
static int src_hold(sl_ctx *ctx, source *s, bool *hold) {
  *hold = false;
  int64_t sent = sl_ctx_watermark(ctx);
  sl_op_stats st = {.watermark = SL_WATERMARK_MAX};
  if (s->sync && sent != SL_WATERMARK_MIN) {
    if (sl_job_stats(s->job, s->join_index, &st) != 0)
      return -EINVAL;
    *hold = st.watermark < sent;
  }
  if (s->gate_at && s->pos >= s->gate_at &&
      sl_job_last_checkpoint(s->job, 0) == 0)
    *hold = true;
  if (!*hold) {
    s->held_since = 0;
    return 0;
  }
  double now = sl_test_now_s();
  if (s->held_since == 0)
    s->held_since = now;
  if (now - s->held_since > 10.0) {
    sl_ctx_fail(ctx, "held for 10 s: the join's watermark is %" PRId64
                " waiting for %" PRId64 ", last checkpoint %" PRIu64,
                st.watermark, sent, sl_job_last_checkpoint(s->job, 0));
    return -ETIMEDOUT;
  }
  sl_test_sleep_us(20);
  return 0;
}

static int src_next(sl_ctx *ctx, void *state) {
  source *s = state;
  bool hold;
  int rc = src_hold(ctx, s, &hold);
  if (rc || hold)
    return rc;
  if (s->delay_us)
    sl_test_sleep_us(s->delay_us);
  for (int k = 0; k < BATCH && s->pos < s->n; k++, s->pos++) {
    const side_event *e = &s->events[s->pos];
    rc = s->no_timestamps ? sl_emit(ctx, e, sizeof *e)
                          : sl_emit_ts(ctx, e, sizeof *e, e->ts);
    if (rc)
      return rc;
  }
  return s->pos == s->n ? SL_SOURCE_END : 0;
}

static void src_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  free(state);
}

static int src_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  return sl_fixture_save_position(ctx, &((source *)state)->pos);
}

static int src_restore(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  return sl_fixture_load_position(ctx, &((source *)state)->pos);
}

static const sl_source_ops src_ops = {.open = src_open,
                                      .next = src_next,
                                      .close = src_close,
                                      .snapshot = src_snapshot,
                                      .restore = src_restore};

static uint64_t event_key(void *user, const sl_record *in) {
  (void)user;
  return ((const side_event *)in->data)->key;
}

static int is_left(void *user, const sl_record *in) {
  (void)user;
  return ((const side_event *)in->data)->tag == LEFT;
}

static int is_right(void *user, const sl_record *in) {
  (void)user;
  return ((const side_event *)in->data)->tag == RIGHT;
}

/* ----------------------------------------------------------- the sink */

/* sl_fixture_collector (fixtures.h) of pair_out records, each stamped
 * with the timestamp it arrived with. */
typedef sl_fixture_collector collector;

static int sink_process(sl_ctx *ctx, void *state, int input,
                        const sl_record *in) {
  int rc = sl_fixture_collector_process(ctx, state, input, in);
  if (rc == 0)
    ((pair_out *)sl_fixture_collector_last(state))->stamp = in->timestamp;
  return rc;
}

static const sl_process_ops sink_ops = {
    .open = sl_fixture_collector_open,
    .process = sink_process,
    .snapshot = sl_fixture_collector_snapshot,
    .restore = sl_fixture_collector_restore};

/* Late side outputs: counted per port, and checked to be the port's side. */
static uint64_t late_seen[2];

static int late_sink_process(sl_ctx *ctx, void *state, int input,
                             const sl_record *in) {
  (void)state;
  (void)input;
  int side = strcmp(sl_ctx_name(ctx), "late-left") == 0 ? LEFT : RIGHT;
  const side_event *e = in->data;
  if (in->size_bytes != sizeof *e || e->tag != (uint64_t)side ||
      in->timestamp != e->ts) {
    sl_ctx_fail(ctx, "a record of the wrong side or shape on a late port");
    return -EINVAL;
  }
  __atomic_fetch_add(&late_seen[side], 1, __ATOMIC_RELAXED);
  return 0;
}

static int pair_cmp(const void *a, const void *b) {
  const pair_out *x = a, *y = b;
  if (x->key != y->key)
    return x->key < y->key ? -1 : 1;
  if (x->start != y->start)
    return x->start < y->start ? -1 : 1;
  if (x->left != y->left)
    return x->left < y->left ? -1 : 1;
  if (x->right != y->right)
    return x->right < y->right ? -1 : 1;
  if (x->end != y->end)
    return x->end < y->end ? -1 : 1;
  if (x->left_ts != y->left_ts)
    return x->left_ts < y->left_ts ? -1 : 1;
  if (x->right_ts != y->right_ts)
    return x->right_ts < y->right_ts ? -1 : 1;
  if (x->stamp != y->stamp)
    return x->stamp < y->stamp ? -1 : 1;
  return 0;
}

/* All instances' results, sorted. */
static pair_out *gather(collector *c, uint64_t *n) {
  pair_out *all = sl_fixture_collector_gather(c, pair_cmp, n);
  cr_assert(all);
  return all;
}

static void expect_same(const pair_out *got, uint64_t n_got,
                        const pair_out *want, uint64_t n_want,
                        const char *what) {
  cr_assert_gt(n_want, 0, "%s: the reference has no pairs", what);
  uint64_t n = n_got < n_want ? n_got : n_want;
  for (uint64_t i = 0; i < n; i++)
    cr_assert(pair_cmp(&got[i], &want[i]) == 0,
              "%s: pair %" PRIu64 " of %" PRIu64 " differs: got key %" PRIu64
              " [%" PRId64 ",%" PRId64 ") %" PRIu64 "@%" PRId64 " x %" PRIu64
              "@%" PRId64 " stamp %" PRId64 ", want key %" PRIu64
              " [%" PRId64 ",%" PRId64 ") %" PRIu64 "@%" PRId64 " x %" PRIu64
              "@%" PRId64 " stamp %" PRId64,
              what, i, n_want, got[i].key, got[i].start, got[i].end,
              got[i].left, got[i].left_ts, got[i].right, got[i].right_ts,
              got[i].stamp, want[i].key, want[i].start, want[i].end,
              want[i].left, want[i].left_ts, want[i].right, want[i].right_ts,
              want[i].stamp);
  cr_assert_eq(n_got, n_want, "%s: %" PRIu64 " pairs, want %" PRIu64, what,
               n_got, n_want);
}

/* ----------------------------------------------------------- join fns */

/* Each checks that it was given a pair the join's contract allows, and
 * emits it. */
static bool pair_ok(uint64_t key, const sl_record *l, const sl_record *r) {
  const side_event *a = l->data, *b = r->data;
  return l->size_bytes == sizeof *a && r->size_bytes == sizeof *b &&
         a->tag == LEFT && b->tag == RIGHT && a->key == key &&
         b->key == key;
}

static int emit_pair(sl_ctx *ctx, uint64_t key, const sl_window *w,
                     const sl_record *l, const sl_record *r) {
  const side_event *a = l->data, *b = r->data;
  pair_out o = {.key = key, .left = a->value, .right = b->value,
                .left_ts = l->timestamp, .right_ts = r->timestamp};
  if (w) {
    o.start = w->start;
    o.end = w->end;
  }
  return sl_emit(ctx, &o, sizeof o);
}

static int window_join_fn(void *user, sl_ctx *ctx, uint64_t key,
                          const sl_window *w, const sl_record *l,
                          const sl_record *r) {
  (void)user;
  const side_event *a = l->data, *b = r->data;
  if (!pair_ok(key, l, r) || l->timestamp != a->ts || r->timestamp != b->ts ||
      a->ts < w->start || a->ts >= w->end || b->ts < w->start ||
      b->ts >= w->end) {
    sl_ctx_fail(ctx, "window join: a pair outside its window or key");
    return -EINVAL;
  }
  return emit_pair(ctx, key, w, l, r);
}

static int interval_join_fn(void *user, sl_ctx *ctx, uint64_t key,
                            const sl_record *l, const sl_record *r) {
  const sl_interval_join_config *c = user;
  const side_event *a = l->data, *b = r->data;
  if (!pair_ok(key, l, r) || l->timestamp != a->ts || r->timestamp != b->ts ||
      b->ts < a->ts + c->lower || b->ts > a->ts + c->upper) {
    sl_ctx_fail(ctx, "interval join: a pair outside the bounds or key");
    return -EINVAL;
  }
  return emit_pair(ctx, key, 0, l, r);
}

static int unbounded_join_fn(void *user, sl_ctx *ctx, uint64_t key,
                             const sl_record *l, const sl_record *r) {
  (void)user;
  if (!pair_ok(key, l, r)) {
    sl_ctx_fail(ctx, "join: a pair of another key or side");
    return -EINVAL;
  }
  return emit_pair(ctx, key, 0, l, r);
}

/* ----------------------------------------------------------- running */

enum join_type { WINDOWED, INTERVAL, UNBOUNDED };

typedef struct run_spec {
  enum join_type type;
  sl_window_join_config window;
  sl_interval_join_config interval;
  /* Two sources (left, right), or one tagged source (merged). */
  const side_event *left, *right, *merged;
  uint64_t n_left, n_right, n_merged;
  int no_timestamps;
  int no_watermarks; /* sources send only SL_WATERMARK_MAX, at their end */
  int parallelism;
  const char *faults;    /* NULL: none */
  const char *state_dir; /* needed with faults */
  uint64_t late_counted; /* out: the join's late_records */
  uint64_t late_port[2]; /* out: late records seen on the side outputs */
  uint32_t restarts;     /* out */
  uint64_t restored_from; /* out: checkpoint the failover restored */
  uint64_t state_entries; /* out: entries left in the join's keyed state */
  int status;            /* out: sl_job_run's */
  char error[512];       /* out: sl_job_error */
} run_spec;

static int find_operator(sl_job *job, const char *name) {
  for (int i = 0; i < sl_job_operator_count(job); i++) {
    sl_op_stats st;
    cr_assert_eq(sl_job_stats(job, i, &st), 0);
    if (strcmp(st.name, name) == 0)
      return i;
  }
  cr_assert_fail("no operator %s", name);
  return -1;
}

static int add_join(sl_job *job, run_spec *spec, sl_op *l, sl_op *r,
                    sl_op **j) {
  switch (spec->type) {
  case WINDOWED:
    return sl_op_window_join(job, JOIN_NAME, l, r, spec->parallelism,
                             &spec->window, j);
  case INTERVAL:
    return sl_op_interval_join(job, JOIN_NAME, l, r, spec->parallelism,
                               &spec->interval, j);
  default:
    return sl_op_join(job, JOIN_NAME, l, r, spec->parallelism,
                      unbounded_join_fn, 0, j);
  }
}

static pair_out *run_join(run_spec *spec, uint64_t *n_out) {
  sl_job_config config = SL_JOB_CONFIG_INIT;
  if (spec->state_dir) {
    config.checkpoint.state_dir = spec->state_dir;
    config.checkpoint.interval_ms = 5;
    config.checkpoint.no_sync = 1;
    config.checkpoint.store_policy = SL_STORE_FRESH;
    config.restart = sl_restart_defaults(SL_RESTART_FIXED_DELAY);
    config.restart.attempts = 5;
    config.restart.delay_ms = 0;
  }
  config.faults = spec->faults;
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  sl_watermark_config wm = {.out_of_orderness = BOUND, .every_call = 1};
  /* With checkpoints, pace the sources so that a run lasts about 100 ms:
   * several checkpoints complete before the failure at half the input. */
  uint64_t longest = spec->merged ? spec->n_merged
                     : spec->n_left > spec->n_right ? spec->n_left
                                                    : spec->n_right;
  uint64_t batches = (longest + BATCH - 1) / BATCH;
  uint64_t delay_us = spec->state_dir ? 100000 / (batches ? batches : 1) : 0;
  int gate = spec->faults != 0; /* a quarter in, wait for a checkpoint */
  source srcs[2] = {{0}};
  sl_op *keyed[2];
  if (spec->merged) {
    srcs[0] = (source){.events = spec->merged, .n = spec->n_merged,
                       .delay_us = delay_us, .job = job, .sync = 1,
                       .gate_at = gate ? spec->n_merged / 4 : 0,
                       .no_timestamps = spec->no_timestamps};
    sl_op *s, *f[2];
    cr_assert_eq(sl_op_source(job, "src", 1, &src_ops, &srcs[0], &s), 0);
    if (!spec->no_timestamps && !spec->no_watermarks)
      cr_assert_eq(sl_op_watermarks(s, &wm), 0);
    cr_assert_eq(sl_op_filter(job, "left", s, 1, is_left, 0, &f[0]), 0);
    cr_assert_eq(sl_op_filter(job, "right", s, 1, is_right, 0, &f[1]), 0);
    cr_assert_eq(sl_op_key_by(job, "left-key", f[0], event_key, 0,
                              &keyed[0]),
                 0);
    cr_assert_eq(sl_op_key_by(job, "right-key", f[1], event_key, 0,
                              &keyed[1]),
                 0);
  } else {
    const side_event *ev[2] = {spec->left, spec->right};
    uint64_t n[2] = {spec->n_left, spec->n_right};
    const char *names[2][2] = {{"left", "left-key"}, {"right", "right-key"}};
    for (int side = 0; side < 2; side++) {
      srcs[side] = (source){.events = ev[side], .n = n[side],
                            .delay_us = delay_us, .job = job,
                            .gate_at = gate ? n[side] / 4 : 0,
                            .no_timestamps = spec->no_timestamps};
      sl_op *s;
      cr_assert_eq(sl_op_source(job, names[side][0], 1, &src_ops,
                                &srcs[side], &s),
                   0);
      if (!spec->no_timestamps && !spec->no_watermarks)
        cr_assert_eq(sl_op_watermarks(s, &wm), 0);
      cr_assert_eq(sl_op_key_by(job, names[side][1], s, event_key, 0,
                                &keyed[side]),
                   0);
    }
  }
  sl_op *j, *out;
  cr_assert_eq(add_join(job, spec, keyed[0], keyed[1], &j), 0, "%s",
               sl_job_error(job));
  collector sink_data = {.record_bytes = sizeof(pair_out)};
  cr_assert_eq(sl_op_sink(job, "out", j, spec->parallelism, &sink_ops,
                          &sink_data, &out),
               0);
  int ports[2] = {spec->window.left_late_port + spec->interval.left_late_port,
                  spec->window.right_late_port +
                      spec->interval.right_late_port};
  static const sl_process_ops late_ops = {.process = late_sink_process};
  const char *late_names[2][2] = {{"late-left-port", "late-left"},
                                  {"late-right-port", "late-right"}};
  for (int side = 0; side < 2; side++) {
    late_seen[side] = 0;
    if (!ports[side])
      continue;
    sl_op *port, *sink;
    cr_assert_eq(sl_op_side_output(job, late_names[side][0], j, ports[side],
                                   &port),
                 0, "%s", sl_job_error(job));
    cr_assert_eq(sl_op_sink(job, late_names[side][1], port, 1, &late_ops, 0,
                            &sink),
                 0);
  }
  int join_index = find_operator(job, JOIN_NAME);
  srcs[0].join_index = join_index;
  spec->status = sl_job_run(job);
  snprintf(spec->error, sizeof spec->error, "%s", sl_job_error(job));
  sl_op_stats st;
  cr_assert_eq(sl_job_stats(job, join_index, &st), 0);
  spec->late_counted = st.late_records;
  for (int side = 0; side < 2; side++)
    spec->late_port[side] = late_seen[side];
  spec->restarts = sl_job_restarts(job);
  spec->state_entries = 0;
  const sl_op *join_op = job->physical[join_index];
  for (int k = 0; k < join_op->parallelism; k++)
    if (join_op->instances[k].cp.keyed)
      spec->state_entries += sl_cow_map_count(join_op->instances[k].cp.keyed);
  sl_recovery_stats rs;
  spec->restored_from =
      sl_job_recovery_stats(job, 0, &rs) == 0 ? rs.restored_from : 0;
  sl_job_destroy(job);
  return gather(&sink_data, n_out);
}

/* ----------------------------------------------------------- references */

/* A record as the reference sees it: the event and the watermark it met
 * at the join (SL_WATERMARK_MIN: none, never late). */
typedef struct judged {
  side_event e;
  int64_t wm;
} judged;

typedef struct ref_input {
  judged *side[2];
  uint64_t n[2];
} ref_input;

/* Two sources: no record is late (checked here, see the top). */
static ref_input ref_two_sources(const side_event *left, uint64_t n_left,
                                 const side_event *right, uint64_t n_right) {
  ref_input in = {{0}, {0}};
  const side_event *ev[2] = {left, right};
  uint64_t n[2] = {n_left, n_right};
  for (int side = 0; side < 2; side++) {
    int64_t *wm = watermark_before(ev[side], n[side]);
    in.side[side] = malloc(sizeof(judged) * n[side]);
    cr_assert(in.side[side]);
    for (uint64_t i = 0; i < n[side]; i++) {
      cr_assert_gt(ev[side][i].ts, wm[i],
                   "test data: record %" PRIu64 " is behind its source's "
                   "watermark", i);
      in.side[side][i] = (judged){.e = ev[side][i], .wm = SL_WATERMARK_MIN};
    }
    in.n[side] = n[side];
    free(wm);
  }
  return in;
}

/* One tagged source: each record with the watermark W(k-1) of its batch. */
static ref_input ref_one_source(const side_event *merged, uint64_t n) {
  ref_input in = {{0}, {0}};
  int64_t *wm = watermark_before(merged, n);
  for (int side = 0; side < 2; side++) {
    in.side[side] = malloc(sizeof(judged) * n);
    cr_assert(in.side[side]);
  }
  for (uint64_t i = 0; i < n; i++) {
    int side = (int)merged[i].tag;
    in.side[side][in.n[side]++] = (judged){.e = merged[i], .wm = wm[i]};
  }
  free(wm);
  return in;
}

static void ref_free(ref_input *in) {
  free(in->side[0]);
  free(in->side[1]);
}

typedef struct ref_out {
  pair_out *items;
  uint64_t count, capacity;
  uint64_t late;           /* both sides */
  uint64_t late_side[2];
  uint64_t state_entries; /* left in the join's state at the end */
} ref_out;

static void ref_emit(ref_out *o, pair_out p) {
  if (o->count == o->capacity) {
    o->capacity = o->capacity ? o->capacity * 2 : 1024;
    o->items = realloc(o->items, sizeof(pair_out) * o->capacity);
    cr_assert(o->items);
  }
  o->items[o->count++] = p;
}

static int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

/* A record takes part in window [.., end) unless the window was gone when
 * it arrived. */
static bool window_live(const judged *r, int64_t end, int64_t lateness) {
  return r->wm == SL_WATERMARK_MIN || end - 1 + lateness > r->wm;
}

/* Every (left, right) of one key in one window both take part in. */
static ref_out ref_windowed(const ref_input *in,
                            const sl_window_join_config *c) {
  ref_out o = {0};
  int64_t slide = c->type == SL_WINDOW_TUMBLING ? c->size : c->slide;
  for (int side = 0; side < 2; side++)
    for (uint64_t i = 0; i < in->n[side]; i++) {
      const judged *r = &in->side[side][i];
      bool any = false;
      for (int64_t start = floor_div(r->e.ts, slide) * slide;
           start > r->e.ts - c->size; start -= slide)
        any = any || window_live(r, start + c->size, c->allowed_lateness);
      o.late_side[side] += !any;
    }
  o.late = o.late_side[LEFT] + o.late_side[RIGHT];
  for (uint64_t i = 0; i < in->n[LEFT]; i++) {
    const judged *a = &in->side[LEFT][i];
    for (uint64_t k = 0; k < in->n[RIGHT]; k++) {
      const judged *b = &in->side[RIGHT][k];
      if (a->e.key != b->e.key)
        continue;
      for (int64_t start = floor_div(a->e.ts, slide) * slide;
           start > a->e.ts - c->size; start -= slide) {
        int64_t end = start + c->size;
        if (b->e.ts < start || b->e.ts >= end ||
            !window_live(a, end, c->allowed_lateness) ||
            !window_live(b, end, c->allowed_lateness))
          continue;
        ref_emit(&o, (pair_out){.key = a->e.key, .start = start, .end = end,
                                .left = a->e.value, .right = b->e.value,
                                .left_ts = a->e.ts, .right_ts = b->e.ts,
                                .stamp = end - 1});
      }
    }
  }
  qsort(o.items, o.count, sizeof(pair_out), pair_cmp);
  return o;
}

/* Flink's rule: late when ts < watermark. */
static bool interval_late(const judged *r) {
  return r->wm != SL_WATERMARK_MIN && r->e.ts < r->wm;
}

static ref_out ref_interval(const ref_input *in, int64_t lower,
                            int64_t upper) {
  ref_out o = {0};
  for (int side = 0; side < 2; side++)
    for (uint64_t i = 0; i < in->n[side]; i++)
      o.late_side[side] += interval_late(&in->side[side][i]);
  o.late = o.late_side[LEFT] + o.late_side[RIGHT];
  for (uint64_t i = 0; i < in->n[LEFT]; i++) {
    const judged *a = &in->side[LEFT][i];
    for (uint64_t k = 0; k < in->n[RIGHT]; k++) {
      const judged *b = &in->side[RIGHT][k];
      if (a->e.key != b->e.key || interval_late(a) || interval_late(b) ||
          b->e.ts < a->e.ts + lower || b->e.ts > a->e.ts + upper)
        continue;
      ref_emit(&o, (pair_out){.key = a->e.key, .left = a->e.value,
                              .right = b->e.value, .left_ts = a->e.ts,
                              .right_ts = b->e.ts,
                              .stamp = a->e.ts > b->e.ts ? a->e.ts
                                                         : b->e.ts});
    }
  }
  qsort(o.items, o.count, sizeof(pair_out), pair_cmp);
  return o;
}

/* Every pair of one key; the stamp is checked separately (it depends on
 * which record arrived second), so it is left 0 here. */
static ref_out ref_unbounded(const ref_input *in, bool timestamps) {
  ref_out o = {0};
  /* Every record stays, and each key that had one keeps its counts. */
  bool seen[KEYS] = {false};
  for (int side = 0; side < 2; side++)
    for (uint64_t i = 0; i < in->n[side]; i++) {
      o.state_entries += 1 + !seen[in->side[side][i].e.key];
      seen[in->side[side][i].e.key] = true;
    }
  for (uint64_t i = 0; i < in->n[LEFT]; i++) {
    const judged *a = &in->side[LEFT][i];
    for (uint64_t k = 0; k < in->n[RIGHT]; k++) {
      const judged *b = &in->side[RIGHT][k];
      if (a->e.key != b->e.key)
        continue;
      ref_emit(&o, (pair_out){
                       .key = a->e.key, .left = a->e.value,
                       .right = b->e.value,
                       .left_ts = timestamps ? a->e.ts : SL_NO_TIMESTAMP,
                       .right_ts = timestamps ? b->e.ts : SL_NO_TIMESTAMP});
    }
  }
  qsort(o.items, o.count, sizeof(pair_out), pair_cmp);
  return o;
}

/* ----------------------------------------------------------- checking */

/* Records the join's instance 0 of parallelism receives. */
static uint64_t instance0_records(const run_spec *spec, int parallelism) {
  const side_event *ev[3] = {spec->left, spec->right, spec->merged};
  uint64_t n[3] = {spec->n_left, spec->n_right, spec->n_merged};
  uint64_t count = 0;
  for (int k = 0; k < 3; k++)
    for (uint64_t i = 0; i < n[k]; i++)
      count += sl_key_instance(ev[k][i].key, 128, parallelism) == 0;
  return count;
}

/* The unbounded join stamps a pair with the record that arrived second:
 * one of the two timestamps.  Checked, then cleared for the comparison. */
static void check_unbounded_stamps(pair_out *got, uint64_t n,
                                   const char *what) {
  for (uint64_t i = 0; i < n; i++) {
    cr_assert(got[i].stamp == got[i].left_ts ||
                  got[i].stamp == got[i].right_ts,
              "%s: pair %" PRIu64 " stamped %" PRId64 ", neither %" PRId64
              " nor %" PRId64, what, i, got[i].stamp, got[i].left_ts,
              got[i].right_ts);
    got[i].stamp = 0;
  }
  qsort(got, n, sizeof *got, pair_cmp);
}

/* Run spec's join at parallelism 1 and 4, plain and with a failure of the
 * join's instance 0 in the middle of its input, and compare each run with
 * the reference; in plain runs also the late counts. */
static void check_all(run_spec base, const ref_out *want, const char *what) {
  const int ps[] = {1, 4};
  for (int pi = 0; pi < 2; pi++) {
    for (int failing = 0; failing < 2; failing++) {
      run_spec spec = base;
      spec.parallelism = ps[pi];
      char *dir = 0;
      char faults[128];
      if (failing) {
        dir = sl_test_temp_dir("join");
        spec.state_dir = dir;
        uint64_t mine = instance0_records(&base, ps[pi]);
        cr_assert_gt(mine, 100, "%s: instance 0 gets too little input", what);
        snprintf(faults, sizeof faults,
                 "fail:op=" JOIN_NAME ",instance=0,record=%" PRIu64,
                 mine / 2);
        spec.faults = faults;
      }
      uint64_t n_got;
      pair_out *got = run_join(&spec, &n_got);
      char label[200];
      snprintf(label, sizeof label, "%s, parallelism %d%s", what, ps[pi],
               failing ? ", failure mid-run" : "");
      cr_assert_eq(spec.status, 0, "%s: job failed: %s", label, spec.error);
      if (spec.type == UNBOUNDED)
        check_unbounded_stamps(got, n_got, label);
      expect_same(got, n_got, want->items, want->count, label);
      cr_assert_eq(spec.state_entries, want->state_entries,
                   "%s: %" PRIu64 " entries left in the join's state, "
                   "expected %" PRIu64, label, spec.state_entries,
                   want->state_entries);
      if (failing) {
        cr_assert_eq(spec.restarts, 1, "%s: %u restarts", label,
                     spec.restarts);
        cr_assert_gt(spec.restored_from, 0,
                     "%s: the failover restored no checkpoint", label);
      } else {
        /* After a failure a replayed late record is counted again. */
        cr_assert_eq(spec.late_counted, want->late,
                     "%s: %" PRIu64 " late, reference %" PRIu64, label,
                     spec.late_counted, want->late);
        int ports[2] = {base.window.left_late_port +
                            base.interval.left_late_port,
                        base.window.right_late_port +
                            base.interval.right_late_port};
        for (int side = 0; side < 2; side++)
          if (ports[side])
            cr_assert_eq(spec.late_port[side], want->late_side[side],
                         "%s: %" PRIu64 " late on the %s port, reference "
                         "%" PRIu64, label, spec.late_port[side],
                         side == LEFT ? "left" : "right",
                         want->late_side[side]);
      }
      free(got);
      if (dir)
        sl_test_remove_tree(dir);
    }
  }
}

/* ----------------------------------------------------------- windowed */

#define SIDE_EVENTS 3000

Test(window_join, tumbling_two_sources) {
  side_event *l = make_events(SIDE_EVENTS, LEFT, 0, 0, 11);
  side_event *r = make_events(SIDE_EVENTS, RIGHT, 1000000, 0, 12);
  ref_input in = ref_two_sources(l, SIDE_EVENTS, r, SIDE_EVENTS);
  run_spec spec = {.type = WINDOWED, .left = l, .right = r,
                   .n_left = SIDE_EVENTS, .n_right = SIDE_EVENTS};
  spec.window = (sl_window_join_config){.type = SL_WINDOW_TUMBLING,
                                        .size = 100, .join = window_join_fn};
  ref_out want = ref_windowed(&in, &spec.window);
  cr_assert_eq(want.late, 0);
  check_all(spec, &want, "tumbling window join");
  free(want.items);
  ref_free(&in);
  free(l);
  free(r);
}

Test(window_join, sliding_two_sources) {
  side_event *l = make_events(SIDE_EVENTS, LEFT, 0, 0, 21);
  side_event *r = make_events(SIDE_EVENTS, RIGHT, 1000000, 0, 22);
  ref_input in = ref_two_sources(l, SIDE_EVENTS, r, SIDE_EVENTS);
  run_spec spec = {.type = WINDOWED, .left = l, .right = r,
                   .n_left = SIDE_EVENTS, .n_right = SIDE_EVENTS};
  spec.window = (sl_window_join_config){.type = SL_WINDOW_SLIDING,
                                        .size = 120, .slide = 40,
                                        .join = window_join_fn};
  ref_out want = ref_windowed(&in, &spec.window);
  check_all(spec, &want, "sliding window join");
  free(want.items);
  ref_free(&in);
  free(l);
  free(r);
}

#define MERGED_EVENTS 6000

Test(window_join, late_records_dropped_and_sent_to_side_outputs) {
  side_event *m = make_events(MERGED_EVENTS, -1, 0, 6, 31);
  ref_input in = ref_one_source(m, MERGED_EVENTS);
  run_spec spec = {.type = WINDOWED, .merged = m,
                   .n_merged = MERGED_EVENTS};
  spec.window = (sl_window_join_config){.type = SL_WINDOW_TUMBLING,
                                        .size = 100, .left_late_port = 1,
                                        .right_late_port = 2,
                                        .join = window_join_fn};
  ref_out want = ref_windowed(&in, &spec.window);
  cr_assert_gt(want.late, 100, "the data has late records");
  cr_assert_gt(want.late_side[LEFT], 0);
  cr_assert_gt(want.late_side[RIGHT], 0);
  check_all(spec, &want, "tumbling window join, late records");
  free(want.items);
  ref_free(&in);
  free(m);
}

Test(window_join, allowed_lateness_joins_late_pairs_once) {
  side_event *m = make_events(MERGED_EVENTS, -1, 0, 10, 41);
  ref_input in = ref_one_source(m, MERGED_EVENTS);
  run_spec spec = {.type = WINDOWED, .merged = m,
                   .n_merged = MERGED_EVENTS};
  spec.window = (sl_window_join_config){.type = SL_WINDOW_SLIDING,
                                        .size = 100, .slide = 50,
                                        .allowed_lateness = 60,
                                        .join = window_join_fn};
  ref_out want = ref_windowed(&in, &spec.window);
  sl_window_join_config strict = spec.window;
  strict.allowed_lateness = 0;
  ref_out plain = ref_windowed(&in, &strict);
  cr_assert_gt(want.count, plain.count, "late pairs are joined in this data");
  cr_assert_lt(want.late, plain.late);
  cr_assert_gt(want.late, 0, "some records are beyond the lateness");
  free(plain.items);
  check_all(spec, &want, "sliding window join, allowed lateness");
  free(want.items);
  ref_free(&in);
  free(m);
}

/* ----------------------------------------------------------- interval */

static void interval_two_sources(int64_t lower, int64_t upper,
                                 int64_t bucket_width, uint64_t seed,
                                 const char *what) {
  side_event *l = make_events(SIDE_EVENTS, LEFT, 0, 0, seed);
  side_event *r = make_events(SIDE_EVENTS, RIGHT, 1000000, 0, seed + 1);
  ref_input in = ref_two_sources(l, SIDE_EVENTS, r, SIDE_EVENTS);
  run_spec spec = {.type = INTERVAL, .left = l, .right = r,
                   .n_left = SIDE_EVENTS, .n_right = SIDE_EVENTS};
  spec.interval = (sl_interval_join_config){.lower = lower, .upper = upper,
                                            .bucket_width = bucket_width,
                                            .join = interval_join_fn};
  spec.interval.user = &spec.interval;
  ref_out want = ref_interval(&in, lower, upper);
  cr_assert_eq(want.late, 0);
  /* run_join copies spec; the join function reads the bounds through
   * user, which must outlive the runs: this frame does. */
  check_all(spec, &want, what);
  free(want.items);
  ref_free(&in);
  free(l);
  free(r);
}

Test(interval_join, around_zero_default_buckets) {
  interval_two_sources(-30, 20, 0, 51, "interval join [-30, 20]");
}

Test(interval_join, positive_bounds_small_buckets) {
  interval_two_sources(5, 60, 7, 61, "interval join [5, 60], buckets of 7");
}

Test(interval_join, negative_bounds_unit_buckets) {
  interval_two_sources(-80, -10, 1, 71,
                       "interval join [-80, -10], buckets of 1");
}

Test(interval_join, equal_bounds) {
  interval_two_sources(0, 0, 0, 81, "interval join [0, 0]");
}

static void interval_one_source(int64_t lower, int64_t upper,
                                int64_t bucket_width, uint64_t seed,
                                const char *what) {
  side_event *m = make_events(MERGED_EVENTS, -1, 0, 6, seed);
  ref_input in = ref_one_source(m, MERGED_EVENTS);
  run_spec spec = {.type = INTERVAL, .merged = m,
                   .n_merged = MERGED_EVENTS};
  spec.interval = (sl_interval_join_config){.lower = lower, .upper = upper,
                                            .bucket_width = bucket_width,
                                            .left_late_port = 3,
                                            .right_late_port = 4,
                                            .join = interval_join_fn};
  spec.interval.user = &spec.interval;
  ref_out want = ref_interval(&in, lower, upper);
  cr_assert_gt(want.late, 100, "the data has late records");
  cr_assert_gt(want.late_side[LEFT], 0);
  cr_assert_gt(want.late_side[RIGHT], 0);
  check_all(spec, &want, what);
  free(want.items);
  ref_free(&in);
  free(m);
}

Test(interval_join, late_records) {
  interval_one_source(-40, 25, 0, 91, "interval join [-40, 25], late");
}

/* upper < 0: a record at the watermark is not late, matches buffered
 * rights, and is expired at once (not buffered). */
Test(interval_join, late_records_negative_upper) {
  interval_one_source(-70, -5, 3, 101, "interval join [-70, -5], late");
}

/* ----------------------------------------------------------- unbounded */

#define UNBOUNDED_EVENTS 700

Test(unbounded_join, two_sources_without_timestamps) {
  side_event *l = make_events(UNBOUNDED_EVENTS, LEFT, 0, 0, 111);
  side_event *r = make_events(UNBOUNDED_EVENTS, RIGHT, 1000000, 0, 112);
  ref_input in = ref_two_sources(l, UNBOUNDED_EVENTS, r, UNBOUNDED_EVENTS);
  run_spec spec = {.type = UNBOUNDED, .left = l, .right = r,
                   .n_left = UNBOUNDED_EVENTS, .n_right = UNBOUNDED_EVENTS,
                   .no_timestamps = 1};
  ref_out want = ref_unbounded(&in, false);
  cr_assert_gt(want.count, 50000);
  check_all(spec, &want, "unbounded join, no timestamps");
  free(want.items);
  ref_free(&in);
  free(l);
  free(r);
}

Test(unbounded_join, one_tagged_source_with_timestamps) {
  side_event *m = make_events(2 * UNBOUNDED_EVENTS, -1, 0, 6, 121);
  ref_input in = ref_one_source(m, 2 * UNBOUNDED_EVENTS);
  run_spec spec = {.type = UNBOUNDED, .merged = m,
                   .n_merged = 2 * UNBOUNDED_EVENTS};
  ref_out want = ref_unbounded(&in, true);
  /* No lateness: late records join like any other. */
  check_all(spec, &want, "unbounded join, one source");
  free(want.items);
  ref_free(&in);
  free(m);
}

/* ----------------------------------------------------------- failures */

/* A record without a timestamp fails an event-time join, naming why. */
Test(join_errors, record_without_timestamp_fails_the_job) {
  side_event *l = make_events(200, LEFT, 0, 0, 131);
  side_event *r = make_events(200, RIGHT, 1000000, 0, 132);
  for (int type = WINDOWED; type <= INTERVAL; type++) {
    run_spec spec = {.type = type, .left = l, .right = r, .n_left = 200,
                     .n_right = 200, .no_timestamps = 1, .parallelism = 2};
    spec.window = (sl_window_join_config){.type = SL_WINDOW_TUMBLING,
                                          .size = 100,
                                          .join = window_join_fn};
    spec.interval = (sl_interval_join_config){.lower = -5, .upper = 5,
                                              .join = interval_join_fn};
    spec.interval.user = &spec.interval;
    uint64_t n;
    free(run_join(&spec, &n));
    cr_assert(spec.status == EINVAL,
              "type %d: %d", type, spec.status);
    cr_assert(strstr(spec.error, "without a timestamp"), "%s", spec.error);
    cr_assert(strstr(spec.error, JOIN_NAME), "%s", spec.error);
  }
  free(l);
  free(r);
}

static int failing_join_fn(void *user, sl_ctx *ctx, uint64_t key,
                           const sl_record *l, const sl_record *r) {
  (void)user;
  (void)l;
  (void)r;
  sl_ctx_fail(ctx, "refusing the pair of key %" PRIu64, key);
  return EINVAL;
}

Test(join_errors, join_function_failure_fails_the_job) {
  side_event *l = make_events(200, LEFT, 0, 0, 141);
  side_event *r = make_events(200, RIGHT, 1000000, 0, 142);
  sl_job *job;
  cr_assert_eq(sl_job_create(0, &job), 0);
  source srcs[2] = {{.events = l, .n = 200}, {.events = r, .n = 200}};
  sl_op *s[2], *k[2], *j, *out;
  cr_assert_eq(sl_op_source(job, "l", 1, &src_ops, &srcs[0], &s[0]), 0);
  cr_assert_eq(sl_op_source(job, "r", 1, &src_ops, &srcs[1], &s[1]), 0);
  cr_assert_eq(sl_op_key_by(job, "lk", s[0], event_key, 0, &k[0]), 0);
  cr_assert_eq(sl_op_key_by(job, "rk", s[1], event_key, 0, &k[1]), 0);
  cr_assert_eq(sl_op_join(job, "j", k[0], k[1], 1, failing_join_fn, 0, &j),
               0);
  collector sink_data = {.record_bytes = sizeof(pair_out)};
  cr_assert_eq(sl_op_sink(job, "out", j, 1, &sink_ops, &sink_data, &out), 0);
  cr_assert_eq(sl_job_run(job), EINVAL); /* failing_join_fn's return */
  cr_assert(strstr(sl_job_error(job), "refusing the pair"), "%s",
            sl_job_error(job));
  sl_job_destroy(job);
  uint64_t n;
  free(gather(&sink_data, &n));
  free(l);
  free(r);
}

Test(join_errors, config_errors_name_the_problem) {
  sl_job *job;
  cr_assert_eq(sl_job_create(0, &job), 0);
  source src = {0};
  sl_op *s, *k, *k2, *j;
  cr_assert_eq(sl_op_source(job, "src", 1, &src_ops, &src, &s), 0);
  cr_assert_eq(sl_op_key_by(job, "k", s, event_key, 0, &k), 0);
  cr_assert_eq(sl_op_key_by(job, "k2", s, event_key, 0, &k2), 0);
  struct {
    sl_window_join_config c;
    const char *text;
  } windows[] = {
      {{.type = SL_WINDOW_SESSION, .size = 10, .join = window_join_fn},
       "SL_WINDOW_TUMBLING or SL_WINDOW_SLIDING"},
      {{.type = SL_WINDOW_COUNT, .size = 10, .join = window_join_fn},
       "not supported"},
      {{.type = SL_WINDOW_TUMBLING, .domain = SL_PROCESSING_TIME, .size = 10,
        .join = window_join_fn},
       "domain"},
      {{.type = SL_WINDOW_TUMBLING, .size = 0, .join = window_join_fn},
       "size"},
      {{.type = SL_WINDOW_SLIDING, .size = 10, .slide = 20,
        .join = window_join_fn},
       "slide"},
      {{.type = SL_WINDOW_TUMBLING, .size = 10, .allowed_lateness = -1,
        .join = window_join_fn},
       "allowed_lateness"},
      {{.type = SL_WINDOW_TUMBLING, .size = 10}, "join function"},
      {{.type = SL_WINDOW_TUMBLING, .size = 10, .right_late_port = 8,
        .join = window_join_fn},
       "right_late_port"},
  };
  for (size_t i = 0; i < sizeof windows / sizeof windows[0]; i++) {
    cr_assert_eq(sl_op_window_join(job, "wj", k, k2, 1, &windows[i].c, &j),
                 EINVAL, "window case %zu", i);
    cr_assert(strstr(sl_job_error(job), windows[i].text),
              "window case %zu: '%s'", i, sl_job_error(job));
    cr_assert(strstr(sl_job_error(job), "window join 'wj'"), "%s",
              sl_job_error(job));
    cr_assert_null(j);
  }
  cr_assert_eq(sl_op_window_join(job, "wj", k, k2, 1, 0, &j), EINVAL);
  struct {
    sl_interval_join_config c;
    const char *text;
  } intervals[] = {
      {{.lower = 10, .upper = 5, .join = interval_join_fn},
       "lower bound 10 is above upper bound 5"},
      {{.lower = 0, .upper = 5}, "join function"},
      {{.lower = 0, .upper = 5, .bucket_width = -1, .join = interval_join_fn},
       "bucket_width"},
      {{.lower = 0, .upper = 5, .left_late_port = -1,
        .join = interval_join_fn},
       "left_late_port"},
  };
  for (size_t i = 0; i < sizeof intervals / sizeof intervals[0]; i++) {
    cr_assert_eq(sl_op_interval_join(job, "ij", k, k2, 1, &intervals[i].c,
                                     &j),
                 EINVAL, "interval case %zu", i);
    cr_assert(strstr(sl_job_error(job), intervals[i].text),
              "interval case %zu: '%s'", i, sl_job_error(job));
    cr_assert(strstr(sl_job_error(job), "interval join 'ij'"), "%s",
              sl_job_error(job));
  }
  cr_assert_eq(sl_op_join(job, "uj", k, k2, 1, 0, 0, &j), EINVAL);
  cr_assert(strstr(sl_job_error(job), "join function"), "%s",
            sl_job_error(job));
  /* Unkeyed inputs, on either side, for each join. */
  sl_window_join_config wok = {.type = SL_WINDOW_TUMBLING, .size = 10,
                               .join = window_join_fn};
  sl_interval_join_config iok = {.lower = -1, .upper = 1,
                                 .join = interval_join_fn};
  cr_assert_eq(sl_op_window_join(job, "wj", s, k2, 1, &wok, &j), SL_EGRAPH);
  cr_assert(strstr(sl_job_error(job), "left input 'src' is not keyed"), "%s",
            sl_job_error(job));
  cr_assert_eq(sl_op_interval_join(job, "ij", k, s, 1, &iok, &j), SL_EGRAPH);
  cr_assert(strstr(sl_job_error(job), "right input 'src' is not keyed"),
            "%s", sl_job_error(job));
  cr_assert_eq(sl_op_join(job, "uj", s, s, 1, unbounded_join_fn, 0, &j),
               SL_EGRAPH);
  cr_assert(strstr(sl_job_error(job), "join 'uj'"), "%s", sl_job_error(job));
  cr_assert(strstr(sl_job_error(job), "not keyed"), "%s", sl_job_error(job));
  cr_assert_eq(sl_op_join(job, "uj", k, 0, 1, unbounded_join_fn, 0, &j),
               SL_EGRAPH);
  cr_assert(strstr(sl_job_error(job), "right input is NULL"), "%s",
            sl_job_error(job));
  /* A refused join left the graph as it was: the same name still builds. */
  cr_assert_eq(sl_op_window_join(job, "wj", k, k2, 1, &wok, &j), 0, "%s",
               sl_job_error(job));
  cr_assert_not_null(j);
  sl_job_destroy(job);
}

/* ----------------------------------------------------------- boundaries */

/* Records exactly at the watermark and at the bounds, where an off-by-one
 * in the late rule or in the cleanup would lose a pair.  Bounds [-10, 10],
 * so a left a is kept while watermark <= a.ts + 10 and a right b while
 * watermark <= b.ts + 10.  Fillers (key 6, left only) set each batch's
 * maximum: W0 = 261 - 51 = 210 after batch 0, W1 = 281 - 51 = 230 after
 * batch 1.
 *   key 1: lefts 199 and 200 in batch 0.  W0 = 210 fires the cleanup timer
 *          of 199 (at 210), which must not drop 200 (kept while watermark
 *          <= 210).  Batch 1: right 210 (= W0, not late) joins 200;
 *          right 209 is late.
 *   key 2: rights 219 and 220 in batch 1.  W1 = 230 fires 219's cleanup
 *          (at 230), which must not drop 220.  Batch 2: left 230 (= W1,
 *          not late) joins 220 (220 - 230 = -10 = lower); left 229 is
 *          late. */
Test(interval_join, boundaries_at_the_watermark) {
  side_event m[3 * BATCH];
  uint64_t n = 0;
  for (int batch = 0; batch < 3; batch++)
    for (int i = 0; i < BATCH; i++, n++)
      m[n] = (side_event){.key = 6, .value = n + 1, .tag = LEFT,
                          .ts = 200 + batch * 40 + i % 40};
  m[10].ts = 261;
  m[BATCH + 10].ts = 281;
  m[2 * BATCH + 10].ts = 290;
  m[0] = (side_event){.key = 1, .value = 1, .tag = LEFT, .ts = 199};
  m[1] = (side_event){.key = 1, .value = 2, .tag = LEFT, .ts = 200};
  m[BATCH] = (side_event){.key = 1, .value = BATCH + 1, .tag = RIGHT,
                          .ts = 210};
  m[BATCH + 1] = (side_event){.key = 1, .value = BATCH + 2, .tag = RIGHT,
                              .ts = 209};
  m[BATCH + 2] = (side_event){.key = 2, .value = BATCH + 3, .tag = RIGHT,
                              .ts = 219};
  m[BATCH + 3] = (side_event){.key = 2, .value = BATCH + 4, .tag = RIGHT,
                              .ts = 220};
  m[2 * BATCH] = (side_event){.key = 2, .value = 2 * BATCH + 1, .tag = LEFT,
                              .ts = 230};
  m[2 * BATCH + 1] = (side_event){.key = 2, .value = 2 * BATCH + 2,
                                  .tag = LEFT, .ts = 229};
  ref_input in = ref_one_source(m, n);
  ref_out want = ref_interval(&in, -10, 10);
  /* The reference holds exactly the two boundary pairs, and two late. */
  cr_assert_eq(want.count, 2);
  cr_assert_eq(want.items[0].left, 2);
  cr_assert_eq(want.items[0].right, BATCH + 1);
  cr_assert_eq(want.items[1].left, 2 * BATCH + 1);
  cr_assert_eq(want.items[1].right, BATCH + 4);
  cr_assert_eq(want.late, 2);
  for (int p = 1; p <= 4; p *= 4) {
    run_spec spec = {.type = INTERVAL, .merged = m, .n_merged = n,
                     .parallelism = p};
    spec.interval = (sl_interval_join_config){.lower = -10, .upper = 10,
                                              .bucket_width = 4,
                                              .join = interval_join_fn};
    spec.interval.user = &spec.interval;
    uint64_t n_got;
    pair_out *got = run_join(&spec, &n_got);
    cr_assert_eq(spec.status, 0, "%s", spec.error);
    expect_same(got, n_got, want.items, want.count, "boundaries");
    cr_assert_eq(spec.late_counted, 2);
    free(got);
  }
  free(want.items);
  ref_free(&in);
}

/* Timestamps at the ends of the int64 range: the interval join's bounds
 * and cleanup times saturate instead of overflowing (cleanups past
 * INT64_MAX run at the final SL_WATERMARK_MAX, which empties the state);
 * a window join refuses windows it cannot represent, naming the
 * timestamp. */
Test(join_errors, timestamps_at_the_int64_limits) {
  side_event l[2] = {{.key = 3, .value = 1, .tag = LEFT, .ts = INT64_MIN + 1},
                     {.key = 3, .value = 2, .tag = LEFT, .ts = INT64_MAX - 3}};
  side_event r[2] = {
      {.key = 3, .value = 11, .tag = RIGHT, .ts = INT64_MIN + 5},
      {.key = 3, .value = 12, .tag = RIGHT, .ts = INT64_MAX - 1}};
  run_spec spec = {.type = INTERVAL, .left = l, .right = r, .n_left = 2,
                   .n_right = 2, .no_watermarks = 1, .parallelism = 1};
  /* interval_join_fn's bound check (a->ts + lower) would overflow on
   * these timestamps; unbounded_join_fn checks key and sides only. */
  spec.interval = (sl_interval_join_config){.lower = -10, .upper = 10,
                                            .join = unbounded_join_fn};
  uint64_t n;
  pair_out *got = run_join(&spec, &n);
  cr_assert_eq(spec.status, 0, "%s", spec.error);
  cr_assert_eq(n, 2);
  cr_assert_eq(got[0].left, 1);
  cr_assert_eq(got[0].right, 11);
  cr_assert_eq(got[0].stamp, INT64_MIN + 5);
  cr_assert_eq(got[1].left, 2);
  cr_assert_eq(got[1].right, 12);
  cr_assert_eq(got[1].stamp, INT64_MAX - 1);
  cr_assert_eq(spec.state_entries, 0, "%" PRIu64 " entries left",
               spec.state_entries);
  free(got);
  spec.type = WINDOWED;
  spec.window = (sl_window_join_config){.type = SL_WINDOW_TUMBLING,
                                        .size = 100, .join = window_join_fn};
  free(run_join(&spec, &n));
  cr_assert(spec.status == EOVERFLOW, "%d",
            spec.status);
  cr_assert(strstr(spec.error, "too close to the int64 limits"), "%s",
            spec.error);
}
