/* test_nexmark.c — every Nexmark query (q0-q5, q7, q8, q11) checked against
 * an independent reference: SQLite running the query's SQL over the same
 * events.
 *
 * The events are nx_generate()'s, loaded into an in-memory SQLite database
 * (tables person, auction, bid with nexmark.h's field names).  Each query
 * has a SQL statement, written from nexmark.h's OVERVIEW (and Nexmark's own
 * SQL), that yields exactly the query's CSV line per result row; windows
 * are plain arithmetic on date_time, sessions are window functions.  The
 * sluice job (generator source -> nx_query_build -> exactly-once file sink
 * with nx_query_format) writes committed part files; their rows, sorted,
 * must equal the reference's rows, sorted, as multisets.
 *
 * Every query runs at parallelism 1, at parallelism 4, over disordered
 * events (moved back by up to 3 s, under the 4 s watermark lag, so nothing
 * is late) at parallelism 3, and with an injected failure on its last
 * operator and an in-process restore from a checkpoint at parallelism 2.
 * An event-file case writes the events with nx_json_write (with strings
 * that need JSON escaping and CSV quoting) and runs q3 and q11 from
 * nx_source_file.  An edge-case file of hand-placed events (bids on an
 * auction's bounds, a half-up rounding, ties, a session gap of exactly
 * 10 s, window edges) runs every query; there the reference must also
 * give rows computed by hand.
 *
 * The events span about 60 s of event time whatever SLUICE_TEST_SCALE
 * says (the rate follows the count), so there are always 6 tumbling
 * windows, 30 sliding ones and many sessions. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <inttypes.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nexmark.h"
#include "test_dirs.h"
#include "test_util.h"

#define EVENT_TIME_SPAN_S 60 /* event-time seconds the events cover */
#define DISORDER_MS 3000     /* below the default 4000 ms watermark lag */
#define RUN_TIMEOUT_S 120.0  /* watchdog per job */
#define MAX_PART_FILES 65536 /* bound on the files of one output dir */
#define DIFF_LINES_SHOWN 5   /* differing rows printed per side */

/* ------------------------------------------------------------ lines */

/* A growable array of NUL-terminated rows. */
typedef struct lines {
  char **items;
  size_t count, capacity;
} lines;

static void lines_add(lines *l, const char *text, size_t length) {
  if (l->count == l->capacity) {
    l->capacity = l->capacity ? l->capacity * 2 : 1024;
    l->items = realloc(l->items, l->capacity * sizeof l->items[0]);
    cr_assert(l->items);
  }
  char *copy = malloc(length + 1);
  cr_assert(copy);
  memcpy(copy, text, length);
  copy[length] = 0;
  l->items[l->count++] = copy;
}

static void lines_free(lines *l) {
  for (size_t i = 0; i < l->count; i++)
    free(l->items[i]);
  free(l->items);
  *l = (lines){0};
}

