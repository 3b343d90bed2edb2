/* timer.c — event time: watermarks at sources and through operators, idle
 * inputs, and per-key timers in event and processing time.
 *
 * NOTES ON THE DESIGN
 *
 * 1. Watermarks are control entries in the rings (ring.h note 6), so they
 *    stay in order with the records around them.  Each channel remembers
 *    the newest watermark it delivered; an instance's input watermark is
 *    the minimum over the channels that are neither ended nor idle, and it
 *    only moves forward.  When it advances the instance fires the
 *    event-time timers it made due (in time order), calls on_watermark,
 *    and then writes the watermark on every output ring: records a timer
 *    emits reach the next operator before the watermark that caused them,
 *    so they are never late there.  Operators without timers (map, filter,
 *    flat_map) just forward.
 * 2. Sources generate watermarks from what they emit (sl_op_watermarks):
 *    W = (largest timestamp emitted) - out_of_orderness - 1, checked after
 *    each next() call.  When it advanced it is sent at once if the source
 *    has caught up with its input: the call emitted no record (it found
 *    nothing to emit), or the source said so from inside next() before it
 *    waits for more (sl_source_caught_up; the push source does).  While
 *    every call emits records it is sent at most every interval_ms.  So
 *    a trickle of records moves event time, and closes windows, without
 *    waiting for the interval, and a source that never runs dry sends no
 *    more watermarks than before: the output batches' flush-on-idle rule
 *    (runtime.c note 2), applied to event time.  (A source whose calls
 *    alternate between emitting and finding nothing, e.g. a reader that
 *    gets EAGAIN after each batch, sends one per batch that advanced it.)
 *    A source instance that emitted nothing for idle_timeout_ms sends IDLE;
 *    its channels then drop out of the minimum downstream.  The next record
 *    or watermark on such a channel makes it active again (a record only
 *    clears the flag; the channel's watermark is what it was).  An
 *    instance whose live inputs are all idle forwards IDLE itself, and
 *    ACTIVE when one of them becomes active again.
 * 3. At the end of input a source sends SL_WATERMARK_MAX; an ended channel
 *    counts as +infinity, so when the last one ends the instance advances
 *    to SL_WATERMARK_MAX before finish(): every event-time timer fires and
 *    every window closes, and the final checkpoint holds none of them.
 * 4. Timers are keyed state.  A timer is an entry of the instance's
 *    copy-on-write map with the key
 *        [record key: u64 BE][0xFFFF][kind 5][domain: u8][time: u64 BE,
 *         sign bit flipped so that byte order is numeric order]
 *    and a one-byte value, so it is checkpointed, restored and rescaled
 *    (by key group) with the rest of the state, at no extra cost in the
 *    snapshot.  Beside the map, each domain has an in-memory binary heap of
 *    (time, key) for finding what is due.  Deleting removes only the map
 *    entry; a heap item whose entry is gone is skipped when it surfaces,
 *    and so is a duplicate (the map entry is deleted by the first); once
 *    deletes reach three quarters of the heap (and 4096, compact_due()),
 *    the heap is compacted.  After a restore the heaps are rebuilt by one
 *    scan of the map.  Operators that move a deadline forward per record
 *    are better off not deleting at all: leave the old timer and re-arm
 *    when it fires (window.c note 6).
 *    A byte-string key (state.c) puts its hash first, marks the kind
 *    (TIMER_KIND | 0x80) and follows it with [length: u32 BE][key bytes]
 *    before the domain and time; its heap items own a copy of the key
 *    (timer_item.blob), freed when the item leaves the heap, so timers of
 *    two keys with one hash fire each with its own key.
 * 5. Processing-time timers fire when the wall clock (CLOCK_REALTIME, ms)
 *    has passed them (now > time): checked after each pass over the
 *    inputs, and an instance waiting for input with such timers parks
 *    with a timeout instead of indefinitely.  At the end of input the ones
 *    pending then fire as well, before the final watermark, so a bounded
 *    job loses no window to the clock (Flink would drop them); timers they
 *    register are not fired.
 * 6. A timer's callback runs with its key current (cp.current_key set,
 *    key_valid true: state.c uses it without a record) and with a record
 *    of no data whose timestamp is the timer's time, so sl_emit stamps the
 *    output with it.
 * 7. Each snapshot saves the instance's watermark and (for sources) the
 *    largest timestamp emitted, after its operator state (checkpoint_writer.c,
 *    write_instance).  A restored instance starts from them, with every
 *    input channel at the saved watermark, instead of from no watermark:
 *    so the records replayed after a restore are judged late or not
 *    exactly as they were before the failure, and a source's next
 *    watermark is computed from the same maximum.  Flink starts from
 *    nothing, and a replay can then keep a record its first run dropped.
 * 8. An instance restored as finished (coordinator.c note 10) already
 *    fired everything at its end of input; the timers left in its state
 *    were registered while they fired (note 5: a periodic timer re-arming
 *    itself).  They are not loaded into the heaps, so they never fire,
 *    and the end of input is not run again.  Its event time is restored
 *    (the final snapshot saves it again) but not sent: its END is all its
 *    consumers get.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "time_check.h"

#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

#define TIMER_STATE_ID 0xFFFFu
#define TIMER_KIND 5u
#define TIMER_KEY_BYTES 20u
#define TIMER_BYTES_KIND (TIMER_KIND | 0x80u) /* byte-string key (note 4) */
#define TIMER_BYTES_HEADER 15u /* hash, id, kind, length */

