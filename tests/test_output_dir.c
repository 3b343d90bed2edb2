/* test_output_dir.c — an output directory belongs to one job lineage, a
 * committed part is never replaced, and the merge of `nexmark run
 * --output` (cli/merge.c) sorts RFC 4180 rows in bounded memory.
 *
 * - merge: random rows with quotes, commas and newlines in fields, merged
 *   with tiny run buffers (thousands of spilled runs, several merge
 *   levels) and with the default buffer, against an independent sort.
 * - lineage: jobs of the library into one directory: another lineage's
 *   parts are refused, cleared on request, and a restore into a directory
 *   another lineage took over is refused.
 * - window: `sluice run window` (SLUICE_BIN) with --fresh into the same
 *   --output, a second lineage refused, and a SIGKILL with --resume still
 *   exactly-once. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "merge.h"
#include "output_dir.h"
#include "sluice.h"
#include "test_dirs.h"
#include "test_spawn.h"
#include "test_util.h"

/* ------------------------------------------------------------ merge */

typedef struct row_set {
  char **data;
  size_t *bytes;
  size_t count;
} row_set;

static uint64_t next_random(uint64_t *s) {
  *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
  return *s;
}

/* One random CSV row: 1-4 fields, each plain (letters, bytes >= 0x80) or
 * quoted (holding commas, newlines, CR and doubled quotes). */
static void random_row(uint64_t *rng, char *out, size_t *bytes) {
  static const char plain[] = "abcxyz019 \x80\xff";
  static const char special[] = "ab,\n\r\"";
  size_t n = 0;
  int fields = 1 + (int)(next_random(rng) % 4);
  for (int f = 0; f < fields; f++) {
    if (f)
      out[n++] = ',';
    bool quoted = next_random(rng) % 3 == 0;
    int len = (int)(next_random(rng) % 7); /* empty fields too */
    if (quoted)
      out[n++] = '"';
    for (int i = 0; i < len; i++) {
      char c = quoted ? special[next_random(rng) % (sizeof special - 1)]
                      : plain[next_random(rng) % (sizeof plain - 1)];
      out[n++] = c;
      if (c == '"')
        out[n++] = '"';
    }
    if (quoted)
      out[n++] = '"';
  }
  *bytes = n;
}

static int compare_refs(const void *a, const void *b, void *set) {
  const row_set *s = set;
  size_t i = *(const size_t *)a, j = *(const size_t *)b;
  size_t n = s->bytes[i] < s->bytes[j] ? s->bytes[i] : s->bytes[j];
  int c = memcmp(s->data[i], s->data[j], n);
  if (c)
    return c;
  return s->bytes[i] < s->bytes[j] ? -1 : s->bytes[i] > s->bytes[j];
}

/* parts part files of random rows in dir (each with the header first);
 * returns the file the merge must write. */
static char *write_random_parts(const char *dir, const char *header,
                                int parts, size_t rows, uint64_t seed,
                                size_t *expected_bytes) {
  row_set set = {calloc(rows, sizeof(char *)), calloc(rows, sizeof(size_t)),
                 rows};
  cr_assert(set.data && set.bytes);
  uint64_t rng = seed * 0x9e3779b97f4a7c15ull + 1;
  FILE *files[16];
  cr_assert(parts <= 16);
  for (int p = 0; p < parts; p++) {
    char name[64];
    snprintf(name, sizeof name, "part-%d-%08d.csv", p % 3, p);
    char *path = sl_test_path_in(dir, name);
    files[p] = fopen(path, "wb");
    cr_assert(files[p], "%s", path);
    fprintf(files[p], "%s\n", header);
    free(path);
  }
  char row[128];
  size_t total = strlen(header) + 1;
  for (size_t i = 0; i < rows; i++) {
    if (i > 0 && next_random(&rng) % 5 == 0) {
      /* A duplicate, or a prefix: one byte off a plain last field keeps
       * the row valid CSV. */
      size_t j = next_random(&rng) % i, n = set.bytes[j];
      if (n && set.data[j][n - 1] != '"')
        n -= next_random(&rng) % 2;
      memcpy(row, set.data[j], n);
      set.bytes[i] = n;
    } else {
      random_row(&rng, row, &set.bytes[i]);
    }
    set.data[i] = malloc(set.bytes[i] + 1);
    memcpy(set.data[i], row, set.bytes[i]);
    FILE *f = files[next_random(&rng) % (uint64_t)parts];
    fwrite(row, 1, set.bytes[i], f);
    fputc('\n', f);
    total += set.bytes[i] + 1;
  }
  for (int p = 0; p < parts; p++)
    cr_assert_eq(fclose(files[p]), 0);
  size_t *order = malloc(rows * sizeof *order);
  for (size_t i = 0; i < rows; i++)
    order[i] = i;
  qsort_r(order, rows, sizeof *order, compare_refs, &set);
  char *expected = malloc(total + 1), *p = expected;
  p += sprintf(p, "%s\n", header);
  for (size_t i = 0; i < rows; i++) {
    memcpy(p, set.data[order[i]], set.bytes[order[i]]);
    p += set.bytes[order[i]];
    *p++ = '\n';
  }
  for (size_t i = 0; i < rows; i++)
    free(set.data[i]);
  free(set.data), free(set.bytes), free(order);
  *expected_bytes = total;
  return expected;
}

