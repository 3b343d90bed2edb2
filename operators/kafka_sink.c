/* kafka_sink.c — an at-least-once sink producing each record as a message
 * to a Kafka topic (sl_sink_kafka, sluice_embed.h; docs/kafka.md).
 *
 * NOTES ON THE DESIGN OF THE KAFKA SINK
 *
 * 1. At-least-once, as Flink's KafkaSink with DeliveryGuarantee
 *    AT_LEAST_ONCE: process() hands each record to the producer, and the
 *    snapshot of checkpoint n flushes it: the snapshot returns only once
 *    every message handed over before barrier n was acknowledged (acks=
 *    all).  A checkpoint that completes thus covers messages that are in
 *    the topic; a restore from it replays only records after the barrier,
 *    whose messages may or may not be there: duplicates, never loss.
 * 2. Why not exactly-once.  The design it would take: the records of
 *    checkpoint n kept in the store with n (the write-ahead sink,
 *    wal_sink.c), produced after n completes in one Kafka transaction that
 *    also writes a marker "n committed", and on restore the marker read
 *    with read_committed to re-produce n if and only if it is missing.
 *    librdkafka 2.0.2's mock cluster accepts the transactional requests
 *    but keeps none of their meaning: read_committed returns messages of
 *    aborted and of open transactions, and a producer fenced by a newer
 *    one with its transactional.id still commits.  Nothing of that design
 *    could be tested here, so it is not built (docs/kafka.md).
 * 3. The producer is idempotent (enable.idempotence): its own retries
 *    neither duplicate nor reorder a partition's messages.  Each instance
 *    has its own producer, made in open() and destroyed in close(): a
 *    restart makes a new one.
 * 4. Bounded waits (DESIGN.md invariant 7): a full producer queue is
 *    waited on for at most timeout_ms, and so is the flush of a snapshot;
 *    running out fails the job naming the topic and what was waited for.
 *    close() purges what is still queued (a failed or stopped job) so
 *    rd_kafka_destroy() does not wait for a cluster that may be gone.
 * 5. A message the cluster refuses (its delivery report carries an error:
 *    retries are librdkafka's and are over) fails the job at the next
 *    record, snapshot or end, naming the topic, the partition and the
 *    error.  Reports are served by rd_kafka_poll() on the instance's own
 *    thread, so the callback only writes the instance's fields.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <librdkafka/rdkafka.h>

#include "internal.h"
#include "kafka_internal.h"
#include "op_util.h"

#define KAFKA_SINK_POLL_EVERY 1024u /* records between report polls */
#define KAFKA_SINK_FIRST_BUFFER 1024u

typedef struct kafka_sink {
  sl_kafka_sink_config cfg; /* strings point into this struct's copies */
  char *bootstrap, *topic;
  kafka_properties properties;
} kafka_sink;

typedef struct sink_instance {
  const kafka_sink *sink;
  rd_kafka_t *producer;
  rd_kafka_topic_t *topic;
  int32_t partitions; /* for partition_fn; 0 until asked */
  char *buffer;       /* the formatted value */
  uint64_t buffer_bytes;
  uint32_t since_poll;
  /* The first refused message (note 5). */
  rd_kafka_resp_err_t refused;
  int32_t refused_partition;
  uint64_t refused_count;
} sink_instance;

/* Note 5: on the instance's thread, inside rd_kafka_poll/flush. */
static void delivery_report(rd_kafka_t *rk, const rd_kafka_message_t *m,
                            void *opaque) {
  (void)rk;
  sink_instance *s = opaque;
  if (!m->err)
    return;
  if (s->refused_count++ == 0) {
    s->refused = m->err;
    s->refused_partition = m->partition;
  }
}

/* Note 5: fail ctx if a message was refused.  Returns 0 or EIO. */
static int check_refused(sl_ctx *ctx, const sink_instance *s) {
  if (s->refused_count == 0)
    return 0;
  sl_ctx_fail(ctx, "topic %s partition %" PRId32 ": %" PRIu64 " message(s) "
              "refused: %s", s->sink->topic, s->refused_partition,
              s->refused_count, rd_kafka_err2str(s->refused));
  return EIO;
}

static uint32_t sink_wait_ms(const sink_instance *s) {
  return s->sink->cfg.timeout_ms ? s->sink->cfg.timeout_ms
                                 : KAFKA_DEFAULT_TIMEOUT_MS;
}

static int64_t monotonic_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void sink_close(sl_ctx *ctx, void *state);

