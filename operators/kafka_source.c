/* kafka_source.c — a replayable source over the partitions of a Kafka
 * topic (sl_source_kafka, sluice_embed.h; docs/kafka.md).
 *
 * NOTES ON THE DESIGN OF THE KAFKA SOURCE
 *
 * 1. Static assignment, as Flink's KafkaSource: no consumer group
 *    rebalances.  The partitions (every one of the topic, or the
 *    configured list) are split over the instances by id: instance i of P
 *    reads partition p when p % P == i.  The consumer assigns them by hand
 *    (rd_kafka_assign); group.id is set only because librdkafka's consumer
 *    wants one, and names the group offsets are committed to (note 6).
 * 2. Position.  Each partition's next offset is the offset after the last
 *    message emitted.  next() emits every message it polled before it
 *    returns and snapshots run between next() calls, so the saved offsets
 *    are exactly after the records before the barrier; a restore assigns
 *    the partitions at them.  Offsets are those of the messages read with
 *    isolation.level=read_committed.  When the consumer reports a
 *    partition's end (PARTITION_EOF) its offset becomes the position
 *    (never past a bounded end): it can lie after commit markers that are
 *    never delivered, and it turns the "earliest" of an empty partition
 *    into a number, so a bounded partition finishes there.
 * 3. Starting offsets are resolved into numbers at the first start
 *    (resolve_starts, from the first next() or the first snapshot, which
 *    can come before it) and only then saved, except "earliest", which
 *    stays the logical RD_KAFKA_OFFSET_BEGINNING until a message is read:
 *    it means the same after a restore.  A resolved "latest" or timestamp
 *    does not move when the job restores later.  The end offsets of a
 *    bounded source are fixed the same way and checkpointed (-1 stands
 *    for none: a bounded source resolves such an end when it restores
 *    one, and never takes it for "finished").
 * 4. Bounded waits (DESIGN.md invariant 7): every call that asks the
 *    cluster at start (metadata, end offsets, offsets for a time,
 *    committed offsets) waits at most timeout_ms and fails the job naming
 *    what it waited for; next() polls for at most KAFKA_POLL_MS, so
 *    barriers and a stop never wait on a quiet topic.  An unreachable
 *    cluster while running is retried by librdkafka; the job goes on
 *    taking checkpoints at the same offsets.
 * 5. Event time, per partition.  Each partition keeps the largest time
 *    read from it; its watermark is that minus out_of_orderness minus 1.
 *    The instance emits the least watermark over its partitions that are
 *    neither finished (bounded, at their end) nor idle: at their end (the
 *    last poll said so) with no message for idle_timeout_ms.  When every
 *    live partition is idle the instance marks its outputs idle (the
 *    engine's IDLE control, timer.c); its next record or watermark makes
 *    them active again.  An instance that reads no partition at all (more
 *    instances than partitions) marks its outputs idle at once.  The
 *    largest times are checkpointed with the offsets.
 * 6. Committing offsets back is monitoring only: each snapshot keeps its
 *    offsets in a ring of KAFKA_COMMIT_RING entries; the completion of
 *    checkpoint c makes the newest entry with an id <= c the next to
 *    commit, asynchronously, and forgets the older ones (the final
 *    snapshot's entry takes the id after every barrier seen, as in
 *    wal_sink.c note 5, at most that of the checkpoint completing it).
 *    At most one commit is in flight (commit_next): while one is, later
 *    completions only move the entry to commit next, so a cluster that
 *    does not answer holds one request, not one per checkpoint.  Results
 *    come back on a queue of the instance's, polled without waiting at
 *    each completion.  A stop is bounded whatever the cluster does:
 *    close waits at most KAFKA_CLOSE_COMMIT_MS for the commit in flight
 *    and the last one (so a bounded run's final offsets usually land),
 *    then librdkafka's own close, which waits for commits still in
 *    flight: usually at most session.timeout.ms (the bound librdkafka
 *    documents for rd_kafka_consumer_close; the source joins no group,
 *    note 1, so that setting means nothing else here, and it is set to
 *    KAFKA_SESSION_MS; its default, 45 s, made a stop with the broker
 *    down take about 47 s), but a commit still waiting for a group
 *    coordinator when the close starts was seen to hold it without end
 *    (librdkafka 2.0.2, about 1 stop in 10 under ASan).  So the close is
 *    asynchronous (consumer_close_bounded): the instance waits at most
 *    KAFKA_CLOSE_GROUP_MS for it, and a consumer not closed by then is
 *    destroyed by a detached thread of its own, which ends when librdkafka
 *    lets it (the commit answered or failed) or with the process.  That
 *    late commit may still land, after a newer job's: monitoring only.
 *    A failed or lost commit loses nothing (a warning says so): the
 *    checkpoints hold the offsets the source restores from.
 * 7. Nothing read back is trusted (DESIGN.md invariant 9): the state's
 *    length, magic, version, topic hash, partition ids (each assigned to
 *    this instance, none twice), offsets (next <= end when there is an
 *    end) and largest times (none, or within the valid range) are checked
 *    before use; a bad one fails the restore with SL_ECORRUPT naming the
 *    state directory and the checkpoint.
 * 8. Dead letters, as the file sources' (io_reader.c note 5, file_source.c
 *    note 5): with dead_letter_path, a bad record is appended to the
 *    instance's dead-letter file as "topic T partition P", its offset, the
 *    reason and the value as it came, and is consumed (its offset is
 *    passed) instead of failing the job.  Instance i of P > 1 writes
 *    PATH.i, so no two threads share a file.  The file is synced at each
 *    snapshot and its length saved with the offsets; a restore cuts it
 *    back to that length (the replay writes the later entries again) and a
 *    start that restores nothing empties it.  Only a bad record goes
 *    there: a failed emit or a broker error still fails the job.
 *
 * Saved state (operator state), 64-bit words in native order:
 *   KAFKA_MAGIC, KAFKA_VERSION, hash of the topic name, partition count n,
 *   length of the dead-letter file (0 without one, note 8),
 *   then n times: partition id, next offset, end offset (-1 unbounded),
 *   largest time read (SL_NO_TIMESTAMP before the first).
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "internal.h"
#include "io_internal.h"
#include "kafka_internal.h"
#include "log.h"
#include "op_util.h"
#include "ring.h"
#include "time_check.h"

#define KAFKA_MAGIC UINT64_C(0x414b4c53) /* "SLKA" */
#define KAFKA_VERSION 2u /* 2: the dead-letter length (note 8) */
#define KAFKA_HEAD_WORDS 5u
#define KAFKA_PARTITION_WORDS 4u
#define KAFKA_POLL_MS 50 /* first poll of a next() call (note 4) */
#define KAFKA_RECORDS_PER_CALL 1024u
#define KAFKA_COMMIT_RING 8u /* note 6 */
#define KAFKA_CLOSE_COMMIT_MS 2000 /* note 6: the last commits, at close */
#define KAFKA_CLOSE_GROUP_MS 1000  /* note 6: librdkafka's close */
/* Note 6: session.timeout.ms, under KAFKA_CLOSE_GROUP_MS so that the
 * usual close ends within the wait and the thread is the exception. */
