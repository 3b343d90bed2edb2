/* state.c — keyed state (value, map, list, fold) and operator state, the
 * public calls over an instance's copy-on-write map (cow_map.h).
 *
 * A keyed-state entry's key in the map (and in LMDB) is
 *
 *     [record key: u64 big-endian][state_id: u16 big-endian][kind: u8]
 *     [user key]
 *
 * The record key comes first so the writer can find the key group of any
 * entry (checkpoint_writer.c), and big-endian so that LMDB's byte order sorts a
 * key group's entries by record key (the writer sorts by it: sequential
 * B-tree writes); the kind byte keeps a value state and a map state with
 * the same id from ever colliding.  A list is stored as one value:
 * items back to back, each a u32 length and the bytes, padded to 4.
 *
 * A byte-string key (sl_op_key_by_bytes) replaces the record key by its
 * hash and marks the kind byte (KIND_BYTES), then the key itself follows:
 *
 *     [hash: u64 BE][state_id: u16 BE][kind | 0x80: u8]
 *     [key length: u32 BE][key bytes][user key]
 *
 * so the writer and a rescaling restore still find the key group in the
 * first 8 bytes (the hash, as the producer routed it), while two keys
 * whose hashes collide are two entries: the length and bytes tell them
 * apart, never merged.  The instance's byte_keys flag, fixed at setup (an
 * operator's keyed inputs are all of one kind, graph.c), picks the layout
 * with one test per state call; 64-bit keys keep their prepared path.
 *
 * Read-modify-write (sl_state_update, sl_state_fold) is one lookup
 * (sl_cow_map_update: the value is changed in place, copied first if a
 * checkpoint holds it).  Keys without a user key reach the map prepared
 * (cow_map.h, sl_cow_key) with their hash and compared words computed in
 * registers (header_key) instead of read back from the key buffer just
 * written, which stalled on its stores (bench/pipeline_p2.c).
 *
 * Such calls also leave their (state id, kind) as the instance's guess for
 * the next record, with which the runtime fetches the state of records
 * ahead (runtime.c note 13, sl_state_prefetch_stages); the hash it computed
 * for the guess is taken here (the memo) when the guess was right.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "internal.h"
#include "sluice_testing.h"

enum state_kind { KIND_VALUE = 1, KIND_MAP = 2, KIND_LIST = 3, KIND_FOLD = 4 };

#define KEY_HEADER_BYTES 11u
/* Smaller keyed states are not prefetched (runtime.c note 13).  Under
 * 256 KiB they stay in the core's L2 cache, where the prefetch costs more
 * than the misses it hides (P2 at 100 and 1,000 keys: about 1.2x the CPU
 * per tuple with it, 1.02x to 1.03x without, against the code before
 * it).  At 10,000 keys (about 0.8 MiB, and more while copies on write
 * double part of it) it is a wash in P2's throughput, and it decides
 * what checkpoints do to latency: latency_bench at 50% load, 3 rounds of
 * 5 s alternating, p99 with checkpoints every 100 ms / without, 59 / 37,
 * 64 / 37, 48 / 52 us with it against 334 / 32, 224 / 51, 66 / 39 us
 * with a 2 MiB threshold; the published full runs agree (p99 on / off
 * 3.1x with it, 12.8x without).  At 80% load without checkpoints its
 * extra work shows (p99 1.3-7.8 ms with it, 0.05-3.8 ms without, in the
 * same rounds; both full runs 14 ms), with checkpoints it does not
 * (0.5-2.6 ms against 0.6-17.7 ms).  So 256 KiB. */
