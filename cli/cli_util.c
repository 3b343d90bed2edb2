/* cli_util.c — what the sluice command's subcommands share: usage errors,
 * number, CPU-list and restart-strategy parsing, and a stopwatch.  Each
 * parser exits with status 2 and a message naming the flag on bad input. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli_util.h"

void die_usage(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("sluice: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputs(" (see sluice --help)\n", stderr);
  va_end(ap);
  exit(2);
}

uint64_t parse_u64(const char *flag, const char *text, uint64_t min,
                   uint64_t max) {
  if (!text)
    die_usage("%s needs a value", flag);
  char *end = 0;
  errno = 0;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno || end == text || *end != 0 || text[0] < '0' || text[0] > '9')
    die_usage("%s: '%s' is not a whole number", flag, text);
  if (v < min || v > max)
    die_usage("%s: %llu is outside %" PRIu64 "..%" PRIu64, flag, v, min, max);
  return v;
}

void parse_log_level(const char *flag, const char *text) {
  if (!text)
    die_usage("%s needs a value", flag);
  int level = SL_LOG_INFO;
  if (sl_log_level_parse(text, &level) != 0)
    die_usage("%s: '%s' is not error, warn, info or debug", flag, text);
  sl_log_set_level(level);
}

int parse_cpus(const char *text, int *cpus) {
  if (!text)
    die_usage("--cpus needs a value");
  int n = 0;
  const char *p = text;
  while (*p) {
    char *end = 0;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (errno || end == p || *p < '0' || *p > '9' || v >= 1024)
      die_usage("--cpus: '%s' is not a list of CPU numbers like 0,1", text);
    if (n == MAX_CPUS)
      die_usage("--cpus: more than %d CPUs", MAX_CPUS);
    cpus[n++] = (int)v;
    if (*end == ',' && end[1] != 0)
      end++;
    else if (*end != 0)
      die_usage("--cpus: '%s' is not a list of CPU numbers like 0,1", text);
    p = end;
  }
  if (n == 0)
    die_usage("--cpus: empty list");
  return n;
}

/* --restart: a strategy name and colon-separated fields; the fields not
 * given keep Flink's defaults (sl_restart_defaults). */
void check_unaligned_options(const sl_job_config *config) {
  if (config->checkpoint_aligned_timeout_ms && !config->checkpoint_unaligned)
    die_usage("--aligned-timeout-ms is for --unaligned (it switches an "
              "aligned checkpoint to unaligned)");
  if (config->checkpoint_unaligned && !config->checkpoint.state_dir)
    die_usage("--unaligned needs --state-dir (it is a kind of checkpoint)");
  if (config->checkpoint_unaligned &&
      config->checkpoint.mode == SL_AT_LEAST_ONCE)
    die_usage("--unaligned and --at-least-once exclude each other: "
              "unaligned checkpoints are exactly-once");
}

void parse_restart(const char *text, struct sl_restart_config *r) {
  if (!text)
    die_usage("--restart needs a value");
  char copy[256];
  if (strlen(text) >= sizeof copy)
    die_usage("--restart: '%s' is too long", text);
  strcpy(copy, text);
  char *fields[6] = {0};
  int n = 0;
  char *save = 0;
  char *name = strtok_r(copy, ":", &save);
  for (char *f; n < 6 && (f = strtok_r(0, ":", &save));)
    fields[n++] = f;
  if (!name)
    die_usage("--restart: empty");
  if (strcmp(name, "none") == 0 && n == 0) {
    *r = sl_restart_defaults(SL_RESTART_NONE);
  } else if (strcmp(name, "fixed-delay") == 0 && n <= 2) {
    *r = sl_restart_defaults(SL_RESTART_FIXED_DELAY);
    if (n > 0)
      r->attempts = (uint32_t)parse_u64("--restart attempts", fields[0], 0, 1000000000);
    if (n > 1)
      r->delay_ms = (uint32_t)parse_u64("--restart delay", fields[1], 0, 86400000);
  } else if (strcmp(name, "exponential-delay") == 0 && n <= 5) {
    *r = sl_restart_defaults(SL_RESTART_EXPONENTIAL_DELAY);
    if (n > 0)
      r->initial_delay_ms = (uint32_t)parse_u64("--restart initial", fields[0], 0, 86400000);
    if (n > 1)
      r->max_delay_ms = (uint32_t)parse_u64("--restart max", fields[1], 0, 86400000);
    for (int i = 2; i < n; i++) {
      char *end;
      double v = strtod(fields[i], &end);
      if (end == fields[i] || *end)
        die_usage("--restart: '%s' is not a number", fields[i]);
      *(i == 2 ? &r->multiplier : &r->jitter) = v;
    }
  } else if (strcmp(name, "failure-rate") == 0 && n <= 3) {
    *r = sl_restart_defaults(SL_RESTART_FAILURE_RATE);
    if (n > 0)
      r->max_failures = (uint32_t)parse_u64("--restart max failures", fields[0], 0, 1000000);
    if (n > 1)
      r->interval_ms = (uint32_t)parse_u64("--restart interval", fields[1], 1, 86400000);
    if (n > 2)
      r->delay_ms = (uint32_t)parse_u64("--restart delay", fields[2], 0, 86400000);
  } else {
    die_usage("--restart: '%s' is not none, fixed-delay[:A[:D]], "
              "exponential-delay[:I[:M[:X[:J]]]] or failure-rate[:M[:I[:D]]]",
              text);
  }
}

