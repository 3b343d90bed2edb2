/* run.h — private to the CLI: `sluice run JOB`'s options and the three
 * files that share them: options.c (parsing, checks, usage), jobs.c
 * (building and running the jobs) and verdict.c (checking a finished
 * job's result: the exactly-once verdict). */
#ifndef SLUICE_CLI_RUN_H
#define SLUICE_CLI_RUN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cli_util.h"
#include "sluice.h"
#include "sluice_testing.h" /* the sequence source, checksum and verifying sinks */

typedef struct options {
  const char *job_name;
  uint64_t records;
  uint64_t keys;
  int parallelism;
  sl_job_config config;
  int cpus[MAX_CPUS];
  bool quiet;
  bool json;
  uint32_t status_interval_ms; /* 0: cli/status.c's default */
  const char *output_dir; /* count, window: file sink directory */
  uint64_t window;        /* window: records per count window */
  char faults[4096];      /* --fault specs joined by ';' */
  const char *savepoint_dir; /* SIGUSR1 savepoints go below it */
  const char *stop_savepoint; /* --stop-savepoint: SIGTERM/SIGINT stop with
                                 a savepoint into it */
  bool drain;                 /* --drain: that stop drains first */
  bool stopped_with_savepoint; /* set by run_job after the wait */
  const char *http;       /* --http [ADDR:]PORT, or NULL */
  const char *http_token_file; /* --http-token-file FILE, or NULL */
} options;

/* options.c */
/* The usage text of `sluice` and `sluice run` into out. */
void run_usage(FILE *out);
/* argv[first..] into *o; a bad option is a usage error (exit 2), and
 * -h/--help prints run_usage and exits 0. */
void run_parse_options(int argc, char **argv, int first, options *o);
/* The checks between options (and the defaults they settle) before a job
 * is made; a conflict is a usage error (exit 2). */
void run_check_options(options *o);

/* jobs.c */
/* Build, run and report the job o names; returns the exit status. */
int run_job(options *o);

/* verdict.c: each returns whether the result holds and says why in why. */
/* The count job's committed --output files. */
bool verify_output(const options *o, char *why, size_t why_size);
/* The pipeline and keyed jobs' sink checksum against the closed form. */
bool verify_checksum(const options *o, const sl_checksum *got, char *why,
                     size_t why_size);
/* The window job: its committed files and its verifying sink. */
bool window_verdict(const options *o, const sl_op *verify_op, char *why,
                    size_t why_size);

#endif /* SLUICE_CLI_RUN_H */