/* Files in dir whose names start with prefix. */
static int count_named(const char *dir, const char *prefix) {
  DIR *d = opendir(dir);
  cr_assert(d, "opendir %s", dir);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));)
    n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
  closedir(d);
  return n;
}

Test(merge, external_merge_gives_the_bytes_of_one_sort, .timeout = 120) {
  char *dir = sl_test_temp_dir("merge");
  char *parts = sl_test_path_in(dir, "out.csv.parts");
  char *out = sl_test_path_in(dir, "out.csv");
  cr_assert_eq(mkdir(parts, 0755), 0);
  size_t rows = (size_t)sl_test_scaled(40000, 4000), n = 0;
  char *expected = write_random_parts(parts, "h1,h2", 7, rows, 17, &n);
  /* 1 byte: a run per row, about log16(rows) merge levels; 4 KiB: runs of
   * dozens of rows; the default: one sort in memory. */
  size_t run_bytes[] = {1, 4096, MERGE_DEFAULT_RUN_BYTES};
  for (int i = 0; i < 3; i++) {
    uint64_t written = 0;
    char err[512];
    int rc = merge_parts(parts, out, "h1,h2", run_bytes[i], &written, err,
                         sizeof err);
    cr_assert_eq(rc, 0, "merge with runs of %zu bytes: %s", run_bytes[i],
                 err);
    cr_assert_eq(written, rows);
    size_t got_bytes = 0;
    char *got = sl_test_read_file(out, &got_bytes);
    cr_assert_eq(got_bytes, n, "runs of %zu bytes: %zu bytes, want %zu",
                 run_bytes[i], got_bytes, n);
    cr_assert(memcmp(got, expected, n) == 0,
              "runs of %zu bytes: the bytes differ", run_bytes[i]);
    free(got);
    /* The spilled runs were unlinked at once; nothing is left beside. */
    cr_assert_eq(count_named(dir, "out.csv.sort-"), 0);
    cr_assert_eq(count_named(dir, "out.csv.tmp"), 0);
  }
  free(expected);
  sl_test_remove_tree(dir);
  free(parts), free(out);
}

Test(merge, a_part_ending_inside_quotes_is_refused_by_name) {
  char *dir = sl_test_temp_dir("merge");
  char *part = sl_test_path_in(dir, "part-0-00000000.csv");
  char *out = sl_test_path_in(dir, "out.csv");
  FILE *f = fopen(part, "w");
  cr_assert(f);
  fputs("h\nok\n\"open,\nnever closed\n", f);
  fclose(f);
  char err[512];
  uint64_t rows = 0;
  int rc = merge_parts(dir, out, "h", 64, &rows, err, sizeof err);
  cr_assert_eq(rc, EINVAL, "%d: %s", rc, err);
  cr_assert(strstr(err, part) && strstr(err, "inside a quoted field"), "%s",
            err);
  cr_assert_eq(access(out, F_OK), -1, "a failed merge wrote %s", out);
  sl_test_remove_tree(dir);
  free(part), free(out);
}