double seconds_since(const struct timespec *t0) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

/* The job SIGINT and SIGTERM stop, and the signal that came. */
static sl_job *volatile watched_job;
static volatile sig_atomic_t watched_signal;

/* With cli_stopper_start: the first stop signal writes 't' to stop_pipe
 * (the stopper thread stops the job with a savepoint); a second one, or
 * one whose byte cannot be written, stops the job at once. */
static int stop_pipe[2] = {-1, -1};
static volatile sig_atomic_t stop_signals;

static void on_stop_signal(int sig) {
  watched_signal = sig;
  int saved = errno; /* a handler must leave errno as it found it */
  bool handed = stop_pipe[1] >= 0 && stop_signals++ == 0 &&
                write(stop_pipe[1], "t", 1) == 1;
  errno = saved;
  sl_job *job = watched_job;
  if (job && !handed)
    sl_job_stop(job); /* only stores and futex wakes: signal-safe */
}

void cli_watch_signals(sl_job *job) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  watched_job = job;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

void cli_unwatch_signals(void) { watched_job = NULL; }

int cli_signal_received(void) { return watched_signal; }

/* The shell's convention, 128 + the signal's number: 130 for SIGINT, 143
 * for SIGTERM, so a script can tell an interrupt from a termination. */
int cli_stop_status(void) {
  int sig = watched_signal;
  return sig > 0 ? 128 + sig : 1;
}

/* SIGUSR1 -> one byte on savepoint_pipe (the read end is the caller's).
 * The write end is non-blocking: with the pipe full, a request is
 * dropped rather than the handler blocked. */
static int savepoint_pipe[2] = {-1, -1};

static void on_savepoint_signal(int sig) {
  (void)sig;
  int saved = errno; /* a handler must leave errno as it found it */
  if (savepoint_pipe[1] >= 0 && write(savepoint_pipe[1], "s", 1) < 0) {
    /* full or closed: nothing a handler could do about it */
  }
  errno = saved;
}

int cli_watch_savepoint_signal(void) {
  if (pipe2(savepoint_pipe, O_CLOEXEC) != 0)
    return -1;
  fcntl(savepoint_pipe[1], F_SETFL, O_NONBLOCK);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_savepoint_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, NULL);
  return savepoint_pipe[0];
}

void cli_unwatch_savepoint_signal(void) {
  signal(SIGUSR1, SIG_IGN); /* its default would end the process */
  if (savepoint_pipe[1] >= 0 && write(savepoint_pipe[1], "q", 1) < 0)
    fprintf(stderr, "sluice: cannot stop the savepoint thread: %s\n",
            strerror(errno));
}

/* ------------------------------------------------------------ stopper */

struct cli_stopper {
  sl_job *job;
  const char *dir;
  bool drain;
  int fd;          /* stop_pipe's read end */
  pthread_t thread;
  bool started;
  bool stopped;    /* the job stopped with a savepoint */
};

static void stop_with_savepoint(cli_stopper *s);