static int compare_strings(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void lines_sort(lines *l) {
  if (l->count > 1)
    qsort(l->items, l->count, sizeof l->items[0], compare_strings);
}

/* Compare got with want as multisets of rows (both get sorted).  On a
 * difference, print the first DIFF_LINES_SHOWN missing and unexpected rows
 * and fail (cr_expect: the test goes on to its other settings). */
static bool expect_same_rows(lines *got, lines *want, const char *what) {
  lines_sort(got);
  lines_sort(want);
  size_t i = 0, j = 0, missing = 0, extra = 0;
  while (i < got->count || j < want->count) {
    int c = i == got->count    ? 1
            : j == want->count ? -1
                               : strcmp(got->items[i], want->items[j]);
    if (c == 0) {
      i++, j++;
    } else if (c < 0) {
      if (extra++ < DIFF_LINES_SHOWN)
        cr_log_error("%s: unexpected row: %s", what, got->items[i]);
      i++;
    } else {
      if (missing++ < DIFF_LINES_SHOWN)
        cr_log_error("%s: missing row:    %s", what, want->items[j]);
      j++;
    }
  }
  cr_expect(missing == 0 && extra == 0,
            "%s: %zu rows, expected %zu: %zu missing, %zu unexpected", what,
            got->count, want->count, missing, extra);
  return missing == 0 && extra == 0;
}

/* ------------------------------------------------------------ events */

/* The events of a test: the generator's, optionally with person names and
 * cities rewritten to hold characters that JSON must escape and CSV must
 * quote (the event-file case), or a fixed list (the edge cases). */
typedef struct event_set {
  nx_generator_config gen;
  bool awkward_strings;
  const nx_event *fixed; /* not NULL: these events, not the generator's */
  uint64_t count;        /* events in the set */
} event_set;

/* Storage for one event of a set. */
typedef struct event_slot {
  nx_generated generated;
  char name[512], city[512];
} event_slot;

static event_set event_set_make(int64_t disorder_ms, bool awkward) {
  uint64_t n = sl_test_scaled(48000, 2400);
  event_set s = {0};
  s.gen.events = n;
  s.gen.seed = 20240917;
  s.gen.events_per_second = n / EVENT_TIME_SPAN_S;
  s.gen.max_out_of_order_ms = disorder_ms;
  s.awkward_strings = awkward;
  s.count = n;
  char err[256] = "";
  cr_assert_eq(nx_generator_validate(&s.gen, err, sizeof err), 0, "%s", err);
  return s;
}

/* Event n of set s, a view into slot. */
static const nx_event *event_get(const event_set *s, uint64_t n,
                                 event_slot *slot) {
  cr_assert_lt(n, s->count);
  if (s->fixed)
    return &s->fixed[n];
  nx_generate(&s->gen, n, &slot->generated);
  nx_event *e = &slot->generated.event;
  cr_assert_eq(e->type, nx_event_type(n));
  if (!s->awkward_strings || e->type != NX_PERSON || e->u.person.id % 3)
    return e;
  nx_person *p = &e->u.person;
  int a = snprintf(slot->name, sizeof slot->name,
                   "%.*s, \"Jr.\" \\ Zo\xc3\xab", (int)p->name.len,
                   p->name.ptr);
  int b = snprintf(slot->city, sizeof slot->city, "%.*s\t\"Old\" Town, 5/8",
                   (int)p->city.len, p->city.ptr);
  cr_assert(a > 0 && (size_t)a < sizeof slot->name);
  cr_assert(b > 0 && (size_t)b < sizeof slot->city);
  p->name = (nx_str){slot->name, (uint32_t)a};
  p->city = (nx_str){slot->city, (uint32_t)b};
  return e;
}

/* ------------------------------------------------------------ SQLite */

/* csv(text): the RFC 4180 cell of text, quoted (quotes doubled) when it
 * holds a comma, a quote or a line break. */
static void csv_function(sqlite3_context *ctx, int argc, sqlite3_value **v) {
  cr_assert_eq(argc, 1);
  const char *text = (const char *)sqlite3_value_text(v[0]);
  int n = sqlite3_value_bytes(v[0]);
  if (!text) {
    sqlite3_result_text(ctx, "", 0, SQLITE_STATIC);
    return;
  }
  if (strcspn(text, ",\"\r\n") == (size_t)n) {
    sqlite3_result_text(ctx, text, n, SQLITE_TRANSIENT);
    return;
  }
  char *out = malloc(2 * (size_t)n + 2);
  cr_assert(out);
  size_t k = 0;
  out[k++] = '"';
  for (int i = 0; i < n; i++) {
    if (text[i] == '"')
      out[k++] = '"';
    out[k++] = text[i];
  }
  out[k++] = '"';
  sqlite3_result_text(ctx, out, (int)k, free);
}

static void sql_exec(sqlite3 *db, const char *sql) {
  char *err = NULL;
  int rc = sqlite3_exec(db, sql, NULL, NULL, &err);
  cr_assert_eq(rc, SQLITE_OK, "%s: %s", sql, err ? err : "?");
}

static sqlite3_stmt *sql_prepare(sqlite3 *db, const char *sql) {
  sqlite3_stmt *st = NULL;
  int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
  cr_assert_eq(rc, SQLITE_OK, "prepare: %s\n%s", sqlite3_errmsg(db), sql);
  return st;
}

static sqlite3 *db_open(void) {
  sqlite3 *db = NULL;
  cr_assert_eq(sqlite3_open(":memory:", &db), SQLITE_OK);
  sql_exec(db, "CREATE TABLE person (id INTEGER, name TEXT, email_address "
               "TEXT, credit_card TEXT, city TEXT, state TEXT, date_time "
               "INTEGER, extra TEXT);"
               "CREATE TABLE auction (id INTEGER, item_name TEXT, description "
               "TEXT, initial_bid INTEGER, reserve INTEGER, date_time INTEGER, "
               "expires INTEGER, seller INTEGER, category INTEGER, extra "
               "TEXT);"
               "CREATE TABLE bid (auction INTEGER, bidder INTEGER, price "
               "INTEGER, channel TEXT, url TEXT, date_time INTEGER, extra "
               "TEXT);");
  int rc = sqlite3_create_function(db, "csv", 1,
                                   SQLITE_UTF8 | SQLITE_DETERMINISTIC, NULL,
                                   csv_function, NULL, NULL);
  cr_assert_eq(rc, SQLITE_OK);
  return db;
}

static void bind_int(sqlite3_stmt *st, int column, int64_t value) {
  cr_assert_eq(sqlite3_bind_int64(st, column, value), SQLITE_OK);
}

static void bind_str(sqlite3_stmt *st, int column, nx_str s) {
  /* An empty string may come with a NULL pointer: bind "" (not NULL). */
  int rc = sqlite3_bind_text(st, column, s.ptr ? s.ptr : "", (int)s.len,
                             SQLITE_STATIC);
  cr_assert_eq(rc, SQLITE_OK);
}

static void step_done(sqlite3_stmt *st) {
  cr_assert_eq(sqlite3_step(st), SQLITE_DONE);
  cr_assert_eq(sqlite3_reset(st), SQLITE_OK);
}

static void insert_event(sqlite3_stmt *const st[3], const nx_event *e) {
  if (e->type == NX_PERSON) {
    const nx_person *p = &e->u.person;
    bind_int(st[0], 1, p->id);
    bind_str(st[0], 2, p->name);
    bind_str(st[0], 3, p->email_address);
    bind_str(st[0], 4, p->credit_card);
    bind_str(st[0], 5, p->city);
    bind_str(st[0], 6, p->state);
    bind_int(st[0], 7, p->date_time);
    bind_str(st[0], 8, p->extra);
    step_done(st[0]);
  } else if (e->type == NX_AUCTION) {
    const nx_auction *a = &e->u.auction;
    bind_int(st[1], 1, a->id);
    bind_str(st[1], 2, a->item_name);
    bind_str(st[1], 3, a->description);
    bind_int(st[1], 4, a->initial_bid);
    bind_int(st[1], 5, a->reserve);
    bind_int(st[1], 6, a->date_time);
    bind_int(st[1], 7, a->expires);
    bind_int(st[1], 8, a->seller);
    bind_int(st[1], 9, a->category);
    bind_str(st[1], 10, a->extra);
    step_done(st[1]);
  } else {
    cr_assert_eq(e->type, NX_BID);
    const nx_bid *b = &e->u.bid;
    bind_int(st[2], 1, b->auction);
    bind_int(st[2], 2, b->bidder);
    bind_int(st[2], 3, b->price);
    bind_str(st[2], 4, b->channel);
    bind_str(st[2], 5, b->url);
    bind_int(st[2], 6, b->date_time);
    bind_str(st[2], 7, b->extra);
    step_done(st[2]);
  }
}

/* A database holding every event of s, loaded in one transaction. */
static sqlite3 *db_load(const event_set *s) {
  sqlite3 *db = db_open();
  sqlite3_stmt *st[3] = {
      sql_prepare(db, "INSERT INTO person VALUES (?,?,?,?,?,?,?,?)"),
      sql_prepare(db, "INSERT INTO auction VALUES (?,?,?,?,?,?,?,?,?,?)"),
      sql_prepare(db, "INSERT INTO bid VALUES (?,?,?,?,?,?,?)")};
  event_slot *slot = malloc(sizeof *slot);
  cr_assert(slot);
  sql_exec(db, "BEGIN");
  for (uint64_t n = 0; n < s->count; n++)
    insert_event(st, event_get(s, n, slot));
  sql_exec(db, "COMMIT");
  for (int i = 0; i < 3; i++)
    sqlite3_finalize(st[i]);
  free(slot);
  return db;
}

/* The reference SQL of each query: one text column, the CSV line.
 *
 * Windows: tumbling 10 s windows start at date_time - date_time % 10000;
 * a bid lies in the 5 sliding windows (10 s every 2 s) that start at
 * date_time - date_time % 2000 - k * 2000, k = 0 .. 4 (date_time is a
 * positive epoch time, so % is the floor remainder).  Sessions: a bid
 * starts one when it is its bidder's first or comes 10 s or more after the
 * previous one; a running sum of those starts numbers the sessions (the
 * default RANGE frame gives tied date_times the same number).  Decimals
 * are integer arithmetic: q1's 0.908 x price is price * 908 / 1000 with
 * the remainder as 3 digits; q4's average is rounded half up from the
 * integer sum and count, floor((2000 sum + n) / 2n) thousandths. */
static const char *const reference_sql[NX_Q11 + 1] = {
    [NX_Q0] = "SELECT auction || ',' || bidder || ',' || price || ',' || "
              "date_time FROM bid",
    [NX_Q1] = "SELECT auction || ',' || bidder || ',' || "
              "(price * 908 / 1000) || '.' || "
              "printf('%03d', price * 908 % 1000) || ',' || date_time "
              "FROM bid",
    [NX_Q2] = "SELECT auction || ',' || price FROM bid "
              "WHERE auction % 123 = 0",
    [NX_Q3] = "SELECT csv(P.name) || ',' || csv(P.city) || ',' || "
              "csv(P.state) || ',' || A.id "
              "FROM auction A JOIN person P ON A.seller = P.id "
              "WHERE A.category = 10 AND P.state IN ('OR', 'ID', 'CA')",
    [NX_Q4] = "WITH winning AS ("
              " SELECT A.id, A.category, MAX(B.price) AS final"
              " FROM auction A JOIN bid B ON B.auction = A.id"
              " WHERE B.date_time BETWEEN A.date_time AND A.expires"
              " GROUP BY A.id, A.category),"
              "per_category AS ("
              " SELECT category, SUM(final) AS total, COUNT(*) AS n"
              " FROM winning GROUP BY category),"
              "rounded AS ("
              " SELECT category, (2000 * total + n) / (2 * n) AS milli,"
              "  typeof(2000 * total + n) = 'integer' AS exact"
              " FROM per_category) "
              "SELECT CASE WHEN exact THEN category || ',' || "
              " (milli / 1000) || '.' || printf('%03d', milli % 1000)"
              " ELSE 'integer overflow in the reference' END FROM rounded",
    [NX_Q5] = "WITH k(k) AS (VALUES (0), (1), (2), (3), (4)),"
              "counts AS ("
              " SELECT date_time - date_time % 2000 - k * 2000 AS ws,"
              "  auction, COUNT(*) AS num"
              " FROM bid, k GROUP BY ws, auction),"
              "most AS (SELECT ws, MAX(num) AS num FROM counts GROUP BY ws) "
              "SELECT C.ws || ',' || (C.ws + 10000) || ',' || C.auction || "
              " ',' || C.num "
              "FROM counts C JOIN most M ON C.ws = M.ws AND C.num = M.num",
    [NX_Q7] = "WITH highest AS ("
              " SELECT date_time - date_time % 10000 AS ws,"
              "  MAX(price) AS price"
              " FROM bid GROUP BY ws) "
              "SELECT H.ws || ',' || (H.ws + 10000) || ',' || B.auction || "
              " ',' || B.bidder || ',' || B.price || ',' || B.date_time "
              "FROM bid B JOIN highest H"
              " ON B.date_time - B.date_time % 10000 = H.ws"
              " AND B.price = H.price",
    [NX_Q8] = "SELECT DISTINCT P.ws || ',' || (P.ws + 10000) || ',' || "
              " P.id || ',' || csv(P.name) "
              "FROM (SELECT id, name, date_time - date_time % 10000 AS ws"
              "      FROM person) P "
              "JOIN (SELECT seller, date_time - date_time % 10000 AS ws"
              "      FROM auction) A "
              "ON P.id = A.seller AND P.ws = A.ws",
    [NX_Q11] = "WITH marked AS ("
               " SELECT bidder, date_time,"
               "  CASE WHEN LAG(date_time) OVER w IS NULL"
               "    OR date_time - LAG(date_time) OVER w >= 10000"
               "  THEN 1 ELSE 0 END AS starts"
               " FROM bid"
               " WINDOW w AS (PARTITION BY bidder ORDER BY date_time)),"
               "numbered AS ("
               " SELECT bidder, date_time, SUM(starts) OVER"
               "  (PARTITION BY bidder ORDER BY date_time) AS session"
               " FROM marked) "
               "SELECT bidder || ',' || MIN(date_time) || ',' || "
               " (MAX(date_time) + 10000) || ',' || COUNT(*) "
               "FROM numbered GROUP BY bidder, session",
};

/* The rows of query q over the events in db. */
static lines reference_rows(sqlite3 *db, int q) {
  cr_assert(q >= 0 && q <= NX_Q11 && reference_sql[q], "no SQL for q%d", q);
  sqlite3_stmt *st = sql_prepare(db, reference_sql[q]);
  lines out = {0};
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    const unsigned char *text = sqlite3_column_text(st, 0);
    cr_assert(text, "q%d: the reference gave a NULL row", q);
    lines_add(&out, (const char *)text, (size_t)sqlite3_column_bytes(st, 0));
  }
  cr_assert_eq(rc, SQLITE_DONE, "q%d: %s", q, sqlite3_errmsg(db));
  sqlite3_finalize(st);
  return out;
}