typedef struct timer_item {
  int64_t time;
  uint64_t key;  /* the key, or a byte-string key's hash */
  uint8_t *blob; /* byte-string key: [length: u32][bytes], owned; else NULL */
} timer_item;

typedef struct timer_heap {
  timer_item *items;
  uint32_t count;
  uint32_t capacity;
} timer_heap;

struct sl_timers {
  timer_heap heap[2]; /* enum sl_time_domain */
  uint32_t deleted[2]; /* deletes since the last compaction (note 4) */
  uint8_t *key_buffer;  /* map key of a byte-keyed timer */
  uint32_t key_buffer_bytes;
};

static int send_watermark(sl_instance *inst, int64_t watermark);

static inline bool item_before(const timer_item *a, const timer_item *b) {
  return a->time < b->time || (a->time == b->time && a->key < b->key);
}

static int item_cmp(const void *a, const void *b) {
  const timer_item *x = a, *y = b;
  return item_before(x, y) ? -1 : item_before(y, x) ? 1 : 0;
}

static int heap_push(timer_heap *h, int64_t time, uint64_t key,
                     uint8_t *blob) {
  if (h->count == h->capacity) {
    uint32_t capacity = h->capacity ? h->capacity * 2 : 64;
    timer_item *grown = realloc(h->items, sizeof *grown * capacity);
    if (!grown)
      return ENOMEM;
    h->items = grown;
    h->capacity = capacity;
  }
  uint32_t i = h->count++;
  timer_item it = {.time = time, .key = key, .blob = blob};
  while (i > 0) {
    uint32_t parent = (i - 1) / 2;
    if (!item_before(&it, &h->items[parent]))
      break;
    h->items[i] = h->items[parent];
    i = parent;
  }
  h->items[i] = it;
  return 0;
}

/* Put `it` at slot i or below, moving smaller children up: at most
 * log2(count) steps, since the slot index at least doubles each step. */
static void sift_down(timer_heap *h, uint32_t i, timer_item it) {
  assert(i < h->count);
  for (;;) {
    uint32_t child = 2 * i + 1;
    if (child >= h->count)
      break;
    if (child + 1 < h->count && item_before(&h->items[child + 1],
                                            &h->items[child]))
      child++;
    if (!item_before(&h->items[child], &it))
      break;
    h->items[i] = h->items[child];
    i = child;
  }
  h->items[i] = it;
}

static timer_item heap_pop(timer_heap *h) {
  assert(h->count > 0);
  timer_item top = h->items[0];
  timer_item last = h->items[--h->count];
  if (h->count > 0)
    sift_down(h, 0, last);
  return top;
}

/* Heap order over the whole array, bottom-up (Floyd): O(count). */
static void heapify(timer_heap *h) {
  for (uint32_t i = h->count / 2; i-- > 0;)
    sift_down(h, i, h->items[i]);
}

/* Whole-heap checker, for asserts: every item is not before its parent. */
static __attribute__((unused)) bool heap_check(const timer_heap *h) {
  for (uint32_t i = 1; i < h->count; i++)
    if (item_before(&h->items[i], &h->items[(i - 1) / 2]))
      return false;
  return h->count <= h->capacity;
}

static void timer_key(uint8_t *k, uint64_t key, int domain, int64_t time) {
  sl_store_be64(k, key);
  k[8] = (uint8_t)(TIMER_STATE_ID >> 8);
  k[9] = (uint8_t)TIMER_STATE_ID;
  k[10] = TIMER_KIND;
  k[11] = (uint8_t)domain;
  sl_store_be64(k + 12, (uint64_t)time ^ (1ull << 63));
}

static uint32_t load_be32(const uint8_t *in) {
  return (uint32_t)in[0] << 24 | (uint32_t)in[1] << 16 | (uint32_t)in[2] << 8 |
         in[3];
}

