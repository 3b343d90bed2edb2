/* fixtures.c — the shared pieces of test jobs declared in fixtures.h: one
 * definition of each, linked into every test executable. */
#include "fixtures.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

uint64_t sl_fixture_tuple_key(void *user, const sl_record *in) {
  (void)user;
  uint64_t key;
  memcpy(&key, in->data, sizeof key);
  return key;
}

int sl_fixture_state_add(sl_ctx *ctx, uint64_t delta, uint64_t *total) {
  const void *value;
  uint32_t bytes;
  uint64_t sum = 0;
  int rc = sl_state_get(ctx, 0, &value, &bytes);
  if (rc == 0)
    memcpy(&sum, value, sizeof sum);
  else if (rc != SL_ENOTFOUND)
    return rc;
  sum += delta;
  rc = sl_state_put(ctx, 0, &sum, sizeof sum, 0);
  if (rc)
    return rc;
  *total = sum;
  return 0;
}

int sl_fixture_count_process(sl_ctx *ctx, void *state, int input,
                             const sl_record *in) {
  (void)state;
  (void)input;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  uint64_t count;
  int rc = sl_fixture_state_add(ctx, 1, &count);
  if (rc)
    return rc;
  sl_tuple out = {.key = t.key, .value = count};
  return sl_emit(ctx, &out, sizeof out);
}

int sl_fixture_format_tuple(void *user, const sl_record *in, char *buffer,
                            uint32_t buffer_bytes) {
  (void)user;
  sl_tuple t;
  memcpy(&t, in->data, sizeof t);
  int n = snprintf(buffer, buffer_bytes, "%" PRIu64 ",%" PRIu64, t.key,
                   t.value);
  /* snprintf wants room for its NUL, the sink does not: a line of exactly
   * buffer_bytes came out cut, so ask for one more. */
  return (uint32_t)n < buffer_bytes ? n : n + 1;
}

int sl_fixture_save_position(sl_ctx *ctx, const uint64_t *position) {
  return sl_operator_state_set(ctx, position, sizeof *position);
}

int sl_fixture_load_position(sl_ctx *ctx, uint64_t *position) {
  const void *data;
  uint32_t bytes;
  int rc = sl_operator_state_get(ctx, &data, &bytes);
  if (rc == SL_ENOTFOUND)
    return 0;
  if (rc || bytes != sizeof *position)
    return -EINVAL; /* negative: fails the job under either sign rule */
  memcpy(position, data, sizeof *position);
  return 0;
}
