/* kafka.h — `sluice kafka` (cli/kafka.c) and what other subcommands take
 * from it. */
#ifndef SLUICE_CLI_KAFKA_H
#define SLUICE_CLI_KAFKA_H

#include <stddef.h>

/* `sluice kafka mock|dump ...`: argv starts after "kafka".  Returns the
 * exit status. */
int kafka_main(int argc, char **argv);

/* "BOOTSTRAP/TOPIC" (split at the last '/') into its two parts, each
 * NUL-terminated.  Returns 0, or EINVAL (no '/', an empty part, or a part
 * longer than its buffer) with the buffers unspecified. */
int kafka_split_address(const char *text, char *bootstrap,
                        size_t bootstrap_bytes, char *topic,
                        size_t topic_bytes);

#endif /* SLUICE_CLI_KAFKA_H */
