/* test_nexmark_cli.c — `sluice nexmark` as a user runs it: a run killed
 * with SIGKILL at random moments and resumed with --resume writes exactly
 * the file an uninterrupted run writes, also with unaligned checkpoints
 * (killed while checkpoints hold channel state, resumed from them);
 * event files written by `gen` give
 * the same rows as the generator; bad flags and bad files give a clear
 * error and the documented exit status.
 *
 * The binary comes from the environment (SLUICE_BIN, set by meson). */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_dirs.h"

#include "test_spawn.h"

static size_t count_lines(const char *data, size_t size) {
  size_t n = 0;
  for (size_t i = 0; i < size; i++)
    n += data[i] == '\n';
  return n;
}

/* got equals expected byte for byte, and expected has more than min_rows
 * rows below its header (a comparison of two empty results proves
 * nothing). */
static void assert_same_file(const char *expected, const char *got,
                             size_t min_rows) {
  size_t n1 = 0, n2 = 0;
  char *a = sl_test_read_file(expected, &n1);
  char *b = sl_test_read_file(got, &n2);
  cr_assert(a, "cannot read %s", expected);
  cr_assert(b, "cannot read %s", got);
  cr_assert_eq(n1, n2, "%s has %zu bytes (%zu lines), %s %zu (%zu lines)",
               expected, n1, count_lines(a, n1), got, n2,
               count_lines(b, n2));
  cr_assert(memcmp(a, b, n1) == 0, "%s and %s differ", expected, got);
  cr_assert_gt(count_lines(a, n1), min_rows + 1, "%s has only %zu lines",
               expected, count_lines(a, n1));
  free(a);
  free(b);
}

static void assert_log_has(const char *log, const char *text) {
  size_t n = 0;
  char *data = sl_test_read_file(log, &n);
  cr_assert(data, "no log %s", log);
  cr_assert(strstr(data, text), "log %s lacks \"%s\":\n%s", log, text, data);
  free(data);
}

static size_t log_size(const char *log) {
  size_t n = 0;
  char *data = sl_test_read_file(log, &n);
  free(data);
  return data ? n : 0;
}

/* The log holds text at or after byte from. */
static bool log_has_since(const char *log, size_t from, const char *text) {
  size_t n = 0;
  char *data = sl_test_read_file(log, &n);
  bool found = data && from <= n && strstr(data + from, text) != NULL;
  free(data);
  return found;
}

static unsigned scale(void) {
  const char *s = getenv("SLUICE_TEST_SCALE");
  unsigned v = s ? (unsigned)atoi(s) : 1;
  return v ? v : 1;
}

/* Kill a checkpointed run of query at random moments, resume until it
 * finishes, and compare its file with an uninterrupted run's; copy_pass:
 * the checkpointed runs' --copy-pass-mib, or NULL. */
