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
 *    CPUS_LINES_MAX (files up to CPUS_FILE_MAX bytes), the walk up the
 *    hierarchy to CPUS_DEPTH_MAX levels.
 * 6. The numbers are the kernel's, but parsed as if hostile: a whole
 *    token of digits or nothing (no sign: v1's "-1" means no quota, as
 *    does anything unparseable), at most INT64_MAX, and ceil(Q/P)
 *    computed without a sum that could overflow, clamped to CPU_SETSIZE.
 * 7. Which mount: several may show the hierarchy (bind mounts, a
 *    container's view beside the host's).  The one whose root is the
 *    longest prefix of the process's path, ending at a "/" boundary
 *    (/foo is above /foo/bar, not /foobar), is the one where the
 *    process's directory is visible.  mountinfo escapes blanks and
 *    backslashes in paths as \NNN (octal): decoded.  The buffers (paths
 *    of up to 4 KiB, whole files) live on the heap: this runs on the
 *    host's thread, whose stack may be small.
 * 8. Several jobs in one process.  Each job cuts its own order of
 *    threads into blocks over the mask's CPUs from the first (graph.c,
 *    assign_cpus), so two jobs started side by side, as a service that
 *    embeds one job per tenant or per query does, each put their first
 *    thread, usually the source and whatever is chained to it, on CPU 0,
 *    and a 2-CPU machine ran both on one CPU while the other idled.  The
 *    process now keeps a tally of the threads its live jobs pinned, per
 *    CPU, and a job that pins by the mask rotates its blocks to start
 *    where the result's busiest CPU is least busy (ties: the evener
 *    spread, by the sum of squared loads, then the smallest rotation, so
 *    a job alone is placed as before).  A job pinned by an
 *    explicit list keeps its list as given but is counted, so the others
 *    avoid its CPUs.  The tally is taken at sl_job_start and given back
 *    when the compiled job is freed (sl_job_destroy).  Other processes
 *    are not seen: two processes that pin by default still both begin at
 *    their mask's first CPU; a host running several gives each its own
 *    mask (taskset, a cpuset) or sets no_pinning.
 */
#include "cpus.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CPUS_LINES_MAX 4096 /* mountinfo of a busy host has a few hundred */
#define CPUS_DEPTH_MAX 64   /* cgroup nesting; real trees are < 10 deep */
#define CPUS_PATH_BYTES 4096
#define CPUS_FILE_MAX (4u << 20) /* mountinfo: a few hundred lines */

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

/* Note 6: one whole token of decimal digits (no sign, no space, at most
 * INT64_MAX) at *p, which moves past it and the blanks before it; false
 * for anything else. */
static bool parse_count(const char **p, uint64_t *value) {
  const char *s = *p + strspn(*p, " \t\n");
  size_t digits = strspn(s, "0123456789");
  if (digits == 0 || (s[digits] && !strchr(" \t\n", s[digits])))
    return false;
  uint64_t v = 0;
  for (size_t i = 0; i < digits; i++) {
    unsigned d = (unsigned)(s[i] - '0');
    if (v > ((uint64_t)INT64_MAX - d) / 10)
      return false; /* beyond what the kernel writes */
    v = v * 10 + d;
  }
  *value = v;
  *p = s + digits;
  return true;
}

/* Nothing but blanks left. */
static bool at_end(const char *p) { return p[strspn(p, " \t\n")] == 0; }

/* Q/P as whole CPUs, rounded up: 150000/100000 is 2.  Note 6: no sum
 * that can overflow, clamped before the narrowing. */
static int quota_cpus(uint64_t quota_us, uint64_t period_us) {
  if (quota_us == 0 || period_us == 0)
    return 0;
  uint64_t cpus = quota_us / period_us + (quota_us % period_us != 0);
  return cpus > CPU_SETSIZE ? CPU_SETSIZE : (int)cpus;
}

int sl_cpus_parse_cpu_max(const char *text) {
  if (!text)
    return 0;
  const char *p = text + strspn(text, " \t\n");
  uint64_t quota, period;
  if (strncmp(p, "max", 3) == 0 && (!p[3] || strchr(" \t\n", p[3])))
    return 0; /* no quota, whatever the period */
  if (!parse_count(&p, &quota) || !parse_count(&p, &period) || !at_end(p))
    return 0;
  return quota_cpus(quota, period);
}

