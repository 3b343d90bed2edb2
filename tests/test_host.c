/* test_host.c — issue 19, a library that behaves inside someone else's
 * process, with real jobs, real child processes and real cgroups:
 *
 * - logging: a host's handler receives the lines of a real failing job;
 *   by default a child process running such a job writes nothing to its
 *   stderr, with SLUICE_LOG_LEVEL it does, and sl_log_set_handler(NULL)
 *   silences even that;
 * - CPUs: a child restricted to one CPU (sched_setaffinity) pins every
 *   instance thread inside its mask; a child in a real cgroup with a CPU
 *   quota counts the quota's CPUs as usable (skipped, saying why, where
 *   the cgroup file system is not writable);
 * - Prometheus: sl_metrics_prometheus renders the /metrics text, ENOSPC
 *   with the size needed, every sample labelled job="NAME" (escaped),
 *   the name's bounds and its default for an older caller's config;
 * - HTTP: the endpoint serves the same text, or, in a build without it
 *   (SL_TEST_HTTP 0), sl_http_start says so with ENOTSUP.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cpus.h"
#include "fixtures.h"
#include "internal.h"
#include "sluice.h"
#include "sluice_testing.h"
#include "test_dirs.h"
#include "test_util.h"

#ifndef SL_TEST_HTTP
#error "tests/meson.build defines SL_TEST_HTTP (1: the endpoint is built)"
#endif

/* ------------------------------------------------------------ jobs */

#define RECORDS 4000
#define KEYS 16

/* What the probe map saw: every instance thread's CPU affinity checked
 * against the mask the job's process had. */
typedef struct probe {
  cpu_set_t mask;       /* the process's mask when the job was built */
  _Atomic int calls;    /* records seen */
  _Atomic int outside;  /* calls on a thread allowed a CPU outside it */
  _Atomic int narrowed; /* calls on a thread allowed exactly one CPU */
} probe;

static int probe_map(void *user, const sl_record *in, void *out,
                     uint32_t *out_size_bytes) {
  probe *p = user;
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof mine, &mine) != 0) /* this thread's */
    return EIO;
  cpu_set_t extra;
  CPU_XOR(&extra, &mine, &p->mask);
  CPU_AND(&extra, &extra, &mine); /* allowed here, not in the mask */
  if (CPU_COUNT(&extra) > 0)
    atomic_fetch_add(&p->outside, 1);
  if (CPU_COUNT(&mine) == 1)
    atomic_fetch_add(&p->narrowed, 1);
  atomic_fetch_add(&p->calls, 1);
  memcpy(out, in->data, in->size_bytes);
  *out_size_bytes = in->size_bytes;
  return 0;
}

/* A replayable keyed source -> the probe -> a verifying sink.  faults
 * (may be NULL) with one fixed-delay restart: the job fails once and
 * logs it.  Returns the job, started; *p must outlive it. */
static sl_job *probe_job(const char *state_dir, const char *faults,
                         const char *name, probe *p, int parallelism) {
  sl_job_config c = sl_fixture_config(state_dir, 20);
  c.faults = faults;
  c.name = name;
  if (faults) {
    c.restart.strategy = SL_RESTART_FIXED_DELAY;
    c.restart.attempts = 1;
  }
  CPU_ZERO(&p->mask);
  cr_assert_eq(sched_getaffinity(0, sizeof p->mask, &p->mask), 0);
  sl_job *job;
  cr_assert_eq(sl_job_create(&c, &job), 0);
  sl_op *src, *mapped, *sink;
  cr_assert_eq(sl_source_keyed(job, "src", parallelism, RECORDS, KEYS, &src),
               0);
  cr_assert_eq(sl_op_map(job, "probe", src, parallelism, 64, probe_map, p,
                         &mapped),
               0);
  cr_assert_eq(sl_sink_verify(job, "verify", mapped, 1, RECORDS, KEYS, &sink),
               0, "%s", sl_job_error(job));
  return job;
}

/* The same in a child process, which must not call Criterion: its exit
 * status says how the job ended (0: finished with every record). */
