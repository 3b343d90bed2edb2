/* checkpoint_align.c — part 6 of checkpoint_bench: barrier alignment in a
 * keyed two-input join, aligned and unaligned (moved out of
 * checkpoint_bench.c to keep files under 1,500 lines; shared helpers in
 * checkpoint_bench.h).
 *
 * 6. alignment: a keyed two-input join, parallelism 2, exactly-once
 *    checkpoints every 100 ms (fsync on commit), into one discarding sink.
 *    The join is an enrichment join written as a keyed two-input process
 *    operator: input B (updates) sets a value per key, input A (events)
 *    looks its key up and emits {key, A's value, B's value}.  (The public
 *    sl_op_join keeps every record for ever; the interval join, tried
 *    here, ran at about 0.3M records/s with checkpoints of 1-2 s that
 *    measured its state writes more than alignment.)
 *    ALIGN_KEYS keys.  Case "skewed": A unpaced, 4 of 5 of its records on
 *    keys that join instance 0 owns; B emits one record per ALIGN_B_EVERY
 *    of A's, uniform keys.  Instance 0 is the bottleneck and A's ring into
 *    it backs up, while B's rings stay almost empty: B's barrier arrives
 *    at once, and instance 0 then holds B back until it has drained the A
 *    records queued before A's barrier.  A blocked on that ring also sees
 *    the trigger late, which delays its barrier at instance 1 too.  The
 *    wait is about the time to drain at most one ring of A records (4 MiB,
 *    262K tuples), so a few ms at this join's speed.  Case
 *    "even": A and B at the same rate (neither runs more than ALIGN_SLACK
 *    records ahead), uniform keys: both inputs back up alike and the two
 *    barriers arrive close together.  Per case, over every completed
 *    checkpoint (statistics polled every ALIGN_POLL_MS): alignment and
 *    start delay of the join instances (p50, p99, max; alignment also per
 *    instance), checkpoint duration, records/s into the join, entries
 *    persisted.  ALIGN_SECONDS per case (quick: ALIGN_SECONDS_QUICK).
 *    Case "backpressured" (issue 22): uniform keys as in "even", the two
 *    sources paced at ALIGN_BP_SOURCE_RATE records/s each (and neither
 *    more than ALIGN_SLACK ahead), and the sink paced at half of that
 *    (ALIGN_BP_SINK_RATE: it sleeps in its callback when it is ahead of
 *    its rate), so the sink is the bottleneck and every ring on the way
 *    stays full: an aligned barrier waits behind a full join -> sink ring
 *    and a full source -> join ring.  It runs in both modes, in turns
 *    (aligned, unaligned, aligned, ...: ALIGN_BP_ROUNDS of each, quick
 *    ALIGN_BP_ROUNDS_QUICK, each ALIGN_SECONDS long or, quick,
 *    ALIGN_BP_SECONDS_QUICK: the rings take about 2 s to fill), samples
 *    pooled per mode.  "unaligned" is checkpoint_unaligned
 *    with no aligned-checkpoint timeout (every checkpoint unaligned from
 *    its start).  Per mode: checkpoint duration p50, p99, max and the
 *    writer's transaction, channel-state bytes per checkpoint (p50, max)
 *    and how many checkpoints were unaligned, records/s into the join,
 *    the join instances' start delay and alignment as above, and the
 *    latest start delay of any instance per checkpoint ("last": when
 *    the last instance took its snapshot, so duration - last is about
 *    the acks, the wait for the writer and its transaction).
 *    Target (issue 22): unaligned duration p99 <= 1/4 of aligned
 *    (ALIGN_BP_TARGET_RATIO), judged on the pooled samples of this run.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "checkpoint_bench.h"
#include "fixtures.h"
#include "sluice.h"
#include "sluice_testing.h" /* unstable test helpers */

/* ------------------------------------------------------------ 6. alignment */