static void kill_and_resume(const char *query, const char *parallelism,
                            unsigned seed, const char *copy_pass) {
  char *dir = sl_test_temp_dir("nexmark-cli");
  char *expected = sl_test_path_in(dir, "expected.csv");
  char *got = sl_test_path_in(dir, "got.csv");
  char *state = sl_test_path_in(dir, "state");
  char *log = sl_test_path_in(dir, "log");
  char events[32], limit[32], rate[32];
  snprintf(events, sizeof events, "%u", 300000 / scale());
  /* 150 s of event time at any scale: dozens of windows and sessions. */
  snprintf(rate, sizeof rate, "%u", 2000 / scale());
  /* A rate limit spreads the run over about a second and a half, so the
   * kills land while it works. */
  snprintf(limit, sizeof limit, "%u", 200000 / scale());
  const char *base[] = {"nexmark", "run", "--query", query, "--events",
                        events, "--rate", rate, "--out-of-order-ms",
                        "2000", "--parallelism", parallelism, "--quiet"};
  const char *plain[32];
  size_t nb = sizeof base / sizeof base[0];
  memcpy(plain, base, sizeof base);
  plain[nb] = "--output", plain[nb + 1] = expected, plain[nb + 2] = NULL;
  cr_assert_eq(sl_test_run_sluice(log, plain), 0, "uninterrupted run failed");

  const char *killed[40];
  memcpy(killed, base, sizeof base);
  const char *more[] = {"--output", got, "--state-dir", state,
                        "--checkpoint-interval", "50", "--rate-limit",
                        limit, NULL, NULL, NULL, NULL};
  memcpy(killed + nb, more, sizeof more);
  size_t nk = nb + 8;
  if (copy_pass)
    killed[nk++] = "--copy-pass-mib", killed[nk++] = copy_pass;
  const char **how = &killed[nk]; /* the first run starts fresh */
  srand(seed);
  int kills = 0, rc = -1;
  size_t last_bytes = 0;
  for (int attempt = 0; attempt < 8 && rc != 0; attempt++) {
    /* After a kill before the first checkpoint, --resume is refused
     * ("nothing to resume"): the next run starts over with --fresh. */
    if (attempt > 0)
      *how = log_has_since(log, log_size(log) - last_bytes,
                           "nothing to resume in")
                 ? "--fresh"
                 : "--resume";
    size_t before = log_size(log);
    pid_t pid = sl_test_spawn(log, killed);
    if (attempt < 3) {
      struct timespec t = {0, (100 + rand() % 500) * 1000000L};
      nanosleep(&t, NULL);
      kill(pid, SIGKILL);
    }
    rc = sl_test_reap(pid);
    kills += rc == 128 + SIGKILL;
    last_bytes = log_size(log) - before;
  }
  cr_assert_eq(rc, 0, "the resumed run did not finish");
  cr_assert_geq(kills, 1, "no run was killed mid-way");
  assert_same_file(expected, got, 20);
  sl_test_remove_tree(dir);
  free(expected), free(got), free(state), free(log);
}

Test(nexmark_cli, killed_and_resumed_q5_writes_the_uninterrupted_file,
     .timeout = 240) {
  kill_and_resume("q5", "2", 5, NULL);
}

Test(nexmark_cli, killed_and_resumed_q3_writes_the_uninterrupted_file,
     .timeout = 240) {
  kill_and_resume("q3", "1", 3, NULL);
}

Test(nexmark_cli, killed_and_resumed_q11_writes_the_uninterrupted_file,
     .timeout = 240) {
  kill_and_resume("q11", "2", 11, NULL);
}

/* The same with the copy pass off (--copy-pass-mib off): checkpoints by
 * copy on write alone. */
Test(nexmark_cli, killed_and_resumed_q3_without_copy_pass_writes_the_same_file,
     .timeout = 240) {
  kill_and_resume("q3", "2", 33, "off");
}

/* ------------------------------------------------------------ unaligned */

/* Non-final checkpoints completed in the log since byte from (the
 * coordinator's debug line "checkpoint N complete in ... ms[, unaligned:
 * B bytes of channel state]"), and the index (1-based, 0: none) of the
 * first of them that held channel state (B > 0). */
static void completed_since(const char *log, size_t from, int *count,
                            int *first_with_channels) {
  *count = 0;
  *first_with_channels = 0;
  size_t n = 0;
  char *data = sl_test_read_file(log, &n);
  if (!data || from > n) {
    free(data);
    return;
  }
  const char *channels = ", unaligned: ";
  for (char *at = strstr(data + from, " complete in "); at;
       at = strstr(at + 1, " complete in ")) {
    ++*count;
    char *end = strchr(at, '\n');
    char *u = strstr(at, channels);
    if (*first_with_channels == 0 && u && (!end || u < end) &&
        strtoull(u + strlen(channels), NULL, 10) > 0)
      *first_with_channels = *count;
  }
  free(data);
}

/* Wait until the run pid (its log from byte from on) has completed a
 * checkpoint holding channel state and then `more` checkpoints, and
 * kill it with SIGKILL; or until it exits by itself.  Polls every 2 ms:
 * it waits for what the run logs, not for a time.  True if killed. */
