/* output.c — before a CLI run starts: an explicit --resume needs
 * something to resume, and an earlier merged output goes (output.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "inspect.h"
#include "output.h"

int cli_refuse_empty_resume(const sl_job_config *config) {
  const struct sl_checkpoint_config *c = &config->checkpoint;
  if (c->store_policy != SL_STORE_RESUME || c->from_savepoint ||
      !c->state_dir)
    return 0;
  char err[1024] = "";
  sl_state_dir *sd = NULL;
  /* Read-only, and closed before the job opens the store (LMDB allows one
   * open of a directory per process at a time). */
  int rc = sl_state_dir_open(c->state_dir, 0, &sd, err, sizeof err);
  uint64_t latest = rc == 0 ? sl_state_dir_info_get(sd)->latest : 0;
  sl_state_dir_close(sd);
  if (rc == ENOENT || (rc == 0 && latest == 0)) {
    fprintf(stderr,
            "sluice: nothing to resume in %s: %s; start without --resume\n",
            c->state_dir,
            rc == ENOENT ? "no checkpoint store there"
                         : "it holds no complete checkpoint");
    return 1;
  }
  return 0; /* a checkpoint, or a store the job's start will judge */
}

int cli_retire_output(const char *path) {
  char tmp[8300];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  const char *names[] = {path, tmp};
  for (int i = 0; i < 2; i++) {
    if (unlink(names[i]) != 0 && errno != ENOENT) {
      fprintf(stderr, "sluice: cannot remove the earlier %s: %s\n", names[i],
              strerror(errno));
      return 1;
    }
  }
  return 0;
}

int cli_job_create(sl_job_config *config, sl_job **job) {
  *job = NULL;
  if (cli_refuse_empty_resume(config) != 0)
    return 1;
  config->struct_bytes = sizeof *config; /* sluice.h ABI */
  int rc = sl_job_create(config, job);
  if (rc) {
    fprintf(stderr, "sluice: invalid configuration: %s\n", sl_strerror(rc));
    return 2;
  }
  return 0;
}