/* A count from the reference database. */
static int64_t sql_count(sqlite3 *db, const char *sql) {
  sqlite3_stmt *st = sql_prepare(db, sql);
  cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
  int64_t n = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  return n;
}

/* The least number of reference rows that makes query q a meaningful test
 * over `events` events spanning EVENT_TIME_SPAN_S: well below what the
 * generator gives at any scale (a third of it or less), so only a broken
 * generator or reference falls short. */
static size_t min_reference_rows(int q, uint64_t events) {
  uint64_t bids = events * NX_BID_PROPORTION / NX_TOTAL_PROPORTION;
  switch (q) {
  case NX_Q0:
  case NX_Q1:
    return (size_t)bids;
  case NX_Q2:
    return (size_t)(events / 1000);
  case NX_Q3:
    return (size_t)(events / 500);
  case NX_Q4:
    return NX_CATEGORIES;
  case NX_Q5:
    return EVENT_TIME_SPAN_S / 2; /* at least one row per sliding window */
  case NX_Q7:
    return EVENT_TIME_SPAN_S / 10; /* at least one row per tumbling window */
  case NX_Q8:
    return (size_t)(events / 1000 > 5 ? events / 1000 : 5);
  case NX_Q11:
    return (size_t)(events / 100);
  default:
    cr_assert_fail("no bound for query %d", q);
    return 0;
  }
}

