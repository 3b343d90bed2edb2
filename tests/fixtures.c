/* fixtures.c — the shared pieces of test jobs declared in fixtures.h: one
 * definition of each, linked into every test executable. */
#include "fixtures.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sluice_testing.h" /* sl_source_keyed, sl_sink_verify */

uint64_t sl_fixture_tuple_key(void *user, const sl_record *in) {
  (void)user;
  uint64_t key;
  memcpy(&key, in->data, sizeof key);
  return key;
}

int sl_fixture_state_add(sl_ctx *ctx, uint64_t delta, uint64_t *total) {
  const void *value;
  uint32_t bytes;
  uint64_t sum = 0;
  int rc = sl_state_get(ctx, 0, &value, &bytes);
  if (rc == 0)
    memcpy(&sum, value, sizeof sum);
  else if (rc != SL_ENOTFOUND)
    return rc;
  sum += delta;
  rc = sl_state_put(ctx, 0, &sum, sizeof sum, 0);
  if (rc)
    return rc;
  *total = sum;
  return 0;
}

int sl_fixture_count_process(sl_ctx *ctx, void *state, int input,
                             const sl_record *in) {
  (void)state;
  (void)input;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  uint64_t count;
  int rc = sl_fixture_state_add(ctx, 1, &count);
  if (rc)
    return rc;
  sl_tuple out = {.key = t.key, .value = count};
  return sl_emit(ctx, &out, sizeof out);
}

int sl_fixture_count_with_record(sl_ctx *ctx, void *state, int input,
                                 const sl_record *in) {
  (void)state;
  (void)input;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  uint64_t n;
  int rc = sl_fixture_state_add(ctx, 1, &n);
  if (rc)
    return rc;
  sl_fixture_counted out = {t.key, t.value, n};
  return sl_emit(ctx, &out, sizeof out);
}

int sl_fixture_format_counted(void *user, const sl_record *in, char *buffer,
                              uint32_t buffer_bytes) {
  (void)user;
  sl_fixture_counted c;
  memcpy(&c, in->data, sizeof c);
  int n = snprintf(buffer, buffer_bytes, "%" PRIu64 ",%" PRIu64 ",%" PRIu64,
                   c.key, c.value, c.count);
  return (uint32_t)n < buffer_bytes ? n : n + 1; /* as format_tuple */
}

/* ------------------------------------------------------------ sources */

typedef struct gated_instance {
  const sl_fixture_gated_source *src;
  uint64_t first, step, owned, emitted;
  bool completed; /* a checkpoint completed since this attempt began */
} gated_instance;

static int gated_open(sl_ctx *ctx, void *user, void **state) {
  gated_instance *s = calloc(1, sizeof *s);
  if (!s)
    return ENOMEM;
  s->src = user;
  s->first = s->src->parts ? s->src->part : (uint64_t)sl_ctx_instance(ctx);
  s->step = s->src->parts ? s->src->parts : (uint64_t)sl_ctx_parallelism(ctx);
  s->owned = s->src->keys > s->first
                 ? (s->src->keys - s->first + s->step - 1) / s->step
                 : 0;
  *state = s;
  return 0;
}

static int gated_next(sl_ctx *ctx, void *state) {
  gated_instance *s = state;
  for (int n = 0; n < 256; n++) {
    if (s->src->gate && !s->completed && s->emitted >= s->src->gate) {
      struct timespec pause = {0, 200000}; /* until a checkpoint completes */
      nanosleep(&pause, 0);
      return 0;
    }
    uint64_t j = s->emitted;
    uint64_t i = s->owned ? j / s->owned * s->src->keys + s->first +
                                j % s->owned * s->step
                          : UINT64_MAX;
    if (i >= s->src->count)
      return SL_SOURCE_END;
    sl_tuple t = {.key = i % s->src->keys, .value = i};
    int rc = sl_emit(ctx, &t, sizeof t);
    if (rc)
      return rc;
    s->emitted++;
  }
  return 0;
}

