/* test_time_extremes.c — event times at and beyond the int64 limits
 * (issue 17): windows, timers and watermarks give the answer a reference
 * computed in __int128 gives, or refuse cleanly, naming the operator; the
 * Nexmark and JSON-lines parsers refuse INT64_MIN, times outside
 * SL_TIME_MIN_VALID .. SL_TIME_MAX_VALID and invalid UTF-8 alike; q5, q7
 * and q11 end promptly on an event file with an extreme bid.
 *
 * Run under the ASan+UBSan build (halt_on_error) this is also the check
 * that no arithmetic on the way overflows.  The CLI cases run sluice as a
 * child with an alarm set before exec: a hang comes back as SIGALRM, a
 * failure, not as the suite's timeout.  SLUICE_BIN is set by meson. */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io_internal.h"
#include "nexmark.h"
#include "sluice.h"
#include "test_dirs.h"
#include "test_util.h"

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))
__extension__ typedef __int128 wide;

/* ----------------------------------------------------------- the job */

typedef struct event {
  uint64_t key;
  int64_t ts;
} event;

typedef struct result {
  uint64_t key;
  int64_t start, end, count, stamp;
} result;

typedef struct feed {
  const event *events;
  uint64_t n, pos;
} feed;

static int feed_open(sl_ctx *ctx, void *user, void **state) {
  feed *f = calloc(1, sizeof *f);
  if (!f)
    return -ENOMEM;
  *f = *(const feed *)user;
  *state = f;
  return 0;
}

static int feed_next(sl_ctx *ctx, void *state) {
  feed *f = state;
  for (int k = 0; k < 16 && f->pos < f->n; k++, f->pos++) {
    int rc = sl_emit_ts(ctx, &f->events[f->pos], sizeof(event),
                        f->events[f->pos].ts);
    if (rc)
      return rc;
  }
  return f->pos == f->n ? SL_SOURCE_END : 0;
}

static void feed_close(sl_ctx *ctx, void *state) { free(state); }

static const sl_source_ops feed_ops = {
    .open = feed_open, .next = feed_next, .close = feed_close};

static uint64_t event_key(void *user, const sl_record *in) {
  return ((const event *)in->data)->key;
}

typedef struct results {
  result *items;
  uint64_t count, capacity;
} results;

static int collect_open(sl_ctx *ctx, void *user, void **state) {
  *state = user; /* one sink instance */
  return 0;
}

static int collect(sl_ctx *ctx, void *state, int input, const sl_record *in) {
  results *r = state;
  if (in->size_bytes != sizeof(result))
    return -EINVAL;
  if (r->count == r->capacity) {
    r->capacity = r->capacity ? 2 * r->capacity : 64;
    r->items = realloc(r->items, sizeof(result) * r->capacity);
    if (!r->items)
      return -ENOMEM;
  }
  memcpy(&r->items[r->count], in->data, sizeof(result));
  r->items[r->count++].stamp = in->timestamp;
  return 0;
}

static void count_init(void *user, void *acc) { *(int64_t *)acc = 0; }
static void count_add(void *user, void *acc, const sl_record *in) {
  *(int64_t *)acc += 1;
}
static void count_merge(void *user, void *acc, const void *other) {
  *(int64_t *)acc += *(const int64_t *)other;
}
static int count_emit(void *user, sl_ctx *ctx, uint64_t key,
                      const sl_window *w, const void *acc) {
  result r = {key, w->start, w->end, *(const int64_t *)acc, 0};
  return sl_emit(ctx, &r, sizeof r);
}

/* Run events (sorted by time: nothing is late) through window config w,
 * with the source's watermarks trailing by bound.  Returns sl_job_run's
 * status; *error gets the job's message. */