/* A copy of key bytes as a heap item's blob: [length: u32][bytes]. */
static uint8_t *blob_new(const uint8_t *data, uint32_t bytes) {
  uint8_t *blob = malloc(4u + bytes);
  if (!blob)
    return 0;
  memcpy(blob, &bytes, 4);
  if (bytes)
    memcpy(blob + 4, data, bytes);
  return blob;
}

static uint32_t blob_bytes(const uint8_t *blob) {
  uint32_t bytes;
  memcpy(&bytes, blob, 4);
  return bytes;
}

/* The map key of the timer (key, domain, time) (note 4), with n key bytes
 * at data (n = NO_BYTES: a 64-bit key): in k (20 bytes) for a 64-bit key,
 * else in the timers' buffer.  0 or ENOMEM. */
#define NO_BYTES UINT32_MAX
static int timer_map_key(struct sl_timers *timers, uint8_t *k, uint64_t key,
                         const uint8_t *data, uint32_t n, int domain,
                         int64_t time, const uint8_t **out,
                         uint32_t *out_bytes) {
  if (n == NO_BYTES) {
    timer_key(k, key, domain, time);
    *out = k;
    *out_bytes = TIMER_KEY_BYTES;
    return 0;
  }
  uint32_t need = TIMER_BYTES_HEADER + n + 9u;
  if (need > timers->key_buffer_bytes) {
    uint8_t *grown = realloc(timers->key_buffer, need);
    if (!grown)
      return ENOMEM;
    timers->key_buffer = grown;
    timers->key_buffer_bytes = need;
  }
  uint8_t *b = timers->key_buffer;
  timer_key(b, key, domain, time); /* header, then moved past the key */
  b[10] = TIMER_BYTES_KIND;
  memmove(b + TIMER_BYTES_HEADER + n, b + 11, 9);
  for (int i = 0; i < 4; i++)
    b[11 + i] = (uint8_t)(n >> (24 - 8 * i));
  if (n)
    memcpy(b + TIMER_BYTES_HEADER, data, n);
  *out = b;
  *out_bytes = need;
  return 0;
}

/* Is map key k a timer's?  Sets *key_at, *key_len to its key bytes (a
 * byte-string key) or *key_len to UINT32_MAX (a 64-bit key), and *tail to
 * its [domain][time]. */
static bool is_timer_key(const uint8_t *k, uint32_t bytes,
                         const uint8_t **tail, uint32_t *key_len) {
  if (bytes < TIMER_KEY_BYTES || k[8] != (uint8_t)(TIMER_STATE_ID >> 8) ||
      k[9] != (uint8_t)TIMER_STATE_ID)
    return false;
  if (k[10] == TIMER_KIND && bytes == TIMER_KEY_BYTES) {
    *tail = k + 11;
    *key_len = NO_BYTES;
  } else if (k[10] == TIMER_BYTES_KIND && bytes >= TIMER_BYTES_HEADER + 9u &&
             load_be32(k + 11) == bytes - TIMER_BYTES_HEADER - 9u) {
    *key_len = load_be32(k + 11);
    *tail = k + TIMER_BYTES_HEADER + *key_len;
  } else {
    return false;
  }
  return (*tail)[0] <= 1;
}

/* timer_map_key() of a heap item. */
static int item_map_key(struct sl_timers *timers, uint8_t *k,
                        const timer_item *it, int domain, const uint8_t **out,
                        uint32_t *out_bytes) {
  return timer_map_key(timers, k, it->key, it->blob ? it->blob + 4 : 0,
                       it->blob ? blob_bytes(it->blob) : NO_BYTES, domain,
                       it->time, out, out_bytes);
}

static void heap_clear(timer_heap *h) {
  for (uint32_t i = 0; i < h->count; i++)
    free(h->items[i].blob);
  h->count = 0;
}

static int timers_get(sl_instance *inst, struct sl_timers **out) {
  if (!inst->timers) {
    inst->timers = calloc(1, sizeof *inst->timers);
    if (!inst->timers)
      return ENOMEM;
  }
  *out = inst->timers;
  return 0;
}

/* ----------------------------------------------------------- lifecycle */

void sl_event_reset(sl_instance *inst) {
  inst->watermark = SL_WATERMARK_MIN;
  inst->watermark_out = SL_WATERMARK_MIN;
  inst->max_timestamp = SL_NO_TIMESTAMP;
  inst->watermark_due_ns = 0;
  inst->last_active_ns = 0;
  inst->records_at_tick = 0;
  inst->output_idle = false;
  atomic_store_explicit(&inst->watermark_shared, SL_WATERMARK_MIN,
                        memory_order_relaxed);
  if (inst->timers)
    for (int d = 0; d < 2; d++) {
      heap_clear(&inst->timers->heap[d]);
      inst->timers->deleted[d] = 0;
    }
  for (int c = 0; c < inst->channel_count && inst->channels; c++) {
    inst->channels[c].watermark = SL_WATERMARK_MIN;
    inst->channels[c].idle = false;
  }
}