static int gated_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  return sl_fixture_save_position(ctx, &((gated_instance *)state)->emitted);
}

static int gated_restore(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  return sl_fixture_load_position(ctx, &((gated_instance *)state)->emitted);
}

static void gated_complete(sl_ctx *ctx, void *state, uint64_t id) {
  (void)ctx;
  (void)id;
  ((gated_instance *)state)->completed = true;
}

static void gated_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  free(state);
}

const sl_source_ops sl_fixture_gated_ops = {.open = gated_open,
                                            .next = gated_next,
                                            .close = gated_close,
                                            .snapshot = gated_snapshot,
                                            .restore = gated_restore,
                                            .checkpoint_complete =
                                                gated_complete};

int sl_fixture_format_tuple(void *user, const sl_record *in, char *buffer,
                            uint32_t buffer_bytes) {
  (void)user;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  int n = snprintf(buffer, buffer_bytes, "%" PRIu64 ",%" PRIu64, t.key,
                   t.value);
  /* snprintf wants room for its NUL, the sink does not: a line of exactly
   * buffer_bytes came out cut, so ask for one more. */
  return (uint32_t)n < buffer_bytes ? n : n + 1;
}

int sl_fixture_save_position(sl_ctx *ctx, const uint64_t *position) {
  return sl_operator_state_set(ctx, position, sizeof *position);
}

int sl_fixture_load_position(sl_ctx *ctx, uint64_t *position) {
  const void *data;
  uint32_t bytes;
  int rc = sl_operator_state_get(ctx, &data, &bytes);
  if (rc == SL_ENOTFOUND)
    return 0;
  if (rc || bytes != sizeof *position)
    return -EINVAL; /* negative: fails the job under either sign rule */
  memcpy(position, data, sizeof *position);
  return 0;
}

/* ------------------------------------------------------------ config */

sl_job_config sl_fixture_config(const char *state_dir, uint32_t interval_ms) {
  sl_job_config config = SL_JOB_CONFIG_INIT;
  config.checkpoint.state_dir = state_dir;
  config.checkpoint.interval_ms = interval_ms;
  config.checkpoint.no_sync = 1;
  config.ring_bytes = 64 * 1024;
  return config;
}

int sl_fixture_verified_job(const char *state_dir, int source_p, int sink_p,
                            uint64_t count, uint64_t keys, sl_job **job,
                            sl_op **sink) {
  sl_job_config config = SL_JOB_CONFIG_INIT;
  config.checkpoint.state_dir = state_dir;
  config.checkpoint.interval_ms = 5;
  config.checkpoint.no_sync = 1;
  config.checkpoint.store_policy = SL_STORE_RESUME;
  sl_job *built = 0;
  int rc = sl_job_create(&config, &built);
  if (rc)
    return rc;
  sl_op *src = 0, *verify = 0;
  rc = sl_source_keyed(built, "src", source_p, count, keys, &src);
  if (rc == 0)
    rc = sl_sink_verify(built, "verify", src, sink_p, count, keys, &verify);
  if (rc) {
    sl_job_destroy(built); /* frees the operators added so far */
    return rc;
  }
  *job = built;
  *sink = verify;
  return 0;
}

/* ------------------------------------------------------------ collector */

int sl_fixture_collector_open(sl_ctx *ctx, void *user, void **state) {
  sl_fixture_collector *c = user;
  int instance = sl_ctx_instance(ctx);
  if (instance < 0 || instance >= SL_FIXTURE_COLLECTOR_INSTANCES)
    return -EINVAL;
  sl_fixture_collected *mine = &c->per[instance];
  mine->record_bytes = c->record_bytes;
  mine->count = 0; /* a restore brings back what was committed */
  *state = mine;
  return 0;
}