#define KAFKA_SESSION_MS 500
_Static_assert(KAFKA_SESSION_MS < KAFKA_CLOSE_GROUP_MS,
               "librdkafka's usual close must fit in the source's wait");
#define KAFKA_PATH_BYTES 4096 /* a dead-letter path with its NUL (note 8) */

typedef struct kafka_source {
  sl_kafka_source_config cfg; /* strings point into this struct's copies */
  char *bootstrap, *topic, *group_id, *partitions, *dead_letter_path;
  kafka_properties properties;
} kafka_source;

typedef struct kafka_partition {
  int32_t id;
  int64_t next_offset; /* note 2; RD_KAFKA_OFFSET_BEGINNING or a number */
  int64_t end_offset;  /* bounded: the end; -1: none */
  int64_t max_time;    /* note 5; SL_NO_TIMESTAMP before the first */
  uint64_t last_message_ns;
  bool at_end;   /* the last poll reached the partition's end */
  bool restored; /* the offsets came from a checkpoint */
} kafka_partition;

typedef struct kafka_commit {
  uint64_t checkpoint_id; /* 0: empty */
  int64_t *offsets;       /* per partition, in kafka_instance order */
} kafka_commit;

typedef struct kafka_instance {
  const kafka_source *src;
  rd_kafka_t *consumer;
  kafka_partition *parts; /* ascending ids */
  uint32_t part_count;
  int32_t *index_of; /* partition id -> index in parts, or -1 */
  int32_t topic_partitions;
  bool assigned; /* the first next() resolved starts and assigned */
  kafka_commit commits[KAFKA_COMMIT_RING];
  rd_kafka_queue_t *commit_results; /* note 6 */
  uint64_t completed_id;   /* the newest checkpoint completed (note 6) */
  uint64_t in_flight_id;   /* the checkpoint of the commit in flight; 0: none */
  io_dead_letter dead; /* note 8; dead.path NULL: bad records fail */
  char dead_path[KAFKA_PATH_BYTES + 16];
} kafka_instance;

/* ------------------------------------------------------------ checker */

__attribute__((unused)) /* asserts only */
static bool kafka_check(const kafka_instance *k) {
  for (uint32_t i = 0; i < k->part_count; i++) {
    assert(k->parts[i].id >= 0 && k->parts[i].id < k->topic_partitions);
    assert(i == 0 || k->parts[i - 1].id < k->parts[i].id);
    assert(k->index_of[k->parts[i].id] == (int32_t)i);
  }
  return true;
}

/* ------------------------------------------------------------ partitions */

/* Whether partition id is in list ("0-3,7"); list already validated. */
static bool list_has(const char *list, int32_t id) {
  if (!list || !list[0])
    return true;
  const char *at = list;
  while (*at) { /* each step consumes a range */
    char *end;
    long low = strtol(at, &end, 10), high = low;
    if (*end == '-')
      high = strtol(end + 1, &end, 10);
    if (id >= low && id <= high)
      return true;
    at = *end == ',' ? end + 1 : end;
  }
  return false;
}

/* Check a partition list ("0-3,7"); *max_id gets its largest id (-1 for
 * an empty list).  Returns 0, or EINVAL with why set. */
static int partition_list_check(const char *list, int64_t *max_id, char *why,
                                size_t why_bytes) {
  *max_id = -1;
  if (!list || !list[0])
    return 0;
  const char *at = list;
  while (*at) { /* each step consumes a range or fails */
    char *end;
    errno = 0;
    long low = strtol(at, &end, 10), high = low;
    if (end == at || low < 0 || low > INT32_MAX || errno)
      return op_errorf(EINVAL, why, why_bytes, "partitions '%s': expected "
                       "ids or ranges such as 0-3,7", list);
    if (*end == '-') {
      const char *from = end + 1;
      high = strtol(from, &end, 10);
      if (end == from || high < low || high > INT32_MAX || errno)
        return op_errorf(EINVAL, why, why_bytes, "partitions '%s': a range "
                         "must be LOW-HIGH with LOW <= HIGH", list);
    }
    if (*end != ',' && *end != '\0')
      return op_errorf(EINVAL, why, why_bytes, "partitions '%s': unexpected "
                       "'%c'", list, *end);
    if (high > *max_id)
      *max_id = high;
    at = *end == ',' ? end + 1 : end;
  }
  return 0;
}

