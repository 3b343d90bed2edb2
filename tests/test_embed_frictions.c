/* test_embed_frictions.c — issue 19's small frictions of a library inside
 * a host process, with real jobs and real directories: sl_version() at
 * run time, the parents of state_dir created like savepoint directories,
 * SL_STORE_RESUME on an empty directory, an invalid SLUICE_LOG_LEVEL
 * refused, and the fingerprint refusal naming
 * the operator that differs. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "fixtures.h"
#include "sluice.h"
#include "sluice_io.h"
#include "test_dirs.h"
#include "test_util.h"

/* sl_version() is "MAJOR.MINOR.PATCH" of the SL_VERSION_* macros. */
Test(embed_frictions, version_matches_the_macros) {
  char want[64];
  snprintf(want, sizeof want, "%d.%d.%d", SL_VERSION_MAJOR, SL_VERSION_MINOR,
           SL_VERSION_PATCH);
  cr_assert_not_null(sl_version());
  cr_expect_str_eq(sl_version(), want);
}

#define RECORDS 1000
static uint64_t numbers[RECORDS];

static int drop_process(sl_ctx *ctx, void *state, int input,
                        const sl_record *in) {
  (void)ctx, (void)state, (void)input, (void)in;
  return 0;
}

static const sl_process_ops drop_ops = {.process = drop_process};

static int copy_map(void *user, const sl_record *in, void *out,
                    uint32_t *out_size_bytes) {
  (void)user;
  memcpy(out, in->data, in->size_bytes);
  *out_size_bytes = in->size_bytes;
  return 0;
}

/* numbers -> "relay" (a map of parallelism relay_parallelism) -> "sink",
 * checkpointed into state_dir; returns sl_job_run's status and the job's
 * message in message (message_bytes). */
static int run_job(const char *state_dir, int relay_parallelism, int policy,
                   char *message, size_t message_bytes) {
  for (uint64_t i = 0; i < RECORDS; i++)
    numbers[i] = i;
  sl_job_config config = sl_fixture_config(state_dir, 1000);
  config.no_pinning = 1;
  config.checkpoint.store_policy = policy;
  sl_job *job = 0;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  sl_op *source = 0, *relay = 0, *sink = 0;
  cr_assert_eq(sl_source_memory(job, "numbers", numbers, sizeof numbers[0],
                                RECORDS, &source), 0);
  cr_assert_eq(sl_op_map(job, "relay", source, relay_parallelism,
                         sizeof numbers[0], copy_map, 0, &relay), 0);
  cr_assert_eq(sl_op_sink(job, "sink", relay, 1, &drop_ops, 0, &sink), 0);
  int rc = sl_job_run(job);
  snprintf(message, message_bytes, "%s", sl_job_error(job));
  sl_job_destroy(job);
  return rc;
}

/* A state_dir whose parents are missing: they are made, like a savepoint
 * directory's (before issue 19 the run failed with ENOENT). */
Test(embed_frictions, state_dir_parents_are_created) {
  char *base = sl_test_temp_dir("frictions");
  char *state_dir = sl_test_path_in(base, "a/b/state");
  char message[1024];
  int rc = run_job(state_dir, 1, 0, message, sizeof message);
  cr_assert_eq(rc, 0, "run: %d (%s): %s", rc, sl_strerror(rc), message);
  struct stat st;
  cr_assert_eq(stat(state_dir, &st), 0, "%s: %s", state_dir, strerror(errno));
  cr_expect(S_ISDIR(st.st_mode));
  char *parent = sl_test_path_in(base, "a/b");
  cr_assert_eq(stat(parent, &st), 0);
  mode_t mask = umask(0);
  umask(mask);
  cr_expect_eq(st.st_mode & 0777, 0755 & ~mask, "mode %o",
               (unsigned)(st.st_mode & 0777));
  free(parent);
  free(state_dir);
  sl_test_remove_tree(base);
}

/* SL_STORE_RESUME on a directory with no checkpoint (empty, or not there
 * yet) starts fresh: one setting both starts and resumes a job.  The
 * refusal of a third run under the default policy shows the first two
 * left checkpoints (so the second had one to resume). */
