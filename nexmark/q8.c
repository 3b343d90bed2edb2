/* q8.c — Nexmark q8, monitor new users, as a sluice job
 * (the shared rules of every query: query.h). */

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "query.h"

/* q8: monitor new users.
 *
 *   SELECT P.id, P.name, P.starttime
 *   FROM (SELECT id, name, window_start AS starttime, window_end AS endtime
 *         FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(dateTime),
 *                           INTERVAL '10' SECOND))
 *         GROUP BY id, name, window_start, window_end) P
 *   JOIN (SELECT seller, window_start AS starttime, window_end AS endtime
 *         FROM TABLE(TUMBLE(TABLE auction, DESCRIPTOR(dateTime),
 *                           INTERVAL '10' SECOND))
 *         GROUP BY seller, window_start, window_end) A
 *   ON P.id = A.seller AND P.starttime = A.starttime
 *      AND P.endtime = A.endtime;
 *
 * q8.split projects auctions {seller, date_time} (main output) and persons
 * {id, date_time, name} (port 1), keyed by seller / person id into
 * q8.join, a keyed two-input process that is both GROUP BYs and the join:
 * per key, a map state from window start to "an auction opened" (A) and a
 * list of the (window, name) pairs registered (P).  A row is emitted as
 * soon as both sides of one (id, name, window) are there, once: an
 * auction for a window already in A costs one lookup and emits nothing,
 * and a person already in P is ignored.  A timer at end - 1 forgets the
 * window.  Only 8% of the events reach q8.join. */

typedef struct q8_auction {
  int64_t seller, date_time;
} q8_auction;

/* q8: a person as projected; followed by the name bytes. */
typedef struct q8_person {
  int64_t id, date_time;
  uint32_t name_len, pad;
} q8_person;

_Static_assert(sizeof(q8_person) == 24, "q8 persons: 24-byte head");

enum { Q8_PEOPLE = 1, Q8_AUCTION_WINDOWS = 2 };

static int q8_split(sl_ctx *ctx, void *state, int input,
                    const sl_record *in) {
  const nx_record *r = event_of(in);
  if (!r)
    return malformed(ctx, in);
  if (r->type == NX_AUCTION) {
    q8_auction a = {r->field[NX_AUCTION_SELLER],
                    r->field[NX_AUCTION_DATE_TIME]};
    return sl_emit(ctx, &a, sizeof a);
  }
  if (r->type != NX_PERSON)
    return 0;
  nx_event e;
  if (nx_decode(in->data, in->size_bytes, &e) != 0 ||
      e.u.person.name.len > NX_MAX_STRING_BYTES)
    return malformed(ctx, in);
  _Alignas(8) char buffer[sizeof(q8_person) + NX_MAX_STRING_BYTES];
  q8_person head = {e.u.person.id, e.u.person.date_time,
                    e.u.person.name.len, 0};
  memcpy(buffer, &head, sizeof head);
  memcpy(buffer + sizeof head, e.u.person.name.ptr, head.name_len);
  return sl_emit_side(ctx, 1, buffer, (uint32_t)sizeof head + head.name_len,
                      in->timestamp);
}

static int q8_emit(sl_ctx *ctx, int64_t start, int64_t id, const char *name,
                   uint32_t name_len) {
  _Alignas(8) char buffer[sizeof(q8_row) + NX_MAX_STRING_BYTES];
  assert(name_len <= NX_MAX_STRING_BYTES);
  q8_row head = {start, start + WINDOW_TUMBLE_MS, id, name_len, 0};
  memcpy(buffer, &head, sizeof head);
  memcpy(buffer + sizeof head, name, name_len);
  return sl_emit(ctx, buffer, (uint32_t)sizeof head + name_len);
}

/* A P item: the window start (8 bytes), then the name. */
static int64_t q8_item_start(const void *item) {
  int64_t start;
  memcpy(&start, item, sizeof start);
  return start;
}

static int q8_person_arrives(sl_ctx *ctx, const q8_person *p,
                             const char *name) {
  int rc = 0;
  if (!time_of(ctx, p->date_time, "person date_time", &rc))
    return rc;
  int64_t start = window_start(p->date_time, WINDOW_TUMBLE_MS);
  if (window_late(ctx, start + WINDOW_TUMBLE_MS))
    return 0;
  const void *list, *item;
  uint32_t list_bytes, item_bytes, offset = 0;
  rc = sl_liststate_get(ctx, Q8_PEOPLE, &list, &list_bytes);
  if (rc && rc != SL_ENOTFOUND)
    return rc;
  /* Bounded by the list: each step moves offset forward. */
  while (rc == 0 && sl_list_next(list, list_bytes, &offset, &item,
                                 &item_bytes))
    if (q8_item_start(item) == start && item_bytes == 8u + p->name_len &&
        memcmp((const char *)item + 8, name, p->name_len) == 0)
      return 0; /* this (id, name, window) is known */
  rc = sl_mapstate_get(ctx, Q8_AUCTION_WINDOWS, &start, sizeof start, NULL,
                       NULL);
  if (rc == 0)
    rc = q8_emit(ctx, start, p->id, name, p->name_len);
  else if (rc == SL_ENOTFOUND)
    rc = 0;
  char entry[8 + NX_MAX_STRING_BYTES];
  memcpy(entry, &start, 8);
  memcpy(entry + 8, name, p->name_len);
  if (rc == 0)
    rc = sl_liststate_add(ctx, Q8_PEOPLE, entry, 8u + p->name_len);
  if (rc == 0)
    rc = sl_timer_register(ctx, SL_EVENT_TIME, start + WINDOW_TUMBLE_MS - 1);
  return rc;
}