static int sink_open(sl_ctx *ctx, void *user, void **state) {
  sink_instance *s = calloc(1, sizeof *s);
  if (!s)
    return ENOMEM;
  s->sink = user;
  *state = s;
  const char *const settings[][2] = {{"bootstrap.servers", s->sink->bootstrap},
                                     {"enable.idempotence", "true"},
                                     {"acks", "all"},
                                     {"linger.ms", "5"},
                                     {"log_level", "3"}};
  char err[600];
  rd_kafka_conf_t *conf = kafka_conf_new(
      settings, sizeof settings / sizeof *settings, &s->sink->properties, err,
      sizeof err);
  if (conf) {
    rd_kafka_conf_set_opaque(conf, s);
    rd_kafka_conf_set_dr_msg_cb(conf, delivery_report);
    s->producer = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    if (!s->producer)
      rd_kafka_conf_destroy(conf); /* rd_kafka_new takes it on success */
  }
  if (s->producer)
    s->topic = rd_kafka_topic_new(s->producer, s->sink->topic, NULL);
  if (!s->topic) {
    if (s->producer)
      snprintf(err, sizeof err, "topic %s: %s", s->sink->topic,
               rd_kafka_err2str(rd_kafka_last_error()));
    sl_ctx_fail(ctx, "cannot make a Kafka producer: %s", err);
    sink_close(ctx, s); /* close runs only after an open that succeeded */
    *state = NULL;
    return EINVAL;
  }
  return 0;
}

/* The partition count of the topic, for partition_fn (asked once). */
static int topic_partitions(sl_ctx *ctx, sink_instance *s) {
  const struct rd_kafka_metadata *md = NULL;
  rd_kafka_resp_err_t err = rd_kafka_metadata(s->producer, 0, s->topic, &md,
                                              (int)sink_wait_ms(s));
  if (!err && (md->topic_cnt != 1 || md->topics[0].err))
    err = md->topic_cnt ? md->topics[0].err : RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC;
  if (!err)
    s->partitions = md->topics[0].partition_cnt;
  if (md)
    rd_kafka_metadata_destroy(md);
  if (err || s->partitions <= 0) {
    sl_ctx_fail(ctx, "topic %s: its partitions: %s", s->sink->topic,
                err ? rd_kafka_err2str(err) : "none");
    return EIO;
  }
  return 0;
}

/* The value of rec: formatted into s->buffer, or its bytes. */
static int message_value(sl_ctx *ctx, sink_instance *s, const sl_record *rec,
                         const void **value, size_t *value_bytes) {
  const sl_kafka_sink_config *cfg = &s->sink->cfg;
  if (!cfg->format) {
    *value = rec->data;
    *value_bytes = rec->size_bytes;
    return 0;
  }
  for (int attempt = 0; attempt < 2; attempt++) { /* at most one regrow */
    int n = cfg->format(cfg->format_user, rec, s->buffer,
                        (uint32_t)s->buffer_bytes);
    if (n < 0) {
      sl_ctx_fail(ctx, "the format function returned %d", n);
      return EINVAL;
    }
    if ((uint64_t)n <= s->buffer_bytes) {
      *value = s->buffer;
      *value_bytes = (size_t)n;
      return 0;
    }
    uint64_t want = (uint64_t)n > KAFKA_SINK_FIRST_BUFFER
                        ? (uint64_t)n : KAFKA_SINK_FIRST_BUFFER;
    char *grown = realloc(s->buffer, want);
    if (!grown)
      return ENOMEM;
    s->buffer = grown;
    s->buffer_bytes = want;
  }
  sl_ctx_fail(ctx, "the format function asked for more room twice");
  return EINVAL;
}

/* The key of rec (the sink's, else the input's key, else none). */
static int message_key(sl_ctx *ctx, const sink_instance *s,
                       const sl_record *rec, const void **key,
                       uint32_t *key_bytes) {
  const sl_kafka_sink_config *cfg = &s->sink->cfg;
  *key = NULL;
  *key_bytes = 0;
  if (cfg->key_fn) {
    int rc = cfg->key_fn(cfg->key_user, rec, key, key_bytes);
    if (rc)
      sl_ctx_fail(ctx, "the key function returned %d", rc);
    return rc;
  }
  int rc = sl_ctx_key_bytes(ctx, key, key_bytes);
  if (rc == SL_EUSAGE) { /* the input is not keyed */
    *key = NULL;
    *key_bytes = 0;
    return 0;
  }
  return rc;
}

