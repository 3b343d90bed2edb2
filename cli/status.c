/* status.c — the live status of a running job on stderr (cli_util.h).
 *
 * On a terminal one line is redrawn in place ("\r", the text, erase to the
 * end of the line) every interval; the engine's log lines clear it first
 * (sl_log_set_status_line), and cli_status_stop() clears it before the
 * summary is printed, so they never share a line.  Elsewhere (a file, a
 * pipe) a plain line is written every interval, with the log's time
 * prefix.  Each update is one write(2).
 *
 * A line shows the records the sources emitted and their rate over the
 * last interval, the lowest watermark and its lag behind the wall clock
 * (when the job uses event time in ms since the epoch), the newest
 * complete checkpoint with its duration, and the restarts.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "cli_util.h"
#include "log.h"

#define TTY_INTERVAL_MS 500u
#define PLAIN_INTERVAL_MS 5000u
/* A watermark this close to the wall clock is read as ms since the epoch
 * (a lag is shown); any other is shown as it is. */
#define PLAUSIBLE_LAG_MS (366ll * 24 * 3600 * 1000)
#define LINE_BYTES 512

struct cli_status {
  sl_job *job;
  const char *label;
  bool tty;
  uint32_t interval_ms;
  struct timespec t0;
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool done;
  uint64_t last_records;
  double last_seconds;
};

static int64_t wall_ms(void) {
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  return (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
}

static void write_all(const char *text, size_t bytes) {
  for (int tries = 0; bytes > 0 && tries < 64; tries++) {
    ssize_t n = write(STDERR_FILENO, text, bytes);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return;
    text += n;
    bytes -= (size_t)n;
  }
}

/* ", wm lag 1.2 s" or ", wm 12345" from the lowest watermark, "" if none. */
static void watermark_text(sl_job *job, char *out, size_t out_bytes) {
  out[0] = 0;
  bool any = false;
  int64_t low = 0;
  int n = sl_job_operator_count(job);
  for (int i = 0; i < n; i++) { /* bounded by the operators */
    sl_op_stats st;
    if (sl_job_stats(job, i, &st) != 0 || st.watermark == SL_WATERMARK_MIN ||
        st.watermark == SL_WATERMARK_MAX)
      continue;
    if (!any || st.watermark < low)
      low = st.watermark;
    any = true;
  }
  if (!any)
    return;
  int64_t lag = wall_ms() - low;
  if (lag > -PLAUSIBLE_LAG_MS && lag < PLAUSIBLE_LAG_MS)
    snprintf(out, out_bytes, ", wm lag %.1f s", (double)lag / 1e3);
  else
    snprintf(out, out_bytes, ", wm %" PRId64, low);
}

/* ", ckpt 12 (3.1 ms)" for the newest complete checkpoint, "" if none. */
static void checkpoint_text(sl_job *job, char *out, size_t out_bytes) {
  out[0] = 0;
  for (int k = 0; k < 64; k++) { /* the history keeps the last 64 */
    sl_checkpoint_stats cs;
    if (sl_job_checkpoint_stats(job, k, &cs) != 0)
      return;
    if (cs.status == SL_CHECKPOINT_COMPLETED) {
      snprintf(out, out_bytes, ", ckpt %" PRIu64 " (%.1f ms)", cs.id,
               (double)cs.duration_us / 1e3);
      return;
    }
  }
}

/* The status text (no prefix, no newline) into out. */
static int status_text(cli_status *s, char *out, size_t out_bytes) {
  double t = seconds_since(&s->t0);
  uint64_t records = sl_job_progress(s->job);
  double span = t - s->last_seconds;
  double rate = span > 0 ? (double)(records - s->last_records) / span : 0;
  s->last_records = records;
  s->last_seconds = t;
  char wm[64], ckpt[64];
  watermark_text(s->job, wm, sizeof wm);
  checkpoint_text(s->job, ckpt, sizeof ckpt);
  uint32_t restarts = sl_job_restarts(s->job);
  return snprintf(out, out_bytes,
                  "%s: %.2fM records, %.2fM records/s%s%s, %" PRIu32
                  " restart%s, %.1f s",
                  s->label, (double)records / 1e6, rate / 1e6, wm, ckpt,
                  restarts, restarts == 1 ? "" : "s", t);
}

static int terminal_columns(void) {
  struct winsize ws;
  if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20)
    return ws.ws_col;
  return 80;
}

static void show(cli_status *s) {
  char line[LINE_BYTES];
  int used = 0;
  if (s->tty) {
    memcpy(line, "\r", 1);
    used = 1;
  } else {
    used = sl_log_prefix(SL_LOG_INFO, line, (int)sizeof line);
  }
  int n = status_text(s, line + used, sizeof line - (size_t)used - 8);
  if (n < 0)
    return;
  if ((size_t)n > sizeof line - (size_t)used - 9)
    n = (int)(sizeof line - (size_t)used - 9);
  if (s->tty && n > terminal_columns() - 1)
    n = terminal_columns() - 1; /* a wrapped line could not be redrawn */
  used += n;
  const char *end = s->tty ? "\033[K" : "\n";
  memcpy(line + used, end, strlen(end));
  used += (int)strlen(end);
  write_all(line, (size_t)used);
}

static void *status_main(void *arg) {
  cli_status *s = arg;
  pthread_setname_np(pthread_self(), "status");
  pthread_mutex_lock(&s->lock);
  while (!s->done) { /* ends when cli_status_stop sets done */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += s->interval_ms / 1000u;
    until.tv_nsec += (long)(s->interval_ms % 1000u) * 1000000L;
    if (until.tv_nsec >= 1000000000L)
      until.tv_sec++, until.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&s->cond, &s->lock, &until);
    if (!s->done)
      show(s);
  }
  pthread_mutex_unlock(&s->lock);
  return 0;
}

cli_status *cli_status_start(sl_job *job, const char *label,
                             uint32_t interval_ms) {
  cli_status *s = calloc(1, sizeof *s);
  if (!s)
    return 0;
  s->job = job;
  s->label = label;
  s->tty = isatty(STDERR_FILENO) == 1;
  s->interval_ms = interval_ms ? interval_ms
                   : s->tty    ? TTY_INTERVAL_MS
                               : PLAIN_INTERVAL_MS;
  clock_gettime(CLOCK_MONOTONIC, &s->t0);
  pthread_mutex_init(&s->lock, 0);
  pthread_cond_init(&s->cond, 0);
  if (s->tty)
    sl_log_set_status_line(1);
  if (pthread_create(&s->thread, 0, status_main, s) != 0) {
    sl_log_set_status_line(0);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond);
    free(s);
    return 0;
  }
  return s;
}

void cli_status_stop(cli_status *s) {
  if (!s)
    return;
  pthread_mutex_lock(&s->lock);
  s->done = true;
  pthread_cond_signal(&s->cond);
  pthread_mutex_unlock(&s->lock);
  pthread_join(s->thread, 0);
  if (s->tty) {
    write_all("\r\033[K", 4); /* the summary starts on a clean line */
    sl_log_set_status_line(0);
  }
  pthread_mutex_destroy(&s->lock);
  pthread_cond_destroy(&s->cond);
  free(s);
}
