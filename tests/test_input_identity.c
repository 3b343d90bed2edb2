/* test_input_identity.c — a file source resumes only over the input it
 * read, and a source blocked on a quiet input stops when asked.
 *
 * Changed input (library JSON-lines and CSV sources through the API).  A
 * job reads a file through a gate operator that holds record K1 until the
 * test has triggered a checkpoint, so the source's checkpointed position
 * lies between K1 and K1 + what the rings hold: the gate's own snapshot
 * says exactly where (it has processed the records before the barrier).
 * The gate then holds record K2, far past that, while the job is stopped.
 * The file is then replaced by an equal copy, truncated below the
 * position, changed in its first bytes or just before the position, or
 * appended to; a resume (or, for one case, the failover restore) must
 * refuse the first four naming the file and what changed, and read the
 * appended file to an exactly-once output.
 *
 * The same for `sluice nexmark run --input` as a process: the event file's
 * source is slowed by a fault so that the run is SIGKILLed after its first
 * committed part, far from the file's end.
 *
 * Stopping: `sluice nexmark run --input` on a FIFO without a writer and on
 * a standard input pipe that never writes, and `sluice run`, each stopped
 * by SIGINT (exit 130) and SIGTERM (exit 143); the library's file source
 * on a FIFO without a writer stopped by sl_job_stop().  The tests bound the
 * wait generously and log the latency; they assert no timing.
 *
 * The binary comes from the environment (SLUICE_BIN, set by meson). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_dirs.h"
#include "test_util.h"

/* ------------------------------------------------------------ records */

typedef struct item {
  int64_t n;
  char word[16];
} item;

static const sl_field item_fields[] = {
    SL_FIELD(item, n, SL_FIELD_INT64),
    SL_FIELD(item, word, SL_FIELD_STRING),
};
static const sl_schema item_schema = {item_fields, 2, sizeof(item), 0};

#define CSV_HEADER "n,word\n"

/* Line i of the input (with its newline) into buffer; its length. */
static size_t item_line(int format, uint64_t i, char *buffer, size_t bytes) {
  int n = format == SL_FORMAT_JSONL
              ? snprintf(buffer, bytes, "{\"n\":%" PRIu64 ",\"word\":\"w%"
                         PRIu64 "\"}\n", i, i % 100000)
              : snprintf(buffer, bytes, "%" PRIu64 ",w%" PRIu64 "\n", i,
                         i % 100000);
  cr_assert(n > 0 && (size_t)n < bytes);
  return (size_t)n;
}

/* Append lines first .. first+count-1 to path (creating it; with a CSV
 * header if the file is new and the format has one). */
static void append_items(const char *path, int format, uint64_t first,
                         uint64_t count) {
  FILE *f = fopen(path, "ab");
  cr_assert(f, "%s: %s", path, strerror(errno));
  if (format == SL_FORMAT_CSV_HEADER && ftell(f) == 0)
    fputs(CSV_HEADER, f);
  char line[96];
  for (uint64_t i = first; i < first + count; i++) {
    size_t n = item_line(format, i, line, sizeof line);
    cr_assert_eq(fwrite(line, 1, n, f), n);
  }
  cr_assert_eq(fclose(f), 0);
}

/* Byte offset of data line `lines` (0-based): where a position after
 * `lines` records stands. */
static uint64_t offset_after(int format, uint64_t lines) {
  uint64_t offset = format == SL_FORMAT_CSV_HEADER ? strlen(CSV_HEADER) : 0;
  char line[96];
  for (uint64_t i = 0; i < lines; i++)
    offset += item_line(format, i, line, sizeof line);
  return offset;
}

/* ------------------------------------------------------------ the gate */

/* A pass-through operator that holds record hold[k] (counted from 1 since
 * the instance opened) until the test releases stage k, can fail on its
 * next record, and notes how many records it had processed at each
 * snapshot (the source's position, as every line is one record). */
typedef struct gate {
  pthread_mutex_t mutex;
  pthread_cond_t cond;
  uint64_t hold[2];   /* 0: do not hold */
  int held;           /* stage being held, -1: none */
  int released;       /* stages released */
  bool fail_next;     /* fail the next record */
  uint64_t processed; /* records, this attempt */
  uint64_t snapshot_id, snapshot_processed;
} gate;

static gate the_gate = {.mutex = PTHREAD_MUTEX_INITIALIZER,
                        .cond = PTHREAD_COND_INITIALIZER};

