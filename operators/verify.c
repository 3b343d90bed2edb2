/* verify.c — the deterministic keyed source and the verifying sink of
 * failure-injection tests.
 *
 * NOTES ON THE DESIGN
 *
 * 1. The keyed source emits record i = {key = i % keys, value = i} for
 *    i = 0 .. count-1, and instance k of p emits exactly the records whose
 *    key % p == k, in increasing i.  So each key has one producer and its
 *    records travel in order: its j-th record has value j * keys + key,
 *    i.e. sequence number value / keys = j.  The position saved in a
 *    checkpoint is how many records the instance has emitted.
 * 2. The verifying sink partitions its input by key itself (its own
 *    key_by), keeps per key the next sequence number it expects (keyed
 *    state, checkpointed) and counts, in operator state (also
 *    checkpointed), what it saw:
 *      in order      seq == next expected: next = seq + 1
 *      duplicate     seq <  next expected
 *      out of order  seq >  next expected (a gap opened): next = seq + 1
 *    Since the counts are restored with the state, they describe the
 *    committed run: what a failed attempt saw after the restored
 *    checkpoint is forgotten with it, and seen again on the replay.  A
 *    record that arrives after a gap opened past it counts as a duplicate
 *    (one counter per key, not a set); every anomaly still shows as a
 *    nonzero count, which is what the tests assert.
 * 3. At the end of input each instance publishes its counts; lost records
 *    are those expected but neither in order nor out of order.  An
 *    instance restored as finished (engine/coordinator.c note 10) does
 *    not reach its end of input again: it publishes the counts it
 *    restored, which are those of its end of input.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "op_util.h" /* before internal.h: both are private */
#include "internal.h"
#include "sluice_testing.h"

#define KEYED_RECORDS_PER_CALL 1024u

/* ------------------------------------------------------------ source */

typedef struct keyed_source {
  uint64_t count;
  uint64_t keys;
} keyed_source;

typedef struct keyed_instance {
  uint64_t keys;  /* all keys */
  uint64_t count; /* all records */
  uint64_t first_key; /* this instance's: first_key, + step, ... < keys */
  uint64_t step;
  uint64_t owned; /* keys this instance owns */
  uint64_t emitted; /* records emitted: the position (note 1) */
} keyed_instance;

static int keyed_open(sl_ctx *ctx, void *user, void **state) {
  const keyed_source *src = user;
  keyed_instance *s = calloc(1, sizeof *s);
  if (!s)
    return ENOMEM;
  uint64_t k = (uint64_t)sl_ctx_instance(ctx);
  s->keys = src->keys;
  s->count = src->count;
  s->first_key = k;
  s->step = (uint64_t)sl_ctx_parallelism(ctx);
  s->owned = src->keys > k ? (src->keys - k + s->step - 1) / s->step : 0;
  *state = s;
  return 0;
}

/* Record number j of this instance as a global index i (note 1). */
static uint64_t keyed_index(const keyed_instance *s, uint64_t j) {
  uint64_t round = j / s->owned;
  uint64_t key = s->first_key + (j % s->owned) * s->step;
  return round * s->keys + key;
}

static int keyed_next(sl_ctx *ctx, void *state) {
  keyed_instance *s = state;
  sl_tuple batch[64];
  for (uint32_t done = 0; done < KEYED_RECORDS_PER_CALL;) {
    uint32_t n = 0;
    while (n < 64 && s->owned) {
      uint64_t i = keyed_index(s, s->emitted + n);
      if (i >= s->count)
        break;
      batch[n].key = i % s->keys;
      batch[n].value = i;
      n++;
    }
    if (n == 0)
      return SL_SOURCE_END;
    int rc = sl_emit_batch(ctx, batch, sizeof batch[0], n);
    if (rc)
      return rc;
    s->emitted += n;
    done += n;
  }
  return 0;
}

static int keyed_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  const keyed_instance *s = state;
  return sl_operator_state_set(ctx, &s->emitted, sizeof s->emitted);
}

static int keyed_restore(sl_ctx *ctx, void *state, uint64_t id) {
  keyed_instance *s = state;
  int rc = sl_operator_state_words(ctx, id, "keyed source position",
                                   &s->emitted, 1);
  return rc == SL_ENOTFOUND ? 0 : rc; /* none: from the beginning */
}

