/* tsan_embed_stress.c — the push source and the table sink under
 * ThreadSanitizer (plain C: Criterion 2.4 aborts under TSan).  Three
 * application threads push records concurrently into a running job with
 * checkpoints; a keyed running count goes to an LMDB table sink; another
 * thread reads the table while the job runs.  Checks the final table.
 * Exit 0 on success, 1 with a message. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "sluice.h"
#include "stress_check.h"

#define PUSHERS 3
#define PER_PUSHER 20000u
#define KEYS 60u /* divides PUSHERS * PER_PUSHER */

typedef struct pusher {
  sl_push *push;
  int id;
  int rc;
} pusher;

static void *push_main(void *arg) {
  pusher *p = arg;
  for (uint32_t i = 0; i < PER_PUSHER && p->rc == 0; i++) {
    sl_tuple t = {.key = (i * PUSHERS + (uint32_t)p->id) % KEYS, .value = 1};
    p->rc = sl_push_record(p->push, &t, sizeof t, SL_NO_TIMESTAMP);
  }
  return 0;
}

typedef struct reader_arg {
  sl_job *job;
  _Atomic int stop;
  uint64_t reads;
  int rc;
} reader_arg;

static void *read_main(void *arg) {
  reader_arg *r = arg;
  sl_table_reader *reader = 0;
  r->rc = sl_job_table_reader(r->job, &reader);
  while (r->rc == 0 && !atomic_load(&r->stop)) {
    uint64_t rows = 0;
    int rc = sl_table_count(reader, "counts", &rows);
    if (rc && rc != SL_ENOTFOUND)
      r->rc = rc;
    r->reads++;
  }
  if (reader)
    sl_table_close(reader);
  return 0;
}

/* Running count per key; emits {key, count} for the table sink. */
static int count_process(sl_ctx *ctx, void *state, int input,
                         const sl_record *in) {
  (void)state;
  (void)input;
  const sl_tuple *t = in->data;
  void *v;
  uint64_t zero = 0;
  int rc = sl_state_update(ctx, 1, 8, &zero, &v);
  if (rc)
    return rc > 0 ? -rc : rc;
  uint64_t n;
  memcpy(&n, v, 8);
  n++;
  memcpy(v, &n, 8);
  sl_tuple out = {.key = t->key, .value = n};
  return sl_emit(ctx, &out, sizeof out);
}

static int check_row(void *arg, const void *key, uint32_t key_bytes,
                     const void *value, uint32_t value_bytes) {
  uint64_t *total = arg;
  if (key_bytes != 8 || value_bytes != 8)
    return -EINVAL;
  uint64_t k, v;
  memcpy(&k, key, 8);
  memcpy(&v, value, 8);
  uint64_t want = (uint64_t)PUSHERS * PER_PUSHER / KEYS;
  CHECK(k < KEYS && v == want, "key %" PRIu64 ": %" PRIu64 ", want %" PRIu64,
        k, v, want);
  *total += v;
  return 0;
}

int main(void) {
  char dir[] = "/tmp/sluice-tsan-embed-XXXXXX";
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  sl_job_config c = {.struct_bytes = sizeof(sl_job_config), .ring_bytes = 8192, .spin_iterations = 1,
                     .output_batch_records = 16};
  c.checkpoint.state_dir = dir;
  c.checkpoint.interval_ms = 5;
  c.checkpoint.no_sync = 1;
  sl_job *job = 0;
  int rc = sl_job_create(&c, &job);
  CHECK(rc == 0, "create: %s", sl_strerror(rc));
  sl_op *src, *k, *cnt, *table;
  sl_push *push = 0;
  rc = sl_source_push(job, "push", 256, &src, &push);
  if (!rc)
    rc = sl_op_key_by(job, "k", src, sl_fixture_tuple_key, 0, &k);
  sl_process_ops ops = {.process = count_process};
  if (!rc)
    rc = sl_op_process(job, "count", &k, 1, 2, &ops, 0, &cnt);
  sl_table_sink_config tc = {.table = "counts"};
  if (!rc)
    rc = sl_sink_table(job, "table", cnt, 2, &tc, &table);
  CHECK(rc == 0, "build: %s (%s)", sl_strerror(rc), sl_job_error(job));
  rc = sl_job_start(job);
  CHECK(rc == 0, "start: %s (%s)", sl_strerror(rc), sl_job_error(job));
  if (rc)
    return 1;
  reader_arg reader = {.job = job};
  pthread_t reader_thread, threads[PUSHERS];
  pusher p[PUSHERS];
  pthread_create(&reader_thread, 0, read_main, &reader);
  for (int i = 0; i < PUSHERS; i++) {
    p[i] = (pusher){.push = push, .id = i};
    pthread_create(&threads[i], 0, push_main, &p[i]);
  }
  for (int i = 0; i < PUSHERS; i++) {
    pthread_join(threads[i], 0);
    CHECK(p[i].rc == 0, "pusher %d: %s", i, sl_strerror(p[i].rc));
  }
  sl_push_close(push);
  rc = sl_job_wait(job);
  CHECK(rc == 0, "run: %s (%s)", sl_strerror(rc), sl_job_error(job));
  atomic_store(&reader.stop, 1);
  pthread_join(reader_thread, 0);
  CHECK(reader.rc == 0, "reader: %s", sl_strerror(reader.rc));
  sl_table_reader *r = 0;
  rc = sl_job_table_reader(job, &r);
  CHECK(rc == 0, "reader: %s", sl_strerror(rc));
  uint64_t total = 0, rows = 0;
  if (rc == 0) {
    rc = sl_table_foreach(r, "counts", check_row, &total);
    CHECK(rc == 0, "foreach: %s", sl_strerror(rc));
    rc = sl_table_count(r, "counts", &rows);
    CHECK(rc == 0 && rows == KEYS, "rows %" PRIu64, rows);
    sl_table_close(r);
  }
  CHECK(total == (uint64_t)PUSHERS * PER_PUSHER, "total %" PRIu64, total);
  sl_job_destroy(job);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0)
    failures++;
  if (failures) {
    fprintf(stderr, "tsan_embed_stress: %d checks failed\n", failures);
    return 1;
  }
  printf("tsan_embed_stress: ok (%" PRIu64 " table reads while running)\n",
         reader.reads);
  return 0;
}
