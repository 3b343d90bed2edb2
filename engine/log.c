/* log.c — the engine's levelled log lines, handed to the host's handler
 * (sl_log_set_handler) or to the ready-made stderr handler (log.h).
 *
 * NOTES
 *
 * 1. The level is one atomic int.  Until sl_log_set_level() sets it, the
 *    first line (or sl_log_get_level) takes it from SLUICE_LOG_LEVEL, or
 *    SL_LOG_INFO when that is unset or not a level name (then one warning
 *    line says so).  Racing first calls compute the same value.
 * 2. sl_log_stderr formats a line into a stack buffer and writes it with
 *    one write(2): POSIX makes a write to a pipe of at most PIPE_BUF (4096)
 *    bytes atomic, and a terminal or file gets the line in one piece from
 *    one call as well.  SL_LOG_LINE_BYTES is below PIPE_BUF.  Nothing is
 *    allocated: vsnprintf with the engine's formats (integers, strings)
 *    does not allocate, gmtime_r and pthread_getname_np (prctl for the
 *    calling thread) neither.
 * 3. A status line (a CLI's, updated in place with '\r') may be on the
 *    terminal: with sl_log_set_status_line(1) every line starts with
 *    "\r\033[K", which clears it, so the log line stands alone and the
 *    status line is drawn again below it at its next update.
 * 4. An invalid SLUICE_LOG_LEVEL is refused, not ignored: sl_job_create
 *    calls sl_log_env_check first and returns EINVAL, with an ERROR line
 *    naming the variable and the accepted values.  The job is where a host
 *    first asks the library to do work and already checks its settings,
 *    so the refusal comes where the host looks for one; a log line cannot
 *    fail (note 1 keeps its warning for the programs, like `sluice
 *    checkpoints`, that make no job).  A level set with sl_log_set_level
 *    is the host's own choice: the variable is then not read, so not
 *    checked.
 * 5. A library inside someone else's process writes nothing to that
 *    process's stderr unless asked.  The handler starts unresolved; the
 *    first line resolves it: sl_log_stderr when SLUICE_LOG_LEVEL is set
 *    (non-empty: whoever set it wants lines, as before this handler
 *    existed), else none (silent).  sl_log_set_handler resolves it for
 *    good, NULL included.  sl_log_enabled is false without a handler, so
 *    no line is even formatted.
 * 6. The handler and its user pointer change together under
 *    handler_lock, and every call of the handler holds that lock too: so
 *    a handler is never called with another handler's user pointer, calls
 *    never overlap (a handler need not be reentrant), and once
 *    sl_log_set_handler returns the old handler is not running and never
 *    runs again (its user data may be freed).  A lock is cheap here: log
 *    lines are rare (failures, restarts, checkpoints at debug) and never
 *    on the record path.  The cost is that a handler must not log
 *    through sluice or set the handler (it would deadlock): sluice.h says
 *    so.
 */
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "log.h"

_Static_assert(SL_LOG_LINE_BYTES <= 4096, "one line is one atomic write");

#define LEVEL_UNSET (-1)
#define CLEAR_STATUS "\r\033[K"

static _Atomic int log_level = LEVEL_UNSET;
static _Atomic int level_set_by_host; /* note 4 */
static _Atomic int status_line;

/* Note 5, 6. */
enum { HANDLER_UNRESOLVED, HANDLER_RESOLVED };
static pthread_mutex_t handler_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int handler_state = HANDLER_UNRESOLVED;
static _Atomic int handler_present; /* handler_fn != NULL, for a quick look */
static sl_log_fn handler_fn;        /* under handler_lock */
static void *handler_user;          /* under handler_lock */

static const char *const level_names[] = {"error", "warn", "info", "debug"};
static const char *const level_labels[] = {"ERROR", "WARN ", "INFO ",
                                           "DEBUG"};

SL_EXPORT int sl_log_level_parse(const char *name, int *level) {
  for (int i = SL_LOG_ERROR; name && i <= SL_LOG_DEBUG; i++)
    if (strcasecmp(name, level_names[i]) == 0) {
      *level = i;
      return 0;
    }
  return EINVAL;
}

