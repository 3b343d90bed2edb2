/* io_fixtures.h — what test_io.c and test_io_stdio.c share: the trade
 * record and its schemas, the test's own printing and escaping of the
 * expected output (text), input and output files, the file-to-file
 * pipeline they run, and a sink that captures timestamps.
 *
 * Header-only (static inline) because exactly these two executables of
 * the io suite use it; the shared fixtures of every suite are in
 * fixtures.h. */
#ifndef SL_TEST_IO_FIXTURES_H
#define SL_TEST_IO_FIXTURES_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_dirs.h"
#include "test_util.h"

/* ------------------------------------------------------------ records */

typedef struct trade {
  int64_t time_ms;
  char symbol[8];
  double price;
  int32_t quantity;
  bool urgent;
} trade;

static const sl_field trade_fields[] = {
    SL_FIELD(trade, time_ms, SL_FIELD_INT64),
    SL_FIELD(trade, symbol, SL_FIELD_STRING),
    SL_FIELD(trade, price, SL_FIELD_DOUBLE),
    SL_FIELD(trade, quantity, SL_FIELD_INT32),
    SL_FIELD(trade, urgent, SL_FIELD_BOOL),
};
static const sl_schema trade_schema = {trade_fields, 5, sizeof(trade),
                                       "time_ms"};
static const sl_schema trade_schema_no_ts = {trade_fields, 5, sizeof(trade),
                                             0};

/* Symbols with every CSV and JSON special character the formats must get
 * right; all at most 7 bytes. */
static const char *const symbols[] = {"AAPL", "MSFT",   "a,b",     "q\"t",
                                      "",     "\xc3\xa9\xe2\x82\xac", "ba\\ck",
                                      " sp ", "x/y",    "t\tb"};
#define SYMBOL_COUNT (sizeof symbols / sizeof symbols[0])

static inline trade make_trade(uint64_t i) {
  trade t;
  memset(&t, 0, sizeof t);
  t.time_ms = 1700000000000 + (int64_t)i * 7;
  strcpy(t.symbol, symbols[i % SYMBOL_COUNT]);
  t.price = (double)(i % 1000) / 4.0 - 50; /* exact, few digits */
  t.quantity = (int32_t)((i * 37) % 100000) - 50000;
  t.urgent = i % 3 == 0;
  return t;
}

/* ------------------------------------------------------------ text */

typedef struct text {
  char *data;
  size_t length, capacity;
} text;

static inline void text_add(text *t, const char *bytes, size_t n) {
  if (t->length + n + 1 > t->capacity) {
    t->capacity = (t->length + n + 1) * 2;
    t->data = realloc(t->data, t->capacity);
    cr_assert(t->data);
  }
  memcpy(t->data + t->length, bytes, n);
  t->length += n;
  t->data[t->length] = 0;
}

static inline void text_printf(text *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static inline void text_printf(text *t, const char *fmt, ...) {
  char buffer[4096];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buffer, sizeof buffer, fmt, ap);
  va_end(ap);
  cr_assert(n >= 0 && (size_t)n < sizeof buffer);
  text_add(t, buffer, (size_t)n);
}

/* A JSON string as jansson writes it: quote, backslash and control
 * characters escaped, everything else (UTF-8 too) as it is. */
static inline void json_escape(text *t, const char *s) {
  text_add(t, "\"", 1);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') {
      text_add(t, "\\", 1);
      text_add(t, s, 1);
    } else if (*s == '\t') {
      text_add(t, "\\t", 2);
    } else if (*s == '\n') {
      text_add(t, "\\n", 2);
    } else {
      text_add(t, s, 1);
    }
  }
  text_add(t, "\"", 1);
}

/* A CSV cell: quoted with doubled quotes when it holds the delimiter or a
 * quote, or when force is set. */
static inline void csv_cell(text *t, const char *s, char delimiter,
                            bool force) {
  if (!force && !strchr(s, delimiter) && !strchr(s, '"')) {
    text_add(t, s, strlen(s));
    return;
  }
  text_add(t, "\"", 1);
  for (; *s; s++) {
    if (*s == '"')
      text_add(t, "\"", 1);
    text_add(t, s, 1);
  }
  text_add(t, "\"", 1);
}