/* ------------------------------------------------------------ output */

static char *read_whole_file(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  cr_assert(f, "cannot open %s", path);
  cr_assert_eq(fseek(f, 0, SEEK_END), 0);
  long n = ftell(f);
  cr_assert_geq(n, 0);
  cr_assert_eq(fseek(f, 0, SEEK_SET), 0);
  char *data = malloc((size_t)n + 1);
  cr_assert(data);
  cr_assert_eq(fread(data, 1, (size_t)n, f), (size_t)n);
  data[n] = 0;
  fclose(f);
  *size = (size_t)n;
  return data;
}

/* The rows of one committed part: its first line must be the header. */
static void read_part(const char *path, const char *header, lines *out) {
  size_t size = 0;
  char *data = read_whole_file(path, &size);
  size_t h = strlen(header);
  cr_assert(size > h && memcmp(data, header, h) == 0 && data[h] == '\n',
            "%s does not start with the header line \"%s\"", path, header);
  cr_assert(data[size - 1] == '\n', "%s does not end with a newline", path);
  for (size_t at = h + 1; at < size;) {
    size_t length = strcspn(data + at, "\n");
    lines_add(out, data + at, length);
    at += length + 1;
  }
  free(data);
}

/* Every row the sink committed in dir; *pending counts uncommitted
 * parts left behind. */
static lines read_committed(const char *dir, const char *header,
                            int *pending) {
  DIR *d = opendir(dir);
  cr_assert(d, "opendir %s", dir);
  lines out = {0};
  struct dirent *e;
  int files = 0;
  *pending = 0;
  while ((e = readdir(d))) {
    cr_assert_lt(files, MAX_PART_FILES);
    files++;
    if (strncmp(e->d_name, ".part-", 6) == 0)
      (*pending)++;
    if (strncmp(e->d_name, "part-", 5) != 0)
      continue;
    char *path = sl_test_path_in(dir, e->d_name);
    read_part(path, header, &out);
    free(path);
  }
  closedir(d);
  return out;
}