void sl_event_free(sl_instance *inst) {
  if (!inst->timers)
    return;
  for (int d = 0; d < 2; d++) {
    heap_clear(&inst->timers->heap[d]);
    free(inst->timers->heap[d].items);
  }
  free(inst->timers->key_buffer);
  free(inst->timers);
  inst->timers = 0;
}

typedef struct restore_scan {
  struct sl_timers *timers;
  int rc;
} restore_scan;

static int restore_entry(void *arg, const sl_cow_entry *e) {
  restore_scan *scan = arg;
  const uint8_t *k = sl_cow_entry_key(e);
  const uint8_t *tail;
  uint32_t key_len;
  if (!is_timer_key(k, e->key_bytes, &tail, &key_len))
    return 0;
  int64_t time = (int64_t)(sl_load_be64(tail + 1) ^ (1ull << 63));
  uint8_t *blob = 0;
  if (key_len != NO_BYTES) {
    blob = blob_new(k + TIMER_BYTES_HEADER, key_len);
    if (!blob)
      return scan->rc = ENOMEM;
  }
  scan->rc = heap_push(&scan->timers->heap[tail[0]], time, sl_load_be64(k),
                       blob);
  if (scan->rc)
    free(blob);
  return scan->rc;
}

/* Note 7: the watermark state the checkpoint saved. */
static int restore_event_time(sl_instance *inst) {
  if (!inst->cp.has_event_time_restored)
    return 0;
  int64_t watermark = inst->cp.event_time_restored[0];
  inst->max_timestamp = inst->cp.event_time_restored[1];
  if (watermark == SL_WATERMARK_MIN)
    return 0;
  inst->watermark = watermark;
  atomic_store_explicit(&inst->watermark_shared, watermark,
                        memory_order_relaxed);
  for (int c = 0; c < inst->channel_count; c++)
    inst->channels[c].watermark = watermark;
  /* Downstream instances restore their own; sending it again costs one
   * entry and makes a source's consumers current at once.  A finished
   * instance sends only its END (note 8). */
  if (inst->op->kind == SL_OP_SINK || inst->cp.restored_finished)
    return 0;
  return send_watermark(inst, watermark);
}

int sl_event_restore(sl_instance *inst) {
  int rc = restore_event_time(inst);
  if (rc || inst->cp.restored_finished)
    return rc; /* note 8: its timers never fire */
  if (!inst->cp.keyed || !inst->op->fn.process.on_timer ||
      (inst->op->kind != SL_OP_PROCESS && inst->op->kind != SL_OP_SINK))
    return 0;
  struct sl_timers *timers;
  rc = timers_get(inst, &timers);
  if (rc)
    return rc;
  for (int d = 0; d < 2; d++)
    heap_clear(&timers->heap[d]);
  restore_scan scan = {.timers = timers};
  rc = sl_cow_map_foreach(inst->cp.keyed, restore_entry, &scan);
  if (rc == 0)
    rc = scan.rc;
  if (rc)
    sl_ctx_fail(inst, "rebuilding the timers from checkpoint %" PRIu64
                " failed", inst->cp.restored_from);
  return rc;
}

/* ----------------------------------------------------------- public calls */

SL_EXPORT int sl_ctx_key(sl_ctx *ctx, uint64_t *key) {
  sl_instance_checkpoint *cp = &ctx->cp;
  if (!cp->keyed || !key)
    return SL_EUSAGE;
  if (!cp->key_valid) {
    if (!ctx->current || !ctx->current_channel || !ctx->current_channel->key)
      return SL_EUSAGE;
    const sl_channel *ch = ctx->current_channel;
    if (__builtin_expect(cp->byte_keys, 0)) {
      int rc = sl_byte_key_compute(ctx, ch);
      if (rc)
        return rc;
    } else {
      cp->current_key = ch->key(ch->key_user, ctx->current);
      cp->key_valid = true;
    }
  }
  *key = cp->current_key;
  return 0;
}

SL_EXPORT int64_t sl_ctx_watermark(const sl_ctx *ctx) {
  return ctx->watermark;
}

SL_EXPORT int64_t sl_ctx_processing_time(const sl_ctx *ctx) {
  (void)ctx;
  return sl_wall_ms();
}