/* The double as the formatters write it: %.15g (enough for these values),
 * and in JSON ".0" after an integral value, as jansson does. */
static inline void put_double(text *t, double v, bool json) {
  char buffer[64];
  snprintf(buffer, sizeof buffer, "%.15g", v);
  text_add(t, buffer, strlen(buffer));
  if (json && !strpbrk(buffer, ".e"))
    text_add(t, ".0", 2);
}

/* An input JSON line: keys in another order, an extra key, spaces, an
 * integral price written as a JSON integer. */
static inline void input_jsonl(text *t, uint64_t i) {
  trade r = make_trade(i);
  text_printf(t, "{\"quantity\": %" PRId32 ", \"extra\": [1, {\"x\": null}], "
              "\"symbol\": ", r.quantity);
  json_escape(t, r.symbol);
  text_printf(t, ", \"time_ms\":%" PRId64 ", \"urgent\": %s, \"price\": "
              "%.17g}\n", r.time_ms, r.urgent ? "true" : "false", r.price);
}

/* The header of CSV input files: shuffled, with an extra column. */
static const char csv_input_header[] =
    "urgent,price,extra,symbol,time_ms,quantity\n";

static inline void input_csv(text *t, uint64_t i, char delimiter, bool header) {
  trade r = make_trade(i);
  char d[2] = {delimiter, 0};
  if (header) {
    text_printf(t, "%s%s%.17g%s\"ignored, really\"%s", r.urgent ? "true" : "0",
                d, r.price, d, d);
    csv_cell(t, r.symbol, delimiter, i % 5 == 0);
    text_printf(t, "%s%" PRId64 "%s%" PRId32 "\n", d, r.time_ms, d,
                r.quantity);
  } else {
    text_printf(t, "%" PRId64 "%s", r.time_ms, d);
    csv_cell(t, r.symbol, delimiter, i % 5 == 0);
    text_printf(t, "%s%.17g%s%" PRId32 "%s%s\n", d, r.price, d, r.quantity,
                d, r.urgent ? "1" : "false");
  }
}

/* What sl_format_jsonl / sl_format_csv must write for record i. */
static inline void expected_jsonl(text *t, uint64_t i) {
  trade r = make_trade(i);
  text_printf(t, "{\"time_ms\":%" PRId64 ",\"symbol\":", r.time_ms);
  json_escape(t, r.symbol);
  text_add(t, ",\"price\":", 9);
  put_double(t, r.price, true);
  text_printf(t, ",\"quantity\":%" PRId32 ",\"urgent\":%s}\n", r.quantity,
              r.urgent ? "true" : "false");
}

static inline void expected_csv(text *t, uint64_t i) {
  trade r = make_trade(i);
  text_printf(t, "%" PRId64 ",", r.time_ms);
  csv_cell(t, r.symbol, ',', false);
  text_add(t, ",", 1);
  put_double(t, r.price, false);
  text_printf(t, ",%" PRId32 ",%s\n", r.quantity,
              r.urgent ? "true" : "false");
}

/* ------------------------------------------------------------ files */

static inline void write_file(const char *path, const char *data,
                              size_t bytes) {
  FILE *f = fopen(path, "wb");
  cr_assert(f, "cannot create %s", path);
  cr_assert_eq(fwrite(data, 1, bytes, f), bytes);
  cr_assert_eq(fclose(f), 0);
}

static inline text read_file(const char *path) {
  text t = {0};
  FILE *f = fopen(path, "rb");
  cr_assert(f, "cannot open %s: %s", path, strerror(errno));
  char buffer[65536];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, f)) > 0)
    text_add(&t, buffer, n);
  fclose(f);
  if (!t.data)
    text_add(&t, "", 0);
  return t;
}