static void gate_reset(uint64_t hold1, uint64_t hold2) {
  pthread_mutex_lock(&the_gate.mutex);
  the_gate.hold[0] = hold1;
  the_gate.hold[1] = hold2;
  the_gate.held = -1;
  the_gate.released = 0;
  the_gate.fail_next = false;
  the_gate.processed = 0;
  the_gate.snapshot_id = the_gate.snapshot_processed = 0;
  pthread_mutex_unlock(&the_gate.mutex);
}

static int gate_open(sl_ctx *ctx, void *user, void **state) {
  (void)ctx;
  (void)user;
  *state = &the_gate;
  pthread_mutex_lock(&the_gate.mutex);
  the_gate.processed = 0; /* a failover's attempt counts again */
  pthread_mutex_unlock(&the_gate.mutex);
  return 0;
}

static int gate_process(sl_ctx *ctx, void *state, int input,
                        const sl_record *in) {
  (void)input;
  gate *g = state;
  pthread_mutex_lock(&g->mutex);
  uint64_t n = ++g->processed;
  for (int k = 0; k < 2; k++) {
    if (g->hold[k] != n)
      continue;
    g->held = k;
    pthread_cond_broadcast(&g->cond);
    while (g->released <= k) /* the test releases every stage it holds */
      pthread_cond_wait(&g->cond, &g->mutex);
    g->held = -1;
  }
  bool fail = g->fail_next;
  g->fail_next = false;
  pthread_mutex_unlock(&g->mutex);
  if (fail) {
    sl_ctx_fail(ctx, "the test failed the gate");
    return -EIO;
  }
  return sl_emit(ctx, in->data, in->size_bytes);
}

static int gate_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  (void)ctx;
  gate *g = state;
  pthread_mutex_lock(&g->mutex);
  g->snapshot_id = id;
  g->snapshot_processed = g->processed;
  pthread_mutex_unlock(&g->mutex);
  return 0;
}

/* Wait until the gate holds stage k (bounded: 120 s). */
static void gate_wait_held(int k) {
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += 120;
  pthread_mutex_lock(&the_gate.mutex);
  int rc = 0;
  while (the_gate.held != k && rc != ETIMEDOUT)
    rc = pthread_cond_timedwait(&the_gate.cond, &the_gate.mutex, &deadline);
  bool held = the_gate.held == k;
  pthread_mutex_unlock(&the_gate.mutex);
  cr_assert(held, "the gate never reached stage %d", k);
}

static void gate_release(int k, bool fail_next) {
  pthread_mutex_lock(&the_gate.mutex);
  the_gate.released = k + 1;
  the_gate.fail_next = fail_next;
  pthread_cond_broadcast(&the_gate.cond);
  pthread_mutex_unlock(&the_gate.mutex);
}

/* ------------------------------------------------------------ jobs */

typedef struct run_setup {
  const char *input;
  int format;
  const char *out_dir;
  const char *state_dir;
  int policy;
  uint32_t restart_attempts;
} run_setup;

static sl_job *build(const run_setup *r) {
  /* Only the test triggers checkpoints; the source runs ahead by the
   * fixture's 64 KiB rings. */
  sl_job_config config = sl_fixture_config(r->state_dir, 86400000);
  config.checkpoint.store_policy = r->policy;
  config.spin_iterations = 20;   /* park soon: the gate holds for long */
  if (r->restart_attempts) {
    config.restart = sl_restart_defaults(SL_RESTART_FIXED_DELAY);
    config.restart.attempts = r->restart_attempts;
    config.restart.delay_ms = 0;
  }
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  const char *paths[1] = {r->input};
  sl_file_source_config in = {.paths = paths, .path_count = 1,
                              .format = r->format, .schema = &item_schema};
  static const sl_process_ops gate_ops = {.open = gate_open,
                                          .process = gate_process,
                                          .snapshot = gate_snapshot};
  sl_op *src, *g, *sink;
  cr_assert_eq(sl_source_file(job, "source", &in, &src), 0, "%s",
               sl_job_error(job));
  cr_assert_eq(sl_op_process(job, "gate", &src, 1, 1, &gate_ops, 0, &g), 0);
  sl_file_sink_config out = {.dir = r->out_dir, .exactly_once = 1,
                             .format = sl_format_jsonl,
                             .format_user = (void *)&item_schema};
  cr_assert_eq(sl_sink_file(job, "sink", g, 1, &out, &sink), 0);
  return job;
}