static bool kill_after_channel_state(pid_t pid, const char *log, size_t from,
                                     int more) {
  for (;;) {
    int count, first;
    completed_since(log, from, &count, &first);
    if (first > 0 && count >= first + more) {
      kill(pid, SIGKILL);
      return true;
    }
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      /* Reaped here (so the caller must not reap it again): a run that
       * ends by itself must have finished cleanly. */
      cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "the run ended with status %d before a checkpoint with "
                "channel state and %d more (see %s)", status, more, log);
      return false;
    }
    struct timespec t = {0, 2000000L};
    nanosleep(&t, NULL);
  }
}

/* `sluice checkpoints state`: the newest complete checkpoint (the one a
 * resume restores) holds channel state. */
static bool newest_holds_channel_state(const char *state, const char *log) {
  const char *args[] = {"checkpoints", state, "--limit", "1", NULL};
  size_t before = log_size(log);
  cr_assert_eq(sl_test_run_sluice(log, args), 0, "sluice checkpoints %s "
               "(see %s)", state, log);
  size_t n = 0;
  char *data = sl_test_read_file(log, &n);
  cr_assert(data && before <= n);
  const char *field = "unaligned: ";
  char *at = strstr(data + before, field);
  bool held = at && strtoull(at + strlen(field), NULL, 10) > 0;
  free(data);
  return held;
}

/* Kill an unaligned run of query at parallelism 3 (mode: "--unaligned",
 * or with an --aligned-timeout-ms) three times, each once a checkpoint
 * with channel state has completed and then 0 or 1 more (seeded), resume
 * until it finishes, and compare with expected, an uninterrupted run's
 * file.  slow_op sleeps delay_us for its first 10000 records of each
 * start (a `slow` fault; scaled as the events are), so the rings before
 * it fill: the checkpoints taken meanwhile hold channel state, and at
 * least one kill leaves one as the newest, which the resume replays. */
static void kill_unaligned_and_resume(const char *dir, const char *query,
                                      const char *slow_op,
                                      unsigned delay_us,
                                      const char *const *mode,
                                      const char *expected, unsigned seed) {
  char *got = sl_test_path_in(dir, "got.csv");
  char *state = sl_test_path_in(dir, "state");
  char *log = sl_test_path_in(dir, "unaligned.log");
  char *inspect_log = sl_test_path_in(dir, "checkpoints.log");
  char events[32], limit[32], rate[32], slow[200];
  snprintf(events, sizeof events, "%u", 300000 / scale());
  snprintf(rate, sizeof rate, "%u", 2000 / scale());
  /* About a second a run at parallelism 3: checkpoints every 50 ms, some
   * of them taking a few hundred (a source blocked on a full ring sees
   * its trigger only once downstream made room, runtime.c note 11). */
  snprintf(limit, sizeof limit, "%u", 100000 / scale());
  /* Scaled down, each slow record takes scale times longer: the slow
   * operator keeps the same share of the input behind it. */
  snprintf(slow, sizeof slow, "slow:op=%s,delay_us=%u,records=%u", slow_op,
           delay_us * scale(), 10000 / scale());
  const char *args[40] = {"nexmark", "run", "--query", query, "--events",
                          events, "--rate", rate, "--out-of-order-ms",
                          "2000", "--parallelism", "3", "--quiet",
                          "--output", got, "--state-dir", state,
                          "--checkpoint-interval", "50", "--rate-limit",
                          limit, "--fault", slow, "--log-level", "debug"};
  size_t n = 0;
  while (args[n])
    n++;
  for (size_t k = 0; mode[k]; k++)
    args[n++] = mode[k];
  const char **how = &args[n++];
  *how = "--fresh";
  args[n] = NULL;
  srand(seed);
  int kills = 0, rc = -1, channel_resumes = 0;
  for (int attempt = 0; attempt < 8 && rc != 0; attempt++) {
    if (attempt > 0)
      *how = "--resume"; /* each kill came after a complete checkpoint */
    size_t before = log_size(log);
    pid_t pid = sl_test_spawn(log, args);
    if (attempt < 3 && !kill_after_channel_state(pid, log, before,
                                                 rand() % 2)) {
      rc = 0; /* it finished by itself, reaped above */
      break;
    }
    rc = sl_test_reap(pid);
    if (rc == 128 + SIGKILL) {
      kills++;
      channel_resumes += newest_holds_channel_state(state, inspect_log);
    }
  }
  cr_assert_eq(rc, 0, "the resumed run did not finish (see %s)", log);
  cr_assert_geq(kills, 1, "no run was killed mid-way");
  cr_assert_geq(channel_resumes, 1, "no kill left a checkpoint with "
                "channel state to resume from (%d kills; see %s)", kills,
                log);
  assert_same_file(expected, got, 20);
  free(got), free(state), free(log), free(inspect_log);
}