static int child_run_probe_job(const char *state_dir, const char *faults,
                               probe *p) {
  sl_job_config c = sl_fixture_config(state_dir, 20);
  c.faults = faults;
  if (faults) {
    c.restart.strategy = SL_RESTART_FIXED_DELAY;
    c.restart.attempts = 1;
  }
  CPU_ZERO(&p->mask);
  if (sched_getaffinity(0, sizeof p->mask, &p->mask) != 0)
    return 10;
  sl_job *job;
  if (sl_job_create(&c, &job) != 0)
    return 11;
  sl_op *src, *mapped, *sink;
  if (sl_source_keyed(job, "src", 2, RECORDS, KEYS, &src) ||
      sl_op_map(job, "probe", src, 2, 64, probe_map, p, &mapped) ||
      sl_sink_verify(job, "verify", mapped, 1, RECORDS, KEYS, &sink))
    return 12;
  int rc = sl_job_run(job);
  sl_job_destroy(job);
  return rc == 0 && atomic_load(&p->calls) >= RECORDS ? 0 : 13;
}

/* Reads fd to its end into a malloc'd, NUL-ended string. */
static char *read_all(int fd) {
  size_t cap = 1 << 16, used = 0;
  char *text = malloc(cap);
  cr_assert(text);
  for (;;) { /* bounded by what the child wrote */
    if (used + 4096 > cap)
      cr_assert(text = realloc(text, cap *= 2));
    ssize_t n = read(fd, text + used, cap - used - 1);
    if (n < 0 && errno == EINTR)
      continue;
    cr_assert(n >= 0, "read: %s", strerror(errno));
    if (n == 0)
      break;
    used += (size_t)n;
  }
  text[used] = 0;
  return text;
}

/* ------------------------------------------------------------ logging */

typedef struct captured {
  pthread_mutex_t lock;
  char text[1 << 16];
  size_t used;
  int lines[SL_LOG_DEBUG + 1]; /* per level */
} captured;

static void capture_handler(void *user, int level, const char *message) {
  captured *c = user;
  pthread_mutex_lock(&c->lock); /* not needed (calls are serialized) */
  cr_assert(level >= SL_LOG_ERROR && level <= SL_LOG_DEBUG);
  c->lines[level]++;
  int n = snprintf(c->text + c->used, sizeof c->text - c->used, "%d %s\n",
                   level, message);
  if (n > 0 && (size_t)n < sizeof c->text - c->used)
    c->used += (size_t)n;
  pthread_mutex_unlock(&c->lock);
}

/* A host's handler gets the lines of a real job that fails once and is
 * restarted: the injected fault (info) and the failure (warn), each as the
 * message alone, on the engine's threads. */
Test(host, handler_receives_a_failing_jobs_lines, .timeout = 120) {
  static captured c = {.lock = PTHREAD_MUTEX_INITIALIZER};
  sl_log_set_handler(capture_handler, &c);
  cr_assert_eq(sl_log_set_level(SL_LOG_INFO), 0);
  char *dir = sl_test_temp_dir("host-log");
  static probe p;
  sl_job *job =
      probe_job(dir, "fail:op=probe,record=1500", NULL, &p, 1);
  cr_assert_eq(sl_job_run(job), 0, "%s", sl_job_error(job));
  cr_assert_eq(sl_job_restarts(job), 1);
  sl_job_destroy(job);
  sl_log_set_handler(NULL, NULL); /* c is not called any more */
  cr_assert(strstr(c.text, "2 sluice: injecting fault "
                           "'fail:op=probe,record=1500'"),
            "%s", c.text);
  cr_assert(strstr(c.text, "1 sluice: job failed: "), "%s", c.text);
  cr_assert(strstr(c.text, "; restart 1 (fixed-delay)"), "%s", c.text);
  cr_assert_null(strstr(c.text, "Z WARN"), "messages come without prefix");
  cr_assert(c.lines[SL_LOG_WARN] >= 1);
  sl_test_remove_tree(dir);
}

/* How a child should set up logging before it runs the failing job. */
enum child_logging { CHILD_DEFAULT, CHILD_ENV_WARN, CHILD_ENV_THEN_NULL };

/* Runs the failing job in a child with fd 2 on a pipe; its stderr. */
static char *child_stderr(const char *dir, enum child_logging how) {
  int fds[2];
  cr_assert_eq(pipe(fds), 0);
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    if (dup2(fds[1], 2) != 2)
      _exit(20);
    if (how == CHILD_DEFAULT)
      unsetenv("SLUICE_LOG_LEVEL");
    else
      setenv("SLUICE_LOG_LEVEL", "warn", 1);
    if (how == CHILD_ENV_THEN_NULL)
      sl_log_set_handler(NULL, NULL);
    static probe p;
    _exit(child_run_probe_job(dir, "fail:op=probe,record=1500", &p));
  }
  close(fds[1]);
  char *err = read_all(fds[0]);
  close(fds[0]);
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "child status %d, stderr: %s", status, err);
  return err;
}

