/* kafka_common.c — see kafka_internal.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kafka_internal.h"
#include "op_util.h"

int kafka_properties_copy(const char *const *list,
                          const char *const *reserved, kafka_properties *out,
                          char *why, size_t why_bytes) {
  *out = (kafka_properties){0};
  uint32_t count = 0;
  for (; list && list[count]; count++) { /* the user's NULL ends it */
    const char *eq = strchr(list[count], '=');
    if (!eq)
      return op_errorf(EINVAL, why, why_bytes, "property '%s' is not "
                       "name=value", list[count]);
    size_t bytes = (size_t)(eq - list[count]);
    for (uint32_t r = 0; reserved && reserved[r]; r++)
      if (strlen(reserved[r]) == bytes &&
          strncmp(reserved[r], list[count], bytes) == 0)
        return op_errorf(EINVAL, why, why_bytes, "property '%s': %s is set "
                         "by the operator itself (its guarantees rely on it)",
                         list[count], reserved[r]);
  }
  out->items = calloc(count + 1, sizeof *out->items);
  if (!out->items)
    return ENOMEM;
  for (uint32_t i = 0; i < count; i++) {
    out->items[i] = strdup(list[i]);
    if (!out->items[i]) {
      kafka_properties_free(out);
      return ENOMEM;
    }
    out->count++;
  }
  return 0;
}

void kafka_properties_free(kafka_properties *p) {
  for (uint32_t i = 0; i < p->count; i++)
    free(p->items[i]);
  free(p->items);
  *p = (kafka_properties){0};
}

/* Apply name=value (the item is not changed). */
static int apply(rd_kafka_conf_t *conf, const char *item, char *err,
                 size_t err_bytes) {
  const char *eq = strchr(item, '='); /* checked when copied */
  char name[256];
  size_t bytes = (size_t)(eq - item);
  if (bytes >= sizeof name) {
    snprintf(err, err_bytes, "setting name '%.*s...' is too long", 32, item);
    return EINVAL;
  }
  memcpy(name, item, bytes);
  name[bytes] = '\0';
  char reason[512];
  if (rd_kafka_conf_set(conf, name, eq + 1, reason, sizeof reason) ==
      RD_KAFKA_CONF_OK)
    return 0;
  snprintf(err, err_bytes, "librdkafka setting %s: %s", name, reason);
  return EINVAL;
}

rd_kafka_conf_t *kafka_conf_new(const char *const (*settings)[2],
                                size_t count, const kafka_properties *user,
                                char *err, size_t err_bytes) {
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  char reason[512];
  for (size_t i = 0; i < count; i++)
    if (rd_kafka_conf_set(conf, settings[i][0], settings[i][1], reason,
                          sizeof reason) != RD_KAFKA_CONF_OK) {
      snprintf(err, err_bytes, "librdkafka setting %s: %s", settings[i][0],
               reason);
      rd_kafka_conf_destroy(conf);
      return NULL;
    }
  for (uint32_t i = 0; user && i < user->count; i++)
    if (apply(conf, user->items[i], err, err_bytes)) {
      rd_kafka_conf_destroy(conf);
      return NULL;
    }
  return conf;
}