static int run_window(const event *events, uint64_t n, sl_window_config w,
                      int64_t bound, results *out, char *error,
                      size_t error_bytes) {
  sl_job_config config = SL_JOB_CONFIG_INIT;
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  feed f = {.events = events, .n = n};
  sl_op *s, *k, *win, *sink;
  cr_assert_eq(sl_op_source(job, "src", 1, &feed_ops, &f, &s), 0);
  sl_watermark_config wm = {.out_of_orderness = bound, .every_call = 1};
  cr_assert_eq(sl_op_watermarks(s, &wm), 0);
  cr_assert_eq(sl_op_key_by(job, "by-key", s, event_key, 0, &k), 0);
  w.acc_bytes = sizeof(int64_t);
  w.init = count_init;
  w.add = count_add;
  w.merge = count_merge;
  w.emit = count_emit;
  cr_assert_eq(sl_op_window(job, "win", k, 2, &w, &win), 0, "%s",
               sl_job_error(job));
  static const sl_process_ops sink_ops = {.open = collect_open,
                                           .process = collect};
  cr_assert_eq(sl_op_sink(job, "out", win, 1, &sink_ops, out, &sink), 0);
  int rc = sl_job_run(job);
  snprintf(error, error_bytes, "%s", sl_job_error(job));
  sl_job_destroy(job);
  return rc;
}

/* ----------------------------------------------------------- reference */