static int timer_check(sl_ctx *ctx, int domain, uint64_t *key) {
  if (domain != SL_EVENT_TIME && domain != SL_PROCESSING_TIME)
    return EINVAL;
  if (!ctx->op->fn.process.on_timer ||
      (ctx->op->kind != SL_OP_PROCESS && ctx->op->kind != SL_OP_SINK))
    return SL_EUSAGE;
  return sl_ctx_key(ctx, key);
}

SL_EXPORT int sl_timer_register(sl_ctx *ctx, int domain, int64_t time) {
  uint64_t key;
  int rc = timer_check(ctx, domain, &key);
  if (rc)
    return rc;
  struct sl_timers *timers;
  rc = timers_get(ctx, &timers);
  if (rc)
    return rc;
  const sl_instance_checkpoint *cp = &ctx->cp;
  uint8_t small[TIMER_KEY_BYTES];
  const uint8_t *k;
  uint32_t k_bytes;
  rc = timer_map_key(timers, small, key, cp->key_data,
                     cp->byte_keys ? cp->key_data_bytes : NO_BYTES, domain,
                     time, &k, &k_bytes);
  if (rc)
    return rc;
  if (sl_cow_map_get(cp->keyed, k, k_bytes, 0))
    return 0; /* already registered */
  uint8_t *blob = 0;
  if (cp->byte_keys && !(blob = blob_new(cp->key_data, cp->key_data_bytes)))
    return ENOMEM;
  uint8_t one = 1;
  if (!sl_cow_map_put(cp->keyed, k, k_bytes, &one, 1)) {
    free(blob);
    return ENOMEM;
  }
  rc = heap_push(&timers->heap[domain], time, key, blob);
  if (rc) {
    sl_cow_map_delete(cp->keyed, k, k_bytes);
    free(blob);
  }
  return rc;
}

/* Drop the heap items of deleted timers once they are many (note 4):
 * without this, a pattern that deletes and registers a timer per record
 * (a timeout pushed back by each record) grows the heap with the record
 * count until the watermark catches up.  One map lookup per item; the
 * survivors are put back in heap order in O(count). */
static void compact(sl_instance *inst, int domain) {
  timer_heap *h = &inst->timers->heap[domain];
  uint32_t kept = 0;
  for (uint32_t i = 0; i < h->count; i++) {
    uint8_t small[TIMER_KEY_BYTES];
    const uint8_t *k;
    uint32_t k_bytes;
    /* On ENOMEM (a byte key's buffer) keep the item: it is skipped when
     * it surfaces if its timer is gone. */
    if (item_map_key(inst->timers, small, &h->items[i], domain, &k,
                     &k_bytes) != 0 ||
        sl_cow_map_get(inst->cp.keyed, k, k_bytes, 0))
      h->items[kept++] = h->items[i];
    else
      free(h->items[i].blob);
  }
  assert(kept <= h->count);
  h->count = kept;
  heapify(h);
  assert(heap_check(h));
  inst->timers->deleted[domain] = 0;
}

/* Compact once deletes since the last compaction reach 3/4 of the heap
 * (and COMPACT_MIN_DELETES): the heap stays within 4x its live timers
 * (plus COMPACT_MIN_DELETES), and a compaction, which looks up at most
 * count/4 live items beside the deleted ones (each of which would cost a
 * lookup when it surfaced anyway), adds at most 1/3 lookup per delete. */
#define COMPACT_MIN_DELETES 4096u

static bool compact_due(const struct sl_timers *timers, int domain) {
  uint64_t deleted = timers->deleted[domain];
  return deleted >= COMPACT_MIN_DELETES &&
         4 * deleted >= 3 * (uint64_t)timers->heap[domain].count;
}

SL_EXPORT int sl_timer_delete(sl_ctx *ctx, int domain, int64_t time) {
  uint64_t key;
  int rc = timer_check(ctx, domain, &key);
  if (rc)
    return rc;
  const sl_instance_checkpoint *cp = &ctx->cp;
  uint8_t small[TIMER_KEY_BYTES];
  const uint8_t *k = small;
  uint32_t k_bytes = TIMER_KEY_BYTES;
  if (likely(!cp->byte_keys)) { /* a 64-bit key: nothing allocated */
    timer_key(small, key, domain, time);
  } else { /* the key buffer lives in the timers */
    struct sl_timers *timers;
    rc = timers_get(ctx, &timers);
    if (rc == 0)
      rc = timer_map_key(timers, small, key, cp->key_data,
                         cp->key_data_bytes, domain, time, &k, &k_bytes);
  }
  if (rc == 0)
    rc = sl_cow_map_delete(ctx->cp.keyed, k, k_bytes);
  if (rc == 0 && ctx->timers) {
    ctx->timers->deleted[domain]++;
    if (compact_due(ctx->timers, domain))
      compact(ctx, domain);
  }
  return rc;
}

