/* crash_harness.c — kill the CLI's window job with SIGKILL at random
 * (seeded) moments, resume it, again and again, and check that its
 * committed output equals an uninterrupted run's.
 *
 *   crash_harness --sluice PATH [--cycles K | --minutes M] [--seed S]
 *                 [--parallelism P] [--records N] [--keys K] [--window W]
 *                 [--faults] [--at-least-once | --unaligned] [--keep]
 *
 * 1. A reference run without interruptions gives the expected committed
 *    lines (and how long a run takes, T).
 * 2. A round starts with empty state and output directories.  Each cycle
 *    starts the job (resuming from the second cycle on) and, after a
 *    random delay in [0, T], kills it with SIGKILL unless it finished.
 *    A finished round's output is compared with the reference, and a new
 *    round begins.
 * 3. With --cycles K the harness stops after K kills; with --minutes M when
 *    the time is up.  Either way a last resume runs the round to its end,
 *    and that output is compared too.
 * 4. --faults adds, to every run, one random injected fault (fail, slow,
 *    snapshot, write, store errors, or a crash at a named point) and a
 *    fixed-delay restart strategy, so in-process failovers and crashes at
 *    named points mix with the kills.
 * Exactly-once: the committed lines must equal the reference's, no
 * uncommitted part may be left, and the CLI's own verdict must pass.  With
 * --at-least-once every reference line must be present (duplicates are
 * allowed).  --unaligned runs every run with unaligned checkpoints
 * (docs/checkpoints.md): kills then land while channel state is captured
 * and written, and resumes replay it.  Exit status 0 when every
 * comparison passed. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct harness {
  const char *sluice;
  uint64_t cycles;  /* kills to do; 0 with minutes */
  double minutes;
  uint64_t seed;
  int parallelism;
  uint64_t records, keys, window;
  bool faults, at_least_once, unaligned, keep;
  char work[256];
  uint64_t rng;
  double run_seconds; /* the reference run's duration */
  char **reference;
  size_t reference_count;
  /* totals */
  uint64_t kills, crashes, rounds, failovers_runs;
} harness;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t next_random(harness *h) { /* xorshift64* */
  h->rng ^= h->rng >> 12;
  h->rng ^= h->rng << 25;
  h->rng ^= h->rng >> 27;
  return h->rng * 0x2545f4914f6cdd1dull;
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("crash_harness: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(1);
}

static void remove_tree(const char *dir) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0)
    die("cannot remove %s", dir);
}

/* ------------------------------------------------------------ output */

static int compare_lines(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every committed line of dir, sorted; *pending counts uncommitted parts. */
static char **read_output(const char *dir, size_t *count, uint64_t *pending) {
  DIR *d = opendir(dir);
  if (!d)
    die("cannot read %s: %s", dir, strerror(errno));
  char **lines = 0;
  size_t n = 0, cap = 0;
  *pending = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, ".part-", 6) == 0)
      (*pending)++;
    if (strncmp(e->d_name, "part-", 5) != 0 && strncmp(e->d_name, "out-", 4) != 0)
      continue;
    char path[800];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "r");
    if (!f)
      die("cannot read %s: %s", path, strerror(errno));
    char line[256];
    while (fgets(line, sizeof line, f)) {
      if (n == cap) {
        cap = cap ? 2 * cap : 4096;
        lines = realloc(lines, cap * sizeof *lines);
        if (!lines)
          die("out of memory");
      }
      lines[n++] = strdup(line);
    }
    fclose(f);
  }
  closedir(d);
  if (n > 0) /* lines is NULL when empty */
    qsort(lines, n, sizeof *lines, compare_lines);
  *count = n;
  return lines;
}

static void free_lines(char **lines, size_t n) {
  for (size_t i = 0; i < n; i++)
    free(lines[i]);
  free(lines);
}

/* Compare a round's output with the reference: returns true if it holds
 * (exactly-once: equal; at-least-once: a superset). */