/* The topic's partition count (note 4).  Returns 0 or fails ctx. */
static int topic_partitions(sl_ctx *ctx, kafka_instance *k, uint32_t wait_ms) {
  const char *topic = k->src->topic;
  rd_kafka_topic_t *handle = rd_kafka_topic_new(k->consumer, topic, NULL);
  if (!handle) {
    sl_ctx_fail(ctx, "topic %s: %s", topic,
                rd_kafka_err2str(rd_kafka_last_error()));
    return EINVAL;
  }
  const struct rd_kafka_metadata *md = NULL;
  rd_kafka_resp_err_t err =
      rd_kafka_metadata(k->consumer, 0, handle, &md, (int)wait_ms);
  if (!err && (md->topic_cnt != 1 || md->topics[0].err))
    err = md->topic_cnt ? md->topics[0].err : RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC;
  if (!err)
    k->topic_partitions = md->topics[0].partition_cnt;
  if (md)
    rd_kafka_metadata_destroy(md);
  rd_kafka_topic_destroy(handle);
  if (err) {
    sl_ctx_fail(ctx, "topic %s at %s: the metadata within %" PRIu32 " ms: %s",
                topic, k->src->bootstrap, wait_ms, rd_kafka_err2str(err));
    return err == RD_KAFKA_RESP_ERR__TIMED_OUT ? ETIMEDOUT : EIO;
  }
  return 0;
}

/* Note 1: this instance's partitions.  Returns 0, ENOMEM or EINVAL. */
static int assign_partitions(sl_ctx *ctx, kafka_instance *k) {
  const char *list = k->src->partitions;
  int instance = sl_ctx_instance(ctx), parallelism = sl_ctx_parallelism(ctx);
  k->index_of = malloc((size_t)k->topic_partitions * sizeof *k->index_of + 1);
  k->parts = calloc((size_t)k->topic_partitions + 1, sizeof *k->parts);
  if (!k->index_of || !k->parts)
    return ENOMEM;
  for (int32_t p = 0; p < k->topic_partitions; p++) {
    k->index_of[p] = -1;
    if (!list_has(list, p) || p % parallelism != instance)
      continue;
    k->index_of[p] = (int32_t)k->part_count;
    k->parts[k->part_count++] = (kafka_partition){
        .id = p, .next_offset = RD_KAFKA_OFFSET_BEGINNING, .end_offset = -1,
        .max_time = SL_NO_TIMESTAMP, .last_message_ns = sl_now_ns()};
  }
  /* A listed partition the topic lacks is a configuration error. */
  int64_t max_id;
  char why[8];
  partition_list_check(list, &max_id, why, sizeof why); /* checked before */
  if (max_id >= k->topic_partitions) {
    sl_ctx_fail(ctx, "topic %s has %" PRId32 " partitions; partition %"
                PRId64 " of '%s' does not exist", k->src->topic,
                k->topic_partitions, max_id, list);
    return EINVAL;
  }
  assert(kafka_check(k));
  return 0;
}

/* ------------------------------------------------------------ consumer */

static int consumer_new(sl_ctx *ctx, kafka_instance *k) {
  const kafka_source *src = k->src;
  /* auto.offset.reset=error: an offset the topic no longer holds
   * (retention) fails the job instead of skipping data silently.
   * session.timeout.ms bounds the close (note 6). */
  char close_ms[16];
  snprintf(close_ms, sizeof close_ms, "%d", KAFKA_SESSION_MS);
  const char *const settings[][2] = {{"bootstrap.servers", src->bootstrap},
                                     {"group.id", src->group_id},
                                     {"session.timeout.ms", close_ms},
                                     {"enable.auto.commit", "false"},
                                     {"enable.auto.offset.store", "false"},
                                     {"enable.partition.eof", "true"},
                                     {"isolation.level", "read_committed"},
                                     {"auto.offset.reset", "error"},
                                     {"log_level", "3"}};
  char err[600];
  rd_kafka_conf_t *conf = kafka_conf_new(
      settings, sizeof settings / sizeof *settings, &src->properties, err,
      sizeof err);
  if (!conf) {
    sl_ctx_fail(ctx, "%s", err);
    return EINVAL;
  }
  k->consumer = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
  if (!k->consumer) { /* rd_kafka_new takes conf only on success */
    rd_kafka_conf_destroy(conf);
    sl_ctx_fail(ctx, "cannot make a Kafka consumer: %s", err);
    return EINVAL;
  }
  return 0;
}

static uint32_t wait_ms(const kafka_instance *k) {
  return k->src->cfg.timeout_ms ? k->src->cfg.timeout_ms
                                : KAFKA_DEFAULT_TIMEOUT_MS;
}

/* A list of the partitions in parts order with their next offsets. */
static rd_kafka_topic_partition_list_t *offset_list(const kafka_instance *k) {
  rd_kafka_topic_partition_list_t *list =
      rd_kafka_topic_partition_list_new((int)k->part_count);
  for (uint32_t i = 0; i < k->part_count; i++)
    rd_kafka_topic_partition_list_add(list, k->src->topic, k->parts[i].id)
        ->offset = k->parts[i].next_offset;
  return list;
}

/* Note 3: numbers for the starts of partitions not restored, and the ends
 * of a bounded source.  Returns 0 or fails ctx. */
static int resolve_starts(sl_ctx *ctx, kafka_instance *k) {
  const sl_kafka_source_config *cfg = &k->src->cfg;
  uint32_t wait = wait_ms(k);
  rd_kafka_resp_err_t err = 0;
  const char *what = NULL;
  for (uint32_t i = 0; !err && i < k->part_count; i++) {
    kafka_partition *p = &k->parts[i];
    bool need_end = cfg->bounded && p->end_offset < 0;
    bool need_latest = !p->restored && cfg->start == SL_KAFKA_LATEST;
    int64_t low, high;
    if (need_end || need_latest) {
      what = "the end offsets";
      err = rd_kafka_query_watermark_offsets(k->consumer, k->src->topic,
                                             p->id, &low, &high, (int)wait);
      if (!err && need_end)
        p->end_offset = high;
      if (!err && need_latest)
        p->next_offset = high;
    }
  }
  if (!err && (cfg->start == SL_KAFKA_TIMESTAMP ||
               cfg->start == SL_KAFKA_COMMITTED)) {
    rd_kafka_topic_partition_list_t *list = offset_list(k);
    for (int i = 0; i < list->cnt; i++)
      list->elems[i].offset = cfg->start_timestamp_ms;
    what = cfg->start == SL_KAFKA_TIMESTAMP ? "the offsets for a time"
                                            : "the committed offsets";
    err = cfg->start == SL_KAFKA_TIMESTAMP
              ? rd_kafka_offsets_for_times(k->consumer, list, (int)wait)
              : rd_kafka_committed(k->consumer, list, (int)wait);
    for (int i = 0; !err && i < list->cnt; i++) {
      kafka_partition *p = &k->parts[i];
      int64_t offset = list->elems[i].offset;
      if (list->elems[i].err)
        err = list->elems[i].err;
      else if (!p->restored && offset >= 0)
        p->next_offset = offset;
      else if (!p->restored && cfg->start == SL_KAFKA_TIMESTAMP)
        p->next_offset = RD_KAFKA_OFFSET_END; /* nothing at or after it */
      /* committed: none is RD_KAFKA_OFFSET_INVALID, earliest stays */
    }
    rd_kafka_topic_partition_list_destroy(list);
  }
  if (!err)
    return 0;
  sl_ctx_fail(ctx, "topic %s at %s: %s within %" PRIu32 " ms: %s",
              k->src->topic, k->src->bootstrap, what, wait,
              rd_kafka_err2str(err));
  return err == RD_KAFKA_RESP_ERR__TIMED_OUT ? ETIMEDOUT : EIO;
}