/* Wait (bounded) until checkpoint id is complete. */
static void wait_checkpoint(sl_job *job, uint64_t id) {
  for (int i = 0; i < 120000 && sl_job_last_checkpoint(job, 0) < id; i++)
    sl_test_sleep_us(1000);
  cr_assert_geq(sl_job_last_checkpoint(job, 0), id,
                "checkpoint %" PRIu64 " never completed", id);
}

#define HOLD_FIRST 1000u
#define HOLD_SECOND 12000u
#define INPUT_LINES 16000u
#define APPENDED_LINES 2000u

/* Run 1: read input through the gate, checkpoint once between the holds,
 * stop at the second hold.  With keep_running the job is left running,
 * held at the second hold, and returned; else NULL.  *lines: the records
 * before the checkpoint's position. */
static sl_job *checkpoint_mid_file(const run_setup *r, bool keep_running,
                                   uint64_t *lines) {
  gate_reset(HOLD_FIRST, HOLD_SECOND);
  sl_job *job = build(r);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  gate_wait_held(0);
  uint64_t id = 0;
  cr_assert_eq(sl_job_trigger_checkpoint(job, &id), 0);
  gate_release(0, false); /* the source snapshots when its call returns */
  wait_checkpoint(job, id);
  gate_wait_held(1);
  pthread_mutex_lock(&the_gate.mutex);
  cr_assert_eq(the_gate.snapshot_id, id);
  *lines = the_gate.snapshot_processed;
  pthread_mutex_unlock(&the_gate.mutex);
  /* Far from both ends: every case below has bytes on either side. */
  cr_assert(*lines >= HOLD_FIRST && *lines < HOLD_SECOND,
            "position after %" PRIu64 " lines", *lines);
  cr_assert_gt(offset_after(r->format, *lines), 2 * 4096);
  if (keep_running)
    return job;
  sl_job_stop(job);
  gate_release(1, false);
  int rc = sl_job_wait(job);
  cr_assert(rc == SL_ESTOPPED, "run 1 ended with %s: %s", sl_strerror(rc),
            sl_job_error(job));
  sl_job_destroy(job);
  return NULL;
}

/* Run a resume to its end with the gate open; its status, error in why. */
static int resume(run_setup *r, char *why, size_t why_bytes) {
  gate_reset(0, 0);
  r->policy = SL_STORE_RESUME;
  sl_job *job = build(r);
  sl_test_watchdog w;
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  cr_assert_eq(sl_test_watchdog_arm(&w, job, 120, "resume"), 0);
  int rc = sl_job_wait(job);
  cr_assert_not(sl_test_watchdog_disarm(&w));
  snprintf(why, why_bytes, "%s", sl_job_error(job));
  sl_job_destroy(job);
  return rc;
}

/* Every committed output line holds "n":N; each N of 0..count-1 exactly
 * once, and no pending part is left. */
static void expect_exactly_once(const char *dir, uint64_t count) {
  uint8_t *seen = calloc(count, 1);
  cr_assert(seen);
  DIR *d = opendir(dir);
  cr_assert(d, "%s: %s", dir, strerror(errno));
  uint64_t lines = 0, duplicates = 0, strangers = 0;
  for (struct dirent *e; (e = readdir(d));) {
    cr_expect(strncmp(e->d_name, ".part-", 6) != 0, "pending part %s left",
              e->d_name);
    if (strncmp(e->d_name, "part-", 5) != 0)
      continue;
    char *path = sl_test_path_in(dir, e->d_name);
    char *data = sl_test_slurp(path);
    for (char *l = data; *l;) {
      char *end = strchr(l, '\n');
      cr_assert(end, "%s: a line without newline", path);
      unsigned long long n = 0;
      const char *at = strstr(l, "\"n\":");
      if (!at || at > end || sscanf(at + 4, "%llu", &n) != 1 || n >= count)
        strangers++;
      else if (seen[n]++)
        duplicates++;
      lines++;
      l = end + 1;
    }
    free(data);
    free(path);
  }
  closedir(d);
  uint64_t missing = 0;
  for (uint64_t i = 0; i < count; i++)
    missing += seen[i] == 0;
  free(seen);
  cr_expect_eq(strangers, 0);
  cr_expect_eq(duplicates, 0, "%" PRIu64 " duplicated", duplicates);
  cr_expect_eq(missing, 0, "%" PRIu64 " lost of %" PRIu64, missing, count);
  cr_expect_eq(lines, count);
}

/* ------------------------------------------------------------ changes */

