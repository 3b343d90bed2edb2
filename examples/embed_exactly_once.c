/* embed_exactly_once.c — a service that embeds sluice and gets every result
 * exactly once, through crashes, stops and resumes.  It is the code of the
 * README's "Embed sluice in a service" guide.
 *
 *   embed_exactly_once --state-dir DIR --output FILE --events N [--resume]
 *                      [--stop-after K]
 *
 * The application's own thread pushes events i = 0 .. N-1, each with
 * position i (its offset in the application's log) and event time
 * 1700000000000 + i ms, for the user "user-U" with
 * U = ((uint32_t)(i * 2654435761)) >> 22.  The job counts events per user in
 * one-second tumbling event-time windows, keyed by the user's name (a byte
 * string), and hands the results back through the exactly-once delivery
 * sink.  The application appends them to FILE as `user,window_start_ms,count`.
 *
 * --resume   asks the job where to push from (sl_push_resume_position) and
 *            pushes from there, after a crash or a stop.
 * --stop-after K  pushes up to position K-1, then stops the job with a
 *            savepoint without draining (its windows stay open) and exits;
 *            a later --resume run continues as if it had never stopped.
 *
 * When all N events are in and the job has finished, FILE is checked against
 * the closed form and the program prints `verdict: EXACTLY-ONCE ...` (exit
 * 0) or `verdict: VIOLATED ...` (exit 1).  Killed with SIGKILL at any moment
 * and rerun with --resume until it finishes, FILE holds every window once.
 *
 * Delivery is idempotent per checkpoint id: next to FILE, FILE.delivered
 * holds one line "ID OFFSET" per delivered checkpoint, written after FILE
 * was made durable up to OFFSET.  A delivery of an id already listed is
 * acknowledged and skipped; any other first cuts FILE back to the last
 * listed OFFSET (a crash may have left half of a batch there).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sluice.h>

#define BASE_MS INT64_C(1700000000000)
#define WINDOW_MS 1000
#define USERS 1024 /* U = 32-bit hash >> 22: 0 .. 1023 */

static uint32_t user_of(uint64_t i) {
  return (uint32_t)((uint32_t)(i * UINT64_C(2654435761)) >> 22);
}

/* One event as pushed: the user's name; the time is the record's stamp. */
typedef struct event {
  char user[16]; /* "user-U", NUL-padded */
} event;

/* ---- the job's callbacks ---- */

static int user_key(void *u, const sl_record *in, const void **key,
                    uint32_t *key_bytes) {
  (void)u;
  const event *e = in->data;
  *key = e->user;
  *key_bytes = (uint32_t)strnlen(e->user, sizeof e->user);
  return 0;
}

static void count_init(void *u, void *acc) {
  (void)u;
  memset(acc, 0, sizeof(uint64_t));
}

static void count_add(void *u, void *acc, const sl_record *in) {
  (void)u;
  (void)in;
  uint64_t n;
  memcpy(&n, acc, sizeof n);
  n++;
  memcpy(acc, &n, sizeof n);
}

/* A window's result is its output line, ready to append. */
static int count_emit(void *u, sl_ctx *ctx, uint64_t hash,
                      const sl_window *w, const void *acc) {
  (void)u;
  (void)hash;
  const void *key;
  uint32_t key_bytes;
  int rc = sl_ctx_key_bytes(ctx, &key, &key_bytes);
  if (rc)
    return rc;
  uint64_t n;
  memcpy(&n, acc, sizeof n);
  char line[96];
  int len = snprintf(line, sizeof line, "%.*s,%" PRId64 ",%" PRIu64 "\n",
                     (int)key_bytes, (const char *)key, w->start, n);
  if (len < 0 || (size_t)len >= sizeof line)
    return SL_ETOOBIG;
  return sl_emit(ctx, line, (uint32_t)len);
}

/* ---- idempotent delivery into FILE ---- */

typedef struct output {
  int fd, ledger_fd;
  uint64_t last_id; /* newest checkpoint whose results are in FILE */
  off_t end;        /* FILE's durable length after last_id */
  bool any;         /* a checkpoint was delivered */
} output;