static inline int compare_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Everything a file sink committed in dir (part-* then out-* files in
 * name order: the instance's order), and how many pending parts are
 * left. */
static inline text read_output_header(const char *dir, int *pending,
                                      const char *header, int *files);

static inline text read_output(const char *dir, int *pending) {
  return read_output_header(dir, pending, 0, 0);
}

/* read_output(), where every file must begin with the line `header`
 * (not NULL), which is left out of the text; *files counts them. */
static inline text read_output_header(const char *dir, int *pending,
                                      const char *header, int *files) {
  DIR *d = opendir(dir);
  cr_assert(d, "opendir %s", dir);
  char *names[4096];
  size_t count = 0;
  int left = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, ".part-", 6) == 0)
      left++;
    else if (strncmp(e->d_name, "part-", 5) == 0 ||
             strncmp(e->d_name, "out-", 4) == 0) {
      cr_assert_lt(count, 4096);
      names[count++] = strdup(e->d_name);
    }
  }
  closedir(d);
  qsort(names, count, sizeof names[0], compare_names);
  text all = {0};
  text_add(&all, "", 0);
  for (size_t i = 0; i < count; i++) {
    char *p = sl_test_path_in(dir, names[i]);
    text part = read_file(p);
    size_t skip = 0;
    if (header) {
      size_t h = strlen(header);
      cr_assert(part.length > h && memcmp(part.data, header, h) == 0 &&
                    part.data[h] == '\n',
                "%s does not start with the header line", names[i]);
      skip = h + 1;
    }
    text_add(&all, part.data + skip, part.length - skip);
    free(part.data);
    free(p);
    free(names[i]);
  }
  if (pending)
    *pending = left;
  if (files)
    *files = (int)count;
  return all;
}

/* Compare two texts line by line, reporting the first difference. */
static inline void expect_same_lines(const text *got, const text *want,
                                     const char *what) {
  const char *g = got->data, *w = want->data;
  size_t line = 1;
  while (*g && *w) {
    size_t gl = strcspn(g, "\n"), wl = strcspn(w, "\n");
    if (gl != wl || memcmp(g, w, gl) != 0) {
      cr_expect_fail("%s: line %zu differs:\n  got  %.*s\n  want %.*s", what,
                     line, (int)gl, g, (int)wl, w);
      return;
    }
    g += gl + (g[gl] == '\n');
    w += wl + (w[wl] == '\n');
    line++;
  }
  cr_expect(!*g && !*w, "%s: %s has more lines from line %zu", what,
            *g ? "output" : "expected output", line);
  cr_expect_eq(got->length, want->length, "%s: %zu bytes, expected %zu", what,
               got->length, want->length);
}

static inline uint64_t count_lines(const text *t) {
  uint64_t n = 0;
  for (size_t i = 0; i < t->length; i++)
    n += t->data[i] == '\n';
  return n;
}

/* ------------------------------------------------------------ jobs */

typedef struct pipeline {
  const char *const *paths;
  int path_count;
  int format;
  const sl_schema *schema;
  char delimiter;
  const char *dead_letter_path;
  uint32_t max_line_bytes;
  const char *out_dir;
  int exactly_once;
  sl_format_fn output_format;
  const char *state_dir; /* NULL: no checkpoints */
  int policy;
  const char *faults;         /* injected (NULL: none) */
  uint32_t restart_attempts;  /* fixed-delay restarts (0: none) */
  const char *header;         /* file sink header line (NULL: none) */
} pipeline;

static inline sl_job *build_pipeline(const pipeline *p) {
  sl_job_config config = SL_JOB_CONFIG_INIT;
  config.checkpoint.state_dir = p->state_dir;
  config.checkpoint.interval_ms = 20;
  config.checkpoint.no_sync = 1;
  config.checkpoint.store_policy = p->policy;
  config.ring_bytes = 64 * 1024; /* barriers queue behind less */
  config.faults = p->faults;
  if (p->restart_attempts) {
    config.restart = sl_restart_defaults(SL_RESTART_FIXED_DELAY);
    config.restart.attempts = p->restart_attempts;
    config.restart.delay_ms = 0;
  }
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  sl_file_source_config in = {.paths = p->paths,
                              .path_count = p->path_count,
                              .format = p->format,
                              .schema = p->schema,
                              .csv_delimiter = p->delimiter,
                              .dead_letter_path = p->dead_letter_path,
                              .max_line_bytes = p->max_line_bytes};
  sl_op *src, *sink;
  int rc = sl_source_file(job, "source", &in, &src);
  cr_assert_eq(rc, 0, "sl_source_file: %s: %s", sl_strerror(rc),
               sl_job_error(job));
  sl_file_sink_config out = {.dir = p->out_dir,
                             .exactly_once = p->exactly_once,
                             .format = p->output_format,
                             .format_user = (void *)p->schema,
                             .header = p->header};
  cr_assert_eq(sl_sink_file(job, "sink", src, 1, &out, &sink), 0);
  return job;
}