/* ------------------------------------------------------------ lineage */

#define LINE_BYTES 8

typedef struct lineage_job {
  const char *state_dir;
  int store_policy;
  const char *out;
  char tag; /* first byte of each line: whose output it is */
  int clear;
  char records[64][LINE_BYTES];
} lineage_job;

/* Run a job: 64 lines "T0000nn" into a transactional sink on out (2
 * instances, checkpointing into state_dir).  Returns its status; the
 * error text into err. */
static int run_lineage_job(lineage_job *j, char *err, size_t err_bytes) {
  for (int i = 0; i < 64; i++) {
    char line[16];
    snprintf(line, sizeof line, "%c%07d", j->tag, i);
    memcpy(j->records[i], line, LINE_BYTES);
  }
  sl_job_config config = SL_JOB_CONFIG_INIT;
  config.checkpoint.state_dir = j->state_dir;
  config.checkpoint.store_policy = j->store_policy;
  sl_job *job = 0;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  sl_op *src, *sink;
  cr_assert_eq(sl_source_memory(job, "lines", j->records, LINE_BYTES, 64,
                                &src), 0);
  sl_file_sink_config fc = {.dir = j->out, .exactly_once = 1,
                            .clear_other_lineage = j->clear};
  cr_assert_eq(sl_sink_file(job, "files", src, 2, &fc, &sink), 0);
  int rc = sl_job_start(job);
  if (rc == 0) {
    sl_test_watchdog w;
    sl_test_watchdog_arm(&w, job, 60, "lineage job");
    rc = sl_job_wait(job);
    cr_assert_not(sl_test_watchdog_disarm(&w), "the job hung");
  }
  snprintf(err, err_bytes, "%s", sl_job_error(job));
  sl_job_destroy(job);
  return rc;
}

/* Every committed line of dir concatenated in file name order, and the
 * count of lines starting with tag. */
static char *committed_text(const char *dir, char tag, int *lines) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "cd '%s' && ls | grep '^part-' | sort | "
           "xargs -r cat", dir);
  FILE *p = popen(cmd, "r");
  cr_assert(p);
  size_t cap = 1 << 16, n = 0;
  char *text = malloc(cap);
  size_t got;
  while ((got = fread(text + n, 1, cap - n - 1, p)) > 0)
    n += got;
  pclose(p);
  text[n] = 0;
  *lines = 0;
  for (char *l = text; *l; l = strchr(l, '\n') + 1)
    *lines += *l == tag;
  return text;
}

Test(lineage, another_lineage_is_refused_cleared_on_request_never_mixed,
     .timeout = 120) {
  char *root = sl_test_temp_dir("lineage");
  char *out = sl_test_path_in(root, "out");
  char *state_a = sl_test_path_in(root, "state-a");
  char *state_b = sl_test_path_in(root, "state-b");
  char err[1024];
  lineage_job a = {.state_dir = state_a, .out = out, .tag = 'A'};
  cr_assert_eq(run_lineage_job(&a, err, sizeof err), 0, "%s", err);
  int lines = 0;
  char *before = committed_text(out, 'A', &lines);
  cr_assert_eq(lines, 64);

  /* B starts with nothing to restore: A's parts refuse it, untouched. */
  lineage_job b = {.state_dir = state_b, .out = out, .tag = 'B'};
  int rc = run_lineage_job(&b, err, sizeof err);
  cr_assert_neq(rc, 0, "a second lineage wrote into A's directory");
  cr_assert(strstr(err, out) && strstr(err, "another run's output"),
            "the error does not name the directory: %s", err);
  char *after = committed_text(out, 'A', &lines);
  cr_assert_str_eq(after, before, "A's committed output changed");
  free(after);

  /* Asked to clear, B deletes A's parts and owns the directory. */
  b.clear = 1;
  b.store_policy = SL_STORE_FRESH;
  cr_assert_eq(run_lineage_job(&b, err, sizeof err), 0, "%s", err);
  after = committed_text(out, 'B', &lines);
  cr_assert_eq(lines, 64, "B's lines: %d", lines);
  cr_assert_null(strchr(after, 'A'), "A's lines are mixed in:\n%s", after);
  free(after);

  /* A resumed now would write into B's directory: refused. */
  a.store_policy = SL_STORE_RESUME;
  rc = run_lineage_job(&a, err, sizeof err);
  cr_assert_neq(rc, 0, "A resumed into B's directory");
  cr_assert(strstr(err, out) && strstr(err, "belongs to job lineage"),
            "%s", err);
  free(before);
  sl_test_remove_tree(root);
  free(out), free(state_a), free(state_b);
}

