/* output.h — what a CLI run does with earlier runs' results before it
 * starts (cli/output.c): refuse an explicit --resume with nothing to
 * resume, and take away an earlier merged --output FILE. */
#ifndef SL_CLI_OUTPUT_H
#define SL_CLI_OUTPUT_H

#include "sluice.h"

/** An explicit --resume (store_policy SL_STORE_RESUME, no savepoint) needs
 * a complete checkpoint in state_dir: with none (no such directory, no
 * store in it, or a store without a complete checkpoint) print
 * "sluice: nothing to resume in DIR: ..." and return 1.  Returns 0 when
 * there is one, or when the store cannot be read here (the job's own
 * start then reports why, naming the file). */
int cli_refuse_empty_resume(const sl_job_config *config);

/* The job of *config (its struct_bytes set here), after
 * cli_refuse_empty_resume: 0 and *job, 1 when there is nothing to resume
 * (said on stderr), or 2 for an invalid configuration (said on stderr). */
int cli_job_create(sl_job_config *config, sl_job **job);

/** A run that will write path removes it, and path.tmp, first: a run that
 * fails, is refused or is killed leaves no earlier file looking like its
 * result.  Returns 0, or 1 after printing why path could not be removed. */
int cli_retire_output(const char *path);

#endif /* SL_CLI_OUTPUT_H */