enum change {
  CHANGE_REPLACED,  /* an equal copy renamed over it: another inode */
  CHANGE_TRUNCATED, /* cut below the position */
  CHANGE_HEAD,      /* a byte in the first 4 KiB */
  CHANGE_TAIL,      /* a byte just before the position */
  CHANGE_APPENDED,  /* lines added at the end: allowed */
};

/* Change the nearest digit or lower-case letter before offset to the
 * next one ('3' -> '4', 'w' -> 'x'): the line keeps its shape, the bytes
 * differ. */
static void change_byte_before(const char *path, uint64_t offset) {
  int fd = open(path, O_RDWR);
  cr_assert(fd >= 0, "%s: %s", path, strerror(errno));
  char c = 0;
  uint64_t at = offset;
  bool found = false;
  for (int i = 0; i < 256 && at > 0 && !found; i++) {
    cr_assert_eq(pread(fd, &c, 1, (off_t)--at), 1);
    found = (c >= '0' && c <= '8') || (c >= 'a' && c <= 'y');
  }
  cr_assert(found, "no digit or letter before offset %" PRIu64, offset);
  c++;
  cr_assert_eq(pwrite(fd, &c, 1, (off_t)at), 1);
  close(fd);
}

static void apply_change(const char *dir, const char *path, int format,
                         enum change change, uint64_t lines) {
  uint64_t offset = offset_after(format, lines);
  switch (change) {
  case CHANGE_REPLACED: {
    char *copy = sl_test_path_in(dir, "copy");
    size_t size = 0;
    char *data = sl_test_read_file(path, &size);
    cr_assert(data);
    FILE *f = fopen(copy, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(data, 1, size, f), size);
    cr_assert_eq(fclose(f), 0);
    cr_assert_eq(rename(copy, path), 0);
    free(data);
    free(copy);
    break;
  }
  case CHANGE_TRUNCATED:
    cr_assert_eq(truncate(path, (off_t)(offset / 2)), 0);
    break;
  case CHANGE_HEAD:
    change_byte_before(path, 200);
    break;
  case CHANGE_TAIL:
    change_byte_before(path, offset);
    break;
  case CHANGE_APPENDED:
    append_items(path, format, INPUT_LINES, APPENDED_LINES);
    break;
  }
}

static const char *const change_words[] = {
    [CHANGE_REPLACED] = "was replaced",
    [CHANGE_TRUNCATED] = "was truncated below the checkpointed position",
    [CHANGE_HEAD] = "changed before the checkpointed position",
    [CHANGE_TAIL] = "changed before the checkpointed position",
    [CHANGE_APPENDED] = NULL};

/* Checkpoint mid-file, change the file, resume: refused naming the file
 * and the change, or (appended) exactly once over the longer file. */
static void resume_over(int format, enum change change) {
  char *dir = sl_test_temp_dir("identity");
  char *input = sl_test_path_in(dir, "input.txt");
  char *out = sl_test_path_in(dir, "out");
  char *state = sl_test_path_in(dir, "state");
  cr_assert_eq(mkdir(state, 0777), 0);
  append_items(input, format, 0, INPUT_LINES);
  run_setup r = {.input = input, .format = format, .out_dir = out,
                 .state_dir = state};
  uint64_t lines = 0;
  checkpoint_mid_file(&r, false, &lines);
  apply_change(dir, input, format, change, lines);
  char why[1024];
  int rc = resume(&r, why, sizeof why);
  if (change == CHANGE_APPENDED) {
    cr_assert_eq(rc, 0, "%s", why);
    expect_exactly_once(out, INPUT_LINES + APPENDED_LINES);
  } else {
    cr_assert_neq(rc, 0, "a resume over a changed file ran");
    cr_expect(strstr(why, input), "the error does not name %s: %s", input,
              why);
    cr_expect(strstr(why, change_words[change]), "expected '%s': %s",
              change_words[change], why);
  }
  free(state);
  free(out);
  free(input);
  sl_test_remove_tree(dir);
}

TestSuite(input_identity, .timeout = 600);

Test(input_identity, jsonl_resume_over_a_replaced_file_is_refused) {
  resume_over(SL_FORMAT_JSONL, CHANGE_REPLACED);
}

Test(input_identity, jsonl_resume_over_a_truncated_file_is_refused) {
  resume_over(SL_FORMAT_JSONL, CHANGE_TRUNCATED);
}

Test(input_identity, jsonl_resume_over_a_changed_head_is_refused) {
  resume_over(SL_FORMAT_JSONL, CHANGE_HEAD);
}