typedef struct run_result {
  int rc;
  char error[1024];
  uint64_t dead_letters;
  uint64_t records_out;
  uint32_t restarts;
  uint32_t restarts_from_checkpoint; /* restored one, not the beginning */
} run_result;

static inline run_result run_pipeline(const pipeline *p) {
  sl_job *job = build_pipeline(p);
  sl_test_watchdog w;
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  sl_test_watchdog_arm(&w, job, 120, "io pipeline");
  run_result r = {0};
  r.rc = sl_job_wait(job);
  cr_assert_not(sl_test_watchdog_disarm(&w));
  snprintf(r.error, sizeof r.error, "%s", sl_job_error(job));
  sl_op_stats stats;
  cr_assert_eq(sl_job_stats(job, 0, &stats), 0);
  r.dead_letters = stats.dead_letters;
  r.records_out = stats.records_out;
  r.restarts = sl_job_restarts(job);
  sl_recovery_stats recovery;
  for (int k = 0; sl_job_recovery_stats(job, k, &recovery) == 0; k++)
    r.restarts_from_checkpoint += recovery.restored_from != 0;
  sl_job_destroy(job);
  return r;
}

/* Write `files` input files of `per_file` records each (record numbers
 * continue across files) and the expected output of all of them. */
static inline char **make_inputs(const char *dir, int files, uint64_t per_file,
                                 int format, char delimiter, const char *suffix,
                                 text *expected, bool expect_json) {
  char **paths = calloc((size_t)files, sizeof *paths);
  uint64_t i = 0;
  for (int k = 0; k < files; k++) {
    char name[64];
    snprintf(name, sizeof name, "in-%d%s", k, suffix);
    paths[k] = sl_test_path_in(dir, name);
    text t = {0};
    text_add(&t, "", 0);
    if (format == SL_FORMAT_CSV_HEADER)
      text_add(&t, csv_input_header, strlen(csv_input_header));
    for (uint64_t n = 0; n < per_file; n++, i++) {
      if (format == SL_FORMAT_JSONL)
        input_jsonl(&t, i);
      else
        input_csv(&t, i, delimiter, format == SL_FORMAT_CSV_HEADER);
      if (expect_json)
        expected_jsonl(expected, i);
      else
        expected_csv(expected, i);
    }
    write_file(paths[k], t.data, t.length);
    free(t.data);
  }
  return paths;
}

static inline void free_paths(char **paths, int n) {
  for (int i = 0; i < n; i++)
    free(paths[i]);
  free(paths);
}

/* ------------------------------------------------------------ capture */

typedef struct captured {
  uint64_t count;
  uint64_t wrong;     /* timestamp != time_ms field (or != none) */
  bool expect_none;
} captured;

static inline int capture_open(sl_ctx *ctx, void *user, void **state) {
  (void)ctx;
  *state = user;
  return 0;
}

static inline int capture_process(sl_ctx *ctx, void *state, int input,
                                  const sl_record *in) {
  (void)ctx;
  (void)input;
  captured *c = state;
  trade t;
  memcpy(&t, in->data, sizeof t);
  int64_t want = c->expect_none ? SL_NO_TIMESTAMP : t.time_ms;
  c->wrong += in->timestamp != want;
  /* Atomic: a test may poll the count while the job runs. */
  __atomic_store_n(&c->count, c->count + 1, __ATOMIC_RELEASE);
  return 0;
}


#endif /* SL_TEST_IO_FIXTURES_H */
