/* state_allocator.c — the test hook that says which allocator holds a
 * job's keyed state and how many bytes it holds (sluice_testing.h,
 * sl_testing_state_allocator; storage/alloc.h explains the arenas).
 */
#include <errno.h>
#include <stdio.h>

#include "cow_map.h"
#include "internal.h"
#include "sluice_testing.h"

SL_EXPORT int sl_testing_state_allocator(sl_job *job, char *name,
                                         size_t bytes,
                                         uint64_t *allocated_bytes) {
  if (!job || !name || bytes == 0 || !allocated_bytes)
    return EINVAL;
  /* The maps change owner and are replaced while the job runs (a restart
   * swaps them): only a job that is not running has a stable set. */
  if (atomic_load(&job->state) == SL_JOB_RUNNING)
    return SL_EUSAGE;
  const char *allocator = 0;
  uint64_t total = 0;
  for (int i = 0; i < job->instance_count; i++) {
    const sl_cow_map *map = job->instances[i]->cp.keyed;
    if (!map)
      continue;
    uint64_t map_bytes = 0;
    int rc = sl_cow_map_allocator(map, &allocator, &map_bytes);
    if (rc == ENOTSUP)
      continue; /* malloc, or a map left without an arena (alloc.h note 4) */
    if (rc)
      return rc;
    total += map_bytes;
  }
  if (!allocator) /* no keyed state (yet): the build's answer */
    allocator = sl_cow_map_allocator_name();
  int n = snprintf(name, bytes, "%s", allocator);
  if (n < 0 || (size_t)n >= bytes)
    return ERANGE;
  *allocated_bytes = total;
  return 0;
}