#define ALIGN_KEYS 100000u     /* join keys; coprime with UPDATE_STRIDE */
#define ALIGN_B_EVERY 20u      /* skewed: B emits 1 record per 20 of A's */
#define ALIGN_HOT_OF_5 4u      /* skewed: A records of 5 sent to instance 0 */
#define ALIGN_SLACK 4096u      /* even: how far a source may run ahead */
#define ALIGN_PARALLELISM 2
#define ALIGN_MAX_PARALLELISM 128 /* key groups: the job's and the table's */
#define ALIGN_SECONDS 20
#define ALIGN_SECONDS_QUICK 3
#define ALIGN_BP_SECONDS_QUICK 6 /* the rings take about 2 s to fill */
#define ALIGN_POLL_MS 200      /* 64 kept statistics last 6.4 s at 100 ms */
#define ALIGN_MAX_CHECKPOINTS 4096
#define ALIGN_JOIN_OPERATOR 2  /* physical operator index: a, b, join, sink */
#define ALIGN_BATCH 256u
#define ALIGN_BP_SOURCE_RATE 400000u /* backpressured: records/s per source */
#define ALIGN_BP_SINK_RATE (ALIGN_BP_SOURCE_RATE / 2) /* half: the bottleneck */
#define ALIGN_BP_SINK_CHECK 64u /* sink records between clock reads */
#define ALIGN_BP_ROUNDS 3       /* backpressured runs of each mode */
#define ALIGN_BP_ROUNDS_QUICK 2
#define ALIGN_BP_TARGET_RATIO 0.25 /* issue 22: unaligned p99 / aligned p99 */

_Static_assert(ALIGN_KEYS % UPDATE_STRIDE != 0, "keys coprime with stride");
_Static_assert(ALIGN_SECONDS * 1000 / 100 * 2 < ALIGN_MAX_CHECKPOINTS,
               "room for every checkpoint of a case");
_Static_assert(ALIGN_BP_ROUNDS * ALIGN_SECONDS * 1000 / 100 * 2 <
                   ALIGN_MAX_CHECKPOINTS,
               "room for every checkpoint of a mode's rounds");
_Static_assert(ALIGN_BP_SINK_RATE * 2 == ALIGN_BP_SOURCE_RATE,
               "the sink runs at half a source's rate");

enum align_kind { ALIGN_SKEWED, ALIGN_EVEN, ALIGN_BACKPRESSURED };

/* What the two sources share.  Each source writes only its own counter. */
typedef struct align_feed {
  enum align_kind kind;
  uint64_t start_ns; /* backpressured: the clock the paces count from */
  uint64_t sink_records; /* backpressured: written by the sink only */
  _Atomic bool ending;
  _Atomic uint64_t emitted[2]; /* records emitted by A (0) and B (1) */
  uint64_t *owned[ALIGN_PARALLELISM]; /* keys each join instance owns */
  uint64_t owned_count[ALIGN_PARALLELISM];
} align_feed;

typedef struct align_side {
  align_feed *feed;
  int side; /* 0: A, 1: B */
} align_side;

/* Records side may emit now without breaking its rate rule. */
static uint64_t align_allowed(align_feed *feed, int side) {
  uint64_t mine = atomic_load(&feed->emitted[side]);
  uint64_t other = atomic_load(&feed->emitted[1 - side]);
  uint64_t limit = other + ALIGN_SLACK;
  if (feed->kind == ALIGN_SKEWED)
    limit = side == 0 ? mine + ALIGN_BATCH : other / ALIGN_B_EVERY;
  if (feed->kind == ALIGN_BACKPRESSURED) {
    uint64_t paced = (bench_now_ns() - feed->start_ns) *
                     ALIGN_BP_SOURCE_RATE / 1000000000u;
    limit = paced < limit ? paced : limit;
  }
  return limit > mine ? limit - mine : 0;
}

/* The key of side's i-th record: uniform over ALIGN_KEYS, except A's in
 * the skewed case (4 of 5 on keys that join instance 0 owns). */