static void keyed_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  free(state);
}

SL_EXPORT int sl_source_keyed(sl_job *job, const char *name, int parallelism,
                              uint64_t count, uint64_t keys, sl_op **op) {
  if (keys == 0)
    return EINVAL;
  keyed_source *src = malloc(sizeof *src);
  if (!src)
    return ENOMEM;
  src->count = count;
  src->keys = keys;
  static const sl_source_ops ops = {.open = keyed_open,
                                    .next = keyed_next,
                                    .close = keyed_close,
                                    .snapshot = keyed_snapshot,
                                    .restore = keyed_restore};
  int rc = sl_op_source(job, name, parallelism, &ops, src, op);
  return op_adopt(rc, op, src, free);
}

/* ------------------------------------------------------------ sink */

typedef struct verify_sink {
  uint64_t keys;
  uint64_t expected;
  int parallelism;
  pthread_mutex_t lock; /* results, published by instances at the end */
  sl_verify_counts *results; /* per instance */
  bool *finished;
} verify_sink;

typedef struct verify_instance {
  verify_sink *sink;
  sl_verify_counts counts; /* records, in_order, duplicates, out_of_order */
} verify_instance;

/* The counts saved in operator state: 4 words. */
#define VERIFY_STATE_WORDS 4

static uint64_t verify_key(void *user, const sl_record *in) {
  (void)user;
  uint64_t key;
  memcpy(&key, in->data, sizeof key);
  return key;
}

static int verify_open(sl_ctx *ctx, void *user, void **state) {
  verify_instance *v = calloc(1, sizeof *v);
  if (!v)
    return ENOMEM;
  v->sink = user;
  *state = v;
  return 0;
}

static int verify_process(sl_ctx *ctx, void *state, int input,
                          const sl_record *rec) {
  (void)input;
  verify_instance *v = state;
  if (rec->size_bytes < sizeof(sl_tuple)) {
    sl_ctx_fail(ctx, "verifying sink: a record of %" PRIu32 " bytes (an "
                "sl_tuple of 16 expected)", rec->size_bytes);
    return EINVAL;
  }
  sl_tuple t;
  memcpy(&t, rec->data, sizeof t);
  if (t.value % v->sink->keys != t.key % v->sink->keys) {
    sl_ctx_fail(ctx, "verifying sink: record {key %" PRIu64 ", value %" PRIu64
                "} does not come from the keyed source of %" PRIu64 " keys",
                t.key, t.value, v->sink->keys);
    return EINVAL;
  }
  uint64_t seq = t.value / v->sink->keys;
  const void *stored;
  uint32_t bytes;
  uint64_t next = 0;
  int rc = sl_state_get(ctx, 0, &stored, &bytes);
  if (rc == 0 && bytes == sizeof next)
    memcpy(&next, stored, sizeof next);
  else if (rc != SL_ENOTFOUND)
    return rc ? rc : EINVAL;
  v->counts.records++;
  if (seq < next) {
    v->counts.duplicates++;
    return 0;
  }
  if (seq == next)
    v->counts.in_order++;
  else
    v->counts.out_of_order++;
  next = seq + 1;
  return sl_state_put(ctx, 0, &next, sizeof next, 0);
}

static int verify_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  const verify_instance *v = state;
  uint64_t words[VERIFY_STATE_WORDS] = {v->counts.records, v->counts.in_order,
                                        v->counts.duplicates,
                                        v->counts.out_of_order};
  return sl_operator_state_set(ctx, words, sizeof words);
}

/* Note 3: the counts of instance k are final. */
static void publish(const verify_instance *v, int k) {
  verify_sink *sink = v->sink;
  pthread_mutex_lock(&sink->lock);
  sink->results[k] = v->counts;
  sink->finished[k] = true;
  pthread_mutex_unlock(&sink->lock);
}

static int verify_restore(sl_ctx *ctx, void *state, uint64_t id) {
  verify_instance *v = state;
  uint64_t words[VERIFY_STATE_WORDS];
  int rc = sl_operator_state_words(ctx, id, "verifying sink state", words,
                                   VERIFY_STATE_WORDS);
  if (rc == SL_ENOTFOUND)
    return 0;
  if (rc)
    return rc;
  v->counts.records = words[0];
  v->counts.in_order = words[1];
  v->counts.duplicates = words[2];
  v->counts.out_of_order = words[3];
  if (ctx->cp.restored_finished)
    publish(v, sl_ctx_instance(ctx)); /* note 3 */
  return 0;
}