#define SL_PREFETCH_MIN_STATE_BYTES (UINT64_C(256) << 10)
/* From this size on, the prefetch also fetches the second entry of a
 * chain whose first holds another key (sl_cow_map_prefetch's stage 2,
 * runtime.c note 13).  A table of this size grows at a load factor of 1
 * (cow_map.c note 6), so between a third and a half of lookups go past
 * the first entry; in a state larger than the caches, that is a miss to
 * memory, which perf put at most of the running sum's lookup at 1M keys.
 * In a smaller state it is a hit in L2 or L3, and the third stage costs
 * more than it hides.  P2 (pipeline_p2 --series update, 20M tuples, 6 runs
 * alternated with the build without it, medians, M tuples/s; 2026-12-07):
 * 10K keys 32.0 / 29.3 with it, 100K keys (about 8 MiB) 21.8 / 21.0,
 * 300K keys (about 22 MiB) 18.0 / 18.1, 1M keys (about 72 MiB) 10.6 /
 * 12.2, 4M keys 5.9 / 6.7.  So 32 MiB. */
#define SL_PREFETCH_CHAIN_MIN_STATE_BYTES (UINT64_C(32) << 20)
#define KIND_BYTES 0x80u /* kind flag: a byte-string key follows */
#define BYTE_KEY_HEADER_BYTES 15u

_Static_assert(BYTE_KEY_HEADER_BYTES + SL_KEY_MAX_STORED_BYTES + 36u == 499u,
               "sluice.h promises 36 bytes of user key in LMDB's 499");
_Static_assert(SL_KEY_MAX_BYTES + BYTE_KEY_HEADER_BYTES < SL_COW_MAX_BYTES,
               "a longest key fits a map key");

/* The 11 bytes every keyed-state map key starts with (note above): the
 * record key (for byte keys, its hash) big-endian, the state id, the
 * kind. */
static inline void key_header(uint8_t *k, uint64_t key, uint16_t id,
                              uint8_t kind) {
  sl_store_be64(k, key);
  k[8] = (uint8_t)(id >> 8);
  k[9] = (uint8_t)id;
  k[10] = kind;
}

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

/* ----------------------------------------------------- byte-string keys */

uint64_t sl_byte_key_hash(const sl_job *job, const void *key,
                          uint32_t key_bytes) {
  if (__builtin_expect(job->key_hash != 0, 0))
    return job->key_hash(key, key_bytes);
  return XXH3_64bits(key, key_bytes);
}

/* The longest key job accepts: LMDB's limit once state is stored. */
static uint32_t key_max_bytes(const sl_job *job) {
  return job->cp ? SL_KEY_MAX_STORED_BYTES : SL_KEY_MAX_BYTES;
}

/* Call bk's function on in and check what it gave: 0 with *key, *bytes
 * set, or the failure with its text in cause. */
static int byte_key_call(const sl_byte_key *bk, const sl_record *in,
                         const void **key, uint32_t *bytes, char *cause,
                         size_t cause_bytes) {
  *key = 0;
  *bytes = 0;
  int rc = bk->fn(bk->user, in, key, bytes);
  uint32_t max = key_max_bytes(bk->op->job);
  if (rc) {
    snprintf(cause, cause_bytes, "key function of key_by '%s' returned %d",
             bk->op->name, rc);
  } else if (*bytes > max) {
    rc = SL_ETOOBIG;
    snprintf(cause, cause_bytes, "key_by '%s': a key of %" PRIu32 " bytes "
             "exceeds the largest, %" PRIu32 "%s", bk->op->name, *bytes, max,
             bk->op->job->cp ? " (SL_KEY_MAX_STORED_BYTES: checkpointed)"
                             : " (SL_KEY_MAX_BYTES)");
  } else if (*bytes && !*key) {
    rc = EINVAL;
    snprintf(cause, cause_bytes, "key_by '%s': the key function gave NULL "
             "for a key of %" PRIu32 " bytes", bk->op->name, *bytes);
  }
  return rc;
}

