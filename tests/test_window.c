/* test_window.c — windows of every kind and keyed timers against naive
 * references, at parallelism 1 and 4, and across a failure and restore in
 * the middle of open windows and pending timers.
 *
 * The input is generated here: events {key, value, ts} in a fixed order,
 * most within the out-of-orderness bound B of the running maximum, some
 * late by more than B.  The source emits BATCH events per next() call and
 * the job generates a watermark after every call (every_call), so the
 * watermark a record meets is max(ts of earlier batches) - B - 1, whatever
 * the timing: the references compute it the same way and model nothing
 * else of the engine.
 *
 * The sink collects results per instance in memory, and its snapshot
 * saves how many it holds; a restore truncates back to that count.  So
 * after failovers the collected results are those of the committed run,
 * as an exactly-once sink's would be.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sluice.h"
#include "test_dirs.h"
#include "test_util.h"

#define BATCH 64
#define BOUND 50

typedef struct event {
  uint64_t key;
  uint64_t value;
  int64_t ts;
} event;

/* A window result as the sink receives it. */
typedef struct result {
  uint64_t key;
  int64_t start, end;
  uint64_t sum;
  uint64_t count;
} result;

static uint64_t rng_next(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 33;
}

/* n events of keys 0..keys-1: ts advances 3 per event; 30% jitter back
 * within BOUND, late_pct% moved back by BOUND+10 .. BOUND+200. */
