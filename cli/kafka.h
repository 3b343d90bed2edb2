/* kafka.h — `sluice kafka` (cli/kafka.c) and what other subcommands take
 * from it. */
#ifndef SLUICE_CLI_KAFKA_H
#define SLUICE_CLI_KAFKA_H

#include <stddef.h>
#include <stdint.h>

#include "sluice.h"

/* `sluice kafka mock|dump ...`: argv starts after "kafka".  Returns the
 * exit status. */
int kafka_main(int argc, char **argv);

/* "BOOTSTRAP/TOPIC" (split at the last '/') into its two parts, each
 * NUL-terminated.  Returns 0, or EINVAL (no '/', an empty part, or a part
 * longer than its buffer) with the buffers unspecified. */
int kafka_split_address(const char *text, char *bootstrap,
                        size_t bootstrap_bytes, char *topic,
                        size_t topic_bytes);

/* `sluice nexmark gen --kafka BOOTSTRAP --topic T --partitions K`: the
 * events of gen into topic (made with partitions if missing), event n
 * into partition n % partitions with its date_time as Kafka timestamp.
 * Returns the exit status (the reason printed). */
struct nx_generator_config;
int kafka_nexmark_gen(const struct nx_generator_config *gen,
                      const char *bootstrap, const char *topic,
                      int partitions);

/* `sluice nexmark run --kafka-input BOOTSTRAP/TOPIC [--kafka-partitions
 * LIST]`: the Kafka source (partitions NULL: all) and a map that parses
 * each JSON line into an nx_record; *events is that stream.  Errors:
 * EINVAL (a bad address or list), and the builders'. */
int kafka_nexmark_source(sl_job *job, const char *address,
                         const char *partitions, int parallelism,
                         int64_t watermark_lag_ms, sl_op **events);

#endif /* SLUICE_CLI_KAFKA_H */