/* ------------------------------------------------------------ jobs */

/* One run of a query. */
typedef struct run_spec {
  const char *label; /* for messages: "q5 p4" */
  int query;
  int parallelism;
  const event_set *events; /* the generator's config, or ... */
  const char *event_file;  /* ... a JSON-lines file (source at p1) */
  uint64_t rate_limit;     /* events/s per source instance, 0: none */
  bool checkpoints;        /* every 20 ms, restart on failure */
  const char *faults;      /* NULL: none */
} run_spec;

typedef struct run_result {
  lines rows;
  uint32_t restarts;
  uint64_t faults_fired;
  sl_recovery_stats recovery; /* the newest failover, if restarts */
  uint64_t late_records;      /* summed over the operators */
  char last_query_op[SL_MAX_NAME]; /* the query's last operator */
  uint64_t last_query_op_records_in;
} run_result;

static sl_job *build_job(const run_spec *s, const char *out_dir,
                         const char *state_dir) {
  sl_job_config c = SL_JOB_CONFIG_INIT;
  if (s->checkpoints) {
    c.checkpoint.state_dir = state_dir;
    c.checkpoint.interval_ms = 20;
    c.checkpoint.no_sync = 1; /* a process crash loses nothing */
    c.restart = sl_restart_defaults(SL_RESTART_FIXED_DELAY);
    c.restart.delay_ms = 0;
    c.restart.attempts = 3;
  }
  c.faults = s->faults;
  sl_job *job = NULL;
  cr_assert_eq(sl_job_create(&c, &job), 0);
  nx_source_config source = {.events_per_second_limit = s->rate_limit};
  sl_op *events = NULL, *result = NULL, *sink = NULL;
  int rc = s->event_file
               ? nx_source_file(job, "events", &s->event_file, 1, &source,
                                &events)
               : nx_source_generator(job, "events", s->parallelism,
                                     &s->events->gen, &source, &events);
  cr_assert_eq(rc, 0, "%s: source: %s", s->label, sl_job_error(job));
  rc = nx_query_build(job, s->query, events, s->parallelism, &result);
  cr_assert_eq(rc, 0, "%s: query: %s", s->label, sl_job_error(job));
  sl_file_sink_config f = {.dir = out_dir,
                           .exactly_once = 1,
                           .format = nx_query_format,
                           .format_user = (void *)(intptr_t)s->query,
                           .header = nx_query_header(s->query)};
  cr_assert(f.header, "q%d has no header", s->query);
  rc = sl_sink_file(job, "sink", result, s->parallelism, &f, &sink);
  cr_assert_eq(rc, 0, "%s: sink: %s", s->label, sl_job_error(job));
  return job;
}

/* The statistics the checks use: late records, and the last operator
 * (creation order) whose name starts with "qN.". */
static void collect_stats(sl_job *job, int q, run_result *r) {
  char prefix[16];
  snprintf(prefix, sizeof prefix, "q%d.", q);
  int count = sl_job_operator_count(job);
  cr_assert_gt(count, 0);
  for (int i = 0; i < count; i++) {
    sl_op_stats st;
    cr_assert_eq(sl_job_stats(job, i, &st), 0);
    r->late_records += st.late_records;
    if (strncmp(st.name, prefix, strlen(prefix)) == 0) {
      snprintf(r->last_query_op, sizeof r->last_query_op, "%s", st.name);
      r->last_query_op_records_in = st.records_in;
    }
  }
  cr_assert(r->last_query_op[0], "no operator is named %s...", prefix);
}

/* Build, run to the end (under a watchdog) and read the committed rows. */
static run_result run_query(const run_spec *s) {
  char *tmp = sl_test_temp_dir("nexmark");
  char *out_dir = sl_test_path_in(tmp, "out");
  char *state_dir = sl_test_path_in(tmp, "state");
  sl_job *job = build_job(s, out_dir, state_dir);
  sl_test_watchdog w;
  cr_assert_eq(sl_test_watchdog_arm(&w, job, RUN_TIMEOUT_S, s->label), 0);
  double start_s = sl_test_now_s();
  int rc = sl_job_run(job);
  double took_s = sl_test_now_s() - start_s;
  cr_assert_not(sl_test_watchdog_disarm(&w), "%s hung", s->label);
  cr_assert_eq(rc, 0, "%s failed: %s", s->label, sl_job_error(job));
  run_result r = {0};
  r.restarts = sl_job_restarts(job);
  r.faults_fired = sl_job_faults_fired(job);
  if (r.restarts > 0)
    cr_assert_eq(sl_job_recovery_stats(job, 0, &r.recovery), 0);
  collect_stats(job, s->query, &r);
  sl_job_destroy(job);
  int pending = 0;
  r.rows = read_committed(out_dir, nx_query_header(s->query), &pending);
  cr_expect_eq(pending, 0, "%s: %d uncommitted parts left", s->label,
               pending);
  cr_log_info("%s: %zu rows in %.2f s, %u restarts (restored checkpoint "
              "%" PRIu64 ")", s->label, r.rows.count, took_s, r.restarts,
              r.recovery.restored_from);
  free(out_dir);
  free(state_dir);
  sl_test_remove_tree(tmp);
  return r;
}