static bool compare_output(harness *h, const char *out, const char *what) {
  size_t n;
  uint64_t pending;
  char **lines = read_output(out, &n, &pending);
  uint64_t missing = 0, extra = 0;
  size_t i = 0, j = 0;
  while (i < h->reference_count || j < n) {
    int c = i == h->reference_count ? 1
            : j == n                ? -1
                                    : strcmp(h->reference[i], lines[j]);
    if (c == 0)
      i++, j++;
    else if (c < 0)
      missing++, i++;
    else
      extra++, j++;
  }
  free_lines(lines, n);
  bool ok = missing == 0 && (h->at_least_once || (extra == 0 && pending == 0));
  printf("[harness] %s: %zu committed lines, reference %zu: %" PRIu64
         " missing, %" PRIu64 " extra, %" PRIu64 " uncommitted parts: %s\n",
         what, n, h->reference_count, missing, extra, pending,
         ok ? "ok" : "VIOLATED");
  fflush(stdout);
  return ok;
}

/* ------------------------------------------------------------ runs */

/* A random fault for one run (note 4 of the header). */
static void random_fault(harness *h, bool resuming, char *spec, size_t n) {
  uint64_t r = next_random(h);
  uint64_t nth = 1 + next_random(h) % 6;
  switch (r % 11) {
  case 0:
    snprintf(spec, n, "fail:op=window,prob=0.000005,seed=%" PRIu64 ",times=2",
             next_random(h) % 1000);
    break;
  case 1:
    snprintf(spec, n, "snapshot:op=window,nth=%" PRIu64, nth);
    break;
  case 2:
    snprintf(spec, n, "write:nth=%" PRIu64, nth);
    break;
  case 3:
    snprintf(spec, n, "store:call=commit,error=EIO,nth=%" PRIu64, nth);
    break;
  case 4:
    snprintf(spec, n, "store:call=put,error=MAP_FULL,nth=%" PRIu64, nth * 1000);
    break;
  case 5:
    snprintf(spec, n, "slow:op=sink,delay_us=20,from=%" PRIu64 ",records=500",
             nth * 100);
    break;
  case 6:
    snprintf(spec, n, "crash:point=mid-write,nth=%" PRIu64, nth);
    break;
  case 7:
    snprintf(spec, n, "crash:point=after-commit,nth=%" PRIu64, nth);
    break;
  case 8:
    snprintf(spec, n, "crash:point=sink-commit,nth=%" PRIu64, nth);
    break;
  case 9:
    snprintf(spec, n, "crash:point=snapshot,nth=%" PRIu64, nth);
    break;
  default:
    snprintf(spec, n, "%s", resuming ? "crash:point=after-restore"
                                     : "fail:op=source,record=20000");
    break;
  }
}

/* Start one run; returns its pid.  Its output goes to WORK/run.log. */
/* How a run starts: RUN_RESUME after a run that may have checkpointed,
 * RUN_FRESH after a --resume refused as "nothing to resume" (the killed
 * run left no complete checkpoint; --fresh clears its pending parts). */
enum { RUN_FIRST, RUN_RESUME, RUN_FRESH };

static pid_t start_run(harness *h, const char *state, const char *out,
                       int how, const char *fault) {
  char records[32], keys[32], window[32], parallelism[32];
  snprintf(records, sizeof records, "%" PRIu64, h->records);
  snprintf(keys, sizeof keys, "%" PRIu64, h->keys);
  snprintf(window, sizeof window, "%" PRIu64, h->window);
  snprintf(parallelism, sizeof parallelism, "%d", h->parallelism);
  const char *argv[40];
  int a = 0;
  argv[a++] = h->sluice;
  argv[a++] = "run";
  argv[a++] = "window";
  argv[a++] = "--records";
  argv[a++] = records;
  argv[a++] = "--keys";
  argv[a++] = keys;
  argv[a++] = "--window";
  argv[a++] = window;
  argv[a++] = "--parallelism";
  argv[a++] = parallelism;
  argv[a++] = "--state-dir";
  argv[a++] = state;
  argv[a++] = "--output";
  argv[a++] = out;
  argv[a++] = "--checkpoint-interval-ms";
  argv[a++] = "20";
  argv[a++] = "--quiet";
  if (how != RUN_FIRST)
    argv[a++] = how == RUN_RESUME ? "--resume" : "--fresh";
  if (h->at_least_once)
    argv[a++] = "--at-least-once";
  if (h->unaligned)
    argv[a++] = "--unaligned";
  if (fault && fault[0]) {
    argv[a++] = "--fault";
    argv[a++] = fault;
    argv[a++] = "--restart";
    argv[a++] = "fixed-delay:1000:0";
  }
  argv[a] = 0;
  char log[400];
  snprintf(log, sizeof log, "%s/run.log", h->work);
  fflush(0);
  pid_t pid = fork();
  if (pid < 0)
    die("fork: %s", strerror(errno));
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    execv(h->sluice, (char *const *)argv);
    _exit(127);
  }
  return pid;
}

