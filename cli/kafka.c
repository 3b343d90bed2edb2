/* kafka.c — `sluice kafka`: a mock Kafka cluster to test against, and a
 * dump of what a topic holds.
 *
 *   sluice kafka mock [--brokers N] [--port 0] [--topic NAME:PARTITIONS]...
 *   sluice kafka dump BOOTSTRAP/TOPIC [--timeout-ms MS]
 *
 * and the Kafka ends of `sluice nexmark` (cli/nexmark.c): gen into a topic,
 * run from a topic (kafka_nexmark_gen, kafka_nexmark_source).
 *
 * NOTES ON THE DESIGN
 *
 * 1. The mock is librdkafka's own mock cluster (rdkafka_mock.h), in a
 *    process of its own, so a test can SIGKILL sluice while the log
 *    survives.  It runs in the foreground until SIGTERM or SIGINT.  Its
 *    first line on stdout, flushed, is `bootstrap: HOST:PORT,...`.
 * 2. librdkafka 2.0.2's mock listens on ports it picks itself (127.0.0.1,
 *    port 0): --port takes 0 only and says so for any other value.
 * 3. The mock cannot create topics through the admin API (CreateTopics is
 *    not among the requests it answers), and a topic it creates on first
 *    use has 4 partitions.  So topics with a chosen partition count come
 *    from --topic NAME:PARTITIONS, or from the control line below.
 * 4. Control: while it runs, the mock reads lines on its standard input,
 *    one command each, and answers each with one line on stdout, `ok` or
 *    `error: WHY`:
 *      topic NAME PARTITIONS        create a topic
 *      errors API COUNT CODE        the next COUNT requests of protocol
 *                                   API key API (0 Produce, 1 Fetch, 8
 *                                   OffsetCommit, ...) fail with CODE (a
 *                                   librdkafka rd_kafka_resp_err_t; -195 is
 *                                   a disconnect)
 *      down BROKER / up BROKER      take a broker (1 .. N) down or up
 *    The end of standard input ends only the control: the mock runs on
 *    until a signal, so `sluice kafka mock </dev/null &` works.
 * 5. The dump reads with isolation.level=read_committed, partition by
 *    partition in partition order, from the beginning up to the end
 *    offsets the topic had when the dump started, and exits.  Every wait
 *    is bounded (--timeout-ms, default 30 s): a cluster that does not
 *    answer is an error naming what was waited for, never a hang.
 * 6. `nexmark gen --kafka`: event n goes to partition n % K with its
 *    date_time as the message's Kafka timestamp, so each partition holds
 *    its events in date_time order.  The topic is looked up with a
 *    consumer handle (a producer's metadata request would create it with
 *    the cluster's default count) and created with the admin API if it is
 *    missing; an existing topic must have K partitions.
 * 7. `nexmark run --kafka-input`: the Kafka source (bounded: the topic as
 *    it was at the first start, kept in the checkpoints) with
 *    per-partition watermarks trailing by the watermark lag and no idle
 *    timeout (a partition that looks idle because its fetch is late would
 *    let the watermark pass its events); each value is parsed twice, once
 *    by the source's time function (a bad line fails the job naming the
 *    topic, partition and offset) and once by the map that encodes it.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "cli_util.h"
#include "kafka.h"
#include "nexmark.h"

#define MOCK_MAX_BROKERS 16
#define MOCK_MAX_PARTITIONS 1024
#define MOCK_LINE_BYTES 1024
#define DUMP_DEFAULT_TIMEOUT_MS 30000u

static void kafka_usage(FILE *out) {
  fprintf(out,
          "usage: sluice kafka mock [--brokers N] [--port 0] [--topic NAME:PARTITIONS]...\n"
          "       sluice kafka dump BOOTSTRAP/TOPIC [--timeout-ms MS]\n"
          "\n"
          "mock: a librdkafka mock cluster of N brokers (default 1) until SIGTERM\n"
          "  or SIGINT.  First line on stdout: `bootstrap: HOST:PORT,...`.  Topics\n"
          "  made on first use have 4 partitions; --topic makes one with more or\n"
          "  fewer.  Lines on stdin control it (each answered `ok` or `error: ...`):\n"
          "    topic NAME PARTITIONS | errors API COUNT CODE | down B | up B\n"
          "  (docs/kafka.md).  The mock picks its own ports: --port takes 0 only.\n"
          "dump: every committed message value (read_committed) of every\n"
          "  partition of TOPIC, partition by partition, one per line, up to the\n"
          "  end the topic had when the dump started; waits at most MS ms\n"
          "  (default 30000) for the cluster.\n");
}

int kafka_split_address(const char *text, char *bootstrap,
                        size_t bootstrap_bytes, char *topic,
                        size_t topic_bytes) {
  const char *slash = text ? strrchr(text, '/') : NULL;
  if (!slash || slash == text || slash[1] == '\0')
    return EINVAL;
  size_t head = (size_t)(slash - text);
  if (head >= bootstrap_bytes || strlen(slash + 1) >= topic_bytes)
    return EINVAL;
  memcpy(bootstrap, text, head);
  bootstrap[head] = '\0';
  strcpy(topic, slash + 1);
  return 0;
}

/* ------------------------------------------------------------ mock */