/* ----------------------------------------------------------- firing */

/* Fire timer t of domain if it is still set (one deleted, or a duplicate
 * already fired, is not): delete it from the state, then call on_timer
 * with t's key current and an empty record of t's time as the current
 * record.  Frees t's blob.  Leaves inst->current NULL and no key current;
 * the caller restores what it saved.  Returns 0, the delete's error, or
 * on_timer's nonzero return, which fails the job (runtime.c note 8). */
static int fire_one(sl_instance *inst, int domain, timer_item t) {
  sl_instance_checkpoint *cp = &inst->cp;
  uint8_t small[TIMER_KEY_BYTES];
  const uint8_t *k = small;
  uint32_t k_bytes = TIMER_KEY_BYTES;
  int rc = 0;
  if (likely(!t.blob)) /* a 64-bit key: no call, no free (note 4) */
    timer_key(small, t.key, domain, t.time);
  else
    rc = item_map_key(inst->timers, small, &t, domain, &k, &k_bytes);
  if (rc == 0 && sl_cow_map_get(cp->keyed, k, k_bytes, 0))
    rc = sl_cow_map_delete(cp->keyed, k, k_bytes);
  else if (rc == 0)
    rc = SL_ENOTFOUND; /* deleted, or a duplicate already fired */
  if (rc) {
    if (unlikely(t.blob))
      free(t.blob);
    return rc == SL_ENOTFOUND ? 0 : rc;
  }
  sl_record rec = {.data = 0, .size_bytes = 0, .timestamp = t.time};
  inst->current = &rec;
  inst->current_channel = 0;
  cp->current_key = t.key;
  if (t.blob) { /* the key's bytes, for state and sl_ctx_key_bytes */
    cp->key_data = t.blob + 4;
    cp->key_data_bytes = blob_bytes(t.blob);
  }
  cp->key_valid = true;
  rc = inst->op->fn.process.on_timer(inst, inst->state, domain, t.time);
  cp->key_valid = false;
  cp->key_data = 0;
  cp->key_data_bytes = 0;
  inst->current = 0; /* rec ends here */
  if (unlikely(t.blob))
    free(t.blob);
  return rc;
}

/* Fire every timer of domain due at `upto` (note 4, 6). */
static int fire(sl_instance *inst, int domain, int64_t upto) {
  struct sl_timers *timers = inst->timers;
  if (!timers)
    return 0;
  timer_heap *h = &timers->heap[domain];
  const sl_record *saved = inst->current;
  sl_channel *saved_channel = inst->current_channel;
  int rc = 0;
  while (rc == 0 && h->count > 0 && h->items[0].time <= upto) {
    rc = fire_one(inst, domain, heap_pop(h));
    if (rc == 0 && atomic_load_explicit(&inst->job->stopping,
                                        memory_order_relaxed))
      rc = SL_ESTOPPED;
  }
  inst->current = saved;
  inst->current_channel = saved_channel;
  if (rc != 0 && rc != SL_ESTOPPED && !inst->cause[0])
    sl_ctx_fail(inst, "on_timer (%s time %" PRId64 ") returned %d",
                domain == SL_EVENT_TIME ? "event" : "processing", upto, rc);
  return rc;
}

/* A processing-time timer at T fires once the clock has passed T (now >
 * T), so records processed during millisecond T still find the windows
 * that end at T + 1 open (as Flink's +1 ms). */
bool sl_event_processing_due(sl_instance *inst) {
  const timer_heap *h = &inst->timers->heap[SL_PROCESSING_TIME];
  return h->count > 0 && h->items[0].time < sl_wall_ms();
}

uint64_t sl_event_processing_wait_ns(sl_instance *inst) {
  const timer_heap *h = &inst->timers->heap[SL_PROCESSING_TIME];
  if (h->count == 0)
    return UINT64_MAX;
  int64_t now = sl_wall_ms();
  if (h->items[0].time < now)
    return 0;
  int64_t wait_ms = sl_time_add_sat(sl_time_sub_sat(h->items[0].time, now),
                                    1);
  return wait_ms > 1000000 ? 1000000000000ull : (uint64_t)wait_ms * 1000000u;
}

int sl_event_fire_processing(sl_instance *inst) {
  return fire(inst, SL_PROCESSING_TIME, sl_wall_ms() - 1);
}

/* End of input (note 5): fire the processing-time timers pending now, in
 * time order, and only those: a timer registered while they fire (a
 * periodic one re-arming itself) stays pending, or the loop would chase
 * the clock to INT64_MAX. */