SL_EXPORT int sl_log_set_level(int level) {
  if (level < SL_LOG_ERROR || level > SL_LOG_DEBUG)
    return EINVAL;
  atomic_store_explicit(&log_level, level, memory_order_relaxed);
  atomic_store_explicit(&level_set_by_host, 1, memory_order_relaxed);
  return 0;
}

/* Note 4. */
int sl_log_env_check(void) {
  if (atomic_load_explicit(&level_set_by_host, memory_order_relaxed))
    return 0;
  const char *env = getenv("SLUICE_LOG_LEVEL");
  int parsed = SL_LOG_INFO;
  if (!env || !env[0] || sl_log_level_parse(env, &parsed) == 0)
    return 0;
  /* Settle the level first (info, as note 1 would), so the line below is
   * the only one about the variable: note 1's warning would repeat it. */
  int expected = LEVEL_UNSET;
  atomic_compare_exchange_strong(&log_level, &expected, SL_LOG_INFO);
  sl_log(SL_LOG_ERROR, "sl_job_create: the environment variable "
         "SLUICE_LOG_LEVEL='%.40s' is not one of error, warn, info, debug "
         "(set one of those, or unset it for info)", env);
  return EINVAL;
}

/* Note 1. */
SL_EXPORT int sl_log_get_level(void) {
  int level = atomic_load_explicit(&log_level, memory_order_relaxed);
  if (level != LEVEL_UNSET)
    return level;
  const char *env = getenv("SLUICE_LOG_LEVEL");
  int parsed = SL_LOG_INFO;
  bool bad = env && env[0] && sl_log_level_parse(env, &parsed) != 0;
  int expected = LEVEL_UNSET;
  /* A level set meanwhile by sl_log_set_level wins. */
  atomic_compare_exchange_strong(&log_level, &expected,
                                 bad ? SL_LOG_INFO : parsed);
  if (bad && expected == LEVEL_UNSET)
    sl_log(SL_LOG_WARN, "sluice: SLUICE_LOG_LEVEL='%.40s' is not error, warn, "
           "info or debug; logging at info", env);
  return atomic_load_explicit(&log_level, memory_order_relaxed);
}

SL_EXPORT void sl_log_set_status_line(int on) {
  atomic_store_explicit(&status_line, on != 0, memory_order_relaxed);
}

/* Note 5: the first look settles the handler from the environment. */
static void handler_resolve(void) {
  if (atomic_load_explicit(&handler_state, memory_order_acquire) ==
      HANDLER_RESOLVED)
    return;
  pthread_mutex_lock(&handler_lock);
  if (atomic_load_explicit(&handler_state, memory_order_relaxed) !=
      HANDLER_RESOLVED) {
    const char *env = getenv("SLUICE_LOG_LEVEL");
    handler_fn = env && env[0] ? sl_log_stderr : NULL;
    handler_user = NULL;
    atomic_store_explicit(&handler_present, handler_fn != NULL,
                          memory_order_relaxed);
    atomic_store_explicit(&handler_state, HANDLER_RESOLVED,
                          memory_order_release);
  }
  pthread_mutex_unlock(&handler_lock);
}

SL_EXPORT void sl_log_set_handler(sl_log_fn fn, void *user) {
  pthread_mutex_lock(&handler_lock); /* note 6: waits for a running call */
  handler_fn = fn;
  handler_user = user;
  atomic_store_explicit(&handler_present, fn != NULL, memory_order_relaxed);
  atomic_store_explicit(&handler_state, HANDLER_RESOLVED,
                        memory_order_release);
  pthread_mutex_unlock(&handler_lock);
}

bool sl_log_enabled(int level) {
  handler_resolve();
  return atomic_load_explicit(&handler_present, memory_order_relaxed) &&
         level <= sl_log_get_level();
}

/* The calling thread's name as a line shows it (log.h): an instance run
 * in another's thread (runtime.c note 12) logs under that thread's name. */