/* A part committed past the checkpoint a restore starts from is another
 * run's (one that went on from it): the restore refuses to write over or
 * beside it. */
Test(lineage, a_part_committed_after_the_restored_checkpoint_is_refused,
     .timeout = 120) {
  char *root = sl_test_temp_dir("lineage");
  char *out = sl_test_path_in(root, "out");
  char *state = sl_test_path_in(root, "state");
  char err[1024];
  lineage_job a = {.state_dir = state, .out = out, .tag = 'A'};
  cr_assert_eq(run_lineage_job(&a, err, sizeof err), 0, "%s", err);
  char *later = sl_test_path_in(out, "part-0-00000099.txt");
  FILE *f = fopen(later, "w");
  cr_assert(f);
  fputs("Z0000000\n", f);
  fclose(f);
  a.store_policy = SL_STORE_RESUME;
  cr_assert_neq(run_lineage_job(&a, err, sizeof err), 0);
  cr_assert(strstr(err, "part-0-00000099.txt") &&
                strstr(err, "committed after checkpoint"), "%s", err);
  sl_test_remove_tree(root);
  free(out), free(state), free(later);
}

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  cr_assert(f, "%s: %s", path, strerror(errno));
  fputs(text, f);
  cr_assert_eq(fclose(f), 0);
}

Test(lineage, a_commit_never_replaces_a_part) {
  char *dir = sl_test_temp_dir("lineage");
  char *from = sl_test_path_in(dir, ".part-0-00000001.pending");
  char *to = sl_test_path_in(dir, "part-0-00000001.txt");
  write_text(from, "new\n");
  write_text(to, "committed\n");
  cr_assert_eq(sl_output_commit(from, to, false), EEXIST);
  cr_assert_eq(sl_output_commit(from, to, true), EEXIST);
  char *kept = sl_test_slurp(to);
  cr_assert_str_eq(kept, "committed\n");
  free(kept);
  /* What a crash between link and unlink leaves: one file, two names.  A
   * restore finishes it; a plain commit still refuses. */
  cr_assert_eq(unlink(to), 0);
  cr_assert_eq(link(from, to), 0);
  cr_assert_eq(sl_output_commit(from, to, false), EEXIST);
  cr_assert_eq(sl_output_commit(from, to, true), 0);
  cr_assert_eq(access(from, F_OK), -1);
  kept = sl_test_slurp(to);
  cr_assert_str_eq(kept, "new\n");
  free(kept);
  /* And the ordinary case. */
  write_text(from, "next\n");
  char *to2 = sl_test_path_in(dir, "part-0-00000002.txt");
  cr_assert_eq(sl_output_commit(from, to2, false), 0);
  cr_assert_eq(access(from, F_OK), -1);
  sl_test_remove_tree(dir);
  free(from), free(to), free(to2);
}

/* ------------------------------------------------------------ window */

static bool log_has(const char *log, const char *text) {
  char *data = sl_test_read_file(log, NULL);
  bool found = data && strstr(data, text);
  free(data);
  return found;
}

/* `sluice run window --fresh` into the --output of an earlier run: the
 * earlier run's parts (here also one of a higher SEQ, as a run with more
 * checkpoints leaves) are cleared, never counted twice; a start into it
 * with a new state directory and no --fresh is refused. */