static event *make_events(uint64_t n, uint64_t keys, int late_pct,
                          uint64_t seed) {
  event *e = malloc(sizeof *e * n);
  cr_assert(e);
  uint64_t s = seed;
  for (uint64_t i = 0; i < n; i++) {
    e[i].key = rng_next(&s) % keys;
    e[i].value = i + 1;
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

/* The watermark record i meets: from the batches before its own. */
static int64_t *watermark_before(const event *e, uint64_t n) {
  int64_t *wm = malloc(sizeof *wm * n);
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
  const event *events;
  uint64_t n;
  uint64_t pos;
  uint64_t delay_us; /* per batch: lets checkpoints complete mid-run */
  /* Nonzero: past this index, emit nothing until a checkpoint completed
   * (checkpoint_complete), so a fault later in the run always has a
   * checkpoint to restore, however slowly the machine runs. */
  uint64_t hold_at;
  bool completed;
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

static int src_next(sl_ctx *ctx, void *state) {
  source *s = state;
  if (s->hold_at && s->pos >= s->hold_at && !s->completed) {
    sl_test_sleep_us(200);
    return 0;
  }
  if (s->delay_us)
    sl_test_sleep_us(s->delay_us);
  for (int k = 0; k < BATCH && s->pos < s->n; k++, s->pos++) {
    const event *e = &s->events[s->pos];
    int rc = sl_emit_ts(ctx, e, sizeof *e, e->ts);
    if (rc)
      return rc;
  }
  /* With hold_at == n the end waits for the checkpoint as well. */
  return s->pos == s->n && (!s->hold_at || s->completed) ? SL_SOURCE_END
                                                         : 0;
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

static void src_complete(sl_ctx *ctx, void *state, uint64_t id) {
  (void)ctx;
  (void)id;
  ((source *)state)->completed = true;
}

static const sl_source_ops src_ops = {.open = src_open,
                                      .next = src_next,
                                      .close = src_close,
                                      .snapshot = src_snapshot,
                                      .restore = src_restore,
                                      .checkpoint_complete = src_complete};

static uint64_t event_key(void *user, const sl_record *in) {
  (void)user;
  return ((const event *)in->data)->key;
}

/* ----------------------------------------------------------- the sink */

/* sl_fixture_collector (fixtures.h): every result in memory, restored to
 * the committed run on failover. */
typedef sl_fixture_collector collector;

static int result_cmp(const void *a, const void *b) {
  const result *x = a, *y = b;
  if (x->key != y->key)
    return x->key < y->key ? -1 : 1;
  if (x->start != y->start)
    return x->start < y->start ? -1 : 1;
  if (x->end != y->end)
    return x->end < y->end ? -1 : 1;
  if (x->count != y->count)
    return x->count < y->count ? -1 : 1;
  if (x->sum != y->sum)
    return x->sum < y->sum ? -1 : 1;
  return 0;
}

/* All instances' results, sorted. */
static result *gather(collector *c, uint64_t *n) {
  result *all = sl_fixture_collector_gather(c, result_cmp, n);
  cr_assert(all);
  return all;
}

static void expect_same(const result *got, uint64_t n_got,
                        const result *want, uint64_t n_want,
                        const char *what) {
  cr_assert_gt(n_want, 0, "%s: the reference has no results", what);
  uint64_t n = n_got < n_want ? n_got : n_want;
  for (uint64_t i = 0; i < n; i++)
    cr_assert(result_cmp(&got[i], &want[i]) == 0,
              "%s: result %" PRIu64 " differs: got key %" PRIu64
              " [%" PRId64 ",%" PRId64 ") sum %" PRIu64 " count %" PRIu64
              ", want key %" PRIu64 " [%" PRId64 ",%" PRId64 ") sum %" PRIu64
              " count %" PRIu64,
              what, i, got[i].key, got[i].start, got[i].end, got[i].sum,
              got[i].count, want[i].key, want[i].start, want[i].end,
              want[i].sum, want[i].count);
  cr_assert_eq(n_got, n_want, "%s: %" PRIu64 " results, want %" PRIu64, what,
               n_got, n_want);
}

/* ----------------------------------------------------------- window fns */

typedef struct acc {
  uint64_t sum;
  uint64_t count;
} acc;

static void acc_init(void *user, void *a) {
  (void)user;
  memset(a, 0, sizeof(acc));
}
static void acc_add(void *user, void *a, const sl_record *in) {
  (void)user;
  acc *x = a;
  x->sum += ((const event *)in->data)->value;
  x->count++;
}
static void acc_merge(void *user, void *a, const void *other) {
  (void)user;
  acc *x = a;
  const acc *y = other;
  x->sum += y->sum;
  x->count += y->count;
}
static int acc_emit(void *user, sl_ctx *ctx, uint64_t key,
                    const sl_window *w, const void *a) {
  (void)user;
  const acc *x = a;
  result r = {.key = key, .start = w->start, .end = w->end, .sum = x->sum,
              .count = x->count};
  return sl_emit(ctx, &r, sizeof r);
}

/* The full-window variant: sums the records it is shown, and checks that
 * they are the window's own. */
static int full_process(void *user, sl_ctx *ctx, uint64_t key,
                        const sl_window *w, const sl_window_contents *c) {
  (void)user;
  result r = {.key = key, .start = w->start, .end = w->end};
  for (uint32_t i = 0; i < sl_window_count(c); i++) {
    sl_record rec;
    int rc = sl_window_record(c, i, &rec);
    if (rc)
      return rc < 0 ? rc : -rc;
    const event *e = rec.data;
    if (rec.size_bytes != sizeof *e || e->key != key || rec.timestamp != e->ts)
      return -EINVAL;
    r.sum += e->value;
    r.count++;
  }
  return sl_emit(ctx, &r, sizeof r);
}

/* ----------------------------------------------------------- running */

typedef struct run_spec {
  const event *events;
  uint64_t n;
  sl_window_config window;
  int parallelism;
  const char *faults;     /* NULL: none */
  const char *state_dir;  /* needed with faults */
  uint64_t late_side;     /* out: late records seen on the side output */
  uint64_t late_counted;  /* out: the operator's late_records */
  uint32_t restarts;      /* out */
  uint64_t restored_from; /* out: checkpoint the failover restored */
} run_spec;

static uint64_t late_seen_sum;
static int late_sink_process(sl_ctx *ctx, void *state, int input,
                             const sl_record *in) {
  (void)ctx;
  (void)state;
  (void)input;
  __atomic_fetch_add(&late_seen_sum, 1, __ATOMIC_RELAXED);
  return in->size_bytes == sizeof(event) ? 0 : -EINVAL;
}

static result *run_window(run_spec *spec, uint64_t *n_out) {
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
  /* The fault hits instance 0 of P at its n/(2P)-th record.  Keys need not
   * spread evenly, so instance 0 may get any share of the first records:
   * only before source index n/(2P) is the fault sure not to have fired.
   * A checkpoint completes before index n/(4P). */
  source src = {.events = spec->events, .n = spec->n,
                .delay_us = spec->state_dir ? 1000 : 0,
                .hold_at = spec->faults
                               ? spec->n / (4 * (uint64_t)spec->parallelism)
                               : 0};
  collector sink_data = {.record_bytes = sizeof(result)};
  sl_op *s, *k, *w, *out, *late = 0, *late_sink;
  cr_assert_eq(sl_op_source(job, "src", 1, &src_ops, &src, &s), 0);
  sl_watermark_config wm = {.out_of_orderness = BOUND, .every_call = 1};
  cr_assert_eq(sl_op_watermarks(s, &wm), 0);
  cr_assert_eq(sl_op_key_by(job, "by-key", s, event_key, 0, &k), 0);
  cr_assert_eq(sl_op_window(job, "win", k, spec->parallelism, &spec->window,
                            &w),
               0, "%s", sl_job_error(job));
  cr_assert_eq(sl_op_sink(job, "out", w, spec->parallelism,
                          &sl_fixture_collector_ops, &sink_data, &out),
               0);
  late_seen_sum = 0;
  if (spec->window.late_port) {
    static const sl_process_ops late_ops = {.process = late_sink_process};
    cr_assert_eq(sl_op_side_output(job, "late", w, spec->window.late_port,
                                   &late),
                 0, "%s", sl_job_error(job));
    cr_assert_eq(sl_op_sink(job, "late-out", late, 1, &late_ops, 0,
                            &late_sink),
                 0);
  }
  int rc = sl_job_run(job);
  cr_assert_eq(rc, 0, "job failed: %s", sl_job_error(job));
  sl_op_stats st;
  cr_assert_eq(sl_job_stats(job, 1, &st), 0);
  cr_assert_str_eq(st.name, "win");
  spec->late_counted = st.late_records;
  spec->late_side = late_seen_sum;
  spec->restarts = sl_job_restarts(job);
  sl_recovery_stats rs;
  spec->restored_from =
      sl_job_recovery_stats(job, 0, &rs) == 0 ? rs.restored_from : 0;
  sl_job_destroy(job);
  return gather(&sink_data, n_out);
}

/* ----------------------------------------------------------- references */

typedef struct ref_window {
  uint64_t key;
  int64_t start, end;
  uint64_t sum, count;
  bool fired;
  bool live;
} ref_window;

typedef struct ref_out {
  result *items;
  uint64_t count, capacity;
} ref_out;

static void ref_emit(ref_out *o, const ref_window *w) {
  if (w->count == 0)
    return;
  if (o->count == o->capacity) {
    o->capacity = o->capacity ? o->capacity * 2 : 256;
    o->items = realloc(o->items, sizeof(result) * o->capacity);
    cr_assert(o->items);
  }
  o->items[o->count++] = (result){.key = w->key, .start = w->start,
                                  .end = w->end, .sum = w->sum,
                                  .count = w->count};
}

static int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

/* Tumbling (slide == size) and sliding windows with allowed lateness L: a
 * linear list of every window ever opened, scanned at each batch boundary
 * (quadratic and obvious). */
static result *ref_time(const event *e, uint64_t n, int64_t size,
                        int64_t slide, int64_t lateness, uint64_t *n_out,
                        uint64_t *late_out) {
  int64_t *wm = watermark_before(e, n);
  ref_window *ws = 0;
  uint64_t nw = 0, cap = 0;
  ref_out out = {0};
  uint64_t late = 0;
  for (uint64_t i = 0; i <= n; i++) {
    int64_t w_now = i < n ? wm[i] : INT64_MAX;
    /* The watermark moved (at a batch boundary): fire and clean up. */
    for (uint64_t j = 0; j < nw; j++) {
      ref_window *x = &ws[j];
      if (!x->live)
        continue;
      if (!x->fired && x->end - 1 <= w_now) {
        ref_emit(&out, x);
        x->fired = true;
      }
      if (x->end - 1 + lateness <= w_now)
        x->live = false;
    }
    if (i == n)
      break;
    bool added = false;
    for (int64_t start = floor_div(e[i].ts, slide) * slide;
         start > e[i].ts - size; start -= slide) {
      int64_t end = start + size;
      if (wm[i] != SL_WATERMARK_MIN && end - 1 + lateness <= wm[i])
        continue;
      added = true;
      ref_window *x = 0;
      for (uint64_t j = 0; j < nw && !x; j++)
        if (ws[j].live && ws[j].key == e[i].key && ws[j].start == start)
          x = &ws[j];
      if (!x) {
        if (nw == cap) {
          cap = cap ? cap * 2 : 1024;
          ws = realloc(ws, sizeof *ws * cap);
          cr_assert(ws);
        }
        x = &ws[nw++];
        *x = (ref_window){.key = e[i].key, .start = start, .end = end,
                          .live = true};
      }
      x->sum += e[i].value;
      x->count++;
      if (x->fired) {
        ref_emit(&out, x); /* a late firing */
      } else if (wm[i] != SL_WATERMARK_MIN && x->end - 1 <= wm[i]) {
        ref_emit(&out, x); /* opened behind the watermark: fires at once */
        x->fired = true;
      }
    }
    late += !added;
  }
  free(ws);
  free(wm);
  qsort(out.items, out.count, sizeof(result), result_cmp);
  *n_out = out.count;
  *late_out = late;
  return out.items;
}

/* Sessions, lateness 0: open sessions per key merged on arrival; at each
 * batch boundary, the ones the watermark passed are emitted and gone. */
static result *ref_session(const event *e, uint64_t n, int64_t gap,
                           uint64_t *n_out, uint64_t *late_out) {
  int64_t *wm = watermark_before(e, n);
  ref_window *open = 0;
  uint64_t no = 0, cap = 0;
  ref_out out = {0};
  uint64_t late = 0;
  for (uint64_t i = 0; i <= n; i++) {
    int64_t w_now = i < n ? wm[i] : INT64_MAX;
    uint64_t keep = 0;
    for (uint64_t j = 0; j < no; j++) {
      if (open[j].end - 1 <= w_now)
        ref_emit(&out, &open[j]);
      else
        open[keep++] = open[j];
    }
    no = keep;
    if (i == n)
      break;
    ref_window m = {.key = e[i].key, .start = e[i].ts, .end = e[i].ts + gap,
                    .sum = e[i].value, .count = 1};
    /* Late: the session it would end up in is behind the watermark. */
    int64_t lo = m.start, hi = m.end;
    for (bool grew = true; grew;) {
      grew = false;
      for (uint64_t j = 0; j < no; j++)
        if (open[j].key == m.key && open[j].start < hi && lo < open[j].end &&
            (open[j].start < lo || open[j].end > hi)) {
          lo = open[j].start < lo ? open[j].start : lo;
          hi = open[j].end > hi ? open[j].end : hi;
          grew = true;
        }
    }
    if (wm[i] != SL_WATERMARK_MIN && hi - 1 <= wm[i]) {
      late++;
      continue;
    }
    /* Merge until nothing overlaps any more. */
    bool merged = true;
    while (merged) {
      merged = false;
      for (uint64_t j = 0; j < no; j++) {
        if (open[j].key == m.key && open[j].start < m.end &&
            m.start < open[j].end) {
          m.start = open[j].start < m.start ? open[j].start : m.start;
          m.end = open[j].end > m.end ? open[j].end : m.end;
          m.sum += open[j].sum;
          m.count += open[j].count;
          open[j] = open[--no];
          merged = true;
          break;
        }
      }
    }
    if (no == cap) {
      cap = cap ? cap * 2 : 1024;
      open = realloc(open, sizeof *open * cap);
      cr_assert(open);
    }
    open[no++] = m;
  }
  free(open);
  free(wm);
  qsort(out.items, out.count, sizeof(result), result_cmp);
  *n_out = out.count;
  *late_out = late;
  return out.items;
}

/* Count windows: every `size` records of a key, in arrival order. */
static result *ref_count(const event *e, uint64_t n, uint64_t keys,
                         uint64_t size, uint64_t *n_out) {
  ref_window *per = calloc(keys, sizeof *per);
  uint64_t *seen = calloc(keys, sizeof *seen);
  cr_assert(per && seen);
  ref_out out = {0};
  for (uint64_t i = 0; i < n; i++) {
    uint64_t k = e[i].key;
    per[k].key = k;
    per[k].sum += e[i].value;
    per[k].count++;
    seen[k]++;
    if (per[k].count == size) {
      per[k].start = (int64_t)(seen[k] - size);
      per[k].end = (int64_t)seen[k];
      ref_emit(&out, &per[k]);
      per[k].sum = per[k].count = 0;
    }
  }
  free(per);
  free(seen);
  qsort(out.items, out.count, sizeof(result), result_cmp);
  *n_out = out.count;
  return out.items;
}

/* ----------------------------------------------------------- tests */

/* Run spec's window at parallelism 1 and 4, plain and with a failure in
 * the middle (faults on the window and on the sink), and compare each run
 * with the reference. */
static void check_all(run_spec base, const result *want, uint64_t n_want,
                      uint64_t late_want, const char *what) {
  const int ps[] = {1, 4};
  for (int pi = 0; pi < 2; pi++) {
    for (int failing = 0; failing < 2; failing++) {
      run_spec spec = base;
      spec.parallelism = ps[pi];
      char *dir = 0;
      char faults[128];
      if (failing) {
        dir = sl_test_temp_dir("win");
        spec.state_dir = dir;
        snprintf(faults, sizeof faults, "fail:op=win,instance=0,record=%" PRIu64,
                 base.n / (2 * (uint64_t)ps[pi]));
        spec.faults = faults;
      }
      uint64_t n_got;
      result *got = run_window(&spec, &n_got);
      char label[160];
      snprintf(label, sizeof label, "%s, parallelism %d%s", what, ps[pi],
               failing ? ", failure mid-run" : "");
      expect_same(got, n_got, want, n_want, label);
      if (failing) {
        cr_assert_eq(spec.restarts, 1, "%s: %u restarts", label,
                     spec.restarts);
        cr_assert_gt(spec.restored_from, 0,
                     "%s: the failover restored no checkpoint", label);
      }
      if (base.window.type != SL_WINDOW_COUNT && !failing) {
        /* After a failure a replayed late record is counted again. */
        cr_assert_eq(spec.late_counted, late_want,
                     "%s: %" PRIu64 " late, reference %" PRIu64, label,
                     spec.late_counted, late_want);
        if (base.window.late_port)
          cr_assert_eq(spec.late_side, late_want, "%s: side output %" PRIu64,
                       label, spec.late_side);
      }
      free(got);
      if (dir)
        sl_test_remove_tree(dir);
    }
  }
}

#define EVENTS 6000
#define KEYS 13

Test(window, tumbling_incremental_and_full) {
  event *e = make_events(EVENTS, KEYS, 5, 1);
  uint64_t n_want, late_want;
  result *want = ref_time(e, EVENTS, 100, 100, 0, &n_want, &late_want);
  cr_assert_gt(late_want, 0, "the data has late records");
  run_spec spec = {.events = e, .n = EVENTS};
  spec.window = (sl_window_config){.type = SL_WINDOW_TUMBLING, .size = 100,
                                   .acc_bytes = sizeof(acc),
                                   .init = acc_init, .add = acc_add,
                                   .emit = acc_emit};
  check_all(spec, want, n_want, late_want, "tumbling, incremental");
  spec.window = (sl_window_config){.type = SL_WINDOW_TUMBLING, .size = 100,
                                   .process = full_process, .late_port = 1};
  check_all(spec, want, n_want, late_want, "tumbling, full window");
  free(want);
  free(e);
}

Test(window, sliding) {
  event *e = make_events(EVENTS, KEYS, 5, 2);
  uint64_t n_want, late_want;
  result *want = ref_time(e, EVENTS, 120, 40, 0, &n_want, &late_want);
  run_spec spec = {.events = e, .n = EVENTS};
  spec.window = (sl_window_config){.type = SL_WINDOW_SLIDING, .size = 120,
                                   .slide = 40, .acc_bytes = sizeof(acc),
                                   .init = acc_init, .add = acc_add,
                                   .emit = acc_emit};
  check_all(spec, want, n_want, late_want, "sliding, incremental");
  free(want);
  free(e);
}

Test(window, allowed_lateness_fires_again) {
  event *e = make_events(EVENTS, KEYS, 8, 3);
  uint64_t n_want, late_want, n_plain, late_plain;
  result *want = ref_time(e, EVENTS, 100, 100, 120, &n_want, &late_want);
  result *plain = ref_time(e, EVENTS, 100, 100, 0, &n_plain, &late_plain);
  cr_assert_gt(n_want, n_plain, "late firings happen in this data");
  cr_assert_lt(late_want, late_plain);
  free(plain);
  run_spec spec = {.events = e, .n = EVENTS};
  spec.window = (sl_window_config){.type = SL_WINDOW_TUMBLING, .size = 100,
                                   .allowed_lateness = 120, .late_port = 2,
                                   .process = full_process};
  check_all(spec, want, n_want, late_want, "tumbling, allowed lateness");
  free(want);
  free(e);
}

Test(window, session_incremental_and_full) {
  /* Sparse keys so sessions end: 40 keys, gap 60 with ts +3 per event. */
  event *e = make_events(EVENTS, 40, 5, 4);
  uint64_t n_want, late_want;
  result *want = ref_session(e, EVENTS, 60, &n_want, &late_want);
  run_spec spec = {.events = e, .n = EVENTS};
  spec.window = (sl_window_config){.type = SL_WINDOW_SESSION, .gap = 60,
                                   .acc_bytes = sizeof(acc),
                                   .init = acc_init, .add = acc_add,
                                   .merge = acc_merge, .emit = acc_emit};
  check_all(spec, want, n_want, late_want, "session, incremental");
  spec.window = (sl_window_config){.type = SL_WINDOW_SESSION, .gap = 60,
                                   .process = full_process};
  check_all(spec, want, n_want, late_want, "session, full window");
  free(want);
  free(e);
}

Test(window, count) {
  event *e = make_events(EVENTS, KEYS, 5, 5);
  uint64_t n_want;
  result *want = ref_count(e, EVENTS, KEYS, 37, &n_want);
  run_spec spec = {.events = e, .n = EVENTS};
  spec.window = (sl_window_config){.type = SL_WINDOW_COUNT, .size = 37,
                                   .acc_bytes = sizeof(acc),
                                   .init = acc_init, .add = acc_add,
                                   .emit = acc_emit};
  check_all(spec, want, n_want, 0, "count, incremental");
  spec.window = (sl_window_config){.type = SL_WINDOW_COUNT, .size = 37,
                                   .process = full_process};
  check_all(spec, want, n_want, 0, "count, full window");
  free(want);
  free(e);
}

Test(window, config_errors_name_the_field) {
  sl_job *job;
  cr_assert_eq(sl_job_create(0, &job), 0);
  source src = {0};
  sl_op *s, *k, *w;
  cr_assert_eq(sl_op_source(job, "src", 1, &src_ops, &src, &s), 0);
  cr_assert_eq(sl_op_key_by(job, "k", s, event_key, 0, &k), 0);
  struct {
    sl_window_config c;
    const char *text;
  } cases[] = {
      {{.type = SL_WINDOW_TUMBLING, .size = 0, .process = full_process},
       "size"},
      {{.type = SL_WINDOW_SLIDING, .size = 10, .slide = 20,
        .process = full_process},
       "slide"},
      {{.type = SL_WINDOW_SESSION, .gap = 0, .process = full_process}, "gap"},
      {{.type = SL_WINDOW_SESSION, .gap = 5, .acc_bytes = 16,
        .init = acc_init, .add = acc_add, .emit = acc_emit},
       "merge"},
      {{.type = SL_WINDOW_TUMBLING, .size = 10}, "no window function"},
      {{.type = SL_WINDOW_COUNT, .size = 10, .allowed_lateness = 5,
        .process = full_process},
       "allowed_lateness"},
      {{.type = SL_WINDOW_TUMBLING, .size = 10, .process = full_process,
        .acc_bytes = 8},
       "not both"},
      {{.type = 9, .size = 10, .process = full_process}, "type"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    cr_assert_eq(sl_op_window(job, "w", k, 1, &cases[i].c, &w), EINVAL,
                 "case %zu", i);
    cr_assert(strstr(sl_job_error(job), cases[i].text), "case %zu: '%s'", i,
              sl_job_error(job));
  }
  sl_window_config ok = {.type = SL_WINDOW_TUMBLING, .size = 10,
                         .process = full_process};
  cr_assert_eq(sl_op_window(job, "w", s, 1, &ok, &w), SL_EGRAPH);
  cr_assert(strstr(sl_job_error(job), "not keyed"), "%s", sl_job_error(job));
  sl_job_destroy(job);
}

/* ----------------------------------------------------------- timers */

/* A keyed process function: on each record it registers an event-time
 * timer at ts + 100 and, for every third record, deletes the timer of the
 * record before it (if the same key); on a timer it emits {key, time}.
 * The reference does the same in a loop. */
typedef struct timer_out {
  uint64_t key;
  int64_t time;
} timer_out;

static int tp_process(sl_ctx *ctx, void *state, int input,
                      const sl_record *in) {
  (void)state;
  (void)input;
  const event *e = in->data;
  int rc = sl_timer_register(ctx, SL_EVENT_TIME, e->ts + 100);
  if (rc)
    return -EINVAL;
  if (e->value % 3 == 0) {
    const void *v;
    uint32_t bytes;
    if (sl_state_get(ctx, 1, &v, &bytes) == 0) {
      int64_t prev;
      memcpy(&prev, v, 8);
      rc = sl_timer_delete(ctx, SL_EVENT_TIME, prev + 100);
      if (rc && rc != SL_ENOTFOUND)
        return -EINVAL;
    }
  }
  return sl_state_put(ctx, 1, &e->ts, 8, 0) ? -ENOMEM : 0;
}

static int tp_timer(sl_ctx *ctx, void *state, int domain, int64_t time) {
  (void)state;
  uint64_t key;
  if (domain != SL_EVENT_TIME || sl_ctx_key(ctx, &key) != 0)
    return -EINVAL;
  if (sl_ctx_watermark(ctx) < time)
    return -EINVAL; /* fired early */
  result r = {.key = key, .start = time, .end = time + 1, .count = 1};
  return sl_emit(ctx, &r, sizeof r);
}

static result *run_timers(const event *e, uint64_t n, int parallelism,
                          const char *state_dir, const char *faults,
                          uint64_t *n_out) {
  sl_job_config config = SL_JOB_CONFIG_INIT;
  if (state_dir) {
    config.checkpoint.state_dir = state_dir;
    config.checkpoint.interval_ms = 5;
    config.checkpoint.no_sync = 1;
    config.checkpoint.store_policy = SL_STORE_FRESH;
    config.restart = sl_restart_defaults(SL_RESTART_FIXED_DELAY);
    config.restart.attempts = 5;
    config.restart.delay_ms = 0;
  }
  config.faults = faults;
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  /* The fault hits instance 0 at its 1000th record: a checkpoint completes
   * before source index 500. */
  source src = {.events = e, .n = n, .delay_us = state_dir ? 1000 : 0,
                .hold_at = faults ? 500 : 0};
  collector sink_data = {.record_bytes = sizeof(result)};
  sl_op *s, *k, *p, *out;
  cr_assert_eq(sl_op_source(job, "src", 1, &src_ops, &src, &s), 0);
  sl_watermark_config wm = {.out_of_orderness = BOUND, .every_call = 1};
  cr_assert_eq(sl_op_watermarks(s, &wm), 0);
  cr_assert_eq(sl_op_key_by(job, "by-key", s, event_key, 0, &k), 0);
  sl_process_ops ops = {.process = tp_process, .on_timer = tp_timer};
  cr_assert_eq(sl_op_process(job, "win", &k, 1, parallelism, &ops, 0, &p), 0);
  cr_assert_eq(sl_op_sink(job, "out", p, parallelism, &sl_fixture_collector_ops,
                          &sink_data, &out),
               0);
  int rc = sl_job_run(job);
  cr_assert_eq(rc, 0, "job failed: %s", sl_job_error(job));
  if (faults) {
    cr_assert_eq(sl_job_restarts(job), 1);
    sl_recovery_stats rs;
    cr_assert_eq(sl_job_recovery_stats(job, 0, &rs), 0);
    cr_assert_gt(rs.restored_from, 0, "no checkpoint was restored");
  }
  sl_job_destroy(job);
  return gather(&sink_data, n_out);
}

Test(timers, fire_in_order_delete_and_survive_restore) {
  event *e = make_events(EVENTS, KEYS, 0, 6);
  /* Reference: per key, the set of registered times minus deleted. */
  result *want = malloc(sizeof *want * EVENTS);
  uint64_t n_want = 0;
  int64_t *last = malloc(sizeof *last * KEYS);
  for (int k = 0; k < KEYS; k++)
    last[k] = INT64_MIN;
  /* Times registered per key, as a list; deletions remove one. */
  typedef struct reg {
    uint64_t key;
    int64_t time;
    bool live;
  } reg;
  reg *regs = calloc(EVENTS, sizeof *regs);
  uint64_t nr = 0;
  int64_t *wm = watermark_before(e, EVENTS);
  for (uint64_t i = 0; i < EVENTS; i++) {
    uint64_t key = e[i].key;
    bool dup = false;
    for (uint64_t j = 0; j < nr; j++)
      if (regs[j].live && regs[j].key == key &&
          regs[j].time == e[i].ts + 100)
        dup = true;
    if (!dup)
      regs[nr++] = (reg){.key = key, .time = e[i].ts + 100, .live = true};
    /* A delete only finds a timer that has not fired yet. */
    if (e[i].value % 3 == 0 && last[key] != INT64_MIN &&
        last[key] + 100 > wm[i])
      for (uint64_t j = 0; j < nr; j++)
        if (regs[j].live && regs[j].key == key &&
            regs[j].time == last[key] + 100)
          regs[j].live = false;
    last[key] = e[i].ts;
  }
  /* Without late data (late_pct 0), no timer is behind the watermark when
   * registered, so every live registration fires exactly once. */
  for (uint64_t j = 0; j < nr; j++)
    if (regs[j].live)
      want[n_want++] = (result){.key = regs[j].key, .start = regs[j].time,
                                .end = regs[j].time + 1, .count = 1};
  qsort(want, n_want, sizeof *want, result_cmp);
  const int ps[] = {1, 4};
  for (int pi = 0; pi < 2; pi++) {
    uint64_t n_got;
    result *got = run_timers(e, EVENTS, ps[pi], 0, 0, &n_got);
    expect_same(got, n_got, want, n_want, "timers");
    free(got);
    char *dir = sl_test_temp_dir("win");
    got = run_timers(e, EVENTS, ps[pi], dir, "fail:op=win,instance=0,record=1000",
                     &n_got);
    expect_same(got, n_got, want, n_want, "timers after a failure");
    free(got);
    sl_test_remove_tree(dir);
  }
  free(regs);
  free(wm);
  free(last);
  free(want);
  free(e);
}

/* ----------------------------------------------------------- processing time */

/* One source emitting e[0..n) slowly (3 ms a batch) -> key_by -> the
 * window c at parallelism 2 -> one collecting sink; its results, sorted. */
static result *run_processing_time(event *e, uint64_t n,
                                   const sl_window_config *c, uint64_t *n_got) {
  sl_job *job;
  cr_assert_eq(sl_job_create(0, &job), 0);
  source src = {.events = e, .n = n, .delay_us = 3000};
  collector sink_data = {.record_bytes = sizeof(result)};
  sl_op *s, *k, *w, *out;
  cr_assert_eq(sl_op_source(job, "src", 1, &src_ops, &src, &s), 0);
  cr_assert_eq(sl_op_key_by(job, "by-key", s, event_key, 0, &k), 0);
  cr_assert_eq(sl_op_window(job, "win", k, 2, c, &w), 0, "%s",
               sl_job_error(job));
  cr_assert_eq(
      sl_op_sink(job, "out", w, 1, &sl_fixture_collector_ops, &sink_data, &out),
      0);
  cr_assert_eq(sl_job_run(job), 0, "%s", sl_job_error(job));
  sl_job_destroy(job);
  return gather(&sink_data, n_got);
}

/* A processing-time tumbling window of 20 ms over a source that emits for
 * about 200 ms: several windows fire by the clock, and together they hold
 * every record exactly once (the last ones fire at the end of input). */
Test(window, processing_time_tumbling) {
  const uint64_t n = 4000;
  event *e = make_events(n, KEYS, 0, 7);
  sl_window_config c = {.type = SL_WINDOW_TUMBLING,
                        .domain = SL_PROCESSING_TIME,
                        .size = 20,
                        .acc_bytes = sizeof(acc),
                        .init = acc_init,
                        .add = acc_add,
                        .emit = acc_emit};
  uint64_t n_got;
  result *got = run_processing_time(e, n, &c, &n_got);
  uint64_t records = 0, sum = 0, expect_sum = 0;
  int64_t first_start = INT64_MAX, last_start = INT64_MIN;
  for (uint64_t i = 0; i < n_got; i++) {
    if (i > 0)
      cr_assert(got[i].key != got[i - 1].key ||
                    got[i].start != got[i - 1].start,
                "window [%" PRId64 ", +20) of key %" PRIu64 " fired twice",
                got[i].start, got[i].key);
    records += got[i].count;
    sum += got[i].sum;
    cr_assert_eq(got[i].end - got[i].start, 20);
    cr_assert_eq(got[i].start % 20, 0, "aligned to the epoch");
    first_start = got[i].start < first_start ? got[i].start : first_start;
    last_start = got[i].start > last_start ? got[i].start : last_start;
  }
  for (uint64_t i = 0; i < n; i++)
    expect_sum += e[i].value;
  cr_assert_eq(records, n);
  cr_assert_eq(sum, expect_sum);
  cr_assert_geq(last_start - first_start, 60,
                "windows over several periods (%" PRId64 " ms)",
                last_start - first_start);
  free(got);
  free(e);
}

/* ----------------------------------------------------------- sessions,
 * lazily re-armed timers (window.c note 6) */

/* Sessions with allowed lateness L: at each batch boundary the open
 * sessions the watermark passed fire (once), and are gone once end - 1 + L
 * is passed too; a record merged into a fired session makes it fire again
 * at once if the merged session is still behind the watermark, else it
 * waits for its new end - 1. */
static result *ref_session_lateness(const event *e, uint64_t n, int64_t gap,
                                    int64_t lateness, uint64_t *n_out,
                                    uint64_t *late_out) {
  int64_t *wm = watermark_before(e, n);
  ref_window *open = 0;
  uint64_t no = 0, cap = 0, late = 0;
  ref_out out = {0};
  for (uint64_t i = 0; i <= n; i++) {
    int64_t w_now = i < n ? wm[i] : INT64_MAX;
    uint64_t keep = 0;
    for (uint64_t j = 0; j < no; j++) {
      if (!open[j].fired && w_now != SL_WATERMARK_MIN &&
          open[j].end - 1 <= w_now) {
        ref_emit(&out, &open[j]);
        open[j].fired = true;
      }
      if (w_now == INT64_MAX ||
          (w_now != SL_WATERMARK_MIN && open[j].end - 1 + lateness <= w_now))
        continue; /* cleaned up */
      open[keep++] = open[j];
    }
    no = keep;
    if (i == n)
      break;
    ref_window m = {.key = e[i].key, .start = e[i].ts, .end = e[i].ts + gap,
                    .sum = e[i].value, .count = 1};
    bool merged = true;
    ref_window probe = m;
    while (merged) { /* the session the record would end up in */
      merged = false;
      for (uint64_t j = 0; j < no; j++)
        if (open[j].key == probe.key && open[j].start < probe.end &&
            probe.start < open[j].end &&
            (open[j].start < probe.start || open[j].end > probe.end)) {
          probe.start = open[j].start < probe.start ? open[j].start
                                                    : probe.start;
          probe.end = open[j].end > probe.end ? open[j].end : probe.end;
          merged = true;
        }
    }
    if (wm[i] != SL_WATERMARK_MIN && probe.end - 1 + lateness <= wm[i]) {
      late++;
      continue;
    }
    for (merged = true; merged;) {
      merged = false;
      for (uint64_t j = 0; j < no; j++) {
        if (open[j].key == m.key && open[j].start < m.end &&
            m.start < open[j].end) {
          m.start = open[j].start < m.start ? open[j].start : m.start;
          m.end = open[j].end > m.end ? open[j].end : m.end;
          m.sum += open[j].sum;
          m.count += open[j].count;
          open[j] = open[--no];
          merged = true;
          break;
        }
      }
    }
    if (wm[i] != SL_WATERMARK_MIN && m.end - 1 <= wm[i]) {
      ref_emit(&out, &m); /* due already: fires (again) at once */
      m.fired = true;
    }
    if (no == cap) {
      cap = cap ? cap * 2 : 1024;
      open = realloc(open, sizeof *open * cap);
      cr_assert(open);
    }
    open[no++] = m;
  }
  free(open);
  free(wm);
  qsort(out.items, out.count, sizeof(result), result_cmp);
  *n_out = out.count;
  *late_out = late;
  return out.items;
}

Test(window, session_allowed_lateness_fires_again) {
  event *e = make_events(EVENTS, 40, 10, 8);
  uint64_t n_want, late_want, n_plain, late_plain;
  result *want = ref_session_lateness(e, EVENTS, 60, 90, &n_want, &late_want);
  result *plain = ref_session(e, EVENTS, 60, &n_plain, &late_plain);
  cr_assert_gt(n_want, n_plain, "late firings happen in this data");
  cr_assert_lt(late_want, late_plain);
  free(plain);
  plain = ref_session_lateness(e, EVENTS, 60, 0, &n_plain, &late_plain);
  uint64_t n_ref, late_ref;
  result *ref = ref_session(e, EVENTS, 60, &n_ref, &late_ref);
  expect_same(plain, n_plain, ref, n_ref, "the two references at L = 0");
  cr_assert_eq(late_plain, late_ref);
  free(ref);
  free(plain);
  run_spec spec = {.events = e, .n = EVENTS};
  spec.window = (sl_window_config){.type = SL_WINDOW_SESSION, .gap = 60,
                                   .allowed_lateness = 90,
                                   .acc_bytes = sizeof(acc),
                                   .init = acc_init, .add = acc_add,
                                   .merge = acc_merge, .emit = acc_emit};
  check_all(spec, want, n_want, late_want, "session, allowed lateness");
  spec.window = (sl_window_config){.type = SL_WINDOW_SESSION, .gap = 60,
                                   .allowed_lateness = 90, .late_port = 1,
                                   .process = full_process};
  check_all(spec, want, n_want, late_want,
            "session, full window, allowed lateness");
  free(want);
  free(e);
}

/* Key 0 gets a record every 5 ms for the whole run, so its one session
 * outgrows its timer again and again while the watermark follows it; key 1
 * gets a record every 70 ms, a new session each time (gap 60).  Key 0's
 * session fires once, at the end of input, with every record of it. */
Test(window, session_extended_many_times_fires_once) {
  const uint64_t n = 3000;
  event *e = malloc(sizeof *e * n);
  cr_assert(e);
  uint64_t key0 = 0, sum0 = 0;
  for (uint64_t i = 0; i < n; i++) {
    bool first = i % 14 != 13;
    e[i] = (event){.key = first ? 0 : 1, .value = i + 1,
                   .ts = 1000 + (int64_t)i * 5 - (int64_t)(i % 7) * 4};
    if (first) {
      key0++;
      sum0 += i + 1;
    }
  }
  uint64_t n_want, late_want;
  result *want = ref_session(e, n, 60, &n_want, &late_want);
  cr_assert_eq(late_want, 0);
  cr_assert_eq(want[0].key, 0);
  cr_assert_eq(want[0].count, key0, "one session of key 0 holds all");
  cr_assert_eq(want[0].sum, sum0);
  cr_assert_eq(want[1].key, 1, "and key 0 has no other");
  cr_assert_gt(n_want, 100, "key 1 has many sessions");
  run_spec spec = {.events = e, .n = n};
  spec.window = (sl_window_config){.type = SL_WINDOW_SESSION, .gap = 60,
                                   .acc_bytes = sizeof(acc),
                                   .init = acc_init, .add = acc_add,
                                   .merge = acc_merge, .emit = acc_emit};
  check_all(spec, want, n_want, late_want, "session extended many times");
  spec.window.allowed_lateness = 40;
  check_all(spec, want, n_want, late_want,
            "session extended many times, allowed lateness");
  free(want);
  free(e);
}

/* Processing-time sessions keep one timer per session (window.c note 6):
 * sessions close by the clock, the rest at the end of input; each record
 * is in exactly one session, and a key's sessions do not overlap. */
Test(window, processing_time_session) {
  const uint64_t n = 3000;
  event *e = make_events(n, KEYS, 0, 9);
  sl_window_config c = {.type = SL_WINDOW_SESSION,
                        .domain = SL_PROCESSING_TIME,
                        .gap = 2,
                        .acc_bytes = sizeof(acc),
                        .init = acc_init,
                        .add = acc_add,
                        .merge = acc_merge,
                        .emit = acc_emit};
  uint64_t n_got;
  result *got = run_processing_time(e, n, &c, &n_got);
  uint64_t records = 0, sum = 0, expect_sum = 0;
  for (uint64_t i = 0; i < n_got; i++) {
    if (i > 0 && got[i].key == got[i - 1].key)
      cr_assert_geq(got[i].start, got[i - 1].end,
                    "sessions of key %" PRIu64 " overlap", got[i].key);
    cr_assert_geq(got[i].end - got[i].start, 2);
    records += got[i].count;
    sum += got[i].sum;
  }
  for (uint64_t i = 0; i < n; i++)
    expect_sum += e[i].value;
  cr_assert_eq(records, n, "every record in exactly one session");
  cr_assert_eq(sum, expect_sum);
  free(got);
  free(e);
}

/* ----------------------------------------------------------- timer heap
 * compaction (timer.c note 4) */

/* A timeout per key pushed back by each record: delete the pending
 * deadline (it must be there: the timer clears the state when it fires)
 * and register ts + TIMEOUT.  Thousands of deletes compact the heap many
 * times; a deadline fires only after its key went quiet. */
#define TIMEOUT 3000

static int to_process(sl_ctx *ctx, void *state, int input,
                      const sl_record *in) {
  (void)state;
  (void)input;
  const event *e = in->data;
  const void *v;
  uint32_t bytes;
  int rc = sl_state_get(ctx, 1, &v, &bytes);
  if (rc == 0) {
    int64_t pending;
    memcpy(&pending, v, 8);
    if (sl_timer_delete(ctx, SL_EVENT_TIME, pending) != 0)
      return -EINVAL; /* lost: it neither fired nor is pending */
  } else if (rc != SL_ENOTFOUND) {
    return -EINVAL;
  }
  int64_t deadline = e->ts + TIMEOUT;
  if (sl_timer_register(ctx, SL_EVENT_TIME, deadline) != 0)
    return -ENOMEM;
  return sl_state_put(ctx, 1, &deadline, 8, 0) ? -ENOMEM : 0;
}

static int to_timer(sl_ctx *ctx, void *state, int domain, int64_t time) {
  (void)state;
  uint64_t key;
  const void *v;
  uint32_t bytes;
  if (domain != SL_EVENT_TIME || sl_ctx_key(ctx, &key) != 0 ||
      sl_state_get(ctx, 1, &v, &bytes) != 0)
    return -EINVAL; /* a deleted timer fired */
  int64_t pending;
  memcpy(&pending, v, 8);
  if (pending != time || sl_state_delete(ctx, 1) != 0)
    return -EINVAL;
  result r = {.key = key, .start = time, .end = time + 1, .count = 1};
  return sl_emit(ctx, &r, sizeof r);
}

static result *run_timeouts(const event *e, uint64_t n, int parallelism,
                            const char *state_dir, uint64_t *n_out) {
  sl_job_config config = SL_JOB_CONFIG_INIT;
  char faults[96];
  if (state_dir) {
    config.checkpoint.state_dir = state_dir;
    config.checkpoint.interval_ms = 5;
    config.checkpoint.no_sync = 1;
    config.checkpoint.store_policy = SL_STORE_FRESH;
    config.restart = sl_restart_defaults(SL_RESTART_FIXED_DELAY);
    config.restart.attempts = 5;
    config.restart.delay_ms = 0;
    snprintf(faults, sizeof faults, "fail:op=to,instance=0,record=%" PRIu64,
             n / 2 / (uint64_t)parallelism);
    config.faults = faults;
  }
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  source src = {.events = e, .n = n, .delay_us = state_dir ? 200 : 0};
  collector sink_data = {.record_bytes = sizeof(result)};
  sl_op *s, *k, *p, *out;
  cr_assert_eq(sl_op_source(job, "src", 1, &src_ops, &src, &s), 0);
  sl_watermark_config wm = {.out_of_orderness = BOUND, .every_call = 1};
  cr_assert_eq(sl_op_watermarks(s, &wm), 0);
  cr_assert_eq(sl_op_key_by(job, "by-key", s, event_key, 0, &k), 0);
  sl_process_ops ops = {.process = to_process, .on_timer = to_timer};
  cr_assert_eq(sl_op_process(job, "to", &k, 1, parallelism, &ops, 0, &p), 0);
  cr_assert_eq(sl_op_sink(job, "out", p, parallelism, &sl_fixture_collector_ops,
                          &sink_data, &out),
               0);
  cr_assert_eq(sl_job_run(job), 0, "job failed: %s", sl_job_error(job));
  if (state_dir)
    cr_assert_eq(sl_job_restarts(job), 1);
  sl_job_destroy(job);
  return gather(&sink_data, n_out);
}

Test(timers, deleted_timers_never_fire_across_compactions) {
  /* At least 12000 even when scaled down: 4096 deletes start a
   * compaction (per instance). */
  uint64_t n = 24000 / sl_test_scale();
  n = n < 12000 ? 12000 : n;
  event *e = make_events(n, 1, 0, 10);
  /* 63 keys, 7 at a time in turns of 400 events: a key is quiet for 3200
   * events (about 9600 ms) between its turns, so its deadline fires in
   * between, and the heap holds many live timers beside the deleted. */
  for (uint64_t i = 0; i < n; i++)
    e[i].key = (i / 400) % 9 * 7 + (i % 7);
  int64_t *wm = watermark_before(e, n);
  int64_t *pending = malloc(sizeof *pending * 64);
  cr_assert(pending);
  for (int k = 0; k < 64; k++)
    pending[k] = INT64_MIN;
  result *want = malloc(sizeof *want * n);
  cr_assert(want);
  uint64_t n_want = 0;
  for (uint64_t i = 0; i <= n; i++) {
    int64_t w_now = i < n ? wm[i] : INT64_MAX;
    for (int k = 0; k < 64; k++)
      if (pending[k] != INT64_MIN && pending[k] <= w_now) {
        want[n_want++] = (result){.key = (uint64_t)k, .start = pending[k],
                                  .end = pending[k] + 1, .count = 1};
        pending[k] = INT64_MIN;
      }
    if (i < n)
      pending[e[i].key] = e[i].ts + TIMEOUT;
  }
  qsort(want, n_want, sizeof *want, result_cmp);
  cr_assert_gt(n_want * 200, n, "deadlines fire between turns");
  cr_assert_lt(n_want * 20, n, "most deadlines are deleted");
  const int ps[] = {1, 2};
  for (int pi = 0; pi < 2; pi++) {
    uint64_t n_got;
    result *got = run_timeouts(e, n, ps[pi], 0, &n_got);
    expect_same(got, n_got, want, n_want, "timeouts");
    free(got);
  }
  char *dir = sl_test_temp_dir("win");
  uint64_t n_got;
  result *got = run_timeouts(e, n, 1, dir, &n_got);
  expect_same(got, n_got, want, n_want, "timeouts after a failure");
  free(got);
  sl_test_remove_tree(dir);
  free(want);
  free(pending);
  free(wm);
  free(e);
}

/* ------------------------------------------- end of input, final checkpoint */

static bool window_has_all(sl_job *job, uint64_t n) {
  sl_op_stats st;
  for (int i = 0; i < 60000; i++) { /* about a minute */
    if (sl_job_stats(job, 1, &st) == 0 && st.records_in >= n)
      return true;
    sl_test_sleep_us(1000);
  }
  return false;
}

static bool checkpoint_done(sl_job *job, uint64_t id) {
  for (int i = 0; i < 60000; i++) { /* about a minute */
    if (sl_job_last_checkpoint(job, NULL) >= id)
      return true;
    sl_test_sleep_us(1000);
  }
  return false;
}

/* Entries the instance of operator `name` persisted in the k-th newest
 * checkpoint (parallelism 1). */
static uint64_t entries_of(sl_job *job, int k, const char *name) {
  sl_checkpoint_stats cs;
  cr_assert_eq(sl_job_checkpoint_stats(job, k, &cs), 0);
  for (int i = 0; i < cs.instance_count; i++) {
    sl_checkpoint_instance_stats is;
    cr_assert_eq(sl_job_checkpoint_instance_stats(job, k, i, &is), 0);
    if (strcmp(is.name, name) == 0)
      return is.entries_persisted;
  }
  cr_assert_fail("no instance of %s in checkpoint %d", name, k);
  return 0;
}

/* Each of K keys has one session that its later records grew past its
 * timer (window.c note 6), and no watermark reaches a session before the
 * end of input.  A checkpoint taken after the last record holds every
 * session; at the end of input each key's timer finds its session grown
 * and, the watermark being past its due time already, fires it in the same
 * firing.  So the final checkpoint only deletes what that checkpoint held:
 * re-arming a timer there (before the fix) put and deleted one more timer
 * entry per key in the final epoch, which the final checkpoint wrote too. */
Test(window, end_of_input_fires_grown_sessions_without_new_timers) {
  const uint64_t keys = 200, per_key = 10, n = keys * per_key;
  event *e = malloc(sizeof *e * n);
  cr_assert(e);
  for (uint64_t j = 0; j < per_key; j++)
    for (uint64_t k = 0; k < keys; k++)
      e[j * keys + k] = (event){.key = k, .value = j + 1,
                                .ts = 1000 + (int64_t)j * 10};
  char *dir = sl_test_temp_dir("window-final");
  sl_job_config config = SL_JOB_CONFIG_INIT;
  config.checkpoint.state_dir = dir;
  config.checkpoint.interval_ms = 3600000; /* only the one triggered here */
  config.checkpoint.no_sync = 1;
  config.checkpoint.store_policy = SL_STORE_FRESH;
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  source src = {.events = e, .n = n, .hold_at = n};
  collector sink_data = {.record_bytes = sizeof(result)};
  sl_op *s, *k, *w, *out;
  cr_assert_eq(sl_op_source(job, "src", 1, &src_ops, &src, &s), 0);
  /* No watermark before the end reaches a session's end - 1. */
  sl_watermark_config wm = {.out_of_orderness = 1000000, .every_call = 1};
  cr_assert_eq(sl_op_watermarks(s, &wm), 0);
  cr_assert_eq(sl_op_key_by(job, "by-key", s, event_key, 0, &k), 0);
  sl_window_config c = {.type = SL_WINDOW_SESSION, .gap = 60,
                        .acc_bytes = sizeof(acc), .init = acc_init,
                        .add = acc_add, .merge = acc_merge, .emit = acc_emit};
  cr_assert_eq(sl_op_window(job, "win", k, 1, &c, &w), 0, "%s",
               sl_job_error(job));
  cr_assert_eq(sl_op_sink(job, "out", w, 1, &sl_fixture_collector_ops,
                          &sink_data, &out),
               0);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  cr_assert(window_has_all(job, n), "the window never got every record");
  uint64_t id = 0;
  int rc = sl_job_trigger_checkpoint(job, &id);
  cr_assert_eq(rc, 0, "trigger: %s", sl_strerror(rc));
  cr_assert(checkpoint_done(job, id), "checkpoint %" PRIu64 " never "
            "completed", id);
  cr_assert_eq(sl_job_wait(job), 0, "%s", sl_job_error(job));
  sl_checkpoint_stats final;
  cr_assert_eq(sl_job_checkpoint_stats(job, 0, &final), 0);
  cr_assert(final.final, "the newest checkpoint is the final one");
  cr_assert_eq(sl_job_checkpoint_stats(job, 1, &(sl_checkpoint_stats){0}),
               0, "the triggered checkpoint precedes it");
  uint64_t held = entries_of(job, 1, "win"), deleted = entries_of(job, 0,
                                                                   "win");
  /* A session, its header and its timer per key. */
  cr_expect_geq(held, 3 * keys, "the checkpoint held %" PRIu64 " entries",
                held);
  cr_expect_leq(deleted, held, "the final checkpoint wrote %" PRIu64
                " entries for %" PRIu64 " held: timers put and deleted in "
                "the final epoch", deleted, held);
  sl_job_destroy(job);
  uint64_t n_got;
  result *got = gather(&sink_data, &n_got);
  cr_assert_eq(n_got, keys, "one session per key");
  for (uint64_t i = 0; i < n_got; i++)
    cr_expect(got[i].key == i && got[i].start == 1000 &&
                  got[i].end == 1000 + (int64_t)(per_key - 1) * 10 + 60 &&
                  got[i].count == per_key,
              "key %" PRIu64 ": session [%" PRId64 ", %" PRId64 ") of %"
              PRIu64, got[i].key, got[i].start, got[i].end, got[i].count);
  free(got);
  free(e);
  sl_test_remove_tree(dir);
}