static uint64_t align_key(const align_feed *feed, int side, uint64_t i) {
  if (feed->kind != ALIGN_SKEWED || side == 1)
    return i * UPDATE_STRIDE % ALIGN_KEYS;
  int instance = i % 5 < ALIGN_HOT_OF_5 ? 0 : 1;
  uint64_t count = feed->owned_count[instance];
  assert(count > 0);
  return feed->owned[instance][i * UPDATE_STRIDE % count];
}

static int align_open(sl_ctx *ctx, void *user, void **state) {
  (void)ctx;
  *state = user;
  return 0;
}

static int align_next(sl_ctx *ctx, void *state) {
  align_side *s = state;
  align_feed *feed = s->feed;
  if (atomic_load(&feed->ending))
    return SL_SOURCE_END;
  uint64_t allowed = align_allowed(feed, s->side);
  if (allowed == 0) {
    usleep(20);
    return 0;
  }
  sl_tuple run[ALIGN_BATCH];
  uint32_t n = allowed < ALIGN_BATCH ? (uint32_t)allowed : ALIGN_BATCH;
  uint64_t first = atomic_load(&feed->emitted[s->side]);
  for (uint32_t k = 0; k < n; k++) {
    run[k].key = align_key(feed, s->side, first + k);
    run[k].value = first + k;
  }
  int rc = sl_emit_batch(ctx, run, sizeof run[0], n);
  if (rc == 0)
    atomic_fetch_add(&feed->emitted[s->side], n);
  return rc;
}

/* An enrichment join.  Input 1 (B, updates): set the key's value (state
 * 0).  Input 0 (A, events): emit {key, A's value, B's value} when B has set
 * one.  Only B writes state, so what a checkpoint persists grows with B's
 * rate, not A's. */
static int align_join(sl_ctx *ctx, void *state, int input,
                      const sl_record *in) {
  (void)state;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  if (input == 1)
    return sl_state_put(ctx, 0, &t.value, sizeof t.value, 0);
  assert(input == 0);
  const void *value;
  uint32_t bytes;
  if (sl_state_get(ctx, 0, &value, &bytes) != 0)
    return 0; /* no update for this key yet: nothing to join */
  uint64_t joined[3] = {t.key, t.value, 0};
  assert(bytes == sizeof joined[2]);
  memcpy(&joined[2], value, sizeof joined[2]);
  return sl_emit(ctx, joined, sizeof joined);
}

/* The backpressured case's sink: discards, at ALIGN_BP_SINK_RATE records/s
 * from feed->start_ns, sleeping when ahead (checked every
 * ALIGN_BP_SINK_CHECK records; the due time is absolute, so the sleeps'
 * overshoot does not add up).  Once the sources end it stops pacing, so
 * the rings drain at once and the case ends quickly. */
static int align_paced_sink(sl_ctx *ctx, void *state, int input,
                            const sl_record *in) {
  (void)ctx;
  (void)input;
  (void)in;
  align_feed *feed = state;
  uint64_t n = ++feed->sink_records;
  if (n % ALIGN_BP_SINK_CHECK != 0 || atomic_load(&feed->ending))
    return 0;
  uint64_t due_ns = feed->start_ns + n * 1000000000u / ALIGN_BP_SINK_RATE;
  uint64_t now_ns = bench_now_ns();
  if (due_ns > now_ns)
    usleep((useconds_t)((due_ns - now_ns) / 1000));
  return 0;
}

/* a -> key_by -+
 *              +-> join (2 instances) -> sink (1 instance, discards)
 * b -> key_by -+ */