/* NAME:PARTITIONS into a topic of the mock.  Returns 0 or prints why. */
static int mock_topic(rd_kafka_mock_cluster_t *mock, const char *name,
                      uint64_t partitions, FILE *answer) {
  if (partitions < 1 || partitions > MOCK_MAX_PARTITIONS || !name[0]) {
    fprintf(answer, "error: a topic needs a name and 1 .. %d partitions\n",
            MOCK_MAX_PARTITIONS);
    return EINVAL;
  }
  rd_kafka_resp_err_t err =
      rd_kafka_mock_topic_create(mock, name, (int)partitions, 1);
  if (err) {
    fprintf(answer, "error: topic %s: %s\n", name, rd_kafka_err2str(err));
    return EINVAL;
  }
  return 0;
}

/* One control line (note 4); the answer goes to stdout. */
static void mock_command(rd_kafka_mock_cluster_t *mock, char *line,
                         int brokers) {
  char word[32] = "", name[256] = "";
  long long a = 0, b = 0, c = 0;
  int rc = EINVAL;
  if (sscanf(line, "%31s", word) != 1) {
    printf("error: empty command\n");
  } else if (strcmp(word, "topic") == 0) {
    if (sscanf(line, "%*s %255s %lld", name, &a) == 2)
      rc = mock_topic(mock, name, a > 0 ? (uint64_t)a : 0, stdout);
    else
      printf("error: usage: topic NAME PARTITIONS\n");
  } else if (strcmp(word, "errors") == 0) {
    if (sscanf(line, "%*s %lld %lld %lld", &a, &b, &c) == 3 && a >= 0 &&
        a < 100 && b >= 1 && b <= 1000 && c >= -200 && c < 200) {
      rd_kafka_resp_err_t codes[1000];
      for (long long i = 0; i < b; i++) /* b <= 1000 */
        codes[i] = (rd_kafka_resp_err_t)c;
      rd_kafka_mock_push_request_errors_array(mock, (int16_t)a, (size_t)b,
                                              codes);
      rc = 0;
    } else {
      printf("error: usage: errors API(0..99) COUNT(1..1000) CODE\n");
    }
  } else if (strcmp(word, "down") == 0 || strcmp(word, "up") == 0) {
    if (sscanf(line, "%*s %lld", &a) == 1 && a >= 1 && a <= brokers) {
      rd_kafka_resp_err_t err =
          word[0] == 'd' ? rd_kafka_mock_broker_set_down(mock, (int32_t)a)
                         : rd_kafka_mock_broker_set_up(mock, (int32_t)a);
      if (err)
        printf("error: broker %lld: %s\n", a, rd_kafka_err2str(err));
      rc = err ? EINVAL : 0;
    } else {
      printf("error: usage: %s BROKER (1 .. %d)\n", word, brokers);
    }
  } else {
    printf("error: unknown command '%s' (topic, errors, down, up)\n", word);
  }
  if (rc == 0)
    printf("ok\n");
  fflush(stdout);
}

/* Serve until SIGTERM or SIGINT (delivered through fd), reading control
 * lines from stdin until its end (note 4). */