/* The default writes nothing to the host's stderr while the same job,
 * with SLUICE_LOG_LEVEL set, does write its warning there; a NULL
 * handler silences even that. */
Test(host, default_leaves_the_hosts_stderr_alone, .timeout = 180) {
  char *dir = sl_test_temp_dir("host-quiet");
  char *state = sl_test_path_in(dir, "a");
  char *with_env = child_stderr(state, CHILD_ENV_WARN);
  cr_assert(strstr(with_env, "WARN  [supervisor] sluice: job failed: "),
            "the job logs a warning: %s", with_env);
  free(state);
  state = sl_test_path_in(dir, "b");
  char *silent = child_stderr(state, CHILD_DEFAULT);
  cr_assert_str_eq(silent, "", "the default wrote to stderr");
  free(state);
  state = sl_test_path_in(dir, "c");
  char *nulled = child_stderr(state, CHILD_ENV_THEN_NULL);
  cr_assert_str_eq(nulled, "", "a NULL handler still wrote to stderr");
  free(state);
  free(with_env);
  free(silent);
  free(nulled);
  sl_test_remove_tree(dir);
}

/* ------------------------------------------------------------ CPUs */

Test(host, cpu_max_lines) {
  cr_assert_eq(sl_cpus_parse_cpu_max("max 100000\n"), 0);
  cr_assert_eq(sl_cpus_parse_cpu_max("100000 100000\n"), 1);
  cr_assert_eq(sl_cpus_parse_cpu_max("150000 100000\n"), 2);
  cr_assert_eq(sl_cpus_parse_cpu_max("50000 100000\n"), 1);
  cr_assert_eq(sl_cpus_parse_cpu_max("400000 100000"), 4);
  cr_assert_eq(sl_cpus_parse_cpu_max("12x 100000"), 0);
  cr_assert_eq(sl_cpus_parse_cpu_max(""), 0);
  /* Hostile lines (cpus.c note 6): no overflow, no split numbers, no
   * negative or out-of-range value taken for a quota. */
  cr_assert_eq(sl_cpus_parse_cpu_max("9223372036854775807 100000"),
               CPU_SETSIZE); /* huge: clamped, and no overflow (UBSan) */
  cr_assert_eq(sl_cpus_parse_cpu_max("9223372036854775807 "
                                     "9223372036854775807"), 1);
  cr_assert_eq(sl_cpus_parse_cpu_max("9223372036854775808 100000"), 0);
  cr_assert_eq(sl_cpus_parse_cpu_max("99999999999999999999 100000"), 0);
  /* 40 digits: %31s once split it, the rest read as the period. */
  cr_assert_eq(sl_cpus_parse_cpu_max(
                   "1234567890123456789012345678901234567890 100000"), 0);
  cr_assert_eq(sl_cpus_parse_cpu_max("123456789012345678901234567890123"
                                     "45"), 0);
  cr_assert_eq(sl_cpus_parse_cpu_max("-100000 100000"), 0);
  cr_assert_eq(sl_cpus_parse_cpu_max("100000 -100000"), 0);
  cr_assert_eq(sl_cpus_parse_cpu_max("100000 0"), 0);
  cr_assert_eq(sl_cpus_parse_cpu_max("100000 100000x"), 0);
  cr_assert_eq(sl_cpus_parse_cpu_max("100000 99999999999999999999"), 0);
  cr_assert_eq(sl_cpus_parse_cpu_max("150000 100000 7"), 0);
  cr_assert_eq(sl_cpus_parse_cpu_max("+150000 100000"), 0);
  cr_assert_eq(sl_cpus_parse_cpu_max("max"), 0);
  cr_assert_eq(sl_cpus_parse_cpu_max("1 100000\n"), 1);
  /* cgroup v1: quota and period files. */
  cr_assert_eq(sl_cpus_parse_cfs("250000\n", "100000\n"), 3);
  cr_assert_eq(sl_cpus_parse_cfs("-1\n", "100000\n"), 0);
  cr_assert_eq(sl_cpus_parse_cfs("9223372036854775807\n", "1\n"),
               CPU_SETSIZE);
  cr_assert_eq(sl_cpus_parse_cfs("99999999999999999999\n", "100000\n"), 0);
  cr_assert_eq(sl_cpus_parse_cfs("100000\n", "0\n"), 0);
  cr_assert_eq(sl_cpus_parse_cfs("10x\n", "100000\n"), 0);
  cr_assert_eq(sl_cpus_parse_cfs("100000\n", "-5\n"), 0);
}

