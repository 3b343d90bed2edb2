/* test_io_stdio.c — the stdin source and the stdout sink (redirected to
 * files and pipes), the formatters' lengths and escaping, and the refusal
 * of invalid schemas and source configs.  The file sources, dead letters
 * and replay are in test_io.c; both share io_fixtures.h.
 *
 * Real jobs, real files and pipes in temporary directories. */
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

#include "io_fixtures.h"

TestSuite(io, .timeout = 240);

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