static int mock_serve(rd_kafka_mock_cluster_t *mock, int signal_fd,
                      int brokers) {
  char line[MOCK_LINE_BYTES];
  size_t used = 0;
  bool control = true;
  for (;;) { /* ends on a signal */
    struct pollfd fds[2] = {{.fd = signal_fd, .events = POLLIN},
                            {.fd = STDIN_FILENO, .events = POLLIN}};
    int n = poll(fds, control ? 2 : 1, -1);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      fprintf(stderr, "sluice kafka mock: poll: %s\n", strerror(errno));
      return 1;
    }
    if (fds[0].revents)
      return 0;
    if (!control || !fds[1].revents)
      continue;
    ssize_t got = read(STDIN_FILENO, line + used, sizeof line - 1 - used);
    if (got <= 0) {
      control = false; /* end of the control, not of the mock */
      continue;
    }
    used += (size_t)got;
    line[used] = '\0';
    char *newline;
    while ((newline = strchr(line, '\n')) != NULL) { /* bounded by used */
      *newline = '\0';
      mock_command(mock, line, brokers);
      size_t rest = used - (size_t)(newline + 1 - line);
      memmove(line, newline + 1, rest + 1);
      used = rest;
    }
    if (used == sizeof line - 1) {
      printf("error: a command longer than %d bytes\n", MOCK_LINE_BYTES - 2);
      fflush(stdout);
      used = 0;
    }
  }
}

static int mock_main(int argc, char **argv) {
  uint64_t brokers = 1;
  const char *topics[64];
  int topic_count = 0;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      kafka_usage(stdout);
      return 0;
    }
    /* The name first: a wrong flag is named as unknown, not as short of
     * a value. */
    if (strcmp(a, "--brokers") != 0 && strcmp(a, "--port") != 0 &&
        strcmp(a, "--topic") != 0)
      die_usage("kafka mock: unknown option '%s'", a);
    if (!v)
      die_usage("kafka mock: %s needs a value", a);
    i++;
    if (strcmp(a, "--brokers") == 0) {
      brokers = parse_u64(a, v, 1, MOCK_MAX_BROKERS);
    } else if (strcmp(a, "--port") == 0) {
      if (parse_u64(a, v, 0, 65535) != 0) /* note 2 */
        die_usage("kafka mock: --port: librdkafka's mock cluster listens on "
                  "ports it picks itself; only 0 (any) is possible");
    } else if (strcmp(a, "--topic") == 0) {
      if (topic_count == (int)(sizeof topics / sizeof *topics))
        die_usage("kafka mock: more than 64 --topic");
      topics[topic_count++] = v;
    }
  }
  /* SIGTERM and SIGINT come through a signalfd: blocked before the
   * librdkafka threads start, so they inherit the mask and the signal
   * waits for the main thread's poll. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  int signal_fd = signalfd(-1, &set, SFD_CLOEXEC);
  if (signal_fd < 0) {
    fprintf(stderr, "sluice kafka mock: signalfd: %s\n", strerror(errno));
    return 1;
  }
  char err[512];
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  /* The handle only hosts the cluster; it never connects anywhere. */
  rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
  rd_kafka_t *host = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  if (!host) {
    fprintf(stderr, "sluice kafka mock: %s\n", err);
    return 1;
  }
  rd_kafka_mock_cluster_t *mock = rd_kafka_mock_cluster_new(host, (int)brokers);
  if (!mock) {
    fprintf(stderr, "sluice kafka mock: librdkafka could not make a mock "
                    "cluster of %" PRIu64 " brokers\n", brokers);
    rd_kafka_destroy(host);
    return 1;
  }
  int rc = 0;
  for (int t = 0; t < topic_count && rc == 0; t++) {
    char name[256];
    unsigned long long partitions = 0;
    const char *colon = strrchr(topics[t], ':');
    char *end = NULL;
    if (colon && colon[1] >= '0' && colon[1] <= '9') /* digits only */
      partitions = strtoull(colon + 1, &end, 10);
    if (!colon || colon == topics[t] || (size_t)(colon - topics[t]) >= sizeof name ||
        !end || *end != '\0') {
      fprintf(stderr, "sluice kafka mock: --topic %s: expected "
                      "NAME:PARTITIONS\n", topics[t]);
      rc = 2;
      break;
    }
    memcpy(name, topics[t], (size_t)(colon - topics[t]));
    name[colon - topics[t]] = '\0';
    if (mock_topic(mock, name, partitions, stderr))
      rc = 2;
  }
  if (rc == 0) {
    printf("bootstrap: %s\n", rd_kafka_mock_cluster_bootstraps(mock));
    fflush(stdout);
    rc = mock_serve(mock, signal_fd, (int)brokers);
  }
  rd_kafka_mock_cluster_destroy(mock);
  rd_kafka_destroy(host);
  close(signal_fd);
  return rc;
}

