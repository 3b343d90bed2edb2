/* test_io.c — the CSV / JSON lines file and stdin sources, the formatters,
 * dead letters, replay after stop-and-resume, schema validation and the
 * stdout sink.
 *
 * Real jobs, real files in temporary directories.  Expected output is
 * computed by the test from the generated records with its own printing
 * and escaping (not with the library's formatters), then compared line by
 * line with what the sinks committed. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

static trade make_trade(uint64_t i) {
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

static void text_add(text *t, const char *bytes, size_t n) {
  if (t->length + n + 1 > t->capacity) {
    t->capacity = (t->length + n + 1) * 2;
    t->data = realloc(t->data, t->capacity);
    cr_assert(t->data);
  }
  memcpy(t->data + t->length, bytes, n);
  t->length += n;
  t->data[t->length] = 0;
}

static void text_printf(text *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void text_printf(text *t, const char *fmt, ...) {
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
static void json_escape(text *t, const char *s) {
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
static void csv_cell(text *t, const char *s, char delimiter, bool force) {
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
static void put_double(text *t, double v, bool json) {
  char buffer[64];
  snprintf(buffer, sizeof buffer, "%.15g", v);
  text_add(t, buffer, strlen(buffer));
  if (json && !strpbrk(buffer, ".e"))
    text_add(t, ".0", 2);
}

/* An input JSON line: keys in another order, an extra key, spaces, an
 * integral price written as a JSON integer. */