/* Run s and compare its rows with want; no record may be late. */
static run_result run_and_compare(const run_spec *s, lines *want) {
  run_result r = run_query(s);
  expect_same_rows(&r.rows, want, s->label);
  cr_expect_eq(r.late_records, 0, "%s: %" PRIu64 " late records", s->label,
               r.late_records);
  return r;
}

/* ------------------------------------------------------------ checks */

/* The reference rows of q over s, checked to be plenty. */
static lines reference_for(const event_set *s, int q, const char *what) {
  sqlite3 *db = db_load(s);
  cr_assert_eq(sql_count(db, "SELECT COUNT(*) FROM person") +
                   sql_count(db, "SELECT COUNT(*) FROM auction") +
                   sql_count(db, "SELECT COUNT(*) FROM bid"),
               (int64_t)s->count);
  lines want = reference_rows(db, q);
  sqlite3_close(db);
  size_t least = min_reference_rows(q, s->count);
  cr_assert_geq(want.count, least,
                "q%d (%s): the reference has %zu rows, fewer than the %zu "
                "that make a meaningful test", q, what, want.count, least);
  cr_log_info("q%d (%s): the reference has %zu rows over %" PRIu64
              " events", q, what, want.count, s->count);
  return want;
}

/* A failure on the query's last operator halfway through its input, with
 * checkpoints every 20 ms and the source slowed to about a second, so the
 * restore comes from a real checkpoint. */
static void check_failover(int q, const event_set *s, lines *want,
                           const run_result *first) {
  enum { parallelism = 2 };
  uint64_t record = first->last_query_op_records_in / (2 * parallelism);
  char faults[128];
  snprintf(faults, sizeof faults, "fail:op=%s,record=%" PRIu64,
           first->last_query_op, record > 0 ? record : 1);
  char label[192];
  snprintf(label, sizeof label, "q%d p%d disorder, %s", q, parallelism,
           faults);
  run_spec spec = {.label = label,
                   .query = q,
                   .parallelism = parallelism,
                   .events = s,
                   .rate_limit = s->count / parallelism,
                   .checkpoints = true,
                   .faults = faults};
  run_result r = run_and_compare(&spec, want);
  cr_expect_eq(r.faults_fired, 1, "%s: %" PRIu64 " faults fired", label,
               r.faults_fired);
  cr_expect_eq(r.restarts, 1, "%s: %u restarts", label, r.restarts);
  if (r.restarts > 0) {
    cr_expect_gt(r.recovery.restored_from, 0,
                 "%s: restored from no checkpoint (%s)", label,
                 r.recovery.cause);
    cr_expect(strstr(r.recovery.cause, "injected fault") != NULL,
              "%s: the failover's cause: %s", label, r.recovery.cause);
  }
  lines_free(&r.rows);
}

/* Query q at parallelism 1 and 4, over disordered events at 3, and with a
 * failure and restore at 2. */
static void check_query(int q) {
  event_set ordered = event_set_make(0, false);
  lines want = reference_for(&ordered, q, "ordered");
  char label[64];
  run_result first = {0};
  int settings[2] = {1, 4};
  for (int i = 0; i < 2; i++) {
    snprintf(label, sizeof label, "q%d p%d", q, settings[i]);
    run_spec spec = {.label = label, .query = q,
                     .parallelism = settings[i], .events = &ordered};
    run_result r = run_and_compare(&spec, &want);
    if (i == 0)
      first = r;
    else
      lines_free(&r.rows);
  }
  lines_free(&first.rows);
  lines_free(&want);

  event_set disordered = event_set_make(DISORDER_MS, false);
  want = reference_for(&disordered, q, "disordered");
  snprintf(label, sizeof label, "q%d p3 disorder", q);
  run_spec spec = {.label = label, .query = q, .parallelism = 3,
                   .events = &disordered};
  run_result r = run_and_compare(&spec, &want);
  lines_free(&r.rows);
  check_failover(q, &disordered, &want, &first);
  lines_free(&want);
}

Test(nexmark, q0_pass_through) { check_query(NX_Q0); }
Test(nexmark, q1_currency_conversion) { check_query(NX_Q1); }
Test(nexmark, q2_selection) { check_query(NX_Q2); }
Test(nexmark, q3_local_item_suggestion) { check_query(NX_Q3); }
Test(nexmark, q4_average_price_per_category) { check_query(NX_Q4); }
Test(nexmark, q5_hot_items) { check_query(NX_Q5); }
Test(nexmark, q7_highest_bid) { check_query(NX_Q7); }
Test(nexmark, q8_monitor_new_users) { check_query(NX_Q8); }
Test(nexmark, q11_user_sessions) { check_query(NX_Q11); }

/* ------------------------------------------------------------ event file */

/* The events of s as JSON lines in path. */
static void write_event_file(const event_set *s, const char *path) {
  FILE *f = fopen(path, "wb");
  cr_assert(f, "cannot create %s", path);
  event_slot *slot = malloc(sizeof *slot);
  size_t capacity = 65536;
  char *buffer = malloc(capacity);
  cr_assert(slot && buffer);
  for (uint64_t n = 0; n < s->count; n++) {
    const nx_event *e = event_get(s, n, slot);
    size_t length = nx_json_write(e, buffer, capacity);
    cr_assert(length > 1 && length <= capacity, "event %" PRIu64 ": %zu",
              n, length);
    cr_assert_eq(buffer[length - 1], '\n');
    cr_assert_eq(fwrite(buffer, 1, length, f), length);
  }
  cr_assert_eq(fclose(f), 0);
  free(buffer);
  free(slot);
}