/* ------------------------------------------------------------ dump */

static int64_t now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* The number of partitions of topic, within timeout_ms.  Returns it, or
 * -1 with the reason printed. */
static int dump_partitions(rd_kafka_t *rk, const char *topic,
                           uint32_t timeout_ms) {
  rd_kafka_topic_t *handle = rd_kafka_topic_new(rk, topic, NULL);
  if (!handle) {
    fprintf(stderr, "sluice kafka dump: topic %s: %s\n", topic,
            rd_kafka_err2str(rd_kafka_last_error()));
    return -1;
  }
  const struct rd_kafka_metadata *md = NULL;
  rd_kafka_resp_err_t err = rd_kafka_metadata(rk, 0, handle, &md, (int)timeout_ms);
  int partitions = -1;
  if (err)
    fprintf(stderr, "sluice kafka dump: the metadata of topic %s: %s\n", topic,
            rd_kafka_err2str(err));
  else if (md->topic_cnt != 1 || md->topics[0].err)
    fprintf(stderr, "sluice kafka dump: topic %s: %s\n", topic,
            rd_kafka_err2str(md->topic_cnt ? md->topics[0].err
                                           : RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC));
  else
    partitions = md->topics[0].partition_cnt;
  if (md)
    rd_kafka_metadata_destroy(md);
  rd_kafka_topic_destroy(handle);
  return partitions;
}

/* Print partition's values from its start up to end (note 5).  Returns 0
 * or 1 with the reason printed. */
static int dump_partition(rd_kafka_t *rk, const char *topic, int partition,
                          int64_t deadline_ms) {
  int64_t low, high;
  int64_t left = deadline_ms - now_ms();
  rd_kafka_resp_err_t err = rd_kafka_query_watermark_offsets(
      rk, topic, partition, &low, &high, left > 0 ? (int)left : 1);
  if (err) {
    fprintf(stderr, "sluice kafka dump: %s partition %d: the end offsets: "
                    "%s\n", topic, partition, rd_kafka_err2str(err));
    return 1;
  }
  if (high <= low)
    return 0;
  rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(list, topic, partition)->offset = low;
  err = rd_kafka_assign(rk, list);
  rd_kafka_topic_partition_list_destroy(list);
  int rc = 0;
  int64_t next = low;
  while (rc == 0 && err == 0 && next < high) { /* ends: deadline */
    left = deadline_ms - now_ms();
    if (left <= 0) {
      fprintf(stderr, "sluice kafka dump: %s partition %d: no message at "
                      "offset %" PRId64 " (end %" PRId64 ") in time\n", topic,
              partition, next, high);
      rc = 1;
      break;
    }
    rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, left < 100 ? (int)left : 100);
    if (!m)
      continue;
    if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
      /* Under read_committed the end can stop below the high watermark
       * (the last offsets are transaction markers or open). */
      next = high;
    } else if (m->err) {
      fprintf(stderr, "sluice kafka dump: %s partition %d: %s\n", topic,
              partition, rd_kafka_message_errstr(m));
      rc = 1;
    } else {
      fwrite(m->payload, 1, m->len, stdout);
      putchar('\n');
      next = m->offset + 1;
    }
    rd_kafka_message_destroy(m);
  }
  if (err) {
    fprintf(stderr, "sluice kafka dump: %s partition %d: assign: %s\n", topic,
            partition, rd_kafka_err2str(err));
    rc = 1;
  }
  rd_kafka_assign(rk, NULL);
  return rc;
}