Test(input_identity, jsonl_resume_over_bytes_changed_before_the_position_is_refused) {
  resume_over(SL_FORMAT_JSONL, CHANGE_TAIL);
}

Test(input_identity, jsonl_resume_over_an_appended_file_is_exactly_once) {
  resume_over(SL_FORMAT_JSONL, CHANGE_APPENDED);
}

Test(input_identity, csv_resume_over_a_replaced_file_is_refused) {
  resume_over(SL_FORMAT_CSV_HEADER, CHANGE_REPLACED);
}

Test(input_identity, csv_resume_over_bytes_changed_before_the_position_is_refused) {
  resume_over(SL_FORMAT_CSV_HEADER, CHANGE_TAIL);
}

Test(input_identity, csv_resume_over_an_appended_file_is_exactly_once) {
  resume_over(SL_FORMAT_CSV_HEADER, CHANGE_APPENDED);
}

/* Failover: the file changes while the job runs; the gate then fails, and
 * the restart's restore of the checkpoint refuses the changed file. */
Test(input_identity, failover_restore_over_a_changed_file_is_refused) {
  char *dir = sl_test_temp_dir("identity");
  char *input = sl_test_path_in(dir, "input.txt");
  char *out = sl_test_path_in(dir, "out");
  char *state = sl_test_path_in(dir, "state");
  cr_assert_eq(mkdir(state, 0777), 0);
  append_items(input, SL_FORMAT_JSONL, 0, INPUT_LINES);
  run_setup r = {.input = input, .format = SL_FORMAT_JSONL, .out_dir = out,
                 .state_dir = state, .restart_attempts = 1};
  uint64_t lines = 0;
  sl_job *job = checkpoint_mid_file(&r, true, &lines);
  apply_change(dir, input, SL_FORMAT_JSONL, CHANGE_TAIL, lines);
  pthread_mutex_lock(&the_gate.mutex);
  the_gate.hold[0] = the_gate.hold[1] = 0; /* the restart runs free */
  pthread_mutex_unlock(&the_gate.mutex);
  gate_release(1, true);
  sl_test_watchdog w;
  cr_assert_eq(sl_test_watchdog_arm(&w, job, 120, "failover"), 0);
  int rc = sl_job_wait(job);
  cr_assert_not(sl_test_watchdog_disarm(&w));
  const char *why = sl_job_error(job);
  cr_expect_neq(rc, 0, "the restart read a changed file");
  cr_expect_eq(sl_job_restarts(job), 1);
  cr_expect(strstr(why, input), "the error does not name %s: %s", input, why);
  cr_expect(strstr(why, "changed before the checkpointed position"), "%s",
            why);
  sl_job_destroy(job);
  free(state);
  free(out);
  free(input);
  sl_test_remove_tree(dir);
}

/* The library's file source on a FIFO that no writer opens: sl_job_stop()
 * reaches it (today's open(2) would block the source thread for good);
 * then the same FIFO with a writer is read to its end. */
Test(input_identity, a_file_source_on_a_fifo_without_writer_stops) {
  char *dir = sl_test_temp_dir("identity");
  char *fifo = sl_test_path_in(dir, "fifo");
  char *out = sl_test_path_in(dir, "out");
  cr_assert_eq(mkfifo(fifo, 0600), 0);
  sl_job *job;
  cr_assert_eq(sl_job_create(NULL, &job), 0);
  const char *paths[1] = {fifo};
  sl_file_source_config in = {.paths = paths, .path_count = 1,
                              .format = SL_FORMAT_JSONL,
                              .schema = &item_schema};
  sl_op *src, *sink;
  cr_assert_eq(sl_source_file(job, "source", &in, &src), 0);
  sl_file_sink_config o = {.dir = out, .format = sl_format_jsonl,
                           .format_user = (void *)&item_schema};
  cr_assert_eq(sl_sink_file(job, "sink", src, 1, &o, &sink), 0);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  sl_test_watchdog w;
  cr_assert_eq(sl_test_watchdog_arm(&w, NULL, 60, "stop on a FIFO"), 0);
  double t0 = sl_test_now_s();
  sl_job_stop(job);
  int rc = sl_job_wait(job);
  double latency_s = sl_test_now_s() - t0;
  cr_assert_not(sl_test_watchdog_disarm(&w));
  cr_expect_eq(rc, SL_ESTOPPED, "%s", sl_job_error(job));
  fprintf(stderr, "file source on a FIFO without writer: stopped in %.3f s\n",
          latency_s);
  sl_job_destroy(job);
  free(out);
  free(fifo);
  sl_test_remove_tree(dir);
}