uint64_t sl_byte_key_route(void *user, const sl_record *in) {
  const sl_byte_key *bk = user;
  const void *key;
  uint32_t bytes;
  char cause[256];
  int rc = byte_key_call(bk, in, &key, &bytes, cause, sizeof cause);
  if (rc) {
    /* No instance to fail from here (runtime.c, emit_port): the job fails
     * and this record goes to the owner of hash 0, where the key function
     * fails again; the producer stops at its next check. */
    sl_job_fail(bk->op->job, rc, "%s", cause);
    return 0;
  }
  return sl_byte_key_hash(bk->op->job, key, bytes);
}

int sl_byte_key_compute(sl_ctx *ctx, const sl_channel *ch) {
  sl_instance_checkpoint *cp = &ctx->cp;
  assert(cp->byte_keys);
  assert(sl_channel_bytes(ch));
  const void *key;
  uint32_t bytes;
  int rc = byte_key_call(ch->key_user, ctx->current, &key, &bytes, ctx->cause,
                         sizeof ctx->cause);
  if (rc == 0)
    rc = grow((void **)&cp->key_copy, &cp->key_copy_capacity, bytes);
  if (rc) {
    /* The key function's contract (sluice.h): its failure fails the job,
     * whatever the callback does with the state call's return. */
    sl_instance_fail(ctx, rc);
    return rc;
  }
  /* A copy: the function's pointer lasts only until its next call. */
  if (bytes)
    memcpy(cp->key_copy, key, bytes);
  cp->key_data = cp->key_copy;
  cp->key_data_bytes = bytes;
  cp->current_key = sl_byte_key_hash(ctx->job, cp->key_copy, bytes);
  cp->key_valid = true;
  return 0;
}

/* state_key() for a byte-string key (the layout at the top). */
static __attribute__((noinline)) int
byte_state_key(sl_ctx *ctx, uint16_t id, uint8_t kind, const void *user_key,
               uint32_t user_key_bytes, uint32_t *key_bytes) {
  sl_instance_checkpoint *cp = &ctx->cp;
  if (!cp->key_valid) {
    /* As state_key: a timer sets its key directly (timer.c). */
    if (!ctx->current || !ctx->current_channel)
      return SL_EUSAGE;
    int rc = sl_byte_key_compute(ctx, ctx->current_channel);
    if (rc)
      return rc;
  }
  uint32_t n = cp->key_data_bytes;
  assert(n <= SL_KEY_MAX_BYTES); /* byte_key_call refused longer */
  assert(n == 0 || cp->key_data);
  uint64_t need = (uint64_t)BYTE_KEY_HEADER_BYTES + n + user_key_bytes;
  int rc = grow(&cp->key_buffer, &cp->key_buffer_bytes, need);
  if (rc)
    return rc;
  uint8_t *k = cp->key_buffer;
  key_header(k, cp->current_key, id, (uint8_t)(kind | KIND_BYTES));
  for (int i = 0; i < 4; i++)
    k[11 + i] = (uint8_t)(n >> (24 - 8 * i));
  if (n)
    memcpy(k + BYTE_KEY_HEADER_BYTES, cp->key_data, n);
  if (user_key_bytes)
    memcpy(k + BYTE_KEY_HEADER_BYTES + n, user_key, user_key_bytes);
  *key_bytes = (uint32_t)need;
  return 0;
}

SL_EXPORT int sl_ctx_key_bytes(sl_ctx *ctx, const void **key,
                               uint32_t *key_bytes) {
  if (!ctx || !key || !key_bytes)
    return EINVAL;
  uint64_t hash;
  int rc = sl_ctx_key(ctx, &hash); /* computes it if need be */
  if (rc)
    return rc;
  sl_instance_checkpoint *cp = &ctx->cp;
  if (cp->byte_keys) {
    static const uint8_t empty[1];
    *key = cp->key_data_bytes ? cp->key_data : empty;
    *key_bytes = cp->key_data_bytes;
  } else {
    sl_store_be64(cp->key_be, hash);
    *key = cp->key_be;
    *key_bytes = 8;
  }
  return 0;
}

