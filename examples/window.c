/* window.c — a windowed job in a dozen lines: per-key sums over tumbling
 * event-time windows of 10 s, from generated events that arrive up to
 * 0.5 s out of order.  Uses only <sluice.h>. */
#include <inttypes.h>
#include <stdio.h>

#include <sluice.h>

typedef struct sum { uint64_t key; int64_t start, end; uint64_t total; } sum;

static uint64_t by_key(void *u, const sl_record *r) { return ((const sl_event *)r->data)->key; }
static void zero(void *u, void *acc) { *(uint64_t *)acc = 0; }
static void add(void *u, void *acc, const sl_record *r) { *(uint64_t *)acc += ((const sl_event *)r->data)->value; }
static int result(void *u, sl_ctx *ctx, uint64_t key, const sl_window *w, const void *acc) {
  sum s = {key, w->start, w->end, *(const uint64_t *)acc};
  return sl_emit(ctx, &s, sizeof s);
}
static int print(void *u, int instance, const sl_record *r) {
  const sum *s = r->data;
  if (s->key == 0) printf("key 0, window [%" PRId64 ", %" PRId64 ") ms: %" PRIu64 "\n", s->start, s->end, s->total);
  return 0;
}

int main(void) {
  sl_job *job;
  sl_op *events, *keyed, *sums, *out;
  sl_job_create(NULL, &job);
  sl_generator_config g = {.count = 10000000, .keys = 100, .step = 1, .disorder = 0.2, .max_delay = 500};
  sl_source_generator(job, "events", 1, &g, &events);                  /* 1 event per ms of event time */
  sl_op_watermarks(events, &(sl_watermark_config){.out_of_orderness = 500});
  sl_op_key_by(job, "by-key", events, by_key, NULL, &keyed);
  sl_window_config w = {.type = SL_WINDOW_TUMBLING, .size = 10000,      /* 10 s */
                        .acc_bytes = 8, .init = zero, .add = add, .emit = result};
  sl_op_window(job, "sums", keyed, 2, &w, &sums);
  sl_sink_callback(job, "print", sums, 1, print, NULL, &out);
  int rc = sl_job_run(job);
  if (rc) fprintf(stderr, "%s\n", sl_job_error(job));
  sl_job_destroy(job);
  return rc != 0;
}
