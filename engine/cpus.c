/* cpus.c — one job: how many CPUs, and which, the process may use, as the
 * host set them up: its affinity mask and its cgroup CPU quota (cpus.h).
 *
 * NOTES
 *
 * 1. The mask (sched_getaffinity) says which CPUs; its order (ascending
 *    CPU numbers) is the order instances are pinned in.  A taskset or a
 *    container's cpuset shows here.
 * 2. A quota says how much CPU time: Q microseconds per period P, so at
 *    most Q/P CPUs' worth at once, whatever the mask allows.  cgroup v2
 *    keeps it in cpu.max ("Q P", or "max P" for none); v1 in
 *    cpu.cfs_quota_us (-1 for none) and cpu.cfs_period_us.  The limit in
 *    force is the smallest on the way from the process's cgroup up to the
 *    root of the hierarchy, so each level is read.  A host with both
 *    hierarchies mounted (hybrid) may bind cpu to either: both are read
 *    and the smaller limit wins.
 * 3. Where the process's cgroup lives: /proc/self/cgroup names its path
 *    in each hierarchy ("0::PATH" for v2, "N:cpu,cpuacct:PATH" for v1),
 *    and /proc/self/mountinfo says where the hierarchy is mounted and
 *    which of its directories the mount shows (a container sees its own
 *    cgroup as the mount's root).  The directory is the mount point plus
 *    PATH without that root.
 * 4. usable CPUs = min(CPUs in the mask, ceil(Q/P)).  Anything missing
 *    (no /proc, no cgroup file system, a file we cannot parse) means no
 *    quota: the mask alone, as before; never an error.  Read once per job
 *    start (sl_job_compile), never on the record path.
 * 5. Bounded: lines of /proc/self/cgroup and mountinfo are read up to
 *    CPUS_LINES_MAX, the walk up the hierarchy to CPUS_DEPTH_MAX levels.
 */
#include "cpus.h"

#include <assert.h>
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CPUS_LINES_MAX 4096 /* mountinfo of a busy host has a few hundred */
#define CPUS_DEPTH_MAX 64   /* cgroup nesting; real trees are < 10 deep */
#define CPUS_PATH_BYTES 4096

/* Note 1. */
int sl_cpus_allowed(int **cpus_out, int *count_out) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0)
    return errno;
  int count = CPU_COUNT(&set);
  int *cpus = malloc(sizeof(int) * (size_t)(count > 0 ? count : 1));
  if (!cpus)
    return ENOMEM;
  int n = 0;
  for (int c = 0; c < CPU_SETSIZE && n < count; c++)
    if (CPU_ISSET(c, &set))
      cpus[n++] = c;
  assert(n == count);
  *cpus_out = cpus;
  *count_out = n;
  return 0;
}

/* Q/P as whole CPUs, rounded up: 150000/100000 is 2. */
static int quota_cpus(long long quota_us, long long period_us) {
  if (quota_us <= 0 || period_us <= 0)
    return 0;
  long long cpus = (quota_us + period_us - 1) / period_us;
  return cpus > CPU_SETSIZE ? CPU_SETSIZE : (int)cpus;
}

int sl_cpus_parse_cpu_max(const char *text) {
  char quota[32];
  long long period = 0;
  if (!text || sscanf(text, "%31s %lld", quota, &period) != 2)
    return 0;
  if (strcmp(quota, "max") == 0)
    return 0;
  char *end = NULL;
  long long q = strtoll(quota, &end, 10);
  return end && *end == 0 ? quota_cpus(q, period) : 0;
}

/* The first line of path into buf; false if it cannot be read. */
static bool read_line(const char *path, char *buf, size_t bytes) {
  FILE *f = fopen(path, "re");
  if (!f)
    return false;
  bool ok = fgets(buf, (int)bytes, f) != NULL;
  fclose(f);
  return ok;
}

/* The quota (whole CPUs, 0: none) set in one cgroup directory. */
static int quota_at(const char *dir, bool v2) {
  char path[CPUS_PATH_BYTES + 32], line[128];
  if (v2) {
    snprintf(path, sizeof path, "%s/cpu.max", dir);
    return read_line(path, line, sizeof line) ? sl_cpus_parse_cpu_max(line)
                                              : 0;
  }
  snprintf(path, sizeof path, "%s/cpu.cfs_quota_us", dir);
  if (!read_line(path, line, sizeof line))
    return 0;
  long long quota = atoll(line);
  snprintf(path, sizeof path, "%s/cpu.cfs_period_us", dir);
  if (!read_line(path, line, sizeof line))
    return 0;
  return quota_cpus(quota, atoll(line));
}

