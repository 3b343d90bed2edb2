/* checkpoint_bench.h — what the two files of checkpoint_bench share:
 * checkpoint_bench.c (parts 1-5 and main) and checkpoint_align.c (part 6,
 * barrier alignment).  Header-only, like bench_util.h. */
#ifndef SLUICE_CHECKPOINT_BENCH_H
#define SLUICE_CHECKPOINT_BENCH_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_util.h"

#define UPDATE_STRIDE 7919u /* prime, coprime with the key counts used */

/* Empty dir (created if missing); a failure is reported, not fatal: the
 * job that uses dir fails next and says why. */
static inline void fresh_dir(const char *dir) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
  if (system(cmd) != 0)
    fprintf(stderr, "checkpoint_bench: cannot reset %s\n", dir);
}

/* Part 6 (checkpoint_align.c): returns 0, or nonzero when a case failed
 * (the message is on stderr). */
int align_part(bench_json *json, const char *dir, bool quick);

#endif /* SLUICE_CHECKPOINT_BENCH_H */