/* A resolved RD_KAFKA_OFFSET_END (no message at or after the start time)
 * becomes the partition's end now, so the position saved is a number. */
static int settle_ends(sl_ctx *ctx, kafka_instance *k) {
  for (uint32_t i = 0; i < k->part_count; i++) {
    kafka_partition *p = &k->parts[i];
    if (p->next_offset != RD_KAFKA_OFFSET_END)
      continue;
    int64_t low, high;
    rd_kafka_resp_err_t err = rd_kafka_query_watermark_offsets(
        k->consumer, k->src->topic, p->id, &low, &high, (int)wait_ms(k));
    if (err) {
      sl_ctx_fail(ctx, "topic %s partition %" PRId32 ": the end offset: %s",
                  k->src->topic, p->id, rd_kafka_err2str(err));
      return EIO;
    }
    /* A bounded end resolved before: never start past it (note 7). */
    p->next_offset = p->end_offset >= 0 && high > p->end_offset
                         ? p->end_offset
                         : high;
  }
  return 0;
}

static int start_reading(sl_ctx *ctx, kafka_instance *k) {
  int rc = resolve_starts(ctx, k);
  if (rc == 0)
    rc = settle_ends(ctx, k);
  if (rc)
    return rc;
  rd_kafka_topic_partition_list_t *list = offset_list(k);
  rd_kafka_resp_err_t err = rd_kafka_assign(k->consumer, list);
  rd_kafka_topic_partition_list_destroy(list);
  if (err) {
    sl_ctx_fail(ctx, "topic %s: assigning partitions: %s", k->src->topic,
                rd_kafka_err2str(err));
    return EIO;
  }
  k->assigned = true;
  return 0;
}

/* ------------------------------------------------------------ records */

/* The time of message m into *time.  Returns 0, or EINVAL with why set. */
static int message_time(const kafka_instance *k, const rd_kafka_message_t *m,
                        int64_t *time, char *why, size_t why_bytes) {
  const sl_kafka_source_config *cfg = &k->src->cfg;
  rd_kafka_timestamp_type_t type;
  int64_t kafka_ms = rd_kafka_message_timestamp(m, &type);
  if (cfg->timestamp_fn) {
    why[0] = '\0';
    int rc = cfg->timestamp_fn(cfg->timestamp_user, m->payload,
                               (uint32_t)m->len, kafka_ms, time, why,
                               why_bytes);
    if (rc && !why[0])
      snprintf(why, why_bytes, "the timestamp function returned %d", rc);
    if (rc)
      return EINVAL;
  } else if (kafka_ms < 0) {
    snprintf(why, why_bytes, "the message has no Kafka timestamp");
    return EINVAL;
  } else {
    *time = kafka_ms;
  }
  if (*time < SL_TIME_MIN_VALID || *time > SL_TIME_MAX_VALID) {
    snprintf(why, why_bytes, "time %" PRId64 " is outside the valid range",
             *time);
    return EINVAL;
  }
  return 0;
}

/* Note 8: bad message m of partition p into the dead letters, consumed.
 * Returns 0 or the write's error (the instance failed). */
static int dead_letter(sl_ctx *ctx, kafka_instance *k, kafka_partition *p,
                       const rd_kafka_message_t *m, const char *why) {
  char where[300];
  snprintf(where, sizeof where, "topic %s partition %" PRId32, k->src->topic,
           p->id);
  int rc = io_dead_letter_write(ctx, &k->dead, where, (uint64_t)m->offset,
                                why, m->payload ? m->payload : "",
                                m->payload ? m->len : 0);
  if (rc)
    return rc;
  sl_ctx_count(ctx, SL_COUNT_DEAD_LETTER, 1);
  p->next_offset = m->offset + 1;
  return 0;
}

/* One message of partition p: emit it; a bad one goes to the dead letters
 * (note 8) or fails the job naming where it is. */
static int take_message(sl_ctx *ctx, kafka_instance *k, kafka_partition *p,
                        const rd_kafka_message_t *m) {
  char why[256] = "";
  int64_t time = SL_NO_TIMESTAMP;
  int rc = 0;
  if (!m->payload)
    rc = EINVAL, snprintf(why, sizeof why, "the message has no value");
  else if (m->len > ctx->job->config.max_record_bytes)
    rc = SL_ETOOBIG, snprintf(why, sizeof why, "a value of %zu bytes is over "
                              "max_record_bytes", m->len);
  else
    rc = message_time(k, m, &time, why, sizeof why);
  if (rc && k->dead.path) /* bad, not a failed emit */
    return dead_letter(ctx, k, p, m, why[0] ? why : sl_strerror(rc));
  if (rc == 0)
    rc = sl_emit_ts(ctx, m->payload, (uint32_t)m->len, time);
  if (rc == 0) {
    p->next_offset = m->offset + 1;
    if (time > p->max_time)
      p->max_time = time;
    return 0;
  }
  if (rc != SL_ESTOPPED)
    sl_ctx_fail(ctx, "topic %s partition %" PRId32 " offset %" PRId64
                ": bad record: %s", k->src->topic, p->id, m->offset,
                why[0] ? why : sl_strerror(rc));
  return rc;
}