/* An uninterrupted run of query at parallelism 3, then the unaligned
 * runs killed and resumed, from the start and switched by a 1 ms
 * aligned-checkpoint timeout, in directories of their own. */
static void unaligned_kills(const char *query, const char *slow_op,
                            unsigned delay_us, unsigned seed) {
  char *dir = sl_test_temp_dir("nexmark-cli");
  char *expected = sl_test_path_in(dir, "expected.csv");
  char *log = sl_test_path_in(dir, "log");
  char events[32], rate[32];
  snprintf(events, sizeof events, "%u", 300000 / scale());
  snprintf(rate, sizeof rate, "%u", 2000 / scale());
  const char *plain[] = {"nexmark", "run", "--query", query, "--events",
                         events, "--rate", rate, "--out-of-order-ms", "2000",
                         "--parallelism", "3", "--quiet", "--output",
                         expected, NULL};
  cr_assert_eq(sl_test_run_sluice(log, plain), 0, "uninterrupted run failed");
  static const char *const from_start[] = {"--unaligned", NULL};
  static const char *const switched[] = {"--unaligned",
                                         "--aligned-timeout-ms", "1", NULL};
  const char *const *modes[] = {from_start, switched};
  for (int m = 0; m < 2; m++) {
    char name[24];
    snprintf(name, sizeof name, "mode-%d", m);
    char *mode_dir = sl_test_path_in(dir, name);
    cr_assert_eq(mkdir(mode_dir, 0755), 0);
    kill_unaligned_and_resume(mode_dir, query, slow_op, delay_us, modes[m],
                              expected, seed + (unsigned)m);
    free(mode_dir);
  }
  sl_test_remove_tree(dir);
  free(expected), free(log);
}

Test(nexmark_cli, unaligned_q3_killed_and_resumed_writes_the_uninterrupted_file,
     .timeout = 300) {
  unaligned_kills("q3", "q3.join", 200, 303);
}

Test(nexmark_cli, unaligned_q5_killed_and_resumed_writes_the_uninterrupted_file,
     .timeout = 300) {
  unaligned_kills("q5", "q5.count_buckets", 20, 505);
}

Test(nexmark_cli, unaligned_q8_killed_and_resumed_writes_the_uninterrupted_file,
     .timeout = 300) {
  unaligned_kills("q8", "q8.join", 150, 808);
}

Test(nexmark_cli,
     unaligned_q11_killed_and_resumed_writes_the_uninterrupted_file,
     .timeout = 300) {
  unaligned_kills("q11", "q11.sessions", 20, 1111);
}

/* Events written by gen and read back with --input give the rows the
 * generator gives. */
