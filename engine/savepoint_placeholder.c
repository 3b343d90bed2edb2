/* savepoint_placeholder.c — TEMPORARY.  Stands in for sl_job_savepoint(),
 * which another helper writes in parallel in its own worktree, so that the
 * HTTP endpoint (http.c) links and its POST /savepoints can be tested
 * here.  The lead deletes this file (and its line in engine/meson.build)
 * when merging the real one. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>

#include "internal.h"

int sl_job_savepoint(sl_job *job, const char *dir, uint64_t *checkpoint_id,
                     char *err, size_t err_bytes);

SL_EXPORT int sl_job_savepoint(sl_job *job, const char *dir,
                               uint64_t *checkpoint_id, char *err,
                               size_t err_bytes) {
  (void)job;
  if (checkpoint_id)
    *checkpoint_id = 0;
  if (err && err_bytes)
    snprintf(err, err_bytes,
             "savepoints are not built in yet (placeholder): cannot write "
             "one to '%s'", dir ? dir : "");
  return ENOSYS;
}