/* Note 3: published at the end of input, so a failed attempt publishes
 * nothing and a restarted one overwrites. */
static int verify_finish(sl_ctx *ctx, void *state) {
  publish(state, sl_ctx_instance(ctx));
  return 0;
}

static void verify_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  free(state);
}

static void verify_free(void *p) {
  verify_sink *sink = p;
  pthread_mutex_destroy(&sink->lock);
  free(sink->results);
  free(sink->finished);
  free(sink);
}

SL_EXPORT int sl_sink_verify(sl_job *job, const char *name, sl_op *input,
                             int parallelism, uint64_t count, uint64_t keys,
                             sl_op **op) {
  if (!name || keys == 0 || parallelism < 1 ||
      parallelism > SL_MAX_PARALLELISM)
    return EINVAL;
  char key_name[SL_MAX_NAME];
  if (snprintf(key_name, sizeof key_name, "%s.key", name) >= (int)sizeof key_name)
    return EINVAL;
  verify_sink *sink = calloc(1, sizeof *sink);
  if (!sink)
    return ENOMEM;
  sink->keys = keys;
  sink->expected = count;
  sink->parallelism = parallelism;
  sink->results = calloc((size_t)parallelism, sizeof *sink->results);
  sink->finished = calloc((size_t)parallelism, sizeof *sink->finished);
  pthread_mutex_init(&sink->lock, 0);
  if (!sink->results || !sink->finished) {
    verify_free(sink);
    return ENOMEM;
  }
  sl_op *keyed = 0;
  int rc = sl_op_key_by(job, key_name, input, verify_key, 0, &keyed);
  static const sl_process_ops ops = {.open = verify_open,
                                     .process = verify_process,
                                     .finish = verify_finish,
                                     .close = verify_close,
                                     .snapshot = verify_snapshot,
                                     .restore = verify_restore};
  if (rc == 0)
    rc = sl_op_sink(job, name, keyed, parallelism, &ops, sink, op);
  /* On failure a key_by already added stays, dangling: sl_job_validate
   * refuses the graph, as for any builder error the caller ignores. */
  return op_adopt(rc, op, sink, verify_free);
}

SL_EXPORT int sl_verify_result(const sl_op *op, sl_verify_counts *counts) {
  if (!op || !counts || op->fn.process.process != verify_process)
    return EINVAL;
  verify_sink *sink = op->user;
  memset(counts, 0, sizeof *counts);
  int finished = 0;
  pthread_mutex_lock(&sink->lock);
  for (int k = 0; k < sink->parallelism; k++) {
    const sl_verify_counts *r = &sink->results[k];
    counts->records += r->records;
    counts->in_order += r->in_order;
    counts->duplicates += r->duplicates;
    counts->out_of_order += r->out_of_order;
    finished += sink->finished[k];
  }
  pthread_mutex_unlock(&sink->lock);
  uint64_t delivered = counts->in_order + counts->out_of_order;
  counts->lost = sink->expected > delivered ? sink->expected - delivered : 0;
  counts->complete = finished == sink->parallelism;
  return 0;
}

/* ------------------------------------------------------------ files */

typedef struct output_file {
  char *name;
  long instance;
  unsigned long long seq; /* 0 for out-K files */
} output_file;