static int result_cmp(const void *a, const void *b) {
  const result *x = a, *y = b;
  if (x->key != y->key)
    return x->key < y->key ? -1 : 1;
  if (x->start != y->start)
    return x->start < y->start ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

static void ref_add(results *r, uint64_t key, wide start, wide end) {
  /* Every bound of a valid time fits (time_check.h note 2). */
  cr_assert(start >= INT64_MIN && end - 1 < INT64_MAX,
            "the reference found a window the int64 range cannot hold");
  for (uint64_t i = 0; i < r->count; i++)
    if (r->items[i].key == key && r->items[i].start == (int64_t)start &&
        r->items[i].end == (int64_t)end) {
      r->items[i].count++;
      return;
    }
  if (r->count == r->capacity) {
    r->capacity = r->capacity ? 2 * r->capacity : 64;
    r->items = realloc(r->items, sizeof(result) * r->capacity);
    cr_assert_not_null(r->items);
  }
  r->items[r->count++] = (result){key, (int64_t)start, (int64_t)end, 1,
                                  (int64_t)(end - 1)};
}

static wide floor_div(wide a, wide b) {
  wide q = a / b;
  return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

/* Tumbling and sliding windows, in __int128. */
static results ref_time(const event *e, uint64_t n, int64_t size,
                        int64_t slide) {
  results r = {0};
  for (uint64_t i = 0; i < n; i++)
    for (wide s = floor_div(e[i].ts, slide) * slide; s > (wide)e[i].ts - size;
         s -= slide)
      ref_add(&r, e[i].key, s, s + size);
  return r;
}

/* Sessions per key, events sorted by time. */
static results ref_session(const event *e, uint64_t n, int64_t gap) {
  results r = {0};
  for (uint64_t key = 0; key < 4; key++) {
    wide start = 0, end = 0;
    int64_t count = 0;
    for (uint64_t i = 0; i <= n; i++) {
      if (i < n && e[i].key != key)
        continue;
      if (count > 0 && (i == n || e[i].ts >= end)) {
        ref_add(&r, key, start, end);
        r.items[r.count - 1].count = count;
        count = 0;
      }
      if (i == n)
        break;
      if (count == 0)
        start = e[i].ts;
      end = (wide)e[i].ts + gap > end || count == 0 ? (wide)e[i].ts + gap
                                                     : end;
      count++;
    }
  }
  return r;
}

static void expect_same(results *got, results *want, const char *what) {
  qsort(got->items, got->count, sizeof(result), result_cmp);
  qsort(want->items, want->count, sizeof(result), result_cmp);
  cr_assert_eq(got->count, want->count, "%s: %" PRIu64 " windows, want %"
               PRIu64, what, got->count, want->count);
  for (uint64_t i = 0; i < got->count; i++) {
    const result *g = &got->items[i], *w = &want->items[i];
    cr_assert(g->key == w->key && g->start == w->start && g->end == w->end &&
                  g->count == w->count && g->stamp == w->end - 1,
              "%s: window %" PRIu64 " is key %" PRIu64 " [%" PRId64
              ", %" PRId64 ") count %" PRId64 " stamp %" PRId64
              ", want key %" PRIu64 " [%" PRId64 ", %" PRId64
              ") count %" PRId64,
              what, i, g->key, g->start, g->end, g->count, g->stamp, w->key,
              w->start, w->end, w->count);
  }
}

/* ----------------------------------------------------------- times */

static uint64_t rng(uint64_t *s) {
  *s += 0x9e3779b97f4a7c15ull;
  uint64_t z = *s;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* A valid time: near either bound, near 0, or anywhere in the range. */
static int64_t valid_time(uint64_t *seed) {
  uint64_t r = rng(seed), near = rng(seed) % 20000;
  switch (r % 4) {
  case 0: return SL_TIME_MIN_VALID + (int64_t)near;
  case 1: return SL_TIME_MAX_VALID - (int64_t)near;
  case 2: return (int64_t)near - 10000;
  default:
    return SL_TIME_MIN_VALID +
           (int64_t)(rng(seed) % ((uint64_t)SL_TIME_MAX_VALID -
                                  (uint64_t)SL_TIME_MIN_VALID + 1));
  }
}

static int event_cmp(const void *a, const void *b) {
  const event *x = a, *y = b;
  return x->ts < y->ts ? -1 : x->ts > y->ts;
}

static event *valid_events(uint64_t n, uint64_t seed) {
  event *e = malloc(sizeof *e * n);
  cr_assert_not_null(e);
  for (uint64_t i = 0; i < n; i++)
    e[i] = (event){.key = rng(&seed) % 4, .ts = valid_time(&seed)};
  /* The bounds themselves, every run. */
  e[0].ts = SL_TIME_MIN_VALID;
  e[1].ts = SL_TIME_MAX_VALID;
  qsort(e, n, sizeof *e, event_cmp);
  return e;
}

/* Property: over random valid times, the extremes included, tumbling,
 * sliding and session windows (with and without lateness, spans up to
 * SL_TIME_SPAN_MAX) give exactly the __int128 reference's windows. */
Test(time_extremes, windows_of_valid_times_match_the_reference) {
  static const struct {
    int type;
    int64_t size, slide, lateness;
  } configs[] = {
      {SL_WINDOW_TUMBLING, 7, 0, 0},
      {SL_WINDOW_TUMBLING, 1000, 0, SL_TIME_SPAN_MAX},
      {SL_WINDOW_TUMBLING, SL_TIME_SPAN_MAX, 0, SL_TIME_SPAN_MAX},
      {SL_WINDOW_SLIDING, 1000, 250, 0},
      {SL_WINDOW_SLIDING, SL_TIME_SPAN_MAX, SL_TIME_SPAN_MAX / 2, 5},
      {SL_WINDOW_SESSION, 1000, 0, 0},
      {SL_WINDOW_SESSION, SL_TIME_SPAN_MAX, 0, SL_TIME_SPAN_MAX},
  };
  uint64_t n = (uint64_t)sl_test_scaled(400, 120);
  for (uint64_t round = 0; round < 4; round++)
    for (size_t c = 0; c < COUNT(configs); c++) {
      event *e = valid_events(n, 1000 * round + c);
      sl_window_config w = {.type = configs[c].type,
                            .allowed_lateness = configs[c].lateness};
      results want;
      if (configs[c].type == SL_WINDOW_SESSION) {
        w.gap = configs[c].size;
        want = ref_session(e, n, w.gap);
      } else {
        w.size = configs[c].size;
        w.slide = configs[c].slide;
        want = ref_time(e, n, w.size, w.slide ? w.slide : w.size);
      }
      results got = {0};
      char error[512];
      /* Bounds 0 and INT64_MAX: the watermark right behind the newest
       * time, and saturated at the low end. */
      int64_t bound = round % 2 ? INT64_MAX : 0;
      int rc = run_window(e, n, w, bound, &got, error, sizeof error);
      cr_assert_eq(rc, 0, "config %zu round %" PRIu64 ": %s", c, round,
                   error);
      char what[64];
      snprintf(what, sizeof what, "config %zu round %" PRIu64, c, round);
      expect_same(&got, &want, what);
      free(got.items);
      free(want.items);
      free(e);
    }
}

/* A time outside the valid range fails the job naming the window
 * operator and the time, for every kind of window: never a wrapped
 * window, never a hang. */
Test(time_extremes, windows_refuse_invalid_times_naming_the_operator) {
  static const int64_t bad[] = {INT64_MIN + 1, INT64_MAX, INT64_MAX - 1,
                                SL_TIME_MAX_VALID + 1, SL_TIME_MIN_VALID - 1,
                                INT64_MAX - 5000};
  static const sl_window_config configs[] = {
      {.type = SL_WINDOW_TUMBLING, .size = 10000},
      {.type = SL_WINDOW_SLIDING, .size = 10000, .slide = 2000},
      {.type = SL_WINDOW_SESSION, .gap = 10000},
  };
  for (size_t b = 0; b < COUNT(bad); b++)
    for (size_t c = 0; c < COUNT(configs); c++) {
      event e[2] = {{.key = 1, .ts = 1700000000000}, {.key = 1, .ts = bad[b]}};
      if (e[1].ts < e[0].ts) {
        event t = e[0];
        e[0] = e[1];
        e[1] = t;
      }
      results got = {0};
      char error[512];
      int rc = run_window(e, 2, configs[c], 0, &got, error, sizeof error);
      cr_assert_neq(rc, 0, "time %" PRId64 " config %zu was windowed",
                    bad[b], c);
      cr_assert(strstr(error, "'win'"), "%s", error);
      char time[32];
      snprintf(time, sizeof time, "%" PRId64, bad[b]);
      cr_assert(strstr(error, time) &&
                    strstr(error, "outside the valid event times"),
                "%s", error);
      for (uint64_t i = 0; i < got.count; i++)
        cr_assert(got.items[i].start < got.items[i].end,
                  "a wrapped window came out");
      free(got.items);
    }
}

/* Spans beyond SL_TIME_SPAN_MAX are refused by the config check. */
Test(time_extremes, spans_beyond_the_limit_are_refused) {
  static const sl_window_config configs[] = {
      {.type = SL_WINDOW_TUMBLING, .size = SL_TIME_SPAN_MAX + 1},
      {.type = SL_WINDOW_SESSION, .gap = INT64_MAX},
      {.type = SL_WINDOW_TUMBLING, .size = 10, .allowed_lateness = INT64_MAX},
  };
  for (size_t c = 0; c < COUNT(configs); c++) {
    sl_job_config config = SL_JOB_CONFIG_INIT;
    sl_job *job;
    cr_assert_eq(sl_job_create(&config, &job), 0);
    feed f = {0};
    sl_op *s, *k, *w;
    cr_assert_eq(sl_op_source(job, "src", 1, &feed_ops, &f, &s), 0);
    cr_assert_eq(sl_op_key_by(job, "by-key", s, event_key, 0, &k), 0);
    sl_window_config wc = configs[c];
    wc.acc_bytes = 8;
    wc.init = count_init;
    wc.add = count_add;
    wc.merge = count_merge;
    wc.emit = count_emit;
    cr_assert_eq(sl_op_window(job, "win", k, 1, &wc, &w), EINVAL);
    cr_assert(strstr(sl_job_error(job), "SL_TIME_SPAN_MAX"), "%s",
              sl_job_error(job));
    sl_job_destroy(job);
  }
}

/* ----------------------------------------------------------- timers */

/* A keyed process that registers an event-time timer at each record's
 * time and records the times that fire, per key. */
static int timer_process(sl_ctx *ctx, void *state, int input,
                         const sl_record *in) {
  return sl_timer_register(ctx, SL_EVENT_TIME, in->timestamp);
}

static int timer_fired(sl_ctx *ctx, void *state, int domain, int64_t time) {
  uint64_t key;
  int rc = sl_ctx_key(ctx, &key);
  if (rc)
    return -rc;
  result r = {key, time, time, sl_ctx_watermark(ctx), 0};
  return sl_emit(ctx, &r, sizeof r);
}

/* Timers and watermarks over any int64 time but INT64_MIN: each timer
 * fires once, in time order per key, when the watermark (max - bound - 1,
 * saturated) reaches it or at the end (SL_WATERMARK_MAX), with no
 * overflow on the way. */
Test(time_extremes, timers_and_watermarks_at_the_int64_limits) {
  static const int64_t extremes[] = {INT64_MIN + 1, INT64_MIN + 2,
                                     SL_TIME_MIN_VALID, -1, 0,
                                     SL_TIME_MAX_VALID, INT64_MAX - 1,
                                     INT64_MAX};
  static const int64_t bounds[] = {0, 5, SL_TIME_SPAN_MAX, INT64_MAX};
  uint64_t seed = 7;
  for (size_t b = 0; b < COUNT(bounds); b++) {
    uint64_t n = COUNT(extremes) + 40;
    event *e = malloc(sizeof *e * n);
    cr_assert_not_null(e);
    for (uint64_t i = 0; i < n; i++) {
      e[i].key = rng(&seed) % 3;
      e[i].ts = i < COUNT(extremes) ? extremes[i] : (int64_t)rng(&seed);
      if (e[i].ts == INT64_MIN)
        e[i].ts = INT64_MIN + 3;
    }
    qsort(e, n, sizeof *e, event_cmp);
    sl_job_config config = SL_JOB_CONFIG_INIT;
    sl_job *job;
    cr_assert_eq(sl_job_create(&config, &job), 0);
    feed f = {.events = e, .n = n};
    sl_op *s, *k, *p, *sink;
    cr_assert_eq(sl_op_source(job, "src", 1, &feed_ops, &f, &s), 0);
    sl_watermark_config wm = {.out_of_orderness = bounds[b],
                              .every_call = 1};
    cr_assert_eq(sl_op_watermarks(s, &wm), 0);
    cr_assert_eq(sl_op_key_by(job, "by-key", s, event_key, 0, &k), 0);
    static const sl_process_ops ops = {.process = timer_process,
                                       .on_timer = timer_fired};
    cr_assert_eq(sl_op_process(job, "timers", &k, 1, 2, &ops, 0, &p), 0);
    results got = {0};
    static const sl_process_ops sink_ops = {.open = collect_open,
                                           .process = collect};
    cr_assert_eq(sl_op_sink(job, "out", p, 1, &sink_ops, &got, &sink), 0);
    cr_assert_eq(sl_job_run(job), 0, "%s", sl_job_error(job));
    sl_job_destroy(job);
    /* Reference: each distinct (key, time) once. */
    uint64_t want = 0;
    for (uint64_t i = 0; i < n; i++) {
      bool seen = false;
      for (uint64_t j = 0; j < i && !seen; j++)
        seen = e[j].key == e[i].key && e[j].ts == e[i].ts;
      want += !seen;
    }
    cr_assert_eq(got.count, want, "bound %" PRId64 ": %" PRIu64
                 " timers fired, want %" PRIu64, bounds[b], got.count, want);
    for (uint64_t i = 0; i < got.count; i++) {
      /* Fired at a watermark at or past its time. */
      cr_assert(got.items[i].count >= got.items[i].start,
                "timer %" PRId64 " fired at watermark %" PRId64,
                got.items[i].start, got.items[i].count);
      for (uint64_t j = 0; j < i; j++)
        if (got.items[j].key == got.items[i].key)
          cr_assert(got.items[j].start < got.items[i].start,
                    "timers of a key out of order");
    }
    free(got.items);
    free(e);
  }
}

/* ----------------------------------------------------------- parsers */

static int nx_parse_bid(const char *date_time, const char *channel,
                        size_t channel_bytes, char *err, size_t err_bytes) {
  static char line[4096], storage[4096];
  int n = snprintf(line, sizeof line,
                   "{\"event_type\":2,\"bid\":{\"auction\":1,\"bidder\":2,"
                   "\"price\":3,\"channel\":\"");
  memcpy(line + n, channel, channel_bytes);
  n += (int)channel_bytes;
  n += snprintf(line + n, sizeof line - (size_t)n,
                "\",\"url\":\"u\",\"date_time\":%s,\"extra\":\"\"}}",
                date_time);
  nx_event e;
  return nx_json_parse(line, (size_t)n, &e, storage, sizeof storage, err,
                       err_bytes);
}

/* INT64_MIN (no timestamp) and times outside the valid range are refused
 * in every event time field, naming it; the bounds themselves parse. */
Test(time_extremes, nexmark_parser_refuses_invalid_times) {
  char err[256];
  static const char *const refused[] = {
      "-9223372036854775808", "9223372036854775807", "9223372036854775000",
      "4611686018427387904", "-4611686018427387905"};
  for (size_t i = 0; i < COUNT(refused); i++) {
    cr_assert_eq(nx_parse_bid(refused[i], "c", 1, err, sizeof err), EINVAL,
                 "%s", refused[i]);
    cr_assert(strstr(err, "field \"date_time\": "), "%s", err);
  }
  cr_assert(nx_parse_bid("-9223372036854775808", "c", 1, err, sizeof err) &&
                strstr(err, "INT64_MIN"),
            "%s", err);
  cr_assert_eq(nx_parse_bid("4611686018427387903", "c", 1, err, sizeof err),
               0, "%s", err);
  cr_assert_eq(nx_parse_bid("-4611686018427387904", "c", 1, err, sizeof err),
               0, "%s", err);
  /* An auction's expires and a person's date_time too. */
  static char storage[4096];
  nx_event e;
  const char *auction =
      "{\"event_type\":1,\"auction\":{\"id\":1,\"item_name\":\"\","
      "\"description\":\"\",\"initial_bid\":1,\"reserve\":1,\"date_time\":5,"
      "\"expires\":-9223372036854775808,\"seller\":1,\"category\":1,"
      "\"extra\":\"\"}}";
  cr_assert_eq(nx_json_parse(auction, strlen(auction), &e, storage,
                             sizeof storage, err, sizeof err),
               EINVAL);
  cr_assert(strstr(err, "field \"expires\": "), "%s", err);
  const char *person =
      "{\"event_type\":0,\"person\":{\"id\":1,\"name\":\"\","
      "\"email_address\":\"\",\"credit_card\":\"\",\"city\":\"\","
      "\"state\":\"\",\"date_time\":9223372036854775807,\"extra\":\"\"}}";
  cr_assert_eq(nx_json_parse(person, strlen(person), &e, storage,
                             sizeof storage, err, sizeof err),
               EINVAL);
  cr_assert(strstr(err, "field \"date_time\": "), "%s", err);
}

typedef struct text_row {
  int64_t ts;
  char s[64];
} text_row;

/* The library's JSON-lines parser on {"ts":TS,"s":"TEXT"}: 0 or 1. */
static int io_parse(const char *ts, const char *text, size_t text_bytes,
                    char *reason) {
  static const sl_field fields[] = {SL_FIELD(text_row, ts, SL_FIELD_INT64),
                                    SL_FIELD(text_row, s, SL_FIELD_STRING)};
  sl_schema schema = {fields, 2, sizeof(text_row), "ts"};
  io_schema *copy;
  char err[256];
  cr_assert_eq(io_schema_copy(&schema, &copy, err, sizeof err), 0, "%s", err);
  io_parser p;
  cr_assert_eq(io_parser_init(&p, copy, SL_FORMAT_JSONL, 0), 0);
  char line[512];
  int n = snprintf(line, sizeof line, "{\"ts\":%s,\"s\":\"", ts);
  memcpy(line + n, text, text_bytes);
  n += (int)text_bytes;
  n += snprintf(line + n, sizeof line - (size_t)n, "\"}");
  text_row row;
  int64_t stamp;
  int rc = io_parse_line(&p, line, (size_t)n, &row, &stamp, reason,
                         IO_REASON_BYTES);
  io_parser_free(&p);
  io_schema_free(copy);
  return rc;
}

/* The library's file sources refuse the same times. */
Test(time_extremes, jsonl_source_refuses_invalid_times) {
  char reason[IO_REASON_BYTES];
  static const char *const refused[] = {
      "-9223372036854775808", "9223372036854775807", "9223372036854775000",
      "4611686018427387904", "-4611686018427387905"};
  for (size_t i = 0; i < COUNT(refused); i++) {
    cr_assert_eq(io_parse(refused[i], "x", 1, reason), IO_MALFORMED, "%s",
                 refused[i]);
    cr_assert(strstr(reason, "timestamp field \"ts\""), "%s", reason);
  }
  cr_assert_eq(io_parse("4611686018427387903", "x", 1, reason), IO_PARSED,
               "%s", reason);
}

/* One table of UTF-8 cases, one verdict from both parsers. */
Test(time_extremes, utf8_verdicts_agree_between_the_parsers) {
  static const struct {
    const char *bytes;
    int valid;
    const char *what;
  } table[] = {
      {"plain", 1, "ASCII"},
      {"caf\xc3\xa9", 1, "two bytes"},
      {"\xe2\x82\xac", 1, "three bytes"},
      {"\xf0\x9f\x98\x80", 1, "four bytes"},
      {"\xf4\x8f\xbf\xbf", 1, "U+10FFFF"},
      {"\xed\x9f\xbf", 1, "U+D7FF"},
      {"\xee\x80\x80", 1, "U+E000"},
      {"\\u00e9\\ud83d\\ude00", 1, "escapes with a surrogate pair"},
      {"\xc0\xaf", 0, "overlong /"},
      {"\xc1\xbf", 0, "overlong C1"},
      {"\xe0\x80\xaf", 0, "overlong three bytes"},
      {"\xf0\x80\x80\xaf", 0, "overlong four bytes"},
      {"\xed\xa0\x80", 0, "surrogate U+D800"},
      {"\xed\xbf\xbf", 0, "surrogate U+DFFF"},
      {"\xf4\x90\x80\x80", 0, "U+110000"},
      {"\xf5\x80\x80\x80", 0, "F5"},
      {"\xff", 0, "FF"},
      {"\x80", 0, "a lone continuation byte"},
      {"\xc3", 0, "truncated two bytes"},
      {"\xe2\x82", 0, "truncated three bytes"},
      {"\xf0\x9f\x98", 0, "truncated four bytes"},
      {"\xe2\x82x", 0, "a cut sequence before ASCII"},
      {"\\ud800", 0, "a lone high surrogate escape"},
      {"\\udc00", 0, "a lone low surrogate escape"},
      {"\\ud800\\u0041", 0, "a high surrogate then not a low one"},
  };
  for (size_t i = 0; i < COUNT(table); i++) {
    size_t bytes = strlen(table[i].bytes);
    char err[256], reason[IO_REASON_BYTES];
    int nexmark = nx_parse_bid("1", table[i].bytes, bytes, err, sizeof err);
    int library = io_parse("1", table[i].bytes, bytes, reason);
    cr_assert_eq(nexmark == 0, table[i].valid, "nexmark, %s: %s",
                 table[i].what, err);
    cr_assert_eq(library == IO_PARSED, table[i].valid, "library, %s: %s",
                 table[i].what, reason);
    if (!table[i].valid && table[i].bytes[0] != '\\') {
      cr_assert(strstr(err, "invalid UTF-8"), "%s: %s", table[i].what, err);
      cr_assert(strstr(reason, "invalid UTF-8"), "%s: %s", table[i].what,
                reason);
    }
  }
}

/* ----------------------------------------------------------- the CLI */

/* sluice ARGS... as a child with its output in log; an alarm set before
 * exec turns a hang into SIGALRM.  Returns the wait status. */
static int run_sluice(const char *log, const char *const *args) {
  const char *bin = getenv("SLUICE_BIN");
  cr_assert(bin && *bin, "SLUICE_BIN is not set (meson sets it)");
  const char *argv[24] = {bin};
  int n = 1;
  for (; args[n - 1]; n++)
    argv[n] = args[n - 1];
  argv[n] = NULL;
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    FILE *out = freopen(log, "w", stdout);
    if (!out || dup2(fileno(stdout), 2) < 0)
      _exit(126);
    alarm(120); /* survives exec: a hang ends in SIGALRM */
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  return status;
}

static void write_events(const char *path, const char *date_time) {
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  fprintf(f, "{\"event_type\":2,\"bid\":{\"auction\":1000,\"bidder\":1001,"
             "\"price\":669,\"channel\":\"Google\",\"url\":\"https://x\","
             "\"date_time\":1700000000000,\"extra\":\"\"}}\n");
  fprintf(f, "{\"event_type\":2,\"bid\":{\"auction\":1000,\"bidder\":1001,"
             "\"price\":670,\"channel\":\"Google\",\"url\":\"https://x\","
             "\"date_time\":%s,\"extra\":\"\"}}\n",
          date_time);
  cr_assert_eq(fclose(f), 0);
}

/* One extreme bid on line 2: q5 (which looped forever), q7 and q11 (which
 * printed wrapped windows) end at once with exit 1, naming file, line and
 * field. */
Test(time_extremes, nexmark_queries_refuse_an_extreme_bid) {
  static const char *const times[] = {"9223372036854775807",
                                      "9223372036854775000",
                                      "-9223372036854775808"};
  static const char *const queries[] = {"q5", "q7", "q11"};
  char *dir = sl_test_temp_dir("time-extremes");
  char events[512], state[512], out[512], log[512];
  snprintf(events, sizeof events, "%s/ev.jsonl", dir);
  snprintf(log, sizeof log, "%s/log", dir);
  for (size_t t = 0; t < COUNT(times); t++)
    for (size_t q = 0; q < COUNT(queries); q++) {
      write_events(events, times[t]);
      snprintf(state, sizeof state, "%s/state-%zu-%zu", dir, t, q);
      snprintf(out, sizeof out, "%s/out-%zu-%zu.csv", dir, t, q);
      const char *args[] = {"nexmark", "run", "--query", queries[q],
                            "--input", events, "--state-dir", state,
                            "--output", out, NULL};
      int status = run_sluice(log, args);
      char *text = sl_test_slurp(log);
      cr_assert(!WIFSIGNALED(status), "%s, %s: killed by signal %d (%s)",
                queries[q], times[t], WTERMSIG(status),
                WTERMSIG(status) == SIGALRM ? "a hang" : "a crash");
      cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1,
                "%s, %s: exit %d: %s", queries[q], times[t],
                WEXITSTATUS(status), text);
      cr_assert(strstr(text, "ev.jsonl line 2: field \"date_time\": "),
                "%s: %s", queries[q], text);
      free(text);
    }
  sl_test_remove_tree(dir);
}

/* Bids at the edges of the valid range are windowed correctly by the
 * queries: exit 0 and the window bounds a reference computes. */
Test(time_extremes, nexmark_queries_window_the_valid_bounds) {
  char *dir = sl_test_temp_dir("time-extremes");
  char events[512], state[512], out[512], log[512];
  snprintf(events, sizeof events, "%s/ev.jsonl", dir);
  snprintf(log, sizeof log, "%s/log", dir);
  static const int64_t edges[] = {SL_TIME_MAX_VALID, SL_TIME_MIN_VALID};
  for (size_t t = 0; t < COUNT(edges); t++) {
    char time[32];
    snprintf(time, sizeof time, "%" PRId64, edges[t]);
    write_events(events, time);
    wide start = floor_div(edges[t], 10000) * 10000;
    char want_q7[96], want_q11[96];
    snprintf(want_q7, sizeof want_q7, "%" PRId64 ",%" PRId64 ",1000,1001,670",
             (int64_t)start, (int64_t)(start + 10000));
    snprintf(want_q11, sizeof want_q11, "1001,%" PRId64 ",%" PRId64 ",1",
             edges[t], (int64_t)((wide)edges[t] + 10000));
    static const char *const queries[] = {"q5", "q7", "q11"};
    for (size_t q = 0; q < COUNT(queries); q++) {
      snprintf(state, sizeof state, "%s/state-v%zu-%zu", dir, t, q);
      snprintf(out, sizeof out, "%s/out-v%zu-%zu.csv", dir, t, q);
      const char *args[] = {"nexmark", "run", "--query", queries[q],
                            "--input", events, "--state-dir", state,
                            "--output", out, NULL};
      int status = run_sluice(log, args);
      char *text = sl_test_slurp(log);
      cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "%s at %s: status %d: %s", queries[q], time, status, text);
      free(text);
      char *rows = sl_test_slurp(out);
      cr_assert_not_null(rows);
      if (q == 1)
        cr_assert(strstr(rows, want_q7), "q7: %s, want %s", rows, want_q7);
      if (q == 2)
        cr_assert(strstr(rows, want_q11), "q11: %s, want %s", rows,
                  want_q11);
      if (q == 0) /* the edge bid's windows: count 1 each, 5 of them */
        cr_assert(strstr(rows, ",1000,1\n"), "q5: %s", rows);
      free(rows);
    }
  }
  sl_test_remove_tree(dir);
}
