/* cpus.h — the CPUs the process may use: its affinity mask and its cgroup
 * CPU quota (cpus.c), for pinning and the automatic spin limit (graph.c).
 * Internal.  Every call reads /proc and the cgroup files afresh: call at
 * job start, never per record.  Also the process's tally of pinned
 * threads, which spreads several jobs over the CPUs (cpus.c note 8).
 */
#ifndef SL_CPUS_H
#define SL_CPUS_H

#include <stdbool.h>
#include <stddef.h>

/* The CPUs of the process's affinity mask (sched_getaffinity), ascending,
 * malloc'd into *cpus (free it), their number into *count.  0, an errno of
 * sched_getaffinity, or ENOMEM. */
int sl_cpus_allowed(int **cpus, int *count);

/* The cgroup CPU quota of the process as whole CPUs, ceil(quota/period),
 * the smallest on the way up its cgroup v2 and v1 (cpu) hierarchies; 0
 * when there is none or it cannot be read (cpus.c notes 2-4). */
int sl_cpus_quota(void);

/* min(mask_count, sl_cpus_quota()) — the quota only when there is one. */
int sl_cpus_usable(int mask_count);

/* The whole CPUs a cgroup v2 cpu.max line ("QUOTA PERIOD", "max PERIOD")
 * allows: 0 for "max" or text it cannot parse.  For tests. */
int sl_cpus_parse_cpu_max(const char *text);

/* The same for cgroup v1's cpu.cfs_quota_us and cpu.cfs_period_us lines:
 * 0 for a quota of -1 (none) or text it cannot parse.  For tests. */
int sl_cpus_parse_cfs(const char *quota_text, const char *period_text);

/* From the text of a /proc/self/mountinfo (modified: lines are cut), the
 * directory of the cgroup at path (as /proc/self/cgroup names it) in the
 * v2 hierarchy or the v1 one with the cpu controller, and the mount point
 * it lies under, each into `bytes` bytes; false if no mount shows it
 * (cpus.c notes 3 and 7).  For tests. */
bool sl_cpus_cgroup_dir(char *mountinfo, bool v2, const char *path,
                        char *dir, char *point, size_t bytes);

/* Note 8: places n threads of one job.  slot[t] is thread t's place in
 * the job's own order, an index into cpus[0, count).  Under one lock,
 * picks the rotation r that keeps the busiest CPU least busy, counting
 * the threads that live jobs of this process have pinned already
 * (rotate false: r = 0, for an explicit list), writes
 * placed[t] = cpus[(slot[t] + r) % count] and counts those threads in.
 * sl_cpus_unplace takes them out again; call it exactly once with the
 * same placed[]. */
void sl_cpus_place(const int *cpus, int count, const int *slot, int n,
                   bool rotate, int *placed);
void sl_cpus_unplace(const int *placed, int n);

/* The threads this process's live jobs have pinned to cpu.  For tests. */
int sl_cpus_placed_on(int cpu);

#endif /* SL_CPUS_H */