static int fire_pending_processing(sl_instance *inst) {
  timer_heap *h = &inst->timers->heap[SL_PROCESSING_TIME];
  if (h->count == 0)
    return 0;
  timer_heap due = *h;
  *h = (timer_heap){0};
  qsort(due.items, due.count, sizeof *due.items, item_cmp);
  int rc = 0;
  uint32_t i = 0;
  for (; i < due.count && rc == 0; i++) {
    rc = fire_one(inst, SL_PROCESSING_TIME, due.items[i]); /* frees blob */
    /* runtime.c note 8 */
    if (rc != 0 && rc != SL_ESTOPPED && !inst->cause[0])
      sl_ctx_fail(inst, "on_timer (processing time %" PRId64 ") returned %d",
                  due.items[i].time, rc);
  }
  for (; i < due.count; i++) /* left after a failure */
    free(due.items[i].blob);
  free(due.items);
  return rc;
}

/* ----------------------------------------------------------- watermarks */

static int send_watermark(sl_instance *inst, int64_t watermark) {
  if (watermark <= inst->watermark_out || inst->output_count == 0)
    return 0;
  inst->watermark_out = watermark;
  inst->output_idle = false; /* a watermark makes the outputs active */
  return sl_instance_write_control(inst, SL_ENTRY_WATERMARK,
                                   (uint64_t)watermark);
}

/* The input watermark advanced to watermark (note 1). */
static int advance(sl_instance *inst, int64_t watermark) {
  assert(watermark > inst->watermark);
  inst->watermark = watermark;
  atomic_store_explicit(&inst->watermark_shared, watermark,
                        memory_order_relaxed);
  const sl_op *op = inst->op;
  int rc = 0;
  if (op->kind == SL_OP_PROCESS || op->kind == SL_OP_SINK) {
    rc = fire(inst, SL_EVENT_TIME, watermark);
    if (rc == 0 && op->fn.process.on_watermark) {
      const sl_record *saved = inst->current;
      inst->current = 0;
      rc = op->fn.process.on_watermark(inst, inst->state, watermark);
      inst->current = saved;
      /* runtime.c note 8 */
      if (rc != 0 && rc != SL_ESTOPPED && !inst->cause[0])
        sl_ctx_fail(inst, "on_watermark (%" PRId64 ") returned %d", watermark,
                    rc);
    }
  }
  if (rc == 0 && op->kind != SL_OP_SINK)
    rc = send_watermark(inst, watermark);
  return rc;
}

/* Recompute the input watermark and idleness from the channels (note 1, 2,
 * 3). */
static int combine(sl_instance *inst) {
  int64_t low = SL_WATERMARK_MAX;
  bool all_ended = true, any_active = false;
  for (int c = 0; c < inst->channel_count; c++) {
    const sl_channel *ch = &inst->channels[c];
    /* A channel at SL_WATERMARK_MAX has ended in event time (its END
     * follows): like an ended one it neither holds the minimum back nor
     * counts as an active input, so the others' idleness still stops
     * time (note 3). */
    if (ch->ended || ch->watermark == SL_WATERMARK_MAX)
      continue;
    all_ended = false;
    if (ch->idle)
      continue;
    any_active = true;
    if (ch->watermark < low)
      low = ch->watermark;
  }
  if (!all_ended && !any_active) {
    /* Every live input is idle: so are we, downstream. */
    if (!inst->output_idle && inst->output_count > 0 &&
        inst->op->kind != SL_OP_SINK) {
      inst->output_idle = true;
      return sl_instance_write_control(inst, SL_ENTRY_IDLE, 1);
    }
    return 0;
  }
  if (inst->output_idle && inst->op->kind != SL_OP_SINK) {
    inst->output_idle = false;
    int rc = sl_instance_write_control(inst, SL_ENTRY_IDLE, 0);
    if (rc)
      return rc;
  }
  if (low > inst->watermark && low != SL_WATERMARK_MIN)
    return advance(inst, low);
  return 0;
}

int sl_event_channel_watermark(sl_instance *inst, sl_channel *ch,
                               int64_t watermark) {
  ch->idle = false;
  if (watermark > ch->watermark)
    ch->watermark = watermark;
  return combine(inst);
}

/* Note 2: a record makes its idle channel active again; if this instance
 * had told its consumers it was idle, it tells them it is active, or its
 * next turn to idle would go unsaid and they would wait for it. */
int sl_event_channel_record(sl_instance *inst, sl_channel *ch) {
  ch->idle = false;
  if (!inst->output_idle || inst->op->kind == SL_OP_SINK)
    return 0;
  inst->output_idle = false;
  return sl_instance_write_control(inst, SL_ENTRY_IDLE, 0);
}