Test(nexmark_cli, event_file_gives_the_generator_rows, .timeout = 240) {
  char *dir = sl_test_temp_dir("nexmark-cli");
  char *file = sl_test_path_in(dir, "events.jsonl");
  char *a = sl_test_path_in(dir, "a.csv");
  char *b = sl_test_path_in(dir, "b.csv");
  char *log = sl_test_path_in(dir, "log");
  char events[32], rate[32];
  snprintf(events, sizeof events, "%u", 60000 / scale());
  /* 120 s of event time at any scale: a dozen tumbling windows. */
  snprintf(rate, sizeof rate, "%u", 500 / scale());
  const char *gen[] = {"nexmark", "gen", "--events", events, "--rate",
                       rate, "--out-of-order-ms", "1000", "--output",
                       file, NULL};
  cr_assert_eq(sl_test_run_sluice(log, gen), 0);
  const char *queries[] = {"q2", "q8", "q7"};
  for (int i = 0; i < 3; i++) {
    const char *from_gen[] = {"nexmark", "run", "--query", queries[i],
                              "--events", events, "--rate", rate,
                              "--out-of-order-ms", "1000", "--output", a,
                              "--quiet", NULL};
    const char *from_file[] = {"nexmark", "run", "--query", queries[i],
                               "--input", file, "--output", b, "--quiet",
                               NULL};
    cr_assert_eq(sl_test_run_sluice(log, from_gen), 0, "%s from the generator", queries[i]);
    cr_assert_eq(sl_test_run_sluice(log, from_file), 0, "%s from the file", queries[i]);
    assert_same_file(a, b, 5);
  }
  sl_test_remove_tree(dir);
  free(file), free(a), free(b), free(log);
}

Test(nexmark_cli, bad_flags_and_files_are_refused_clearly, .timeout = 120) {
  char *dir = sl_test_temp_dir("nexmark-cli");
  char *log = sl_test_path_in(dir, "log");
  char *bad = sl_test_path_in(dir, "bad.jsonl");
  char *out = sl_test_path_in(dir, "out.csv");
  const char *q6[] = {"nexmark", "run", "--query", "q6", NULL};
  cr_assert_eq(sl_test_run_sluice(log, q6), 2);
  assert_log_has(log, "--query: 'q6' is not one of");
  const char *both[] = {"nexmark", "run", "--query", "q1", "--events", "10",
                        "--input", bad, NULL};
  cr_assert_eq(sl_test_run_sluice(log, both), 2);
  assert_log_has(log, "--events and --input exclude each other");
  const char *nonum[] = {"nexmark", "gen", "--events", "ten", NULL};
  cr_assert_eq(sl_test_run_sluice(log, nonum), 2);
  assert_log_has(log, "--events: 'ten' is not a whole number");
  const char *resume[] = {"nexmark", "run", "--query", "q1", "--resume",
                          NULL};
  cr_assert_eq(sl_test_run_sluice(log, resume), 2);
  assert_log_has(log, "--resume and --fresh need --state-dir");
  const char *copy[] = {"nexmark", "run", "--query", "q1",
                        "--copy-pass-mib", "0", NULL};
  cr_assert_eq(sl_test_run_sluice(log, copy), 2);
  assert_log_has(log, "--copy-pass-mib takes a number of MiB, 1..1048576, "
                      "or off (got '0')");
  const char *verb[] = {"nexmark", "walk", NULL};
  cr_assert_eq(sl_test_run_sluice(log, verb), 2);
  assert_log_has(log, "unknown command 'walk'");

  /* A missing file and a malformed line fail the job, naming them; the
   * output file is not written. */
  char *missing = sl_test_path_in(dir, "missing.jsonl");
  const char *nofile[] = {"nexmark", "run", "--query", "q0", "--input",
                          missing, "--output", out, "--quiet", NULL};
  cr_assert_eq(sl_test_run_sluice(log, nofile), 1);
  assert_log_has(log, missing);
  FILE *f = fopen(bad, "w");
  cr_assert(f);
  fputs("{\"event_type\":2,\"bid\":{\"auction\":1000,\"bidder\":1001,"
        "\"price\":150,\"channel\":\"Google\",\"url\":\"u\","
        "\"date_time\":1700000000002,\"extra\":\"\"}}\n"
        "{\"event_type\":2,\"bid\":{\"auction\":\"x\"}}\n",
        f);
  fclose(f);
  const char *malformed[] = {"nexmark", "run", "--query", "q0", "--input",
                             bad, "--output", out, "--quiet", NULL};
  cr_assert_eq(sl_test_run_sluice(log, malformed), 1);
  assert_log_has(log, "line 2");
  cr_assert_eq(access(out, F_OK), -1, "output written by a failed run");
  sl_test_remove_tree(dir);
  free(log), free(bad), free(out), free(missing);
}

