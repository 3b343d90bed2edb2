/* state.c — keyed state (value, map, list, fold) and operator state, the
 * public calls over an instance's copy-on-write map (cow_map.h).
 *
 * A keyed-state entry's key in the map (and in LMDB) is
 *
 *     [record key: u64 big-endian][state_id: u16 big-endian][kind: u8]
 *     [user key]
 *
 * The record key comes first so the writer can find the key group of any
 * entry (coordinator.c), and big-endian so that LMDB's byte order sorts a
 * key group's entries by record key (the writer sorts by it: sequential
 * B-tree writes); the kind byte keeps a value state and a map state with
 * the same id from ever colliding.  A list is stored as one value:
 * items back to back, each a u32 length and the bytes, padded to 4.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

enum state_kind { KIND_VALUE = 1, KIND_MAP = 2, KIND_LIST = 3, KIND_FOLD = 4 };

#define KEY_HEADER_BYTES 11u

static int grow(void **buffer, uint32_t *capacity, uint64_t need) {
  if (need <= *capacity)
    return 0;
  if (need > SL_COW_MAX_BYTES)
    return EINVAL;
  uint64_t cap = *capacity ? *capacity : 64;
  while (cap < need)
    cap *= 2;
  void *p = realloc(*buffer, cap);
  if (!p)
    return ENOMEM;
  *buffer = p;
  *capacity = (uint32_t)cap;
  return 0;
}

/* Build the map key of (current key, id, kind, user key) in the instance's
 * key buffer.  Errors: SL_EUSAGE (no keyed input, or outside process()),
 * ENOMEM, EINVAL. */
static int state_key(sl_ctx *ctx, uint16_t id, uint8_t kind,
                     const void *user_key, uint32_t user_key_bytes,
                     uint32_t *key_bytes) {
  sl_instance_checkpoint *cp = &ctx->cp;
  if (!cp->keyed)
    return SL_EUSAGE;
  if (!cp->key_valid) {
    /* A timer sets its key directly (timer.c); a record's key is computed
     * on the first state call. */
    if (!ctx->current || !ctx->current_channel)
      return SL_EUSAGE;
    /* The key function of the channel the record came through; records of
     * a keyed edge always have one (setup_instances). */
    const sl_channel *ch = ctx->current_channel;
    assert(ch->key);
    cp->current_key = ch->key(ch->key_user, ctx->current);
    cp->key_valid = true;
  }
  uint64_t need = (uint64_t)KEY_HEADER_BYTES + user_key_bytes;
  int rc = grow(&cp->key_buffer, &cp->key_buffer_bytes, need);
  if (rc)
    return rc;
  uint8_t *k = cp->key_buffer;
  sl_store_be64(k, cp->current_key);
  k[8] = (uint8_t)(id >> 8);
  k[9] = (uint8_t)id;
  k[10] = kind;
  if (user_key_bytes)
    memcpy(k + KEY_HEADER_BYTES, user_key, user_key_bytes);
  *key_bytes = (uint32_t)need;
  return 0;
}

static int get(sl_ctx *ctx, uint16_t id, uint8_t kind, const void *user_key,
               uint32_t user_key_bytes, const void **value,
               uint32_t *size_bytes) {
  uint32_t key_bytes;
  int rc = state_key(ctx, id, kind, user_key, user_key_bytes, &key_bytes);
  if (rc)
    return rc;
  uint32_t bytes = 0;
  const void *v = sl_cow_map_get(ctx->cp.keyed, ctx->cp.key_buffer, key_bytes,
                                 &bytes);
  if (!v)
    return SL_ENOTFOUND;
  if (value)
    *value = v;
  if (size_bytes)
    *size_bytes = bytes;
  return 0;
}

static int put(sl_ctx *ctx, uint16_t id, uint8_t kind, const void *user_key,
               uint32_t user_key_bytes, const void *value,
               uint32_t size_bytes, void **stored) {
  if (size_bytes > SL_COW_MAX_BYTES)
    return EINVAL;
  uint32_t key_bytes;
  int rc = state_key(ctx, id, kind, user_key, user_key_bytes, &key_bytes);
  if (rc)
    return rc;
  void *v = sl_cow_map_put(ctx->cp.keyed, ctx->cp.key_buffer, key_bytes,
                           value, size_bytes);
  if (!v)
    return ENOMEM;
  if (stored)
    *stored = v;
  return 0;
}

static int delete(sl_ctx *ctx, uint16_t id, uint8_t kind,
                  const void *user_key, uint32_t user_key_bytes) {
  uint32_t key_bytes;
  int rc = state_key(ctx, id, kind, user_key, user_key_bytes, &key_bytes);
  if (rc)
    return rc;
  return sl_cow_map_delete(ctx->cp.keyed, ctx->cp.key_buffer, key_bytes);
}

SL_EXPORT int sl_state_get(sl_ctx *ctx, uint16_t state_id, const void **value,
                           uint32_t *size_bytes) {
  return get(ctx, state_id, KIND_VALUE, 0, 0, value, size_bytes);
}

SL_EXPORT int sl_state_put(sl_ctx *ctx, uint16_t state_id, const void *value,
                           uint32_t size_bytes, void **stored) {
  return put(ctx, state_id, KIND_VALUE, 0, 0, value, size_bytes, stored);
}

SL_EXPORT int sl_state_delete(sl_ctx *ctx, uint16_t state_id) {
  int rc = delete(ctx, state_id, KIND_VALUE, 0, 0);
  if (rc == SL_ENOTFOUND) /* the id may name a list or fold state */
    rc = delete(ctx, state_id, KIND_LIST, 0, 0);
  if (rc == SL_ENOTFOUND)
    rc = delete(ctx, state_id, KIND_FOLD, 0, 0);
  return rc;
}