static int compare_files(const void *a, const void *b) {
  const output_file *x = a, *y = b;
  if (x->instance != y->instance)
    return x->instance < y->instance ? -1 : 1;
  if (x->seq != y->seq)
    return x->seq < y->seq ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* A committed file name: part-K-SEQ... or out-K...; false otherwise. */
static bool parse_file_name(const char *name, output_file *f) {
  char *end;
  if (strncmp(name, "part-", 5) == 0) {
    f->instance = strtol(name + 5, &end, 10);
    if (end == name + 5 || *end != '-' || f->instance < 0)
      return false;
    const char *at = end + 1;
    f->seq = strtoull(at, &end, 10);
    return end != at;
  }
  if (strncmp(name, "out-", 4) == 0) {
    f->instance = strtol(name + 4, &end, 10);
    f->seq = 0;
    return end != name + 4 && f->instance >= 0;
  }
  return false;
}

/* Count one line's record into counts with next[] (note 2's rules). */
static void count_record(sl_verify_counts *c, uint64_t *next, uint64_t keys,
                         uint64_t key, uint64_t value) {
  uint64_t seq = value / keys;
  c->records++;
  if (seq < next[key]) {
    c->duplicates++;
    return;
  }
  if (seq == next[key])
    c->in_order++;
  else
    c->out_of_order++;
  next[key] = seq + 1;
}

static int check_file(const char *dir, const char *name, uint64_t keys,
                      uint64_t *next, sl_verify_counts *c, char *err,
                      size_t err_bytes) {
  char path[4096 + 256 + 2];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "r");
  if (!f) {
    int e = errno;
    snprintf(err, err_bytes, "%s: %s", path, strerror(e));
    return e;
  }
  char *line = 0;
  size_t cap = 0;
  ssize_t len;
  uint64_t number = 0;
  int rc = 0;
  while (rc == 0 && (len = getline(&line, &cap, f)) >= 0) {
    number++;
    char *end;
    errno = 0;
    unsigned long long key = strtoull(line, &end, 10);
    bool ok = end != line && *end == ',' && line[0] != '-' && errno == 0;
    unsigned long long value = 0;
    if (ok) {
      const char *at = end + 1;
      value = strtoull(at, &end, 10);
      ok = end != at && *at != '-' && errno == 0 &&
           (*end == ',' || *end == '\n' || *end == 0);
    }
    if (!ok) {
      snprintf(err, err_bytes, "%s:%" PRIu64 ": not \"KEY,VALUE...\": %.60s",
               path, number, line);
      rc = EINVAL;
    } else if (key >= keys || value % keys != key) {
      snprintf(err, err_bytes, "%s:%" PRIu64 ": key %llu and value %llu do "
               "not come from the keyed source of %" PRIu64 " keys", path,
               number, key, value, keys);
      rc = EINVAL;
    } else {
      count_record(c, next, keys, key, value);
    }
  }
  if (rc == 0 && ferror(f)) {
    snprintf(err, err_bytes, "%s: read error", path);
    rc = EIO;
  }
  free(line);
  fclose(f);
  return rc;
}

SL_EXPORT int sl_verify_output_dir(const char *dir, uint64_t count,
                                   uint64_t keys, sl_verify_counts *counts,
                                   char *err, size_t err_bytes) {
  char scratch[8];
  if (!err || err_bytes == 0) {
    err = scratch;
    err_bytes = sizeof scratch;
  }
  err[0] = 0;
  if (!dir || !counts || keys == 0)
    return EINVAL;
  memset(counts, 0, sizeof *counts);
  DIR *d = opendir(dir);
  if (!d) {
    int e = errno;
    snprintf(err, err_bytes, "%s: %s", dir, strerror(e));
    return e;
  }
  output_file *files = 0;
  size_t n = 0, cap = 0;
  int rc = 0;
  struct dirent *e;
  while (rc == 0 && (e = readdir(d))) {
    if (strncmp(e->d_name, ".part-", 6) == 0) {
      counts->pending_files++;
      continue;
    }
    output_file f;
    if (!parse_file_name(e->d_name, &f))
      continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 64;
      output_file *grown = realloc(files, cap * sizeof *files);
      if (!grown) {
        rc = ENOMEM;
        break;
      }
      files = grown;
    }
    f.name = strdup(e->d_name);
    if (!f.name) {
      rc = ENOMEM;
      break;
    }
    files[n++] = f;
  }
  closedir(d);
  uint64_t *next = rc == 0 ? calloc(keys, sizeof *next) : 0;
  if (rc == 0 && !next)
    rc = ENOMEM;
  if (rc == 0 && n > 0)
    qsort(files, n, sizeof *files, compare_files);
  for (size_t i = 0; i < n && rc == 0; i++)
    rc = check_file(dir, files[i].name, keys, next, counts, err, err_bytes);
  for (size_t i = 0; i < n; i++)
    free(files[i].name);
  free(files);
  free(next);
  if (rc == ENOMEM && !err[0])
    snprintf(err, err_bytes, "out of memory");
  uint64_t delivered = counts->in_order + counts->out_of_order;
  counts->lost = count > delivered ? count - delivered : 0;
  counts->complete = rc == 0;
  return rc;
}
