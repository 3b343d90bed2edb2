/* builtin.c — the sequence source and the checksum sink. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "op_util.h" /* before internal.h: both are private */
#include "internal.h"
#include "sluice_testing.h"

/* Records a sequence source emits per next() call: enough that the forced
 * flush after each call (runtime.c note 2) costs little per record. */
#define SEQUENCE_RECORDS_PER_CALL 2048u

__extension__ typedef unsigned __int128 u128;

typedef struct sequence {
  uint64_t count;
  uint64_t key_count;
} sequence;

typedef struct sequence_instance {
  uint64_t next;
  uint64_t end;
  uint64_t key; /* next % key_count, kept incrementally (no division) */
  uint64_t key_count;
} sequence_instance;

static int sequence_open(sl_ctx *ctx, void *user, void **state) {
  const sequence *seq = user;
  sequence_instance *s = calloc(1, sizeof *s);
  if (!s)
    return ENOMEM;
  uint64_t parallelism = (uint64_t)sl_ctx_parallelism(ctx);
  uint64_t k = (uint64_t)sl_ctx_instance(ctx);
  /* Contiguous range [count*k/P, count*(k+1)/P); 128-bit products so huge
   * counts do not overflow. */
  s->next = (uint64_t)((u128)seq->count * k / parallelism);
  s->end = (uint64_t)((u128)seq->count * (k + 1) / parallelism);
  s->key_count = seq->key_count;
  s->key = s->key_count ? s->next % s->key_count : s->next;
  *state = s;
  return 0;
}

/* Tuples generated per sl_emit_batch call. */
#define SEQUENCE_RUN 256u

static int sequence_next(sl_ctx *ctx, void *state) {
  sequence_instance *s = state;
  sl_tuple run[SEQUENCE_RUN];
  for (uint32_t calls = 0;
       calls < SEQUENCE_RECORDS_PER_CALL / SEQUENCE_RUN && s->next < s->end;
       calls++) {
    uint32_t n = s->end - s->next < SEQUENCE_RUN ? (uint32_t)(s->end - s->next)
                                                 : SEQUENCE_RUN;
    for (uint32_t i = 0; i < n; i++) {
      run[i].key = s->key_count ? s->key : s->next + i;
      run[i].value = s->next + i;
      if (++s->key == s->key_count)
        s->key = 0;
    }
    int rc = sl_emit_batch(ctx, run, sizeof run[0], n);
    if (rc)
      return rc;
    s->next += n;
  }
  return s->next == s->end ? SL_SOURCE_END : 0;
}

/* Position: the next value to emit (replayable: position = count). */
static int sequence_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  const sequence_instance *s = state;
  return sl_operator_state_set(ctx, &s->next, sizeof s->next);
}

static int sequence_restore(sl_ctx *ctx, void *state, uint64_t id) {
  sequence_instance *s = state;
  uint64_t next;
  int rc = sl_operator_state_words(ctx, id, "sequence position", &next, 1);
  if (rc == SL_ENOTFOUND)
    return 0; /* no position saved: start from the beginning */
  if (rc)
    return rc;
  if (next > s->end) {
    sl_ctx_fail(ctx, "checkpoint %llu: position %llu is past the end %llu "
                "(was the job changed?)", (unsigned long long)id,
                (unsigned long long)next, (unsigned long long)s->end);
    return EINVAL;
  }
  s->next = next;
  s->key = s->key_count ? next % s->key_count : next;
  return 0;
}

static void sequence_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  free(state);
}

SL_EXPORT int sl_source_sequence(sl_job *job, const char *name,
                                 int parallelism, uint64_t count,
                                 uint64_t key_count, sl_op **op) {
  sequence *seq = malloc(sizeof *seq);
  if (!seq)
    return ENOMEM;
  seq->count = count;
  seq->key_count = key_count;
  static const sl_source_ops ops = {.open = sequence_open,
                                    .next = sequence_next,
                                    .close = sequence_close,
                                    .snapshot = sequence_snapshot,
                                    .restore = sequence_restore};
  int rc = sl_op_source(job, name, parallelism, &ops, seq, op);
  return op_adopt(rc, op, seq, free);
}

/* ------------------------------------------------------------ checksum */

static inline void checksum_add(sl_checksum *sum, const void *data,
                                uint32_t size) {
  sum->records++;
  sum->bytes += size;
  if (size == 16) {
    /* The common sl_tuple case, hashed without a call. */
    uint64_t w[2];
    memcpy(w, data, 16);
    sum->value_sum += w[1];
    sum->hash_sum += sl_mix64(w[0] ^ sl_mix64(w[1] + 0x9e3779b97f4a7c15ull));
    return;
  }
  if (size > 16) {
    uint64_t v;
    memcpy(&v, (const uint8_t *)data + 8, 8);
    sum->value_sum += v;
  }
  sum->hash_sum += XXH3_64bits(data, size);
}

SL_EXPORT void sl_checksum_add(sl_checksum *sum, const void *data,
                               uint32_t size_bytes) {
  checksum_add(sum, data, size_bytes);
}

typedef struct checksum_instance {
  sl_checksum local;
  sl_checksum *result;
} checksum_instance;

static int checksum_open(sl_ctx *ctx, void *user, void **state) {
  (void)ctx;
  checksum_instance *c = calloc(1, sizeof *c);
  if (!c)
    return ENOMEM;
  c->result = user;
  *state = c;
  return 0;
}

static int checksum_process(sl_ctx *ctx, void *state, int input,
                            const sl_record *in) {
  (void)ctx;
  (void)input;
  checksum_instance *c = state;
  checksum_add(&c->local, in->data, in->size_bytes);
  return 0;
}

static void checksum_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  checksum_instance *c = state;
  /* Once per instance, so atomic adds cost nothing measurable. */
  __atomic_fetch_add(&c->result->records, c->local.records, __ATOMIC_RELAXED);
  __atomic_fetch_add(&c->result->bytes, c->local.bytes, __ATOMIC_RELAXED);
  __atomic_fetch_add(&c->result->value_sum, c->local.value_sum,
                     __ATOMIC_RELAXED);
  __atomic_fetch_add(&c->result->hash_sum, c->local.hash_sum,
                     __ATOMIC_RELAXED);
  free(c);
}

SL_EXPORT int sl_sink_checksum(sl_job *job, const char *name, sl_op *input,
                               int parallelism, sl_checksum *result,
                               sl_op **op) {
  if (!result)
    return job ? (sl_job_set_error(job, "sink '%s': result is NULL",
                                   name ? name : "(null)"),
                  SL_EGRAPH)
               : EINVAL;
  static const sl_process_ops ops = {.open = checksum_open,
                                     .process = checksum_process,
                                     .close = checksum_close};
  return sl_op_sink(job, name, input, parallelism, &ops, result, op);
}