int sl_cpus_parse_cfs(const char *quota_text, const char *period_text) {
  uint64_t quota, period;
  /* "-1" (no quota) fails parse_count like any other non-count. */
  if (!quota_text || !period_text || !parse_count(&quota_text, &quota) ||
      !at_end(quota_text) || !parse_count(&period_text, &period) ||
      !at_end(period_text))
    return 0;
  return quota_cpus(quota, period);
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
  char path[CPUS_PATH_BYTES + 32], line[128], period[128];
  if (v2) {
    snprintf(path, sizeof path, "%s/cpu.max", dir);
    return read_line(path, line, sizeof line) ? sl_cpus_parse_cpu_max(line)
                                              : 0;
  }
  snprintf(path, sizeof path, "%s/cpu.cfs_quota_us", dir);
  if (!read_line(path, line, sizeof line))
    return 0;
  snprintf(path, sizeof path, "%s/cpu.cfs_period_us", dir);
  if (!read_line(path, period, sizeof period))
    return 0;
  return sl_cpus_parse_cfs(line, period);
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

/* The whole file at path (a /proc file: its size is unknown until read),
 * malloc'd and NUL-terminated; NULL if unreadable or over CPUS_FILE_MAX. */
static char *read_all(const char *path) {
  FILE *f = fopen(path, "re");
  if (!f)
    return NULL;
  size_t used = 0, cap = 16384;
  char *text = malloc(cap);
  while (text) {
    used += fread(text + used, 1, cap - 1 - used, f);
    if (used < cap - 1 || cap >= CPUS_FILE_MAX)
      break;
    char *bigger = realloc(text, cap * 2);
    if (!bigger) {
      free(text);
      text = NULL;
    }
    text = bigger;
    cap *= 2;
  }
  bool complete = text && (feof(f) || used < cap - 1);
  fclose(f);
  if (!complete) {
    free(text);
    return NULL;
  }
  text[used] = 0;
  return text;
}

/* Note 3: the process's path in the v2 hierarchy, or in the v1 one that
 * holds the cpu controller, from the text of /proc/self/cgroup. */
static bool self_path(char *cgroup, bool v2, char *out, size_t bytes) {
  char *line = cgroup;
  for (int i = 0; line && *line && i < CPUS_LINES_MAX; i++) {
    char *next = strchr(line, '\n');
    if (next)
      *next++ = 0;
    char *first = strchr(line, ':');
    char *second = first ? strchr(first + 1, ':') : NULL;
    if (second) {
      *second = 0;
      bool match = v2 ? strcmp(line, "0") == 0 && first[1] == 0
                      : list_has(first + 1, "cpu");
      if (match)
        return snprintf(out, bytes, "%s", second + 1) < (int)bytes;
    }
    line = next;
  }
  return false;
}

/* Note 7: one mountinfo field (up to a blank) decoded into out: \NNN
 * octal escapes become their byte.  The field's end, or NULL if it does
 * not fit. */
static const char *field_decode(const char *s, char *out, size_t bytes) {
  size_t n = 0;
  while (*s && *s != ' ' && *s != '\n') {
    char c = *s++;
    if (c == '\\' && s[0] >= '0' && s[0] <= '3' && s[1] >= '0' &&
        s[1] <= '7' && s[2] >= '0' && s[2] <= '7') {
      c = (char)((s[0] - '0') * 64 + (s[1] - '0') * 8 + (s[2] - '0'));
      s += 3;
    }
    if (n + 1 >= bytes)
      return NULL;
    out[n++] = c;
  }
  out[n] = 0;
  return s;
}

/* The length of root if it is a prefix of path that ends at a component
 * boundary ("/" matches everything: 0), else -1. */
static long root_match(const char *root, const char *path) {
  if (strcmp(root, "/") == 0)
    return 0;
  size_t n = strlen(root);
  if (strncmp(path, root, n) != 0 || (path[n] && path[n] != '/'))
    return -1;
  return (long)n;
}

/* Whether one mountinfo line (cut at its end) is a mount of the
 * hierarchy: type cgroup2, or cgroup with the cpu controller. */
static bool line_is_hierarchy(const char *line, bool v2) {
  const char *dash = strstr(line, " - ");
  if (!dash)
    return false;
  char type[32], source[256], options[1024];
  if (sscanf(dash + 3, "%31s %255s %1023s", type, source, options) != 3)
    return false;
  return v2 ? strcmp(type, "cgroup2") == 0
            : strcmp(type, "cgroup") == 0 && list_has(options, "cpu");
}

/* Fields 4 and 5 of a mountinfo line (root, mount point), decoded. */
static bool line_root_point(const char *line, char *root, char *point,
                            size_t bytes) {
  const char *s = line;
  for (int field = 0; field < 3; field++) { /* id, parent, major:minor */
    s = strchr(s, ' ');
    if (!s)
      return false;
    s++;
  }
  s = field_decode(s, root, bytes);
  if (!s || *s != ' ')
    return false;
  return field_decode(s + 1, point, bytes) != NULL;
}

bool sl_cpus_cgroup_dir(char *mountinfo, bool v2, const char *path,
                        char *dir, char *point, size_t bytes) {
  char *root = malloc(bytes), *p = malloc(bytes);
  long best = -1;
  char *line = mountinfo;
  for (int i = 0; root && p && line && *line && i < CPUS_LINES_MAX; i++) {
    char *next = strchr(line, '\n');
    if (next)
      *next++ = 0;
    long len;
    /* Note 3: the mount showing the deepest directory above path. */
    if (line_is_hierarchy(line, v2) &&
        line_root_point(line, root, p, bytes) &&
        (len = root_match(root, path)) > best) {
      const char *below = strcmp(path + len, "/") == 0 ? "" : path + len;
      if (strlen(p) + strlen(below) < bytes) { /* else: not usable */
        snprintf(dir, bytes, "%s%s", p, below);
        snprintf(point, bytes, "%s", p);
        best = len;
      }
    }
    line = next;
  }
  free(root);
  free(p);
  return best >= 0;
}

/* The directory of the process's cgroup in one hierarchy, and its mount
 * point (where the walk up stops). */
static bool self_dir(bool v2, char *dir, char *point, size_t bytes) {
  char *cgroup = read_all("/proc/self/cgroup");
  char *path = malloc(bytes);
  bool found = cgroup && path && self_path(cgroup, v2, path, bytes);
  free(cgroup);
  char *mountinfo = found ? read_all("/proc/self/mountinfo") : NULL;
  found = mountinfo &&
          sl_cpus_cgroup_dir(mountinfo, v2, path, dir, point, bytes);
  free(mountinfo);
  free(path);
  return found;
}

/* Note 2: the smallest quota from the process's cgroup up to the root of
 * one hierarchy. */
static int hierarchy_quota(bool v2) {
  /* Note 7: on the heap, not on the host's thread's stack. */
  char *dir = malloc(CPUS_PATH_BYTES), *point = malloc(CPUS_PATH_BYTES);
  if (!dir || !point || !self_dir(v2, dir, point, CPUS_PATH_BYTES)) {
    free(dir);
    free(point);
    return 0;
  }
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
  free(dir);
  free(point);
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

/* ------------------------------------------------ placement (note 8) */

static pthread_mutex_t placed_lock = PTHREAD_MUTEX_INITIALIZER;
static int placed_count[CPU_SETSIZE]; /* threads of live jobs, per CPU */

void sl_cpus_place(const int *cpus, int count, const int *slot, int n,
                   bool rotate, int *placed) {
  assert(count > 0 && n >= 0);
  /* Threads per slot of this job. */
  int *want = calloc((size_t)count, sizeof *want);
  pthread_mutex_lock(&placed_lock);
  int best = 0;
  if (rotate && want) {
    for (int t = 0; t < n; t++) {
      assert(slot[t] >= 0 && slot[t] < count);
      want[slot[t]]++;
    }
    long best_max = -1, best_sum = -1;
    for (int r = 0; r < count; r++) {
      long most = 0, squares = 0; /* the busiest CPU, then the spread */
      for (int s = 0; s < count; s++) {
        long load = (long)placed_count[cpus[(s + r) % count]] + want[s];
        if (load > most)
          most = load;
        squares += load * load;
      }
      if (best_max < 0 || most < best_max ||
          (most == best_max && squares < best_sum)) {
        best = r;
        best_max = most;
        best_sum = squares;
      }
    }
  }
  for (int t = 0; t < n; t++) {
    int cpu = cpus[(slot[t] + best) % count];
    assert(cpu >= 0 && cpu < CPU_SETSIZE);
    placed[t] = cpu;
    placed_count[cpu]++;
  }
  pthread_mutex_unlock(&placed_lock);
  free(want); /* none (out of memory): placed as a job alone is */
}

void sl_cpus_unplace(const int *placed, int n) {
  pthread_mutex_lock(&placed_lock);
  for (int t = 0; t < n; t++) {
    assert(placed_count[placed[t]] > 0);
    placed_count[placed[t]]--;
  }
  pthread_mutex_unlock(&placed_lock);
}

int sl_cpus_placed_on(int cpu) {
  if (cpu < 0 || cpu >= CPU_SETSIZE)
    return 0;
  pthread_mutex_lock(&placed_lock);
  int n = placed_count[cpu];
  pthread_mutex_unlock(&placed_lock);
  return n;
}
