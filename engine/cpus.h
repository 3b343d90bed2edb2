/* cpus.h — the CPUs the process may use: its affinity mask and its cgroup
 * CPU quota (cpus.c), for pinning and the automatic spin limit (graph.c).
 * Internal.  Every call reads /proc and the cgroup files afresh: call at
 * job start, never per record.
 */
#ifndef SL_CPUS_H
#define SL_CPUS_H

#include <stdbool.h>

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

#endif /* SL_CPUS_H */