/* Which mount shows the process's cgroup (cpus.c note 7), from sample
 * mountinfo text. */
static bool cgroup_dir_of(const char *mountinfo, bool v2, const char *path,
                          char *dir, char *point) {
  char *text = strdup(mountinfo);
  cr_assert(text);
  bool found = sl_cpus_cgroup_dir(text, v2, path, dir, point, 256);
  free(text);
  return found;
}

Test(host, cgroup_mount_choice) {
  char dir[256], point[256];
  /* The first cgroup2 mount shows another subtree (/foo is not above
   * /foobar/x); the second shows the root; the third /foobar: the
   * deepest that holds the path wins. */
  const char *three =
      "30 1 0:26 /foo /mnt/foo rw - cgroup2 cgroup2 rw\n"
      "31 1 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n"
      "32 1 0:26 /foobar /mnt/foobar rw shared:9 - cgroup2 cgroup2 rw\n"
      "33 1 0:27 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu,cpuacct\n";
  cr_assert(cgroup_dir_of(three, true, "/foobar/x", dir, point));
  cr_expect_str_eq(dir, "/mnt/foobar/x");
  cr_expect_str_eq(point, "/mnt/foobar");
  cr_assert(cgroup_dir_of(three, true, "/foo", dir, point));
  cr_expect_str_eq(dir, "/mnt/foo");
  cr_assert(cgroup_dir_of(three, true, "/other/y", dir, point));
  cr_expect_str_eq(dir, "/sys/fs/cgroup/other/y");
  cr_expect_str_eq(point, "/sys/fs/cgroup");
  cr_assert(cgroup_dir_of(three, false, "/a", dir, point));
  cr_expect_str_eq(dir, "/sys/fs/cgroup/cpu/a");
  /* Only a mount of another subtree: none shows the process. */
  const char *other = "30 1 0:26 /foo /mnt/foo rw - cgroup2 cgroup2 rw\n";
  cr_expect_not(cgroup_dir_of(other, true, "/foobar", dir, point));
  /* Escapes: a blank (\040) and a backslash (\134) in the mount point. */
  const char *escaped =
      "40 1 0:26 /ctr /mnt/my\\040cgroups\\134x rw - cgroup2 none rw\n";
  cr_assert(cgroup_dir_of(escaped, true, "/ctr/job", dir, point));
  cr_expect_str_eq(dir, "/mnt/my cgroups\\x/job");
  cr_expect_str_eq(point, "/mnt/my cgroups\\x");
  /* No cgroup mounts at all, and a v1 mount without cpu. */
  const char *none = "20 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
                     "21 1 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup "
                     "rw,memory\n";
  cr_expect_not(cgroup_dir_of(none, true, "/", dir, point));
  cr_expect_not(cgroup_dir_of(none, false, "/", dir, point));
}

/* What a child found about its job's CPUs, through a pipe. */
typedef struct cpu_report {
  int status;       /* 0: the job finished with every record */
  int quota;        /* sl_cpus_quota() */
  int usable;       /* job->usable_cpus */
  uint32_t spin;    /* job->spin_iterations */
  int pinned;       /* instances with a CPU */
  int pinned_in;    /* of them, pinned to a CPU of the mask */
  int instances;    /* all instances */
  int outside;      /* probe calls on a thread allowed more than the mask */
  int narrowed;     /* probe calls on a thread allowed one CPU */
  int mask_count;   /* CPUs in the child's mask */
} cpu_report;

/* In a child: run the probe job (parallelism 1: three instances) and fill
 * r.  Never calls Criterion. */
