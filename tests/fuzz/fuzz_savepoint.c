/* fuzz_savepoint.c — libFuzzer target: the savepoint manifest parsers and
 * the savepoint index.  Each input is written to a scratch savepoint
 * directory as manifest.json and to a scratch state directory as
 * savepoints.jsonl, then read by
 *   - sl_savepoint_install (engine/savepoint.c, manifest_read and its
 *     checks of note 3), as a job started from that savepoint does;
 *   - sl_savepoint_manifest_read (engine/inspect_savepoint.c), as `sluice
 *     checkpoints DIR` does;
 *   - sl_savepoints_read (inspect_savepoint.c, savepoints.jsonl).
 * No data.mdb is there, so a manifest that passes every check ends in the
 * install's error for the missing store copy.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "fuzz_lines.h"
#include "inspect.h"
#include "internal.h"

static char root[] = "/tmp/sluice-fuzz-savepoint-XXXXXX";
static char savepoint_dir[sizeof root + 16];
static char state_dir[sizeof root + 16];
static sl_job *job;
static char *fingerprint;
static bool verbose; /* FUZZ_VERBOSE set: print what each reader said */

static int never_next(sl_ctx *ctx, void *state) {
  (void)ctx, (void)state;
  return 0;
}

static int drop(sl_ctx *ctx, void *state, int input, const sl_record *in) {
  (void)ctx, (void)state, (void)input, (void)in;
  return 0;
}

static void write_file(const char *dir, const char *name, const uint8_t *data,
                       size_t size) {
  char path[sizeof root + 64];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || (size > 0 && fwrite(data, 1, size, f) != size) || fclose(f) != 0)
    abort();
}

static void remove_all(void) {
  char path[sizeof root + 64];
  snprintf(path, sizeof path, "%s/manifest.json", savepoint_dir);
  unlink(path);
  snprintf(path, sizeof path, "%s/savepoints.jsonl", state_dir);
  unlink(path);
  rmdir(savepoint_dir);
  rmdir(state_dir);
  rmdir(root);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  if (!mkdtemp(root))
    abort();
  snprintf(savepoint_dir, sizeof savepoint_dir, "%s/sp", root);
  snprintf(state_dir, sizeof state_dir, "%s/state", root);
  if (mkdir(savepoint_dir, 0755) != 0 || mkdir(state_dir, 0755) != 0)
    abort();
  atexit(remove_all);
  verbose = getenv("FUZZ_VERBOSE") != 0;
  /* source -> sink, as the manifests of the seed corpus describe. */
  sl_job_config config = SL_JOB_CONFIG_INIT;
  config.checkpoint.state_dir = state_dir;
  config.checkpoint.from_savepoint = savepoint_dir;
  config.checkpoint.no_sync = 1;
  config.no_pinning = 1;
  static const sl_source_ops source_ops = {.next = never_next};
  static const sl_process_ops sink_ops = {.process = drop};
  sl_op *source, *sink;
  if (sl_job_create(&config, &job) != 0 ||
      sl_op_source(job, "source", 1, &source_ops, 0, &source) != 0 ||
      sl_op_sink(job, "sink", source, 2, &sink_ops, 0, &sink) != 0 ||
      sl_job_compile(job) != 0 || !(fingerprint = sl_graph_fingerprint(job)))
    abort();
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  write_file(savepoint_dir, "manifest.json", data, size);
  write_file(state_dir, "savepoints.jsonl", data, size);
  char err[1024] = "";

  int rc = sl_savepoint_install(job, fingerprint);
  FUZZ_CHECK(rc != 0); /* no store copy is there to install */
  FUZZ_CHECK(sl_job_error(job)[0] != 0);
  if (verbose)
    fprintf(stderr, "install: %s\n", sl_job_error(job));

  sl_savepoint_manifest m;
  rc = sl_savepoint_manifest_read(savepoint_dir, &m, err, sizeof err);
  FUZZ_CHECK(rc == 0 || err[0] != 0);
  if (verbose)
    fprintf(stderr, "manifest: %d %s\n", rc, err);
  if (rc == 0) {
    FUZZ_CHECK(m.graph != 0);
    FUZZ_CHECK(m.operator_count >= 0 && m.operator_count <= SL_MAX_OPERATORS);
    for (int i = 0; i < m.operator_count; i++) {
      FUZZ_CHECK(memchr(m.operators[i].name, 0,
                        sizeof m.operators[i].name) != 0);
      FUZZ_CHECK(m.operators[i].parallelism >= 1);
    }
  }
  sl_savepoint_manifest_free(&m);

  sl_savepoint_entry *entries = 0;
  size_t count = 0;
  err[0] = 0;
  rc = sl_savepoints_read(state_dir, &entries, &count, err, sizeof err);
  FUZZ_CHECK(rc == 0 || (err[0] != 0 && entries == 0 && count == 0));
  for (size_t i = 0; i < count; i++) {
    FUZZ_CHECK(entries[i].checkpoint_id > 0);
    FUZZ_CHECK(entries[i].path[0] != 0);
  }
  if (verbose)
    fprintf(stderr, "index: %d %zu entries %s\n", rc, count, err);
  free(entries);
  return 0;
}
