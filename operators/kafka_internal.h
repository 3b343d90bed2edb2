/* kafka_internal.h — what the Kafka source and sink share
 * (operators/kafka_common.c): the user's librdkafka settings, copied and
 * applied after the operator's own.  Private to operators/. */
#ifndef SLUICE_KAFKA_INTERNAL_H
#define SLUICE_KAFKA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#define KAFKA_DEFAULT_TIMEOUT_MS 30000u

/* "name=value" settings, copied. */
typedef struct kafka_properties {
  char **items;
  uint32_t count;
} kafka_properties;

/* Copy the NULL-terminated list (NULL: none) into *out.  reserved
 * (NULL-terminated) names the settings the operator's guarantees rely on:
 * a property setting one is refused.  Returns 0, EINVAL (an item without
 * '=' or a reserved setting; why says which) or ENOMEM; *out is empty on
 * error. */
int kafka_properties_copy(const char *const *list,
                          const char *const *reserved, kafka_properties *out,
                          char *why, size_t why_bytes);
void kafka_properties_free(kafka_properties *p);

/* A librdkafka configuration: the count pairs of settings (name, value),
 * then the user's properties.  Returns it, or NULL with the failing
 * setting and librdkafka's reason in err. */
rd_kafka_conf_t *kafka_conf_new(const char *const (*settings)[2],
                                size_t count, const kafka_properties *user,
                                char *err, size_t err_bytes);

#endif