/* Read FILE.delivered (open as o->ledger_fd): its last well-formed line is
 * the durable state.  A crash (a power cut, not only SIGKILL) can leave a
 * torn or zero-filled tail after it; that tail is cut off and the cut made
 * durable, so the next line appended starts clean.  A bad line with good
 * ones after it is damage, not a torn tail: refused. */
static int ledger_load(output *o, const char *path) {
  FILE *f = fdopen(dup(o->ledger_fd), "r");
  if (!f)
    return errno;
  char line[64];
  off_t good_end = 0, at = 0;
  bool bad = false;
  while (fgets(line, sizeof line, f)) {
    size_t len = strlen(line);
    uint64_t id;
    long long end;
    char extra;
    bool ok = len && line[len - 1] == '\n' &&
              sscanf(line, "%" SCNu64 " %lld%c", &id, &end, &extra) == 3 &&
              extra == '\n' && end >= 0;
    at += (off_t)len;
    if (!ok) {
      bad = true;
      continue;
    }
    if (bad) {
      fclose(f);
      fprintf(stderr, "%s: a damaged line before byte %lld\n", path,
              (long long)at);
      return EINVAL;
    }
    o->last_id = id;
    o->end = (off_t)end;
    o->any = true;
    good_end = at;
  }
  fclose(f);
  if (bad && (ftruncate(o->ledger_fd, good_end) != 0 ||
              fdatasync(o->ledger_fd) != 0))
    return errno;
  return 0;
}

/* fsync the directory holding path, so files just created stay. */
static int sync_dir_of(const char *path) {
  char dir[4096];
  const char *slash = strrchr(path, '/');
  int len = slash ? (int)(slash - path) : 1;
  if (snprintf(dir, sizeof dir, "%.*s", len, slash ? path : ".") >=
      (int)sizeof dir)
    return ENAMETOOLONG;
  if (dir[0] == 0)
    strcpy(dir, "/");
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0)
    return errno;
  int rc = fsync(fd) == 0 ? 0 : errno;
  close(fd);
  return rc;
}

static int write_all(int fd, const void *data, size_t bytes, off_t at) {
  const char *p = data;
  while (bytes) {
    ssize_t n = pwrite(fd, p, bytes, at);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return errno;
    p += n;
    bytes -= (size_t)n;
    at += n;
  }
  return 0;
}

/* The exactly-once sink's delivery: called after checkpoint id is durable,
 * maybe again after a crash. */
static int deliver(void *user, int instance, uint64_t id,
                   const sl_record *records, uint32_t count) {
  (void)instance; /* one sink instance */
  output *o = user;
  if (o->any && id <= o->last_id)
    return 0; /* already in FILE: acknowledge again */
  if (ftruncate(o->fd, o->end) != 0)
    return errno;
  off_t at = o->end;
  for (uint32_t k = 0; k < count; k++) {
    int rc = write_all(o->fd, records[k].data, records[k].size_bytes, at);
    if (rc)
      return rc;
    at += records[k].size_bytes;
  }
  if (fdatasync(o->fd) != 0)
    return errno;
  char line[64];
  int len = snprintf(line, sizeof line, "%" PRIu64 " %lld\n", id,
                     (long long)at);
  off_t ledger_end = lseek(o->ledger_fd, 0, SEEK_END);
  if (ledger_end < 0)
    return errno;
  int rc = write_all(o->ledger_fd, line, (size_t)len, ledger_end);
  if (rc)
    return rc;
  if (fdatasync(o->ledger_fd) != 0)
    return errno;
  o->last_id = id;
  o->end = at;
  o->any = true;
  return 0;
}

static int output_open(output *o, const char *path, bool resume) {
  char ledger[4096];
  if (snprintf(ledger, sizeof ledger, "%s.delivered", path) >=
      (int)sizeof ledger)
    return ENAMETOOLONG;
  int flags = O_RDWR | O_CREAT | (resume ? 0 : O_TRUNC);
  *o = (output){.fd = -1, .ledger_fd = -1};
  o->fd = open(path, flags, 0644);
  o->ledger_fd = open(ledger, flags, 0644);
  if (o->fd < 0 || o->ledger_fd < 0)
    return errno;
  int rc = sync_dir_of(path);
  if (rc || !resume)
    return rc;
  rc = ledger_load(o, ledger);
  /* Bytes past the ledger's end were never acknowledged: their checkpoint
   * is delivered again, so they go now. */
  if (rc == 0 && ftruncate(o->fd, o->end) != 0)
    rc = errno;
  return rc;
}