/* A consumer event that is not a message.  Returns 0 (go on) or fails. */
static int take_event(sl_ctx *ctx, kafka_instance *k,
                      const rd_kafka_message_t *m) {
  int32_t id = m->partition;
  kafka_partition *p = id >= 0 && id < k->topic_partitions &&
                               k->index_of[id] >= 0
                           ? &k->parts[k->index_of[id]]
                           : NULL;
  if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) { /* note 2 */
    if (!p)
      return 0;
    p->at_end = true;
    int64_t eof = m->offset;
    if (p->end_offset >= 0 && eof > p->end_offset)
      eof = p->end_offset; /* messages from the end on are not read */
    if (eof > p->next_offset)
      p->next_offset = eof;
    return 0;
  }
  switch (m->err) {
  case RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET:
  case RD_KAFKA_RESP_ERR_OFFSET_OUT_OF_RANGE:
  case RD_KAFKA_RESP_ERR__FATAL:
  case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
  case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
  case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
    sl_ctx_fail(ctx, "topic %s partition %" PRId32 " offset %" PRId64 ": %s",
                k->src->topic, id, p ? p->next_offset : m->offset,
                rd_kafka_message_errstr(m));
    return EIO;
  default: /* transient: librdkafka retries */
    sl_log(SL_LOG_WARN, "kafka source %s: topic %s: %s", sl_ctx_name(ctx),
           k->src->topic, rd_kafka_message_errstr(m));
    return 0;
  }
}

/* Note 5.  Returns 0 or the write's error. */
static int watermark_tick(sl_ctx *ctx, kafka_instance *k) {
  const sl_kafka_source_config *cfg = &k->src->cfg;
  uint64_t now = sl_now_ns(), idle_ns = cfg->idle_timeout_ms * UINT64_C(1000000);
  int64_t low = SL_WATERMARK_MAX;
  bool live = false, active = false;
  for (uint32_t i = 0; i < k->part_count; i++) {
    const kafka_partition *p = &k->parts[i];
    if (p->end_offset >= 0 && p->next_offset >= p->end_offset)
      continue; /* finished */
    live = true;
    if (idle_ns && p->at_end && now - p->last_message_ns >= idle_ns)
      continue;
    active = true;
    int64_t w = p->max_time == SL_NO_TIMESTAMP
                    ? SL_WATERMARK_MIN
                    : sl_time_sub_sat(sl_time_sub_sat(p->max_time,
                                                      cfg->out_of_orderness), 1);
    if (w < low)
      low = w;
  }
  /* An instance with no partition (more instances than partitions) has
   * nothing to wait for: idle at once. */
  if (!active && (live || k->part_count == 0)) {
    if (ctx->output_idle || ctx->output_count == 0)
      return 0;
    ctx->output_idle = true;
    return sl_instance_write_control(ctx, SL_ENTRY_IDLE, 1);
  }
  if (!active || low <= SL_WATERMARK_MIN || low <= ctx->watermark)
    return 0;
  return sl_emit_watermark(ctx, low);
}

/* ------------------------------------------------------------ callbacks */

static void kafka_close(sl_ctx *ctx, void *state);

/* Note 8: PATH, or PATH.i for instance i of more than one; emptied unless
 * a checkpoint is restored (kafka_restore cuts it back then).  Returns 0
 * or the open's error (the instance failed). */
static int dead_letters_open(sl_ctx *ctx, kafka_instance *k) {
  const char *path = k->src->dead_letter_path;
  if (!path)
    return 0;
  if (sl_ctx_parallelism(ctx) > 1)
    snprintf(k->dead_path, sizeof k->dead_path, "%s.%d", path,
             sl_ctx_instance(ctx));
  else
    snprintf(k->dead_path, sizeof k->dead_path, "%s", path);
  k->dead.path = k->dead_path;
  return io_dead_letter_open(ctx, &k->dead, ctx->cp.restored_from == 0);
}

static int kafka_open(sl_ctx *ctx, void *user, void **state) {
  kafka_instance *k = calloc(1, sizeof *k);
  if (!k)
    return ENOMEM;
  k->src = user;
  *state = k;
  int rc = dead_letters_open(ctx, k);
  if (rc == 0)
    rc = consumer_new(ctx, k);
  if (rc == 0)
    rc = topic_partitions(ctx, k, wait_ms(k));
  if (rc == 0)
    rc = assign_partitions(ctx, k);
  if (rc == 0 && k->src->cfg.commit_offsets) {
    k->commit_results = rd_kafka_queue_new(k->consumer);
    rc = k->commit_results ? 0 : ENOMEM;
  }
  if (rc) { /* close runs only after an open that succeeded */
    kafka_close(ctx, k);
    *state = NULL;
  }
  return rc;
}

static int kafka_next(sl_ctx *ctx, void *state) {
  kafka_instance *k = state;
  if (!k->assigned) {
    int rc = start_reading(ctx, k);
    if (rc)
      return rc;
  }
  bool finished = k->src->cfg.bounded;
  for (uint32_t i = 0; finished && i < k->part_count; i++)
    finished = k->parts[i].end_offset >= 0 && /* resolved */
               k->parts[i].next_offset >= k->parts[i].end_offset;
  if (finished)
    return SL_SOURCE_END;
  uint32_t emitted = 0;
  for (uint32_t n = 0; n < KAFKA_RECORDS_PER_CALL; n++) { /* bounded */
    rd_kafka_message_t *m =
        rd_kafka_consumer_poll(k->consumer, n == 0 ? KAFKA_POLL_MS : 0);
    if (!m)
      break;
    int rc = 0;
    int32_t id = m->partition;
    kafka_partition *p = !m->err && id >= 0 && id < k->topic_partitions &&
                                 k->index_of[id] >= 0
                             ? &k->parts[k->index_of[id]]
                             : NULL;
    if (m->err)
      rc = take_event(ctx, k, m);
    else if (p && (p->end_offset < 0 || m->offset < p->end_offset) &&
             (p->next_offset < 0 || m->offset >= p->next_offset)) {
      p->at_end = false;
      p->last_message_ns = sl_now_ns();
      rc = take_message(ctx, k, p, m);
      emitted += rc == 0;
    }
    rd_kafka_message_destroy(m);
    if (rc)
      return rc;
  }
  if (emitted)
    ctx->output_idle = false; /* records made the outputs active */
  int rc = k->src->cfg.watermarks ? watermark_tick(ctx, k) : 0;
  return rc;
}