static void child_cpu_report(const char *state_dir, cpu_report *r) {
  static probe p;
  sl_job_config c = sl_fixture_config(state_dir, 20);
  /* A thread per instance: this is about how threads meet the mask and
   * the quota (chained on one CPU, they would be one thread). */
  c.chaining = SL_CHAINING_NEVER;
  CPU_ZERO(&p.mask);
  sched_getaffinity(0, sizeof p.mask, &p.mask);
  r->mask_count = CPU_COUNT(&p.mask);
  r->quota = sl_cpus_quota();
  sl_job *job;
  sl_op *src, *mapped, *sink;
  if (sl_job_create(&c, &job) ||
      sl_source_keyed(job, "src", 1, RECORDS, KEYS, &src) ||
      sl_op_map(job, "probe", src, 1, 64, probe_map, &p, &mapped) ||
      sl_sink_verify(job, "verify", mapped, 1, RECORDS, KEYS, &sink)) {
    r->status = 30;
    return;
  }
  int rc = sl_job_run(job);
  r->status = rc ? 31 : 0;
  r->usable = job->usable_cpus;
  r->spin = job->spin_iterations;
  r->instances = job->instance_count;
  for (int i = 0; i < job->instance_count; i++) {
    int cpu = job->instances[i]->cpu;
    r->pinned += cpu >= 0;
    r->pinned_in += cpu >= 0 && CPU_ISSET(cpu, &p.mask);
  }
  r->outside = atomic_load(&p.outside);
  r->narrowed = atomic_load(&p.narrowed);
  sl_job_destroy(job);
}

/* Forks; the child runs setup(arg) (0: go on), then child_cpu_report;
 * the report comes back through a pipe. */
static cpu_report cpu_child(const char *state_dir, int (*setup)(void *),
                            void *arg) {
  int fds[2];
  cr_assert_eq(pipe(fds), 0);
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    cpu_report r = {0};
    r.status = setup ? setup(arg) : 0;
    if (r.status == 0)
      child_cpu_report(state_dir, &r);
    _exit(write(fds[1], &r, sizeof r) == (ssize_t)sizeof r ? 0 : 40);
  }
  close(fds[1]);
  cpu_report r;
  ssize_t n = read(fds[0], &r, sizeof r);
  close(fds[0]);
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d",
            status);
  cr_assert_eq(n, (ssize_t)sizeof r);
  cr_assert_eq(r.status, 0, "the child's job: status %d", r.status);
  return r;
}

/* The highest CPU of this process's mask, or -1 if it has one CPU only. */
static int highest_cpu_of_several(void) {
  cpu_set_t set;
  CPU_ZERO(&set);
  cr_assert_eq(sched_getaffinity(0, sizeof set, &set), 0);
  if (CPU_COUNT(&set) < 2)
    return -1;
  int highest = -1;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &set))
      highest = c;
  return highest;
}

static int restrict_to_cpu(void *arg) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(*(int *)arg, &one);
  return sched_setaffinity(0, sizeof one, &one) == 0 ? 0 : 21;
}

/* A child restricted to one CPU (not CPU 0) pins every instance to it,
 * every instance thread is allowed only CPUs of the mask, and the job
 * counts one usable CPU (so it spins briefly: three threads share it). */
Test(host, affinity_mask_bounds_every_instance, .timeout = 120) {
  int cpu = highest_cpu_of_several();
  if (cpu < 0)
    cr_skip_test("this machine gives the test one CPU: a mask of one "
                 "cannot differ from it");
  char *dir = sl_test_temp_dir("host-mask");
  cpu_report r = cpu_child(dir, restrict_to_cpu, &cpu);
  cr_assert_eq(r.mask_count, 1);
  cr_assert_eq(r.instances, 3);
  cr_assert_eq(r.pinned, 3);
  cr_assert_eq(r.pinned_in, 3, "an instance pinned outside the mask");
  cr_assert_eq(r.outside, 0, "a thread allowed a CPU outside the mask");
  cr_assert_eq(r.usable, 1);
  cr_assert_eq(r.spin, 20u, "three threads on one CPU spin briefly");
  sl_test_remove_tree(dir);
}

/* A cgroup with a CPU quota, made for one test and removed after it. */
typedef struct test_cgroup {
  char dir[512];
  bool v2;
  char why[1024]; /* when none could be made: the reason */
} test_cgroup;

/* value into dir/file; 0 or errno. */
static int write_text(const char *dir, const char *file, const char *value) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return errno;
  ssize_t n = write(fd, value, strlen(value));
  int rc = n == (ssize_t)strlen(value) ? 0 : errno ? errno : EIO;
  close(fd);
  return rc;
}