/* Events with names and cities that JSON escapes and CSV quotes, through a
 * JSON-lines file: q3 (which prints them) at parallelism 1 and q11 (event
 * time from the file) at 2, against the reference over the same events. */
Test(nexmark, event_file_source) {
  event_set s = event_set_make(DISORDER_MS, true);
  char *tmp = sl_test_temp_dir("nexmark-file");
  char *path = sl_test_path_in(tmp, "events.json");
  write_event_file(&s, path);
  sqlite3 *db = db_load(&s);
  cr_assert_gt(sql_count(db, "SELECT COUNT(*) FROM person WHERE name "
                             "LIKE '%\"Jr.\"%' AND state IN ('OR','ID','CA')"),
               0);
  int queries[2] = {NX_Q3, NX_Q11};
  int parallelism[2] = {1, 2};
  for (int i = 0; i < 2; i++) {
    lines want = reference_rows(db, queries[i]);
    cr_assert_geq(want.count, min_reference_rows(queries[i], s.count));
    size_t quoted = 0; /* q3 rows that print a rewritten name, quoted */
    for (size_t k = 0; k < want.count; k++)
      quoted += strstr(want.items[k], "\"\"Jr.\"\"") != NULL;
    cr_assert(queries[i] != NX_Q3 || quoted > 0, "no q3 row quotes a name");
    char label[64];
    snprintf(label, sizeof label, "q%d p%d from an event file", queries[i],
             parallelism[i]);
    run_spec spec = {.label = label, .query = queries[i],
                     .parallelism = parallelism[i], .event_file = path};
    run_result r = run_and_compare(&spec, &want);
    lines_free(&r.rows);
    lines_free(&want);
  }
  sqlite3_close(db);
  free(path);
  sl_test_remove_tree(tmp);
}

/* ------------------------------------------------------------ edge cases */

#define EDGE_BASE_MS 1700000000000 /* a tumbling and sliding window start */
#define EDGE_MAX_EVENTS 64
#define S(text) ((nx_str){text, sizeof text - 1})

typedef struct edge_list {
  nx_event events[EDGE_MAX_EVENTS];
  size_t count;
} edge_list;

/* The string fields not set below stay zero views {NULL, 0}: empty
 * strings, as nx_encode accepts them. */
static nx_event *edge_add(edge_list *l, int type) {
  cr_assert_lt(l->count, EDGE_MAX_EVENTS);
  nx_event *e = &l->events[l->count++];
  *e = (nx_event){.type = type};
  return e;
}

static void edge_person(edge_list *l, int64_t id, nx_str name, nx_str state,
                        int64_t at_ms) {
  nx_person *p = &edge_add(l, NX_PERSON)->u.person;
  *p = (nx_person){.id = id, .name = name, .email_address = S("a@b.c"),
                   .credit_card = S("1234 5678"), .city = S("Bend"),
                   .state = state, .date_time = EDGE_BASE_MS + at_ms};
}

static void edge_auction(edge_list *l, int64_t id, int64_t seller,
                         int64_t category, int64_t at_ms, int64_t expires_ms) {
  nx_auction *a = &edge_add(l, NX_AUCTION)->u.auction;
  *a = (nx_auction){.id = id, .item_name = S("lamp"), .description = S("old"),
                    .initial_bid = 1, .reserve = 2,
                    .date_time = EDGE_BASE_MS + at_ms,
                    .expires = EDGE_BASE_MS + expires_ms, .seller = seller,
                    .category = category};
}

static void edge_bid(edge_list *l, int64_t auction, int64_t bidder,
                     int64_t price, int64_t at_ms) {
  nx_bid *b = &edge_add(l, NX_BID)->u.bid;
  *b = (nx_bid){.auction = auction, .bidder = bidder, .price = price,
                .channel = S("web"), .url = S("http://x/y"),
                .date_time = EDGE_BASE_MS + at_ms};
}

static int64_t event_time(const nx_event *e) {
  return e->type == NX_PERSON    ? e->u.person.date_time
         : e->type == NX_AUCTION ? e->u.auction.date_time
                                 : e->u.bid.date_time;
}

/* Events placed on the boundaries the queries must get right (times in ms
 * after EDGE_BASE_MS; see the expected rows in edge_cases_from_an_event_file),
 * in date_time order, ties in the order written. */