/* Notes 2, 3, 6. */
static int kafka_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  kafka_instance *k = state;
  if (!k->assigned) { /* a barrier before the first next(): resolve now */
    int rc = start_reading(ctx, k);
    if (rc)
      return rc;
  }
  /* Note 8: the entries before the barrier are durable before the
   * checkpoint that counts them can complete. */
  int synced = io_dead_letter_sync(ctx, &k->dead);
  if (synced)
    return synced;
  uint32_t words = KAFKA_HEAD_WORDS + KAFKA_PARTITION_WORDS * k->part_count;
  uint64_t *data = malloc(words * sizeof *data);
  if (!data)
    return ENOMEM;
  data[0] = KAFKA_MAGIC;
  data[1] = KAFKA_VERSION;
  data[2] = sl_hash_bytes(k->src->topic, strlen(k->src->topic));
  data[3] = k->part_count;
  data[4] = k->dead.path ? k->dead.bytes : 0;
  for (uint32_t i = 0; i < k->part_count; i++) {
    uint64_t *at = data + KAFKA_HEAD_WORDS + KAFKA_PARTITION_WORDS * i;
    at[0] = (uint64_t)k->parts[i].id;
    at[1] = (uint64_t)k->parts[i].next_offset;
    at[2] = (uint64_t)k->parts[i].end_offset;
    at[3] = (uint64_t)k->parts[i].max_time;
  }
  int rc = sl_operator_state_set(ctx, data, words * 8u);
  free(data);
  if (rc || !k->src->cfg.commit_offsets)
    return rc;
  if (id == 0) /* the final snapshot (note 6; wal_sink.c note 5) */
    id = ctx->cp.max_seen_id + 1;
  kafka_commit *slot = &k->commits[id % KAFKA_COMMIT_RING];
  int64_t *offsets = realloc(slot->offsets, (k->part_count + 1) * sizeof *offsets);
  if (!offsets)
    return 0; /* monitoring only (note 6): this one is not committed */
  for (uint32_t i = 0; i < k->part_count; i++)
    offsets[i] = k->parts[i].next_offset;
  slot->offsets = offsets;
  slot->checkpoint_id = id;
  return 0;
}

/* Note 6: take the result of the commit in flight if it comes within
 * wait_ms (0: only look).  Returns whether no commit is in flight now. */
static bool commit_result(sl_ctx *ctx, kafka_instance *k, int wait_ms) {
  uint64_t deadline_ns = sl_now_ns() + (uint64_t)wait_ms * 1000000u;
  while (k->in_flight_id) { /* bounded by the deadline */
    uint64_t now_ns = sl_now_ns();
    int left_ms = now_ns < deadline_ns
                      ? (int)((deadline_ns - now_ns + 999999u) / 1000000u)
                      : 0;
    rd_kafka_event_t *ev = rd_kafka_queue_poll(k->commit_results, left_ms);
    if (!ev)
      return false;
    if (rd_kafka_event_type(ev) == RD_KAFKA_EVENT_OFFSET_COMMIT) {
      if (rd_kafka_event_error(ev))
        sl_log(SL_LOG_WARN, "kafka source %s: committing the offsets of "
               "checkpoint %" PRIu64 " of topic %s to group %s: %s "
               "(monitoring only)", sl_ctx_name(ctx), k->in_flight_id,
               k->src->topic, k->src->group_id,
               rd_kafka_event_error_string(ev));
      k->in_flight_id = 0;
    }
    rd_kafka_event_destroy(ev);
  }
  return true;
}

/* Note 6: unless a commit is in flight, commit the newest entry of a
 * completed checkpoint, asynchronously, and forget it and the older
 * ones.  A refused request loses nothing: the next completion tries its
 * own entry. */
static void commit_next(kafka_instance *k) {
  if (k->in_flight_id || !k->commit_results)
    return;
  kafka_commit *best = NULL;
  for (uint32_t i = 0; i < KAFKA_COMMIT_RING; i++) {
    kafka_commit *c = &k->commits[i];
    if (c->checkpoint_id && c->checkpoint_id <= k->completed_id &&
        (!best || c->checkpoint_id > best->checkpoint_id))
      best = c;
  }
  if (!best)
    return;
  rd_kafka_topic_partition_list_t *list =
      rd_kafka_topic_partition_list_new((int)k->part_count);
  for (uint32_t i = 0; i < k->part_count; i++)
    if (best->offsets[i] >= 0) /* a number: something was read */
      rd_kafka_topic_partition_list_add(list, k->src->topic, k->parts[i].id)
          ->offset = best->offsets[i];
  /* Asynchronous: the result comes on commit_results. */
  if (list->cnt &&
      rd_kafka_commit_queue(k->consumer, list, k->commit_results, NULL,
                            NULL) == 0)
    k->in_flight_id = best->checkpoint_id;
  rd_kafka_topic_partition_list_destroy(list);
  uint64_t done = best->checkpoint_id;
  for (uint32_t i = 0; i < KAFKA_COMMIT_RING; i++)
    if (k->commits[i].checkpoint_id <= done)
      k->commits[i].checkpoint_id = 0;
}

static void kafka_complete(sl_ctx *ctx, void *state, uint64_t id) {
  kafka_instance *k = state;
  if (!k->commit_results)
    return;
  if (id > k->completed_id)
    k->completed_id = id;
  commit_result(ctx, k, 0);
  commit_next(k);
}