static int dump_main(int argc, char **argv) {
  const char *address = NULL;
  uint32_t timeout_ms = DUMP_DEFAULT_TIMEOUT_MS;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      kafka_usage(stdout);
      return 0;
    }
    if (strcmp(argv[i], "--timeout-ms") == 0) {
      if (i + 1 == argc)
        die_usage("kafka dump: --timeout-ms needs a value");
      timeout_ms = (uint32_t)parse_u64(argv[i], argv[i + 1], 1, 3600000);
      i++;
    } else if (argv[i][0] == '-' || address) {
      die_usage("kafka dump: unexpected '%s'", argv[i]);
    } else {
      address = argv[i];
    }
  }
  char bootstrap[4096], topic[256], err[512];
  if (!address || kafka_split_address(address, bootstrap, sizeof bootstrap,
                                      topic, sizeof topic))
    die_usage("kafka dump needs BOOTSTRAP/TOPIC");
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  /* A group id only because the consumer API wants one: partitions are
   * assigned by hand and no offset is ever committed. */
  const char *settings[][2] = {{"bootstrap.servers", bootstrap},
                               {"group.id", "sluice-kafka-dump"},
                               {"enable.auto.commit", "false"},
                               {"enable.partition.eof", "true"},
                               {"isolation.level", "read_committed"},
                               {"log_level", "3"}};
  for (size_t i = 0; i < sizeof settings / sizeof *settings; i++)
    if (rd_kafka_conf_set(conf, settings[i][0], settings[i][1], err,
                          sizeof err) != RD_KAFKA_CONF_OK) {
      fprintf(stderr, "sluice kafka dump: %s\n", err);
      rd_kafka_conf_destroy(conf);
      return 1;
    }
  rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
  if (!rk) { /* rd_kafka_new takes conf only on success */
    fprintf(stderr, "sluice kafka dump: %s\n", err);
    rd_kafka_conf_destroy(conf);
    return 1;
  }
  int64_t deadline_ms = now_ms() + timeout_ms;
  int partitions = dump_partitions(rk, topic, timeout_ms);
  int rc = partitions < 0;
  for (int p = 0; rc == 0 && p < partitions; p++)
    rc = dump_partition(rk, topic, p, deadline_ms);
  if (fflush(stdout) != 0 && rc == 0) {
    fprintf(stderr, "sluice kafka dump: standard output: %s\n",
            strerror(errno));
    rc = 1;
  }
  rd_kafka_consumer_close(rk);
  rd_kafka_destroy(rk);
  return rc;
}

/* ------------------------------------------------------------ nexmark */

#define GEN_WAIT_MS 60000

/* The partition count of topic (0: it does not exist), asked with a
 * consumer handle (note 6).  Returns 0 or prints why. */
static int gen_topic_partitions(const char *bootstrap, const char *topic,
                                int *partitions) {
  char err[512];
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  if (rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap, err,
                        sizeof err) != RD_KAFKA_CONF_OK ||
      rd_kafka_conf_set(conf, "group.id", "sluice-nexmark-gen", err,
                        sizeof err) != RD_KAFKA_CONF_OK) {
    fprintf(stderr, "sluice: nexmark gen: %s\n", err);
    rd_kafka_conf_destroy(conf);
    return 1;
  }
  rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
  rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
  if (!rk) {
    fprintf(stderr, "sluice: nexmark gen: %s\n", err);
    rd_kafka_conf_destroy(conf);
    return 1;
  }
  const struct rd_kafka_metadata *md = NULL;
  rd_kafka_topic_t *handle = rd_kafka_topic_new(rk, topic, NULL);
  rd_kafka_resp_err_t e = handle ? rd_kafka_metadata(rk, 0, handle, &md,
                                                     GEN_WAIT_MS)
                                 : rd_kafka_last_error();
  int rc = 0;
  *partitions = 0;
  if (e) {
    fprintf(stderr, "sluice: nexmark gen: the metadata of topic %s: %s\n",
            topic, rd_kafka_err2str(e));
    rc = 1;
  } else if (md->topic_cnt == 1 && !md->topics[0].err) {
    *partitions = md->topics[0].partition_cnt;
  }
  if (md)
    rd_kafka_metadata_destroy(md);
  if (handle)
    rd_kafka_topic_destroy(handle);
  rd_kafka_destroy(rk);
  return rc;
}