/* Whether file in dir holds word (space-separated). */
static bool file_has_word(const char *dir, const char *file, const char *word) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  char *text = sl_test_read_file(path, NULL);
  if (!text)
    return false;
  bool found = false;
  for (char *save = NULL, *w = strtok_r(text, " \n", &save); w && !found;
       w = strtok_r(NULL, " \n", &save))
    found = strcmp(w, word) == 0;
  free(text);
  return found;
}

/* A new cgroup below the root of the v2 hierarchy (where cpu is
 * available to children) or else of the v1 cpu hierarchy, as this host
 * mounts them; false with the reason in g->why. */
static bool cgroup_make(test_cgroup *g) {
  const char *v2_roots[] = {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"};
  for (int i = 0; i < 2; i++)
    if (file_has_word(v2_roots[i], "cgroup.controllers", "cpu")) {
      write_text(v2_roots[i], "cgroup.subtree_control", "+cpu");
      snprintf(g->dir, sizeof g->dir, "%s/sluice-test-%d", v2_roots[i],
               (int)getpid());
      g->v2 = true;
      if (mkdir(g->dir, 0755) == 0 && access(g->dir, F_OK) == 0) {
        char probe_path[600];
        snprintf(probe_path, sizeof probe_path, "%s/cpu.max", g->dir);
        if (access(probe_path, W_OK) == 0)
          return true;
        rmdir(g->dir);
      }
    }
  const char *v1_roots[] = {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"};
  for (int i = 0; i < 2; i++) {
    snprintf(g->dir, sizeof g->dir, "%s/sluice-test-%d", v1_roots[i],
             (int)getpid());
    g->v2 = false;
    if (mkdir(g->dir, 0755) == 0)
      return true;
    snprintf(g->why, sizeof g->why, "cannot create %s: %s", g->dir,
             strerror(errno));
  }
  if (!g->why[0])
    snprintf(g->why, sizeof g->why, "no cgroup hierarchy with the cpu "
             "controller is mounted");
  return false;
}

/* Sets the quota to quota_us per 100 ms. */
static void cgroup_set_quota(const test_cgroup *g, long quota_us) {
  char value[64];
  if (g->v2) {
    snprintf(value, sizeof value, "%ld 100000", quota_us);
    cr_assert_eq(write_text(g->dir, "cpu.max", value), 0);
  } else {
    cr_assert_eq(write_text(g->dir, "cpu.cfs_period_us", "100000"), 0);
    snprintf(value, sizeof value, "%ld", quota_us);
    cr_assert_eq(write_text(g->dir, "cpu.cfs_quota_us", value), 0);
  }
}

static int join_cgroup(void *arg) {
  const test_cgroup *g = arg;
  char pid[32];
  snprintf(pid, sizeof pid, "%d", (int)getpid());
  return write_text(g->dir, "cgroup.procs", pid) == 0 ? 0 : 22;
}

/* A child in a real cgroup with a quota of one CPU (on a machine that
 * gives it at least two): one usable CPU, so the job spins briefly and
 * does not pin (notes in engine/graph.c, assign_cpus); every thread
 * stays inside the mask.  A quota of 1.5 CPUs counts as two. */
Test(host, cgroup_quota_caps_usable_cpus, .timeout = 180) {
  if (highest_cpu_of_several() < 0)
    cr_skip_test("this machine gives the test one CPU: a one-CPU quota "
                 "cannot be told from the mask");
  test_cgroup g = {0};
  if (!cgroup_make(&g))
    cr_skip_test("no cgroup for the quota: %s", g.why);
  char *dir = sl_test_temp_dir("host-quota");
  char *state = sl_test_path_in(dir, "one");
  cgroup_set_quota(&g, 100000);
  cpu_report one = cpu_child(state, join_cgroup, &g);
  free(state);
  state = sl_test_path_in(dir, "half");
  cgroup_set_quota(&g, 150000);
  cpu_report half = cpu_child(state, join_cgroup, &g);
  free(state);
  cr_assert_eq(rmdir(g.dir), 0, "rmdir %s: %s", g.dir, strerror(errno));
  cr_log_info("cgroup %s (%s): quota 1 -> usable %d spin %u pinned %d; "
              "quota 1.5 -> usable %d spin %u pinned %d",
              g.dir, g.v2 ? "v2" : "v1", one.usable, one.spin, one.pinned,
              half.usable, half.spin, half.pinned);
  cr_assert_eq(one.quota, 1);
  cr_assert_eq(one.usable, 1);
  cr_assert_eq(one.spin, 20u);
  cr_assert_eq(one.pinned, 0, "a quota below the mask: not pinned");
  cr_assert_eq(one.outside, 0);
  cr_assert_eq(half.quota, 2);
  cr_assert_eq(half.usable, half.mask_count < 2 ? half.mask_count : 2);
  cr_assert_eq(half.outside, 0);
  sl_test_remove_tree(dir);
}

/* ------------------------------------------------------------ Prometheus */

/* The text of a finished probe job named name (NULL: default). */
static char *finished_job_text(const char *name, sl_job **job_out,
                               char **dir_out) {
  char *dir = sl_test_temp_dir("host-prom");
  static probe p;
  sl_job *job = probe_job(dir, NULL, name, &p, 2);
  cr_assert_eq(sl_job_run(job), 0, "%s", sl_job_error(job));
  size_t needed = 0;
  char small[16];
  cr_assert_eq(sl_metrics_prometheus(job, small, sizeof small, &needed),
               ENOSPC);
  cr_assert_gt(needed, sizeof small);
  size_t asked = 0;
  cr_assert_eq(sl_metrics_prometheus(job, NULL, 0, &asked), ENOSPC);
  cr_assert_eq(asked, needed, "a finished job's text does not change");
  char *text = malloc(needed);
  cr_assert(text);
  size_t again = 0;
  cr_assert_eq(sl_metrics_prometheus(job, text, needed, &again), 0);
  cr_assert_eq(again, needed);
  cr_assert_eq(strlen(text) + 1, needed);
  *job_out = job;
  *dir_out = dir;
  return text;
}

/* Every sample line's labels start with label (e.g. job="x"). */
static int samples_with_label(char *text, const char *label) {
  int samples = 0;
  for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
       line = strtok_r(NULL, "\n", &save)) {
    if (line[0] == '#')
      continue;
    char *brace = strchr(line, '{');
    cr_assert(brace, "a sample without labels: %s", line);
    cr_assert_eq(strncmp(brace + 1, label, strlen(label)), 0,
                 "not labelled %s: %s", label, line);
    samples++;
  }
  return samples;
}

Test(host, prometheus_text_carries_the_job_label, .timeout = 120) {
  sl_job *job;
  char *dir;
  /* A name with each character the format escapes. */
  char *text = finished_job_text("clicks \"eu\\west\"\nv2", &job, &dir);
  cr_assert(strstr(text, "# TYPE sluice_instance_records_in_total counter\n"));
  cr_assert(strstr(text, "sluice_instance_records_in_total{job=\"clicks "
                         "\\\"eu\\\\west\\\"\\nv2\",operator=\"probe\","
                         "instance=\"1\"} "),
            "%s", text);
  cr_assert(strstr(text, "sluice_job_info{job=\"clicks \\\"eu\\\\west\\\"\\nv2"
                         "\",state=\"FINISHED\"} 1\n"),
            "%s", text);
  int samples = samples_with_label(text, "job=\"clicks \\\"eu\\\\west\\\"\\nv2\"");
  cr_assert_gt(samples, 20);
  free(text);
  sl_job_destroy(job);
  sl_test_remove_tree(dir);
  text = finished_job_text(NULL, &job, &dir);
  cr_assert_gt(samples_with_label(text, "job=\"sluice\""), 20);
  free(text);
  sl_job_destroy(job);
  sl_test_remove_tree(dir);
}

Test(host, job_name_bounds_and_older_callers) {
  sl_job_config c = SL_JOB_CONFIG_INIT;
  sl_job *job = NULL;
  c.name = "";
  cr_assert_eq(sl_job_create(&c, &job), EINVAL);
  char longest[SL_MAX_NAME + 1];
  memset(longest, 'n', sizeof longest);
  longest[SL_MAX_NAME] = 0;
  c.name = longest; /* SL_MAX_NAME bytes: one too many */
  cr_assert_eq(sl_job_create(&c, &job), EINVAL);
  cr_assert_null(job);
  longest[SL_MAX_NAME - 1] = 0;
  cr_assert_eq(sl_job_create(&c, &job), 0);
  longest[0] = 'X'; /* copied: the caller's buffer may change */
  cr_assert_eq(job->name[0], 'n');
  cr_assert_eq(strlen(job->name), SL_MAX_NAME - 1u);
  sl_job_destroy(job);
  /* A program built before the field: its struct ends before name, and
   * whatever follows in its memory is not read. */
  struct {
    sl_job_config config;
    char junk[8];
  } old;
  memset(&old, 0xff, sizeof old);
  memset(&old.config, 0, offsetof(sl_job_config, name));
  old.config.struct_bytes = offsetof(sl_job_config, name);
  cr_assert_eq(sl_job_create(&old.config, &job), 0);
  cr_assert_str_eq(job->name, "sluice");
  sl_job_destroy(job);
}

/* The name is a Prometheus label value, which must be UTF-8: a name that
 * is not is refused at sl_job_create, with a line naming the field. */
Test(host, job_name_must_be_utf8) {
  static captured c = {.lock = PTHREAD_MUTEX_INITIALIZER};
  sl_log_set_handler(capture_handler, &c);
  sl_job_config config = SL_JOB_CONFIG_INIT;
  sl_job *job = NULL;
  const char *refused[] = {
      "caf\xe9",         /* Latin-1, not UTF-8 */
      "a\xc3",           /* a sequence cut short */
      "\xc0\xaf" "etc", /* overlong "/" */
      "x\xed\xa0\x80", /* a surrogate */
      "\xff",
  };
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    config.name = refused[i];
    cr_expect_eq(sl_job_create(&config, &job), EINVAL, "name %zu", i);
    cr_expect_null(job);
  }
  sl_log_set_handler(NULL, NULL);
  cr_expect(strstr(c.text, "0 sl_job_create: sl_job_config.name is not "
                           "valid UTF-8: "),
            "%s", c.text);
  cr_expect_eq(c.lines[SL_LOG_ERROR], 5, "%s", c.text);
  config.name = "z\xc3\xa4hler-\xe2\x82\xac-\xf0\x9f\x98\x80"; /* UTF-8 */
  cr_assert_eq(sl_job_create(&config, &job), 0);
  cr_expect_str_eq(job->name, config.name);
  sl_job_destroy(job);
}