/* Note 6: at close, at most KAFKA_CLOSE_COMMIT_MS for the commit in
 * flight and the one after it. */
static void commit_last(sl_ctx *ctx, kafka_instance *k) {
  uint64_t deadline_ns = sl_now_ns() + KAFKA_CLOSE_COMMIT_MS * UINT64_C(1000000);
  for (;;) { /* bounded by the deadline; each pass takes a result */
    commit_next(k);
    uint64_t now_ns = sl_now_ns();
    if (!k->in_flight_id || now_ns >= deadline_ns)
      break;
    commit_result(ctx, k, (int)((deadline_ns - now_ns) / 1000000u));
  }
  if (k->in_flight_id)
    sl_log(SL_LOG_WARN, "kafka source %s: the commit of the offsets of "
           "checkpoint %" PRIu64 " to group %s had no answer within %d ms of "
           "the close; the consumer's close waits at most %d ms more "
           "(monitoring only)", sl_ctx_name(ctx), k->in_flight_id,
           k->src->group_id, KAFKA_CLOSE_COMMIT_MS, KAFKA_CLOSE_GROUP_MS);
}

/* The state directory for an error text (never NULL). */
static const char *state_dir_name(const sl_ctx *ctx) {
  const char *dir = ctx->job->config.checkpoint.state_dir;
  return dir ? dir : "(no state directory)";
}

/* Note 7. */
static int kafka_restore(sl_ctx *ctx, void *state, uint64_t id) {
  kafka_instance *k = state;
  const void *data;
  uint32_t bytes;
  int rc = sl_operator_state_get(ctx, &data, &bytes);
  if (rc == SL_ENOTFOUND) /* nothing saved: no dead letter either */
    return io_dead_letter_truncate(ctx, &k->dead, id, 0);
  if (rc)
    return rc;
  const char *wrong = NULL;
  uint64_t head[KAFKA_HEAD_WORDS] = {0};
  if (bytes < sizeof head || bytes % 8)
    wrong = "its length is not that of a Kafka position";
  else if (memcpy(head, data, sizeof head), head[0] != KAFKA_MAGIC ||
           head[1] != KAFKA_VERSION)
    wrong = "it is not a Kafka source position of version 2";
  else if (head[2] != sl_hash_bytes(k->src->topic, strlen(k->src->topic)))
    wrong = "it was saved for another topic";
  else if (head[3] > bytes / 8 ||
           bytes != 8 * (KAFKA_HEAD_WORDS + KAFKA_PARTITION_WORDS * head[3]))
    wrong = "its partition count does not match its length";
  for (uint64_t i = 0; !wrong && i < head[3]; i++) {
    uint64_t w[KAFKA_PARTITION_WORDS];
    memcpy(w, (const uint8_t *)data + 8 * (KAFKA_HEAD_WORDS +
                                           KAFKA_PARTITION_WORDS * i), sizeof w);
    int64_t pid = (int64_t)w[0], next = (int64_t)w[1], end = (int64_t)w[2];
    int64_t max_time = (int64_t)w[3];
    if (pid < 0 || pid >= k->topic_partitions || k->index_of[pid] < 0) {
      /* Either the saved id is damaged or the list or parallelism
       * changed: nothing read back is trusted (note 7). */
      sl_ctx_fail(ctx, "%s: checkpoint %" PRIu64 ": topic %s partition %"
                  PRId64 " is saved for this instance, which does not read "
                  "it (a damaged position, or the partition list or the "
                  "parallelism changed)", state_dir_name(ctx), id,
                  k->src->topic, pid);
      return SL_ECORRUPT;
    }
    kafka_partition *p = &k->parts[k->index_of[pid]];
    if (p->restored || (next < 0 && next != RD_KAFKA_OFFSET_BEGINNING) ||
        end < -1 || (end >= 0 && next > end))
      wrong = "a partition is saved twice or with a bad offset";
    else if (max_time != SL_NO_TIMESTAMP &&
             (max_time < SL_TIME_MIN_VALID || max_time > SL_TIME_MAX_VALID))
      wrong = "a partition's largest time is outside the valid range";
    else
      *p = (kafka_partition){.id = p->id, .next_offset = next,
                             .end_offset = end, .max_time = max_time,
                             .last_message_ns = sl_now_ns(), .restored = true};
  }
  if (!wrong) /* note 8: the replay writes the later entries again */
    return io_dead_letter_truncate(ctx, &k->dead, id, head[4]);
  sl_ctx_fail(ctx, "%s: checkpoint %" PRIu64 ": the saved position of Kafka "
              "topic %s is damaged: %s", state_dir_name(ctx), id,
              k->src->topic, wrong);
  return SL_ECORRUPT;
}