Test(window, fresh_into_the_same_output_never_duplicates, .timeout = 240) {
  char *root = sl_test_temp_dir("window-out");
  char *out = sl_test_path_in(root, "out");
  char *state = sl_test_path_in(root, "state");
  char *other = sl_test_path_in(root, "other-state");
  char *log = sl_test_path_in(root, "log");
  const char *first[] = {"run", "window", "--records", "200000", "--keys",
                         "100", "--parallelism", "2", "--state-dir", state,
                         "--output", out, "--quiet", NULL};
  cr_assert_eq(sl_test_run_sluice(log, first), 0);
  /* A later part of the same run, as a longer run would have. */
  char *part = sl_test_path_in(out, "part-1-00000000.csv");
  char *later = sl_test_path_in(out, "part-1-00000007.csv");
  char *text = sl_test_slurp(part);
  write_text(later, text);
  free(text);
  const char *fresh[] = {"run", "window", "--records", "200000", "--keys",
                         "100", "--parallelism", "2", "--state-dir", state,
                         "--output", out, "--fresh", "--quiet", NULL};
  cr_assert_eq(sl_test_run_sluice(log, fresh), 0, "--fresh failed");
  cr_assert(!log_has(log, "VIOLATED"), "a verdict was VIOLATED");
  cr_assert_eq(access(later, F_OK), -1, "%s survived --fresh", later);
  const char *again[] = {"run", "window", "--records", "200000", "--keys",
                         "100", "--parallelism", "2", "--state-dir", other,
                         "--output", out, "--quiet", NULL};
  cr_assert_eq(sl_test_run_sluice(log, again), 1,
               "a second lineage ran into %s", out);
  cr_assert(log_has(log, "another run's output"), "no refusal in the log");
  cr_assert(!log_has(log, "VIOLATED"), "a verdict was VIOLATED");
  sl_test_remove_tree(root);
  free(out), free(state), free(other), free(log), free(part), free(later);
}

/* A committed part exists once a checkpoint completed. */
static bool has_committed_part(const char *dir) {
  DIR *d = opendir(dir);
  if (!d)
    return false;
  bool found = false;
  for (struct dirent *e; !found && (e = readdir(d));)
    found = strncmp(e->d_name, "part-", 5) == 0;
  closedir(d);
  return found;
}

/* SIGKILL after the first committed part, then --resume: the same lineage
 * takes back its own parts (the pre-committed ones of the checkpoint it
 * restores included) and the verdict is exactly-once. */
Test(window, killed_then_resumed_is_exactly_once, .timeout = 300) {
  char *root = sl_test_temp_dir("window-out");
  char *out = sl_test_path_in(root, "out");
  char *state = sl_test_path_in(root, "state");
  char *log = sl_test_path_in(root, "log");
  char records[32];
  snprintf(records, sizeof records, "%" PRIu64,
           sl_test_scaled(20000000, 2000000));
  const char *first[] = {"run", "window", "--records", records, "--keys",
                         "1000", "--parallelism", "2", "--state-dir", state,
                         "--output", out, "--checkpoint-interval-ms", "20",
                         "--quiet", NULL};
  pid_t pid = sl_test_spawn(log, first);
  /* Bounded: 60 s of 1 ms polls; a committed part means a checkpoint. */
  for (int i = 0; i < 60000 && !has_committed_part(out); i++)
    sl_test_sleep_us(1000);
  cr_assert(has_committed_part(out), "no checkpoint completed in 60 s");
  kill(pid, SIGKILL);
  cr_assert_eq(sl_test_reap(pid), 128 + SIGKILL,
               "the run ended before the kill (make it longer)");
  const char *resume[] = {"run", "window", "--records", records, "--keys",
                          "1000", "--parallelism", "2", "--state-dir", state,
                          "--output", out, "--checkpoint-interval-ms", "20",
                          "--resume", "--quiet", NULL};
  cr_assert_eq(sl_test_run_sluice(log, resume), 0, "the resume failed");
  cr_assert(log_has(log, "resumed from checkpoint"), "nothing was resumed");
  cr_assert(log_has(log, "verdict: EXACTLY-ONCE"), "no exactly-once verdict");
  sl_test_remove_tree(root);
  free(out), free(state), free(log);
}