/* One turn per byte: 't' (a signal) stops the job with a savepoint once
 * 'a' (cli_stopper_arm: the job started) came, before or after it; 'q'
 * (cli_stopper_finish) or the pipe's end ends the thread. */
static void *stopper_main(void *arg) {
  cli_stopper *s = arg;
  bool armed = false, asked = false;
  for (;;) {
    char c;
    ssize_t n = read(s->fd, &c, 1);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0 || c == 'q')
      return 0;
    armed |= c == 'a';
    asked |= c == 't';
    if (armed && asked) {
      asked = false;
      stop_with_savepoint(s);
    }
  }
}

static void stop_with_savepoint(cli_stopper *s) {
  uint64_t id = 0;
  char err[1024];
  int rc = sl_job_stop_with_savepoint(s->job, s->dir,
                                      s->drain ? SL_STOP_DRAIN : 0, &id, err,
                                      sizeof err);
  if (rc == 0) {
    s->stopped = true;
    fprintf(stderr, "\nstopped with savepoint %s (checkpoint %" PRIu64 ")\n",
            s->dir, id);
  } else {
    fprintf(stderr, "\nsluice: stop with a savepoint failed: %s; the job "
            "goes on (a second signal stops it at once)\n",
            err[0] ? err : sl_strerror(rc));
  }
}

void cli_stopper_arm(cli_stopper *s) {
  if (s && write(stop_pipe[1], "a", 1) != 1)
    fprintf(stderr, "sluice: --stop-savepoint is off: %s\n", strerror(errno));
}

cli_stopper *cli_stopper_start(sl_job *job, const char *dir, bool drain) {
  if (!dir)
    return 0;
  cli_stopper *s = calloc(1, sizeof *s);
  if (!s || pipe2(stop_pipe, O_CLOEXEC) != 0) {
    fprintf(stderr, "sluice: --stop-savepoint is off: %s\n", strerror(errno));
    free(s);
    return 0;
  }
  fcntl(stop_pipe[1], F_SETFL, O_NONBLOCK);
  *s = (cli_stopper){.job = job, .dir = dir, .drain = drain,
                     .fd = stop_pipe[0]};
  s->started = pthread_create(&s->thread, 0, stopper_main, s) == 0;
  if (!s->started) {
    fprintf(stderr, "sluice: --stop-savepoint is off: no thread\n");
    close(stop_pipe[0]);
    close(stop_pipe[1]);
    stop_pipe[0] = stop_pipe[1] = -1;
    free(s);
    return 0;
  }
  return s;
}

bool cli_stopper_finish(cli_stopper *s) {
  if (!s)
    return false;
  int fd = stop_pipe[1];
  stop_pipe[1] = -1; /* signals from now on stop at once */
  if (write(fd, "q", 1) != 1)
    fprintf(stderr, "sluice: cannot end the stopper thread: %s\n",
            strerror(errno));
  pthread_join(s->thread, 0);
  close(fd);
  close(s->fd);
  stop_pipe[0] = -1;
  bool stopped = s->stopped;
  free(s);
  return stopped;
}

int64_t parse_copy_pass(const char *flag, const char *text) {
  if (text && strcmp(text, "off") == 0)
    return SL_COPY_PASS_OFF;
  char *end = 0;
  errno = 0;
  unsigned long long v = text ? strtoull(text, &end, 10) : 0;
  if (!text || errno || end == text || *end != 0 || text[0] < '1' ||
      text[0] > '9' || v > (1u << 20))
    die_usage("%s takes a number of MiB, 1..1048576, or off (got %s%s%s)",
              flag, text ? "'" : "", text ? text : "nothing",
              text ? "'" : "");
  return (int64_t)(v << 20);
}

int parse_chaining(const char *flag, const char *text) {
  if (text && strcmp(text, "auto") == 0)
    return SL_CHAINING_AUTO;
  if (text && strcmp(text, "always") == 0)
    return SL_CHAINING_ALWAYS;
  if (text && strcmp(text, "never") == 0)
    return SL_CHAINING_NEVER;
  die_usage("%s takes auto, always or never (got %s%s%s)", flag,
            text ? "'" : "", text ? text : "nothing", text ? "'" : "");
  return SL_CHAINING_AUTO; /* not reached */
}