int sl_event_channel_idle(sl_instance *inst, sl_channel *ch, bool idle) {
  ch->idle = idle;
  return combine(inst);
}

int sl_event_channel_ended(sl_instance *inst) { return combine(inst); }

int sl_event_input_end(sl_instance *inst) {
  int rc = 0;
  /* Note 5: what the clock has not reached yet fires now, before the
   * final watermark, so its output is not late downstream. */
  if (inst->timers)
    rc = fire_pending_processing(inst);
  if (rc == 0 && inst->watermark < SL_WATERMARK_MAX)
    rc = advance(inst, SL_WATERMARK_MAX);
  return rc;
}

/* ----------------------------------------------------------- sources */

/* Note 2: send W if it advanced.  Returns 0 or the error of the write. */
static int source_watermark(sl_instance *inst) {
  if (inst->max_timestamp == SL_NO_TIMESTAMP)
    return 0;
  const sl_watermark_config *w = &inst->op->watermarks;
  /* W = max - bound - 1, saturating at the low end (time_check.h note 4):
   * bound >= 0, so W < max <= INT64_MAX and a record's time never makes
   * the final SL_WATERMARK_MAX. */
  int64_t candidate = sl_time_sub_sat(
      sl_time_sub_sat(inst->max_timestamp, w->out_of_orderness), 1);
  if (candidate <= SL_WATERMARK_MIN)
    candidate = SL_WATERMARK_MIN + 1;
  assert(candidate < SL_WATERMARK_MAX);
  if (candidate <= inst->watermark)
    return 0;
  inst->watermark = candidate;
  atomic_store_explicit(&inst->watermark_shared, candidate,
                        memory_order_relaxed);
  return send_watermark(inst, candidate);
}

int sl_event_source_tick(sl_instance *inst) {
  const sl_watermark_config *w = &inst->op->watermarks;
  uint64_t now = sl_now_ns();
  /* A call that emitted nothing found the source caught up (note 2). */
  bool caught_up = inst->records_out == inst->records_at_tick &&
                   inst->last_active_ns != 0;
  if (inst->records_out != inst->records_at_tick || inst->last_active_ns == 0) {
    inst->records_at_tick = inst->records_out;
    inst->last_active_ns = now;
    /* Records already made the channels active downstream (note 2). */
    inst->output_idle = false;
  }
  if (w->every_call || caught_up || now >= inst->watermark_due_ns) {
    int64_t before = inst->watermark;
    int rc = source_watermark(inst);
    if (rc)
      return rc;
    /* The interval runs from the last watermark sent: a busy source that
     * just caught up sends its next one interval_ms later at the soonest,
     * unless it catches up again. */
    if (inst->watermark != before || now >= inst->watermark_due_ns)
      inst->watermark_due_ns = now + (uint64_t)w->interval_ms * 1000000u;
  }
  if (w->idle_timeout_ms && !inst->output_idle &&
      now - inst->last_active_ns >= (uint64_t)w->idle_timeout_ms * 1000000u) {
    inst->output_idle = true;
    return sl_instance_write_control(inst, SL_ENTRY_IDLE, 1);
  }
  return 0;
}

/* Note 2: called by a source inside next() when it has emitted everything
 * it has and is about to wait for more. */
void sl_source_caught_up(sl_ctx *ctx) {
  assert(ctx->op->kind == SL_OP_SOURCE);
  if (!ctx->op->has_watermarks || ctx->emit_closed)
    return;
  int64_t before = ctx->watermark;
  int rc = source_watermark(ctx);
  /* The interval runs from the last watermark sent, as in the tick. */
  if (ctx->watermark != before)
    ctx->watermark_due_ns =
        sl_now_ns() + (uint64_t)ctx->op->watermarks.interval_ms * 1000000u;
  /* A failed write means the job is stopping (SL_ESTOPPED): the source
   * notices that when next() returns, as after any wait. */
  (void)rc;
}

int sl_event_source_end(sl_instance *inst) {
  inst->watermark = SL_WATERMARK_MAX;
  atomic_store_explicit(&inst->watermark_shared, SL_WATERMARK_MAX,
                        memory_order_relaxed);
  return send_watermark(inst, SL_WATERMARK_MAX);
}

SL_EXPORT int sl_emit_watermark(sl_ctx *ctx, int64_t watermark) {
  if (ctx->in_sink || ctx->emit_closed)
    return SL_EUSAGE;
  if (ctx->op->kind == SL_OP_SOURCE && watermark > ctx->watermark) {
    ctx->watermark = watermark;
    atomic_store_explicit(&ctx->watermark_shared, watermark,
                          memory_order_relaxed);
  }
  return send_watermark(ctx, watermark);
}