SL_EXPORT int sl_op_key_by_bytes(sl_job *job, const char *name, sl_op *input,
                                 sl_key_bytes_fn fn, void *user,
                                 sl_op **out) {
  sl_byte_key *bk = fn ? calloc(1, sizeof *bk) : 0;
  if (fn && !bk)
    return ENOMEM;
  /* Built as a 64-bit key_by whose function is the router, so every edge
   * rule (graph.c, resolve_edges) holds for it unchanged. */
  sl_op *op = 0;
  int rc = sl_op_key_by(job, name, input, fn ? sl_byte_key_route : 0, bk,
                        &op);
  if (rc) {
    free(bk);
    return rc;
  }
  bk->fn = fn;
  bk->user = user;
  bk->op = op;
  op->user_free = free; /* the job owns bk (graph.c, sl_job_destroy) */
  if (out)
    *out = op;
  return 0;
}

/* Whether a sl_testing_* setter may change job: EINVAL (NULL),
 * SL_ESTARTED (no longer being built), or 0. */
static int testing_setter_check(const sl_job *job) {
  if (!job)
    return EINVAL;
  return atomic_load(&job->state) != SL_JOB_BUILDING ? SL_ESTARTED : 0;
}

/* count(map) summed over job's keyed-state maps; 0 for NULL. */
static uint64_t keyed_maps_sum(const sl_job *job,
                               uint64_t (*count)(const sl_cow_map *)) {
  uint64_t n = 0;
  for (int i = 0; job && i < job->instance_count; i++)
    if (job->instances[i]->cp.keyed)
      n += count(job->instances[i]->cp.keyed);
  return n;
}

SL_EXPORT int sl_testing_set_key_hash(sl_job *job,
                                      uint64_t (*hash)(const void *key,
                                                       uint32_t key_bytes)) {
  int rc = testing_setter_check(job);
  if (rc == 0)
    job->key_hash = hash;
  return rc;
}

SL_EXPORT int sl_testing_fail_state_index(sl_job *job, uint32_t nth) {
  int rc = testing_setter_check(job);
  if (rc == 0)
    job->test_index_fail_nth = nth;
  return rc;
}

SL_EXPORT uint64_t sl_testing_state_index_drops(const sl_job *job) {
  return keyed_maps_sum(job, sl_cow_map_index_drops);
}

SL_EXPORT int sl_testing_state_copy_budget(sl_job *job, uint32_t budget) {
  int rc = budget == 0 ? EINVAL : testing_setter_check(job);
  if (rc == 0)
    job->test_copy_budget = budget;
  return rc;
}

SL_EXPORT int sl_testing_state_chain_prefetch(sl_job *job,
                                              uint64_t min_state_bytes) {
  int rc = testing_setter_check(job);
  if (rc == 0) {
    job->test_chain_prefetch = true;
    job->test_chain_prefetch_bytes = min_state_bytes;
  }
  return rc;
}

SL_EXPORT uint64_t sl_testing_state_chain_prefetches(const sl_job *job) {
  uint64_t n = 0;
  for (int i = 0; job && i < job->instance_count; i++)
    n += job->instances[i]->cp.chain_prefetches;
  return n;
}

SL_EXPORT uint64_t sl_testing_state_copy_passes(const sl_job *job) {
  return keyed_maps_sum(job, sl_cow_map_copy_passes);
}

SL_EXPORT uint64_t sl_testing_state_load_staged(const sl_job *job) {
  return keyed_maps_sum(job, sl_cow_map_load_staged);
}

/* ------------------------------------------------------------ state keys */

/* state_key() for a 64-bit key (the first layout at the top). */
static inline int u64_state_key(sl_ctx *ctx, uint16_t id, uint8_t kind,
                                const void *user_key, uint32_t user_key_bytes,
                                uint32_t *key_bytes) {
  sl_instance_checkpoint *cp = &ctx->cp;
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
  key_header(k, cp->current_key, id, kind);
  if (user_key_bytes)
    memcpy(k + KEY_HEADER_BYTES, user_key, user_key_bytes);
  *key_bytes = (uint32_t)need;
  return 0;
}