static void thread_label(char *out, size_t out_bytes) {
  char name[32] = "";
  if (pthread_getname_np(pthread_self(), name, sizeof name) != 0 || !name[0])
    snprintf(name, sizeof name, "?");
  const char *shown = strncmp(name, "sl:", 3) == 0 ? name + 3 : name;
  size_t len = strlen(shown);
  const char *open = len > 2 && shown[len - 1] == ']' ? strrchr(shown, '[') : 0;
  if (open && open > shown) /* "count[0]" -> "count#0" */
    snprintf(out, out_bytes, "%.*s#%.*s", (int)(open - shown), shown,
             (int)(len - 2 - (size_t)(open - shown)), open + 1);
  else
    snprintf(out, out_bytes, "%s", shown);
}

int sl_log_prefix(int level, char *out, int out_bytes) {
  assert(level >= SL_LOG_ERROR && level <= SL_LOG_DEBUG);
  assert(out_bytes >= 64);
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  struct tm tm;
  time_t secs = now.tv_sec;
  gmtime_r(&secs, &tm);
  char thread[40];
  thread_label(thread, sizeof thread);
  int n = snprintf(out, (size_t)out_bytes,
                   "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ %s [%s] ",
                   tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                   tm.tm_min, tm.tm_sec, (int)(now.tv_nsec / 1000000),
                   level_labels[level], thread);
  return n < out_bytes ? n : out_bytes - 1;
}

/* Write all of line (note 2: one call; a short write to a full terminal
 * is finished, bounded by the line's bytes). */
static void write_line(const char *line, size_t bytes) {
  for (int tries = 0; bytes > 0 && tries < 64; tries++) {
    ssize_t n = write(STDERR_FILENO, line, bytes);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return; /* stderr is gone: nothing to tell anyone */
    line += n;
    bytes -= (size_t)n;
  }
}

/* Note 2, 3: the prefix, the message and a newline in one write. */
SL_EXPORT void sl_log_stderr(void *user, int level, const char *message) {
  (void)user;
  if (level < SL_LOG_ERROR || level > SL_LOG_DEBUG || !message)
    return; /* a host calling it by hand with a bad level: no line */
  char line[SL_LOG_LINE_BYTES];
  int used = 0;
  if (atomic_load_explicit(&status_line, memory_order_relaxed)) {
    memcpy(line, CLEAR_STATUS, sizeof CLEAR_STATUS - 1);
    used = (int)sizeof CLEAR_STATUS - 1;
  }
  used += sl_log_prefix(level, line + used, (int)sizeof line - used);
  int room = (int)sizeof line - used - 1; /* keep one byte for '\n' */
  size_t length = strlen(message);
  int n = length > (size_t)room ? room : (int)length;
  memcpy(line + used, message, (size_t)n);
  if ((size_t)n < length) /* cut, and say so */
    memcpy(line + used + n - 3, "...", 3);
  used += n;
  line[used++] = '\n';
  assert(used <= (int)sizeof line);
  write_line(line, (size_t)used);
}

/* Format the message (cut to SL_LOG_LINE_BYTES, marked "...") and hand it
 * to the handler under the lock (note 6). */
__attribute__((format(printf, 2, 0))) static void log_line(int level,
                                                           const char *fmt,
                                                           va_list ap) {
  char message[SL_LOG_LINE_BYTES];
  int n = vsnprintf(message, sizeof message, fmt, ap);
  if (n < 0)
    message[0] = 0;
  else if ((size_t)n >= sizeof message)
    memcpy(message + sizeof message - 4, "...", 4); /* with the NUL */
  pthread_mutex_lock(&handler_lock);
  if (handler_fn)
    handler_fn(handler_user, level, message);
  pthread_mutex_unlock(&handler_lock);
}

void sl_log(int level, const char *fmt, ...) {
  if (!sl_log_enabled(level))
    return;
  va_list ap;
  va_start(ap, fmt);
  log_line(level, fmt, ap);
  va_end(ap);
}