/* ---- the check ---- */

/* expected[w * USERS + u]: events of user u in window w. */
static int verdict(const char *path, uint64_t events) {
  uint64_t windows = (events + WINDOW_MS - 1) / WINDOW_MS;
  uint32_t *expected = calloc(windows * USERS, sizeof *expected);
  uint32_t *seen = calloc(windows * USERS, sizeof *seen);
  if (!expected || !seen) {
    free(expected);
    free(seen);
    fprintf(stderr, "verdict: out of memory\n");
    return 1;
  }
  uint64_t cells = 0;
  for (uint64_t i = 0; i < events; i++)
    if (expected[(i / WINDOW_MS) * USERS + user_of(i)]++ == 0)
      cells++;
  FILE *f = fopen(path, "r");
  uint64_t lines = 0, wrong = 0, duplicated = 0, foreign = 0, missing = 0;
  char line[128];
  while (f && fgets(line, sizeof line, f)) {
    unsigned u;
    int64_t start;
    uint64_t n;
    lines++;
    if (sscanf(line, "user-%u,%" SCNd64 ",%" SCNu64, &u, &start, &n) != 3 ||
        u >= USERS || start < BASE_MS || (start - BASE_MS) % WINDOW_MS ||
        (uint64_t)(start - BASE_MS) / WINDOW_MS >= windows) {
      foreign++;
      continue;
    }
    uint64_t cell = (uint64_t)(start - BASE_MS) / WINDOW_MS * USERS + u;
    if (seen[cell]++)
      duplicated++;
    else if (expected[cell] != n)
      wrong++;
  }
  if (f)
    fclose(f);
  for (uint64_t c = 0; c < windows * USERS; c++)
    if (expected[c] && !seen[c])
      missing++;
    else if (!expected[c] && seen[c])
      foreign++;
  free(expected);
  free(seen);
  bool ok = !missing && !duplicated && !wrong && !foreign;
  printf("verdict: %s events=%" PRIu64 " results=%" PRIu64 " lines=%" PRIu64
         " missing=%" PRIu64 " duplicated=%" PRIu64 " wrong=%" PRIu64
         " foreign=%" PRIu64 "\n",
         ok ? "EXACTLY-ONCE" : "VIOLATED", events, cells, lines, missing,
         duplicated, wrong, foreign);
  return ok ? 0 : 1;
}

/* ---- the service ---- */

typedef struct options {
  const char *state_dir, *output;
  uint64_t events, stop_after;
  bool resume;
} options;

static int usage(const char *why) {
  fprintf(stderr,
          "embed_exactly_once: %s\n"
          "usage: embed_exactly_once --state-dir DIR --output FILE "
          "--events N [--resume] [--stop-after K]\n",
          why);
  return 2;
}

static int parse_count(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *end || s[0] == '-')
    return EINVAL;
  *out = v;
  return 0;
}

static int parse(int argc, char **argv, options *o) {
  *o = (options){.stop_after = UINT64_MAX};
  bool have_events = false;
  for (int a = 1; a < argc; a++) {
    const char *arg = argv[a], *val = a + 1 < argc ? argv[a + 1] : NULL;
    if (strcmp(arg, "--resume") == 0) {
      o->resume = true;
      continue;
    }
    if (!val)
      return usage("a flag without its value, or an unknown flag");
    if (strcmp(arg, "--state-dir") == 0)
      o->state_dir = val;
    else if (strcmp(arg, "--output") == 0)
      o->output = val;
    else if (strcmp(arg, "--events") == 0) {
      if (parse_count(val, &o->events))
        return usage("--events wants a count");
      have_events = true;
    } else if (strcmp(arg, "--stop-after") == 0) {
      if (parse_count(val, &o->stop_after))
        return usage("--stop-after wants a count");
    } else
      return usage("unknown flag");
    a++;
  }
  if (!o->state_dir || !o->output || !have_events)
    return usage("--state-dir, --output and --events are required");
  return 0;
}