Test(embed_frictions, resume_on_an_empty_state_dir_starts_fresh) {
  char *base = sl_test_temp_dir("frictions");
  char message[1024];
  int rc = run_job(base, 1, SL_STORE_RESUME, message, sizeof message);
  cr_assert_eq(rc, 0, "resume on empty: %s: %s", sl_strerror(rc), message);
  rc = run_job(base, 1, SL_STORE_RESUME, message, sizeof message);
  cr_assert_eq(rc, 0, "resume: %s: %s", sl_strerror(rc), message);
  rc = run_job(base, 1, SL_STORE_REFUSE, message, sizeof message);
  cr_expect_eq(rc, SL_EHASSTATE, "third run: %s: %s", sl_strerror(rc),
               message);
  char *fresh = sl_test_path_in(base, "new/state");
  rc = run_job(fresh, 1, SL_STORE_RESUME, message, sizeof message);
  cr_expect_eq(rc, 0, "resume on a new path: %s: %s", sl_strerror(rc),
               message);
  free(fresh);
  sl_test_remove_tree(base);
}

/* A parent that is a file: the run fails naming that parent. */
Test(embed_frictions, state_dir_parent_that_is_a_file_is_named) {
  char *base = sl_test_temp_dir("frictions");
  char *file = sl_test_path_in(base, "plain");
  FILE *f = fopen(file, "w");
  cr_assert(f);
  fclose(f);
  char *state_dir = sl_test_path_in(base, "plain/sub/state");
  char message[1024];
  int rc = run_job(state_dir, 1, 0, message, sizeof message);
  cr_assert_neq(rc, 0, "a state_dir under a file ran");
  char want[600];
  snprintf(want, sizeof want, "the parent %s exists and is not a directory",
           file);
  cr_expect(strstr(message, want), "no \"%s\" in \"%s\"", want, message);
  free(state_dir);
  free(file);
  sl_test_remove_tree(base);
}

/* An invalid SLUICE_LOG_LEVEL fails sl_job_create with EINVAL (before
 * issue 19 it was logged as a warning and ignored). */
Test(embed_frictions, invalid_log_level_variable_is_refused) {
  const char *old = getenv("SLUICE_LOG_LEVEL");
  char *saved = old ? strdup(old) : 0;
  setenv("SLUICE_LOG_LEVEL", "chatty", 1);
  sl_job *job = (sl_job *)&job; /* not NULL: the call must clear it */
  int rc = sl_job_create(0, &job);
  if (saved)
    setenv("SLUICE_LOG_LEVEL", saved, 1);
  else
    unsetenv("SLUICE_LOG_LEVEL");
  free(saved);
  cr_expect_eq(rc, EINVAL, "sl_job_create: %d (%s)", rc, sl_strerror(rc));
  cr_expect_null(job);
  /* A valid value (and none) is still accepted. */
  setenv("SLUICE_LOG_LEVEL", "warn", 1);
  cr_assert_eq(sl_job_create(0, &job), 0);
  sl_job_destroy(job);
  unsetenv("SLUICE_LOG_LEVEL");
}

/* A level the host set itself wins: the variable is not read, so a bad
 * one does not refuse the job. */
Test(embed_frictions, log_level_set_by_the_host_wins) {
  setenv("SLUICE_LOG_LEVEL", "chatty", 1);
  cr_assert_eq(sl_log_set_level(SL_LOG_WARN), 0);
  sl_job *job = 0;
  int rc = sl_job_create(0, &job);
  unsetenv("SLUICE_LOG_LEVEL");
  cr_assert_eq(rc, 0, "sl_job_create: %d (%s)", rc, sl_strerror(rc));
  sl_job_destroy(job);
}

/* Resuming with one operator's parallelism changed: the refusal names
 * that operator, both parallelisms, and the savepoint way to rescale. */
Test(embed_frictions, fingerprint_refusal_names_the_operator) {
  char *base = sl_test_temp_dir("frictions");
  char *state_dir = sl_test_path_in(base, "state");
  char message[1024];
  int rc = run_job(state_dir, 1, 0, message, sizeof message);
  cr_assert_eq(rc, 0, "first run: %d (%s): %s", rc, sl_strerror(rc), message);
  rc = run_job(state_dir, 2, SL_STORE_RESUME, message, sizeof message);
  cr_assert_neq(rc, 0, "a resume with another parallelism ran");
  const char *wants[] = {
      "operator \"relay\" (map, parallelism 1) in the store is \"relay\" "
      "(map, parallelism 2) in this job",
      "--from-savepoint", "sl_job_config.checkpoint.from_savepoint"};
  for (int i = 0; i < 3; i++)
    cr_expect(strstr(message, wants[i]), "no \"%s\" in \"%s\"", wants[i],
              message);
  free(state_dir);
  sl_test_remove_tree(base);
}