static sl_job *align_build(const sl_job_config *config, align_side sides[2]) {
  static const sl_source_ops source_ops = {.open = align_open,
                                           .next = align_next};
  static const sl_process_ops join_ops = {.process = align_join};
  static const sl_process_ops sink_ops = {.process = fixture_discard};
  static const sl_process_ops paced_sink_ops = {.open = fixture_open_shared,
                                                .process = align_paced_sink};
  align_feed *feed = sides[0].feed;
  bool paced = feed->kind == ALIGN_BACKPRESSURED;
  sl_job *job;
  if (sl_job_create(config, &job))
    return 0;
  sl_op *a, *b, *keyed[2], *join, *sink;
  int rc = sl_op_source(job, "a", 1, &source_ops, &sides[0], &a);
  if (!rc)
    rc = sl_op_source(job, "b", 1, &source_ops, &sides[1], &b);
  if (!rc)
    rc = sl_op_key_by(job, "a.key", a, fixture_tuple_key, 0, &keyed[0]);
  if (!rc)
    rc = sl_op_key_by(job, "b.key", b, fixture_tuple_key, 0, &keyed[1]);
  if (!rc)
    rc = sl_op_process(job, "join", keyed, 2, ALIGN_PARALLELISM, &join_ops,
                       0, &join);
  if (!rc)
    rc = sl_op_sink(job, "sink", join, 1, paced ? &paced_sink_ops : &sink_ops,
                    feed, &sink);
  if (rc) {
    fprintf(stderr, "checkpoint_bench: align build: %s\n", sl_strerror(rc));
    sl_job_destroy(job);
    return 0;
  }
  return job;
}

/* Samples of one case: per completed checkpoint its duration, and per join
 * instance its alignment and start delay (all in us). */
typedef struct align_samples {
  uint64_t newest_id; /* newest checkpoint collected */
  size_t checkpoints;
  size_t instance_samples;
  uint64_t duration_us[ALIGN_MAX_CHECKPOINTS];
  uint64_t entries[ALIGN_MAX_CHECKPOINTS]; /* persisted per checkpoint */
  uint64_t write_us[ALIGN_MAX_CHECKPOINTS];
  uint64_t reached_us[ALIGN_MAX_CHECKPOINTS]; /* max start delay, all */
  uint64_t channel_bytes[ALIGN_MAX_CHECKPOINTS]; /* per checkpoint */
  size_t unaligned; /* checkpoints any instance took unaligned */
  uint64_t alignment_us[ALIGN_MAX_CHECKPOINTS];
  uint64_t start_delay_us[ALIGN_MAX_CHECKPOINTS];
  uint64_t by_instance_us[ALIGN_PARALLELISM][ALIGN_MAX_CHECKPOINTS];
  size_t by_instance_count[ALIGN_PARALLELISM];
} align_samples;

/* Add the checkpoints newer than out->newest_id, oldest first, stopping
 * at one still in progress.  Statistics move down one index when a
 * checkpoint starts, so each is read again after its instances, and a pass
 * that sees it move stops there (the next pass goes on from there). */
static void align_collect(const sl_job *job, align_samples *out) {
  sl_checkpoint_stats cs, again;
  int k = 0;
  while (k < 64 && sl_job_checkpoint_stats(job, k, &cs) == 0 &&
         cs.id > out->newest_id)
    k++;
  for (k--; k >= 0; k--) {
    if (sl_job_checkpoint_stats(job, k, &cs) != 0 ||
        cs.status == SL_CHECKPOINT_IN_PROGRESS)
      return;
    sl_checkpoint_instance_stats joins[ALIGN_PARALLELISM], one;
    int n = 0;
    uint64_t reached_us = 0; /* the latest start delay of any instance */
    for (int i = 0; i < cs.instance_count; i++) {
      if (sl_job_checkpoint_instance_stats(job, k, i, &one) != 0)
        continue;
      if (one.start_delay_us > reached_us)
        reached_us = one.start_delay_us;
      if (strcmp(one.name, "join") == 0 && n < ALIGN_PARALLELISM)
        joins[n++] = one;
    }
    if (sl_job_checkpoint_stats(job, k, &again) != 0 || again.id != cs.id)
      return;
    assert(cs.id > out->newest_id);
    out->newest_id = cs.id;
    if (cs.status != SL_CHECKPOINT_COMPLETED || cs.final ||
        out->checkpoints >= ALIGN_MAX_CHECKPOINTS ||
        out->instance_samples + (size_t)n > ALIGN_MAX_CHECKPOINTS)
      continue;
    out->entries[out->checkpoints] = cs.entries_persisted;
    out->write_us[out->checkpoints] = cs.write_us;
    out->reached_us[out->checkpoints] = reached_us;
    out->channel_bytes[out->checkpoints] = cs.channel_bytes;
    out->unaligned += cs.unaligned != 0;
    out->duration_us[out->checkpoints++] = cs.duration_us;
    for (int j = 0; j < n; j++) {
      int instance = joins[j].instance;
      assert(instance >= 0 && instance < ALIGN_PARALLELISM);
      out->alignment_us[out->instance_samples] = joins[j].alignment_us;
      out->start_delay_us[out->instance_samples++] = joins[j].start_delay_us;
      size_t *count = &out->by_instance_count[instance];
      out->by_instance_us[instance][(*count)++] = joins[j].alignment_us;
    }
  }
}