static int sink_process(sl_ctx *ctx, void *state, int input,
                        const sl_record *rec) {
  (void)input;
  sink_instance *s = state;
  const sl_kafka_sink_config *cfg = &s->sink->cfg;
  const void *value, *key;
  size_t value_bytes;
  uint32_t key_bytes;
  int rc = check_refused(ctx, s);
  if (rc == 0)
    rc = message_value(ctx, s, rec, &value, &value_bytes);
  if (rc == 0)
    rc = message_key(ctx, s, rec, &key, &key_bytes);
  int32_t partition = RD_KAFKA_PARTITION_UA;
  if (rc == 0 && cfg->partition_fn) {
    if (s->partitions == 0)
      rc = topic_partitions(ctx, s);
    if (rc == 0)
      partition = cfg->partition_fn(cfg->partition_user, rec, s->partitions);
    if (rc == 0 && (partition < -1 || partition >= s->partitions)) {
      sl_ctx_fail(ctx, "the partition function gave %" PRId32 " for a topic "
                  "of %" PRId32 " partitions", partition, s->partitions);
      rc = EINVAL;
    }
  }
  if (rc)
    return rc;
  int64_t deadline_ms = 0;
  for (;;) { /* ends: queued, an error, or the deadline (note 4) */
    if (rd_kafka_produce(s->topic, partition, RD_KAFKA_MSG_F_COPY,
                         (void *)value, value_bytes, key, key_bytes,
                         NULL) == 0)
      break;
    rd_kafka_resp_err_t err = rd_kafka_last_error();
    if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL) {
      sl_ctx_fail(ctx, "topic %s: cannot produce a message of %zu bytes: %s",
                  s->sink->topic, value_bytes, rd_kafka_err2str(err));
      return EIO;
    }
    if (deadline_ms == 0)
      deadline_ms = monotonic_ms() + sink_wait_ms(s);
    else if (monotonic_ms() >= deadline_ms) {
      sl_ctx_fail(ctx, "topic %s: the producer queue stayed full for %" PRIu32
                  " ms (the cluster acknowledges nothing)", s->sink->topic,
                  sink_wait_ms(s));
      return ETIMEDOUT;
    }
    rd_kafka_poll(s->producer, 10);
  }
  if (++s->since_poll >= KAFKA_SINK_POLL_EVERY) {
    s->since_poll = 0;
    rd_kafka_poll(s->producer, 0); /* serve delivery reports (note 5) */
  }
  return 0;
}

/* Note 1: every message handed over so far is acknowledged. */
static int flush_all(sl_ctx *ctx, sink_instance *s, const char *when) {
  rd_kafka_resp_err_t err = rd_kafka_flush(s->producer, (int)sink_wait_ms(s));
  int rc = check_refused(ctx, s);
  if (rc)
    return rc;
  if (err) {
    sl_ctx_fail(ctx, "topic %s: %d message(s) not acknowledged within %"
                PRIu32 " ms %s: %s", s->sink->topic,
                rd_kafka_outq_len(s->producer), sink_wait_ms(s), when,
                rd_kafka_err2str(err));
    return ETIMEDOUT;
  }
  return 0;
}

static int sink_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  char when[64];
  snprintf(when, sizeof when, "for checkpoint %" PRIu64, id);
  return flush_all(ctx, state, when);
}

static int sink_finish(sl_ctx *ctx, void *state) {
  return flush_all(ctx, state, "at the end of input");
}

static void sink_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  sink_instance *s = state;
  if (s->producer) {
    /* Note 4: what is still queued belongs to a failed or stopped run;
     * the restore replays it. */
    rd_kafka_purge(s->producer, RD_KAFKA_PURGE_F_QUEUE |
                                    RD_KAFKA_PURGE_F_INFLIGHT);
    rd_kafka_poll(s->producer, 0);
  }
  if (s->topic)
    rd_kafka_topic_destroy(s->topic);
  if (s->producer)
    rd_kafka_destroy(s->producer);
  free(s->buffer);
  free(s);
}

static void sink_free(void *user) {
  kafka_sink *k = user;
  if (!k)
    return;
  free(k->bootstrap);
  free(k->topic);
  kafka_properties_free(&k->properties);
  free(k);
}

SL_EXPORT int sl_sink_kafka(sl_job *job, const char *name, sl_op *input,
                            int parallelism, const sl_kafka_sink_config *cfg,
                            sl_op **op) {
  if (!job || !op)
    return EINVAL;
  *op = NULL;
  if (atomic_load(&job->state) != SL_JOB_BUILDING)
    return SL_ESTARTED;
  const char *label = name ? name : "(null)";
  if (!cfg || !cfg->bootstrap || !cfg->bootstrap[0] || !cfg->topic ||
      !cfg->topic[0]) {
    sl_job_set_error(job, "kafka sink '%s': bootstrap and topic are required",
                     label);
    return EINVAL;
  }
  kafka_sink *k = calloc(1, sizeof *k);
  if (!k)
    return ENOMEM;
  char why[256];
  /* acks=all and the idempotent producer (sink_open) are what the
   * at-least-once guarantee rests on. */
  static const char *const reserved[] = {
      "acks", "request.required.acks", "enable.idempotence", NULL};
  int rc = kafka_properties_copy(cfg->properties, reserved, &k->properties,
                                 why, sizeof why);
  if (rc == EINVAL)
    sl_job_set_error(job, "kafka sink '%s': %s", label, why);
  k->cfg = *cfg;
  k->bootstrap = strdup(cfg->bootstrap);
  k->topic = strdup(cfg->topic);
  if (rc == 0 && (!k->bootstrap || !k->topic))
    rc = ENOMEM;
  if (rc) {
    sink_free(k);
    return rc;
  }
  k->cfg.bootstrap = k->bootstrap;
  k->cfg.topic = k->topic;
  k->cfg.properties = NULL; /* k->properties holds them */
  static const sl_process_ops ops = {.open = sink_open,
                                     .process = sink_process,
                                     .finish = sink_finish,
                                     .close = sink_close,
                                     .snapshot = sink_snapshot};
  rc = sl_op_sink(job, name, input, parallelism, &ops, k, op);
  return op_adopt(rc, op, k, sink_free);
}