/* ------------------------------------------------------------ output */

/* Events for q3 whose person names hold newlines, quotes and commas:
 * persons 2000.. in ID, each seller of two category-10 auctions. */
static void write_tricky_events(const char *path, int persons) {
  FILE *f = fopen(path, "w");
  cr_assert(f, "%s: %s", path, strerror(errno));
  static const char *const names[] = {
      "Ann\\nLee", "Bo \\\"the\\\" Kid", "Cy, Jr.\\n\\\"x\\\"\\n", "Dee",
      "\\nEd", "Fa\\r\\nGo", "Gil\\\"\\\"", "Hal,\\n,"};
  long long t = 1700000000000LL;
  for (int i = 0; i < persons; i++)
    fprintf(f,
            "{\"event_type\":0,\"person\":{\"id\":%d,\"name\":\"%s %d\","
            "\"email_address\":\"e\",\"credit_card\":\"c\",\"city\":"
            "\"Boise\",\"state\":\"ID\",\"date_time\":%lld,\"extra\":\"\"}}\n",
            2000 + i, names[i % 8], i, t + i);
  for (int i = 0; i < 2 * persons; i++)
    fprintf(f,
            "{\"event_type\":1,\"auction\":{\"id\":%d,\"item_name\":\"i\","
            "\"description\":\"d\",\"initial_bid\":1,\"reserve\":2,"
            "\"date_time\":%lld,\"expires\":%lld,\"seller\":%d,"
            "\"category\":10,\"extra\":\"\"}}\n",
            5000 + i, t + persons + i, t + persons + i + 100000,
            2000 + i % persons);
  fclose(f);
}

typedef struct text_rows {
  char **data;
  size_t *bytes;
  size_t count, capacity;
} text_rows;

/* Split text into RFC 4180 rows (a newline inside quotes is data), the
 * way the test reads a CSV file independently of the CLI. */
static void split_rows(const char *text, size_t n, text_rows *out) {
  size_t start = 0;
  bool quoted = false;
  for (size_t i = 0; i < n; i++) {
    quoted ^= text[i] == '"';
    if (text[i] != '\n' || quoted)
      continue;
    if (out->count == out->capacity) {
      out->capacity = out->capacity ? 2 * out->capacity : 256;
      out->data = realloc(out->data, out->capacity * sizeof *out->data);
      out->bytes = realloc(out->bytes, out->capacity * sizeof *out->bytes);
      cr_assert(out->data && out->bytes);
    }
    out->data[out->count] = malloc(i - start + 1);
    cr_assert(out->data[out->count]);
    memcpy(out->data[out->count], text + start, i - start);
    out->bytes[out->count++] = i - start;
    start = i + 1;
  }
  cr_assert_not(quoted, "the text ends inside a quoted field");
  cr_assert_eq(start, n, "the text does not end with a newline");
}

/* The sorted rows (byte order) of every committed part in dir, with the
 * header row of each part left out, then joined as the merged file should
 * be: header, then one row per line. */