/* Create topic with partitions through the admin API. */
static int gen_create_topic(rd_kafka_t *rk, const char *topic,
                            int partitions) {
  char err[512];
  rd_kafka_NewTopic_t *nt =
      rd_kafka_NewTopic_new(topic, partitions, -1, err, sizeof err);
  if (!nt) {
    fprintf(stderr, "sluice: nexmark gen: topic %s: %s\n", topic, err);
    return 1;
  }
  rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
  rd_kafka_AdminOptions_t *opts =
      rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_CREATETOPICS);
  rd_kafka_AdminOptions_set_request_timeout(opts, 10000, err, sizeof err);
  rd_kafka_CreateTopics(rk, &nt, 1, opts, q);
  rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 15000);
  const char *why = !ev ? "no answer within 15 s"
                        : rd_kafka_event_error(ev) ? rd_kafka_event_error_string(ev)
                                                   : NULL;
  if (ev && !why) {
    size_t n = 0;
    const rd_kafka_topic_result_t **results = rd_kafka_CreateTopics_result_topics(
        rd_kafka_event_CreateTopics_result(ev), &n);
    if (n == 1 && rd_kafka_topic_result_error(results[0]))
      why = rd_kafka_err2str(rd_kafka_topic_result_error(results[0]));
  }
  if (why)
    fprintf(stderr, "sluice: nexmark gen: cannot create topic %s with %d "
                    "partitions: %s (on `sluice kafka mock`, which does not "
                    "create topics on request, make it with --topic %s:%d)\n",
            topic, partitions, why, topic, partitions);
  if (ev)
    rd_kafka_event_destroy(ev);
  rd_kafka_AdminOptions_destroy(opts);
  rd_kafka_queue_destroy(q);
  rd_kafka_NewTopic_destroy(nt);
  return why ? 1 : 0;
}

static void gen_report(rd_kafka_t *rk, const rd_kafka_message_t *m,
                       void *opaque) {
  (void)rk;
  if (m->err && (*(rd_kafka_resp_err_t *)opaque) == 0)
    *(rd_kafka_resp_err_t *)opaque = m->err;
}

