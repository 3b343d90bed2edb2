/* kafka_fixture.h — the Kafka suites' cluster: `sluice kafka mock`
 * (SLUICE_BIN) started as a child process with pipes on its stdin and
 * stdout, its bootstrap line read, commands sent to it (cli/kafka.c note
 * 4), and a producer to fill topics.  Every wait is bounded: a mock that
 * does not answer fails the test that asked. */
#ifndef SL_TEST_KAFKA_FIXTURE_H
#define SL_TEST_KAFKA_FIXTURE_H

#include <stdint.h>
#include <sys/types.h>

typedef struct kafka_mock {
  pid_t pid;
  int control_fd; /* the mock's stdin */
  int answer_fd;  /* the mock's stdout */
  char bootstrap[512];
} kafka_mock;

/* Start a mock with the given topics ("NAME:PARTITIONS" each, NULL-ended).
 * Fails the test if no bootstrap line comes within 30 s. */
void kafka_mock_start(kafka_mock *m, const char *const *topics);

/* Send one control line (without its newline); fails the test unless the
 * mock answers "ok". */
void kafka_mock_command(kafka_mock *m, const char *line);

/* SIGTERM the mock (by its pid) and reap it; SIGKILL after 10 s. */
void kafka_mock_stop(kafka_mock *m);

/* Produce count messages to topic: message i has value values[i] of
 * sizes[i] bytes (NULL: no value) into partitions[i], with Kafka
 * timestamp timestamps_ms[i] (timestamps_ms NULL: the time of producing).
 * Waits until every one is acknowledged (at most 30 s) or fails the
 * test. */
void kafka_produce(const kafka_mock *m, const char *topic, uint32_t count,
                   const void *const *values, const uint32_t *sizes,
                   const int32_t *partitions, const int64_t *timestamps_ms);

/* Produce count sl_tuple messages {key = i % keys, value = i}, key k into
 * partition k % partitions: each key's records are in one partition, in
 * order, as sl_sink_verify expects them. */
void kafka_produce_tuples(const kafka_mock *m, const char *topic,
                          uint32_t count, uint64_t keys, int partitions);

/* Expect a verifying sink (sl_sink_verify) to have reached its end with
 * count records, each exactly once and in its key's order. */
struct sl_op;
void kafka_expect_exactly_once(const struct sl_op *verify, uint64_t count);

#endif