/* ------------------------------------------------------------ processes */

static const char *sluice_bin(void) {
  const char *bin = getenv("SLUICE_BIN");
  cr_assert(bin && *bin, "SLUICE_BIN is not set (meson sets it)");
  return bin;
}

/* Start `sluice ARGS...` with stdin from stdin_fd (-1: /dev/null) and
 * stdout and stderr appended to log. */
static pid_t start(const char *log, int stdin_fd, const char *const *args) {
  const char *argv[40];
  argv[0] = sluice_bin();
  int n = 0;
  for (; args[n]; n++) {
    cr_assert(n < 38);
    argv[n + 1] = args[n];
  }
  argv[n + 1] = NULL;
  pid_t pid = fork();
  cr_assert(pid >= 0, "fork: %s", strerror(errno));
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    int in = stdin_fd >= 0 ? stdin_fd : open("/dev/null", O_RDONLY);
    if (fd < 0 || in < 0)
      _exit(127);
    dup2(in, 0);
    dup2(fd, 1);
    dup2(fd, 2);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  return pid;
}

/* Exit status of pid (128 + signal if killed). */
static int finish(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    cr_assert(errno == EINTR, "waitpid: %s", strerror(errno));
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Wait up to bound_s for pid's exit: its status, or -1 (then it was
 * SIGKILLed and reaped). */
static int finish_within(pid_t pid, double bound_s) {
  double t0 = sl_test_now_s();
  int status = 0;
  while (sl_test_now_s() - t0 < bound_s) {
    pid_t got = waitpid(pid, &status, WNOHANG);
    cr_assert(got >= 0 || errno == EINTR, "waitpid: %s", strerror(errno));
    if (got == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status)
                               : 128 + WTERMSIG(status);
    sl_test_sleep_us(2000);
  }
  kill(pid, SIGKILL);
  finish(pid);
  return -1;
}

/* The value of field (e.g. "SigCgt:") in /proc/PID/status, as hex or
 * decimal per base; 0 if absent. */
static uint64_t proc_status(pid_t pid, const char *field, int base) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  uint64_t v = 0;
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, field, strlen(field)) == 0)
      v = strtoull(line + strlen(field), NULL, base);
  if (f)
    fclose(f);
  return v;
}

/* Wait (bounded) until pid catches SIGINT and SIGTERM and runs its job's
 * threads: from then on a signal stops the job, not the process. */
static void wait_watching(pid_t pid) {
  uint64_t want = (1ull << (SIGINT - 1)) | (1ull << (SIGTERM - 1));
  for (int i = 0; i < 60000; i++) {
    /* Main and one instance thread: a chained job may have no more
     * (runtime.c note 12). */
    if ((proc_status(pid, "SigCgt:", 16) & want) == want &&
        proc_status(pid, "Threads:", 10) >= 2)
      return;
    int status;
    cr_assert_eq(waitpid(pid, &status, WNOHANG), 0, "sluice exited early");
    sl_test_sleep_us(1000);
  }
  cr_assert_fail("sluice never started its job");
}

/* Is a thread of pid inside a call that waits for input: openat(2) (a
 * FIFO without writer, before the fix), poll(2) or read(2)?  From
 * /proc/PID/task/TID/syscall, whose first field is the call's number. */
static bool waits_for_input(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *d = opendir(path);
  bool waiting = false;
  for (struct dirent *e; d && !waiting && (e = readdir(d));) {
    if (e->d_name[0] == '.')
      continue;
    char file[320];
    snprintf(file, sizeof file, "/proc/%d/task/%s/syscall", (int)pid,
             e->d_name);
    FILE *f = fopen(file, "r");
    long nr = -1;
    if (f && fscanf(f, "%ld", &nr) != 1)
      nr = -1;
    if (f)
      fclose(f);
    waiting = nr == SYS_openat || nr == SYS_read || nr == SYS_ppoll
#ifdef SYS_poll
              || nr == SYS_poll
#endif
        ;
  }
  if (d)
    closedir(d);
  return waiting;
}

/* Send sig to a sluice started on args, expect exit status want.  With
 * input set, first wait until a thread waits for input (the source). */