static int build(sl_job *job, output *out, sl_push **push) {
  sl_op *src, *keyed, *counts, *sink;
  sl_window_config w = {.type = SL_WINDOW_TUMBLING,
                        .size = WINDOW_MS,
                        .acc_bytes = sizeof(uint64_t),
                        .init = count_init,
                        .add = count_add,
                        .emit = count_emit};
  sl_watermark_config wm = {.out_of_orderness = 0, .every_call = 1};
  int rc;
  if ((rc = sl_source_push(job, "events", 0, &src, push)) ||
      (rc = sl_op_watermarks(src, &wm)) ||
      (rc = sl_op_key_by_bytes(job, "by-user", src, user_key, NULL,
                               &keyed)) ||
      (rc = sl_op_window(job, "per-user-second", keyed, 2, &w, &counts)) ||
      (rc = sl_sink_exactly_once(job, "deliver", counts, 1, deliver, out,
                                 &sink)))
    return rc;
  return 0;
}

/* Push events from..to-1 with their positions. */
static int push_events(sl_push *push, uint64_t from, uint64_t to) {
  for (uint64_t i = from; i < to; i++) {
    event e = {{0}};
    snprintf(e.user, sizeof e.user, "user-%u", user_of(i));
    int rc = sl_push_record_at(push, i, &e, sizeof e, BASE_MS + (int64_t)i);
    if (rc)
      return rc;
  }
  return 0;
}

static int fail(sl_job *job, const char *what, int rc) {
  fprintf(stderr, "embed_exactly_once: %s: %s: %s\n", what, sl_strerror(rc),
          job ? sl_job_error(job) : "");
  if (job) {
    sl_job_stop(job);
    sl_job_wait(job);
    sl_job_destroy(job);
  }
  return 1;
}

static int run(const options *o, output *out) {
  sl_job_config cfg = SL_JOB_CONFIG_INIT;
  cfg.checkpoint.state_dir = o->state_dir;
  cfg.checkpoint.interval_ms = 50;
  cfg.checkpoint.store_policy = o->resume ? SL_STORE_RESUME : SL_STORE_FRESH;
  sl_job *job = NULL;
  sl_push *push = NULL;
  int rc = sl_job_create(&cfg, &job);
  if (rc)
    return fail(NULL, "sl_job_create", rc);
  if ((rc = build(job, out, &push)))
    return fail(job, "building the job", rc);
  if ((rc = sl_job_start(job)))
    return fail(job, "sl_job_start", rc);
  uint64_t from = 0;
  if ((rc = sl_push_resume_position(push, &from)))
    return fail(job, "sl_push_resume_position", rc);
  bool stop = o->stop_after < o->events;
  uint64_t to = stop ? o->stop_after : o->events;
  if (from < to && (rc = push_events(push, from, to)))
    return fail(job, "pushing", rc);
  if (stop) {
    uint64_t id = 0;
    char err[256] = "";
    rc = sl_job_stop_with_savepoint(job, NULL, 0, &id, err, sizeof err);
    if (rc)
      return fail(job, err[0] ? err : "stopping", rc);
    printf("stopped at checkpoint %" PRIu64 " after position %" PRIu64
           "; resume with --resume\n",
           id, to - 1);
  } else {
    sl_push_close(push);
  }
  if ((rc = sl_job_wait(job)))
    return fail(job, "the job", rc);
  sl_job_destroy(job);
  return stop ? 0 : -1; /* -1: finished, check the output */
}

int main(int argc, char **argv) {
  options o;
  int rc = parse(argc, argv, &o);
  if (rc)
    return rc;
  output out;
  if ((rc = output_open(&out, o.output, o.resume))) {
    fprintf(stderr, "embed_exactly_once: %s: %s\n", o.output, strerror(rc));
    return 1;
  }
  rc = run(&o, &out);
  close(out.fd);
  close(out.ledger_fd);
  if (rc >= 0)
    return rc;
  return verdict(o.output, o.events);
}
