/* test_io.c — the CSV / JSON lines file sources and file sinks: round
 * trips, timestamps, malformed lines and dead letters, headers and optional
 * fields, and replay after stop-and-resume and failover.  stdin, stdout,
 * the formatters and schema validation are in test_io_stdio.c; the two
 * share io_fixtures.h.
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

#include "io_fixtures.h"

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
