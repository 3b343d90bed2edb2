/* embed.c — embedding sluice in a program, using only <sluice.h>.
 *
 * Readings {sensor, celsius_milli} from a callback source are partitioned by
 * sensor; each instance of "peak" keeps the highest reading of its sensors
 * and emits a record whenever a sensor's peak rises; the sink prints the
 * final peaks.  Build against an installed sluice with
 *     cc embed.c $(pkg-config --cflags --libs sluice)
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sluice.h>

#define SENSORS 8
#define READINGS 1000000

typedef struct reading {
  uint64_t sensor;
  int64_t celsius_milli;
} reading;

static int readings_next(sl_ctx *ctx, void *state) {
  uint64_t *next = state;
  for (int i = 0; i < 1024 && *next < READINGS; i++, (*next)++) {
    uint64_t n = *next;
    /* A deterministic saw-tooth per sensor. */
    reading r = {.sensor = n % SENSORS,
                 .celsius_milli = (int64_t)((n * 7919) % 20000) +
                                  (int64_t)(n % SENSORS)};
    int rc = sl_emit(ctx, &r, sizeof r);
    if (rc)
      return rc;
  }
  return *next == READINGS ? SL_SOURCE_END : 0;
}

static uint64_t by_sensor(void *user, const sl_record *in) {
  (void)user;
  reading r;
  memcpy(&r, in->data, sizeof r);
  return r.sensor;
}

static int peak_open(sl_ctx *ctx, void *user, void **state) {
  (void)ctx;
  (void)user;
  int64_t *peaks = malloc(sizeof(int64_t) * SENSORS);
  if (!peaks)
    return -1;
  for (int s = 0; s < SENSORS; s++)
    peaks[s] = INT64_MIN;
  *state = peaks;
  return 0;
}

static int peak_process(sl_ctx *ctx, void *state, int input,
                        const sl_record *in) {
  (void)input;
  int64_t *peaks = state;
  reading r;
  memcpy(&r, in->data, sizeof r);
  if (r.celsius_milli <= peaks[r.sensor])
    return 0;
  peaks[r.sensor] = r.celsius_milli;
  return sl_emit(ctx, &r, sizeof r);
}

static void peak_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  free(state);
}

static int print_process(sl_ctx *ctx, void *state, int input,
                         const sl_record *in) {
  (void)ctx;
  (void)input;
  int64_t *final = state; /* one sink instance: no sharing */
  reading r;
  memcpy(&r, in->data, sizeof r);
  final[r.sensor] = r.celsius_milli; /* the latest rise is the peak */
  return 0;
}

int main(void) {
  sl_job *job;
  int rc = sl_job_create(NULL, &job);
  if (rc) {
    fprintf(stderr, "sl_job_create: %s\n", sl_strerror(rc));
    return 1;
  }
  uint64_t position = 0;
  int64_t final[SENSORS] = {0};
  sl_source_ops source = {.next = readings_next};
  sl_process_ops peak = {
      .open = peak_open, .process = peak_process, .close = peak_close};
  sl_process_ops print = {.process = print_process};
  sl_op *src, *keyed, *peaks, *sink;
  if ((rc = sl_op_source(job, "readings", 1, &source, &position, &src)) ||
      (rc = sl_op_key_by(job, "by-sensor", src, by_sensor, NULL, &keyed)) ||
      (rc = sl_op_process(job, "peak", &keyed, 1, 2, &peak, NULL, &peaks)) ||
      (rc = sl_op_sink(job, "print", peaks, 1, &print, final, &sink)) ||
      (rc = sl_job_run(job))) {
    fprintf(stderr, "sluice: %s: %s\n", sl_strerror(rc), sl_job_error(job));
    sl_job_destroy(job);
    return 1;
  }
  for (int s = 0; s < SENSORS; s++)
    printf("sensor %d peak %.3f C\n", s, (double)final[s] / 1000.0);
  sl_job_destroy(job);
  return 0;
}