/* Build the map key of (current key, id, kind, user key) in the instance's
 * key buffer, in the layout of the instance's kind of key.  Errors:
 * SL_EUSAGE (no keyed input, or outside process()), ENOMEM, EINVAL, and a
 * byte-key function's failure. */
static int state_key(sl_ctx *ctx, uint16_t id, uint8_t kind,
                     const void *user_key, uint32_t user_key_bytes,
                     uint32_t *key_bytes) {
  if (!ctx->cp.keyed)
    return SL_EUSAGE;
  if (__builtin_expect(ctx->cp.byte_keys, 0))
    return byte_state_key(ctx, id, kind, user_key, user_key_bytes, key_bytes);
  return u64_state_key(ctx, id, kind, user_key, user_key_bytes, key_bytes);
}

/* The words of header_key(). */
static inline void header_words(sl_cow_key *k, uint64_t record_key,
                                uint16_t id, uint8_t kind) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  /* The words as memcpy() reads them from the key: bytes 0..7 are the
   * big-endian record key, bytes 3..10 its last five bytes, then the id
   * (big-endian) and the kind. */
  k->first = __builtin_bswap64(record_key);
  k->last = k->first >> 24 | (uint64_t)(id >> 8) << 40 |
            (uint64_t)(id & 0xffu) << 48 | (uint64_t)kind << 56;
#else
  uint8_t bytes[KEY_HEADER_BYTES];
  sl_store_be64(bytes, record_key);
  bytes[8] = (uint8_t)(id >> 8);
  bytes[9] = (uint8_t)id;
  bytes[10] = kind;
  memcpy(&k->first, bytes, 8);
  memcpy(&k->last, bytes + 3, 8);
#endif
}

/* The key of (record key, id, kind) with no user key prepared for the
 * map (cow_map.h, sl_cow_key): hash and words computed in registers rather
 * than read back from the buffer just written, since such a read waits
 * for the stores.  bytes is set by the caller. */
static inline sl_cow_key header_key(uint64_t record_key, uint16_t id,
                                    uint8_t kind) {
  sl_cow_key k = {.key_bytes = KEY_HEADER_BYTES};
  header_words(&k, record_key, id, kind);
  k.hash = sl_cow_hash_words(k.first, k.last, KEY_HEADER_BYTES);
  return k;
}

/* state_key(), prepared for the map: from registers when there is no
 * user key (the value, list and fold states), else from the buffer. */
static inline int state_key_prepared(sl_ctx *ctx, uint16_t id, uint8_t kind,
                                     const void *user_key,
                                     uint32_t user_key_bytes,
                                     sl_cow_key *key) {
  uint32_t key_bytes;
  if (!ctx->cp.keyed)
    return SL_EUSAGE;
  if (__builtin_expect(ctx->cp.byte_keys, 0)) {
    int rc = byte_state_key(ctx, id, kind, user_key, user_key_bytes,
                            &key_bytes);
    if (rc == 0)
      *key = sl_cow_key_of(ctx->cp.key_buffer, key_bytes);
    return rc;
  }
  int rc = u64_state_key(ctx, id, kind, user_key, user_key_bytes, &key_bytes);
  if (rc)
    return rc;
  if (user_key_bytes == 0) {
    assert(key_bytes == KEY_HEADER_BYTES);
    const sl_instance_checkpoint *cp = &ctx->cp;
    if (cp->memo_kind == kind && cp->memo_id == id &&
        cp->memo_key == cp->current_key) {
      /* Hashed already for the prefetch (runtime.c note 13). */
      *key = (sl_cow_key){.key_bytes = KEY_HEADER_BYTES,
                          .hash = cp->memo_hash};
      header_words(key, cp->current_key, id, kind);
    } else {
      *key = header_key(cp->current_key, id, kind);
    }
    key->bytes = cp->key_buffer;
    ctx->cp.hint_id = id; /* the prefetch's guess (sl_state_prefetch) */
    ctx->cp.hint_kind = kind;
  } else {
    *key = sl_cow_key_of(ctx->cp.key_buffer, key_bytes);
  }
  return 0;
}