typedef struct align_result {
  double records_per_second; /* through the join, both inputs */
  double b_share;            /* B's records / all records */
} align_result;

/* Run one case for `seconds` (unaligned: checkpoint_unaligned, no
 * timeout), polling the statistics into *samples (added to what it
 * holds). */
static int align_case(const char *dir, align_feed *feed, int seconds,
                      bool unaligned, align_samples *samples,
                      align_result *result) {
  fresh_dir(dir);
  sl_job_config config = SL_JOB_CONFIG_INIT;
  config.max_parallelism = ALIGN_MAX_PARALLELISM; /* align_part's table */
  config.checkpoint.state_dir = dir;
  config.checkpoint.interval_ms = 100;
  config.checkpoint.mode = SL_EXACTLY_ONCE;
  config.checkpoint_unaligned = unaligned;
  align_side sides[2] = {{feed, 0}, {feed, 1}};
  feed->start_ns = bench_now_ns();
  sl_job *job = align_build(&config, sides);
  if (!job || sl_job_start(job) != 0) {
    fprintf(stderr, "checkpoint_bench: align start: %s\n",
            job ? sl_job_error(job) : "");
    sl_job_destroy(job);
    return 1;
  }
  uint64_t t0 = bench_now_ns();
  for (int tick = 0; tick < seconds * 1000 / ALIGN_POLL_MS; tick++) {
    usleep(ALIGN_POLL_MS * 1000);
    align_collect(job, samples);
  }
  sl_op_stats st;
  uint64_t records = sl_job_stats(job, ALIGN_JOIN_OPERATOR, &st) == 0
                         ? st.records_in : 0;
  double elapsed_s = (double)(bench_now_ns() - t0) / 1e9;
  atomic_store(&feed->ending, true);
  int rc = sl_job_wait(job);
  align_collect(job, samples);
  if (rc)
    fprintf(stderr, "checkpoint_bench: align: %s\n", sl_job_error(job));
  sl_job_destroy(job);
  uint64_t a = atomic_load(&feed->emitted[0]);
  uint64_t b = atomic_load(&feed->emitted[1]);
  result->records_per_second = (double)records / elapsed_s;
  result->b_share = a + b ? (double)b / (double)(a + b) : 0;
  samples->newest_id = 0; /* the next run's ids start again from 1 */
  if (rc == 0 && samples->checkpoints == 0) {
    fprintf(stderr, "checkpoint_bench: align: no checkpoint completed\n");
    rc = 1;
  }
  return rc;
}

typedef struct align_percentiles {
  double p50_ms, p99_ms, max_ms;
} align_percentiles;

/* Sorts values. */
static align_percentiles align_percentiles_of(uint64_t *values_us,
                                              size_t count) {
  align_percentiles p = {0, 0, 0};
  if (count == 0)
    return p;
  bench_sort_u64(values_us, count);
  p.p50_ms = (double)bench_percentile_sorted_u64(values_us, count, 0.5) / 1e3;
  p.p99_ms = (double)bench_percentile_sorted_u64(values_us, count, 0.99) / 1e3;
  p.max_ms = (double)values_us[count - 1] / 1e3;
  return p;
}