int sl_fixture_collector_process(sl_ctx *ctx, void *state, int input,
                                 const sl_record *in) {
  (void)input;
  sl_fixture_collected *mine = state;
  if (in->size_bytes != mine->record_bytes) {
    sl_ctx_fail(ctx, "sink got %" PRIu32 " bytes, expected %" PRIu32,
                in->size_bytes, mine->record_bytes);
    return -EINVAL;
  }
  if (mine->count == mine->capacity) {
    uint64_t capacity = mine->capacity ? mine->capacity * 2 : 1024;
    void *items = realloc(mine->items, mine->record_bytes * capacity);
    if (!items)
      return -ENOMEM;
    mine->items = items;
    mine->capacity = capacity;
  }
  memcpy((char *)mine->items + mine->count * mine->record_bytes, in->data,
         mine->record_bytes);
  mine->count++;
  return 0;
}

void *sl_fixture_collector_last(void *state) {
  sl_fixture_collected *mine = state;
  assert(mine->count > 0);
  return (char *)mine->items + (mine->count - 1) * mine->record_bytes;
}

int sl_fixture_collector_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  return sl_fixture_save_position(ctx, &((sl_fixture_collected *)state)->count);
}

int sl_fixture_collector_restore(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  return sl_fixture_load_position(ctx, &((sl_fixture_collected *)state)->count);
}

const sl_process_ops sl_fixture_collector_ops = {
    .open = sl_fixture_collector_open,
    .process = sl_fixture_collector_process,
    .snapshot = sl_fixture_collector_snapshot,
    .restore = sl_fixture_collector_restore};

void *sl_fixture_collector_gather(sl_fixture_collector *c,
                                  int (*compare)(const void *, const void *),
                                  uint64_t *count) {
  uint64_t total = 0;
  for (int i = 0; i < SL_FIXTURE_COLLECTOR_INSTANCES; i++)
    total += c->per[i].count;
  size_t bytes = c->record_bytes;
  char *all = malloc(bytes * (total ? total : 1));
  if (!all)
    return NULL;
  uint64_t k = 0;
  for (int i = 0; i < SL_FIXTURE_COLLECTOR_INSTANCES; i++) {
    sl_fixture_collected *one = &c->per[i];
    if (one->count)
      memcpy(all + k * bytes, one->items, bytes * one->count);
    k += one->count;
    free(one->items);
    one->items = NULL;
    one->count = one->capacity = 0;
  }
  qsort(all, total, bytes, compare);
  *count = total;
  return all;
}

/* ------------------------------------------------------------ threads */

/* One walk of /proc/self/task: visit(tid, name, arg) for each thread
 * whose name could be read, until visit returns true.  0 or errno. */
static int threads_walk(bool (*visit)(pid_t, const char *, void *),
                        void *arg) {
  DIR *d = opendir("/proc/self/task");
  if (!d)
    return errno ? errno : EIO;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.')
      continue;
    char path[300], name[32] = {0};
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f)
      continue; /* the thread exited meanwhile */
    bool got = fgets(name, sizeof name, f) != 0;
    fclose(f);
    if (!got)
      continue;
    name[strcspn(name, "\n")] = 0;
    if (visit((pid_t)atoi(e->d_name), name, arg))
      break;
  }
  closedir(d);
  return 0;
}

typedef struct thread_query {
  const char *name; /* a prefix, or the whole name */
  int count;
  pid_t tid;
} thread_query;

static bool count_prefixed(pid_t tid, const char *name, void *arg) {
  (void)tid;
  thread_query *q = arg;
  q->count += strncmp(name, q->name, strlen(q->name)) == 0;
  return false;
}

static bool find_named(pid_t tid, const char *name, void *arg) {
  thread_query *q = arg;
  if (strcmp(name, q->name) != 0)
    return false;
  q->tid = tid;
  return true;
}

int sl_fixture_threads_named(const char *prefix, int *count) {
  thread_query q = {.name = prefix};
  int rc = threads_walk(count_prefixed, &q);
  if (rc == 0)
    *count = q.count;
  return rc;
}

int sl_fixture_thread_named(const char *name, pid_t *tid) {
  thread_query q = {.name = name};
  int rc = threads_walk(find_named, &q);
  if (rc == 0)
    *tid = q.tid;
  return rc;
}