/* The last run's log says its --resume found no checkpoint. */
static bool nothing_to_resume(const harness *h) {
  char path[400], line[1024];
  snprintf(path, sizeof path, "%s/run.log", h->work);
  FILE *f = fopen(path, "r");
  bool found = false;
  while (f && !found && fgets(line, sizeof line, f))
    found = strstr(line, "sluice: nothing to resume in ") != 0;
  if (f)
    fclose(f);
  return found;
}

static void show_log(const harness *h) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "tail -n 20 '%s/run.log' >&2", h->work);
  if (system(cmd) != 0)
    fprintf(stderr, "(no log)\n");
}

/* Wait for pid up to seconds (< 0: without limit).  Returns true with
 * *status if it ended, false if it still runs. */
static bool wait_for(pid_t pid, double seconds, int *status) {
  double end = now_s() + seconds;
  for (;;) {
    pid_t got = waitpid(pid, status, WNOHANG);
    if (got == pid)
      return true;
    if (got < 0)
      die("waitpid: %s", strerror(errno));
    if (seconds >= 0 && now_s() >= end)
      return false;
    struct timespec t = {.tv_sec = 0, .tv_nsec = 1000000};
    nanosleep(&t, 0);
  }
}

/* A run ended by itself: success, a killed-by-its-own-crash-fault, or a
 * refused --resume. */
static bool ended_well(harness *h, int status, bool crash_fault) {
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
    return true;
  if (crash_fault && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
    h->crashes++;
    return false;
  }
  /* A --resume after a run that died before its first checkpoint is
   * refused; the next run starts over (main). */
  if (WIFEXITED(status) && WEXITSTATUS(status) == 1 && nothing_to_resume(h))
    return false;
  fprintf(stderr, "crash_harness: a run failed (status %d); its log:\n", status);
  show_log(h);
  exit(1);
}

/* ------------------------------------------------------------ main */

static void reference_run(harness *h) {
  char state[400], out[400];
  snprintf(state, sizeof state, "%s/reference-state", h->work);
  snprintf(out, sizeof out, "%s/reference-out", h->work);
  double t0 = now_s();
  pid_t pid = start_run(h, state, out, RUN_FIRST, 0);
  int status;
  wait_for(pid, -1, &status);
  h->run_seconds = now_s() - t0;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "crash_harness: the reference run failed; its log:\n");
    show_log(h);
    exit(1);
  }
  uint64_t pending;
  h->reference = read_output(out, &h->reference_count, &pending);
  if (h->reference_count == 0 || pending)
    die("the reference run committed %zu lines and left %" PRIu64
        " uncommitted parts", h->reference_count, pending);
  printf("[harness] reference run: %zu committed lines in %.2f s\n",
         h->reference_count, h->run_seconds);
}

static void usage(void) {
  fprintf(stderr, "usage: crash_harness --sluice PATH [--cycles K | --minutes M] "
          "[--seed S] [--parallelism P] [--records N] [--keys K] [--window W] "
          "[--faults] [--at-least-once | --unaligned] [--keep]\n");
  exit(2);
}

static uint64_t number(const char *flag, const char *v) {
  char *end;
  if (!v)
    usage();
  errno = 0;
  unsigned long long n = strtoull(v, &end, 10);
  if (errno || end == v || *end)
    die("%s: '%s' is not a whole number", flag, v);
  return n;
}