static void align_json_percentiles(bench_json *json, const char *key,
                                   align_percentiles p) {
  bench_json_begin_object(json, key);
  bench_json_double(json, "p50", p.p50_ms);
  bench_json_double(json, "p99", p.p99_ms);
  bench_json_double(json, "max", p.max_ms);
  bench_json_end_object(json);
}

static void align_report(bench_json *json, const char *name,
                         align_samples *s, const align_result *r) {
  align_percentiles al = align_percentiles_of(s->alignment_us,
                                              s->instance_samples);
  align_percentiles sd = align_percentiles_of(s->start_delay_us,
                                              s->instance_samples);
  align_percentiles du = align_percentiles_of(s->duration_us, s->checkpoints);
  bench_sort_u64(s->entries, s->checkpoints);
  uint64_t entries = bench_percentile_sorted_u64(s->entries, s->checkpoints,
                                                 0.5);
  align_percentiles by[ALIGN_PARALLELISM];
  for (int i = 0; i < ALIGN_PARALLELISM; i++)
    by[i] = align_percentiles_of(s->by_instance_us[i],
                                 s->by_instance_count[i]);
  printf("   %-7s %5zu %7.1f %7.1f %7.1f %7.1f %7.1f %7.1f %7.1f %7.1f "
         "%7.1f %7.1f %7.2f %6.3f %8" PRIu64 "\n", name, s->checkpoints,
         al.p50_ms, al.p99_ms, al.max_ms, by[0].p50_ms, by[1].p50_ms,
         sd.p50_ms, sd.p99_ms, sd.max_ms, du.p50_ms, du.p99_ms,
         r->records_per_second / 1e6, r->b_share, entries);
  bench_json_begin_object(json, 0);
  bench_json_string(json, "case", name);
  bench_json_string(json, "mode", "aligned");
  bench_json_u64(json, "checkpoints", s->checkpoints);
  align_json_percentiles(json, "alignment_ms", al);
  bench_json_begin_array(json, "alignment_ms_by_instance");
  for (int i = 0; i < ALIGN_PARALLELISM; i++)
    align_json_percentiles(json, 0, by[i]);
  bench_json_end_array(json);
  align_json_percentiles(json, "start_delay_ms", sd);
  align_json_percentiles(json, "duration_ms", du);
  bench_json_double(json, "records_per_second", r->records_per_second);
  bench_json_double(json, "b_share", r->b_share);
  bench_json_u64(json, "entries_per_checkpoint_p50", entries);
  bench_json_end_object(json);
}

/* One mode of the backpressured case: its row and its entry of
 * "alignment"; returns the duration p99 in ms (for the target). */