static char *expected_merge(const char *dir, const char *header,
                            size_t *size) {
  text_rows rows = {0};
  char cmd[600];
  snprintf(cmd, sizeof cmd, "ls '%s' | grep '^part-'", dir);
  FILE *ls = popen(cmd, "r");
  cr_assert(ls);
  char name[256];
  while (fgets(name, sizeof name, ls)) {
    name[strcspn(name, "\n")] = 0;
    char *path = sl_test_path_in(dir, name);
    size_t n = 0;
    char *data = sl_test_read_file(path, &n);
    cr_assert(data);
    size_t skip = strlen(header) + 1;
    cr_assert(n >= skip && memcmp(data, header, skip - 1) == 0);
    split_rows(data + skip, n - skip, &rows);
    free(data);
    free(path);
  }
  pclose(ls);
  /* Insertion sort by memcmp then length: few rows, plain and obvious. */
  for (size_t i = 1; i < rows.count; i++)
    for (size_t j = i; j > 0; j--) {
      size_t a = rows.bytes[j - 1], b = rows.bytes[j];
      int c = memcmp(rows.data[j - 1], rows.data[j], a < b ? a : b);
      if (c < 0 || (c == 0 && a <= b))
        break;
      char *t = rows.data[j];
      rows.data[j] = rows.data[j - 1], rows.data[j - 1] = t;
      rows.bytes[j] = a, rows.bytes[j - 1] = b;
    }
  size_t total = strlen(header) + 1;
  for (size_t i = 0; i < rows.count; i++)
    total += rows.bytes[i] + 1;
  char *out = malloc(total + 1), *p = out;
  cr_assert(out);
  p += sprintf(p, "%s\n", header);
  for (size_t i = 0; i < rows.count; i++) {
    memcpy(p, rows.data[i], rows.bytes[i]);
    p += rows.bytes[i];
    *p++ = '\n';
    free(rows.data[i]);
  }
  free(rows.data);
  free(rows.bytes);
  *size = total;
  return out;
}

/* Rows whose fields hold newlines and quotes come out of the merge whole
 * and in byte order, with the in-memory sort and with an external merge
 * forced into many runs (SLUICE_MERGE_RUN_BYTES). */
Test(nexmark_cli, newlines_and_quotes_in_fields_survive_the_merge,
     .timeout = 120) {
  char *dir = sl_test_temp_dir("nexmark-cli");
  char *events = sl_test_path_in(dir, "events.jsonl");
  char *out = sl_test_path_in(dir, "q3.csv");
  char *parts = sl_test_path_in(dir, "q3.csv.parts");
  char *log = sl_test_path_in(dir, "log");
  write_tricky_events(events, 40);
  const char *q3[] = {"nexmark", "run", "--query", "q3", "--input", events,
                      "--output", out, "--quiet", NULL};
  const char *run_bytes[] = {NULL, "300", "1"};
  char *first = NULL;
  size_t first_bytes = 0;
  for (int i = 0; i < 3; i++) {
    if (run_bytes[i])
      setenv("SLUICE_MERGE_RUN_BYTES", run_bytes[i], 1);
    else
      unsetenv("SLUICE_MERGE_RUN_BYTES");
    cr_assert_eq(sl_test_run_sluice(log, q3), 0, "q3 failed (run bytes %s)",
                 run_bytes[i] ? run_bytes[i] : "default");
    size_t n = 0, m = 0;
    char *got = sl_test_read_file(out, &n);
    char *want = expected_merge(parts, "name,city,state,id", &m);
    cr_assert(got);
    cr_assert_eq(n, m, "merged %zu bytes, the parts hold %zu", n, m);
    cr_assert(memcmp(got, want, n) == 0, "the merge differs:\n%s\n--- "
              "expected:\n%s", got, want);
    /* One row whole: a quoted name with a doubled quote and newlines. */
    cr_assert(strstr(got, "\"Cy, Jr.\n\"\"x\"\"\n 2\",Boise,ID,5002\n"),
              "a row with newlines and quotes is not whole:\n%s", got);
    /* 80 rows and the header, some rows over several lines. */
    cr_assert_gt(count_lines(got, n), 81);
    if (i == 0)
      first = got, first_bytes = n;
    else
      cr_assert(n == first_bytes && memcmp(got, first, n) == 0,
                "run size %s changed the output", run_bytes[i]);
    if (i > 0)
      free(got);
    free(want);
  }
  unsetenv("SLUICE_MERGE_RUN_BYTES");
  free(first);
  sl_test_remove_tree(dir);
  free(events), free(out), free(parts), free(log);
}

/* A run that fails, or is refused, leaves no earlier FILE behind that
 * would look like its result. */