static void input_jsonl(text *t, uint64_t i) {
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

static void input_csv(text *t, uint64_t i, char delimiter, bool header) {
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
static void expected_jsonl(text *t, uint64_t i) {
  trade r = make_trade(i);
  text_printf(t, "{\"time_ms\":%" PRId64 ",\"symbol\":", r.time_ms);
  json_escape(t, r.symbol);
  text_add(t, ",\"price\":", 9);
  put_double(t, r.price, true);
  text_printf(t, ",\"quantity\":%" PRId32 ",\"urgent\":%s}\n", r.quantity,
              r.urgent ? "true" : "false");
}

static void expected_csv(text *t, uint64_t i) {
  trade r = make_trade(i);
  text_printf(t, "%" PRId64 ",", r.time_ms);
  csv_cell(t, r.symbol, ',', false);
  text_add(t, ",", 1);
  put_double(t, r.price, false);
  text_printf(t, ",%" PRId32 ",%s\n", r.quantity,
              r.urgent ? "true" : "false");
}

/* ------------------------------------------------------------ files */

static void write_file(const char *path, const char *data, size_t bytes) {
  FILE *f = fopen(path, "wb");
  cr_assert(f, "cannot create %s", path);
  cr_assert_eq(fwrite(data, 1, bytes, f), bytes);
  cr_assert_eq(fclose(f), 0);
}

static text read_file(const char *path) {
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

static int compare_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Everything a file sink committed in dir (part-* then out-* files in
 * name order: the instance's order), and how many pending parts are
 * left. */
static text read_output_header(const char *dir, int *pending,
                              const char *header, int *files);

static text read_output(const char *dir, int *pending) {
  return read_output_header(dir, pending, 0, 0);
}

/* read_output(), where every file must begin with the line `header`
 * (not NULL), which is left out of the text; *files counts them. */
static text read_output_header(const char *dir, int *pending,
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
static void expect_same_lines(const text *got, const text *want,
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

static uint64_t count_lines(const text *t) {
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

static sl_job *build_pipeline(const pipeline *p) {
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

static run_result run_pipeline(const pipeline *p) {
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
static char **make_inputs(const char *dir, int files, uint64_t per_file,
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

static void free_paths(char **paths, int n) {
  for (int i = 0; i < n; i++)
    free(paths[i]);
  free(paths);
}

TestSuite(io, .timeout = 240);

/* ------------------------------------------------------------ round trips */

Test(io, jsonl_files_to_exactly_once_jsonl_output) {
  char *dir = sl_test_temp_dir("io"), *out = sl_test_path_in(dir, "out");
  text want = {0};
  text_add(&want, "", 0);
  char **paths = make_inputs(dir, 3, 2500, SL_FORMAT_JSONL, 0, ".jsonl",
                             &want, true);
  pipeline p = {.paths = (const char *const *)paths, .path_count = 3,
                .format = SL_FORMAT_JSONL, .schema = &trade_schema,
                .out_dir = out, .exactly_once = 1,
                .output_format = sl_format_jsonl};
  run_result r = run_pipeline(&p);
  cr_assert_eq(r.rc, 0, "%s", r.error);
  int pending;
  text got = read_output(out, &pending);
  expect_same_lines(&got, &want, "jsonl -> jsonl");
  cr_expect_eq(pending, 0);
  cr_expect_eq(r.records_out, 7500);
  cr_expect_eq(r.dead_letters, 0);
  free(got.data);
  free(want.data);
  free_paths(paths, 3);
  free(out);
  sl_test_remove_tree(dir);
}

Test(io, csv_files_with_header_to_plain_csv_output) {
  char *dir = sl_test_temp_dir("io"), *out = sl_test_path_in(dir, "out");
  text want = {0};
  text_add(&want, "", 0);
  char **paths = make_inputs(dir, 4, 1200, SL_FORMAT_CSV_HEADER, ',', ".csv",
                             &want, false);
  pipeline p = {.paths = (const char *const *)paths, .path_count = 4,
                .format = SL_FORMAT_CSV_HEADER, .schema = &trade_schema,
                .out_dir = out, .exactly_once = 0,
                .output_format = sl_format_csv};
  run_result r = run_pipeline(&p);
  cr_assert_eq(r.rc, 0, "%s", r.error);
  text got = read_output(out, 0);
  expect_same_lines(&got, &want, "csv header -> csv");
  cr_expect_eq(r.records_out, 4800);
  free(got.data);
  free(want.data);
  free_paths(paths, 4);
  free(out);
  sl_test_remove_tree(dir);
}

/* A header line from the schema at the top of every committed part. */
Test(io, csv_output_files_each_start_with_the_header) {
  char *dir = sl_test_temp_dir("io"), *out = sl_test_path_in(dir, "out"),
       *state = sl_test_path_in(dir, "state");
  text want = {0};
  text_add(&want, "", 0);
  char **paths = make_inputs(dir, 2, 3000, SL_FORMAT_CSV_HEADER, ',', ".csv",
                             &want, false);
  char header[512];
  int n = sl_format_csv_header(&trade_schema, header, sizeof header);
  cr_assert(n > 0 && n < (int)sizeof header);
  header[n] = 0;
  pipeline p = {.paths = (const char *const *)paths, .path_count = 2,
                .format = SL_FORMAT_CSV_HEADER, .schema = &trade_schema,
                .out_dir = out, .exactly_once = 1, .state_dir = state,
                .output_format = sl_format_csv, .header = header};
  run_result r = run_pipeline(&p);
  cr_assert_eq(r.rc, 0, "%s", r.error);
  int files = 0, pending = 0;
  text got = read_output_header(out, &pending, header, &files);
  cr_assert_geq(files, 1);
  cr_assert_eq(pending, 0);
  expect_same_lines(&got, &want, "csv -> csv with header");
  free(got.data);
  free(want.data);
  /* The plain sink: the header once, when it creates the file. */
  char *plain = sl_test_path_in(dir, "plain");
  text want2 = {0};
  text_add(&want2, "", 0);
  char **paths2 = make_inputs(dir, 1, 100, SL_FORMAT_CSV_HEADER, ',', ".csv",
                              &want2, false);
  pipeline q = {.paths = (const char *const *)paths2, .path_count = 1,
                .format = SL_FORMAT_CSV_HEADER, .schema = &trade_schema,
                .out_dir = plain, .output_format = sl_format_csv,
                .header = header};
  r = run_pipeline(&q);
  cr_assert_eq(r.rc, 0, "%s", r.error);
  got = read_output_header(plain, 0, header, &files);
  cr_assert_eq(files, 1);
  expect_same_lines(&got, &want2, "plain csv with header");
  free(got.data);
  free(want2.data);
  free_paths(paths2, 1);
  free(plain);
  free_paths(paths, 2);
  free(out);
  free(state);
  sl_test_remove_tree(dir);
}

Test(io, csv_without_header_and_semicolons_to_jsonl) {
  char *dir = sl_test_temp_dir("io"), *out = sl_test_path_in(dir, "out");
  text want = {0};
  text_add(&want, "", 0);
  char **paths = make_inputs(dir, 2, 3000, SL_FORMAT_CSV, ';', ".csv", &want,
                             true);
  pipeline p = {.paths = (const char *const *)paths, .path_count = 2,
                .format = SL_FORMAT_CSV, .schema = &trade_schema,
                .delimiter = ';', .out_dir = out, .exactly_once = 1,
                .output_format = sl_format_jsonl};
  run_result r = run_pipeline(&p);
  cr_assert_eq(r.rc, 0, "%s", r.error);
  text got = read_output(out, 0);
  expect_same_lines(&got, &want, "csv ; -> jsonl");
  free(got.data);
  free(want.data);
  free_paths(paths, 2);
  free(out);
  sl_test_remove_tree(dir);
}

Test(io, crlf_blank_lines_bom_and_a_last_line_without_newline) {
  char *dir = sl_test_temp_dir("io"), *out = sl_test_path_in(dir, "out");
  char *a = sl_test_path_in(dir, "a.csv"), *b = sl_test_path_in(dir, "b.jsonl");
  /* CSV: BOM before the header, CRLF, blank lines, no final newline. */
  const char csv[] = "\xEF\xBB\xBFtime_ms,symbol,price,quantity,urgent\r\n"
                     "\r\n"
                     "1,A,0.5,2,true\r\n"
                     "\n"
                     "2,\"B,C\",1e3,-3,0";
  write_file(a, csv, sizeof csv - 1);
  const char jsonl[] = "\n{\"time_ms\":3,\"symbol\":\"D\",\"price\":2,"
                       "\"quantity\":4,\"urgent\":false}\r\n";
  write_file(b, jsonl, sizeof jsonl - 1);
  const char *csv_paths[] = {a}, *json_paths[] = {b};
  pipeline p = {.paths = csv_paths, .path_count = 1,
                .format = SL_FORMAT_CSV_HEADER, .schema = &trade_schema,
                .out_dir = out, .exactly_once = 1,
                .output_format = sl_format_csv};
  run_result r = run_pipeline(&p);
  cr_assert_eq(r.rc, 0, "%s", r.error);
  p.paths = json_paths;
  p.format = SL_FORMAT_JSONL;
  char *out2 = sl_test_path_in(dir, "out2");
  p.out_dir = out2;
  r = run_pipeline(&p);
  cr_assert_eq(r.rc, 0, "%s", r.error);
  text got = read_output(out, 0), got2 = read_output(out2, 0);
  cr_expect_str_eq(got.data, "1,A,0.5,2,true\n2,\"B,C\",1000,-3,false\n");
  cr_expect_str_eq(got2.data, "3,D,2,4,false\n");
  free(got.data);
  free(got2.data);
  free(a);
  free(b);
  free(out);
  free(out2);
  sl_test_remove_tree(dir);
}

/* ------------------------------------------------------------ timestamps */

typedef struct captured {
  uint64_t count;
  uint64_t wrong;     /* timestamp != time_ms field (or != none) */
  bool expect_none;
} captured;

static int capture_open(sl_ctx *ctx, void *user, void **state) {
  (void)ctx;
  *state = user;
  return 0;
}

static int capture_process(sl_ctx *ctx, void *state, int input,
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

static void run_capture(const sl_schema *schema, captured *c) {
  char *dir = sl_test_temp_dir("io");
  text unused = {0};
  char **paths = make_inputs(dir, 2, 1500, SL_FORMAT_JSONL, 0, ".jsonl",
                             &unused, true);
  sl_job *job;
  cr_assert_eq(sl_job_create(0, &job), 0);
  sl_file_source_config in = {.paths = (const char *const *)paths,
                              .path_count = 2, .format = SL_FORMAT_JSONL,
                              .schema = schema};
  sl_op *src, *sink;
  cr_assert_eq(sl_source_file(job, "source", &in, &src), 0);
  static const sl_process_ops ops = {.open = capture_open,
                                     .process = capture_process};
  cr_assert_eq(sl_op_sink(job, "capture", src, 1, &ops, c, &sink), 0);
  cr_assert_eq(sl_job_run(job), 0, "%s", sl_job_error(job));
  sl_job_destroy(job);
  free(unused.data);
  free_paths(paths, 2);
  sl_test_remove_tree(dir);
}

Test(io, timestamps_come_from_the_timestamp_field) {
  captured c = {0};
  run_capture(&trade_schema, &c);
  cr_expect_eq(c.count, 3000);
  cr_expect_eq(c.wrong, 0, "%" PRIu64 " records with a wrong timestamp",
               c.wrong);
  captured none = {.expect_none = true};
  run_capture(&trade_schema_no_ts, &none);
  cr_expect_eq(none.count, 3000);
  cr_expect_eq(none.wrong, 0);
}

/* ------------------------------------------------------------ malformed */

typedef struct bad_case {
  int format;
  const char *good;   /* a good line of the format (no newline) */
  const char *bad;    /* the malformed line */
  const char *reason; /* text the reason must contain */
  uint32_t max_line_bytes;
  size_t dead_text_bytes; /* bytes of the line kept (0: all) */
} bad_case;

static const char good_json[] = "{\"time_ms\":5,\"symbol\":\"OK\",\"price\":1.5,"
                                "\"quantity\":7,\"urgent\":true}";
static const char good_csv[] = "5,OK,1.5,7,true";

static const bad_case bad_cases[] = {
    {SL_FORMAT_JSONL, good_json, "{\"time_ms\": 1, \"symbol\": ",
     "JSON syntax error at column", 0, 0},
    {SL_FORMAT_JSONL, good_json, "[1, 2, 3]", "not a JSON object (an array)",
     0, 0},
    {SL_FORMAT_JSONL, good_json, "\"just a string\"",
     "not a JSON object (a string)", 0, 0},
    {SL_FORMAT_JSONL, good_json,
     "{\"time_ms\":5,\"symbol\":\"OK\",\"quantity\":7,\"urgent\":true}",
     "missing field \"price\"", 0, 0},
    {SL_FORMAT_JSONL, good_json,
     "{\"time_ms\":5,\"symbol\":\"OK\",\"price\":1.5,\"quantity\":\"7\","
     "\"urgent\":true}",
     "field \"quantity\": expected an integer, got a string", 0, 0},
    {SL_FORMAT_JSONL, good_json,
     "{\"time_ms\":5.0,\"symbol\":\"OK\",\"price\":1.5,\"quantity\":7,"
     "\"urgent\":true}",
     "field \"time_ms\": expected an integer, got a real", 0, 0},
    {SL_FORMAT_JSONL, good_json,
     "{\"time_ms\":5,\"symbol\":\"TOOLONGX\",\"price\":1.5,\"quantity\":7,"
     "\"urgent\":true}",
     "field \"symbol\": string of 8 bytes is too long (at most 7)", 0, 0},
    {SL_FORMAT_JSONL, good_json,
     "{\"time_ms\":5,\"symbol\":\"OK\",\"price\":null,\"quantity\":7,"
     "\"urgent\":true}",
     "field \"price\" is null", 0, 0},
    {SL_FORMAT_JSONL, good_json,
     "{\"time_ms\":5,\"symbol\":\"OK\",\"price\":1,\"quantity\":2147483648,"
     "\"urgent\":true}",
     "field \"quantity\": integer 2147483648 is out of range", 0, 0},
    {SL_FORMAT_JSONL, good_json,
     "{\"time_ms\":5,\"symbol\":\"OK\",\"price\":1,\"quantity\":2,"
     "\"urgent\":1}",
     "field \"urgent\": expected true or false, got an integer", 0, 0},
    {SL_FORMAT_JSONL, good_json,
     "{\"time_ms\":5,\"time_ms\":6,\"symbol\":\"OK\",\"price\":1,"
     "\"quantity\":2,\"urgent\":true}",
     "duplicate object key", 0, 0},
    {SL_FORMAT_JSONL, good_json,
     "{\"time_ms\":-9223372036854775808,\"symbol\":\"OK\",\"price\":1,"
     "\"quantity\":2,\"urgent\":true}",
     "timestamp field \"time_ms\" holds INT64_MIN", 0, 0},
    {SL_FORMAT_CSV, good_csv, "5,OK,1.5", "3 columns, expected 5", 0, 0},
    {SL_FORMAT_CSV, good_csv, "5,OK,1.5,7,true,extra",
     "6 columns, expected 5", 0, 0},
    {SL_FORMAT_CSV, good_csv, "5x,OK,1.5,7,true",
     "column 1: field \"time_ms\": bad integer \"5x\"", 0, 0},
    {SL_FORMAT_CSV, good_csv, " 5,OK,1.5,7,true", "bad integer \" 5\"", 0, 0},
    {SL_FORMAT_CSV, good_csv, "5,OK,1.5,99999999999,true",
     "integer 99999999999 is out of range", 0, 0},
    {SL_FORMAT_CSV, good_csv, "5,\"OK,1.5,7,true", "unterminated quote", 0,
     0},
    {SL_FORMAT_CSV, good_csv, "5,O\"K,1.5,7,true", "CSV syntax error at byte 4",
     0, 0},
    {SL_FORMAT_CSV, good_csv, "5,\"OK\"x,1.5,7,true",
     "CSV syntax error at byte 7", 0, 0},
    {SL_FORMAT_CSV, good_csv, "5,OK,1.5.2,7,true",
     "column 3: field \"price\": bad number \"1.5.2\"", 0, 0},
    {SL_FORMAT_CSV, good_csv, "5,OK,nan,7,true", "bad number \"nan\"", 0, 0},
    {SL_FORMAT_CSV, good_csv, "5,OK,1e999,7,true",
     "number 1e999 is out of range", 0, 0},
    {SL_FORMAT_CSV, good_csv, "5,OK,1.5,,true", "field \"quantity\" is empty",
     0, 0},
    {SL_FORMAT_CSV, good_csv, "5,OK,1.5,7,yes",
     "field \"urgent\": bad boolean \"yes\"", 0, 0},
    {SL_FORMAT_CSV, good_csv, "5,\"TOO,LONG\",1.5,7,true",
     "field \"symbol\": string of 8 bytes is too long (at most 7)", 0, 0},
    {SL_FORMAT_CSV, good_csv, "5,OK,1.5,7,true\r,x",
     "a carriage return outside quotes", 0, 0},
    {SL_FORMAT_CSV, good_csv,
     "5,OK,1.5,7,true,xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
     "line longer than 40 bytes", 40, 40},
};

/* File: good, good, bad, (blank), good; the bad line is line 3. */
static void write_bad_input(const char *path, const bad_case *c) {
  text t = {0};
  text_printf(&t, "%s\n%s\n%s\n\n%s\n", c->good, c->good, c->bad, c->good);
  write_file(path, t.data, t.length);
  free(t.data);
}

Test(io, each_malformed_line_fails_the_job_naming_file_line_and_reason) {
  for (size_t k = 0; k < sizeof bad_cases / sizeof bad_cases[0]; k++) {
    const bad_case *c = &bad_cases[k];
    char *dir = sl_test_temp_dir("io"), *out = sl_test_path_in(dir, "out");
    char *input = sl_test_path_in(dir, "input.txt");
    write_bad_input(input, c);
    const char *paths[] = {input};
    pipeline p = {.paths = paths, .path_count = 1, .format = c->format,
                  .schema = &trade_schema, .out_dir = out,
                  .exactly_once = 1, .output_format = sl_format_csv,
                  .max_line_bytes = c->max_line_bytes};
    run_result r = run_pipeline(&p);
    cr_expect_eq(r.rc, EINVAL, "case %zu: rc %d", k, r.rc);
    char where[600];
    snprintf(where, sizeof where, "file %s line 3: ", input);
    cr_expect(strstr(r.error, where), "case %zu: '%s' lacks '%s'", k,
              r.error, where);
    cr_expect(strstr(r.error, c->reason), "case %zu: '%s' lacks '%s'", k,
              r.error, c->reason);
    cr_expect(strstr(r.error, "operator 'source'"), "case %zu: %s", k,
              r.error);
    free(input);
    free(out);
    sl_test_remove_tree(dir);
  }
}

Test(io, each_malformed_line_goes_to_the_dead_letter_file) {
  for (size_t k = 0; k < sizeof bad_cases / sizeof bad_cases[0]; k++) {
    const bad_case *c = &bad_cases[k];
    char *dir = sl_test_temp_dir("io"), *out = sl_test_path_in(dir, "out");
    char *input = sl_test_path_in(dir, "input.txt");
    char *dead = sl_test_path_in(dir, "dead.tsv");
    write_bad_input(input, c);
    const char *paths[] = {input};
    pipeline p = {.paths = paths, .path_count = 1, .format = c->format,
                  .schema = &trade_schema, .out_dir = out,
                  .exactly_once = 1, .output_format = sl_format_csv,
                  .max_line_bytes = c->max_line_bytes,
                  .dead_letter_path = dead};
    run_result r = run_pipeline(&p);
    cr_expect_eq(r.rc, 0, "case %zu: %s", k, r.error);
    cr_expect_eq(r.dead_letters, 1, "case %zu", k);
    cr_expect_eq(r.records_out, 3, "case %zu", k);
    text got = read_output(out, 0);
    cr_expect_str_eq(got.data, "5,OK,1.5,7,true\n5,OK,1.5,7,true\n"
                               "5,OK,1.5,7,true\n", "case %zu", k);
    /* PATH \t 3 \t REASON \t LINE */
    text letters = read_file(dead);
    char prefix[600];
    snprintf(prefix, sizeof prefix, "%s\t3\t", input);
    cr_expect(strncmp(letters.data, prefix, strlen(prefix)) == 0,
              "case %zu: %s", k, letters.data);
    const char *reason = letters.data + strlen(prefix);
    const char *tab = strchr(reason, '\t');
    cr_assert(tab, "case %zu: no fourth column", k);
    cr_expect(memmem(reason, (size_t)(tab - reason), c->reason,
                     strlen(c->reason)),
              "case %zu: reason '%.*s'", k, (int)(tab - reason), reason);
    size_t kept = c->dead_text_bytes ? c->dead_text_bytes : strlen(c->bad);
    const char *line = tab + 1;
    /* A '\r' in the bad line stays, a tab in the reason became a space. */
    cr_expect(strncmp(line, c->bad, kept) == 0 && line[kept] == '\n' &&
                  line[kept + 1] == 0,
              "case %zu: dead line '%s'", k, line);
    free(letters.data);
    free(got.data);
    free(input);
    free(dead);
    free(out);
    sl_test_remove_tree(dir);
  }
}

Test(io, dead_letters_across_files_count_and_keep_their_order) {
  char *dir = sl_test_temp_dir("io"), *out = sl_test_path_in(dir, "out");
  char *dead = sl_test_path_in(dir, "dead.tsv");
  char *paths[3];
  text want = {0}, want_dead = {0};
  text_add(&want, "", 0);
  text_add(&want_dead, "", 0);
  uint64_t i = 0, bad = 0;
  for (int k = 0; k < 3; k++) {
    char name[32];
    snprintf(name, sizeof name, "in-%d.jsonl", k);
    paths[k] = sl_test_path_in(dir, name);
    text t = {0};
    for (uint64_t line = 1; line <= 700; line++) {
      if (line % 97 == 0) { /* a record with a string too long */
        const char *l = "{\"time_ms\":1,\"symbol\":\"ABCDEFGHIJ\",\"price\":1,"
                        "\"quantity\":1,\"urgent\":true}";
        text_printf(&t, "%s\n", l);
        text_printf(&want_dead, "%s\t%" PRIu64 "\tfield \"symbol\": string of "
                    "10 bytes is too long (at most 7)\t%s\n", paths[k], line,
                    l);
        bad++;
      } else {
        input_jsonl(&t, i);
        expected_csv(&want, i);
        i++;
      }
    }
    write_file(paths[k], t.data, t.length);
    free(t.data);
  }
  pipeline p = {.paths = (const char *const *)paths, .path_count = 3,
                .format = SL_FORMAT_JSONL, .schema = &trade_schema,
                .out_dir = out, .exactly_once = 1,
                .output_format = sl_format_csv, .dead_letter_path = dead};
  run_result r = run_pipeline(&p);
  cr_assert_eq(r.rc, 0, "%s", r.error);
  cr_expect_eq(r.dead_letters, bad);
  cr_expect_eq(r.records_out, i);
  text got = read_output(out, 0), letters = read_file(dead);
  expect_same_lines(&got, &want, "good records");
  expect_same_lines(&letters, &want_dead, "dead letters");
  /* A second run starts its dead letters afresh (the file is the job's). */
  char *out2 = sl_test_path_in(dir, "out2");
  p.out_dir = out2;
  r = run_pipeline(&p);
  cr_assert_eq(r.rc, 0, "%s", r.error);
  free(letters.data);
  letters = read_file(dead);
  expect_same_lines(&letters, &want_dead, "dead letters of a second run");
  free(letters.data);
  free(got.data);
  free(want.data);
  free(want_dead.data);
  for (int k = 0; k < 3; k++)
    free(paths[k]);
  free(dead);
  free(out);
  free(out2);
  sl_test_remove_tree(dir);
}

Test(io, an_over_long_line_is_skipped_whole) {
  char *dir = sl_test_temp_dir("io"), *out = sl_test_path_in(dir, "out");
  char *input = sl_test_path_in(dir, "in.csv"), *dead = sl_test_path_in(dir, "dead.tsv");
  text t = {0};
  text_printf(&t, "%s\n", good_csv);
  for (int k = 0; k < 3000; k++) /* longer than the 1 MiB read too */
    text_add(&t, "0123456789", 10);
  text_printf(&t, "\n%s\n", good_csv);
  for (int k = 0; k < 500; k++) /* the last line, without newline */
    text_add(&t, "abcdefghij", 10);
  write_file(input, t.data, t.length);
  const char *paths[] = {input};
  pipeline p = {.paths = paths, .path_count = 1, .format = SL_FORMAT_CSV,
                .schema = &trade_schema, .out_dir = out, .exactly_once = 1,
                .output_format = sl_format_csv, .max_line_bytes = 100,
                .dead_letter_path = dead};
  run_result r = run_pipeline(&p);
  cr_assert_eq(r.rc, 0, "%s", r.error);
  cr_expect_eq(r.records_out, 2);
  cr_expect_eq(r.dead_letters, 2);
  text letters = read_file(dead);
  text want = {0};
  text_printf(&want, "%s\t2\tline longer than 100 bytes\t", input);
  for (int k = 0; k < 10; k++)
    text_add(&want, "0123456789", 10);
  text_printf(&want, "\n%s\t4\tline longer than 100 bytes\t", input);
  for (int k = 0; k < 10; k++)
    text_add(&want, "abcdefghij", 10);
  text_add(&want, "\n", 1);
  cr_expect_str_eq(letters.data, want.data);
  free(letters.data);
  free(want.data);
  free(t.data);
  free(input);
  free(dead);
  free(out);
  sl_test_remove_tree(dir);
}

/* ------------------------------------------------------------ header, optional */

typedef struct sparse {
  int64_t id;
  double score;
  char note[16];
  int32_t count;
} sparse;

static const sl_field sparse_fields[] = {
    SL_FIELD(sparse, id, SL_FIELD_INT64),
    SL_FIELD_OPT(sparse, score, SL_FIELD_DOUBLE),
    SL_FIELD_OPT(sparse, note, SL_FIELD_STRING),
    SL_FIELD_OPT(sparse, count, SL_FIELD_INT32),
};
static const sl_schema sparse_schema = {sparse_fields, 4, sizeof(sparse), 0};

Test(io, optional_fields_may_be_missing_null_or_empty) {
  char *dir = sl_test_temp_dir("io");
  char *json = sl_test_path_in(dir, "in.jsonl"), *csv = sl_test_path_in(dir, "in.csv");
  char *out1 = sl_test_path_in(dir, "out1"), *out2 = sl_test_path_in(dir, "out2");
  const char j[] = "{\"id\":1}\n"
                   "{\"id\":2,\"score\":null,\"note\":null,\"count\":null}\n"
                   "{\"id\":3,\"score\":2.5,\"note\":\"n\",\"count\":-4}\n";
  write_file(json, j, sizeof j - 1);
  /* The header lacks "count"; "score" is empty on line 2. */
  const char c[] = "note,id,score\nx,1,\n\"\",2,0.25\n";
  write_file(csv, c, sizeof c - 1);
  const char *jp[] = {json}, *cp[] = {csv};
  pipeline p = {.paths = jp, .path_count = 1, .format = SL_FORMAT_JSONL,
                .schema = &sparse_schema, .out_dir = out1, .exactly_once = 1,
                .output_format = sl_format_csv};
  run_result r = run_pipeline(&p);
  cr_assert_eq(r.rc, 0, "%s", r.error);
  p.paths = cp;
  p.format = SL_FORMAT_CSV_HEADER;
  p.out_dir = out2;
  p.output_format = sl_format_jsonl;
  r = run_pipeline(&p);
  cr_assert_eq(r.rc, 0, "%s", r.error);
  text got1 = read_output(out1, 0), got2 = read_output(out2, 0);
  cr_expect_str_eq(got1.data, "1,0,,0\n2,0,,0\n3,2.5,n,-4\n");
  cr_expect_str_eq(got2.data,
                   "{\"id\":1,\"score\":0.0,\"note\":\"x\",\"count\":0}\n"
                   "{\"id\":2,\"score\":0.25,\"note\":\"\",\"count\":0}\n");
  free(got1.data);
  free(got2.data);
  free(json);
  free(csv);
  free(out1);
  free(out2);
  sl_test_remove_tree(dir);
}

Test(io, a_bad_csv_header_fails_the_job_even_with_dead_letters) {
  static const struct {
    const char *header;
    const char *reason;
  } cases[] = {
      {"time_ms,symbol,price,urgent", "header lacks column \"quantity\""},
      {"time_ms,symbol,price,quantity,urgent,price",
       "header names column \"price\" twice (columns 3 and 6)"},
      {"time_ms,\"symbol,price,quantity,urgent", "header: unterminated quote"},
      {"", "the CSV header line is empty"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    char *dir = sl_test_temp_dir("io"), *out = sl_test_path_in(dir, "out");
    char *good = sl_test_path_in(dir, "a.csv"), *input = sl_test_path_in(dir, "b.csv");
    char *dead = sl_test_path_in(dir, "dead.tsv");
    text t = {0};
    text_printf(&t, "time_ms,symbol,price,quantity,urgent\n%s\n", good_csv);
    write_file(good, t.data, t.length);
    free(t.data);
    t = (text){0};
    text_printf(&t, "%s\n%s\n", cases[k].header, good_csv);
    write_file(input, t.data, t.length);
    free(t.data);
    const char *paths[] = {good, input};
    pipeline p = {.paths = paths, .path_count = 2,
                  .format = SL_FORMAT_CSV_HEADER, .schema = &trade_schema,
                  .out_dir = out, .exactly_once = 1,
                  .output_format = sl_format_csv, .dead_letter_path = dead};
    run_result r = run_pipeline(&p);
    cr_expect_eq(r.rc, EINVAL, "case %zu: rc %d", k, r.rc);
    char want[700];
    snprintf(want, sizeof want, "file %s line 1: %s", input,
             cases[k].reason);
    cr_expect(strstr(r.error, want), "case %zu: '%s' lacks '%s'", k, r.error,
              want);
    free(good);
    free(input);
    free(dead);
    free(out);
    sl_test_remove_tree(dir);
  }
}

Test(io, a_missing_file_fails_the_job_naming_it) {
  char *dir = sl_test_temp_dir("io"), *out = sl_test_path_in(dir, "out");
  char *missing = sl_test_path_in(dir, "nope.jsonl");
  const char *paths[] = {missing};
  pipeline p = {.paths = paths, .path_count = 1, .format = SL_FORMAT_JSONL,
                .schema = &trade_schema, .out_dir = out, .exactly_once = 1,
                .output_format = sl_format_csv};
  run_result r = run_pipeline(&p);
  cr_expect_eq(r.rc, ENOENT, "rc %d", r.rc);
  char want[600];
  snprintf(want, sizeof want, "cannot open file %s: No such file", missing);
  cr_expect(strstr(r.error, want), "'%s' lacks '%s'", r.error, want);
  free(missing);
  free(out);
  sl_test_remove_tree(dir);
}

/* ------------------------------------------------------------ replay */

/* Run until `checkpoints` more have completed, then stop.  Returns the
 * job's result (SL_ESTOPPED, or 0 if it finished first). */
static int run_and_stop(const pipeline *p, uint64_t checkpoints) {
  sl_job *job = build_pipeline(p);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  uint64_t first = 0;
  for (int i = 0; i < 20000; i++) {
    uint64_t last = sl_job_last_checkpoint(job, 0);
    if (last && !first)
      first = last;
    if (first && last - first + 1 >= checkpoints)
      break;
    sl_test_sleep_us(1000);
  }
  sl_job_stop(job);
  int rc = sl_job_wait(job);
  if (rc != SL_ESTOPPED && rc != 0)
    cr_log_error("stopped run: %s", sl_job_error(job));
  sl_job_destroy(job);
  return rc;
}

/* Input for the replay tests: `files` files of per_file lines, every
 * 1000th one malformed, with the expected JSON lines output and dead-letter
 * entries (reason cut to a prefix: see trim_dead_letters). */
typedef struct replay_input {
  char *paths[3];
  int files;
  uint64_t records;
  text want, want_dead;
} replay_input;

static void make_replay_input(const char *dir, int format, uint64_t per_file,
                              replay_input *in) {
  memset(in, 0, sizeof *in);
  in->files = 3;
  text_add(&in->want, "", 0);
  text_add(&in->want_dead, "", 0);
  uint64_t i = 0;
  for (int k = 0; k < in->files; k++) {
    char name[32];
    snprintf(name, sizeof name, "in-%d.txt", k);
    in->paths[k] = sl_test_path_in(dir, name);
    text t = {0};
    uint64_t line = 1;
    if (format == SL_FORMAT_CSV_HEADER) {
      text_add(&t, csv_input_header, strlen(csv_input_header));
      line++;
    }
    for (uint64_t n = 0; n < per_file; n++, line++) {
      if (n % 1000 == 999) {
        const char *bad = format == SL_FORMAT_JSONL ? "{\"broken\": "
                                                    : "1,2,3";
        text_printf(&t, "%s\n", bad);
        text_printf(&in->want_dead, "%s\t%" PRIu64 "\t%s\t%s\n",
                    in->paths[k], line,
                    format == SL_FORMAT_JSONL ? "JSON" : "3 columns, "
                                                         "expected 6",
                    bad);
        continue;
      }
      if (format == SL_FORMAT_JSONL)
        input_jsonl(&t, i);
      else
        input_csv(&t, i, ',', true);
      expected_jsonl(&in->want, i);
      i++;
    }
    write_file(in->paths[k], t.data, t.length);
    free(t.data);
  }
  in->records = i;
}

static void free_replay_input(replay_input *in) {
  for (int k = 0; k < in->files; k++)
    free(in->paths[k]);
  free(in->want.data);
  free(in->want_dead.data);
}

/* The dead-letter file with each reason cut to what make_replay_input
 * expects (the JSON reason is jansson's text: keep "JSON"). */
static text trim_dead_letters(const char *path, int format) {
  text letters = read_file(path);
  text trimmed = {0};
  text_add(&trimmed, "", 0);
  for (char *l = letters.data; *l;) {
    char *end = strchr(l, '\n');
    cr_assert(end);
    char *c1 = strchr(l, '\t'), *c2 = c1 ? strchr(c1 + 1, '\t') : 0;
    char *c3 = c2 ? strchr(c2 + 1, '\t') : 0;
    cr_assert(c3 && c3 < end, "malformed entry %.*s", (int)(end - l), l);
    size_t keep = format == SL_FORMAT_JSONL ? 4 : (size_t)(c3 - c2 - 1);
    text_add(&trimmed, l, (size_t)(c2 - l) + 1 + keep);
    text_add(&trimmed, c3, (size_t)(end - c3) + 1);
    l = end + 1;
  }
  free(letters.data);
  return trimmed;
}

/* Compare the committed output and the dead letters with the input's. */
static void expect_replay_output(const char *out, const char *dead,
                                 int format, const replay_input *in) {
  int pending;
  text got = read_output(out, &pending);
  cr_expect_eq(count_lines(&got), in->records);
  expect_same_lines(&got, &in->want, "output");
  cr_expect_eq(pending, 0);
  text trimmed = trim_dead_letters(dead, format);
  expect_same_lines(&trimmed, &in->want_dead, "dead letters");
  free(trimmed.data);
  free(got.data);
}

/* Stop-and-resume three times, then run to the end: the exactly-once
 * output and the dead-letter file equal an uninterrupted run's. */
static void replay(int format) {
  char *dir = sl_test_temp_dir("io"), *out = sl_test_path_in(dir, "out");
  char *state = sl_test_path_in(dir, "state"), *dead = sl_test_path_in(dir, "dead.tsv");
  cr_assert_eq(mkdir(state, 0777), 0);
  replay_input in;
  make_replay_input(dir, format, sl_test_scaled(60000, 3000), &in);
  pipeline p = {.paths = (const char *const *)in.paths,
                .path_count = in.files, .format = format,
                .schema = &trade_schema, .out_dir = out, .exactly_once = 1,
                .output_format = sl_format_jsonl, .dead_letter_path = dead,
                .state_dir = state};
  int stopped = 0;
  for (int round = 0; round < 3; round++) {
    int rc = run_and_stop(&p, 2);
    cr_assert(rc == SL_ESTOPPED || rc == 0, "round %d: %s", round,
              sl_strerror(rc));
    stopped += rc == SL_ESTOPPED;
    p.policy = SL_STORE_RESUME;
  }
  run_result r = run_pipeline(&p);
  cr_assert_eq(r.rc, 0, "%s", r.error);
  cr_expect_gt(stopped, 0, "the job always finished before the stop");
  expect_replay_output(out, dead, format, &in);
  free_replay_input(&in);
  free(dead);
  free(state);
  free(out);
  sl_test_remove_tree(dir);
}

Test(io, jsonl_stop_and_resume_equals_an_uninterrupted_run) {
  replay(SL_FORMAT_JSONL);
}

Test(io, csv_with_header_stop_and_resume_equals_an_uninterrupted_run) {
  replay(SL_FORMAT_CSV_HEADER);
}

/* In-process failover: the source fails twice and the sink twice; each
 * restart restores the newest checkpoint (the source seeks, the dead-letter
 * file is cut back), and the result equals an uninterrupted run. */
Test(io, failover_restarts_resume_the_files_exactly) {
  char *dir = sl_test_temp_dir("io"), *out = sl_test_path_in(dir, "out");
  char *state = sl_test_path_in(dir, "state"), *dead = sl_test_path_in(dir, "dead.tsv");
  cr_assert_eq(mkdir(state, 0777), 0);
  replay_input in;
  make_replay_input(dir, SL_FORMAT_JSONL, sl_test_scaled(40000, 4000), &in);
  pipeline p = {.paths = (const char *const *)in.paths,
                .path_count = in.files, .format = SL_FORMAT_JSONL,
                .schema = &trade_schema, .out_dir = out, .exactly_once = 1,
                .output_format = sl_format_jsonl, .dead_letter_path = dead,
                .state_dir = state, .restart_attempts = 10};
  char faults[256];
  uint64_t step = in.records / 5;
  snprintf(faults, sizeof faults,
           "fail:op=source,record=%" PRIu64 ",times=2;"
           "fail:op=sink,record=%" PRIu64 ",times=2", step, step + step / 2);
  p.faults = faults;
  run_result r = run_pipeline(&p);
  cr_assert_eq(r.rc, 0, "%s", r.error);
  cr_expect_eq(r.restarts, 4);
  cr_expect_gt(r.restarts_from_checkpoint, 0, "every restart began again");
  expect_replay_output(out, dead, SL_FORMAT_JSONL, &in);
  free_replay_input(&in);
  free(dead);
  free(state);
  free(out);
  sl_test_remove_tree(dir);
}

Test(io, a_restore_with_another_file_list_is_refused) {
  char *dir = sl_test_temp_dir("io"), *out = sl_test_path_in(dir, "out");
  char *state = sl_test_path_in(dir, "state");
  cr_assert_eq(mkdir(state, 0777), 0);
  text unused = {0};
  char **paths = make_inputs(dir, 3, 20000, SL_FORMAT_JSONL, 0, ".jsonl",
                             &unused, true);
  pipeline p = {.paths = (const char *const *)paths, .path_count = 3,
                .format = SL_FORMAT_JSONL, .schema = &trade_schema,
                .out_dir = out, .exactly_once = 1,
                .output_format = sl_format_jsonl, .state_dir = state};
  int rc = run_and_stop(&p, 1);
  cr_assert(rc == SL_ESTOPPED || rc == 0);
  /* Two other files: wherever the checkpoint stood, it does not fit. */
  char *other[2] = {sl_test_path_in(dir, "x.jsonl"), sl_test_path_in(dir, "y.jsonl")};
  write_file(other[0], "", 0);
  write_file(other[1], "", 0);
  p.paths = (const char *const *)other;
  p.path_count = 2;
  p.policy = SL_STORE_RESUME;
  run_result r = run_pipeline(&p);
  cr_expect_neq(r.rc, 0);
  cr_expect(strstr(r.error, "of another file list"), "%s", r.error);
  free(other[0]);
  free(other[1]);
  free(unused.data);
  free_paths(paths, 3);
  free(state);
  free(out);
  sl_test_remove_tree(dir);
}

/* ------------------------------------------------------------ stdin, stdout */

/* Point fd at path (opened with flags); returns a copy of the old fd. */
static int redirect(int fd, const char *path, int flags) {
  int saved = dup(fd);
  cr_assert_geq(saved, 0);
  int file = open(path, flags, 0666);
  cr_assert_geq(file, 0, "open %s: %s", path, strerror(errno));
  cr_assert_geq(dup2(file, fd), 0);
  close(file);
  return saved;
}

static void restore_fd(int fd, int saved) {
  cr_assert_geq(dup2(saved, fd), 0);
  close(saved);
}

Test(io, stdin_jsonl_to_stdout_csv) {
  char *dir = sl_test_temp_dir("io");
  char *input = sl_test_path_in(dir, "in.jsonl"), *output = sl_test_path_in(dir, "out.csv");
  char *dead = sl_test_path_in(dir, "dead.tsv");
  text in = {0}, want = {0};
  text_add(&want, "", 0);
  for (uint64_t i = 0; i < 5000; i++) {
    input_jsonl(&in, i);
    expected_csv(&want, i);
  }
  text_add(&in, "[]\n", 3); /* line 5001: a dead letter */
  write_file(input, in.data, in.length);
  write_file(dead, "earlier\n", 8); /* appended to, never truncated */
  int saved_in = redirect(STDIN_FILENO, input, O_RDONLY);
  fflush(stdout);
  int saved_out = redirect(STDOUT_FILENO, output,
                           O_WRONLY | O_CREAT | O_TRUNC);
  /* With checkpoints: the stdin source's snapshots save no position, and
   * the stdout sink flushes in its own. */
  char *state = sl_test_path_in(dir, "state");
  cr_assert_eq(mkdir(state, 0777), 0);
  sl_job_config config = SL_JOB_CONFIG_INIT;
  config.checkpoint.state_dir = state;
  config.checkpoint.interval_ms = 5;
  config.checkpoint.no_sync = 1;
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  sl_op *src, *sink;
  cr_assert_eq(sl_source_stdin(job, "stdin", SL_FORMAT_JSONL, &trade_schema,
                               dead, &src), 0);
  cr_assert_eq(sl_sink_stdout(job, "stdout", src, sl_format_csv,
                              (void *)&trade_schema, &sink), 0);
  int rc = sl_job_run(job);
  fflush(stdout);
  restore_fd(STDOUT_FILENO, saved_out);
  restore_fd(STDIN_FILENO, saved_in);
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  sl_op_stats stats;
  cr_assert_eq(sl_job_stats(job, 0, &stats), 0);
  cr_expect_eq(stats.dead_letters, 1);
  cr_expect_gt(sl_job_last_checkpoint(job, 0), 0);
  sl_job_destroy(job);
  free(state);
  text got = read_file(output), letters = read_file(dead);
  expect_same_lines(&got, &want, "stdin -> stdout");
  cr_expect_str_eq(letters.data,
                   "earlier\n<stdin>\t5001\tnot a JSON object (an array)\t[]\n");
  free(got.data);
  free(letters.data);
  free(in.data);
  free(want.data);
  free(input);
  free(output);
  free(dead);
  sl_test_remove_tree(dir);
}

/* A line of 1000 + 9000 * value bytes of one letter: some fit the stdout
 * sink's buffer, some force a flush first, some are larger than it. */
static int long_line(void *user, const sl_record *in, char *buffer,
                     uint32_t buffer_bytes) {
  (void)user;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  uint32_t n = 1000 + 9000 * (uint32_t)t.value;
  if (n <= buffer_bytes)
    memset(buffer, 'a' + (int)(t.value % 26), n);
  return (int)n;
}

Test(io, stdout_sink_writes_short_and_very_long_lines_in_order) {
  char *dir = sl_test_temp_dir("io"), *output = sl_test_path_in(dir, "out.txt");
  sl_tuple records[20];
  text want = {0};
  text_add(&want, "", 0);
  for (uint64_t i = 0; i < 20; i++) {
    records[i] = (sl_tuple){.key = i, .value = i};
    uint32_t n = 1000 + 9000 * (uint32_t)i;
    char *line = malloc(n);
    memset(line, 'a' + (int)(i % 26), n);
    text_add(&want, line, n);
    text_add(&want, "\n", 1);
    free(line);
  }
  fflush(stdout);
  int saved_out = redirect(STDOUT_FILENO, output,
                           O_WRONLY | O_CREAT | O_TRUNC);
  printf("printed first\n"); /* stdio output comes out before the records */
  sl_job *job;
  cr_assert_eq(sl_job_create(0, &job), 0);
  sl_op *src, *sink;
  cr_assert_eq(sl_source_memory(job, "memory", records, sizeof records[0], 20,
                                &src), 0);
  cr_assert_eq(sl_sink_stdout(job, "stdout", src, long_line, 0, &sink), 0);
  int rc = sl_job_run(job);
  fflush(stdout);
  restore_fd(STDOUT_FILENO, saved_out);
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  sl_job_destroy(job);
  text got = read_file(output);
  cr_assert(strncmp(got.data, "printed first\n", 14) == 0);
  text rest = {got.data + 14, got.length - 14, 0};
  expect_same_lines(&rest, &want, "stdout long lines");
  free(got.data);
  free(want.data);
  free(output);
  sl_test_remove_tree(dir);
}

Test(io, stdout_sink_without_format_writes_the_bytes) {
  char *dir = sl_test_temp_dir("io"), *input = sl_test_path_in(dir, "in.txt");
  char *output = sl_test_path_in(dir, "out.txt");
  const char lines[] = "alpha\nbeta, \"gamma\"\n\ndelta\n";
  write_file(input, lines, sizeof lines - 1);
  fflush(stdout);
  int saved_out = redirect(STDOUT_FILENO, output,
                           O_WRONLY | O_CREAT | O_TRUNC);
  sl_job *job;
  cr_assert_eq(sl_job_create(0, &job), 0);
  sl_op *src, *sink;
  cr_assert_eq(sl_source_lines(job, "lines", input, &src), 0);
  cr_assert_eq(sl_sink_stdout(job, "stdout", src, 0, 0, &sink), 0);
  int rc = sl_job_run(job);
  restore_fd(STDOUT_FILENO, saved_out);
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  sl_job_destroy(job);
  text got = read_file(output);
  cr_expect_str_eq(got.data, lines);
  free(got.data);
  free(input);
  free(output);
  sl_test_remove_tree(dir);
}

typedef struct trickle {
  int fd;
  const text *data;
} trickle;

/* Write data in small pieces that cut lines, with pauses longer than the
 * source's 100 ms wait now and then. */
static void *trickle_main(void *arg) {
  trickle *t = arg;
  size_t at = 0, piece = 0;
  while (at < t->data->length) {
    size_t n = 1 + (piece * 7919) % 97;
    if (n > t->data->length - at)
      n = t->data->length - at;
    ssize_t w = write(t->fd, t->data->data + at, n);
    if (w <= 0)
      break;
    at += (size_t)w;
    if (++piece % 500 == 0)
      sl_test_sleep_us(150000);
  }
  close(t->fd);
  return 0;
}

Test(io, stdin_pipe_with_lines_cut_into_pieces) {
  char *dir = sl_test_temp_dir("io"), *out = sl_test_path_in(dir, "out");
  text in = {0}, want = {0};
  text_add(&want, "", 0);
  for (uint64_t i = 0; i < 3000; i++) {
    input_csv(&in, i, ',', false);
    expected_jsonl(&want, i);
  }
  int pipe_fds[2];
  cr_assert_eq(pipe(pipe_fds), 0);
  int saved_in = dup(STDIN_FILENO);
  cr_assert_geq(dup2(pipe_fds[0], STDIN_FILENO), 0);
  close(pipe_fds[0]);
  trickle t = {.fd = pipe_fds[1], .data = &in};
  pthread_t writer;
  cr_assert_eq(pthread_create(&writer, 0, trickle_main, &t), 0);
  sl_job *job;
  cr_assert_eq(sl_job_create(0, &job), 0);
  sl_op *src, *sink;
  cr_assert_eq(sl_source_stdin(job, "stdin", SL_FORMAT_CSV, &trade_schema, 0,
                               &src), 0);
  sl_file_sink_config fc = {.dir = out, .exactly_once = 1,
                            .format = sl_format_jsonl,
                            .format_user = (void *)&trade_schema};
  cr_assert_eq(sl_sink_file(job, "sink", src, 1, &fc, &sink), 0);
  int rc = sl_job_run(job);
  pthread_join(writer, 0);
  restore_fd(STDIN_FILENO, saved_in);
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  sl_job_destroy(job);
  text got = read_output(out, 0);
  expect_same_lines(&got, &want, "stdin pipe");
  free(got.data);
  free(in.data);
  free(want.data);
  free(out);
  sl_test_remove_tree(dir);
}

Test(io, stdin_stops_promptly_on_a_quiet_pipe) {
  int pipe_fds[2];
  cr_assert_eq(pipe(pipe_fds), 0);
  int saved_in = dup(STDIN_FILENO);
  cr_assert_geq(dup2(pipe_fds[0], STDIN_FILENO), 0);
  close(pipe_fds[0]);
  cr_assert_eq(write(pipe_fds[1], "1,a,2,3,true\n", 13), 13);
  sl_job *job;
  cr_assert_eq(sl_job_create(0, &job), 0);
  sl_op *src, *sink;
  cr_assert_eq(sl_source_stdin(job, "stdin", SL_FORMAT_CSV, &trade_schema, 0,
                               &src), 0);
  captured c = {0};
  static const sl_process_ops ops = {.open = capture_open,
                                     .process = capture_process};
  cr_assert_eq(sl_op_sink(job, "capture", src, 1, &ops, &c, &sink), 0);
  cr_assert_eq(sl_job_start(job), 0);
  /* Wait (bounded) for the line written before the pause, so the source
   * is then blocked on the quiet pipe, whatever the scheduler did. */
  for (int i = 0; i < 60000 && __atomic_load_n(&c.count, __ATOMIC_ACQUIRE) < 1;
       i++)
    sl_test_sleep_us(1000);
  double t0 = sl_test_now_s();
  sl_job_stop(job);
  /* A stop that never reaches the blocked read hangs: the watchdog's 30 s
   * bound fails the test then.  The latency itself is measured, not
   * asserted (timing belongs in bench/). */
  sl_test_watchdog w;
  sl_test_watchdog_arm(&w, job, 30, "stdin stop");
  int rc = sl_job_wait(job);
  cr_expect_not(sl_test_watchdog_disarm(&w), "stop never reached stdin");
  cr_log_info("stdin source stopped %.1f ms after sl_job_stop",
              (sl_test_now_s() - t0) * 1e3);
  restore_fd(STDIN_FILENO, saved_in);
  close(pipe_fds[1]);
  cr_expect_eq(rc, SL_ESTOPPED);
  cr_expect_eq(c.count, 1, "the line written before the pause arrives");
  sl_job_destroy(job);
}

/* ------------------------------------------------------------ formatters */

Test(io, formatters_report_the_length_they_need_and_round_trip_doubles) {
  trade t;
  memset(&t, 0, sizeof t);
  t.time_ms = -12;
  strcpy(t.symbol, "a\"b,c");
  t.price = 0.1 + 0.2; /* needs 17 digits */
  t.quantity = INT32_MIN;
  t.urgent = true;
  sl_record r = {&t, sizeof t, SL_NO_TIMESTAMP};
  const char csv[] = "-12,\"a\"\"b,c\",0.30000000000000004,-2147483648,true";
  const char json[] = "{\"time_ms\":-12,\"symbol\":\"a\\\"b,c\",\"price\":"
                      "0.30000000000000004,\"quantity\":-2147483648,"
                      "\"urgent\":true}";
  char buffer[256];
  cr_expect_eq(sl_format_csv((void *)&trade_schema, &r, 0, 0),
               (int)strlen(csv));
  cr_expect_eq(sl_format_csv((void *)&trade_schema, &r, buffer, 10),
               (int)strlen(csv));
  int n = sl_format_csv((void *)&trade_schema, &r, buffer, sizeof buffer);
  cr_assert_eq(n, (int)strlen(csv));
  cr_expect(memcmp(buffer, csv, (size_t)n) == 0, "%.*s", n, buffer);
  cr_expect_eq(sl_format_jsonl((void *)&trade_schema, &r, 0, 0),
               (int)strlen(json));
  n = sl_format_jsonl((void *)&trade_schema, &r, buffer, sizeof buffer);
  cr_assert_eq(n, (int)strlen(json));
  cr_expect(memcmp(buffer, json, (size_t)n) == 0, "%.*s", n, buffer);
  /* Doubles: the shortest text that reads back exactly. */
  const double values[] = {0.1, 1.0 / 3.0, 1e-300, -2.5e300, 5e-324,
                           123456789012345678.0, -0.0};
  for (size_t k = 0; k < sizeof values / sizeof values[0]; k++) {
    t.price = values[k];
    n = sl_format_csv((void *)&trade_schema, &r, buffer, sizeof buffer);
    cr_assert_lt(n, (int)sizeof buffer);
    buffer[n] = 0;
    char *price = strstr(buffer, "\",") + 2;
    double back = strtod(price, 0);
    cr_expect(memcmp(&back, &values[k], sizeof back) == 0 ||
                  (back == 0 && values[k] == 0),
              "%.17g printed as %s", values[k], price);
  }
  t.price = 0.1;
  n = sl_format_csv((void *)&trade_schema, &r, buffer, sizeof buffer);
  buffer[n] = 0;
  cr_expect(strstr(buffer, ",0.1,"), "%s", buffer);
  /* Errors. */
  sl_record short_record = {&t, sizeof t - 1, SL_NO_TIMESTAMP};
  cr_expect_eq(sl_format_csv((void *)&trade_schema, &short_record, buffer,
                             sizeof buffer), -EINVAL);
  cr_expect_eq(sl_format_jsonl((void *)&trade_schema, &short_record, buffer,
                               sizeof buffer), -EINVAL);
  t.price = NAN;
  cr_expect_eq(sl_format_jsonl((void *)&trade_schema, &r, buffer,
                               sizeof buffer), -EDOM);
  t.price = 1;
  strcpy(t.symbol, "\xff\xfe");
  cr_expect_eq(sl_format_jsonl((void *)&trade_schema, &r, buffer,
                               sizeof buffer), -EILSEQ);
  /* A full string field without its NUL is read only to its end. */
  memset(t.symbol, 'Z', sizeof t.symbol);
  n = sl_format_csv((void *)&trade_schema, &r, buffer, sizeof buffer);
  buffer[n] = 0;
  cr_expect(strstr(buffer, ",ZZZZZZZZ,"), "%s", buffer);
  n = sl_format_csv_header(&trade_schema, buffer, sizeof buffer);
  cr_expect_eq(n, (int)strlen("time_ms,symbol,price,quantity,urgent"));
  cr_expect(memcmp(buffer, "time_ms,symbol,price,quantity,urgent",
                   (size_t)n) == 0);
}

Test(io, json_strings_escape_control_characters_and_keep_utf8) {
  typedef struct s {
    char text[32];
  } s;
  static const sl_field f[] = {SL_FIELD(s, text, SL_FIELD_STRING)};
  static const sl_schema schema = {f, 1, sizeof(s), 0};
  s v;
  memset(&v, 0, sizeof v);
  strcpy(v.text, "q\"\\/\n\t\x01\xc3\xa9");
  sl_record r = {&v, sizeof v, SL_NO_TIMESTAMP};
  char buffer[128];
  int n = sl_format_jsonl((void *)&schema, &r, buffer, sizeof buffer);
  cr_assert_gt(n, 0);
  buffer[n] = 0;
  cr_expect_str_eq(buffer, "{\"text\":\"q\\\"\\\\/\\n\\t\\u0001\xc3\xa9\"}");
}

/* ------------------------------------------------------------ schemas */

typedef struct wide {
  int64_t a;
  double b;
  char c[4];
  int32_t d;
} wide;

Test(io, invalid_schemas_are_refused_with_the_reason) {
  static const sl_field overlap[] = {{"a", SL_FIELD_INT64, 0, 8, 0},
                                     {"b", SL_FIELD_DOUBLE, 4, 8, 0}};
  static const sl_field outside[] = {{"a", SL_FIELD_INT64, 0, 8, 0},
                                     {"b", SL_FIELD_DOUBLE, 20, 8, 0}};
  static const sl_field duplicate[] = {{"a", SL_FIELD_INT64, 0, 8, 0},
                                       {"a", SL_FIELD_DOUBLE, 8, 8, 0}};
  static const sl_field wrong_size[] = {{"a", SL_FIELD_INT64, 0, 4, 0}};
  static const sl_field empty_string[] = {{"s", SL_FIELD_STRING, 0, 0, 0}};
  static const sl_field unknown_type[] = {{"a", 99, 0, 8, 0}};
  static const sl_field no_name[] = {{"", SL_FIELD_INT64, 0, 8, 0}};
  static const sl_field tab_name[] = {{"a\tb", SL_FIELD_INT64, 0, 8, 0}};
  static const sl_field bad_flags[] = {{"a", SL_FIELD_INT64, 0, 8, 0x10}};
  static const sl_field good[] = {SL_FIELD(wide, a, SL_FIELD_INT64),
                                  SL_FIELD(wide, b, SL_FIELD_DOUBLE),
                                  SL_FIELD(wide, c, SL_FIELD_STRING),
                                  SL_FIELD(wide, d, SL_FIELD_INT32)};
  static const struct {
    sl_schema schema;
    const char *reason;
  } cases[] = {
      {{overlap, 2, 24, 0}, "field 1 (\"b\") overlaps field 0 (\"a\")"},
      {{outside, 2, 24, 0},
       "field 1 (\"b\"): bytes 20..27 are outside the 24-byte record"},
      {{duplicate, 2, 16, 0}, "fields 0 and 1 are both named \"a\""},
      {{wrong_size, 1, 8, 0},
       "field 0 (\"a\"): an SL_FIELD_INT64 is 8 bytes, not 4"},
      {{empty_string, 1, 8, 0}, "a string field needs at least 1 byte"},
      {{unknown_type, 1, 8, 0}, "field 0 (\"a\"): unknown type 99"},
      {{no_name, 1, 8, 0}, "field 0 has no name"},
      {{tab_name, 1, 8, 0}, "field 0: name holds a tab or line break"},
      {{bad_flags, 1, 8, 0}, "unknown flags 0x10"},
      {{good, 4, sizeof(wide), "e"},
       "timestamp_field \"e\" is not a field of the schema"},
      {{good, 4, sizeof(wide), "b"},
       "timestamp_field \"b\" is an SL_FIELD_DOUBLE, not an SL_FIELD_INT64"},
      {{good, 0, sizeof(wide), 0}, "schema has 0 fields"},
      {{0, 1, sizeof(wide), 0}, "schema fields are NULL"},
      {{good, 4, 0, 0}, "schema record_bytes is 0"},
  };
  char err[256];
  cr_expect_eq(sl_schema_validate(&(sl_schema){good, 4, sizeof(wide), "a"},
                                  err, sizeof err), 0, "%s", err);
  cr_expect_eq(sl_schema_validate(0, err, sizeof err), EINVAL);
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    cr_expect_eq(sl_schema_validate(&cases[k].schema, err, sizeof err),
                 EINVAL, "case %zu", k);
    cr_expect(strstr(err, cases[k].reason), "case %zu: '%s' lacks '%s'", k,
              err, cases[k].reason);
    /* The builders refuse it the same way, with the job's error. */
    sl_job *job;
    cr_assert_eq(sl_job_create(0, &job), 0);
    const char *paths[] = {"/nonexistent"};
    sl_file_source_config in = {.paths = paths, .path_count = 1,
                                .format = SL_FORMAT_JSONL,
                                .schema = &cases[k].schema};
    sl_op *op;
    cr_expect_eq(sl_source_file(job, "src", &in, &op), EINVAL, "case %zu", k);
    cr_expect(strstr(sl_job_error(job), "operator 'src': schema: "),
              "case %zu: %s", k, sl_job_error(job));
    cr_expect(strstr(sl_job_error(job), cases[k].reason), "case %zu: %s", k,
              sl_job_error(job));
    cr_expect_eq(sl_source_stdin(job, "in", SL_FORMAT_CSV, &cases[k].schema,
                                 0, &op), EINVAL, "case %zu", k);
    sl_job_destroy(job);
  }
}

Test(io, invalid_source_configs_are_refused) {
  sl_job *job;
  sl_job_config config = {.struct_bytes = sizeof(sl_job_config), .max_record_bytes = 1024};
  cr_assert_eq(sl_job_create(&config, &job), 0);
  const char *paths[] = {"a", 0};
  sl_op *op;
  sl_file_source_config c = {.paths = paths, .path_count = 1,
                             .format = SL_FORMAT_JSONL,
                             .schema = &trade_schema};
  cr_expect_eq(sl_source_file(job, "s", 0, &op), EINVAL);
  c.path_count = 0;
  cr_expect_eq(sl_source_file(job, "s", &c, &op), EINVAL);
  c.path_count = 2;
  cr_expect_eq(sl_source_file(job, "s", &c, &op), EINVAL);
  cr_expect(strstr(sl_job_error(job), "path 1 is NULL"), "%s",
            sl_job_error(job));
  c.path_count = 1;
  c.format = 7;
  cr_expect_eq(sl_source_file(job, "s", &c, &op), EINVAL);
  cr_expect(strstr(sl_job_error(job), "unknown format 7"), "%s",
            sl_job_error(job));
  c.format = SL_FORMAT_CSV;
  c.csv_delimiter = '"';
  cr_expect_eq(sl_source_file(job, "s", &c, &op), EINVAL);
  c.csv_delimiter = 0;
  c.max_line_bytes = 1u << 30;
  cr_expect_eq(sl_source_file(job, "s", &c, &op), EINVAL);
  c.max_line_bytes = 0;
  static const sl_field big_field[] = {{"s", SL_FIELD_STRING, 0, 2000, 0}};
  sl_schema big = {big_field, 1, 2000, 0};
  c.schema = &big;
  cr_expect_eq(sl_source_file(job, "s", &c, &op), EINVAL);
  cr_expect(strstr(sl_job_error(job), "over the job's max_record_bytes 1024"),
            "%s", sl_job_error(job));
  c.schema = &trade_schema;
  c.dead_letter_path = "";
  cr_expect_eq(sl_source_file(job, "s", &c, &op), EINVAL);
  c.dead_letter_path = 0;
  cr_expect_eq(sl_source_file(job, "s", &c, &op), 0); /* all fixed */
  sl_job_destroy(job);
}