int main(int argc, char **argv) {
  harness h = {.seed = 1, .parallelism = 1, .records = 2000000, .keys = 1000,
               .window = 100};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : 0;
    if (strcmp(a, "--sluice") == 0 && v)
      h.sluice = v, i++;
    else if (strcmp(a, "--cycles") == 0)
      h.cycles = number(a, v), i++;
    else if (strcmp(a, "--minutes") == 0 && v)
      h.minutes = atof(v), i++;
    else if (strcmp(a, "--seed") == 0)
      h.seed = number(a, v), i++;
    else if (strcmp(a, "--parallelism") == 0)
      h.parallelism = (int)number(a, v), i++;
    else if (strcmp(a, "--records") == 0)
      h.records = number(a, v), i++;
    else if (strcmp(a, "--keys") == 0)
      h.keys = number(a, v), i++;
    else if (strcmp(a, "--window") == 0)
      h.window = number(a, v), i++;
    else if (strcmp(a, "--faults") == 0)
      h.faults = true;
    else if (strcmp(a, "--at-least-once") == 0)
      h.at_least_once = true;
    else if (strcmp(a, "--unaligned") == 0)
      h.unaligned = true;
    else if (strcmp(a, "--keep") == 0)
      h.keep = true;
    else
      usage();
  }
  if (!h.sluice || (h.cycles == 0) == (h.minutes <= 0) ||
      (h.unaligned && h.at_least_once))
    usage();
  /* Sanitizer builds set SLUICE_TEST_SCALE (tests/meson.build). */
  const char *scale = getenv("SLUICE_TEST_SCALE");
  if (scale && atoi(scale) > 1)
    h.records /= (uint64_t)atoi(scale);
  h.rng = h.seed * 0x9e3779b97f4a7c15ull + 1;
  snprintf(h.work, sizeof h.work, "/tmp/sluice-harness-XXXXXX");
  if (!mkdtemp(h.work))
    die("mkdtemp: %s", strerror(errno));
  printf("[harness] seed %" PRIu64 ", %s, parallelism %d, %" PRIu64
         " records, %" PRIu64 " keys, window %" PRIu64 "%s, in %s\n",
         h.seed, h.at_least_once ? "at-least-once"
                 : h.unaligned   ? "exactly-once, unaligned"
                                 : "exactly-once",
         h.parallelism, h.records, h.keys, h.window,
         h.faults ? ", random injected faults" : "", h.work);
  reference_run(&h);

  double deadline = now_s() + h.minutes * 60.0;
  bool ok = true;
  uint64_t cycle = 0;
  char state[400], out[400];
  bool round_started = false;
  double last_progress = now_s();
  for (;;) {
    bool time_up = h.cycles ? h.kills >= h.cycles : now_s() >= deadline;
    if (!round_started) {
      if (time_up)
        break;
      h.rounds++;
      snprintf(state, sizeof state, "%s/state-%" PRIu64, h.work, h.rounds);
      snprintf(out, sizeof out, "%s/out-%" PRIu64, h.work, h.rounds);
      round_started = true;
      cycle = 0;
    }
    char fault[200] = "";
    if (h.faults)
      random_fault(&h, cycle > 0, fault, sizeof fault);
    pid_t pid = start_run(&h, state, out,
                          cycle == 0 ? RUN_FIRST
                          : nothing_to_resume(&h) ? RUN_FRESH : RUN_RESUME,
                          fault);
    int status;
    bool ended;
    if (time_up) {
      ended = wait_for(pid, -1, &status); /* the last run goes to its end */
    } else {
      double delay = (double)(next_random(&h) % 1000) / 1000.0 *
                     h.run_seconds;
      ended = wait_for(pid, delay, &status);
      if (!ended) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        h.kills++;
      }
    }
    cycle++;
    if (ended && ended_well(&h, status, strstr(fault, "crash:") != 0)) {
      char what[64];
      snprintf(what, sizeof what, "round %" PRIu64 " (%" PRIu64 " runs)",
               h.rounds, cycle);
      ok = compare_output(&h, out, what) && ok;
      if (!h.keep) {
        remove_tree(state);
        remove_tree(out);
      }
      round_started = false;
      if (!ok)
        break;
    }
    if (now_s() - last_progress >= 10.0) {
      printf("[harness] %" PRIu64 " kills, %" PRIu64 " crashes at named "
             "points, %" PRIu64 " rounds so far\n", h.kills, h.crashes,
             h.rounds);
      fflush(stdout);
      last_progress = now_s();
    }
  }
  printf("verdict: %s (%" PRIu64 " SIGKILLs at random moments, %" PRIu64
         " crashes at named points, %" PRIu64 " rounds, each compared with "
         "the uninterrupted run)\n",
         ok ? "PASSED" : "FAILED", h.kills, h.crashes, h.rounds);
  free_lines(h.reference, h.reference_count);
  if (ok && !h.keep)
    remove_tree(h.work);
  return ok ? 0 : 1;
}
