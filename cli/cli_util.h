/* cli_util.h — helpers shared by the sluice command's subcommands
 * (cli/sluice.c with options.c, jobs.c and verdict.c; cli/nexmark.c;
 * cli/checkpoints.c). */
#ifndef SLUICE_CLI_UTIL_H
#define SLUICE_CLI_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "sluice.h"

#define MAX_CPUS 256

/** Print "sluice: MESSAGE (see sluice --help)" and exit with status 2. */
void die_usage(const char *fmt, ...)
    __attribute__((format(printf, 1, 2), noreturn));

/** --chaining's value (auto, always or never) as enum sl_chaining, or
 * die_usage() naming the values. */
int parse_chaining(const char *flag, const char *text);

/** --copy-pass-mib's value: "off" as SL_COPY_PASS_OFF, or N (1 ..
 * 1048576) MiB as bytes, for sl_job_config.checkpoint_copy_pass_bytes; or
 * die_usage(). */
int64_t parse_copy_pass(const char *flag, const char *text);

/** The value of flag as a whole number in min..max, or die_usage(). */
uint64_t parse_u64(const char *flag, const char *text, uint64_t min,
                   uint64_t max);

/** A comma-separated CPU list into cpus (MAX_CPUS at most); its length. */
int parse_cpus(const char *text, int *cpus);

/** --restart STRATEGY[:FIELDS] into *r (fields not given: Flink's
 * defaults, sl_restart_defaults). */
void parse_restart(const char *text, struct sl_restart_config *r);

/** --unaligned and --aligned-timeout-ms against the rest of config
 * (sluice run and sluice nexmark run): die_usage() naming the conflict
 * (sl_job_create would refuse it with EINVAL). */
void check_unaligned_options(const sl_job_config *config);

/** Seconds elapsed on CLOCK_MONOTONIC since *t0. */
double seconds_since(const struct timespec *t0);

/** SIGINT and SIGTERM stop job (sl_job_stop) until cli_unwatch_signals();
 * cli_signal_received() is the signal that came, or 0. */
void cli_watch_signals(sl_job *job);
void cli_unwatch_signals(void);
int cli_signal_received(void);
/** Exit status of a job stopped by a signal: 128 + its number (130 for
 * SIGINT, 143 for SIGTERM); 1 if no signal came. */
int cli_stop_status(void);

/** SIGUSR1 asks for a savepoint: its handler only writes the byte 's' to
 * a pipe (write() is async-signal-safe), whose read end this returns (-1:
 * no pipe; errno says why).  cli_unwatch_savepoint_signal() ignores
 * SIGUSR1 from then on and writes 'q', the reader's cue to end. */
int cli_watch_savepoint_signal(void);
void cli_unwatch_savepoint_signal(void);

/** --stop-savepoint DIR [--drain]: from cli_stopper_start (before
 * sl_job_start; dir not NULL), the first SIGINT or SIGTERM stops job, once
 * cli_stopper_arm said it started, with a savepoint
 * into dir (sl_job_stop_with_savepoint, draining with drain) on a thread
 * of its own, which prints `stopped with savepoint DIR (checkpoint N)` on
 * stderr; a second signal stops the job at once.  If the stop fails the
 * job goes on (the message says why).  NULL: dir was NULL or no pipe or
 * thread could be made (said on stderr; signals stop at once).
 * cli_stopper_finish, after sl_job_wait, ends the thread and returns
 * whether the job stopped with a savepoint (NULL: false). */
typedef struct cli_stopper cli_stopper;
cli_stopper *cli_stopper_start(sl_job *job, const char *dir, bool drain);
void cli_stopper_arm(cli_stopper *s);
bool cli_stopper_finish(cli_stopper *s);
/** --log-level LEVEL (error, warn, info, debug): sets the engine's log
 * level (sl_log_set_level), or die_usage(). */
void parse_log_level(const char *flag, const char *text);

/* The live status line of a running job (cli/status.c): every interval_ms
 * (0: 500 ms on a terminal, where one line is redrawn in place; 5000 ms
 * elsewhere, one plain line each), records and rate, watermark lag,
 * newest checkpoint and restarts.  Start returns NULL if no thread could
 * be made (the job runs on without a status).  Stop clears the line on a
 * terminal; NULL is accepted. */
typedef struct cli_status cli_status;
cli_status *cli_status_start(sl_job *job, const char *label,
                             uint32_t interval_ms);
void cli_status_stop(cli_status *status);

/* `sluice checkpoints` (cli/checkpoints.c): argv starts after
 * "checkpoints".  Returns the exit status. */
int checkpoints_main(int argc, char **argv);
/* upgrade.c: `sluice checkpoints --upgrade DIR`; the exit status. */
int checkpoints_upgrade(const char *dir);

/* `sluice nexmark` (cli/nexmark.c): argv starts after "nexmark". */
int nexmark_main(int argc, char **argv);
void nexmark_usage(FILE *out);

#endif /* SLUICE_CLI_UTIL_H */