/* ------------------------------------------------------------ HTTP */

#if SL_TEST_HTTP
/* GET path from 127.0.0.1:port; the body (malloc'd). */
static char *http_get_body(int port, const char *path) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  cr_assert(fd >= 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  char request[256];
  int n = snprintf(request, sizeof request,
                   "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                   "Connection: close\r\n\r\n", path, port);
  cr_assert_eq(write(fd, request, (size_t)n), n);
  char *response = read_all(fd);
  close(fd);
  cr_assert_eq(strncmp(response, "HTTP/1.1 200", 12), 0, "%s", response);
  char *body = strstr(response, "\r\n\r\n");
  cr_assert(body);
  char *copy = strdup(body + 4);
  free(response);
  return copy;
}

/* GET /metrics serves exactly what sl_metrics_prometheus renders. */
Test(host, endpoint_serves_the_same_text, .timeout = 120) {
  sl_job *job;
  char *dir;
  char *text = finished_job_text("served", &job, &dir);
  sl_http *http = NULL;
  cr_assert_eq(sl_http_start(job, "127.0.0.1", 0, &http), 0);
  char *body = http_get_body(sl_http_port(http), "/metrics");
  sl_http_stop(http);
  cr_assert_str_eq(body, text);
  free(body);
  free(text);
  sl_job_destroy(job);
  sl_test_remove_tree(dir);
}
#else
/* A build without the endpoint answers with ENOTSUP and says why, and
 * the Prometheus text still renders. */
Test(host, no_endpoint_in_this_build, .timeout = 120) {
  sl_job *job;
  char *dir;
  char *text = finished_job_text("plain", &job, &dir);
  free(text);
  sl_job_destroy(job);
  sl_test_remove_tree(dir);
  cr_assert_eq(sl_job_create(NULL, &job), 0);
  sl_http *http = (sl_http *)1;
  cr_assert_eq(sl_http_start(job, "127.0.0.1", 0, &http), ENOTSUP);
  cr_assert_null(http);
  cr_assert(strstr(sl_job_error(job), "built without the HTTP endpoint"),
            "%s", sl_job_error(job));
  sl_job_destroy(job);
}
#endif