static void edge_events(edge_list *l) {
  edge_person(l, 1000, S("Ann \"A\", Jr."), S("OR"), 1);
  edge_person(l, 1001, S("Bo"), S("CA"), 9999);
  edge_person(l, 1002, S("Cy"), S("WA"), 10000);
  edge_person(l, 1003, S("Di"), S("ID"), 15000);
  /* q4: bids at the auction's start and expiry count, before and after
   * do not: category 10 averages 20. */
  edge_bid(l, 1000, 2001, 5, 99);
  edge_auction(l, 1000, 1000, 10, 100, 5000);
  edge_bid(l, 1000, 2001, 10, 100);
  edge_bid(l, 1000, 2001, 20, 5000);
  edge_bid(l, 1000, 2001, 50, 5001);
  /* q4: category 12 averages 17 / 16 = 1.0625, 1.063 rounded half up. */
  for (int64_t i = 0; i < 16; i++)
    edge_auction(l, 1100 + i, 1003, 12, 200, 30000);
  for (int64_t i = 0; i < 16; i++)
    edge_bid(l, 1100 + i, 2002, i == 0 ? 2 : 1, 300);
  /* q7: two bids share window 0's highest price. */
  edge_auction(l, 1001, 1002, 13, 50, 60000);
  edge_bid(l, 1001, 2003, 1000000, 4000);
  edge_bid(l, 1001, 2004, 1000000, 9999);
  /* q8: 1000 and 1001 sell in their window 0; 1002 twice in window 1
   * (one row); 1003 not in its window.  q3: sellers in OR, CA, ID; WA is
   * left out. */
  edge_auction(l, 1002, 1001, 10, 9999, 20000);
  edge_auction(l, 1003, 1002, 10, 10000, 20000);
  edge_auction(l, 1004, 1002, 11, 19999, 25000);
  edge_auction(l, 1005, 1003, 10, 20000, 25000);
  /* q11: a gap of exactly 10 s opens a session, 9.999 s does not. */
  edge_bid(l, 1001, 2000, 7, 1000);
  edge_bid(l, 1001, 2000, 7, 11000);
  edge_bid(l, 1001, 2000, 7, 20999);
  /* q5: alone in their windows, two auctions tie at 3 bids. */
  for (int64_t i = 0; i < 6; i++)
    edge_bid(l, 1200 + i % 2, 2005, 3, 40000 + 100 * i);
  for (size_t i = 1; i < l->count; i++) /* stable insertion sort by time */
    for (size_t j = i; j > 0 && event_time(&l->events[j - 1]) >
                                    event_time(&l->events[j]); j--) {
      nx_event t = l->events[j];
      l->events[j] = l->events[j - 1];
      l->events[j - 1] = t;
    }
}

static bool lines_contain(const lines *l, const char *row) {
  for (size_t i = 0; i < l->count; i++)
    if (strcmp(l->items[i], row) == 0)
      return true;
  return false;
}

/* The rows hand-computed from edge_events(), which the reference must give
 * (a check of the reference itself), and how many rows it gives in all
 * (SIZE_MAX: not counted). */
typedef struct edge_expectation {
  int query;
  size_t rows;
  const char *must[4];
} edge_expectation;

static const edge_expectation edge_expected[] = {
    {NX_Q1, SIZE_MAX, {"1001,2000,6.356,1700000001000",
                       "1001,2003,908000.000,1700000004000"}},
    {NX_Q2, 1, {"1107,1"}},
    {NX_Q3, 3, {"\"Ann \"\"A\"\", Jr.\",Bend,OR,1000", "Bo,Bend,CA,1002",
                "Di,Bend,ID,1005"}},
    {NX_Q4, 3, {"10,20.000", "12,1.063", "13,1000000.000"}},
    {NX_Q5, SIZE_MAX, {"1700000032000,1700000042000,1200,3",
                       "1700000032000,1700000042000,1201,3"}},
    {NX_Q7, SIZE_MAX, {"1700000000000,1700000010000,1001,2003,1000000,"
                       "1700000004000",
                       "1700000000000,1700000010000,1001,2004,1000000,"
                       "1700000009999"}},
    {NX_Q8, 3, {"1700000000000,1700000010000,1000,\"Ann \"\"A\"\", Jr.\"",
                "1700000000000,1700000010000,1001,Bo",
                "1700000010000,1700000020000,1002,Cy"}},
    {NX_Q11, SIZE_MAX, {"2000,1700000001000,1700000011000,1",
                        "2000,1700000011000,1700000030999,2"}},
};

static void check_edge_reference(int q, const lines *want) {
  size_t n = sizeof edge_expected / sizeof edge_expected[0];
  for (size_t i = 0; i < n; i++) {
    const edge_expectation *x = &edge_expected[i];
    if (x->query != q)
      continue;
    cr_assert(x->rows == SIZE_MAX || want->count == x->rows,
              "q%d edge reference: %zu rows, expected %zu", q, want->count,
              x->rows);
    for (int k = 0; k < 4 && x->must[k]; k++)
      cr_assert(lines_contain(want, x->must[k]),
                "q%d edge reference lacks %s", q, x->must[k]);
  }
}

/* Hand-placed events on the boundaries (inclusive auction bounds, half-up
 * rounding, ties for the highest bid and for the hottest auction, a
 * session gap of exactly 10 s, window edges, quoting) through an event
 * file: every query at parallelism 2 against the reference. */
Test(nexmark, edge_cases_from_an_event_file) {
  edge_list *l = calloc(1, sizeof *l);
  cr_assert(l);
  edge_events(l);
  event_set s = {.fixed = l->events, .count = l->count};
  char *tmp = sl_test_temp_dir("nexmark-edges");
  char *path = sl_test_path_in(tmp, "edges.json");
  write_event_file(&s, path);
  sqlite3 *db = db_load(&s);
  for (int i = 0; i < nx_query_count(); i++) {
    int q = nx_query_at(i);
    lines want = reference_rows(db, q);
    check_edge_reference(q, &want);
    char label[64];
    snprintf(label, sizeof label, "q%d p2 edge cases", q);
    run_spec spec = {.label = label, .query = q, .parallelism = 2,
                     .event_file = path};
    run_result r = run_and_compare(&spec, &want);
    lines_free(&r.rows);
    lines_free(&want);
  }
  sqlite3_close(db);
  free(path);
  sl_test_remove_tree(tmp);
  free(l);
}