/* Whether the comma-separated list holds item. */
static bool list_has(const char *list, const char *item) {
  size_t n = strlen(item);
  for (const char *p = list; p && *p;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    if (len == n && strncmp(p, item, n) == 0)
      return true;
    p = comma ? comma + 1 : NULL;
  }
  return false;
}

/* Note 3: the process's path in the v2 hierarchy, or in the v1 one that
 * holds the cpu controller, into out. */
static bool self_path(bool v2, char *out, size_t bytes) {
  FILE *f = fopen("/proc/self/cgroup", "re");
  if (!f)
    return false;
  char line[CPUS_PATH_BYTES];
  bool found = false;
  for (int i = 0; !found && i < CPUS_LINES_MAX && fgets(line, sizeof line, f);
       i++) {
    line[strcspn(line, "\n")] = 0;
    char *first = strchr(line, ':');
    char *second = first ? strchr(first + 1, ':') : NULL;
    if (!second)
      continue;
    *second = 0;
    bool match = v2 ? strcmp(line, "0") == 0 && first[1] == 0
                    : list_has(first + 1, "cpu");
    if (match && snprintf(out, bytes, "%s", second + 1) < (int)bytes)
      found = true;
  }
  fclose(f);
  return found;
}

/* Note 3: the mount point and root of the hierarchy (v2, or v1 with cpu)
 * from one mountinfo line; false if the line is another mount. */
static bool mount_of(char *line, bool v2, char *root, char *point,
                     size_t bytes) {
  char *dash = strstr(line, " - ");
  if (!dash)
    return false;
  *dash = 0;
  char type[32], source[256], options[1024], r[CPUS_PATH_BYTES],
      p[CPUS_PATH_BYTES];
  if (sscanf(dash + 3, "%31s %255s %1023s", type, source, options) != 3 ||
      sscanf(line, "%*s %*s %*s %4095s %4095s", r, p) != 2)
    return false;
  if (v2 ? strcmp(type, "cgroup2") != 0
         : strcmp(type, "cgroup") != 0 || !list_has(options, "cpu"))
    return false;
  return snprintf(root, bytes, "%s", r) < (int)bytes &&
         snprintf(point, bytes, "%s", p) < (int)bytes;
}

/* The directory of the process's cgroup in one hierarchy, and its mount
 * point (where the walk up stops). */
static bool self_dir(bool v2, char *dir, char *point, size_t bytes) {
  char path[CPUS_PATH_BYTES], root[CPUS_PATH_BYTES];
  if (!self_path(v2, path, sizeof path))
    return false;
  FILE *f = fopen("/proc/self/mountinfo", "re");
  if (!f)
    return false;
  char line[CPUS_PATH_BYTES];
  bool found = false;
  for (int i = 0; !found && i < CPUS_LINES_MAX && fgets(line, sizeof line, f);
       i++)
    found = mount_of(line, v2, root, point, bytes);
  fclose(f);
  if (!found)
    return false;
  size_t root_len = strcmp(root, "/") == 0 ? 0 : strlen(root);
  const char *below = strncmp(path, root, root_len) == 0 ? path + root_len
                                                          : path;
  if (strcmp(below, "/") == 0)
    below = "";
  return snprintf(dir, bytes, "%s%s", point, below) < (int)bytes;
}

/* Note 2: the smallest quota from the process's cgroup up to the root of
 * one hierarchy. */
static int hierarchy_quota(bool v2) {
  char dir[CPUS_PATH_BYTES], point[CPUS_PATH_BYTES];
  if (!self_dir(v2, dir, point, sizeof dir))
    return 0;
  size_t point_len = strlen(point);
  int smallest = 0;
  for (int depth = 0; depth < CPUS_DEPTH_MAX; depth++) {
    int cpus = quota_at(dir, v2);
    if (cpus > 0 && (smallest == 0 || cpus < smallest))
      smallest = cpus;
    char *slash = strrchr(dir, '/');
    if (strlen(dir) <= point_len || !slash || (size_t)(slash - dir) < point_len)
      break; /* the mount's root was the last level */
    *slash = 0;
  }
  return smallest;
}

int sl_cpus_quota(void) {
  int v2 = hierarchy_quota(true);
  int v1 = hierarchy_quota(false);
  if (v2 == 0 || (v1 > 0 && v1 < v2))
    return v1;
  return v2;
}

/* Note 4. */
int sl_cpus_usable(int mask_count) {
  assert(mask_count >= 0);
  int quota = sl_cpus_quota();
  return quota > 0 && quota < mask_count ? quota : mask_count;
}
