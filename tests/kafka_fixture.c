/* kafka_fixture.c — see kafka_fixture.h. */
#include "kafka_fixture.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include "sluice.h" /* sl_tuple */
#include "sluice_testing.h" /* sl_verify_result */
#include <time.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#define FIXTURE_WAIT_MS 30000

/* One line from fd into line (without its newline), waiting at most
 * FIXTURE_WAIT_MS in all.  Byte by byte: the mock writes little. */
static void read_line(int fd, char *line, size_t line_bytes,
                      const char *what) {
  size_t used = 0;
  struct timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) { /* ends: newline, end of file or the deadline */
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long waited_ms = (now.tv_sec - start.tv_sec) * 1000 +
                     (now.tv_nsec - start.tv_nsec) / 1000000;
    cr_assert_lt(waited_ms, FIXTURE_WAIT_MS, "the mock sent no %s", what);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int n = poll(&p, 1, 100);
    if (n <= 0)
      continue;
    char c;
    ssize_t got = read(fd, &c, 1);
    cr_assert_eq(got, 1, "the mock closed its output before its %s", what);
    if (c == '\n')
      break;
    cr_assert_lt(used + 1, line_bytes, "the mock's %s is too long", what);
    line[used++] = c;
  }
  line[used] = '\0';
}

void kafka_mock_start(kafka_mock *m, const char *const *topics) {
  const char *bin = getenv("SLUICE_BIN");
  cr_assert(bin && *bin, "SLUICE_BIN is not set (meson sets it)");
  const char *argv[40] = {bin, "kafka", "mock"};
  int argc = 3;
  for (int i = 0; topics && topics[i]; i++) {
    cr_assert_lt(argc, 36);
    argv[argc++] = "--topic";
    argv[argc++] = topics[i];
  }
  argv[argc] = NULL;
  int in[2], out[2];
  cr_assert_eq(pipe(in), 0);
  cr_assert_eq(pipe(out), 0);
  pid_t parent = getpid();
  pid_t pid = fork();
  cr_assert(pid >= 0, "fork: %s", strerror(errno));
  if (pid == 0) {
    /* A test killed (a timeout, SIGKILL) takes its mock with it. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) /* it died before the prctl */
      _exit(127);
    dup2(in[0], 0);
    dup2(out[1], 1);
    close(in[1]);
    close(out[0]);
    execv(bin, (char *const *)argv);
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  *m = (kafka_mock){.pid = pid, .control_fd = in[1], .answer_fd = out[0]};
  char line[sizeof m->bootstrap];
  read_line(m->answer_fd, line, sizeof line, "bootstrap line");
  cr_assert_eq(strncmp(line, "bootstrap: ", 11), 0, "first line: %s", line);
  memmove(m->bootstrap, line + 11, strlen(line + 11) + 1);
}

void kafka_mock_command(kafka_mock *m, const char *line) {
  size_t bytes = strlen(line);
  cr_assert_eq(write(m->control_fd, line, bytes), (ssize_t)bytes);
  cr_assert_eq(write(m->control_fd, "\n", 1), 1);
  char answer[256];
  read_line(m->answer_fd, answer, sizeof answer, "answer");
  cr_assert_str_eq(answer, "ok", "mock command '%s': %s", line, answer);
}

void kafka_mock_stop(kafka_mock *m) {
  if (m->pid <= 0)
    return;
  kill(m->pid, SIGTERM);
  int status = 0;
  for (int i = 0; i < 1000; i++) { /* 10 s */
    if (waitpid(m->pid, &status, WNOHANG) == m->pid) {
      m->pid = 0;
      break;
    }
    usleep(10000);
  }
  if (m->pid > 0) {
    kill(m->pid, SIGKILL);
    waitpid(m->pid, &status, 0);
    m->pid = 0;
  }
  close(m->control_fd);
  close(m->answer_fd);
}

/* Delivery reports: count the messages the mock refused. */
static void count_failures(rd_kafka_t *rk, const rd_kafka_message_t *m,
                           void *opaque) {
  (void)rk;
  if (m->err)
    (*(uint32_t *)opaque)++;
}

void kafka_produce(const kafka_mock *m, const char *topic, uint32_t count,
                   const void *const *values, const uint32_t *sizes,
                   const int32_t *partitions, const int64_t *timestamps_ms) {
  char err[256];
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  cr_assert_eq(rd_kafka_conf_set(conf, "bootstrap.servers", m->bootstrap, err,
                                 sizeof err), RD_KAFKA_CONF_OK, "%s", err);
  rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
  uint32_t failures = 0;
  rd_kafka_conf_set_opaque(conf, &failures);
  rd_kafka_conf_set_dr_msg_cb(conf, count_failures);
  rd_kafka_t *p = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  cr_assert(p, "producer: %s", err);
  for (uint32_t i = 0; i < count; i++) {
    rd_kafka_resp_err_t e;
    do { /* a full local queue drains as the mock acknowledges */
      e = rd_kafka_producev(
          p, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(partitions[i]),
          RD_KAFKA_V_VALUE((void *)values[i], values[i] ? sizes[i] : 0),
          RD_KAFKA_V_TIMESTAMP(timestamps_ms ? timestamps_ms[i] : 0),
          RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
      if (e == RD_KAFKA_RESP_ERR__QUEUE_FULL)
        rd_kafka_poll(p, 10);
    } while (e == RD_KAFKA_RESP_ERR__QUEUE_FULL);
    cr_assert_eq(e, 0, "produce: %s", rd_kafka_err2str(e));
  }
  cr_assert_eq(rd_kafka_flush(p, FIXTURE_WAIT_MS), 0,
               "the mock did not acknowledge the messages in time");
  rd_kafka_destroy(p);
  cr_assert_eq(failures, 0, "%u messages were refused", failures);
}

void kafka_produce_tuples(const kafka_mock *m, const char *topic,
                          uint32_t count, uint64_t keys, int partitions) {
  sl_tuple *tuples = calloc(count, sizeof *tuples);
  const void **values = calloc(count, sizeof *values);
  uint32_t *sizes = calloc(count, sizeof *sizes);
  int32_t *parts = calloc(count, sizeof *parts);
  cr_assert(tuples && values && sizes && parts);
  for (uint32_t i = 0; i < count; i++) {
    tuples[i] = (sl_tuple){.key = i % keys, .value = i};
    values[i] = &tuples[i];
    sizes[i] = sizeof tuples[i];
    parts[i] = (int32_t)(tuples[i].key % (uint64_t)partitions);
  }
  kafka_produce(m, topic, count, values, sizes, parts, NULL);
  free(tuples);
  free(values);
  free(sizes);
  free(parts);
}

void kafka_expect_exactly_once(const struct sl_op *verify, uint64_t count) {
  sl_verify_counts v;
  cr_assert_eq(sl_verify_result(verify, &v), 0);
  cr_expect(v.complete, "the verifying sink did not reach its end");
  cr_expect_eq(v.records, count);
  cr_expect_eq(v.lost, 0);
  cr_expect_eq(v.duplicates, 0);
  cr_expect_eq(v.out_of_order, 0);
}