static double align_bp_report(bench_json *json, bool unaligned,
                              align_samples *s, double records_per_second) {
  const char *mode = unaligned ? "unaligned" : "aligned";
  align_percentiles al = align_percentiles_of(s->alignment_us,
                                              s->instance_samples);
  align_percentiles sd = align_percentiles_of(s->start_delay_us,
                                              s->instance_samples);
  align_percentiles du = align_percentiles_of(s->duration_us, s->checkpoints);
  align_percentiles wr = align_percentiles_of(s->write_us, s->checkpoints);
  align_percentiles re = align_percentiles_of(s->reached_us, s->checkpoints);
  align_percentiles by[ALIGN_PARALLELISM];
  for (int i = 0; i < ALIGN_PARALLELISM; i++)
    by[i] = align_percentiles_of(s->by_instance_us[i],
                                 s->by_instance_count[i]);
  bench_sort_u64(s->channel_bytes, s->checkpoints);
  uint64_t channel_p50 =
      bench_percentile_sorted_u64(s->channel_bytes, s->checkpoints, 0.5);
  uint64_t channel_max =
      s->checkpoints ? s->channel_bytes[s->checkpoints - 1] : 0;
  bench_sort_u64(s->entries, s->checkpoints);
  uint64_t entries = bench_percentile_sorted_u64(s->entries, s->checkpoints,
                                                 0.5);
  printf("   %-9s %5zu %5zu %8.1f %8.1f %8.1f %7.1f %7.1f %8.1f %8.1f "
         "%7.1f %7.1f %7.1f %7.3f\n", mode, s->checkpoints, s->unaligned,
         du.p50_ms, du.p99_ms, du.max_ms, wr.p50_ms, wr.p99_ms,
         (double)channel_p50 / 1024, (double)channel_max / 1024, al.p99_ms,
         sd.p99_ms, re.p99_ms, records_per_second / 1e6);
  bench_json_begin_object(json, 0);
  bench_json_string(json, "case", "backpressured");
  bench_json_string(json, "mode", mode);
  bench_json_u64(json, "checkpoints", s->checkpoints);
  bench_json_u64(json, "unaligned_checkpoints", s->unaligned);
  align_json_percentiles(json, "alignment_ms", al);
  bench_json_begin_array(json, "alignment_ms_by_instance");
  for (int i = 0; i < ALIGN_PARALLELISM; i++)
    align_json_percentiles(json, 0, by[i]);
  bench_json_end_array(json);
  align_json_percentiles(json, "start_delay_ms", sd);
  align_json_percentiles(json, "duration_ms", du);
  align_json_percentiles(json, "write_ms", wr);
  align_json_percentiles(json, "last_start_delay_ms", re);
  bench_json_begin_object(json, "channel_bytes_per_checkpoint");
  bench_json_u64(json, "p50", channel_p50);
  bench_json_u64(json, "max", channel_max);
  bench_json_end_object(json);
  bench_json_double(json, "records_per_second", records_per_second);
  bench_json_u64(json, "entries_per_checkpoint_p50", entries);
  bench_json_end_object(json);
  return du.p99_ms;
}

/* The target of the backpressured case, printed and written as
 * "backpressured_target". */
static void align_bp_target(bench_json *json, double aligned_p99_ms,
                            double unaligned_p99_ms) {
  double ratio = aligned_p99_ms > 0 ? unaligned_p99_ms / aligned_p99_ms : 0;
  bool met = aligned_p99_ms > 0 && ratio <= ALIGN_BP_TARGET_RATIO;
  printf("   target (issue 22): unaligned duration p99 <= %.2f of aligned: "
         "%.1f / %.1f ms = %.3f, %s\n", ALIGN_BP_TARGET_RATIO,
         unaligned_p99_ms, aligned_p99_ms, ratio, met ? "met" : "NOT met");
  bench_json_begin_object(json, "backpressured_target");
  bench_json_double(json, "aligned_duration_ms_p99", aligned_p99_ms);
  bench_json_double(json, "unaligned_duration_ms_p99", unaligned_p99_ms);
  bench_json_double(json, "ratio", ratio);
  bench_json_double(json, "ratio_max", ALIGN_BP_TARGET_RATIO);
  bench_json_bool(json, "met", met);
  bench_json_end_object(json);
}

/* The backpressured case: rounds of aligned then unaligned, samples pooled
 * per mode (index 0 aligned, 1 unaligned), records/s the median of the
 * rounds.  Its entries go into the open "alignment" array; *p99_ms gets
 * each mode's duration p99. */
static int align_bp_case(bench_json *json, const char *dir, int seconds,
                         int rounds, double p99_ms[2]) {
  align_samples *samples[2] = {calloc(1, sizeof *samples[0]),
                               calloc(1, sizeof *samples[1])};
  double rates[2][ALIGN_BP_ROUNDS];
  int rc = samples[0] && samples[1] ? 0 : ENOMEM;
  assert(rounds <= ALIGN_BP_ROUNDS);
  for (int r = 0; rc == 0 && r < rounds; r++)
    for (int m = 0; rc == 0 && m < 2; m++) {
      align_feed run = {.kind = ALIGN_BACKPRESSURED};
      align_result result;
      rc = align_case(dir, &run, seconds, m == 1, samples[m], &result);
      rates[m][r] = result.records_per_second;
    }
  printf("   %-9s %5s %5s %8s %8s %8s %7s %7s %8s %8s %7s %7s %7s %7s\n",
         "mode", "ckpts", "unal", "dur50", "p99", "max", "write50", "p99",
         "chKB50", "chKBmax", "al.p99", "dly.p99", "last99", "Mrec/s");
  for (int m = 0; rc == 0 && m < 2; m++) {
    qsort(rates[m], (size_t)rounds, sizeof rates[m][0], bench_compare_double);
    p99_ms[m] = align_bp_report(json, m == 1, samples[m],
                                rates[m][rounds / 2]);
  }
  free(samples[0]);
  free(samples[1]);
  return rc;
}