static void stop_with(const char *tag, int sig, int want, int stdin_fd,
                      bool input, const char *const *args) {
  char *dir = sl_test_temp_dir("identity");
  char *log = sl_test_path_in(dir, "log");
  pid_t pid = start(log, stdin_fd, args);
  wait_watching(pid);
  for (int i = 0; input && i < 60000 && !waits_for_input(pid); i++)
    sl_test_sleep_us(1000);
  cr_assert(!input || waits_for_input(pid), "%s: no thread waits for input",
            tag);
  double t0 = sl_test_now_s();
  /* To the main thread, where the kernel most often delivers a signal
   * sent to the process: a source thread blocked in open(2) then gets no
   * EINTR to fall out of, and only a stop that reaches it ends the job. */
  cr_assert_eq(syscall(SYS_tgkill, pid, pid, sig), 0, "tgkill: %s",
               strerror(errno));
  int status = finish_within(pid, 10.0);
  double latency_s = sl_test_now_s() - t0;
  char *text = sl_test_read_file(log, NULL);
  cr_assert_neq(status, -1, "%s: sluice did not stop within 10 s of %s: %s",
                tag, strsignal(sig), text ? text : "");
  cr_expect_eq(status, want, "%s: exit %d after %s, expected %d: %s", tag,
               status, strsignal(sig), want, text ? text : "");
  fprintf(stderr, "%s: %s stopped sluice in %.3f s (exit %d)\n", tag,
          strsignal(sig), latency_s, status);
  free(text);
  free(log);
  sl_test_remove_tree(dir);
}

static void stop_on_fifo(int sig, int want) {
  char *dir = sl_test_temp_dir("identity");
  char *fifo = sl_test_path_in(dir, "events");
  cr_assert_eq(mkfifo(fifo, 0600), 0);
  const char *args[] = {"nexmark", "run", "--query", "q0", "--input", fifo,
                        "--quiet", NULL};
  stop_with("nexmark run --input FIFO", sig, want, -1, true, args);
  free(fifo);
  sl_test_remove_tree(dir);
}

static void stop_on_stdin(int sig, int want) {
  int p[2];
  cr_assert_eq(pipe2(p, O_CLOEXEC), 0); /* the child holds no write end */
  const char *args[] = {"nexmark", "run",         "--query", "q0",
                        "--input", "/dev/stdin", "--quiet", NULL};
  stop_with("nexmark run --input /dev/stdin", sig, want, p[0], true, args);
  close(p[0]);
  close(p[1]); /* held open until now: the pipe never ended */
}

Test(input_identity, nexmark_on_a_fifo_without_writer_stops_on_sigint_130) {
  stop_on_fifo(SIGINT, 130);
}

Test(input_identity, nexmark_on_a_fifo_without_writer_stops_on_sigterm_143) {
  stop_on_fifo(SIGTERM, 143);
}

Test(input_identity, nexmark_on_a_quiet_stdin_stops_on_sigint_130) {
  stop_on_stdin(SIGINT, 130);
}

Test(input_identity, nexmark_on_a_quiet_stdin_stops_on_sigterm_143) {
  stop_on_stdin(SIGTERM, 143);
}

Test(input_identity, sluice_run_exits_130_on_sigint_and_143_on_sigterm) {
  const char *args[] = {"run", "pipeline", "--records", "4000000000000",
                        "--quiet", NULL};
  stop_with("sluice run pipeline", SIGINT, 130, -1, false, args);
  stop_with("sluice run pipeline", SIGTERM, 143, -1, false, args);
}

/* ------------------------------------------------------------ nexmark file */

/* Run 1 of the event-file cases: q0 over events, slowed to about 1000
 * events/s by a fault on the source, SIGKILLed once a part is committed
 * (a checkpoint with a position past the start is then durable; the
 * file's end is then tens of seconds away). */
static void nexmark_killed_mid_file(const char *dir, const char *events,
                                    const char *state, const char *output) {
  char *log = sl_test_path_in(dir, "run1.log");
  char *parts = malloc(strlen(output) + 8);
  cr_assert(parts);
  sprintf(parts, "%s.parts", output);
  const char *args[] = {"nexmark", "run", "--query", "q0", "--input", events,
                        "--state-dir", state, "--checkpoint-interval", "20",
                        "--no-sync", "--output", output, "--quiet",
                        "--fault", "slow:op=events,delay_us=1000", NULL};
  pid_t pid = start(log, -1, args);
  bool committed = false;
  for (int i = 0; i < 120000 && !committed; i++) {
    DIR *d = opendir(parts);
    for (struct dirent *e; d && (e = readdir(d));) {
      if (strncmp(e->d_name, "part-", 5) != 0)
        continue;
      char *path = sl_test_path_in(parts, e->d_name);
      struct stat st;
      committed |= stat(path, &st) == 0 && st.st_size > 0;
      free(path);
    }
    if (d)
      closedir(d);
    int status;
    cr_assert_eq(waitpid(pid, &status, WNOHANG), 0, "run 1 ended early");
    if (!committed)
      sl_test_sleep_us(2000);
  }
  cr_assert(committed, "run 1 committed no part");
  kill(pid, SIGKILL);
  cr_assert_eq(finish(pid), 128 + SIGKILL);
  free(parts);
  free(log);
}

