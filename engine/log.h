/* log.h — the engine's levelled log (internal; the level is set through
 * sl_log_set_level() in sluice.h).
 *
 * A line is
 *
 *   2026-12-03T04:12:01.123Z WARN  [count#0] sluice: job failed: ...
 *
 * the UTC time with milliseconds, the level padded to five characters, the
 * calling thread's name in brackets (the engine's "sl:NAME[i]" shown as
 * NAME#i, "sl:writer" as writer) and the message, as sl_log_stderr
 * writes it.  A message goes to the handler the host installed
 * (sl_log_set_handler in sluice.h), or nowhere (log.c note 5); the
 * stderr handler writes each line to fd 2 with one write(2), so lines of
 * different threads never interleave, formatted on the stack.  A message
 * longer than SL_LOG_LINE_BYTES less the prefix is cut and ends in
 * "...".
 *
 * CONCURRENCY: every call may be made from any thread at any time.
 */
#ifndef SL_LOG_H
#define SL_LOG_H

#include <stdbool.h>

#include "sluice.h"

/** True if a line of level would reach a handler (to skip costly
 * formatting): false without a handler. */
bool sl_log_enabled(int level);

/** Write one line of level (enum sl_log_level) if the level is enabled. */
void sl_log(int level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/** 0, or EINVAL after an ERROR line when SLUICE_LOG_LEVEL is set to no
 * level name and sl_log_set_level was never called (log.c note 4);
 * sl_job_create calls it first. */
int sl_log_env_check(void);

/** The prefix of a line ("TIME LEVEL [THREAD] ") into out; its length.
 * For tests and for writers of their own lines. */
int sl_log_prefix(int level, char *out, int out_bytes);

#endif /* SL_LOG_H */