int kafka_nexmark_gen(const nx_generator_config *gen, const char *bootstrap,
                      const char *topic, int partitions) {
  int existing = 0;
  if (gen_topic_partitions(bootstrap, topic, &existing))
    return 1;
  if (existing && existing != partitions) {
    fprintf(stderr, "sluice: nexmark gen: topic %s has %d partitions, not "
                    "%d\n", topic, existing, partitions);
    return 1;
  }
  char err[512];
  rd_kafka_resp_err_t refused = 0;
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  const char *settings[][2] = {{"bootstrap.servers", bootstrap},
                               {"enable.idempotence", "true"},
                               {"linger.ms", "20"},
                               {"log_level", "3"}};
  for (size_t i = 0; i < sizeof settings / sizeof *settings; i++)
    if (rd_kafka_conf_set(conf, settings[i][0], settings[i][1], err,
                          sizeof err) != RD_KAFKA_CONF_OK) {
      fprintf(stderr, "sluice: nexmark gen: %s\n", err);
      rd_kafka_conf_destroy(conf);
      return 1;
    }
  rd_kafka_conf_set_opaque(conf, &refused);
  rd_kafka_conf_set_dr_msg_cb(conf, gen_report);
  rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  if (!rk) {
    fprintf(stderr, "sluice: nexmark gen: %s\n", err);
    rd_kafka_conf_destroy(conf);
    return 1;
  }
  int rc = existing ? 0 : gen_create_topic(rk, topic, partitions);
  nx_generated *g = malloc(sizeof *g);
  char *line = malloc(NX_MAX_RECORD_BYTES * 7);
  if (rc == 0 && (!g || !line)) {
    fprintf(stderr, "sluice: nexmark gen: out of memory\n");
    rc = 1;
  }
  for (uint64_t n = 0; rc == 0 && n < gen->events && !refused; n++) {
    nx_generate(gen, n, g);
    size_t len = nx_json_write(&g->event, line, NX_MAX_RECORD_BYTES * 7);
    if (len > 0 && line[len - 1] == '\n')
      len--; /* one line per message, without its newline */
    int64_t time = g->event.type == NX_PERSON    ? g->event.u.person.date_time
                   : g->event.type == NX_AUCTION ? g->event.u.auction.date_time
                                                 : g->event.u.bid.date_time;
    rd_kafka_resp_err_t e;
    int64_t waited_ms = 0;
    while ((e = rd_kafka_producev(
                rk, RD_KAFKA_V_TOPIC(topic),
                RD_KAFKA_V_PARTITION((int32_t)(n % (uint64_t)partitions)),
                RD_KAFKA_V_VALUE(line, len), RD_KAFKA_V_TIMESTAMP(time),
                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END)) ==
               RD_KAFKA_RESP_ERR__QUEUE_FULL &&
           waited_ms < GEN_WAIT_MS) { /* bounded: GEN_WAIT_MS */
      rd_kafka_poll(rk, 10);
      waited_ms += 10;
    }
    if (e) {
      fprintf(stderr, "sluice: nexmark gen: topic %s: %s\n", topic,
              rd_kafka_err2str(e));
      rc = 1;
    }
  }
  if (rc == 0 && rd_kafka_flush(rk, GEN_WAIT_MS) != 0) {
    fprintf(stderr, "sluice: nexmark gen: topic %s: %d messages not "
                    "acknowledged within %d ms\n", topic,
            rd_kafka_outq_len(rk), GEN_WAIT_MS);
    rc = 1;
  }
  if (refused) {
    fprintf(stderr, "sluice: nexmark gen: topic %s: a message was refused: "
                    "%s\n", topic, rd_kafka_err2str(refused));
    rc = 1;
  }
  if (rc == 0)
    fprintf(stderr, "sluice: wrote %" PRIu64 " events to topic %s (%d "
                    "partitions)\n", gen->events, topic, partitions);
  free(g);
  free(line);
  rd_kafka_purge(rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
  rd_kafka_destroy(rk);
  return rc;
}

/* Parse buffer of each source thread (note 7). */
static _Thread_local char parse_storage[1 << 16];

/* The source's time function: the event's date_time; a line that does not
 * parse is a bad record. */
static int nexmark_time(void *user, const void *value, uint32_t value_bytes,
                        int64_t kafka_timestamp_ms, int64_t *timestamp,
                        char *why, size_t why_bytes) {
  (void)user;
  (void)kafka_timestamp_ms;
  nx_event e;
  if (value_bytes > sizeof parse_storage) {
    snprintf(why, why_bytes, "a line of %" PRIu32 " bytes is longer than "
             "an event can be", value_bytes);
    return EINVAL;
  }
  if (nx_json_parse(value, value_bytes, &e, parse_storage,
                    sizeof parse_storage, why, why_bytes))
    return EINVAL;
  *timestamp = e.type == NX_PERSON    ? e.u.person.date_time
               : e.type == NX_AUCTION ? e.u.auction.date_time
                                      : e.u.bid.date_time;
  return 0;
}

/* The map: a JSON line into an nx_record (its time stays the record's). */
static int nexmark_encode(void *user, const sl_record *in, void *out,
                          uint32_t *out_size_bytes) {
  (void)user;
  nx_event e;
  char why[128];
  if (in->size_bytes > sizeof parse_storage ||
      nx_json_parse(in->data, in->size_bytes, &e, parse_storage,
                    sizeof parse_storage, why, sizeof why))
    return EINVAL; /* the source's time function let it through: a bug */
  uint32_t size = nx_encode(&e, out, NX_MAX_RECORD_BYTES);
  if (size == 0 || size > NX_MAX_RECORD_BYTES)
    return EINVAL;
  *out_size_bytes = size;
  return 0;
}

int kafka_nexmark_source(sl_job *job, const char *address,
                         const char *partitions, int parallelism,
                         int64_t watermark_lag_ms, sl_op **events) {
  char bootstrap[4096], topic[256];
  if (kafka_split_address(address, bootstrap, sizeof bootstrap, topic,
                          sizeof topic))
    return EINVAL;
  sl_kafka_source_config kc = {.bootstrap = bootstrap,
                               .topic = topic,
                               .partitions = partitions,
                               .bounded = 1,
                               .timestamp_fn = nexmark_time,
                               .watermarks = 1,
                               .out_of_orderness = watermark_lag_ms};
  sl_op *lines;
  int rc = sl_source_kafka(job, "events.kafka", parallelism, &kc, &lines);
  if (rc == 0)
    rc = sl_op_map(job, "events", lines, parallelism, NX_MAX_RECORD_BYTES,
                   nexmark_encode, NULL, events);
  return rc;
}

int kafka_main(int argc, char **argv) {
  if (argc < 1) {
    kafka_usage(stderr);
    return 2;
  }
  if (strcmp(argv[0], "-h") == 0 || strcmp(argv[0], "--help") == 0) {
    kafka_usage(stdout);
    return 0;
  }
  if (strcmp(argv[0], "mock") == 0)
    return mock_main(argc - 1, argv + 1);
  if (strcmp(argv[0], "dump") == 0)
    return dump_main(argc - 1, argv + 1);
  die_usage("kafka: unknown command '%s' (mock or dump)", argv[0]);
}