static int nexmark_resume(const char *dir, const char *events,
                          const char *state, const char *output,
                          char **log_text) {
  char *log = sl_test_path_in(dir, "run2.log");
  const char *args[] = {"nexmark", "run", "--query", "q0", "--input", events,
                        "--state-dir", state, "--resume", "--no-sync",
                        "--output", output, "--quiet", NULL};
  int status = finish(start(log, -1, args));
  *log_text = sl_test_slurp(log);
  free(log);
  return status;
}

static void nexmark_resume_over(enum change change) {
  char *dir = sl_test_temp_dir("identity");
  char *events = sl_test_path_in(dir, "events.jsonl");
  char *state = sl_test_path_in(dir, "state");
  char *output = sl_test_path_in(dir, "q0.csv");
  char *log = sl_test_path_in(dir, "gen.log");
  const char *gen[] = {"nexmark", "gen", "--events", "40000", "--output",
                       events, NULL};
  cr_assert_eq(finish(start(log, -1, gen)), 0);
  nexmark_killed_mid_file(dir, events, state, output);
  switch (change) {
  case CHANGE_APPENDED: { /* the first 3000 events again, at the end */
    char *data = sl_test_slurp(events);
    char *cut = data;
    for (int i = 0; i < 3000 && (cut = strchr(cut, '\n')); i++)
      cut++;
    cr_assert(cut);
    FILE *f = fopen(events, "ab");
    cr_assert(f);
    fwrite(data, 1, (size_t)(cut - data), f);
    cr_assert_eq(fclose(f), 0);
    free(data);
    break;
  }
  case CHANGE_TRUNCATED:
    cr_assert_eq(truncate(events, 100), 0);
    break;
  default:
    apply_change(dir, events, SL_FORMAT_JSONL, change, 0);
    break;
  }
  char *text = NULL;
  int status = nexmark_resume(dir, events, state, output, &text);
  if (change == CHANGE_APPENDED) {
    cr_assert_eq(status, 0, "%s", text);
    /* The uninterrupted run over the appended file writes the same file. */
    char *fresh = sl_test_path_in(dir, "fresh.csv");
    const char *run[] = {"nexmark", "run", "--query", "q0", "--input", events,
                         "--output", fresh, "--quiet", NULL};
    cr_assert_eq(finish(start(log, -1, run)), 0);
    size_t n1 = 0, n2 = 0;
    char *want = sl_test_read_file(fresh, &n1);
    char *got = sl_test_read_file(output, &n2);
    cr_assert(want && got);
    cr_expect(n1 > 1000 && n1 == n2 && memcmp(want, got, n1) == 0,
              "the resumed output (%zu bytes) differs from an uninterrupted "
              "run's (%zu bytes)", n2, n1);
    free(want);
    free(got);
    free(fresh);
  } else {
    cr_expect_eq(status, 1, "exit %d: %s", status, text);
    cr_expect(strstr(text, events), "the error does not name %s: %s", events,
              text);
    cr_expect(strstr(text, change_words[change]), "expected '%s': %s",
              change_words[change], text);
  }
  free(text);
  free(log);
  free(output);
  free(state);
  free(events);
  sl_test_remove_tree(dir);
}

Test(input_identity, nexmark_resume_over_a_replaced_event_file_is_refused) {
  nexmark_resume_over(CHANGE_REPLACED);
}

Test(input_identity, nexmark_resume_over_a_truncated_event_file_is_refused) {
  nexmark_resume_over(CHANGE_TRUNCATED);
}

Test(input_identity, nexmark_resume_over_a_changed_event_file_is_refused) {
  nexmark_resume_over(CHANGE_HEAD);
}

Test(input_identity, nexmark_resume_over_an_appended_event_file_is_exactly_once) {
  nexmark_resume_over(CHANGE_APPENDED);
}