static void *consumer_destroy_main(void *consumer) {
  rd_kafka_destroy_flags(consumer, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
  return NULL;
}

/* Note 6: close the consumer, waiting at most KAFKA_CLOSE_GROUP_MS; one
 * not closed by then is destroyed by a detached thread.  The consumer is
 * gone (or going) on return. */
static void consumer_close_bounded(sl_ctx *ctx, kafka_instance *k) {
  rd_kafka_queue_t *events = rd_kafka_queue_new(k->consumer);
  rd_kafka_error_t *error =
      events ? rd_kafka_consumer_close_queue(k->consumer, events) : NULL;
  if (!events || error) { /* cannot close asynchronously: librdkafka's way */
    if (error)
      rd_kafka_error_destroy(error);
    if (events)
      rd_kafka_queue_destroy(events);
    rd_kafka_destroy(k->consumer);
    return;
  }
  uint64_t deadline_ns =
      sl_now_ns() + KAFKA_CLOSE_GROUP_MS * UINT64_C(1000000);
  while (!rd_kafka_consumer_closed(k->consumer) &&
         sl_now_ns() < deadline_ns) { /* bounded by the deadline */
    rd_kafka_event_t *ev = rd_kafka_queue_poll(events, 10);
    if (ev) /* no group, so no rebalance: nothing to act on */
      rd_kafka_event_destroy(ev);
  }
  bool closed = rd_kafka_consumer_closed(k->consumer);
  rd_kafka_queue_destroy(events);
  pthread_t thread;
  pthread_attr_t attr;
  if (closed || pthread_attr_init(&attr) != 0) {
    rd_kafka_destroy_flags(k->consumer, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
    return;
  }
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int rc = pthread_create(&thread, &attr, consumer_destroy_main, k->consumer);
  pthread_attr_destroy(&attr);
  sl_log(SL_LOG_WARN, "kafka source %s: the consumer of topic %s did not "
         "close within %d ms (an offset commit without an answer); %s",
         sl_ctx_name(ctx), k->src->topic, KAFKA_CLOSE_GROUP_MS,
         rc == 0 ? "a thread of its own destroys it when librdkafka lets it"
                 : "waiting for librdkafka (no thread could be made)");
  if (rc != 0)
    rd_kafka_destroy_flags(k->consumer, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
}

static void kafka_close(sl_ctx *ctx, void *state) {
  kafka_instance *k = state;
  if (k->commit_results) {
    commit_last(ctx, k);
    rd_kafka_queue_destroy(k->commit_results);
  }
  if (k->consumer) /* no group was joined (note 1) */
    consumer_close_bounded(ctx, k);
  for (uint32_t i = 0; i < KAFKA_COMMIT_RING; i++)
    free(k->commits[i].offsets);
  io_dead_letter_close(&k->dead);
  free(k->parts);
  free(k->index_of);
  free(k);
}

/* ------------------------------------------------------------ builder */

static void source_free(void *user) {
  kafka_source *src = user;
  if (!src)
    return;
  free(src->bootstrap);
  free(src->topic);
  free(src->group_id);
  free(src->partitions);
  free(src->dead_letter_path);
  kafka_properties_free(&src->properties);
  free(src);
}

/* The configuration, checked, into a copy.  Returns 0, EINVAL (why set)
 * or ENOMEM. */
static int source_copy(sl_job *job, const char *name,
                       const sl_kafka_source_config *cfg, kafka_source **out,
                       char *why, size_t why_bytes) {
  if (!cfg->bootstrap || !cfg->bootstrap[0] || !cfg->topic || !cfg->topic[0])
    return op_errorf(EINVAL, why, why_bytes, "bootstrap and topic are required");
  if (cfg->start < SL_KAFKA_EARLIEST || cfg->start > SL_KAFKA_COMMITTED)
    return op_errorf(EINVAL, why, why_bytes, "start %d is not an enum "
                     "sl_kafka_start", cfg->start);
  if (cfg->out_of_orderness < 0)
    return op_errorf(EINVAL, why, why_bytes, "out_of_orderness is negative");
  if (cfg->dead_letter_path && (!cfg->dead_letter_path[0] ||
                                strlen(cfg->dead_letter_path) >=
                                    KAFKA_PATH_BYTES))
    return op_errorf(EINVAL, why, why_bytes, "dead_letter_path is empty or "
                     "longer than %d bytes", KAFKA_PATH_BYTES - 1);
  int64_t max_id;
  int rc = partition_list_check(cfg->partitions, &max_id, why, why_bytes);
  if (rc)
    return rc;
  kafka_source *src = calloc(1, sizeof *src);
  if (!src)
    return ENOMEM;
  /* Note 2 (read_committed offsets, the EOF position), note 6 (commits
   * only by the source) and consumer_new's auto.offset.reset=error. */
  static const char *const reserved[] = {
      "isolation.level", "auto.offset.reset", "enable.auto.commit",
      "enable.auto.offset.store", "enable.partition.eof", NULL};
  rc = kafka_properties_copy(cfg->properties, reserved, &src->properties, why,
                             why_bytes);
  if (rc) {
    free(src);
    return rc;
  }
  src->cfg = *cfg;
  char group[2 * SL_MAX_NAME + 16];
  snprintf(group, sizeof group, "sluice-%s-%s",
           job->config.name ? job->config.name : "sluice", name ? name : "");
  src->bootstrap = strdup(cfg->bootstrap);
  src->topic = strdup(cfg->topic);
  src->group_id = strdup(cfg->group_id ? cfg->group_id : group);
  src->partitions = strdup(cfg->partitions ? cfg->partitions : "");
  if (cfg->dead_letter_path)
    src->dead_letter_path = strdup(cfg->dead_letter_path);
  if (!src->bootstrap || !src->topic || !src->group_id || !src->partitions ||
      (cfg->dead_letter_path && !src->dead_letter_path)) {
    source_free(src);
    return ENOMEM;
  }
  src->cfg.bootstrap = src->bootstrap;
  src->cfg.topic = src->topic;
  src->cfg.group_id = src->group_id;
  src->cfg.partitions = src->partitions;
  src->cfg.dead_letter_path = src->dead_letter_path;
  src->cfg.properties = NULL; /* src->properties holds them */
  *out = src;
  return 0;
}

SL_EXPORT int sl_source_kafka(sl_job *job, const char *name, int parallelism,
                              const sl_kafka_source_config *cfg, sl_op **op) {
  if (!job || !op)
    return EINVAL;
  *op = NULL;
  if (atomic_load(&job->state) != SL_JOB_BUILDING)
    return SL_ESTARTED;
  if (!cfg) {
    sl_job_set_error(job, "kafka source '%s': no configuration",
                     name ? name : "(null)");
    return EINVAL;
  }
  char why[256];
  kafka_source *src = NULL;
  int rc = source_copy(job, name, cfg, &src, why, sizeof why);
  if (rc == EINVAL)
    sl_job_set_error(job, "kafka source '%s': %s", name ? name : "(null)", why);
  if (rc)
    return rc;
  static const sl_source_ops ops = {.open = kafka_open,
                                    .next = kafka_next,
                                    .close = kafka_close,
                                    .snapshot = kafka_snapshot,
                                    .restore = kafka_restore,
                                    .checkpoint_complete = kafka_complete};
  rc = sl_op_source(job, name, parallelism, &ops, src, op);
  return op_adopt(rc, op, src, source_free);
}