uint32_t sl_state_prefetch_stages(const sl_ctx *ctx) {
  const sl_instance_checkpoint *cp = &ctx->cp;
  const sl_channel *ch = ctx->current_channel;
  if (!cp->keyed || cp->hint_kind == 0 || cp->byte_keys || !ch || !ch->key)
    return 0;
  uint64_t bytes = sl_cow_map_memory_bytes(cp->keyed);
  if (bytes < SL_PREFETCH_MIN_STATE_BYTES)
    return 0;
  const sl_job *job = ctx->job;
  uint64_t chains = job->test_chain_prefetch ? job->test_chain_prefetch_bytes
                                             : SL_PREFETCH_CHAIN_MIN_STATE_BYTES;
  return bytes >= chains ? 3u : 2u;
}

void sl_state_prefetch_hashes(sl_ctx *ctx, const uint64_t *record_keys,
                              uint32_t count, uint64_t *hashes) {
  sl_instance_checkpoint *cp = &ctx->cp;
  assert(count >= 1 && count <= SL_COW_PREFETCH_MAX);
  assert(cp->hint_kind != 0);
  /* The hash state_key_prepared() will compute for each record, if the
   * operator calls with the same (id, kind) again. */
  for (uint32_t i = 0; i < count; i++)
    hashes[i] = header_key(record_keys[i], cp->hint_id, cp->hint_kind).hash;
  /* The memo holds the first record's, so it is a true one throughout. */
  cp->memo_id = cp->hint_id;
  cp->memo_kind = cp->hint_kind;
  cp->memo_key = record_keys[0];
  cp->memo_hash = hashes[0];
}

static int get(sl_ctx *ctx, uint16_t id, uint8_t kind, const void *user_key,
               uint32_t user_key_bytes, const void **value,
               uint32_t *size_bytes) {
  sl_cow_key key;
  int rc = state_key_prepared(ctx, id, kind, user_key, user_key_bytes, &key);
  if (rc)
    return rc;
  uint32_t bytes = 0;
  const void *v = sl_cow_map_find(ctx->cp.keyed, &key, &bytes);
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
  sl_cow_key key;
  int rc = state_key_prepared(ctx, id, kind, user_key, user_key_bytes, &key);
  if (rc)
    return rc;
  void *v = sl_cow_map_put_key(ctx->cp.keyed, &key, value, size_bytes);
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

SL_EXPORT int sl_state_update(sl_ctx *ctx, uint16_t state_id,
                              uint32_t size_bytes, const void *init,
                              void **value) {
  if (!value || size_bytes > SL_COW_MAX_BYTES)
    return EINVAL;
  sl_cow_key key;
  int rc = state_key_prepared(ctx, state_id, KIND_VALUE, 0, 0, &key);
  if (rc)
    return rc;
  return sl_cow_map_update(ctx->cp.keyed, &key, init, size_bytes, value);
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
  if (!fold || (!init && acc_bytes) || acc_bytes > SL_COW_MAX_BYTES)
    return EINVAL;
  sl_cow_key key;
  int rc = state_key_prepared(ctx, state_id, KIND_FOLD, 0, 0, &key);
  if (rc)
    return rc;
  /* One lookup: the accumulator (copied first if a checkpoint holds it, a
   * copy of init if absent) is folded in place.  EINVAL if the id was
   * used with another accumulator size. */
  void *acc;
  rc = sl_cow_map_update(ctx->cp.keyed, &key, init, acc_bytes, &acc);
  if (rc)
    return rc;
  fold(user, acc, value, value_bytes);
  if (acc_out)
    *acc_out = acc;
  return 0;
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