static int q8_auction_arrives(sl_ctx *ctx, const q8_auction *a) {
  int rc = 0;
  if (!time_of(ctx, a->date_time, "auction date_time", &rc))
    return rc;
  int64_t start = window_start(a->date_time, WINDOW_TUMBLE_MS);
  if (window_late(ctx, start + WINDOW_TUMBLE_MS))
    return 0;
  rc = sl_mapstate_get(ctx, Q8_AUCTION_WINDOWS, &start, sizeof start,
                           NULL, NULL);
  if (rc != SL_ENOTFOUND)
    return rc; /* 0: the seller has an auction in this window already */
  uint8_t opened = 1;
  rc = sl_mapstate_put(ctx, Q8_AUCTION_WINDOWS, &start, sizeof start,
                       &opened, sizeof opened);
  if (rc == 0)
    rc = sl_timer_register(ctx, SL_EVENT_TIME, start + WINDOW_TUMBLE_MS - 1);
  const void *list, *item;
  uint32_t list_bytes, item_bytes, offset = 0;
  if (rc == 0)
    rc = sl_liststate_get(ctx, Q8_PEOPLE, &list, &list_bytes);
  if (rc)
    return rc == SL_ENOTFOUND ? 0 : rc;
  /* The persons of this window, each once; bounded by the list. */
  while (rc == 0 && sl_list_next(list, list_bytes, &offset, &item,
                                 &item_bytes))
    if (q8_item_start(item) == start)
      rc = q8_emit(ctx, start, a->seller, (const char *)item + 8,
                   item_bytes - 8u);
  return rc;
}

static int q8_join(sl_ctx *ctx, void *state, int input,
                   const sl_record *in) {
  int rc;
  if (input == 0 && in->size_bytes == sizeof(q8_auction)) {
    rc = q8_auction_arrives(ctx, in->data);
  } else if (input == 1 && in->size_bytes >= sizeof(q8_person)) {
    const q8_person *p = in->data;
    if (in->size_bytes != sizeof *p + p->name_len ||
        p->name_len > NX_MAX_STRING_BYTES)
      return malformed(ctx, in);
    rc = q8_person_arrives(ctx, p, (const char *)(p + 1));
  } else {
    return malformed(ctx, in);
  }
  return rc == -ERANGE ? rc : failed(ctx, rc, "q8.join");
}

static bool q8_item_not_in(const void *item, uint32_t item_bytes,
                           int64_t start) {
  assert(item_bytes >= 8);
  return q8_item_start(item) != start;
}

/* end - 1 of window start: forget it on both sides. */
static int q8_timer(sl_ctx *ctx, void *state, int domain, int64_t time) {
  int64_t end, start;
  if (!end_of_timer(time, &end) ||
      !sl_time_sub(end, WINDOW_TUMBLE_MS, &start))
    return 0; /* no window of a valid time (query.h note 8) */
  int rc = sl_mapstate_delete(ctx, Q8_AUCTION_WINDOWS, &start, sizeof start);
  if (rc == 0 || rc == SL_ENOTFOUND)
    rc = nxq_list_retain(ctx, state, Q8_PEOPLE, q8_item_not_in, start);
  return failed(ctx, rc, "q8.join");
}

static uint64_t q8_auction_seller(void *user, const sl_record *in) {
  return (uint64_t)((const q8_auction *)in->data)->seller;
}

static uint64_t q8_person_id(void *user, const sl_record *in) {
  return (uint64_t)((const q8_person *)in->data)->id;
}

int nxq_build_q8(sl_job *job, sl_op *events, int p, sl_op **result) {
  static const sl_process_ops split = {.process = q8_split};
  static const sl_process_ops join = {.open = nxq_scratch_open,
                                      .process = q8_join,
                                      .on_timer = q8_timer,
                                      .close = nxq_scratch_close};
  sl_op *auctions, *persons, *keyed[2];
  int rc = sl_op_process(job, "q8.split", &events, 1, p, &split, NULL,
                         &auctions);
  if (rc == 0)
    rc = sl_op_side_output(job, "q8.persons", auctions, 1, &persons);
  if (rc == 0)
    rc = sl_op_key_by(job, "q8.auctions-by-seller", auctions,
                      q8_auction_seller, NULL, &keyed[0]);
  if (rc == 0)
    rc = sl_op_key_by(job, "q8.persons-by-id", persons, q8_person_id, NULL,
                      &keyed[1]);
  if (rc == 0)
    rc = sl_op_process(job, "q8.join", keyed, 2, p, &join, NULL, result);
  return rc;
}