int align_part(bench_json *json, const char *dir, bool quick) {
  static uint64_t owned[ALIGN_PARALLELISM][ALIGN_KEYS];
  uint64_t owned_count[ALIGN_PARALLELISM] = {0};
  for (uint64_t key = 0; key < ALIGN_KEYS; key++) {
    int instance =
        sl_key_instance(key, ALIGN_MAX_PARALLELISM, ALIGN_PARALLELISM);
    assert(instance >= 0 && instance < ALIGN_PARALLELISM);
    owned[instance][owned_count[instance]++] = key;
  }
  int seconds = quick ? ALIGN_SECONDS_QUICK : ALIGN_SECONDS;
  printf("6. barrier alignment: keyed two-input join, parallelism 2, "
         "exactly-once every 100 ms, %d s a case (ms)\n", seconds);
  printf("   %-7s %5s %7s %7s %7s %7s %7s %7s %7s %7s %7s %7s %7s %6s %8s\n",
         "case", "ckpts", "align50", "p99", "max", "inst0", "inst1",
         "delay50", "p99", "max", "dur50", "p99", "Mrec/s", "B/all",
         "entries");
  bench_json_begin_array(json, "alignment");
  int rc = 0;
  for (int c = 0; rc == 0 && c < 2; c++) {
    align_samples *samples = calloc(1, sizeof *samples);
    if (!samples) {
      rc = ENOMEM;
      break;
    }
    align_feed run = {.kind = c == 0 ? ALIGN_SKEWED : ALIGN_EVEN};
    for (int i = 0; i < ALIGN_PARALLELISM; i++) {
      run.owned[i] = owned[i];
      run.owned_count[i] = owned_count[i];
    }
    align_result result;
    rc = align_case(dir, &run, seconds, false, samples, &result);
    if (rc == 0)
      align_report(json, c == 0 ? "skewed" : "even", samples, &result);
    free(samples);
  }
  printf("   align: first to last barrier at a join instance (inst0/1: "
         "p50 per instance); delay: trigger to\n   first barrier; dur: "
         "trigger to durable; B/all: B's share of the records; entries: "
         "p50 persisted\n");
  int rounds = quick ? ALIGN_BP_ROUNDS_QUICK : ALIGN_BP_ROUNDS;
  double p99_ms[2] = {0, 0};
  int bp_seconds = quick ? ALIGN_BP_SECONDS_QUICK : seconds;
  if (rc == 0) {
    printf("   backpressured: uniform keys, sources %u rec/s each, sink "
           "%u rec/s; %d rounds of aligned, unaligned, %d s each\n",
           ALIGN_BP_SOURCE_RATE, ALIGN_BP_SINK_RATE, rounds, bp_seconds);
    rc = align_bp_case(json, dir, bp_seconds, rounds, p99_ms);
  }
  bench_json_end_array(json);
  if (rc == 0) {
    printf("   unal: checkpoints taken unaligned; write: the writer's "
           "transaction; chKB: channel state per\n   checkpoint (KiB); "
           "al, dly: the join instances' alignment and start delay; last:\n"
           "   trigger to the last instance's first barrier or "
           "announcement (any operator)\n");
    align_bp_target(json, p99_ms[0], p99_ms[1]);
  }
  return rc;
}