Test(nexmark_cli, a_failed_run_leaves_no_earlier_output, .timeout = 120) {
  char *dir = sl_test_temp_dir("nexmark-cli");
  char *events = sl_test_path_in(dir, "events.jsonl");
  char *bad = sl_test_path_in(dir, "bad.jsonl");
  char *out = sl_test_path_in(dir, "out.csv");
  char *state = sl_test_path_in(dir, "state");
  char *log = sl_test_path_in(dir, "log");
  write_tricky_events(events, 10);
  FILE *f = fopen(bad, "w");
  cr_assert(f);
  fputs("{\"event_type\":2,\"bid\":{\"auction\":\"x\"}}\n", f);
  fclose(f);
  const char *good[] = {"nexmark", "run", "--query", "q3", "--input",
                        events, "--output", out, "--quiet", NULL};
  const char *failing[] = {"nexmark", "run", "--query", "q3", "--input",
                           bad, "--output", out, "--quiet", NULL};
  const char *refused[] = {"nexmark", "run", "--query", "q3", "--input",
                           events, "--output", out, "--state-dir", state,
                           "--resume", "--quiet", NULL};
  cr_assert_eq(sl_test_run_sluice(log, good), 0);
  cr_assert_eq(access(out, F_OK), 0, "no output after a good run");
  cr_assert_eq(sl_test_run_sluice(log, failing), 1);
  cr_assert_eq(access(out, F_OK), -1, "a failed run left %s", out);
  cr_assert_eq(sl_test_run_sluice(log, good), 0);
  cr_assert_eq(sl_test_run_sluice(log, refused), 1);
  cr_assert_eq(access(out, F_OK), -1, "a refused run left %s", out);
  sl_test_remove_tree(dir);
  free(events), free(bad), free(out), free(state), free(log);
}

/* An explicit --resume with nothing to resume (no state directory, an
 * empty one, a store without a complete checkpoint) is refused: it must
 * not start fresh and merge the parts an earlier run committed. */
Test(nexmark_cli, resume_with_nothing_to_resume_is_refused, .timeout = 120) {
  char *dir = sl_test_temp_dir("nexmark-cli");
  char *out = sl_test_path_in(dir, "out.csv");
  char *first_state = sl_test_path_in(dir, "first");
  char *missing = sl_test_path_in(dir, "missing");
  char *empty = sl_test_path_in(dir, "empty");
  char *failed = sl_test_path_in(dir, "failed");
  char *other = sl_test_path_in(dir, "other.csv");
  char *log = sl_test_path_in(dir, "log");
  cr_assert_eq(mkdir(empty, 0755), 0);
  /* An earlier run commits its parts in out.csv.parts. */
  const char *earlier[] = {"nexmark", "run", "--query", "q1", "--events",
                           "2000", "--output", out, "--state-dir",
                           first_state, "--quiet", NULL};
  cr_assert_eq(sl_test_run_sluice(log, earlier), 0);
  /* A run that failed before its first checkpoint: a store, no
   * checkpoint in it. */
  const char *fails[] = {"nexmark", "run", "--query", "q1", "--events",
                         "2000", "--output", other, "--state-dir", failed,
                         "--fresh", "--checkpoint-interval", "86400000",
                         "--fault", "fail:op=events,record=10", "--quiet",
                         NULL};
  cr_assert_eq(sl_test_run_sluice(log, fails), 1);
  const char *dirs[] = {missing, empty, failed};
  for (int i = 0; i < 3; i++) {
    const char *resume[] = {"nexmark", "run", "--query", "q1", "--events",
                            "2000", "--output", out, "--state-dir", dirs[i],
                            "--resume", "--quiet", NULL};
    size_t before = log_size(log);
    cr_assert_eq(sl_test_run_sluice(log, resume), 1, "--resume from %s", dirs[i]);
    char want[600];
    snprintf(want, sizeof want, "sluice: nothing to resume in %s", dirs[i]);
    cr_assert(log_has_since(log, before, want), "no \"%s\" in the log",
              want);
    cr_assert_eq(access(out, F_OK), -1, "%s written", out);
  }
  sl_test_remove_tree(dir);
  free(out), free(first_state), free(missing), free(empty), free(failed);
  free(other), free(log);
}