SL_EXPORT int sl_mapstate_get(sl_ctx *ctx, uint16_t state_id,
                              const void *user_key, uint32_t user_key_bytes,
                              const void **value, uint32_t *size_bytes) {
  return get(ctx, state_id, KIND_MAP, user_key, user_key_bytes, value,
             size_bytes);
}

SL_EXPORT int sl_mapstate_put(sl_ctx *ctx, uint16_t state_id,
                              const void *user_key, uint32_t user_key_bytes,
                              const void *value, uint32_t size_bytes) {
  return put(ctx, state_id, KIND_MAP, user_key, user_key_bytes, value,
             size_bytes, 0);
}

SL_EXPORT int sl_mapstate_delete(sl_ctx *ctx, uint16_t state_id,
                                 const void *user_key,
                                 uint32_t user_key_bytes) {
  return delete(ctx, state_id, KIND_MAP, user_key, user_key_bytes);
}

static uint32_t item_stride(uint32_t item_bytes) {
  return 4u + ((item_bytes + 3u) & ~3u);
}

SL_EXPORT int sl_liststate_add(sl_ctx *ctx, uint16_t state_id,
                               const void *item, uint32_t item_bytes) {
  const void *old = 0;
  uint32_t old_bytes = 0;
  int rc = get(ctx, state_id, KIND_LIST, 0, 0, &old, &old_bytes);
  if (rc && rc != SL_ENOTFOUND)
    return rc;
  uint64_t need = (uint64_t)old_bytes + item_stride(item_bytes);
  sl_instance_checkpoint *cp = &ctx->cp;
  /* Build the new list in the instance's buffer: the put may free the
   * version `old` points into, so it cannot be extended in place. */
  rc = grow(&cp->value_buffer, &cp->value_buffer_bytes, need);
  if (rc)
    return rc;
  uint8_t *b = cp->value_buffer;
  if (old_bytes)
    memcpy(b, old, old_bytes);
  memcpy(b + old_bytes, &item_bytes, 4);
  memset(b + old_bytes + 4, 0, item_stride(item_bytes) - 4);
  if (item_bytes)
    memcpy(b + old_bytes + 4, item, item_bytes);
  return put(ctx, state_id, KIND_LIST, 0, 0, b, (uint32_t)need, 0);
}

SL_EXPORT int sl_liststate_get(sl_ctx *ctx, uint16_t state_id,
                               const void **list, uint32_t *list_bytes) {
  return get(ctx, state_id, KIND_LIST, 0, 0, list, list_bytes);
}

SL_EXPORT int sl_list_next(const void *list, uint32_t list_bytes,
                           uint32_t *offset, const void **item,
                           uint32_t *item_bytes) {
  if (!list || !offset || *offset + 4u > list_bytes)
    return 0;
  const uint8_t *at = (const uint8_t *)list + *offset;
  uint32_t bytes;
  memcpy(&bytes, at, 4);
  if ((uint64_t)*offset + item_stride(bytes) > list_bytes)
    return 0; /* malformed: stop rather than read past the end */
  *item = at + 4;
  *item_bytes = bytes;
  *offset += item_stride(bytes);
  return 1;
}

SL_EXPORT int sl_state_fold(sl_ctx *ctx, uint16_t state_id, const void *init,
                            uint32_t acc_bytes, sl_fold_fn fold, void *user,
                            const void *value, uint32_t value_bytes,
                            const void **acc_out) {
  if (!fold || (!init && acc_bytes))
    return EINVAL;
  const void *old = 0;
  uint32_t old_bytes = 0;
  int rc = get(ctx, state_id, KIND_FOLD, 0, 0, &old, &old_bytes);
  if (rc && rc != SL_ENOTFOUND)
    return rc;
  if (rc == 0 && old_bytes != acc_bytes)
    return EINVAL; /* the same id used with another accumulator size */
  sl_instance_checkpoint *cp = &ctx->cp;
  rc = grow(&cp->value_buffer, &cp->value_buffer_bytes, acc_bytes);
  if (rc)
    return rc;
  if (acc_bytes)
    memcpy(cp->value_buffer, old ? old : init, acc_bytes);
  fold(user, cp->value_buffer, value, value_bytes);
  void *stored = 0;
  rc = put(ctx, state_id, KIND_FOLD, 0, 0, cp->value_buffer, acc_bytes,
           &stored);
  if (rc == 0 && acc_out)
    *acc_out = stored;
  return rc;
}

/* ----------------------------------------------------------- operator state */

SL_EXPORT int sl_operator_state_set(sl_ctx *ctx, const void *data,
                                    uint32_t bytes) {
  sl_instance_checkpoint *cp = &ctx->cp;
  if (!cp->in_snapshot)
    return SL_EUSAGE;
  void *copy = malloc(bytes ? bytes : 1);
  if (!copy)
    return ENOMEM;
  if (bytes)
    memcpy(copy, data, bytes);
  free(cp->blob_new);
  cp->blob_new = copy;
  cp->blob_new_bytes = bytes;
  cp->has_blob_new = true;
  return 0;
}

SL_EXPORT int sl_operator_state_get(sl_ctx *ctx, const void **data,
                                    uint32_t *bytes) {
  const sl_instance_checkpoint *cp = &ctx->cp;
  if (!cp->has_blob_restored)
    return SL_ENOTFOUND;
  *data = cp->blob_restored;
  *bytes = cp->blob_restored_bytes;
  return 0;
}

SL_EXPORT int sl_ctx_checkpointing(const sl_ctx *ctx) {
  return ctx->job->cp != 0;
}
